//! Command-line parsing (lexopt, in the shape of its `cargo.rs` example) and
//! the help texts.
//!
//! Turns arguments into a [`Command`]; touches neither the environment nor
//! any file, so tests call [`parse_from`] with plain lists. Knows nothing of
//! config contents, threads or the protocol.

#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use lexopt::prelude::*;

use crate::check::CheckOptions;
use crate::log;
use crate::proxy::options::{GlobalOption, RunOptions};
use crate::status::report::{StatusFormat, StatusOptions};

pub const HELP: &str = "\
mcp-retry: makes MCP servers reliable (safe retries, timeouts, dedup, caching,
a circuit breaker and respawn) as a transparent proxy, for local (stdio) and remote servers

Usage:
  mcp-retry run --config FILE [--server NAME]
  mcp-retry run [--config FILE] -- COMMAND [ARGS...]
  mcp-retry run [--config FILE] --url URL [--header 'Name: value']...
  mcp-retry check --config FILE [--server NAME]... [--timeout DURATION] [--json]
  mcp-retry status [--json | --prometheus] [--watch [SECONDS]]
  mcp-retry schema

Commands:
  run      launch one MCP server (or reach a remote one) and relay stdio to it
           (see `mcp-retry run --help`)
  check    probe every configured server in parallel (see `mcp-retry check --help`)
  status   show the proxies running now (see `mcp-retry status --help`)
  schema   print the JSON Schema of the config file (see `mcp-retry schema --help`)
  help     print this text, or `help run` / `help check` / `help status` / `help schema`

Options:
  --log-level LEVEL   error, warn, info or debug (default info; env MCP_RETRY_LOG)
  --log-format FMT    text or json (default text); logs always go to stderr
  -h, --help          print help
  -V, --version       print version

Exit codes:
  0  normal exit
  1  `check` found a server down; `status` found a breaker open or a server down
  2  usage or configuration error
";

pub const RUN_HELP: &str = "\
mcp-retry run: launch one MCP server as a child process and relay
newline-delimited JSON-RPC between it and this process's stdin/stdout

Usage:
  mcp-retry run --config FILE [--server NAME]
  mcp-retry run [--config FILE [--server NAME]] -- COMMAND [ARGS...]
  mcp-retry run [--config FILE [--server NAME]] --url URL [--header 'Name: value']...

Options:
  -c, --config FILE     YAML (.yaml/.yml) or JSON (.json) config with `servers:`
                        or `mcpServers:`
  -s, --server NAME     the server to run (optional when the config has one)
  --url URL             a remote MCP server (Streamable HTTP), instead of a command
  --header 'N: V'       an HTTP header for --url (repeatable; `${VAR}` is not
                        expanded here: let the shell do it)
  --stats-file PATH     write per-tool counters as JSON every few seconds and at exit
  --store STORE         where idempotency keys are kept: memory, local or
                        redis://host:port (no password here: use the config
                        or MCP_RETRY_STORE; over the config's `store:`)
  --log-level LEVEL     error, warn, info or debug (default info; env MCP_RETRY_LOG)
  --log-format FMT      text or json (default text)
  -h, --help            print help

With `-- COMMAND`, the command is wrapped with the built-in defaults, or with
the config's `defaults:` (or the settings of --server NAME) when --config is
given. The `--` is required: everything after it is the command, untouched.
--url works the same way. Legacy HTTP+SSE servers and servers that need an
OAuth login: run them through mcp-remote (`-- npx -y mcp-remote URL`).

Every run publishes its state for `mcp-retry status` (see `status --help`).

Exit codes: 0 normal exit, 2 usage or configuration error.
";

pub const CHECK_HELP: &str = "\
mcp-retry check: start every configured server in parallel, send it
`initialize`, and print one [UP]/[DOWN] line per server with its start time.
Each handshake is stored in the handshake cache that `instant_start` answers
from ($MCP_RETRY_CACHE_DIR, else $XDG_CACHE_HOME/mcp-retry or the platform's
cache directory)

Usage:
  mcp-retry check --config FILE [--server NAME]... [--timeout DURATION] [--cwd DIR] [--json]

Options:
  -c, --config FILE     the same config files as `run`
  -s, --server NAME     check only this server (repeatable)
  -t, --timeout DUR     how long each server has to answer: seconds (2.5) or
                        a duration like 250ms, 30s, 2m (default 10s)
  --cwd DIR             start servers without `cwd` in DIR (default: for a
                        host's .mcp.json, .vscode/ or .cursor/mcp.json, the
                        project's root, as the host starts them; else here)
  --json                print a JSON report instead of text
  --log-level LEVEL     error, warn, info or debug (default info; env MCP_RETRY_LOG)
  --log-format FMT      text or json (default text)
  -h, --help            print help

Exit codes: 0 every server is up, 1 a server is down, 2 usage or configuration error.
";

pub const STATUS_HELP: &str = "\
mcp-retry status: list the proxies this user runs now (every `mcp-retry run`
publishes its state), one line per server, the worst first; then the store
of idempotency keys and the keyed calls whose outcome is unknown

Usage:
  mcp-retry status [--json | --prometheus] [--watch [SECONDS]] [--dir DIR]
                   [--store STORE]

Options:
  --json                print the proxies' documents, the store and the
                        unknown outcomes as one JSON object
  --prometheus          print the figures in the Prometheus text format (for
                        node_exporter's textfile collector)
  -w, --watch [SECS]    redraw every SECS seconds (default 2) until Ctrl-C
  --dir DIR             the runtime directory (default $MCP_RETRY_RUNTIME_DIR,
                        else $XDG_RUNTIME_DIR/mcp-retry, else /tmp/mcp-retry-UID)
  --store STORE         the store to read: local or memory (default
                        $MCP_RETRY_STORE, else local)
  --log-level LEVEL     error, warn, info or debug (default info; env MCP_RETRY_LOG)
  -h, --help            print help

Exit codes: 0 all is well, 1 a circuit breaker is open or a server is down,
2 usage error or an unusable runtime directory.
";

pub const SCHEMA_HELP: &str = "\
mcp-retry schema: print the JSON Schema (draft 2020-12) of the config file
on stdout, for editors that complete and check it as you type

Usage:
  mcp-retry schema > ~/.config/mcp-retry.schema.json

Then give a YAML config the first line
  # yaml-language-server: $schema=./mcp-retry.schema.json
(the path relative to the config); map a JSON config to the schema in the
editor's settings (VS Code: json.schemas).

Options:
  -h, --help            print help

Exit codes: 0 printed, 2 usage error.
";

/// The commands, for \"did you mean\" (the hidden one is left out).
const COMMANDS: &[&str] = &["run", "check", "status", "schema", "help"];

#[derive(Debug, PartialEq)]
pub enum Command {
    /// Print this text on stdout and exit 0.
    Help(&'static str),
    /// No command given: print the top-level help on stderr and exit 2.
    Usage,
    Version,
    Run(RunOptions),
    Check(CheckOptions),
    Status(StatusOptions),
    /// Print the config file's JSON Schema on stdout.
    Schema,
    /// The hidden `__watchdog` subcommand (`watchdog.rs`): not in the help,
    /// only ever started by the proxy itself.
    #[cfg(unix)]
    Watchdog,
}

#[derive(Debug, Default, PartialEq)]
pub struct Global {
    pub log_level: Option<log::Level>,
    pub log_format: Option<log::Format>,
}

/// Parses the process's arguments.
pub fn parse() -> Result<(Global, Command)> {
    parse_from(std::env::args_os().skip(1))
}

/// Parses an explicit argument list (without the program name).
pub fn parse_from<I>(args: I) -> Result<(Global, Command)>
where
    I: IntoIterator,
    I::Item: Into<OsString>,
{
    let mut parser = lexopt::Parser::from_args(args);
    let mut global = Global::default();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("log-level") => {
                global.log_level = Some(log_option("--log-level", parser.value()?)?)
            }
            Long("log-format") => {
                global.log_format = Some(log_option("--log-format", parser.value()?)?)
            }
            Short('h') | Long("help") => return Ok((global, Command::Help(HELP))),
            Short('V') | Long("version") => return Ok((global, Command::Version)),
            Value(v) => {
                let name = v.string()?;
                return match name.as_str() {
                    "run" => parse_run(parser, global),
                    "check" => parse_check(parser, global),
                    "status" => parse_status(parser, global),
                    "help" => parse_help(parser, global),
                    "schema" => match parser.next()? {
                        None => Ok((global, Command::Schema)),
                        Some(Short('h') | Long("help")) => Ok((global, Command::Help(SCHEMA_HELP))),
                        Some(arg) => {
                            Err(arg.unexpected()).context("invalid arguments for 'schema'")
                        }
                    },
                    #[cfg(unix)]
                    crate::watchdog::SUBCOMMAND => match parser.next()? {
                        None => Ok((global, Command::Watchdog)),
                        Some(arg) => Err(arg.unexpected().into()),
                    },
                    _ => Err(unknown_command(&name)),
                };
            }
            _ => return Err(arg.unexpected().into()),
        }
    }
    Ok((global, Command::Usage))
}

/// `unknown command 'rnu' (did you mean run? ...)`.
fn unknown_command(name: &str) -> anyhow::Error {
    let near = crate::config::did_you_mean(name, COMMANDS)
        .map(|c| format!("did you mean {c}? "))
        .unwrap_or_default();
    anyhow!("unknown command '{name}' ({near}expected run, check, status or schema; see --help)")
}

/// `help`, `help run`, `help check`, `help status`, `help schema`.
fn parse_help(mut p: lexopt::Parser, global: Global) -> Result<(Global, Command)> {
    let text = match p.next()? {
        None => HELP,
        Some(Value(v)) => match v.string()?.as_str() {
            "run" => RUN_HELP,
            "check" => CHECK_HELP,
            "status" => STATUS_HELP,
            "schema" => SCHEMA_HELP,
            "help" => HELP,
            other => return Err(unknown_command(other)),
        },
        Some(arg) => return Err(arg.unexpected()).context("invalid arguments for 'help'"),
    };
    Ok((global, Command::Help(text)))
}

/// Parses the value of `--log-level` or `--log-format` (accepted before and
/// after the command name).
fn log_option<T: std::str::FromStr<Err = String>>(flag: &str, value: OsString) -> Result<T> {
    let v = value.string()?;
    v.parse().map_err(|e: String| anyhow!("{flag}: {e}"))
}

fn parse_run(mut p: lexopt::Parser, mut global: Global) -> Result<(Global, Command)> {
    let run = RunOptions::parse(&mut p, &mut |option| {
        match option {
            GlobalOption::LogLevel(v) => global.log_level = Some(log_option("--log-level", v)?),
            GlobalOption::LogFormat(v) => global.log_format = Some(log_option("--log-format", v)?),
        }
        Ok(())
    })?;
    match run {
        Some(run) => Ok((global, Command::Run(run))),
        None => Ok((global, Command::Help(RUN_HELP))),
    }
}

fn parse_check(mut p: lexopt::Parser, mut global: Global) -> Result<(Global, Command)> {
    let mut config = None;
    let mut servers = Vec::new();
    let mut timeout = Duration::from_secs(10);
    let mut json = false;
    let mut cwd = None;
    while let Some(arg) = p.next()? {
        match arg {
            Long("log-level") => global.log_level = Some(log_option("--log-level", p.value()?)?),
            Long("log-format") => global.log_format = Some(log_option("--log-format", p.value()?)?),
            Short('c') | Long("config") => config = Some(PathBuf::from(p.value()?)),
            Long("cwd") => cwd = Some(PathBuf::from(p.value()?)),
            Short('s') | Long("server") => servers.push(p.value()?.string()?),
            Short('t') | Long("timeout") => {
                let v = p.value()?.string()?;
                timeout = parse_timeout(&v).with_context(|| format!("--timeout '{v}'"))?;
            }
            Long("json") => json = true,
            Short('h') | Long("help") => return Ok((global, Command::Help(CHECK_HELP))),
            _ => return Err(arg.unexpected()).context("invalid arguments for 'check'"),
        }
    }
    let config = config.context("check needs --config FILE (see `mcp-retry check --help`)")?;
    Ok((
        global,
        Command::Check(CheckOptions {
            config,
            cwd,
            servers,
            timeout,
            json,
        }),
    ))
}

fn parse_status(mut p: lexopt::Parser, mut global: Global) -> Result<(Global, Command)> {
    let mut args = StatusOptions::default();
    let mut formats = Vec::new();
    // `--watch` takes an optional value: `--watch=5`, or `--watch 5` (the
    // command takes no other words).
    let mut watch_value_allowed = false;
    while let Some(arg) = p.next()? {
        let after_watch = std::mem::take(&mut watch_value_allowed);
        match arg {
            Long("log-level") => global.log_level = Some(log_option("--log-level", p.value()?)?),
            Long("log-format") => global.log_format = Some(log_option("--log-format", p.value()?)?),
            Long("json") => formats.push(("--json", StatusFormat::Json)),
            Long("prometheus") => formats.push(("--prometheus", StatusFormat::Prometheus)),
            Long("dir") => args.dir = Some(p.value()?.into()),
            Long("store") => {
                let v = p.value()?.string()?;
                if !matches!(v.as_str(), "local" | "memory") {
                    bail!("status: --store: expected one of memory, local, got {v:?}");
                }
                args.store = Some(v);
            }
            Short('w') | Long("watch") => {
                args.watch = Some(match p.optional_value() {
                    Some(v) => watch_interval(&v.string()?)?,
                    None => {
                        watch_value_allowed = true;
                        Duration::from_secs(2)
                    }
                });
            }
            Value(v) if after_watch => args.watch = Some(watch_interval(&v.string()?)?),
            Short('h') | Long("help") => return Ok((global, Command::Help(STATUS_HELP))),
            _ => return Err(arg.unexpected()).context("invalid arguments for 'status'"),
        }
    }
    match formats.as_slice() {
        [] => {}
        [(_, f)] => args.format = *f,
        [(a, _), (b, _), ..] => bail!("status: {a} and {b} cannot be combined"),
    }
    Ok((global, Command::Status(args)))
}

/// `--watch` seconds: at least 0.1, at most a day.
fn watch_interval(v: &str) -> Result<Duration> {
    v.trim()
        .parse::<f64>()
        .ok()
        .and_then(crate::status::report::interval)
        .with_context(|| format!("--watch '{v}': expected seconds between 0.1 and 86400"))
}

/// Seconds (`2.5`) or a duration with a unit (`250ms`, `2m`), as in the
/// config file; positive and at most a day.
fn parse_timeout(s: &str) -> Result<Duration> {
    let d = match s.trim().parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs > 0.0 && secs <= 86_400.0 => {
            Duration::from_secs_f64(secs)
        }
        Ok(_) => bail!("expected a positive duration (at most 24h)"),
        Err(_) => crate::config::parse_duration(s).map_err(|e| anyhow!(e))?,
    };
    if d.is_zero() || d > Duration::from_secs(86_400) {
        bail!("expected a positive duration (at most 24h)");
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(args: &[&str]) -> (Global, Command) {
        parse_from(args.iter().copied()).unwrap()
    }
    fn err(args: &[&str]) -> String {
        format!("{:#}", parse_from(args.iter().copied()).unwrap_err())
    }

    #[test]
    fn run_with_config_and_server() {
        let (_, c) = ok(&["run", "--config", "c.yaml", "--server", "fs"]);
        assert_eq!(
            c,
            Command::Run(RunOptions {
                config: Some("c.yaml".into()),
                server: Some("fs".into()),
                ..RunOptions::default()
            })
        );
    }

    #[test]
    fn run_with_a_store() {
        let (_, c) = ok(&["run", "--store", "local", "--", "srv"]);
        assert_eq!(
            c,
            Command::Run(RunOptions {
                store: Some("local".into()),
                command: vec!["srv".into()],
                ..RunOptions::default()
            })
        );
    }

    #[test]
    fn run_with_a_url_and_headers() {
        let (_, c) = ok(&[
            "run",
            "--url",
            "https://h/mcp",
            "--header",
            "Authorization: Bearer a:b",
            "--header",
            "X-K:v",
        ]);
        let Command::Run(r) = c else { panic!() };
        assert_eq!(r.url.as_deref(), Some("https://h/mcp"));
        assert_eq!(
            r.headers,
            [
                ("Authorization".to_owned(), "Bearer a:b".to_owned()),
                ("X-K".to_owned(), "v".to_owned())
            ]
        );
    }

    #[test]
    fn run_url_errors_never_quote_header_values() {
        let e = err(&["run", "--url", "http://h", "--header", "no-colon-secret"]);
        assert!(e.contains("--header") && !e.contains("secret"), "{e}");
        let e = err(&["run", "--header", "A: b"]);
        assert!(e.contains("--header needs --url"), "{e}");
        let e = err(&["run", "--url", "http://h", "--", "x"]);
        assert!(e.contains("exclude each other"), "{e}");
        let e = err(&["run", "--url", "ftp://h"]);
        assert!(e.contains("http://"), "{e}");
    }

    #[test]
    fn run_wraps_a_command_untouched() {
        let (_, c) = ok(&["run", "--", "npx", "-y", "--config", "x", "--", "-h"]);
        let Command::Run(r) = c else { panic!() };
        assert_eq!(r.command, ["npx", "-y", "--config", "x", "--", "-h"]);
        assert_eq!(r.config, None);
        let (_, c) = ok(&[
            "run",
            "-c",
            "f.json",
            "--",
            "python3",
            "server.py",
            "--port",
            "1",
        ]);
        let Command::Run(r) = c else { panic!() };
        assert_eq!(r.command, ["python3", "server.py", "--port", "1"]);
        assert_eq!(r.config, Some("f.json".into()));
        let (_, c) = ok(&["run", "--", "--", "x"]);
        let Command::Run(r) = c else { panic!() };
        assert_eq!(r.command, ["--", "x"]);
    }

    #[test]
    fn global_options_before_and_after_the_command() {
        let (g, _) = ok(&[
            "--log-level",
            "debug",
            "run",
            "--log-format",
            "json",
            "--",
            "x",
        ]);
        assert_eq!(g.log_level, Some(log::Level::Debug));
        assert_eq!(g.log_format, Some(log::Format::Json));
        assert!(
            err(&["--log-level", "loud", "run"]).contains("--log-level: invalid log level 'loud'")
        );
    }

    #[test]
    fn help_and_version() {
        assert_eq!(ok(&["--help"]).1, Command::Help(HELP));
        assert_eq!(ok(&["-V"]).1, Command::Version);
        assert_eq!(ok(&["run", "--help"]).1, Command::Help(RUN_HELP));
        assert_eq!(ok(&["check", "-h"]).1, Command::Help(CHECK_HELP));
        assert_eq!(ok(&["help"]).1, Command::Help(HELP));
        assert_eq!(ok(&["help", "run"]).1, Command::Help(RUN_HELP));
        assert_eq!(ok(&["help", "check"]).1, Command::Help(CHECK_HELP));
        assert!(err(&["help", "serve"]).contains("unknown command 'serve'"));
        assert!(err(&["help", "chekc"]).contains("(did you mean check? "));
        assert!(HELP.contains("2  usage or configuration error"));
        // The top-level usage shows every form of `run`.
        assert!(HELP.contains("mcp-retry run [--config FILE] --url URL"));
    }

    #[test]
    fn check_timeout_takes_the_config_s_duration_syntax() {
        let timeout = |v: &str| match ok(&["check", "-c", "c.yaml", "--timeout", v]).1 {
            Command::Check(c) => c.timeout,
            other => panic!("{other:?}"),
        };
        assert_eq!(timeout("250ms"), Duration::from_millis(250));
        assert_eq!(timeout("2m"), Duration::from_secs(120));
        assert_eq!(timeout("1.5s"), Duration::from_millis(1500));
        assert_eq!(timeout("3"), Duration::from_secs(3));
    }

    #[test]
    fn check_options() {
        let (_, c) = ok(&[
            "check",
            "-c",
            "c.yaml",
            "-s",
            "a",
            "--server",
            "b",
            "--timeout",
            "2.5",
            "--cwd",
            "proj",
            "--json",
        ]);
        assert_eq!(
            c,
            Command::Check(CheckOptions {
                config: "c.yaml".into(),
                cwd: Some("proj".into()),
                servers: vec!["a".into(), "b".into()],
                timeout: Duration::from_millis(2500),
                json: true,
            })
        );
    }

    #[test]
    fn status_options() {
        let status = |args: &[&str]| match ok(args).1 {
            Command::Status(s) => s,
            other => panic!("{other:?}"),
        };
        assert_eq!(status(&["status"]), StatusOptions::default());
        let s = status(&["status", "--json", "--dir", "/r", "--watch"]);
        assert_eq!(s.format, StatusFormat::Json);
        assert_eq!(s.dir, Some("/r".into()));
        assert_eq!(s.watch, Some(Duration::from_secs(2)));
        assert_eq!(
            status(&["status", "--watch", "0.5"]).watch,
            Some(Duration::from_millis(500))
        );
        assert_eq!(
            status(&["status", "-w=3"]).watch,
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            status(&["status", "--watch", "5", "--prometheus"]).format,
            StatusFormat::Prometheus
        );
        assert_eq!(ok(&["help", "status"]).1, Command::Help(STATUS_HELP));
        assert_eq!(ok(&["status", "-h"]).1, Command::Help(STATUS_HELP));
        assert!(err(&["status", "--json", "--prometheus"]).contains("cannot be combined"));
        assert!(err(&["status", "--watch", "soon"]).contains("--watch 'soon'"));
        assert!(err(&["status", "--watch", "0"]).contains("between 0.1 and 86400"));
        assert!(err(&["status", "extra"]).contains("invalid arguments for 'status'"));
        assert!(err(&["status", "--json", "5"]).contains("invalid arguments for 'status'"));
    }

    #[test]
    fn schema_takes_no_arguments() {
        assert_eq!(ok(&["schema"]).1, Command::Schema);
        assert_eq!(ok(&["schema", "--help"]).1, Command::Help(SCHEMA_HELP));
        assert_eq!(ok(&["help", "schema"]).1, Command::Help(SCHEMA_HELP));
        assert!(SCHEMA_HELP.starts_with("mcp-retry schema:"));
        assert!(err(&["schema", "x"]).contains("invalid arguments for 'schema'"));
        assert!(HELP.contains("mcp-retry schema"));
    }

    #[cfg(unix)] // The watchdog is Unix-only; Windows has job objects.
    #[test]
    fn the_watchdog_subcommand_is_hidden() {
        assert_eq!(ok(&["__watchdog"]).1, Command::Watchdog);
        assert!(err(&["__watchdog", "7"]).contains("unexpected argument"));
        for text in [HELP, RUN_HELP, CHECK_HELP, STATUS_HELP, SCHEMA_HELP] {
            assert!(!text.contains("watchdog"), "{text}");
        }
        // The unknown-command message does not mention it either.
        assert!(!err(&["serve"]).contains("watchdog"));
    }

    #[test]
    fn usage_errors_are_clear() {
        assert_eq!(ok(&[]).1, Command::Usage);
        assert_eq!(ok(&["--log-level", "debug"]).1, Command::Usage);
        assert_eq!(
            err(&["serve"]),
            "unknown command 'serve' (expected run, check, status or schema; see --help)"
        );
        assert_eq!(
            err(&["rnu"]),
            "unknown command 'rnu' (did you mean run? expected run, check, status or schema; see --help)"
        );
        assert!(err(&["stauts"]).contains("did you mean status?"));
        assert!(err(&["Check"]).contains("did you mean check?"));
        assert!(err(&["run"]).contains("run needs --config FILE, --url URL or a command"));
        assert!(err(&["run", "--bogus"]).contains("invalid arguments for 'run'"));
        assert!(err(&["run", "--bogus"]).contains("--bogus"));
        assert!(err(&["check"]).contains("check needs --config FILE"));
        assert!(err(&["check", "-c", "x", "--timeout", "-1"]).contains("--timeout '-1'"));
        assert!(err(&["check", "-c", "x", "--timeout", "soon"]).contains("expected a duration"));
        assert!(err(&["check", "-c", "x", "--timeout", "0ms"]).contains("positive duration"));
        assert!(err(&["check", "-c", "x", "--timeout", "2d"]).contains("unknown duration unit"));
        assert!(err(&["check", "-c", "x", "--timeout", "25h"]).contains("at most 24h"));
        assert_eq!(
            err(&["run", "-c", "F", "-s", "memory", "extra-arg"]),
            "unexpected argument 'extra-arg' (did you mean `-- extra-arg`?)"
        );
        assert!(err(&["run", "python3", "server.py"]).contains("`-- python3`"));
        assert!(err(&["run", "--"]).contains("nothing after `--`"));
        assert!(err(&["run", "--config"]).contains("missing argument"));
    }
}
