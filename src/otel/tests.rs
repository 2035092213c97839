//! Unit tests of OpenTelemetry export: the OTEL_* variables, W3C
//! traceparent, the `_meta` rewrite, the tracer's span tree and counters,
//! and the OTLP/JSON encoding, also as a whole: a scripted session's export
//! against the committed `golden-export.json` (ids and times normalised;
//! `MCP_RETRY_WRITE_GOLDEN=1` rewrites it).

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::Value as Json;

use super::*;
use crate::config::OtelConfig;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

/// The settings from these variables alone.
fn read(pairs: &[(&str, &str)]) -> (Option<Settings>, Vec<String>) {
    Settings::read(env(pairs), &OtelConfig::default()).unwrap()
}

fn url(e: &Option<Endpoint>) -> Option<&str> {
    e.as_ref().map(|e| e.url.as_str())
}

#[test]
fn export_is_off_without_an_endpoint_or_when_disabled() {
    assert_eq!(
        Settings::read(env(&[]), &OtelConfig::default()).unwrap().0,
        None
    );
    let disabled = env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
        ("OTEL_SDK_DISABLED", "TRUE"),
    ]);
    assert_eq!(
        Settings::read(disabled, &OtelConfig::default()).unwrap().0,
        None
    );
}

#[test]
fn endpoints_headers_and_resource_come_from_the_standard_variables() {
    let (s, notes) = read(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
        ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m:9/custom"),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "Authorization=Bearer%20s3cret, x-tenant = a%2Cb ,broken,=novalue",
        ),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=dev,service.name=ignored",
        ),
        ("OTEL_SERVICE_NAME", "my-proxy"),
    ]);
    let s = s.unwrap();
    assert_eq!(url(&s.traces), Some("http://collector:4318/v1/traces"));
    assert_eq!(url(&s.metrics), Some("http://m:9/custom"));
    assert_eq!(
        s.traces.unwrap().headers,
        vec![
            ("Authorization".to_owned(), "Bearer s3cret".to_owned()),
            ("x-tenant".to_owned(), "a,b".to_owned()),
        ]
    );
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(notes.iter().all(|n| !n.contains("s3cret")), "{notes:?}");
    assert_eq!(s.resource[0], ("service.name".into(), "my-proxy".into()));
    assert!(s
        .resource
        .contains(&("deployment.environment".into(), "dev".into())));
    assert!(!s.resource.iter().any(|(_, v)| v == "ignored"));
}

#[test]
fn per_signal_headers_are_merged_over_the_generic_ones() {
    let config = OtelConfig {
        endpoint: "http://c:4318".into(),
        headers: vec![
            ("x-config".into(), "c".into()),
            ("X-Both".into(), "config".into()),
        ],
        service_name: String::new(),
    };
    let (s, notes) = Settings::read(
        env(&[
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-both=generic,x-generic=g"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "X-BOTH=traces,x-t=1"),
            ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "x-m=2"),
        ]),
        &config,
    )
    .unwrap();
    assert!(notes.is_empty(), "{notes:?}");
    let s = s.unwrap();
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(
        s.traces.unwrap().headers,
        pairs(&[
            ("x-config", "c"),
            ("x-generic", "g"),
            ("X-BOTH", "traces"),
            ("x-t", "1")
        ])
    );
    assert_eq!(
        s.metrics.unwrap().headers,
        pairs(&[
            ("x-config", "c"),
            ("x-both", "generic"),
            ("x-generic", "g"),
            ("x-m", "2")
        ])
    );
}

#[test]
fn a_per_signal_endpoint_is_used_as_it_is_and_the_generic_one_gets_the_path() {
    let (s, _) = read(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/base/"),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", " http://t:1/ "),
    ]);
    let s = s.unwrap();
    assert_eq!(url(&s.traces), Some("http://t:1/"));
    assert_eq!(url(&s.metrics), Some("http://c:4318/base/v1/metrics"));
    // A per-signal endpoint that is not HTTP is an error like any other.
    assert!(Settings::read(
        env(&[("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "grpc://m:4317")]),
        &OtelConfig::default()
    )
    .is_err());
}

#[test]
fn exporters_set_to_none_turn_their_signal_off() {
    let with_endpoint = |pairs: &[(&str, &str)]| {
        let mut all = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")];
        all.extend_from_slice(pairs);
        read(&all)
    };
    let (s, notes) = with_endpoint(&[("OTEL_TRACES_EXPORTER", "none")]);
    let s = s.unwrap();
    assert_eq!(
        (s.traces, url(&s.metrics)),
        (None, Some("http://c:4318/v1/metrics"))
    );
    assert!(notes.is_empty(), "{notes:?}");
    let (s, _) = with_endpoint(&[("OTEL_METRICS_EXPORTER", " None ")]);
    let s = s.unwrap();
    assert!(s.traces.is_some() && s.metrics.is_none());
    let (s, notes) = with_endpoint(&[
        ("OTEL_TRACES_EXPORTER", "none"),
        ("OTEL_METRICS_EXPORTER", "none"),
    ]);
    assert_eq!(s, None);
    assert!(notes.is_empty(), "{notes:?}");
    // An exporter we do not have is said; with otlp in the list, otlp is used.
    let (s, notes) = with_endpoint(&[("OTEL_TRACES_EXPORTER", "console")]);
    assert!(s.unwrap().traces.is_none());
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(notes[0].contains("console"), "{notes:?}");
    let (s, notes) = with_endpoint(&[("OTEL_TRACES_EXPORTER", "otlp,zipkin")]);
    assert!(s.unwrap().traces.is_some());
    assert_eq!(notes.len(), 1, "{notes:?}");
    // The SDK switch wins over everything.
    let (s, _) = with_endpoint(&[
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:1/x"),
        ("OTEL_SDK_DISABLED", "true"),
    ]);
    assert_eq!(s, None);
}

#[test]
fn a_protocol_other_than_http_is_said() {
    let (s, notes) = read(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
    ]);
    assert!(s.is_some());
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].starts_with("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc"),
        "{notes:?}"
    );
}

#[test]
fn a_header_that_cannot_be_sent_is_noted_without_its_value() {
    let (s, notes) = read(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
        (
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "x-token=sec%0Aret,bad name=secret2,ok=1",
        ),
    ]);
    assert_eq!(
        s.unwrap().traces.unwrap().headers,
        vec![("ok".to_owned(), "1".to_owned())]
    );
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(notes[0].contains("x-token"), "{notes:?}");
    assert!(notes.iter().all(|n| !n.contains("sec")), "{notes:?}");
}

#[test]
fn a_bad_header_value_is_noted_by_its_key_only() {
    let (_, notes) = read(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=secret%zz"),
    ]);
    assert_eq!(notes.len(), 1);
    assert!(
        notes[0].contains("api-key") && !notes[0].contains("secret"),
        "{notes:?}"
    );
}

#[test]
fn the_service_name_defaults_to_mcp_retry() {
    let (s, _) = read(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c/t")]);
    let s = s.unwrap();
    assert_eq!(url(&s.traces), Some("http://c/t"));
    assert_eq!(s.metrics, None);
    assert_eq!(s.resource[0], ("service.name".into(), "mcp-retry".into()));
}

#[test]
fn an_endpoint_that_is_not_http_is_an_error() {
    assert!(Settings::read(
        env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317")]),
        &OtelConfig::default()
    )
    .is_err());
}

#[test]
fn traceparent_round_trips_and_bad_ones_are_refused() {
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let c = SpanContext::parse(tp).unwrap();
    assert_eq!(hex(&c.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(hex(&c.span_id), "00f067aa0ba902b7");
    assert!(c.sampled);
    assert_eq!(c.traceparent(), tp);
    let unsampled =
        SpanContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
    assert!(!unsampled.sampled);
    // A later version may carry more fields.
    assert!(
        SpanContext::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra")
            .is_some()
    );
    for bad in [
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
        "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ] {
        assert_eq!(SpanContext::parse(bad), None, "{bad}");
    }
}

/// The params of the attempt line [`attempt_line`] makes of a request
/// with `params`, with the edit its reader decided (in the line's one
/// pass, or apart for params that make no call); checked to be the line
/// the planning at each attempt made before, byte for byte, without a
/// parse.
fn with_traceparent(params: &str, traceparent: &str) -> Option<String> {
    let line = format!(r#"{{"jsonrpc":"2.0","id":"c","method":"tools/call","params":{params}}}"#);
    let request = crate::jsonrpc::Message::reparse(line.clone()).unwrap();
    let out = carried_attempt_line(&line, &request, traceparent);
    assert_eq!(
        out,
        planned::attempt_line(&request, 42, traceparent),
        "{params}"
    );
    let text = String::from_utf8(out?).unwrap();
    let sent = crate::jsonrpc::Message::reparse(text.trim_end().to_owned()).unwrap();
    assert_eq!(sent.id(), Some("42"));
    Some(sent.params().unwrap().to_owned())
}

/// The line of attempt 42 of `request` (read from `line`) with the edit
/// its reader decided, made without parsing.
fn carried_attempt_line(
    line: &str,
    request: &crate::jsonrpc::Message,
    traceparent: &str,
) -> Option<Vec<u8>> {
    let read = crate::inbound::Inbound::of_line(line.as_bytes().to_vec()).read;
    let params = request.params()?;
    let apart = crate::jsonrpc::Params::parse(params, "_meta")
        .and_then(|p| TraceparentEdit::of(params, &p));
    let edit = match read.and_then(|r| r.call) {
        Some(call) => {
            assert_eq!(call.traceparent_edit, apart, "{line}");
            call.traceparent_edit
        }
        None => apart,
    };
    let before = params_parsed();
    let out = attempt_line(request, 42, traceparent, Some(edit.as_ref()?));
    assert_eq!(params_parsed(), before, "{line}");
    out
}

/// The planning each attempt made before the edit was carried with the
/// call: the reference the carried edit is held to.
mod planned {
    use crate::jsonrpc::{Message, RawObject};

    pub(super) fn attempt_line(request: &Message, down: u64, traceparent: &str) -> Option<Vec<u8>> {
        let params = request.params()?;
        let mut digits = [0u8; 20];
        let id = std::str::from_utf8(super::decimal(down, &mut digits)).unwrap_or_default();
        match plan(params)? {
            Some((at, meta, comma)) => {
                let pieces = super::TraceparentEdit::pieces(meta, comma, traceparent);
                request.line_with_id_and_insert(id, at, &pieces)
            }
            None => {
                let member = format!("\"traceparent\":\"{traceparent}\"");
                let params = RawObject::parse(params)?.to_json_with_meta("traceparent", &member);
                Some(request.with_params(&params)?.line_with_id(id))
            }
        }
    }

    /// `Some(None)`: rewrite; `Some(Some(insert))`; `None`: not an object.
    #[allow(clippy::type_complexity)]
    fn plan(params: &str) -> Option<Option<(usize, bool, bool)>> {
        let body = params.trim_start().strip_prefix('{')?;
        let b = params.as_bytes();
        let (mut meta, mut escape) = (false, false);
        for i in memchr::memchr2_iter(b'_', b'\\', b) {
            match b[i] {
                b'_' => meta |= i > 0 && b[i - 1] == b'"' && b[i + 1..].starts_with(b"meta\""),
                _ => escape |= b.get(i + 1) == Some(&b'u'),
            }
        }
        if escape {
            return Some(None);
        }
        let meta = match meta {
            true => RawObject::parse(params)?.get("_meta").map(|m| m.get()),
            false => None,
        };
        let (at, meta) = match meta {
            Some(m) if m.contains("traceparent") || !m.starts_with('{') => return Some(None),
            Some(m) => (m.as_ptr() as usize - params.as_ptr() as usize + 1, false),
            None => (params.len() - body.len(), true),
        };
        let comma = !params[at..].trim_start().starts_with('}');
        Some(Some((at, meta, comma)))
    }
}

/// Beyond the cases above: params whose carried edit writes the same
/// bytes as the planning at each attempt did, and those where that
/// planning rebuilt the object for text that is no name (an escape in a
/// value, `traceparent` within a value): the same JSON, the object kept
/// as written.
#[test]
fn a_carried_edit_writes_what_the_planning_at_each_attempt_wrote() {
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let same = [
        r#" { "name" : "t" , "_meta" : { "traceparent" : "x" , "k" : [1, 2] } , "a" : 1 } "#,
        r#"{"name":"t","_meta":[1],"arguments":{}}"#,
        r#"{"name":"t","_meta":{"traceparent":"x"}}"#,
        r#"{"name":"t","_meta":{"k":1,"traceparent":"x"},"z":{"traceparent":1}}"#,
        r#"{"n\u0061me":"t","_meta":{"k":1}}"#,
        r#"{"name":"t","_meta":{"tr\u0061ceparent":"x","k":1}}"#,
        r#"{"name":"t","_meta":{ },"arguments":{"_meta":{}}}"#,
        r#"{"name":"t",  "_meta":{"k":"v"}  }"#,
        r#"{"_meta":"s"}"#,
        "{\n\"name\":\"t\"\n}",
    ];
    for params in same {
        with_traceparent(params, tp);
    }
    let rebuilt_before = [
        r#"{"name":"t", "arguments":{"q":"caf\u00e9"} }"#,
        r#"{ "name":"t", "_meta":{"k":"traceparent"} }"#,
        r#"{"name":"t", "_meta":{"k":{"traceparent":1}} }"#,
    ];
    for params in rebuilt_before {
        let line =
            format!(r#"{{"jsonrpc":"2.0","id":"c","method":"tools/call","params":{params}}}"#);
        let request = crate::jsonrpc::Message::reparse(line.clone()).unwrap();
        let carried = carried_attempt_line(&line, &request, tp).unwrap();
        let planned = planned::attempt_line(&request, 42, tp).unwrap();
        assert_ne!(carried, planned, "{params}");
        let json = |b: &[u8]| serde_json::from_slice::<Json>(b).unwrap();
        assert_eq!(json(&carried), json(&planned), "{params}");
        // The client's text is kept: only the member is written into it.
        let text = String::from_utf8(carried).unwrap();
        assert!(text.contains(&params[params.len() - 3..]), "{text}");
    }
}

#[test]
fn the_traceparent_replaces_the_client_s_and_meta_is_added_when_absent() {
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    assert_eq!(
        with_traceparent(r#"{"name":"t","arguments":{"a":1}}"#, tp).unwrap(),
        format!(r#"{{"_meta":{{"traceparent":"{tp}"}},"name":"t","arguments":{{"a":1}}}}"#)
    );
    assert_eq!(
        with_traceparent(
            r#"{"name":"t","_meta":{"progressToken":7,"traceparent":"old","tracestate":"k=v"}}"#,
            tp
        )
        .unwrap(),
        format!(
            r#"{{"name":"t","_meta":{{"traceparent":"{tp}","progressToken":7,"tracestate":"k=v"}}}}"#
        )
    );
    assert_eq!(with_traceparent("[1]", tp), None);
    // Without a traceparent to replace, the text is kept as it was and the
    // member written where it belongs.
    assert_eq!(
        with_traceparent(r#"{"name":"t","_meta":{"progressToken":7}}"#, tp).unwrap(),
        format!(r#"{{"name":"t","_meta":{{"traceparent":"{tp}","progressToken":7}}}}"#)
    );
    assert_eq!(
        with_traceparent(r#"{ "name" : "t", "_meta" : { } }"#, tp).unwrap(),
        format!(r#"{{ "name" : "t", "_meta" : {{"traceparent":"{tp}" }} }}"#)
    );
    assert_eq!(
        with_traceparent(r#"{ }"#, tp).unwrap(),
        format!(r#"{{"_meta":{{"traceparent":"{tp}"}} }}"#)
    );
    assert_eq!(
        with_traceparent(r#"{"arguments":{"_meta":1}}"#, tp).unwrap(),
        format!(r#"{{"_meta":{{"traceparent":"{tp}"}},"arguments":{{"_meta":1}}}}"#)
    );
    // A `_meta` that is not an object is replaced; one spelled with an
    // escape is found all the same.
    assert_eq!(
        with_traceparent(r#"{"_meta":null,"name":"t"}"#, tp).unwrap(),
        format!(r#"{{"_meta":{{"traceparent":"{tp}"}},"name":"t"}}"#)
    );
    let escaped = with_traceparent(r#"{"\u005fmeta":{"k":1},"name":"t"}"#, tp).unwrap();
    let v: Json = serde_json::from_str(&escaped).unwrap();
    assert_eq!(v["_meta"], serde_json::json!({"traceparent": tp, "k": 1}));
    assert_eq!(v.as_object().unwrap().len(), 2, "{escaped}");
}

#[test]
fn percent_decoding() {
    assert_eq!(percent_decode("a%20b%2c+c").as_deref(), Some("a b,+c"));
    assert_eq!(percent_decode("%e2%82%ac").as_deref(), Some("€"));
    assert_eq!(percent_decode("%2"), None);
    assert_eq!(percent_decode("%ff"), None);
}

/// A tracer whose exporter is a channel the test reads.
/// The client's trace context of a `tools/call` with `params`, as the
/// client's line is read (`inbound.rs`) and carried to the tracer.
fn read_context(params: &str) -> Option<SpanContext> {
    let line = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{params}}}"#);
    let read = crate::inbound::Inbound::of_line(line.into_bytes()).read;
    let context = read.and_then(|r| r.client_context);
    assert!(context.is_some(), "{params}");
    context
}

fn tracer() -> (Tracer, crossbeam_channel::Receiver<export::Item>) {
    let (handle, rx) = Handle::for_test();
    (Tracer::new("srv", handle, Instant::now()).with_seed(7), rx)
}

fn spans(rx: &crossbeam_channel::Receiver<export::Item>) -> Vec<Span> {
    rx.try_iter()
        .flat_map(|i| match i {
            export::Item::Span(r) => r.spans(&Clock::now()),
            _ => Vec::new(),
        })
        .collect()
}

fn attr<'a>(s: &'a Span, key: &str) -> Option<&'a Value> {
    s.attrs.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
}

#[test]
fn a_call_span_parents_its_attempts_and_honours_the_client_s_context() {
    let (mut t, rx) = tracer();
    let t0 = Instant::now();
    let params = r#"{"name":"x","_meta":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}"#;
    t.call_started(1, "x", "\"c1\"", read_context(params), t0);
    let tp1 = t.attempt_started(1, 10, t0).unwrap();
    t.attempt_event(
        1,
        "mcp_retry.cancelled_downstream",
        Vec::new(),
        t0 + Duration::from_millis(300),
    );
    t.attempt_ended(1, Some("timeout"), t0 + Duration::from_millis(300));
    t.call_event(
        1,
        "mcp_retry.backoff",
        vec![("mcp_retry.delay_ms", 50.into())],
        t0,
    );
    let tp2 = t
        .attempt_started(1, 11, t0 + Duration::from_millis(350))
        .unwrap();
    t.attempt_ended(1, None, t0 + Duration::from_millis(400));
    let end = CallEnd {
        outcome: "ok",
        reason: None,
        source: None,
    };
    t.call_ended(1, end, t0 + Duration::from_millis(400));
    let s = spans(&rx);
    assert_eq!(s.len(), 3);
    let (a1, a2, call) = (&s[0], &s[1], &s[2]);
    assert_eq!(hex(&call.ctx.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(
        call.parent.map(|p| hex(&p)).as_deref(),
        Some("00f067aa0ba902b7")
    );
    assert_eq!(call.kind, SpanKind::Server);
    assert_eq!(call.name, "tools/call x");
    assert_eq!(attr(call, "mcp_retry.attempts"), Some(&Value::Int(2)));
    assert_eq!(
        attr(call, "gen_ai.operation.name"),
        Some(&"execute_tool".into())
    );
    assert_eq!(call.events[0].name, "mcp_retry.backoff");
    assert_eq!(call.end - call.start, 400_000_000);
    for (a, tp) in [(a1, &tp1), (a2, &tp2)] {
        assert_eq!(a.ctx.trace_id, call.ctx.trace_id);
        assert_eq!(a.parent, Some(call.ctx.span_id));
        assert_eq!(a.kind, SpanKind::Client);
        assert_eq!(&a.ctx.traceparent(), tp);
    }
    assert_ne!(a1.ctx.span_id, a2.ctx.span_id);
    assert_eq!(attr(a1, "error.type"), Some(&"timeout".into()));
    assert_eq!(a1.events[0].name, "mcp_retry.cancelled_downstream");
    assert_eq!(attr(a2, "error.type"), None);
    assert_eq!(
        attr(a2, "jsonrpc.request.id"),
        Some(&Value::Str("11".into()))
    );
}

/// The OTLP/JSON body of the metrics snapshot handed to the exporter.
fn exported_metrics(rx: &crossbeam_channel::Receiver<export::Item>) -> Vec<u8> {
    let snapshot = rx
        .try_iter()
        .find_map(|i| match i {
            export::Item::Metrics(m) => Some(m),
            _ => None,
        })
        .unwrap();
    json::metrics(&[], &snapshot.server, &snapshot.metrics(), 0, 1)
}

#[test]
fn metrics_export_the_session_s_figures() {
    // The figures are the one store the dispatcher's calls keep; the
    // export is a view of them.
    let (mut t, rx) = tracer();
    let t0 = Instant::now();
    let mut stats = crate::stats::Stats::default();
    let x = stats.tool("x");
    x.calls = 2;
    x.attempts = 2;
    x.retries = 1;
    x.cache_hits = 1;
    let failure = Some(("retries_exhausted", "gave up".to_owned()));
    stats.call_ended("x", Some(Duration::from_millis(30)), failure, t0);
    *stats.breaker.entry("opened").or_default() += 1;
    stats.restarts = 1;
    stats.store.operations = 4;
    stats.store.replays = 1;
    stats.store.unknown_answers = 2;
    assert!(!t.metrics_changed());
    t.figures_changed();
    assert!(t.metrics_changed());
    t.flush_metrics(&stats, t0);
    assert!(!t.metrics_changed());
    let body = exported_metrics(&rx);
    let v: Json = serde_json::from_slice(&body).unwrap();
    let body = String::from_utf8(body).unwrap();
    let metrics = v["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]
        .as_array()
        .unwrap();
    let point = |name: &str| -> Json {
        metrics
            .iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {body}"))
            .clone()
    };
    let int = |name: &str| point(name)["sum"]["dataPoints"][0]["asInt"].clone();
    assert_eq!(int("mcp_retry.calls"), "2");
    assert_eq!(int("mcp_retry.attempts"), "2");
    assert_eq!(int("mcp_retry.retries"), "1");
    assert_eq!(int("mcp_retry.cache.hits"), "1");
    assert_eq!(int("mcp_retry.restarts"), "1");
    assert_eq!(int("mcp_retry.breaker.transitions"), "1");
    assert_eq!(int("mcp_retry.store.operations"), "4");
    assert_eq!(int("mcp_retry.store.replays"), "1");
    assert_eq!(int("mcp_retry.store.unknown_answers"), "2");
    assert!(
        !body.contains("mcp_retry.store.waits"),
        "a counter still at 0 is left out"
    );
    let failures = point("mcp_retry.failures");
    assert_eq!(failures["sum"]["aggregationTemporality"], 2);
    let attrs = &failures["sum"]["dataPoints"][0]["attributes"];
    assert!(attrs
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a["key"] == "error.type" && a["value"]["stringValue"] == "retries_exhausted"));
    let h = &point("mcp_retry.call.duration")["histogram"]["dataPoints"][0];
    assert_eq!(h["count"], "1");
    // 30 ms lands in the (0.025, 0.05] bucket.
    assert_eq!(h["bucketCounts"][3], "1");
    assert!(!metrics.iter().any(|m| m["name"] == "mcp_retry.dedup.hits"));
    assert!(
        !body.contains("mcp_retry.store.outage"),
        "no outage gauge without a shared store"
    );
}

#[test]
fn a_shared_store_s_outage_is_a_gauge() {
    let (mut t, rx) = tracer();
    let t0 = Instant::now();
    let mut stats = crate::stats::Stats::default();
    stats.store.shared_scope = Some(("mcp-retry:".into(), [1; 32]));
    let mut gauge = |outage: Option<&str>| -> Json {
        stats.store.outage = outage.map(str::to_owned);
        t.figures_changed();
        t.flush_metrics(&stats, t0);
        let v: Json = serde_json::from_slice(&exported_metrics(&rx)).unwrap();
        v["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == "mcp_retry.store.outage")
            .cloned()
            .unwrap_or(Json::Null)
    };
    let down = gauge(Some("redis://h:6379 is unreachable"));
    assert!(down["sum"].is_null(), "a gauge, not a sum: {down}");
    let point = &down["gauge"]["dataPoints"][0];
    assert_eq!(point["asInt"], "1", "{down}");
    assert_eq!(point["attributes"][0]["key"], "mcp_retry.server", "{down}");
    assert_eq!(gauge(None)["gauge"]["dataPoints"][0]["asInt"], "0");
}

#[test]
fn spans_encode_as_otlp_json() {
    let (mut t, rx) = tracer();
    let t0 = Instant::now();
    t.call_started(1, "x", "1", None, t0);
    let end = CallEnd {
        outcome: "failed",
        reason: Some("circuit_open"),
        source: None,
    };
    t.call_ended(1, end, t0);
    let s = spans(&rx);
    let resource = [("service.name".into(), "mcp-retry".into())];
    let body = json::traces(&resource, &s);
    let v: Json = serde_json::from_slice(&body).unwrap();
    let rs = &v["resourceSpans"][0];
    assert_eq!(rs["resource"]["attributes"][0]["key"], "service.name");
    let span = &rs["scopeSpans"][0]["spans"][0];
    assert_eq!(span["traceId"].as_str().unwrap().len(), 32);
    assert_eq!(span["spanId"].as_str().unwrap().len(), 16);
    assert!(span.get("parentSpanId").is_none());
    assert_eq!(span["kind"], 2);
    assert_eq!(span["status"]["code"], 2);
    assert!(
        span["startTimeUnixNano"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 1_600_000_000_000_000_000
    );
    let attrs = span["attributes"].as_array().unwrap();
    let get = |k: &str| {
        attrs
            .iter()
            .find(|a| a["key"] == k)
            .map(|a| a["value"].clone())
    };
    assert_eq!(get("error.type").unwrap()["stringValue"], "circuit_open");
    assert_eq!(get("jsonrpc.request.id").unwrap()["stringValue"], "1");
    assert_eq!(get("mcp_retry.attempts").unwrap()["intValue"], "0");
    assert_eq!(get("mcp.method.name").unwrap()["stringValue"], "tools/call");
}

#[test]
fn names_are_escaped_and_numbers_written_in_full() {
    let (mut t, rx) = tracer();
    let t0 = Instant::now();
    let tool = "q\"b\\s\n\r\t\u{1}\u{1f}é€😀";
    let client_id = r#""a-long-client-id-\"quoted\"-over-22-bytes""#;
    t.call_started(1, tool, client_id, None, t0);
    t.attempt_started(1, u64::MAX, t0);
    t.attempt_ended(1, None, t0);
    t.call_ended(1, CallEnd::answered(false), t0);
    let body = json::traces(&[], &spans(&rx));
    let v: Json = serde_json::from_slice(&body).unwrap();
    let spans = v["resourceSpans"][0]["scopeSpans"][0]["spans"]
        .as_array()
        .unwrap();
    let (attempt, call) = (&spans[0], &spans[1]);
    assert_eq!(call["name"], format!("tools/call {tool}"));
    let attr = |s: &Json, k: &str| {
        s["attributes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["key"] == k)
            .map(|a| a["value"].clone())
            .unwrap()
    };
    assert_eq!(attr(call, "gen_ai.tool.name")["stringValue"], tool);
    assert_eq!(attr(call, "jsonrpc.request.id")["stringValue"], client_id);
    assert_eq!(attr(call, "mcp_retry.attempts")["intValue"], "1");
    assert_eq!(
        attr(attempt, "jsonrpc.request.id")["stringValue"],
        u64::MAX.to_string()
    );
    let start: u64 = call["startTimeUnixNano"].as_str().unwrap().parse().unwrap();
    assert!(start > 1_600_000_000_000_000_000, "{start}");
}

#[test]
fn a_client_context_that_is_not_sampled_exports_no_spans_but_still_propagates() {
    let (mut t, rx) = tracer();
    let t0 = Instant::now();
    let params = r#"{"name":"x","_meta":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"}}"#;
    t.call_started(1, "x", "1", read_context(params), t0);
    let tp = t.attempt_started(1, 1, t0).unwrap();
    assert!(
        tp.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-") && tp.ends_with("-00"),
        "{tp}"
    );
    t.attempt_ended(1, None, t0);
    let end = CallEnd {
        outcome: "ok",
        reason: None,
        source: None,
    };
    t.call_ended(1, end, t0);
    assert!(spans(&rx).is_empty());
}

#[test]
fn the_config_section_is_used_and_each_variable_set_wins_over_it() {
    let config = OtelConfig {
        endpoint: "http://from-config:4318".into(),
        headers: vec![
            ("Authorization".into(), "a".into()),
            ("x-team".into(), "t".into()),
        ],
        service_name: "from-config".into(),
    };
    let (s, _) = Settings::read(env(&[]), &config).unwrap();
    let s = s.unwrap();
    assert_eq!(url(&s.traces), Some("http://from-config:4318/v1/traces"));
    assert_eq!(s.traces.unwrap().headers, config.headers);
    assert_eq!(s.resource[0], ("service.name".into(), "from-config".into()));
    let (s, _) = Settings::read(
        env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://from-env:4318"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=b"),
            ("OTEL_SERVICE_NAME", "from-env"),
        ]),
        &config,
    )
    .unwrap();
    let s = s.unwrap();
    assert_eq!(url(&s.metrics), Some("http://from-env:4318/v1/metrics"));
    assert_eq!(
        s.metrics.unwrap().headers,
        vec![
            ("x-team".to_owned(), "t".to_owned()),
            ("authorization".to_owned(), "b".to_owned())
        ]
    );
    assert_eq!(s.resource[0], ("service.name".into(), "from-env".into()));
    let disabled = env(&[("OTEL_SDK_DISABLED", "true")]);
    assert_eq!(Settings::read(disabled, &config).unwrap().0, None);
}

#[test]
fn urls_are_logged_without_credentials() {
    assert_eq!(
        shown_url("http://u:p@c:4318/v1/traces"),
        "http://c:4318/v1/traces"
    );
    assert_eq!(shown_url("https://c/x?a=b@c"), "https://c/x?[redacted]");
    assert_eq!(
        shown_url("http://u:p@c:4318/v1/traces?api_key=s3cr3t#f"),
        "http://c:4318/v1/traces?[redacted]"
    );
    assert_eq!(shown_url("https://c/x#api_key=s"), "https://c/x#[redacted]");
    assert_eq!(shown_url("c:4318"), "c:4318");
    assert_eq!(shown_url("c:4318?k=v"), "c:4318?[redacted]");
}

/// A session of every kind of telemetry: a call under the client's trace
/// whose first attempt timed out (with events on both spans), a tool name
/// that needs escaping, a call the breaker refused, answers from the cache
/// and the dedup table, a failed `resources/read`, a breaker transition and
/// a respawn. Its OTLP export, as [`normalised`].
fn scripted_export() -> Json {
    let (mut t, rx) = tracer();
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    let params = r#"{"name":"x","_meta":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}"#;
    t.call_started(1, "search", "\"c1\"", read_context(params), t0);
    t.attempt_started(1, 10, t0);
    t.attempt_event(1, "mcp_retry.cancelled_downstream", Vec::new(), ms(300));
    t.attempt_ended(1, Some("timeout"), ms(300));
    t.call_event(
        1,
        "mcp_retry.backoff",
        vec![("mcp_retry.delay_ms", 50.into())],
        ms(300),
    );
    t.attempt_started(1, 11, ms(350));
    t.attempt_ended(1, None, ms(400));
    t.call_ended(1, CallEnd::answered(false), ms(400));
    t.call_started(2, "q\"b\\s\n\t\u{1}é€😀", "7", None, ms(500));
    let refused = CallEnd {
        outcome: "failed",
        reason: Some("circuit_open"),
        source: None,
    };
    t.call_ended(2, refused, ms(500));
    t.answered_by_proxy(
        "search",
        "\"c3\"",
        None,
        CallEnd::from_proxy("cache"),
        ms(600),
    );
    t.joined(None, ms(650));
    let request = t.request_started("resources/read", None, ms(700)).unwrap();
    let error = br#"{"jsonrpc":"2.0","id":4,"error":{"code":-32603,"message":"disk \"full\"","data":{"reason":"server_exited"}}}"#;
    t.request_answered(&request, "4", error, None, ms(720));
    t.respawned(ms(800));
    // What the calls above counted (see `stats.rs`).
    let mut stats = crate::stats::Stats::default();
    let search = stats.tool("search");
    search.calls = 3;
    search.attempts = 2;
    search.retries = 1;
    search.cache_hits = 1;
    search.dedup_hits = 1;
    stats.call_ended("search", Some(Duration::from_millis(400)), None, ms(400));
    let odd = "q\"b\\s\n\t\u{1}é€😀";
    stats.tool(odd).calls = 1;
    let refused = Some(("circuit_open", String::new()));
    stats.call_ended(odd, None, refused, ms(500));
    *stats.breaker.entry("opened").or_default() += 1;
    stats.restarts = 1;
    t.flush_metrics(&stats, ms(900));
    let clock = Clock::now();
    let mut spans = Vec::new();
    let mut snapshot = None;
    for item in rx.try_iter() {
        match item {
            export::Item::Span(r) => r.render(&clock, &mut spans),
            export::Item::Metrics(m) => snapshot = Some(m),
        }
    }
    let snapshot = snapshot.expect("a metrics snapshot");
    let resource = [
        ("service.name".into(), "mcp-retry".into()),
        ("host.name".into(), "h\"1".into()),
    ];
    let traces = json::traces(&resource, &spans);
    let metrics = json::metrics(&resource, &snapshot.server, &snapshot.metrics(), 5, 9);
    serde_json::json!({
        "traces": normalised(serde_json::from_slice(&traces).unwrap()),
        "metrics": normalised(serde_json::from_slice(&metrics).unwrap()),
    })
}

/// `v` with its ids named by order of appearance (`id1`, …), its times
/// (`…UnixNano`) made offsets from its earliest and our version a name, so
/// that two sessions scripted alike compare equal.
fn normalised(mut v: Json) -> Json {
    fn times(v: &Json, out: &mut Vec<u64>) {
        match v {
            Json::Object(m) => {
                for (k, x) in m {
                    match x.as_str() {
                        Some(s) if k.ends_with("UnixNano") => out.push(s.parse().unwrap()),
                        _ => times(x, out),
                    }
                }
            }
            Json::Array(a) => a.iter().for_each(|x| times(x, out)),
            _ => {}
        }
    }
    fn rewrite(v: &mut Json, first: u64, ids: &mut Vec<String>) {
        match v {
            Json::Object(m) => {
                for (k, x) in m.iter_mut() {
                    match x.as_str() {
                        Some(s) if k.ends_with("UnixNano") => {
                            let t: u64 = s.parse().unwrap();
                            *x = Json::from((t - first).to_string());
                        }
                        Some(s) if matches!(k.as_str(), "traceId" | "spanId" | "parentSpanId") => {
                            let n = match ids.iter().position(|i| i == s) {
                                Some(n) => n,
                                None => {
                                    ids.push(s.to_owned());
                                    ids.len() - 1
                                }
                            };
                            *x = Json::from(format!("id{} ({} hex digits)", n + 1, s.len()));
                        }
                        Some(env!("CARGO_PKG_VERSION")) if k == "version" => {
                            *x = Json::from("CARGO_PKG_VERSION");
                        }
                        _ => rewrite(x, first, ids),
                    }
                }
            }
            Json::Array(a) => a.iter_mut().for_each(|x| rewrite(x, first, ids)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    times(&v, &mut all);
    let first = all.into_iter().min().unwrap_or(0);
    rewrite(&mut v, first, &mut Vec::new());
    v
}

/// The committed export of [`scripted_export`]; written instead of compared
/// when `MCP_RETRY_WRITE_GOLDEN` is set.
const GOLDEN: &str = "src/otel/golden-export.json";

#[test]
fn a_scripted_session_exports_the_committed_otlp_json() {
    let got = scripted_export();
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(GOLDEN);
    if std::env::var_os("MCP_RETRY_WRITE_GOLDEN").is_some() {
        let text = serde_json::to_string_pretty(&got).unwrap() + "\n";
        std::fs::write(&file, text).unwrap();
        return;
    }
    let text = std::fs::read_to_string(&file).unwrap();
    let want: Json = serde_json::from_str(&text).unwrap();
    assert_eq!(
        got,
        want,
        "{GOLDEN} differs: {}",
        serde_json::to_string_pretty(&got).unwrap()
    );
}
