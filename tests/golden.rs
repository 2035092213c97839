//! What the proxy reports about a scripted session, compared with golden
//! files in `tests/golden/`: the stats file, `status --json`,
//! `status --prometheus` and the OTLP export (spans and the last metrics
//! snapshot). Timestamps, durations, pids, paths and trace ids are
//! normalised; everything else (names, counts, reasons, attributes, the
//! shape of each document) must stay the same byte for byte. A change that
//! means to change them rewrites the files with `MCP_RETRY_UPDATE_GOLDEN=1`
//! and shows the difference in review.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{json, Value};

use crate::otel::{exporting, Collector};
use crate::status::{status, wait_for};
use crate::util::{Builder, TempDir};

/// Keys whose values depend on the clock, the process or the machine
/// (an object under such a key, such as an OTLP `sum` metric, is looked
/// into instead).
const VOLATILE: &[&str] = &[
    "pid",
    // The store's file, in the test's temp dir.
    "place",
    "pid_start",
    "started_at_ms",
    "updated_at_ms",
    "at_ms",
    "until_ms",
    "ready_at_ms",
    "ready_after_ms",
    "latency_sum_ms",
    "p50_ms",
    "p95_ms",
    "startTimeUnixNano",
    "endTimeUnixNano",
    "timeUnixNano",
    "sum",
    "min",
    "max",
    "bucketCounts",
    "config",
    "target",
];

/// Keys whose values are random ids: each distinct value becomes a label
/// in order of appearance, so that parent links are still compared.
const IDS: &[&str] = &["traceId", "spanId", "parentSpanId"];

fn normalise(v: &mut Value, ids: &mut HashMap<String, String>) {
    match v {
        Value::Object(map) => {
            for (k, x) in map.iter_mut() {
                if VOLATILE.contains(&k.as_str()) && !x.is_null() && !x.is_object() {
                    *x = json!("<volatile>");
                } else if IDS.contains(&k.as_str()) && !x.is_null() {
                    let n = ids.len();
                    let id = x.as_str().unwrap_or_default().to_owned();
                    *x = json!(ids.entry(id).or_insert_with(|| format!("<id {n}>")).clone());
                } else {
                    normalise(x, ids);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|x| normalise(x, ids)),
        Value::String(text) => *text = elapsed_normalised(text),
        _ => {}
    }
}

/// `text` with each measured time in it ("timed out after 502ms", or
/// "after 1.0s" on a machine slow enough) normalised.
fn elapsed_normalised(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("after ") {
        out.push_str(&rest[..at + 6]);
        rest = &rest[at + 6..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let seconds = rest
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .count();
        if digits > 0 && rest[seconds..].starts_with('s') {
            out.push_str("<n>ms");
            rest = &rest[seconds + 1..];
        } else if digits > 0 && rest[digits..].starts_with("ms") {
            out.push_str("<n>");
            rest = &rest[digits..];
        }
    }
    out.push_str(rest);
    out
}

/// The Prometheus text with its pids, times and durations normalised.
fn normalise_prometheus(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let mut line = line.to_owned();
        if let Some(a) = line.find("pid=\"") {
            if let Some(len) = line[a + 5..].find('"') {
                line.replace_range(a + 5..a + 5 + len, "<pid>");
            }
        }
        let timed = [
            "start_time_seconds",
            "duration_seconds{",
            "duration_seconds_sum",
        ];
        if !line.starts_with('#') && timed.iter().any(|t| line.contains(t)) {
            if let Some(at) = line.rfind(' ') {
                line.replace_range(at + 1.., "<volatile>");
            }
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// A string attribute of a span (or `""`).
fn attribute(span: &Value, key: &str) -> String {
    span["attributes"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["key"] == key))
        .map_or_else(String::new, |x| x["value"].to_string())
}

/// Compares `actual` with the golden file `name`, or rewrites it.
fn check(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("MCP_RETRY_UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (MCP_RETRY_UPDATE_GOLDEN=1 writes it)",
            path.display()
        )
    });
    let differ: Vec<String> = expected
        .lines()
        .zip(actual.lines())
        .enumerate()
        .filter(|(_, (e, a))| e != a)
        .map(|(i, (e, a))| format!("line {}:\n  expected {e}\n  actual   {a}", i + 1))
        .take(10)
        .collect();
    assert!(
        expected == actual,
        "{} differs from what the proxy reported (MCP_RETRY_UPDATE_GOLDEN=1 rewrites it; {} lines expected, {} reported):\n{}",
        path.display(),
        expected.lines().count(),
        actual.lines().count(),
        differ.join("\n")
    );
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap() + "\n"
}

#[test]
fn the_stats_file_status_and_the_otlp_export_of_a_scripted_session_are_unchanged() {
    let collector = Collector::start();
    let runtime = TempDir::new();
    let run_dir = runtime.join("run");
    let policy = "call_timeout: 0.5\nretry:\n  base_delay: 0.01\n  jitter: 0\ncache:\n  tools:\n    ro_echo: 60";
    // Its durations are in what is compared: never scaled.
    let mut s = exporting(
        Builder::mock_with_unscaled(policy),
        Some(&collector.endpoint()),
    )
    .arg("--stats-file")
    .arg("{dir}/stats.json")
    .env("MCP_RETRY_RUNTIME_DIR", &run_dir.display().to_string())
    .initialized();
    s.list_tools();
    // A result, then the same read from the cache.
    s.call(json!(2), "ro_echo", json!({"text": "a"}));
    s.result(&json!(2));
    s.call(json!(3), "ro_echo", json!({"text": "a"}));
    s.result(&json!(3));
    // A transient error, retried and recovered.
    s.call(json!(4), "idem_echo", json!({"mode": "flaky", "text": "b"}));
    s.result(&json!(4));
    // The server's own final error.
    s.call(json!(5), "echo", json!({"mode": "error", "code": -32602}));
    s.error(&json!(5));
    // A timeout of a tool not known to be idempotent: not retried.
    s.call(json!(6), "unsafe_echo", json!({"mode": "hang"}));
    s.error(&json!(6));
    // An idempotency key, then its replay.
    let keyed = json!({"name": "echo", "arguments": {"text": "k"},
        "_meta": {"idempotencyKey": "k1"}});
    s.call_with(json!(7), keyed.clone());
    s.result(&json!(7));
    s.call_with(json!(8), keyed);
    s.result(&json!(8));

    let docs = wait_for(&run_dir, "every call in the status", |docs| {
        docs.first()
            .is_some_and(|d| d["total"]["calls"] == 7 && d["in_flight"] == 0)
    });
    let mut ids = HashMap::new();
    let mut status_json = Value::Array(docs);
    normalise(&mut status_json, &mut ids);
    let prometheus = status(&run_dir, &["--prometheus"]);
    assert_eq!(prometheus.code, 0, "{}", prometheus.stderr);

    s.close_stdin();
    assert!(s.wait().success(), "{}", s.stderr());
    let stats_path = s.dir.join("stats.json");
    let mut stats: Value =
        serde_json::from_str(&std::fs::read_to_string(&stats_path).unwrap()).unwrap();
    normalise(&mut stats, &mut ids);

    // Every span, in a stable order: by name, request, kind, then start.
    let posts = collector.posts();
    let mut spans: Vec<Value> = posts
        .iter()
        .filter(|p| p.path == "/v1/traces")
        .flat_map(|p| {
            let mut out = Vec::new();
            for rs in p.body["resourceSpans"].as_array().into_iter().flatten() {
                for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                    out.extend(ss["spans"].as_array().into_iter().flatten().cloned());
                }
            }
            out
        })
        .collect();
    spans.sort_by_key(|span| {
        (
            span["name"].to_string(),
            attribute(span, "jsonrpc.request.id"),
            span["kind"].to_string(),
            span["startTimeUnixNano"].to_string(),
        )
    });
    let mut ids = HashMap::new();
    let mut spans = Value::Array(spans);
    normalise(&mut spans, &mut ids);
    // The last metrics snapshot (the one sent at exit), sorted.
    let mut metrics = posts
        .iter()
        .rev()
        .find(|p| p.path == "/v1/metrics")
        .map(|p| p.body.clone())
        .expect("a metrics export");
    for rm in metrics["resourceMetrics"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        for sm in rm["scopeMetrics"].as_array_mut().into_iter().flatten() {
            if let Some(list) = sm["metrics"].as_array_mut() {
                list.sort_by_key(|m| m["name"].to_string());
                for m in list.iter_mut() {
                    for kind in ["sum", "histogram", "gauge"] {
                        let points = m
                            .get_mut(kind)
                            .and_then(|k| k.get_mut("dataPoints"))
                            .and_then(Value::as_array_mut);
                        if let Some(points) = points {
                            points.sort_by_key(|p| p["attributes"].to_string());
                        }
                    }
                }
            }
        }
    }
    normalise(&mut metrics, &mut ids);

    check("stats.json", &pretty(&stats));
    check("status.json", &pretty(&status_json));
    check("status.prom", &normalise_prometheus(&prometheus.stdout));
    check("otlp-spans.json", &pretty(&spans));
    check("otlp-metrics.json", &pretty(&metrics));
}
