//! [`Store::apply`] in named passes over one batch, inside one write transaction:
//!
//! 1. [`Pass::link_requests`]: (producer, request ID) → message ID links; orphan uploads to
//!    merge into the message that now names them; request IDs stored as several messages.
//! 2. [`Pass::group_by_message`]: every record under its message key (records that name no
//!    message are counted, not stored).
//! 3. [`Pass::merge_orphans`] and [`Pass::regroup_requests`]: records already stored that
//!    move to another message key.
//! 4. [`Pass::update_message`], per touched message: insert what is new, derive the
//!    summary, and turn the difference into counters, state changes and latencies (observe
//!    mode's per-stream and per-consumer ones through [`crate::observe::stats`]). The
//!    summary comes from the message's folded state ([`Folded`], which each inserted record
//!    updates); the message is assembled only when that state cannot decide it, when
//!    records moved to or from it (passes 3a/3b), or when the store emits trajectories.
//! 5. [`Pass::count_reuploads`]: messages stored again after the dedup window.
//!
//! The transaction commits (one atomic, fsynced fjall batch) after the passes; the cache gets the touched messages back only
//! then (see [`crate::cache`]).

use super::tables::{nearest, orphan_key, Tables};
use super::{client_events, records, MessageKey, Store};
use crate::cache::{Cache, Cached};
use crate::counters::{Counter, CounterKey, FunnelStep};
use crate::error::StoreError;
use crate::observe::stats as observe_stats;
use crate::store::ApplyOutcome;
use crate::summary::{new_latencies, topic_state, Folded, MessageSummary};
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use msgtrail_core::outcome::{ChannelOutcome, RedeliveryOutcome};
use msgtrail_core::{MessageId, Stage, StageRecord};
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};

/// What pass 1 found.
#[derive(Debug, Default)]
pub(super) struct Linking {
    /// Message key → orphan keys whose records now belong to it.
    merges: BTreeMap<String, BTreeSet<String>>,
    /// (request ID, producer) that gained a message next to others: their records without
    /// message ID may belong to another of them now.
    regroup: BTreeSet<(String, String)>,
    /// The messages stored again after the dedup window: every message of a request ID but
    /// the first (in upload order), each counted once.
    again: Vec<String>,
}

/// Records already stored that move to another message key, and the messages this touches.
#[derive(Debug, Default)]
struct Moves {
    /// Message key → records moving to it.
    moves: BTreeMap<String, Vec<StageRecord>>,
    /// Messages whose summary is rebuilt although nothing new was inserted: merge targets
    /// and the messages that gave records away.
    rebuild: BTreeSet<String>,
    /// Messages that gave records away.
    shrunk: BTreeSet<String>,
    /// Messages taken out of the cache (or read) before pass 4.
    taken: HashMap<String, Cached>,
}

/// The records a message gained in this batch.
#[derive(Debug, Default)]
struct Inserted {
    /// Records inserted (moved ones included).
    count: usize,
    /// (stage, recovered, dead letter) of those new to the store (moved ones excluded).
    fresh: Vec<(Stage, bool, bool)>,
}

/// One batch being applied.
pub(super) struct Pass<'a, 't> {
    store: &'a Store,
    t: &'a mut Tables<'t>,
    cache: &'a mut Cache,
    /// Message IDs formatted as keys, once per batch.
    keys: HashMap<MessageId, String>,
    /// Keys of the messages of this batch that the store cannot hold yet (newer than every
    /// message ID it may hold): nothing is read for them when the cache has none.
    new_keys: HashSet<String>,
    /// Counter changes of this batch, gathered by hashing (a message bumps some twenty
    /// counters, and a topic's are looked up by `&str`, with no key built per bump); moved
    /// into [`ApplyOutcome::counters`] once, before the counters are written.
    global: HashMap<Counter, i64>,
    /// As `global`, per topic.
    by_topic: HashMap<String, HashMap<Counter, i64>>,
    pub(super) out: ApplyOutcome,
    now: u64,
}

impl<'a, 't> Pass<'a, 't> {
    pub(super) fn new(
        store: &'a Store,
        t: &'a mut Tables<'t>,
        cache: &'a mut Cache,
        now: u64,
    ) -> Self {
        Pass {
            store,
            t,
            cache,
            keys: HashMap::new(),
            new_keys: HashSet::new(),
            global: HashMap::new(),
            by_topic: HashMap::new(),
            out: ApplyOutcome::default(),
            now,
        }
    }

    /// Runs every pass; returns the touched messages as they will be once committed.
    pub(super) fn run(
        &mut self,
        records: Vec<StageRecord>,
    ) -> Result<Vec<(String, Cached)>, StoreError> {
        let linking = self.link_requests(&records)?;
        let mut by_key = self.group_by_message(records)?;
        let mut moves = Moves {
            rebuild: linking.merges.keys().cloned().collect(),
            ..Moves::default()
        };
        self.merge_orphans(&linking.merges, &mut moves)?;
        self.regroup_requests(&linking.regroup, &mut moves)?;
        moves.rebuild.extend(moves.moves.keys().cloned());
        moves.rebuild.extend(moves.shrunk.iter().cloned());
        for k in moves.rebuild.iter().chain(moves.taken.keys()) {
            by_key.entry(k.clone()).or_default();
        }
        let mut staged = Vec::with_capacity(by_key.len());
        for (key, fresh) in by_key {
            staged.push(self.update_message(key, fresh, &mut moves)?);
        }
        self.count_reuploads(&linking.again, &staged)?;
        self.t.flush_requests()?;
        self.gather_counters();
        self.t
            .count_states(&self.out.state_changes, &mut self.out.counters)?;
        self.t.flush(&self.out.counters)?;
        Ok(staged)
    }

    fn key(&mut self, m: MessageId) -> String {
        self.keys.entry(m).or_insert_with(|| m.to_string()).clone()
    }

    fn bump(&mut self, key: CounterKey, by: i64) -> Result<(), StoreError> {
        match key {
            CounterKey::Global(c) if by != 0 => *self.global.entry(c).or_default() += by,
            CounterKey::Global(_) => {}
            CounterKey::Topic(topic, c) => self.bump_topic(&topic, c, by)?,
            observed @ CounterKey::Observed(_) => {
                *self.out.counters.entry(observed).or_default() += by;
            }
        }
        Ok(())
    }

    /// Bumps a counter within `topic`; the topic is copied only the first time it is bumped.
    fn bump_topic(&mut self, topic: &str, c: Counter, by: i64) -> Result<(), StoreError> {
        if by == 0 {
            return Ok(());
        }
        let counts = match self.by_topic.get_mut(topic) {
            Some(m) => m,
            None => self.by_topic.entry(topic.to_owned()).or_default(),
        };
        *counts.entry(c).or_default() += by;
        Ok(())
    }

    /// Moves the batch's counter changes into the outcome (every counter bumped by a change,
    /// as [`Tables::bump`] keeps them).
    fn gather_counters(&mut self) {
        for (c, by) in self.global.drain() {
            *self.out.counters.entry(c.into()).or_default() += by;
        }
        for (topic, counts) in self.by_topic.drain() {
            for (c, by) in counts {
                *self
                    .out
                    .counters
                    .entry(CounterKey::Topic(topic.clone(), c))
                    .or_default() += by;
            }
        }
    }

    /// Pass 1.
    fn link_requests(&mut self, records: &[StageRecord]) -> Result<Linking, StoreError> {
        let mut l = Linking::default();
        // A message's later records in the batch find it linked and in its request's set
        // already: only the first record of each (message, producer, request) does the work.
        let mut done: HashSet<(MessageId, &str, &str)> = HashSet::new();
        for r in records {
            let (Some(m), Some(p), Some(q)) = (&r.message_id, &r.producer, &r.request_id) else {
                continue;
            };
            if !done.insert((*m, p.as_str(), q.as_str())) {
                continue;
            }
            let (q, p) = (q.as_str(), p.as_str());
            // Read before the link may change (a store older than the table has only the
            // link).
            let set = self.t.messages_of(q, p)?;
            let (known, first) = (set.contains(m), set.first().copied());
            let cur = self.t.link(q, p)?;
            let mkey = self.key(*m);
            match cur {
                Some(c) if c == mkey => {}
                // A request ID already linked to another message (uploaded again after the
                // dedup window): `request_messages` names both.
                Some(c) if !MessageKey::is_orphan(&c) => {}
                other => {
                    if let Some(orphan) = other {
                        l.merges.entry(mkey.clone()).or_default().insert(orphan);
                    }
                    self.t.set_link(q, p, mkey.clone())?;
                }
            }
            if !known {
                if let Some(first) = first {
                    // The one that is not first in upload order is the re-upload, whichever
                    // arrived first.
                    l.again
                        .push(if *m > first { mkey } else { first.to_string() });
                    l.regroup.insert((q.to_owned(), p.to_owned()));
                }
                self.t.add_message(q, p, *m)?;
            }
        }
        Ok(l)
    }

    /// Pass 2.
    fn group_by_message(
        &mut self,
        records: Vec<StageRecord>,
    ) -> Result<BTreeMap<String, Vec<StageRecord>>, StoreError> {
        let mut by_key: BTreeMap<String, Vec<StageRecord>> = BTreeMap::new();
        // Most records name their message: those gather by ID first, so that each message's
        // key is formatted and ordered once rather than once per record.
        // Each message's list is sized from a count first: records are large, and growing
        // the lists one push at a time copied them over and over.
        let mut counts: HashMap<MessageId, usize> = HashMap::new();
        for m in records.iter().filter_map(|r| r.message_id) {
            *counts.entry(m).or_default() += 1;
        }
        let mut by_id: HashMap<MessageId, Vec<StageRecord>> = HashMap::with_capacity(counts.len());
        for mut r in records {
            let key = match (&r.message_id, &r.producer, &r.request_id) {
                (Some(m), _, _) => {
                    let m = *m;
                    self.store.trim_payload(&mut r);
                    by_id
                        .entry(m)
                        .or_insert_with(|| Vec::with_capacity(counts.get(&m).copied().unwrap_or(1)))
                        .push(r);
                    continue;
                }
                (None, Some(p), Some(q)) => {
                    let (p, q) = (p.as_str().to_owned(), q.as_str().to_owned());
                    self.key_without_id(&p, &q, r.at)?
                }
                _ => {
                    self.count_unkeyed(&r)?;
                    continue;
                }
            };
            self.store.trim_payload(&mut r);
            by_key.entry(key).or_default().push(r);
        }
        let newest = by_id.keys().max().copied();
        for (m, recs) in by_id {
            if self.cache.is_new(m) {
                let key = self.key(m);
                self.new_keys.insert(key);
            }
            match by_key.entry(self.key(m)) {
                Entry::Vacant(e) => {
                    e.insert(recs);
                }
                Entry::Occupied(mut e) => e.get_mut().extend(recs),
            }
        }
        self.cache.saw(newest);
        Ok(by_key)
    }

    /// The key of a record without message ID (a P1): the nearest message of its request
    /// ID, else the key its request ID is linked to, else a new orphan key.
    fn key_without_id(&mut self, p: &str, q: &str, at: u64) -> Result<String, StoreError> {
        let set = self.t.messages_of(q, p)?;
        if let Some(m) = nearest(set, at) {
            return Ok(self.key(m));
        }
        match self.t.link(q, p)? {
            Some(k) => Ok(k),
            None => {
                let k = orphan_key(p, q);
                self.t.set_link(q, p, k.clone())?;
                Ok(k)
            }
        }
    }

    /// Channel and no-match records name no message: they are counted (a redelivered batch
    /// may count them twice) and kept per client ([`client_events`]).
    fn count_unkeyed(&mut self, r: &StageRecord) -> Result<(), StoreError> {
        self.bump(Counter::Stage(r.stage).into(), 1)?;
        if r.channel_outcome() == Some(ChannelOutcome::Refused) {
            self.bump(Counter::ChannelsRefused.into(), 1)?;
        }
        self.bump(Counter::Unkeyed.into(), 1)?;
        self.out.unkeyed_records += 1;
        client_events::record(self.t, r)?;
        Ok(())
    }

    /// Pass 3a: a merged orphan's records go to the message of the record that linked it —
    /// or, when the request ID names several messages, to the nearest one — and the orphan
    /// is deleted, its counts taken back (a message counts once in the funnel whatever the
    /// order of P1 and P2).
    fn merge_orphans(
        &mut self,
        merges: &BTreeMap<String, BTreeSet<String>>,
        moves: &mut Moves,
    ) -> Result<(), StoreError> {
        for (target, orphans) in merges {
            for orphan in orphans {
                let o = match self.cache.remove(orphan) {
                    Some(c) => c,
                    None => self.t.load_cached(orphan)?,
                };
                let orecs = o.records.clone();
                let osum = if o.records.is_empty() && o.summary.is_none() {
                    None
                } else {
                    self.t.delete_known(orphan, o)?.1
                };
                if let Some(s) = osum {
                    let topic = s.topic.clone().unwrap_or_default();
                    for (flag, step) in s.funnel.iter().zip(FunnelStep::ALL) {
                        if *flag {
                            let c = Counter::Funnel(step);
                            self.t.bump_both(&topic, c, -1, &mut self.out.counters)?;
                        }
                    }
                    self.out.state_changes.push((Some(topic_state(&s)), None));
                }
                for r in orecs {
                    let home = match (&r.producer, &r.request_id) {
                        (Some(p), Some(q)) => {
                            nearest(self.t.messages_of(q.as_str(), p.as_str())?, r.at)
                        }
                        _ => None,
                    };
                    let home = match home {
                        Some(m) => self.key(m),
                        None => target.clone(),
                    };
                    moves.moves.entry(home).or_default().push(r);
                }
            }
        }
        Ok(())
    }

    /// Pass 3b: the records without message ID of a request ID that gained a message move
    /// to it when it is nearer. The statistics count moved records as they were (not new).
    fn regroup_requests(
        &mut self,
        regroup: &BTreeSet<(String, String)>,
        moves: &mut Moves,
    ) -> Result<(), StoreError> {
        for (q, p) in regroup {
            let set = self.t.messages_of(q, p)?.clone();
            for m in &set {
                let key = self.key(*m);
                let mut c = self.take_message(&key, &mut moves.taken)?;
                let mut kept = Vec::with_capacity(c.records.len());
                for r in std::mem::take(&mut c.records) {
                    let ours = r.message_id.is_none()
                        && r.producer.as_ref().is_some_and(|x| x.as_str() == p)
                        && r.request_id.as_ref().is_some_and(|x| x.as_str() == q);
                    let home = nearest(&set, r.at).filter(|h| ours && h != m);
                    let Some(home) = home else {
                        kept.push(r);
                        continue;
                    };
                    c.dedup_keys.remove(&records::dedup_hash(&r));
                    let home = self.key(home);
                    moves.moves.entry(home).or_default().push(r);
                    moves.shrunk.insert(key.clone());
                }
                c.records = kept;
                c.encoded = None;
                moves.taken.insert(key, c);
            }
        }
        Ok(())
    }

    /// A message as committed: taken earlier in this batch, else from the cache, else read.
    fn take_message(
        &mut self,
        key: &str,
        taken: &mut HashMap<String, Cached>,
    ) -> Result<Cached, StoreError> {
        if let Some(c) = taken.remove(key) {
            return Ok(c);
        }
        match self.cache.take(key) {
            Some(c) => Ok(c),
            None if self.new_keys.contains(key) => Ok(Cached::default()),
            None => self.t.load_cached(key),
        }
    }

    /// Pass 4, one message: insert what is new, rebuild its summary and count the change.
    fn update_message(
        &mut self,
        key: String,
        fresh: Vec<StageRecord>,
        moves: &mut Moves,
    ) -> Result<(String, Cached), StoreError> {
        let mut own = self.take_message(&key, &mut moves.taken)?;
        let moved = moves.moves.remove(&key).unwrap_or_default();
        let held = own.records.len();
        let ins = self.insert_new(&mut own, moved, fresh);
        let shrunk = moves.shrunk.contains(&key);
        if ins.count > 0 || shrunk {
            let delta = self.t.put_records(&key, &mut own, held, shrunk)?;
            self.bump(Counter::Bytes.into(), delta)?;
        }
        let topic_events = self.count_events(&ins.fresh)?;
        self.out.new_records += ins.fresh.len() as u64;
        if ins.count == 0 && !moves.rebuild.contains(&key) {
            return Ok((key, own));
        }
        // Observe mode's hook: the inserted records are the last `ins.count`.
        let (had, new) = own.records.split_at(own.records.len() - ins.count);
        self.count_observed(observe_stats::count_records(had, new))?;
        // The folded state is built only where it is used: export needs the assembled
        // trajectory anyway, and moved records always take the assembly.
        let folded = if self.store.emit_trajectories || moves.rebuild.contains(&key) {
            None
        } else {
            Folded::of(&own.records).summary(&key, self.now, &self.store.deadlines)
        };
        self.cache.count_summary(folded.is_some());
        let (summary, traj) = match folded {
            Some(s) => (s, None),
            None => {
                // Assembly drops repeats, so the message's records now (its own and the
                // inserted ones) are all it needs: a moved record already held has the
                // same dedup key. From here on the records only go to the cache, which
                // keeps their stored form: assembly takes them rather than a copy.
                let opts = self.store.options(self.now);
                let Some(traj) = self.store.assemble(own.take_records(), &opts) else {
                    return Ok((key, own));
                };
                (MessageSummary::of(&key, &traj), Some(traj))
            }
        };
        let prev = own.summary.take();
        let stored_summary = self.t.put_summary(prev.as_ref(), &summary)?;
        let moved = observe_stats::state_change(prev.as_ref(), Some(&summary));
        self.count_observed(observe_stats::Change {
            counters: moved,
            samples: Vec::new(),
        })?;
        let same_ts = prev.as_ref().is_some_and(|p| {
            (p.topic.as_deref(), p.state) == (summary.topic.as_deref(), summary.state)
        });
        if !same_ts {
            let old_ts = prev.as_ref().map(topic_state);
            self.out
                .state_changes
                .push((old_ts, Some(topic_state(&summary))));
        }
        let topic = summary.topic.as_deref().unwrap_or_default();
        for e in topic_events {
            self.bump_topic(topic, e, 1)?;
        }
        self.count_funnel(prev.as_ref(), &summary)?;
        let old_l = prev
            .as_ref()
            .map(|s| s.segments.as_slice())
            .unwrap_or_default();
        let topic = summary.topic.clone().unwrap_or_default();
        for (s, v) in new_latencies(old_l, &summary.segments) {
            let id = summary.message_id;
            self.out.latencies.push((topic.clone(), s, v, id));
        }
        own.set_summary(summary, stored_summary);
        if self.store.emit_trajectories {
            self.out.trajectories.extend(traj);
        }
        Ok((key, own))
    }

    /// Adds what observed records changed (observe mode's statistics) to the outcome.
    fn count_observed(&mut self, change: observe_stats::Change) -> Result<(), StoreError> {
        for (k, by) in change.counters {
            self.bump(CounterKey::Observed(k), by)?;
        }
        self.out.observed.extend(change.samples);
        Ok(())
    }

    /// Inserts the moved and fresh records a message does not hold yet (by dedup key).
    fn insert_new(
        &mut self,
        own: &mut Cached,
        moved: Vec<StageRecord>,
        fresh: Vec<StageRecord>,
    ) -> Inserted {
        let moved_keys: HashSet<u64> = moved.iter().map(records::dedup_hash).collect();
        own.records.reserve(moved.len() + fresh.len());
        let mut ins = Inserted::default();
        let mut seen: HashSet<u64> = HashSet::new();
        for r in moved.into_iter().chain(fresh) {
            let dk = records::dedup_hash(&r);
            if own.dedup_keys.contains(&dk) || !seen.insert(dk) {
                self.out.repeated_records += 1;
                continue;
            }
            ins.count += 1;
            // Moved records are not new; count only the fresh ones.
            if !moved_keys.contains(&dk) {
                let dead = r.redelivery_outcome() == Some(RedeliveryOutcome::DeadLetter);
                ins.fresh.push((r.stage, r.is_recovered(), dead));
            }
            own.records.push(r);
            own.encoded = None;
        }
        own.dedup_keys.extend(seen);
        ins
    }

    /// Counts the new records by stage; returns the events that also count per topic, once
    /// the message's topic is known.
    fn count_events(&mut self, fresh: &[(Stage, bool, bool)]) -> Result<Vec<Counter>, StoreError> {
        let mut topic_events = Vec::new();
        for (stage, recovered, dead_letter) in fresh {
            // Recovered P2/P3 (store evidence) count apart: most stand beside the broker's
            // own record of the same stage.
            let stage_counter = if *recovered {
                Counter::StageRecovered(*stage)
            } else {
                Counter::Stage(*stage)
            };
            self.bump(stage_counter.into(), 1)?;
            let event = match (*stage, dead_letter) {
                (Stage::Redelivery, true) => Counter::DeadLetters,
                (Stage::Redelivery, _) => Counter::Redeliveries,
                // Globally, duplicates are the D1 stage counter.
                (Stage::Duplicate, _) => {
                    topic_events.push(Counter::Duplicates);
                    continue;
                }
                _ => continue,
            };
            self.bump(event.into(), 1)?;
            topic_events.push(event);
        }
        Ok(topic_events)
    }

    /// The summary remembers what the statistics counted for the message so far, and the
    /// funnel counts the messages whose summary has each step now: a step reached counts,
    /// a step lost (a message that gave records away, or whose trajectory no longer shows
    /// the step once later records arrived) is taken back, and a message whose topic became
    /// known moves its steps to that topic.
    fn count_funnel(
        &mut self,
        prev: Option<&MessageSummary>,
        summary: &MessageSummary,
    ) -> Result<(), StoreError> {
        let topic = summary.topic.as_deref().unwrap_or_default();
        let old_flags = prev.map(|s| s.funnel).unwrap_or_default();
        let old_topic = prev.map(|s| s.topic.as_deref().unwrap_or_default());
        for (i, step) in FunnelStep::ALL.into_iter().enumerate() {
            let c = Counter::Funnel(step);
            let (was, is) = (i64::from(old_flags[i]), i64::from(summary.funnel[i]));
            self.bump(c.into(), is - was)?;
            match old_topic {
                Some(ot) if ot != topic => {
                    self.bump_topic(ot, c, -was)?;
                    self.bump_topic(topic, c, is)?;
                }
                _ => self.bump_topic(topic, c, is - was)?,
            }
        }
        Ok(())
    }

    /// Pass 5: the re-uploads count globally and under the topic of the message stored
    /// again (every one of them was staged: it is in its request ID's regrouped set).
    fn count_reuploads(
        &mut self,
        again: &[String],
        staged: &[(String, Cached)],
    ) -> Result<(), StoreError> {
        for key in again {
            let staged_topic = staged
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, c)| c.summary.as_ref().and_then(|s| s.topic.clone()));
            let topic = match staged_topic {
                Some(tp) => tp,
                None => self.t.summary(key)?.and_then(|s| s.topic),
            }
            .unwrap_or_default();
            self.t.bump_both(
                &topic,
                Counter::DuplicatesAfterWindow,
                1,
                &mut self.out.counters,
            )?;
        }
        Ok(())
    }
}
