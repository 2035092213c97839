//! OTLP/JSON encoding (the protobuf JSON mapping the OTLP/HTTP spec asks
//! for): ids as lowercase hex, 64-bit integers and times as strings, enums
//! as numbers, attribute values as `AnyValue` objects. Runs on the
//! exporter thread only.

#![forbid(unsafe_code)]

use serde_json::{json, Value as Json};

use super::record::{Attrs, Histogram, Metrics, Span, Value, LATENCY_BOUNDS};
use super::{decimal, write_hex};

const SCOPE: &str = "mcp-retry";

fn any_value(v: &Value) -> Json {
    match v {
        Value::Str(_) | Value::Static(_) | Value::Shared(_) => {
            json!({ "stringValue": v.as_str() })
        }
        Value::Int(n) => json!({ "intValue": n.to_string() }),
        Value::Bool(b) => json!({ "boolValue": b }),
    }
}

fn attributes(attrs: &Attrs) -> Json {
    Json::Array(
        attrs
            .iter()
            .map(|(k, v)| json!({ "key": k, "value": any_value(v) }))
            .collect(),
    )
}

fn string_attributes(attrs: &[(String, String)]) -> Json {
    Json::Array(
        attrs
            .iter()
            .map(|(k, v)| json!({ "key": k, "value": { "stringValue": v } }))
            .collect(),
    )
}

fn scope() -> Json {
    json!({ "name": SCOPE, "version": env!("CARGO_PKG_VERSION") })
}

/// Whether byte `b` must be escaped in a JSON string.
fn needs_escape(b: u8) -> bool {
    b < b' ' || b == b'"' || b == b'\\'
}

/// Appends `s` as a JSON string.
fn push_string(out: &mut Vec<u8>, s: &str) {
    let b = s.as_bytes();
    out.push(b'"');
    // Without a branch per byte, so that it vectorises: most strings
    // need no escape and are copied whole.
    if !b.iter().fold(false, |any, &c| any | needs_escape(c)) {
        out.extend_from_slice(b);
        out.push(b'"');
        return;
    }
    for &c in b {
        match c {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            c if c < b' ' => {
                out.extend_from_slice(b"\\u00");
                push_hex(out, &[c]);
            }
            c => out.push(c),
        }
    }
    out.push(b'"');
}

/// Appends one of our own names (attribute keys, event names: ASCII that
/// needs no escape) as a JSON string.
fn push_name(out: &mut Vec<u8>, name: &'static str) {
    debug_assert!(!name.bytes().any(needs_escape));
    out.push(b'"');
    out.extend_from_slice(name.as_bytes());
    out.push(b'"');
}

/// Appends `n` in decimal.
fn push_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(decimal(n, &mut [0; 20]));
}

/// Appends `n` in decimal.
fn push_i64(out: &mut Vec<u8>, n: i64) {
    if n < 0 {
        out.push(b'-');
    }
    push_u64(out, n.unsigned_abs());
}

/// Appends `[{"key":…,"value":{…}},…]`.
fn push_attributes(out: &mut Vec<u8>, attrs: &Attrs) {
    out.push(b'[');
    for (i, (k, v)) in attrs.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"key\":");
        push_name(out, k);
        out.extend_from_slice(b",\"value\":");
        match v {
            Value::Int(n) => {
                out.extend_from_slice(b"{\"intValue\":\"");
                push_i64(out, *n);
                out.push(b'"');
            }
            Value::Bool(b) => out.extend_from_slice(if *b {
                b"{\"boolValue\":true"
            } else {
                b"{\"boolValue\":false"
            }),
            s => {
                out.extend_from_slice(b"{\"stringValue\":");
                push_string(out, s.as_str().unwrap_or_default());
            }
        }
        out.extend_from_slice(b"}}");
    }
    out.push(b']');
}

/// Appends one span (written by hand: the exporter encodes thousands a
/// second under load, and a `serde_json::Value` tree costs several times
/// more).
fn push_span(out: &mut Vec<u8>, s: &Span) {
    out.extend_from_slice(b"{\"traceId\":\"");
    push_hex(out, &s.ctx.trace_id);
    out.extend_from_slice(b"\",\"spanId\":\"");
    push_hex(out, &s.ctx.span_id);
    out.push(b'"');
    // The W3C flags, and the OTLP bits saying whether the parent is known
    // to be in another process (a client's span: yes).
    let mut flags = 256 | u64::from(s.ctx.sampled);
    if let Some(p) = &s.parent {
        out.extend_from_slice(b",\"parentSpanId\":\"");
        push_hex(out, p);
        out.push(b'"');
        flags |= 512;
    }
    out.extend_from_slice(b",\"flags\":");
    push_u64(out, flags);
    out.extend_from_slice(b",\"name\":");
    push_string(out, &s.name);
    out.extend_from_slice(b",\"kind\":");
    push_u64(out, s.kind as u64);
    out.extend_from_slice(b",\"startTimeUnixNano\":\"");
    push_u64(out, s.start);
    out.extend_from_slice(b"\",\"endTimeUnixNano\":\"");
    push_u64(out, s.end);
    out.extend_from_slice(b"\",\"attributes\":");
    push_attributes(out, &s.attrs);
    out.extend_from_slice(b",\"events\":[");
    for (i, e) in s.events.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"timeUnixNano\":\"");
        push_u64(out, e.time);
        out.extend_from_slice(b"\",\"name\":");
        push_name(out, e.name);
        out.extend_from_slice(b",\"attributes\":");
        push_attributes(out, &e.attrs);
        out.push(b'}');
    }
    out.extend_from_slice(b"],\"status\":");
    match &s.error {
        Some(m) => {
            out.extend_from_slice(b"{\"code\":2,\"message\":");
            push_string(out, m);
            out.push(b'}');
        }
        None => out.extend_from_slice(b"{}"),
    }
    out.push(b'}');
}

/// Appends the lowercase hex of `bytes`.
fn push_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    let start = out.len();
    out.resize(start + 2 * bytes.len(), 0);
    write_hex(&mut out[start..], bytes);
}

/// The resource's attributes as JSON, made once per session.
pub fn resource(attrs: &[(String, String)]) -> String {
    string_attributes(attrs).to_string()
}

/// An `ExportTraceServiceRequest` (UTF-8 JSON); `resource` from
/// [`resource`].
pub fn traces(resource: &str, spans: &[Span]) -> Vec<u8> {
    let mut out = Vec::with_capacity(512 + 1024 * spans.len());
    out.extend_from_slice(b"{\"resourceSpans\":[{\"resource\":{\"attributes\":");
    out.extend_from_slice(resource.as_bytes());
    out.extend_from_slice(b"},\"scopeSpans\":[{\"scope\":");
    out.extend_from_slice(scope().to_string().as_bytes());
    out.extend_from_slice(b",\"spans\":[");
    for (i, s) in spans.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_span(&mut out, s);
    }
    out.extend_from_slice(b"]}]}]}");
    out
}

/// A monotonic cumulative sum metric.
fn sum(
    name: &str,
    unit: &str,
    description: &str,
    points: Vec<(Attrs, u64)>,
    start: u64,
    now: u64,
) -> Json {
    json!({
        "name": name,
        "unit": unit,
        "description": description,
        "sum": {
            "aggregationTemporality": 2,
            "isMonotonic": true,
            "dataPoints": points.iter().map(|(a, n)| json!({
                "attributes": attributes(a),
                "startTimeUnixNano": start.to_string(),
                "timeUnixNano": now.to_string(),
                "asInt": n.to_string(),
            })).collect::<Vec<_>>(),
        },
    })
}

fn histogram(name: &str, points: Vec<(Attrs, &Histogram)>, start: u64, now: u64) -> Json {
    json!({
        "name": name,
        "unit": "s",
        "description": "How long tools/call took, from the client's request to its answer, retries included",
        "histogram": {
            "aggregationTemporality": 2,
            "dataPoints": points.iter().map(|(a, h)| json!({
                "attributes": attributes(a),
                "startTimeUnixNano": start.to_string(),
                "timeUnixNano": now.to_string(),
                "count": h.count.to_string(),
                "sum": h.sum,
                "bucketCounts": h.counts.iter().map(u64::to_string).collect::<Vec<_>>(),
                "explicitBounds": LATENCY_BOUNDS,
            })).collect::<Vec<_>>(),
        },
    })
}

/// An `ExportMetricsServiceRequest` with every counter since `start`;
/// `resource` from [`resource`].
pub fn metrics(resource: &str, server: &str, m: &Metrics, start: u64, now: u64) -> String {
    let by_tool = |map: &std::collections::BTreeMap<String, u64>| -> Vec<(Attrs, u64)> {
        map.iter()
            .map(|(tool, n)| {
                (
                    vec![
                        ("mcp_retry.server", server.to_owned().into()),
                        ("gen_ai.tool.name", tool.clone().into()),
                    ],
                    *n,
                )
            })
            .collect()
    };
    let mut list = vec![
        sum(
            "mcp_retry.calls",
            "{call}",
            "tools/call requests from the client",
            by_tool(&m.calls),
            start,
            now,
        ),
        sum(
            "mcp_retry.attempts",
            "{attempt}",
            "tools/call attempts sent to the server",
            by_tool(&m.attempts),
            start,
            now,
        ),
        sum(
            "mcp_retry.retries",
            "{attempt}",
            "attempts after a call's first",
            by_tool(&m.retries),
            start,
            now,
        ),
        sum(
            "mcp_retry.cache.hits",
            "{call}",
            "calls answered from the cache",
            by_tool(&m.cache_hits),
            start,
            now,
        ),
        sum(
            "mcp_retry.dedup.hits",
            "{call}",
            "calls that joined or replayed an identical call",
            by_tool(&m.dedup_hits),
            start,
            now,
        ),
    ];
    let failures = m
        .failures
        .iter()
        .map(|((tool, reason), n)| {
            (
                vec![
                    ("mcp_retry.server", server.to_owned().into()),
                    ("gen_ai.tool.name", tool.clone().into()),
                    ("error.type", reason.clone().into()),
                ],
                *n,
            )
        })
        .collect();
    list.push(sum(
        "mcp_retry.failures",
        "{call}",
        "calls answered with an error, by reason",
        failures,
        start,
        now,
    ));
    let breaker = m
        .breaker
        .iter()
        .map(|(t, n)| {
            (
                vec![
                    ("mcp_retry.server", server.to_owned().into()),
                    ("mcp_retry.breaker.transition", (*t).into()),
                ],
                *n,
            )
        })
        .collect();
    list.push(sum(
        "mcp_retry.breaker.transitions",
        "{transition}",
        "circuit breaker state changes",
        breaker,
        start,
        now,
    ));
    list.push(sum(
        "mcp_retry.restarts",
        "{restart}",
        "times the server was started again",
        vec![(
            vec![("mcp_retry.server", server.to_owned().into())],
            m.restarts,
        )],
        start,
        now,
    ));
    let latency = m
        .latency
        .iter()
        .map(|(tool, h)| {
            (
                vec![
                    ("mcp_retry.server", server.to_owned().into()),
                    ("gen_ai.tool.name", tool.clone().into()),
                ],
                h,
            )
        })
        .collect();
    list.push(histogram("mcp_retry.call.duration", latency, start, now));
    // Metrics with no data point yet are left out.
    list.retain(|metric| {
        let kind = if metric.get("sum").is_some() {
            "sum"
        } else {
            "histogram"
        };
        metric[kind]["dataPoints"]
            .as_array()
            .is_some_and(|p| !p.is_empty())
    });
    format!(
        "{{\"resourceMetrics\":[{{\"resource\":{{\"attributes\":{resource}}},\"scopeMetrics\":[{{\"scope\":{},\"metrics\":{}}}]}}]}}",
        scope(),
        Json::Array(list)
    )
}
