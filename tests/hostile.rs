//! Hostile remote servers on the loopback server, against `run --url`:
//! a server that asks for a delay past any clock, sends huge SSE ids or
//! events without `id:` lines, answers with an event over
//! `max_message_bytes`, or goes silent after every resumption. Each test scripts the answer to `tools/call` (and,
//! where it matters, to GET) itself and counts what the server executed;
//! the rest of a 2025-era session (`initialize`, notifications,
//! `tools/list`, `ping`) is served plainly, one request per connection.
//! Knows nothing of mcp-retry's internals.

use std::io::Write;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde_json::{json, Value};

use crate::loopback::{Conn, HttpRequest, Loopback};
use crate::util::{Builder, Session};

/// What the server knows of the session so far.
#[derive(Default)]
pub struct Seen {
    /// `tools/call` requests the server ran.
    pub executions: usize,
    /// `ping` requests answered.
    pub pings: usize,
    /// What a resumption replays (as a test sets it).
    pub replay: String,
    /// The `Last-Event-ID` of each resumption.
    pub resumed_from: Vec<String>,
}

type OnCall = dyn Fn(&mut Conn, &Value, &Server) + Send + Sync;
type OnGet = dyn Fn(&mut Conn, &HttpRequest, &Server) + Send + Sync;

/// A loopback server whose answer to each `tools/call` is `on_call`'s,
/// and to each GET `on_get`'s (405 without one).
pub struct Server {
    http: Loopback,
    seen: Mutex<Seen>,
    on_call: Box<OnCall>,
    on_get: Option<Box<OnGet>>,
}

impl Server {
    pub fn start(
        on_call: impl Fn(&mut Conn, &Value, &Server) + Send + Sync + 'static,
    ) -> Arc<Server> {
        Server::start_inner(Box::new(on_call), None)
    }

    /// A server whose GETs (its own stream, resumptions) `on_get` answers.
    pub fn with_get(
        on_get: impl Fn(&mut Conn, &HttpRequest, &Server) + Send + Sync + 'static,
        on_call: impl Fn(&mut Conn, &Value, &Server) + Send + Sync + 'static,
    ) -> Arc<Server> {
        Server::start_inner(Box::new(on_call), Some(Box::new(on_get)))
    }

    fn start_inner(on_call: Box<OnCall>, on_get: Option<Box<OnGet>>) -> Arc<Server> {
        Arc::new_cyclic(|server: &Weak<Server>| {
            let server = server.clone();
            Server {
                http: Loopback::start(move |req, conn| {
                    if let Some(server) = server.upgrade() {
                        server.answer(conn, &req);
                    }
                }),
                seen: Mutex::new(Seen::default()),
                on_call,
                on_get,
            }
        })
    }

    pub fn url(&self) -> String {
        self.http.url("/mcp")
    }

    pub fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap()
    }

    /// Counts one execution of a tool.
    pub fn ran(&self) {
        self.seen().executions += 1;
    }

    pub fn executions(&self) -> usize {
        self.seen().executions
    }

    /// Answers one request (the only one on its connection).
    fn answer(&self, conn: &mut Conn, req: &HttpRequest) {
        if let (Some(on_get), true) = (&self.on_get, req.start.starts_with("GET")) {
            return on_get(conn, req, self);
        }
        if !req.start.starts_with("POST") {
            // No stream of its own, and nothing to resume.
            let status = if req.start.starts_with("DELETE") {
                200
            } else {
                405
            };
            return conn.respond(status, &[], "");
        }
        let msg: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        let id = msg["id"].clone();
        match msg["method"].as_str() {
            Some("initialize") => {
                let version = msg["params"]["protocolVersion"].clone();
                let body = json!({"jsonrpc": "2.0", "id": id, "result": {
                    "protocolVersion": version, "capabilities": {"tools": {}},
                    "serverInfo": {"name": "hostile", "version": "1"}}});
                let headers = [
                    ("Content-Type", "application/json"),
                    ("Mcp-Session-Id", "h1"),
                ];
                conn.respond(200, &headers, &body.to_string())
            }
            Some("tools/call") => (self.on_call)(conn, &msg, self),
            Some(method) if !id.is_null() => {
                let result = match method {
                    "tools/list" => json!({"tools": [
                        {"name": "read", "inputSchema": {"type": "object"},
                            "annotations": {"readOnlyHint": true}},
                        {"name": "write", "inputSchema": {"type": "object"}}]}),
                    _ => json!({}),
                };
                let body = json!({"jsonrpc": "2.0", "id": id, "result": result});
                conn.respond(
                    200,
                    &[("Content-Type", "application/json")],
                    &body.to_string(),
                );
                if method == "ping" {
                    self.seen().pings += 1;
                }
            }
            // A notification, or an answer to a request of ours.
            _ => conn.respond(202, &[], ""),
        }
    }
}

/// The result of call `msg`, as a JSON-RPC line.
pub fn result_of(msg: &Value, text: &str) -> String {
    json!({"jsonrpc": "2.0", "id": msg["id"],
        "result": {"content": [{"type": "text", "text": text}]}})
    .to_string()
}

/// A proxy for `server` (`extra` config lines for the server), after the
/// handshake and `tools/list`.
fn proxy(server: &Server, extra: &str) -> Session {
    started(proxy_of(server, extra))
}

/// The proxy of [`proxy`], not started yet.
fn proxy_of(server: &Server, extra: &str) -> Builder {
    let policy = format!("retry:\n  base_delay: 0.05\n  max_delay: 0.2\n  jitter: 0\n{extra}");
    Builder::remote_with(&server.url(), &policy)
}

/// Started, initialized, and the tools listed.
fn started(b: Builder) -> Session {
    let mut s = b.initialized();
    s.list_tools();
    s
}

#[test]
fn a_retry_after_past_any_clock_is_the_longest_delay_not_a_crash() {
    // Each call is refused once (429) with a hint too long to wait for,
    // then, answered the second time, runs.
    let server = Server::start(|conn, msg, server| {
        let hint = match msg["params"]["arguments"]["hint"].as_str() {
            Some(h) => h.to_owned(),
            None => {
                server.ran();
                let body = result_of(msg, "done");
                conn.respond(200, &[("Content-Type", "application/json")], &body);
                return;
            }
        };
        let headers = [("Content-Type", "application/json"), ("Retry-After", &hint)];
        let body = json!({"jsonrpc": "2.0", "id": msg["id"],
            "error": {"code": -32000, "message": "slow down"}});
        conn.respond(429, &headers, &body.to_string());
    });
    let mut s = proxy(&server, "");
    let day_ms = json!(24 * 3600 * 1000);
    for (n, hint) in [
        "18446744073709551615",
        "9223372036854775807",
        "99999999999999999999999999",
        "Fri, 31 Dec 9999 23:59:59 GMT",
    ]
    .into_iter()
    .enumerate()
    {
        s.call(json!(n), "write", json!({"hint": hint}));
        let e = s.error(&json!(n));
        assert_eq!(e["data"]["retryAfterMs"], day_ms, "{hint}: {e}");
    }
    // Alive, and nothing ran twice.
    s.call(json!("ok"), "write", json!({}));
    assert_eq!(s.result(&json!("ok"))["content"][0]["text"], "done");
    assert_eq!(server.executions(), 1);
}

#[test]
fn an_sse_answer_over_max_message_bytes_is_final_after_one_run() {
    let server = Server::start(|conn, msg, server| {
        server.ran();
        conn.start_events("");
        let big = "x".repeat(4096);
        if msg["params"]["arguments"]["note_first"] == true {
            // A notification over the limit, then the response.
            let note = json!({"jsonrpc": "2.0", "method": "notifications/message",
                "params": {"level": "info", "data": big}});
            let done = result_of(msg, "done");
            let _ = write!(conn, "id: e1\ndata: {note}\n\nid: e2\ndata: {done}\n\n");
        } else {
            let _ = write!(conn, "id: e1\ndata: {}\n\n", result_of(msg, &big));
        }
    });
    let mut s = proxy(&server, "max_message_bytes: 1024");
    s.call(json!(1), "read", json!({}));
    let e = s.error(&json!(1));
    assert_eq!(
        e["data"]["reason"],
        "response_too_large",
        "{e}\n{}",
        s.stderr()
    );
    assert_eq!(server.executions(), 1, "{e}");
    // An unsafe tool: the same final answer, not "outcome unknown".
    s.call(json!(2), "write", json!({}));
    let e = s.error(&json!(2));
    assert_eq!(e["data"]["reason"], "response_too_large", "{e}");
    assert_eq!(server.executions(), 2, "{e}");
    // What is over the limit is not always the response.
    s.call(json!(3), "write", json!({"note_first": true}));
    assert_eq!(s.result(&json!(3))["content"][0]["text"], "done");
    assert_eq!(server.executions(), 3);
}

#[cfg(unix)]
#[test]
fn huge_sse_ids_neither_grow_the_proxy_nor_stall_it() {
    // Twenty notifications with ids of 2 MiB, then an id of 32 MiB that
    // two-byte comments follow until the proxy has answered a ping, then
    // the result. Ids that long are not kept (nor is the stream
    // resumable); the proxy holds none of them and reads each byte once.
    let server = Server::start(|conn, msg, server| {
        server.ran();
        conn.start_events("");
        let note = json!({"jsonrpc": "2.0", "method": "notifications/message",
            "params": {"level": "info", "data": "hi"}});
        let id = "i".repeat(2 << 20);
        for _ in 0..20 {
            if write!(conn, "id: {id}\ndata: {note}\n\n").is_err() {
                return;
            }
        }
        let chunk = "j".repeat(1 << 20);
        let _ = conn.write_all(b"id: ");
        for _ in 0..32 {
            let _ = conn.write_all(chunk.as_bytes());
        }
        let _ = conn.write_all(b"\n");
        let (mut pinged, since) = (false, std::time::Instant::now());
        while !pinged && since.elapsed() < crate::util::wait() {
            if conn.write_all(b":\n").is_err() {
                return;
            }
            pinged = server.seen().pings > 0;
        }
        let _ = write!(conn, "data: {}\n\n", result_of(msg, "done"));
    });
    let mut s = proxy(&server, "");
    s.call(json!(1), "read", json!({}));
    s.request(json!("ping"), "ping", json!({}));
    assert_eq!(s.result(&json!("ping")), json!({}));
    let result = s.result(&json!(1));
    assert_eq!(result["content"][0]["text"], "done");
    let notes = s.recv_until_quiet(crate::util::ms(100));
    let relayed = notes
        .iter()
        .filter(|m| m["method"] == "notifications/message")
        .count();
    assert_eq!(relayed, 20, "every notification, each with its own huge id");
    assert_eq!(server.executions(), 1);
    let peak = s.memory_kb("VmHWM");
    eprintln!("huge SSE ids: the proxy's peak RSS was {peak} kB");
    assert!(
        peak < 48 * 1024,
        "the proxy's peak RSS was {peak} kB after 72 MiB of event ids"
    );
}

#[test]
fn events_without_an_id_line_on_the_server_stream_all_reach_the_client() {
    // Four notifications, only the first with an `id:` line: the others
    // carry its id too (the SSE rules), and are not replays.
    let server = Server::with_get(
        |conn, req, _| {
            if req.header("last-event-id").is_some() {
                return conn.respond(405, &[], "");
            }
            conn.start_events("");
            let mut body = String::new();
            for n in 1..=4 {
                let note = json!({"jsonrpc": "2.0", "method": "notifications/message",
                    "params": {"level": "info", "data": n}});
                let id = if n == 1 { "id: g1\n" } else { "" };
                body.push_str(&format!("{id}data: {note}\n\n"));
            }
            let _ = conn.write_all(body.as_bytes());
            // Open until the client closes it: it is not opened again.
            conn.wait_for_close();
        },
        |conn, msg, server| {
            server.ran();
            let body = result_of(msg, "done");
            conn.respond(200, &[("Content-Type", "application/json")], &body);
        },
    );
    let mut s = proxy(&server, "");
    let mut got = Vec::new();
    for _ in 1..=4 {
        let note = s.recv_where("a notification", |m| m["method"] == "notifications/message");
        got.push(note["params"]["data"].clone());
    }
    assert_eq!(got, [json!(1), json!(2), json!(3), json!(4)]);
}

#[test]
fn a_resumed_answer_without_an_id_line_is_delivered_not_dropped_as_a_replay() {
    // The call's stream is cut after a progress event (e1); a GET from e1
    // replays it and then the result, which has no `id:` line of its own.
    let progress = json!({"jsonrpc": "2.0", "method": "notifications/progress",
        "params": {"progressToken": "p", "progress": 1}})
    .to_string();
    let first = progress.clone();
    let server = Server::with_get(
        move |conn, req, server| {
            if req.header("last-event-id") != Some("e1") {
                return conn.respond(405, &[], "");
            }
            conn.start_events("");
            let replay = server.seen().replay.clone();
            let _ = write!(conn, "id: e1\ndata: {progress}\n\n{replay}");
        },
        move |conn, msg, server| {
            server.ran();
            server.seen().replay = format!("data: {}\n\n", result_of(msg, "done"));
            conn.start_events("");
            let _ = write!(conn, "id: e1\ndata: {first}\n\n");
        },
    );
    let mut s = proxy(&server, "");
    s.call_with(
        json!(1),
        json!({"name": "write", "arguments": {}, "_meta": {"progressToken": "p"}}),
    );
    assert_eq!(s.result(&json!(1))["content"][0]["text"], "done");
    assert_eq!(server.executions(), 1);
}

#[test]
fn a_resumed_stream_that_keeps_going_silent_is_resumed_three_times_then_read_to_the_deadline() {
    // Every resumption brings one more progress event, then silence: the
    // call still runs (or the store has nothing more); but the second one
    // never gets its headers (an event store slow to replay), which is a
    // stall too, not a failed resumption. After three stalls the proxy
    // stops resuming and waits for the call's deadline. The one slow test
    // of resumption through the real binary (about 3 s: three stalls, here
    // 300 ms of silence instead of the proxy's 2 s, then the call's 2 s);
    // the rules are resume.rs's, on a fake clock.
    let progress = |n: usize| {
        json!({"jsonrpc": "2.0", "method": "notifications/progress",
            "params": {"progressToken": "p", "progress": n}})
    };
    let server = Server::with_get(
        move |conn, req, server| {
            let Some(from) = req.header("last-event-id") else {
                return conn.respond(405, &[], "");
            };
            let resumptions = {
                let mut seen = server.seen();
                seen.resumed_from.push(from.to_owned());
                seen.resumed_from.len()
            };
            if resumptions == 2 {
                // No headers until the client closes it.
                return conn.wait_for_close();
            }
            let n = from.trim_start_matches('e').parse::<usize>().unwrap_or(0) + 1;
            conn.start_events("");
            let _ = write!(conn, "id: e{n}\ndata: {}\n\n", progress(n));
            // Silent until the client closes it.
            conn.wait_for_close();
        },
        move |conn, _, server| {
            server.ran();
            conn.start_events("");
            let _ = write!(conn, "retry: 10\nid: e1\ndata: {}\n\n", progress(1));
        },
    );
    // Each progress event gives the call its timeout again: longer than
    // two stalls (with the proxy's own 2 s where they cannot be shortened).
    let call_timeout = match crate::util::SHORTENS {
        true => "call_timeout: 2",
        false => "call_timeout: 5",
    };
    let mut s =
        started(proxy_of(&server, call_timeout).shorten("stall_min", Duration::from_millis(300)));
    s.call_with(
        json!(1),
        json!({"name": "write", "arguments": {}, "_meta": {"progressToken": "p"}}),
    );
    let e = s.error(&json!(1));
    let message = e["message"].as_str().unwrap_or("");
    assert!(message.contains("timed out"), "{e}");
    assert_eq!(server.executions(), 1);
    // The first resumption after the cut, then one after each of three
    // stalls (the second without headers, so from e2 again); the last one
    // was read until the call's deadline.
    assert_eq!(server.seen().resumed_from, ["e1", "e2", "e2", "e3"]);
}
