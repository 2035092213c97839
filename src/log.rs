//! Diagnostics on stderr: the level and format chosen on the command line,
//! and the `error!`/`warn!`/`info!`/`debug!` macros.
//!
//! This is the only writer of our own messages to stderr (the child's stderr
//! is copied by `child.rs`). stdout is never touched here: it carries protocol
//! bytes only. Knows nothing of the protocol or of policies.

use std::fmt;
use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

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

pub fn init(level: Level, format: Format) {
    LEVEL.store(level as u8, Ordering::Relaxed);
    FORMAT.store((format == Format::Json) as u8, Ordering::Relaxed);
}

pub fn enabled(level: Level) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// Writes one log line. Errors writing to stderr are ignored: there is
/// nowhere left to report them.
pub fn emit(level: Level, args: fmt::Arguments<'_>) {
    let line = if FORMAT.load(Ordering::Relaxed) == 1 {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let msg = serde_json::to_string(&args.to_string()).unwrap_or_default();
        format!(
            "{{\"ts\":{ts:.3},\"level\":\"{}\",\"target\":\"mcp-retry\",\"msg\":{msg}}}\n",
            level.as_str()
        )
    } else {
        format!("mcp-retry: {}: {args}\n", level.as_str())
    };
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

#[macro_export]
macro_rules! error {
    ($($t:tt)*) => { if $crate::log::enabled($crate::log::Level::Error) { $crate::log::emit($crate::log::Level::Error, format_args!($($t)*)) } };
}
#[macro_export]
macro_rules! warn {
    ($($t:tt)*) => { if $crate::log::enabled($crate::log::Level::Warn) { $crate::log::emit($crate::log::Level::Warn, format_args!($($t)*)) } };
}
#[macro_export]
macro_rules! info {
    ($($t:tt)*) => { if $crate::log::enabled($crate::log::Level::Info) { $crate::log::emit($crate::log::Level::Info, format_args!($($t)*)) } };
}
#[macro_export]
macro_rules! debug {
    ($($t:tt)*) => { if $crate::log::enabled($crate::log::Level::Debug) { $crate::log::emit($crate::log::Level::Debug, format_args!($($t)*)) } };
}

#[cfg(test)]
mod tests {
    use super::*;

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
