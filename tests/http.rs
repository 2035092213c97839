//! Remote servers (Streamable HTTP) through `run --url` and `url:` configs,
//! against the scripted loopback server of `http_server.rs`: JSON and SSE
//! answers, the session and version headers, and every failure class the
//! safety gate cares about, counted by what the server really executed.

use std::time::Duration;

use serde_json::{json, Value};

use crate::http_server::{Fault, Server};
use crate::util::{Builder, Session};

const CANARY: &str = "CANARY-7f3a9c-secret";

/// A config for `server` with fast retries and a canary Authorization header.
fn config(server: &Server) -> String {
    format!(
        "servers:\n  remote:\n    url: {}\n    headers:\n      Authorization: Bearer ${{TOKEN}}\n    call_timeout: 5\n    retry:\n      base_delay: 0.05\n      max_delay: 0.2\n      jitter: 0\n",
        server.url()
    )
}

fn start(server: &Server) -> Session {
    start_with(&config(server))
}

fn start_with(config: &str) -> Session {
    let mut s = start_modern(config);
    s.initialize();
    s
}

fn text_of(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or("")
}

#[test]
fn calls_go_through_with_the_session_headers_and_progress_before_the_result() {
    let server = Server::start();
    let mut s = start(&server);
    let tools = s.list_tools();
    assert_eq!(tools["tools"].as_array().map(Vec::len), Some(2), "{tools}");
    s.call_with(
        json!(1),
        json!({"name": "write", "arguments": {}, "_meta": {"progressToken": "p1"}}),
    );
    let first = s.recv();
    assert_eq!(first["method"], "notifications/progress", "{first}");
    let result = s.result(&json!(1));
    assert_eq!(text_of(&result), "write done");
    assert_eq!(server.executions("write"), 1);
    server.with(|st| {
        assert_eq!(st.bad_headers, 0);
        assert_eq!(st.initializes, 1);
        assert!(st
            .authorizations
            .iter()
            .all(|a| a == &format!("Bearer {CANARY}")));
        assert!(!st.authorizations.is_empty());
    });
    // Client EOF: the session is ended with DELETE.
    s.close_stdin();
    assert!(s.wait().success());
    server.with(|st| assert_eq!(st.deleted, ["s1"]));
}

#[test]
fn an_unsafe_tool_facing_a_cut_connection_ran_once_and_is_unknown() {
    let server = Server::start();
    let mut s = start(&server);
    s.list_tools();
    server.fault(Fault::RunThenCut);
    s.call(json!(1), "write", json!({}));
    let error = s.error(&json!(1));
    assert_eq!(error["data"]["outcome"], "unknown", "{error}");
    assert_eq!(server.executions("write"), 1);
}

#[test]
fn a_safe_tool_facing_a_cut_connection_is_retried() {
    let server = Server::start();
    let mut s = start(&server);
    s.list_tools();
    server.fault(Fault::RunThenCut);
    s.call(json!(1), "read", json!({}));
    let result = s.result(&json!(1));
    assert_eq!(text_of(&result), "read done");
    assert_eq!(server.executions("read"), 2);
    // One request was lost, not the session.
    server.with(|st| assert_eq!(st.initializes, 1));
}

#[test]
fn a_refused_connection_is_retried_for_any_tool() {
    let server = Server::start();
    let mut s = start(&server);
    s.list_tools();
    server.close();
    s.call(json!(1), "write", json!({}));
    // The proxy tried and found the port closed before it is opened again:
    // the call waits (wait_for_server) while the proxy probes.
    let deadline = std::time::Instant::now() + crate::util::wait();
    while !s.stderr().contains("could not be reached") {
        assert!(
            std::time::Instant::now() < deadline,
            "the proxy never tried"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    server.reopen();
    let result = s.result(&json!(1));
    assert_eq!(text_of(&result), "write done");
    assert_eq!(server.executions("write"), 1);
}

#[test]
fn a_server_answering_503_to_initialize_is_started_again_while_the_client_waits() {
    let server = Server::start();
    server.refuse_initialize(503);
    server.refuse_initialize(503);
    let mut s = start_modern(&config(&server));
    let init = s.initialize();
    assert!(init["result"]["protocolVersion"].is_string(), "{init}");
    s.call(json!(1), "write", json!({}));
    assert_eq!(text_of(&s.result(&json!(1))), "write done");
    server.with(|st| {
        assert_eq!(st.refused_initializes, 2);
        assert_eq!(st.initializes, 1);
        assert_eq!(st.bad_headers, 0);
    });
}

#[test]
fn a_server_not_listening_yet_at_the_start_is_waited_for() {
    let server = Server::start();
    server.close();
    let mut s = start_modern(&config(&server));
    s.request(
        json!(0),
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "test-client", "version": "1.0.0"}}),
    );
    crate::util::eventually("the proxy to find the port closed", || {
        s.logged("could not be reached")
    });
    server.reopen();
    let init = s.response(&json!(0));
    assert!(init["result"]["protocolVersion"].is_string(), "{init}");
    s.notify("notifications/initialized", json!({}));
    s.call(json!(1), "write", json!({}));
    assert_eq!(text_of(&s.result(&json!(1))), "write done");
    server.with(|st| assert_eq!(st.initializes, 1));
}

#[test]
fn a_request_whose_body_could_not_be_written_is_resent_for_an_unsafe_tool() {
    let server = Server::start();
    // 16 MiB written twice: on a busy machine, more than the 5 s of the
    // usual test config.
    let mut s = start_with(&patient_config(&server));
    s.list_tools();
    // Bigger than what the socket buffers take: the server resets the
    // connection while the proxy is still writing the body.
    server.fault(Fault::DropBeforeBody);
    // Written out: serialising 16 MiB takes a debug build a while.
    let blob = "x".repeat(16 << 20);
    s.send_raw(&format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"write","arguments":{{"blob":"{blob}"}}}}}}"#
    ));
    assert_eq!(text_of(&s.result(&json!(1))), "write done");
    assert_eq!(server.executions("write"), 1);
    server.with(|st| {
        assert_eq!(st.dropped_bodies, 1);
        // The connection was lost: a new session carried the call.
        assert_eq!(st.initializes, 2);
    });
}

#[test]
fn too_many_requests_is_honoured_and_retried_for_an_unsafe_tool() {
    let server = Server::start();
    let mut s = start(&server);
    s.list_tools();
    server.fault(Fault::Status(429, Some("1"), "slow down"));
    s.call(json!(1), "write", json!({}));
    let result = s.result(&json!(1));
    assert_eq!(text_of(&result), "write done");
    assert_eq!(server.executions("write"), 1);
    let gap = server.with(|st| st.calls_at[1] - st.calls_at[0]);
    assert!(gap >= Duration::from_millis(950), "retried after {gap:?}");
}

#[test]
fn service_unavailable_with_retry_after_is_retried_for_an_unsafe_tool() {
    let server = Server::start();
    let mut s = start(&server);
    s.list_tools();
    server.fault(Fault::Status(503, Some("0"), "shedding load"));
    s.call(json!(1), "write", json!({}));
    assert_eq!(text_of(&s.result(&json!(1))), "write done");
    assert_eq!(server.executions("write"), 1);
}

#[test]
fn a_bad_gateway_is_retried_for_a_safe_tool_only() {
    let server = Server::start();
    let mut s = start(&server);
    s.list_tools();
    server.fault(Fault::Status(502, None, "upstream down"));
    s.call(json!(1), "read", json!({}));
    assert_eq!(text_of(&s.result(&json!(1))), "read done");
    server.fault(Fault::Status(502, None, "upstream down"));
    s.call(json!(2), "write", json!({}));
    let error = s.error(&json!(2));
    let message = error["message"].as_str().unwrap_or("");
    assert!(message.contains("502 Bad Gateway"), "{error}");
    assert!(message.contains("upstream down"), "{error}");
    assert_eq!(error["data"]["outcome"], "unknown", "{error}");
    assert_eq!(server.executions("write"), 0);
    server.with(|st| assert_eq!(st.calls_at.len(), 3));
}

#[test]
fn a_json_answer_that_is_not_the_response_fails_the_call_at_once() {
    let server = Server::start();
    let mut s = start_with(&patient_config(&server));
    s.list_tools();
    server.fault(Fault::Json("{}"));
    s.call(json!(1), "write", json!({}));
    // Not the call's 60 s timeout: the answer had no response in it.
    let error = s.error(&json!(1));
    let message = error["message"].as_str().unwrap_or("");
    assert!(message.contains("without a response"), "{error}");
    assert_eq!(error["data"]["outcome"], "unknown", "{error}");
}

#[test]
fn a_lost_session_is_started_again_transparently() {
    let server = Server::start();
    let mut s = start(&server);
    s.list_tools();
    server.fault(Fault::LoseSession);
    s.call(json!(1), "write", json!({}));
    assert_eq!(text_of(&s.result(&json!(1))), "write done");
    assert_eq!(server.executions("write"), 1);
    server.with(|st| {
        assert_eq!(st.initializes, 2);
        assert_eq!(st.bad_headers, 0);
    });
}

#[test]
fn an_open_breaker_sends_no_call_to_the_server_until_its_cooldown() {
    let server = Server::start();
    let mut s = start_with(&format!(
        "{}    circuit_breaker:\n      failure_threshold: 2\n      cooldown_seconds: 1\n",
        config(&server)
    ));
    s.list_tools();
    for id in 1..=2 {
        server.fault(Fault::Status(502, None, "upstream down"));
        s.call(json!(id), "write", json!({}));
        assert_eq!(s.error(&json!(id))["data"]["outcome"], "unknown");
    }
    server.with(|st| assert_eq!(st.calls_at.len(), 2));
    // Open: both tools fail fast, and no POST of theirs reaches the server.
    let mut open = Value::Null;
    for (id, tool) in [(3, "write"), (4, "read")] {
        s.call(json!(id), tool, json!({}));
        open = s.error(&json!(id));
        let message = open["message"].as_str().unwrap_or("");
        assert!(message.contains("circuit breaker"), "{open}");
    }
    server.with(|st| assert_eq!(st.calls_at.len(), 2));
    assert_eq!(server.executions("write") + server.executions("read"), 0);
    // After the cooldown one trial goes through, and closes it again.
    crate::util::sleep_out_cooldown(&open);
    s.call(json!(5), "write", json!({}));
    assert_eq!(text_of(&s.result(&json!(5))), "write done");
    s.call(json!(6), "read", json!({}));
    assert_eq!(text_of(&s.result(&json!(6))), "read done");
    server.with(|st| assert_eq!(st.calls_at.len(), 4));
}

#[cfg(unix)] // SIGTERM is a unix signal (Windows has console events).
#[test]
fn sigterm_ends_the_session_with_delete_before_exiting() {
    let server = Server::start();
    let mut s = start(&server);
    s.call(json!(1), "write", json!({}));
    assert_eq!(text_of(&s.result(&json!(1))), "write done");
    server.with(|st| assert!(st.deleted.is_empty()));
    s.signal(libc::SIGTERM);
    let status = s.wait();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{}", s.stderr());
    // The DELETE was sent before the proxy exited.
    server.with(|st| assert_eq!(st.deleted, ["s1"]));
}

#[test]
fn an_unauthorized_answer_names_the_status_and_never_the_header() {
    let server = Server::start();
    let mut s = start(&server);
    s.list_tools();
    // A server that quotes the token back, without its "Bearer ".
    server.fault(Fault::Status(401, None, "bad token CANARY-7f3a9c-secret"));
    s.call(json!(1), "write", json!({}));
    let error = s.error(&json!(1));
    let text = error.to_string();
    assert!(text.contains("401 Unauthorized"), "{text}");
    assert!(!text.contains(CANARY), "{text}");
    assert_eq!(server.executions("write"), 0);
    // Nor in the log (debug level), nor in what `status` shows once it has
    // published the failure (its last error quotes the server).
    let status = || {
        let out = crate::util::proxy_in(s.dir.path())
            .args(["status", "--json", "--dir"])
            .arg(s.dir.join("runtime"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    crate::util::eventually("status to publish the failure", || {
        status().contains("401 Unauthorized")
    });
    let status = status();
    assert!(status.contains("127.0.0.1"), "{status}");
    assert!(!status.contains(CANARY), "{status}");
    s.close_stdin();
    s.wait();
    assert!(!s.stderr().contains(CANARY), "{}", s.stderr());
}

#[test]
fn run_url_with_a_header_reaches_the_server() {
    let server = Server::start();
    let header = format!("Authorization: Bearer {CANARY}");
    let mut s = Builder::proxy(&["run", "--url", &server.url(), "--header", &header])
        .env("NO_PROXY", "127.0.0.1")
        .initialized();
    s.call(json!(1), "read", json!({}));
    assert_eq!(text_of(&s.result(&json!(1))), "read done");
    server.with(|st| assert_eq!(st.authorizations[0], format!("Bearer {CANARY}")));
    s.close_stdin();
    s.wait();
    assert!(!s.stderr().contains(CANARY), "{}", s.stderr());
}

#[test]
fn the_server_stream_reaches_the_client() {
    let server = Server::start();
    let mut s = start(&server);
    server_stream_reaches(&server, &mut s, "from the GET stream");
}

/// Waits for the proxy to open the server's stream, and has a notification
/// with `data` pushed on it reach the client.
fn server_stream_reaches(server: &Server, s: &mut Session, data: &str) {
    wait_for_server_stream(server);
    let note = json!({"jsonrpc": "2.0", "method": "notifications/message",
        "params": {"level": "info", "data": data}});
    server.push(&note);
    let got = s.recv_where("the pushed notification", |m| {
        m["method"] == "notifications/message"
    });
    assert_eq!(got["params"]["data"], data);
}

fn wait_for_server_stream(server: &Server) {
    crate::util::eventually("the proxy to open the server's stream", || {
        server.with(|st| !st.streams.is_empty())
    });
}

/// A proxy for `server` whose headers come from a `headers_helper` that
/// counts its runs in `n` and prints `Authorization: Bearer tok-<run>`.
#[cfg(unix)]
fn start_with_helper(server: &Server) -> Session {
    let helper = "n=$(cat \"$DIR/n\" 2>/dev/null || echo 0); n=$((n+1)); echo $n > \"$DIR/n\"\n\
                  printf '{\"Authorization\": \"Bearer tok-%s\"}' $n\n";
    let text = format!(
        "servers:\n  remote:\n    url: {}\n    env:\n      DIR: \"{{dir}}\"\n    headers_helper: sh helper.sh\n",
        server.url()
    );
    Builder::config(&text)
        .file("helper.sh", helper)
        .env("NO_PROXY", "127.0.0.1")
        .initialized()
}

/// How many times the helper of [`start_with_helper`] ran.
#[cfg(unix)]
fn helper_runs(s: &Session) -> String {
    std::fs::read_to_string(s.dir.join("n"))
        .unwrap()
        .trim()
        .to_owned()
}

// The helper is a sh script (Windows runs helpers with cmd /C).
#[cfg(unix)]
#[test]
fn headers_helper_runs_again_after_401_to_the_server_stream() {
    let server = Server::start();
    server.refuse_get(401);
    let mut s = start_with_helper(&server);
    server_stream_reaches(&server, &mut s, "after new headers");
    assert_eq!(helper_runs(&s), "2");
    server.with(|st| {
        assert_eq!(
            st.authorizations.last().map(String::as_str),
            Some("Bearer tok-2")
        )
    });
}

#[cfg(unix)]
#[test]
fn headers_helper_runs_again_after_403_to_a_resumption() {
    let server = Server::start();
    let mut s = start_with_helper(&server);
    wait_for_server_stream(&server);
    server.fault(Fault::RunThenCutAfterProgress);
    server.refuse_get(403);
    s.call(json!(1), "write", json!({}));
    assert_eq!(text_of(&s.result(&json!(1))), "write done");
    assert_eq!(server.executions("write"), 1);
    assert_eq!(helper_runs(&s), "2");
    server.with(|st| assert_eq!(st.resumed_from, ["e1"]));
}

// The helper is a sh script (Windows runs helpers with cmd /C).
#[cfg(unix)]
#[test]
fn headers_helper_runs_again_after_401_and_the_call_is_sent_once_more() {
    let server = Server::start();
    let mut s = start_with_helper(&server);
    server.fault(Fault::Status(401, None, "token expired"));
    s.call(json!(1), "write", json!({}));
    assert_eq!(text_of(&s.result(&json!(1))), "write done");
    assert_eq!(server.executions("write"), 1);
    assert_eq!(helper_runs(&s), "2");
    server.with(|st| {
        assert_eq!(
            st.authorizations.first().map(String::as_str),
            Some("Bearer tok-1")
        );
        // The call went again with the new token (the server's own GET
        // stream, opened meanwhile, may have gone last with either).
        assert!(
            st.authorizations.iter().any(|a| a == "Bearer tok-2"),
            "{:?}",
            st.authorizations
        );
    });
}

#[test]
fn check_probes_a_remote_server() {
    let server = Server::start();
    let dir = crate::util::TempDir::new();
    let path = dir.write("c.yaml", &config(&server));
    let out = crate::util::proxy_in(dir.path())
        .args(["check", "--config"])
        .arg(&path)
        .env("MCP_RETRY_CACHE_DIR", dir.join("cache"))
        .env("TOKEN", CANARY)
        .env("NO_PROXY", "127.0.0.1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.starts_with("[UP  ] remote "), "{stdout}");
    assert!(stdout.contains("2 tools"), "{stdout}");
    assert!(!stdout.contains(CANARY) && !stderr.contains(CANARY));
    server.with(|st| assert_eq!(st.deleted, ["s1"]));
}

/// A config for `server` whose calls may take 60 s: a call the server never
/// answers is freed within the test's 20 s only by closing its connection.
fn patient_config(server: &Server) -> String {
    config(server).replace("call_timeout: 5", "call_timeout: 60")
}

/// Has `send` make a call that the server never answers, and waits until
/// the server got it.
fn hanging_call(server: &Server, s: &mut Session, send: impl FnOnce(&mut Session)) {
    server.fault(Fault::Hang);
    send(s);
    crate::util::eventually("the hanging call to arrive", || {
        server.with(|st| st.calls_at.len() == 1)
    });
}

#[test]
fn a_broken_stream_leaves_the_other_requests_in_flight_alone() {
    let server = Server::start();
    let mut s = start_with(&patient_config(&server));
    s.list_tools();
    hanging_call(&server, &mut s, |s| s.call(json!(1), "write", json!({})));
    server.fault(Fault::RunThenCut);
    s.call(json!(2), "read", json!({}));
    assert_eq!(text_of(&s.result(&json!(2))), "read done");
    // The other call is still waiting for its answer, on the same session:
    // its outcome was not made unknown by another request's cut stream.
    s.expect_none_where(crate::util::ms(200), |m| m["id"] == 1);
    server.with(|st| {
        assert_eq!(st.hung_closed, 0);
        assert_eq!(st.initializes, 1);
    });
    s.notify("notifications/cancelled", json!({"requestId": 1}));
    crate::util::eventually("the hanging request to be closed", || {
        server.with(|st| st.hung_closed == 1)
    });
}

#[test]
fn a_cut_answer_stream_with_event_ids_is_resumed_not_run_again() {
    let server = Server::start();
    let mut s = start(&server);
    s.list_tools();
    server.fault(Fault::RunThenCutAfterProgress);
    s.call_with(
        json!(1),
        json!({"name": "write", "arguments": {}, "_meta": {"progressToken": "p1"}}),
    );
    let progress = s.recv();
    assert_eq!(progress["method"], "notifications/progress", "{progress}");
    // The replay repeats the progress: it is not shown twice.
    let result = s.result(&json!(1));
    assert_eq!(text_of(&result), "write done");
    assert_eq!(server.executions("write"), 1);
    server.with(|st| {
        assert_eq!(st.resumed_from, ["e1"]);
        assert_eq!(st.initializes, 1);
    });
    s.expect_none_where(crate::util::ms(200), |m| {
        m["method"] == "notifications/progress"
    });
}

/// Calls `write` (with a progress token) while the server plays `fault`:
/// the result arrives, and the tool ran once.
fn write_with_progress_runs_once(server: &Server, s: &mut Session, fault: Fault) {
    server.fault(fault);
    s.call_with(
        json!(1),
        json!({"name": "write", "arguments": {}, "_meta": {"progressToken": "p1"}}),
    );
    let result = s.result(&json!(1));
    assert_eq!(text_of(&result), "write done");
    assert_eq!(server.executions("write"), 1);
}

#[test]
fn a_stream_cut_inside_the_result_is_resumed_from_the_event_before_it() {
    let server = Server::start();
    let mut s = start(&server);
    s.list_tools();
    write_with_progress_runs_once(&server, &mut s, Fault::RunThenCutInsideResult);
    // The id of the event cut short was not the one to resume from.
    server.with(|st| assert_eq!(st.resumed_from, ["e1"]));
}

#[test]
fn a_resumed_stream_that_stalls_is_resumed_again_from_the_newest_id() {
    let server = Server::start();
    // A silence of 300 ms is a stall here (2 s in the proxy): the stalls'
    // rules are resume.rs's, on a fake clock.
    let mut s = Builder::config(&patient_config(&server))
        .env("TOKEN", CANARY)
        .env("NO_PROXY", "127.0.0.1")
        .shorten("stall_min", Duration::from_millis(300))
        .initialized();
    s.list_tools();
    write_with_progress_runs_once(&server, &mut s, Fault::RunThenCutThenStall);
    server.with(|st| {
        assert_eq!(st.resumed_from, ["e1", "e2"]);
        assert_eq!(st.initializes, 1);
    });
    crate::util::eventually("the stalled stream to be closed", || {
        server.with(|st| st.stalls_closed == 1)
    });
}

#[test]
fn a_server_polling_with_retry_is_resumed_until_the_result_comes() {
    let server = Server::start();
    let mut s = start(&server);
    s.list_tools();
    server.fault(Fault::RunThenCutThenPoll);
    s.call(json!(1), "write", json!({}));
    assert_eq!(text_of(&s.result(&json!(1))), "write done");
    assert_eq!(server.executions("write"), 1);
    // Five polls that brought nothing new, then the result.
    server.with(|st| assert_eq!(st.resumed_from, ["e1"; 6]));
}

#[test]
fn a_cancelled_call_is_cancelled_then_its_stream_closed() {
    let server = Server::start();
    let mut s = start_with(&patient_config(&server));
    s.list_tools();
    hanging_call(&server, &mut s, |s| s.call(json!(1), "write", json!({})));
    s.notify(
        "notifications/cancelled",
        json!({"requestId": 1, "reason": "changed my mind"}),
    );
    crate::util::eventually("the call's stream to be closed", || {
        server.with(|st| st.hung_closed == 1)
    });
    server.with(|st| {
        // 2025 era: the cancel is posted first, naming the id the server
        // knows the call by; then the stream is closed.
        assert_eq!(st.events, ["cancelled", "hung closed"]);
        assert_eq!(st.notified[1]["params"]["requestId"], st.call_ids[0]);
        assert_eq!(st.notified[1]["params"]["reason"], "changed my mind");
    });
    // No answer for the cancelled call; the session goes on.
    s.call(json!(2), "read", json!({}));
    assert_eq!(text_of(&s.result(&json!(2))), "read done");
    s.expect_none_where(crate::util::ms(200), |m| m["id"] == 1);
    server.with(|st| assert_eq!(st.initializes, 1));
}

#[test]
fn a_cancel_is_not_queued_behind_calls_that_take_every_post_thread() {
    let server = Server::start();
    let mut s = start_with(&patient_config(&server));
    s.list_tools();
    // As many hanging calls as the proxy has threads for calls.
    for id in 1..=8 {
        server.fault(Fault::Hang);
        // Different arguments: identical calls would be one.
        s.call(json!(id), "write", json!({ "n": id }));
    }
    crate::util::eventually("the hanging calls to arrive", || {
        server.with(|st| st.calls_at.len() == 8)
    });
    s.notify("notifications/cancelled", json!({"requestId": 3}));
    crate::util::eventually("the cancelled call's stream to be closed", || {
        server.with(|st| st.hung_closed == 1)
    });
    server.with(|st| {
        assert_eq!(st.events, ["cancelled", "hung closed"]);
        // The id the server knows one of the calls by (they arrived in
        // no particular order).
        let cancelled = &st.notified[1]["params"]["requestId"];
        assert!(st.call_ids.contains(cancelled), "{cancelled}");
    });
}

#[test]
fn calls_no_thread_took_when_the_session_is_lost_are_sent_again_for_any_tool() {
    let server = Server::start();
    // The calls cut by the lost session must not open the breaker.
    let config = format!(
        "{}    circuit_breaker:\n      failure_threshold: 1000\n",
        patient_config(&server)
    );
    let mut s = start_with(&config);
    s.list_tools();
    // Every call thread busy (the pool grows to 64): 63 hanging calls and
    // one the server holds.
    let busy = 63;
    for id in 1..=busy {
        server.fault(Fault::Hang);
        s.call(json!(id), "write", json!({ "n": id }));
    }
    // 63 threads and connections on both sides: slow on a loaded machine.
    crate::util::eventually_within(
        3 * crate::util::wait(),
        "the hanging calls to arrive",
        || server.with(|st| st.calls_at.len() == busy),
    );
    server.fault(Fault::HeldThenLoseSession);
    let held = busy + 1;
    s.call(json!(held), "write", json!({ "n": held }));
    crate::util::eventually("the calls to arrive", || {
        server.with(|st| st.calls_at.len() == held)
    });
    // Queued: no thread is free to post it.
    let queued = held + 1;
    s.call(json!(queued), "write", json!({ "n": queued }));
    server.release();
    // The held call and the queued one never reached the server: both go
    // again on the new session, although `write` is not safe to retry.
    assert_eq!(text_of(&s.result(&json!(held))), "write done");
    assert_eq!(text_of(&s.result(&json!(queued))), "write done");
    assert_eq!(server.executions("write"), 2);
    server.with(|st| assert_eq!(st.initializes, 2));
}

#[test]
fn a_cancelled_call_is_closed_even_when_the_server_never_takes_the_cancel() {
    let server = Server::start();
    let mut s = start_with(&patient_config(&server));
    s.list_tools();
    hanging_call(&server, &mut s, |s| s.call(json!(1), "write", json!({})));
    server.hang_notifications();
    s.notify("notifications/cancelled", json!({"requestId": 1}));
    crate::util::eventually("the call's stream to be closed", || {
        server.with(|st| st.hung_closed == 1)
    });
    // The session goes on.
    s.call(json!(2), "read", json!({}));
    assert_eq!(text_of(&s.result(&json!(2))), "read done");
    server.with(|st| assert_eq!(st.initializes, 1));
}

#[test]
fn a_server_that_takes_no_notifications_never_grows_the_proxy_nor_wedges_the_client() {
    // 12 notifications of 4 MiB for a server that never answers one: two
    // threads post them, 2 s each; what waits for them is bounded by the
    // input backlog (8 MiB) and its reserve, the rest is dropped with a
    // log line, and the client's reader never waits: a ping right after
    // is answered.
    let server = Server::start();
    let mut s = start_with(&patient_config(&server));
    server.hang_notifications();
    let pad = "x".repeat(4 << 20);
    for n in 0..12 {
        // Written out: serialising 48 MiB takes a debug build seconds.
        s.send_raw(&format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/roots/list_changed","params":{{"n":{n},"pad":"{pad}"}}}}"#
        ));
    }
    s.request(json!("p"), "ping", json!({}));
    assert_eq!(s.result(&json!("p")), json!({}));
    crate::util::eventually("the dropped notifications to be logged", || {
        s.logged("it is not reading its input")
    });
    let peak = s.memory_kb("VmHWM");
    assert!(
        peak < 60 * 1024,
        "the proxy's peak RSS was {peak} kB with 48 MiB of notifications for a server that took none"
    );
    let reached = server.with(|st| st.notified.len());
    assert!(reached < 12, "{reached} notifications reached the server");
}

const MODERN: &str = "2026-07-28";

/// The `_meta` of a 2026-07-28 request.
fn envelope() -> Value {
    json!({"io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"}})
}

/// A proxy with `config`, its client not started: a 2026-07-28 client
/// sends no `initialize`.
fn start_modern(config: &str) -> Session {
    Builder::config(config)
        .env("TOKEN", CANARY)
        .env("NO_PROXY", "127.0.0.1")
        .start()
}

fn modern_call(s: &mut Session, id: Value, tool: &str, arguments: Value) {
    s.call_with(
        id,
        json!({"name": tool, "arguments": arguments, "_meta": envelope()}),
    );
}

/// The value of header `name` in a recorded POST.
fn header_of<'a>(post: &'a (Vec<(String, String)>, Value), name: &str) -> Option<&'a str> {
    post.0
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

#[test]
fn modern_requests_carry_their_headers_and_no_session() {
    let server = Server::start();
    let mut s = start_modern(&config(&server));
    s.request(json!(1), "tools/list", json!({"_meta": envelope()}));
    let tools = s.result(&json!(1));
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    // `broken`'s x-mcp-header is on a number: it is left out.
    assert_eq!(names, ["read", "write", "locate", "place"]);
    modern_call(&mut s, json!(2), "locate", json!({"region": "Zürich"}));
    assert_eq!(text_of(&s.result(&json!(2))), "locate done");
    modern_call(&mut s, json!(3), "locate", json!({"region": "eu-west-1"}));
    assert_eq!(text_of(&s.result(&json!(3))), "locate done");
    // The server's own answer to a method it lacks comes through as it is.
    s.request(json!(4), "ping", json!({"_meta": envelope()}));
    let error = s.error(&json!(4));
    assert_eq!(error["code"], -32601, "{error}");
    assert_eq!(error["message"], "Method not found", "{error}");
    // Its text is scrubbed of header values, as any of its text.
    s.request(
        json!(5),
        "prompts/get",
        json!({"name": "p", "_meta": envelope()}),
    );
    let error = s.error(&json!(5));
    assert_eq!(error["code"], -32602, "{error}");
    assert_eq!(error["message"], "no prompt for [redacted]", "{error}");
    s.close_stdin();
    assert!(s.wait().success());
    server.with(|st| {
        assert_eq!(st.mismatches, 0);
        assert_eq!(st.initializes, 0);
        let list = &st.modern_posts[0];
        assert_eq!(header_of(list, "MCP-Protocol-Version"), Some(MODERN));
        assert_eq!(header_of(list, "Mcp-Method"), Some("tools/list"));
        assert_eq!(header_of(list, "Mcp-Name"), None);
        let call = &st.modern_posts[1];
        assert_eq!(header_of(call, "Mcp-Method"), Some("tools/call"));
        assert_eq!(header_of(call, "Mcp-Name"), Some("locate"));
        // Not plain ASCII: the base64 sentinel.
        assert_eq!(
            header_of(call, "Mcp-Param-Region"),
            Some("=?base64?WsO8cmljaA==?=")
        );
        let call = &st.modern_posts[2];
        assert_eq!(header_of(call, "Mcp-Param-Region"), Some("eu-west-1"));
        assert!(st
            .modern_posts
            .iter()
            .all(|p| header_of(p, "Mcp-Session-Id").is_none()
                && header_of(p, "Last-Event-ID").is_none()));
        // No session: no GET stream, no DELETE at the end.
        assert!(st.streams.is_empty());
        assert!(st.deleted.is_empty());
    });
}

/// A tool's `x-mcp-header` arguments become its headers, taken from the
/// call as the proxy read it from the client (the transport reads no
/// line): a string, an integer, a boolean and one in a nested object; a
/// value too long for a header is left out, the server's answer to that
/// is relayed (after reading the tools once more), and a warning says so
/// once.
#[test]
fn a_tools_annotated_arguments_are_its_headers_and_one_too_long_is_left_out() {
    let server = Server::start();
    let mut s = start_modern(&config(&server));
    s.request(json!(1), "tools/list", json!({"_meta": envelope()}));
    s.result(&json!(1));
    let args = json!({"region": "eu-west-1", "count": 42, "dry": false,
        "opts": {"zone": "b", "more": [1, {"zone": "no"}]}, "note": "short", "other": "x"});
    modern_call(&mut s, json!(2), "place", args);
    assert_eq!(text_of(&s.result(&json!(2))), "place done");
    // Absent arguments: no headers, which the server accepts.
    modern_call(&mut s, json!(3), "place", json!({"region": "r"}));
    assert_eq!(text_of(&s.result(&json!(3))), "place done");
    let long = "n".repeat(9 << 10);
    for id in [4, 5] {
        modern_call(
            &mut s,
            json!(id),
            "place",
            json!({"region": "r", "note": long}),
        );
        let error = s.error(&json!(id));
        assert_eq!(error["code"], -32020, "{error}");
    }
    let warning = "without header Mcp-Param-Note";
    assert!(s.logged(warning));
    s.close_stdin();
    assert!(s.wait().success());
    assert_eq!(s.stderr_to_end().matches(warning).count(), 1);
    assert_eq!(server.executions("place"), 2);
    server.with(|st| {
        let call = &st.modern_posts[1];
        assert_eq!(header_of(call, "Mcp-Name"), Some("place"));
        assert_eq!(header_of(call, "Mcp-Param-Region"), Some("eu-west-1"));
        assert_eq!(header_of(call, "Mcp-Param-Count"), Some("42"));
        assert_eq!(header_of(call, "Mcp-Param-Dry"), Some("false"));
        assert_eq!(header_of(call, "Mcp-Param-Zone"), Some("b"));
        assert_eq!(header_of(call, "Mcp-Param-Note"), Some("short"));
        let call = &st.modern_posts[2];
        assert_eq!(header_of(call, "Mcp-Param-Region"), Some("r"));
        assert_eq!(header_of(call, "Mcp-Param-Count"), None);
        // Each long call: refused, the tools read again, refused again.
        assert_eq!(st.mismatches, 4);
        let long_calls = st.modern_posts[3..]
            .iter()
            .filter(|p| p.1["method"] == "tools/call");
        for call in long_calls {
            assert_eq!(header_of(call, "Mcp-Param-Region"), Some("r"));
            assert_eq!(header_of(call, "Mcp-Param-Note"), None);
        }
    });
}

#[test]
fn a_client_that_probed_the_modern_era_then_initialized_speaks_the_2025_era() {
    let server = Server::start();
    server.stateless();
    let mut s = start_modern(&config(&server));
    // A 2026-07-28 probe first, then the 2025 handshake, on a server that
    // keeps no session: the notifications after it are 2025-era ones.
    s.request(json!(9), "server/discover", json!({"_meta": envelope()}));
    s.response(&json!(9));
    s.initialize();
    crate::util::eventually("notifications/initialized to arrive", || {
        server.with(|st| {
            st.notified
                .iter()
                .any(|n| n["method"] == "notifications/initialized")
        })
    });
    s.call(json!(1), "read", json!({}));
    assert_eq!(text_of(&s.result(&json!(1))), "read done");
    server.with(|st| {
        assert_eq!(st.bad_headers, 0);
        assert_eq!(st.modern_posts.len(), 1);
    });
}

#[test]
fn a_header_mismatch_reads_the_tools_again_and_resends_once() {
    let server = Server::start();
    let mut s = start_modern(&config(&server));
    // The proxy has not seen the tools yet: its first POST lacks the
    // Mcp-Param-Region header and is refused.
    modern_call(&mut s, json!(1), "locate", json!({"region": "eu-west-1"}));
    assert_eq!(text_of(&s.result(&json!(1))), "locate done");
    assert_eq!(server.executions("locate"), 1);
    server.with(|st| {
        assert_eq!(st.mismatches, 1);
        let methods: Vec<&str> = st
            .modern_posts
            .iter()
            .map(|p| p.1["method"].as_str().unwrap())
            .collect();
        assert_eq!(methods, ["tools/call", "tools/list", "tools/call"]);
        // The proxy's own tools/list, on the client's behalf.
        let list = &st.modern_posts[1].1;
        assert!(list["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("mcp-retry-")));
        assert_eq!(list["params"]["_meta"], envelope());
        let again = &st.modern_posts[2];
        assert_eq!(header_of(again, "Mcp-Param-Region"), Some("eu-west-1"));
        assert_eq!(again.1["id"], st.modern_posts[0].1["id"]);
    });
    // Nothing of the proxy's own listing reaches the client.
    s.expect_none_where(crate::util::ms(200), |m| m.get("result").is_some());
}

#[test]
fn a_modern_cancel_closes_the_stream_and_posts_nothing() {
    let server = Server::start();
    let mut s = start_modern(&patient_config(&server));
    hanging_call(&server, &mut s, |s| {
        modern_call(s, json!(1), "write", json!({}))
    });
    s.notify("notifications/cancelled", json!({"requestId": 1}));
    crate::util::eventually("the call's stream to be closed", || {
        server.with(|st| st.hung_closed == 1)
    });
    modern_call(&mut s, json!(2), "read", json!({}));
    assert_eq!(text_of(&s.result(&json!(2))), "read done");
    s.expect_none_where(crate::util::ms(200), |m| m["id"] == 1);
    // Closing the stream was the cancel: nothing was posted for it.
    server.with(|st| assert!(st.notified.is_empty(), "{:?}", st.notified));
}

#[test]
fn a_cut_modern_stream_is_never_resumed() {
    let server = Server::start();
    let mut s = start_modern(&config(&server));
    s.request(json!(1), "tools/list", json!({"_meta": envelope()}));
    s.result(&json!(1));
    // Unsafe: it may have run; no second execution, the outcome unknown.
    server.fault(Fault::RunThenCutAfterProgress);
    modern_call(&mut s, json!(2), "write", json!({}));
    let error = s.error(&json!(2));
    assert_eq!(error["data"]["outcome"], "unknown", "{error}");
    assert_eq!(server.executions("write"), 1);
    // Safe: sent again, under a new id.
    server.fault(Fault::RunThenCutAfterProgress);
    modern_call(&mut s, json!(3), "read", json!({}));
    assert_eq!(text_of(&s.result(&json!(3))), "read done");
    assert_eq!(server.executions("read"), 2);
    server.with(|st| {
        assert!(st.resumed_from.is_empty(), "{:?}", st.resumed_from);
        assert_ne!(st.call_ids[1], st.call_ids[2]);
    });
}

#[test]
fn a_failure_after_the_tool_ran_is_the_proxys_error_and_an_outer_proxy_never_retries_it() {
    // Two proxies in a chain; the outer one knows `write` as idempotent. The
    // server runs the tool, then answers 502: the inner proxy reports what
    // happened as its own error (it may have run), which no mcp-retry
    // retries, so the tool ran once.
    let server = Server::start();
    let outer = format!(
        "servers:\n  chain:\n    command: {}\n    args: [run, --url, \"{}\"]\n    retry:\n      base_delay: 0.05\n      jitter: 0\n    tools:\n      write:\n        idempotent: true\n",
        crate::util::PROXY,
        server.url()
    );
    let mut s = Builder::config(&outer)
        .env("NO_PROXY", "127.0.0.1")
        .initialized();
    s.list_tools();
    server.fault(Fault::RunThenStatus(502, "upstream down"));
    s.call(json!(1), "write", json!({}));
    let error = s.error(&json!(1));
    assert_eq!(error["code"], -31000, "{error}");
    assert_eq!(error["data"]["source"], "mcp-retry", "{error}");
    // The inner proxy's own verdict: it does not know `write` as safe.
    assert_eq!(error["data"]["reason"], "not_retried_unsafe", "{error}");
    assert_eq!(error["data"]["httpStatus"], 502, "{error}");
    assert_eq!(error["data"]["outcome"], "unknown", "{error}");
    let message = error["message"].as_str().unwrap_or("");
    assert!(message.contains("502 Bad Gateway"), "{error}");
    assert_eq!(server.executions("write"), 1);
    // Alone, the same: the proxy's error, not one dressed as the server's.
    let mut alone = start(&server);
    alone.list_tools();
    server.fault(Fault::RunThenStatus(502, "upstream down"));
    alone.call(json!(2), "write", json!({}));
    let error = alone.error(&json!(2));
    assert_eq!(error["data"]["source"], "mcp-retry", "{error}");
    assert_eq!(error["data"]["reason"], "not_retried_unsafe", "{error}");
    assert_eq!(error["data"]["httpStatus"], 502, "{error}");
    assert_eq!(server.executions("write"), 2);
    // A 401 that stays a 401 is final: `rejected`, not run, not retried.
    server.fault(Fault::Status(401, None, "bad token"));
    server.fault(Fault::Status(401, None, "bad token"));
    alone.call(json!(3), "read", json!({}));
    let error = alone.error(&json!(3));
    assert_eq!(error["data"]["reason"], "rejected", "{error}");
    assert_eq!(error["data"]["httpStatus"], 401, "{error}");
    assert!(error["data"].get("outcome").is_none(), "{error}");
}

#[test]
fn a_notification_is_acknowledged_before_the_next_message_is_posted() {
    // The server takes its time to acknowledge a notification: what the
    // client sends next still reaches it after the notification, as over
    // stdio (tools/list before notifications/initialized would miss tools
    // a server registers when initialized arrives).
    let server = Server::start();
    server.delay_acks(Duration::from_millis(300));
    let mut s = start(&server);
    s.list_tools();
    s.notify("notifications/roots/list_changed", json!({}));
    s.call(json!(1), "read", json!({}));
    assert_eq!(text_of(&s.result(&json!(1))), "read done");
    let methods = server.with(|st| st.methods.clone());
    let at = |m: &str| methods.iter().position(|x| x == m).unwrap_or(usize::MAX);
    assert!(
        at("notifications/initialized") < at("tools/list"),
        "{methods:?}"
    );
    assert!(
        at("notifications/roots/list_changed") < at("tools/call"),
        "{methods:?}"
    );
}

#[test]
fn a_request_whose_method_cannot_be_a_header_gets_its_own_error_and_nothing_else_is_touched() {
    // 2026-07-28: the method goes in the Mcp-Method header, which cannot
    // carry a control character. That request alone is answered -32602;
    // the connection and the next calls are untouched.
    let server = Server::start();
    let mut s = start_modern(&config(&server));
    modern_call(&mut s, json!(1), "read", json!({}));
    assert_eq!(text_of(&s.result(&json!(1))), "read done");
    s.send(
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/li\u{7}st",
        "params": {"_meta": envelope()}}),
    );
    let e = s.error(&json!(2));
    assert_eq!(e["code"], -32602, "{e}");
    assert_eq!(e["data"]["source"], "mcp-retry", "{e}");
    let message = e["message"].as_str().unwrap_or("");
    assert!(message.contains("Mcp-Method"), "{e}");
    assert!(message.contains("0x07 at position 8"), "{e}");
    modern_call(&mut s, json!(3), "read", json!({}));
    assert_eq!(text_of(&s.result(&json!(3))), "read done");
    assert_eq!(server.executions("read"), 2);
    assert!(
        !s.stderr().contains("could not be reached"),
        "{}",
        s.stderr()
    );
    let methods = server.with(|st| st.methods.clone());
    assert!(methods.iter().all(|m| !m.contains('\u{7}')), "{methods:?}");
}

#[test]
fn a_header_value_a_server_echoes_in_another_form_is_not_shown_to_the_client() {
    let server = Server::start();
    let mut s = start(&server);
    s.list_tools();
    server.fault(Fault::Status(
        403,
        None,
        "bad token CANARY-7F3A9C-SECRET (Q0FOQVJZLTdmM2E5Yy1zZWNyZXQ=, canary-7f3a9c-secret)",
    ));
    server.fault(Fault::Status(403, None, "still bad"));
    s.call(json!(1), "read", json!({}));
    let e = s.error(&json!(1));
    let text = e.to_string();
    assert!(text.contains("bad token [redacted]"), "{text}");
    for form in ["CANARY", "canary", "Q0FOQVJZLTdmM2E5Yy1zZWNyZXQ"] {
        assert!(!text.contains(form), "{form} in {text}");
    }
}

#[test]
fn a_header_value_a_server_echoes_with_json_escapes_is_not_shown_to_the_client() {
    // 2026-07-28: a 4xx whose body is the server's JSON-RPC error is
    // passed on; the token in it, spelled with `\u002d`, is redacted
    // before the client decodes it.
    let server = Server::start();
    let mut s = start_modern(&config(&server));
    server.fault(Fault::Body(
        400,
        r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"bad key CANARY\u002d7f3a9c\u002dsecret"}}"#,
    ));
    modern_call(&mut s, json!(1), "read", json!({}));
    let e = s.error(&json!(1));
    let text = e.to_string();
    assert!(text.contains("bad key [redacted]"), "{text}");
    assert!(!text.contains("7f3a9c"), "{text}");
}

/// Every `X-Api-Key` the helper of the rotation test printed: run `n` of
/// it prints `HELPERKEY-<n>-q7zv9k2m`.
#[cfg(unix)]
const HELPER_KEY_PREFIX: &str = "HELPERKEY-";

/// Whether `text` holds a helper's key, in any case.
#[cfg(unix)]
fn holds_helper_key(text: &str) -> bool {
    text.to_ascii_uppercase().contains(HELPER_KEY_PREFIX)
}

// The helper is a sh script (Windows runs helpers with cmd /C); `status`
// is read as its Unix tests read it.
#[cfg(unix)]
#[test]
fn a_helper_key_the_server_repeats_is_never_in_the_status_its_file_or_the_log_after_two_rotations()
{
    let server = Server::start();
    let helper = "n=$(cat \"$DIR/n\" 2>/dev/null || echo 0); n=$((n+1)); echo $n > \"$DIR/n\"\n\
                  printf '{\"X-Api-Key\": \"HELPERKEY-%s-q7zv9k2m\"}' $n\n";
    let text = format!(
        "servers:\n  remote:\n    url: {}\n    env:\n      DIR: \"{{dir}}\"\n    headers_helper: sh helper.sh\n",
        server.url()
    );
    let mut s = Builder::config(&text)
        .file("helper.sh", helper)
        .env("NO_PROXY", "127.0.0.1")
        .initialized();
    let runtime = s.dir.join("runtime");
    // Each call: a 401 (the helper prints the next key), then the call
    // again, answered with an error that quotes the new key.
    for (n, id) in [(2, 1), (3, 2)] {
        server.fault(Fault::Status(401, None, "key expired"));
        server.fault(Fault::EchoApiKey);
        s.call(json!(id), "write", json!({}));
        let answer = s.error(&json!(id));
        // The client gets the server's own answer, unchanged.
        let key = format!("{HELPER_KEY_PREFIX}{n}-q7zv9k2m");
        assert_eq!(
            answer["message"],
            format!("upstream rejected key {key}"),
            "{answer}"
        );
        assert_eq!(helper_runs(&s), n.to_string());
        let docs = crate::status::wait_for(&runtime, "the error in the status", |docs| {
            docs.iter().any(|d| {
                d["tools"]["write"]["failed"] == json!(id)
                    && d["tools"]["write"]["last_error"]["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with("upstream rejected key"))
            })
        });
        let shown = serde_json::to_string(&docs).unwrap();
        assert!(!holds_helper_key(&shown), "status --json: {shown}");
        assert!(
            shown.contains("upstream rejected key [redacted]"),
            "{shown}"
        );
    }
    let table = crate::status::status(&runtime, &[]);
    assert!(!holds_helper_key(&table.stdout), "{}", table.stdout);
    let prom = crate::status::status(&runtime, &["--prometheus"]);
    assert!(!holds_helper_key(&prom.stdout), "{}", prom.stdout);
    for file in std::fs::read_dir(&runtime).unwrap() {
        let text = std::fs::read_to_string(file.unwrap().path()).unwrap();
        assert!(!holds_helper_key(&text), "{text}");
        assert!(text.contains("[redacted]"), "{text}");
    }
    s.close_stdin();
    s.wait();
    server.with(|st| {
        assert_eq!(
            st.api_keys
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            3,
            "{:?}",
            st.api_keys
        )
    });
    // The log (at debug) never holds one either.
    let log = s.stderr();
    assert!(
        log.contains("upstream rejected key") || log.contains("401"),
        "{log}"
    );
    assert!(!holds_helper_key(&log), "{log}");
}
