//! What an HTTP failure means for the retry gate: pure functions from a
//! failed request (a `ureq` error, or a status with its `Retry-After` and
//! body) to a [`Class`], one table row per case. The transport turns a
//! class into [`ServerEvent`](crate::downstream::ServerEvent)s. Knows no
//! threads and no sockets.

#![forbid(unsafe_code)]

use std::io::ErrorKind;
use std::time::Duration;

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
    /// The server refused it without running it (429, 503 with
    /// `Retry-After`); send it again, not before the hint.
    Refused(Option<Duration>),
    /// The session we named is gone (404 with our session id, or 400 "no
    /// valid session ID"): start a new one and resend.
    SessionLost,
    /// 401 or 403: new headers from `headers_helper` may help, once.
    Unauthorized,
    /// Any other status: a final answer.
    Rejected,
}

/// The class of a request that got no HTTP answer.
pub fn of_error(e: &ureq::Error) -> Class {
    use ureq::Timeout as T;
    match e {
        ureq::Error::HostNotFound
        | ureq::Error::BadUri(_)
        | ureq::Error::ConnectionFailed
        | ureq::Error::Tls(_)
        | ureq::Error::InvalidProxyUrl
        | ureq::Error::Timeout(T::Resolve | T::Connect) => Class::NeverSent,
        // Only a connect can be refused; TLS alerts arrive as InvalidData
        // before a byte of the request was written.
        ureq::Error::Io(io) if io.kind() == ErrorKind::ConnectionRefused => Class::NeverSent,
        ureq::Error::Io(io) if io.kind() == ErrorKind::InvalidData => Class::NeverSent,
        _ => Class::Broken,
    }
}

/// The class of a non-2xx answer. `retry_after` is the header as sent,
/// `sent_session` whether the request named a session, `body` the start of
/// the answer's body.
pub fn of_status(status: u16, retry_after: Option<&str>, sent_session: bool, body: &str) -> Class {
    let session_message = {
        let b = body.to_ascii_lowercase();
        b.contains("session") && (b.contains("not found") || b.contains("no valid"))
    };
    match status {
        429 => Class::Refused(retry_after.and_then(retry_after_delay)),
        503 if retry_after.is_some() => Class::Refused(retry_after.and_then(retry_after_delay)),
        500 | 502 | 503 | 504 => Class::ServerError,
        404 if sent_session => Class::SessionLost,
        400 if sent_session && session_message => Class::SessionLost,
        401 | 403 => Class::Unauthorized,
        _ => Class::Rejected,
    }
}

/// `Retry-After` as delay-seconds. An HTTP-date gives `None` (the
/// ordinary backoff applies).
pub fn retry_after_delay(value: &str) -> Option<Duration> {
    let v = value.trim();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse::<u64>().ok().map(Duration::from_secs)
}

/// The reason phrase of a status, for messages: `401 Unauthorized`.
pub fn status_line(status: u16) -> String {
    let phrase = match status {
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        409 => "Conflict",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "",
    };
    format!("{status} {phrase}").trim_end().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    fn io_err(kind: ErrorKind) -> ureq::Error {
        ureq::Error::Io(io::Error::new(kind, "x"))
    }

    #[test]
    fn dns_failure_is_never_sent() {
        assert_eq!(of_error(&ureq::Error::HostNotFound), Class::NeverSent);
        assert_eq!(
            of_error(&ureq::Error::Timeout(ureq::Timeout::Resolve)),
            Class::NeverSent
        );
    }

    #[test]
    fn refused_connection_is_never_sent() {
        assert_eq!(
            of_error(&io_err(ErrorKind::ConnectionRefused)),
            Class::NeverSent
        );
        assert_eq!(of_error(&ureq::Error::ConnectionFailed), Class::NeverSent);
    }

    #[test]
    fn connect_timeout_is_never_sent() {
        let e = ureq::Error::Timeout(ureq::Timeout::Connect);
        assert_eq!(of_error(&e), Class::NeverSent);
    }

    #[test]
    fn tls_handshake_failure_is_never_sent() {
        assert_eq!(of_error(&ureq::Error::Tls("bad cert")), Class::NeverSent);
        assert_eq!(of_error(&io_err(ErrorKind::InvalidData)), Class::NeverSent);
    }

    #[test]
    fn bad_url_is_never_sent() {
        assert_eq!(of_error(&ureq::Error::BadUri("x".into())), Class::NeverSent);
    }

    #[test]
    fn reset_or_eof_after_sending_is_broken() {
        for kind in [
            ErrorKind::ConnectionReset,
            ErrorKind::UnexpectedEof,
            ErrorKind::BrokenPipe,
        ] {
            assert_eq!(of_error(&io_err(kind)), Class::Broken, "{kind:?}");
        }
    }

    #[test]
    fn response_timeout_is_broken() {
        for t in [ureq::Timeout::RecvResponse, ureq::Timeout::RecvBody] {
            assert_eq!(of_error(&ureq::Error::Timeout(t)), Class::Broken);
        }
    }

    #[test]
    fn server_errors_may_have_run() {
        for status in [500, 502, 504] {
            assert_eq!(of_status(status, None, true, ""), Class::ServerError);
            assert_eq!(of_status(status, Some("1"), true, ""), Class::ServerError);
        }
    }

    #[test]
    fn service_unavailable_without_retry_after_may_have_run() {
        assert_eq!(of_status(503, None, true, ""), Class::ServerError);
    }

    #[test]
    fn service_unavailable_with_retry_after_was_refused() {
        let d = Some(Duration::from_secs(2));
        assert_eq!(of_status(503, Some("2"), true, ""), Class::Refused(d));
        let date = "Wed, 21 Oct 2015 07:28:00 GMT";
        assert_eq!(of_status(503, Some(date), true, ""), Class::Refused(None));
    }

    #[test]
    fn too_many_requests_was_refused() {
        let d = Some(Duration::from_secs(3));
        assert_eq!(of_status(429, Some(" 3 "), true, ""), Class::Refused(d));
        assert_eq!(of_status(429, None, true, ""), Class::Refused(None));
    }

    #[test]
    fn not_found_with_our_session_is_a_lost_session() {
        assert_eq!(of_status(404, None, true, "{}"), Class::SessionLost);
        assert_eq!(of_status(404, None, false, "{}"), Class::Rejected);
    }

    #[test]
    fn bad_request_naming_the_session_is_a_lost_session() {
        let body =
            r#"{"error":{"code":-32000,"message":"Bad Request: No valid session ID provided"}}"#;
        assert_eq!(of_status(400, None, true, body), Class::SessionLost);
        assert_eq!(of_status(400, None, false, body), Class::Rejected);
        let other = r#"{"error":{"message":"Unsupported protocol version"}}"#;
        assert_eq!(of_status(400, None, true, other), Class::Rejected);
    }

    #[test]
    fn unauthorized_and_forbidden_ask_for_new_headers() {
        assert_eq!(of_status(401, None, true, ""), Class::Unauthorized);
        assert_eq!(of_status(403, None, false, ""), Class::Unauthorized);
    }

    #[test]
    fn other_client_errors_are_final() {
        for status in [400, 405, 406, 413, 415, 422] {
            assert_eq!(of_status(status, None, true, ""), Class::Rejected);
        }
    }

    #[test]
    fn status_lines_name_the_status() {
        assert_eq!(status_line(401), "401 Unauthorized");
        assert_eq!(status_line(418), "418");
    }
}
