//! OTLP export that never blocks ingest: a bounded queue in front of one worker that batches
//! spans, builds OTLP requests itself ([`crate::otlp`]: one request, one `ResourceSpans` per
//! `service.name`) and keeps several of them in flight ([`crate::transport`]).
//!
//! ## The contract
//!
//! In the manner of opentelemetry-rust's `SpanExporter`:
//!
//! - [`ExportHandle::try_export`] never blocks and never fails: it `try_send`s each span into
//!   a bounded channel of [`ExportConfig::queue_capacity`] spans. A span that does not fit is
//!   dropped and counted ([`ExportStats::dropped_queue_full`]); after shutdown began, in
//!   [`ExportStats::dropped_shutdown`]. It may be called from any thread, concurrently.
//! - Every accepted span ends in exactly one counter: [`ExportStats::exported`] (the
//!   receiver acknowledged the request), [`ExportStats::rejected`] (the receiver refused it
//!   for good: HTTP 4xx other than 429, a gRPC code that is not retryable, or a partial
//!   success naming rejected spans), [`ExportStats::dropped_retries`] (still failing after
//!   [`ExportConfig::max_attempts`]) or [`ExportStats::dropped_shutdown`]. Until then it is
//!   counted in [`ExportStats::in_flight`].
//! - Delivery is at least once: a request that timed out after the receiver took it is sent
//!   again. Backends tolerate that (same trace and span IDs). Spans of one trace may arrive
//!   in any order and in different requests.
//! - A failed request is retried with exponential backoff ([`ExportConfig::initial_backoff`]
//!   doubling to [`ExportConfig::max_backoff`], each pause less up to a fifth at random:
//!   `msgtrail_core::Backoff`); while the endpoint is down, spans pile up in
//!   the queue until the bound, then new ones are dropped with a count; when it returns, the
//!   backlog goes out.
//! - A receiver that throttles (HTTP 429/503 with `Retry-After`, gRPC with `RetryInfo` in
//!   the status details) is waited for as long as it asks, at most a minute, instead of the
//!   backoff, as the OTLP specification asks.
//! - Memory is bounded: at most `queue_capacity` spans queued, plus
//!   [`ExportConfig::max_in_flight`] requests of at most [`ExportConfig::batch_limit`] spans
//!   each (bodies of at most [`ExportConfig::max_request_bytes`] before compression), plus
//!   the one batch the worker fills while it waits for a request to finish. A batch never
//!   holds more than `queue_capacity / (max_in_flight + 1)` spans, so a small queue bound
//!   keeps everything held under twice that bound (a user who sets 500 holds at most
//!   1,000 spans, not 500 plus four requests of 2,048).
//! - [`TraceExporter::shutdown`] stops taking spans, sends what is queued with one attempt
//!   per request within a grace period, and counts what it could not send in
//!   [`ExportStats::dropped_shutdown`]. Nothing is exported after it returns.
//!
//! ## Why not the SDK's `BatchSpanProcessor` and `opentelemetry-otlp`
//!
//! The SDK's pipeline is built for spans a `Tracer` records live: one `Resource` per
//! provider (so one exporter per `service.name`, one request per service per batch), one
//! export at a time per processor, drops reported only as internal logs, and no way to
//! retry. msgtrail maps finished hops of many services after the fact, with IDs and times of
//! its own; it needs many resources per request, several requests in flight, and counters.
//! So it uses `opentelemetry-proto` and its own small worker, and keeps the SDK only for the
//! `SpanData` type, the span-to-protobuf conversion and the resource detection.
//!
//! ## Configuration
//!
//! The standard variables, read by [`ExportConfig::from_env`]:
//! `OTEL_EXPORTER_OTLP_PROTOCOL` / `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` (`grpc`,
//! `http/protobuf` — the default — or `http/json`), `OTEL_EXPORTER_OTLP_ENDPOINT` (for
//! HTTP, `/v1/traces` is appended) / `…_TRACES_ENDPOINT` (used as it is), `…_HEADERS`,
//! `…_TIMEOUT` (milliseconds), `…_COMPRESSION` (`gzip` or `none`), `OTEL_RESOURCE_ATTRIBUTES`,
//! and `OTEL_SERVICE_NAME` for the broker's spans. Endpoints are `http://` (no TLS built
//! in: export to a local collector).
//!
//! ## The parts
//!
//! [`TraceExporter`] and its [`ExportHandle`] live here; `config` reads the configuration,
//! `stats` counts every span's end, and `worker` batches, sends and retries.

use crate::error::ConfigError;
use crate::mapping::{ServiceSpan, DEFAULT_BROKER_SERVICE};
use crate::otlp::{Body, Encoding, Group, Resources};
use crate::transport::Transport;
use msgtrail_core::Backoff;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

mod config;
mod stats;
mod worker;
pub use config::*;
pub use stats::*;
use worker::*;

/// One hop of an accepted export request: the span's `messaging.message.id` and
/// `msgtrail.hop.key` attributes (what [`ExportHandle::on_exported`] reports).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportedHop {
    /// The message ID (`messaging.message.id`).
    pub message_id: String,
    /// The hop key (`msgtrail.hop.key`).
    pub hop_key: String,
}

impl ExportedHop {
    /// The hop of a msgtrail span; `None` for a span without both attributes.
    fn of(span: &opentelemetry_sdk::trace::SpanData) -> Option<Self> {
        let attr = |key: &str| {
            span.attributes
                .iter()
                .find(|kv| kv.key.as_str() == key)
                .map(|kv| kv.value.as_str().into_owned())
        };
        Some(ExportedHop {
            message_id: attr(opentelemetry_semantic_conventions::attribute::MESSAGING_MESSAGE_ID)?,
            hop_key: attr(crate::mapping::HOP_KEY)?,
        })
    }
}

/// Called with the hops of each request the receiver accepted whole (every span of it), on
/// the exporter's task: it must not block.
pub type ExportedHook = Arc<dyn Fn(Vec<ExportedHop>) + Send + Sync>;

/// The hook every handle of one exporter shares, set once.
#[derive(Clone, Default)]
pub(crate) struct ExportedHookCell(Arc<std::sync::OnceLock<ExportedHook>>);

impl ExportedHookCell {
    fn get(&self) -> Option<&ExportedHook> {
        self.0.get()
    }
}

impl std::fmt::Debug for ExportedHookCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "ExportedHookCell(set)"
        } else {
            "ExportedHookCell(none)"
        })
    }
}

/// A cheap, cloneable handle that enqueues spans.
#[derive(Debug, Clone)]
pub struct ExportHandle {
    tx: mpsc::Sender<ServiceSpan>,
    stats: Arc<ExportStats>,
    exported: ExportedHookCell,
}

impl ExportHandle {
    /// From now on, tells `hook` the hops of every request the receiver accepted whole (a
    /// request partly rejected, failed or dropped is not reported); `false` when a hook was
    /// set already (it is kept). A listener group uses it to record which hops its primary
    /// exported, so that a member taking the partition over does not export them again.
    pub fn on_exported(&self, hook: ExportedHook) -> bool {
        self.exported.0.set(hook).is_ok()
    }

    /// Enqueues spans without waiting; returns how many were accepted. Spans that do not
    /// fit are dropped and counted.
    pub fn try_export(&self, spans: impl IntoIterator<Item = ServiceSpan>) -> usize {
        let mut accepted = 0;
        for span in spans {
            match self.tx.try_send(span) {
                Ok(()) => accepted += 1,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    self.stats
                        .dropped_queue_full
                        .fetch_add(1, Ordering::Relaxed);
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    self.stats.dropped_shutdown.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        self.stats
            .enqueued
            .fetch_add(accepted as u64, Ordering::Relaxed);
        self.stats
            .in_flight
            .fetch_add(accepted as u64, Ordering::Relaxed);
        accepted
    }

    /// The shared counters.
    pub fn stats(&self) -> &Arc<ExportStats> {
        &self.stats
    }

    /// The counters now, with the queue length.
    pub fn snapshot(&self) -> ExportStatsSnapshot {
        let s = &self.stats;
        ExportStatsSnapshot {
            enqueued: s.enqueued.load(Ordering::Relaxed),
            exported: s.exported.load(Ordering::Relaxed),
            dropped_queue_full: s.dropped_queue_full.load(Ordering::Relaxed),
            dropped_shutdown: s.dropped_shutdown.load(Ordering::Relaxed),
            dropped_retries: s.dropped_retries.load(Ordering::Relaxed),
            rejected: s.rejected.load(Ordering::Relaxed),
            sampled_out: s.sampled_out.load(Ordering::Relaxed),
            export_failures: s.export_failures.load(Ordering::Relaxed),
            queued: (self.tx.max_capacity() - self.tx.capacity()) as u64,
            in_flight: s.in_flight.load(Ordering::Relaxed),
        }
    }
}

/// The running exporter: a handle plus its worker task.
///
/// ```no_run
/// # async fn demo(t: msgtrail_core::trajectory::Trajectory) -> Result<(), msgtrail_otel::ConfigError> {
/// use msgtrail_otel::{trajectory_spans, ExportConfig, MappingOptions, TraceExporter};
/// use std::time::Duration;
///
/// let config = ExportConfig::from_env()?;
/// let opts = MappingOptions { broker_service: config.broker_service.clone(), now: None };
/// let exporter = TraceExporter::start(config)?;
/// exporter.handle().try_export(trajectory_spans(&t, &opts));
/// exporter.shutdown(Duration::from_secs(5)).await;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TraceExporter {
    handle: ExportHandle,
    closing: CancellationToken,
    worker: JoinHandle<()>,
}

impl TraceExporter {
    /// Validates the configuration (endpoint, headers), builds the client and starts the
    /// worker. Must be called within a tokio runtime. Connecting is lazy: an endpoint that is
    /// down is not an error here.
    pub fn start(config: ExportConfig) -> Result<Self, ConfigError> {
        let transport = Transport::new(&config)?;
        let (tx, rx) = mpsc::channel(config.queue_capacity.max(1));
        let stats = Arc::new(ExportStats::default());
        let closing = CancellationToken::new();
        let exported = ExportedHookCell::default();
        let shared = Arc::new(Shared {
            config,
            stats: stats.clone(),
            transport,
            exported: exported.clone(),
        });
        let worker = tokio::spawn(run(rx, shared, closing.clone()));
        Ok(TraceExporter {
            handle: ExportHandle {
                tx,
                stats,
                exported,
            },
            closing,
            worker,
        })
    }

    /// A handle to enqueue spans from anywhere.
    pub fn handle(&self) -> ExportHandle {
        self.handle.clone()
    }

    /// Enqueues spans (see [`ExportHandle::try_export`]).
    pub fn try_export(&self, spans: impl IntoIterator<Item = ServiceSpan>) -> usize {
        self.handle.try_export(spans)
    }

    /// The counters now.
    pub fn snapshot(&self) -> ExportStatsSnapshot {
        self.handle.snapshot()
    }

    /// Stops taking spans, sends what is queued (one attempt per request) within `grace`,
    /// and returns the final counters; see the contract in the module docs.
    pub async fn shutdown(self, grace: Duration) -> ExportStatsSnapshot {
        self.closing.cancel();
        let mut worker = self.worker;
        if tokio::time::timeout(grace, &mut worker).await.is_err() {
            // Aborting the worker drops its JoinSet, which aborts the requests in flight.
            worker.abort();
            let _ = worker.await;
        }
        // What the worker did not get to, or held when it was cut, is lost with it.
        let stats = &self.handle.stats;
        let lost = stats.in_flight.swap(0, Ordering::Relaxed);
        stats.dropped_shutdown.fetch_add(lost, Ordering::Relaxed);
        self.handle.snapshot()
    }
}
