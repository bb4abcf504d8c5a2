//! The producer's side: the upload hop, the store hop (P2/P3 and JetStream's own store time)
//! and the send hop, with their statuses.

use super::*;

/// A hop with no group, consumer or attempt.
pub(super) fn upload_hop(ctx: &Ctx<'_>, id: HopId, start: u64, end: Option<u64>) -> HopSpan {
    HopSpan {
        parent: (id == HopId::Store).then(|| HopId::Send.key()),
        start,
        end,
        latency_nanos: end.map(|e| e.saturating_sub(start)),
        status: HopStatus::Ok,
        ..blank_hop(ctx, &id)
    }
}

/// The `store` hop: P2 → P3, or inferred from a delivery when the broker's records are
/// missing; none when there is neither. It ends when the message was stored: at the
/// broker's P3 (the PubAck) — or, when a delivery started before that or the P3 is missing,
/// when the message was deliverable: JetStream's stored time if known (a recovered P3, or
/// the `stored_at` of a C1/C5), else the first delivery's start.
pub(super) fn store_hop(
    ctx: &Ctx<'_>,
    store: &[StageRecord],
    times: &UploadTimes,
    first_deliver_start: Option<u64>,
) -> Option<HopSpan> {
    // The earliest sign of a delivery: proof the message was stored by then.
    let delivered_by = times
        .first_delivery_at
        .into_iter()
        .chain(first_deliver_start)
        .min();
    if store.is_empty() {
        // JetStream's stored time (a delivery's `stored_at`) when it is no later than the
        // first delivery: the hop is then the instant the message was stored.
        let stored = times
            .js_stored_at
            .filter(|s| delivered_by.is_some_and(|d| *s <= d));
        let at = stored.or(delivered_by)?;
        let mut hop = upload_hop(ctx, HopId::Store, at, Some(at));
        hop.stored_at = stored;
        hop.reason = Some(
            "stored (inferred: the message was delivered, but the broker's store records are missing)"
                .to_owned(),
        );
        hop.synthesized = true;
        hop.inferred = true;
        return Some(hop);
    }
    let refusal = store.iter().filter(|r| is_refusal(r)).max_by_key(|r| r.at);
    let UploadTimes { p2_at, p3_at, .. } = *times;
    let start = p2_at.or(p3_at).or(refusal.map(|r| r.at)).unwrap_or(0);
    let inferred = p3_at.is_none() && times.first_delivery_at.is_some();
    let (status, reason) = store_status(ctx, times, refusal, start, inferred);
    // Only a recovered P3: JetStream's stored time itself ends the hop (on the server's
    // clock, which a delivery on the broker's may precede: shown as recorded).
    let puback = store
        .iter()
        .any(|r| r.stage == Stage::Stored && !r.is_recovered());
    let end = match p3_at {
        Some(p3) if !puback => Some(p3),
        Some(p3) => Some(stored_end(
            p3,
            start,
            times.js_stored_at,
            first_deliver_start,
        )),
        // No P3, but delivered: stored when JetStream says (when that lies between the
        // hop's start and the first delivery), else by the first delivery.
        None if inferred => Some(
            times
                .js_stored_at
                .filter(|s| *s >= start && delivered_by.is_some_and(|d| *s <= d))
                .or(delivered_by)
                .unwrap_or(start),
        ),
        None => refusal.filter(|_| p2_at.is_none()).map(|r| r.at),
    };
    let mut hop = upload_hop(ctx, HopId::Store, start, end);
    hop.service = first_service(store);
    hop.broker = first_broker(store);
    hop.status = status;
    hop.reason = reason;
    hop.inferred = inferred;
    // Named when it ends the hop.
    hop.stored_at = times
        .js_stored_at
        .filter(|s| Some(*s) == end && p3_at != Some(*s));
    hop.events = store.to_vec();
    Some(hop)
}

/// When a stored message's store hop ends: at the PubAck (`p3`), unless a delivery started
/// before it — then when the message was deliverable: JetStream's stored time when it lies
/// between the store's start and that delivery, else the delivery's start.
pub(super) fn stored_end(
    p3: u64,
    start: u64,
    js_stored: Option<u64>,
    first_deliver: Option<u64>,
) -> u64 {
    match first_deliver {
        Some(d) if d < p3 => js_stored.filter(|s| *s >= start && *s <= d).unwrap_or(d),
        _ => p3,
    }
}

/// Flags a hop that would end before it starts (its raw times come from clocks that
/// disagree, or are wrong): no latency, and it ends where it starts.
pub(super) fn flag_impossible(hop: &mut HopSpan) {
    let Some(end) = hop.end.filter(|e| *e < hop.start) else {
        return;
    };
    let by = hop.start - end;
    hop.impossible = Some(format!(
        "impossible timestamps: the hop would end {:.3} ms before it starts (clocks that disagree)",
        by as f64 / 1e6
    ));
    hop.end = Some(hop.start);
    hop.latency_nanos = None;
}

pub(super) fn store_status(
    ctx: &Ctx<'_>,
    times: &UploadTimes,
    refusal: Option<&StageRecord>,
    start: u64,
    inferred: bool,
) -> (HopStatus, Option<String>) {
    let stored_ms = ctx.opts.deadlines.stored_ms;
    match (times.p3_at, refusal) {
        (Some(_), _) => (HopStatus::Ok, None),
        (None, _) if inferred => (
            HopStatus::Ok,
            Some(
                "stored (inferred: the message was delivered, but the broker's P3 record is missing)"
                    .to_owned(),
            ),
        ),
        (None, Some(r)) if times.p2_at.is_none() => (
            HopStatus::Error,
            Some(format!(
                "refused by the broker: {}",
                r.detail.as_deref().unwrap_or("no reason given")
            )),
        ),
        (None, _) if ctx.overdue(start, stored_ms) => (
            HopStatus::Error,
            Some(format!(
                "not stored: the broker received it but stored nothing within {stored_ms} ms"
            )),
        ),
        (None, _) => (
            HopStatus::Incomplete,
            Some("received by the broker, not stored yet".to_owned()),
        ),
    }
}

/// Upload attempts and suppressed duplicates. Every P1 is an attempt (a retry, or the same
/// request ID sent again); the highest attempt number also counts, for attempts whose own
/// P1 never arrived.
pub(super) fn upload_counts(send: &[StageRecord], times: &UploadTimes) -> (u32, u32) {
    let sent_p1s = send.iter().filter(|r| r.stage == Stage::UploadSent).count() as u32;
    let attempts = send
        .iter()
        .filter(|r| matches!(r.stage, Stage::UploadSent | Stage::Duplicate))
        .filter_map(|r| r.attempt)
        .max()
        .unwrap_or(u32::from(times.p1_at.is_some() || times.p2_at.is_some()))
        .max(sent_p1s);
    let duplicates = send.iter().filter(|r| r.stage == Stage::Duplicate).count() as u32;
    (attempts, duplicates)
}

/// The `send` hop: P1 → P4, or synthesized over the store hop when no producer record
/// exists; none when there is neither.
pub(super) fn send_hop(
    ctx: &Ctx<'_>,
    (send, store_recs): (&[StageRecord], &[StageRecord]),
    times: &UploadTimes,
    store: Option<&HopSpan>,
) -> Option<HopSpan> {
    let p4_at = last_at(send, &[Stage::StoreConfirmed]);
    let has_producer_records = times.p1_at.is_some() || p4_at.is_some();
    if !has_producer_records && store.is_none() {
        return None;
    }
    let synthesized = !has_producer_records;
    let start = times
        .p1_at
        .or(times.p2_at)
        .or(p4_at)
        .or(times.p3_at)
        .or_else(|| send.iter().map(|r| r.at).min())
        // An inferred store hop starts at the first delivery: so does its send.
        .or(store.map(|h| h.start))
        .unwrap_or(0);
    let (end, status, reason) = match (synthesized, p4_at) {
        (true, _) => {
            let st = store.expect("a synthesized send has a store hop");
            (st.end, st.status, st.reason.clone())
        }
        (false, Some(p4)) => (Some(p4), HopStatus::Ok, None),
        (false, None) => {
            let (status, reason) = unconfirmed_send_status(ctx, times, store, start);
            (None, status, reason)
        }
    };
    let mut hop = upload_hop(ctx, HopId::Send, start, end);
    hop.events = send.to_vec();
    if synthesized {
        hop.events.extend(store_recs.iter().cloned());
        hop.events.sort_by_key(|r| (r.at, r.stage));
    } else {
        hop.service = send
            .iter()
            .filter(|r| r.stage != Stage::Duplicate)
            .find_map(|r| r.service.clone());
    }
    hop.status = status;
    hop.reason = reason;
    hop.synthesized = synthesized;
    hop.inferred = synthesized && store.is_some_and(|h| h.inferred);
    Some(hop)
}

/// The status of a producer's send without its P4.
pub(super) fn unconfirmed_send_status(
    ctx: &Ctx<'_>,
    times: &UploadTimes,
    store: Option<&HopSpan>,
    start: u64,
) -> (HopStatus, Option<String>) {
    let stored_ms = ctx.opts.deadlines.stored_ms;
    let Some(st) = store else {
        return if ctx.overdue(start, stored_ms) {
            (
                HopStatus::Error,
                Some(format!(
                    "did not reach the broker: no answer to the upload within {stored_ms} ms"
                )),
            )
        } else {
            (
                HopStatus::Incomplete,
                Some("sent, the broker has not answered yet".to_owned()),
            )
        };
    };
    match times.p3_at {
        Some(p3) if ctx.overdue(p3, stored_ms) => (
            HopStatus::Error,
            Some("stored, but the producer never confirmed the store-success notice".to_owned()),
        ),
        Some(_) => (
            HopStatus::Incomplete,
            Some("stored, the producer has not confirmed yet".to_owned()),
        ),
        // Received by the broker, not stored: the send waits on the store.
        None => (st.status, st.reason.clone()),
    }
}
