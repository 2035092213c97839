//! The dispatcher's side of OpenTelemetry export: holds the [`Tracer`],
//! schedules the metrics flush after a change (never while idle), and ends
//! what is open at exit. The hooks themselves sit in `calls.rs` and
//! `link.rs` as one-line calls of [`Dispatcher::traced`].

#![forbid(unsafe_code)]

use std::time::Instant;

use crate::otel::{Handle, Tracer};

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
