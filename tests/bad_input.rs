//! The bad-input catalogue: malformed, oversized, hostile or plainly wrong
//! input from either side. Each case asserts a clear error (or a logged
//! drop, where nobody can be answered), bounded memory where size is the
//! attack, and a session that keeps working afterwards.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::util::{eventually, path_text, BadFile, Builder, Session};

/// The session still relays: a ping and a call get their answers.
fn still_works(s: &mut Session, tag: &str) {
    s.request(json!(format!("ping-{tag}")), "ping", json!({}));
    assert_eq!(s.result(&json!(format!("ping-{tag}"))), json!({}));
    let text = format!("still working ({tag})");
    s.call(json!(format!("call-{tag}")), "echo", json!({"text": text}));
    assert_eq!(
        s.result(&json!(format!("call-{tag}")))["content"][0]["text"],
        text.as_str()
    );
}

#[test]
fn invalid_utf8_is_a_parse_error() {
    let mut s = Builder::wrap_mock().with_logs().initialized();
    let cases: [&[u8]; 6] = [
        // A valid envelope with one bad byte in a string.
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"x\":\"\xff\"}",
        // A lone continuation byte before anything else.
        b"\x80{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}",
        // A multi-byte sequence cut short at the end of the line.
        b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ping\"}\xe2\x82",
        // An overlong encoding of '/'.
        b"{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"\xc0\xafping\"}",
        // A UTF-16 surrogate encoded as UTF-8.
        b"{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"ping\",\"s\":\"\xed\xa0\x80\"}",
        // Latin-1 text.
        b"{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"caf\xe9\"}",
    ];
    for bytes in cases {
        s.send_raw_bytes(bytes);
        let e = s.recv();
        assert_eq!(e["id"], Value::Null, "{e}");
        assert_eq!(e["error"]["code"], json!(-32700), "{e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains("UTF-8"),
            "{e}"
        );
    }
    assert!(
        !s.recv_lines().iter().any(|l| l.contains("\"ping\"")),
        "nothing invalid reached the server"
    );
    still_works(&mut s, "utf8");
}

#[test]
fn a_100_mb_line_is_refused_in_bounded_memory() {
    let mut s = Builder::mock_with("max_message_bytes: 1048576").initialized();
    let mut stdin = s.take_stdin();
    let writer = thread::spawn(move || {
        let chunk = vec![b'x'; 64 * 1024];
        // The id comes first: the proxy can answer.
        stdin
            .write_all(br#"{"jsonrpc":"2.0","id":"big","method":"tools/call","params":{"name":"echo","arguments":{"text":""#)
            .unwrap();
        for _ in 0..1600 {
            stdin.write_all(&chunk).unwrap();
        }
        stdin.write_all(b"\"}}}\n").unwrap();
        // The id comes last, after 2 MB of params that mention other ids.
        stdin
            .write_all(br#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"echo","arguments":{"id":"inner","note":"\",\"id\":\"fake\"","text":""#)
            .unwrap();
        for _ in 0..32 {
            stdin.write_all(&chunk).unwrap();
        }
        stdin.write_all(b"\"}},\"id\":\"late\"}\n").unwrap();
        // No id at all: nobody can be answered.
        stdin
            .write_all(br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"data":""#)
            .unwrap();
        for _ in 0..32 {
            stdin.write_all(&chunk).unwrap();
        }
        stdin.write_all(b"\"}}\n").unwrap();
        stdin.flush().unwrap();
        stdin
    });
    let started = Instant::now();
    let e = s.error(&json!("big"));
    assert_eq!(e["code"], json!(-32600), "{e}");
    let message = e["message"].as_str().unwrap();
    assert!(
        message.contains("104857") && message.contains("max_message_bytes (1048576)"),
        "the size and the limit are named: {e}"
    );
    // The id after the params was found as the line streamed past.
    let e = s.error(&json!("late"));
    assert_eq!(e["code"], json!(-32600), "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("2097"),
        "the size is named: {e}"
    );
    let stdin = writer.join().unwrap();
    s.give_stdin(stdin);
    eventually("the unanswerable line is logged", || {
        s.logged("dropped a client message")
    });
    let peak = s.memory_kb("VmHWM");
    assert!(
        peak < 40 * 1024,
        "the proxy's peak RSS was {peak} kB for a 100 MB line"
    );
    eprintln!(
        "100 MB line: refused in {:.1}s, proxy peak RSS {peak} kB",
        started.elapsed().as_secs_f64()
    );
    assert!(
        !s.recv_lines().iter().any(|l| l.len() > 1024 * 1024),
        "nothing over the limit reached the server"
    );
    still_works(&mut s, "after 100 MB");
    s.expect_none_where(crate::util::ms(200), |v| v["id"] == "late");
}

#[test]
fn deeply_nested_json_gets_a_clear_error() {
    let n = 100_000;
    let mut s = Builder::mock_with("call_timeout: 0.5").initialized();
    s.request(json!("list"), "tools/list", json!({}));
    s.result(&json!("list"));

    // Never closed: not JSON.
    s.send_raw(&"[".repeat(n));
    let e = s.recv();
    assert_eq!(
        (&e["id"], &e["error"]["code"]),
        (&Value::Null, &json!(-32700)),
        "{e}"
    );
    // Closed: a batch of batches (and batches need protocol 2025-03-26).
    s.send_raw(&format!("{}{}", "[".repeat(n), "]".repeat(n)));
    let e = s.recv();
    assert_eq!(
        (&e["id"], &e["error"]["code"]),
        (&Value::Null, &json!(-32600)),
        "{e}"
    );
    // Nested objects: JSON, but not JSON-RPC.
    s.send_raw(&format!("{}1{}", r#"{"a":"#.repeat(n), "}".repeat(n)));
    let e = s.recv();
    assert_eq!(
        (&e["id"], &e["error"]["code"]),
        (&Value::Null, &json!(-32600)),
        "{e}"
    );
    still_works(&mut s, "client nesting");

    // Deep arguments are the server's business: the proxy passes params on
    // byte for byte. This server cannot parse them and never answers, so
    // the call times out with the proxy's error.
    let deep = format!("{}{}", "[".repeat(n), "]".repeat(n));
    s.send_raw(&format!(
        r#"{{"jsonrpc":"2.0","id":"deep","method":"tools/call","params":{{"name":"echo","arguments":{{"deep":{deep}}}}}}}"#
    ));
    let e = s.error(&json!("deep"));
    assert_eq!(e["code"], json!(-31000), "{e}");
    assert!(e["message"].as_str().unwrap().contains("timed out"), "{e}");
    assert!(
        s.recv_lines().iter().any(|l| l.len() > 2 * n),
        "the deep call was relayed"
    );

    // From the server: a deeply nested line is skipped, the call answered.
    s.call(
        json!("from-server"),
        "echo",
        json!({"mode": "raw", "line": deep, "text": "after deep"}),
    );
    assert_eq!(
        s.result(&json!("from-server"))["content"][0]["text"],
        "after deep"
    );
    assert!(s.logged("nested batch"), "{}", s.stderr());
    still_works(&mut s, "server nesting");
}

#[test]
fn ids_that_are_not_strings_or_integers_are_invalid_requests() {
    let mut s = Builder::wrap_mock().with_logs().initialized();
    for id in [
        "null",
        "1.5",
        "-2.5e3",
        "1e3",
        "1.0",
        "{}",
        r#"{"a":1}"#,
        "[]",
        "[1]",
        "true",
    ] {
        s.send_raw(&format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"a bad id"}}}}}}"#
        ));
        let e = s.recv();
        assert_eq!(e["id"], Value::Null, "{id}: {e}");
        assert_eq!(e["error"]["code"], json!(-32600), "{id}: {e}");
        assert!(
            e["error"]["message"]
                .as_str()
                .unwrap()
                .contains("an id must be a string or an integer"),
            "{id}: {e}"
        );
    }
    assert_eq!(s.executions("echo"), 0, "no bad id reached the server");
    still_works(&mut s, "ids");
}

#[test]
fn repeated_member_names_are_refused_and_nothing_runs() {
    let mut s = Builder::wrap_mock().with_logs().initialized();
    s.list_tools();
    // The mock, like most JSON parsers, keeps the last of two members with
    // one name; the proxy refuses what it might read differently.
    let cases = [
        (
            "name",
            r#"{"jsonrpc":"2.0","id":"dup-name","method":"tools/call","params":{"name":"ro_echo","arguments":{"text":"x"},"name":"destructive_echo"}}"#,
            r#"duplicate member "name" in params"#,
        ),
        (
            "escaped",
            r#"{"jsonrpc":"2.0","id":"dup-escaped","method":"tools/call","params":{"name":"ro_echo","n\u0061me":"destructive_echo"}}"#,
            r#"duplicate member "name" in params"#,
        ),
        (
            "arguments",
            r#"{"jsonrpc":"2.0","id":"dup-args","method":"tools/call","params":{"name":"idem_echo","arguments":{"text":"a","mode":"echo","text":"b"}}}"#,
            r#"duplicate member "text" in params.arguments"#,
        ),
        (
            "meta",
            r#"{"jsonrpc":"2.0","id":"dup-meta","method":"tools/call","params":{"name":"idem_echo","arguments":{},"_meta":{"idempotencyKey":"k1","idempotencyKey":"k2"}}}"#,
            r#"duplicate member "idempotencyKey" in params._meta"#,
        ),
        (
            "other method",
            r#"{"jsonrpc":"2.0","id":"dup-read","method":"resources/read","params":{"uri":"mock://a","uri":"mock://b"}}"#,
            r#"duplicate member "uri" in params"#,
        ),
        (
            "other method's meta",
            r#"{"jsonrpc":"2.0","id":"dup-read-meta","method":"resources/read","params":{"uri":"mock://a","_meta":{"a":1,"a":1}}}"#,
            r#"duplicate member "a" in params._meta"#,
        ),
        (
            "prompt arguments",
            r#"{"jsonrpc":"2.0","id":"dup-prompt","method":"prompts/get","params":{"name":"greeting","arguments":{"who":"a","who":"b"}}}"#,
            r#"duplicate member "who" in params.arguments"#,
        ),
        (
            "envelope",
            r#"{"jsonrpc":"2.0","id":"dup-env","method":"ping","params":{},"method":"tools/call","params":{"name":"destructive_echo"}}"#,
            r#"duplicate member "method""#,
        ),
    ];
    for (what, line, expected) in cases {
        s.send_raw(line);
        let id: Value = serde_json::from_str::<Value>(line).unwrap()["id"].clone();
        let e = s.error(&id);
        assert_eq!(e["code"], json!(-32600), "{what}: {e}");
        let message = e["message"].as_str().unwrap();
        assert!(message.ends_with(expected), "{what}: {message}");
    }
    // The same member twice in different objects is fine.
    s.send_raw(
        r#"{"jsonrpc":"2.0","id":"nested","method":"tools/call","params":{"name":"ro_echo","arguments":{"name":"a","text":"fine","_meta":{}},"_meta":{"name":"b"}}}"#,
    );
    assert_eq!(s.result(&json!("nested"))["content"][0]["text"], "fine");
    still_works(&mut s, "repeated members");
    // The session went on, and none of the refused requests reached the
    // server (the later ones did, so it has read everything before them).
    assert_eq!(s.executions("destructive_echo"), 0);
    assert_eq!(s.executions("idem_echo"), 0);
    assert_eq!(s.executions("ro_echo"), 1, "only the call with no repeats");
    let refused: Vec<String> = s
        .recv_lines()
        .into_iter()
        .filter(|l| l.contains("dup-") || l.contains("mock://b"))
        .collect();
    assert!(refused.is_empty(), "{refused:?}");
}

#[test]
fn a_second_request_with_an_id_in_flight_is_refused() {
    let mut s = Builder::wrap_mock().with_logs().initialized();
    s.call(
        json!(7),
        "echo",
        json!({"mode": "slow", "ms": 300, "text": "first"}),
    );
    s.call(json!(7), "echo", json!({"text": "second"}));
    let first = s.response(&json!(7));
    assert_eq!(first["error"]["code"], json!(-32600), "{first}");
    assert!(
        first["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already in flight"),
        "{first}"
    );
    let second = s.response(&json!(7));
    assert_eq!(second["result"]["content"][0]["text"], "first", "{second}");
    assert_eq!(s.executions("echo"), 1, "the duplicate never ran");
    // Once answered, the id is free again.
    s.call(json!(7), "echo", json!({"text": "reused"}));
    assert_eq!(s.result(&json!(7))["content"][0]["text"], "reused");
}

#[test]
fn responses_with_ids_the_proxy_never_issued_are_dropped() {
    let mut s = Builder::wrap_mock().with_logs().initialized();
    s.call(json!("first"), "echo", json!({"text": "first"}));
    s.result(&json!("first"));
    let answered = s.log("exec.log")[0]["id"].clone();
    let lines = [
        json!({"jsonrpc": "2.0", "id": 999_999, "result": {"forged": true}}).to_string(),
        json!({"jsonrpc": "2.0", "id": "zzz", "result": {"forged": true}}).to_string(),
        json!({"jsonrpc": "2.0", "id": -1, "error": {"code": 1, "message": "forged"}}).to_string(),
        json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": "forged"}})
            .to_string(),
        // The id of a request that was answered already.
        json!({"jsonrpc": "2.0", "id": answered, "result": {"forged": true}}).to_string(),
    ];
    for (i, line) in lines.iter().enumerate() {
        let id = json!(format!("raw-{i}"));
        s.call(
            id.clone(),
            "echo",
            json!({"mode": "raw", "line": line, "text": format!("raw {i}")}),
        );
        let r = s.result(&id);
        assert_eq!(r["content"][0]["text"], format!("raw {i}"), "{r}");
    }
    s.expect_none_where(crate::util::ms(300), |v| v.to_string().contains("forged"));
    let stderr = s.stderr();
    assert_eq!(
        stderr.matches("an id the proxy never issued").count(),
        4,
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "answer to request {answered}, which was cancelled or abandoned"
        )),
        "{stderr}"
    );
    still_works(&mut s, "forged ids");
}

#[test]
fn a_server_writing_an_endless_line_is_stopped_in_bounded_memory() {
    let mut s = Builder::mock_with("call_timeout: 0.5\nmax_message_bytes: 1048576").initialized();
    s.request(json!("list"), "tools/list", json!({}));
    s.result(&json!("list"));
    let started = Instant::now();
    s.call(json!("endless"), "echo", json!({"mode": "endless"}));
    eventually("the endless call runs", || s.executions("echo") == 1);
    // Both wait behind the endless line.
    s.call(json!("behind"), "ro_echo", json!({"text": "behind"}));
    s.request(json!("ping"), "ping", json!({}));

    let e = s.error(&json!("endless"));
    assert_eq!(e["code"], json!(-31000), "{e}");
    let reason = e["data"]["reason"].as_str().unwrap();
    assert!(
        ["not_retried_unsafe", "server_exited"].contains(&reason),
        "{e}"
    );
    // The server is stopped and started again: the read-only call is
    // retried there, the ping sent again.
    assert_eq!(s.result(&json!("behind"))["content"][0]["text"], "behind");
    assert_eq!(s.result(&json!("ping")), json!({}));
    let took = started.elapsed();
    let logged = format!(
        "one line over max_message_bytes (1048576) for {:.1}s",
        crate::util::ms(500).as_secs_f64()
    );
    let stderr = s.stderr_with(&logged);
    assert!(stderr.contains(&logged), "{stderr}");
    assert_eq!(s.starts(), 2);
    let peak = s.memory_kb("VmHWM");
    eprintln!(
        "endless line: server stopped after {:.1}s, proxy peak RSS {peak} kB",
        took.as_secs_f64()
    );
    assert!(peak < 40 * 1024, "the proxy's peak RSS was {peak} kB");
    still_works(&mut s, "endless");
}

#[test]
fn requests_beyond_max_in_flight_are_overloaded() {
    let mut s = Builder::mock_with("max_in_flight: 4").initialized();
    for i in 0..4 {
        s.call(
            json!(format!("h{i}")),
            "echo",
            json!({"mode": "hang", "n": i}),
        );
    }
    eventually("four calls hang", || s.executions("echo") == 4);
    for i in 0..3 {
        s.call(json!(format!("x{i}")), "echo", json!({"n": i}));
        let e = s.error(&json!(format!("x{i}")));
        assert_eq!(e["code"], json!(-31000), "{e}");
        assert_eq!(e["data"]["reason"], "overloaded", "{e}");
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .contains("max_in_flight is 4"),
            "{e}"
        );
    }
    s.request(json!("p"), "ping", json!({}));
    assert_eq!(s.error(&json!("p"))["data"]["reason"], "overloaded");
    assert_eq!(s.executions("echo"), 4, "nothing over the cap ran");
    for i in 0..4 {
        s.notify(
            "notifications/cancelled",
            json!({"requestId": format!("h{i}")}),
        );
    }
    still_works(&mut s, "in flight");
}

#[test]
fn a_client_that_stops_reading_does_not_grow_the_proxy_without_bound() {
    // 400 answers of 256 kB (100 MB) for a client that reads nothing. The
    // replay table keeps results too, within idempotency_max_bytes; keys
    // are kept in memory, where the oldest are evicted (the store's own
    // bound is dispatcher::calls' results_waiting_for_the_store_...).
    let calls = 400;
    let bound_kb = 64 * 1024;
    // No call times out, however long a loaded machine takes to run them
    // all: the wait below allows 30 s scaled, which at scale 3 is longer
    // than the default call_timeout (60 s).
    let mut s = Builder::mock_with(
        "max_message_bytes: 1048576\nidempotency_max_bytes: 8388608\nstore: memory\ncall_timeout: 600",
    )
    .unread_stdout()
    .start();
    eventually("the server to start", || s.stderr().contains("(pid "));
    s.note_memory_base();
    let mut stdin = s.take_stdin();
    let writer = thread::spawn(move || {
        for i in 0..calls {
            let line = json!({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": "echo", "arguments": {"mode": "huge", "bytes": 256 * 1024, "n": i, "_idempotency_key": format!("k{i}")}}});
            if writeln!(stdin, "{line}").is_err() {
                break;
            }
        }
        stdin
    });
    // Wait until the proxy has taken in all it takes in: its memory stays
    // flat for a second once every call has run (or it goes over).
    let deadline = Instant::now() + crate::util::ms(30000);
    let mut samples: Vec<u64> = Vec::new();
    loop {
        thread::sleep(Duration::from_millis(100));
        let rss = s.memory_kb("VmRSS");
        samples.push(rss);
        let recent = &samples[samples.len().saturating_sub(10)..];
        let flat = samples.len() >= 10 && recent.iter().max().unwrap() - recent[0] < 1024;
        if rss > bound_kb || Instant::now() > deadline || (flat && s.executions("echo") == calls) {
            break;
        }
    }
    let stalled = samples.iter().max().copied().unwrap_or(0);
    s.read_stdout();
    let stdin = writer.join().unwrap();
    s.give_stdin(stdin);
    // Answers come in the order the calls completed.
    let mut order = Vec::new();
    for _ in 0..calls {
        let (id, text) = huge_answer(&s.recv_raw());
        assert_eq!(text, 256 * 1024, "id {id}");
        order.push(id);
    }
    let peak = s.memory_kb("VmHWM");
    eprintln!("client not reading: proxy RSS up to {stalled} kB while stalled, peak {peak} kB");
    // The newest results are replayed, the oldest were evicted (each call
    // has its own idempotency key, which replays whatever ran since).
    let again = |i: usize| json!({"mode": "huge", "bytes": 256 * 1024, "n": i, "_idempotency_key": format!("k{i}")});
    s.call(json!("newest"), "echo", again(order[calls - 1]));
    let r = s.result(&json!("newest"));
    assert_eq!(r["_meta"]["mcp-retry/source"], "dedup");
    s.call(json!("oldest"), "echo", again(order[0]));
    let r = s.result(&json!("oldest"));
    assert!(r.get("_meta").is_none(), "executed again");
    assert_eq!(s.executions("echo"), calls + 1);
    assert!(
        peak < bound_kb,
        "the proxy's peak RSS was {peak} kB while holding answers for a client that did not read"
    );
    still_works(&mut s, "reading again");
}

/// The id and the length of the text of an answer of the mock's `huge`
/// mode, as the mock writes it: read without parsing (a debug build takes
/// seconds to parse 100 MB of JSON).
fn huge_answer(line: &str) -> (usize, usize) {
    let after = |key: &str| {
        let at = line
            .find(key)
            .unwrap_or_else(|| panic!("no {key} in {line:.200}"));
        &line[at + key.len()..]
    };
    let id = after(r#""id":"#);
    let id = id[..id.find(|c: char| !c.is_ascii_digit()).unwrap()]
        .parse()
        .unwrap();
    let text = after(r#""text":""#);
    let len = text.find('"').unwrap();
    assert!(
        text.starts_with('x') && text[..len].ends_with('x'),
        "{line:.200}"
    );
    (id, len)
}

/// The downstream id under which the server received the request whose line
/// contains `tag`.
fn downstream_id(s: &Session, tag: &str) -> Value {
    eventually(&format!("the server to receive {tag}"), || {
        s.recv_lines().iter().any(|l| l.contains(tag))
    });
    let line = s
        .recv_lines()
        .into_iter()
        .find(|l| l.contains(tag))
        .unwrap();
    serde_json::from_str::<Value>(&line).unwrap()["id"].clone()
}

/// A proxy error with this `data.reason`.
fn assert_proxy_error(e: &Value, reason: &str) {
    assert_eq!(e["code"], json!(-31000), "{e}");
    assert_eq!(e["data"]["source"], "mcp-retry", "{e}");
    assert_eq!(e["data"]["reason"], reason, "{e}");
}

/// After the server's real answer to `down` came and was dropped, nothing
/// more reaches the client for `id`: it got exactly one answer.
fn no_second_answer(s: &mut Session, id: &Value, down: &Value, tag: &str) {
    let dropped = format!("dropped the server's answer to request {down}");
    eventually("the late answer to be dropped", || {
        s.stderr().contains(&dropped)
    });
    // Anything relayed before the ping's answer has reached us by now.
    still_works(s, tag);
    s.expect_none_where(crate::util::ms(100), |v| v.get("id") == Some(id));
}

/// Sends a `tools/list` (id `list`) tagged `tag`, to a mock that answers
/// it late; its id, and the id the proxy gave it downstream.
fn list_in_flight(s: &mut Session, tag: &str) -> (Value, Value) {
    let id = json!("list");
    s.request(id.clone(), "tools/list", json!({"_meta": {"tag": tag}}));
    (id, downstream_id(s, tag))
}

#[test]
fn a_request_whose_answer_is_not_valid_json_rpc_gets_an_error() {
    let b = Builder::wrap_mock().with_logs();
    let answer = b.dir().join("answer-list");
    let mut s = b
        .env("MOCK_TOOLS_LIST_UNTIL", &path_text(&answer))
        .initialized();
    let (id, down) = list_in_flight(&mut s, "list-1");
    // An answer with both a result and an error, before the real one.
    let line = format!(
        r#"{{"jsonrpc":"2.0","id":{down},"result":{{"tools":[]}},"error":{{"code":-32000,"message":"both"}}}}"#
    );
    s.call(
        json!("raw"),
        "echo",
        json!({"mode": "raw", "line": line, "text": "sent"}),
    );
    let e = s.error(&id);
    assert_proxy_error(&e, "invalid_response");
    assert_eq!(s.result(&json!("raw"))["content"][0]["text"], "sent");
    // The real answer, late.
    std::fs::write(&answer, "").unwrap();
    no_second_answer(&mut s, &id, &down, "invalid answer");
}

#[test]
fn a_request_whose_answer_is_over_max_message_bytes_gets_an_error() {
    let b = Builder::mock_with("max_message_bytes: 65536");
    let answer = b.dir().join("answer-list");
    let mut s = b
        .env("MOCK_TOOLS_LIST_UNTIL", &path_text(&answer))
        .initialized();
    let (id, down) = list_in_flight(&mut s, "list-2");
    let line = format!(r#"{{"jsonrpc":"2.0","id":{down},"result":{{"tools":[],"x":"{{pad}}"}}}}"#);
    let args = json!({"mode": "raw", "line": line, "pad": 100_000, "text": "sent"});
    s.call(json!("raw"), "echo", args);
    let e = s.error(&id);
    assert_proxy_error(&e, "response_too_large");
    assert!(
        e["message"].as_str().unwrap().contains("max_message_bytes"),
        "{e}"
    );
    assert_eq!(s.result(&json!("raw"))["content"][0]["text"], "sent");
    std::fs::write(&answer, "").unwrap();
    no_second_answer(&mut s, &id, &down, "overlong answer");
}

#[test]
fn a_call_whose_answer_is_over_max_message_bytes_fails_at_once_and_runs_once() {
    // An idempotent tool, which a timeout would retry: the answer came,
    // so the tool ran, and it is not run again.
    let mut s = Builder::mock_with("max_message_bytes: 65536\ncall_timeout: 60s").initialized();
    s.list_tools();
    let id = json!("huge");
    s.call(
        id.clone(),
        "idem_echo",
        json!({"mode": "huge", "bytes": 100_000}),
    );
    let e = s
        .response_within(&id, crate::util::ms(20000))
        .expect("an answer well before call_timeout");
    assert_proxy_error(&e["error"], "response_too_large");
    still_works(&mut s, "huge call");
    assert_eq!(s.executions("idem_echo"), 1);
}

#[test]
fn a_call_whose_answer_is_not_valid_json_rpc_fails_at_once_and_runs_once() {
    let mut s = Builder::mock_with("call_timeout: 60s").initialized();
    s.list_tools();
    let id = json!("slow");
    let answer = s.dir.join("answer-call");
    let args = json!({"mode": "slow", "until": path_text(&answer), "text": "call-tag-1"});
    s.call(id.clone(), "idem_echo", args);
    let down = downstream_id(&s, "call-tag-1");
    let line = format!(
        r#"{{"jsonrpc":"2.0","id":{down},"result":{{}},"error":{{"code":1,"message":"m"}}}}"#
    );
    s.call(
        json!("raw"),
        "echo",
        json!({"mode": "raw", "line": line, "text": "sent"}),
    );
    let e = s.error(&id);
    assert_proxy_error(&e, "invalid_response");
    assert_eq!(s.result(&json!("raw"))["content"][0]["text"], "sent");
    std::fs::write(&answer, "").unwrap();
    no_second_answer(&mut s, &id, &down, "invalid call answer");
    assert_eq!(s.executions("idem_echo"), 1);
}

/// The proxy's answer to a call that timed out.
fn timed_out(r: &Value) -> bool {
    r["error"]["code"] == -31000
        && r["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("timed out"))
}

/// A `tools/call` of `echo` answering "ok", padded with `pad` bytes. Its
/// own idempotency key keeps the arguments out of the dedup table (which
/// would otherwise hold copies of them as keys while the call runs).
fn padded_call(id: usize, pad: usize) -> String {
    // Written out rather than serialised: a debug build's serde_json takes
    // seconds for tens of MiB.
    let pad = "p".repeat(pad);
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"ok","n":{id},"pad":"{pad}"}},"_meta":{{"idempotencyKey":"k{id}"}}}}}}"#
    ) + "\n"
}

/// Has the server stop reading its input (the mock's `deaf` mode) until
/// [`hear`] is called with the file returned.
fn deafen(s: &mut Session) -> PathBuf {
    let file = s.dir.join("read-again");
    let until = crate::util::path_text(&file);
    s.call(
        json!("deaf"),
        "echo",
        json!({"mode": "deaf", "until": until}),
    );
    s.result(&json!("deaf"));
    file
}

/// The server [`deafen`] made deaf reads again.
fn hear(file: &Path) {
    std::fs::write(file, "").unwrap();
}

/// Calls `echo` until a call is not refused `overloaded`: the server has
/// read what waited for it.
fn until_the_server_reads(s: &mut Session) {
    let deadline = Instant::now() + crate::util::ms(30000);
    for i in 0.. {
        let id = json!(format!("back-{i}"));
        s.call(id.clone(), "echo", json!({"text": "back"}));
        let r = s.response(&id);
        if r.get("result").is_some() {
            return;
        }
        assert_eq!(r["error"]["data"]["reason"], "overloaded", "{r}");
        assert!(Instant::now() < deadline, "the server never read again");
        thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_server_that_stops_reading_never_wedges_the_client() {
    // 40 calls of 1 MiB for a server that reads nothing until every call
    // has its answer: the proxy sends what fits its 8 MiB backlog toward
    // the server and answers the rest `overloaded` at once, so the client's
    // writer never blocks, and a cancel and a ping get through meanwhile.
    // The calls that waited in the backlog time out and are withdrawn: once
    // the server reads again, none of them runs. Every call gets exactly
    // one answer.
    let limit = 2 * 1024 * 1024;
    let calls = 40;
    let b = Builder::mock_with(&format!(
        "max_message_bytes: {limit}\ncall_timeout: 1\nretry:\n  max_retries: 0\ncircuit_breaker:\n  failure_threshold: 1000"
    ));
    let mut s = b.initialized();
    // Known annotations: a timed-out call is answered, not retried.
    s.list_tools();
    let deaf = deafen(&mut s);
    let mut stdin = s.take_stdin();
    for i in 0..calls {
        stdin
            .write_all(padded_call(i, 1024 * 1024).as_bytes())
            .unwrap();
    }
    s.give_stdin(stdin);
    // All 40 were written: the proxy kept reading. A cancel of one of them
    // and a ping get in too.
    s.notify(
        "notifications/cancelled",
        json!({"requestId": 1, "reason": "changed my mind"}),
    );
    s.request(json!("ping"), "ping", json!({}));
    let mut answers: HashMap<u64, Value> = HashMap::new();
    let mut ping = None;
    // Call 1 may have timed out before its cancel came: then it has its
    // answer; else none.
    let others = |a: &HashMap<u64, Value>| a.keys().filter(|id| **id != 1).count();
    while others(&answers) < calls - 1 || ping.is_none() {
        let r = s.recv_where("an answer", |v| v.get("id").is_some());
        if r["id"] == "ping" {
            ping = Some(r);
            continue;
        }
        let id = r["id"].as_u64().unwrap_or_else(|| panic!("unexpected {r}"));
        assert!(id < calls as u64, "unexpected {r}");
        assert!(answers.insert(id, r).is_none(), "call {id} answered twice");
    }
    assert_eq!(
        ping.unwrap()["result"],
        json!({}),
        "the proxy answers the ping"
    );
    let overloaded = answers
        .values()
        .filter(|r| r["error"]["data"]["reason"] == "overloaded")
        .count();
    let timed_out = answers.values().filter(|r| timed_out(r)).count();
    // A call that came once timed-out ones had been withdrawn and left
    // room was sent, and ran once the server read again.
    let ok = answers
        .values()
        .filter(|r| r["result"]["content"][0]["text"] == "ok")
        .count();
    let kinds: Vec<(u64, String)> = answers
        .iter()
        .map(|(id, r)| (*id, r["error"]["data"]["reason"].to_string()))
        .collect();
    assert_eq!(overloaded + timed_out + ok, answers.len(), "{kinds:?}");
    // How many went before the backlog filled depends on how fast the
    // calls that timed out were withdrawn; some were refused.
    assert!(overloaded > 0, "{overloaded} overloaded of {calls}");
    let message = answers
        .values()
        .find(|r| r["error"]["data"]["reason"] == "overloaded")
        .unwrap()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("not reading its input"), "{message}");
    // The server reads again: the withdrawn calls never run. The line the
    // proxy was writing when the server stopped reading cannot be
    // withdrawn, and runs.
    hear(&deaf);
    until_the_server_reads(&mut s);
    still_works(&mut s, "server reading again");
    let withdrawn: Vec<u64> = s
        .stderr()
        .lines()
        .filter_map(|l| l.split("withdrew downstream request ").nth(1))
        .filter_map(|rest| rest.split(' ').next()?.parse().ok())
        .collect();
    assert!(!withdrawn.is_empty(), "timed-out calls were withdrawn");
    let ran: Vec<u64> = s
        .execs_of("echo")
        .iter()
        .filter(|e| e["arguments"].get("pad").is_some())
        .filter_map(|e| e["id"].as_u64())
        .collect();
    assert!(ran.len() >= ok, "{ran:?}");
    for id in &withdrawn {
        assert!(!ran.contains(id), "withdrawn request {id} ran");
    }
    let padded_runs = ran.len();
    eprintln!(
        "server not reading: {overloaded} overloaded, {timed_out} timed out, {ok} ok, {padded_runs} ran; peak RSS {} kB",
        s.memory_kb("VmHWM")
    );
}

#[test]
fn notifications_for_a_server_that_pauses_reading_are_bounded_and_arrive_in_order() {
    // 20 MiB of notifications while the server reads nothing (until the
    // ping after them is answered): the proxy queues what fits the backlog
    // and its reserve, drops the rest with a log line, and keeps reading
    // the client; the ones that went arrive in order, and the ping after
    // them is answered.
    let count = 20;
    let mut s = Builder::mock_with("max_message_bytes: 2097152").initialized();
    s.list_tools();
    let deaf = deafen(&mut s);
    let pad = "n".repeat(1024 * 1024);
    for i in 0..count {
        // Written out: serialising 20 MiB takes a debug build seconds.
        s.send_raw(&format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"level":"info","data":"{i} {pad}"}}}}"#
        ));
    }
    s.request(json!("after"), "ping", json!({}));
    assert_eq!(s.result(&json!("after")), json!({}));
    hear(&deaf);
    until_the_server_reads(&mut s);
    still_works(&mut s, "after the pause");
    let seen: Vec<usize> = s
        .recv_lines()
        .into_iter()
        .filter(|l| l.contains(r#""method":"notifications/message""#))
        .filter_map(|l| {
            let data = l.split(r#""data":""#).nth(1)?;
            data.split(' ').next()?.parse().ok()
        })
        .collect();
    // The first ones, and all in order; those that came while the backlog
    // was full were dropped and logged.
    assert!(seen.len() >= 7, "{seen:?}");
    assert_eq!(seen[..7], [0, 1, 2, 3, 4, 5, 6], "{seen:?}");
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "in order: {seen:?}");
    assert!(seen.len() < count, "{seen:?}");
    assert!(s.logged("it is not reading its input"));
    let peak = s.memory_kb("VmHWM");
    assert!(peak < 96 * 1024, "peak RSS {peak} kB");
}

/// `config::MAX_CONFIG_BYTES`, `env_file::MAX_ENV_FILE_BYTES` and
/// `http::MAX_CA_FILE_BYTES` (`store::redis`'s too).
const CONFIG_CAP: u64 = 4 << 20;
const ENV_FILE_CAP: u64 = 1 << 20;
const CA_FILE_CAP: u64 = 4 << 20;

#[test]
fn a_config_or_env_file_that_is_a_fifo_a_device_or_too_large_is_refused_at_once() {
    for (what, cap) in [("config", CONFIG_CAP), ("env file", ENV_FILE_CAP)] {
        for bad in BadFile::all(cap) {
            let b = Builder::config("servers:\n  s:\n    command: {mock}\n    envFile: named\n");
            let named = b
                .dir()
                .join(if what == "config" { "c.yaml" } else { "named" });
            if what == "config" {
                std::fs::remove_file(&named).unwrap();
            }
            bad.make(&named);
            let mut s = b.start();
            let status = s.wait();
            assert_eq!(status.code(), Some(2), "{what} {bad:?}: {}", s.stderr());
            let want = format!("cannot read {what} {}: {}", named.display(), bad.reason());
            // Its stderr is read to the end by a thread of the harness;
            // paths compared with `/` (the config's is given so).
            let want = want.replace('\\', "/");
            eventually(&format!("{what} {bad:?}: {want}"), || {
                s.stderr().replace('\\', "/").contains(&want)
            });
        }
    }
}

#[test]
fn a_ca_file_that_is_a_fifo_a_device_or_too_large_fails_the_start_and_the_proxy_still_answers() {
    for bad in BadFile::all(CA_FILE_CAP) {
        let b = Builder::config(&format!(
            "servers:\n  s:\n    url: http://127.0.0.1:{}/mcp\n    ca_file: ca.pem\n",
            crate::loopback::closed_port()
        ));
        let ca = b.dir().join("ca.pem");
        bad.make(&ca);
        let mut s = b.start();
        // The start fails for a reason only a fix heals: initialize gets
        // it at once.
        let answer = s.initialize();
        // Paths compared with `/` (JSON text escapes Windows' `\`).
        let want = format!("cannot read ca_file {}: {}", ca.display(), bad.reason());
        assert!(
            answer
                .to_string()
                .replace("\\\\", "/")
                .contains(&want.replace('\\', "/")),
            "{bad:?}: {answer}"
        );
        #[cfg(unix)]
        {
            s.signal(libc::SIGTERM);
            let status = s.wait();
            assert_eq!(
                status.code(),
                Some(128 + libc::SIGTERM),
                "{bad:?}: {}",
                s.stderr()
            );
        }
    }
}

#[test]
fn a_store_ca_file_that_is_a_fifo_a_device_or_too_large_is_refused_at_once() {
    // `store_ca_file` is read as `ca_file` is: a FIFO does not hold the
    // start, and no file is read past its cap.
    for bad in BadFile::all(CA_FILE_CAP) {
        let b = Builder::config(&format!(
            "store: redis://127.0.0.1:{}\nstore_ca_file: {{dir}}/ca.pem\nservers:\n  s:\n    command: {{mock}}\n",
            crate::loopback::closed_port()
        ));
        let ca = b.dir().join("ca.pem");
        bad.make(&ca);
        let mut s = b.start();
        let status = s.wait();
        assert_eq!(status.code(), Some(2), "{bad:?}: {}", s.stderr());
        let want = format!(
            "store_ca_file: cannot read {}: {}",
            path_text(&ca),
            bad.reason()
        );
        eventually(&format!("{bad:?}: {want}"), || s.stderr().contains(&want));
    }
}

#[test]
fn a_call_withdrawn_before_its_line_was_written_is_not_counted_as_sent() {
    // The server stops reading: a large call fills the pipe and stays
    // half written, a small one waits behind it. Both time out; the
    // small one is withdrawn unwritten, so the exit summary counts two
    // attempts sent (the call that made the server deaf, and the large
    // one), not three.
    let b = Builder::mock_with("call_timeout: 1\nretry:\n  max_retries: 0");
    let mut s = b.initialized();
    s.list_tools();
    let deaf = deafen(&mut s);
    s.send_raw(padded_call(1, 256 * 1024).trim_end());
    s.send_raw(padded_call(2, 10).trim_end());
    for id in [1, 2] {
        let r = s.response(&json!(id));
        assert!(timed_out(&r), "{r}");
    }
    assert!(s.logged("withdrew downstream request"), "{}", s.stderr());
    hear(&deaf);
    s.close_stdin();
    s.wait();
    eventually("the summary", || s.logged("summary: "));
    assert!(
        s.logged("summary: 3 call(s), 2 attempt(s) sent"),
        "{}",
        s.stderr_with("summary")
    );
}
