//! Panics contained, through the real binary built with the `fault-inject`
//! feature (`make test` builds it so): `MCP_RETRY_FAULT` makes the
//! dispatcher panic on a call of a chosen tool. Every request in flight is
//! answered once with `internal_error`, the server is stopped and the
//! proxy exits non-zero. (The exporter's fault is in `otel.rs`, with its
//! collector.)

use serde_json::json;

use crate::util::{eventually, gone_within, read_pid, wait, Builder};

#[test]
fn a_dispatcher_panic_answers_every_pending_request_and_exits_non_zero() {
    let builder = Builder::wrap_mock().with_logs();
    let pid_file = builder.dir().join("mock.pid");
    // The server inherits the proxy's environment.
    let mut s = builder
        .env("MCP_RETRY_FAULT", "dispatcher:explode")
        .env("MOCK_PID_FILE", &pid_file.display().to_string())
        .initialized();
    let server = read_pid(&pid_file);
    // Two calls the server holds, a third that joins the first (the same
    // tool and arguments) and a ping, answered: the proxy has handled all
    // of them when the faulting call arrives.
    s.call(json!(1), "echo", json!({"mode": "hang", "text": "a"}));
    s.call(json!("two"), "echo", json!({"mode": "hang", "text": "b"}));
    s.call(
        json!("joined"),
        "echo",
        json!({"mode": "hang", "text": "a"}),
    );
    eventually("the server to hold both calls", || {
        s.executions("echo") == 2
    });
    s.request(json!(3), "ping", json!({}));
    s.result(&json!(3));
    s.call(json!(4), "explode", json!({}));
    let pending = [json!(1), json!("two"), json!("joined"), json!(4)];
    for id in &pending {
        let e = s.error(id);
        assert_eq!(e["code"], -31000, "{e}");
        assert_eq!(e["data"]["reason"], "internal_error", "{e}");
        assert_eq!(e["data"]["source"], "mcp-retry", "{e}");
    }
    let status = s.wait();
    assert_eq!(status.code(), Some(70), "{}", s.stderr());
    // Exactly one answer each: nothing more came before stdout closed.
    s.expect_none_where(crate::util::ms(1000), |v| v.get("id").is_some());
    assert!(gone_within(server, wait()), "the server was left running");
    let stderr = s.stderr();
    let reports: Vec<&str> = stderr.lines().filter(|l| l.contains("panicked")).collect();
    assert_eq!(reports.len(), 1, "{stderr}");
    assert!(
        reports[0].contains("thread 'dispatcher' panicked at src/")
            && reports[0].contains("injected fault: dispatcher on a call of \"explode\"")
            && reports[0].contains("answering the 4 request(s) in flight"),
        "{stderr}"
    );
}

#[test]
fn a_call_of_another_tool_runs_as_ever_with_the_hook_armed() {
    let mut s = Builder::wrap_mock()
        .env("MCP_RETRY_FAULT", "dispatcher:explode")
        .initialized();
    s.call(json!(1), "echo", json!({"text": "hi"}));
    assert_eq!(s.result(&json!(1))["content"][0]["text"], "hi");
    s.close_stdin();
    assert!(s.wait().success(), "{}", s.stderr());
    assert!(!s.stderr().contains("panicked"), "{}", s.stderr());
}
