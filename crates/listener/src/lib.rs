//! # msgtrail-listener
//!
//! The listener: it reads every stage record from the stage stream, keeps a
//! shadow message per message, assembles trajectories on demand, keeps statistics, and
//! serves all of it over HTTP. It never talks to the broker: the stage stream and the
//! message stream (durable, JetStream) are the only links, so a slow or stopped listener
//! never slows the broker.
//!
//! Two ingest sources feed the store: the stage stream (every record the broker and the
//! clients reported) and the message stream, whose stored messages carry the evidence of
//! their own store hop — P2 and P3 are recovered from their headers and JetStream's stored
//! time (`evidence`), so a broker crash between storing a message and writing its records
//! loses nothing.
//!
//! ```no_run
//! # async fn demo() -> Result<(), msgtrail_listener::ListenerError> {
//! let config = msgtrail_listener::ListenerConfig {
//!     nats: msgtrail_nats::NatsOptions::url("nats://127.0.0.1:4222"),
//!     http_addr: "127.0.0.1:0".parse().unwrap(),
//!     ..Default::default()
//! };
//! let handle = msgtrail_listener::start(config).await?;
//! println!("listener on http://{}", handle.http_addr());
//! handle.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! ## Guarantees
//! - **Nothing lost, nothing doubled**: a batch is committed (fsynced) before its
//!   stage-stream (or message-stream) messages are acked; redelivered records are recognised by
//!   `StageRecord::dedup_key` and skipped (tests kill a listener process with SIGKILL
//!   mid-backlog and restart it). Each message is acked explicitly after its transaction
//!   commits (not one `AckPolicy::All` ack per transaction: a pull response lost in flight
//!   would be acknowledged unstored; see `ingest::ack_batch`).
//! - **A full disk loses nothing**: a transaction that fails (ENOSPC, an I/O error) is kept
//!   and tried again until it commits, its messages unacknowledged and kept in progress; the
//!   store is reopened after an I/O error, reads go on, `/healthz` answers 503 and
//!   `msgtrail_listener_store_writable` is 0 meanwhile, and the outage is logged once when it
//!   begins and once when it ends (a test fills a size-limited tmpfs).
//! - **Order does not matter**: records are merged per message and the trajectory is
//!   assembled from the set, so any arrival order gives the same answer; an upload seen
//!   before the broker's P2 is kept under `(producer, request ID)` and moved under the
//!   message ID when a record carries both.
//! - **A request ID stored twice is said so**: an upload repeated after the broker's dedup
//!   window is a second message; both trajectories name each other (`same_request`), the
//!   statistics count it (`duplicates_after_window`), the request-ID lookup answers the
//!   latest (see `store`).
//! - **Not found is not incomplete is not failed**: 404, 200 with the state and the open
//!   hops, 5xx (see `http`).
//!
//! ## Running it
//! `msgtrail listener` (see `--help`; `MSGTRAIL_LISTENER_*` variables), then
//! `msgtrail trace <message-id | request-id>`, `msgtrail stats`, the page on
//! `http://127.0.0.1:7380/`, Prometheus on `/metrics`. With `OTEL_EXPORTER_OTLP_ENDPOINT`
//! set, trajectories also go out as traces.
//!
//! ## Layout
//! - `cache`: the bounded in-memory cache of in-flight messages that ingest works from.
//! - `client`: a small HTTP client of the API (used by `msgtrail trace` and `stats`).
//! - `clocks`: per (client, broker instance) clock estimates over the last minute of
//!   records, fed at ingest, outside the store (`GET /api/clients/{id}`).
//! - [`cluster`]: a group of listeners sharing the stage partitions (`--group`): KV
//!   membership, rendezvous assignment, one consumer per held partition, the HTTP fan-out.
//! - `config`: [`ListenerConfig`], its defaults and environment variable names.
//! - `error`: configuration, runtime, store and query errors.
//! - `export`: changed trajectories to the OTLP pipeline of `msgtrail-otel`, never
//!   blocking ingest.
//! - `ingest`: the durable pull consumer on the stage stream; batches, ack after commit
//!   (`ingest::apply`, shared by both sources).
//! - `observe`: observe mode — trajectories of JetStream streams msgtrail does not own,
//!   from their stored messages and nats-server's ack metrics and advisories
//!   (`--observe`), fed through the same `ingest::apply`; `GET /api/observe`.
//! - `evidence`: store evidence — the durable headers-only consumer on the message stream
//!   (`<durable_name>-stored`), P2/P3 recovered from each stored message, waiting for the
//!   stream when the broker has not created it yet. In a group each member reads its own
//!   (`<group>-<instance>-stored`) and keeps the evidence of the partitions it holds,
//!   replaying the stream's older evidence of a partition it takes over (`cluster::evidence`).
//! - `store`: the embedded redb store: records per message, shadow-message summaries and
//!   their indexes, counters, retention.
//! - `stats`: HDR latency histograms, counts by state, funnel, lag; Prometheus text.
//! - `summary`: the shadow message and its compact stored form; `search`: the filters
//!   a search applies to it.
//! - `views`: the consumer-group and dead-letter views, computed on demand from the
//!   shadow messages and a bounded sample of trajectories.
//! - `http`: the axum API (`/api/messages`, `/api/groups`, `/api/dead-letters`,
//!   `/api/stats`, `/metrics`, `/healthz`) and the page (`/`).
//!
//! Trajectory assembly itself is pure and lives in `msgtrail_core::trajectory`.

mod batch_limits;
mod cache;
mod clocks;
pub mod cluster;
mod config;
mod counters;
mod error;
mod evidence;
mod export;
mod http;
mod ingest;
mod observe;
mod search;
mod stats;
mod store;
mod summary;
mod views;

pub use batch_limits::BatchLimits;
pub use cache::{CacheStats, DEFAULT_CACHE_MESSAGES};
pub use clocks::{ClientClocks, WindowEstimate};
pub use config::{
    ListenerConfig, DEFAULT_BATCH_BYTES, DEFAULT_DURABLE, DEFAULT_HTTP_ADDR, ENV_DATA_DIR,
    ENV_DURABLE, ENV_HTTP_ADDR, ENV_TOKEN,
};
pub use error::{BoxedCause, ConfigError, ListenerError, QueryError, StoreError};
pub use evidence::consumer_name as evidence_consumer_name;
/// The API client and its answer types live in their own crate (`msgtrail-listener-client`),
/// so that a caller of the API does not link the listener; re-exported here unchanged.
pub use msgtrail_listener_client::{
    encode as encode_component, ListenerClient, ListenerClientError, DEFAULT_URL, ENV_LISTENER_URL,
};
pub use observe::ObserveConfig;
pub use search::{had_failure, redelivered};
pub use stats::{Funnel, LatencyRow, LatencyStats, Stats, StatsSnapshot};
pub use store::{SearchQuery, StorageReport, Store, TableUsage, DEFAULT_STORE_CACHE_BYTES};
pub use summary::MessageSummary;

use msgtrail_core::time::now_nanos;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How long [`ListenerHandle::shutdown`] waits for its tasks before aborting them.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Most messages the watchdog or retention handle in one transaction.
const HOUSEKEEPING_BATCH: usize = 10_000;
/// Most recent messages whose latencies refill the statistics window at start.
const RESEED_MAX: usize = 200_000;

/// A running listener. Dropping it without [`ListenerHandle::shutdown`] aborts its tasks.
#[derive(Debug)]
pub struct ListenerHandle {
    http_addr: SocketAddr,
    stop: CancellationToken,
    tasks: JoinSet<Result<(), ListenerError>>,
    store: Arc<Store>,
    stats: Arc<Stats>,
}

impl ListenerHandle {
    /// The address the HTTP API is bound to.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The store, for in-process queries.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// A statistics snapshot, optionally of one topic.
    pub fn stats(&self, topic: Option<&str>) -> StatsSnapshot {
        self.stats.snapshot(topic, now_nanos())
    }

    /// Stops ingest (the batch in hand is finished and acked), the watchdog and the HTTP
    /// server, and waits for them up to [`SHUTDOWN_GRACE`]; tasks still busy then (a NATS
    /// request to a server that is already gone) are aborted, which loses nothing: an
    /// unacked batch comes back after a restart. Returns the first task error.
    pub async fn shutdown(mut self) -> Result<(), ListenerError> {
        self.stop.cancel();
        let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
        let mut first = Ok(());
        loop {
            let next = match tokio::time::timeout_at(deadline, self.tasks.join_next()).await {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(_) => {
                    tracing::warn!(
                        "listener tasks still busy after the shutdown grace; aborting them"
                    );
                    self.tasks.abort_all();
                    while self.tasks.join_next().await.is_some() {}
                    break;
                }
            };
            let r = next.map_err(ListenerError::Task).and_then(|r| r);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// Runs until `shutdown` completes (or a task fails), then drains and stops.
    pub async fn run_until(
        mut self,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ListenerError> {
        tokio::select! {
            _ = shutdown => {}
            r = self.failed() => {
                self.stop.cancel();
                r?;
            }
        }
        self.shutdown().await
    }

    /// Stops every task at once without draining, as a crash would (for tests of recovery).
    pub async fn abort(mut self) {
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        // A store transaction already handed to the blocking pool runs to its end, as a
        // commit racing a kill would; wait for it so the store file can be reopened.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while Arc::strong_count(&self.store) > 1 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// Waits until a task ends on its own (an error: tasks run until shutdown).
    async fn failed(&mut self) -> Result<(), ListenerError> {
        match self.tasks.join_next().await {
            Some(r) => r.map_err(ListenerError::Task).and_then(|r| r),
            None => Ok(()),
        }
    }
}

/// Starts the listener: validates the configuration, opens the store, connects to NATS
/// (`nats`: the same options as the broker's), creates (or gets) the stage stream and the durable
/// consumer, binds the HTTP API, and spawns ingest, store-evidence ingest (when
/// `store_evidence` is on; it waits for the message stream on its own), the watchdog and
/// the server.
pub async fn start(config: ListenerConfig) -> Result<ListenerHandle, ListenerError> {
    config.validate()?;
    let mut nats = config.nats.clone();
    nats.name
        .get_or_insert_with(|| "msgtrail-listener".to_owned());
    let client = nats.connect().await?;
    start_with_client(config, client).await
}

/// Like [`start`], over a NATS connection the caller made (with whatever authentication
/// and TLS it needs); `config.nats` is then only informative.
pub async fn start_with_client(
    config: ListenerConfig,
    client: async_nats::Client,
) -> Result<ListenerHandle, ListenerError> {
    config.validate()?;
    let started_at = now_nanos();
    let store = open_store(&config).await?;
    let stats = load_stats(&config, &store, started_at).await?;
    let js = async_nats::jetstream::new(client);
    // In a group the partition workers (crate::cluster) read the stage stream instead.
    let observe_only = config.observe.as_ref().is_some_and(|o| o.only);
    let consumer = match &config.group {
        // Observe only: no stage stream (nor store evidence) in this account.
        None if observe_only => None,
        None => Some(
            ingest::consumer(
                &js,
                &config.durable_name,
                config.batch_size,
                config.ack_wait,
                config.replicas,
            )
            .await?,
        ),
        Some(_) => None,
    };

    let (listener, http_addr) = bind(config.http_addr).await?;

    let stop = CancellationToken::new();
    let mut tasks = JoinSet::new();
    let exporter = match &config.otel {
        Some(otel) => {
            let (sender, task) = export::spawn(otel.clone(), stop.clone())?;
            tasks.spawn(task);
            Some(sender)
        }
        None => None,
    };
    let clocks = Arc::new(clocks::ClockWindow::new());
    if let Some(consumer) = &consumer {
        tasks.spawn(ingest::run(
            consumer.clone(),
            ingest::Sinks {
                store: store.clone(),
                stats: stats.clone(),
                exporter: exporter.clone(),
                clocks: clocks.clone(),
            },
            config.batch_limits(),
            stop.clone(),
        ));
    }
    let evidence_sinks = evidence::Sinks {
        store: store.clone(),
        stats: stats.clone(),
        exporter: exporter.clone(),
    };
    // In a group each member keeps the evidence of the partitions it holds (started with the
    // cluster below: it reads the group's view).
    if config.store_evidence && config.group.is_none() && !observe_only {
        let source = evidence_source(&config, &config.durable_name, &js);
        tasks.spawn(evidence::run(source, evidence_sinks.clone(), stop.clone()));
    }
    let observing = match config.observe.clone() {
        Some(o) => Some(
            observe::spawn(
                o,
                js.clone(),
                &config.durable_name,
                config.batch_size,
                config.ack_wait,
                config.replicas,
                observe::Sinks {
                    store: store.clone(),
                    stats: stats.clone(),
                    exporter: exporter.clone(),
                },
                stop.clone(),
                &mut tasks,
            )
            .await?,
        ),
        None => None,
    };
    tasks.spawn(housekeeping(
        config.clone(),
        consumer,
        store.clone(),
        stats.clone(),
        // In a group the watchdog's trajectories are not exported: the partitions' primaries
        // export what they apply, and a watchdog pass covers every partition held.
        exporter.clone().filter(|_| config.group.is_none()),
        stop.clone(),
    ));
    let cluster_exporter = exporter.clone();
    let mut app = http::router(
        store.clone(),
        stats.clone(),
        clocks,
        exporter,
        config.token.clone(),
        config.trace_ui.as_ref(),
        observing.clone().map(observe::amend),
    );
    app = match observing {
        Some(status) => app.merge(observe::http::routes(status, config.token.clone())),
        None => app,
    };
    if let Some(group) = &config.group {
        let url = group
            .advertise_url
            .clone()
            .unwrap_or_else(|| format!("http://{http_addr}"));
        let coordinator = cluster::Coordinator {
            group: group.clone(),
            url,
            ingest: cluster::PartitionIngestDeps {
                js: js.clone(),
                replicas: config.replicas,
                limits: config.batch_limits(),
                ack_wait: config.ack_wait,
                store: store.clone(),
                stats: stats.clone(),
            },
            exporter: cluster_exporter,
        };
        let (view, task) = cluster::start(coordinator, stop.clone()).await?;
        tasks.spawn(task);
        if config.store_evidence {
            let g = cluster::evidence::GroupEvidence {
                source: evidence_source(&config, &group.durable_base(), &js),
                view: view.clone(),
                data_dir: config.data_dir.clone(),
                sinks: evidence_sinks,
            };
            tasks.spawn(cluster::evidence::run(g, stop.clone()));
        }
        app = cluster::layer(app, view, stats.clone());
    }
    tasks.spawn(serve_http(listener, app, stop.clone()));
    tracing::info!(%http_addr, data_dir = %config.data_dir.display(), "listener started");
    Ok(ListenerHandle {
        http_addr,
        stop,
        tasks,
        store,
        stats,
    })
}

/// Where the store-evidence task reads: its own durable consumer of the message stream,
/// named after the stage consumer's (`durable`: a single listener's durable name, a group
/// member's `<group>-<instance>`).
fn evidence_source(
    config: &ListenerConfig,
    durable: &str,
    js: &async_nats::jetstream::Context,
) -> evidence::EvidenceSource {
    evidence::EvidenceSource {
        js: js.clone(),
        name: evidence::consumer_name(durable),
        batch_size: config.batch_size,
        ack_wait: config.ack_wait,
        poll_interval: config.watchdog_interval,
    }
}

/// Opens the store in the data directory (on a blocking thread: redb reads its file).
async fn open_store(config: &ListenerConfig) -> Result<Arc<Store>, ListenerError> {
    let cfg = config.clone();
    let store = tokio::task::spawn_blocking(move || {
        Store::open_with_cache(
            &cfg.data_dir,
            cfg.payload_head_bytes,
            cfg.deadlines,
            cfg.store_cache_bytes,
        )
        .map(|s| {
            s.emit_trajectories(cfg.otel.is_some())
                .partitioned(cfg.group.is_some())
                .cache_capacity(cfg.cache_messages)
        })
    })
    .await
    .map_err(ListenerError::Task)??;
    Ok(Arc::new(store))
}

/// The statistics as the store left them: persistent counters and state counts, and the
/// latency window refilled from the messages of its last `stats_window`.
async fn load_stats(
    config: &ListenerConfig,
    store: &Arc<Store>,
    started_at: u64,
) -> Result<Arc<Stats>, ListenerError> {
    let st = store.clone();
    let since = started_at.saturating_sub(config.stats_window.as_nanos() as u64);
    let (counters, states, recent, observed) = tokio::task::spawn_blocking(move || {
        let recent = st.recent_summaries(since, RESEED_MAX)?;
        let observed = observe::stats::recent_samples(&st, &recent)?;
        Ok::<_, StoreError>((st.counters()?, st.state_counts()?, recent, observed))
    })
    .await
    .map_err(ListenerError::Task)??;
    let stats = Arc::new(
        Stats::new(config.stats_window, started_at, counters, states)
            .partitioned(config.group.is_some()),
    );
    stats.seed(&recent);
    stats.seed_observed(&observed);
    Ok(stats)
}

/// Binds the HTTP address; returns the listener and the address it got (port 0 picks one).
async fn bind(addr: SocketAddr) -> Result<(tokio::net::TcpListener, SocketAddr), ListenerError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ListenerError::Bind { addr, source })?;
    let http_addr = listener
        .local_addr()
        .map_err(|source| ListenerError::Bind { addr, source })?;
    Ok((listener, http_addr))
}

/// Serves the API and the page until `stop`.
async fn serve_http(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    stop: CancellationToken,
) -> Result<(), ListenerError> {
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            stop.cancelled().await;
        })
        .await
        .map_err(ListenerError::Http)
}

/// Runs the listener until `shutdown` completes (or a task fails), then drains and stops.
pub async fn run(
    config: ListenerConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ListenerError> {
    start(config).await?.run_until(shutdown).await
}

/// Like [`run`], over a NATS connection the caller made.
pub async fn run_with_client(
    config: ListenerConfig,
    client: async_nats::Client,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ListenerError> {
    start_with_client(config, client)
        .await?
        .run_until(shutdown)
        .await
}

/// The watchdog (deadlines), the lag poll and retention, on their intervals.
async fn housekeeping(
    config: ListenerConfig,
    mut consumer: Option<async_nats::jetstream::consumer::PullConsumer>,
    store: Arc<Store>,
    stats: Arc<Stats>,
    exporter: Option<export::ExportSender>,
    stop: CancellationToken,
) -> Result<(), ListenerError> {
    let mut watchdog = tokio::time::interval(config.watchdog_interval);
    let mut retention = tokio::time::interval(config.retention_interval);
    watchdog.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first pass looks at every open message (the listener may have been down past
    // their deadlines); later ones only at those that can still cross one.
    let mut deadline_since = 0u64;
    retention.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = watchdog.tick() => {
                let now = now_nanos();
                if let Some(consumer) = consumer.as_mut() {
                    match consumer.info().await {
                        Ok(info) => stats.set_pending(info.num_pending, info.num_ack_pending as u64, now),
                        Err(e) => tracing::debug!(error = %e, "consumer info unavailable"),
                    }
                }
                // While the store cannot write the ingest retries (and logs the outage once):
                // a deadline pass would only fail too.
                if !stats.store_writable() {
                    continue;
                }
                let st = store.clone();
                let since = deadline_since;
                match tokio::task::spawn_blocking(move || st.check_deadlines(now, since, HOUSEKEEPING_BATCH)).await {
                    Ok(Ok(out)) => {
                        deadline_since = out.next_since;
                        stats.apply_state_changes(&out.state_changes);
                        stats.add_counters(&out.counters);
                        stats.add_partition_counters(&out.partition_counters);
                        if let Some(x) = &exporter {
                            x.offer(out.trajectories);
                        }
                    }
                    Ok(Err(e)) => tracing::warn!(error = %msgtrail_core::ErrorChain(&e), "watchdog failed"),
                    Err(e) => tracing::warn!(error = %e, "watchdog task failed"),
                }
            }
            _ = retention.tick() => {
                if config.retention_max_age.is_none() && config.retention_max_bytes.is_none() {
                    continue;
                }
                if !stats.store_writable() {
                    continue;
                }
                let now = now_nanos();
                let st = store.clone();
                let (age, bytes) = (config.retention_max_age, config.retention_max_bytes);
                match tokio::task::spawn_blocking(move || st.enforce_retention(now, age, bytes, HOUSEKEEPING_BATCH)).await {
                    Ok(Ok(out)) => {
                        stats.apply_state_changes(&out.state_changes);
                        stats.add_counters(&out.counters);
                        stats.add_partition_counters(&out.partition_counters);
                        stats.add_counter(counters::Counter::RetentionDeleted, out.deleted);
                        if out.deleted > 0 {
                            tracing::info!(deleted = out.deleted, bytes = out.bytes_freed, "retention");
                        }
                    }
                    Ok(Err(e)) => tracing::warn!(error = %msgtrail_core::ErrorChain(&e), "retention failed"),
                    Err(e) => tracing::warn!(error = %e, "retention task failed"),
                }
            }
        }
    }
}
