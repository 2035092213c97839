//! Reading a POST's answer: a JSON body or an SSE stream, each message
//! reported in order and the request's own response last, an event over
//! `max_message_bytes` reported as the response being too large, and a
//! broken or ended 2025-era stream resumed with GET and `Last-Event-ID` as
//! the state machine of `resume.rs` decides. Knows nothing of how a POST
//! is made or classified.

#![forbid(unsafe_code)]

use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::downstream::ServerEvent;
use crate::jsonrpc::{self, Message, RawObject};

use super::classify::Class;
use super::conn::Exchange;
use super::headers::header;
use super::post::Post;
use super::{resume, sse, Shared};

/// Where a request's answer stream is: its last event id and `retry`.
#[derive(Default)]
pub(super) struct Cursor {
    pub(super) last_id: Option<String>,
    pub(super) retry: Option<Duration>,
    /// Times the last event id moved on, so far: events the resumptions
    /// have not brought before.
    pub(super) fresh: usize,
    /// The size of an event over `max_message_bytes` that came while the
    /// response had not: that response, most likely.
    pub(super) too_long: Option<usize>,
    /// The stream read last set `retry`.
    pub(super) stream_retry: bool,
}

/// The response an answer stream is read until.
pub(super) struct Until<'a> {
    /// Its id, as written.
    pub(super) id: &'a str,
    /// It answers `initialize`: it names the protocol version.
    pub(super) initialize: bool,
    /// It answers a 2026-07-28 `tools/list`: tools with invalid
    /// `x-mcp-header` annotations are dropped, the others' learned.
    pub(super) screen_tools: bool,
}

/// Whether a read failed because it was silent for its per-read timeout
/// (a resumed stream that stalled).
pub(super) fn is_read_stall(e: &std::io::Error) -> bool {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<ureq::Error>())
        .is_some_and(|u| matches!(u, ureq::Error::Timeout(ureq::Timeout::PerRead)))
}

/// What a resuming GET that got no response came to. Silent for the stall
/// limit (its per-read timeout) before its headers came, as an event store
/// slow to replay is: a stall, not a failure, so that after
/// `resume::STALLS` the next GET waits without that limit (instead of
/// being given up as fruitless).
pub(super) fn unanswered_get(e: &ureq::Error) -> resume::Outcome {
    match e {
        ureq::Error::Timeout(ureq::Timeout::PerRead) => resume::Outcome::Ended {
            fresh: false,
            polled: false,
            stalled: true,
        },
        _ => resume::Outcome::Failed,
    }
}

/// Takes the stream's last event id into `last_id` when it moved on
/// (counted in `moved`; copied only then, an id being up to
/// [`sse::MAX_ID`] bytes); an id too long to keep leaves none: the stream
/// cannot be resumed from there, which is said at debug level.
pub(super) fn note_last_id(
    parser: &sse::Parser,
    last_id: &mut Option<String>,
    shown: &str,
    moved: &mut usize,
) {
    let now = parser.last_id();
    if !parser.ids_ended() || now == last_id.as_deref() {
        return;
    }
    if now.is_none() && parser.id_dropped() {
        crate::debug!(
            "{shown} sent an event id over {} bytes; its stream cannot be resumed from there",
            sse::MAX_ID
        );
    }
    *last_id = now.map(str::to_owned);
    *moved += 1;
}

/// Whether `text` is a response to a request other than `id`.
pub(super) fn is_other_response(text: &str, id: &str) -> bool {
    match Message::reparse(text.to_owned()) {
        Some(m) => m.method().is_none() && m.id().is_some_and(|i| i != id),
        None => false,
    }
}

/// The negotiated version in an `initialize` result (its members read as
/// raw text: nothing of the result is built but the version).
pub(super) fn protocol_version(line: &str) -> Option<String> {
    let result = RawObject::parse(RawObject::parse(line)?.get("result")?.get())?;
    result.string("protocolVersion")
}

impl Shared {
    /// A 2xx answer to `post`.
    pub(super) fn answered(
        self: &Arc<Shared>,
        post: &Post,
        resp: ureq::http::Response<ureq::Body>,
    ) {
        if post.is("initialize") {
            self.session.set_id(header(&resp, "mcp-session-id"));
        }
        let kind = header(&resp, "content-type").unwrap_or_default();
        let is_sse = kind.to_ascii_lowercase().starts_with("text/event-stream");
        let is_json = kind.to_ascii_lowercase().starts_with("application/json");
        if post.is("notifications/initialized") {
            // The server's own stream opens before anything sent after
            // `initialized` starts (the SDKs' order): the GET thread lets
            // the next line go once its first GET is answered or fails.
            self.start_get_stream(Some(post.turn.hand_off()));
        }
        let Some(until) = post.until() else {
            // A notification or a response: 202, nothing to read.
            return;
        };
        // 2026-07-28 streams cannot be resumed.
        let resumable = post.modern.is_none();
        let delivered = if is_sse {
            let reader = resp.into_body().into_reader();
            let mut cursor = Cursor::default();
            match self.read_stream(reader, &until, &mut cursor, false) {
                Ok(true) => true,
                // Ended or broken after an event over the limit, and no
                // response: that was the response; it ran, and running it
                // again would bring the same (as for a JSON body).
                _ if cursor.too_long.is_some() => self.too_large(&until, &cursor),
                // Ended or broken after events with ids: the server may
                // replay the rest (and the response) to a GET.
                Ok(false) if resumable && self.resume(&until, &mut cursor, &post.exchange) => true,
                Err(_) if resumable && self.resume(&until, &mut cursor, &post.exchange) => true,
                _ if cursor.too_long.is_some() => self.too_large(&until, &cursor),
                Ok(false) => false,
                Err(e) => {
                    let why = format!("the answer's stream broke ({})", self.scrub(&e.to_string()));
                    return self.failed(post, Class::Broken, &why, None, "");
                }
            }
        } else if is_json {
            let limit = self.max_message_bytes as u64;
            match resp.into_body().with_config().limit(limit).read_to_string() {
                // Anything but the awaited response (`{}`, another id,
                // garbage) is reported as it is, and the request answered
                // with an error below: it must not wait for its timeout.
                Ok(text) => self.deliver(text, Some(&until)),
                Err(ureq::Error::BodyExceedsLimit(n)) => {
                    self.emit(ServerEvent::TooLong {
                        response_id: Some(until.id.to_owned()),
                        len: n as usize,
                    });
                    true
                }
                Err(e) => {
                    let why = format!("the answer broke ({})", self.scrub(&e.to_string()));
                    return self.failed(post, Class::Broken, &why, None, "");
                }
            }
        } else {
            false
        };
        if !delivered {
            let why = "the server's answer ended without a response to the request";
            self.failed(post, Class::ServerError, why, None, "");
        }
    }

    /// Reports the response `until` as over `max_message_bytes` (the event
    /// of the size `cursor` noted); it counts as delivered.
    pub(super) fn too_large(&self, until: &Until, cursor: &Cursor) -> bool {
        self.emit(ServerEvent::TooLong {
            response_id: Some(until.id.to_owned()),
            len: cursor.too_long.unwrap_or(self.max_message_bytes),
        });
        true
    }

    /// Reads an event stream, handing each batch of items to `on` (with
    /// the parser, for its last id and `retry`) until `on` returns a value
    /// (returned) or the stream ends (`None`).
    pub(super) fn read_events<T>(
        &self,
        mut reader: impl Read,
        mut on: impl FnMut(&sse::Parser, std::vec::Drain<'_, sse::Item>) -> Option<T>,
    ) -> std::io::Result<Option<T>> {
        let mut parser = sse::Parser::new(self.max_message_bytes);
        let mut buf = vec![0u8; 16 * 1024];
        let mut items = Vec::new();
        loop {
            let n = reader.read(&mut buf)?;
            if n == 0 {
                return Ok(None);
            }
            parser.feed(&buf[..n], &mut items);
            if let Some(done) = on(&parser, items.drain(..)) {
                return Ok(Some(done));
            }
        }
    }

    /// Reads the SSE answer of a request, reporting its messages, until
    /// the response `until`; says whether it came. `resumed`: the stream
    /// replays events (`Last-Event-ID`), so responses to other requests are
    /// dropped (an answer to a request already answered is dropped by the
    /// dispatcher as any late duplicate is; events are never told apart by
    /// id, which is an opaque cursor and may repeat). An event over
    /// `max_message_bytes` is reported when the stream ends without the
    /// response: it was the response (see [`Shared::answered`]).
    pub(super) fn read_stream(
        &self,
        reader: impl Read,
        until: &Until,
        cursor: &mut Cursor,
        resumed: bool,
    ) -> std::io::Result<bool> {
        cursor.stream_retry = false;
        let answered = self.read_events(reader, |parser, items| {
            note_last_id(parser, &mut cursor.last_id, &self.shown, &mut cursor.fresh);
            cursor.stream_retry |= parser.retry().is_some();
            cursor.retry = parser.retry().or(cursor.retry);
            for item in items {
                match item {
                    sse::Item::Event(e) if e.kind == "message" => {
                        if resumed && is_other_response(&e.data, until.id) {
                            continue;
                        }
                        if self.deliver(e.data, Some(until)) {
                            return Some(());
                        }
                    }
                    sse::Item::Event(_) => {}
                    sse::Item::TooLong(len) => {
                        crate::warn!(
                            "{} sent an event of {len} bytes, over max_message_bytes; dropped",
                            self.shown
                        );
                        cursor.too_long = Some(len);
                    }
                }
            }
            None
        })?;
        // What was over the limit was not the response.
        if let Some(len) = answered.and_then(|()| cursor.too_long.take()) {
            self.emit(ServerEvent::TooLong {
                response_id: None,
                len,
            });
        }
        Ok(answered.is_some())
    }

    /// Resumes the broken or ended answer stream of request `until` with
    /// GET and `Last-Event-ID`, as [`resume::Resumption`] decides (waiting
    /// the stream's `retry`, going on while resumptions bring new events,
    /// a stalled stream closed by a per-read timeout and resumed again,
    /// all within the body deadline `recv_body` from the first
    /// resumption); says whether the response came. Not once the request's
    /// exchange is closed (cancelled).
    pub(super) fn resume(
        &self,
        until: &Until,
        cursor: &mut Cursor,
        exchange: &Arc<Exchange>,
    ) -> bool {
        let stall_min = crate::guard::duration("stall_min", resume::STALL_MIN);
        let mut plan = resume::Resumption::new(Instant::now(), self.recv_body).stall_min(stall_min);
        loop {
            let next = plan.next(cursor.last_id.is_some(), cursor.retry, Instant::now());
            let resume::Next::Get {
                at,
                refresh,
                stall_after,
                deadline,
            } = next
            else {
                return false;
            };
            // Cut short by the connection closing or the request's
            // exchange being closed (cancelled).
            crossbeam_channel::select! {
                recv(self.stopped) -> _ => return false,
                recv(exchange.closing()) -> _ => return false,
                recv(crossbeam_channel::at(at)) -> _ => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(last_id) = cursor.last_id.clone() else {
                return false;
            };
            if exchange.is_closed() || left.is_zero() {
                return false;
            }
            let mut headers = self.session_headers();
            if !headers.iter().any(|(n, _)| n == "Mcp-Session-Id") {
                return false;
            }
            headers.push(("Accept".to_owned(), "text/event-stream".to_owned()));
            headers.push(("Last-Event-ID".to_owned(), last_id));
            let req = self.headed(self.agent.get(&self.url), headers, refresh);
            crate::debug!(
                "resuming the answer to request {} from {}",
                until.id,
                self.shown
            );
            exchange.begin_request(0);
            let result = req
                .config()
                .timeout_recv_response(Some(self.recv_response.min(left)))
                .timeout_recv_body(Some(left))
                .timeout_per_read(stall_after)
                .build()
                .call();
            let fresh = cursor.fresh;
            let outcome = match result {
                Ok(resp) if resp.status().is_success() => {
                    let reader = resp.into_body().into_reader();
                    let (polled, stalled) = match self.read_stream(reader, until, cursor, true) {
                        Ok(true) => return true,
                        // Its answer is over the limit: no use resuming.
                        _ if cursor.too_long.is_some() => return false,
                        Ok(false) => (cursor.stream_retry, false),
                        Err(e) => (false, is_read_stall(&e)),
                    };
                    if stalled {
                        crate::debug!(
                            "{}: the resumed answer to request {} stalled; resuming again",
                            self.shown,
                            until.id
                        );
                    }
                    resume::Outcome::Ended {
                        fresh: cursor.fresh > fresh,
                        polled,
                        stalled,
                    }
                }
                // New headers may help, once (as for a POST).
                Ok(resp) if matches!(resp.status().as_u16(), 401 | 403) => {
                    resume::Outcome::Unauthorized {
                        can_refresh: self.helper.is_some(),
                    }
                }
                // No resumption here (405, a lost session, …).
                Ok(_) => resume::Outcome::Refused,
                Err(e) => unanswered_get(&e),
            };
            plan.after(outcome);
        }
    }

    /// Reports one message; true if it is the response `until` waits for.
    pub(super) fn deliver(&self, text: String, until: Option<&Until>) -> bool {
        match jsonrpc::classify(text) {
            jsonrpc::Parsed::Message(m) => {
                let answer = until.filter(|u| m.id() == Some(u.id) && m.method().is_none());
                let mut m = m;
                if let Some(u) = answer {
                    if u.initialize {
                        let version = protocol_version(&String::from_utf8_lossy(&m.line()));
                        self.session.set_protocol_version(version);
                    }
                    if u.screen_tools {
                        m = self.screened(m);
                    }
                }
                self.emit(ServerEvent::Message(jsonrpc::Parsed::Message(m)));
                answer.is_some()
            }
            jsonrpc::Parsed::Invalid(i) if i.code == jsonrpc::PARSE_ERROR => {
                crate::warn!("{} sent something that is not JSON; skipped", self.shown);
                self.emit(ServerEvent::Garbage { head: None });
                false
            }
            parsed => {
                self.emit(ServerEvent::Message(parsed));
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A resuming GET whose server takes longer than the stall limit to
    /// send its headers ends with ureq's per-read timeout (a real socket,
    /// a limit of 100 ms), which counts as a stall. The sequence that
    /// follows is `resume.rs`'s
    /// `a_resumed_get_slow_to_send_its_headers_stalls_three_times_then_waits_for_them`.
    #[test]
    fn a_get_whose_headers_come_after_the_stall_limit_is_a_stall() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(0);
        let server = std::thread::spawn(move || {
            // Takes the request and says nothing until the test is over.
            let (_socket, _) = listener.accept().unwrap();
            let _ = done_rx.recv();
        });
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let started = Instant::now();
        let e = agent
            .get(&url)
            .config()
            .timeout_per_read(Some(Duration::from_millis(100)))
            .timeout_recv_response(Some(Duration::from_secs(30)))
            .build()
            .call()
            .expect_err("no headers came");
        drop(done_tx);
        server.join().unwrap();
        assert!(started.elapsed() < Duration::from_secs(30), "{e}");
        assert_eq!(
            unanswered_get(&e),
            resume::Outcome::Ended {
                fresh: false,
                polled: false,
                stalled: true
            },
            "{e:?}"
        );
        assert_eq!(
            unanswered_get(&ureq::Error::Timeout(ureq::Timeout::Connect)),
            resume::Outcome::Failed
        );
    }

    #[test]
    fn the_protocol_version_comes_from_the_initialize_result() {
        let line = r#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18"}}"#;
        assert_eq!(protocol_version(line).as_deref(), Some("2025-06-18"));
        assert_eq!(protocol_version(r#"{"id":1,"error":{}}"#), None);
        assert_eq!(
            protocol_version(r#"{"result":{"protocolVersio\u006e":"2026-07-28","x":[1]}}"#)
                .as_deref(),
            Some("2026-07-28")
        );
    }
}
