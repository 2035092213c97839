//! Lifecycle: shutdown on EOF and signals, no processes left behind, a server
//! that cannot start, and a server that exits.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::util::{gone_within, read_pid, Builder};

#[test]
fn stdin_eof_stops_the_server_and_exits_zero() {
    let mut s = Builder::wrap_mock()
        .with_logs()
        .env("MOCK_GRANDCHILD", "1")
        .start();
    s.initialize();
    let pid_file = s.dir.join("grandchild.pid");
    let grandchild = read_pid(&pid_file);
    s.close_stdin();
    let status = s.wait();
    assert_eq!(status.code(), Some(0), "stderr:\n{}", s.stderr());
    assert!(
        gone_within(grandchild, Duration::from_secs(5)),
        "grandchild {grandchild} survived"
    );
}

#[test]
fn a_server_ignoring_eof_is_terminated_then_killed() {
    let mut s = Builder::wrap_mock().env("MOCK_IGNORE_EOF", "1").start();
    s.initialize();
    let started = Instant::now();
    s.close_stdin();
    let status = s.wait();
    assert_eq!(status.code(), Some(0));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(3),
        "close, 2 s, SIGTERM (ignored), 2 s, SIGKILL: took {took:?}"
    );
    assert!(s.stderr().contains("killing it"), "{}", s.stderr());
}

#[test]
fn sigterm_stops_the_server_and_its_group() {
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        let mut s = Builder::wrap_mock()
            .with_logs()
            .env("MOCK_GRANDCHILD", "1")
            .start();
        s.initialize();
        let grandchild = read_pid(&s.dir.join("grandchild.pid"));
        s.signal(sig);
        let status = s.wait();
        assert_eq!(status.code(), Some(128 + sig), "stderr:\n{}", s.stderr());
        assert!(
            gone_within(grandchild, Duration::from_secs(5)),
            "signal {sig}: grandchild survived"
        );
    }
}

#[test]
fn a_sigkilled_proxy_leaves_no_server_behind() {
    let pid_dir = crate::util::TempDir::new();
    let pid_file = pid_dir.join("server.pid");
    let mut s = Builder::wrap_mock()
        .env("MOCK_PID_FILE", &pid_file.display().to_string())
        .start();
    s.initialize();
    let server = read_pid(&pid_file);
    s.signal(libc::SIGKILL);
    s.wait();
    assert!(
        gone_within(server, Duration::from_secs(5)),
        "server {server} outlived a SIGKILLed proxy"
    );
}

#[test]
fn a_command_that_cannot_start_answers_every_request() {
    let mut s = Builder::proxy(&["run", "--", "/nonexistent/mcp-server", "--flag"]).start();
    s.request(json!(0), "initialize", json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}));
    let e = s.error(&json!(0));
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains("cannot start \"/nonexistent/mcp-server\""),
        "{e}"
    );
    assert_eq!(e["data"]["reason"], "server_unavailable");
    assert_eq!(e["data"]["source"], "mcp-retry");
    s.request(json!(1), "tools/list", json!({}));
    assert_eq!(s.error(&json!(1))["data"]["reason"], "server_unavailable");
    assert!(s.stderr().contains("/nonexistent/mcp-server"));
    s.close_stdin();
    assert_eq!(s.wait().code(), Some(0));
}

#[test]
fn calls_in_flight_when_the_server_exits_get_exactly_one_answer() {
    let mut s = Builder::wrap_mock().start();
    s.initialize();
    s.call(json!("slow"), "echo", json!({"mode": "hang"}));
    s.call(
        json!("boom"),
        "echo",
        json!({"mode": "crash", "stderr": "fatal: out of cheese"}),
    );
    for id in ["slow", "boom"] {
        let e = s.error(&json!(id));
        assert_eq!(e["data"]["reason"], "server_exited", "{e}");
        assert_eq!(e["data"]["outcome"], "unknown", "{e}");
        assert!(
            e["message"].as_str().unwrap().contains("out of cheese"),
            "{e}"
        );
    }
    s.expect_none_where(Duration::from_millis(300), |v| v.get("id").is_some());
}

#[test]
fn a_call_waiting_for_a_retry_at_eof_still_gets_its_answer() {
    let mut s = Builder::proxy(&["run", "--config", "{dir}/c.yaml"])
        .file(
            "c.yaml",
            "servers:\n  m:\n    command: {mock}\n    retry:\n      base_delay: 5\n      jitter: 0\n",
        )
        .start();
    s.initialize();
    s.request(json!("t"), "tools/list", json!({}));
    s.result(&json!("t"));
    s.call(json!("r"), "idem_echo", json!({"mode": "flaky"}));
    crate::util::eventually("the retry to be scheduled", || {
        s.stderr().contains("retrying in")
    });
    s.close_stdin();
    let e = s.error(&json!("r"));
    assert_eq!(e["data"]["reason"], "server_unavailable", "{e}");
    assert_eq!(s.wait().code(), Some(0));
}
