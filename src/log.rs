//! Diagnostics on stderr: the level and format chosen on the command line,
//! and the `error!`/`warn!`/`info!`/`debug!` macros.
//!
//! This is the only writer of our own messages to stderr (the child's stderr
//! is copied by `child.rs`). stdout is never touched here: it carries protocol
//! bytes only. Knows nothing of the protocol or of policies.
//!
//! The libraries' own lines (ureq's and rustls's, through the `log` facade)
//! come here too: at `debug`, whatever their level, prefixed with their
//! target and cleaned of the configured secrets and of anything that looks
//! like a credential (`redact.rs`).

#![forbid(unsafe_code)]

use std::fmt;
use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{OnceLock, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::redact::Redactor;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error = 0,
    Warn = 1,
    Info = 2,
    Debug = 3,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }
}

impl std::str::FromStr for Level {
    type Err = String;
    fn from_str(s: &str) -> Result<Level, String> {
        match s.to_ascii_lowercase().as_str() {
            "error" => Ok(Level::Error),
            "warn" | "warning" => Ok(Level::Warn),
            "info" => Ok(Level::Info),
            "debug" | "trace" => Ok(Level::Debug),
            _ => Err(format!(
                "invalid log level '{s}' (expected one of: error, warn, info, debug)"
            )),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Format, String> {
        match s {
            "text" => Ok(Format::Text),
            "json" => Ok(Format::Json),
            _ => Err(format!("invalid log format '{s}' (expected text or json)")),
        }
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Info as u8);
static FORMAT: AtomicU8 = AtomicU8::new(0);

/// Sets the level and format, and sends the libraries' lines (the `log`
/// facade) here; once, at start.
pub fn init(level: Level, format: Format) {
    LEVEL.store(level as u8, Ordering::Relaxed);
    FORMAT.store((format == Format::Json) as u8, Ordering::Relaxed);
    if ::log::set_logger(&Bridge).is_ok() {
        // Their lines are shown at debug only; below it the libraries skip
        // even formatting them.
        ::log::set_max_level(if level >= Level::Debug {
            ::log::LevelFilter::Debug
        } else {
            ::log::LevelFilter::Off
        });
    }
}

/// What the libraries' lines are cleaned of: the values of the configured
/// `env:` entries and headers, added as the config is read.
static SECRETS: RwLock<Option<Redactor>> = RwLock::new(None);

/// Removes these values (those that could be secrets, as
/// [`Redactor::new`] chooses them) from the libraries' lines from now on.
pub fn add_secrets(values: &[(String, String)]) {
    let mut secrets = SECRETS.write().unwrap_or_else(|e| e.into_inner());
    secrets.get_or_insert_with(Redactor::default).add(values);
}

/// The `log` facade's records, forwarded as our own debug lines.
struct Bridge;

impl ::log::Log for Bridge {
    fn enabled(&self, _: &::log::Metadata<'_>) -> bool {
        enabled(Level::Debug)
    }

    fn log(&self, record: &::log::Record<'_>) {
        if self.enabled(record.metadata()) {
            emit(Level::Debug, format_args!("{}", bridged(record)));
        }
    }

    fn flush(&self) {}
}

/// A library's record as the text of our line: `target: message`, redacted.
fn bridged(record: &::log::Record<'_>) -> String {
    let text = format!("{}: {}", record.target(), record.args());
    match &*SECRETS.read().unwrap_or_else(|e| e.into_inner()) {
        Some(secrets) => secrets.redact(&text),
        None => Redactor::default().redact(&text),
    }
}

/// The server this process proxies: every JSON line carries it as `server`.
static SERVER: OnceLock<String> = OnceLock::new();

pub fn set_server(name: &str) {
    let _ = SERVER.set(name.to_owned());
}

/// Structured fields of a line, written as members in `--log-format json`
/// (the text format has them in its message already).
#[derive(Debug, Default, Clone, Copy)]
pub struct Fields<'a> {
    pub tool: Option<&'a str>,
    pub attempt: Option<u32>,
    pub reason: Option<&'a str>,
}

pub fn enabled(level: Level) -> bool {
    #[cfg(test)]
    if tests::capturing() {
        return true;
    }
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// Writes one log line. Errors writing to stderr are ignored: there is
/// nowhere left to report them.
pub fn emit(level: Level, args: fmt::Arguments<'_>) {
    emit_with(level, Fields::default(), args);
}

/// [`emit`] with structured fields.
pub fn emit_with(level: Level, fields: Fields<'_>, args: fmt::Arguments<'_>) {
    let line = if FORMAT.load(Ordering::Relaxed) == 1 {
        json_line(level, fields, SERVER.get().map(String::as_str), args)
    } else {
        format!("mcp-retry: {}: {args}\n", level.as_str())
    };
    // A value a `headers_helper` printed never reaches the log, even
    // quoted in a server's message.
    let line = crate::redact::redact_learned(&line).into_owned();
    #[cfg(test)]
    let Some(line) = tests::captured(line) else {
        return;
    };
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

fn json_line(
    level: Level,
    fields: Fields<'_>,
    server: Option<&str>,
    args: fmt::Arguments<'_>,
) -> String {
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let text = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let mut line = format!(
        "{{\"ts\":{ts:.3},\"level\":\"{}\",\"target\":\"mcp-retry\"",
        level.as_str()
    );
    if let Some(s) = server {
        line.push_str(&format!(",\"server\":{}", text(s)));
    }
    if let Some(t) = fields.tool {
        line.push_str(&format!(",\"tool\":{}", text(t)));
    }
    if let Some(a) = fields.attempt {
        line.push_str(&format!(",\"attempt\":{a}"));
    }
    if let Some(r) = fields.reason {
        line.push_str(&format!(",\"reason\":{}", text(r)));
    }
    line.push_str(&format!(",\"msg\":{}}}\n", text(&args.to_string())));
    line
}

/// `error!("…")`, or `error!(fields: Fields { … }, "…")` for a line with
/// structured fields (likewise `warn!`, `info!`, `debug!`).
#[macro_export]
macro_rules! error {
    (fields: $f:expr, $($t:tt)*) => { if $crate::log::enabled($crate::log::Level::Error) { $crate::log::emit_with($crate::log::Level::Error, $f, format_args!($($t)*)) } };
    ($($t:tt)*) => { if $crate::log::enabled($crate::log::Level::Error) { $crate::log::emit($crate::log::Level::Error, format_args!($($t)*)) } };
}
#[macro_export]
macro_rules! warn {
    (fields: $f:expr, $($t:tt)*) => { if $crate::log::enabled($crate::log::Level::Warn) { $crate::log::emit_with($crate::log::Level::Warn, $f, format_args!($($t)*)) } };
    ($($t:tt)*) => { if $crate::log::enabled($crate::log::Level::Warn) { $crate::log::emit($crate::log::Level::Warn, format_args!($($t)*)) } };
}
#[macro_export]
macro_rules! info {
    (fields: $f:expr, $($t:tt)*) => { if $crate::log::enabled($crate::log::Level::Info) { $crate::log::emit_with($crate::log::Level::Info, $f, format_args!($($t)*)) } };
    ($($t:tt)*) => { if $crate::log::enabled($crate::log::Level::Info) { $crate::log::emit($crate::log::Level::Info, format_args!($($t)*)) } };
}
#[macro_export]
macro_rules! debug {
    (fields: $f:expr, $($t:tt)*) => { if $crate::log::enabled($crate::log::Level::Debug) { $crate::log::emit_with($crate::log::Level::Debug, $f, format_args!($($t)*)) } };
    ($($t:tt)*) => { if $crate::log::enabled($crate::log::Level::Debug) { $crate::log::emit($crate::log::Level::Debug, format_args!($($t)*)) } };
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::cell::RefCell;

    thread_local! {
        /// The lines this thread's test captures, instead of stderr.
        static CAPTURED: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
    }

    /// Whether this thread captures (and so has every level on).
    pub(super) fn capturing() -> bool {
        CAPTURED.with(|c| c.borrow().is_some())
    }

    /// Keeps `line` when this thread captures; else gives it back.
    pub(super) fn captured(line: String) -> Option<String> {
        CAPTURED.with(|c| match c.borrow_mut().as_mut() {
            Some(lines) => {
                lines.push(line);
                None
            }
            None => Some(line),
        })
    }

    /// The lines `f` logs on this thread, every level on.
    pub(crate) fn capture(f: impl FnOnce()) -> Vec<String> {
        CAPTURED.with(|c| *c.borrow_mut() = Some(Vec::new()));
        f();
        CAPTURED.with(|c| c.borrow_mut().take()).unwrap_or_default()
    }

    #[test]
    fn library_lines_are_our_debug_lines_with_their_target_and_no_secret() {
        add_secrets(&[("X-Tenant".into(), "tenant-canary-77".into())]);
        let _ = ::log::set_logger(&Bridge);
        ::log::set_max_level(::log::LevelFilter::Debug);
        let lines = capture(|| {
            ::log::warn!(
                target: "rustls::conn",
                "alert for tenant-canary-77 after Authorization: Bearer abcdef123456"
            );
            ::log::debug!(target: "ureq::run", "POST https://example.test/mcp?api_key=k-987654321");
            ::log::trace!(target: "ureq_proto", "finer than debug");
        });
        assert_eq!(
            lines,
            [
                "mcp-retry: debug: rustls::conn: alert for [redacted] after Authorization: Bearer [redacted]\n",
                "mcp-retry: debug: ureq::run: POST https://example.test/mcp?api_key=[redacted]\n",
            ]
        );
    }

    #[test]
    fn json_lines_carry_the_fields_as_members() {
        let fields = Fields {
            tool: Some("pay \"x\""),
            attempt: Some(2),
            reason: Some("timeout"),
        };
        let line = json_line(Level::Warn, fields, Some("srv"), format_args!("m {}", 1));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["level"], "warn");
        assert_eq!(v["server"], "srv");
        assert_eq!(v["tool"], "pay \"x\"");
        assert_eq!(v["attempt"], 2);
        assert_eq!(v["reason"], "timeout");
        assert_eq!(v["msg"], "m 1");
        let bare = json_line(Level::Info, Fields::default(), None, format_args!("x"));
        let v: serde_json::Value = serde_json::from_str(&bare).unwrap();
        assert!(v.get("tool").is_none() && v.get("server").is_none(), "{v}");
    }

    #[test]
    fn levels_parse_and_order() {
        assert_eq!("WARN".parse::<Level>(), Ok(Level::Warn));
        assert!("loud"
            .parse::<Level>()
            .unwrap_err()
            .contains("expected one of"));
        assert!(Level::Error < Level::Debug);
        assert_eq!("json".parse::<Format>(), Ok(Format::Json));
        assert!("xml".parse::<Format>().is_err());
    }
}
