//! Storing accepted uploads in the message stream, all PubAcks in flight at once, and reading
//! back the original's ID when JetStream names a duplicate.

use super::*;

impl Uploader {
    /// The headers of a stored message.
    pub(super) fn stored_headers(
        &self,
        channel: &OpenChannel,
        up: &Upload,
        message_id: &MessageId,
        received_at: u64,
    ) -> HeaderMap {
        let mut stored = HeaderMap::new();
        let mut dedup = String::with_capacity(channel.client_id.as_str().len() + 1 + 40);
        dedup.push_str(channel.client_id.as_str());
        dedup.push(':');
        dedup.push_str(up.request_id.as_str());
        stored.insert(h::NATS_MSG_ID, dedup.as_str());
        stored.insert(h::MESSAGE_ID, message_id.to_string().as_str());
        stored.insert(h::REQUEST_ID, up.request_id.as_str());
        stored.insert(h::PRODUCER, channel.client_id.as_str());
        stored.insert(h::PRODUCER_SERVICE, channel.service_name.as_str());
        stored.insert(h::TOPIC, up.topic.as_str());
        for (k, v) in &up.attrs {
            let mut name = String::with_capacity(h::ATTR_PREFIX.len() + k.len());
            name.push_str(h::ATTR_PREFIX);
            name.push_str(k);
            stored.insert(name.as_str(), v.as_str());
        }
        if let Some(tp) = &up.traceparent {
            stored.insert(h::TRACEPARENT, tp.as_str());
        }
        if self.shared.config.record_stages {
            // The store evidence (module doc): the listener derives P2/P3 from these.
            stored.insert(h::ATTEMPT, up.attempt.to_string().as_str());
            stored.insert(h::RECEIVED_AT, received_at.to_string().as_str());
            stored.insert(h::BROKER_SERVICE, self.shared.config.service_name.as_str());
        }
        stored
    }

    /// Publishes every upload to JetStream with all acks in flight at once, then records and
    /// answers each: a new message, a duplicate, or an error of its own.
    pub(super) async fn store_all(
        &self,
        channel: &OpenChannel,
        uploads: Vec<(Upload, u64)>,
    ) -> Vec<Result<UploadReply, WireError>> {
        let unavailable = |e: &dyn std::fmt::Display| store_failure(&e.to_string());
        let mut pending = Vec::with_capacity(uploads.len());
        let mut acks = Vec::with_capacity(uploads.len());
        for (up, received_at) in uploads {
            let message_id = MessageId::new();
            let headers = self.stored_headers(channel, &up, &message_id, received_at);
            // Sends now; the ack is awaited below, together with the batch's other acks.
            acks.push(
                self.shared
                    .js
                    .publish_with_headers(
                        message_subject(up.topic.as_str()),
                        headers,
                        up.payload.clone(),
                    )
                    .await,
            );
            pending.push((up, received_at, message_id));
        }
        let acks = futures::future::join_all(acks.into_iter().map(|sent| async move {
            match sent {
                Ok(ack) => ack.await.map_err(|e| unavailable(&e)),
                Err(e) => Err(unavailable(&e)),
            }
        }))
        .await;
        let mut out = Vec::with_capacity(pending.len());
        for ((up, received_at, message_id), ack) in pending.into_iter().zip(acks) {
            out.push(match ack {
                Ok(ack) => self.stored(channel, up, received_at, message_id, ack).await,
                Err(e) => Err(e),
            });
        }
        out
    }

    /// Records and answers one upload that JetStream acknowledged.
    pub(super) async fn stored(
        &self,
        channel: &OpenChannel,
        up: Upload,
        received_at: u64,
        message_id: MessageId,
        ack: async_nats::jetstream::publish::PublishAck,
    ) -> Result<UploadReply, WireError> {
        if ack.duplicate {
            let original = self.original_id(ack.sequence).await?;
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
