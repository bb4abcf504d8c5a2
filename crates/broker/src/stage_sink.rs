//! The stage sink: the only writer of the stage stream (DESIGN.md §3.4, §3.5).
//!
//! Handlers call [`StageSink::record`], which never waits: the record goes into a bounded
//! buffer, or is dropped and counted when the buffer is full. One writer task drains the
//! buffer into batches (up to `stage_batch_max` records or `stage_batch_linger` of waiting)
//! and publishes each batch as one JetStream message of newline-delimited JSON, with a window
//! of publish acks in flight. Every record is also a `tracing` event with target
//! `msgtrail::stage` (level DEBUG).

use crate::metrics::Metrics;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use msgtrail_core::record::encode_batch;
use msgtrail_core::subjects::STAGE_SUBJECT;
use msgtrail_core::StageRecord;
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

async fn write_batches(
    js: async_nats::jetstream::Context,
    mut rx: mpsc::Receiver<StageRecord>,
    metrics: Arc<Metrics>,
    batch_max: usize,
    linger: Duration,
) {
    let mut acks = FuturesUnordered::new();
    let mut batch = Vec::with_capacity(batch_max);
    loop {
        tokio::select! {
            biased;
            Some((n, res)) = acks.next(), if !acks.is_empty() => {
                note_ack(&metrics, n, res);
                continue;
            }
            first = rx.recv() => {
                let Some(first) = first else { break };
                batch.push(first);
            }
        }
        let deadline = tokio::time::Instant::now() + linger;
        while batch.len() < batch_max {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(r)) => batch.push(r),
                _ => break,
            }
        }
        let n = batch.len() as u64;
        let bytes = encode_batch(batch.iter());
        batch.clear();
        match js.publish(STAGE_SUBJECT, bytes.into()).await {
            Ok(ack) => acks.push(async move { (n, ack.await.map(|_| ())) }),
            Err(e) => note_ack(&metrics, n, Err(e)),
        }
        while acks.len() >= ACK_WINDOW {
            if let Some((n, res)) = acks.next().await {
                note_ack(&metrics, n, res);
            }
        }
    }
    while let Some((n, res)) = acks.next().await {
        note_ack(&metrics, n, res);
    }
}

fn note_ack<E: std::fmt::Display>(metrics: &Metrics, n: u64, res: Result<(), E>) {
    match res {
        Ok(()) => Metrics::inc(&metrics.stage_batches),
        Err(e) => {
            metrics.stage_publish_failed.fetch_add(n, Ordering::Relaxed);
            tracing::warn!(records = n, error = %e, "stage batch not stored");
        }
    }
}
