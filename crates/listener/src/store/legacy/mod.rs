//! The store as it was on redb (tables `records_v3`, `summaries_v3`, …), kept for the tests
//! of the upgrade path only: it writes a store exactly as the last redb version did, which
//! [`super::Store::open`] must then migrate into fjall (`store/migrate.rs`). Frozen: nothing
//! but the upgrade tests uses it, and it is not compiled outside `cfg(test)`; what the tests
//! do not call is left as it was rather than trimmed (hence the allowances).
#![allow(dead_code, unreachable_pub)]

use super::{
    records, requests, ApplyOutcome, DeadlineOutcome, MessageKey, MessageSummary, RetentionOutcome,
    SearchQuery, StorageReport, TableUsage,
};
use crate::cache::{Cache, CacheStats, DEFAULT_CACHE_MESSAGES};
use crate::counters::Counter;
use crate::error::StoreError;
use crate::summary::{state_code, topic_state};
use base64::Engine;
use msgtrail_core::trajectory::{AssembleOptions, Deadlines, MessageState, Trajectory};
use msgtrail_core::StageRecord;
use redb::{Database, ReadableDatabase, ReadableTable, TableHandle};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::time::Duration;

mod apply;
pub(crate) mod client_events;
mod query;
pub(crate) mod tables;

use tables::Tables;
pub(crate) use tables::COUNTER_BYTES;

/// redb's page cache by default, bytes.
pub const DEFAULT_STORE_CACHE_BYTES: usize = 1 << 30;

/// The embedded store. Cheap to share behind an `Arc`; every method blocks on disk I/O,
/// so async code calls it through `spawn_blocking`.
pub struct Store {
    /// The open database: `None` only while [`Store::recover`] reopens it after an I/O
    /// error (redb refuses every operation after one until it is opened again).
    db: RwLock<Option<Database>>,
    /// The database file, to open it again.
    path: PathBuf,
    /// Set when an operation failed with an I/O error: [`Store::recover`] reopens then.
    io_failed: AtomicBool,
    /// redb's page cache, bytes (kept to open the database again the same way).
    cache_bytes: usize,
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

impl Store {
    /// Opens (or creates) the store file `listener.redb` in `dir`, with the default page
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

    /// Opens (or creates) the store file `listener.redb` in `dir`, its page cache bounded to
    /// `cache_bytes` (redb fills it as it reads and writes pages; the process's memory grows
    /// up to about this much on top of the in-flight cache).
    pub fn open_with_cache(
        dir: &Path,
        payload_head_bytes: usize,
        deadlines: Deadlines,
        cache_bytes: usize,
    ) -> Result<Store, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::open(dir, e))?;
        let path = dir.join("listener.redb");
        let db = open_db(&path, cache_bytes).map_err(|e| StoreError::open(&path, e))?;
        // Create every table up front so read transactions never meet a missing one.
        let tx = db.begin_write()?;
        drop(Tables::open(&tx)?);
        tx.commit()?;
        Ok(Store {
            db: RwLock::new(Some(db)),
            path,
            io_failed: AtomicBool::new(false),
            cache_bytes,
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

    /// Where the store's bytes go, per table: what a size analysis reads (the bench's
    /// examples print it).
    pub fn storage(&self) -> Result<StorageReport, StoreError> {
        use redb::ReadableTableMetadata;
        let tx = self.db()?.begin_read()?;
        let mut tables = Vec::new();
        for handle in tx.list_tables()? {
            let table = tx.open_untyped_table(handle.clone())?;
            let stats = table.stats()?;
            tables.push(TableUsage {
                name: handle.name().to_owned(),
                entries: table.len()?,
                stored_bytes: stats.stored_bytes(),
                metadata_bytes: stats.metadata_bytes(),
                fragmented_bytes: stats.fragmented_bytes(),
            });
        }
        drop(tx);
        let tx = self.db()?.begin_write()?;
        let stats = tx.stats()?;
        tx.abort()?;
        Ok(StorageReport {
            tables,
            allocated_bytes: stats.allocated_pages() * stats.page_size() as u64,
        })
    }

    /// The open database, for one operation: an error while [`Store::recover`] has not
    /// managed to open it again after an I/O error.
    pub(crate) fn db(&self) -> Result<Db<'_>, StoreError> {
        let guard = self.db.read().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            return Err(StoreError::Closed {
                path: self.path.clone(),
            });
        }
        Ok(Db(guard))
    }

    /// Notes an error of a write: an I/O error (a full disk, a failing device) makes redb
    /// refuse every later operation until the database is opened again, which
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
    /// while the file cannot be opened, e.g. while a transaction of the old handle is still
    /// alive or the disk is still full.
    pub fn recover(&self) -> Result<bool, StoreError> {
        if !self.io_failed.load(Ordering::Acquire) {
            return Ok(false);
        }
        // Writers hold the cache lock from before they begin until after they commit.
        let _writers = self.lock_cache();
        let mut db = self.db.write().unwrap_or_else(|e| e.into_inner());
        // Close the old handle first: redb locks the file while a handle is open.
        drop(db.take());
        let opened =
            open_db(&self.path, self.cache_bytes).map_err(|e| StoreError::open(&self.path, e))?;
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
        let tx = self.db()?.begin_write()?;
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
        let tx = self.db()?.begin_write()?;
        {
            let mut t = Tables::open(&tx)?;
            let (candidates, truncated) = open_candidates(&t, since, cutoff, max)?;
            out.next_since = if truncated {
                since
            } else {
                now.saturating_sub(longest)
            };
            let opts = self.options(now);
            for key in candidates {
                let (old, recs) = match cache.peek(&key) {
                    Some(c) => (c.summary, c.records),
                    None => (t.summary(&key)?, t.load_records(&key)?),
                };
                if let Some(new) = self.recheck(&mut t, &key, old, recs, &opts, &mut out)? {
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
        let tx = self.db()?.begin_write()?;
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
                    (at, key.to_vec())
                });
                let Some((at, stored)) = first else { break };
                let key = tables::key_text(&stored)?;
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
                    t.by_time.remove((at, stored.as_slice()))?;
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
            t.flush_requests()?;
        }
        tx.commit()?;
        Ok(out)
    }
}

/// Opens (or creates) the database file at `path` with a page cache of `cache_bytes`.
fn open_db(path: &Path, cache_bytes: usize) -> Result<Database, redb::DatabaseError> {
    Database::builder().set_cache_size(cache_bytes).create(path)
}

/// The open database, borrowed for one operation ([`Store::db`]).
pub(crate) struct Db<'a>(RwLockReadGuard<'a, Option<Database>>);

impl std::ops::Deref for Db<'_> {
    type Target = Database;

    fn deref(&self) -> &Database {
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
) -> Result<(Vec<String>, bool), StoreError> {
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
        let code = state_code(st);
        for item in t
            .by_state
            .range((code, since, &[][..])..(code, cutoff, &[][..]))?
        {
            let (k, _) = item?;
            candidates.push(tables::key_text(k.value().2)?);
            if candidates.len() >= max {
                return Ok((candidates, true));
            }
        }
    }
    Ok((candidates, false))
}
