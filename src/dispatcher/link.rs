//! The server link: starting the server, learning that it is gone (the
//! transport says so once, after everything the server sent), probing it
//! while it is down (a probe is a start, or a reconnection, and the replay
//! of the client's handshake; `policy::recovery` decides when), and
//! queueing traffic while it is not ready: a request that arrives during
//! an outage waits for the server at most `wait_for_server` (never past a
//! call's deadline), and goes out as soon as a probe succeeds.
//!
//! [`Link`] owns the link's state ([`Connection`], [`Session`]: what must be
//! replayed, the queue of what waits for the server, the recovery): its
//! methods take `now` and push [`Effect`]s (timers, requests the server
//! never acted on, an incarnation lost, the link down), which the
//! dispatcher carries out in order (`with_link`); the `impl Dispatcher`
//! below does what also needs the requests and the calls. Talks to the
//! server only through [`Downstream`]; knows nothing of processes. Probe
//! failures never reach the circuit breaker; a request that gave up
//! waiting does.
//!
//! The link's life ([`Connection`]; `generation` counts incarnations):
//!
//! ```text
//!  Down (not started) ── run: start_server ──┐
//!                                            ▼
//!     ┌──────────── start failed ◄──── connect (generation + 1)
//!     │                                      │ started
//!     │                                      ▼
//!     │        Up { ready: false } ── replay initialize, then the
//!     │              │        │        session (initialized, level,
//!     │              │        │        subscriptions): `ready`
//!     │  replay timed out /   ▼
//!     │  refused: kill   Up { ready } ── queue released (ramp),
//!     │              │        │          traffic flows
//!     │              ▼        ▼ input failed: draining
//!     │           Gone (after all the server sent) ── on_link_gone:
//!     │              calls' attempts fail, reads requeued, the rest
//!     │              answered, server requests cancelled
//!     ▼              ▼
//!  Outage ── Timer::Restart (recovery: eager while something waits,
//!     │       backing off while nothing does) ──► connect
//!     └── Heal::Fix (or a crash loop): what waits answered now;
//!         probes go on
//!  Stopping (client gone, signal): shutdown(step) ──► Gone ──► Down
//! ```

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use crate::config::{ServerConfig, Transport};
use crate::downstream::{
    Downstream, Failure as TransportFailure, Gone, Heal, Outgoing, Sent, ServerEvent, StartError,
};
use crate::jsonrpc::{self, Message, RawObject};
use crate::policy::recovery::{Recovery, CRASH_LOOP};
use crate::status::LinkState;
use crate::stdio::{Backlog, Withdraw};
use crate::{debug, info, warn};

use super::calls::Failure;
use super::queue::Queue;
use super::{
    CallError, Connector, Dispatcher, Event, Inflight, Method, Phase, Reason, Resolved, Timer,
};

/// A child that stays up this long resets the restart backoff.
const STABLE_AFTER: Duration = Duration::from_secs(60);
/// How long a request waits for the server before the session's first
/// handshake when `wait_for_server` is not set: the answer reaches a host
/// whose own start timeout is 30 s (Claude Code's `MCP_TIMEOUT`) before it
/// gives up.
const FIRST_WAIT: Duration = Duration::from_secs(20);
/// How far past its input backlog's limit a server that is not reading may
/// still be sent cancels, notifications and answers to its own requests.
const RESERVE: usize = 64 * 1024;

/// What became of a request sent to the server.
pub(super) enum SendResult {
    Sent,
    /// The server takes no more input.
    Closed,
    /// Not sent: the server is not reading its input (the message says so).
    Overloaded(String),
}

/// What the link asks the dispatcher to do, in order.
#[derive(Debug)]
pub(super) enum Effect {
    /// Set this timer.
    Timer(Instant, Timer),
    /// This request of ours was not acted on by the server, for this
    /// reason (never sent, refused).
    Unanswered(Outgoing, Failure),
    /// The incarnation is gone (`message` says how): what was in flight on
    /// it is lost.
    Lost {
        message: String,
        may_have_received: bool,
        stopping: bool,
    },
    /// The link is down: plan the next probe, and answer what waits if
    /// `heal` says waiting will not help.
    Down { message: String, heal: Heal },
}

/// The server link: what the dispatcher knows of the server and does to
/// reach it.
pub(super) struct Link {
    cfg: Arc<ServerConfig>,
    /// Opens a connection to the server.
    connect: Connector,
    /// Where the transport reports.
    events: Sender<Event>,
    state: Connection,
    /// Counts incarnations (the first start is 1).
    generation: u64,
    /// What a restarted server must be told.
    pub(super) session: Session,
    /// Traffic waiting for a (re)starting server, and its ramp.
    queue: Queue,
    /// The link's health while it is down, and when to probe it.
    recovery: Recovery,
    /// The newest probe timer (older ones are void).
    restart_seq: u64,
    /// Started by `check` (`MCP_RETRY_CHECK=1`): the first start that ends
    /// before the handshake answers what waits.
    check_mode: bool,
    /// For the restart backoff's jitter.
    rng: fastrand::Rng,
}

impl Link {
    pub(super) fn new(cfg: Arc<ServerConfig>, connect: Connector, events: Sender<Event>) -> Link {
        Link {
            cfg,
            connect,
            events,
            state: Connection::Down {
                reason: Reason::ServerUnavailable,
                message: "the server has not been started".into(),
            },
            generation: 0,
            session: Session::default(),
            queue: Queue::new(),
            recovery: Recovery::new(),
            restart_seq: 0,
            check_mode: false,
            rng: fastrand::Rng::new(),
        }
    }

    /// Whether the server is a remote one (words: "reconnecting to", not
    /// "restarting").
    pub(super) fn remote(&self) -> bool {
        self.cfg.transport == Transport::Http
    }

    /// Where traffic for the server goes right now: to it, into the queue
    /// (it is starting, or down and may come back: the next probe is
    /// brought forward), or nowhere (the session ends, `wait_for_server`
    /// is 0, or what stopped it needs fixing).
    pub(super) fn route(&mut self, now: Instant, out: &mut Vec<Effect>) -> Route {
        match &self.state {
            Connection::Up(c) if c.ready && !c.draining => Route::Send,
            // Starting, or exited with its last answers still being read:
            // a new incarnation follows.
            Connection::Up(_) => Route::Queue,
            Connection::Outage => {
                let (message, heal) = match self.recovery.outage() {
                    Some(o) => (o.message.clone(), o.heal),
                    None => (String::new(), Heal::Wait),
                };
                if heal == Heal::Fix {
                    return Route::Refuse(Reason::ServerUnavailable, message);
                }
                if self.wait_for_server().is_zero() {
                    return Route::Refuse(
                        Reason::ServerUnavailable,
                        format!("{message}; not waiting for it (wait_for_server is 0)"),
                    );
                }
                self.hurry_probe(now, out);
                Route::Queue
            }
            Connection::Down { reason, message } => Route::Refuse(*reason, message.clone()),
        }
    }

    /// Something waits for the server: the next probe comes as soon as the
    /// probe schedule allows.
    fn hurry_probe(&mut self, now: Instant, out: &mut Vec<Effect>) {
        if let Some(at) = self.recovery.hurry(now, &mut self.rng) {
            self.restart_seq += 1;
            let seq = self.restart_seq;
            out.push(Effect::Timer(at, Timer::Restart { seq }));
        }
    }

    /// How long something that starts waiting now may wait.
    pub(super) fn wait_until(&self, now: Instant) -> Instant {
        crate::policy::instant_add(now, self.wait_for_server())
    }

    /// `wait_for_server`, or [`FIRST_WAIT`] at most before the session's
    /// first handshake when the config does not set it.
    pub(super) fn wait_for_server(&self) -> Duration {
        let wait = self.cfg.wait_for_server;
        match self.cfg.wait_for_server_set || self.recovery.is_handshaken() {
            true => wait,
            false => wait.min(FIRST_WAIT),
        }
    }

    /// Why a request cannot wait for the server: too many do.
    pub(super) fn queue_full_message(&self) -> &'static str {
        match self.remote() {
            true => "the proxy is reconnecting to the MCP server and too many requests are waiting",
            false => "the MCP server is restarting and too many requests are waiting",
        }
    }

    /// Why the server is not there, for a message.
    pub(super) fn message(&self) -> String {
        match (&self.state, self.recovery.outage()) {
            (Connection::Down { message, .. }, _) => message.clone(),
            (_, Some(o)) => o.message.clone(),
            (Connection::Up(_), None) if self.remote() => "the proxy is reconnecting to it".into(),
            _ => "it is starting".into(),
        }
    }

    /// Stops the current incarnation now, if there is one.
    pub(super) fn kill(&mut self) {
        if let Connection::Up(c) = &mut self.state {
            c.server.kill();
        }
    }

    /// A line over `max_message_bytes` was still being written after
    /// `call_timeout`: the server's output is unusable (every answer waits
    /// behind a line that is dropped anyway), so it is stopped and, like
    /// after a crash, started again.
    pub(super) fn on_overlong_line(&mut self, generation: u64, line: u64) {
        if generation != self.generation {
            return;
        }
        let secs = self.cfg.call_timeout.as_secs_f64();
        let max = self.cfg.max_message_bytes;
        if let Connection::Up(c) = &mut self.state {
            if c.in_overlong && c.overlong_lines == line {
                warn!(
                    "the server has been writing one line over max_message_bytes ({max}) for {secs:.1}s; its output is unusable; stopping it"
                );
                c.server.kill();
            }
        }
    }

    /// The replayed initialize was not answered in time.
    pub(super) fn on_replay_timeout(&mut self, generation: u64) {
        if generation != self.generation {
            return;
        }
        if let Connection::Up(c) = &mut self.state {
            if !c.ready {
                warn!("the restarted server did not answer initialize in time; stopping it");
                c.server.kill();
            }
        }
    }

    /// Sends a line that is not a request (a notification, a cancel, an
    /// answer to the server's request) or one of the proxy's own requests
    /// to the current incarnation (`eager`: written at once if it can be);
    /// false if there is none, or it takes no more input (new traffic then
    /// waits for the next one). A server that is not reading its input gets
    /// such lines within a reserve of [`RESERVE`] past its backlog's limit;
    /// past that they are dropped and logged (true: nothing for the caller
    /// to do).
    pub(super) fn send(&mut self, out: Outgoing, eager: bool) -> bool {
        let Connection::Up(c) = &mut self.state else {
            return false;
        };
        if let Some(b) = &c.backlog {
            let len = out.bytes.len();
            if b.queued().saturating_add(len) > b.limit().saturating_add(RESERVE) {
                warn!(
                    "dropped a message of {len} bytes for the server: it is not reading its input ({} bytes wait for it)",
                    b.queued()
                );
                return true;
            }
        }
        let sent = match eager {
            true => c.server.send_now(out),
            false => c.server.send(out),
        };
        if !sent {
            c.draining = true;
        }
        sent
    }

    /// Sends a client's request (or a call's attempt), `out` (a request).
    /// A server whose input backlog is over its limit (it is not reading)
    /// gets no new request: [`SendResult::Overloaded`]. A line that waits
    /// in the backlog comes with the handle that withdraws it until it is
    /// written.
    pub(super) fn send_request(
        &mut self,
        out: Outgoing,
        eager: bool,
    ) -> (SendResult, Option<Withdraw>) {
        let Connection::Up(c) = &mut self.state else {
            return (SendResult::Closed, None);
        };
        if let Some(b) = &c.backlog {
            if b.queued() > b.limit() {
                let message = format!(
                    "the MCP server is not reading its input ({} bytes wait for it); the request was not sent",
                    b.queued()
                );
                return (SendResult::Overloaded(message), None);
            }
        }
        match c.server.send_request(out, eager) {
            Sent::Closed => {
                c.draining = true;
                (SendResult::Closed, None)
            }
            Sent::Written => (SendResult::Sent, None),
            Sent::Queued(w) => (SendResult::Sent, Some(w)),
        }
    }

    /// Whether the server is expected back: it is starting, or down for a
    /// reason waiting may heal, and requests wait for it.
    pub(super) fn restarting(&self) -> bool {
        match &self.state {
            Connection::Outage => {
                !self.wait_for_server().is_zero()
                    && self.recovery.outage().is_none_or(|o| o.heal == Heal::Wait)
            }
            Connection::Up(c) => !c.ready || c.draining,
            Connection::Down { .. } => false,
        }
    }

    /// The incarnation that would answer a request sent now (the next one
    /// while restarting).
    pub(super) fn generation_to_ask(&self) -> u64 {
        match self.state {
            Connection::Up(_) => self.generation,
            _ => self.generation + 1,
        }
    }

    /// Whether the link can carry the proxy's own requests now.
    pub(super) fn ready(&self) -> bool {
        matches!(&self.state, Connection::Up(c) if c.ready && !c.draining)
    }

    /// Lines the server was never given (its input failed): the requests
    /// among them cannot have reached it (each an [`Effect::Unanswered`],
    /// as never sent). The incarnation takes no more input.
    pub(super) fn on_unsent(&mut self, lines: Vec<Outgoing>, why: &str, out: &mut Vec<Effect>) {
        if let Connection::Up(c) = &mut self.state {
            c.draining = true;
        }
        if lines.is_empty() {
            return;
        }
        let text = format!(
            "{} message(s) were not taken by the server ({why}); its connection is being closed",
            lines.len()
        );
        match self.recovery.outage() {
            // A probe's: the outage was already reported.
            Some(_) => debug!("{text}"),
            None => warn!("{text}"),
        }
        for line in lines.into_iter().filter(|l| l.request_id().is_some()) {
            out.push(Effect::Unanswered(line, Failure::NeverSent(why.to_owned())));
        }
    }

    /// Lines the server refused without acting on them (it is still up):
    /// each request among them an [`Effect::Unanswered`], refused with
    /// the server's hint.
    pub(super) fn on_refused(
        lines: Vec<Outgoing>,
        why: &str,
        retry_after: Option<Duration>,
        out: &mut Vec<Effect>,
    ) {
        for line in lines.into_iter().filter(|l| l.request_id().is_some()) {
            let failure = Failure::Refused(why.to_owned(), retry_after);
            out.push(Effect::Unanswered(line, failure));
        }
    }

    /// The current incarnation is gone (`stopping`: the session ends):
    /// the link is down, or in an outage while what waited on it is
    /// re-planned; the probe schedule and the crash-loop verdict learn of
    /// it. Effects: [`Effect::Lost`] (what was in flight), then, unless
    /// stopping, [`Effect::Down`] (the next probe).
    pub(super) fn on_gone(
        &mut self,
        gone: Gone,
        stopping: bool,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        let old = std::mem::replace(
            &mut self.state,
            Connection::Down {
                reason: Reason::ServerExited,
                message: String::new(),
            },
        );
        let Connection::Up(conn) = old else {
            self.state = old;
            return;
        };
        let how = gone.how;
        let mut message = format!("the MCP server {} {how}", conn.server.describe());
        if !stopping {
            let tail = conn.server.diagnostics();
            if let Some(line) = crate::redact::pick_line(&tail) {
                message.push_str(&format!("; its stderr said: {}", line.trim()));
            }
        }
        if stopping {
            debug!("{message}");
            self.state = Connection::Down {
                reason: Reason::ServerExited,
                message: message.clone(),
            };
        } else {
            match self.recovery.outage() {
                // A probe that failed: the outage was already reported.
                Some(_) => debug!("{message}"),
                None => crate::error!("{message}"),
            }
            // The probe schedule backs off for servers that cannot get
            // going. One that stayed up, or answered the client since it
            // started, is probed at once: otherwise a server that crashes
            // on a rare call would be down for longer after every such call.
            if conn.served || now.saturating_duration_since(conn.started) >= STABLE_AFTER {
                self.recovery.stable();
            }
            // While requests are re-planned below, they wait for the server.
            self.state = Connection::Outage;
        }
        let mut heal = gone.heal;
        if !stopping && !self.remote() {
            let same = self.recovery.start_ended(Some(&how));
            // `check` wants the truth now: one start tells it.
            let (enough, fail_fast) = match self.check_mode {
                true => (1, true),
                false => (CRASH_LOOP, self.cfg.fail_fast_at_start),
            };
            if same >= enough && fail_fast && heal == Heal::Wait {
                // It will not come up by waiting: what waits is answered
                // now, with its words; probes go on.
                if !self.check_mode {
                    message.push_str(&format!(
                        "; it ended so at its last {same} starts, before answering initialize: check its command, arguments and environment (fail_fast_at_start: false waits for it instead)"
                    ));
                }
                if same == enough {
                    crate::error!("{message}");
                }
                heal = Heal::Fix;
            }
        }
        drop(conn);
        out.push(Effect::Lost {
            message: message.clone(),
            may_have_received: gone.may_have_received,
            stopping,
        });
        if !stopping {
            out.push(Effect::Down { message, heal });
        }
    }

    /// The server is down for `message`: the next probe, sooner while
    /// something is `waiting` for it.
    pub(super) fn plan_probe(
        &mut self,
        message: String,
        heal: Heal,
        waiting: bool,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        let at = self
            .recovery
            .lost(message, heal, waiting, now, &mut self.rng);
        self.restart_seq += 1;
        let seq = self.restart_seq;
        out.push(Effect::Timer(at, Timer::Restart { seq }));
        let delay = at.saturating_duration_since(now);
        if !delay.is_zero() {
            let what = match self.remote() {
                true => format!(
                    "reconnecting to {}",
                    crate::http::display_url(&self.cfg.url)
                ),
                false => "restarting the server".to_owned(),
            };
            debug!("{what} in {:.1}s", delay.as_secs_f64());
        }
    }

    /// What the session set that a new incarnation must be told after the
    /// handshake (`logging/setLevel`, `resources/subscribe`), but for what
    /// the client's own requests still queued set anyway (released after
    /// the replay): a request sent while the server started would
    /// otherwise reach it twice.
    pub(super) fn session_replays(&self) -> Vec<(&'static str, String)> {
        let queued: Vec<(String, Option<&str>)> = (self.queue.items())
            .filter_map(|item| match item {
                Queued::Request { m, .. } => Some((m.method()?.into_owned(), m.params())),
                _ => None,
            })
            .collect();
        let mut replays = Vec::new();
        if let Some(level) = &self.session.log_level {
            if !queued.iter().any(|(m, _)| m == "logging/setLevel") {
                replays.push(("logging/setLevel", level.clone()));
            }
        }
        for params in self.session.subscriptions.values() {
            let pending = |(m, p): &(String, Option<&str>)| {
                m == "resources/subscribe" && *p == Some(params.as_str())
            };
            if !queued.iter().any(pending) {
                replays.push(("resources/subscribe", params.clone()));
            }
        }
        replays
    }

    /// The handshake is replayed to the current incarnation: traffic flows.
    pub(super) fn replayed(&mut self) {
        if let Connection::Up(c) = &mut self.state {
            c.ready = true;
        }
        self.recovery.handshaken();
    }

    /// The server works again: true if an outage ended (and says so).
    pub(super) fn up(&mut self, now: Instant) -> bool {
        let Some(took) = self.recovery.up(now) else {
            return false;
        };
        let what = match self.remote() {
            true => "reconnected to the MCP server",
            false => "the restarted MCP server is ready",
        };
        info!(
            "{what} after {} down; the session continues",
            super::calls::secs(took)
        );
        true
    }

    /// Seeds the restart backoff's jitter (tests replay a schedule).
    #[cfg(test)]
    pub(super) fn reseed(&mut self, seed: u64) {
        self.rng = fastrand::Rng::with_seed(seed);
    }

    /// Started by `check`: the first start that ends before the handshake
    /// answers what waits.
    pub(super) fn set_check_mode(&mut self, on: bool) {
        self.check_mode = on;
    }

    /// The current incarnation's number (the first start is 1).
    pub(super) fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether an incarnation is connected (ready or not).
    pub(super) fn is_up(&self) -> bool {
        matches!(self.state, Connection::Up(_))
    }

    /// What waits, for tests.
    #[cfg(test)]
    pub(super) fn queue(&self) -> &Queue {
        &self.queue
    }

    /// Everything queued, in order: nothing will be sent any more.
    pub(super) fn drain_queue(&mut self) -> Vec<(u64, Instant, Queued)> {
        self.queue.drain()
    }

    /// Begins the graceful stop of the current incarnation, `step` apart;
    /// false if there is none.
    pub(super) fn shutdown(&mut self, step: Duration) -> bool {
        let Connection::Up(c) = &mut self.state else {
            return false;
        };
        c.server.shutdown(step);
        true
    }

    /// The current incarnation answered a client request or a call
    /// attempt: it did useful work (its crash is no crash loop).
    pub(super) fn served(&mut self) {
        if let Connection::Up(c) = &mut self.state {
            c.served = true;
        }
        self.recovery.handshaken();
    }

    /// A server accepted a handshake this session.
    pub(super) fn handshaken(&mut self) {
        self.recovery.handshaken();
    }

    /// Whether a server accepted a handshake this session.
    pub(super) fn is_handshaken(&self) -> bool {
        self.recovery.is_handshaken()
    }

    /// A handshake must be replayed to the current incarnation before
    /// traffic flows again: true if there is one that takes input (the
    /// caller replays it), false if the next start will.
    pub(super) fn unready(&mut self) -> bool {
        match &mut self.state {
            Connection::Up(c) if !c.draining => {
                c.ready = false;
                true
            }
            _ => false,
        }
    }

    /// The link as `status` shows it, and until when that holds, if known.
    pub(super) fn shown(&self) -> (LinkState, Option<Instant>) {
        match &self.state {
            Connection::Up(_) if self.ready() => (LinkState::Up, None),
            Connection::Up(_) if self.generation <= 1 => (LinkState::Starting, None),
            Connection::Up(_) => (LinkState::Restarting, None),
            Connection::Outage => (LinkState::Restarting, self.recovery.next_probe()),
            Connection::Down { .. } => (LinkState::Down, None),
        }
    }

    /// Why the server is down or in an outage, if it is.
    pub(super) fn trouble(&self) -> Option<String> {
        match (&self.state, self.recovery.outage()) {
            (Connection::Down { message, .. }, _) => Some(message.clone()),
            (_, Some(o)) => Some(o.message.clone()),
            (_, None) => None,
        }
    }
}

/// The state of the server link.
enum Connection {
    /// Connected (possibly still replaying the handshake: a probe).
    Up(Box<Conn>),
    /// Down between probes: the next one is due at the recovery's
    /// `next_probe` (a `Timer::Restart`); the outage's cause is the
    /// recovery's too.
    Outage,
    /// Gone for good (the session is ending, or before the first start).
    Down { reason: Reason, message: String },
}

/// One incarnation of the server.
struct Conn {
    server: Box<dyn Downstream>,
    /// The server's input backlog (`Downstream::input_backlog`), read
    /// before every send.
    backlog: Option<Arc<Backlog>>,
    started: Instant,
    /// It takes no more input (its process exited, or its input failed);
    /// what it sent is still being delivered, and `Gone` follows.
    draining: bool,
    /// The handshake is replayed (or there was none to replay): traffic flows.
    ready: bool,
    /// The server has sent at least one message.
    answered: bool,
    /// The server has answered a client request or a call attempt (not just
    /// the proxy's replay): it did useful work, so its crash is not part of
    /// a crash loop.
    served: bool,
    /// Lines over `max_message_bytes` the server has started, and whether
    /// the last one is still being written.
    overlong_lines: u64,
    in_overlong: bool,
}

/// What a new incarnation must be told to continue the client's session.
#[derive(Debug, Default)]
pub(super) struct Session {
    /// The client's `initialize` params, kept once the server accepted them.
    pub(super) init_params: Option<String>,
    /// Params of an `initialize` in flight.
    pub(super) pending_init: Option<String>,
    pub(super) protocol_version: Option<String>,
    /// The client sent `notifications/initialized`.
    pub(super) initialized: bool,
    /// A 2026-07-28 client (no `initialize`): the protocol members of its
    /// requests' `_meta`, which the proxy's own requests carry too.
    pub(super) modern_meta: Option<String>,
    /// Params of the last `logging/setLevel`.
    pub(super) log_level: Option<String>,
    /// Active `resources/subscribe` params by uri.
    pub(super) subscriptions: BTreeMap<String, String>,
    /// The server declared `capabilities.tools`.
    pub(super) has_tools: bool,
    /// The first server declared `capabilities.tools.listChanged`.
    pub(super) tools_list_changed: bool,
}

/// What the proxy's own requests to a new incarnation are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReplayStep {
    Initialize,
    Other,
}

/// Something waiting for the server to be ready.
#[derive(Debug)]
pub(super) enum Queued {
    Request {
        m: Message,
        client_id: String,
        method: Method,
    },
    /// The next attempt of a `tools/call`.
    Call(u64),
    Notification(Outgoing),
}

/// Where a request goes now.
pub(super) enum Route {
    Send,
    Queue,
    Refuse(Reason, String),
}

impl Dispatcher {
    /// Starts the server, or reconnects to it: the first start, or a probe
    /// during an outage.
    pub(super) fn start_server(&mut self, now: Instant) {
        self.link.generation += 1;
        let generation = self.link.generation;
        self.calls.new_incarnation();
        self.link.recovery.probe_started(now);
        match (self.link.connect)(&self.cfg, generation, self.link.events.clone()) {
            Ok(server) => {
                match (self.link.recovery.outage().is_some(), self.link.remote()) {
                    (false, true) => info!("connecting to {}", server.describe()),
                    (false, false) => info!("started {}", server.describe()),
                    (true, true) => debug!("reconnecting to {}", server.describe()),
                    (true, false) => debug!("probing: started {}", server.describe()),
                }
                let replay = self.link.session.init_params.is_some();
                self.link.state = Connection::Up(Box::new(Conn {
                    backlog: server.input_backlog(),
                    server,
                    started: now,
                    draining: false,
                    ready: !replay,
                    answered: false,
                    served: false,
                    overlong_lines: 0,
                    in_overlong: false,
                }));
                if replay {
                    self.replay_initialize(now);
                } else {
                    // Nothing to replay: traffic flows at once; the outage
                    // ends with the server's first message.
                    let back = self.link.recovery.outage().is_some();
                    self.flush_queue(back, now);
                    self.fetch_deferred_tools(now);
                }
            }
            Err(StartError { message, heal }) => {
                self.link.recovery.start_ended(None);
                match self.link.recovery.outage() {
                    Some(_) => debug!("{message}"),
                    None => crate::error!("{message}"),
                }
                self.link.state = Connection::Outage;
                self.link_down(message, heal, now);
            }
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
        let seq = self.link.queue.push(item, since)?;
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
        let what = match &self.link.state {
            Connection::Up(c) => c.server.describe(),
            _ => "the MCP server".to_owned(),
        };
        let message = format!(
            "the MCP server {what} did not answer initialize within {}; check that it starts (run its command by hand); a server this slow to start needs a larger wait_for_server, and the host a larger start timeout (MCP_TIMEOUT for Claude Code)",
            super::calls::secs(waited)
        );
        warn!("{message}");
        self.with_calls(now, |c, ctx, _| c.outage_failure(ctx.now));
        self.answer_proxy_error(&client_id, Reason::ServerUnavailable, &message);
    }

    pub(super) fn unqueue(&mut self, seq: u64) -> Option<Queued> {
        self.link.queue.take(seq).map(|(_, q)| q)
    }

    /// A queued item waited as long as it may for the server.
    pub(super) fn on_queue_expired(&mut self, seq: u64, now: Instant) {
        self.queue_give_up(seq, now, "gave up after waiting");
    }

    /// Answers queued item `seq` with the server's unavailability; the
    /// message says how long it really waited. A request that gave up
    /// waiting counts toward the circuit breaker (an outage's failure).
    fn queue_give_up(&mut self, seq: u64, now: Instant, what: &str) {
        let Some((since, item)) = self.link.queue.take(seq) else {
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
            self.link.queue.begin_ramp(now);
        }
        self.release_queue(now);
    }

    /// Sends what waited, in order, as far as the ramp allows (a
    /// notification waits only for what is before it). The ramp holds the
    /// backlog, not the session's new traffic: what comes meanwhile goes at
    /// once, and so does what waited less than `ramp::FRESH` (it just
    /// missed the connection).
    pub(super) fn release_queue(&mut self, now: Instant) {
        while self.link.ready() {
            let Some((seq, item)) = self.link.queue.pop_releasable() else {
                break;
            };
            if self.release(seq, item, now) {
                self.link.queue.released(now);
            }
        }
        for seq in self.link.queue.fresh(now) {
            if !self.link.ready() {
                break;
            }
            if let Some(item) = self.unqueue(seq) {
                self.release(seq, item, now);
            }
        }
        if let Some(at) = self.link.queue.settle() {
            self.set_timer(at, Timer::RampStall);
        }
    }

    /// Nothing released was answered for a while: more may go.
    pub(super) fn on_ramp_stall(&mut self, now: Instant) {
        if self.link.queue.stalled(now) {
            self.release_queue(now);
        }
    }

    /// The server answered a request: while a ramp runs, more may go.
    pub(super) fn ramp_answered(&mut self, now: Instant) {
        if self.link.queue.answered(now) {
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
        let mut params = self.link.session.init_params.clone().unwrap_or_default();
        // A session begun from the cache asks for the version the client
        // was told: a server that still speaks it answers in it.
        if let (true, Some(told)) = (
            self.instant_unchecked(),
            &self.link.session.protocol_version,
        ) {
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
        let generation = self.link.generation;
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
        let problem = match (&version, &self.link.session.protocol_version) {
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
        if self.link.session.initialized {
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
        if self.link.session.tools_list_changed {
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
        if let (Connection::Up(c), true) = (&mut self.link.state, from_output) {
            // Any other news from its output means the overlong line ended.
            c.in_overlong = false;
        }
        match event {
            ServerEvent::Message(parsed) => {
                let mut first_word = false;
                if let Connection::Up(c) = &mut self.link.state {
                    first_word = !c.answered && c.ready;
                    c.answered = true;
                }
                if first_word && self.link.recovery.outage().is_some() {
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
                let Connection::Up(c) = &mut self.link.state else {
                    return;
                };
                c.overlong_lines += 1;
                c.in_overlong = true;
                let (generation, line) = (self.link.generation, c.overlong_lines);
                self.set_timer(
                    now + self.cfg.call_timeout,
                    Timer::OverlongLine { generation, line },
                );
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
                if let Connection::Up(c) = &mut self.link.state {
                    c.draining = true;
                }
            }
            ServerEvent::Gone(gone) => self.on_link_gone(gone, now),
        }
    }

    /// A request of ours the server never acted on (`failure`: never
    /// sent, or refused with a hint). A call attempt fails so (always safe
    /// to retry; a refused one after the hint, whatever the tool); a
    /// client request never sent waits for the next server (its line, which
    /// the proxy wrote, is read back to go again under a new id; only the
    /// rest of a line partly written comes back: that request stays in
    /// flight, for the lost link to decide), one refused is answered with
    /// the refusal and the hint; the proxy's own requests are made again
    /// for the next incarnation (the handshake replay, the tool list).
    pub(super) fn on_unanswered(&mut self, line: Outgoing, failure: Failure, now: Instant) {
        let Some(down) = line.request_id() else {
            return;
        };
        match self.requests.resolve_issued(down) {
            Resolved::Ours(Inflight::Client {
                client_id,
                method,
                resend,
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
                _ => {
                    // What was kept of it, else its line read back.
                    let kept = resend.clone().or_else(|| {
                        Message::reparse(String::from_utf8_lossy(&line.bytes).trim_end().to_owned())
                    });
                    match kept {
                        Some(m) => {
                            debug!("a request never reached the server; it waits for the next one");
                            self.requeue_request(m, client_id, method, now)
                        }
                        None => {
                            let back = Inflight::Client {
                                client_id,
                                method,
                                resend,
                            };
                            self.requests.restore(down, back);
                        }
                    }
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
            instant.reading.link_lost();
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
                resend,
            } = f
            else {
                continue;
            };
            match resend {
                Some(m) if !stopping => {
                    debug!("sending a read request again once the server is back");
                    self.requeue_request(m, client_id, method, now);
                }
                _ => self.answer_proxy_error(&client_id, Reason::ServerExited, message),
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
        client_id: String,
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
        for seq in self.link.queue.seqs() {
            self.queue_give_up(seq, now, "stopped waiting after");
        }
    }

    /// The server is down (it is gone, or a start or probe failed): plans
    /// the next probe ([`Link::plan_probe`]). What waits keeps waiting,
    /// unless what stopped the server needs fixing: then it is answered at
    /// once with what to fix.
    pub(super) fn link_down(&mut self, message: String, heal: Heal, now: Instant) {
        let waiting = !self.link.queue.is_empty() || self.calls.tools_deferred();
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
        if seq == self.link.restart_seq && matches!(self.link.state, Connection::Outage) {
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

/// The proxy's error object for a request the transport got no answer
/// to: -32602 for one it could not send as the client wrote it, else the
/// proxy's -31000 with its reason, `httpStatus` and `outcome`.
pub(super) fn failure_error(f: &TransportFailure) -> CallError {
    if f.invalid {
        let data = format!(
            "{{\"source\":\"mcp-retry\",\"reason\":\"{}\"}}",
            Reason::InvalidParams.as_str()
        );
        return CallError {
            object: jsonrpc::error_object(jsonrpc::INVALID_PARAMS, &f.message, Some(&data)),
            reason: Some(Reason::InvalidParams),
        };
    }
    let mut extra = Vec::new();
    if let Some(status) = f.status {
        extra.push(("httpStatus", status.to_string()));
    }
    let reason = match f.may_have_run {
        true => {
            extra.push(("outcome", "\"unknown\"".to_owned()));
            Reason::TransportError
        }
        false => Reason::Rejected,
    };
    CallError::proxy(reason, &f.message, &extra)
}
