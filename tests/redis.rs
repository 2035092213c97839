//! The store a fleet shares (`store: redis://…`), through the binary,
//! against a real `redis-server` each test starts on a free loopback port
//! (its own temp dir, no persistence) and kills at its end. `make
//! test-redis` runs this suite (installing redis-server with apt-get when
//! it is missing); without a `redis-server` on PATH each test says so on
//! stderr and does nothing, unless `MCP_RETRY_REDIS_REQUIRED` is set (as
//! `make test-redis` sets it), when that is a failure. (Two tests need no
//! redis-server: a port that takes connections and never answers, and one
//! that answers `MOVED`.)

#[allow(dead_code)]
mod loopback;
mod util;

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use util::{eventually, source_marker, Builder, Session, TempDir, PROXY};

const PROXY_ERROR: i64 = -31000;
const REQUIRED_ENV: &str = "MCP_RETRY_REDIS_REQUIRED";

/// A `redis-server` of the test's own.
struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: TempDir,
    extra: Vec<String>,
    /// Its TLS port answers, not `port` (`PING` is not tried).
    tls: bool,
}

/// Whether `redis-server` can be run; a loud skip (or, when required, a
/// failure) when it cannot.
fn have_redis(test: &str) -> bool {
    let found = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os(REQUIRED_ENV).is_none(),
            "{test}: redis-server is not installed, and {REQUIRED_ENV} is set"
        );
        eprintln!(
            "SKIPPED {test}: redis-server is not installed (apt-get install redis-server, or make test-redis)"
        );
    }
    found
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl RedisServer {
    /// Started with `extra` arguments, once it answers.
    fn start(extra: &[&str]) -> RedisServer {
        let mut r = RedisServer {
            child: None,
            port: free_port(),
            dir: TempDir::new(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            tls: false,
        };
        r.spawn();
        r
    }

    /// With TLS only, on its port, the certificate of `certs` (see
    /// [`make_certs`]).
    fn start_tls(certs: &Path) -> RedisServer {
        let mut r = RedisServer {
            child: None,
            port: free_port(),
            dir: TempDir::new(),
            extra: Vec::new(),
            tls: true,
        };
        let p = |n: &str| certs.join(n).display().to_string();
        r.extra = vec![
            "--tls-cert-file".into(),
            p("server.pem"),
            "--tls-key-file".into(),
            p("server.key"),
            "--tls-ca-cert-file".into(),
            p("ca.pem"),
            "--tls-auth-clients".into(),
            "no".into(),
        ];
        r.spawn();
        r
    }

    fn spawn(&mut self) {
        let port = self.port.to_string();
        let mut cmd = Command::new("redis-server");
        if self.tls {
            cmd.args(["--port", "0", "--tls-port", &port]);
        } else {
            cmd.args(["--port", &port]);
        }
        cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.child = Some(cmd.spawn().expect("redis-server starts"));
        let deadline = Instant::now() + util::wait();
        loop {
            let up = if self.tls {
                TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            } else {
                // With `--requirepass`, NOAUTH: up too.
                let said = self.cli(&["PING"]);
                said.trim() == "PONG" || said.contains("NOAUTH")
            };
            if up {
                return;
            }
            assert!(Instant::now() < deadline, "redis-server did not start");
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `redis-cli` against it; its stdout.
    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .stderr(Stdio::piped())
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn url(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A config of the mock with `top` (YAML lines at the top level: `store:`
/// and its keys) and `policy` under the server.
fn config(top: &str, policy: &str) -> String {
    let mut yaml = format!("{top}\nservers:\n  mock:\n    command: {{mock}}\n");
    for line in util::dedent(policy).lines() {
        yaml.push_str(&format!("    {line}\n"));
    }
    yaml
}

/// A proxy on the store at `url`, initialized, its tools listed.
fn proxy(url: &str) -> Session {
    proxy_with(&format!("store: {url}"), "", &[])
}

fn proxy_with(top: &str, policy: &str, env: &[(&str, &str)]) -> Session {
    let mut b = Builder::config(&config(top, policy)).with_logs();
    for (k, v) in env {
        b = b.env(k, v);
    }
    let mut s = b.initialized();
    s.list_tools();
    s
}

/// A keyed call of `echo` (a tool not known to be safe).
fn keyed(key: &str, arguments: Value) -> Value {
    let mut args = json!({ "text": key });
    if let (Some(a), Some(more)) = (args.as_object_mut(), arguments.as_object()) {
        a.extend(more.clone());
    }
    json!({"name": "echo", "arguments": args, "_meta": {"idempotencyKey": key}})
}

fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or("")
}

fn proxy_reason(e: &Value) -> &str {
    assert_eq!(e["code"], json!(PROXY_ERROR), "{e}");
    e["data"]["reason"].as_str().unwrap_or("")
}

/// The pid of the mock that ran the call a result is of.
fn ran_in(result: &Value) -> u64 {
    result["structuredContent"]["pid"].as_u64().unwrap()
}

fn stop(mut s: Session) -> String {
    s.close_stdin();
    s.wait();
    s.stderr()
}

/// Runs `mcp-retry ARGS` with `env`: exit code, stdout, stderr.
fn run(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let out = Command::new(PROXY)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn proxies_on_one_redis_run_each_key_once_and_answer_alike() {
    if !have_redis("proxies_on_one_redis_run_each_key_once_and_answer_alike") {
        return;
    }
    let redis = RedisServer::start(&[]);
    for n in [2, 4] {
        let mut procs: Vec<Session> = (0..n).map(|_| proxy(&redis.url())).collect();
        let keys: Vec<String> = (0..20).map(|i| format!("fleet{n}-{i}")).collect();
        for s in &mut procs {
            for (i, k) in keys.iter().enumerate() {
                s.call_with(json!(i), keyed(k, json!({"mode": "slow", "ms": 100})));
            }
        }
        let mut first: Vec<Option<u64>> = vec![None; keys.len()];
        for s in &mut procs {
            for (i, k) in keys.iter().enumerate() {
                let r = s.result(&json!(i));
                assert_eq!(text(&r), k.as_str(), "{r}");
                let pid = ran_in(&r);
                assert_eq!(*first[i].get_or_insert(pid), pid, "the same result: {r}");
            }
        }
        let runs: usize = procs.iter().map(|s| s.executions("echo")).sum();
        assert_eq!(runs, keys.len(), "each key ran once across {n} proxies");
    }
    // Every key has a TTL, and the keys of a scope share its hash tag.
    let keys = redis.cli(&["KEYS", "*"]);
    assert!(keys.lines().count() > 40, "{keys}");
    for k in keys.lines() {
        assert!(k.starts_with("mcp-retry:v1:{"), "{k}");
        let ttl: i64 = redis.cli(&["PTTL", k]).trim().parse().unwrap();
        assert!(ttl > 0, "{k} has no TTL ({ttl})");
    }
}

#[test]
fn a_twin_on_another_proxy_waits_for_the_result() {
    if !have_redis("a_twin_on_another_proxy_waits_for_the_result") {
        return;
    }
    let redis = RedisServer::start(&[]);
    let mut a = proxy(&redis.url());
    let mut b = proxy(&redis.url());
    a.call_with(
        json!(1),
        keyed("twin-1", json!({"mode": "slow", "ms": 1500})),
    );
    eventually("the call to reach the server", || a.executions("echo") == 1);
    b.call_with(
        json!(1),
        keyed("twin-1", json!({"mode": "slow", "ms": 1500})),
    );
    let ra = a.result(&json!(1));
    let rb = b.result(&json!(1));
    assert_eq!(source_marker(&rb), Some("dedup"), "{rb}");
    assert_eq!(ran_in(&ra), ran_in(&rb));
    assert_eq!(b.executions("echo"), 0, "the twin never ran it");
}

#[cfg(unix)]
#[test]
fn a_killed_owner_leaves_an_unknown_outcome_no_proxy_runs_again() {
    if !have_redis("a_killed_owner_leaves_an_unknown_outcome_no_proxy_runs_again") {
        return;
    }
    let redis = RedisServer::start(&[]);
    let mut a = proxy(&redis.url());
    let mut b = proxy(&redis.url());
    a.call_with(json!(1), keyed("kill-1", json!({"mode": "hang"})));
    eventually("the call to reach the server", || a.executions("echo") == 1);
    a.signal(libc::SIGKILL);
    a.wait();
    // Within the lease the twin waits; once it is gone: unknown.
    b.call_with(json!(1), keyed("kill-1", json!({})));
    let e = b.error(&json!(1));
    assert_eq!(proxy_reason(&e), "earlier_attempt_unknown", "{e}");
    assert_eq!(e["data"]["cause"], "owner_lost", "{e}");
    assert_eq!(b.executions("echo"), 0);
    // Listed in the scope's capped set of unknown outcomes.
    let listed = redis.cli(&["KEYS", "*:unknown"]);
    let set = listed.lines().next().expect("an unknown list");
    assert_eq!(redis.cli(&["ZCARD", set]).trim(), "1");
    // A new proxy is told at start.
    let c = proxy(&redis.url());
    eventually("the start's count of unknown outcomes", || {
        c.logged("1 keyed call(s) of this server have an unknown outcome")
    });
    // `check` counts it, in the text and the JSON report.
    let config_path = c.dir.join("c.yaml").display().to_string();
    let (_, checked, _) = run(&["check", "--config", &config_path], &[]);
    assert!(
        checked.contains("1 call whose outcome is unknown"),
        "{checked}"
    );
    let (_, out, _) = run(&["check", "--json", "--config", &config_path], &[]);
    let store = redis_store_in(&out);
    assert_eq!(store["unknown_outcomes"], 1, "{store}");
    assert_eq!(store["scope_of"], "mock", "{store}");
    // `status` on a host whose proxy uses that Redis lists it, read from
    // the scope that proxy's document names.
    let runtime = c.dir.join("runtime").display().to_string();
    let v = status_json(&runtime, &redis.url(), &[]);
    let out = v.to_string();
    let listed = v["unknown_outcomes"].as_array().expect("unknown_outcomes");
    assert_eq!(listed.len(), 1, "{out}");
    assert_eq!(listed[0]["key"], "kill-1", "{out}");
    assert_eq!(listed[0]["cause"], "owner_lost", "{out}");
    assert_eq!(listed[0]["seen_in"], "store", "{out}");
    assert_eq!(v["store"]["engine"], "redis", "{out}");
    let (_, table, _) = run(
        &["status", "--dir", &runtime],
        &[("MCP_RETRY_STORE", &redis.url())],
    );
    assert!(table.contains("kill-1"), "{table}");
}

#[test]
fn ages_are_read_on_redis_s_clock_not_on_a_host_s_that_is_wrong() {
    if !have_redis("ages_are_read_on_redis_s_clock_not_on_a_host_s_that_is_wrong") {
        return;
    }
    const AHEAD: u64 = 3_600_000;
    let skewed = format!("clock-ahead:{AHEAD}");
    let redis = RedisServer::start(&[]);
    let top = format!("store: {}", redis.url());
    let mut a = proxy_with(&top, "call_timeout: 0.3", &[]);
    a.call_with(json!(1), keyed("skew-1", json!({"mode": "hang"})));
    let e = a.error(&json!(1));
    assert_eq!(a.executions("echo"), 1);
    // Another proxy on a host whose clock is an hour ahead: the unknown
    // outcome's age is Redis's, not an hour more.
    let mut b = proxy_with(&top, "call_timeout: 0.3", &[("MCP_RETRY_FAULT", &skewed)]);
    b.call_with(json!(1), keyed("skew-1", json!({})));
    let e2 = b.error(&json!(1));
    assert_eq!(
        proxy_reason(&e2),
        "earlier_attempt_unknown",
        "{e2} after {e}"
    );
    let ago = e2["data"]["startedMsAgo"].as_u64().unwrap();
    assert!((300..60_000).contains(&ago), "{e2}");
    assert_eq!(b.executions("echo"), 0);
    // `status` on that host shows it started seconds ago by its clock.
    let runtime = a.dir.join("runtime").display().to_string();
    let v = status_json(&runtime, &redis.url(), &[("MCP_RETRY_FAULT", &skewed)]);
    let out = v.to_string();
    let listed = &v["unknown_outcomes"][0];
    assert_eq!(listed["key"], "skew-1", "{out}");
    assert_eq!(listed["seen_in"], "store", "{out}");
    let here = epoch_ms() + AHEAD;
    let started = listed["started_at_ms"].as_u64().unwrap();
    assert!(
        started <= here && here - started < 60_000,
        "started {started}, the skewed host's now {here}: {out}"
    );
    let (_, table, _) = run(
        &["status", "--dir", &runtime],
        &[
            ("MCP_RETRY_STORE", &redis.url()),
            ("MCP_RETRY_FAULT", &skewed),
        ],
    );
    let row = table.lines().find(|l| l.contains("skew-1")).unwrap_or("");
    let age = row
        .split_whitespace()
        .find(|w| w.ends_with('s') && w[..w.len() - 1].parse::<u64>().is_ok());
    assert!(
        age.is_some() && row.contains(" ago"),
        "seconds ago: {table}"
    );
}

#[test]
fn a_scope_s_unknown_outcomes_are_a_capped_list_under_its_prefix() {
    if !have_redis("a_scope_s_unknown_outcomes_are_a_capped_list_under_its_prefix") {
        return;
    }
    let redis = RedisServer::start(&[]);
    let top = format!("store: {}\nstore_prefix: \"team-a:\"", redis.url());
    let mut a = proxy_with(&top, "call_timeout: 0.3", &[]);
    a.call_with(json!(1), keyed("cap-1", json!({"mode": "hang"})));
    a.error(&json!(1));
    let list = || {
        let keys = redis.cli(&["KEYS", "*:unknown"]);
        keys.lines().next().map(str::to_owned)
    };
    eventually("the scope's list of unknown outcomes", || list().is_some());
    let list = list().unwrap();
    for k in redis.cli(&["KEYS", "*"]).lines() {
        assert!(k.starts_with("team-a:v1:{"), "{k}");
    }
    // 1005 older entries: the next unknown outcome trims the list to the
    // newest 1000.
    let older: Vec<String> = (0..1005)
        .flat_map(|i| [i.to_string(), format!("older-{i}")])
        .collect();
    let mut args = vec!["ZADD", list.as_str()];
    args.extend(older.iter().map(String::as_str));
    assert_eq!(redis.cli(&args).trim(), "1005");
    a.call_with(json!(2), keyed("cap-2", json!({"mode": "hang"})));
    a.error(&json!(2));
    eventually("the list trimmed to its cap", || {
        redis.cli(&["ZCARD", &list]).trim() == "1000"
    });
    let newest = redis.cli(&["ZREVRANGE", &list, "0", "1"]);
    assert!(!newest.contains("older-"), "{newest}");
    // `status` reads both from the list, under the prefix the proxy's
    // document names.
    let runtime = a.dir.join("runtime").display().to_string();
    let v = status_json(&runtime, &redis.url(), &[]);
    assert_eq!(unknown_keys(&v), ["cap-2", "cap-1"], "{v}");
}

/// The keys of `status --json`'s unknown outcomes, in its order.
fn unknown_keys(status: &Value) -> Vec<&str> {
    let list = status["unknown_outcomes"].as_array().into_iter().flatten();
    list.map(|u| u["key"].as_str().unwrap_or("")).collect()
}

#[test]
fn claims_in_flight_never_hide_an_unknown_outcome() {
    if !have_redis("claims_in_flight_never_hide_an_unknown_outcome") {
        return;
    }
    // An unknown outcome, then more claims in flight on another proxy than
    // `check` counts, all started after it: it is still listed and counted.
    let redis = RedisServer::start(&[]);
    let top = format!("store: {}", redis.url());
    let mut a = proxy_with(&top, "call_timeout: 0.3", &[]);
    a.call_with(json!(1), keyed("lost-1", json!({"mode": "hang"})));
    a.error(&json!(1));
    let mut b = proxy_with(&top, "call_timeout: 600", &[]);
    let live = 120;
    for i in 0..live {
        b.call_with(
            json!(i),
            keyed(&format!("live-{i}"), json!({"mode": "hang"})),
        );
    }
    eventually("every call to reach the server", || {
        b.executions("echo") == live
    });
    let runtime = a.dir.join("runtime").display().to_string();
    let v = status_json(&runtime, &redis.url(), &[]);
    assert_eq!(unknown_keys(&v), ["lost-1"], "{v}");
    // `check` counts at most 100: the unknown outcome is among them.
    let config_path = a.dir.join("c.yaml").display().to_string();
    let (_, out, _) = run(&["check", "--json", "--config", &config_path], &[]);
    assert_eq!(redis_store_in(&out)["unknown_outcomes"], 1, "{out}");
}

/// This host's wall clock, in milliseconds since the epoch.
fn epoch_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |d| d.as_millis() as u64)
}

#[cfg(unix)]
#[test]
fn a_killed_owner_s_claim_is_listed_unknown_once_its_lease_is_gone() {
    if !have_redis("a_killed_owner_s_claim_is_listed_unknown_once_its_lease_is_gone") {
        return;
    }
    // No other call comes for the key: the claim itself is listed, from
    // the scope's list, once its lease (1 s here) has run out.
    let redis = RedisServer::start(&[]);
    let top = format!("store: {}", redis.url());
    let mut a = proxy_with(&top, "", &[("MCP_RETRY_TEST_DURATIONS", "lease=1000")]);
    a.call_with(json!(1), keyed("lost-1", json!({"mode": "hang"})));
    eventually("the call to reach the server", || a.executions("echo") == 1);
    a.signal(libc::SIGKILL);
    a.wait();
    let c = proxy(&redis.url());
    let runtime = c.dir.join("runtime").display().to_string();
    let listed = || status_json(&runtime, &redis.url(), &[])["unknown_outcomes"][0].clone();
    eventually("status to list the lost claim", || {
        listed()["key"] == "lost-1"
    });
    let u = listed();
    assert_eq!(u["cause"], "owner_lost", "{u}");
    assert_eq!(u["seen_in"], "store", "{u}");
    let config_path = c.dir.join("c.yaml").display().to_string();
    let (_, out, _) = run(&["check", "--json", "--config", &config_path], &[]);
    assert_eq!(redis_store_in(&out)["unknown_outcomes"], 1, "{out}");
}

/// `mcp-retry status --json` of the proxies in `runtime`, reading the
/// store `url` (`MCP_RETRY_STORE`), with `env` besides.
fn status_json(runtime: &str, url: &str, env: &[(&str, &str)]) -> Value {
    let mut all = vec![("MCP_RETRY_STORE", url)];
    all.extend_from_slice(env);
    let (_, out, err) = run(&["status", "--json", "--dir", runtime], &all);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out} {err}"))
}

/// The one Redis store of a `check --json` report.
fn redis_store_in(out: &str) -> Value {
    let v: Value = serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let stores = v["stores"].as_array().expect("stores");
    let redis: Vec<&Value> = stores.iter().filter(|s| s["engine"] == "redis").collect();
    assert_eq!(redis.len(), 1, "{out}");
    redis[0].clone()
}

#[test]
fn an_outage_falls_back_to_the_local_store_and_redis_is_used_again() {
    if !have_redis("an_outage_falls_back_to_the_local_store_and_redis_is_used_again") {
        return;
    }
    let mut redis = RedisServer::start(&[]);
    let stats = TempDir::new();
    let stats_file = stats.join("stats.json");
    let mut a = Builder::config(&config(&format!("store: {}", redis.url()), ""))
        .with_logs()
        .arg("--stats-file")
        .arg(&stats_file.display().to_string())
        .initialized();
    a.list_tools();
    let runtime = a.dir.join("runtime").display().to_string();
    // The proxy's own store, as `status --json` and the stats file say.
    let store_said = || {
        let (_, out, _) = run(&["status", "--json", "--dir", &runtime], &[]);
        let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        let stats: Value = std::fs::read_to_string(&stats_file)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null);
        (
            v["proxies"][0]["store"].clone(),
            stats["store"]["state"].clone(),
        )
    };
    a.call_with(json!(1), keyed("out-1", json!({})));
    assert_eq!(text(&a.result(&json!(1))), "out-1");
    redis.stop();
    // Keyed calls go on, answered well within their deadlines.
    let started = Instant::now();
    for i in 2..8 {
        let k = format!("out-{i}");
        a.call_with(json!(i), keyed(&k, json!({})));
        assert_eq!(text(&a.result(&json!(i))), k);
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    // The local store keeps keys meanwhile: a repeat is replayed.
    a.call_with(json!(8), keyed("out-3", json!({})));
    assert_eq!(source_marker(&a.result(&json!(8))), Some("dedup"));
    assert_eq!(a.executions("echo"), 7);
    let said = a.stderr();
    assert_eq!(
        said.matches("is unreachable").count(),
        1,
        "once per outage: {said}"
    );
    assert!(
        said.contains("use the local store until it is back"),
        "{said}"
    );
    eventually(
        "status and the stats to say the local store is in use",
        || {
            let (doc, stats) = store_said();
            doc["state"] == "outage"
                && doc["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("keyed calls use the local store until it is back"))
                && stats == "outage"
        },
    );
    let outage_gauge = || {
        let (_, out, _) = run(&["status", "--prometheus", "--dir", &runtime], &[]);
        out.lines()
            .find(|l| l.starts_with("mcp_retry_store_outage{"))
            .map(|l| l.rsplit(' ').next().unwrap_or("").to_owned())
    };
    assert_eq!(outage_gauge().as_deref(), Some("1"));
    redis.spawn();
    // Back: the next keyed call after the breaker's cooldown uses it.
    let deadline = Instant::now() + util::wait();
    let mut i = 10;
    while !a.stderr().contains("is back after") {
        assert!(
            Instant::now() < deadline,
            "Redis was not used again: {}",
            a.stderr()
        );
        i += 1;
        a.call_with(json!(i), keyed(&format!("back-{i}"), json!({})));
        a.result(&json!(i));
        thread::sleep(Duration::from_millis(100));
    }
    eventually("status and the stats to say Redis is used again", || {
        let (doc, stats) = store_said();
        doc["state"] == "opened" && stats == "opened"
    });
    assert_eq!(outage_gauge().as_deref(), Some("0"));
    // Sharing resumes: another proxy replays a key `a` ran after.
    a.call_with(json!(100), keyed("shared-after", json!({})));
    a.result(&json!(100));
    let mut b = proxy(&redis.url());
    b.call_with(json!(1), keyed("shared-after", json!({})));
    let r = b.result(&json!(1));
    assert_eq!(source_marker(&r), Some("dedup"), "{r} {}", b.stderr());
    assert_eq!(b.executions("echo"), 0);
}

/// An OTLP/HTTP receiver on loopback recording every POST (answered 200).
fn collector() -> loopback::Loopback {
    let options = loopback::Options {
        keep_alive: true,
        record: true,
        ..loopback::Options::default()
    };
    loopback::Loopback::with(options, |_, conn| {
        conn.respond(200, &[("Content-Type", "application/json")], "{}");
    })
}

/// A proxy on the store `url` exporting its metrics to `collector`.
fn exporting_proxy(url: &str, collector: &loopback::Loopback) -> Session {
    let mut b = Builder::config(&config(&format!("store: {url}"), "")).with_logs();
    for (k, v) in [
        ("NO_PROXY", "127.0.0.1,localhost"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url("").as_str()),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", ""),
        ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", ""),
        ("OTEL_EXPORTER_OTLP_HEADERS", ""),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", ""),
        ("OTEL_TRACES_EXPORTER", "none"),
        ("OTEL_METRICS_EXPORTER", ""),
        ("OTEL_SDK_DISABLED", ""),
    ] {
        b = b.env(k, v);
    }
    let mut s = b.initialized();
    s.list_tools();
    s
}

/// The value of the gauge `mcp_retry.store.outage` in the newest metrics
/// the collector received.
fn outage_exported(collector: &loopback::Loopback) -> Value {
    let requests = collector.requests();
    let last = requests
        .iter()
        .rev()
        .find(|r| r.path() == "/v1/metrics")
        .expect("a metrics export");
    let body: Value = serde_json::from_slice(&last.body).unwrap();
    let metrics = &body["resourceMetrics"][0]["scopeMetrics"][0]["metrics"];
    let gauge = metrics
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["name"] == "mcp_retry.store.outage")
        .unwrap_or_else(|| panic!("no outage gauge in {body}"));
    gauge["gauge"]["dataPoints"][0]["asInt"].clone()
}

#[test]
fn an_outage_is_a_gauge_in_the_opentelemetry_metrics() {
    if !have_redis("an_outage_is_a_gauge_in_the_opentelemetry_metrics") {
        return;
    }
    // Unreachable: keyed calls go on, and the metrics at exit say outage.
    let down = collector();
    let mut a = exporting_proxy("redis://127.0.0.1:1", &down);
    a.call_with(json!(1), keyed("o-1", json!({})));
    assert_eq!(text(&a.result(&json!(1))), "o-1");
    let runtime = a.dir.join("runtime").display().to_string();
    eventually("status to say outage", || {
        let (_, out, _) = run(&["status", "--json", "--dir", &runtime], &[]);
        let v: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
        v["proxies"][0]["store"]["state"] == "outage"
    });
    stop(a);
    assert_eq!(outage_exported(&down), "1");
    // Reachable: 0.
    let redis = RedisServer::start(&[]);
    let up = collector();
    let mut b = exporting_proxy(&redis.url(), &up);
    b.call_with(json!(1), keyed("o-2", json!({})));
    assert_eq!(text(&b.result(&json!(1))), "o-2");
    stop(b);
    assert_eq!(outage_exported(&up), "0");
}

#[test]
fn an_unreachable_store_keeps_calls_served_and_a_bad_one_is_refused() {
    if !have_redis("an_unreachable_store_keeps_calls_served_and_a_bad_one_is_refused") {
        return;
    }
    let mut s = proxy("redis://127.0.0.1:1");
    s.call(json!(1), "echo", json!({"text": "keyless"}));
    assert_eq!(text(&s.result(&json!(1))), "keyless");
    s.call_with(json!(2), keyed("k-1", json!({})));
    assert_eq!(text(&s.result(&json!(2))), "k-1");
    eventually("the warning", || {
        s.logged("redis://127.0.0.1:1 is unreachable")
    });
    // With `refuse`, a keyed call of an unsafe tool is refused instead.
    let mut r = proxy_with(
        "store: redis://127.0.0.1:1\nstore_unavailable: refuse",
        "",
        &[],
    );
    r.call_with(json!(1), keyed("k-1", json!({})));
    assert_eq!(proxy_reason(&r.error(&json!(1))), "store_unavailable");
    assert_eq!(r.executions("echo"), 0);
    let dir = TempDir::new();
    let path = dir.write(
        "c.yaml",
        &config("store: foo://x", "").replace("{mock}", util::MOCK),
    );
    let (code, _, err) = run(&["run", "--config", &path.display().to_string()], &[]);
    assert_ne!(code, Some(0));
    assert!(
        err.contains(":1: store: expected memory, local, or a Redis URL"),
        "{err}"
    );
}

#[test]
fn a_password_never_appears_in_logs_errors_status_check_or_stats() {
    if !have_redis("a_password_never_appears_in_logs_errors_status_check_or_stats") {
        return;
    }
    const PW: &str = "S3cret-Pw-q7Z";
    const WRONG: &str = "Wr0ng-Pw-k2Y";
    let redis = RedisServer::start(&["--requirepass", PW]);
    let top = format!(
        "store: redis://default:${{REDIS_PW}}@127.0.0.1:{}",
        redis.port
    );
    let stats = TempDir::new();
    let stats_file = stats.join("stats.json").display().to_string();
    let b = Builder::config(&config(&top, ""))
        .with_logs()
        .env("REDIS_PW", PW)
        .arg("--stats-file")
        .arg(&stats_file);
    let mut a = b.initialized();
    a.call_with(json!(1), keyed("pw-1", json!({})));
    assert_eq!(text(&a.result(&json!(1))), "pw-1");
    assert!(!redis
        .cli(&["-a", PW, "--no-auth-warning", "KEYS", "*"])
        .is_empty());
    let runtime = a.dir.join("runtime");
    let (_, status, status_err) = run(&["status", "--dir", &runtime.display().to_string()], &[]);
    let (_, status_json, _) = run(
        &["status", "--json", "--dir", &runtime.display().to_string()],
        &[],
    );
    // `status` told of the Redis (with its password) reads it.
    let url = format!("redis://default:{PW}@127.0.0.1:{}", redis.port);
    let (_, status_redis, status_redis_err) = run(
        &["status", "--json", "--dir", &runtime.display().to_string()],
        &[("MCP_RETRY_STORE", &url)],
    );
    let v: Value =
        serde_json::from_str(&status_redis).unwrap_or_else(|e| panic!("{e}: {status_redis}"));
    assert_eq!(v["store"]["reachable"], true, "{status_redis}");
    assert_eq!(
        v["store"]["place"],
        format!("redis://default:[redacted]@127.0.0.1:{}", redis.port),
        "{status_redis}"
    );
    let config_path = a.dir.join("c.yaml").display().to_string();
    let (_, checked, check_err) = run(&["check", "--config", &config_path], &[("REDIS_PW", PW)]);
    assert!(
        checked.contains(&format!(
            "[UP  ] store  redis://default:[redacted]@127.0.0.1:{}",
            redis.port
        )),
        "{checked}"
    );
    assert!(checked.contains("maxmemory_policy noeviction"), "{checked}");
    let (_, check_json, _) = run(
        &["check", "--json", "--config", &config_path],
        &[("REDIS_PW", PW)],
    );
    let store = redis_store_in(&check_json);
    assert_eq!(
        store["place"],
        format!("redis://default:[redacted]@127.0.0.1:{}", redis.port),
        "{store}"
    );
    assert_eq!(store["reachable"], true, "{store}");
    assert!(store["round_trip_ms"].as_f64().is_some(), "{store}");
    assert_eq!(store["maxmemory_policy"], "noeviction", "{store}");
    assert_eq!(store["records"], 1, "the key pw-1: {store}");
    assert_eq!(store["unknown_outcomes"], 0, "{store}");
    assert_eq!(store["warning"], Value::Null, "{store}");
    let log = stop(a);
    let stats_text = std::fs::read_to_string(&stats_file).unwrap_or_default();
    // A wrong password: refused by Redis, and not shown either.
    let mut w = proxy_with(&top, "", &[("REDIS_PW", WRONG)]);
    w.call_with(json!(1), keyed("pw-2", json!({})));
    w.result(&json!(1));
    eventually("the refusal", || w.logged("is unreachable"));
    let wrong_log = stop(w);
    // --store refuses a URL with a password, without showing it.
    let (code, _, refused) = run(
        &[
            "run",
            "--store",
            &format!("redis://u:{PW}@127.0.0.1:{}", redis.port),
            "--",
            util::MOCK,
        ],
        &[],
    );
    assert_ne!(code, Some(0));
    assert!(
        refused.contains("--store") && refused.contains("password"),
        "{refused}"
    );
    for (what, text) in [
        ("the log", &log),
        ("status", &status),
        ("status's stderr", &status_err),
        ("status --json", &status_json),
        ("status --json on Redis", &status_redis),
        ("its stderr", &status_redis_err),
        ("check", &checked),
        ("check's stderr", &check_err),
        ("check --json", &check_json),
        ("the stats file", &stats_text),
        ("the refusal of --store", &refused),
    ] {
        assert!(!text.contains(PW), "{what} shows the password: {text}");
    }
    assert!(!wrong_log.contains(WRONG), "{wrong_log}");
}

/// A host's file (Claude's JSON) whose entries run `mcp-retry run …`: the
/// Redis store an entry's mcp-retry uses (`MCP_RETRY_STORE` in the
/// entry's `env`, its config's `store:`, or its `--store`) is reported by
/// `check`, counted in the scope of the server that mcp-retry runs, or
/// said not to be counted when that cannot be known; the password never
/// shown.
#[test]
fn check_reports_the_redis_store_of_a_host_s_entry_that_runs_mcp_retry() {
    if !have_redis("check_reports_the_redis_store_of_a_host_s_entry_that_runs_mcp_retry") {
        return;
    }
    const PW: &str = "H0st-Entry-Pw-x8V";
    let secured = RedisServer::start(&["--requirepass", PW, "--maxmemory-policy", "allkeys-lru"]);
    let team = RedisServer::start(&[]);
    let third = RedisServer::start(&[]);
    let with_pw = format!("redis://default:{PW}@127.0.0.1:{}", secured.port);
    let shown = format!("redis://default:[redacted]@127.0.0.1:{}", secured.port);
    // `pay` as its host runs it: `mcp-retry run -- mock` in the project's
    // folder, the URL in its env. One keyed call leaves a record.
    let b = Builder::wrap_mock()
        .with_logs()
        .env("MCP_RETRY_STORE", &with_pw)
        .cwd("proj");
    std::fs::create_dir(b.dir().join("proj")).unwrap();
    let mut a = b.initialized();
    a.call_with(json!(1), keyed("host-1", json!({})));
    assert_eq!(text(&a.result(&json!(1))), "host-1");
    // `cfg`: `mcp-retry run --config c.yaml`, whose file names the store
    // and the scope. Two keyed calls there.
    let yaml = config(&format!("store: {}", team.url()), "store_scope: team");
    let mut c = Builder::config(&yaml).with_logs().initialized();
    for (id, key) in [(1, "team-1"), (2, "team-2")] {
        c.call_with(json!(id), keyed(key, json!({})));
        assert_eq!(text(&c.result(&json!(id))), key);
    }
    let dir = a.dir.path().to_owned();
    let state = |name: &str| dir.join(name).display().to_string();
    let host = json!({"mcpServers": {
        "pay": {
            "command": PROXY,
            "args": ["run", "--", util::MOCK],
            "cwd": state("proj"),
            "env": {"MCP_RETRY_STORE": with_pw},
        },
        "cfg": {
            "command": PROXY,
            "args": ["run", "--config", c.dir.join("c.yaml").display().to_string()],
            // Set empty, ours is not inherited: the config's store.
            "env": {"MCP_RETRY_STORE": ""},
        },
        // Its config is not there: its mcp-retry does not start, and
        // what it would count in its `--store` is not known.
        "broken": {
            "command": PROXY,
            "args": ["run", "--store", third.url(), "-c", "missing.yaml"],
        },
        "plain": {"command": util::MOCK},
    }});
    let host_file = dir.join("mcp.json");
    std::fs::write(&host_file, host.to_string()).unwrap();
    let host_file = host_file.display().to_string();
    // Our own MCP_RETRY_STORE is no entry's: `pay` has its own, `cfg` its
    // config's, `broken` its `--store`, and `plain` runs no mcp-retry.
    let env = [
        ("MCP_RETRY_STORE", "redis://127.0.0.1:1"),
        ("MCP_RETRY_STATE_DIR", &state("state")),
        ("MCP_RETRY_CACHE_DIR", &state("cache")),
        ("MCP_RETRY_RUNTIME_DIR", &state("check-runtime")),
    ];
    let (code, checked, check_err) = run(&["check", "--config", &host_file], &env);
    assert_eq!(code, Some(1), "broken is down: {checked}{check_err}");
    let line_of = |place: &str| {
        checked
            .lines()
            .find(|l| l.starts_with(&format!("[UP  ] store  {place}  ")))
            .unwrap_or_else(|| panic!("no line of {place}: {checked}"))
    };
    let pay_line = line_of(&shown);
    assert!(
        pay_line.contains("maxmemory_policy allkeys-lru, 1 records of \"pay\""),
        "{pay_line}"
    );
    assert!(
        pay_line.contains("; warning: maxmemory_policy is allkeys-lru, not noeviction"),
        "{pay_line}"
    );
    let cfg_line = line_of(&team.url());
    assert!(
        cfg_line.contains("maxmemory_policy noeviction, 2 records of \"cfg\""),
        "{cfg_line}"
    );
    let broken_line = line_of(&third.url());
    assert!(
        broken_line.contains("maxmemory_policy noeviction, records not counted: the scope of \"broken\" is named in ")
            && broken_line.ends_with("missing.yaml, its mcp-retry's config, which does not load here"),
        "{broken_line}"
    );
    assert_eq!(checked.matches(" store  ").count(), 3, "{checked}");
    assert!(!checked.contains("[STORE]"), "{checked}");
    let (_, out, json_err) = run(&["check", "--json", "--config", &host_file], &env);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let stores = v["stores"].as_array().expect("stores");
    assert_eq!(stores.len(), 3, "{out}");
    let at = |place: &str| {
        let found = stores.iter().find(|s| s["place"] == place);
        found.unwrap_or_else(|| panic!("no store at {place}: {out}"))
    };
    for (place, records, scope_of) in [(&shown, 1, "pay"), (&team.url(), 2, "cfg")] {
        let s = at(place);
        assert_eq!(s["engine"], "redis", "{s}");
        assert_eq!(s["reachable"], true, "{s}");
        assert!(s["round_trip_ms"].as_f64().is_some(), "{s}");
        assert_eq!(s["records"], records, "{s}");
        assert_eq!(s["unknown_outcomes"], 0, "{s}");
        assert_eq!(s["scope_of"], scope_of, "{s}");
        assert_eq!(s["not_counted"], Value::Null, "{s}");
    }
    let pay = at(&shown);
    assert_eq!(pay["maxmemory_policy"], "allkeys-lru", "{pay}");
    let warning = pay["warning"].as_str().unwrap_or("");
    assert!(warning.contains("allkeys-lru, not noeviction"), "{pay}");
    let broken = at(&third.url());
    assert_eq!(broken["reachable"], true, "{broken}");
    assert_eq!(broken["maxmemory_policy"], "noeviction", "{broken}");
    assert_eq!(broken["records"], Value::Null, "{broken}");
    assert_eq!(broken["unknown_outcomes"], 0, "{broken}");
    assert_eq!(broken["scope_of"], Value::Null, "{broken}");
    assert_eq!(broken["warning"], Value::Null, "{broken}");
    let why = broken["not_counted"].as_str().unwrap_or("");
    assert!(
        why.contains("\"broken\"") && why.contains("missing.yaml"),
        "{broken}"
    );
    for (what, text) in [
        ("check", &checked),
        ("check's stderr", &check_err),
        ("check --json", &out),
        ("its stderr", &json_err),
    ] {
        assert!(!text.contains(PW), "{what} shows the password: {text}");
    }
    stop(a);
    stop(c);
}

#[test]
fn an_eviction_policy_other_than_noeviction_is_warned_about() {
    if !have_redis("an_eviction_policy_other_than_noeviction_is_warned_about") {
        return;
    }
    let redis = RedisServer::start(&["--maxmemory-policy", "allkeys-lru"]);
    let top = format!("store: {}", redis.url());
    let s = proxy(&redis.url());
    eventually("the warning", || {
        s.logged("maxmemory_policy is allkeys-lru, not noeviction")
    });
    let dir = TempDir::new();
    let path = dir.write("c.yaml", &config(&top, "").replace("{mock}", util::MOCK));
    let (_, out, _) = run(&["check", "--config", &path.display().to_string()], &[]);
    assert!(out.contains("maxmemory_policy allkeys-lru"), "{out}");
    assert!(
        out.contains("warning: maxmemory_policy is allkeys-lru"),
        "{out}"
    );
    let (_, out, _) = run(
        &["check", "--json", "--config", &path.display().to_string()],
        &[],
    );
    let store = redis_store_in(&out);
    assert_eq!(store["maxmemory_policy"], "allkeys-lru", "{store}");
    let warning = store["warning"].as_str().unwrap_or("");
    assert!(
        warning.contains("maxmemory_policy is allkeys-lru, not noeviction"),
        "{store}"
    );
}

#[test]
fn cluster_and_sentinel_are_refused() {
    if !have_redis("cluster_and_sentinel_are_refused") {
        return;
    }
    let nodes = TempDir::new();
    let redis = RedisServer::start(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        &nodes.join("nodes.conf").display().to_string(),
    ]);
    let mut s = proxy(&redis.url());
    s.call_with(json!(1), keyed("c-1", json!({})));
    assert_eq!(
        text(&s.result(&json!(1))),
        "c-1",
        "served by the local store"
    );
    eventually("the refusal", || {
        s.logged("Redis Cluster node, which is not supported")
    });
    let dir = TempDir::new();
    let top = "store: redis+sentinel://127.0.0.1:26379/mymaster";
    let path = dir.write("c.yaml", &config(top, "").replace("{mock}", util::MOCK));
    let (code, _, err) = run(&["run", "--config", &path.display().to_string()], &[]);
    assert_ne!(code, Some(0));
    assert!(
        err.contains(":1: store: Redis Sentinel is not supported"),
        "{err}"
    );
}

/// A CA and a certificate for 127.0.0.1 it signed, in `dir` (openssl).
fn make_certs(dir: &Path) {
    let sh = |args: &[&str]| {
        let ok = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("openssl runs")
            .success();
        assert!(ok, "openssl {args:?}");
    };
    sh(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=mcp-retry test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    sh(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    std::fs::write(dir.join("ext.cnf"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    sh(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
        "-out",
        "server.pem",
    ]);
}

#[test]
fn rediss_with_a_private_ca() {
    if !have_redis("rediss_with_a_private_ca") {
        return;
    }
    let certs = TempDir::new();
    make_certs(certs.path());
    let redis = RedisServer::start_tls(certs.path());
    let top = format!(
        "store: {}\nstore_ca_file: {}",
        redis.url(),
        certs.join("ca.pem").display()
    );
    let mut a = proxy_with(&top, "call_timeout: 0.3", &[]);
    a.call_with(json!(1), keyed("tls-1", json!({})));
    assert_eq!(text(&a.result(&json!(1))), "tls-1");
    let mut b = proxy_with(&top, "", &[]);
    b.call_with(json!(1), keyed("tls-1", json!({})));
    let r = b.result(&json!(1));
    assert_eq!(source_marker(&r), Some("dedup"), "{r} {}", b.stderr());
    assert!(a.not_logged("unreachable"), "{}", a.stderr());
    // `status` reads it with the CA the proxy's document names: its
    // health, and the unknown outcome from the store itself.
    a.call_with(json!(2), keyed("tls-2", json!({"mode": "hang"})));
    a.error(&json!(2));
    let runtime = a.dir.join("runtime").display().to_string();
    let v = status_json(&runtime, &redis.url(), &[]);
    let out = v.to_string();
    assert_eq!(v["store"]["reachable"], true, "{out}");
    let listed = &v["unknown_outcomes"];
    assert_eq!(listed[0]["key"], "tls-2", "{out}");
    assert_eq!(listed[0]["seen_in"], "store", "read from Redis: {out}");
    // So does `check`, with the config's CA.
    let config_path = a.dir.join("c.yaml").display().to_string();
    let (_, out, _) = run(&["check", "--json", "--config", &config_path], &[]);
    let store = redis_store_in(&out);
    assert_eq!(store["reachable"], true, "{store}");
    assert_eq!(store["unknown_outcomes"], 1, "{store}");
    // Without the CA the certificate is not trusted: the store is not used.
    let c = proxy(&redis.url());
    eventually("the refusal", || c.logged("is unreachable"));
}

/// Reads one RESP command (an array of bulk strings); `None` at EOF.
fn read_command(r: &mut impl std::io::BufRead) -> Option<Vec<String>> {
    let mut line = String::new();
    r.read_line(&mut line).ok().filter(|n| *n > 0)?;
    let n: usize = line.trim().strip_prefix('*')?.parse().ok()?;
    let mut args = Vec::with_capacity(n);
    for _ in 0..n {
        line.clear();
        r.read_line(&mut line).ok()?;
        let len: usize = line.trim().strip_prefix('$')?.parse().ok()?;
        let mut buf = vec![0u8; len + 2];
        r.read_exact(&mut buf).ok()?;
        buf.truncate(len);
        args.push(String::from_utf8_lossy(&buf).into_owned());
    }
    Some(args)
}

#[test]
fn a_moved_answer_refuses_the_server_as_a_cluster() {
    // A server that says it is standalone but answers every keyed
    // command `MOVED` (a Cluster behind an address that hides it): the
    // store refuses it with the clear error, and keyed calls go on.
    use std::io::{BufReader, Write};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { break };
            thread::spawn(move || {
                let mut w = conn.try_clone().unwrap();
                let mut r = BufReader::new(conn);
                while let Some(args) = read_command(&mut r) {
                    let info =
                        "redis_mode:standalone\r\nrole:master\r\nmaxmemory_policy:noeviction\r\n";
                    let answer = match args[0].to_ascii_uppercase().as_str() {
                        "CLIENT" => "+OK\r\n".to_owned(),
                        "PING" => "+PONG\r\n".to_owned(),
                        "INFO" => format!("${}\r\n{info}\r\n", info.len()),
                        "TIME" => "*2\r\n$10\r\n1700000000\r\n$1\r\n0\r\n".to_owned(),
                        _ => "-MOVED 3999 127.0.0.1:1\r\n".to_owned(),
                    };
                    if w.write_all(answer.as_bytes()).is_err() {
                        break;
                    }
                }
            });
        }
    });
    let mut s = proxy(&format!("redis://127.0.0.1:{port}"));
    s.call_with(json!(1), keyed("m-1", json!({})));
    assert_eq!(
        text(&s.result(&json!(1))),
        "m-1",
        "served by the local store"
    );
    eventually("the refusal", || {
        s.logged("Redis Cluster node, which is not supported")
    });
}

#[test]
fn a_redis_that_never_answers_costs_each_operation_at_most_its_deadline() {
    // A port that takes connections and never answers (no redis-server
    // needed): each store operation gives up after 250 ms, the store's
    // breaker opens after three, and keyed calls go on meanwhile.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming() {
            match conn {
                Ok(c) => held.push(c),
                Err(_) => break,
            }
        }
    });
    let mut s = proxy(&format!("redis://127.0.0.1:{port}"));
    let started = Instant::now();
    for i in 0..10 {
        let k = format!("silent-{i}");
        s.call_with(json!(i), keyed(&k, json!({})));
        assert_eq!(text(&s.result(&json!(i))), k);
    }
    // Three operations wait 250 ms each at most (the start's count among
    // them); the breaker's trials one more each second.
    assert!(
        started.elapsed() < util::scaled(Duration::from_secs(10)),
        "{:?}",
        started.elapsed()
    );
    let said = s.stderr();
    assert_eq!(said.matches("is unreachable").count(), 1, "{said}");
    assert!(
        said.contains("no answer within the operation's 250 ms"),
        "{said}"
    );
}
