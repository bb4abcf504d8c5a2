//! Upload (seed 000's production path): validate, assign a UUIDv7 message ID, store in the
//! message stream, answer with the ID — or, for a repeated request ID, with the original's.
//!
//! Deduplication is JetStream's: the stored message carries `Nats-Msg-Id:
//! <producer>:<request-id>`, so a retry inside the stream's duplicate window is not stored
//! again; the PubAck then names the original's sequence, whose headers give back the original
//! message ID (a direct get). Records: P2 (received, ID assigned) and P3 (stored) for a new
//! message, D1 for a suppressed duplicate, and P2 with outcome `refused` (no message ID, the
//! error as detail) for an upload refused on an open producer channel.

use crate::clients::may_publish;
use crate::metrics::Metrics;
use crate::shared::Shared;
use async_nats::HeaderMap;
use base64::Engine;
use msgtrail_core::headers as h;
use msgtrail_core::subjects::message_subject;
use msgtrail_core::wire::UploadReply;
use msgtrail_core::{ErrorCode, MessageId, RequestId, Role, Stage, StageRecord, Topic, WireError};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What the upload handler needs.
#[derive(Debug, Clone)]
pub struct Uploader {
    /// What every handler shares.
    pub shared: Arc<Shared>,
}

/// A validated upload request.
#[derive(Debug)]
struct Upload {
    producer: msgtrail_core::ClientId,
    producer_service: String,
    request_id: RequestId,
    topic: Topic,
    attempt: u32,
    attrs: BTreeMap<String, String>,
    traceparent: Option<String>,
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
pub fn valid_traceparent(tp: &str) -> bool {
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

impl Uploader {
    /// Handles one upload request.
    pub async fn handle(&self, msg: &async_nats::Message) -> Result<UploadReply, WireError> {
        let received_at = msgtrail_core::time::now_nanos();
        let empty = HeaderMap::new();
        let headers = msg.headers.as_ref().unwrap_or(&empty);
        let checked = match self.check_sizes(msg, headers) {
            Ok(()) => self.validate(headers).await,
            Err(e) => Err(e),
        };
        let up = match checked {
            Ok(up) => up,
            Err(e) => {
                self.record_refusal(headers, received_at, &e).await;
                return Err(e);
            }
        };
        let message_id = MessageId::new();

        let mut stored = HeaderMap::new();
        stored.insert(
            h::NATS_MSG_ID,
            format!("{}:{}", up.producer, up.request_id).as_str(),
        );
        stored.insert(h::MESSAGE_ID, message_id.to_string().as_str());
        stored.insert(h::REQUEST_ID, up.request_id.as_str());
        stored.insert(h::PRODUCER, up.producer.as_str());
        stored.insert(h::PRODUCER_SERVICE, up.producer_service.as_str());
        stored.insert(h::TOPIC, up.topic.as_str());
        for (k, v) in &up.attrs {
            stored.insert(format!("{}{k}", h::ATTR_PREFIX).as_str(), v.as_str());
        }
        if let Some(tp) = &up.traceparent {
            stored.insert(h::TRACEPARENT, tp.as_str());
        }
        let unavailable = |e: &dyn std::fmt::Display| {
            WireError::new(
                ErrorCode::Unavailable,
                format!("message stream did not store the message: {e}"),
            )
        };
        let ack = self
            .shared
            .js
            .publish_with_headers(
                message_subject(up.topic.as_str()),
                stored,
                msg.payload.clone(),
            )
            .await
            .map_err(|e| unavailable(&e))?
            .await
            .map_err(|e| unavailable(&e))?;

        if ack.duplicate {
            let original = self.original_id(ack.sequence).await?;
            Metrics::inc(&self.shared.metrics.duplicates);
            let mut d1 = self.base_record(Stage::Duplicate, received_at, &up, original);
            d1.stream_seq = Some(ack.sequence);
            d1.detail = Some(format!(
                "request id {} from {} already stored within the dedup window",
                up.request_id, up.producer
            ));
            self.shared.sink.record(d1);
            return Ok(UploadReply {
                receipt: self
                    .shared
                    .key
                    .receipt(&up.producer, &up.request_id, &original),
                message_id: original,
                request_id: up.request_id,
                stream_seq: ack.sequence,
                duplicate: true,
            });
        }

        Metrics::inc(&self.shared.metrics.uploads);
        let mut p2 = self.base_record(Stage::UploadReceived, received_at, &up, message_id);
        p2.attrs = up.attrs.clone();
        p2.traceparent = up.traceparent.clone();
        p2.payload_size = Some(msg.payload.len() as u64);
        if self.shared.config.record_payload_bytes > 0 {
            let n = msg
                .payload
                .len()
                .min(self.shared.config.record_payload_bytes);
            p2.payload_head =
                Some(base64::engine::general_purpose::STANDARD.encode(&msg.payload[..n]));
        }
        self.shared.sink.record(p2);
        let mut p3 = self.base_record(
            Stage::Stored,
            msgtrail_core::time::now_nanos(),
            &up,
            message_id,
        );
        p3.stream_seq = Some(ack.sequence);
        self.shared.sink.record(p3);
        Ok(UploadReply {
            receipt: self
                .shared
                .key
                .receipt(&up.producer, &up.request_id, &message_id),
            message_id,
            request_id: up.request_id,
            stream_seq: ack.sequence,
            duplicate: false,
        })
    }

    fn check_sizes(&self, msg: &async_nats::Message, headers: &HeaderMap) -> Result<(), WireError> {
        if msg.payload.len() > self.shared.config.max_payload {
            return Err(WireError::new(
                ErrorCode::PayloadTooLarge,
                format!(
                    "payload is {} bytes; this broker accepts at most {}",
                    msg.payload.len(),
                    self.shared.config.max_payload
                ),
            ));
        }
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

    /// Records a refused upload as P2 with outcome `refused`, so that the trajectory of the
    /// request says why it went no further. Only for a request on an open producer channel
    /// with a valid request ID: anything else cannot be placed on a trajectory.
    async fn record_refusal(&self, headers: &HeaderMap, at: u64, e: &WireError) {
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
        let Some(request_id) = headers
            .get(h::REQUEST_ID)
            .and_then(|v| RequestId::new(v.as_str()).ok())
        else {
            return;
        };
        let mut p2 = StageRecord::at(Stage::UploadReceived, at);
        p2.request_id = Some(request_id);
        p2.producer = Some(channel.client_id);
        p2.topic = headers
            .get(h::TOPIC)
            .and_then(|t| Topic::new(t.as_str()).ok())
            .map(|t| t.to_string());
        p2.attempt = headers
            .get(h::ATTEMPT)
            .and_then(|a| a.as_str().parse().ok());
        p2.outcome = Some("refused".into());
        p2.detail = Some(e.to_string());
        p2.service = Some(self.shared.config.service_name.clone());
        self.shared.sink.record(p2);
    }

    fn base_record(&self, stage: Stage, at: u64, up: &Upload, id: MessageId) -> StageRecord {
        let mut r = StageRecord::at(stage, at);
        r.message_id = Some(id);
        r.request_id = Some(up.request_id.clone());
        r.producer = Some(up.producer.clone());
        r.topic = Some(up.topic.to_string());
        r.attempt = Some(up.attempt);
        r.service = Some(self.shared.config.service_name.clone());
        r
    }

    async fn validate(&self, headers: &HeaderMap) -> Result<Upload, WireError> {
        let channel = self
            .shared
            .channels
            .lookup_role(required(headers, h::CHANNEL)?, Role::Producer)
            .await?;
        let topic = Topic::new(required(headers, h::TOPIC)?)
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
        let request_id = RequestId::new(required(headers, h::REQUEST_ID)?)
            .map_err(|e| WireError::new(ErrorCode::InvalidRequestId, e.to_string()))?;
        let attempt = match headers.get(h::ATTEMPT) {
            None => 1,
            Some(v) => v
                .as_str()
                .parse::<u32>()
                .ok()
                .filter(|a| *a >= 1)
                .ok_or_else(|| {
                    bad(format!(
                        "header {} must be a whole number from 1, got {:?}",
                        h::ATTEMPT,
                        v.as_str()
                    ))
                })?,
        };
        let mut attrs = BTreeMap::new();
        for (name, values) in headers.iter() {
            let name: &str = name.as_ref();
            if name.len() > h::ATTR_PREFIX.len()
                && name[..h::ATTR_PREFIX.len()].eq_ignore_ascii_case(h::ATTR_PREFIX)
            {
                let key = h::validate_attr_key(&name[h::ATTR_PREFIX.len()..])
                    .map_err(|e| WireError::new(ErrorCode::InvalidAttribute, e))?;
                if values.len() != 1 {
                    return Err(WireError::new(
                        ErrorCode::InvalidAttribute,
                        format!("attribute {key:?} is given {} times", values.len()),
                    ));
                }
                let value = values[0].as_str();
                h::validate_attr_value(&key, value)
                    .map_err(|e| WireError::new(ErrorCode::InvalidAttribute, e))?;
                attrs.insert(key, value.to_owned());
            }
        }
        if attrs.len() > h::MAX_ATTRIBUTES {
            return Err(WireError::new(
                ErrorCode::InvalidAttribute,
                format!(
                    "{} attributes; at most {} are accepted",
                    attrs.len(),
                    h::MAX_ATTRIBUTES
                ),
            ));
        }
        let traceparent = match headers.get(h::TRACEPARENT) {
            None => None,
            Some(v) if valid_traceparent(v.as_str()) => Some(v.as_str().to_owned()),
            Some(v) => {
                return Err(bad(format!(
                "header traceparent {:?} is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)",
                v.as_str()
            )))
            }
        };
        Ok(Upload {
            producer: channel.client_id,
            producer_service: channel.service_name,
            request_id,
            topic,
            attempt,
            attrs,
            traceparent,
        })
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

#[cfg(test)]
mod tests {
    use super::valid_traceparent;

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
