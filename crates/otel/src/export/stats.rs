//! The exporter's counters ([`ExportStats`]), a copy of them at one moment
//! ([`ExportStatsSnapshot`]) and their Prometheus metrics.

use super::*;

/// Counters of the exporter, shared with whoever renders statistics.
#[derive(Debug, Default)]
pub struct ExportStats {
    /// Spans accepted into the queue.
    pub enqueued: AtomicU64,
    /// Spans the endpoint accepted.
    pub exported: AtomicU64,
    /// Spans dropped because the queue was full.
    pub dropped_queue_full: AtomicU64,
    /// Spans dropped at shutdown (or after it): the endpoint could not take them in time.
    pub dropped_shutdown: AtomicU64,
    /// Spans dropped after [`ExportConfig::max_attempts`] failed attempts.
    pub dropped_retries: AtomicU64,
    /// Spans the receiver refused for good (a request it will never take, or rejected spans
    /// of a partial success).
    pub rejected: AtomicU64,
    /// Spans the tail sampler left out (counted by the caller through
    /// [`ExportStats::record_sampled_out`]).
    pub sampled_out: AtomicU64,
    /// Export requests that failed (each is retried unless the failure is final).
    pub export_failures: AtomicU64,
    /// Spans accepted and not yet delivered or dropped (queued, or in a request in flight).
    pub in_flight: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportStatsSnapshot {
    /// See [`ExportStats::enqueued`].
    pub enqueued: u64,
    /// See [`ExportStats::exported`].
    pub exported: u64,
    /// See [`ExportStats::dropped_queue_full`].
    pub dropped_queue_full: u64,
    /// See [`ExportStats::dropped_shutdown`].
    pub dropped_shutdown: u64,
    /// See [`ExportStats::dropped_retries`].
    pub dropped_retries: u64,
    /// See [`ExportStats::rejected`].
    pub rejected: u64,
    /// See [`ExportStats::sampled_out`].
    pub sampled_out: u64,
    /// See [`ExportStats::export_failures`].
    pub export_failures: u64,
    /// Spans waiting in the queue now.
    pub queued: u64,
    /// See [`ExportStats::in_flight`].
    pub in_flight: u64,
}

impl ExportStatsSnapshot {
    /// Every dropped span, whatever the reason (sampling is not a drop).
    pub fn dropped(&self) -> u64 {
        self.dropped_queue_full + self.dropped_shutdown + self.dropped_retries + self.rejected
    }

    /// Adds the counters to a metrics registry, under the names the deploy/ dashboard reads:
    /// `msgtrail_otel_spans_exported_total`, `msgtrail_otel_spans_dropped_total{reason}`,
    /// `msgtrail_otel_spans_sampled_out_total`, `msgtrail_otel_export_failures_total`,
    /// `msgtrail_otel_queue_spans` and `msgtrail_otel_in_flight_spans`. The values are this
    /// snapshot's: register a fresh snapshot into a fresh registry for each scrape.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "msgtrail_otel_spans_exported",
            "Spans the OTLP endpoint accepted",
            counter(self.exported),
        );
        let dropped = Family::<[(&'static str, &'static str); 1], Counter>::default();
        for (reason, v) in [
            ("queue_full", self.dropped_queue_full),
            ("shutdown", self.dropped_shutdown),
            ("retries", self.dropped_retries),
            ("rejected", self.rejected),
        ] {
            dropped.get_or_create(&[("reason", reason)]).inc_by(v);
        }
        registry.register(
            "msgtrail_otel_spans_dropped",
            "Spans dropped before export",
            dropped,
        );
        registry.register(
            "msgtrail_otel_spans_sampled_out",
            "Healthy spans the tail sampler left out",
            counter(self.sampled_out),
        );
        registry.register(
            "msgtrail_otel_export_failures",
            "OTLP export calls that failed and were retried",
            counter(self.export_failures),
        );
        registry.register(
            "msgtrail_otel_queue_spans",
            "Spans waiting in the export queue",
            gauge(self.queued),
        );
        registry.register(
            "msgtrail_otel_in_flight_spans",
            "Spans accepted and not yet exported or dropped: queued, being batched or in requests",
            gauge(self.in_flight),
        );
    }

    /// The counters of [`ExportStatsSnapshot::register`] alone, in the Prometheus text format
    /// (version 0.0.4).
    pub fn render_prometheus(&self) -> String {
        let mut registry = Registry::default();
        self.register(&mut registry);
        let mut s = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut s, &registry);
        s
    }
}

/// A counter holding `v`.
pub(super) fn counter(v: u64) -> Counter {
    let c = Counter::default();
    c.inc_by(v);
    c
}

/// A gauge holding `v` (saturating at `i64::MAX`).
pub(super) fn gauge(v: u64) -> Gauge {
    let g = Gauge::default();
    g.set(i64::try_from(v).unwrap_or(i64::MAX));
    g
}

impl ExportStats {
    /// Counts spans the tail sampler left out.
    pub fn record_sampled_out(&self, spans: u64) {
        self.sampled_out.fetch_add(spans, Ordering::Relaxed);
    }
}
