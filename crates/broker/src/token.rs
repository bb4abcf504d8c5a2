//! Ack tokens: everything any broker of the queue group needs to settle a delivery, so an
//! ack can land on a broker other than the one that delivered.
//!
//! A token is `<base64url JSON>.<base64url HMAC-SHA256 tag>` (no padding): a small JSON object
//! holding the delivery (message, group, consumer, attempt, the JetStream ack subject), signed
//! with the key all brokers share ([`crate::signing`]). Clients cannot alter it: the broker
//! only accepts a token whose tag verifies, from the consumer it was issued to, for a
//! consumer of the message stream. The same token proves a consumer's own stage reports about
//! that delivery ([`crate::relay`]).

use crate::signing::SigningKey;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use msgtrail_core::subjects::MESSAGE_STREAM;
use msgtrail_core::{ClientId, ErrorCode, MessageId, WireError};
use serde::{Deserialize, Serialize};

/// The contents of an ack token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckToken {
    /// Message ID.
    pub m: MessageId,
    /// Consumer group.
    pub g: ClientId,
    /// Consumer the delivery went to.
    pub c: ClientId,
    /// Delivery attempt.
    pub n: u32,
    /// Stream sequence.
    pub q: u64,
    /// Topic.
    pub t: String,
    /// True for push deliveries (C1–C4), false for pull (C5–C8).
    pub p: bool,
    /// The push subscription, if any (to free its in-flight slot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s: Option<String>,
    /// The JetStream ack subject.
    pub a: String,
}

impl AckToken {
    /// Encodes and signs the token.
    pub fn encode(&self, key: &SigningKey) -> String {
        let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(self).expect("token serializes"));
        let tag = key.tag(body.as_bytes());
        format!("{body}.{tag}")
    }

    /// Verifies a token and checks it was issued to `consumer` for the message stream.
    pub fn decode_for(
        text: &str,
        consumer: &ClientId,
        key: &SigningKey,
    ) -> Result<AckToken, WireError> {
        let bad = |m: &str| WireError::new(ErrorCode::BadAckToken, m.to_owned());
        let (body, tag) = text
            .split_once('.')
            .ok_or_else(|| bad("ack token is malformed"))?;
        if !key.verify(body.as_bytes(), tag) {
            return Err(bad(
                "ack token signature does not verify (altered, or not issued by this deployment)",
            ));
        }
        let bytes = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| bad("ack token is not base64url"))?;
        let token: AckToken =
            serde_json::from_slice(&bytes).map_err(|_| bad("ack token is malformed"))?;
        if &token.c != consumer {
            return Err(bad("ack token was issued to another consumer"));
        }
        let prefix = format!("$JS.ACK.{MESSAGE_STREAM}.");
        if !token.a.starts_with(&prefix) || token.a.contains(['*', '>', ' ']) {
            return Err(bad(
                "ack token does not name a delivery of the message stream",
            ));
        }
        Ok(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> AckToken {
        AckToken {
            m: MessageId::new(),
            g: ClientId::new("billing").unwrap(),
            c: ClientId::new("b-1").unwrap(),
            n: 1,
            q: 7,
            t: "orders".into(),
            p: false,
            s: None,
            a: "$JS.ACK.MSGTRAIL_MESSAGES.g-billing-1.1.7.7.1.0".into(),
        }
    }

    #[test]
    fn round_trips_for_its_consumer_only() {
        let key = SigningKey::random();
        let t = token();
        let text = t.encode(&key);
        assert_eq!(AckToken::decode_for(&text, &t.c, &key).unwrap(), t);
        let other = ClientId::new("b-2").unwrap();
        assert_eq!(
            AckToken::decode_for(&text, &other, &key).unwrap_err().code,
            ErrorCode::BadAckToken
        );
        assert!(AckToken::decode_for("!!", &t.c, &key).is_err());
        // Signed, but not an ack subject of the message stream.
        let mut odd = token();
        odd.a = "$JS.API.STREAM.DELETE.MSGTRAIL_MESSAGES".into();
        assert!(AckToken::decode_for(&odd.encode(&key), &odd.c, &key).is_err());
    }

    #[test]
    fn altered_or_foreign_tokens_are_refused() {
        let key = SigningKey::random();
        let t = token();
        let text = t.encode(&key);
        // A consumer rewrites the consumer field to itself and keeps the tag.
        let (_, tag) = text.split_once('.').unwrap();
        let mut stolen = token();
        stolen.c = ClientId::new("mallory").unwrap();
        let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&stolen).unwrap());
        let forged = format!("{body}.{tag}");
        assert!(AckToken::decode_for(&forged, &stolen.c, &key).is_err());
        // Signed by another deployment.
        assert!(AckToken::decode_for(&text, &t.c, &SigningKey::random()).is_err());
    }
}
