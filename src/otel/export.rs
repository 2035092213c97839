//! The `otel-export` thread: takes finished spans and metric snapshots from
//! a queue bounded by count and bytes, and POSTs them as OTLP/JSON with
//! ureq (2 s to connect, 2 s in all per request).
//!
//! The dispatcher's side ([`Handle`]) never blocks: it `try_send`s, and
//! what does not fit is dropped and counted. So is what the collector did
//! not take. Either is said once on stderr, never with a header value.
//! The thread sleeps in `recv` while nothing is queued.

#![forbid(unsafe_code)]

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TrySendError};

use super::{json, Settings, Span};

/// Most items waiting for the exporter.
const QUEUE_ITEMS: usize = 4096;
/// Most bytes (roughly) waiting for the exporter.
const QUEUE_BYTES: usize = 8 * 1024 * 1024;
/// Most spans in one request.
const BATCH: usize = 512;
/// Bound on each phase of a request and on all of it.
const HTTP_TIMEOUT: Duration = Duration::from_secs(2);

pub(crate) enum Item {
    Span(Span),
    Metrics(String),
}

impl Item {
    fn size(&self) -> usize {
        match self {
            Item::Span(s) => s.size(),
            Item::Metrics(m) => m.len(),
        }
    }
}

#[derive(Default)]
struct Shared {
    bytes: AtomicUsize,
    dropped: AtomicU64,
    warned: AtomicBool,
}

impl Shared {
    /// Counts `n` items lost; the first loss is said on stderr.
    fn dropped(&self, n: u64, why: &str) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
        if !self.warned.swap(true, Ordering::Relaxed) {
            crate::warn!("OpenTelemetry: {why}; telemetry is dropped while this lasts (said once)");
        }
    }
}

/// The dispatcher's end of the export queue.
pub struct Handle {
    tx: Sender<Item>,
    shared: Arc<Shared>,
    traces: bool,
    metrics: bool,
    pub(super) resource: Arc<Vec<(String, String)>>,
}

impl Handle {
    fn send(&self, item: Item) {
        let size = item.size();
        let queued = self.shared.bytes.fetch_add(size, Ordering::Relaxed);
        if queued + size > QUEUE_BYTES {
            self.shared.bytes.fetch_sub(size, Ordering::Relaxed);
            return self.shared.dropped(1, "the export queue is full");
        }
        match self.tx.try_send(item) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.shared.bytes.fetch_sub(size, Ordering::Relaxed);
                self.shared.dropped(1, "the export queue is full");
            }
        }
    }

    /// A handle whose queue the test reads (both signals on).
    #[cfg(test)]
    pub(crate) fn for_test(resource: Vec<(String, String)>) -> (Handle, Receiver<Item>) {
        let (tx, rx) = crossbeam_channel::bounded(QUEUE_ITEMS);
        let handle = Handle {
            tx,
            shared: Arc::default(),
            traces: true,
            metrics: true,
            resource: Arc::new(resource),
        };
        (handle, rx)
    }

    /// Sends `span` if traces are exported and it is sampled (a client
    /// whose `traceparent` says "not sampled" decides for its calls).
    pub fn send_span(&self, span: Span) {
        if self.traces && span.ctx.sampled {
            self.send(Item::Span(span));
        }
    }

    pub fn send_metrics(&self, body: String) {
        if self.metrics {
            self.send(Item::Metrics(body));
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
        let (done_tx, done) = crossbeam_channel::bounded(1);
        let shared = Arc::new(Shared::default());
        let resource = Arc::new(settings.resource.clone());
        let handle = Handle {
            tx,
            shared: shared.clone(),
            traces: settings.traces.is_some(),
            metrics: settings.metrics.is_some(),
            resource: resource.clone(),
        };
        let thread_shared = shared.clone();
        thread::Builder::new()
            .name("otel-export".into())
            .spawn(move || {
                run(&settings, &resource, &rx, &thread_shared);
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

fn run(settings: &Settings, resource: &[(String, String)], rx: &Receiver<Item>, shared: &Shared) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(HTTP_TIMEOUT))
        .timeout_connect(Some(HTTP_TIMEOUT))
        .user_agent(concat!("mcp-retry/", env!("CARGO_PKG_VERSION")))
        .build()
        .into();
    while let Ok(first) = rx.recv() {
        let mut spans = Vec::new();
        let mut snapshot = None;
        let mut take = |item: Item| {
            shared.bytes.fetch_sub(item.size(), Ordering::Relaxed);
            match item {
                Item::Span(s) => spans.push(s),
                // Cumulative: only the newest matters.
                Item::Metrics(m) => snapshot = Some(m),
            }
        };
        take(first);
        for _ in 1..BATCH {
            match rx.try_recv() {
                Ok(item) => take(item),
                Err(_) => break,
            }
        }
        if let (false, Some(url)) = (spans.is_empty(), &settings.traces) {
            let body = json::traces(resource, &spans);
            post(
                &agent,
                url,
                &settings.headers,
                body,
                spans.len() as u64,
                shared,
            );
        }
        if let (Some(body), Some(url)) = (snapshot, &settings.metrics) {
            post(&agent, url, &settings.headers, body, 1, shared);
        }
    }
}

fn post(
    agent: &ureq::Agent,
    url: &str,
    headers: &[(String, String)],
    body: String,
    items: u64,
    shared: &Shared,
) {
    let mut req = agent.post(url).header("Content-Type", "application/json");
    for (k, v) in headers {
        req = req.header(k.as_str(), v.as_str());
    }
    match req.send(body.as_bytes()) {
        Ok(resp) => {
            // Read the (small) answer so the connection can be reused.
            let _ = resp.into_body().read_to_vec();
        }
        // The error names the URL, the status or the I/O failure, never a
        // header's value.
        Err(e) => {
            let url = super::shown_url(url);
            shared.dropped(items, &format!("exporting to {url} failed ({e})"));
        }
    }
}
