//! Observe mode's vocabulary: the message ID of a message in a JetStream stream msgtrail does
//! not own, the W3C `traceparent` its trace joins, and what a trajectory built from
//! nats-server's own events cannot see (docs/ARCHITECTURE.md, "Observe mode").
//!
//! ## The observed message ID (part of the protocol, docs/PROTOCOL.md "Observed messages")
//! A message stored at sequence `seq` of stream `stream` has the message ID
//!
//! ```text
//! b = SHA-256("msgtrail-observe" ‖ 0x00 ‖ stream ‖ 0x00 ‖ seq as 8 bytes big-endian)[0..16]
//! b[6] = 0x80 | (b[6] & 0x0f)      (UUID version 8)
//! b[8] = 0x80 | (b[8] & 0x3f)      (RFC 9562 variant)
//! ```
//!
//! and, like every message ID, its 16 bytes are its trace ID unless the stored message
//! carried a `traceparent` (then the trace is the producer's, [`ObservedTrace`]). Why the
//! sequence and not `Nats-Msg-Id`: nats-server's ack metrics and advisories name a message
//! only by its stream sequence, and in a work-queue or interest stream the message (and so
//! its headers) is gone once acknowledged; a key from the sequence places every event by
//! itself, in any order, after any restart. `Nats-Msg-Id` is kept as the trajectory's
//! request ID (with the stream as its producer), so a lookup by it finds the message.
//! A stream deleted and created again under the same name starts its sequences again and
//! so reuses IDs: observe a re-created stream under a fresh listener store.

use crate::ids::MessageId;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The domain separator of the observed message ID hash.
const DOMAIN: &[u8] = b"msgtrail-observe";

/// The `service.name` observe mode gives the store and deliver hops: nats-server did the work.
pub const OBSERVED_SERVICE: &str = "nats-server";

/// What observe mode cannot see, named on every observed trajectory
/// ([`Observation::unseen`]).
pub const UNSEEN: &[&str] = &[
    "producer send time (P1) and the producer's store confirmation (P4): the send hop is synthesized",
    "the time nats-server received the message apart from when it stored it: the store hop has no width",
    "the consumer's receipt, processing start and end (C2/C6, X1, X2): no process hop",
    "the delivery time of an attempt that was not acked (nak, term, ack wait expired): only its outcome",
];

/// What an observed trajectory also cannot see when msgtrail never read its stored message
/// ([`Observation::stored`] false), named after [`UNSEEN`].
pub const UNSEEN_STORED: &str = "the stored message (subject, stored time, Nats-Msg-Id, traceparent): msgtrail did not read it (a work-queue stream, whose messages a reader would remove, or a message gone before it was read): no store hop, and the trace is the message ID's";

/// Why an observed trajectory may lack hops: a consumer of its stream that does not sample
/// every ack (`sample_freq` under 100 %), whose acked deliveries nats-server reports only
/// some of (none at 0 %). Set by the listener from what it last saw of the consumer, on
/// trajectories that have no ack of that consumer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnsampledConsumer {
    /// The durable consumer (its group).
    pub consumer: String,
    /// Its `sample_freq`, percent (0: unset, no ack sampled).
    pub sample_freq: u8,
    /// The `nats` CLI command that makes it sample every ack.
    pub fix: String,
}

/// The message ID of the message stored at `seq` in `stream` (see the module documentation):
/// a UUIDv8, the same for everyone who computes it.
pub fn observed_message_id(stream: &str, seq: u64) -> MessageId {
    let mut h = Sha256::new();
    h.update(DOMAIN);
    h.update([0]);
    h.update(stream.as_bytes());
    h.update([0]);
    h.update(seq.to_be_bytes());
    let digest = h.finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    b[6] = 0x80 | (b[6] & 0x0f);
    b[8] = 0x80 | (b[8] & 0x3f);
    MessageId::from_u128(u128::from_be_bytes(b)).expect("version 8 is a message ID version")
}

/// The trace an observed message's spans join: the producer's, from the W3C `traceparent`
/// stored with the message (its send span becomes a child of the producer's span).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservedTrace {
    /// The producer's trace ID.
    #[serde(with = "hex16")]
    pub trace_id: [u8; 16],
    /// The producer's span: the parent of the trajectory's root span.
    #[serde(with = "hex8")]
    pub parent_span_id: [u8; 8],
}

impl ObservedTrace {
    /// Parses a W3C `traceparent` (`<version>-<32 hex>-<16 hex>-<2 hex>`, lowercase hex,
    /// version `ff` refused, all-zero IDs refused, version `00` exactly 55 characters).
    /// `None` when it is not a valid one.
    pub fn from_traceparent(value: &str) -> Option<Self> {
        let v = value.trim();
        let mut parts = v.split('-');
        let (ver, trace, span, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let lower_hex = |s: &str, n: usize| {
            s.len() == n
                && s.bytes()
                    .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        };
        if !lower_hex(ver, 2) || ver == "ff" || !lower_hex(trace, 32) || !lower_hex(span, 16) {
            return None;
        }
        let flags_ok = flags.get(..2).is_some_and(|f| lower_hex(f, 2));
        if !flags_ok || (ver == "00" && (v.len() != 55 || parts.next().is_some())) {
            return None;
        }
        let trace_id = u128::from_str_radix(trace, 16).ok()?.to_be_bytes();
        let parent_span_id = u64::from_str_radix(span, 16).ok()?.to_be_bytes();
        (trace_id != [0; 16] && parent_span_id != [0; 8]).then_some(ObservedTrace {
            trace_id,
            parent_span_id,
        })
    }

    /// The trace ID as 32 lowercase hex digits.
    pub fn trace_hex(&self) -> String {
        crate::trace_ids::hex(&self.trace_id)
    }
}

/// How a trajectory was observed: which stream and sequence, the trace it joins, and what
/// observe mode cannot see. Present only on trajectories built in observe mode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    /// The observed stream.
    pub stream: String,
    /// The message's sequence in it.
    pub stream_seq: u64,
    /// The app's `Nats-Msg-Id`, when it sent one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats_msg_id: Option<String>,
    /// The producer's trace, when the stored message carried a valid `traceparent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub joins: Option<ObservedTrace>,
    /// Whether msgtrail read the stored message (its store hop, subject, `Nats-Msg-Id` and
    /// `traceparent` are in); false when only nats-server's events about its deliveries
    /// are ([`UNSEEN_STORED`]).
    #[serde(default = "yes")]
    pub stored: bool,
    /// What observe mode cannot see ([`UNSEEN`], and [`UNSEEN_STORED`] when not
    /// `stored`).
    pub unseen: Vec<String>,
    /// The consumers of the stream that do not sample every ack and have no ack on this
    /// trajectory: their deliveries may be missing from it. Filled in by the listener
    /// (assembly leaves it empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unsampled: Vec<UnsampledConsumer>,
}

fn yes() -> bool {
    true
}

mod hex16 {
    pub(super) fn serialize<S: serde::Serializer>(b: &[u8; 16], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::trace_ids::hex(b))
    }
    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<[u8; 16], D::Error> {
        let t = <String as serde::Deserialize>::deserialize(d)?;
        u128::from_str_radix(&t, 16)
            .map(u128::to_be_bytes)
            .map_err(serde::de::Error::custom)
    }
}

mod hex8 {
    pub(super) fn serialize<S: serde::Serializer>(b: &[u8; 8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::trace_ids::hex(b))
    }
    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<[u8; 8], D::Error> {
        let t = <String as serde::Deserialize>::deserialize(d)?;
        u64::from_str_radix(&t, 16)
            .map(u64::to_be_bytes)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_observed_id_is_a_documented_uuidv8() {
        let id = observed_message_id("ORDERS", 42);
        assert!(id.is_observed());
        assert_eq!(id.to_string().as_bytes()[14], b'8');
        assert_eq!(id, observed_message_id("ORDERS", 42));
        assert_ne!(id, observed_message_id("ORDERS", 43));
        assert_ne!(id, observed_message_id("PAYMENTS", 42));
        // The text form parses back (message IDs are v7 or v8).
        assert_eq!(id.to_string().parse::<MessageId>().unwrap(), id);
        // Recomputed by hand from the documented formula.
        let mut h = Sha256::new();
        h.update(b"msgtrail-observe\0ORDERS\0");
        h.update(42u64.to_be_bytes());
        let d = h.finalize();
        let mut b = [0u8; 16];
        b.copy_from_slice(&d[..16]);
        b[6] = 0x80 | (b[6] & 0x0f);
        b[8] = 0x80 | (b[8] & 0x3f);
        assert_eq!(id.as_bytes(), &b);
    }

    #[test]
    fn a_traceparent_parses_strictly() {
        let t = ObservedTrace::from_traceparent(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        )
        .unwrap();
        assert_eq!(t.trace_hex(), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(t.parent_span_id, 0xb7ad6b7169203331u64.to_be_bytes());
        for bad in [
            "",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
        ] {
            assert_eq!(ObservedTrace::from_traceparent(bad), None, "{bad:?}");
        }
        let json = serde_json::to_string(&t).unwrap();
        assert!(json.contains("0af7651916cd43dd8448eb211c80319c"), "{json}");
        assert_eq!(serde_json::from_str::<ObservedTrace>(&json).unwrap(), t);
    }
}
