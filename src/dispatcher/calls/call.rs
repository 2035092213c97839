//! One `tools/call` as the calls see it: the state of a call in flight
//! ([`Call`]), why an attempt failed ([`Failure`]), and where a late answer
//! of an ended call goes ([`Late`]). What the client's request says is read
//! by its reader thread (`inbound::ParsedCall`).
//!
//! Plain data; no parsing, no decisions.

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crate::jsonrpc::Message;
use crate::policy::dedup::Keep;
use crate::policy::progress::ProgressFilter;

/// Why an attempt failed.
#[derive(Debug, Clone)]
pub(in crate::dispatcher) enum Failure {
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
    /// The request reached the server, but no answer came back (a 5xx
    /// without a JSON-RPC answer, a connection broken after it was sent),
    /// with the HTTP status if one came: ambiguous.
    Transport(String, Option<u16>),
    /// The server refused it for good without running it (401, 403,
    /// another 4xx): final, not retried.
    Rejected(String, Option<u16>),
}

impl Failure {
    pub(super) fn ambiguous(&self) -> bool {
        !matches!(
            self,
            Failure::NeverSent(_) | Failure::Refused(..) | Failure::Rejected(..)
        )
    }

    /// Whether it says something of the server's health (for the
    /// breaker): not a request the server never had, and not one it
    /// refused for good (a wrong token says nothing of health).
    pub(super) fn counts(&self) -> bool {
        !matches!(self, Failure::NeverSent(_) | Failure::Rejected(..))
    }

    /// The HTTP status that came with it, if any.
    pub(super) fn http_status(&self) -> Option<u16> {
        match self {
            Failure::Transport(_, s) | Failure::Rejected(_, s) => *s,
            _ => None,
        }
    }

    /// For logs: `never_sent`, `timeout`, `server_exited`, `transient_error`.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Failure::NeverSent(_) => "never_sent",
            Failure::Timeout(_) => "timeout",
            Failure::Exited(_) => "server_exited",
            Failure::Transient(_) => "transient_error",
            Failure::Refused(..) => "refused",
            Failure::Transport(..) => "transport_error",
            Failure::Rejected(..) => "rejected",
        }
    }
}

/// One client `tools/call` and everything done for it.
#[derive(Debug)]
pub(super) struct Call {
    /// The client request that started it; `None` once that client cancelled
    /// while joined requests still wait.
    pub client: Option<crate::dispatcher::ClientId>,
    pub tool: String,
    /// The request as forwarded (the argument idempotency key removed);
    /// its id is replaced for every attempt.
    pub request: Message,
    /// The client's trace context, read with the request.
    pub client_context: Option<crate::otel::SpanContext>,
    pub progress_token: Option<String>,
    /// The dedup key (a fingerprint of the tool and its explicit key or its
    /// arguments) when dedup applies, and the fingerprint of the arguments.
    pub dedup_key: Option<u128>,
    pub dedup_args: u128,
    /// The client's idempotency key (either form), for messages.
    pub explicit_key: Option<String>,
    /// The key is in `_meta` and the server honours keys: the gate may
    /// count it.
    pub key_honored: bool,
    /// The tool is known to only read (config or trusted annotation).
    pub read_only: bool,
    /// The cache key when the tool is cached.
    pub cache_key: Option<String>,
    /// The cache's epoch when the live (or last) attempt was sent: its
    /// result is cached only if nothing that may write ran since.
    pub cache_epoch: u64,
    /// Attempts started so far.
    pub attempts: u32,
    /// Where it is between its arrival and its end.
    pub phase: Phase,
    /// Earlier attempts that were abandoned but may still answer.
    pub dead: Vec<u64>,
    pub attempt_timeout: Duration,
    /// When the live (or last) attempt was sent.
    pub attempt_started: Instant,
    /// When the client's request arrived (for `status`' latencies).
    pub started: Instant,
    pub attempt_deadline: Instant,
    /// Bound on all attempts and waits.
    pub deadline: Instant,
    pub last_failure: Option<Failure>,
    pub progress: ProgressFilter,
    /// When the client, which gave a progress token, is next told that the
    /// call still waits (a `CallTimer::WaitNotice` is set for then).
    pub notice_at: Option<Instant>,
    /// This call holds the breaker's half-open trial.
    pub trial: bool,
    /// The server incarnation whose tool list it already waited for:
    /// unknown after that means unsafe.
    pub waited_for_tools: Option<u64>,
    pub retried: bool,
    /// Its record in the store, for a keyed call when a store is used.
    pub claim: Option<super::keys::Claim>,
    /// What its 2026-07-28 headers say, as its reader read it.
    pub modern: Option<std::sync::Arc<crate::mcp::Modern>>,
    /// Where an attempt's `traceparent` goes, as its reader decided
    /// (`ParsedCall::traceparent_edit`).
    pub traceparent_edit: Option<crate::otel::TraceparentEdit>,
}

/// Where a call is between its attempts (the diagram in `calls.rs`).
#[derive(Debug)]
pub(super) enum Phase {
    /// No attempt at the server and none planned: it arrived, its claim
    /// waits for the store, or an attempt is being admitted and routed.
    Idle,
    /// Its live attempt, this downstream id, is at the server.
    InFlight(u64),
    /// A retry is scheduled for this time.
    BackingOff(Instant),
    /// Its next attempt waits in the link's queue (this sequence number)
    /// for a restarting server.
    Queued(u64),
    /// Waiting for the tool's annotations before deciding on this failure.
    Parked(Failure),
}

impl Call {
    /// The live attempt's downstream id.
    pub fn live(&self) -> Option<u64> {
        match self.phase {
            Phase::InFlight(down) => Some(down),
            _ => None,
        }
    }

    /// The live attempt's downstream id, which is live no more.
    pub fn take_live(&mut self) -> Option<u64> {
        let down = self.live()?;
        self.phase = Phase::Idle;
        Some(down)
    }

    /// The failure it was parked with, which is decided now.
    pub fn take_parked(&mut self) -> Option<Failure> {
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Parked(f) => Some(f),
            other => {
                self.phase = other;
                None
            }
        }
    }

    /// Its queue item is released or gone: it waits in the queue no more.
    pub fn unqueue(&mut self) {
        if let Phase::Queued(_) = self.phase {
            self.phase = Phase::Idle;
        }
    }

    /// How long the call took, if the server was asked at all (a call
    /// refused before any attempt says nothing of the server's latency).
    pub fn took(&self, now: Instant) -> Option<Duration> {
        (self.attempts > 0).then(|| now.saturating_duration_since(self.started))
    }

    /// Its live attempt's tool and whether it is a retry (for
    /// [`super::Action::Cancel`]).
    pub fn live_attempt(&self) -> (String, bool) {
        (self.tool.clone(), self.attempts > 1)
    }

    /// Whether it still has an attempt that counts: live, abandoned but
    /// able to answer, or a retry planned.
    pub fn has_attempts(&self) -> bool {
        matches!(self.phase, Phase::InFlight(_) | Phase::BackingOff(_)) || !self.dead.is_empty()
    }
}

/// An attempt of a call that ended without its success reaching the client:
/// where a late success goes in the idempotency table.
#[derive(Debug)]
pub(super) struct Late {
    pub key: u128,
    pub args: u128,
    pub keep: Keep,
    pub tool: String,
    /// When its call started: a late error lifts only that call's mark.
    pub started: Instant,
    /// Its call's record in the store, told of the late answer.
    pub record: Option<crate::store::Id>,
}
