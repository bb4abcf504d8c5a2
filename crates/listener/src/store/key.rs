//! The key a message's records and summary are stored under: its message ID, or — for an
//! upload the broker has not (yet) answered — its producer and request ID.
//!
//! Two forms: the text the API and the cache use (`<message-id>` or
//! `orphan/<producer>/<request-id>`: neither a client ID nor a message ID contains `/`, so the
//! two cannot be confused), and the binary form the tables use ([`StoredKey`]: a tag byte,
//! then the message ID's 16 bytes big-endian — so stored keys sort by time as the IDs do —
//! or the orphan's `<producer>/<request-id>`).

use msgtrail_core::partition::Partition;
use msgtrail_core::MessageId;
use std::fmt;
use std::str::FromStr;

/// Prefix of an orphan upload's key.
const ORPHAN_PREFIX: &str = "orphan/";

/// A message key, typed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum MessageKey {
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
    pub(crate) fn orphan(producer: &str, request_id: &str) -> Self {
        MessageKey::Orphan {
            producer: producer.to_owned(),
            request_id: request_id.to_owned(),
        }
    }

    /// The stage partition the key's records are in: its message ID's, or its request ID's
    /// (`msgtrail_core::partition`).
    pub(crate) fn partition(&self) -> Partition {
        match self {
            MessageKey::Message(m) => Partition::of_message(m),
            MessageKey::Orphan { request_id, .. } => Partition::of_bytes(request_id.as_bytes()),
        }
    }

    /// The stage partition of a key in its text form; `None` when it does not parse.
    pub(crate) fn partition_of(key: &str) -> Option<Partition> {
        key.parse::<MessageKey>().ok().map(|k| k.partition())
    }

    /// Whether `key` (as stored) names an orphan upload.
    pub(crate) fn is_orphan(key: &str) -> bool {
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

/// Tag byte of a stored message ID.
const TAG_MESSAGE: u8 = 1;
/// Tag byte of a stored orphan key.
const TAG_ORPHAN: u8 = 2;

/// A message key in the tables' binary form (see the module doc). A message ID's form
/// needs no allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StoredKey {
    /// The tag and the 16 bytes of a message ID.
    Message([u8; 17]),
    /// The tag and `<producer>/<request-id>`.
    Orphan(Vec<u8>),
}

impl StoredKey {
    /// The bytes a table holds.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            StoredKey::Message(b) => b,
            StoredKey::Orphan(b) => b,
        }
    }

    /// The stored form of a message ID.
    pub(crate) fn of_message(m: MessageId) -> StoredKey {
        let mut b = [TAG_MESSAGE; 17];
        b[1..].copy_from_slice(m.as_bytes());
        StoredKey::Message(b)
    }

    /// The stored form of a key in its text form.
    pub(crate) fn parse(text: &str) -> Result<StoredKey, KeyError> {
        // The common case first: a message ID.
        if let Ok(m) = text.parse::<MessageId>() {
            return Ok(StoredKey::of_message(m));
        }
        text.parse::<MessageKey>().map(|k| k.to_stored())
    }

    /// The text form of a stored key.
    pub(crate) fn text(bytes: &[u8]) -> Result<String, KeyError> {
        MessageKey::from_stored(bytes).map(|k| k.to_string())
    }
}

/// The first and last possible stored keys of a message ID (tag, then 16 bytes), and what
/// follows every key of theirs: the keys of message IDs, whatever follows them in a table's
/// key, lie from the first bound up to the last.
pub(crate) const MESSAGE_KEYS: ([u8; 1], [u8; 1]) = ([TAG_MESSAGE], [TAG_MESSAGE + 1]);

/// The message ID a table key starts with (a stored message key, then anything), if it
/// starts with one.
pub(crate) fn message_id_of(table_key: &[u8]) -> Option<MessageId> {
    let id = table_key.get(..17)?;
    match MessageKey::from_stored(id) {
        Ok(MessageKey::Message(m)) => Some(m),
        _ => None,
    }
}

impl MessageKey {
    /// The tables' binary form.
    pub(crate) fn to_stored(&self) -> StoredKey {
        match self {
            MessageKey::Message(m) => StoredKey::of_message(*m),
            MessageKey::Orphan {
                producer,
                request_id,
            } => {
                let mut b = Vec::with_capacity(2 + producer.len() + request_id.len());
                b.push(TAG_ORPHAN);
                b.extend_from_slice(producer.as_bytes());
                b.push(b'/');
                b.extend_from_slice(request_id.as_bytes());
                StoredKey::Orphan(b)
            }
        }
    }

    /// Reads the tables' binary form.
    pub(crate) fn from_stored(bytes: &[u8]) -> Result<MessageKey, KeyError> {
        let bad = || KeyError(format!("stored key {bytes:02x?}"));
        match bytes.split_first() {
            Some((&TAG_MESSAGE, id)) => {
                let raw: [u8; 16] = id.try_into().map_err(|_| bad())?;
                MessageId::from_u128(u128::from_be_bytes(raw))
                    .map(MessageKey::Message)
                    .map_err(|_| bad())
            }
            Some((&TAG_ORPHAN, rest)) => {
                let text = std::str::from_utf8(rest).map_err(|_| bad())?;
                match text.split_once('/') {
                    Some((p, q)) if !p.is_empty() && !q.is_empty() => Ok(MessageKey::orphan(p, q)),
                    _ => Err(bad()),
                }
            }
            _ => Err(bad()),
        }
    }
}

/// Why a stored key did not parse.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is neither a message ID nor orphan/<producer>/<request-id>")]
pub(crate) struct KeyError(String);

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
    fn stored_forms_round_trip_and_sort_by_time() {
        let a = MessageId::new();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = MessageId::new();
        for key in [
            MessageKey::Message(a),
            MessageKey::orphan("shop", "order-1"),
        ] {
            let stored = key.to_stored();
            assert_eq!(MessageKey::from_stored(stored.as_bytes()).unwrap(), key);
            assert_eq!(StoredKey::parse(&key.to_string()).unwrap(), stored);
            assert_eq!(StoredKey::text(stored.as_bytes()).unwrap(), key.to_string());
        }
        let (sa, sb) = (StoredKey::of_message(a), StoredKey::of_message(b));
        assert!(sa.as_bytes() < sb.as_bytes());
        assert_eq!(sa.as_bytes().len(), 17);
        for bad in [&b""[..], &[1, 2, 3], &[2, b'x'], &[9; 17]] {
            assert!(MessageKey::from_stored(bad).is_err(), "{bad:?}");
        }
        assert!(StoredKey::parse("nonsense").is_err());
    }

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
