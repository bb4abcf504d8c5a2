//! Signatures on what the broker hands to clients and later takes back as proof: ack tokens
//! (proof that a delivery went to this consumer) and upload receipts (proof that a message ID
//! was assigned to this producer's request). Both are HMAC-SHA256 tags under one key that
//! every broker of the deployment shares.
//!
//! The key lives in the JetStream key-value bucket `msgtrail_broker` (key `token-key`, no
//! expiry): the first broker creates it with 32 random bytes, the others read it. Clients have
//! no JetStream rights, so they cannot read it.

use async_nats::jetstream;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use msgtrail_core::{ClientId, MessageId, RequestId};
use msgtrail_nats::topology::{self, Policy, BROKER_BUCKET};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

const KEY_NAME: &str = "token-key";

/// The shared signing key.
#[derive(Clone)]
pub(crate) struct SigningKey(hmac::Key);

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(<hidden>)")
    }
}

impl SigningKey {
    /// A key from raw bytes.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Self {
        SigningKey(hmac::Key::new(hmac::HMAC_SHA256, bytes))
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

    /// The base64url tag of `data`.
    pub(crate) fn tag(&self, data: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(hmac::sign(&self.0, data).as_ref())
    }

    /// Whether `tag` is the tag of `data` (constant time).
    pub(crate) fn verify(&self, data: &[u8], tag: &str) -> bool {
        URL_SAFE_NO_PAD
            .decode(tag)
            .map(|t| hmac::verify(&self.0, data, &t).is_ok())
            .unwrap_or(false)
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
        assert!(key.verify_receipt(&p, &r, &m, &receipt));
        assert!(!key.verify_receipt(&q, &r, &m, &receipt));
        assert!(!key.verify_receipt(&p, &r, &MessageId::new(), &receipt));
        assert!(!SigningKey::random().verify_receipt(&p, &r, &m, &receipt));
        assert!(!key.verify_receipt(&p, &r, &m, "not-a-tag"));
    }
}
