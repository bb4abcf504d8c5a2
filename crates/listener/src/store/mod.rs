//! The embedded store (fjall, an LSM tree): stage records per message, the shadow-message
//! summaries and their indexes, persistent counters, retention.
//!
//! ## Keyspaces
//! One fjall database, `listener.fjall` in the data directory; its keyspaces and key layouts
//! are in `store/engine.rs` and `store/tables.rs`. Message keys are stored in their binary
//! form ([`key::StoredKey`]: 17 bytes for a message ID), states as their fixed codes.
//!
//! A *message key* ([`MessageKey`]) is the message ID, or `orphan/<producer>/<request-id>` for records of an
//! upload the broker has not (yet) answered. When a record linking both arrives (P2), the
//! orphan's records move under the message ID, so P1-before-P2 and P2-before-P1 end alike.
//!
//! A request ID names several messages when its producer uploaded it again after the
//! broker's dedup window (which stores it anew, under a new message ID): its `requests` row
//! keeps every message stored under (request ID, producer), in upload order (message IDs are
//! UUIDv7). Each message past the first counts once (`duplicates_after_window`), the
//! trajectories name each other ([`Trajectory::same_request`], filled at lookup time), and a
//! record without message ID (a P1) goes to the message whose ID was assigned nearest its
//! time — moving when a nearer one arrives — so the arrival order changes nothing.
//!
//! ## Records are appended, never rewritten
//! The records one batch brings a message are one *chunk*, written once under (message key,
//! chunk number): a message's records are one prefix scan, and a batch writes only what is
//! new. Only a message that gives records away (an orphan merged, a P1 moving to a nearer
//! message of its request ID) has its chunks replaced. The store skips a record whose
//! [`StageRecord::dedup_key`] it already holds (by a 64-bit fingerprint,
//! [`records::dedup_hash`], kept per message in the in-flight cache), so a redelivered batch
//! writes nothing new and counts nothing twice. A batch is one write — one atomic fjall
//! batch across the keyspaces, fsynced ([`fjall::PersistMode::SyncAll`]) —
//! before the ingest acks the stage-stream messages it came from; its passes are in
//! `store/apply.rs`.
//!
//! ## Upgrading an earlier store
//! [`Store::open`] migrates a `listener.redb` written by an earlier (redb) version into
//! fjall (`store/migrate.rs`), then renames it `listener.redb.migrated`. A row that does not
//! parse fails the open naming it ([`StoreError::Corrupt`]) and leaves the old file as it was.

use crate::cache::{Cache, CacheStats, DEFAULT_CACHE_MESSAGES};
use crate::counters::{Counter, CounterKey};
use crate::error::StoreError;
use crate::summary::{state_code, topic_state};
pub(crate) use crate::summary::{MessageSummary, StateDelta, TopicState};
use base64::Engine as _;
pub(crate) use key::MessageKey;
use msgtrail_core::partition::Partition;
use msgtrail_core::trajectory::{AssembleOptions, Deadlines, MessageState, Segment, Trajectory};
use msgtrail_core::{MessageId, StageRecord};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard};

use engine::Engine;
use std::time::Duration;

mod apply;
pub(crate) mod client_events;
mod engine;
pub(crate) mod key;
mod migrate;
mod query;
pub(crate) mod records;
mod requests;
mod tables;

use tables::Tables;
pub(crate) use tables::COUNTER_BYTES;

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
    /// Only messages of these stage partitions (a group member's share of a merged view).
    #[serde(default)]
    pub partitions: Option<Vec<Partition>>,
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
    /// Observe mode's latencies completed by this batch (queue wait, ack time per consumer).
    pub(crate) observed: Vec<crate::observe::stats::ObservedSample>,
    /// The same increments per stage partition, by name (`part/<NN>/<name>`), when the
    /// store keeps them ([`Store::partitioned`]); empty otherwise.
    pub partition_counters: BTreeMap<String, i64>,
    /// The trajectories this batch changed, when the store was opened to emit them (for
    /// trace export).
    pub trajectories: Vec<Trajectory>,
}

impl ApplyOutcome {
    /// Adds what another pass of the same transaction changed.
    fn absorb(&mut self, o: ApplyOutcome) {
        self.new_records += o.new_records;
        self.repeated_records += o.repeated_records;
        self.unkeyed_records += o.unkeyed_records;
        self.state_changes.extend(o.state_changes);
        self.latencies.extend(o.latencies);
        self.observed.extend(o.observed);
        for (k, v) in o.counters {
            *self.counters.entry(k).or_default() += v;
        }
        self.trajectories.extend(o.trajectories);
    }
}

/// Counter increments by counter, gathered while a transaction works and written once.
pub(crate) type Deltas = BTreeMap<CounterKey, i64>;

/// What a watchdog pass changed.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct DeadlineOutcome {
    /// State changes for the counts by state.
    pub state_changes: Vec<StateDelta>,
    /// The trajectories whose summary changed, when the store emits them.
    pub trajectories: Vec<Trajectory>,
    /// The `since` to pass to the next pass.
    pub next_since: u64,
    /// Counter changes besides the state counts (observe mode's per-stream states), also
    /// persisted, for the statistics.
    pub counters: Deltas,
    /// The state counters' changes per stage partition, by name, when the store keeps them
    /// ([`Store::partitioned`]).
    pub partition_counters: BTreeMap<String, i64>,
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
    /// Counter changes besides the state counts (observe mode's per-stream states), also
    /// persisted, for the statistics.
    pub counters: Deltas,
    /// The state counters' changes per stage partition, by name, when the store keeps them
    /// ([`Store::partitioned`]).
    pub partition_counters: BTreeMap<String, i64>,
}

/// One keyspace's share of the store ([`Store::storage`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableUsage {
    /// The keyspace's name (`journal` for the write-ahead journal).
    pub name: String,
    /// How many rows it has (fjall's estimate: it counts overwritten and deleted rows not
    /// yet compacted away).
    pub entries: u64,
    /// Bytes of its sorted tables on disk (compressed blocks, their indexes and filters).
    pub stored_bytes: u64,
    /// Always 0 on fjall (its tables' metadata is in `stored_bytes`).
    pub metadata_bytes: u64,
    /// Always 0 on fjall (an LSM tree leaves no pages half empty).
    pub fragmented_bytes: u64,
}

/// Where the store's bytes go ([`Store::storage`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StorageReport {
    /// Every keyspace, in the store's order, then the journal.
    pub tables: Vec<TableUsage>,
    /// Bytes on disk: every keyspace's sorted tables and the journal.
    pub allocated_bytes: u64,
}

/// The embedded store. Cheap to share behind an `Arc`; every method blocks on disk I/O,
/// so async code calls it through `spawn_blocking`.
pub struct Store {
    /// The open database: `None` only while [`Store::recover`] reopens it after an I/O
    /// error (fjall refuses every write after one until it is opened again).
    db: RwLock<Option<Engine>>,
    /// The database directory, to open it again.
    path: PathBuf,
    /// Set when an operation failed with an I/O error: [`Store::recover`] reopens then.
    io_failed: AtomicBool,
    /// fjall's block cache, bytes (kept to open the database again the same way).
    cache_bytes: usize,
    payload_head_bytes: usize,
    deadlines: Deadlines,
    emit_trajectories: bool,
    /// Whether counters are also kept per stage partition ([`Store::partitioned`]).
    partitioned: bool,
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

/// The engine's block cache by default, bytes (256 MiB), stated so that a user sees it and
/// can bound it (`ListenerConfig::store_cache_bytes`, `--store-cache`). Beside it fjall
/// keeps its write buffers (memtables, flushed past 64 MiB per keyspace by default).
pub const DEFAULT_STORE_CACHE_BYTES: usize = 256 << 20;

impl Store {
    /// Opens (or creates) the store `listener.fjall` in `dir`, with the default block
    /// cache ([`DEFAULT_STORE_CACHE_BYTES`]).
    pub fn open(
        dir: &Path,
        payload_head_bytes: usize,
        deadlines: Deadlines,
    ) -> Result<Store, StoreError> {
        Store::open_with_cache(
            dir,
            payload_head_bytes,
            deadlines,
            DEFAULT_STORE_CACHE_BYTES,
        )
    }

    /// Opens (or creates) the store `listener.fjall` in `dir`, its block cache bounded to
    /// `cache_bytes` (the process's memory grows up to about this much, and fjall's write
    /// buffers, on top of the in-flight cache). A `listener.redb` an earlier version wrote
    /// there is migrated first (`store/migrate.rs`).
    pub fn open_with_cache(
        dir: &Path,
        payload_head_bytes: usize,
        deadlines: Deadlines,
        cache_bytes: usize,
    ) -> Result<Store, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::open(dir, e))?;
        let path = dir.join(STORE_DIR);
        let engine = Engine::open(&path, cache_bytes).map_err(|e| StoreError::open(&path, e))?;
        migrate::from_redb(dir, &engine)?;
        let mut cache = Cache::new(DEFAULT_CACHE_MESSAGES);
        cache.saw(engine.newest_message()?);
        Ok(Store {
            db: RwLock::new(Some(engine)),
            path,
            io_failed: AtomicBool::new(false),
            cache_bytes,
            payload_head_bytes,
            deadlines,
            emit_trajectories: false,
            partitioned: false,
            cache: Mutex::new(cache),
        })
    }

    /// Makes [`Store::apply`] and [`Store::check_deadlines`] return the trajectories they
    /// changed (the listener turns this on when it exports traces).
    pub fn emit_trajectories(mut self, on: bool) -> Self {
        self.emit_trajectories = on;
        self
    }

    /// Makes every write also keep its counters per stage partition (`part/<NN>/<name>`,
    /// beside the plain names), as a member of a listener group does, so that a merged
    /// answer takes each partition's figures from one owner. Counters written while this
    /// was off (a single listener's, an older version's) stay in the plain names only: they
    /// are no partition's ("unpartitioned").
    pub fn partitioned(mut self, on: bool) -> Self {
        self.partitioned = on;
        self
    }

    /// Sets how many in-flight messages [`Store::apply`] keeps in memory (default
    /// [`DEFAULT_CACHE_MESSAGES`]; 0 keeps none and reads every touched message back).
    pub fn cache_capacity(self, messages: usize) -> Self {
        let mut cache = self.lock_cache();
        let newest = cache.newest();
        *cache = Cache::new(messages);
        cache.saw(newest);
        drop(cache);
        self
    }

    /// Where the store's bytes go, per keyspace: what a size analysis reads (the bench's
    /// examples print it). It flushes the write buffers first, so that what is stored is
    /// on disk and counted.
    pub fn storage(&self) -> Result<StorageReport, StoreError> {
        let db = self.db()?;
        let mut tables = Vec::new();
        let mut allocated = 0;
        for (name, ks) in db.ks.all() {
            ks.inner().rotate_memtable_and_wait()?;
            let bytes = ks.inner().disk_space();
            allocated += bytes;
            tables.push(TableUsage {
                name: name.to_owned(),
                entries: ks.approximate_len() as u64,
                stored_bytes: bytes,
                metadata_bytes: 0,
                fragmented_bytes: 0,
            });
        }
        let journal = db.db.inner().journal_disk_space()?;
        allocated += journal;
        tables.push(TableUsage {
            name: "journal".to_owned(),
            entries: db.db.journal_count() as u64,
            stored_bytes: journal,
            metadata_bytes: 0,
            fragmented_bytes: 0,
        });
        Ok(StorageReport {
            tables,
            allocated_bytes: allocated,
        })
    }

    /// The open database, for one operation: an error while [`Store::recover`] has not
    /// managed to open it again after an I/O error.
    pub(super) fn db(&self) -> Result<Db<'_>, StoreError> {
        let guard = self.db.read().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            return Err(StoreError::Closed {
                path: self.path.clone(),
            });
        }
        Ok(Db(guard))
    }

    /// Notes an error of a write: an I/O error (a full disk, a failing device) makes fjall
    /// refuse every later write until the database is opened again, which
    /// [`Store::recover`] does.
    fn note_error<T>(&self, r: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(e) = &r {
            if e.is_io() {
                self.io_failed.store(true, Ordering::Release);
            }
        }
        r
    }

    /// After a failed write: opens the database again if an I/O error requires it (the
    /// committed state is what the file holds; the in-flight cache only ever holds committed
    /// state, so it stays). Returns whether it reopened. Fails (and is called again later)
    /// while the database cannot be opened, e.g. while the old handle's background work
    /// still holds its lock or the disk is still full.
    pub fn recover(&self) -> Result<bool, StoreError> {
        if !self.io_failed.load(Ordering::Acquire) {
            return Ok(false);
        }
        // Writers hold the cache lock from before they begin until after they commit.
        let _writers = self.lock_cache();
        let mut db = self.db.write().unwrap_or_else(|e| e.into_inner());
        // Close the old handle first: fjall locks the directory while a handle is open.
        drop(db.take());
        let opened = Engine::open(&self.path, self.cache_bytes)
            .map_err(|e| StoreError::open(&self.path, e))?;
        *db = Some(opened);
        self.io_failed.store(false, Ordering::Release);
        tracing::info!(path = %self.path.display(), "store reopened after an I/O error");
        Ok(true)
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
        let r = self.apply_inner(records, now);
        self.note_error(r)
    }

    fn apply_inner(&self, records: Vec<StageRecord>, now: u64) -> Result<ApplyOutcome, StoreError> {
        let mut cache = self.lock_cache();
        let db = self.db()?;
        // A partitioned store applies each partition's records in a pass of its own, so
        // that its counters are that partition's (a group's stage batches hold one).
        let parts = self.split_by_partition(records);
        // A plain batch unless a client event's ring, or a later pass, must read back this
        // write's own changes (`store/tables.rs` says what the batch gives up).
        let mut t = if parts.len() > 1
            || parts
                .iter()
                .any(|(_, rs)| rs.iter().any(client_events::is_client_event))
        {
            Tables::begin(&db)
        } else {
            Tables::begin_batch(&db)
        };
        let mut out = ApplyOutcome::default();
        let mut staged = Vec::new();
        for (p, records) in parts {
            t.partition = p;
            let mut pass = apply::Pass::new(self, &mut t, &mut cache, now);
            staged.extend(pass.run(records)?);
            out.absorb(std::mem::take(&mut pass.out));
        }
        out.partition_counters = std::mem::take(&mut t.partition_deltas);
        t.commit()?;
        cache.put_all(staged);
        Ok(out)
    }

    /// The records by stage partition when the store is partitioned; else all of them as
    /// one group of no partition.
    fn split_by_partition(
        &self,
        records: Vec<StageRecord>,
    ) -> Vec<(Option<Partition>, Vec<StageRecord>)> {
        if !self.partitioned {
            return vec![(None, records)];
        }
        let mut by: BTreeMap<Partition, Vec<StageRecord>> = BTreeMap::new();
        for r in records {
            by.entry(Partition::of_record(&r)).or_default().push(r);
        }
        by.into_iter().map(|(p, rs)| (Some(p), rs)).collect()
    }

    /// Writes the state counts of `changes` (each with its message key) under each key's
    /// partition, when the store is partitioned; returns the changes by name.
    fn count_partition_states(
        &self,
        t: &mut Tables<'_>,
        changes: &[(String, StateDelta)],
    ) -> Result<BTreeMap<String, i64>, StoreError> {
        if !self.partitioned {
            return Ok(BTreeMap::new());
        }
        let mut by: BTreeMap<Partition, Vec<StateDelta>> = BTreeMap::new();
        for (key, change) in changes {
            if let Some(p) = MessageKey::partition_of(key) {
                by.entry(p).or_default().push(change.clone());
            }
        }
        for (p, changes) in by {
            let mut deltas = BTreeMap::new();
            t.count_states(&changes, &mut deltas)?;
            t.flush_partition(p, &deltas)?;
        }
        Ok(std::mem::take(&mut t.partition_deltas))
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
        let r = self.check_deadlines_inner(now, since, max);
        self.note_error(r)
    }

    fn check_deadlines_inner(
        &self,
        now: u64,
        since: u64,
        max: usize,
    ) -> Result<DeadlineOutcome, StoreError> {
        let (shortest, longest) = deadline_range(&self.deadlines);
        let cutoff = now.saturating_sub(shortest);
        let mut out = DeadlineOutcome::default();
        let mut cache = self.lock_cache();
        let mut changed: Vec<(String, MessageSummary)> = Vec::new();
        let db = self.db()?;
        let mut t = Tables::begin(&db);
        {
            let (candidates, truncated) = open_candidates(&t, since, cutoff, max)?;
            out.next_since = if truncated {
                since
            } else {
                now.saturating_sub(longest)
            };
            let opts = self.options(now);
            let mut keyed = Vec::new();
            for key in candidates {
                // The cache and the summaries name a message by its key's text form.
                let key = key.to_string();
                let (old, recs) = match cache.peek(&key) {
                    Some(c) => (c.summary, c.records),
                    None => (t.summary(&key)?, t.load_records(&key)?),
                };
                let before = out.state_changes.len();
                if let Some(new) = self.recheck(&mut t, &key, old, recs, &opts, &mut out)? {
                    changed.push((key.clone(), new));
                }
                keyed.extend(
                    out.state_changes[before..]
                        .iter()
                        .map(|c| (key.clone(), c.clone())),
                );
            }
            let mut deltas = out.counters.clone();
            t.count_states(&out.state_changes, &mut deltas)?;
            t.flush(&deltas)?;
            out.partition_counters = self.count_partition_states(&mut t, &keyed)?;
        }
        t.commit()?;
        for (key, new) in changed {
            cache.set_summary(&key, &new);
        }
        Ok(out)
    }

    /// One candidate of the deadline pass: its summary assembled anew at the pass's time;
    /// written (with its state change and, when emitted, its trajectory) if it differs.
    fn recheck(
        &self,
        t: &mut Tables<'_>,
        key: &str,
        old: Option<MessageSummary>,
        recs: Vec<StageRecord>,
        opts: &AssembleOptions,
        out: &mut DeadlineOutcome,
    ) -> Result<Option<MessageSummary>, StoreError> {
        let Some(old) = old else {
            return Ok(None);
        };
        let Some(traj) = self.assemble(recs, opts) else {
            return Ok(None);
        };
        let new = MessageSummary::of(key, &traj);
        if new == old {
            return Ok(None);
        }
        t.put_summary(Some(&old), &new)?;
        for (k, by) in crate::observe::stats::state_change(Some(&old), Some(&new)) {
            *out.counters.entry(CounterKey::Observed(k)).or_default() += by;
        }
        if topic_state(&new) != topic_state(&old) {
            out.state_changes
                .push((Some(topic_state(&old)), Some(topic_state(&new))));
        }
        if self.emit_trajectories {
            out.trajectories.push(traj);
        }
        Ok(Some(new))
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
        let r = self.enforce_retention_inner(now, max_age, max_bytes, max);
        self.note_error(r)
    }

    fn enforce_retention_inner(
        &self,
        now: u64,
        max_age: Option<Duration>,
        max_bytes: Option<u64>,
        max: usize,
    ) -> Result<RetentionOutcome, StoreError> {
        let mut out = RetentionOutcome::default();
        let mut cache = self.lock_cache();
        let db = self.db()?;
        let mut t = Tables::begin(&db);
        {
            let cutoff = max_age.map(|a| now.saturating_sub(a.as_nanos() as u64));
            let mut bytes = t.counter(COUNTER_BYTES)?;
            let target = max_bytes.map(|m| m / 10 * 9);
            let over = max_bytes.is_some_and(|m| bytes > m);
            let mut keyed = Vec::new();
            while (out.deleted as usize) < max {
                let Some((at, message)) = t.oldest()? else {
                    break;
                };
                let key = message.to_string();
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
                    t.remove_by_time(at, &message);
                }
                bytes = bytes.saturating_sub(freed);
                out.deleted += 1;
                out.bytes_freed += freed;
                if let Some(s) = summary {
                    for (k, by) in crate::observe::stats::state_change(Some(&s), None) {
                        *out.counters.entry(CounterKey::Observed(k)).or_default() += by;
                    }
                    out.state_changes.push((Some(topic_state(&s)), None));
                    keyed.push((key, (Some(topic_state(&s)), None)));
                }
            }
            if let Some(c) = cutoff {
                client_events::prune(&mut t, c)?;
            }
            let mut ignored = out.counters.clone();
            t.count_states(&out.state_changes, &mut ignored)?;
            t.bump(
                Counter::RetentionDeleted.into(),
                out.deleted as i64,
                &mut ignored,
            )?;
            t.flush(&ignored)?;
            out.partition_counters = self.count_partition_states(&mut t, &keyed)?;
            t.flush_requests()?;
        }
        t.commit()?;
        Ok(out)
    }
}

/// The store's directory in the data directory.
const STORE_DIR: &str = "listener.fjall";

/// The open database, borrowed for one operation ([`Store::db`]).
pub(super) struct Db<'a>(RwLockReadGuard<'a, Option<Engine>>);

impl std::ops::Deref for Db<'_> {
    type Target = Engine;

    fn deref(&self) -> &Engine {
        // Store::db hands one out only while the database is open.
        self.0
            .as_ref()
            .expect("Store::db checked that the database is open")
    }
}

/// The shortest and the longest of the deadlines, in nanoseconds.
fn deadline_range(d: &Deadlines) -> (u64, u64) {
    let all = [d.stored_ms, d.delivered_ms, d.acked_ms, d.processed_ms];
    let ms = |v: u64| v.saturating_mul(1_000_000);
    (
        ms(all.iter().copied().min().unwrap_or(0)),
        ms(all.iter().copied().max().unwrap_or(0)),
    )
}

/// The keys of open messages whose last record is in `[since, cutoff)`, at most `max`, and
/// whether there were more.
fn open_candidates(
    t: &Tables<'_>,
    since: u64,
    cutoff: u64,
    max: usize,
) -> Result<(Vec<MessageKey>, bool), StoreError> {
    const OPEN: [MessageState; 5] = [
        MessageState::Sent,
        MessageState::Enqueued,
        MessageState::Delivered,
        MessageState::Consuming,
        MessageState::Failed,
    ];
    let mut candidates = Vec::new();
    if since >= cutoff {
        return Ok((candidates, false));
    }
    for st in OPEN {
        let left = max - candidates.len();
        // One more than is left tells whether there were more.
        let mut found = t.in_state(state_code(st), since, cutoff, left + 1)?;
        if found.len() > left {
            found.truncate(left);
            candidates.extend(found);
            return Ok((candidates, true));
        }
        candidates.extend(found);
        if candidates.len() >= max {
            return Ok((candidates, true));
        }
    }
    Ok((candidates, false))
}
