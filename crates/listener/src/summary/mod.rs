//! The shadow message: what the listener keeps of each message for search, state counts and
//! statistics ([`MessageSummary`], derived from its trajectory), and its compact stored
//! form ([`MessageSummary::encode`] / [`MessageSummary::decode`]).
//!
//! The store writes a summary whenever a batch changes the message's trajectory, keeps it
//! in memory while the message is in flight, and diffs old against new to update the
//! counters ([`crate::counters`]) and latency statistics ([`new_latencies`]).
//!
//! A summary follows from a trajectory ([`MessageSummary::of`]); on the ingest path the
//! store derives it instead from a [`Folded`] state that each record updates (`fold`),
//! and assembles the trajectory only for what that state cannot decide.

mod codec;
mod fold;
#[cfg(test)]
mod fold_tests;

pub(crate) use codec::state_code;
pub(crate) use fold::Folded;
use msgtrail_core::trajectory::{MessageState, Segment, Trajectory};
use msgtrail_core::{ClientId, GroupId, MessageId, RequestId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The shadow message (docs/ARCHITECTURE.md §2), as indexed for search: one per message key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageSummary {
    /// The message key: the message ID, or `orphan/<producer>/<request-id>`.
    pub key: String,
    /// The message ID, once assigned.
    pub message_id: Option<MessageId>,
    /// The producer's request ID.
    pub request_id: Option<RequestId>,
    /// The producer.
    pub producer: Option<ClientId>,
    /// The topic, when known.
    pub topic: Option<String>,
    /// The overall state.
    pub state: MessageState,
    /// The state per consumer group.
    pub groups: BTreeMap<GroupId, MessageState>,
    /// Earliest record time, Unix nanoseconds.
    pub first_at: u64,
    /// Latest record time, Unix nanoseconds.
    pub last_at: u64,
    /// The first failure point, in words.
    pub failure: Option<String>,
    /// How many records the message has.
    pub records: usize,
    /// Which funnel steps it reached: sent, stored, delivered, acked.
    #[serde(default)]
    pub funnel: [bool; 4],
    /// Its completed latency segments (nanoseconds): what the statistics already counted.
    #[serde(default)]
    pub segments: Vec<(Segment, u64)>,
    /// Whether any hop failed, even one a later attempt recovered from
    /// ([`crate::search::had_failure`]).
    #[serde(default)]
    pub failed: bool,
    /// Whether some group got it again (an attempt after the first, or an R1 redelivery).
    #[serde(default)]
    pub redelivered: bool,
    /// Whether some group dead-lettered it.
    #[serde(default)]
    pub dead_lettered: bool,
    /// Its attributes (from P2; at most 32, docs/PROTOCOL.md §2), for the attribute search.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attrs: BTreeMap<String, String>,
    /// How many delivery attempts it had, over all groups (one per deliver hop); `None` for a
    /// summary stored before the count was kept, until a new record rewrites it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
}

impl MessageSummary {
    /// The summary of a trajectory stored under `key`.
    pub fn of(key: &str, t: &Trajectory) -> Self {
        MessageSummary {
            key: key.to_owned(),
            message_id: t.message_id,
            request_id: t.request_id.clone(),
            producer: t.producer.clone(),
            topic: t.topic.clone(),
            state: t.state,
            groups: t
                .groups
                .iter()
                .map(|g| (g.group.clone(), g.state))
                .collect(),
            first_at: t.first_at,
            last_at: t.last_at,
            failure: t.failure.clone(),
            records: t.record_count,
            funnel: funnel_flags(t),
            segments: t.segment_latencies(),
            failed: crate::search::had_failure(t),
            redelivered: crate::search::redelivered(t),
            dead_lettered: t.state == MessageState::DeadLettered
                || t.groups
                    .iter()
                    .any(|g| g.state == MessageState::DeadLettered),
            attrs: t.attrs.clone(),
            attempts: Some(delivery_attempts(t)),
        }
    }

    /// Fills the flags a value written before they existed lacks, from what it has: a
    /// failure point or a bad state (not a failure a later attempt recovered from, which
    /// only the trajectory tells), a dead-lettered state. Redeliveries stay unknown (false).
    fn derive_missing_flags(&mut self) {
        use crate::search::bad;
        self.failed |=
            self.failure.is_some() || bad(self.state) || self.groups.values().any(|g| bad(*g));
        self.dead_lettered |= self.state == MessageState::DeadLettered
            || self
                .groups
                .values()
                .any(|g| *g == MessageState::DeadLettered);
    }
}

/// A message's topic (`""` when unknown) and state: what the counts by state are kept by.
pub(crate) type TopicState = (String, MessageState);

/// A shadow-message state change for the counts by state: (old, new); `None` for a message
/// created or deleted.
pub(crate) type StateDelta = (Option<TopicState>, Option<TopicState>);

/// The (topic, state) a summary counts under.
pub(crate) fn topic_state(s: &MessageSummary) -> TopicState {
    (s.topic.clone().unwrap_or_default(), s.state)
}

fn funnel_flags(t: &Trajectory) -> [bool; 4] {
    use msgtrail_core::trajectory::HopKind;
    [
        t.hops.iter().any(|h| h.kind == HopKind::Send),
        t.hop("store").is_some_and(|h| h.end.is_some()),
        t.hops.iter().any(|h| h.kind == HopKind::Deliver),
        t.groups.iter().any(|g| g.acked_at.is_some()),
    ]
}

/// The latency samples a change adds: per segment, as many samples as the segment gained
/// (a segment whose value only moved — a late P1 moving the start — adds none, so counts
/// stay exact whatever the arrival order), taken from the values that are new.
pub(crate) fn new_latencies(old: &[(Segment, u64)], new: &[(Segment, u64)]) -> Vec<(Segment, u64)> {
    let mut out = Vec::new();
    // One set of lists for every segment, emptied between them.
    let (mut o, mut n, mut fresh) = (Vec::new(), Vec::new(), Vec::new());
    for seg in Segment::ALL {
        o.clear();
        o.extend(old.iter().filter(|(s, _)| s == seg).map(|(_, v)| *v));
        n.clear();
        n.extend(new.iter().filter(|(s, _)| s == seg).map(|(_, v)| *v));
        let gained = n.len().saturating_sub(o.len());
        if gained == 0 {
            continue;
        }
        fresh.clear();
        for &v in &n {
            match o.iter().position(|x| *x == v) {
                Some(i) => {
                    o.swap_remove(i);
                }
                None => fresh.push(v),
            }
        }
        fresh.sort_unstable();
        out.extend(fresh.iter().take(gained).map(|v| (*seg, *v)));
    }
    out
}

/// The delivery attempts of a trajectory, over all groups: its deliver hops.
fn delivery_attempts(t: &Trajectory) -> u32 {
    let n = t
        .hops
        .iter()
        .filter(|h| h.kind == msgtrail_core::trajectory::HopKind::Deliver)
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}
