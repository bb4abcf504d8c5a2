//! Storing accepted uploads in the message stream — first attempts as one fast-ingest batch
//! (one JetStream ack), everything else with all PubAcks in flight at once — and reading back
//! the original's ID when JetStream names a duplicate.

use super::*;
use msgtrail_core::partition::Partition;
use msgtrail_nats::fast_ingest::{FastIngestError, FastMessage};

/// What JetStream said of one stored upload.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ack {
    /// The stream sequence (of the original, for a duplicate).
    pub(super) sequence: u64,
    /// Whether the upload was a duplicate.
    pub(super) duplicate: bool,
}

/// The headers of a stored message (docs/PROTOCOL.md §14.1): `Nats-Msg-Id`
/// (`<producer>:<request id>`, JetStream's dedup), `Msgtrail-Message-Id`, `Msgtrail-Stored`
/// (request ID, producer service and — when `broker_service` is given, i.e. with stage
/// recording on — the store evidence), the attributes and `traceparent`.
pub(super) fn stored_headers(
    channel: &OpenChannel,
    up: &Upload,
    message_id: &MessageId,
    received_at: u64,
    broker_service: Option<&str>,
) -> HeaderMap {
    let mut stored = HeaderMap::new();
    let mut dedup = String::with_capacity(channel.client_id.as_str().len() + 1 + 40);
    dedup.push_str(channel.client_id.as_str());
    dedup.push(':');
    dedup.push_str(up.request_id.as_str());
    stored.insert(h::NATS_MSG_ID, dedup.as_str());
    stored.insert(h::MESSAGE_ID, message_id.to_string().as_str());
    // What only msgtrail reads, in one header (msgtrail_core::stored): the producer is in
    // Nats-Msg-Id, the topic in the subject.
    let service = channel.service_name.as_str();
    let mut meta = String::with_capacity(
        8 + up.request_id.as_str().len() + service.len() + 32 + broker_service.map_or(0, str::len),
    );
    // The store evidence (module doc): the listener derives P2/P3 from it.
    let evidence = broker_service.map(|b| (up.attempt, received_at, b));
    msgtrail_core::stored::encode(&mut meta, up.request_id.as_str(), service, evidence);
    stored.insert(h::STORED, meta.as_str());
    for (k, v) in &up.attrs {
        let mut name = String::with_capacity(h::ATTR_PREFIX.len() + k.len());
        name.push_str(h::ATTR_PREFIX);
        name.push_str(k);
        stored.insert(name.as_str(), v.as_str());
    }
    if let Some(tp) = &up.traceparent {
        stored.insert(h::TRACEPARENT, tp.as_str());
    }
    stored
}

impl Uploader {
    /// The headers of a stored message, store evidence with stage recording on.
    pub(super) fn stored_headers(
        &self,
        channel: &OpenChannel,
        up: &Upload,
        message_id: &MessageId,
        received_at: u64,
    ) -> HeaderMap {
        let config = &self.shared.config;
        let broker = config.record_stages.then_some(config.service_name.as_str());
        stored_headers(channel, up, message_id, received_at, broker)
    }

    /// Stores every upload and answers each: a new message, a duplicate, or an error of its
    /// own. First attempts (two or more) go as one fast-ingest batch when the server has them
    /// (one JetStream ack for the batch); the rest — retries (attempt > 1, whose duplicates
    /// must be reported, and a fast batch silently drops them), a lone upload, what a fast
    /// batch did not store, every upload on older servers — with one PubAck each, all in
    /// flight at once.
    pub(super) async fn store_all(
        &self,
        channel: &OpenChannel,
        uploads: Vec<(Upload, u64)>,
    ) -> Vec<Result<UploadReply, WireError>> {
        let pending: Vec<(Upload, u64, MessageId)> = uploads
            .into_iter()
            .map(|(up, received_at)| {
                // Minted in the request's stage partition: its P1 and every record of
                // the message reach the same listeners (msgtrail_core::partition).
                let id = MessageId::new_in(Partition::of_request(&up.request_id));
                (up, received_at, id)
            })
            .collect();
        let mut acks: Vec<Option<Result<Ack, PublishError>>> = std::iter::repeat_with(|| None)
            .take(pending.len())
            .collect();
        self.store_fast(channel, &pending, &mut acks).await;
        self.store_windowed(channel, &pending, &mut acks).await;
        // Nobody answered: probe once what that means (module doc of crate::js_probe).
        let unanswered = acks
            .iter()
            .any(|a| matches!(a, Some(Err(e)) if e.kind() == PublishErrorKind::StreamNotFound));
        let js = match unanswered {
            true => self.shared.js_probe.state(&self.shared.client).await,
            false => JetStreamState::Answering,
        };
        let timeout = self.shared.config.store_timeout;
        let mut out = Vec::with_capacity(pending.len());
        for ((up, received_at, message_id), ack) in pending.into_iter().zip(acks) {
            out.push(match ack.expect("every upload published") {
                Ok(ack) => self.stored(channel, up, received_at, message_id, ack).await,
                Err(e) => Err(store_failure(&e, js, timeout)),
            });
        }
        out
    }

    /// The fast-ingest batch of the first attempts, if there is one: answers the prefix it
    /// stored (each at its own, proven, stream sequence) and leaves the rest unanswered —
    /// unless the batch got no answer at all, which fails its uploads: published again the
    /// ordinary way, they would wait as long again, past the client's timeout (the client
    /// retries with the same request IDs; dedup answers what the batch did store).
    async fn store_fast(
        &self,
        channel: &OpenChannel,
        pending: &[(Upload, u64, MessageId)],
        acks: &mut [Option<Result<Ack, PublishError>>],
    ) {
        let Some(fast) = self.shared.fast.as_ref().filter(|f| !f.is_disabled()) else {
            return;
        };
        let firsts: Vec<usize> = (0..pending.len())
            .filter(|&i| pending[i].0.attempt == 1)
            .collect();
        if firsts.len() < 2 {
            return;
        }
        let messages = firsts
            .iter()
            .map(|&i| {
                let (up, received_at, message_id) = &pending[i];
                FastMessage {
                    subject: message_subject(up.topic.as_str()),
                    headers: self.stored_headers(channel, up, message_id, *received_at),
                    payload: up.payload.clone(),
                }
            })
            .collect();
        Metrics::inc(&self.shared.metrics.fast_batches);
        let count = match fast.publish(messages).await {
            Ok(stored) => {
                for (j, &i) in firsts.iter().take(stored.count).enumerate() {
                    acks[i] = Some(Ok(Ack {
                        sequence: stored.first_seq + j as u64,
                        duplicate: false,
                    }));
                }
                stored.count
            }
            Err(FastIngestError::NotAcknowledged { no_responders, .. }) => {
                let kind = match no_responders {
                    true => PublishErrorKind::StreamNotFound,
                    false => PublishErrorKind::TimedOut,
                };
                for &i in &firsts {
                    acks[i] = Some(Err(PublishError::new(kind)));
                }
                // Not a fallback: nothing is published again.
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, "fast-ingest batch not used");
                0
            }
        };
        self.shared.metrics.fast_batch_fallbacks.fetch_add(
            (firsts.len() - count) as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Publishes every upload not answered yet with its own PubAck, all in flight at once.
    async fn store_windowed(
        &self,
        channel: &OpenChannel,
        pending: &[(Upload, u64, MessageId)],
        acks: &mut [Option<Result<Ack, PublishError>>],
    ) {
        if acks.iter().all(Option::is_some) {
            return;
        }
        // No fast batch of this broker runs until these are stored: one of them between two
        // of its messages would end it early.
        let paused = match &self.shared.fast {
            Some(fast) => Some(fast.pause().await),
            None => None,
        };
        let mut sent = Vec::new();
        for (i, (up, received_at, message_id)) in pending.iter().enumerate() {
            if acks[i].is_some() {
                continue;
            }
            let headers = self.stored_headers(channel, up, message_id, *received_at);
            // Sends now; the ack is awaited below, together with the batch's other acks.
            let ack = self
                .shared
                .js
                .publish_with_headers(
                    message_subject(up.topic.as_str()),
                    headers,
                    up.payload.clone(),
                )
                .await;
            sent.push((i, ack));
        }
        let answered = futures::future::join_all(sent.into_iter().map(|(i, sent)| async move {
            let ack = match sent {
                Ok(ack) => ack.await,
                Err(e) => Err(e),
            };
            (i, ack)
        }))
        .await;
        drop(paused);
        for (i, ack) in answered {
            acks[i] = Some(ack.map(|a| Ack {
                sequence: a.sequence,
                duplicate: a.duplicate,
            }));
        }
    }

    /// Records and answers one upload that JetStream acknowledged.
    pub(super) async fn stored(
        &self,
        channel: &OpenChannel,
        up: Upload,
        received_at: u64,
        message_id: MessageId,
        ack: Ack,
    ) -> Result<UploadReply, WireError> {
        // A duplicate of its own copy is not one: a fast batch stored it without proving it
        // (module doc of msgtrail_nats::fast_ingest) and it was published again; it is
        // answered as stored, at the sequence JetStream names.
        let original = match ack.duplicate {
            true => Some(self.original_id(ack.sequence).await?).filter(|o| *o != message_id),
            false => None,
        };
        if let Some(original) = original {
            Metrics::inc(&self.shared.metrics.duplicates);
            let mut d1 = self.base_record(Stage::Duplicate, received_at, channel, &up, original);
            d1.stream_seq = Some(ack.sequence);
            d1.detail = Some(format!(
                "request id {} from {} already stored within the dedup window",
                up.request_id, channel.client_id
            ));
            self.shared.sink.record(d1);
            return Ok(UploadReply {
                receipt: self
                    .shared
                    .key
                    .receipt(&channel.client_id, &up.request_id, &original),
                message_id: original,
                request_id: up.request_id,
                stream_seq: ack.sequence,
                duplicate: true,
            });
        }
        Metrics::inc(&self.shared.metrics.uploads);
        if self.shared.sink.enabled() {
            let mut p2 =
                self.base_record(Stage::UploadReceived, received_at, channel, &up, message_id);
            p2.attrs = up.attrs.clone();
            p2.traceparent = up.traceparent.clone();
            p2.payload_size = Some(up.payload.len() as u64);
            if self.shared.config.record_payload_bytes > 0 {
                let n = up
                    .payload
                    .len()
                    .min(self.shared.config.record_payload_bytes);
                p2.payload_head =
                    Some(base64::engine::general_purpose::STANDARD.encode(&up.payload[..n]));
            }
            self.shared.sink.record(p2);
            let mut p3 = self.base_record(
                Stage::Stored,
                msgtrail_core::time::now_nanos(),
                channel,
                &up,
                message_id,
            );
            p3.stream_seq = Some(ack.sequence);
            self.shared.sink.record(p3);
        }
        Ok(UploadReply {
            receipt: self
                .shared
                .key
                .receipt(&channel.client_id, &up.request_id, &message_id),
            message_id,
            request_id: up.request_id,
            stream_seq: ack.sequence,
            duplicate: false,
        })
    }
}
