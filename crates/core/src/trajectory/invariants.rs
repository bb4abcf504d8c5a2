//! What a trajectory shown to a user must never contain, checked: the causal invariants
//! (no hop ending before it starts, no delivery before the message was deliverable, states
//! only moving forward), unique span IDs, and a clock estimate on every hop whose four
//! NTP timestamps were all reported. The property tests assert them on random record sets;
//! [`Trajectory::audit`] lets an operator (`msgtrail audit`) check live trajectories.

use super::{HopKind, HopSpan, HopStatus, MessageState, StateChange, Trajectory};
use crate::stage::Stage;

impl Trajectory {
    /// Every invariant this trajectory breaks, in words (empty when it breaks none): see
    /// [`causal_violations`], [`span_id_collisions`] and [`missing_clock_bounds`].
    pub fn audit(&self) -> Vec<String> {
        let mut out = causal_violations(self);
        out.extend(span_id_collisions(self));
        out.extend(missing_clock_bounds(self));
        out
    }
}

/// Hops that share a span ID (each hop is its own span).
pub fn span_id_collisions(t: &Trajectory) -> Vec<String> {
    let mut seen: std::collections::BTreeMap<&str, &str> = Default::default();
    let mut out = Vec::new();
    for h in &t.hops {
        if let Some(id) = h.span_id.as_deref() {
            if let Some(other) = seen.insert(id, &h.key) {
                out.push(format!("hops {other} and {} share span ID {id}", h.key));
            }
        }
    }
    out
}

/// The four stages whose times make an NTP exchange: (client send, broker receive, broker
/// send, client receive) for an upload, (broker send, client receive, client send, broker
/// receive) for a push or pull delivery.
const EXCHANGES: [[Stage; 4]; 3] = [
    [
        Stage::UploadSent,
        Stage::UploadReceived,
        Stage::Stored,
        Stage::StoreConfirmed,
    ],
    [
        Stage::PushSent,
        Stage::PushReceived,
        Stage::PushAckSent,
        Stage::PushAckReceived,
    ],
    [
        Stage::PullSent,
        Stage::PullReceived,
        Stage::PullAckSent,
        Stage::PullAckReceived,
    ],
];

/// The hops that make one exchange with `h`, itself included: the send and store hops of
/// the upload; the deliver and process hops of one delivery attempt.
fn exchange_of<'t>(t: &'t Trajectory, h: &HopSpan) -> Vec<&'t HopSpan> {
    let same_delivery = |o: &HopSpan| {
        (o.group.as_ref(), o.consumer.as_ref(), o.attempt, o.by_id)
            == (h.group.as_ref(), h.consumer.as_ref(), h.attempt, h.by_id)
    };
    t.hops
        .iter()
        .filter(|o| match h.kind {
            HopKind::Send | HopKind::Store => matches!(o.kind, HopKind::Send | HopKind::Store),
            HopKind::Deliver | HopKind::Process => {
                matches!(o.kind, HopKind::Deliver | HopKind::Process) && same_delivery(o)
            }
        })
        .collect()
}

/// Whether `hops` hold a reported (not recovered) record of each stage of `quad`, and the
/// broker-written ones name at most one broker instance.
fn exchange_complete(hops: &[&HopSpan], quad: &[Stage; 4]) -> bool {
    let reported: Vec<&crate::record::StageRecord> = hops
        .iter()
        .flat_map(|h| h.events.iter())
        .filter(|r| quad.contains(&r.stage) && !r.is_recovered())
        .collect();
    let mut instances = reported.iter().filter_map(|r| r.broker.as_ref());
    let first = instances.next();
    quad.iter().all(|s| reported.iter().any(|r| r.stage == *s))
        && instances.all(|b| Some(b) == first)
}

/// Hops whose exchange's four timestamps were all reported (by the broker and the client,
/// none recovered, the broker's by one broker instance) but that carry no clock estimate.
pub fn missing_clock_bounds(t: &Trajectory) -> Vec<String> {
    let complete = |hops: &[&HopSpan]| EXCHANGES.iter().any(|quad| exchange_complete(hops, quad));
    t.hops
        .iter()
        .filter(|h| h.clock.is_none() && !h.synthesized && h.impossible.is_none())
        .filter(|h| complete(&exchange_of(t, h)))
        .map(|h| format!("hop {} has all four timestamps but no clock bound", h.key))
        .collect()
}

/// What a shown trajectory must never contain, in words (empty when it has none): a hop
/// ending before it starts; a delivery the broker recorded starting before the message was
/// deliverable (the store hop's end; unless the store hop is flagged impossible, which says
/// so instead); a
/// state regression (a message-level state after a consumption's, `sent` after `enqueued`,
/// a consumption moving back within an attempt or to an earlier attempt, `stuck`/`lost`
/// anywhere but last).
pub fn causal_violations(t: &Trajectory) -> Vec<String> {
    let mut out = Vec::new();
    for h in &t.hops {
        if h.end.is_some_and(|e| e < h.start) {
            out.push(format!("hop {} ends before it starts", h.key));
        }
    }
    let store = t.hop("store");
    // A store hop ended by a recovered P3 alone is on the nats-server's clock: exempt.
    let on_broker_clock = |s: &&HopSpan| {
        s.events
            .iter()
            .all(|r| r.stage != Stage::Stored || !r.is_recovered())
    };
    // A store hop that failed (the broker refused the upload) gives no time the message
    // became deliverable: a delivery record beside it contradicts the refusal, which the
    // trajectory shows as such, not as a causality error.
    let deliverable = store
        .filter(|s| s.impossible.is_none() && s.status != HopStatus::Error)
        .filter(on_broker_clock)
        .and_then(|s| s.end);
    // A synthesized deliver hop (only the consumer's records) starts on the consumer's
    // clock: no broker time to compare.
    for h in t
        .hops
        .iter()
        .filter(|h| h.kind == HopKind::Deliver && !h.synthesized)
    {
        if deliverable.is_some_and(|d| h.start < d) {
            out.push(format!(
                "{} starts before the message was deliverable",
                h.key
            ));
        }
    }
    out.extend(state_regressions(&t.states));
    out
}

/// The state regressions of a state history (see [`causal_violations`]).
pub fn state_regressions(states: &[StateChange]) -> Vec<String> {
    let mut out = Vec::new();
    let rank = |s: MessageState| match s {
        MessageState::Delivered => 0,
        MessageState::Consuming => 1,
        _ => 2,
    };
    let mut seen_group = false;
    let mut seen_enqueued = false;
    let mut last: std::collections::BTreeMap<(String, bool), (Option<u32>, u8)> =
        Default::default();
    for (i, c) in states.iter().enumerate() {
        match (c.state, &c.group) {
            (MessageState::Stuck | MessageState::Lost, None) if i + 1 != states.len() => {
                out.push(format!("{} is not the last state", c.state))
            }
            (MessageState::Stuck | MessageState::Lost, None) => {}
            (s, None) if seen_group => out.push(format!("{s} after a consumption's state")),
            (MessageState::Sent, None) if seen_enqueued => out.push("sent after enqueued".into()),
            (s, None) => seen_enqueued |= s == MessageState::Enqueued,
            (s, Some(g)) => {
                seen_group = true;
                let now = (c.attempt, rank(s));
                let key = (g.as_str().to_owned(), c.by_id);
                if last.get(&key).is_some_and(|prev| *prev > now) {
                    out.push(format!("group {g} moved back to {s}"));
                }
                last.insert(key, now);
            }
        }
    }
    out
}
