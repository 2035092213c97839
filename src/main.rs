//! The `mcp-retry` binary: parses the command line, calls the mode the
//! library (`src/lib.rs`) implements, and maps its result to an exit code.
//! Besides choosing the log level, it holds no logic of its own.

#![forbid(unsafe_code)]

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;

use mcp_retry::cli::{self, Command};
#[cfg(unix)]
use mcp_retry::watchdog;
use mcp_retry::{check, config, log, proxy, status};

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(err) => {
            if is_broken_pipe(&err) {
                return ExitCode::SUCCESS;
            }
            mcp_retry::error!("{err:#}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<ExitCode> {
    let (global, command) = cli::parse()?;
    #[cfg(unix)]
    if command == Command::Watchdog {
        // Before anything that reads the environment or could fail.
        return Ok(watchdog::run());
    }
    let level = match global.log_level {
        Some(l) => l,
        None => match std::env::var("MCP_RETRY_LOG") {
            Ok(v) if !v.is_empty() => v
                .parse()
                .map_err(|e: String| anyhow::anyhow!("MCP_RETRY_LOG: {e}"))?,
            _ => log::Level::Info,
        },
    };
    log::init(level, global.log_format.unwrap_or(log::Format::Text));
    match command {
        Command::Help(text) => {
            std::io::stdout().write_all(text.as_bytes())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Usage => {
            // No command: the help, as a usage error (stdout stays empty).
            std::io::stderr().write_all(cli::HELP.as_bytes())?;
            Ok(ExitCode::from(2))
        }
        Command::Version => {
            writeln!(std::io::stdout(), "mcp-retry {}", env!("CARGO_PKG_VERSION"))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Schema => {
            // stdout carries the schema and nothing else.
            std::io::stdout().write_all(config::schema_text().as_bytes())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Run(args) => proxy::run(args),
        Command::Check(args) => check::run(args),
        Command::Status(args) => status::report::run(args),
        #[cfg(unix)]
        Command::Watchdog => unreachable!("handled above"),
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
