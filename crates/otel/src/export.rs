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
//!   `msgtrail_core::backoff`); while the endpoint is down, spans pile up in
//!   the queue until the bound, then new ones are dropped with a count; when it returns, the
//!   backlog goes out.
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

/// `OTEL_SERVICE_NAME`: the broker's `service.name`.
pub(crate) const ENV_SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
/// Bound of the export queue, in spans.
pub(crate) const ENV_QUEUE_CAPACITY: &str = "MSGTRAIL_OTEL_QUEUE_SPANS";

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC (tonic), default port 4317.
    Grpc,
    /// OTLP/HTTP with protobuf bodies, default port 4318.
    HttpProtobuf,
    /// OTLP/HTTP with JSON bodies, default port 4318.
    HttpJson,
}

impl Protocol {
    /// The value of `OTEL_EXPORTER_OTLP_PROTOCOL` that names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
            Protocol::HttpJson => "http/json",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [Protocol::Grpc, Protocol::HttpProtobuf, Protocol::HttpJson]
            .into_iter()
            .find(|p| p.as_str() == s)
    }
}

/// Request compression (`OTEL_EXPORTER_OTLP_COMPRESSION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// gzip (at its fastest level: export CPU matters more than bytes on the wire).
    Gzip,
}

/// Everything the exporter needs; [`ExportConfig::default`] holds every default.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportConfig {
    /// The transport (default: HTTP/protobuf, as the OpenTelemetry spec says).
    pub protocol: Protocol,
    /// The endpoint; `None` is the protocol's default (`http://localhost:4317`, or
    /// `http://localhost:4318/v1/traces`). For HTTP this is the full URL with `/v1/traces`.
    pub endpoint: Option<String>,
    /// Per-request timeout; `None` is 10 s.
    pub timeout: Option<Duration>,
    /// Request compression (none by default).
    pub compression: Option<Compression>,
    /// Headers sent with every request (`OTEL_EXPORTER_OTLP_HEADERS`).
    pub headers: Vec<(String, String)>,
    /// `service.name` of the broker's spans (from `OTEL_SERVICE_NAME`).
    pub broker_service: String,
    /// Bound of the queue, in spans (default 20,000).
    pub queue_capacity: usize,
    /// Most spans per batch (default 2,048); a batch is one request unless its body would
    /// exceed [`ExportConfig::max_request_bytes`].
    pub max_batch: usize,
    /// Largest request body before compression (default 3 MiB, under the 4 MiB that
    /// collectors and tonic servers accept by default).
    pub max_request_bytes: usize,
    /// Requests in flight at once (default 4).
    pub max_in_flight: usize,
    /// How long the worker waits to fill a batch once it has a span (default 200 ms).
    pub batch_delay: Duration,
    /// First retry delay after a failed export (default 100 ms).
    pub initial_backoff: Duration,
    /// Longest retry delay (default 5 s).
    pub max_backoff: Duration,
    /// Attempts per request before it is dropped and counted in
    /// [`ExportStats::dropped_retries`] (default 60, about five minutes at the longest
    /// backoff): an endpoint that refuses a batch for good must not stall the queue.
    pub max_attempts: u32,
    /// Most service resources kept built at once (default 64).
    pub max_services: usize,
}

impl ExportConfig {
    /// Most spans per batch: [`ExportConfig::max_batch`], and never more than
    /// `queue_capacity / (max_in_flight + 1)`, so that the spans held in requests stay
    /// within the queue's bound (see the module doc).
    pub fn batch_limit(&self) -> usize {
        let share = self.queue_capacity / (self.max_in_flight.max(1) + 1);
        self.max_batch.min(share).max(1)
    }
}

impl Default for ExportConfig {
    fn default() -> Self {
        ExportConfig {
            protocol: Protocol::HttpProtobuf,
            endpoint: None,
            timeout: None,
            compression: None,
            headers: Vec::new(),
            broker_service: DEFAULT_BROKER_SERVICE.to_owned(),
            queue_capacity: 20_000,
            max_batch: 2_048,
            max_request_bytes: 3 << 20,
            max_in_flight: 4,
            batch_delay: Duration::from_millis(200),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            max_attempts: 60,
            max_services: 64,
        }
    }
}

/// The traces-specific variable `OTEL_EXPORTER_OTLP_TRACES_{suffix}` if set, else
/// `OTEL_EXPORTER_OTLP_{suffix}`, with the name that was read.
fn otlp_var(get: &impl Fn(&str) -> Option<String>, suffix: &str) -> Option<(String, String)> {
    [
        format!("OTEL_EXPORTER_OTLP_TRACES_{suffix}"),
        format!("OTEL_EXPORTER_OTLP_{suffix}"),
    ]
    .into_iter()
    .find_map(|name| {
        get(&name)
            .filter(|v| !v.trim().is_empty())
            .map(|v| (name, v))
    })
}

impl ExportConfig {
    /// The defaults overridden by the standard variables (see the module docs) and
    /// `ENV_QUEUE_CAPACITY`.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Like [`ExportConfig::from_env`], reading variables through `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut c = ExportConfig::default();
        if let Some((name, v)) = otlp_var(&get, "PROTOCOL") {
            c.protocol = Protocol::parse(v.trim()).ok_or_else(|| {
                ConfigError::invalid(&name, &v, "grpc, http/protobuf or http/json")
            })?;
        }
        c.endpoint = endpoint_from(&get, c.protocol);
        if let Some((name, v)) = otlp_var(&get, "TIMEOUT") {
            let ms: u64 = v
                .trim()
                .parse()
                .map_err(|_| ConfigError::invalid(&name, &v, "milliseconds"))?;
            c.timeout = Some(Duration::from_millis(ms));
        }
        if let Some((name, v)) = otlp_var(&get, "COMPRESSION") {
            c.compression = match v.trim() {
                "gzip" => Some(Compression::Gzip),
                "none" => None,
                _ => return Err(ConfigError::invalid(&name, &v, "gzip or none")),
            };
        }
        if let Some((name, v)) = otlp_var(&get, "HEADERS") {
            c.headers = parse_headers(&v).ok_or_else(|| {
                ConfigError::invalid(&name, &v, "key=value pairs, comma-separated")
            })?;
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

    /// The endpoint, or the protocol's default.
    pub fn endpoint_or_default(&self) -> String {
        match (&self.endpoint, self.protocol) {
            (Some(e), _) => e.clone(),
            (None, Protocol::Grpc) => "http://localhost:4317".to_owned(),
            (None, _) => "http://localhost:4318/v1/traces".to_owned(),
        }
    }

    /// The per-request timeout, 10 s unless set.
    pub fn timeout_or_default(&self) -> Duration {
        self.timeout.unwrap_or(Duration::from_secs(10))
    }

    fn encoding(&self) -> Encoding {
        match self.protocol {
            Protocol::HttpJson => Encoding::Json,
            Protocol::Grpc | Protocol::HttpProtobuf => Encoding::Protobuf,
        }
    }
}

/// The endpoint the variables give: `…_TRACES_ENDPOINT` as it is, or `…_ENDPOINT` with
/// `/v1/traces` appended for HTTP.
fn endpoint_from(get: &impl Fn(&str) -> Option<String>, protocol: Protocol) -> Option<String> {
    let set = |k: &str| {
        get(k)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    if let Some(e) = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        return Some(e);
    }
    let base = set("OTEL_EXPORTER_OTLP_ENDPOINT")?;
    Some(match protocol {
        Protocol::Grpc => base,
        _ => format!("{}/v1/traces", base.trim_end_matches('/')),
    })
}

/// `k1=v1,k2=v2` with percent-encoded values (the W3C baggage format the spec names).
fn parse_headers(s: &str) -> Option<Vec<(String, String)>> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=')?;
            Some((k.trim().to_owned(), percent_decode(v.trim())?))
        })
        .collect()
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
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
fn counter(v: u64) -> Counter {
    let c = Counter::default();
    c.inc_by(v);
    c
}

/// A gauge holding `v` (saturating at `i64::MAX`).
fn gauge(v: u64) -> Gauge {
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
        let shared = Arc::new(Shared {
            config,
            stats: stats.clone(),
            transport,
        });
        let worker = tokio::spawn(run(rx, shared, closing.clone()));
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

/// What the worker and its requests share.
struct Shared {
    config: ExportConfig,
    stats: Arc<ExportStats>,
    transport: Transport,
}

impl Shared {
    /// Moves `n` spans from in flight to `counter`.
    fn settle(&self, counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
        self.stats.in_flight.fetch_sub(n, Ordering::Relaxed);
    }
}

/// The worker: takes batches off the queue and starts a request task for each, at most
/// [`ExportConfig::max_in_flight`] at once.
async fn run(mut rx: mpsc::Receiver<ServiceSpan>, shared: Arc<Shared>, closing: CancellationToken) {
    let config = &shared.config;
    let permits = Arc::new(Semaphore::new(config.max_in_flight.max(1)));
    let mut resources = Resources::new(config.max_services);
    let mut tasks = JoinSet::new();
    let mut batch: Vec<ServiceSpan> = Vec::with_capacity(config.batch_limit());
    while next_batch(&mut rx, &mut batch, config, &closing).await {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        let groups = resources.group(batch.drain(..));
        tasks.spawn(deliver(groups, shared.clone(), closing.clone(), permit));
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

/// Fills `batch` (up to [`ExportConfig::max_batch`]): waits for a first span, then for more
/// within [`ExportConfig::batch_delay`]; once closing, takes only what is queued. `false`
/// when there is nothing more to send.
async fn next_batch(
    rx: &mut mpsc::Receiver<ServiceSpan>,
    batch: &mut Vec<ServiceSpan>,
    config: &ExportConfig,
    closing: &CancellationToken,
) -> bool {
    let max = config.batch_limit();
    loop {
        if closing.is_cancelled() {
            while batch.len() < max {
                match rx.try_recv() {
                    Ok(s) => batch.push(s),
                    Err(_) => break,
                }
            }
            return !batch.is_empty();
        }
        tokio::select! {
            n = rx.recv_many(batch, max) => {
                if n == 0 {
                    return false;
                }
                break;
            }
            _ = closing.cancelled() => {}
        }
    }
    // Fill the batch for a moment, so that spans go out in few requests.
    let deadline = tokio::time::Instant::now() + config.batch_delay;
    while batch.len() < max {
        let room = max - batch.len();
        match tokio::time::timeout_at(deadline, rx.recv_many(batch, room)).await {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
    true
}

/// One batch: encodes it (here, on a runtime thread, not in the worker) and sends each body.
async fn deliver(
    groups: Vec<Group>,
    shared: Arc<Shared>,
    closing: CancellationToken,
    _permit: OwnedSemaphorePermit,
) {
    let config = &shared.config;
    let n: u64 = groups.iter().map(|g| g.spans.len() as u64).sum();
    let gzip = config.compression == Some(Compression::Gzip) && config.protocol != Protocol::Grpc;
    let bodies =
        match crate::otlp::encode(groups, config.encoding(), gzip, config.max_request_bytes) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(spans = n, error = %e, "cannot encode an OTLP request");
                shared.settle(&shared.stats.rejected, n);
                return;
            }
        };
    for body in bodies {
        send_with_retries(body, &shared, &closing).await;
    }
}

/// Sends one body, retrying with backoff until it goes through, fails for good, runs out of
/// attempts, or shutdown starts (then one last attempt).
async fn send_with_retries(body: Body, shared: &Shared, closing: &CancellationToken) {
    let (config, stats) = (&shared.config, &shared.stats);
    let n = body.spans;
    let mut backoff = Backoff::new(config.initial_backoff, config.max_backoff);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let last_try = closing.is_cancelled();
        let e = match shared.transport.send(body.bytes.clone()).await {
            Ok(rejected) => {
                let rejected = rejected.min(n);
                if rejected > 0 {
                    tracing::warn!(spans = n, rejected, "the OTLP receiver rejected spans");
                }
                shared.settle(&stats.exported, n - rejected);
                shared.settle(&stats.rejected, rejected);
                return;
            }
            Err(e) => e,
        };
        stats.export_failures.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(spans = n, error = %e, "OTLP export failed");
        if !e.retryable {
            tracing::warn!(spans = n, error = %e, "the OTLP receiver refused a request");
            return shared.settle(&stats.rejected, n);
        }
        if last_try {
            return shared.settle(&stats.dropped_shutdown, n);
        }
        if attempts >= config.max_attempts.max(1) {
            tracing::warn!(spans = n, attempts, error = %e, "OTLP export given up");
            return shared.settle(&stats.dropped_retries, n);
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff.next_pause()) => {}
            _ = closing.cancelled() => {}
        }
    }
}
