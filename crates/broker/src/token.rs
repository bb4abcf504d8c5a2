//! Ack tokens: everything any broker of the queue group needs to settle a delivery, so an
//! ack can land on a broker other than the one that delivered.
//!
//! A token is base64url (no padding) of a small JSON object. It holds the JetStream ack
//! subject of the delivery; clients cannot publish there themselves (their NATS permissions
//! stop at `msgtrail.v1.>`), and the broker only accepts a token from the consumer it was
//! issued to, for a consumer of the message stream.

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
    /// Encodes the token.
    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(self).expect("token serializes"))
    }

    /// Decodes a token and checks it was issued to `consumer` for the message stream.
    pub fn decode_for(text: &str, consumer: &ClientId) -> Result<AckToken, WireError> {
        let bad = |m: &str| WireError::new(ErrorCode::BadAckToken, m.to_owned());
        let bytes = URL_SAFE_NO_PAD
            .decode(text)
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
        let t = token();
        let text = t.encode();
        assert_eq!(AckToken::decode_for(&text, &t.c).unwrap(), t);
        let other = ClientId::new("b-2").unwrap();
        assert_eq!(
            AckToken::decode_for(&text, &other).unwrap_err().code,
            ErrorCode::BadAckToken
        );
        assert!(AckToken::decode_for("!!", &t.c).is_err());
        let mut forged = token();
        forged.a = "$JS.API.STREAM.DELETE.MSGTRAIL_MESSAGES".into();
        assert!(AckToken::decode_for(&forged.encode(), &forged.c).is_err());
    }
}
