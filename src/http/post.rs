//! One message posted: its headers chosen by era, the POST made, and what
//! came of it turned into events: the answer read (`stream.rs`), or the
//! failure classified (`classify.rs`) and reported as `Unsent`, `Refused`
//! or `Failed`, never as a made-up answer of the server's. Knows nothing
//! of the dispatcher's policies.

#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::downstream::{Failure, Heal, OutKind, Outgoing, ServerEvent};
use crate::jsonrpc::{self, RawObject};

use super::classify::Class;
use super::conn::Exchange;
use super::headers::header;
use super::order::{Turn, TurnDone};
use super::stream::Until;
use super::{classify, modern, Line, Shared};

/// How long such a POST may take in all, plus a second per MiB it carries
/// (an answer to `sampling/createMessage` may hold an image): the server
/// only acknowledges it. See [`note_timeout`].
pub(super) const NOTE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a 2025-era cancel's POST may take, and so delay closing the
/// call's stream: a server slow to take the cancel does not keep it open.
pub(super) const CANCEL_GRACE: Duration = Duration::from_secs(1);

/// How much of an error answer's body is read for its message.
pub(super) const ERROR_BODY_LIMIT: u64 = 64 * 1024;

/// One message being posted.
pub(super) struct Post<'a> {
    /// What it is (a request's 2026-07-28 version, `Mcp-Name`, envelope
    /// and a call's argument scalars included: `Outgoing::modern`), as the
    /// dispatcher said; its line is never parsed.
    pub(super) out: &'a Outgoing,
    pub(super) method: Option<&'a str>,
    /// A request's id (None for a notification or a response), and as it
    /// is written in the line, which is how the server's answer names it.
    pub(super) request_id: Option<u64>,
    pub(super) id_text: Option<String>,
    /// The 2026-07-28 version it is sent under (none: the 2025 era).
    pub(super) modern: Option<String>,
    pub(super) exchange: Arc<Exchange>,
    /// Its place in the order lines start in.
    pub(super) turn: Turn,
}

impl Post<'_> {
    pub(super) fn is(&self, method: &str) -> bool {
        self.method == Some(method)
    }

    /// What its answer is read until, and how.
    pub(super) fn until(&self) -> Option<Until<'_>> {
        Some(Until {
            id: self.id_text.as_deref()?,
            initialize: self.is("initialize"),
            screen_tools: self.modern.is_some() && self.is("tools/list"),
        })
    }
}

/// How long a POST of `len` bytes that is not a request may take in all:
/// [`NOTE_TIMEOUT`], and a second more per MiB, so that a large answer to a
/// server's request is not cut off on a slow link while a server that
/// takes nothing still frees the thread.
pub(super) fn note_timeout(len: usize) -> Duration {
    NOTE_TIMEOUT + Duration::from_secs((len >> 20) as u64)
}

/// The message of an error answer's body: its JSON-RPC `error.message`,
/// else its first line of text (at most 200 characters).
pub(super) fn server_message(body: &str) -> Option<String> {
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(body) {
        if let Some(m) = v["error"]["message"].as_str() {
            return Some(m.to_owned());
        }
    }
    let line = body.lines().map(str::trim).find(|l| !l.is_empty())?;
    Some(line.chars().take(200).collect())
}

impl Shared {
    /// Posts one line and reports what came of it.
    pub(super) fn post(self: &Arc<Shared>, line: Line) {
        // Lines start in the order they were sent: this one once the
        // requests before it were written and the notifications before it
        // acknowledged (see `Order`). Released, at the latest, on return.
        // A cancel of a request already being posted need not wait for
        // the lines before it: its request went first.
        let target_live = match line.out.kind {
            OutKind::Cancel { target } => self.exchanges.is_live(target),
            _ => false,
        };
        let turn = match target_live {
            true => Turn::now(&self.order, line.seq),
            false => Turn::wait(&self.order, line.seq),
        };
        let _done = TurnDone(turn.clone());
        let out = &line.out;
        if self.is_closed() {
            return;
        }
        // What it is, and a request's era, the dispatcher said.
        let method = out.method();
        let request_id = out.request_id();
        let modern = self.session.era(
            out.modern().map(|m| m.version.clone()),
            method == Some("initialize"),
            request_id.is_some(),
        );
        let post = Post {
            out,
            method,
            request_id,
            id_text: request_id.map(|id| id.to_string()),
            modern,
            exchange: Exchange::new(),
            turn: turn.clone(),
        };
        if post.request_id.is_some() {
            // A request lets the next line start once it is written.
            let turn = turn.clone();
            post.exchange.when_written(move || turn.release());
        }
        if let Some(id) = post.request_id {
            let modern = post.modern.is_some();
            if !self.exchanges.start(id, post.exchange.clone(), modern) {
                crate::debug!("request {id} was cancelled before it was sent");
                return;
            }
            self.requests.fetch_add(1, Ordering::SeqCst);
        }
        post.exchange.run(|| self.post_counted(&post));
        if let Some(id) = post.request_id {
            self.exchanges.end(id);
            self.requests.fetch_sub(1, Ordering::SeqCst);
        }
        if let OutKind::Cancel { target } = out.kind {
            // 2025 era: the cancel was posted; the stream goes too.
            self.exchanges.close(target);
        }
    }

    pub(super) fn post_counted(self: &Arc<Shared>, post: &Post) {
        if post.modern.is_some() {
            let method = post.method.unwrap_or_default();
            if let Some(why) = modern::invalid_header("Mcp-Method", method) {
                // This request alone: nothing is sent, the connection and
                // the other requests go on.
                return self.invalid(post, why);
            }
        }
        let mut refreshed = false;
        let mut relisted = false;
        loop {
            let headers = match &post.modern {
                Some(version) => self.modern_headers(post, version),
                None if post.is("initialize") => {
                    self.session.set_id(None);
                    Vec::new()
                }
                None => self.session_headers(),
            };
            let sent_session = headers.iter().any(|(n, _)| n == "Mcp-Session-Id");
            let req = self
                .agent
                .post(&self.url)
                .header("Accept", "application/json, text/event-stream")
                .header("Content-Type", "application/json");
            let req = self.headed(req, headers, refreshed);
            // A `subscriptions/listen` stream stays open as long as it is
            // wanted: no deadline for its body.
            let recv_body = (!post.is("subscriptions/listen")).then_some(self.recv_body);
            // What is not a request is only acknowledged (202); a cancel
            // closes its request's stream once it is over.
            let global = match post.out.kind {
                OutKind::Request { .. } => None,
                OutKind::Cancel { .. } => Some(CANCEL_GRACE),
                _ => Some(note_timeout(post.out.bytes.len())),
            };
            post.exchange.begin_request(post.out.bytes.len());
            let result = req
                .config()
                .timeout_recv_response(Some(self.recv_response))
                .timeout_recv_body(recv_body)
                .timeout_global(global)
                .build()
                .send(&post.out.bytes[..]);
            let resp = match result {
                Ok(resp) => resp,
                Err(e) => {
                    let class = classify::of_error(&e, post.exchange.request_written());
                    if class == Class::NeverSent && classify::heal(&e) == Heal::Fix {
                        self.needs_fix.store(true, Ordering::SeqCst);
                    }
                    let mut why = self.scrub(&e.to_string());
                    if classify::unknown_host(&e) {
                        why.push_str(": the host name does not exist; check the url");
                    }
                    return self.failed(post, class, &why, None, "");
                }
            };
            let status = resp.status().as_u16();
            if (200..300).contains(&status) {
                return self.answered(post, resp);
            }
            let retry_after = header(&resp, "retry-after");
            let body = resp
                .into_body()
                .with_config()
                .limit(ERROR_BODY_LIMIT)
                .read_to_string()
                .unwrap_or_default();
            let answer = classify::Answer {
                status,
                retry_after: retry_after.as_deref(),
                sent_session,
                body: &body,
                modern: post.modern.is_some(),
            };
            let class = classify::of_status(&answer, SystemTime::now());
            if class == Class::Unauthorized && self.helper.is_some() && !refreshed {
                crate::info!(
                    "{} answered {}; running headers_helper again",
                    self.shown,
                    classify::status_line(status)
                );
                refreshed = true;
                continue;
            }
            if class == Class::HeaderMismatch && post.is("tools/call") && !relisted {
                relisted = true;
                crate::info!(
                    "{} answered a header mismatch; reading its tools again",
                    self.shown
                );
                if self.relist_tools(post) {
                    continue;
                }
            }
            let why = match server_message(&body) {
                Some(msg) => format!("{}: {}", classify::status_line(status), self.scrub(&msg)),
                None => classify::status_line(status),
            };
            return self.failed(post, class, &why, Some(status), &body);
        }
    }

    /// A POST that did not get its answer. `body`: the answer's, if any.
    pub(super) fn failed(
        &self,
        post: &Post,
        class: Class,
        why: &str,
        status: Option<u16>,
        body: &str,
    ) {
        if post.exchange.is_closed() {
            // Cancelled: its stream was closed on purpose.
            return crate::debug!(
                "{}: the stream of a cancelled request was closed",
                self.shown
            );
        }
        if matches!(post.out.kind, OutKind::Cancel { .. }) && class == Class::NeverSent {
            // A cancel is best effort, and its request's stream is closed
            // anyway: one that could not be sent within `CANCEL_GRACE`
            // (a new connection slow to set up) does not end the session.
            return crate::warn!("{}: a cancel was not sent: {why}", self.shown);
        }
        let others = self.requests.load(Ordering::SeqCst) > usize::from(post.request_id.is_some());
        let handshake = post.is("initialize") && post.modern.is_none();
        match class {
            // A server that cannot start a session (5xx, 429, a broken
            // connection) is a failed start: the link restarts it with its
            // backoff while the client's `initialize` waits. A session not
            // started holds nothing that could have run twice.
            Class::ServerError | Class::Refused(_) | Class::Broken if handshake => {
                self.emit(ServerEvent::Unsent {
                    lines: vec![post.out.clone()],
                    why: format!("the server could not start a session ({why})"),
                });
                self.gone(&format!("could not start a session ({why})"), others);
            }
            Class::NeverSent => {
                self.emit(ServerEvent::Unsent {
                    lines: vec![post.out.clone()],
                    why: format!("the server could not be reached ({why})"),
                });
                self.gone(&format!("could not be reached ({why})"), others);
            }
            // 2026-07-28 has no session: a broken stream loses that one
            // request (it may have run), not the connection.
            // A broken stream loses that one request (it may have run), not
            // the session: the other requests in flight go on. A server
            // that really went away answers the next POST with a refused
            // connection or a 404 for the session. A notification or a
            // response the server was slow to acknowledge is only logged.
            Class::Broken => self.report_no_answer(post, why, status, true),
            Class::SessionLost => {
                self.session.set_id(None);
                self.emit(ServerEvent::Unsent {
                    lines: vec![post.out.clone()],
                    why: format!(
                        "the server rejected the session after the request was delivered ({why}); it goes again on a new session"
                    ),
                });
                self.gone(&format!("ended the session ({why})"), others);
            }
            Class::Refused(retry_after) => self.emit(ServerEvent::Refused {
                lines: vec![post.out.clone()],
                why: format!("the server answered {why}"),
                retry_after,
            }),
            Class::Answered | Class::HeaderMismatch => {
                // The server's own error, scrubbed of header values as any
                // text of its (still JSON: else ours instead).
                let error = RawObject::parse(body)
                    .and_then(|b| b.get("error").map(|e| self.scrub(e.get())))
                    .filter(|e| serde_json::from_str::<&serde_json::value::RawValue>(e).is_ok());
                match (&post.id_text, error) {
                    (Some(id), Some(error)) => {
                        let line = jsonrpc::error_response_line(id, &error);
                        self.deliver(String::from_utf8_lossy(&line).trim_end().to_owned(), None);
                    }
                    _ => self.report_no_answer(post, why, status, false),
                }
            }
            Class::ServerError => self.report_no_answer(post, why, status, true),
            Class::Unauthorized | Class::Rejected => {
                self.report_no_answer(post, why, status, false)
            }
        }
    }

    /// Request `post` cannot be sent as the client wrote it (`why`).
    pub(super) fn invalid(&self, post: &Post, why: String) {
        crate::warn!("{}: not sent: {why}", self.shown);
        let Some(id) = post.request_id else {
            return;
        };
        self.emit(ServerEvent::Failed {
            id,
            failure: Failure {
                message: why,
                status: None,
                may_have_run: false,
                invalid: true,
            },
        });
    }

    /// Reports that request `post` gets no answer, and what happened (a
    /// notification is only logged): `ran`, it may have run; else it did
    /// not. The dispatcher answers it with the proxy's error.
    pub(super) fn report_no_answer(&self, post: &Post, why: &str, status: Option<u16>, ran: bool) {
        let Some(id) = post.request_id else {
            let what = if post.method.is_some() {
                "a notification"
            } else {
                "an answer to its request"
            };
            return crate::warn!("{} did not take {what}: {why}", self.shown);
        };
        let message = match status {
            Some(_) => format!("the MCP server {} answered {why}", self.shown),
            None => format!("the MCP server {}: {why}", self.shown),
        };
        self.emit(ServerEvent::Failed {
            id,
            failure: Failure {
                message,
                status,
                may_have_run: ran,
                invalid: false,
            },
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_messages_come_from_the_json_rpc_error_or_the_first_line() {
        let body = r#"{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"}}"#;
        assert_eq!(server_message(body).as_deref(), Some("Session not found"));
        assert_eq!(
            server_message("\n  upstream down \nmore").as_deref(),
            Some("upstream down")
        );
        assert_eq!(server_message(""), None);
    }

    #[test]
    fn what_is_not_a_request_has_two_seconds_and_one_more_per_mib() {
        assert_eq!(note_timeout(0), NOTE_TIMEOUT);
        assert_eq!(note_timeout((1 << 20) - 1), NOTE_TIMEOUT);
        assert_eq!(note_timeout(5 << 20), NOTE_TIMEOUT + Duration::from_secs(5));
    }
}
