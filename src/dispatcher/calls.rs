//! `tools/call` resilience as a state machine: [`Calls`] owns every call in
//! flight (its attempts, live and abandoned downstream ids, deadlines,
//! joined clients), the indexes by dedup key, progress token and
//! downstream id, the late answers still awaited, what is known of the
//! tools' annotations, and the policies that decide for the calls (result
//! cache, idempotency table, breaker, retry budget, backoff), with the
//! per-tool counters.
//!
//! It is pure: no channels, no I/O, no clock reads. Each method takes an
//! event of a call and a [`Ctx`] (the time, and what the calls must know of
//! the server link), updates the state, and pushes [`Action`]s (answer a
//! client, send an attempt, cancel one downstream, set a timer, …) that the
//! dispatcher carries out in order, reporting back what only it can learn
//! (an attempt it could not send). It must not know the link beyond
//! [`LinkView`], the client request table, the link's queue, the timer heap
//! or the tracer: routing an attempt (send, queue or refuse), allocating
//! its downstream id and recording what happened are the dispatcher's.
//! Decisions come from the pure types in `policy/`; the calls apply them
//! and log them (through `log.rs`, as the dispatcher does).
//!
//! A call's life (its [`call::Phase`]; every arrow that ends it pushes
//! the clients' answers, and a live attempt's cancel):
//!
//! ```text
//!  arrive ──► cache / idempotency table hit ──► answered at once (no call)
//!    │    ──► same key or arguments in flight ──► joined to that call
//!    ▼
//!  Idle ◄─────────────── store claim answered (`claimed`)
//!    │ admit: breaker, claim          ╲ refused ──► ended
//!    ▼ (dispatcher routes)
//!    ├── queue ──► Queued(seq) ── link back: unqueued ──► Idle ──► send
//!    │                         ╲── gave up waiting ──► decide
//!    ├── send ──► InFlight(down) ── answer ──► ended (result, final error)
//!    │                ├── transient error, timeout, link lost ──► decide
//!    │                └── never sent ──► BackingOff(now)
//!    └── refuse ──► ended
//!  decide (gate, retries, budget, deadline, breaker):
//!    ├── retry ──► BackingOff(at) ── RetryDue ──► admit
//!    ├── annotations unknown ──► Parked(failure) ── tools learned,
//!    │                                               deadline ──► decide
//!    └── give up ──► ended (a key that may have run is marked unknown)
//!  A timed-out or superseded attempt stays in `dead` until it answers:
//!  its late answer may still end the call, or after the end go `Late`.
//! ```

#![forbid(unsafe_code)]

use std::borrow::Cow;
use std::collections::hash_map::RandomState;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::ServerConfig;
use crate::dispatcher::{CallError, CallOutcome, ClientId};
use crate::fasthash::FastMap;
use crate::jsonrpc::Message;
use crate::otel::{CallEnd, SpanContext};
use crate::policy::backoff::Backoff;
use crate::policy::breaker::{Breaker, BreakerState, Transition};
use crate::policy::budget::RetryBudget;
use crate::policy::cache::ResultCache;
use crate::policy::dedup::DedupTable;
use crate::policy::gate::GateInput;
use crate::stats::{Stats, ToolStats};
use crate::{debug, info, warn};

mod arrive;
mod attempt;
mod call;
mod decide;
mod finish;
mod keys;
#[cfg(test)]
mod tests;
mod text;
mod tools;

pub(super) use call::Failure;
use call::{Call, Late, Phase};
pub(crate) use keys::{KeyStore, Unavailable};
pub(super) use text::secs;
use tools::ToolsKnowledge;

/// What the calls must know of the server link to decide (the dispatcher
/// reads it off its link before each method).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LinkView {
    /// The link carries the proxy's own requests now.
    pub ready: bool,
    /// It is ready, or a restart that is expected to work is under way.
    pub reachable: bool,
    /// The client has sent `notifications/initialized`, or speaks
    /// 2026-07-28, which has no handshake.
    pub initialized: bool,
    /// The incarnation that would answer a request sent now.
    pub generation: u64,
    /// A server request waits for a person: attempt clocks are paused.
    pub paused: bool,
}

/// The moment a method of [`Calls`] runs at.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ctx {
    pub now: Instant,
    pub link: LinkView,
    /// OpenTelemetry export is on: push [`Action::Trace`]s.
    pub tracing: bool,
    /// The downstream id the dispatcher issues next: an attempt recorded
    /// in this run goes under it.
    pub attempt_id: u64,
}

/// What the dispatcher does for the calls, in the order pushed.
#[derive(Debug)]
pub(super) enum Action {
    /// Answer client request `client` with `line` (a response or an error).
    Answer { client: ClientId, line: Vec<u8> },
    /// Ask the server to stop working on downstream request `down`.
    Cancel {
        down: u64,
        reason: Cow<'static, str>,
        /// The attempt's tool and whether it was a retry: uncounted if
        /// its line is withdrawn unwritten.
        attempt: (String, bool),
    },
    /// A line for the client that answers no request (progress, a changed
    /// tool list).
    Notify(Vec<u8>),
    /// Wake the calls at this time.
    Timer(Instant, CallTimer),
    /// Take the call's item with this sequence number out of the link's
    /// queue: the call ended.
    Unqueue(u64),
    /// Ask the server for a page of its tool list (from `cursor`, raw
    /// JSON as the server sent it; the first page if `None`);
    /// its answer goes to [`Calls::learn_tools`], a failure to
    /// [`Calls::tools_learned`].
    ListTools { cursor: Option<String> },
    /// For the OpenTelemetry spans (only while `Ctx::tracing`).
    Trace(Trace),
    /// Hand this to the store thread (`keys.rs`).
    Store(crate::store::thread::Request),
}

/// What the tracer is told about the calls.
#[derive(Debug)]
pub(super) enum Trace {
    /// Call `call` started (it exists when this is carried out).
    CallStarted {
        call: u64,
    },
    /// A call answered at once from the cache or the idempotency table
    /// (boxed: the rare variant, and the large one).
    AnsweredByProxy(Box<ProxyAnswer>),
    /// A call joined call `call` in flight.
    Joined {
        call: Option<u64>,
    },
    /// Call `call`'s live attempt ended (failed, if `failure`).
    AttemptEnded {
        call: u64,
        failure: Option<&'static str>,
    },
    /// Call `call`'s live attempt was cancelled at the server.
    CancelledDownstream {
        call: u64,
    },
    CallEnded {
        call: u64,
        end: CallEnd,
    },
    /// Call `call` ended with an error (the label it is counted under).
    CallFailed {
        call: u64,
        reason: &'static str,
    },
    /// The open breaker refused call `call` an attempt.
    BreakerRefused {
        call: u64,
        retry_after: Duration,
    },
    /// Call `call` waits `delay` before retry number `retry`.
    Backoff {
        call: u64,
        delay: Duration,
        retry: u32,
    },
}

/// A call the proxy answered itself, for its span.
#[derive(Debug)]
pub(super) struct ProxyAnswer {
    pub tool: String,
    pub client: ClientId,
    /// The client's trace context, read with the call.
    pub client_context: Option<SpanContext>,
    pub end: CallEnd,
}

/// A deadline of a call, and what it is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CallTimer {
    /// Attempt `down` runs out of time (unless progress moved it).
    AttemptTimeout { call: u64, down: u64 },
    /// The backoff is over.
    RetryDue { call: u64 },
    /// A call waiting for annotations must decide now.
    CallDeadline { call: u64 },
    /// A call that waits tells its client again, if it still waits.
    WaitNotice { call: u64 },
}

/// What became of a client's `tools/call`.
#[derive(Debug)]
pub(super) enum Arrival {
    /// Not a call the policies can read: relay it as any request.
    Relay(Message),
    /// Answered at once (cache, idempotency table): the answer is among the
    /// actions.
    Answered,
    /// It joined call `call` in flight (dedup).
    Joined(Option<u64>),
    /// It is call `call` now; its first attempt is for the dispatcher to
    /// route and start ([`Calls::admit`]).
    Started(u64),
}

/// How far a new call's first attempt got in the run that opened it
/// ([`Calls::arrive_and_start`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum First {
    /// Admitted and recorded under `Ctx::attempt_id`: the dispatcher
    /// issues that id and sends the attempt's line.
    Recorded,
    /// Admitted; the link is not ready: the dispatcher routes it (queue,
    /// refuse).
    Admitted,
    /// No attempt now: the breaker refused it, its key's claim waits for
    /// the store, or it is no new call.
    Waiting,
}

/// What a downstream id was to the calls, as far as the link cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Owner {
    /// An attempt of a call: the server did work for a client.
    Served,
    /// Known, but no work for a client (an abandoned attempt's unusable
    /// answer, a late answer of an ended call).
    Known,
    /// Not the calls' (or long forgotten).
    Unknown,
}

/// What a downstream id of the calls stands for.
#[derive(Debug)]
enum Issued {
    /// An attempt (live or abandoned) of this call.
    Attempt(u64),
    /// An attempt of a call that has ended without its success reaching
    /// the client; a late success is kept for replay.
    Late(Box<Late>),
}

/// Most attempts of ended calls whose late answers are still awaited.
const LATE_LIMIT: usize = 4096;

/// The per-tool counters, and whether they moved since the dispatcher
/// last looked.
#[derive(Debug, Default)]
struct Counters {
    stats: Stats,
    changed: bool,
}

impl Counters {
    fn tool(&mut self, name: &str) -> &mut ToolStats {
        self.changed = true;
        self.stats.tool(name)
    }

    /// An attempt of `tool` counted as sent never reached the server (its
    /// line was withdrawn, or never written): it is not counted.
    fn never_sent(&mut self, tool: &str, retry: bool) {
        let t = self.tool(tool);
        t.attempts = t.attempts.saturating_sub(1);
        if retry {
            t.retries = t.retries.saturating_sub(1);
        }
    }

    /// A call of `tool` ended with `outcome`, `took` after it arrived if
    /// an attempt was sent; `error` is the error object it failed with,
    /// read for its message.
    fn ended(
        &mut self,
        tool: &str,
        took: Option<Duration>,
        outcome: CallOutcome,
        error: Option<&str>,
        now: Instant,
    ) {
        self.changed = true;
        let failure = outcome.failure_label().map(|label| {
            let message = error
                .and_then(crate::jsonrpc::RawObject::parse)
                .and_then(|e| e.string("message"))
                .unwrap_or_default();
            (label, message)
        });
        self.stats.call_ended(tool, took, failure, now);
    }
}

/// Every `tools/call` in flight and the policies that decide for them.
pub(super) struct Calls {
    cfg: Arc<ServerConfig>,
    calls: FastMap<u64, Box<Call>>,
    next_call: u64,
    by_key: FastMap<u128, u64>,
    by_token: FastMap<String, u64>,
    /// The calls' downstream ids.
    downstream: FastMap<u64, Issued>,
    /// Downstream ids whose late answers are awaited, oldest first.
    late: VecDeque<u64>,
    tools: ToolsKnowledge,
    cache: ResultCache,
    dedup: DedupTable<u128, ClientId>,
    /// The secret keys of dedup fingerprints.
    fingerprint_keys: &'static RandomState,
    breaker: Breaker,
    budget: RetryBudget,
    backoff: Backoff,
    rng: fastrand::Rng,
    counters: Counters,
    /// The store of keys that outlives the process, when one is used.
    keys: Option<KeyStore>,
}

impl Calls {
    pub(super) fn new(cfg: Arc<ServerConfig>) -> Calls {
        Calls {
            calls: FastMap::default(),
            next_call: 0,
            by_key: FastMap::default(),
            by_token: FastMap::default(),
            downstream: FastMap::default(),
            late: VecDeque::new(),
            tools: ToolsKnowledge::default(),
            cache: ResultCache::new(&cfg.cache),
            dedup: DedupTable::new(
                cfg.idempotency_ttl,
                cfg.idempotency_max_entries,
                cfg.idempotency_max_bytes,
            ),
            fingerprint_keys: crate::policy::dedup::keys(),
            breaker: Breaker::new(&cfg.circuit_breaker),
            budget: RetryBudget::new(&cfg.retry.budget),
            backoff: Backoff::from_config(&cfg.retry),
            rng: fastrand::Rng::new(),
            counters: Counters::default(),
            keys: None,
            cfg,
        }
    }

    /// The server is being started again: counted.
    pub(super) fn count_restart(&mut self) {
        self.counters.stats.restarts += 1;
        self.counters.changed = true;
    }

    /// Seeds the randomness of backoff jitter (tests replay a schedule).
    #[cfg(test)]
    pub(super) fn with_seed(mut self, seed: u64) -> Calls {
        self.rng = fastrand::Rng::with_seed(seed);
        self
    }

    /// Calls in flight.
    pub(super) fn len(&self) -> usize {
        self.calls.len()
    }

    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// Whether some call has no attempt at the server (it waits for a
    /// retry, the queue or the tool list).
    #[cfg(test)]
    pub(super) fn any_between_attempts(&self) -> bool {
        self.calls.values().any(|c| c.live().is_none())
    }

    pub(super) fn stats(&self) -> &Stats {
        &self.counters.stats
    }

    /// Whether a counter moved since the last time this was asked.
    /// The dispatcher withdrew an attempt of `tool` (a retry if `retry`)
    /// whose call had let it go ([`Action::Cancel`]) before its line was
    /// written: it was never sent.
    pub(super) fn withdrawn(&mut self, tool: &str, retry: bool) {
        self.counters.never_sent(tool, retry);
    }

    pub(super) fn take_stats_changed(&mut self) -> bool {
        std::mem::take(&mut self.counters.changed)
    }

    pub(super) fn breaker_state(&self) -> &BreakerState {
        self.breaker.state()
    }

    /// Whether `down` is call `call`'s attempt in flight (its timeout
    /// matters).
    pub(super) fn attempt_is_live(&self, call: u64, down: u64) -> bool {
        self.calls
            .get(&call)
            .is_some_and(|c| c.live() == Some(down))
    }

    /// What the tracer needs of call `id` as it starts: its tool, client
    /// and the client's trace context.
    pub(super) fn started(&self, id: u64) -> Option<(&str, &str, Option<SpanContext>)> {
        let c = self.calls.get(&id)?;
        Some((&c.tool, c.client.as_deref()?, c.client_context))
    }

    /// The server answered downstream request `down`.
    pub(super) fn on_answer(
        &mut self,
        down: u64,
        m: Message,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) -> Owner {
        match self.downstream.remove(&down) {
            Some(Issued::Attempt(call)) => {
                self.attempt_answered(call, down, m, ctx, out);
                Owner::Served
            }
            Some(Issued::Late(late)) => {
                self.late_answer(*late, &m, ctx.now, out);
                Owner::Known
            }
            None => Owner::Unknown,
        }
    }

    /// Attempt `down` ends without an answer the client can have: the
    /// server's cannot be relayed (too large, invalid: the tool ran, so it
    /// is not retried), or the server is not reading its input
    /// (overloaded: not sent). A live attempt's call ends with `reason`.
    pub(super) fn on_unusable_answer(
        &mut self,
        down: u64,
        reason: super::Reason,
        message: &str,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) -> Owner {
        match self.downstream.get(&down) {
            Some(Issued::Attempt(call)) => {
                match self.calls.get(call).filter(|c| c.live() == Some(down)) {
                    Some(c) => warn!("tool \"{}\": {message}", c.tool),
                    // The live one may still bring a real answer.
                    None => debug!("dropped the unusable answer of an abandoned attempt"),
                }
            }
            // A late answer nobody waits for: nothing to keep.
            Some(Issued::Late(_)) | None => {}
        }
        self.fail_attempt(down, &CallError::proxy(reason, message, &[]), ctx, out)
    }

    /// Ends the call whose live attempt is `down` with `error` (raw JSON):
    /// nothing more is awaited of that attempt. Says what `down` was.
    pub(super) fn fail_attempt(
        &mut self,
        down: u64,
        error: &CallError,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) -> Owner {
        let call = match self.downstream.remove(&down) {
            Some(Issued::Attempt(call)) => call,
            Some(Issued::Late(_)) => return Owner::Known,
            None => return Owner::Unknown,
        };
        let Some(c) = self.calls.get_mut(&call).filter(|c| c.live() == Some(down)) else {
            return Owner::Known;
        };
        c.phase = Phase::Idle;
        // A trial it held is freed as the call ends (`fail`).
        self.fail(call, error, ctx, out);
        Owner::Served
    }

    /// Downstream request `down` was never answered and never will be: the
    /// server was not given it ([`Failure::NeverSent`]) or refused it
    /// ([`Failure::Refused`]). A call's live attempt fails so; other ids
    /// are forgotten.
    pub(super) fn on_unanswered(
        &mut self,
        down: u64,
        failure: Failure,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) {
        if let Some(Issued::Attempt(call)) = self.downstream.remove(&down) {
            match self.calls.get_mut(&call) {
                Some(c) if c.live() == Some(down) => c.phase = Phase::Idle,
                _ => return,
            }
            self.attempt_failed(call, failure, ctx, out);
        }
    }

    /// The last request of the server waiting for a person was answered
    /// (or withdrawn): live attempts get back the time they spent paused
    /// since `since`, within their calls' deadlines.
    pub(super) fn resume_clocks(&mut self, since: Instant, ctx: Ctx, out: &mut Vec<Action>) {
        for (&id, call) in self.calls.iter_mut() {
            let Some(down) = call.live() else { continue };
            let paused = ctx
                .now
                .saturating_duration_since(since.max(call.attempt_started));
            call.attempt_deadline = (call.attempt_deadline + paused).min(call.deadline);
            let timer = CallTimer::AttemptTimeout { call: id, down };
            out.push(Action::Timer(call.attempt_deadline, timer));
        }
    }

    /// A new incarnation of the server: everything cached describes the
    /// old one.
    pub(super) fn new_incarnation(&mut self) {
        self.cache.clear();
    }

    /// A client request gave up waiting for a server that was down: an
    /// outage's failure for the breaker (a breaker it opens closes when the
    /// link recovers). Probes that fail are not counted: only what users
    /// asked for.
    pub(super) fn outage_failure(&mut self, now: Instant) {
        let t = self.breaker.on_outage_failure(now);
        self.log_transition(t);
    }

    /// Call `id`'s attempt gave up waiting for a server that was down: it
    /// fails with `error`, and that counts as an outage's failure.
    pub(super) fn gave_up_waiting(
        &mut self,
        id: u64,
        error: &CallError,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) {
        if let Some(call) = self.calls.get_mut(&id) {
            call.unqueue();
        }
        // Counted outside a trial: a trial it held is freed as the call
        // ends (`refuse_attempt`).
        self.outage_failure(ctx.now);
        self.refuse_attempt(id, error, ctx, out);
    }

    /// A probe found the server working again: a breaker that the outage
    /// opened closes (one that failed calls opened waits for its trial).
    pub(super) fn link_recovered(&mut self) {
        let t = self.breaker.on_link_recovered();
        self.log_transition(t);
    }

    /// Call `id`'s deadline, if it is in flight.
    pub(super) fn deadline(&self, id: u64) -> Option<Instant> {
        self.calls.get(&id).map(|c| c.deadline)
    }

    /// The server is gone (`message` says how): annotations are forgotten
    /// (the next incarnation, perhaps a new version, is asked before a call
    /// is retried on their strength), every attempt in flight fails
    /// (ambiguously if `may_have_received`, else as never sent) and the
    /// policies decide; no late answer will come. `stopping`: the session
    /// ends, nothing is asked of a next server.
    pub(super) fn on_link_lost(
        &mut self,
        message: &str,
        may_have_received: bool,
        stopping: bool,
        ctx: Ctx,
        out: &mut Vec<Action>,
    ) {
        self.tools.annotations.clear();
        self.tools.known = false;
        if self.tools.fetching && !stopping {
            // Our list died with the server: ask the next incarnation.
            self.tools.restart_fetch();
        }
        let mut ids: Vec<u64> = self
            .calls
            .iter()
            .filter(|(_, c)| c.has_attempts())
            .map(|(id, _)| *id)
            .collect();
        ids.sort();
        for id in ids {
            let Some(call) = self.calls.get_mut(&id) else {
                continue;
            };
            for d in call.dead.drain(..) {
                self.downstream.remove(&d);
            }
            if let Some(live) = call.take_live() {
                self.downstream.remove(&live);
                let failure = match may_have_received {
                    true => Failure::Exited(message.to_owned()),
                    false => Failure::NeverSent(message.to_owned()),
                };
                self.attempt_failed(id, failure, ctx, out);
            }
        }
        if self.tools.fetching && stopping {
            self.tools_learned(false, ctx, out);
        }
        self.late.clear();
        self.downstream.clear();
    }

    /// What the safety gate looks at for `tool`.
    fn gate_input(&self, tool: &str, key_honored: bool) -> GateInput<'_> {
        GateInput {
            tool_config: self.cfg.tools.get(tool),
            annotations: self.tools.annotations.get(tool),
            key_honored,
            assume_idempotent: self.cfg.assume_idempotent,
            trust_annotations: self.cfg.trust_annotations,
        }
    }

    /// Logs a breaker transition, and counts it.
    fn log_transition(&mut self, t: Option<Transition>) {
        let Some(t) = t else { return };
        let name = match t {
            Transition::Opened => "opened",
            Transition::HalfOpened => "half_opened",
            Transition::Closed => "closed",
            Transition::Reopened => "reopened",
        };
        *self.counters.stats.breaker.entry(name).or_default() += 1;
        self.counters.changed = true;
        let name = &self.cfg.name;
        match t {
            Transition::Opened => {
                warn!(
                    "circuit breaker for \"{name}\" opened after {} consecutive failures; calls fail fast for {:.0}s",
                    self.cfg.circuit_breaker.failure_threshold,
                    self.cfg.circuit_breaker.cooldown.as_secs_f64()
                )
            }
            Transition::HalfOpened => {
                info!("circuit breaker for \"{name}\" is half-open: letting one trial call through")
            }
            Transition::Closed => {
                info!("circuit breaker for \"{name}\" closed: the server is answering again")
            }
            Transition::Reopened => {
                warn!("circuit breaker for \"{name}\" reopened: the trial call failed")
            }
        }
    }
}

/// Pushes what `f` tells the tracer, if export is on.
fn trace(ctx: Ctx, out: &mut Vec<Action>, f: impl FnOnce() -> Trace) {
    if ctx.tracing {
        out.push(Action::Trace(f()));
    }
}

/// Something that may write ran or may have run: cached results (stale
/// ones too) may no longer be true. Even an empty cache starts a new
/// epoch, so that a read in flight does not store what it read before the
/// write.
fn invalidate(cache: &mut ResultCache, tool: &str, why: &str) {
    if !cache.is_empty() {
        debug!("tool \"{tool}\" {why}: the cache is cleared");
    }
    cache.clear();
}
