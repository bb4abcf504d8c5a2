//! NATS header names of the protocol (docs/PROTOCOL.md, "Headers").

/// The channel a request is made on.
pub const CHANNEL: &str = "Msgtrail-Channel";
/// The producer's request ID of an upload.
pub const REQUEST_ID: &str = "Msgtrail-Request-Id";
/// The topic of an upload or a delivered message.
pub const TOPIC: &str = "Msgtrail-Topic";
/// The upload attempt (1 for the first send, 2 for the first retry, …).
pub const ATTEMPT: &str = "Msgtrail-Attempt";
/// The message ID (on stored and delivered messages).
pub const MESSAGE_ID: &str = "Msgtrail-Message-Id";
/// The producer ID (on stored and delivered messages).
pub const PRODUCER: &str = "Msgtrail-Producer";
/// The producer's `service.name` (on stored messages of earlier brokers; now a field of
/// [`STORED`]).
pub const PRODUCER_SERVICE: &str = "Msgtrail-Producer-Service";
/// Prefix of attribute headers: `Msgtrail-Attr-category: refund`.
pub const ATTR_PREFIX: &str = "Msgtrail-Attr-";
/// The delivery attempt of a delivered message.
pub const DELIVERY_ATTEMPT: &str = "Msgtrail-Delivery-Attempt";
/// The token to settle a delivered message with.
pub const ACK_TOKEN: &str = "Msgtrail-Ack-Token";
/// The consumer group of a delivered message.
pub const GROUP: &str = "Msgtrail-Group";
/// The stream sequence of a delivered message.
pub const STREAM_SEQ: &str = "Msgtrail-Stream-Seq";
/// On a stored message of an earlier broker (now a field of [`STORED`]): when the broker
/// received its upload (P2), Unix nanoseconds by the broker's clock. With the message's JetStream stored time it is the evidence of the store
/// hop (P2/P3) that survives any crash: it is stored atomically with the message.
pub const RECEIVED_AT: &str = "Msgtrail-Received-At";
/// On a stored message of an earlier broker (now a field of [`STORED`]): the `service.name`
/// of the broker that stored it.
pub const BROKER_SERVICE: &str = "Msgtrail-Broker-Service";
/// On a stored message (brokers since layout version 1): what only msgtrail reads — request
/// ID, producer service and, with stage recording on, the store evidence — in one value
/// (`msgtrail_core::stored`, docs/PROTOCOL.md §14.1). It replaces the separate
/// `Msgtrail-Request-Id`, `-Producer`, `-Producer-Service`, `-Topic`, `-Attempt`,
/// `-Received-At` and `-Broker-Service` of stored messages, which readers still accept.
pub const STORED: &str = "Msgtrail-Stored";
/// On a stored message, optionally: the first bytes of the payload, base64. The listener
/// takes it into a recovered P2 when present; brokers do not set it today (the payload head
/// travels in their own P2 on the stage stream, which the listener prefers).
pub const PAYLOAD_HEAD: &str = "Msgtrail-Payload-Head";
/// On a request, optionally: how long the client waits for the reply, in milliseconds, as a
/// whole number. A broker whose reply would wait for something (a settle's or a stage
/// report's records being stored) answers before that time is up rather than after the
/// client gave up (docs/PROTOCOL.md §10).
pub const TIMEOUT_MS: &str = "Msgtrail-Timeout-Ms";
/// The machine-readable error code of an error reply (see [`crate::wire::ErrorCode`]).
pub const ERROR: &str = "Msgtrail-Error";
/// W3C trace context, passed through and linked, never required.
pub const TRACEPARENT: &str = "traceparent";
/// JetStream's deduplication header.
pub const NATS_MSG_ID: &str = "Nats-Msg-Id";
/// NATS service API: error text of an error reply.
pub const NATS_SERVICE_ERROR: &str = "Nats-Service-Error";
/// NATS service API: numeric error code of an error reply.
pub const NATS_SERVICE_ERROR_CODE: &str = "Nats-Service-Error-Code";

/// Maximum number of attributes on one message.
pub const MAX_ATTRIBUTES: usize = 32;
/// Maximum length of an attribute key (after the prefix).
pub const MAX_ATTR_KEY_LEN: usize = 64;
/// Maximum length of an attribute value.
pub const MAX_ATTR_VALUE_LEN: usize = 256;

/// Why an attribute key or value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AttrError {
    /// The key is empty, too long, or has a character outside `A-Z a-z 0-9 _ -`.
    #[error(
        "invalid attribute key {key:?}: 1 to {MAX_ATTR_KEY_LEN} characters of A-Z a-z 0-9 _ -"
    )]
    Key {
        /// The key as given.
        key: String,
    },
    /// The value is too long or holds a control character (a line break among them).
    #[error(
        "invalid value for attribute {key:?}: at most {MAX_ATTR_VALUE_LEN} bytes without control characters"
    )]
    Value {
        /// The key the value was given for.
        key: String,
    },
}

/// Validates an attribute key: 1–64 of `A-Z a-z 0-9 _ -`, stored lowercase.
pub fn validate_attr_key(key: &str) -> Result<String, AttrError> {
    if key.is_empty()
        || key.len() > MAX_ATTR_KEY_LEN
        || !key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(AttrError::Key {
            key: key.to_owned(),
        });
    }
    Ok(key.to_ascii_lowercase())
}

/// Validates an attribute value: at most 256 bytes of printable text without line breaks.
pub fn validate_attr_value(key: &str, value: &str) -> Result<(), AttrError> {
    if value.len() > MAX_ATTR_VALUE_LEN || value.chars().any(|c| c.is_control()) {
        return Err(AttrError::Value {
            key: key.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attribute_errors_say_what_is_wrong() {
        assert_eq!(validate_attr_key("Category").unwrap(), "category");
        let e = validate_attr_key("no spaces").unwrap_err();
        assert_eq!(
            e,
            AttrError::Key {
                key: "no spaces".into()
            }
        );
        assert!(
            e.to_string()
                .contains("invalid attribute key \"no spaces\""),
            "{e}"
        );
        let e = validate_attr_value("k", "line\nbreak").unwrap_err();
        assert_eq!(e, AttrError::Value { key: "k".into() });
        assert!(
            e.to_string().contains("invalid value for attribute \"k\""),
            "{e}"
        );
        assert!(validate_attr_value("k", &"x".repeat(MAX_ATTR_VALUE_LEN)).is_ok());
        assert!(validate_attr_value("k", &"x".repeat(MAX_ATTR_VALUE_LEN + 1)).is_err());
    }
}
