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
//! dispatcher carries out in order (`with_link`); what also needs the
//! requests and the calls (the start's sequel, releasing and giving up the
//! queue, the replay, the transport's reports) is the dispatcher's, in
//! `actions.rs`. Talks to the server only through [`Downstream`]; knows
//! nothing of processes. Probe
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
    Downstream, Failure as TransportFailure, Gone, Heal, Outgoing, Sent, StartError,
};
use crate::jsonrpc::{self, Message, RawObject};
use crate::policy::recovery::{Recovery, CRASH_LOOP};
use crate::status::LinkState;
use crate::stdio::{Backlog, Withdraw};
use crate::{debug, info, warn};

use super::calls::Failure;
use super::queue::Queue;
use super::{CallError, Connector, Event, Method, Reason, Timer};

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
    session: Session,
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

    /// Starts the server, or reconnects to it (the first start, or a probe
    /// during an outage): a new incarnation, which replays the session's
    /// handshake first if there is one. A start that fails puts the link in
    /// an outage ([`Effect::Down`]).
    pub(super) fn start(&mut self, now: Instant, out: &mut Vec<Effect>) -> Started {
        self.generation += 1;
        let generation = self.generation;
        self.recovery.probe_started(now);
        match (self.connect)(&self.cfg, generation, self.events.clone()) {
            Ok(server) => {
                match (self.recovery.outage().is_some(), self.remote()) {
                    (false, true) => info!("connecting to {}", server.describe()),
                    (false, false) => info!("started {}", server.describe()),
                    (true, true) => debug!("reconnecting to {}", server.describe()),
                    (true, false) => debug!("probing: started {}", server.describe()),
                }
                let replay = self.session.init_params.is_some();
                self.state = Connection::Up(Box::new(Conn {
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
                match replay {
                    true => Started::Replay,
                    false => Started::Flowing {
                        back: self.recovery.outage().is_some(),
                    },
                }
            }
            Err(StartError { message, heal }) => {
                self.recovery.start_ended(None);
                match self.recovery.outage() {
                    Some(_) => debug!("{message}"),
                    None => crate::error!("{message}"),
                }
                self.state = Connection::Outage;
                out.push(Effect::Down { message, heal });
                Started::Failed
            }
        }
    }

    /// The probe timer `seq` fired: true if it is the newest and the link
    /// is still in its outage (the caller starts the server).
    pub(super) fn probe_due(&self, seq: u64) -> bool {
        seq == self.restart_seq && matches!(self.state, Connection::Outage)
    }

    /// The current incarnation as log lines name it.
    pub(super) fn describe(&self) -> String {
        match &self.state {
            Connection::Up(c) => c.server.describe(),
            _ => "the MCP server".to_owned(),
        }
    }

    /// The current incarnation's output said something (a message, a bad
    /// or an overlong line): a line over the limit it was writing ended.
    pub(super) fn output_seen(&mut self) {
        if let Connection::Up(c) = &mut self.state {
            c.in_overlong = false;
        }
    }

    /// The current incarnation sent a message: true if it is the first of
    /// a ready server during an outage (a server with no handshake to
    /// replay is back once it says something).
    pub(super) fn said_something(&mut self) -> bool {
        let mut first_word = false;
        if let Connection::Up(c) = &mut self.state {
            first_word = !c.answered && c.ready;
            c.answered = true;
        }
        first_word && self.recovery.outage().is_some()
    }

    /// The current incarnation began a line over `max_message_bytes`: if
    /// it is still writing it after `call_timeout`, it is stopped
    /// ([`Link::on_overlong_line`]).
    pub(super) fn overlong_started(&mut self, now: Instant, out: &mut Vec<Effect>) {
        let Connection::Up(c) = &mut self.state else {
            return;
        };
        c.overlong_lines += 1;
        c.in_overlong = true;
        let (generation, line) = (self.generation, c.overlong_lines);
        out.push(Effect::Timer(
            now + self.cfg.call_timeout,
            Timer::OverlongLine { generation, line },
        ));
    }

    /// The current incarnation takes no more input: new traffic waits for
    /// the next one; what it sent is still read.
    pub(super) fn draining(&mut self) {
        if let Connection::Up(c) = &mut self.state {
            c.draining = true;
        }
    }

    // ----- the queue -----------------------------------------------------

    /// Puts `item` in the queue, waiting since `since`: its number, or
    /// `None` when the queue is full.
    pub(super) fn enqueue(&mut self, item: Queued, since: Instant) -> Option<u64> {
        self.queue.push(item, since)
    }

    /// Takes queued item `seq` out of the queue, with when it began to
    /// wait.
    pub(super) fn take_queued(&mut self, seq: u64) -> Option<(Instant, Queued)> {
        self.queue.take(seq)
    }

    /// The numbers of everything queued, oldest first.
    pub(super) fn queued(&self) -> Vec<u64> {
        self.queue.seqs()
    }

    /// Whether something waits in the queue.
    pub(super) fn has_queued(&self) -> bool {
        !self.queue.is_empty()
    }

    /// A server back from an outage: the queue is released in a ramp.
    pub(super) fn begin_ramp(&mut self, now: Instant) {
        self.queue.begin_ramp(now);
    }

    /// The next queued item the ramp lets go, while the link is ready.
    pub(super) fn next_release(&mut self) -> Option<(u64, Queued)> {
        match self.ready() {
            true => self.queue.pop_releasable(),
            false => None,
        }
    }

    /// A queued request went out at `now` (the ramp counts it).
    pub(super) fn released(&mut self, now: Instant) {
        self.queue.released(now);
    }

    /// Queued items that waited too little to be held by the ramp.
    pub(super) fn fresh(&self, now: Instant) -> Vec<u64> {
        self.queue.fresh(now)
    }

    /// When the ramp lets more go if nothing is answered meanwhile.
    pub(super) fn settle(&mut self) -> Option<Instant> {
        self.queue.settle()
    }

    /// Nothing released was answered for a while: true if more may go.
    pub(super) fn ramp_stalled(&mut self, now: Instant) -> bool {
        self.queue.stalled(now)
    }

    /// The server answered a request: true if the ramp lets more go.
    pub(super) fn ramp_answered(&mut self, now: Instant) -> bool {
        self.queue.answered(now)
    }

    // ----- the session ---------------------------------------------------

    /// The protocol version of the session (the server's, or the one the
    /// client was told from the cache).
    pub(super) fn protocol_version(&self) -> Option<&str> {
        self.session.protocol_version.as_deref()
    }

    /// Whether the client may send JSON-RPC batches (2025-03-26 only).
    pub(super) fn batches_allowed(&self) -> bool {
        self.protocol_version() == Some("2025-03-26")
    }

    /// Whether the client began the session's handshake (its `initialize`
    /// was sent or accepted).
    pub(super) fn handshake_begun(&self) -> bool {
        self.session.init_params.is_some() || self.session.pending_init.is_some()
    }

    /// Whether a new incarnation is replayed a handshake (the server
    /// accepted the client's, or the client was told one from the cache).
    pub(super) fn has_handshake(&self) -> bool {
        self.session.init_params.is_some()
    }

    /// The client's `initialize` params a new incarnation is sent.
    pub(super) fn handshake_params(&self) -> Option<&str> {
        self.session.init_params.as_deref()
    }

    /// The protocol version the client asked for in its `initialize`.
    pub(super) fn client_version(&self) -> String {
        (self.session.init_params.as_deref())
            .or(self.session.pending_init.as_deref())
            .and_then(RawObject::parse)
            .and_then(|p| p.string("protocolVersion"))
            .unwrap_or_default()
    }

    /// A client request `method` (its 2026-07-28 `_meta` members, read at
    /// the edge, if any): a client that begins without
    /// `initialize` may speak 2026-07-28, and the proxy's own requests must
    /// then name the version as the client's do. Read once, and never in a
    /// session that began with `initialize`.
    pub(super) fn learn_era(&mut self, method: &str, envelope: Option<&str>) {
        if self.session.modern_meta.is_none() && !self.handshake_begun() && method != "initialize" {
            self.session.modern_meta = envelope.map(str::to_owned);
        }
    }

    /// A probing client fell back to the handshake: it speaks the older
    /// era after all.
    pub(super) fn handshake_asked(&mut self) {
        self.session.modern_meta = None;
    }

    /// The `_meta` protocol members the proxy's own requests carry (a
    /// 2026-07-28 client's).
    pub(super) fn modern_meta(&self) -> Option<&str> {
        self.session.modern_meta.as_deref()
    }

    /// The client's `initialize` goes to the server with `params`.
    pub(super) fn initialize_sent(&mut self, params: Option<&str>) {
        self.session.pending_init = params.map(str::to_owned);
    }

    /// The server accepted the client's `initialize` (its `result`, raw):
    /// a restart replays it.
    pub(super) fn accepted(&mut self, result: &str) {
        self.session.init_params = self.session.pending_init.take();
        self.recovery.handshaken();
        if let Some(v) = RawObject::parse(result).and_then(|r| r.string("protocolVersion")) {
            debug!("negotiated protocol version {v}");
            self.session.protocol_version = Some(v);
        }
        self.observe_capabilities(result);
    }

    /// The client was told `result` (raw) from the cache for its
    /// `initialize` (`params`): the session is the client's from now on,
    /// as if the server had accepted it, and a start replays it. It was
    /// told `listChanged`: a restarted server's tools are compared too.
    pub(super) fn begin_from_cache(&mut self, params: Option<&str>, result: &str) {
        self.session.init_params = params.map(str::to_owned);
        self.session.protocol_version =
            RawObject::parse(result).and_then(|r| r.string("protocolVersion"));
        self.observe_capabilities(result);
        self.session.tools_list_changed = self.session.has_tools;
    }

    /// The server answered the replayed `initialize` in time with `result`
    /// (raw), which the client is given instead of the cached one.
    pub(super) fn answered_in_grace(&mut self, result: &str) {
        self.session.protocol_version =
            RawObject::parse(result).and_then(|r| r.string("protocolVersion"));
        self.observe_capabilities(result);
    }

    /// What the server's `initialize` result (raw) declares that the
    /// proxy acts on.
    fn observe_capabilities(&mut self, raw: &str) {
        let Some(result) = RawObject::parse(raw) else {
            return;
        };
        let tools = result
            .get("capabilities")
            .and_then(|c| RawObject::parse(c.get()))
            .and_then(|c| c.get("tools").map(|t| t.get().to_owned()));
        self.session.has_tools = tools.is_some();
        self.session.tools_list_changed = tools
            .as_deref()
            .and_then(RawObject::parse)
            .and_then(|t| t.get("listChanged").map(|l| l.get() == "true"))
            .unwrap_or(false);
    }

    /// Whether the server declared `capabilities.tools`.
    pub(super) fn has_tools(&self) -> bool {
        self.session.has_tools
    }

    /// The server no longer declares the tools the client was told of.
    pub(super) fn tools_lost(&mut self) {
        self.session.has_tools = false;
    }

    /// Whether a restarted server's tools are compared with the first's
    /// (the first declared `tools.listChanged`, or the client was told so).
    pub(super) fn compares_tools(&self) -> bool {
        self.session.tools_list_changed
    }

    /// The client sent `notifications/initialized`.
    pub(super) fn client_initialized(&mut self) {
        self.session.initialized = true;
    }

    /// Whether the client sent `notifications/initialized`.
    pub(super) fn is_initialized(&self) -> bool {
        self.session.initialized
    }

    /// Whether the proxy may send the server requests of its own: the
    /// client said `initialized`, or speaks 2026-07-28 (no handshake).
    pub(super) fn session_open(&self) -> bool {
        self.session.initialized || self.session.modern_meta.is_some()
    }

    /// The client set the server's log level (`logging/setLevel`'s
    /// `params`): a new incarnation is told too.
    pub(super) fn set_log_level(&mut self, params: Option<&str>) {
        self.session.log_level = params.map(str::to_owned);
    }

    /// Remembers active subscriptions, to replay them to a restarted server.
    pub(super) fn track_subscription(&mut self, method: &str, params: Option<&str>) {
        let Some(p) = params else { return };
        let Some(uri) = RawObject::parse(p).and_then(|o| o.get("uri").map(|u| u.get().to_owned()))
        else {
            return;
        };
        if method == "resources/subscribe" {
            self.session.subscriptions.insert(uri, p.to_owned());
        } else {
            self.session.subscriptions.remove(&uri);
        }
    }
}

/// How a start went ([`Link::start`]).
pub(super) enum Started {
    /// The session's handshake is to be replayed first.
    Replay,
    /// Nothing to replay: traffic flows at once (`back` from an outage,
    /// which ends with the server's first message).
    Flowing { back: bool },
    /// It failed: the link is in an outage.
    Failed,
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
struct Session {
    /// The client's `initialize` params, kept once the server accepted them.
    init_params: Option<String>,
    /// Params of an `initialize` in flight.
    pending_init: Option<String>,
    protocol_version: Option<String>,
    /// The client sent `notifications/initialized`.
    initialized: bool,
    /// A 2026-07-28 client (no `initialize`): the protocol members of its
    /// requests' `_meta`, which the proxy's own requests carry too.
    modern_meta: Option<String>,
    /// Params of the last `logging/setLevel`.
    log_level: Option<String>,
    /// Active `resources/subscribe` params by uri.
    subscriptions: BTreeMap<String, String>,
    /// The server declared `capabilities.tools`.
    has_tools: bool,
    /// The first server declared `capabilities.tools.listChanged`.
    tools_list_changed: bool,
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
        client_id: super::ClientId,
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
