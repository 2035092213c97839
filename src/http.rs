//! The Streamable HTTP transport: a remote server at `url:` reached with
//! blocking HTTP/1.1 (ureq), behind the same [`Downstream`] boundary as a
//! stdio child, in both eras of the protocol: the sessions of 2025-03-26 to
//! 2025-11-25, and the sessionless requests of 2026-07-28, told apart per
//! message (a 2026-07-28 request names its version in `_meta`).
//!
//! Each line the dispatcher sends becomes one POST, made by one of a pool
//! of `http-post` threads (requests; it grows on demand, from `POOL` to
//! `POOL_MAX`, when no thread is idle). A JSON answer or the events of
//! an SSE answer are reported in the order they came, the POST's own answer
//! last; a notification or a response gets 202. The session id the server
//! sets on `initialize` and the negotiated protocol version go on every
//! later request. After `notifications/initialized`, an `http-get` thread keeps
//! the server's own stream open (405: the server has none), re-opening it
//! with backoff. Ids are left alone: the dispatcher already owns them.
//!
//! 2026-07-28 requests carry no session but the headers their body
//! implies (`modern.rs`): `MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`
//! and `Mcp-Param-*` from the tools' `x-mcp-header` annotations, learned
//! from the `tools/list` answers passing by (tools with invalid annotations
//! are left out of those). A `HeaderMismatch` answer to a `tools/call` has
//! the tools read again (by a request of our own) and the call sent once
//! more. Their streams are never resumed.
//!
//! An answer stream (2025 era) that breaks, or ends without the response,
//! after events with ids is resumed with GET and `Last-Event-ID`, on the
//! same thread, as the state machine of `resume.rs` decides: a server with an event store replays what followed, and
//! the call is not run again. Responses to other requests are dropped from
//! a replay (and one to a request already answered, by the dispatcher, as
//! any late duplicate); events are never told apart by id, an opaque
//! cursor that may repeat, and notifications are relayed as they come.
//! Only the last id of a stream is kept, and not one over 1 KiB (that
//! stream cannot be resumed from there). An answer stream that brings an
//! event over `max_message_bytes` and no response has answered with it:
//! the request gets the final "too large" error, as for a JSON body, and
//! is neither resumed nor failed as broken. Only when that fails is the
//! failure classified.
//!
//! Failures are classified by `classify.rs` and become the boundary's
//! events: a request that cannot have left (DNS, refused, TLS, its body not
//! completely written) is `Unsent` and the connection `Gone` (nothing
//! received), so the dispatcher resends it after reconnecting; so is an
//! `initialize` answered with 5xx, 408, 429 or a broken connection (a
//! failed start, which the link retries with its backoff); a stream that
//! broke after sending is that request's `Failed` (it may have run: the
//! dispatcher's safety gate decides), and the session and the other
//! requests go on (a server that really went away is found by the next
//! POST: refused, or a 404 for the session); a lost session is `Unsent`
//! plus `Gone`, so the link
//! re-initializes and the message goes again; 429 and 503 with
//! `Retry-After` are `Refused` (not run, retried after the hint);
//! 500/502/503/504 are `Failed`, may have run; other statuses are
//! `Failed`, not run (2026-07-28: the server's own JSON-RPC error, when it
//! sent one, is its answer). The transport never makes up a JSON-RPC
//! answer: the dispatcher answers with the proxy's error. Header
//! values are secrets: they never appear in a message, and the server's
//! text is scrubbed of them. When the connection is gone, the lines still
//! queued for the POST threads are reported `Unsent` first.
//!
//! Lines that are not requests (notifications, cancels, answers to the
//! server's requests) go to two `http-note` threads of their own, each
//! POST within 2 s in all, so they never wait behind long calls.
//!
//! A cancel closes the cancelled request's stream: in the 2025 era once
//! `notifications/cancelled` was posted (within `CANCEL_GRACE`); in
//! 2026-07-28 instead of posting it (closing is the cancel there). Our
//! connector (`conn.rs`) shuts that one socket down, so the reader returns
//! at once; a request not posted yet is not posted at all. Closing the
//! connection (`shutdown` after its DELETE, `kill`, or dropping it) shuts
//! the agent down, which interrupts every request in flight, the GET
//! stream's included. Otherwise a POST waits at most `call_timeout` + 5 s
//! for its answer's headers and max(`call_timeout`,
//! `retry.total_timeout`) + 5 s for its body (`subscriptions/listen`: no
//! limit), so a stuck server holds a pool thread no longer than that. Knows
//! no policy; of MCP, only what the transport itself must act on:
//! `initialize`, `notifications/initialized`, `notifications/cancelled`,
//! `tools/list` and `tools/call` in 2026-07-28.

#![forbid(unsafe_code)]

pub mod classify;
mod conn;
mod modern;
pub mod resume;
pub mod sse;

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use crate::config::{check_header, ServerConfig};
use crate::downstream::{Downstream, Failure, Gone, Heal, OnEvent, OutKind, Outgoing, ServerEvent};
use crate::jsonrpc::{self, Message, RawObject};
use crate::stdio::Backlog;

use classify::Class;
use conn::Exchange;

/// Threads making POSTs that are always there.
const POOL: usize = 8;
/// Most threads making POSTs: a request that finds none idle starts one,
/// up to this many (after an outage, the calls that waited go out at
/// once); calls in flight beyond it wait their turn. One beyond `POOL`
/// that has been idle for [`POOL_IDLE_EXIT`] ends.
const POOL_MAX: usize = 64;
const POOL_IDLE_EXIT: Duration = Duration::from_secs(30);
/// Threads posting what is not a request (notifications, cancels, answers
/// to the server's requests), so that they never wait behind long calls.
const NOTE_POOL: usize = 2;
/// How long such a POST may take in all, plus a second per MiB it carries
/// (an answer to `sampling/createMessage` may hold an image): the server
/// only acknowledges it. See [`note_timeout`].
const NOTE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a 2025-era cancel's POST may take, and so delay closing the
/// call's stream: a server slow to take the cancel does not keep it open.
const CANCEL_GRACE: Duration = Duration::from_secs(1);
/// Idle connections are dropped before the servers' usual 5 s keep-alive
/// ends, so a request never goes out on a connection the server is closing.
const MAX_IDLE_AGE: Duration = Duration::from_secs(4);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How much of an error answer's body is read for its message.
const ERROR_BODY_LIMIT: u64 = 64 * 1024;
/// The GET stream's reconnection delays: 1 s, growing ×1.5, at most 30 s.
const GET_RETRY_FIRST: Duration = Duration::from_secs(1);
const GET_RETRY_MAX: Duration = Duration::from_secs(30);
/// The shortest wait before the GET stream is opened again, whatever its
/// `retry` (`retry: 0` must not make a busy loop).
const GET_RETRY_MIN: Duration = resume::RETRY_MIN;
/// How long `headers_helper` may run.
const HELPER_TIMEOUT: Duration = Duration::from_secs(10);
/// Cancels remembered for requests not posted yet.
const EARLY_CANCELS: usize = 1024;
/// Most pages of `tools/list` read after a header mismatch.
const RELIST_PAGES: usize = 100;

/// Splits `Name: value` (the CLI's `--header`) at its first colon.
pub fn split_header(text: &str) -> Result<(String, String), String> {
    let Some((name, value)) = text.split_once(':') else {
        return Err("expected \"Name: value\"".into());
    };
    let (name, value) = (name.trim().to_owned(), value.trim().to_owned());
    check_header(&name, &value)?;
    Ok((name, value))
}

/// `url` without its query and user info, for messages.
pub fn display_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let host = authority.rsplit('@').next().unwrap_or(authority);
    format!("{scheme}://{host}{path}")
}

/// Connects to the remote server `cfg` names. Nothing is sent yet.
pub fn connect(cfg: &ServerConfig, on_event: OnEvent) -> Result<Http, String> {
    let shown = display_url(&cfg.url);
    if cfg.url.starts_with("https://") && !cfg!(feature = "tls") {
        return Err(format!(
            "{shown}: this build has no TLS support (the cargo feature tls is off)"
        ));
    }
    #[cfg_attr(not(feature = "tls"), allow(unused_mut))]
    let mut config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .max_idle_age(MAX_IDLE_AGE)
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .user_agent(concat!("mcp-retry/", env!("CARGO_PKG_VERSION")));
    if let Some(file) = &cfg.ca_file {
        #[cfg(feature = "tls")]
        {
            config = config.tls_config(tls_config(file)?);
        }
        #[cfg(not(feature = "tls"))]
        return Err(format!(
            "ca_file {}: this build has no TLS support (the cargo feature tls is off)",
            file.display()
        ));
    }
    let agent = ureq::Agent::with_parts(
        config.build(),
        conn::Connector::new(),
        ureq::unversioned::resolver::DefaultResolver::default(),
    );
    let (jobs, rx) = crossbeam_channel::unbounded::<Job>();
    let (notes, notes_rx) = crossbeam_channel::unbounded::<Job>();
    let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
    let shared = Arc::new(Shared {
        url: cfg.url.clone(),
        shown: shown.clone(),
        agent,
        headers: cfg.headers.clone(),
        helper: cfg.headers_helper.clone(),
        helper_env: cfg.env.clone(),
        helper_cwd: cfg.cwd.clone(),
        helper_headers: Mutex::new(None),
        needs_fix: AtomicBool::new(false),
        order: Arc::new(Order::new()),
        posters: AtomicUsize::new(POOL),
        idle_posters: AtomicUsize::new(0),
        session: Mutex::new(SessionState::default()),
        exchanges: Mutex::new(Exchanges::default()),
        tool_headers: Mutex::new(HashMap::new()),
        own_requests: AtomicUsize::new(0),
        warned_tools: Mutex::new(HashSet::new()),
        on_event,
        closed: AtomicBool::new(false),
        gone: Mutex::new(false),
        requests: AtomicUsize::new(0),
        max_message_bytes: cfg.max_message_bytes,
        recv_response: cfg.call_timeout + Duration::from_secs(5),
        recv_body: cfg.call_timeout.max(cfg.retry.total_timeout) + Duration::from_secs(5),
        stopped,
        queued: [rx.clone(), notes_rx.clone()],
        backlog: Backlog::new(crate::child::STDIN_BACKLOG),
    });
    for n in 0..POOL {
        spawn_poster(&shared, &rx, "http-post", n, false)
            .map_err(|e| format!("cannot start the HTTP threads: {e}"))?;
    }
    for n in 0..NOTE_POOL {
        spawn_poster(&shared, &notes_rx, "http-note", n, false)
            .map_err(|e| format!("cannot start the HTTP threads: {e}"))?;
    }
    Ok(Http {
        shared,
        posts: rx,
        next_seq: 0,
        jobs: Some(jobs),
        notes: Some(notes),
        stop: Some(stop),
        shown,
    })
}

#[cfg(feature = "tls")]
fn tls_config(file: &std::path::Path) -> Result<ureq::tls::TlsConfig, String> {
    use ureq::tls::{PemItem, RootCerts, TlsConfig};
    let pem =
        std::fs::read(file).map_err(|e| format!("cannot read ca_file {}: {e}", file.display()))?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        match item {
            Ok(PemItem::Certificate(c)) => certs.push(c),
            Ok(_) => {}
            Err(e) => return Err(format!("ca_file {}: {e}", file.display())),
        }
    }
    if certs.is_empty() {
        return Err(format!("ca_file {}: no certificate in it", file.display()));
    }
    Ok(TlsConfig::builder()
        .root_certs(RootCerts::new_with_certs(&certs))
        .build())
}

/// A connection to a remote server: one MCP session (2025 era), or the
/// sessionless requests of the 2026-07-28 era.
pub struct Http {
    shared: Arc<Shared>,
    /// The POST threads' queue for requests; dropped when the connection
    /// closes. `posts` is its receiving end, for the threads started on
    /// demand.
    jobs: Option<Sender<Job>>,
    posts: Receiver<Job>,
    /// The sequence number of the next line sent (see [`Order`]).
    next_seq: u64,
    /// The queue for the rest (notifications, responses).
    notes: Option<Sender<Job>>,
    /// Dropped to wake the GET thread from its reconnection wait.
    stop: Option<Sender<()>>,
    shown: String,
}

struct Shared {
    url: String,
    shown: String,
    agent: ureq::Agent,
    headers: Vec<(String, String)>,
    helper: Option<String>,
    helper_env: Vec<(String, String)>,
    helper_cwd: Option<std::path::PathBuf>,
    /// What `headers_helper` printed last; `None` before its first run.
    helper_headers: Mutex<Option<Vec<(String, String)>>>,
    /// The order POSTs start in.
    order: Arc<Order>,
    /// POST threads for requests, and how many of them wait for work.
    posters: AtomicUsize,
    idle_posters: AtomicUsize,
    /// A request could not be sent for a reason waiting does not heal
    /// (an unknown host, TLS): `Gone` says so.
    needs_fix: AtomicBool,
    session: Mutex<SessionState>,
    /// The requests being posted, by the proxy's id, for cancelling them.
    exchanges: Mutex<Exchanges>,
    /// 2026-07-28: the `x-mcp-header` annotations of each tool, as the
    /// server listed them last.
    tool_headers: Mutex<HashMap<String, modern::HeaderMap>>,
    /// Numbers our own requests (`tools/list` after a header mismatch).
    own_requests: AtomicUsize,
    /// Tools whose invalid `x-mcp-header` was warned about.
    warned_tools: Mutex<HashSet<String>>,
    on_event: OnEvent,
    /// No more lines are taken (shutdown, kill, drop, or gone).
    closed: AtomicBool,
    /// `Gone` was reported. Held while an event is reported, which may
    /// block (the client is behind): the dispatcher's thread never takes it.
    gone: Mutex<bool>,
    /// Requests (not notifications) being posted.
    requests: AtomicUsize,
    max_message_bytes: usize,
    recv_response: Duration,
    recv_body: Duration,
    stopped: Receiver<()>,
    /// The POST threads' queues (requests, then the rest), for the lines
    /// no thread took when the connection is gone.
    queued: [Receiver<Job>; 2],
    /// The bytes of the lines in `queued`, held to the stdio transport's
    /// limit: past it the client's reader waits, so a server that takes
    /// requests slower than the client sends them cannot make the queues
    /// grow without bound.
    backlog: Arc<Backlog>,
}

/// Where a request's answer stream is: its last event id and `retry`.
#[derive(Default)]
struct Cursor {
    last_id: Option<String>,
    retry: Option<Duration>,
    /// Times the last event id moved on, so far: events the resumptions
    /// have not brought before.
    fresh: usize,
    /// The size of an event over `max_message_bytes` that came while the
    /// response had not: that response, most likely.
    too_long: Option<usize>,
    /// The stream read last set `retry`.
    stream_retry: bool,
}

#[derive(Default)]
struct SessionState {
    id: Option<String>,
    protocol_version: Option<String>,
    get_started: bool,
    /// The 2026-07-28 version the client's requests name, once one did.
    modern: Option<String>,
}

/// The requests in flight, and cancels that came before their request.
#[derive(Default)]
struct Exchanges {
    live: HashMap<u64, Live>,
    early: HashSet<u64>,
    early_order: VecDeque<u64>,
}

struct Live {
    exchange: Arc<Exchange>,
    modern: bool,
}

impl Exchanges {
    /// Remembers (a bounded number of) cancels for requests not being
    /// posted yet: such a request is then not sent at all.
    fn cancel_early(&mut self, id: u64) {
        if self.early.insert(id) {
            self.early_order.push_back(id);
            if self.early_order.len() > EARLY_CANCELS {
                if let Some(old) = self.early_order.pop_front() {
                    self.early.remove(&old);
                }
            }
        }
    }
}

/// One message being posted.
struct Post<'a> {
    out: &'a Outgoing,
    /// Its params are read for the headers they decide (the 2026-07-28
    /// `_meta` version, `Mcp-Name`, `x-mcp-header` arguments).
    msg: Option<Message>,
    method: Option<&'a str>,
    /// A request's id (None for a notification or a response), and as it
    /// is written in the line, which is how the server's answer names it.
    request_id: Option<u64>,
    id_text: Option<String>,
    /// The 2026-07-28 version it is sent under (none: the 2025 era).
    modern: Option<String>,
    exchange: Arc<Exchange>,
    /// Its place in the order lines start in.
    turn: Turn,
}

impl Post<'_> {
    fn is(&self, method: &str) -> bool {
        self.method == Some(method)
    }

    fn params(&self) -> Option<&str> {
        self.msg.as_ref().and_then(Message::params)
    }

    /// What its answer is read until, and how.
    fn until(&self) -> Option<Until<'_>> {
        Some(Until {
            id: self.id_text.as_deref()?,
            initialize: self.is("initialize"),
            screen_tools: self.modern.is_some() && self.is("tools/list"),
        })
    }
}

/// The response an answer stream is read until.
struct Until<'a> {
    /// Its id, as written.
    id: &'a str,
    /// It answers `initialize`: it names the protocol version.
    initialize: bool,
    /// It answers a 2026-07-28 `tools/list`: tools with invalid
    /// `x-mcp-header` annotations are dropped, the others' learned.
    screen_tools: bool,
}

impl Downstream for Http {
    fn send(&mut self, out: Outgoing) -> bool {
        if self.shared.is_closed() {
            return false;
        }
        if let OutKind::Cancel { target } = out.kind {
            if !self.shared.cancel(target) {
                return true;
            }
        }
        let is_request = out.request_id().is_some();
        let queue = match is_request {
            true => &self.jobs,
            false => &self.notes,
        };
        let Some(queue) = queue else {
            return false;
        };
        // Counted before a thread can take it (and count it out).
        let n = out.bytes.len();
        self.shared.backlog.add(n);
        let seq = self.next_seq;
        self.next_seq += 1;
        let sent = queue.send(Job::Post(Line { seq, out })).is_ok();
        if !sent {
            self.shared.order.skip(seq);
        }
        if !sent {
            self.shared.backlog.remove(n);
        } else if is_request {
            self.more_posters();
        }
        sent
    }

    fn shutdown(&mut self, step: Duration) {
        self.finish(Some(step), "was closed");
    }

    fn kill(&mut self) {
        self.finish(None, "was disconnected");
    }

    fn input_backlog(&self) -> Option<Arc<Backlog>> {
        Some(self.shared.backlog.clone())
    }

    fn describe(&self) -> String {
        self.shown.clone()
    }

    fn diagnostics(&self) -> Vec<String> {
        Vec::new()
    }
}

impl Http {
    /// Stops taking lines and has an `http-note` thread end the
    /// connection: end the session within `delete`, if given (else every
    /// exchange is interrupted at once), and report `Gone`. Not on the
    /// caller's thread: a transport thread reporting a message may hold
    /// the lock `Gone` needs while the client is behind, and the caller is
    /// the dispatcher, which must not wait for that.
    fn finish(&mut self, delete: Option<Duration>, how: &'static str) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.shared.backlog.close();
        if delete.is_none() {
            self.shared.agent.clone().shutdown();
        }
        let closing = self
            .notes
            .as_ref()
            .map(|n| n.send(Job::Close { delete, how }));
        if closing.is_none_or(|sent| sent.is_err()) {
            // No thread is left to take it (they all ended): nothing
            // reports messages any more either.
            self.shared.agent.clone().shutdown();
            self.shared.gone(how, true);
        }
        self.close();
    }

    fn close(&mut self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.shared.backlog.close();
        self.jobs = None;
        self.notes = None;
        self.stop = None;
    }
}

impl Http {
    /// A request was queued: if more wait than POST threads wait for
    /// work, one more is started (up to [`POOL_MAX`]).
    fn more_posters(&self) {
        let shared = &self.shared;
        if shared.idle_posters.load(Ordering::SeqCst) >= self.posts.len() {
            return;
        }
        let n = shared.posters.fetch_add(1, Ordering::SeqCst);
        if n >= POOL_MAX {
            shared.posters.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        if let Err(e) = spawn_poster(shared, &self.posts, "http-post", n, true) {
            shared.posters.fetch_sub(1, Ordering::SeqCst);
            crate::debug!("cannot start another HTTP thread: {e}");
        }
    }
}

/// A line for a POST thread, with its place in the order lines were sent.
struct Line {
    seq: u64,
    out: Outgoing,
}

/// Work for a POST thread.
enum Job {
    Post(Line),
    /// The connection is closed on purpose (see [`Http::finish`]).
    Close {
        delete: Option<Duration>,
        how: &'static str,
    },
}

/// The order POSTs start in. Lines are sent in order but taken by several
/// threads: a line starts once every line sent before it is released — a
/// request once its body is completely written, a notification or a
/// response once its POST was answered (202), `notifications/initialized`
/// once the server's own GET stream was answered — so a server never sees
/// `tools/list` before `notifications/initialized`. A line waits at most
/// [`ORDER_WAIT`] for those before it: a server that never acknowledges a
/// notification delays the rest by no more.
struct Order {
    state: Mutex<OrderState>,
    moved: parking_lot::Condvar,
}

#[derive(Default)]
struct OrderState {
    /// Every line below this one is released.
    below: u64,
    /// Lines above `below` released out of turn.
    released: std::collections::BTreeSet<u64>,
}

/// How long a line waits for the lines sent before it to be released.
const ORDER_WAIT: Duration = Duration::from_secs(2);

impl Order {
    fn new() -> Order {
        Order {
            state: Mutex::new(OrderState::default()),
            moved: parking_lot::Condvar::new(),
        }
    }

    /// Waits until every line before `seq` is released (or `ORDER_WAIT`).
    fn wait(&self, seq: u64) {
        let deadline = Instant::now() + ORDER_WAIT;
        let mut st = self.state.lock();
        while st.below < seq {
            if self.moved.wait_until(&mut st, deadline).timed_out() {
                // Given up on: no later line waits for those again.
                st.below = seq;
                let later = st.released.split_off(&seq);
                st.released = later;
                return crate::debug!(
                    "line {seq} starts without waiting longer for those before it"
                );
            }
        }
    }

    /// Line `seq` no longer holds the lines after it back.
    fn release(&self, seq: u64) {
        let mut st = self.state.lock();
        if seq < st.below {
            return;
        }
        st.released.insert(seq);
        loop {
            let below = st.below;
            if !st.released.remove(&below) {
                break;
            }
            st.below += 1;
        }
        self.moved.notify_all();
    }

    /// Line `seq` was never queued.
    fn skip(&self, seq: u64) {
        self.release(seq);
    }
}

/// One line's place in the [`Order`]: released once, explicitly, or when
/// the last holder lets it go.
#[derive(Clone)]
struct Turn(Arc<TurnInner>);

struct TurnInner {
    order: Arc<Order>,
    seq: u64,
    released: AtomicBool,
    /// Another thread releases it (the GET stream's, for `initialized`).
    handed: AtomicBool,
}

impl Turn {
    /// Line `seq`'s turn, once the lines before it are released.
    fn wait(order: &Arc<Order>, seq: u64) -> Turn {
        order.wait(seq);
        Turn(Arc::new(TurnInner {
            order: order.clone(),
            seq,
            released: AtomicBool::new(false),
            handed: AtomicBool::new(false),
        }))
    }

    fn release(&self) {
        if !self.0.released.swap(true, Ordering::SeqCst) {
            self.0.order.release(self.0.seq);
        }
    }

    /// The turn, for a thread that releases it later.
    fn hand_off(&self) -> Turn {
        self.0.handed.store(true, Ordering::SeqCst);
        self.clone()
    }
}

impl Drop for TurnInner {
    fn drop(&mut self) {
        if !self.released.swap(true, Ordering::SeqCst) {
            self.order.release(self.seq);
        }
    }
}

/// Releases a POST's turn when the POST is over, unless it was handed off.
struct TurnDone(Turn);

impl Drop for TurnDone {
    fn drop(&mut self) {
        if !self.0 .0.handed.load(Ordering::SeqCst) {
            self.0.release();
        }
    }
}

/// Starts a thread posting the lines of `rx`. One started on demand
/// (`extra`) ends after [`POOL_IDLE_EXIT`] without work while more than
/// [`POOL`] post requests; every one ends when the queue closes.
fn spawn_poster(
    shared: &Arc<Shared>,
    rx: &Receiver<Job>,
    name: &str,
    n: usize,
    extra: bool,
) -> std::io::Result<()> {
    let shared = shared.clone();
    let rx = rx.clone();
    let counts = name == "http-post";
    let thread = shared.clone();
    thread
        .spawn(&format!("{name}-{n}"), move || loop {
            if counts {
                shared.idle_posters.fetch_add(1, Ordering::SeqCst);
            }
            let next = match extra {
                true => rx.recv_timeout(POOL_IDLE_EXIT),
                false => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            if counts {
                shared.idle_posters.fetch_sub(1, Ordering::SeqCst);
            }
            match next {
                Ok(Job::Post(line)) => {
                    shared.backlog.remove(line.out.bytes.len());
                    shared.post(line);
                }
                Ok(Job::Close { delete, how }) => {
                    if let Some(step) = delete {
                        shared.delete_session(step);
                    }
                    shared.agent.clone().shutdown();
                    shared.gone(how, true);
                }
                Err(RecvTimeoutError::Timeout) => {
                    let fewer =
                        shared
                            .posters
                            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                                (t > POOL).then(|| t - 1)
                            });
                    if fewer.is_ok() {
                        return;
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return,
            }
        })
        .map(|_| ())
}

impl Drop for Http {
    /// Interrupts every request still in flight: their readers return at
    /// once (the dispatcher drops a connection after `Gone`, when what it
    /// was waiting for is already decided).
    fn drop(&mut self) {
        self.close();
        self.shared.agent.clone().shutdown();
    }
}

impl Shared {
    /// Reports an event unless the connection was already reported gone.
    fn emit(&self, event: ServerEvent) {
        let gone = self.gone.lock();
        if !*gone {
            (self.on_event)(event);
        }
    }

    /// Reports `Gone`, once; nothing is reported after it. When the
    /// connection failed (it was not closed on purpose), the lines still
    /// queued, which no thread took, are reported `Unsent` first.
    fn gone(&self, how: &str, may_have_received: bool) {
        let mut gone = self.gone.lock();
        if *gone {
            return;
        }
        *gone = true;
        if !self.closed.swap(true, Ordering::SeqCst) {
            let lines: Vec<Outgoing> = self
                .queued
                .iter()
                .flat_map(|q| q.try_iter())
                .filter_map(|job| match job {
                    Job::Post(l) => {
                        self.order.skip(l.seq);
                        Some(l.out)
                    }
                    Job::Close { .. } => None,
                })
                .collect();
            self.backlog.close();
            if !lines.is_empty() {
                let why = format!("the connection ended before it was posted ({how})");
                (self.on_event)(ServerEvent::Unsent { lines, why });
            }
        }
        // An unknown host or a certificate problem is not healed by
        // waiting; anything else (refused, reset, a lost session) may be.
        let heal = match self.needs_fix.load(Ordering::SeqCst) {
            true => Heal::Fix,
            false => Heal::Wait,
        };
        (self.on_event)(ServerEvent::Gone(Gone {
            how: how.to_owned(),
            may_have_received,
            heal,
        }));
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Starts a thread of this connection. A panic in it (a bug) is
    /// logged and ends the connection (`Gone`), so that nothing waits for
    /// what the thread was doing; the link is then opened again.
    fn spawn(
        self: &Arc<Shared>,
        name: &str,
        f: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let shared = self.clone();
        crate::guard::spawn(
            name,
            "the connection to the server is dropped",
            f,
            move || {
                shared.gone(
                    "an internal error in mcp-retry dropped the connection",
                    true,
                )
            },
        )
    }

    /// The configured headers, then those of `headers_helper` (run the
    /// first time, or again when `refresh`).
    fn headers(&self, refresh: bool) -> Vec<(String, String)> {
        let mut out = self.headers.clone();
        if let Some(helper) = &self.helper {
            let mut cached = self.helper_headers.lock();
            if cached.is_none() || refresh {
                *cached = Some(
                    match run_helper(helper, &self.helper_env, &self.helper_cwd) {
                        Ok(h) => h,
                        Err(why) => {
                            crate::warn!("headers_helper of {}: {why}", self.shown);
                            Vec::new()
                        }
                    },
                );
            }
            for (name, value) in cached.iter().flatten() {
                out.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
                out.push((name.clone(), value.clone()));
            }
        }
        out
    }

    /// `req` with the protocol's `headers`, then the configured ones (and
    /// `headers_helper`'s, run again when `refresh`).
    fn headed<B>(
        &self,
        mut req: ureq::RequestBuilder<B>,
        headers: Vec<(String, String)>,
        refresh: bool,
    ) -> ureq::RequestBuilder<B> {
        for (name, value) in headers.into_iter().chain(self.headers(refresh)) {
            req = req.header(name, value);
        }
        req
    }

    /// The 2025-era session headers: the session id and the negotiated
    /// version, once `initialize` set them.
    fn session_headers(&self) -> Vec<(String, String)> {
        let s = self.session.lock();
        let mut out = Vec::new();
        if let Some(id) = &s.id {
            out.push(("Mcp-Session-Id".to_owned(), id.clone()));
        }
        if let Some(v) = &s.protocol_version {
            out.push(("MCP-Protocol-Version".to_owned(), v.clone()));
        }
        out
    }

    /// The headers a 2026-07-28 POST mirrors from its body: version,
    /// method, name and, for a `tools/call`, the arguments its tool's
    /// `x-mcp-header` annotations name.
    fn modern_headers(&self, post: &Post, version: &str) -> Vec<(String, String)> {
        let method = post.method.unwrap_or_default();
        let params = post.params();
        let mut out = modern::standard_headers(version, method, params);
        if method == "tools/call" {
            let p = params.and_then(RawObject::parse);
            let name = p.as_ref().and_then(|p| p.string("name"));
            let map = name.and_then(|n| self.tool_headers.lock().get(&n).cloned());
            if let Some(map) = map.filter(|m| !m.is_empty()) {
                let arguments = p
                    .as_ref()
                    .and_then(|p| p.get("arguments"))
                    .and_then(|a| serde_json::from_str(a.get()).ok())
                    .unwrap_or(serde_json::Value::Null);
                out.extend(modern::param_headers(&map, &arguments));
            }
        }
        out
    }

    /// Learns the tools of a screened `tools/list` page.
    fn learn_tools(&self, screened: &modern::Screened) {
        let mut known = self.tool_headers.lock();
        for (name, map) in &screened.tools {
            known.insert(name.clone(), map.clone());
        }
        for (name, why) in &screened.dropped {
            known.remove(name);
            let what = format!(
                "{} lists tool {name:?} with an invalid x-mcp-header ({why}); left out of tools/list",
                self.shown
            );
            if self.warned_tools.lock().insert(name.clone()) {
                crate::warn!("{what}");
            } else {
                crate::debug!("{what}");
            }
        }
    }

    /// `text` with every header value in it replaced, and every word of
    /// one that could be a secret on its own (the token of `Bearer TOKEN`).
    fn scrub(&self, text: &str) -> String {
        let mut text = text.to_owned();
        let helper = self.helper_headers.lock().clone().unwrap_or_default();
        for (_, value) in self.headers.iter().chain(helper.iter()) {
            let words = value.split_whitespace().filter(|w| w.len() >= 8);
            for secret in std::iter::once(value.as_str()).chain(words) {
                if secret.len() >= 4 {
                    text = text.replace(secret, "[redacted]");
                }
            }
        }
        // Copies of them in another case, URL-encoded or in base64.
        let values: Vec<(String, String)> = self
            .headers
            .iter()
            .chain(helper.iter())
            .map(|(_, v)| ("header-secret".to_owned(), v.clone()))
            .collect();
        crate::redact::Redactor::new(&values).redact_secrets(&text)
    }

    /// A cancel for request `id` is to be sent; says whether to POST it.
    /// 2026-07-28: closing the request's stream is the cancel, done here,
    /// and nothing is posted. 2025 era: the cancel is posted (within
    /// [`CANCEL_GRACE`]), and the stream closed when that POST is over
    /// (`post`). A request not being posted yet is not sent at all.
    fn cancel(&self, id: u64) -> bool {
        let mut ex = self.exchanges.lock();
        if let Some(live) = ex.live.get(&id) {
            if live.modern {
                live.exchange.close();
                return false;
            }
            return true;
        }
        ex.cancel_early(id);
        drop(ex);
        self.session.lock().modern.is_none()
    }

    /// Closes the stream of request `id`, if it is still being read.
    fn close_exchange(&self, id: u64) {
        if let Some(live) = self.exchanges.lock().live.get(&id) {
            live.exchange.close();
        }
    }

    /// Posts one line and reports what came of it.
    fn post(self: &Arc<Shared>, line: Line) {
        // Lines start in the order they were sent: this one once the
        // requests before it were written and the notifications before it
        // acknowledged (see `Order`). Released, at the latest, on return.
        let turn = Turn::wait(&self.order, line.seq);
        let _done = TurnDone(turn.clone());
        let out = &line.out;
        if self.is_closed() {
            return;
        }
        // Read for its params only: what it is, the dispatcher said.
        let text = String::from_utf8_lossy(&out.bytes).trim_end().to_owned();
        let msg = Message::reparse(text);
        let method = out.method();
        let request_id = out.request_id();
        let params = msg.as_ref().and_then(Message::params);
        let modern = {
            let mut s = self.session.lock();
            match modern::meta_version(params) {
                Some(v) => {
                    s.modern = Some(v.clone());
                    Some(v)
                }
                // A client that probed with a 2026-07-28 request and then
                // initializes speaks the 2025 era (sessionless, perhaps).
                None if method == Some("initialize") => {
                    s.modern = None;
                    None
                }
                // A notification of a 2026-07-28 client names no version.
                None if request_id.is_none() && s.id.is_none() => s.modern.clone(),
                None => None,
            }
        };
        let post = Post {
            out,
            method,
            request_id,
            id_text: request_id.map(|id| id.to_string()),
            modern,
            msg,
            exchange: Exchange::new(),
            turn: turn.clone(),
        };
        if post.request_id.is_some() {
            // A request lets the next line start once it is written.
            let turn = turn.clone();
            post.exchange.when_written(move || turn.release());
        }
        if let Some(id) = post.request_id {
            let mut ex = self.exchanges.lock();
            if ex.early.remove(&id) {
                crate::debug!("request {id} was cancelled before it was sent");
                return;
            }
            let live = Live {
                exchange: post.exchange.clone(),
                modern: post.modern.is_some(),
            };
            ex.live.insert(id, live);
            self.requests.fetch_add(1, Ordering::SeqCst);
        }
        post.exchange.run(|| self.post_counted(&post));
        if let Some(id) = post.request_id {
            self.exchanges.lock().live.remove(&id);
            self.requests.fetch_sub(1, Ordering::SeqCst);
        }
        if let OutKind::Cancel { target } = out.kind {
            // 2025 era: the cancel was posted; the stream goes too.
            self.close_exchange(target);
        }
    }

    fn post_counted(self: &Arc<Shared>, post: &Post) {
        if post.modern.is_some() {
            let method = post.method.unwrap_or_default();
            if let Some(why) = modern::invalid_header("Mcp-Method", method) {
                // This request alone: nothing is sent, the connection and
                // the other requests go on.
                return self.invalid(post, why);
            }
        }
        let mut refreshed = false;
        let mut relisted = false;
        loop {
            let headers = match &post.modern {
                Some(version) => self.modern_headers(post, version),
                None if post.is("initialize") => {
                    self.session.lock().id = None;
                    Vec::new()
                }
                None => self.session_headers(),
            };
            let sent_session = headers.iter().any(|(n, _)| n == "Mcp-Session-Id");
            let req = self
                .agent
                .post(&self.url)
                .header("Accept", "application/json, text/event-stream")
                .header("Content-Type", "application/json");
            let req = self.headed(req, headers, refreshed);
            // A `subscriptions/listen` stream stays open as long as it is
            // wanted: no deadline for its body.
            let recv_body = (!post.is("subscriptions/listen")).then_some(self.recv_body);
            // What is not a request is only acknowledged (202); a cancel
            // closes its request's stream once it is over.
            let global = match post.out.kind {
                OutKind::Request { .. } => None,
                OutKind::Cancel { .. } => Some(CANCEL_GRACE),
                _ => Some(note_timeout(post.out.bytes.len())),
            };
            post.exchange.begin_request(post.out.bytes.len());
            let result = req
                .config()
                .timeout_recv_response(Some(self.recv_response))
                .timeout_recv_body(recv_body)
                .timeout_global(global)
                .build()
                .send(&post.out.bytes[..]);
            let resp = match result {
                Ok(resp) => resp,
                Err(e) => {
                    let class = classify::of_error(&e, post.exchange.request_written());
                    if class == Class::NeverSent && classify::heal(&e) == Heal::Fix {
                        self.needs_fix.store(true, Ordering::SeqCst);
                    }
                    let why = self.scrub(&e.to_string());
                    return self.failed(post, class, &why, None, "");
                }
            };
            let status = resp.status().as_u16();
            if (200..300).contains(&status) {
                return self.answered(post, resp);
            }
            let retry_after = header(&resp, "retry-after");
            let body = resp
                .into_body()
                .with_config()
                .limit(ERROR_BODY_LIMIT)
                .read_to_string()
                .unwrap_or_default();
            let answer = classify::Answer {
                status,
                retry_after: retry_after.as_deref(),
                sent_session,
                body: &body,
                modern: post.modern.is_some(),
            };
            let class = classify::of_status(&answer, SystemTime::now());
            if class == Class::Unauthorized && self.helper.is_some() && !refreshed {
                crate::info!(
                    "{} answered {}; running headers_helper again",
                    self.shown,
                    classify::status_line(status)
                );
                refreshed = true;
                continue;
            }
            if class == Class::HeaderMismatch && post.is("tools/call") && !relisted {
                relisted = true;
                crate::info!(
                    "{} answered a header mismatch; reading its tools again",
                    self.shown
                );
                if self.relist_tools(post) {
                    continue;
                }
            }
            let why = match server_message(&body) {
                Some(msg) => format!("{}: {}", classify::status_line(status), self.scrub(&msg)),
                None => classify::status_line(status),
            };
            return self.failed(post, class, &why, Some(status), &body);
        }
    }

    /// A 2xx answer to `post`.
    fn answered(self: &Arc<Shared>, post: &Post, resp: ureq::http::Response<ureq::Body>) {
        if post.is("initialize") {
            self.session.lock().id = header(&resp, "mcp-session-id");
        }
        let kind = header(&resp, "content-type").unwrap_or_default();
        let is_sse = kind.to_ascii_lowercase().starts_with("text/event-stream");
        let is_json = kind.to_ascii_lowercase().starts_with("application/json");
        if post.is("notifications/initialized") {
            // The server's own stream opens before anything sent after
            // `initialized` starts (the SDKs' order): the GET thread lets
            // the next line go once its first GET is answered or fails.
            self.start_get_stream(Some(post.turn.hand_off()));
        }
        let Some(until) = post.until() else {
            // A notification or a response: 202, nothing to read.
            return;
        };
        // 2026-07-28 streams cannot be resumed.
        let resumable = post.modern.is_none();
        let delivered = if is_sse {
            let reader = resp.into_body().into_reader();
            let mut cursor = Cursor::default();
            match self.read_stream(reader, &until, &mut cursor, false) {
                Ok(true) => true,
                // Ended or broken after an event over the limit, and no
                // response: that was the response; it ran, and running it
                // again would bring the same (as for a JSON body).
                _ if cursor.too_long.is_some() => self.too_large(&until, &cursor),
                // Ended or broken after events with ids: the server may
                // replay the rest (and the response) to a GET.
                Ok(false) if resumable && self.resume(&until, &mut cursor, &post.exchange) => true,
                Err(_) if resumable && self.resume(&until, &mut cursor, &post.exchange) => true,
                _ if cursor.too_long.is_some() => self.too_large(&until, &cursor),
                Ok(false) => false,
                Err(e) => {
                    let why = format!("the answer's stream broke ({})", self.scrub(&e.to_string()));
                    return self.failed(post, Class::Broken, &why, None, "");
                }
            }
        } else if is_json {
            let limit = self.max_message_bytes as u64;
            match resp.into_body().with_config().limit(limit).read_to_string() {
                // Anything but the awaited response (`{}`, another id,
                // garbage) is reported as it is, and the request answered
                // with an error below: it must not wait for its timeout.
                Ok(text) => self.deliver(text, Some(&until)),
                Err(ureq::Error::BodyExceedsLimit(n)) => {
                    self.emit(ServerEvent::TooLong {
                        response_id: Some(until.id.to_owned()),
                        len: n as usize,
                    });
                    true
                }
                Err(e) => {
                    let why = format!("the answer broke ({})", self.scrub(&e.to_string()));
                    return self.failed(post, Class::Broken, &why, None, "");
                }
            }
        } else {
            false
        };
        if !delivered {
            let why = "the server's answer ended without a response to the request";
            self.failed(post, Class::ServerError, why, None, "");
        }
    }

    /// Reports the response `until` as over `max_message_bytes` (the event
    /// of the size `cursor` noted); it counts as delivered.
    fn too_large(&self, until: &Until, cursor: &Cursor) -> bool {
        self.emit(ServerEvent::TooLong {
            response_id: Some(until.id.to_owned()),
            len: cursor.too_long.unwrap_or(self.max_message_bytes),
        });
        true
    }

    /// Reads an event stream, handing each batch of items to `on` (with
    /// the parser, for its last id and `retry`) until `on` returns a value
    /// (returned) or the stream ends (`None`).
    fn read_events<T>(
        &self,
        mut reader: impl Read,
        mut on: impl FnMut(&sse::Parser, std::vec::Drain<'_, sse::Item>) -> Option<T>,
    ) -> std::io::Result<Option<T>> {
        let mut parser = sse::Parser::new(self.max_message_bytes);
        let mut buf = vec![0u8; 16 * 1024];
        let mut items = Vec::new();
        loop {
            let n = reader.read(&mut buf)?;
            if n == 0 {
                return Ok(None);
            }
            parser.feed(&buf[..n], &mut items);
            if let Some(done) = on(&parser, items.drain(..)) {
                return Ok(Some(done));
            }
        }
    }

    /// Reads the SSE answer of a request, reporting its messages, until
    /// the response `until`; says whether it came. `resumed`: the stream
    /// replays events (`Last-Event-ID`), so responses to other requests are
    /// dropped (an answer to a request already answered is dropped by the
    /// dispatcher as any late duplicate is; events are never told apart by
    /// id, which is an opaque cursor and may repeat). An event over
    /// `max_message_bytes` is reported when the stream ends without the
    /// response: it was the response (see [`Shared::answered`]).
    fn read_stream(
        &self,
        reader: impl Read,
        until: &Until,
        cursor: &mut Cursor,
        resumed: bool,
    ) -> std::io::Result<bool> {
        cursor.stream_retry = false;
        let answered = self.read_events(reader, |parser, items| {
            note_last_id(parser, &mut cursor.last_id, &self.shown, &mut cursor.fresh);
            cursor.stream_retry |= parser.retry().is_some();
            cursor.retry = parser.retry().or(cursor.retry);
            for item in items {
                match item {
                    sse::Item::Event(e) if e.kind == "message" => {
                        if resumed && is_other_response(&e.data, until.id) {
                            continue;
                        }
                        if self.deliver(e.data, Some(until)) {
                            return Some(());
                        }
                    }
                    sse::Item::Event(_) => {}
                    sse::Item::TooLong(len) => {
                        crate::warn!(
                            "{} sent an event of {len} bytes, over max_message_bytes; dropped",
                            self.shown
                        );
                        cursor.too_long = Some(len);
                    }
                }
            }
            None
        })?;
        // What was over the limit was not the response.
        if let Some(len) = answered.and_then(|()| cursor.too_long.take()) {
            self.emit(ServerEvent::TooLong {
                response_id: None,
                len,
            });
        }
        Ok(answered.is_some())
    }

    /// Resumes the broken or ended answer stream of request `until` with
    /// GET and `Last-Event-ID`, as [`resume::Resumption`] decides (waiting
    /// the stream's `retry`, going on while resumptions bring new events,
    /// a stalled stream closed by a per-read timeout and resumed again,
    /// all within the body deadline `recv_body` from the first
    /// resumption); says whether the response came. Not once the request's
    /// exchange is closed (cancelled).
    fn resume(&self, until: &Until, cursor: &mut Cursor, exchange: &Arc<Exchange>) -> bool {
        let mut plan = resume::Resumption::new(Instant::now(), self.recv_body);
        loop {
            let next = plan.next(cursor.last_id.is_some(), cursor.retry, Instant::now());
            let resume::Next::Get {
                at,
                refresh,
                stall_after,
                deadline,
            } = next
            else {
                return false;
            };
            // Cut short by the connection closing or the request's
            // exchange being closed (cancelled).
            crossbeam_channel::select! {
                recv(self.stopped) -> _ => return false,
                recv(exchange.closing()) -> _ => return false,
                recv(crossbeam_channel::at(at)) -> _ => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(last_id) = cursor.last_id.clone() else {
                return false;
            };
            if exchange.is_closed() || left.is_zero() {
                return false;
            }
            let mut headers = self.session_headers();
            if !headers.iter().any(|(n, _)| n == "Mcp-Session-Id") {
                return false;
            }
            headers.push(("Accept".to_owned(), "text/event-stream".to_owned()));
            headers.push(("Last-Event-ID".to_owned(), last_id));
            let req = self.headed(self.agent.get(&self.url), headers, refresh);
            crate::debug!(
                "resuming the answer to request {} from {}",
                until.id,
                self.shown
            );
            exchange.begin_request(0);
            let result = req
                .config()
                .timeout_recv_response(Some(self.recv_response.min(left)))
                .timeout_recv_body(Some(left))
                .timeout_per_read(stall_after)
                .build()
                .call();
            let fresh = cursor.fresh;
            let outcome = match result {
                Ok(resp) if resp.status().is_success() => {
                    let reader = resp.into_body().into_reader();
                    let (polled, stalled) = match self.read_stream(reader, until, cursor, true) {
                        Ok(true) => return true,
                        // Its answer is over the limit: no use resuming.
                        _ if cursor.too_long.is_some() => return false,
                        Ok(false) => (cursor.stream_retry, false),
                        Err(e) => (false, is_read_stall(&e)),
                    };
                    if stalled {
                        crate::debug!(
                            "{}: the resumed answer to request {} stalled; resuming again",
                            self.shown,
                            until.id
                        );
                    }
                    resume::Outcome::Ended {
                        fresh: cursor.fresh > fresh,
                        polled,
                        stalled,
                    }
                }
                // New headers may help, once (as for a POST).
                Ok(resp) if matches!(resp.status().as_u16(), 401 | 403) => {
                    resume::Outcome::Unauthorized {
                        can_refresh: self.helper.is_some(),
                    }
                }
                // No resumption here (405, a lost session, …).
                Ok(_) => resume::Outcome::Refused,
                Err(_) => resume::Outcome::Failed,
            };
            plan.after(outcome);
        }
    }

    /// 2026-07-28, after a header mismatch: reads every page of the
    /// server's `tools/list` (with the envelope of the `post` that was
    /// refused) and learns the tools' `x-mcp-header` annotations. Says
    /// whether that worked. Nothing of it reaches the client.
    fn relist_tools(&self, post: &Post) -> bool {
        let (Some(version), Some(envelope)) =
            (&post.modern, post.params().and_then(modern::envelope))
        else {
            return false;
        };
        let mut cursor: Option<String> = None;
        for _ in 0..RELIST_PAGES {
            let n = self.own_requests.fetch_add(1, Ordering::SeqCst) + 1;
            let id = format!("\"mcp-retry-tools-{n}\"");
            let params = match &cursor {
                Some(c) => format!("{{\"cursor\":{c},\"_meta\":{envelope}}}"),
                None => format!("{{\"_meta\":{envelope}}}"),
            };
            let line = jsonrpc::request_line(&id, "tools/list", Some(&params));
            let headers = modern::standard_headers(version, "tools/list", Some(&params));
            let Some(answer) = self.own_request(&line, &id, headers, &post.exchange) else {
                return false;
            };
            let Some(result) = answer.result().and_then(RawObject::parse) else {
                return false;
            };
            self.learn_tools(&modern::screen_tools(answer.result().unwrap_or_default()));
            cursor = result
                .get("nextCursor")
                .filter(|c| c.get().starts_with('"'))
                .map(|c| c.get().to_owned());
            if cursor.is_none() {
                return true;
            }
        }
        false
    }

    /// Posts a request of our own and reads its response (JSON or SSE),
    /// reporting nothing.
    fn own_request(
        &self,
        line: &[u8],
        id: &str,
        headers: Vec<(String, String)>,
        exchange: &Exchange,
    ) -> Option<Message> {
        let req = self
            .agent
            .post(&self.url)
            .header("Accept", "application/json, text/event-stream")
            .header("Content-Type", "application/json");
        exchange.begin_request(line.len());
        let resp = self
            .headed(req, headers, false)
            .config()
            .timeout_recv_response(Some(self.recv_response))
            .timeout_recv_body(Some(self.recv_body))
            .build()
            .send(line)
            .ok()
            .filter(|r| r.status().is_success())?;
        let kind = header(&resp, "content-type").unwrap_or_default();
        let is_answer = |m: &Message| m.id() == Some(id) && m.method().is_none();
        if kind.to_ascii_lowercase().starts_with("text/event-stream") {
            let reader = resp.into_body().into_reader();
            self.read_events(reader, |_, items| {
                items.into_iter().find_map(|item| match item {
                    sse::Item::Event(e) => Message::reparse(e.data).filter(is_answer),
                    sse::Item::TooLong(_) => None,
                })
            })
            .ok()
            .flatten()
        } else {
            let limit = self.max_message_bytes as u64;
            let text = resp.into_body().with_config().limit(limit).read_to_string();
            Message::reparse(text.ok()?).filter(is_answer)
        }
    }

    /// Reports one message; true if it is the response `until` waits for.
    fn deliver(&self, text: String, until: Option<&Until>) -> bool {
        match jsonrpc::classify(text) {
            jsonrpc::Parsed::Message(m) => {
                let answer = until.filter(|u| m.id() == Some(u.id) && m.method().is_none());
                let mut m = m;
                if let Some(u) = answer {
                    if u.initialize {
                        self.session.lock().protocol_version =
                            protocol_version(&String::from_utf8_lossy(&m.line()));
                    }
                    if u.screen_tools {
                        m = self.screened(m);
                    }
                }
                self.emit(ServerEvent::Message(jsonrpc::Parsed::Message(m)));
                answer.is_some()
            }
            jsonrpc::Parsed::Invalid(i) if i.code == jsonrpc::PARSE_ERROR => {
                crate::warn!("{} sent something that is not JSON; skipped", self.shown);
                self.emit(ServerEvent::Garbage { head: None });
                false
            }
            parsed => {
                self.emit(ServerEvent::Message(parsed));
                false
            }
        }
    }

    /// A 2026-07-28 `tools/list` response with the tools whose
    /// `x-mcp-header` annotations are invalid left out (the others'
    /// annotations are learned).
    fn screened(&self, m: Message) -> Message {
        let Some(result) = m.result() else {
            return m;
        };
        let screened = modern::screen_tools(result);
        self.learn_tools(&screened);
        let (Some(result), Some(id)) = (&screened.result, m.id()) else {
            return m;
        };
        let line = jsonrpc::response_line(id, result);
        let text = String::from_utf8_lossy(&line).trim_end().to_owned();
        Message::reparse(text).unwrap_or(m)
    }

    /// A POST that did not get its answer. `body`: the answer's, if any.
    fn failed(&self, post: &Post, class: Class, why: &str, status: Option<u16>, body: &str) {
        if post.exchange.is_closed() {
            // Cancelled: its stream was closed on purpose.
            return crate::debug!(
                "{}: the stream of a cancelled request was closed",
                self.shown
            );
        }
        let others = self.requests.load(Ordering::SeqCst) > usize::from(post.request_id.is_some());
        let handshake = post.is("initialize") && post.modern.is_none();
        match class {
            // A server that cannot start a session (5xx, 429, a broken
            // connection) is a failed start: the link restarts it with its
            // backoff while the client's `initialize` waits. A session not
            // started holds nothing that could have run twice.
            Class::ServerError | Class::Refused(_) | Class::Broken if handshake => {
                self.emit(ServerEvent::Unsent {
                    lines: vec![post.out.clone()],
                    why: format!("the server could not start a session ({why})"),
                });
                self.gone(&format!("could not start a session ({why})"), others);
            }
            Class::NeverSent => {
                self.emit(ServerEvent::Unsent {
                    lines: vec![post.out.clone()],
                    why: format!("the server could not be reached ({why})"),
                });
                self.gone(&format!("could not be reached ({why})"), others);
            }
            // 2026-07-28 has no session: a broken stream loses that one
            // request (it may have run), not the connection.
            // A broken stream loses that one request (it may have run), not
            // the session: the other requests in flight go on. A server
            // that really went away answers the next POST with a refused
            // connection or a 404 for the session. A notification or a
            // response the server was slow to acknowledge is only logged.
            Class::Broken => self.report_no_answer(post, why, status, true),
            Class::SessionLost => {
                self.session.lock().id = None;
                self.emit(ServerEvent::Unsent {
                    lines: vec![post.out.clone()],
                    why: format!(
                        "the server rejected the session after the request was delivered ({why}); it goes again on a new session"
                    ),
                });
                self.gone(&format!("ended the session ({why})"), others);
            }
            Class::Refused(retry_after) => self.emit(ServerEvent::Refused {
                lines: vec![post.out.clone()],
                why: format!("the server answered {why}"),
                retry_after,
            }),
            Class::Answered | Class::HeaderMismatch => {
                // The server's own error, scrubbed of header values as any
                // text of its (still JSON: else ours instead).
                let error = RawObject::parse(body)
                    .and_then(|b| b.get("error").map(|e| self.scrub(e.get())))
                    .filter(|e| serde_json::from_str::<&serde_json::value::RawValue>(e).is_ok());
                match (&post.id_text, error) {
                    (Some(id), Some(error)) => {
                        let line = jsonrpc::error_response_line(id, &error);
                        self.deliver(String::from_utf8_lossy(&line).trim_end().to_owned(), None);
                    }
                    _ => self.report_no_answer(post, why, status, false),
                }
            }
            Class::ServerError => self.report_no_answer(post, why, status, true),
            Class::Unauthorized | Class::Rejected => {
                self.report_no_answer(post, why, status, false)
            }
        }
    }

    /// Request `post` cannot be sent as the client wrote it (`why`).
    fn invalid(&self, post: &Post, why: String) {
        crate::warn!("{}: not sent: {why}", self.shown);
        let Some(id) = post.request_id else {
            return;
        };
        self.emit(ServerEvent::Failed {
            id,
            failure: Failure {
                message: why,
                status: None,
                may_have_run: false,
                invalid: true,
            },
        });
    }

    /// Reports that request `post` gets no answer, and what happened (a
    /// notification is only logged): `ran`, it may have run; else it did
    /// not. The dispatcher answers it with the proxy's error.
    fn report_no_answer(&self, post: &Post, why: &str, status: Option<u16>, ran: bool) {
        let Some(id) = post.request_id else {
            let what = if post.method.is_some() {
                "a notification"
            } else {
                "an answer to its request"
            };
            return crate::warn!("{} did not take {what}: {why}", self.shown);
        };
        let message = match status {
            Some(_) => format!("the MCP server {} answered {why}", self.shown),
            None => format!("the MCP server {}: {why}", self.shown),
        };
        self.emit(ServerEvent::Failed {
            id,
            failure: Failure {
                message,
                status,
                may_have_run: ran,
                invalid: false,
            },
        });
    }

    /// Starts the thread that keeps the server's own stream open.
    fn start_get_stream(self: &Arc<Shared>, turn: Option<Turn>) {
        let mut s = self.session.lock();
        if s.get_started {
            // Already open: nothing to wait for (`turn` is let go).
            return;
        }
        s.get_started = true;
        drop(s);
        let shared = self.clone();
        let spawned = self.spawn("http-get", move || shared.get_loop(turn));
        if let Err(e) = spawned {
            crate::warn!(
                "cannot start the thread for the stream of {}: {e}",
                self.shown
            );
        }
    }

    /// Ends the session: DELETE with its id and negotiated version, as
    /// every request after `initialize`, within `step` (405 and other
    /// refusals are fine).
    fn delete_session(&self, step: Duration) {
        if self.session.lock().id.is_none() {
            return;
        }
        let headers = self.session_headers();
        let req = self.headed(self.agent.delete(&self.url), headers, false);
        let result = req.config().timeout_global(Some(step)).build().call();
        if let Err(e) = result {
            crate::debug!(
                "ending the session with {}: {}",
                self.shown,
                self.scrub(&e.to_string())
            );
        }
    }

    /// The GET stream: open, read, wait, open again, until the connection
    /// closes or the server has none (405) or the session ends.
    fn get_loop(&self, mut turn: Option<Turn>) {
        let mut delay = GET_RETRY_FIRST;
        let mut last_id: Option<String> = None;
        // `headers_helper` is run again once after a 401 or 403, as for a
        // POST; a stream opened resets that.
        let (mut refresh, mut refreshed) = (false, false);
        while !self.is_closed() {
            let mut headers = self.session_headers();
            headers.push(("Accept".to_owned(), "text/event-stream".to_owned()));
            if let Some(id) = &last_id {
                headers.push(("Last-Event-ID".to_owned(), id.clone()));
            }
            let req = self.headed(self.agent.get(&self.url), headers, refresh);
            refresh = false;
            let mut wait = delay;
            let answer = req.call();
            // Opened (or refused): what was sent after `initialized` goes.
            if let Some(t) = turn.take() {
                t.release();
            }
            match answer {
                Ok(resp) if resp.status().as_u16() == 405 => {
                    crate::debug!("{} has no stream of its own (405)", self.shown);
                    return;
                }
                Ok(resp)
                    if matches!(resp.status().as_u16(), 401 | 403)
                        && self.helper.is_some()
                        && !refreshed =>
                {
                    crate::info!(
                        "{} answered its stream {}; running headers_helper again",
                        self.shown,
                        classify::status_line(resp.status().as_u16())
                    );
                    (refresh, refreshed) = (true, true);
                    continue;
                }
                Ok(resp) if matches!(resp.status().as_u16(), 404 | 400 | 401 | 403) => {
                    crate::debug!(
                        "{} refused its stream: {}",
                        self.shown,
                        classify::status_line(resp.status().as_u16())
                    );
                    return;
                }
                Ok(resp) if resp.status().is_success() => {
                    refreshed = false;
                    let mut parser_retry = None;
                    let reader = resp.into_body().into_reader();
                    let result = self.read_get_stream(reader, &mut last_id, &mut parser_retry);
                    if let Err(e) = result {
                        crate::debug!(
                            "{}: its stream broke ({})",
                            self.shown,
                            self.scrub(&e.to_string())
                        );
                    }
                    delay = GET_RETRY_FIRST;
                    wait = get_wait(parser_retry);
                }
                Ok(resp) => {
                    crate::debug!(
                        "{} answered its stream with {}",
                        self.shown,
                        classify::status_line(resp.status().as_u16())
                    );
                }
                Err(e) => {
                    crate::debug!(
                        "{}: opening its stream failed ({})",
                        self.shown,
                        self.scrub(&e.to_string())
                    );
                }
            }
            match self.stopped.recv_timeout(wait) {
                Err(RecvTimeoutError::Timeout) => {}
                _ => return,
            }
            delay = (delay.mul_f64(1.5)).min(GET_RETRY_MAX);
        }
    }

    fn read_get_stream(
        &self,
        reader: impl Read,
        last_id: &mut Option<String>,
        retry: &mut Option<Duration>,
    ) -> std::io::Result<()> {
        let mut moved = 0;
        self.read_events(reader, |parser, items| {
            *retry = parser.retry();
            note_last_id(parser, last_id, &self.shown, &mut moved);
            if self.is_closed() {
                return Some(());
            }
            for item in items {
                if let sse::Item::Event(e) = item {
                    if e.kind == "message" {
                        self.deliver(e.data, None);
                    }
                }
            }
            None
        })?;
        Ok(())
    }
}

/// Whether a read failed because it was silent for its per-read timeout
/// (a resumed stream that stalled).
fn is_read_stall(e: &std::io::Error) -> bool {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<ureq::Error>())
        .is_some_and(|u| matches!(u, ureq::Error::Timeout(ureq::Timeout::PerRead)))
}

/// Takes the stream's last event id into `last_id` when it moved on
/// (counted in `moved`; copied only then, an id being up to
/// [`sse::MAX_ID`] bytes); an id too long to keep leaves none: the stream
/// cannot be resumed from there, which is said at debug level.
fn note_last_id(
    parser: &sse::Parser,
    last_id: &mut Option<String>,
    shown: &str,
    moved: &mut usize,
) {
    let now = parser.last_id();
    if !parser.ids_ended() || now == last_id.as_deref() {
        return;
    }
    if now.is_none() && parser.id_dropped() {
        crate::debug!(
            "{shown} sent an event id over {} bytes; its stream cannot be resumed from there",
            sse::MAX_ID
        );
    }
    *last_id = now.map(str::to_owned);
    *moved += 1;
}

/// How long the GET stream waits before it is opened again after it
/// ended: its `retry`, at least [`GET_RETRY_MIN`], or [`GET_RETRY_FIRST`].
fn get_wait(retry: Option<Duration>) -> Duration {
    retry.map_or(GET_RETRY_FIRST, |r| r.max(GET_RETRY_MIN))
}

/// How long a POST of `len` bytes that is not a request may take in all:
/// [`NOTE_TIMEOUT`], and a second more per MiB, so that a large answer to a
/// server's request is not cut off on a slow link while a server that
/// takes nothing still frees the thread.
fn note_timeout(len: usize) -> Duration {
    NOTE_TIMEOUT + Duration::from_secs((len >> 20) as u64)
}

/// Whether `text` is a response to a request other than `id`.
fn is_other_response(text: &str, id: &str) -> bool {
    match Message::reparse(text.to_owned()) {
        Some(m) => m.method().is_none() && m.id().is_some_and(|i| i != id),
        None => false,
    }
}

/// A response header as text.
fn header(resp: &ureq::http::Response<ureq::Body>, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// The negotiated version in an `initialize` result.
fn protocol_version(line: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    v["result"]["protocolVersion"].as_str().map(str::to_owned)
}

/// The message of an error answer's body: its JSON-RPC `error.message`,
/// else its first line of text (at most 200 characters).
fn server_message(body: &str) -> Option<String> {
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(body) {
        if let Some(m) = v["error"]["message"].as_str() {
            return Some(m.to_owned());
        }
    }
    let line = body.lines().map(str::trim).find(|l| !l.is_empty())?;
    Some(line.chars().take(200).collect())
}

/// Runs `headers_helper` with `sh -c` (`cmd /C` on Windows), within 10 s,
/// and reads the JSON object of headers it prints. The error never quotes
/// its output.
fn run_helper(
    helper: &str,
    env: &[(String, String)],
    cwd: &Option<std::path::PathBuf>,
) -> Result<Vec<(String, String)>, String> {
    use std::process::{Command, Stdio};
    let (shell, flag) = if cfg!(windows) {
        ("cmd", "/C")
    } else {
        ("sh", "-c")
    };
    let mut cmd = Command::new(shell);
    cmd.arg(flag)
        .arg(helper)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        // What it says on stderr could hold the secret it prints: dropped.
        .stderr(Stdio::null())
        .envs(env.iter().map(|(k, v)| (k, v)));
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    let mut child = cmd.spawn().map_err(|e| format!("cannot run it: {e}"))?;
    let mut stdout = child.stdout.take().expect("piped");
    let (tx, rx) = crossbeam_channel::bounded(1);
    crate::guard::spawn(
        "headers-helper",
        "headers_helper's output is not read",
        move || {
            let mut out = Vec::new();
            let _ = stdout.read_to_end(&mut out);
            let _ = tx.send(out);
        },
        || {},
    )
    .map_err(|e| format!("cannot start its reader: {e}"))?;
    let out = match rx.recv_timeout(HELPER_TIMEOUT) {
        Ok(out) => out,
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "it did not finish within {}s",
                HELPER_TIMEOUT.as_secs()
            ));
        }
    };
    let status = child.wait().map_err(|e| format!("waiting for it: {e}"))?;
    if !status.success() {
        return Err(format!("it failed ({status})"));
    }
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&out)
        .map_err(|_| "it did not print a JSON object of headers".to_owned())?;
    let mut headers = Vec::new();
    for (name, value) in map {
        let Some(value) = value.as_str() else {
            return Err(format!("the value of header {name:?} is not a string"));
        };
        check_header(&name, value)?;
        headers.push((name, value.to_owned()));
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_split_at_the_first_colon() {
        assert_eq!(
            split_header("Authorization: Bearer a:b"),
            Ok(("Authorization".into(), "Bearer a:b".into()))
        );
        assert!(split_header("no colon").is_err());
        assert!(split_header("bad name: x").is_err());
    }

    #[test]
    fn header_checks_never_quote_the_value() {
        let err = check_header("X-Key", "sec\r\nret").unwrap_err();
        assert!(!err.contains("sec"), "{err}");
    }

    #[test]
    fn urls_are_shown_without_query_or_user_info() {
        assert_eq!(
            display_url("https://u:pw@host:8443/mcp?key=secret#x"),
            "https://host:8443/mcp"
        );
        assert_eq!(
            display_url("http://127.0.0.1:3000"),
            "http://127.0.0.1:3000"
        );
    }

    #[test]
    fn server_messages_come_from_the_json_rpc_error_or_the_first_line() {
        let body = r#"{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"}}"#;
        assert_eq!(server_message(body).as_deref(), Some("Session not found"));
        assert_eq!(
            server_message("\n  upstream down \nmore").as_deref(),
            Some("upstream down")
        );
        assert_eq!(server_message(""), None);
    }

    #[test]
    fn the_get_stream_waits_its_retry_but_never_less_than_the_floor() {
        assert_eq!(get_wait(Some(Duration::ZERO)), GET_RETRY_MIN);
        assert_eq!(get_wait(Some(Duration::from_millis(10))), GET_RETRY_MIN);
        let long = Duration::from_millis(2500);
        assert_eq!(get_wait(Some(long)), long);
        assert_eq!(get_wait(None), GET_RETRY_FIRST);
    }

    #[test]
    fn what_is_not_a_request_has_two_seconds_and_one_more_per_mib() {
        assert_eq!(note_timeout(0), NOTE_TIMEOUT);
        assert_eq!(note_timeout((1 << 20) - 1), NOTE_TIMEOUT);
        assert_eq!(note_timeout(5 << 20), NOTE_TIMEOUT + Duration::from_secs(5));
    }

    #[test]
    fn the_protocol_version_comes_from_the_initialize_result() {
        let line = r#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18"}}"#;
        assert_eq!(protocol_version(line).as_deref(), Some("2025-06-18"));
        assert_eq!(protocol_version(r#"{"id":1,"error":{}}"#), None);
    }
}
