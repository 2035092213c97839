//! The dispatcher: one thread, one closed [`Event`] enum, one loop, and all
//! the session's state.
//!
//! It routes every message between the client and the server, rewriting ids
//! so each side sees only its own, answers malformed input, and drives the
//! lifecycle of the server link (start, shutdown). `tools/call` requests are
//! handed to [`Calls`] (`calls.rs`), which applies the policies and returns
//! actions that `actions.rs` carries out. Deadlines are data: a
//! min-heap of [`Timer`]s, and the loop sleeps on the earliest one with
//! `recv_deadline`, so an idle proxy uses no CPU.
//!
//! Never touches a file descriptor: I/O threads deliver events and take lines
//! over channels; the server is reached only through [`Downstream`]. What
//! `mcp-retry status` shows is handed to its writer thread after changes
//! only (see "reporting" below).

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::config::ServerConfig;
use crate::downstream::{Downstream, Gone, Heal, Outgoing, ServerEvent, StartError, SHUTDOWN_STEP};
use crate::guard::Pending;
use crate::inbound::{Inbound, Read, Reader};
use crate::jsonrpc::{self, Invalid, Kind, Message, Parsed, RawObject};
use crate::otel::{Handle, Tracer};
use crate::policy::breaker::BreakerState;
use crate::status::{BreakerShown, Headline, Snapshot};
use crate::stdio::{self, Backlog, Outbox};
use crate::{debug, info, warn};

mod actions;
mod calls;
mod clock;
mod instant;
mod link;
mod queue;
mod reporting;
mod requests;
#[cfg(test)]
mod tests;
mod timers;

use crate::mcp::List;
use calls::{Action, CallTimer, Calls, Owner};
pub(crate) use calls::{KeyStore, Unavailable};
use instant::{InstantStart, Source};
use link::{Link, Queued, ReplayStep, Route, SendResult};
use reporting::Reporting;
use requests::{ClientId, ClientRequest, Inflight, Method, Requests, Resolved, ServerRequest};
pub use timers::Timer;
use timers::Timers;
#[cfg(test)]
use timers::MIN_TIMERS_TO_PRUNE;

/// Everything that can wake the dispatcher.
#[derive(Debug)]
pub enum Event {
    /// A classified line from the client, a request's params read.
    Client(Inbound),
    /// A client line over `max_message_bytes`, and the id of the request it
    /// was, if the reader found one.
    ClientTooLong { id: Option<String>, len: usize },
    /// The client closed our stdin.
    ClientEof,
    /// Writing to the client failed: nobody is listening any more.
    ClientGone,
    /// Something happened to server link number `generation`.
    Server { generation: u64, event: ServerEvent },
    /// SIGTERM, SIGINT or SIGHUP.
    Signal(i32),
    /// The store answered a keyed call's claim.
    Store(crate::store::thread::Told),
}

impl Event {
    /// Roughly how many bytes it holds (what waits in the inbox).
    pub fn size(&self) -> usize {
        match self {
            Event::Client(p) => p.size(),
            Event::ClientTooLong { id, .. } => id.as_ref().map_or(0, String::len),
            Event::Server {
                event: ServerEvent::Message(p),
                ..
            } => p.size(),
            _ => 0,
        }
    }

    /// An answer from the server (one that may end a call, recording its
    /// latency): handled at a reading of the clock of its own.
    fn is_answer(&self) -> bool {
        match self {
            Event::Server {
                event: ServerEvent::Message(Parsed::Message(m)),
                ..
            } => m.kind() == Kind::Response,
            Event::Server {
                event: ServerEvent::Message(Parsed::Batch(_)) | ServerEvent::Failed { .. },
                ..
            } => true,
            _ => false,
        }
    }
}

/// Opens a connection to the server; `events` is how the transport reports.
pub type Connector = Box<
    dyn FnMut(&ServerConfig, u64, Sender<Event>) -> Result<Box<dyn Downstream>, StartError> + Send,
>;

/// The code of every error the proxy itself originates for a request
/// (outside -32768..-32000, as the 2026 error-code policy asks).
pub const PROXY_ERROR: i64 = -31000;

/// Why the proxy answered a request itself (`data.reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    ServerExited,
    ServerUnavailable,
    Overloaded,
    CircuitOpen,
    RetriesExhausted,
    Timeout,
    NotRetriedUnsafe,
    RetryBudgetExhausted,
    DeadlineExceeded,
    /// The server's answer was over `max_message_bytes`.
    ResponseTooLarge,
    /// The server's answer was not a valid JSON-RPC response.
    InvalidResponse,
    /// The request reached the server, but no answer came back (a 5xx
    /// without a JSON-RPC answer, a connection broken after it was sent):
    /// it may have run.
    TransportError,
    /// The server refused the request without running it (401, 403,
    /// another 4xx without a JSON-RPC answer).
    Rejected,
    /// A bug in mcp-retry stopped the session (a panic on the dispatcher).
    InternalError,
    /// The request cannot be sent as the client wrote it (-32602).
    InvalidParams,
    /// An earlier call with the same idempotency key may have run, and its
    /// outcome is unknown: this one is not run.
    EarlierAttemptUnknown,
    /// An earlier call with the same idempotency key succeeded, with a
    /// result too large to keep: this one is not run.
    AlreadyRan,
    /// The store of idempotency keys cannot be asked, and
    /// `store_unavailable` is `refuse`: a keyed call of a tool not known
    /// to be safe is not run.
    StoreUnavailable,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::ServerExited => "server_exited",
            Reason::ServerUnavailable => "server_unavailable",
            Reason::Overloaded => "overloaded",
            Reason::CircuitOpen => "circuit_open",
            Reason::RetriesExhausted => "retries_exhausted",
            Reason::Timeout => "timeout",
            Reason::NotRetriedUnsafe => "not_retried_unsafe",
            Reason::RetryBudgetExhausted => "retry_budget_exhausted",
            Reason::DeadlineExceeded => "deadline_exceeded",
            Reason::ResponseTooLarge => "response_too_large",
            Reason::InvalidResponse => "invalid_response",
            Reason::TransportError => "transport_error",
            Reason::Rejected => "rejected",
            Reason::InternalError => "internal_error",
            Reason::InvalidParams => "invalid_params",
            Reason::EarlierAttemptUnknown => "earlier_attempt_unknown",
            Reason::AlreadyRan => "already_ran",
            Reason::StoreUnavailable => "store_unavailable",
        }
    }
}

/// What a finished call reports: a result, the server's own error, or the
/// proxy's error with its reason. The one thing the stats, `status` and
/// OpenTelemetry count a call's end by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    Ok,
    ServerError,
    Proxy(Reason),
}

impl CallOutcome {
    /// The label a failure is counted under (`server_error` or the
    /// proxy's reason); none for a result.
    pub fn failure_label(self) -> Option<&'static str> {
        match self {
            CallOutcome::Ok => None,
            CallOutcome::ServerError => Some("server_error"),
            CallOutcome::Proxy(r) => Some(r.as_str()),
        }
    }
}

/// An error a call ends with: its error object (raw JSON), and whose it
/// is (`None`: the server's own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    pub object: String,
    pub reason: Option<Reason>,
}

impl CallError {
    /// The proxy's error (see [`proxy_error`]).
    pub fn proxy(reason: Reason, message: &str, extra: &[(&str, String)]) -> CallError {
        CallError {
            object: proxy_error(reason, message, extra),
            reason: Some(reason),
        }
    }

    /// The server's own error object.
    pub fn server(object: String) -> CallError {
        CallError {
            object,
            reason: None,
        }
    }

    pub fn outcome(&self) -> CallOutcome {
        match self.reason {
            Some(r) => CallOutcome::Proxy(r),
            None => CallOutcome::ServerError,
        }
    }
}

/// A proxy-originated error object for a request.
pub fn proxy_error(reason: Reason, message: &str, extra: &[(&str, String)]) -> String {
    let mut data = format!(
        "{{\"source\":\"mcp-retry\",\"reason\":\"{}\"",
        reason.as_str()
    );
    for (k, v) in extra {
        data.push_str(&format!(",{}:{}", jsonrpc::json_string(k), v));
    }
    data.push('}');
    jsonrpc::error_object(PROXY_ERROR, message, Some(&data))
}

/// How long after its stop sequence a server may take to be reported gone
/// (what is left of its group, its last output) before the proxy exits
/// without it.
const SHUTDOWN_BACKSTOP: Duration = Duration::from_secs(3);

/// How long after the handshake the proxy waits for the client to list the
/// tools before it asks the server itself.
const TOOLS_AFTER_HANDSHAKE: Duration = Duration::from_millis(200);

/// Shutdown progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    /// The client is gone or a signal came: stop the server, then exit.
    Stopping {
        signal: Option<i32>,
    },
}

/// What the loop ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The client closed stdin (or stopped reading).
    ClientClosed,
    /// Stopped by this signal.
    Signalled(i32),
    /// The server's handshake contradicted the cached one the session
    /// began with: the host must connect again.
    HandshakeChanged,
}

pub struct Dispatcher {
    cfg: Arc<ServerConfig>,
    to_client: Outbox,
    /// The server link: its state, the session to replay, the queue, the
    /// probes.
    link: Link,
    /// Every request in flight across the proxy, and the ids given to them.
    requests: Requests,
    timers: Timers,
    phase: Phase,
    /// Every `tools/call` in flight, with the policies.
    calls: Calls,
    /// The actions the calls return, a buffer kept between events.
    actions: Vec<Action>,
    /// The time of the event or timer being handled: the dispatcher's only
    /// clock (read by `run`, set by the caller of `handle_event`).
    now: Instant,
    /// The stats file, `status`, OpenTelemetry, start and ready times.
    reporting: Reporting,
    /// Nothing else waits in the inbox: lines may be written at once
    /// rather than handed to the writer threads (see `Outbox::send_now`).
    eager: bool,
    /// Counts the bytes of the events waiting in the inbox, for the readers
    /// that feed it.
    inbox_backlog: Option<Arc<Backlog>>,
    /// Bytes of messages handled since free memory was last given back.
    handled_bytes: usize,
    /// Instant start, when on and the cache is usable (`instant.rs`).
    instant: Option<Box<InstantStart>>,
    /// The session ends because the server contradicted the cache.
    handshake_changed: bool,
}

impl Dispatcher {
    pub fn new(
        cfg: ServerConfig,
        to_client: Outbox,
        events: Sender<Event>,
        connect: Connector,
    ) -> Dispatcher {
        let cfg = Arc::new(cfg);
        Dispatcher {
            to_client,
            link: Link::new(cfg.clone(), connect, events),
            requests: Requests::default(),
            timers: Timers::default(),
            phase: Phase::Running,
            calls: Calls::new(cfg.clone()),
            actions: Vec::new(),
            now: Instant::now(),
            reporting: Reporting::new(Instant::now()),
            eager: false,
            inbox_backlog: None,
            handled_bytes: 0,
            instant: None,
            handshake_changed: false,
            cfg,
        }
    }

    /// The ids of the client's requests not yet answered, for the guard
    /// around [`Dispatcher::run`].
    pub fn pending(&self) -> Pending {
        self.requests.pending()
    }

    /// Sends the `--stats-file` document to `out` every few seconds while
    /// counters change, and at exit.
    pub fn with_stats_output(mut self, out: Sender<String>) -> Dispatcher {
        self.reporting.stats_to(out);
        self
    }

    /// Seeds the randomness of backoff jitter (tests replay a schedule).
    #[cfg(test)]
    pub fn with_seed(mut self, seed: u64) -> Dispatcher {
        self.link.reseed(seed);
        self.calls = self.calls.with_seed(seed);
        self
    }

    /// Keyed calls claim their records in the store behind `store` (the
    /// `store` thread's requests) first; its state is the calls' own.
    pub fn with_store(mut self, store: KeyStore) -> Dispatcher {
        self.calls.use_store(store);
        self
    }

    /// Started by `check`: a server that cannot start is named at its
    /// first start, not its third (`fail_fast_at_start` aside).
    pub fn with_check_mode(mut self, on: bool) -> Dispatcher {
        self.link.set_check_mode(on);
        self
    }

    /// Takes `event.size()` off `backlog` for every event it receives.
    pub fn with_inbox_backlog(mut self, backlog: Arc<Backlog>) -> Dispatcher {
        self.inbox_backlog = Some(backlog);
        self
    }

    /// Starts the server and handles events until the session ends.
    pub fn run(&mut self, inbox: Receiver<Event>) -> Outcome {
        let started = Instant::now();
        self.reporting.started(started);
        self.start_server(started);
        self.status_check();
        let mut clock = clock::BatchClock::default();
        loop {
            if let Some(outcome) = self.finished() {
                self.answer_remaining();
                info!("{}", self.calls.stats().summary());
                self.on_stats_flush_due();
                self.otel_finish(Instant::now());
                return outcome;
            }
            // An event waiting already is handled at the batch's reading
            // of the clock (`clock.rs`); one that came after a wait, at a
            // reading taken then; an answer, at a reading of its own.
            let (event, fresh) = match inbox.try_recv() {
                Ok(e) => (Some(e), None),
                Err(_) => match spin_for_event(&inbox) {
                    (Some(e), at) => (Some(e), Some(at)),
                    (None, _) => {
                        self.release_memory_if_due();
                        let event = match self.timers.next_at() {
                            Some(at) => match inbox.recv_deadline(at) {
                                Ok(e) => Some(e),
                                Err(RecvTimeoutError::Timeout) => None,
                                Err(RecvTimeoutError::Disconnected) => {
                                    return Outcome::ClientClosed
                                }
                            },
                            None => match inbox.recv() {
                                Ok(e) => Some(e),
                                Err(_) => return Outcome::ClientClosed,
                            },
                        };
                        (event, Some(Instant::now()))
                    }
                },
            };
            self.eager = inbox.is_empty();
            match event {
                Some(e) => {
                    let size = e.size();
                    self.handled_bytes += size;
                    if let Some(backlog) = &self.inbox_backlog {
                        backlog.remove(size);
                    }
                    let arrived = match fresh {
                        Some(at) => clock::Arrived::AfterWait(at),
                        None if e.is_answer() => clock::Arrived::Answer,
                        None => clock::Arrived::Queued,
                    };
                    let now = clock.next(arrived, size, Instant::now);
                    self.handle_event(e, now)
                }
                None => {
                    clock.end();
                    self.fire_timers(fresh.unwrap_or_else(Instant::now))
                }
            }
        }
    }

    /// The session ends: requests still waiting (a call in backoff, say)
    /// get their one answer before the proxy exits.
    fn answer_remaining(&mut self) {
        for id in self.requests.open_ids() {
            self.answer_proxy_error(&id, Reason::ServerUnavailable, "mcp-retry is shutting down");
        }
    }

    fn finished(&self) -> Option<Outcome> {
        match self.phase {
            Phase::Stopping { signal } if !self.link.is_up() => Some(match signal {
                Some(s) => Outcome::Signalled(s),
                None if self.handshake_changed => Outcome::HandshakeChanged,
                None => Outcome::ClientClosed,
            }),
            _ => None,
        }
    }

    pub fn handle_event(&mut self, event: Event, now: Instant) {
        self.now = now;
        match event {
            Event::Client(inbound) => self.on_client(inbound.parsed, inbound.read, None, now),
            Event::ClientTooLong { id, len } => self.on_client_too_long(id, len),
            Event::ClientEof => {
                debug!("the client closed its input; stopping the server");
                self.begin_shutdown(None, now);
            }
            Event::ClientGone => {
                debug!("the client stopped reading; stopping the server");
                self.begin_shutdown(None, now);
            }
            Event::Server { generation, event } => {
                if generation == self.link.generation() {
                    self.on_link_event(event, now);
                }
            }
            Event::Signal(sig) => {
                info!("received signal {sig}; stopping the server");
                self.begin_shutdown(Some(sig), now);
            }
            Event::Store(told) => {
                if let Some(id) = self.with_calls(now, |c, ctx, out| c.store_told(told, ctx, out)) {
                    self.start_attempt(id, now);
                }
            }
        }
        self.status_check();
        self.otel_schedule();
    }

    fn fire_timers(&mut self, now: Instant) {
        self.now = now;
        while let Some(timer) = self.timers.pop_due(now) {
            self.on_timer(timer, now);
        }
        self.status_check();
        self.otel_schedule();
    }

    fn set_timer(&mut self, at: Instant, timer: Timer) {
        if self.timers.due_for_pruning() {
            self.prune_timers();
        }
        self.timers.set(at, timer);
    }

    /// Drops the timeouts of attempts that are over (answered, abandoned, or
    /// their call is gone): they could only fire as no-ops, since downstream
    /// ids are never reused. Without this a busy session holds one heap entry
    /// per call for `call_timeout` (600 000 entries at 10 000 calls/s), and an
    /// idle proxy wakes for each a minute after a burst. Runs when the heap has
    /// doubled since the last pruning, so it costs O(1) per timer set.
    fn prune_timers(&mut self) {
        let calls = &self.calls;
        self.timers.prune(|t| match *t {
            Timer::Call(CallTimer::AttemptTimeout { call, down }) => {
                calls.attempt_is_live(call, down)
            }
            _ => true,
        });
    }

    fn on_timer(&mut self, timer: Timer, now: Instant) {
        match timer {
            Timer::ShutdownGiveUp => {
                if self.link.is_up() {
                    warn!("the server was not reported gone after its stop sequence; leaving it");
                    let gone = Gone {
                        how: "did not stop in time".into(),
                        may_have_received: true,
                        heal: Heal::Wait,
                    };
                    self.on_link_gone(gone, now);
                }
            }
            Timer::StatsFlush => self.on_stats_flush_due(),
            Timer::OtelFlush => self.on_otel_flush_due(now),
            Timer::StatusPublish => self.on_status_due(now),
            Timer::Restart { seq } => self.on_probe_due(seq, now),
            Timer::ReplayTimeout { generation } => self.link.on_replay_timeout(generation),
            Timer::QueueExpired { seq } => self.on_queue_expired(seq, now),
            Timer::FirstInitialize { down } => self.on_first_initialize_due(down, now),
            Timer::RampStall => self.on_ramp_stall(now),
            Timer::InstantGrace => self.instant_grace_over(),
            Timer::LearnTools => {
                let client_listing = self.requests.client_listing_tools();
                if self.link.has_tools()
                    && self.calls.tools_unknown()
                    && !client_listing
                    && self.link.ready()
                {
                    self.with_calls(now, |c, ctx, out| c.fetch_tools(ctx.link, out));
                }
            }
            Timer::OverlongLine { generation, line } => {
                self.link.on_overlong_line(generation, line)
            }
            Timer::ToolsListTimeout { down } => self.on_tools_list_timeout(down, now),
            Timer::ListingTimeout { down } => self.on_listing_timeout(down),
            Timer::Call(t) => {
                if let Some(due) = self.with_calls(now, |c, ctx, out| c.on_timer(t, ctx, out)) {
                    self.start_attempt(due, now);
                }
            }
        }
    }

    /// Counters changed: schedule a stats flush if a file is wanted.
    fn stats_dirty(&mut self) {
        for (at, timer) in self
            .reporting
            .counters_changed(self.now)
            .into_iter()
            .flatten()
        {
            self.set_timer(at, timer);
        }
    }

    fn on_stats_flush_due(&mut self) {
        self.reporting
            .flush_stats(self.calls.stats(), &self.cfg.name);
    }

    fn shutdown_step(&self) -> Duration {
        match self.phase {
            // A signalled proxy must be gone within about 2 s.
            Phase::Stopping { signal: Some(_) } => SHUTDOWN_STEP / 2,
            _ => SHUTDOWN_STEP,
        }
    }

    fn begin_shutdown(&mut self, signal: Option<i32>, now: Instant) {
        if let Phase::Stopping { .. } = self.phase {
            if signal.is_some() {
                // A second signal: stop waiting.
                self.link.kill();
            }
            return;
        }
        self.phase = Phase::Stopping { signal };
        // Nothing queued will be sent any more.
        for (_, _, item) in self.link.drain_queue() {
            match item {
                Queued::Request { client_id, .. } => self.answer_proxy_error(
                    &client_id,
                    Reason::ServerUnavailable,
                    "mcp-retry is shutting down",
                ),
                Queued::Call(id) => {
                    let e = CallError::proxy(
                        Reason::ServerUnavailable,
                        "mcp-retry is shutting down",
                        &[],
                    );
                    self.with_calls(now, |c, ctx, out| c.fail(id, &e, ctx, out));
                }
                Queued::Notification(_) => {}
            }
        }
        let step = self.shutdown_step();
        if self.link.shutdown(step) {
            self.set_timer(now + 2 * step + SHUTDOWN_BACKSTOP, Timer::ShutdownGiveUp);
        }
    }

    // ----- client → server ---------------------------------------------

    /// `read`: what the reader thread read of a request (`None`: read here).
    fn on_client(&mut self, parsed: Parsed, read: Option<Read>, batch: Option<u64>, now: Instant) {
        match parsed {
            Parsed::Message(m) => match m.kind() {
                Kind::Request => {
                    let read = read.unwrap_or_else(|| {
                        let reader = Reader {
                            store_scope: self.calls.store_scope(),
                            traces: self.reporting.tracing(),
                        };
                        reader.message(&m)
                    });
                    self.on_client_request(m, read, batch, now)
                }
                Kind::Notification => self.on_client_notification(m, now),
                Kind::Response => self.on_client_response(m, now),
            },
            Parsed::Invalid(inv) => self.on_client_invalid(inv, batch),
            Parsed::Batch(items) => self.on_client_batch(items, now),
        }
    }

    fn on_client_invalid(&mut self, inv: Invalid, batch: Option<u64>) {
        if inv.is_response {
            warn!(
                "dropped an invalid response from the client: {}",
                inv.message
            );
            return;
        }
        warn!(
            "answered an invalid message from the client: {}",
            inv.message
        );
        let line = jsonrpc::error_line(inv.id.as_deref(), inv.code, &inv.message, None);
        match batch {
            Some(b) => self.batch_answer(b, line),
            None => self.send_client(line),
        }
    }

    fn on_client_too_long(&mut self, id: Option<String>, len: usize) {
        let max = self.cfg.max_message_bytes;
        let message = format!(
            "message of {len} bytes exceeds max_message_bytes ({max}) and was not forwarded"
        );
        match id {
            Some(id) if !self.requests.is_open(&id) => {
                warn!("answered a client request: {message}");
                self.send_client(jsonrpc::error_line(
                    Some(&id),
                    jsonrpc::INVALID_REQUEST,
                    &message,
                    None,
                ));
            }
            _ => warn!("dropped a client message: {message}"),
        }
    }

    fn on_client_batch(&mut self, items: Vec<Parsed>, now: Instant) {
        if !self.link.batches_allowed() {
            warn!("answered a JSON-RPC batch from the client: batches are not part of the negotiated protocol");
            self.send_client(jsonrpc::error_line(
                None,
                jsonrpc::INVALID_REQUEST,
                "invalid request: JSON-RPC batches are only allowed with protocol version 2025-03-26",
                None,
            ));
            return;
        }
        if items.is_empty() {
            self.send_client(jsonrpc::error_line(
                None,
                jsonrpc::INVALID_REQUEST,
                "invalid request: empty batch",
                None,
            ));
            return;
        }
        let expected = items
            .iter()
            .filter(|p| match p {
                Parsed::Message(m) => m.kind() == Kind::Request,
                Parsed::Invalid(i) => !i.is_response,
                Parsed::Batch(_) => true,
            })
            .count();
        if expected == 0 {
            for item in items {
                self.on_client(item, None, None, now);
            }
            return;
        }
        let id = self.requests.open_batch(expected);
        for item in items {
            match item {
                Parsed::Batch(_) => self.batch_answer(
                    id,
                    jsonrpc::error_line(
                        None,
                        jsonrpc::INVALID_REQUEST,
                        "invalid request: nested batch",
                        None,
                    ),
                ),
                other => self.on_client(other, None, Some(id), now),
            }
        }
    }

    fn batch_answer(&mut self, batch: u64, line: Vec<u8>) {
        if self.requests.collecting(batch) {
            self.batch_entry(batch, Some(line));
        } else {
            self.send_client(line);
        }
    }

    /// Counts one request of a batch as done (with its answer, if any) and
    /// sends the array once all are.
    fn batch_entry(&mut self, batch: u64, line: Option<Vec<u8>>) {
        if let Some(array) = self.requests.batch_entry(batch, line) {
            self.send_client(array);
        }
    }

    fn on_client_request(&mut self, m: Message, read: Read, batch: Option<u64>, now: Instant) {
        let client_id: ClientId = m.id().expect("requests have ids").into();
        if self.requests.is_open(&client_id) {
            let message =
                format!("invalid request: a request with id {client_id} is already in flight");
            return self.refuse_invalid(&client_id, &message, batch);
        }
        let method = m.method().unwrap_or_default();
        if let Some(message) = read.refused {
            return self.refuse_invalid(&client_id, &message, batch);
        }
        self.link
            .learn_era(&method, read.modern.as_ref().map(|m| m.envelope.as_str()));
        let trace = self
            .reporting
            .tracer()
            .and_then(|t| t.request_started(&method, read.client_context, now));
        self.requests
            .register(client_id.clone(), batch, trace, read.modern);
        if self.requests.open_count() > self.cfg.max_in_flight {
            let message = format!(
                "too many requests in flight (max_in_flight is {}); try again later",
                self.cfg.max_in_flight
            );
            warn!("{message}");
            return self.answer_proxy_error(&client_id, Reason::Overloaded, &message);
        }
        if method == "initialize" {
            self.link.handshake_asked();
        }
        if self.instant_request(&client_id, &method, &m, batch) {
            return;
        }
        let kind = match method.as_ref() {
            "initialize" => {
                self.link.initialize_sent(m.params());
                Method::Initialize
            }
            "tools/list" => Method::ToolsList {
                first: m
                    .params()
                    .and_then(RawObject::parse)
                    .is_none_or(|p| p.get("cursor").is_none()),
            },
            "tools/call" if self.phase == Phase::Running => {
                #[cfg(feature = "fault-inject")]
                crate::guard::fault::dispatcher_call(read.call.as_ref().map_or("", |c| &c.name));
                return self.on_tools_call(m, read.call, client_id, now);
            }
            "resources/list"
            | "resources/read"
            | "resources/templates/list"
            | "prompts/list"
            | "prompts/get"
            | "completion/complete"
            | "ping" => Method::ReadOnly,
            "logging/setLevel" => {
                self.link.set_log_level(m.params());
                Method::Other
            }
            "resources/subscribe" | "resources/unsubscribe" => {
                self.link.track_subscription(&method, m.params());
                Method::Other
            }
            _ => Method::Other,
        };
        self.relay_request(m, client_id, kind, now);
    }

    /// Answers a client request that is not forwarded with -32600 (it was
    /// never registered in `Requests`).
    fn refuse_invalid(&mut self, client_id: &str, message: &str, batch: Option<u64>) {
        warn!("answered a client request {client_id}: {message}");
        let line = jsonrpc::error_line(Some(client_id), jsonrpc::INVALID_REQUEST, message, None);
        match batch {
            Some(b) => self.batch_answer(b, line),
            None => self.send_client(line),
        }
    }

    /// Sends a client request to the server as is (under a fresh id),
    /// queues it while the server restarts, or answers it when the server
    /// cannot be reached.
    fn relay_request(&mut self, m: Message, client_id: ClientId, kind: Method, now: Instant) {
        if matches!(self.phase, Phase::Stopping { .. }) {
            return self.answer_proxy_error(
                &client_id,
                Reason::ServerUnavailable,
                "mcp-retry is shutting down",
            );
        }
        let route = self.route(now);
        let is_ping = m.method().as_deref() == Some("ping");
        if !matches!(route, Route::Send) && is_ping {
            // A server that is down or starting cannot be pinged; the proxy,
            // which is alive, answers.
            let line = jsonrpc::response_line(&client_id, "{}");
            return self.answer(&client_id, line);
        }
        match route {
            Route::Send => {}
            Route::Queue => return self.requeue_request(m, client_id, kind, now),
            Route::Refuse(reason, message) => {
                return self.answer_proxy_error(&client_id, reason, &message)
            }
        }
        // The request is kept as the client sent it: one never sent goes
        // again as it is, without its line being read back, and so does a
        // read after a restart (`Method::resent_after_loss`).
        let down = self.requests.next_attempt_id();
        let line = m.line_with_id(&down.to_string());
        let out = Outgoing::request(down, &m.method().unwrap_or_default(), line)
            .in_era(self.requests.modern(&client_id));
        let issued = self.requests.issue(Inflight::Client {
            client_id: client_id.clone(),
            method: kind,
            kept: m,
            sent: out.bytes.len(),
        });
        debug_assert_eq!(issued, down, "an id was issued while the line was made");
        let waited = self.requests.sent(&client_id, down);
        if kind == Method::Initialize && !self.link.is_handshaken() {
            // Before the first handshake a server that never answers is
            // waited for as long as one that is down.
            let (_, until) = waited.unwrap_or((now, self.link.wait_until(now)));
            self.set_timer(until.max(now), Timer::FirstInitialize { down });
        }
        if let SendResult::Overloaded(message) = self.send_server_request(out) {
            self.requests.forget(down);
            if is_ping {
                // The proxy is alive, and says so, as while the server is
                // down.
                let line = jsonrpc::response_line(&client_id, "{}");
                return self.answer(&client_id, line);
            }
            warn!("answered client request {client_id}: {message}");
            self.answer_proxy_error(&client_id, Reason::Overloaded, &message);
        }
    }

    fn on_client_notification(&mut self, m: Message, now: Instant) {
        let method = m.method().unwrap_or_default().into_owned();
        if method == "notifications/cancelled" {
            return self.on_client_cancel(&m, now);
        }
        if method == "notifications/initialized" {
            self.link.client_initialized();
            // Learn the tools' annotations soon, unless the client lists
            // the tools itself right away (as most do).
            self.set_timer(now + TOOLS_AFTER_HANDSHAKE, Timer::LearnTools);
        }
        match self.route(now) {
            Route::Send => {
                self.send_server(Outgoing::notification(&method, m.into_line()));
                if method == "notifications/initialized" {
                    self.instant_read_lists(now);
                }
            }
            // The replay of the handshake to the server that is starting
            // sends it.
            Route::Queue if method == "notifications/initialized" && self.link.has_handshake() => {}
            Route::Queue => {
                let expires = self.link.wait_until(now);
                if self
                    .enqueue(
                        Queued::Notification(Outgoing::notification(&method, m.into_line())),
                        now,
                        expires,
                    )
                    .is_none()
                {
                    debug!("dropped a client notification ({method}): too much is queued");
                }
            }
            Route::Refuse(..) => {
                debug!("dropped a client notification ({method}): the server is not running")
            }
        }
    }

    fn on_client_cancel(&mut self, m: &Message, now: Instant) {
        let Some((request_id, params)) = m
            .params()
            .and_then(RawObject::parse)
            .and_then(|p| p.get("requestId").map(|r| (r.get().to_owned(), p)))
        else {
            return debug!("dropped a cancel without a requestId");
        };
        if let Some(name) = params.duplicate() {
            // Which request it cancels depends on who reads it: none is
            // safer (an answer the client no longer wants) than the wrong
            // one (a request that never gets an answer).
            return warn!("dropped a cancel whose params repeat the member {name:?}");
        }
        let Some(req) = self.requests.cancel(&request_id) else {
            return debug!("dropped a cancel for unknown or finished request {request_id}");
        };
        if let Some(b) = req.batch {
            // A cancelled request gets no entry in its batch's answer.
            self.batch_entry(b, None);
        }
        if let Some(seq) = req.queued {
            // It never reached the server: nothing to forward.
            self.unqueue(seq);
            return;
        }
        if let Some(call) = req.call {
            let reason = params
                .string("reason")
                .unwrap_or_else(|| "cancelled by the client".into());
            return self.with_calls(now, |c, ctx, out| {
                c.cancel_member(call, &request_id, &reason, ctx, out)
            });
        }
        if let Some(down) = req.downstream {
            self.requests.forget(down);
            if self.withdraw(down) {
                return debug!(
                    "withdrew downstream request {down} (the client's {request_id}) before the server read it"
                );
            }
            let params = params.to_json_replacing("requestId", &down.to_string());
            let line = m.line_with_params(&params);
            self.send_server(Outgoing::cancel(down, line));
        }
    }

    fn on_client_response(&mut self, m: Message, now: Instant) {
        let id = m.id().unwrap_or("null");
        let Some(ours) = id.parse::<u64>().ok() else {
            return warn!("dropped a response from the client with unknown id {id}");
        };
        let Some(req) = self.close_server_request(ours, now) else {
            return warn!("dropped a response from the client with unknown id {id}");
        };
        if req.generation != self.link.generation() {
            return debug!("dropped the client's answer to a request of a server that has exited");
        }
        let line = m.into_line_with_id(&req.server_id);
        self.send_server(Outgoing::response(line));
    }

    // ----- server → client ---------------------------------------------

    fn on_server_parsed(&mut self, parsed: Parsed, now: Instant) {
        match parsed {
            Parsed::Message(m) => match m.kind() {
                Kind::Response => self.on_server_response(m, now),
                Kind::Request => self.on_server_request(m, now),
                Kind::Notification => self.on_server_notification(m, now),
            },
            Parsed::Invalid(inv) => {
                warn!(
                    "the server sent an invalid message; skipped ({})",
                    inv.message
                );
                if let (true, Some(id)) = (inv.is_response, &inv.id) {
                    let message = format!(
                        "the MCP server's answer is not a valid JSON-RPC response ({}) and was dropped",
                        inv.message.trim_start_matches("invalid request: ")
                    );
                    self.on_dropped_response(id, Reason::InvalidResponse, &message, now);
                }
            }
            Parsed::Batch(items) => {
                for item in items {
                    self.on_server_parsed(item, now);
                }
            }
        }
    }

    fn on_server_response(&mut self, m: Message, now: Instant) {
        let id = m.id().unwrap_or("null");
        let owner = match self.requests.resolve(id) {
            (_, Resolved::Never) => {
                return warn!(
                    "dropped a response from the server with an id the proxy never issued: {id}"
                )
            }
            (down, owner) => {
                self.requests.written(down);
                (down, owner)
            }
        };
        match owner {
            (down, Resolved::Ours(Inflight::Client {
                client_id, method, ..
            })) => {
                self.served(now);
                match method {
                    Method::Initialize => {
                        let first = Timer::FirstInitialize { down };
                        self.timers.cancel(&first);
                        self.observe_initialize(&m, now)
                    }
                    Method::ToolsList { first } => {
                        if let Some(r) = m.result() {
                            self.with_calls(now, |c, ctx, out| {
                                c.learn_tools(r, false, first, ctx, out)
                            });
                        }
                        self.instant_page(List::Tools, m.result(), first, Source::Client, now);
                    }
                    Method::ReadOnly | Method::Other => {}
                }
                let line = m.into_line_with_id(&client_id);
                self.answer(&client_id, line);
            }
            (_, Resolved::Ours(Inflight::ToolsList { first })) => {
                self.with_calls(now, |c, ctx, out| match m.result() {
                    Some(r) => c.learn_tools(r, true, false, ctx, out),
                    None => c.tools_learned(false, ctx, out),
                });
                self.instant_page(List::Tools, m.result(), first, Source::Proxy, now);
            }
            (_, Resolved::Ours(Inflight::Listing { list, first })) => {
                self.instant_page(list, m.result(), first, Source::Proxy, now)
            }
            (_, Resolved::Ours(Inflight::Replay(step))) => self.on_replay_response(step, &m, now),
            // Late answers of abandoned attempts still route to their call.
            (down, _) => match self.with_calls(now, |c, ctx, out| c.on_answer(down, m, ctx, out)) {
                Owner::Served => self.served(now),
                Owner::Known => {}
                Owner::Unknown => debug!(
                    "dropped the server's answer to request {down}, which was cancelled or abandoned"
                ),
            },
        }
    }

    /// The current incarnation answered a client request or a call attempt:
    /// it did useful work.
    fn served(&mut self, now: Instant) {
        self.link.served();
        self.ramp_answered(now);
    }

    /// The server answered downstream request `id` (raw), but the answer
    /// cannot be relayed (too large, invalid). The request still gets its
    /// one answer, now: an error saying why. The server did answer, so this
    /// is final; a call attempt is not retried (its tool ran).
    fn on_dropped_response(&mut self, id: &str, reason: Reason, message: &str, now: Instant) {
        let (down, owner) = self.requests.resolve(id);
        let owner = match owner {
            Resolved::Never => {
                return debug!("the dropped answer had an id the proxy never issued: {id}")
            }
            Resolved::Ours(f) => Some(f),
            Resolved::Calls => None,
        };
        match owner {
            Some(Inflight::Client { client_id, .. }) => {
                self.served(now);
                warn!("answered client request {client_id} with an error: {message}");
                self.answer_proxy_error(&client_id, reason, message);
            }
            Some(Inflight::ToolsList { .. }) => {
                self.with_calls(now, |c, ctx, out| c.tools_learned(false, ctx, out));
            }
            Some(Inflight::Listing { list, .. }) => self.instant_list_failed(list),
            Some(Inflight::Replay(step)) => {
                if step == ReplayStep::Initialize {
                    warn!("the restarted server is not usable: {message}; stopping it");
                    self.link.kill();
                }
            }
            None => {
                let owner = self.with_calls(now, |c, ctx, out| {
                    c.on_unusable_answer(down, reason, message, ctx, out)
                });
                match owner {
                    Owner::Served => self.served(now),
                    Owner::Known => {}
                    Owner::Unknown => debug!(
                        "dropped an unusable answer to request {down}, which nobody waits for"
                    ),
                }
            }
        }
    }

    /// The server accepted the client's `initialize`: keep what a restart
    /// must replay.
    fn observe_initialize(&mut self, m: &Message, now: Instant) {
        let Some(raw) = m.result().filter(|r| RawObject::parse(r).is_some()) else {
            return;
        };
        self.instant_accepted(raw);
        self.reporting.ready(now);
        self.link.accepted(raw);
        // A client that did not wait for this answer said `initialized`
        // already.
        self.instant_read_lists(now);
    }

    fn on_server_request(&mut self, m: Message, now: Instant) {
        // A person may be answering these: attempts do not time out
        // meanwhile. `ping` and `roots/list` are answered by the client
        // itself and pause nothing.
        let pauses = matches!(
            m.method().as_deref(),
            Some("sampling/createMessage" | "elicitation/create")
        );
        let server_id = m.id().expect("requests have ids");
        let ours =
            self.requests
                .open_server_request(self.link.generation(), server_id, pauses, now);
        self.send_client(m.into_line_with_id(&ours.to_string()));
    }

    /// Forgets a request of the server's (answered, withdrawn, or its
    /// server gone); the last one that paused attempt clocks resumes them.
    fn close_server_request(&mut self, ours: u64, now: Instant) -> Option<ServerRequest> {
        let (req, resumed) = self.requests.close_server_request(ours)?;
        if let Some(since) = resumed {
            self.with_calls(now, |c, ctx, out| c.resume_clocks(since, ctx, out));
        }
        Some(req)
    }

    fn on_server_notification(&mut self, m: Message, now: Instant) {
        let method = m.method().unwrap_or_default();
        if method == "notifications/progress"
            && self.with_calls(now, |c, ctx, out| c.on_progress(&m, ctx, out))
        {
            return;
        }
        if method == "notifications/tools/list_changed" {
            self.calls.tools_changed();
        }
        if method == "notifications/cancelled" {
            // The server withdraws one of its own requests to the client.
            let Some(params) = m.params().and_then(RawObject::parse) else {
                return;
            };
            let Some(server_id) = params.get("requestId").map(|r| r.get().to_owned()) else {
                return;
            };
            let ours = self
                .requests
                .find_server_request(self.link.generation(), &server_id);
            let Some(ours) = ours else {
                return debug!("dropped the server's cancel for unknown request {server_id}");
            };
            self.close_server_request(ours, now);
            let params = params.to_json_replacing("requestId", &ours.to_string());
            return self.send_client(m.line_with_params(&params));
        }
        self.send_client(m.into_line());
    }

    // ----- answering -----------------------------------------------------

    /// Delivers the answer to a client request and forgets the request.
    pub(super) fn answer(&mut self, client_id: &str, line: Vec<u8>) {
        self.answer_knowing(client_id, line, None)
    }

    /// [`Dispatcher::answer`] with the proxy's error for `ours`, a reason
    /// the tracer is told rather than reading it back from the line.
    fn answer_knowing(&mut self, client_id: &str, line: Vec<u8>, ours: Option<Reason>) {
        let request = self.requests.complete(client_id);
        if let (Some(t), Some(r)) = (
            self.reporting.tracer(),
            request.as_ref().and_then(|r| r.trace.as_ref()),
        ) {
            let ours = ours.map(|reason| (reason.as_str(), PROXY_ERROR));
            t.request_answered(r, client_id, &line, ours, self.now);
        }
        match request {
            Some(ClientRequest { batch: Some(b), .. }) => self.batch_answer(b, line),
            Some(_) => self.send_client(line),
            None => debug!("dropped an answer for request {client_id}, which the client cancelled"),
        }
    }

    fn answer_proxy_error(&mut self, client_id: &str, reason: Reason, message: &str) {
        let error = proxy_error(reason, message, &[]);
        let line = jsonrpc::error_response_line(client_id, &error);
        self.answer_knowing(client_id, line, Some(reason));
    }

    fn send_client(&mut self, line: Vec<u8>) {
        // A failed send means the writer thread ended; `ClientGone` follows.
        if self.eager {
            self.to_client.send_now(line);
        } else {
            self.to_client.send(line);
        }
    }
}

// ----- reporting -------------------------------------------------------
//
// Publishing for `mcp-retry status`: the file is out of date when a counter
// moves (`stats_dirty`) or when the `Headline` (link, breaker, restarts,
// calls in flight, the handshake) differs from the last one seen; both only
// happen while handling an event or a timer, so an idle proxy never wakes
// up to publish. OpenTelemetry: the metrics flush is scheduled after a
// change only, and what is open ends at exit. `Reporting` holds the outputs
// and builds no JSON.

impl Dispatcher {
    /// Publishes the session's state through `out` (see `status.rs`).
    pub fn with_status_output(mut self, out: Sender<Snapshot>) -> Dispatcher {
        self.reporting.status_to(out);
        self
    }

    /// The link, breaker and load as `status` shows them.
    pub(super) fn headline(&self) -> Headline {
        let (link, link_until) = self.link.shown();
        let (breaker, breaker_until) = match self.calls.breaker_state() {
            BreakerState::Closed => (BreakerShown::Closed, None),
            BreakerState::Open { until } => (BreakerShown::Open, Some(*until)),
            BreakerState::HalfOpen { .. } => (BreakerShown::HalfOpen, None),
        };
        Headline {
            link,
            link_until,
            breaker,
            breaker_until,
            restarts: self.link.generation().saturating_sub(1),
            in_flight: self.calls.len() as u64,
            from_cache: self.instant.as_ref().is_some_and(|i| i.began_from_cache()),
            ready_at: self.reporting.ready_at(),
        }
    }

    /// After an event or timer: schedules a publish if the headline moved.
    pub(super) fn status_check(&mut self) {
        if !self.reporting.publishing() {
            return;
        }
        let headline = self.headline();
        if let Some((at, timer)) = self.reporting.status_check(headline, self.now) {
            self.set_timer(at, timer);
        }
    }

    /// Something published changed: write it within a second (at most one
    /// write a second).
    pub(super) fn status_dirty(&mut self) {
        if let Some((at, timer)) = self.reporting.status_dirty(self.now) {
            self.set_timer(at, timer);
        }
    }

    /// `Timer::StatusPublish`: hands the snapshot to the writer.
    pub(super) fn on_status_due(&mut self, now: Instant) {
        if !self.reporting.publishing() {
            return;
        }
        let headline = self.headline();
        let note = || self.instant.as_ref().and_then(|i| i.note());
        let message = self.link.trouble().or_else(note);
        self.reporting
            .publish(headline, message, self.calls.stats(), now);
    }
}

impl Dispatcher {
    /// Exports spans and metrics through `handle`.
    pub fn with_otel(mut self, handle: Handle) -> Dispatcher {
        let tracer = Tracer::new(&self.cfg.name, handle, self.now);
        self.reporting.trace_with(tracer);
        self
    }

    /// Runs `f` on the tracer when export is on.
    pub(super) fn traced<R>(&mut self, f: impl FnOnce(&mut Tracer) -> R) -> Option<R> {
        self.reporting.tracer().map(f)
    }

    /// Call `call` ends with an error, counted under `reason`.
    pub(super) fn otel_schedule(&mut self) {
        if let Some((at, timer)) = self.reporting.otel_schedule(self.now) {
            self.set_timer(at, timer);
        }
    }

    pub(super) fn on_otel_flush_due(&mut self, now: Instant) {
        self.reporting.flush_metrics(self.calls.stats(), now);
    }

    /// The session ends: open spans and the last counters go out.
    pub(super) fn otel_finish(&mut self, now: Instant) {
        self.reporting.finish(self.calls.stats(), now);
    }
}

/// How long the dispatcher keeps looking for the next event before it
/// sleeps. An answer usually follows a request within tens of microseconds;
/// catching it awake saves a thread wake-up on the hot path. An idle
/// dispatcher spins once, for this long, after its last event.
const SPIN: Duration = Duration::from_micros(15);

impl Dispatcher {
    /// About to sleep after `RELEASE_AFTER` bytes of messages: gives the
    /// memory they left free back to the system.
    fn release_memory_if_due(&mut self) {
        if self.handled_bytes >= stdio::RELEASE_AFTER {
            self.handled_bytes = 0;
            stdio::release_free_memory();
        }
    }
}

/// The next event if one arrives within [`SPIN`], and the clock's last
/// reading before it came (or when the spin ended).
fn spin_for_event(inbox: &Receiver<Event>) -> (Option<Event>, Instant) {
    let start = Instant::now();
    let mut at = start;
    loop {
        if let Ok(e) = inbox.try_recv() {
            return (Some(e), at);
        }
        if at.duration_since(start) >= SPIN {
            return (None, at);
        }
        std::hint::spin_loop();
        at = Instant::now();
    }
}
