//! The one store of what the proxy did for `tools/call`, per tool:
//! counters, failures by reason, the latency histogram and the last error,
//! plus the breaker's transitions and the restarts. The dispatcher's calls
//! keep it; the summary line logged at exit, the `--stats-file` JSON,
//! `mcp-retry status` and the OpenTelemetry metrics are each a view of it.
//!
//! Plain data: no clock (instants are given), no I/O. The file is written
//! by the `stats-writer` thread ([`spawn_writer`]), atomically (a
//! temporary file renamed over the target), so the dispatcher never does
//! file I/O.

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use crate::otel::record::Histogram as Buckets;
use crate::status::histogram::Histogram;

/// Counters for one tool.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ToolStats {
    /// Client calls received.
    pub calls: u64,
    /// Attempts sent to the server (first attempts and retries).
    pub attempts: u64,
    /// Attempts after a call's first.
    pub retries: u64,
    /// Calls that needed at least one retry.
    pub retried: u64,
    /// Retried calls that ended with a result.
    pub recovered: u64,
    /// Calls answered with an error.
    pub failed: u64,
    pub cache_hits: u64,
    pub dedup_hits: u64,
}

impl ToolStats {
    fn add(&mut self, o: &ToolStats) {
        self.calls += o.calls;
        self.attempts += o.attempts;
        self.retries += o.retries;
        self.retried += o.retried;
        self.recovered += o.recovered;
        self.failed += o.failed;
        self.cache_hits += o.cache_hits;
        self.dedup_hits += o.dedup_hits;
    }
}

/// How long the calls the server was asked to handle took, from arrival
/// to answer: one record per call, kept in two bucketings, the fine
/// log-linear one of `status` (p50, p95) and the OpenTelemetry one
/// (`otel::record::LATENCY_BOUNDS`, exact at each bound).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Latency {
    fine: Histogram,
    exported: Buckets,
}

impl Latency {
    pub fn record(&mut self, d: Duration) {
        self.fine.record(d);
        self.exported.record(d.as_secs_f64());
    }

    /// Adds `other`'s records.
    pub fn merge(&mut self, other: &Latency) {
        self.fine.merge(&other.fine);
        for (a, b) in self.exported.counts.iter_mut().zip(&other.exported.counts) {
            *a += b;
        }
        self.exported.count += other.exported.count;
        self.exported.sum += other.exported.sum;
    }

    pub fn count(&self) -> u64 {
        self.fine.count()
    }

    pub fn sum(&self) -> Duration {
        self.fine.sum()
    }

    pub fn quantile(&self, q: f64) -> Option<Duration> {
        self.fine.quantile(q)
    }

    /// The OpenTelemetry histogram.
    pub fn exported(&self) -> &Buckets {
        &self.exported
    }
}

/// Everything kept for one tool.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolFigures {
    pub counters: ToolStats,
    /// Failed calls by reason: the proxy's `Reason`, or `server_error`.
    pub failed_by_reason: BTreeMap<&'static str, u64>,
    pub latency: Latency,
    /// The last error's message, and when.
    pub last_error: Option<(String, Instant)>,
}

impl ToolFigures {
    fn add(&mut self, o: &ToolFigures) {
        self.counters.add(&o.counters);
        for (reason, n) in &o.failed_by_reason {
            *self.failed_by_reason.entry(reason).or_default() += n;
        }
        self.latency.merge(&o.latency);
        if o.last_error.as_ref().map(|e| e.1) > self.last_error.as_ref().map(|e| e.1) {
            self.last_error.clone_from(&o.last_error);
        }
    }
}

/// The most tool names kept figures of their own (the names come from
/// the client): the calls of any further name are counted together under
/// [`OTHER_TOOLS`].
pub const MAX_TOOL_NAMES: usize = 1000;
/// Where the calls of the names past [`MAX_TOOL_NAMES`] are counted.
pub const OTHER_TOOLS: &str = "(other tools)";

/// The most unknown outcomes kept for `status`, newest first.
pub const MAX_UNKNOWN: usize = 32;
/// The most characters of an idempotency key kept for `status`.
pub const MAX_KEY_CHARS: usize = 200;

/// A keyed call that may have run without an outcome, whose key is not
/// run again until `until`: shown by `status` so that a person can check
/// whether it took effect.
#[derive(Debug, Clone, PartialEq)]
pub struct UnknownOutcome {
    pub tool: String,
    /// The client's idempotency key (at most [`MAX_KEY_CHARS`]).
    pub key: String,
    pub started: Instant,
    /// What ended it (`timeout`, `server_exited`, …).
    pub cause: &'static str,
    pub until: Instant,
    /// The key's fingerprint in the idempotency table.
    pub fingerprint: u128,
}

/// What the store of idempotency keys did for this process's keyed calls,
/// and which store it is.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct StoreFigures {
    /// The store asked for (`local`), once the store thread is started;
    /// `None` with `store: memory`.
    pub wanted: Option<&'static str>,
    /// How it opened: the engine's health, or why it could not (`None`
    /// while it opens).
    pub opened: Option<Result<crate::store::Health, String>>,
    /// Requests handed to the store (claims and outcomes).
    pub operations: u64,
    /// Keyed calls answered with a result the store kept.
    pub replays: u64,
    /// Keyed calls that waited for an identical call running in another
    /// process (twins).
    pub waits: u64,
    /// Keyed calls not run because an earlier call's outcome is unknown.
    pub unknown_answers: u64,
    /// A shared store's key prefix and this server's scope, for `status`
    /// to read the scope's unknown outcomes (`None` for a store of the
    /// host's own).
    pub shared_scope: Option<(String, [u8; 32])>,
    /// A shared store's `store_ca_file` (an absolute path), for `status`
    /// to read it with that CA.
    pub ca_file: Option<String>,
    /// During an outage of the shared store, what keyed calls do
    /// meanwhile.
    pub outage: Option<String>,
}

impl StoreFigures {
    /// `opening`, `opened`, `fell_back` (this process's memory instead)
    /// or `failed`; `memory` without a store; `outage` while a shared
    /// store is unreachable (keyed calls follow `store_unavailable`).
    pub fn state(&self) -> &'static str {
        if self.outage.is_some() {
            return "outage";
        }
        match (self.wanted, &self.opened) {
            (None, _) => "memory",
            (Some(_), None) => "opening",
            (Some(w), Some(Ok(h))) if h.engine != w => "fell_back",
            (Some(_), Some(Ok(_))) => "opened",
            (Some(_), Some(Err(_))) => "failed",
        }
    }

    /// The engine in use.
    pub fn engine(&self) -> &'static str {
        match (&self.opened, self.wanted) {
            (Some(Ok(h)), _) => h.engine,
            (_, Some(w)) => w,
            (_, None) => "memory",
        }
    }

    /// Where it keeps records, when known.
    pub fn place(&self) -> Option<&str> {
        match &self.opened {
            Some(Ok(h)) => Some(&h.place),
            _ if self.wanted.is_none() => Some("this process"),
            _ => None,
        }
    }

    /// Why it is not what was asked for, or what a person should know.
    pub fn message(&self) -> Option<&str> {
        if let Some(o) = &self.outage {
            return Some(o);
        }
        match &self.opened {
            Some(Ok(h)) => h.warning.as_deref(),
            Some(Err(e)) => Some(e),
            None => None,
        }
    }

    /// With a shared store, whether it is in an outage now (`None` for a
    /// store of the host's own), for the metrics' gauge.
    pub fn shared_outage(&self) -> Option<bool> {
        self.shared_scope.as_ref().map(|_| self.outage.is_some())
    }

    /// The counters as (name, value), for the stats file and metrics.
    pub fn counters(&self) -> [(&'static str, u64); 4] {
        [
            ("operations", self.operations),
            ("replays", self.replays),
            ("waits", self.waits),
            ("unknown_answers", self.unknown_answers),
        ]
    }
}

/// All figures of a session.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Stats {
    /// The store of idempotency keys.
    pub store: StoreFigures,
    pub tools: BTreeMap<String, ToolFigures>,
    /// Breaker transitions by name (`opened`, `half_opened`, `closed`,
    /// `reopened`).
    pub breaker: BTreeMap<&'static str, u64>,
    /// Times the server was started again.
    pub restarts: u64,
    /// Keyed calls whose outcome is unknown, newest first (at most
    /// [`MAX_UNKNOWN`]).
    pub unknown: VecDeque<UnknownOutcome>,
}

impl Stats {
    /// The figures of `name`, created on first use (past
    /// [`MAX_TOOL_NAMES`], those of [`OTHER_TOOLS`]).
    pub fn figures(&mut self, name: &str) -> &mut ToolFigures {
        // A known name (every call but a tool's first) costs two lookups.
        if !self.tools.contains_key(name) {
            let name = match self.tools.len() < MAX_TOOL_NAMES {
                true => name,
                false => OTHER_TOOLS,
            };
            if !self.tools.contains_key(name) {
                self.tools.insert(name.to_owned(), ToolFigures::default());
            }
            return self.tools.get_mut(name).expect("inserted");
        }
        self.tools.get_mut(name).expect("present")
    }

    /// A keyed call's outcome is unknown (the newest first; the oldest
    /// beyond [`MAX_UNKNOWN`] are no longer shown).
    pub fn unknown_outcome(&mut self, mut u: UnknownOutcome) {
        self.forget_unknown(u.fingerprint);
        u.key = crate::status::truncate(&u.key, MAX_KEY_CHARS);
        self.unknown.push_front(u);
        self.unknown.truncate(MAX_UNKNOWN);
    }

    /// The outcome of the call whose key has `fingerprint` is known now.
    pub fn forget_unknown(&mut self, fingerprint: u128) {
        self.unknown.retain(|u| u.fingerprint != fingerprint);
    }

    /// The counters of `name`.
    pub fn tool(&mut self, name: &str) -> &mut ToolStats {
        &mut self.figures(name).counters
    }

    /// A call of `name` ended, `took` after it arrived (`None`: the server
    /// was never asked); `failure`, when it failed: the label it is
    /// counted under and its message.
    pub fn call_ended(
        &mut self,
        name: &str,
        took: Option<Duration>,
        failure: Option<(&'static str, String)>,
        now: Instant,
    ) {
        let f = self.figures(name);
        if let Some(took) = took {
            f.latency.record(took);
        }
        if let Some((reason, message)) = failure {
            *f.failed_by_reason.entry(reason).or_default() += 1;
            let message = crate::status::truncate(&message, crate::status::MAX_MESSAGE);
            f.last_error = Some((message, now));
        }
    }

    /// Times the breaker opened: first openings and reopenings after a
    /// failed trial.
    pub fn breaker_opens(&self) -> u64 {
        ["opened", "reopened"]
            .iter()
            .filter_map(|t| self.breaker.get(t))
            .sum()
    }

    /// The counters summed over the tools.
    pub fn total(&self) -> ToolStats {
        let mut t = ToolStats::default();
        for s in self.tools.values() {
            t.add(&s.counters);
        }
        t
    }

    /// Everything summed over the tools (the newest last error).
    pub fn total_figures(&self) -> ToolFigures {
        let mut t = ToolFigures::default();
        for f in self.tools.values() {
            t.add(f);
        }
        t
    }

    /// The one line logged at exit.
    pub fn summary(&self) -> String {
        let t = self.total();
        format!(
            "summary: {} call(s), {} attempt(s) sent, {} call(s) retried, {} recovered by retry, {} failed, {} cache hit(s), {} dedup hit(s), {} breaker open(s)",
            t.calls, t.attempts, t.retried, t.recovered, t.failed, t.cache_hits, t.dedup_hits, self.breaker_opens()
        )
    }

    /// The `--stats-file` document.
    pub fn to_json(&self, server: &str) -> String {
        let counters = |f: &ToolFigures| {
            let s = &f.counters;
            serde_json::json!({
                "calls": s.calls, "attempts": s.attempts, "retried": s.retried, "recovered": s.recovered,
                "failed": s.failed, "failed_by_reason": f.failed_by_reason,
                "cache_hits": s.cache_hits, "dedup_hits": s.dedup_hits,
            })
        };
        let tools: serde_json::Map<String, serde_json::Value> = self
            .tools
            .iter()
            .map(|(k, v)| (k.clone(), counters(v)))
            .collect();
        let mut store: serde_json::Map<String, serde_json::Value> = self
            .store
            .counters()
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).into()))
            .collect();
        store.insert("engine".into(), self.store.engine().into());
        store.insert("state".into(), self.store.state().into());
        let doc = serde_json::json!({
            "server": server,
            "total": counters(&self.total_figures()),
            "breaker_opens": self.breaker_opens(),
            "tools": tools,
            "store": store,
        });
        let mut s = serde_json::to_string_pretty(&doc).unwrap_or_default();
        s.push('\n');
        s
    }
}

/// Starts the thread that writes each document it receives to `path`.
pub fn spawn_writer(path: PathBuf) -> (Sender<String>, JoinHandle<()>) {
    let (tx, rx) = crossbeam_channel::unbounded::<String>();
    let handle = crate::guard::spawn(
        "stats-writer",
        "the stats file is no longer written",
        move || {
            let tmp = path.with_extension("tmp");
            while let Ok(mut doc) = rx.recv() {
                // Only the newest document matters.
                while let Ok(newer) = rx.try_recv() {
                    doc = newer;
                }
                let result = std::fs::write(&tmp, doc.as_bytes())
                    .and_then(|_| crate::private_files::replace_file(&tmp, &path));
                if let Err(e) = result {
                    crate::warn!("cannot write the stats file {}: {e}", path.display());
                }
            }
        },
        || {},
    )
    .expect("spawning the stats writer");
    (tx, handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_outcomes_are_bounded_newest_first_and_forgotten_when_known() {
        let t0 = Instant::now();
        let mut s = Stats::default();
        let u = |n: u128| UnknownOutcome {
            tool: "t".into(),
            key: format!("k{n}"),
            started: t0,
            cause: "timeout",
            until: t0,
            fingerprint: n,
        };
        for n in 0..(MAX_UNKNOWN as u128 + 5) {
            s.unknown_outcome(u(n));
        }
        assert_eq!(s.unknown.len(), MAX_UNKNOWN);
        assert_eq!(s.unknown[0].key, format!("k{}", MAX_UNKNOWN + 4));
        s.forget_unknown(MAX_UNKNOWN as u128 + 4);
        assert_eq!(s.unknown.len(), MAX_UNKNOWN - 1);
        assert_eq!(s.unknown[0].key, format!("k{}", MAX_UNKNOWN + 3));
        // The same key again moves to the front, once.
        s.unknown_outcome(u(10));
        assert_eq!(s.unknown.len(), MAX_UNKNOWN - 1);
        assert_eq!(s.unknown[0].key, "k10");
        // A long key is shortened.
        let mut long = u(99);
        long.key = "x".repeat(1000);
        s.unknown_outcome(long);
        assert_eq!(s.unknown[0].key.chars().count(), MAX_KEY_CHARS);
    }

    #[test]
    fn totals_summary_and_json() {
        let mut s = Stats::default();
        s.tool("a").calls = 2;
        s.tool("a").attempts = 3;
        s.tool("a").retried = 1;
        s.tool("b").calls = 1;
        s.tool("b").cache_hits = 1;
        s.call_ended(
            "b",
            None,
            Some(("earlier_attempt_unknown", "m".into())),
            Instant::now(),
        );
        s.breaker.insert("opened", 1);
        s.breaker.insert("closed", 1);
        assert_eq!(s.total().calls, 3);
        assert_eq!(
            s.summary(),
            "summary: 3 call(s), 3 attempt(s) sent, 1 call(s) retried, 0 recovered by retry, 0 failed, 1 cache hit(s), 0 dedup hit(s), 1 breaker open(s)"
        );
        let v: serde_json::Value = serde_json::from_str(&s.to_json("srv")).unwrap();
        assert_eq!(v["server"], "srv");
        assert_eq!(v["tools"]["a"]["retried"], 1);
        assert_eq!(v["tools"]["a"]["attempts"], 3);
        assert_eq!(v["total"]["calls"], 3);
        let unknown = serde_json::json!({"earlier_attempt_unknown": 1});
        assert_eq!(v["tools"]["b"]["failed_by_reason"], unknown);
        assert_eq!(v["total"]["failed_by_reason"], unknown);
        assert_eq!(v["tools"]["a"]["failed_by_reason"], serde_json::json!({}));
        assert_eq!(
            v["store"],
            serde_json::json!({"engine": "memory", "state": "memory", "operations": 0,
                "replays": 0, "waits": 0, "unknown_answers": 0})
        );
    }

    #[test]
    fn the_store_says_how_it_opened() {
        let mut f = StoreFigures::default();
        assert_eq!(
            (f.state(), f.engine(), f.place()),
            ("memory", "memory", Some("this process"))
        );
        f.wanted = Some("local");
        assert_eq!(
            (f.state(), f.engine(), f.place()),
            ("opening", "local", None)
        );
        let health = |engine, warning: Option<&str>| crate::store::Health {
            engine,
            place: "/s/store-v1.redb".into(),
            reachable: true,
            round_trip: None,
            records: Some(3),
            warning: warning.map(str::to_owned),
        };
        f.opened = Some(Ok(health("local", None)));
        assert_eq!(
            (f.state(), f.place(), f.message()),
            ("opened", Some("/s/store-v1.redb"), None)
        );
        f.opened = Some(Ok(health("memory", Some("no state directory"))));
        assert_eq!(
            (f.state(), f.engine(), f.message()),
            ("fell_back", "memory", Some("no state directory"))
        );
        f.opened = Some(Err("disk full".into()));
        assert_eq!(
            (f.state(), f.engine(), f.message()),
            ("failed", "local", Some("disk full"))
        );
        // A shared store's outage, and its end.
        f.wanted = Some("redis");
        f.opened = Some(Ok(health("redis", None)));
        f.outage = Some("redis://h:6379 is unreachable: keyed calls use the local store".into());
        assert_eq!((f.state(), f.message()), ("outage", f.outage.as_deref()));
        f.outage = None;
        assert_eq!((f.state(), f.message()), ("opened", None));
    }

    #[test]
    fn tool_names_past_the_bound_are_counted_together() {
        let mut s = Stats::default();
        for i in 0..MAX_TOOL_NAMES + 50 {
            s.tool(&format!("t{i}")).calls += 1;
        }
        assert_eq!(s.tools.len(), MAX_TOOL_NAMES + 1);
        assert_eq!(s.tools[OTHER_TOOLS].counters.calls, 50);
        assert_eq!(s.total().calls, (MAX_TOOL_NAMES + 50) as u64);
        // A name already kept keeps its own figures.
        s.tool("t0").calls += 1;
        assert_eq!(s.tools["t0"].counters.calls, 2);
    }

    #[test]
    fn ended_calls_count_latency_and_failures_once_for_every_view() {
        let t0 = Instant::now();
        let mut s = Stats::default();
        s.call_ended("a", Some(Duration::from_millis(3)), None, t0);
        s.call_ended("a", None, Some(("timeout", "late".into())), t0);
        let later = t0 + Duration::from_secs(1);
        let failure = Some(("server_error", "no".into()));
        s.call_ended("b", Some(Duration::from_millis(30)), failure, later);
        let a = &s.tools["a"];
        assert_eq!(a.latency.count(), 1);
        assert_eq!(a.latency.exported().count, 1);
        assert_eq!(a.failed_by_reason["timeout"], 1);
        let total = s.total_figures();
        assert_eq!(total.latency.count(), 2);
        assert_eq!(total.latency.exported().counts.iter().sum::<u64>(), 2);
        assert_eq!(total.failed_by_reason.len(), 2);
        assert_eq!(total.last_error, Some(("no".into(), later)));
        // The fine and the exported buckets agree on what they hold.
        assert_eq!(total.latency.sum(), Duration::from_millis(33));
        assert!((total.latency.exported().sum - 0.033).abs() < 1e-9);
    }
}
