//! Reading the stage stream: a durable pull consumer, batches applied to the store in one
//! transaction each, acknowledged only after the transaction committed.
//!
//! A crash between commit and ack makes JetStream redeliver the batch; the store skips the
//! records it already holds, so nothing is lost and nothing is applied twice.

use crate::error::ListenerError;
use crate::export::ExportSender;
use crate::stats::Stats;
use crate::store::Store;
use async_nats::jetstream::{self, consumer, stream, AckKind};
use futures::StreamExt;
use msgtrail_core::record::decode_batch;
use msgtrail_core::subjects::{STAGE_STREAM, STAGE_SUBJECT};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long the stage stream keeps records when the listener is the one that creates it:
/// the broker's default (`stage_max_age`, 7 days), so that a stream created by either is the
/// same.
pub const STAGE_STREAM_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

/// The stage stream's configuration, as the broker creates it (single replica, default
/// maximum age); whoever starts first creates it, the other gets it as it is.
pub fn stage_stream_config() -> stream::Config {
    stream::Config {
        name: STAGE_STREAM.to_owned(),
        subjects: vec![STAGE_SUBJECT.to_owned()],
        storage: stream::StorageType::File,
        retention: stream::RetentionPolicy::Limits,
        num_replicas: 1,
        max_age: STAGE_STREAM_MAX_AGE,
        allow_direct: true,
        description: Some("msgtrail stage records (newline-delimited JSON batches)".into()),
        ..Default::default()
    }
}

/// Creates (or gets) the stage stream and the listener's durable consumer on it.
pub async fn consumer(
    js: &jetstream::Context,
    durable: &str,
    batch_size: usize,
    ack_wait: Duration,
) -> Result<consumer::PullConsumer, ListenerError> {
    let stream = js
        .get_or_create_stream(stage_stream_config())
        .await
        .map_err(|e| ListenerError::Nats(format!("stage stream {STAGE_STREAM}: {e}")))?;
    stream
        .get_or_create_consumer(
            durable,
            consumer::pull::Config {
                durable_name: Some(durable.to_owned()),
                description: Some("msgtrail listener".to_owned()),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait,
                max_ack_pending: (batch_size * 8).max(1024) as i64,
                deliver_policy: consumer::DeliverPolicy::All,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| ListenerError::Nats(format!("durable consumer {durable}: {e}")))
}

/// Applies stage-stream messages until `stop` turns true.
pub async fn run(
    consumer: consumer::PullConsumer,
    store: Arc<Store>,
    stats: Arc<Stats>,
    exporter: Option<ExportSender>,
    batch_size: usize,
    mut stop: watch::Receiver<bool>,
) -> Result<(), ListenerError> {
    let messages = consumer
        .stream()
        .max_messages_per_batch(batch_size)
        .heartbeat(Duration::from_secs(5))
        .expires(Duration::from_secs(30))
        .messages()
        .await
        .map_err(|e| ListenerError::Nats(format!("stage stream consumer: {e}")))?;
    let mut chunks = messages.ready_chunks(batch_size);
    loop {
        let chunk = tokio::select! {
            _ = crate::stopped(&mut stop) => break,
            c = chunks.next() => match c {
                Some(c) => c,
                None => return Err(ListenerError::Nats("stage stream consumer ended".into())),
            },
        };
        let mut msgs = Vec::with_capacity(chunk.len());
        for m in chunk {
            match m {
                Ok(m) => msgs.push(m),
                Err(e) => tracing::warn!(error = %e, "stage stream consumer error"),
            }
        }
        if msgs.is_empty() {
            continue;
        }
        apply(&msgs, &store, &stats, exporter.as_ref()).await;
    }
    Ok(())
}

#[tracing::instrument(skip_all, fields(messages = msgs.len()))]
async fn apply(
    msgs: &[jetstream::Message],
    store: &Arc<Store>,
    stats: &Arc<Stats>,
    exporter: Option<&ExportSender>,
) {
    let mut records = Vec::new();
    let mut good = Vec::with_capacity(msgs.len());
    let mut oldest_published: Option<i128> = None;
    for m in msgs {
        match decode_batch(&m.payload) {
            Ok(rs) => {
                records.extend(rs);
                good.push(m);
                if let Ok(info) = m.info() {
                    let p = info.published.unix_timestamp_nanos();
                    oldest_published = Some(oldest_published.map_or(p, |o| o.min(p)));
                }
            }
            Err(e) => {
                // A batch that can never decode would come back forever: count and drop it.
                tracing::warn!(error = %e, "undecodable stage batch dropped");
                stats.decode_error();
                if let Err(e) = m.ack_with(AckKind::Term).await {
                    tracing::warn!(error = %e, "term of an undecodable batch failed");
                }
            }
        }
    }
    let now = msgtrail_core::time::now_nanos();
    let st = store.clone();
    let result = tokio::task::spawn_blocking(move || st.apply(records, now)).await;
    match result {
        Ok(Ok(mut outcome)) => {
            stats.record_batch(good.len() as u64, &outcome, now);
            if let Some(x) = exporter {
                x.offer(std::mem::take(&mut outcome.trajectories));
            }
            if let Some(p) = oldest_published {
                stats.set_last_lag((now as i128 - p).max(0) as f64 / 1e6);
            }
            for m in good {
                if let Err(e) = m.ack().await {
                    tracing::warn!(error = %e, "ack of a stage batch failed; it will be redelivered and skipped");
                }
            }
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "store failed; the batch will be redelivered");
            stats.store_error();
            for m in good {
                let _ = m.ack_with(AckKind::Nak(Some(Duration::from_secs(1)))).await;
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "store task panicked; the batch will be redelivered");
            stats.store_error();
        }
    }
}
