//! OTLP export that never blocks ingest: a bounded queue in front of one OTLP
//! `SpanExporter` per `service.name`, with retry and backoff, and every drop counted.
//!
//! - [`TraceExporter::try_export`] only ever `try_send`s into a bounded channel of
//!   [`ExportConfig::queue_capacity`] spans: when it is full the span is dropped and counted
//!   ([`ExportStats::dropped_queue_full`]).
//! - One worker task takes up to [`ExportConfig::max_batch`] spans, groups them by
//!   `service.name`, and hands each group to that service's exporter (DESIGN.md §3b: one
//!   exporter carries one `Resource`). A failed export is retried with exponential backoff
//!   ([`ExportConfig::initial_backoff`] doubling to [`ExportConfig::max_backoff`]) and is not
//!   dropped: while the endpoint is down, spans pile up in the queue until the bound, then
//!   new ones are dropped with a count; when it returns, the backlog goes out.
//! - [`TraceExporter::shutdown`] drains what is queued with one attempt per batch within a
//!   grace period; what cannot be sent is counted in [`ExportStats::dropped_shutdown`].
//!
//! The transport and the endpoint follow the standard variables (read by
//! [`ExportConfig::from_env`] and by opentelemetry-otlp itself): `OTEL_EXPORTER_OTLP_PROTOCOL`
//! / `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` (`grpc` or `http/protobuf`, the default),
//! `OTEL_EXPORTER_OTLP_ENDPOINT` / `…_TRACES_ENDPOINT`, `…_HEADERS`, `…_TIMEOUT`,
//! `…_COMPRESSION` (`gzip`), `OTEL_RESOURCE_ATTRIBUTES`, and `OTEL_SERVICE_NAME` for the
//! broker's spans.

use crate::error::ConfigError;
use crate::mapping::{ServiceSpan, DEFAULT_BROKER_SERVICE};
use opentelemetry_otlp::{RetryPolicy, WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};
use opentelemetry_sdk::Resource;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// `OTEL_EXPORTER_OTLP_PROTOCOL`.
pub const ENV_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
/// `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` (wins over [`ENV_PROTOCOL`]).
pub const ENV_TRACES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";
/// `OTEL_SERVICE_NAME`: the broker's `service.name`.
pub const ENV_SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
/// Bound of the export queue, in spans.
pub const ENV_QUEUE_CAPACITY: &str = "MSGTRAIL_OTEL_QUEUE_SPANS";

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC (tonic), default port 4317.
    Grpc,
    /// OTLP/HTTP with protobuf bodies, default port 4318.
    HttpProtobuf,
}

/// Everything the exporter needs; [`ExportConfig::default`] holds every default.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportConfig {
    /// The transport (default: HTTP/protobuf, as the OpenTelemetry spec says).
    pub protocol: Protocol,
    /// The endpoint; `None` leaves it to `OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT` or the
    /// exporter's default (`http://localhost:4317` or `http://localhost:4318/v1/traces`).
    /// For HTTP this is the full URL including `/v1/traces`.
    pub endpoint: Option<String>,
    /// Per-export timeout; `None` leaves it to `OTEL_EXPORTER_OTLP_TIMEOUT` (10 s default).
    pub timeout: Option<Duration>,
    /// Request compression; `None` leaves it to `OTEL_EXPORTER_OTLP_COMPRESSION` (`gzip`
    /// is supported; none by default).
    pub compression: Option<opentelemetry_otlp::Compression>,
    /// `service.name` of the broker's spans (from `OTEL_SERVICE_NAME`).
    pub broker_service: String,
    /// Bound of the queue, in spans (default 20,000).
    pub queue_capacity: usize,
    /// Most spans per export call (default 512).
    pub max_batch: usize,
    /// How long the worker waits to fill a batch once it has a span (default 200 ms).
    pub batch_delay: Duration,
    /// First retry delay after a failed export (default 100 ms).
    pub initial_backoff: Duration,
    /// Longest retry delay (default 5 s).
    pub max_backoff: Duration,
    /// Attempts per batch before it is dropped and counted in
    /// [`ExportStats::dropped_retries`] (default 60, about five minutes at the longest
    /// backoff): an endpoint that refuses a batch for good must not stall the queue.
    pub max_attempts: u32,
    /// Most exporters (distinct `service.name`s) kept open at once (default 64); beyond it
    /// the least recently used one is closed.
    pub max_services: usize,
}

impl Default for ExportConfig {
    fn default() -> Self {
        ExportConfig {
            protocol: Protocol::HttpProtobuf,
            endpoint: None,
            timeout: None,
            compression: None,
            broker_service: DEFAULT_BROKER_SERVICE.to_owned(),
            queue_capacity: 20_000,
            max_batch: 512,
            batch_delay: Duration::from_millis(200),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            max_attempts: 60,
            max_services: 64,
        }
    }
}

impl ExportConfig {
    /// The defaults overridden by the standard variables (see the module docs) and
    /// [`ENV_QUEUE_CAPACITY`].
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Like [`ExportConfig::from_env`], reading variables through `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut c = ExportConfig::default();
        let proto = get(ENV_TRACES_PROTOCOL)
            .map(|v| (ENV_TRACES_PROTOCOL, v))
            .or_else(|| get(ENV_PROTOCOL).map(|v| (ENV_PROTOCOL, v)));
        if let Some((name, v)) = proto {
            c.protocol = match v.trim() {
                "grpc" => Protocol::Grpc,
                "http/protobuf" => Protocol::HttpProtobuf,
                _ => {
                    return Err(ConfigError::invalid(
                        name,
                        &v,
                        "grpc or http/protobuf (http/json is not supported)",
                    ))
                }
            };
        }
        if let Some(s) = get(ENV_SERVICE_NAME).filter(|s| !s.trim().is_empty()) {
            c.broker_service = s.trim().to_owned();
        }
        if let Some(v) = get(ENV_QUEUE_CAPACITY) {
            c.queue_capacity =
                v.trim().parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                    ConfigError::invalid(ENV_QUEUE_CAPACITY, &v, "a positive number")
                })?;
        }
        Ok(c)
    }

    /// Sets the endpoint and timeout, when configured, on either transport's builder.
    fn endpoint_and_timeout<B: WithExportConfig>(&self, mut b: B) -> B {
        if let Some(e) = &self.endpoint {
            b = b.with_endpoint(e.clone());
        }
        if let Some(t) = self.timeout {
            b = b.with_timeout(t);
        }
        b
    }

    /// Builds the OTLP exporter of one `service.name`.
    pub fn build_exporter(
        &self,
        service_name: &str,
    ) -> Result<opentelemetry_otlp::SpanExporter, ConfigError> {
        let mut exporter = match self.protocol {
            Protocol::Grpc => {
                // Retries are the worker's (backoff without limit while the endpoint is down,
                // prompt shutdown), not the exporter's.
                let mut b = self.endpoint_and_timeout(
                    opentelemetry_otlp::SpanExporter::builder()
                        .with_tonic()
                        .with_retry_policy(RetryPolicy::disabled()),
                );
                if let Some(c) = self.compression {
                    b = b.with_compression(c);
                }
                b.build()?
            }
            Protocol::HttpProtobuf => {
                let mut b = self.endpoint_and_timeout(
                    opentelemetry_otlp::SpanExporter::builder()
                        .with_http()
                        .with_retry_policy(RetryPolicy::disabled())
                        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary),
                );
                if let Some(c) = self.compression {
                    b = b.with_compression(c);
                }
                b.build()?
            }
        };
        // Resource::builder() also applies OTEL_RESOURCE_ATTRIBUTES; the service name given
        // here wins over OTEL_SERVICE_NAME, which names only the broker.
        exporter.set_resource(
            &Resource::builder()
                .with_service_name(service_name.to_owned())
                .build(),
        );
        Ok(exporter)
    }
}

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
    /// Spans the tail sampler left out (counted by the caller through
    /// [`ExportStats::record_sampled_out`]).
    pub sampled_out: AtomicU64,
    /// Export calls that failed (each is retried).
    pub export_failures: AtomicU64,
    /// Spans accepted and not yet delivered or dropped (queued, or held by the worker).
    pub in_flight: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
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
    /// See [`ExportStats::sampled_out`].
    pub sampled_out: u64,
    /// See [`ExportStats::export_failures`].
    pub export_failures: u64,
    /// Spans waiting in the queue now.
    pub queued: u64,
    /// See [`ExportStats::in_flight`].
    pub in_flight: u64,
}

impl StatsSnapshot {
    /// Every dropped span, whatever the reason (sampling is not a drop).
    pub fn dropped(&self) -> u64 {
        self.dropped_queue_full + self.dropped_shutdown + self.dropped_retries
    }

    /// The counters in Prometheus text format, under the names the deploy/ dashboard reads:
    /// `msgtrail_otel_spans_exported_total`, `msgtrail_otel_spans_dropped_total{reason}`,
    /// `msgtrail_otel_spans_sampled_out_total`, `msgtrail_otel_export_failures_total`,
    /// `msgtrail_otel_queue_spans`.
    pub fn render_prometheus(&self) -> String {
        let mut s = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, lines: &[(&str, u64)]| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, v) in lines {
                let _ = writeln!(s, "{name}{labels} {v}");
            }
        };
        metric(
            "msgtrail_otel_spans_exported_total",
            "counter",
            "Spans the OTLP endpoint accepted.",
            &[("", self.exported)],
        );
        metric(
            "msgtrail_otel_spans_dropped_total",
            "counter",
            "Spans dropped before export.",
            &[
                ("{reason=\"queue_full\"}", self.dropped_queue_full),
                ("{reason=\"shutdown\"}", self.dropped_shutdown),
                ("{reason=\"retries\"}", self.dropped_retries),
            ],
        );
        metric(
            "msgtrail_otel_spans_sampled_out_total",
            "counter",
            "Healthy spans the tail sampler left out.",
            &[("", self.sampled_out)],
        );
        metric(
            "msgtrail_otel_export_failures_total",
            "counter",
            "OTLP export calls that failed and were retried.",
            &[("", self.export_failures)],
        );
        metric(
            "msgtrail_otel_queue_spans",
            "gauge",
            "Spans waiting in the export queue.",
            &[("", self.queued)],
        );
        s
    }
}

impl ExportStats {
    /// Counts spans the tail sampler left out.
    pub fn record_sampled_out(&self, spans: u64) {
        self.sampled_out.fetch_add(spans, Ordering::Relaxed);
    }
}

/// A cheap, cloneable handle that enqueues spans.
#[derive(Debug, Clone)]
pub struct ExportHandle {
    tx: mpsc::Sender<ServiceSpan>,
    stats: Arc<ExportStats>,
}

impl ExportHandle {
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
    pub fn snapshot(&self) -> StatsSnapshot {
        let s = &self.stats;
        StatsSnapshot {
            enqueued: s.enqueued.load(Ordering::Relaxed),
            exported: s.exported.load(Ordering::Relaxed),
            dropped_queue_full: s.dropped_queue_full.load(Ordering::Relaxed),
            dropped_shutdown: s.dropped_shutdown.load(Ordering::Relaxed),
            dropped_retries: s.dropped_retries.load(Ordering::Relaxed),
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
    closing: watch::Sender<bool>,
    worker: JoinHandle<()>,
}

impl TraceExporter {
    /// Validates the configuration (building the broker's exporter) and starts the worker.
    /// Must be called within a tokio runtime.
    pub fn start(config: ExportConfig) -> Result<Self, ConfigError> {
        let first = config.build_exporter(&config.broker_service)?;
        let (tx, rx) = mpsc::channel(config.queue_capacity.max(1));
        let stats = Arc::new(ExportStats::default());
        let (closing, closing_rx) = watch::channel(false);
        let mut exporters = Exporters::new(config.clone());
        exporters.insert(config.broker_service.clone(), first);
        let worker = tokio::spawn(run(rx, config, stats.clone(), exporters, closing_rx));
        Ok(TraceExporter {
            handle: ExportHandle { tx, stats },
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
    pub fn snapshot(&self) -> StatsSnapshot {
        self.handle.snapshot()
    }

    /// Stops taking spans, sends what is queued (one attempt per batch) within `grace`, and
    /// shuts the exporters down. Returns the final counters.
    pub async fn shutdown(self, grace: Duration) -> StatsSnapshot {
        let _ = self.closing.send(true);
        let mut worker = self.worker;
        if tokio::time::timeout(grace, &mut worker).await.is_err() {
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

/// One exporter per `service.name`, least recently used closed first beyond the cap.
struct Exporters {
    config: ExportConfig,
    map: HashMap<String, (opentelemetry_otlp::SpanExporter, u64)>,
    tick: u64,
}

impl Exporters {
    fn new(config: ExportConfig) -> Self {
        Exporters {
            config,
            map: HashMap::new(),
            tick: 0,
        }
    }

    fn insert(&mut self, name: String, e: opentelemetry_otlp::SpanExporter) {
        self.tick += 1;
        self.map.insert(name, (e, self.tick));
    }

    fn get(&mut self, name: &str) -> Option<&opentelemetry_otlp::SpanExporter> {
        self.tick += 1;
        if !self.map.contains_key(name) {
            if self.map.len() >= self.config.max_services.max(1) {
                let oldest = self
                    .map
                    .iter()
                    .min_by_key(|(_, (_, t))| *t)
                    .map(|(k, _)| k.clone());
                if let Some((e, _)) = oldest.and_then(|k| self.map.remove(&k)) {
                    let _ = e.shutdown();
                }
            }
            match self.config.build_exporter(name) {
                Ok(e) => {
                    self.map.insert(name.to_owned(), (e, self.tick));
                }
                Err(err) => {
                    tracing::warn!(service = name, error = %err, "cannot build an OTLP exporter");
                    return None;
                }
            }
        }
        let tick = self.tick;
        let entry = self.map.get_mut(name)?;
        entry.1 = tick;
        Some(&entry.0)
    }

    fn shutdown(&mut self) {
        for (_, (e, _)) in self.map.drain() {
            let _ = e.shutdown();
        }
    }
}

async fn run(
    mut rx: mpsc::Receiver<ServiceSpan>,
    config: ExportConfig,
    stats: Arc<ExportStats>,
    mut exporters: Exporters,
    mut closing: watch::Receiver<bool>,
) {
    let mut batch: Vec<ServiceSpan> = Vec::with_capacity(config.max_batch);
    loop {
        let is_closing = *closing.borrow();
        if is_closing {
            // Drain without waiting for more.
            while batch.len() < config.max_batch {
                match rx.try_recv() {
                    Ok(s) => batch.push(s),
                    Err(_) => break,
                }
            }
            if batch.is_empty() {
                break;
            }
        } else {
            tokio::select! {
                first = rx.recv() => match first {
                    Some(s) => batch.push(s),
                    None => break,
                },
                _ = closing.changed() => continue,
            }
            // Fill the batch for a moment, so that spans go out in few requests.
            let deadline = tokio::time::Instant::now() + config.batch_delay;
            while batch.len() < config.max_batch {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(s)) => batch.push(s),
                    _ => break,
                }
            }
        }
        send_batch(&mut batch, &config, &stats, &mut exporters, &mut closing).await;
    }
    exporters.shutdown();
}

/// Sends one batch, service by service, retrying each group with backoff until it goes
/// through or shutdown starts (then one last attempt).
async fn send_batch(
    batch: &mut Vec<ServiceSpan>,
    config: &ExportConfig,
    stats: &ExportStats,
    exporters: &mut Exporters,
    closing: &mut watch::Receiver<bool>,
) {
    let mut groups: HashMap<String, Vec<SpanData>> = HashMap::new();
    for s in batch.drain(..) {
        groups.entry(s.service_name).or_default().push(s.span);
    }
    let limit = config
        .timeout
        .unwrap_or(Duration::from_secs(10))
        .saturating_add(Duration::from_secs(1));
    for (service, spans) in groups {
        let n = spans.len() as u64;
        let mut backoff = config.initial_backoff;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let last_try = *closing.borrow();
            let result = match exporters.get(&service) {
                Some(e) => tokio::time::timeout(limit, e.export(spans.clone()))
                    .await
                    .map_err(|_| "timed out".to_owned())
                    .and_then(|r| r.map_err(|e| e.to_string())),
                None => Err("no exporter".to_owned()),
            };
            match result {
                Ok(()) => {
                    stats.exported.fetch_add(n, Ordering::Relaxed);
                    stats.in_flight.fetch_sub(n, Ordering::Relaxed);
                    break;
                }
                Err(e) => {
                    stats.export_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(service, spans = n, error = %e, "OTLP export failed");
                    if last_try {
                        stats.dropped_shutdown.fetch_add(n, Ordering::Relaxed);
                        stats.in_flight.fetch_sub(n, Ordering::Relaxed);
                        break;
                    }
                    if attempts >= config.max_attempts.max(1) {
                        tracing::warn!(service, spans = n, attempts, error = %e, "OTLP export given up");
                        stats.dropped_retries.fetch_add(n, Ordering::Relaxed);
                        stats.in_flight.fetch_sub(n, Ordering::Relaxed);
                        break;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = closing.changed() => {}
                    }
                    backoff = (backoff * 2).min(config.max_backoff);
                }
            }
        }
    }
}
