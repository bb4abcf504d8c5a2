//! The store's keyspaces and the operations one write transaction does on them
//! ([`Tables`]): record chunks and summaries, their indexes, request-ID links and counters.
//!
//! Every key is built here ([`keys`]). A [`Tables`] writes through one [`Writer`]: a fjall
//! write transaction (it reads its own writes) or a plain write batch (reads see the store as
//! committed before it began). Either is committed as one atomic batch across the keyspaces
//! and persisted ([`fjall::PersistMode::SyncAll`]) before [`Tables::commit`] returns.
//!
//! What the transaction gives that a batch does not, and how a batch does without it:
//! - *Reading its own writes.* Counters are kept by [`Tables`] itself (read once, written
//!   once at commit) and request rows too ([`Tables::flush_requests`]); applying a batch
//!   reads every message before it writes it and writes each key at most once, so it needs
//!   no more. Only the client-event rings ([`super::client_events`]) and retention read back
//!   what they wrote: they use the transaction.
//! - *Exclusion of other writers.* The store has one writer at a time: every write holds the
//!   store's cache lock from before it begins until after it commits.
//! - *Repeatable reads.* A batch reads through a snapshot taken when it begins.

use super::engine::{Engine, Keyspaces};
use super::key::StoredKey;
use super::requests::RequestEntry;
use super::{records, Deltas, MessageKey};
use crate::cache::Cached;
use crate::counters::{partition_counter, Counter, CounterKey};
use crate::error::StoreError;
use crate::summary::{state_code, MessageSummary, StateDelta};
use fjall::{
    Guard, Iter, OwnedWriteBatch as WriteBatch, PersistMode, Readable, SingleWriterTxKeyspace,
    SingleWriterWriteTx, Snapshot, UserValue,
};
use foldhash::HashMap;
use msgtrail_core::partition::Partition;
use msgtrail_core::{MessageId, StageRecord};
use std::collections::{BTreeMap, BTreeSet};

/// Counter name: bytes of stored records (keys and values), what size retention measures.
pub(crate) const COUNTER_BYTES: &str = "bytes";

/// The keys of every keyspace. Strings are length-prefixed (u16, big-endian) so that one
/// never runs into the next field; times are big-endian so that keys sort by time.
pub(super) mod keys {
    fn string(out: &mut Vec<u8>, s: &str) {
        let b = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
        out.extend_from_slice(&(b.len() as u16).to_be_bytes());
        out.extend_from_slice(b);
    }

    /// `records`: stored key · chunk number (u32): a message's chunks are one prefix scan,
    /// in the order they were appended.
    pub(in crate::store) fn record(key: &[u8], chunk: u32) -> Vec<u8> {
        let mut k = Vec::with_capacity(key.len() + 4);
        k.extend_from_slice(key);
        k.extend_from_slice(&chunk.to_be_bytes());
        k
    }

    /// Whether a key found by the prefix scan of `key` is one of `key`'s chunks (an orphan
    /// key may be the prefix of a longer one; every record key is its message key and 4
    /// bytes, so the length tells them apart).
    pub(in crate::store) fn is_chunk_of(found: &[u8], key: &[u8]) -> bool {
        found.len() == key.len() + 4
    }

    /// The chunk number of a record key.
    pub(in crate::store) fn chunk_of(found: &[u8]) -> u32 {
        let n = found.len();
        u32::from_be_bytes(found[n - 4..].try_into().expect("4 bytes"))
    }

    /// `requests`: request ID · producer.
    pub(in crate::store) fn request(request: &str, producer: &str) -> Vec<u8> {
        let mut k = Vec::with_capacity(4 + request.len() + producer.len());
        string(&mut k, request);
        k.extend_from_slice(producer.as_bytes());
        k
    }

    /// The prefix of every `requests` key of one request ID.
    pub(in crate::store) fn request_prefix(request: &str) -> Vec<u8> {
        let mut k = Vec::with_capacity(2 + request.len());
        string(&mut k, request);
        k
    }

    /// The producer of a `requests` key.
    pub(in crate::store) fn producer_of(k: &[u8]) -> Option<&str> {
        let n = u16::from_be_bytes(k.get(..2)?.try_into().ok()?) as usize;
        std::str::from_utf8(k.get(2 + n..)?).ok()
    }

    /// `by_topic`: topic · first time · stored key.
    pub(in crate::store) fn by_topic(topic: &str, at: u64, key: &[u8]) -> Vec<u8> {
        let mut k = topic_bound(topic, at);
        k.extend_from_slice(key);
        k
    }

    /// The `by_topic` keys of `topic` from `at` on start here.
    pub(in crate::store) fn topic_bound(topic: &str, at: u64) -> Vec<u8> {
        let mut k = Vec::with_capacity(2 + topic.len() + 8 + 17);
        string(&mut k, topic);
        k.extend_from_slice(&at.to_be_bytes());
        k
    }

    /// The stored key of a `by_topic` key.
    pub(in crate::store) fn topic_key_of(k: &[u8]) -> Option<&[u8]> {
        let n = u16::from_be_bytes(k.get(..2)?.try_into().ok()?) as usize;
        k.get(2 + n + 8..)
    }

    /// `by_state`: state code · last time · stored key.
    pub(in crate::store) fn by_state(code: u8, at: u64, key: &[u8]) -> Vec<u8> {
        let mut k = state_bound(code, at);
        k.extend_from_slice(key);
        k
    }

    /// The `by_state` keys of state `code` from `at` on start here.
    pub(in crate::store) fn state_bound(code: u8, at: u64) -> Vec<u8> {
        let mut k = Vec::with_capacity(9 + 17);
        k.push(code);
        k.extend_from_slice(&at.to_be_bytes());
        k
    }

    /// (time, stored key) of a `by_state` or `by_time` key: `skip` bytes before the time.
    pub(in crate::store) fn timed(k: &[u8], skip: usize) -> Option<(u64, &[u8])> {
        let at = u64::from_be_bytes(k.get(skip..skip + 8)?.try_into().ok()?);
        Some((at, k.get(skip + 8..)?))
    }

    /// `by_time`: first time · stored key.
    pub(in crate::store) fn by_time(at: u64, key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(8 + key.len());
        k.extend_from_slice(&at.to_be_bytes());
        k.extend_from_slice(key);
        k
    }

    /// `client_events`: client · time · fingerprint.
    pub(in crate::store) fn event(client: &str, at: u64, fp: u64) -> Vec<u8> {
        let mut k = event_prefix(client);
        k.extend_from_slice(&at.to_be_bytes());
        k.extend_from_slice(&fp.to_be_bytes());
        k
    }

    /// The prefix of one client's `client_events` keys.
    pub(in crate::store) fn event_prefix(client: &str) -> Vec<u8> {
        let mut k = Vec::with_capacity(2 + client.len() + 16);
        string(&mut k, client);
        k
    }
}

/// A counter's stored value.
pub(super) fn counter_value(v: &[u8]) -> Result<u64, StoreError> {
    v.try_into()
        .map(u64::from_be_bytes)
        .map_err(|_| StoreError::bad_value(format!("counter value {v:02x?}")))
}

/// The stored form of a key the store itself wrote (its text form always parses).
pub(super) fn stored(key: &str) -> Result<StoredKey, StoreError> {
    StoredKey::parse(key).map_err(corrupt)
}

/// The text form of a stored key read from a keyspace.
pub(super) fn key_text(bytes: &[u8]) -> Result<String, StoreError> {
    StoredKey::text(bytes).map_err(corrupt)
}

pub(super) fn orphan_key(producer: &str, request_id: &str) -> String {
    MessageKey::orphan(producer, request_id).to_string()
}

/// A stored value that failed to decode, the decode error kept as its cause.
pub(super) fn corrupt(e: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::corrupt("stored value", e)
}

/// A request ID's row as a transaction read or changed it.
#[derive(Debug, Default)]
struct RequestRow {
    entry: RequestEntry,
    /// Changed since read: written back by [`Tables::flush_requests`].
    dirty: bool,
}

/// The message a record without message ID (a P1: the producer does not know it yet)
/// belongs to, among the messages stored under its request ID: the one whose ID the broker
/// assigned nearest the record's time (the earlier on a tie). Uploads that were stored apart
/// are a dedup window apart, while an upload's own attempts lie within moments of its P2.
pub(super) fn nearest(set: &BTreeSet<MessageId>, at: u64) -> Option<MessageId> {
    set.iter()
        .copied()
        .min_by_key(|m| (m.unix_millis().saturating_mul(1_000_000).abs_diff(at), *m))
}

/// How a [`Tables`] writes (see the module documentation for what each gives).
pub(super) enum Writer<'t> {
    /// A write transaction: reads see its own writes.
    Tx(SingleWriterWriteTx<'t>),
    /// A plain write batch: reads see `snapshot`, the store as it was when it began.
    Batch {
        /// What reads see.
        snapshot: Snapshot,
        /// The writes, applied at commit.
        batch: WriteBatch,
    },
}

impl Writer<'_> {
    fn get(
        &self,
        ks: &SingleWriterTxKeyspace,
        key: &[u8],
    ) -> Result<Option<UserValue>, StoreError> {
        Ok(match self {
            Writer::Tx(tx) => tx.get(ks, key)?,
            Writer::Batch { snapshot, .. } => snapshot.get(ks, key)?,
        })
    }

    fn prefix(&self, ks: &SingleWriterTxKeyspace, prefix: &[u8]) -> Iter {
        match self {
            Writer::Tx(tx) => tx.prefix(ks, prefix),
            Writer::Batch { snapshot, .. } => snapshot.prefix(ks, prefix),
        }
    }

    fn range(&self, ks: &SingleWriterTxKeyspace, range: std::ops::Range<Vec<u8>>) -> Iter {
        match self {
            Writer::Tx(tx) => tx.range(ks, range),
            Writer::Batch { snapshot, .. } => snapshot.range(ks, range),
        }
    }

    fn first_key_value(&self, ks: &SingleWriterTxKeyspace) -> Option<Guard> {
        match self {
            Writer::Tx(tx) => tx.first_key_value(ks),
            Writer::Batch { snapshot, .. } => snapshot.first_key_value(ks),
        }
    }

    fn insert(
        &mut self,
        ks: &SingleWriterTxKeyspace,
        key: impl Into<fjall::UserKey>,
        value: impl Into<UserValue>,
    ) {
        match self {
            Writer::Tx(tx) => tx.insert(ks, key, value),
            Writer::Batch { batch, .. } => batch.insert(ks.inner(), key, value),
        }
    }

    fn remove(&mut self, ks: &SingleWriterTxKeyspace, key: impl Into<fjall::UserKey>) {
        match self {
            Writer::Tx(tx) => tx.remove(ks, key),
            Writer::Batch { batch, .. } => batch.remove(ks.inner(), key),
        }
    }
}

/// One write (a transaction or a batch, [`Writer`]) over the keyspaces.
pub(super) struct Tables<'t> {
    tx: Writer<'t>,
    pub(super) ks: &'t Keyspaces,
    /// The counters this write read or set, by name: read once, written once at commit.
    counters: HashMap<String, u64>,
    /// The request rows this transaction read or changed, by (request ID, producer): every
    /// request operation goes through them, and the changed ones are written once, by
    /// [`Tables::flush_requests`], which every transaction that changes them calls before
    /// it commits (applying a batch, retention).
    request_rows: HashMap<(String, String), RequestRow>,
    /// The stage partition the counters flushed now belong to (a group member's store,
    /// [`super::Store::partitioned`]): [`Tables::flush`] then also writes them under
    /// `part/<NN>/` and notes the change in `partition_deltas`.
    pub(super) partition: Option<Partition>,
    /// The per-partition counter changes this write made, by name, for the statistics.
    pub(super) partition_deltas: BTreeMap<String, i64>,
}

impl<'t> Tables<'t> {
    /// Begins a write transaction, which reads its own writes (the engine has one writer at
    /// a time).
    pub(super) fn begin(engine: &'t Engine) -> Self {
        Tables::with(
            engine,
            Writer::Tx(engine.db.write_tx().durability(Some(PersistMode::SyncAll))),
        )
    }

    /// Begins a plain write batch: reads see the store as committed now, never this write's
    /// own changes (see the module documentation). The caller holds the store's cache lock,
    /// which makes it the only writer.
    pub(super) fn begin_batch(engine: &'t Engine) -> Self {
        let batch = engine
            .db
            .inner()
            .batch()
            .durability(Some(PersistMode::SyncAll));
        let snapshot = engine.db.read_tx();
        Tables::with(engine, Writer::Batch { snapshot, batch })
    }

    fn with(engine: &'t Engine, tx: Writer<'t>) -> Self {
        Tables {
            tx,
            ks: &engine.ks,
            counters: HashMap::default(),
            request_rows: HashMap::default(),
            partition: None,
            partition_deltas: BTreeMap::new(),
        }
    }

    /// Commits: one atomic batch across the keyspaces, on disk (fsynced) when this returns.
    pub(super) fn commit(mut self) -> Result<(), StoreError> {
        for (name, v) in std::mem::take(&mut self.counters) {
            self.tx
                .insert(&self.ks.counters, name, v.to_be_bytes().as_slice());
        }
        match self.tx {
            Writer::Tx(tx) => tx.commit()?,
            Writer::Batch { batch, .. } => batch.commit()?,
        }
        Ok(())
    }

    /// The transaction, for the modules that read back what they wrote in their own
    /// keyspaces ([`super::client_events`]); `None` for a batch.
    pub(super) fn tx(&mut self) -> Option<&mut SingleWriterWriteTx<'t>> {
        match &mut self.tx {
            Writer::Tx(tx) => Some(tx),
            Writer::Batch { .. } => None,
        }
    }

    /// A counter's value as this write sees it.
    pub(super) fn counter(&mut self, name: &str) -> Result<u64, StoreError> {
        if let Some(v) = self.counters.get(name) {
            return Ok(*v);
        }
        let v = match self.tx.get(&self.ks.counters, name.as_bytes())? {
            Some(v) => counter_value(&v)?,
            None => 0,
        };
        self.counters.insert(name.to_owned(), v);
        Ok(v)
    }

    fn set_counter(&mut self, name: &str, v: u64) {
        match self.counters.get_mut(name) {
            Some(c) => *c = v,
            None => {
                self.counters.insert(name.to_owned(), v);
            }
        }
    }

    pub(super) fn bump(
        &mut self,
        key: CounterKey,
        by: i64,
        out: &mut Deltas,
    ) -> Result<(), StoreError> {
        // Deltas gather in `out` and reach the keyspace once per transaction (`flush`).
        if by != 0 {
            *out.entry(key).or_default() += by;
        }
        Ok(())
    }

    /// Bumps a counter both globally and within `topic`.
    pub(super) fn bump_both(
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
    pub(super) fn count_states(
        &mut self,
        changes: &[StateDelta],
        out: &mut Deltas,
    ) -> Result<(), StoreError> {
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

    pub(super) fn flush(&mut self, deltas: &Deltas) -> Result<(), StoreError> {
        for (key, by) in deltas {
            let name = key.to_string();
            let cur = self.counter(&name)?;
            self.set_counter(&name, cur.saturating_add_signed(*by));
        }
        match self.partition {
            Some(p) => self.flush_partition(p, deltas),
            None => Ok(()),
        }
    }

    /// Writes `deltas` under partition `p`'s names only (`part/<NN>/<name>`).
    pub(super) fn flush_partition(
        &mut self,
        p: Partition,
        deltas: &Deltas,
    ) -> Result<(), StoreError> {
        for (key, by) in deltas {
            let name = partition_counter(p, &key.to_string());
            let cur = self.counter(&name)?;
            self.set_counter(&name, cur.saturating_add_signed(*by));
            *self.partition_deltas.entry(name).or_default() += by;
        }
        Ok(())
    }

    pub(super) fn sub_bytes(&mut self, by: u64) -> Result<(), StoreError> {
        let cur = self.counter(COUNTER_BYTES)?;
        self.set_counter(COUNTER_BYTES, cur.saturating_sub(by));
        Ok(())
    }

    /// The row of (request ID, producer) as this transaction has it: read once, then kept.
    /// A row of a store written before the messages were kept has only the link: the
    /// message it names is taken into the row.
    fn request_row(
        &mut self,
        request: &str,
        producer: &str,
    ) -> Result<&mut RequestRow, StoreError> {
        let k = (request.to_owned(), producer.to_owned());
        if !self.request_rows.contains_key(&k) {
            let mut row = RequestRow {
                entry: match self
                    .tx
                    .get(&self.ks.requests, &keys::request(request, producer))?
                {
                    Some(v) => RequestEntry::decode(&v)?,
                    None => RequestEntry::default(),
                },
                dirty: false,
            };
            if row.entry.messages.is_empty() {
                if let Some(Ok(m)) = row.entry.link.as_ref().map(|l| l.parse::<MessageId>()) {
                    row.entry.messages.insert(m);
                    row.dirty = true;
                }
            }
            self.request_rows.insert(k.clone(), row);
        }
        Ok(self.request_rows.get_mut(&k).expect("just inserted"))
    }

    /// The message key (request ID, producer) is linked to.
    pub(super) fn link(
        &mut self,
        request: &str,
        producer: &str,
    ) -> Result<Option<String>, StoreError> {
        Ok(self.request_row(request, producer)?.entry.link.clone())
    }

    /// Links (request ID, producer) to a message key.
    pub(super) fn set_link(
        &mut self,
        request: &str,
        producer: &str,
        key: String,
    ) -> Result<(), StoreError> {
        let row = self.request_row(request, producer)?;
        row.entry.link = Some(key);
        row.dirty = true;
        Ok(())
    }

    /// The messages stored under (request ID, producer), in upload order.
    pub(super) fn messages_of(
        &mut self,
        request: &str,
        producer: &str,
    ) -> Result<&BTreeSet<MessageId>, StoreError> {
        Ok(&self.request_row(request, producer)?.entry.messages)
    }

    /// Records that a message is stored under (request ID, producer).
    pub(super) fn add_message(
        &mut self,
        request: &str,
        producer: &str,
        m: MessageId,
    ) -> Result<(), StoreError> {
        let row = self.request_row(request, producer)?;
        row.dirty |= row.entry.messages.insert(m);
        Ok(())
    }

    /// Writes the request rows this transaction changed (a row left empty is removed).
    pub(super) fn flush_requests(&mut self) -> Result<(), StoreError> {
        for ((request, producer), row) in &mut self.request_rows {
            if !row.dirty {
                continue;
            }
            let k = keys::request(request, producer);
            if row.entry.is_empty() {
                self.tx.remove(&self.ks.requests, k);
            } else {
                self.tx
                    .insert(&self.ks.requests, k, row.entry.encode()?.as_slice());
            }
            row.dirty = false;
        }
        Ok(())
    }

    /// A message's records, as this transaction sees them.
    pub(super) fn load_records(&self, key: &str) -> Result<Vec<StageRecord>, StoreError> {
        Ok(self.load_cached_records(key)?.records)
    }

    /// A message's record chunks: every record, their bytes and the chunk count.
    fn load_cached_records(&self, key: &str) -> Result<Cached, StoreError> {
        let sk = stored(key)?;
        let mut c = Cached::default();
        // Every message with records has chunk 0 (chunks are numbered from 0 and a rewrite
        // starts again at 0), so one point read — which the engine's bloom filters answer
        // mostly without touching a table — tells a message new to the store apart, and most
        // messages a batch touches are new: a prefix scan builds an iterator over every
        // memtable and table first.
        if self
            .tx
            .get(&self.ks.records, &keys::record(sk.as_bytes(), 0))?
            .is_none()
        {
            return Ok(c);
        }
        for item in self.tx.prefix(&self.ks.records, sk.as_bytes()) {
            let (k, v) = item.into_inner()?;
            if !keys::is_chunk_of(&k, sk.as_bytes()) {
                continue;
            }
            c.bytes += (k.len() + v.len()) as u64;
            c.chunks = c.chunks.max(keys::chunk_of(&k) + 1);
            c.records.extend(records::decode(&v).map_err(corrupt)?);
        }
        Ok(c)
    }

    /// Writes what a message gained: the records from `from` on as one new chunk, appended
    /// (nothing stored is rewritten), or — when the message gave records away (`rewrite`)
    /// — all of them as one chunk in place of the old ones (a message left without records
    /// has none). Returns the change in stored bytes.
    pub(super) fn put_records(
        &mut self,
        key: &str,
        c: &mut Cached,
        from: usize,
        rewrite: bool,
    ) -> Result<i64, StoreError> {
        let old = c.bytes as i64;
        let sk = stored(key)?;
        let sk = sk.as_bytes();
        let new = if rewrite {
            &c.records[..]
        } else {
            &c.records[from.min(c.records.len())..]
        };
        if rewrite {
            // The new chunk 0 (if any) replaces the old one: a write removes and inserts the
            // same key at most once.
            let kept = u32::from(!new.is_empty());
            for n in kept..c.chunks {
                self.tx.remove(&self.ks.records, keys::record(sk, n));
            }
            c.chunks = 0;
            c.bytes = 0;
        }
        // When the new chunk holds every record of the message (a message new to the store,
        // or rewritten), its bytes are the cache's stored form too: kept, not encoded again.
        let whole = new.len() == c.records.len();
        c.encoded = None;
        if !new.is_empty() {
            let v = records::encode(new);
            let k = keys::record(sk, c.chunks);
            c.bytes += (k.len() + v.len()) as u64;
            if whole {
                c.encoded = Some(v.clone());
            }
            self.tx.insert(&self.ks.records, k, v);
            c.chunks += 1;
        }
        Ok(c.bytes as i64 - old)
    }

    pub(super) fn summary(&self, key: &str) -> Result<Option<MessageSummary>, StoreError> {
        match self.tx.get(&self.ks.summaries, stored(key)?.as_bytes())? {
            Some(v) => Ok(Some(MessageSummary::decode(key, &v).map_err(corrupt)?)),
            None => Ok(None),
        }
    }

    pub(super) fn unindex(&mut self, s: &MessageSummary) -> Result<(), StoreError> {
        let key = stored(&s.key)?;
        let key = key.as_bytes();
        let topic = s.topic.as_deref().unwrap_or("");
        self.tx
            .remove(&self.ks.by_topic, keys::by_topic(topic, s.first_at, key));
        self.tx.remove(
            &self.ks.by_state,
            keys::by_state(state_code(s.state), s.last_at, key),
        );
        self.tx
            .remove(&self.ks.by_time, keys::by_time(s.first_at, key));
        Ok(())
    }

    /// Writes a message's summary and moves its index entries; returns the bytes written.
    pub(super) fn put_summary(
        &mut self,
        old: Option<&MessageSummary>,
        new: &MessageSummary,
    ) -> Result<Vec<u8>, StoreError> {
        let key = stored(&new.key)?;
        let key = key.as_bytes();
        // Touch only the index entries whose key changed: most changes move `last_at`
        // (and sometimes the state), rarely the topic or the first time.
        fn topic(s: &MessageSummary) -> (&str, u64) {
            (s.topic.as_deref().unwrap_or_default(), s.first_at)
        }
        let same_topic = old.is_some_and(|o| topic(o) == topic(new));
        let same_state = old.is_some_and(|o| (o.state, o.last_at) == (new.state, new.last_at));
        if let Some(o) = old {
            if !same_topic {
                let (t, at) = topic(o);
                self.tx
                    .remove(&self.ks.by_topic, keys::by_topic(t, at, key));
                self.tx.remove(&self.ks.by_time, keys::by_time(at, key));
            }
            if !same_state {
                self.tx.remove(
                    &self.ks.by_state,
                    keys::by_state(state_code(o.state), o.last_at, key),
                );
            }
        }
        if !same_topic {
            let (t, at) = topic(new);
            self.tx
                .insert(&self.ks.by_topic, keys::by_topic(t, at, key), []);
            self.tx.insert(&self.ks.by_time, keys::by_time(at, key), []);
        }
        if !same_state {
            self.tx.insert(
                &self.ks.by_state,
                keys::by_state(state_code(new.state), new.last_at, key),
                [],
            );
        }
        let value = new.encode();
        self.tx.insert(&self.ks.summaries, key, value.as_slice());
        Ok(value)
    }

    /// Reads a message as the cache holds it: its records, their dedup keys, size and chunk
    /// count, its summary.
    pub(super) fn load_cached(&self, key: &str) -> Result<Cached, StoreError> {
        let mut c = self.load_cached_records(key)?;
        c.dedup_keys = c.records.iter().map(records::dedup_hash).collect();
        c.summary = self.summary(key)?;
        Ok(c)
    }

    /// Deletes a message the cache held (its chunks are known, nothing is read back);
    /// returns (bytes freed, its summary).
    pub(super) fn delete_known(
        &mut self,
        key: &str,
        c: Cached,
    ) -> Result<(u64, Option<MessageSummary>), StoreError> {
        let sk = stored(key)?;
        for n in 0..c.chunks {
            self.tx
                .remove(&self.ks.records, keys::record(sk.as_bytes(), n));
        }
        self.delete_summary(key, c.summary.as_ref())?;
        self.sub_bytes(c.bytes)?;
        Ok((c.bytes, c.summary))
    }

    pub(super) fn delete_summary(
        &mut self,
        key: &str,
        s: Option<&MessageSummary>,
    ) -> Result<(), StoreError> {
        if let Some(s) = s {
            self.unindex(s)?;
            let sk = stored(key)?;
            self.tx.remove(&self.ks.summaries, sk.as_bytes());
            if let (Some(p), Some(r)) = (&s.producer, &s.request_id) {
                let row = self.request_row(r.as_str(), p.as_str())?;
                if row.entry.link.as_deref() == Some(key) {
                    row.entry.link = None;
                    row.dirty = true;
                }
                if let Some(m) = s.message_id {
                    row.dirty |= row.entry.messages.remove(&m);
                }
            }
        }
        Ok(())
    }

    /// Deletes a message entirely; returns (bytes freed, its summary).
    pub(super) fn delete_message(
        &mut self,
        key: &str,
    ) -> Result<(u64, Option<MessageSummary>), StoreError> {
        let c = self.load_cached_records(key)?;
        let freed = c.bytes;
        let sk = stored(key)?;
        for n in 0..c.chunks {
            self.tx
                .remove(&self.ks.records, keys::record(sk.as_bytes(), n));
        }
        let summary = self.summary(key)?;
        self.delete_summary(key, summary.as_ref())?;
        self.sub_bytes(freed)?;
        Ok((freed, summary))
    }

    /// The oldest `by_time` entry: (first time, message key); a stored key that is not one
    /// is a corrupt value.
    pub(super) fn oldest(&self) -> Result<Option<(u64, MessageKey)>, StoreError> {
        let Some(g) = self.tx.first_key_value(&self.ks.by_time) else {
            return Ok(None);
        };
        let k = g.key()?;
        let (at, key) =
            keys::timed(&k, 0).ok_or_else(|| StoreError::bad_value(format!("by_time {k:02x?}")))?;
        Ok(Some((at, MessageKey::from_stored(key).map_err(corrupt)?)))
    }

    /// Removes a `by_time` entry: `key`'s, first seen `at`.
    pub(super) fn remove_by_time(&mut self, at: u64, key: &MessageKey) {
        let key = key.to_stored();
        self.tx
            .remove(&self.ks.by_time, keys::by_time(at, key.as_bytes()));
    }

    /// The keys of messages in state `code` whose last record is in `[since, cutoff)`, in
    /// that order, at most `max`.
    pub(super) fn in_state(
        &self,
        code: u8,
        since: u64,
        cutoff: u64,
        max: usize,
    ) -> Result<Vec<MessageKey>, StoreError> {
        let mut out = Vec::new();
        let range = keys::state_bound(code, since)..keys::state_bound(code, cutoff);
        for item in self.tx.range(&self.ks.by_state, range) {
            if out.len() >= max {
                break;
            }
            let k = item.key()?;
            let (_, key) = keys::timed(&k, 1)
                .ok_or_else(|| StoreError::bad_value(format!("by_state {k:02x?}")))?;
            out.push(MessageKey::from_stored(key).map_err(corrupt)?);
        }
        Ok(out)
    }
}
