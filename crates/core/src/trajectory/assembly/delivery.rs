//! The consumer's side: one hop per delivery attempt (pull or push), its deliver and process
//! children, and the order of all hops.

use super::*;

/// Push or pull, from the first record that says.
pub(super) fn delivery_mode(v: &AttemptRecs) -> Option<DeliveryMode> {
    v.deliver
        .iter()
        .chain(v.process.iter())
        .find(|r| {
            !matches!(
                r.stage,
                Stage::Redelivery | Stage::ProcessStarted | Stage::ProcessFinished
            )
        })
        .map(|r| {
            if r.stage.is_push() {
                DeliveryMode::Push
            } else {
                DeliveryMode::Pull
            }
        })
}

/// A deliver or process hop of one attempt.
pub(super) fn attempt_hop(
    ctx: &Ctx<'_>,
    id: &HopId,
    parent: &HopId,
    mode: Option<DeliveryMode>,
) -> HopSpan {
    let d = id.delivery().expect("an attempt hop names its delivery");
    HopSpan {
        parent: Some(parent.key()),
        group: crate::GroupId::new(&d.group).ok(),
        consumer: ClientId::new(d.consumer.clone()).ok(),
        attempt: Some(d.attempt),
        mode,
        by_id: d.by_id,
        ..blank_hop(ctx, id)
    }
}

/// Who a delivery attempt went to, as the reasons name it: `consumer c (group g)`, with
/// `, by message ID` for a fetch by ID. Written only into the reasons that name it.
pub(super) struct Who<'a>(&'a DeliveryId);

impl std::fmt::Display for Who<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = self.0;
        let how = if d.by_id { ", by message ID" } else { "" };
        write!(f, "consumer {} (group {}{how})", d.consumer, d.group)
    }
}

/// The deliver and process hops, per attempt; a deliver hop that is a failure point adds
/// its reason to `failures`.
pub(super) fn delivery_hops(
    ctx: &Ctx<'_>,
    attempts: BTreeMap<DeliveryId, AttemptRecs>,
    failures: &mut Vec<String>,
) -> Vec<HopSpan> {
    let mut hops = Vec::new();
    for (d, v) in attempts {
        let mode = delivery_mode(&v);
        let deliver_id = HopId::Deliver(d.clone());
        let who = Who(deliver_id
            .delivery()
            .expect("a deliver hop names its delivery"));
        if !v.deliver.is_empty() || !v.process.is_empty() {
            let mut hop = attempt_hop(ctx, &deliver_id, &HopId::Store, mode);
            let process_start = v.process.iter().map(|r| r.at).min();
            let failure_point = fill_deliver_hop(ctx, &mut hop, v.deliver, process_start, &who);
            if failure_point {
                failures.push(hop.reason.clone().unwrap_or_default());
            }
            hops.push(hop);
        }
        if !v.process.is_empty() {
            let mut hop = attempt_hop(ctx, &HopId::Process(d), &deliver_id, mode);
            fill_process_hop(ctx, &mut hop, v.process, &who);
            hops.push(hop);
        }
    }
    hops
}

/// Times, status and events of a deliver hop (C1 → C4 or C5 → C8, or ended by an R1).
/// Returns whether it is a failure point of the trajectory: an error with no settle that is
/// not followed by a redelivery.
pub(super) fn fill_deliver_hop(
    ctx: &Ctx<'_>,
    hop: &mut HopSpan,
    ev: Vec<StageRecord>,
    process_start: Option<u64>,
    who: &Who<'_>,
) -> bool {
    let sent = first_at(&ev, &[Stage::PushSent, Stage::PullSent]);
    let settle = ev
        .iter()
        .filter(|r| matches!(r.stage, Stage::PushAckReceived | Stage::PullAckReceived))
        .max_by_key(|r| r.at);
    let r1 = ev.iter().rev().find(|r| r.stage == Stage::Redelivery);
    let dead = |r: &StageRecord| r.redelivery_outcome() == Some(RedeliveryOutcome::DeadLetter);
    let earliest = ev.iter().map(|r| r.at).min();
    hop.start = sent
        .or_else(|| earliest.into_iter().chain(process_start).min())
        .unwrap_or(0);
    let acked_ms = ctx.opts.deadlines.acked_ms;
    let (end, status, reason) = match (settle, r1) {
        (Some(s), _) => settled_status(s, who),
        (None, Some(r)) => {
            let what = if dead(r) {
                "dead-lettered"
            } else {
                "redelivery scheduled"
            };
            let why = r.detail.as_deref().map(|d| format!(": {d}"));
            (
                Some(r.at),
                HopStatus::Error,
                Some(format!(
                    "no ack from {who}; {what}{}",
                    why.unwrap_or_default()
                )),
            )
        }
        (None, None) if ctx.overdue(hop.start, acked_ms) => (
            None,
            HopStatus::Error,
            Some(format!("stuck at {who}: no ack within {acked_ms} ms")),
        ),
        (None, None) => (
            None,
            HopStatus::Incomplete,
            Some(format!("waiting for the ack of {who}")),
        ),
    };
    hop.end = end;
    hop.latency_nanos = end.map(|e| e.saturating_sub(hop.start));
    hop.status = status;
    hop.reason = reason;
    let failure_point = status == HopStatus::Error && r1.is_none_or(dead) && settle.is_none();
    hop.service = first_service(&ev);
    hop.broker = first_broker(&ev);
    hop.synthesized = ev.is_empty();
    hop.events = ev;
    failure_point
}

/// How a settled delivery ended: an ack (also when the C4/C8 names no outcome) is `ok`.
pub(super) fn settled_status(
    s: &StageRecord,
    who: &Who<'_>,
) -> (Option<u64>, HopStatus, Option<String>) {
    match s.typed_outcome() {
        None | Some(crate::outcome::Outcome::Settle(SettleOutcome::Ack)) => {
            (Some(s.at), HopStatus::Ok, None)
        }
        Some(crate::outcome::Outcome::Settle(SettleOutcome::Nack)) => (
            Some(s.at),
            HopStatus::Error,
            Some(format!("nacked by {who}")),
        ),
        Some(other) => (
            Some(s.at),
            HopStatus::Error,
            Some(format!("{other} by {who}")),
        ),
    }
}

/// Times, status and events of a process hop (receipt → ack sent, with X1/X2).
pub(super) fn fill_process_hop(
    ctx: &Ctx<'_>,
    hop: &mut HopSpan,
    ev: Vec<StageRecord>,
    who: &Who<'_>,
) {
    let received = first_at(&ev, &[Stage::PushReceived, Stage::PullReceived]);
    let x1 = first_at(&ev, &[Stage::ProcessStarted]);
    let x2 = ev
        .iter()
        .filter(|r| r.stage == Stage::ProcessFinished)
        .max_by_key(|r| r.at);
    let ack_sent = ev
        .iter()
        .filter(|r| matches!(r.stage, Stage::PushAckSent | Stage::PullAckSent))
        .max_by_key(|r| r.at);
    hop.start = received
        .or(x1)
        .unwrap_or_else(|| ev.iter().map(|r| r.at).min().unwrap_or(0));
    hop.end = match (ack_sent, x2) {
        (Some(a), Some(x)) => Some(a.at.max(x.at)),
        (a, x) => a.or(x).map(|r| r.at),
    };
    hop.latency_nanos = hop.end.map(|e| e.saturating_sub(hop.start));
    let failed = x2.filter(|x| x.process_outcome() == Some(ProcessOutcome::Failed));
    let not_acked = ack_sent
        .and_then(|a| a.typed_outcome())
        .filter(|o| *o != crate::outcome::Outcome::Settle(SettleOutcome::Ack));
    let processed_ms = ctx.opts.deadlines.processed_ms;
    let (status, reason) = if let Some(f) = failed {
        let text = f.detail.as_deref().unwrap_or("no error text");
        (HopStatus::Error, Some(format!("processing failed: {text}")))
    } else if let Some(o) = not_acked {
        (HopStatus::Error, Some(format!("{who} sent {o}")))
    } else if hop.end.is_some() {
        (HopStatus::Ok, None)
    } else if ctx.overdue(hop.start, processed_ms) {
        let what = if x1.is_some() {
            "processing did not finish"
        } else {
            "no ack sent"
        };
        let text = format!("stuck at {who}: {what} within {processed_ms} ms");
        (HopStatus::Error, Some(text))
    } else if x1.is_some() {
        (
            HopStatus::Incomplete,
            Some(format!("being processed by {who}")),
        )
    } else {
        let text = format!("received by {who}, not acked yet");
        (HopStatus::Incomplete, Some(text))
    };
    hop.status = status;
    hop.reason = reason;
    hop.service = first_service(&ev);
    hop.events = ev;
}

/// Causal order: send, store, then by (start, kind, key).
pub(super) fn order_hops(hops: &mut [HopSpan]) {
    hops.sort_by(|a, b| {
        let rank = |h: &HopSpan| match h.kind {
            HopKind::Send => 0,
            HopKind::Store => 1,
            _ => 2,
        };
        (rank(a), a.start, a.kind, &a.key).cmp(&(rank(b), b.start, b.kind, &b.key))
    });
}
