//! NATS subjects and JetStream names of the protocol (docs/PROTOCOL.md, "Subjects").
//!
//! Clients only ever publish requests to `msgtrail.v1.>` and receive replies on their inboxes;
//! the streams' subjects are written by the broker alone.

/// Prefix of every request subject the broker serves.
pub const API_PREFIX: &str = "msgtrail.v1";
/// Ask for a nonce to sign: `{"client_id"}` → `{"nonce"}`.
pub const CHANNEL_CHALLENGE: &str = "msgtrail.v1.channel.challenge";
/// Open a channel with a signed nonce.
pub const CHANNEL_OPEN: &str = "msgtrail.v1.channel.open";
/// Keep a channel alive.
pub const CHANNEL_KEEPALIVE: &str = "msgtrail.v1.channel.keepalive";
/// Close a channel.
pub const CHANNEL_CLOSE: &str = "msgtrail.v1.channel.close";
/// Upload a message (headers + raw payload).
pub const UPLOAD: &str = "msgtrail.v1.upload";
/// Upload many messages in one request: a binary upload-batch frame (docs/PROTOCOL.md §18).
pub const UPLOAD_BATCH: &str = "msgtrail.v1.upload.batch";
/// Settle many deliveries in one request: a binary settle-batch frame or a JSON batch.
pub const SETTLE: &str = "msgtrail.v1.settle";
/// Pull: fetch matching messages.
pub const FETCH: &str = "msgtrail.v1.fetch";
/// Push: start a subscription.
pub const SUBSCRIBE: &str = "msgtrail.v1.subscribe";
/// Push: stop a subscription.
pub const UNSUBSCRIBE: &str = "msgtrail.v1.unsubscribe";
/// Settle a delivery: ack, nack (optionally delayed) or term.
pub const ACK: &str = "msgtrail.v1.ack";
/// Report the client's own stage records (newline-delimited JSON, or a binary report frame).
pub const STAGE_REPORT: &str = "msgtrail.v1.stage";

/// The queue group brokers share, so that several brokers split the requests.
pub const BROKER_QUEUE_GROUP: &str = "msgtrail-broker";

/// The stream holding messages.
pub const MESSAGE_STREAM: &str = "MSGTRAIL_MESSAGES";
/// Subject prefix of stored messages: `msgtrail.msg.<topic>`.
pub const MESSAGE_SUBJECT_PREFIX: &str = "msgtrail.msg";
/// The stream holding stage-record batches.
pub const STAGE_STREAM: &str = "MSGTRAIL_STAGES";
/// The subject of stage-record batches.
pub const STAGE_SUBJECT: &str = "msgtrail.stages";
/// The stream holding dead-lettered messages.
pub const DEAD_LETTER_STREAM: &str = "MSGTRAIL_DEAD_LETTERS";
/// Subject prefix of dead letters: `msgtrail.dlq.<group>.<topic>`.
pub const DEAD_LETTER_SUBJECT_PREFIX: &str = "msgtrail.dlq";
/// The key-value bucket of open channels (shared by all brokers).
pub const CHANNEL_BUCKET: &str = "msgtrail_channels";
/// The key-value bucket of outstanding challenge nonces.
pub const NONCE_BUCKET: &str = "msgtrail_nonces";

/// The stream subject of a message on `topic`.
pub fn message_subject(topic: &str) -> String {
    format!("{MESSAGE_SUBJECT_PREFIX}.{topic}")
}

/// The topic of a stream subject (the inverse of [`message_subject`]).
pub fn topic_of_subject(subject: &str) -> Option<&str> {
    subject
        .strip_prefix(MESSAGE_SUBJECT_PREFIX)
        .and_then(|s| s.strip_prefix('.'))
}

/// The dead-letter subject of a message of `topic` given up by `group`.
pub fn dead_letter_subject(group: &str, topic: &str) -> String {
    format!("{DEAD_LETTER_SUBJECT_PREFIX}.{group}.{topic}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_round_trip() {
        assert_eq!(message_subject("orders.eu"), "msgtrail.msg.orders.eu");
        assert_eq!(
            topic_of_subject("msgtrail.msg.orders.eu"),
            Some("orders.eu")
        );
        assert_eq!(topic_of_subject("other.orders"), None);
        assert!(UPLOAD.starts_with(API_PREFIX));
    }
}
