//! The broker's configured clients: who may open a channel, with which nkey, on which topics.
//!
//! The clients file is JSON:
//!
//! ```json
//! { "clients": [
//!   { "id": "shop", "role": "producer", "public_key": "UA…", "topics": ["orders.>"],
//!     "service_name": "shop-frontend" },
//!   { "id": "billing-1", "role": "consumer", "public_key": "UB…", "topics": ["orders.*"] }
//! ] }
//! ```
//!
//! `topics` holds topic filters; a producer may upload to any topic one of them matches, a
//! consumer may subscribe with any filter that lies within one of them. Absent means `>`.

use msgtrail_core::{topic_matches, validate_topic_filter};
use msgtrail_core::{ClientId, IdError, Role};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

/// One configured client.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClientEntry {
    /// The client ID it opens channels with.
    pub id: ClientId,
    /// Producer or consumer.
    pub role: Role,
    /// Its nkey public key (`U…`), which verifies its nonce signatures.
    pub public_key: String,
    /// Topic filters it may use; absent means any topic.
    #[serde(default = "any_topic")]
    pub topics: Vec<String>,
    /// Its OpenTelemetry `service.name`; the channel request may override it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
}

fn any_topic() -> Vec<String> {
    vec![">".to_owned()]
}

/// The clients file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClientsFile {
    /// The clients.
    pub clients: Vec<ClientEntry>,
}

/// Why the clients configuration was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientsError {
    /// The file cannot be read.
    #[error("cannot read clients file {path}")]
    Read {
        /// The path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid JSON of a [`ClientsFile`].
    #[error("invalid clients file {path}")]
    Parse {
        /// The path.
        path: String,
        /// What the JSON decoder said.
        source: serde_json::Error,
    },
    /// The file's clients are not a valid registry.
    #[error("invalid clients file {path}")]
    Invalid {
        /// The path.
        path: String,
        /// Which client is wrong, and how.
        source: RegistryError,
    },
}

/// Why [`ClientRegistry::new`] refused its clients.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// A client's public key is not an nkey public key.
    #[error("client {client}: invalid nkey public key")]
    PublicKey {
        /// The client.
        client: ClientId,
        /// What nkeys said.
        source: nkeys::error::Error,
    },
    /// A client's topic filter is not one.
    #[error("client {client}: invalid topic filter")]
    TopicFilter {
        /// The client.
        client: ClientId,
        /// Which filter, and the grammar.
        source: IdError,
    },
    /// Two entries have the same role and ID.
    #[error("client {client} ({role}) is configured twice")]
    Duplicate {
        /// The client.
        client: ClientId,
        /// Its role.
        role: Role,
    },
}

/// Configured clients, looked up by (role, ID).
#[derive(Debug, Clone, Default)]
pub struct ClientRegistry {
    entries: HashMap<(Role, ClientId), ClientEntry>,
}

impl ClientRegistry {
    /// Builds a registry, validating keys and topic filters.
    pub fn new(clients: Vec<ClientEntry>) -> Result<Self, RegistryError> {
        let mut entries = HashMap::new();
        for c in clients {
            if let Err(source) = nkeys::KeyPair::from_public_key(&c.public_key) {
                return Err(RegistryError::PublicKey {
                    client: c.id,
                    source,
                });
            }
            for t in &c.topics {
                validate_topic_filter(t).map_err(|source| RegistryError::TopicFilter {
                    client: c.id.clone(),
                    source,
                })?;
            }
            if entries.insert((c.role, c.id.clone()), c.clone()).is_some() {
                return Err(RegistryError::Duplicate {
                    client: c.id,
                    role: c.role,
                });
            }
        }
        Ok(ClientRegistry { entries })
    }

    /// Loads and validates a clients file.
    pub fn load(path: &Path) -> Result<Self, ClientsError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ClientsError::Read {
            path: p.clone(),
            source,
        })?;
        let file: ClientsFile =
            serde_json::from_str(&text).map_err(|source| ClientsError::Parse {
                path: p.clone(),
                source,
            })?;
        Self::new(file.clients).map_err(|source| ClientsError::Invalid { path: p, source })
    }

    /// The client with this role and ID.
    pub fn get(&self, role: Role, id: &ClientId) -> Option<&ClientEntry> {
        self.entries.get(&(role, id.clone()))
    }

    /// Number of configured clients.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no client is configured.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Whether a producer with `allowed` filters may upload to `topic`.
pub(crate) fn may_publish(allowed: &[String], topic: &str) -> bool {
    allowed.iter().any(|f| topic_matches(f, topic))
}

/// Whether a consumer with `allowed` filters may subscribe with `filter`: every topic the
/// filter matches must be matched by one allowed filter.
pub(crate) fn may_subscribe(allowed: &[String], filter: &str) -> bool {
    allowed.iter().any(|a| filter_within(filter, a))
}

fn filter_within(filter: &str, allowed: &str) -> bool {
    let f: Vec<&str> = filter.split('.').collect();
    let a: Vec<&str> = allowed.split('.').collect();
    for (i, at) in a.iter().enumerate() {
        if *at == ">" {
            return i < f.len();
        }
        match f.get(i) {
            None => return false,
            Some(&">") => return false,
            Some(&"*") if *at != "*" => return false,
            Some(ft) if *at != "*" && ft != at => return false,
            _ => {}
        }
    }
    f.len() == a.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscription_filters_must_lie_within_permissions() {
        let allowed = vec!["orders.>".to_owned()];
        assert!(may_subscribe(&allowed, "orders.*"));
        assert!(may_subscribe(&allowed, "orders.eu"));
        assert!(may_subscribe(&allowed, "orders.>"));
        assert!(!may_subscribe(&allowed, ">"));
        assert!(!may_subscribe(&allowed, "payments.*"));
        assert!(!may_subscribe(&allowed, "orders"));
        let star = vec!["orders.*".to_owned()];
        assert!(may_subscribe(&star, "orders.eu"));
        assert!(may_subscribe(&star, "orders.*"));
        assert!(!may_subscribe(&star, "orders.>"));
        assert!(!may_subscribe(&star, "orders.eu.x"));
        assert!(may_subscribe(&[">".to_owned()], "anything.>"));
    }

    #[test]
    fn producers_publish_where_a_filter_matches() {
        let allowed = vec!["orders.>".to_owned(), "audit".to_owned()];
        assert!(may_publish(&allowed, "orders.eu"));
        assert!(may_publish(&allowed, "audit"));
        assert!(!may_publish(&allowed, "payments"));
    }

    #[test]
    fn a_refused_registry_says_which_client_and_keeps_the_cause() {
        let key = nkeys::KeyPair::new_user().public_key();
        let entry = |id: &str, key: &str, topics: &[&str]| ClientEntry {
            id: ClientId::new(id).unwrap(),
            role: Role::Producer,
            public_key: key.to_owned(),
            topics: topics.iter().map(|t| (*t).to_owned()).collect(),
            service_name: None,
        };
        let e = ClientRegistry::new(vec![entry("shop", "not-a-key", &[">"])]).unwrap_err();
        assert!(matches!(e, RegistryError::PublicKey { .. }), "{e:?}");
        assert_eq!(e.to_string(), "client shop: invalid nkey public key");
        assert!(std::error::Error::source(&e).is_some());
        let e = ClientRegistry::new(vec![entry("shop", &key, &["orders..eu"])]).unwrap_err();
        assert!(matches!(e, RegistryError::TopicFilter { .. }), "{e:?}");
        let cause = std::error::Error::source(&e)
            .expect("the filter's error")
            .to_string();
        assert!(cause.contains("orders..eu"), "{cause}");
        let e = ClientRegistry::new(vec![entry("shop", &key, &[">"]), entry("shop", &key, &[])])
            .unwrap_err();
        assert_eq!(e.to_string(), "client shop (producer) is configured twice");
        assert_eq!(
            ClientRegistry::new(vec![entry("shop", &key, &[">"])])
                .unwrap()
                .len(),
            1
        );
    }
}
