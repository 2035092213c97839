//! `tools/call` resilience: each call's attempts, retries, timeouts, late
//! answers, progress, dedup joins, cache answers and the breaker, driven by
//! the dispatcher's events and timers.
//!
//! Decisions come from the pure types in `policy/`; this file only applies
//! them and owns the per-call state ([`Call`]). It never touches a file
//! descriptor: lines go out through the dispatcher's senders.

#![forbid(unsafe_code)]

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use memchr::memmem;

use crate::jsonrpc::{self, Message, RawObject};
use crate::log::Fields;
use crate::otel::{self, CallEnd};
use crate::policy::breaker::{Admission, BreakerState, Transition};
use crate::policy::dedup::{fingerprint, fingerprint_json, Keep, Lookup};
use crate::policy::gate::{self, GateInput, Safety};
use crate::policy::progress::ProgressFilter;
use crate::policy::{backoff, canonical_json};
use crate::stats::ToolStats;
use crate::{debug, info, warn};

use super::link::{Queued, Route};
use super::{proxy_error, Dispatcher, Inflight, Reason, Timer};

/// Where an answer the client gets came from, when not straight from the
/// server (`_meta["mcp-retry/source"]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Dedup,
    Cache,
    Stale,
}

impl Source {
    fn as_str(self) -> &'static str {
        match self {
            Source::Dedup => "dedup",
            Source::Cache => "cache",
            Source::Stale => "stale",
        }
    }
}

/// Why an attempt failed.
#[derive(Debug, Clone)]
pub(super) enum Failure {
    /// The request never reached a live server: always safe to retry.
    NeverSent(String),
    /// The attempt timed out after this long (ambiguous).
    Timeout(Duration),
    /// The server went away before answering (ambiguous).
    Exited(String),
    /// The server answered a transient JSON-RPC error (raw error object).
    Transient(String),
    /// The server refused the request without running it (HTTP 429): safe
    /// to retry, not before the hint.
    Refused(String, Option<Duration>),
}

impl Failure {
    fn ambiguous(&self) -> bool {
        !matches!(self, Failure::NeverSent(_) | Failure::Refused(..))
    }

    /// For logs: `never_sent`, `timeout`, `server_exited`, `transient_error`.
    fn kind(&self) -> &'static str {
        match self {
            Failure::NeverSent(_) => "never_sent",
            Failure::Timeout(_) => "timeout",
            Failure::Exited(_) => "server_exited",
            Failure::Transient(_) => "transient_error",
            Failure::Refused(..) => "refused",
        }
    }
}

/// The structured fields of a log line about attempt `attempt` of `tool`.
fn fields<'a>(tool: &'a str, attempt: u32, reason: Option<&'a str>) -> Fields<'a> {
    Fields {
        tool: Some(tool),
        attempt: Some(attempt),
        reason,
    }
}

/// One client `tools/call` and everything done for it.
#[derive(Debug)]
pub struct Call {
    /// The client request that started it; `None` once that client cancelled
    /// while joined requests still wait.
    pub client: Option<String>,
    pub tool: String,
    /// The request as forwarded (the argument idempotency key removed);
    /// its id is replaced for every attempt.
    request: Message,
    progress_token: Option<String>,
    /// The dedup key (a fingerprint of the tool and its explicit key or its
    /// arguments) when dedup applies, and the fingerprint of the arguments.
    dedup_key: Option<u128>,
    dedup_args: u128,
    /// The client's idempotency key (either form), for messages.
    explicit_key: Option<String>,
    /// The key is in `_meta` and the server honours keys: the gate may
    /// count it.
    key_honored: bool,
    /// The tool is known to only read (config or trusted annotation).
    read_only: bool,
    /// The cache key when the tool is cached.
    cache_key: Option<String>,
    /// The cache's epoch when the live (or last) attempt was sent: its
    /// result is cached only if nothing that may write ran since.
    cache_epoch: u64,
    /// Attempts started so far.
    attempts: u32,
    /// The live attempt's downstream id.
    pub(super) live: Option<u64>,
    /// Earlier attempts that were abandoned but may still answer.
    dead: Vec<u64>,
    attempt_timeout: Duration,
    /// When the live (or last) attempt was sent.
    attempt_started: Instant,
    /// When the client's request arrived (for `status`' latencies).
    started: Instant,
    attempt_deadline: Instant,
    /// Bound on all attempts and waits.
    deadline: Instant,
    /// A retry is scheduled for this time.
    retry_at: Option<Instant>,
    /// Waiting for the tool's annotations before deciding on a retry.
    parked: Option<Failure>,
    last_failure: Option<Failure>,
    progress: ProgressFilter,
    /// This call holds the breaker's half-open trial.
    trial: bool,
    /// Its next attempt waits in the queue for a restarting server.
    pub(super) queued: Option<u64>,
    /// The server incarnation whose tool list it already waited for:
    /// unknown after that means unsafe.
    waited_for_tools: Option<u64>,
    retried: bool,
}

impl Call {
    /// Whether `down` is this call's attempt in flight (its timeout matters).
    pub(super) fn attempt_is_live(&self, down: u64) -> bool {
        self.live == Some(down)
    }

    /// How long the call took, if the server was asked at all (a call
    /// refused before any attempt says nothing of the server's latency).
    fn took(&self, now: Instant) -> Option<Duration> {
        (self.attempts > 0).then(|| now.saturating_duration_since(self.started))
    }
}

/// Most attempts of ended calls whose late answers are still awaited.
const LATE_LIMIT: usize = 4096;

/// An attempt of a call that ended without its success reaching the client:
/// where a late success goes in the idempotency table.
#[derive(Debug)]
pub struct Late {
    key: u128,
    args: u128,
    keep: Keep,
    tool: String,
}

/// What the dispatcher needs to know about the server's tools.
#[derive(Debug, Default)]
pub struct ToolsKnowledge {
    pub annotations: HashMap<String, gate::Annotations>,
    /// A complete list has been seen since the last change.
    pub known: bool,
    /// Our own `tools/list` is in flight (or `deferred` until the server is
    /// ready).
    pub fetching: bool,
    pub deferred: bool,
    /// Fingerprints of the canonical tool entries of the listing being
    /// read, page by page (16 bytes a tool, restarted by a first page).
    pages: Vec<u128>,
    /// The sorted entry fingerprints of the last complete listing.
    pub fingerprint: Option<Vec<u128>>,
    /// The listing being fetched is the first after a restart: tell the
    /// client if it differs from the one before.
    pub compare_after_restart: bool,
}

impl ToolsKnowledge {
    /// Tool entries of the listing being read.
    #[cfg(test)]
    pub fn pages_held(&self) -> usize {
        self.pages.len()
    }

    /// Our listing died with its server: ask the next incarnation for the
    /// whole list once it is ready.
    pub fn restart_fetch(&mut self) {
        self.deferred = true;
        self.pages.clear();
    }
}

impl Dispatcher {
    /// A client `tools/call`: cache, dedup, breaker, then the first attempt.
    pub(super) fn on_tools_call(&mut self, m: Message, client_id: String, now: Instant) {
        let Some(parsed) = ParsedCall::parse(&m) else {
            // Not ours to judge: let the server answer the malformed call.
            return self.relay_request(m, client_id, super::Method::Other, now);
        };
        let tool = parsed.name.clone();
        self.stats_for(&tool).calls += 1;
        let key_honored = parsed.key_in_meta && self.honors_keys(&tool);
        let read_only = gate::is_read_only(&self.gate_input(&tool, key_honored));
        // One fingerprint of the arguments (in canonical form, never copied)
        // serves the cache, dedup, and the check that calls sharing a key
        // agree.
        let args_fp = fingerprint_json(&self.fingerprint_keys, &["args"], &parsed.arguments).ok();
        let cache_key = match (args_fp, parsed.no_store) {
            (Some(fp), false) if !self.cache.ttl_for(&tool).is_zero() => {
                Some(format!("{tool}\0{fp:032x}"))
            }
            _ => None,
        };
        if let Some(key) = &cache_key {
            if let Some(result) = self.cache.get(key, now).map(str::to_owned) {
                info!("tool \"{tool}\": answered from the cache");
                self.stats_for(&tool).cache_hits += 1;
                self.traced(|t| t.answered_by_proxy(&tool, &client_id, m.params(), "cache", now));
                let line = jsonrpc::response_line(&client_id, &with_source(&result, Source::Cache));
                return self.answer(&client_id, line);
            }
        }
        let keys = &self.fingerprint_keys;
        let (dedup_key, dedup_args) = match (&parsed.explicit_key, args_fp) {
            _ if parsed.no_store => (None, 0),
            (Some(k), fp) => (
                Some(fingerprint(keys, &["key", &tool, k])),
                fp.unwrap_or_default(),
            ),
            (None, Some(fp)) => (
                Some(fingerprint(keys, &["call", &tool, &format!("{fp:032x}")])),
                fp,
            ),
            (None, None) => (None, 0),
        };
        if let Some(key) = dedup_key {
            // A keyless read runs again rather than replay an old answer; a
            // keyless write only ever finds results its client never got.
            let replay = parsed.explicit_key.is_some() || !read_only;
            match self
                .dedup
                .lookup_or_join(&key, dedup_args, client_id.clone(), replay, now)
            {
                Lookup::Joined { same_args } => {
                    info!("tool \"{tool}\": joined an identical call in flight");
                    self.note_key_reuse(&tool, parsed.explicit_key.as_deref(), same_args);
                    self.stats_for(&tool).dedup_hits += 1;
                    let call = self.calls_by_key.get(&key).copied();
                    self.traced(|t| t.joined(call, &tool, now));
                    if let Some(r) = self.client_requests.get_mut(&client_id) {
                        r.call = call;
                    }
                    return;
                }
                Lookup::Replay {
                    result,
                    waiter,
                    same_args,
                } => {
                    match &parsed.explicit_key {
                        Some(k) => info!(
                            "tool \"{tool}\": replayed the result of idempotency key {}",
                            jsonrpc::json_string(k)
                        ),
                        None => info!(
                            "tool \"{tool}\": replayed the result of an identical call whose answer the client never received"
                        ),
                    }
                    self.note_key_reuse(&tool, parsed.explicit_key.as_deref(), same_args);
                    self.stats_for(&tool).dedup_hits += 1;
                    self.traced(|t| t.answered_by_proxy(&tool, &waiter, m.params(), "dedup", now));
                    let line =
                        jsonrpc::response_line(&waiter, &with_source(&result, Source::Dedup));
                    return self.answer(&waiter, line);
                }
                Lookup::Execute(_) => self.dedup.start(&key, dedup_args, now),
            }
        }

        // Done with the borrowed arguments: the message is the call's now.
        let ParsedCall {
            explicit_key,
            progress_token,
            forward_params,
            ..
        } = parsed;
        let timeout = self
            .cfg
            .tools
            .get(&tool)
            .and_then(|t| t.timeout)
            .unwrap_or(self.cfg.call_timeout);
        self.next_call += 1;
        let id = self.next_call;
        if let Some(key) = dedup_key {
            self.calls_by_key.insert(key, id);
        }
        if let Some(token) = &progress_token {
            self.calls_by_token.insert(token.clone(), id);
        }
        if let Some(r) = self.client_requests.get_mut(&client_id) {
            r.call = Some(id);
        }
        let request = match &forward_params {
            Some(p) => m.with_params(p).unwrap_or(m),
            None => m,
        };
        self.traced(|t| t.call_started(id, &tool, &client_id, request.params(), now));
        self.calls.insert(
            id,
            Call {
                client: Some(client_id),
                tool,
                request,
                progress_token,
                dedup_key,
                dedup_args,
                explicit_key,
                key_honored,
                read_only,
                cache_key,
                cache_epoch: self.cache.epoch(),
                attempts: 0,
                live: None,
                dead: Vec::new(),
                attempt_timeout: timeout,
                attempt_started: now,
                started: now,
                attempt_deadline: now,
                deadline: now + self.cfg.retry.total_timeout,
                retry_at: None,
                parked: None,
                last_failure: None,
                progress: ProgressFilter::new(),
                trial: false,
                queued: None,
                waited_for_tools: None,
                retried: false,
            },
        );
        self.budget.record_first_attempt(now);
        self.start_attempt(id, now);
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

    /// `honors_idempotency_keys` for `tool`: its own setting, else the
    /// server's.
    fn honors_keys(&self, tool: &str) -> bool {
        self.cfg
            .tools
            .get(tool)
            .and_then(|t| t.honors_idempotency_keys)
            .unwrap_or(self.cfg.honors_idempotency_keys)
    }

    /// Calls sharing an explicit key are one operation whatever their other
    /// arguments; when those differ, say so (tool and key, never values).
    fn note_key_reuse(&self, tool: &str, key: Option<&str>, same_args: bool) {
        if let (Some(k), false) = (key, same_args) {
            warn!(
                "tool \"{tool}\": idempotency key {} was reused with different arguments; treated as the same operation",
                jsonrpc::json_string(k)
            );
        }
    }

    /// Something that may write ran or may have run: cached results (stale
    /// ones too) may no longer be true.
    /// Even an empty cache starts a new epoch, so that a read in flight does
    /// not store what it read before the write.
    pub(super) fn cache_invalidated(&mut self, tool: &str, why: &str) {
        if !self.cache.is_empty() {
            debug!("tool \"{tool}\" {why}: the cache is cleared");
        }
        self.cache.clear();
    }

    /// Sends the next attempt of a call, if the breaker and the link allow.
    pub(super) fn start_attempt(&mut self, id: u64, now: Instant) {
        let Some(call) = self.calls.get_mut(&id) else {
            return;
        };
        call.retry_at = None;
        if call.queued.is_some() {
            return;
        }
        let (admission, transition) = self.breaker.admit(now);
        self.log_transition(transition);
        let call = self.calls.get_mut(&id).expect("present");
        match admission {
            Admission::Rejected { retry_after } => {
                let ms = retry_after.as_millis().to_string();
                let message = format!(
                    "the circuit breaker for server \"{}\" is open after repeated failures; tool \"{}\" was not called (retry in {:.1}s)",
                    self.cfg.name,
                    call.tool,
                    retry_after.as_secs_f64()
                );
                let error = proxy_error(
                    Reason::CircuitOpen,
                    &message,
                    &[
                        ("attempts", call.attempts.to_string()),
                        ("retryAfterMs", ms),
                    ],
                );
                self.trace_refused(id, retry_after, now);
                return self.refuse_attempt(id, &error, now);
            }
            Admission::Trial => call.trial = true,
            Admission::Allowed => call.trial = false,
        }
        match self.route(now) {
            Route::Send => {}
            Route::Queue => {
                return match self.enqueue(Queued::Call(id), now) {
                    Some(seq) => {
                        if let Some(call) = self.calls.get_mut(&id) {
                            call.queued = Some(seq);
                        }
                    }
                    None => {
                        let error = proxy_error(
                            Reason::ServerUnavailable,
                            "the MCP server is restarting and too many requests are waiting",
                            &[],
                        );
                        self.finish_failed(id, &error, now)
                    }
                };
            }
            Route::Refuse(reason, message) => {
                let attempts = self.calls.get(&id).map_or(0, |c| c.attempts);
                let error = proxy_error(reason, &message, &[("attempts", attempts.to_string())]);
                return self.refuse_attempt(id, &error, now);
            }
        }
        let down = self.next_id();
        let call = self.calls.get_mut(&id).expect("present");
        if !call.read_only {
            // It may change what cached reads returned.
            let tool = call.tool.clone();
            self.cache_invalidated(&tool, "may write");
        }
        let epoch = self.cache.epoch();
        let tool = self.calls[&id].tool.clone();
        self.stats_for(&tool).attempts += 1;
        let call = self.calls.get_mut(&id).expect("present");
        call.cache_epoch = epoch;
        call.attempts += 1;
        if call.attempts > 1 {
            call.retried = true;
        }
        call.live = Some(down);
        call.attempt_started = now;
        call.attempt_deadline = (now + call.attempt_timeout).min(call.deadline);
        let at = call.attempt_deadline;
        let line = call.request.line_with_id(&down.to_string());
        if call.attempts > 1 {
            info!(
                fields: fields(&call.tool, call.attempts, None),
                "tool \"{}\": attempt {} (downstream id {down})",
                call.tool, call.attempts
            );
        }
        let line = match self.traced(|t| t.attempt_started(id, down, now)).flatten() {
            Some(tp) => traced_line(&self.calls[&id].request, down, &tp).unwrap_or(line),
            None => line,
        };
        self.inflight.insert(down, Inflight::Attempt { call: id });
        self.set_timer(at, Timer::AttemptTimeout { call: id, down });
        if !self.send_server(line) {
            self.inflight.remove(&down);
            if let Some(call) = self.calls.get_mut(&id) {
                call.live = None;
            }
            self.on_attempt_failed(
                id,
                Failure::NeverSent("the server is not running".into()),
                now,
            );
        }
    }

    /// The server answered attempt `down` of call `id`.
    pub(super) fn on_attempt_response(&mut self, id: u64, down: u64, m: Message, now: Instant) {
        let Some(call) = self.calls.get_mut(&id) else {
            return;
        };
        let is_live = call.live == Some(down);
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
            if let Some(live) = call.live.take() {
                self.cancel_downstream(live, "superseded by an earlier attempt's answer");
            }
        }
        if transient {
            let error = m.error().unwrap_or_default().to_owned();
            if let Some(call) = self.calls.get_mut(&id) {
                call.live = None;
            }
            self.inflight.remove(&down);
            return self.on_attempt_failed(id, Failure::Transient(error), now);
        }
        // A final answer: a result (isError or not) or a final error.
        let trial = self.calls.get(&id).is_some_and(|c| c.trial);
        if m.result().is_some() {
            let t = self.breaker.on_success(trial, now);
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
        self.traced(|t| t.attempt_ended(id, failure, now));
        self.finish_with_server_answer(id, m, now);
    }

    /// An attempt failed; retry if allowed, else answer.
    pub(super) fn on_attempt_failed(&mut self, id: u64, failure: Failure, now: Instant) {
        let Some(call) = self.calls.get_mut(&id) else {
            return;
        };
        let trial = call.trial;
        call.trial = false;
        self.traced(|t| t.attempt_ended(id, Some(failure.kind()), now));
        let t = self.breaker.on_failure(trial, now);
        self.log_transition(t);
        self.decide(id, failure, now);
    }

    /// Retry or give up, after `failure`.
    fn decide(&mut self, id: u64, failure: Failure, now: Instant) {
        let cfg_retry = self.cfg.retry.clone();
        let Some(call) = self.calls.get_mut(&id) else {
            return;
        };
        call.last_failure = Some(failure.clone());
        let tool = call.tool.clone();
        let what = describe_failure(&tool, &failure);
        if call.client.is_none() && self.dedup_waiters(id) == 0 {
            return self.drop_call(id, "cancelled by the client");
        }
        if failure.ambiguous() && !self.safe_to_repeat(id, &failure, &what, now) {
            return;
        }
        let call = self.calls.get_mut(&id).expect("present");
        let retries_done = call.attempts.saturating_sub(1);
        let attempts = call.attempts;
        let at_attempt = |reason: Reason| fields(&tool, attempts, Some(reason.as_str()));
        if retries_done >= cfg_retry.max_retries {
            let reason = if cfg_retry.max_retries == 0 && matches!(failure, Failure::Timeout(_)) {
                Reason::Timeout
            } else {
                Reason::RetriesExhausted
            };
            warn!(fields: at_attempt(reason), "{what}; giving up after {attempts} attempt(s)");
            return self.give_up(id, reason, &failure, now);
        }
        let hint = match &failure {
            Failure::Transient(e) => backoff::retry_after_hint(e),
            Failure::Refused(_, hint) => *hint,
            _ => None,
        };
        let delay = self
            .backoff
            .delay(retries_done + 1, &mut self.rng)
            .max(hint.unwrap_or_default());
        let at = now + delay;
        if at >= call.deadline {
            warn!(
                fields: at_attempt(Reason::DeadlineExceeded),
                "{what}; no retry: the next attempt would start after retry.total_timeout"
            );
            return self.give_up(id, Reason::DeadlineExceeded, &failure, now);
        }
        if let BreakerState::Open { until } = self.breaker.state() {
            if *until > at {
                // The retry would only be refused when it is due.
                let retry_after = until.saturating_duration_since(now);
                warn!(
                    fields: at_attempt(Reason::CircuitOpen),
                    "{what}; no retry: the circuit breaker for \"{}\" is open for another {:.1}s",
                    self.cfg.name,
                    retry_after.as_secs_f64()
                );
                return self.refuse_by_breaker(id, retry_after, now);
            }
        }
        if !self.budget.try_withdraw(now) {
            warn!(
                fields: at_attempt(Reason::RetryBudgetExhausted),
                "{what}; no retry: the retry budget for this server is exhausted"
            );
            return self.give_up(id, Reason::RetryBudgetExhausted, &failure, now);
        }
        let call = self.calls.get_mut(&id).expect("present");
        info!(
            fields: fields(&tool, attempts, Some(failure.kind())),
            "{what}; retrying in {:.2}s (retry {} of {})",
            delay.as_secs_f64(),
            retries_done + 1,
            cfg_retry.max_retries
        );
        call.retry_at = Some(at);
        self.set_timer(at, Timer::RetryDue { call: id });
        self.trace_backoff(id, delay, retries_done + 1, now);
    }

    /// After an ambiguous failure: whether the call may run again. When the
    /// tool's annotations are unknown and can be learned (from the current
    /// incarnation, or the next one after a crash), the call waits for them
    /// within its deadline, once per incarnation, and false is returned;
    /// when it is unsafe it is answered, and false is returned.
    fn safe_to_repeat(&mut self, id: u64, failure: &Failure, what: &str, now: Instant) -> bool {
        let Some(call) = self.calls.get(&id) else {
            return false;
        };
        let tool = call.tool.clone();
        match gate::classify_safety(&self.gate_input(&tool, call.key_honored)) {
            Safety::Safe(why) => {
                debug!("tool \"{tool}\" is safe to retry ({})", why.as_str());
                return true;
            }
            Safety::Unsafe => {}
        }
        let config_decides = self
            .cfg
            .tools
            .get(&tool)
            .is_some_and(|t| t.idempotent.is_some() || t.read_only == Some(true));
        let reachable = self.link_ready() || self.link_restarting(now);
        let could_learn = self.cfg.trust_annotations
            && !config_decides
            && !self.tools.known
            && self.session.initialized
            && reachable;
        let generation = self.generation_to_ask();
        let call = self.calls.get_mut(&id).expect("present");
        if could_learn && call.waited_for_tools != Some(generation) && call.deadline > now {
            // Do not guess: learn the annotations first.
            debug!("tool \"{tool}\": waiting for the tool list before deciding on a retry");
            call.parked = Some(failure.clone());
            call.waited_for_tools = Some(generation);
            let deadline = call.deadline;
            self.set_timer(deadline, Timer::CallDeadline { call: id });
            self.fetch_tools(now);
            return false;
        }
        let reason = match failure {
            Failure::Exited(_) => Reason::ServerExited,
            _ => Reason::NotRetriedUnsafe,
        };
        warn!(
            fields: fields(&tool, call.attempts, Some(reason.as_str())),
            "{what}; not retried: the tool is not known to be idempotent"
        );
        self.give_up(id, reason, failure, now);
        false
    }

    /// Answers a call whose retry the open breaker would refuse: at once,
    /// with the breaker's error (and the server's last error in `data`).
    fn refuse_by_breaker(&mut self, id: u64, retry_after: Duration, now: Instant) {
        let Some(call) = self.calls.get(&id) else {
            return;
        };
        let message = format!(
            "the circuit breaker for server \"{}\" is open after repeated failures; tool \"{}\" was not called again (retry in {:.1}s)",
            self.cfg.name,
            call.tool,
            retry_after.as_secs_f64()
        );
        let mut extra = vec![
            ("attempts", call.attempts.to_string()),
            ("retryAfterMs", retry_after.as_millis().to_string()),
        ];
        match &call.last_failure {
            Some(Failure::Transient(e)) => extra.push(("lastError", e.clone())),
            Some(Failure::Exited(_) | Failure::Timeout(_)) => {
                extra.push(("outcome", "\"unknown\"".to_owned()))
            }
            _ => {}
        }
        let error = proxy_error(Reason::CircuitOpen, &message, &extra);
        self.trace_refused(id, retry_after, now);
        self.refuse_attempt_with(id, &error, false, now);
    }

    /// Answers a call that will not be retried.
    fn give_up(&mut self, id: u64, reason: Reason, failure: &Failure, now: Instant) {
        let Some(call) = self.calls.get(&id) else {
            return;
        };
        let message = give_up_message(&call.tool, reason, failure, call.attempts);
        let mut extra = vec![("attempts", call.attempts.to_string())];
        if let Failure::Exited(_) = failure {
            extra.push(("outcome", "\"unknown\"".to_owned()));
        }
        // A stale cached answer, or the server's own error, come first.
        self.refuse_attempt(id, &proxy_error(reason, &message, &extra), now);
    }

    /// The next attempt of a call cannot be sent (breaker open, server not
    /// available): an expired cached answer within `stale_if_error` first,
    /// then the server's own error from the last attempt, else `error`.
    pub(super) fn refuse_attempt(&mut self, id: u64, error: &str, now: Instant) {
        self.refuse_attempt_with(id, error, true, now);
    }

    /// [`Dispatcher::refuse_attempt`]; the server's own last error replaces
    /// `error` only if `server_error_first`.
    fn refuse_attempt_with(
        &mut self,
        id: u64,
        error: &str,
        server_error_first: bool,
        now: Instant,
    ) {
        let Some(call) = self.calls.get(&id) else {
            return;
        };
        if let Some(key) = &call.cache_key {
            if let Some(stale) = self.cache.get_stale(key, now).map(str::to_owned) {
                info!(
                    "tool \"{}\": answered with a stale cached result",
                    call.tool
                );
                let result = with_source(&stale, Source::Stale);
                return self.finish_with_result(id, &result, now);
            }
        }
        let error = match &call.last_failure {
            Some(Failure::Transient(e)) if server_error_first => e.clone(),
            _ => error.to_owned(),
        };
        self.finish_failed(id, &error, now);
    }

    /// Ends a call with an error object (raw JSON) for every waiting client.
    pub(super) fn finish_failed(&mut self, id: u64, error: &str, now: Instant) {
        let Some(call) = self.remove_call(id) else {
            return;
        };
        self.note_call_end(&call.tool, call.took(now), Some(error));
        self.trace_failed(id, error, now);
        let stats = self.stats_for(&call.tool);
        stats.failed += 1;
        if call.retried {
            stats.retried += 1;
        }
        if call.trial {
            self.breaker.on_trial_abandoned();
        }
        let waiters = match &call.dedup_key {
            Some(k) => self.dedup.complete(k, None, now),
            None => Vec::new(),
        };
        self.keep_late_answers(&call);
        for client in call.client.iter().chain(waiters.iter()) {
            let line = jsonrpc::error_response_line(client, error);
            self.answer(client, line);
        }
    }

    /// Ends a call with the server's final answer.
    fn finish_with_server_answer(&mut self, id: u64, m: Message, now: Instant) {
        let Some(call) = self.remove_call(id) else {
            return;
        };
        self.note_call_end(&call.tool, call.took(now), m.error());
        let end = CallEnd::answered(m.error().is_some());
        self.traced(|t| t.call_ended(id, end, now));
        let stats = self.stats_for(&call.tool);
        if call.retried {
            stats.retried += 1;
        }
        let success = m.result().filter(|r| storable(r));
        if m.result().is_some() {
            if call.retried {
                stats.recovered += 1;
            }
        } else {
            stats.failed += 1;
        }
        // Not cached if something that may write ran since this attempt
        // began: the result may predate that write.
        let fresh = self.cache.epoch() == call.cache_epoch;
        if !call.read_only {
            self.cache_invalidated(&call.tool, "ran");
        }
        if let (Some(key), Some(result), true) = (&call.cache_key, success, fresh) {
            let ttl = self.cache.ttl_for(&call.tool);
            self.cache.insert(key.clone(), result.to_owned(), ttl, now);
        }
        // The client gets this answer: only an explicit key replays it.
        let store = match (&call.explicit_key, success) {
            (Some(_), Some(r)) => Some((r.to_owned(), Keep::Always)),
            _ => None,
        };
        let waiters = match &call.dedup_key {
            Some(k) => self.dedup.complete(k, store, now),
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
        if let Some(client) = &call.client {
            let line = m.into_line_with_id(client);
            self.answer(client, line);
        }
        if let Some(shared) = shared {
            for w in waiters {
                let line = match &shared {
                    Ok(r) => jsonrpc::response_line(&w, r),
                    Err(e) => jsonrpc::error_response_line(&w, e),
                };
                self.answer(&w, line);
            }
        }
    }

    /// Ends a call with a result the proxy holds (a stale cache entry).
    fn finish_with_result(&mut self, id: u64, result: &str, now: Instant) {
        let Some(call) = self.remove_call(id) else {
            return;
        };
        self.note_call_end(&call.tool, call.took(now), None);
        self.traced(|t| t.call_ended(id, CallEnd::stale(), now));
        if call.retried {
            self.stats_for(&call.tool).retried += 1;
        }
        let waiters = match &call.dedup_key {
            Some(k) => self.dedup.complete(k, None, now),
            None => Vec::new(),
        };
        self.keep_late_answers(&call);
        for client in call.client.iter().chain(waiters.iter()) {
            let line = jsonrpc::response_line(client, result);
            self.answer(client, line);
        }
    }

    /// Forgets a call and every id that pointed at it.
    fn remove_call(&mut self, id: u64) -> Option<Call> {
        let call = self.calls.remove(&id)?;
        if let Some(seq) = call.queued {
            self.unqueue(seq);
        }
        if let Some(live) = call.live {
            self.inflight.remove(&live);
        }
        for d in &call.dead {
            self.inflight.remove(d);
        }
        if let Some(k) = &call.dedup_key {
            if self.calls_by_key.get(k) == Some(&id) {
                self.calls_by_key.remove(k);
            }
        }
        if let Some(t) = &call.progress_token {
            if self.calls_by_token.get(t) == Some(&id) {
                self.calls_by_token.remove(t);
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
            self.cache_invalidated(&call.tool, "may have run");
        }
        let Some(key) = call.dedup_key else { return };
        if call.read_only && call.explicit_key.is_none() {
            return;
        }
        let keep = match call.explicit_key {
            Some(_) => Keep::Always,
            None => Keep::Once,
        };
        for &down in call.live.iter().chain(&call.dead) {
            self.inflight.insert(
                down,
                Inflight::Late(Box::new(Late {
                    key,
                    args: call.dedup_args,
                    keep,
                    tool: call.tool.clone(),
                })),
            );
            self.late.push_back(down);
        }
        while self.late.len() > LATE_LIMIT {
            if let Some(old) = self.late.pop_front() {
                if let Some(Inflight::Late(_)) = self.inflight.get(&old) {
                    self.inflight.remove(&old);
                }
            }
        }
    }

    /// An answer to an attempt whose call had already ended.
    pub(super) fn on_late_answer(&mut self, late: Late, m: &Message, now: Instant) {
        let Some(result) = m.result() else {
            return debug!(
                "dropped a late error for tool \"{}\", whose call had ended",
                late.tool
            );
        };
        self.cache_invalidated(&late.tool, "ran late");
        if !storable(result) {
            return;
        }
        info!(
            "tool \"{}\": a late success arrived after the client got no answer from it; kept for an identical call",
            late.tool
        );
        self.dedup
            .store_late(late.key, late.args, result.to_owned(), late.keep, now);
    }

    /// Stops a call nobody waits for any more: cancel downstream, no answer.
    fn drop_call(&mut self, id: u64, reason: &str) {
        let Some(call) = self.remove_call(id) else {
            return;
        };
        if let Some(live) = call.live {
            self.cancel_downstream(live, reason);
        }
        let now = self.now;
        self.traced(|t| t.call_ended(id, CallEnd::cancelled(), now));
        if call.trial {
            self.breaker.on_trial_abandoned();
        }
        if let Some(k) = &call.dedup_key {
            self.dedup.abandon(k);
        }
        self.keep_late_answers(&call);
        debug!(
            "tool \"{}\": call dropped after the client cancelled",
            call.tool
        );
    }

    fn dedup_waiters(&self, id: u64) -> usize {
        self.calls
            .get(&id)
            .and_then(|c| c.dedup_key)
            .map_or(0, |k| self.dedup.joiners(&k))
    }

    /// The client cancelled `client_id`, which belongs to call `id`.
    pub(super) fn cancel_call_member(&mut self, id: u64, client_id: &str, reason: &str) {
        let Some(call) = self.calls.get_mut(&id) else {
            return;
        };
        if call.client.as_deref() == Some(client_id) {
            call.client = None;
        } else if let Some(k) = call.dedup_key {
            self.dedup.remove_waiter(&k, |w| w == client_id);
        }
        if self.calls.get(&id).is_some_and(|c| c.client.is_none()) && self.dedup_waiters(id) == 0 {
            self.drop_call(id, reason);
        } else {
            debug!("a joined request was cancelled; the call continues for the others");
        }
    }

    /// Sends the server a cancel for one of our downstream ids.
    fn cancel_downstream(&mut self, down: u64, reason: &str) {
        let params = format!(
            "{{\"requestId\":{down},\"reason\":{}}}",
            jsonrpc::json_string(reason)
        );
        self.send_server(jsonrpc::notification_line(
            "notifications/cancelled",
            Some(&params),
        ));
    }

    /// A call timer fired.
    pub(super) fn on_call_timer(&mut self, timer: Timer, now: Instant) {
        match timer {
            Timer::AttemptTimeout { call: id, down } => {
                let Some(call) = self.calls.get_mut(&id) else {
                    return;
                };
                if call.live != Some(down) {
                    return;
                }
                if call.attempt_deadline > now {
                    // Progress moved the deadline.
                    let at = call.attempt_deadline;
                    return self.set_timer(at, Timer::AttemptTimeout { call: id, down });
                }
                if self.paused_since.is_some() && call.deadline > now {
                    // The server waits for a person (sampling, elicitation):
                    // the attempt's clock is paused until that request is
                    // answered (`resume_attempt_clocks`); the call's total
                    // deadline still holds.
                    let at = call.deadline;
                    return self.set_timer(at, Timer::AttemptTimeout { call: id, down });
                }
                call.live = None;
                call.dead.push(down);
                let took = now.saturating_duration_since(call.attempt_started);
                self.traced(|t| {
                    t.attempt_event(id, "mcp_retry.cancelled_downstream", Vec::new(), now)
                });
                self.cancel_downstream(down, "timed out (mcp-retry)");
                self.on_attempt_failed(id, Failure::Timeout(took), now);
            }
            Timer::RetryDue { call: id }
                if self
                    .calls
                    .get(&id)
                    .is_some_and(|c| c.retry_at.is_some_and(|t| t <= now) && c.live.is_none()) =>
            {
                self.start_attempt(id, now);
            }
            Timer::CallDeadline { call: id } => {
                if let Some(failure) = self.calls.get_mut(&id).and_then(|c| c.parked.take()) {
                    self.decide(id, failure, now);
                }
            }
            _ => {}
        }
    }

    /// The last request of the server waiting for a person was answered
    /// (or withdrawn): live attempts get back the time they spent paused
    /// since `since`, within their calls' deadlines.
    pub(super) fn resume_attempt_clocks(&mut self, since: Instant, now: Instant) {
        let mut timers = Vec::new();
        for (&id, call) in self.calls.iter_mut() {
            let Some(down) = call.live else { continue };
            let paused = now.saturating_duration_since(since.max(call.attempt_started));
            call.attempt_deadline = (call.attempt_deadline + paused).min(call.deadline);
            timers.push((call.attempt_deadline, id, down));
        }
        for (at, call, down) in timers {
            self.set_timer(at, Timer::AttemptTimeout { call, down });
        }
    }

    /// A `notifications/progress` from the server for one of our calls.
    /// Returns false when the token is not a call's.
    pub(super) fn on_call_progress(&mut self, m: &Message, now: Instant) -> bool {
        let Some(params) = m.params().and_then(RawObject::parse) else {
            return false;
        };
        let Some(token) = params.get("progressToken").map(|t| t.get().to_owned()) else {
            return false;
        };
        let Some(&id) = self.calls_by_token.get(&token) else {
            return false;
        };
        let Some(call) = self.calls.get_mut(&id) else {
            return false;
        };
        if call.live.is_none() {
            return true;
        }
        // Progress means the attempt is alive, whatever the value: a retry
        // counts from 0 again and is not forwarded until it passes what the
        // client has seen, but it must not time out meanwhile.
        call.attempt_deadline = (now + call.attempt_timeout).min(call.deadline);
        let value = params
            .get("progress")
            .and_then(|p| p.get().parse::<f64>().ok());
        let Some(value) = value else {
            return true;
        };
        if call.client.is_some() && call.progress.admit(value) {
            self.send_client(m.line());
        }
        true
    }

    /// Every call attempt in flight on a lost link failed.
    /// `may_have_received` false: the transport knows none of them reached
    /// the server, so they fail as never sent.
    pub(super) fn calls_link_lost(&mut self, message: &str, may_have_received: bool, now: Instant) {
        let mut ids: Vec<u64> = self
            .calls
            .iter()
            .filter(|(_, c)| c.live.is_some() || !c.dead.is_empty() || c.retry_at.is_some())
            .map(|(id, _)| *id)
            .collect();
        ids.sort();
        for id in ids {
            let Some(call) = self.calls.get_mut(&id) else {
                continue;
            };
            for d in call.dead.drain(..) {
                self.inflight.remove(&d);
            }
            if let Some(live) = call.live.take() {
                self.inflight.remove(&live);
                let failure = match may_have_received {
                    true => Failure::Exited(message.to_owned()),
                    false => Failure::NeverSent(message.to_owned()),
                };
                self.on_attempt_failed(id, failure, now);
            }
        }
    }

    /// Asks the server for its tool list (all pages) to learn annotations.
    pub(super) fn fetch_tools(&mut self, now: Instant) {
        if self.tools.fetching {
            return;
        }
        self.tools.fetching = true;
        self.tools.pages.clear();
        if self.link_ready() {
            self.request_tools_page(None, now);
        } else {
            // Asked once the restarted server is ready.
            self.tools.deferred = true;
        }
    }

    /// The server became ready: ask for the tool list if it was wanted.
    pub(super) fn fetch_deferred_tools(&mut self, now: Instant) {
        if std::mem::take(&mut self.tools.deferred) {
            self.request_tools_page(None, now);
        }
    }

    /// Sends our own `tools/list` for one page; it gets `call_timeout` to
    /// be answered, like an attempt.
    fn request_tools_page(&mut self, cursor: Option<&str>, now: Instant) {
        let down = self.next_id();
        let params = match cursor {
            Some(c) => format!("{{\"cursor\":{}}}", jsonrpc::json_string(c)),
            None => "{}".into(),
        };
        self.inflight.insert(down, Inflight::ToolsList);
        if self.send_server(jsonrpc::request_line(
            &down.to_string(),
            "tools/list",
            Some(&params),
        )) {
            self.set_timer(
                now + self.cfg.call_timeout,
                Timer::ToolsListTimeout { down },
            );
        } else {
            self.inflight.remove(&down);
            self.tools_learned(false, now);
        }
    }

    /// Our own `tools/list` was not answered in time: the annotations stay
    /// unknown, and calls waiting for them are decided now (unknown means
    /// unsafe) rather than at their deadline.
    pub(super) fn tools_list_timed_out(&mut self, down: u64, now: Instant) {
        if let Some(Inflight::ToolsList) = self.inflight.get(&down) {
            self.inflight.remove(&down);
            warn!(
                "the server did not answer the proxy's tools/list within {}; tool annotations stay unknown",
                secs(self.cfg.call_timeout)
            );
            self.tools_learned(false, now);
        }
    }

    /// A `tools/list` page passed by (ours or the client's).
    /// `first` when the client asked for the first page: a listing starts
    /// over (a client that reads only first pages keeps no more than one).
    pub(super) fn learn_tools(&mut self, result: &str, ours: bool, first: bool, now: Instant) {
        match gate::parse_tools_list(result) {
            Ok(page) => {
                for (name, a) in page.tools {
                    self.tools.annotations.insert(name, a);
                }
                if first {
                    self.tools.pages.clear();
                }
                let keys = &self.fingerprint_keys;
                self.tools.pages.extend(
                    canonical_tools(result)
                        .iter()
                        .map(|t| fingerprint(keys, &[t])),
                );
                match page.next_cursor {
                    Some(c) if ours => self.request_tools_page(Some(&c), now),
                    Some(_) => {}
                    None => {
                        self.listing_complete();
                        self.tools_learned(true, now)
                    }
                }
            }
            Err(e) => {
                debug!("could not read the server's tool list: {e}");
                if ours {
                    self.tools_learned(false, now);
                }
            }
        }
    }

    /// A complete listing was read: remember its fingerprint, and after a
    /// restart tell the client when the tools differ.
    fn listing_complete(&mut self) {
        let mut entries = std::mem::take(&mut self.tools.pages);
        entries.sort_unstable();
        let before = self.tools.fingerprint.replace(entries.clone());
        if std::mem::take(&mut self.tools.compare_after_restart)
            && before.is_some_and(|b| b != entries)
        {
            info!("the restarted server offers different tools; telling the client");
            self.send_client(jsonrpc::notification_line(
                "notifications/tools/list_changed",
                None,
            ));
        }
    }

    /// The tool list is complete (or could not be had): decide parked calls.
    pub(super) fn tools_learned(&mut self, complete: bool, now: Instant) {
        self.tools.fetching = false;
        self.tools.deferred = false;
        if !complete {
            self.tools.compare_after_restart = false;
        }
        // Even a failed fetch ends the wait: unknown then means unsafe.
        self.tools.known = true;
        if complete {
            debug!(
                "learned the annotations of {} tool(s)",
                self.tools.annotations.len()
            );
        }
        let mut parked: Vec<u64> = self
            .calls
            .iter()
            .filter(|(_, c)| c.parked.is_some())
            .map(|(id, _)| *id)
            .collect();
        parked.sort();
        for id in parked {
            if let Some(f) = self.calls.get_mut(&id).and_then(|c| c.parked.take()) {
                self.decide(id, f, now);
            }
        }
    }

    /// The server's tools changed: forget what we knew and flush the cache.
    pub(super) fn tools_changed(&mut self) {
        self.tools.known = false;
        self.cache.clear();
        debug!("the server's tools changed: cache flushed, annotations to be refreshed");
    }

    pub(super) fn log_transition(&mut self, t: Option<Transition>) {
        let Some(t) = t else { return };
        let name = match t {
            Transition::Opened => "opened",
            Transition::HalfOpened => "half_opened",
            Transition::Closed => "closed",
            Transition::Reopened => "reopened",
        };
        self.traced(|tracer| tracer.breaker(name));
        let name = &self.cfg.name;
        match t {
            Transition::Opened => {
                self.stats.breaker_opens += 1;
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
                self.stats.breaker_opens += 1;
                warn!("circuit breaker for \"{name}\" reopened: the trial call failed")
            }
        }
    }

    pub(super) fn stats_for(&mut self, tool: &str) -> &mut ToolStats {
        self.stats_dirty();
        self.stats.tool(tool)
    }
}

/// The parts of a `tools/call` the policies look at.
struct ParsedCall<'a> {
    name: String,
    /// Raw JSON of `arguments` (after removing `_idempotency_key`), `{}` if absent.
    arguments: Cow<'a, str>,
    explicit_key: Option<String>,
    /// The key came from `_meta.idempotencyKey`, which reaches the server.
    key_in_meta: bool,
    progress_token: Option<String>,
    /// Params to forward when `_idempotency_key` was removed.
    forward_params: Option<String>,
    /// Tasks and multi-round-trip calls are never deduplicated or cached.
    no_store: bool,
}

impl<'a> ParsedCall<'a> {
    fn parse(m: &'a Message) -> Option<ParsedCall<'a>> {
        let params = RawObject::parse(m.params()?)?;
        let name = params.string("name")?;
        let mut explicit_key = None;
        let mut progress_token = None;
        if let Some(meta) = params.get("_meta").and_then(|v| RawObject::parse(v.get())) {
            progress_token = meta.get("progressToken").map(|t| t.get().to_owned());
            explicit_key = meta.get("idempotencyKey").and_then(key_text);
        }
        let key_in_meta = explicit_key.is_some();
        // Borrowed from the message: megabytes of arguments are not copied.
        let mut arguments = Cow::Borrowed(params.get("arguments").map_or("{}", |a| a.get()));
        let mut forward_params = None;
        if let Some(mut args) = RawObject::parse(&arguments) {
            if let Some(k) = args.remove("_idempotency_key") {
                if explicit_key.is_none() {
                    explicit_key = key_text(k);
                }
                let new_args = args.to_json();
                forward_params = Some(params.to_json_replacing("arguments", &new_args));
                arguments = Cow::Owned(new_args);
            }
        }
        let no_store = ["task", "inputResponses", "requestState"]
            .iter()
            .any(|k| params.get(k).is_some());
        Some(ParsedCall {
            name,
            arguments,
            explicit_key,
            key_in_meta,
            progress_token,
            forward_params,
            no_store,
        })
    }
}

/// The canonical text of each tool in a `tools/list` result.
fn canonical_tools(result: &str) -> Vec<String> {
    let Some(tools) = RawObject::parse(result).and_then(|r| r.get("tools")) else {
        return Vec::new();
    };
    serde_json::from_str::<Vec<&serde_json::value::RawValue>>(tools.get())
        .map(|ts| {
            ts.iter()
                .filter_map(|t| canonical_json(t.get()).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// An idempotency key's text: a string, or a number as written.
fn key_text(v: &serde_json::value::RawValue) -> Option<String> {
    let raw = v.get();
    if raw.starts_with('"') {
        serde_json::from_str::<String>(raw)
            .ok()
            .filter(|s| !s.is_empty())
    } else if raw
        .as_bytes()
        .first()
        .is_some_and(|b| b.is_ascii_digit() || *b == b'-')
    {
        Some(raw.to_owned())
    } else {
        None
    }
}

/// Whether a result may be cached or replayed: not `isError`, not an
/// `input_required` or task-creating result. `result` is valid JSON (the
/// `result` of a parsed message).
fn storable(result: &str) -> bool {
    // Reading the members means parsing all of the result again, which costs
    // as much as the line's first parse. A member name can only be written
    // literally or with a `\u` escape, so when none of the three names
    // occurs and there is no `\u`, no such member exists at any depth, and
    // being an object is all that is left to check.
    static NEEDLES: LazyLock<[memmem::Finder<'static>; 4]> = LazyLock::new(|| {
        ["\\u", "\"isError\"", "\"resultType\"", "\"task\""].map(memmem::Finder::new)
    });
    if NEEDLES.iter().all(|n| n.find(result.as_bytes()).is_none()) {
        return result.trim_start().starts_with('{');
    }
    storable_by_members(result)
}

/// [`storable`] by reading the result's members.
fn storable_by_members(result: &str) -> bool {
    let Some(o) = RawObject::parse(result) else {
        return false;
    };
    if o.get("isError").is_some_and(|v| v.get() == "true") {
        return false;
    }
    if o.get("resultType")
        .is_some_and(|v| v.get() != "\"complete\"")
    {
        return false;
    }
    o.get("task").is_none()
}

/// The attempt line of `request` with id `down` and its own `traceparent`
/// in `params._meta` (export on only; `None` if params is not an object).
fn traced_line(request: &Message, down: u64, traceparent: &str) -> Option<Vec<u8>> {
    let params = otel::with_traceparent(request.params()?, traceparent)?;
    Some(
        request
            .with_params(&params)?
            .line_with_id(&down.to_string()),
    )
}

/// `result` with `_meta["mcp-retry/source"]` set (first in `_meta`),
/// nothing else changed.
pub fn with_source(result: &str, source: Source) -> String {
    let Some(mut o) = RawObject::parse(result) else {
        return result.to_owned();
    };
    let marker = format!("\"mcp-retry/source\":\"{}\"", source.as_str());
    match o.get("_meta").and_then(|m| RawObject::parse(m.get())) {
        Some(mut meta) => {
            meta.remove("mcp-retry/source");
            o.to_json_replacing("_meta", &meta.to_json_after(&marker))
        }
        None => {
            // No `_meta`, or one that is not an object: a fresh one.
            o.remove("_meta");
            o.to_json_after(&format!("\"_meta\":{{{marker}}}"))
        }
    }
}

fn describe_failure(tool: &str, f: &Failure) -> String {
    match f {
        Failure::NeverSent(why) => format!("tool \"{tool}\" could not be sent ({why})"),
        Failure::Refused(why, _) => format!("tool \"{tool}\" was refused ({why})"),
        Failure::Timeout(d) => format!("tool \"{tool}\" timed out after {}", secs(*d)),
        Failure::Exited(why) => format!("tool \"{tool}\" lost its server before answering ({why})"),
        Failure::Transient(e) => {
            let code = RawObject::parse(e)
                .and_then(|o| o.get("code").map(|c| c.get().to_owned()))
                .unwrap_or_else(|| "?".into());
            format!("tool \"{tool}\" failed with transient error {code}")
        }
    }
}

fn give_up_message(tool: &str, reason: Reason, f: &Failure, attempts: u32) -> String {
    let what = describe_failure(tool, f);
    match reason {
        Reason::NotRetriedUnsafe | Reason::ServerExited => format!(
            "{what} and was not retried: it is not known to be idempotent (set tools.{tool}.idempotent: true if it is){}",
            match f {
                Failure::Exited(_) | Failure::Timeout(_) => "; it may or may not have run",
                _ => "",
            }
        ),
        Reason::RetriesExhausted => format!("{what}; gave up after {attempts} attempts (retry.max_retries)"),
        Reason::Timeout => format!("{what} (retries are off: retry.max_retries is 0)"),
        Reason::RetryBudgetExhausted => format!(
            "{what}; not retried because too many retries were made recently (retry budget exhausted); try again shortly"
        ),
        Reason::DeadlineExceeded => format!("{what}; no time left for another attempt within retry.total_timeout"),
        _ => what,
    }
}

/// A duration for people: `250ms`, `2s`, `1.5s`.
pub(super) fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 1.0 {
        format!("{}ms", d.as_millis())
    } else if s.fract() < 0.05 {
        format!("{s:.0}s")
    } else {
        format!("{s:.1}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_marker_is_added_to_meta_only() {
        assert_eq!(
            with_source(r#"{"content":[],"n":1.0}"#, Source::Cache),
            r#"{"_meta":{"mcp-retry/source":"cache"},"content":[],"n":1.0}"#
        );
        assert_eq!(
            with_source(r#"{"_meta":{"a":1},"content":[]}"#, Source::Dedup),
            r#"{"_meta":{"mcp-retry/source":"dedup","a":1},"content":[]}"#
        );
        assert_eq!(
            with_source("{}", Source::Stale),
            r#"{"_meta":{"mcp-retry/source":"stale"}}"#
        );
        assert_eq!(
            with_source(r#"{"_meta":null,"content":[]}"#, Source::Cache),
            r#"{"_meta":{"mcp-retry/source":"cache"},"content":[]}"#
        );
        assert_eq!(
            with_source(r#"{"_meta":{"mcp-retry/source":"old"}}"#, Source::Dedup),
            r#"{"_meta":{"mcp-retry/source":"dedup"}}"#
        );
    }

    #[test]
    fn storable_excludes_errors_and_incomplete_results() {
        assert!(storable(r#"{"content":[]}"#));
        assert!(storable(r#"{"content":[],"isError":false}"#));
        assert!(!storable(r#"{"content":[],"isError":true}"#));
        assert!(!storable(r#"{"resultType":"input_required"}"#));
        assert!(storable(r#"{"resultType":"complete","content":[]}"#));
        assert!(!storable(r#"{"task":{"taskId":"t"}}"#));
        // Escaped member names are names all the same.
        assert!(!storable(r#"{"content":[],"is\u0045rror":true}"#));
        assert!(!storable(r#"{"\u0074ask":{}}"#));
        assert!(storable(r#"{"content":[{"type":"text","text":"\u00e9"}]}"#));
        assert!(storable(
            r#"{"content":[{"type":"text","text":"the \"task\" is done"}]}"#
        ));
        assert!(!storable(r#"[{"content":[]}]"#));
        assert!(!storable(r#""text""#));
        assert!(storable(r#"{"structuredContent":{"isError":true}}"#));
    }

    #[test]
    fn storable_shortcut_agrees_with_reading_the_members() {
        for r in [
            r#"{}"#,
            r#" {"content":[]}"#,
            r#"{"content":[{"type":"text","text":"{\"seq\":1}"}],"structuredContent":{"arguments":{"seq":1},"pid":7}}"#,
            r#"{"content":[],"isError":false}"#,
            r#"{"content":[],"isError":true}"#,
            r#"{"resultType":"complete"}"#,
            r#"{"resultType":"input_required"}"#,
            r#"{"task":null}"#,
            r#"{"a":{"task":1}}"#,
            r#"{"is\u0045rror":true}"#,
            r#"{"x":"\\u0041"}"#,
            r#"["isError"]"#,
            r#"null"#,
            r#"12"#,
        ] {
            assert_eq!(storable(r), storable_by_members(r), "{r}");
        }
    }

    /// The parts of a call that outlive its message, as the tests read them.
    struct Parts {
        arguments: String,
        explicit_key: Option<String>,
        progress_token: Option<String>,
        forward_params: Option<String>,
        no_store: bool,
    }

    fn parsed(params: &str) -> Parts {
        let m = Message::reparse(format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{params}}}"#
        ))
        .unwrap();
        let p = ParsedCall::parse(&m).unwrap();
        Parts {
            arguments: p.arguments.into_owned(),
            explicit_key: p.explicit_key,
            progress_token: p.progress_token,
            forward_params: p.forward_params,
            no_store: p.no_store,
        }
    }

    #[test]
    fn argument_key_is_removed_and_meta_key_read() {
        let p = parsed(r#"{"name":"pay","arguments":{"amount":5,"_idempotency_key":"k-1"}}"#);
        assert_eq!(p.explicit_key.as_deref(), Some("k-1"));
        assert_eq!(p.arguments, r#"{"amount":5}"#);
        assert_eq!(
            p.forward_params.as_deref(),
            Some(r#"{"name":"pay","arguments":{"amount":5}}"#)
        );
        let p = parsed(
            r#"{"name":"pay","arguments":{"a":1},"_meta":{"idempotencyKey":"m-2","progressToken":7}}"#,
        );
        assert_eq!(p.explicit_key.as_deref(), Some("m-2"));
        assert_eq!(p.progress_token.as_deref(), Some("7"));
        assert!(p.forward_params.is_none());
        assert!(!p.no_store);
        assert!(parsed(r#"{"name":"x","task":{"ttl":5}}"#).no_store);
        assert!(parsed(r#"{"name":"x","requestState":"s"}"#).no_store);
    }
}
