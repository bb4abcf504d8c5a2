//! The filters of a search that look at a message's summary beyond its topic, state and
//! time (which the store's indexes answer): a topic pattern, the producer, a consumer group,
//! a minimum end to end, an attribute, and a failure, a redelivery or a dead letter at any
//! hop. The last three are flags of the summary ([`MessageSummary::failed`] and the others),
//! computed from the trajectory when the summary is (with [`had_failure`], [`redelivered`]),
//! so a search never assembles a trajectory.

use crate::store::SearchQuery;
use crate::summary::MessageSummary;
use msgtrail_core::trajectory::{HopStatus, MessageState, Segment, Trajectory};
use msgtrail_core::Stage;

/// Whether a NATS-style pattern matches a topic: `*` matches one token, a final `>` one or
/// more; other tokens match themselves.
pub(crate) fn topic_matches(pattern: &str, topic: &str) -> bool {
    let mut t = topic.split('.');
    let mut p = pattern.split('.').peekable();
    while let Some(pt) = p.next() {
        if pt == ">" && p.peek().is_none() {
            return t.next().is_some();
        }
        match t.next() {
            Some(tt) if pt == "*" || pt == tt => {}
            _ => return false,
        }
    }
    t.next().is_none()
}

/// Whether a topic filter is a pattern (holds a wildcard token) rather than one topic.
pub(crate) fn is_pattern(topic: &str) -> bool {
    topic.split('.').any(|t| t == "*" || t == ">")
}

/// How long a message took end to end: its slowest group's (first send → that group's
/// final ack), or first → last record while no group has finished.
pub(crate) fn end_to_end(s: &MessageSummary) -> u64 {
    s.segments
        .iter()
        .filter(|(seg, _)| *seg == Segment::EndToEnd)
        .map(|(_, n)| *n)
        .max()
        .unwrap_or_else(|| s.last_at.saturating_sub(s.first_at))
}

/// A failed, dead-lettered, stuck or lost state.
pub(crate) fn bad(st: MessageState) -> bool {
    matches!(
        st,
        MessageState::Failed
            | MessageState::DeadLettered
            | MessageState::Stuck
            | MessageState::Lost
    )
}

/// Whether a message had a failure at any hop, even one a later attempt recovered from: a
/// hop in error, a group's error, a failure point, or a failed, dead-lettered, stuck or lost
/// state. (A summary keeps the answer as [`MessageSummary::failed`].)
pub fn had_failure(t: &Trajectory) -> bool {
    t.failure.is_some()
        || bad(t.state)
        || t.hops.iter().any(|h| h.status == HopStatus::Error)
        || t.groups
            .iter()
            .any(|g| g.last_error.is_some() || bad(g.state))
}

/// Whether a message was delivered again to some group.
pub fn redelivered(t: &Trajectory) -> bool {
    t.hops.iter().any(|h| {
        h.attempt.is_some_and(|a| a > 1) || h.events.iter().any(|r| r.stage == Stage::Redelivery)
    })
}

/// Whether some group dead-lettered the message.
pub(crate) fn dead_lettered(s: &MessageSummary) -> bool {
    s.dead_lettered
        || s.state == MessageState::DeadLettered
        || s.groups.values().any(|g| *g == MessageState::DeadLettered)
}

impl SearchQuery {
    /// Whether a summary passes the filters beyond topic, state and time.
    pub fn wants(&self, s: &MessageSummary) -> bool {
        self.topic_pattern
            .as_deref()
            .is_none_or(|p| s.topic.as_deref().is_some_and(|t| topic_matches(p, t)))
            && self
                .producer
                .as_deref()
                .is_none_or(|p| s.producer.as_ref().is_some_and(|c| c.as_str() == p))
            && self
                .group
                .as_deref()
                .is_none_or(|g| s.groups.contains_key(g))
            && self.min_end_to_end.is_none_or(|m| end_to_end(s) >= m)
            && (!self.dead_lettered || dead_lettered(s))
            && (!self.failed || s.failed)
            && (!self.redelivered || s.redelivered)
            && self
                .attr
                .as_ref()
                .is_none_or(|(k, v)| s.attrs.get(k) == Some(v))
            && self.partitions.as_ref().is_none_or(|ps| {
                crate::store::MessageKey::partition_of(&s.key).is_some_and(|p| ps.contains(&p))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_patterns_match_as_nats_subjects() {
        for (p, t, want) in [
            ("orders.*", "orders.eu", true),
            ("orders.*", "orders.eu.x", false),
            ("orders.*", "orders", false),
            ("orders.>", "orders.eu.x", true),
            ("orders.>", "orders", false),
            ("*.eu", "orders.eu", true),
            (">", "a.b", true),
            ("orders.eu", "orders.eu", true),
            ("orders.eu", "orders.us", false),
        ] {
            assert_eq!(topic_matches(p, t), want, "{p} vs {t}");
        }
        assert!(is_pattern("orders.*") && is_pattern(">") && !is_pattern("orders.eu*"));
    }
}
