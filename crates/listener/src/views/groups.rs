//! The consumer-group view: per group, what its messages of a recent window are doing.
//!
//! Counts come from the shadow messages of the window (the newest [`SCAN_MAX`] at most):
//! each summary knows its state per group. What needs hops — members, redeliveries, latency
//! percentiles per hop segment — comes from the trajectories of the group's newest
//! [`SAMPLE_MAX`] messages, assembled on demand (about a millisecond each).

use super::group_share::{GroupDetailShare, GroupsShare, SampleParts, Tally};
use super::Percentiles;
use crate::error::StoreError;
use crate::store::{SearchQuery, Store};
use crate::summary::MessageSummary;
use msgtrail_core::partition::Partition;
use msgtrail_core::trajectory::{HopKind, MessageState, Trajectory};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Most shadow messages one view reads (the newest of the window).
pub(crate) const SCAN_MAX: usize = 10_000;
/// Most trajectories the view of one group assembles (its newest messages).
pub(crate) const SAMPLE_MAX: usize = 300;

/// One consumer group's messages of the window, by what they are doing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct GroupCounts {
    /// The group.
    pub group: String,
    /// Messages the group got (a delivery at least).
    pub messages: u64,
    /// Those messages by the group's state.
    pub states: BTreeMap<MessageState, u64>,
    /// Delivered and not settled yet: delivered or being processed.
    pub in_flight: u64,
    /// Not settled for good: in flight, or failed (nacked, waiting for a redelivery).
    pub unsettled: u64,
    /// Stored messages of the group's topics (those it got messages of) that it has not got
    /// yet, as far as the listener knows (a group whose attribute filter skips a message
    /// never gets it: it counts here all the same).
    pub not_delivered: u64,
    /// `unsettled + not_delivered`.
    pub backlog: u64,
    /// Messages the group consumed.
    pub consumed: u64,
    /// Messages the group dead-lettered.
    pub dead_letters: u64,
    /// Messages the group consumed per second, from the window's first message to now.
    pub ack_rate_per_sec: f64,
    /// The topics the group got messages of.
    pub topics: BTreeSet<String>,
}

/// The body of `GET /api/groups`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct GroupsOverview {
    /// The window's start: messages first seen since then (Unix nanoseconds).
    pub from: u64,
    /// When this was computed (Unix nanoseconds).
    pub generated_at: u64,
    /// How many messages were read.
    pub scanned: usize,
    /// The window held more than [`SCAN_MAX`] messages: only the newest were read.
    pub truncated: bool,
    /// Per group, sorted by name.
    pub groups: Vec<GroupCounts>,
}

/// A consumer of a group, as the sampled trajectories saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Member {
    /// The consumer's client ID.
    pub consumer: String,
    /// Deliveries to it in the sample.
    pub deliveries: u64,
    /// Its latest delivery's last time (Unix nanoseconds).
    pub last_seen: u64,
}

/// The body of `GET /api/groups/{group}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct GroupDetail {
    /// The counts over the window, as in [`GroupsOverview`].
    pub counts: GroupCounts,
    /// How many of its newest messages the rest is about (at most [`SAMPLE_MAX`]).
    pub sample: usize,
    /// Deliveries after a first one, in the sample.
    pub redeliveries: u64,
    /// Its consumers, most recently seen first.
    pub members: Vec<Member>,
    /// Latency per hop segment, in the sample: `queue_wait` (stored → the group's first
    /// delivery), `deliver` (delivery → the broker got the settle), `process` (the
    /// consumer's receipt → its settle), `end_to_end` (first upload → the group's ack).
    pub segments: Vec<Percentiles>,
}

/// Which messages a view reads: those first seen in the last `since_secs` seconds, of
/// `partitions` only when given (a group member's share).
#[derive(Debug, Clone)]
pub(crate) struct Window {
    /// The window's length, seconds.
    pub since_secs: u64,
    /// Only these stage partitions' messages.
    pub partitions: Option<Vec<Partition>>,
}

fn window(store: &Store, now: u64, w: &Window) -> Result<(u64, Vec<MessageSummary>), StoreError> {
    let from = now.saturating_sub(w.since_secs.saturating_mul(1_000_000_000));
    let found = store.search(&SearchQuery {
        from: Some(from),
        limit: Some(SCAN_MAX),
        partitions: w.partitions.clone(),
        ..Default::default()
    })?;
    Ok((from, found))
}

/// Every group's counts over the messages first seen in the last `since_secs`.
pub(crate) fn groups(
    store: &Store,
    now: u64,
    since_secs: u64,
) -> Result<GroupsOverview, StoreError> {
    let w = Window {
        since_secs,
        partitions: None,
    };
    Ok(groups_share(store, now, &w)?.overview(now))
}

/// The counts of a window's messages, as a share a group merges ([`GroupsShare`]).
pub(crate) fn groups_share(store: &Store, now: u64, w: &Window) -> Result<GroupsShare, StoreError> {
    let (from, found) = window(store, now, w)?;
    Ok(GroupsShare {
        from,
        scanned: found.len(),
        truncated: found.len() >= SCAN_MAX,
        tally: Tally::of(&found),
    })
}

/// One group's counts, members, redeliveries and latencies; `None` when no message of the
/// window reached it.
pub(crate) fn group_detail(
    store: &Store,
    group: &str,
    now: u64,
    since_secs: u64,
) -> Result<Option<GroupDetail>, StoreError> {
    let w = Window {
        since_secs,
        partitions: None,
    };
    Ok(group_detail_share(store, group, now, &w)?.detail(group, now))
}

/// One group's share of a window ([`GroupDetailShare`]): the window's counts and the
/// group's sample, unsummarized.
pub(crate) fn group_detail_share(
    store: &Store,
    group: &str,
    now: u64,
    w: &Window,
) -> Result<GroupDetailShare, StoreError> {
    let groups = groups_share(store, now, w)?;
    if !groups.tally.groups.contains_key(group) {
        return Ok(GroupDetailShare {
            groups,
            sample: SampleParts::default(),
        });
    }
    let newest = store.search(&SearchQuery {
        from: Some(groups.from),
        group: Some(group.to_owned()),
        limit: Some(SAMPLE_MAX),
        partitions: w.partitions.clone(),
        ..Default::default()
    })?;
    let mut sample = Vec::with_capacity(newest.len());
    for s in &newest {
        if let Some(t) = store.trajectory(&s.key, now)? {
            sample.push(t);
        }
    }
    Ok(GroupDetailShare {
        groups,
        sample: SampleParts::of(group, &sample),
    })
}

/// The counts per group of a window's summaries.
#[cfg(test)]
pub(crate) fn count(summaries: &[MessageSummary], now: u64) -> Vec<GroupCounts> {
    Tally::of(summaries).counts(now)
}

pub(super) fn empty(group: &str) -> GroupCounts {
    GroupCounts {
        group: group.to_owned(),
        messages: 0,
        states: BTreeMap::new(),
        in_flight: 0,
        unsettled: 0,
        not_delivered: 0,
        backlog: 0,
        consumed: 0,
        dead_letters: 0,
        ack_rate_per_sec: 0.0,
        topics: BTreeSet::new(),
    }
}

/// Members, redeliveries and latencies of `group` in sampled trajectories (the counts are
/// left empty).
#[cfg(test)]
pub(crate) fn of_sample(group: &str, sample: &[Trajectory]) -> GroupDetail {
    SampleParts::of(group, sample).detail(empty(group))
}

impl SampleParts {
    /// What sampled trajectories say of `group`: members, redeliveries, latency samples.
    pub(crate) fn of(group: &str, sample: &[Trajectory]) -> SampleParts {
        let mut redeliveries = 0u64;
        let mut members: BTreeMap<String, Member> = BTreeMap::new();
        let (mut wait, mut deliver, mut process, mut e2e) = (vec![], vec![], vec![], vec![]);
        for t in sample {
            for g in t
                .groups
                .iter()
                .filter(|g| g.group.as_str() == group && !g.by_id)
            {
                redeliveries += u64::from(g.attempts.saturating_sub(1));
                e2e.extend(g.end_to_end_nanos);
            }
            let hops = t
                .hops
                .iter()
                .filter(|h| !h.by_id && h.group.as_ref().is_some_and(|g| g.as_str() == group));
            let mut first_delivery: Option<u64> = None;
            for h in hops {
                match h.kind {
                    HopKind::Deliver => {
                        deliver.extend(h.latency_nanos);
                        first_delivery = Some(first_delivery.map_or(h.start, |f| f.min(h.start)));
                        let consumer = h.consumer.as_ref().map_or("?", |c| c.as_str());
                        let m = members
                            .entry(consumer.to_owned())
                            .or_insert_with(|| Member {
                                consumer: consumer.to_owned(),
                                deliveries: 0,
                                last_seen: 0,
                            });
                        m.deliveries += 1;
                        m.last_seen = m.last_seen.max(h.end.unwrap_or(h.start));
                    }
                    HopKind::Process => process.extend(h.latency_nanos),
                    HopKind::Send | HopKind::Store => {}
                }
            }
            let stored = t.hop("store").filter(|h| !h.inferred).and_then(|h| h.end);
            if let (Some(s), Some(d)) = (stored, first_delivery) {
                wait.push(d.saturating_sub(s));
            }
        }
        SampleParts {
            sample: sample.len(),
            redeliveries,
            members: members.into_values().collect(),
            segments: [
                ("queue_wait", wait),
                ("deliver", deliver),
                ("process", process),
                ("end_to_end", e2e),
            ]
            .into_iter()
            .map(|(n, v)| (n.to_owned(), v))
            .collect(),
        }
    }

    /// The group's detail with `counts`: members most recently seen first, percentiles of
    /// the latency samples.
    pub(crate) fn detail(self, counts: GroupCounts) -> GroupDetail {
        let mut members = self.members;
        members.sort_by(|a, b| {
            b.last_seen
                .cmp(&a.last_seen)
                .then(a.consumer.cmp(&b.consumer))
        });
        let segments = self
            .segments
            .into_iter()
            .filter_map(|(name, v)| Percentiles::of(&name, v))
            .collect();
        GroupDetail {
            counts,
            sample: self.sample,
            redeliveries: self.redeliveries,
            members,
            segments,
        }
    }
}
