//! OTLP/JSON encoding (the protobuf JSON mapping the OTLP/HTTP spec asks
//! for): ids as lowercase hex, 64-bit integers and times as strings, enums
//! as numbers, attribute values as `AnyValue` objects.

#![forbid(unsafe_code)]

use serde_json::{json, Value as Json};

use super::{hex, Attrs, Histogram, Metrics, Span, Value, LATENCY_BOUNDS};

const SCOPE: &str = "mcp-retry";

fn any_value(v: &Value) -> Json {
    match v {
        Value::Str(s) => json!({ "stringValue": s }),
        Value::Static(s) => json!({ "stringValue": s }),
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

/// Appends `s` as a JSON string.
fn push_string(out: &mut String, s: &str) {
    out.push_str(&crate::jsonrpc::json_string(s));
}

/// Appends `[{"key":…,"value":{…}},…]`.
fn push_attributes(out: &mut String, attrs: &Attrs) {
    out.push('[');
    for (i, (k, v)) in attrs.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"key\":");
        push_string(out, k);
        out.push_str(",\"value\":");
        match v {
            Value::Str(s) => {
                out.push_str("{\"stringValue\":");
                push_string(out, s);
            }
            Value::Static(s) => {
                out.push_str("{\"stringValue\":");
                push_string(out, s);
            }
            Value::Int(n) => out.push_str(&format!("{{\"intValue\":\"{n}\"")),
            Value::Bool(b) => out.push_str(&format!("{{\"boolValue\":{b}")),
        }
        out.push_str("}}");
    }
    out.push(']');
}

/// Appends one span (written by hand: the exporter encodes thousands a
/// second under load, and a `serde_json::Value` tree costs several times
/// more).
fn push_span(out: &mut String, s: &Span) {
    out.push_str("{\"traceId\":\"");
    out.push_str(&hex(&s.ctx.trace_id));
    out.push_str("\",\"spanId\":\"");
    out.push_str(&hex(&s.ctx.span_id));
    out.push('"');
    // The W3C flags, and the OTLP bits saying whether the parent is known
    // to be in another process (a client's span: yes).
    let mut flags = 256 | u32::from(s.ctx.sampled);
    if let Some(p) = &s.parent {
        out.push_str(",\"parentSpanId\":\"");
        out.push_str(&hex(p));
        out.push('"');
        flags |= 512;
    }
    out.push_str(&format!(",\"flags\":{flags},\"name\":"));
    push_string(out, &s.name);
    out.push_str(&format!(
        ",\"kind\":{},\"startTimeUnixNano\":\"{}\",\"endTimeUnixNano\":\"{}\",\"attributes\":",
        s.kind as u8, s.start, s.end
    ));
    push_attributes(out, &s.attrs);
    out.push_str(",\"events\":[");
    for (i, e) in s.events.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&format!("{{\"timeUnixNano\":\"{}\",\"name\":", e.time));
        push_string(out, e.name);
        out.push_str(",\"attributes\":");
        push_attributes(out, &e.attrs);
        out.push('}');
    }
    out.push_str("],\"status\":");
    match &s.error {
        Some(m) => {
            out.push_str("{\"code\":2,\"message\":");
            push_string(out, m);
            out.push('}');
        }
        None => out.push_str("{}"),
    }
    out.push('}');
}

/// An `ExportTraceServiceRequest`.
pub fn traces(resource: &[(String, String)], spans: &[Span]) -> String {
    let mut out = String::with_capacity(512 + 1024 * spans.len());
    out.push_str("{\"resourceSpans\":[{\"resource\":{\"attributes\":");
    out.push_str(&string_attributes(resource).to_string());
    out.push_str("},\"scopeSpans\":[{\"scope\":");
    out.push_str(&scope().to_string());
    out.push_str(",\"spans\":[");
    for (i, s) in spans.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_span(&mut out, s);
    }
    out.push_str("]}]}]}");
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

/// An `ExportMetricsServiceRequest` with every counter since `start`.
pub fn metrics(
    resource: &[(String, String)],
    server: &str,
    m: &Metrics,
    start: u64,
    now: u64,
) -> String {
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
    json!({
        "resourceMetrics": [{
            "resource": { "attributes": string_attributes(resource) },
            "scopeMetrics": [{ "scope": scope(), "metrics": list }],
        }],
    })
    .to_string()
}
