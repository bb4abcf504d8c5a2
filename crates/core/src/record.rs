//! A stage record — one step of a message's life (docs/ARCHITECTURE.md §2) — and its wire
//! encoding.
//!
//! In JSON a record is one object; a batch is newline-delimited JSON (one record per line):
//! what hand-written clients send on the stage-report subject, and version 1 of the stage
//! stream. Brokers now write the stage stream in the compact binary encoding of
//! [`crate::frame`] (version 2); [`decode_batch`] reads both. Absent fields are omitted.

use crate::ids::{BrokerInstance, ClientId, MessageId, RequestId};
use crate::stage::Stage;
use crate::GroupId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One stage log: what happened to which message, when, and who saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageRecord {
    /// The stage code.
    pub stage: Stage,
    /// When it happened, Unix nanoseconds (UTC), by the emitter's clock.
    pub at: u64,
    /// The message ID, once the broker has assigned one (from P2 on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<MessageId>,
    /// The producer's request ID (P1–P4, D1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<RequestId>,
    /// The producer's ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer: Option<ClientId>,
    /// The consumer's ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer: Option<ClientId>,
    /// The consumer group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<GroupId>,
    /// The topic of the message, or the topic filter of a subscription (N1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// Upload attempt (P1, D1) or delivery attempt (C*, R1), from 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// The message's sequence in the message stream (P3 and later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_seq: Option<u64>,
    /// The outcome of the stage, where it has one: X2 `ok` | `failed`; A1 `opened` | `refused`
    /// | `closed` | `expired`; R1 `redeliver` | `dead_letter`; C4/C8 `ack` | `nack` | `term`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// Free text: the error of a failed processing, the reason of a refusal, a subscription.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The OpenTelemetry `service.name` of the party that did the work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// A W3C `traceparent` the producer passed with its upload (P1, P2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The message's attributes (P2).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attrs: BTreeMap<String, String>,
    /// The payload size in bytes (P2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_size: Option<u64>,
    /// The first bytes of the payload, base64 (P2; the broker's `--record-payload-bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_head: Option<String>,
    /// The record belongs to a delivery of a fetch by message ID (C5–C8, X1, X2, R1 of it,
    /// set by the broker): a consumption of its own, apart from the group's topic
    /// subscriptions (docs/PROTOCOL.md §8.2). Absent (false) for every other record.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub by_id: bool,
    /// The broker instance that wrote the record (every record a broker writes itself; a
    /// client's record it relays carries none, docs/PROTOCOL.md §13). Clock offsets pair
    /// only records of one instance. Absent in records of brokers that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broker: Option<BrokerInstance>,
    /// C1/C5: when JetStream stored the delivered message (its stored time, by the
    /// nats-server's clock), Unix nanoseconds. The store hop can end there when the broker's
    /// P3 is missing or later than the delivery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_at: Option<u64>,
}

/// The outcome of a P2 or P3 that the listener recovered from the stored message itself
/// (its `Msgtrail-Received-At` header and JetStream's stored time) rather than read from the
/// broker's records. The text of [`crate::outcome::StoreOutcome::Recovered`].
pub const RECOVERED: &str = "recovered";

/// Why a stage record or batch could not be decoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// A line was not a valid record (the JSON error is its `source()`).
    #[error("stage record on line {line} is invalid")]
    Invalid {
        /// 1-based line number within the batch.
        line: usize,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// A compact (version 2) batch was malformed.
    #[error(transparent)]
    Frame(#[from] crate::frame::FrameError),
}

impl StageRecord {
    /// A record of `stage` happening now, with every optional field empty.
    pub fn now(stage: Stage) -> Self {
        Self::at(stage, crate::time::now_nanos())
    }

    /// A record of `stage` happening at `at` (Unix nanoseconds).
    pub fn at(stage: Stage, at: u64) -> Self {
        StageRecord {
            stage,
            at,
            message_id: None,
            request_id: None,
            producer: None,
            consumer: None,
            group: None,
            topic: None,
            attempt: None,
            stream_seq: None,
            outcome: None,
            detail: None,
            service: None,
            traceparent: None,
            attrs: BTreeMap::new(),
            payload_size: None,
            payload_head: None,
            by_id: false,
            broker: None,
            stored_at: None,
        }
    }

    /// Whether this is a P2/P3 the listener recovered from the stored message itself rather
    /// than one the broker wrote ([`RECOVERED`]).
    pub fn is_recovered(&self) -> bool {
        matches!(self.stage, Stage::UploadReceived | Stage::Stored)
            && self.store_outcome() == Some(crate::outcome::StoreOutcome::Recovered)
    }

    /// A stable key that identifies this record among redeliveries of the same batch: the
    /// listener applies a record once per key. A recovered record has a key of its own, so
    /// that the broker's record of the same stage is never dropped for it (the assembly
    /// prefers the broker's), and so has a record of a fetch by message ID (it is another
    /// delivery than the subscription's of the same attempt number).
    pub fn dedup_key(&self) -> String {
        format!(
            "{}|{}|{}|{}|{}|{}|{}|{}{}{}",
            self.stage,
            self.at,
            self.message_id.map(|m| m.to_string()).unwrap_or_default(),
            self.request_id
                .as_ref()
                .map(|r| r.as_str())
                .unwrap_or_default(),
            self.producer
                .as_ref()
                .map(|r| r.as_str())
                .unwrap_or_default(),
            self.consumer
                .as_ref()
                .map(|r| r.as_str())
                .unwrap_or_default(),
            self.group.as_ref().map(|r| r.as_str()).unwrap_or_default(),
            self.attempt.unwrap_or(0),
            if self.is_recovered() {
                "|recovered"
            } else {
                ""
            },
            if self.by_id { "|by-id" } else { "" },
        )
    }

    /// Encodes one record as a JSON line (without the newline).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a stage record always serializes")
    }
}

/// Encodes records as newline-delimited JSON.
pub fn encode_batch<'a>(records: impl IntoIterator<Item = &'a StageRecord>) -> Vec<u8> {
    let mut out = Vec::new();
    for r in records {
        serde_json::to_writer(&mut out, r).expect("a stage record always serializes");
        out.push(b'\n');
    }
    out
}

/// Decodes a stage-stream message of either version: the compact binary encoding (version 2,
/// [`crate::frame::encode_stage_batch`], what brokers write now) or newline-delimited JSON
/// (version 1, what earlier brokers wrote and what hand-written reports use). In JSON, blank
/// lines are skipped; the first invalid line fails the whole batch so that a sender learns
/// exactly which line was wrong.
pub fn decode_batch(bytes: &[u8]) -> Result<Vec<StageRecord>, RecordError> {
    if crate::frame::frame_kind(bytes) == Some(crate::frame::FrameKind::StageBatch) {
        return Ok(crate::frame::decode_stage_batch(bytes)?);
    }
    let mut out = Vec::new();
    for (i, line) in bytes.split(|b| *b == b'\n').enumerate() {
        if line.iter().all(|b| b.is_ascii_whitespace()) {
            continue;
        }
        let rec = serde_json::from_slice(line).map_err(|source| RecordError::Invalid {
            line: i + 1,
            source,
        })?;
        out.push(rec);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invalid_line_names_its_line_and_the_json_error_once() {
        let batch = b"{\"stage\":\"P1\",\"at\":1}\n{\"stage\":\"P1\",\"at\":\"soon\"}\n";
        let e = decode_batch(batch).unwrap_err();
        let own = e.to_string();
        let json = std::error::Error::source(&e).expect("the JSON error is the source");
        assert!(
            !own.contains(&json.to_string()),
            "the level writes its cause into its own message: {own}"
        );
        let chain = crate::ErrorChain(&e).to_string();
        assert_eq!(chain, format!("stage record on line 2 is invalid: {json}"));
        assert_eq!(chain.matches("line 2").count(), 1, "{chain}");
    }

    #[test]
    fn mtt_with_an_unknown_version_byte_is_refused_not_read_as_json() {
        assert!(decode_batch(b"MTT\x02\0\0\0\0").is_err());
        assert!(decode_batch(b"MTT\xff\0\0\0\0").is_err());
        assert_eq!(decode_batch(b"MTT\x01\0\0\0\0").unwrap(), vec![]);
    }

    #[test]
    fn batch_round_trip_omits_empty_fields() {
        let mut a = StageRecord::at(Stage::UploadSent, 42);
        a.request_id = Some(RequestId::new("r1").unwrap());
        a.producer = Some(ClientId::new("p").unwrap());
        a.attempt = Some(1);
        let mut b = StageRecord::at(Stage::UploadReceived, 43);
        b.message_id = Some(MessageId::new());
        b.attrs.insert("category".into(), "refund".into());
        let bytes = encode_batch([&a, &b]);
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert_eq!(text.lines().count(), 2);
        assert!(text
            .starts_with(r#"{"stage":"P1","at":42,"request_id":"r1","producer":"p","attempt":1}"#));
        assert_eq!(decode_batch(&bytes).unwrap(), vec![a, b]);
    }

    #[test]
    fn broker_instance_and_stored_time_are_optional_in_json() {
        let old = br#"{"stage":"C5","at":7,"consumer":"c","group":"g","attempt":1}"#;
        let rec = &decode_batch(old).unwrap()[0];
        assert_eq!((rec.broker.as_ref(), rec.stored_at), (None, None));
        let mut new = rec.clone();
        new.broker = Some(BrokerInstance::new("b-1a2b").unwrap());
        new.stored_at = Some(5);
        let text = new.to_json();
        assert!(
            text.ends_with(r#""broker":"b-1a2b","stored_at":5}"#),
            "{text}"
        );
        assert_eq!(decode_batch(text.as_bytes()).unwrap(), vec![new]);
        let bad = br#"{"stage":"C5","at":7,"broker":"no spaces"}"#;
        assert!(decode_batch(bad).is_err());
    }

    #[test]
    fn invalid_lines_are_named() {
        let err = decode_batch(b"{\"stage\":\"P1\",\"at\":1}\n{\"stage\":\"Q7\",\"at\":1}\n")
            .unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
        let err = decode_batch(b"{\"stage\":\"P1\",\"at\":1,\"message_id\":\"x\"}").unwrap_err();
        assert!(err.to_string().contains("line 1"), "{err}");
    }
}
