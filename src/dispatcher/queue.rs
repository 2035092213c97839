//! What waits for the server while it is not ready ([`Queue`]): the items
//! in order, with their numbers and since when they wait, and the ramp
//! (`policy::ramp`) that releases them to a server back from an outage.
//! Knows nothing of what an item is for: the dispatcher sends, answers or
//! drops what it takes out, and sets the timers it is told of.

#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::time::Instant;

use crate::policy::ramp::{self, Ramp};

use super::link::Queued;

/// Most items waiting for a restarting server.
pub(super) const QUEUE_LIMIT: usize = 1000;

/// Traffic waiting for a (re)starting server, oldest first.
pub(super) struct Queue {
    items: VecDeque<(u64, Instant, Queued)>,
    seq: u64,
    /// How fast what waited is released when the server is back.
    ramp: Ramp,
}

impl Queue {
    pub(super) fn new() -> Queue {
        Queue {
            items: VecDeque::new(),
            seq: 0,
            ramp: Ramp::new(),
        }
    }

    /// Puts `item` at the end, waiting since `since`; its number, or
    /// `None` when the queue is full.
    pub(super) fn push(&mut self, item: Queued, since: Instant) -> Option<u64> {
        if self.items.len() >= QUEUE_LIMIT {
            return None;
        }
        self.seq += 1;
        self.items.push_back((self.seq, since, item));
        Some(self.seq)
    }

    /// Takes item `seq` out, with since when it waited.
    pub(super) fn take(&mut self, seq: u64) -> Option<(Instant, Queued)> {
        let i = self.items.iter().position(|(s, ..)| *s == seq)?;
        self.items.remove(i).map(|(_, at, q)| (at, q))
    }

    /// Everything, in order: nothing will be sent any more.
    pub(super) fn drain(&mut self) -> Vec<(u64, Instant, Queued)> {
        self.items.drain(..).collect()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The items, in order.
    pub(super) fn items(&self) -> impl Iterator<Item = &Queued> {
        self.items.iter().map(|(_, _, item)| item)
    }

    /// The items' numbers, in order.
    pub(super) fn seqs(&self) -> Vec<u64> {
        self.items.iter().map(|(s, ..)| *s).collect()
    }

    /// The server is back from an outage: what waited goes in a ramp.
    pub(super) fn begin_ramp(&mut self, now: Instant) {
        if !self.items.is_empty() {
            self.ramp.begin(now);
        }
    }

    /// The first item, if the ramp has room for it (a notification waits
    /// only for what is before it).
    pub(super) fn pop_releasable(&mut self) -> Option<(u64, Queued)> {
        let (_, _, item) = self.items.front()?;
        if !matches!(item, Queued::Notification(_)) && !self.ramp.room() {
            return None;
        }
        self.items.pop_front().map(|(seq, _, item)| (seq, item))
    }

    /// A request or an attempt was released to the server.
    pub(super) fn released(&mut self, now: Instant) {
        self.ramp.released(now);
    }

    /// While a ramp runs: the items that waited too little to be part of
    /// the backlog it holds (they just missed the connection).
    pub(super) fn fresh(&self, now: Instant) -> Vec<u64> {
        if !self.ramp.active() {
            return Vec::new();
        }
        (self.items.iter())
            .filter(|(_, since, _)| !ramp::backlog(*since, now))
            .map(|(seq, ..)| *seq)
            .collect()
    }

    /// After a release: the ramp ends with the queue, or says when it may
    /// have stalled (`Timer::RampStall`).
    pub(super) fn settle(&mut self) -> Option<Instant> {
        match self.items.is_empty() {
            true => {
                self.ramp.end();
                None
            }
            false => self.ramp.stall_at(),
        }
    }

    /// `Timer::RampStall`: whether more may go.
    pub(super) fn stalled(&mut self, now: Instant) -> bool {
        self.ramp.stalled(now)
    }

    /// The server answered a request: whether a ramp runs (more may go).
    pub(super) fn answered(&mut self, now: Instant) -> bool {
        if !self.ramp.active() {
            return false;
        }
        self.ramp.answered(now);
        true
    }

    /// Whether a ramp releases what waited.
    #[cfg(test)]
    pub(super) fn ramping(&self) -> bool {
        self.ramp.active()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::downstream::Outgoing;
    use std::time::Duration;

    fn note() -> Queued {
        Queued::Notification(Outgoing::notification("n", b"{}\n".to_vec()))
    }

    #[test]
    fn items_are_numbered_taken_by_number_and_bounded() {
        let t0 = Instant::now();
        let mut q = Queue::new();
        assert_eq!(q.push(Queued::Call(7), t0), Some(1));
        assert_eq!(q.push(note(), t0), Some(2));
        assert!(matches!(q.take(1), Some((t, Queued::Call(7))) if t == t0));
        assert!(q.take(1).is_none());
        assert_eq!(q.seqs(), [2]);
        while q.push(Queued::Call(0), t0).is_some() {}
        assert_eq!(q.seqs().len(), QUEUE_LIMIT);
        assert_eq!(q.drain().len(), QUEUE_LIMIT);
        assert!(q.is_empty());
    }

    #[test]
    fn a_ramp_releases_the_oldest_alone_and_more_per_answer() {
        let t0 = Instant::now();
        let mut q = Queue::new();
        for call in 1..=4 {
            q.push(Queued::Call(call), t0);
        }
        let back = t0 + Duration::from_secs(5);
        q.begin_ramp(back);
        assert!(matches!(q.pop_releasable(), Some((1, Queued::Call(1)))));
        q.released(back);
        assert!(q.pop_releasable().is_none(), "one out at first");
        // A notification waits only for what is before it.
        let mut q2 = Queue::new();
        q2.push(note(), t0);
        q2.push(Queued::Call(1), t0);
        q2.begin_ramp(back);
        q2.released(back);
        assert!(matches!(
            q2.pop_releasable(),
            Some((1, Queued::Notification(_)))
        ));
        // An answer lets two more go.
        assert!(q.answered(back));
        assert!(matches!(q.pop_releasable(), Some((2, _))));
        q.released(back);
        assert!(matches!(q.pop_releasable(), Some((3, _))));
        q.released(back);
        assert!(q.pop_releasable().is_none());
        assert_eq!(q.settle(), Some(back + crate::policy::ramp::STALL));
        q.take(4);
        assert_eq!(q.settle(), None);
        assert!(!q.ramping() && !q.answered(back));
    }

    #[test]
    fn what_waited_too_little_is_not_held_by_the_ramp() {
        let t0 = Instant::now();
        let mut q = Queue::new();
        q.push(Queued::Call(1), t0);
        let back = t0 + Duration::from_secs(5);
        q.push(Queued::Call(2), back);
        assert!(q.fresh(back).is_empty(), "no ramp: nothing held");
        q.begin_ramp(back);
        assert_eq!(q.fresh(back), [2]);
    }
}
