//! The dispatcher's side of [`Calls`]: it runs a method of the calls with
//! the time and its view of the server link, then carries out the
//! [`Action`]s the calls pushed, in order (answers through `answer`, lines
//! to the server and the client, timers, the queue, the tracer). It also
//! does for the calls what needs the link: routing and sending an attempt
//! (under a downstream id from `Requests::issue_attempt`), and the proxy's own `tools/list`.
//!
//! The action list is one buffer reused from event to event, so the hot
//! path allocates nothing for it.

#![forbid(unsafe_code)]

use std::time::Instant;

use crate::downstream::Outgoing;
use crate::jsonrpc::{self, Message};
use crate::warn;

use super::calls::{Action, Arrival, Calls, Ctx, First, LinkView, Trace};
use super::link::{Effect, Link, Queued, Route, SendResult};
use super::{CallError, Dispatcher, Inflight, Method, Reason, Timer};

/// The largest action buffer kept between runs: what an ordinary event
/// needs, many times over.
const KEPT_ACTIONS: usize = 256;

impl Dispatcher {
    /// Runs `f` on the calls at `now`, then carries out what it pushed.
    pub(super) fn with_calls<R>(
        &mut self,
        now: Instant,
        f: impl FnOnce(&mut Calls, Ctx, &mut Vec<Action>) -> R,
    ) -> R {
        let ctx = Ctx {
            now,
            link: self.link_view(),
            tracing: self.reporting.tracing(),
            attempt_id: self.requests.next_attempt_id(),
        };
        // Nested runs (an action that reports back) start with an empty
        // buffer; the largest one is kept, unless a burst (a link lost with
        // thousands of calls) made it large: that memory goes back.
        let mut out = std::mem::take(&mut self.actions);
        let r = f(&mut self.calls, ctx, &mut out);
        for action in out.drain(..) {
            self.carry_out(action, now);
        }
        if out.capacity() > self.actions.capacity() && out.capacity() <= KEPT_ACTIONS {
            self.actions = out;
        }
        if self.calls.take_stats_changed() {
            self.stats_dirty();
        }
        r
    }

    /// Runs `f` on the link at `now`, then carries out the effects it
    /// pushed, in order.
    pub(super) fn with_link<R>(
        &mut self,
        now: Instant,
        f: impl FnOnce(&mut Link, &mut Vec<Effect>) -> R,
    ) -> R {
        let mut out = Vec::new();
        let r = f(&mut self.link, &mut out);
        for effect in out {
            self.carry_out_link(effect, now);
        }
        r
    }

    fn carry_out_link(&mut self, effect: Effect, now: Instant) {
        match effect {
            Effect::Timer(at, timer) => self.set_timer(at, timer),
            Effect::Unanswered(line, failure) => self.on_unanswered(line, failure, now),
            Effect::Lost {
                message,
                may_have_received,
                stopping,
            } => self.on_link_lost(&message, may_have_received, stopping, now),
            Effect::Down { message, heal } => self.link_down(message, heal, now),
        }
    }

    /// What the calls must know of the link now.
    fn link_view(&self) -> LinkView {
        let ready = self.link.ready();
        LinkView {
            ready,
            reachable: ready || self.link.restarting(),
            initialized: self.link.session.initialized || self.link.session.modern_meta.is_some(),
            generation: self.link.generation_to_ask(),
            paused: self.requests.paused(),
        }
    }

    fn carry_out(&mut self, action: Action, now: Instant) {
        match action {
            Action::Answer { client, line } => self.answer(&client, line),
            Action::Cancel {
                down,
                reason,
                attempt: (tool, retry),
            } => {
                if self.cancel_downstream(down, &reason) {
                    self.calls.withdrawn(&tool, retry);
                }
            }
            Action::Notify(line) => self.send_client(line),
            Action::Timer(at, timer) => self.set_timer(at, Timer::Call(timer)),
            Action::Unqueue(seq) => {
                self.unqueue(seq);
            }
            Action::ListTools { cursor } => self.request_tools_page(cursor.as_deref(), now),
            Action::Trace(t) => self.trace(t, now),
            Action::Store(req) => self.calls.store_send(req),
        }
    }

    /// A client `tools/call` (while the session runs): one run of the
    /// calls reads it and, for a new call, admits its first attempt and,
    /// the link ready, records it under the id issued next.
    pub(super) fn on_tools_call(
        &mut self,
        m: Message,
        parsed: Option<Box<crate::inbound::ParsedCall>>,
        client_id: String,
        now: Instant,
    ) {
        let down = self.requests.next_attempt_id();
        let (arrival, first) = self.with_calls(now, |c, ctx, out| {
            c.arrive_and_start(m, parsed, &client_id, ctx, out)
        });
        let call = match arrival {
            Arrival::Relay(m) => return self.relay_request(m, client_id, Method::Other, now),
            Arrival::Answered => return,
            Arrival::Joined(call) => call,
            Arrival::Started(call) => Some(call),
        };
        self.requests.set_call(&client_id, call);
        if let Arrival::Started(id) = arrival {
            match first {
                First::Recorded => self.send_recorded(id, down, now),
                First::Admitted => self.route_attempt(id, now),
                First::Waiting => {}
            }
        }
    }

    /// Sends the next attempt of call `id`, if the breaker and the link
    /// allow: queued while the server restarts, refused when it cannot be
    /// reached. With the link ready, one run of the calls admits and
    /// records it, under the id issued next.
    pub(super) fn start_attempt(&mut self, id: u64, now: Instant) {
        if self.link.ready() {
            let down = self.requests.next_attempt_id();
            if self.with_calls(now, |c, ctx, out| c.start(id, ctx.attempt_id, ctx, out)) {
                self.send_recorded(id, down, now);
            }
            return;
        }
        if !self.with_calls(now, |c, ctx, out| c.admit(id, ctx, out)) {
            return;
        }
        self.route_attempt(id, now);
    }

    /// The calls recorded call `id`'s attempt under `down`, the id issued
    /// next: it is issued, and the attempt's line goes out.
    fn send_recorded(&mut self, id: u64, down: u64, now: Instant) {
        let issued = self.requests.issue_attempt();
        debug_assert_eq!(issued, down, "an id was issued while the calls ran");
        let traceparent = self.traced(|t| t.attempt_started(id, down, now)).flatten();
        if let Some(attempt) = self.calls.attempt_line(id, down, traceparent.as_deref()) {
            self.send_attempt(attempt, now);
        }
    }

    /// Sends the admitted attempt of call `id`, or queues it while the
    /// server is starting or down (at most `wait_for_server`, never past
    /// the call's deadline), or refuses it when the server cannot be had.
    pub(super) fn route_attempt(&mut self, id: u64, now: Instant) {
        match self.route(now) {
            Route::Send => {
                let down = self.requests.issue_attempt();
                let traceparent = self.traced(|t| t.attempt_started(id, down, now)).flatten();
                let attempt = self.with_calls(now, |c, ctx, out| {
                    c.send(id, down, traceparent.as_deref(), ctx, out)
                });
                if let Some(attempt) = attempt {
                    self.send_attempt(attempt, now);
                }
            }
            Route::Queue => {
                match self.enqueue(Queued::Call(id), now, self.call_wait_until(id, now)) {
                    Some(seq) => {
                        self.calls.queued(id, seq);
                        self.with_calls(now, |c, ctx, out| c.wait_began(id, ctx, out));
                    }
                    None => {
                        let message = self.link.queue_full_message();
                        let error = CallError::proxy(Reason::ServerUnavailable, message, &[]);
                        self.with_calls(now, |c, ctx, out| c.fail(id, &error, ctx, out));
                    }
                }
            }
            Route::Refuse(reason, message) => {
                self.with_calls(now, |c, ctx, out| {
                    c.refused_by_link(id, reason, &message, ctx, out)
                });
            }
        }
    }

    /// How long call `id` may wait for the server from `now`:
    /// `wait_for_server`, and never past its deadline.
    fn call_wait_until(&self, id: u64, now: Instant) -> Instant {
        let wait = self.link.wait_until(now);
        self.calls.deadline(id).map_or(wait, |d| d.min(wait))
    }

    /// Sends a call's attempt; one the server cannot be given fails as
    /// never sent.
    fn send_attempt(&mut self, attempt: Outgoing, now: Instant) {
        let down = attempt.request_id().unwrap_or_default();
        match self.send_server_request(attempt) {
            SendResult::Sent => {}
            SendResult::Closed => {
                self.with_calls(now, |c, ctx, out| c.attempt_unsent(down, ctx, out));
            }
            SendResult::Overloaded(message) => {
                self.with_calls(now, |c, ctx, out| {
                    c.on_unusable_answer(down, Reason::Overloaded, &message, ctx, out)
                });
            }
        }
    }

    /// Sends the server a cancel for one of our downstream ids, unless its
    /// request never left the proxy (withdrawn: nothing to cancel, and
    /// true).
    fn cancel_downstream(&mut self, down: u64, reason: &str) -> bool {
        if self.withdraw(down) {
            crate::debug!("withdrew downstream request {down} before the server read it");
            return true;
        }
        let params = format!(
            "{{\"requestId\":{down},\"reason\":{}}}",
            jsonrpc::json_string(reason)
        );
        let line = jsonrpc::notification_line("notifications/cancelled", Some(&params));
        self.send_server(Outgoing::cancel(down, line));
        false
    }

    /// Sends our own `tools/list` for one page; it gets `call_timeout` to
    /// be answered, like an attempt.
    pub(super) fn request_tools_page(&mut self, cursor: Option<&str>, now: Instant) {
        let params =
            crate::mcp::tools_list_params(cursor, self.link.session.modern_meta.as_deref());
        let first = cursor.is_none();
        let down = self.requests.issue(Inflight::ToolsList { first });
        let line = jsonrpc::request_line(&down.to_string(), "tools/list", Some(&params));
        if self.send_server(Outgoing::own_request(down, "tools/list", &params, line)) {
            let at = now + self.cfg.call_timeout;
            self.set_timer(at, Timer::ToolsListTimeout { down });
        } else {
            self.requests.forget(down);
            self.with_calls(now, |c, ctx, out| c.tools_learned(false, ctx, out));
        }
    }

    /// Our own `tools/list` was not answered in time: the annotations stay
    /// unknown, and calls waiting for them are decided now (unknown means
    /// unsafe) rather than at their deadline.
    pub(super) fn on_tools_list_timeout(&mut self, down: u64, now: Instant) {
        let listing = |f: &Inflight| matches!(f, Inflight::ToolsList { .. });
        if self.requests.take_if(down, listing).is_some() {
            warn!(
                "the server did not answer the proxy's tools/list within {}; tool annotations stay unknown",
                super::calls::secs(self.cfg.call_timeout)
            );
            self.with_calls(now, |c, ctx, out| c.tools_learned(false, ctx, out));
        }
    }

    /// The server became ready: ask for the tool list if it was wanted.
    pub(super) fn fetch_deferred_tools(&mut self, now: Instant) {
        if self.calls.take_deferred_fetch() {
            self.request_tools_page(None, now);
        }
    }

    /// The tool list waits for a server that will not be there soon: the
    /// calls waiting for it decide without.
    pub(super) fn give_up_deferred_tools(&mut self, now: Instant) {
        if self.calls.tools_deferred() {
            self.with_calls(now, |c, ctx, out| c.tools_learned(false, ctx, out));
        }
    }

    /// Tells the tracer about the calls (a call's start with what the
    /// calls hold of it; the rest through `Reporting::trace`).
    fn trace(&mut self, t: Trace, now: Instant) {
        match t {
            Trace::CallStarted { call } => {
                if let (Some(tracer), Some((tool, client, params))) =
                    (self.reporting.tracer(), self.calls.started(call))
                {
                    tracer.call_started(call, tool, client, params, now);
                }
            }
            t => self.reporting.trace(t, now),
        }
    }
}
