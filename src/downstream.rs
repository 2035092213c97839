//! The dispatcher's view of "the server": a small boundary that a transport
//! implements, and the one place a transport is chosen ([`connect`]).
//! The transports are a stdio child process (`child.rs`) and a remote
//! Streamable HTTP server (`http.rs`).
//!
//! A transport accepts [`Outgoing`] messages (a line, and what the
//! dispatcher knows of it: a request's id and method, the request a cancel
//! targets) and reports what happens to it as [`ServerEvent`]s through a
//! callback: messages, garbage, messages it could not send (given back as
//! they came), requests it got no answer to (by id), and, once, that the
//! server is [`Gone`] — only after everything the server sent has been
//! delivered. A transport never parses an outgoing line to learn what it
//! is. How a server is stopped (close its input, ask it, force it) is the
//! transport's business too. Knows nothing of policy; the dispatcher knows
//! nothing of processes or sockets.

#![forbid(unsafe_code)]

use std::time::Duration;

use std::sync::Arc;

use crate::config::{ServerConfig, Transport};
use crate::jsonrpc::Parsed;
use crate::mcp::Modern;
use crate::stdio::Backlog;
pub use crate::stdio::{Sent, Withdraw};

/// Whether waiting can heal what stopped a start, or ended a link: what a
/// transport reports of a failure, for the dispatcher's recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heal {
    /// Refused, reset, an exit at start, a 5xx: the server may come back.
    Wait,
    /// Command not found, a TLS or certificate error, 401/403, an unknown
    /// host name: someone must fix something first.
    Fix,
}

/// One message for the server: its line (newline included) and what it
/// is, as the dispatcher that wrote it knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub bytes: Vec<u8>,
    pub kind: OutKind,
}

/// What an [`Outgoing`] line is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutKind {
    /// A request, with the proxy's id for it (every request the server
    /// gets carries one), its method and, for a 2026-07-28 request, what
    /// its headers say (read where the request was first read: no
    /// transport parses a line).
    Request {
        id: u64,
        method: Method,
        modern: Option<Arc<Modern>>,
    },
    /// `notifications/cancelled` for the proxy's request `target`.
    Cancel { target: u64 },
    /// Any other notification.
    Notification { method: Method },
    /// An answer to one of the server's requests.
    Response,
}

/// A method name: the ones the proxy sends most are not allocated for
/// every message (an attempt of a `tools/call` is sent many times a second).
pub type Method = std::borrow::Cow<'static, str>;

/// `method` as a [`Method`].
fn method_name(method: &str) -> Method {
    const KNOWN: [&str; 5] = [
        "tools/call",
        "tools/list",
        "initialize",
        "notifications/initialized",
        "ping",
    ];
    match KNOWN.iter().find(|k| **k == method) {
        Some(k) => Method::Borrowed(k),
        None => Method::Owned(method.to_owned()),
    }
}

impl Outgoing {
    pub fn request(id: u64, method: &str, bytes: Vec<u8>) -> Outgoing {
        let method = method_name(method);
        Outgoing {
            bytes,
            kind: OutKind::Request {
                id,
                method,
                modern: None,
            },
        }
    }

    /// A request of the proxy's own, with `params` (what the dispatcher
    /// wrote, read here for its era).
    pub fn own_request(id: u64, method: &str, params: &str, bytes: Vec<u8>) -> Outgoing {
        let modern = Modern::of(method, params).map(Arc::new);
        Outgoing::request(id, method, bytes).in_era(modern)
    }

    /// A request sent in the 2026-07-28 era when `modern` is given.
    pub fn in_era(mut self, modern: Option<Arc<Modern>>) -> Outgoing {
        if let OutKind::Request { modern: m, .. } = &mut self.kind {
            *m = modern;
        }
        self
    }

    /// What a 2026-07-28 request's headers say.
    pub fn modern(&self) -> Option<&Modern> {
        match &self.kind {
            OutKind::Request { modern, .. } => modern.as_deref(),
            _ => None,
        }
    }

    pub fn notification(method: &str, bytes: Vec<u8>) -> Outgoing {
        let method = method_name(method);
        Outgoing {
            bytes,
            kind: OutKind::Notification { method },
        }
    }

    pub fn cancel(target: u64, bytes: Vec<u8>) -> Outgoing {
        Outgoing {
            bytes,
            kind: OutKind::Cancel { target },
        }
    }

    pub fn response(bytes: Vec<u8>) -> Outgoing {
        Outgoing {
            bytes,
            kind: OutKind::Response,
        }
    }

    /// The proxy's id, for a request.
    pub fn request_id(&self) -> Option<u64> {
        match self.kind {
            OutKind::Request { id, .. } => Some(id),
            _ => None,
        }
    }

    /// The method, for a request or a notification.
    pub fn method(&self) -> Option<&str> {
        match &self.kind {
            OutKind::Request { method, .. } | OutKind::Notification { method } => Some(method),
            OutKind::Cancel { .. } => Some("notifications/cancelled"),
            OutKind::Response => None,
        }
    }
}

/// What a transport reports.
#[derive(Debug)]
pub enum ServerEvent {
    /// A JSON-RPC message (or batch) from the server.
    Message(Parsed),
    /// Something that is not JSON arrived (already logged). `head` is the
    /// start of it, when there was something to show (not redacted).
    Garbage { head: Option<String> },
    /// The server has started a line over `max_message_bytes`: nothing it
    /// writes gets through until that line ends (`TooLong` then follows).
    Overlong,
    /// A line over `max_message_bytes` ended and was dropped (already
    /// logged). `response_id` is the raw id of the response it was, when
    /// the line could be read far enough to know.
    TooLong {
        response_id: Option<String>,
        len: usize,
    },
    /// These messages were never handed to the server (stdio: its input
    /// failed; HTTP: no connection could be made, or the server no longer
    /// knew the session): the requests among them cannot have run. `Gone`
    /// follows.
    Unsent { lines: Vec<Outgoing>, why: String },
    /// The server refused these lines without acting on them (HTTP 429, or
    /// 503 with `Retry-After`): the requests among them did not run and may
    /// be sent again, not before `retry_after` when there is one. The
    /// connection stays up.
    Refused {
        lines: Vec<Outgoing>,
        why: String,
        retry_after: Option<Duration>,
    },
    /// The transport got no answer to request `id` (the proxy's, see
    /// [`OutKind::Request`]) and never will: what it knows of what
    /// happened. The transport reports this and invents no server answer;
    /// the dispatcher answers the client with the proxy's own error.
    Failed { id: u64, failure: Failure },
    /// The server takes no more input, but what it sent is still being
    /// delivered (stdio: the process exited with output left in the pipe);
    /// `Gone` follows. New traffic should wait for the next server.
    Draining,
    /// The server is gone, for good; reported once, after every message it
    /// sent has been reported.
    Gone(Gone),
}

/// How a server went away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gone {
    /// For people, after the server's description: `exited with status 3`.
    pub how: String,
    /// Whether requests sent to it may have reached it (and so may have
    /// run). False only when the transport knows that nothing it was given
    /// was delivered.
    pub may_have_received: bool,
    /// Whether waiting may bring it back ([`Heal::Wait`]: it exited,
    /// refused, reset) or someone must fix something first ([`Heal::Fix`]:
    /// an unknown host, a certificate the server's name does not match).
    pub heal: Heal,
}

/// What a transport knows of a request it got no answer to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// For people, with the server named: `the MCP server http://h/mcp
    /// answered 502 Bad Gateway: upstream down`.
    pub message: String,
    /// The HTTP status, when one came.
    pub status: Option<u16>,
    /// The server had all of the request, so it may have run (a 5xx, a
    /// connection broken after the request was written); false when it was
    /// refused and did not run (401, 403, another 4xx).
    pub may_have_run: bool,
    /// It was not sent: as the client wrote it, it cannot be (a method
    /// with a control character, which an HTTP header cannot carry). The
    /// client's error: answered -32602.
    pub invalid: bool,
}

/// Why a server could not be started or connected to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartError {
    /// For people: `cannot start "npx": No such file or directory`.
    pub message: String,
    pub heal: Heal,
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// One live connection to the server.
pub trait Downstream: Send {
    /// Queues one message. False if the transport is closed.
    fn send(&mut self, out: Outgoing) -> bool;
    /// The same, for a caller with nothing else queued: the transport may
    /// write at once, if that cannot block, instead of batching.
    fn send_now(&mut self, out: Outgoing) -> bool {
        self.send(out)
    }
    /// Queues a request that may be withdrawn while it still waits to be
    /// written (stdio: behind a server that is not reading); `now` as for
    /// [`Downstream::send_now`]. Transports that cannot withdraw a message
    /// answer [`Sent::Written`] once it is handed over.
    fn send_request(&mut self, out: Outgoing, now: bool) -> Sent {
        let sent = match now {
            true => self.send_now(out),
            false => self.send(out),
        };
        match sent {
            true => Sent::Written,
            false => Sent::Closed,
        }
    }
    /// Stops the server gracefully, without blocking: its input is closed,
    /// then after `step` it is asked to stop, then after another `step`
    /// forced (stdio: close stdin, SIGTERM, SIGKILL). [`ServerEvent::Gone`]
    /// follows.
    fn shutdown(&mut self, step: Duration);
    /// Stops it now (stdio: SIGKILL to its process group); `Gone` follows.
    fn kill(&mut self);
    /// Counts the bytes queued for the server and not yet taken by it;
    /// whoever feeds it (the client's reader) waits while it is over its
    /// limit. Closed when the transport stops taking input.
    fn input_backlog(&self) -> Option<Arc<Backlog>> {
        None
    }
    /// For messages: `"cmd" (pid N)`.
    fn describe(&self) -> String;
    /// The server's last diagnostic lines (stdio: stderr), oldest first,
    /// redacted (`redact::Redactor`): they are quoted to the client.
    /// Asked when the server is gone; may wait a moment for the last ones.
    fn diagnostics(&self) -> Vec<String>;
}

/// How a transport's events reach their consumer (called from the
/// transport's own threads).
pub type OnEvent = Box<dyn Fn(ServerEvent) + Send + Sync>;

/// How a server's diagnostics are treated (stdio: its stderr).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Diagnostics {
    /// Copied to our stderr as they come (and the tail kept).
    Copy,
    /// Only the tail kept (for `check`, whose output must stay readable).
    Keep,
}

/// Connects to the server `cfg` describes, with the transport it names.
/// The error says why, for people, and whether waiting can heal it.
pub fn connect(
    cfg: &ServerConfig,
    diagnostics: Diagnostics,
    on_event: OnEvent,
) -> Result<Box<dyn Downstream>, StartError> {
    match cfg.transport {
        Transport::Stdio => crate::child::spawn(cfg, diagnostics, on_event)
            .map(|c| Box::new(c) as Box<dyn Downstream>)
            .map_err(|e| StartError {
                message: e.to_string(),
                heal: e.heal,
            }),
        Transport::Http => {
            crate::http::connect(cfg, on_event).map(|c| Box::new(c) as Box<dyn Downstream>)
        }
    }
}

/// How long a graceful stop waits at each step (close input, then
/// terminate, then kill), as the MCP SDKs do.
pub const SHUTDOWN_STEP: Duration = Duration::from_secs(2);
