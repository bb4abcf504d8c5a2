//! From hops to the shadow message: per-group summaries ([`group_summary`]), the overall
//! state ([`overall_state`]), the state history ([`state_history`]) and the first failure
//! point. Runs after [`super::assembly`] built the hops, before [`super::diagnosis`].

use super::assembly::{Ctx, UploadTimes};
use super::model::{
    GroupSummary, HopKind, HopSpan, HopStatus, MessageState, StateChange, Trajectory,
};
use crate::ids::ClientId;
use crate::outcome::{Outcome, ProcessOutcome, RedeliveryOutcome, SettleOutcome};
use crate::record::StageRecord;
use crate::stage::Stage;
use crate::GroupId;
use std::collections::{BTreeMap, BTreeSet};

/// Whether a settle record (C4/C8) acked: an ack, or no outcome at all.
fn is_ack(r: &StageRecord) -> bool {
    matches!(
        r.typed_outcome(),
        None | Some(Outcome::Settle(SettleOutcome::Ack))
    )
}

fn is_settle_received(r: &StageRecord) -> bool {
    matches!(r.stage, Stage::PushAckReceived | Stage::PullAckReceived)
}

fn is_dead_letter(r: &StageRecord) -> bool {
    r.stage == Stage::Redelivery && r.redelivery_outcome() == Some(RedeliveryOutcome::DeadLetter)
}

fn is_failed_processing(r: &StageRecord) -> bool {
    r.stage == Stage::ProcessFinished && r.process_outcome() == Some(ProcessOutcome::Failed)
}

/// Fills the groups, the state, the state history and the failure of `t`, whose hops are
/// built. `failures` are the failure points the hops found, in order; the first one (of
/// those and of the ones found here) is the trajectory's failure.
pub(super) fn derive(
    ctx: &Ctx<'_>,
    t: &mut Trajectory,
    times: &UploadTimes,
    mut failures: Vec<String>,
) {
    // Times implied by inference are no measurements: no latency starts at them.
    let first_send = t
        .hops
        .iter()
        .find(|h| h.kind == HopKind::Send && !h.inferred)
        .map(|h| h.start);
    let e2e_from = first_send.or(times.p2_at);
    // A group's fetches by message ID are a consumption of their own (PROTOCOL.md §8.2).
    let consumptions: BTreeSet<(&GroupId, bool)> = t
        .hops
        .iter()
        .filter_map(|h| Some((h.group.as_ref()?, h.by_id)))
        .collect();
    t.groups = consumptions
        .into_iter()
        .map(|(g, by_id)| group_summary(&t.hops, g, by_id, e2e_from, &mut failures))
        .collect();
    let (state, stuck_reason) = overall_state(ctx, t, times);
    failures.extend(stuck_reason);
    if state == MessageState::Lost {
        failures.extend(t.hop("send").and_then(|h| h.reason.clone()));
    }
    t.state = state;
    t.states = state_history(ctx, t, times);
    t.failure = failures.into_iter().next();
}

/// One group's consumption (through its subscriptions, or by message ID); a dead letter or
/// a stuck delivery adds its failure point.
fn group_summary(
    hops: &[HopSpan],
    group: &GroupId,
    by_id: bool,
    e2e_from: Option<u64>,
    failures: &mut Vec<String>,
) -> GroupSummary {
    let gh: Vec<&HopSpan> = hops
        .iter()
        .filter(|h| h.group.as_ref() == Some(group) && h.by_id == by_id)
        .collect();
    let all_recs = || gh.iter().flat_map(|h| h.events.iter());
    let consumers: BTreeSet<ClientId> = gh.iter().filter_map(|h| h.consumer.clone()).collect();
    let max_attempt = gh.iter().filter_map(|h| h.attempt).max().unwrap_or(0);
    let acked_at = all_recs()
        .filter(|r| is_settle_received(r) && is_ack(r))
        .map(|r| r.at)
        .max();
    let dead = all_recs().any(is_dead_letter);
    let last_error = all_recs()
        .filter(|r| is_failed_processing(r))
        .max_by_key(|r| r.at)
        .map(|r| r.detail.clone().unwrap_or_else(|| "failed".into()));
    // The latest attempt decides the state.
    let latest: Vec<&HopSpan> = gh
        .iter()
        .copied()
        .filter(|h| h.attempt == Some(max_attempt))
        .collect();
    let state = group_state(&latest, dead, acked_at.is_some());
    if state == MessageState::DeadLettered {
        let last = last_error.as_deref().map(|e| format!("; last error: {e}"));
        let how = if by_id {
            " (fetched by message ID)"
        } else {
            ""
        };
        failures.push(format!(
            "dead-lettered by group {group}{how} after {max_attempt} attempt(s){}",
            last.unwrap_or_default()
        ));
    }
    if state == MessageState::Stuck {
        let stuck = latest.iter().find(|h| h.status == HopStatus::Error);
        failures.extend(stuck.and_then(|h| h.reason.clone()));
    }
    GroupSummary {
        group: group.clone(),
        by_id,
        state,
        attempts: max_attempt,
        consumers: consumers.into_iter().collect(),
        acked_at,
        end_to_end_nanos: match (e2e_from, acked_at) {
            (Some(f), Some(a)) => Some(a.saturating_sub(f)),
            _ => None,
        },
        last_error,
    }
}

/// A group's state from its latest attempt's hops.
fn group_state(latest: &[&HopSpan], dead: bool, acked: bool) -> MessageState {
    let latest_recs = || latest.iter().flat_map(|h| h.events.iter());
    if dead {
        MessageState::DeadLettered
    } else if acked {
        MessageState::Consumed
    } else if latest.iter().any(|h| {
        h.status == HopStatus::Error && h.reason.as_deref().is_some_and(|r| r.starts_with("stuck"))
    }) {
        MessageState::Stuck
    } else if latest
        .iter()
        .any(|h| h.kind == HopKind::Process && h.status == HopStatus::Error)
        || latest_recs().any(|r| is_settle_received(r) && r.outcome.is_some() && !is_ack(r))
    {
        MessageState::Failed
    } else if latest_recs().any(|r| r.stage == Stage::ProcessStarted) {
        MessageState::Consuming
    } else {
        MessageState::Delivered
    }
}

/// The overall state, and why it is stuck when the store or the first delivery is overdue.
fn overall_state(
    ctx: &Ctx<'_>,
    t: &Trajectory,
    times: &UploadTimes,
) -> (MessageState, Option<String>) {
    let d = ctx.opts.deadlines;
    // A later stage implies the earlier ones: a delivered message was stored.
    let stored =
        times.p3_at.is_some() || times.p2_at.is_some() || times.first_delivery_at.is_some();
    if !stored {
        let lost = t.hop("send").is_some_and(|h| h.status == HopStatus::Error);
        let state = if lost {
            MessageState::Lost
        } else {
            MessageState::Sent
        };
        return (state, None);
    }
    if t.groups.is_empty() {
        let since = times.p3_at.or(times.p2_at).unwrap_or(0);
        return if times.p3_at.is_some() && ctx.overdue(since, d.delivered_ms) {
            let why = format!(
                "stored, but not delivered to any consumer within {} ms",
                d.delivered_ms
            );
            (MessageState::Stuck, Some(why))
        } else if times.p3_at.is_none() && ctx.overdue(since, d.stored_ms) {
            let why = "received by the broker, never stored".to_owned();
            (MessageState::Stuck, Some(why))
        } else {
            (MessageState::Enqueued, None)
        };
    }
    // The worst group state wins.
    (
        MessageState::worst_of_groups(t.groups.iter().map(|g| g.state)),
        None,
    )
}

/// The state a record moves its group to, if any.
fn record_state(r: &StageRecord) -> Option<MessageState> {
    match r.stage {
        Stage::PushSent | Stage::PullSent => Some(MessageState::Delivered),
        Stage::ProcessStarted => Some(MessageState::Consuming),
        Stage::ProcessFinished if is_failed_processing(r) => Some(MessageState::Failed),
        Stage::PushAckReceived | Stage::PullAckReceived if is_ack(r) => {
            Some(MessageState::Consumed)
        }
        Stage::PushAckReceived | Stage::PullAckReceived => Some(MessageState::Failed),
        Stage::Redelivery if is_dead_letter(r) => Some(MessageState::DeadLettered),
        _ => None,
    }
}

/// How far along one delivery attempt a state is: a consumption only moves forward.
fn attempt_rank(s: MessageState) -> u8 {
    match s {
        MessageState::Delivered => 0,
        MessageState::Consuming => 1,
        _ => 2,
    }
}

/// When the message was enqueued: when the store hop says it was stored (or inferred it),
/// else when the broker received it, else the first delivery.
fn enqueued_at(t: &Trajectory, times: &UploadTimes) -> Option<u64> {
    let stored = t
        .hop("store")
        .filter(|h| h.inferred || times.p3_at.is_some())
        .and_then(|h| h.end);
    stored.or(times.p2_at).or(times.first_delivery_at)
}

/// Every state change with its time, in causal order (see [`Trajectory::states`]): the
/// message's own changes first, then each consumption's changes sorted by (attempt, how far
/// along, time), the consumptions merged by time, and a `stuck` or `lost` last.
fn state_history(ctx: &Ctx<'_>, t: &Trajectory, times: &UploadTimes) -> Vec<StateChange> {
    let message = |state: MessageState, at: u64| StateChange {
        state,
        at,
        group: None,
        consumer: None,
        by_id: false,
        attempt: None,
    };
    let mut states: Vec<StateChange> = times
        .p1_at
        .map(|at| message(MessageState::Sent, at))
        .into_iter()
        .chain(enqueued_at(t, times).map(|at| message(MessageState::Enqueued, at)))
        .collect();
    // One forward-only sequence per consumption (group, by ID or not).
    let mut per_consumption: BTreeMap<(GroupId, bool), Vec<StateChange>> = BTreeMap::new();
    for h in &t.hops {
        let Some(group) = h.group.clone() else {
            continue;
        };
        for r in &h.events {
            if let Some(state) = record_state(r) {
                let change = StateChange {
                    state,
                    at: r.at,
                    group: Some(group.clone()),
                    consumer: h.consumer.clone(),
                    by_id: h.by_id,
                    attempt: h.attempt,
                };
                per_consumption
                    .entry((group.clone(), h.by_id))
                    .or_default()
                    .push(change);
            }
        }
    }
    let mut sequences: Vec<Vec<StateChange>> = per_consumption.into_values().collect();
    for seq in &mut sequences {
        seq.sort_by(|a, b| {
            let key = |c: &StateChange| (c.attempt, attempt_rank(c.state), c.at, c.state);
            key(a)
                .cmp(&key(b))
                .then_with(|| a.consumer.cmp(&b.consumer))
        });
    }
    states.extend(merge_by_time(sequences));
    if matches!(t.state, MessageState::Stuck | MessageState::Lost) {
        if let Some(now) = ctx.opts.now {
            states.push(message(t.state, now));
        }
    }
    states
}

/// Merges ordered sequences into one, taking at each step the sequence whose next change is
/// earliest (ties to the first sequence): each sequence keeps its own order.
fn merge_by_time(sequences: Vec<Vec<StateChange>>) -> Vec<StateChange> {
    let mut iters: Vec<_> = sequences
        .into_iter()
        .map(|s| s.into_iter().peekable())
        .collect();
    let mut out = Vec::new();
    loop {
        let next = iters
            .iter_mut()
            .enumerate()
            .filter_map(|(i, it)| Some((it.peek()?.at, i)))
            .min();
        let Some((_, i)) = next else {
            return out;
        };
        out.extend(iters[i].next());
    }
}
