//! `mcp-retry status` through the real binary: proxies publish into a
//! runtime directory of each test's own (`MCP_RETRY_RUNTIME_DIR`), and
//! `status --dir` reads it as a table, JSON and Prometheus text.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};

use crate::util::{eventually, wait, Builder, Session, TempDir, PROXY};

/// A runtime directory for one test, created by the first proxy.
struct Runtime {
    root: TempDir,
}

impl Runtime {
    fn new() -> Runtime {
        Runtime {
            root: TempDir::new(),
        }
    }
    fn dir(&self) -> PathBuf {
        self.root.join("run")
    }
    fn file_of(&self, s: &Session) -> PathBuf {
        self.dir().join(format!("{}.json", s.pid()))
    }
}

/// `mcp-retry run` of server `name` (the mock, with `extra` config lines),
/// publishing into `dir`, after the handshake.
fn proxy(dir: &Path, name: &str, extra: &str) -> Session {
    let s = Builder::config(&format!(
        "servers:\n  {name}:\n    command: {{mock}}\n{extra}"
    ))
    .env("MCP_RETRY_RUNTIME_DIR", &dir.display().to_string())
    .initialized();
    s
}

pub(crate) struct Output {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// `mcp-retry status --dir DIR ARGS`; the store it reads is the state
/// directory beside `dir` (`state/`), never the user's.
pub(crate) fn status(dir: &Path, args: &[&str]) -> Output {
    let out = Command::new(PROXY)
        .arg("status")
        .arg("--dir")
        .arg(dir)
        .args(args)
        .env("MCP_RETRY_STATE_DIR", dir.parent().unwrap().join("state"))
        .env_remove("MCP_RETRY_STORE")
        .output()
        .unwrap();
    Output {
        code: out.status.code().expect("an exit code"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// The proxies' documents in `status --json`.
fn status_json(dir: &Path) -> Vec<Value> {
    let out = status(dir, &["--json"]);
    let v: Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("status --json: {e}: {}\n{}", out.stdout, out.stderr));
    serde_json::from_value(v["proxies"].clone())
        .unwrap_or_else(|e| panic!("status --json: {e}: {}", out.stdout))
}

/// Polls `status --json` until `ready` holds for the documents.
pub(crate) fn wait_for(dir: &Path, what: &str, ready: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + wait();
    loop {
        let docs = status_json(dir);
        if ready(&docs) {
            return docs;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; status --json: {docs:#?}"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// The table's lines of proxies: its header and a line each, before the
/// store's part.
pub(crate) fn proxy_lines(table: &str) -> Vec<&str> {
    table.lines().take_while(|l| !l.is_empty()).collect()
}

fn doc<'a>(docs: &'a [Value], server: &str) -> Option<&'a Value> {
    docs.iter().find(|d| d["server"] == server)
}

/// The cell of column `name` in a table line: numbers are aligned to the
/// right of their heading, words to its left.
fn cell<'a>(header: &str, line: &'a str, name: &str) -> &'a str {
    let at = header
        .find(name)
        .unwrap_or_else(|| panic!("no {name} in {header}"));
    let right = matches!(
        name,
        "PID" | "UPTIME" | "RESTARTS" | "CALLS" | "RETRIED" | "RECOVERED" | "FAILED" | "P95"
    );
    if right {
        line[..at + name.len()]
            .split_whitespace()
            .last()
            .unwrap_or("")
    } else {
        line[at..].split("  ").next().unwrap_or("").trim()
    }
}

/// `name{labels} value` lines of Prometheus text, by series.
fn samples(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').expect("series and value");
        let value = match value {
            "NaN" => f64::NAN,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
        };
        assert!(
            out.insert(series.to_owned(), value).is_none(),
            "{series} twice"
        );
    }
    out
}

#[test]
fn status_lists_live_proxies_worst_first_prunes_the_dead_and_exits_1_on_an_open_breaker() {
    let rt = Runtime::new();
    let dir = rt.dir();
    let mut alpha = proxy(
        &dir,
        "alpha",
        "    circuit_breaker: {failure_threshold: 1, cooldown_seconds: 60}\n",
    );
    let mut beta = proxy(&dir, "beta", "");

    // alpha: one failure opens its breaker; the next call fails fast.
    alpha.call(json!(1), "echo", json!({"mode": "error"}));
    alpha.error(&json!(1));
    alpha.call(json!(2), "echo", json!({"text": "refused"}));
    assert_eq!(alpha.error(&json!(2))["data"]["reason"], "circuit_open");
    // beta: a success and a final error, longer than the table's column,
    // that ends with its cause and quotes a secret. The success takes the
    // server 20 ms, so its latency is measured across a wait of the
    // dispatcher's (two events of one batch share a reading of the clock).
    beta.call(json!(1), "echo", json!({"mode": "slow", "ms": 20}));
    beta.result(&json!(1));
    beta.call(
        json!(2),
        "echo",
        json!({"mode": "error", "code": -32602, "message":
            "Error executing tool echo: the request to https://api.example.com/v1/items \
             was refused: bad input: API_TOKEN=abcdef0123456789"}),
    );
    beta.error(&json!(2));

    let docs = wait_for(&dir, "both proxies' calls", |docs| {
        let done = |server, calls| {
            doc(docs, server).is_some_and(|d| {
                d["total"]["calls"] == calls
                    && d["total"]["failed"].as_u64() == Some(calls)
                    && d["in_flight"] == 0
            })
        };
        done("alpha", 2)
            && doc(docs, "beta")
                .is_some_and(|d| d["total"]["failed"] == 1 && d["total"]["latency_count"] == 2)
    });
    // A file claiming a pid that does not exist, otherwise valid.
    let mut stale = doc(&docs, "alpha").unwrap().clone();
    let dead_pid = 2_147_483_646u32;
    stale["pid"] = json!(dead_pid);
    stale["server"] = json!("ghost");
    let stale_file = dir.join(format!("{dead_pid}.json"));
    std::fs::write(&stale_file, stale.to_string()).unwrap();
    // And one whose pid is alive but started later than the proxy that
    // wrote it: the pid was reused (this test's own pid stands in for it).
    stale["pid"] = json!(std::process::id());
    stale["pid_start"] = json!(1);
    stale["server"] = json!("reused");
    let reused_file = dir.join(format!("{}.json", std::process::id()));
    std::fs::write(&reused_file, stale.to_string()).unwrap();

    // --json: the worst first, the stale file pruned.
    let docs = status_json(&dir);
    let servers: Vec<&str> = docs.iter().map(|d| d["server"].as_str().unwrap()).collect();
    assert_eq!(servers, ["alpha", "beta"]);
    assert!(!stale_file.exists(), "the dead pid's file is pruned");
    assert!(!reused_file.exists(), "the reused pid's file is pruned");
    let (a, b) = (&docs[0], &docs[1]);
    assert_eq!(a["pid"], alpha.pid());
    assert_eq!(a["transport"], "stdio");
    assert!(a["config"].as_str().unwrap().ends_with("c.yaml"), "{a}");
    assert!(
        a["target"][0]
            .as_str()
            .unwrap()
            .ends_with("mock-mcp-server"),
        "{a}"
    );
    assert_eq!(a["breaker"]["state"], "open");
    let until = a["breaker"]["until_ms"].as_u64().unwrap();
    let now_ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let cooldown = crate::util::ms(60_000).as_millis() as u64;
    assert!(until > now_ms && until <= now_ms + cooldown, "{a}");
    assert_eq!(a["link"]["state"], "up");
    let echo = &a["tools"]["echo"];
    assert_eq!(
        echo["failed_by_reason"],
        json!({"server_error": 1, "circuit_open": 1})
    );
    assert_eq!(
        echo["latency_count"], 1,
        "the refused call never reached the server"
    );
    assert!(
        echo["last_error"]["message"]
            .as_str()
            .unwrap()
            .contains("circuit breaker"),
        "{echo}"
    );
    assert_eq!(b["breaker"]["state"], "closed");
    assert_eq!(b["tools"]["echo"]["calls"], 2);
    assert!(b["tools"]["echo"]["p95_ms"].as_f64().unwrap() > 0.0, "{b}");
    let last = b["tools"]["echo"]["last_error"]["message"]
        .as_str()
        .unwrap();
    assert!(
        last.contains("bad input") && last.contains("[redacted]"),
        "{last}"
    );
    assert!(!last.contains("abcdef0123456789"), "{last}");

    // The table: one line per server, the open breaker first, exit 1.
    let out = status(&dir, &[]);
    assert_eq!(out.code, 1, "an open breaker: {}{}", out.stdout, out.stderr);
    let lines = proxy_lines(&out.stdout);
    assert_eq!(lines.len(), 3, "{}", out.stdout);
    let header = lines[0];
    for col in [
        "SERVER",
        "PID",
        "STATE",
        "BREAKER",
        "UPTIME",
        "CALLS",
        "RETRIED",
        "RECOVERED",
        "FAILED",
        "P95",
        "LAST ERROR",
    ] {
        assert!(header.contains(col), "{header}");
    }
    let (la, lb) = (lines[1], lines[2]);
    assert_eq!(cell(header, la, "SERVER"), "alpha");
    assert_eq!(cell(header, la, "PID"), alpha.pid().to_string());
    assert_eq!(cell(header, la, "STATE"), "up");
    assert!(cell(header, la, "BREAKER").starts_with("open "), "{la}");
    assert_eq!(cell(header, la, "CALLS"), "2");
    assert_eq!(cell(header, la, "FAILED"), "2");
    // LAST ERROR keeps a long message's end, where the cause is.
    let last_a = cell(header, la, "LAST ERROR");
    assert!(last_a.starts_with("echo: …"), "{la}");
    assert!(last_a.contains("was not called (retry in "), "{la}");
    assert_eq!(cell(header, lb, "SERVER"), "beta");
    assert_eq!(cell(header, lb, "BREAKER"), "closed");
    assert_eq!(cell(header, lb, "CALLS"), "2");
    assert_eq!(cell(header, lb, "FAILED"), "1");
    assert_ne!(cell(header, lb, "P95"), "-");
    let last_b = cell(header, lb, "LAST ERROR");
    assert!(last_b.starts_with("echo: …"), "{lb}");
    assert!(
        last_b.ends_with("was refused: bad input: API_TOKEN=[redacted]"),
        "{lb}"
    );

    // Prometheus: the same figures, each family once.
    let out = status(&dir, &["--prometheus"]);
    assert_eq!(out.code, 1);
    let s = samples(&out.stdout);
    let (pa, pb) = (alpha.pid(), beta.pid());
    let get = |series: String| {
        *s.get(&series)
            .unwrap_or_else(|| panic!("no {series}:\n{}", out.stdout))
    };
    assert_eq!(
        get(format!(
            r#"mcp_retry_breaker_open{{server="alpha",pid="{pa}"}}"#
        )),
        1.0
    );
    assert_eq!(
        get(format!(
            r#"mcp_retry_breaker_open{{server="beta",pid="{pb}"}}"#
        )),
        0.0
    );
    assert_eq!(
        get(format!(r#"mcp_retry_up{{server="beta",pid="{pb}"}}"#)),
        1.0
    );
    assert_eq!(
        get(format!(
            r#"mcp_retry_calls_total{{server="beta",pid="{pb}",tool="echo"}}"#
        )),
        2.0
    );
    assert_eq!(
        get(format!(
            r#"mcp_retry_failed_total{{server="alpha",pid="{pa}",tool="echo",reason="circuit_open"}}"#
        )),
        1.0
    );
    assert_eq!(
        get(format!(
            r#"mcp_retry_call_duration_seconds_count{{server="beta",pid="{pb}",tool="echo"}}"#
        )),
        2.0
    );
    let types: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("# TYPE "))
        .collect();
    let helps = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("# HELP "))
        .count();
    assert_eq!(types.len(), helps);
    let mut names: Vec<&str> = types.iter().map(|l| l.split(' ').nth(2).unwrap()).collect();
    names.dedup();
    assert_eq!(names.len(), types.len(), "a family twice: {types:?}");

    // alpha exits: its file goes, and without an open breaker status says 0.
    let alpha_file = rt.file_of(&alpha);
    assert!(alpha_file.exists());
    alpha.close_stdin();
    assert!(alpha.wait().success());
    assert!(!alpha_file.exists(), "the file is removed at exit");
    let out = status(&dir, &[]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert_eq!(proxy_lines(&out.stdout).len(), 2, "{}", out.stdout);
    assert!(proxy_lines(&out.stdout)[1].starts_with("beta "));
    beta.close_stdin();
    assert!(beta.wait().success());
    assert_eq!(status_json(&dir), Vec::<Value>::new());
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn status_lists_keyed_calls_whose_outcome_is_unknown_until_a_late_answer_settles_them() {
    let rt = Runtime::new();
    let dir = rt.dir();
    let mut s = proxy(&dir, "delta", "    call_timeout: 0.3\n");
    s.list_tools();
    // One call that never answers in time, one that answers late: once
    // the test has seen it unknown.
    let answer = s.dir.join("answer-late");
    let keyed = |key: &str, until: &Path| {
        json!({"name": "echo", "arguments": {"mode": "slow", "until": crate::util::path_text(until),
            "cancellable": false}, "_meta": {"idempotencyKey": key}})
    };
    s.call_with(json!(1), keyed("pay-late", &answer));
    s.error(&json!(1));
    s.call_with(json!(2), keyed("pay-lost", &s.dir.join("never")));
    s.error(&json!(2));
    let docs = wait_for(&dir, "two unknown outcomes", |docs| {
        doc(docs, "delta").is_some_and(|d| {
            d["unknown_outcomes"]
                .as_array()
                .is_some_and(|u| u.len() == 2)
        })
    });
    let unknown = doc(&docs, "delta").unwrap()["unknown_outcomes"].clone();
    // Newest first.
    assert_eq!(unknown[0]["key"], "pay-lost", "{unknown}");
    assert_eq!(unknown[1]["key"], "pay-late", "{unknown}");
    for u in unknown.as_array().unwrap() {
        assert_eq!(u["tool"], "echo", "{u}");
        assert_eq!(u["cause"], "timeout", "{u}");
        let started = u["started_at_ms"].as_u64().unwrap();
        assert!(u["until_ms"].as_u64().unwrap() > started, "{u}");
    }
    let table = status(&dir, &[]).stdout;
    assert!(table.contains("calls whose outcome is unknown"), "{table}");
    let line = table
        .lines()
        .find(|l| l.contains("\"pay-lost\""))
        .unwrap_or_else(|| panic!("no pay-lost line: {table}"));
    assert!(line.starts_with("delta") && line.contains("echo"), "{line}");
    assert!(line.trim_end().ends_with("timeout"), "{line}");
    // The late success settles one: only the other is listed.
    std::fs::write(&answer, "").unwrap();
    wait_for(&dir, "the late success to settle pay-late", |docs| {
        doc(docs, "delta").is_some_and(|d| {
            d["unknown_outcomes"]
                .as_array()
                .is_some_and(|u| u.len() == 1 && u[0]["key"] == "pay-lost")
        })
    });
}

#[test]
fn the_status_file_is_private_and_not_rewritten_while_the_proxy_is_idle() {
    let rt = Runtime::new();
    let mut s = proxy(&rt.dir(), "gamma", "");
    s.call(json!(1), "echo", json!({"text": "once"}));
    s.result(&json!(1));
    let file = rt.file_of(&s);
    let read =
        || -> Option<Value> { serde_json::from_str(&std::fs::read_to_string(&file).ok()?).ok() };
    // The final state: the call counted, measured, and no longer in flight,
    // and the store (opened on its own thread) open.
    eventually("the call in the status file", || {
        read().is_some_and(|d| {
            d["total"]["calls"] == 1
                && d["total"]["latency_count"] == 1
                && d["in_flight"] == 0
                && d["store"]["state"] == "opened"
        })
    });
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&rt.dir()), 0o700);
    assert_eq!(mode(&file), 0o600);

    // Idle: at most one write per interval (`status_interval`, 100 ms here
    // where the proxy takes it, else 1 s; on the proxy's own clock) was allowed while it was busy; now nothing
    // changes, so nothing is written for three times as long. Real time:
    // what must not happen is a write by the proxy's own timer.
    let stamp = || {
        let m = std::fs::metadata(&file).unwrap();
        (m.modified().unwrap(), m.ino())
    };
    use std::os::unix::fs::MetadataExt;
    let before = stamp();
    let text = std::fs::read_to_string(&file).unwrap();
    let interval = match crate::util::SHORTENS {
        true => crate::util::STATUS_INTERVAL,
        false => Duration::from_secs(1),
    };
    let until = Instant::now() + 3 * crate::util::scaled(interval);
    while Instant::now() < until {
        assert_eq!(stamp(), before, "the file was rewritten while idle");
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);

    s.close_stdin();
    assert!(s.wait().success());
    assert!(!file.exists(), "the file is removed at exit");
    assert!(rt.dir().is_dir(), "the directory stays");
}

#[test]
fn a_runtime_directory_open_to_others_is_refused_and_the_proxy_runs_on() {
    let root = TempDir::new();
    let dir = root.join("shared");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut s = proxy(&dir, "delta", "");
    s.call(json!(1), "echo", json!({"text": "still works"}));
    s.result(&json!(1));
    let stderr = s.stderr_with("has mode 0755, not 0700");
    assert_eq!(
        stderr.matches("not publishing this proxy's status").count(),
        1,
        "said once: {stderr}"
    );
    assert!(stderr.contains("has mode 0755, not 0700"), "{stderr}");
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "nothing published"
    );

    let out = status(&dir, &[]);
    assert_eq!(out.code, 2, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stderr
            .contains("refusing to read the runtime directory"),
        "{}",
        out.stderr
    );
    s.close_stdin();
    assert!(s.wait().success());
}

#[test]
fn status_with_nothing_running_usage_errors_and_watch() {
    let rt = Runtime::new();
    let out = status(&rt.dir(), &[]);
    assert_eq!(out.code, 0);
    assert!(
        out.stdout.starts_with("no mcp-retry proxy is running"),
        "{}",
        out.stdout
    );
    assert_eq!(status_json(&rt.dir()), Vec::<Value>::new());
    // The store: none was made, and looking made none.
    let v: Value = serde_json::from_str(&status(&rt.dir(), &["--json"]).stdout).unwrap();
    assert_eq!(v["store"]["engine"], "local", "{v}");
    assert_eq!(v["store"]["records"], 0, "{v}");
    assert_eq!(v["unknown_outcomes"], json!([]), "{v}");
    assert!(!rt.root.join("state").exists());
    assert!(out.stdout.contains("\nstore: local "), "{}", out.stdout);
    for args in [
        &["--json", "--prometheus"][..],
        &["--watch", "soon"],
        &["--bogus"],
        &["--store", "redis://x"],
    ] {
        let out = status(&rt.dir(), args);
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        assert!(out.stdout.is_empty());
    }

    // --watch redraws without ANSI codes when stdout is not a terminal; the
    // directory comes from the environment this time.
    let mut s = proxy(&rt.dir(), "epsilon", "");
    s.call(json!(1), "echo", json!({}));
    s.result(&json!(1));
    eventually("the status file", || rt.file_of(&s).exists());
    let mut watch = Command::new(PROXY)
        .args(["status", "--watch", "0.2"])
        .env("MCP_RETRY_RUNTIME_DIR", rt.dir())
        .env("MCP_RETRY_STATE_DIR", rt.root.join("state"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = crossbeam_channel::unbounded();
    let stdout = watch.stdout.take().unwrap();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + wait();
    let mut seen = Vec::new();
    while seen
        .iter()
        .filter(|l: &&String| l.starts_with("SERVER"))
        .count()
        < 2
    {
        match rx.recv_deadline(deadline) {
            Ok(line) => seen.push(line),
            Err(_) => panic!("no second redraw; got {seen:?}"),
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(seen.iter().all(|l| !l.contains('\x1b')), "{seen:?}");
    assert!(seen.iter().any(|l| l.starts_with("epsilon ")), "{seen:?}");
    s.close_stdin();
    assert!(s.wait().success());
}

#[test]
fn status_skips_a_fifo_or_an_oversized_file_named_like_a_document_instead_of_hanging() {
    let rt = Runtime::new();
    let mut s = proxy(&rt.dir(), "zeta", "");
    s.call(json!(1), "echo", json!({}));
    s.result(&json!(1));
    eventually("the status file", || rt.file_of(&s).exists());
    // A FIFO nobody writes to: opening it to read would block for ever.
    let fifo = rt.dir().join(format!("{}.json", std::process::id()));
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success(), "mkfifo {fifo:?}");
    // A file far larger than any document.
    let big = rt.dir().join("1.json");
    std::fs::write(&big, vec![b' '; 5 << 20]).unwrap();
    let mut child = Command::new(PROXY)
        .args(["status", "--json", "--dir"])
        .arg(rt.dir())
        .env("MCP_RETRY_STATE_DIR", rt.root.join("state"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + wait();
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("status hung on a FIFO in its directory");
        }
        thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let docs = v["proxies"].as_array().unwrap();
    assert_eq!(docs.len(), 1, "{stdout}");
    assert_eq!(docs[0]["server"], "zeta");
    assert!(stderr.contains("not a regular file"), "{stderr}");
    assert!(
        fifo.exists() && big.exists(),
        "only documents of gone proxies are removed"
    );
}

#[test]
fn a_wrapped_command_is_listed_under_its_file_name() {
    // Two `run -- COMMAND` proxies without a config: each is named by its
    // command's file name, so the two are told apart.
    let rt = Runtime::new();
    let dir = rt.dir();
    let links = TempDir::new();
    let second = links.join("second-server");
    std::os::unix::fs::symlink(crate::util::MOCK, &second).unwrap();
    let second = second.display().to_string();
    let _a = Builder::wrap_mock()
        .env("MCP_RETRY_RUNTIME_DIR", &dir.display().to_string())
        .initialized();
    let _b = Builder::proxy(&["run", "--", &second])
        .env("MCP_RETRY_RUNTIME_DIR", &dir.display().to_string())
        .initialized();
    let docs = wait_for(&dir, "both proxies", |docs| docs.len() == 2);
    let mut names: Vec<&str> = docs.iter().filter_map(|d| d["server"].as_str()).collect();
    names.sort();
    assert_eq!(names, ["mock-mcp-server", "second-server"], "{docs:#?}");
    let table = status(&dir, &[]);
    let mut lines = proxy_lines(&table.stdout).into_iter();
    let header = lines.next().unwrap();
    let mut shown: Vec<&str> = lines.map(|l| cell(header, l, "SERVER")).collect();
    shown.sort();
    assert_eq!(
        shown,
        ["mock-mcp-server", "second-server"],
        "{}",
        table.stdout
    );
}
