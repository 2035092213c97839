//! What crosses the export queue, and how the `otel-export` thread turns it
//! into spans and counters by name. The dispatcher's side (`tracer.rs`)
//! fills fixed records: ids, instants, interned names, constants for
//! outcomes and reasons. Span names, attributes, wall-clock times and
//! every string are made here, on the exporter thread, so that a call
//! costs the dispatcher no formatting. Must not know JSON or HTTP.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::{CallEnd, SpanContext};

/// An attribute value.
#[derive(Debug, Clone)]
pub enum Value {
    Str(String),
    /// A constant (no allocation per span).
    Static(&'static str),
    /// An interned name (a tool, the server).
    Shared(Arc<str>),
    Int(i64),
    Bool(bool),
}

impl Value {
    /// The text of a string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            Value::Static(s) => Some(s),
            Value::Shared(s) => Some(s),
            Value::Int(_) | Value::Bool(_) => None,
        }
    }
}

/// String values compare by their text, however they are held.
impl PartialEq for Value {
    fn eq(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::Int(a), Value::Int(b)) => a == b,
            (Value::Bool(a), Value::Bool(b)) => a == b,
            (a, b) => a.as_str().is_some() && a.as_str() == b.as_str(),
        }
    }
}

impl From<&'static str> for Value {
    fn from(s: &'static str) -> Value {
        Value::Static(s)
    }
}
impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::Str(s)
    }
}
impl From<i64> for Value {
    fn from(n: i64) -> Value {
        Value::Int(n)
    }
}
impl From<bool> for Value {
    fn from(b: bool) -> Value {
        Value::Bool(b)
    }
}

pub type Attrs = Vec<(&'static str, Value)>;

/// OTLP `SpanKind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    Server = 2,
    Client = 3,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SpanEvent {
    pub time: u64,
    pub name: &'static str,
    pub attrs: Attrs,
}

/// A finished span as it is exported; times are UNIX nanoseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    pub ctx: SpanContext,
    pub parent: Option<[u8; 8]>,
    pub name: String,
    pub kind: SpanKind,
    pub start: u64,
    pub end: u64,
    pub attrs: Attrs,
    pub events: Vec<SpanEvent>,
    /// `Some(message)`: status ERROR.
    pub error: Option<String>,
}

/// The wall clock at one instant: turns the dispatcher's instants into
/// UNIX times.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    at: Instant,
    wall: SystemTime,
}

impl Clock {
    pub fn now() -> Clock {
        Clock {
            at: Instant::now(),
            wall: SystemTime::now(),
        }
    }

    /// `t` in nanoseconds since the UNIX epoch.
    pub fn unix_nanos(&self, t: Instant) -> u64 {
        let wall = match t.checked_duration_since(self.at) {
            Some(d) => self.wall + d,
            None => self.wall - self.at.saturating_duration_since(t),
        };
        wall.duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    }
}

/// A client id (raw JSON, as the client wrote it) kept without an
/// allocation when it is short, as ids almost always are.
#[derive(Debug, Clone)]
pub enum ShortId {
    Inline { len: u8, bytes: [u8; 22] },
    Heap(Box<str>),
}

impl ShortId {
    /// The bytes it holds outside itself (a long id's text).
    pub fn heap_len(&self) -> usize {
        match self {
            ShortId::Inline { .. } => 0,
            ShortId::Heap(s) => s.len(),
        }
    }

    pub fn new(id: &str) -> ShortId {
        match id.len() {
            n if n <= 22 => {
                let mut bytes = [0u8; 22];
                bytes[..n].copy_from_slice(id.as_bytes());
                ShortId::Inline {
                    len: n as u8,
                    bytes,
                }
            }
            _ => ShortId::Heap(id.into()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            // Copied whole from a `&str`, so always valid.
            ShortId::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
            ShortId::Heap(s) => s,
        }
    }
}

/// Something that happened during a span; `attrs` are empty but for
/// backoff waits and breaker refusals (no allocation otherwise).
#[derive(Debug, Clone)]
pub struct Event {
    pub at: Instant,
    pub name: &'static str,
    pub attrs: Attrs,
}

/// A failed request other than `tools/call` (rare: built as strings).
#[derive(Debug, Clone)]
pub struct FailedRequest {
    pub method: String,
    pub client_id: String,
    pub error_type: String,
    pub code: Option<String>,
}

/// An attempt that ended, as its call's record may carry it.
#[derive(Debug, Clone)]
pub struct EndedAttempt {
    pub span_id: [u8; 8],
    /// The id it was sent to the server with.
    pub down: u64,
    /// 1 for the first attempt.
    pub number: u32,
    pub start: Instant,
    pub end: Instant,
    pub failure: Option<&'static str>,
    pub events: Vec<Event>,
}

/// Which span a record is.
#[derive(Debug, Clone)]
pub enum RecordKind {
    /// A client's `tools/call`, with its last attempt when that ended with
    /// it (the common case: one record, two spans).
    Call {
        tool: Arc<str>,
        client_id: ShortId,
        attempts: u32,
        end: CallEnd,
        last: Option<EndedAttempt>,
    },
    /// An attempt that ended before its call (a retry followed): the
    /// record's ids, times and events are the attempt's.
    Attempt {
        tool: Arc<str>,
        down: u64,
        number: u32,
        failure: Option<&'static str>,
    },
    Request(Box<FailedRequest>),
}

/// One or two finished spans as the dispatcher hands them over.
#[derive(Debug, Clone)]
pub struct Record {
    pub ctx: SpanContext,
    pub parent: Option<[u8; 8]>,
    pub server: Arc<str>,
    pub start: Instant,
    pub end: Instant,
    pub events: Vec<Event>,
    pub kind: RecordKind,
}

/// Rough bytes of a record beyond its fixed size, for the queue's bound.
const EVENT_BYTES: usize = 96;

/// What makes a span what it is, beside its ids and times.
struct Parts {
    name: String,
    kind: SpanKind,
    attrs: Attrs,
    error: Option<String>,
}

impl Record {
    /// Roughly the bytes it holds (what it costs in the export queue).
    pub fn size(&self) -> usize {
        let extra = match &self.kind {
            RecordKind::Request(r) => {
                let code = r.code.as_ref().map_or(0, String::len);
                r.method.len() + r.client_id.len() + r.error_type.len() + code + 32
            }
            RecordKind::Call {
                client_id, last, ..
            } => {
                let events = last.as_ref().map_or(0, |a| a.events.len() * EVENT_BYTES);
                client_id.heap_len() + events
            }
            RecordKind::Attempt { .. } => 0,
        };
        std::mem::size_of::<Record>() + extra + self.events.len() * EVENT_BYTES
    }

    /// How many spans it holds.
    pub fn spans_held(&self) -> u64 {
        match &self.kind {
            RecordKind::Call { last: Some(_), .. } => 2,
            _ => 1,
        }
    }

    /// Appends its spans as OTLP describes them (on the exporter thread):
    /// a call's last attempt before the call.
    pub fn render(&self, clock: &Clock, out: &mut Vec<Span>) {
        let parts = match &self.kind {
            RecordKind::Call {
                tool,
                client_id,
                attempts,
                end,
                last,
            } => {
                if let Some(a) = last {
                    let ctx = SpanContext {
                        span_id: a.span_id,
                        ..self.ctx
                    };
                    let parts = attempt_parts(tool, a.down, a.number, a.failure);
                    let times = (a.start, a.end);
                    out.push(span(
                        ctx,
                        Some(self.ctx.span_id),
                        times,
                        &a.events,
                        parts,
                        clock,
                    ));
                }
                call_parts(tool, client_id, *attempts, end, &self.server)
            }
            RecordKind::Attempt {
                tool,
                down,
                number,
                failure,
            } => attempt_parts(tool, *down, *number, *failure),
            RecordKind::Request(r) => request_parts(r, &self.server),
        };
        let times = (self.start, self.end);
        out.push(span(
            self.ctx,
            self.parent,
            times,
            &self.events,
            parts,
            clock,
        ));
    }

    /// Its spans (tests).
    #[cfg(test)]
    pub fn spans(&self, clock: &Clock) -> Vec<Span> {
        let mut out = Vec::new();
        self.render(clock, &mut out);
        out
    }
}

fn span(
    ctx: SpanContext,
    parent: Option<[u8; 8]>,
    (start, end): (Instant, Instant),
    events: &[Event],
    parts: Parts,
    clock: &Clock,
) -> Span {
    Span {
        ctx,
        parent,
        name: parts.name,
        kind: parts.kind,
        start: clock.unix_nanos(start),
        end: clock.unix_nanos(end),
        attrs: parts.attrs,
        events: events
            .iter()
            .map(|e| SpanEvent {
                time: clock.unix_nanos(e.at),
                name: e.name,
                attrs: e.attrs.clone(),
            })
            .collect(),
        error: parts.error,
    }
}

fn call_parts(
    tool: &Arc<str>,
    client_id: &ShortId,
    attempts: u32,
    end: &CallEnd,
    server: &Arc<str>,
) -> Parts {
    let mut attrs = tool_call_attrs(tool, client_id.as_str().to_owned());
    attrs.extend([
        ("network.transport", "pipe".into()),
        ("mcp_retry.server", Value::Shared(server.clone())),
        ("mcp_retry.outcome", end.outcome.into()),
        ("mcp_retry.attempts", i64::from(attempts).into()),
    ]);
    if let Some(source) = end.source {
        attrs.push(("mcp_retry.source", source.into()));
    }
    let error = match (end.reason, end.outcome) {
        (Some(reason), _) => {
            attrs.push(("mcp_retry.reason", reason.into()));
            Some(reason)
        }
        (None, "cancelled") => Some("cancelled"),
        (None, _) => None,
    };
    if let Some(e) = error {
        attrs.push(("error.type", e.into()));
    }
    Parts {
        name: format!("tools/call {tool}"),
        kind: SpanKind::Server,
        attrs,
        error: error.map(str::to_owned),
    }
}

fn attempt_parts(tool: &Arc<str>, down: u64, number: u32, failure: Option<&'static str>) -> Parts {
    let mut attrs = tool_call_attrs(tool, down.to_string());
    attrs.push(("mcp_retry.attempt", i64::from(number).into()));
    if let Some(f) = failure {
        attrs.push(("mcp_retry.failure", f.into()));
        attrs.push(("error.type", f.into()));
    }
    Parts {
        name: format!("tools/call {tool}"),
        kind: SpanKind::Client,
        attrs,
        error: failure.map(str::to_owned),
    }
}

fn request_parts(r: &FailedRequest, server: &Arc<str>) -> Parts {
    let mut attrs: Attrs = vec![
        ("mcp.method.name", r.method.clone().into()),
        ("jsonrpc.request.id", r.client_id.clone().into()),
        ("network.transport", "pipe".into()),
        ("mcp_retry.server", Value::Shared(server.clone())),
        ("error.type", r.error_type.clone().into()),
    ];
    if let Some(code) = &r.code {
        attrs.push(("rpc.jsonrpc.error_code", code.clone().into()));
    }
    Parts {
        name: r.method.clone(),
        kind: SpanKind::Server,
        attrs,
        error: Some(r.error_type.clone()),
    }
}

/// The attributes a call's span and its attempts' share; `id` is the
/// JSON-RPC id of the request the span is about.
fn tool_call_attrs(tool: &Arc<str>, id: String) -> Attrs {
    let mut attrs = Vec::with_capacity(12);
    attrs.extend([
        ("mcp.method.name", "tools/call".into()),
        ("gen_ai.operation.name", "execute_tool".into()),
        ("gen_ai.tool.name", Value::Shared(tool.clone())),
        ("jsonrpc.request.id", id.into()),
    ]);
    attrs
}

/// Upper bounds (seconds) of the latency histogram's buckets.
pub const LATENCY_BOUNDS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// A latency histogram (cumulative).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    pub counts: [u64; LATENCY_BOUNDS.len() + 1],
    pub count: u64,
    pub sum: f64,
}

impl Histogram {
    pub fn record(&mut self, secs: f64) {
        let i = LATENCY_BOUNDS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(LATENCY_BOUNDS.len());
        self.counts[i] += 1;
        self.count += 1;
        self.sum += secs;
    }
}

/// One tool's counters since start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolCounters {
    pub calls: u64,
    pub attempts: u64,
    pub retries: u64,
    pub cache_hits: u64,
    pub dedup_hits: u64,
    pub latency: Histogram,
}

/// The counters as the dispatcher hands them over: by interned tool.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub server: Arc<str>,
    pub tools: Vec<(Arc<str>, ToolCounters)>,
    pub failures: Vec<(Arc<str>, &'static str, u64)>,
    pub breaker: Vec<(&'static str, u64)>,
    pub restarts: u64,
    /// The store's counters by name (`stats::StoreFigures::counters`).
    pub store: [(&'static str, u64); 4],
    /// With a shared store (Redis), whether it is unreachable now.
    pub store_outage: Option<bool>,
    /// When counting began, and the moment of the snapshot.
    pub since: Instant,
    pub at: Instant,
}

impl Snapshot {
    /// Roughly the bytes it holds.
    pub fn size(&self) -> usize {
        std::mem::size_of::<Snapshot>()
            + self.tools.len() * (std::mem::size_of::<ToolCounters>() + 32)
            + self.failures.len() * 48
    }

    /// The counters by name.
    pub fn metrics(&self) -> Metrics {
        let mut m = Metrics::default();
        for (tool, c) in &self.tools {
            let name = || tool.to_string();
            let put = |map: &mut BTreeMap<String, u64>, n: u64| {
                if n > 0 {
                    map.insert(name(), n);
                }
            };
            put(&mut m.calls, c.calls);
            put(&mut m.attempts, c.attempts);
            put(&mut m.retries, c.retries);
            put(&mut m.cache_hits, c.cache_hits);
            put(&mut m.dedup_hits, c.dedup_hits);
            if c.latency.count > 0 {
                m.latency.insert(name(), c.latency.clone());
            }
        }
        for (tool, reason, n) in &self.failures {
            m.failures
                .insert((tool.to_string(), (*reason).to_owned()), *n);
        }
        m.breaker = self.breaker.iter().copied().collect();
        m.restarts = self.restarts;
        m.store = self.store.iter().copied().collect();
        m.store_outage = self.store_outage.map(u64::from);
        m
    }
}

/// Cumulative counters since start, by tool (and reason).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    pub calls: BTreeMap<String, u64>,
    pub attempts: BTreeMap<String, u64>,
    pub retries: BTreeMap<String, u64>,
    pub failures: BTreeMap<(String, String), u64>,
    pub cache_hits: BTreeMap<String, u64>,
    pub dedup_hits: BTreeMap<String, u64>,
    pub breaker: BTreeMap<&'static str, u64>,
    pub restarts: u64,
    /// The store of idempotency keys: operations, replays, waits,
    /// unknown_answers.
    pub store: BTreeMap<&'static str, u64>,
    /// With a shared store, 1 during its outage, else 0 (a gauge).
    pub store_outage: Option<u64>,
    pub latency: BTreeMap<String, Histogram>,
}
