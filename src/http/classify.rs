//! What an HTTP failure means for the retry gate: pure functions from a
//! failed request (a `ureq` error and whether the request was completely
//! written, or a status with its `Retry-After` and body) to a [`Class`],
//! one table row per case, and `Retry-After` read as delay-seconds or an
//! HTTP-date, clamped to [`MAX_PEER_DELAY`]. The transport turns a class into
//! [`ServerEvent`](crate::downstream::ServerEvent)s. Knows no threads, no
//! sockets and no clock (`now` is a parameter).

#![forbid(unsafe_code)]

use crate::downstream::Heal;
use std::io::ErrorKind;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest delay a peer may ask for (`Retry-After`, SSE `retry`, the
/// JSON `retryAfter` hints): anything longer, however written, is read as
/// this, so that no deadline made from it can overflow.
pub const MAX_PEER_DELAY: Duration = Duration::from_secs(24 * 60 * 60);

/// JSON-RPC `HeaderMismatch` (2026-07-28): the request's headers do not
/// match its body.
pub const HEADER_MISMATCH: i64 = -32020;

/// How a failed POST is handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Class {
    /// The request cannot have reached the server (DNS, refused, connect
    /// timeout, TLS handshake, bad URL): resend it to a new connection.
    NeverSent,
    /// Sent, then the connection broke or timed out: it may have run.
    Broken,
    /// The server (or a gateway) failed the request after it may have run
    /// (500, 502, 504, 503 without `Retry-After`).
    ServerError,
    /// The server refused it without running it (408, 429, 503 with
    /// `Retry-After`); send it again, not before the hint.
    Refused(Option<Duration>),
    /// The session we named is gone (404 with our session id, or 400 "no
    /// valid session ID"): start a new one and resend.
    SessionLost,
    /// 401 or 403: new headers from `headers_helper` may help, once.
    Unauthorized,
    /// 2026-07-28: 400 `HeaderMismatch` (-32020); the tool's `x-mcp-header`
    /// annotations may have changed: read `tools/list` again, resend once.
    HeaderMismatch,
    /// 2026-07-28: a 4xx whose body is a JSON-RPC error (unsupported
    /// version, unknown method, bad params): the server's answer to the
    /// request, passed on as it is.
    Answered,
    /// Any other status: a final answer.
    Rejected,
}

/// The class of a request that got no HTTP answer. `written`: the whole
/// request, body included, went out before the error.
pub fn of_error(e: &ureq::Error, written: bool) -> Class {
    use ureq::Timeout as T;
    if !written {
        // A server acts on a message only once it has all of it.
        return Class::NeverSent;
    }
    match e {
        ureq::Error::HostNotFound
        | ureq::Error::BadUri(_)
        | ureq::Error::ConnectionFailed
        | ureq::Error::Tls(_)
        | ureq::Error::InvalidProxyUrl
        | ureq::Error::Timeout(T::Resolve | T::Connect) => Class::NeverSent,
        // Only a connect can be refused. A TLS handshake completes inside
        // the connect, before a byte of the request is written (`!written`
        // above): an InvalidData after the whole request went out is a
        // broken connection like any other.
        ureq::Error::Io(io) if io.kind() == ErrorKind::ConnectionRefused => Class::NeverSent,
        _ => Class::Broken,
    }
}

/// Whether waiting may heal a connection that could not be made: not an
/// unknown host (`HostNotFound`, or a lookup the resolver answered with
/// "no such name"), a bad URL or proxy, or a TLS failure (a certificate the
/// name does not match, an unknown authority) — someone must fix those.
pub fn heal(e: &ureq::Error) -> Heal {
    match e {
        ureq::Error::BadUri(_) | ureq::Error::Tls(_) | ureq::Error::InvalidProxyUrl => Heal::Fix,
        ureq::Error::Io(io) if io.kind() == ErrorKind::InvalidData => Heal::Fix,
        _ if unknown_host(e) => Heal::Fix,
        _ => Heal::Wait,
    }
}

/// Whether the resolver said that the host name does not exist (not: it
/// could not ask, which may heal).
pub fn unknown_host(e: &ureq::Error) -> bool {
    match e {
        ureq::Error::HostNotFound => true,
        ureq::Error::Io(io) => crate::resolve::no_such_host(io),
        _ => false,
    }
}

/// A non-2xx answer to a request.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    pub status: u16,
    /// The `Retry-After` header as sent.
    pub retry_after: Option<&'a str>,
    /// The request named a session.
    pub sent_session: bool,
    /// The start of the answer's body.
    pub body: &'a str,
    /// The request was a 2026-07-28 one (no session, `_meta` version).
    pub modern: bool,
}

/// The class of a non-2xx answer; `now` dates a `Retry-After` HTTP-date.
pub fn of_status(a: &Answer, now: SystemTime) -> Class {
    let session_message = {
        let b = a.body.to_ascii_lowercase();
        b.contains("session") && (b.contains("not found") || b.contains("no valid"))
    };
    let hint = || a.retry_after.and_then(|v| retry_after_delay(v, now));
    let modern_error = a.modern && (400..500).contains(&a.status);
    match a.status {
        // The server gave up waiting for the request: it never had all of it.
        408 | 429 => Class::Refused(hint()),
        503 if a.retry_after.is_some() => Class::Refused(hint()),
        500 | 502 | 503 | 504 => Class::ServerError,
        401 | 403 => Class::Unauthorized,
        _ if modern_error => match json_rpc_error_code(a.body) {
            Some(HEADER_MISMATCH) if a.status == 400 => Class::HeaderMismatch,
            Some(_) => Class::Answered,
            None => Class::Rejected,
        },
        404 if a.sent_session => Class::SessionLost,
        400 if a.sent_session && session_message => Class::SessionLost,
        _ => Class::Rejected,
    }
}

/// `error.code` of a body that is a JSON-RPC error response.
pub fn json_rpc_error_code(body: &str) -> Option<i64> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    v.get("error")?.get("code")?.as_i64()
}

/// `Retry-After` (RFC 9110 §10.2.3): delay-seconds, or an HTTP-date, which
/// is that long after `now` (zero once past), at most [`MAX_PEER_DELAY`]
/// (digits too many for a number are that too). `None` if it is neither.
pub fn retry_after_delay(value: &str, now: SystemTime) -> Option<Duration> {
    let v = value.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        let secs = v.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(secs).min(MAX_PEER_DELAY));
    }
    let delay = match UNIX_EPOCH.checked_add(Duration::from_secs(http_date(v)?)) {
        Some(at) => at.duration_since(now).unwrap_or(Duration::ZERO),
        None => MAX_PEER_DELAY,
    };
    Some(delay.min(MAX_PEER_DELAY))
}

/// An HTTP-date (RFC 9110 §5.6.7) as seconds since the Unix epoch: the
/// IMF-fixdate `Sun, 06 Nov 1994 08:49:37 GMT`, and the obsolete forms a
/// recipient must also accept, RFC 850 `Sunday, 06-Nov-94 08:49:37 GMT` and
/// asctime `Sun Nov  6 08:49:37 1994`. Years are 1970 to 9999 (four
/// digits, as the grammar has them).
pub fn http_date(text: &str) -> Option<u64> {
    let at = httpdate::parse_http_date(text.trim()).ok()?;
    at.duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs())
}

/// The reason phrase of a status, for messages: `401 Unauthorized`.
pub fn status_line(status: u16) -> String {
    let phrase = ureq::http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("");
    format!("{status} {phrase}").trim_end().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    fn io_err(kind: ErrorKind) -> ureq::Error {
        ureq::Error::Io(io::Error::new(kind, "x"))
    }

    /// 2015-10-21 07:28:00 UTC.
    const DATE: &str = "Wed, 21 Oct 2015 07:28:00 GMT";
    const DATE_SECS: u64 = 1_445_412_480;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn class_of(
        status: u16,
        retry_after: Option<&str>,
        session: bool,
        body: &str,
        modern: bool,
    ) -> Class {
        let a = Answer {
            status,
            retry_after,
            sent_session: session,
            body,
            modern,
        };
        of_status(&a, at(DATE_SECS))
    }

    /// A 2025-era answer to a request that named a session.
    fn legacy(status: u16, retry_after: Option<&str>, body: &str) -> Class {
        class_of(status, retry_after, true, body, false)
    }

    fn sessionless(status: u16, body: &str) -> Class {
        class_of(status, None, false, body, false)
    }

    /// A 2026-07-28 answer.
    fn modern(status: u16, body: &str) -> Class {
        class_of(status, None, false, body, true)
    }

    #[test]
    fn a_name_that_does_not_exist_needs_fixing_a_lookup_that_failed_may_heal() {
        use std::net::ToSocketAddrs;
        let missing = "mcp-retry-test.invalid:80".to_socket_addrs().unwrap_err();
        assert_eq!(heal(&ureq::Error::Io(missing)), Heal::Fix);
        assert_eq!(heal(&ureq::Error::HostNotFound), Heal::Fix);
        assert_eq!(
            heal(&ureq::Error::Timeout(ureq::Timeout::Resolve)),
            Heal::Wait
        );
        let refused = io_err(ErrorKind::ConnectionRefused);
        assert_eq!(heal(&refused), Heal::Wait);
    }

    #[test]
    fn dns_failure_is_never_sent() {
        assert_eq!(
            of_error(&ureq::Error::HostNotFound, false),
            Class::NeverSent
        );
        assert_eq!(
            of_error(&ureq::Error::Timeout(ureq::Timeout::Resolve), false),
            Class::NeverSent
        );
    }

    #[test]
    fn refused_connection_is_never_sent() {
        assert_eq!(
            of_error(&io_err(ErrorKind::ConnectionRefused), false),
            Class::NeverSent
        );
        assert_eq!(
            of_error(&ureq::Error::ConnectionFailed, false),
            Class::NeverSent
        );
    }

    #[test]
    fn connect_timeout_is_never_sent() {
        let e = ureq::Error::Timeout(ureq::Timeout::Connect);
        assert_eq!(of_error(&e, false), Class::NeverSent);
    }

    #[test]
    fn tls_handshake_failure_is_never_sent() {
        assert_eq!(
            of_error(&ureq::Error::Tls("bad cert"), false),
            Class::NeverSent
        );
        assert_eq!(
            of_error(&io_err(ErrorKind::InvalidData), false),
            Class::NeverSent
        );
    }

    #[test]
    fn invalid_data_after_the_request_went_out_is_broken() {
        // Whatever the bytes were, the server had the whole request.
        assert_eq!(
            of_error(&io_err(ErrorKind::InvalidData), true),
            Class::Broken
        );
    }

    #[test]
    fn bad_url_is_never_sent() {
        assert_eq!(
            of_error(&ureq::Error::BadUri("x".into()), false),
            Class::NeverSent
        );
    }

    #[test]
    fn a_request_not_completely_written_is_never_sent() {
        for e in [
            io_err(ErrorKind::ConnectionReset),
            io_err(ErrorKind::BrokenPipe),
            ureq::Error::Timeout(ureq::Timeout::SendBody),
        ] {
            assert_eq!(of_error(&e, false), Class::NeverSent, "{e}");
        }
    }

    #[test]
    fn reset_or_eof_after_sending_is_broken() {
        for kind in [
            ErrorKind::ConnectionReset,
            ErrorKind::UnexpectedEof,
            ErrorKind::BrokenPipe,
        ] {
            assert_eq!(of_error(&io_err(kind), true), Class::Broken, "{kind:?}");
        }
    }

    #[test]
    fn response_timeout_is_broken() {
        for t in [ureq::Timeout::RecvResponse, ureq::Timeout::RecvBody] {
            assert_eq!(of_error(&ureq::Error::Timeout(t), true), Class::Broken);
        }
    }

    #[test]
    fn server_errors_may_have_run() {
        for status in [500, 502, 504] {
            assert_eq!(legacy(status, None, ""), Class::ServerError);
            assert_eq!(legacy(status, Some("1"), ""), Class::ServerError);
            assert_eq!(modern(status, "{}"), Class::ServerError);
        }
    }

    #[test]
    fn service_unavailable_without_retry_after_may_have_run() {
        assert_eq!(legacy(503, None, ""), Class::ServerError);
    }

    #[test]
    fn service_unavailable_with_retry_after_was_refused() {
        let d = Some(Duration::from_secs(2));
        assert_eq!(legacy(503, Some("2"), ""), Class::Refused(d));
        assert_eq!(legacy(503, Some("soon"), ""), Class::Refused(None));
    }

    #[test]
    fn too_many_requests_was_refused() {
        let d = Some(Duration::from_secs(3));
        assert_eq!(legacy(429, Some(" 3 "), ""), Class::Refused(d));
        assert_eq!(legacy(429, None, ""), Class::Refused(None));
    }

    #[test]
    fn request_timeout_was_never_run() {
        assert_eq!(legacy(408, None, ""), Class::Refused(None));
        let d = Some(Duration::from_secs(1));
        assert_eq!(legacy(408, Some("1"), ""), Class::Refused(d));
        assert_eq!(sessionless(408, ""), Class::Refused(None));
        assert_eq!(modern(408, "{}"), Class::Refused(None));
    }

    #[test]
    fn retry_after_as_an_http_date_is_the_time_until_then() {
        let d = Some(Duration::from_secs(90));
        let then = "Wed, 21 Oct 2015 07:29:30 GMT";
        assert_eq!(legacy(429, Some(then), ""), Class::Refused(d));
        assert_eq!(legacy(503, Some(then), ""), Class::Refused(d));
        // A date already past: retry now.
        let past = Some(Duration::ZERO);
        assert_eq!(
            legacy(429, Some("Wed, 21 Oct 2015 07:27:00 GMT"), ""),
            Class::Refused(past)
        );
    }

    #[test]
    fn retry_after_reads_seconds_and_the_three_date_forms() {
        let now = at(DATE_SECS - 10);
        let ten = Some(Duration::from_secs(10));
        assert_eq!(retry_after_delay("10", now), ten);
        assert_eq!(retry_after_delay(DATE, now), ten);
        assert_eq!(
            retry_after_delay("Wednesday, 21-Oct-15 07:28:00 GMT", now),
            ten
        );
        assert_eq!(retry_after_delay("Wed Oct 21 07:28:00 2015", now), ten);
        for bad in ["", "-1", "1.5", "soon", "Wed, 21 Oct 2015 07:28:00 UTC"] {
            assert_eq!(retry_after_delay(bad, now), None, "{bad:?}");
        }
    }

    #[test]
    fn retry_after_is_clamped_to_the_longest_delay_a_peer_may_ask_for() {
        let now = at(DATE_SECS);
        for huge in [
            "86401",
            "9223372036854775808",
            "18446744073709551615",
            "99999999999999999999999999",
            "Fri, 31 Dec 9999 23:59:59 GMT",
        ] {
            assert_eq!(
                retry_after_delay(huge, now),
                Some(MAX_PEER_DELAY),
                "{huge:?}"
            );
        }
        // Beyond the grammar's four-digit years: not a date at all, and no
        // overflow computing one.
        for bad in [
            "Fri, 31 Dec 99999999999 23:59:59 GMT",
            "Fri, 31 Dec 18446744073709551615 23:59:59 GMT",
            "Fri Dec 31 23:59:59 18446744073709551615",
        ] {
            assert_eq!(retry_after_delay(bad, now), None, "{bad:?}");
        }
        assert_eq!(
            legacy(429, Some("18446744073709551615"), ""),
            Class::Refused(Some(MAX_PEER_DELAY))
        );
    }

    #[test]
    fn http_dates_are_seconds_since_the_epoch() {
        assert_eq!(http_date(DATE), Some(DATE_SECS));
        assert_eq!(http_date("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(
            http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777)
        );
        assert_eq!(
            http_date("Sunday, 06-Nov-94 08:49:37 GMT"),
            Some(784_111_777)
        );
        assert_eq!(http_date("Sun Nov  6 08:49:37 1994"), Some(784_111_777));
        // A leap day, and the end of a leap year.
        assert_eq!(
            http_date("Thu, 29 Feb 2024 12:00:00 GMT"),
            Some(1_709_208_000)
        );
        assert_eq!(
            http_date("Tue, 31 Dec 2024 23:59:59 GMT"),
            Some(1_735_689_599)
        );
        for bad in [
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Sun, 32 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 24:00:00 GMT",
            "Sun, 06 Nov 1994 08:49 GMT",
            "Sun, 06 Nov 1969 08:49:37 GMT",
            "06 Nov 1994 08:49:37 GMT",
        ] {
            assert_eq!(http_date(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn not_found_with_our_session_is_a_lost_session() {
        assert_eq!(legacy(404, None, "{}"), Class::SessionLost);
        assert_eq!(sessionless(404, "{}"), Class::Rejected);
    }

    #[test]
    fn bad_request_naming_the_session_is_a_lost_session() {
        let body =
            r#"{"error":{"code":-32000,"message":"Bad Request: No valid session ID provided"}}"#;
        assert_eq!(legacy(400, None, body), Class::SessionLost);
        assert_eq!(sessionless(400, body), Class::Rejected);
        let other = r#"{"error":{"message":"Unsupported protocol version"}}"#;
        assert_eq!(legacy(400, None, other), Class::Rejected);
    }

    #[test]
    fn unauthorized_and_forbidden_ask_for_new_headers() {
        assert_eq!(legacy(401, None, ""), Class::Unauthorized);
        assert_eq!(sessionless(403, ""), Class::Unauthorized);
        let body = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"no"}}"#;
        assert_eq!(modern(401, body), Class::Unauthorized);
    }

    #[test]
    fn a_modern_header_mismatch_reads_the_tools_again() {
        let body = r#"{"jsonrpc":"2.0","id":2,"error":{"code":-32020,"message":"Mcp-Param-Region header is missing"}}"#;
        assert_eq!(modern(400, body), Class::HeaderMismatch);
        // Only in the 2026-07-28 era, and only on a 400.
        assert_eq!(sessionless(400, body), Class::Rejected);
        assert_eq!(modern(404, body), Class::Answered);
    }

    #[test]
    fn a_modern_json_rpc_error_is_the_answer() {
        let unknown =
            r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32601,"message":"Method not found"}}"#;
        assert_eq!(modern(404, unknown), Class::Answered);
        let version = r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32022,"message":"Unsupported protocol version","data":{"supported":["2026-07-28"]}}}"#;
        assert_eq!(modern(400, version), Class::Answered);
        // Not a JSON-RPC error: the status decides.
        assert_eq!(modern(404, "Not Found"), Class::Rejected);
        assert_eq!(modern(400, r#"{"error":"x"}"#), Class::Rejected);
    }

    #[test]
    fn other_client_errors_are_final() {
        for status in [400, 405, 406, 413, 415, 422] {
            assert_eq!(legacy(status, None, ""), Class::Rejected);
        }
    }

    #[test]
    fn status_lines_name_the_status() {
        assert_eq!(status_line(401), "401 Unauthorized");
        assert_eq!(status_line(408), "408 Request Timeout");
        assert_eq!(status_line(502), "502 Bad Gateway");
        assert_eq!(status_line(599), "599");
    }
}
