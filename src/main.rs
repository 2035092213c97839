//! mcp-retry: a transparent stdio proxy that makes MCP servers reliable.
//!
//! `main` only maps the result of [`run`] to an exit code; each mode lives in
//! its own module. See ARCHITECTURE.md for the map.

mod check;
mod child;
mod cli;
mod config;
mod dispatcher;
mod downstream;
mod fasthash;
mod jsonrpc;
mod log;
mod policy;
mod proxy;
mod redact;
mod stats;
mod status;
mod stdio;
#[cfg(unix)]
mod watchdog;

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;

use crate::cli::Command;

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(err) => {
            if is_broken_pipe(&err) {
                return ExitCode::SUCCESS;
            }
            crate::error!("{err:#}");
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

#[cfg(test)]
mod tests {
    /// Every source file opens with a `//!` paragraph saying what it owns.
    #[test]
    fn every_source_file_has_a_module_doc() {
        let mut missing = Vec::new();
        let mut stack = vec![std::path::PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src"
        ))];
        stack.push(concat!(env!("CARGO_MANIFEST_DIR"), "/tests").into());
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    if !text.trim_start().starts_with("//!") {
                        missing.push(path.display().to_string());
                    }
                }
            }
        }
        assert!(missing.is_empty(), "files without a //! doc: {missing:?}");
    }
}
