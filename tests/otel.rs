//! OpenTelemetry export: a small OTLP/HTTP receiver on loopback records
//! what the proxy POSTs, and the mock's logs show what the server saw.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::loopback::{closed_port, Loopback, Options};
use crate::util::{eventually, ms, wait, Builder, Session};

/// One POST the receiver accepted.
#[derive(Debug, Clone)]
pub(crate) struct Post {
    pub(crate) path: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Value,
}

/// An OTLP/HTTP receiver on 127.0.0.1: a keep-alive loopback server
/// recording every request, each POST answered 200 `{}`.
pub(crate) struct Collector {
    http: Loopback,
}

impl Collector {
    pub(crate) fn start() -> Collector {
        let options = Options {
            keep_alive: true,
            record: true,
            ..Options::default()
        };
        let http = Loopback::with(options, |_, conn| {
            conn.respond(200, &[("Content-Type", "application/json")], "{}");
        });
        Collector { http }
    }

    pub(crate) fn endpoint(&self) -> String {
        self.http.url("")
    }

    pub(crate) fn posts(&self) -> Vec<Post> {
        let requests = self.http.requests();
        let posts = requests.into_iter().map(|r| Post {
            path: r.path().to_owned(),
            body: serde_json::from_slice(&r.body).unwrap_or(Value::Null),
            headers: r.headers,
        });
        posts.collect()
    }

    /// Every span received so far.
    fn spans(&self) -> Vec<Value> {
        self.spans_at("/v1/traces")
    }

    /// Every span received at `path` so far.
    fn spans_at(&self, path: &str) -> Vec<Value> {
        let mut out = Vec::new();
        for p in self.posts().iter().filter(|p| p.path == path) {
            for rs in p.body["resourceSpans"].as_array().into_iter().flatten() {
                for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                    out.extend(ss["spans"].as_array().into_iter().flatten().cloned());
                }
            }
        }
        out
    }

    /// The metrics of the newest snapshot, by name.
    fn last_metrics(&self) -> Option<Vec<Value>> {
        let posts = self.posts();
        let last = posts.iter().rev().find(|p| p.path == "/v1/metrics")?;
        last.body["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]
            .as_array()
            .cloned()
    }
}

/// The proxy for the mock with these policy lines, the mock's logs on,
/// and export to `endpoint` (none: export off).
/// A batch gathers for 50 ms instead of the proxy's 500 (`BATCH_DELAY`,
/// the exporter's own business): what a test waits for at the collector
/// is there sooner.
pub(crate) fn builder(policy: &str, endpoint: Option<&str>) -> Builder {
    exporting(Builder::mock_with(policy), endpoint).shorten("otel_batch_delay", ms(50))
}

/// `b` exporting to `endpoint` (none: export off), whatever the host's
/// `OTEL_*` variables say.
pub(crate) fn exporting(b: Builder, endpoint: Option<&str>) -> Builder {
    b.env("NO_PROXY", "127.0.0.1,localhost")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.unwrap_or(""))
        .env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
        .env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "")
        .env("OTEL_EXPORTER_OTLP_HEADERS", "")
        .env("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "")
        .env("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "")
        .env("OTEL_TRACES_EXPORTER", "")
        .env("OTEL_METRICS_EXPORTER", "")
        .env("OTEL_SDK_DISABLED", "")
}

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    span["attributes"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["key"] == key))
        .map_or(&Value::Null, |x| &x["value"])
}

fn event_names(span: &Value) -> Vec<&str> {
    span["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["name"].as_str())
        .collect()
}

fn counter(metrics: &[Value], name: &str) -> Value {
    metrics
        .iter()
        .find(|m| m["name"] == name)
        .map_or(Value::Null, |m| m["sum"]["dataPoints"][0]["asInt"].clone())
}

const CLIENT_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const CLIENT_SPAN: &str = "b7ad6b7169203331";

#[test]
fn a_timed_out_cancelled_retried_call_is_one_span_tree_under_the_client_s_trace() {
    let collector = Collector::start();
    let mut s = builder(
        "call_timeout: 0.3\nretry:\n  max_retries: 2\n  base_delay: 0.05\n  jitter: 0",
        Some(&collector.endpoint()),
    )
    .env(
        "OTEL_EXPORTER_OTLP_HEADERS",
        "authorization=Bearer%20topsecret-value",
    )
    .initialized();
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    s.call_with(
        json!(1),
        json!({
            "name": "idem_echo",
            "arguments": {"mode": "flaky", "how": "hang", "text": "ok"},
            "_meta": {"traceparent": traceparent, "tracestate": "vendor=1"},
        }),
    );
    let r = s.result(&json!(1));
    assert_eq!(r["content"][0]["text"], "ok", "{r}");

    eventually("three spans at the collector", || {
        collector.spans().len() >= 3
    });
    let spans = collector.spans();
    let call = spans
        .iter()
        .find(|sp| sp["kind"] == 2)
        .unwrap_or_else(|| panic!("no SERVER span in {spans:?}"));
    assert_eq!(call["name"], "tools/call idem_echo");
    assert_eq!(call["traceId"], CLIENT_TRACE);
    assert_eq!(call["parentSpanId"], CLIENT_SPAN);
    assert_eq!(attr(call, "mcp.method.name")["stringValue"], "tools/call");
    assert_eq!(attr(call, "gen_ai.tool.name")["stringValue"], "idem_echo");
    assert_eq!(
        attr(call, "gen_ai.operation.name")["stringValue"],
        "execute_tool"
    );
    assert_eq!(attr(call, "mcp_retry.outcome")["stringValue"], "ok");
    assert_eq!(attr(call, "mcp_retry.attempts")["intValue"], "2");
    assert_eq!(attr(call, "error.type"), &Value::Null);
    assert!(event_names(call).contains(&"mcp_retry.backoff"), "{call}");

    let mut attempts: Vec<&Value> = spans.iter().filter(|sp| sp["kind"] == 3).collect();
    attempts.sort_by_key(|a| {
        attr(a, "mcp_retry.attempt")["intValue"]
            .as_str()
            .map(str::to_owned)
    });
    assert_eq!(attempts.len(), 2, "{spans:?}");
    for a in &attempts {
        assert_eq!(a["traceId"], CLIENT_TRACE);
        assert_eq!(a["parentSpanId"], call["spanId"]);
    }
    let (first, second) = (attempts[0], attempts[1]);
    assert_eq!(attr(first, "error.type")["stringValue"], "timeout");
    assert_eq!(first["status"]["code"], 2);
    assert!(
        event_names(first).contains(&"mcp_retry.cancelled_downstream"),
        "{first}"
    );
    assert_eq!(attr(second, "error.type"), &Value::Null);

    // The server saw each attempt's own traceparent (the client's
    // replaced), the rest of `_meta` as it was, and the cancel.
    let execs = s.execs_of("idem_echo");
    assert_eq!(execs.len(), 2, "{execs:?}");
    for (exec, span) in execs.iter().zip([first, second]) {
        let want = format!("00-{CLIENT_TRACE}-{}-01", span["spanId"].as_str().unwrap());
        assert_eq!(exec["meta"]["traceparent"], want.as_str(), "{exec}");
        assert_eq!(exec["meta"]["tracestate"], "vendor=1", "{exec}");
        assert_eq!(
            attr(span, "jsonrpc.request.id")["stringValue"].as_str(),
            Some(exec["id"].to_string().as_str())
        );
    }
    let cancels = s.received("notifications/cancelled");
    assert_eq!(cancels.len(), 1, "{cancels:?}");
    assert_eq!(cancels[0]["params"]["requestId"], execs[0]["id"]);

    // The configured header reached the collector, and never the log.
    let posts = collector.posts();
    assert!(posts.iter().all(|p| p
        .headers
        .contains(&("authorization".into(), "Bearer topsecret-value".into()))));
    assert!(posts.iter().all(|p| p
        .headers
        .contains(&("content-type".into(), "application/json".into()))));

    // At exit the counters go out once more.
    s.close_stdin();
    assert!(s.wait().success());
    let metrics = collector
        .last_metrics()
        .expect("a metrics snapshot at exit");
    assert_eq!(counter(&metrics, "mcp_retry.calls"), "1");
    assert_eq!(counter(&metrics, "mcp_retry.attempts"), "2");
    assert_eq!(counter(&metrics, "mcp_retry.retries"), "1");
    let duration = metrics
        .iter()
        .find(|m| m["name"] == "mcp_retry.call.duration")
        .expect("a latency histogram");
    assert_eq!(duration["histogram"]["dataPoints"][0]["count"], "1");
    assert!(!s.stderr().contains("topsecret"), "{}", s.stderr());
}

#[test]
fn a_call_without_a_client_context_starts_a_trace_and_meta_is_added() {
    let collector = Collector::start();
    let mut s = builder("", Some(&collector.endpoint())).initialized();
    s.call(json!(1), "echo", json!({"text": "hi"}));
    s.result(&json!(1));
    eventually("two spans", || collector.spans().len() >= 2);
    let spans = collector.spans();
    let call = spans.iter().find(|sp| sp["kind"] == 2).unwrap();
    let attempt = spans.iter().find(|sp| sp["kind"] == 3).unwrap();
    assert!(call.get("parentSpanId").is_none(), "{call}");
    assert_eq!(attempt["traceId"], call["traceId"]);
    let exec = &s.execs_of("echo")[0];
    let want = format!(
        "00-{}-{}-01",
        attempt["traceId"].as_str().unwrap(),
        attempt["spanId"].as_str().unwrap()
    );
    assert_eq!(exec["meta"], json!({"traceparent": want}));
}

#[test]
fn with_export_off_the_forwarded_bytes_are_unchanged() {
    let mut s = builder("", None).initialized();
    let params = r#"{"name":"echo", "arguments":{"text":"hi"},"_meta":{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}"#;
    s.send_raw(&format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{params}}}"#
    ));
    s.result(&json!(1));
    let recv = std::fs::read_to_string(s.dir.join("recv.log")).unwrap();
    let line = recv
        .lines()
        .find(|l| l.contains("tools/call"))
        .expect("the call reached the server");
    assert!(line.ends_with(&format!(r#""params":{params}}}"#)), "{line}");
    assert!(!s.stderr().contains("OpenTelemetry"), "{}", s.stderr());
}

#[test]
fn a_closed_collector_port_neither_slows_calls_nor_breaks_the_session() {
    // A port that was just ours and is closed now.
    let endpoint = format!("http://127.0.0.1:{}", closed_port());
    dead_collector(builder("", Some(&endpoint)));
}

#[test]
fn a_collector_that_never_answers_neither_slows_calls_nor_breaks_the_session() {
    // Takes each request and never answers: every export waits for its
    // timeout (2 s in the proxy, 300 ms here).
    let silent = Loopback::start(|_, conn| conn.wait_for_close());
    let b =
        builder("", Some(&silent.url(""))).shorten("otel_http_timeout", Duration::from_millis(300));
    dead_collector(b);
}

/// 50 calls are answered as ever while nothing reaches the collector
/// (were the dispatcher to wait for each export, a collector that never
/// answers would cost its timeout a call), and that is said once.
fn dead_collector(b: Builder) {
    let mut s = b.initialized();
    let started = Instant::now();
    for i in 0..50 {
        s.call(json!(i), "echo", json!({"text": "hi"}));
        let r = s.result(&json!(i));
        assert_eq!(r["content"][0]["text"], "hi");
    }
    assert!(started.elapsed() < wait() / 2, "{:?}", started.elapsed());
    let warned = |s: &Session| {
        s.stderr()
            .lines()
            .filter(|l| l.contains("OpenTelemetry") && l.contains("said once"))
            .count()
    };
    eventually("the warning", || warned(&s) >= 1);
    s.call(json!("last"), "echo", json!({"text": "hi"}));
    s.result(&json!("last"));
    s.close_stdin();
    assert!(s.wait().success());
    assert_eq!(warned(&s), 1, "{}", s.stderr());
}

#[test]
fn a_bad_endpoint_turns_export_off_and_the_proxy_runs_on() {
    let mut s = builder("", Some("collector:4317")).initialized();
    s.call(json!(1), "echo", json!({"text": "hi"}));
    assert_eq!(s.result(&json!(1))["content"][0]["text"], "hi");
    let exec = &s.execs_of("echo")[0];
    assert_eq!(exec["meta"], Value::Null, "{exec}");
    assert!(
        s.logged("OpenTelemetry export is off: endpoint collector:4317"),
        "{}",
        s.stderr()
    );
}

#[test]
fn the_otel_config_section_turns_export_on_with_its_headers() {
    let collector = Collector::start();
    let policy = format!(
        "otel:\n  endpoint: {}\n  headers:\n    x-api-key: key-from-config\n  service_name: from-config",
        collector.endpoint()
    );
    let mut s = builder(&policy, None).initialized();
    s.call(json!(1), "echo", json!({"text": "hi"}));
    s.result(&json!(1));
    eventually("two spans", || collector.spans().len() >= 2);
    let posts = collector.posts();
    assert!(posts.iter().all(|p| p
        .headers
        .contains(&("x-api-key".into(), "key-from-config".into()))));
    let resource = &posts[0].body["resourceSpans"][0]["resource"]["attributes"];
    assert_eq!(resource[0]["key"], "service.name");
    assert_eq!(resource[0]["value"]["stringValue"], "from-config");
    assert!(!s.stderr().contains("key-from-config"), "{}", s.stderr());
}

#[test]
fn other_requests_get_a_span_only_when_they_fail() {
    let collector = Collector::start();
    let mut s = builder("", Some(&collector.endpoint())).initialized();
    s.request(json!(1), "ping", json!({}));
    s.result(&json!(1));
    // No `uri`: the mock answers -32602.
    s.request(
        json!(2),
        "resources/read",
        json!({"_meta": {"traceparent": format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")}}),
    );
    s.error(&json!(2));
    s.call(json!(3), "echo", json!({"text": "hi"}));
    s.result(&json!(3));
    // The call's two spans come after the failed request's.
    eventually("three spans", || collector.spans().len() >= 3);
    let spans = collector.spans();
    let failed: Vec<&Value> = spans
        .iter()
        .filter(|sp| sp["name"] != "tools/call echo")
        .collect();
    assert_eq!(failed.len(), 1, "{spans:?}");
    let span = failed[0];
    assert_eq!(span["name"], "resources/read");
    assert_eq!(span["traceId"], CLIENT_TRACE);
    assert_eq!(span["parentSpanId"], CLIENT_SPAN);
    assert_eq!(
        attr(span, "mcp.method.name")["stringValue"],
        "resources/read"
    );
    assert_eq!(attr(span, "error.type")["stringValue"], "-32602");
    assert_eq!(span["status"]["code"], 2);
}

#[test]
fn a_per_signal_endpoint_is_used_as_it_is_with_its_headers_over_the_generic_ones() {
    let collector = Collector::start();
    // No generic endpoint: traces only, to a path of our choosing.
    let traces = format!("{}/custom/traces", collector.endpoint());
    let mut s = builder("", None)
        .env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &traces)
        .env(
            "OTEL_EXPORTER_OTLP_HEADERS",
            "x-generic=generic-secret,x-both=generic",
        )
        .env(
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "x-both=traces%20secret,x-traces=t",
        )
        .initialized();
    s.call(json!(1), "echo", json!({"text": "hi"}));
    s.result(&json!(1));
    eventually("two spans", || {
        collector.spans_at("/custom/traces").len() >= 2
    });
    s.close_stdin();
    assert!(s.wait().success());
    let posts = collector.posts();
    // Nothing else was sent: no metrics endpoint, no path appended.
    assert!(
        posts.iter().all(|p| p.path == "/custom/traces"),
        "{:?}",
        posts.iter().map(|p| &p.path).collect::<Vec<_>>()
    );
    for (k, v) in [
        ("x-generic", "generic-secret"),
        ("x-both", "traces secret"),
        ("x-traces", "t"),
    ] {
        assert!(
            posts
                .iter()
                .all(|p| p.headers.contains(&(k.into(), v.into()))),
            "{k}: {:?}",
            posts[0].headers
        );
    }
    assert!(posts
        .iter()
        .all(|p| !p.headers.contains(&("x-both".into(), "generic".into()))));
    assert!(!s.stderr().contains("secret"), "{}", s.stderr());
}

#[test]
fn an_exporter_set_to_none_turns_its_signal_off() {
    let collector = Collector::start();
    let mut s = builder("", Some(&collector.endpoint()))
        .env("OTEL_TRACES_EXPORTER", "none")
        .initialized();
    s.call(json!(1), "echo", json!({"text": "hi"}));
    s.result(&json!(1));
    s.close_stdin();
    assert!(s.wait().success());
    let posts = collector.posts();
    assert!(
        posts.iter().any(|p| p.path == "/v1/metrics"),
        "the counters at exit"
    );
    assert!(posts.iter().all(|p| p.path == "/v1/metrics"), "{posts:?}");
    // Without trace export the server gets no traceparent of ours.
    let exec = &s.execs_of("echo")[0];
    assert_eq!(exec["meta"], Value::Null, "{exec}");
}

#[test]
fn a_collector_redirecting_elsewhere_is_not_followed_and_its_query_is_not_logged() {
    // Every POST is answered 302 to another port, where a collector would
    // take it, headers (an API key) and all.
    let elsewhere = Collector::start();
    let to = format!("{}/v1/traces", elsewhere.endpoint());
    let options = Options {
        keep_alive: true,
        ..Options::default()
    };
    let redirecting = Loopback::with(options, move |_, conn| {
        conn.respond(302, &[("Location", &to)], "");
    });
    let port = redirecting.port();
    let endpoint = format!("http://127.0.0.1:{port}/v1/traces?api_key=QUERY-SECRET-9d1");
    let mut s = builder("", None)
        .env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &endpoint)
        .env("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=HEADER-SECRET-4c2")
        .initialized();
    s.call(json!(1), "echo", json!({"text": "hi"}));
    assert_eq!(s.result(&json!(1))["content"][0]["text"], "hi");
    // The export fails on the 302 itself (a redirect would be followed
    // within the same request, before the failure is said).
    eventually("the export failure, or a post elsewhere", || {
        s.logged("302") || !elsewhere.posts().is_empty()
    });
    let stderr = s.stderr();
    assert!(
        stderr.contains(&format!("127.0.0.1:{port}/v1/traces?[redacted]")),
        "{stderr}"
    );
    assert!(elsewhere.posts().is_empty(), "the redirect was followed");
    for secret in ["QUERY-SECRET-9d1", "HEADER-SECRET-4c2"] {
        assert!(!stderr.contains(secret), "{secret} on stderr:\n{stderr}");
    }
}

/// The exporter panics as it first exports (`MCP_RETRY_FAULT`, a
/// `fault-inject` build): that is logged once, export is off, and the
/// calls are answered as ever.
#[cfg(feature = "fault-inject")]
#[test]
fn an_exporter_that_panics_turns_export_off_and_the_session_goes_on() {
    let collector = Collector::start();
    let mut s = builder("", Some(&collector.endpoint()))
        .env("MCP_RETRY_FAULT", "exporter")
        .initialized();
    s.call(json!(1), "echo", json!({"text": "hi"}));
    assert_eq!(s.result(&json!(1))["content"][0]["text"], "hi");
    let reports = |s: &Session| {
        s.stderr()
            .lines()
            .filter(|l| l.contains("panicked"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    eventually("the exporter's panic", || !reports(&s).is_empty());
    for i in 2..20 {
        s.call(json!(i), "echo", json!({"text": "hi"}));
        assert_eq!(s.result(&json!(i))["content"][0]["text"], "hi");
    }
    s.close_stdin();
    assert!(s.wait().success(), "{}", s.stderr());
    let reports = reports(&s);
    assert_eq!(reports.len(), 1, "{}", s.stderr());
    assert!(
        reports[0].contains("thread 'otel-export' panicked at src/otel/export.rs:")
            && reports[0].contains("injected fault: exporter")
            && reports[0].ends_with("OpenTelemetry export is off"),
        "{}",
        s.stderr()
    );
    assert!(collector.posts().is_empty(), "{:?}", collector.posts());
    assert!(
        !s.stderr().contains("queue is full"),
        "export off is said once: {}",
        s.stderr()
    );
}
