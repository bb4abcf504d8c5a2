//! Observe mode: trajectories of JetStream applications that do not use msgtrail, built from
//! what nats-server already emits (docs/ARCHITECTURE.md, "Observe mode";
//! `msgtrail listener --observe ORDERS,PAYMENTS`).
//!
//! ## How the parts meet
//! - [`ObserveConfig`]: which streams, whether to set consumers' `sample_freq`, how often
//!   to look for streams and consumers.
//! - `discovery`: every interval, per observed stream, whether it exists and its durable
//!   consumers (push or pull, `sample_freq`); new ones are logged, consumers that do not
//!   sample every ack are named with the command that fixes it. Shared as
//!   `ObserveStatus` with the event reader and `GET /api/observe` (`http`).
//! - `stored`: per stream, msgtrail's own headers-only durable consumer
//!   (`<durable>-observe`) turns each stored message into its P2/P3.
//! - `events`: `MSGTRAIL_OBSERVE` (created through `msgtrail_nats::topology`) captures the
//!   ack metrics and the nak, term and max-deliveries advisories of the observed streams;
//!   its durable consumer `<durable>-observe-events` turns them into delivery records. An
//!   event of a consumer discovery has not seen yet makes it run discovery on that stream
//!   first, so the consumer's mode (push or pull) is known before its records are made.
//! - [`amend`]: every observed trajectory exported or served (`GET /api/messages/…`) names
//!   the consumers of its stream that do not sample every ack (they may lack hops), from
//!   discovery's status.
//! - `hold`: the trace export holds back an observed trajectory until its stored message
//!   is in (the readers are independent; exported earlier, its spans would miss the
//!   producer's trace), set on the export with `ExportSender::hold_back`.
//! - `event` parses nats-server's events; `records` maps both sources to stage records
//!   with the broker's hop keys (pure).
//! - [`stats`]: what the records new to the store change in the per-stream and
//!   per-consumer statistics (pure; the store's apply calls it, `crate::stats` keeps the
//!   figures); discovery adds what each consumer holds now (consumer info).
//!
//! Both readers end in `crate::ingest::apply`, like the stage stream: one store transaction
//! per batch, acks after the commit, the store skipping what it already holds. Message IDs
//! are [`msgtrail_core::observed::observed_message_id`] of (stream, sequence), so every
//! record finds its message by itself, in any order.

mod discovery;
mod event;
mod events;
mod hold;
pub(crate) mod http;
mod records;
pub(crate) mod stats;
mod stored;

pub(crate) use discovery::ObserveStatus;

use crate::error::ListenerError;
use crate::export::ExportSender;
use crate::stats::Stats;
use crate::store::Store;
use async_nats::jetstream;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Observe mode's settings (`msgtrail listener --observe …`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObserveConfig {
    /// The JetStream streams to observe (they need not exist yet).
    pub streams: Vec<String>,
    /// Set every observed consumer's `sample_freq` to 100 % (the only change msgtrail then
    /// makes to the observed application); off by default.
    pub set_sample_freq: bool,
    /// How often streams and consumers are looked for.
    pub discovery_interval: Duration,
    /// How long `MSGTRAIL_OBSERVE` keeps events.
    pub events_max_age: Duration,
    /// Observe only (`--observe-only`): no stage stream, no store evidence, nothing of a
    /// msgtrail broker; what a listener with only an observer's NATS rights
    /// (deploy/nats/accounts.conf, `observer`) can run. Not in a listener group.
    pub only: bool,
}

impl ObserveConfig {
    /// Observes `streams` with the defaults (discovery every 5 s, events kept 24 h).
    pub fn streams(streams: impl IntoIterator<Item = impl Into<String>>) -> Self {
        ObserveConfig {
            streams: streams.into_iter().map(Into::into).collect(),
            set_sample_freq: false,
            discovery_interval: Duration::from_secs(5),
            events_max_age: Duration::from_secs(24 * 3600),
            only: false,
        }
    }

    /// Checks the stream names: NATS names, not msgtrail's own streams.
    pub(crate) fn validate(&self) -> Result<(), crate::ConfigError> {
        let bad = |why: String| Err(crate::ConfigError::field("listener", "observe", &why));
        if self.streams.is_empty() {
            return bad("names no stream".into());
        }
        for s in &self.streams {
            let ok = !s.is_empty()
                && s.len() <= 64
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if !ok {
                return bad(format!(
                    "stream {s:?}: observed stream names must be 1–64 of A-Z a-z 0-9 _ -"
                ));
            }
            if s.starts_with("MSGTRAIL_") {
                return bad(format!("stream {s:?} is msgtrail's own"));
            }
        }
        if self.discovery_interval.is_zero() {
            return bad("discovery interval must be positive".into());
        }
        Ok(())
    }
}

/// Where observed records go (the store, its statistics, the trace export).
#[derive(Debug, Clone)]
pub(crate) struct Sinks {
    /// The store.
    pub store: Arc<Store>,
    /// The statistics.
    pub stats: Arc<Stats>,
    /// The trace export, when configured.
    pub exporter: Option<ExportSender>,
}

/// What the observe tasks share.
#[derive(Debug)]
pub(crate) struct Observer {
    js: jetstream::Context,
    config: ObserveConfig,
    /// Discovery's findings.
    pub status: Arc<ObserveStatus>,
    /// The name of msgtrail's own consumer on each observed stream, `<durable>-observe`.
    pub own_consumer: String,
    batch_size: usize,
    ack_wait: Duration,
    sinks: Sinks,
    stop: CancellationToken,
}

impl Observer {
    /// Waits until `stream` exists and `make` gets its consumer; `None` when stopped first.
    async fn wait_for<C, F, Fut>(&self, stream: &str, make: F) -> Option<C>
    where
        F: Fn(jetstream::stream::Stream) -> Fut,
        Fut: Future<Output = Result<C, async_nats::Error>>,
    {
        let mut logged = false;
        loop {
            let attempt = async {
                let s = self.js.get_stream(stream).await?;
                make(s).await
            };
            let r = tokio::select! {
                _ = self.stop.cancelled() => return None,
                r = attempt => r,
            };
            match r {
                Ok(c) => return Some(c),
                Err(e) if !logged => {
                    tracing::info!(%stream, error = %e, "observed stream not read yet (absent, a work-queue stream or refused); looked at again every discovery interval");
                    logged = true;
                }
                Err(e) => tracing::debug!(%stream, error = %e, "observed stream still unavailable"),
            }
            tokio::select! {
                _ = self.stop.cancelled() => return None,
                _ = tokio::time::sleep(self.config.discovery_interval) => {}
            }
        }
    }
}

/// Creates `MSGTRAIL_OBSERVE` and spawns discovery and the readers into `tasks`; returns
/// the status the API shows.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn spawn(
    config: ObserveConfig,
    js: jetstream::Context,
    durable: &str,
    batch_size: usize,
    ack_wait: Duration,
    replicas: Option<usize>,
    sinks: Sinks,
    stop: CancellationToken,
    tasks: &mut JoinSet<Result<(), ListenerError>>,
) -> Result<Arc<ObserveStatus>, ListenerError> {
    let replicas = replicas.unwrap_or(1);
    let desired =
        msgtrail_nats::topology::observe_stream(&config.streams, replicas, config.events_max_age);
    let events_stream = msgtrail_nats::topology::ensure_stream(
        &js,
        &desired,
        msgtrail_nats::topology::Policy::owner(replicas),
    )
    .await
    .map_err(Box::new)?;
    let status = Arc::new(ObserveStatus::new(&config.streams));
    sinks.stats.set_observed_live(status.clone());
    let held = Arc::new(hold::Held::default());
    if let Some(x) = &sinks.exporter {
        let (st, h) = (status.clone(), held.clone());
        x.hold_back(Box::new(move |t| h.hold(t, &st)));
        x.amend_with(amend(status.clone()));
    }
    let obs = Arc::new(Observer {
        js,
        status: status.clone(),
        own_consumer: format!("{durable}-observe"),
        config,
        batch_size,
        ack_wait,
        sinks,
        stop,
    });
    tracing::info!(streams = ?obs.config.streams, "observe mode: tracing the streams' messages for every durable consumer on them");
    // Discovery first, so that the event reader knows push consumers from the start.
    for s in &obs.config.streams {
        let _ = discovery::discover(
            &obs.js,
            &obs.status,
            s,
            &obs.own_consumer,
            obs.config.set_sample_freq,
        )
        .await;
    }
    let o = obs.clone();
    tasks.spawn(async move {
        discover_forever(o).await;
        Ok(())
    });
    for s in obs.config.streams.clone() {
        let o = obs.clone();
        tasks.spawn(async move {
            stored::run(o, s).await;
            Ok(())
        });
    }
    if obs.sinks.exporter.is_some() {
        let o = obs.clone();
        tasks.spawn(async move {
            hold::recheck(o, held).await;
            Ok(())
        });
    }
    tasks.spawn(events::run(obs, events_stream));
    Ok(status)
}

/// Names on each observed trajectory the consumers of its stream that do not sample every
/// ack ([`ObserveStatus::mark_unsampled`]); for the export and the API.
pub(crate) fn amend(status: Arc<ObserveStatus>) -> crate::export::Amend {
    Arc::new(move |t| status.mark_unsampled(t))
}

/// Discovery on its interval until stopped.
async fn discover_forever(obs: Arc<Observer>) {
    let mut tick = tokio::time::interval(obs.config.discovery_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = obs.stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        for s in &obs.config.streams {
            let _ = discovery::discover(
                &obs.js,
                &obs.status,
                s,
                &obs.own_consumer,
                obs.config.set_sample_freq,
            )
            .await;
        }
    }
}
