//! OTLP/JSON encoding (the protobuf JSON mapping the OTLP/HTTP spec asks
//! for): ids as lowercase hex, 64-bit integers and times as strings, enums
//! as numbers, attribute values as `AnyValue` objects.

use serde_json::{json, Value as Json};

use super::{hex, Attrs, Histogram, Metrics, Span, Value, LATENCY_BOUNDS};

const SCOPE: &str = "mcp-retry";

fn any_value(v: &Value) -> Json {
    match v {
        Value::Str(s) => json!({ "stringValue": s }),
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

fn span(s: &Span) -> Json {
    let mut o = json!({
        "traceId": hex(&s.ctx.trace_id),
        "spanId": hex(&s.ctx.span_id),
        "name": s.name,
        "kind": s.kind as u8,
        "startTimeUnixNano": s.start.to_string(),
        "endTimeUnixNano": s.end.to_string(),
        "attributes": attributes(&s.attrs),
        "events": s.events.iter().map(|e| json!({
            "timeUnixNano": e.time.to_string(),
            "name": e.name,
            "attributes": attributes(&e.attrs),
        })).collect::<Vec<_>>(),
        "status": match &s.error {
            Some(m) => json!({ "code": 2, "message": m }),
            None => json!({}),
        },
        "flags": 256 | u32::from(s.ctx.sampled),
    });
    if let Some(p) = &s.parent {
        // The parent may live in another process (the client's span).
        o["parentSpanId"] = json!(hex(p));
        o["flags"] = json!(256 | 512 | u32::from(s.ctx.sampled));
    }
    o
}

/// An `ExportTraceServiceRequest`.
pub fn traces(resource: &[(String, String)], spans: &[Span]) -> String {
    json!({
        "resourceSpans": [{
            "resource": { "attributes": string_attributes(resource) },
            "scopeSpans": [{
                "scope": scope(),
                "spans": spans.iter().map(span).collect::<Vec<_>>(),
            }],
        }],
    })
    .to_string()
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
                        ("mcp_retry.server", server.into()),
                        ("gen_ai.tool.name", tool.as_str().into()),
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
                    ("mcp_retry.server", server.into()),
                    ("gen_ai.tool.name", tool.as_str().into()),
                    ("error.type", reason.as_str().into()),
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
                    ("mcp_retry.server", server.into()),
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
        vec![(vec![("mcp_retry.server", server.into())], m.restarts)],
        start,
        now,
    ));
    let latency = m
        .latency
        .iter()
        .map(|(tool, h)| {
            (
                vec![
                    ("mcp_retry.server", server.into()),
                    ("gen_ai.tool.name", tool.as_str().into()),
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
