//! A scripted Streamable HTTP MCP server for the tests: a handler on the
//! loopback server (`loopback.rs`), one request per connection,
//! `Connection: close` on every answer, JSON or SSE.
//!
//! It keeps a session (`Mcp-Session-Id`, checked with the negotiated
//! `MCP-Protocol-Version` on every later request), two tools (`read`,
//! annotated read-only, and `write`, not annotated), counts what it
//! executed and plays [`Fault`]s, one per `tools/call`, in order. A request
//! naming its protocol version in `_meta` is served the 2026-07-28 way: no
//! session, its `MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name` and
//! `Mcp-Param-Region` headers checked against the body (400 -32020 when
//! they differ), three more tools (`locate`, whose `region` argument is
//! marked `x-mcp-header: Region`, `place`, whose string, integer, boolean
//! and nested arguments are marked too ([`PLACE_HEADERS`]), and `broken`,
//! whose annotation is invalid), 404 -32601 for `ping` and, for `prompts/get`, a 400 -32602
//! quoting the `Authorization` header. Knows nothing of mcp-retry.

use std::collections::VecDeque;
use std::io::Write;
use std::net::TcpStream;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::loopback::{Conn, HttpRequest, Loopback, Options};

/// What the server does with one `tools/call`.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Runs the tool, then closes the connection without answering.
    RunThenCut,
    /// Answers this status (without running the tool); `Retry-After` if
    /// given; the body is a JSON-RPC error with this message.
    Status(u16, Option<&'static str>, &'static str),
    /// Answers this status with this body as it is (JSON), without
    /// running the tool.
    Body(u16, &'static str),
    /// Runs the tool, then answers this status with a JSON-RPC error body
    /// with this message (a gateway that failed after the work was done).
    RunThenStatus(u16, &'static str),
    /// Forgets the session and answers 404, without running the tool.
    LoseSession,
    /// Never answers; counts in `hung_closed` when the client closes the
    /// connection.
    Hang,
    /// Runs the tool, sends a progress event with an id, then closes the
    /// stream; a GET with that id as `Last-Event-ID` replays the progress
    /// and then the result.
    RunThenCutAfterProgress,
    /// Runs the tool, sends a progress event (id `e1`), then the start of
    /// the result's event (id `e2`) and closes the stream inside it; a GET
    /// with `e1` as `Last-Event-ID` replays the result.
    RunThenCutInsideResult,
    /// Runs the tool, sends a progress event (id `e1`) and closes the
    /// stream. A GET with `e1` as `Last-Event-ID` gets a second progress
    /// event (`e2`), then nothing, until the client closes it; one with
    /// `e2` gets the result.
    RunThenCutThenStall,
    /// As `RunThenCutAfterProgress`, but the first five GETs resuming
    /// from `e1` only say `retry` and end (SEP-1699 polling, the call still
    /// running); the next one replays the result.
    RunThenCutThenPoll,
    /// Answers 200 with this JSON body (not a response to the call),
    /// without running the tool.
    Json(&'static str),
    /// Waits until [`Server::release`], then forgets the session and
    /// answers 404, without running the tool.
    HeldThenLoseSession,
    /// Answers the call with a JSON-RPC error quoting the `X-Api-Key` it
    /// came with, without running the tool (an upstream that repeats the
    /// key it rejects; for the `headers_helper` tests, which need sh).
    #[cfg(unix)]
    EchoApiKey,
    /// For a POST with a body over 1 MB: reads its head only, then closes
    /// the connection (a reset, as the body is left unread), so the client
    /// cannot write it all.
    DropBeforeBody,
}

#[derive(Default)]
pub struct State {
    pub initializes: usize,
    session: Option<String>,
    version: Option<String>,
    pub executions: Vec<String>,
    /// When each `tools/call` POST arrived, and its id.
    pub calls_at: Vec<Instant>,
    pub call_ids: Vec<Value>,
    pub faults: VecDeque<Fault>,
    /// Every value of the Authorization header received.
    pub authorizations: Vec<String>,
    /// Every value of the X-Api-Key header received.
    pub api_keys: Vec<String>,
    /// `tools/list` is answered with a JSON-RPC error quoting the last
    /// `X-Api-Key`.
    echo_api_key_on_list: bool,
    /// Session ids sent with DELETE (and the negotiated version).
    pub deleted: Vec<String>,
    /// Requests refused because the session or version header was wrong.
    pub bad_headers: usize,
    /// Connections of `Fault::Hang` the client closed.
    pub hung_closed: usize,
    /// The stream a `Last-Event-ID` of `e1` replays.
    replay: Option<String>,
    /// For `Fault::RunThenCutThenStall`: what a `Last-Event-ID` of `e1`
    /// replays before the stream goes silent, and what one of `e2` then
    /// replays (the result).
    stalling_replay: Option<(String, String)>,
    /// Resumed streams that went silent and were closed by the client.
    pub stalls_closed: usize,
    /// For `Fault::RunThenCutThenPoll`: GETs resuming from `e1` that are
    /// closed at once (only `retry`) before the result is replayed.
    polls_left: usize,
    /// `Last-Event-ID`s received.
    pub resumed_from: Vec<String>,
    /// The open GET streams of the current session.
    pub streams: Vec<TcpStream>,
    /// Notifications POSTed to it (method and params).
    pub notified: Vec<Value>,
    /// What happened, in order, where order matters ("cancelled": a
    /// `notifications/cancelled` arrived; "hung closed": the client closed
    /// the connection of a `Fault::Hang`).
    pub events: Vec<&'static str>,
    /// Every 2026-07-28 POST: its headers and body.
    pub modern_posts: Vec<(Vec<(String, String)>, Value)>,
    /// 2026-07-28 POSTs refused with -32020.
    pub mismatches: usize,
    /// Requests dropped by `Fault::DropBeforeBody`.
    pub dropped_bodies: usize,
    /// Statuses the next GETs (of either kind) are answered with.
    pub get_statuses: VecDeque<u16>,
    /// Statuses the next `initialize` POSTs are answered with.
    pub initialize_statuses: VecDeque<u16>,
    /// `initialize` POSTs answered with one of `initialize_statuses`.
    pub refused_initializes: usize,
    /// Notifications are taken (recorded) but never answered.
    hang_notifications: bool,
    /// How long a notification waits for its 202.
    ack_delay: Option<Duration>,
    /// The method of every POST served, in the order they were read.
    pub methods: Vec<String>,
    /// `Fault::HeldThenLoseSession` may answer.
    released: bool,
    /// A stateless 2025-era server: `initialize` sets no session, and
    /// later requests are checked for the version header only.
    stateless: bool,
}

pub struct Server {
    http: Loopback,
    state: Arc<(Mutex<State>, Condvar)>,
}

impl Server {
    pub fn start() -> Server {
        let state = Arc::new((Mutex::new(State::default()), Condvar::new()));
        let (heads, requests) = (state.clone(), state.clone());
        let options = Options {
            before_body: Some(Box::new(move |head| !drops_body(head, &heads))),
            ..Options::default()
        };
        let http = Loopback::with(options, move |req, conn| handle(&req, conn, &requests));
        Server { http, state }
    }

    pub fn url(&self) -> String {
        self.http.url("/mcp")
    }

    /// Closes the port: when this returns, connections are refused until
    /// [`Server::reopen`].
    pub fn close(&self) {
        self.http.close();
    }

    /// Listens on the same port again.
    pub fn reopen(&self) {
        self.http.reopen();
    }

    /// Serves the 2025 era without sessions from now on.
    pub fn stateless(&self) {
        self.state.0.lock().unwrap().stateless = true;
    }

    /// Answers the next GET (the server's stream or a resumption) with
    /// `status` (for the `headers_helper` tests, which need sh).
    #[cfg(unix)]
    pub fn refuse_get(&self, status: u16) {
        self.state.0.lock().unwrap().get_statuses.push_back(status);
    }

    /// From now on answers `tools/list` with an error quoting the last
    /// `X-Api-Key` received.
    #[cfg(unix)]
    pub fn echo_api_key_on_list(&self) {
        self.state.0.lock().unwrap().echo_api_key_on_list = true;
    }

    /// Answers the next `initialize` with `status`.
    pub fn refuse_initialize(&self, status: u16) {
        self.state
            .0
            .lock()
            .unwrap()
            .initialize_statuses
            .push_back(status);
    }

    /// From now on, records notifications and never answers them.
    /// Acknowledges each notification only after `d`.
    pub fn delay_acks(&self, d: Duration) {
        self.state.0.lock().unwrap().ack_delay = Some(d);
    }

    pub fn hang_notifications(&self) {
        self.state.0.lock().unwrap().hang_notifications = true;
    }

    /// Lets a `Fault::HeldThenLoseSession` answer.
    pub fn release(&self) {
        self.state.0.lock().unwrap().released = true;
        self.state.1.notify_all();
    }

    pub fn fault(&self, f: Fault) {
        self.state.0.lock().unwrap().faults.push_back(f);
    }

    pub fn with<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        f(&self.state.0.lock().unwrap())
    }

    /// Sends `message` on every open GET stream.
    pub fn push(&self, message: &Value) {
        let event = format!("id: g1\ndata: {message}\n\n");
        for mut stream in &self.state.0.lock().unwrap().streams {
            stream.write_all(event.as_bytes()).unwrap();
        }
    }

    pub fn executions(&self, tool: &str) -> usize {
        self.with(|s| s.executions.iter().filter(|t| *t == tool).count())
    }
}

/// Whether a `Fault::DropBeforeBody` takes this request (a POST with a
/// body over 1 MB), its body to be left unread.
fn drops_body(head: &HttpRequest, state: &(Mutex<State>, Condvar)) -> bool {
    if head.content_length() <= 1_000_000 {
        return false;
    }
    let mut s = state.0.lock().unwrap();
    if !matches!(s.faults.front(), Some(Fault::DropBeforeBody)) {
        return false;
    }
    s.faults.pop_front();
    s.dropped_bodies += 1;
    state.1.notify_all();
    true
}

/// A JSON-RPC error answering `id` that quotes the last `X-Api-Key`.
fn echo_api_key(s: &State, id: &Value) -> String {
    let key = s.api_keys.last().map_or("", String::as_str);
    json!({"jsonrpc": "2.0", "id": id,
        "error": {"code": -32010, "message": format!("upstream rejected key {key}")}})
    .to_string()
}

fn error_body(message: &str) -> String {
    json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32000, "message": message}}).to_string()
}

fn handle(req: &HttpRequest, conn: &mut Conn, state: &(Mutex<State>, Condvar)) {
    let (lock, cv) = state;
    let mut s = lock.lock().unwrap();
    if let Some(auth) = req.header("authorization") {
        s.authorizations.push(auth.to_owned());
    }
    if let Some(key) = req.header("x-api-key") {
        s.api_keys.push(key.to_owned());
    }
    cv.notify_all();
    match req.method() {
        "DELETE" => {
            if req.header("mcp-protocol-version") != s.version.as_deref() {
                s.bad_headers += 1;
                cv.notify_all();
                return conn.respond(400, &[], &error_body("Bad Request: no version"));
            }
            let id = req.header("mcp-session-id").unwrap_or("").to_owned();
            s.deleted.push(id);
            cv.notify_all();
            return conn.respond(200, &[], "");
        }
        "POST" => {}
        "GET" if !s.get_statuses.is_empty() => {
            let status = s.get_statuses.pop_front().unwrap_or(500);
            return conn.respond(status, &[], &error_body("refused"));
        }
        "GET" if req.header("last-event-id").is_some() => {
            let from = req.header("last-event-id").unwrap_or("").to_owned();
            s.resumed_from.push(from.clone());
            cv.notify_all();
            if s.polls_left > 0 && from == "e1" {
                // The call still runs: come back after `retry`.
                s.polls_left -= 1;
                return conn.respond(
                    200,
                    &[("Content-Type", "text/event-stream")],
                    "retry: 10\n\n",
                );
            }
            if let (Some((first, _)), "e1") = (&s.stalling_replay, from.as_str()) {
                // What is stored so far, then nothing: the call still runs.
                conn.start_events(first);
                drop(s);
                conn.wait_for_close();
                let mut s = lock.lock().unwrap();
                s.stalls_closed += 1;
                cv.notify_all();
                return;
            }
            if let (Some((_, rest)), "e2") = (&s.stalling_replay, from.as_str()) {
                let rest = rest.clone();
                return conn.respond(200, &[("Content-Type", "text/event-stream")], &rest);
            }
            return match (&s.replay, from.as_str()) {
                (Some(replay), "e1") => {
                    conn.respond(200, &[("Content-Type", "text/event-stream")], replay)
                }
                _ => conn.respond(404, &[], ""),
            };
        }
        "GET" if s.session.is_some() && req.header("mcp-session-id") == s.session.as_deref() => {
            if conn.start_events("") {
                s.streams.push(conn.keep());
            }
            return;
        }
        _ => return conn.respond(405, &[], ""),
    }
    let msg: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
    let method = msg["method"].as_str().unwrap_or("").to_owned();
    let id = msg["id"].clone();
    if let Some(version) = msg["params"]["_meta"][MODERN_KEY].as_str() {
        s.modern_posts.push((req.headers.clone(), msg.clone()));
        cv.notify_all();
        if let Err(why) = modern_headers_match(req, &msg, version) {
            s.mismatches += 1;
            let body = json!({"jsonrpc": "2.0", "id": id,
                "error": {"code": -32020, "message": why}});
            return conn.respond(400, &[], &body.to_string());
        }
        if method == "prompts/get" {
            // A server quoting a header back in its error.
            let auth = req.header("authorization").unwrap_or("");
            let body = json!({"jsonrpc": "2.0", "id": id,
                "error": {"code": -32602, "message": format!("no prompt for {auth}")}});
            return conn.respond(400, &[], &body.to_string());
        }
        return serve(conn, lock, cv, s, &msg, true);
    }
    if method == "initialize" {
        if let Some(status) = s.initialize_statuses.pop_front() {
            s.refused_initializes += 1;
            cv.notify_all();
            return conn.respond(status, &[], &error_body("starting up"));
        }
        s.initializes += 1;
        let session = format!("s{}", s.initializes);
        s.session = Some(session.clone());
        let version = msg["params"]["protocolVersion"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        s.version = Some(version.clone());
        cv.notify_all();
        let result = json!({"jsonrpc": "2.0", "id": id, "result": {
            "protocolVersion": version, "capabilities": {"tools": {}},
            "serverInfo": {"name": "http-test", "version": "1"}}});
        let mut headers = vec![("Content-Type", "application/json")];
        if !s.stateless {
            headers.push(("Mcp-Session-Id", &session));
        }
        return conn.respond(200, &headers, &result.to_string());
    }
    let session_ok = s.stateless && req.header("mcp-session-id").is_none()
        || req.header("mcp-session-id").is_some()
            && req.header("mcp-session-id") == s.session.as_deref();
    if !session_ok && req.header("mcp-session-id").is_some() {
        return conn.respond(404, &[], &error_body("Session not found"));
    }
    if !session_ok || req.header("mcp-protocol-version") != s.version.as_deref() {
        s.bad_headers += 1;
        return conn.respond(
            400,
            &[],
            &error_body("Bad Request: missing session or version"),
        );
    }
    serve(conn, lock, cv, s, &msg, false)
}

/// The `_meta` member of a 2026-07-28 request naming its version.
pub const MODERN_KEY: &str = "io.modelcontextprotocol/protocolVersion";

/// The arguments of tool `place` marked `x-mcp-header`, and their headers.
pub const PLACE_HEADERS: [(&[&str], &str); 5] = [
    (&["region"], "mcp-param-region"),
    (&["count"], "mcp-param-count"),
    (&["dry"], "mcp-param-dry"),
    (&["note"], "mcp-param-note"),
    (&["opts", "zone"], "mcp-param-zone"),
];

/// Whether a 2026-07-28 request's headers say what its body says.
fn modern_headers_match(req: &HttpRequest, msg: &Value, version: &str) -> Result<(), String> {
    let want = |name: &str, value: Option<&str>| {
        if req.header(name) == value {
            Ok(())
        } else {
            Err(format!(
                "{name} is {:?}, expected {value:?}",
                req.header(name)
            ))
        }
    };
    want("mcp-session-id", None)?;
    want("mcp-protocol-version", Some(version))?;
    want("mcp-method", msg["method"].as_str())?;
    if msg["method"] == "tools/call" {
        want("mcp-name", msg["params"]["name"].as_str())?;
        if msg["params"]["name"] == "place" {
            for (path, header) in PLACE_HEADERS {
                let value = path.iter().fold(&msg["params"]["arguments"], |v, k| &v[*k]);
                let text = match value {
                    Value::String(s) => Some(s.clone()),
                    Value::Number(_) | Value::Bool(_) => Some(value.to_string()),
                    _ => None,
                };
                want(header, text.as_deref())?;
            }
        }
        if msg["params"]["name"] == "locate" {
            let region = &msg["params"]["arguments"]["region"];
            if region.is_null() != req.header("mcp-param-region").is_none() {
                return Err("Mcp-Param-Region does not match the region argument".into());
            }
        }
    }
    Ok(())
}

/// Serves a request or notification whose headers were accepted.
fn serve(
    conn: &mut Conn,
    lock: &Mutex<State>,
    cv: &Condvar,
    mut s: std::sync::MutexGuard<'_, State>,
    msg: &Value,
    modern: bool,
) {
    let method = msg["method"].as_str().unwrap_or("").to_owned();
    s.methods.push(method.clone());
    let id = msg["id"].clone();
    if id.is_null() || msg.get("method").is_none() {
        // A notification or a response.
        if msg.get("method").is_some() {
            s.notified
                .push(json!({"method": method, "params": msg["params"]}));
            if method == "notifications/cancelled" {
                s.events.push("cancelled");
            }
            cv.notify_all();
        }
        if s.hang_notifications {
            drop(s);
            conn.wait_for_close();
            return;
        }
        if let Some(d) = s.ack_delay {
            drop(s);
            std::thread::sleep(d);
        }
        return conn.respond(202, &[], "");
    }
    match method.as_str() {
        "ping" if modern => {
            let body = json!({"jsonrpc": "2.0", "id": id,
                "error": {"code": -32601, "message": "Method not found", "data": "ping"}});
            conn.respond(
                404,
                &[("Content-Type", "application/json")],
                &body.to_string(),
            )
        }
        "tools/list" if s.echo_api_key_on_list => conn.respond(
            200,
            &[("Content-Type", "application/json")],
            &echo_api_key(&s, &id),
        ),
        "tools/list" => {
            let mut tools = json!([
                {"name": "read", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": true}},
                {"name": "write", "inputSchema": {"type": "object"}}
            ]);
            if modern {
                let more = tools.as_array_mut().unwrap();
                more.push(json!({"name": "locate", "inputSchema": {"type": "object",
                    "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}}}));
                more.push(json!({"name": "place", "inputSchema": {"type": "object",
                    "properties": {
                        "region": {"type": "string", "x-mcp-header": "Region"},
                        "count": {"type": "integer", "x-mcp-header": "Count"},
                        "dry": {"type": "boolean", "x-mcp-header": "Dry"},
                        "note": {"type": "string", "x-mcp-header": "Note"},
                        "opts": {"type": "object", "properties": {
                            "zone": {"type": "string", "x-mcp-header": "Zone"}}}}}}));
                more.push(json!({"name": "broken", "inputSchema": {"type": "object",
                    "properties": {"x": {"type": "number", "x-mcp-header": "X"}}}}));
            }
            let answer = json!({"jsonrpc": "2.0", "id": id, "result": {"tools": tools}});
            conn.respond(
                200,
                &[("Content-Type", "application/json")],
                &answer.to_string(),
            )
        }
        "tools/call" => {
            s.calls_at.push(Instant::now());
            s.call_ids.push(id.clone());
            let tool = msg["params"]["name"].as_str().unwrap_or("").to_owned();
            let fault = s.faults.pop_front();
            cv.notify_all();
            match fault {
                Some(Fault::RunThenCut) => {
                    s.executions.push(tool);
                    cv.notify_all();
                    conn.cut();
                }
                Some(Fault::Body(status, body)) => {
                    let headers = vec![("Content-Type", "application/json")];
                    conn.respond(status, &headers, body);
                }
                Some(Fault::RunThenStatus(status, message)) => {
                    s.executions.push(tool);
                    cv.notify_all();
                    let headers = vec![("Content-Type", "application/json")];
                    conn.respond(status, &headers, &error_body(message));
                }
                Some(Fault::Status(status, retry_after, message)) => {
                    let mut headers = vec![("Content-Type", "application/json")];
                    if let Some(ra) = retry_after {
                        headers.push(("Retry-After", ra));
                    }
                    conn.respond(status, &headers, &error_body(message));
                }
                Some(Fault::RunThenCutAfterProgress | Fault::RunThenCutThenPoll) => {
                    if matches!(fault, Some(Fault::RunThenCutThenPoll)) {
                        s.polls_left = 5;
                    }
                    s.executions.push(tool.clone());
                    let progress = json!({"jsonrpc": "2.0", "method": "notifications/progress",
                        "params": {"progressToken": msg["params"]["_meta"]["progressToken"], "progress": 1}});
                    let result = json!({"jsonrpc": "2.0", "id": id, "result": {
                        "content": [{"type": "text", "text": format!("{tool} done")}]}});
                    s.replay = Some(format!(
                        "retry: 10\nid: e1\ndata: {progress}\n\nid: e2\ndata: {result}\n\n"
                    ));
                    cv.notify_all();
                    let body =
                        format!("id: prime\ndata:\n\nretry: 10\nid: e1\ndata: {progress}\n\n");
                    conn.start_events(&body);
                    conn.cut();
                }
                #[cfg(unix)]
                Some(Fault::EchoApiKey) => conn.respond(
                    200,
                    &[("Content-Type", "application/json")],
                    &echo_api_key(&s, &id),
                ),
                Some(Fault::Json(body)) => {
                    conn.respond(200, &[("Content-Type", "application/json")], body)
                }
                Some(Fault::RunThenCutThenStall) => {
                    s.executions.push(tool.clone());
                    let progress = |n: u32| {
                        json!({"jsonrpc": "2.0", "method": "notifications/progress",
                            "params": {"progressToken": msg["params"]["_meta"]["progressToken"], "progress": n}})
                    };
                    let result = json!({"jsonrpc": "2.0", "id": id, "result": {
                        "content": [{"type": "text", "text": format!("{tool} done")}]}});
                    s.stalling_replay = Some((
                        format!("id: e2\ndata: {}\n\n", progress(2)),
                        format!("id: e3\ndata: {result}\n\n"),
                    ));
                    cv.notify_all();
                    let body = format!("retry: 10\nid: e1\ndata: {}\n\n", progress(1));
                    conn.start_events(&body);
                    conn.cut();
                }
                Some(Fault::RunThenCutInsideResult) => {
                    s.executions.push(tool.clone());
                    let progress = json!({"jsonrpc": "2.0", "method": "notifications/progress",
                        "params": {"progressToken": msg["params"]["_meta"]["progressToken"], "progress": 1}});
                    let result = json!({"jsonrpc": "2.0", "id": id, "result": {
                        "content": [{"type": "text", "text": format!("{tool} done")}]}})
                    .to_string();
                    s.replay = Some(format!("id: e2\ndata: {result}\n\n"));
                    cv.notify_all();
                    let cut = &result[..result.len() / 2];
                    let body =
                        format!("retry: 10\nid: e1\ndata: {progress}\n\nid: e2\ndata: {cut}");
                    conn.start_events(&body);
                    conn.cut();
                }
                Some(Fault::Hang) => {
                    drop(s);
                    conn.wait_for_close();
                    let mut s = lock.lock().unwrap();
                    s.hung_closed += 1;
                    s.events.push("hung closed");
                    cv.notify_all();
                }
                Some(Fault::HeldThenLoseSession) => {
                    let mut s = cv.wait_while(s, |s| !s.released).unwrap();
                    s.session = None;
                    conn.respond(404, &[], &error_body("Session not found"));
                }
                Some(Fault::LoseSession) => {
                    s.session = None;
                    conn.respond(404, &[], &error_body("Session not found"));
                }
                // DropBeforeBody applies to big requests only (read_request).
                None | Some(Fault::DropBeforeBody) => {
                    s.executions.push(tool.clone());
                    cv.notify_all();
                    drop(s);
                    // Answered as SSE: progress first (when asked for), then
                    // the result, as a server streaming a call does.
                    let mut body = String::new();
                    body.push_str(": keep-alive\r\n\r\nid: prime\r\ndata:\r\n\r\n");
                    if let Some(token) = msg["params"]["_meta"]["progressToken"].as_str() {
                        let progress = json!({"jsonrpc": "2.0", "method": "notifications/progress",
                            "params": {"progressToken": token, "progress": 1}});
                        body.push_str(&format!(
                            "event: message\r\nid: e1\r\ndata: {progress}\r\n\r\n"
                        ));
                    }
                    let result = json!({"jsonrpc": "2.0", "id": id, "result": {
                        "content": [{"type": "text", "text": format!("{tool} done")}]}});
                    body.push_str(&format!("id: e2\ndata: {result}\n\n"));
                    conn.respond(200, &[("Content-Type", "text/event-stream")], &body)
                }
            }
        }
        _ => {
            let answer = json!({"jsonrpc": "2.0", "id": id, "result": {}});
            conn.respond(
                200,
                &[("Content-Type", "application/json")],
                &answer.to_string(),
            )
        }
    }
}
