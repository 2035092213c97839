//! The Streamable HTTP transport (MCP 2025-03-26 to 2025-11-25): a remote
//! server at `url:` reached with blocking HTTP/1.1 (ureq), behind the same
//! [`Downstream`] boundary as a stdio child.
//!
//! Each line the dispatcher sends becomes one POST, made by one of a small
//! pool of `http-post` threads. A JSON answer or the events of an SSE
//! answer are reported in the order they came, the POST's own answer last;
//! a notification or a response gets 202. The session id the server sets on
//! `initialize` and the negotiated protocol version go on every later
//! request. After `notifications/initialized`, an `http-get` thread keeps
//! the server's own stream open (405: the server has none), re-opening it
//! with backoff. Ids are left alone: the dispatcher already owns them.
//!
//! An answer stream that breaks, or ends without the response, after
//! events with ids is resumed with GET and `Last-Event-ID` (up to 3 times,
//! after the stream's `retry`, at most 5 s): a server with an event store
//! replays what followed, and the call is not run again. Events already
//! seen in the session and responses to other requests are dropped from a
//! replay. Only when that fails is the failure classified.
//!
//! Failures are classified by `classify.rs` and become the boundary's
//! events: a request that cannot have left (DNS, refused, TLS) is `Unsent`
//! and the connection `Gone` (nothing received), so the dispatcher resends
//! it after reconnecting; a connection that broke after sending is `Gone`
//! with `may_have_received` (the safety gate decides); a lost session is
//! `Unsent` plus `Gone`, so the link re-initializes and the message goes
//! again; 429 and 503 with `Retry-After` are `Refused` (not run, retried
//! after the hint); 500/502/503/504 answer the request with a transient
//! error (it may have run); other statuses answer it with a final error
//! naming the status. Header values are secrets: they never appear in a
//! message, and the server's text is scrubbed of them.
//!
//! Closing the connection (`shutdown` after its DELETE, `kill`, or
//! dropping it) shuts the agent down, which interrupts every request in
//! flight: a blocked reader, the GET stream's included, returns at once.
//! Otherwise a POST waits at most `call_timeout` + 5 s for its answer's
//! headers and `retry.total_timeout` + 5 s for its body, so a stuck server
//! holds a pool thread no longer than that (a cancelled call's stream is
//! read until the server ends it, within that bound). Knows no policy and
//! no MCP method but `initialize` and `notifications/initialized`.

#![forbid(unsafe_code)]

mod classify;
pub mod sse;

use std::collections::{HashSet, VecDeque};
use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use crate::config::{check_header, ServerConfig};
use crate::downstream::{Downstream, Gone, OnEvent, ServerEvent};
use crate::jsonrpc::{self, Message};

use classify::Class;

/// Threads making POSTs: calls in flight at once beyond this wait their turn.
const POOL: usize = 8;
/// Idle connections are dropped before the servers' usual 5 s keep-alive
/// ends, so a request never goes out on a connection the server is closing.
const MAX_IDLE_AGE: Duration = Duration::from_secs(4);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How much of an error answer's body is read for its message.
const ERROR_BODY_LIMIT: u64 = 64 * 1024;
/// The GET stream's reconnection delays: 1 s, growing ×1.5, at most 30 s.
const GET_RETRY_FIRST: Duration = Duration::from_secs(1);
const GET_RETRY_MAX: Duration = Duration::from_secs(30);
/// How long `headers_helper` may run.
const HELPER_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts to resume a request's broken answer stream.
const RESUMES: usize = 3;
/// The longest `retry` a resumption waits for.
const RESUME_WAIT_MAX: Duration = Duration::from_secs(5);
/// Event ids remembered to drop replayed events.
const SEEN_IDS: usize = 4096;
/// A final error for an HTTP status other than the transient ones.
const REJECTED_CODE: i64 = -32600;
/// The error for 500/502/503/504, one of the default transient codes.
const SERVER_ERROR_CODE: i64 = -32603;

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
    let agent: ureq::Agent = config.build().into();
    let (jobs, rx) = crossbeam_channel::unbounded::<Vec<u8>>();
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
        session: Mutex::new(SessionState::default()),
        seen: Mutex::new((HashSet::new(), VecDeque::new())),
        on_event,
        closed: AtomicBool::new(false),
        gone: Mutex::new(false),
        requests: AtomicUsize::new(0),
        max_message_bytes: cfg.max_message_bytes,
        recv_response: cfg.call_timeout + Duration::from_secs(5),
        recv_body: cfg.call_timeout.max(cfg.retry.total_timeout) + Duration::from_secs(5),
        stopped,
    });
    for n in 0..POOL {
        let shared = shared.clone();
        let rx: Receiver<Vec<u8>> = rx.clone();
        std::thread::Builder::new()
            .name(format!("http-post-{n}"))
            .spawn(move || {
                for line in rx {
                    shared.post(line);
                }
            })
            .map_err(|e| format!("cannot start the HTTP threads: {e}"))?;
    }
    Ok(Http {
        shared,
        jobs: Some(jobs),
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

/// A connection to a remote server: one MCP session.
pub struct Http {
    shared: Arc<Shared>,
    /// The POST threads' queue; dropped when the connection closes.
    jobs: Option<Sender<Vec<u8>>>,
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
    session: Mutex<SessionState>,
    /// Event ids seen in this session, for dropping replays.
    seen: Mutex<(HashSet<String>, VecDeque<String>)>,
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
}

/// Where a request's answer stream is: its last event id and `retry`.
#[derive(Default)]
struct Cursor {
    last_id: Option<String>,
    retry: Option<Duration>,
}

#[derive(Default)]
struct SessionState {
    id: Option<String>,
    protocol_version: Option<String>,
    get_started: bool,
}

/// One message being posted.
struct Post<'a> {
    line: &'a [u8],
    /// The raw id of a request (None for a notification or a response).
    request_id: Option<String>,
    initialize: bool,
    initialized: bool,
}

impl Downstream for Http {
    fn send(&mut self, line: Vec<u8>) -> bool {
        if self.shared.is_closed() {
            return false;
        }
        match &self.jobs {
            Some(jobs) => jobs.send(line).is_ok(),
            None => false,
        }
    }

    fn shutdown(&mut self, step: Duration) {
        self.close();
        self.finish(Some(step), "was closed");
    }

    fn kill(&mut self) {
        self.close();
        self.finish(None, "was disconnected");
    }

    fn describe(&self) -> String {
        self.shown.clone()
    }

    fn diagnostics(&self) -> Vec<String> {
        Vec::new()
    }
}

impl Http {
    /// Reports `Gone` (after ending the session within `delete`, if given)
    /// from a thread of its own: a transport thread reporting a message may
    /// hold the lock `Gone` needs while the client is behind, and the
    /// caller is the dispatcher, which must not wait for that.
    fn finish(&self, delete: Option<Duration>, how: &'static str) {
        let shared = self.shared.clone();
        let spawned = std::thread::Builder::new()
            .name("http-close".into())
            .spawn(move || {
                if let Some(step) = delete {
                    shared.delete_session(step);
                }
                shared.agent.clone().shutdown();
                shared.gone(how, true);
            });
        if let Err(e) = spawned {
            crate::warn!("cannot start a thread to close {}: {e}", self.shown);
            self.shared.agent.clone().shutdown();
            self.shared.gone(how, true);
        }
    }

    fn close(&mut self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.jobs = None;
        self.stop = None;
    }
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

    /// Reports `Gone`, once; nothing is reported after it.
    fn gone(&self, how: &str, may_have_received: bool) {
        let mut gone = self.gone.lock();
        if *gone {
            return;
        }
        *gone = true;
        self.closed.store(true, Ordering::SeqCst);
        (self.on_event)(ServerEvent::Gone(Gone {
            how: how.to_owned(),
            may_have_received,
        }));
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
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
        text
    }

    /// Posts one line and reports what came of it.
    fn post(self: &Arc<Shared>, line: Vec<u8>) {
        if self.is_closed() {
            return;
        }
        let text = String::from_utf8_lossy(&line).trim_end().to_owned();
        let m = Message::reparse(text);
        let method = m.as_ref().and_then(|m| m.method().map(|s| s.into_owned()));
        let request_id = m
            .as_ref()
            .filter(|_| method.is_some())
            .and_then(|m| m.id().map(str::to_owned));
        let post = Post {
            line: &line,
            initialize: method.as_deref() == Some("initialize"),
            initialized: method.as_deref() == Some("notifications/initialized"),
            request_id,
        };
        let counted = post.request_id.is_some();
        if counted {
            self.requests.fetch_add(1, Ordering::SeqCst);
        }
        self.post_counted(&post);
        if counted {
            self.requests.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn post_counted(self: &Arc<Shared>, post: &Post) {
        let mut refreshed = false;
        loop {
            let (session, version) = if post.initialize {
                self.session.lock().id = None;
                (None, None)
            } else {
                let s = self.session.lock();
                (s.id.clone(), s.protocol_version.clone())
            };
            let mut req = self
                .agent
                .post(&self.url)
                .header("Accept", "application/json, text/event-stream")
                .header("Content-Type", "application/json");
            if let Some(id) = &session {
                req = req.header("Mcp-Session-Id", id);
            }
            if let Some(v) = &version {
                req = req.header("MCP-Protocol-Version", v);
            }
            for (name, value) in self.headers(refreshed) {
                req = req.header(name, value);
            }
            let result = req
                .config()
                .timeout_recv_response(Some(self.recv_response))
                .timeout_recv_body(Some(self.recv_body))
                .build()
                .send(post.line);
            let resp = match result {
                Ok(resp) => resp,
                Err(e) => {
                    let class = classify::of_error(&e);
                    let why = self.scrub(&e.to_string());
                    return self.failed(post, class, &why, None);
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
            let class =
                classify::of_status(status, retry_after.as_deref(), session.is_some(), &body);
            if class == Class::Unauthorized && self.helper.is_some() && !refreshed {
                crate::info!(
                    "{} answered {}; running headers_helper again",
                    self.shown,
                    classify::status_line(status)
                );
                refreshed = true;
                continue;
            }
            let why = match server_message(&body) {
                Some(msg) => format!("{}: {}", classify::status_line(status), self.scrub(&msg)),
                None => classify::status_line(status),
            };
            return self.failed(post, class, &why, Some(status));
        }
    }

    /// A 2xx answer to `post`.
    fn answered(self: &Arc<Shared>, post: &Post, resp: ureq::http::Response<ureq::Body>) {
        if post.initialize {
            self.session.lock().id = header(&resp, "mcp-session-id");
        }
        let kind = header(&resp, "content-type").unwrap_or_default();
        let is_sse = kind.to_ascii_lowercase().starts_with("text/event-stream");
        let is_json = kind.to_ascii_lowercase().starts_with("application/json");
        if post.initialized {
            self.start_get_stream();
        }
        let Some(request_id) = &post.request_id else {
            // A notification or a response: 202, nothing to read.
            return;
        };
        let delivered = if is_sse {
            let reader = resp.into_body().into_reader();
            let mut cursor = Cursor::default();
            match self.read_stream(reader, request_id, post.initialize, &mut cursor, false) {
                Ok(true) => true,
                // Ended or broken after events with ids: the server may
                // replay the rest (and the response) to a GET.
                Ok(false) if self.resume(request_id, post.initialize, &mut cursor) => true,
                Ok(false) => false,
                Err(_) if self.resume(request_id, post.initialize, &mut cursor) => true,
                Err(e) => {
                    let why = format!("the answer's stream broke ({})", self.scrub(&e.to_string()));
                    return self.failed(post, Class::Broken, &why, None);
                }
            }
        } else if is_json {
            let limit = self.max_message_bytes as u64;
            match resp.into_body().with_config().limit(limit).read_to_string() {
                Ok(text) => {
                    self.deliver(text, Some(request_id), post.initialize);
                    true
                }
                Err(ureq::Error::BodyExceedsLimit(n)) => {
                    self.emit(ServerEvent::TooLong {
                        response_id: Some(request_id.clone()),
                        len: n as usize,
                    });
                    true
                }
                Err(e) => {
                    let why = format!("the answer broke ({})", self.scrub(&e.to_string()));
                    return self.failed(post, Class::Broken, &why, None);
                }
            }
        } else {
            false
        };
        if !delivered {
            let why = "the server's answer ended without a response to the request";
            self.failed(post, Class::ServerError, why, None);
        }
    }

    /// Reads the SSE answer of a request, reporting its messages, until
    /// the response with id `until`; says whether it came. `resumed`: the
    /// stream replays events (`Last-Event-ID`), so those already seen and
    /// responses to other requests are dropped.
    fn read_stream(
        &self,
        mut reader: impl Read,
        until: &str,
        initialize: bool,
        cursor: &mut Cursor,
        resumed: bool,
    ) -> std::io::Result<bool> {
        let mut parser = sse::Parser::new(self.max_message_bytes);
        let mut buf = vec![0u8; 16 * 1024];
        let mut items = Vec::new();
        loop {
            let n = reader.read(&mut buf)?;
            if n == 0 {
                return Ok(false);
            }
            parser.feed(&buf[..n], &mut items);
            if let Some(id) = parser.last_id() {
                cursor.last_id = Some(id.to_owned());
            }
            cursor.retry = parser.retry().or(cursor.retry);
            for item in items.drain(..) {
                match item {
                    sse::Item::Event(e) if e.kind == "message" => {
                        let fresh = e.id.as_deref().is_none_or(|id| self.first_sight(id));
                        if resumed && (!fresh || is_other_response(&e.data, until)) {
                            continue;
                        }
                        if self.deliver(e.data, Some(until), initialize) {
                            return Ok(true);
                        }
                    }
                    sse::Item::Event(_) => {}
                    sse::Item::TooLong => {
                        crate::warn!(
                            "{} sent an event over max_message_bytes; dropped",
                            self.shown
                        );
                        self.emit(ServerEvent::TooLong {
                            response_id: None,
                            len: self.max_message_bytes,
                        });
                    }
                }
            }
        }
    }

    /// Resumes the broken or ended answer stream of request `until` with
    /// GET and `Last-Event-ID`, up to [`RESUMES`] times, waiting the
    /// stream's `retry` first; says whether the response came.
    fn resume(&self, until: &str, initialize: bool, cursor: &mut Cursor) -> bool {
        for _ in 0..RESUMES {
            let Some(last_id) = cursor.last_id.clone() else {
                return false;
            };
            let wait = cursor.retry.unwrap_or_default().min(RESUME_WAIT_MAX);
            if !matches!(
                self.stopped.recv_timeout(wait),
                Err(RecvTimeoutError::Timeout)
            ) {
                return false;
            }
            let (session, version) = {
                let s = self.session.lock();
                (s.id.clone(), s.protocol_version.clone())
            };
            let Some(session) = session else {
                return false;
            };
            let mut req = self
                .agent
                .get(&self.url)
                .header("Accept", "text/event-stream")
                .header("Mcp-Session-Id", &session)
                .header("Last-Event-ID", &last_id);
            if let Some(v) = &version {
                req = req.header("MCP-Protocol-Version", v);
            }
            for (name, value) in self.headers(false) {
                req = req.header(name, value);
            }
            crate::debug!("resuming the answer to request {until} from {}", self.shown);
            let result = req
                .config()
                .timeout_recv_response(Some(self.recv_response))
                .timeout_recv_body(Some(self.recv_body))
                .build()
                .call();
            match result {
                Ok(resp) if resp.status().is_success() => {
                    let reader = resp.into_body().into_reader();
                    if let Ok(true) = self.read_stream(reader, until, initialize, cursor, true) {
                        return true;
                    }
                }
                // No resumption here (405, a lost session, …).
                Ok(_) => return false,
                Err(_) => {}
            }
        }
        false
    }

    /// Whether the event id `id` is new to this session (remembered, up to
    /// [`SEEN_IDS`] of them).
    fn first_sight(&self, id: &str) -> bool {
        let mut seen = self.seen.lock();
        if seen.0.contains(id) {
            return false;
        }
        seen.0.insert(id.to_owned());
        seen.1.push_back(id.to_owned());
        if seen.1.len() > SEEN_IDS {
            if let Some(old) = seen.1.pop_front() {
                seen.0.remove(&old);
            }
        }
        true
    }

    /// Reports one message; true if it is the response with id `until`.
    fn deliver(&self, text: String, until: Option<&str>, initialize: bool) -> bool {
        match jsonrpc::classify(text) {
            jsonrpc::Parsed::Message(m) => {
                let is_answer = until.is_some_and(|id| m.id() == Some(id) && m.method().is_none());
                if is_answer && initialize {
                    self.session.lock().protocol_version =
                        protocol_version(&String::from_utf8_lossy(&m.line()));
                }
                self.emit(ServerEvent::Message(jsonrpc::Parsed::Message(m)));
                is_answer
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

    /// A POST that did not get its answer.
    fn failed(&self, post: &Post, class: Class, why: &str, status: Option<u16>) {
        let others = self.requests.load(Ordering::SeqCst) > usize::from(post.request_id.is_some());
        match class {
            Class::NeverSent => {
                self.emit(ServerEvent::Unsent {
                    lines: vec![post.line.to_vec()],
                });
                self.gone(&format!("could not be reached ({why})"), others);
            }
            Class::Broken => self.gone(&format!("broke the connection ({why})"), true),
            Class::SessionLost => {
                self.session.lock().id = None;
                self.emit(ServerEvent::Unsent {
                    lines: vec![post.line.to_vec()],
                });
                self.gone(&format!("ended the session ({why})"), others);
            }
            Class::Refused(retry_after) => self.emit(ServerEvent::Refused {
                lines: vec![post.line.to_vec()],
                why: format!("the server answered {why}"),
                retry_after,
            }),
            Class::ServerError | Class::Unauthorized | Class::Rejected => {
                let code = match class {
                    Class::ServerError => SERVER_ERROR_CODE,
                    _ => REJECTED_CODE,
                };
                match &post.request_id {
                    Some(id) => {
                        let message = match status {
                            Some(_) => format!("the MCP server {} answered {why}", self.shown),
                            None => format!("the MCP server {}: {why}", self.shown),
                        };
                        let data = status.map(|s| format!("{{\"httpStatus\":{s}}}"));
                        let line = jsonrpc::error_line(Some(id), code, &message, data.as_deref());
                        let line = String::from_utf8_lossy(&line).trim_end().to_owned();
                        self.deliver(line, None, false);
                    }
                    None => crate::warn!("{} refused a notification: {why}", self.shown),
                }
            }
        }
    }

    /// Starts the thread that keeps the server's own stream open.
    fn start_get_stream(self: &Arc<Shared>) {
        let mut s = self.session.lock();
        if s.get_started {
            return;
        }
        s.get_started = true;
        drop(s);
        let shared = self.clone();
        let spawned = std::thread::Builder::new()
            .name("http-get".into())
            .spawn(move || shared.get_loop());
        if let Err(e) = spawned {
            crate::warn!(
                "cannot start the thread for the stream of {}: {e}",
                self.shown
            );
        }
    }

    /// Ends the session: DELETE with its id, within `step` (405 and other
    /// refusals are fine).
    fn delete_session(&self, step: Duration) {
        let Some(id) = self.session.lock().id.clone() else {
            return;
        };
        let mut req = self.agent.delete(&self.url).header("Mcp-Session-Id", &id);
        for (name, value) in self.headers(false) {
            req = req.header(name, value);
        }
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
    fn get_loop(&self) {
        let mut delay = GET_RETRY_FIRST;
        let mut last_id: Option<String> = None;
        while !self.is_closed() {
            let (session, version) = {
                let s = self.session.lock();
                (s.id.clone(), s.protocol_version.clone())
            };
            let mut req = self
                .agent
                .get(&self.url)
                .header("Accept", "text/event-stream");
            if let Some(id) = &session {
                req = req.header("Mcp-Session-Id", id);
            }
            if let Some(v) = &version {
                req = req.header("MCP-Protocol-Version", v);
            }
            if let Some(id) = &last_id {
                req = req.header("Last-Event-ID", id);
            }
            for (name, value) in self.headers(false) {
                req = req.header(name, value);
            }
            let mut wait = delay;
            match req.call() {
                Ok(resp) if resp.status().as_u16() == 405 => {
                    crate::debug!("{} has no stream of its own (405)", self.shown);
                    return;
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
                    wait = parser_retry.unwrap_or(delay);
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
        mut reader: impl Read,
        last_id: &mut Option<String>,
        retry: &mut Option<Duration>,
    ) -> std::io::Result<()> {
        let mut parser = sse::Parser::new(self.max_message_bytes);
        let mut buf = vec![0u8; 16 * 1024];
        let mut items = Vec::new();
        loop {
            let n = reader.read(&mut buf)?;
            *retry = parser.retry();
            if let Some(id) = parser.last_id() {
                *last_id = Some(id.to_owned());
            }
            if n == 0 || self.is_closed() {
                return Ok(());
            }
            parser.feed(&buf[..n], &mut items);
            for item in items.drain(..) {
                if let sse::Item::Event(e) = item {
                    let fresh = e.id.as_deref().is_none_or(|id| self.first_sight(id));
                    if e.kind == "message" && fresh {
                        self.deliver(e.data, None, false);
                    }
                }
            }
        }
    }
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
    std::thread::Builder::new()
        .name("headers-helper".into())
        .spawn(move || {
            let mut out = Vec::new();
            let _ = stdout.read_to_end(&mut out);
            let _ = tx.send(out);
        })
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
    fn the_protocol_version_comes_from_the_initialize_result() {
        let line = r#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18"}}"#;
        assert_eq!(protocol_version(line).as_deref(), Some("2025-06-18"));
        assert_eq!(protocol_version(r#"{"id":1,"error":{}}"#), None);
    }
}
