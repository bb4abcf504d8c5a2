//! The producer: opens a producer channel and uploads messages, retrying on timeout with the
//! same request ID so that the broker stores a retried message once.
//!
//! ## Batching
//! Every send goes through the producer's batcher task: `send` and
//! `send_message` still return their own message's result, but messages travel to the broker
//! as binary upload batches (`msgtrail.v1.upload.batch`, one result per message). Batching
//! adapts to load and adds no latency when idle: with no batch request in flight a message
//! goes out at once, alone; while up to [`ProducerOptions::max_inflight_batches`] requests
//! are in flight, new messages queue, and the next request takes everything queued, up to
//! [`ProducerOptions::max_batch_messages`] messages and [`ProducerOptions::max_batch_bytes`].
//! [`ProducerOptions::linger`] above zero waits that long for more before sending a batch that
//! is not full. `max_batch_messages: 1` sends one message per request.
//!
//! Each message keeps its own fate: a message the broker refuses fails alone; a transient
//! failure (of its entry, or of the whole request: timeout, no broker, `unavailable`) retries
//! that message with the same request ID and the next attempt number, after a backoff. Hooks
//! fire per message as they always did: [`HookEvent::BeforeSend`] when its attempt leaves (in
//! a batch), [`HookEvent::AfterSend`] when the reply is in, [`HookEvent::StoreConfirmed`] when
//! it is stored.
//!
//! Stage records ride along ([`crate::reporter`]): each entry carries its send time, from which
//! the broker writes P1, and the producer's P4 records travel inside later upload batches.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use msgtrail_client::{Identity, Producer};
//! use msgtrail_core::ClientId;
//! let nats = async_nats::connect("nats://127.0.0.1:4222").await?;
//! let me = Identity::from_seed(ClientId::new("shop")?, "SUA…")?;
//! let producer = Producer::connect(nats, me).await?;
//! let reply = producer.send("orders.eu", "hello").await?;
//! println!("stored as {}", reply.message_id);
//! # Ok(()) }
//! ```

use crate::batch::{self, Flight, Job, Limits, Queue};
use crate::channel::{frame_budget, Channel};
use crate::error::{Cause, ClientError};
use crate::hooks::{HookEvent, Hooks};
use crate::identity::Identity;
use crate::reporter::{self, Outbox, Reporter, Reporting};
use crate::topic::ToTopic;
use bytes::Bytes;
use futures::future::BoxFuture;
use msgtrail_core::frame::{
    self, ReportedRecord, UploadBatch, UploadEntry, UploadResult, UploadResults,
};
use msgtrail_core::headers as h;
use msgtrail_core::subjects as s;
use msgtrail_core::time::now_nanos;
use msgtrail_core::wire::UploadReply;
use msgtrail_core::{RequestId, Role, Topic};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

mod options;

pub use options::{Outgoing, ProducerOptions};

/// A producer; cheap to clone, and many sends may be in flight at once (they share one
/// batcher).
#[derive(Debug, Clone)]
pub struct Producer {
    channel: Arc<Channel>,
    hooks: Hooks,
    options: ProducerOptions,
    reporting: Reporting,
    uploads: Queue<Uploads>,
}

/// The result of one upload attempt.
type Outcome = Result<UploadReply, ClientError>;

/// A validated message, ready for any attempt.
#[derive(Debug)]
struct Prepared {
    request_id: RequestId,
    topic: Topic,
    /// The entry, its attempt and send time filled in per attempt.
    entry: UploadEntry,
    traceparent: Option<String>,
}

impl Prepared {
    fn new(msg: Outgoing) -> Result<Self, ClientError> {
        let invalid = |e: h::AttrError| ClientError::Invalid(Cause::new(e));
        let topic = msg.topic.map_err(|e| ClientError::Invalid(Cause::new(e)))?;
        for (k, v) in &msg.attrs {
            h::validate_attr_key(k).map_err(invalid)?;
            h::validate_attr_value(k, v).map_err(invalid)?;
        }
        let request_id = msg.request_id.unwrap_or_else(RequestId::generate);
        let entry = UploadEntry {
            request_id: request_id.as_str().to_owned(),
            topic: topic.as_str().to_owned(),
            attempt: 0,
            sent_at: 0,
            traceparent: msg.traceparent.clone().unwrap_or_default(),
            attrs: msg.attrs.into_iter().collect(),
            payload: msg.payload,
        };
        Ok(Prepared {
            request_id,
            topic,
            entry,
            traceparent: msg.traceparent,
        })
    }

    /// The job of attempt `attempt`, and where its result comes.
    fn job(&self, attempt: u32) -> (Job<Attempt, Outcome>, oneshot::Receiver<Outcome>) {
        let mut entry = self.entry.clone();
        entry.attempt = attempt;
        let size = entry_size(&entry);
        Job::new(
            Attempt {
                request_id: self.request_id.clone(),
                topic: self.topic.clone(),
                entry,
                traceparent: self.traceparent.clone(),
            },
            size,
        )
    }
}

/// The encoded size of an upload entry in a batch frame.
pub(crate) fn entry_size(e: &UploadEntry) -> usize {
    (1 + e.request_id.len())
        + (2 + e.topic.len())
        + 4 // attempt
        + 8 // sent_at
        + (1 + e.traceparent.len())
        + 1 // attribute count
        + e.attrs.iter().map(|(k, v)| 3 + k.len() + v.len()).sum::<usize>()
        + (4 + e.payload.len())
}

/// Bytes of an upload batch frame besides its entries and reports: head, entry count, report
/// count.
const UPLOAD_FRAME_OVERHEAD: usize = 4 + 2 + 2;

/// One upload attempt of one message, queued for a batch.
#[derive(Debug)]
struct Attempt {
    request_id: RequestId,
    topic: Topic,
    entry: UploadEntry,
    traceparent: Option<String>,
}

/// Sends upload batches: the producer's [`Flight`].
#[derive(Debug)]
struct Uploads {
    channel: Arc<Channel>,
    hooks: Hooks,
    outbox: Option<Arc<Outbox>>,
    timeout: Duration,
    /// The test-only clock offset of the options.
    clock_offset_nanos: i64,
}

impl Flight for Uploads {
    type Item = Attempt;
    type Output = Outcome;

    fn send(
        self: Arc<Self>,
        batch: Vec<Job<Attempt, Outcome>>,
        spare_bytes: usize,
    ) -> BoxFuture<'static, ()> {
        Box::pin(async move { self.upload(batch, spare_bytes).await })
    }
}

/// Whether a failed request may never have reached the broker (so the broker wrote no P1).
fn maybe_unseen(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Timeout { .. } | ClientError::NoBroker { .. } | ClientError::Nats(_)
    )
}

/// One attempt in a batch request, waiting for its result: its request ID, the
/// [`HookEvent::BeforeSend`] it was sent with, and where its result goes.
type Pending = (RequestId, HookEvent, oneshot::Sender<Outcome>);

impl Uploads {
    async fn upload(&self, batch: Vec<Job<Attempt, Outcome>>, spare_bytes: usize) {
        let (entries, pending) = self.stamp(batch);
        let (reports, ticket) = reporter::ride_along(
            self.outbox.as_ref(),
            spare_bytes.saturating_sub(UPLOAD_FRAME_OVERHEAD),
        );
        let body = UploadBatch {
            entries,
            reports,
            ..Default::default()
        }
        .encode();
        let reply = self
            .channel
            .request_on_channel(s::UPLOAD_BATCH, body, self.timeout)
            .await;
        let at = now_nanos();
        let reply = reply.and_then(|m| {
            let r = UploadResults::decode(&m.payload).map_err(ClientError::decode)?;
            Ok((r.results, r.reports))
        });
        let results = reporter::batch_results(reply, pending.len(), ("upload", "messages"), ticket)
            .inspect_err(|e| self.report_unseen(e, &pending));
        self.answer(pending, &results, at);
    }

    /// Stamps each attempt with its send time (P1 rides as the entry's `sent_at`; without
    /// reporting there is none) and tells the hooks it leaves.
    fn stamp(&self, batch: Vec<Job<Attempt, Outcome>>) -> (Vec<UploadEntry>, Vec<Pending>) {
        let sent_at = now_nanos();
        let mut entries = Vec::with_capacity(batch.len());
        let mut pending = Vec::with_capacity(batch.len());
        for job in batch {
            let Attempt {
                request_id,
                topic,
                mut entry,
                traceparent,
            } = job.item;
            let before = HookEvent::BeforeSend {
                request_id: request_id.clone(),
                topic,
                attempt: entry.attempt,
                traceparent,
                at: sent_at,
            };
            entry.sent_at = if self.outbox.is_some() {
                crate::reporter::shifted(sent_at, self.clock_offset_nanos)
            } else {
                0
            };
            entries.push(entry);
            self.hooks.emit(before.clone());
            pending.push((request_id, before, job.reply));
        }
        (entries, pending)
    }

    /// The broker may never have seen the attempts of a failed request, so it wrote no P1
    /// for them: report them (a P1 it did write has the same dedup key).
    fn report_unseen(&self, e: &ClientError, pending: &[Pending]) {
        if let (Some(outbox), true) = (&self.outbox, maybe_unseen(e)) {
            for (_, before, _) in pending {
                if let Some(record) = reporter::record_of(before) {
                    outbox.push(ReportedRecord {
                        record,
                        token: String::new(),
                    });
                }
            }
        }
    }

    /// Gives each attempt its result, telling the hooks.
    fn answer(
        &self,
        pending: Vec<Pending>,
        results: &Result<Vec<UploadResult>, ClientError>,
        at: u64,
    ) {
        for (i, (request_id, before, reply)) in pending.into_iter().enumerate() {
            let HookEvent::BeforeSend { topic, attempt, .. } = before else {
                unreachable!("built by stamp")
            };
            let outcome = match results {
                Ok(rs) => match &rs[i] {
                    UploadResult::Stored {
                        message_id,
                        stream_seq,
                        duplicate,
                        receipt,
                    } => Ok(UploadReply {
                        message_id: *message_id,
                        request_id: request_id.clone(),
                        stream_seq: *stream_seq,
                        duplicate: *duplicate,
                        receipt: receipt.clone(),
                    }),
                    UploadResult::Refused(e) => Err(ClientError::Refused(e.clone())),
                },
                Err(e) => Err(e.clone()),
            };
            self.hooks.emit_with(|| HookEvent::AfterSend {
                request_id,
                topic,
                attempt,
                result: outcome.clone(),
                at,
            });
            if let Ok(reply) = &outcome {
                self.hooks.emit_with(|| HookEvent::StoreConfirmed {
                    reply: reply.clone(),
                    at,
                });
            }
            // The caller may have stopped waiting.
            let _ = reply.send(outcome);
        }
    }
}

impl Producer {
    /// Opens a producer channel with default options.
    pub async fn connect(
        client: async_nats::Client,
        identity: Identity,
    ) -> Result<Self, ClientError> {
        Self::connect_with(client, identity, ProducerOptions::default()).await
    }

    /// Opens a producer channel.
    pub async fn connect_with(
        client: async_nats::Client,
        identity: Identity,
        options: ProducerOptions,
    ) -> Result<Self, ClientError> {
        let max_bytes = frame_budget(&client, options.max_batch_bytes);
        let channel = Channel::open(client, identity, Role::Producer, options.timeout).await?;
        let hooks = Hooks::default();
        let reporting = Reporting::start(
            (options.report_stages, options.clock_offset_nanos),
            &hooks,
            &channel,
            frame_budget(&channel.client, None),
        );
        let limits = Limits {
            max_messages: options.max_batch_messages,
            max_bytes: max_bytes.saturating_sub(UPLOAD_FRAME_OVERHEAD),
            max_inflight: options.max_inflight_batches,
            linger: options.linger,
        }
        .clamped(frame::MAX_BATCH_ENTRIES);
        let uploads = batch::spawn(
            Arc::new(Uploads {
                channel: channel.clone(),
                hooks: hooks.clone(),
                outbox: reporting.outbox.clone(),
                timeout: options.timeout,
                clock_offset_nanos: options.clock_offset_nanos,
            }),
            limits,
        );
        Ok(Producer {
            channel,
            hooks,
            options,
            reporting,
            uploads,
        })
    }

    /// The hook registry: register functions for send events here.
    pub fn hooks(&self) -> &Hooks {
        &self.hooks
    }

    /// The stage reporter's counters, if reporting is on.
    pub fn reporter(&self) -> Option<&Reporter> {
        self.reporting.counters.as_deref()
    }

    /// Sends `payload` to `topic` with a generated request ID.
    pub async fn send(
        &self,
        topic: impl ToTopic,
        payload: impl Into<Bytes>,
    ) -> Result<UploadReply, ClientError> {
        self.send_message(Outgoing::new(topic, payload)).await
    }

    /// Sends a message, retrying transient failures with the same request ID. The message
    /// travels in a batch with whatever else this producer is sending (see the module docs).
    pub async fn send_message(&self, msg: Outgoing) -> Result<UploadReply, ClientError> {
        let prepared = Prepared::new(msg)?;
        let (job, rx) = prepared.job(1);
        batch::submit(&self.uploads, vec![job]).await?;
        self.settle_attempts(prepared, rx).await
    }

    /// Sends several messages, queued together (so they leave in as few batch requests as
    /// the limits allow), each retried on its own; one result per message, in order.
    pub async fn send_batch(&self, msgs: Vec<Outgoing>) -> Vec<Result<UploadReply, ClientError>> {
        let mut jobs = Vec::with_capacity(msgs.len());
        let mut slots = Vec::with_capacity(msgs.len());
        for msg in msgs {
            slots.push(Prepared::new(msg).map(|p| {
                let (job, rx) = p.job(1);
                jobs.push(job);
                (p, rx)
            }));
        }
        // If the batcher is gone the jobs are dropped, and each waiter says so.
        let _ = batch::submit(&self.uploads, jobs).await;
        futures::future::join_all(slots.into_iter().map(|slot| async move {
            let (p, rx) = slot?;
            self.settle_attempts(p, rx).await
        }))
        .await
    }

    /// Waits for the result of attempt 1 (`rx`), and retries transient failures.
    async fn settle_attempts(
        &self,
        prepared: Prepared,
        mut rx: oneshot::Receiver<Outcome>,
    ) -> Result<UploadReply, ClientError> {
        let mut backoff = msgtrail_core::Backoff::new(self.options.retry_backoff, Duration::MAX);
        let mut attempt = 1;
        loop {
            let result = rx.await.unwrap_or_else(|_| Err(batch::stopped()));
            match result {
                Err(e) if e.is_transient() && attempt < self.options.max_attempts => {
                    tracing::debug!(request_id = %prepared.request_id, attempt, error = %msgtrail_core::ErrorChain(&e),
                        "upload failed; retrying with the same request id");
                    tokio::time::sleep(backoff.next_pause()).await;
                    attempt += 1;
                    let (job, next) = prepared.job(attempt);
                    batch::submit(&self.uploads, vec![job]).await?;
                    rx = next;
                }
                other => return other,
            }
        }
    }

    /// Sends the stage reports still queued (waiting up to the request timeout), then closes
    /// the channel. Without `close`, dropping the last clone still sends them, and the
    /// channel expires by itself.
    pub async fn close(self) -> Result<(), ClientError> {
        self.reporting
            .finish(&self.hooks, self.options.timeout)
            .await;
        self.channel.close().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_sizes_match_the_encoding() {
        let msg = Outgoing::new("orders.eu", vec![7u8; 1000])
            .attr("category", "refund")
            .attr("k", "é");
        let msg = msg.traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        let p = Prepared::new(msg).unwrap();
        let (job, _rx) = p.job(2);
        let batch = UploadBatch {
            entries: vec![job.item.entry.clone(), job.item.entry],
            reports: vec![],
            ..Default::default()
        };
        assert_eq!(
            batch.encode().len(),
            UPLOAD_FRAME_OVERHEAD + 2 * job.size,
            "the byte bound counts what is sent"
        );
    }

    #[test]
    fn invalid_messages_fail_before_sending() {
        assert!(Prepared::new(Outgoing::new("orders.*", "x")).is_err());
        assert!(Prepared::new(Outgoing::new("orders.eu", "x").attr("bad key", "v")).is_err());
        let p = Prepared::new(Outgoing::new("orders.eu", "x")).unwrap();
        assert_eq!(p.entry.request_id, p.request_id.as_str());
    }
}
