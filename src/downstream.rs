//! The dispatcher's view of "the server": a small boundary that a transport
//! implements, and the one place a transport is chosen ([`connect`]).
//! The transports are a stdio child process (`child.rs`) and a remote
//! Streamable HTTP server (`http.rs`).
//!
//! A transport accepts outgoing lines and reports what happens to it as
//! [`ServerEvent`]s through a callback: messages, garbage, lines it could
//! not send, and, once, that the server is [`Gone`] — only after everything
//! the server sent has been delivered. How a server is stopped (close its
//! input, ask it, force it) is the transport's business too. Knows nothing
//! of MCP methods, ids or policy; the dispatcher knows nothing of processes
//! or sockets.

#![forbid(unsafe_code)]

use std::time::Duration;

use std::sync::Arc;

use crate::config::{ServerConfig, Transport};
use crate::jsonrpc::Parsed;
pub use crate::policy::recovery::Heal;
use crate::stdio::Backlog;
pub use crate::stdio::{Sent, Withdraw};

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
    /// These lines were never handed to the server (stdio: its input
    /// failed; HTTP: no connection could be made, or the server no longer
    /// knew the session): the requests among them cannot have run. `Gone`
    /// follows.
    Unsent { lines: Vec<Vec<u8>>, why: String },
    /// The server refused these lines without acting on them (HTTP 429, or
    /// 503 with `Retry-After`): the requests among them did not run and may
    /// be sent again, not before `retry_after` when there is one. The
    /// connection stays up.
    Refused {
        lines: Vec<Vec<u8>>,
        why: String,
        retry_after: Option<Duration>,
    },
    /// The transport got no answer to request `id` (raw, as sent) and
    /// never will: what it knows of what happened. The transport reports
    /// this and invents no server answer; the dispatcher answers the
    /// client with the proxy's own error.
    Failed { id: String, failure: Failure },
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
    /// Queues one line (newline included). False if the transport is closed.
    fn send(&mut self, line: Vec<u8>) -> bool;
    /// The same, for a caller with nothing else queued: the transport may
    /// write at once, if that cannot block, instead of batching.
    fn send_now(&mut self, line: Vec<u8>) -> bool {
        self.send(line)
    }
    /// Queues a request line that may be withdrawn while it still waits to
    /// be written (stdio: behind a server that is not reading); `now` as
    /// for [`Downstream::send_now`]. Transports that cannot withdraw a line
    /// answer [`Sent::Written`] once it is handed over.
    fn send_request(&mut self, line: Vec<u8>, now: bool) -> Sent {
        let sent = match now {
            true => self.send_now(line),
            false => self.send(line),
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
        Transport::Http => crate::http::connect(cfg, on_event)
            .map(|c| Box::new(c) as Box<dyn Downstream>)
            .map_err(|message| StartError {
                message,
                heal: Heal::Fix,
            }),
    }
}

/// How long a graceful stop waits at each step (close input, then
/// terminate, then kill), as the MCP SDKs do.
pub const SHUTDOWN_STEP: Duration = Duration::from_secs(2);
