//! Idempotency table: runs concurrent identical calls once and replays
//! completed successes.
//!
//! Owns the in-flight executions and the waiters joined to them, the
//! completed successful results kept for `ttl`, and the bound on entries. It
//! must not know how keys are made (explicit idempotency keys and argument
//! fingerprints are both just strings), what a waiter is (`W` is the
//! dispatcher's handle for a client request), whether a tool is read-only (the
//! caller says so with a [`Replay`] rule), or the clock (`now` is a
//! parameter).
//!
//! Semantics:
//! * A key is either in flight (with its joined waiters; the originator is
//!   tracked by the caller, not here) or completed (a successful result,
//!   replayable until `completed_at + ttl`).
//! * Failures are never stored: [`DedupTable::complete`] with `None` forgets
//!   the key, so the next identical call executes afresh.
//! * The bound `max_entries` counts both kinds. When full, the oldest
//!   completed entries are evicted; in-flight entries are never evicted, and
//!   the table may exceed the bound when all entries are in flight (those are
//!   bounded by the proxy's in-flight limit).
//! * The bound `max_bytes` counts the bytes of completed results; the oldest
//!   are evicted to stay within it. A result larger than the bound is not
//!   kept at all.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::instant_add;
use crate::fasthash::FastMap;

/// When a completed result may be replayed to a new identical call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// Never: the call runs again (read-only tools: repeating a read is
    /// harmless, replaying it would serve stale data).
    Never,
    /// Within the TTL (an explicit idempotency key names one operation).
    Always,
    /// Within the TTL, and only if no other mutating execution started since
    /// this one did ([`DedupTable::note_mutation`]): "write A, write A" runs
    /// once, "write A, write B, write A" runs A again.
    IfUnchanged,
}

/// What the caller should do with a call.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup<W> {
    /// Nothing usable known: execute the call (calling
    /// [`DedupTable::start`]) on behalf of this waiter, handed back.
    Execute(W),
    /// An identical execution is in flight: the waiter was added to it and
    /// comes back from [`DedupTable::complete`] or [`DedupTable::abandon`].
    Joined,
    /// A completed success within its TTL: answer the waiter with `result`
    /// (raw JSON text).
    Replay { result: String, waiter: W },
}

#[derive(Debug)]
enum Slot<W> {
    InFlight {
        waiters: Vec<W>,
        /// The mutation count when it started.
        stamp: u64,
    },
    Done {
        result: String,
        expires: Instant,
        seq: u64,
        stamp: u64,
    },
}

#[derive(Debug)]
pub struct DedupTable<W> {
    ttl: Duration,
    max_entries: usize,
    max_bytes: usize,
    /// Bytes of the completed results held.
    bytes: usize,
    slots: FastMap<Arc<str>, Slot<W>>,
    /// Completed entries, oldest completion first.
    completed: BTreeMap<u64, Arc<str>>,
    next_seq: u64,
    /// Mutating executions started so far.
    mutations: u64,
}

impl<W> DedupTable<W> {
    /// `ttl` zero: nothing is replayed (in-flight joining still works).
    pub fn new(ttl: Duration, max_entries: usize, max_bytes: usize) -> Self {
        Self {
            ttl,
            max_entries,
            max_bytes,
            bytes: 0,
            slots: FastMap::default(),
            completed: BTreeMap::new(),
            next_seq: 0,
            mutations: 0,
        }
    }

    /// A call that may change the server's state is about to execute.
    pub fn note_mutation(&mut self) {
        self.mutations += 1;
    }

    /// Joins an in-flight execution of `key`, or replays its completed result
    /// when `replay` allows, or hands the waiter back to execute. Expired
    /// entries are dropped.
    pub fn lookup_or_join(
        &mut self,
        key: &str,
        waiter: W,
        replay: Replay,
        now: Instant,
    ) -> Lookup<W> {
        self.purge_expired(now);
        let mutations = self.mutations;
        match self.slots.get_mut(key) {
            Some(Slot::InFlight { waiters, .. }) => {
                waiters.push(waiter);
                Lookup::Joined
            }
            Some(Slot::Done { result, stamp, .. })
                if replay == Replay::Always
                    || (replay == Replay::IfUnchanged && *stamp == mutations) =>
            {
                Lookup::Replay {
                    result: result.clone(),
                    waiter,
                }
            }
            _ => Lookup::Execute(waiter),
        }
    }

    /// Marks `key` in flight (after [`Lookup::Execute`]), replacing a completed
    /// entry (a re-executed read-only call). Already in flight: no change.
    pub fn start(&mut self, key: &str, now: Instant) {
        self.purge_expired(now);
        if let Some(Slot::InFlight { .. }) = self.slots.get(key) {
            return;
        }
        self.forget(key);
        self.make_room(1);
        self.slots.insert(
            key.into(),
            Slot::InFlight {
                waiters: Vec::new(),
                stamp: self.mutations,
            },
        );
    }

    /// Waiters joined to the in-flight execution of `key` (0 if none).
    pub fn joiners(&self, key: &str) -> usize {
        match self.slots.get(key) {
            Some(Slot::InFlight { waiters, .. }) => waiters.len(),
            _ => 0,
        }
    }

    /// Removes and returns the first joined waiter matching `pred` (its client
    /// cancelled). The execution stays in flight.
    pub fn remove_waiter(&mut self, key: &str, pred: impl Fn(&W) -> bool) -> Option<W> {
        match self.slots.get_mut(key) {
            Some(Slot::InFlight { waiters, .. }) => {
                let i = waiters.iter().position(pred)?;
                Some(waiters.remove(i))
            }
            _ => None,
        }
    }

    /// The in-flight execution of `key` finished: returns its joined waiters
    /// (in join order) to answer. `store` is the result to keep for replay
    /// until `now + ttl`; `None` (failures, or results not to be replayed)
    /// forgets the key. Not in flight: returns nothing and stores nothing.
    pub fn complete(&mut self, key: &str, store: Option<String>, now: Instant) -> Vec<W> {
        let Some((key, Slot::InFlight { waiters, stamp })) = self.take_in_flight(key) else {
            return Vec::new();
        };
        self.purge_expired(now);
        if let Some(result) = store {
            if !self.ttl.is_zero() && self.max_entries > 0 && result.len() <= self.max_bytes {
                self.make_room(1);
                self.make_room_for_bytes(result.len());
                self.bytes += result.len();
                let seq = self.next_seq;
                self.next_seq += 1;
                self.completed.insert(seq, Arc::clone(&key));
                self.slots.insert(
                    key,
                    Slot::Done {
                        result,
                        expires: instant_add(now, self.ttl),
                        seq,
                        stamp,
                    },
                );
            }
        }
        waiters
    }

    /// The execution of `key` ended without an outcome (e.g. its originator
    /// cancelled and nobody else wanted it): forgets it and returns its joined
    /// waiters, whom the caller may re-dispatch. Not in flight: nothing.
    pub fn abandon(&mut self, key: &str) -> Vec<W> {
        match self.take_in_flight(key) {
            Some((_, Slot::InFlight { waiters, .. })) => waiters,
            _ => Vec::new(),
        }
    }

    /// Entries held, in flight and completed.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Whether `key` is in flight.
    #[cfg(test)]
    pub fn in_flight(&self, key: &str) -> bool {
        matches!(self.slots.get(key), Some(Slot::InFlight { .. }))
    }

    fn take_in_flight(&mut self, key: &str) -> Option<(Arc<str>, Slot<W>)> {
        match self.slots.get(key) {
            Some(Slot::InFlight { .. }) => self.slots.remove_entry(key),
            _ => None,
        }
    }

    /// Removes `key` whatever its state.
    fn forget(&mut self, key: &str) {
        if let Some(Slot::Done { seq, result, .. }) = self.slots.remove(key) {
            self.completed.remove(&seq);
            self.bytes -= result.len();
        }
    }

    /// Evicts oldest completed entries until `extra` more fit (or none are
    /// left to evict).
    fn make_room(&mut self, extra: usize) {
        while self.slots.len() + extra > self.max_entries {
            if !self.evict_oldest() {
                break;
            }
        }
    }

    /// Evicts oldest completed entries until a result of `extra` bytes fits.
    fn make_room_for_bytes(&mut self, extra: usize) {
        while self.bytes + extra > self.max_bytes {
            if !self.evict_oldest() {
                break;
            }
        }
    }

    /// Drops the oldest completed entry; false if there is none.
    fn evict_oldest(&mut self) -> bool {
        let Some((_, key)) = self.completed.pop_first() else {
            return false;
        };
        if let Some(Slot::Done { result, .. }) = self.slots.remove(&key) {
            self.bytes -= result.len();
        }
        true
    }

    /// Drops completed entries whose TTL is over. They complete in order with
    /// one TTL, so they expire in order too.
    fn purge_expired(&mut self, now: Instant) {
        while let Some((_, key)) = self.completed.first_key_value() {
            match self.slots.get(key) {
                Some(Slot::Done { expires, .. }) if *expires > now => break,
                _ => {
                    self.evict_oldest();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(300);

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn table(max_entries: usize) -> DedupTable<u32> {
        DedupTable::new(TTL, max_entries, usize::MAX)
    }

    /// Looks up and, on Execute, starts; returns the lookup.
    fn call(t: &mut DedupTable<u32>, key: &str, waiter: u32, now: Instant) -> Lookup<u32> {
        let l = t.lookup_or_join(key, waiter, Replay::Always, now);
        if let Lookup::Execute(_) = l {
            t.start(key, now);
        }
        l
    }

    fn replay(result: &str, waiter: u32) -> Lookup<u32> {
        Lookup::Replay {
            result: result.to_string(),
            waiter,
        }
    }

    #[test]
    fn concurrent_identical_calls_run_once() {
        let t0 = Instant::now();
        let mut t = table(100);
        assert_eq!(call(&mut t, "k", 1, t0), Lookup::Execute(1));
        assert!(t.in_flight("k"));
        assert_eq!(call(&mut t, "k", 2, t0), Lookup::Joined);
        assert_eq!(call(&mut t, "k", 3, t0 + secs(1)), Lookup::Joined);
        assert_eq!(t.joiners("k"), 2);
        // A different key is independent.
        assert_eq!(call(&mut t, "other", 4, t0), Lookup::Execute(4));
        assert_eq!(t.complete("k", Some("R".into()), t0 + secs(2)), vec![2, 3]);
        assert!(!t.in_flight("k"));
        assert_eq!(t.joiners("k"), 0);
    }

    #[test]
    fn completed_success_is_replayed_until_the_ttl() {
        let t0 = Instant::now();
        let mut t = table(100);
        call(&mut t, "k", 1, t0);
        let done = t0 + secs(1);
        assert!(t.complete("k", Some("R".into()), done).is_empty());
        assert_eq!(call(&mut t, "k", 2, done), replay("R", 2));
        assert_eq!(
            call(&mut t, "k", 3, done + TTL - Duration::from_millis(1)),
            replay("R", 3)
        );
        // At completion + TTL it has expired: execute again.
        assert_eq!(call(&mut t, "k", 4, done + TTL), Lookup::Execute(4));
        assert!(t.in_flight("k"));
    }

    #[test]
    fn failures_are_not_stored() {
        let t0 = Instant::now();
        let mut t = table(100);
        call(&mut t, "k", 1, t0);
        call(&mut t, "k", 2, t0);
        assert_eq!(t.complete("k", None, t0), vec![2]);
        assert!(t.is_empty());
        assert_eq!(call(&mut t, "k", 3, t0), Lookup::Execute(3));
    }

    #[test]
    fn replay_never_skips_completed_but_still_joins() {
        let t0 = Instant::now();
        let mut t = table(100);
        call(&mut t, "k", 1, t0);
        t.complete("k", Some("R".into()), t0);
        assert_eq!(
            t.lookup_or_join("k", 2, Replay::Never, t0),
            Lookup::Execute(2)
        );
        t.start("k", t0);
        assert!(t.in_flight("k"), "start replaces the completed entry");
        assert_eq!(t.len(), 1);
        assert_eq!(t.lookup_or_join("k", 3, Replay::Never, t0), Lookup::Joined);
        assert_eq!(t.complete("k", Some("R2".into()), t0 + secs(1)), vec![3]);
        assert_eq!(call(&mut t, "k", 4, t0 + secs(1)), replay("R2", 4));
    }

    #[test]
    fn start_twice_keeps_the_waiters() {
        let t0 = Instant::now();
        let mut t = table(100);
        call(&mut t, "k", 1, t0);
        call(&mut t, "k", 2, t0);
        t.start("k", t0);
        assert_eq!(t.joiners("k"), 1);
    }

    #[test]
    fn remove_waiter_takes_one_joined_client_out() {
        let t0 = Instant::now();
        let mut t = table(100);
        call(&mut t, "k", 1, t0);
        call(&mut t, "k", 2, t0);
        call(&mut t, "k", 3, t0);
        assert_eq!(t.remove_waiter("k", |w| *w == 2), Some(2));
        assert_eq!(t.remove_waiter("k", |w| *w == 2), None);
        assert_eq!(t.remove_waiter("nope", |_| true), None);
        assert_eq!(t.joiners("k"), 1);
        assert!(t.in_flight("k"));
        assert_eq!(t.complete("k", Some("R".into()), t0), vec![3]);
        assert_eq!(
            t.remove_waiter("k", |_| true),
            None,
            "completed: no waiters"
        );
    }

    #[test]
    fn abandon_forgets_and_returns_the_waiters() {
        let t0 = Instant::now();
        let mut t = table(100);
        call(&mut t, "k", 1, t0);
        call(&mut t, "k", 2, t0);
        call(&mut t, "k", 3, t0);
        assert_eq!(t.abandon("k"), vec![2, 3]);
        assert!(t.is_empty());
        assert_eq!(call(&mut t, "k", 2, t0), Lookup::Execute(2));
        // Abandoning a completed or unknown key does nothing.
        t.complete("k", Some("R".into()), t0);
        assert!(t.abandon("k").is_empty());
        assert!(t.abandon("nope").is_empty());
        assert_eq!(call(&mut t, "k", 5, t0), replay("R", 5));
    }

    #[test]
    fn complete_of_an_unknown_key_stores_nothing() {
        let t0 = Instant::now();
        let mut t = table(100);
        assert!(t.complete("k", Some("R".into()), t0).is_empty());
        assert!(t.is_empty());
        // Completing twice: the second is ignored and does not replace.
        call(&mut t, "k", 1, t0);
        t.complete("k", Some("R".into()), t0);
        assert!(t.complete("k", Some("X".into()), t0).is_empty());
        assert_eq!(call(&mut t, "k", 2, t0), replay("R", 2));
    }

    #[test]
    fn zero_ttl_never_replays() {
        let t0 = Instant::now();
        let mut t: DedupTable<u32> = DedupTable::new(Duration::ZERO, 100, usize::MAX);
        call(&mut t, "k", 1, t0);
        assert_eq!(call(&mut t, "k", 2, t0), Lookup::Joined);
        assert_eq!(t.complete("k", Some("R".into()), t0), vec![2]);
        assert!(t.is_empty());
        assert_eq!(call(&mut t, "k", 3, t0), Lookup::Execute(3));
    }

    #[test]
    fn the_bound_evicts_oldest_completed_first() {
        let t0 = Instant::now();
        let mut t = table(3);
        for (i, k) in ["a", "b", "c"].into_iter().enumerate() {
            call(&mut t, k, 0, t0);
            t.complete(k, Some(k.to_uppercase()), t0 + secs(i as u64));
        }
        assert_eq!(t.len(), 3);
        // A new execution evicts "a", the oldest completion.
        call(&mut t, "d", 0, t0 + secs(5));
        assert_eq!(t.len(), 3);
        assert_eq!(call(&mut t, "a", 1, t0 + secs(5)), Lookup::Execute(1));
        // ... which evicted "b"; "c" is still replayable.
        assert_eq!(call(&mut t, "c", 2, t0 + secs(5)), replay("C", 2));
        assert_eq!(call(&mut t, "b", 3, t0 + secs(5)), Lookup::Execute(3));
    }

    #[test]
    fn the_byte_bound_evicts_oldest_results_first() {
        let t0 = Instant::now();
        let mut t: DedupTable<u32> = DedupTable::new(TTL, 100, 10);
        for k in ["a", "b", "c"] {
            call(&mut t, k, 0, t0);
            t.complete(k, Some(k.repeat(4)), t0);
        }
        // 12 bytes do not fit in 10: "a" went when "c" came.
        assert_eq!(t.bytes, 8);
        assert_eq!(call(&mut t, "b", 1, t0), replay("bbbb", 1));
        assert_eq!(call(&mut t, "a", 2, t0), Lookup::Execute(2));
        // A result over the bound is not kept, and evicts nothing.
        call(&mut t, "big", 0, t0);
        t.complete("big", Some("x".repeat(11)), t0);
        assert_eq!(call(&mut t, "big", 3, t0), Lookup::Execute(3));
        assert_eq!(call(&mut t, "c", 4, t0), replay("cccc", 4));
        // Re-executing a completed key gives its bytes back.
        t.start("c", t0);
        assert_eq!(t.bytes, 4);
        // Expiry too.
        t.purge_expired(t0 + TTL + secs(1));
        assert_eq!(t.bytes, 0);
    }

    #[test]
    fn the_bound_never_evicts_in_flight_entries() {
        let t0 = Instant::now();
        let mut t = table(2);
        call(&mut t, "a", 1, t0);
        call(&mut t, "b", 2, t0);
        call(&mut t, "a", 10, t0);
        // Full of in-flight entries: a third still starts, beyond the bound.
        call(&mut t, "c", 3, t0);
        assert_eq!(t.len(), 3);
        assert!(t.in_flight("a") && t.in_flight("b") && t.in_flight("c"));
        assert_eq!(t.joiners("a"), 1);
        // Completing "a" while over the bound: it can only fit by evicting
        // completed entries, and there are none, so it is still stored.
        assert_eq!(t.complete("a", Some("A".into()), t0), vec![10]);
        assert_eq!(t.len(), 3);
        // The next start evicts completed "a", never "b" or "c".
        call(&mut t, "d", 4, t0);
        assert!(t.in_flight("b") && t.in_flight("c") && t.in_flight("d"));
        assert_eq!(
            t.lookup_or_join("a", 5, Replay::Always, t0),
            Lookup::Execute(5)
        );
    }

    #[test]
    fn zero_max_entries_still_coalesces_in_flight_calls() {
        let t0 = Instant::now();
        let mut t = table(0);
        call(&mut t, "k", 1, t0);
        assert_eq!(call(&mut t, "k", 2, t0), Lookup::Joined);
        assert_eq!(t.complete("k", Some("R".into()), t0), vec![2]);
        assert!(t.is_empty());
    }

    #[test]
    fn expired_entries_are_purged() {
        let t0 = Instant::now();
        let mut t = table(100);
        for (i, k) in ["a", "b"].into_iter().enumerate() {
            call(&mut t, k, 0, t0);
            t.complete(k, Some("R".into()), t0 + secs(i as u64 * 100));
        }
        call(&mut t, "live", 0, t0);
        assert_eq!(t.len(), 3);
        // "a" expires at 300 s, "b" at 400 s; the in-flight entry stays.
        t.start("x", t0 + secs(300));
        assert_eq!(t.len(), 3);
        t.start("y", t0 + secs(400));
        assert_eq!(t.len(), 3);
        assert!(t.in_flight("live") && t.in_flight("x") && t.in_flight("y"));
    }

    #[test]
    fn replay_if_unchanged_stops_after_another_mutation() {
        let t0 = Instant::now();
        let mut t: DedupTable<u32> = DedupTable::new(secs(60), 10, 1 << 20);
        // write A
        t.note_mutation();
        t.start("A", t0);
        t.complete("A", Some("RA".into()), t0);
        // write A again, nothing in between: replayed.
        assert_eq!(
            t.lookup_or_join("A", 1, Replay::IfUnchanged, t0),
            Lookup::Replay {
                result: "RA".into(),
                waiter: 1
            }
        );
        // write B runs...
        t.note_mutation();
        t.start("B", t0);
        t.complete("B", Some("RB".into()), t0);
        // ...so write A runs again; B itself is still the latest.
        assert_eq!(
            t.lookup_or_join("A", 2, Replay::IfUnchanged, t0),
            Lookup::Execute(2)
        );
        assert_eq!(
            t.lookup_or_join("B", 3, Replay::IfUnchanged, t0),
            Lookup::Replay {
                result: "RB".into(),
                waiter: 3
            }
        );
        // An explicit key names one operation whatever ran since.
        assert_eq!(
            t.lookup_or_join("A", 4, Replay::Always, t0),
            Lookup::Replay {
                result: "RA".into(),
                waiter: 4
            }
        );
    }
}
