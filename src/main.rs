//! The `mcp-retry` binary: parses the command line, calls the mode the
//! library (`src/lib.rs`) implements, and maps its result to an exit code.
//! Besides choosing the log level (and, for x86_64 musl, the allocator), it
//! holds no logic of its own.

#![forbid(unsafe_code)]

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;

use mcp_retry::cli::{self, Command};
#[cfg(unix)]
use mcp_retry::watchdog;
use mcp_retry::{check, config, log, proxy, status};

// The allocator of the static x86_64 musl binary (`make static`, `make
// dist`): musl's own malloc is slow under the proxy's pattern (many small
// blocks, freed by another thread than the one that allocated them), so
// that binary uses mimalloc; see BENCHMARKS.md (*The static binary's
// allocator*). Every other target keeps its C library's malloc: glibc's is
// as fast, and aarch64 musl is built with a glibc cross compiler, which
// cannot build mimalloc's C against musl's headers.
#[cfg(all(target_env = "musl", target_arch = "x86_64"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    mcp_retry::allocator::configure();
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
