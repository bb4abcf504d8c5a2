//! The read side of the store: trajectories by message or request ID, search over the
//! summaries and their indexes, counters and state counts.

use super::requests::RequestEntry;
use super::tables::{corrupt, counter_value, key_text, keys, stored};
use super::{records, SearchQuery, Store};
use crate::counters::{topic_state_of, TOPIC_PREFIX};
use crate::error::{QueryError, StoreError};
use crate::summary::{state_code, MessageSummary, TopicState};
use fjall::Readable;
use msgtrail_core::trajectory::{MessageState, Trajectory};
use msgtrail_core::{MessageId, RequestId, StageRecord};
use std::collections::BTreeMap;

/// Most summaries one search reads before it answers with what it found.
const SEARCH_SCAN_MAX: usize = 200_000;

impl Store {
    /// The trajectory stored under a message key, assembled with deadlines applied at `now`,
    /// naming the other messages stored under its producer and request ID
    /// ([`Trajectory::same_request`]).
    pub fn trajectory(&self, key: &str, now: u64) -> Result<Option<Trajectory>, StoreError> {
        let recs = self.records_of(key)?;
        if recs.is_empty() {
            return Ok(None);
        }
        let Some(mut t) = Trajectory::assemble(recs, &self.options(now)) else {
            return Ok(None);
        };
        let db = self.db()?;
        let tx = db.db.read_tx();
        if let (Some(m), Some(p), Some(q)) = (t.message_id, &t.producer, &t.request_id) {
            let row = tx.get(&db.ks.requests, keys::request(q.as_str(), p.as_str()))?;
            let others: Vec<MessageId> = match row {
                Some(v) => RequestEntry::decode(&v)?
                    .messages
                    .into_iter()
                    .filter(|id| *id != m)
                    .collect(),
                None => Vec::new(),
            };
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
        let db = self.db()?;
        let tx = db.db.read_tx();
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for item in tx.prefix(&db.ks.requests, keys::request_prefix(id)) {
            let (k, val) = item.into_inner()?;
            let p = keys::producer_of(&k)
                .ok_or_else(|| StoreError::bad_value(format!("request key {k:02x?}")))?;
            if producer.is_some_and(|want| want != p) {
                continue;
            }
            let e = RequestEntry::decode(&val)?;
            let keys: Vec<String> = if e.messages.is_empty() {
                e.link.into_iter().collect()
            } else {
                e.messages.iter().map(|m| m.to_string()).collect()
            };
            if !keys.is_empty() {
                out.insert(p.to_owned(), keys);
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
        let db = self.db()?;
        let tx = db.db.read_tx();
        let summaries = &db.ks.summaries;
        let mut out = Vec::new();
        let mut examined = 0usize;
        // Looks at one candidate; true when the search is done (enough results, or the
        // scan bound reached: a search never reads more than SEARCH_SCAN_MAX summaries).
        let mut consider =
            |key: &[u8], out: &mut Vec<MessageSummary>| -> Result<bool, StoreError> {
                examined += 1;
                if let Some(v) = tx.get(summaries, key)? {
                    let s = MessageSummary::decode(&key_text(key)?, &v).map_err(corrupt)?;
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
        let bad = |what: &str, k: &[u8]| StoreError::bad_value(format!("{what} key {k:02x?}"));
        if let Some(topic) = &q.topic {
            let range = keys::topic_bound(topic, from)..keys::topic_bound(topic, to);
            for item in tx.range(&db.ks.by_topic, range).rev() {
                let k = item.key()?;
                let key = keys::topic_key_of(&k).ok_or_else(|| bad("by_topic", &k))?;
                if consider(key, &mut out)? {
                    break;
                }
            }
        } else if let Some(state) = q.state {
            // by_state is ordered by the last record time (never before the first), so the
            // range from `from` holds every candidate; the first time is checked above.
            for item in tx.range(&db.ks.by_state, state_range(state, from)).rev() {
                let k = item.key()?;
                let (_, key) = keys::timed(&k, 1).ok_or_else(|| bad("by_state", &k))?;
                if consider(key, &mut out)? {
                    break;
                }
            }
        } else {
            let range = from.to_be_bytes()..to.to_be_bytes();
            for item in tx.range(&db.ks.by_time, range).rev() {
                let k = item.key()?;
                let (_, key) = keys::timed(&k, 0).ok_or_else(|| bad("by_time", &k))?;
                if consider(key, &mut out)? {
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
        let db = self.db()?;
        let tx = db.db.read_tx();
        let mut out = BTreeMap::new();
        for item in tx.iter(&db.ks.counters) {
            let (k, v) = item.into_inner()?;
            out.insert(counter_name(&k)?, counter_value(&v)?);
        }
        Ok(out)
    }

    /// Every record stored under a message key (none: no such message).
    pub(crate) fn records_of(&self, key: &str) -> Result<Vec<StageRecord>, StoreError> {
        let db = self.db()?;
        let tx = db.db.read_tx();
        let sk = stored(key)?;
        let mut recs = Vec::new();
        for item in tx.prefix(&db.ks.records, sk.as_bytes()) {
            let (k, v) = item.into_inner()?;
            if keys::is_chunk_of(&k, sk.as_bytes()) {
                recs.extend(records::decode(&v).map_err(corrupt)?);
            }
        }
        Ok(recs)
    }

    /// The summaries of messages whose last record is at or after `since`, oldest first (to
    /// refill the latency window after a restart).
    pub fn recent_summaries(
        &self,
        since: u64,
        max: usize,
    ) -> Result<Vec<MessageSummary>, StoreError> {
        let db = self.db()?;
        let tx = db.db.read_tx();
        let mut out = Vec::new();
        for st in MessageState::ALL {
            for item in tx.range(&db.ks.by_state, state_range(*st, since)) {
                let k = item.key()?;
                let (_, key) = keys::timed(&k, 1)
                    .ok_or_else(|| StoreError::bad_value(format!("by_state key {k:02x?}")))?;
                if let Some(v) = tx.get(&db.ks.summaries, key)? {
                    let s = MessageSummary::decode(&key_text(key)?, &v).map_err(corrupt)?;
                    out.push(s);
                }
            }
        }
        out.sort_by_key(|s| s.last_at);
        let skip = out.len().saturating_sub(max);
        Ok(out.split_off(skip))
    }

    /// How many shadow messages are in each state, all topics (a scan of the state index).
    pub fn state_totals(&self) -> Result<BTreeMap<MessageState, u64>, StoreError> {
        let db = self.db()?;
        let tx = db.db.read_tx();
        let mut out = BTreeMap::new();
        for st in MessageState::ALL {
            let n = tx.range(&db.ks.by_state, state_range(*st, 0)).count() as u64;
            if n > 0 {
                out.insert(*st, n);
            }
        }
        Ok(out)
    }

    /// How many shadow messages each topic has in each state, from the persistent per-topic
    /// state counters (kept in the same transactions as the summaries).
    pub fn state_counts(&self) -> Result<BTreeMap<TopicState, u64>, StoreError> {
        let db = self.db()?;
        let tx = db.db.read_tx();
        let mut out = BTreeMap::new();
        for item in tx.prefix(&db.ks.counters, TOPIC_PREFIX) {
            let (k, v) = item.into_inner()?;
            let name = counter_name(&k)?;
            if !name.starts_with(TOPIC_PREFIX) {
                break;
            }
            if let (Some(ts), n @ 1..) = (topic_state_of(&name), counter_value(&v)?) {
                out.insert(ts, n);
            }
        }
        Ok(out)
    }
}

/// The `by_state` keys of one state whose last time is at or after `since`.
fn state_range(st: MessageState, since: u64) -> std::ops::Range<Vec<u8>> {
    let c = state_code(st);
    keys::state_bound(c, since)..keys::state_bound(c + 1, 0)
}

/// A counter's name as stored.
fn counter_name(k: &[u8]) -> Result<String, StoreError> {
    String::from_utf8(k.to_vec()).map_err(corrupt)
}
