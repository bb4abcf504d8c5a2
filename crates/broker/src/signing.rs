//! Signatures on what the broker hands to clients and later takes back as proof: ack tokens
//! (proof that a delivery went to this consumer) and upload receipts (proof that a message ID
//! was assigned to this producer's request). Both are MAC tags under one key that every
//! broker of the deployment shares.
//!
//! The key lives in the JetStream key-value bucket `msgtrail_broker` (key `token-key`, no
//! expiry): the first broker creates it with 32 random bytes, the others read it. Clients have
//! no JetStream rights, so they cannot read it.
//!
//! ## Two MACs, told apart by the tag's length
//! - [`Mac::Blake3`] (what this broker issues): keyed BLAKE3 under a key derived from the
//!   shared bytes (`blake3::derive_key` with [`BLAKE3_CONTEXT`], so the two MACs never share a
//!   key), the first 128 bits of its output, 22 base64url characters. Keyed BLAKE3 is a PRF,
//!   so a truncated tag is as hard to forge as its length says: 2^-128 per guess.
//! - [`Mac::HmacSha256`]: HMAC-SHA256 under the raw bytes, 32 bytes, 43 characters — what
//!   earlier brokers issued. Still verified, so tokens and receipts issued before a rolling
//!   upgrade settle and prove after it (same key material, nothing to migrate).
//!
//! Both compare in constant time. A message costs three MACs (its receipt, its token at
//! delivery, the token's check at settle): 25.6 k instructions with HMAC-SHA256, 4.5 k with
//! keyed BLAKE3 — half of one HMAC-SHA256 (BENCHMARKS.md, "Round 8, message path").

use async_nats::jetstream;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use msgtrail_core::{ClientId, MessageId, RequestId};
use msgtrail_nats::topology::{self, Policy, BROKER_BUCKET};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use subtle::ConstantTimeEq;

const KEY_NAME: &str = "token-key";

/// The context of the BLAKE3 key derived from the shared bytes (BLAKE3's `derive_key`:
/// a fixed, unique, application-specific string).
pub(crate) const BLAKE3_CONTEXT: &str =
    "msgtrail 2026-12 broker MAC of ack tokens and upload receipts";

/// Bytes of a keyed-BLAKE3 tag (128 bits).
const BLAKE3_TAG_BYTES: usize = 16;
/// Characters of a keyed-BLAKE3 tag in base64url without padding.
const BLAKE3_TAG_CHARS: usize = 22;
/// Characters of an HMAC-SHA256 tag in base64url without padding.
const HMAC_TAG_CHARS: usize = 43;

/// Which MAC a tag is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mac {
    /// Keyed BLAKE3, 128 bits: what this broker issues.
    Blake3,
    /// HMAC-SHA256: what earlier brokers issued; verified, never issued.
    HmacSha256,
}

/// The shared signing key, in the form each MAC takes it.
#[derive(Clone)]
pub(crate) struct SigningKey {
    hmac: hmac::Key,
    blake3: [u8; 32],
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(<hidden>)")
    }
}

impl SigningKey {
    /// A key from raw bytes.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Self {
        SigningKey {
            hmac: hmac::Key::new(hmac::HMAC_SHA256, bytes),
            blake3: blake3::derive_key(BLAKE3_CONTEXT, bytes),
        }
    }

    /// A fresh random key (for tests and single-broker use).
    #[cfg(test)]
    pub(crate) fn random() -> Self {
        Self::from_bytes(&random_bytes())
    }

    /// Loads the deployment's key, creating it if this is the first broker.
    pub(crate) async fn load_or_create(
        js: &jetstream::Context,
        replicas: usize,
    ) -> Result<Self, async_nats::Error> {
        // No expiry: the key lives as long as the deployment.
        let config = topology::bucket(BROKER_BUCKET, replicas, std::time::Duration::ZERO);
        let bucket = topology::ensure_bucket(js, &config, Policy::owner(replicas)).await?;
        // create() fails if another broker won the race; then its key is the one to read.
        let _ = bucket
            .create(KEY_NAME, random_bytes().to_vec().into())
            .await;
        let entry = bucket
            .get(KEY_NAME)
            .await?
            .ok_or("signing key missing after create")?;
        Ok(Self::from_bytes(&entry))
    }

    /// The base64url tag of `data` (keyed BLAKE3, 128 bits).
    pub(crate) fn tag(&self, data: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(self.blake3_tag(data))
    }

    /// The keyed-BLAKE3 tag of `data`: the first 128 bits of its output.
    fn blake3_tag(&self, data: &[u8]) -> [u8; BLAKE3_TAG_BYTES] {
        let mut out = [0u8; BLAKE3_TAG_BYTES];
        out.copy_from_slice(&blake3::keyed_hash(&self.blake3, data).as_bytes()[..BLAKE3_TAG_BYTES]);
        out
    }

    /// The base64url HMAC-SHA256 tag of `data`, as earlier brokers issued it.
    #[cfg(test)]
    pub(crate) fn hmac_tag(&self, data: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(hmac::sign(&self.hmac, data).as_ref())
    }

    /// Which MAC `tag` is, if it is the tag of `data` under either (constant time in the
    /// tag's bytes; the MAC is told by its length alone).
    pub(crate) fn verify(&self, data: &[u8], tag: &str) -> Option<Mac> {
        let mut raw = [0u8; 33];
        match tag.len() {
            BLAKE3_TAG_CHARS => {
                let n = URL_SAFE_NO_PAD.decode_slice(tag, &mut raw).ok()?;
                let ok: bool = self.blake3_tag(data)[..].ct_eq(&raw[..n]).into();
                ok.then_some(Mac::Blake3)
            }
            HMAC_TAG_CHARS => {
                let n = URL_SAFE_NO_PAD.decode_slice(tag, &mut raw).ok()?;
                hmac::verify(&self.hmac, data, &raw[..n])
                    .ok()
                    .map(|()| Mac::HmacSha256)
            }
            _ => None,
        }
    }

    /// The receipt of an upload: proof that `message_id` was assigned to `producer`'s
    /// `request_id`.
    pub(crate) fn receipt(
        &self,
        producer: &ClientId,
        request_id: &RequestId,
        message_id: &MessageId,
    ) -> String {
        self.tag(receipt_data(producer, request_id, message_id).as_bytes())
    }

    /// Checks an upload receipt.
    pub(crate) fn verify_receipt(
        &self,
        producer: &ClientId,
        request_id: &RequestId,
        message_id: &MessageId,
        receipt: &str,
    ) -> bool {
        self.verify(
            receipt_data(producer, request_id, message_id).as_bytes(),
            receipt,
        )
        .is_some()
    }
}

fn receipt_data(producer: &ClientId, request_id: &RequestId, message_id: &MessageId) -> String {
    format!("receipt\n{producer}\n{request_id}\n{message_id}")
}

fn random_bytes() -> [u8; 32] {
    let mut b = [0u8; 32];
    SystemRandom::new()
        .fill(&mut b)
        .expect("the system random source works");
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipts_bind_producer_request_and_message() {
        let key = SigningKey::random();
        let p = ClientId::new("shop").unwrap();
        let q = ClientId::new("other").unwrap();
        let r = RequestId::new("r1").unwrap();
        let m = MessageId::new();
        let receipt = key.receipt(&p, &r, &m);
        assert_eq!(receipt.len(), BLAKE3_TAG_CHARS);
        assert!(key.verify_receipt(&p, &r, &m, &receipt));
        assert!(!key.verify_receipt(&q, &r, &m, &receipt));
        assert!(!key.verify_receipt(&p, &r, &MessageId::new(), &receipt));
        assert!(!SigningKey::random().verify_receipt(&p, &r, &m, &receipt));
        assert!(!key.verify_receipt(&p, &r, &m, "not-a-tag"));
    }

    #[test]
    fn receipts_of_earlier_brokers_still_verify() {
        let key = SigningKey::random();
        let (p, r, m) = (
            ClientId::new("shop").unwrap(),
            RequestId::new("r1").unwrap(),
            MessageId::new(),
        );
        let old = key.hmac_tag(receipt_data(&p, &r, &m).as_bytes());
        assert_eq!(old.len(), HMAC_TAG_CHARS);
        assert!(key.verify_receipt(&p, &r, &m, &old));
        assert!(!key.verify_receipt(&p, &r, &MessageId::new(), &old));
        assert!(!SigningKey::random().verify_receipt(&p, &r, &m, &old));
    }

    #[test]
    fn each_mac_is_told_by_its_length_and_an_altered_tag_is_refused() {
        let key = SigningKey::random();
        let data = b"some token body";
        let new = key.tag(data);
        let old = key.hmac_tag(data);
        assert_eq!(key.verify(data, &new), Some(Mac::Blake3));
        assert_eq!(key.verify(data, &old), Some(Mac::HmacSha256));
        assert_eq!(key.verify(b"another body", &new), None);
        assert_eq!(key.verify(b"another body", &old), None);
        for tag in [&new, &old] {
            // Every single changed character is refused.
            for i in 0..tag.len() {
                let mut altered = tag.clone().into_bytes();
                altered[i] = if altered[i] == b'A' { b'B' } else { b'A' };
                let altered = String::from_utf8(altered).unwrap();
                assert_eq!(key.verify(data, &altered), None, "{altered}");
            }
            // Truncated, extended, or the other MAC's length: refused.
            assert_eq!(key.verify(data, &tag[..tag.len() - 1]), None);
            assert_eq!(key.verify(data, &format!("{tag}A")), None);
        }
        // The HMAC tag truncated to the BLAKE3 tag's length is no BLAKE3 tag.
        assert_eq!(key.verify(data, &old[..BLAKE3_TAG_CHARS]), None);
        // The two MACs use different keys: BLAKE3's is derived, never the raw bytes.
        let raw = [7u8; 32];
        let k = SigningKey::from_bytes(&raw);
        assert_ne!(k.blake3, raw);
        assert_eq!(k.blake3, blake3::derive_key(BLAKE3_CONTEXT, &raw));
        assert_eq!(key.verify(data, ""), None);
    }
}
