//! `tools/call` resilience: failure classification, the safety gate, retries
//! with backoff and hints, attempt timeouts and downstream cancels, dedup,
//! the result cache, the circuit breaker, proxy-originated errors and the
//! stats file.
//!
//! Every test counts what the mock really executed (its MOCK_LOG), so "the
//! answer was right" is never mistaken for "the tool ran the right number of
//! times". Delays are small (base_delay 0.05 s, call_timeout ≤ 1 s, cooldown
//! 1 s) to keep the suite fast; time assertions are lower bounds, or upper
//! bounds far from what the wrong behaviour would take.

use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::util::{dedent, eventually, path_text, source_marker, Builder, Session};

/// The code of every error the proxy originates.
const PROXY_ERROR: i64 = -31000;

/// Fast retries without jitter, for most tests.
const FAST: &str = "
call_timeout: 1
retry:
  base_delay: 0.05
  jitter: 0
";

/// Started and initialized (the client has NOT listed the tools).
fn start(policy: &str) -> Session {
    Builder::mock_with(policy).initialized()
}

fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or("")
}

/// Asserts a proxy-originated error with this reason; returns its message.
fn assert_proxy_error(e: &Value, reason: &str) -> String {
    assert_eq!(e["code"], json!(PROXY_ERROR), "{e}");
    assert_eq!(e["data"]["source"], "mcp-retry", "{e}");
    assert_eq!(e["data"]["reason"], reason, "{e}");
    assert!(e["data"]["attempts"].is_u64(), "data.attempts: {e}");
    e["message"].as_str().expect("a message").to_owned()
}

/// Asserts the mock's own flaky error, passed through unchanged.
fn assert_server_error(e: &Value, code: i64, message_part: &str) {
    assert_eq!(e["code"], json!(code), "{e}");
    assert!(
        e["message"].as_str().unwrap_or("").contains(message_part),
        "{e}"
    );
    assert!(
        e.get("data").is_none() || e["data"].get("source").is_none(),
        "the server's error must come back unchanged: {e}"
    );
}

/// Asserts that `tool` ran `n` times, for good: call after the last call's
/// answer. An answered call starts no attempt, and the mock logs an
/// execution as it reads the request, in order; so once a ping relayed
/// behind everything the proxy wrote before is answered by the server, no
/// execution can still be on its way.
fn assert_executions_stay(s: &mut Session, tool: &str, n: usize) {
    static PINGS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let id = json!(format!(
        "settle-{}",
        PINGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    s.request(id.clone(), "ping", json!({}));
    s.result(&id);
    assert_eq!(s.executions(tool), n, "executions of {tool}");
}

// ----- retries of safe tools -------------------------------------------

#[test]
fn an_idempotent_tool_failing_twice_succeeds_after_three_executions() {
    let mut s = start(FAST);
    s.call(
        json!(1),
        "idem_echo",
        json!({"mode": "flaky", "fail_times": 2, "text": "third time"}),
    );
    let r = s.result(&json!(1));
    assert_eq!(text(&r), "third time");
    assert_eq!(source_marker(&r), None, "{r}");
    assert_eq!(s.executions("idem_echo"), 3);
}

#[test]
fn a_read_only_tool_failing_twice_succeeds_after_three_executions() {
    let mut s = start(FAST);
    s.call(
        json!(1),
        "ro_echo",
        json!({"mode": "flaky", "fail_times": 2, "text": "third time"}),
    );
    assert_eq!(text(&s.result(&json!(1))), "third time");
    assert_eq!(s.executions("ro_echo"), 3);
}

#[test]
fn retries_stop_at_max_retries_and_the_servers_error_comes_back_unchanged() {
    let mut s = start(
        "
        call_timeout: 1
        retry:
          max_retries: 2
          base_delay: 0.05
          jitter: 0
        ",
    );
    s.call(
        json!(1),
        "idem_echo",
        json!({"mode": "flaky", "fail_times": 10}),
    );
    let e = s.error(&json!(1));
    assert_server_error(&e, -32000, "flaky failure 3 of 10");
    assert_executions_stay(&mut s, "idem_echo", 3);
}

#[test]
fn custom_transient_codes_decide_what_is_retried() {
    let mut s = start(
        "
        call_timeout: 1
        retry:
          base_delay: 0.05
          jitter: 0
          transient_codes: [-32050]
        ",
    );
    s.call(
        json!(1),
        "idem_echo",
        json!({"mode": "flaky", "key": "a", "code": -32050, "text": "ok"}),
    );
    assert_eq!(text(&s.result(&json!(1))), "ok");
    assert_eq!(s.executions("idem_echo"), 2, "-32050 is transient here");
    s.call(
        json!(2),
        "idem_echo",
        json!({"mode": "flaky", "key": "b", "code": -32000}),
    );
    assert_server_error(&s.error(&json!(2)), -32000, "flaky failure 1 of 1");
    assert_executions_stay(&mut s, "idem_echo", 3);
}

// ----- what is never retried ---------------------------------------------

#[test]
fn an_unsafe_tool_with_a_transient_error_runs_once_and_gets_the_servers_error() {
    let mut s = start(FAST);
    s.call(json!(1), "echo", json!({"mode": "flaky", "fail_times": 1}));
    assert_server_error(&s.error(&json!(1)), -32000, "flaky failure 1 of 1");
    assert_executions_stay(&mut s, "echo", 1);
}

#[test]
fn an_unsafe_tool_timing_out_runs_once_and_says_what_to_configure() {
    let mut s = start(
        "
        call_timeout: 0.5
        retry:
          base_delay: 0.05
        ",
    );
    s.call(json!(1), "echo", json!({"mode": "hang"}));
    let e = s.error(&json!(1));
    let message = assert_proxy_error(&e, "not_retried_unsafe");
    assert_eq!(e["data"]["attempts"], 1, "{e}");
    assert!(
        message.contains("not known to be idempotent")
            && message.contains("tools.echo.idempotent: true"),
        "the message must say why and what to set: {message}"
    );
    assert_executions_stay(&mut s, "echo", 1);
    let id = &s.execs_of("echo")[0]["id"];
    assert!(
        s.received("notifications/cancelled")
            .iter()
            .any(|c| &c["params"]["requestId"] == id),
        "the timed-out attempt {id} was not cancelled downstream"
    );
}

#[test]
fn timeouts_of_a_safe_tool_end_in_retries_exhausted() {
    let mut s = start(
        "
        call_timeout: 0.3
        retry:
          max_retries: 1
          base_delay: 0.05
          jitter: 0
        ",
    );
    s.call(json!(1), "idem_echo", json!({"mode": "hang"}));
    let e = s.error(&json!(1));
    assert_proxy_error(&e, "retries_exhausted");
    assert_eq!(e["data"]["attempts"], 2, "{e}");
    assert_executions_stay(&mut s, "idem_echo", 2);
}

#[test]
fn a_timeout_with_retries_off_is_reason_timeout() {
    let mut s = start(
        "
        call_timeout: 0.3
        retry:
          max_retries: 0
        ",
    );
    s.call(json!(1), "idem_echo", json!({"mode": "hang"}));
    let e = s.error(&json!(1));
    assert_proxy_error(&e, "timeout");
    assert_eq!(e["data"]["attempts"], 1, "{e}");
    assert_executions_stay(&mut s, "idem_echo", 1);
}

#[test]
fn an_unsafe_tool_whose_server_exits_gets_server_exited() {
    let mut s = start(FAST);
    s.call(json!(1), "echo", json!({"mode": "crash"}));
    let e = s.error(&json!(1));
    let message = assert_proxy_error(&e, "server_exited");
    assert_eq!(e["data"]["attempts"], 1, "{e}");
    assert!(message.contains("tools.echo.idempotent"), "{message}");
    assert_eq!(s.executions("echo"), 1);
}

#[test]
fn final_errors_and_is_error_results_run_once_even_for_safe_tools() {
    let mut s = start(FAST);
    for tool in ["idem_echo", "ro_echo"] {
        s.call(
            json!(format!("{tool}-invalid")),
            tool,
            json!({"mode": "error", "code": -32602, "message": "bad arguments"}),
        );
        let e = s.error(&json!(format!("{tool}-invalid")));
        assert_eq!(
            e,
            json!({"code": -32602, "message": "bad arguments"}),
            "unchanged"
        );
        s.call(
            json!(format!("{tool}-is-error")),
            tool,
            json!({"mode": "is_error", "text": "the tool failed"}),
        );
        let r = s.result(&json!(format!("{tool}-is-error")));
        assert_eq!(r["isError"], true, "{r}");
        assert_eq!(text(&r), "the tool failed");
    }
    assert_executions_stay(&mut s, "idem_echo", 2);
    assert_executions_stay(&mut s, "ro_echo", 2);
}

#[test]
fn an_error_the_server_marks_as_from_mcp_retry_is_final() {
    // A nested mcp-retry already gave up: retrying again would multiply attempts.
    let mut s = start(FAST);
    let error = json!({"mode": "error", "code": -32000, "message": "inner proxy gave up",
        "data": {"source": "mcp-retry", "reason": "retries_exhausted", "attempts": 4}});
    s.call(json!(1), "idem_echo", error);
    let e = s.error(&json!(1));
    assert_eq!(e["message"], "inner proxy gave up", "unchanged: {e}");
    assert_eq!(e["data"]["reason"], "retries_exhausted", "{e}");
    assert_executions_stay(&mut s, "idem_echo", 1);
}

// ----- the safety gate ----------------------------------------------------

/// How many times `tool` runs for one call that fails once with -32000,
/// under these policy keys (the client has listed the tools).
fn runs_after_one_transient_failure(policy: &str, tool: &str) -> usize {
    let mut s = start(&format!(
        "call_timeout: 1\nretry:\n  base_delay: 0.05\n  jitter: 0\n{}",
        dedent(policy)
    ));
    s.list_tools();
    s.call(json!(1), tool, json!({"mode": "flaky", "text": "ok"}));
    let r = s.response(&json!(1));
    let runs = s.executions(tool);
    match runs {
        1 => assert_server_error(&r["error"], -32000, "flaky failure 1 of 1"),
        _ => assert_eq!(text(&r["result"]), "ok", "{r}"),
    }
    // Nothing more runs later.
    assert_executions_stay(&mut s, tool, runs);
    runs
}

#[test]
fn the_safety_gate_decides_from_config_annotations_and_operator_settings() {
    let cases = [
        // (policy, tool, runs): 2 = retried once, 1 = not retried.
        ("", "echo", 1),
        ("", "idem_echo", 2),
        ("", "ro_echo", 2),
        ("", "destructive_echo", 1),
        ("tools:\n  echo:\n    idempotent: true\n", "echo", 2),
        ("tools:\n  echo:\n    read_only: true\n", "echo", 2),
        ("assume_idempotent: true\n", "echo", 2),
        // idempotent: false overrides annotations and assume_idempotent.
        (
            "assume_idempotent: true\ntools:\n  idem_echo:\n    idempotent: false\n",
            "idem_echo",
            1,
        ),
        ("trust_annotations: false\n", "idem_echo", 1),
        ("trust_annotations: false\n", "ro_echo", 1),
    ];
    for (policy, tool, runs) in cases {
        assert_eq!(
            runs_after_one_transient_failure(policy, tool),
            runs,
            "{tool} under {policy:?}"
        );
    }
}

#[test]
fn the_proxy_fetches_the_tool_list_itself_before_deciding_on_a_retry() {
    // The client never lists the tools and nothing is configured: only the
    // annotations say idem_echo is safe.
    let mut s = start(FAST);
    s.call(
        json!(1),
        "idem_echo",
        json!({"mode": "flaky", "text": "ok"}),
    );
    assert_eq!(text(&s.result(&json!(1))), "ok");
    assert_eq!(s.executions("idem_echo"), 2);
    assert!(
        !s.received("tools/list").is_empty(),
        "the proxy asked for the tool list"
    );
}

#[test]
fn the_proxy_waits_for_a_slow_tool_list_rather_than_guessing() {
    let mut s = Builder::mock_with(FAST)
        .env("MOCK_TOOLS_LIST_DELAY_MS", "500")
        .initialized();
    s.call(
        json!(1),
        "idem_echo",
        json!({"mode": "flaky", "text": "ok"}),
    );
    assert_eq!(text(&s.result(&json!(1))), "ok");
    assert_eq!(s.executions("idem_echo"), 2);
}

#[test]
fn a_tool_list_that_does_not_come_by_the_deadline_means_unsafe() {
    // The annotations would say "safe", but they arrive after total_timeout:
    // at the deadline the call is answered as unknown = unsafe.
    // (info logging: should the proxy spin, its debug lines would flood stderr.)
    let mut s = Builder::mock_with(
        "
        retry:
          base_delay: 0.05
          total_timeout: 1
        ",
    )
    .arg("--log-level")
    .arg("info")
    .env("MOCK_TOOLS_LIST_DELAY_MS", "4000")
    .initialized();
    s.call(json!(1), "idem_echo", json!({"mode": "flaky"}));
    let Some(r) = s.response_within(&json!(1), crate::util::ms(3000)) else {
        panic!("no answer within 3 s, though retry.total_timeout is 1 s");
    };
    assert_server_error(&r["error"], -32000, "flaky failure 1 of 1");
    s.request(json!("p"), "ping", json!({}));
    assert!(
        s.response_within(&json!("p"), crate::util::ms(2000))
            .is_some(),
        "the proxy stopped answering"
    );
    assert_eq!(s.executions("idem_echo"), 1);
}

#[test]
fn the_proxy_reads_every_page_of_the_tool_list() {
    let mut s = Builder::mock_with(FAST)
        .env("MOCK_TOOLS", "a,b,c,d,idem_last")
        .env("MOCK_TOOLS_PAGE_SIZE", "2")
        .initialized();
    s.call(
        json!(1),
        "idem_last",
        json!({"mode": "flaky", "text": "ok"}),
    );
    assert_eq!(text(&s.result(&json!(1))), "ok");
    assert_eq!(s.executions("idem_last"), 2);
    assert_eq!(s.received("tools/list").len(), 3, "three pages");
}

#[test]
fn an_argument_key_never_reaches_the_server_so_it_does_not_make_retries_safe() {
    // The server cannot deduplicate a key it never sees: a failure after the
    // call reached it stays ambiguous, and the unannotated tool runs once.
    let mut s = start(FAST);
    s.list_tools();
    s.call(
        json!(1),
        "echo",
        json!({"mode": "flaky", "text": "paid", "_idempotency_key": "pay-1"}),
    );
    assert_server_error(&s.error(&json!(1)), -32000, "flaky failure 1 of 1");
    let execs = s.execs_of("echo");
    assert_eq!(execs.len(), 1, "{execs:?}");
    assert!(
        execs[0]["arguments"].get("_idempotency_key").is_none(),
        "the key reached the server: {}",
        execs[0]
    );
    // A hung call with such a key is not retried either.
    let mut s = start(
        "
        call_timeout: 0.3
        retry:
          base_delay: 0.05
        ",
    );
    s.list_tools();
    s.call(
        json!(2),
        "echo",
        json!({"mode": "hang", "_idempotency_key": "destroy-1"}),
    );
    assert_proxy_error(&s.error(&json!(2)), "not_retried_unsafe");
    assert_eq!(s.executions("echo"), 1);
}

#[test]
fn a_meta_key_makes_retries_safe_only_where_the_server_honours_keys() {
    let params = json!({"name": "echo", "arguments": {"mode": "flaky", "text": "paid"},
        "_meta": {"idempotencyKey": "pay-2"}});
    // Not declared: the key is forwarded, but a failure is not retried.
    let mut s = start(FAST);
    s.list_tools();
    s.call_with(json!(1), params.clone());
    assert_server_error(&s.error(&json!(1)), -32000, "flaky failure 1 of 1");
    assert_eq!(s.executions("echo"), 1);
    // Declared for the server, or for the tool: retried, key forwarded.
    for policy in [
        "honors_idempotency_keys: true",
        "tools:\n  echo: {honors_idempotency_keys: true}",
    ] {
        let mut s = start(&format!("{FAST}\n{policy}"));
        s.list_tools();
        s.call_with(json!(1), params.clone());
        assert_eq!(text(&s.result(&json!(1))), "paid", "{policy}");
        let execs = s.execs_of("echo");
        assert_eq!(execs.len(), 2, "{policy}: {execs:?}");
        for e in &execs {
            assert_eq!(e["meta"]["idempotencyKey"], "pay-2", "{policy}: {e}");
        }
    }
    // Declared for the server, but not for this tool.
    let mut s = start(&format!(
        "{FAST}\nhonors_idempotency_keys: true\ntools:\n  echo: {{honors_idempotency_keys: false}}"
    ));
    s.list_tools();
    s.call_with(json!(1), params);
    s.error(&json!(1));
    assert_eq!(s.executions("echo"), 1);
}

// ----- timeouts, cancels, late answers, progress -------------------------

#[test]
fn a_hung_safe_call_is_cancelled_downstream_and_retried_under_a_new_id() {
    let mut s = start(
        "
        call_timeout: 0.5
        retry:
          base_delay: 0.05
          jitter: 0
        ",
    );
    s.call(
        json!(1),
        "idem_echo",
        json!({"mode": "flaky", "how": "hang", "text": "second try"}),
    );
    assert_eq!(text(&s.result(&json!(1))), "second try");
    let execs = s.execs_of("idem_echo");
    assert_eq!(execs.len(), 2, "{execs:?}");
    let (first, second) = (&execs[0]["id"], &execs[1]["id"]);
    assert_ne!(first, second, "the retry goes under a new downstream id");
    let cancels = s.received("notifications/cancelled");
    assert!(
        cancels.iter().any(|c| &c["params"]["requestId"] == first),
        "no cancel for the first attempt {first}: {cancels:?}"
    );
    assert!(
        !cancels.iter().any(|c| &c["params"]["requestId"] == second),
        "the successful attempt was cancelled: {cancels:?}"
    );
}

#[test]
fn a_per_tool_timeout_replaces_call_timeout() {
    let mut s = start(
        "
        call_timeout: 30
        tools:
          echo:
            timeout: 0.3
        ",
    );
    let started = Instant::now();
    s.call(json!(1), "echo", json!({"mode": "hang"}));
    assert_proxy_error(&s.error(&json!(1)), "not_retried_unsafe");
    assert!(
        started.elapsed() < crate::util::ms(10000),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn a_late_answer_from_an_abandoned_attempt_is_used() {
    // The first attempt times out at 0.5 s but answers at 0.8 s, while the
    // retry waits out its 2 s backoff: that answer is the call's answer and
    // the retry never runs.
    let mut s = start(
        "
        call_timeout: 0.5
        retry:
          base_delay: 2
          jitter: 0
        ",
    );
    let started = Instant::now();
    s.call(
        json!(1),
        "idem_echo",
        json!({"mode": "slow", "ms": 800, "cancellable": false, "text": "late but fine"}),
    );
    assert_eq!(text(&s.result(&json!(1))), "late but fine");
    assert!(
        started.elapsed() < crate::util::ms(2000),
        "answered only after {:?}",
        started.elapsed()
    );
    assert_executions_stay(&mut s, "idem_echo", 1);
    s.expect_none_where(crate::util::ms(100), |v| v.get("id") == Some(&json!(1)));
}

#[test]
fn progress_resets_the_attempt_timer() {
    // 4 steps of 300 ms: 1.2 s in all, but never 0.5 s without progress.
    let mut s = start(
        "
        call_timeout: 0.5
        retry:
          base_delay: 0.05
          jitter: 0
        ",
    );
    s.call_with(
        json!(1),
        json!({"name": "idem_echo", "arguments": {"mode": "progress", "steps": 4, "ms": 300, "text": "done"},
            "_meta": {"progressToken": "p-1"}}),
    );
    let mut progress = Vec::new();
    loop {
        let m = s.recv();
        if m.get("id") == Some(&json!(1)) {
            assert_eq!(text(&m["result"]), "done", "{m}");
            break;
        }
        assert_eq!(m["method"], "notifications/progress", "{m}");
        progress.push(m["params"]["progress"].as_f64().unwrap());
    }
    assert_eq!(progress, [1.0, 2.0, 3.0, 4.0]);
    assert_eq!(s.executions("idem_echo"), 1);
    assert!(s.received("notifications/cancelled").is_empty());
}

#[test]
fn a_client_cancel_during_backoff_stops_all_further_executions() {
    let mut s = start(
        "
        call_timeout: 1
        retry:
          base_delay: 1
          jitter: 0
        ",
    );
    s.call(json!("c"), "idem_echo", json!({"mode": "flaky"}));
    eventually("the retry to be scheduled", || s.logged("retrying in"));
    assert_eq!(s.executions("idem_echo"), 1);
    s.notify(
        "notifications/cancelled",
        json!({"requestId": "c", "reason": "user gave up"}),
    );
    // Past the backoff: no answer, no execution.
    s.expect_none_where(crate::util::ms(1300), |v| v.get("id") == Some(&json!("c")));
    assert_eq!(
        s.executions("idem_echo"),
        1,
        "no execution after the cancel"
    );
    s.request(json!("after"), "ping", json!({}));
    s.result(&json!("after"));
}

// ----- backoff, hints and bounds --------------------------------------------

#[test]
fn retry_after_ms_is_honoured() {
    let mut s = start(
        "
        call_timeout: 2
        retry:
          base_delay: 0.01
          jitter: 0
        ",
    );
    let started = Instant::now();
    s.call(
        json!(1),
        "idem_echo",
        json!({"mode": "retry_after", "ms": 400, "text": "ok"}),
    );
    assert_eq!(text(&s.result(&json!(1))), "ok");
    assert!(started.elapsed() >= Duration::from_millis(400));
    let execs = s.execs_of("idem_echo");
    assert_eq!(execs.len(), 2, "{execs:?}");
    let gap = execs[1]["at_ms"].as_u64().unwrap() - execs[0]["at_ms"].as_u64().unwrap();
    assert!(gap >= 390, "the retry came {gap} ms after the failure");
}

#[test]
fn retry_after_seconds_is_honoured() {
    let mut s = start(
        "
        call_timeout: 2
        retry:
          base_delay: 0.01
          jitter: 0
        ",
    );
    s.call(
        json!(1),
        "idem_echo",
        json!({"mode": "flaky", "data": {"retryAfter": 0.4}, "text": "ok"}),
    );
    assert_eq!(text(&s.result(&json!(1))), "ok");
    let execs = s.execs_of("idem_echo");
    assert_eq!(execs.len(), 2, "{execs:?}");
    let gap = execs[1]["at_ms"].as_u64().unwrap() - execs[0]["at_ms"].as_u64().unwrap();
    assert!(gap >= 390, "the retry came {gap} ms after the failure");
}

#[test]
fn total_timeout_bounds_all_attempts_and_waits() {
    // Without the bound: 11 attempts of 0.4 s (over 4 s).
    let mut s = start(
        "
        call_timeout: 0.4
        retry:
          max_retries: 10
          base_delay: 0.05
          jitter: 0
          total_timeout: 1
        ",
    );
    let started = Instant::now();
    s.call(json!(1), "idem_echo", json!({"mode": "hang"}));
    let e = s.error(&json!(1));
    let took = started.elapsed();
    assert_proxy_error(&e, "deadline_exceeded");
    assert!(took < crate::util::ms(2500), "took {took:?}");
    assert!(
        took >= Duration::from_millis(900),
        "gave up before the deadline: {took:?}"
    );
    assert!(s.executions("idem_echo") <= 3, "{:?}", s.exec_log());
}

#[test]
fn the_retry_budget_limits_retries_per_server() {
    let mut s = start(
        "
        call_timeout: 0.4
        retry:
          base_delay: 0.05
          jitter: 0
          budget:
            window: 30
            min_retries: 1
            ratio: 0
        ",
    );
    s.call(
        json!(1),
        "idem_echo",
        json!({"mode": "flaky", "how": "hang", "key": "a", "text": "ok"}),
    );
    assert_eq!(text(&s.result(&json!(1))), "ok", "the one retry allowed");
    s.call(
        json!(2),
        "idem_echo",
        json!({"mode": "flaky", "how": "hang", "key": "b", "text": "ok"}),
    );
    let e = s.error(&json!(2));
    let message = assert_proxy_error(&e, "retry_budget_exhausted");
    assert!(message.contains("budget"), "{message}");
    assert_executions_stay(&mut s, "idem_echo", 3);
}

// ----- dedup --------------------------------------------------------------

#[test]
fn a_call_repeated_after_its_answer_was_delivered_runs_again() {
    // A counter, a clock, a toggle, a writer: the client got the answer and
    // sends the same call again because it means it. Unannotated, annotated
    // `idempotentHint: false` (unsafe_echo), `idempotentHint: true`
    // (idem_echo) and configured `idempotent: false` alike.
    let mut s = start(&format!("{FAST}\ntools:\n  writer: {{idempotent: false}}"));
    s.list_tools();
    let mut id = 0;
    for tool in [
        "echo",
        "unsafe_echo",
        "idem_echo",
        "destructive_echo",
        "writer",
    ] {
        for _ in 0..3 {
            id += 1;
            s.call(json!(id), tool, json!({"text": "increment"}));
            let r = s.result(&json!(id));
            assert_eq!(source_marker(&r), None, "{tool}: {r}");
        }
        assert_eq!(s.executions(tool), 3, "{tool}");
    }
}

#[test]
fn argument_order_does_not_make_calls_different() {
    // Identical calls in flight share one execution, whatever the order of
    // their arguments' members.
    let mut s = start(FAST);
    s.send_raw(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"mode":"slow","ms":300,"a":1,"b":{"x":true,"y":[1,2]}}}}"#);
    s.send_raw(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"arguments":{ "b" : {"y":[1,2],"x":true}, "a":1, "ms":300, "mode":"slow" },"name":"echo"}}"#);
    s.result(&json!(1));
    assert_eq!(source_marker(&s.result(&json!(2))), Some("dedup"));
    assert_eq!(s.executions("echo"), 1);
}

#[test]
fn a_joined_call_still_gets_its_answer_when_the_first_caller_cancels() {
    let mut s = start(FAST);
    let args = json!({"mode": "slow", "ms": 500, "text": "shared"});
    s.call(json!("first"), "echo", args.clone());
    s.call(json!("joined"), "echo", args);
    eventually("the call reached the server", || s.executions("echo") == 1);
    s.notify("notifications/cancelled", json!({"requestId": "first"}));
    let r = s.result(&json!("joined"));
    assert_eq!(text(&r), "shared");
    assert_eq!(source_marker(&r), Some("dedup"), "{r}");
    s.expect_none_where(crate::util::ms(300), |v| {
        v.get("id") == Some(&json!("first"))
    });
    assert_eq!(s.executions("echo"), 1);
    assert!(
        s.received("notifications/cancelled").is_empty(),
        "the execution was still wanted"
    );
}

#[test]
fn identical_concurrent_calls_execute_once_and_each_gets_its_answer() {
    let mut s = start(FAST);
    s.call(
        json!("a"),
        "echo",
        json!({"mode": "slow", "ms": 300, "text": "once"}),
    );
    s.call(
        json!("b"),
        "echo",
        json!({"mode": "slow", "ms": 300, "text": "once"}),
    );
    let a = s.result(&json!("a"));
    let b = s.result(&json!("b"));
    assert_eq!(text(&a), "once");
    assert_eq!(text(&b), "once");
    assert_eq!(source_marker(&a), None, "{a}");
    assert_eq!(source_marker(&b), Some("dedup"), "{b}");
    assert_eq!(s.executions("echo"), 1);
}

#[test]
fn a_meta_idempotency_key_dedups_calls_with_different_arguments() {
    let mut s = start(FAST);
    s.call_with(
        json!(1),
        json!({"name": "echo", "arguments": {"text": "first"}, "_meta": {"idempotencyKey": "order-7"}}),
    );
    assert_eq!(text(&s.result(&json!(1))), "first");
    s.call_with(
        json!(2),
        json!({"name": "echo", "arguments": {"text": "second"}, "_meta": {"idempotencyKey": "order-7"}}),
    );
    let r = s.result(&json!(2));
    assert_eq!(text(&r), "first", "the key's first result: {r}");
    assert_eq!(source_marker(&r), Some("dedup"), "{r}");
    assert_eq!(s.executions("echo"), 1);
}

#[test]
fn an_argument_idempotency_key_dedups_and_never_reaches_the_server() {
    let mut s = start(FAST);
    s.call(
        json!(1),
        "echo",
        json!({"text": "first", "_idempotency_key": "order-8"}),
    );
    assert_eq!(text(&s.result(&json!(1))), "first");
    s.call(
        json!(2),
        "echo",
        json!({"text": "second", "_idempotency_key": "order-8"}),
    );
    let r = s.result(&json!(2));
    assert_eq!(text(&r), "first", "{r}");
    assert_eq!(source_marker(&r), Some("dedup"), "{r}");
    let execs = s.execs_of("echo");
    assert_eq!(execs.len(), 1, "{execs:?}");
    assert_eq!(execs[0]["arguments"], json!({"text": "first"}));
    let raw = std::fs::read_to_string(s.dir.join("recv.log")).unwrap();
    assert!(!raw.contains("_idempotency_key"), "{raw}");
}

/// Asserts the error of a keyed call not run again because an earlier one
/// may have run (`cause`); returns how long ago that one started (ms).
fn assert_not_run_again(e: &Value, cause: &str) -> u64 {
    let message = assert_proxy_error(e, "earlier_attempt_unknown");
    assert_eq!(e["data"]["outcome"], "unknown", "{e}");
    assert_eq!(e["data"]["cause"], cause, "{e}");
    assert!(message.contains("it may have run"), "{message}");
    e["data"]["startedMsAgo"]
        .as_u64()
        .expect("data.startedMsAgo")
}

#[test]
fn a_keyed_call_whose_outcome_is_unknown_is_never_run_again() {
    // The first call times out at the server and is not retried (the tool
    // is not known to be safe): it may have run. The same key again is the
    // same operation: it is not run, and says when the first started.
    let mut s = start(FAST);
    s.list_tools();
    // It answers once the test has seen its outcome unknown.
    let answer = s.dir.join("answer-late");
    let keyed = json!({"name": "echo",
        "arguments": {"mode": "slow", "until": path_text(&answer), "cancellable": false, "text": "paid"},
        "_meta": {"idempotencyKey": "K-123"}});
    s.call_with(json!(1), keyed.clone());
    assert_proxy_error(&s.error(&json!(1)), "not_retried_unsafe");
    s.call_with(json!(2), keyed.clone());
    let ago = assert_not_run_again(&s.error(&json!(2)), "timeout");
    assert!(ago >= 1000, "started before its 1s timeout: {ago}");
    // Other arguments under the key are the same operation all the same.
    let mut other = keyed.clone();
    other["arguments"]["text"] = json!("other");
    s.call_with(json!(3), other);
    assert_not_run_again(&s.error(&json!(3)), "timeout");
    assert_eq!(s.executions("echo"), 1);
    std::fs::write(&answer, "").unwrap();
    // The first call's success comes late: it replaces the unknown outcome.
    eventually("the late success to be kept", || {
        s.logged("a late success arrived")
    });
    s.call_with(json!(4), keyed);
    let r = s.result(&json!(4));
    assert_eq!(text(&r), "paid");
    assert_eq!(source_marker(&r), Some("dedup"), "{r}");
    assert_eq!(s.executions("echo"), 1);
}

#[test]
fn an_unknown_outcome_of_a_crash_or_a_cancel_keeps_its_key_from_running() {
    let mut s = start(FAST);
    s.list_tools();
    // The server crashes with the call: it may have run.
    let crash = json!({"name": "echo", "arguments": {"mode": "crash"},
        "_meta": {"idempotencyKey": "crash-1"}});
    s.call_with(json!(1), crash.clone());
    assert_proxy_error(&s.error(&json!(1)), "server_exited");
    s.call_with(json!(2), crash);
    assert_not_run_again(&s.error(&json!(2)), "server_exited");
    // The client cancels a call the server has: it may have run.
    let hang = json!({"name": "echo", "arguments": {"mode": "hang"},
        "_meta": {"idempotencyKey": "cancel-1"}});
    s.call_with(json!(3), hang.clone());
    eventually("the call reached the server", || s.executions("echo") == 2);
    s.notify("notifications/cancelled", json!({"requestId": 3}));
    eventually("the cancel to reach the server", || {
        !s.received("notifications/cancelled").is_empty()
    });
    s.call_with(json!(4), hang);
    assert_not_run_again(&s.error(&json!(4)), "cancelled");
    assert_eq!(s.executions("echo"), 2);
}

#[test]
fn a_keyed_success_too_large_to_keep_is_not_run_again() {
    let mut s = start(&format!("{FAST}idempotency_max_bytes: 2048\n"));
    let keyed = json!({"name": "echo", "arguments": {"mode": "huge", "bytes": 4096},
        "_meta": {"idempotencyKey": "big-1"}});
    s.call_with(json!(1), keyed.clone());
    assert_eq!(text(&s.result(&json!(1))).len(), 4096);
    s.call_with(json!(2), keyed);
    let e = s.error(&json!(2));
    let message = assert_proxy_error(&e, "already_ran");
    assert_eq!(e["data"]["outcome"], "succeeded", "{e}");
    assert!(e["data"]["ranMsAgo"].is_u64(), "{e}");
    assert!(message.contains("too large to keep"), "{message}");
    assert_eq!(s.executions("echo"), 1);
    // A result that fits is replayed as ever.
    let small = json!({"name": "echo", "arguments": {"text": "small"},
        "_meta": {"idempotencyKey": "small-1"}});
    s.call_with(json!(3), small.clone());
    s.result(&json!(3));
    s.call_with(json!(4), small);
    assert_eq!(source_marker(&s.result(&json!(4))), Some("dedup"));
    assert_eq!(s.executions("echo"), 2);
}

#[test]
fn a_key_is_released_when_its_outcome_is_known_or_the_tool_is_safe() {
    // Four calls time out: after 300 ms.
    let fast = FAST.replace("call_timeout: 1", "call_timeout: 0.3");
    let mut s = start(&format!(
        "{fast}  max_retries: 0\ncircuit_breaker:\n  failure_threshold: 100\n"
    ));
    s.list_tools();
    // The server's definite error: the next call with the key runs.
    let failing = json!({"name": "echo", "arguments": {"mode": "error"},
        "_meta": {"idempotencyKey": "err-1"}});
    for id in 1..=2 {
        s.call_with(json!(id), failing.clone());
        assert_server_error(&s.error(&json!(id)), -32000, "mock error");
    }
    assert_eq!(s.executions("echo"), 2);
    // A tool that is safe to run twice is not held back by its timeout.
    let idem = json!({"name": "idem_echo", "arguments": {"mode": "hang"},
        "_meta": {"idempotencyKey": "idem-1"}});
    s.call_with(json!(3), idem.clone());
    s.error(&json!(3));
    let runs = s.executions("idem_echo");
    s.call_with(json!(4), idem);
    let e = s.error(&json!(4));
    assert_ne!(e["data"]["reason"], "earlier_attempt_unknown", "{e}");
    assert!(s.executions("idem_echo") > runs);
    // Without a key, a call that timed out is not held back either.
    let keyless = json!({"name": "echo", "arguments": {"mode": "slow", "ms": 1500}});
    s.call_with(json!(5), keyless.clone());
    assert_proxy_error(&s.error(&json!(5)), "not_retried_unsafe");
    s.call_with(json!(6), keyless);
    let e = s.error(&json!(6));
    assert_ne!(e["data"]["reason"], "earlier_attempt_unknown", "{e}");
    assert_eq!(s.executions("echo"), 4, "{e}");
}

#[test]
fn identical_calls_to_a_read_only_tool_re_execute() {
    let mut s = start(FAST);
    s.list_tools();
    for id in 1..=3 {
        s.call(json!(id), "ro_echo", json!({"text": "now"}));
        let r = s.result(&json!(id));
        assert_eq!(source_marker(&r), None, "{r}");
    }
    assert_eq!(s.executions("ro_echo"), 3);
}

// ----- cache --------------------------------------------------------------

#[test]
fn default_ttl_caches_every_tool() {
    let mut s = start(
        "
        cache:
          default_ttl: 30
        ",
    );
    s.list_tools();
    s.call(json!(1), "ro_echo", json!({"text": "a"}));
    s.result(&json!(1));
    s.call(json!(2), "ro_echo", json!({"text": "a"}));
    assert_eq!(source_marker(&s.result(&json!(2))), Some("cache"));
    assert_eq!(s.executions("ro_echo"), 1);
}

#[test]
fn the_cache_never_stores_errors_or_is_error_results() {
    let mut s = start(
        "
        cache:
          default_ttl: 30
        ",
    );
    s.list_tools();
    for id in 1..=2 {
        s.call(
            json!(format!("e{id}")),
            "ro_echo",
            json!({"mode": "error", "code": -32602}),
        );
        s.error(&json!(format!("e{id}")));
        s.call(
            json!(format!("i{id}")),
            "ro_echo",
            json!({"mode": "is_error"}),
        );
        let r = s.result(&json!(format!("i{id}")));
        assert_eq!(r["isError"], true);
        assert_eq!(source_marker(&r), None, "{r}");
    }
    assert_eq!(s.executions("ro_echo"), 4);
}

#[test]
fn a_stale_entry_is_served_when_retries_are_exhausted() {
    let mut s = start(
        "
        retry:
          max_retries: 2
          base_delay: 0.05
          jitter: 0
        cache:
          tools:
            ro_echo: 0.1
          stale_if_error: 60
        ",
    );
    s.list_tools();
    // The flaky counter is past its failures for the first call...
    std::fs::write(s.dir.join("count-stale"), "100").unwrap();
    let args = json!({"mode": "flaky", "key": "stale", "fail_times": 100, "text": "fresh"});
    s.call(json!(1), "ro_echo", args.clone());
    assert_eq!(text(&s.result(&json!(1))), "fresh");
    // Past the entry's TTL (stored before its answer was sent).
    thread::sleep(crate::util::ms(150));
    // ...and back before them for the second.
    std::fs::write(s.dir.join("count-stale"), "0").unwrap();
    s.call(json!(2), "ro_echo", args);
    let r = s.result(&json!(2));
    assert_eq!(source_marker(&r), Some("stale"), "{r}");
    assert_eq!(text(&r), "fresh");
    assert_eq!(s.executions("ro_echo"), 4, "1 + 3 failed attempts");
}

#[test]
fn a_stale_entry_is_served_when_the_breaker_is_open() {
    let mut s = start(
        "
        circuit_breaker:
          failure_threshold: 1
          cooldown_seconds: 30
        cache:
          tools:
            ro_echo: 0.1
          stale_if_error: 60
        ",
    );
    s.list_tools();
    s.call(json!(1), "ro_echo", json!({"text": "fresh"}));
    s.result(&json!(1));
    // Past the entry's TTL (stored before its answer was sent).
    thread::sleep(crate::util::ms(150));
    // One transient failure of a read opens the breaker (a call that may
    // write would have emptied the cache).
    s.call(json!(2), "ro_echo", json!({"mode": "error"}));
    s.error(&json!(2));
    s.call(json!(3), "ro_echo", json!({"text": "x"}));
    assert_proxy_error(&s.error(&json!(3)), "circuit_open");
    s.call(json!(4), "ro_echo", json!({"text": "fresh"}));
    let r = s.response(&json!(4));
    assert_eq!(
        source_marker(&r["result"]),
        Some("stale"),
        "an expired entry within stale_if_error beats circuit_open: {r}"
    );
    assert_eq!(
        s.executions("ro_echo"),
        2,
        "the fresh read and the failing one"
    );
}

// ----- circuit breaker ----------------------------------------------------

#[test]
fn the_breaker_opens_fails_fast_then_closes_after_a_successful_trial() {
    // The exact schedule is tested on a fake clock (dispatcher tests); this
    // is the wiring, with a cooldown long enough that a loaded machine does
    // not reach it by accident before the checks of the open breaker.
    let mut s = start(
        "
        call_timeout: 1
        retry:
          base_delay: 0.05
          jitter: 0
        circuit_breaker:
          failure_threshold: 3
          cooldown_seconds: 1.5
        ",
    );
    for id in 1..=3 {
        s.call(json!(id), "echo", json!({"mode": "error"}));
        assert_eq!(s.error(&json!(id))["code"], -32000);
    }
    assert_eq!(s.executions("echo"), 3);
    let calls_sent = s.received("tools/call").len();

    s.call(json!(4), "echo", json!({"text": "fail fast"}));
    let e = s.error(&json!(4));
    let message = assert_proxy_error(&e, "circuit_open");
    let after = e["data"]["retryAfterMs"].as_u64().expect("retryAfterMs");
    let cooldown_over = Instant::now() + Duration::from_millis(after);
    assert!(
        after > 0 && after as u128 <= crate::util::ms(1500).as_millis(),
        "{e}"
    );
    assert!(message.contains("circuit breaker"), "{message}");
    assert_executions_stay(&mut s, "echo", 3);
    assert_eq!(
        s.received("tools/call").len(),
        calls_sent,
        "nothing written to the child"
    );

    // The cooldown's end, as the proxy counts it (real time).
    thread::sleep(
        cooldown_over.saturating_duration_since(Instant::now()) + Duration::from_millis(50),
    );
    s.call(json!(5), "echo", json!({"text": "trial"}));
    assert_eq!(text(&s.result(&json!(5))), "trial");
    s.call(json!(6), "echo", json!({"text": "closed again"}));
    assert_eq!(text(&s.result(&json!(6))), "closed again");
    assert_eq!(s.executions("echo"), 5);
}

/// A proxy whose breaker (threshold 1, cooldown 0.3 s) one error opened,
/// its cooldown over: the next call is the trial.
fn half_open_breaker() -> Session {
    let mut s = start(
        "
        circuit_breaker:
          failure_threshold: 1
          cooldown_seconds: 0.3
        ",
    );
    s.call(json!(1), "echo", json!({"mode": "error"}));
    s.error(&json!(1));
    // The breaker opened before that error was sent: the cooldown is over.
    thread::sleep(crate::util::ms(350));
    s
}

#[test]
fn a_failed_trial_reopens_the_breaker() {
    let mut s = half_open_breaker();
    s.call(
        json!(2),
        "echo",
        json!({"mode": "error", "message": "trial"}),
    );
    assert_eq!(s.error(&json!(2))["message"], "trial");
    s.call(json!(3), "echo", json!({"text": "x"}));
    assert_proxy_error(&s.error(&json!(3)), "circuit_open");
    assert_eq!(s.executions("echo"), 2);
}

#[test]
fn final_errors_and_is_error_results_do_not_open_the_breaker() {
    let mut s = start(
        "
        circuit_breaker:
          failure_threshold: 2
          cooldown_seconds: 30
        ",
    );
    for id in 1..=3 {
        s.call(
            json!(format!("e{id}")),
            "echo",
            json!({"mode": "error", "code": -32602, "message": format!("bad {id}")}),
        );
        assert_eq!(s.error(&json!(format!("e{id}")))["code"], -32602);
        s.call(
            json!(format!("i{id}")),
            "echo",
            json!({"mode": "is_error", "text": format!("tool error {id}")}),
        );
        assert_eq!(s.result(&json!(format!("i{id}")))["isError"], true);
    }
    s.call(json!("ok"), "echo", json!({"text": "still closed"}));
    assert_eq!(text(&s.result(&json!("ok"))), "still closed");
    assert_eq!(s.executions("echo"), 7);
}

#[test]
fn a_breaker_that_opens_answers_the_call_at_once_instead_of_scheduling_a_retry() {
    // The second failure opens the breaker: the retry it would refuse is not
    // scheduled (backoff would be 2 s); the client gets the breaker's error,
    // with the server's last error in data, right away.
    let mut s = start(
        "
        retry:
          max_retries: 5
          base_delay: 1
          jitter: 0
        circuit_breaker:
          failure_threshold: 2
          cooldown_seconds: 30
        ",
    );
    s.list_tools();
    let started = Instant::now();
    s.call(
        json!(1),
        "idem_echo",
        json!({"mode": "flaky", "fail_times": 10}),
    );
    let e = s.error(&json!(1));
    let took = started.elapsed();
    assert_proxy_error(&e, "circuit_open");
    assert_eq!(e["data"]["lastError"]["code"], -32000, "{e}");
    assert!(
        e["data"]["lastError"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("flaky failure 2 of 10")),
        "{e}"
    );
    assert!(
        took < crate::util::ms(2500),
        "answered after {took:?}: the refused retry was waited for"
    );
    assert_eq!(s.executions("idem_echo"), 2);
    // The harness reads stderr on a thread of its own: the log line may
    // come in after the answer.
    crate::util::eventually("the log line about the refused retry", || {
        s.logged("no retry: the circuit breaker")
    });
    s.call(json!(2), "idem_echo", json!({"text": "x"}));
    assert_proxy_error(&s.error(&json!(2)), "circuit_open");
    assert_eq!(s.executions("idem_echo"), 2);
}

#[test]
fn timeouts_count_toward_the_breaker() {
    let mut s = start(
        "
        call_timeout: 0.3
        circuit_breaker:
          failure_threshold: 2
          cooldown_seconds: 30
        ",
    );
    for id in 1..=2 {
        s.call(json!(id), "echo", json!({"mode": "hang", "n": id}));
        assert_proxy_error(&s.error(&json!(id)), "not_retried_unsafe");
    }
    s.call(json!(3), "echo", json!({"text": "x"}));
    assert_proxy_error(&s.error(&json!(3)), "circuit_open");
    assert_eq!(s.executions("echo"), 2);
}

#[test]
fn only_one_trial_goes_through_while_half_open() {
    let mut s = half_open_breaker();
    s.call(
        json!("trial"),
        "echo",
        json!({"mode": "slow", "ms": 500, "text": "trial"}),
    );
    eventually("the trial reached the server", || s.executions("echo") == 2);
    s.call(json!("other"), "echo", json!({"text": "other"}));
    let e = s.error(&json!("other"));
    assert_proxy_error(&e, "circuit_open");
    assert!(e["data"]["retryAfterMs"].is_u64(), "{e}");
    assert_eq!(text(&s.result(&json!("trial"))), "trial");
    s.call(json!("after"), "echo", json!({"text": "after"}));
    assert_eq!(text(&s.result(&json!("after"))), "after");
    assert_eq!(s.executions("echo"), 3);
}

#[test]
fn a_call_whose_server_exits_during_backoff_is_retried_on_the_restarted_server() {
    let mut s = start(
        "
        retry:
          base_delay: 1
          jitter: 0
        ",
    );
    s.call(
        json!(1),
        "idem_echo",
        json!({"mode": "flaky", "text": "recovered"}),
    );
    eventually("the retry to be scheduled", || s.logged("retrying in"));
    s.call(json!(2), "echo", json!({"mode": "crash"}));
    assert_proxy_error(&s.error(&json!(2)), "server_exited");
    let r = s.result(&json!(1));
    assert_eq!(r["content"][0]["text"], "recovered");
    assert_eq!(s.executions("idem_echo"), 2);
}

// ----- stats ----------------------------------------------------------------

#[test]
fn the_stats_file_and_the_exit_summary_count_per_tool() {
    let mut s = Builder::mock_with(FAST)
        .arg("--stats-file")
        .arg("{dir}/stats.json")
        .initialized();
    s.call(
        json!(1),
        "idem_echo",
        json!({"mode": "flaky", "text": "ok"}),
    );
    s.result(&json!(1));
    let keyed = json!({"name": "echo", "arguments": {"text": "a"},
        "_meta": {"idempotencyKey": "k"}});
    s.call_with(json!(2), keyed.clone());
    s.result(&json!(2));
    s.call_with(json!(3), keyed);
    s.result(&json!(3));
    s.call(json!(4), "echo", json!({"mode": "error", "code": -32602}));
    s.error(&json!(4));
    s.close_stdin();
    assert!(s.wait().success(), "{}", s.stderr());
    let path = s.dir.join("stats.json");
    let stats: Value = serde_json::from_str(
        &std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}")),
    )
    .unwrap();
    assert_eq!(stats["server"], "mock", "{stats}");
    let idem = &stats["tools"]["idem_echo"];
    assert_eq!(idem["calls"], 1, "{stats}");
    assert_eq!(idem["attempts"], 2, "{stats}");
    assert_eq!(idem["retried"], 1, "{stats}");
    assert_eq!(idem["recovered"], 1, "{stats}");
    assert_eq!(idem["failed"], 0, "{stats}");
    let echo = &stats["tools"]["echo"];
    assert_eq!(echo["calls"], 3, "{stats}");
    assert_eq!(echo["dedup_hits"], 1, "{stats}");
    assert_eq!(echo["failed"], 1, "{stats}");
    assert_eq!(stats["total"]["calls"], 4, "{stats}");
    assert!(
        s.logged("summary: 4 call(s), 4 attempt(s) sent, 1 call(s) retried"),
        "{}",
        s.stderr()
    );
}

#[test]
fn a_retried_call_that_still_fails_counts_as_retried() {
    let mut s = Builder::mock_with(
        "
        retry:
          max_retries: 1
          base_delay: 0.05
          jitter: 0
        ",
    )
    .arg("--stats-file")
    .arg("{dir}/stats.json")
    .initialized();
    s.call(
        json!(1),
        "idem_echo",
        json!({"mode": "flaky", "fail_times": 5}),
    );
    s.error(&json!(1));
    assert_eq!(s.executions("idem_echo"), 2);
    s.close_stdin();
    assert!(s.wait().success());
    let stats: Value =
        serde_json::from_str(&std::fs::read_to_string(s.dir.join("stats.json")).unwrap()).unwrap();
    let idem = &stats["tools"]["idem_echo"];
    assert_eq!(idem["failed"], 1, "{stats}");
    assert_eq!(
        idem["retried"], 1,
        "\"retried\" counts calls that needed a retry, whatever their outcome: {stats}"
    );
    assert_eq!(idem["recovered"], 0, "{stats}");
}

#[test]
fn the_proxy_learns_annotations_after_the_handshake_by_itself() {
    // The client never lists the tools; the proxy asks the server shortly
    // after `notifications/initialized`, so ro_echo is known read-only and
    // identical calls run again instead of being replayed.
    let mut s = start("");
    eventually("the proxy's own tools/list", || {
        !s.received("tools/list").is_empty()
    });
    for id in [1, 2] {
        s.call(json!(id), "ro_echo", json!({"text": "same"}));
        s.result(&json!(id));
    }
    assert_eq!(s.executions("ro_echo"), 2);
}

#[test]
fn a_late_success_after_a_timeout_answers_the_next_identical_call_once() {
    // The client was told "timed out, may or may not have run"; the success
    // comes later (once the test has had the timeout). The same call sent
    // again gets that success instead of running the write a second time;
    // a third identical call runs.
    let mut s = start(
        "
        call_timeout: 0.3
        ",
    );
    s.list_tools();
    let answer = s.dir.join("answer-late");
    let args =
        json!({"mode": "slow", "until": path_text(&answer), "cancellable": false, "text": "wrote"});
    s.call(json!(1), "unsafe_echo", args.clone());
    let e = s.error(&json!(1));
    assert_proxy_error(&e, "not_retried_unsafe");
    std::fs::write(&answer, "").unwrap();
    eventually("the late success", || s.stderr().contains("late success"));
    s.call(json!(2), "unsafe_echo", args.clone());
    let r = s.result(&json!(2));
    assert_eq!(source_marker(&r), Some("dedup"), "{r}");
    assert_eq!(text(&r), "wrote");
    assert_eq!(s.executions("unsafe_echo"), 1);
    s.call(json!(3), "unsafe_echo", json!({"text": "wrote"}));
    s.result(&json!(3));
    s.call(json!(4), "unsafe_echo", args);
    let r = s.result(&json!(4));
    assert_eq!(source_marker(&r), None, "ran again: {r}");
    assert_eq!(
        s.executions("unsafe_echo"),
        3,
        "the replay was handed out once"
    );
}

#[test]
fn a_late_success_after_the_client_cancelled_answers_the_next_identical_call_once() {
    let mut s = start(FAST);
    s.list_tools();
    // It answers once its cancel has reached the server.
    let answer = s.dir.join("answer-late");
    let args =
        json!({"mode": "slow", "until": path_text(&answer), "cancellable": false, "text": "sent"});
    s.call(json!("c"), "echo", args.clone());
    eventually("the call reached the server", || s.executions("echo") == 1);
    s.notify("notifications/cancelled", json!({"requestId": "c"}));
    eventually("the cancel to reach the server", || {
        !s.received("notifications/cancelled").is_empty()
    });
    std::fs::write(&answer, "").unwrap();
    eventually("the late success", || s.stderr().contains("late success"));
    s.call(json!(2), "echo", args.clone());
    let r = s.result(&json!(2));
    assert_eq!(source_marker(&r), Some("dedup"), "{r}");
    s.call(
        json!(3),
        "echo",
        json!({"mode": "slow", "ms": 1, "text": "sent"}),
    );
    s.result(&json!(3));
    s.call(json!(4), "echo", args);
    assert_eq!(source_marker(&s.result(&json!(4))), None);
    assert_eq!(s.executions("echo"), 3);
}

#[test]
fn a_delivered_result_of_a_dead_server_is_never_replayed() {
    let mut s = start(FAST);
    s.list_tools();
    s.call(json!(1), "echo", json!({"text": "before"}));
    let first = s.result(&json!(1));
    s.call(json!(2), "crasher", json!({"mode": "crash"}));
    s.error(&json!(2));
    s.call(json!(3), "echo", json!({"text": "before"}));
    let again = s.result(&json!(3));
    assert_eq!(source_marker(&again), None, "{again}");
    assert_ne!(
        again["structuredContent"]["pid"], first["structuredContent"]["pid"],
        "answered by the restarted server"
    );
    assert_eq!(s.executions("echo"), 2);
}

#[test]
fn explicit_keys_are_scoped_to_the_tool_and_say_when_arguments_differ() {
    let mut s = start(FAST);
    s.list_tools();
    let keyed = |tool: &str, text: &str| json!({"name": tool, "arguments": {"text": text}, "_meta": {"idempotencyKey": "op-9"}});
    s.call_with(json!(1), keyed("echo", "create"));
    s.result(&json!(1));
    // The same key on another tool is another operation: it runs.
    s.call_with(json!(2), keyed("unsafe_echo", "destroy"));
    let r = s.result(&json!(2));
    assert_eq!(source_marker(&r), None, "{r}");
    assert_eq!(text(&r), "destroy");
    assert_eq!(s.executions("unsafe_echo"), 1);
    // The same key on the same tool is the same operation, whatever the
    // arguments; the log names the tool and the key, not the values.
    s.call_with(json!(3), keyed("echo", "SECRET-VALUE"));
    let r = s.result(&json!(3));
    assert_eq!(source_marker(&r), Some("dedup"), "{r}");
    assert_eq!(text(&r), "create");
    assert_eq!(s.executions("echo"), 1);
    // stderr is read by another thread than the answers: wait for it.
    eventually("the reuse to be logged", || {
        s.logged("tool \"echo\": idempotency key \"op-9\" was reused with different arguments")
    });
    let log = s.stderr();
    assert!(!log.contains("SECRET-VALUE"), "{log}");
}

// ----- annotations per incarnation ------------------------------------------

#[test]
fn a_call_that_crashes_the_server_before_the_tools_are_known_is_decided_by_the_next_one() {
    // The first call right after the handshake crashes the server, so the
    // proxy's own tools/list dies with it: the restarted server is asked,
    // and idem_echo (idempotentHint: true) is retried on it.
    let mut s = start(FAST);
    s.call(
        json!(1),
        "idem_echo",
        json!({"mode": "flaky", "how": "crash", "text": "second time"}),
    );
    let r = s.result(&json!(1));
    assert_eq!(text(&r), "second time");
    assert_eq!(s.executions("idem_echo"), 2);
}

#[test]
fn a_tool_that_became_destructive_on_the_restarted_server_is_not_retried() {
    let mut s = Builder::mock_with(FAST)
        .file(
            "annotations.json",
            r#"{"flip": {"readOnlyHint": false, "idempotentHint": true}}"#,
        )
        .initialized();
    s.list_tools();
    // The next incarnation (a new version, say) calls it destructive.
    s.dir.write(
        "annotations.json",
        r#"{"flip": {"destructiveHint": true, "idempotentHint": false}}"#,
    );
    s.call(json!(1), "flip", json!({"mode": "flaky", "how": "crash"}));
    let e = s.error(&json!(1));
    assert_proxy_error(&e, "server_exited");
    assert_eq!(e["data"]["outcome"], "unknown", "{e}");
    assert_eq!(s.executions("flip"), 1);
    assert!(
        s.received("tools/list").len() >= 2,
        "the restarted server was asked for its tools"
    );
}

#[test]
fn the_proxys_own_tool_list_times_out_with_call_timeout() {
    // The list would come after 120 s; the call's total_timeout is 180 s.
    // The decision (unknown = unsafe) comes when our tools/list times out,
    // after 0.4 s (60 s leaves room for a loaded machine).
    let mut s = Builder::mock_with(
        "
        call_timeout: 0.4
        retry:
          base_delay: 0.05
          total_timeout: 180
        ",
    )
    .env("MOCK_TOOLS_LIST_DELAY_MS", "120000")
    .initialized();
    s.call(json!(1), "idem_echo", json!({"mode": "flaky"}));
    let Some(r) = s.response_within(&json!(1), crate::util::ms(60000)) else {
        panic!("no answer within 60 s: the tool list was waited for until it came");
    };
    assert_server_error(&r["error"], -32000, "flaky failure 1 of 1");
    assert_eq!(s.executions("idem_echo"), 1);
    // stderr is read by a thread of its own: the line may come after the answer.
    eventually("the log line about the proxy's tools/list", || {
        s.logged("did not answer the proxy's tools/list")
    });
}

// ----- time and progress -----------------------------------------------------

#[test]
fn a_server_ping_the_client_never_answers_pauses_nothing() {
    let mut s = start(
        "
        call_timeout: 0.3
        retry:
          max_retries: 0
          total_timeout: 30
        ",
    );
    s.list_tools();
    s.call(
        json!(1),
        "echo",
        json!({"mode": "raw", "line": r#"{"jsonrpc":"2.0","id":"srv-1","method":"ping"}"#}),
    );
    s.recv_where("the server's ping", |v| v["method"] == "ping");
    s.result(&json!(1));
    let started = Instant::now();
    s.call(json!(2), "unsafe_echo", json!({"mode": "hang"}));
    let e = s.error(&json!(2));
    let took = started.elapsed();
    let message = assert_proxy_error(&e, "not_retried_unsafe");
    assert!(
        took < crate::util::ms(10000),
        "answered after {took:?}: the unanswered ping paused the attempt"
    );
    // The message gives the time it really took (about 300 ms, scaled).
    let taken = crate::util::duration_after(&message, "timed out after ")
        .unwrap_or_else(|| panic!("no time: {message}"));
    let timeout = crate::util::ms(300);
    assert!(
        taken >= timeout && taken < timeout + Duration::from_secs(5),
        "{message}"
    );
}

#[test]
fn an_unanswered_sampling_request_pauses_attempts_only_until_total_timeout() {
    let mut s = start(
        "
        call_timeout: 0.3
        retry:
          max_retries: 0
          total_timeout: 1.5
        ",
    );
    s.list_tools();
    let started = Instant::now();
    s.call(json!(1), "idem_echo", json!({"mode": "sample"}));
    s.recv_where("the sampling request", |v| {
        v["method"] == "sampling/createMessage"
    });
    let e = s.error(&json!(1));
    let took = started.elapsed();
    let message = assert_proxy_error(&e, "timeout");
    assert!(
        took >= Duration::from_millis(1400),
        "timed out after {took:?}: the attempt clock did not pause"
    );
    assert!(took < crate::util::ms(10000), "answered after {took:?}");
    let after = format!(
        "timed out after {}",
        crate::util::human(crate::util::ms(1500))
    );
    assert!(message.contains(&after), "{message}");
}

#[test]
fn progress_from_a_retry_keeps_it_alive_before_it_is_forwarded() {
    // Attempt 1 reports progress 1..6, then hangs and times out; attempt 2
    // reports 1..6 again over 600 ms (> call_timeout), then answers. Its
    // progress is not forwarded (the client has seen 6) but keeps it alive.
    let mut s = start(
        "
        call_timeout: 0.4
        retry:
          base_delay: 0.05
          jitter: 0
        ",
    );
    s.list_tools();
    s.call_with(
        json!(1),
        json!({"name": "idem_echo", "_meta": {"progressToken": "t"},
            "arguments": {"mode": "flaky", "how": "progress_hang", "steps": 6, "ms": 100,
                "then": "progress", "text": "done"}}),
    );
    let (mut seen, mut all) = (Vec::new(), Vec::new());
    loop {
        let v = s.recv();
        if v.get("id") == Some(&json!(1)) {
            assert_eq!(text(&v["result"]), "done", "{v}");
            break;
        }
        if v["method"] == "notifications/progress" {
            let value = v["params"]["progress"].as_f64().unwrap();
            all.push(value);
            // The proxy's own notice of the backoff says what it waits for.
            if v["params"]["message"].is_null() {
                seen.push(value);
            }
        }
    }
    assert_eq!(s.executions("idem_echo"), 2);
    assert_eq!(seen, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "forwarded once each");
    assert!(all.windows(2).all(|w| w[0] < w[1]), "{all:?}");
}

// ----- the cache after a write ----------------------------------------------

#[test]
fn a_call_that_may_write_empties_the_cache() {
    let mut s = start(
        "
        cache:
          tools:
            ro_echo: 60
          stale_if_error: 60
        ",
    );
    s.list_tools();
    s.call(json!(1), "ro_echo", json!({"text": "file"}));
    s.result(&json!(1));
    s.call(json!(2), "ro_echo", json!({"text": "file"}));
    assert_eq!(source_marker(&s.result(&json!(2))), Some("cache"));
    // An edit: not known to be read-only.
    s.call(json!(3), "echo", json!({"text": "edit"}));
    s.result(&json!(3));
    s.call(json!(4), "ro_echo", json!({"text": "file"}));
    assert_eq!(source_marker(&s.result(&json!(4))), None);
    assert_eq!(s.executions("ro_echo"), 2);
    // A read that overlaps a write does not cache what it read.
    s.call(
        json!(5),
        "ro_echo",
        json!({"mode": "slow", "ms": 300, "text": "r"}),
    );
    eventually("the read reached the server", || {
        s.executions("ro_echo") == 3
    });
    s.call(json!(6), "echo", json!({"text": "edit again"}));
    s.result(&json!(6));
    s.result(&json!(5));
    s.call(
        json!(7),
        "ro_echo",
        json!({"mode": "slow", "ms": 300, "text": "r"}),
    );
    assert_eq!(source_marker(&s.result(&json!(7))), None);
    assert_eq!(s.executions("ro_echo"), 4);
}

#[test]
fn a_server_that_cannot_be_started_fails_requests_at_once_with_what_to_fix() {
    let mut s = Builder::config("servers:\n  x:\n    command: /nonexistent/mcp-server\n").start();
    let started = Instant::now();
    s.request(
        json!(1),
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}),
    );
    let e = s.error(&json!(1));
    let took = started.elapsed();
    let message = e["message"].as_str().unwrap_or_default();
    assert_eq!(e["data"]["reason"], "server_unavailable", "{e}");
    assert!(
        message.contains("cannot start \"/nonexistent/mcp-server\": No such file or directory"),
        "{message}"
    );
    // Waiting cannot heal a missing command: no wait_for_server (30 s).
    assert!(took < crate::util::ms(20000), "{message} (after {took:?})");
}

#[test]
fn json_log_lines_carry_server_tool_attempt_and_reason_as_fields() {
    let mut s = Builder::mock_with(FAST)
        .arg("--log-format")
        .arg("json")
        .initialized();
    s.list_tools();
    s.call(json!(1), "idem_echo", json!({"mode": "flaky"}));
    s.result(&json!(1));
    s.call(json!(2), "unsafe_echo", json!({"mode": "flaky"}));
    s.error(&json!(2));
    s.close_stdin();
    s.wait();
    let lines: Vec<Value> = s
        .stderr()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let find = |what: &str| {
        lines
            .iter()
            .find(|v| v["msg"].as_str().is_some_and(|m| m.contains(what)))
            .unwrap_or_else(|| panic!("no line with {what:?} in {lines:?}"))
            .clone()
    };
    let retry = find("retrying in");
    assert_eq!(retry["server"], "mock", "{retry}");
    assert_eq!(retry["tool"], "idem_echo", "{retry}");
    assert_eq!(retry["attempt"], 1, "{retry}");
    assert_eq!(retry["reason"], "transient_error", "{retry}");
    let second = find("attempt 2");
    assert_eq!(second["attempt"], 2, "{second}");
    let refused = find("not retried");
    assert_eq!(refused["tool"], "unsafe_echo", "{refused}");
    assert_eq!(refused["reason"], "not_retried_unsafe", "{refused}");
}

#[test]
fn a_crashed_servers_most_telling_stderr_line_is_quoted() {
    let mut s = start(FAST);
    s.list_tools();
    s.call(
        json!(1),
        "unsafe_echo",
        json!({"mode": "crash", "stderr":
            "Error: ENOENT: no such file '/data/db.json'\n    at open (node:fs:1:2)\n\nNode.js v20.11.0"}),
    );
    let e = s.error(&json!(1));
    let message = assert_proxy_error(&e, "server_exited");
    assert!(
        message.contains("its stderr said: Error: ENOENT: no such file '/data/db.json'"),
        "{message}"
    );
}
