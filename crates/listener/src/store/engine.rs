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

use super::key::{message_id_of, MESSAGE_KEYS};
use crate::error::StoreError;
use fjall::Readable as _;
use fjall::{KeyspaceCreateOptions, SingleWriterTxDatabase, SingleWriterTxKeyspace};
use msgtrail_core::MessageId;
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
        let ks = [
            &self.records,
            &self.summaries,
            &self.requests,
            &self.by_topic,
            &self.by_state,
            &self.by_time,
            &self.counters,
            &self.events,
            &self.event_counts,
        ];
        let mut i = 0;
        ks.map(|k| {
            i += 1;
            (NAMES[i - 1], k)
        })
    }
}

/// The open database.
pub(crate) struct Engine {
    pub(super) db: SingleWriterTxDatabase,
    pub(super) ks: Keyspaces,
    /// Whether this open created a keyspace.
    created: bool,
}

/// Every keyspace's name.
const NAMES: [&str; 9] = [
    "records",
    "summaries",
    "requests",
    "by_topic",
    "by_state",
    "by_time",
    "counters",
    "client_events",
    "client_event_counts",
];

impl Engine {
    /// Opens (or creates) the database in `dir`, its block cache bounded to `cache_bytes`.
    pub(super) fn open(dir: &Path, cache_bytes: usize) -> Result<Engine, StoreError> {
        let engine = Engine::open_once(dir, cache_bytes)?;
        if !engine.created {
            return Ok(engine);
        }
        // Creating keyspaces writes fjall's own keyspace of keyspaces several times over and
        // leaves its superseded tables on disk until the next open deletes them. Opening
        // again at once deletes them now: otherwise a later reopen (after an I/O error, e.g.
        // on a full disk) would free that room and let writes through for a moment.
        drop(engine);
        Engine::open_once(dir, cache_bytes)
    }

    /// The newest message ID the store holds records or a summary of (message IDs sort by
    /// time, and so do their stored keys): a message ID newer than it is new to the store.
    pub(super) fn newest_message(&self) -> Result<Option<MessageId>, StoreError> {
        let tx = self.db.read_tx();
        let (from, to) = MESSAGE_KEYS;
        let mut newest = None;
        for ks in [&self.ks.records, &self.ks.summaries] {
            if let Some(item) = tx.range(ks, from..to).next_back() {
                let k = item.key()?;
                newest = newest.max(message_id_of(&k));
            }
        }
        Ok(newest)
    }

    fn open_once(dir: &Path, cache_bytes: usize) -> Result<Engine, StoreError> {
        let db = SingleWriterTxDatabase::builder(dir)
            .cache_size(cache_bytes as u64)
            .open()?;
        let created = NAMES.iter().any(|n| !db.keyspace_exists(n));
        let ks = |name: &str| db.keyspace(name, KeyspaceCreateOptions::default);
        let [records, summaries, requests, by_topic, by_state, by_time, counters, events, event_counts] =
            NAMES.map(ks);
        let ks = Keyspaces {
            records: records?,
            summaries: summaries?,
            requests: requests?,
            by_topic: by_topic?,
            by_state: by_state?,
            by_time: by_time?,
            counters: counters?,
            events: events?,
            event_counts: event_counts?,
        };
        Ok(Engine { db, ks, created })
    }
}

#[cfg(test)]
mod tests {
    use crate::store::Store;
    use msgtrail_core::trajectory::Deadlines;
    use msgtrail_core::{ClientId, MessageId, RequestId, Stage, StageRecord};

    fn id(n: u128) -> MessageId {
        MessageId::from_u128((1_800_000_000_000u128 << 80) | (0x7 << 76) | (2 << 62) | n).unwrap()
    }

    /// A store opened again knows the newest message ID it holds (an orphan key, stored
    /// after every message ID, is not one), so that a later record of an older message is
    /// read back rather than taken for a new message.
    #[test]
    fn the_newest_message_id_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let at = 1_800_000_000_000_000_000;
        let rec = |m: Option<MessageId>, stage: Stage, q: &str| {
            let mut r = StageRecord::at(stage, at);
            r.message_id = m;
            r.producer = Some(ClientId::new("p").unwrap());
            r.request_id = Some(RequestId::new(q).unwrap());
            r
        };
        {
            let store = Store::open(dir.path(), 0, Deadlines::default()).unwrap();
            assert_eq!(store.lock_cache().newest(), None);
            let batch = vec![
                rec(Some(id(2)), Stage::UploadReceived, "b"),
                rec(Some(id(1)), Stage::UploadReceived, "a"),
                rec(None, Stage::UploadSent, "orphan"),
            ];
            store.apply(batch, at).unwrap();
            assert_eq!(store.lock_cache().newest(), Some(id(2)));
        }
        let store = Store::open(dir.path(), 0, Deadlines::default()).unwrap();
        assert_eq!(store.lock_cache().newest(), Some(id(2)));
        let cache = store.lock_cache();
        assert!(!cache.is_new(id(1)) && !cache.is_new(id(2)) && cache.is_new(id(3)));
        drop(cache);
        // The older message, not cached after the reopen, is read back: its summary counts
        // both records.
        store
            .apply(vec![rec(Some(id(1)), Stage::Stored, "a")], at)
            .unwrap();
        let t = store.trajectory(&id(1).to_string(), at).unwrap().unwrap();
        assert_eq!(t.record_count, 2);
        let counters = store.counters().unwrap();
        assert_eq!(counters.get("stage.P2"), Some(&2));
    }
}
