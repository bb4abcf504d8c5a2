//! The consumer-group views as shares a listener group merges: a member answers for some
//! stage partitions with what the views are computed from, not the views themselves, so
//! that the merged views are what one listener holding every message would compute.
//!
//! - [`Tally`]: per group its messages by state and topics, and per topic the stored
//!   messages (all and per group that got them): summed over members, it gives every
//!   count of `GET /api/groups`, the backlog's "not delivered" included.
//! - [`GroupsShare`]: a window's tally (`GET /api/share/groups`).
//! - [`SampleParts`]: what a group's sampled trajectories say, the latency samples raw, so
//!   the merged percentiles are computed over every member's samples.
//! - [`GroupDetailShare`]: both, for one group (`GET /api/share/groups/{group}`).

#[cfg(doc)]
use super::groups::SCAN_MAX;
use super::groups::{empty, GroupCounts, GroupDetail, GroupsOverview, Member};
use crate::summary::MessageSummary;
use msgtrail_core::trajectory::MessageState;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What the group counts of some messages are computed from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Tally {
    /// Per group: its messages, by state, and their topics (the rest left empty).
    pub groups: BTreeMap<String, GroupCounts>,
    /// Stored messages per topic.
    pub stored: BTreeMap<String, u64>,
    /// Per group, per topic: the stored messages it got.
    pub got: BTreeMap<String, BTreeMap<String, u64>>,
    /// The oldest first record time of the messages.
    pub first_at: Option<u64>,
}

impl Tally {
    /// The tally of a window's summaries.
    pub(crate) fn of(summaries: &[MessageSummary]) -> Tally {
        let mut t = Tally::default();
        for s in summaries {
            for (g, st) in &s.groups {
                let g = g.as_str();
                let c = t.groups.entry(g.to_owned()).or_insert_with(|| empty(g));
                c.messages += 1;
                *c.states.entry(*st).or_default() += 1;
                c.topics.extend(s.topic.clone());
            }
            t.first_at = Some(t.first_at.map_or(s.first_at, |f| f.min(s.first_at)));
            let (true, Some(topic)) = (s.funnel[1], &s.topic) else {
                continue;
            };
            *t.stored.entry(topic.clone()).or_default() += 1;
            for g in s.groups.keys() {
                *t.got
                    .entry(g.as_str().to_owned())
                    .or_default()
                    .entry(topic.clone())
                    .or_default() += 1;
            }
        }
        t
    }

    /// Adds another member's tally (of other messages).
    pub(crate) fn add(&mut self, o: &Tally) {
        for (g, c) in &o.groups {
            let mine = self.groups.entry(g.clone()).or_insert_with(|| empty(g));
            mine.messages += c.messages;
            for (st, n) in &c.states {
                *mine.states.entry(*st).or_default() += n;
            }
            mine.topics.extend(c.topics.iter().cloned());
        }
        for (topic, n) in &o.stored {
            *self.stored.entry(topic.clone()).or_default() += n;
        }
        for (g, by_topic) in &o.got {
            let mine = self.got.entry(g.clone()).or_default();
            for (topic, n) in by_topic {
                *mine.entry(topic.clone()).or_default() += n;
            }
        }
        self.first_at = match (self.first_at, o.first_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    /// Every group's counts at `now`: a stored message of a group's topics that it did not
    /// get is not delivered; the ack rate is over the time since the oldest message.
    pub(crate) fn counts(&self, now: u64) -> Vec<GroupCounts> {
        let secs = (now.saturating_sub(self.first_at.unwrap_or(now)) as f64 / 1e9).max(1.0);
        self.groups
            .values()
            .map(|c| {
                let mut c = c.clone();
                let got = self.got.get(&c.group);
                c.not_delivered = c
                    .topics
                    .iter()
                    .map(|t| {
                        let stored = self.stored.get(t).copied().unwrap_or(0);
                        let got = got.and_then(|g| g.get(t)).copied().unwrap_or(0);
                        stored.saturating_sub(got)
                    })
                    .sum();
                let n = |st: MessageState| c.states.get(&st).copied().unwrap_or(0);
                c.in_flight = n(MessageState::Delivered) + n(MessageState::Consuming);
                c.unsettled = c.in_flight + n(MessageState::Failed);
                c.backlog = c.unsettled + c.not_delivered;
                c.consumed = n(MessageState::Consumed);
                c.dead_letters = n(MessageState::DeadLettered);
                c.ack_rate_per_sec = c.consumed as f64 / secs;
                c
            })
            .collect()
    }
}

/// A member's share of `GET /api/groups`: its window's tally.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct GroupsShare {
    /// The window's start (Unix nanoseconds).
    pub from: u64,
    /// Messages read.
    pub scanned: usize,
    /// The window held more than [`SCAN_MAX`] messages: only the newest were read (merged:
    /// some member's did).
    pub truncated: bool,
    /// Their tally.
    pub tally: Tally,
}

impl GroupsShare {
    /// Adds another member's share (the window starts at the earliest of theirs).
    pub(crate) fn add(&mut self, o: &GroupsShare) {
        self.from = self.from.min(o.from);
        self.scanned += o.scanned;
        self.truncated |= o.truncated;
        self.tally.add(&o.tally);
    }

    /// The overview at `now`.
    pub(crate) fn overview(&self, now: u64) -> GroupsOverview {
        GroupsOverview {
            from: self.from,
            generated_at: now,
            scanned: self.scanned,
            truncated: self.truncated,
            groups: self.tally.counts(now),
        }
    }
}

/// What a group's sampled trajectories say, before percentiles.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct SampleParts {
    /// How many trajectories.
    pub sample: usize,
    /// Deliveries after a first one.
    pub redeliveries: u64,
    /// The group's consumers.
    pub members: Vec<Member>,
    /// Per segment (`queue_wait`, `deliver`, `process`, `end_to_end`) its samples,
    /// nanoseconds.
    pub segments: Vec<(String, Vec<u64>)>,
}

impl SampleParts {
    /// Adds another member's sample: consumers by name (deliveries summed, the latest
    /// seen), latency samples together.
    pub(crate) fn add(&mut self, o: SampleParts) {
        self.sample += o.sample;
        self.redeliveries += o.redeliveries;
        for m in o.members {
            match self.members.iter_mut().find(|x| x.consumer == m.consumer) {
                Some(x) => {
                    x.deliveries += m.deliveries;
                    x.last_seen = x.last_seen.max(m.last_seen);
                }
                None => self.members.push(m),
            }
        }
        for (name, v) in o.segments {
            match self.segments.iter_mut().find(|(n, _)| *n == name) {
                Some((_, mine)) => mine.extend(v),
                None => self.segments.push((name, v)),
            }
        }
    }
}

/// A member's share of `GET /api/groups/{group}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct GroupDetailShare {
    /// The window's tally (every group: the backlog needs the topics' stored messages).
    pub groups: GroupsShare,
    /// The group's newest messages (at most `SAMPLE_MAX` per member).
    pub sample: SampleParts,
}

impl GroupDetailShare {
    /// Adds another member's share.
    pub(crate) fn add(&mut self, o: GroupDetailShare) {
        self.groups.add(&o.groups);
        self.sample.add(o.sample);
    }

    /// `group`'s detail at `now`; `None` when no message of the window reached it.
    pub(crate) fn detail(self, group: &str, now: u64) -> Option<GroupDetail> {
        let counts = self
            .groups
            .tally
            .counts(now)
            .into_iter()
            .find(|c| c.group == group)?;
        Some(self.sample.detail(counts))
    }
}
