//! The `otel-export` thread: takes finished span records and counter
//! snapshots from a queue bounded by count and bytes, renders them
//! (`record.rs`), encodes them (`json.rs`) and POSTs them as OTLP/JSON with
//! ureq (2 s to connect, 2 s in all per request), following no redirect: a
//! 3xx is a failed export naming the status, so the configured headers
//! (often an API key) never reach the host a collector points to.
//!
//! The dispatcher's side ([`Handle`]) never blocks: it `try_send`s, and
//! what does not fit is dropped and counted. So is what the collector did
//! not take. Either is said once on stderr, never with a header value.
//!
//! The thread sleeps in `recv` while nothing is queued. Once something
//! arrives it lets a batch gather for [`BATCH_DELAY`] (less when
//! [`BATCH`] items are queued or the proxy exits), during which sending
//! does not wake it. A collector that is down (no connection, a timeout,
//! 429 or 5xx) pauses export for a second, doubling up to 30 s while it
//! stays down: meanwhile the dispatcher drops at once, without queueing,
//! and nothing is rendered or encoded. The pause ends by itself (the
//! dispatcher's side compares its own `now` with its end), so the thread
//! sets no timer for it: after the last telemetry it sleeps for good.
//! While the collector has not taken a request yet (at start, after a
//! failure), a batch's first request carries at most [`PROBE`] spans, so
//! that a collector that is down costs the encoding of a few.

#![forbid(unsafe_code)]

use std::io;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError};

use super::record::{Clock, Record, Snapshot};
use super::{json, Endpoint, Settings};

/// Most items waiting for the exporter (each of about 300 bytes; a call's
/// record holds its span and its last attempt's).
const QUEUE_ITEMS: usize = 2048;
/// Most bytes (roughly) waiting for the exporter.
const QUEUE_BYTES: i64 = 8 * 1024 * 1024;
/// Most spans in one request; this many queued end the batch delay.
const BATCH: usize = 512;
/// Most spans in the first request while the collector is not known to
/// be up.
const PROBE: usize = 16;
/// How long a batch may gather once something arrived.
pub const BATCH_DELAY: Duration = Duration::from_millis(500);
/// Bound on each phase of a request and on all of it.
const HTTP_TIMEOUT: Duration = Duration::from_secs(2);
/// The first pause after the collector was found down, and the longest.
const PAUSE_FIRST: Duration = Duration::from_secs(1);
const PAUSE_MAX: Duration = Duration::from_secs(30);

/// The signals, each with a collector of its own (the endpoints may
/// differ), so each pauses on its own: an index into the pauses.
const TRACES: usize = 0;
const METRICS: usize = 1;

// Span records are nearly every item; boxing them would cost an
// allocation per call. The queue's slots are allocated once.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Item {
    Span(Record),
    Metrics(Box<Snapshot>),
}

impl Item {
    fn size(&self) -> usize {
        match self {
            Item::Span(r) => r.size(),
            Item::Metrics(m) => m.size(),
        }
    }

    /// The signal it belongs to: [`TRACES`] or [`METRICS`].
    fn signal(&self) -> usize {
        match self {
            Item::Span(_) => TRACES,
            Item::Metrics(_) => METRICS,
        }
    }

    /// What it counts for when it is dropped: its spans, or one snapshot.
    fn count(&self) -> u64 {
        match self {
            Item::Span(r) => r.spans_held(),
            Item::Metrics(_) => 1,
        }
    }
}

struct Shared {
    /// Roughly the bytes queued (for a moment below 0: the exporter may
    /// take an item before its sender counts it).
    bytes: AtomicI64,
    dropped: AtomicU64,
    warned: AtomicBool,
    /// Per signal: its collector is down until this many nanoseconds after
    /// `base`: drop without queueing. 0: it is not.
    paused_until: [AtomicU64; 2],
    base: Instant,
}

impl Shared {
    fn new() -> Shared {
        Shared {
            bytes: AtomicI64::new(0),
            dropped: AtomicU64::new(0),
            warned: AtomicBool::new(false),
            paused_until: [AtomicU64::new(0), AtomicU64::new(0)],
            base: Instant::now(),
        }
    }

    /// Whether export of `signal` is paused at `now`.
    fn paused_at(&self, signal: usize, now: Instant) -> bool {
        let until = self.paused_until[signal].load(Ordering::Relaxed);
        if until == 0 {
            return false;
        }
        if (now.saturating_duration_since(self.base).as_nanos() as u64) < until {
            return true;
        }
        let _ = self.paused_until[signal].compare_exchange(
            until,
            0,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        false
    }

    /// Pauses export of `signal` until `until`.
    fn pause(&self, signal: usize, until: Instant) {
        let nanos = until.saturating_duration_since(self.base).as_nanos() as u64;
        self.paused_until[signal].store(nanos.max(1), Ordering::Relaxed);
    }

    /// Export is over (its thread died): everything is dropped at once,
    /// without queueing and without another warning.
    fn stop(&self) {
        self.warned.store(true, Ordering::Relaxed);
        for until in &self.paused_until {
            until.store(u64::MAX, Ordering::Relaxed);
        }
    }

    /// Counts `n` items lost; the first loss is said on stderr.
    fn dropped(&self, n: u64, why: &str) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
        if !self.warned.load(Ordering::Relaxed) && !self.warned.swap(true, Ordering::Relaxed) {
            crate::warn!("OpenTelemetry: {why}; telemetry is dropped while this lasts (said once)");
        }
    }
}

/// The dispatcher's end of the export queue.
pub struct Handle {
    tx: Sender<Item>,
    /// Ends the exporter's batch delay early.
    wake: Sender<()>,
    shared: Arc<Shared>,
    traces: bool,
    metrics: bool,
}

impl Handle {
    /// Queues `item`, made at the dispatcher's `now`, or drops it.
    fn send(&self, item: Item, now: Instant) {
        let shared = &*self.shared;
        if shared.paused_at(item.signal(), now) {
            // Said when the collector was found down.
            shared.dropped.fetch_add(item.count(), Ordering::Relaxed);
            return;
        }
        let size = item.size() as i64;
        if shared.bytes.load(Ordering::Relaxed) + size > QUEUE_BYTES {
            return shared.dropped(item.count(), "the export queue is full");
        }
        match self.tx.try_send(item) {
            Ok(()) => {
                shared.bytes.fetch_add(size, Ordering::Relaxed);
                if self.tx.len() == BATCH {
                    let _ = self.wake.try_send(());
                }
            }
            Err(TrySendError::Full(item) | TrySendError::Disconnected(item)) => {
                shared.dropped(item.count(), "the export queue is full");
            }
        }
    }

    /// A handle whose queue the test reads (both signals on).
    #[cfg(test)]
    pub(crate) fn for_test() -> (Handle, Receiver<Item>) {
        let (tx, rx) = crossbeam_channel::bounded(QUEUE_ITEMS);
        let (wake, _) = crossbeam_channel::bounded(1);
        let handle = Handle {
            tx,
            wake,
            shared: Arc::new(Shared::new()),
            traces: true,
            metrics: true,
        };
        (handle, rx)
    }

    /// Whether traces are exported.
    pub fn traces(&self) -> bool {
        self.traces
    }

    /// Whether metrics are exported.
    pub fn metrics(&self) -> bool {
        self.metrics
    }

    /// Sends a finished span, at the dispatcher's `now`, if traces are
    /// exported.
    pub fn send_record(&self, record: Record, now: Instant) {
        if self.traces {
            self.send(Item::Span(record), now);
        }
    }

    pub fn send_metrics(&self, snapshot: Snapshot) {
        if self.metrics {
            let now = snapshot.at;
            self.send(Item::Metrics(Box::new(snapshot)), now);
        }
    }
}

/// The running exporter thread.
pub struct Exporter {
    done: Receiver<()>,
    shared: Arc<Shared>,
}

impl Exporter {
    /// Starts the `otel-export` thread.
    pub fn start(settings: Settings) -> io::Result<(Handle, Exporter)> {
        let (tx, rx) = crossbeam_channel::bounded(QUEUE_ITEMS);
        let (wake, wake_rx) = crossbeam_channel::bounded(1);
        let (done_tx, done) = crossbeam_channel::bounded(1);
        let shared = Arc::new(Shared::new());
        let handle = Handle {
            tx,
            wake,
            shared: shared.clone(),
            traces: settings.traces.is_some(),
            metrics: settings.metrics.is_some(),
        };
        let thread_shared = shared.clone();
        thread::Builder::new()
            .name("otel-export".into())
            .spawn(move || {
                if let Err(p) =
                    crate::guard::catch(|| run(&settings, &rx, &wake_rx, &thread_shared))
                {
                    p.report("OpenTelemetry export is off");
                    thread_shared.stop();
                }
                let _ = done_tx.send(());
            })?;
        Ok((handle, Exporter { done, shared }))
    }

    /// Once the dispatcher has let go of its [`Handle`]: waits at most
    /// `within` for what is queued to be sent. Returns the number of items
    /// dropped in the session.
    pub fn finish(self, within: Duration) -> u64 {
        let _ = self.done.recv_timeout(within);
        self.shared.dropped.load(Ordering::Relaxed)
    }
}

/// Whether a failed export means the collector is down (worth a pause)
/// rather than this one request refused.
fn collector_down(e: &ureq::Error) -> bool {
    match e {
        ureq::Error::StatusCode(code) => *code == 429 || *code >= 500,
        _ => true,
    }
}

/// What the thread knows of the collector: whether it took the last
/// request, and how long export pauses when it is found down.
struct Pause {
    up: bool,
    next: Duration,
    until: Option<Instant>,
}

impl Pause {
    fn new() -> Pause {
        Pause {
            up: false,
            next: PAUSE_FIRST,
            until: None,
        }
    }

    fn active(&self) -> bool {
        self.until.is_some_and(|u| Instant::now() < u)
    }
}

fn run(settings: &Settings, rx: &Receiver<Item>, wake: &Receiver<()>, shared: &Shared) {
    let timeout = crate::guard::duration("otel_http_timeout", HTTP_TIMEOUT);
    let batch_delay = crate::guard::duration("otel_batch_delay", BATCH_DELAY);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .timeout_connect(Some(timeout))
        .max_redirects(0)
        .user_agent(concat!("mcp-retry/", env!("CARGO_PKG_VERSION")))
        .build()
        .into();
    let clock = Clock::now();
    // Per signal: [`TRACES`], [`METRICS`].
    let mut pauses = [Pause::new(), Pause::new()];
    loop {
        let Ok(first) = rx.recv() else { return };
        // Let a batch gather; a full batch or the exit ends the wait.
        let _ = wake.recv_timeout(batch_delay);
        let mut spans = Vec::new();
        let mut snapshot = None;
        let mut take = |item: Item| {
            shared
                .bytes
                .fetch_sub(item.size() as i64, Ordering::Relaxed);
            match item {
                Item::Span(r) => spans.push(r),
                // Cumulative: only the newest matters.
                Item::Metrics(m) => snapshot = Some(m),
            }
        };
        take(first);
        for item in rx.try_iter().take(QUEUE_ITEMS) {
            take(item);
        }
        if let Some(endpoint) = &settings.traces {
            let mut rest = &spans[..];
            while !rest.is_empty() {
                let n = if pauses[TRACES].up { BATCH } else { PROBE };
                let (chunk, tail) = rest.split_at(n.min(rest.len()));
                rest = tail;
                let held = chunk.iter().map(Record::spans_held).sum();
                send(&agent, endpoint, TRACES, held, shared, &mut pauses, || {
                    let mut rendered = Vec::with_capacity(2 * chunk.len());
                    for r in chunk {
                        r.render(&clock, &mut rendered);
                    }
                    json::traces(&settings.resource, &rendered)
                });
            }
        }
        if let (Some(m), Some(endpoint)) = (snapshot, &settings.metrics) {
            send(&agent, endpoint, METRICS, 1, shared, &mut pauses, || {
                let (since, at) = (clock.unix_nanos(m.since), clock.unix_nanos(m.at));
                json::metrics(&settings.resource, &m.server, &m.metrics(), since, at)
            });
        }
    }
}

/// POSTs the body `encode` makes of `items` items of `signal`, unless its
/// collector is down (then they are dropped, never encoded); a failure is
/// counted, and pauses that signal's export when it says the collector is
/// down.
fn send(
    agent: &ureq::Agent,
    endpoint: &Endpoint,
    signal: usize,
    items: u64,
    shared: &Shared,
    pauses: &mut [Pause; 2],
    encode: impl FnOnce() -> Vec<u8>,
) {
    let pause = &mut pauses[signal];
    if pause.active() {
        shared.dropped.fetch_add(items, Ordering::Relaxed);
        return;
    }
    #[cfg(feature = "fault-inject")]
    crate::guard::fault::exporter();
    match post(agent, endpoint, encode()) {
        Ok(()) => {
            pause.up = true;
            pause.next = PAUSE_FIRST;
        }
        Err(e) => {
            pause.up = false;
            // The error names the URL, the status or the I/O failure,
            // never a header's value.
            let url = super::shown_url(&endpoint.url);
            shared.dropped(items, &format!("exporting to {url} failed ({e})"));
            if collector_down(&e) {
                let until = Instant::now() + pause.next;
                shared.pause(signal, until);
                pause.until = Some(until);
                pause.next = (pause.next * 2).min(PAUSE_MAX);
            }
        }
    }
}

fn post(agent: &ureq::Agent, endpoint: &Endpoint, body: Vec<u8>) -> Result<(), ureq::Error> {
    let mut req = agent
        .post(&endpoint.url)
        .header("Content-Type", "application/json");
    for (k, v) in &endpoint.headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let resp = req.send(&body[..])?;
    let status = resp.status().as_u16();
    // Read the (small) answer so the connection can be reused.
    let _ = resp.into_body().read_to_vec();
    // Not followed: the collector's headers must not go elsewhere.
    if (300..400).contains(&status) {
        return Err(ureq::Error::StatusCode(status));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::super::record::{Record, RecordKind, ShortId};
    use super::super::{CallEnd, Endpoint, Settings, SpanContext};
    use super::*;

    fn record() -> Record {
        let now = Instant::now();
        Record {
            ctx: SpanContext {
                trace_id: [1; 16],
                span_id: [2; 8],
                sampled: true,
            },
            parent: None,
            server: "s".into(),
            start: now,
            end: now,
            events: Vec::new(),
            kind: RecordKind::Call {
                tool: Arc::from("t"),
                client_id: ShortId::new("1"),
                attempts: 1,
                end: CallEnd::answered(false),
                last: None,
            },
        }
    }

    #[test]
    fn while_paused_the_handle_drops_and_counts_without_queueing_and_the_pause_ends_by_itself() {
        let (handle, rx) = Handle::for_test();
        handle
            .shared
            .pause(TRACES, Instant::now() + Duration::from_secs(3600));
        handle.send_record(record(), Instant::now());
        assert!(rx.try_recv().is_err());
        assert_eq!(handle.shared.dropped.load(Ordering::Relaxed), 1);
        // A pause whose end has passed is over at the next send, also for a
        // record that ended before the pause did (an earlier attempt's).
        let old = record();
        handle
            .shared
            .pause(TRACES, Instant::now() + Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(2));
        handle.send_record(old, Instant::now());
        assert!(rx.try_recv().is_ok());
        assert_eq!(
            handle.shared.paused_until[TRACES].load(Ordering::Relaxed),
            0
        );
        assert_eq!(handle.shared.dropped.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn each_signal_pauses_on_its_own() {
        // The metrics collector is down; spans still go to theirs.
        let (handle, rx) = Handle::for_test();
        handle
            .shared
            .pause(METRICS, Instant::now() + Duration::from_secs(3600));
        handle.send_record(record(), Instant::now());
        assert!(rx.try_recv().is_ok());
        assert_eq!(handle.shared.dropped.load(Ordering::Relaxed), 0);
        assert!(handle.shared.paused_at(METRICS, Instant::now()));
        assert!(!handle.shared.paused_at(TRACES, Instant::now()));
    }

    #[test]
    fn a_long_client_id_counts_against_the_queue_bound() {
        let short = record().size();
        let mut long = record();
        if let RecordKind::Call { client_id, .. } = &mut long.kind {
            *client_id = ShortId::new(&"9".repeat(1 << 20));
        }
        assert_eq!(long.size(), short + (1 << 20));
    }

    #[test]
    fn refusals_timeouts_429_and_5xx_mean_the_collector_is_down() {
        assert!(collector_down(&ureq::Error::StatusCode(503)));
        assert!(collector_down(&ureq::Error::StatusCode(429)));
        assert!(collector_down(&ureq::Error::Io(io::Error::from(
            io::ErrorKind::ConnectionRefused
        ))));
        assert!(!collector_down(&ureq::Error::StatusCode(400)));
        assert!(!collector_down(&ureq::Error::StatusCode(401)));
    }

    #[test]
    fn a_refused_export_pauses_export_and_is_counted() {
        // A loopback port that was free a moment ago: connections are refused.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let endpoint = Endpoint {
            url: format!("http://127.0.0.1:{port}/v1/traces"),
            headers: Vec::new(),
        };
        let settings = Settings {
            traces: Some(endpoint),
            metrics: None,
            resource: Vec::new(),
        };
        let (handle, exporter) = Exporter::start(settings).unwrap();
        handle.send_record(record(), Instant::now());
        let deadline = Instant::now() + Duration::from_secs(20);
        while !handle.shared.paused_at(TRACES, Instant::now()) {
            assert!(Instant::now() < deadline, "export never paused");
            thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(handle.shared.dropped.load(Ordering::Relaxed), 1);
        handle.send_record(record(), Instant::now());
        assert_eq!(handle.shared.dropped.load(Ordering::Relaxed), 2);
        assert_eq!(handle.shared.bytes.load(Ordering::Relaxed), 0);
        drop(handle);
        assert_eq!(exporter.finish(Duration::from_secs(20)), 2);
    }
}
