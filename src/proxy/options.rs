//! `run`'s options: what `run` is asked to do, and the grammar of its
//! words after `run` (lexopt), in one place for the two readers of a `run`
//! command line: the process's own (`cli.rs`) and `check`, which reads a
//! host's entry that runs mcp-retry as that mcp-retry would.
//!
//! Touches neither the environment nor any file; knows nothing of the
//! global options' values (`--log-level`, `--log-format`: handed to the
//! caller) or of the help texts.

#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};
use lexopt::prelude::*;

#[derive(Debug, Default, PartialEq)]
/// What `run` is asked to do (from the command line).
pub struct RunOptions {
    pub config: Option<PathBuf>,
    pub server: Option<String>,
    /// The wrapped command and its arguments (empty when the config names it).
    pub command: Vec<String>,
    /// A remote server's endpoint (`--url`), instead of a command.
    pub url: Option<String>,
    /// `--header` values, split at the first colon. Secrets: never shown.
    pub headers: Vec<(String, String)>,
    pub stats_file: Option<PathBuf>,
    /// `--store`: where idempotency keys are kept (over the config's).
    pub store: Option<String>,
}

/// A global option `run` also takes after its name, with its value.
pub enum GlobalOption {
    LogLevel(OsString),
    LogFormat(OsString),
}

impl RunOptions {
    /// Reads `run`'s words (those after `run`) from `p`: the options, or
    /// `None` when `--help` is asked for. `global` takes `--log-level` and
    /// `--log-format`.
    pub fn parse(
        p: &mut lexopt::Parser,
        global: &mut dyn FnMut(GlobalOption) -> Result<()>,
    ) -> Result<Option<RunOptions>> {
        let mut args = RunOptions::default();
        loop {
            // Everything after `--` belongs to the command, including
            // arguments that look like our options.
            if let Some(mut raw) = p.try_raw_args() {
                if raw.peek().is_some_and(|a| a == "--") {
                    raw.next();
                    for rest in raw {
                        let s = rest
                            .into_string()
                            .map_err(|a| anyhow!("command argument {a:?} is not valid UTF-8"))?;
                        args.command.push(s);
                    }
                    if args.command.is_empty() {
                        bail!("run: nothing after `--` (expected a command to run)");
                    }
                    break;
                }
            }
            let Some(arg) = p.next()? else { break };
            match arg {
                Long("log-level") => global(GlobalOption::LogLevel(p.value()?))?,
                Long("log-format") => global(GlobalOption::LogFormat(p.value()?))?,
                Short('c') | Long("config") => args.config = Some(p.value()?.into()),
                Short('s') | Long("server") => args.server = Some(p.value()?.string()?),
                Long("stats-file") => args.stats_file = Some(p.value()?.into()),
                Long("store") => args.store = Some(p.value()?.string()?),
                Long("url") => args.url = Some(p.value()?.string()?),
                Long("header") => {
                    let text = p.value()?.string()?;
                    let header =
                        crate::http::split_header(&text).map_err(|e| anyhow!("--header: {e}"))?;
                    args.headers.push(header);
                }
                Short('h') | Long("help") => return Ok(None),
                Value(stray) => {
                    // Without `--` a stray word would silently become the
                    // server command (`run -c F -s memory extra-arg`
                    // launching extra-arg).
                    let stray = stray.to_string_lossy().into_owned();
                    bail!("unexpected argument '{stray}' (did you mean `-- {stray}`?)");
                }
                _ => return Err(arg.unexpected()).context("invalid arguments for 'run'"),
            }
        }
        if args.url.is_some() && !args.command.is_empty() {
            bail!("run: --url and a command after `--` exclude each other");
        }
        if !args.headers.is_empty() && args.url.is_none() {
            bail!("run: --header needs --url");
        }
        if let Some(url) = &args.url {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                bail!("run: --url: expected an http:// or https:// URL");
            }
        }
        if args.config.is_none() && args.command.is_empty() && args.url.is_none() {
            bail!("run needs --config FILE, --url URL or a command after `--` (see `mcp-retry run --help`)");
        }
        Ok(Some(args))
    }
}
