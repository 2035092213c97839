//! The dispatcher's clock: read once per batch of events, not per event.
//! A batch is what the loop takes from its inbox without waiting, at most
//! [`BATCH_EVENTS`] events and [`BATCH_BYTES`] of messages (after a larger
//! message the clock is read again), so the time an event is handled at is
//! off by at most the work of one batch (about 200 µs): no deadline set and
//! no latency recorded is off by more, unless the OS preempts the thread
//! mid-batch (then by that too: on a saturated machine a call answered
//! within one batch is recorded as taking 0 ms). A wait (for an event or a
//! timer) ends the batch, and the reading taken while waiting starts the next.
//!
//! Plain data; the reading is the caller's (`run` passes `Instant::now`),
//! so tests drive it with a fake clock. `handle_event` still takes `now`
//! per event.

#![forbid(unsafe_code)]

use std::time::Instant;

/// The most events handled at one reading of the clock.
pub(super) const BATCH_EVENTS: u32 = 64;
/// The most bytes of messages handled at one reading of the clock.
pub(super) const BATCH_BYTES: usize = 64 * 1024;

/// The reading of the batch under way.
#[derive(Debug, Default)]
pub(super) struct BatchClock {
    at: Option<Instant>,
    events: u32,
    bytes: usize,
}

impl BatchClock {
    /// The time to handle an event of `size` bytes at: `fresh` (a reading
    /// just taken, when the event came after a wait), the batch's reading
    /// while the batch lasts, else `read()`, which starts a new batch.
    pub(super) fn next(
        &mut self,
        fresh: Option<Instant>,
        size: usize,
        read: impl FnOnce() -> Instant,
    ) -> Instant {
        let at = match (fresh, self.at) {
            (Some(t), _) => self.start(t),
            (None, Some(at)) if self.events < BATCH_EVENTS && self.bytes < BATCH_BYTES => at,
            _ => self.start(read()),
        };
        self.events += 1;
        self.bytes += size;
        at
    }

    /// A wait ends the batch: the next event reads the clock.
    pub(super) fn end(&mut self) {
        self.at = None;
    }

    fn start(&mut self, at: Instant) -> Instant {
        *self = BatchClock {
            at: Some(at),
            events: 0,
            bytes: 0,
        };
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::time::Duration;

    #[test]
    fn the_clock_is_read_once_per_batch() {
        let t0 = Instant::now();
        let reads = Cell::new(0u32);
        let read = |at: Instant| {
            reads.set(reads.get() + 1);
            at
        };
        let mut c = BatchClock::default();
        // The first event of a session reads the clock.
        assert_eq!(c.next(None, 10, || read(t0)), t0);
        // The rest of a batch of small events does not.
        let later = t0 + Duration::from_micros(50);
        for _ in 1..BATCH_EVENTS {
            assert_eq!(c.next(None, 10, || read(later)), t0);
        }
        assert_eq!(reads.get(), 1);
        // The 65th reads it again.
        assert_eq!(c.next(None, 10, || read(later)), later);
        assert_eq!(reads.get(), 2);
        // A large message ends its batch.
        let big = later + Duration::from_micros(10);
        assert_eq!(c.next(None, BATCH_BYTES, || read(big)), later);
        assert_eq!(c.next(None, 10, || read(big)), big);
        assert_eq!(reads.get(), 3);
        // A reading taken while waiting starts a batch; a wait ends one.
        let woke = big + Duration::from_millis(5);
        assert_eq!(c.next(Some(woke), 10, || read(t0)), woke);
        c.end();
        let next = woke + Duration::from_millis(1);
        assert_eq!(c.next(None, 10, || read(next)), next);
        assert_eq!(reads.get(), 4);
    }
}
