//! Instant start (`instant_start`): the client's `initialize` answered at
//! once from the handshake cache, its list requests too until the real
//! server is ready; the real server's handshake checked against what the
//! client was told (lost lists answered empty, gained capabilities warned
//! of, another protocol version the session's end); and, once a session, the server's complete lists read
//! to keep the cache up to date and to tell the client of a list that
//! differs from the one it was given.
//!
//! Owns [`InstantStart`]: the entry loaded when the proxy started, what the
//! client was told, and the reading of the lists ([`Reading`], which does
//! no I/O and is unit-tested alone). The dispatcher's side (answering,
//! sending the proxy's own list requests, bridging a changed server or
//! closing a session whose server contradicts the cache) is the
//! `impl Dispatcher` below.
//!
//! Knows nothing of files: entries go to and from the `cache-writer`
//! thread as [`CacheJob`]s (`handshake_cache` does the I/O). Never answers
//! a call: calls and every other request wait for the real server.

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::downstream::Outgoing;
use crate::handshake_cache::{CacheJob, Entry, MAX_ENTRY_BYTES};
use crate::jsonrpc::{self, Message, RawObject};
use crate::mcp::{List, Next, ToolsPager};
use crate::{debug, info, warn};

use super::{Dispatcher, Inflight, Phase, Reason, Timer};

/// How long a server started behind a cached handshake may take to answer
/// its `initialize` (or `call_timeout`, if longer) before it is stopped
/// and started again: a cold `npx -y` or `uvx` may need minutes, and
/// nobody waits on it (requests wait `wait_for_server` at most).
pub(super) const STARTUP_ALLOWANCE: Duration = Duration::from_secs(300);

/// `instant_start_grace`'s default, for the tests: how long the server has
/// to answer the client's `initialize` itself before the cached answer is
/// given, so that a fast server's session gets its own handshake and lists.
#[cfg(test)]
pub(super) const GRACE: Duration = Duration::from_secs(1);

/// `list`'s place in arrays by list.
fn index(list: List) -> usize {
    list as usize
}

/// Whose listing a page answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// The client's own list request.
    Client,
    /// The proxy's: its request for a list the cache keeps, or the calls'
    /// `tools/list` (to learn annotations).
    Proxy,
}

/// Where the reading of one list is.
#[derive(Debug, Default)]
enum ListRead {
    /// Not declared by the server, or refused by it (an error answer to
    /// the first page): nothing to keep.
    #[default]
    Absent,
    /// Declared; not asked for yet (tools: no page seen yet).
    Wanted,
    /// Pages of `source`'s listing are arriving: the items so far, raw.
    Paging {
        pager: ToolsPager,
        items: Vec<String>,
        source: Source,
    },
    /// Complete: `{"<member>":[...]}`.
    Done(String),
    /// It could not be read whole this session.
    Failed,
}

/// Reading the server's complete lists, once a session, to store them
/// with its `initialize` result. Pure: pages in, verdicts out.
#[derive(Debug, Default)]
pub(super) struct Reading {
    /// The protocol version the client asked for, and the server's
    /// `initialize` result (raw): set when the server accepted the
    /// handshake; the reading starts then.
    init: Option<(String, String)>,
    lists: [ListRead; 4],
    /// Bytes of items held, bounded by the entry's own limit.
    bytes: usize,
    /// Stored (or given up on): nothing more to read this session.
    finished: bool,
}

/// What became of a page.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Paged {
    /// Ask for the next page with this cursor (raw JSON).
    Next(String),
    /// The list is complete.
    Complete,
    /// Nothing to do (not being read, or it failed).
    Nothing,
}

impl Reading {
    /// The server accepted the handshake the client asked for with
    /// `protocol_version`: read what its `result` declares.
    pub(super) fn begin(&mut self, protocol_version: &str, result: &str) {
        if self.finished || self.init.is_some() {
            return;
        }
        let caps = RawObject::parse(result).and_then(|r| {
            r.get("capabilities")
                .and_then(|c| RawObject::parse(c.get()))
        });
        for list in List::ALL {
            let declared = caps
                .as_ref()
                .is_some_and(|c| c.get(list.capability()).is_some());
            self.lists[index(list)] = match declared {
                true => ListRead::Wanted,
                false => ListRead::Absent,
            };
        }
        self.init = Some((protocol_version.to_owned(), result.to_owned()));
    }

    /// Whether the lists are being read.
    pub(super) fn active(&self) -> bool {
        self.init.is_some() && !self.finished
    }

    /// The lists the proxy must ask for itself now (not tools: every
    /// `tools/list` page that passes by is read, the client's or the one
    /// the calls ask for to learn annotations). They are marked asked.
    pub(super) fn take_unasked(&mut self) -> Vec<List> {
        if !self.active() {
            return Vec::new();
        }
        let mut asked = Vec::new();
        for list in [List::Prompts, List::Resources, List::Templates] {
            let slot = &mut self.lists[index(list)];
            if matches!(slot, ListRead::Wanted) {
                *slot = ListRead::Paging {
                    pager: ToolsPager::default(),
                    items: Vec::new(),
                    source: Source::Proxy,
                };
                asked.push(list);
            }
        }
        asked
    }

    /// Whether `list` is declared and no listing of it has begun.
    pub(super) fn wants(&self, list: List) -> bool {
        self.active() && matches!(self.lists[index(list)], ListRead::Wanted)
    }

    /// The server's link was lost: lists not complete are asked of the
    /// next incarnation.
    pub(super) fn link_lost(&mut self) {
        for list in List::ALL {
            if matches!(self.lists[index(list)], ListRead::Paging { .. }) {
                self.set(list, ListRead::Wanted);
            }
        }
    }

    /// Puts `list`'s reading in `state`, giving back the bytes of the
    /// pages it held.
    fn set(&mut self, list: List, state: ListRead) {
        let slot = &mut self.lists[index(list)];
        if let ListRead::Paging { items, .. } = slot {
            self.bytes = self
                .bytes
                .saturating_sub(items.iter().map(String::len).sum());
        }
        *slot = state;
    }

    /// Whether a page of `source`'s listing of `list` (`first`: it
    /// answers a request without a cursor) is read, and whether it starts
    /// the reading over. One listing is read at a time, so that pages of
    /// two listings running alongside are never mixed: tools from
    /// whichever listing passes by first, a client's giving way to the
    /// proxy's (which pages to its end), other lists only from the
    /// proxy's own requests.
    fn takes(&self, list: List, first: bool, source: Source) -> Option<bool> {
        match &self.lists[index(list)] {
            // Not read, or read already (the first complete listing counts).
            ListRead::Absent | ListRead::Failed | ListRead::Done(_) => None,
            ListRead::Wanted => (list == List::Tools && first).then_some(true),
            ListRead::Paging { source: s, .. } if *s == source => Some(first),
            ListRead::Paging { .. } => (first && source == Source::Proxy).then_some(true),
        }
    }

    /// Starts the reading of `list` over, for `source`'s listing.
    fn start(&mut self, list: List, source: Source) {
        self.set(
            list,
            ListRead::Paging {
                pager: ToolsPager::default(),
                items: Vec::new(),
                source,
            },
        );
    }

    /// The server answered a request of `source`'s listing of `list` with
    /// an error: refused at its first page, the list is not kept (the
    /// server does not serve it); later, the reading failed.
    pub(super) fn refused(&mut self, list: List, first: bool, source: Source) -> Paged {
        if !self.active() || self.takes(list, first, source).is_none() {
            return Paged::Nothing;
        }
        if !first {
            return self.fail(list);
        }
        debug!(
            "handshake cache: the server refused {}; it is not kept",
            list.method()
        );
        self.set(list, ListRead::Absent);
        Paged::Nothing
    }

    /// A page of `source`'s listing of `list` (its `result`, raw);
    /// `first` when it answers a request without a cursor (a listing
    /// starts over).
    pub(super) fn page(&mut self, list: List, result: &str, first: bool, source: Source) -> Paged {
        if !self.active() {
            return Paged::Nothing;
        }
        match self.takes(list, first, source) {
            None => return Paged::Nothing,
            Some(true) => self.start(list, source),
            Some(false) => {}
        }
        let slot = &mut self.lists[index(list)];
        let ListRead::Paging { pager, items, .. } = slot else {
            return Paged::Nothing;
        };
        let Some((page, next_cursor)) = list.page(result) else {
            debug!(
                "handshake cache: the server's {} page has no items",
                list.method()
            );
            return self.fail(list);
        };
        for item in page {
            self.bytes = self.bytes.saturating_add(item.get().len() + 1);
            items.push(item.get().to_owned());
        }
        if self.bytes as u64 > MAX_ENTRY_BYTES {
            debug!(
                "handshake cache: the server's lists are over {MAX_ENTRY_BYTES} bytes; not kept"
            );
            return self.fail(list);
        }
        match pager.next(next_cursor.as_deref()) {
            Next::Page => Paged::Next(pager.cursor().unwrap_or_default().to_owned()),
            Next::Endless => self.fail(list),
            Next::Last => {
                *slot = ListRead::Done(list.merged(items));
                Paged::Complete
            }
        }
    }

    /// `list` cannot be read whole this session (an error, no answer):
    /// the entry is not stored (the one there stays).
    pub(super) fn fail(&mut self, list: List) -> Paged {
        if self.active() && !matches!(self.lists[index(list)], ListRead::Absent) {
            debug!(
                "handshake cache: could not read the server's {}; the entry is not updated",
                list.method()
            );
            self.lists[index(list)] = ListRead::Failed;
        }
        Paged::Nothing
    }

    /// `list` as read, when complete.
    pub(super) fn done(&self, list: List) -> Option<&str> {
        match &self.lists[index(list)] {
            ListRead::Done(t) => Some(t),
            _ => None,
        }
    }

    /// The entry to store, once every declared list is complete; `None`
    /// while one is still read. The reading is over once it returns an
    /// entry or a list failed.
    pub(super) fn take_entry(&mut self) -> Option<Entry> {
        if !self.active() {
            return None;
        }
        if self.lists.iter().any(|l| matches!(l, ListRead::Failed)) {
            self.finished = true;
            return None;
        }
        if self
            .lists
            .iter()
            .any(|l| !matches!(l, ListRead::Absent | ListRead::Done(_)))
        {
            return None;
        }
        self.finished = true;
        let (version, result) = self.init.take()?;
        let raw = |t: String| RawValue::from_string(t).ok();
        let mut entry = Entry::new(&version, raw(result)?);
        let lists = std::mem::take(&mut self.lists);
        for (list, read) in List::ALL.into_iter().zip(lists) {
            if let ListRead::Done(t) = read {
                entry.set_list(list, raw(t));
            }
        }
        self.bytes = 0;
        Some(entry)
    }
}

/// Instant start for this session.
#[derive(Debug)]
pub(super) struct InstantStart {
    jobs: Sender<CacheJob>,
    /// The entry found when the proxy started, until the client's
    /// `initialize` uses it (or not).
    entry: Option<Entry>,
    /// The entry the client's handshake was answered from, until the real
    /// server's handshake is checked against it.
    pub(super) told: Option<Entry>,
    /// The lists the client was given from the cache (raw, by
    /// [`List`]), once the real server's handshake was checked: a list
    /// read that differs is announced.
    told_lists: Option<[Option<String>; 4]>,
    /// The session began from the cache.
    pub(super) from_cache: bool,
    /// The client's `initialize` (its id) and the cached answer, held for
    /// `instant_start_grace` while the server may answer it itself.
    held: Option<(String, String)>,
    /// Lists the client was told of that the server no longer has:
    /// answered empty.
    lost: Vec<List>,
    /// What the server gained that this session cannot show (for
    /// `status`).
    pub(super) note: Option<String>,
    pub(super) reading: Reading,
}

impl InstantStart {
    pub(super) fn new(entry: Option<Entry>, jobs: Sender<CacheJob>) -> InstantStart {
        InstantStart {
            jobs,
            entry,
            told: None,
            told_lists: None,
            from_cache: false,
            held: None,
            lost: Vec::new(),
            note: None,
            reading: Reading::default(),
        }
    }

    fn send(&self, job: CacheJob) {
        if self.jobs.send(job).is_err() {
            debug!("handshake cache: the writer is gone");
        }
    }
}

/// The cached `initialize` result as the client is given it: every list
/// capability the server declared says `listChanged`, so that the client
/// listens for the changes reconciling may announce.
pub(super) fn told_result(cached: &str) -> Option<String> {
    let mut result: Value = serde_json::from_str(cached).ok()?;
    let caps = result.get_mut("capabilities")?.as_object_mut()?;
    for name in ["tools", "prompts", "resources"] {
        if let Some(Value::Object(c)) = caps.get_mut(name) {
            c.insert("listChanged".into(), Value::Bool(true));
        }
    }
    Some(result.to_string())
}

/// How the real server's handshake differs from the cached one the client
/// was told, where the session can go on.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Bridge {
    /// The lists whose capability the client was told of and the server
    /// no longer declares: answered empty from now on.
    pub(super) lost: Vec<List>,
    /// The capabilities the server declares now that the client was not
    /// told of: they cannot be announced in this session.
    pub(super) gained: Vec<String>,
}

/// The real server's `initialize` result against the cached one the
/// client was told: `Err` with why when the session cannot go on (another
/// protocol version: every message would be read by other rules), else
/// what changed ([`Bridge`]). A capability lost that is not a list's
/// (`logging`, `completions`) needs nothing: its requests get the
/// server's own error.
pub(super) fn compare(told: &str, real: &str) -> Result<Bridge, String> {
    let parse = |s: &str| serde_json::from_str::<Value>(s).unwrap_or(Value::Null);
    let (told, real) = (parse(told), parse(real));
    let version = |v: &Value| v["protocolVersion"].as_str().map(str::to_owned);
    if version(&told) != version(&real) {
        return Err(format!(
            "it chose protocol version {}, the cache said {}",
            version(&real).unwrap_or_else(|| "none".into()),
            version(&told).unwrap_or_else(|| "none".into()),
        ));
    }
    let names = |v: &Value| -> Vec<String> {
        v["capabilities"]
            .as_object()
            .map(|caps| caps.keys().cloned().collect())
            .unwrap_or_default()
    };
    let (told, real) = (names(&told), names(&real));
    let lost = List::ALL
        .into_iter()
        .filter(|l| {
            let cap = l.capability().to_owned();
            told.contains(&cap) && !real.contains(&cap)
        })
        .collect();
    let gained = real.into_iter().filter(|c| !told.contains(c)).collect();
    Ok(Bridge { lost, gained })
}

/// The client's `initialize` params asking for `version` (the one the
/// client was told), for the server of a session that began from the
/// cache; `None` when they ask for it already or are not an object.
pub(super) fn asking_for(params: &str, version: &str) -> Option<String> {
    let mut p: Value = serde_json::from_str(params).ok()?;
    let obj = p.as_object_mut()?;
    if obj.get("protocolVersion").and_then(Value::as_str) == Some(version) {
        return None;
    }
    obj.insert("protocolVersion".into(), Value::String(version.to_owned()));
    Some(p.to_string())
}

/// `a, b` of capability names, each once.
fn caps_named<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for n in names {
        if !seen.contains(&n) {
            seen.push(n);
        }
    }
    seen.join(", ")
}

/// Whether two results of `list` differ in their items, as JSON (member
/// order and spacing aside) and in any order: a server listing the same
/// tools in another order has not changed them.
fn lists_differ(list: List, a: &str, b: &str) -> bool {
    let items = |result: &str| -> Option<Vec<String>> {
        let (page, _) = list.page(result)?;
        let mut items = page
            .iter()
            .map(|item| crate::policy::canonical_json(item.get()).ok())
            .collect::<Option<Vec<_>>>()?;
        items.sort_unstable();
        Some(items)
    };
    match (items(a), items(b)) {
        (Some(a), Some(b)) => a != b,
        _ => true,
    }
}

impl Dispatcher {
    /// Instant start for this session, with the entry found at start.
    pub fn with_instant_start(
        mut self,
        entry: Option<Entry>,
        jobs: Sender<CacheJob>,
    ) -> Dispatcher {
        self.instant = Some(Box::new(InstantStart::new(entry, jobs)));
        self
    }

    /// A client request instant start may take: an `initialize` (not in a
    /// batch) or a first page of a list, while the real server is not
    /// ready. Whether it was taken (it is answered either way).
    pub(super) fn instant_request(
        &mut self,
        client_id: &str,
        method: &str,
        m: &Message,
        batch: Option<u64>,
    ) -> bool {
        match method {
            "initialize" => batch.is_none() && self.instant_initialize(client_id, m),
            _ => self.instant_list(client_id, method, m.params()),
        }
    }

    /// The client's `initialize`, when an entry matches its protocol
    /// version: the real server gets it (asking for the version the entry
    /// says), and the cached answer is given if the server has not
    /// answered within `instant_start_grace` (`Timer::InstantGrace`). Whether it was
    /// taken (it is answered either way).
    fn instant_initialize(&mut self, client_id: &str, m: &Message) -> bool {
        let Some(instant) = self.instant.as_mut() else {
            return false;
        };
        let asked = m
            .params()
            .and_then(RawObject::parse)
            .and_then(|p| p.string("protocolVersion"));
        let first =
            self.link.session.init_params.is_none() && self.link.session.pending_init.is_none();
        let Some(entry) = instant.entry.take() else {
            return false;
        };
        if !first || asked.as_deref() != Some(entry.protocol_version.as_str()) {
            debug!(
                "handshake cache: the entry is for protocol version {}, the client asked for {}",
                entry.protocol_version,
                asked.as_deref().unwrap_or("none")
            );
            return false;
        }
        let Some(result) = told_result(entry.initialize.get()) else {
            warn!("handshake cache: the cached initialize result is not an object; not used");
            return false;
        };
        instant.from_cache = true;
        let cached_version =
            RawObject::parse(entry.initialize.get()).and_then(|r| r.string("protocolVersion"));
        instant.told = Some(entry);
        // The session is the client's from now on, as if the server had
        // accepted it: a start replays it.
        self.link.session.init_params = m.params().map(str::to_owned);
        self.link.session.protocol_version = cached_version;
        self.observe_capabilities(&result);
        // It told the client `listChanged`: a restarted server's tools are
        // compared too.
        self.link.session.tools_list_changed = self.link.session.has_tools;
        if let Some(instant) = self.instant.as_mut() {
            instant.held = Some((client_id.to_owned(), result));
        }
        self.set_timer(self.now + self.cfg.instant_start_grace, Timer::InstantGrace);
        // Down or between starts: the next start replays it.
        if self.link.unready() {
            self.replay_initialize(self.now);
        }
        self.status_dirty();
        true
    }

    /// `Timer::InstantGrace`: the server did not answer `initialize` in
    /// time; the client gets the cached answer.
    pub(super) fn instant_grace_over(&mut self) {
        let Some((client_id, result)) = self.instant.as_mut().and_then(|i| i.held.take()) else {
            return;
        };
        info!(
            "answered initialize from the handshake cache; the MCP server starts in the background"
        );
        self.answer(&client_id, jsonrpc::response_line(&client_id, &result));
    }

    /// The server answered the `initialize` replayed for a held cached
    /// answer within `instant_start_grace`, with `real`: the client gets the server's
    /// own answer and the session is the server's, as without the cache.
    /// Whether an answer was held.
    pub(super) fn instant_answered_in_grace(&mut self, real: Option<&str>, now: Instant) -> bool {
        let Some(instant) = self.instant.as_mut() else {
            return false;
        };
        let (Some((client_id, _)), Some(real)) = (instant.held.as_ref(), real) else {
            // A refusal is a contradiction, which answers what is held.
            return false;
        };
        let client_id = client_id.clone();
        instant.held = None;
        instant.told = None;
        instant.from_cache = false;
        debug!(
            "the MCP server answered initialize within {:?}; the cached answer is not used",
            self.cfg.instant_start_grace
        );
        self.link.session.protocol_version =
            RawObject::parse(real).and_then(|r| r.string("protocolVersion"));
        self.observe_capabilities(real);
        self.reporting.ready(now);
        self.instant_accepted(real);
        self.answer(&client_id, jsonrpc::response_line(&client_id, real));
        self.status_dirty();
        true
    }

    /// The link found `problem` with `m`, the answer to the replayed
    /// `initialize` (or none): a session begun from the cache checks it
    /// against what the client was told. False if the session ends here
    /// (the server contradicted the cache).
    pub(super) fn instant_verdict(
        &mut self,
        m: &Message,
        problem: Option<&str>,
        now: Instant,
    ) -> bool {
        if !self.instant_unchecked() {
            return true;
        }
        let checked = match problem {
            Some(p) => Err(p.to_owned()),
            None => self.instant_check(m, now),
        };
        match checked {
            Ok(()) => true,
            Err(p) => {
                self.instant_contradicted(&p, now);
                false
            }
        }
    }

    /// Whether the real server's handshake is still to be checked against
    /// the cached one the client was told.
    pub(super) fn instant_unchecked(&self) -> bool {
        self.instant.as_ref().is_some_and(|i| i.told.is_some())
    }

    /// How long the handshake replayed to a new incarnation may take.
    pub(super) fn replay_wait(&self) -> Duration {
        match self.instant_unchecked() {
            true => self.cfg.call_timeout.max(STARTUP_ALLOWANCE),
            false => self.cfg.call_timeout,
        }
    }

    /// A list request from the client, answered from the cache while the
    /// server is not ready yet (a first page only: the cache keeps whole
    /// lists). Whether it was answered.
    fn instant_list(&mut self, client_id: &str, method: &str, params: Option<&str>) -> bool {
        let Some(list) = List::of_method(method) else {
            return false;
        };
        if self
            .instant
            .as_ref()
            .is_some_and(|i| i.lost.contains(&list))
        {
            // Its server no longer has it: empty, as told by list_changed.
            let result = format!("{{\"{}\":[]}}", list.member());
            debug!("answered {method} empty: the MCP server no longer lists them");
            self.answer(client_id, jsonrpc::response_line(client_id, &result));
            return true;
        }
        let Some(told) = self.instant.as_ref().and_then(|i| i.told.as_ref()) else {
            return false;
        };
        let paged = params
            .and_then(RawObject::parse)
            .is_some_and(|p| p.get("cursor").is_some());
        let Some(cached) = told.list(list).filter(|_| !paged) else {
            return false;
        };
        let line = jsonrpc::response_line(client_id, cached.get());
        debug!("answered {method} from the handshake cache");
        self.answer(client_id, line);
        true
    }

    /// The answer to the handshake replayed to the first server of a
    /// session that began from the cache: `Err` with why when the session
    /// cannot go on (it then ends). A list the server lost is answered
    /// empty from now on, and its `list_changed` sent; a capability it
    /// gained is warned of (and shown by `status`): the entry stored next
    /// has it, for the next session.
    fn instant_check(&mut self, m: &Message, now: Instant) -> Result<(), String> {
        let Some(told) = self.instant.as_mut().and_then(|i| i.told.as_ref()) else {
            return Ok(());
        };
        let Some(real) = m.result() else {
            return Err(format!(
                "it answered initialize with {}",
                m.error().unwrap_or("no result")
            ));
        };
        let bridge = compare(told.initialize.get(), real)?;
        self.instant_bridge(bridge);
        info!(
            "the MCP server is ready after {}; the session began from the handshake cache",
            super::calls::secs(now.saturating_duration_since(self.reporting.started_at()))
        );
        self.reporting.ready(now);
        let version = self.client_version();
        if let Some(instant) = self.instant.as_mut() {
            let told = instant.told.take().expect("checked above");
            instant.told_lists = Some(List::ALL.map(|l| told.list(l).map(|r| r.get().to_owned())));
            instant.reading.begin(&version, real);
        }
        Ok(())
    }

    /// Goes on past what the server lost or gained since the cached
    /// handshake the client was told.
    fn instant_bridge(&mut self, bridge: Bridge) {
        let Some(instant) = self.instant.as_mut() else {
            return;
        };
        let mut changed: Vec<&str> = Vec::new();
        for list in &bridge.lost {
            if !changed.contains(&list.changed()) {
                changed.push(list.changed());
            }
        }
        if !bridge.lost.is_empty() {
            let methods: Vec<&str> = bridge.lost.iter().map(|l| l.method()).collect();
            warn!(
                "the MCP server no longer declares {}; the session goes on with {} answered empty",
                caps_named(bridge.lost.iter().map(|l| l.capability())),
                methods.join(", ")
            );
        }
        instant.lost = bridge.lost;
        if !bridge.gained.is_empty() {
            let note = format!(
                "the MCP server now declares {} too, which this session cannot show: start a new session to use them",
                caps_named(bridge.gained.iter().map(String::as_str))
            );
            warn!("{note}");
            instant.note = Some(note);
        }
        if instant.lost.contains(&List::Tools) {
            self.link.session.has_tools = false;
        }
        for method in changed {
            self.send_client(jsonrpc::notification_line(method, None));
        }
        self.status_dirty();
    }

    /// What the session cannot show of its server, for `status`.
    pub(super) fn instant_note(&self) -> Option<String> {
        self.instant.as_ref().and_then(|i| i.note.clone())
    }

    /// The real server contradicts the cached handshake the client was
    /// given where no bridge holds: the entry goes, every pending request
    /// gets the proxy's error and the session ends, so that the host
    /// connects again and gets the server's own handshake.
    fn instant_contradicted(&mut self, problem: &str, now: Instant) {
        let message = format!(
            "the MCP server's handshake differs from the cached one the session began with ({problem}); the cache entry was removed and the session ends: reconnect to the server (in Claude Code: /mcp)"
        );
        warn!("{message}");
        if let Some(instant) = self.instant.as_mut() {
            instant.told = None;
            // A held answer is the client's pending `initialize`, answered
            // below with the others.
            instant.held = None;
            instant.send(CacheJob::Invalidate);
        }
        // Exit 75 asks the host to connect again; a session the client
        // ended already just ends.
        if !matches!(self.phase, Phase::Stopping { .. }) {
            self.handshake_changed = true;
        }
        for id in self.requests.open_ids() {
            self.answer_proxy_error(&id, Reason::ServerUnavailable, &message);
        }
        self.begin_shutdown(None, now);
    }

    /// The protocol version the client asked for in its `initialize`.
    fn client_version(&self) -> String {
        self.link
            .session
            .init_params
            .as_deref()
            .or(self.link.session.pending_init.as_deref())
            .and_then(RawObject::parse)
            .and_then(|p| p.string("protocolVersion"))
            .unwrap_or_default()
    }

    /// The server accepted the client's own `initialize` (no cache hit):
    /// its lists are read for the next session.
    pub(super) fn instant_accepted(&mut self, result: &str) {
        let version = self.client_version();
        if let Some(instant) = self.instant.as_mut() {
            instant.reading.begin(&version, result);
        }
    }

    /// The link is ready and the session initialized: ask for the lists
    /// still to be read.
    pub(super) fn instant_read_lists(&mut self, now: Instant) {
        if !self.link.session.initialized || !self.link.ready() {
            return;
        }
        let Some(instant) = self.instant.as_mut() else {
            return;
        };
        // A client given the tools from the cache does not list them from
        // the server, nor does a client after a restart: the calls' own
        // listing is read (it learns the annotations too). Otherwise the
        // client's first listing is, or the calls' (`Timer::LearnTools`).
        let tools = instant.reading.wants(List::Tools)
            && (instant.from_cache || self.link.generation() > 1);
        for list in instant.reading.take_unasked() {
            self.request_list_page(list, None, now);
        }
        if tools {
            self.with_calls(now, |c, ctx, out| c.fetch_tools(ctx.link, out));
        }
        // A server that declares no list is stored at once.
        self.instant_store_if_complete();
    }

    /// Sends the proxy's own request for a page of `list`.
    fn request_list_page(&mut self, list: List, cursor: Option<&str>, now: Instant) {
        let params =
            crate::mcp::tools_list_params(cursor, self.link.session.modern_meta.as_deref());
        let down = self.requests.issue(Inflight::Listing {
            list,
            first: cursor.is_none(),
        });
        let line = jsonrpc::request_line(&down.to_string(), list.method(), Some(&params));
        if self.send_server(Outgoing::own_request(down, list.method(), &params, line)) {
            self.set_timer(now + self.cfg.call_timeout, Timer::ListingTimeout { down });
        } else {
            self.requests.forget(down);
            self.instant_list_failed(list);
        }
    }

    /// A page of `list` passed by: the proxy's own, the client's, or the
    /// calls' `tools/list`. `result` is `None` for an error answer.
    pub(super) fn instant_page(
        &mut self,
        list: List,
        result: Option<&str>,
        first: bool,
        source: Source,
        now: Instant,
    ) {
        let Some(instant) = self.instant.as_mut() else {
            return;
        };
        let paged = match result {
            Some(r) => instant.reading.page(list, r, first, source),
            None => instant.reading.refused(list, first, source),
        };
        match paged {
            Paged::Next(cursor) if list != List::Tools => {
                self.request_list_page(list, Some(&cursor), now)
            }
            // The client, or the calls, ask for the tools' next pages.
            Paged::Next(_) | Paged::Nothing => self.instant_store_if_complete(),
            Paged::Complete => {
                self.instant_reconcile(list);
                self.instant_store_if_complete();
            }
        }
    }

    /// `Timer::ListingTimeout`: the proxy's own list request `down` was
    /// not answered in time.
    pub(super) fn on_listing_timeout(&mut self, down: u64) {
        let listing = |f: &Inflight| matches!(f, Inflight::Listing { .. });
        if let Some(Inflight::Listing { list, .. }) = self.requests.take_if(down, listing) {
            self.instant_list_failed(list);
        }
    }

    /// The proxy's own request for a page of `list` got no answer.
    pub(super) fn instant_list_failed(&mut self, list: List) {
        if let Some(instant) = self.instant.as_mut() {
            instant.reading.fail(list);
        }
        self.instant_store_if_complete();
    }

    /// `list` was read whole: a client given a different one from the
    /// cache is told it changed (it lists again, from the server).
    fn instant_reconcile(&mut self, list: List) {
        let Some(instant) = self.instant.as_ref() else {
            return;
        };
        if !instant.from_cache {
            return;
        }
        let (Some(read), Some(told)) = (
            instant.reading.done(list),
            instant
                .told_lists
                .as_ref()
                .and_then(|t| t[index(list)].as_deref()),
        ) else {
            return;
        };
        if lists_differ(list, read, told) {
            info!(
                "the MCP server's {} differs from the cached one; telling the client",
                list.method()
            );
            self.send_client(jsonrpc::notification_line(list.changed(), None));
        }
    }

    fn instant_store_if_complete(&mut self) {
        let Some(instant) = self.instant.as_mut() else {
            return;
        };
        if let Some(entry) = instant.reading.take_entry() {
            debug!("handshake cache: storing the server's handshake and lists");
            instant.send(CacheJob::Store(entry));
        }
    }
}

#[cfg(test)]
mod tests;
