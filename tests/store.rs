//! The store of idempotency keys that outlives the process (`store:
//! local`), through the binary: several `mcp-retry run` processes share one
//! state directory (`MCP_RETRY_STATE_DIR`, a temp dir of the test), as the
//! processes of one user on a host do.

use serde_json::{json, Value};

use crate::util::{eventually, path_text, source_marker, Builder, Session, TempDir};

const PROXY_ERROR: i64 = -31000;

/// A keyed echo call; `arguments` merged over `{"text": key}`.
fn keyed(key: &str, arguments: Value) -> Value {
    let mut args = json!({ "text": key });
    if let (Some(a), Some(more)) = (args.as_object_mut(), arguments.as_object()) {
        a.extend(more.clone());
    }
    json!({"name": "echo", "arguments": args, "_meta": {"idempotencyKey": key}})
}

/// The state directory inside `state` (the proxy makes it, mode 0700).
fn state_dir(state: &TempDir) -> String {
    state.join("state").display().to_string()
}

fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or("")
}

fn proxy_reason(e: &Value) -> &str {
    assert_eq!(e["code"], json!(PROXY_ERROR), "{e}");
    e["data"]["reason"].as_str().unwrap_or("")
}

/// Builds with the top-level `store:` line in the config.
fn local(state: &TempDir, policy: &str) -> Session {
    local_with(state, policy, |b| b)
}

/// [`local`], the builder changed by `f` first.
fn local_with(state: &TempDir, policy: &str, f: impl FnOnce(Builder) -> Builder) -> Session {
    let yaml = format!(
        "store: local\nservers:\n  mock:\n    command: {{mock}}\n{}",
        crate::util::dedent(policy)
            .lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    );
    let mut s = f(Builder::config(&yaml)
        .with_logs()
        .env("MCP_RETRY_STATE_DIR", &state_dir(state)))
    .initialized();
    s.list_tools();
    s
}

fn stop(mut s: Session) {
    s.close_stdin();
    s.wait();
}

#[test]
fn a_result_is_replayed_by_a_new_process_on_the_same_state_directory() {
    let state = TempDir::new();
    let mut a = local(&state, "");
    a.call_with(json!(1), keyed("pay-1", json!({})));
    assert_eq!(text(&a.result(&json!(1))), "pay-1");
    assert_eq!(a.executions("echo"), 1);
    stop(a);
    let mut b = local(&state, "");
    b.call_with(json!(1), keyed("pay-1", json!({})));
    let r = b.result(&json!(1));
    assert_eq!(text(&r), "pay-1");
    assert_eq!(source_marker(&r), Some("dedup"), "{r} {}", b.stderr());
    assert_eq!(b.executions("echo"), 0, "not run again");
    // Another key runs.
    b.call_with(json!(2), keyed("pay-2", json!({})));
    assert_eq!(source_marker(&b.result(&json!(2))), None);
    assert_eq!(b.executions("echo"), 1);
    // With `store: memory` (`--store` over the file) nothing is shared.
    stop(b);
    let mut c = Builder::config(&format!(
        "store: local\nservers:\n  mock:\n    command: {}\n",
        crate::util::MOCK
    ))
    .with_logs()
    .arg("--store")
    .arg("memory")
    .env("MCP_RETRY_STATE_DIR", &state_dir(&state))
    .initialized();
    c.call_with(json!(1), keyed("pay-1", json!({})));
    assert_eq!(source_marker(&c.result(&json!(1))), None);
    assert_eq!(c.executions("echo"), 1);
}

#[test]
fn a_key_reused_with_other_arguments_in_another_process_is_the_same_operation() {
    let state = TempDir::new();
    let reused = "reused with different arguments";
    let mut a = local(&state, "");
    a.call_with(json!(1), keyed("args-1", json!({"text": "one", "n": 1})));
    assert_eq!(text(&a.result(&json!(1))), "one");
    stop(a);
    // Other arguments, another process: replayed as within one process,
    // and the log says so, naming the tool and the key.
    let mut b = local(&state, "");
    b.call_with(json!(1), keyed("args-1", json!({"text": "two"})));
    let r = b.result(&json!(1));
    assert_eq!(text(&r), "one");
    assert_eq!(source_marker(&r), Some("dedup"), "{r}");
    assert_eq!(b.executions("echo"), 0);
    let line = b.stderr_with(reused);
    assert!(
        line.contains(&format!(
            "tool \"echo\": idempotency key \"args-1\" was {reused}"
        )),
        "{line}"
    );
    stop(b);
    // The same arguments in another member order are not other ones.
    let mut c = local(&state, "");
    c.call_with(json!(1), keyed("args-1", json!({"n": 1, "text": "one"})));
    assert_eq!(source_marker(&c.result(&json!(1))), Some("dedup"));
    assert!(c.not_logged(reused), "{}", c.stderr());
    stop(c);
    // A record keeps a fingerprint of the arguments, never their values
    // (a call that never answers: its record holds no result).
    let mut d = local(&state, "call_timeout: 300ms\n");
    let secret = "n0te-Zq8-value";
    d.call_with(
        json!(1),
        keyed("args-2", json!({"mode": "hang", "note": secret})),
    );
    assert_eq!(proxy_reason(&d.error(&json!(1))), "not_retried_unsafe");
    stop(d);
    let file = std::fs::read(state.join("state/store-v1.redb")).unwrap();
    let has = |needle: &str| file.windows(needle.len()).any(|w| w == needle.as_bytes());
    assert!(has("\"state\":\"unknown\""), "the record is in the file");
    assert!(!has(secret), "an argument's value is never stored");
}

#[test]
fn a_definite_error_releases_the_key_for_the_next_process() {
    let state = TempDir::new();
    let mut a = local(&state, "");
    let failing = keyed("err-1", json!({"mode": "error", "code": -32602}));
    a.call_with(json!(1), failing.clone());
    assert_eq!(a.error(&json!(1))["code"], json!(-32602));
    stop(a);
    let mut b = local(&state, "");
    b.call_with(json!(1), keyed("err-1", json!({})));
    assert_eq!(text(&b.result(&json!(1))), "err-1");
    assert_eq!(b.executions("echo"), 1, "released: it ran");
}

#[cfg(unix)]
#[test]
fn a_call_in_flight_when_its_proxy_stops_or_dies_is_not_run_again() {
    let state = TempDir::new();
    // SIGTERM: the proxy stops its server with the call at it (or, if it
    // ends first, marks its claim as it stops): unknown either way.
    let mut a = local(&state, "");
    a.call_with(json!(1), keyed("term-1", json!({"mode": "hang"})));
    eventually("the call to reach the server", || a.executions("echo") == 1);
    a.signal(libc::SIGTERM);
    a.wait();
    let mut b = local(&state, "");
    b.call_with(json!(1), keyed("term-1", json!({})));
    let e = b.error(&json!(1));
    assert_eq!(proxy_reason(&e), "earlier_attempt_unknown", "{e}");
    assert_eq!(e["data"]["outcome"], "unknown", "{e}");
    let cause = e["data"]["cause"].as_str().unwrap();
    assert!(["server_exited", "proxy_exited"].contains(&cause), "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("it may have run"),
        "{e}"
    );
    assert_eq!(b.executions("echo"), 0);
    stop(b);
    // kill -9: its lease (1 s here) runs out, and then the call is unknown.
    let lease = |b: Builder| b.shorten("lease", std::time::Duration::from_secs(1));
    let mut c = local_with(&state, "", lease);
    c.call_with(json!(1), keyed("kill-1", json!({"mode": "hang"})));
    eventually("the call to reach the server", || c.executions("echo") == 1);
    c.signal(libc::SIGKILL);
    c.wait();
    let mut d = local_with(&state, "", lease);
    d.call_with(json!(1), keyed("kill-1", json!({})));
    let e = d.error(&json!(1));
    assert_eq!(proxy_reason(&e), "earlier_attempt_unknown", "{e}");
    assert_eq!(e["data"]["cause"], "owner_lost", "{e}");
    assert!(e["data"]["startedMsAgo"].as_u64().unwrap() >= 1000, "{e}");
    assert_eq!(d.executions("echo"), 0);
}

#[test]
fn a_timed_out_call_is_unknown_to_another_process_until_its_late_success() {
    let state = TempDir::new();
    let mut a = local(&state, "call_timeout: 300ms\n");
    // It answers once another process has seen its outcome unknown.
    let answer = a.dir.join("answer-late");
    let slow = keyed(
        "slow-1",
        json!({"mode": "slow", "until": path_text(&answer), "cancellable": false}),
    );
    a.call_with(json!(1), slow.clone());
    assert_eq!(proxy_reason(&a.error(&json!(1))), "not_retried_unsafe");
    let mut b = local(&state, "");
    b.call_with(json!(1), keyed("slow-1", json!({})));
    let e = b.error(&json!(1));
    assert_eq!(proxy_reason(&e), "earlier_attempt_unknown", "{e}");
    assert_eq!(e["data"]["cause"], "timeout", "{e}");
    std::fs::write(&answer, "").unwrap();
    // The late success replaces the unknown record, for every process.
    eventually("the late success to be kept", || {
        a.logged("a late success arrived")
    });
    b.call_with(json!(2), keyed("slow-1", json!({})));
    let r = b.result(&json!(2));
    assert_eq!(text(&r), "slow-1");
    assert_eq!(source_marker(&r), Some("dedup"), "{r}");
    assert_eq!(a.executions("echo") + b.executions("echo"), 1);
}

#[test]
fn four_processes_with_the_same_keys_run_each_key_once() {
    let state = TempDir::new();
    let mut procs: Vec<Session> = (0..4).map(|_| local(&state, "")).collect();
    let keys: Vec<String> = (0..8).map(|i| format!("four-{i}")).collect();
    for s in &mut procs {
        for (i, k) in keys.iter().enumerate() {
            s.call_with(json!(i), keyed(k, json!({"mode": "slow", "ms": 150})));
        }
    }
    for s in &mut procs {
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(text(&s.result(&json!(i))), k.as_str());
        }
    }
    let runs: usize = procs.iter().map(|s| s.executions("echo")).sum();
    assert_eq!(runs, keys.len(), "each key ran once across the processes");
}

#[test]
fn no_env_or_header_value_reaches_the_store_file() {
    let state = TempDir::new();
    let yaml = "store: local\nservers:\n  mock:\n    command: {mock}\n    env:\n      MOCK_SECRET: s3cr3t-Zq8-value\n";
    let mut s = Builder::config(yaml)
        .with_logs()
        .env("MCP_RETRY_STATE_DIR", &state_dir(&state))
        .initialized();
    s.call_with(json!(1), keyed("secret-1", json!({})));
    s.result(&json!(1));
    stop(s);
    let file = std::fs::read(state.join("state/store-v1.redb")).unwrap();
    let has = |needle: &str| file.windows(needle.len()).any(|w| w == needle.as_bytes());
    assert!(has("secret-1"), "the kept result is in the file");
    assert!(!has("s3cr3t-Zq8-value"), "an env value is never stored");
    assert!(!has("MOCK_SECRET"), "nor its name");
}

#[test]
fn a_corrupt_store_file_is_set_aside_with_a_warning() {
    let state = TempDir::new();
    let dir = state.join("state");
    std::fs::create_dir(&dir).unwrap();
    let path = dir.join("store-v1.redb");
    std::fs::write(&path, vec![0x42u8; 8192]).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let mut s = local(&state, "");
    s.call_with(json!(1), keyed("c-1", json!({})));
    assert_eq!(text(&s.result(&json!(1))), "c-1");
    eventually("the warning", || s.logged("set aside"));
    let aside = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".set-aside-"))
        .count();
    assert_eq!(aside, 1);
}

#[cfg(unix)]
#[test]
fn the_store_file_survives_writers_killed_in_a_loop() {
    let state = TempDir::new();
    for round in 0..4 {
        let mut writers: Vec<Session> = (0..3).map(|_| local(&state, "")).collect();
        for (n, w) in writers.iter_mut().enumerate() {
            for i in 0..20 {
                let k = format!("loop-{round}-{n}-{i}");
                w.call_with(json!(i), keyed(&k, json!({})));
            }
        }
        // Killed while they claim and record.
        std::thread::sleep(std::time::Duration::from_millis(30 * round));
        for w in &mut writers {
            w.signal(libc::SIGKILL);
            w.wait();
        }
    }
    let mut s = local(&state, "");
    s.call_with(json!(1), keyed("after", json!({})));
    assert_eq!(text(&s.result(&json!(1))), "after");
    assert!(s.not_logged("set aside"), "{}", s.stderr());
}

/// `mcp-retry ARGS` reading the store in `state` (and an empty runtime
/// directory beside it): its stdout, after it succeeded.
fn looking(state: &TempDir, args: &[&str]) -> String {
    let out = crate::util::proxy_in(state.path())
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {stdout}\n{stderr}");
    stdout
}

#[test]
fn status_and_check_show_the_unknown_outcome_a_stopped_proxy_left() {
    let state = TempDir::new();
    // Nothing kept yet: status says so and makes nothing.
    let table = looking(&state, &["status"]);
    assert!(table.contains("no file yet"), "{table}");
    assert!(!state.join("state").exists());
    let mut a = local(&state, "");
    a.call_with(json!(1), keyed("stat-1", json!({"mode": "hang"})));
    eventually("the call to reach the server", || a.executions("echo") == 1);
    // Its client goes away with the call at the server: unknown.
    stop(a);
    let v: Value = serde_json::from_str(&looking(&state, &["status", "--json"])).unwrap();
    assert_eq!(v["proxies"], json!([]), "the proxy is gone: {v}");
    assert_eq!(v["store"]["engine"], "local", "{v}");
    assert_eq!(v["store"]["reachable"], true, "{v}");
    assert_eq!(v["store"]["records"], 1, "{v}");
    let place = v["store"]["place"].as_str().unwrap();
    assert!(place.ends_with("store-v1.redb"), "{v}");
    let u = &v["unknown_outcomes"][0];
    assert_eq!(
        (&u["server"], &u["tool"], &u["key"], &u["seen_in"]),
        (
            &json!("mock"),
            &json!("echo"),
            &json!("stat-1"),
            &json!("store")
        ),
        "{v}"
    );
    let cause = u["cause"].as_str().unwrap();
    assert!(["server_exited", "proxy_exited"].contains(&cause), "{v}");
    assert!(u["until_ms"].as_u64() > u["started_at_ms"].as_u64(), "{v}");
    let table = looking(&state, &["status"]);
    assert!(table.contains("calls whose outcome is unknown"), "{table}");
    let row = table.lines().find(|l| l.contains("\"stat-1\"")).unwrap();
    assert!(row.starts_with("mock    echo"), "{table}");
    // check of the config reports the store and the call.
    let config = state.write(
        "c.yaml",
        &format!(
            "store: local\nservers:\n  mock:\n    command: {}\n",
            crate::util::MOCK
        ),
    );
    let config = config.display().to_string();
    let out = looking(&state, &["check", "--config", &config]);
    let line = out.lines().find(|l| l.starts_with("[STORE] ")).unwrap();
    assert!(line.starts_with("[STORE] local "), "{out}");
    assert!(line.contains("1 record"), "{out}");
    assert!(
        line.ends_with("1 call whose outcome is unknown (mcp-retry status lists it)"),
        "{out}"
    );
    let out = looking(&state, &["check", "--config", &config, "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["stores"][0]["unknown_outcomes"], 1, "{v}");
    assert_eq!(v["stores"][0]["engine"], "local", "{v}");
}

#[cfg(unix)]
#[test]
fn a_proxy_publishes_its_store_and_what_it_did() {
    let state = TempDir::new();
    let mut a = local(&state, "");
    a.call_with(json!(1), keyed("pub-1", json!({})));
    a.result(&json!(1));
    let mut b = local(&state, "");
    b.call_with(json!(1), keyed("pub-1", json!({})));
    assert_eq!(source_marker(&b.result(&json!(1))), Some("dedup"));
    let runtime = b.dir.join("runtime");
    let docs = crate::status::wait_for(&runtime, "the replay in the status", |docs| {
        docs.first()
            .is_some_and(|d| d["store"]["replays"] == 1 && d["store"]["state"] == "opened")
    });
    let store = &docs[0]["store"];
    assert_eq!(store["engine"], "local", "{store}");
    assert!(store["operations"].as_u64().unwrap() >= 1, "{store}");
    assert!(
        store["place"].as_str().unwrap().ends_with("store-v1.redb"),
        "{store}"
    );
    stop(a);
    stop(b);
}
