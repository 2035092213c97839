//! In-process tests of the dispatcher: events go in through `handle_event`,
//! and what it writes to the client and to a fake server comes out of
//! channels. No threads, no processes, and a fake clock: time moves only
//! when a test moves it, so schedules (backoff, TTLs, cooldowns, restart
//! backoff) are checked to the millisecond in no wall time.

#![forbid(unsafe_code)]

use std::cmp::Reverse;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use serde_json::{json, Value};

use super::{Dispatcher, Event};
use crate::config::ServerConfig;
use crate::downstream::{Downstream, Outgoing, ServerEvent};
use crate::jsonrpc;
use crate::stdio::Outbox;

struct FakeServer {
    sent: Sender<Vec<u8>>,
}

impl Downstream for FakeServer {
    fn send(&mut self, out: Outgoing) -> bool {
        // What the dispatcher says a line is, is what it is: its kind,
        // and a 2026-07-28 request's version, name and envelope.
        let text = String::from_utf8_lossy(&out.bytes);
        let expected = tagged(&text);
        assert_eq!(out.clone().in_era(None), expected, "{text}");
        let modern = out.modern().map(|m| {
            let envelope: Value = serde_json::from_str(&m.envelope).unwrap();
            (m.version.clone(), m.name.clone(), envelope)
        });
        assert_eq!(modern, modern_of(&text), "{text}");
        self.sent.send(out.bytes).is_ok()
    }
    fn shutdown(&mut self, _step: Duration) {}
    fn kill(&mut self) {}
    fn describe(&self) -> String {
        "fake".into()
    }
    fn diagnostics(&self) -> Vec<String> {
        vec![]
    }
}

struct Harness {
    d: Dispatcher,
    client: Receiver<crate::stdio::Queued>,
    server: Receiver<Vec<u8>>,
    now: Instant,
    /// When each start of the server was asked for (fake time).
    starts: Arc<Mutex<Vec<Instant>>>,
    /// Starts that fail, in order, before they succeed again.
    failing_starts: Arc<Mutex<VecDeque<bool>>>,
    /// Failed starts need fixing (waiting does not heal them).
    fix: Arc<Mutex<bool>>,
    /// The fake time the connector sees.
    clock: Arc<Mutex<Instant>>,
}

impl Harness {
    fn new() -> Harness {
        Harness::with(ServerConfig::with_defaults("t", "fake".into(), vec![]))
    }

    /// A dispatcher for `cfg`, with a seeded RNG and a fake clock.
    fn with(cfg: ServerConfig) -> Harness {
        let (to_client, client) = Outbox::to_channel();
        let (events, _inbox) = crossbeam_channel::unbounded();
        let (sent, server) = crossbeam_channel::unbounded();
        let now = Instant::now();
        let starts = Arc::new(Mutex::new(Vec::new()));
        let failing_starts: Arc<Mutex<VecDeque<bool>>> = Arc::default();
        let clock = Arc::new(Mutex::new(now));
        let fix = Arc::new(Mutex::new(false));
        let (log, fail, at, needs_fix) = (
            starts.clone(),
            failing_starts.clone(),
            clock.clone(),
            fix.clone(),
        );
        let connect = Box::new(move |_: &ServerConfig, _: u64, _: Sender<Event>| {
            log.lock().unwrap().push(*at.lock().unwrap());
            if fail.lock().unwrap().pop_front() == Some(true) {
                return Err(crate::downstream::StartError {
                    message: "cannot start \"fake\": the start failed".to_string(),
                    heal: match *needs_fix.lock().unwrap() {
                        true => crate::downstream::Heal::Fix,
                        false => crate::downstream::Heal::Wait,
                    },
                });
            }
            Ok(Box::new(FakeServer { sent: sent.clone() }) as Box<dyn Downstream>)
        });
        let mut d = Dispatcher::new(cfg, to_client, events, connect).with_seed(7);
        d.start_server(now);
        Harness {
            d,
            client,
            server,
            now,
            starts,
            failing_starts,
            fix,
            clock,
        }
    }

    /// Moves the fake clock to `at` and fires what is due.
    fn at(&mut self, at: Instant) {
        self.now = at;
        *self.clock.lock().unwrap() = at;
        self.d.fire_timers(at);
    }

    /// Moves the fake clock by `d` and fires what is due.
    fn advance(&mut self, d: Duration) {
        let at = self.now + d;
        self.at(at);
    }

    /// When the earliest timer is due.
    fn next_timer(&self) -> Instant {
        let Reverse(t) = self.d.timers.peek().expect("a timer");
        t.at
    }

    /// Moves the fake clock to the earliest timer and fires it.
    fn fire_next_timer(&mut self) -> Instant {
        let at = self.next_timer();
        self.at(at);
        at
    }

    fn try_to_server(&self) -> Option<String> {
        let line = self.server.try_recv().ok()?;
        Some(String::from_utf8(line).unwrap().trim_end().to_owned())
    }

    fn client_sends(&mut self, line: &str) {
        // Read as the client's reader thread reads it.
        let inbound = crate::inbound::Inbound::of_line(line.as_bytes().to_vec());
        self.d.handle_event(Event::Client(inbound), self.now);
    }

    fn server_sends(&mut self, line: &str) {
        self.server_event(ServerEvent::Message(jsonrpc::classify(line.to_owned())));
    }

    fn server_event(&mut self, event: ServerEvent) {
        let generation = self.d.link.generation();
        self.d
            .handle_event(Event::Server { generation, event }, self.now);
    }

    fn to_server(&self) -> String {
        let line = self.server.try_recv().expect("a line for the server");
        String::from_utf8(line).unwrap().trim_end().to_owned()
    }

    fn to_client(&self) -> String {
        let line = self.client.try_recv().expect("a line for the client").bytes;
        String::from_utf8(line).unwrap().trim_end().to_owned()
    }

    fn nothing_sent(&self) {
        assert!(
            self.server.try_recv().is_err(),
            "unexpected line to the server"
        );
        assert!(
            self.client.try_recv().is_err(),
            "unexpected line to the client"
        );
    }
}

/// `line` with what it is, read from it: the tag the dispatcher must give it.
fn tagged(line: &str) -> Outgoing {
    let v: Value = serde_json::from_str(line).unwrap();
    let bytes = format!("{}\n", line.trim_end()).into_bytes();
    let method = v["method"].as_str();
    match (v["id"].as_u64(), method) {
        (Some(id), Some(m)) => Outgoing::request(id, m, bytes),
        (None, Some("notifications/cancelled")) => {
            Outgoing::cancel(v["params"]["requestId"].as_u64().unwrap(), bytes)
        }
        (None, Some(m)) => Outgoing::notification(m, bytes),
        _ => Outgoing::response(bytes),
    }
}

/// A request line's 2026-07-28 version, `Mcp-Name` and envelope, read
/// from it.
fn modern_of(line: &str) -> Option<(String, Option<String>, Value)> {
    let v: Value = serde_json::from_str(line).unwrap();
    v.get("id")?;
    let meta = v["params"]["_meta"].as_object()?;
    let version = meta.get(crate::mcp::VERSION_KEY)?.as_str()?.to_owned();
    let key = match v["method"].as_str() {
        Some("tools/call" | "prompts/get") => "name",
        Some("resources/read") => "uri",
        _ => "",
    };
    let name = v["params"][key].as_str().map(str::to_owned);
    let envelope = meta
        .iter()
        .filter(|(k, _)| k.starts_with("io.modelcontextprotocol/"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Some((version, name, Value::Object(envelope)))
}

fn id_of(line: &str) -> Value {
    serde_json::from_str::<Value>(line).unwrap()["id"].clone()
}

#[test]
fn requests_get_fresh_ids_and_answers_get_the_clients_id_back() {
    let mut h = Harness::new();
    h.client_sends(r#"{"jsonrpc":"2.0","id":"7","method":"ping"}"#);
    h.client_sends(r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#);
    let a = h.to_server();
    let b = h.to_server();
    assert_ne!(id_of(&a), id_of(&b));
    assert!(id_of(&a).is_u64() && id_of(&b).is_u64());
    // Answered out of order.
    h.server_sends(&format!(
        r#"{{"jsonrpc":"2.0","id":{},"result":{{"n":2}}}}"#,
        id_of(&b)
    ));
    h.server_sends(&format!(
        r#"{{"jsonrpc":"2.0","id":{},"result":{{"n":1}}}}"#,
        id_of(&a)
    ));
    assert_eq!(
        h.to_client(),
        r#"{"jsonrpc":"2.0","id":7,"result":{"n":2}}"#
    );
    assert_eq!(
        h.to_client(),
        r#"{"jsonrpc":"2.0","id":"7","result":{"n":1}}"#
    );
    h.nothing_sent();
}

#[test]
fn a_response_with_an_unknown_id_is_dropped() {
    let mut h = Harness::new();
    h.server_sends(r#"{"jsonrpc":"2.0","id":999,"result":{}}"#);
    h.server_sends(r#"{"jsonrpc":"2.0","id":"x","result":{}}"#);
    h.nothing_sent();
}

#[test]
fn server_requests_are_renumbered_and_answers_restored() {
    let mut h = Harness::new();
    h.server_sends(r#"{"jsonrpc":"2.0","id":0,"method":"roots/list"}"#);
    let req = h.to_client();
    let ours = id_of(&req);
    assert!(req.ends_with(r#""method":"roots/list"}"#), "{req}");
    h.client_sends(&format!(
        r#"{{"jsonrpc":"2.0","id":{ours},"result":{{"roots":[]}}}}"#
    ));
    assert_eq!(
        h.to_server(),
        r#"{"jsonrpc":"2.0","id":0,"result":{"roots":[]}}"#
    );
    // A second answer to the same request is dropped.
    h.client_sends(&format!(r#"{{"jsonrpc":"2.0","id":{ours},"result":{{}}}}"#));
    h.nothing_sent();
}

#[test]
fn the_servers_cancel_of_its_own_request_is_renumbered() {
    let mut h = Harness::new();
    h.server_sends(r#"{"jsonrpc":"2.0","id":"s1","method":"sampling/createMessage","params":{}}"#);
    let ours = id_of(&h.to_client());
    h.server_sends(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"s1","reason":"r"}}"#);
    assert_eq!(
        h.to_client(),
        format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{ours},"reason":"r"}}}}"#
        )
    );
}

#[test]
fn a_client_cancel_is_rewritten_and_the_late_answer_dropped() {
    let mut h = Harness::new();
    h.client_sends(r#"{"jsonrpc":"2.0","id":"a","method":"resources/read","params":{"uri":"x"}}"#);
    let down = id_of(&h.to_server());
    h.client_sends(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"a","reason":"bored"}}"#);
    assert_eq!(
        h.to_server(),
        format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{down},"reason":"bored"}}}}"#
        )
    );
    h.server_sends(&format!(r#"{{"jsonrpc":"2.0","id":{down},"result":{{}}}}"#));
    h.nothing_sent();
}

#[test]
fn duplicate_in_flight_ids_are_refused() {
    let mut h = Harness::new();
    h.client_sends(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#);
    h.to_server();
    h.client_sends(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#);
    let e: Value = serde_json::from_str(&h.to_client()).unwrap();
    assert_eq!(e["id"], json!(1));
    assert_eq!(e["error"]["code"], json!(-32600));
    h.nothing_sent();
}

/// The ids a panic would answer: every request until its answer is on
/// its way to the client (for a batch, until the whole array is) or the
/// client cancelled it.
#[test]
fn the_requests_not_yet_answered_are_kept_outside_the_dispatcher() {
    let mut h = Harness::new();
    let pending = h.d.pending();
    h.client_sends(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-03-26"}}"#);
    h.client_sends(r#"{"jsonrpc":"2.0","id":"a","method":"ping"}"#);
    h.client_sends(r#"{"jsonrpc":"2.0","id":2,"method":"resources/read","params":{"uri":"x"}}"#);
    h.client_sends(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#);
    assert_eq!(pending.ids(), ["\"a\"", "0", "2"]);
    let (init, ping) = (id_of(&h.to_server()), id_of(&h.to_server()));
    h.to_server();
    h.server_sends(&format!(
        r#"{{"jsonrpc":"2.0","id":{init},"result":{{"protocolVersion":"2025-03-26"}}}}"#
    ));
    h.server_sends(&format!(r#"{{"jsonrpc":"2.0","id":{ping},"result":{{}}}}"#));
    assert_eq!(pending.ids(), ["2"]);
    h.client_sends(
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2}}"#,
    );
    assert!(pending.ids().is_empty());
    assert!(h.to_server().contains("notifications/cancelled"));
    h.client_sends(
        r#"[{"jsonrpc":"2.0","id":5,"method":"ping"},{"jsonrpc":"2.0","id":6,"method":"ping"}]"#,
    );
    let (five, six) = (id_of(&h.to_server()), id_of(&h.to_server()));
    h.server_sends(&format!(r#"{{"jsonrpc":"2.0","id":{five},"result":{{}}}}"#));
    assert_eq!(pending.ids(), ["5", "6"], "5's answer waits for the array");
    h.server_sends(&format!(r#"{{"jsonrpc":"2.0","id":{six},"result":{{}}}}"#));
    assert!(pending.ids().is_empty());
}

#[test]
fn an_idle_dispatcher_has_no_timers_after_the_handshake_settles() {
    let mut h = Harness::new();
    assert!(h.d.timers.is_empty(), "no periodic timer at idle");
    h.client_sends(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#);
    let down = id_of(&h.to_server());
    h.server_sends(&format!(r#"{{"jsonrpc":"2.0","id":{down},"result":{{"protocolVersion":"2025-11-25","capabilities":{{}}}}}}"#));
    h.to_client();
    h.client_sends(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    h.to_server();
    // The one-shot "learn the tools" timer; it asks nothing of a server
    // without the tools capability.
    h.now += Duration::from_secs(1);
    let now = h.now;
    h.d.fire_timers(now);
    assert!(h.d.timers.is_empty());
    h.nothing_sent();
}

/// The spans exported so far (metrics skipped).
fn spans_in(exported: &Receiver<crate::otel::Item>) -> Vec<crate::otel::Span> {
    exported
        .try_iter()
        .flat_map(|i| match i {
            crate::otel::Item::Span(r) => r.spans(&crate::otel::Clock::now()),
            crate::otel::Item::Metrics(_) => Vec::new(),
        })
        .collect()
}

#[test]
fn with_export_on_counters_are_flushed_once_after_a_change_and_idle_stays_idle() {
    let mut h = Harness::new();
    let (handle, exported) = crate::otel::Handle::for_test();
    // `with_otel` takes the dispatcher by value: swap a spare in meanwhile.
    h.d = std::mem::replace(&mut h.d, Harness::new().d).with_otel(handle);
    assert!(h.d.timers.is_empty());
    h.client_sends(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}"#);
    let sent: Value = serde_json::from_str(&h.to_server()).unwrap();
    let traceparent = sent["params"]["_meta"]["traceparent"]
        .as_str()
        .unwrap()
        .to_owned();
    let down = &sent["id"];
    h.server_sends(&format!(
        r#"{{"jsonrpc":"2.0","id":{down},"result":{{"content":[]}}}}"#
    ));
    h.to_client();
    let spans = spans_in(&exported);
    assert_eq!(spans.len(), 2);
    assert_eq!(spans[0].ctx.traceparent(), traceparent);
    let flushes = |h: &Harness| {
        h.d.timers
            .iter()
            .filter(|Reverse(t)| t.timer == super::Timer::OtelFlush)
            .count()
    };
    assert_eq!(flushes(&h), 1);
    // Nothing happens for 10 s but the flush, and then nothing at all.
    while !h.d.timers.is_empty() {
        h.fire_next_timer();
    }
    let metrics = exported
        .try_iter()
        .filter(|i| matches!(i, crate::otel::Item::Metrics(_)));
    assert_eq!(metrics.count(), 1);
    assert_eq!(flushes(&h), 0);
}

/// Spans take the client's trace context carried with the request from
/// the reader, not one read from its line: a line whose
/// `_meta.traceparent` names one trace, carried with another context,
/// gives a call's span, a cached answer's and a failed request's under the
/// carried one.
#[test]
fn with_export_on_spans_have_the_context_carried_with_the_request_not_the_lines() {
    let mut h = Harness::with(config(|c| {
        let read_only = crate::config::ToolConfig {
            read_only: Some(true),
            ..Default::default()
        };
        c.tools.insert("t".into(), read_only);
        c.cache.tools.insert("t".into(), 10 * SECOND);
    }));
    let (handle, exported) = crate::otel::Handle::for_test();
    // `with_otel` takes the dispatcher by value: swap a spare in meanwhile.
    h.d = std::mem::replace(&mut h.d, Harness::new().d).with_otel(handle);
    let carried = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let carried = crate::otel::SpanContext::parse(carried).unwrap();
    let meta =
        r#""_meta":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}"#;
    let send = |h: &mut Harness, line: String| {
        let mut inbound = crate::inbound::Inbound::of_line(line.into_bytes());
        let read = inbound.read.as_mut().unwrap();
        assert!(read.client_context.is_some_and(|c| c != carried));
        read.client_context = Some(carried);
        if let Some(call) = &mut read.call {
            call.client_context = Some(carried);
        }
        h.d.handle_event(Event::Client(inbound), h.now);
    };
    let line = |id: u32, method: &str, member: &str| {
        format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{{member},{meta}}}}}"#)
    };
    // A call the server answers, the same call answered from the cache,
    // and a request the server fails.
    let answers = [
        Some(r#""result":{"content":[]}"#),
        None,
        Some(r#""error":{"code":-32002,"message":"not found"}"#),
    ];
    let lines = [
        line(1, "tools/call", r#""name":"t""#),
        line(2, "tools/call", r#""name":"t""#),
        line(3, "resources/read", r#""uri":"u""#),
    ];
    for (line, answer) in lines.into_iter().zip(answers) {
        send(&mut h, line);
        if let Some(answer) = answer {
            let down = id_of(&h.to_server());
            h.server_sends(&format!(r#"{{"jsonrpc":"2.0","id":{down},{answer}}}"#));
        }
        let sent = h.to_client();
        assert_eq!(
            answer.is_none(),
            sent.contains(r#""mcp-retry/source":"cache""#)
        );
    }
    let spans = spans_in(&exported);
    let server: Vec<_> = spans
        .iter()
        .filter(|s| s.kind == crate::otel::SpanKind::Server)
        .collect();
    assert_eq!(server.len(), 3, "{spans:?}");
    for s in server {
        assert_eq!(s.ctx.trace_id, carried.trace_id, "{s:?}");
        assert_eq!(s.parent, Some(carried.span_id), "{s:?}");
    }
}

#[test]
fn with_export_on_a_call_that_survives_a_crash_has_the_respawn_and_backoff_in_its_span() {
    let mut cfg = ServerConfig::with_defaults("t", "fake".into(), vec![]);
    cfg.assume_idempotent = true;
    let mut h = Harness::with(cfg);
    let (handle, exported) = crate::otel::Handle::for_test();
    // `with_otel` takes the dispatcher by value: swap a spare in meanwhile.
    h.d = std::mem::replace(&mut h.d, Harness::new().d).with_otel(handle);
    h.client_sends(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}"#);
    h.to_server();
    h.server_event(gone("exited with status 0"));
    let second = loop {
        if let Some(line) = h.try_to_server() {
            break line;
        }
        h.fire_next_timer();
    };
    let down = id_of(&second);
    h.server_sends(&format!(
        r#"{{"jsonrpc":"2.0","id":{down},"result":{{"content":[]}}}}"#
    ));
    h.to_client();
    let spans = spans_in(&exported);
    assert_eq!(spans.len(), 3, "{spans:?}");
    let failure = |s: &crate::otel::Span| {
        s.attrs
            .iter()
            .find(|(k, _)| *k == "error.type")
            .map(|(_, v)| v.clone())
    };
    assert_eq!(failure(&spans[0]), Some("server_exited".into()));
    assert_eq!(failure(&spans[1]), None);
    let events: Vec<&str> = spans[2].events.iter().map(|e| e.name).collect();
    assert!(events.contains(&"mcp_retry.backoff"), "{events:?}");
    assert!(events.contains(&"mcp_retry.respawn"), "{events:?}");
}

#[test]
fn with_export_on_a_breaker_refusal_is_an_event_and_a_transition_is_counted() {
    let mut cfg = ServerConfig::with_defaults("t", "fake".into(), vec![]);
    cfg.circuit_breaker.failure_threshold = 1;
    cfg.assume_idempotent = true;
    let mut h = Harness::with(cfg);
    let (handle, exported) = crate::otel::Handle::for_test();
    // `with_otel` takes the dispatcher by value: swap a spare in meanwhile.
    h.d = std::mem::replace(&mut h.d, Harness::new().d).with_otel(handle);
    h.client_sends(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}"#);
    let down = id_of(&h.to_server());
    h.server_sends(&format!(
        r#"{{"jsonrpc":"2.0","id":{down},"error":{{"code":-32000,"message":"busy"}}}}"#
    ));
    let answer: Value = serde_json::from_str(&h.to_client()).unwrap();
    assert_eq!(
        answer["error"]["data"]["reason"], "circuit_open",
        "{answer}"
    );
    let span = spans_in(&exported)
        .into_iter()
        .find(|s| s.kind == crate::otel::SpanKind::Server)
        .expect("the call's span");
    let events: Vec<&str> = span.events.iter().map(|e| e.name).collect();
    assert_eq!(events, ["mcp_retry.breaker_refused"]);
    let reason = span.attrs.iter().find(|(k, _)| *k == "error.type");
    assert_eq!(reason.map(|(_, v)| v.clone()), Some("circuit_open".into()));
    assert_eq!(h.d.calls.stats().breaker.get("opened"), Some(&1));
}

#[test]
fn answered_calls_do_not_pile_up_timers() {
    let mut h = Harness::new();
    for i in 0..5000 {
        h.client_sends(&format!(
            r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"t","arguments":{{"i":{i}}}}}}}"#
        ));
        let down = id_of(&h.to_server());
        h.server_sends(&format!(
            r#"{{"jsonrpc":"2.0","id":{down},"result":{{"content":[]}}}}"#
        ));
        assert_eq!(
            h.to_client(),
            format!(r#"{{"jsonrpc":"2.0","id":{i},"result":{{"content":[]}}}}"#)
        );
    }
    // One attempt timeout was set per call; the answered ones are pruned.
    assert!(
        h.d.timers.len() <= 2 * super::MIN_TIMERS_TO_PRUNE,
        "{}",
        h.d.timers.len()
    );
    assert!(h.d.calls.is_empty());
}

// ----- schedules on the fake clock -------------------------------------------

const SECOND: Duration = Duration::from_secs(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Defaults with `tools.t.idempotent: true` and no jitter.
fn config(edit: impl FnOnce(&mut ServerConfig)) -> ServerConfig {
    let mut cfg = ServerConfig::with_defaults("t", "fake".into(), vec![]);
    cfg.retry.jitter = 0.0;
    cfg.tools.insert(
        "t".into(),
        crate::config::ToolConfig {
            idempotent: Some(true),
            ..Default::default()
        },
    );
    edit(&mut cfg);
    cfg
}

fn call_line(id: u32, tool: &str, args: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{args}}}}}"#
    )
}

/// The server answers the request `line` with `body` (`"result":…` or
/// `"error":…`).
fn answer(h: &mut Harness, line: &str, body: &str) {
    h.server_sends(&format!(
        r#"{{"jsonrpc":"2.0","id":{},{body}}}"#,
        id_of(line)
    ));
}

const TRANSIENT: &str = r#""error":{"code":-32000,"message":"busy"}"#;
const OK: &str = r#""result":{"content":[{"type":"text","text":"ok"}]}"#;

#[test]
fn retries_follow_the_backoff_schedule_exactly() {
    let mut h = Harness::with(config(|c| {
        c.retry.base_delay = SECOND;
        c.retry.max_delay = 3 * SECOND;
    }));
    let t0 = h.now;
    h.client_sends(&call_line(1, "t", "{}"));
    let mut sent_at = vec![];
    for _ in 0..4 {
        let line = h.to_server();
        sent_at.push(h.now - t0);
        answer(&mut h, &line, TRANSIENT);
        if h.d.calls.is_empty() {
            break;
        }
        h.fire_next_timer();
    }
    // 1 s, then 2 s, then capped at 3 s.
    assert_eq!(sent_at, [Duration::ZERO, SECOND, 3 * SECOND, 6 * SECOND]);
    let e: Value = serde_json::from_str(&h.to_client()).unwrap();
    assert_eq!(e["error"]["message"], "busy", "{e}");
    h.nothing_sent();
}

/// A call's params are read once, by the thread that reads the client's
/// line (`Harness::client_sends` reads it as that thread does): not by the
/// dispatcher, not again for a retry, not for the answer.
#[test]
fn a_calls_params_are_read_once_at_the_edge_however_often_it_is_sent() {
    let mut h = Harness::with(config(|c| c.retry.base_delay = SECOND));
    let before = crate::inbound::reads();
    h.client_sends(&call_line(1, "t", r#"{"a":[1,{"b":2}]}"#));
    let first = h.to_server();
    answer(&mut h, &first, TRANSIENT);
    h.fire_next_timer();
    let retry = h.to_server();
    assert_ne!(id_of(&first), id_of(&retry));
    answer(&mut h, &retry, OK);
    assert!(h.to_client().contains("ok"));
    assert_eq!(crate::inbound::reads() - before, 1);
    assert_eq!(crate::inbound::reads() - before, 1);
}

#[test]
fn a_retry_hint_longer_than_the_backoff_is_honoured() {
    let mut h = Harness::with(config(|c| c.retry.base_delay = ms(100)));
    h.client_sends(&call_line(1, "t", "{}"));
    let line = h.to_server();
    let t0 = h.now;
    answer(
        &mut h,
        &line,
        r#""error":{"code":-32000,"message":"slow down","data":{"retryAfterMs":2500}}"#,
    );
    assert_eq!(h.fire_next_timer() - t0, ms(2500));
    let line = h.to_server();
    answer(&mut h, &line, OK);
    assert!(h.to_client().contains(r#""text":"ok""#));
}

#[test]
fn the_breaker_refuses_until_its_cooldown_then_lets_one_trial_through() {
    let mut h = Harness::with(config(|c| {
        c.retry.max_retries = 0;
        c.circuit_breaker.failure_threshold = 2;
        c.circuit_breaker.cooldown = 30 * SECOND;
    }));
    for id in 1..=2 {
        h.client_sends(&call_line(id, "t", &format!(r#"{{"n":{id}}}"#)));
        let line = h.to_server();
        answer(&mut h, &line, TRANSIENT);
        h.to_client();
    }
    let opened = h.now;
    h.client_sends(&call_line(3, "t", "{}"));
    let e: Value = serde_json::from_str(&h.to_client()).unwrap();
    assert_eq!(e["error"]["data"]["reason"], "circuit_open", "{e}");
    assert_eq!(e["error"]["data"]["retryAfterMs"], 30_000, "{e}");
    h.at(opened + 30 * SECOND - ms(1));
    h.client_sends(&call_line(4, "t", "{}"));
    assert!(h.to_client().contains("circuit_open"));
    h.nothing_sent();
    h.at(opened + 30 * SECOND);
    h.client_sends(&call_line(5, "t", "{}"));
    let trial = h.to_server();
    // Only one trial while half-open.
    h.client_sends(&call_line(6, "t", r#"{"other":1}"#));
    assert!(h.to_client().contains("circuit_open"));
    answer(&mut h, &trial, OK);
    assert!(h.to_client().contains(r#""id":5"#));
    // Closed again.
    h.client_sends(&call_line(7, "t", "{}"));
    h.to_server();
}

#[test]
fn an_explicit_key_replays_until_idempotency_ttl_then_runs_again() {
    let mut h = Harness::with(config(|c| c.idempotency_ttl = 300 * SECOND));
    let keyed = |id: u32| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"u","arguments":{{}},"_meta":{{"idempotencyKey":"k"}}}}}}"#
        )
    };
    h.client_sends(&keyed(1));
    let line = h.to_server();
    answer(&mut h, &line, OK);
    h.to_client();
    let done = h.now;
    h.at(done + 300 * SECOND - ms(1));
    h.client_sends(&keyed(2));
    assert!(h.to_client().contains(r#""mcp-retry/source":"dedup""#));
    h.at(done + 300 * SECOND);
    h.client_sends(&keyed(3));
    h.to_server();
}

#[test]
fn a_cached_read_is_fresh_until_its_ttl_and_a_write_empties_the_cache() {
    let mut h = Harness::with(config(|c| {
        c.tools.insert(
            "read".into(),
            crate::config::ToolConfig {
                read_only: Some(true),
                ..Default::default()
            },
        );
        c.cache.tools.insert("read".into(), 10 * SECOND);
    }));
    h.client_sends(&call_line(1, "read", "{}"));
    let line = h.to_server();
    answer(&mut h, &line, OK);
    h.to_client();
    let stored = h.now;
    h.at(stored + 10 * SECOND - ms(1));
    h.client_sends(&call_line(2, "read", "{}"));
    assert!(h.to_client().contains(r#""mcp-retry/source":"cache""#));
    h.at(stored + 10 * SECOND);
    h.client_sends(&call_line(3, "read", "{}"));
    let line = h.to_server();
    answer(&mut h, &line, OK);
    h.to_client();
    // A write in flight while a read runs: the read's answer is not kept.
    h.client_sends(&call_line(4, "read", r#"{"x":1}"#));
    let read = h.to_server();
    h.client_sends(&call_line(5, "write", "{}"));
    let write = h.to_server();
    answer(&mut h, &read, OK);
    h.to_client();
    answer(&mut h, &write, OK);
    h.to_client();
    h.client_sends(&call_line(6, "read", r#"{"x":1}"#));
    h.to_server();
    // And the write emptied what was cached before it.
    h.client_sends(&call_line(7, "read", "{}"));
    h.to_server();
}

/// The fake times of the starts so far, from `t0`.
fn starts_since(h: &Harness, t0: Instant) -> Vec<Duration> {
    h.starts.lock().unwrap().iter().map(|t| *t - t0).collect()
}

#[test]
fn a_server_that_cannot_start_is_probed_with_growing_delays_while_nothing_waits_and_the_breaker_stays_closed(
) {
    let mut h = Harness::with(config(|c| {
        c.circuit_breaker.failure_threshold = 2;
        c.circuit_breaker.cooldown = 30 * SECOND;
    }));
    let t0 = h.now;
    // The first incarnation exits before answering anything, and the next
    // six starts fail.
    h.failing_starts.lock().unwrap().extend([true; 6]);
    h.server_event(gone("exited with status 1"));
    while h.starts.lock().unwrap().len() < 8 {
        h.fire_next_timer();
    }
    let starts = starts_since(&h, t0);
    assert_eq!(starts[1], Duration::ZERO, "the first probe is at once");
    // Then 1 s, 2 s, 4 s, 8 s, 16 s, each ± 20 %.
    let gaps: Vec<f64> = starts
        .windows(2)
        .skip(1)
        .map(|w| (w[1] - w[0]).as_secs_f64())
        .collect();
    for (gap, expected) in gaps.iter().zip([1.0, 2.0, 4.0, 8.0, 16.0]) {
        assert!((gap - expected).abs() <= expected * 0.2 + 1e-9, "{gaps:?}");
    }
    // Failed probes are not failures of calls: the breaker is closed.
    assert_eq!(
        h.d.calls.breaker_state(),
        &crate::policy::breaker::BreakerState::Closed
    );
    // The last probe worked: traffic flows.
    h.client_sends(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    assert!(h.to_server().contains("tools/list"));
}

#[test]
fn a_request_that_arrives_during_an_outage_brings_the_next_probe_forward_and_goes_out_when_it_succeeds(
) {
    let mut h = Harness::new();
    let t0 = h.now;
    h.failing_starts.lock().unwrap().extend([true; 8]);
    h.server_event(gone("exited with status 1"));
    // Idle: the probes back off to 8 s and more.
    while h.starts.lock().unwrap().len() < 6 {
        h.fire_next_timer();
    }
    let last = *h.starts.lock().unwrap().last().unwrap();
    assert!(h.next_timer() - last > 6 * SECOND);
    // A request arrives: it waits, and the next probe is at most 0.5 s
    // after the last one.
    h.advance(SECOND / 10);
    h.client_sends(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    assert!(h.try_to_server().is_none());
    assert!(h.client.try_recv().is_err(), "it waits");
    // While it waits, probes are at most 0.5 s apart (the rest fail).
    while h.starts.lock().unwrap().len() < 10 {
        h.fire_next_timer();
    }
    let starts = starts_since(&h, t0);
    for w in starts[5..].windows(2) {
        assert!(w[1] - w[0] <= SECOND / 2, "{starts:?}");
    }
    // The tenth start works: the request goes out at once.
    assert!(h.to_server().contains("tools/list"));
    // It is answered.
    h.server_sends(r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}"#);
    assert!(h.to_client().contains("\"tools\""));
}

#[test]
fn a_request_waits_for_the_server_at_most_wait_for_server_and_says_how_long_it_waited() {
    let mut h = Harness::with(config(|c| {
        c.wait_for_server = 3 * SECOND;
        c.circuit_breaker.failure_threshold = 1;
    }));
    h.failing_starts.lock().unwrap().extend([true; 100]);
    h.server_event(gone("exited with status 1"));
    h.advance(SECOND / 4);
    let asked = h.now;
    h.client_sends(r#"{"jsonrpc":"2.0","id":1,"method":"resources/list"}"#);
    while h.client.is_empty() {
        h.fire_next_timer();
    }
    assert_eq!(h.now - asked, 3 * SECOND);
    let answer = h.to_client();
    assert!(answer.contains("server_unavailable"), "{answer}");
    assert!(
        answer.contains("gave up after waiting 3s for it"),
        "{answer}"
    );
    // Giving up counts toward the breaker: with a threshold of 1 it is
    // open, and a call now fails fast.
    assert!(matches!(
        h.d.calls.breaker_state(),
        crate::policy::breaker::BreakerState::Open { .. }
    ));
    h.client_sends(&call_line(2, "read", "{}"));
    assert!(h.to_client().contains("circuit_open"));
    // The outage opened it: the first probe that works closes it (with no
    // handshake to replay, once the server says something).
    h.failing_starts.lock().unwrap().clear();
    h.fire_next_timer();
    assert!(matches!(
        h.d.calls.breaker_state(),
        crate::policy::breaker::BreakerState::Open { .. }
    ));
    h.server_sends(r#"{"jsonrpc":"2.0","method":"notifications/message","params":{}}"#);
    assert_eq!(
        h.d.calls.breaker_state(),
        &crate::policy::breaker::BreakerState::Closed
    );
}

#[test]
fn a_ping_while_the_server_is_down_is_answered_by_the_proxy() {
    let mut h = Harness::new();
    h.failing_starts.lock().unwrap().extend([true; 3]);
    h.server_event(gone("exited with status 1"));
    h.fire_next_timer();
    h.client_sends(r#"{"jsonrpc":"2.0","id":"p","method":"ping"}"#);
    assert_eq!(h.to_client(), r#"{"jsonrpc":"2.0","id":"p","result":{}}"#);
    assert!(h.try_to_server().is_none());
}

#[test]
fn a_start_that_needs_fixing_fails_waiting_requests_at_once() {
    let mut h = Harness::new();
    h.server_event(gone("exited with status 1"));
    // Now the start fails for a reason waiting cannot heal.
    h.failing_starts.lock().unwrap().push_back(true);
    *h.fix.lock().unwrap() = true;
    h.client_sends(r#"{"jsonrpc":"2.0","id":1,"method":"resources/list"}"#);
    h.fire_next_timer();
    let answer = h.to_client();
    assert!(answer.contains("server_unavailable"), "{answer}");
    assert!(answer.contains("the start failed"), "{answer}");
    // And a request that comes now is refused at once.
    h.client_sends(r#"{"jsonrpc":"2.0","id":2,"method":"resources/list"}"#);
    assert!(h.to_client().contains("server_unavailable"));
}

const INITIALIZE: &str =
    r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}"#;

#[test]
fn three_exits_alike_before_the_first_handshake_answer_what_waits_at_once() {
    let mut h = Harness::new();
    h.client_sends(INITIALIZE);
    h.to_server();
    h.server_event(gone("exited with status 3"));
    // Sent again to the next start (probed at once), which exits alike.
    h.fire_next_timer();
    h.to_server();
    h.server_event(gone("exited with status 3"));
    h.fire_next_timer();
    h.to_server();
    assert!(h.client.is_empty(), "two exits are not a crash loop");
    h.server_event(gone("exited with status 3"));
    let answer = h.to_client();
    assert!(answer.contains("server_unavailable"), "{answer}");
    assert!(answer.contains("at its last 3 starts"), "{answer}");
    // A request now is refused at once; probes go on, and a server that
    // comes up gets the next one.
    h.client_sends(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    assert!(h.to_client().contains("at its last 3 starts"));
    h.fire_next_timer();
    assert_eq!(h.starts.lock().unwrap().len(), 4);
    h.client_sends(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#);
    assert!(h.to_server().contains("tools/list"));
}

#[test]
fn under_check_the_first_exit_before_the_handshake_answers_what_waits() {
    let mut h = Harness::new();
    h.d.link.set_check_mode(true);
    h.client_sends(INITIALIZE);
    h.to_server();
    h.server_event(gone("exited with status 3"));
    let answer = h.to_client();
    assert!(answer.contains("server_unavailable"), "{answer}");
    assert!(answer.contains("exited with status 3"), "{answer}");
    assert!(!answer.contains("at its last"), "{answer}");
    // Even with fail_fast_at_start off: check wants the truth now.
    let mut h = Harness::with(config(|c| c.fail_fast_at_start = false));
    h.d.link.set_check_mode(true);
    h.client_sends(INITIALIZE);
    h.to_server();
    h.server_event(gone("exited with status 3"));
    assert!(h.to_client().contains("server_unavailable"));
}

#[test]
fn exits_that_differ_or_follow_a_handshake_are_waited_for() {
    // The handshake goes to each start, which exits `how`.
    let exits = |h: &mut Harness, hows: [&str; 3]| {
        h.client_sends(INITIALIZE);
        h.to_server();
        for how in hows {
            h.server_event(gone(how));
            h.fire_next_timer();
            h.to_server();
        }
        assert!(h.client.is_empty(), "no answer yet");
    };
    let (three, one) = ("exited with status 3", "exited with status 1");
    exits(&mut Harness::new(), [three, one, three]);
    // Fail-fast off: three alike are waited for too.
    exits(
        &mut Harness::with(config(|c| c.fail_fast_at_start = false)),
        [three; 3],
    );
    // After a handshake, a server that crashes alike is restarted and
    // waited for (its handshake replayed each time).
    let mut h = Harness::new();
    handshake(&mut h);
    h.client_sends(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    h.to_server();
    for _ in 0..3 {
        h.server_event(gone("exited with status 3"));
        while h.server.is_empty() {
            h.fire_next_timer();
        }
        assert!(h.to_server().contains("initialize"));
    }
    assert!(h.client.is_empty(), "no answer yet");
}

/// How long a request waits for a server that exits and then fails every
/// start.
fn waited_for_a_dead_server(h: &mut Harness) -> Duration {
    h.failing_starts.lock().unwrap().extend([true; 200]);
    h.server_event(gone("exited with status 1"));
    let asked = h.now;
    h.client_sends(r#"{"jsonrpc":"2.0","id":1,"method":"resources/list"}"#);
    while h.client.is_empty() {
        h.fire_next_timer();
    }
    h.now - asked
}

#[test]
fn before_the_first_handshake_a_request_waits_twenty_seconds_after_it_thirty() {
    let mut h = Harness::new();
    assert_eq!(waited_for_a_dead_server(&mut h), 20 * SECOND);
    assert!(h.to_client().contains("gave up after waiting 20s"));
    // Set in the config, it is the same before the first handshake.
    let mut h = Harness::with(config(|c| {
        c.wait_for_server = 30 * SECOND;
        c.wait_for_server_set = true;
    }));
    assert_eq!(waited_for_a_dead_server(&mut h), 30 * SECOND);
    // After a handshake: 30 s.
    let mut h = Harness::new();
    handshake(&mut h);
    assert_eq!(waited_for_a_dead_server(&mut h), 30 * SECOND);
}

#[test]
fn an_initialize_the_first_server_never_answers_is_answered_after_twenty_seconds() {
    let mut h = Harness::new();
    h.client_sends(INITIALIZE);
    h.to_server();
    let asked = h.now;
    h.fire_next_timer();
    assert_eq!(h.now - asked, 20 * SECOND);
    let answer = h.to_client();
    assert!(answer.contains("server_unavailable"), "{answer}");
    assert!(
        answer.contains("did not answer initialize within 20s"),
        "{answer}"
    );
    // Answered in time, it sets no deadline that outlives it.
    let mut h = Harness::new();
    h.client_sends(INITIALIZE);
    let down = id_of(&h.to_server());
    h.server_sends(&format!(r#"{{"jsonrpc":"2.0","id":{down},"result":{{"protocolVersion":"2025-11-25","capabilities":{{}}}}}}"#));
    assert!(h.to_client().contains("protocolVersion"));
    assert!(h.d.timers.is_empty());
}

/// The client's `notifications/progress` lines so far: (token, value,
/// message).
fn progress_to_client(h: &Harness) -> Vec<(Value, f64, Option<String>)> {
    let mut seen = Vec::new();
    while let Ok(q) = h.client.try_recv() {
        let v: Value = serde_json::from_slice(&q.bytes).unwrap();
        assert_eq!(v["method"], "notifications/progress", "{v}");
        let params = &v["params"];
        let message = params["message"].as_str().map(str::to_owned);
        seen.push((
            params["progressToken"].clone(),
            params["progress"].as_f64().unwrap(),
            message,
        ));
    }
    seen
}

#[test]
fn a_call_that_waits_tells_a_client_with_a_progress_token_every_five_seconds() {
    let mut h = Harness::with(config(|_| {}));
    h.failing_starts.lock().unwrap().extend([true; 100]);
    h.server_event(gone("exited with status 1"));
    h.client_sends(
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":{"progressToken":"tok"}}}"#,
    );
    let first = progress_to_client(&h);
    assert_eq!(first.len(), 1, "told at once: {first:?}");
    assert_eq!(first[0].0, json!("tok"));
    assert_eq!(
        first[0].2.as_deref(),
        Some("waiting for the MCP server to come back, attempt 1")
    );
    let mut values = vec![first[0].1];
    for _ in 0..3 {
        h.advance(5 * SECOND);
        let more = progress_to_client(&h);
        assert_eq!(more.len(), 1, "{more:?}");
        values.push(more[0].1);
    }
    // The server is back: the attempt goes out and the proxy says no more;
    // the server's own progress, above the proxy's values, reaches the client.
    h.failing_starts.lock().unwrap().clear();
    while h.server.is_empty() {
        h.fire_next_timer();
    }
    let attempt = h.to_server();
    assert!(attempt.contains("\"progressToken\":\"tok\""), "{attempt}");
    progress_to_client(&h);
    h.advance(6 * SECOND);
    assert!(progress_to_client(&h).is_empty(), "no notice while it runs");
    h.server_sends(r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"tok","progress":1,"total":3}}"#);
    let own = progress_to_client(&h);
    assert_eq!(own.len(), 1, "{own:?}");
    values.push(own[0].1);
    assert_eq!(own[0].1, 1.0);
    assert!(values.windows(2).all(|w| w[0] < w[1]), "{values:?}");
    // It fails (a transient error): the backoff is a wait too.
    answer(&mut h, &attempt, TRANSIENT);
    let backoff = progress_to_client(&h);
    assert_eq!(backoff.len(), 1, "{backoff:?}");
    assert!(backoff[0].1 > 1.0, "{backoff:?}");
    let message = backoff[0].2.clone().unwrap();
    assert!(
        message.starts_with("waiting ") && message.ends_with("to retry, attempt 2 of 4"),
        "{message}"
    );
}

#[test]
fn a_call_without_a_progress_token_waits_in_silence() {
    let mut h = Harness::with(config(|_| {}));
    h.failing_starts.lock().unwrap().extend([true; 100]);
    h.server_event(gone("exited with status 1"));
    h.client_sends(&call_line(1, "t", "{}"));
    h.advance(12 * SECOND);
    assert!(h.client.is_empty());
}

/// The `resources/read` requests sent to the server so far: (uri, line).
fn reads_sent(h: &Harness) -> Vec<(String, String)> {
    let mut reads = Vec::new();
    while let Some(line) = h.try_to_server() {
        let v: Value = serde_json::from_str(&line).unwrap();
        if v["method"] == "resources/read" {
            reads.push((v["params"]["uri"].as_str().unwrap().to_owned(), line));
        }
    }
    reads
}

/// The client reads `uri` (its request id is the uri's number).
fn read(h: &mut Harness, n: u32) {
    h.client_sends(&format!(
        r#"{{"jsonrpc":"2.0","id":{n},"method":"resources/read","params":{{"uri":"u{n}"}}}}"#
    ));
}

/// A session whose server went down, with the reads `1..=n` waiting for
/// it, and came back: its handshake replayed and answered.
fn back_with_reads_waiting(n: u32) -> Harness {
    let mut h = Harness::new();
    handshake(&mut h);
    h.failing_starts.lock().unwrap().extend([true; 3]);
    h.server_event(gone("exited with status 1"));
    for i in 1..=n {
        read(&mut h, i);
    }
    // Long enough to be backlog when the server is back.
    h.advance(crate::policy::ramp::FRESH);
    let replay = loop {
        match h.try_to_server() {
            Some(line) if line.contains("\"initialize\"") => break line,
            Some(_) => {}
            None => {
                h.fire_next_timer();
            }
        }
    };
    answer(
        &mut h,
        &replay,
        r#""result":{"protocolVersion":"2025-11-25","capabilities":{}}"#,
    );
    h
}

fn uris(reads: &[(String, String)]) -> Vec<&str> {
    reads.iter().map(|(u, _)| u.as_str()).collect()
}

#[test]
fn what_waited_for_a_server_that_came_back_goes_oldest_first_then_two_per_answer() {
    let mut h = back_with_reads_waiting(7);
    let first = reads_sent(&h);
    assert_eq!(uris(&first), ["u1"], "the oldest, alone");
    answer(&mut h, &first[0].1, r#""result":{"contents":[]}"#);
    let second = reads_sent(&h);
    assert_eq!(uris(&second), ["u2", "u3"]);
    // A request that comes now is new traffic, not the backlog: it goes.
    read(&mut h, 8);
    assert_eq!(uris(&reads_sent(&h)), ["u8"]);
    let mut third = Vec::new();
    for (_, line) in &second {
        answer(&mut h, line, r#""result":{"contents":[]}"#);
        third.extend(reads_sent(&h));
    }
    assert_eq!(uris(&third), ["u4", "u5", "u6", "u7"]);
    assert!(h.d.link.queue().is_empty() && !h.d.link.queue().ramping());
}

#[test]
fn what_waited_less_than_a_second_is_new_traffic_and_goes_at_once() {
    let mut h = Harness::new();
    handshake(&mut h);
    h.server_event(gone("exited with status 1"));
    for i in 1..=3 {
        read(&mut h, i);
    }
    h.advance(crate::policy::ramp::FRESH);
    read(&mut h, 4);
    read(&mut h, 5);
    let replay = h.to_server();
    assert!(replay.contains("\"initialize\""), "{replay}");
    answer(
        &mut h,
        &replay,
        r#""result":{"protocolVersion":"2025-11-25","capabilities":{}}"#,
    );
    // The oldest of the backlog, and what just missed the connection.
    assert_eq!(uris(&reads_sent(&h)), ["u1", "u4", "u5"]);
}

#[test]
fn a_ramp_nobody_answers_lets_more_go_every_second() {
    let mut h = back_with_reads_waiting(4);
    assert_eq!(uris(&reads_sent(&h)), ["u1"]);
    let t0 = h.now;
    h.advance(crate::policy::ramp::STALL / 2);
    assert!(reads_sent(&h).is_empty());
    h.at(t0 + crate::policy::ramp::STALL);
    assert_eq!(uris(&reads_sent(&h)), ["u2"]);
    h.advance(crate::policy::ramp::STALL);
    assert_eq!(uris(&reads_sent(&h)), ["u3", "u4"]);
}

#[test]
fn a_client_that_reads_only_first_pages_of_the_tool_list_keeps_one_page() {
    let mut h = Harness::new();
    for i in 0..2000 {
        h.client_sends(&format!(
            r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/list","params":{{}}}}"#
        ));
        let line = h.to_server();
        answer(
            &mut h,
            &line,
            r#""result":{"tools":[{"name":"a","inputSchema":{}},{"name":"b","inputSchema":{}}],"nextCursor":"2"}"#,
        );
        h.to_client();
    }
    assert_eq!(h.d.calls.tool_pages_held(), 2);
}

fn gone(how: &str) -> ServerEvent {
    ServerEvent::Gone(crate::downstream::Gone {
        how: how.into(),
        may_have_received: true,
        heal: crate::downstream::Heal::Wait,
    })
}

#[test]
fn a_draining_server_is_read_to_the_end_while_new_traffic_waits() {
    let mut h = Harness::new();
    h.client_sends(r#"{"jsonrpc":"2.0","id":"a","method":"resources/read","params":{"uri":"x"}}"#);
    let down = id_of(&h.to_server());
    // Its process exited; its answer is still in the pipe.
    h.server_event(ServerEvent::Draining);
    h.advance(Duration::from_secs(5));
    // What arrives meanwhile waits for the next server.
    h.client_sends(r#"{"jsonrpc":"2.0","id":"b","method":"resources/read","params":{"uri":"y"}}"#);
    h.nothing_sent();
    h.server_sends(&format!(
        r#"{{"jsonrpc":"2.0","id":{down},"result":{{"n":1}}}}"#
    ));
    assert_eq!(
        h.to_client(),
        r#"{"jsonrpc":"2.0","id":"a","result":{"n":1}}"#
    );
    let generation = h.d.link.generation();
    h.server_event(gone("exited with status 0"));
    h.advance(Duration::ZERO);
    assert_eq!(h.d.link.generation(), generation + 1, "started again");
    let line = h.to_server();
    assert!(line.contains(r#""uri":"y""#), "{line}");
    h.nothing_sent();
}

#[test]
fn lines_the_server_never_got_are_never_sent_not_ambiguous() {
    // An unannotated tool is never retried after an ambiguous failure; one
    // whose request never left is, on the next server. A plain request
    // that never left waits for the next server too.
    let mut h = Harness::with(config(|c| c.retry.base_delay = ms(10)));
    h.client_sends(&call_line(1, "unsafe", "{}"));
    let call = h.to_server();
    h.client_sends(r#"{"jsonrpc":"2.0","id":"w","method":"tools/list"}"#);
    let list = h.to_server();
    h.server_event(ServerEvent::Unsent {
        lines: vec![tagged(&call), tagged(&list)],
        why: "writing to the server failed".into(),
    });
    h.nothing_sent();
    h.server_event(gone("was killed by signal 9 (SIGKILL)"));
    while h.d.calls.any_between_attempts() {
        h.fire_next_timer();
    }
    let mut sent = vec![h.to_server(), h.to_server()];
    sent.sort();
    assert!(
        sent.iter().any(|l| l.contains(r#""name":"unsafe""#)),
        "{sent:?}"
    );
    assert!(
        sent.iter().any(|l| l.contains(r#""method":"tools/list""#)),
        "{sent:?}"
    );
}

#[test]
fn a_write_the_server_never_got_goes_to_the_next_server_as_the_client_sent_it() {
    // Not a read: kept all the same, so that a line the server never got
    // goes again as it was, under a new id, with no line read back.
    let mut h = Harness::new();
    let asked = r#"{"jsonrpc":"2.0","id":"w","method":"x/write","params":{"n":"é\u00e9"}}"#;
    h.client_sends(asked);
    let first = h.to_server();
    let down = id_of(&first);
    // What comes back is not read: bytes of the same length that say
    // something else change nothing.
    let mut back = tagged(&first);
    let n = back.bytes.iter().position(|b| *b == b'n').unwrap();
    back.bytes[n] = b'm';
    h.server_event(ServerEvent::Unsent {
        lines: vec![back],
        why: "writing to the server failed".into(),
    });
    h.nothing_sent();
    h.server_event(gone("was killed by signal 9 (SIGKILL)"));
    h.advance(Duration::ZERO);
    let again = h.to_server();
    assert_ne!(id_of(&again), down);
    assert_eq!(
        again,
        first.replace(&down.to_string(), &id_of(&again).to_string())
    );
    h.nothing_sent();
    h.server_sends(&format!(
        r#"{{"jsonrpc":"2.0","id":{},"result":{{}}}}"#,
        id_of(&again)
    ));
    assert_eq!(h.to_client(), r#"{"jsonrpc":"2.0","id":"w","result":{}}"#);
}

#[test]
fn the_rest_of_a_line_partly_written_leaves_its_request_to_the_lost_link() {
    // Only the rest of the line came back: the server may hold the start
    // of it. A write is answered as one that may have reached the server;
    // a read goes again.
    let mut h = Harness::new();
    h.client_sends(r#"{"jsonrpc":"2.0","id":"w","method":"x/write","params":{}}"#);
    let write = h.to_server();
    h.client_sends(r#"{"jsonrpc":"2.0","id":"r","method":"resources/read","params":{"uri":"x"}}"#);
    let read = h.to_server();
    let rest = |line: &str| {
        let mut o = tagged(line);
        o.bytes.drain(..10);
        o
    };
    h.server_event(ServerEvent::Unsent {
        lines: vec![rest(&write), rest(&read)],
        why: "writing to the server failed".into(),
    });
    h.nothing_sent();
    h.server_event(gone("was killed by signal 9 (SIGKILL)"));
    let e: Value = serde_json::from_str(&h.to_client()).unwrap();
    assert_eq!(e["id"], "w");
    assert_eq!(e["error"]["data"]["reason"], "server_exited");
    h.advance(Duration::ZERO);
    assert!(h.to_server().contains(r#""uri":"x""#));
    h.nothing_sent();
}

#[test]
fn a_calls_client_id_is_made_once_for_the_request_table_and_the_call() {
    let mut h = Harness::new();
    h.client_sends(&call_line(1, "t", "{}"));
    let _ = h.to_server();
    let (_, client, _) = h.d.calls.started(1).expect("call 1");
    let kept = h.d.requests.kept_id("1").expect("request 1 is open");
    assert_eq!(client, "1");
    assert!(
        std::ptr::eq(client.as_ptr(), kept.as_ptr()),
        "the id was copied"
    );
}

#[test]
fn only_what_answers_a_request_gets_a_reading_of_the_clock_of_its_own() {
    let server = |line: &str| Event::Server {
        generation: 1,
        event: ServerEvent::Message(jsonrpc::classify(line.to_owned())),
    };
    assert!(server(r#"{"jsonrpc":"2.0","id":3,"result":{}}"#).is_answer());
    assert!(server(r#"{"jsonrpc":"2.0","id":3,"error":{"code":1,"message":"m"}}"#).is_answer());
    assert!(server(r#"[{"jsonrpc":"2.0","id":3,"result":{}}]"#).is_answer());
    assert!(Event::Server {
        generation: 1,
        event: ServerEvent::Failed {
            id: 3,
            failure: crate::downstream::Failure {
                message: "m".into(),
                status: None,
                may_have_run: true,
                invalid: false,
            },
        },
    }
    .is_answer());
    assert!(!server(r#"{"jsonrpc":"2.0","id":3,"method":"roots/list"}"#).is_answer());
    assert!(!server(r#"{"jsonrpc":"2.0","method":"notifications/progress"}"#).is_answer());
    let client = crate::inbound::Inbound::of(jsonrpc::classify(call_line(1, "t", "{}")));
    assert!(!Event::Client(client).is_answer());
}

#[test]
fn answers_the_proxy_cannot_relay_answer_their_request_with_an_error() {
    let mut h = Harness::new();
    h.client_sends(r#"{"jsonrpc":"2.0","id":"a","method":"resources/read","params":{"uri":"x"}}"#);
    let a = id_of(&h.to_server());
    h.client_sends(r#"{"jsonrpc":"2.0","id":"b","method":"prompts/list"}"#);
    let b = id_of(&h.to_server());
    h.server_sends(&format!(
        r#"{{"jsonrpc":"2.0","id":{a},"result":{{}},"error":{{"code":1,"message":"m"}}}}"#
    ));
    let e: Value = serde_json::from_str(&h.to_client()).unwrap();
    assert_eq!(e["id"], "a");
    assert_eq!(e["error"]["code"], json!(-31000));
    assert_eq!(e["error"]["data"]["reason"], "invalid_response");
    h.server_event(ServerEvent::TooLong {
        response_id: Some(b.to_string()),
        len: 1 << 30,
    });
    let e: Value = serde_json::from_str(&h.to_client()).unwrap();
    assert_eq!(e["id"], "b");
    assert_eq!(e["error"]["data"]["reason"], "response_too_large");
    // The real answers, if they came after all, are not relayed again; an
    // overlong line that is not a known response answers nobody.
    h.server_sends(&format!(r#"{{"jsonrpc":"2.0","id":{a},"result":{{}}}}"#));
    h.server_event(ServerEvent::TooLong {
        response_id: Some("77".into()),
        len: 1 << 30,
    });
    h.server_event(ServerEvent::TooLong {
        response_id: None,
        len: 1 << 30,
    });
    h.nothing_sent();
}

#[test]
fn a_cancel_with_a_repeated_member_cancels_nothing() {
    let mut h = Harness::new();
    h.client_sends(r#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"x"}}"#);
    let one = id_of(&h.to_server());
    h.client_sends(r#"{"jsonrpc":"2.0","id":2,"method":"resources/read","params":{"uri":"y"}}"#);
    let two = id_of(&h.to_server());
    h.client_sends(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1,"requestId":2}}"#);
    h.nothing_sent();
    // Both requests are still answered.
    h.server_sends(&format!(r#"{{"jsonrpc":"2.0","id":{one},"result":{{}}}}"#));
    h.server_sends(&format!(r#"{{"jsonrpc":"2.0","id":{two},"result":{{}}}}"#));
    assert_eq!(h.to_client(), r#"{"jsonrpc":"2.0","id":1,"result":{}}"#);
    assert_eq!(h.to_client(), r#"{"jsonrpc":"2.0","id":2,"result":{}}"#);
}

// ----- status publishing -----------------------------------------------------

fn status_timers(h: &Harness) -> Vec<Instant> {
    h.d.timers
        .iter()
        .filter(|Reverse(t)| t.timer == super::Timer::StatusPublish)
        .map(|Reverse(t)| t.at)
        .collect()
}

#[test]
fn status_is_published_after_a_change_at_most_once_a_second_and_never_while_idle() {
    let (tx, published) = crossbeam_channel::unbounded();
    let mut h = Harness::with(config(|_| {}));
    h.d.reporting.status_to(tx);
    let t0 = h.now;
    // The first state goes out at once.
    h.d.now = t0;
    h.d.status_check();
    assert_eq!(status_timers(&h), [t0]);
    h.at(t0);
    let first = published.try_recv().expect("the first snapshot");
    assert_eq!(first.headline.link, crate::status::LinkState::Up);
    assert!(first.tools.is_empty());
    assert!(h.d.timers.is_empty(), "nothing scheduled once published");

    // A call 100 ms later, answered 250 ms after it arrived: one write, a
    // second after the last one.
    h.advance(ms(100));
    h.client_sends(&call_line(1, "t", "{}"));
    let attempt = h.to_server();
    assert_eq!(status_timers(&h), [t0 + SECOND]);
    h.advance(ms(250));
    answer(&mut h, &attempt, OK);
    h.to_client();
    assert_eq!(
        status_timers(&h),
        [t0 + SECOND],
        "still one write scheduled"
    );
    h.advance(ms(500));
    assert!(
        published.try_recv().is_err(),
        "not before a second has passed"
    );
    h.at(t0 + SECOND);
    let snap = published.try_recv().expect("the snapshot after the call");
    let t = &snap.tools["t"];
    assert_eq!((t.counters.calls, t.latency_count), (1, 1));
    // 250 ms falls in the bucket 229.376..262.144 ms.
    assert_eq!(t.p50, Some(Duration::from_micros(245_760)));
    assert_eq!(snap.headline.in_flight, 0);
    assert!(status_timers(&h).is_empty());

    // Idle: the only timer left is the answered attempt's stale timeout,
    // which changes nothing and publishes nothing.
    for _ in 0..10 {
        if h.d.timers.is_empty() {
            break;
        }
        h.fire_next_timer();
    }
    assert!(
        published.try_recv().is_err(),
        "an idle proxy publishes nothing"
    );
    assert!(h.d.timers.is_empty());
}

#[test]
fn refused_lines_are_retried_after_the_hint_whatever_the_tool() {
    // HTTP 429: the server did not run the call, so even an unannotated
    // tool is sent again, not before the hint; a plain request is answered
    // with the hint for its client.
    let mut h = Harness::with(config(|c| c.retry.base_delay = ms(10)));
    h.client_sends(&call_line(1, "unsafe", "{}"));
    let call = h.to_server();
    h.client_sends(r#"{"jsonrpc":"2.0","id":"w","method":"prompts/list"}"#);
    let list = h.to_server();
    let refused_at = h.now;
    h.server_event(ServerEvent::Refused {
        lines: vec![tagged(&call), tagged(&list)],
        why: "429 Too Many Requests".into(),
        retry_after: Some(Duration::from_secs(2)),
    });
    let e: Value = serde_json::from_str(&h.to_client()).unwrap();
    assert_eq!(e["id"], "w");
    assert_eq!(e["error"]["data"]["retryAfterMs"], json!(2000));
    assert!(e["error"]["message"]
        .as_str()
        .unwrap()
        .contains("429 Too Many Requests"));
    h.nothing_sent();
    let due = h.fire_next_timer();
    assert!(due >= refused_at + Duration::from_secs(2), "{due:?}");
    let again = h.to_server();
    assert!(again.contains(r#""name":"unsafe""#), "{again}");
    assert_ne!(id_of(&again), id_of(&call));
}

#[test]
fn a_refusal_whose_hint_is_past_the_deadline_is_answered_at_once_with_the_hint() {
    // The server asks for 60 s; the call may take 5 s in all: waiting would
    // only fail later, so the client hears now, and when to come back.
    let mut h = Harness::with(config(|c| c.retry.total_timeout = Duration::from_secs(5)));
    h.client_sends(&call_line(1, "t", "{}"));
    let call = h.to_server();
    h.server_event(ServerEvent::Refused {
        lines: vec![tagged(&call)],
        why: "429 Too Many Requests".into(),
        retry_after: Some(Duration::from_secs(60)),
    });
    let e: Value = serde_json::from_str(&h.to_client()).unwrap();
    assert_eq!(e["id"], 1);
    assert_eq!(e["error"]["data"]["retryAfterMs"], json!(60_000), "{e}");
    assert_eq!(e["error"]["data"]["attempts"], json!(1), "{e}");
    h.nothing_sent();
}

/// The proxy's own `tools/list` among what was sent to the server.
fn own_tools_list(h: &Harness) -> Value {
    let sent: Vec<String> = std::iter::from_fn(|| h.try_to_server()).collect();
    let list = sent
        .iter()
        .find(|l| l.contains(r#""method":"tools/list""#))
        .unwrap_or_else(|| panic!("no tools/list in {sent:?}"));
    serde_json::from_str(list).unwrap()
}

#[test]
fn a_modern_client_s_protocol_meta_goes_on_the_proxy_s_own_tools_list() {
    // 2026-07-28: no initialize; each request names its version. The call
    // times out (ambiguous) on a tool whose annotations are unknown: the
    // proxy asks for the tool list the way the client would, or a modern
    // server would refuse it.
    let meta = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"progressToken":"p1"}"#;
    let mut h = Harness::with(config(|_| {}));
    h.client_sends(&format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"lookup","arguments":{{}},"_meta":{meta}}}}}"#
    ));
    let call = h.to_server();
    h.fire_next_timer();
    let list = own_tools_list(&h);
    assert_eq!(
        list["params"],
        json!({"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                         "io.modelcontextprotocol/clientCapabilities": {}}})
    );
    // The list says the tool is read-only: the call is sent again.
    answer(
        &mut h,
        &list.to_string(),
        r#""result":{"tools":[{"name":"lookup","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}}]}"#,
    );
    h.fire_next_timer();
    let again = h.to_server();
    assert!(again.contains(r#""name":"lookup""#), "{again}");
    assert_ne!(id_of(&again), id_of(&call));
}

#[test]
fn a_session_begun_with_initialize_keeps_the_plain_tools_list() {
    // A dual-era client probes with server/discover first, then falls back.
    let mut h = Harness::with(config(|_| {}));
    h.client_sends(
        r#"{"jsonrpc":"2.0","id":"d","method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
    );
    let probe = h.to_server();
    answer(
        &mut h,
        &probe,
        r#""error":{"code":-32601,"message":"Method not found"}"#,
    );
    h.to_client();
    h.client_sends(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#);
    let init = h.to_server();
    answer(
        &mut h,
        &init,
        r#""result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{}}}"#,
    );
    h.to_client();
    h.client_sends(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    h.to_server();
    h.client_sends(
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"lookup","arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
    );
    h.to_server();
    h.fire_next_timer();
    let list = own_tools_list(&h);
    assert_eq!(list["params"], json!({}));
}

/// Initializes the session: the client's `initialize` (answered) and
/// `notifications/initialized`.
fn handshake(h: &mut Harness) {
    h.client_sends(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#);
    let init = h.to_server();
    answer(
        h,
        &init,
        r#""result":{"protocolVersion":"2025-11-25","capabilities":{}}"#,
    );
    h.to_client();
    h.client_sends(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    h.to_server();
}

#[test]
fn the_trial_call_after_the_cooldown_is_sent_even_when_it_waited_for_a_restart() {
    let mut h = Harness::with(config(|c| {
        c.retry.max_retries = 0;
        c.circuit_breaker.failure_threshold = 1;
        c.circuit_breaker.cooldown = 3 * SECOND;
    }));
    handshake(&mut h);
    // A failing call opens the breaker.
    h.client_sends(&call_line(1, "t", "{}"));
    let attempt = h.to_server();
    answer(&mut h, &attempt, TRANSIENT);
    h.to_client();
    assert!(matches!(
        h.d.calls.breaker_state(),
        crate::policy::breaker::BreakerState::Open { .. }
    ));
    // The server dies; the probe restarts it and replays the handshake,
    // which it has not answered yet when the cooldown is over.
    h.server_event(gone("exited with status 1"));
    h.advance(3 * SECOND);
    let replay = h.to_server();
    assert!(replay.contains("initialize"), "{replay}");
    // The first call after the cooldown is the trial: it waits for the
    // restart, then is sent, not refused.
    h.client_sends(&call_line(2, "t", "{}"));
    assert!(h.client.try_recv().is_err(), "it waits");
    answer(
        &mut h,
        &replay,
        r#""result":{"protocolVersion":"2025-11-25","capabilities":{}}"#,
    );
    h.to_server(); // notifications/initialized
    let trial = h.to_server();
    assert!(trial.contains("tools/call"), "{trial}");
    answer(&mut h, &trial, OK);
    assert!(h.to_client().contains("\"ok\""));
    assert_eq!(
        h.d.calls.breaker_state(),
        &crate::policy::breaker::BreakerState::Closed
    );
}

#[test]
fn a_breaker_that_failed_calls_opened_stays_open_when_the_server_comes_back() {
    let mut h = Harness::with(config(|c| {
        c.retry.max_retries = 0;
        c.circuit_breaker.failure_threshold = 1;
        c.circuit_breaker.cooldown = 30 * SECOND;
    }));
    handshake(&mut h);
    h.client_sends(&call_line(1, "t", "{}"));
    let attempt = h.to_server();
    answer(&mut h, &attempt, TRANSIENT);
    h.to_client();
    h.server_event(gone("exited with status 1"));
    h.fire_next_timer();
    let replay = h.to_server();
    answer(
        &mut h,
        &replay,
        r#""result":{"protocolVersion":"2025-11-25","capabilities":{}}"#,
    );
    h.to_server();
    // Up again, but a server that answered errors is trusted again only
    // through a trial call after the cooldown.
    h.client_sends(&call_line(2, "t", "{}"));
    let refused = h.to_client();
    assert!(refused.contains("circuit_open"), "{refused}");
    assert!(h.try_to_server().is_none());
}

#[test]
fn a_request_the_transport_got_no_answer_to_gets_the_proxys_error() {
    let mut h = Harness::new();
    h.client_sends(r#"{"jsonrpc":"2.0","id":"r","method":"resources/read","params":{"uri":"a"}}"#);
    let sent = h.to_server();
    let failed = |may_have_run, status| ServerEvent::Failed {
        id: id_of(&sent).as_u64().unwrap(),
        failure: crate::downstream::Failure {
            message: "the MCP server x answered 502 Bad Gateway".into(),
            status: Some(status),
            may_have_run,
            invalid: false,
        },
    };
    h.server_event(failed(true, 502));
    let e: Value = serde_json::from_str(&h.to_client()).unwrap();
    assert_eq!(e["id"], "r");
    assert_eq!(e["error"]["code"], -31000);
    assert_eq!(e["error"]["data"]["source"], "mcp-retry");
    assert_eq!(e["error"]["data"]["reason"], "transport_error");
    assert_eq!(e["error"]["data"]["httpStatus"], 502);
    assert_eq!(e["error"]["data"]["outcome"], "unknown");
    h.client_sends(r#"{"jsonrpc":"2.0","id":"s","method":"resources/read","params":{"uri":"a"}}"#);
    let sent = h.to_server();
    h.server_event(ServerEvent::Failed {
        id: id_of(&sent).as_u64().unwrap(),
        failure: crate::downstream::Failure {
            message: "the MCP server x answered 403 Forbidden".into(),
            status: Some(403),
            may_have_run: false,
            invalid: false,
        },
    });
    let e: Value = serde_json::from_str(&h.to_client()).unwrap();
    assert_eq!(e["error"]["data"]["reason"], "rejected");
    assert!(e["error"]["data"].get("outcome").is_none());
    h.nothing_sent();
}

#[test]
fn the_proxy_s_own_tool_listing_ends_when_the_server_repeats_its_cursor() {
    // The proxy lists the tools after the handshake, and the server answers
    // every page with the same cursor: the listing ends there, incomplete,
    // instead of asking forever.
    let mut h = Harness::with(config(|_| {}));
    h.client_sends(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#);
    let init = h.to_server();
    let declared = r#""result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{}}}"#;
    answer(&mut h, &init, declared);
    h.to_client();
    h.client_sends(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    h.to_server();
    h.fire_next_timer();
    let first = own_tools_list(&h);
    assert_eq!(first["params"], json!({}));
    let page = r#""result":{"tools":[{"name":"other","inputSchema":{}}],"nextCursor":"again"}"#;
    answer(&mut h, &first.to_string(), page);
    let second = own_tools_list(&h);
    assert_eq!(second["params"], json!({"cursor": "again"}));
    answer(&mut h, &second.to_string(), page);
    // No third page is asked for.
    assert!(h.try_to_server().is_none());
}

// ----- instant start ---------------------------------------------------------------

mod instant_start {
    use super::*;
    use crate::handshake_cache::{CacheJob, Entry};
    use serde_json::value::RawValue;

    const INIT: &str = r#"{"protocolVersion":"2025-11-25","capabilities":{"tools":{},"prompts":{}},"serverInfo":{"name":"cached","version":"1"}}"#;
    const TOOLS: &str = r#"{"tools":[{"name":"old","inputSchema":{"type":"object"}}]}"#;
    const PROMPTS: &str = r#"{"prompts":[{"name":"p"}]}"#;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    /// A dispatcher with instant start and an entry for 2025-11-25.
    fn harness() -> (Harness, Receiver<CacheJob>) {
        harness_with(Harness::new())
    }

    fn harness_with(mut h: Harness) -> (Harness, Receiver<CacheJob>) {
        let mut entry = Entry::new("2025-11-25", raw(INIT));
        entry.tools = Some(raw(TOOLS));
        entry.prompts = Some(raw(PROMPTS));
        let (jobs, got) = crossbeam_channel::unbounded();
        h.d.instant = Some(Box::new(super::super::InstantStart::new(Some(entry), jobs)));
        (h, got)
    }

    /// The client's `initialize`, and the grace the server gets to answer
    /// it gone by.
    fn initialize(h: &mut Harness, version: &str) {
        initialize_now(h, version);
        h.advance(super::super::instant::GRACE);
    }

    fn initialize_now(h: &mut Harness, version: &str) {
        h.client_sends(&format!(
            r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{{"protocolVersion":"{version}","capabilities":{{}},"clientInfo":{{"name":"c","version":"1"}}}}}}"#
        ));
    }

    #[test]
    fn a_server_answering_within_the_grace_gives_the_client_its_own_handshake() {
        let (mut h, jobs) = harness();
        initialize_now(&mut h, "2025-11-25");
        assert!(h.client.try_recv().is_err(), "held for the grace");
        let replay = id_of(&h.to_server());
        h.advance(super::super::instant::GRACE / 2);
        let real = INIT.replace("cached", "real");
        h.server_sends(&format!(
            r#"{{"jsonrpc":"2.0","id":{replay},"result":{real}}}"#
        ));
        let init: Value = serde_json::from_str(&h.to_client()).unwrap();
        assert_eq!(init["id"], 0);
        assert_eq!(init["result"]["serverInfo"]["name"], "real");
        assert!(init["result"]["capabilities"]["tools"]["listChanged"].is_null());
        // The grace's end gives nothing more; the lists are the server's.
        h.advance(super::super::instant::GRACE);
        assert!(h.client.try_recv().is_err(), "answered once");
        h.client_sends(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        h.client_sends(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
        assert!(sent(&h).iter().any(|v| v["method"] == "tools/list"));
        assert!(h.client.try_recv().is_err(), "not from the cache");
        assert!(!h.d.instant.as_ref().unwrap().began_from_cache());
        assert!(jobs.try_recv().is_err(), "nothing stored or removed yet");
    }

    #[test]
    fn a_grace_of_zero_answers_from_the_cache_at_once() {
        let cfg = super::config(|c| c.instant_start_grace = Duration::ZERO);
        let (mut h, _jobs) = harness_with(Harness::with(cfg));
        initialize_now(&mut h, "2025-11-25");
        h.advance(Duration::ZERO);
        let init: Value = serde_json::from_str(&h.to_client()).unwrap();
        assert_eq!(init["id"], 0);
        assert_eq!(init["result"]["serverInfo"]["name"], "cached");
    }

    /// Every line the server was sent so far, parsed.
    fn sent(h: &Harness) -> Vec<Value> {
        std::iter::from_fn(|| h.try_to_server())
            .map(|l| serde_json::from_str(&l).unwrap())
            .collect()
    }

    fn find<'v>(lines: &'v [Value], method: &str) -> &'v Value {
        lines
            .iter()
            .find(|v| v["method"] == method)
            .unwrap_or_else(|| panic!("no {method} in {lines:?}"))
    }

    #[test]
    fn the_handshake_and_lists_come_from_the_cache_until_the_server_answers() {
        let (mut h, jobs) = harness();
        initialize(&mut h, "2025-11-25");
        let init: Value = serde_json::from_str(&h.to_client()).unwrap();
        assert_eq!(init["id"], 0);
        assert_eq!(init["result"]["serverInfo"]["name"], "cached");
        assert_eq!(init["result"]["capabilities"]["tools"]["listChanged"], true);
        assert_eq!(
            init["result"]["capabilities"]["prompts"]["listChanged"],
            true
        );
        // The server gets the client's own initialize, and nothing else yet.
        let first = sent(&h);
        assert_eq!(first.len(), 1, "{first:?}");
        assert_eq!(first[0]["method"], "initialize");
        assert_eq!(first[0]["params"]["clientInfo"]["name"], "c");
        let replay = first[0]["id"].clone();

        h.client_sends(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        h.client_sends(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
        assert_eq!(
            h.to_client(),
            format!(r#"{{"jsonrpc":"2.0","id":1,"result":{TOOLS}}}"#)
        );
        h.client_sends(r#"{"jsonrpc":"2.0","id":2,"method":"prompts/list","params":{}}"#);
        assert_eq!(
            h.to_client(),
            format!(r#"{{"jsonrpc":"2.0","id":2,"result":{PROMPTS}}}"#)
        );
        // A page by cursor, and a call, wait for the server; a ping does not.
        h.client_sends(r#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"cursor":"2"}}"#);
        h.client_sends(r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"old","arguments":{}}}"#);
        h.client_sends(r#"{"jsonrpc":"2.0","id":5,"method":"ping"}"#);
        assert_eq!(h.to_client(), r#"{"jsonrpc":"2.0","id":5,"result":{}}"#);
        h.nothing_sent();

        // The server answers as the cache said.
        h.server_sends(&format!(
            r#"{{"jsonrpc":"2.0","id":{replay},"result":{INIT}}}"#
        ));
        let after = sent(&h);
        let methods: Vec<&str> = after.iter().filter_map(|v| v["method"].as_str()).collect();
        assert_eq!(
            methods
                .iter()
                .filter(|m| **m == "notifications/initialized")
                .count(),
            1,
            "{methods:?}"
        );
        assert_eq!(methods[0], "notifications/initialized", "{methods:?}");
        let call = find(&after, "tools/call");
        let paged = after
            .iter()
            .find(|v| v["method"] == "tools/list" && v["params"]["cursor"] == "2")
            .expect("the client's page");
        let ours = after
            .iter()
            .find(|v| v["method"] == "tools/list" && v["params"].get("cursor").is_none())
            .expect("the proxy reads the tools");
        let prompts = find(&after, "prompts/list");
        assert!(!methods.contains(&"resources/list"), "not declared");

        // The tools changed, the prompts did not.
        let new_tools = r#"{"tools":[{"name":"new","inputSchema":{"type":"object"}}]}"#;
        h.server_sends(&format!(
            r#"{{"jsonrpc":"2.0","id":{},"result":{new_tools}}}"#,
            ours["id"]
        ));
        assert_eq!(
            h.to_client(),
            r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#
        );
        h.server_sends(&format!(
            r#"{{"jsonrpc":"2.0","id":{},"result":{{"prompts":[{{"name":"p"}}]}}}}"#,
            prompts["id"]
        ));
        let Ok(CacheJob::Store(stored)) = jobs.try_recv() else {
            panic!("the entry is stored")
        };
        assert_eq!(stored.protocol_version, "2025-11-25");
        assert_eq!(stored.tools.unwrap().get(), new_tools);
        assert_eq!(stored.prompts.unwrap().get(), PROMPTS);
        assert!(stored.resources.is_none());
        h.nothing_sent();

        // The call and the page went to the server and are answered by it.
        h.server_sends(&format!(
            r#"{{"jsonrpc":"2.0","id":{},"result":{{"content":[]}}}}"#,
            call["id"]
        ));
        assert_eq!(
            h.to_client(),
            r#"{"jsonrpc":"2.0","id":4,"result":{"content":[]}}"#
        );
        h.server_sends(&format!(
            r#"{{"jsonrpc":"2.0","id":{},"result":{{"tools":[]}}}}"#,
            paged["id"]
        ));
        assert_eq!(
            h.to_client(),
            r#"{"jsonrpc":"2.0","id":3,"result":{"tools":[]}}"#
        );
        // From now on the lists are the server's.
        h.client_sends(r#"{"jsonrpc":"2.0","id":6,"method":"prompts/list"}"#);
        assert_eq!(find(&sent(&h), "prompts/list")["method"], "prompts/list");
        assert!(jobs.try_recv().is_err(), "stored once");
    }

    #[test]
    fn another_protocol_version_goes_to_the_server() {
        let (mut h, jobs) = harness();
        initialize(&mut h, "2025-06-18");
        let to_server: Value = serde_json::from_str(&h.to_server()).unwrap();
        assert_eq!(to_server["method"], "initialize");
        h.nothing_sent();
        // The server's answer goes to the client, and its lists are read
        // once the client is initialized.
        let result = INIT.replace("2025-11-25", "2025-06-18");
        h.server_sends(&format!(
            r#"{{"jsonrpc":"2.0","id":{},"result":{result}}}"#,
            to_server["id"]
        ));
        let init: Value = serde_json::from_str(&h.to_client()).unwrap();
        assert_eq!(init["result"]["serverInfo"]["name"], "cached");
        assert!(init["result"]["capabilities"]["tools"]
            .get("listChanged")
            .is_none());
        h.client_sends(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        let after = sent(&h);
        find(&after, "prompts/list");
        assert!(jobs.try_recv().is_err());
    }

    #[test]
    fn a_server_that_contradicts_the_cache_ends_the_session() {
        let (mut h, jobs) = harness();
        initialize(&mut h, "2025-11-25");
        h.to_client();
        let replay = id_of(&h.to_server());
        h.client_sends(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"old","arguments":{}}}"#);
        h.client_sends(
            r#"{"jsonrpc":"2.0","id":2,"method":"resources/read","params":{"uri":"x"}}"#,
        );
        let other = INIT.replace("2025-11-25", "2024-11-05");
        h.server_sends(&format!(
            r#"{{"jsonrpc":"2.0","id":{replay},"result":{other}}}"#
        ));
        let mut answered: Vec<Value> = std::iter::from_fn(|| h.client.try_recv().ok())
            .map(|q| serde_json::from_slice(&q.bytes).unwrap())
            .collect();
        answered.sort_by_key(|v| v["id"].as_u64());
        assert_eq!(answered.len(), 2, "{answered:?}");
        for a in &answered {
            let message = a["error"]["message"].as_str().unwrap();
            assert!(message.contains("2024-11-05"), "{message}");
            assert!(message.contains("(in Claude Code: /mcp)"), "{message}");
            assert_eq!(a["error"]["data"]["source"], "mcp-retry");
        }
        assert!(matches!(jobs.try_recv(), Ok(CacheJob::Invalidate)));
        assert!(h.d.handshake_changed);
        assert!(matches!(
            h.d.phase,
            super::super::Phase::Stopping { signal: None }
        ));
        // Nothing of the session reaches the server.
        assert!(sent(&h).iter().all(|v| v["method"] != "tools/call"));
    }

    #[test]
    fn a_server_that_lost_a_list_keeps_the_session_with_that_list_empty() {
        let (mut h, jobs) = harness();
        initialize(&mut h, "2025-11-25");
        h.to_client();
        let replay = id_of(&h.to_server());
        let fewer = INIT.replace(r#","prompts":{}"#, "");
        h.server_sends(&format!(
            r#"{{"jsonrpc":"2.0","id":{replay},"result":{fewer}}}"#
        ));
        assert_eq!(
            h.to_client(),
            r#"{"jsonrpc":"2.0","method":"notifications/prompts/list_changed"}"#
        );
        h.client_sends(r#"{"jsonrpc":"2.0","id":5,"method":"prompts/list"}"#);
        assert_eq!(
            h.to_client(),
            r#"{"jsonrpc":"2.0","id":5,"result":{"prompts":[]}}"#
        );
        // The session goes on; the entry is not removed.
        assert!(!h.d.handshake_changed);
        assert!(matches!(h.d.phase, super::super::Phase::Running));
        assert!(jobs.try_recv().is_err());
        h.client_sends(r#"{"jsonrpc":"2.0","id":6,"method":"prompts/get","params":{"name":"p"}}"#);
        assert!(
            sent(&h).iter().any(|v| v["method"] == "prompts/get"),
            "the server answers"
        );
    }

    #[test]
    fn a_server_slow_to_answer_its_handshake_gets_the_startup_allowance() {
        let (mut h, _jobs) = harness();
        let t0 = h.now;
        initialize(&mut h, "2025-11-25");
        h.to_client();
        h.to_server();
        let replay_timeouts: Vec<Instant> =
            h.d.timers
                .iter()
                .filter(|Reverse(t)| matches!(t.timer, super::super::Timer::ReplayTimeout { .. }))
                .map(|Reverse(t)| t.at)
                .collect();
        assert_eq!(
            replay_timeouts,
            vec![t0 + super::super::instant::STARTUP_ALLOWANCE],
            "not call_timeout ({:?})",
            h.d.cfg.call_timeout
        );
    }

    #[test]
    fn state_requests_sent_while_the_server_starts_reach_it_once() {
        let (mut h, _jobs) = harness();
        initialize(&mut h, "2025-11-25");
        h.to_client();
        let replay = h.to_server();
        let replay: Value = serde_json::from_str(&replay).unwrap();
        h.client_sends(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        h.client_sends(
            r#"{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":"debug"}}"#,
        );
        h.client_sends(r#"{"jsonrpc":"2.0","id":2,"method":"resources/subscribe","params":{"uri":"file:///a"}}"#);
        h.nothing_sent();
        h.server_sends(&format!(
            r#"{{"jsonrpc":"2.0","id":{},"result":{INIT}}}"#,
            replay["id"]
        ));
        let after = sent(&h);
        let count = |method: &str| after.iter().filter(|v| v["method"] == method).count();
        assert_eq!(count("logging/setLevel"), 1, "{after:?}");
        assert_eq!(count("resources/subscribe"), 1, "{after:?}");
        // The client's own, each answered once under its id.
        for (id, method) in [(1, "logging/setLevel"), (2, "resources/subscribe")] {
            let sent = find(&after, method);
            h.server_sends(&format!(
                r#"{{"jsonrpc":"2.0","id":{},"result":{{}}}}"#,
                sent["id"]
            ));
            assert_eq!(
                h.to_client(),
                format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#)
            );
        }
    }
}
