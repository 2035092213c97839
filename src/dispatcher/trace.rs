//! The dispatcher's side of OpenTelemetry export: holds the [`Tracer`],
//! schedules the metrics flush after a change (never while idle), and ends
//! what is open at exit. The hooks themselves sit in `calls.rs` and
//! `link.rs` as one-line calls of [`Dispatcher::traced`].

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crate::otel::{CallEnd, Handle, Tracer};

use super::Dispatcher;

impl Dispatcher {
    /// Exports spans and metrics through `handle`.
    pub fn with_otel(mut self, handle: Handle) -> Dispatcher {
        let tracer = Tracer::new(&self.cfg.name, handle, self.now);
        self.reporting.trace_with(tracer);
        self
    }

    /// Runs `f` on the tracer when export is on.
    pub(super) fn traced<R>(&mut self, f: impl FnOnce(&mut Tracer) -> R) -> Option<R> {
        self.reporting.tracer().map(f)
    }

    /// Call `call` ends with an error, counted under `reason`.
    pub(super) fn trace_failed(&mut self, call: u64, reason: &'static str, now: Instant) {
        if let Some(t) = self.reporting.tracer() {
            t.call_ended(call, CallEnd::failed(reason), now);
        }
    }

    /// The open breaker refused call `call` an attempt.
    pub(super) fn trace_refused(&mut self, call: u64, retry_after: Duration, now: Instant) {
        let ms = i64::try_from(retry_after.as_millis()).unwrap_or(i64::MAX);
        let attrs = vec![("mcp_retry.retry_after_ms", ms.into())];
        self.traced(|t| t.call_event(call, "mcp_retry.breaker_refused", attrs, now));
    }

    /// Call `call` waits `delay` before retry number `retry`.
    pub(super) fn trace_backoff(&mut self, call: u64, delay: Duration, retry: u32, now: Instant) {
        let ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
        let attrs = vec![
            ("mcp_retry.delay_ms", ms.into()),
            ("mcp_retry.retry", i64::from(retry).into()),
        ];
        self.traced(|t| t.call_event(call, "mcp_retry.backoff", attrs, now));
    }

    /// After an event or timers: counters changed and no flush is due yet,
    /// so one is scheduled `otel::METRICS_INTERVAL` from now.
    pub(super) fn otel_schedule(&mut self) {
        if let Some((at, timer)) = self.reporting.otel_schedule(self.now) {
            self.set_timer(at, timer);
        }
    }

    pub(super) fn on_otel_flush_due(&mut self, now: Instant) {
        self.reporting.flush_metrics(self.calls.stats(), now);
    }

    /// The session ends: open spans and the last counters go out.
    pub(super) fn otel_finish(&mut self, now: Instant) {
        self.reporting.finish(self.calls.stats(), now);
    }
}
