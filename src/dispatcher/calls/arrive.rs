//! A client's `tools/call` arrives: it is read once (tool, keys, argument
//! fingerprint, safety), answered from the cache or the idempotency table
//! when they hold its answer (or refused when an earlier call with its key
//! may have run), joined to an identical call in flight, or made a new
//! [`Call`] whose first attempt the dispatcher starts.

#![forbid(unsafe_code)]

use crate::dispatcher::{CallError, CallOutcome, ClientId, Reason};
use crate::inbound::ParsedCall;
use crate::jsonrpc::{self, Message};
use crate::otel::{CallEnd, SpanContext};
use crate::policy::dedup::{hex, Lookup, Mark};
use crate::policy::gate;
use crate::policy::progress::ProgressFilter;
use crate::{info, warn};

use super::call::Call;
use super::text::{secs, with_source, Source};
use super::{trace, Action, Arrival, Calls, Ctx, First, ProxyAnswer, Trace};

/// What a call's arrival establishes, read once from its request.
struct Arriving {
    tool: String,
    explicit_key: Option<String>,
    /// The key is in `_meta` and the server honours keys.
    key_honored: bool,
    read_only: bool,
    progress_token: Option<String>,
    /// Params to forward when `_idempotency_key` was removed.
    forward_params: Option<String>,
    cache_key: Option<String>,
    dedup_key: Option<u128>,
    dedup_args: u128,
    /// With a store, a keyed call's argument fingerprint for its record.
    store_args: Option<String>,
    modern: Option<std::sync::Arc<crate::mcp::Modern>>,
    client_context: Option<SpanContext>,
    traceparent_edit: Option<crate::otel::TraceparentEdit>,
}

impl Calls {
    /// A client `tools/call` (`parsed` as its reader thread read it: `None`
    /// when it has no object params with a string `name`): the cache, then
    /// the idempotency table, then a new call.
    pub(in crate::dispatcher) fn arrive(
        &mut self,
        m: Message,
        parsed: Option<Box<ParsedCall>>,
        client_id: ClientId,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) -> Arrival {
        let Some(parsed) = parsed else {
            // Not ours to judge: let the server answer the malformed call.
            return Arrival::Relay(m);
        };
        let new = self.read_call(parsed, m.params().unwrap_or_default());
        self.counters.tool(&new.tool).calls += 1;
        if let Some(result) = self.cached(&new, ctx) {
            info!("tool \"{}\": answered from the cache", new.tool);
            self.counters.tool(&new.tool).cache_hits += 1;
            let parent = new.client_context;
            let tool = new.tool;
            return answered_at_once(parent, tool, client_id, &result, Source::Cache, ctx, out);
        }
        match new.dedup_key {
            Some(key) => self.join_or_replay(m, new, key, client_id, ctx, out),
            None => Arrival::Started(self.open(m, new, client_id, ctx, out)),
        }
    }

    /// [`Calls::arrive`], and in the same run a new call's first attempt:
    /// with the link ready, admitted and recorded under `ctx.attempt_id`
    /// ([`Calls::start`]); else admitted, for the dispatcher to route.
    pub(in crate::dispatcher) fn arrive_and_start(
        &mut self,
        m: Message,
        parsed: Option<Box<ParsedCall>>,
        client_id: ClientId,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) -> (Arrival, First) {
        let arrival = self.arrive(m, parsed, client_id, ctx, out);
        let Arrival::Started(id) = arrival else {
            return (arrival, First::Waiting);
        };
        let first = match ctx.link.ready {
            true if self.start(id, ctx.attempt_id, ctx, out) => First::Recorded,
            false if self.admit(id, ctx, out) => First::Admitted,
            _ => First::Waiting,
        };
        (arrival, first)
    }

    /// The idempotency table decides for a call with dedup `key`: join an
    /// identical call in flight, replay a result it holds, or run.
    fn join_or_replay(
        &mut self,
        m: Message,
        new: Arriving,
        key: u128,
        waiter: ClientId,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) -> Arrival {
        // A keyless read runs again rather than replay an old answer; a
        // keyless write only ever finds results its client never got.
        let replay = new.explicit_key.is_some() || !new.read_only;
        match self
            .dedup
            .lookup_or_join(&key, new.dedup_args, waiter, replay, ctx.now)
        {
            Lookup::Joined { same_args } => {
                self.deduplicated(&new, same_args, false);
                let call = self.by_key.get(&key).copied();
                trace(ctx, out, || Trace::Joined { call });
                Arrival::Joined(call)
            }
            Lookup::Replay {
                result,
                waiter,
                same_args,
            } => {
                self.deduplicated(&new, same_args, true);
                let parent = new.client_context;
                answered_at_once(parent, new.tool, waiter, &result, Source::Dedup, ctx, out)
            }
            Lookup::Marked { mark, waiter, .. } => self.not_run_again(new, mark, waiter, ctx, out),
            Lookup::Execute(client) => {
                self.dedup.start(&key, new.dedup_args, ctx.now);
                let args = new.store_args.clone().unwrap_or_default();
                let id = self.open(m, new, client, ctx, out);
                // With a store, its first attempt waits for its claim.
                self.claim_first(id, args, out);
                Arrival::Started(id)
            }
        }
    }

    /// An earlier call with this call's key may have run, or ran with a
    /// result too large to keep (`mark`): `client` gets the proxy's error
    /// saying so, and the tool is not called.
    fn not_run_again(
        &mut self,
        new: Arriving,
        mark: Mark,
        client: ClientId,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) -> Arrival {
        let tool = new.tool;
        let key = new.explicit_key.as_deref().unwrap_or_default();
        let (reason, message, extra) = not_run_error(&tool, key, mark, ctx.now);
        let error = CallError::proxy(reason, &message, &extra);
        trace(ctx, out, || {
            Trace::AnsweredByProxy(Box::new(ProxyAnswer {
                tool: tool.clone(),
                client: client.clone(),
                client_context: new.client_context,
                end: CallEnd::failed(reason.as_str()),
            }))
        });
        self.counters.tool(&tool).failed += 1;
        let outcome = CallOutcome::Proxy(reason);
        self.counters
            .ended(&tool, None, outcome, Some(&error.object), ctx.now);
        let line = jsonrpc::error_response_line(&client, &error.object);
        out.push(Action::Answer { client, line });
        Arrival::Answered
    }

    /// Decides what the policies need of a call, once: its safety, and
    /// from the one fingerprint of the arguments its reader made, the keys
    /// of the cache and dedup, and the check that calls sharing a key agree.
    /// `params` are the call's params as the client sent them.
    fn read_call(&self, parsed: Box<ParsedCall>, params: &str) -> Arriving {
        let tool = parsed.name.as_str();
        let key_honored = parsed.key_in_meta && self.honors_keys(tool);
        let read_only = gate::is_read_only(&self.gate_input(tool, key_honored));
        let cache_key = match (parsed.args_fp, parsed.no_store) {
            (Some(fp), false) if !self.cache.ttl_for(tool).is_zero() => {
                Some(format!("{tool}\0{}", hex(fp, &mut [0; 32])))
            }
            _ => None,
        };
        let (dedup_key, dedup_args) = (parsed.dedup_key, parsed.dedup_args);
        // Made by the reader, which knows the store's scope; made here
        // only for a call read without it.
        let store_args = match (&self.keys, &parsed.explicit_key) {
            (Some(k), Some(_)) if !parsed.no_store => parsed.store_args.clone().or_else(|| {
                Some(crate::store::args_fingerprint(
                    &k.scope,
                    parsed.arguments(params),
                ))
            }),
            _ => None,
        };
        let forward_params = parsed.forward_params().map(str::to_owned);
        Arriving {
            modern: parsed.modern,
            client_context: parsed.client_context,
            traceparent_edit: parsed.traceparent_edit,
            tool: parsed.name,
            store_args,
            explicit_key: parsed.explicit_key,
            key_honored,
            read_only,
            progress_token: parsed.progress_token,
            forward_params,
            cache_key,
            dedup_key,
            dedup_args,
        }
    }

    /// `honors_idempotency_keys` for `tool`: its own setting, else the
    /// server's.
    fn honors_keys(&self, tool: &str) -> bool {
        self.cfg
            .tools
            .get(tool)
            .and_then(|t| t.honors_idempotency_keys)
            .unwrap_or(self.cfg.honors_idempotency_keys)
    }

    /// A fresh cached result for the call, if it is cached.
    fn cached(&mut self, new: &Arriving, ctx: Ctx) -> Option<String> {
        let key = new.cache_key.as_ref()?;
        self.cache.get(key, ctx.now).map(str::to_owned)
    }

    /// The call joined an identical one in flight, or was `replayed` a
    /// result. Calls sharing an explicit key are one operation whatever
    /// their other arguments; when those differ, say so (tool and key,
    /// never values).
    fn deduplicated(&mut self, new: &Arriving, same_args: bool, replayed: bool) {
        let tool = &new.tool;
        match (replayed, &new.explicit_key) {
            (false, _) => info!("tool \"{tool}\": joined an identical call in flight"),
            (true, Some(k)) => info!(
                "tool \"{tool}\": replayed the result of idempotency key {}",
                jsonrpc::json_string(k)
            ),
            (true, None) => info!(
                "tool \"{tool}\": replayed the result of an identical call whose answer the client never received"
            ),
        }
        if let (Some(k), false) = (&new.explicit_key, same_args) {
            reused_with_other_arguments(tool, k);
        }
        self.counters.tool(tool).dedup_hits += 1;
    }

    /// Makes the arriving call a [`Call`] of `client`, indexed by its dedup
    /// key and progress token; it counts as a first attempt for the budget.
    fn open(
        &mut self,
        m: Message,
        new: Arriving,
        client: ClientId,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) -> u64 {
        let timeout = self
            .cfg
            .tools
            .get(&new.tool)
            .and_then(|t| t.timeout)
            .unwrap_or(self.cfg.call_timeout);
        self.next_call += 1;
        let id = self.next_call;
        if let Some(key) = new.dedup_key {
            self.by_key.insert(key, id);
        }
        if let Some(token) = &new.progress_token {
            self.by_token.insert(token.clone(), id);
        }
        let request = match &new.forward_params {
            Some(p) => m.with_params(p).unwrap_or(m),
            None => m,
        };
        let now = ctx.now;
        // Boxed: a call is moved in and out of the table whole.
        self.calls.insert(
            id,
            Box::new(Call {
                client: Some(client),
                tool: new.tool,
                request,
                client_context: new.client_context,
                progress_token: new.progress_token,
                dedup_key: new.dedup_key,
                dedup_args: new.dedup_args,
                explicit_key: new.explicit_key,
                key_honored: new.key_honored,
                read_only: new.read_only,
                cache_key: new.cache_key,
                cache_epoch: self.cache.epoch(),
                attempts: 0,
                phase: super::call::Phase::Idle,
                dead: Vec::new(),
                attempt_timeout: timeout,
                attempt_started: now,
                started: now,
                attempt_deadline: now,
                deadline: now + self.cfg.retry.total_timeout,
                last_failure: None,
                progress: ProgressFilter::new(),
                notice_at: None,
                trial: false,
                waited_for_tools: None,
                retried: false,
                claim: None,
                modern: new.modern,
                traceparent_edit: new.traceparent_edit,
            }),
        );
        trace(ctx, out, || Trace::CallStarted { call: id });
        self.budget.record_first_attempt(now);
        id
    }
}

/// The proxy's error for a call of `tool` with idempotency `key` that is
/// not run because of `mark`: its reason, message and `data` members.
pub(super) fn not_run_error(
    tool: &str,
    key: &str,
    mark: Mark,
    now: std::time::Instant,
) -> (Reason, String, Vec<(&'static str, String)>) {
    let key = jsonrpc::json_string(key);
    let mut extra = vec![("attempts", "0".to_owned())];
    let (reason, message) = match mark {
        Mark::Unknown { cause, since } => {
            let ago = now.saturating_duration_since(since);
            warn!(
                "tool \"{tool}\": idempotency key {key} not run again: an earlier call started {} ago and its outcome is unknown ({cause})",
                secs(ago)
            );
            extra.push(("outcome", "\"unknown\"".to_owned()));
            extra.push(("cause", jsonrpc::json_string(cause)));
            extra.push(("startedMsAgo", ago.as_millis().to_string()));
            let message = format!(
                "tool \"{tool}\" was not called: an earlier call with idempotency key {key} started {} ago and its outcome is unknown ({cause}): it may have run. The key is not run again within idempotency_ttl; check whether that call took effect, then use a new key to run it again",
                secs(ago)
            );
            (Reason::EarlierAttemptUnknown, message)
        }
        Mark::Ran { at } => {
            let ago = now.saturating_duration_since(at);
            warn!(
                "tool \"{tool}\": idempotency key {key} not run again: an earlier call succeeded {} ago",
                secs(ago)
            );
            extra.push(("outcome", "\"succeeded\"".to_owned()));
            extra.push(("ranMsAgo", ago.as_millis().to_string()));
            let message = format!(
                "tool \"{tool}\" was not called: an earlier call with idempotency key {key} succeeded {} ago, and its result was too large to keep (idempotency_max_bytes). The key is not run again within idempotency_ttl; use a new key to run it again",
                secs(ago)
            );
            (Reason::AlreadyRan, message)
        }
    };
    (reason, message, extra)
}

/// Answers `client` at once with `result` the proxy holds.
fn answered_at_once(
    client_context: Option<SpanContext>,
    tool: String,
    client: ClientId,
    result: &str,
    source: Source,
    ctx: Ctx,
    out: &mut Vec<Action>,
) -> Arrival {
    let line = jsonrpc::response_line(&client, &with_source(result, source));
    trace(ctx, out, || {
        Trace::AnsweredByProxy(Box::new(ProxyAnswer {
            tool,
            client: client.clone(),
            client_context,
            end: CallEnd::from_proxy(source.as_str()),
        }))
    });
    out.push(Action::Answer { client, line });
    Arrival::Answered
}

/// A call with `key` for `tool` was answered as the operation an earlier
/// call with that key and other arguments made: said, with the tool and the
/// key, never the values.
pub(super) fn reused_with_other_arguments(tool: &str, key: &str) {
    warn!(
        "tool \"{tool}\": idempotency key {} was reused with different arguments; treated as the same operation",
        jsonrpc::json_string(key)
    );
}
