//! The key a message's records and summary are stored under: its message ID, or — for an
//! upload the broker has not (yet) answered — its producer and request ID. Stored as text
//! (`<message-id>` or `orphan/<producer>/<request-id>`: neither a client ID nor a message ID
//! contains `/`, so the two forms cannot be confused).

use msgtrail_core::MessageId;
use std::fmt;
use std::str::FromStr;

/// Prefix of an orphan upload's key.
const ORPHAN_PREFIX: &str = "orphan/";

/// A message key, typed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MessageKey {
    /// A message the broker assigned an ID.
    Message(MessageId),
    /// An upload known only by its producer and request ID.
    Orphan {
        /// The producer.
        producer: String,
        /// The producer's request ID.
        request_id: String,
    },
}

impl MessageKey {
    /// The key of an orphan upload.
    pub fn orphan(producer: &str, request_id: &str) -> Self {
        MessageKey::Orphan {
            producer: producer.to_owned(),
            request_id: request_id.to_owned(),
        }
    }

    /// Whether `key` (as stored) names an orphan upload.
    pub fn is_orphan(key: &str) -> bool {
        key.starts_with(ORPHAN_PREFIX)
    }
}

impl fmt::Display for MessageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MessageKey::Message(m) => m.fmt(f),
            MessageKey::Orphan {
                producer,
                request_id,
            } => write!(f, "{ORPHAN_PREFIX}{producer}/{request_id}"),
        }
    }
}

/// Why a stored key did not parse.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is neither a message ID nor orphan/<producer>/<request-id>")]
pub struct KeyError(String);

impl FromStr for MessageKey {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Self, KeyError> {
        if let Some(rest) = s.strip_prefix(ORPHAN_PREFIX) {
            return match rest.split_once('/') {
                Some((p, q)) if !p.is_empty() && !q.is_empty() => Ok(MessageKey::orphan(p, q)),
                _ => Err(KeyError(s.to_owned())),
            };
        }
        s.parse::<MessageId>()
            .map(MessageKey::Message)
            .map_err(|_| KeyError(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_round_trip() {
        let m = MessageKey::Message(MessageId::new());
        assert_eq!(m.to_string().parse::<MessageKey>().unwrap(), m);
        let o = MessageKey::orphan("shop", "order-1");
        assert_eq!(o.to_string(), "orphan/shop/order-1");
        assert_eq!("orphan/shop/order-1".parse::<MessageKey>().unwrap(), o);
        assert!(MessageKey::is_orphan("orphan/shop/order-1"));
        assert!(!MessageKey::is_orphan(&m.to_string()));
        for bad in ["orphan/", "orphan/shop", "orphan//x", "not-a-key", ""] {
            assert!(bad.parse::<MessageKey>().is_err(), "{bad}");
        }
    }
}
