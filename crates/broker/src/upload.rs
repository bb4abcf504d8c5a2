//! Upload (the production path): validate, assign a UUIDv7 message ID, store in the
//! message stream, answer with the ID — or, for a repeated request ID, with the original's.
//! Two forms share one path: the single upload (headers + raw payload on `msgtrail.v1.upload`)
//! and the batch ([`msgtrail_core::frame::UploadBatch`] on `msgtrail.v1.upload.batch`), whose
//! messages are validated one by one (a bad one fails alone), published to JetStream with all
//! their acks in flight at once, and answered in order.
//!
//! Deduplication is JetStream's: the stored message carries `Nats-Msg-Id:
//! <producer>:<request-id>`, so a retry inside the stream's duplicate window is not stored
//! again; the PubAck then names the original's sequence, whose headers give back the original
//! message ID (a direct get). Records: P1 from a batch entry's `sent_at` (the producer's send
//! time rides in the request), P2 (received, ID assigned) and P3 (stored) for a new message,
//! D1 for a suppressed duplicate, and P2 with outcome `refused` (no message ID, the error as
//! detail) for an upload refused on an open producer channel.
//!
//! The stored message is its own store evidence: with recording on it carries
//! `Msgtrail-Received-At` (the P2 time) and `Msgtrail-Broker-Service`, so the listener
//! recovers P2/P3 from the message stream when the broker's records never reach the stage
//! stream (a broker killed right after its reply, a stage stream without a leader).

use crate::channels::OpenChannel;
use crate::clients::may_publish;
use crate::metrics::Metrics;
use crate::shared::Shared;
use async_nats::HeaderMap;
use base64::Engine;
use bytes::Bytes;
use msgtrail_core::frame::{UploadBatch, UploadResult, UploadResults};
use msgtrail_core::headers as h;
use msgtrail_core::outcome::StoreOutcome;
use msgtrail_core::subjects::message_subject;
use msgtrail_core::wire::UploadReply;
use msgtrail_core::{ErrorCode, MessageId, RequestId, Role, Stage, StageRecord, Topic, WireError};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What the upload handler needs.
#[derive(Debug, Clone)]
pub(crate) struct Uploader {
    /// What every handler shares.
    pub shared: Arc<Shared>,
    /// Checks and relays the producer records that ride along a batch.
    pub relay: crate::relay::Relay,
}

/// An upload as received, before validation: from the headers of a single upload or from
/// one entry of a batch.
#[derive(Debug)]
struct RawUpload<'a> {
    request_id: &'a str,
    topic: &'a str,
    attempt: u32,
    /// P1 as the producer reported it (0: none).
    sent_at: u64,
    traceparent: Option<&'a str>,
    attrs: Vec<(&'a str, &'a str)>,
    payload: Bytes,
}

/// A validated upload.
#[derive(Debug)]
struct Upload {
    request_id: RequestId,
    topic: Topic,
    attempt: u32,
    attrs: BTreeMap<String, String>,
    traceparent: Option<String>,
    payload: Bytes,
}

fn bad(message: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::BadRequest, message)
}

/// The value of a required header.
pub(crate) fn required<'a>(headers: &'a HeaderMap, name: &str) -> Result<&'a str, WireError> {
    headers
        .get(name)
        .map(|v| v.as_str())
        .ok_or_else(|| bad(format!("missing header {name}")))
}

/// The value of a header that may appear at most once.
fn single<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, WireError> {
    match headers.get_all(name).count() {
        0 => Ok(None),
        1 => Ok(headers.get(name).map(|v| v.as_str())),
        n => Err(bad(format!("header {name} is given {n} times"))),
    }
}

/// Total size of the headers as NATS encodes them (`Name: value\r\n`).
fn header_bytes(headers: &HeaderMap) -> usize {
    headers
        .iter()
        .map(|(k, vs)| {
            vs.iter()
                .map(|v| AsRef::<str>::as_ref(k).len() + v.as_str().len() + 4)
                .sum::<usize>()
        })
        .sum()
}

/// Checks a W3C `traceparent`: `00-<32 hex>-<16 hex>-<2 hex>`, IDs not all zero.
pub(crate) fn valid_traceparent(tp: &str) -> bool {
    let parts: Vec<&str> = tp.split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    };
    parts.len() == 4
        && hex(parts[0], 2)
        && parts[0] != "ff"
        && hex(parts[1], 32)
        && parts[1].bytes().any(|b| b != b'0')
        && hex(parts[2], 16)
        && parts[2].bytes().any(|b| b != b'0')
        && hex(parts[3], 2)
}

/// Validates the attributes of one upload: keys by the grammar (stored lowercase), one value
/// each, no two keys that differ only in case, at most [`h::MAX_ATTRIBUTES`].
fn validate_attrs(attrs: &[(&str, &str)]) -> Result<BTreeMap<String, String>, WireError> {
    let invalid = |m: String| WireError::new(ErrorCode::InvalidAttribute, m);
    let mut out = BTreeMap::new();
    for (name, value) in attrs {
        let key = h::validate_attr_key(name).map_err(invalid)?;
        h::validate_attr_value(&key, value).map_err(invalid)?;
        if out.insert(key.clone(), (*value).to_owned()).is_some() {
            return Err(invalid(format!(
                "attribute {key:?} is given more than once (keys are case-insensitive)"
            )));
        }
    }
    if out.len() > h::MAX_ATTRIBUTES {
        return Err(invalid(format!(
            "{} attributes; at most {} are accepted",
            out.len(),
            h::MAX_ATTRIBUTES
        )));
    }
    Ok(out)
}

impl Uploader {
    /// Handles one single upload (headers + raw payload).
    pub(crate) async fn handle(&self, msg: &async_nats::Message) -> Result<UploadReply, WireError> {
        let received_at = msgtrail_core::time::now_nanos();
        let empty = HeaderMap::new();
        let headers = msg.headers.as_ref().unwrap_or(&empty);
        let checked = async {
            self.check_header_size(headers)?;
            let channel = self
                .shared
                .channels
                .lookup_role(required(headers, h::CHANNEL)?, Role::Producer)
                .await?;
            let raw = raw_from_headers(headers, msg.payload.clone())?;
            let up = self.validate(&channel, &raw)?;
            Ok::<_, WireError>((channel, up))
        }
        .await;
        let (channel, up) = match checked {
            Ok(v) => v,
            Err(e) => {
                self.record_header_refusal(headers, received_at, &e).await;
                return Err(e);
            }
        };
        let mut stored = self.store_all(&channel, vec![(up, received_at)]).await;
        stored.pop().expect("one upload, one result")
    }

    /// Handles an upload batch: one result per message, in order, and the outcome of the
    /// producer records that rode along.
    pub(crate) async fn handle_batch(&self, msg: &async_nats::Message) -> Result<Bytes, WireError> {
        let received_at = msgtrail_core::time::now_nanos();
        let headers = msg
            .headers
            .as_ref()
            .ok_or_else(|| bad(format!("missing header {}", h::CHANNEL)))?;
        let channel = self
            .shared
            .channels
            .lookup_role(required(headers, h::CHANNEL)?, Role::Producer)
            .await?;
        let batch = UploadBatch::decode(&msg.payload)?;
        let reports = self
            .relay
            .relay_reported(
                &channel,
                batch.reports,
                batch.reports_invalid,
                &mut crate::relay::TokenCache::new(),
            )
            .await;
        let mut results: Vec<Option<Result<UploadReply, WireError>>> =
            Vec::with_capacity(batch.entries.len());
        let mut valid = Vec::with_capacity(batch.entries.len());
        for e in &batch.entries {
            let raw = RawUpload {
                request_id: &e.request_id,
                topic: &e.topic,
                attempt: e.attempt,
                sent_at: e.sent_at,
                traceparent: Some(e.traceparent.as_str()).filter(|t| !t.is_empty()),
                attrs: e
                    .attrs
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect(),
                payload: e.payload.clone(),
            };
            self.record_sent(&channel, &raw);
            match self.validate(&channel, &raw) {
                Ok(up) => {
                    results.push(None);
                    valid.push((up, received_at));
                }
                Err(err) => {
                    self.record_refusal(&channel, &raw, received_at, &err);
                    results.push(Some(Err(err)));
                }
            }
        }
        let mut stored = self.store_all(&channel, valid).await.into_iter();
        let results = results
            .into_iter()
            .map(|r| {
                let r = r.unwrap_or_else(|| stored.next().expect("one result per stored upload"));
                match r {
                    Ok(reply) => UploadResult::Stored {
                        message_id: reply.message_id,
                        stream_seq: reply.stream_seq,
                        duplicate: reply.duplicate,
                        receipt: reply.receipt,
                    },
                    Err(e) => {
                        self.shared.metrics.error(e.code);
                        UploadResult::Refused(e)
                    }
                }
            })
            .collect();
        Ok(UploadResults { results, reports }.encode())
    }

    fn check_header_size(&self, headers: &HeaderMap) -> Result<(), WireError> {
        let hb = header_bytes(headers);
        if hb > self.shared.config.max_header_bytes {
            return Err(WireError::new(
                ErrorCode::HeadersTooLarge,
                format!(
                    "headers are {hb} bytes; this broker accepts at most {}",
                    self.shared.config.max_header_bytes
                ),
            ));
        }
        Ok(())
    }

    /// Validates one upload for `channel`.
    fn validate(&self, channel: &OpenChannel, raw: &RawUpload<'_>) -> Result<Upload, WireError> {
        if raw.payload.len() > self.shared.config.max_payload {
            return Err(WireError::new(
                ErrorCode::PayloadTooLarge,
                format!(
                    "payload is {} bytes; this broker accepts at most {}",
                    raw.payload.len(),
                    self.shared.config.max_payload
                ),
            ));
        }
        let topic = Topic::new(raw.topic)
            .map_err(|e| WireError::new(ErrorCode::InvalidTopic, e.to_string()))?;
        if !may_publish(&channel.topics, topic.as_str()) {
            return Err(WireError::new(
                ErrorCode::NotPermitted,
                format!(
                    "producer {} may not publish to topic {topic}",
                    channel.client_id
                ),
            ));
        }
        let request_id = RequestId::new(raw.request_id)
            .map_err(|e| WireError::new(ErrorCode::InvalidRequestId, e.to_string()))?;
        if raw.attempt == 0 {
            return Err(bad("the upload attempt counts from 1, got 0"));
        }
        let attrs = validate_attrs(&raw.attrs)?;
        let traceparent = match raw.traceparent {
            None => None,
            Some(v) if valid_traceparent(v) => Some(v.to_owned()),
            Some(v) => {
                return Err(bad(format!(
                    "traceparent {v:?} is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)"
                )))
            }
        };
        Ok(Upload {
            request_id,
            topic,
            attempt: raw.attempt,
            attrs,
            traceparent,
            payload: raw.payload.clone(),
        })
    }

    /// The headers of a stored message.
    fn stored_headers(
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
    async fn store_all(
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
    async fn stored(
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

    /// Records P1 from a batch entry's `sent_at`: the producer's send time rode in the
    /// request instead of a separate report.
    fn record_sent(&self, channel: &OpenChannel, raw: &RawUpload<'_>) {
        if raw.sent_at == 0 || !self.shared.sink.enabled() {
            return;
        }
        let Ok(request_id) = RequestId::new(raw.request_id) else {
            return;
        };
        let mut p1 = StageRecord::at(Stage::UploadSent, raw.sent_at);
        p1.request_id = Some(request_id);
        p1.producer = Some(channel.client_id.clone());
        p1.topic = Topic::new(raw.topic).ok().map(|t| t.to_string());
        p1.attempt = Some(raw.attempt);
        p1.traceparent = raw.traceparent.map(str::to_owned);
        p1.service = Some(channel.service_name.clone());
        self.shared.sink.record(p1);
    }

    /// Records a refused upload as P2 with outcome `refused`, so that the trajectory of the
    /// request says why it went no further. Only with a valid request ID: anything else
    /// cannot be placed on a trajectory.
    fn record_refusal(&self, channel: &OpenChannel, raw: &RawUpload<'_>, at: u64, e: &WireError) {
        let Ok(request_id) = RequestId::new(raw.request_id) else {
            return;
        };
        let mut p2 = StageRecord::at(Stage::UploadReceived, at);
        p2.request_id = Some(request_id);
        p2.producer = Some(channel.client_id.clone());
        p2.topic = Topic::new(raw.topic).ok().map(|t| t.to_string());
        p2.attempt = Some(raw.attempt);
        p2.set_outcome(StoreOutcome::Refused);
        p2.detail = Some(e.to_string());
        p2.service = Some(self.shared.config.service_name.clone());
        self.shared.sink.record(p2);
    }

    /// [`Self::record_refusal`] for a single upload, whose fields are still in its headers:
    /// only on an open producer channel.
    async fn record_header_refusal(&self, headers: &HeaderMap, at: u64, e: &WireError) {
        let Some(channel) = headers.get(h::CHANNEL) else {
            return;
        };
        let Ok(channel) = self
            .shared
            .channels
            .lookup_role(channel.as_str(), Role::Producer)
            .await
        else {
            return;
        };
        let raw = RawUpload {
            request_id: headers.get(h::REQUEST_ID).map_or("", |v| v.as_str()),
            topic: headers.get(h::TOPIC).map_or("", |v| v.as_str()),
            attempt: headers
                .get(h::ATTEMPT)
                .and_then(|a| a.as_str().parse().ok())
                .unwrap_or(1),
            sent_at: 0,
            traceparent: None,
            attrs: vec![],
            payload: Bytes::new(),
        };
        self.record_refusal(&channel, &raw, at, e);
    }

    fn base_record(
        &self,
        stage: Stage,
        at: u64,
        channel: &OpenChannel,
        up: &Upload,
        id: MessageId,
    ) -> StageRecord {
        let mut r = StageRecord::at(stage, at);
        r.message_id = Some(id);
        r.request_id = Some(up.request_id.clone());
        r.producer = Some(channel.client_id.clone());
        r.topic = Some(up.topic.to_string());
        r.attempt = Some(up.attempt);
        r.service = Some(self.shared.config.service_name.clone());
        r
    }

    async fn original_id(&self, seq: u64) -> Result<MessageId, WireError> {
        let original = self.shared.stream.direct_get(seq).await.map_err(|e| {
            WireError::new(
                ErrorCode::Unavailable,
                format!("cannot read the original of a duplicate: {e}"),
            )
        })?;
        original
            .headers
            .get(h::MESSAGE_ID)
            .and_then(|v| v.as_str().parse().ok())
            .ok_or_else(|| {
                WireError::new(
                    ErrorCode::Internal,
                    format!("stored message {seq} has no message id"),
                )
            })
    }
}

/// The error of an upload JetStream did not store. While a replicated message stream elects
/// a leader (after a node failure) JetStream answers "no responders", which async-nats reports
/// as "no stream found for given subject" although the stream exists: say what is going on
/// and that a retry will succeed, instead of suggesting the stream is gone.
fn store_failure(text: &str) -> WireError {
    let why = if text.contains("no stream found") || text.contains("no responders") {
        "the message stream did not answer: it has no leader right now (an election after a \
         node failure, usually a few seconds) or does not exist; retry with the same request \
         id: uploads succeed once it has a leader"
    } else {
        "message stream did not store the message"
    };
    WireError::new(ErrorCode::Unavailable, format!("{why}: {text}"))
}

/// The fields of a single upload, from its headers: each protocol header at most once,
/// attribute headers by their prefix (case-insensitive).
fn raw_from_headers(headers: &HeaderMap, payload: Bytes) -> Result<RawUpload<'_>, WireError> {
    let attempt = match single(headers, h::ATTEMPT)? {
        None => 1,
        Some(v) => v.parse::<u32>().ok().filter(|a| *a >= 1).ok_or_else(|| {
            bad(format!(
                "header {} must be a whole number from 1, got {v:?}",
                h::ATTEMPT
            ))
        })?,
    };
    let mut attrs = Vec::new();
    for (name, values) in headers.iter() {
        let name: &str = name.as_ref();
        if name.len() > h::ATTR_PREFIX.len()
            && name[..h::ATTR_PREFIX.len()].eq_ignore_ascii_case(h::ATTR_PREFIX)
        {
            let key = &name[h::ATTR_PREFIX.len()..];
            if values.len() != 1 {
                return Err(WireError::new(
                    ErrorCode::InvalidAttribute,
                    format!("attribute {key:?} is given {} times", values.len()),
                ));
            }
            attrs.push((key, values[0].as_str()));
        }
    }
    Ok(RawUpload {
        request_id: single(headers, h::REQUEST_ID)?
            .ok_or_else(|| bad(format!("missing header {}", h::REQUEST_ID)))?,
        topic: single(headers, h::TOPIC)?
            .ok_or_else(|| bad(format!("missing header {}", h::TOPIC)))?,
        attempt,
        sent_at: 0,
        traceparent: single(headers, h::TRACEPARENT)?,
        attrs,
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::{store_failure, valid_traceparent};

    #[test]
    fn a_stream_without_a_leader_is_explained() {
        let e = store_failure("no stream found for given subject");
        assert_eq!(e.code, msgtrail_core::ErrorCode::Unavailable);
        assert!(e.message.contains("no leader right now"), "{e}");
        assert!(e.message.contains("retry"), "{e}");
        let e = store_failure("timed out: didn't receive ack in time");
        assert!(!e.message.contains("leader"), "{e}");
    }

    #[test]
    fn traceparent_grammar() {
        assert!(valid_traceparent(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        ));
        assert!(!valid_traceparent(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331"
        ));
        assert!(!valid_traceparent(
            "00-00000000000000000000000000000000-b7ad6b7169203331-01"
        ));
        assert!(!valid_traceparent(
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01"
        ));
        assert!(!valid_traceparent("garbage"));
    }
}
