//! Publishing the session's state for `mcp-retry status`: noticing that
//! something changed, scheduling one write at most once a second, and
//! handing the snapshot to the `status-writer` thread.
//!
//! The file is out of date when a counter moves (`stats_dirty`) or when
//! the [`Headline`] (link, breaker, restarts, calls in flight, the
//! handshake) differs from
//! the last one seen; both only happen while handling an event or a timer.
//! Nothing here sets a timer otherwise: an idle proxy never wakes up to
//! publish. Builds no JSON and does no I/O (see `status.rs`).

#![forbid(unsafe_code)]

use std::time::Instant;

use crossbeam_channel::Sender;

use crate::policy::breaker::BreakerState;
use crate::status::{BreakerShown, Headline, Snapshot};

use super::Dispatcher;

impl Dispatcher {
    /// Publishes the session's state through `out` (see `status.rs`).
    pub fn with_status_output(mut self, out: Sender<Snapshot>) -> Dispatcher {
        self.reporting.status_to(out);
        self
    }

    /// The link, breaker and load as `status` shows them.
    pub(super) fn headline(&self) -> Headline {
        let (link, link_until) = self.link.shown();
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
            restarts: self.link.generation().saturating_sub(1),
            in_flight: self.calls.len() as u64,
            from_cache: self.instant.as_ref().is_some_and(|i| i.from_cache),
            ready_at: self.reporting.ready_at(),
        }
    }

    /// After an event or timer: schedules a publish if the headline moved.
    pub(super) fn status_check(&mut self) {
        if !self.reporting.publishing() {
            return;
        }
        let headline = self.headline();
        if let Some((at, timer)) = self.reporting.status_check(headline, self.now) {
            self.set_timer(at, timer);
        }
    }

    /// Something published changed: write it within a second (at most one
    /// write a second).
    pub(super) fn status_dirty(&mut self) {
        if let Some((at, timer)) = self.reporting.status_dirty(self.now) {
            self.set_timer(at, timer);
        }
    }

    /// `Timer::StatusPublish`: hands the snapshot to the writer.
    pub(super) fn on_status_due(&mut self, now: Instant) {
        if !self.reporting.publishing() {
            return;
        }
        let headline = self.headline();
        let message = self.link.trouble().or_else(|| self.instant_note());
        self.reporting
            .publish(headline, message, self.calls.stats(), now);
    }
}
