//! What every `run` publishes about itself for `mcp-retry status`: one
//! small JSON file per proxy in a per-user runtime directory, written
//! atomically by the `status-writer` thread and removed at exit.
//!
//! The dispatcher owns the live figures ([`Publisher`]: per-tool latency
//! histograms, failures by reason, the last error) and, at most once a
//! second and only after something changed, hands a [`Snapshot`] to the
//! writer thread. The writer turns it into a [`Document`] (wall-clock
//! times, redacted messages) and does the file I/O, so a call never waits
//! for a disk. An idle proxy publishes nothing and never wakes up for it.
//!
//! The directory is `$MCP_RETRY_RUNTIME_DIR`, else
//! `$XDG_RUNTIME_DIR/mcp-retry`, else `mcp-retry-<uid>` in the temporary
//! directory. It must be a directory of ours with mode 0700 (created so
//! when missing; on Windows, with a DACL for the current user alone,
//! `private_files.rs`); otherwise nothing is published (or read).
//! Files are 0600.
//! The `status` command itself is `status/report.rs`.

pub mod histogram;
pub mod keys;
pub mod report;

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::Sender;
use serde::{Deserialize, Serialize};

pub use crate::private_files::{prepare_dir, replace_file, DirError};
use crate::private_files::{uid, write_atomically};
use crate::redact::Redactor;
use crate::stats::{Stats, StoreFigures, ToolFigures, ToolStats, UnknownOutcome};

/// The environment variable that overrides the runtime directory.
pub const DIR_ENV: &str = "MCP_RETRY_RUNTIME_DIR";
/// The format of [`Document`]; readers skip other versions.
pub const VERSION: u32 = 1;
/// The least time between two writes of the file.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// Longest error message kept (characters), before redaction: room for the
/// proxy's own messages and most servers' whole.
pub(crate) const MAX_MESSAGE: usize = 1000;
/// Most tools published (those with the most calls); totals count all.
const MAX_TOOLS: usize = 200;

// ----- the directory ----------------------------------------------------------

/// The runtime directory: `explicit` (`status --dir`), else
/// [`DIR_ENV`], else `$XDG_RUNTIME_DIR/mcp-retry`, else the temporary
/// directory's `mcp-retry-<uid>`.
pub fn runtime_dir(explicit: Option<&Path>) -> PathBuf {
    if let Some(p) = explicit {
        return p.to_owned();
    }
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(p) = var(DIR_ENV) {
        return p.into();
    }
    if let Some(p) = var("XDG_RUNTIME_DIR").map(PathBuf::from) {
        if p.is_absolute() {
            return p.join("mcp-retry");
        }
    }
    std::env::temp_dir().join(format!("mcp-retry-{}", uid()))
}

// ----- the document -------------------------------------------------------------

/// The file one proxy publishes (`<pid>.json`). Times are milliseconds
/// since the UNIX epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Document {
    pub version: u32,
    pub server: String,
    /// The config file, absolute; `None` for a wrapped command alone.
    pub config: Option<String>,
    pub pid: u32,
    /// The process's start time in clock ticks after boot (Linux
    /// `/proc/PID/stat` field 22), to tell a reused pid.
    pub pid_start: Option<u64>,
    pub transport: String,
    /// The command and its arguments (redacted; never the environment).
    pub target: Vec<String>,
    pub started_at_ms: u64,
    pub updated_at_ms: u64,
    pub restarts: u64,
    pub link: LinkDoc,
    /// How the session's handshake went (older proxies wrote none).
    #[serde(default)]
    pub handshake: HandshakeDoc,
    pub breaker: BreakerDoc,
    pub in_flight: u64,
    pub total: ToolDoc,
    pub tools: BTreeMap<String, ToolDoc>,
    /// Keyed calls whose outcome is unknown, newest first (older proxies
    /// wrote none).
    #[serde(default)]
    pub unknown_outcomes: Vec<UnknownDoc>,
    /// The store of idempotency keys this proxy uses (older proxies wrote
    /// none).
    #[serde(default)]
    pub store: Option<StoreDoc>,
}

/// The store of idempotency keys a proxy uses, and what it did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StoreDoc {
    /// `memory`, `local`, ...: the engine in use.
    pub engine: String,
    /// `memory` (nothing outlives the process), `opening`, `opened`,
    /// `fell_back` (this process's memory instead of the store asked
    /// for), `failed` (keyed calls follow `store_unavailable`) or
    /// `outage` (a shared store is unreachable: keyed calls use the local
    /// store meanwhile, or are refused; `message` says which).
    pub state: String,
    /// Where it keeps records (redacted).
    pub place: Option<String>,
    /// Why it is not what was asked for, or what happened when it opened.
    pub message: Option<String>,
    /// Requests handed to the store (claims and outcomes).
    pub operations: u64,
    /// Keyed calls answered with a result the store kept.
    pub replays: u64,
    /// Keyed calls that waited for an identical call in another process.
    pub waits: u64,
    /// Keyed calls not run because an earlier one's outcome is unknown.
    pub unknown_answers: u64,
    /// A shared store's key prefix (`store_prefix`), for `status` to
    /// read `scope`'s unknown outcomes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// This server's scope in a shared store (hex of its BLAKE3 hash: not
    /// a secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// A shared store's `store_ca_file` (an absolute path: a private CA
    /// for `rediss://`), for `status` to read it with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
}

impl StoreDoc {
    fn of(f: &StoreFigures, redactor: &Redactor) -> StoreDoc {
        StoreDoc {
            engine: f.engine().into(),
            state: f.state().into(),
            place: f.place().map(|p| redactor.redact(p)),
            message: f.message().map(|m| redactor.redact(m)),
            operations: f.operations,
            replays: f.replays,
            waits: f.waits,
            unknown_answers: f.unknown_answers,
            prefix: f.shared_scope.as_ref().map(|(p, _)| p.clone()),
            scope: f
                .shared_scope
                .as_ref()
                .map(|(_, s)| crate::store::redis::hex(s)),
            ca_file: f.ca_file.clone(),
        }
    }
}

/// A keyed call that may have run without an outcome: its key is not run
/// again until `until_ms`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnknownDoc {
    pub tool: String,
    /// The client's idempotency key (redacted, shortened past 200
    /// characters).
    pub key: String,
    pub started_at_ms: u64,
    /// What ended it: `timeout`, `server_exited`, `transport_error`,
    /// `cancelled`.
    pub cause: String,
    pub until_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkDoc {
    /// `up`, `starting`, `restarting` or `down` (older proxies also wrote
    /// `dormant`).
    pub state: String,
    /// When a restart is due (`restarting`).
    pub until_ms: Option<u64>,
    /// Why it is not up (redacted).
    pub message: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HandshakeDoc {
    /// The client's `initialize` was answered from the handshake cache
    /// (`instant_start`).
    pub from_cache: bool,
    /// When the server first accepted the client's handshake (for a
    /// session begun from the cache: the server's own answer, later).
    pub ready_at_ms: Option<u64>,
    /// That, after the proxy started.
    pub ready_after_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BreakerDoc {
    /// `closed`, `open` or `half-open`.
    pub state: String,
    /// When an open breaker's cooldown ends.
    pub until_ms: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolDoc {
    pub calls: u64,
    pub attempts: u64,
    pub retried: u64,
    pub recovered: u64,
    pub failed: u64,
    pub failed_by_reason: BTreeMap<String, u64>,
    pub cache_hits: u64,
    pub dedup_hits: u64,
    /// Calls the server handled (not cache or dedup hits) that ended.
    pub latency_count: u64,
    pub latency_sum_ms: f64,
    pub p50_ms: Option<f64>,
    pub p95_ms: Option<f64>,
    pub last_error: Option<ErrorDoc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorDoc {
    pub message: String,
    pub at_ms: u64,
}

// ----- what the dispatcher keeps and sends -----------------------------------------

/// The state of the server link, as published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    Up,
    /// The first start, or a restarted server replaying the handshake.
    Starting,
    Restarting,
    Down,
}

impl LinkState {
    pub fn as_str(self) -> &'static str {
        match self {
            LinkState::Up => "up",
            LinkState::Starting => "starting",
            LinkState::Restarting => "restarting",
            LinkState::Down => "down",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerShown {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerShown {
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerShown::Closed => "closed",
            BreakerShown::Open => "open",
            BreakerShown::HalfOpen => "half-open",
        }
    }
}

/// What decides whether the file is out of date, besides the counters.
/// Cheap to build and compare after every event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Headline {
    pub link: LinkState,
    pub link_until: Option<Instant>,
    pub breaker: BreakerShown,
    pub breaker_until: Option<Instant>,
    pub restarts: u64,
    pub in_flight: u64,
    /// The session began from the handshake cache.
    pub from_cache: bool,
    /// When the server first accepted the client's handshake.
    pub ready_at: Option<Instant>,
}

/// One tool's figures at the time of a snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSnapshot {
    pub counters: ToolStats,
    pub failed_by_reason: BTreeMap<&'static str, u64>,
    pub latency_count: u64,
    pub latency_sum: Duration,
    pub p50: Option<Duration>,
    pub p95: Option<Duration>,
    pub last_error: Option<(String, Instant)>,
}

/// Everything the writer needs, taken by the dispatcher at `taken`.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub taken: Instant,
    pub headline: Headline,
    pub link_message: Option<String>,
    pub total: ToolSnapshot,
    pub tools: BTreeMap<String, ToolSnapshot>,
    /// Keyed calls whose outcome is unknown and whose keys are still held,
    /// newest first.
    pub unknown: Vec<UnknownOutcome>,
    pub store: StoreFigures,
}

/// One tool's figures as `status` shows them.
fn tool_snapshot(f: &ToolFigures) -> ToolSnapshot {
    ToolSnapshot {
        counters: f.counters,
        failed_by_reason: f.failed_by_reason.clone(),
        latency_count: f.latency.count(),
        latency_sum: f.latency.sum(),
        p50: f.latency.quantile(0.5),
        p95: f.latency.quantile(0.95),
        last_error: f.last_error.clone(),
    }
}

/// The dispatcher's side of publishing: where snapshots go, when the last
/// one went, whether one is scheduled. The figures are `Stats`'.
#[derive(Debug)]
pub struct Publisher {
    out: Sender<Snapshot>,
    /// [`MIN_INTERVAL`] (shorter in the integration tests that read the
    /// file: `status_interval`, see `guard::duration`).
    interval: Duration,
    /// A publish timer is set.
    pub pending: bool,
    pub last_sent: Option<Instant>,
    /// The headline of the last check, to notice changes.
    pub last_headline: Option<Headline>,
}

impl Publisher {
    pub fn new(out: Sender<Snapshot>) -> Publisher {
        Publisher {
            out,
            interval: crate::guard::duration("status_interval", MIN_INTERVAL),
            pending: false,
            last_sent: None,
            last_headline: None,
        }
    }

    /// When the next publish may happen, if one is wanted at `now`.
    pub fn due(&self, now: Instant) -> Instant {
        match self.last_sent {
            Some(last) => (last + self.interval).max(now),
            None => now,
        }
    }

    /// Hands a snapshot to the writer; false if the writer is gone.
    pub fn send(
        &mut self,
        headline: Headline,
        link_message: Option<String>,
        stats: &Stats,
        now: Instant,
    ) -> bool {
        self.pending = false;
        self.last_sent = Some(now);
        let mut names: Vec<(&String, &ToolFigures)> = stats.tools.iter().collect();
        if names.len() > MAX_TOOLS {
            names.sort_by(|a, b| {
                b.1.counters
                    .calls
                    .cmp(&a.1.counters.calls)
                    .then(a.0.cmp(b.0))
            });
            names.truncate(MAX_TOOLS);
        }
        let tools = names
            .into_iter()
            .map(|(name, f)| (name.clone(), tool_snapshot(f)))
            .collect();
        let snapshot = Snapshot {
            taken: now,
            headline,
            link_message,
            total: tool_snapshot(&stats.total_figures()),
            tools,
            unknown: stats
                .unknown
                .iter()
                .filter(|u| u.until > now)
                .cloned()
                .collect(),
            store: stats.store.clone(),
        };
        self.out.send(snapshot).is_ok()
    }
}

/// `s` in at most `max` characters: when longer, its first third, `…` and
/// its end (an error message ends with its cause).
pub(crate) fn truncate(s: &str, max: usize) -> String {
    let count = s.chars().count();
    if count <= max {
        return s.to_owned();
    }
    let head = max / 3;
    let tail = max.saturating_sub(head + 1);
    let start: String = s.chars().take(head).collect();
    let end: String = s.chars().skip(count - tail).collect();
    format!("{start}…{end}")
}

// ----- the writer ----------------------------------------------------------------

/// What does not change during a session.
#[derive(Debug, Clone)]
pub struct Identity {
    pub server: String,
    pub config: Option<PathBuf>,
    pub command: String,
    pub args: Vec<String>,
    /// Every configured secret (`ServerConfig::secrets`): builds the
    /// redactor of messages and arguments.
    pub env: Vec<(String, String)>,
}

/// Milliseconds since the UNIX epoch of `at`, knowing that `now_i` is
/// `now_s`.
fn wall_ms(at: Instant, now_i: Instant, now_s: SystemTime) -> u64 {
    let t = if at >= now_i {
        now_s + (at - now_i)
    } else {
        now_s - (now_i - at)
    };
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn ms_f64(d: Duration) -> f64 {
    (d.as_secs_f64() * 1_000_000.0).round() / 1000.0
}

/// Builds the document for `snap`, taken at `now_i`, which is `now_s`.
fn document(
    id: &Identity,
    pid_start: Option<u64>,
    started_at_ms: u64,
    snap: &Snapshot,
    redactor: &Redactor,
    now_s: SystemTime,
    now_i: Instant,
) -> Document {
    let wall = |at: Instant| wall_ms(at, now_i, now_s);
    let tool = |t: &ToolSnapshot| ToolDoc {
        calls: t.counters.calls,
        attempts: t.counters.attempts,
        retried: t.counters.retried,
        recovered: t.counters.recovered,
        failed: t.counters.failed,
        failed_by_reason: t
            .failed_by_reason
            .iter()
            .map(|(k, v)| ((*k).to_owned(), *v))
            .collect(),
        cache_hits: t.counters.cache_hits,
        dedup_hits: t.counters.dedup_hits,
        latency_count: t.latency_count,
        latency_sum_ms: ms_f64(t.latency_sum),
        p50_ms: t.p50.map(ms_f64),
        p95_ms: t.p95.map(ms_f64),
        last_error: t.last_error.as_ref().map(|(m, at)| ErrorDoc {
            message: redactor.redact(m),
            at_ms: wall(*at),
        }),
    };
    let h = &snap.headline;
    Document {
        version: VERSION,
        server: id.server.clone(),
        config: id.config.as_ref().map(|p| p.display().to_string()),
        pid: std::process::id(),
        pid_start,
        transport: "stdio".into(),
        target: std::iter::once(&id.command)
            .chain(&id.args)
            .map(|a| redactor.redact(a))
            .collect(),
        started_at_ms,
        updated_at_ms: wall(now_i),
        restarts: h.restarts,
        handshake: HandshakeDoc {
            from_cache: h.from_cache,
            ready_at_ms: h.ready_at.map(wall),
            ready_after_ms: h.ready_at.map(|at| wall(at).saturating_sub(started_at_ms)),
        },
        link: LinkDoc {
            state: h.link.as_str().into(),
            until_ms: h.link_until.map(wall),
            message: snap.link_message.as_deref().map(|m| redactor.redact(m)),
        },
        breaker: BreakerDoc {
            state: h.breaker.as_str().into(),
            until_ms: h.breaker_until.map(wall),
        },
        in_flight: h.in_flight,
        total: tool(&snap.total),
        tools: snap
            .tools
            .iter()
            .map(|(k, v)| (k.clone(), tool(v)))
            .collect(),
        unknown_outcomes: snap
            .unknown
            .iter()
            .map(|u| UnknownDoc {
                tool: u.tool.clone(),
                key: redactor.redact(&u.key),
                started_at_ms: wall(u.started),
                cause: u.cause.to_owned(),
                until_ms: wall(u.until),
            })
            .collect(),
        store: Some(StoreDoc::of(&snap.store, redactor)),
    }
}

/// Whether process `pid` is still running, for pruning the documents of
/// dead proxies (Windows: it has not exited).
#[cfg(windows)]
pub fn process_exists(pid: u32) -> bool {
    use windows_sys::Win32::Foundation::{CloseHandle, STILL_ACTIVE};
    use windows_sys::Win32::System::Threading::{
        GetExitCodeProcess, OpenProcess, PROCESS_QUERY_LIMITED_INFORMATION,
    };
    // SAFETY: OpenProcess returns null for a pid that names no process; the
    // handle is closed once.
    unsafe {
        let handle = OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, 0, pid);
        if handle.is_null() {
            return false;
        }
        let mut code = 0u32;
        let ok = GetExitCodeProcess(handle, &mut code) != 0;
        CloseHandle(handle);
        ok && code == STILL_ACTIVE as u32
    }
}

/// Whether process `pid` exists (zombies included), for pruning the
/// documents of dead proxies. A pid that cannot name one process (0, or
/// over `pid_t::MAX`) does not.
#[cfg(unix)]
pub fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill(2) with signal 0 sends nothing; it only checks that the
    // process exists. The pid is positive, so it names one process.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// This process's start time in clock ticks after boot (Linux).
pub fn own_start_ticks() -> Option<u64> {
    start_ticks(std::process::id())
}

/// Field 22 of `/proc/PID/stat`: when the process started, in clock ticks
/// after boot. `None` where there is no `/proc`.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_ticks(&stat)
}

/// Field 22 of a `/proc/PID/stat` line (the command name, field 2, may
/// hold spaces and parentheses: fields are counted after its last `)`).
pub fn parse_start_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Starts the `status-writer` thread: it writes each snapshot it gets to
/// `dir/<pid>.json` (the newest only, when several wait), and removes the
/// file when the channel closes. A failure to write is logged once as a
/// warning, later ones at debug level.
pub fn spawn_writer(dir: PathBuf, id: Identity) -> io::Result<(Sender<Snapshot>, JoinHandle<()>)> {
    let (tx, rx) = crossbeam_channel::unbounded::<Snapshot>();
    let started_at = SystemTime::now();
    let pid = std::process::id();
    let path = dir.join(format!("{pid}.json"));
    let tmp = dir.join(format!(".{pid}.json.tmp"));
    let (stale, stale_tmp) = (path.clone(), tmp.clone());
    let handle = crate::guard::spawn(
        "status-writer",
        "this proxy's status is no longer published",
        move || {
            let redactor = Redactor::new(&id.env);
            let pid_start = own_start_ticks();
            let started_at_ms = started_at
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            let mut warned = false;
            while let Ok(mut snap) = rx.recv() {
                while let Ok(newer) = rx.try_recv() {
                    snap = newer;
                }
                let (now_s, now_i) = (SystemTime::now(), Instant::now());
                let doc = document(
                    &id,
                    pid_start,
                    started_at_ms,
                    &snap,
                    &redactor,
                    now_s,
                    now_i,
                );
                let mut text = serde_json::to_vec_pretty(&doc).unwrap_or_default();
                text.push(b'\n');
                if let Err(e) = write_atomically(&path, &tmp, &text) {
                    if warned {
                        crate::debug!("cannot write the status file {}: {e}", path.display());
                    } else {
                        warned = true;
                        crate::warn!(
                            "cannot write the status file {}: {e} (`mcp-retry status` will not list this proxy)",
                            path.display()
                        );
                    }
                }
            }
            let _ = fs::remove_file(&tmp);
            let _ = fs::remove_file(&path);
        },
        // What was published is no longer true.
        move || {
            let _ = fs::remove_file(&stale_tmp);
            let _ = fs::remove_file(&stale);
        },
    )?;
    Ok((tx, handle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_ticks_are_field_22_even_with_parentheses_in_the_name() {
        let stat = "4242 (odd) name)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_ticks(stat), Some(987654));
        assert_eq!(parse_start_ticks("garbage"), None);
        if cfg!(target_os = "linux") {
            assert!(own_start_ticks().is_some());
        }
    }

    #[test]
    fn wall_clock_times_follow_the_instant_they_stand_for() {
        let now_i = Instant::now();
        let now_s = UNIX_EPOCH + Duration::from_secs(1_000);
        assert_eq!(wall_ms(now_i, now_i, now_s), 1_000_000);
        assert_eq!(
            wall_ms(now_i + Duration::from_millis(1500), now_i, now_s),
            1_001_500
        );
        assert_eq!(
            wall_ms(now_i - Duration::from_millis(250), now_i, now_s),
            999_750
        );
    }

    #[test]
    fn documents_redact_messages_and_arguments() {
        let now_i = Instant::now();
        let now_s = UNIX_EPOCH + Duration::from_secs(2_000);
        let id = Identity {
            server: "gh".into(),
            config: Some("/etc/c.yaml".into()),
            command: "gh-server".into(),
            args: vec!["--token".into(), "s3cr3t-value".into()],
            env: vec![("GITHUB_TOKEN".into(), "s3cr3t-value".into())],
        };
        let (tx, rx) = crossbeam_channel::unbounded();
        let mut p = Publisher::new(tx);
        let mut stats = crate::stats::Stats::default();
        stats.tool("a").calls = 2;
        stats.tool("a").failed = 1;
        stats.call_ended("a", Some(Duration::from_millis(10)), None, now_i);
        stats.call_ended("a", None, Some(("circuit_open", "no".into())), now_i);
        stats.call_ended(
            "a",
            Some(Duration::from_millis(30)),
            Some(("timeout", "bad s3cr3t-value here".into())),
            now_i,
        );
        let headline = Headline {
            link: LinkState::Restarting,
            link_until: Some(now_i + Duration::from_secs(2)),
            breaker: BreakerShown::Open,
            breaker_until: Some(now_i + Duration::from_secs(60)),
            restarts: 3,
            in_flight: 1,
            from_cache: true,
            ready_at: Some(now_i),
        };
        assert!(p.send(headline, Some("exited: s3cr3t-value".into()), &stats, now_i));
        assert_eq!(p.due(now_i), now_i + MIN_INTERVAL);
        let snap = rx.try_recv().unwrap();
        let doc = document(
            &id,
            Some(5),
            1_999_000,
            &snap,
            &Redactor::new(&id.env),
            now_s,
            now_i,
        );
        let text = serde_json::to_string(&doc).unwrap();
        assert!(!text.contains("s3cr3t"), "{text}");
        assert_eq!(doc.target, ["gh-server", "--token", "[redacted]"]);
        assert_eq!(doc.link.state, "restarting");
        assert_eq!(doc.link.until_ms, Some(2_002_000));
        assert_eq!(doc.breaker.until_ms, Some(2_060_000));
        let a = &doc.tools["a"];
        assert_eq!((a.calls, a.failed, a.latency_count), (2, 1, 2));
        assert_eq!(a.failed_by_reason["timeout"], 1);
        assert_eq!(a.failed_by_reason["circuit_open"], 1);
        assert_eq!(
            a.last_error.as_ref().unwrap().message,
            "bad [redacted] here"
        );
        assert_eq!(doc.total.latency_count, 2);
        let back: Document = serde_json::from_str(&text).unwrap();
        assert_eq!(back, doc);
    }

    #[test]
    fn long_messages_are_cut_at_a_character_boundary() {
        assert_eq!(truncate("héllo", 4), "h…lo");
        assert_eq!(truncate("hé", 2), "hé");
        assert_eq!(
            truncate("Error: the server said: ünicode", 11),
            "Err…ünicode"
        );
    }
}
