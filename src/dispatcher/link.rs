//! The server link: starting the server, learning that it is gone (the
//! transport says so once, after everything the server sent), restarting
//! it with backoff, replaying the client's handshake to a new incarnation,
//! and queueing traffic while it is not ready.
//!
//! Owns [`Link`], [`Session`] (what must be replayed) and the queue of
//! requests waiting for the server. Talks to the server only through
//! [`Downstream`]; knows nothing of processes.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::downstream::{Downstream, Gone, ServerEvent};
use crate::jsonrpc::{self, Message, RawObject};
use crate::policy::backoff::Backoff;
use crate::policy::breaker::BreakerState;
use crate::{debug, info, warn};

use super::calls::Failure;
use super::{Dispatcher, Inflight, Method, Phase, Reason, Timer};

/// A child that stays up this long resets the restart backoff.
const STABLE_AFTER: Duration = Duration::from_secs(60);
/// Most requests waiting for a restarting server.
pub(super) const QUEUE_LIMIT: usize = 1000;
/// Requests wait for a restart due within this long; later ones are
/// answered at once (a crash loop fails fast instead of hanging).
const WAIT_FOR_RESTART: Duration = Duration::from_secs(1);

/// The state of the server link.
pub(super) enum Link {
    /// Connected (possibly still replaying the handshake).
    Up(Box<Conn>),
    /// Waiting for the restart timer, due `at`.
    Restarting { message: String, at: Instant },
    /// Not running, and not restarted while the breaker is open; the first
    /// request after its cooldown starts the server again.
    Dormant { message: String },
    /// Gone for good (the session is ending, or before the first start).
    Down { reason: Reason, message: String },
}

/// One incarnation of the server.
pub(super) struct Conn {
    pub(super) server: Box<dyn Downstream>,
    started: Instant,
    /// It takes no more input (its process exited, or its input failed);
    /// what it sent is still being delivered, and `Gone` follows.
    draining: bool,
    /// The handshake is replayed (or there was none to replay): traffic flows.
    pub(super) ready: bool,
    /// The server has sent at least one message.
    answered: bool,
    /// The server has answered a client request or a call attempt (not just
    /// the proxy's replay): it did useful work, so its crash is not part of
    /// a crash loop.
    pub(super) served: bool,
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
    Notification(Vec<u8>),
}

/// Where a request goes now.
pub(super) enum Route {
    Send,
    Queue,
    Refuse(Reason, String),
}

impl Dispatcher {
    /// Starts (or restarts) the server.
    pub(super) fn start_server(&mut self, now: Instant) {
        self.generation += 1;
        let generation = self.generation;
        self.calls.new_incarnation();
        match (self.connect)(&self.cfg, generation, self.events.clone()) {
            Ok(server) => {
                info!("started {}", server.describe());
                let replay = self.session.init_params.is_some();
                self.link = Link::Up(Box::new(Conn {
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
                    self.flush_queue(now);
                    self.fetch_deferred_tools(now);
                }
            }
            Err(message) => {
                crate::error!("{message}");
                self.failed_start(message, now);
            }
        }
    }

    /// Where traffic for the server goes right now. May start a dormant
    /// server whose breaker cooldown is over.
    pub(super) fn route(&mut self, now: Instant) -> Route {
        if let Link::Dormant { message } = &self.link {
            if let BreakerState::Open { until } = self.calls.breaker_state() {
                if *until > now {
                    let m = format!(
                        "{message}; not restarting it for another {:.1}s (circuit breaker open)",
                        until.saturating_duration_since(now).as_secs_f64()
                    );
                    return Route::Refuse(Reason::ServerUnavailable, m);
                }
            }
            info!("a request arrived after the breaker's cooldown: starting the server again");
            self.start_server(now);
        }
        match &self.link {
            Link::Up(c) if c.ready && !c.draining => Route::Send,
            // Starting, or exited with its last answers still being read:
            // a new incarnation follows.
            Link::Up(_) => Route::Queue,
            Link::Restarting { at, .. } if *at <= now + WAIT_FOR_RESTART => Route::Queue,
            Link::Restarting { message, at } => Route::Refuse(
                Reason::ServerUnavailable,
                format!(
                    "{message}; it is restarted in {:.1}s",
                    at.saturating_duration_since(now).as_secs_f64()
                ),
            ),
            Link::Dormant { message } => Route::Refuse(Reason::ServerUnavailable, message.clone()),
            Link::Down { reason, message } => Route::Refuse(*reason, message.clone()),
        }
    }

    /// Puts `item` in the queue; false when the queue is full.
    pub(super) fn enqueue(&mut self, item: Queued, now: Instant) -> Option<u64> {
        if self.queue.len() >= QUEUE_LIMIT {
            return None;
        }
        self.queue_seq += 1;
        let seq = self.queue_seq;
        self.queue.push_back((seq, now, item));
        self.set_timer(now + self.cfg.call_timeout, Timer::QueueExpired { seq });
        Some(seq)
    }

    pub(super) fn unqueue(&mut self, seq: u64) -> Option<Queued> {
        self.unqueue_timed(seq).map(|(_, q)| q)
    }

    /// Takes item `seq` out of the queue, with when it was queued.
    fn unqueue_timed(&mut self, seq: u64) -> Option<(Instant, Queued)> {
        let i = self.queue.iter().position(|(s, ..)| *s == seq)?;
        self.queue.remove(i).map(|(_, at, q)| (at, q))
    }

    /// A queued item waited `call_timeout` for the server.
    pub(super) fn queue_expired(&mut self, seq: u64, now: Instant) {
        self.queue_give_up(seq, now, "gave up after waiting");
    }

    /// Answers queued item `seq` with the server's unavailability; the
    /// message says how long it really waited.
    fn queue_give_up(&mut self, seq: u64, now: Instant, what: &str) {
        let Some((since, item)) = self.unqueue_timed(seq) else {
            return;
        };
        let message = format!(
            "the MCP server is not available ({}); {what} {} for it",
            self.link_message(),
            super::calls::secs(now.saturating_duration_since(since))
        );
        match item {
            Queued::Request { client_id, .. } => {
                self.answer_proxy_error(&client_id, Reason::ServerUnavailable, &message)
            }
            Queued::Call(id) => {
                let error = super::proxy_error(Reason::ServerUnavailable, &message, &[]);
                self.with_calls(now, |c, ctx, out| c.refuse_attempt(id, &error, ctx, out));
            }
            Queued::Notification(_) => debug!("dropped a queued notification"),
        }
    }

    fn link_message(&self) -> String {
        match &self.link {
            Link::Up(_) => "it is restarting".into(),
            Link::Restarting { message, .. }
            | Link::Dormant { message }
            | Link::Down { message, .. } => message.clone(),
        }
    }

    /// The server is ready: send what waited, in order.
    fn flush_queue(&mut self, now: Instant) {
        let items: Vec<(u64, Instant, Queued)> = self.queue.drain(..).collect();
        for (seq, _, item) in items {
            match item {
                Queued::Request {
                    m,
                    client_id,
                    method,
                } => {
                    let still_wanted = self
                        .client_requests
                        .get(&client_id)
                        .is_some_and(|r| r.queued == Some(seq));
                    if still_wanted {
                        if let Some(r) = self.client_requests.get_mut(&client_id) {
                            r.queued = None;
                        }
                        self.relay_request(m, client_id, method, now);
                    }
                }
                Queued::Call(id) => {
                    if self.calls.unqueued(id) {
                        self.start_attempt(id, now);
                    }
                }
                Queued::Notification(line) => {
                    self.send_server(line);
                }
            }
        }
    }

    /// Sends the client's original `initialize` to a new incarnation.
    fn replay_initialize(&mut self, now: Instant) {
        let params = self.session.init_params.clone().unwrap_or_default();
        let down = self.next_id();
        self.inflight
            .insert(down, Inflight::Replay(ReplayStep::Initialize));
        debug!("replaying the client's initialize to the new server");
        self.send_server(jsonrpc::request_line(
            &down.to_string(),
            "initialize",
            Some(&params),
        ));
        // initialize is never cancelled; a server that does not answer it
        // in time is killed and counts as a failed start.
        let generation = self.generation;
        self.set_timer(
            now + self.cfg.call_timeout,
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
        let version = m
            .result()
            .and_then(RawObject::parse)
            .and_then(|r| r.string("protocolVersion"));
        let problem = match (&version, &self.session.protocol_version) {
            (None, _) => Some(format!(
                "it answered the replayed initialize with {}",
                m.error().unwrap_or("no result")
            )),
            (Some(v), Some(old)) if v != old => Some(format!(
                "it chose protocol version {v}, but the session uses {old}"
            )),
            _ => None,
        };
        if let Some(problem) = problem {
            warn!("the restarted server is not usable: {problem}; stopping it");
            if let Link::Up(c) = &mut self.link {
                c.server.kill();
            }
            return;
        }
        if self.session.initialized {
            self.send_server(jsonrpc::notification_line(
                "notifications/initialized",
                None,
            ));
        }
        let mut replays: Vec<(&str, String)> = Vec::new();
        if let Some(level) = &self.session.log_level {
            replays.push(("logging/setLevel", level.clone()));
        }
        for params in self.session.subscriptions.values() {
            replays.push(("resources/subscribe", params.clone()));
        }
        for (method, params) in replays {
            let down = self.next_id();
            self.inflight
                .insert(down, Inflight::Replay(ReplayStep::Other));
            self.send_server(jsonrpc::request_line(
                &down.to_string(),
                method,
                Some(&params),
            ));
        }
        if let Link::Up(c) = &mut self.link {
            c.ready = true;
        }
        info!("the restarted server is ready; the session continues");
        self.flush_queue(now);
        self.fetch_deferred_tools(now);
        if self.session.tools_list_changed {
            self.with_calls(now, |c, ctx, out| {
                c.compare_tools_after_restart(ctx.link, out)
            });
        }
    }

    /// Something happened to the current incarnation.
    pub(super) fn on_link_event(&mut self, event: ServerEvent, now: Instant) {
        let from_output = matches!(
            event,
            ServerEvent::Message(_) | ServerEvent::Garbage { .. } | ServerEvent::TooLong { .. }
        );
        if let (Link::Up(c), true) = (&mut self.link, from_output) {
            // Any other news from its output means the overlong line ended.
            c.in_overlong = false;
        }
        match event {
            ServerEvent::Message(parsed) => {
                if let Link::Up(c) = &mut self.link {
                    c.answered = true;
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
                let Link::Up(c) = &mut self.link else { return };
                c.overlong_lines += 1;
                c.in_overlong = true;
                let (generation, line) = (self.generation, c.overlong_lines);
                self.set_timer(
                    now + self.cfg.call_timeout,
                    Timer::OverlongLine { generation, line },
                );
            }
            ServerEvent::Unsent { lines } => self.on_unsent(lines, now),
            ServerEvent::Refused {
                lines,
                why,
                retry_after,
            } => self.on_refused(lines, &why, retry_after, now),
            ServerEvent::Draining => {
                // New traffic waits for the next incarnation; what the old
                // one sent is still read.
                if let Link::Up(c) = &mut self.link {
                    c.draining = true;
                }
            }
            ServerEvent::Gone(gone) => self.link_lost(gone, now),
        }
    }

    /// Lines the server was never given (its input failed): the requests
    /// among them cannot have reached it. Call attempts fail as never sent
    /// (always safe to retry); client requests wait for the next server.
    fn on_unsent(&mut self, lines: Vec<Vec<u8>>, now: Instant) {
        warn!(
            "{} message(s) never reached the server; its connection is being closed",
            lines.len()
        );
        if let Link::Up(c) = &mut self.link {
            c.draining = true;
        }
        for line in lines {
            let Some((m, down)) = own_request(line) else {
                continue;
            };
            match self.inflight.remove(&down) {
                Some(Inflight::Client {
                    client_id, method, ..
                }) => {
                    debug!("a request never reached the server; it waits for the next one");
                    self.requeue_request(m, client_id, method, now);
                }
                // The proxy's own requests are made again for the next
                // incarnation (the handshake replay, the tool list).
                Some(Inflight::ToolsList) => self.calls.restart_tools_fetch(),
                Some(Inflight::Replay(_)) => {}
                None => {
                    let why = "the server could not be written to".to_owned();
                    let failure = Failure::NeverSent(why);
                    self.with_calls(now, |c, ctx, out| c.on_unanswered(down, failure, ctx, out));
                }
            }
        }
    }

    /// Lines the server refused without acting on them (it is still up):
    /// call attempts fail as refused (retried after the hint, whatever the
    /// tool), client requests are answered with the refusal and the hint.
    fn on_refused(
        &mut self,
        lines: Vec<Vec<u8>>,
        why: &str,
        retry_after: Option<Duration>,
        now: Instant,
    ) {
        for line in lines {
            let Some((_, down)) = own_request(line) else {
                continue;
            };
            match self.inflight.remove(&down) {
                Some(Inflight::Client { client_id, .. }) => {
                    let data = retry_after
                        .map(|d| format!("{{\"retryAfterMs\":{}}}", d.as_millis()))
                        .unwrap_or_else(|| "{}".into());
                    let message = format!("the MCP server refused the request ({why})");
                    let error = jsonrpc::error_object(-32000, &message, Some(&data));
                    let line = jsonrpc::error_response_line(&client_id, &error);
                    self.answer(&client_id, line);
                }
                Some(Inflight::ToolsList) => self.calls.restart_tools_fetch(),
                Some(Inflight::Replay(_)) => {}
                None => {
                    let failure = Failure::Refused(why.to_owned(), retry_after);
                    self.with_calls(now, |c, ctx, out| c.on_unanswered(down, failure, ctx, out));
                }
            }
        }
    }

    /// The current incarnation is gone: answer or re-plan everything that
    /// waited on it, then restart it unless the session is ending.
    pub(super) fn link_lost(&mut self, gone: Gone, now: Instant) {
        let old = std::mem::replace(
            &mut self.link,
            Link::Down {
                reason: Reason::ServerExited,
                message: String::new(),
            },
        );
        let Link::Up(conn) = old else {
            self.link = old;
            return;
        };
        let how = gone.how;
        let stopping = matches!(self.phase, Phase::Stopping { .. });
        let mut message = format!("the MCP server {} {how}", conn.server.describe());
        if !stopping {
            let tail = conn.server.diagnostics();
            if let Some(line) = crate::redact::pick_line(&tail) {
                message.push_str(&format!("; its stderr said: {}", line.trim()));
            }
        }
        if stopping {
            debug!("{message}");
            self.link = Link::Down {
                reason: Reason::ServerExited,
                message: message.clone(),
            };
        } else {
            crate::error!("{message}");
            let failed_start = !conn.ready || !conn.answered;
            // The restart backoff is for servers that cannot get going. One
            // that stayed up, or answered the client since it started, is
            // restarted at once: otherwise a server that crashes on a rare
            // call would be down for longer after every such call.
            if conn.served || now.saturating_duration_since(conn.started) >= STABLE_AFTER {
                self.restarts = 0;
            }
            // While requests are re-planned below, they wait for the restart.
            self.link = Link::Restarting {
                message: message.clone(),
                at: now,
            };
            if failed_start {
                self.with_calls(now, |c, ctx, out| c.server_failed(ctx, out));
            }
        }
        drop(conn);

        // Call attempts in flight failed; the policies decide.
        let may_have_received = gone.may_have_received;
        self.with_calls(now, |c, ctx, out| {
            c.on_link_lost(&message, may_have_received, stopping, ctx, out)
        });
        // Other requests: reads are sent again, the rest answered.
        let mut lost: Vec<(u64, Inflight)> = self.inflight.drain().collect();
        lost.sort_by_key(|(down, _)| *down);
        for (_, f) in lost {
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
                    debug!("sending a read request again after the restart");
                    self.requeue_request(m, client_id, method, now);
                }
                _ => self.answer_proxy_error(&client_id, Reason::ServerExited, &message),
            }
        }
        // Requests from the dead server the client has not answered yet.
        let mut open: Vec<u64> = self.server_requests.keys().copied().collect();
        open.sort();
        for id in open {
            self.close_server_request(id, now);
            let params = format!("{{\"requestId\":{id},\"reason\":\"the MCP server exited\"}}");
            self.send_client(jsonrpc::notification_line(
                "notifications/cancelled",
                Some(&params),
            ));
        }
        if !stopping {
            self.schedule_restart(now);
        }
    }

    fn requeue_request(&mut self, m: Message, client_id: String, method: Method, now: Instant) {
        match self.enqueue(
            Queued::Request {
                m,
                client_id: client_id.clone(),
                method,
            },
            now,
        ) {
            Some(seq) => {
                if let Some(r) = self.client_requests.get_mut(&client_id) {
                    r.queued = Some(seq);
                    r.downstream = None;
                }
            }
            None => {
                let msg = "the MCP server is restarting and too many requests are waiting";
                self.answer_proxy_error(&client_id, Reason::ServerUnavailable, msg);
            }
        }
    }

    /// A start that did not get as far as a working server.
    fn failed_start(&mut self, message: String, now: Instant) {
        self.with_calls(now, |c, ctx, out| c.server_failed(ctx, out));
        self.link = Link::Restarting { message, at: now };
        self.schedule_restart(now);
    }

    /// Answers everything queued: the server will not be there soon.
    fn refuse_queue(&mut self, now: Instant) {
        let seqs: Vec<u64> = self.queue.iter().map(|(s, ..)| *s).collect();
        for seq in seqs {
            self.queue_give_up(seq, now, "stopped waiting after");
        }
    }

    /// Plans the next start: at once the first time, then with growing
    /// delays; not at all while the breaker is open.
    fn schedule_restart(&mut self, now: Instant) {
        let message = self.link_message();
        if let BreakerState::Open { until } = self.calls.breaker_state() {
            if *until > now {
                warn!(
                    "not restarting the server while the circuit breaker is open; the first request after {:.0}s will",
                    until.saturating_duration_since(now).as_secs_f64()
                );
                self.link = Link::Dormant { message };
                self.refuse_queue(now);
                self.give_up_deferred_tools(now);
                return;
            }
        }
        let delay = if self.restarts == 0 {
            Duration::ZERO
        } else {
            Backoff::new(Duration::from_millis(500), Duration::from_secs(30), 0.2)
                .delay(self.restarts, &mut self.rng)
        };
        self.restarts += 1;
        if !delay.is_zero() {
            info!("restarting the server in {:.1}s", delay.as_secs_f64());
        }
        self.restart_seq += 1;
        let seq = self.restart_seq;
        let at = now + delay;
        self.set_timer(at, Timer::Restart { seq });
        self.link = Link::Restarting { message, at };
        if delay > WAIT_FOR_RESTART {
            // Too long to keep requests waiting.
            self.refuse_queue(now);
            self.give_up_deferred_tools(now);
        }
    }

    /// The restart timer fired.
    pub(super) fn restart_due(&mut self, seq: u64, now: Instant) {
        if seq == self.restart_seq && matches!(self.link, Link::Restarting { .. }) {
            self.traced(|t| t.respawned(now));
            self.start_server(now);
        }
    }

    /// A line over `max_message_bytes` was still being written after
    /// `call_timeout`: the server's output is unusable (every answer waits
    /// behind a line that is dropped anyway), so it is stopped and, like
    /// after a crash, started again.
    pub(super) fn overlong_line_due(&mut self, generation: u64, line: u64) {
        if generation != self.generation {
            return;
        }
        let secs = self.cfg.call_timeout.as_secs_f64();
        let max = self.cfg.max_message_bytes;
        if let Link::Up(c) = &mut self.link {
            if c.in_overlong && c.overlong_lines == line {
                warn!(
                    "the server has been writing one line over max_message_bytes ({max}) for {secs:.1}s; its output is unusable; stopping it"
                );
                c.server.kill();
            }
        }
    }

    /// The replayed initialize was not answered in time.
    pub(super) fn replay_timed_out(&mut self, generation: u64) {
        if generation != self.generation {
            return;
        }
        if let Link::Up(c) = &mut self.link {
            if !c.ready {
                warn!("the restarted server did not answer initialize in time; stopping it");
                c.server.kill();
            }
        }
    }

    /// Sends a line to the current incarnation; false if there is none.
    pub(super) fn send_server(&mut self, line: Vec<u8>) -> bool {
        match &mut self.link {
            Link::Up(c) if self.eager => c.server.send_now(line),
            Link::Up(c) => c.server.send(line),
            _ => false,
        }
    }

    /// Whether a restart that is expected to work is under way.
    pub(super) fn link_restarting(&self, now: Instant) -> bool {
        match &self.link {
            Link::Restarting { at, .. } => *at <= now + WAIT_FOR_RESTART,
            Link::Up(c) => !c.ready || c.draining,
            _ => false,
        }
    }

    /// The incarnation that would answer a request sent now (the next one
    /// while restarting).
    pub(super) fn generation_to_ask(&self) -> u64 {
        match self.link {
            Link::Up(_) => self.generation,
            _ => self.generation + 1,
        }
    }

    /// Whether the link can carry the proxy's own requests now.
    pub(super) fn link_ready(&self) -> bool {
        matches!(&self.link, Link::Up(c) if c.ready && !c.draining)
    }
}

/// One of the proxy's own lines to the server, read back: the message and
/// its downstream id (`None` for a notification or anything not ours).
fn own_request(line: Vec<u8>) -> Option<(Message, u64)> {
    let text = String::from_utf8(line).ok()?;
    let m = Message::reparse(text.trim_end().to_owned())?;
    let down = m.id()?.parse::<u64>().ok()?;
    Some((m, down))
}
