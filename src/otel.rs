//! OpenTelemetry export, off unless configured: one span per `tools/call`
//! with a child span per attempt, and counters and a latency histogram,
//! sent as OTLP/HTTP with JSON encoding by the `otel-export` thread.
//!
//! [`Settings::read`] resolves the standard `OTEL_*` variables over the
//! config's `otel:` section (a pure function of both). The dispatcher owns
//! a [`Tracer`] (`tracer.rs`) fed by hooks with the dispatcher's `now`; it
//! hands finished spans over as fixed records and the counters as a
//! snapshot (`record.rs`), and the exporter thread makes names,
//! attributes, wall-clock times and JSON of them (`json.rs`,
//! `export.rs`). The queue between them is bounded by count and bytes and
//! only ever `try_send`: the dispatcher never waits for the network, and a
//! full queue or a collector that is down only drops telemetry (counted,
//! said once). Metrics are handed over by a timer the dispatcher sets only
//! after something changed, so an idle proxy does not wake up.
//!
//! `traceparent` (W3C Trace Context) is read from a request's
//! `params._meta` where the client's line is read (`inbound.rs`) and comes
//! with the request as a [`SpanContext`] (the call's span becomes its
//! child: the tracer reads no params); each attempt sends its own in the
//! forwarded request's `params._meta`, written where the call's reader
//! decided ([`TraceparentEdit`]: no attempt parses the params); with export
//! off no byte changes.
//!
//! Header values (`OTEL_EXPORTER_OTLP_HEADERS` and the per-signal ones,
//! often credentials) are never logged: messages name the header, never
//! its value; an endpoint is logged without its user info, query and
//! fragment. The exporter follows no redirect (a 3xx fails the export,
//! naming the status), so neither headers nor spans reach another host.

#![forbid(unsafe_code)]

use std::borrow::Cow;
use std::ops::Range;
use std::time::Duration;

use crate::config::OtelConfig;
use crate::jsonrpc::{self, Message, Params};

mod export;
mod json;
pub(crate) mod record;
mod tracer;

#[cfg(test)]
pub(crate) use export::Item;
pub use export::{Exporter, Handle};
#[cfg(test)]
pub(crate) use record::{Clock, Span, SpanKind, Value};
pub use tracer::{RequestTrace, Tracer};

/// Where one signal goes, and the headers sent with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The full URL (`…/v1/traces`, or a per-signal variable as it is).
    pub url: String,
    /// Extra request headers (names and values as configured).
    pub headers: Vec<(String, String)>,
}

/// What to export and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Where traces go, if they are exported.
    pub traces: Option<Endpoint>,
    /// Where metrics go, if they are exported.
    pub metrics: Option<Endpoint>,
    /// Resource attributes, `service.name` included.
    pub resource: Vec<(String, String)>,
}

/// One signal's variables.
struct Signal {
    /// `traces`, `metrics`.
    name: &'static str,
    /// Appended to the generic endpoint.
    path: &'static str,
    endpoint: &'static str,
    headers: &'static str,
    protocol: &'static str,
    exporter: &'static str,
}

const TRACES: Signal = Signal {
    name: "traces",
    path: "v1/traces",
    endpoint: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    headers: "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    protocol: "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    exporter: "OTEL_TRACES_EXPORTER",
};

const METRICS: Signal = Signal {
    name: "metrics",
    path: "v1/metrics",
    endpoint: "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    headers: "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
    protocol: "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    exporter: "OTEL_METRICS_EXPORTER",
};

impl Settings {
    /// Reads the standard variables through `var`, over the config's
    /// `otel:` section (each variable that is set wins). `Ok(None)`: export
    /// is off (no endpoint, `OTEL_SDK_DISABLED=true`, or both signals'
    /// exporters `none`). Per signal, `OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT`
    /// is used as it is (no path appended) and wins over the generic
    /// endpoint, and `OTEL_EXPORTER_OTLP_{TRACES,METRICS}_HEADERS` are
    /// merged over the generic headers (a name set in both takes the
    /// signal's value). Problems that only degrade export (a malformed
    /// header entry, an exporter or protocol other than ours) are returned
    /// as notes, which never contain a header value.
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
        let mut generic = config.headers.clone();
        if let Some(h) = var("OTEL_EXPORTER_OTLP_HEADERS") {
            merge_headers(&mut generic, &h, "OTEL_EXPORTER_OTLP_HEADERS", &mut notes);
        }
        if let Some(p) = var("OTEL_EXPORTER_OTLP_PROTOCOL") {
            note_protocol(&mut notes, "OTEL_EXPORTER_OTLP_PROTOCOL", &p);
        }
        let mut endpoint = |signal: &Signal| -> Result<Option<Endpoint>, String> {
            if !exporter_is_otlp(var(signal.exporter), signal, &mut notes) {
                return Ok(None);
            }
            let url = match var(signal.endpoint) {
                Some(url) => url.trim().to_owned(),
                None => match &base {
                    Some(b) => format!("{}/{}", b.trim().trim_end_matches('/'), signal.path),
                    None => return Ok(None),
                },
            };
            check_url(&url)?;
            if let Some(p) = var(signal.protocol) {
                note_protocol(&mut notes, signal.protocol, &p);
            }
            let mut headers = generic.clone();
            if let Some(h) = var(signal.headers) {
                merge_headers(&mut headers, &h, signal.headers, &mut notes);
            }
            Ok(Some(Endpoint { url, headers }))
        };
        let traces = endpoint(&TRACES)?;
        let metrics = endpoint(&METRICS)?;
        if traces.is_none() && metrics.is_none() {
            return Ok((None, notes));
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
                resource,
            }),
            notes,
        ))
    }
}

/// Whether `OTEL_{TRACES,METRICS}_EXPORTER` (a comma-separated list,
/// `otlp` when unset) asks for OTLP. `none` turns the signal off quietly;
/// any other exporter cannot be had here and is said.
fn exporter_is_otlp(value: Option<String>, signal: &Signal, notes: &mut Vec<String>) -> bool {
    let Some(value) = value else {
        return true;
    };
    let names: Vec<String> = value
        .split(',')
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty())
        .collect();
    let others: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| !matches!(*n, "otlp" | "none"))
        .collect();
    if !others.is_empty() {
        notes.push(format!(
            "{}={value}: only otlp (or none) is supported; {} ignored",
            signal.exporter,
            others.join(", ")
        ));
    }
    let otlp = names.iter().any(|n| n == "otlp");
    if !otlp && !names.iter().all(|n| n == "none") {
        notes.push(format!("{} are not exported", signal.name));
    }
    otlp
}

/// A protocol other than the one we speak is said (the collector's
/// OTLP/HTTP receiver takes JSON bodies as well as protobuf ones; a gRPC
/// endpoint does not).
fn note_protocol(notes: &mut Vec<String>, var: &str, value: &str) {
    match value.trim() {
        "http/json" | "http/protobuf" => {}
        other => notes.push(format!(
            "{var}={other}: mcp-retry sends OTLP/HTTP with JSON bodies (http/json); the endpoint must be an OTLP/HTTP receiver (port 4318 by default)"
        )),
    }
}

fn check_url(url: &str) -> Result<(), String> {
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    match scheme.as_deref() {
        Some("http") => Ok(()),
        Some("https") if cfg!(feature = "tls") => Ok(()),
        Some("https") => Err(format!(
            "endpoint {}: this build has no TLS (cargo feature `tls`); use an http:// endpoint",
            shown_url(url)
        )),
        _ => Err(format!(
            "endpoint {}: expected an http:// or https:// URL",
            shown_url(url)
        )),
    }
}

/// Merges the `k=v,…` headers of variable `var` over `headers` (a name
/// already there, in any case, takes the new value). A header that cannot
/// be sent is skipped with a note naming it, never its value.
fn merge_headers(
    headers: &mut Vec<(String, String)>,
    text: &str,
    var: &str,
    notes: &mut Vec<String>,
) {
    for (k, v) in parse_pairs(text, var, notes) {
        if let Err(why) = crate::config::check_header(&k, &v) {
            notes.push(format!("{var}: header {k:?}: {why}; ignored"));
            continue;
        }
        headers.retain(|(name, _)| !name.eq_ignore_ascii_case(&k));
        headers.push((k, v));
    }
}

/// `url` as logs may show it: without a `user:password@` part, and with
/// its query and fragment (`?api_key=…`, often a credential) replaced by
/// `[redacted]`.
pub fn shown_url(url: &str) -> String {
    let (url, hidden) = match url.find(['?', '#']) {
        Some(i) => (&url[..i], &url[i..i + 1]),
        None => (url, ""),
    };
    let tail = if hidden.is_empty() {
        String::new()
    } else {
        format!("{hidden}[redacted]")
    };
    let Some((scheme, rest)) = url.split_once("://") else {
        return format!("{url}{tail}");
    };
    let host_end = rest.find('/').unwrap_or(rest.len());
    match rest[..host_end].rfind('@') {
        Some(at) => format!("{scheme}://{}{tail}", &rest[at + 1..]),
        None => format!("{url}{tail}"),
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

    /// The `traceparent` value naming this span (no allocation).
    pub fn traceparent(&self) -> Traceparent {
        let mut b = *b"00-00000000000000000000000000000000-0000000000000000-00";
        write_hex(&mut b[3..35], &self.trace_id);
        write_hex(&mut b[36..52], &self.span_id);
        b[54] = b'0' + u8::from(self.sampled);
        Traceparent(b)
    }
}

/// A `traceparent` header value, kept inline.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Traceparent([u8; 55]);

impl std::ops::Deref for Traceparent {
    type Target = str;
    fn deref(&self) -> &str {
        // Only ever written with ASCII digits, letters and dashes.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl std::fmt::Display for Traceparent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self)
    }
}

impl std::fmt::Debug for Traceparent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

impl PartialEq<&str> for Traceparent {
    fn eq(&self, other: &&str) -> bool {
        **self == **other
    }
}

impl PartialEq<String> for Traceparent {
    fn eq(&self, other: &String) -> bool {
        **self == **other
    }
}

/// `n` in decimal, written at the end of `buf` (no allocation: an id is
/// written into every attempt's line).
pub(crate) fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Lowercase hex of `bytes` into `out` (twice as long).
fn write_hex(out: &mut [u8], bytes: &[u8]) {
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = HEX_DIGITS[usize::from(b >> 4)];
        pair[1] = HEX_DIGITS[usize::from(b & 15)];
    }
}

#[cfg(test)]
fn hex(bytes: &[u8]) -> String {
    let mut out = vec![0u8; 2 * bytes.len()];
    write_hex(&mut out, bytes);
    String::from_utf8(out).unwrap_or_default()
}

/// How a call ended, for its span and the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallEnd {
    /// `ok`, `error` (the server's error or `isError`), `failed` (the
    /// proxy's error), `cancelled`.
    pub outcome: &'static str,
    /// The proxy's reason (`timeout`, `circuit_open`, …) or `server_error`.
    pub reason: Option<&'static str>,
    /// Answered by the proxy itself: `cache`, `dedup`, `stale`.
    pub source: Option<&'static str>,
}

impl CallEnd {
    /// The server's final answer: a result, or its error.
    pub fn answered(error: bool) -> CallEnd {
        CallEnd {
            outcome: if error { "error" } else { "ok" },
            reason: error.then_some("server_error"),
            source: None,
        }
    }

    /// The proxy's error, for `reason`.
    pub fn failed(reason: &'static str) -> CallEnd {
        CallEnd {
            outcome: "failed",
            reason: Some(reason),
            source: None,
        }
    }

    /// A result the proxy held (`source`: `cache`, `dedup`), answered at
    /// once.
    pub fn from_proxy(source: &'static str) -> CallEnd {
        CallEnd {
            outcome: "ok",
            reason: None,
            source: Some(source),
        }
    }

    /// A stale cached result instead of an error.
    pub fn stale() -> CallEnd {
        CallEnd {
            outcome: "ok",
            reason: None,
            source: Some("stale"),
        }
    }

    /// Every client waiting for it cancelled.
    pub fn cancelled() -> CallEnd {
        CallEnd {
            outcome: "cancelled",
            reason: None,
            source: None,
        }
    }
}

/// How often changed counters are exported.
pub const METRICS_INTERVAL: Duration = Duration::from_secs(10);

/// Where and how a `traceparent` goes into a call's params: decided once,
/// where the call is read (`inbound.rs`, from the members read there: no
/// walk of its own), and kept with the call for every attempt made with
/// export on, which then parses nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceparentEdit {
    /// Write the member at byte `at` of the params: inside `_meta` (first)
    /// or, with `meta`, in a new `_meta` first in the params; `comma` when
    /// a member follows.
    Insert { at: usize, meta: bool, comma: bool },
    /// The object is written again from its members, as
    /// `RawObject::to_json_with_meta` writes it: a `traceparent` to
    /// replace, a `_meta` that is not an object, a name of the params or
    /// of `_meta` written with an escape.
    Rebuild(Box<MemberRanges>),
}

/// The members a [`TraceparentEdit::Rebuild`] writes: names unescaped,
/// values as byte ranges of the params.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberRanges {
    params: Vec<(Box<str>, Range<usize>)>,
    /// `_meta`'s, when it is an object.
    meta: Option<Vec<(Box<str>, Range<usize>)>>,
}

impl TraceparentEdit {
    /// The edit for params `text`, read as `params` (whose values and
    /// `_meta`'s are slices of `text`); `None` when they are not an object.
    pub fn of(text: &str, params: &Params<'_>) -> Option<TraceparentEdit> {
        let body = text.trim_start().strip_prefix('{')?;
        let meta = params.get("_meta");
        let inner = params.inner.as_ref();
        let rebuild = escaped(&params.members)
            || inner.is_some_and(|m| escaped(&m.members) || m.get("traceparent").is_some())
            || meta.is_some_and(|m| !m.starts_with('{'));
        if rebuild {
            return MemberRanges::of(text, params).map(|m| TraceparentEdit::Rebuild(Box::new(m)));
        }
        let at = match meta {
            Some(m) => offset(text, m)?.start + 1,
            None => text.len() - body.len(),
        };
        let comma = !text[at..].trim_start().starts_with('}');
        Some(TraceparentEdit::Insert {
            at,
            meta: meta.is_none(),
            comma,
        })
    }

    /// The text an `Insert` writes.
    fn pieces(meta: bool, comma: bool, traceparent: &str) -> [&str; 5] {
        [
            if meta {
                "\"_meta\":{\"traceparent\":\""
            } else {
                "\"traceparent\":\""
            },
            traceparent,
            "\"",
            if meta { "}" } else { "" },
            if comma { "," } else { "" },
        ]
    }
}

/// Whether a name of `members` was written with an escape (the only
/// names read into an owned string).
fn escaped<T>(members: &[(Cow<'_, str>, T)]) -> bool {
    members.iter().any(|(k, _)| matches!(k, Cow::Owned(_)))
}

/// Where `value`, a slice of `text`, is in it.
fn offset(text: &str, value: &str) -> Option<Range<usize>> {
    let start = (value.as_ptr() as usize).checked_sub(text.as_ptr() as usize)?;
    let end = start + value.len();
    (end <= text.len()).then_some(start..end)
}

impl MemberRanges {
    fn of(text: &str, params: &Params<'_>) -> Option<MemberRanges> {
        let owned = |k: &Cow<'_, str>, v: &str| Some((Box::from(k.as_ref()), offset(text, v)?));
        let meta = match params.get("_meta") {
            Some(m) if m.starts_with('{') => Some(params.inner.as_ref()?),
            _ => None,
        };
        Some(MemberRanges {
            params: params
                .members
                .iter()
                .map(|(k, v)| owned(k, v))
                .collect::<Option<_>>()?,
            meta: match meta {
                Some(m) => Some(
                    m.members
                        .iter()
                        .map(|(k, v)| owned(k, v))
                        .collect::<Option<_>>()?,
                ),
                None => None,
            },
        })
    }

    /// The params `text` (those the members were read from) with
    /// `params._meta.traceparent` set to `traceparent`, first in `_meta`
    /// (added first when absent or not an object), the rest in compact
    /// JSON, names escaped anew: what `RawObject::to_json_with_meta`
    /// writes, from the ranges kept instead of a parse.
    fn write(&self, text: &str, traceparent: &str) -> Option<String> {
        fn pairs<'p>(
            ranges: &'p [(Box<str>, Range<usize>)],
            text: &'p str,
        ) -> Option<Vec<(&'p str, &'p str)>> {
            ranges
                .iter()
                .map(|(name, r)| Some((&**name, text.get(r.clone())?)))
                .collect()
        }
        let meta = match &self.meta {
            Some(meta) => Some(pairs(meta, text)?),
            None => None,
        };
        let member = TraceparentEdit::pieces(false, false, traceparent).concat();
        let params = pairs(&self.params, text)?;
        Some(jsonrpc::write_with_meta(
            &params,
            meta.as_deref(),
            "traceparent",
            &member,
        ))
    }
}

/// The line of attempt `down` of `request`: its id replaced, and
/// `params._meta.traceparent` set to `traceparent` (replacing one the
/// client sent, first in `_meta`, which is added first when absent;
/// everything else as it was) by `edit`, decided where the call was read.
/// Without a `traceparent` to replace (the common case) the member is
/// written into the text where it belongs, in the one buffer of the line.
/// Without `edit` (the params forwarded are not the client's: its
/// `_idempotency_key` was removed) it is decided here, which parses them.
/// `None` when the params are not an object.
pub fn attempt_line(
    request: &Message,
    down: u64,
    traceparent: &str,
    edit: Option<&TraceparentEdit>,
) -> Option<Vec<u8>> {
    let params = request.params()?;
    let mut digits = [0u8; 20];
    let id = std::str::from_utf8(decimal(down, &mut digits)).unwrap_or_default();
    let planned;
    let edit = match edit {
        Some(edit) => edit,
        None => {
            count_parse();
            planned = TraceparentEdit::of(params, &Params::parse(params, "_meta")?)?;
            &planned
        }
    };
    match edit {
        TraceparentEdit::Insert { at, meta, comma } => {
            let pieces = TraceparentEdit::pieces(*meta, *comma, traceparent);
            request.line_with_id_and_insert(id, *at, &pieces)
        }
        TraceparentEdit::Rebuild(members) => {
            let params = members.write(params, traceparent)?;
            Some(request.with_params(&params)?.line_with_id(id))
        }
    }
}

#[cfg(test)]
thread_local! {
    static PARSED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Counts a parse of an attempt's params on this thread (tests only: see
/// [`params_parsed`]).
fn count_parse() {
    #[cfg(test)]
    PARSED.with(|p| p.set(p.get() + 1));
}

/// How many times attempts' params were parsed on this thread so far.
#[cfg(test)]
pub fn params_parsed() -> usize {
    PARSED.with(std::cell::Cell::get)
}

#[cfg(test)]
mod tests;
