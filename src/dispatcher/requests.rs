//! The request tables: every request crossing the proxy that is not
//! answered yet, and the ids the proxy gives them (as lsp-server's
//! `ReqQueue`): the client's requests by their id, what each downstream id
//! stands for (a relayed request, a replay, the proxy's own `tools/list`;
//! calls' attempts are `Calls`'s), lines still unwritten, the server's
//! requests waiting for the client, and batches being collected. Knows
//! nothing of transports or policies; the dispatcher routes events to it.

#![forbid(unsafe_code)]

use std::time::Instant;

use crate::downstream::Withdraw;
use crate::fasthash::FastMap;
use crate::guard::Pending;
use crate::jsonrpc::Message;

use super::link::ReplayStep;

/// Every request in flight across the proxy.
#[derive(Default)]
pub(super) struct Requests {
    pub(super) next_downstream_id: u64,
    pub(super) inflight: FastMap<u64, Inflight>,
    /// Requests whose lines still wait to be written to the server, by
    /// downstream id: withdrawn when their call is over.
    pub(super) unwritten: FastMap<u64, Withdraw>,
    /// The client's requests not yet answered, by their id (raw).
    pub(super) client: FastMap<String, ClientRequest>,
    /// The server's requests waiting for the client, by the id the client
    /// was given.
    pub(super) server: FastMap<u64, ServerRequest>,
    /// Open server requests that pause attempt clocks, and since when.
    pub(super) pausing: usize,
    pub(super) paused_since: Option<Instant>,
    next_server_id: u64,
    pub(super) batches: FastMap<u64, Batch>,
    next_batch: u64,
    /// The ids of `client` not yet answered, kept where a panic of the
    /// dispatcher cannot lose them (see `proxy.rs`).
    pub(super) pending: Pending,
}

impl Requests {
    /// A new downstream id, for a request to the server.
    pub(super) fn next_downstream(&mut self) -> u64 {
        self.next_downstream_id += 1;
        self.next_downstream_id
    }

    /// A new id for a server's request, as the client sees it.
    pub(super) fn next_server_id(&mut self) -> u64 {
        self.next_server_id += 1;
        self.next_server_id
    }

    /// A new batch number.
    pub(super) fn next_batch(&mut self) -> u64 {
        self.next_batch += 1;
        self.next_batch
    }
}

/// What a downstream id stands for, unless it is a call's (those are
/// [`Calls`]'s).
#[derive(Debug)]
pub(super) enum Inflight {
    /// A client request relayed as is; `resend` keeps read-only requests,
    /// which are sent again after a restart.
    Client {
        client_id: String,
        method: Method,
        resend: Option<Message>,
    },
    /// The proxy's replay of the session to a new incarnation.
    Replay(ReplayStep),
    /// The proxy's own `tools/list`, to learn annotations (`first`: a
    /// first page).
    ToolsList { first: bool },
    /// The proxy's own request for a list the handshake cache keeps.
    Listing { list: crate::mcp::List, first: bool },
}

/// Methods whose answers the dispatcher looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Method {
    Initialize,
    /// `tools/list`; `first` when it asks for the first page.
    ToolsList {
        first: bool,
    },
    /// A request that only reads: sent again after a restart.
    ReadOnly,
    Other,
}

/// A client request not yet answered.
#[derive(Debug)]
pub(super) struct ClientRequest {
    /// Where it is at the server, if it was sent.
    pub(super) downstream: Option<u64>,
    /// The batch it belongs to.
    pub(super) batch: Option<u64>,
    /// The `tools/call` it started or joined.
    pub(super) call: Option<u64>,
    /// Its place in the queue while the server restarts.
    pub(super) queued: Option<u64>,
    /// Since when, and until when, it waits (or waited) for the server:
    /// kept when it is queued again, so it never waits longer in all.
    pub(super) waited: Option<(Instant, Instant)>,
    /// For its span should it fail (export on, not `tools/call`).
    pub(super) trace: Option<Box<crate::otel::RequestTrace>>,
    /// Its id's slot in `Dispatcher::pending`.
    pub(super) pending: u32,
}

/// A request from the server to the client, waiting for the client's answer.
#[derive(Debug)]
pub(super) struct ServerRequest {
    pub(super) generation: u64,
    /// The server's own id, raw.
    pub(super) server_id: String,
    /// It waits for a person (sampling, elicitation): attempt clocks pause.
    pub(super) pauses: bool,
}

/// Collects the answers to a batch (2025-03-26) into one array.
#[derive(Debug, Default)]
pub(super) struct Batch {
    pub(super) outstanding: usize,
    pub(super) answers: Vec<Vec<u8>>,
    /// The `pending` slots of the requests whose answers wait in
    /// `answers`: pending until the array is sent.
    pub(super) answered: Vec<u32>,
}
