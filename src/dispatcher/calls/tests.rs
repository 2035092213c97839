//! Unit tests of [`Calls`] on a fake clock: an event goes in with a
//! [`Ctx`], the state moves, and the actions that come out are checked. One
//! test per transition the dispatcher tests do not pin down on their own
//! (timeouts, pauses, progress, late answers, cancels, the tool list, link
//! loss, the queue, the retry bounds), with no dispatcher, link or thread.

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Action, Arrival, CallTimer, Calls, Ctx, First, LinkView, Owner};
use crate::config::{ServerConfig, ToolConfig};
use crate::dispatcher::{CallError, CallOutcome, Reason};
use crate::jsonrpc::Message;

const SECOND: Duration = Duration::from_secs(1);

/// The calls of a server with the defaults, `edit`ed, and no jitter.
struct Harness {
    calls: Calls,
    now: Instant,
    link: LinkView,
    /// The next downstream id the "dispatcher" hands out.
    next_down: u64,
}

impl Harness {
    fn new(edit: impl FnOnce(&mut ServerConfig)) -> Harness {
        let mut cfg = ServerConfig::with_defaults("srv", "fake".into(), vec![]);
        cfg.retry.jitter = 0.0;
        cfg.retry.base_delay = SECOND;
        edit(&mut cfg);
        Harness {
            calls: Calls::new(Arc::new(cfg)).with_seed(7),
            now: Instant::now(),
            // A running server whose client finished its handshake.
            link: LinkView {
                ready: true,
                reachable: true,
                initialized: true,
                generation: 1,
                paused: false,
            },
            next_down: 100,
        }
    }

    fn ctx(&self) -> Ctx {
        Ctx {
            now: self.now,
            link: self.link,
            tracing: false,
            attempt_id: self.next_down + 1,
        }
    }

    /// Runs `f` on the calls and returns what it pushed.
    fn run<R>(
        &mut self,
        f: impl FnOnce(&mut Calls, Ctx, &mut Vec<Action>) -> R,
    ) -> (R, Vec<Action>) {
        let mut out = Vec::new();
        let ctx = self.ctx();
        let r = f(&mut self.calls, ctx, &mut out);
        (r, out)
    }

    /// Client `client` calls `tool` with `args`.
    fn arrive(&mut self, client: &str, tool: &str, args: &str) -> (Arrival, Vec<Action>) {
        let m = request(client, tool, args);
        self.run(|c, ctx, out| c.arrive(m.clone(), parsed_call(&m), client.into(), ctx, out))
    }

    /// Admits and sends the next attempt of call `id` as the dispatcher
    /// does when the link says send; returns its downstream id.
    fn attempt(&mut self, id: u64) -> u64 {
        let (admitted, out) = self.run(|c, ctx, out| c.admit(id, ctx, out));
        assert!(admitted && out.is_empty(), "{out:?}");
        self.next_down += 1;
        let down = self.next_down;
        let (sent, out) = self.run(|c, ctx, out| c.send(id, down, None, ctx, out));
        assert!(
            matches!(
                &out[..],
                [Action::Timer(_, CallTimer::AttemptTimeout { .. })]
            ),
            "{out:?}"
        );
        assert_eq!(sent.and_then(|s| s.request_id()), Some(down));
        down
    }

    /// A new call of `client` whose first attempt is sent: its id and the
    /// attempt's downstream id.
    fn started(&mut self, client: &str, tool: &str, args: &str) -> (u64, u64) {
        let (arrival, out) = self.arrive(client, tool, args);
        let Arrival::Started(id) = arrival else {
            panic!("not started: {arrival:?}");
        };
        assert!(out.is_empty(), "{out:?}");
        (id, self.attempt(id))
    }

    /// A call of `client` to the safe tool `t` whose first attempt timed
    /// out (after the default 60 s) and whose retry was sent a second
    /// later: the call, its first and its second downstream ids.
    fn timed_out_and_retried(&mut self, client: &str) -> (u64, u64, u64) {
        let (id, first) = self.started(client, "t", "{}");
        self.now += 60 * SECOND;
        self.timer(CallTimer::AttemptTimeout {
            call: id,
            down: first,
        });
        self.now += SECOND;
        assert_eq!(self.timer(CallTimer::RetryDue { call: id }).0, Some(id));
        (id, first, self.attempt(id))
    }

    /// The server answers downstream request `down` with `body`.
    fn answer(&mut self, down: u64, body: &str) -> (Owner, Vec<Action>) {
        let m = message(&format!(r#"{{"jsonrpc":"2.0","id":{down},{body}}}"#));
        self.run(|c, ctx, out| c.on_answer(down, m, ctx, out))
    }

    fn timer(&mut self, t: CallTimer) -> (Option<u64>, Vec<Action>) {
        self.run(|c, ctx, out| c.on_timer(t, ctx, out))
    }
}

fn message(line: &str) -> Message {
    Message::reparse(line.to_owned()).expect("a valid message")
}

fn request(client: &str, tool: &str, args: &str) -> Message {
    message(&format!(
        r#"{{"jsonrpc":"2.0","id":{client},"method":"tools/call","params":{{"name":"{tool}","arguments":{args}}}}}"#
    ))
}

fn tool(edit: impl FnOnce(&mut ToolConfig)) -> ToolConfig {
    let mut t = ToolConfig::default();
    edit(&mut t);
    t
}

/// The answers among `out`, by client, as JSON.
fn answers(out: &[Action]) -> Vec<(String, Value)> {
    out.iter()
        .filter_map(|a| match a {
            Action::Answer { client, line } => {
                Some((client.to_string(), serde_json::from_slice(line).unwrap()))
            }
            _ => None,
        })
        .collect()
}

/// The one answer among `out`, for `client`.
fn answer_for(out: &[Action], client: &str) -> Value {
    let mut a = answers(out);
    assert_eq!(a.len(), 1, "{out:?}");
    let (to, v) = a.pop().unwrap();
    assert_eq!(to, client);
    v
}

/// The timers among `out`.
fn timers(out: &[Action]) -> Vec<(Instant, CallTimer)> {
    out.iter()
        .filter_map(|a| match a {
            Action::Timer(at, t) => Some((*at, *t)),
            _ => None,
        })
        .collect()
}

/// The downstream cancels among `out`, with their reasons.
fn cancels(out: &[Action]) -> Vec<(u64, String)> {
    out.iter()
        .filter_map(|a| match a {
            Action::Cancel { down, reason, .. } => Some((*down, reason.to_string())),
            _ => None,
        })
        .collect()
}

const OK: &str = r#""result":{"content":[{"type":"text","text":"ok"}]}"#;
const TRANSIENT: &str = r#""error":{"code":-32000,"message":"busy"}"#;

#[test]
fn an_attempts_method_is_not_allocated() {
    let mut h = Harness::new(|_| {});
    h.arrive("11", "t", "{}");
    h.run(|c, ctx, out| c.admit(1, ctx, out));
    let (attempt, _) = h.run(|c, ctx, out| c.send(1, 42, None, ctx, out));
    let attempt = attempt.expect("an attempt");
    assert!(
        matches!(
            attempt.kind,
            crate::downstream::OutKind::Request {
                method: std::borrow::Cow::Borrowed("tools/call"),
                ..
            }
        ),
        "{:?}",
        attempt.kind
    );
}

#[test]
fn a_call_is_sent_under_its_timeout_and_ends_with_the_servers_answer() {
    let mut h = Harness::new(|c| c.call_timeout = 30 * SECOND);
    let t0 = h.now;
    let (arrival, _) = h.arrive("11", "t", r#"{"a":1}"#);
    assert!(matches!(arrival, Arrival::Started(1)), "{arrival:?}");
    let (admitted, _) = h.run(|c, ctx, out| c.admit(1, ctx, out));
    assert!(admitted);
    let (attempt, out) = h.run(|c, ctx, out| c.send(1, 42, None, ctx, out));
    let [Action::Timer(at, timer)] = &out[..] else {
        panic!("{out:?}");
    };
    assert_eq!(
        (*at, *timer),
        (
            t0 + 30 * SECOND,
            CallTimer::AttemptTimeout { call: 1, down: 42 }
        )
    );
    let attempt = attempt.expect("an attempt");
    assert_eq!(attempt.request_id(), Some(42));
    assert_eq!(attempt.method(), Some("tools/call"));
    let sent: Value = serde_json::from_slice(&attempt.bytes).unwrap();
    assert_eq!(sent["id"], 42);
    assert_eq!(sent["params"]["arguments"]["a"], 1);

    h.now += 250 * Duration::from_millis(1);
    let (owner, out) = h.answer(42, OK);
    assert_eq!(owner, Owner::Served);
    assert_eq!(answer_for(&out, "11")["result"]["content"][0]["text"], "ok");
    let figures = &h.calls.stats().tools["t"];
    assert_eq!(figures.latency.count(), 1);
    assert_eq!(figures.latency.sum(), Duration::from_millis(250));
    assert!(figures.failed_by_reason.is_empty());
    assert_eq!(h.calls.len(), 0);
    assert_eq!(h.calls.stats().tools["t"].counters.attempts, 1);
    // The id is forgotten once answered.
    assert_eq!(h.answer(42, OK).0, Owner::Unknown);
}

#[test]
fn an_identical_call_joins_the_one_in_flight_and_gets_its_answer() {
    let mut h = Harness::new(|_| {});
    let (id, down) = h.started("11", "t", r#"{"a":1}"#);
    let (arrival, out) = h.arrive("12", "t", r#"{"a":1}"#);
    assert!(
        matches!(arrival, Arrival::Joined(Some(i)) if i == id),
        "{arrival:?}"
    );
    assert!(out.is_empty(), "{out:?}");
    let (_, out) = h.answer(down, OK);
    let a = answers(&out);
    assert_eq!(a.len(), 2, "{out:?}");
    assert_eq!(a[0].0, "11");
    assert_eq!(a[1].0, "12");
    assert_eq!(a[1].1["result"]["_meta"]["mcp-retry/source"], "dedup");
    assert_eq!(h.calls.stats().tools["t"].counters.dedup_hits, 1);
}

#[test]
fn a_timed_out_attempt_of_a_safe_tool_is_cancelled_and_retried_after_the_backoff() {
    let mut h = Harness::new(|c| {
        c.tools
            .insert("t".into(), tool(|t| t.idempotent = Some(true)));
    });
    let t0 = h.now;
    let (id, down) = h.started("11", "t", "{}");
    let timeout = CallTimer::AttemptTimeout { call: id, down };
    // Early: nothing happens.
    h.now = t0 + 59 * SECOND;
    let (_, out) = h.timer(timeout);
    assert_eq!(timers(&out), [(t0 + 60 * SECOND, timeout)]);
    h.now = t0 + 60 * SECOND;
    let (due, out) = h.timer(timeout);
    assert_eq!(due, None);
    assert_eq!(cancels(&out), [(down, "timed out (mcp-retry)".to_owned())]);
    let retry = CallTimer::RetryDue { call: id };
    assert_eq!(timers(&out), [(h.now + SECOND, retry)]);
    assert!(answers(&out).is_empty());
    // Not before it is due, then the dispatcher is told to start it.
    assert_eq!(h.timer(retry).0, None);
    h.now += SECOND;
    assert_eq!(h.timer(retry).0, Some(id));
    let again = h.attempt(id);
    assert_ne!(again, down);
}

#[test]
fn an_unsafe_tool_is_not_retried_and_its_late_success_answers_the_next_identical_call_once() {
    let mut h = Harness::new(|_| {});
    // The client has not finished its handshake: the tool list cannot be
    // asked, so the unannotated tool is unsafe.
    h.link.initialized = false;
    let (id, down) = h.started("11", "write", r#"{"x":1}"#);
    h.now += 60 * SECOND;
    let (_, out) = h.timer(CallTimer::AttemptTimeout { call: id, down });
    assert_eq!(cancels(&out).len(), 1);
    let e = answer_for(&out, "11");
    assert_eq!(
        e["error"]["data"]["reason"],
        Reason::NotRetriedUnsafe.as_str()
    );
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("it may or may not have run"),
        "{e}"
    );
    assert_eq!(h.calls.len(), 0);
    // The tool did run: its success comes late and is kept.
    let (owner, out) = h.answer(down, OK);
    assert_eq!(owner, Owner::Known);
    assert!(out.is_empty(), "{out:?}");
    let (arrival, out) = h.arrive("12", "write", r#"{"x":1}"#);
    assert!(matches!(arrival, Arrival::Answered), "{arrival:?}");
    let replayed = answer_for(&out, "12");
    assert_eq!(replayed["result"]["_meta"]["mcp-retry/source"], "dedup");
    // Once: the next identical call runs.
    let (arrival, _) = h.arrive("13", "write", r#"{"x":1}"#);
    assert!(matches!(arrival, Arrival::Started(_)), "{arrival:?}");
}

#[test]
fn while_the_server_waits_for_a_person_an_attempt_keeps_its_time() {
    let mut h = Harness::new(|c| c.call_timeout = 10 * SECOND);
    let t0 = h.now;
    let (id, down) = h.started("11", "t", "{}");
    let timeout = CallTimer::AttemptTimeout { call: id, down };
    // A sampling request arrived at t0 + 4 s and is still open at the
    // deadline: the timer moves to the call's total deadline.
    h.link.paused = true;
    h.now = t0 + 10 * SECOND;
    let (_, out) = h.timer(timeout);
    assert_eq!(timers(&out), [(t0 + 120 * SECOND, timeout)]);
    assert!(cancels(&out).is_empty());
    // Answered at t0 + 14 s: the 10 s since the pause are given back.
    h.link.paused = false;
    h.now = t0 + 14 * SECOND;
    let since = t0 + 4 * SECOND;
    let (_, out) = h.run(|c, ctx, out| c.resume_clocks(since, ctx, out));
    assert_eq!(timers(&out), [(t0 + 20 * SECOND, timeout)]);
    h.now = t0 + 20 * SECOND;
    let (_, out) = h.timer(timeout);
    assert_eq!(cancels(&out).len(), 1, "{out:?}");
}

#[test]
fn progress_keeps_an_attempt_alive_and_reaches_the_client_when_it_advances() {
    let mut h = Harness::new(|c| c.call_timeout = 10 * SECOND);
    let t0 = h.now;
    let m = message(
        r#"{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"t","_meta":{"progressToken":"p"}}}"#,
    );
    let (arrival, _) =
        h.run(|c, ctx, out| c.arrive(m.clone(), parsed_call(&m), "11".into(), ctx, out));
    let Arrival::Started(id) = arrival else {
        panic!("{arrival:?}");
    };
    let down = h.attempt(id);
    let progress = |value: u32, token: &str| {
        message(&format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":{token},"progress":{value}}}}}"#
        ))
    };
    h.now = t0 + 8 * SECOND;
    let p = progress(1, r#""p""#);
    let (mine, out) = h.run(|c, ctx, out| c.on_progress(&p, ctx, out));
    assert!(mine);
    assert!(matches!(&out[..], [Action::Notify(_)]), "{out:?}");
    // The same value again is not forwarded; another token is not ours.
    let (mine, out) = h.run(|c, ctx, out| c.on_progress(&p, ctx, out));
    assert!(mine && out.is_empty(), "{out:?}");
    let other = progress(2, r#""q""#);
    assert!(!h.run(|c, ctx, out| c.on_progress(&other, ctx, out)).0);
    // The first deadline passes: the timer is set again, 10 s after the
    // progress.
    h.now = t0 + 10 * SECOND;
    let timeout = CallTimer::AttemptTimeout { call: id, down };
    let (_, out) = h.timer(timeout);
    assert_eq!(timers(&out), [(t0 + 18 * SECOND, timeout)]);
}

#[test]
fn a_late_answer_of_an_abandoned_attempt_wins_and_the_live_one_is_cancelled() {
    let mut h = Harness::new(|c| {
        c.tools
            .insert("t".into(), tool(|t| t.idempotent = Some(true)));
    });
    let (_, first, second) = h.timed_out_and_retried("11");
    let (owner, out) = h.answer(first, OK);
    assert_eq!(owner, Owner::Served);
    assert_eq!(
        cancels(&out),
        [(
            second,
            "superseded by an earlier attempt's answer".to_owned()
        )]
    );
    assert!(answer_for(&out, "11")["result"].is_object());
    // The cancelled attempt's answer, should it come, is nobody's.
    assert_eq!(h.answer(second, OK).0, Owner::Unknown);
}

#[test]
fn a_cancelled_call_goes_on_for_a_joined_client_and_is_dropped_when_nobody_waits() {
    let mut h = Harness::new(|_| {});
    let (id, down) = h.started("11", "t", "{}");
    h.arrive("12", "t", "{}");
    let (_, out) = h.run(|c, ctx, out| c.cancel_member(id, "11", "bored", ctx, out));
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(h.calls.len(), 1);
    let (_, out) = h.run(|c, ctx, out| c.cancel_member(id, "12", "bored too", ctx, out));
    assert_eq!(cancels(&out), [(down, "bored too".to_owned())]);
    assert!(answers(&out).is_empty());
    assert_eq!(h.calls.len(), 0);
}

#[test]
fn an_unannotated_tool_waits_for_the_tool_list_and_is_retried_if_it_says_read_only() {
    let mut h = Harness::new(|_| {});
    let t0 = h.now;
    let (id, down) = h.started("11", "lookup", "{}");
    let (_, out) = h.answer(down, TRANSIENT);
    assert!(answers(&out).is_empty(), "{out:?}");
    assert_eq!(
        timers(&out),
        [(t0 + 120 * SECOND, CallTimer::CallDeadline { call: id })]
    );
    assert!(
        matches!(out.last(), Some(Action::ListTools { cursor: None })),
        "{out:?}"
    );
    // A second failure of another call asks for nothing more.
    let (_, other) = h.started("12", "lookup", r#"{"n":2}"#);
    let (_, out) = h.answer(other, TRANSIENT);
    assert!(!out.iter().any(|a| matches!(a, Action::ListTools { .. })));
    let list =
        r#"{"tools":[{"name":"lookup","inputSchema":{},"annotations":{"readOnlyHint":true}}]}"#;
    let (_, out) = h.run(|c, ctx, out| c.learn_tools(list, true, false, ctx, out));
    let retries: Vec<CallTimer> = timers(&out).into_iter().map(|(_, t)| t).collect();
    assert_eq!(
        retries,
        [
            CallTimer::RetryDue { call: id },
            CallTimer::RetryDue { call: 2 }
        ]
    );
    // The parked calls' deadlines now find nothing to decide.
    let (_, out) = h.timer(CallTimer::CallDeadline { call: id });
    assert!(out.is_empty(), "{out:?}");
}

#[test]
fn a_tool_list_that_cannot_be_had_leaves_the_parked_call_unsafe() {
    let mut h = Harness::new(|_| {});
    let (_, down) = h.started("11", "write", "{}");
    h.answer(down, TRANSIENT);
    let (_, out) = h.run(|c, ctx, out| c.tools_learned(false, ctx, out));
    let e = answer_for(&out, "11");
    // The server's own error, which says more than the proxy's.
    assert_eq!(e["error"]["message"], "busy");
    assert_eq!(h.calls.len(), 0);
}

#[test]
fn an_attempt_that_never_left_is_retried_whatever_the_tool() {
    let mut h = Harness::new(|_| {});
    h.link.initialized = false;
    let (id, down) = h.started("11", "write", "{}");
    let (_, out) = h.run(|c, ctx, out| c.attempt_unsent(down, ctx, out));
    // It goes again at once (waiting for the server if it is down), and
    // that is no retry: the server never had it.
    assert_eq!(timers(&out), [(h.now, CallTimer::RetryDue { call: id })]);
    assert_eq!(h.calls.calls[&id].attempts, 0);
    // Nor is it counted as sent.
    assert_eq!(h.calls.stats().tools["write"].counters.attempts, 0);
    // The same for attempts in flight on a link that the transport knows
    // never delivered them.
    let (id, _) = h.started("12", "write", r#"{"n":2}"#);
    let (_, out) = h.run(|c, ctx, out| c.on_link_lost("gone", false, false, ctx, out));
    assert_eq!(timers(&out), [(h.now, CallTimer::RetryDue { call: id })]);
}

#[test]
fn a_lost_link_makes_an_unsafe_calls_outcome_unknown_and_forgets_its_attempts() {
    let mut h = Harness::new(|_| {});
    h.link.initialized = false;
    let (_, down) = h.started("11", "write", "{}");
    h.link.ready = false;
    let (_, out) = h.run(|c, ctx, out| c.on_link_lost("crashed", true, false, ctx, out));
    let e = answer_for(&out, "11");
    assert_eq!(e["error"]["data"]["reason"], Reason::ServerExited.as_str());
    assert_eq!(e["error"]["data"]["outcome"], "unknown");
    // No late answer comes from a server that is gone.
    assert_eq!(h.answer(down, OK).0, Owner::Unknown);
}

#[test]
fn a_queued_call_that_ends_leaves_the_queue() {
    let mut h = Harness::new(|_| {});
    let (arrival, _) = h.arrive("11", "t", "{}");
    let Arrival::Started(id) = arrival else {
        panic!("{arrival:?}");
    };
    h.calls.queued(id, 5);
    // Queued: no second attempt is admitted meanwhile.
    assert!(!h.run(|c, ctx, out| c.admit(id, ctx, out)).0);
    let error = CallError::proxy(Reason::ServerUnavailable, "m", &[]);
    let (_, out) = h.run(|c, ctx, out| c.fail(id, &error, ctx, out));
    let figures = &h.calls.stats().tools["t"];
    assert_eq!(figures.failed_by_reason["server_unavailable"], 1);
    assert_eq!(figures.last_error.as_ref().map(|e| e.0.as_str()), Some("m"));
    assert!(matches!(out.first(), Some(Action::Unqueue(5))), "{out:?}");
    assert_eq!(answer_for(&out, "11")["error"]["message"], "m");
    assert!(!h.calls.unqueued(id));
}

#[test]
fn a_retry_after_the_total_deadline_or_over_the_budget_is_not_made() {
    let mut h = Harness::new(|c| {
        c.retry.total_timeout = 2 * SECOND;
        c.tools
            .insert("t".into(), tool(|t| t.idempotent = Some(true)));
    });
    let (id, down) = h.started("11", "t", "{}");
    let (_, out) = h.answer(down, TRANSIENT);
    assert_eq!(timers(&out).len(), 1, "{out:?}");
    h.now += SECOND;
    assert_eq!(h.timer(CallTimer::RetryDue { call: id }).0, Some(id));
    let down = h.attempt(id);
    // The next delay, 2 s, ends after the 2 s the call has in all.
    let (_, out) = h.answer(down, TRANSIENT);
    let e = answer_for(&out, "11");
    assert_eq!(e["error"]["message"], "busy");

    let mut h = Harness::new(|c| {
        c.retry.budget.min_retries = 0;
        c.retry.budget.ratio = 0.0;
        c.tools
            .insert("t".into(), tool(|t| t.idempotent = Some(true)));
    });
    let (_, down) = h.started("11", "t", "{}");
    let (_, out) = h.answer(down, TRANSIENT);
    assert!(timers(&out).is_empty(), "{out:?}");
    assert_eq!(answer_for(&out, "11")["error"]["message"], "busy");
}

#[test]
fn an_answer_too_large_ends_the_call_and_an_abandoned_attempts_is_ignored() {
    let mut h = Harness::new(|c| {
        c.tools
            .insert("t".into(), tool(|t| t.idempotent = Some(true)));
    });
    let (_, first, second) = h.timed_out_and_retried("11");
    let (owner, out) = h.run(|c, ctx, out| {
        c.on_unusable_answer(first, Reason::ResponseTooLarge, "too large", ctx, out)
    });
    assert_eq!((owner, out.len()), (Owner::Known, 0), "{out:?}");
    let (owner, out) = h.run(|c, ctx, out| {
        c.on_unusable_answer(second, Reason::ResponseTooLarge, "too large", ctx, out)
    });
    assert_eq!(owner, Owner::Served);
    let e = answer_for(&out, "11");
    assert_eq!(
        e["error"]["data"]["reason"],
        Reason::ResponseTooLarge.as_str()
    );
    assert!(timers(&out).is_empty(), "not retried: {out:?}");
}

#[test]
fn a_breaker_trial_answered_from_the_stale_cache_frees_the_trial() {
    let mut h = Harness::new(|c| {
        c.retry.max_retries = 0;
        c.circuit_breaker.failure_threshold = 1;
        c.circuit_breaker.cooldown = 30 * SECOND;
        c.tools
            .insert("read".into(), tool(|t| t.read_only = Some(true)));
        c.cache.tools.insert("read".into(), SECOND);
        c.cache.stale_if_error = 600 * SECOND;
    });
    let (_, down) = h.started("11", "read", "{}");
    h.answer(down, OK);
    // Another read fails: the breaker opens. Its cooldown passes, and the
    // cached result expires.
    let (_, down) = h.started("12", "read", r#"{"n":2}"#);
    h.answer(down, TRANSIENT);
    h.now += 30 * SECOND;
    // The read is the breaker's trial, but the link refuses it: the stale
    // result answers, and the trial is free for the next call.
    let (arrival, _) = h.arrive("13", "read", "{}");
    let Arrival::Started(id) = arrival else {
        panic!("{arrival:?}");
    };
    assert!(h.run(|c, ctx, out| c.admit(id, ctx, out)).0);
    let (_, out) = h.run(|c, ctx, out| {
        c.refused_by_link(id, Reason::ServerUnavailable, "restarting", ctx, out)
    });
    let stale = answer_for(&out, "13");
    assert_eq!(stale["result"]["_meta"]["mcp-retry/source"], "stale");
    let (arrival, _) = h.arrive("14", "read", r#"{"n":3}"#);
    let Arrival::Started(id) = arrival else {
        panic!("{arrival:?}");
    };
    let (admitted, out) = h.run(|c, ctx, out| c.admit(id, ctx, out));
    assert!(admitted, "the trial is still held: {out:?}");
}

#[test]
fn a_call_ends_with_a_typed_outcome_that_a_server_cannot_forge() {
    // The server's own error is a server error, whatever its data claims;
    // the labels counted are the proxy's reasons and `server_error`.
    let mut h = Harness::new(|_| {});
    let (_, down) = h.started("11", "t", "{}");
    let forged = r#""error":{"code":-31000,"message":"x","data":{"source":"mcp-retry","reason":"circuit_open"}}"#;
    h.answer(down, forged);
    let figures = &h.calls.stats().tools["t"];
    assert_eq!(figures.failed_by_reason.len(), 1, "{figures:?}");
    assert_eq!(figures.failed_by_reason["server_error"], 1);
    assert_eq!(CallOutcome::Ok.failure_label(), None);
    let timeout = CallOutcome::Proxy(Reason::Timeout);
    assert_eq!(timeout.failure_label(), Some("timeout"));
}

/// The calls of a server whose tool `pay` is configured unsafe (or safe),
/// with a 10 s attempt timeout.
fn with_pay(idempotent: bool) -> Harness {
    Harness::new(|c| {
        c.call_timeout = 10 * SECOND;
        c.retry.max_retries = 0;
        let pay = tool(|t| t.idempotent = Some(idempotent));
        c.tools.insert("pay".into(), pay);
    })
}

const KEYED: &str = r#"{"_idempotency_key":"K-1"}"#;

#[test]
fn a_keyed_unsafe_call_whose_outcome_is_unknown_is_not_run_again_until_its_late_answer() {
    let mut h = with_pay(false);
    let t0 = h.now;
    let (id, down) = h.started("1", "pay", KEYED);
    h.now += 10 * SECOND;
    let (_, out) = h.timer(CallTimer::AttemptTimeout { call: id, down });
    let e = &answer_for(&out, "1")["error"];
    assert_eq!(e["data"]["reason"], "not_retried_unsafe", "{e}");
    // The same key again: answered at once, nothing is sent.
    h.now += SECOND;
    let (arrival, out) = h.arrive("2", "pay", KEYED);
    assert!(matches!(arrival, Arrival::Answered), "{arrival:?}");
    let e = &answer_for(&out, "2")["error"];
    assert_eq!(e["data"]["reason"], "earlier_attempt_unknown", "{e}");
    assert_eq!(e["data"]["outcome"], "unknown", "{e}");
    assert_eq!(e["data"]["cause"], "timeout", "{e}");
    assert_eq!(e["data"]["startedMsAgo"], 11_000, "{e}");
    assert_eq!(h.calls.len(), 0);
    let figures = &h.calls.stats().tools["pay"];
    assert_eq!(figures.failed_by_reason["earlier_attempt_unknown"], 1);
    let unknown = &h.calls.stats().unknown;
    assert_eq!(unknown.len(), 1);
    assert_eq!(
        (unknown[0].key.as_str(), unknown[0].cause),
        ("K-1", "timeout")
    );
    assert_eq!(unknown[0].started, t0);
    // The first attempt's success comes late: it is the outcome.
    assert_eq!(h.answer(down, OK).0, Owner::Known);
    assert!(h.calls.stats().unknown.is_empty());
    let (arrival, out) = h.arrive("3", "pay", KEYED);
    assert!(matches!(arrival, Arrival::Answered), "{arrival:?}");
    let r = &answer_for(&out, "3")["result"];
    assert_eq!(r["content"][0]["text"], "ok", "{r}");
    assert_eq!(r["_meta"]["mcp-retry/source"], "dedup", "{r}");
}

#[test]
fn a_cancelled_keyed_call_is_marked_and_a_late_error_lifts_the_mark() {
    let mut h = with_pay(false);
    let (id, down) = h.started("1", "pay", KEYED);
    let (_, out) = h.run(|c, ctx, out| c.cancel_member(id, "1", "the user stopped it", ctx, out));
    assert_eq!(
        cancels(&out),
        vec![(down, "the user stopped it".to_owned())]
    );
    let (_, out) = h.arrive("2", "pay", KEYED);
    let e = &answer_for(&out, "2")["error"];
    assert_eq!(e["data"]["cause"], "cancelled", "{e}");
    // The server says it failed: the outcome is known, the key runs again.
    assert_eq!(h.answer(down, TRANSIENT).0, Owner::Known);
    assert!(h.calls.stats().unknown.is_empty());
    let (arrival, _) = h.arrive("3", "pay", KEYED);
    assert!(matches!(arrival, Arrival::Started(_)), "{arrival:?}");
}

#[test]
fn a_keyed_call_of_a_safe_tool_or_without_an_attempt_is_not_marked() {
    let mut h = with_pay(true);
    let (id, down) = h.started("1", "pay", KEYED);
    h.now += 10 * SECOND;
    let (_, out) = h.timer(CallTimer::AttemptTimeout { call: id, down });
    assert_eq!(answer_for(&out, "1")["error"]["data"]["reason"], "timeout");
    let (arrival, _) = h.arrive("2", "pay", KEYED);
    assert!(matches!(arrival, Arrival::Started(_)), "{arrival:?}");
    // An unsafe call cancelled before its attempt was sent never ran.
    let mut h = with_pay(false);
    let (arrival, _) = h.arrive("1", "pay", KEYED);
    let Arrival::Started(id) = arrival else {
        panic!("{arrival:?}");
    };
    h.run(|c, ctx, out| c.cancel_member(id, "1", "stopped", ctx, out));
    let (arrival, _) = h.arrive("2", "pay", KEYED);
    assert!(matches!(arrival, Arrival::Started(_)), "{arrival:?}");
    assert!(h.calls.stats().unknown.is_empty());
}

#[test]
fn a_late_success_too_large_to_keep_turns_an_unknown_outcome_into_already_ran() {
    let mut h = Harness::new(|c| {
        c.call_timeout = 10 * SECOND;
        c.idempotency_max_bytes = 200;
        c.tools
            .insert("pay".into(), tool(|t| t.idempotent = Some(false)));
    });
    let (id, down) = h.started("1", "pay", KEYED);
    h.now += 10 * SECOND;
    h.timer(CallTimer::AttemptTimeout { call: id, down });
    assert_eq!(h.calls.stats().unknown.len(), 1);
    let big = format!(
        r#""result":{{"content":[{{"type":"text","text":"{}"}}]}}"#,
        "x".repeat(300)
    );
    assert_eq!(h.answer(down, &big).0, Owner::Known);
    assert!(h.calls.stats().unknown.is_empty(), "its outcome is known");
    let (_, out) = h.arrive("2", "pay", KEYED);
    let e = &answer_for(&out, "2")["error"];
    assert_eq!(e["data"]["reason"], "already_ran", "{e}");
    assert_eq!(e["data"]["outcome"], "succeeded", "{e}");
}

// ----- with a store of keys (`store: local`) -----------------------------------

use crate::policy::record::{Outcome as Recorded, Reply};
use crate::store::thread::{Answer, Request, Told};

/// `with_pay(false)` with a store behind a channel the test reads.
fn with_store(unavailable: super::Unavailable) -> (Harness, crossbeam_channel::Receiver<Request>) {
    let mut h = with_pay(false);
    let (tx, rx) = crossbeam_channel::unbounded();
    let mut cfg = crate::config::ServerConfig::with_defaults("srv", "srv".into(), vec![]);
    cfg.env = vec![("TOKEN".into(), "tok-Zq81-secret".into())];
    h.calls.use_store(super::KeyStore::new(
        tx,
        [9; 32],
        unavailable,
        "local",
        &cfg,
    ));
    (h, rx)
}

/// The store requests among `out`.
fn store_requests(out: Vec<Action>) -> Vec<Request> {
    out.into_iter()
        .filter_map(|a| match a {
            Action::Store(r) => Some(r),
            _ => None,
        })
        .collect()
}

/// A keyed call arrives: it claims its record and is not admitted until
/// the store answers. Its id and the claim's record.
fn claiming(h: &mut Harness, client: &str) -> (u64, crate::store::Id) {
    claiming_with(h, client, KEYED)
}

/// [`claiming`] with these arguments (their key, `K-1` or another).
fn claiming_with(h: &mut Harness, client: &str, args: &str) -> (u64, crate::store::Id) {
    let (arrival, out) = h.arrive(client, "pay", args);
    let Arrival::Started(id) = arrival else {
        panic!("{arrival:?}")
    };
    let mut reqs = store_requests(out);
    let Some(Request::Claim {
        call,
        id: record,
        wait_until,
        about,
        ..
    }) = reqs.pop()
    else {
        panic!("no claim: {reqs:?}")
    };
    assert_eq!(call, id);
    assert_eq!((about.server.as_str(), about.tool.as_str()), ("srv", "pay"));
    assert!(args.contains(&format!("\"{}\"", about.key)), "{about:?}");
    assert_eq!(wait_until, h.now + h.calls.cfg.retry.total_timeout);
    let (admitted, _) = h.run(|c, ctx, out| c.admit(id, ctx, out));
    assert!(!admitted, "its attempt waits for the claim");
    (id, record)
}

#[test]
fn a_key_is_kept_for_status_redacted_and_shortened() {
    let (mut h, _rx) = with_store(super::Unavailable::Local);
    let long = format!("tok-Zq81-secret/{}", "x".repeat(500));
    let args = serde_json::json!({ "_idempotency_key": long }).to_string();
    let (_, out) = h.arrive("1", "pay", &args);
    let Some(claim) = store_requests(out).pop() else {
        panic!("no claim")
    };
    let Request::Claim { about, .. } = &claim else {
        panic!("{claim:?}")
    };
    assert!(!about.key.contains("tok-Zq81-secret"), "{}", about.key);
    assert!(about.key.contains("[redacted]"), "{}", about.key);
    assert!(about.key.chars().count() <= crate::stats::MAX_KEY_CHARS + 10);
    // Counted when the dispatcher hands it to the store.
    assert_eq!(h.calls.stats().store.operations, 0);
    h.calls.store_send(claim);
    assert_eq!(h.calls.stats().store.operations, 1);
    assert_eq!(h.calls.stats().store.state(), "opening");
}

#[test]
fn the_store_figures_count_replays_waits_and_unknown_answers() {
    let (mut h, _rx) = with_store(super::Unavailable::Local);
    let (id, _) = claiming(&mut h, "1");
    let answer = Answer {
        call: id,
        reply: Ok(Reply::Replay {
            result: r#"{"content":[]}"#.into(),
            ago: 5,
            same_args: true,
        }),
        waited: true,
    };
    h.run(|c, ctx, out| c.store_told(Told::Answer(answer), ctx, out));
    let (id2, _) = claiming_with(&mut h, "2", r#"{"_idempotency_key":"K-2"}"#);
    let unknown = Ok(Reply::Unknown {
        cause: "timeout".into(),
        ago: 5,
        same_args: true,
    });
    store_answers(&mut h, id2, unknown);
    let f = &h.calls.stats().store;
    assert_eq!((f.replays, f.waits, f.unknown_answers), (1, 1, 1));
    let told = Told::Opened(Err("no state directory".into()));
    h.run(|c, ctx, out| c.store_told(told, ctx, out));
    assert_eq!(h.calls.stats().store.state(), "failed");
}

#[test]
fn a_claim_the_store_never_answers_ends_its_call_after_the_deadline() {
    let (mut h, _rx) = with_store(super::Unavailable::Local);
    let (arrival, out) = h.arrive("1", "pay", KEYED);
    let Arrival::Started(id) = arrival else {
        panic!()
    };
    let deadline = h.now + h.calls.cfg.retry.total_timeout;
    assert!(out.iter().any(|a| matches!(a,
        Action::Timer(at, CallTimer::CallDeadline { call }) if *call == id && *at == deadline + SECOND)));
    h.now = deadline + SECOND;
    let (_, out) = h.timer(CallTimer::CallDeadline { call: id });
    let e = &answer_for(&out, "1")["error"];
    assert_eq!(e["data"]["reason"], "deadline_exceeded", "{e}");
    assert_eq!(h.calls.len(), 0);
    let reqs = store_requests(out);
    assert!(
        matches!(
            &reqs[..],
            [Request::Finish {
                outcome: Recorded::Released,
                ..
            }]
        ),
        "whatever became of the claim is given back: {reqs:?}"
    );
    // A claim answered since is not the call's any more.
    let (start, out) = store_answers(&mut h, id, Ok(Reply::Claimed));
    assert_eq!((start, out.len()), (None, 0));
}

fn store_answers(
    h: &mut Harness,
    call: u64,
    reply: Result<Reply, String>,
) -> (Option<u64>, Vec<Action>) {
    let answer = Answer {
        call,
        reply,
        waited: false,
    };
    h.run(|c, ctx, out| c.store_told(Told::Answer(answer), ctx, out))
}

#[test]
fn a_keyed_call_claims_first_and_records_its_outcome() {
    let (mut h, _rx) = with_store(super::Unavailable::Local);
    let (id, record) = claiming(&mut h, "1");
    let (start, out) = store_answers(&mut h, id, Ok(Reply::Claimed));
    assert_eq!(start, Some(id));
    assert!(out.is_empty(), "{out:?}");
    let down = h.attempt(id);
    let (_, out) = h.answer(down, OK);
    let reqs = store_requests(out);
    assert!(
        matches!(&reqs[..], [Request::Finish { id: r, outcome: Recorded::Result(text), .. }]
            if *r == record && text.contains("\"ok\"")),
        "{reqs:?}"
    );
    // A keyless call never asks the store.
    let (arrival, out) = h.arrive("2", "pay", "{}");
    assert!(matches!(arrival, Arrival::Started(_)));
    assert!(store_requests(out).is_empty());
}

#[test]
fn a_kept_result_is_replayed_and_an_unknown_record_is_not_run() {
    let (mut h, _rx) = with_store(super::Unavailable::Local);
    let (id, _) = claiming(&mut h, "1");
    let replay = Reply::Replay {
        result: r#"{"content":[]}"#.into(),
        ago: 1,
        same_args: true,
    };
    let (start, out) = store_answers(&mut h, id, Ok(replay));
    assert_eq!(start, None);
    let r = &answer_for(&out, "1")["result"];
    assert_eq!(r["_meta"]["mcp-retry/source"], "dedup", "{r}");
    assert_eq!(h.calls.len(), 0);
    // Another key... the same one again, now answered unknown by the store.
    let (arrival, out) = h.arrive("2", "pay", r#"{"_idempotency_key":"K-2"}"#);
    let Arrival::Started(id) = arrival else {
        panic!()
    };
    assert_eq!(store_requests(out).len(), 1);
    let unknown = Reply::Unknown {
        cause: "owner_lost".into(),
        ago: 3_000,
        same_args: true,
    };
    let (start, out) = store_answers(&mut h, id, Ok(unknown));
    assert_eq!(start, None);
    let e = &answer_for(&out, "2")["error"];
    assert_eq!(e["data"]["reason"], "earlier_attempt_unknown", "{e}");
    assert_eq!(e["data"]["cause"], "owner_lost", "{e}");
    assert_eq!(e["data"]["startedMsAgo"], 3_000, "{e}");
    assert!(
        store_requests(out).is_empty(),
        "nothing recorded for a call not run"
    );
}

#[test]
fn an_unavailable_store_runs_the_call_or_refuses_it() {
    let (mut h, _rx) = with_store(super::Unavailable::Local);
    let (id, _) = claiming(&mut h, "1");
    let (start, _) = store_answers(&mut h, id, Err("disk gone".into()));
    assert_eq!(start, Some(id), "store_unavailable: local runs it");
    let (mut h, _rx) = with_store(super::Unavailable::Refuse);
    let (id, _) = claiming(&mut h, "1");
    let (start, out) = store_answers(&mut h, id, Err("disk gone".into()));
    assert_eq!(start, None);
    let e = &answer_for(&out, "1")["error"];
    assert_eq!(e["data"]["reason"], "store_unavailable", "{e}");
    assert!(e["message"].as_str().unwrap().contains("disk gone"), "{e}");
}

#[test]
fn a_keyed_call_that_times_out_or_errs_records_unknown_or_released() {
    let (mut h, _rx) = with_store(super::Unavailable::Local);
    let (id, _) = claiming(&mut h, "1");
    store_answers(&mut h, id, Ok(Reply::Claimed));
    let down = h.attempt(id);
    h.now += 10 * SECOND;
    let (_, out) = h.timer(CallTimer::AttemptTimeout { call: id, down });
    let reqs = store_requests(out);
    assert!(
        matches!(&reqs[..], [Request::Finish { outcome: Recorded::Unknown(c), .. }] if c == "timeout"),
        "{reqs:?}"
    );
    // Its late success is recorded too.
    let (_, out) = h.answer(down, OK);
    let reqs = store_requests(out);
    assert!(
        matches!(
            &reqs[..],
            [Request::Finish {
                outcome: Recorded::Result(_),
                ..
            }]
        ),
        "{reqs:?}"
    );
    // A definite error releases.
    let (mut h, _rx) = with_store(super::Unavailable::Local);
    let (id, _) = claiming(&mut h, "2");
    store_answers(&mut h, id, Ok(Reply::Claimed));
    let down = h.attempt(id);
    let (_, out) = h.answer(down, r#""error":{"code":-32602,"message":"bad"}"#);
    let reqs = store_requests(out);
    assert!(
        matches!(
            &reqs[..],
            [Request::Finish {
                outcome: Recorded::Released,
                ..
            }]
        ),
        "{reqs:?}"
    );
}

#[test]
fn one_run_starts_an_admitted_attempt_under_the_id_given_and_none_the_breaker_refuses() {
    let mut h = Harness::new(|c| {
        c.retry.max_retries = 0;
        c.circuit_breaker.failure_threshold = 1;
        c.circuit_breaker.cooldown = 30 * SECOND;
    });
    let (arrival, _) = h.arrive("11", "t", "{}");
    let Arrival::Started(id) = arrival else {
        panic!("{arrival:?}");
    };
    let (started, out) = h.run(|c, ctx, out| c.start(id, 7, ctx, out));
    assert!(started);
    assert!(
        matches!(
            &out[..],
            [Action::Timer(_, CallTimer::AttemptTimeout { call, down: 7 })] if *call == id
        ),
        "{out:?}"
    );
    assert!(h.calls.attempt_is_live(id, 7));
    let line = h.calls.attempt_line(id, 7, None).expect("its message");
    assert_eq!(line.request_id(), Some(7));
    // It fails: the breaker opens, and the next call is refused an attempt.
    h.answer(7, TRANSIENT);
    let (arrival, _) = h.arrive("12", "t", r#"{"n":2}"#);
    let Arrival::Started(id) = arrival else {
        panic!("{arrival:?}");
    };
    let (started, out) = h.run(|c, ctx, out| c.start(id, 8, ctx, out));
    assert!(!started);
    assert!(!h.calls.attempt_is_live(id, 8));
    let refused = answer_for(&out, "12");
    assert_eq!(refused["error"]["data"]["reason"], "circuit_open");
}

/// With export on, an attempt writes its `traceparent` as the call's
/// reader decided: a call with `_meta` (with the client's own
/// `traceparent` or without) is not parsed again by any attempt. A call
/// whose `_idempotency_key` was removed is sent with params the reader did
/// not read: each of its attempts parses them.
#[test]
fn an_attempt_with_export_on_parses_nothing_of_its_call() {
    let mut h = Harness::new(|_| {});
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut attempt = |client: &str, params: &str| {
        let m = message(&format!(
            r#"{{"jsonrpc":"2.0","id":{client},"method":"tools/call","params":{params}}}"#
        ));
        let (arrival, _) =
            h.run(|c, ctx, out| c.arrive(m.clone(), parsed_call(&m), client.into(), ctx, out));
        let Arrival::Started(id) = arrival else {
            panic!("{arrival:?}");
        };
        h.run(|c, ctx, out| c.admit(id, ctx, out));
        let before = crate::otel::params_parsed();
        let (sent, _) = h.run(|c, ctx, out| c.send(id, 100, Some(tp), ctx, out));
        // Another attempt's line (as after a retry).
        let again = h.calls.attempt_line(id, 101, Some(tp));
        let parses = crate::otel::params_parsed() - before;
        for (down, sent) in [(100, sent), (101, again)] {
            let sent = String::from_utf8(sent.expect("an attempt").bytes).unwrap();
            let sent: Value = serde_json::from_str(&sent).unwrap();
            assert_eq!(sent["params"]["_meta"]["traceparent"], tp, "{sent}");
            assert_eq!(sent["id"], down);
        }
        h.answer(100, OK);
        parses
    };
    let meta = r#""_meta":{"progressToken":1,"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}"#;
    assert_eq!(
        attempt(
            "1",
            &format!(r#"{{"name":"t",{meta},"arguments":{{"a":1}}}}"#)
        ),
        0
    );
    assert_eq!(
        attempt(
            "2",
            r#"{"name":"t","_meta":{"progressToken":2},"arguments":{}}"#
        ),
        0
    );
    assert_eq!(attempt("3", r#"{"name":"t","arguments":{"b":1}}"#), 0);
    let keyed =
        r#"{"name":"t","_meta":{"progressToken":3},"arguments":{"_idempotency_key":"k","c":1}}"#;
    assert_eq!(attempt("4", keyed), 2);
}

#[test]
fn results_waiting_for_the_store_are_bounded_by_bytes() {
    let (mut h, rx) = with_store(super::Unavailable::Local);
    let big = format!("{{\"text\":\"{}\"}}", "x".repeat(3 << 20));
    let finish = |n: u8| Request::Finish {
        id: [n; 32],
        outcome: Recorded::Result(big.clone()),
        timing: crate::policy::record::Timing { ttl: 1, lease: 1 },
        held: None,
    };
    for n in 0..3 {
        h.calls.store_send(finish(n));
    }
    let sent: Vec<Request> = rx.try_iter().collect();
    let kept = |r: &Request| {
        matches!(
            r,
            Request::Finish {
                outcome: Recorded::Result(_),
                ..
            }
        )
    };
    assert_eq!(sent.iter().filter(|r| kept(r)).count(), 2, "{}", sent.len());
    assert!(
        matches!(
            sent[2],
            Request::Finish {
                outcome: Recorded::Ran,
                held: None,
                ..
            }
        ),
        "past the bound: run, without its result"
    );
    // Once the store thread is done with them, there is room again.
    drop(sent);
    h.calls.store_send(finish(4));
    assert!(rx.try_iter().all(|r| kept(&r)));
}

#[test]
fn one_run_opens_a_call_and_starts_or_admits_its_first_attempt() {
    let mut h = Harness::new(|c| {
        c.retry.max_retries = 0;
        c.circuit_breaker.failure_threshold = 1;
        c.circuit_breaker.cooldown = 30 * SECOND;
    });
    let m = request("21", "t", "{}");
    let ((arrival, first), out) =
        h.run(|c, ctx, out| c.arrive_and_start(m.clone(), parsed_call(&m), "21".into(), ctx, out));
    let Arrival::Started(id) = arrival else {
        panic!("{arrival:?}");
    };
    // The link is ready: recorded under the id the context gives.
    let down = h.next_down + 1;
    assert_eq!(first, First::Recorded);
    assert!(
        matches!(
            &out[..],
            [Action::Timer(_, CallTimer::AttemptTimeout { call, down: d })] if *call == id && *d == down
        ),
        "{out:?}"
    );
    assert!(h.calls.attempt_is_live(id, down));
    // A link that is not ready: admitted only, for the dispatcher to route.
    h.link.ready = false;
    let m = request("22", "t", r#"{"n":2}"#);
    let ((arrival, first), out) =
        h.run(|c, ctx, out| c.arrive_and_start(m.clone(), parsed_call(&m), "22".into(), ctx, out));
    let Arrival::Started(second) = arrival else {
        panic!("{arrival:?}");
    };
    assert_eq!(first, First::Admitted);
    assert!(out.is_empty(), "{out:?}");
    assert!(!h.calls.attempt_is_live(second, down + 1));
    // The first fails: the breaker opens, and a new call gets no attempt.
    h.link.ready = true;
    h.answer(down, TRANSIENT);
    let m = request("23", "t", r#"{"n":3}"#);
    let ((arrival, first), out) =
        h.run(|c, ctx, out| c.arrive_and_start(m.clone(), parsed_call(&m), "23".into(), ctx, out));
    assert!(matches!(arrival, Arrival::Started(_)), "{arrival:?}");
    assert_eq!(first, First::Waiting);
    let refused = answer_for(&out, "23");
    assert_eq!(refused["error"]["data"]["reason"], "circuit_open");
}

/// A call's params as its reader thread reads them.
fn parsed_call(m: &Message) -> Option<Box<crate::inbound::ParsedCall>> {
    crate::inbound::ParsedCall::read(m.params()?)
        .ok()
        .flatten()
        .map(Box::new)
}
