//! Idempotency table: runs concurrent identical calls once and replays
//! completed successes the rules allow.
//!
//! Owns the in-flight executions and the waiters joined to them, the
//! completed successful results kept for `ttl`, and the bounds on entries and
//! bytes. It must not know how keys are made (the dispatcher hashes explicit
//! idempotency keys and argument fingerprints into fixed-size keys), what a
//! waiter is (`W` is the dispatcher's handle for a client request), whether
//! a tool is read-only, or the clock (`now` is a parameter).
//!
//! Semantics:
//! * A key is either in flight (with its joined waiters; the originator is
//!   tracked by the caller, not here) or completed (a successful result,
//!   replayable until `completed_at + ttl`).
//! * What is stored decides what is replayed. A result is stored either for
//!   every later identical call ([`Keep::Always`]: an explicit idempotency key
//!   names one operation) or for the next one only ([`Keep::Once`]: a result
//!   the client never received, handed over once and then forgotten).
//!   Failures, and results the client already got for keyless calls, are not
//!   stored at all: [`DedupTable::complete`] with `None` forgets the key.
//! * Each entry remembers a fingerprint of its arguments (`args`), so the
//!   caller can tell when calls sharing an explicit key differ otherwise.
//! * The bound `max_entries` counts both kinds. When full, the oldest
//!   completed entries are evicted; in-flight entries are never evicted, and
//!   the table may exceed the bound when all entries are in flight (those are
//!   bounded by the proxy's in-flight limit).
//! * The bound `max_bytes` counts the bytes of completed results plus
//!   [`ENTRY_BYTES`] for each entry's key and bookkeeping; the oldest are
//!   evicted to stay within it. A result larger than the bound is not kept.
//! * A key whose execution may have run without a result to give (its
//!   outcome is unknown: [`DedupTable::complete_unknown`]) is *marked* for
//!   `ttl`: a later call with that key is not run ([`Lookup::Marked`]). A
//!   late success replaces the mark ([`DedupTable::store_late`]); a late
//!   definite answer that is not kept lifts it ([`DedupTable::release`]).
//!   So is a key whose success was too large to keep ([`Mark::Ran`]).
//!   Marks count toward both bounds like completed entries, but are evicted
//!   only when no completed result is left to evict.

#![forbid(unsafe_code)]

use std::collections::hash_map::RandomState;
use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{instant_add, Sink};
use crate::fasthash::FastMap;
use crate::jsonrpc::canonical::Node;

/// What each completed entry costs beyond its result text (key, slot,
/// order index), counted in `max_bytes`.
pub const ENTRY_BYTES: usize = 64;

/// The process's secret keys for [`fingerprint`]s, drawn once: the thread
/// that reads a call and the dispatcher that looks it up must agree, and
/// no fingerprint outlives the process.
pub fn keys() -> &'static RandomState {
    static KEYS: OnceLock<RandomState> = OnceLock::new();
    KEYS.get_or_init(RandomState::new)
}

/// A 128-bit fingerprint of `parts` (their boundaries included): two
/// domain-separated hashes under the caller's secret SipHash keys (a std
/// `RandomState`), so keys stay 16 bytes whatever the arguments' size and
/// cannot be made to collide by someone who does not know the keys.
pub fn fingerprint(keys: &impl BuildHasher, parts: &[&str]) -> u128 {
    Halves::new(keys, parts).finish()
}

/// [`fingerprint`] of `parts` followed by the canonical JSON text of `json`
/// (see `canonical_json`: member order and white space do not count),
/// computed without building that text. Err when `json` is not valid JSON
/// or nests too deep. (The proxy fingerprints arguments walked in
/// canonical form, [`fingerprint_node`]; this is what the tests hold that
/// to.)
#[cfg(test)]
pub fn fingerprint_json(
    keys: &impl BuildHasher,
    parts: &[&str],
    json: &str,
) -> Result<u128, serde_json::Error> {
    let mut halves = Halves::new(keys, parts);
    super::canonical_read(json, &mut halves)?;
    Ok(halves.finish())
}

/// [`fingerprint_json`] of a value walked in canonical form already (the
/// arguments of a call, read with its line): no walk over its text.
pub fn fingerprint_node(keys: &impl BuildHasher, parts: &[&str], node: &Node<'_>) -> u128 {
    let mut halves = Halves::new(keys, parts);
    node.write(&mut halves);
    halves.finish()
}

/// The two domain-separated hashes of a fingerprint, fed the same bytes:
/// gathered in a buffer, so that SipHash sees a few long writes rather than
/// one per piece of canonical JSON or per part (each write has a cost of
/// its own; the bytes hashed are the same).
struct Halves<H> {
    first: H,
    second: H,
    buf: [u8; 256],
    len: usize,
}

impl<H: Hasher> Halves<H> {
    /// Both halves, their domains and `parts` (with their boundaries) in.
    fn new(keys: &impl BuildHasher<Hasher = H>, parts: &[&str]) -> Halves<H> {
        let start = |domain: u8| {
            let mut h = keys.build_hasher();
            h.write_u8(domain);
            h
        };
        let mut halves = Halves {
            first: start(1),
            second: start(2),
            buf: [0; 256],
            len: 0,
        };
        for p in parts {
            halves.bytes(&p.len().to_le_bytes());
            halves.bytes(p.as_bytes());
        }
        halves
    }

    fn bytes(&mut self, b: &[u8]) {
        if self.len + b.len() > self.buf.len() {
            self.flush();
            if b.len() > self.buf.len() {
                self.first.write(b);
                self.second.write(b);
                return;
            }
        }
        self.buf[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
    }

    fn flush(&mut self) {
        self.first.write(&self.buf[..self.len]);
        self.second.write(&self.buf[..self.len]);
        self.len = 0;
    }

    fn finish(mut self) -> u128 {
        self.flush();
        (u128::from(self.first.finish()) << 64) | u128::from(self.second.finish())
    }
}

impl<H: Hasher> Sink for Halves<H> {
    fn put(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
}

/// `fp` in lower-case hex, written into `buf`, for keys made of text.
pub fn hex(fp: u128, buf: &mut [u8; 32]) -> &str {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in buf.iter_mut().enumerate() {
        *b = DIGITS[((fp >> (124 - 4 * i)) & 0xf) as usize];
    }
    std::str::from_utf8(buf).expect("hex digits are ASCII")
}

/// How a completed result may be replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// To every identical call within the TTL (an explicit key).
    Always,
    /// To the next identical call only (a result the client never got).
    Once,
}

/// What the caller should do with a call.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup<W> {
    /// Nothing usable known: execute the call (calling
    /// [`DedupTable::start`]) on behalf of this waiter, handed back.
    Execute(W),
    /// An identical execution is in flight: the waiter was added to it and
    /// comes back from [`DedupTable::complete`] or [`DedupTable::abandon`].
    /// `same_args` is false when that execution's arguments differ.
    Joined { same_args: bool },
    /// A completed success within its TTL: answer the waiter with `result`
    /// (raw JSON text).
    Replay {
        result: String,
        waiter: W,
        same_args: bool,
    },
    /// An earlier execution of the key may have run and is not to run
    /// again: answer the waiter with what the mark says.
    Marked {
        mark: Mark,
        waiter: W,
        same_args: bool,
    },
}

/// Why a key is not to run again, and since when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// The earlier execution, which started at `since`, may have run:
    /// `cause` ended it without an outcome (`timeout`, `server_exited`,
    /// `transport_error`, `cancelled`).
    Unknown { cause: &'static str, since: Instant },
    /// The earlier execution succeeded at `at`, with a result too large
    /// to keep.
    Ran { at: Instant },
}

#[derive(Debug)]
enum Slot<W> {
    InFlight {
        waiters: Vec<W>,
        args: u128,
    },
    Done {
        result: String,
        expires: Instant,
        seq: u64,
        keep: Keep,
        args: u128,
    },
    Marked {
        mark: Mark,
        expires: Instant,
        seq: u64,
        args: u128,
    },
}

#[derive(Debug)]
pub struct DedupTable<K, W> {
    ttl: Duration,
    max_entries: usize,
    max_bytes: usize,
    /// Bytes of the completed entries held (results plus [`ENTRY_BYTES`]).
    bytes: usize,
    slots: FastMap<K, Slot<W>>,
    /// Completed entries, oldest completion first.
    completed: BTreeMap<u64, K>,
    /// Marked entries, oldest mark first.
    marked: BTreeMap<u64, K>,
    next_seq: u64,
}

impl<K: Hash + Eq + Clone, W> DedupTable<K, W> {
    /// `ttl` zero: nothing is replayed (in-flight joining still works).
    pub fn new(ttl: Duration, max_entries: usize, max_bytes: usize) -> Self {
        Self {
            ttl,
            max_entries,
            max_bytes,
            bytes: 0,
            slots: FastMap::default(),
            completed: BTreeMap::new(),
            marked: BTreeMap::new(),
            next_seq: 0,
        }
    }

    /// Joins an in-flight execution of `key`, or replays its completed result
    /// when `replay` allows (a [`Keep::Once`] result is then forgotten), or
    /// hands the waiter back to execute. Expired entries are dropped. `args`
    /// is the fingerprint of this call's arguments, compared with the entry's.
    pub fn lookup_or_join(
        &mut self,
        key: &K,
        args: u128,
        waiter: W,
        replay: bool,
        now: Instant,
    ) -> Lookup<W> {
        self.purge_expired(now);
        let (same_args, keep) = match self.slots.get_mut(key) {
            Some(Slot::InFlight { waiters, args: a }) => {
                waiters.push(waiter);
                return Lookup::Joined {
                    same_args: *a == args,
                };
            }
            Some(Slot::Done { args: a, keep, .. }) if replay => (*a == args, *keep),
            Some(Slot::Marked { mark, args: a, .. }) => {
                return Lookup::Marked {
                    mark: *mark,
                    waiter,
                    same_args: *a == args,
                }
            }
            _ => return Lookup::Execute(waiter),
        };
        let result = match (keep, self.slots.get(key)) {
            (Keep::Always, Some(Slot::Done { result, .. })) => result.clone(),
            _ => self.forget(key).unwrap_or_default(),
        };
        Lookup::Replay {
            result,
            waiter,
            same_args,
        }
    }

    /// Marks `key` in flight (after [`Lookup::Execute`]), replacing a completed
    /// entry. Already in flight: no change.
    pub fn start(&mut self, key: &K, args: u128, now: Instant) {
        self.purge_expired(now);
        if let Some(Slot::InFlight { .. }) = self.slots.get(key) {
            return;
        }
        self.forget(key);
        self.make_room(1);
        self.slots.insert(
            key.clone(),
            Slot::InFlight {
                waiters: Vec::new(),
                args,
            },
        );
    }

    /// Waiters joined to the in-flight execution of `key` (0 if none).
    pub fn joiners(&self, key: &K) -> usize {
        match self.slots.get(key) {
            Some(Slot::InFlight { waiters, .. }) => waiters.len(),
            _ => 0,
        }
    }

    /// Removes and returns the first joined waiter matching `pred` (its client
    /// cancelled). The execution stays in flight.
    pub fn remove_waiter(&mut self, key: &K, pred: impl Fn(&W) -> bool) -> Option<W> {
        match self.slots.get_mut(key) {
            Some(Slot::InFlight { waiters, .. }) => {
                let i = waiters.iter().position(pred)?;
                Some(waiters.remove(i))
            }
            _ => None,
        }
    }

    /// The in-flight execution of `key` finished: returns its joined waiters
    /// (in join order) to answer. `store` is the result to keep until
    /// `now + ttl` and how it may be replayed; `None` (failures, results the
    /// client got for a keyless call) forgets the key. Not in flight: returns
    /// nothing and stores nothing.
    pub fn complete(&mut self, key: &K, store: Option<(String, Keep)>, now: Instant) -> Vec<W> {
        let Some((key, Slot::InFlight { waiters, args })) = self.take_in_flight(key) else {
            return Vec::new();
        };
        if let Some((result, keep)) = store {
            self.store(key, args, result, keep, now);
        }
        waiters
    }

    /// The in-flight execution of `key` ended without an outcome (it may
    /// have run; `mark` says why and since when): the key is marked until
    /// `now + ttl`, so that it does not run again. Returns its joined
    /// waiters. Not in flight: nothing.
    pub fn complete_unknown(&mut self, key: &K, mark: Mark, now: Instant) -> Vec<W> {
        let Some((key, Slot::InFlight { waiters, args })) = self.take_in_flight(key) else {
            return Vec::new();
        };
        self.purge_expired(now);
        if !self.ttl.is_zero() && self.max_entries > 0 {
            self.mark(key, args, mark, now);
        }
        waiters
    }

    /// Marks `key` until `now + ttl` (if a mark fits at all).
    fn mark(&mut self, key: K, args: u128, mark: Mark, now: Instant) {
        if ENTRY_BYTES > self.max_bytes {
            return;
        }
        self.make_room(1);
        self.make_room_for_bytes(ENTRY_BYTES);
        self.bytes += ENTRY_BYTES;
        let seq = self.next_seq;
        self.next_seq += 1;
        self.marked.insert(seq, key.clone());
        let expires = instant_add(now, self.ttl);
        self.slots.insert(
            key,
            Slot::Marked {
                mark,
                expires,
                seq,
                args,
            },
        );
    }

    /// A definite answer that is not kept (an error) came late for the
    /// execution marked `since` under `key`: its outcome is known now, and
    /// the mark is lifted. Anything else under `key` (a result, another
    /// execution's mark) stays.
    pub fn release(&mut self, key: &K, since: Instant) {
        if let Some(Slot::Marked {
            mark: Mark::Unknown { since: s, .. },
            ..
        }) = self.slots.get(key)
        {
            if *s == since {
                self.forget(key);
            }
        }
    }

    /// A success arrived for an execution that had already ended (the client
    /// got an error or cancelled): keep it to replay (replacing a mark),
    /// unless an identical execution is in flight again (its own answer
    /// will do).
    pub fn store_late(&mut self, key: K, args: u128, result: String, keep: Keep, now: Instant) {
        if let Some(Slot::InFlight { .. }) = self.slots.get(&key) {
            return;
        }
        self.forget(&key);
        self.store(key, args, result, keep, now);
    }

    fn store(&mut self, key: K, args: u128, result: String, keep: Keep, now: Instant) {
        self.purge_expired(now);
        let size = result.len() + ENTRY_BYTES;
        if self.ttl.is_zero() || self.max_entries == 0 {
            return;
        }
        if size > self.max_bytes {
            // An explicit key is one operation: it ran, even if its result
            // cannot be replayed.
            if keep == Keep::Always {
                self.mark(key, args, Mark::Ran { at: now }, now);
            }
            return;
        }
        self.make_room(1);
        self.make_room_for_bytes(size);
        self.bytes += size;
        let seq = self.next_seq;
        self.next_seq += 1;
        self.completed.insert(seq, key.clone());
        self.slots.insert(
            key,
            Slot::Done {
                result,
                expires: instant_add(now, self.ttl),
                seq,
                keep,
                args,
            },
        );
    }

    /// The execution of `key` ended without an outcome (e.g. its originator
    /// cancelled and nobody else wanted it): forgets it and returns its joined
    /// waiters, whom the caller may re-dispatch. Not in flight: nothing.
    pub fn abandon(&mut self, key: &K) -> Vec<W> {
        match self.take_in_flight(key) {
            Some((_, Slot::InFlight { waiters, .. })) => waiters,
            _ => Vec::new(),
        }
    }

    /// The mark that keeps `key` from running again, if any.
    pub fn mark_of(&self, key: &K) -> Option<Mark> {
        match self.slots.get(key) {
            Some(Slot::Marked { mark, .. }) => Some(*mark),
            _ => None,
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
    pub fn in_flight(&self, key: &K) -> bool {
        matches!(self.slots.get(key), Some(Slot::InFlight { .. }))
    }

    fn take_in_flight(&mut self, key: &K) -> Option<(K, Slot<W>)> {
        match self.slots.get(key) {
            Some(Slot::InFlight { .. }) => self.slots.remove_entry(key),
            _ => None,
        }
    }

    /// Removes `key` whatever its state; returns a completed result.
    fn forget(&mut self, key: &K) -> Option<String> {
        match self.slots.remove(key)? {
            Slot::Done { seq, result, .. } => {
                self.completed.remove(&seq);
                self.bytes -= result.len() + ENTRY_BYTES;
                Some(result)
            }
            Slot::Marked { seq, .. } => {
                self.marked.remove(&seq);
                self.bytes -= ENTRY_BYTES;
                None
            }
            Slot::InFlight { .. } => None,
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

    /// Evicts oldest completed entries until an entry of `extra` bytes fits.
    fn make_room_for_bytes(&mut self, extra: usize) {
        while self.bytes + extra > self.max_bytes {
            if !self.evict_oldest() {
                break;
            }
        }
    }

    /// Drops the oldest completed entry, or when there is none the oldest
    /// mark; false if there is neither.
    fn evict_oldest(&mut self) -> bool {
        let key = match self.completed.pop_first() {
            Some((_, key)) => key,
            None => match self.marked.pop_first() {
                Some((_, key)) => key,
                None => return false,
            },
        };
        match self.slots.remove(&key) {
            Some(Slot::Done { result, .. }) => self.bytes -= result.len() + ENTRY_BYTES,
            Some(Slot::Marked { .. }) => self.bytes -= ENTRY_BYTES,
            _ => {}
        }
        true
    }

    /// Drops completed entries and marks whose TTL is over. Each kind is
    /// made in order with one TTL, so it expires in order too.
    fn purge_expired(&mut self, now: Instant) {
        while let Some((_, key)) = self.completed.first_key_value() {
            match self.slots.get(key) {
                Some(Slot::Done { expires, .. }) if *expires > now => break,
                _ => {
                    self.evict_oldest();
                }
            }
        }
        while let Some((&seq, key)) = self.marked.first_key_value() {
            match self.slots.get(key) {
                Some(Slot::Marked { expires, .. }) if *expires > now => break,
                _ => {
                    let key = key.clone();
                    self.marked.remove(&seq);
                    self.forget_marked(&key);
                }
            }
        }
    }

    /// Removes the mark of `key`, if it has one.
    fn forget_marked(&mut self, key: &K) {
        if let Some(Slot::Marked { .. }) = self.slots.get(key) {
            self.slots.remove(key);
            self.bytes -= ENTRY_BYTES;
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_writes_what_the_formatter_writes() {
        let mut buf = [0; 32];
        for fp in [
            0,
            1,
            0xabc,
            u128::MAX,
            0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
        ] {
            assert_eq!(super::hex(fp, &mut buf), format!("{fp:032x}"));
        }
    }

    use super::*;

    const TTL: Duration = Duration::from_secs(300);
    const ARGS: u128 = 7;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    type Table = DedupTable<&'static str, u32>;

    fn table(max_entries: usize) -> Table {
        DedupTable::new(TTL, max_entries, usize::MAX)
    }

    /// Looks up (replay allowed) and, on Execute, starts; returns the lookup.
    fn call(t: &mut Table, key: &'static str, waiter: u32, now: Instant) -> Lookup<u32> {
        let l = t.lookup_or_join(&key, ARGS, waiter, true, now);
        if let Lookup::Execute(_) = l {
            t.start(&key, ARGS, now);
        }
        l
    }

    fn replay(result: &str, waiter: u32) -> Lookup<u32> {
        Lookup::Replay {
            result: result.to_string(),
            waiter,
            same_args: true,
        }
    }

    const JOINED: Lookup<u32> = Lookup::Joined { same_args: true };

    fn always(r: &str) -> Option<(String, Keep)> {
        Some((r.to_string(), Keep::Always))
    }

    #[test]
    fn fingerprints_separate_parts_and_keys() {
        let keys = std::collections::hash_map::RandomState::new();
        let fp = |parts: &[&str]| fingerprint(&keys, parts);
        assert_eq!(fp(&["call", "t", "{}"]), fp(&["call", "t", "{}"]));
        assert_ne!(fp(&["call", "ab", "c"]), fp(&["call", "a", "bc"]));
        assert_ne!(fp(&["key", "t", "k"]), fp(&["call", "t", "k"]));
        let other = std::collections::hash_map::RandomState::new();
        assert_ne!(fp(&["x"]), fingerprint(&other, &["x"]));
        let f = fp(&["x"]);
        assert_ne!(f >> 64, f & u128::from(u64::MAX), "two different halves");
    }

    #[test]
    fn json_fingerprints_ignore_member_order_and_white_space_only() {
        let keys = std::collections::hash_map::RandomState::new();
        let fp = |json: &str| fingerprint_json(&keys, &["call", "t"], json).unwrap();
        assert_eq!(
            fp(r#"{"a":1,"b":{"x":true,"y":[1,2]}}"#),
            fp(r#"{ "b" : {"y":[1,2],"x":true}, "a":1 }"#)
        );
        assert_ne!(fp(r#"{"a":1}"#), fp(r#"{"a":2}"#));
        assert_ne!(fp(r#"{"a":1.0}"#), fp(r#"{"a":1}"#), "numbers as written");
        assert_ne!(
            fp("{}"),
            fingerprint_json(&keys, &["call", "u"], "{}").unwrap(),
            "the parts count"
        );
        assert!(fingerprint_json(&keys, &[], "{").is_err());
    }

    #[test]
    fn concurrent_identical_calls_run_once() {
        let t0 = Instant::now();
        let mut t = table(100);
        assert_eq!(call(&mut t, "k", 1, t0), Lookup::Execute(1));
        assert!(t.in_flight(&"k"));
        assert_eq!(call(&mut t, "k", 2, t0), JOINED);
        assert_eq!(call(&mut t, "k", 3, t0 + secs(1)), JOINED);
        assert_eq!(t.joiners(&"k"), 2);
        // A different key is independent.
        assert_eq!(call(&mut t, "other", 4, t0), Lookup::Execute(4));
        assert_eq!(t.complete(&"k", always("R"), t0 + secs(2)), vec![2, 3]);
        assert!(!t.in_flight(&"k"));
        assert_eq!(t.joiners(&"k"), 0);
    }

    #[test]
    fn a_result_kept_always_is_replayed_until_the_ttl() {
        let t0 = Instant::now();
        let mut t = table(100);
        call(&mut t, "k", 1, t0);
        let done = t0 + secs(1);
        assert!(t.complete(&"k", always("R"), done).is_empty());
        assert_eq!(call(&mut t, "k", 2, done), replay("R", 2));
        assert_eq!(
            call(&mut t, "k", 3, done + TTL - Duration::from_millis(1)),
            replay("R", 3)
        );
        // At completion + TTL it has expired: execute again.
        assert_eq!(call(&mut t, "k", 4, done + TTL), Lookup::Execute(4));
        assert!(t.in_flight(&"k"));
    }

    #[test]
    fn a_result_kept_once_is_replayed_once_then_executes() {
        let t0 = Instant::now();
        let mut t = table(100);
        call(&mut t, "k", 1, t0);
        t.complete(&"k", Some(("R".into(), Keep::Once)), t0);
        assert_eq!(t.bytes, 1 + ENTRY_BYTES);
        assert_eq!(call(&mut t, "k", 2, t0), replay("R", 2));
        assert_eq!(t.bytes, 0, "handed over and forgotten");
        assert_eq!(call(&mut t, "k", 3, t0), Lookup::Execute(3));
    }

    #[test]
    fn a_delivered_keyless_result_is_not_kept() {
        let t0 = Instant::now();
        let mut t = table(100);
        call(&mut t, "k", 1, t0);
        assert_eq!(call(&mut t, "k", 2, t0), JOINED);
        assert_eq!(t.complete(&"k", None, t0), vec![2]);
        assert!(t.is_empty());
        assert_eq!(call(&mut t, "k", 3, t0), Lookup::Execute(3));
    }

    #[test]
    fn a_late_result_is_kept_unless_an_identical_call_runs_again() {
        let t0 = Instant::now();
        let mut t = table(100);
        call(&mut t, "k", 1, t0);
        // The client got an error; the execution is forgotten...
        t.complete(&"k", None, t0);
        // ...and its success arrives later.
        t.store_late("k", ARGS, "late".into(), Keep::Once, t0 + secs(1));
        assert_eq!(call(&mut t, "k", 2, t0 + secs(2)), replay("late", 2));
        // While an identical call is in flight, a late answer is not kept.
        assert_eq!(call(&mut t, "k", 3, t0 + secs(2)), Lookup::Execute(3));
        t.store_late("k", ARGS, "other".into(), Keep::Once, t0 + secs(3));
        assert!(t.in_flight(&"k"));
        assert_eq!(t.complete(&"k", None, t0 + secs(4)), Vec::<u32>::new());
        assert!(t.is_empty());
        // A late result replaces an older completed one.
        t.store_late("k", ARGS, "a".into(), Keep::Always, t0 + secs(5));
        t.store_late("k", ARGS, "bb".into(), Keep::Always, t0 + secs(6));
        assert_eq!(t.bytes, 2 + ENTRY_BYTES);
        assert_eq!(call(&mut t, "k", 4, t0 + secs(7)), replay("bb", 4));
    }

    #[test]
    fn replay_false_skips_completed_but_still_joins() {
        let t0 = Instant::now();
        let mut t = table(100);
        call(&mut t, "k", 1, t0);
        t.complete(&"k", always("R"), t0);
        assert_eq!(
            t.lookup_or_join(&"k", ARGS, 2, false, t0),
            Lookup::Execute(2)
        );
        t.start(&"k", ARGS, t0);
        assert!(t.in_flight(&"k"), "start replaces the completed entry");
        assert_eq!(t.len(), 1);
        assert_eq!(t.lookup_or_join(&"k", ARGS, 3, false, t0), JOINED);
        assert_eq!(t.complete(&"k", always("R2"), t0 + secs(1)), vec![3]);
        assert_eq!(call(&mut t, "k", 4, t0 + secs(1)), replay("R2", 4));
    }

    #[test]
    fn different_arguments_under_one_key_are_reported() {
        let t0 = Instant::now();
        let mut t = table(100);
        t.start(&"k", 1, t0);
        assert_eq!(
            t.lookup_or_join(&"k", 2, 9, true, t0),
            Lookup::Joined { same_args: false }
        );
        assert_eq!(
            t.lookup_or_join(&"k", 1, 10, true, t0),
            Lookup::Joined { same_args: true }
        );
        t.complete(&"k", always("R"), t0);
        assert_eq!(
            t.lookup_or_join(&"k", 2, 11, true, t0),
            Lookup::Replay {
                result: "R".into(),
                waiter: 11,
                same_args: false
            }
        );
    }

    #[test]
    fn start_twice_keeps_the_waiters() {
        let t0 = Instant::now();
        let mut t = table(100);
        call(&mut t, "k", 1, t0);
        call(&mut t, "k", 2, t0);
        t.start(&"k", ARGS, t0);
        assert_eq!(t.joiners(&"k"), 1);
    }

    #[test]
    fn remove_waiter_takes_one_joined_client_out() {
        let t0 = Instant::now();
        let mut t = table(100);
        call(&mut t, "k", 1, t0);
        call(&mut t, "k", 2, t0);
        call(&mut t, "k", 3, t0);
        assert_eq!(t.remove_waiter(&"k", |w| *w == 2), Some(2));
        assert_eq!(t.remove_waiter(&"k", |w| *w == 2), None);
        assert_eq!(t.remove_waiter(&"nope", |_| true), None);
        assert_eq!(t.joiners(&"k"), 1);
        assert!(t.in_flight(&"k"));
        assert_eq!(t.complete(&"k", always("R"), t0), vec![3]);
        assert_eq!(
            t.remove_waiter(&"k", |_| true),
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
        assert_eq!(t.abandon(&"k"), vec![2, 3]);
        assert!(t.is_empty());
        assert_eq!(call(&mut t, "k", 2, t0), Lookup::Execute(2));
        // Abandoning a completed or unknown key does nothing.
        t.complete(&"k", always("R"), t0);
        assert!(t.abandon(&"k").is_empty());
        assert!(t.abandon(&"nope").is_empty());
        assert_eq!(call(&mut t, "k", 5, t0), replay("R", 5));
    }

    #[test]
    fn complete_of_an_unknown_key_stores_nothing() {
        let t0 = Instant::now();
        let mut t = table(100);
        assert!(t.complete(&"k", always("R"), t0).is_empty());
        assert!(t.is_empty());
        // Completing twice: the second is ignored and does not replace.
        call(&mut t, "k", 1, t0);
        t.complete(&"k", always("R"), t0);
        assert!(t.complete(&"k", always("X"), t0).is_empty());
        assert_eq!(call(&mut t, "k", 2, t0), replay("R", 2));
    }

    #[test]
    fn zero_ttl_never_replays() {
        let t0 = Instant::now();
        let mut t: Table = DedupTable::new(Duration::ZERO, 100, usize::MAX);
        call(&mut t, "k", 1, t0);
        assert_eq!(call(&mut t, "k", 2, t0), JOINED);
        assert_eq!(t.complete(&"k", always("R"), t0), vec![2]);
        assert!(t.is_empty());
        t.store_late("k", ARGS, "late".into(), Keep::Once, t0);
        assert!(t.is_empty());
        assert_eq!(call(&mut t, "k", 3, t0), Lookup::Execute(3));
    }

    #[test]
    fn the_bound_evicts_oldest_completed_first() {
        let t0 = Instant::now();
        let mut t = table(3);
        for (i, k) in ["a", "b", "c"].into_iter().enumerate() {
            call(&mut t, k, 0, t0);
            t.complete(&k, always(&k.to_uppercase()), t0 + secs(i as u64));
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
    fn the_byte_bound_counts_results_and_entries() {
        let t0 = Instant::now();
        let mut t: Table = DedupTable::new(TTL, 100, 2 * ENTRY_BYTES + 10);
        for k in ["a", "b", "c"] {
            call(&mut t, k, 0, t0);
            t.complete(&k, always(&k.repeat(4)), t0);
        }
        // Three entries of 4 bytes do not fit: "a" went when "c" came.
        assert_eq!(t.bytes, 2 * (4 + ENTRY_BYTES));
        assert_eq!(call(&mut t, "b", 1, t0), replay("bbbb", 1));
        assert_eq!(call(&mut t, "a", 2, t0), Lookup::Execute(2));
        // An entry over the bound is not kept, and evicts nothing.
        call(&mut t, "big", 0, t0);
        let big = "x".repeat(ENTRY_BYTES + 11);
        t.complete(&"big", Some((big, Keep::Once)), t0);
        assert_eq!(call(&mut t, "big", 3, t0), Lookup::Execute(3));
        assert_eq!(call(&mut t, "c", 4, t0), replay("cccc", 4));
        // Re-executing a completed key gives its bytes back.
        t.start(&"c", ARGS, t0);
        assert_eq!(t.bytes, 4 + ENTRY_BYTES);
        // Expiry too.
        t.purge_expired(t0 + TTL + secs(1));
        assert_eq!(t.bytes, 0);
    }

    #[test]
    fn many_empty_results_are_bounded_by_bytes() {
        // Small results still cost their entries: 1 000 of them do not fit
        // in 10 entries' worth of bytes.
        let t0 = Instant::now();
        let mut t: DedupTable<u32, u32> = DedupTable::new(TTL, usize::MAX, 10 * ENTRY_BYTES);
        for k in 0..1000 {
            t.start(&k, 0, t0);
            t.complete(&k, Some((String::new(), Keep::Always)), t0);
        }
        assert_eq!(t.len(), 10);
        assert_eq!(t.bytes, 10 * ENTRY_BYTES);
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
        assert!(t.in_flight(&"a") && t.in_flight(&"b") && t.in_flight(&"c"));
        assert_eq!(t.joiners(&"a"), 1);
        // Completing "a" while over the bound: it can only fit by evicting
        // completed entries, and there are none, so it is still stored.
        assert_eq!(t.complete(&"a", always("A"), t0), vec![10]);
        assert_eq!(t.len(), 3);
        // The next start evicts completed "a", never "b" or "c".
        call(&mut t, "d", 4, t0);
        assert!(t.in_flight(&"b") && t.in_flight(&"c") && t.in_flight(&"d"));
        assert_eq!(
            t.lookup_or_join(&"a", ARGS, 5, true, t0),
            Lookup::Execute(5)
        );
    }

    #[test]
    fn zero_max_entries_still_coalesces_in_flight_calls() {
        let t0 = Instant::now();
        let mut t = table(0);
        call(&mut t, "k", 1, t0);
        assert_eq!(call(&mut t, "k", 2, t0), JOINED);
        assert_eq!(t.complete(&"k", always("R"), t0), vec![2]);
        assert!(t.is_empty());
    }

    fn mark(since: Instant) -> Mark {
        Mark::Unknown {
            cause: "timeout",
            since,
        }
    }

    fn marked(m: Mark, waiter: u32) -> Lookup<u32> {
        Lookup::Marked {
            mark: m,
            waiter,
            same_args: true,
        }
    }

    #[test]
    fn an_unknown_outcome_marks_the_key_until_the_ttl() {
        let t0 = Instant::now();
        let mut t = table(100);
        call(&mut t, "k", 1, t0);
        assert_eq!(call(&mut t, "k", 2, t0), JOINED);
        let ended = t0 + secs(1);
        assert_eq!(t.complete_unknown(&"k", mark(t0), ended), vec![2]);
        assert!(!t.in_flight(&"k"));
        assert_eq!(t.bytes, ENTRY_BYTES);
        // Not run again, whatever the arguments, and not forgotten by asking.
        assert_eq!(call(&mut t, "k", 3, ended), marked(mark(t0), 3));
        assert_eq!(
            t.lookup_or_join(&"k", ARGS + 1, 4, false, ended + TTL - secs(1)),
            Lookup::Marked {
                mark: mark(t0),
                waiter: 4,
                same_args: false
            }
        );
        // Another key runs.
        assert_eq!(call(&mut t, "other", 5, ended), Lookup::Execute(5));
        // At the mark + TTL it has expired: the key runs again.
        assert_eq!(call(&mut t, "k", 6, ended + TTL), Lookup::Execute(6));
        assert!(t.in_flight(&"k"));
        assert_eq!(t.bytes, 0);
    }

    #[test]
    fn complete_unknown_of_a_key_not_in_flight_marks_nothing() {
        let t0 = Instant::now();
        let mut t = table(100);
        assert!(t.complete_unknown(&"k", mark(t0), t0).is_empty());
        assert!(t.is_empty());
        call(&mut t, "k", 1, t0);
        t.complete(&"k", always("R"), t0);
        assert!(t.complete_unknown(&"k", mark(t0), t0).is_empty());
        assert_eq!(call(&mut t, "k", 2, t0), replay("R", 2));
    }

    #[test]
    fn a_late_success_replaces_a_mark_and_a_late_error_lifts_it() {
        let t0 = Instant::now();
        let mut t = table(100);
        call(&mut t, "k", 1, t0);
        t.complete_unknown(&"k", mark(t0), t0 + secs(1));
        t.store_late("k", ARGS, "late".into(), Keep::Always, t0 + secs(2));
        assert_eq!(t.bytes, 4 + ENTRY_BYTES);
        assert_eq!(call(&mut t, "k", 2, t0 + secs(3)), replay("late", 2));
        assert_eq!(call(&mut t, "k", 3, t0 + secs(3)), replay("late", 3));
        // A release leaves a result alone...
        t.release(&"k", t0);
        assert_eq!(call(&mut t, "k", 4, t0 + secs(3)), replay("late", 4));
        // ...and lifts a mark: the key runs again.
        call(&mut t, "m", 5, t0);
        t.complete_unknown(&"m", mark(t0), t0);
        t.release(&"m", t0 + secs(1));
        assert_eq!(call(&mut t, "m", 7, t0), marked(mark(t0), 7), "another's");
        t.release(&"m", t0);
        assert_eq!(t.bytes, 4 + ENTRY_BYTES);
        assert_eq!(call(&mut t, "m", 6, t0), Lookup::Execute(6));
        // An in-flight execution is no mark either.
        t.release(&"m", t0);
        assert!(t.in_flight(&"m"));
    }

    #[test]
    fn marks_are_evicted_only_when_no_result_is_left() {
        let t0 = Instant::now();
        let mut t = table(3);
        call(&mut t, "m", 0, t0);
        t.complete_unknown(&"m", mark(t0), t0);
        for k in ["a", "b"] {
            call(&mut t, k, 0, t0 + secs(1));
            t.complete(&k, always("R"), t0 + secs(1));
        }
        // Full: new executions evict the results, older or not, first.
        call(&mut t, "c", 0, t0 + secs(2));
        call(&mut t, "d", 0, t0 + secs(2));
        assert_eq!(call(&mut t, "m", 1, t0 + secs(2)), marked(mark(t0), 1));
        assert_eq!(t.len(), 3);
        // With only marks and executions left, the mark goes.
        call(&mut t, "e", 0, t0 + secs(2));
        assert_eq!(call(&mut t, "m", 2, t0 + secs(2)), Lookup::Execute(2));
        assert_eq!(t.bytes, 0);
    }

    #[test]
    fn a_keyed_success_too_large_to_keep_marks_the_key_as_ran() {
        let t0 = Instant::now();
        let mut t: Table = DedupTable::new(TTL, 100, 2 * ENTRY_BYTES);
        call(&mut t, "k", 1, t0);
        assert_eq!(call(&mut t, "k", 2, t0), JOINED);
        let big = "x".repeat(ENTRY_BYTES + 1);
        let done = t0 + secs(1);
        assert_eq!(t.complete(&"k", always(&big), done), vec![2]);
        assert_eq!(t.bytes, ENTRY_BYTES);
        let ran = Mark::Ran { at: done };
        assert_eq!(call(&mut t, "k", 3, done), marked(ran, 3));
        // Not lifted by a late error, replaced by a late success that fits.
        t.release(&"k", t0);
        t.release(&"k", done);
        assert_eq!(call(&mut t, "k", 4, done), marked(ran, 4));
        t.store_late("k", ARGS, "R".into(), Keep::Always, done);
        assert_eq!(call(&mut t, "k", 5, done), replay("R", 5));
        // Too large for a keyless call: simply not kept.
        call(&mut t, "once", 6, t0);
        t.complete(&"once", Some((big, Keep::Once)), done);
        assert_eq!(call(&mut t, "once", 7, done), Lookup::Execute(7));
        // Expired with the TTL.
        assert_eq!(call(&mut t, "k", 8, done + TTL), Lookup::Execute(8));
    }

    #[test]
    fn zero_ttl_marks_nothing() {
        let t0 = Instant::now();
        let mut t: Table = DedupTable::new(Duration::ZERO, 100, usize::MAX);
        call(&mut t, "k", 1, t0);
        assert_eq!(call(&mut t, "k", 2, t0), JOINED);
        assert_eq!(t.complete_unknown(&"k", mark(t0), t0), vec![2]);
        assert!(t.is_empty());
        assert_eq!(call(&mut t, "k", 3, t0), Lookup::Execute(3));
    }

    #[test]
    fn expired_entries_are_purged() {
        let t0 = Instant::now();
        let mut t = table(100);
        for (i, k) in ["a", "b"].into_iter().enumerate() {
            call(&mut t, k, 0, t0);
            t.complete(&k, always("R"), t0 + secs(i as u64 * 100));
        }
        call(&mut t, "live", 0, t0);
        assert_eq!(t.len(), 3);
        // "a" expires at 300 s, "b" at 400 s; the in-flight entry stays.
        t.start(&"x", ARGS, t0 + secs(300));
        assert_eq!(t.len(), 3);
        t.start(&"y", ARGS, t0 + secs(400));
        assert_eq!(t.len(), 3);
        assert!(t.in_flight(&"live") && t.in_flight(&"x") && t.in_flight(&"y"));
    }
}
