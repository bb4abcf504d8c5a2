//! Deliveries: fetch replies and pushes ([`DeliveryBatch`] of [`DeliveredMessage`]s).

use super::*;

// ---------------------------------------------------------------------------------------
// Deliveries (fetch replies and pushes)
// ---------------------------------------------------------------------------------------

/// One delivered message, payload as raw bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveredMessage {
    /// The message ID.
    pub message_id: MessageId,
    /// Its topic.
    pub topic: String,
    /// The producer that uploaded it.
    pub producer: String,
    /// The consumer group it was delivered to.
    pub group: String,
    /// 1 for the first delivery to this group, 2 for the first redelivery, …
    pub delivery_attempt: u32,
    /// Its sequence in the message stream.
    pub stream_seq: u64,
    /// Settle it with this token.
    pub ack_token: String,
    /// Its attributes.
    pub attributes: Vec<(String, String)>,
    /// The payload.
    pub payload: Bytes,
}

/// Delivered messages: the binary fetch reply, and each binary push.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeliveryBatch {
    /// The no-matching-message notice (fetch only; then `messages` is empty).
    pub no_matching_message: bool,
    /// The messages.
    pub messages: Vec<DeliveredMessage>,
}

impl DeliveryBatch {
    /// Encodes the batch.
    pub fn encode(&self) -> Bytes {
        let size: usize = self
            .messages
            .iter()
            .map(|m| m.payload.len() + m.ack_token.len() + m.topic.len() + 96)
            .sum();
        let mut w = Writer::new(FrameKind::Deliveries, size);
        w.u8(u8::from(self.no_matching_message));
        w.u16(self.messages.len() as u16);
        for m in &self.messages {
            w.buf.extend_from_slice(m.message_id.as_bytes());
            w.str16(&m.topic);
            w.str8(&m.producer);
            w.str8(&m.group);
            w.u32(m.delivery_attempt);
            w.u64(m.stream_seq);
            w.str16(&m.ack_token);
            w.u8(m.attributes.len().min(u8::MAX as usize) as u8);
            for (k, v) in m.attributes.iter().take(u8::MAX as usize) {
                w.str8(k);
                w.str16(v);
            }
            w.bytes32(&m.payload);
        }
        w.finish()
    }

    /// Decodes a batch; payloads share `bytes`' memory.
    pub fn decode(bytes: &Bytes) -> Result<DeliveryBatch, FrameError> {
        let mut r = Reader::open(bytes, FrameKind::Deliveries, "deliveries")?;
        let no_matching_message = r.u8()? != 0;
        let n = r.count(MAX_BATCH_ENTRIES, "messages")?;
        let mut messages = Vec::with_capacity(n);
        for _ in 0..n {
            messages.push(DeliveredMessage {
                message_id: r.message_id()?,
                topic: r.str16()?,
                producer: r.str8()?,
                group: r.str8()?,
                delivery_attempt: r.u32()?,
                stream_seq: r.u64()?,
                ack_token: r.str16()?,
                attributes: r.attrs()?,
                payload: r.bytes32()?,
            });
        }
        r.end()?;
        Ok(DeliveryBatch {
            no_matching_message,
            messages,
        })
    }
}
