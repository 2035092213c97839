//! The dispatcher's clock: read once per batch of events, not per event.
//! A batch is what the loop takes from its inbox without waiting, at most
//! [`BATCH_EVENTS`] events, [`BATCH_BYTES`] of messages (after a larger
//! message the clock is read again) and [`BATCH_TIME`]: every
//! [`CHECK_EVERY`]th event of a batch reads the clock, and the batch ends
//! when that reading is [`BATCH_TIME`] or more after the batch's. A wait
//! (for an event or a timer) ends the batch, and the reading taken while
//! waiting starts the next. An answer from the server is handled at a
//! reading of its own (it starts a batch), so the latency it records ends
//! when it was handled, whatever the batch before it cost.
//!
//! So the time an event is handled at is off by at most [`BATCH_TIME`] and
//! the work of [`CHECK_EVERY`] events (a few µs each), and no latency an
//! answer records is shorter than the call took: a call started at a
//! batch's reading is recorded as taking at least the time until its
//! answer was read, even when the OS preempted the thread in between. What
//! stays unbounded is a preemption between two checks: the events after it
//! are handled at the reading before it, so a deadline set then is early by
//! that much (never late) and a latency recorded is longer by it.
//!
//! Plain data; the reading is the caller's (`run` passes `Instant::now`),
//! so tests drive it with a fake clock. `handle_event` still takes `now`
//! per event.

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

/// The most events handled at one reading of the clock.
pub(super) const BATCH_EVENTS: u32 = 64;
/// The most bytes of messages handled at one reading of the clock.
pub(super) const BATCH_BYTES: usize = 64 * 1024;
/// The longest a batch's reading is used for, checked every
/// [`CHECK_EVERY`] events.
pub(super) const BATCH_TIME: Duration = Duration::from_micros(200);
/// How many events of a batch are handled between two checks of the
/// time it has lasted: each check reads the clock (docs/design.md says
/// what the readings cost).
pub(super) const CHECK_EVERY: u32 = 8;

/// The reading of the batch under way.
#[derive(Debug, Default)]
pub(super) struct BatchClock {
    at: Option<Instant>,
    events: u32,
    bytes: usize,
}

/// What the loop knows of an event before it is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Arrived {
    /// Taken from the inbox without a wait, and no answer.
    Queued,
    /// It came after a wait: the reading taken then.
    AfterWait(Instant),
    /// An answer from the server: it is handled at a reading of its own.
    Answer,
}

impl BatchClock {
    /// The time to handle an event of `size` bytes at: the reading taken
    /// on a wait, the batch's reading while the batch lasts, else `read()`,
    /// which starts a new batch.
    pub(super) fn next(
        &mut self,
        arrived: Arrived,
        size: usize,
        read: impl FnOnce() -> Instant,
    ) -> Instant {
        let at = match (arrived, self.at) {
            (Arrived::AfterWait(t), _) => self.start(t),
            (Arrived::Queued, Some(at))
                if self.events < BATCH_EVENTS && self.bytes < BATCH_BYTES =>
            {
                match self.events % CHECK_EVERY {
                    0 => match read() {
                        t if t.saturating_duration_since(at) >= BATCH_TIME => self.start(t),
                        _ => at,
                    },
                    _ => at,
                }
            }
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

    /// A fake clock that counts its readings.
    struct Fake {
        now: Cell<Instant>,
        reads: Cell<u32>,
    }

    impl Fake {
        fn new() -> Fake {
            Fake {
                now: Cell::new(Instant::now()),
                reads: Cell::new(0),
            }
        }
        fn read(&self) -> Instant {
            self.reads.set(self.reads.get() + 1);
            self.now.get()
        }
        fn advance(&self, d: Duration) {
            self.now.set(self.now.get() + d);
        }
    }

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
        assert_eq!(c.next(Arrived::Queued, 10, || read(t0)), t0);
        // The rest of a batch of small, quick events does not use any
        // other reading (its checks find less than BATCH_TIME gone).
        let later = t0 + Duration::from_micros(50);
        for _ in 1..BATCH_EVENTS {
            assert_eq!(c.next(Arrived::Queued, 10, || read(later)), t0);
        }
        // The 65th reads it again.
        let checks = BATCH_EVENTS / CHECK_EVERY - 1;
        assert_eq!(reads.get(), 1 + checks);
        assert_eq!(c.next(Arrived::Queued, 10, || read(later)), later);
        assert_eq!(reads.get(), 2 + checks);
        // A large message ends its batch.
        let big = later + Duration::from_micros(10);
        assert_eq!(c.next(Arrived::Queued, BATCH_BYTES, || read(big)), later);
        assert_eq!(c.next(Arrived::Queued, 10, || read(big)), big);
        assert_eq!(reads.get(), 3 + checks);
        // A reading taken while waiting starts a batch; a wait ends one.
        let woke = big + Duration::from_millis(5);
        assert_eq!(c.next(Arrived::AfterWait(woke), 10, || read(t0)), woke);
        c.end();
        let next = woke + Duration::from_millis(1);
        assert_eq!(c.next(Arrived::Queued, 10, || read(next)), next);
        assert_eq!(reads.get(), 4 + checks);
    }

    #[test]
    fn a_batch_ends_once_its_time_is_up() {
        let clock = Fake::new();
        let mut c = BatchClock::default();
        let t0 = c.next(Arrived::Queued, 10, || clock.read());
        // Events that take 30 µs each: the check after the 7th sees
        // 210 µs gone, and its reading starts the next batch.
        for _ in 1..CHECK_EVERY {
            clock.advance(Duration::from_micros(30));
            assert_eq!(c.next(Arrived::Queued, 10, || clock.read()), t0);
        }
        assert_eq!(clock.reads.get(), 1);
        clock.advance(Duration::from_micros(30));
        let t1 = c.next(Arrived::Queued, 10, || clock.read());
        assert_eq!(clock.reads.get(), 2);
        assert_eq!(t1.duration_since(t0), Duration::from_micros(240));
        // A check that finds less than BATCH_TIME gone keeps the batch's
        // reading: quick events share it.
        for _ in 1..CHECK_EVERY {
            clock.advance(Duration::from_micros(1));
            assert_eq!(c.next(Arrived::Queued, 10, || clock.read()), t1);
        }
        clock.advance(Duration::from_micros(1));
        assert_eq!(c.next(Arrived::Queued, 10, || clock.read()), t1);
        assert_eq!(clock.reads.get(), 3);
        // A thread preempted for 5 ms mid-batch: the next check ends the
        // batch, so no more than CHECK_EVERY events use the old reading.
        clock.advance(Duration::from_millis(5));
        let mut stale = 0;
        loop {
            let at = c.next(Arrived::Queued, 10, || clock.read());
            if at != t1 {
                assert_eq!(at, clock.now.get());
                break;
            }
            stale += 1;
        }
        assert!(stale < CHECK_EVERY, "{stale} events after the preemption");
    }

    #[test]
    fn an_answer_is_handled_at_a_reading_of_its_own() {
        let clock = Fake::new();
        let mut c = BatchClock::default();
        // A call starts at the batch's reading; the thread is preempted;
        // its answer, in the same batch, is not recorded as taking 0 ms.
        let started = c.next(Arrived::Queued, 10, || clock.read());
        clock.advance(Duration::from_millis(3));
        let answered = c.next(Arrived::Answer, 10, || clock.read());
        assert_eq!(answered.duration_since(started), Duration::from_millis(3));
        // The answer's reading starts a batch the next events share.
        clock.advance(Duration::from_micros(5));
        assert_eq!(c.next(Arrived::Queued, 10, || clock.read()), answered);
        assert_eq!(clock.reads.get(), 2);
        // And a wait ends it.
        c.end();
        assert_eq!(
            c.next(Arrived::Queued, 10, || clock.read()),
            clock.now.get()
        );
        assert_eq!(clock.reads.get(), 3);
    }

    #[test]
    fn a_batch_ends_after_its_most_events() {
        let clock = Fake::new();
        let mut c = BatchClock::default();
        let t0 = c.next(Arrived::Queued, 1, || clock.read());
        clock.advance(Duration::from_micros(1));
        for _ in 1..BATCH_EVENTS {
            assert_eq!(c.next(Arrived::Queued, 1, || clock.read()), t0);
        }
        let t1 = c.next(Arrived::Queued, 1, || clock.read());
        assert_eq!(t1.duration_since(t0), Duration::from_micros(1));
    }
}
