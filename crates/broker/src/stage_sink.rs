//! The stage sink: the only writer of the stage stream (DESIGN.md §3.4, §3.5).
//!
//! Handlers call [`StageSink::record`], which never waits: the record goes into a bounded
//! buffer, or is dropped and counted when the buffer is full. One writer task drains the
//! buffer into batches (up to `stage_batch_max` records or `stage_batch_linger` of waiting)
//! and publishes each batch as one JetStream message in the compact binary encoding (stage
//! stream version 2, [`msgtrail_core::frame::encode_stage_batch`]), with a window of publish
//! acks in flight. A batch the stage stream does not take (no leader during an election, a
//! lost connection) is published again with backoff, in order, until it is stored; only a
//! full retry queue or a shutdown that cannot drain it gives records up, counted in
//! `stage_publish_failed`. Every record is also a `tracing` event with target
//! `msgtrail::stage` (level DEBUG).

use crate::metrics::Metrics;
use bytes::Bytes;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use msgtrail_core::frame::encode_stage_batch;
use msgtrail_core::subjects::STAGE_SUBJECT;
use msgtrail_core::StageRecord;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Publish acks awaited concurrently by the writer.
const ACK_WINDOW: usize = 64;

/// A cheap handle to hand stage records to the writer.
#[derive(Debug, Clone)]
pub struct StageSink {
    tx: Option<mpsc::Sender<StageRecord>>,
    metrics: Arc<Metrics>,
}

impl StageSink {
    /// Starts the writer task; it ends after every sink clone is dropped and the buffer is
    /// flushed. With `enabled` false, records are only traced, never written.
    pub fn start(
        js: async_nats::jetstream::Context,
        metrics: Arc<Metrics>,
        buffer: usize,
        batch_max: usize,
        linger: Duration,
        enabled: bool,
    ) -> (StageSink, JoinHandle<()>) {
        if !enabled {
            return (StageSink { tx: None, metrics }, tokio::spawn(async {}));
        }
        let (tx, rx) = mpsc::channel(buffer);
        let writer = tokio::spawn(write_batches(js, rx, metrics.clone(), batch_max, linger));
        (
            StageSink {
                tx: Some(tx),
                metrics,
            },
            writer,
        )
    }

    /// Whether records are written at all (stage recording is on).
    pub fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Records a stage without waiting.
    pub fn record(&self, rec: StageRecord) {
        tracing::debug!(
            target: "msgtrail::stage",
            stage = %rec.stage,
            message_id = rec.message_id.map(|m| m.to_string()),
            request_id = rec.request_id.as_ref().map(|r| r.as_str()),
            producer = rec.producer.as_ref().map(|r| r.as_str()),
            consumer = rec.consumer.as_ref().map(|r| r.as_str()),
            group = rec.group.as_ref().map(|r| r.as_str()),
            attempt = rec.attempt,
            outcome = rec.outcome.as_deref(),
            "stage"
        );
        let Some(tx) = &self.tx else { return };
        match tx.try_send(rec) {
            Ok(()) => Metrics::inc(&self.metrics.stage_records),
            Err(_) => Metrics::inc(&self.metrics.stage_dropped),
        }
    }
}

/// A stage-stream message waiting for its publish ack, or for another try.
struct Pending {
    bytes: Bytes,
    records: u64,
    tries: u32,
}

/// First pause before a failed batch is published again; doubles up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(100);
/// Longest pause between tries of a failed batch.
const RETRY_MAX: Duration = Duration::from_secs(2);
/// Failed batches kept for another try (about 2.5 M records at full batches); beyond it the
/// oldest is given up and counted in `stage_publish_failed`.
const RETRY_QUEUE: usize = 10_000;
/// How long the writer keeps retrying after the last sink is dropped (shutdown).
const DRAIN: Duration = Duration::from_secs(5);

type AckFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = (Pending, Result<(), String>)> + Send>>;

async fn publish(
    js: &async_nats::jetstream::Context,
    p: Pending,
) -> Result<AckFuture, (Pending, String)> {
    match js.publish(STAGE_SUBJECT, p.bytes.clone()).await {
        Ok(ack) => Ok(Box::pin(async move {
            let res = ack.await.map(|_| ()).map_err(|e| e.to_string());
            (p, res)
        })),
        Err(e) => Err((p, e.to_string())),
    }
}

async fn write_batches(
    js: async_nats::jetstream::Context,
    mut rx: mpsc::Receiver<StageRecord>,
    metrics: Arc<Metrics>,
    batch_max: usize,
    linger: Duration,
) {
    let mut acks: FuturesUnordered<AckFuture> = FuturesUnordered::new();
    let mut retry: VecDeque<(tokio::time::Instant, Pending)> = VecDeque::new();
    let mut batch = Vec::with_capacity(batch_max);
    let mut open = true;
    let mut drain_until = None;
    loop {
        if !open && acks.is_empty() && retry.is_empty() {
            break;
        }
        if !open && drain_until.is_some_and(|d| tokio::time::Instant::now() >= d) {
            break;
        }
        let next_retry = retry.front().map(|(at, _)| *at);
        tokio::select! {
            biased;
            Some((p, res)) = acks.next(), if !acks.is_empty() => {
                if let Some(again) = note_ack(&metrics, p, res) {
                    schedule(&metrics, &mut retry, again);
                }
                continue;
            }
            _ = sleep_until(next_retry), if next_retry.is_some() => {
                let (_, p) = retry.pop_front().expect("a retry is due");
                Metrics::inc(&metrics.stage_publish_retries);
                match publish(&js, p).await {
                    Ok(ack) => acks.push(ack),
                    Err((p, e)) => {
                        tracing::debug!(error = %e, "stage batch publish failed again");
                        schedule(&metrics, &mut retry, p);
                    }
                }
                continue;
            }
            first = rx.recv(), if open => {
                let Some(first) = first else {
                    open = false;
                    drain_until = Some(tokio::time::Instant::now() + DRAIN);
                    continue;
                };
                batch.push(first);
            }
        }
        let deadline = tokio::time::Instant::now() + linger;
        while batch.len() < batch_max {
            // What is already there, without a timer per record; then wait out the linger.
            while batch.len() < batch_max {
                match rx.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) => break,
                }
            }
            if batch.len() >= batch_max {
                break;
            }
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(r)) => batch.push(r),
                _ => break,
            }
        }
        let pending = Pending {
            records: batch.len() as u64,
            bytes: encode_stage_batch(batch.iter()).into(),
            tries: 0,
        };
        batch.clear();
        match publish(&js, pending).await {
            Ok(ack) => acks.push(ack),
            Err((p, e)) => {
                tracing::warn!(records = p.records, error = %e, "stage batch not sent; retrying");
                schedule(&metrics, &mut retry, p);
            }
        }
        while acks.len() >= ACK_WINDOW {
            if let Some((p, res)) = acks.next().await {
                if let Some(again) = note_ack(&metrics, p, res) {
                    schedule(&metrics, &mut retry, again);
                }
            }
        }
    }
    let lost: u64 = retry.iter().map(|(_, p)| p.records).sum();
    if lost > 0 {
        metrics
            .stage_publish_failed
            .fetch_add(lost, Ordering::Relaxed);
        tracing::error!(records = lost, "stage records not stored before shutdown");
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Queues a failed batch for another try, with backoff; gives up the oldest when full.
fn schedule(
    metrics: &Metrics,
    retry: &mut VecDeque<(tokio::time::Instant, Pending)>,
    mut p: Pending,
) {
    p.tries += 1;
    let pause = RETRY_FIRST
        .saturating_mul(1 << p.tries.min(5))
        .min(RETRY_MAX);
    if retry.len() >= RETRY_QUEUE {
        if let Some((_, old)) = retry.pop_front() {
            metrics
                .stage_publish_failed
                .fetch_add(old.records, Ordering::Relaxed);
            tracing::error!(
                records = old.records,
                "stage batch given up: the retry queue is full"
            );
        }
    }
    // Batches keep their order of first failure; a later one never overtakes an earlier one.
    let at = tokio::time::Instant::now() + pause;
    let at = retry.back().map_or(at, |(last, _)| at.max(*last));
    retry.push_back((at, p));
}

/// Counts an acked batch, or hands a failed one back for another try.
fn note_ack(metrics: &Metrics, p: Pending, res: Result<(), String>) -> Option<Pending> {
    match res {
        Ok(()) => {
            Metrics::inc(&metrics.stage_batches);
            None
        }
        Err(e) => {
            tracing::warn!(records = p.records, tries = p.tries, error = %e, "stage batch not stored; retrying");
            Some(p)
        }
    }
}
