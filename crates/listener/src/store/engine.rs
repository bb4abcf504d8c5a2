//! The open fjall database and its keyspaces ([`Engine`]), one directory `listener.fjall`
//! in the data directory.
//!
//! | keyspace | key ([`super::tables::keys`]) | value |
//! | --- | --- | --- |
//! | `records` | stored message key · chunk number (u32) | the records one batch added to the message, compact ([`super::records`]) |
//! | `summaries` | stored message key | [`crate::summary::MessageSummary`], compact |
//! | `requests` | request ID · producer | the key it is linked to and every message stored under it |
//! | `by_topic` | topic · first time · stored key | empty |
//! | `by_state` | state code · last time · stored key | empty |
//! | `by_time` | first time · stored key | empty |
//! | `counters` | name | u64, big-endian |
//! | `client_events` | client · time · fingerprint | the record as JSON |
//! | `client_event_counts` | client | u64, big-endian |

use crate::error::StoreError;
use fjall::{KeyspaceCreateOptions, SingleWriterTxDatabase, SingleWriterTxKeyspace};
use std::path::Path;

/// Every keyspace of the store.
pub(crate) struct Keyspaces {
    pub(super) records: SingleWriterTxKeyspace,
    pub(super) summaries: SingleWriterTxKeyspace,
    pub(super) requests: SingleWriterTxKeyspace,
    pub(super) by_topic: SingleWriterTxKeyspace,
    pub(super) by_state: SingleWriterTxKeyspace,
    pub(super) by_time: SingleWriterTxKeyspace,
    pub(super) counters: SingleWriterTxKeyspace,
    pub(super) events: SingleWriterTxKeyspace,
    pub(super) event_counts: SingleWriterTxKeyspace,
}

impl Keyspaces {
    /// Every keyspace with its name, in the store's order.
    pub(super) fn all(&self) -> [(&'static str, &SingleWriterTxKeyspace); 9] {
        [
            ("records", &self.records),
            ("summaries", &self.summaries),
            ("requests", &self.requests),
            ("by_topic", &self.by_topic),
            ("by_state", &self.by_state),
            ("by_time", &self.by_time),
            ("counters", &self.counters),
            ("client_events", &self.events),
            ("client_event_counts", &self.event_counts),
        ]
    }
}

/// The open database.
pub(crate) struct Engine {
    pub(super) db: SingleWriterTxDatabase,
    pub(super) ks: Keyspaces,
}

impl Engine {
    /// Opens (or creates) the database in `dir`, its block cache bounded to `cache_bytes`.
    pub(super) fn open(dir: &Path, cache_bytes: usize) -> Result<Engine, StoreError> {
        let db = SingleWriterTxDatabase::builder(dir)
            .cache_size(cache_bytes as u64)
            .open()?;
        let ks = |name: &str| db.keyspace(name, KeyspaceCreateOptions::default);
        let ks = Keyspaces {
            records: ks("records")?,
            summaries: ks("summaries")?,
            requests: ks("requests")?,
            by_topic: ks("by_topic")?,
            by_state: ks("by_state")?,
            by_time: ks("by_time")?,
            counters: ks("counters")?,
            events: ks("client_events")?,
            event_counts: ks("client_event_counts")?,
        };
        Ok(Engine { db, ks })
    }
}
