//! After a failed attempt: retry or give up. Whether the call may run
//! again at all (the safety gate, waiting for the tools' annotations when
//! they can be learned), then whether a retry fits (retries left, the
//! backoff and the server's hint within the total deadline, the breaker,
//! the retry budget), and the answer when it does not.

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crate::dispatcher::{CallError, Reason};
use crate::policy::backoff;
use crate::policy::breaker::BreakerState;
use crate::policy::gate::{self, Safety};
use crate::{debug, info, warn};

use super::call::{Call, Failure, Phase};
use super::text::{describe_failure, fields, give_up_message};
use super::{trace, Action, CallTimer, Calls, Ctx, Trace};

/// Whether a retry fits, and if not, why.
enum Verdict {
    /// Retry `delay` from now.
    Retry { delay: Duration },
    /// No retry; the call is answered with this reason.
    GiveUp(Reason),
    /// The retry would find the breaker still open (for this long).
    BreakerOpen(Duration),
}

impl Calls {
    /// Retry or give up, after `failure`.
    pub(super) fn decide(&mut self, id: u64, failure: Failure, ctx: Ctx, out: &mut Vec<Action>) {
        let Some(call) = self.calls.get_mut(&id) else {
            return;
        };
        call.last_failure = Some(failure.clone());
        let what = describe_failure(&call.tool, &failure);
        if call.client.is_none() && self.dedup_waiters(id) == 0 {
            return self.drop_call(id, "cancelled by the client".into(), ctx, out);
        }
        if failure.ambiguous() && !self.safe_to_repeat(id, &failure, &what, ctx, out) {
            return;
        }
        match self.verdict(id, &failure, ctx.now) {
            Verdict::Retry { delay } => self.schedule_retry(id, delay, &failure, &what, ctx, out),
            Verdict::BreakerOpen(retry_after) => {
                self.log_no_retry(id, Reason::CircuitOpen, &what, retry_after);
                self.refuse_by_breaker(id, retry_after, true, ctx, out);
            }
            Verdict::GiveUp(reason) => {
                self.log_no_retry(id, reason, &what, Duration::ZERO);
                self.give_up(id, reason, &failure, ctx, out);
            }
        }
    }

    /// Call `id` is retried `delay` from now.
    fn schedule_retry(
        &mut self,
        id: u64,
        delay: Duration,
        failure: &Failure,
        what: &str,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) {
        let Some(call) = self.calls.get_mut(&id) else {
            return;
        };
        let retry = call.attempts.saturating_sub(1) + 1;
        info!(
            fields: fields(&call.tool, call.attempts, Some(failure.kind())),
            "{what}; retrying in {:.2}s (retry {retry} of {})",
            delay.as_secs_f64(),
            self.cfg.retry.max_retries
        );
        let at = crate::policy::instant_add(ctx.now, delay);
        call.phase = Phase::BackingOff(at);
        out.push(Action::Timer(at, CallTimer::RetryDue { call: id }));
        trace(ctx, out, || Trace::Backoff {
            call: id,
            delay,
            retry,
        });
        self.wait_began(id, ctx, out);
    }

    /// Says why call `id` is not retried (`what` happened; the breaker is
    /// open for another `retry_after`).
    fn log_no_retry(&self, id: u64, reason: Reason, what: &str, retry_after: Duration) {
        let Some(call) = self.calls.get(&id) else {
            return;
        };
        let why = match reason {
            Reason::CircuitOpen => format!(
                "no retry: the circuit breaker for \"{}\" is open for another {:.1}s",
                self.cfg.name,
                retry_after.as_secs_f64()
            ),
            Reason::DeadlineExceeded => {
                "no retry: the next attempt would start after retry.total_timeout".into()
            }
            Reason::RetryBudgetExhausted => {
                "no retry: the retry budget for this server is exhausted".into()
            }
            _ => format!("giving up after {} attempt(s)", call.attempts),
        };
        let fields = fields(&call.tool, call.attempts, Some(reason.as_str()));
        warn!(fields: fields, "{what}; {why}");
    }

    /// Whether a retry of call `id` after `failure` fits: retries left,
    /// the delay (backoff, or the server's longer hint) within the call's
    /// deadline, a breaker that will not refuse it, and the retry budget
    /// (withdrawn from only when all else allows).
    fn verdict(&mut self, id: u64, failure: &Failure, now: Instant) -> Verdict {
        let Some(call) = self.calls.get(&id) else {
            return Verdict::GiveUp(Reason::RetriesExhausted);
        };
        if let Failure::Rejected(..) = failure {
            // Refused for good: the same request would be refused again.
            return Verdict::GiveUp(Reason::Rejected);
        }
        let retries_done = call.attempts.saturating_sub(1);
        let max_retries = self.cfg.retry.max_retries;
        if retries_done >= max_retries {
            return Verdict::GiveUp(match failure {
                Failure::Timeout(_) if max_retries == 0 => Reason::Timeout,
                _ => Reason::RetriesExhausted,
            });
        }
        let hint = match failure {
            Failure::Transient(e) => backoff::retry_after_hint(e),
            Failure::Refused(_, hint) => *hint,
            _ => None,
        };
        let delay = self
            .backoff
            .delay(retries_done + 1, &mut self.rng)
            .max(hint.unwrap_or_default());
        let at = crate::policy::instant_add(now, delay);
        if at >= call.deadline {
            return Verdict::GiveUp(Reason::DeadlineExceeded);
        }
        if let BreakerState::Open { until } = self.breaker.state() {
            if *until > at {
                // The retry would only be refused when it is due.
                return Verdict::BreakerOpen(until.saturating_duration_since(now));
            }
        }
        if !self.budget.try_withdraw(now) {
            return Verdict::GiveUp(Reason::RetryBudgetExhausted);
        }
        Verdict::Retry { delay }
    }

    /// After an ambiguous failure: whether the call may run again. When the
    /// tool's annotations are unknown and can be learned (from the current
    /// incarnation, or the next one after a crash), the call waits for them
    /// within its deadline, once per incarnation, and false is returned;
    /// when it is unsafe it is answered, and false is returned.
    fn safe_to_repeat(
        &mut self,
        id: u64,
        failure: &Failure,
        what: &str,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) -> bool {
        let Some(call) = self.calls.get(&id) else {
            return false;
        };
        match gate::classify_safety(&self.gate_input(&call.tool, call.key_honored)) {
            Safety::Safe(why) => {
                debug!("tool \"{}\" is safe to retry ({})", call.tool, why.as_str());
                return true;
            }
            Safety::Unsafe => {}
        }
        if self.could_learn_safety(call, ctx) {
            // Do not guess: learn the annotations first.
            self.park(id, failure.clone(), ctx, out);
            return false;
        }
        let reason = match failure {
            Failure::Exited(_) => Reason::ServerExited,
            _ => Reason::NotRetriedUnsafe,
        };
        warn!(
            fields: fields(&call.tool, call.attempts, Some(reason.as_str())),
            "{what}; not retried: the tool is not known to be idempotent"
        );
        self.give_up(id, reason, failure, ctx, out);
        false
    }

    /// Whether `call`, unsafe as far as is known, may learn otherwise: the
    /// annotations decide (not the config), are unknown and can be asked
    /// of a server that has not been asked for this call, within its
    /// deadline.
    fn could_learn_safety(&self, call: &Call, ctx: Ctx) -> bool {
        let config_decides = self
            .cfg
            .tools
            .get(&call.tool)
            .is_some_and(|t| t.idempotent.is_some() || t.read_only == Some(true));
        self.cfg.trust_annotations
            && !config_decides
            && !self.tools.known
            && ctx.link.initialized
            && ctx.link.reachable
            && call.waited_for_tools != Some(ctx.link.generation)
            && call.deadline > ctx.now
    }

    /// Call `id` waits for the tool list (until its deadline at the most)
    /// before `failure` is decided.
    fn park(&mut self, id: u64, failure: Failure, ctx: Ctx, out: &mut Vec<Action>) {
        let Some(call) = self.calls.get_mut(&id) else {
            return;
        };
        debug!(
            "tool \"{}\": waiting for the tool list before deciding on a retry",
            call.tool
        );
        call.phase = Phase::Parked(failure);
        call.waited_for_tools = Some(ctx.link.generation);
        let timer = CallTimer::CallDeadline { call: id };
        out.push(Action::Timer(call.deadline, timer));
        self.fetch_tools(ctx.link, out);
        self.wait_began(id, ctx, out);
    }

    /// Answers call `id` refused an attempt by the open breaker (for
    /// another `retry_after`): at once, with the breaker's error. For a
    /// `retry` the breaker would refuse when due, the error carries what is
    /// known of the last failure (the server's error, an unknown outcome);
    /// for an attempt refused now, the server's own last error wins.
    pub(super) fn refuse_by_breaker(
        &mut self,
        id: u64,
        retry_after: Duration,
        retry: bool,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) {
        let Some(call) = self.calls.get(&id) else {
            return;
        };
        let message = format!(
            "the circuit breaker for server \"{}\" is open after repeated failures; tool \"{}\" was not called{} (retry in {:.1}s)",
            self.cfg.name,
            call.tool,
            if retry { " again" } else { "" },
            retry_after.as_secs_f64()
        );
        let mut extra = vec![
            ("attempts", call.attempts.to_string()),
            ("retryAfterMs", retry_after.as_millis().to_string()),
        ];
        match &call.last_failure {
            Some(Failure::Transient(e)) if retry => extra.push(("lastError", e.clone())),
            Some(Failure::Exited(_) | Failure::Timeout(_) | Failure::Transport(..)) if retry => {
                extra.push(("outcome", "\"unknown\"".to_owned()))
            }
            _ => {}
        }
        let error = CallError::proxy(Reason::CircuitOpen, &message, &extra);
        trace(ctx, out, || Trace::BreakerRefused {
            call: id,
            retry_after,
        });
        self.refuse_attempt_with(id, &error, !retry, ctx, out);
    }

    /// Answers a call that will not be retried.
    fn give_up(
        &mut self,
        id: u64,
        reason: Reason,
        failure: &Failure,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) {
        let Some(call) = self.calls.get(&id) else {
            return;
        };
        let message = give_up_message(&call.tool, reason, failure, call.attempts);
        let mut extra = vec![("attempts", call.attempts.to_string())];
        if let Some(status) = failure.http_status() {
            extra.push(("httpStatus", status.to_string()));
        }
        match failure {
            Failure::Exited(_) | Failure::Transport(..) => {
                extra.push(("outcome", "\"unknown\"".to_owned()))
            }
            // The server said when to come back, past what the call may wait:
            // the client learns when.
            Failure::Refused(_, Some(hint)) => {
                extra.push(("retryAfterMs", hint.as_millis().to_string()));
            }
            _ => {}
        }
        // A stale cached answer, or the server's own error, come first.
        self.refuse_attempt(id, &CallError::proxy(reason, &message, &extra), ctx, out);
    }
}
