//! The chaos run: a seeded storm of `tools/call`s through the real binary
//! against the mock server failing at random, with the proxy's promises
//! checked at the end.
//!
//! Every call carries its own fault in its arguments (so the plan is data,
//! fixed by the seed) and a unique call number `n` (so dedup never merges
//! two calls, and the mock's execution log tells which call ran how often).
//! Faults: slow answers, garbage lines before the answer, `isError` results,
//! transient JSON-RPC errors (once or twice, then success), final errors, a
//! first execution that hangs past `call_timeout`, and a first execution that
//! crashes the server (which the proxy then restarts). Some calls are
//! cancelled by the client a few requests after they were sent.
//!
//! Some calls carry an idempotency key of their own, as an argument
//! (`_idempotency_key`) or in `_meta`; the server is not declared to honour
//! keys. After the storm, a sample of calls whose success was delivered is
//! sent again, identical: each must run again, not be replayed.
//!
//! Invariants: every request gets exactly one response, or none once the
//! proxy has seen its cancel; every response belongs to its request; no
//! unannotated or destructive call runs more than once, whatever its key form
//! (twice when the client repeated it); a repeated call after a delivered
//! success executes again; the proxy's memory stays bounded; no server
//! process outlives the session.
//!
//! `CHAOS_SEED` and `CHAOS_CALLS` override the seed and the number of calls;
//! `CHAOS_KEEP=path` keeps the proxy's stderr (`path.stderr`) and the
//! execution log (`path.exec.log`). The figures go to stderr, before the
//! invariants are asserted, past the test harness's output capture, so they
//! show in every run.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt::Write as _;
use std::io::Write as _;
use std::time::Instant;

use serde_json::{json, Value};

use crate::util::{
    alive, eventually, gone_within, pids, read_json_lines, status_kb, Builder, Session,
};

const DEFAULT_SEED: u64 = 0x00c4_a05e_ed00_2025;
const DEFAULT_CALLS: usize = 10_000;
const CONCURRENCY: usize = 32;
const MAX_RETRIES: u64 = 3;
/// The config's `retry.transient_codes` (the defaults).
const TRANSIENT_CODES: [i64; 4] = [-32000, -32001, -32003, -32603];
/// A server error outside the transient codes: never retried.
const FINAL_CODE: i64 = -32050;
/// Percent of calls the client cancels.
const CANCEL_PERCENT: u32 = 3;
/// Calls repeated after the storm.
const REPEATS: usize = 200;
/// Bound on the proxy's peak resident memory.
const MAX_PROXY_RSS_KB: u64 = 64 * 1024;

const CONFIG: &str = "servers:
  chaos:
    command: {mock}
    env:
      MOCK_LOG: {dir}/exec.log
      MOCK_STATE_DIR: {dir}
    call_timeout: 0.4
    retry:
      max_retries: 3
      base_delay: 0.01
      max_delay: 0.05
      total_timeout: 5
      budget:
        window: 10
        min_retries: 1000000
        ratio: 1.0
    circuit_breaker:
      failure_threshold: 1000000
      cooldown_seconds: 1
";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Class {
    ReadOnly,
    Idempotent,
    Unannotated,
    Destructive,
}

impl Class {
    const ALL: [Class; 4] = [
        Class::ReadOnly,
        Class::Idempotent,
        Class::Unannotated,
        Class::Destructive,
    ];

    fn tool(self) -> &'static str {
        match self {
            Class::ReadOnly => "ro_echo",
            Class::Idempotent => "idem_echo",
            Class::Unannotated => "unsafe_echo",
            Class::Destructive => "destructive_echo",
        }
    }

    fn of_tool(tool: &str) -> Option<Class> {
        Class::ALL.into_iter().find(|c| c.tool() == tool)
    }

    /// Whether the proxy may run it again (the mock annotates by prefix).
    fn safe(self) -> bool {
        matches!(self, Class::ReadOnly | Class::Idempotent)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Fault {
    None,
    Slow {
        ms: u64,
    },
    Garbage,
    IsError,
    /// The first `times` executions answer `code`, then success.
    Transient {
        code: i64,
        times: u64,
    },
    Final,
    /// The first execution never answers (the proxy times it out).
    Hang,
    /// The first execution kills the server.
    Crash,
}

impl Fault {
    fn name(&self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::Slow { .. } => "slow",
            Fault::Garbage => "garbage",
            Fault::IsError => "is_error",
            Fault::Transient { .. } => "transient",
            Fault::Final => "final_error",
            Fault::Hang => "hang",
            Fault::Crash => "crash",
        }
    }

    /// Whether the first execution fails in a way a safe call recovers from.
    fn fails_first(&self) -> bool {
        matches!(self, Fault::Transient { .. } | Fault::Hang | Fault::Crash)
    }
}

/// How a call carries an idempotency key (unique to the call).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum KeyForm {
    None,
    Argument,
    Meta,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Planned {
    n: u64,
    class: Class,
    fault: Fault,
    key: KeyForm,
    /// Cancel the call after this many more requests were sent.
    cancel_after: Option<usize>,
}

impl Planned {
    fn arguments(&self) -> Value {
        let mut a = json!({"n": self.n, "text": format!("call-{}", self.n)});
        let key = format!("c{}", self.n);
        let extra = match &self.fault {
            Fault::None => json!({}),
            Fault::Slow { ms } => json!({"mode": "slow", "ms": ms}),
            Fault::Garbage => json!({"mode": "garbage"}),
            Fault::IsError => json!({"mode": "is_error"}),
            Fault::Transient { code, times } => {
                json!({"mode": "flaky", "how": "error", "code": code, "fail_times": times, "key": key})
            }
            Fault::Final => {
                json!({"mode": "error", "code": FINAL_CODE, "message": format!("final error ({key})")})
            }
            Fault::Hang => json!({"mode": "flaky", "how": "hang", "key": key}),
            Fault::Crash => json!({"mode": "flaky", "how": "crash", "key": key}),
        };
        for (k, v) in extra.as_object().unwrap() {
            a[k] = v.clone();
        }
        if self.key == KeyForm::Argument {
            a["_idempotency_key"] = json!(format!("k{}", self.n));
        }
        a
    }

    /// The `tools/call` params.
    fn params(&self) -> Value {
        let mut p = json!({"name": self.class.tool(), "arguments": self.arguments()});
        if self.key == KeyForm::Meta {
            p["_meta"] = json!({"idempotencyKey": format!("k{}", self.n)});
        }
        p
    }
}

/// The fault plan: a pure function of the seed.
fn plan(seed: u64, calls: usize) -> Vec<Planned> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..calls as u64)
        .map(|n| {
            let class = Class::ALL[rng.usize(0..Class::ALL.len())];
            // A run is mostly waiting: on hung first executions (each
            // holds a slot for call_timeout) and slow answers; their
            // shares keep it to a few seconds.
            let fault = match rng.u32(0..1000) {
                0..=649 => Fault::None,
                650..=769 => Fault::Slow {
                    ms: rng.u64(5..=50),
                },
                770..=819 => Fault::Garbage,
                820..=849 => Fault::IsError,
                850..=939 => Fault::Transient {
                    code: TRANSIENT_CODES[rng.usize(0..TRANSIENT_CODES.len())],
                    times: rng.u64(1..=2),
                },
                940..=959 => Fault::Final,
                960..=994 => Fault::Hang,
                _ => Fault::Crash,
            };
            let cancel_after = (rng.u32(0..100) < CANCEL_PERCENT).then(|| rng.usize(0..=16));
            let key = match rng.u32(0..10) {
                0 => KeyForm::Argument,
                1 => KeyForm::Meta,
                _ => KeyForm::None,
            };
            Planned {
                n,
                class,
                fault,
                key,
                cancel_after,
            }
        })
        .collect()
}

/// FNV-1a over the plan's debug text: shows at a glance that a seed gives
/// the same plan on every machine.
fn fingerprint(plan: &[Planned]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in plan {
        for b in format!("{p:?}").bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// How a call ended, as the client saw it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    Result,
    /// The server's own error, passed on unchanged.
    ServerError,
    /// An error the proxy made, with its `data.reason`.
    Proxy(String),
}

impl Outcome {
    fn label(&self) -> String {
        match self {
            Outcome::Result => "result".into(),
            Outcome::ServerError => "server error".into(),
            Outcome::Proxy(r) => r.clone(),
        }
    }
}

const PROXY_REASONS: &[&str] = &[
    "circuit_open",
    "retries_exhausted",
    "timeout",
    "not_retried_unsafe",
    "server_exited",
    "server_unavailable",
    "retry_budget_exhausted",
    "deadline_exceeded",
    "overloaded",
];

/// Checks that `msg` answers call `p`, and how.
fn judge(p: &Planned, msg: &Value) -> Result<Outcome, String> {
    let text = format!("call-{}", p.n);
    let key = format!("(key c{})", p.n);
    if let Some(r) = msg.get("result") {
        if r["content"][0]["text"] != text.as_str() {
            return Err(format!("a result with the wrong text: {msg}"));
        }
        if p.fault == Fault::IsError {
            if r["isError"] != true {
                return Err(format!("expected isError: {msg}"));
            }
        } else if r["structuredContent"]["arguments"]["n"] != p.n {
            return Err(format!("a result for another call: {msg}"));
        }
        return Ok(Outcome::Result);
    }
    let Some(e) = msg.get("error") else {
        return Err(format!("neither result nor error: {msg}"));
    };
    let (Some(code), Some(message)) = (e["code"].as_i64(), e["message"].as_str()) else {
        return Err(format!("a malformed error: {msg}"));
    };
    if code == -31000 {
        let reason = e["data"]["reason"].as_str().unwrap_or("");
        if e["data"]["source"] != "mcp-retry" || !PROXY_REASONS.contains(&reason) {
            return Err(format!("a malformed proxy error: {msg}"));
        }
        if message.is_empty() {
            return Err(format!("a proxy error without a message: {msg}"));
        }
        return Ok(Outcome::Proxy(reason.to_owned()));
    }
    match &p.fault {
        Fault::Final if code == FINAL_CODE && message.contains(&format!("(c{})", p.n)) => {
            Ok(Outcome::ServerError)
        }
        Fault::Transient { code: c, .. } if code == *c && message.contains(&key) => {
            Ok(Outcome::ServerError)
        }
        _ => Err(format!("an error that is not this call's: {msg}")),
    }
}

/// What the client knows about one call.
#[derive(Default)]
struct Track {
    answers: u32,
    cancelled: bool,
    /// The proxy has read the cancel (its marker ping was answered): no
    /// answer may come any more.
    sealed: bool,
    outcome: Option<Outcome>,
}

/// Live processes whose environment holds `marker` (our servers carry the
/// session's own MOCK_LOG path).
fn processes_with_env(marker: &str) -> Vec<i32> {
    let holds_marker = |pid: &i32| {
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        env.split(|b| *b == 0).any(|kv| kv == marker.as_bytes()) && alive(*pid)
    };
    pids().into_iter().filter(holds_marker).collect()
}

struct Figures {
    out: String,
}

impl Figures {
    fn line(&mut self, s: impl AsRef<str>) {
        self.out.push_str(s.as_ref());
        self.out.push('\n');
    }
}

#[test]
fn the_fault_plan_depends_only_on_the_seed() {
    let a = plan(DEFAULT_SEED, 2000);
    assert_eq!(a, plan(DEFAULT_SEED, 2000));
    assert_ne!(fingerprint(&a), fingerprint(&plan(DEFAULT_SEED + 1, 2000)));
    // Every class meets every fault.
    let pairs: HashSet<(Class, &str)> = a.iter().map(|p| (p.class, p.fault.name())).collect();
    assert_eq!(pairs.len(), 4 * 8, "{pairs:?}");
}

#[test]
fn chaos_run() {
    let seed = env_or("CHAOS_SEED", DEFAULT_SEED);
    let calls = env_or("CHAOS_CALLS", DEFAULT_CALLS);
    let plan = plan(seed, calls);
    let started = Instant::now();

    let mut s = Builder::proxy(&[
        "run",
        "--config",
        "{dir}/chaos.yaml",
        "--stats-file",
        "{dir}/stats.json",
        "--log-level",
        "info",
    ])
    .file("chaos.yaml", CONFIG)
    .start();
    let proxy_pid = s.pid();
    let dir = s.dir.path().to_owned();
    s.initialize();
    s.request(json!("list"), "tools/list", json!({}));
    s.result(&json!("list"));
    // The check for processes left behind looks for this in environments.
    let marker = format!("MOCK_LOG={}", dir.join("exec.log").display());
    eventually("the server shows up in /proc", || {
        !processes_with_env(&marker).is_empty()
    });

    let mut tracks: Vec<Track> = (0..calls).map(|_| Track::default()).collect();
    let mut violations: Vec<String> = Vec::new();
    let mut next = 0usize;
    let mut sends = 0usize;
    let mut outstanding = 0usize;
    let mut markers = 0usize;
    let mut cancels: VecDeque<(usize, usize)> = VecDeque::new();
    let mut cancels_sent = 0usize;
    let mut answered_despite_cancel = 0usize;
    let mut notifications = 0usize;
    let mut received = 0usize;
    let mut rss_samples: Vec<u64> = Vec::new();

    loop {
        while outstanding < CONCURRENCY && next < calls {
            let p = &plan[next];
            s.call_with(json!(p.n), p.params());
            sends += 1;
            outstanding += 1;
            if let Some(after) = p.cancel_after {
                cancels.push_back((sends + after, next));
            }
            next += 1;
            send_due_cancels(
                &mut s,
                &mut cancels,
                &mut tracks,
                if next == calls { usize::MAX } else { sends },
                &mut outstanding,
                &mut markers,
                &mut cancels_sent,
            );
        }
        if next == calls {
            send_due_cancels(
                &mut s,
                &mut cancels,
                &mut tracks,
                usize::MAX,
                &mut outstanding,
                &mut markers,
                &mut cancels_sent,
            );
        }
        if outstanding == 0 && markers == 0 && next == calls {
            break;
        }
        let msg = s.recv();
        received += 1;
        if received.is_multiple_of(500) {
            rss_samples.push(status_kb(proxy_pid, "VmRSS"));
        }
        let Some(id) = msg.get("id") else {
            notifications += 1;
            continue;
        };
        if msg.get("method").is_some() {
            violations.push(format!("an unexpected request from the server: {msg}"));
            continue;
        }
        if let Some(marker) = id.as_str().and_then(|m| m.strip_prefix('m')) {
            let i: usize = marker.parse().unwrap();
            tracks[i].sealed = true;
            markers -= 1;
            continue;
        }
        let Some(i) = id.as_u64().map(|n| n as usize).filter(|i| *i < calls) else {
            violations.push(format!("a response to a request never sent: {msg}"));
            continue;
        };
        let t = &mut tracks[i];
        t.answers += 1;
        if t.answers > 1 {
            violations.push(format!("a second response to call {i}: {msg}"));
            continue;
        }
        if t.sealed {
            violations.push(format!("a response to call {i} after its cancel: {msg}"));
            continue;
        }
        if t.cancelled {
            // It was answered before the proxy read the cancel.
            answered_despite_cancel += 1;
        } else {
            outstanding -= 1;
        }
        match judge(&plan[i], &msg) {
            Ok(o) => t.outcome = Some(o),
            Err(e) => violations.push(format!("call {i} ({:?}): {e}", plan[i])),
        }
    }
    // The client got these answers and sends the same calls again: it means
    // them, so each runs again.
    let repeated: Vec<usize> = (0..calls)
        .filter(|&i| {
            let (p, t) = (&plan[i], &tracks[i]);
            t.outcome == Some(Outcome::Result)
                && !t.cancelled
                && p.fault == Fault::None
                && p.key == KeyForm::None
        })
        .take(REPEATS)
        .collect();
    for &i in &repeated {
        let p = &plan[i];
        let id = json!(format!("r{i}"));
        s.call_with(id.clone(), p.params());
        let msg = s.response(&id);
        match judge(p, &msg) {
            Ok(Outcome::Result) if msg["result"]["_meta"]["mcp-retry/source"].is_null() => {}
            _ => violations.push(format!("repeated call {i} was not run again: {msg}")),
        }
    }
    let elapsed = started.elapsed();
    let peak_kb = status_kb(proxy_pid, "VmHWM");
    let end_kb = status_kb(proxy_pid, "VmRSS");

    s.close_stdin();
    let status = s.wait();
    let stderr = s.stderr();

    // ----- after the session: executions, processes, stats ---------------
    let exec = read_json_lines(&dir.join("exec.log"));
    let mut runs: HashMap<(Class, u64), u32> = HashMap::new();
    let mut executions: BTreeMap<Class, usize> = BTreeMap::new();
    let mut downstream_ids: HashSet<String> = HashSet::new();
    let mut server_pids: HashSet<i64> = HashSet::new();
    for e in &exec {
        let class = Class::of_tool(e["tool"].as_str().unwrap_or("")).expect("a chaos tool");
        let n = e["arguments"]["n"].as_u64().expect("a call number");
        *runs.entry((class, n)).or_default() += 1;
        *executions.entry(class).or_default() += 1;
        if !downstream_ids.insert(e["id"].to_string()) {
            violations.push(format!("downstream id {} used twice", e["id"]));
        }
        server_pids.insert(e["pid"].as_i64().unwrap());
    }
    let repeated: HashSet<u64> = repeated.iter().map(|&i| plan[i].n).collect();
    for ((class, n), count) in &runs {
        let p = &plan[*n as usize];
        let again = u32::from(repeated.contains(n));
        if p.class != *class {
            violations.push(format!("call {n} ran as {class:?}, planned {:?}", p.class));
        }
        if !class.safe() && *count > 1 + again {
            violations.push(format!(
                "{class:?} call {n} ({}, key {:?}) executed {count} times",
                p.fault.name(),
                p.key
            ));
        }
        if u64::from(*count) > MAX_RETRIES + 1 + u64::from(again) {
            violations.push(format!("call {n} executed {count} times"));
        }
    }
    for n in &repeated {
        let p = &plan[*n as usize];
        if runs.get(&(p.class, *n)).copied().unwrap_or(0) < 2 {
            violations.push(format!("repeated call {n} did not execute again"));
        }
    }
    for (i, t) in tracks.iter().enumerate() {
        let p = &plan[i];
        if !t.cancelled && t.answers != 1 {
            violations.push(format!("call {i} got {} responses", t.answers));
        }
        let ran = runs.get(&(p.class, p.n)).copied().unwrap_or(0);
        if t.outcome == Some(Outcome::Result) && ran == 0 {
            violations.push(format!("call {i} got a result without running"));
        }
        if let Some(Outcome::Proxy(reason)) = &t.outcome {
            let allowed: &[&str] = if p.class.safe() {
                &[
                    "retries_exhausted",
                    "deadline_exceeded",
                    "server_unavailable",
                ]
            } else {
                &[
                    "server_exited",
                    "not_retried_unsafe",
                    "retries_exhausted",
                    "deadline_exceeded",
                    "server_unavailable",
                ]
            };
            if !allowed.contains(&reason.as_str()) {
                violations.push(format!(
                    "{:?} call {i} ({}) was answered {reason}",
                    p.class,
                    p.fault.name()
                ));
            }
        }
        if t.outcome == Some(Outcome::Result) && !p.class.safe() && p.fault.fails_first() {
            violations.push(format!(
                "unsafe call {i} recovered from {} (it must not be retried)",
                p.fault.name()
            ));
        }
    }
    let starts: u64 = std::fs::read_to_string(dir.join("starts"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0);
    let leftover: Vec<i64> = server_pids
        .iter()
        .copied()
        .filter(|pid| !gone_within(*pid as i32, crate::util::ms(5000)))
        .collect();
    if !leftover.is_empty() {
        violations.push(format!("server processes left behind: {leftover:?}"));
    }
    let stray = processes_with_env(&marker);
    if !stray.is_empty() {
        violations.push(format!("processes with this session's env left: {stray:?}"));
    }
    if !status.success() {
        violations.push(format!("the proxy exited with {status}"));
    }
    let unavailable = tracks
        .iter()
        .filter(|t| t.outcome == Some(Outcome::Proxy("server_unavailable".into())))
        .count();
    if unavailable > calls / 10 {
        // Restarts are immediate while each server does useful work. (Now
        // and then a restarted server meets a crashing call before it has
        // answered anything: that restart waits, and the calls queued for
        // longer than call_timeout are answered server_unavailable.)
        violations.push(format!(
            "{unavailable} calls found the server unavailable (restart backoff?)"
        ));
    }
    if peak_kb > MAX_PROXY_RSS_KB {
        violations.push(format!(
            "the proxy's peak RSS was {peak_kb} kB (bound {MAX_PROXY_RSS_KB} kB)"
        ));
    }
    let stats: Value = std::fs::read_to_string(dir.join("stats.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    // The proxy's own counters agree with what the client saw.
    let errors = tracks
        .iter()
        .filter(|t| matches!(t.outcome, Some(Outcome::ServerError | Outcome::Proxy(_))))
        .count() as u64;
    let results = tracks
        .iter()
        .filter(|t| t.outcome == Some(Outcome::Result))
        .count() as u64;
    let exhausted = tracks
        .iter()
        .filter(|t| t.outcome == Some(Outcome::Proxy("retries_exhausted".into())))
        .count() as u64;
    let counter = |k: &str| stats["total"][k].as_u64().unwrap_or(u64::MAX);
    if counter("calls") != (calls + repeated.len()) as u64
        || counter("failed") != errors
        || counter("recovered") > results
        || counter("retried") < counter("recovered") + exhausted
    {
        violations.push(format!(
            "the stats file disagrees with the client ({errors} errors, {results} results, {exhausted} retries exhausted): {}",
            stats["total"]
        ));
    }

    // ----- figures ---------------------------------------------------------
    let mut f = Figures { out: String::new() };
    f.line(format!(
        "chaos run: seed {seed:#x}, plan fingerprint {:#018x}, {calls} calls at concurrency {CONCURRENCY} in {:.1}s",
        fingerprint(&plan),
        elapsed.as_secs_f64()
    ));
    let mut faults: BTreeMap<&str, usize> = BTreeMap::new();
    for p in &plan {
        *faults.entry(p.fault.name()).or_default() += 1;
    }
    let injected: usize = plan.iter().filter(|p| p.fault != Fault::None).count();
    f.line(format!(
        "faults injected: {injected} ({})",
        faults
            .iter()
            .filter(|(k, _)| **k != "none")
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    f.line(format!(
        "client cancels: {cancels_sent} sent, {answered_despite_cancel} answered before the proxy read the cancel"
    ));
    let keyed = |form| plan.iter().filter(|p| p.key == form).count();
    f.line(format!(
        "idempotency keys: {} as an argument, {} in _meta; {} delivered calls repeated",
        keyed(KeyForm::Argument),
        keyed(KeyForm::Meta),
        repeated.len()
    ));
    let total = &stats["total"];
    f.line(format!(
        "proxy stats: calls {}, retried {}, recovered {}, failed {}, dedup hits {}, breaker opens {}",
        total["calls"], total["retried"], total["recovered"], total["failed"], total["dedup_hits"], stats["breaker_opens"]
    ));
    f.line(format!(
        "server starts: {starts}; notifications seen: {notifications}"
    ));
    let mut table: BTreeMap<(Class, String), usize> = BTreeMap::new();
    for (i, t) in tracks.iter().enumerate() {
        let label = match (&t.outcome, t.cancelled) {
            (Some(o), _) => o.label(),
            (None, true) => "cancelled".into(),
            (None, false) => "no answer".into(),
        };
        *table.entry((plan[i].class, label)).or_default() += 1;
    }
    for class in Class::ALL {
        let planned = plan.iter().filter(|p| p.class == class).count();
        let mut row = String::new();
        for ((c, label), count) in &table {
            if *c == class {
                let _ = write!(row, ", {label} {count}");
            }
        }
        f.line(format!(
            "{:<16} {planned} calls, {} executions{row}",
            class.tool(),
            executions.get(&class).copied().unwrap_or(0)
        ));
    }
    let max_runs = |safe: bool| {
        runs.iter()
            .filter(|((c, _), _)| c.safe() == safe)
            .map(|(_, n)| *n)
            .max()
            .unwrap_or(0)
    };
    f.line(format!(
        "most executions of one call: safe {}, unsafe {}",
        max_runs(true),
        max_runs(false)
    ));
    let mut rss = rss_samples.clone();
    rss.sort_unstable();
    f.line(format!(
        "proxy RSS: peak {} kB, at end {} kB, samples min {} / max {} kB",
        peak_kb,
        end_kb,
        rss.first().copied().unwrap_or(0),
        rss.last().copied().unwrap_or(0)
    ));
    if let Some(path) = std::env::var_os("CHAOS_KEEP") {
        let path = std::path::PathBuf::from(path);
        let _ = std::fs::write(path.with_extension("stderr"), &stderr);
        let _ = std::fs::copy(dir.join("exec.log"), path.with_extension("exec.log"));
    }
    f.line(format!("violations: {}", violations.len()));
    for v in violations.iter().take(20) {
        f.line(format!("  {v}"));
    }
    // Straight to the process's stderr, past the test harness's capture:
    // the figures show in every run, passing or not.
    let _ = std::io::stderr().lock().write_all(f.out.as_bytes());
    assert!(
        violations.is_empty(),
        "{} invariant violation(s); first: {}\nproxy stderr (tail):\n{}",
        violations.len(),
        violations[0],
        tail(&stderr, 60)
    );
}

fn send_due_cancels(
    s: &mut Session,
    cancels: &mut VecDeque<(usize, usize)>,
    tracks: &mut [Track],
    now: usize,
    outstanding: &mut usize,
    markers: &mut usize,
    sent: &mut usize,
) {
    let mut keep = VecDeque::new();
    while let Some((at, i)) = cancels.pop_front() {
        if at > now {
            keep.push_back((at, i));
            continue;
        }
        let t = &mut tracks[i];
        if t.answers > 0 {
            continue; // answered already: nothing to cancel
        }
        s.notify(
            "notifications/cancelled",
            json!({"requestId": i, "reason": "chaos"}),
        );
        // Answered only after the proxy has read the cancel.
        s.request(json!(format!("m{i}")), "ping", json!({}));
        t.cancelled = true;
        *outstanding -= 1;
        *markers += 1;
        *sent += 1;
    }
    *cancels = keep;
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
