//! Upgrading a store written by an earlier version: each step moves the old tables into the
//! current form in one transaction and drops them; a row that does not parse fails the open
//! naming it and leaves the old tables as they were.

use super::records;
use super::tables::{COUNTERS, COUNTER_BYTES, RECORDS, SUMMARIES};
use crate::error::StoreError;
use crate::summary::MessageSummary;
use msgtrail_core::StageRecord;
use redb::{Database, ReadableTable, TableDefinition, TableHandle};

/// The records table of the first version: one JSON row per record, keyed by (message key,
/// dedup key). [`super::Store::open`] moves what it finds there into the compact table.
pub(super) const RECORDS_V1: TableDefinition<(&str, &str), &str> = TableDefinition::new("records");
/// The summaries table of the first version (JSON), moved into the compact table on open.
pub(super) const SUMMARIES_V1: TableDefinition<&str, &str> = TableDefinition::new("summaries");

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
            let mut new = tx.open_table(SUMMARIES)?;
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
        let mut records = tx.open_table(RECORDS)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{SearchQuery, Store};
    use msgtrail_core::trajectory::Deadlines;
    use msgtrail_core::MessageId;
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
                let key = m.to_string();
                let v = t.get(key.as_str()).unwrap().unwrap();
                MessageSummary::decode(&key, v.value()).unwrap()
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
