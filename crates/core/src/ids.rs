//! Identifiers and names, each validated once at the edge so the rest of the code can trust
//! them.
//!
//! | kind | grammar | example |
//! | --- | --- | --- |
//! | [`MessageId`] | UUIDv7, assigned by the broker (UUIDv8 in observe mode) | `0193a5f2-7c1e-7b2a-9f10-3c4d5e6f7a8b` |
//! | [`RequestId`] | 1–128 of `A-Z a-z 0-9 . _ : -` | `order-42:try` |
//! | [`ClientId`] (producer, consumer, group) | 1–64 of `A-Z a-z 0-9 _ -` | `billing-1` |
//! | [`Topic`] | 1–16 dot-separated tokens of `A-Z a-z 0-9 _ -`, at most 200 bytes | `orders.eu` |
//! | topic filter | a topic whose tokens may be `*`, and whose last token may be `>` | `orders.*` |

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use uuid::Uuid;

/// Why an identifier or name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdError {
    /// Not a UUID, or not version 7.
    #[error(
        "invalid message id {0:?}: expected a UUIDv7 such as 0193a5f2-7c1e-7b2a-9f10-3c4d5e6f7a8b"
    )]
    MessageId(String),
    /// Empty, too long, or with a character outside the grammar.
    #[error("invalid {kind} {value:?}: {rule}")]
    Name {
        /// Which kind of name (request id, client id, topic, …).
        kind: &'static str,
        /// The refused value (truncated to 80 characters).
        value: String,
        /// The rule it broke, in words.
        rule: &'static str,
    },
}

fn name_error(kind: &'static str, value: &str, rule: &'static str) -> IdError {
    IdError::Name {
        kind,
        value: value.chars().take(80).collect(),
        rule,
    }
}

/// A message ID: a UUIDv7 assigned by the broker when it receives an upload (stage P2), or
/// a UUIDv8 that observe mode derives from a message of a JetStream stream msgtrail does not
/// own ([`crate::observed::observed_message_id`]).
///
/// Its 128 bits are also the OpenTelemetry trace ID of the message's trajectory, so the text
/// form with the dashes removed is what to paste into Jaeger or Tempo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct MessageId(Uuid);

impl MessageId {
    /// A new message ID for a message received now.
    pub fn new() -> Self {
        MessageId(Uuid::now_v7())
    }

    /// A new message ID for a message received now, in partition `p` of the stage stream:
    /// a UUIDv7 whose last four random bits are `p` (`crate::partition`: the broker mints
    /// each message's ID in its request's partition, so the request's P1 and the message's
    /// records reach the same listeners).
    pub fn new_in(p: crate::partition::Partition) -> Self {
        let bits = Uuid::now_v7().as_u128();
        let mask = u128::from(crate::partition::PARTITION_BITS);
        MessageId(Uuid::from_u128((bits & !mask) | u128::from(p.index())))
    }

    /// The 16 bytes of the ID, big-endian as in the text form.
    pub fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }

    /// The ID as a `u128`.
    pub fn as_u128(&self) -> u128 {
        self.0.as_u128()
    }

    /// Builds an ID from its 128 bits, checking it is a UUIDv7 (or an observed UUIDv8).
    pub fn from_u128(v: u128) -> Result<Self, IdError> {
        let u = Uuid::from_u128(v);
        if !is_message_id_version(u.get_version_num()) {
            return Err(IdError::MessageId(u.hyphenated().to_string()));
        }
        Ok(MessageId(u))
    }

    /// Whether this is an observed message's ID (a UUIDv8 of observe mode), not one a broker
    /// assigned.
    pub fn is_observed(&self) -> bool {
        self.0.get_version_num() == 8
    }

    /// The millisecond Unix timestamp embedded in the UUIDv7: when the broker assigned it
    /// (meaningless for an observed ID, whose bits are a hash).
    pub fn unix_millis(&self) -> u64 {
        (self.0.as_u128() >> 80) as u64
    }

    /// The trace ID text form: 32 lowercase hex digits (the UUID without dashes).
    pub fn trace_hex(&self) -> String {
        self.0.simple().to_string()
    }
}

impl Default for MessageId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

impl FromStr for MessageId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        let u = Uuid::try_parse(s.trim()).map_err(|_| IdError::MessageId(s.to_owned()))?;
        if !is_message_id_version(u.get_version_num()) {
            return Err(IdError::MessageId(s.to_owned()));
        }
        Ok(MessageId(u))
    }
}

impl TryFrom<String> for MessageId {
    type Error = IdError;
    fn try_from(s: String) -> Result<Self, IdError> {
        s.parse()
    }
}

impl From<MessageId> for String {
    fn from(id: MessageId) -> String {
        id.to_string()
    }
}

/// UUID versions a message ID may have: 7 (assigned by a broker) and 8 (observe mode).
fn is_message_id_version(v: usize) -> bool {
    v == 7 || v == 8
}

fn check_chars(
    kind: &'static str,
    value: &str,
    max: usize,
    allowed: fn(char) -> bool,
    rule: &'static str,
) -> Result<(), IdError> {
    if value.is_empty() || value.len() > max || !value.chars().all(allowed) {
        return Err(name_error(kind, value, rule));
    }
    Ok(())
}

fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $max:literal, $allowed:expr, $rule:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Validates and wraps a value.
            pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
                let value = value.into();
                check_chars($kind, &value, $max, $allowed, $rule)?;
                Ok($name(value))
            }

            /// The value as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                Self::new(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(s: String) -> Result<Self, IdError> {
                Self::new(s)
            }
        }

        impl From<$name> for String {
            fn from(v: $name) -> String {
                v.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

string_id!(
    /// A request ID chosen by the producer for one upload. Retries of the same upload reuse
    /// it, which is how the broker stores a retried message once (docs/ARCHITECTURE.md §3, decision 2).
    RequestId,
    "request id",
    128,
    |c| is_token_char(c) || c == '.' || c == ':',
    "1 to 128 characters of A-Z a-z 0-9 . _ : -"
);

string_id!(
    /// The ID of a producer, a consumer or a consumer group. It appears in NATS subjects and
    /// JetStream consumer names, hence the narrow grammar.
    ClientId,
    "client id",
    64,
    is_token_char,
    "1 to 64 characters of A-Z a-z 0-9 _ -"
);

string_id!(
    /// The identity of one broker process, generated when it starts (or named by its
    /// configuration): every stage record the broker writes carries it, so that clock
    /// offsets pair only records of one broker's clock (docs/PROTOCOL.md §13).
    BrokerInstance,
    "broker instance",
    64,
    |c| is_token_char(c) || c == '.',
    "1 to 64 characters of A-Z a-z 0-9 . _ -"
);

impl BrokerInstance {
    /// A fresh instance name, `b-` and eight hex digits of a UUIDv7's random bits: short
    /// enough for a log line, distinct enough among the brokers of one deployment.
    pub fn generate() -> Self {
        let random = Uuid::now_v7().as_u128() as u32;
        BrokerInstance(format!("b-{random:08x}"))
    }
}

impl RequestId {
    /// A fresh request ID (a UUIDv7 in text form), for producers that do not choose one.
    pub fn generate() -> Self {
        RequestId(Uuid::now_v7().hyphenated().to_string())
    }
}

/// A topic: dot-separated tokens, like a NATS subject without wildcards.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Topic(String);

/// Maximum number of tokens in a topic.
pub(crate) const MAX_TOPIC_TOKENS: usize = 16;
/// Maximum length of a topic in bytes.
pub(crate) const MAX_TOPIC_LEN: usize = 200;
const TOPIC_RULE: &str = "1 to 16 dot-separated tokens of A-Z a-z 0-9 _ -, at most 200 bytes";
const FILTER_RULE: &str =
    "dot-separated tokens of A-Z a-z 0-9 _ -, or * for one token, or > as the last token";

impl Topic {
    /// Validates a topic (no wildcards).
    pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
        let value = value.into();
        validate_tokens("topic", &value, false)
            .map_err(|_| name_error("topic", &value, TOPIC_RULE))?;
        Ok(Topic(value))
    }

    /// The topic as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for Topic {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        Self::new(s)
    }
}

impl TryFrom<String> for Topic {
    type Error = IdError;
    fn try_from(s: String) -> Result<Self, IdError> {
        Self::new(s)
    }
}

impl From<Topic> for String {
    fn from(v: Topic) -> String {
        v.0
    }
}

impl AsRef<str> for Topic {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// A topic equals the text it is made of, so that `received.topic == "orders.eu"` reads as
/// it did when the field was text.
impl PartialEq<str> for Topic {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for Topic {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for Topic {
    fn eq(&self, other: &String) -> bool {
        &self.0 == other
    }
}

impl PartialEq<Topic> for str {
    fn eq(&self, other: &Topic) -> bool {
        self == other.0
    }
}

impl PartialEq<Topic> for &str {
    fn eq(&self, other: &Topic) -> bool {
        *self == other.0
    }
}

impl PartialEq<Topic> for String {
    fn eq(&self, other: &Topic) -> bool {
        *self == other.0
    }
}

/// Validates a topic filter: a topic whose tokens may be `*`, and whose last token may be `>`.
pub fn validate_topic_filter(value: &str) -> Result<(), IdError> {
    validate_tokens("topic filter", value, true)
        .map_err(|_| name_error("topic filter", value, FILTER_RULE))
}

fn validate_tokens(_kind: &str, value: &str, wildcards: bool) -> Result<(), ()> {
    if value.is_empty() || value.len() > MAX_TOPIC_LEN {
        return Err(());
    }
    let tokens: Vec<&str> = value.split('.').collect();
    if tokens.len() > MAX_TOPIC_TOKENS {
        return Err(());
    }
    let last = tokens.len() - 1;
    for (i, t) in tokens.iter().enumerate() {
        let ok = match *t {
            "*" => wildcards,
            ">" => wildcards && i == last,
            t => !t.is_empty() && t.chars().all(is_token_char),
        };
        if !ok {
            return Err(());
        }
    }
    Ok(())
}

/// Whether `topic` matches `filter` with NATS wildcard rules (`*` one token, `>` one or more
/// trailing tokens).
pub fn topic_matches(filter: &str, topic: &str) -> bool {
    let mut f = filter.split('.');
    let mut t = topic.split('.');
    loop {
        match (f.next(), t.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_id_is_uuid_v7_and_round_trips() {
        let id = MessageId::new();
        let text = id.to_string();
        assert_eq!(text.len(), 36);
        assert_eq!(text.parse::<MessageId>().unwrap(), id);
        assert_eq!(id.trace_hex(), text.replace('-', ""));
        assert!(id.unix_millis() > 1_700_000_000_000);
        // A v4 UUID is refused.
        assert!("f47ac10b-58cc-4372-a567-0e02b2c3d479"
            .parse::<MessageId>()
            .is_err());
        assert!("nope".parse::<MessageId>().is_err());
    }

    #[test]
    fn names_follow_their_grammar() {
        assert!(ClientId::new("billing-1_a").is_ok());
        assert!(ClientId::new("").is_err());
        assert!(ClientId::new("a.b").is_err());
        assert!(ClientId::new("x".repeat(65)).is_err());
        assert!(RequestId::new("order-42:try.1").is_ok());
        assert!(RequestId::new("has space").is_err());
        let err = RequestId::new("bad/char").unwrap_err().to_string();
        assert!(err.contains("request id"), "{err}");
    }

    #[test]
    fn topics_and_filters() {
        assert!(Topic::new("orders.eu").is_ok());
        assert!(Topic::new("orders.*").is_err());
        assert!(Topic::new("orders..eu").is_err());
        assert!(Topic::new(".orders").is_err());
        assert!(Topic::new(vec!["a"; 17].join(".")).is_err());
        assert!(validate_topic_filter("orders.*").is_ok());
        assert!(validate_topic_filter("orders.>").is_ok());
        assert!(validate_topic_filter(">").is_ok());
        assert!(validate_topic_filter("orders.>.eu").is_err());
        assert!(topic_matches("orders.*", "orders.eu"));
        assert!(!topic_matches("orders.*", "orders.eu.x"));
        assert!(topic_matches("orders.>", "orders.eu.x"));
        assert!(!topic_matches("orders.>", "orders"));
        assert!(topic_matches("orders", "orders"));
        assert!(!topic_matches("orders", "orders.eu"));
    }
}
