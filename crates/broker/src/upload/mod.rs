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
//! The stored message is its own store evidence: with recording on, its `Msgtrail-Stored`
//! header (`msgtrail_core::stored`, docs/PROTOCOL.md §14.1) carries the upload attempt, the
//! P2 time and the broker's service next to the request ID and producer service, so the listener
//! recovers P2/P3 from the message stream when the broker's records never reach the stage
//! stream (a broker killed right after its reply, a stage stream without a leader).
//!
//! The handlers and validation live here; `checks` holds the header checks, `store` the
//! JetStream side and `records` the stage records of the path.

use crate::channels::OpenChannel;
use crate::clients::may_publish;
use crate::js_probe::JetStreamState;
use crate::metrics::Metrics;
use crate::shared::Shared;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
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

mod checks;
mod records;
mod store;
pub(crate) use checks::*;

#[cfg(test)]
mod tests;

/// What the upload handler needs.
#[derive(Debug, Clone)]
pub(crate) struct Uploader {
    /// What every handler shares.
    pub shared: Arc<Shared>,
    /// Checks and relays the producer records that ride along a batch.
    pub relay: crate::relay::Relay,
}

impl Uploader {
    /// Handles one single upload (headers + raw payload).
    #[tracing::instrument(name = "upload", skip_all, fields(messages = 1))]
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
    #[tracing::instrument(name = "upload", skip_all, fields(messages = tracing::field::Empty))]
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
        tracing::Span::current().record("messages", batch.entries.len());
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
}

/// The error of an upload JetStream did not store. Nobody answering a publish (NATS "no
/// responders", which async-nats reports as [`PublishErrorKind::StreamNotFound`] although the
/// stream exists) has two causes, told apart by [`crate::js_probe`]: while a replicated
/// message stream elects a leader (after a node failure) the JetStream API still answers — say
/// so and that a retry will succeed; when nothing under `$JS.API` answers, JetStream is not
/// running on the server or disabled itself (nats-server does when its store runs out of
/// space, until it is restarted) — say that, and what the operator does.
///
/// A store JetStream did not acknowledge within the broker's store timeout is said to be
/// that, with the usual cause: nats-server keeps a stream unwritable after a write error
/// (its store's disk was full) until it is restarted, answering none of its publishes.
fn store_failure(e: &PublishError, js: JetStreamState, timeout: std::time::Duration) -> WireError {
    if e.kind() == PublishErrorKind::TimedOut {
        return WireError::new(
            ErrorCode::Unavailable,
            format!(
                "message stream did not acknowledge the store within {timeout:?} (the broker's \
                 store timeout): JetStream is overloaded, or cannot write — nats-server logs \
                 \"Critical write error\" when its store's disk is full and answers no publish \
                 to that stream until it is restarted; retry with the same request id: {e}"
            ),
        );
    }
    let why = match (e.kind(), js) {
        (PublishErrorKind::StreamNotFound, JetStreamState::NotAnswering) => {
            "JetStream is not answering on the NATS server: it is not running there, or \
             disabled itself (nats-server turns JetStream off when its store runs out of space \
             and keeps it off until restarted: free space, then restart nats-server); retry \
             with the same request id once it is back"
        }
        (PublishErrorKind::StreamNotFound, JetStreamState::Answering) => {
            "the message stream did not answer: it has no leader right now (an election after \
             a node failure, usually a few seconds) or does not exist; retry with the same \
             request id: uploads succeed once it has a leader"
        }
        _ => "message stream did not store the message",
    };
    WireError::new(ErrorCode::Unavailable, format!("{why}: {e}"))
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
