//! How a call ends: with the server's answer (stored in the cache and the
//! idempotency table when it may be), with an error (or a stale cached
//! answer instead), or dropped when every client waiting for it cancelled.
//! Every client of the call gets its one answer, its indexes are cleared,
//! and its attempts that may still answer are remembered as late. A keyed
//! call of a tool not known to be safe that may have run without an
//! outcome leaves its key marked, so that it is not run again.

#![forbid(unsafe_code)]

use std::borrow::Cow;

use crate::jsonrpc::{self, Message};
use crate::otel::CallEnd;
use crate::policy::dedup::{Keep, Mark};
use crate::policy::gate::{self, Safety};
use crate::stats::UnknownOutcome;
use crate::{debug, info};

use super::call::{Call, Failure, Late, Phase};
use super::keys::Claim;
use super::text::{storable, with_source, Source};
use super::{invalidate, trace, Action, Calls, Ctx, Issued, Trace, LATE_LIMIT};
use crate::dispatcher::{CallError, CallOutcome, ClientId};
use crate::policy::record::Outcome;

impl Calls {
    /// The next attempt of call `id` cannot be sent (breaker open, server
    /// not available): an expired cached answer within `stale_if_error`
    /// first, then the server's own error from the last attempt, else
    /// `error`.
    pub(in crate::dispatcher) fn refuse_attempt(
        &mut self,
        id: u64,
        error: &CallError,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) {
        self.refuse_attempt_with(id, error, true, ctx, out);
    }

    /// [`Calls::refuse_attempt`]; the server's own last error replaces
    /// `error` only if `server_error_first`.
    pub(super) fn refuse_attempt_with(
        &mut self,
        id: u64,
        error: &CallError,
        server_error_first: bool,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) {
        let Some(call) = self.calls.get(&id) else {
            return;
        };
        if let Some(key) = &call.cache_key {
            if let Some(stale) = self.cache.get_stale(key, ctx.now) {
                info!(
                    "tool \"{}\": answered with a stale cached result",
                    call.tool
                );
                let result = with_source(stale, Source::Stale);
                return self.finish_with_result(id, &result, ctx, out);
            }
        }
        match &call.last_failure {
            Some(Failure::Transient(e)) if server_error_first => {
                let e = CallError::server(e.clone());
                self.fail(id, &e, ctx, out)
            }
            _ => self.fail(id, error, ctx, out),
        }
    }

    /// Ends call `id` with `error` for every waiting client.
    pub(in crate::dispatcher) fn fail(
        &mut self,
        id: u64,
        error: &CallError,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) {
        let Some(call) = self.remove_call(id, out) else {
            return;
        };
        trace(ctx, out, || Trace::CallFailed {
            call: id,
            reason: error.outcome().failure_label().unwrap_or_default(),
        });
        let stats = self.counters.tool(&call.tool);
        stats.failed += 1;
        if call.retried {
            stats.retried += 1;
        }
        self.end_without_server(call, Err(error), ctx, out);
    }

    /// Ends call `id` with the server's final answer.
    pub(super) fn finish_with_server_answer(
        &mut self,
        id: u64,
        m: Message,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) {
        let Some(call) = self.remove_call(id, out) else {
            return;
        };
        let end = CallEnd::answered(m.error().is_some());
        trace(ctx, out, || Trace::CallEnded { call: id, end });
        let stats = self.counters.tool(&call.tool);
        if call.retried {
            stats.retried += 1;
        }
        if m.result().is_some() {
            if call.retried {
                stats.recovered += 1;
            }
        } else {
            stats.failed += 1;
        }
        // Whether the result may be kept is read only when something would
        // keep it: a cache entry, the store's record, a replay under a key.
        let keeps = call.cache_key.is_some() || call.claim.is_some() || call.explicit_key.is_some();
        let success = m.result().filter(|r| keeps && storable(r));
        self.store_success(&call, success, ctx);
        if call.claim.is_some() {
            let recorded = match success {
                Some(r) => self.success_outcome(r),
                None => Outcome::Released,
            };
            self.record_end(&call, recorded, out);
        }
        // The client gets this answer: only an explicit key replays it.
        let store = match (&call.explicit_key, success) {
            (Some(_), Some(r)) => Some((r.to_owned(), Keep::Always)),
            _ => None,
        };
        let waiters = match &call.dedup_key {
            Some(k) => self.dedup.complete(k, store, ctx.now),
            None => Vec::new(),
        };
        let shared = (!waiters.is_empty()).then(|| match (m.result(), m.error()) {
            (Some(r), _) => Ok(with_source(r, Source::Dedup)),
            (None, Some(e)) => Err(e.to_owned()),
            (None, None) => Err(jsonrpc::error_object(
                jsonrpc::INVALID_REQUEST,
                "empty answer",
                None,
            )),
        });
        let outcome = match m.error() {
            Some(_) => CallOutcome::ServerError,
            None => CallOutcome::Ok,
        };
        let took = call.took(ctx.now);
        self.counters
            .ended(&call.tool, took, outcome, m.error(), ctx.now);
        if let Some(client) = call.client {
            let line = m.into_line_with_id(&client);
            out.push(Action::Answer { client, line });
        }
        if let Some(shared) = shared {
            for client in waiters {
                let line = match &shared {
                    Ok(r) => jsonrpc::response_line(&client, r),
                    Err(e) => jsonrpc::error_response_line(&client, e),
                };
                out.push(Action::Answer { client, line });
            }
        }
    }

    /// The cache after `call`'s final answer: a call that may write
    /// empties it; a storable `success` of a cached tool is kept, unless
    /// something that may write ran since its attempt began (the result
    /// may predate that write).
    fn store_success(&mut self, call: &Call, success: Option<&str>, ctx: Ctx) {
        let fresh = self.cache.epoch() == call.cache_epoch;
        if !call.read_only {
            invalidate(&mut self.cache, &call.tool, "ran");
        }
        if let (Some(key), Some(result), true) = (&call.cache_key, success, fresh) {
            let ttl = self.cache.ttl_for(&call.tool);
            self.cache
                .insert(key.clone(), result.to_owned(), ttl, ctx.now);
        }
    }

    /// Ends call `id` with a result the proxy holds (a stale cache entry).
    fn finish_with_result(&mut self, id: u64, result: &str, ctx: Ctx, out: &mut Vec<Action>) {
        let Some(call) = self.remove_call(id, out) else {
            return;
        };
        trace(ctx, out, || Trace::CallEnded {
            call: id,
            end: CallEnd::stale(),
        });
        if call.retried {
            self.counters.tool(&call.tool).retried += 1;
        }
        self.end_without_server(call, Ok(result), ctx, out);
    }

    /// Answers every client of `call`, which ended without the server's
    /// answer reaching them, with what the proxy has: a `result` or an
    /// `error` object. A breaker trial it held is freed (nothing was
    /// learned of the server), and its attempts that may still answer are
    /// remembered as late.
    fn end_without_server(
        &mut self,
        call: Box<Call>,
        answer: Result<&str, &CallError>,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) {
        if call.trial {
            self.breaker.on_trial_abandoned();
        }
        let unknown = self.unknown_outcome(&call, false);
        self.record_end(&call, recorded_end(unknown), out);
        let waiters = match (&call.dedup_key, unknown) {
            (Some(k), Some(mark)) => self.mark_unknown(&call, *k, mark, ctx),
            (Some(k), None) => self.dedup.complete(k, None, ctx.now),
            (None, _) => Vec::new(),
        };
        self.keep_late_answers(&call);
        let took = call.took(ctx.now);
        for client in call.client.into_iter().chain(waiters) {
            let line = match answer {
                Ok(result) => jsonrpc::response_line(&client, result),
                Err(error) => jsonrpc::error_response_line(&client, &error.object),
            };
            out.push(Action::Answer { client, line });
        }
        let outcome = match answer {
            Ok(_) => CallOutcome::Ok,
            Err(e) => e.outcome(),
        };
        let error = answer.err().map(|e| e.object.as_str());
        self.counters
            .ended(&call.tool, took, outcome, error, ctx.now);
    }

    /// Whether `call`, ending without an answer from the server, leaves
    /// its key marked, and why: it carries an explicit key (one operation),
    /// the tool is not known to be safe to run twice, and an attempt may
    /// have run without an outcome (its last failure was ambiguous, or,
    /// when the client `cancelled`, an attempt was at the server).
    fn unknown_outcome(&self, call: &Call, cancelled: bool) -> Option<Mark> {
        call.explicit_key.as_ref()?;
        let cause = match &call.last_failure {
            Some(f @ (Failure::Timeout(_) | Failure::Exited(_) | Failure::Transport(..))) => {
                f.kind()
            }
            _ if cancelled && call.live().is_some() => "cancelled",
            _ => return None,
        };
        match gate::classify_safety(&self.gate_input(&call.tool, call.key_honored)) {
            Safety::Safe(_) => None,
            Safety::Unsafe => Some(Mark::Unknown {
                cause,
                since: call.started,
            }),
        }
    }

    /// Marks `call`'s `key` as run with an unknown outcome (`mark`), for
    /// the idempotency table and for `status`; returns its joined waiters.
    fn mark_unknown(&mut self, call: &Call, key: u128, mark: Mark, ctx: Ctx) -> Vec<ClientId> {
        let waiters = self.dedup.complete_unknown(&key, mark, ctx.now);
        if let Some(Mark::Unknown { cause, since }) = self.dedup.mark_of(&key) {
            self.counters.changed = true;
            self.counters.stats.unknown_outcome(UnknownOutcome {
                tool: call.tool.clone(),
                key: call.explicit_key.clone().unwrap_or_default(),
                started: since,
                cause,
                until: crate::policy::instant_add(ctx.now, self.cfg.idempotency_ttl),
                fingerprint: key,
            });
        }
        waiters
    }

    /// Forgets call `id` and every id that pointed at it.
    pub(super) fn remove_call(&mut self, id: u64, out: &mut Vec<Action>) -> Option<Box<Call>> {
        let call = self.calls.remove(&id)?;
        if let Phase::Queued(seq) = call.phase {
            out.push(Action::Unqueue(seq));
        }
        for down in call.live().iter().chain(&call.dead) {
            self.downstream.remove(down);
        }
        if let Some(k) = &call.dedup_key {
            if self.by_key.get(k) == Some(&id) {
                self.by_key.remove(k);
            }
        }
        if let Some(t) = &call.progress_token {
            if self.by_token.get(t) == Some(&id) {
                self.by_token.remove(t);
            }
        }
        Some(call)
    }

    /// A call ended without its clients getting the server's success (they
    /// got an error, a stale answer, or cancelled): its attempts that may
    /// still answer are remembered, so that a late success can be handed to
    /// the next identical call instead of running the tool again. Only for
    /// calls that dedup applies to and that may write (or carry a key): a
    /// read simply runs again. The oldest are forgotten past [`LATE_LIMIT`].
    fn keep_late_answers(&mut self, call: &Call) {
        if !call.read_only {
            invalidate(&mut self.cache, &call.tool, "may have run");
        }
        let Some(key) = call.dedup_key else { return };
        if call.read_only && call.explicit_key.is_none() {
            return;
        }
        let keep = match call.explicit_key {
            Some(_) => Keep::Always,
            None => Keep::Once,
        };
        for &down in call.live().iter().chain(&call.dead) {
            let late = Late {
                key,
                args: call.dedup_args,
                keep,
                tool: call.tool.clone(),
                started: call.started,
                record: match call.claim {
                    Some(Claim::Held(id)) => Some(id),
                    _ => None,
                },
            };
            self.downstream.insert(down, Issued::Late(Box::new(late)));
            self.late.push_back(down);
        }
        while self.late.len() > LATE_LIMIT {
            if let Some(old) = self.late.pop_front() {
                if let Some(Issued::Late(_)) = self.downstream.get(&old) {
                    self.downstream.remove(&old);
                }
            }
        }
    }

    /// An answer to an attempt whose call had already ended. A success is
    /// kept for the next identical call (replacing the mark of an unknown
    /// outcome); a definite answer that is not kept (an error) lifts the
    /// mark: the outcome is known.
    pub(super) fn late_answer(
        &mut self,
        late: Late,
        m: &Message,
        now: std::time::Instant,
        out: &mut Vec<Action>,
    ) {
        if let Some(id) = late.record {
            let outcome = match m.result().filter(|r| storable(r)) {
                Some(r) => self.success_outcome(r),
                None => Outcome::Released,
            };
            self.record_late(id, outcome, out);
        }
        let Some(result) = m.result() else {
            self.release_late(&late);
            return debug!(
                "dropped a late error for tool \"{}\", whose call had ended",
                late.tool
            );
        };
        invalidate(&mut self.cache, &late.tool, "ran late");
        if !storable(result) {
            self.release_late(&late);
            return;
        }
        info!(
            "tool \"{}\": a late success arrived after the client got no answer from it; kept for an identical call",
            late.tool
        );
        self.dedup
            .store_late(late.key, late.args, result.to_owned(), late.keep, now);
        self.known_now(late.key);
    }

    /// A late definite answer that is not kept lifts the mark of `late`'s
    /// key.
    fn release_late(&mut self, late: &Late) {
        self.dedup.release(&late.key, late.started);
        self.known_now(late.key);
    }

    /// `status` no longer lists `key` once its outcome is not unknown any
    /// more (a result, a lifted mark, a success too large to keep).
    fn known_now(&mut self, key: u128) {
        let unknown = matches!(self.dedup.mark_of(&key), Some(Mark::Unknown { .. }));
        if !unknown
            && self
                .counters
                .stats
                .unknown
                .iter()
                .any(|u| u.fingerprint == key)
        {
            self.counters.stats.forget_unknown(key);
            self.counters.changed = true;
        }
    }

    /// Stops call `id`, which nobody waits for any more: its live attempt
    /// is cancelled downstream (for `reason`), nobody is answered.
    pub(super) fn drop_call(
        &mut self,
        id: u64,
        reason: Cow<'static, str>,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) {
        let Some(call) = self.remove_call(id, out) else {
            return;
        };
        if let Some(live) = call.live() {
            let attempt = call.live_attempt();
            out.push(Action::Cancel {
                down: live,
                reason,
                attempt,
            });
        }
        trace(ctx, out, || Trace::CallEnded {
            call: id,
            end: CallEnd::cancelled(),
        });
        if call.trial {
            self.breaker.on_trial_abandoned();
        }
        let unknown = self.unknown_outcome(&call, true);
        self.record_end(&call, recorded_end(unknown), out);
        match (&call.dedup_key, unknown) {
            (Some(k), Some(mark)) => {
                self.mark_unknown(&call, *k, mark, ctx);
            }
            (Some(k), None) => {
                self.dedup.abandon(k);
            }
            (None, _) => {}
        }
        self.keep_late_answers(&call);
        debug!(
            "tool \"{}\": call dropped after the client cancelled",
            call.tool
        );
    }

    /// Clients joined to call `id` (besides the one that started it).
    pub(super) fn dedup_waiters(&self, id: u64) -> usize {
        self.calls
            .get(&id)
            .and_then(|c| c.dedup_key)
            .map_or(0, |k| self.dedup.joiners(&k))
    }

    /// The client cancelled `client_id`, a member of call `id` (the client
    /// that started it, or one joined to it): the call goes on for the
    /// others, and is dropped when nobody is left.
    pub(in crate::dispatcher) fn cancel_member(
        &mut self,
        id: u64,
        client_id: &str,
        reason: &str,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) {
        let Some(call) = self.calls.get_mut(&id) else {
            return;
        };
        if call.client.as_deref() == Some(client_id) {
            call.client = None;
        } else if let Some(k) = call.dedup_key {
            self.dedup.remove_waiter(&k, |w| **w == *client_id);
        }
        if self.calls.get(&id).is_some_and(|c| c.client.is_none()) && self.dedup_waiters(id) == 0 {
            self.drop_call(id, reason.to_owned().into(), ctx, out);
        } else {
            debug!("a joined request was cancelled; the call continues for the others");
        }
    }
}

/// What a call that ended without the server's answer records in the
/// store: unknown when it may have run (`unknown`), else released.
fn recorded_end(unknown: Option<Mark>) -> Outcome {
    match unknown {
        Some(Mark::Unknown { cause, .. }) => Outcome::Unknown(cause.to_owned()),
        _ => Outcome::Released,
    }
}
