//! Ack tokens: everything any broker of the queue group needs to settle a delivery, so an
//! ack can land on a broker other than the one that delivered.
//!
//! A token is `<base64url body>.<base64url tag>` (no padding). The body is a
//! compact binary form of the delivery (version byte 4: message ID, attempt, sequence, the
//! settle deadline as a varint, a flags byte, then group, consumer, topic, push subscription and the JetStream ack subject
//! without its fixed `$JS.ACK.MSGTRAIL_MESSAGES.` prefix and, for a group's durable consumer,
//! without the `g-<group>-` its name starts with, each a length-prefixed string),
//! signed with the key all brokers share ([`crate::signing`]): a version-4 body with a
//! 128-bit keyed-BLAKE3 tag (22 characters); the version-3 and version-2 bodies and the JSON
//! body of earlier brokers with an HMAC-SHA256 tag (43 characters), still accepted, and only
//! so — a body with the other MAC's tag is refused. Tokens travel with every
//! delivery, settle and consumer stage report, so they are kept small (about 200 characters;
//! the earlier JSON body, still accepted, made them about 310) and cheap to check (no JSON). Clients cannot alter it: the broker
//! only accepts a token whose tag verifies, from the consumer it was issued to, for a
//! consumer of the message stream. The same token proves a consumer's own stage reports about
//! that delivery ([`crate::relay`]).
//!
//! The settle deadline is when JetStream's ack wait for the delivery runs out, by the clock
//! of the broker that delivered it (less a margin for the trip to the NATS server): a settle
//! after it is refused as `delivery_expired` ([`crate::consume`]). Version-2 tokens, issued
//! before it existed, have none and are settled as before.

use crate::signing::{Mac, SigningKey};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use msgtrail_core::codec;
use msgtrail_core::{ClientId, ErrorCode, GroupId, MessageId, WireError};
use serde::{Deserialize, Serialize};

/// The first byte of a binary token body: the layout of version 3, signed with keyed BLAKE3.
const BINARY_VERSION: u8 = 4;
/// The first byte of the binary token bodies signed with HMAC-SHA256, with the deadline.
const BINARY_VERSION_3: u8 = 3;
/// The first byte of the binary token bodies issued before the settle deadline.
const BINARY_VERSION_2: u8 = 2;
/// The fixed start of every ack subject of the message stream (left out of the body).
const ACK_PREFIX: &str = "$JS.ACK.MSGTRAIL_MESSAGES.";

/// The contents of an ack token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AckToken {
    /// Message ID.
    pub m: MessageId,
    /// Consumer group.
    pub g: GroupId,
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
    /// Settle deadline, Unix milliseconds: JetStream's ack wait for this delivery runs out
    /// then. `None` in tokens issued before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e: Option<u64>,
}

impl AckToken {
    /// Whether this is a delivery of a fetch by message ID: its JetStream ack subject names
    /// the group's per-message durable consumer ([`crate::consume::by_id_durable_name`]).
    pub(crate) fn by_id(&self) -> bool {
        let durable = crate::consume::by_id_durable_name(self.g.as_str(), &self.m);
        self.a.split('.').any(|token| token == durable)
    }

    /// Encodes and signs the token.
    pub(crate) fn encode(&self, key: &SigningKey) -> String {
        let body = URL_SAFE_NO_PAD.encode(self.to_bytes());
        let tag = key.tag(body.as_bytes());
        let mut out = String::with_capacity(body.len() + 1 + tag.len());
        out.push_str(&body);
        out.push('.');
        out.push_str(&tag);
        out
    }

    /// How many milliseconds past its settle deadline `now_ms` is, if it is past it.
    pub(crate) fn expired_by(&self, now_ms: u64) -> Option<u64> {
        self.e
            .filter(|&deadline| now_ms >= deadline)
            .map(|deadline| now_ms - deadline)
    }

    /// The settle deadline as it travels: milliseconds after the message ID's time, plus one
    /// (0 for none), so that a fresh delivery's takes 3 bytes as a varint, not 8.
    fn deadline_delta(&self) -> u64 {
        self.e.map_or(0, |e| {
            e.saturating_sub(self.m.unix_millis()).saturating_add(1)
        })
    }

    /// The binary body (version 4, laid out as version 3; the deadline is a LEB128 varint,
    /// [`Self::deadline_delta`]).
    fn to_bytes(&self) -> Vec<u8> {
        let full = self.a.strip_prefix(ACK_PREFIX).unwrap_or(&self.a);
        // The group's durable consumer names the group again (`g-<group>-…`): leave it out.
        let ack = full
            .strip_prefix("g-")
            .and_then(|rest| rest.strip_prefix(self.g.as_str()))
            .and_then(|rest| rest.strip_prefix('-'))
            .unwrap_or(full);
        let mut b = Vec::with_capacity(
            48 + self.g.as_str().len() + self.c.as_str().len() + self.t.len() + ack.len(),
        );
        b.push(BINARY_VERSION);
        b.extend_from_slice(self.m.as_bytes());
        b.extend_from_slice(&self.n.to_be_bytes());
        b.extend_from_slice(&self.q.to_be_bytes());
        codec::put_varint(&mut b, self.deadline_delta());
        b.push(
            u8::from(self.p)
                | (u8::from(self.s.is_some()) << 1)
                | (u8::from(full.len() != self.a.len()) << 2)
                | (u8::from(ack.len() != full.len()) << 3),
        );
        for text in [
            self.g.as_str(),
            self.c.as_str(),
            &self.t,
            self.s.as_deref().unwrap_or(""),
            ack,
        ] {
            let text = &text.as_bytes()[..text.len().min(255)];
            b.push(text.len() as u8);
            b.extend_from_slice(text);
        }
        b
    }

    /// Reads a binary body (version 4 or 3, or 2 without the deadline); `None` when it is
    /// not one.
    fn from_bytes(b: &[u8]) -> Option<AckToken> {
        let (&version, rest) = b.split_first()?;
        if !matches!(
            version,
            BINARY_VERSION | BINARY_VERSION_3 | BINARY_VERSION_2
        ) || rest.len() < 29
        {
            return None;
        }
        let m = MessageId::from_u128(u128::from_be_bytes(rest[..16].try_into().ok()?)).ok()?;
        let n = u32::from_be_bytes(rest[16..20].try_into().ok()?);
        let q = u64::from_be_bytes(rest[20..28].try_into().ok()?);
        let (delta, deadline_len) = match version {
            BINARY_VERSION_2 => (0, 0),
            _ => codec::get_varint(&rest[28..]).ok()?,
        };
        let e = delta
            .checked_sub(1)
            .map(|d| m.unix_millis().saturating_add(d));
        let flags = *rest.get(28 + deadline_len)?;
        let mut pos = 29 + deadline_len;
        let mut text = || -> Option<String> {
            let len = *rest.get(pos)? as usize;
            let s = std::str::from_utf8(rest.get(pos + 1..pos + 1 + len)?).ok()?;
            pos += 1 + len;
            Some(s.to_owned())
        };
        let (g, c, t, s, ack) = (text()?, text()?, text()?, text()?, text()?);
        if pos != rest.len() {
            return None;
        }
        let a = match (flags & 4 != 0, flags & 8 != 0) {
            (true, true) => format!("{ACK_PREFIX}g-{g}-{ack}"),
            (true, false) => format!("{ACK_PREFIX}{ack}"),
            (false, true) => format!("g-{g}-{ack}"),
            (false, false) => ack,
        };
        Some(AckToken {
            m,
            g: GroupId::new(g).ok()?,
            c: ClientId::new(c).ok()?,
            n,
            q,
            t,
            p: flags & 1 != 0,
            s: (flags & 2 != 0).then_some(s),
            a,
            e,
        })
    }

    /// Verifies a token and checks it was issued to `consumer` for the message stream.
    pub(crate) fn decode_for(
        text: &str,
        consumer: &ClientId,
        key: &SigningKey,
    ) -> Result<AckToken, WireError> {
        let bad = |m: &str| WireError::new(ErrorCode::BadAckToken, m.to_owned());
        let (body, tag) = text
            .split_once('.')
            .ok_or_else(|| bad("ack token is malformed"))?;
        let Some(mac) = key.verify(body.as_bytes(), tag) else {
            return Err(bad(
                "ack token signature does not verify (altered, or not issued by this deployment)",
            ));
        };
        let bytes = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| bad("ack token is not base64url"))?;
        // Each body version with its own MAC only: version 4 with keyed BLAKE3; versions 3
        // and 2 and the JSON body of earlier brokers with HMAC-SHA256.
        let blake3_body = bytes.first() == Some(&BINARY_VERSION);
        if blake3_body != (mac == Mac::Blake3) {
            return Err(bad(
                "ack token is signed with the MAC of another token version",
            ));
        }
        // Binary (version 4, 3 or 2), or the JSON body of tokens issued before them.
        let token = match AckToken::from_bytes(&bytes) {
            Some(t) => t,
            None => serde_json::from_slice::<AckToken>(&bytes)
                .map_err(|_| bad("ack token is malformed"))?,
        };
        if &token.c != consumer {
            return Err(bad("ack token was issued to another consumer"));
        }
        if !token.a.starts_with(ACK_PREFIX) || token.a.contains(['*', '>', ' ']) {
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
            g: GroupId::new("billing").unwrap(),
            c: ClientId::new("b-1").unwrap(),
            n: 1,
            q: 7,
            t: "orders".into(),
            p: false,
            s: None,
            a: "$JS.ACK.MSGTRAIL_MESSAGES.g-billing-1.1.7.7.1.0".into(),
            e: None,
        }
    }

    #[test]
    fn the_settle_deadline_travels_and_tells_a_late_settle() {
        let key = SigningKey::random();
        let mut t = token();
        let deadline = t.m.unix_millis() + 30_000;
        t.e = Some(deadline);
        assert_eq!(
            t.to_bytes().len(),
            token().to_bytes().len() + 2,
            "3 bytes, not 8"
        );
        let back = AckToken::decode_for(&t.encode(&key), &t.c, &key).unwrap();
        assert_eq!(back.e, Some(deadline));
        assert_eq!(back.expired_by(deadline - 1), None);
        assert_eq!(back.expired_by(deadline), Some(0));
        assert_eq!(back.expired_by(deadline + 1500), Some(1500));
        // A redelivery long after the upload, and a deadline of the message's own time.
        for e in [t.m.unix_millis() + 90 * 24 * 3600 * 1000, t.m.unix_millis()] {
            t.e = Some(e);
            assert_eq!(AckToken::from_bytes(&t.to_bytes()).unwrap().e, Some(e));
        }
        t.e = Some(deadline);
        // Truncated varints are malformed, not misread.
        let bytes = t.to_bytes();
        assert!(AckToken::from_bytes(&bytes[..30]).is_none());
        // A version-2 body (no deadline), as brokers issued them before: never expired here.
        let mut v2 = t.to_bytes();
        v2[0] = BINARY_VERSION_2;
        v2.drain(29..32);
        let body = URL_SAFE_NO_PAD.encode(&v2);
        let old = format!("{body}.{}", key.hmac_tag(body.as_bytes()));
        let back = AckToken::decode_for(&old, &t.c, &key).unwrap();
        assert_eq!(back, AckToken { e: None, ..t });
        assert_eq!(back.expired_by(u64::MAX), None);
    }

    #[test]
    fn a_fetch_by_id_is_told_by_its_durable_consumer() {
        let mut t = token();
        assert!(!t.by_id());
        let durable = crate::consume::by_id_durable_name("billing", &t.m);
        assert!(crate::consume::is_by_id_durable(&durable));
        assert!(!crate::consume::is_by_id_durable(
            "g-billing-0123456789abcdef"
        ));
        t.a = format!("$JS.ACK.MSGTRAIL_MESSAGES.{durable}.1.7.1.1.0");
        assert!(t.by_id());
        // Another message's or group's by-ID consumer is not this delivery's.
        t.m = MessageId::new();
        assert!(!t.by_id());
    }

    #[test]
    fn the_ack_prefix_names_the_message_stream() {
        assert_eq!(
            ACK_PREFIX,
            format!("$JS.ACK.{}.", msgtrail_core::subjects::MESSAGE_STREAM)
        );
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
    fn tokens_are_compact_and_earlier_json_tokens_still_settle() {
        let key = SigningKey::random();
        let mut t = token();
        t.s = Some("0123456789abcdef0123456789abcdef".into());
        t.p = true;
        t.a = "$JS.ACK.MSGTRAIL_MESSAGES.g-billing-0123456789abcdef.1.1234.1234.1764000000000000000.0".into();
        t.e = Some(t.m.unix_millis() + 30_000);
        let text = t.encode(&key);
        assert!(text.len() < 230, "{} characters", text.len());
        assert_eq!(AckToken::decode_for(&text, &t.c, &key).unwrap(), t);
        // Ack subjects of another shape (a consumer not named after the group, a subject
        // without the stream's prefix) travel whole.
        for a in [
            "$JS.ACK.MSGTRAIL_MESSAGES.other-7.1.7.7.1.0",
            "$JS.ACK.MSGTRAIL_MESSAGES.g-billingx-1.1.7.7.1.0",
            "g-billing-1.1.7.7.1.0",
        ] {
            let mut odd = t.clone();
            odd.a = a.into();
            assert_eq!(AckToken::from_bytes(&odd.to_bytes()).unwrap(), odd);
        }
        // A token with a JSON body, as brokers issued them before.
        let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&t).unwrap());
        let old = format!("{body}.{}", key.hmac_tag(body.as_bytes()));
        assert!(old.len() > text.len() + 60);
        assert_eq!(AckToken::decode_for(&old, &t.c, &key).unwrap(), t);
    }

    /// `t` as a broker before keyed BLAKE3 issued it: a version-3 body, an HMAC-SHA256 tag.
    fn hmac_token(t: &AckToken, key: &SigningKey) -> String {
        let mut v3 = t.to_bytes();
        v3[0] = BINARY_VERSION_3;
        let body = URL_SAFE_NO_PAD.encode(&v3);
        format!("{body}.{}", key.hmac_tag(body.as_bytes()))
    }

    #[test]
    fn tokens_of_both_macs_settle_and_each_body_takes_only_its_own() {
        let key = SigningKey::random();
        let mut t = token();
        t.e = Some(t.m.unix_millis() + 30_000);
        let new = t.encode(&key);
        let old = hmac_token(&t, &key);
        // A rolling upgrade: a token an earlier broker issued settles on this one.
        assert_eq!(AckToken::decode_for(&new, &t.c, &key).unwrap(), t);
        assert_eq!(AckToken::decode_for(&old, &t.c, &key).unwrap(), t);
        // 22 tag characters instead of 43.
        assert_eq!(new.len() + 21, old.len());
        let (new_body, new_tag) = new.split_once('.').unwrap();
        let (old_body, old_tag) = old.split_once('.').unwrap();
        // A version-4 body with an HMAC tag, or a version-3 body with a BLAKE3 tag: refused
        // although each tag is genuine for its body.
        let swapped = [
            format!("{new_body}.{}", key.hmac_tag(new_body.as_bytes())),
            format!("{old_body}.{}", key.tag(old_body.as_bytes())),
        ];
        for text in &swapped {
            let e = AckToken::decode_for(text, &t.c, &key).unwrap_err();
            assert!(e.message.contains("another token version"), "{e}");
        }
        // A forged or altered tag, or a tag of another body: refused.
        for (body, tag) in [(new_body, new_tag), (old_body, old_tag)] {
            let mut altered = tag.as_bytes().to_vec();
            altered[3] = if altered[3] == b'x' { b'y' } else { b'x' };
            let altered = format!("{body}.{}", String::from_utf8(altered).unwrap());
            assert!(AckToken::decode_for(&altered, &t.c, &key).is_err());
            let zeros = "A".repeat(tag.len());
            assert!(AckToken::decode_for(&format!("{body}.{zeros}"), &t.c, &key).is_err());
        }
        let mut other = t.clone();
        other.q += 1;
        let other_body = other.encode(&key);
        let (other_body, _) = other_body.split_once('.').unwrap();
        assert!(AckToken::decode_for(&format!("{other_body}.{new_tag}"), &t.c, &key).is_err());
        // Another deployment's key: neither verifies.
        let foreign = SigningKey::random();
        assert!(AckToken::decode_for(&new, &t.c, &foreign).is_err());
        assert!(AckToken::decode_for(&old, &t.c, &foreign).is_err());
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
