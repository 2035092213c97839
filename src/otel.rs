//! OpenTelemetry export, off unless configured: one span per `tools/call`
//! with a child span per attempt, and counters and a latency histogram,
//! sent as OTLP/HTTP with JSON encoding by the `otel-export` thread.
//!
//! [`Settings::from_env`] reads the standard `OTEL_*` variables. The
//! dispatcher owns a [`Tracer`]: plain data, fed by hooks in `calls.rs` with
//! the dispatcher's `now` (wall-clock times come from one anchor taken at
//! start). Finished spans and metric snapshots go to the exporter with
//! `try_send` over a queue bounded by count and bytes (`export.rs`): the
//! dispatcher never waits for the network, and a full queue or a dead
//! collector only drops telemetry (counted, said once). Metrics are handed
//! over by a timer the dispatcher sets only after something changed, so an
//! idle proxy does not wake up.
//!
//! `traceparent` (W3C Trace Context) is read from a call's `params._meta`
//! (the call's span becomes its child) and each attempt sends its own in the
//! forwarded request's `params._meta`; with export off no byte changes.
//!
//! Header values (`OTEL_EXPORTER_OTLP_HEADERS`, often credentials) are never
//! logged: messages name the header, never its value.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::config::OtelConfig;
use crate::fasthash::FastMap;
use crate::jsonrpc::RawObject;

mod export;
mod json;

#[cfg(test)]
pub(crate) use export::Item;
pub use export::{Exporter, Handle};

/// What to export and where (from the environment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `…/v1/traces`, if traces are exported.
    pub traces: Option<String>,
    /// `…/v1/metrics`, if metrics are exported.
    pub metrics: Option<String>,
    /// Extra request headers (names and values as configured).
    pub headers: Vec<(String, String)>,
    /// Resource attributes, `service.name` included.
    pub resource: Vec<(String, String)>,
}

impl Settings {
    /// Reads the standard variables through `var`, over the config's
    /// `otel:` section (each variable that is set wins). `Ok(None)`: export
    /// is off (no endpoint, or `OTEL_SDK_DISABLED=true`). Problems that
    /// only degrade export (a malformed header entry) are returned as
    /// notes, which never contain a header value.
    pub fn read(
        var: impl Fn(&str) -> Option<String>,
        config: &OtelConfig,
    ) -> Result<(Option<Settings>, Vec<String>), String> {
        let var = |k: &str| var(k).filter(|v| !v.trim().is_empty());
        let mut notes = Vec::new();
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok((None, notes));
        }
        let base = var("OTEL_EXPORTER_OTLP_ENDPOINT")
            .or_else(|| Some(config.endpoint.clone()).filter(|e| !e.trim().is_empty()));
        let signal = |specific: &str, path: &str| {
            var(specific).map(|v| v.trim().to_owned()).or_else(|| {
                base.as_ref()
                    .map(|b| format!("{}/{path}", b.trim().trim_end_matches('/')))
            })
        };
        let traces = signal("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "v1/traces");
        let metrics = signal("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "v1/metrics");
        if traces.is_none() && metrics.is_none() {
            return Ok((None, notes));
        }
        for url in traces.iter().chain(&metrics) {
            let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
            match scheme.as_deref() {
                Some("http") => {}
                Some("https") if cfg!(feature = "tls") => {}
                Some("https") => {
                    return Err(format!(
                        "endpoint {}: this build has no TLS (cargo feature `tls`); use an http:// endpoint",
                        shown_url(url)
                    ))
                }
                _ => {
                    return Err(format!(
                        "endpoint {}: expected an http:// or https:// URL",
                        shown_url(url)
                    ))
                }
            }
        }
        let mut headers = config.headers.clone();
        if let Some(h) = var("OTEL_EXPORTER_OTLP_HEADERS") {
            for (k, v) in parse_pairs(&h, "OTEL_EXPORTER_OTLP_HEADERS", &mut notes) {
                headers.retain(|(name, _)| !name.eq_ignore_ascii_case(&k));
                headers.push((k, v));
            }
        }
        let mut resource = match var("OTEL_RESOURCE_ATTRIBUTES") {
            Some(r) => parse_pairs(&r, "OTEL_RESOURCE_ATTRIBUTES", &mut notes),
            None => Vec::new(),
        };
        let service = var("OTEL_SERVICE_NAME").map(|s| s.trim().to_owned());
        let from_attrs = resource.iter().any(|(k, _)| k == "service.name");
        match service {
            Some(name) => {
                resource.retain(|(k, _)| k != "service.name");
                resource.insert(0, ("service.name".into(), name));
            }
            None if !from_attrs => {
                let name = match config.service_name.trim() {
                    "" => "mcp-retry",
                    name => name,
                };
                resource.insert(0, ("service.name".into(), name.into()));
            }
            None => {}
        }
        if !resource.iter().any(|(k, _)| k == "service.version") {
            resource.push((
                "service.version".into(),
                env!("CARGO_PKG_VERSION").to_owned(),
            ));
        }
        Ok((
            Some(Settings {
                traces,
                metrics,
                headers,
                resource,
            }),
            notes,
        ))
    }
}

/// `url` as logs may show it: without a `user:password@` part.
pub fn shown_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let host_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..host_end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

/// `k1=v1,k2=v2` with percent-encoded values (the OTel environment
/// format). A malformed entry is skipped with a note naming at most its key.
fn parse_pairs(text: &str, var: &str, notes: &mut Vec<String>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (i, entry) in text.split(',').enumerate() {
        if entry.trim().is_empty() {
            continue;
        }
        let Some((k, v)) = entry.split_once('=') else {
            notes.push(format!("{var}: entry {} has no `=`; ignored", i + 1));
            continue;
        };
        let key = percent_decode(k.trim());
        let value = percent_decode(v.trim());
        match (key, value) {
            (Some(k), Some(v)) if !k.is_empty() => out.push((k, v)),
            (Some(k), _) if !k.is_empty() => notes.push(format!(
                "{var}: the value of {k:?} is not valid percent-encoded UTF-8; ignored"
            )),
            _ => notes.push(format!("{var}: entry {} has no valid key; ignored", i + 1)),
        }
    }
    out
}

/// `%XX` decoding (a `+` stays a `+`); `None` for a bad escape or non-UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A W3C trace context: the ids of one span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub sampled: bool,
}

impl SpanContext {
    /// Parses a `traceparent` header value (version 00, or a later version
    /// read as 00 with anything after the flags ignored, as the spec asks).
    pub fn parse(text: &str) -> Option<SpanContext> {
        let t = text.trim();
        let b = t.as_bytes();
        if b.len() < 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let version = u8::from_str_radix(&t[0..2], 16).ok()?;
        if version == 0xff
            || (version == 0 && b.len() != 55)
            || (version > 0 && b.len() > 55 && b[55] != b'-')
        {
            return None;
        }
        let lower_hex = |s: &str| s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
        if !lower_hex(&t[0..2])
            || !lower_hex(&t[3..35])
            || !lower_hex(&t[36..52])
            || !lower_hex(&t[53..55])
        {
            return None;
        }
        let mut trace_id = [0u8; 16];
        let mut span_id = [0u8; 8];
        for (i, byte) in trace_id.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&t[3 + 2 * i..5 + 2 * i], 16).ok()?;
        }
        for (i, byte) in span_id.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&t[36 + 2 * i..38 + 2 * i], 16).ok()?;
        }
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        let flags = u8::from_str_radix(&t[53..55], 16).ok()?;
        Some(SpanContext {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }

    /// The `traceparent` value naming this span.
    pub fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            hex(&self.trace_id),
            hex(&self.span_id),
            u8::from(self.sampled)
        )
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 * bytes.len());
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
    }
    out
}

/// An attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    /// A constant (no allocation per span).
    Static(&'static str),
    Int(i64),
    Bool(bool),
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

/// A finished (or running) span; times are UNIX nanoseconds.
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

impl Span {
    /// Roughly the bytes it holds (what it costs in the export queue).
    pub fn size(&self) -> usize {
        let attrs = |a: &Attrs| {
            a.iter()
                .map(|(k, v)| {
                    k.len()
                        + 48
                        + match v {
                            Value::Str(s) => s.len(),
                            Value::Static(_) => 0,
                            _ => 8,
                        }
                })
                .sum::<usize>()
        };
        256 + self.name.len()
            + attrs(&self.attrs)
            + self
                .events
                .iter()
                .map(|e| 64 + attrs(&e.attrs))
                .sum::<usize>()
            + self.error.as_ref().map_or(0, String::len)
    }
}

/// How a call ended, for its span and the counters.
#[derive(Debug, Clone, Copy)]
pub struct CallEnd<'a> {
    /// `ok`, `error` (the server's error or `isError`), `failed` (the
    /// proxy's error), `cancelled`.
    pub outcome: &'static str,
    /// The proxy's reason (`timeout`, `circuit_open`, …) or `server_error`.
    pub reason: Option<&'a str>,
    /// Answered by the proxy itself: `cache`, `dedup`, `stale`.
    pub source: Option<&'static str>,
}

impl CallEnd<'_> {
    /// The server's final answer: a result, or its error.
    pub fn answered(error: bool) -> CallEnd<'static> {
        CallEnd {
            outcome: if error { "error" } else { "ok" },
            reason: error.then_some("server_error"),
            source: None,
        }
    }

    /// The proxy's error, for `reason`.
    pub fn failed(reason: &str) -> CallEnd<'_> {
        CallEnd {
            outcome: "failed",
            reason: Some(reason),
            source: None,
        }
    }

    /// A stale cached result instead of an error.
    pub fn stale() -> CallEnd<'static> {
        CallEnd {
            outcome: "ok",
            reason: None,
            source: Some("stale"),
        }
    }

    /// Every client waiting for it cancelled.
    pub fn cancelled() -> CallEnd<'static> {
        CallEnd {
            outcome: "cancelled",
            reason: None,
            source: None,
        }
    }
}

/// A client request other than `tools/call` while it waits: it gets a
/// span only if it fails.
#[derive(Debug)]
pub struct RequestTrace {
    method: String,
    start: Instant,
    parent: Option<SpanContext>,
}

/// A call in progress: its span, and its live attempt's.
#[derive(Debug)]
struct CallTrace {
    span: Span,
    attempt: Option<Span>,
    attempts: u32,
    tool: String,
    started: Instant,
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
    fn record(&mut self, secs: f64) {
        let i = LATENCY_BOUNDS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(LATENCY_BOUNDS.len());
        self.counts[i] += 1;
        self.count += 1;
        self.sum += secs;
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
    pub latency: BTreeMap<String, Histogram>,
}

fn bump<K: Ord>(map: &mut BTreeMap<K, u64>, key: K) {
    *map.entry(key).or_default() += 1;
}

/// The dispatcher's side of export: open spans, counters, and the handle
/// to the exporter thread.
pub struct Tracer {
    server: String,
    rng: fastrand::Rng,
    /// `now` and the wall clock at the same moment.
    anchor: (Instant, SystemTime),
    start_unix: u64,
    calls: FastMap<u64, CallTrace>,
    metrics: Metrics,
    /// Counters changed since the last snapshot handed over.
    changed: bool,
    handle: Handle,
}

impl Tracer {
    pub fn new(server: &str, handle: Handle, now: Instant) -> Tracer {
        let wall = SystemTime::now();
        Tracer {
            server: server.to_owned(),
            rng: fastrand::Rng::new(),
            anchor: (now, wall),
            start_unix: unix_nanos(wall),
            calls: FastMap::default(),
            metrics: Metrics::default(),
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

    fn time(&self, now: Instant) -> u64 {
        let (at, wall) = self.anchor;
        let t = match now.checked_duration_since(at) {
            Some(d) => wall + d,
            None => wall - at.saturating_duration_since(now),
        };
        unix_nanos(t)
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

    /// A call's span, child of the client's `traceparent` if `params` has one.
    fn call_span(
        &mut self,
        tool: &str,
        client_id: &str,
        params: Option<&str>,
        now: Instant,
    ) -> Span {
        let parent = params.and_then(client_context);
        let ctx = SpanContext {
            trace_id: match parent {
                Some(p) => p.trace_id,
                None => self.new_trace_id(),
            },
            span_id: self.new_span_id(),
            sampled: parent.is_none_or(|p| p.sampled),
        };
        let t = self.time(now);
        Span {
            ctx,
            parent: parent.map(|p| p.span_id),
            name: format!("tools/call {tool}"),
            kind: SpanKind::Server,
            start: t,
            end: t,
            attrs: vec![
                ("mcp.method.name", "tools/call".into()),
                ("gen_ai.operation.name", "execute_tool".into()),
                ("gen_ai.tool.name", tool.to_owned().into()),
                ("jsonrpc.request.id", client_id.to_owned().into()),
                ("network.transport", "pipe".into()),
                ("mcp_retry.server", self.server.clone().into()),
            ],
            events: Vec::new(),
            error: None,
        }
    }

    /// A client `tools/call` became call `call`.
    pub fn call_started(
        &mut self,
        call: u64,
        tool: &str,
        client_id: &str,
        params: Option<&str>,
        now: Instant,
    ) {
        let span = self.call_span(tool, client_id, params, now);
        bump(&mut self.metrics.calls, tool.to_owned());
        self.changed = true;
        self.calls.insert(
            call,
            CallTrace {
                span,
                attempt: None,
                attempts: 0,
                tool: tool.to_owned(),
                started: now,
            },
        );
    }

    /// A call answered at once from the cache or the dedup table (no
    /// attempt of its own).
    pub fn answered_by_proxy(
        &mut self,
        tool: &str,
        client_id: &str,
        params: Option<&str>,
        source: &'static str,
        now: Instant,
    ) {
        bump(&mut self.metrics.calls, tool.to_owned());
        match source {
            "cache" => bump(&mut self.metrics.cache_hits, tool.to_owned()),
            _ => bump(&mut self.metrics.dedup_hits, tool.to_owned()),
        }
        self.changed = true;
        let mut span = self.call_span(tool, client_id, params, now);
        span.attrs.push(("mcp_retry.outcome", "ok".into()));
        span.attrs.push(("mcp_retry.source", source.into()));
        span.attrs.push(("mcp_retry.attempts", 0.into()));
        self.handle.send_span(span);
    }

    /// A call joined one in flight (dedup): counted; its span is the other's.
    pub fn joined(&mut self, call: Option<u64>, tool: &str, now: Instant) {
        bump(&mut self.metrics.calls, tool.to_owned());
        bump(&mut self.metrics.dedup_hits, tool.to_owned());
        self.changed = true;
        if let Some(c) = call {
            self.call_event(c, "mcp_retry.dedup_joined", Vec::new(), now);
        }
    }

    /// Attempt `down` of call `call` is about to be sent: its span starts,
    /// and the `traceparent` the server must see is returned.
    pub fn attempt_started(&mut self, call: u64, down: u64, now: Instant) -> Option<String> {
        let span_id = self.new_span_id();
        let t = self.time(now);
        let c = self.calls.get_mut(&call)?;
        c.attempts += 1;
        bump(&mut self.metrics.attempts, c.tool.clone());
        if c.attempts > 1 {
            bump(&mut self.metrics.retries, c.tool.clone());
        }
        self.changed = true;
        let ctx = SpanContext {
            trace_id: c.span.ctx.trace_id,
            span_id,
            sampled: c.span.ctx.sampled,
        };
        let span = Span {
            ctx,
            parent: Some(c.span.ctx.span_id),
            name: format!("tools/call {}", c.tool),
            kind: SpanKind::Client,
            start: t,
            end: t,
            attrs: vec![
                ("mcp.method.name", "tools/call".into()),
                ("gen_ai.operation.name", "execute_tool".into()),
                ("gen_ai.tool.name", c.tool.clone().into()),
                ("jsonrpc.request.id", down.to_string().into()),
                ("mcp_retry.attempt", i64::from(c.attempts).into()),
            ],
            events: Vec::new(),
            error: None,
        };
        let tp = ctx.traceparent();
        if let Some(old) = c.attempt.replace(span) {
            self.handle.send_span(old);
        }
        Some(tp)
    }

    /// An event on call `call`'s live attempt.
    pub fn attempt_event(&mut self, call: u64, name: &'static str, attrs: Attrs, now: Instant) {
        let time = self.time(now);
        if let Some(a) = self.calls.get_mut(&call).and_then(|c| c.attempt.as_mut()) {
            a.events.push(SpanEvent { time, name, attrs });
        }
    }

    /// Call `call`'s live attempt ended: answered (`failure` `None`) or
    /// failed (`timeout`, `server_exited`, `transient_error`, `never_sent`).
    pub fn attempt_ended(&mut self, call: u64, failure: Option<&'static str>, now: Instant) {
        let t = self.time(now);
        let Some(mut a) = self.calls.get_mut(&call).and_then(|c| c.attempt.take()) else {
            return;
        };
        a.end = t;
        if let Some(f) = failure {
            a.attrs.push(("mcp_retry.failure", f.into()));
            a.attrs.push(("error.type", f.into()));
            a.error = Some(f.to_owned());
        }
        self.handle.send_span(a);
    }

    /// An event on call `call`'s span (a backoff wait, a breaker refusal).
    pub fn call_event(&mut self, call: u64, name: &'static str, attrs: Attrs, now: Instant) {
        let time = self.time(now);
        if let Some(c) = self.calls.get_mut(&call) {
            c.span.events.push(SpanEvent { time, name, attrs });
        }
    }

    /// The server is being started again: an event on every open call.
    pub fn respawned(&mut self, now: Instant) {
        self.metrics.restarts += 1;
        self.changed = true;
        let time = self.time(now);
        for c in self.calls.values_mut() {
            c.span.events.push(SpanEvent {
                time,
                name: "mcp_retry.respawn",
                attrs: Vec::new(),
            });
        }
    }

    /// The breaker changed state (`opened`, `half_opened`, `closed`, `reopened`).
    pub fn breaker(&mut self, transition: &'static str) {
        bump(&mut self.metrics.breaker, transition);
        self.changed = true;
    }

    /// Call `call` ended: its span (and a live attempt's) go to the exporter.
    pub fn call_ended(&mut self, call: u64, end: CallEnd<'_>, now: Instant) {
        let failure = match end.outcome {
            "cancelled" => Some("cancelled"),
            _ => None,
        };
        self.attempt_ended(call, failure, now);
        let Some(mut c) = self.calls.remove(&call) else {
            return;
        };
        let t = self.time(now);
        c.span.end = t;
        let m = &mut self.metrics;
        if c.attempts > 0 {
            m.latency
                .entry(c.tool.clone())
                .or_default()
                .record(now.saturating_duration_since(c.started).as_secs_f64());
        }
        if let Some(reason) = end.reason {
            bump(&mut m.failures, (c.tool.clone(), reason.to_owned()));
        }
        self.changed = true;
        let s = &mut c.span;
        s.attrs.push(("mcp_retry.outcome", end.outcome.into()));
        s.attrs
            .push(("mcp_retry.attempts", i64::from(c.attempts).into()));
        if let Some(src) = end.source {
            s.attrs.push(("mcp_retry.source", src.into()));
        }
        if let Some(reason) = end.reason {
            s.attrs.push(("mcp_retry.reason", reason.to_owned().into()));
            s.attrs.push(("error.type", reason.to_owned().into()));
            s.error = Some(reason.to_owned());
        } else if end.outcome == "cancelled" {
            s.attrs.push(("error.type", "cancelled".into()));
            s.error = Some("cancelled".into());
        }
        self.handle.send_span(c.span);
    }

    /// A client request arrived: what its span needs, should it fail
    /// (`tools/call` has its own spans).
    pub fn request_started(
        &mut self,
        method: &str,
        params: Option<&str>,
        now: Instant,
    ) -> Option<Box<RequestTrace>> {
        (method != "tools/call").then(|| {
            Box::new(RequestTrace {
                method: method.to_owned(),
                start: now,
                parent: params.and_then(client_context),
            })
        })
    }

    /// Request `client_id` is answered with `line`: an error gets a span.
    pub fn request_answered(
        &mut self,
        r: &RequestTrace,
        client_id: &str,
        line: &[u8],
        now: Instant,
    ) {
        let Some(error) = std::str::from_utf8(line)
            .ok()
            .and_then(RawObject::parse)
            .and_then(|o| o.get("error"))
            .and_then(|e| RawObject::parse(e.get()))
        else {
            return;
        };
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
        let ctx = SpanContext {
            trace_id: match r.parent {
                Some(p) => p.trace_id,
                None => self.new_trace_id(),
            },
            span_id: self.new_span_id(),
            sampled: r.parent.is_none_or(|p| p.sampled),
        };
        let mut attrs: Attrs = vec![
            ("mcp.method.name", r.method.clone().into()),
            ("jsonrpc.request.id", client_id.to_owned().into()),
            ("network.transport", "pipe".into()),
            ("mcp_retry.server", self.server.clone().into()),
            ("error.type", error_type.clone().into()),
        ];
        if let Some(code) = code {
            attrs.push(("rpc.jsonrpc.error_code", code.into()));
        }
        let span = Span {
            ctx,
            parent: r.parent.map(|p| p.span_id),
            name: r.method.clone(),
            kind: SpanKind::Server,
            start: self.time(r.start),
            end: self.time(now),
            attrs,
            events: Vec::new(),
            error: Some(error_type),
        };
        self.handle.send_span(span);
    }

    /// The counters so far.
    #[cfg(test)]
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Counters changed since the last snapshot.
    pub fn metrics_changed(&self) -> bool {
        self.changed
    }

    /// Hands the counters to the exporter.
    pub fn flush_metrics(&mut self, now: Instant) {
        self.changed = false;
        let body = json::metrics(
            &self.handle.resource,
            &self.server,
            &self.metrics,
            self.start_unix,
            self.time(now),
        );
        self.handle.send_metrics(body);
    }

    /// At exit: open spans end as they are, and the last counters go.
    pub fn finish(&mut self, now: Instant) {
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
        self.flush_metrics(now);
    }
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("open_calls", &self.calls.len())
            .finish()
    }
}

/// How often changed counters are exported.
pub const METRICS_INTERVAL: Duration = Duration::from_secs(10);

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The client's trace context from a request's `params._meta.traceparent`.
fn client_context(params: &str) -> Option<SpanContext> {
    if !params.contains("traceparent") {
        return None;
    }
    let meta = RawObject::parse(RawObject::parse(params)?.get("_meta")?.get())?;
    SpanContext::parse(&meta.string("traceparent")?)
}

/// `params` with `_meta.traceparent` set to `traceparent` (replacing one
/// the client sent; `_meta` is added when absent); `None` when `params` is
/// not an object.
pub fn with_traceparent(params: &str, traceparent: &str) -> Option<String> {
    let mut o = RawObject::parse(params)?;
    let member = format!("\"traceparent\":\"{traceparent}\"");
    Some(
        match o.get("_meta").and_then(|m| RawObject::parse(m.get())) {
            Some(mut meta) => {
                meta.remove("traceparent");
                o.to_json_replacing("_meta", &meta.to_json_after(&member))
            }
            None => {
                o.remove("_meta");
                o.to_json_after(&format!("\"_meta\":{{{member}}}"))
            }
        },
    )
}

#[cfg(test)]
mod tests;
