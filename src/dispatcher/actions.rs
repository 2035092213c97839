//! The dispatcher's side of [`Calls`]: it runs a method of the calls with
//! the time and its view of the server link, then carries out the
//! [`Action`]s the calls pushed, in order (answers through `answer`, lines
//! to the server and the client, timers, the queue, the tracer). It also
//! does for the calls what needs the link: routing and sending an attempt
//! (under a downstream id from `Requests::issue_attempt`), and the proxy's own `tools/list`.
//! And the dispatcher's side of [`Link`]: the [`Effect`]s it pushes, and
//! what needs the requests and the calls too (a start's sequel, the queue's
//! release and give-up, the handshake's replay, what the transport reports:
//! `on_link_event`, a link lost, requests requeued).
//!
//! The action list is one buffer reused from event to event, so the hot
//! path allocates nothing for it.

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use crate::downstream::{Failure as TransportFailure, Gone, Heal, Outgoing, ServerEvent};
use crate::handshake_cache::{CacheJob, Entry};
use crate::jsonrpc::{self, Message, RawObject};
use crate::mcp::List;
use crate::{debug, info, warn};

use super::calls::{Action, Arrival, Calls, Ctx, Failure, First, LinkView, Trace};
use super::instant::{Effect as InstantEffect, InstantStart, Source};
use super::link::{failure_error, Effect, Link, Queued, ReplayStep, Route, SendResult, Started};
use super::{CallError, ClientId, Dispatcher, Inflight, Method, Phase, Reason, Resolved, Timer};

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
            initialized: self.link.session_open(),
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
        client_id: ClientId,
        now: Instant,
    ) {
        let down = self.requests.next_attempt_id();
        let (arrival, first) = self.with_calls(now, |c, ctx, out| {
            c.arrive_and_start(m, parsed, client_id.clone(), ctx, out)
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
        let params = crate::mcp::tools_list_params(cursor, self.link.modern_meta());
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
                if let (Some(tracer), Some((tool, client, parent))) =
                    (self.reporting.tracer(), self.calls.started(call))
                {
                    tracer.call_started(call, tool, client, parent, now);
                }
            }
            t => self.reporting.trace(t, now),
        }
    }
}

// ----- the link: starts, the queue, the replay, what the transport reports

impl Dispatcher {
    /// Starts the server, or reconnects to it: the first start, or a probe
    /// during an outage.
    pub(super) fn start_server(&mut self, now: Instant) {
        self.calls.new_incarnation();
        match self.with_link(now, |link, out| link.start(now, out)) {
            Started::Replay => self.replay_initialize(now),
            // Nothing to replay: traffic flows at once; the outage ends
            // with the server's first message.
            Started::Flowing { back } => {
                self.flush_queue(back, now);
                self.fetch_deferred_tools(now);
            }
            // The link is down (`link_down`, through the effect).
            Started::Failed => {}
        }
    }

    /// Puts `item` in the queue, waiting since `since` and until `expires`
    /// at the latest; `None` when the queue is full.
    pub(super) fn enqueue(
        &mut self,
        item: Queued,
        since: Instant,
        expires: Instant,
    ) -> Option<u64> {
        let seq = self.link.enqueue(item, since)?;
        self.set_timer(expires, Timer::QueueExpired { seq });
        Some(seq)
    }

    /// The client's `initialize`, sent before the session's first
    /// handshake, is still unanswered after as long as a request waits for
    /// the server: it is answered, saying so (the server, which may answer
    /// it later, is left running: its late answer is dropped).
    pub(super) fn on_first_initialize_due(&mut self, down: u64, now: Instant) {
        let client = |f: &Inflight| matches!(f, Inflight::Client { .. });
        let Some(Inflight::Client { client_id, .. }) = self.requests.take_if(down, client) else {
            return;
        };
        self.requests.written(down);
        let since = self
            .requests
            .waited(&client_id)
            .map_or(now, |(since, _)| since);
        let waited = now
            .saturating_duration_since(since)
            .max(self.link.wait_for_server());
        let what = self.link.describe();
        let message = format!(
            "the MCP server {what} did not answer initialize within {}; check that it starts (run its command by hand); a server this slow to start needs a larger wait_for_server, and the host a larger start timeout (MCP_TIMEOUT for Claude Code)",
            super::calls::secs(waited)
        );
        warn!("{message}");
        self.with_calls(now, |c, ctx, _| c.outage_failure(ctx.now));
        self.answer_proxy_error(&client_id, Reason::ServerUnavailable, &message);
    }

    pub(super) fn unqueue(&mut self, seq: u64) -> Option<Queued> {
        self.link.take_queued(seq).map(|(_, q)| q)
    }

    /// A queued item waited as long as it may for the server.
    pub(super) fn on_queue_expired(&mut self, seq: u64, now: Instant) {
        self.queue_give_up(seq, now, "gave up after waiting");
    }

    /// Answers queued item `seq` with the server's unavailability; the
    /// message says how long it really waited. A request that gave up
    /// waiting counts toward the circuit breaker (an outage's failure).
    fn queue_give_up(&mut self, seq: u64, now: Instant, what: &str) {
        let Some((since, item)) = self.link.take_queued(seq) else {
            return;
        };
        let message = format!(
            "the MCP server is not available ({}); {what} {} for it",
            self.link.message(),
            super::calls::secs(now.saturating_duration_since(since))
        );
        match item {
            Queued::Request { client_id, .. } => {
                self.with_calls(now, |c, ctx, _| c.outage_failure(ctx.now));
                self.answer_proxy_error(&client_id, Reason::ServerUnavailable, &message)
            }
            Queued::Call(id) => {
                let error = super::CallError::proxy(Reason::ServerUnavailable, &message, &[]);
                self.with_calls(now, |c, ctx, out| c.gave_up_waiting(id, &error, ctx, out));
            }
            Queued::Notification(_) => debug!("dropped a queued notification"),
        }
    }

    /// The server is ready: what waited goes, in order; for a server that
    /// is `back` from an outage, in a ramp (`policy::ramp`): the oldest
    /// first, then two more for each answer.
    fn flush_queue(&mut self, back: bool, now: Instant) {
        if back {
            self.link.begin_ramp(now);
        }
        self.release_queue(now);
    }

    /// Sends what waited, in order, as far as the ramp allows (a
    /// notification waits only for what is before it). The ramp holds the
    /// backlog, not the session's new traffic: what comes meanwhile goes at
    /// once, and so does what waited less than `ramp::FRESH` (it just
    /// missed the connection).
    pub(super) fn release_queue(&mut self, now: Instant) {
        while let Some((seq, item)) = self.link.next_release() {
            if self.release(seq, item, now) {
                self.link.released(now);
            }
        }
        for seq in self.link.fresh(now) {
            if !self.link.ready() {
                break;
            }
            if let Some(item) = self.unqueue(seq) {
                self.release(seq, item, now);
            }
        }
        if let Some(at) = self.link.settle() {
            self.set_timer(at, Timer::RampStall);
        }
    }

    /// Nothing released was answered for a while: more may go.
    pub(super) fn on_ramp_stall(&mut self, now: Instant) {
        if self.link.ramp_stalled(now) {
            self.release_queue(now);
        }
    }

    /// The server answered a request: while a ramp runs, more may go.
    pub(super) fn ramp_answered(&mut self, now: Instant) {
        if self.link.ramp_answered(now) {
            self.release_queue(now);
        }
    }

    /// Sends queued item `seq`; true if a request or a call's attempt went
    /// (not one the client gave up meanwhile, nor a notification).
    fn release(&mut self, seq: u64, item: Queued, now: Instant) -> bool {
        match item {
            Queued::Request {
                m,
                client_id,
                method,
            } => {
                let still_wanted = self.requests.unqueued(&client_id, seq);
                if still_wanted {
                    self.relay_request(m, client_id, method, now);
                }
                still_wanted
            }
            Queued::Call(id) => {
                // Admitted by the breaker before it was queued.
                let wanted = self.calls.unqueued(id);
                if wanted {
                    self.route_attempt(id, now);
                }
                wanted
            }
            Queued::Notification(out) => {
                self.send_server(out);
                false
            }
        }
    }

    /// The server works again (its handshake was replayed, or it sent its
    /// first message): the outage, if there was one, is over; what waited
    /// goes out.
    /// True if an outage ended.
    fn server_up(&mut self, now: Instant) -> bool {
        let ended = self.link.up(now);
        if ended {
            self.with_calls(now, |c, _, _| c.link_recovered());
        }
        ended
    }

    /// Sends the client's original `initialize` to a new incarnation.
    pub(super) fn replay_initialize(&mut self, now: Instant) {
        let mut params = self.link.handshake_params().unwrap_or_default().to_owned();
        // A session begun from the cache asks for the version the client
        // was told: a server that still speaks it answers in it.
        if let (true, Some(told)) = (self.instant_unchecked(), self.link.protocol_version()) {
            if let Some(asking) = super::instant::asking_for(&params, told) {
                params = asking;
            }
        }
        let down = self
            .requests
            .issue(Inflight::Replay(ReplayStep::Initialize));
        debug!("replaying the client's initialize to the new server");
        let line = jsonrpc::request_line(&down.to_string(), "initialize", Some(&params));
        self.send_server(Outgoing::request(down, "initialize", line));
        // initialize is never cancelled; a server that does not answer it
        // in time is killed and counts as a failed start.
        let generation = self.link.generation();
        self.set_timer(
            now + self.replay_wait(),
            Timer::ReplayTimeout { generation },
        );
    }

    /// The answer to one of the proxy's replayed requests.
    pub(super) fn on_replay_response(&mut self, step: ReplayStep, m: &Message, now: Instant) {
        if step == ReplayStep::Other {
            if let Some(e) = m.error() {
                debug!("the new server refused a replayed request: {e}");
            }
            return;
        }
        // Within the grace the client gets the server's own answer.
        self.instant_answered_in_grace(m.result(), now);
        let version = m
            .result()
            .and_then(RawObject::parse)
            .and_then(|r| r.string("protocolVersion"));
        let problem = match (version.as_deref(), self.link.protocol_version()) {
            (None, _) => Some(format!(
                "it answered the replayed initialize with {}",
                m.error().unwrap_or("no result")
            )),
            (Some(v), Some(old)) if v != old => Some(format!(
                "it chose protocol version {v}, but the session uses {old}"
            )),
            _ => None,
        };
        if !self.instant_verdict(m, problem.as_deref(), now) {
            return;
        }
        if let Some(problem) = problem {
            warn!("the restarted server is not usable: {problem}; stopping it");
            self.link.kill();
            return;
        }
        if self.link.is_initialized() {
            let method = "notifications/initialized";
            let line = jsonrpc::notification_line(method, None);
            self.send_server(Outgoing::notification(method, line));
        }
        // The session's state (but what queued requests set anyway).
        for (method, params) in self.link.session_replays() {
            let down = self.requests.issue(Inflight::Replay(ReplayStep::Other));
            let line = jsonrpc::request_line(&down.to_string(), method, Some(&params));
            self.send_server(Outgoing::own_request(down, method, &params, line));
        }
        self.link.replayed();
        let back = self.server_up(now);
        self.flush_queue(back, now);
        self.fetch_deferred_tools(now);
        if self.link.compares_tools() {
            self.with_calls(now, |c, ctx, out| {
                c.compare_tools_after_restart(ctx.link, out)
            });
        }
        self.instant_read_lists(now);
    }

    /// Something happened to the current incarnation.
    pub(super) fn on_link_event(&mut self, event: ServerEvent, now: Instant) {
        let from_output = matches!(
            event,
            ServerEvent::Message(_) | ServerEvent::Garbage { .. } | ServerEvent::TooLong { .. }
        );
        if from_output {
            self.link.output_seen();
        }
        match event {
            ServerEvent::Message(parsed) => {
                if self.link.said_something() {
                    // A server with no handshake to replay is back once it
                    // says something.
                    self.server_up(now);
                }
                self.on_server_parsed(parsed, now)
            }
            ServerEvent::Garbage { .. } => {}
            ServerEvent::TooLong { response_id, len } => {
                if let Some(id) = response_id {
                    let max = self.cfg.max_message_bytes;
                    let message = format!(
                        "the MCP server's answer of {len} bytes exceeds max_message_bytes ({max}) and was dropped"
                    );
                    self.on_dropped_response(&id, Reason::ResponseTooLarge, &message, now);
                }
            }
            ServerEvent::Overlong => {
                self.with_link(now, |link, out| link.overlong_started(now, out))
            }
            ServerEvent::Unsent { lines, why } => {
                self.with_link(now, |link, out| link.on_unsent(lines, &why, out))
            }
            ServerEvent::Failed { id, failure } => self.on_transport_failed(id, failure, now),
            ServerEvent::Refused {
                lines,
                why,
                retry_after,
            } => self.with_link(now, |_, out| {
                Link::on_refused(lines, &why, retry_after, out)
            }),
            ServerEvent::Draining => {
                // New traffic waits for the next incarnation; what the old
                // one sent is still read.
                self.link.draining()
            }
            ServerEvent::Gone(gone) => self.on_link_gone(gone, now),
        }
    }

    /// A request of ours the server never acted on (`failure`: never
    /// sent, or refused with a hint). A call attempt fails so (always safe
    /// to retry; a refused one after the hint, whatever the tool); a
    /// client request never sent waits for the next server (as it was
    /// kept, to go again under a new id; when only the rest of a line
    /// partly written comes back, shorter than the line sent, that request
    /// stays in flight, for the lost link to decide), one refused is
    /// answered with the refusal and the hint; the proxy's own requests are made again
    /// for the next incarnation (the handshake replay, the tool list).
    pub(super) fn on_unanswered(&mut self, line: Outgoing, failure: Failure, now: Instant) {
        let Some(down) = line.request_id() else {
            return;
        };
        match self.requests.resolve_issued(down) {
            Resolved::Ours(Inflight::Client {
                client_id,
                method,
                kept,
                sent,
            }) => match failure {
                Failure::Refused(why, retry_after) => {
                    // Not run: the client may send it again, not before
                    // the hint. The proxy's error, never one dressed as
                    // the server's.
                    let extra: Vec<(&str, String)> = retry_after
                        .map(|d| ("retryAfterMs", d.as_millis().to_string()))
                        .into_iter()
                        .collect();
                    let message = format!("the MCP server refused the request ({why})");
                    let error = super::proxy_error(Reason::ServerUnavailable, &message, &extra);
                    let line = jsonrpc::error_response_line(&client_id, &error);
                    self.answer(&client_id, line);
                }
                _ if line.bytes.len() == sent => {
                    debug!("a request never reached the server; it waits for the next one");
                    self.requeue_request(kept, client_id, method, now)
                }
                _ => {
                    let back = Inflight::Client {
                        client_id,
                        method,
                        kept,
                        sent,
                    };
                    self.requests.restore(down, back);
                }
            },
            Resolved::Ours(Inflight::ToolsList { .. }) => self.calls.restart_tools_fetch(),
            Resolved::Ours(Inflight::Listing { list, .. }) => self.instant_list_failed(list),
            Resolved::Ours(Inflight::Replay(_)) => {}
            Resolved::Calls | Resolved::Never => {
                self.with_calls(now, |c, ctx, out| c.on_unanswered(down, failure, ctx, out));
            }
        }
    }

    /// The transport got no answer to downstream request `id`: a client
    /// request is answered with the proxy's error saying what happened
    /// (`transport_error` with `outcome: "unknown"` when it may have run,
    /// `rejected` when it did not), a call attempt fails so (the policies
    /// decide: the safety gate for one that may have run; one refused is
    /// final), the proxy's own requests are given up.
    fn on_transport_failed(&mut self, down: u64, failure: TransportFailure, now: Instant) {
        self.requests.written(down);
        match self.requests.resolve_issued(down) {
            Resolved::Ours(Inflight::Client { client_id, .. }) => {
                warn!("answered client request {client_id}: {}", failure.message);
                let error = failure_error(&failure);
                let line = jsonrpc::error_response_line(&client_id, &error.object);
                self.answer(&client_id, line);
            }
            Resolved::Ours(Inflight::ToolsList { .. }) => {
                self.with_calls(now, |c, ctx, out| c.tools_learned(false, ctx, out));
            }
            Resolved::Ours(Inflight::Listing { list, .. }) => self.instant_list_failed(list),
            Resolved::Ours(Inflight::Replay(step)) => {
                if step == ReplayStep::Initialize {
                    warn!(
                        "the restarted server is not usable: {}; stopping it",
                        failure.message
                    );
                    self.link.kill();
                }
            }
            Resolved::Calls | Resolved::Never if failure.invalid => {
                let error = failure_error(&failure);
                self.with_calls(now, |c, ctx, out| c.fail_attempt(down, &error, ctx, out));
            }
            Resolved::Calls | Resolved::Never => {
                let failure = match failure.may_have_run {
                    true => Failure::Transport(failure.message, failure.status),
                    false => Failure::Rejected(failure.message, failure.status),
                };
                self.with_calls(now, |c, ctx, out| c.on_unanswered(down, failure, ctx, out));
            }
        }
    }

    /// The current incarnation is gone: answer or re-plan everything that
    /// waited on it ([`Link::on_gone`]), then plan the next probe unless
    /// the session is ending.
    pub(super) fn on_link_gone(&mut self, gone: Gone, now: Instant) {
        let stopping = matches!(self.phase, Phase::Stopping { .. });
        self.with_link(now, |link, out| link.on_gone(gone, stopping, now, out));
    }

    /// What waited on the incarnation that is gone (`message` says how):
    /// call attempts fail, the policies decide; reads are sent again unless
    /// `stopping`, the rest answered; the server's requests are cancelled.
    pub(super) fn on_link_lost(
        &mut self,
        message: &str,
        may_have_received: bool,
        stopping: bool,
        now: Instant,
    ) {
        self.requests.link_lost();
        if let Some(instant) = &mut self.instant {
            instant.link_lost();
        }

        // Call attempts in flight failed; the policies decide.
        self.with_calls(now, |c, ctx, out| {
            c.on_link_lost(message, may_have_received, stopping, ctx, out)
        });
        // Other requests: reads are sent again, the rest answered.
        for (_, f) in self.requests.drain_lost() {
            let Inflight::Client {
                client_id,
                method,
                kept,
                ..
            } = f
            else {
                continue;
            };
            match method.resent_after_loss() && !stopping {
                true => {
                    debug!("sending a read request again once the server is back");
                    self.requeue_request(kept, client_id, method, now);
                }
                false => self.answer_proxy_error(&client_id, Reason::ServerExited, message),
            }
        }
        // Requests from the dead server the client has not answered yet.
        for id in self.requests.open_server_requests() {
            self.close_server_request(id, now);
            let params = format!("{{\"requestId\":{id},\"reason\":\"the MCP server exited\"}}");
            self.send_client(jsonrpc::notification_line(
                "notifications/cancelled",
                Some(&params),
            ));
        }
    }

    /// Puts a request that could not be answered by the server it was sent
    /// to back in the queue, within the time it had to wait from its first
    /// wait (a request the proxy sends again and again to a server that
    /// refuses it must not wait forever).
    pub(super) fn requeue_request(
        &mut self,
        m: Message,
        client_id: ClientId,
        method: Method,
        now: Instant,
    ) {
        let window = self.requests.waited(&client_id);
        let (since, expires) = window.unwrap_or((now, self.link.wait_until(now)));
        let item = Queued::Request {
            m,
            client_id: client_id.clone(),
            method,
        };
        match self.enqueue(item, since, expires.max(now)) {
            Some(seq) => self.requests.queued(&client_id, seq, since, expires),
            None => {
                let msg = self.link.queue_full_message();
                self.answer_proxy_error(&client_id, Reason::ServerUnavailable, msg);
            }
        }
    }

    /// Answers everything queued: the server will not be there without
    /// someone fixing something.
    fn refuse_queue(&mut self, now: Instant) {
        for seq in self.link.queued() {
            self.queue_give_up(seq, now, "stopped waiting after");
        }
    }

    /// The server is down (it is gone, or a start or probe failed): plans
    /// the next probe ([`Link::plan_probe`]). What waits keeps waiting,
    /// unless what stopped the server needs fixing: then it is answered at
    /// once with what to fix.
    pub(super) fn link_down(&mut self, message: String, heal: Heal, now: Instant) {
        let waiting = self.link.has_queued() || self.calls.tools_deferred();
        self.with_link(now, |link, out| {
            link.plan_probe(message, heal, waiting, now, out)
        });
        if heal == Heal::Fix {
            self.refuse_queue(now);
            self.give_up_deferred_tools(now);
        }
    }

    /// The probe timer fired.
    pub(super) fn on_probe_due(&mut self, seq: u64, now: Instant) {
        if self.link.probe_due(seq) {
            self.calls.count_restart();
            self.stats_dirty();
            self.traced(|t| t.respawned(now));
            self.start_server(now);
        }
    }

    /// Where traffic for the server goes right now ([`Link::route`]).
    pub(super) fn route(&mut self, now: Instant) -> Route {
        self.with_link(now, |link, out| link.route(now, out))
    }

    /// Sends `out` to the current incarnation ([`Link::send`]).
    pub(super) fn send_server(&mut self, out: Outgoing) -> bool {
        self.link.send(out, self.eager)
    }

    /// Sends a request ([`Link::send_request`]); a line that waits to be
    /// written can be withdrawn ([`Dispatcher::withdraw`]) until it is.
    pub(super) fn send_server_request(&mut self, out: Outgoing) -> SendResult {
        let down = out.request_id().unwrap_or_default();
        let (sent, withdraw) = self.link.send_request(out, self.eager);
        if let Some(w) = withdraw {
            self.requests.unwritten(down, w);
        }
        sent
    }

    /// Withdraws request `down` if its line still waits to be written:
    /// true if it never will be (the server never sees it).
    pub(super) fn withdraw(&mut self, down: u64) -> bool {
        self.requests.withdraw(down)
    }
}

// ----- instant start: the dispatcher's side of `InstantStart` ------------
//
// Consulted at these points only: a client request it may answer
// (`instant_request`), the server's handshake (accepted: `instant_accepted`;
// the replay's answer: `instant_verdict`), the session ready
// (`instant_read_lists`), a list's page or its failure (`instant_page`,
// `instant_list_failed`), the link lost, its timers, and `status`.

impl Dispatcher {
    /// Instant start for this session, with the entry found at start.
    pub fn with_instant_start(
        mut self,
        entry: Option<Entry>,
        jobs: Sender<CacheJob>,
    ) -> Dispatcher {
        self.instant = Some(Box::new(InstantStart::new(entry, jobs)));
        self
    }

    /// Runs `f` on instant start at `now`, if it is on, then carries out
    /// the effects it pushed, in order.
    fn with_instant<R>(
        &mut self,
        now: Instant,
        f: impl FnOnce(&mut InstantStart, &mut Vec<InstantEffect>) -> R,
    ) -> Option<R> {
        let instant = self.instant.as_mut()?;
        let mut out = Vec::new();
        let r = f(instant, &mut out);
        for effect in out {
            match effect {
                InstantEffect::Timer(at, timer) => self.set_timer(at, timer),
                InstantEffect::Ask(list, cursor) => {
                    self.request_list_page(list, cursor.as_deref(), now)
                }
                InstantEffect::ListTools => {
                    self.with_calls(now, |c, ctx, out| c.fetch_tools(ctx.link, out));
                }
                InstantEffect::Notify(method) => {
                    self.send_client(jsonrpc::notification_line(method, None))
                }
            }
        }
        Some(r)
    }

    /// A client request instant start may take: an `initialize` (not in a
    /// batch) or a first page of a list, while the real server is not
    /// ready. Whether it was taken (it is answered either way).
    pub(super) fn instant_request(
        &mut self,
        client_id: &str,
        method: &str,
        m: &Message,
        batch: Option<u64>,
    ) -> bool {
        let Some(instant) = self.instant.as_ref() else {
            return false;
        };
        if method == "initialize" {
            return batch.is_none() && self.instant_initialize(client_id, m);
        }
        let Some(line) = instant.list(client_id, method, m.params()) else {
            return false;
        };
        self.answer(client_id, line);
        true
    }

    /// The client's `initialize`, when the entry matches its protocol
    /// version ([`InstantStart::initialize`]): the session is the client's
    /// from now on, as if the server had accepted it, and the real server
    /// gets it (asking for the version the entry says). Whether it was
    /// taken (it is answered either way).
    fn instant_initialize(&mut self, client_id: &str, m: &Message) -> bool {
        let first = !self.link.handshake_begun();
        let (now, grace) = (self.now, self.cfg.instant_start_grace);
        let told = self.with_instant(now, |i, out| {
            i.initialize(client_id, m.params(), first, now + grace, out)
        });
        let Some(result) = told.flatten() else {
            return false;
        };
        self.link.begin_from_cache(m.params(), &result);
        // Down or between starts: the next start replays it.
        if self.link.unready() {
            self.replay_initialize(now);
        }
        self.status_dirty();
        true
    }

    /// `Timer::InstantGrace`: the server did not answer `initialize` in
    /// time; the client gets the cached answer.
    pub(super) fn instant_grace_over(&mut self) {
        if let Some((client_id, line)) = self.instant.as_mut().and_then(|i| i.grace_over()) {
            self.answer(&client_id, line);
        }
    }

    /// The server answered the `initialize` replayed for a held cached
    /// answer within `instant_start_grace`, with `real`: the client gets the server's
    /// own answer and the session is the server's, as without the cache.
    /// Whether an answer was held.
    pub(super) fn instant_answered_in_grace(&mut self, real: Option<&str>, now: Instant) -> bool {
        let Some(instant) = self.instant.as_mut() else {
            return false;
        };
        let (Some(client_id), Some(real)) = (instant.answered_in_grace(real), real) else {
            return false;
        };
        debug!(
            "the MCP server answered initialize within {:?}; the cached answer is not used",
            self.cfg.instant_start_grace
        );
        self.link.answered_in_grace(real);
        self.reporting.ready(now);
        self.instant_accepted(real);
        self.answer(&client_id, jsonrpc::response_line(&client_id, real));
        self.status_dirty();
        true
    }

    /// The link found `problem` with `m`, the answer to the replayed
    /// `initialize` (or none): a session begun from the cache checks it
    /// against what the client was told ([`InstantStart::check`]). False
    /// if the session ends here (the server contradicted the cache).
    pub(super) fn instant_verdict(
        &mut self,
        m: &Message,
        problem: Option<&str>,
        now: Instant,
    ) -> bool {
        if !self.instant_unchecked() {
            return true;
        }
        let version = self.link.client_version();
        let checked = match problem {
            Some(p) => Err(p.to_owned()),
            None => self
                .with_instant(now, |i, out| i.check(m, &version, out))
                .expect("unchecked: on"),
        };
        match checked {
            Ok(checked) => {
                if checked.tools_lost {
                    self.link.tools_lost();
                }
                self.status_dirty();
                info!(
                    "the MCP server is ready after {}; the session began from the handshake cache",
                    super::calls::secs(now.saturating_duration_since(self.reporting.started_at()))
                );
                self.reporting.ready(now);
                true
            }
            Err(p) => {
                self.instant_contradicted(&p, now);
                false
            }
        }
    }

    /// Whether the real server's handshake is still to be checked against
    /// the cached one the client was told.
    pub(super) fn instant_unchecked(&self) -> bool {
        self.instant.as_ref().is_some_and(|i| i.unchecked())
    }

    /// How long the handshake replayed to a new incarnation may take.
    pub(super) fn replay_wait(&self) -> Duration {
        let timeout = self.cfg.call_timeout;
        self.instant
            .as_ref()
            .map_or(timeout, |i| i.replay_wait(timeout))
    }

    /// The real server contradicts the cached handshake the client was
    /// given where no bridge holds: the entry goes, every pending request
    /// gets the proxy's error and the session ends, so that the host
    /// connects again and gets the server's own handshake.
    fn instant_contradicted(&mut self, problem: &str, now: Instant) {
        let message = format!(
            "the MCP server's handshake differs from the cached one the session began with ({problem}); the cache entry was removed and the session ends: reconnect to the server (in Claude Code: /mcp)"
        );
        warn!("{message}");
        if let Some(instant) = self.instant.as_mut() {
            instant.contradicted();
        }
        // Exit 75 asks the host to connect again; a session the client
        // ended already just ends.
        if !matches!(self.phase, Phase::Stopping { .. }) {
            self.handshake_changed = true;
        }
        for id in self.requests.open_ids() {
            self.answer_proxy_error(&id, Reason::ServerUnavailable, &message);
        }
        self.begin_shutdown(None, now);
    }

    /// The server accepted the client's own `initialize` (no cache hit):
    /// its lists are read for the next session.
    pub(super) fn instant_accepted(&mut self, result: &str) {
        let version = self.link.client_version();
        if let Some(instant) = self.instant.as_mut() {
            instant.accepted(&version, result);
        }
    }

    /// The link is ready and the session initialized: ask for the lists
    /// still to be read ([`InstantStart::read_lists`]).
    pub(super) fn instant_read_lists(&mut self, now: Instant) {
        if !self.link.is_initialized() || !self.link.ready() {
            return;
        }
        let restarted = self.link.generation() > 1;
        self.with_instant(now, |i, out| i.read_lists(restarted, out));
    }

    /// Sends the proxy's own request for a page of `list`.
    fn request_list_page(&mut self, list: List, cursor: Option<&str>, now: Instant) {
        let params = crate::mcp::tools_list_params(cursor, self.link.modern_meta());
        let down = self.requests.issue(Inflight::Listing {
            list,
            first: cursor.is_none(),
        });
        let line = jsonrpc::request_line(&down.to_string(), list.method(), Some(&params));
        if self.send_server(Outgoing::own_request(down, list.method(), &params, line)) {
            self.set_timer(now + self.cfg.call_timeout, Timer::ListingTimeout { down });
        } else {
            self.requests.forget(down);
            self.instant_list_failed(list);
        }
    }

    /// A page of `list` passed by ([`InstantStart::page`]).
    pub(super) fn instant_page(
        &mut self,
        list: List,
        result: Option<&str>,
        first: bool,
        source: Source,
        now: Instant,
    ) {
        self.with_instant(now, |i, out| i.page(list, result, first, source, out));
    }

    /// `Timer::ListingTimeout`: the proxy's own list request `down` was
    /// not answered in time.
    pub(super) fn on_listing_timeout(&mut self, down: u64) {
        let listing = |f: &Inflight| matches!(f, Inflight::Listing { .. });
        if let Some(Inflight::Listing { list, .. }) = self.requests.take_if(down, listing) {
            self.instant_list_failed(list);
        }
    }

    /// The proxy's own request for a page of `list` got no answer.
    pub(super) fn instant_list_failed(&mut self, list: List) {
        if let Some(instant) = self.instant.as_mut() {
            instant.list_failed(list);
        }
    }
}
