//! The in-memory cache of in-flight messages: for each message key it holds, every record
//! stored under that key, their dedup keys, their stored size and the summary, exactly as
//! committed. [`crate::Store::apply`] uses it instead of reading a message back from redb.
//!
//! The cache only ever holds committed state: entries are taken out while a transaction
//! works on them and put back after its commit, so a failed transaction leaves them out
//! (an absent entry is always safe: the message is read from the store). It is bounded:
//! past its capacity it evicts messages in a final state first, then the least recently
//! used, down to 90 % of the capacity, and counts what it evicted.

use crate::store::MessageSummary;
use msgtrail_core::StageRecord;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};

/// How many in-flight messages the cache holds by default. A cached message costs about
/// 9–18 KB (its records and summary), so the default bounds the cache near 100–200 MB.
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
}

/// One message as stored.
#[derive(Debug, Clone, Default)]
pub(crate) struct Cached {
    /// Every record stored under the key.
    pub records: Vec<StageRecord>,
    /// Fingerprints of their dedup keys ([`crate::store::codec::dedup_hash`]).
    pub dedup_keys: HashSet<u64>,
    /// Bytes they take in the records table (keys and values).
    pub bytes: u64,
    /// The stored summary.
    pub summary: Option<MessageSummary>,
    /// When it was last used (the cache's clock).
    used: u64,
}

#[derive(Debug)]
pub(crate) struct Cache {
    map: HashMap<String, Cached>,
    capacity: usize,
    clock: u64,
    hits: u64,
    misses: u64,
    evictions: u64,
}

impl Cache {
    pub fn new(capacity: usize) -> Self {
        Cache {
            map: HashMap::new(),
            capacity,
            clock: 0,
            hits: 0,
            misses: 0,
            evictions: 0,
        }
    }

    /// Takes a message out (to work on it); counts a hit or a miss.
    pub fn take(&mut self, key: &str) -> Option<Cached> {
        let e = self.map.remove(key);
        if e.is_some() {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
        e
    }

    /// Takes a message out without counting (for housekeeping and merges).
    pub fn remove(&mut self, key: &str) -> Option<Cached> {
        self.map.remove(key)
    }

    /// A held message, to update in place (after a commit).
    pub fn get_mut(&mut self, key: &str) -> Option<&mut Cached> {
        self.map.get_mut(key)
    }

    /// Puts committed messages in, then evicts past the capacity.
    pub fn put_all(&mut self, entries: impl IntoIterator<Item = (String, Cached)>) {
        self.clock += 1;
        for (k, mut e) in entries {
            e.used = self.clock;
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
        let mut order: Vec<(bool, u64, &String)> = self
            .map
            .iter()
            .map(|(k, e)| {
                let open = !e.summary.as_ref().is_some_and(|s| s.state.is_final());
                (open, e.used, k)
            })
            .collect();
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

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            messages: self.map.len(),
            capacity: self.capacity,
            hits: self.hits,
            misses: self.misses,
            evictions: self.evictions,
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
            }),
            ..Default::default()
        }
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

    #[test]
    fn capacity_zero_holds_nothing() {
        let mut c = Cache::new(0);
        c.put_all([("a".to_owned(), entry(MessageState::Sent))]);
        assert_eq!(c.stats().messages, 0);
        assert_eq!(c.stats().evictions, 1);
    }
}
