//! The store's tables and the operations one write transaction does on them ([`Tables`]):
//! rows of records and summaries, their indexes, request-ID links and counters.

use crate::cache::Cached;
use crate::counters::{Counter, CounterKey};
use crate::error::StoreError;
use crate::store::key::StoredKey;
use crate::store::requests::RequestEntry;
use crate::store::{records, Deltas, MessageKey};
use crate::summary::{state_code, MessageSummary, StateDelta};
use foldhash::HashMap;
use msgtrail_core::trajectory::MessageState;
use msgtrail_core::{MessageId, StageRecord};
use redb::{ReadableTable, Table};
use std::collections::BTreeSet;

/// Counter name: bytes of stored records (keys and values), what size retention measures.
pub(crate) const COUNTER_BYTES: &str = "bytes";

// Message keys are in their stored form ([`StoredKey`]), states as their stored codes
// ([`state_code`]), a request's messages as 16-byte IDs: fixed-width where they can be, and
// a third of the text forms' size.

pub(super) use crate::store::migrate::{
    BY_STATE, BY_TIME, BY_TOPIC, COUNTERS, RECORDS, REQUESTS, SUMMARIES,
};

/// The stored form of a key the store itself wrote (its text form always parses).
pub(super) fn stored(key: &str) -> Result<StoredKey, StoreError> {
    StoredKey::parse(key).map_err(corrupt)
}

/// The text form of a stored key read from a table.
pub(super) fn key_text(bytes: &[u8]) -> Result<String, StoreError> {
    StoredKey::text(bytes).map_err(corrupt)
}

/// The `by_state` rows of one state whose last time is at or after `since`.
pub(super) fn state_range(
    st: MessageState,
    since: u64,
) -> std::ops::Range<(u8, u64, &'static [u8])> {
    let c = state_code(st);
    (c, since, &[][..])..(c + 1, 0, &[][..])
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

pub(super) struct Tables<'t> {
    pub(super) records: Table<'t, &'static [u8], &'static [u8]>,
    pub(super) summaries: Table<'t, &'static [u8], &'static [u8]>,
    pub(super) requests: Table<'t, (&'static str, &'static str), &'static [u8]>,
    pub(super) by_topic: Table<'t, (&'static str, u64, &'static [u8]), ()>,
    pub(super) by_state: Table<'t, (u8, u64, &'static [u8]), ()>,
    pub(super) by_time: Table<'t, (u64, &'static [u8]), ()>,
    pub(super) counters: Table<'t, &'static str, u64>,
    /// The request rows this transaction read or changed, by (request ID, producer): every
    /// request operation goes through them, and the changed ones are written once, by
    /// [`Tables::flush_requests`], which every transaction that changes them calls before
    /// it commits (applying a batch, retention).
    request_rows: HashMap<(String, String), RequestRow>,
}

impl<'t> Tables<'t> {
    pub(super) fn open(tx: &'t redb::WriteTransaction) -> Result<Self, StoreError> {
        Ok(Tables {
            records: tx.open_table(RECORDS)?,
            summaries: tx.open_table(SUMMARIES)?,
            requests: tx.open_table(REQUESTS)?,
            by_topic: tx.open_table(BY_TOPIC)?,
            by_state: tx.open_table(BY_STATE)?,
            by_time: tx.open_table(BY_TIME)?,
            counters: tx.open_table(COUNTERS)?,
            request_rows: HashMap::default(),
        })
    }

    pub(super) fn bump(
        &mut self,
        key: CounterKey,
        by: i64,
        out: &mut Deltas,
    ) -> Result<(), StoreError> {
        // Deltas gather in `out` and reach the table once per transaction (`flush`).
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

    pub(super) fn sub_bytes(&mut self, by: u64) -> Result<(), StoreError> {
        let cur = self
            .counters
            .get(COUNTER_BYTES)?
            .map(|v| v.value())
            .unwrap_or(0);
        self.counters
            .insert(COUNTER_BYTES, cur.saturating_sub(by))?;
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
                entry: match self.requests.get((request, producer))? {
                    Some(v) => RequestEntry::decode(v.value())?,
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
            let k = (request.as_str(), producer.as_str());
            if row.entry.is_empty() {
                self.requests.remove(k)?;
            } else {
                self.requests.insert(k, row.entry.encode()?.as_slice())?;
            }
            row.dirty = false;
        }
        Ok(())
    }

    pub(super) fn load_records(&self, key: &str) -> Result<Vec<StageRecord>, StoreError> {
        match self.records.get(stored(key)?.as_bytes())? {
            Some(v) => records::decode(v.value()).map_err(corrupt),
            None => Ok(Vec::new()),
        }
    }

    /// Writes a message's records (or removes the row of a message left without any);
    /// returns the change in stored bytes.
    pub(super) fn put_records(&mut self, key: &str, c: &mut Cached) -> Result<i64, StoreError> {
        let old = c.bytes as i64;
        let key = stored(key)?;
        if c.records.is_empty() {
            self.records.remove(key.as_bytes())?;
            c.bytes = 0;
            c.encoded = None;
        } else {
            let v = records::encode(&c.records);
            c.bytes = (key.as_bytes().len() + v.len()) as u64;
            self.records.insert(key.as_bytes(), v.as_slice())?;
            c.encoded = Some(v);
        }
        Ok(c.bytes as i64 - old)
    }

    pub(super) fn summary(&self, key: &str) -> Result<Option<MessageSummary>, StoreError> {
        match self.summaries.get(stored(key)?.as_bytes())? {
            Some(v) => Ok(Some(
                MessageSummary::decode(key, v.value()).map_err(corrupt)?,
            )),
            None => Ok(None),
        }
    }

    pub(super) fn unindex(&mut self, s: &MessageSummary) -> Result<(), StoreError> {
        let key = stored(&s.key)?;
        let key = key.as_bytes();
        self.by_topic
            .remove((s.topic.as_deref().unwrap_or(""), s.first_at, key))?;
        self.by_state
            .remove((state_code(s.state), s.last_at, key))?;
        self.by_time.remove((s.first_at, key))?;
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
                self.by_topic
                    .remove((o.topic.as_deref().unwrap_or(""), o.first_at, key))?;
                self.by_time.remove((o.first_at, key))?;
            }
            if !same_state {
                self.by_state
                    .remove((state_code(o.state), o.last_at, key))?;
            }
        }
        if !same_topic {
            self.by_topic
                .insert((new.topic.as_deref().unwrap_or(""), new.first_at, key), ())?;
            self.by_time.insert((new.first_at, key), ())?;
        }
        if !same_state {
            self.by_state
                .insert((state_code(new.state), new.last_at, key), ())?;
        }
        let value = new.encode();
        self.summaries.insert(key, value.as_slice())?;
        Ok(value)
    }

    /// Reads a message as the cache holds it: its records, their dedup keys and size, its
    /// summary.
    pub(super) fn load_cached(&self, key: &str) -> Result<Cached, StoreError> {
        let mut c = Cached::default();
        let sk = stored(key)?;
        if let Some(v) = self.records.get(sk.as_bytes())? {
            c.bytes = (sk.as_bytes().len() + v.value().len()) as u64;
            c.records = records::decode(v.value()).map_err(corrupt)?;
            c.dedup_keys = c.records.iter().map(records::dedup_hash).collect();
            c.encoded = Some(v.value().to_vec());
        }
        c.summary = self.summary(key)?;
        Ok(c)
    }

    /// Deletes a message the cache held (its records are known, nothing is read back);
    /// returns (bytes freed, its summary).
    pub(super) fn delete_known(
        &mut self,
        key: &str,
        c: Cached,
    ) -> Result<(u64, Option<MessageSummary>), StoreError> {
        self.records.remove(stored(key)?.as_bytes())?;
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
            self.summaries.remove(sk.as_bytes())?;
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
        let sk = stored(key)?;
        let freed = match self.records.remove(sk.as_bytes())? {
            Some(v) => (sk.as_bytes().len() + v.value().len()) as u64,
            None => 0,
        };
        let summary = self.summary(key)?;
        self.delete_summary(key, summary.as_ref())?;
        self.sub_bytes(freed)?;
        Ok((freed, summary))
    }
}
