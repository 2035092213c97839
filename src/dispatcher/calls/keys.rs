//! Keyed calls and the store that outlives the process (`store: local`):
//! a call with an explicit idempotency key claims its record before its
//! first byte is sent, and tells the store how it ended.
//!
//! Owns [`KeyStore`], the store's state in the calls (the sending end of
//! the `store` thread, the scope, what to do when the store is
//! unavailable), the claim of each keyed call ([`Claim`]), what a claim's
//! answer means for the call (run, replay, not run again, wait over,
//! unavailable), and the outcome each end of a keyed call records. The
//! calls push [`Action::Store`] requests and never touch the channel; the
//! dispatcher hands them over. Without a store (`memory`) nothing here
//! runs: the in-process idempotency table alone decides, as before.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Sender;

use crate::dispatcher::{CallError, Reason};
use crate::jsonrpc;
use crate::policy::dedup::{Keep, Mark};
use crate::policy::gate::{self, Safety};
use crate::policy::record::{About, Outcome, Reply, Timing, OWNER_LOST};
use crate::redact::Redactor;
use crate::stats::MAX_KEY_CHARS;
use crate::store::thread::{Answer, Held, Request, Told, PROXY_EXITED};
use crate::store::{record_id, Id};
use crate::{info, warn};

use super::call::Call;
use super::text::{with_source, Source};
use super::{Action, CallTimer, Calls, Ctx, Trace};
use crate::otel::CallEnd;

/// How long a claim's owner is taken for alive without renewing it.
pub const LEASE: Duration = Duration::from_secs(10);
/// How long past its deadline a call waits for the store's answer to its
/// claim before it ends without it.
const CLAIM_GRACE: Duration = Duration::from_secs(1);
/// Most bytes of results on their way to the store thread at once: a
/// result that would go past it is recorded as run without its result
/// (`done`: never run again, answered `already_ran`), so a store slower
/// than the server cannot grow the proxy.
pub const MAX_QUEUED_BYTES: u64 = 8 << 20;

/// What to do with a keyed call of a tool not known to be safe when the
/// store cannot be asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable {
    /// Run it with this process's idempotency table alone.
    Local,
    /// Refuse it (`store_unavailable`).
    Refuse,
}

/// The store's state in the calls.
pub struct KeyStore {
    tx: Sender<Request>,
    pub(super) scope: [u8; 32],
    unavailable: Unavailable,
    /// The store was found unavailable (said once).
    warned: bool,
    /// The engine asked for (`local`).
    engine: &'static str,
    /// The server's name in the records, for `status`.
    server: String,
    /// The key prefix of a shared store (`store_prefix`), for `status`
    /// (`None` for the host's own).
    prefix: Option<String>,
    /// A shared store's `store_ca_file` (absolute), for `status`.
    ca_file: Option<String>,
    /// Removes the server's env and header values from a key before it
    /// is kept.
    redactor: Redactor,
    /// Bytes of results handed to the store thread and not yet written.
    queued: Arc<AtomicU64>,
    /// A result was recorded without its text for lack of room (said once).
    warned_full: bool,
}

impl KeyStore {
    pub fn new(
        tx: Sender<Request>,
        scope: [u8; 32],
        unavailable: Unavailable,
        engine: &'static str,
        cfg: &crate::config::ServerConfig,
    ) -> KeyStore {
        let secrets: Vec<(String, String)> = cfg.env.iter().chain(&cfg.headers).cloned().collect();
        KeyStore {
            tx,
            scope,
            unavailable,
            warned: false,
            engine,
            server: cfg.name.clone(),
            prefix: None,
            ca_file: None,
            redactor: Redactor::new(&secrets),
            queued: Arc::new(AtomicU64::new(0)),
            warned_full: false,
        }
    }

    /// The store is shared (Redis) with keys under `prefix` (and a
    /// private CA in `ca_file`): `status` reads this server's scope there.
    pub fn shared(&mut self, prefix: &str, ca_file: Option<String>) {
        self.prefix = Some(prefix.to_owned());
        self.ca_file = ca_file;
    }

    /// `req` with its result's bytes counted, or, past
    /// [`MAX_QUEUED_BYTES`], recorded as run without its result.
    fn bounded(&mut self, req: Request) -> Request {
        let Request::Finish {
            id,
            outcome: Outcome::Result(result),
            timing,
            held: None,
        } = req
        else {
            return req;
        };
        let bytes = result.len() as u64;
        if self.queued.load(Ordering::SeqCst) + bytes > MAX_QUEUED_BYTES {
            if !self.warned_full {
                self.warned_full = true;
                warn!("store: results come faster than the store writes them; some are kept as run without their result (a later call with the key is not run, and gets already_ran)");
            }
            return Request::Finish {
                id,
                outcome: Outcome::Ran,
                timing,
                held: None,
            };
        }
        Request::Finish {
            id,
            outcome: Outcome::Result(result),
            timing,
            held: Some(Held::new(&self.queued, bytes)),
        }
    }

    /// What the record of `key` for `tool` says of its call: both
    /// shortened to [`MAX_KEY_CHARS`], the key redacted.
    fn about(&self, tool: &str, key: &str) -> About {
        let short = |s: &str| crate::status::truncate(s, MAX_KEY_CHARS);
        About {
            server: short(&self.server),
            tool: short(tool),
            key: self.redactor.redact(&short(key)),
        }
    }

    /// Hands `req` to the store thread (the dispatcher's part).
    pub fn send(&self, req: Request) {
        if self.tx.send(req).is_err() {
            warn!("store: the store thread has ended; the request was dropped");
        }
    }
}

/// Where a keyed call is with its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Claim {
    /// Asked for; the first attempt waits for the answer.
    Pending(Id),
    /// Ours: the call runs, and its end is recorded.
    Held(Id),
}

impl Calls {
    /// The store (`local`): from now on keyed calls claim their records.
    pub(in crate::dispatcher) fn use_store(&mut self, store: KeyStore) {
        self.counters.stats.store.wanted = Some(store.engine);
        self.counters.stats.store.shared_scope = store.prefix.clone().map(|p| (p, store.scope));
        self.counters.stats.store.ca_file.clone_from(&store.ca_file);
        self.counters.changed = true;
        self.keys = Some(store);
    }

    /// The scope of the store's records, when there is a store.
    pub(in crate::dispatcher) fn store_scope(&self) -> Option<[u8; 32]> {
        self.keys.as_ref().map(|k| k.scope)
    }

    /// Hands a request to the store thread.
    pub(in crate::dispatcher) fn store_send(&mut self, req: Request) {
        if let Some(k) = &mut self.keys {
            let req = k.bounded(req);
            k.send(req);
            self.counters.stats.store.operations += 1;
            self.counters.changed = true;
        }
    }

    /// What the store thread told: a claim's answer (the call that may
    /// run now, for the dispatcher to start), or how the store opened.
    pub(in crate::dispatcher) fn store_told(
        &mut self,
        told: Told,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) -> Option<u64> {
        match told {
            Told::Answer(answer) => self.claimed(answer, ctx, out),
            Told::Opened(health) => {
                self.counters.stats.store.opened = Some(health);
                self.counters.changed = true;
                None
            }
            Told::Outage(outage) => {
                self.counters.stats.store.outage = outage;
                self.counters.changed = true;
                None
            }
        }
    }

    fn timing(&self) -> Timing {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Timing {
            ttl: ms(self.cfg.idempotency_ttl),
            lease: ms(crate::guard::duration("lease", LEASE)),
        }
    }

    /// A new keyed call `id` with argument fingerprint `args`: with a
    /// store, it claims its record first (its attempt waits for the
    /// answer). Whether it did.
    pub(super) fn claim_first(&mut self, id: u64, args: String, out: &mut Vec<Action>) -> bool {
        let Some(keys) = &self.keys else {
            return false;
        };
        let scope = keys.scope;
        let timing = self.timing();
        let Some(call) = self.calls.get_mut(&id) else {
            return false;
        };
        let Some(key) = &call.explicit_key else {
            return false;
        };
        let record = record_id(&scope, &call.tool, key);
        let about = keys.about(&call.tool, key);
        call.claim = Some(Claim::Pending(record));
        out.push(Action::Store(Request::Claim {
            call: id,
            id: record,
            args,
            timing,
            wait_until: call.deadline,
            about,
        }));
        // The store answers by the deadline (a twin still waiting is told
        // so); this is the backstop for a store that never answers.
        let backstop = call.deadline + CLAIM_GRACE;
        out.push(Action::Timer(
            backstop,
            CallTimer::CallDeadline { call: id },
        ));
        true
    }

    /// The store answered call `answer.call`'s claim: the call that may run
    /// now, for the dispatcher to start.
    fn claimed(&mut self, answer: Answer, ctx: Ctx, out: &mut Vec<Action>) -> Option<u64> {
        let id = answer.call;
        let Some(Claim::Pending(record)) = self.calls.get(&id).and_then(|c| c.claim) else {
            // The call ended while it waited: its end was recorded after
            // the claim (the store thread takes requests in order).
            return None;
        };
        // The reply's times are ages on the store's own clock: never
        // compared with this host's.
        let ago = Duration::from_millis;
        let figures = &mut self.counters.stats.store;
        figures.waits += u64::from(answer.waited);
        match &answer.reply {
            Ok(Reply::Replay { .. }) => figures.replays += 1,
            Ok(Reply::Unknown { .. }) => figures.unknown_answers += 1,
            _ => {}
        }
        self.counters.changed = true;
        match answer.reply {
            Ok(Reply::Claimed) => {
                if let Some(c) = self.calls.get_mut(&id) {
                    c.claim = Some(Claim::Held(record));
                }
                Some(id)
            }
            Ok(Reply::Replay {
                result, same_args, ..
            }) => {
                if !same_args {
                    if let Some(c) = self.calls.get(&id) {
                        let key = c.explicit_key.as_deref().unwrap_or_default();
                        super::arrive::reused_with_other_arguments(&c.tool, key);
                    }
                }
                self.replay_stored(id, &result, ctx, out);
                None
            }
            Ok(Reply::Ran { ago: ms, .. }) => {
                let at = ctx.now.checked_sub(ago(ms)).unwrap_or(ctx.now);
                self.not_run(id, Mark::Ran { at }, ctx, out);
                None
            }
            Ok(Reply::Unknown { cause, ago: ms, .. }) => {
                let since = ctx.now.checked_sub(ago(ms)).unwrap_or(ctx.now);
                let cause = static_cause(&cause);
                self.not_run(id, Mark::Unknown { cause, since }, ctx, out);
                None
            }
            Ok(Reply::Busy { ago: ms, .. }) => {
                let call = self.calls.get(&id)?;
                let message = format!(
                    "tool \"{}\" was not called: an identical call with its idempotency key, started {} ago, is still running in another mcp-retry process and gave no answer within this call's deadline",
                    call.tool,
                    super::secs(ago(ms))
                );
                let extra = [("attempts", "0".to_owned())];
                let error = CallError::proxy(Reason::DeadlineExceeded, &message, &extra);
                self.set_claim(id, None);
                self.fail(id, &error, ctx, out);
                None
            }
            Ok(Reply::Written | Reply::NotOwner) => None,
            Err(why) => self.store_unavailable(id, &why, ctx, out),
        }
    }

    /// Call `id`'s deadline passed: if it still waits for its claim, the
    /// store did not answer; it ends without running.
    pub(super) fn claim_overdue(&mut self, id: u64, ctx: Ctx, out: &mut Vec<Action>) {
        let Some(Claim::Pending(_)) = self.calls.get(&id).and_then(|c| c.claim) else {
            return;
        };
        // Its end gives back whatever the store did with the claim (the
        // store thread takes requests in order).
        let message = "the tool was not called: the store of idempotency keys did not answer within the call's deadline";
        let extra = [("attempts", "0".to_owned())];
        let error = CallError::proxy(Reason::DeadlineExceeded, message, &extra);
        self.fail(id, &error, ctx, out);
    }

    fn set_claim(&mut self, id: u64, claim: Option<Claim>) {
        if let Some(c) = self.calls.get_mut(&id) {
            c.claim = claim;
        }
    }

    /// The store could not be asked about call `id`: it runs with this
    /// process's table, unless `store_unavailable: refuse` and its tool is
    /// not known to be safe.
    fn store_unavailable(
        &mut self,
        id: u64,
        why: &str,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) -> Option<u64> {
        self.set_claim(id, None);
        let (tool, honored) = {
            let c = self.calls.get(&id)?;
            (c.tool.clone(), c.key_honored)
        };
        let safe = matches!(
            gate::classify_safety(&self.gate_input(&tool, honored)),
            Safety::Safe(_)
        );
        let keys = self.keys.as_mut()?;
        if !keys.warned {
            keys.warned = true;
            warn!("store unavailable ({why}): keyed calls are not recorded beyond this process");
        }
        if safe || keys.unavailable == Unavailable::Local {
            return Some(id);
        }
        let message = format!(
            "tool \"{tool}\" was not called: the store of idempotency keys is unavailable ({why}), and store_unavailable is refuse"
        );
        let extra = [("attempts", "0".to_owned())];
        let error = CallError::proxy(Reason::StoreUnavailable, &message, &extra);
        self.fail(id, &error, ctx, out);
        None
    }

    /// Call `id` is not run: an earlier call with its key ran or may have
    /// (`mark`, from the store).
    fn not_run(&mut self, id: u64, mark: Mark, ctx: Ctx, out: &mut Vec<Action>) {
        self.set_claim(id, None);
        let Some(call) = self.calls.get(&id) else {
            return;
        };
        let key = call.explicit_key.clone().unwrap_or_default();
        let (reason, message, extra) =
            super::arrive::not_run_error(&call.tool, &key, mark, ctx.now);
        let error = CallError::proxy(reason, &message, &extra);
        self.fail(id, &error, ctx, out);
    }

    /// Call `id` is answered with the `result` the store kept, as a
    /// replay; so is every call joined to it.
    fn replay_stored(&mut self, id: u64, result: &str, ctx: Ctx, out: &mut Vec<Action>) {
        let Some(call) = self.remove_call(id, out) else {
            return;
        };
        let call: Box<Call> = call;
        info!("tool \"{}\": replayed a result the store kept", call.tool);
        self.counters.tool(&call.tool).dedup_hits += 1;
        trace(ctx, out, id);
        let waiters = match &call.dedup_key {
            Some(k) => self
                .dedup
                .complete(k, Some((result.to_owned(), Keep::Always)), ctx.now),
            None => Vec::new(),
        };
        let replayed = with_source(result, Source::Dedup);
        for client in call.client.into_iter().chain(waiters) {
            let line = jsonrpc::response_line(&client, &replayed);
            out.push(Action::Answer { client, line });
        }
        self.counters.ended(
            &call.tool,
            None,
            crate::dispatcher::CallOutcome::Ok,
            None,
            ctx.now,
        );
    }

    /// What `call`'s end records in the store: its outcome, if it
    /// claimed its record (a claim still pending is answered before this
    /// reaches the store thread, which takes requests in order).
    pub(super) fn record_end(&mut self, call: &Call, outcome: Outcome, out: &mut Vec<Action>) {
        if let Some(Claim::Held(id) | Claim::Pending(id)) = call.claim {
            self.record_late(id, outcome, out);
        }
    }

    /// A late answer's `outcome` for record `id`.
    pub(super) fn record_late(&mut self, id: Id, outcome: Outcome, out: &mut Vec<Action>) {
        let timing = self.timing();
        out.push(Action::Store(Request::Finish {
            id,
            outcome,
            timing,
            held: None,
        }));
    }

    /// The outcome of a success of `call` for the store: kept, or ran
    /// without a result when too large to keep.
    pub(super) fn success_outcome(&self, result: &str) -> Outcome {
        if result.len() > self.cfg.idempotency_max_bytes {
            Outcome::Ran
        } else {
            Outcome::Result(result.to_owned())
        }
    }
}

fn trace(ctx: Ctx, out: &mut Vec<Action>, call: u64) {
    super::trace(ctx, out, || Trace::CallEnded {
        call,
        end: CallEnd::from_proxy(Source::Dedup.as_str()),
    });
}

/// A cause read from the store as one of ours (the log and `status` take
/// static names); one we do not know is `unknown`.
fn static_cause(cause: &str) -> &'static str {
    [
        "timeout",
        "server_exited",
        "transport_error",
        "cancelled",
        OWNER_LOST,
        PROXY_EXITED,
    ]
    .into_iter()
    .find(|c| *c == cause)
    .unwrap_or("unknown")
}
