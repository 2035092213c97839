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
