//! The dispatcher's side of export: the [`Tracer`] it owns. Plain data fed
//! by hooks with the dispatcher's `now`: the open spans (ids, instants, an
//! interned tool), per-tool counters in a vector, and the handle to the
//! exporter. A finished call leaves as one fixed [`Record`] that carries
//! its last attempt too; a call costs no string building here (the
//! client's id is kept inline when short) and no allocation beyond the map
//! of open calls. Must not know JSON, HTTP or the wall clock: names,
//! attributes and times are made by the exporter thread (`record.rs`).

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Instant;

use crate::fasthash::FastMap;
use crate::jsonrpc::RawObject;

use crate::stats::Stats;

use super::record::{
    Attrs, EndedAttempt, Event, FailedRequest, Record, RecordKind, ShortId, Snapshot, ToolCounters,
};
use super::{CallEnd, Handle, SpanContext, Traceparent};

/// A client request other than `tools/call` while it waits: it gets a
/// span only if it fails.
#[derive(Debug)]
pub struct RequestTrace {
    method: String,
    start: Instant,
    parent: Option<SpanContext>,
}

/// The live attempt of a call.
#[derive(Debug)]
struct OpenAttempt {
    span_id: [u8; 8],
    down: u64,
    number: u32,
    start: Instant,
    events: Vec<Event>,
}

/// A call in progress: its span's ids, its live attempt's, and the
/// attempt that ended last (it leaves with the call's record, or alone
/// when another attempt ends after it).
#[derive(Debug)]
struct OpenCall {
    ctx: SpanContext,
    parent: Option<[u8; 8]>,
    tool: Arc<str>,
    client_id: ShortId,
    started: Instant,
    attempts: u32,
    events: Vec<Event>,
    attempt: Option<OpenAttempt>,
    ended: Option<EndedAttempt>,
}

/// Tool names, each kept once and shared by the records, for as many
/// names as the figures keep (`stats::MAX_TOOL_NAMES`): a name past
/// those is not kept, and lives as long as its records.
#[derive(Debug, Default)]
struct Tools {
    names: FastMap<Box<str>, Arc<str>>,
}

impl Tools {
    fn intern(&mut self, tool: &str) -> Arc<str> {
        if let Some(name) = self.names.get(tool) {
            return name.clone();
        }
        let name: Arc<str> = tool.into();
        if self.names.len() < crate::stats::MAX_TOOL_NAMES {
            self.names.insert(tool.into(), name.clone());
        }
        name
    }
}

/// The dispatcher's side of export: open spans, counters, and the handle
/// to the exporter thread.
pub struct Tracer {
    server: Arc<str>,
    rng: fastrand::Rng,
    started: Instant,
    tools: Tools,
    calls: FastMap<u64, OpenCall>,
    /// The figures changed since the last snapshot handed over.
    changed: bool,
    handle: Handle,
}

impl Tracer {
    pub fn new(server: &str, handle: Handle, now: Instant) -> Tracer {
        Tracer {
            server: server.into(),
            rng: fastrand::Rng::new(),
            started: now,
            tools: Tools::default(),
            calls: FastMap::default(),
            changed: false,
            handle,
        }
    }

    /// Seeds the ids (tests).
    #[cfg(test)]
    pub fn with_seed(mut self, seed: u64) -> Tracer {
        self.rng = fastrand::Rng::with_seed(seed);
        self
    }

    fn new_trace_id(&mut self) -> [u8; 16] {
        loop {
            let id = self.rng.u128(..).to_be_bytes();
            if id != [0; 16] {
                return id;
            }
        }
    }

    fn new_span_id(&mut self) -> [u8; 8] {
        loop {
            let id = self.rng.u64(..).to_be_bytes();
            if id != [0; 8] {
                return id;
            }
        }
    }

    /// A new span's context: a child of `parent` (the client's), or the
    /// root of a new trace.
    fn new_context(&mut self, parent: Option<SpanContext>) -> SpanContext {
        SpanContext {
            trace_id: match parent {
                Some(p) => p.trace_id,
                None => self.new_trace_id(),
            },
            span_id: self.new_span_id(),
            sampled: parent.is_none_or(|p| p.sampled),
        }
    }

    /// Hands a finished record to the exporter at the dispatcher's `now`
    /// (not its end: an attempt's record waits for the next attempt).
    fn send(&self, record: Record, now: Instant) {
        if record.ctx.sampled {
            self.handle.send_record(record, now);
        }
    }

    /// A client `tools/call` became call `call`.
    pub fn call_started(
        &mut self,
        call: u64,
        tool: &str,
        client_id: &str,
        parent: Option<SpanContext>,
        now: Instant,
    ) {
        let tool = self.tools.intern(tool);
        let ctx = self.new_context(parent);
        self.calls.insert(
            call,
            OpenCall {
                ctx,
                parent: parent.map(|p| p.span_id),
                tool,
                client_id: ShortId::new(client_id),
                started: now,
                attempts: 0,
                events: Vec::new(),
                attempt: None,
                ended: None,
            },
        );
    }

    /// A call answered at once from the cache or the dedup table (no
    /// attempt of its own).
    pub fn answered_by_proxy(
        &mut self,
        tool: &str,
        client_id: &str,
        parent: Option<SpanContext>,
        end: CallEnd,
        now: Instant,
    ) {
        if !self.handle.traces() {
            return;
        }
        let tool = self.tools.intern(tool);
        let ctx = self.new_context(parent);
        self.send(
            Record {
                ctx,
                parent: parent.map(|p| p.span_id),
                server: self.server.clone(),
                start: now,
                end: now,
                events: Vec::new(),
                kind: RecordKind::Call {
                    tool,
                    client_id: ShortId::new(client_id),
                    attempts: 0,
                    end,
                    last: None,
                },
            },
            now,
        );
    }

    /// A call joined one in flight (dedup): counted; its span is the other's.
    pub fn joined(&mut self, call: Option<u64>, now: Instant) {
        if let Some(c) = call {
            self.call_event(c, "mcp_retry.dedup_joined", Vec::new(), now);
        }
    }

    /// Attempt `down` of call `call` is about to be sent: its span starts,
    /// and the `traceparent` the server must see is returned. Without
    /// trace export there is none: a span the collector never gets must
    /// not become the parent of the server's (a client's `traceparent`
    /// then reaches the server as it was).
    pub fn attempt_started(&mut self, call: u64, down: u64, now: Instant) -> Option<Traceparent> {
        let span_id = self.new_span_id();
        let c = self.calls.get_mut(&call)?;
        c.attempts += 1;
        if !self.handle.traces() {
            return None;
        }
        let ctx = SpanContext { span_id, ..c.ctx };
        let previous = c.attempt.replace(OpenAttempt {
            span_id,
            down,
            number: c.attempts,
            start: now,
            events: Vec::new(),
        });
        if previous.is_some() {
            // Not ended by a hook: it ends here.
            self.end_attempt(call, previous, None, now);
        }
        Some(ctx.traceparent())
    }

    /// An event on call `call`'s live attempt.
    pub fn attempt_event(&mut self, call: u64, name: &'static str, attrs: Attrs, now: Instant) {
        if let Some(a) = self.calls.get_mut(&call).and_then(|c| c.attempt.as_mut()) {
            a.events.push(Event {
                at: now,
                name,
                attrs,
            });
        }
    }

    /// Call `call`'s live attempt ended: answered (`failure` `None`) or
    /// failed (`timeout`, `server_exited`, `transient_error`, `never_sent`).
    pub fn attempt_ended(&mut self, call: u64, failure: Option<&'static str>, now: Instant) {
        let attempt = self.calls.get_mut(&call).and_then(|c| c.attempt.take());
        self.end_attempt(call, attempt, failure, now);
    }

    /// Attempt `a` of call `call` ended at `now`: it waits for the call's
    /// record, and one that waited so far leaves alone.
    fn end_attempt(
        &mut self,
        call: u64,
        attempt: Option<OpenAttempt>,
        failure: Option<&'static str>,
        now: Instant,
    ) {
        if !self.handle.traces() {
            return;
        }
        let (Some(a), Some(c)) = (attempt, self.calls.get_mut(&call)) else {
            return;
        };
        let ended = EndedAttempt {
            span_id: a.span_id,
            down: a.down,
            number: a.number,
            start: a.start,
            end: now,
            failure,
            events: a.events,
        };
        let Some(earlier) = c.ended.replace(ended) else {
            return;
        };
        let record = Record {
            ctx: SpanContext {
                span_id: earlier.span_id,
                ..c.ctx
            },
            parent: Some(c.ctx.span_id),
            server: self.server.clone(),
            start: earlier.start,
            end: earlier.end,
            events: earlier.events,
            kind: RecordKind::Attempt {
                tool: c.tool.clone(),
                down: earlier.down,
                number: earlier.number,
                failure: earlier.failure,
            },
        };
        self.send(record, now);
    }

    /// An event on call `call`'s span (a backoff wait, a breaker refusal).
    pub fn call_event(&mut self, call: u64, name: &'static str, attrs: Attrs, now: Instant) {
        if let Some(c) = self.calls.get_mut(&call) {
            c.events.push(Event {
                at: now,
                name,
                attrs,
            });
        }
    }

    /// The server is being started again: an event on every open call.
    pub fn respawned(&mut self, now: Instant) {
        for c in self.calls.values_mut() {
            c.events.push(Event {
                at: now,
                name: "mcp_retry.respawn",
                attrs: Vec::new(),
            });
        }
    }

    /// Call `call` ended: its span (and a live attempt's) go to the exporter.
    pub fn call_ended(&mut self, call: u64, end: CallEnd, now: Instant) {
        let failure = match end.outcome {
            "cancelled" => Some("cancelled"),
            _ => None,
        };
        self.attempt_ended(call, failure, now);
        let Some(c) = self.calls.remove(&call) else {
            return;
        };
        if !self.handle.traces() {
            return;
        }
        self.send(
            Record {
                ctx: c.ctx,
                parent: c.parent,
                server: self.server.clone(),
                start: c.started,
                end: now,
                events: c.events,
                kind: RecordKind::Call {
                    tool: c.tool,
                    client_id: c.client_id,
                    attempts: c.attempts,
                    end,
                    last: c.ended,
                },
            },
            now,
        );
    }

    /// A client request arrived: what its span needs, should it fail
    /// (`tools/call` has its own spans).
    pub fn request_started(
        &mut self,
        method: &str,
        parent: Option<SpanContext>,
        now: Instant,
    ) -> Option<Box<RequestTrace>> {
        (method != "tools/call" && self.handle.traces()).then(|| {
            Box::new(RequestTrace {
                method: method.to_owned(),
                start: now,
                parent,
            })
        })
    }

    /// Request `client_id` is answered with `line`: an error gets a span.
    /// `ours`: the proxy's own error, with its reason and code, which the
    /// dispatcher knows (the line is not read for them); else the line is
    /// read when it holds an error.
    pub fn request_answered(
        &mut self,
        r: &RequestTrace,
        client_id: &str,
        line: &[u8],
        ours: Option<(&'static str, i64)>,
        now: Instant,
    ) {
        let (error_type, code) = match ours {
            Some((reason, code)) => (reason.to_owned(), Some(code.to_string())),
            None => match server_error(line) {
                Some(known) => known,
                None => return,
            },
        };
        let ctx = self.new_context(r.parent);
        self.send(
            Record {
                ctx,
                parent: r.parent.map(|p| p.span_id),
                server: self.server.clone(),
                start: r.start,
                end: now,
                events: Vec::new(),
                kind: RecordKind::Request(Box::new(FailedRequest {
                    method: r.method.clone(),
                    client_id: client_id.to_owned(),
                    error_type,
                    code,
                })),
            },
            now,
        );
    }

    /// The figures of `stats` as OpenTelemetry counts them.
    fn snapshot(&self, stats: &Stats, now: Instant) -> Snapshot {
        let mut tools = Vec::with_capacity(stats.tools.len());
        let mut failures = Vec::new();
        for (name, f) in &stats.tools {
            let name: Arc<str> = name.as_str().into();
            for (reason, n) in &f.failed_by_reason {
                failures.push((name.clone(), *reason, *n));
            }
            let c = &f.counters;
            let counters = ToolCounters {
                calls: c.calls,
                attempts: c.attempts,
                retries: c.retries,
                cache_hits: c.cache_hits,
                dedup_hits: c.dedup_hits,
                latency: f.latency.exported().clone(),
            };
            tools.push((name, counters));
        }
        Snapshot {
            server: self.server.clone(),
            tools,
            failures,
            breaker: stats.breaker.iter().map(|(t, n)| (*t, *n)).collect(),
            restarts: stats.restarts,
            store: stats.store.counters(),
            store_outage: stats.store.shared_outage(),
            since: self.started,
            at: now,
        }
    }

    /// The figures changed: a flush is due (see `metrics_changed`).
    pub fn figures_changed(&mut self) {
        self.changed = true;
    }

    /// The figures changed since the last snapshot.
    pub fn metrics_changed(&self) -> bool {
        self.changed
    }

    /// Hands the figures of `stats` to the exporter.
    pub fn flush_metrics(&mut self, stats: &Stats, now: Instant) {
        self.changed = false;
        if self.handle.metrics() {
            self.handle.send_metrics(self.snapshot(stats, now));
        }
    }

    /// At exit: open spans end as they are, and the last figures go.
    pub fn finish(&mut self, stats: &Stats, now: Instant) {
        let mut ids: Vec<u64> = self.calls.keys().copied().collect();
        ids.sort();
        for id in ids {
            let end = CallEnd {
                outcome: "failed",
                reason: Some("server_unavailable"),
                source: None,
            };
            self.call_ended(id, end, now);
        }
        self.flush_metrics(stats, now);
    }
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("open_calls", &self.calls.len())
            .finish()
    }
}

/// The type and code of the error `line` answers with (`None` for a
/// result): an error of another mcp-retry's names its reason.
fn server_error(line: &[u8]) -> Option<(String, Option<String>)> {
    // Most answers are results: skip parsing them.
    memchr::memmem::find(line, b"\"error\"")?;
    let error = std::str::from_utf8(line)
        .ok()
        .and_then(RawObject::parse)
        .and_then(|o| o.get("error"))
        .and_then(|e| RawObject::parse(e.get()))?;
    let code = error.get("code").map(|c| c.get().to_owned());
    let data = error.get("data").and_then(|d| RawObject::parse(d.get()));
    let ours = data
        .as_ref()
        .and_then(|d| d.string("source"))
        .is_some_and(|s| s == "mcp-retry");
    let error_type = match (ours, data.as_ref().and_then(|d| d.string("reason"))) {
        (true, Some(reason)) => reason,
        _ => code.clone().unwrap_or_else(|| "error".into()),
    };
    Some((error_type, code))
}
