//! Publishing the session's state for `mcp-retry status`: noticing that
//! something changed, scheduling one write at most once a second, and
//! handing the snapshot to the `status-writer` thread.
//!
//! The file is out of date when a counter moves (`stats_dirty`) or when
//! the [`Headline`] (link, breaker, restarts, calls in flight) differs from
//! the last one seen; both only happen while handling an event or a timer.
//! Nothing here sets a timer otherwise: an idle proxy never wakes up to
//! publish. Builds no JSON and does no I/O (see `status.rs`).

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use crate::jsonrpc::RawObject;
use crate::policy::breaker::BreakerState;
use crate::status::{BreakerShown, Headline, LinkState, Publisher, Snapshot};

use super::link::Link;
use super::{Dispatcher, Reason, Timer};

/// Every reason a proxy error may carry, for the failure counters (a
/// reason the table does not know is counted as `other`).
const REASONS: [Reason; 13] = [
    Reason::ServerExited,
    Reason::ServerUnavailable,
    Reason::Overloaded,
    Reason::CircuitOpen,
    Reason::RetriesExhausted,
    Reason::Timeout,
    Reason::NotRetriedUnsafe,
    Reason::RetryBudgetExhausted,
    Reason::DeadlineExceeded,
    Reason::ResponseTooLarge,
    Reason::InvalidResponse,
    Reason::TransportError,
    Reason::Rejected,
];

/// The reason counted for an error object (raw JSON) a call ended with:
/// the proxy's `data.reason`, else `server_error`.
pub(super) fn failure_reason(error: &RawObject) -> &'static str {
    let data = error.get("data").and_then(|d| RawObject::parse(d.get()));
    let ours = data
        .as_ref()
        .and_then(|d| d.string("source"))
        .is_some_and(|s| s == "mcp-retry");
    if !ours {
        return "server_error";
    }
    let reason = data.as_ref().and_then(|d| d.string("reason"));
    REASONS
        .iter()
        .map(|r| r.as_str())
        .find(|r| Some(*r) == reason.as_deref())
        .unwrap_or("other")
}

impl Dispatcher {
    /// Publishes the session's state through `out` (see `status.rs`).
    pub fn with_status_output(mut self, out: Sender<Snapshot>) -> Dispatcher {
        self.status = Some(Publisher::new(out));
        self
    }

    /// The link, breaker and load as `status` shows them.
    pub(super) fn headline(&self) -> Headline {
        let (link, link_until) = match &self.link {
            Link::Up(_) if self.link_ready() => (LinkState::Up, None),
            Link::Up(_) if self.generation <= 1 => (LinkState::Starting, None),
            Link::Up(_) => (LinkState::Restarting, None),
            Link::Outage => (LinkState::Restarting, self.recovery.next_probe()),
            Link::Down { .. } => (LinkState::Down, None),
        };
        let (breaker, breaker_until) = match self.calls.breaker_state() {
            BreakerState::Closed => (BreakerShown::Closed, None),
            BreakerState::Open { until } => (BreakerShown::Open, Some(*until)),
            BreakerState::HalfOpen { .. } => (BreakerShown::HalfOpen, None),
        };
        Headline {
            link,
            link_until,
            breaker,
            breaker_until,
            restarts: self.generation.saturating_sub(1),
            in_flight: self.calls.len() as u64,
        }
    }

    /// After an event or timer: schedules a publish if the headline moved.
    pub(super) fn status_check(&mut self) {
        if self.status.is_none() {
            return;
        }
        let headline = self.headline();
        let publisher = self.status.as_mut().expect("checked");
        if publisher.last_headline != Some(headline) {
            publisher.last_headline = Some(headline);
            self.status_dirty();
        }
    }

    /// Something published changed: write it within a second (at most one
    /// write a second).
    pub(super) fn status_dirty(&mut self) {
        let now = self.now;
        let Some(publisher) = self.status.as_mut() else {
            return;
        };
        if !publisher.pending {
            publisher.pending = true;
            let at = publisher.due(now);
            self.set_timer(at, Timer::StatusPublish);
        }
    }

    /// `Timer::StatusPublish`: hands the snapshot to the writer.
    pub(super) fn publish_status(&mut self, now: Instant) {
        if self.status.is_none() {
            return;
        }
        let headline = self.headline();
        let message = match (&self.link, self.recovery.outage()) {
            (Link::Down { message, .. }, _) => Some(message.clone()),
            (_, Some(o)) => Some(o.message.clone()),
            (_, None) => None,
        };
        let publisher = self.status.as_mut().expect("checked");
        publisher.last_headline = Some(headline);
        if !publisher.send(headline, message, self.calls.stats(), now) {
            crate::debug!("the status writer is gone; no more status updates");
            self.status = None;
        }
    }

    /// A call ended, `took` after it arrived (`None` when no attempt was
    /// sent); `error` is the error object (raw JSON) it failed with.
    pub(super) fn note_call_end(
        &mut self,
        tool: &str,
        took: Option<Duration>,
        error: Option<&str>,
    ) {
        let now = self.now;
        let Some(publisher) = self.status.as_mut() else {
            return;
        };
        let parsed = error.map(RawObject::parse);
        let failure = parsed.as_ref().map(|e| match e {
            Some(e) => (failure_reason(e), e.string("message").unwrap_or_default()),
            None => ("server_error", String::new()),
        });
        publisher.call_ended(
            tool,
            took,
            failure.as_ref().map(|(r, m)| (*r, m.as_str())),
            now,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatcher::proxy_error;

    #[test]
    fn failures_are_counted_by_the_proxy_s_reason_or_as_server_errors() {
        let reason = |e: &str| failure_reason(&RawObject::parse(e).unwrap());
        let e = proxy_error(Reason::CircuitOpen, "open", &[("attempts", "1".into())]);
        assert_eq!(reason(&e), "circuit_open");
        assert_eq!(
            reason(r#"{"code":-32000,"message":"busy"}"#),
            "server_error"
        );
        // A server cannot choose the label.
        assert_eq!(
            reason(r#"{"code":1,"message":"x","data":{"source":"mcp-retry","reason":"a\"b"}}"#),
            "other"
        );
        for r in REASONS {
            assert_eq!(reason(&proxy_error(r, "m", &[])), r.as_str());
        }
    }
}
