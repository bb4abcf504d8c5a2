//! The read side of the store: trajectories by message or request ID, search over the
//! summaries and their indexes, counters and state counts.

use super::requests::RequestEntry;
use super::tables::{
    corrupt, key_text, state_range, stored, BY_STATE, BY_TIME, BY_TOPIC, COUNTERS, RECORDS,
    REQUESTS, SUMMARIES,
};
use super::{records, SearchQuery, Store};
use crate::counters::{STATE_PREFIX, TOPIC_PREFIX};
use crate::error::{QueryError, StoreError};
use crate::summary::{MessageSummary, TopicState};
use msgtrail_core::trajectory::{MessageState, Trajectory};
use msgtrail_core::{MessageId, RequestId};
use redb::{ReadableDatabase, ReadableTable};
use std::collections::BTreeMap;

/// Most summaries one search reads before it answers with what it found.
const SEARCH_SCAN_MAX: usize = 200_000;

impl Store {
    /// The trajectory stored under a message key, assembled with deadlines applied at `now`,
    /// naming the other messages stored under its producer and request ID
    /// ([`Trajectory::same_request`]).
    pub fn trajectory(&self, key: &str, now: u64) -> Result<Option<Trajectory>, StoreError> {
        let tx = self.db()?.begin_read()?;
        let records = tx.open_table(RECORDS)?;
        let recs = match records.get(stored(key)?.as_bytes())? {
            Some(v) => records::decode(v.value()).map_err(corrupt)?,
            None => return Ok(None),
        };
        let Some(mut t) = Trajectory::assemble(recs, &self.options(now)) else {
            return Ok(None);
        };
        if let (Some(m), Some(p), Some(q)) = (t.message_id, &t.producer, &t.request_id) {
            let requests = tx.open_table(REQUESTS)?;
            let others: Vec<MessageId> = match requests.get((q.as_str(), p.as_str()))? {
                Some(v) => RequestEntry::decode(v.value())?
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
        let tx = self.db()?.begin_read()?;
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let requests = tx.open_table(REQUESTS)?;
        for item in requests.range((id, "")..)? {
            let (k, val) = item?;
            let (r, p) = k.value();
            if r != id {
                break;
            }
            if producer.is_some_and(|want| want != p) {
                continue;
            }
            let e = RequestEntry::decode(val.value())?;
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
        let tx = self.db()?.begin_read()?;
        let summaries = tx.open_table(SUMMARIES)?;
        let mut out = Vec::new();
        let mut examined = 0usize;
        // Looks at one candidate; true when the search is done (enough results, or the
        // scan bound reached: a search never reads more than SEARCH_SCAN_MAX summaries).
        let mut consider =
            |key: &[u8], out: &mut Vec<MessageSummary>| -> Result<bool, StoreError> {
                examined += 1;
                if let Some(v) = summaries.get(key)? {
                    let s = MessageSummary::decode(&key_text(key)?, v.value()).map_err(corrupt)?;
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
                .range((topic.as_str(), from, &[][..])..(topic.as_str(), to, &[][..]))?
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
            for item in idx.range(state_range(state, from))?.rev() {
                if consider(item?.0.value().2, &mut out)? {
                    break;
                }
            }
        } else {
            let idx = tx.open_table(BY_TIME)?;
            for item in idx.range((from, &[][..])..(to, &[][..]))?.rev() {
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
        let tx = self.db()?.begin_read()?;
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
        let tx = self.db()?.begin_read()?;
        let idx = tx.open_table(BY_STATE)?;
        let summaries = tx.open_table(SUMMARIES)?;
        let mut out = Vec::new();
        for st in MessageState::ALL {
            for item in idx.range(state_range(*st, since))? {
                let item = item?;
                let key = item.0.value().2;
                if let Some(v) = summaries.get(key)? {
                    let s = MessageSummary::decode(&key_text(key)?, v.value()).map_err(corrupt)?;
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
        let tx = self.db()?.begin_read()?;
        let idx = tx.open_table(BY_STATE)?;
        let mut out = BTreeMap::new();
        for st in MessageState::ALL {
            let n = idx.range(state_range(*st, 0))?.count() as u64;
            if n > 0 {
                out.insert(*st, n);
            }
        }
        Ok(out)
    }

    /// How many shadow messages each topic has in each state, from the persistent per-topic
    /// state counters (kept in the same transactions as the summaries).
    pub fn state_counts(&self) -> Result<BTreeMap<TopicState, u64>, StoreError> {
        let tx = self.db()?.begin_read()?;
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
