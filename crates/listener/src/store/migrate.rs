//! Upgrading a store written by an earlier, redb-based version (`listener.redb`): first the
//! redb file is brought to the last redb form (each step moves the old tables into the next
//! form in one redb transaction and drops them), then [`from_redb`] copies that form into the
//! fjall keyspaces and renames the file `listener.redb.migrated`. A row that does not parse
//! fails the open naming it and leaves the old file as it was.
//!
//! 1. [`migrate_v1`]: the first version's JSON rows (one per record, `records`; JSON
//!    `summaries`) become compact values per message, under text keys.
//! 2. [`migrate_v2`]: text keys become the stored binary form ([`super::key::StoredKey`]),
//!    states in the state index their codes, message IDs of `request_messages` numbers, and
//!    summaries their current form; the byte count is redone from the records.
//! 3. [`from_redb`]: the third (last redb) version's tables become the fjall keyspaces: a
//!    message's records value becomes its chunk 0, each index row a key of its keyspace,
//!    the counters big-endian values; the byte count is redone from the chunks. It writes
//!    in transactions of [`MIGRATE_ROWS`] rows, logging its progress, and renames the file
//!    only once every row is on disk, so a crash part way runs it again on the next open
//!    (every write puts the same key and value again: nothing doubles).

use super::engine::Engine;
use super::key::StoredKey;
use super::records;
use super::requests::RequestEntry;
use super::tables::{keys, COUNTER_BYTES};
use crate::error::StoreError;
use crate::summary::{state_code, MessageSummary};
use fjall::{PersistMode, SingleWriterTxKeyspace, SingleWriterWriteTx};
use msgtrail_core::trajectory::MessageState;
use msgtrail_core::{MessageId, StageRecord};
use redb::{Database, ReadableTable, TableDefinition, TableHandle, WriteTransaction};
use std::collections::BTreeMap;
use std::path::Path;

// The third version's tables (the last redb form), as `from_redb` reads them.

/// Stored message key → the message's records, compact ([`records`]).
pub(super) const RECORDS: TableDefinition<'static, &[u8], &[u8]> =
    TableDefinition::new("records_v3");
/// Stored message key → its summary, compact ([`MessageSummary::encode`]).
pub(super) const SUMMARIES: TableDefinition<'static, &[u8], &[u8]> =
    TableDefinition::new("summaries_v3");
/// (request ID, producer) → the key it is linked to and every message stored under it.
pub(super) const REQUESTS: TableDefinition<'static, (&str, &str), &[u8]> =
    TableDefinition::new("requests_v3");
/// (topic, first time, stored key) → ().
pub(super) const BY_TOPIC: TableDefinition<'static, (&str, u64, &[u8]), ()> =
    TableDefinition::new("by_topic_v3");
/// (state code, last time, stored key) → ().
pub(super) const BY_STATE: TableDefinition<'static, (u8, u64, &[u8]), ()> =
    TableDefinition::new("by_state_v3");
/// (first time, stored key) → ().
pub(super) const BY_TIME: TableDefinition<'static, (u64, &[u8]), ()> =
    TableDefinition::new("by_time_v3");
/// Counter name → value.
pub(super) const COUNTERS: TableDefinition<'static, &str, u64> = TableDefinition::new("counters");
/// Client events by (client, time, fingerprint): the record as JSON.
pub(super) const EVENTS: TableDefinition<'static, (&str, u64, u64), &[u8]> =
    TableDefinition::new("client_events");
/// How many events each client has in [`EVENTS`].
pub(super) const EVENT_COUNTS: TableDefinition<'static, &str, u64> =
    TableDefinition::new("client_event_counts");

/// The redb file of the earlier versions, in the data directory.
pub(super) const REDB_FILE: &str = "listener.redb";
/// What the redb file is renamed once migrated.
pub(super) const REDB_MIGRATED: &str = "listener.redb.migrated";
/// Rows per fjall transaction while migrating.
const MIGRATE_ROWS: usize = 20_000;

/// Migrates `dir/listener.redb` (if there is one) into `engine`, then renames it
/// `listener.redb.migrated`. Returns how many messages moved (0 without a redb file).
pub(super) fn from_redb(dir: &Path, engine: &Engine) -> Result<u64, StoreError> {
    let path = dir.join(REDB_FILE);
    if !path.exists() {
        return Ok(0);
    }
    tracing::info!(path = %path.display(), "migrating a store written by an earlier (redb) version into fjall");
    let db = Database::create(&path).map_err(|e| StoreError::open(&path, e))?;
    // The earlier steps expect the third version's tables to exist.
    let tx = db.begin_write()?;
    for t in [RECORDS, SUMMARIES] {
        tx.open_table(t)?;
    }
    tx.open_table(REQUESTS)?;
    tx.open_table(BY_TOPIC)?;
    tx.open_table(BY_STATE)?;
    tx.open_table(BY_TIME)?;
    tx.open_table(COUNTERS)?;
    tx.open_table(EVENTS)?;
    tx.open_table(EVENT_COUNTS)?;
    tx.commit()?;
    let migrated = migrate_v1(&db)?;
    if migrated > 0 {
        tracing::info!(
            messages = migrated,
            "moved the records of a first-version store into the compact form"
        );
    }
    let rekeyed = migrate_v2(&db)?;
    if rekeyed > 0 {
        tracing::info!(
            messages = rekeyed,
            "moved a second-version store's tables to binary keys"
        );
    }
    let moved = copy_v3(&db, engine)?;
    drop(db);
    let to = dir.join(REDB_MIGRATED);
    std::fs::rename(&path, &to).map_err(|source| StoreError::MigratedRename {
        from: path.clone(),
        to: to.clone(),
        source,
    })?;
    tracing::info!(messages = moved, old = %to.display(), "store migrated into fjall; the redb file is kept aside");
    Ok(moved)
}

/// Writes rows into fjall in transactions of [`MIGRATE_ROWS`], each persisted.
struct Copier<'e> {
    engine: &'e Engine,
    tx: Option<SingleWriterWriteTx<'e>>,
    rows: usize,
    total: u64,
}

impl<'e> Copier<'e> {
    fn put(&mut self, ks: &SingleWriterTxKeyspace, k: Vec<u8>, v: &[u8]) -> Result<(), StoreError> {
        let engine = self.engine;
        let tx = self
            .tx
            .get_or_insert_with(|| engine.db.write_tx().durability(Some(PersistMode::SyncAll)));
        tx.insert(ks, k, v);
        self.rows += 1;
        self.total += 1;
        if self.rows >= MIGRATE_ROWS {
            self.commit()?;
            tracing::info!(rows = self.total, "migrating the redb store: rows copied");
        }
        Ok(())
    }

    fn commit(&mut self) -> Result<(), StoreError> {
        if let Some(tx) = self.tx.take() {
            tx.commit()?;
        }
        self.rows = 0;
        Ok(())
    }
}

/// Copies the third version's tables into the keyspaces; returns how many messages.
fn copy_v3(db: &Database, engine: &Engine) -> Result<u64, StoreError> {
    use redb::ReadableDatabase;
    let tx = db.begin_read()?;
    let ks = &engine.ks;
    let mut c = Copier {
        engine,
        tx: None,
        rows: 0,
        total: 0,
    };
    let (mut messages, mut bytes) = (0u64, 0u64);
    for item in tx.open_table(RECORDS)?.iter()? {
        let (k, v) = item?;
        let key = keys::record(k.value(), 0);
        bytes += (key.len() + v.value().len()) as u64;
        c.put(&ks.records, key, v.value())?;
        messages += 1;
    }
    for item in tx.open_table(SUMMARIES)?.iter()? {
        let (k, v) = item?;
        c.put(&ks.summaries, k.value().to_vec(), v.value())?;
    }
    for item in tx.open_table(REQUESTS)?.iter()? {
        let (k, v) = item?;
        let (q, p) = k.value();
        c.put(&ks.requests, keys::request(q, p), v.value())?;
    }
    for item in tx.open_table(BY_TOPIC)?.iter()? {
        let (k, _) = item?;
        let (topic, at, key) = k.value();
        c.put(&ks.by_topic, keys::by_topic(topic, at, key), &[])?;
    }
    for item in tx.open_table(BY_STATE)?.iter()? {
        let (k, _) = item?;
        let (code, at, key) = k.value();
        c.put(&ks.by_state, keys::by_state(code, at, key), &[])?;
    }
    for item in tx.open_table(BY_TIME)?.iter()? {
        let (k, _) = item?;
        let (at, key) = k.value();
        c.put(&ks.by_time, keys::by_time(at, key), &[])?;
    }
    for item in tx.open_table(COUNTERS)?.iter()? {
        let (k, v) = item?;
        if k.value() != COUNTER_BYTES {
            c.put(
                &ks.counters,
                k.value().as_bytes().to_vec(),
                &v.value().to_be_bytes(),
            )?;
        }
    }
    // The byte count of the records as fjall holds them (their keys gained a chunk number).
    c.put(
        &ks.counters,
        COUNTER_BYTES.as_bytes().to_vec(),
        &bytes.to_be_bytes(),
    )?;
    for item in tx.open_table(EVENTS)?.iter()? {
        let (k, v) = item?;
        let (client, at, fp) = k.value();
        c.put(&ks.events, keys::event(client, at, fp), v.value())?;
    }
    for item in tx.open_table(EVENT_COUNTS)?.iter()? {
        let (k, v) = item?;
        c.put(
            &ks.event_counts,
            k.value().as_bytes().to_vec(),
            &v.value().to_be_bytes(),
        )?;
    }
    c.commit()?;
    Ok(messages)
}

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
                    StoreError::corrupt(format!("first-version summary {}", k.value()), e)
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
                .map_err(|e| StoreError::corrupt(format!("first-version record {mk}/{dk}"), e))?;
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
    StoreError::bad_value(format!(
        "second-version {table} row {key:?} (not a message key)"
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
                StoreError::corrupt(format!("second-version summary {}", k.value()), e)
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
                .map_err(|_| StoreError::bad_value(format!("second-version state {state:?}")))?;
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
    use tempfile::TempDir;

    /// The counters but the byte count (fjall's record keys are 4 bytes longer than redb's).
    fn without_bytes(mut c: BTreeMap<String, u64>) -> BTreeMap<String, u64> {
        c.remove(COUNTER_BYTES);
        c
    }

    /// The fixtures' first time (2026-05-28 20:26:40 UTC, nanoseconds): every record they
    /// hold is at or after it, so they stay the same whenever the tests run.
    const T0: u64 = 1_780_000_000_000_000_000;

    /// A broker-assigned (UUIDv7) message ID of time `at` (nanoseconds) and number `n`.
    fn message_id(at: u64, n: u64) -> MessageId {
        let at_ms = at / 1_000_000;
        MessageId::from_u128((u128::from(at_ms) << 80) | (0x7 << 76) | (2 << 62) | u128::from(n))
            .unwrap()
    }

    /// Three records (P1, P2, P3) of request `order-1` from `shop`, topic `orders`, of one
    /// message, from [`T0`]: the first-version fixture's input.
    fn records_of_one_message() -> Vec<StageRecord> {
        let t0 = T0;
        let m = message_id(t0, 1);
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

    /// A temporary data directory holding the fixture `name` (`tests/fixtures`, see its
    /// README: a redb store an earlier version wrote) as its `listener.redb`.
    fn fixture(name: &str) -> TempDir {
        let dir = tempfile::tempdir().unwrap();
        let from = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        std::fs::copy(&from, dir.path().join(REDB_FILE)).unwrap();
        dir
    }

    /// The names of the tables of the redb file `path`.
    fn tables_of(path: &Path) -> Vec<String> {
        let db = Database::create(path).unwrap();
        let tx = db.begin_read().unwrap();
        tx.list_tables()
            .unwrap()
            .map(|t| t.name().to_owned())
            .collect()
    }

    /// A fresh fjall store fed `recs` in batches of `batch` at `now`: what a store migrated
    /// from a fixture written from the same records must answer.
    fn fed(recs: &[StageRecord], batch: usize, now: u64) -> (TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 0, Deadlines::default()).unwrap();
        for b in recs.chunks(batch) {
            store.apply(b.to_vec(), now).unwrap();
        }
        (dir, store)
    }

    /// A store written by the first version (JSON rows in `records`, JSON `summaries`:
    /// `store-v1.redb`, of [`records_of_one_message`]) opens with its trajectories intact,
    /// the old tables gone and the byte count redone.
    #[test]
    fn a_first_version_store_is_migrated() {
        let dir = fixture("store-v1.redb");
        let before = tables_of(&dir.path().join(REDB_FILE));
        assert!(
            before.iter().any(|t| t == "records") && before.iter().any(|t| t == "summaries"),
            "{before:?}"
        );
        let recs = records_of_one_message();
        let m = recs[1].message_id.unwrap();
        let (_fresh_dir, fresh) = fed(&recs, recs.len(), recs[2].at);
        let want = fresh
            .trajectory(&m.to_string(), recs[2].at)
            .unwrap()
            .unwrap();

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
        assert!(!dir.path().join(REDB_FILE).exists());
        let names = tables_of(&dir.path().join(REDB_MIGRATED));
        assert!(
            !names.iter().any(|t| t == "records" || t == "summaries"),
            "{names:?}"
        );
    }

    /// The second-version fixture's input: [`records_of_one_message`] and an upload of
    /// another request ID the broker never answered (stored under an orphan key).
    fn second_version_records() -> Vec<StageRecord> {
        let mut recs = records_of_one_message();
        let mut orphan = recs[0].clone();
        orphan.request_id = Some(RequestId::new("order-2").unwrap());
        recs.push(orphan);
        recs
    }

    /// A store written by the second version (text keys: `store-v2.redb`, of
    /// [`second_version_records`]) opens with its trajectories, searches, request links and
    /// counters as a store fed the same records has them, and the old tables gone.
    #[test]
    fn a_second_version_store_is_migrated() {
        let dir = fixture("store-v2.redb");
        let before = tables_of(&dir.path().join(REDB_FILE));
        assert!(before.iter().any(|t| t == "message_records"), "{before:?}");
        let recs = second_version_records();
        let m = recs[1].message_id.unwrap();
        let now = recs[2].at;
        let (_fresh_dir, fresh) = fed(&recs, recs.len(), now);
        let want_m = fresh.lookup(&m.to_string(), None, now).unwrap();
        let want_o = fresh.lookup("order-2", Some("shop"), now).unwrap();
        let want_found = fresh.search(&SearchQuery::default()).unwrap();
        let want_counters = fresh.counters().unwrap();
        assert_eq!(want_found.len(), 2);

        let store = Store::open(dir.path(), 0, Deadlines::default()).unwrap();
        assert_eq!(store.lookup(&m.to_string(), None, now).unwrap(), want_m);
        assert_eq!(store.lookup("order-1", None, now).unwrap(), want_m);
        assert_eq!(store.lookup("order-2", Some("shop"), now).unwrap(), want_o);
        assert_eq!(store.search(&SearchQuery::default()).unwrap(), want_found);
        assert_eq!(
            without_bytes(store.counters().unwrap()),
            without_bytes(want_counters)
        );
        let by_state = SearchQuery {
            state: Some(want_found[0].state),
            ..SearchQuery::default()
        };
        assert!(!store.search(&by_state).unwrap().is_empty());
        let again = store.apply(recs, now).unwrap();
        assert_eq!((again.new_records, again.repeated_records), (0, 4));
        drop(store);
        assert!(!dir.path().join(REDB_FILE).exists());
        let names = tables_of(&dir.path().join(REDB_MIGRATED));
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
        {
            let db = Database::create(dir.path().join(REDB_FILE)).unwrap();
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
        {
            let db = Database::create(dir.path().join(REDB_FILE)).unwrap();
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

    /// A mixed workload: answered and orphan uploads, deliveries that fail, redeliveries,
    /// dead letters, a producer's retry (D1), a request ID uploaded again after the dedup
    /// window (two messages), and client events.
    fn mixed_workload(t0: u64) -> Vec<StageRecord> {
        const MS: u64 = 1_000_000;
        let mut out = Vec::new();
        for i in 0..24u64 {
            let t = t0 + i * 10 * MS;
            let producer = ClientId::new(format!("p{}", i % 2)).unwrap();
            // Message 23 reuses message 3's request ID, far outside the dedup window.
            let req = if i == 23 { 3 } else { i };
            let request = RequestId::new(format!("r{req}")).unwrap();
            let upload = |stage: Stage, at: u64| {
                let mut r = StageRecord::at(stage, at);
                r.producer = Some(producer.clone());
                r.request_id = Some(request.clone());
                r.topic = Some(format!("t{}", i % 3));
                r
            };
            let mut p1 = upload(Stage::UploadSent, t);
            p1.attempt = Some(1);
            out.push(p1);
            if i % 5 == 4 {
                continue; // never answered: an orphan
            }
            let at_ms = (t + if i == 23 { 3_600_000 * MS } else { 0 }) / MS;
            let m = MessageId::from_u128(
                (u128::from(at_ms) << 80) | (0x7 << 76) | (2 << 62) | u128::from(i),
            )
            .unwrap();
            for (stage, dt) in [
                (Stage::UploadReceived, 1),
                (Stage::Stored, 2),
                (Stage::StoreConfirmed, 3),
            ] {
                let mut r = upload(stage, t + dt * 100_000);
                r.message_id = Some(m);
                r.attrs.insert("kind".into(), format!("k{}", i % 2));
                out.push(r);
            }
            if i % 4 == 1 {
                let mut d = upload(Stage::Duplicate, t + 400_000);
                d.message_id = Some(m);
                d.attempt = Some(2);
                out.push(d);
            }
            let attempts = (i % 3) as u32;
            for a in 1..=attempts {
                let at = t + u64::from(a) * MS;
                let fails = a < attempts || i % 7 == 0;
                let deliver = |stage: Stage, at: u64| {
                    let mut r = StageRecord::at(stage, at);
                    r.message_id = Some(m);
                    r.group = Some(msgtrail_core::GroupId::new("g").unwrap());
                    r.consumer = Some(ClientId::new("c").unwrap());
                    r.attempt = Some(a);
                    r
                };
                out.push(deliver(Stage::PullSent, at));
                out.push(deliver(Stage::PullReceived, at + 10_000));
                out.push(deliver(Stage::ProcessStarted, at + 20_000));
                let mut x2 = deliver(Stage::ProcessFinished, at + 30_000);
                x2.outcome = Some(if fails { "failed" } else { "ok" }.into());
                out.push(x2);
                let mut c8 = deliver(Stage::PullAckReceived, at + 40_000);
                c8.outcome = Some(if fails { "nack" } else { "ack" }.into());
                out.push(c8);
                if fails {
                    let mut r1 = deliver(Stage::Redelivery, at + 50_000);
                    let dead = a == attempts;
                    r1.outcome = Some(if dead { "dead_letter" } else { "redeliver" }.into());
                    out.push(r1);
                }
            }
        }
        for k in 0..3u64 {
            let mut a1 = StageRecord::at(Stage::Channel, t0 + k * MS);
            a1.producer = Some(ClientId::new(format!("p{k}")).unwrap());
            a1.outcome = Some("opened".into());
            out.push(a1);
        }
        out
    }

    /// Two observations are equal; else names the first line that differs.
    fn same(a: Vec<String>, b: Vec<String>) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x, y);
        }
    }

    /// Everything a reader of the store sees, for comparing two stores.
    fn observe(store: &Store, recs: &[StageRecord], now: u64) -> Vec<String> {
        let mut seen = Vec::new();
        let all = SearchQuery {
            limit: Some(10_000),
            ..SearchQuery::default()
        };
        let found = store.search(&all).unwrap();
        seen.push(format!("search {found:?}"));
        for s in &found {
            seen.push(format!(
                "{} {:?}",
                s.key,
                store.trajectory(&s.key, now).unwrap()
            ));
        }
        for st in MessageState::ALL {
            let q = SearchQuery {
                state: Some(*st),
                limit: Some(10_000),
                ..SearchQuery::default()
            };
            seen.push(format!("{st:?} {:?}", store.search(&q).unwrap()));
        }
        for t in 0..3 {
            let q = SearchQuery {
                topic: Some(format!("t{t}")),
                limit: Some(10_000),
                ..SearchQuery::default()
            };
            seen.push(format!("t{t} {:?}", store.search(&q).unwrap()));
        }
        let requests: std::collections::BTreeSet<(String, String)> = recs
            .iter()
            .filter_map(|r| {
                Some((
                    r.request_id.as_ref()?.as_str().to_owned(),
                    r.producer.as_ref()?.as_str().to_owned(),
                ))
            })
            .collect();
        for (q, p) in &requests {
            let t = store.lookup(q, Some(p), now).map_err(|e| e.to_string());
            seen.push(format!("request {q} {p} {t:?}"));
        }
        seen.push(format!(
            "counters {:?}",
            without_bytes(store.counters().unwrap())
        ));
        seen.push(format!("state counts {:?}", store.state_counts().unwrap()));
        seen.push(format!("state totals {:?}", store.state_totals().unwrap()));
        seen.push(format!(
            "recent {:?}",
            store.recent_summaries(0, 10_000).unwrap()
        ));
        for k in 0..3 {
            seen.push(format!(
                "events p{k} {:?}",
                store.client_events(&format!("p{k}"), 100).unwrap()
            ));
        }
        seen
    }

    /// The byte counter of `store-v3.redb` (the records as redb held them), as the legacy
    /// store counted it when it wrote the fixture.
    const V3_FIXTURE_BYTES: u64 = 3_641;

    /// Issue 26: a store written by the last redb version (its own `apply`, several
    /// batches: `store-v3.redb`, of [`mixed_workload`]`(T0)` in batches of 17) opens on
    /// fjall with every trajectory, summary, index, counter, request link and client event
    /// as a fjall store fed the same batches has them, and the redb file renamed aside.
    #[test]
    fn a_redb_store_is_migrated_into_fjall() {
        let dir = fixture("store-v3.redb");
        let recs = mixed_workload(T0);
        let now = T0 + 7_200_000_000_000;
        let (_fresh_dir, fresh) = fed(&recs, 17, now);
        let want_messages = fresh
            .search(&SearchQuery {
                limit: Some(10_000),
                ..SearchQuery::default()
            })
            .unwrap();
        assert!(want_messages.len() > 20, "{}", want_messages.len());
        let mut want = Vec::new();
        for s in &want_messages {
            want.push((s.key.clone(), fresh.trajectory(&s.key, now).unwrap()));
        }
        let want_counters = without_bytes(fresh.counters().unwrap());
        let want_events = fresh.client_events("p1", 100).unwrap();

        let store = Store::open(dir.path(), 0, Deadlines::default()).unwrap();
        assert!(!dir.path().join(REDB_FILE).exists());
        assert!(dir.path().join(REDB_MIGRATED).exists());
        let found = store
            .search(&SearchQuery {
                limit: Some(10_000),
                ..SearchQuery::default()
            })
            .unwrap();
        assert_eq!(found, want_messages);
        for (key, t) in &want {
            assert_eq!(&store.trajectory(key, now).unwrap(), t, "{key}");
        }
        assert_eq!(without_bytes(store.counters().unwrap()), want_counters);
        assert_eq!(store.client_events("p1", 100).unwrap(), want_events);
        assert!(!want_events.is_empty());
        // One chunk per message, its key 4 bytes longer than redb's.
        let messages = store.storage().unwrap().tables[0].entries;
        assert_eq!(
            store.counters().unwrap()[COUNTER_BYTES],
            V3_FIXTURE_BYTES + 4 * messages
        );
        // Everything a reader sees equals a fjall store fed the same batches.
        same(observe(&store, &recs, now), observe(&fresh, &recs, now));
        // Nothing is stored twice when the same records come again.
        let again = store.apply(recs.clone(), now).unwrap();
        assert_eq!(again.new_records, 0);
        // (Client events name no message: they count again, as on any store.)
        assert_eq!(fresh.apply(recs.clone(), now).unwrap(), again);
        drop(store);
        // Opening again migrates nothing more.
        let store = Store::open(dir.path(), 0, Deadlines::default()).unwrap();
        same(observe(&store, &recs, now), observe(&fresh, &recs, now));
    }
}
