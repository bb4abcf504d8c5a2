//! The stored messages of one observed stream, read by msgtrail's own durable headers-only
//! consumer (`<durable>-observe`): each becomes its P2/P3 ([`super::records::stored_records`]).
//! The consumer is created when the stream appears (retried every discovery interval), and
//! reads from the stream's first message; a restart resumes where its acks stopped.
//! A work-queue stream is never read: a consumer of it would take messages away from the
//! app (its acks remove them) and keep the app's unfiltered consumers out; its messages
//! are traced from their deliveries alone (the trajectory's `observed.stored` false).
//! Where it is ([`Reader`]: waiting, reading, refused by the stream or not read) goes to the shared
//! status: the API shows it (`reads_messages`) and the trace export's hold asks it
//! (`super::hold`).

use super::discovery::Reader;
use super::records::{stored_records, StoredMessage};
use super::Observer;
use crate::ingest::{apply, Batch, Source};
use async_nats::jetstream::{self, consumer};
use futures::StreamExt;
use msgtrail_core::StageRecord;
use std::sync::Arc;
use std::time::Duration;

/// Why a work-queue stream's messages are not read (its deliveries are traced all the same).
const WORK_QUEUE: &str = "a work-queue stream: msgtrail does not read its messages (a reader would remove them from the queue); its deliveries are traced without store hops";

/// The headers-only consumer of an observed stream: every message from the first, explicit
/// acks after each transaction commits.
pub(crate) fn consumer_config(
    name: &str,
    batch_size: usize,
    ack_wait: Duration,
) -> consumer::pull::Config {
    consumer::pull::Config {
        durable_name: Some(name.to_owned()),
        description: Some("msgtrail listener, observe mode: stored messages (headers only)".into()),
        headers_only: true,
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait,
        max_ack_pending: (batch_size * 8).max(1024) as i64,
        deliver_policy: consumer::DeliverPolicy::All,
        ..Default::default()
    }
}

/// The P2/P3 of stored messages; `warn` logs those that cannot be placed.
fn decode(msgs: &[jetstream::Message], warn: bool) -> Vec<StageRecord> {
    let mut out = Vec::with_capacity(msgs.len() * 2);
    for m in msgs {
        let Ok(info) = m.info() else { continue };
        let found = stored_records(StoredMessage {
            stream: info.stream,
            subject: m.subject.as_str(),
            stream_seq: info.stream_sequence,
            stored_at: info.published.unix_timestamp_nanos().max(0) as u64,
            headers: m.headers.as_ref(),
        });
        match found {
            Ok(rs) => out.extend(rs),
            Err(e) if warn => tracing::warn!(error = %e, "observed message skipped"),
            Err(_) => {}
        }
    }
    out
}

/// Reads one observed stream's stored messages until stopped; waits for the stream (and
/// goes back to waiting when it or the consumer is deleted).
pub(crate) async fn run(obs: Arc<Observer>, stream: String) {
    loop {
        let Some(c) = obs
            .wait_for(&stream, |s| {
                let cfg = consumer_config(&obs.own_consumer, obs.batch_size, obs.ack_wait);
                let (status, name) = (obs.status.clone(), stream.clone());
                async move {
                    if s.cached_info().config.retention
                        == jetstream::stream::RetentionPolicy::WorkQueue
                    {
                        // A consumer of a work-queue stream takes its messages away from the
                        // app (its acks remove them) and keeps the app's unfiltered consumers
                        // out: never read one.
                        status.set_reader(&name, Reader::Refused);
                        return Err(async_nats::Error::from(WORK_QUEUE));
                    }
                    let c = crate::ingest::durable_consumer(&s, cfg).await;
                    if c.is_err() {
                        // The stream is there but will not have msgtrail's consumer.
                        status.set_reader(&name, Reader::Refused);
                    }
                    c
                }
            })
            .await
        else {
            return;
        };
        let messages = match c
            .stream()
            .max_messages_per_batch(obs.batch_size)
            .heartbeat(Duration::from_secs(5))
            .expires(Duration::from_secs(30))
            .messages()
            .await
        {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(%stream, error = %e, "observed stream's consumer unavailable; retrying");
                continue;
            }
        };
        obs.status.set_reader(&stream, Reader::Reading);
        let mut chunks = messages.ready_chunks(obs.batch_size);
        loop {
            let chunk = tokio::select! {
                _ = obs.stop.cancelled() => return,
                c = chunks.next() => match c { Some(c) => c, None => break },
            };
            let mut msgs = Vec::with_capacity(chunk.len());
            let mut lost = false;
            for m in chunk {
                match m {
                    Ok(m) => msgs.push(m),
                    Err(e) if e.kind() == consumer::pull::MessagesErrorKind::ConsumerDeleted => {
                        lost = true
                    }
                    Err(e) => {
                        tracing::debug!(%stream, error = %e, "observed stream consumer error")
                    }
                }
            }
            if !msgs.is_empty() {
                let mut batch = Batch::with_redecode(
                    Source::Observed,
                    Arc::new(|m: &[jetstream::Message]| decode(m, false)),
                );
                batch.records = decode(&msgs, true);
                for m in msgs {
                    batch.ack_after_commit(m);
                }
                apply(
                    batch,
                    &obs.sinks.store,
                    &obs.sinks.stats,
                    obs.sinks.exporter.as_ref(),
                    &obs.stop,
                )
                .await;
            }
            if lost {
                break;
            }
        }
        obs.status.set_reader(&stream, Reader::Waiting);
        tracing::warn!(%stream, "observed stream's consumer ended; waiting for the stream again");
    }
}
