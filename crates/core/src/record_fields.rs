//! The presence bits of a [`StageRecord`]'s optional fields, shared by both compact layouts
//! of a record: the wire's (stage stream version 2 and reported records, [`crate::frame`]) and
//! the listener's stored chunks. Each layout writes these 15 bits first and the values in this
//! order; what a layout adds of its own (the wire's `by_id` flag and extension byte, the
//! store's "other message ID", `by_id`, broker and stored time) takes the bits above
//! [`PAYLOAD_HEAD`].

use crate::record::StageRecord;

/// The message ID.
pub const MESSAGE_ID: u16 = 1 << 0;
/// The producer's request ID.
pub const REQUEST_ID: u16 = 1 << 1;
/// The producer.
pub const PRODUCER: u16 = 1 << 2;
/// The consumer.
pub const CONSUMER: u16 = 1 << 3;
/// The consumer group.
pub const GROUP: u16 = 1 << 4;
/// The topic (or topic filter).
pub const TOPIC: u16 = 1 << 5;
/// The upload or delivery attempt.
pub const ATTEMPT: u16 = 1 << 6;
/// The stream sequence.
pub const STREAM_SEQ: u16 = 1 << 7;
/// The outcome.
pub const OUTCOME: u16 = 1 << 8;
/// The detail text.
pub const DETAIL: u16 = 1 << 9;
/// The emitter's service name.
pub const SERVICE: u16 = 1 << 10;
/// The W3C traceparent.
pub const TRACEPARENT: u16 = 1 << 11;
/// The attributes (at least one).
pub const ATTRS: u16 = 1 << 12;
/// The payload size.
pub const PAYLOAD_SIZE: u16 = 1 << 13;
/// The payload's first bytes.
pub const PAYLOAD_HEAD: u16 = 1 << 14;
/// Every shared bit.
pub const ALL: u16 = (PAYLOAD_HEAD << 1) - 1;

/// The shared bits of `r`'s present optional fields.
pub fn present(r: &StageRecord) -> u16 {
    [
        (r.message_id.is_some(), MESSAGE_ID),
        (r.request_id.is_some(), REQUEST_ID),
        (r.producer.is_some(), PRODUCER),
        (r.consumer.is_some(), CONSUMER),
        (r.group.is_some(), GROUP),
        (r.topic.is_some(), TOPIC),
        (r.attempt.is_some(), ATTEMPT),
        (r.stream_seq.is_some(), STREAM_SEQ),
        (r.outcome.is_some(), OUTCOME),
        (r.detail.is_some(), DETAIL),
        (r.service.is_some(), SERVICE),
        (r.traceparent.is_some(), TRACEPARENT),
        (!r.attrs.is_empty(), ATTRS),
        (r.payload_size.is_some(), PAYLOAD_SIZE),
        (r.payload_head.is_some(), PAYLOAD_HEAD),
    ]
    .into_iter()
    .filter(|(is, _)| *is)
    .fold(0, |bits, (_, bit)| bits | bit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MessageId, Stage};

    #[test]
    fn each_present_field_sets_its_own_bit_and_nothing_else() {
        let mut r = StageRecord::at(Stage::UploadSent, 1);
        assert_eq!(present(&r), 0);
        r.message_id = Some(MessageId::new());
        r.topic = Some("orders.eu".into());
        r.payload_head = Some("x".into());
        assert_eq!(present(&r), MESSAGE_ID | TOPIC | PAYLOAD_HEAD);
        r.attrs.insert("k".into(), "v".into());
        assert_eq!(present(&r) & ATTRS, ATTRS);
        assert_eq!(ALL, 0x7fff);
    }
}
