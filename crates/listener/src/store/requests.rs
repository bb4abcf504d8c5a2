//! What the store keeps per (request ID, producer), in one row: the message key the request
//! ID is linked to (a message, or an orphan upload not answered yet) and every message
//! stored under it (more than one when the producer uploaded it again after the broker's
//! dedup window).
//!
//! ```text
//! value = link:u8 (0 none · 1 the first message · 2 a key follows) · [len:varint · stored key]
//!         · count:varint · message id:16*  (ascending: upload order)
//! ```
//! The usual row — one message, linked — is 18 bytes.

use super::key::StoredKey;
use crate::error::StoreError;
use msgtrail_core::codec::{Reader, Writer};
use msgtrail_core::MessageId;
use std::collections::BTreeSet;

const LINK_NONE: u8 = 0;
const LINK_FIRST: u8 = 1;
const LINK_KEY: u8 = 2;

/// One request ID's row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct RequestEntry {
    /// The message key (text form) the request ID is linked to.
    pub(super) link: Option<String>,
    /// The messages stored under it, in upload order (message IDs are UUIDv7).
    pub(super) messages: BTreeSet<MessageId>,
}

impl RequestEntry {
    /// Whether the row says nothing (and so is not kept).
    pub(super) fn is_empty(&self) -> bool {
        self.link.is_none() && self.messages.is_empty()
    }

    /// The stored form. The link is written as "the first message" when it is, which is
    /// decided anew at every write, so a message added before it never changes the link.
    pub(super) fn encode(&self) -> Result<Vec<u8>, StoreError> {
        let mut w = Writer::with_capacity(18);
        let first = self.messages.first().map(|m| m.to_string());
        match &self.link {
            None => w.u8(LINK_NONE),
            Some(l) if first.as_ref() == Some(l) => w.u8(LINK_FIRST),
            Some(l) => {
                let key = StoredKey::parse(l)
                    .map_err(|e| StoreError::corrupt(format!("request link {l:?}"), e))?;
                w.u8(LINK_KEY);
                w.varint(key.as_bytes().len() as u64);
                w.bytes(key.as_bytes());
            }
        }
        w.varint(self.messages.len() as u64);
        for m in &self.messages {
            w.bytes(m.as_bytes());
        }
        Ok(w.finish())
    }

    /// Reads what [`RequestEntry::encode`] wrote.
    pub(super) fn decode(bytes: &[u8]) -> Result<RequestEntry, StoreError> {
        let corrupt = |e: msgtrail_core::codec::CodecError| {
            StoreError::corrupt(format!("request row {bytes:02x?}"), e)
        };
        let mut r = Reader::new(bytes);
        let kind = r.u8().map_err(corrupt)?;
        let link = match kind {
            LINK_NONE | LINK_FIRST => None,
            LINK_KEY => {
                let n = r.count().map_err(corrupt)?;
                let key = r.take(n).map_err(corrupt)?;
                Some(
                    StoredKey::text(key)
                        .map_err(|e| StoreError::corrupt(format!("request row {bytes:02x?}"), e))?,
                )
            }
            other => {
                return Err(StoreError::bad_value(format!(
                    "request row {bytes:02x?} (link kind {other})"
                )))
            }
        };
        let n = r.count().map_err(corrupt)?;
        let mut messages = BTreeSet::new();
        for _ in 0..n {
            messages.insert(r.message_id().map_err(corrupt)?);
        }
        r.end().map_err(corrupt)?;
        let link = match (kind, messages.first()) {
            (LINK_FIRST, Some(m)) => Some(m.to_string()),
            (LINK_FIRST, None) => {
                return Err(StoreError::bad_value(format!(
                    "request row {bytes:02x?} (linked to the first of no messages)"
                )))
            }
            _ => link,
        };
        Ok(RequestEntry { link, messages })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    /// A row that fails to decode names itself in its text and keeps the codec error as its
    /// cause; a row that decodes but is wrong in itself has no cause.
    #[test]
    fn an_undecodable_row_keeps_the_codec_error_as_its_source() {
        let truncated = RequestEntry::decode(&[]).unwrap_err();
        assert_eq!(
            truncated.to_string(),
            "store holds an undecodable request row []"
        );
        let source = truncated.source().expect("the codec error is the source");
        assert!(
            source.is::<msgtrail_core::codec::CodecError>(),
            "{source:?}"
        );

        let bad_kind = RequestEntry::decode(&[9]).unwrap_err();
        assert_eq!(
            bad_kind.to_string(),
            "store holds an undecodable request row [09] (link kind 9)"
        );
        assert!(bad_kind.source().is_none());
    }

    #[test]
    fn rows_round_trip_and_the_usual_one_is_small() {
        let a = MessageId::new();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = MessageId::new();
        let usual = RequestEntry {
            link: Some(a.to_string()),
            messages: [a].into(),
        };
        assert_eq!(usual.encode().unwrap().len(), 18);
        let rows = [
            usual,
            RequestEntry {
                link: Some("orphan/shop/order-1".into()),
                messages: BTreeSet::new(),
            },
            // Linked to the later of two: stays linked to it, whatever is added before.
            RequestEntry {
                link: Some(b.to_string()),
                messages: [a, b].into(),
            },
            RequestEntry {
                link: None,
                messages: [a, b].into(),
            },
            RequestEntry::default(),
        ];
        for row in rows {
            let bytes = row.encode().unwrap();
            assert_eq!(RequestEntry::decode(&bytes).unwrap(), row);
            for n in 0..bytes.len() {
                assert!(RequestEntry::decode(&bytes[..n]).is_err(), "{row:?} at {n}");
            }
        }
        assert!(RequestEntry::decode(&[LINK_FIRST, 0]).is_err());
        assert!(RequestEntry::decode(&[7, 0]).is_err());
    }
}
