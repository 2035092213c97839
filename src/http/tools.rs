//! 2026-07-28 tool screening: the `x-mcp-header` annotations learned from
//! the `tools/list` answers passing by (a tool with invalid ones is left
//! out), and the tools read again by a request of our own after a
//! `HeaderMismatch`. Knows nothing of sessions.

#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;

use crate::jsonrpc::{self, Message, RawObject};
use crate::mcp::{Next, ToolsPager};

use super::conn::Exchange;
use super::headers::header;
use super::post::Post;
use super::{modern, sse, Shared};

impl Shared {
    /// Learns the tools of a screened `tools/list` page.
    pub(super) fn learn_tools(&self, screened: &modern::Screened) {
        let mut known = self.tool_headers.lock();
        for (name, map) in &screened.tools {
            known.insert(name.clone(), map.clone());
        }
        for (name, why) in &screened.dropped {
            known.remove(name);
            let what = format!(
                "{} lists tool {name:?} with an invalid x-mcp-header ({why}); left out of tools/list",
                self.shown
            );
            if self.warned_tools.lock().insert(name.clone()) {
                crate::warn!("{what}");
            } else {
                crate::debug!("{what}");
            }
        }
    }

    /// 2026-07-28, after a header mismatch: reads every page of the
    /// server's `tools/list` (with the envelope of the `post` that was
    /// refused) and learns the tools' `x-mcp-header` annotations. Says
    /// whether that worked. Nothing of it reaches the client.
    pub(super) fn relist_tools(&self, post: &Post) -> bool {
        let (Some(version), Some(envelope)) =
            (&post.modern, post.out.modern().map(|m| &m.envelope))
        else {
            return false;
        };
        let mut pager = ToolsPager::default();
        loop {
            let n = self.own_requests.fetch_add(1, Ordering::SeqCst) + 1;
            let id = format!("\"mcp-retry-tools-{n}\"");
            let params = pager.params(Some(envelope));
            let line = jsonrpc::request_line(&id, "tools/list", Some(&params));
            let headers = modern::standard_headers(version, "tools/list", None);
            let Some(answer) = self.own_request(&line, &id, headers, &post.exchange) else {
                return false;
            };
            let Some(result) = answer.result() else {
                return false;
            };
            let Some(page) = RawObject::parse(result) else {
                return false;
            };
            self.learn_tools(&modern::screen_tools(result));
            match pager.next(page.string("nextCursor").as_deref()) {
                Next::Page => {}
                Next::Last => return true,
                Next::Endless => return false,
            }
        }
    }

    /// Posts a request of our own and reads its response (JSON or SSE),
    /// reporting nothing.
    pub(super) fn own_request(
        &self,
        line: &[u8],
        id: &str,
        headers: Vec<(String, String)>,
        exchange: &Exchange,
    ) -> Option<Message> {
        let req = self
            .agent
            .post(&self.url)
            .header("Accept", "application/json, text/event-stream")
            .header("Content-Type", "application/json");
        exchange.begin_request(line.len());
        let resp = self
            .headed(req, headers, false)
            .config()
            .timeout_recv_response(Some(self.recv_response))
            .timeout_recv_body(Some(self.recv_body))
            .build()
            .send(line)
            .ok()
            .filter(|r| r.status().is_success())?;
        let kind = header(&resp, "content-type").unwrap_or_default();
        let is_answer = |m: &Message| m.id() == Some(id) && m.method().is_none();
        if kind.to_ascii_lowercase().starts_with("text/event-stream") {
            let reader = resp.into_body().into_reader();
            self.read_events(reader, |_, items| {
                items.into_iter().find_map(|item| match item {
                    sse::Item::Event(e) => Message::reparse(e.data).filter(is_answer),
                    sse::Item::TooLong(_) => None,
                })
            })
            .ok()
            .flatten()
        } else {
            let limit = self.max_message_bytes as u64;
            let text = resp.into_body().with_config().limit(limit).read_to_string();
            Message::reparse(text.ok()?).filter(is_answer)
        }
    }

    /// A 2026-07-28 `tools/list` response with the tools whose
    /// `x-mcp-header` annotations are invalid left out (the others'
    /// annotations are learned).
    pub(super) fn screened(&self, m: Message) -> Message {
        let Some(result) = m.result() else {
            return m;
        };
        let screened = modern::screen_tools(result);
        self.learn_tools(&screened);
        let (Some(result), Some(id)) = (&screened.result, m.id()) else {
            return m;
        };
        let line = jsonrpc::response_line(id, result);
        let text = String::from_utf8_lossy(&line).trim_end().to_owned();
        Message::reparse(text).unwrap_or(m)
    }
}
