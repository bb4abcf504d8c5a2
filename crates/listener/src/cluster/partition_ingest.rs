//! One held partition's ingest: a durable pull consumer per (listener, partition), named
//! `<group>-<instance>-p<NN>` and filtered on the partition's subject `msgtrail.stages.<p>`
//! and the legacy `msgtrail.stages`; its batches go through the same [`crate::ingest::apply`]
//! as a single listener's (commit, then ack; the store's dedup key skips redeliveries).
//!
//! A consumer created for a partition this listener did not hold before starts at the stage
//! stream's first message: that replay **is** the takeover's rebuild, with its progress
//! (messages still pending) logged every few seconds and kept for `/metrics`; one that
//! exists resumes after its last ack (a restarted listener catching up). Of a legacy-subject
//! batch only the records of this partition are kept (every held partition reads the legacy
//! subject, each keeps its own share).

use super::ClusterView;
use crate::batch_limits::{BatchLimits, Chunks};
use crate::error::ListenerError;
use crate::export::ExportSender;
use crate::ingest::{self, Batch, Source};
use crate::stats::Stats;
use crate::store::Store;
use async_nats::jetstream::{self, consumer, AckKind};
use msgtrail_core::partition::{self, Partition, PARTITIONS};
use msgtrail_core::subjects::STAGE_SUBJECT;
use msgtrail_core::{decode_batch, StageRecord};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often a rebuilding partition's progress is logged and its readiness checked.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);
/// Durables of partitions nobody reads for this long are removed by JetStream: a listener
/// gone for a day rebuilds its partitions from the start when it comes back (the store skips
/// what it holds), and the stream is not left with the consumers of departed listeners.
const INACTIVE_THRESHOLD: Duration = Duration::from_secs(24 * 3600);

/// What a partition's ingest needs.
#[derive(Debug, Clone)]
pub(crate) struct PartitionIngest {
    /// The stage stream.
    pub stream: jetstream::stream::Stream,
    /// `<group>-<instance>`: the durables are `<base>-p<NN>`.
    pub durable_base: String,
    /// Most stage-stream messages and bytes per store transaction.
    pub limits: BatchLimits,
    /// The consumers' ack wait.
    pub ack_wait: Duration,
    /// The store.
    pub store: Arc<Store>,
    /// The statistics.
    pub stats: Arc<Stats>,
    /// The cluster's shared view (readiness and rebuild progress of each partition).
    pub view: Arc<ClusterView>,
}

/// The durable consumer name of `partition` under `base`.
pub(crate) fn durable_name(base: &str, partition: Partition) -> String {
    format!("{base}-p{:02}", partition.index())
}

impl PartitionIngest {
    /// Applies `partition` until `stop`; exports its traces when `exporter` is set (the
    /// primary's). Setup failures are retried, never fatal: the listener serves its other
    /// partitions meanwhile.
    pub(crate) async fn run(
        self,
        partition: Partition,
        exporter: Option<ExportSender>,
        stop: CancellationToken,
    ) -> Result<(), ListenerError> {
        let name = durable_name(&self.durable_base, partition);
        if let Some(x) = &exporter {
            // A new primary: let the former one stop and its last exports be marked, then
            // offer again what the partition applied lately (export_marks module docs).
            tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                _ = tokio::time::sleep(super::export_marks::HANDOVER_SETTLE) => {}
            }
            self.offer_recent(partition, x).await;
        }
        let mut backoff =
            msgtrail_core::Backoff::new(Duration::from_millis(250), Duration::from_secs(5));
        loop {
            let consumer = tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                c = self.consumer(&name, partition) => c,
            };
            match consumer {
                Ok(c) => match self.read(c, partition, exporter.as_ref(), &stop).await {
                    Ok(()) => return Ok(()),
                    Err(e) => {
                        tracing::warn!(%partition, error = %msgtrail_core::ErrorChain(&e), "partition consumer lost; creating it again")
                    }
                },
                Err(e) => {
                    tracing::warn!(%partition, consumer = %name, error = %e, "partition consumer setup failed; retrying")
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                _ = tokio::time::sleep(backoff.next_pause()) => {}
            }
        }
    }

    /// Offers the export the trajectories of the messages `partition` applied in the last
    /// [`super::RECENT_WINDOW`] (the gate leaves out the hops marked exported).
    async fn offer_recent(&self, partition: Partition, exporter: &ExportSender) {
        let ids = self.view.recently_applied(partition);
        if ids.is_empty() {
            return;
        }
        let store = self.store.clone();
        let now = msgtrail_core::time::now_nanos();
        let found = tokio::task::spawn_blocking(move || {
            ids.iter()
                .filter_map(|id| store.trajectory(&id.to_string(), now).ok().flatten())
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        tracing::info!(%partition, trajectories = found.len(), "primary now: offering the partition's recent trajectories to the export again (hops marked exported left out)");
        exporter.offer(found);
    }

    async fn consumer(
        &self,
        name: &str,
        partition: Partition,
    ) -> Result<consumer::PullConsumer, async_nats::Error> {
        let config = consumer::pull::Config {
            durable_name: Some(name.to_owned()),
            description: Some(format!("msgtrail listener, stage partition {partition}")),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: self.ack_wait,
            max_ack_pending: (self.limits.messages * 8).max(1024) as i64,
            deliver_policy: consumer::DeliverPolicy::All,
            filter_subjects: vec![partition.subject(), STAGE_SUBJECT.to_owned()],
            inactive_threshold: INACTIVE_THRESHOLD,
            ..Default::default()
        };
        ingest::durable_consumer(&self.stream, config).await
    }

    async fn read(
        &self,
        consumer: consumer::PullConsumer,
        partition: Partition,
        exporter: Option<&ExportSender>,
        stop: &CancellationToken,
    ) -> Result<(), ListenerError> {
        let mut info_consumer = consumer.clone();
        let messages = consumer
            .stream()
            .max_messages_per_batch(self.limits.messages)
            .heartbeat(Duration::from_secs(5))
            .expires(Duration::from_secs(30))
            .messages()
            .await
            .map_err(|e| ListenerError::nats("partition consumer", e))?;
        let mut chunks = Chunks::new(messages, self.limits);
        let mut progress = tokio::time::interval(PROGRESS_EVERY);
        progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut rebuilding_logged = false;
        loop {
            let chunk = tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                _ = progress.tick() => {
                    let Ok(info) = info_consumer.info().await else { continue };
                    let pending = info.num_pending + info.num_ack_pending as u64;
                    let was_ready = self.view.partition_progress(partition, pending);
                    if pending > 0 && !was_ready {
                        tracing::info!(%partition, pending, delivered = info.delivered.stream_sequence, "rebuilding partition from the stage stream");
                        rebuilding_logged = true;
                    } else if pending == 0 && rebuilding_logged {
                        tracing::info!(%partition, "partition rebuilt: caught up with the stage stream");
                        rebuilding_logged = false;
                    }
                    continue;
                }
                c = chunks.next() => match c {
                    Some(c) => c,
                    None => return Err(ListenerError::ConsumerEnded),
                },
            };
            let mut msgs = Vec::with_capacity(chunk.len());
            for m in chunk {
                match m {
                    Ok(m) => msgs.push(m),
                    Err(e) => tracing::warn!(%partition, error = %e, "partition consumer error"),
                }
            }
            if msgs.is_empty() {
                continue;
            }
            let batch = decode(msgs, partition, &self.stats).await;
            self.view.applied(
                partition,
                batch.records.iter().filter_map(|r| r.message_id),
                msgtrail_core::time::now_nanos(),
            );
            ingest::apply(batch, &self.store, &self.stats, exporter, stop).await;
        }
    }
}

/// Decodes a partition consumer's messages: a partition subject's batch whole, a legacy
/// batch's records of `partition` only; an undecodable batch is counted and terminated.
async fn decode(msgs: Vec<jetstream::Message>, partition: Partition, stats: &Stats) -> Batch {
    let mut batch = Batch::new(Source::Stages, REDECODE[usize::from(partition.index())]);
    for m in msgs {
        match decode_batch(&m.payload) {
            Ok(rs) => {
                batch.records.extend(keep(&m, rs, partition));
                batch.ack_after_commit(m);
            }
            Err(e) => {
                tracing::warn!(%partition, error = %msgtrail_core::ErrorChain(&e), "undecodable stage batch dropped");
                stats.decode_error();
                if let Err(e) = m.ack_with(AckKind::Term).await {
                    tracing::warn!(error = %e, "term of an undecodable batch failed");
                }
            }
        }
    }
    batch
}

/// The records of a message this partition keeps: all of a partition subject's (the
/// publisher split them), the partition's own of a legacy batch.
fn keep(
    m: &jetstream::Message,
    records: Vec<StageRecord>,
    partition: Partition,
) -> impl Iterator<Item = StageRecord> {
    let legacy = partition::of_subject(m.subject.as_str()).is_none();
    records
        .into_iter()
        .filter(move |r| !legacy || Partition::of_record(r) == partition)
}

/// The records of messages decoded once before, for another attempt after the store failed.
fn redecode<const P: u16>(msgs: &[jetstream::Message]) -> Vec<StageRecord> {
    let partition = Partition::new(P).expect("a partition below PARTITIONS");
    msgs.iter()
        .filter_map(|m| {
            decode_batch(&m.payload)
                .ok()
                .map(|rs| keep(m, rs, partition))
        })
        .flatten()
        .collect()
}

/// [`redecode`] of each partition, as the plain function a [`Batch`] keeps.
/// The function a [`Batch`] keeps to decode its messages again.
type Redecode = fn(&[jetstream::Message]) -> Vec<StageRecord>;

const REDECODE: [Redecode; PARTITIONS as usize] = [
    redecode::<0>,
    redecode::<1>,
    redecode::<2>,
    redecode::<3>,
    redecode::<4>,
    redecode::<5>,
    redecode::<6>,
    redecode::<7>,
    redecode::<8>,
    redecode::<9>,
    redecode::<10>,
    redecode::<11>,
    redecode::<12>,
    redecode::<13>,
    redecode::<14>,
    redecode::<15>,
];
