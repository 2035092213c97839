//! The request queue (as lsp-server's `ReqQueue`): every request crossing
//! the proxy that is not answered yet, and the ids the proxy gives them.
//! The client's requests by their id, from `register` to `complete` (an
//! answer) or `cancel` (the client's cancel): every path that forgets one
//! goes through those two; what each downstream id stands for, recorded as
//! the id is issued (`issue`) and looked up once (`resolve`: a relayed
//! request, a replay, the proxy's own lists; an attempt of a call is the
//! calls', which keep their own); lines still unwritten; the server's
//! requests waiting for the client, issued an id the client sees as they
//! are recorded; and batches being collected. Private tables, changed only
//! through these methods. Knows nothing of transports or policies; the
//! dispatcher routes events to it.

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Instant;

use crate::downstream::Withdraw;
use crate::fasthash::FastMap;
use crate::guard::Pending;
use crate::jsonrpc::Message;
use crate::mcp::Modern;

use super::link::ReplayStep;

/// A client request's id as written (raw), made once from its message and
/// shared by the request table, its `Call` and the answer: never copied.
pub(super) type ClientId = Arc<str>;

/// Every request in flight across the proxy.
#[derive(Default)]
pub(super) struct Requests {
    next_downstream_id: u64,
    inflight: FastMap<u64, Inflight>,
    /// Requests whose lines still wait to be written to the server, by
    /// downstream id: withdrawn when their call is over.
    unwritten: FastMap<u64, Withdraw>,
    /// The client's requests not yet answered, by their id (raw).
    client: FastMap<ClientId, ClientRequest>,
    /// The server's requests waiting for the client, by the id the client
    /// was given.
    server: FastMap<u64, ServerRequest>,
    /// Open server requests that pause attempt clocks, and since when.
    pausing: usize,
    paused_since: Option<Instant>,
    next_server_id: u64,
    batches: FastMap<u64, Batch>,
    next_batch: u64,
    /// The ids of `client` not yet answered, kept where a panic of the
    /// dispatcher cannot lose them (see `proxy.rs`).
    pending: Pending,
}

/// Whose a downstream id is, as [`Requests::resolve`] finds it.
#[derive(Debug)]
pub(super) enum Resolved {
    /// A request of the client's relayed, or one of the proxy's own: no
    /// longer in flight.
    Ours(Inflight),
    /// Issued, and not ours: a call's attempt (or forgotten), for the
    /// calls to say.
    Calls,
    /// Never issued by this proxy.
    Never,
}

impl Requests {
    // ----- downstream ids --------------------------------------------

    /// A new downstream id for a request the dispatcher owns, recorded
    /// with what it stands for.
    pub(super) fn issue(&mut self, owner: Inflight) -> u64 {
        let down = self.issue_attempt();
        self.inflight.insert(down, owner);
        down
    }

    /// A new downstream id for a call's attempt (whose owner the calls
    /// record: [`Resolved::Calls`]).
    pub(super) fn issue_attempt(&mut self) -> u64 {
        self.next_downstream_id += 1;
        self.next_downstream_id
    }

    /// The id [`Requests::issue_attempt`] will give next (for the calls to
    /// record an attempt under, in the run that decides it goes).
    pub(super) fn next_attempt_id(&self) -> u64 {
        self.next_downstream_id + 1
    }

    /// Whose downstream id `id` (raw, as the server sent it) is: the
    /// dispatcher's own entry leaves the table.
    pub(super) fn resolve(&mut self, id: &str) -> (u64, Resolved) {
        let Some(down) = id
            .parse::<u64>()
            .ok()
            .filter(|d| *d <= self.next_downstream_id)
        else {
            return (0, Resolved::Never);
        };
        (down, self.resolve_issued(down))
    }

    /// Whose issued downstream id `down` is: the dispatcher's own entry
    /// leaves the table.
    pub(super) fn resolve_issued(&mut self, down: u64) -> Resolved {
        match self.inflight.remove(&down) {
            Some(f) => Resolved::Ours(f),
            None => Resolved::Calls,
        }
    }

    /// The dispatcher's entry for `down`, if `wanted` says it is the one
    /// expected (a timer's): it leaves the table.
    pub(super) fn take_if(
        &mut self,
        down: u64,
        wanted: impl Fn(&Inflight) -> bool,
    ) -> Option<Inflight> {
        if !self.inflight.get(&down).is_some_and(wanted) {
            return None;
        }
        self.inflight.remove(&down)
    }

    /// Puts back the entry [`Requests::resolve_issued`] took for `down`:
    /// it is still in flight after all.
    pub(super) fn restore(&mut self, down: u64, owner: Inflight) {
        self.inflight.insert(down, owner);
    }

    /// Forgets downstream request `down`, never sent or cancelled.
    pub(super) fn forget(&mut self, down: u64) {
        self.inflight.remove(&down);
    }

    /// Every entry of the dispatcher's, oldest first, as the link they
    /// were sent on is lost.
    pub(super) fn drain_lost(&mut self) -> Vec<(u64, Inflight)> {
        let mut lost: Vec<(u64, Inflight)> = self.inflight.drain().collect();
        lost.sort_by_key(|(down, _)| *down);
        lost
    }

    /// Whether a `tools/list` of the client's is at the server.
    pub(super) fn client_listing_tools(&self) -> bool {
        self.inflight.values().any(|f| {
            matches!(
                f,
                Inflight::Client {
                    method: Method::ToolsList { .. },
                    ..
                }
            )
        })
    }

    // ----- lines not written yet ---------------------------------------

    /// Request `down`'s line waits to be written: `w` withdraws it.
    pub(super) fn unwritten(&mut self, down: u64, w: Withdraw) {
        self.unwritten.insert(down, w);
    }

    /// Request `down` needs its line no more (answered, or it failed).
    pub(super) fn written(&mut self, down: u64) {
        if !self.unwritten.is_empty() {
            self.unwritten.remove(&down);
        }
    }

    /// Withdraws request `down` if its line still waits to be written:
    /// true if it never will be.
    pub(super) fn withdraw(&mut self, down: u64) -> bool {
        self.unwritten.remove(&down).is_some_and(|w| w.withdraw())
    }

    /// The link is gone, and the lines waiting for it with it.
    pub(super) fn link_lost(&mut self) {
        self.unwritten.clear();
    }

    // ----- the client's requests ---------------------------------------

    /// Records client request `client_id` (part of `batch`, if any) until
    /// it is completed or cancelled.
    pub(super) fn register(
        &mut self,
        client_id: ClientId,
        batch: Option<u64>,
        trace: Option<Box<crate::otel::RequestTrace>>,
        modern: Option<Arc<Modern>>,
    ) {
        let pending = self.pending.add(&client_id);
        self.client.insert(
            client_id,
            ClientRequest {
                downstream: None,
                batch,
                call: None,
                queued: None,
                waited: None,
                trace,
                pending,
                modern,
            },
        );
    }

    /// What client request `client_id`'s 2026-07-28 headers say, read by
    /// its reader thread: for every line it is sent as.
    pub(super) fn modern(&self, client_id: &str) -> Option<Arc<Modern>> {
        self.client.get(client_id)?.modern.clone()
    }

    /// Client request `client_id` is answered: it is forgotten (its id
    /// stays pending until its batch's array is sent).
    pub(super) fn complete(&mut self, client_id: &str) -> Option<ClientRequest> {
        let r = self.client.remove(client_id)?;
        match r.batch.and_then(|b| self.batches.get_mut(&b)) {
            Some(batch) => batch.answered.push(r.pending),
            None => self.pending.remove(r.pending),
        }
        Some(r)
    }

    /// The client cancelled request `client_id`: it is forgotten and gets
    /// no answer.
    pub(super) fn cancel(&mut self, client_id: &str) -> Option<ClientRequest> {
        let r = self.client.remove(client_id)?;
        self.pending.remove(r.pending);
        Some(r)
    }

    /// The id client request `client_id` is kept under (for tests to see
    /// it was not copied).
    #[cfg(test)]
    pub(super) fn kept_id(&self, client_id: &str) -> Option<&str> {
        self.client.get_key_value(client_id).map(|(k, _)| &**k)
    }

    pub(super) fn is_open(&self, client_id: &str) -> bool {
        self.client.contains_key(client_id)
    }

    /// How many of the client's requests are open.
    pub(super) fn open_count(&self) -> usize {
        self.client.len()
    }

    /// The open client requests' ids, in order.
    pub(super) fn open_ids(&self) -> Vec<ClientId> {
        let mut ids: Vec<ClientId> = self.client.keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Client request `client_id` started or joined call `call`.
    pub(super) fn set_call(&mut self, client_id: &str, call: Option<u64>) {
        if let Some(r) = self.client.get_mut(client_id) {
            r.call = call;
        }
    }

    /// Client request `client_id` went to the server as `down`: since
    /// when and until when it waited for the server, if it did.
    pub(super) fn sent(&mut self, client_id: &str, down: u64) -> Option<(Instant, Instant)> {
        let r = self.client.get_mut(client_id)?;
        r.downstream = Some(down);
        r.waited
    }

    /// Since when and until when client request `client_id` waits (or
    /// waited) for the server.
    pub(super) fn waited(&self, client_id: &str) -> Option<(Instant, Instant)> {
        self.client.get(client_id).and_then(|r| r.waited)
    }

    /// Client request `client_id` waits in the link's queue as item `seq`,
    /// from `since` until `expires`.
    pub(super) fn queued(&mut self, client_id: &str, seq: u64, since: Instant, expires: Instant) {
        if let Some(r) = self.client.get_mut(client_id) {
            r.queued = Some(seq);
            r.downstream = None;
            r.waited = Some((since, expires));
        }
    }

    /// Queue item `seq` is released: true if it is still client request
    /// `client_id`'s (not cancelled nor answered meanwhile).
    pub(super) fn unqueued(&mut self, client_id: &str, seq: u64) -> bool {
        match self.client.get_mut(client_id) {
            Some(r) if r.queued == Some(seq) => {
                r.queued = None;
                true
            }
            _ => false,
        }
    }

    /// The ids of the client's requests not yet answered (for the guard
    /// around the dispatcher).
    pub(super) fn pending(&self) -> Pending {
        self.pending.clone()
    }

    // ----- the server's requests ---------------------------------------

    /// Records a request of incarnation `generation`'s (its own id
    /// `server_id`, raw), which waits for a person if `pauses`; returns
    /// the id the client is given.
    pub(super) fn open_server_request(
        &mut self,
        generation: u64,
        server_id: &str,
        pauses: bool,
        now: Instant,
    ) -> u64 {
        self.next_server_id += 1;
        let ours = self.next_server_id;
        if pauses {
            if self.pausing == 0 {
                self.paused_since = Some(now);
            }
            self.pausing += 1;
        }
        self.server.insert(
            ours,
            ServerRequest {
                generation,
                server_id: server_id.to_owned(),
                pauses,
            },
        );
        ours
    }

    /// Forgets the server's request `ours`; with the last one that paused
    /// attempt clocks, also since when they were paused.
    pub(super) fn close_server_request(
        &mut self,
        ours: u64,
    ) -> Option<(ServerRequest, Option<Instant>)> {
        let req = self.server.remove(&ours)?;
        let mut resumed = None;
        if req.pauses {
            self.pausing -= 1;
            if self.pausing == 0 {
                resumed = self.paused_since.take();
            }
        }
        Some((req, resumed))
    }

    /// The id the client was given for incarnation `generation`'s request
    /// `server_id` (raw).
    pub(super) fn find_server_request(&self, generation: u64, server_id: &str) -> Option<u64> {
        self.server
            .iter()
            .find(|(_, r)| r.generation == generation && r.server_id == server_id)
            .map(|(k, _)| *k)
    }

    /// The ids the client was given for the server's open requests, in
    /// order.
    pub(super) fn open_server_requests(&self) -> Vec<u64> {
        let mut open: Vec<u64> = self.server.keys().copied().collect();
        open.sort();
        open
    }

    /// A server request waits for a person: attempt clocks are paused.
    pub(super) fn paused(&self) -> bool {
        self.paused_since.is_some()
    }

    // ----- batches ---------------------------------------------------------

    /// Starts collecting the answers to a batch of `expected` requests.
    pub(super) fn open_batch(&mut self, expected: usize) -> u64 {
        self.next_batch += 1;
        let id = self.next_batch;
        self.batches.insert(
            id,
            Batch {
                outstanding: expected,
                ..Batch::default()
            },
        );
        id
    }

    /// Whether batch `batch` still collects answers.
    pub(super) fn collecting(&self, batch: u64) -> bool {
        self.batches.contains_key(&batch)
    }

    /// Counts one request of `batch` as done (with its answer, if any);
    /// once all are, the batch is over: its array, if any answer is in it,
    /// is returned, and its ids are pending no more.
    pub(super) fn batch_entry(&mut self, batch: u64, line: Option<Vec<u8>>) -> Option<Vec<u8>> {
        let b = self.batches.get_mut(&batch)?;
        if let Some(mut line) = line {
            if line.last() == Some(&b'\n') {
                line.pop();
            }
            b.answers.push(line);
        }
        b.outstanding -= 1;
        if b.outstanding > 0 {
            return None;
        }
        let b = self.batches.remove(&batch).expect("present");
        for slot in b.answered {
            self.pending.remove(slot);
        }
        (!b.answers.is_empty()).then(|| {
            let mut out = b"[".to_vec();
            out.extend_from_slice(&b.answers.join(&b","[..]));
            out.extend_from_slice(b"]\n");
            out
        })
    }
}

/// What a downstream id stands for, unless it is a call's (those are
/// [`Calls`]'s).
#[derive(Debug)]
pub(super) enum Inflight {
    /// A client request relayed as is, `kept` as the client sent it (for a
    /// request never sent, or a read sent again after a restart), and the
    /// bytes of the line it went as (a line partly written comes back
    /// shorter).
    Client {
        client_id: ClientId,
        method: Method,
        kept: Message,
        sent: usize,
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

impl Method {
    /// Safe to send again to a restarted server: reads, and a handshake
    /// the server never answered.
    pub(super) fn resent_after_loss(self) -> bool {
        matches!(
            self,
            Method::ReadOnly | Method::ToolsList { .. } | Method::Initialize
        )
    }
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
    waited: Option<(Instant, Instant)>,
    /// For its span should it fail (export on, not `tools/call`).
    pub(super) trace: Option<Box<crate::otel::RequestTrace>>,
    /// Its id's slot in `Requests::pending`.
    pending: u32,
    /// What its 2026-07-28 headers say.
    modern: Option<Arc<Modern>>,
}

/// A request from the server to the client, waiting for the client's answer.
#[derive(Debug)]
pub(super) struct ServerRequest {
    pub(super) generation: u64,
    /// The server's own id, raw.
    pub(super) server_id: String,
    /// It waits for a person (sampling, elicitation): attempt clocks pause.
    pauses: bool,
}

/// Collects the answers to a batch (2025-03-26) into one array.
#[derive(Debug, Default)]
struct Batch {
    outstanding: usize,
    answers: Vec<Vec<u8>>,
    /// The `pending` slots of the requests whose answers wait in
    /// `answers`: pending until the array is sent.
    answered: Vec<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing() -> Inflight {
        Inflight::ToolsList { first: true }
    }

    #[test]
    fn an_id_is_issued_with_its_owner_and_resolved_once() {
        let mut r = Requests::default();
        let ours = r.issue(listing());
        let attempt = r.issue_attempt();
        assert_eq!((ours, attempt), (1, 2), "one counter, never reused");
        assert!(matches!(
            r.resolve("1"),
            (1, Resolved::Ours(Inflight::ToolsList { first: true }))
        ));
        // Resolved once: then it is no longer the dispatcher's.
        assert!(matches!(r.resolve("1"), (1, Resolved::Calls)));
        assert!(matches!(r.resolve("2"), (2, Resolved::Calls)));
        for never in ["3", "\"1\"", "-1", "null"] {
            assert!(matches!(r.resolve(never), (_, Resolved::Never)), "{never}");
        }
    }

    #[test]
    fn a_timer_takes_only_the_entry_it_expects() {
        let mut r = Requests::default();
        let down = r.issue(listing());
        let replay = |f: &Inflight| matches!(f, Inflight::Replay(_));
        assert!(r.take_if(down, replay).is_none());
        let tools = |f: &Inflight| matches!(f, Inflight::ToolsList { .. });
        assert!(r.take_if(down, tools).is_some());
        assert!(r.take_if(down, tools).is_none());
    }

    #[test]
    fn a_client_request_is_pending_until_completed_or_cancelled() {
        let mut r = Requests::default();
        r.register("1".into(), None, None, None);
        r.register("2".into(), None, None, None);
        assert_eq!(r.open_count(), 2);
        assert!(r.complete("1").is_some());
        assert!(r.complete("1").is_none(), "answered once");
        assert!(r.cancel("2").is_some());
        assert!(!r.is_open("2"));
        assert!(r.pending().take().is_empty());
    }

    #[test]
    fn a_batch_answer_is_pending_until_the_array_goes() {
        let mut r = Requests::default();
        let b = r.open_batch(2);
        r.register("a".into(), Some(b), None, None);
        r.register("b".into(), Some(b), None, None);
        r.complete("a");
        assert_eq!(r.batch_entry(b, Some(b"{\"id\":\"a\"}\n".to_vec())), None);
        r.cancel("b");
        assert_eq!(
            r.batch_entry(b, None).as_deref(),
            Some(&b"[{\"id\":\"a\"}]\n"[..])
        );
        assert!(!r.collecting(b));
        assert!(r.pending().take().is_empty());
        // Answered, but in a batch whose array has not gone: pending.
        let b = r.open_batch(2);
        r.register("c".into(), Some(b), None, None);
        r.complete("c");
        assert_eq!(r.pending().take(), ["c"]);
    }

    #[test]
    fn the_last_pausing_server_request_resumes_the_clocks() {
        let mut r = Requests::default();
        let t0 = Instant::now();
        let a = r.open_server_request(1, "\"x\"", true, t0);
        let b = r.open_server_request(1, "7", true, t0);
        let c = r.open_server_request(1, "8", false, t0);
        assert!(r.paused());
        assert_eq!(r.find_server_request(1, "7"), Some(b));
        assert_eq!(r.find_server_request(2, "7"), None);
        assert!(matches!(r.close_server_request(c), Some((_, None))));
        assert!(matches!(r.close_server_request(a), Some((_, None))));
        assert!(r.paused());
        assert!(matches!(r.close_server_request(b), Some((_, Some(t))) if t == t0));
        assert!(!r.paused());
        assert!(r.close_server_request(b).is_none());
    }
}
