//! The dispatcher's timers: every deadline as data ([`Timer`], its
//! reason), in one min-heap the loop sleeps on. Deadlines of attempts that
//! are over are pruned when the heap has doubled (which are over, the
//! caller says). Knows nothing of what a timer does when it fires.

#![forbid(unsafe_code)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

use super::calls::CallTimer;

/// A deadline and the reason it exists.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Timer {
    /// Shutdown: the transport's stop sequence should be over by now; a
    /// backstop, so that the proxy exits even if the server is never
    /// reported gone.
    ShutdownGiveUp,
    /// A deadline of a `tools/call` (`calls.rs`).
    Call(CallTimer),
    /// Time to write the stats file.
    StatsFlush,
    /// Time to hand the status snapshot to its writer.
    StatusPublish,
    /// Start the server again (valid for the newest `seq` only).
    Restart { seq: u64 },
    /// The replayed `initialize` of incarnation `generation` must be answered.
    ReplayTimeout { generation: u64 },
    /// A queued item waited `call_timeout` for the server.
    QueueExpired { seq: u64 },
    /// The client's `initialize`, sent as downstream request `down` before
    /// the session's first handshake, must be answered by now.
    FirstInitialize { down: u64 },
    /// The ramp releasing what waited may have stalled.
    RampStall,
    /// After the handshake: list the tools if nobody has.
    LearnTools,
    /// The server did not answer the client's `initialize` within
    /// `instant::GRACE`: the cached answer is given.
    InstantGrace,
    /// The proxy's own `tools/list` request `down` must be answered by now.
    ToolsListTimeout { down: u64 },
    /// The proxy's own list request `down` (the handshake cache's) must be
    /// answered by now.
    ListingTimeout { down: u64 },
    /// Line number `line` over `max_message_bytes` of incarnation
    /// `generation` must have ended by now.
    OverlongLine { generation: u64, line: u64 },
    /// Time to hand the OpenTelemetry counters to the exporter.
    OtelFlush,
}

/// Below this many timers the heap is never pruned.
pub(super) const MIN_TIMERS_TO_PRUNE: usize = 1024;

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct TimerEntry {
    pub(super) at: Instant,
    seq: u64,
    pub(super) timer: Timer,
}

/// Every timer set and not fired yet, earliest first.
#[derive(Default)]
pub(super) struct Timers {
    heap: BinaryHeap<Reverse<TimerEntry>>,
    seq: u64,
    /// Timers left by the last pruning.
    kept: usize,
}

impl Timers {
    /// Sets `timer` for `at` (timers set for the same time fire in the
    /// order set).
    pub(super) fn set(&mut self, at: Instant, timer: Timer) {
        self.seq += 1;
        self.heap.push(Reverse(TimerEntry {
            at,
            seq: self.seq,
            timer,
        }));
    }

    /// The heap has doubled since it was last pruned.
    pub(super) fn due_for_pruning(&self) -> bool {
        self.heap.len() >= 2 * self.kept.max(MIN_TIMERS_TO_PRUNE)
    }

    /// Keeps the timers `keep` says may still matter.
    pub(super) fn prune(&mut self, mut keep: impl FnMut(&Timer) -> bool) {
        self.heap.retain(|Reverse(t)| keep(&t.timer));
        self.kept = self.heap.len();
    }

    /// Drops every timer equal to `timer`.
    pub(super) fn cancel(&mut self, timer: &Timer) {
        self.heap.retain(|Reverse(t)| t.timer != *timer);
    }

    /// When the earliest timer is due.
    pub(super) fn next_at(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse(t)| t.at)
    }

    /// The earliest timer, if it is due at `now`: it leaves the heap.
    pub(super) fn pop_due(&mut self, now: Instant) -> Option<Timer> {
        if self.next_at()? > now {
            return None;
        }
        self.heap.pop().map(|Reverse(t)| t.timer)
    }

    #[cfg(test)]
    pub(super) fn peek(&self) -> Option<&Reverse<TimerEntry>> {
        self.heap.peek()
    }

    #[cfg(test)]
    pub(super) fn iter(&self) -> impl Iterator<Item = &Reverse<TimerEntry>> {
        self.heap.iter()
    }

    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timers_fire_earliest_first_and_in_the_order_set_at_one_time() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(1);
        let mut t = Timers::default();
        t.set(later, Timer::StatsFlush);
        t.set(t0, Timer::OtelFlush);
        t.set(t0, Timer::RampStall);
        assert_eq!(t.next_at(), Some(t0));
        assert_eq!(t.pop_due(t0), Some(Timer::OtelFlush));
        assert_eq!(t.pop_due(t0), Some(Timer::RampStall));
        assert_eq!(t.pop_due(t0), None, "not due yet");
        assert_eq!(t.pop_due(later), Some(Timer::StatsFlush));
        assert_eq!(t.next_at(), None);
    }

    #[test]
    fn pruning_keeps_what_may_matter_and_waits_for_the_heap_to_double() {
        let t0 = Instant::now();
        let mut t = Timers::default();
        for line in 0..MIN_TIMERS_TO_PRUNE as u64 {
            t.set(
                t0,
                Timer::OverlongLine {
                    generation: 1,
                    line,
                },
            );
        }
        assert!(!t.due_for_pruning());
        t.set(t0, Timer::StatsFlush);
        t.cancel(&Timer::StatsFlush);
        for line in 0..MIN_TIMERS_TO_PRUNE as u64 {
            t.set(
                t0,
                Timer::OverlongLine {
                    generation: 2,
                    line,
                },
            );
        }
        assert!(t.due_for_pruning());
        t.prune(|timer| matches!(timer, Timer::OverlongLine { generation: 2, .. }));
        assert_eq!(t.len(), MIN_TIMERS_TO_PRUNE);
        assert!(!t.due_for_pruning());
    }
}
