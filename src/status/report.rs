//! The `status` command: reads the documents the running proxies publish
//! (`status.rs`), prunes those of processes that are gone, and prints a
//! table, a JSON array or the Prometheus text format, once or every few
//! seconds (`--watch`).
//!
//! The store of idempotency keys and the calls whose outcome is unknown
//! are `status/keys.rs`'s part.
//!
//! The exit code tells scripts whether something is wrong: 1 when a
//! breaker is open or a server is down (or dormant), else 0. Reads and
//! removes files only in the runtime directory, and reads only regular
//! files there, opened without blocking (a FIFO named like a document
//! cannot hang it) and at most [`MAX_DOCUMENT`] bytes of each; prints on
//! stdout.

#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::fs;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::keys::{self, StoreView};
use super::{Document, ToolDoc, VERSION};

/// The largest status document read (a proxy writes at most 200 tools,
/// far less than this); a larger file is skipped.
pub const MAX_DOCUMENT: u64 = 4 << 20;

/// One live proxy's document.
#[derive(Debug, Clone)]
pub struct Live {
    pub doc: Document,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
/// How `status` prints what it read.
pub enum StatusFormat {
    #[default]
    Table,
    Json,
    Prometheus,
}

#[derive(Debug, Default, PartialEq)]
/// What `status` is asked to show (from the command line).
pub struct StatusOptions {
    pub format: StatusFormat,
    /// Redraw this often (`--watch`).
    pub watch: Option<Duration>,
    /// The runtime directory (`--dir`), else the default.
    pub dir: Option<PathBuf>,
    /// The store to read (`--store`), else `MCP_RETRY_STORE`, else `local`.
    pub store: Option<String>,
}

pub fn run(args: StatusOptions) -> Result<ExitCode> {
    let dir = super::runtime_dir(args.dir.as_deref());
    let mut out = std::io::stdout();
    let clear = args.watch.is_some() && out.is_terminal();
    let choice = keys::choice(args.store.as_deref());
    loop {
        let now = now_ms();
        let live = collect(&dir)?;
        let limit = match args.format {
            StatusFormat::Json => keys::JSON_UNKNOWNS,
            _ => keys::TABLE_UNKNOWNS,
        };
        let store = keys::view(&choice, &live, limit, now);
        let text = match args.format {
            StatusFormat::Table => table(&live, now, &dir, &store),
            StatusFormat::Json => json(&live, &store),
            StatusFormat::Prometheus => prometheus(&live, now, &store),
        };
        let Some(every) = args.watch else {
            out.write_all(text.as_bytes())?;
            let bad = live.iter().any(|l| is_bad(&l.doc, now));
            return Ok(ExitCode::from(u8::from(bad)));
        };
        if clear {
            // Home, clear the screen.
            out.write_all(b"\x1b[H\x1b[2J")?;
        }
        out.write_all(text.as_bytes())?;
        if !clear {
            out.write_all(b"\n")?;
        }
        out.flush()?;
        std::thread::sleep(every);
    }
}

fn now_ms() -> u64 {
    crate::store::host_ms()
}

// ----- collecting -------------------------------------------------------------

/// What is known of the process a document names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// `kill(pid, 0)` found it (or it is someone else's).
    pub exists: bool,
    /// Its start time in clock ticks after boot, where `/proc` says.
    pub start: Option<u64>,
}

/// Whether the proxy that wrote a document claiming start time `claimed`
/// is still the process with its pid: a pid reused by another process has
/// another start time.
pub fn is_live(claimed: Option<u64>, probe: Probe) -> bool {
    match (claimed, probe) {
        (_, Probe { exists: false, .. }) => false,
        (Some(c), Probe { start: Some(s), .. }) => c == s,
        _ => true,
    }
}

fn probe(pid: u32) -> Probe {
    Probe {
        exists: super::process_exists(pid),
        start: super::start_ticks(pid),
    }
}

/// The pid in a file name `<pid>.json` or `.<pid>.json.tmp`.
fn pid_of_name(name: &str) -> Option<(u32, bool)> {
    if let Some(tmp) = name.strip_prefix('.') {
        return Some((tmp.strip_suffix(".json.tmp")?.parse().ok()?, true));
    }
    Some((name.strip_suffix(".json")?.parse().ok()?, false))
}

/// The documents of the proxies that are running, worst first. Files of
/// processes that are gone are removed. A missing directory holds none; one
/// that is not ours and private is an error.
pub fn collect(dir: &Path) -> Result<Vec<Live>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    if let Err(why) = crate::private_files::check_dir(dir) {
        bail!("refusing to read the runtime directory {why}");
    }
    let now = now_ms();
    let mut live = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((pid, tmp)) = pid_of_name(&name) else {
            continue;
        };
        let path = entry.path();
        if tmp {
            // Left by a proxy killed while writing.
            if !probe(pid).exists {
                let _ = fs::remove_file(&path);
            }
            continue;
        }
        if !entry.file_type().is_ok_and(|t| t.is_file()) {
            crate::warn!("skipped {}: not a regular file", path.display());
            continue;
        }
        let text = match read_document(&path) {
            Ok(Some(t)) => t,
            Ok(None) => {
                crate::warn!(
                    "skipped {}: not a regular file of at most {} bytes",
                    path.display(),
                    MAX_DOCUMENT
                );
                continue;
            }
            // Removed by its proxy meanwhile.
            Err(_) => continue,
        };
        let parsed = serde_json::from_str::<Document>(&text).ok();
        let Some(l) = parsed
            .filter(|d| d.version == VERSION)
            .map(|doc| Live { doc })
        else {
            crate::warn!(
                "skipped {}: not a status document of this version",
                path.display()
            );
            continue;
        };
        if !is_live(l.doc.pid_start, probe(l.doc.pid)) {
            crate::debug!("removed {}: process {} is gone", path.display(), l.doc.pid);
            let _ = fs::remove_file(&path);
            continue;
        }
        live.push(l);
    }
    sort(&mut live, now);
    Ok(live)
}

/// The text of the document at `path`: opened without blocking and
/// without following a link (a FIFO or device put there in its place
/// cannot hang the command), read only if it is a regular file, at most
/// [`MAX_DOCUMENT`] bytes. `None` if it is not such a file.
fn read_document(path: &Path) -> std::io::Result<Option<String>> {
    let mut options = fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW);
    }
    let file = options.open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() || meta.len() > MAX_DOCUMENT {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    file.take(MAX_DOCUMENT + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_DOCUMENT {
        return Ok(None);
    }
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

// ----- judging ---------------------------------------------------------------------

/// The breaker as it stands at `now`: an open breaker whose cooldown is
/// over lets the next call through as a trial, so it shows as half-open.
pub fn breaker_at(doc: &Document, now: u64) -> &str {
    match (doc.breaker.state.as_str(), doc.breaker.until_ms) {
        ("open", Some(until)) if until <= now => "half-open",
        (s, _) => s,
    }
}

/// A breaker is open or the server is down (or dormant): exit code 1.
pub fn is_bad(doc: &Document, now: u64) -> bool {
    breaker_at(doc, now) == "open" || matches!(doc.link.state.as_str(), "down" | "dormant")
}

/// 0 for the worst (down, dormant, breaker open), 1 for a server coming
/// back (starting, restarting, half-open), 2 for up.
pub fn rank(doc: &Document, now: u64) -> u8 {
    if is_bad(doc, now) {
        0
    } else if doc.link.state != "up" || breaker_at(doc, now) != "closed" {
        1
    } else {
        2
    }
}

pub fn sort(live: &mut [Live], now: u64) {
    live.sort_by(|a, b| {
        (rank(&a.doc, now), &a.doc.server, a.doc.pid).cmp(&(
            rank(&b.doc, now),
            &b.doc.server,
            b.doc.pid,
        ))
    });
}

// ----- formatting ---------------------------------------------------------------------

/// `42s`, `12m05s`, `3h12m`, `2d04h`.
pub fn fmt_age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// `0.4ms`, `12ms`, `1.5s`, `-` when nothing was measured.
pub fn fmt_latency(ms: Option<f64>) -> String {
    match ms {
        None => "-".into(),
        Some(ms) if ms < 10.0 => format!("{ms:.1}ms"),
        Some(ms) if ms < 1000.0 => format!("{ms:.0}ms"),
        Some(ms) => format!("{:.1}s", ms / 1000.0),
    }
}

/// The first `max` characters of `s` on one line, with `…` if cut.
pub fn one_line(s: &str, max: usize) -> String {
    let flat: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    match flat.char_indices().nth(max.saturating_sub(1)) {
        Some((i, _)) if flat.chars().count() > max => format!("{}…", &flat[..i]),
        _ => flat,
    }
}

/// `s` on one line in at most `max` characters: when longer, its end (where
/// an error message says the cause) after `…`, from the start of a word.
fn tail_line(s: &str, max: usize) -> String {
    let flat: Vec<char> = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.len() <= max {
        return flat.into_iter().collect();
    }
    let mut from = flat.len() - max.saturating_sub(1);
    if flat[from - 1] != ' ' {
        // The rest of a cut word only if no word starts in the next 12.
        from += flat[from..]
            .iter()
            .take(12)
            .position(|c| *c == ' ')
            .map_or(0, |p| p + 1);
    }
    std::iter::once('…')
        .chain(flat[from..].iter().copied())
        .collect()
}

/// What a failed call's message says went wrong. The proxy's own messages
/// (`tool "NAME" timed out after 5s; gave up after 4 attempts …`) say it
/// first, and what was done about it after the first `; ` or ` and ` outside
/// parentheses: that part is dropped, and so is the `tool "NAME"` the column
/// shows already. Any other message (a server's) is kept whole.
fn cause<'m>(tool: &str, message: &'m str) -> &'m str {
    let Some(ours) = message.strip_prefix(&format!("tool \"{tool}\" ")) else {
        return message;
    };
    let mut depth = 0usize;
    for (i, c) in ours.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            _ if depth == 0 && (ours[i..].starts_with("; ") || ours[i..].starts_with(" and ")) => {
                return &ours[..i];
            }
            _ => {}
        }
    }
    ours
}

/// The most recent error of any tool, as `tool: cause` in at most
/// [`LAST_ERROR_WIDTH`] characters: a longer cause keeps its end, where a
/// message says what went wrong, not its start.
fn last_error(doc: &Document) -> Option<String> {
    doc.tools
        .iter()
        .filter_map(|(name, t)| t.last_error.as_ref().map(|e| (e.at_ms, name, &e.message)))
        .max_by_key(|(at, _, _)| *at)
        .map(|(_, tool, message)| {
            let tool_text = one_line(tool, LAST_ERROR_WIDTH / 2);
            let room = LAST_ERROR_WIDTH.saturating_sub(tool_text.chars().count() + 2);
            format!("{tool_text}: {}", tail_line(cause(tool, message), room))
        })
}

/// Most characters of LAST ERROR in the table.
const LAST_ERROR_WIDTH: usize = 60;

const COLUMNS: [&str; 12] = [
    "SERVER",
    "PID",
    "STATE",
    "BREAKER",
    "UPTIME",
    "RESTARTS",
    "CALLS",
    "RETRIED",
    "RECOVERED",
    "FAILED",
    "P95",
    "LAST ERROR",
];

/// Columns aligned to the right (numbers).
const RIGHT: [bool; 12] = [
    false, true, false, false, true, true, true, true, true, true, true, false,
];

fn row(doc: &Document, now: u64) -> [String; 12] {
    let state = match (doc.link.state.as_str(), doc.link.until_ms) {
        ("restarting", Some(until)) if until > now => {
            format!("restarting {}", fmt_age(until - now + 999))
        }
        (s, _) => s.to_owned(),
    };
    // A session begun from the handshake cache says so, and when its
    // server caught up.
    let state = match (doc.handshake.from_cache, doc.handshake.ready_after_ms) {
        (true, Some(ms)) => format!(
            "{state} (cached start, ready in {})",
            fmt_latency(Some(ms as f64))
        ),
        (true, None) => format!("{state} (cached start)"),
        _ => state,
    };
    let breaker = match (breaker_at(doc, now), doc.breaker.until_ms) {
        ("open", Some(until)) => format!("open {}", fmt_age(until - now + 999)),
        (b, _) => b.to_owned(),
    };
    let t = &doc.total;
    [
        doc.server.clone(),
        doc.pid.to_string(),
        state,
        breaker,
        fmt_age(now.saturating_sub(doc.started_at_ms)),
        doc.restarts.to_string(),
        t.calls.to_string(),
        t.retried.to_string(),
        t.recovered.to_string(),
        t.failed.to_string(),
        fmt_latency(t.p95_ms),
        last_error(doc).unwrap_or_else(|| "-".into()),
    ]
}

/// The aligned table, one line per proxy, then the store and the keyed
/// calls whose outcome is unknown, if any.
pub fn table(live: &[Live], now: u64, dir: &Path, store: &StoreView) -> String {
    let mut out = if live.is_empty() {
        format!(
            "no mcp-retry proxy is running (nothing in {})\n",
            dir.display()
        )
    } else {
        let header = COLUMNS.map(str::to_owned);
        let rows: Vec<[String; 12]> = std::iter::once(header)
            .chain(live.iter().map(|l| row(&l.doc, now)))
            .collect();
        aligned(&rows, &RIGHT)
    };
    out.push_str(&keys::table(store, live, now));
    out
}

/// `rows` as lines of columns two spaces apart, each as wide as its
/// widest cell; numbers (`right`) aligned to the right.
pub(super) fn aligned<const N: usize>(rows: &[[String; N]], right: &[bool; N]) -> String {
    let mut widths = [0usize; N];
    for r in rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, cell) in r.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let pad = widths[i] - cell.chars().count();
            if right[i] {
                line.extend(std::iter::repeat_n(' ', pad));
                line.push_str(cell);
            } else if i + 1 < r.len() {
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', pad));
            } else {
                line.push_str(cell);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `{"proxies": [documents], "store": {...}, "unknown_outcomes": [...],
/// "unknown_outcomes_truncated": false}`.
pub fn json(live: &[Live], store: &StoreView) -> String {
    let docs: Vec<&Document> = live.iter().map(|l| &l.doc).collect();
    let value = serde_json::json!({
        "proxies": docs,
        "store": keys::StoreJson::of(&store.health),
        "unknown_outcomes": store.unknowns,
        "unknown_outcomes_truncated": store.more,
    });
    let mut s = serde_json::to_string_pretty(&value).unwrap_or_else(|_| "{}".into());
    s.push('\n');
    s
}

/// A label value in the Prometheus text format: `\`, `"` and newlines
/// escaped.
pub fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn labels(pairs: &[(&str, &str)]) -> String {
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

/// One metric family: its HELP and TYPE lines and its samples.
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    samples: Vec<(String, String)>,
}

impl Family {
    fn new(name: &'static str, kind: &'static str, help: &'static str) -> Family {
        Family {
            name,
            kind,
            help,
            samples: Vec::new(),
        }
    }
    fn add(&mut self, suffix: &str, labels: String, value: impl std::fmt::Display) {
        self.samples
            .push((format!("{}{suffix}{labels}", self.name), value.to_string()));
    }
}

/// Reads one counter of a tool.
type Counter = fn(&ToolDoc) -> u64;

/// Seconds from milliseconds, for Prometheus: to the microsecond, without
/// the noise of binary fractions (`0.000288`, not `0.00028799999999999995`).
pub fn secs(ms: f64) -> String {
    let s = format!("{:.6}", ms / 1000.0);
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_owned()
}

/// The same figures as the table, in the Prometheus text exposition format
/// (for node_exporter's textfile collector).
pub fn prometheus(live: &[Live], now: u64, store: &StoreView) -> String {
    let mut up = Family::new(
        "mcp_retry_up",
        "gauge",
        "Whether the proxy's server is up and ready (1) or not (0).",
    );
    let mut state = Family::new(
        "mcp_retry_link_state",
        "gauge",
        "The state of the server link: 1 for the current state.",
    );
    let mut open = Family::new(
        "mcp_retry_breaker_open",
        "gauge",
        "Whether the circuit breaker is open (1) or not (0).",
    );
    let mut started = Family::new(
        "mcp_retry_start_time_seconds",
        "gauge",
        "When the proxy started, in seconds since the UNIX epoch.",
    );
    let mut restarts = Family::new(
        "mcp_retry_restarts_total",
        "counter",
        "Times the server was started again.",
    );
    let mut in_flight = Family::new(
        "mcp_retry_calls_in_flight",
        "gauge",
        "tools/call requests not answered yet.",
    );
    let mut counters: Vec<(Family, Counter)> = vec![
        (
            Family::new(
                "mcp_retry_calls_total",
                "counter",
                "tools/call requests received.",
            ),
            |t| t.calls,
        ),
        (
            Family::new(
                "mcp_retry_attempts_total",
                "counter",
                "Attempts sent to the server (first attempts and retries).",
            ),
            |t| t.attempts,
        ),
        (
            Family::new(
                "mcp_retry_retried_total",
                "counter",
                "Calls that needed a retry.",
            ),
            |t| t.retried,
        ),
        (
            Family::new(
                "mcp_retry_recovered_total",
                "counter",
                "Retried calls that ended with a result.",
            ),
            |t| t.recovered,
        ),
        (
            Family::new(
                "mcp_retry_cache_hits_total",
                "counter",
                "Calls answered from the cache.",
            ),
            |t| t.cache_hits,
        ),
        (
            Family::new(
                "mcp_retry_dedup_hits_total",
                "counter",
                "Calls that joined or replayed an identical call.",
            ),
            |t| t.dedup_hits,
        ),
    ];
    let mut failed = Family::new(
        "mcp_retry_failed_total",
        "counter",
        "Calls answered with an error, by reason (server_error: the server's own error).",
    );
    let mut duration = Family::new(
        "mcp_retry_call_duration_seconds",
        "summary",
        "Time from a call's arrival to its answer, for calls the server was asked to handle.",
    );
    let mut store_events = Family::new(
        "mcp_retry_store_events_total",
        "counter",
        "What the store of idempotency keys did for a proxy: operations, replays, waits, unknown_answers.",
    );
    let mut store_up = Family::new(
        "mcp_retry_store_up",
        "gauge",
        "Whether the store of idempotency keys answered status (1) or not (0).",
    );
    let mut store_outage = Family::new(
        "mcp_retry_store_outage",
        "gauge",
        "Whether the proxy's shared store (Redis) is unreachable (1: keyed calls use the local store or are refused, as store_unavailable says) or not (0).",
    );
    let mut store_records = Family::new(
        "mcp_retry_store_records",
        "gauge",
        "Records the store of idempotency keys holds.",
    );
    let mut unknown = Family::new(
        "mcp_retry_unknown_outcomes",
        "gauge",
        "Keyed calls whose outcome is unknown and whose keys are held (at most as many as status lists).",
    );
    let engine = labels(&[("engine", store.health.engine)]);
    store_up.add("", engine.clone(), u8::from(store.health.reachable));
    if let Some(n) = store.health.records {
        store_records.add("", engine.clone(), n);
    }
    unknown.add("", engine, store.unknowns.len());
    for l in live {
        let d = &l.doc;
        let pid = d.pid.to_string();
        let server = labels(&[("server", &d.server), ("pid", &pid)]);
        up.add("", server.clone(), u8::from(d.link.state == "up"));
        for s in ["up", "starting", "restarting", "dormant", "down"] {
            let l = labels(&[("server", &d.server), ("pid", &pid), ("state", s)]);
            state.add("", l, u8::from(d.link.state == s));
        }
        open.add("", server.clone(), u8::from(breaker_at(d, now) == "open"));
        started.add("", server.clone(), secs(d.started_at_ms as f64));
        restarts.add("", server.clone(), d.restarts);
        in_flight.add("", server, d.in_flight);
        for (tool, t) in &d.tools {
            let tl = labels(&[("server", &d.server), ("pid", &pid), ("tool", tool)]);
            for (family, get) in &mut counters {
                family.add("", tl.clone(), get(t));
            }
            for (reason, n) in &t.failed_by_reason {
                let rl = labels(&[
                    ("server", &d.server),
                    ("pid", &pid),
                    ("tool", tool),
                    ("reason", reason),
                ]);
                failed.add("", rl, n);
            }
            for (q, v) in [("0.5", t.p50_ms), ("0.95", t.p95_ms)] {
                let ql = labels(&[
                    ("server", &d.server),
                    ("pid", &pid),
                    ("tool", tool),
                    ("quantile", q),
                ]);
                match v {
                    Some(ms) => duration.add("", ql, secs(ms)),
                    None => duration.add("", ql, "NaN"),
                }
            }
            duration.add("_sum", tl.clone(), secs(t.latency_sum_ms));
            duration.add("_count", tl, t.latency_count);
        }
        if let Some(s) = &d.store {
            for (event, n) in [
                ("operations", s.operations),
                ("replays", s.replays),
                ("waits", s.waits),
                ("unknown_answers", s.unknown_answers),
            ] {
                let l = labels(&[("server", &d.server), ("pid", &pid), ("event", event)]);
                store_events.add("", l, n);
            }
            let l = labels(&[("server", &d.server), ("pid", &pid)]);
            store_outage.add("", l, u8::from(s.state == "outage"));
        }
    }
    let families = [up, state, open, started, restarts, in_flight]
        .into_iter()
        .chain(counters.into_iter().map(|(f, _)| f))
        .chain([
            failed,
            duration,
            store_events,
            store_outage,
            store_up,
            store_records,
            unknown,
        ]);
    let mut out = String::new();
    for f in families {
        let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
        let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
        for (series, value) in &f.samples {
            let _ = writeln!(out, "{series} {value}");
        }
    }
    out
}

/// The `--watch` interval for `seconds`, if it is between 0.1 s and a day.
pub fn interval(seconds: f64) -> Option<Duration> {
    (0.1..=86_400.0)
        .contains(&seconds)
        .then(|| Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::status::{BreakerDoc, ErrorDoc, LinkDoc};

    const NOW: u64 = 1_000_000_000;

    fn doc(server: &str, pid: u32, link: &str, breaker: &str) -> Document {
        Document {
            version: VERSION,
            server: server.into(),
            config: None,
            pid,
            pid_start: None,
            transport: "stdio".into(),
            target: vec!["x".into()],
            started_at_ms: NOW - 125_000,
            updated_at_ms: NOW,
            restarts: 0,
            handshake: Default::default(),
            link: LinkDoc {
                state: link.into(),
                until_ms: None,
                message: None,
            },
            breaker: BreakerDoc {
                state: breaker.into(),
                until_ms: (breaker == "open").then_some(NOW + 42_000),
            },
            in_flight: 0,
            total: ToolDoc::default(),
            tools: BTreeMap::new(),
            unknown_outcomes: Vec::new(),
            store: None,
        }
    }

    fn live(d: Document) -> Live {
        Live { doc: d }
    }

    /// The store's part, read from nothing (`memory`).
    fn no_store() -> StoreView {
        keys::view("memory", &[], 10, NOW)
    }

    #[test]
    fn a_session_begun_from_the_cache_says_so_and_when_its_server_was_ready() {
        let mut d = doc("slow", 7, "starting", "closed");
        assert_eq!(row(&d, NOW)[2], "starting");
        d.handshake.from_cache = true;
        assert_eq!(row(&d, NOW)[2], "starting (cached start)");
        d.link.state = "up".into();
        d.handshake.ready_after_ms = Some(5_012);
        assert_eq!(row(&d, NOW)[2], "up (cached start, ready in 5.0s)");
        // Not begun from the cache: the state alone.
        d.handshake.from_cache = false;
        assert_eq!(row(&d, NOW)[2], "up");
    }

    #[test]
    fn the_worst_state_comes_first() {
        let mut l = vec![
            live(doc("a-up", 1, "up", "closed")),
            live(doc("b-restarting", 2, "restarting", "closed")),
            live(doc("c-open", 3, "up", "open")),
            live(doc("d-dormant", 4, "dormant", "open")),
            live(doc("e-half", 5, "up", "half-open")),
            live(doc("f-down", 6, "down", "closed")),
        ];
        sort(&mut l, NOW);
        let order: Vec<&str> = l.iter().map(|l| l.doc.server.as_str()).collect();
        assert_eq!(
            order,
            [
                "c-open",
                "d-dormant",
                "f-down",
                "b-restarting",
                "e-half",
                "a-up"
            ]
        );
        assert!(is_bad(&l[0].doc, NOW));
        assert!(!is_bad(&l[3].doc, NOW));
        // Once the cooldown is over the next call is a trial: half-open,
        // no longer bad.
        let open = doc("c", 3, "up", "open");
        assert_eq!(breaker_at(&open, NOW + 41_999), "open");
        assert_eq!(breaker_at(&open, NOW + 42_000), "half-open");
        assert!(!is_bad(&open, NOW + 42_000));
    }

    #[test]
    fn a_dead_or_reused_pid_is_not_live() {
        let p = |exists, start| Probe { exists, start };
        assert!(is_live(Some(7), p(true, Some(7))));
        assert!(!is_live(Some(7), p(true, Some(8))), "reused pid");
        assert!(!is_live(Some(7), p(false, None)));
        assert!(!is_live(None, p(false, None)));
        // No /proc (or someone else's process): the pid alone decides.
        assert!(is_live(Some(7), p(true, None)));
        assert!(is_live(None, p(true, Some(9))));
        assert_eq!(pid_of_name("123.json"), Some((123, false)));
        assert_eq!(pid_of_name(".123.json.tmp"), Some((123, true)));
        assert_eq!(pid_of_name("notes.json"), None);
        assert_eq!(pid_of_name("123.json.bak"), None);
        assert!(!probe(0).exists);
        assert!(!probe(u32::MAX).exists);
        assert!(probe(std::process::id()).exists);
    }

    #[test]
    fn durations_and_latencies_read_well() {
        assert_eq!(fmt_age(0), "0s");
        assert_eq!(fmt_age(59_999), "59s");
        assert_eq!(fmt_age(125_000), "2m05s");
        assert_eq!(fmt_age(3_600_000 * 3 + 60_000 * 12), "3h12m");
        assert_eq!(fmt_age(86_400_000 * 2 + 3_600_000 * 4), "2d04h");
        assert_eq!(fmt_latency(None), "-");
        assert_eq!(fmt_latency(Some(0.42)), "0.4ms");
        assert_eq!(fmt_latency(Some(12.4)), "12ms");
        assert_eq!(fmt_latency(Some(1530.0)), "1.5s");
        assert_eq!(one_line("a\nb", 10), "a b");
        assert_eq!(one_line("abcdef", 4), "abc…");
        assert_eq!(one_line("abcd", 4), "abcd");
        assert_eq!(tail_line("a\nb", 10), "a b");
        assert_eq!(tail_line("abcd", 4), "abcd");
        assert_eq!(tail_line("abcdef", 4), "…def");
        // From the start of a word when one is near.
        assert_eq!(tail_line("could not connect: refused", 12), "…refused");
        assert_eq!(tail_line("could not connect: refused", 8), "…refused");
        assert_eq!(tail_line("could not connect: refused", 16), "…refused");
        assert_eq!(
            tail_line("could not connect: refused", 17),
            "…connect: refused"
        );
        assert_eq!(tail_line("x abcdefghijklmnopq", 8), "…klmnopq");
    }

    #[test]
    fn last_error_keeps_the_cause_at_the_end() {
        let mut d = doc("py", 7, "up", "closed");
        let failed = |message: &str| ToolDoc {
            last_error: Some(ErrorDoc {
                message: message.into(),
                at_ms: NOW,
            }),
            ..ToolDoc::default()
        };
        d.tools.insert(
            "search".into(),
            failed(
                "Error executing tool search: request to https://api.example.com/v1/search \
                 failed: ConnectionRefusedError: [Errno 111] Connection refused",
            ),
        );
        let e = last_error(&d).unwrap();
        assert!(e.chars().count() <= LAST_ERROR_WIDTH, "{e}");
        assert!(e.starts_with("search: …"), "{e}");
        assert!(e.ends_with("Error: [Errno 111] Connection refused"), "{e}");
        // The proxy's own messages: the cause, not what was done about it,
        // and `tool "search"` is not repeated after `search:`.
        let ours = |message: &str| {
            let mut d = d.clone();
            d.tools.insert("search".into(), failed(message));
            last_error(&d).unwrap()
        };
        assert_eq!(
            ours(
                "tool \"search\" timed out after 5s; gave up after 4 attempts (retry.max_retries)"
            ),
            "search: timed out after 5s"
        );
        assert_eq!(
            ours(
                "tool \"search\" lost its server before answering (the MCP server \"/opt/srv\" \
                 (pid 30043) exited with status 3; its stderr said: out of memory) and was not \
                 retried: it is not known to be idempotent (set tools.search.idempotent: true if \
                 it is); it may or may not have run"
            ),
            "search: …with status 3; its stderr said: out of memory)"
        );
        assert_eq!(
            ours("tool \"search\" failed with transient error -32000 (retries are off: retry.max_retries is 0)"),
            "search: …-32000 (retries are off: retry.max_retries is 0)"
        );
    }

    #[test]
    fn the_table_is_aligned_and_says_what_is_wrong() {
        let mut bad = doc("github", 4242, "dormant", "open");
        bad.total.calls = 12;
        bad.total.failed = 3;
        bad.total.p95_ms = Some(1530.0);
        bad.tools.insert(
            "search".into(),
            ToolDoc {
                last_error: Some(ErrorDoc {
                    message: "the server exited\nwith code 1".into(),
                    at_ms: NOW - 5,
                }),
                ..ToolDoc::default()
            },
        );
        let mut ok = doc("fs", 17, "restarting", "closed");
        ok.link.until_ms = Some(NOW + 2_500);
        ok.restarts = 2;
        let text = table(&[live(bad), live(ok)], NOW, Path::new("/d"), &no_store());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        assert_eq!(
            lines[4], "store: memory each process's own memory",
            "{text}"
        );
        assert!(lines[0].starts_with("SERVER  "), "{text}");
        assert!(lines[1].starts_with("github  4242  dormant"), "{text}");
        assert!(lines[1].contains("open 42s"), "{text}");
        assert!(
            lines[1].ends_with("1.5s  search: the server exited with code 1"),
            "{text}"
        );
        assert!(lines[2].contains("restarting 3s"), "{text}");
        assert!(lines[2].contains("2m05s"), "{text}");
        // Every column starts at the same place on every line.
        let at = |line: &str, word: &str| line.find(word).unwrap();
        assert_eq!(at(lines[0], "BREAKER"), at(lines[1], "open"));
        assert_eq!(at(lines[0], "BREAKER"), at(lines[2], "closed"));
        assert_eq!(
            at(lines[0], "LAST ERROR"),
            at(lines[1], "search:"),
            "{text}"
        );
        assert_eq!(
            table(&[], NOW, Path::new("/d"), &no_store()),
            "no mcp-retry proxy is running (nothing in /d)\n\nstore: memory each process's own memory\n"
        );
    }

    #[test]
    fn prometheus_labels_are_escaped_and_families_grouped() {
        assert_eq!(escape_label(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape_label("x\ny"), "x\\ny");
        let mut d = doc("we\"ird", 9, "up", "open");
        d.tools.insert(
            "t".into(),
            ToolDoc {
                calls: 3,
                failed: 1,
                failed_by_reason: [("timeout".to_string(), 1)].into(),
                latency_count: 2,
                latency_sum_ms: 1500.0,
                p50_ms: Some(500.0),
                p95_ms: Some(1000.0),
                ..ToolDoc::default()
            },
        );
        d.store = Some(crate::status::StoreDoc {
            engine: "local".into(),
            state: "opened".into(),
            replays: 2,
            ..Default::default()
        });
        let text = prometheus(&[live(d)], NOW, &no_store());
        let server = r#"server="we\"ird",pid="9""#;
        for want in [
            format!("mcp_retry_up{{{server}}} 1"),
            format!("mcp_retry_breaker_open{{{server}}} 1"),
            format!(r#"mcp_retry_link_state{{{server},state="up"}} 1"#),
            format!(r#"mcp_retry_calls_total{{{server},tool="t"}} 3"#),
            format!(r#"mcp_retry_failed_total{{{server},tool="t",reason="timeout"}} 1"#),
            format!(r#"mcp_retry_call_duration_seconds{{{server},tool="t",quantile="0.95"}} 1"#),
            format!(r#"mcp_retry_call_duration_seconds_sum{{{server},tool="t"}} 1.5"#),
            format!(r#"mcp_retry_call_duration_seconds_count{{{server},tool="t"}} 2"#),
            format!(r#"mcp_retry_store_events_total{{{server},event="replays"}} 2"#),
            r#"mcp_retry_store_up{engine="memory"} 1"#.to_owned(),
            r#"mcp_retry_unknown_outcomes{engine="memory"} 0"#.to_owned(),
        ] {
            assert!(text.lines().any(|l| l == want), "no {want} in\n{text}");
        }
        // Each family once, its samples right after its TYPE line.
        let mut family = "";
        let mut seen = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                family = rest.split(' ').next().unwrap();
                assert!(!seen.contains(&family), "{family} twice");
                seen.push(family);
            } else if !line.starts_with('#') {
                assert!(line.starts_with(family), "{line} outside {family}");
            }
        }
    }

    #[test]
    fn seconds_are_printed_without_float_noise() {
        assert_eq!(secs(0.288), "0.000288");
        assert_eq!(secs(61.44), "0.06144");
        assert_eq!(secs(1_796_139_043_840.0), "1796139043.84");
        assert_eq!(secs(2000.0), "2");
        assert_eq!(secs(0.0), "0");
    }

    #[test]
    fn watch_intervals_are_bounded() {
        assert_eq!(interval(2.0), Some(Duration::from_secs(2)));
        assert_eq!(interval(0.0), None);
        assert_eq!(interval(f64::NAN), None);
    }
}
