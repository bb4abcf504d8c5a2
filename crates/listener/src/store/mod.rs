//! The embedded store (redb): stage records per message, the shadow-message summaries and
//! their indexes, persistent counters, retention.
//!
//! ## Tables
//! | table | key | value |
//! | --- | --- | --- |
//! | `message_records` | message key | every record of the message, compact ([`records`]) |
//! | `message_summaries` | message key | [`MessageSummary`], compact ([`MessageSummary::encode`]) |
//! | `requests` | (request ID, producer) | message key |
//! | `request_messages` | (request ID, producer, message ID) | () |
//! | `by_topic` | (topic, first time, message key) | () |
//! | `by_state` | (state, last time, message key) | () |
//! | `by_time` | (first time, message key) | () |
//! | `counters` | name | u64 |
//!
//! A *message key* ([`MessageKey`]) is the message ID, or `orphan/<producer>/<request-id>` for records of an
//! upload the broker has not (yet) answered. When a record linking both arrives (P2), the
//! orphan's records move under the message ID, so P1-before-P2 and P2-before-P1 end alike.
//!
//! A request ID names several messages when its producer uploaded it again after the
//! broker's dedup window (which stores it anew, under a new message ID): `request_messages`
//! keeps every message stored under (request ID, producer), in upload order (message IDs are
//! UUIDv7). Each message past the first counts once (`duplicates_after_window`), the
//! trajectories name each other ([`Trajectory::same_request`], filled at lookup time), and a
//! record without message ID (a P1) goes to the message whose ID was assigned nearest its
//! time — moving when a nearer one arrives — so the arrival order changes nothing.
//!
//! A message's records are one value, rewritten when a batch brings it new records (a
//! message is touched by a few batches in its life, so this costs less than a row per record
//! and its indexes). The store skips a record whose [`StageRecord::dedup_key`] it already
//! holds (by a 64-bit fingerprint, [`records::dedup_hash`]), so a redelivered batch writes
//! nothing new and counts nothing twice. A batch is one write transaction, committed (fsynced)
//! before the ingest acks the stage-stream messages it came from; its passes are in
//! `store/apply.rs`.
//!
//! ## Upgrading a first-version store
//! The first version kept one JSON row per record (`records`) and JSON summaries
//! (`summaries`). [`Store::open`] moves both into the compact tables in one transaction and
//! drops the old ones; indexes and counters keep their form. A row that does not parse
//! fails the open naming it ([`StoreError::Corrupt`]) and leaves the old tables as they were.

use crate::cache::{Cache, CacheStats, Cached, DEFAULT_CACHE_MESSAGES};
use crate::counters::{Counter, CounterKey, STATE_PREFIX, TOPIC_PREFIX};
use crate::error::{QueryError, StoreError};
use crate::summary::topic_state;
pub use crate::summary::{MessageSummary, StateDelta, TopicState};
use base64::Engine;
pub use key::MessageKey;
use msgtrail_core::trajectory::{AssembleOptions, Deadlines, MessageState, Segment, Trajectory};
use msgtrail_core::{MessageId, RequestId, StageRecord};
use redb::{Database, ReadableDatabase, ReadableTable, Table, TableDefinition, TableHandle};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

mod apply;
pub mod client_events;
pub mod key;
pub mod records;

const RECORDS: TableDefinition<&str, &[u8]> = TableDefinition::new("message_records");
/// The records table of the first version: one JSON row per record, keyed by (message key,
/// dedup key). [`Store::open`] moves what it finds there into `message_records`.
const RECORDS_V1: TableDefinition<(&str, &str), &str> = TableDefinition::new("records");
const SUMMARIES: TableDefinition<&str, &[u8]> = TableDefinition::new("message_summaries");
/// The summaries table of the first version (JSON), moved into `message_summaries` on open.
const SUMMARIES_V1: TableDefinition<&str, &str> = TableDefinition::new("summaries");
const REQUESTS: TableDefinition<(&str, &str), &str> = TableDefinition::new("requests");
const REQUEST_MESSAGES: TableDefinition<(&str, &str, &str), ()> =
    TableDefinition::new("request_messages");
const BY_TOPIC: TableDefinition<(&str, u64, &str), ()> = TableDefinition::new("by_topic");
const BY_STATE: TableDefinition<(&str, u64, &str), ()> = TableDefinition::new("by_state");
const BY_TIME: TableDefinition<(u64, &str), ()> = TableDefinition::new("by_time");
const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");

/// Counter name: bytes of stored records (keys and values), what size retention measures.
pub const COUNTER_BYTES: &str = "bytes";
/// Most summaries one search reads before it answers with what it found.
const SEARCH_SCAN_MAX: usize = 200_000;

/// A search over the shadow messages. Every filter is optional; results are newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SearchQuery {
    /// Only this topic.
    pub topic: Option<String>,
    /// Only this state.
    pub state: Option<MessageState>,
    /// Only messages whose first record is at or after this time (Unix nanoseconds).
    pub from: Option<u64>,
    /// Only messages whose first record is before this time (Unix nanoseconds).
    pub to: Option<u64>,
    /// At most this many results (default 100, at most 10 000).
    pub limit: Option<usize>,
    /// Only topics matching this NATS-style pattern (`*` one token, `>` the rest).
    pub topic_pattern: Option<String>,
    /// Only this producer.
    pub producer: Option<String>,
    /// Only messages this consumer group got.
    pub group: Option<String>,
    /// Only messages whose end to end took at least this long (nanoseconds).
    pub min_end_to_end: Option<u64>,
    /// Only messages some group dead-lettered.
    #[serde(default)]
    pub dead_lettered: bool,
    /// Only messages that had a failure at any hop, even one recovered from.
    #[serde(default)]
    pub failed: bool,
    /// Only messages some group got again.
    #[serde(default)]
    pub redelivered: bool,
    /// Only messages with this attribute (key, value).
    #[serde(default)]
    pub attr: Option<(String, String)>,
}

/// What applying one batch changed, for the statistics.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ApplyOutcome {
    /// Records written for the first time.
    pub new_records: u64,
    /// Records already stored (a redelivered batch), skipped.
    pub repeated_records: u64,
    /// Records that name no message, request or client.
    pub unkeyed_records: u64,
    /// Shadow-message state changes: (old state, new state); `None` for created/deleted.
    pub state_changes: Vec<StateDelta>,
    /// Latencies completed by this batch: (topic, segment, nanoseconds, the message's ID
    /// for the metrics' exemplars).
    pub latencies: Vec<(String, Segment, u64, Option<MessageId>)>,
    /// Counter increments (also persisted).
    pub counters: Deltas,
    /// The trajectories this batch changed, when the store was opened to emit them (for
    /// trace export).
    pub trajectories: Vec<Trajectory>,
}

/// Counter increments by counter, gathered while a transaction works and written once.
pub type Deltas = BTreeMap<CounterKey, i64>;

/// What a watchdog pass changed.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct DeadlineOutcome {
    /// State changes for the counts by state.
    pub state_changes: Vec<StateDelta>,
    /// The trajectories whose summary changed, when the store emits them.
    pub trajectories: Vec<Trajectory>,
    /// The `since` to pass to the next pass.
    pub next_since: u64,
}

/// What a retention run deleted.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RetentionOutcome {
    /// Messages deleted.
    pub deleted: u64,
    /// Bytes of records freed.
    pub bytes_freed: u64,
    /// The states of the deleted messages, for the state counts.
    pub state_changes: Vec<StateDelta>,
}

/// The embedded store. Cheap to share behind an `Arc`; every method blocks on disk I/O,
/// so async code calls it through `spawn_blocking`.
pub struct Store {
    db: Database,
    payload_head_bytes: usize,
    deadlines: Deadlines,
    emit_trajectories: bool,
    /// In-flight messages as committed. Every write transaction holds this lock from before
    /// it begins until the cache reflects its commit, so the cache never lags the store.
    cache: Mutex<Cache>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("payload_head_bytes", &self.payload_head_bytes)
            .finish_non_exhaustive()
    }
}

fn orphan_key(producer: &str, request_id: &str) -> String {
    MessageKey::orphan(producer, request_id).to_string()
}

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

/// (request ID, producer) → message key, as read or written in a transaction.
type Links = HashMap<(String, String), Option<String>>;
/// (request ID, producer) → the messages stored under it, as read or written in a
/// transaction.
type Sets = HashMap<(String, String), BTreeSet<MessageId>>;

/// The message a record without message ID (a P1: the producer does not know it yet)
/// belongs to, among the messages stored under its request ID: the one whose ID the broker
/// assigned nearest the record's time (the earlier on a tie). Uploads that were stored apart
/// are a dedup window apart, while an upload's own attempts lie within moments of its P2.
fn nearest(set: &BTreeSet<MessageId>, at: u64) -> Option<MessageId> {
    set.iter()
        .copied()
        .min_by_key(|m| (m.unix_millis().saturating_mul(1_000_000).abs_diff(at), *m))
}

struct Tables<'t> {
    records: Table<'t, &'static str, &'static [u8]>,
    summaries: Table<'t, &'static str, &'static [u8]>,
    requests: Table<'t, (&'static str, &'static str), &'static str>,
    request_messages: Table<'t, (&'static str, &'static str, &'static str), ()>,
    by_topic: Table<'t, (&'static str, u64, &'static str), ()>,
    by_state: Table<'t, (&'static str, u64, &'static str), ()>,
    by_time: Table<'t, (u64, &'static str), ()>,
    counters: Table<'t, &'static str, u64>,
}

impl<'t> Tables<'t> {
    fn open(tx: &'t redb::WriteTransaction) -> Result<Self, StoreError> {
        Ok(Tables {
            records: tx.open_table(RECORDS)?,
            summaries: tx.open_table(SUMMARIES)?,
            requests: tx.open_table(REQUESTS)?,
            request_messages: tx.open_table(REQUEST_MESSAGES)?,
            by_topic: tx.open_table(BY_TOPIC)?,
            by_state: tx.open_table(BY_STATE)?,
            by_time: tx.open_table(BY_TIME)?,
            counters: tx.open_table(COUNTERS)?,
        })
    }

    fn bump(&mut self, key: CounterKey, by: i64, out: &mut Deltas) -> Result<(), StoreError> {
        // Deltas gather in `out` and reach the table once per transaction (`flush`).
        if by != 0 {
            *out.entry(key).or_default() += by;
        }
        Ok(())
    }

    /// Bumps a counter both globally and within `topic`.
    fn bump_both(
        &mut self,
        topic: &str,
        c: Counter,
        by: i64,
        out: &mut Deltas,
    ) -> Result<(), StoreError> {
        self.bump(c.into(), by, out)?;
        self.bump(CounterKey::Topic(topic.to_owned(), c), by, out)
    }

    /// Keeps the per-topic state counts as persistent counters
    /// (`topic/<topic>/state.<state>`), so a start reads them instead of every summary.
    fn count_states(&mut self, changes: &[StateDelta], out: &mut Deltas) -> Result<(), StoreError> {
        for (old, new) in changes {
            if let Some((topic, st)) = old {
                self.bump(
                    CounterKey::Topic(topic.clone(), Counter::State(*st)),
                    -1,
                    out,
                )?;
            }
            if let Some((topic, st)) = new {
                self.bump(
                    CounterKey::Topic(topic.clone(), Counter::State(*st)),
                    1,
                    out,
                )?;
            }
        }
        Ok(())
    }

    fn flush(&mut self, deltas: &Deltas) -> Result<(), StoreError> {
        for (key, by) in deltas {
            let name = key.to_string();
            let cur = self
                .counters
                .get(name.as_str())?
                .map(|v| v.value())
                .unwrap_or(0);
            self.counters
                .insert(name.as_str(), cur.saturating_add_signed(*by))?;
        }
        Ok(())
    }

    fn sub_bytes(&mut self, by: u64) -> Result<(), StoreError> {
        let cur = self
            .counters
            .get(COUNTER_BYTES)?
            .map(|v| v.value())
            .unwrap_or(0);
        self.counters
            .insert(COUNTER_BYTES, cur.saturating_sub(by))?;
        Ok(())
    }

    /// The message key (request ID, producer) is linked to, through a per-transaction memo.
    fn link(
        &self,
        memo: &mut Links,
        request: &str,
        producer: &str,
    ) -> Result<Option<String>, StoreError> {
        let k = (request.to_owned(), producer.to_owned());
        if let Some(v) = memo.get(&k) {
            return Ok(v.clone());
        }
        let v = self
            .requests
            .get((request, producer))?
            .map(|v| v.value().to_owned());
        memo.insert(k, v.clone());
        Ok(v)
    }

    /// Links (request ID, producer) to a message key, in the table and the memo.
    fn set_link(
        &mut self,
        memo: &mut Links,
        request: &str,
        producer: &str,
        key: String,
    ) -> Result<(), StoreError> {
        self.requests.insert((request, producer), key.as_str())?;
        memo.insert((request.to_owned(), producer.to_owned()), Some(key));
        Ok(())
    }

    /// The messages stored under (request ID, producer), in upload order, through a
    /// per-transaction memo. A store written before `request_messages` existed has only the
    /// link: the message it names is taken into the table.
    fn messages_of<'s>(
        &mut self,
        sets: &'s mut Sets,
        links: &mut Links,
        request: &str,
        producer: &str,
    ) -> Result<&'s BTreeSet<MessageId>, StoreError> {
        let k = (request.to_owned(), producer.to_owned());
        if sets.contains_key(&k) {
            return Ok(&sets[&k]);
        }
        let mut set = BTreeSet::new();
        for item in self.request_messages.range((request, producer, "")..)? {
            let (key, _) = item?;
            let (r, p, m) = key.value();
            if r != request || p != producer {
                break;
            }
            set.insert(m.parse::<MessageId>().map_err(corrupt)?);
        }
        if set.is_empty() {
            if let Some(Ok(m)) = self
                .link(links, request, producer)?
                .map(|l| l.parse::<MessageId>())
            {
                self.request_messages
                    .insert((request, producer, m.to_string().as_str()), ())?;
                set.insert(m);
            }
        }
        Ok(sets.entry(k).or_insert(set))
    }

    /// Records that a message is stored under (request ID, producer).
    fn add_message(
        &mut self,
        sets: &mut Sets,
        request: &str,
        producer: &str,
        m: MessageId,
    ) -> Result<(), StoreError> {
        self.request_messages
            .insert((request, producer, m.to_string().as_str()), ())?;
        sets.entry((request.to_owned(), producer.to_owned()))
            .or_default()
            .insert(m);
        Ok(())
    }

    fn load_records(&self, key: &str) -> Result<Vec<StageRecord>, StoreError> {
        match self.records.get(key)? {
            Some(v) => records::decode(v.value()).map_err(corrupt),
            None => Ok(Vec::new()),
        }
    }

    /// Writes a message's records (or removes the row of a message left without any);
    /// returns the change in stored bytes.
    fn put_records(&mut self, key: &str, c: &mut Cached) -> Result<i64, StoreError> {
        let old = c.bytes as i64;
        if c.records.is_empty() {
            self.records.remove(key)?;
            c.bytes = 0;
            c.encoded = None;
        } else {
            let v = records::encode(&c.records);
            c.bytes = (key.len() + v.len()) as u64;
            self.records.insert(key, v.as_slice())?;
            c.encoded = Some(v);
        }
        Ok(c.bytes as i64 - old)
    }

    fn summary(&self, key: &str) -> Result<Option<MessageSummary>, StoreError> {
        match self.summaries.get(key)? {
            Some(v) => Ok(Some(
                MessageSummary::decode(key, v.value()).map_err(corrupt)?,
            )),
            None => Ok(None),
        }
    }

    fn unindex(&mut self, s: &MessageSummary) -> Result<(), StoreError> {
        let key = s.key.as_str();
        self.by_topic
            .remove((s.topic.as_deref().unwrap_or(""), s.first_at, key))?;
        self.by_state.remove((s.state.as_str(), s.last_at, key))?;
        self.by_time.remove((s.first_at, key))?;
        Ok(())
    }

    fn put_summary(
        &mut self,
        old: Option<&MessageSummary>,
        new: &MessageSummary,
    ) -> Result<(), StoreError> {
        let key = new.key.as_str();
        // Touch only the index entries whose key changed: most changes move `last_at`
        // (and sometimes the state), rarely the topic or the first time.
        let topic = |s: &MessageSummary| (s.topic.clone().unwrap_or_default(), s.first_at);
        let same_topic = old.is_some_and(|o| topic(o) == topic(new));
        let same_state = old.is_some_and(|o| (o.state, o.last_at) == (new.state, new.last_at));
        if let Some(o) = old {
            if !same_topic {
                self.by_topic
                    .remove((o.topic.as_deref().unwrap_or(""), o.first_at, key))?;
                self.by_time.remove((o.first_at, key))?;
            }
            if !same_state {
                self.by_state.remove((o.state.as_str(), o.last_at, key))?;
            }
        }
        if !same_topic {
            self.by_topic
                .insert((new.topic.as_deref().unwrap_or(""), new.first_at, key), ())?;
            self.by_time.insert((new.first_at, key), ())?;
        }
        if !same_state {
            self.by_state
                .insert((new.state.as_str(), new.last_at, key), ())?;
        }
        self.summaries.insert(key, new.encode().as_slice())?;
        Ok(())
    }

    /// Reads a message as the cache holds it: its records, their dedup keys and size, its
    /// summary.
    fn load_cached(&self, key: &str) -> Result<Cached, StoreError> {
        let mut c = Cached::default();
        if let Some(v) = self.records.get(key)? {
            c.bytes = (key.len() + v.value().len()) as u64;
            c.records = records::decode(v.value()).map_err(corrupt)?;
            c.dedup_keys = c.records.iter().map(records::dedup_hash).collect();
            c.encoded = Some(v.value().to_vec());
        }
        c.summary = self.summary(key)?;
        Ok(c)
    }

    /// Deletes a message the cache held (its records are known, nothing is read back);
    /// returns (bytes freed, its summary).
    fn delete_known(
        &mut self,
        key: &str,
        c: Cached,
    ) -> Result<(u64, Option<MessageSummary>), StoreError> {
        self.records.remove(key)?;
        self.delete_summary(key, c.summary.as_ref())?;
        self.sub_bytes(c.bytes)?;
        Ok((c.bytes, c.summary))
    }

    fn delete_summary(&mut self, key: &str, s: Option<&MessageSummary>) -> Result<(), StoreError> {
        if let Some(s) = s {
            self.unindex(s)?;
            self.summaries.remove(key)?;
            if let (Some(p), Some(r)) = (&s.producer, &s.request_id) {
                let points_here = self
                    .requests
                    .get((r.as_str(), p.as_str()))?
                    .is_some_and(|v| v.value() == key);
                if points_here {
                    self.requests.remove((r.as_str(), p.as_str()))?;
                }
                if let Some(m) = s.message_id {
                    self.request_messages.remove((
                        r.as_str(),
                        p.as_str(),
                        m.to_string().as_str(),
                    ))?;
                }
            }
        }
        Ok(())
    }

    /// Deletes a message entirely; returns (bytes freed, its summary).
    fn delete_message(&mut self, key: &str) -> Result<(u64, Option<MessageSummary>), StoreError> {
        let freed = match self.records.remove(key)? {
            Some(v) => (key.len() + v.value().len()) as u64,
            None => 0,
        };
        let summary = self.summary(key)?;
        self.delete_summary(key, summary.as_ref())?;
        self.sub_bytes(freed)?;
        Ok((freed, summary))
    }
}

/// Moves the records of a store written by the first version (one JSON row per record, in
/// `records`) into the compact per-message form, in one transaction, and drops the old
/// table; the summaries, indexes and counters keep their form. Returns how many messages
/// moved (0 for a store that has nothing to move). A row that does not parse fails the
/// open with [`StoreError::Corrupt`] naming it, and the old table stays as it was.
fn migrate_v1(db: &Database) -> Result<u64, StoreError> {
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

impl Store {
    /// Opens (or creates) the store file `listener.redb` in `dir`.
    pub fn open(
        dir: &Path,
        payload_head_bytes: usize,
        deadlines: Deadlines,
    ) -> Result<Store, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Open {
            path: dir.display().to_string(),
            reason: e.to_string(),
        })?;
        let path = dir.join("listener.redb");
        let db = Database::create(&path).map_err(|e| StoreError::Open {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        // Create every table up front so read transactions never meet a missing one.
        let tx = db.begin_write()?;
        drop(Tables::open(&tx)?);
        tx.commit()?;
        let migrated = migrate_v1(&db)?;
        if migrated > 0 {
            tracing::info!(messages = migrated, path = %path.display(), "moved the records of a first-version store into the compact form");
        }
        Ok(Store {
            db,
            payload_head_bytes,
            deadlines,
            emit_trajectories: false,
            cache: Mutex::new(Cache::new(DEFAULT_CACHE_MESSAGES)),
        })
    }

    /// Makes [`Store::apply`] and [`Store::check_deadlines`] return the trajectories they
    /// changed (the listener turns this on when it exports traces).
    pub fn emit_trajectories(mut self, on: bool) -> Self {
        self.emit_trajectories = on;
        self
    }

    /// Sets how many in-flight messages [`Store::apply`] keeps in memory (default
    /// [`DEFAULT_CACHE_MESSAGES`]; 0 keeps none and reads every touched message back).
    pub fn cache_capacity(self, messages: usize) -> Self {
        *self.lock_cache() = Cache::new(messages);
        self
    }

    /// The in-flight cache's counters.
    pub fn cache_stats(&self) -> CacheStats {
        self.lock_cache().stats()
    }

    fn lock_cache(&self) -> MutexGuard<'_, Cache> {
        // A panic while holding the lock leaves only committed entries in the cache (work
        // in progress is taken out of it), so a poisoned cache is still sound.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Assembles a trajectory for a summary and the statistics: without the diagnosis and
    /// span IDs unless the trajectories are emitted (for export).
    fn assemble(&self, recs: Vec<StageRecord>, opts: &AssembleOptions) -> Option<Trajectory> {
        if self.emit_trajectories {
            Trajectory::assemble(recs, opts)
        } else {
            Trajectory::assemble_for_summary(recs, opts)
        }
    }

    fn options(&self, now: u64) -> AssembleOptions {
        AssembleOptions {
            now: Some(now),
            deadlines: self.deadlines,
        }
    }

    fn trim_payload(&self, r: &mut StageRecord) {
        let Some(head) = r.payload_head.take() else {
            return;
        };
        if self.payload_head_bytes == 0 {
            return;
        }
        let engine = base64::engine::general_purpose::STANDARD;
        match engine.decode(head.as_bytes()) {
            Ok(mut bytes) => {
                bytes.truncate(self.payload_head_bytes);
                r.payload_head = Some(engine.encode(bytes));
            }
            Err(_) => r.payload_head = Some(head),
        }
    }

    /// Applies a batch of records in one transaction, committed before it returns. Records
    /// already stored are skipped, so applying the same batch twice changes nothing. The
    /// passes are in `store/apply.rs`.
    pub fn apply(&self, records: Vec<StageRecord>, now: u64) -> Result<ApplyOutcome, StoreError> {
        let mut cache = self.lock_cache();
        let tx = self.db.begin_write()?;
        let (staged, out) = {
            let mut t = Tables::open(&tx)?;
            let mut pass = apply::Pass::new(self, &tx, &mut t, &mut cache, now);
            let staged = pass.run(records)?;
            (staged, std::mem::take(&mut pass.out))
        };
        tx.commit()?;
        cache.put_all(staged);
        Ok(out)
    }

    /// Re-examines open messages whose last record is older than the shortest deadline and
    /// marks those that missed one (stuck, lost). Returns the state changes.
    ///
    /// Only messages whose last record is at or after `since` are looked at: a message whose
    /// last record is older than every deadline cannot change any more with time alone, so
    /// the caller passes the previous pass's `next_since` (0 the first time, or after a pass
    /// that hit `max`).
    pub fn check_deadlines(
        &self,
        now: u64,
        since: u64,
        max: usize,
    ) -> Result<DeadlineOutcome, StoreError> {
        let d = self.deadlines;
        let ms = |v: u64| v.saturating_mul(1_000_000);
        let shortest = d
            .stored_ms
            .min(d.delivered_ms)
            .min(d.acked_ms)
            .min(d.processed_ms);
        let longest = d
            .stored_ms
            .max(d.delivered_ms)
            .max(d.acked_ms)
            .max(d.processed_ms);
        let cutoff = now.saturating_sub(ms(shortest));
        let open = [
            MessageState::Sent,
            MessageState::Enqueued,
            MessageState::Delivered,
            MessageState::Consuming,
            MessageState::Failed,
        ];
        let mut out = DeadlineOutcome::default();
        let mut cache = self.lock_cache();
        let mut changed: Vec<(String, MessageSummary)> = Vec::new();
        let tx = self.db.begin_write()?;
        {
            let mut t = Tables::open(&tx)?;
            let mut candidates = Vec::new();
            let mut truncated = false;
            for st in open {
                if since >= cutoff {
                    break;
                }
                for item in t
                    .by_state
                    .range((st.as_str(), since, "")..(st.as_str(), cutoff, ""))?
                {
                    let (k, _) = item?;
                    candidates.push(k.value().2.to_owned());
                    if candidates.len() >= max {
                        truncated = true;
                        break;
                    }
                }
            }
            out.next_since = if truncated {
                since
            } else {
                now.saturating_sub(ms(longest))
            };
            let opts = self.options(now);
            for key in candidates {
                let (old, recs) = match cache.peek(&key) {
                    Some(c) => (c.summary, c.records),
                    None => (t.summary(&key)?, t.load_records(&key)?),
                };
                let Some(old) = old else {
                    continue;
                };
                let Some(traj) = self.assemble(recs, &opts) else {
                    continue;
                };
                let new = MessageSummary::of(&key, &traj);
                if new != old {
                    t.put_summary(Some(&old), &new)?;
                    if topic_state(&new) != topic_state(&old) {
                        out.state_changes
                            .push((Some(topic_state(&old)), Some(topic_state(&new))));
                    }
                    if self.emit_trajectories {
                        out.trajectories.push(traj);
                    }
                    changed.push((key, new));
                }
            }
            let mut deltas = BTreeMap::new();
            t.count_states(&out.state_changes, &mut deltas)?;
            t.flush(&deltas)?;
        }
        tx.commit()?;
        for (key, new) in changed {
            cache.set_summary(&key, &new);
        }
        Ok(out)
    }

    /// Deletes messages whose first record is older than `max_age`, then the oldest ones
    /// while the stored records exceed `max_bytes` (down to 90 % of it, so that retention
    /// does not run on every batch). At most `max` messages per call.
    pub fn enforce_retention(
        &self,
        now: u64,
        max_age: Option<Duration>,
        max_bytes: Option<u64>,
        max: usize,
    ) -> Result<RetentionOutcome, StoreError> {
        let mut out = RetentionOutcome::default();
        let mut cache = self.lock_cache();
        let tx = self.db.begin_write()?;
        {
            let mut t = Tables::open(&tx)?;
            let cutoff = max_age.map(|a| now.saturating_sub(a.as_nanos() as u64));
            let mut bytes = t
                .counters
                .get(COUNTER_BYTES)?
                .map(|v| v.value())
                .unwrap_or(0);
            let target = max_bytes.map(|m| m / 10 * 9);
            let over = max_bytes.is_some_and(|m| bytes > m);
            while (out.deleted as usize) < max {
                let first = t.by_time.first()?.map(|(k, _)| {
                    let (at, key) = k.value();
                    (at, key.to_owned())
                });
                let Some((at, key)) = first else { break };
                let too_old = cutoff.is_some_and(|c| at < c);
                let too_big = over && target.is_some_and(|tg| bytes > tg);
                if !too_old && !too_big {
                    break;
                }
                // Out of the cache first: should the transaction fail, the message is read
                // back from the store next time.
                cache.forget(&key);
                let (freed, summary) = t.delete_message(&key)?;
                if summary.is_none() {
                    // An index entry without a summary: drop it so the loop advances.
                    t.by_time.remove((at, key.as_str()))?;
                }
                bytes = bytes.saturating_sub(freed);
                out.deleted += 1;
                out.bytes_freed += freed;
                if let Some(s) = summary {
                    out.state_changes.push((Some(topic_state(&s)), None));
                }
            }
            if let Some(c) = cutoff {
                client_events::prune(&tx, c)?;
            }
            let mut ignored = BTreeMap::new();
            t.count_states(&out.state_changes, &mut ignored)?;
            t.bump(
                Counter::RetentionDeleted.into(),
                out.deleted as i64,
                &mut ignored,
            )?;
            t.flush(&ignored)?;
        }
        tx.commit()?;
        Ok(out)
    }

    /// The trajectory stored under a message key, assembled with deadlines applied at `now`,
    /// naming the other messages stored under its producer and request ID
    /// ([`Trajectory::same_request`]).
    pub fn trajectory(&self, key: &str, now: u64) -> Result<Option<Trajectory>, StoreError> {
        let tx = self.db.begin_read()?;
        let records = tx.open_table(RECORDS)?;
        let recs = match records.get(key)? {
            Some(v) => records::decode(v.value()).map_err(corrupt)?,
            None => return Ok(None),
        };
        let Some(mut t) = Trajectory::assemble(recs, &self.options(now)) else {
            return Ok(None);
        };
        if let (Some(m), Some(p), Some(q)) = (t.message_id, &t.producer, &t.request_id) {
            let idx = tx.open_table(REQUEST_MESSAGES)?;
            let mut others = Vec::new();
            for item in idx.range((q.as_str(), p.as_str(), "")..)? {
                let (k, _) = item?;
                let (r, pp, id) = k.value();
                if r != q.as_str() || pp != p.as_str() {
                    break;
                }
                let id = id.parse::<MessageId>().map_err(corrupt)?;
                if id != m {
                    others.push(id);
                }
            }
            if !others.is_empty() {
                t.set_same_request(others);
            }
        }
        Ok(Some(t))
    }

    /// The message keys stored under a request ID, per producer (only `producer`'s when
    /// given): every message in upload order, or else the link (an orphan upload).
    fn request_keys(
        &self,
        id: &str,
        producer: Option<&str>,
    ) -> Result<BTreeMap<String, Vec<String>>, StoreError> {
        let tx = self.db.begin_read()?;
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let idx = tx.open_table(REQUEST_MESSAGES)?;
        for item in idx.range((id, "", "")..)? {
            let (k, _) = item?;
            let (r, p, m) = k.value();
            if r != id {
                break;
            }
            if producer.is_none_or(|want| want == p) {
                out.entry(p.to_owned()).or_default().push(m.to_owned());
            }
        }
        let requests = tx.open_table(REQUESTS)?;
        for item in requests.range((id, "")..)? {
            let (k, val) = item?;
            let (r, p) = k.value();
            if r != id {
                break;
            }
            if producer.is_none_or(|want| want == p) {
                out.entry(p.to_owned())
                    .or_insert_with(|| vec![val.value().to_owned()]);
            }
        }
        Ok(out)
    }

    /// Finds the trajectory of a message ID or of a request ID (optionally of one producer).
    pub fn lookup(
        &self,
        id: &str,
        producer: Option<&str>,
        now: u64,
    ) -> Result<Trajectory, QueryError> {
        let id = id.trim();
        // Generated request IDs are UUIDv7 text too: an ID that looks like a message ID and
        // is not one is looked up as a request ID.
        if let Ok(m) = id.parse::<MessageId>() {
            if let Some(t) = self.trajectory(&m.to_string(), now)? {
                return Ok(t);
            }
        }
        if RequestId::new(id).is_err() {
            return Err(QueryError::BadRequest(format!(
                "{id:?} is neither a message id (UUIDv7) nor a request id"
            )));
        }
        let keys = self.request_keys(id, producer)?;
        let mut producers = keys.iter();
        match (producers.next(), producers.next()) {
            (None, _) => Err(QueryError::NotFound(format!(
                "message id or request id {id}"
            ))),
            // A request ID stored as several messages (uploaded again after the dedup
            // window) answers with the latest; its `same_request` names the others.
            (Some((_, messages)), None) => messages
                .last()
                .map(|key| self.trajectory(key, now))
                .transpose()?
                .flatten()
                .ok_or_else(|| QueryError::NotFound(format!("request id {id}"))),
            (Some(_), Some(_)) => Err(QueryError::Ambiguous {
                request_id: id.to_owned(),
                producers: keys.into_keys().collect(),
            }),
        }
    }

    /// Searches the shadow messages, newest first.
    pub fn search(&self, q: &SearchQuery) -> Result<Vec<MessageSummary>, StoreError> {
        let limit = q.limit.unwrap_or(100).clamp(1, 10_000);
        let from = q.from.unwrap_or(0);
        let to = q.to.unwrap_or(u64::MAX);
        if from >= to {
            return Ok(Vec::new());
        }
        let tx = self.db.begin_read()?;
        let summaries = tx.open_table(SUMMARIES)?;
        let mut out = Vec::new();
        let mut examined = 0usize;
        // Looks at one candidate; true when the search is done (enough results, or the
        // scan bound reached: a search never reads more than SEARCH_SCAN_MAX summaries).
        let mut consider = |key: &str, out: &mut Vec<MessageSummary>| -> Result<bool, StoreError> {
            examined += 1;
            if let Some(v) = summaries.get(key)? {
                let s = MessageSummary::decode(key, v.value()).map_err(corrupt)?;
                let wanted = q.state.is_none_or(|st| st == s.state)
                    && q.topic
                        .as_deref()
                        .is_none_or(|t| s.topic.as_deref() == Some(t))
                    && s.first_at >= from
                    && s.first_at < to
                    && q.wants(&s);
                if wanted {
                    out.push(s);
                }
            }
            Ok(out.len() >= limit || examined >= SEARCH_SCAN_MAX)
        };
        if let Some(topic) = &q.topic {
            let idx = tx.open_table(BY_TOPIC)?;
            for item in idx
                .range((topic.as_str(), from, "")..(topic.as_str(), to, ""))?
                .rev()
            {
                if consider(item?.0.value().2, &mut out)? {
                    break;
                }
            }
        } else if let Some(state) = q.state {
            // by_state is ordered by the last record time (never before the first), so the
            // range from `from` holds every candidate; the first time is checked above.
            let idx = tx.open_table(BY_STATE)?;
            for item in idx
                .range((state.as_str(), from, "")..=(state.as_str(), u64::MAX, "\u{7f}"))?
                .rev()
            {
                if consider(item?.0.value().2, &mut out)? {
                    break;
                }
            }
        } else {
            let idx = tx.open_table(BY_TIME)?;
            for item in idx.range((from, "")..(to, ""))?.rev() {
                if consider(item?.0.value().1, &mut out)? {
                    break;
                }
            }
        }
        out.sort_by(|a, b| (b.first_at, &b.key).cmp(&(a.first_at, &a.key)));
        out.truncate(limit);
        Ok(out)
    }

    /// The persistent counters.
    pub fn counters(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        let tx = self.db.begin_read()?;
        let c = tx.open_table(COUNTERS)?;
        let mut out = BTreeMap::new();
        for item in c.iter()? {
            let (k, v) = item?;
            out.insert(k.value().to_owned(), v.value());
        }
        Ok(out)
    }

    /// The summaries of messages whose last record is at or after `since`, oldest first (to
    /// refill the latency window after a restart).
    pub fn recent_summaries(
        &self,
        since: u64,
        max: usize,
    ) -> Result<Vec<MessageSummary>, StoreError> {
        let tx = self.db.begin_read()?;
        let idx = tx.open_table(BY_STATE)?;
        let summaries = tx.open_table(SUMMARIES)?;
        let mut out = Vec::new();
        for st in MessageState::ALL {
            for item in idx.range((st.as_str(), since, "")..=(st.as_str(), u64::MAX, "\u{7f}"))? {
                let key = item?.0.value().2.to_owned();
                if let Some(v) = summaries.get(key.as_str())? {
                    out.push(MessageSummary::decode(&key, v.value()).map_err(corrupt)?);
                }
            }
        }
        out.sort_by_key(|s| s.last_at);
        let skip = out.len().saturating_sub(max);
        Ok(out.split_off(skip))
    }

    /// How many shadow messages are in each state, all topics (a scan of the state index).
    pub fn state_totals(&self) -> Result<BTreeMap<MessageState, u64>, StoreError> {
        let tx = self.db.begin_read()?;
        let idx = tx.open_table(BY_STATE)?;
        let mut out = BTreeMap::new();
        for st in MessageState::ALL {
            let n = idx
                .range((st.as_str(), 0, "")..=(st.as_str(), u64::MAX, "\u{7f}"))?
                .count() as u64;
            if n > 0 {
                out.insert(*st, n);
            }
        }
        Ok(out)
    }

    /// How many shadow messages each topic has in each state, from the persistent per-topic
    /// state counters (kept in the same transactions as the summaries).
    pub fn state_counts(&self) -> Result<BTreeMap<TopicState, u64>, StoreError> {
        let tx = self.db.begin_read()?;
        let counters = tx.open_table(COUNTERS)?;
        let mut out = BTreeMap::new();
        let marker = format!("/{STATE_PREFIX}");
        for item in counters.range(TOPIC_PREFIX..)? {
            let (k, v) = item?;
            let Some(rest) = k.value().strip_prefix(TOPIC_PREFIX) else {
                break;
            };
            let Some((topic, state)) = rest.rsplit_once(&marker) else {
                continue;
            };
            if let (Ok(st), n @ 1..) = (state.parse::<MessageState>(), v.value()) {
                out.insert((topic.to_owned(), st), n);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use msgtrail_core::{ClientId, RequestId, Stage};

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
