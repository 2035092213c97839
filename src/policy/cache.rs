//! Result cache: TTL cache of successful `tools/call` results.
//!
//! Owns freshness, stale serving (`stale_if_error`) and the bounds
//! (`max_entries`, `max_bytes`, least recently used evicted first). It must not
//! know how keys are built (the caller passes tool name + "\0" + canonical
//! arguments), what a result means, or which tools may be cached beyond their
//! TTL; values are opaque raw JSON text. No clock reads: `now` is a parameter.
//!
//! An entry inserted at `t` with `ttl` is fresh while `now < t + ttl`, then
//! stale; it is kept (for [`ResultCache::get_stale`]) while
//! `now < t + ttl + stale_if_error`, then purged. Capacity evicts the least
//! recently used entries (fresh or stale) first.
//!
//! [`ResultCache::clear`] empties it (stale entries too) and starts a new
//! epoch, so a caller can tell whether a clear happened while it computed a
//! value (a read that overlapped a write) and then not store it.

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::instant_add;
use crate::config::CacheConfig;
use crate::fasthash::FastMap;

#[derive(Debug)]
struct Entry {
    value: String,
    expires: Instant,
    /// `expires + stale_if_error`: purged from here on.
    dead_at: Instant,
    /// Key in `recency`; bumped on every hit.
    last_used: u64,
    /// Key (with `dead_at`) in `deaths`; fixed at insertion.
    id: u64,
}

#[derive(Debug)]
pub struct ResultCache {
    default_ttl: Duration,
    tool_ttls: HashMap<String, Duration>,
    max_entries: usize,
    max_bytes: usize,
    stale_if_error: Duration,
    entries: FastMap<Arc<str>, Entry>,
    /// Least recently used first.
    recency: BTreeMap<u64, Arc<str>>,
    /// Soonest to die first.
    deaths: BTreeMap<(Instant, u64), Arc<str>>,
    /// Sum of key and value lengths of all entries.
    bytes: usize,
    clock: u64,
    /// Clears so far.
    epoch: u64,
}

impl ResultCache {
    pub fn new(c: &CacheConfig) -> Self {
        Self {
            default_ttl: c.default_ttl,
            tool_ttls: c.tools.clone(),
            max_entries: c.max_entries,
            max_bytes: c.max_bytes,
            stale_if_error: c.stale_if_error,
            entries: FastMap::default(),
            recency: BTreeMap::new(),
            epoch: 0,
            deaths: BTreeMap::new(),
            bytes: 0,
            clock: 0,
        }
    }

    /// `cache.tools[tool]`, else `default_ttl`. Zero means "don't cache".
    pub fn ttl_for(&self, tool: &str) -> Duration {
        self.tool_ttls
            .get(tool)
            .copied()
            .unwrap_or(self.default_ttl)
    }

    /// The fresh value under `key`, marking it recently used.
    pub fn get(&mut self, key: &str, now: Instant) -> Option<&str> {
        self.lookup(key, now, |e| now < e.expires)
    }

    /// The value under `key` if it is fresh or stale for less than
    /// `stale_if_error` (an error fallback), marking it recently used. With
    /// `stale_if_error` zero this is [`ResultCache::get`].
    pub fn get_stale(&mut self, key: &str, now: Instant) -> Option<&str> {
        self.lookup(key, now, |e| now < e.dead_at)
    }

    /// Stores `value` under `key` for `ttl`, replacing any entry and evicting
    /// least recently used entries to fit. No-op if `ttl` is zero. A value
    /// whose key + value exceed `max_bytes` (or any value when `max_entries`
    /// is 0) is not stored, and the older entry under `key`, if any, is
    /// removed rather than left to outlive the newer result.
    pub fn insert(&mut self, key: String, value: String, ttl: Duration, now: Instant) {
        if ttl.is_zero() {
            return;
        }
        self.remove(&key);
        self.purge_dead(now);
        let size = key.len().saturating_add(value.len());
        if size > self.max_bytes || self.max_entries == 0 {
            return;
        }
        while self.entries.len() >= self.max_entries || self.bytes + size > self.max_bytes {
            let Some((_, oldest)) = self.recency.pop_first() else {
                break;
            };
            self.remove(&oldest);
        }
        let expires = instant_add(now, ttl);
        let dead_at = instant_add(expires, self.stale_if_error);
        let id = self.tick();
        let key: Arc<str> = key.into();
        self.recency.insert(id, Arc::clone(&key));
        self.deaths.insert((dead_at, id), Arc::clone(&key));
        self.bytes += size;
        self.entries.insert(
            key,
            Entry {
                value,
                expires,
                dead_at,
                last_used: id,
                id,
            },
        );
    }

    /// Changes at every [`ResultCache::clear`].
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Forgets every entry, stale ones included, and starts a new epoch.
    pub fn clear(&mut self) {
        self.epoch += 1;
        if self.entries.is_empty() && self.recency.is_empty() && self.deaths.is_empty() {
            // Every call of a tool that may write clears it: an empty cache
            // costs that call nothing more.
            return;
        }
        self.entries.clear();
        self.recency.clear();
        self.deaths.clear();
        self.bytes = 0;
    }

    /// Entries held, stale ones included.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Sum of key and value lengths held.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    fn lookup(&mut self, key: &str, now: Instant, usable: impl Fn(&Entry) -> bool) -> Option<&str> {
        self.purge_dead(now);
        let tick = self.tick();
        let entry = self.entries.get_mut(key)?;
        if !usable(entry) {
            return None;
        }
        if let Some(k) = self.recency.remove(&entry.last_used) {
            self.recency.insert(tick, k);
        }
        entry.last_used = tick;
        Some(entry.value.as_str())
    }

    /// Drops entries stale for `stale_if_error` or longer.
    fn purge_dead(&mut self, now: Instant) {
        while let Some(((dead_at, _), _)) = self.deaths.first_key_value() {
            if *dead_at > now {
                break;
            }
            if let Some((_, key)) = self.deaths.pop_first() {
                self.remove(&key);
            }
        }
    }

    fn remove(&mut self, key: &str) {
        if let Some((key, entry)) = self.entries.remove_entry(key) {
            self.recency.remove(&entry.last_used);
            self.deaths.remove(&(entry.dead_at, entry.id));
            self.bytes -= key.len() + entry.value.len();
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn config(max_entries: usize, max_bytes: usize, stale_if_error: Duration) -> CacheConfig {
        CacheConfig {
            default_ttl: secs(60),
            tools: HashMap::from([
                ("slow".to_string(), secs(600)),
                ("off".to_string(), Duration::ZERO),
            ]),
            max_entries,
            max_bytes,
            stale_if_error,
        }
    }

    fn cache() -> ResultCache {
        ResultCache::new(&config(100, 1 << 20, Duration::ZERO))
    }

    fn put(c: &mut ResultCache, key: &str, value: &str, ttl: Duration, now: Instant) {
        c.insert(key.to_string(), value.to_string(), ttl, now);
    }

    fn get(c: &mut ResultCache, key: &str, now: Instant) -> Option<String> {
        c.get(key, now).map(str::to_string)
    }

    fn get_stale(c: &mut ResultCache, key: &str, now: Instant) -> Option<String> {
        c.get_stale(key, now).map(str::to_string)
    }

    #[test]
    fn clear_forgets_stale_entries_and_starts_an_epoch() {
        let t0 = Instant::now();
        let mut c = ResultCache::new(&config(10, 1 << 20, secs(60)));
        let before = c.epoch();
        put(&mut c, "k", "old", secs(1), t0);
        assert_eq!(c.epoch(), before, "inserts do not change the epoch");
        c.clear();
        assert_ne!(c.epoch(), before);
        assert_eq!(get_stale(&mut c, "k", t0 + secs(2)), None);
        assert!(c.is_empty());
    }

    #[test]
    fn ttl_for_uses_per_tool_then_default() {
        let c = cache();
        assert_eq!(c.ttl_for("slow"), secs(600));
        assert_eq!(c.ttl_for("off"), Duration::ZERO);
        assert_eq!(c.ttl_for("other"), secs(60));
        let mut none = config(10, 100, Duration::ZERO);
        none.default_ttl = Duration::ZERO;
        none.tools.clear();
        assert_eq!(ResultCache::new(&none).ttl_for("x"), Duration::ZERO);
    }

    #[test]
    fn fresh_until_the_ttl_then_gone() {
        let t0 = Instant::now();
        let mut c = cache();
        assert_eq!(get(&mut c, "k", t0), None);
        put(&mut c, "k", "v", secs(10), t0);
        assert_eq!(get(&mut c, "k", t0), Some("v".into()));
        assert_eq!(
            get(&mut c, "k", t0 + Duration::from_millis(9_999)),
            Some("v".into())
        );
        assert_eq!(get(&mut c, "k", t0 + secs(10)), None);
        // stale_if_error is zero: purged at expiry.
        assert_eq!(get_stale(&mut c, "k", t0 + secs(10)), None);
        assert_eq!(c.len(), 0);
        assert_eq!(c.bytes(), 0);
    }

    #[test]
    fn zero_ttl_is_a_no_op() {
        let t0 = Instant::now();
        let mut c = cache();
        let ttl = c.ttl_for("off");
        put(&mut c, "off\0{}", "v", ttl, t0);
        assert_eq!(get(&mut c, "off\0{}", t0), None);
        assert!(c.is_empty());
    }

    #[test]
    fn per_tool_ttls_apply() {
        let t0 = Instant::now();
        let mut c = cache();
        let (slow, other) = (c.ttl_for("slow"), c.ttl_for("other"));
        put(&mut c, "slow\0{}", "a", slow, t0);
        put(&mut c, "other\0{}", "b", other, t0);
        let t1 = t0 + secs(120);
        assert_eq!(get(&mut c, "slow\0{}", t1), Some("a".into()));
        assert_eq!(get(&mut c, "other\0{}", t1), None);
    }

    #[test]
    fn insert_replaces() {
        let t0 = Instant::now();
        let mut c = cache();
        put(&mut c, "k", "old", secs(10), t0);
        put(&mut c, "k", "newer", secs(10), t0 + secs(5));
        assert_eq!(c.len(), 1);
        assert_eq!(c.bytes(), "k".len() + "newer".len());
        // The replacement has its own TTL.
        assert_eq!(get(&mut c, "k", t0 + secs(12)), Some("newer".into()));
        assert_eq!(get(&mut c, "k", t0 + secs(15)), None);
    }

    #[test]
    fn stale_is_served_within_stale_if_error_only() {
        let t0 = Instant::now();
        let mut c = ResultCache::new(&config(100, 1 << 20, secs(30)));
        put(&mut c, "k", "v", secs(10), t0);
        // Fresh: both getters serve it.
        assert_eq!(get_stale(&mut c, "k", t0 + secs(1)), Some("v".into()));
        // Expired: get misses but the entry is kept.
        assert_eq!(get(&mut c, "k", t0 + secs(10)), None);
        assert_eq!(c.len(), 1);
        assert_eq!(get_stale(&mut c, "k", t0 + secs(10)), Some("v".into()));
        assert_eq!(get_stale(&mut c, "k", t0 + secs(39)), Some("v".into()));
        // Stale for 30 s: gone.
        assert_eq!(get_stale(&mut c, "k", t0 + secs(40)), None);
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn dead_entries_are_purged_by_any_call() {
        let t0 = Instant::now();
        let mut c = ResultCache::new(&config(100, 1 << 20, secs(5)));
        put(&mut c, "a", "1", secs(10), t0);
        put(&mut c, "b", "2", secs(100), t0);
        assert_eq!(get(&mut c, "b", t0 + secs(14)), Some("2".into()));
        assert_eq!(c.len(), 2, "a is stale but kept");
        assert_eq!(get(&mut c, "b", t0 + secs(15)), Some("2".into()));
        assert_eq!(c.len(), 1, "a died");
        assert_eq!(c.bytes(), 2);
    }

    #[test]
    fn lru_eviction_by_entries() {
        let t0 = Instant::now();
        let mut c = ResultCache::new(&config(3, 1 << 20, Duration::ZERO));
        put(&mut c, "a", "1", secs(60), t0);
        put(&mut c, "b", "2", secs(60), t0);
        put(&mut c, "c", "3", secs(60), t0);
        // Using "a" makes "b" the least recently used.
        assert!(get(&mut c, "a", t0).is_some());
        put(&mut c, "d", "4", secs(60), t0);
        assert_eq!(c.len(), 3);
        assert_eq!(get(&mut c, "b", t0), None);
        for k in ["a", "c", "d"] {
            assert!(get(&mut c, k, t0).is_some(), "{k}");
        }
        // Now "a" is the oldest use.
        put(&mut c, "e", "5", secs(60), t0);
        assert_eq!(get(&mut c, "a", t0), None);
    }

    #[test]
    fn stale_hits_bump_recency_too() {
        let t0 = Instant::now();
        let mut c = ResultCache::new(&config(2, 1 << 20, secs(60)));
        put(&mut c, "a", "1", secs(1), t0);
        put(&mut c, "b", "2", secs(60), t0);
        assert!(get_stale(&mut c, "a", t0 + secs(2)).is_some());
        put(&mut c, "c", "3", secs(60), t0 + secs(2));
        assert!(get_stale(&mut c, "a", t0 + secs(2)).is_some());
        assert_eq!(get(&mut c, "b", t0 + secs(2)), None);
    }

    #[test]
    fn misses_do_not_bump_recency() {
        let t0 = Instant::now();
        let mut c = ResultCache::new(&config(2, 1 << 20, secs(60)));
        put(&mut c, "a", "1", secs(1), t0);
        put(&mut c, "b", "2", secs(60), t0);
        // A fresh-only lookup of the stale "a" misses and leaves it oldest.
        assert_eq!(get(&mut c, "a", t0 + secs(2)), None);
        put(&mut c, "c", "3", secs(60), t0 + secs(2));
        assert_eq!(get_stale(&mut c, "a", t0 + secs(2)), None);
        assert!(get(&mut c, "b", t0 + secs(2)).is_some());
    }

    #[test]
    fn lru_eviction_by_bytes() {
        let t0 = Instant::now();
        // Each entry is 1 + 9 = 10 bytes.
        let mut c = ResultCache::new(&config(100, 30, Duration::ZERO));
        put(&mut c, "a", "111111111", secs(60), t0);
        put(&mut c, "b", "222222222", secs(60), t0);
        put(&mut c, "c", "333333333", secs(60), t0);
        assert_eq!(c.bytes(), 30);
        assert!(get(&mut c, "a", t0).is_some());
        // 15 bytes: needs two evictions (b, then c).
        put(&mut c, "d", "44444444444444", secs(60), t0);
        assert_eq!(c.bytes(), 25);
        assert_eq!(c.len(), 2);
        assert!(get(&mut c, "a", t0).is_some());
        assert!(get(&mut c, "d", t0).is_some());
        assert_eq!(get(&mut c, "b", t0), None);
        assert_eq!(get(&mut c, "c", t0), None);
    }

    #[test]
    fn oversized_values_are_not_stored_and_drop_the_old_entry() {
        let t0 = Instant::now();
        let mut c = ResultCache::new(&config(100, 10, secs(60)));
        put(&mut c, "k", "123456789", secs(1), t0); // exactly 10 bytes: fits
        assert_eq!(c.len(), 1);
        put(&mut c, "j", "x", secs(60), t0); // evicts k to fit
        assert_eq!(c.len(), 1);
        put(&mut c, "j", "1234567890", secs(60), t0); // 11 bytes: not stored
        assert_eq!(
            get_stale(&mut c, "j", t0),
            None,
            "the old value must not survive"
        );
        assert!(c.is_empty());
        assert_eq!(c.bytes(), 0);
    }

    #[test]
    fn zero_max_entries_stores_nothing() {
        let t0 = Instant::now();
        let mut c = ResultCache::new(&config(0, 1000, Duration::ZERO));
        put(&mut c, "k", "v", secs(60), t0);
        assert!(c.is_empty());
    }

    #[test]
    fn clear_empties_everything() {
        let t0 = Instant::now();
        let mut c = ResultCache::new(&config(100, 1000, secs(60)));
        put(&mut c, "a", "1", secs(60), t0);
        put(&mut c, "b", "2", secs(1), t0);
        c.clear();
        assert!(c.is_empty());
        assert_eq!(c.bytes(), 0);
        assert_eq!(get(&mut c, "a", t0), None);
        assert_eq!(get_stale(&mut c, "b", t0 + secs(2)), None);
        // Still usable afterwards.
        put(&mut c, "a", "3", secs(60), t0);
        assert_eq!(get(&mut c, "a", t0), Some("3".into()));
    }

    #[test]
    fn indexes_stay_consistent_under_churn() {
        let t0 = Instant::now();
        let mut c = ResultCache::new(&config(8, 200, secs(3)));
        let mut rng = fastrand::Rng::with_seed(17);
        for step in 0..5000u64 {
            let now = t0 + Duration::from_millis(step * 10);
            let key = format!("k{}", rng.u8(..20));
            match rng.u8(..3) {
                0 => {
                    let value = "v".repeat(rng.usize(..40));
                    c.insert(key, value, Duration::from_millis(rng.u64(..5000)), now);
                }
                1 => {
                    c.get(&key, now);
                }
                _ => {
                    c.get_stale(&key, now);
                }
            }
            assert!(c.len() <= 8 && c.bytes() <= 200);
            assert_eq!(c.recency.len(), c.len());
            assert_eq!(c.deaths.len(), c.len());
            let sum: usize = c.entries.iter().map(|(k, e)| k.len() + e.value.len()).sum();
            assert_eq!(sum, c.bytes());
        }
    }
}
