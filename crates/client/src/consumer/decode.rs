//! Deliveries as the broker sends them (binary frames, JSON fetch replies, header pushes)
//! turned into [`Received`] messages.

use super::message::Received;
use super::settle::Settler;
use crate::error::{Cause, ClientError};
use base64::Engine;
use msgtrail_core::frame::{DeliveredMessage, DeliveryBatch, FrameKind};
use msgtrail_core::headers as h;
use msgtrail_core::wire::FetchReply;
use msgtrail_core::GroupId;
use msgtrail_core::{frame, ClientId, Topic};
use std::collections::BTreeMap;

/// Who the deliveries are for: this consumer, and its settle path.
#[derive(Debug, Clone)]
pub(super) struct Recipient<'a> {
    pub(super) consumer: &'a ClientId,
    pub(super) settler: Option<&'a Settler>,
}

/// A delivery of a binary frame as the SDK hands it out.
pub(super) fn received(
    d: DeliveredMessage,
    to: &Recipient<'_>,
    push: bool,
) -> Result<Received, ClientError> {
    let id = d.message_id;
    let bad = |what: &str, e: msgtrail_core::IdError| {
        ClientError::Decode(Cause::with_context(format!("{what} of delivery {id}"), e))
    };
    // The frame's text is taken, not copied: each name is checked where it is.
    let producer = ClientId::new(d.producer).map_err(|e| bad("producer", e))?;
    let group = ClientId::new(d.group)
        .map(GroupId::from)
        .map_err(|e| bad("group", e))?;
    let topic = Topic::new(d.topic).map_err(|e| bad("topic", e))?;
    Ok(Received {
        message_id: d.message_id,
        topic,
        attributes: d.attributes.into_iter().collect(),
        payload: d.payload,
        delivery_attempt: d.delivery_attempt,
        stream_seq: d.stream_seq,
        producer,
        group,
        consumer: to.consumer.clone(),
        push,
        by_id: false,
        ack_token: d.ack_token,
        settler: to.settler.cloned(),
    })
}

/// The deliveries of a binary delivery frame.
pub(super) fn frame_deliveries(
    payload: &bytes::Bytes,
    to: &Recipient<'_>,
    push: bool,
) -> Result<Vec<Received>, ClientError> {
    let batch = DeliveryBatch::decode(payload).map_err(ClientError::decode)?;
    batch
        .messages
        .into_iter()
        .map(|d| received(d, to, push))
        .collect()
}

/// Whether a reply or push is a binary delivery frame.
pub(super) fn is_frame(payload: &[u8]) -> bool {
    frame::frame_kind(payload) == Some(FrameKind::Deliveries)
}

/// The deliveries of a JSON fetch reply (base64 payloads), from a broker that predates
/// binary deliveries.
pub(super) fn json_deliveries(
    reply: FetchReply,
    to: &Recipient<'_>,
) -> Result<Vec<Received>, ClientError> {
    reply
        .messages
        .into_iter()
        .map(|d| {
            let payload = base64::engine::general_purpose::STANDARD
                .decode(&d.payload)
                .map_err(|e| {
                    ClientError::Decode(Cause::with_context(
                        format!("payload of {}", d.message_id),
                        e,
                    ))
                })?;
            let topic = Topic::new(d.topic).map_err(|e| {
                ClientError::Decode(Cause::with_context(format!("topic of {}", d.message_id), e))
            })?;
            Ok(Received {
                message_id: d.message_id,
                topic,
                attributes: d.attributes,
                payload: payload.into(),
                delivery_attempt: d.delivery_attempt,
                stream_seq: d.stream_seq,
                producer: d.producer,
                group: d.group,
                consumer: to.consumer.clone(),
                push: false,
                by_id: false,
                ack_token: d.ack_token,
                settler: to.settler.cloned(),
            })
        })
        .collect()
}

/// One push delivery in headers, from a broker that predates binary pushes.
pub(super) fn header_delivery(
    m: &async_nats::Message,
    group: &GroupId,
    to: &Recipient<'_>,
) -> Option<Received> {
    let hs = m.headers.as_ref()?;
    let get = |n: &str| hs.get(n).map(|v| v.as_str().to_owned());
    let mut attributes = BTreeMap::new();
    for (name, values) in hs.iter() {
        let name: &str = name.as_ref();
        if let (Some(k), Some(v)) = (name.strip_prefix(h::ATTR_PREFIX), values.first()) {
            attributes.insert(k.to_owned(), v.as_str().to_owned());
        }
    }
    Some(Received {
        message_id: get(h::MESSAGE_ID)?.parse().ok()?,
        topic: Topic::new(get(h::TOPIC)?).ok()?,
        attributes,
        payload: m.payload.clone(),
        delivery_attempt: get(h::DELIVERY_ATTEMPT)?.parse().ok()?,
        stream_seq: get(h::STREAM_SEQ)?.parse().ok()?,
        producer: ClientId::new(get(h::PRODUCER)?).ok()?,
        group: group.clone(),
        consumer: to.consumer.clone(),
        push: true,
        by_id: false,
        ack_token: get(h::ACK_TOKEN)?,
        settler: to.settler.cloned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use msgtrail_core::MessageId;

    #[test]
    fn binary_deliveries_become_received_messages() {
        let me = ClientId::new("billing-1").unwrap();
        let to = Recipient {
            consumer: &me,
            settler: None,
        };
        let d = DeliveredMessage {
            message_id: MessageId::new(),
            topic: "orders.eu".into(),
            producer: "shop".into(),
            group: "billing".into(),
            delivery_attempt: 2,
            stream_seq: 9,
            ack_token: "tok".into(),
            attributes: vec![("category".into(), "refund".into())],
            payload: Bytes::from_static(b"\x00raw"),
        };
        let r = received(d.clone(), &to, true).unwrap();
        assert_eq!(r.payload, Bytes::from_static(b"\x00raw"));
        assert_eq!(r.attributes["category"], "refund");
        assert_eq!(r.group, "billing");
        assert_eq!(
            (r.push, r.delivery_attempt, r.consumer),
            (true, 2, me.clone())
        );
        let bad = DeliveredMessage {
            producer: "not a client id".into(),
            ..d
        };
        assert!(received(bad, &to, false).is_err());
    }
}
