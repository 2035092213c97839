//! What the session reports beyond the protocol, as one owned type: the
//! `--stats-file` output, the `status` publisher, the OpenTelemetry
//! tracer, and when the proxy started and the server first accepted the
//! client's handshake. Each flush is scheduled after a change only: the
//! methods take `now` and return the [`Timer`] to set, if one is due, for
//! the dispatcher to set. Builds no JSON and does no I/O (the writer
//! threads and the exporter do).

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use crate::otel::{self, CallEnd, Tracer};
use crate::stats::Stats;
use crate::status::{Headline, Publisher, Snapshot};

use super::calls::Trace;
use super::Timer;

/// How often `--stats-file` is rewritten while counters change.
const STATS_INTERVAL: Duration = Duration::from_secs(3);

/// The session's reporting: stats file, `status`, OpenTelemetry.
pub(super) struct Reporting {
    /// Where `--stats-file` documents go, and whether a flush is scheduled.
    stats_out: Option<Sender<String>>,
    stats_flush_pending: bool,
    /// What `mcp-retry status` is told, if anything.
    status: Option<Publisher>,
    /// OpenTelemetry export, when on, and whether a metrics
    /// flush is scheduled.
    otel: Option<Tracer>,
    otel_flush_pending: bool,
    /// When the proxy started, and when the server first accepted the
    /// client's handshake (shown by `status`).
    started_at: Instant,
    ready_at: Option<Instant>,
}

impl Reporting {
    pub(super) fn new(now: Instant) -> Reporting {
        Reporting {
            stats_out: None,
            stats_flush_pending: false,
            status: None,
            otel: None,
            otel_flush_pending: false,
            started_at: now,
            ready_at: None,
        }
    }

    /// Sends the `--stats-file` document to `out`.
    pub(super) fn stats_to(&mut self, out: Sender<String>) {
        self.stats_out = Some(out);
    }

    /// Publishes the session's state through `out` (see `status.rs`).
    pub(super) fn status_to(&mut self, out: Sender<Snapshot>) {
        self.status = Some(Publisher::new(out));
    }

    /// Exports spans and metrics with `tracer`.
    pub(super) fn trace_with(&mut self, tracer: Tracer) {
        self.otel = Some(tracer);
    }

    /// The tracer, when export is on.
    pub(super) fn tracer(&mut self) -> Option<&mut Tracer> {
        self.otel.as_mut()
    }

    pub(super) fn tracing(&self) -> bool {
        self.otel.is_some()
    }

    /// The proxy starts now.
    pub(super) fn started(&mut self, now: Instant) {
        self.started_at = now;
    }

    pub(super) fn started_at(&self) -> Instant {
        self.started_at
    }

    /// The server accepted the client's handshake (the first time counts).
    pub(super) fn ready(&mut self, now: Instant) {
        self.ready_at.get_or_insert(now);
    }

    pub(super) fn ready_at(&self) -> Option<Instant> {
        self.ready_at
    }

    /// Counters changed: the status and the stats file are out of date,
    /// and so are the exporter's figures. The timers to set, in order.
    pub(super) fn counters_changed(&mut self, now: Instant) -> [Option<(Instant, Timer)>; 2] {
        let status = self.status_dirty(now);
        if let Some(t) = &mut self.otel {
            t.figures_changed();
        }
        let mut stats = None;
        if self.stats_out.is_some() && !self.stats_flush_pending {
            self.stats_flush_pending = true;
            stats = Some((now + STATS_INTERVAL, Timer::StatsFlush));
        }
        [status, stats]
    }

    /// `Timer::StatsFlush` (or the exit): hands `stats` to the stats file's
    /// writer.
    pub(super) fn flush_stats(&mut self, stats: &Stats, server: &str) {
        self.stats_flush_pending = false;
        if let Some(out) = &self.stats_out {
            let _ = out.send(stats.to_json(server));
        }
    }

    /// Whether `status` is told anything.
    pub(super) fn publishing(&self) -> bool {
        self.status.is_some()
    }

    /// After an event or timer: whether `headline` moved since the last
    /// one seen, so that a publish is due (its timer, if one is not set).
    pub(super) fn status_check(
        &mut self,
        headline: Headline,
        now: Instant,
    ) -> Option<(Instant, Timer)> {
        let publisher = self.status.as_mut()?;
        if publisher.last_headline == Some(headline) {
            return None;
        }
        publisher.last_headline = Some(headline);
        self.status_dirty(now)
    }

    /// Something published changed: write it within a second (at most one
    /// write a second).
    pub(super) fn status_dirty(&mut self, now: Instant) -> Option<(Instant, Timer)> {
        let publisher = self.status.as_mut()?;
        if publisher.pending {
            return None;
        }
        publisher.pending = true;
        Some((publisher.due(now), Timer::StatusPublish))
    }

    /// `Timer::StatusPublish`: hands the snapshot to the writer.
    pub(super) fn publish(
        &mut self,
        headline: Headline,
        message: Option<String>,
        stats: &Stats,
        now: Instant,
    ) {
        let Some(publisher) = self.status.as_mut() else {
            return;
        };
        publisher.last_headline = Some(headline);
        if !publisher.send(headline, message, stats, now) {
            crate::debug!("the status writer is gone; no more status updates");
            self.status = None;
        }
    }

    /// After an event or timers: counters changed and no flush is due yet,
    /// so one is scheduled [`otel::METRICS_INTERVAL`] from now.
    pub(super) fn otel_schedule(&mut self, now: Instant) -> Option<(Instant, Timer)> {
        if self.otel_flush_pending || !self.otel.as_ref().is_some_and(Tracer::metrics_changed) {
            return None;
        }
        self.otel_flush_pending = true;
        Some((now + otel::METRICS_INTERVAL, Timer::OtelFlush))
    }

    /// `Timer::OtelFlush`: the counters go to the exporter.
    pub(super) fn flush_metrics(&mut self, stats: &Stats, now: Instant) {
        self.otel_flush_pending = false;
        if let Some(t) = &mut self.otel {
            t.flush_metrics(stats, now);
        }
    }

    /// The session ends: open spans and the last counters go out.
    pub(super) fn finish(&mut self, stats: &Stats, now: Instant) {
        if let Some(t) = &mut self.otel {
            t.finish(stats, now);
        }
    }

    /// Hands what the calls report to the tracer, if export is on.
    pub(super) fn trace(&mut self, t: Trace, now: Instant) {
        let Some(tracer) = &mut self.otel else {
            return;
        };
        match t {
            // Its span needs what the calls hold of it: the dispatcher's.
            Trace::CallStarted { .. } => {}
            Trace::AnsweredByProxy(a) => {
                tracer.answered_by_proxy(&a.tool, &a.client, a.client_context, a.end, now);
            }
            Trace::Joined { call } => tracer.joined(call, now),
            Trace::AttemptEnded { call, failure } => tracer.attempt_ended(call, failure, now),
            Trace::CancelledDownstream { call } => {
                let name = "mcp_retry.cancelled_downstream";
                tracer.attempt_event(call, name, Vec::new(), now);
            }
            Trace::CallEnded { call, end } => tracer.call_ended(call, end, now),
            Trace::CallFailed { call, reason } => {
                tracer.call_ended(call, CallEnd::failed(reason), now)
            }
            Trace::BreakerRefused { call, retry_after } => {
                let ms = i64::try_from(retry_after.as_millis()).unwrap_or(i64::MAX);
                let attrs = vec![("mcp_retry.retry_after_ms", ms.into())];
                tracer.call_event(call, "mcp_retry.breaker_refused", attrs, now);
            }
            Trace::Backoff { call, delay, retry } => {
                let ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
                let attrs = vec![
                    ("mcp_retry.delay_ms", ms.into()),
                    ("mcp_retry.retry", i64::from(retry).into()),
                ];
                tracer.call_event(call, "mcp_retry.backoff", attrs, now);
            }
        }
    }
}
