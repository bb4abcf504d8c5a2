//! Upgrading a store written by an earlier version: each step moves the old tables into the
//! next form in one transaction and drops them; a row that does not parse fails the open
//! naming it and leaves the old tables as they were.
//!
//! 1. [`migrate_v1`]: the first version's JSON rows (one per record, `records`; JSON
//!    `summaries`) become compact values per message, under text keys.
//! 2. [`migrate_v2`]: text keys become the stored binary form ([`super::key::StoredKey`]),
//!    states in the state index their codes, message IDs of `request_messages` numbers, and
//!    summaries their current form; the byte count is redone from the records.

use super::key::StoredKey;
use super::records;
use super::requests::RequestEntry;
use super::tables::{
    BY_STATE, BY_TIME, BY_TOPIC, COUNTERS, COUNTER_BYTES, RECORDS, REQUESTS, SUMMARIES,
};
use crate::error::StoreError;
use crate::summary::{state_code, MessageSummary};
use msgtrail_core::trajectory::MessageState;
use msgtrail_core::{MessageId, StageRecord};
use redb::{Database, ReadableTable, TableDefinition, TableHandle, WriteTransaction};
use std::collections::BTreeMap;

/// The records table of the first version: one JSON row per record, keyed by (message key,
/// dedup key). [`super::Store::open`] moves what it finds there into the compact table.
pub(super) const RECORDS_V1: TableDefinition<'static, (&str, &str), &str> =
    TableDefinition::new("records");
/// The summaries table of the first version (JSON), moved into the compact table on open.
pub(super) const SUMMARIES_V1: TableDefinition<'static, &str, &str> =
    TableDefinition::new("summaries");

/// The second version's tables: the current ones under text keys.
pub(super) const RECORDS_V2: TableDefinition<'static, &str, &[u8]> =
    TableDefinition::new("message_records");
pub(super) const SUMMARIES_V2: TableDefinition<'static, &str, &[u8]> =
    TableDefinition::new("message_summaries");
const REQUESTS_V2: TableDefinition<'static, (&str, &str), &str> = TableDefinition::new("requests");
const REQUEST_MESSAGES_V2: TableDefinition<'static, (&str, &str, &str), ()> =
    TableDefinition::new("request_messages");
const BY_TOPIC_V2: TableDefinition<'static, (&str, u64, &str), ()> =
    TableDefinition::new("by_topic");
const BY_STATE_V2: TableDefinition<'static, (&str, u64, &str), ()> =
    TableDefinition::new("by_state");
const BY_TIME_V2: TableDefinition<'static, (u64, &str), ()> = TableDefinition::new("by_time");

/// Moves the records of a store written by the first version (one JSON row per record, in
/// `records`) into the compact per-message form, in one transaction, and drops the old
/// table; the summaries, indexes and counters keep their form. Returns how many messages
/// moved (0 for a store that has nothing to move). A row that does not parse fails the
/// open with [`StoreError::Corrupt`] naming it, and the old table stays as it was.
pub(super) fn migrate_v1(db: &Database) -> Result<u64, StoreError> {
    let tx = db.begin_write()?;
    let tables: Vec<String> = tx.list_tables()?.map(|t| t.name().to_owned()).collect();
    if tables.iter().any(|t| t == SUMMARIES_V1.name()) {
        {
            let old = tx.open_table(SUMMARIES_V1)?;
            let mut new = tx.open_table(SUMMARIES_V2)?;
            for item in old.iter()? {
                let (k, v) = item?;
                let s = MessageSummary::decode(k.value(), v.value().as_bytes()).map_err(|e| {
                    StoreError::Corrupt(format!("first-version summary {}: {e}", k.value()))
                })?;
                new.insert(k.value(), s.encode().as_slice())?;
            }
        }
        tx.delete_table(SUMMARIES_V1)?;
    }
    if !tables.iter().any(|t| t == RECORDS_V1.name()) {
        tx.commit()?;
        return Ok(0);
    }
    let mut moved = 0u64;
    let mut bytes = 0u64;
    {
        let old = tx.open_table(RECORDS_V1)?;
        let mut records = tx.open_table(RECORDS_V2)?;
        let mut key: Option<String> = None;
        let mut recs: Vec<StageRecord> = Vec::new();
        let mut flush = |key: &str, recs: &mut Vec<StageRecord>| -> Result<(), StoreError> {
            let v = records::encode(recs);
            bytes += (key.len() + v.len()) as u64;
            records.insert(key, v.as_slice())?;
            recs.clear();
            moved += 1;
            Ok(())
        };
        for item in old.iter()? {
            let (k, v) = item?;
            let (mk, dk) = k.value();
            let rec: StageRecord = serde_json::from_str(v.value())
                .map_err(|e| StoreError::Corrupt(format!("first-version record {mk}/{dk}: {e}")))?;
            if key.as_deref() != Some(mk) {
                if let Some(prev) = key.take() {
                    flush(&prev, &mut recs)?;
                }
                key = Some(mk.to_owned());
            }
            recs.push(rec);
        }
        if let Some(prev) = key {
            flush(&prev, &mut recs)?;
        }
        let mut counters = tx.open_table(COUNTERS)?;
        counters.insert(COUNTER_BYTES, bytes)?;
    }
    tx.delete_table(RECORDS_V1)?;
    tx.commit()?;
    Ok(moved)
}

fn bad_key(table: &str, key: &str) -> StoreError {
    StoreError::Corrupt(format!(
        "second-version {table} row {key:?}: not a message key"
    ))
}

fn stored_v2(table: &str, key: &str) -> Result<StoredKey, StoreError> {
    StoredKey::parse(key).map_err(|_| bad_key(table, key))
}

/// Moves a store written by the second version (text keys) into the binary-keyed tables,
/// in one transaction, and drops the old tables. Returns how many messages moved.
pub(super) fn migrate_v2(db: &Database) -> Result<u64, StoreError> {
    let tx = db.begin_write()?;
    let names: Vec<String> = tx.list_tables()?.map(|t| t.name().to_owned()).collect();
    let has = |d: &str| names.iter().any(|n| n == d);
    if !has(RECORDS_V2.name()) && !has(SUMMARIES_V2.name()) && !has(BY_TIME_V2.name()) {
        tx.abort()?;
        return Ok(0);
    }
    let moved = move_messages_v2(&tx)?;
    move_requests_v2(&tx)?;
    move_indexes_v2(&tx)?;
    for name in [
        RECORDS_V2.name(),
        SUMMARIES_V2.name(),
        REQUESTS_V2.name(),
        REQUEST_MESSAGES_V2.name(),
        BY_TOPIC_V2.name(),
        BY_STATE_V2.name(),
        BY_TIME_V2.name(),
    ] {
        tx.delete_table(TableDefinition::<&str, &[u8]>::new(name))?;
    }
    tx.commit()?;
    Ok(moved)
}

/// Records and summaries; the byte count redone from the records as stored now.
fn move_messages_v2(tx: &WriteTransaction) -> Result<u64, StoreError> {
    let (mut moved, mut bytes) = (0u64, 0u64);
    {
        let old = tx.open_table(RECORDS_V2)?;
        let mut new = tx.open_table(RECORDS)?;
        for item in old.iter()? {
            let (k, v) = item?;
            let key = stored_v2("records", k.value())?;
            bytes += (key.as_bytes().len() + v.value().len()) as u64;
            new.insert(key.as_bytes(), v.value())?;
            moved += 1;
        }
    }
    {
        let old = tx.open_table(SUMMARIES_V2)?;
        let mut new = tx.open_table(SUMMARIES)?;
        for item in old.iter()? {
            let (k, v) = item?;
            let key = stored_v2("summaries", k.value())?;
            let s = MessageSummary::decode(k.value(), v.value()).map_err(|e| {
                StoreError::Corrupt(format!("second-version summary {}: {e}", k.value()))
            })?;
            new.insert(key.as_bytes(), s.encode().as_slice())?;
        }
    }
    tx.open_table(COUNTERS)?.insert(COUNTER_BYTES, bytes)?;
    Ok(moved)
}

/// The link (`requests`) and the messages (`request_messages`) of each request ID become
/// its one row; a link to a message not in the set (a store older than the set) joins it.
fn move_requests_v2(tx: &WriteTransaction) -> Result<(), StoreError> {
    let mut rows: BTreeMap<(String, String), RequestEntry> = BTreeMap::new();
    {
        let old = tx.open_table(REQUESTS_V2)?;
        for item in old.iter()? {
            let (k, v) = item?;
            let (q, p) = k.value();
            stored_v2("requests", v.value())?;
            let row = rows.entry((q.to_owned(), p.to_owned())).or_default();
            row.link = Some(v.value().to_owned());
        }
    }
    {
        let old = tx.open_table(REQUEST_MESSAGES_V2)?;
        for item in old.iter()? {
            let (k, _) = item?;
            let (q, p, m) = k.value();
            let m = m
                .parse::<MessageId>()
                .map_err(|_| bad_key("request_messages", m))?;
            let row = rows.entry((q.to_owned(), p.to_owned())).or_default();
            row.messages.insert(m);
        }
    }
    let mut new = tx.open_table(REQUESTS)?;
    for ((q, p), mut row) in rows {
        if row.messages.is_empty() {
            if let Some(Ok(m)) = row.link.as_ref().map(|l| l.parse::<MessageId>()) {
                row.messages.insert(m);
            }
        }
        new.insert((q.as_str(), p.as_str()), row.encode()?.as_slice())?;
    }
    Ok(())
}

fn move_indexes_v2(tx: &WriteTransaction) -> Result<(), StoreError> {
    {
        let old = tx.open_table(BY_TOPIC_V2)?;
        let mut new = tx.open_table(BY_TOPIC)?;
        for item in old.iter()? {
            let (k, _) = item?;
            let (topic, at, key) = k.value();
            new.insert((topic, at, stored_v2("by_topic", key)?.as_bytes()), ())?;
        }
    }
    {
        let old = tx.open_table(BY_STATE_V2)?;
        let mut new = tx.open_table(BY_STATE)?;
        for item in old.iter()? {
            let (k, _) = item?;
            let (state, at, key) = k.value();
            let st = state
                .parse::<MessageState>()
                .map_err(|_| StoreError::Corrupt(format!("second-version state {state:?}")))?;
            let key = stored_v2("by_state", key)?;
            new.insert((state_code(st), at, key.as_bytes()), ())?;
        }
    }
    let old = tx.open_table(BY_TIME_V2)?;
    let mut new = tx.open_table(BY_TIME)?;
    for item in old.iter()? {
        let (k, _) = item?;
        let (at, key) = k.value();
        new.insert((at, stored_v2("by_time", key)?.as_bytes()), ())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{SearchQuery, Store};
    use msgtrail_core::trajectory::Deadlines;
    use msgtrail_core::{ClientId, RequestId, Stage};
    use redb::ReadableDatabase;

    fn records_of_one_message() -> Vec<StageRecord> {
        let m = MessageId::new();
        let t0 = msgtrail_core::time::now_nanos();
        let mut out = Vec::new();
        for (i, stage) in [Stage::UploadSent, Stage::UploadReceived, Stage::Stored]
            .into_iter()
            .enumerate()
        {
            let mut r = StageRecord::at(stage, t0 + i as u64 * 1_000);
            r.request_id = Some(RequestId::new("order-1").unwrap());
            r.producer = Some(ClientId::new("shop").unwrap());
            r.topic = Some("orders".into());
            r.message_id = (stage != Stage::UploadSent).then_some(m);
            out.push(r);
        }
        out
    }

    /// A store written by the first version (JSON rows in `records`) opens with its
    /// trajectories intact, the old table gone and the byte count redone.
    #[test]
    fn a_first_version_store_is_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let recs = records_of_one_message();
        let m = recs[1].message_id.unwrap();
        // Write the store the way the first version did: the summaries through `apply`,
        // then the records moved back into JSON rows.
        let store = Store::open(dir.path(), 0, Deadlines::default()).unwrap();
        store.apply(recs.clone(), recs[2].at).unwrap();
        let want = store
            .trajectory(&m.to_string(), recs[2].at)
            .unwrap()
            .unwrap();
        drop(store);
        {
            let db = Database::create(dir.path().join("listener.redb")).unwrap();
            let tx = db.begin_write().unwrap();
            {
                let mut v1 = tx.open_table(RECORDS_V1).unwrap();
                for r in &recs {
                    v1.insert(
                        (m.to_string().as_str(), r.dedup_key().as_str()),
                        r.to_json().as_str(),
                    )
                    .unwrap();
                }
            }
            tx.delete_table(RECORDS).unwrap();
            let summary = {
                let t = tx.open_table(SUMMARIES).unwrap();
                let v = t.get(StoredKey::of_message(m).as_bytes()).unwrap().unwrap();
                MessageSummary::decode(&m.to_string(), v.value()).unwrap()
            };
            tx.delete_table(SUMMARIES).unwrap();
            let json = serde_json::to_string(&summary).unwrap();
            tx.open_table(SUMMARIES_V1)
                .unwrap()
                .insert(m.to_string().as_str(), json.as_str())
                .unwrap();
            tx.commit().unwrap();
        }
        let store = Store::open(dir.path(), 0, Deadlines::default()).unwrap();
        let got = store
            .trajectory(&m.to_string(), recs[2].at)
            .unwrap()
            .unwrap();
        assert_eq!(got, want);
        let found = store.search(&SearchQuery::default()).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].message_id, Some(m));
        assert_eq!(found[0].records, 3);
        assert!(store.counters().unwrap()[COUNTER_BYTES] > 0);
        // Applying the same records again finds them all already stored.
        let again = store.apply(recs, want.last_at).unwrap();
        assert_eq!((again.new_records, again.repeated_records), (0, 3));
        drop(store);
        let db = Database::create(dir.path().join("listener.redb")).unwrap();
        let tx = db.begin_read().unwrap();
        let names: Vec<String> = tx
            .list_tables()
            .unwrap()
            .map(|t| t.name().to_owned())
            .collect();
        assert!(
            !names.iter().any(|t| t == "records" || t == "summaries"),
            "{names:?}"
        );
    }

    /// Rewrites the current tables in the second version's form (text keys, states by name,
    /// message IDs as text) and drops them: what a second-version listener left behind.
    fn rewrite_as_second_version(dir: &std::path::Path) {
        let db = Database::create(dir.join("listener.redb")).unwrap();
        let tx = db.begin_write().unwrap();
        let text = |b: &[u8]| StoredKey::text(b).unwrap();
        {
            let (old, mut new) = (
                tx.open_table(RECORDS).unwrap(),
                tx.open_table(RECORDS_V2).unwrap(),
            );
            for item in old.iter().unwrap() {
                let (k, v) = item.unwrap();
                new.insert(text(k.value()).as_str(), v.value()).unwrap();
            }
            let (old, mut new) = (
                tx.open_table(SUMMARIES).unwrap(),
                tx.open_table(SUMMARIES_V2).unwrap(),
            );
            for item in old.iter().unwrap() {
                let (k, v) = item.unwrap();
                new.insert(text(k.value()).as_str(), v.value()).unwrap();
            }
            let old = tx.open_table(REQUESTS).unwrap();
            let mut links = tx.open_table(REQUESTS_V2).unwrap();
            let mut sets = tx.open_table(REQUEST_MESSAGES_V2).unwrap();
            for item in old.iter().unwrap() {
                let (k, v) = item.unwrap();
                let (q, p) = k.value();
                let row = RequestEntry::decode(v.value()).unwrap();
                if let Some(link) = &row.link {
                    links.insert((q, p), link.as_str()).unwrap();
                }
                for m in &row.messages {
                    sets.insert((q, p, m.to_string().as_str()), ()).unwrap();
                }
            }
            let (old, mut new) = (
                tx.open_table(BY_TOPIC).unwrap(),
                tx.open_table(BY_TOPIC_V2).unwrap(),
            );
            for item in old.iter().unwrap() {
                let (k, _) = item.unwrap();
                let (topic, at, k) = k.value();
                new.insert((topic, at, text(k).as_str()), ()).unwrap();
            }
            let (old, mut new) = (
                tx.open_table(BY_STATE).unwrap(),
                tx.open_table(BY_STATE_V2).unwrap(),
            );
            for item in old.iter().unwrap() {
                let (k, _) = item.unwrap();
                let (code, at, k) = k.value();
                let st = MessageState::ALL
                    .iter()
                    .find(|s| state_code(**s) == code)
                    .unwrap();
                new.insert((st.as_str(), at, text(k).as_str()), ()).unwrap();
            }
            let (old, mut new) = (
                tx.open_table(BY_TIME).unwrap(),
                tx.open_table(BY_TIME_V2).unwrap(),
            );
            for item in old.iter().unwrap() {
                let (k, _) = item.unwrap();
                let (at, k) = k.value();
                new.insert((at, text(k).as_str()), ()).unwrap();
            }
        }
        tx.delete_table(RECORDS).unwrap();
        tx.delete_table(SUMMARIES).unwrap();
        tx.delete_table(REQUESTS).unwrap();
        tx.delete_table(BY_TOPIC).unwrap();
        tx.delete_table(BY_STATE).unwrap();
        tx.delete_table(BY_TIME).unwrap();
        tx.commit().unwrap();
    }

    /// A store written by the second version (text keys) opens with its trajectories,
    /// searches, request links and counters as they were, and the old tables gone.
    #[test]
    fn a_second_version_store_is_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let mut recs = records_of_one_message();
        let m = recs[1].message_id.unwrap();
        // An upload the broker never answered: stored under an orphan key.
        let mut orphan = recs[0].clone();
        orphan.request_id = Some(RequestId::new("order-2").unwrap());
        recs.push(orphan);
        let now = recs[2].at;
        let store = Store::open(dir.path(), 0, Deadlines::default()).unwrap();
        store.apply(recs.clone(), now).unwrap();
        let want_m = store.lookup(&m.to_string(), None, now).unwrap();
        let want_o = store.lookup("order-2", Some("shop"), now).unwrap();
        let want_found = store.search(&SearchQuery::default()).unwrap();
        let want_counters = store.counters().unwrap();
        assert_eq!(want_found.len(), 2);
        drop(store);
        rewrite_as_second_version(dir.path());

        let store = Store::open(dir.path(), 0, Deadlines::default()).unwrap();
        assert_eq!(store.lookup(&m.to_string(), None, now).unwrap(), want_m);
        assert_eq!(store.lookup("order-1", None, now).unwrap(), want_m);
        assert_eq!(store.lookup("order-2", Some("shop"), now).unwrap(), want_o);
        assert_eq!(store.search(&SearchQuery::default()).unwrap(), want_found);
        assert_eq!(store.counters().unwrap(), want_counters);
        let by_state = SearchQuery {
            state: Some(want_found[0].state),
            ..SearchQuery::default()
        };
        assert!(!store.search(&by_state).unwrap().is_empty());
        let again = store.apply(recs, now).unwrap();
        assert_eq!((again.new_records, again.repeated_records), (0, 4));
        drop(store);
        let db = Database::create(dir.path().join("listener.redb")).unwrap();
        let tx = db.begin_read().unwrap();
        let names: Vec<String> = tx
            .list_tables()
            .unwrap()
            .map(|t| t.name().to_owned())
            .collect();
        for old in [
            "message_records",
            "message_summaries",
            "requests",
            "by_state",
            "by_time",
        ] {
            assert!(!names.iter().any(|t| t == old), "{old} in {names:?}");
        }
    }

    /// A second-version row whose key is no message key fails the open, naming it.
    #[test]
    fn a_corrupt_second_version_key_fails_the_open() {
        let dir = tempfile::tempdir().unwrap();
        drop(Store::open(dir.path(), 0, Deadlines::default()).unwrap());
        {
            let db = Database::create(dir.path().join("listener.redb")).unwrap();
            let tx = db.begin_write().unwrap();
            tx.open_table(RECORDS_V2)
                .unwrap()
                .insert("not-a-key", &b"x"[..])
                .unwrap();
            tx.commit().unwrap();
        }
        let err = Store::open(dir.path(), 0, Deadlines::default()).unwrap_err();
        assert!(err.to_string().contains("\"not-a-key\""), "{err}");
    }

    /// A first-version row that does not parse fails the open, naming the row, and leaves
    /// the old table for the operator.
    #[test]
    fn a_corrupt_first_version_row_fails_the_open() {
        let dir = tempfile::tempdir().unwrap();
        drop(Store::open(dir.path(), 0, Deadlines::default()).unwrap());
        {
            let db = Database::create(dir.path().join("listener.redb")).unwrap();
            let tx = db.begin_write().unwrap();
            tx.open_table(RECORDS_V1)
                .unwrap()
                .insert(("m", "k"), "{not json")
                .unwrap();
            tx.commit().unwrap();
        }
        let err = Store::open(dir.path(), 0, Deadlines::default()).unwrap_err();
        assert!(
            err.to_string().contains("first-version record m/k"),
            "{err}"
        );
    }
}
