//! Durations as a config or the command line writes them: seconds as a
//! number, or a string like `250ms`, `1.5s`, `2m`, `1h`; rounded to the
//! nanosecond, refused when negative or out of range.
//!
//! Knows no key.

#![forbid(unsafe_code)]

use std::time::Duration;

pub(super) const DURATION_EXPECTED: &str =
    "expected a duration (seconds, or a string like \"250ms\", \"1.5s\", \"2m\", \"1h\")";

/// Rounds a number of nanoseconds to a duration; `None` when out of range.
pub(super) fn nanos(n: f64) -> Option<Duration> {
    let n = n.round();
    // 2^64 is exactly representable; every f64 below it converts losslessly.
    (0.0..18_446_744_073_709_551_616.0)
        .contains(&n)
        .then(|| Duration::from_nanos(n as u64))
}

/// Parses "250ms", "1.5s", "2m" or "1h" (also `check --timeout`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err("expected a non-negative duration".to_string());
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number: f64 = match number.parse() {
        Ok(n) if !number.is_empty() => n,
        _ => return Err(DURATION_EXPECTED.to_string()),
    };
    let per_unit = match unit.trim_start() {
        "ms" => 1e6,
        "s" => 1e9,
        "m" => 60e9,
        "h" => 3600e9,
        "" => return Err("a duration string needs a unit (ms, s, m or h)".to_string()),
        other => {
            return Err(format!(
                "unknown duration unit {other:?} (use ms, s, m or h)"
            ))
        }
    };
    nanos(number * per_unit).ok_or_else(|| "duration too large".to_string())
}
