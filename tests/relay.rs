//! The relay contract: ids, byte-for-byte passthrough, server→client
//! requests, notifications, cancellation and bad input.

use serde_json::{json, Value};

use crate::util::{Builder, MOCK};

#[test]
fn initialize_and_lists_match_a_direct_connection() {
    let mut direct = Builder::direct_mock().start();
    let mut proxied = Builder::wrap_mock().start();
    for s in [&mut direct, &mut proxied] {
        s.request(json!(0), "initialize", json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}));
    }
    assert_eq!(direct.recv_raw(), proxied.recv_raw());
    for (i, method) in ["tools/list", "resources/list", "prompts/list", "ping"]
        .iter()
        .enumerate()
    {
        let id = json!(i + 1);
        direct.request(id.clone(), method, json!({}));
        proxied.request(id.clone(), method, json!({}));
        assert_eq!(direct.recv_raw(), proxied.recv_raw(), "{method}");
    }
    let tools = {
        proxied.request(json!("t"), "tools/list", json!({}));
        proxied.result(&json!("t"))
    };
    let ro = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "ro_echo")
        .expect("ro_echo listed");
    assert_eq!(ro["annotations"]["readOnlyHint"], json!(true));
}

#[test]
fn client_ids_come_back_exactly() {
    let mut s = Builder::wrap_mock().initialized();
    let ids = [
        "7",
        "\"7\"",
        "0",
        "\"0\"",
        "9007199254740991",
        "\"\"",
        "\"a b\\\"c\"",
        "-3",
        "12345678901234567890",
    ];
    for id in ids {
        s.send_raw(&format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"x"}}}}}}"#
        ));
    }
    let mut seen = Vec::new();
    for _ in ids {
        let line = s.recv_raw();
        let start = line.find("\"id\":").unwrap() + 5;
        let v: Value = serde_json::from_str(&line).unwrap();
        assert!(v.get("result").is_some(), "{line}");
        let rest = &line[start..];
        let id = ids
            .iter()
            .find(|id| rest.starts_with(*id))
            .unwrap_or_else(|| panic!("unexpected id in {line}"));
        seen.push(*id);
    }
    seen.sort();
    let mut want = ids.to_vec();
    want.sort();
    assert_eq!(seen, want);
}

#[test]
fn two_hundred_concurrent_calls_get_their_own_answers() {
    let mut s = Builder::wrap_mock().initialized();
    for i in 0..200 {
        s.call(
            json!(i),
            "echo",
            json!({"mode": "slow", "ms": (i * 7) % 50, "text": format!("call-{i}")}),
        );
    }
    for _ in 0..200 {
        let r = s.recv();
        let id = r["id"].as_u64().expect("numeric id");
        assert_eq!(
            r["result"]["content"][0]["text"],
            json!(format!("call-{id}")),
            "{r}"
        );
    }
}

#[test]
fn params_and_results_pass_byte_for_byte() {
    let mut s = Builder::wrap_mock().with_logs().initialized();
    let raw = r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"big":12345678901234567890,"f":1.0,"e":1E+2,"u":"\u00e9\ud83d\ude00"},"_meta":{"com.example/x":[1.50,{"b":2,"a":1}]}},"extra":{"keep":true}}"#;
    s.send_raw(raw);
    s.result(&json!(5));
    let received = std::fs::read_to_string(s.dir.join("recv.log")).unwrap();
    let line = received
        .lines()
        .find(|l| l.contains("12345678901234567890"))
        .expect("the call reached the server");
    let params_start = raw.find("\"method\"").unwrap();
    let line_params = &line[line.find("\"method\"").unwrap()..];
    assert_eq!(line_params, &raw[params_start..], "only the id may change");
    assert!(
        !line.contains("\"id\":5,"),
        "the downstream id is the proxy's own: {line}"
    );
}

#[test]
fn server_to_client_requests_round_trip() {
    let mut s = Builder::wrap_mock().initialized();
    s.call(json!("c1"), "echo", json!({"mode": "sample"}));
    let req = s.recv_where("sampling request", |v| {
        v["method"] == "sampling/createMessage"
    });
    let id = req["id"].clone();
    assert!(id.is_number() || id.is_string());
    s.send(json!({"jsonrpc": "2.0", "id": id, "result": {"role": "assistant", "content": {"type": "text", "text": "sampled!"}, "model": "m"}}));
    let r = s.result(&json!("c1"));
    assert!(
        r["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("sampled!"),
        "{r}"
    );
}

#[test]
fn progress_notifications_reach_the_client() {
    let mut s = Builder::wrap_mock().initialized();
    s.request(
        json!(9),
        "tools/call",
        json!({"name": "echo", "arguments": {"mode": "progress", "steps": 3, "ms": 10}, "_meta": {"progressToken": "tok-9"}}),
    );
    let mut values = Vec::new();
    loop {
        let m = s.recv();
        if m.get("id") == Some(&json!(9)) {
            break;
        }
        assert_eq!(m["method"], "notifications/progress", "{m}");
        assert_eq!(m["params"]["progressToken"], "tok-9");
        values.push(m["params"]["progress"].as_f64().unwrap());
    }
    assert_eq!(values, [1.0, 2.0, 3.0]);
}

#[test]
fn client_cancel_is_forwarded_under_the_downstream_id_and_nothing_comes_back() {
    let mut s = Builder::wrap_mock().with_logs().initialized();
    s.call(json!("long"), "echo", json!({"mode": "hang"}));
    crate::util::eventually("the call reached the server", || s.executions("echo") == 1);
    s.notify(
        "notifications/cancelled",
        json!({"requestId": "long", "reason": "user"}),
    );
    s.request(json!("after"), "ping", json!({}));
    s.result(&json!("after"));
    s.expect_none_where(crate::util::ms(300), |v| {
        v.get("id") == Some(&json!("long"))
    });
    let exec = &s.log("exec.log")[0];
    let recv = std::fs::read_to_string(s.dir.join("recv.log")).unwrap();
    let cancel: Value = recv
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|m| m["method"] == "notifications/cancelled")
        .expect("the cancel reached the server");
    assert_eq!(
        cancel["params"]["requestId"], exec["id"],
        "rewritten to the downstream id"
    );
    assert_eq!(cancel["params"]["reason"], "user");
}

#[test]
fn cancel_for_an_unknown_request_is_dropped() {
    let mut s = Builder::wrap_mock().with_logs().initialized();
    s.notify("notifications/cancelled", json!({"requestId": 424242}));
    s.request(json!(1), "ping", json!({}));
    s.result(&json!(1));
    let recv = std::fs::read_to_string(s.dir.join("recv.log")).unwrap();
    assert!(!recv.contains("notifications/cancelled"), "{recv}");
}

#[test]
fn malformed_client_lines_get_errors_and_the_session_goes_on() {
    let mut s = Builder::wrap_mock().initialized();
    s.send_raw("this is not json");
    let e = s.recv();
    assert_eq!(e["id"], Value::Null);
    assert_eq!(e["error"]["code"], json!(-32700));
    s.send_raw("{\"jsonrpc\":\"2.0\",\"id\":1");
    assert_eq!(s.recv()["error"]["code"], json!(-32700));
    s.send_raw(r#"{"hello":"world"}"#);
    assert_eq!(s.recv()["error"]["code"], json!(-32600));
    s.send_raw(r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#);
    let e = s.recv();
    assert_eq!(
        (e["id"].clone(), e["error"]["code"].clone()),
        (Value::Null, json!(-32600))
    );
    s.send_raw(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#);
    let e = s.recv();
    assert_eq!(
        e["error"]["code"],
        json!(-32600),
        "batches need 2025-03-26: {e}"
    );
    s.send_raw(r#"{"jsonrpc":"2.0","id":"ok","method":"ping"}"#);
    assert_eq!(s.result(&json!("ok")), json!({}));
}

#[test]
fn batches_are_answered_as_one_array_on_2025_03_26() {
    let mut s = Builder::wrap_mock().start();
    s.request(json!(0), "initialize", json!({"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}));
    assert_eq!(s.result(&json!(0))["protocolVersion"], "2025-03-26");
    s.send_raw(r#"[{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":"a","method":"ping"},{"jsonrpc":"2.0","id":"b","method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}},7]"#);
    let line = s.recv_raw();
    let arr: Value = serde_json::from_str(&line).unwrap();
    let arr = arr
        .as_array()
        .unwrap_or_else(|| panic!("expected an array, got {line}"));
    assert_eq!(arr.len(), 3, "{line}");
    let by_id = |id: Value| arr.iter().find(|m| m["id"] == id).cloned().unwrap();
    assert_eq!(by_id(json!("a"))["result"], json!({}));
    assert_eq!(by_id(json!("b"))["result"]["content"][0]["text"], "hi");
    assert_eq!(by_id(Value::Null)["error"]["code"], json!(-32600));
}

#[test]
fn large_results_pass_intact() {
    let mut s = Builder::wrap_mock().initialized();
    s.call(
        json!(1),
        "echo",
        json!({"mode": "huge", "bytes": 12 * 1024 * 1024}),
    );
    let r = s.result(&json!(1));
    assert_eq!(
        r["content"][0]["text"].as_str().unwrap().len(),
        12 * 1024 * 1024
    );
}

#[test]
fn garbage_from_the_server_is_skipped() {
    let mut s = Builder::wrap_mock()
        .env("MOCK_WRITE_GARBAGE_AT_START", "1")
        .initialized();
    s.call(
        json!(1),
        "echo",
        json!({"mode": "garbage", "text": "after garbage"}),
    );
    assert_eq!(s.result(&json!(1))["content"][0]["text"], "after garbage");
    // The harness reads stderr on a thread of its own: the warning may
    // come in after the answer.
    crate::util::eventually("the warning about the garbage line", || {
        s.logged("not JSON")
    });
}

#[test]
fn server_notifications_and_requests_before_initialize_pass_through() {
    let mut s = Builder::wrap_mock().start();
    s.request(json!("p"), "ping", json!({}));
    assert_eq!(s.result(&json!("p")), json!({}));
    s.request(json!("d"), "server/discover", json!({}));
    assert_eq!(s.error(&json!("d"))["code"], json!(-32601));
    s.initialize();
    s.call(
        json!(1),
        "echo",
        json!({"mode": "notify", "method": "notifications/tools/list_changed", "params": {}}),
    );
    s.recv_where("list_changed", |v| {
        v["method"] == "notifications/tools/list_changed"
    });
    s.result(&json!(1));
}

#[test]
fn stderr_of_the_server_goes_to_stderr_only() {
    let mut s = Builder::wrap_mock()
        .env("MOCK_STDERR_LINES", "3")
        .initialized();
    s.request(json!(1), "ping", json!({}));
    s.result(&json!(1));
    crate::util::eventually("stderr copied", || s.logged("mock stderr line 2"));
    s.close_stdin();
    assert!(s.wait().success());
    // Everything on stdout was JSON (recv would have panicked otherwise).
    let _ = MOCK;
}

#[test]
fn an_attempt_does_not_time_out_while_the_client_answers_a_server_request() {
    let mut s = Builder::config("servers:\n  m:\n    command: {mock}\n    call_timeout: 0.5\n    env:\n      MOCK_LOG: \"{dir}/exec.log\"\n")
        .initialized();
    s.call(json!(1), "idem_echo", json!({"mode": "sample"}));
    let req = s.recv_where("sampling request", |v| {
        v["method"] == "sampling/createMessage"
    });
    // A person takes a while to approve the sampling request: real time,
    // more than twice the call's timeout, which must not run meanwhile.
    std::thread::sleep(crate::util::ms(1200));
    s.send(json!({"jsonrpc": "2.0", "id": req["id"], "result": {"role": "assistant", "content": {"type": "text", "text": "approved"}, "model": "m"}}));
    let r = s.result(&json!(1));
    assert!(
        r["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("approved"),
        "{r}"
    );
    assert_eq!(s.executions("idem_echo"), 1);
}
