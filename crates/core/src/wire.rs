//! JSON bodies of requests and replies, and the error codes of error replies.
//!
//! Errors travel the NATS service API way: an empty body with the headers
//! `Nats-Service-Error-Code` (an HTTP-like status), `Nats-Service-Error` (the message) and
//! `Msgtrail-Error` (the [`ErrorCode`] in snake case, for programs).

use crate::group::GroupId;
use crate::ids::{ClientId, MessageId, RequestId};
use crate::stage::Role;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Machine-readable error codes; their snake-case names are part of the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// The body or headers are malformed (bad JSON, missing field, bad header value).
    BadRequest,
    /// The client ID is not configured on the broker.
    UnknownClient,
    /// The nonce signature does not verify against the client's public key.
    BadSignature,
    /// The nonce is unknown, already used, expired, or issued to another client.
    BadNonce,
    /// The client may not do this (wrong role, topic not permitted).
    NotPermitted,
    /// The channel does not exist or has expired.
    UnknownChannel,
    /// The topic or topic filter breaks the grammar.
    InvalidTopic,
    /// The request ID breaks the grammar.
    InvalidRequestId,
    /// An attribute key or value breaks the grammar, or there are too many.
    InvalidAttribute,
    /// The payload is larger than the broker's limit.
    PayloadTooLarge,
    /// The headers are larger than the broker's limit.
    HeadersTooLarge,
    /// The ack token is malformed or belongs to another consumer group.
    BadAckToken,
    /// A reported stage record does not belong to the reporting channel.
    RecordNotOwned,
    /// A reported stage record is malformed.
    InvalidRecord,
    /// The message ID is unknown.
    UnknownMessage,
    /// The subscription does not exist on this channel.
    UnknownSubscription,
    /// JetStream or another dependency is unavailable; retry later.
    Unavailable,
    /// The delivery's ack wait ran out before its settle arrived: JetStream no longer holds it
    /// for this delivery (it redelivers the message, or dead-letters it after the last
    /// attempt), so the settle was not applied. Retrying the same settle cannot succeed.
    DeliveryExpired,
    /// A settle came after the delivery's ack wait, and JetStream shows the message already
    /// settled in the group (acked — by an earlier attempt of this settle whose answer was
    /// lost, or by another delivery — or dead-lettered): nothing is left to do for it.
    AlreadySettled,
    /// A bug or an unexpected failure.
    Internal,
}

impl ErrorCode {
    /// The snake-case name carried in `Msgtrail-Error`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::UnknownClient => "unknown_client",
            ErrorCode::BadSignature => "bad_signature",
            ErrorCode::BadNonce => "bad_nonce",
            ErrorCode::NotPermitted => "not_permitted",
            ErrorCode::UnknownChannel => "unknown_channel",
            ErrorCode::InvalidTopic => "invalid_topic",
            ErrorCode::InvalidRequestId => "invalid_request_id",
            ErrorCode::InvalidAttribute => "invalid_attribute",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::HeadersTooLarge => "headers_too_large",
            ErrorCode::BadAckToken => "bad_ack_token",
            ErrorCode::RecordNotOwned => "record_not_owned",
            ErrorCode::InvalidRecord => "invalid_record",
            ErrorCode::UnknownMessage => "unknown_message",
            ErrorCode::UnknownSubscription => "unknown_subscription",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::DeliveryExpired => "delivery_expired",
            ErrorCode::AlreadySettled => "already_settled",
            ErrorCode::Internal => "internal",
        }
    }

    /// Parses the snake-case name; unknown names map to [`ErrorCode::Internal`].
    pub fn parse(s: &str) -> ErrorCode {
        serde_json::from_value(serde_json::Value::String(s.to_owned()))
            .unwrap_or(ErrorCode::Internal)
    }

    /// The HTTP-like status carried in `Nats-Service-Error-Code`.
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::BadRequest
            | ErrorCode::InvalidTopic
            | ErrorCode::InvalidRequestId
            | ErrorCode::InvalidAttribute
            | ErrorCode::BadAckToken
            | ErrorCode::InvalidRecord => 400,
            ErrorCode::UnknownClient | ErrorCode::BadSignature | ErrorCode::BadNonce => 401,
            ErrorCode::NotPermitted | ErrorCode::RecordNotOwned => 403,
            ErrorCode::UnknownChannel
            | ErrorCode::UnknownMessage
            | ErrorCode::UnknownSubscription => 404,
            ErrorCode::PayloadTooLarge | ErrorCode::HeadersTooLarge => 413,
            ErrorCode::DeliveryExpired => 410,
            ErrorCode::AlreadySettled => 409,
            ErrorCode::Unavailable => 503,
            ErrorCode::Internal => 500,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error reply: a code and a precise message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct WireError {
    /// What kind of error.
    pub code: ErrorCode,
    /// What exactly was wrong, in words.
    pub message: String,
}

impl WireError {
    /// An error of `code` with `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        WireError {
            code,
            message: message.into(),
        }
    }
}

/// `channel.challenge` request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChallengeRequest {
    /// The client asking.
    pub client_id: ClientId,
}

/// `channel.challenge` reply.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChallengeReply {
    /// The nonce to sign with the client's nkey; valid once, for a short time.
    pub nonce: String,
}

/// `channel.open` request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpenRequest {
    /// Producer or consumer.
    pub role: Role,
    /// The client's ID.
    pub client_id: ClientId,
    /// The nonce from `channel.challenge`.
    pub nonce: String,
    /// Ed25519 signature of the nonce's UTF-8 bytes by the client's nkey, base64url without
    /// padding (what `nkeys` `KeyPair::sign` + base64url gives).
    pub signature: String,
    /// The client's OpenTelemetry `service.name`; defaults to the client ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
}

/// `channel.open` reply.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpenReply {
    /// The channel ID to send with every request.
    pub channel: String,
    /// The channel expires this long after the last open or keepalive.
    pub ttl_ms: u64,
    /// Topic filters the client may use (`>` for any).
    pub topics: Vec<String>,
}

/// `channel.keepalive` and `channel.close` request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChannelRequest {
    /// The channel ID.
    pub channel: String,
}

/// `channel.keepalive` reply.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeepaliveReply {
    /// Time left before the channel expires.
    pub ttl_ms: u64,
}

/// `upload` reply (the request is headers plus the raw payload).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadReply {
    /// The message ID the broker assigned (the original one for a duplicate).
    pub message_id: MessageId,
    /// The request ID of the upload.
    pub request_id: RequestId,
    /// The sequence of the message in the message stream.
    pub stream_seq: u64,
    /// True when this upload repeated an earlier request ID and was not stored again.
    pub duplicate: bool,
    /// The broker's signed receipt binding producer, request ID and message ID; a producer's
    /// P4 stage report must carry it as `token`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub receipt: String,
}

/// What a consumer wants: its group, a topic filter, attribute filters, or one message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscription {
    /// The consumer group; consumers of one group share the messages, every group gets all.
    pub group: GroupId,
    /// A topic filter with NATS wildcards (`orders.*`, `orders.>`).
    pub topic: String,
    /// Attribute filters: a message matches when it has every key with exactly that value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub filter: BTreeMap<String, String>,
    /// Only this message (fetch by message ID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<MessageId>,
}

/// `fetch` request (pull).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FetchRequest {
    /// The consumer's channel.
    pub channel: String,
    /// What to fetch.
    #[serde(flatten)]
    pub subscription: Subscription,
    /// Return at most this many messages (1–1000; default 1).
    #[serde(default = "one")]
    pub max: u32,
    /// Wait up to this long for the first message (0–30000 ms; default 1000).
    #[serde(default = "default_wait_ms")]
    pub wait_ms: u64,
    /// The reply's form: a JSON [`FetchReply`] (default) or a binary delivery frame.
    #[serde(default, skip_serializing_if = "Format::is_json")]
    pub format: Format,
}

/// How deliveries travel: JSON with base64 payloads (the default, for hand-written clients)
/// or binary [`crate::frame::DeliveryBatch`] frames with raw payload bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// JSON bodies, payloads in base64.
    #[default]
    Json,
    /// Binary frames (docs/PROTOCOL.md §18).
    Binary,
}

impl Format {
    fn is_json(&self) -> bool {
        *self == Format::Json
    }
}

fn one() -> u32 {
    1
}

fn default_wait_ms() -> u64 {
    1000
}

/// The text of the no-matching-message notice (N1).
pub const NO_MATCHING_MESSAGE: &str = "no_matching_message";

/// `fetch` reply.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FetchReply {
    /// The delivered messages, possibly none.
    pub messages: Vec<Delivery>,
    /// `"no_matching_message"` when nothing matched within the wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
}

/// One delivered message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// The message ID.
    pub message_id: MessageId,
    /// The topic it was uploaded to.
    pub topic: String,
    /// Its attributes.
    #[serde(default)]
    pub attributes: BTreeMap<String, String>,
    /// The payload, base64 (standard alphabet, padded).
    pub payload: String,
    /// 1 for the first delivery to this group, 2 for the first redelivery, …
    pub delivery_attempt: u32,
    /// The sequence in the message stream.
    pub stream_seq: u64,
    /// The producer that uploaded it.
    pub producer: ClientId,
    /// The consumer group it was delivered to.
    pub group: GroupId,
    /// Settle the delivery with this token.
    pub ack_token: String,
}

/// `subscribe` request (push).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubscribeRequest {
    /// The consumer's channel.
    pub channel: String,
    /// What to receive.
    #[serde(flatten)]
    pub subscription: Subscription,
    /// The subject the broker publishes deliveries to (the consumer's inbox).
    pub deliver_subject: String,
    /// Push in batches every this many milliseconds; absent or 0 pushes immediately.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_ms: Option<u64>,
    /// At most this many unsettled deliveries to this consumer (default 64).
    #[serde(default = "default_max_inflight")]
    pub max_inflight: u32,
    /// How pushes travel: one NATS message per delivery with headers (JSON, the default), or
    /// one binary delivery frame per push batch.
    #[serde(default, skip_serializing_if = "Format::is_json")]
    pub format: Format,
}

fn default_max_inflight() -> u32 {
    64
}

/// `subscribe` reply.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubscribeReply {
    /// The subscription's ID, for `unsubscribe`.
    pub subscription_id: String,
}

/// `unsubscribe` request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UnsubscribeRequest {
    /// The consumer's channel.
    pub channel: String,
    /// The subscription to stop.
    pub subscription_id: String,
}

/// How a delivery is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SettleKind {
    /// Processed; do not deliver again.
    Ack,
    /// Not processed; deliver again (after `delay_ms` if given).
    Nack,
    /// Never deliver again (the message is dead-lettered).
    Term,
}

impl SettleKind {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            SettleKind::Ack => "ack",
            SettleKind::Nack => "nack",
            SettleKind::Term => "term",
        }
    }
}

/// `ack` request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AckRequest {
    /// The consumer's channel.
    pub channel: String,
    /// The delivery's ack token.
    pub token: String,
    /// Ack, nack or term.
    pub kind: SettleKind,
    /// For a nack: redeliver after this delay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// For a nack or term: why (recorded in the trajectory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `settle` request in JSON (the binary form is [`crate::frame::SettleBatch`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SettleRequest {
    /// The consumer's channel.
    pub channel: String,
    /// The settles, answered in this order.
    pub settles: Vec<SettleItem>,
}

/// One settle of a JSON [`SettleRequest`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SettleItem {
    /// The delivery's ack token.
    pub token: String,
    /// Ack, nack or term.
    pub kind: SettleKind,
    /// For a nack: redeliver after this delay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// For a nack or term: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `settle` reply in JSON: one result per settle, in order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SettleReply {
    /// Per settle: `{"ok":true}` or `{"ok":false,"code":…,"error":…}`.
    pub results: Vec<ItemResult>,
}

/// The result of one item of a batch in JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemResult {
    /// True when this item succeeded.
    pub ok: bool,
    /// The error code when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<ErrorCode>,
    /// The error message when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ItemResult {
    /// The result of `r`.
    pub fn of(r: &Result<(), WireError>) -> Self {
        match r {
            Ok(()) => ItemResult {
                ok: true,
                code: None,
                error: None,
            },
            Err(e) => ItemResult {
                ok: false,
                code: Some(e.code),
                error: Some(e.message.clone()),
            },
        }
    }
}

/// Reply to `ack`, `unsubscribe`, `channel.close` and `stage`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OkReply {
    /// Always true.
    pub ok: bool,
    /// For `stage`: how many records were accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_round_trip() {
        for code in [
            ErrorCode::PayloadTooLarge,
            ErrorCode::BadSignature,
            ErrorCode::UnknownChannel,
            ErrorCode::DeliveryExpired,
            ErrorCode::AlreadySettled,
        ] {
            assert_eq!(ErrorCode::parse(code.as_str()), code);
        }
        assert_eq!(ErrorCode::parse("nonsense"), ErrorCode::Internal);
        assert_eq!(ErrorCode::PayloadTooLarge.status(), 413);
        assert_eq!(ErrorCode::DeliveryExpired.as_str(), "delivery_expired");
        assert_eq!(ErrorCode::DeliveryExpired.status(), 410);
        assert_eq!(ErrorCode::AlreadySettled.as_str(), "already_settled");
        assert_eq!(ErrorCode::AlreadySettled.status(), 409);
    }

    #[test]
    fn fetch_request_defaults() {
        let r: FetchRequest =
            serde_json::from_str(r#"{"channel":"c","group":"g","topic":"orders.*"}"#).unwrap();
        assert_eq!(r.max, 1);
        assert_eq!(r.wait_ms, 1000);
        assert!(r.subscription.filter.is_empty());
        assert!(serde_json::from_str::<FetchRequest>(
            r#"{"channel":"c","group":"bad group","topic":"t"}"#
        )
        .is_err());
    }
}
