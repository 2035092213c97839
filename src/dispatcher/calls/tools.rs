//! What the calls know of the server's tools: the annotations of every
//! `tools/list` page that passes by (the client's or the proxy's own), the
//! fingerprint of the last complete listing (to tell the client when a
//! restarted server offers different tools), and the proxy's own listing
//! while calls wait for it to decide on a retry.
//!
//! The proxy's own request is an [`Action::ListTools`] the dispatcher sends;
//! the answer comes back as `learn_tools`, a failure as `tools_learned`.

#![forbid(unsafe_code)]

use std::collections::HashMap;

use crate::debug;
use crate::jsonrpc;
use crate::mcp::{Next, ToolsPager};
use crate::policy::canonical_json;
use crate::policy::dedup::fingerprint;
use crate::policy::gate;

use super::call::Phase;
use super::{Action, Calls, Ctx, LinkView};

/// What the calls need to know about the server's tools.
#[derive(Debug, Default)]
pub(super) struct ToolsKnowledge {
    pub annotations: HashMap<String, gate::Annotations>,
    /// A complete list has been seen since the last change.
    pub known: bool,
    /// Our own `tools/list` is in flight (or `deferred` until the server is
    /// ready).
    pub fetching: bool,
    pub deferred: bool,
    /// Fingerprints of the canonical tool entries of the listing being
    /// read, page by page (16 bytes a tool, restarted by a first page).
    pub pages: Vec<u128>,
    /// The sorted entry fingerprints of the last complete listing.
    pub fingerprint: Option<Vec<u128>>,
    /// The listing being fetched is the first after a restart: tell the
    /// client if it differs from the one before.
    pub compare_after_restart: bool,
    /// Where our own listing goes on.
    pub pager: ToolsPager,
}

impl ToolsKnowledge {
    /// Our listing died with its server: ask the next incarnation for the
    /// whole list once it is ready.
    pub fn restart_fetch(&mut self) {
        self.deferred = true;
        self.pages.clear();
        self.pager = ToolsPager::default();
    }
}

impl Calls {
    /// Whether nothing is known of the tools and nobody is asking.
    pub(in crate::dispatcher) fn tools_unknown(&self) -> bool {
        !self.tools.known && !self.tools.fetching
    }

    /// The server's tools changed: forget what we knew and flush the cache.
    pub(in crate::dispatcher) fn tools_changed(&mut self) {
        self.tools.known = false;
        self.cache.clear();
        debug!("the server's tools changed: cache flushed, annotations to be refreshed");
    }

    /// The proxy's listing was never delivered to the server: it is asked
    /// of the next incarnation.
    pub(in crate::dispatcher) fn restart_tools_fetch(&mut self) {
        self.tools.restart_fetch();
    }

    /// The server became ready: whether the tool list waits to be asked
    /// for (then it is the dispatcher's to ask, with `Action::ListTools`).
    pub(in crate::dispatcher) fn take_deferred_fetch(&mut self) -> bool {
        std::mem::take(&mut self.tools.deferred)
    }

    /// Whether the tool list waits for a server that is not ready.
    pub(in crate::dispatcher) fn tools_deferred(&self) -> bool {
        self.tools.deferred
    }

    /// A restarted server that announces `tools.listChanged` is ready: the
    /// client is told if its tools differ from the last server's.
    pub(in crate::dispatcher) fn compare_tools_after_restart(
        &mut self,
        link: LinkView,
        out: &mut Vec<Action>,
    ) {
        self.tools.compare_after_restart = true;
        self.fetch_tools(link, out);
    }

    /// Tool entries of the listing being read.
    #[cfg(test)]
    pub(in crate::dispatcher) fn tool_pages_held(&self) -> usize {
        self.tools.pages.len()
    }

    /// Asks the server for its tool list (all pages) to learn annotations:
    /// now if the link is ready, else once the restarted server is.
    pub(in crate::dispatcher) fn fetch_tools(&mut self, link: LinkView, out: &mut Vec<Action>) {
        if self.tools.fetching {
            return;
        }
        self.tools.fetching = true;
        self.tools.pages.clear();
        self.tools.pager = ToolsPager::default();
        if link.ready {
            out.push(Action::ListTools { cursor: None });
        } else {
            self.tools.deferred = true;
        }
    }

    /// A `tools/list` page passed by (ours or the client's).
    /// `first` when the client asked for the first page: a listing starts
    /// over (a client that reads only first pages keeps no more than one).
    pub(in crate::dispatcher) fn learn_tools(
        &mut self,
        result: &str,
        ours: bool,
        first: bool,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) {
        match gate::parse_tools_list(result) {
            Ok(page) => {
                for (name, a) in &page.tools {
                    self.tools.annotations.insert(name.clone(), *a);
                }
                if first {
                    self.tools.pages.clear();
                }
                let keys = self.fingerprint_keys;
                self.tools.pages.extend(
                    canonical_tools(result)
                        .iter()
                        .map(|t| fingerprint(keys, &[t])),
                );
                let next = match ours {
                    true => self.tools.pager.next(page.next_cursor.as_deref()),
                    false if page.next_cursor.is_some() => return,
                    false => Next::Last,
                };
                match next {
                    Next::Page => {
                        let cursor = self.tools.pager.cursor().map(str::to_owned);
                        out.push(Action::ListTools { cursor });
                    }
                    Next::Last => {
                        self.listing_complete(out);
                        self.tools_learned(true, ctx, out)
                    }
                    Next::Endless => {
                        crate::warn!(
                            "the server's tools/list pages without end (over {} pages, or a cursor again); the tools not listed so far stay unknown",
                            ToolsPager::MAX_PAGES
                        );
                        self.tools.pages.clear();
                        self.tools_learned(false, ctx, out)
                    }
                }
            }
            Err(e) => {
                debug!("could not read the server's tool list: {e}");
                if ours {
                    self.tools_learned(false, ctx, out);
                }
            }
        }
    }

    /// A complete listing was read: remember its fingerprint, and after a
    /// restart tell the client when the tools differ.
    fn listing_complete(&mut self, out: &mut Vec<Action>) {
        let mut entries = std::mem::take(&mut self.tools.pages);
        entries.sort_unstable();
        let before = self.tools.fingerprint.replace(entries.clone());
        if std::mem::take(&mut self.tools.compare_after_restart)
            && before.is_some_and(|b| b != entries)
        {
            crate::info!("the restarted server offers different tools; telling the client");
            out.push(Action::Notify(jsonrpc::notification_line(
                "notifications/tools/list_changed",
                None,
            )));
        }
    }

    /// The tool list is complete (or could not be had): decide parked calls.
    pub(in crate::dispatcher) fn tools_learned(
        &mut self,
        complete: bool,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) {
        self.tools.fetching = false;
        self.tools.deferred = false;
        if !complete {
            self.tools.compare_after_restart = false;
        }
        // Even a failed fetch ends the wait: unknown then means unsafe.
        self.tools.known = true;
        if complete {
            debug!(
                "learned the annotations of {} tool(s)",
                self.tools.annotations.len()
            );
        }
        let mut parked: Vec<u64> = self
            .calls
            .iter()
            .filter(|(_, c)| matches!(c.phase, Phase::Parked(_)))
            .map(|(id, _)| *id)
            .collect();
        parked.sort();
        for id in parked {
            if let Some(f) = self.calls.get_mut(&id).and_then(|c| c.take_parked()) {
                self.decide(id, f, ctx, out);
            }
        }
    }
}

/// The canonical text of each tool in a `tools/list` result.
fn canonical_tools(result: &str) -> Vec<String> {
    let Some(tools) = jsonrpc::RawObject::parse(result).and_then(|r| r.get("tools")) else {
        return Vec::new();
    };
    serde_json::from_str::<Vec<&serde_json::value::RawValue>>(tools.get())
        .map(|ts| {
            ts.iter()
                .filter_map(|t| canonical_json(t.get()).ok())
                .collect()
        })
        .unwrap_or_default()
}
