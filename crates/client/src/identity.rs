//! A client's identity: its ID, its nkey (which signs channel nonces) and its OpenTelemetry
//! `service.name`.

use crate::error::ClientError;
use msgtrail_core::ClientId;
use std::fmt;
use std::sync::Arc;

/// Who a producer or consumer is. `Debug` hides the seed.
#[derive(Clone)]
pub struct Identity {
    /// The client ID configured on the broker.
    pub client_id: ClientId,
    key: Arc<nkeys::KeyPair>,
    /// The `service.name` its spans carry (defaults to the broker's configured one, or the ID).
    pub service_name: Option<String>,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("client_id", &self.client_id)
            .field("public_key", &self.key.public_key())
            .field("service_name", &self.service_name)
            .finish()
    }
}

impl Identity {
    /// An identity from an nkey user seed (`SU…`).
    pub fn from_seed(client_id: ClientId, seed: &str) -> Result<Self, ClientError> {
        let key = nkeys::KeyPair::from_seed(seed.trim()).map_err(|e| {
            ClientError::Invalid(crate::error::Cause::with_context(
                format!("invalid nkey seed for {client_id}"),
                e,
            ))
        })?;
        Ok(Identity {
            client_id,
            key: Arc::new(key),
            service_name: None,
        })
    }

    /// A new identity with a fresh user nkey.
    pub fn generate(client_id: ClientId) -> Self {
        Identity {
            client_id,
            key: Arc::new(nkeys::KeyPair::new_user()),
            service_name: None,
        }
    }

    /// Sets the `service.name`.
    pub fn with_service_name(mut self, name: impl Into<String>) -> Self {
        self.service_name = Some(name.into());
        self
    }

    /// The nkey public key (`U…`) to put in the broker's clients file.
    pub fn public_key(&self) -> String {
        self.key.public_key()
    }

    /// The nkey seed (`SU…`); keep it secret.
    pub fn seed(&self) -> String {
        self.key.seed().expect("user keys have seeds")
    }

    /// Signs a nonce: base64url without padding of the Ed25519 signature.
    pub fn sign(&self, nonce: &str) -> String {
        use base64::Engine;
        let sig = self
            .key
            .sign(nonce.as_bytes())
            .expect("signing with a seed works");
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sig)
    }
}
