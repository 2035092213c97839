//! The texts the calls produce and read: error messages for a client
//! (why a call failed, why it was not retried), the `mcp-retry/source`
//! marker on answers the proxy holds, whether a result may be stored, and
//! the fields of log lines about a call.
//!
//! Pure functions of their arguments.

#![forbid(unsafe_code)]

use std::sync::LazyLock;
use std::time::Duration;

use memchr::memmem;

use crate::dispatcher::Reason;
use crate::jsonrpc::RawObject;
use crate::log::Fields;

use super::call::Failure;

/// Where an answer the client gets came from, when not straight from the
/// server (`_meta["mcp-retry/source"]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::dispatcher) enum Source {
    Dedup,
    Cache,
    Stale,
}

impl Source {
    /// As in the marker, and as the tracer names where an answer came from.
    pub(in crate::dispatcher) fn as_str(self) -> &'static str {
        match self {
            Source::Dedup => "dedup",
            Source::Cache => "cache",
            Source::Stale => "stale",
        }
    }
}

/// The structured fields of a log line about attempt `attempt` of `tool`.
pub(super) fn fields<'a>(tool: &'a str, attempt: u32, reason: Option<&'a str>) -> Fields<'a> {
    Fields {
        tool: Some(tool),
        attempt: Some(attempt),
        reason,
    }
}

/// Whether a result may be cached or replayed: not `isError`, not an
/// `input_required` or task-creating result. `result` is valid JSON (the
/// `result` of a parsed message).
pub(super) fn storable(result: &str) -> bool {
    // Reading the members means parsing all of the result again, which costs
    // as much as the line's first parse. A member name can only be written
    // literally or with a `\u` escape, so when none of the three names
    // occurs and there is no `\u`, no such member exists at any depth, and
    // being an object is all that is left to check.
    static NEEDLES: LazyLock<[memmem::Finder<'static>; 4]> = LazyLock::new(|| {
        ["\\u", "\"isError\"", "\"resultType\"", "\"task\""].map(memmem::Finder::new)
    });
    if NEEDLES.iter().all(|n| n.find(result.as_bytes()).is_none()) {
        return result.trim_start().starts_with('{');
    }
    storable_by_members(result)
}

/// [`storable`] by reading the result's members.
fn storable_by_members(result: &str) -> bool {
    let Some(o) = RawObject::parse(result) else {
        return false;
    };
    if o.get("isError").is_some_and(|v| v.get() == "true") {
        return false;
    }
    if o.get("resultType")
        .is_some_and(|v| v.get() != "\"complete\"")
    {
        return false;
    }
    o.get("task").is_none()
}

/// `result` with `_meta["mcp-retry/source"]` set (first in `_meta`),
/// nothing else changed.
pub(super) fn with_source(result: &str, source: Source) -> String {
    let Some(o) = RawObject::parse(result) else {
        return result.to_owned();
    };
    let marker = format!("\"mcp-retry/source\":\"{}\"", source.as_str());
    o.to_json_with_meta("mcp-retry/source", &marker)
}

/// What happened to an attempt of `tool`, for people.
pub(super) fn describe_failure(tool: &str, f: &Failure) -> String {
    match f {
        Failure::NeverSent(why) => format!("tool \"{tool}\" could not be sent ({why})"),
        Failure::Refused(why, _) => format!("tool \"{tool}\" was refused ({why})"),
        Failure::Timeout(d) => format!("tool \"{tool}\" timed out after {}", secs(*d)),
        Failure::Exited(why) => format!("tool \"{tool}\" lost its server before answering ({why})"),
        Failure::Transport(why, _) => {
            format!("tool \"{tool}\" got no answer after it was sent ({why})")
        }
        Failure::Rejected(why, _) => format!("tool \"{tool}\" was rejected ({why})"),
        Failure::Transient(e) => {
            let code = RawObject::parse(e)
                .and_then(|o| o.get("code").map(|c| c.get().to_owned()))
                .unwrap_or_else(|| "?".into());
            format!("tool \"{tool}\" failed with transient error {code}")
        }
    }
}

/// The message of a call that is not retried for `reason`.
pub(super) fn give_up_message(tool: &str, reason: Reason, f: &Failure, attempts: u32) -> String {
    let what = describe_failure(tool, f);
    match reason {
        Reason::NotRetriedUnsafe | Reason::ServerExited => format!(
            "{what} and was not retried: it is not known to be idempotent (set tools.{tool}.idempotent: true if it is){}",
            match f {
                Failure::Exited(_) | Failure::Timeout(_) | Failure::Transport(..) => {
                    "; it may or may not have run"
                }
                _ => "",
            }
        ),
        Reason::RetriesExhausted => format!("{what}; gave up after {attempts} attempts (retry.max_retries)"),
        Reason::Timeout => format!("{what} (retries are off: retry.max_retries is 0)"),
        Reason::RetryBudgetExhausted => format!(
            "{what}; not retried because too many retries were made recently (retry budget exhausted); try again shortly"
        ),
        Reason::DeadlineExceeded => format!("{what}; no time left for another attempt within retry.total_timeout"),
        _ => what,
    }
}

/// A duration for people: `250ms`, `2s`, `1.5s`.
pub(in crate::dispatcher) fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 1.0 {
        format!("{}ms", d.as_millis())
    } else if s.fract() < 0.05 {
        format!("{s:.0}s")
    } else {
        format!("{s:.1}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_marker_is_added_to_meta_only() {
        assert_eq!(
            with_source(r#"{"content":[],"n":1.0}"#, Source::Cache),
            r#"{"_meta":{"mcp-retry/source":"cache"},"content":[],"n":1.0}"#
        );
        assert_eq!(
            with_source(r#"{"_meta":{"a":1},"content":[]}"#, Source::Dedup),
            r#"{"_meta":{"mcp-retry/source":"dedup","a":1},"content":[]}"#
        );
        assert_eq!(
            with_source("{}", Source::Stale),
            r#"{"_meta":{"mcp-retry/source":"stale"}}"#
        );
        assert_eq!(
            with_source(r#"{"_meta":null,"content":[]}"#, Source::Cache),
            r#"{"_meta":{"mcp-retry/source":"cache"},"content":[]}"#
        );
        assert_eq!(
            with_source(r#"{"_meta":{"mcp-retry/source":"old"}}"#, Source::Dedup),
            r#"{"_meta":{"mcp-retry/source":"dedup"}}"#
        );
    }

    #[test]
    fn storable_excludes_errors_and_incomplete_results() {
        assert!(storable(r#"{"content":[]}"#));
        assert!(storable(r#"{"content":[],"isError":false}"#));
        assert!(!storable(r#"{"content":[],"isError":true}"#));
        assert!(!storable(r#"{"resultType":"input_required"}"#));
        assert!(storable(r#"{"resultType":"complete","content":[]}"#));
        assert!(!storable(r#"{"task":{"taskId":"t"}}"#));
        // Escaped member names are names all the same.
        assert!(!storable(r#"{"content":[],"is\u0045rror":true}"#));
        assert!(!storable(r#"{"\u0074ask":{}}"#));
        assert!(storable(r#"{"content":[{"type":"text","text":"\u00e9"}]}"#));
        assert!(storable(
            r#"{"content":[{"type":"text","text":"the \"task\" is done"}]}"#
        ));
        assert!(!storable(r#"[{"content":[]}]"#));
        assert!(!storable(r#""text""#));
        assert!(storable(r#"{"structuredContent":{"isError":true}}"#));
    }

    #[test]
    fn storable_shortcut_agrees_with_reading_the_members() {
        for r in [
            r#"{}"#,
            r#" {"content":[]}"#,
            r#"{"content":[{"type":"text","text":"{\"seq\":1}"}],"structuredContent":{"arguments":{"seq":1},"pid":7}}"#,
            r#"{"content":[],"isError":false}"#,
            r#"{"content":[],"isError":true}"#,
            r#"{"resultType":"complete"}"#,
            r#"{"resultType":"input_required"}"#,
            r#"{"task":null}"#,
            r#"{"a":{"task":1}}"#,
            r#"{"is\u0045rror":true}"#,
            r#"{"x":"\\u0041"}"#,
            r#"["isError"]"#,
            r#"null"#,
            r#"12"#,
        ] {
            assert_eq!(storable(r), storable_by_members(r), "{r}");
        }
    }
}
