//! [`Received`]: a delivered message, settled through its own methods
//! ([`Received::ack`], [`Received::nack`], [`Received::term`], [`Received::settle`] with an
//! [`AckKind`]), like async-nats' `jetstream::Message::ack`.

use super::settle::Settler;
use crate::error::{Cause, ClientError};
use crate::hooks::DeliveryInfo;
use bytes::Bytes;
use msgtrail_core::wire::SettleKind as WireKind;
use msgtrail_core::GroupId;
use msgtrail_core::{trace_ids, ClientId, MessageId, Topic};
use std::collections::BTreeMap;
use std::time::Duration;

/// How to settle a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AckKind {
    /// Processed; do not deliver it to this group again.
    Ack,
    /// Not processed; deliver it again, after `delay` if given.
    Nack {
        /// How long JetStream waits before the next delivery.
        delay: Option<Duration>,
    },
    /// Never deliver it again: it is dead-lettered, with `reason` in its record.
    Term {
        /// Why (recorded with the dead letter).
        reason: Option<String>,
    },
}

impl AckKind {
    /// The wire kind, the delay and the reason of a settle entry.
    pub(crate) fn into_parts(self) -> (WireKind, Option<Duration>, String) {
        match self {
            AckKind::Ack => (WireKind::Ack, None, String::new()),
            AckKind::Nack { delay } => (WireKind::Nack, delay, String::new()),
            AckKind::Term { reason } => (WireKind::Term, None, reason.unwrap_or_default()),
        }
    }
}

/// A delivered message. Settle it with its own methods; the settle travels in a batch with
/// the consumer's other settles, and the result is this delivery's own (see
/// [`crate::Consumer`] for what a result means).
#[derive(Debug, Clone)]
pub struct Received {
    /// Message ID (also the trace ID of its trajectory).
    pub message_id: MessageId,
    /// Topic.
    pub topic: Topic,
    /// Attributes.
    pub attributes: BTreeMap<String, String>,
    /// Payload.
    pub payload: Bytes,
    /// Delivery attempt (1 = first delivery to this group).
    pub delivery_attempt: u32,
    /// Sequence in the message stream.
    pub stream_seq: u64,
    /// The producer.
    pub producer: ClientId,
    /// The consumer group.
    pub group: GroupId,
    /// The consumer it was delivered to (this consumer).
    pub consumer: ClientId,
    /// Pushed (true) or pulled (false).
    pub push: bool,
    /// Fetched by message ID (docs/PROTOCOL.md §8.2): its hops have keys of their own.
    pub by_id: bool,
    /// The token to settle it with.
    pub ack_token: String,
    /// The consumer's settle path; `None` only for deliveries decoded outside a consumer.
    pub(crate) settler: Option<Settler>,
}

impl Received {
    /// Acks the delivery. `Ok` means JetStream took the ack: the message is not delivered to
    /// this group again. An ack after the delivery's ack wait is refused with
    /// [`ClientError::is_delivery_expired`]: it was not applied, and the message is delivered
    /// again or was dead-lettered. A transient error ([`ClientError::is_transient`]) may be
    /// retried; a retry after a timeout that comes too late is
    /// [`ClientError::is_already_settled`] when the group is done with the message (the
    /// timed-out attempt was applied, or another delivery's ack, or a dead letter), or else
    /// [`ClientError::is_settle_ambiguous`]: the timed-out attempt may have been applied.
    pub async fn ack(&self) -> Result<(), ClientError> {
        self.settle(AckKind::Ack).await
    }

    /// Nacks the delivery: deliver it again (after `delay` if given).
    pub async fn nack(&self, delay: Option<Duration>) -> Result<(), ClientError> {
        self.settle(AckKind::Nack { delay }).await
    }

    /// Terminates the delivery: never deliver it again (it is dead-lettered with `reason`).
    pub async fn term(&self, reason: impl Into<String>) -> Result<(), ClientError> {
        self.settle(AckKind::Term {
            reason: Some(reason.into()),
        })
        .await
    }

    /// Settles the delivery as `kind` says.
    pub async fn settle(&self, kind: AckKind) -> Result<(), ClientError> {
        let (kind, delay, reason) = kind.into_parts();
        let settler = self.settler.as_ref().ok_or_else(|| {
            ClientError::Invalid(Cause::new("this delivery did not come from a consumer"))
        })?;
        settler.settle(self, kind, delay, reason).await
    }

    /// The trace and span IDs of this delivery's `process` span, the span the listener
    /// exports for it: trace ID = message ID, span ID = the documented hash of
    /// (message ID, `process/<group>/<consumer>/<attempt>`, with `/by-id` for a fetch by
    /// message ID). No propagation involved.
    pub fn process_span_ids(&self) -> ([u8; 16], [u8; 8]) {
        let hop = trace_ids::Hop::delivery(
            false,
            self.by_id,
            self.group.as_str(),
            self.consumer.as_str(),
            self.delivery_attempt,
        );
        (
            trace_ids::trace_id(&self.message_id),
            trace_ids::span_id(&self.message_id, &hop),
        )
    }

    /// The W3C `traceparent` of this delivery's `process` span, so that the application's
    /// own spans can be its children with any tracing library (extract it as a remote parent;
    /// with OpenTelemetry, `TraceContextPropagator`).
    pub fn process_traceparent(&self) -> String {
        let (trace, span) = self.process_span_ids();
        format!("00-{}-{}-01", trace_ids::hex(&trace), trace_ids::hex(&span))
    }

    /// What the hooks are told about this delivery.
    pub(crate) fn info(&self) -> DeliveryInfo {
        DeliveryInfo {
            message_id: self.message_id,
            topic: self.topic.clone(),
            group: self.group.clone(),
            attempt: self.delivery_attempt,
            push: self.push,
            ack_token: self.ack_token.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_becomes_its_wire_kind_delay_and_reason() {
        let d = Duration::from_millis(250);
        assert_eq!(
            AckKind::Ack.into_parts(),
            (WireKind::Ack, None, String::new())
        );
        assert_eq!(
            AckKind::Nack { delay: Some(d) }.into_parts(),
            (WireKind::Nack, Some(d), String::new())
        );
        assert_eq!(
            AckKind::Term {
                reason: Some("poison".into())
            }
            .into_parts(),
            (WireKind::Term, None, "poison".to_owned())
        );
        assert_eq!(
            AckKind::Term { reason: None }.into_parts(),
            (WireKind::Term, None, String::new())
        );
    }
}
