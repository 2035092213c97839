//! OTLP/JSON encoding (the protobuf JSON mapping the OTLP/HTTP spec asks
//! for): ids as lowercase hex, 64-bit integers and times as strings, enums
//! as numbers, attribute values as `AnyValue` objects. The messages are
//! serde-derived structs over the records (borrowing, not copying, their
//! strings and lists), written with `serde_json::to_writer`. Runs on the
//! exporter thread only.

#![forbid(unsafe_code)]

use std::fmt::{self, Display};

use serde::ser::{Serialize, Serializer};
use serde::Serialize as DeriveSerialize;

use super::record::{Attrs, Histogram, Metrics, Span, SpanEvent, Value, LATENCY_BOUNDS};

const SCOPE: Scope = Scope {
    name: "mcp-retry",
    version: env!("CARGO_PKG_VERSION"),
};

/// OTLP `AggregationTemporality` CUMULATIVE.
const CUMULATIVE: u8 = 2;
/// OTLP `StatusCode` ERROR.
const STATUS_ERROR: u8 = 2;

/// A value written as a JSON string through its `Display` (the 64-bit
/// integers of the JSON mapping).
struct AsString<T>(T);

impl<T: Display> Serialize for AsString<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

/// Bytes written as a lowercase hex string (trace and span ids).
struct Hex<'a>(&'a [u8]);

impl Display for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl Serialize for Hex<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A list written from an iterator made anew each time (no `Vec`).
struct Seq<F>(F);

impl<F, I> Serialize for Seq<F>
where
    F: Fn() -> I,
    I: Iterator,
    I::Item: Serialize,
{
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq((self.0)())
    }
}

/// `AnyValue`: one member named by the value's type.
#[derive(DeriveSerialize)]
enum AnyValue<'a> {
    #[serde(rename = "stringValue")]
    Str(&'a str),
    #[serde(rename = "intValue")]
    Int(AsString<i64>),
    #[serde(rename = "boolValue")]
    Bool(bool),
}

impl<'a> From<&'a Value> for AnyValue<'a> {
    fn from(v: &'a Value) -> AnyValue<'a> {
        match v {
            Value::Int(n) => AnyValue::Int(AsString(*n)),
            Value::Bool(b) => AnyValue::Bool(*b),
            s => AnyValue::Str(s.as_str().unwrap_or_default()),
        }
    }
}

#[derive(DeriveSerialize)]
struct KeyValue<'a> {
    key: &'a str,
    value: AnyValue<'a>,
}

/// `[{"key":…,"value":{…}},…]`.
fn attributes(attrs: &Attrs) -> impl Serialize + '_ {
    Seq(|| {
        attrs.iter().map(|(k, v)| KeyValue {
            key: k,
            value: v.into(),
        })
    })
}

/// The resource's attributes (strings all).
fn string_attributes(attrs: &[(String, String)]) -> impl Serialize + '_ {
    Seq(|| {
        attrs.iter().map(|(k, v)| KeyValue {
            key: k,
            value: AnyValue::Str(v),
        })
    })
}

#[derive(DeriveSerialize)]
struct Resource<R> {
    attributes: R,
}

#[derive(DeriveSerialize, Clone, Copy)]
struct Scope {
    name: &'static str,
    version: &'static str,
}

#[derive(DeriveSerialize)]
#[serde(rename_all = "camelCase")]
struct Event<A> {
    time_unix_nano: AsString<u64>,
    name: &'static str,
    attributes: A,
}

fn event(e: &SpanEvent) -> Event<impl Serialize + '_> {
    Event {
        time_unix_nano: AsString(e.time),
        name: e.name,
        attributes: attributes(&e.attrs),
    }
}

/// `{}` (unset), or ERROR with its message.
#[derive(DeriveSerialize)]
struct Status<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<&'a str>,
}

#[derive(DeriveSerialize)]
#[serde(rename_all = "camelCase")]
struct SpanJson<'a, A, E> {
    trace_id: Hex<'a>,
    span_id: Hex<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parent_span_id: Option<Hex<'a>>,
    flags: u32,
    name: &'a str,
    kind: u8,
    start_time_unix_nano: AsString<u64>,
    end_time_unix_nano: AsString<u64>,
    attributes: A,
    events: E,
    status: Status<'a>,
}

fn span(s: &Span) -> SpanJson<'_, impl Serialize + '_, impl Serialize + '_> {
    // The W3C flags, and the OTLP bits saying whether the parent is known
    // to be in another process (a client's span: yes).
    let flags = 256 | u32::from(s.ctx.sampled) | if s.parent.is_some() { 512 } else { 0 };
    SpanJson {
        trace_id: Hex(&s.ctx.trace_id),
        span_id: Hex(&s.ctx.span_id),
        parent_span_id: s.parent.as_ref().map(|p| Hex(p)),
        flags,
        name: &s.name,
        kind: s.kind as u8,
        start_time_unix_nano: AsString(s.start),
        end_time_unix_nano: AsString(s.end),
        attributes: attributes(&s.attrs),
        events: Seq(|| s.events.iter().map(event)),
        status: Status {
            code: s.error.is_some().then_some(STATUS_ERROR),
            message: s.error.as_deref(),
        },
    }
}

#[derive(DeriveSerialize)]
#[serde(rename_all = "camelCase")]
struct ScopeSpans<S> {
    scope: Scope,
    spans: S,
}

#[derive(DeriveSerialize)]
#[serde(rename_all = "camelCase")]
struct ResourceSpans<R, S> {
    resource: Resource<R>,
    scope_spans: [ScopeSpans<S>; 1],
}

#[derive(DeriveSerialize)]
#[serde(rename_all = "camelCase")]
struct TracesRequest<R, S> {
    resource_spans: [ResourceSpans<R, S>; 1],
}

/// Writes `message` as JSON; it only fails on a non-finite float, which
/// no record holds, and then the body is empty.
fn encode(message: &impl Serialize, capacity: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(capacity);
    if serde_json::to_writer(&mut out, message).is_err() {
        out.clear();
    }
    out
}

/// An `ExportTraceServiceRequest` (UTF-8 JSON) of `spans`, from a process
/// with these resource attributes.
pub fn traces(resource: &[(String, String)], spans: &[Span]) -> Vec<u8> {
    let request = TracesRequest {
        resource_spans: [ResourceSpans {
            resource: Resource {
                attributes: string_attributes(resource),
            },
            scope_spans: [ScopeSpans {
                scope: SCOPE,
                spans: Seq(|| spans.iter().map(span)),
            }],
        }],
    };
    encode(&request, 512 + 1024 * spans.len())
}

/// Points of a metric: each with its attributes, and the value.
type Points<'a, T> = Vec<(Attrs, &'a T)>;

/// The data points of a sum, with the times they all share.
struct NumberPoints<'a> {
    points: &'a [(Attrs, &'a u64)],
    start: u64,
    now: u64,
}

#[derive(DeriveSerialize)]
#[serde(rename_all = "camelCase")]
struct NumberPoint<A> {
    attributes: A,
    start_time_unix_nano: AsString<u64>,
    time_unix_nano: AsString<u64>,
    as_int: AsString<u64>,
}

impl Serialize for NumberPoints<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.points.iter().map(|(attrs, n)| NumberPoint {
            attributes: attributes(attrs),
            start_time_unix_nano: AsString(self.start),
            time_unix_nano: AsString(self.now),
            as_int: AsString(**n),
        }))
    }
}

/// The data points of a histogram, with the times they all share.
struct HistogramPoints<'a> {
    points: &'a [(Attrs, &'a Histogram)],
    start: u64,
    now: u64,
}

#[derive(DeriveSerialize)]
#[serde(rename_all = "camelCase")]
struct HistogramPoint<'a, A, B> {
    attributes: A,
    start_time_unix_nano: AsString<u64>,
    time_unix_nano: AsString<u64>,
    count: AsString<u64>,
    sum: f64,
    bucket_counts: B,
    explicit_bounds: &'a [f64],
}

impl Serialize for HistogramPoints<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.points.iter().map(|(attrs, h)| HistogramPoint {
            attributes: attributes(attrs),
            start_time_unix_nano: AsString(self.start),
            time_unix_nano: AsString(self.now),
            count: AsString(h.count),
            sum: h.sum,
            bucket_counts: Seq(|| h.counts.iter().map(AsString)),
            explicit_bounds: &LATENCY_BOUNDS,
        }))
    }
}

#[derive(DeriveSerialize)]
#[serde(rename_all = "camelCase")]
struct Sum<'a> {
    aggregation_temporality: u8,
    is_monotonic: bool,
    data_points: NumberPoints<'a>,
}

/// A gauge: the value now (OTLP ignores its points' start time).
#[derive(DeriveSerialize)]
#[serde(rename_all = "camelCase")]
struct Gauge<'a> {
    data_points: NumberPoints<'a>,
}

#[derive(DeriveSerialize)]
#[serde(rename_all = "camelCase")]
struct HistogramJson<'a> {
    aggregation_temporality: u8,
    data_points: HistogramPoints<'a>,
}

/// A metric: a sum, a gauge or a histogram.
#[derive(DeriveSerialize)]
struct Metric<'a> {
    name: &'static str,
    unit: &'static str,
    description: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    sum: Option<Sum<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gauge: Option<Gauge<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    histogram: Option<HistogramJson<'a>>,
}

#[derive(DeriveSerialize)]
#[serde(rename_all = "camelCase")]
struct ScopeMetrics<'a> {
    scope: Scope,
    metrics: Vec<Metric<'a>>,
}

#[derive(DeriveSerialize)]
#[serde(rename_all = "camelCase")]
struct ResourceMetrics<'a, R> {
    resource: Resource<R>,
    scope_metrics: [ScopeMetrics<'a>; 1],
}

#[derive(DeriveSerialize)]
#[serde(rename_all = "camelCase")]
struct MetricsRequest<'a, R> {
    resource_metrics: [ResourceMetrics<'a, R>; 1],
}

/// An `ExportMetricsServiceRequest` with every counter since `start`,
/// from a process with these resource attributes.
pub fn metrics<'m>(
    resource: &[(String, String)],
    server: &str,
    m: &'m Metrics,
    start: u64,
    now: u64,
) -> Vec<u8> {
    let server_attr = || ("mcp_retry.server", Value::from(server.to_owned()));
    let tool_attrs = |tool: &String| vec![server_attr(), ("gen_ai.tool.name", tool.clone().into())];
    let by_tool = |map: &'m std::collections::BTreeMap<String, u64>| -> Points<'m, u64> {
        map.iter().map(|(tool, n)| (tool_attrs(tool), n)).collect()
    };
    let failures = m
        .failures
        .iter()
        .map(|((tool, reason), n)| {
            let mut attrs = tool_attrs(tool);
            attrs.push(("error.type", reason.clone().into()));
            (attrs, n)
        })
        .collect();
    let breaker = m
        .breaker
        .iter()
        .map(|(t, n)| {
            let attrs = vec![server_attr(), ("mcp_retry.breaker.transition", (*t).into())];
            (attrs, n)
        })
        .collect();
    let store_event = |name: &'static str| -> Points<'m, u64> {
        m.store
            .get(name)
            .filter(|n| **n > 0)
            .map(|n| (vec![server_attr()], n))
            .into_iter()
            .collect()
    };
    let sums: [(&str, &str, &str, Points<'_, u64>); 12] = [
        (
            "mcp_retry.calls",
            "{call}",
            "tools/call requests from the client",
            by_tool(&m.calls),
        ),
        (
            "mcp_retry.attempts",
            "{attempt}",
            "tools/call attempts sent to the server",
            by_tool(&m.attempts),
        ),
        (
            "mcp_retry.retries",
            "{attempt}",
            "attempts after a call's first",
            by_tool(&m.retries),
        ),
        (
            "mcp_retry.cache.hits",
            "{call}",
            "calls answered from the cache",
            by_tool(&m.cache_hits),
        ),
        (
            "mcp_retry.dedup.hits",
            "{call}",
            "calls that joined or replayed an identical call",
            by_tool(&m.dedup_hits),
        ),
        (
            "mcp_retry.failures",
            "{call}",
            "calls answered with an error, by reason",
            failures,
        ),
        (
            "mcp_retry.breaker.transitions",
            "{transition}",
            "circuit breaker state changes",
            breaker,
        ),
        (
            "mcp_retry.restarts",
            "{restart}",
            "times the server was started again",
            vec![(vec![server_attr()], &m.restarts)],
        ),
        (
            "mcp_retry.store.operations",
            "{operation}",
            "requests handed to the store of idempotency keys (claims and outcomes)",
            store_event("operations"),
        ),
        (
            "mcp_retry.store.replays",
            "{call}",
            "keyed calls answered with a result the store kept",
            store_event("replays"),
        ),
        (
            "mcp_retry.store.waits",
            "{call}",
            "keyed calls that waited for an identical call in another process",
            store_event("waits"),
        ),
        (
            "mcp_retry.store.unknown_answers",
            "{call}",
            "keyed calls not run because an earlier call's outcome is unknown",
            store_event("unknown_answers"),
        ),
    ];
    let latency: Points<'_, Histogram> = m
        .latency
        .iter()
        .map(|(tool, h)| (tool_attrs(tool), h))
        .collect();
    // Metrics with no data point yet are left out.
    let mut list: Vec<Metric<'_>> = sums
        .iter()
        .filter(|(.., points)| !points.is_empty())
        .map(|(name, unit, description, points)| Metric {
            name,
            unit,
            description,
            sum: Some(Sum {
                aggregation_temporality: CUMULATIVE,
                is_monotonic: true,
                data_points: NumberPoints { points, start, now },
            }),
            gauge: None,
            histogram: None,
        })
        .collect();
    // A shared store's outage: 1 while it is unreachable, else 0.
    let outage: Points<'_, u64> = m
        .store_outage
        .iter()
        .map(|n| (vec![server_attr()], n))
        .collect();
    if !outage.is_empty() {
        list.push(Metric {
            name: "mcp_retry.store.outage",
            unit: "1",
            description: "1 while the shared store (Redis) is unreachable and keyed calls follow store_unavailable, else 0",
            sum: None,
            gauge: Some(Gauge {
                data_points: NumberPoints {
                    points: &outage,
                    start,
                    now,
                },
            }),
            histogram: None,
        });
    }
    if !latency.is_empty() {
        list.push(Metric {
            name: "mcp_retry.call.duration",
            unit: "s",
            description: "How long tools/call took, from the client's request to its answer, retries included",
            sum: None,
            gauge: None,
            histogram: Some(HistogramJson {
                aggregation_temporality: CUMULATIVE,
                data_points: HistogramPoints {
                    points: &latency,
                    start,
                    now,
                },
            }),
        });
    }
    let request = MetricsRequest {
        resource_metrics: [ResourceMetrics {
            resource: Resource {
                attributes: string_attributes(resource),
            },
            scope_metrics: [ScopeMetrics {
                scope: SCOPE,
                metrics: list,
            }],
        }],
    };
    encode(&request, 4096)
}
