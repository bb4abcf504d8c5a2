//! The in-memory cache of in-flight messages: for each message key it holds every record
//! stored under that key, the fingerprints of their dedup keys, their stored size and the
//! summary, exactly as committed. [`crate::Store::apply`] uses it instead of reading a
//! message back from the store.
//!
//! It holds messages compactly — their records in the store's own stored form
//! ([`crate::store::records`]), the summary encoded ([`MessageSummary::encode`]) — and
//! hands out the working form (`Cached`) a transaction needs: a few hundred bytes per
//! in-flight message instead of several kilobytes of decoded records. The encodings are
//! the ones the transaction wrote to the store anyway, so keeping them costs no extra
//! encoding. [`CacheStats::bytes`] counts exactly what the entries hold.
//!
//! The cache only ever holds committed state: entries are taken out while a transaction
//! works on them and put back after its commit, so a failed transaction leaves them out
//! (an absent entry is always safe: the message is read from the store). It is bounded:
//! past its capacity it evicts messages in a final state first, then the least recently
//! used, down to 90 % of the capacity, and counts what it evicted.

use crate::store::records;
use crate::summary::MessageSummary;
use foldhash::{HashMap, HashMapExt, HashSet};
use msgtrail_core::{MessageId, StageRecord};
use serde::{Deserialize, Serialize};

/// How many in-flight messages the cache holds by default. A cached message costs a few
/// hundred bytes (its records and summary in stored form; see [`CacheStats::bytes`]).
pub const DEFAULT_CACHE_MESSAGES: usize = 10_000;

/// The cache's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheStats {
    /// Messages held now.
    pub messages: usize,
    /// The most messages it holds.
    pub capacity: usize,
    /// Messages found in the cache when a batch touched them.
    pub hits: u64,
    /// Messages a batch touched that had to be read from the store (or were new).
    pub misses: u64,
    /// Messages evicted to stay within the capacity.
    pub evictions: u64,
    /// Bytes the cache holds: its table (keys and entries, by slot) and what each entry
    /// owns on the heap, counted from the sizes of what it holds.
    #[serde(default)]
    pub bytes: u64,
    /// Summaries a batch derived from a message's folded state, without assembling it.
    #[serde(default)]
    pub summaries_folded: u64,
    /// Summaries a batch derived by assembling the message (what the folded state does
    /// not decide, or a store that emits the trajectories anyway).
    #[serde(default)]
    pub summaries_assembled: u64,
}

/// One message in the working form a transaction uses.
#[derive(Debug, Clone, Default)]
pub(crate) struct Cached {
    /// Every record stored under the key.
    pub records: Vec<StageRecord>,
    /// Fingerprints of their dedup keys ([`crate::store::records::dedup_hash`]).
    pub dedup_keys: HashSet<u64>,
    /// Bytes they take in the records keyspace (keys and values).
    pub bytes: u64,
    /// How many record chunks the store holds for the message (numbered from 0; a batch
    /// appends one).
    pub chunks: u32,
    /// The stored summary.
    pub summary: Option<MessageSummary>,
    /// `records` as stored, when known to match them (set when read or written, cleared
    /// when the records change): the cache keeps these bytes instead of encoding again.
    pub encoded: Option<Vec<u8>>,
    /// `summary` as stored, when the transaction wrote it ([`Cached::set_summary`]): the
    /// cache keeps these bytes instead of encoding the summary again.
    pub summary_encoded: Option<Vec<u8>>,
}

impl Cached {
    /// Sets the summary the transaction wrote, with the bytes it wrote.
    pub(crate) fn set_summary(&mut self, summary: MessageSummary, encoded: Vec<u8>) {
        self.summary = Some(summary);
        self.summary_encoded = Some(encoded);
    }

    /// Hands the records out, leaving them only in their stored form (`encoded`, encoded
    /// now unless already known): the form the cache keeps of them once committed. For a
    /// working copy whose records are not read again (only cached), so that whoever needs
    /// them once more (assembly) takes them instead of cloning them.
    pub(crate) fn take_records(&mut self) -> Vec<StageRecord> {
        if self.encoded.is_none() {
            self.encoded = Some(records::encode(&self.records));
        }
        std::mem::take(&mut self.records)
    }
}

/// One message as the cache holds it.
#[derive(Debug)]
struct Entry {
    records: Box<[u8]>,
    dedup: Box<[u64]>,
    bytes: u64,
    chunks: u32,
    summary: Option<Box<[u8]>>,
    /// Whether the summary's state is final (evicted first).
    done: bool,
    /// When it was last used (the cache's clock).
    used: u64,
}

impl Entry {
    fn of(mut c: Cached, used: u64) -> Entry {
        let records = match c.encoded.take() {
            Some(v) => v,
            None => records::encode(&c.records),
        };
        let mut dedup: Vec<u64> = c.dedup_keys.into_iter().collect();
        dedup.sort_unstable();
        Entry {
            records: records.into_boxed_slice(),
            dedup: dedup.into_boxed_slice(),
            bytes: c.bytes,
            chunks: c.chunks,
            done: c.summary.as_ref().is_some_and(|s| s.state.is_final()),
            summary: match (c.summary, c.summary_encoded) {
                (Some(_), Some(b)) => Some(b.into_boxed_slice()),
                (Some(s), None) => Some(s.encode().into_boxed_slice()),
                (None, _) => None,
            },
            used,
        }
    }

    /// The working form; `None` if what it holds no longer decodes (then the store is read
    /// instead). The folded state is not kept between batches: a touched message folds its
    /// records again (cheap, and it keeps a cached message at its compact bytes; kept, the
    /// folded state cost ~435 B more per in-flight message, BENCHMARKS round 11).
    fn into_open(self, key: &str) -> Option<Cached> {
        self.open_records(key)
    }

    /// The working form (for reading, or to take apart).
    fn open_records(&self, key: &str) -> Option<Cached> {
        let records = records::decode(&self.records).ok()?;
        let summary = match &self.summary {
            Some(b) => Some(MessageSummary::decode(key, b).ok()?),
            None => None,
        };
        Some(Cached {
            records,
            dedup_keys: self.dedup.iter().copied().collect(),
            bytes: self.bytes,
            chunks: self.chunks,
            summary,
            encoded: Some(self.records.to_vec()),
            summary_encoded: None,
        })
    }

    /// Heap bytes the entry owns.
    fn heap_bytes(&self) -> usize {
        self.records.len()
            + self.dedup.len() * std::mem::size_of::<u64>()
            + self.summary.as_ref().map_or(0, |s| s.len())
    }
}

#[derive(Debug)]
pub(crate) struct Cache {
    map: HashMap<String, Entry>,
    capacity: usize,
    clock: u64,
    hits: u64,
    misses: u64,
    evictions: u64,
    summaries_folded: u64,
    summaries_assembled: u64,
    /// The newest message ID the store may hold (read when it opens, raised by every
    /// batch): a message ID newer than it is new to the store, with nothing to read.
    newest: Option<MessageId>,
}

impl Cache {
    pub(crate) fn new(capacity: usize) -> Self {
        Cache {
            map: HashMap::new(),
            capacity,
            clock: 0,
            hits: 0,
            misses: 0,
            evictions: 0,
            summaries_folded: 0,
            summaries_assembled: 0,
            newest: None,
        }
    }

    /// Notes a message ID the store may hold from now on (or one it holds).
    pub(crate) fn saw(&mut self, m: Option<MessageId>) {
        self.newest = self.newest.max(m);
    }

    /// The newest message ID the store may hold.
    pub(crate) fn newest(&self) -> Option<MessageId> {
        self.newest
    }

    /// Whether the store cannot hold `m`: it is newer than every message ID it may hold.
    /// (Raising the mark early, for a batch that then fails, only costs reads.)
    pub(crate) fn is_new(&self, m: MessageId) -> bool {
        self.newest.is_none_or(|n| m > n)
    }

    /// Counts a summary derived from the folded state (`true`) or by assembly.
    pub(crate) fn count_summary(&mut self, folded: bool) {
        if folded {
            self.summaries_folded += 1;
        } else {
            self.summaries_assembled += 1;
        }
    }

    /// Takes a message out (to work on it); counts a hit or a miss.
    pub(crate) fn take(&mut self, key: &str) -> Option<Cached> {
        let e = self.remove(key);
        if e.is_some() {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
        e
    }

    /// Takes a message out without counting (for housekeeping and merges).
    pub(crate) fn remove(&mut self, key: &str) -> Option<Cached> {
        self.map.remove(key).and_then(|e| e.into_open(key))
    }

    /// Drops a message without reading it back (retention deleted it).
    pub(crate) fn forget(&mut self, key: &str) {
        self.map.remove(key);
    }

    /// A held message's working form, left in the cache.
    pub(crate) fn peek(&self, key: &str) -> Option<Cached> {
        self.map.get(key).and_then(|e| e.open_records(key))
    }

    /// Replaces a held message's summary (after a commit that changed only it).
    pub(crate) fn set_summary(&mut self, key: &str, summary: &MessageSummary) {
        if let Some(e) = self.map.get_mut(key) {
            e.done = summary.state.is_final();
            e.summary = Some(summary.encode().into_boxed_slice());
        }
    }

    /// Puts committed messages in, then evicts past the capacity.
    pub(crate) fn put_all(&mut self, entries: impl IntoIterator<Item = (String, Cached)>) {
        self.clock += 1;
        for (k, c) in entries {
            let e = Entry::of(c, self.clock);
            self.map.insert(k, e);
        }
        self.evict();
    }

    fn evict(&mut self) {
        if self.map.len() <= self.capacity {
            return;
        }
        let target = self.capacity / 10 * 9;
        let excess = self.map.len() - target;
        // Final messages first (nothing more is expected for them), then the oldest.
        let mut order: Vec<(bool, u64, &String)> =
            self.map.iter().map(|(k, e)| (!e.done, e.used, k)).collect();
        // 1 <= excess <= len: the first `excess` after partitioning are the victims.
        order.select_nth_unstable_by(excess - 1, |a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        let victims: Vec<String> = order[..excess]
            .iter()
            .map(|(_, _, k)| (*k).clone())
            .collect();
        for k in victims {
            self.map.remove(&k);
        }
        self.evictions += excess as u64;
    }

    /// Bytes held: the table's slots (hashbrown keeps one control byte and one
    /// (key, entry) pair per bucket, at most 7/8 of the buckets full) and each key's and
    /// entry's heap.
    fn bytes(&self) -> u64 {
        let slot = std::mem::size_of::<(String, Entry)>() + 1;
        let buckets = (self.map.capacity() * 8).div_ceil(7);
        let heap: usize = self
            .map
            .iter()
            .map(|(k, e)| k.capacity() + e.heap_bytes())
            .sum();
        (buckets * slot + heap) as u64
    }

    pub(crate) fn stats(&self) -> CacheStats {
        CacheStats {
            messages: self.map.len(),
            capacity: self.capacity,
            hits: self.hits,
            misses: self.misses,
            evictions: self.evictions,
            bytes: self.bytes(),
            summaries_folded: self.summaries_folded,
            summaries_assembled: self.summaries_assembled,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use msgtrail_core::trajectory::MessageState;
    use std::collections::BTreeMap;

    fn entry(state: MessageState) -> Cached {
        Cached {
            summary: Some(MessageSummary {
                key: String::new(),
                message_id: None,
                request_id: None,
                producer: None,
                topic: None,
                state,
                groups: BTreeMap::new(),
                first_at: 0,
                last_at: 0,
                failure: None,
                records: 0,
                funnel: [false; 4],
                segments: Vec::new(),
                failed: false,
                redelivered: false,
                dead_lettered: false,
                attrs: BTreeMap::new(),
                attempts: None,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_summary_written_by_the_transaction_comes_back_from_its_bytes() {
        let mut c = Cache::new(10);
        let mut e = entry(MessageState::Delivered);
        let mut s = e.summary.take().expect("a summary");
        s.key = "k".to_owned();
        s.topic = Some("orders".to_owned());
        let bytes = s.encode();
        e.set_summary(s.clone(), bytes);
        c.put_all([("k".to_owned(), e)]);
        let back = c.take("k").expect("cached");
        assert_eq!(back.summary, Some(s));
    }

    #[test]
    fn taken_records_stay_cached_in_their_stored_form() {
        let mut c = Cache::new(10);
        let mut e = entry(MessageState::Delivered);
        e.records = vec![msgtrail_core::StageRecord::at(
            msgtrail_core::Stage::UploadSent,
            1_000,
        )];
        let taken = e.take_records();
        assert!(e.records.is_empty());
        c.put_all([("k".to_owned(), e)]);
        assert_eq!(c.take("k").expect("cached").records, taken);
    }

    #[test]
    fn bounded_final_first_then_oldest() {
        let mut c = Cache::new(10);
        for i in 0..8 {
            c.put_all([(format!("open-{i}"), entry(MessageState::Delivered))]);
        }
        c.put_all([
            ("done-a".to_owned(), entry(MessageState::Consumed)),
            ("done-b".to_owned(), entry(MessageState::Lost)),
            ("open-8".to_owned(), entry(MessageState::Enqueued)),
        ]);
        // 11 > 10: down to 9, the two final ones go first.
        let s = c.stats();
        assert_eq!((s.messages, s.evictions), (9, 2));
        assert!(c.remove("done-a").is_none() && c.remove("done-b").is_none());
        c.put_all([("open-9".to_owned(), entry(MessageState::Enqueued))]);
        c.put_all([("open-10".to_owned(), entry(MessageState::Enqueued))]);
        // 11 > 10 again, all open: the two least recently used go.
        let s = c.stats();
        assert_eq!((s.messages, s.evictions), (9, 4));
        assert!(c.take("open-0").is_none() && c.take("open-1").is_none());
        assert!(c.take("open-2").is_some());
        assert_eq!((c.stats().hits, c.stats().misses), (1, 2));
    }

    /// A message goes in compact and comes out as it went in; the byte count follows what
    /// the entries hold.
    #[test]
    fn compact_round_trip_and_counted_bytes() {
        use msgtrail_core::{MessageId, Stage};
        let mut c = Cache::new(100);
        let empty = c.stats().bytes;
        let m = MessageId::new();
        let mut msg = entry(MessageState::Enqueued);
        if let Some(s) = msg.summary.as_mut() {
            s.key = m.to_string();
        }
        for stage in [Stage::UploadReceived, Stage::Stored] {
            let mut r = StageRecord::at(stage, 1_700_000_000_000_000_000);
            r.message_id = Some(m);
            r.topic = Some("orders".into());
            msg.dedup_keys.insert(records::dedup_hash(&r));
            msg.records.push(r);
        }
        c.put_all([(m.to_string(), msg.clone())]);
        let one = c.stats().bytes;
        assert!(one > empty, "{one} vs {empty}");
        let back = c.peek(&m.to_string()).unwrap();
        assert_eq!(back.records, msg.records);
        assert_eq!(back.dedup_keys, msg.dedup_keys);
        assert_eq!(back.summary, msg.summary);
        for i in 0..50 {
            c.put_all([(format!("k{i}"), msg.clone())]);
        }
        let per = (c.stats().bytes - empty) as f64 / 51.0;
        // Two records, a summary, the key and the slot: well under a kilobyte.
        assert!((100.0..1024.0).contains(&per), "{per}");
    }

    #[test]
    fn capacity_zero_holds_nothing() {
        let mut c = Cache::new(0);
        c.put_all([("a".to_owned(), entry(MessageState::Sent))]);
        assert_eq!(c.stats().messages, 0);
        assert_eq!(c.stats().evictions, 1);
    }
}
