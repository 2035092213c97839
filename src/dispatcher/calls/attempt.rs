//! The attempts of a call: admission by the breaker, sending (the
//! dispatcher routes and sends; the call records it), the answer, and the
//! ways an attempt fails (a transient error, a timeout, a line never
//! delivered), with progress keeping an attempt alive, and a client that
//! gave a progress token told, at least every [`WAIT_NOTICE`], what a call
//! that waits waits for.

#![forbid(unsafe_code)]

use std::time::Duration;

use crate::dispatcher::{CallError, Reason};
use crate::downstream::Outgoing;
use crate::jsonrpc::{Message, RawObject};
use crate::policy::breaker::Admission;
use crate::policy::gate;
use crate::{debug, info};

use super::call::{Call, Failure, Phase};
use super::text::fields;
use super::{trace, Action, CallTimer, Calls, Ctx, Issued, Trace};

/// How often a call that waits tells a client that gave a progress token
/// (half of the 10 s a host's idle timer must be reset within, so a loaded
/// machine still meets it).
pub(in crate::dispatcher) const WAIT_NOTICE: Duration = Duration::from_secs(5);

impl Calls {
    /// Call `id` is due for an attempt: whether one may be made now. Not if
    /// the call is gone, waits in the queue, or the open breaker refuses it
    /// (the call is then answered).
    pub(in crate::dispatcher) fn admit(
        &mut self,
        id: u64,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) -> bool {
        let Some(call) = self.calls.get_mut(&id) else {
            return false;
        };
        if let Phase::BackingOff(_) = call.phase {
            call.phase = Phase::Idle;
        }
        if let Phase::Queued(_) = call.phase {
            return false;
        }
        if matches!(call.claim, Some(super::keys::Claim::Pending(_))) {
            // It is started when the store answers its claim.
            return false;
        }
        if call.trial {
            // It holds the half-open trial already (its attempt never
            // reached the server): it is that trial still.
            return true;
        }
        let (admission, transition) = self.breaker.admit(ctx.now);
        match admission {
            Admission::Trial => call.trial = true,
            Admission::Allowed => call.trial = false,
            Admission::Rejected { .. } => {}
        }
        self.log_transition(transition);
        match admission {
            Admission::Rejected { retry_after } => {
                self.refuse_by_breaker(id, retry_after, false, ctx, out);
                false
            }
            Admission::Trial | Admission::Allowed => true,
        }
    }

    /// Call `id` is due for an attempt and the link is ready: admitted
    /// ([`Calls::admit`]), the attempt goes as downstream request `down`
    /// (the id the dispatcher will issue next), recorded as
    /// [`Calls::send`] does; true if it goes: the dispatcher then issues
    /// `down` and sends [`Calls::attempt_line`]. One run of the calls.
    pub(in crate::dispatcher) fn start(
        &mut self,
        id: u64,
        down: u64,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) -> bool {
        self.admit(id, ctx, out) && self.record_attempt(id, down, ctx, out)
    }

    /// The admitted attempt of call `id` goes to the server as downstream
    /// request `down` (with `traceparent` in its `_meta` when export is
    /// on): its timeout is set and its message returned, for the
    /// dispatcher to send; `None` if the call has ended.
    pub(in crate::dispatcher) fn send(
        &mut self,
        id: u64,
        down: u64,
        traceparent: Option<&str>,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) -> Option<Outgoing> {
        if !self.record_attempt(id, down, ctx, out) {
            return None;
        }
        self.attempt_line(id, down, traceparent)
    }

    /// The message of call `id`'s attempt `down` (with `traceparent` in its
    /// `_meta` when export is on), written into the one copy of the
    /// request.
    pub(in crate::dispatcher) fn attempt_line(
        &self,
        id: u64,
        down: u64,
        traceparent: Option<&str>,
    ) -> Option<Outgoing> {
        let call = self.calls.get(&id)?;
        let line = traceparent
            .and_then(|tp| {
                let edit = call.traceparent_edit.as_ref();
                crate::otel::attempt_line(&call.request, down, tp, edit)
            })
            .unwrap_or_else(|| {
                let mut digits = [0; 20];
                let id = crate::otel::decimal(down, &mut digits);
                call.request
                    .line_with_id(std::str::from_utf8(id).expect("digits are ASCII"))
            });
        Some(Outgoing::request(down, "tools/call", line).in_era(call.modern.clone()))
    }

    /// Call `id`'s admitted attempt is downstream request `down`: counted,
    /// live, its timeout set. False if the call has ended.
    fn record_attempt(&mut self, id: u64, down: u64, ctx: Ctx, out: &mut Vec<Action>) -> bool {
        let Some(call) = self.calls.get_mut(&id) else {
            return false;
        };
        if !call.read_only {
            // It may change what cached reads returned.
            super::invalidate(&mut self.cache, &call.tool, "may write");
        }
        call.cache_epoch = self.cache.epoch();
        call.attempts += 1;
        let counters = self.counters.tool(&call.tool);
        counters.attempts += 1;
        if call.attempts > 1 {
            counters.retries += 1;
            call.retried = true;
            info!(
                fields: fields(&call.tool, call.attempts, None),
                "tool \"{}\": attempt {} (downstream id {down})",
                call.tool, call.attempts
            );
        }
        call.phase = Phase::InFlight(down);
        call.attempt_started = ctx.now;
        call.attempt_deadline = (ctx.now + call.attempt_timeout).min(call.deadline);
        let timer = CallTimer::AttemptTimeout { call: id, down };
        out.push(Action::Timer(call.attempt_deadline, timer));
        self.downstream.insert(down, Issued::Attempt(id));
        true
    }

    /// The server could not be given attempt `down` (it takes no more
    /// input): it was never sent, as for a line the link reports unsent.
    pub(in crate::dispatcher) fn attempt_unsent(
        &mut self,
        down: u64,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) {
        let failure = Failure::NeverSent("the server takes no more input".into());
        self.on_unanswered(down, failure, ctx, out);
    }

    /// The next attempt of call `id` waits in the link's queue as item
    /// `seq`.
    pub(in crate::dispatcher) fn queued(&mut self, id: u64, seq: u64) {
        if let Some(call) = self.calls.get_mut(&id) {
            call.phase = Phase::Queued(seq);
        }
    }

    /// The link takes call `id`'s attempt out of its queue: whether the call
    /// still wants it.
    pub(in crate::dispatcher) fn unqueued(&mut self, id: u64) -> bool {
        match self.calls.get_mut(&id) {
            Some(call) => {
                call.unqueue();
                true
            }
            None => false,
        }
    }

    /// The link refuses call `id`'s next attempt (`reason`, `message`).
    pub(in crate::dispatcher) fn refused_by_link(
        &mut self,
        id: u64,
        reason: Reason,
        message: &str,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) {
        let attempts = self.calls.get(&id).map_or(0, |c| c.attempts);
        let error = CallError::proxy(reason, message, &[("attempts", attempts.to_string())]);
        self.refuse_attempt(id, &error, ctx, out);
    }

    /// The server answered attempt `down` of call `id` (live, or abandoned
    /// but still able to answer).
    pub(super) fn attempt_answered(
        &mut self,
        id: u64,
        down: u64,
        m: Message,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) {
        let Some(call) = self.calls.get_mut(&id) else {
            return;
        };
        let is_live = call.live() == Some(down);
        let transient = m
            .error()
            .is_some_and(|e| gate::is_transient_error(e, &self.cfg.retry.transient_codes));
        if !is_live {
            // A late answer from an abandoned attempt: the first valid answer
            // wins while the call is still unanswered.
            call.dead.retain(|d| *d != down);
            if transient {
                return debug!("dropped a late transient error for tool \"{}\"", call.tool);
            }
            info!(
                "tool \"{}\": using a late answer from an abandoned attempt",
                call.tool
            );
            if let Some(live) = call.take_live() {
                self.downstream.remove(&live);
                let reason = "superseded by an earlier attempt's answer".into();
                let attempt = call.live_attempt();
                out.push(Action::Cancel {
                    down: live,
                    reason,
                    attempt,
                });
            }
        }
        if transient {
            call.take_live();
            let error = m.error().unwrap_or_default().to_owned();
            return self.attempt_failed(id, Failure::Transient(error), ctx, out);
        }
        // A final answer: a result (isError or not) or a final error.
        let trial = call.trial;
        if m.result().is_some() {
            let t = self.breaker.on_success(trial, ctx.now);
            self.log_transition(t);
        } else if trial {
            // A final error says nothing about health; free the trial.
            self.breaker.on_trial_abandoned();
        }
        // A late answer from an abandoned attempt ends the live one.
        let failure = match m.error() {
            _ if !is_live => Some("superseded"),
            Some(_) => Some("server_error"),
            None => None,
        };
        trace(ctx, out, || Trace::AttemptEnded { call: id, failure });
        self.finish_with_server_answer(id, m, ctx, out);
    }

    /// An attempt of call `id` failed; retry if allowed, else answer.
    pub(super) fn attempt_failed(
        &mut self,
        id: u64,
        failure: Failure,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) {
        let wanted = matches!(failure, Failure::NeverSent(_)) && self.dedup_waiters(id) > 0;
        let Some(call) = self.calls.get_mut(&id) else {
            return;
        };
        let kind = failure.kind();
        trace(ctx, out, || Trace::AttemptEnded {
            call: id,
            failure: Some(kind),
        });
        if let Failure::NeverSent(_) = failure {
            // Not sent: not counted as sent (a retry neither).
            self.counters.never_sent(&call.tool, call.attempts > 1);
            // The server never had it: not the server's failure (the link's
            // probes deal with that) and no retry used. It goes again as a
            // new call would, waiting for the server if it is down, within
            // its deadline; it keeps the breaker's trial if it held it.
            if call.deadline > ctx.now && (call.client.is_some() || wanted) {
                debug!(
                    "tool \"{}\": the attempt never reached the server; it goes again",
                    call.tool
                );
                call.attempts = call.attempts.saturating_sub(1);
                call.phase = Phase::BackingOff(ctx.now);
                out.push(Action::Timer(ctx.now, CallTimer::RetryDue { call: id }));
                return;
            }
        }
        let trial = std::mem::take(&mut call.trial);
        if failure.counts() {
            let t = self.breaker.on_failure(trial, ctx.now);
            self.log_transition(t);
        } else if trial {
            // It says nothing of health; free the trial.
            self.breaker.on_trial_abandoned();
        }
        self.decide(id, failure, ctx, out);
    }

    /// A call timer fired. Returns the call whose retry is due: its attempt
    /// is for the dispatcher to start (see [`Calls::admit`]).
    pub(in crate::dispatcher) fn on_timer(
        &mut self,
        timer: CallTimer,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) -> Option<u64> {
        match timer {
            CallTimer::AttemptTimeout { call, down } => {
                self.attempt_timed_out(call, down, ctx, out)
            }
            CallTimer::RetryDue { call } => {
                let due = |c: &Call| matches!(c.phase, Phase::BackingOff(t) if t <= ctx.now);
                return self
                    .calls
                    .get(&call)
                    .is_some_and(|c| due(c))
                    .then_some(call);
            }
            CallTimer::CallDeadline { call } => {
                if let Some(failure) = self.calls.get_mut(&call).and_then(|c| c.take_parked()) {
                    self.decide(call, failure, ctx, out);
                }
                self.claim_overdue(call, ctx, out);
            }
            CallTimer::WaitNotice { call } => {
                let due = self.calls.get(&call).and_then(|c| c.notice_at);
                if due.is_some_and(|at| at <= ctx.now) {
                    self.notice_wait(call, ctx, out);
                }
            }
        }
        None
    }

    /// Call `id` began to wait (for the server, a backoff, the tool list):
    /// a client that gave a progress token is told now, and again every
    /// [`WAIT_NOTICE`] while it waits (a notice set for an earlier wait
    /// gives way).
    pub(in crate::dispatcher) fn wait_began(&mut self, id: u64, ctx: Ctx, out: &mut Vec<Action>) {
        self.notice_wait(id, ctx, out);
    }

    /// Tells the client of call `id` what it waits for, with a progress
    /// value of the proxy's own, if it waits; then again after
    /// [`WAIT_NOTICE`].
    fn notice_wait(&mut self, id: u64, ctx: Ctx, out: &mut Vec<Action>) {
        let tries = self.cfg.retry.max_retries.saturating_add(1);
        let Some(call) = self.calls.get_mut(&id) else {
            return;
        };
        call.notice_at = None;
        let (Some(token), true) = (&call.progress_token, call.client.is_some()) else {
            return;
        };
        let next = call.attempts.saturating_add(1);
        let what = match call.phase {
            Phase::Queued(_) => format!("waiting for the MCP server to come back, attempt {next}"),
            Phase::BackingOff(at) if at > ctx.now => format!(
                "waiting {} to retry, attempt {next} of {tries}",
                super::secs(at - ctx.now)
            ),
            Phase::Parked(_) => "waiting for the tool list to decide on a retry".to_owned(),
            Phase::InFlight(_) | Phase::BackingOff(_) | Phase::Idle => return,
        };
        let Some(value) = call.progress.own() else {
            return;
        };
        let params = format!(
            "{{\"progressToken\":{token},\"progress\":{},\"message\":{}}}",
            serde_json::Value::from(value),
            crate::jsonrpc::json_string(&what)
        );
        let line = crate::jsonrpc::notification_line("notifications/progress", Some(&params));
        out.push(Action::Notify(line));
        let at = ctx.now + WAIT_NOTICE;
        call.notice_at = Some(at);
        out.push(Action::Timer(at, CallTimer::WaitNotice { call: id }));
    }

    /// Attempt `down` of call `id` may have run out of time.
    fn attempt_timed_out(&mut self, id: u64, down: u64, ctx: Ctx, out: &mut Vec<Action>) {
        let Some(call) = self.calls.get_mut(&id) else {
            return;
        };
        if call.live() != Some(down) {
            return;
        }
        let timer = CallTimer::AttemptTimeout { call: id, down };
        if call.attempt_deadline > ctx.now {
            // Progress moved the deadline.
            return out.push(Action::Timer(call.attempt_deadline, timer));
        }
        if ctx.link.paused && call.deadline > ctx.now {
            // The server waits for a person (sampling, elicitation): the
            // attempt's clock is paused until that request is answered
            // (`resume_clocks`); the call's total deadline still holds.
            return out.push(Action::Timer(call.deadline, timer));
        }
        call.phase = Phase::Idle;
        call.dead.push(down);
        let took = ctx.now.saturating_duration_since(call.attempt_started);
        trace(ctx, out, || Trace::CancelledDownstream { call: id });
        let reason = "timed out (mcp-retry)".into();
        let attempt = call.live_attempt();
        out.push(Action::Cancel {
            down,
            reason,
            attempt,
        });
        self.attempt_failed(id, Failure::Timeout(took), ctx, out);
    }

    /// A `notifications/progress` from the server: if its token is a
    /// call's, it keeps the live attempt alive and is forwarded when it
    /// passes what the client has seen. False when the token is not a
    /// call's.
    pub(in crate::dispatcher) fn on_progress(
        &mut self,
        m: &Message,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) -> bool {
        let Some(params) = m.params().and_then(RawObject::parse) else {
            return false;
        };
        let Some(token) = params.get("progressToken").map(|t| t.get()) else {
            return false;
        };
        let Some(call) = self
            .by_token
            .get(token)
            .and_then(|id| self.calls.get_mut(id))
        else {
            return false;
        };
        if call.live().is_none() {
            return true;
        }
        // Progress means the attempt is alive, whatever the value: a retry
        // counts from 0 again and is not forwarded until it passes what the
        // client has seen, but it must not time out meanwhile.
        call.attempt_deadline = (ctx.now + call.attempt_timeout).min(call.deadline);
        let value = params
            .get("progress")
            .and_then(|p| p.get().parse::<f64>().ok());
        let Some(value) = value else {
            return true;
        };
        if call.client.is_some() && call.progress.admit(value) {
            out.push(Action::Notify(m.line()));
        }
        true
    }
}
