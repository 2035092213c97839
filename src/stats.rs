//! Counters of what the proxy did for `tools/call`, per tool: the summary
//! line logged at exit and the JSON written by `--stats-file`.
//!
//! The counters are plain data kept by the dispatcher's calls. The file is
//! written by the `stats-writer` thread ([`spawn_writer`]), atomically (a
//! temporary file renamed over the target), so the dispatcher never does
//! file I/O.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::thread::JoinHandle;

use crossbeam_channel::Sender;

/// Counters for one tool.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ToolStats {
    /// Client calls received.
    pub calls: u64,
    /// Attempts sent to the server (first attempts and retries).
    pub attempts: u64,
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
        self.retried += o.retried;
        self.recovered += o.recovered;
        self.failed += o.failed;
        self.cache_hits += o.cache_hits;
        self.dedup_hits += o.dedup_hits;
    }
}

/// All counters of a session.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Stats {
    pub tools: BTreeMap<String, ToolStats>,
    pub breaker_opens: u64,
}

impl Stats {
    pub fn tool(&mut self, name: &str) -> &mut ToolStats {
        if !self.tools.contains_key(name) {
            self.tools.insert(name.to_owned(), ToolStats::default());
        }
        self.tools.get_mut(name).expect("inserted")
    }

    pub fn total(&self) -> ToolStats {
        let mut t = ToolStats::default();
        for s in self.tools.values() {
            t.add(s);
        }
        t
    }

    /// The one line logged at exit.
    pub fn summary(&self) -> String {
        let t = self.total();
        format!(
            "summary: {} call(s), {} attempt(s) sent, {} call(s) retried, {} recovered by retry, {} failed, {} cache hit(s), {} dedup hit(s), {} breaker open(s)",
            t.calls, t.attempts, t.retried, t.recovered, t.failed, t.cache_hits, t.dedup_hits, self.breaker_opens
        )
    }

    /// The `--stats-file` document.
    pub fn to_json(&self, server: &str) -> String {
        let counters = |s: &ToolStats| {
            serde_json::json!({
                "calls": s.calls, "attempts": s.attempts, "retried": s.retried, "recovered": s.recovered,
                "failed": s.failed, "cache_hits": s.cache_hits, "dedup_hits": s.dedup_hits,
            })
        };
        let tools: serde_json::Map<String, serde_json::Value> = self
            .tools
            .iter()
            .map(|(k, v)| (k.clone(), counters(v)))
            .collect();
        let doc = serde_json::json!({
            "server": server,
            "total": counters(&self.total()),
            "breaker_opens": self.breaker_opens,
            "tools": tools,
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
                let result =
                    std::fs::write(&tmp, doc.as_bytes()).and_then(|_| std::fs::rename(&tmp, &path));
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
    fn totals_summary_and_json() {
        let mut s = Stats::default();
        s.tool("a").calls = 2;
        s.tool("a").attempts = 3;
        s.tool("a").retried = 1;
        s.tool("b").calls = 1;
        s.tool("b").cache_hits = 1;
        s.breaker_opens = 1;
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
    }
}
