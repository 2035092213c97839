//! Recovery after an outage, through the real binary: requests wait for a
//! server that is down, probes (not user calls) end the outage, the breaker
//! counts only what users asked for, and its trial call goes through.

use serde_json::{json, Value};

use crate::http_server::Server;
use crate::util::{eventually, Builder, Session};

/// A remote server's proxy with `extra` keys for the server entry.
fn remote(server: &Server, extra: &str) -> Session {
    Builder::remote_with(&server.url(), &format!("call_timeout: 10\n{extra}")).start()
}

fn initialize_params() -> Value {
    json!({"protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}})
}

fn count(s: &Session, needle: &str) -> usize {
    s.stderr().matches(needle).count()
}

#[test]
fn a_remote_server_that_listens_a_second_late_gets_the_clients_initialize() {
    let server = Server::start();
    server.close();
    let mut s = remote(&server, "");
    s.request(json!(0), "initialize", initialize_params());
    // Refused for now: it waits (and the proxy probes).
    eventually("a refused connection", || s.logged("could not be reached"));
    // It goes on waiting: probed again, refused again.
    eventually("a second refused connection", || {
        count(&s, "could not be reached") >= 2
    });
    server.reopen();
    let r = s.result(&json!(0));
    assert!(r["protocolVersion"].is_string(), "{r}");
    s.notify("notifications/initialized", json!({}));
    s.call(json!(1), "write", json!({}));
    assert_eq!(s.result(&json!(1))["content"][0]["text"], "write done");
    assert_eq!(server.executions("write"), 1);
    assert!(!s.stderr().contains("restarting"), "{}", s.stderr());
}

#[test]
fn a_call_made_while_the_endpoint_refuses_goes_through_once_when_it_is_back() {
    let server = Server::start();
    let mut s = remote(&server, "");
    s.initialize();
    server.close();
    // Not a safe tool: a refused connection is never-sent, safe for any.
    s.call(json!(1), "write", json!({}));
    eventually("a refused connection", || s.logged("could not be reached"));
    server.reopen();
    assert_eq!(s.result(&json!(1))["content"][0]["text"], "write done");
    assert_eq!(server.executions("write"), 1);
    assert!(
        s.logged("reconnected to the MCP server after"),
        "{}",
        s.stderr()
    );
}

#[test]
fn idle_reconnects_never_open_the_breaker() {
    let server = Server::start();
    let mut s = remote(
        &server,
        "wait_for_server: 0.5\ncircuit_breaker:\n  failure_threshold: 2\n",
    );
    s.initialize();
    server.close();
    s.call(json!(1), "write", json!({}));
    let e = s.error(&json!(1));
    assert_eq!(e["data"]["reason"], "server_unavailable", "{e}");
    // Nobody waits now: the proxy reconnects on its own, slowly; those
    // failures are not the breaker's.
    eventually("three reconnections", || count(&s, "reconnecting to") >= 3);
    assert!(!s.stderr().contains("circuit breaker"), "{}", s.stderr());
    assert!(!s.stderr().contains("restarting"), "{}", s.stderr());
    server.reopen();
    s.call(json!(2), "write", json!({}));
    assert_eq!(s.result(&json!(2))["content"][0]["text"], "write done");
    assert_eq!(server.executions("write"), 1);
}

/// The mock behind a shell that fails at once while the file `down` exists
/// in the session's directory: a server whose restarts fail.
#[cfg(unix)]
fn stdio_with_down_switch(extra: &str) -> Session {
    let config = format!(
        "servers:\n  m:\n    command: sh\n    args: [\"-c\", \"if [ -e '{{dir}}/down' ]; then echo 'mock: down' >&2; exit 1; fi; exec '{{mock}}'\"]\n    env:\n      MOCK_PID_FILE: \"{{dir}}/mock.pid\"\n{extra}"
    );
    Builder::config(&config).with_logs().start()
}

#[cfg(unix)]
fn kill_the_server(s: &Session) {
    let pid = crate::util::read_pid(&s.dir.join("mock.pid"));
    std::fs::remove_file(s.dir.join("mock.pid")).unwrap();
    crate::util::kill_pid(pid);
}

#[cfg(unix)]
#[test]
fn a_probe_ends_an_outage_before_any_call_and_the_next_call_goes_straight_through() {
    let mut s = stdio_with_down_switch("");
    s.initialize();
    std::fs::write(s.dir.join("down"), "").unwrap();
    kill_the_server(&s);
    eventually("two failed probes", || count(&s, "mock: down") >= 2);
    std::fs::remove_file(s.dir.join("down")).unwrap();
    // Nothing asked: a probe finds the server back.
    eventually("the outage to end", || {
        s.logged("the restarted MCP server is ready after")
    });
    let before = count(&s, "mock: started");
    s.call(json!(1), "unsafe_echo", json!({"text": "after"}));
    assert_eq!(s.result(&json!(1))["content"][0]["text"], "after");
    assert_eq!(count(&s, "mock: started"), before, "no start for the call");
}

#[cfg(unix)]
#[test]
fn the_trial_call_after_the_cooldown_is_sent_while_the_server_comes_back() {
    let mut s = stdio_with_down_switch(
        "    retry:\n      max_retries: 0\n    circuit_breaker:\n      failure_threshold: 2\n      cooldown_seconds: 0.6\n",
    );
    s.initialize();
    s.list_tools();
    // Two calls that crash the server: user calls that failed (each waits
    // for the restarted server's tool list, which says it is not safe to
    // run again), so the breaker opens.
    for id in [1, 2] {
        s.call(json!(id), "unsafe_echo", json!({"mode": "crash"}));
        let e = s.error(&json!(id));
        assert_eq!(e["data"]["reason"], "server_exited", "{e}");
    }
    eventually("the breaker to open", || s.logged("opened after"));
    s.call(json!(3), "unsafe_echo", json!({}));
    let e = s.error(&json!(3));
    assert_eq!(e["data"]["reason"], "circuit_open", "{e}");
    let after = e["data"]["retryAfterMs"].as_u64().unwrap();
    assert!(after as u128 <= crate::util::ms(600).as_millis(), "{e}");
    let cooldown_over = std::time::Instant::now() + std::time::Duration::from_millis(after + 50);
    // The server goes down, and its restarts fail for now.
    eventually("the server back", || s.dir.join("mock.pid").exists());
    std::fs::write(s.dir.join("down"), "").unwrap();
    kill_the_server(&s);
    eventually("a failed probe", || count(&s, "mock: down") >= 1);
    // The cooldown passes (the proxy's real time) while the server is
    // still down.
    std::thread::sleep(cooldown_over.saturating_duration_since(std::time::Instant::now()));
    std::fs::remove_file(s.dir.join("down")).unwrap();
    // The first call after it is the trial: it waits for the server, is
    // sent, and its answer closes the breaker.
    s.call(json!(4), "unsafe_echo", json!({"text": "trial"}));
    assert_eq!(s.result(&json!(4))["content"][0]["text"], "trial");
    assert!(s.logged("closed: the server is answering again"));
    s.call(json!(5), "unsafe_echo", json!({"text": "next"}));
    assert_eq!(s.result(&json!(5))["content"][0]["text"], "next");
}

#[test]
fn a_breaker_that_error_answers_opened_closes_only_through_the_trial_call() {
    let mut s = Builder::config("servers:\n  m:\n    command: {mock}\n    retry:\n      max_retries: 0\n    circuit_breaker:\n      failure_threshold: 2\n      cooldown_seconds: 0.6\n")
        .with_logs()
        .initialized();
    s.list_tools();
    for id in [1, 2] {
        s.call(json!(id), "ro_echo", json!({"mode": "error"}));
        s.error(&json!(id));
    }
    s.call(json!(3), "ro_echo", json!({}));
    let e = s.error(&json!(3));
    assert_eq!(e["data"]["reason"], "circuit_open", "{e}");
    crate::util::sleep_out_cooldown(&e);
    assert_eq!(s.executions("ro_echo"), 2, "refused calls never ran");
    // The trial fails: open again, for a whole cooldown.
    s.call(json!(4), "ro_echo", json!({"mode": "error"}));
    s.error(&json!(4));
    assert!(s.logged("reopened: the trial call failed"));
    s.call(json!(5), "ro_echo", json!({}));
    let e = s.error(&json!(5));
    assert_eq!(e["data"]["reason"], "circuit_open");
    crate::util::sleep_out_cooldown(&e);
    s.call(json!(6), "ro_echo", json!({"text": "ok"}));
    assert_eq!(s.result(&json!(6))["content"][0]["text"], "ok");
    assert_eq!(s.executions("ro_echo"), 4);
}

#[cfg(unix)]
#[test]
fn a_read_call_in_flight_at_a_crash_waits_for_the_restarted_servers_tool_list() {
    let mut s = stdio_with_down_switch("");
    s.initialize();
    s.list_tools();
    std::fs::write(s.dir.join("down"), "").unwrap();
    // The first run crashes the server; its restarts fail for a while.
    s.call(
        json!(1),
        "ro_echo",
        json!({"mode": "flaky", "how": "crash", "fail_times": 1, "text": "done"}),
    );
    eventually("two failed probes", || count(&s, "mock: down") >= 2);
    std::fs::remove_file(s.dir.join("down")).unwrap();
    // Its annotations are learned again from the new server: read-only,
    // so it runs again there.
    assert_eq!(s.result(&json!(1))["content"][0]["text"], "done");
    assert_eq!(s.executions("ro_echo"), 2);
}
