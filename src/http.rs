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
//! implies (`modern.rs`), from what the request's `Outgoing::modern` says
//! (no line is parsed): `MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`
//! and `Mcp-Param-*` from the tools' `x-mcp-header` annotations, learned
//! from the `tools/list` answers passing by (tools with invalid annotations
//! are left out of those), and the call's argument scalars. A `HeaderMismatch` answer to a `tools/call` has
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
mod get;
mod headers;
mod modern;
mod order;
mod post;
pub mod resume;
pub mod sse;
mod stream;
mod tools;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::{Condvar, Mutex};

use crate::config::ServerConfig;
use crate::downstream::{
    Downstream, Gone, Heal, OnEvent, OutKind, Outgoing, ServerEvent, StartError,
};
use crate::stdio::Backlog;

use conn::Exchange;
pub use headers::split_header;
use order::Order;

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
/// Idle connections are dropped before the servers' usual 5 s keep-alive
/// ends, so a request never goes out on a connection the server is closing.
const MAX_IDLE_AGE: Duration = Duration::from_secs(4);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Cancels remembered for requests not posted yet.
const EARLY_CANCELS: usize = 1024;

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

/// Connects to the remote server `cfg` names. Nothing is sent yet. What
/// stops it needs fixing (`Heal::Fix`): a connection that fails later is
/// reported as `Gone`.
pub fn connect(cfg: &ServerConfig, on_event: OnEvent) -> Result<Http, StartError> {
    let fix = |message: String| StartError {
        message,
        heal: Heal::Fix,
    };
    let shown = display_url(&cfg.url);
    if cfg.url.starts_with("https://") && !cfg!(feature = "tls") {
        return Err(fix(format!(
            "{shown}: this build has no TLS support (the cargo feature tls is off)"
        )));
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
            config = config.tls_config(tls_config(file).map_err(fix)?);
        }
        #[cfg(not(feature = "tls"))]
        return Err(fix(format!(
            "ca_file {}: this build has no TLS support (the cargo feature tls is off)",
            file.display()
        )));
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
        helper_headers: Mutex::new(HelperHeaders::default()),
        helper_ran: Condvar::new(),
        needs_fix: AtomicBool::new(false),
        order: Arc::new(Order::new()),
        session: Session::default(),
        exchanges: Exchanges::default(),
        tool_headers: Mutex::new(HashMap::new()),
        own_requests: AtomicUsize::new(0),
        warned_tools: Mutex::new(HashSet::new()),
        warned_left_out: Mutex::new(HashSet::new()),
        on_event,
        closed: AtomicBool::new(false),
        reports: Mutex::new(Reports::default()),
        reported: Condvar::new(),
        requests: AtomicUsize::new(0),
        max_message_bytes: cfg.max_message_bytes,
        recv_response: cfg.call_timeout + Duration::from_secs(5),
        recv_body: cfg.call_timeout.max(cfg.retry.total_timeout) + Duration::from_secs(5),
        stopped,
        pool: Pool {
            posters: AtomicUsize::new(POOL),
            idle: AtomicUsize::new(0),
            queued: [rx.clone(), notes_rx.clone()],
            backlog: Backlog::new(crate::child::STDIN_BACKLOG),
        },
    });
    for n in 0..POOL {
        spawn_poster(&shared, &rx, "http-post", n, false)
            .map_err(|e| fix(format!("cannot start the HTTP threads: {e}")))?;
    }
    for n in 0..NOTE_POOL {
        spawn_poster(&shared, &notes_rx, "http-note", n, false)
            .map_err(|e| fix(format!("cannot start the HTTP threads: {e}")))?;
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

/// The largest `ca_file` read (a whole public bundle is under 300 KiB).
#[cfg(feature = "tls")]
const MAX_CA_FILE_BYTES: u64 = 4 << 20;

#[cfg(feature = "tls")]
fn tls_config(file: &std::path::Path) -> Result<ureq::tls::TlsConfig, String> {
    use ureq::tls::{PemItem, RootCerts, TlsConfig};
    let pem = crate::config::read_named(file, MAX_CA_FILE_BYTES)
        .map_err(|e| format!("cannot read ca_file {}: {e}", file.display()))?;
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

/// What the threads of one connection share: its settings, and by
/// concern the [`Session`], the [`Pool`] of POST threads and the
/// [`Exchanges`] being posted, each changed through its own methods.
///
/// Every lock of the transport (parking_lot; none is held across a
/// request's I/O, while an event is reported, or while `headers_helper`
/// runs):
///
/// | lock | guards | taken by |
/// |---|---|---|
/// | `Session::state` | session id, protocol version, the GET started, the 2026-07-28 version | POST and GET threads; the dispatcher's thread (`cancel`) |
/// | `Exchanges::table` | requests being posted, early cancels | POST threads; the dispatcher's thread (`cancel`) |
/// | `Shared::helper_headers` (+ `helper_ran`) | `headers_helper`'s last output, a run under way | POST and GET threads building headers, scrubbing text |
/// | `Shared::tool_headers`, `Shared::warned_tools`, `Shared::warned_left_out` | 2026-07-28 `x-mcp-header` maps, tools warned about | POST threads (`tools.rs`, `headers.rs`) |
/// | `Shared::reports` (+ `reported`) | `Gone` reported, events being reported | every thread reporting (`emit`, `gone`) |
/// | `Order::state` (+ `moved`) | which lines have started | POST threads waiting for their turn |
/// | `Exchange::{conn, closing_tx, written, on_written}` | an exchange's connection, close, bytes written, callback (called after the lock) | the exchange's POST or GET thread; `close` from any |
/// | `ConnState::owner` | the exchange using a connection | the connector (in ureq's calls), `close`; held across a socket's `shutdown(2)` (which does not block), as `exchanges` is when `cancel` closes a stream |
struct Shared {
    url: String,
    shown: String,
    agent: ureq::Agent,
    headers: Vec<(String, String)>,
    helper: Option<String>,
    helper_env: Vec<(String, String)>,
    helper_cwd: Option<std::path::PathBuf>,
    /// What `headers_helper` printed last, and whether it runs now (it
    /// runs without the lock held; `helper_ran` says when it is done).
    helper_headers: Mutex<HelperHeaders>,
    helper_ran: Condvar,
    /// The order POSTs start in.
    order: Arc<Order>,
    /// A request could not be sent for a reason waiting does not heal
    /// (an unknown host, TLS): `Gone` says so.
    needs_fix: AtomicBool,
    session: Session,
    /// The requests being posted, by the proxy's id, for cancelling them.
    exchanges: Exchanges,
    /// 2026-07-28: the `x-mcp-header` annotations of each tool, as the
    /// server listed them last.
    tool_headers: Mutex<HashMap<String, modern::HeaderMap>>,
    /// Numbers our own requests (`tools/list` after a header mismatch).
    own_requests: AtomicUsize,
    /// Tools whose invalid `x-mcp-header` was warned about.
    warned_tools: Mutex<HashSet<String>>,
    /// Tools a header value of which was left out for its size, warned
    /// about (at most the tools listed with `x-mcp-header`).
    warned_left_out: Mutex<HashSet<String>>,
    on_event: OnEvent,
    /// No more lines are taken (shutdown, kill, drop, or gone).
    closed: AtomicBool,
    /// Whether `Gone` was reported, and how many events are being
    /// reported meanwhile (a report may block while the client is behind;
    /// no lock is held while it does).
    reports: Mutex<Reports>,
    /// Signalled when the last event being reported is delivered.
    reported: Condvar,
    /// Requests (not notifications) being posted.
    requests: AtomicUsize,
    max_message_bytes: usize,
    recv_response: Duration,
    recv_body: Duration,
    stopped: Receiver<()>,
    pool: Pool,
}

/// The POST threads and their queues: one concern, counted in atomics.
struct Pool {
    /// POST threads for requests, and how many of them wait for work.
    posters: AtomicUsize,
    idle: AtomicUsize,
    /// The POST threads' queues (requests, then the rest), for the lines
    /// no thread took when the connection is gone.
    queued: [Receiver<Job>; 2],
    /// The bytes of the lines in `queued`, held to the stdio transport's
    /// limit: past it the client's reader waits, so a server that takes
    /// requests slower than the client sends them cannot make the queues
    /// grow without bound.
    backlog: Arc<Backlog>,
}

impl Pool {
    /// The number for one more POST thread for requests, if `waiting`
    /// requests are more than the idle threads and [`POOL_MAX`] allows;
    /// [`Pool::not_started`] if it could not be started.
    fn one_more(&self, waiting: usize) -> Option<usize> {
        if self.idle.load(Ordering::SeqCst) >= waiting {
            return None;
        }
        let n = self.posters.fetch_add(1, Ordering::SeqCst);
        if n >= POOL_MAX {
            self.posters.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(n)
    }

    fn not_started(&self) {
        self.posters.fetch_sub(1, Ordering::SeqCst);
    }

    /// A POST thread for requests waits for work (`true`), or has some.
    fn waiting(&self, idle: bool) {
        match idle {
            true => self.idle.fetch_add(1, Ordering::SeqCst),
            false => self.idle.fetch_sub(1, Ordering::SeqCst),
        };
    }

    /// A thread started on demand found no work: whether it ends (while
    /// more than [`POOL`] are left).
    fn retire(&self) -> bool {
        self.posters
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                (t > POOL).then(|| t - 1)
            })
            .is_ok()
    }

    /// The connection is gone: the lines no thread took, each skipped in
    /// `order`; no more are taken.
    fn unsent(&self, order: &Order) -> Vec<Outgoing> {
        let lines = self
            .queued
            .iter()
            .flat_map(|q| q.try_iter())
            .filter_map(|job| match job {
                Job::Post(l) => {
                    order.skip(l.seq);
                    Some(l.out)
                }
                Job::Close { .. } => None,
            })
            .collect();
        self.backlog.close();
        lines
    }
}

/// What `headers_helper` printed last (`None` before its first run), and
/// whether a thread runs it now.
#[derive(Default)]
struct HelperHeaders {
    last: Option<Vec<(String, String)>>,
    running: bool,
}

/// What the connection has reported: `Gone` (nothing is reported after
/// it), and the events being reported now, which `Gone` waits for.
#[derive(Default)]
struct Reports {
    gone: bool,
    reporting: usize,
}

/// The 2025-era session and the era the client speaks: one concern,
/// behind its own lock.
#[derive(Default)]
struct Session {
    state: Mutex<SessionState>,
}

#[derive(Default)]
struct SessionState {
    id: Option<String>,
    protocol_version: Option<String>,
    get_started: bool,
    /// The 2026-07-28 version the client's requests name, once one did.
    modern: Option<String>,
}

impl Session {
    /// Whether the server's own stream is to be opened now (once).
    fn begin_get(&self) -> bool {
        let mut s = self.state.lock();
        !std::mem::replace(&mut s.get_started, true)
    }

    fn has_id(&self) -> bool {
        self.state.lock().id.is_some()
    }

    /// The session id the server set (`None`: it set none, or the session
    /// is lost).
    fn set_id(&self, id: Option<String>) {
        self.state.lock().id = id;
    }

    fn set_protocol_version(&self, version: Option<String>) {
        self.state.lock().protocol_version = version;
    }

    /// The 2025-era session headers: the session id and the negotiated
    /// version, once `initialize` set them.
    fn headers(&self) -> Vec<(String, String)> {
        let s = self.state.lock();
        let mut out = Vec::new();
        if let Some(id) = &s.id {
            out.push(("Mcp-Session-Id".to_owned(), id.clone()));
        }
        if let Some(v) = &s.protocol_version {
            out.push(("MCP-Protocol-Version".to_owned(), v.clone()));
        }
        out
    }

    /// The 2026-07-28 version a line is sent in (`None`: the 2025 era),
    /// from the version its params name (`named`), learning the client's.
    fn era(&self, named: Option<String>, initialize: bool, request: bool) -> Option<String> {
        let mut s = self.state.lock();
        match named {
            Some(v) => {
                s.modern = Some(v.clone());
                Some(v)
            }
            // A client that probed with a 2026-07-28 request and then
            // initializes speaks the 2025 era (sessionless, perhaps).
            None if initialize => {
                s.modern = None;
                None
            }
            // A notification of a 2026-07-28 client names no version.
            None if !request && s.id.is_none() => s.modern.clone(),
            None => None,
        }
    }

    /// Whether no client request named a 2026-07-28 version yet.
    fn classic(&self) -> bool {
        self.state.lock().modern.is_none()
    }
}

/// The requests being posted, by the proxy's id, for cancelling them, and
/// cancels that came before their request: one concern, behind its own
/// lock.
#[derive(Default)]
struct Exchanges {
    table: Mutex<ExchangeTable>,
}

#[derive(Default)]
struct ExchangeTable {
    live: HashMap<u64, Live>,
    early: HashSet<u64>,
    early_order: VecDeque<u64>,
}

struct Live {
    exchange: Arc<Exchange>,
    modern: bool,
}

impl Exchanges {
    /// Whether request `id` is being posted.
    fn is_live(&self, id: u64) -> bool {
        self.table.lock().live.contains_key(&id)
    }

    /// Request `id` is posted through `exchange`; false if it was cancelled
    /// before: it is not sent at all.
    fn start(&self, id: u64, exchange: Arc<Exchange>, modern: bool) -> bool {
        let mut t = self.table.lock();
        if t.early.remove(&id) {
            return false;
        }
        t.live.insert(id, Live { exchange, modern });
        true
    }

    /// Request `id` is posted no more.
    fn end(&self, id: u64) {
        self.table.lock().live.remove(&id);
    }

    /// A cancel of request `id`: `Some(post it)` for a request being
    /// posted (a 2026-07-28 one's stream is closed here, and the cancel
    /// not posted); `None` for one not posted yet, remembered (a bounded
    /// number of them) so that it is not sent at all.
    fn cancel(&self, id: u64) -> Option<bool> {
        let mut t = self.table.lock();
        if let Some(live) = t.live.get(&id) {
            if live.modern {
                live.exchange.close();
                return Some(false);
            }
            return Some(true);
        }
        if t.early.insert(id) {
            t.early_order.push_back(id);
            if t.early_order.len() > EARLY_CANCELS {
                if let Some(old) = t.early_order.pop_front() {
                    t.early.remove(&old);
                }
            }
        }
        None
    }

    /// Closes the stream of request `id`, if it is still being read.
    fn close(&self, id: u64) {
        if let Some(live) = self.table.lock().live.get(&id) {
            live.exchange.close();
        }
    }
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
        self.shared.pool.backlog.add(n);
        let seq = self.next_seq;
        self.next_seq += 1;
        let sent = queue.send(Job::Post(Line { seq, out })).is_ok();
        if !sent {
            self.shared.order.skip(seq);
        }
        if !sent {
            self.shared.pool.backlog.remove(n);
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
        Some(self.shared.pool.backlog.clone())
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
    /// caller's thread: `Gone` waits for a message a transport thread is
    /// reporting while the client is behind, and the caller is the
    /// dispatcher, which must not wait for that.
    fn finish(&mut self, delete: Option<Duration>, how: &'static str) {
        let Some(notes) = self.notes.take() else {
            // Already closing (a kill after a shutdown): what is in flight,
            // the DELETE included, is interrupted now; the close job
            // queued before reports `Gone`.
            self.shared.agent.clone().shutdown();
            return;
        };
        self.close();
        // The note threads end only with their queue, or by a panic, whose
        // guard has reported `Gone` already: then only the interruption is
        // left to do.
        let queued = notes.send(Job::Close { delete, how }).is_ok();
        if delete.is_none() || !queued {
            self.shared.agent.clone().shutdown();
        }
    }

    fn close(&mut self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.shared.pool.backlog.close();
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
        let Some(n) = shared.pool.one_more(self.posts.len()) else {
            return;
        };
        if let Err(e) = spawn_poster(shared, &self.posts, "http-post", n, true) {
            shared.pool.not_started();
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
                shared.pool.waiting(true);
            }
            let next = match extra {
                true => rx.recv_timeout(POOL_IDLE_EXIT),
                false => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            if counts {
                shared.pool.waiting(false);
            }
            match next {
                Ok(Job::Post(line)) => {
                    shared.pool.backlog.remove(line.out.bytes.len());
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
                    if shared.pool.retire() {
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
    /// The report is made without a lock held: `Gone` waits for it.
    fn emit(&self, event: ServerEvent) {
        {
            let mut reports = self.reports.lock();
            if reports.gone {
                return;
            }
            reports.reporting += 1;
        }
        // Counted out however the report ends (a panic in it too, before
        // the thread's guard reports `Gone`).
        struct Reported<'a>(&'a Shared);
        impl Drop for Reported<'_> {
            fn drop(&mut self) {
                let mut reports = self.0.reports.lock();
                reports.reporting -= 1;
                if reports.reporting == 0 {
                    self.0.reported.notify_all();
                }
            }
        }
        let _reported = Reported(self);
        (self.on_event)(event);
    }

    /// Reports `Gone`, once, after the events being reported; nothing is
    /// reported after it. When the connection failed (it was not closed
    /// on purpose), the lines still queued, which no thread took, are
    /// reported `Unsent` first.
    fn gone(&self, how: &str, may_have_received: bool) {
        {
            let mut reports = self.reports.lock();
            if reports.gone {
                return;
            }
            reports.gone = true;
            while reports.reporting > 0 {
                self.reported.wait(&mut reports);
            }
        }
        if !self.closed.swap(true, Ordering::SeqCst) {
            let lines = self.pool.unsent(&self.order);
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

    /// A cancel for request `id` is to be sent; says whether to POST it.
    /// 2026-07-28: closing the request's stream is the cancel, done here,
    /// and nothing is posted. 2025 era: the cancel is posted (within
    /// [`CANCEL_GRACE`]), and the stream closed when that POST is over
    /// (`post`). A request not being posted yet is not sent at all.
    fn cancel(&self, id: u64) -> bool {
        match self.exchanges.cancel(id) {
            Some(post) => post,
            None => self.session.classic(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// The config of a remote server on a loopback port.
    fn remote(port: u16) -> ServerConfig {
        let text = format!("servers:\n  r:\n    url: http://127.0.0.1:{port}/mcp\n");
        let path = std::path::Path::new("c.yaml");
        let config = crate::config::parse(&text, path, crate::config::Format::Yaml, &|_| None);
        config.unwrap().servers.remove(0)
    }

    /// A server answering every POST with one event, then keeping the
    /// stream open; its port.
    fn one_event_server() -> u16 {
        use std::io::{Read, Write};
        use std::net::TcpListener;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let mut s = s.unwrap();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    let _ = s.read(&mut buf);
                    let body = "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n";
                    let _ = write!(
                        s,
                        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n{body}"
                    );
                    let _ = s.flush();
                    std::thread::sleep(Duration::from_secs(30));
                });
            }
        });
        port
    }

    #[test]
    fn a_report_held_up_by_the_client_holds_up_no_other_and_gone_waits_for_it() {
        let cfg = remote(one_event_server());
        let (hold_tx, hold_rx) = crossbeam_channel::bounded::<()>(0);
        let (seen_tx, seen_rx) = crossbeam_channel::unbounded();
        let on_event: OnEvent = Box::new(move |ev| {
            let gone = matches!(ev, ServerEvent::Gone(_));
            let _ = seen_tx.send(gone);
            if !gone {
                let _ = hold_rx.recv_timeout(Duration::from_secs(10));
            }
        });
        let mut http = connect(&cfg, on_event).unwrap();
        for id in [1, 2] {
            let line = format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{}}}}\n"
            );
            assert!(Downstream::send(
                &mut http,
                Outgoing::request(id, "tools/call", line.into_bytes())
            ));
        }
        // Both reports are under way at once: neither waits for the other.
        let wait = Duration::from_secs(5);
        assert_eq!(seen_rx.recv_timeout(wait), Ok(false));
        assert_eq!(seen_rx.recv_timeout(wait), Ok(false));
        // `Gone` comes only once both are delivered.
        http.kill();
        assert!(seen_rx.recv_timeout(Duration::from_millis(300)).is_err());
        drop(hold_tx);
        // (The interrupted streams' failures may be reported before it.)
        while !seen_rx.recv_timeout(wait).expect("Gone is reported") {}
        assert!(seen_rx.recv_timeout(Duration::from_millis(200)).is_err());
    }

    /// A server answering every POST with a JSON result for id 1, and
    /// telling each POST's head (request line and headers) on `heads`; its
    /// port.
    fn head_telling_server(heads: crossbeam_channel::Sender<String>) -> u16 {
        use std::io::{BufRead, BufReader, Read, Write};
        use std::net::TcpListener;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let heads = heads.clone();
                let s = s.unwrap();
                std::thread::spawn(move || {
                    let mut r = BufReader::new(s.try_clone().unwrap());
                    let mut w = s;
                    loop {
                        let (mut head, mut line, mut len) = (String::new(), String::new(), 0);
                        while r.read_line(&mut line).unwrap_or(0) > 2 {
                            let lower = line.to_ascii_lowercase();
                            if let Some(n) = lower.strip_prefix("content-length:") {
                                len = n.trim().parse().unwrap();
                            }
                            head.push_str(&line);
                            line.clear();
                        }
                        if head.is_empty() {
                            return;
                        }
                        let mut body = vec![0; len];
                        r.read_exact(&mut body).unwrap();
                        let _ = heads.send(head);
                        let answer = r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#;
                        let _ = write!(
                            w,
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{answer}",
                            answer.len()
                        );
                        let _ = w.flush();
                    }
                });
            }
        });
        port
    }

    /// The 2026-07-28 headers come from what the dispatcher said of the
    /// request (`Outgoing::modern`), never from its line, which the
    /// transport does not read: here the line names another tool, other
    /// arguments and no version, and the headers are the tag's, the
    /// `Mcp-Param-*` ones of a tool with `x-mcp-header` annotations too
    /// (its arguments' scalars come with the tag: a nested one, a string,
    /// a number, a boolean, and one too long for a header, left out).
    #[test]
    fn a_requests_headers_are_its_tags_and_its_line_is_not_read() {
        let (heads_tx, heads) = crossbeam_channel::unbounded();
        let cfg = remote(head_telling_server(heads_tx));
        let (seen_tx, seen) = crossbeam_channel::unbounded();
        let on_event: OnEvent = Box::new(move |ev| {
            if let ServerEvent::Message(_) = ev {
                let _ = seen_tx.send(());
            }
        });
        let mut http = connect(&cfg, on_event).unwrap();
        let schema = serde_json::json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "n": {"type": "integer", "x-mcp-header": "N"},
            "dry": {"type": "boolean", "x-mcp-header": "Dry"},
            "note": {"type": "string", "x-mcp-header": "Note"},
            "opts": {"type": "object", "properties": {
                "zone": {"type": "string", "x-mcp-header": "Zone"}}}}});
        let map = modern::header_map(&schema).unwrap();
        http.shared
            .tool_headers
            .lock()
            .insert("from-the-tag".into(), map);
        let line = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"from-the-line","arguments":{"region":"line","n":1,"dry":true,"note":"line","opts":{"zone":"line"}}}}
"#;
        let long = "x".repeat(crate::mcp::ArgScalars::MAX_SCALAR);
        let arguments = serde_json::json!({"region": "tag", "n": -7, "dry": false,
            "note": long, "opts": {"zone": "eu 1"}});
        let modern = crate::mcp::Modern {
            version: "2026-07-28".into(),
            name: Some("from-the-tag".into()),
            envelope: "{}".into(),
            arguments: crate::mcp::ArgScalars::read(&arguments.to_string()),
        };
        let out = Outgoing::request(1, "tools/call", line.to_vec()).in_era(Some(Arc::new(modern)));
        assert!(Downstream::send(&mut http, out));
        let head = heads.recv_timeout(Duration::from_secs(10)).unwrap();
        let head = head.to_ascii_lowercase();
        for header in [
            "mcp-protocol-version: 2026-07-28\r\n",
            "mcp-method: tools/call\r\n",
            "mcp-name: from-the-tag\r\n",
            "mcp-param-region: tag\r\n",
            "mcp-param-n: -7\r\n",
            "mcp-param-dry: false\r\n",
            "mcp-param-zone: eu 1\r\n",
        ] {
            assert!(head.contains(header), "{header} in {head}");
        }
        assert!(!head.contains("mcp-param-note"), "{head}");
        assert!(!head.contains(": line\r\n"), "{head}");
        seen.recv_timeout(Duration::from_secs(10)).unwrap();
        // A 2025-era request carries none of them.
        let out = Outgoing::request(1, "tools/call", line.to_vec());
        assert!(Downstream::send(&mut http, out));
        let head = heads.recv_timeout(Duration::from_secs(10)).unwrap();
        let head = head.to_ascii_lowercase();
        assert!(
            !head.contains("mcp-name") && !head.contains("mcp-param"),
            "{head}"
        );
        seen.recv_timeout(Duration::from_secs(10)).unwrap();
        http.kill();
    }

    #[test]
    fn a_kill_after_a_shutdown_never_waits_for_a_report_the_client_holds_up() {
        let cfg = remote(one_event_server());
        let (hold_tx, hold_rx) = crossbeam_channel::bounded::<()>(0);
        let (seen_tx, seen_rx) = crossbeam_channel::unbounded();
        let on_event: OnEvent = Box::new(move |ev| {
            if let ServerEvent::Message(_) = ev {
                let _ = seen_tx.send(());
                let _ = hold_rx.recv();
            }
        });
        let mut http = connect(&cfg, on_event).unwrap();
        let line =
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{}}\n".to_vec();
        assert!(Downstream::send(
            &mut http,
            Outgoing::request(1, "tools/call", line)
        ));
        seen_rx.recv_timeout(Duration::from_secs(5)).unwrap();
        let (done_tx, done_rx) = crossbeam_channel::bounded(1);
        std::thread::spawn(move || {
            http.shutdown(Duration::from_millis(100));
            let _ = done_tx.send("shutdown");
            http.kill();
            let _ = done_tx.send("kill");
            drop(http)
        });
        let a = done_rx.recv_timeout(Duration::from_secs(5));
        let b = done_rx.recv_timeout(Duration::from_secs(5));
        drop(hold_tx);
        assert_eq!(
            (a, b),
            (Ok("shutdown"), Ok("kill")),
            "kill after shutdown blocked"
        );
    }
}
