//! The dispatcher's view of "the server": a small boundary that a transport
//! implements. Today the only transport is a stdio child process
//! (`child.rs`); a Streamable HTTP transport slots in beside it.
//!
//! A transport accepts outgoing lines and reports what happens to it as
//! [`ServerEvent`]s through a callback. Knows nothing of MCP methods, ids or
//! policy; the dispatcher knows nothing of processes or sockets.

#![forbid(unsafe_code)]

use std::time::Duration;

use crate::child::ExitInfo;
use crate::jsonrpc::Parsed;

/// What a transport reports.
#[derive(Debug)]
pub enum ServerEvent {
    /// A JSON-RPC message (or batch) from the server.
    Message(Parsed),
    /// Something that is not JSON arrived (already logged).
    Garbage,
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
    /// The server will send nothing more (stdout closed).
    StdoutClosed,
    /// The server process ended.
    Exited(ExitInfo),
    /// Sending failed; these lines were never handed to the server.
    WriteFailed { unsent: Vec<Vec<u8>> },
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
    /// Stops accepting input (stdio: closes the child's stdin).
    fn close_input(&mut self);
    /// Asks the server to stop (stdio: SIGTERM to its process group).
    fn terminate(&mut self);
    /// Stops it now (stdio: SIGKILL to its process group).
    fn kill(&mut self);
    /// For messages: `"cmd" (pid N)`.
    fn describe(&self) -> String;
    /// The server's last diagnostic lines (stdio: stderr), oldest first,
    /// redacted (`redact::Redactor`): they are quoted to the client.
    /// Asked when the server is gone; may wait a moment for the last ones.
    fn diagnostics(&self) -> Vec<String>;
}

/// How long a graceful stop waits at each step (close input, then terminate,
/// then kill), as the MCP SDKs do.
pub const SHUTDOWN_STEP: Duration = Duration::from_secs(2);
