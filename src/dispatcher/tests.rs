//! In-process tests of the dispatcher: events go in through `handle_event`,
//! and what it writes to the client and to a fake server comes out of
//! channels. No threads, no processes.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use serde_json::{json, Value};

use super::{Dispatcher, Event};
use crate::child::ExitInfo;
use crate::config::ServerConfig;
use crate::downstream::{Downstream, ServerEvent};
use crate::jsonrpc;
use crate::stdio::Outbox;

struct FakeServer {
    sent: Sender<Vec<u8>>,
}

impl Downstream for FakeServer {
    fn send(&mut self, line: Vec<u8>) -> bool {
        self.sent.send(line).is_ok()
    }
    fn close_input(&mut self) {}
    fn terminate(&mut self) {}
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
    client: Receiver<Vec<u8>>,
    server: Receiver<Vec<u8>>,
    now: Instant,
}

impl Harness {
    fn new() -> Harness {
        let (to_client, client) = Outbox::to_channel();
        let (events, _inbox) = crossbeam_channel::unbounded();
        let (sent, server) = crossbeam_channel::unbounded();
        let connect = Box::new(move |_: &ServerConfig, _: u64, _: Sender<Event>| {
            Ok(Box::new(FakeServer { sent: sent.clone() }) as Box<dyn Downstream>)
        });
        let cfg = ServerConfig::with_defaults("t", "fake".into(), vec![]);
        let mut d = Dispatcher::new(cfg, to_client, events, connect);
        let now = Instant::now();
        d.start_server(now);
        Harness {
            d,
            client,
            server,
            now,
        }
    }

    fn client_sends(&mut self, line: &str) {
        let parsed = jsonrpc::classify(line.to_owned());
        self.d.handle_event(Event::Client(parsed), self.now);
    }

    fn server_sends(&mut self, line: &str) {
        self.server_event(ServerEvent::Message(jsonrpc::classify(line.to_owned())));
    }

    fn server_event(&mut self, event: ServerEvent) {
        let generation = self.d.generation;
        self.d
            .handle_event(Event::Server { generation, event }, self.now);
    }

    fn after(&mut self, d: Duration) {
        self.now += d;
        let now = self.now;
        self.d.fire_timers(now);
    }

    fn to_server(&self) -> String {
        let line = self.server.try_recv().expect("a line for the server");
        String::from_utf8(line).unwrap().trim_end().to_owned()
    }

    fn to_client(&self) -> String {
        let line = self.client.try_recv().expect("a line for the client");
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

const EXIT_0: ExitInfo = ExitInfo {
    code: Some(0),
    signal: None,
};

#[test]
fn an_exited_server_is_gone_only_when_its_stdout_ends() {
    let mut h = Harness::new();
    h.client_sends(r#"{"jsonrpc":"2.0","id":"a","method":"resources/read","params":{"uri":"x"}}"#);
    let down = id_of(&h.to_server());
    h.server_event(ServerEvent::Exited(EXIT_0));
    // Its answer is still in the pipe; the reader is busy, time passes.
    h.after(Duration::from_secs(5));
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
    h.server_event(ServerEvent::StdoutClosed);
    h.after(Duration::ZERO);
    let line = h.to_server();
    assert!(line.contains(r#""uri":"y""#), "{line}");
    h.nothing_sent();
}

#[test]
fn an_exited_servers_stdout_that_stays_open_and_idle_is_given_up() {
    let mut h = Harness::new();
    h.client_sends(r#"{"jsonrpc":"2.0","id":"a","method":"resources/read","params":{"uri":"x"}}"#);
    h.to_server();
    h.server_event(ServerEvent::Exited(EXIT_0));
    h.after(Duration::from_secs(6));
    // Something arrives: the idle clock starts again.
    h.server_sends(r#"{"jsonrpc":"2.0","method":"notifications/message","params":{}}"#);
    h.to_client();
    h.after(Duration::from_secs(6));
    h.nothing_sent();
    let generation = h.d.generation;
    h.after(Duration::from_secs(5));
    // Given up on: the read is sent again to a new server.
    assert_eq!(h.d.generation, generation + 1);
    let line = h.to_server();
    assert!(line.contains(r#""uri":"x""#), "{line}");
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
