//! A server that cannot start is named at once, in its own words, well
//! before the host's own start timeout (Claude Code's: 30 s); one that is
//! only slow is still waited for, and one that never answers `initialize`
//! is answered before that timeout too.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::util::*;

fn initialize_params() -> Value {
    json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}})
}

/// The message of the `server_unavailable` error the client's `initialize`
/// gets within `d`, holding each of `words`.
fn unavailable_within(s: &mut Session, d: Duration, words: &[&str]) -> String {
    s.request(json!(0), "initialize", initialize_params());
    let Some(r) = s.response_within(&json!(0), d) else {
        panic!("no answer within {d:?}\nstderr:\n{}", s.stderr());
    };
    let e = &r["error"];
    assert_eq!(e["data"]["reason"], "server_unavailable", "{r}");
    let message = e["message"].as_str().unwrap().to_owned();
    for w in words {
        assert!(message.contains(w), "{w:?} in {message}");
    }
    message
}

#[test]
fn a_server_that_exits_at_every_start_is_named_within_three_seconds() {
    let mut s = Builder::wrap_mock()
        .with_logs()
        .env("MOCK_CRASH_AT_START", "3")
        .env("MOCK_CRASH_MESSAGE", "mock: missing API_KEY")
        .start();
    let t = Instant::now();
    let words = [
        "exited with status 3",
        "missing API_KEY",
        "check its command",
    ];
    unavailable_within(&mut s, Duration::from_secs(3), &words);
    assert!(s.starts() >= 3, "{} starts", s.starts());
    // A request that comes later is answered at once the same way.
    let t2 = Instant::now();
    s.request(json!(1), "tools/list", json!({}));
    let e = s.error(&json!(1));
    assert!(
        e["message"].as_str().unwrap().contains("missing API_KEY"),
        "{e}"
    );
    assert!(t2.elapsed() < Duration::from_secs(2), "{:?}", t2.elapsed());
    assert!(t.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_server_that_comes_up_after_failing_fast_serves_a_later_request() {
    // Three starts exit with status 4, the fourth works: the handshake is
    // answered at once with the cause, probes go on, and the client's next
    // handshake gets the server.
    let mut s = Builder::wrap_mock()
        .with_logs()
        .env("MOCK_CRASH_STARTS", "3")
        .start();
    s.request(json!(0), "initialize", initialize_params());
    let e = s.error(&json!(0));
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("exited with status 4"),
        "{e}"
    );
    eventually("a fourth start", || s.starts() >= 4);
    s.request(json!(1), "initialize", initialize_params());
    let r = s.result(&json!(1));
    assert!(r["protocolVersion"].is_string(), "{r}");
}

#[test]
fn fail_fast_at_start_false_waits_for_a_server_that_exits_at_every_start() {
    let mut s = Builder::mock_with("fail_fast_at_start: false\nwait_for_server: 1")
        .env("MOCK_CRASH_AT_START", "3")
        .start();
    let t = Instant::now();
    s.request(json!(0), "initialize", initialize_params());
    let e = s.error(&json!(0));
    assert!(t.elapsed() >= Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(e["data"]["reason"], "server_unavailable", "{e}");
    let message = e["message"].as_str().unwrap();
    // The answer says what it waited for, wait_for_server (scaled): the
    // queue's wait, or (on a slow machine, where the last start is still
    // under way when the wait ends) that start's handshake; never the
    // fail-fast diagnosis.
    let waited = duration_after(message, "gave up after waiting ")
        .or_else(|| duration_after(message, "did not answer initialize within "))
        .unwrap_or_else(|| panic!("no wait in {message}"));
    let wait_for_server = ms(1000);
    assert!(
        waited + Duration::from_millis(100) >= wait_for_server
            && waited < wait_for_server + Duration::from_secs(5),
        "{message}"
    );
    assert!(!message.contains("fail_fast_at_start"), "{message}");
    // Started again while it waited (about every half second): not given
    // up on after the first exit.
    assert!(s.starts() >= 2, "{} starts", s.starts());
}

#[test]
fn a_command_that_cannot_be_started_is_named_within_three_seconds() {
    let mut s = Builder::proxy(&["run", "--", "/nonexistent/mcp-server"]).start();
    let words = ["cannot start \"/nonexistent/mcp-server\""];
    unavailable_within(&mut s, Duration::from_secs(3), &words);
}

#[test]
fn an_unresolvable_host_is_named_within_three_seconds() {
    // RFC 6761: a name under .invalid does not exist, and resolvers say so
    // (NXDOMAIN) without asking the network.
    let mut s = Builder::remote_with("http://mcp-retry-test.invalid:8080/mcp", "").start();
    let words = ["mcp-retry-test.invalid", "does not exist; check the url"];
    unavailable_within(&mut s, Duration::from_secs(3), &words);
}

#[test]
fn a_server_that_reads_its_input_a_second_late_is_served() {
    let mut s = Builder::wrap_mock()
        .env("MOCK_START_DELAY_MS", "1000")
        .start();
    s.request(json!(0), "initialize", initialize_params());
    let r = s.result(&json!(0));
    assert!(r["protocolVersion"].is_string(), "{r}");
    s.notify("notifications/initialized", json!({}));
    s.call(json!(1), "echo", json!({"text": "late"}));
    assert_eq!(s.result(&json!(1))["content"][0]["text"], "late");
}

#[test]
fn a_server_that_never_answers_initialize_is_answered_after_wait_for_server() {
    // The wait before the first handshake is 20 s by default, below Claude
    // Code's 30 s (the dispatcher's unit tests, on a fake clock); here a
    // shorter one, end to end.
    let mut s = Builder::mock_with("wait_for_server: 500ms")
        .env("MOCK_NO_INIT_ANSWER", "1")
        .start();
    let t = Instant::now();
    let words = ["did not answer initialize within", "MCP_TIMEOUT"];
    unavailable_within(&mut s, wait(), &words);
    assert!(
        t.elapsed() >= Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
}

#[test]
fn a_crash_loops_stderr_line_is_copied_once_then_with_a_count() {
    // Waiting for a server that exits at every start, the proxy starts it
    // about every half second; its one line is not copied each time (five
    // starts: more than the copies allowed).
    let mut s = Builder::mock_with("fail_fast_at_start: false\nwait_for_server: 10")
        .env("MOCK_CRASH_AT_START", "3")
        .env("MOCK_CRASH_MESSAGE", "mock: the licence server is down")
        .start();
    s.request(json!(0), "initialize", initialize_params());
    eventually("five starts", || s.starts() >= 5);
    s.close_stdin();
    s.wait();
    let starts = s.starts();
    let copies = s
        .stderr_to_end()
        .lines()
        .filter(|l| l.starts_with("mock: the licence server is down"))
        .count();
    assert!(
        (1..=3).contains(&copies),
        "{copies} copies over {starts} starts\n{}",
        s.stderr()
    );
}
