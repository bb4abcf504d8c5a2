//! From records to hops, in passes: [`normalize`] puts the records in one total order and
//! drops repeats; [`partition`] sorts them into the upload's records and one bucket per
//! delivery attempt; then one function per hop kind builds the hops ([`store_hop`],
//! [`send_hop`], [`delivery_hops`]), and [`assemble`] hands them to [`super::state`] for the
//! groups and states and to [`super::diagnosis`] for the words.

use super::model::{
    AssembleOptions, DeliveryId, DeliveryMode, HopId, HopKind, HopSpan, HopStatus, Trajectory,
};
use super::{clock, diagnosis, state};
use crate::ids::{ClientId, MessageId};
use crate::outcome::{ProcessOutcome, RedeliveryOutcome, SettleOutcome, StoreOutcome};
use crate::record::StageRecord;
use crate::stage::Stage;
use crate::trace_ids;
use std::collections::BTreeMap;

/// What every pass needs: the options, whether this is a summary assembly, the message ID.
pub(super) struct Ctx<'a> {
    /// The assembly options.
    pub opts: &'a AssembleOptions,
    /// Skip the diagnosis and the span IDs ([`Trajectory::assemble_for_summary`]).
    pub lite: bool,
    /// The message ID, if any record has one.
    pub message_id: Option<MessageId>,
}

impl Ctx<'_> {
    /// Whether a hop open since `since` has passed a deadline (never without
    /// [`AssembleOptions::now`]).
    pub(super) fn overdue(&self, since: u64, deadline_ms: u64) -> bool {
        match self.opts.now {
            Some(now) => now.saturating_sub(since) > deadline_ms.saturating_mul(1_000_000),
            None => false,
        }
    }

    /// The span ID of a hop, in hex; none in a summary assembly or without a message ID.
    fn span(&self, id: &HopId) -> Option<String> {
        if self.lite {
            return None;
        }
        self.message_id.map(|m| trace_ids::hex(&id.span_id(&m)))
    }
}

/// The records of one delivery attempt, by the side that wrote them.
#[derive(Default)]
pub(super) struct AttemptRecs {
    /// The broker's: C1/C4 or C5/C8, R1.
    deliver: Vec<StageRecord>,
    /// The consumer's: C2/C3 or C6/C7, X1, X2.
    process: Vec<StageRecord>,
}

/// The records sorted by what they are about.
pub(super) struct Partition {
    /// P1, P4, D1.
    send: Vec<StageRecord>,
    /// P2, P3.
    store: Vec<StageRecord>,
    /// Records of no hop (A1, N1, …).
    other: Vec<StageRecord>,
    /// Per delivery attempt.
    attempts: BTreeMap<DeliveryId, AttemptRecs>,
}

/// The times of the upload that the later passes need.
#[derive(Debug, Clone, Copy)]
pub(super) struct UploadTimes {
    /// The first P1.
    pub p1_at: Option<u64>,
    /// The first P2 that is not a refusal.
    pub p2_at: Option<u64>,
    /// The last P3.
    pub p3_at: Option<u64>,
    /// The first record of any delivery (not an R1): proof the message was stored by then.
    pub first_delivery_at: Option<u64>,
    /// JetStream's stored time: from a recovered P3 (kept even when the broker's own P3
    /// replaces the record), or from a delivery's C1/C5 (`stored_at`); the earliest.
    pub js_stored_at: Option<u64>,
}

fn is_deliver_stage(s: Stage) -> bool {
    matches!(
        s,
        Stage::PushSent | Stage::PushAckReceived | Stage::PullSent | Stage::PullAckReceived
    )
}

fn is_process_stage(s: Stage) -> bool {
    matches!(
        s,
        Stage::PushReceived
            | Stage::PushAckSent
            | Stage::PullReceived
            | Stage::PullAckSent
            | Stage::ProcessStarted
            | Stage::ProcessFinished
    )
}

fn first_service(events: &[StageRecord]) -> Option<String> {
    events.iter().find_map(|r| r.service.clone())
}

/// The broker instance of the first broker-written record that names one.
fn first_broker(events: &[StageRecord]) -> Option<crate::ids::BrokerInstance> {
    events.iter().find_map(|r| r.broker.clone())
}

fn first_at(rs: &[StageRecord], st: &[Stage]) -> Option<u64> {
    rs.iter()
        .filter(|r| st.contains(&r.stage))
        .map(|r| r.at)
        .min()
}

fn last_at(rs: &[StageRecord], st: &[Stage]) -> Option<u64> {
    rs.iter()
        .filter(|r| st.contains(&r.stage))
        .map(|r| r.at)
        .max()
}

/// Assembles the records of one message; `None` when there are none.
pub(super) fn assemble(
    records: impl IntoIterator<Item = StageRecord>,
    opts: &AssembleOptions,
    lite: bool,
) -> Option<Trajectory> {
    let (recs, js_stored_at) = normalize(records.into_iter().collect())?;
    let mut t = header(&recs);
    let ctx = Ctx {
        opts,
        lite,
        message_id: t.message_id,
    };
    let part = partition(recs);
    let times = UploadTimes {
        js_stored_at,
        ..upload_times(&part)
    };
    let mut failures = Vec::new();
    let mut delivery_failures = Vec::new();
    let deliveries = delivery_hops(&ctx, part.attempts, &mut delivery_failures);
    // Deliveries the broker recorded (on its clock; a synthesized one starts on the
    // consumer's).
    let first_deliver_start = deliveries
        .iter()
        .filter(|h| h.kind == HopKind::Deliver && !h.synthesized)
        .map(|h| h.start)
        .min();
    let store = store_hop(&ctx, &part.store, &times, first_deliver_start);
    let send = send_hop(&ctx, (&part.send, &part.store), &times, store.as_ref());
    let (upload_attempts, duplicates) = upload_counts(&part.send, &times);
    t.upload_attempts = upload_attempts;
    t.duplicates = duplicates;
    let mut hops = Vec::new();
    for hop in send.into_iter().chain(store) {
        if hop.status == HopStatus::Error {
            failures.push(hop.reason.clone().unwrap_or_default());
        }
        hops.push(hop);
    }
    t.other_records = part.other;
    if !hops.iter().any(|h| h.kind == HopKind::Send) {
        // Only D1 records: keep them visible.
        t.other_records.extend(part.send);
    }
    failures.extend(delivery_failures);
    hops.extend(deliveries);
    for hop in &mut hops {
        flag_impossible(hop);
    }
    order_hops(&mut hops);
    // Clock estimates serve the timeline, the API and the spans, not a summary (nothing in
    // the states, segments or funnel reads them): the store's summaries skip them.
    if !lite {
        t.clocks = clock::estimate(&mut hops);
    }
    t.hops = hops;
    state::derive(&ctx, &mut t, &times, failures);
    if !lite {
        t.diagnosis = diagnosis::diagnose(&t);
    }
    Some(t)
}

/// A total order on the records, so that every permutation gives the same result, without
/// repeats; a recovered P2/P3 stands in for the broker's own only when that one is missing.
/// Also returns JetStream's stored time (the earliest of a recovered P3's time and the
/// deliveries' `stored_at`), which outlives the recovered record.
fn normalize(mut recs: Vec<StageRecord>) -> Option<(Vec<StageRecord>, Option<u64>)> {
    if recs.is_empty() {
        return None;
    }
    // The dedup key starts with the stage and the time, so only records that tie on those
    // can share it: the costly tie-breaks run for them alone.
    recs.sort_by(|a, b| {
        (a.at, a.stage).cmp(&(b.at, b.stage)).then_with(|| {
            a.dedup_key()
                .cmp(&b.dedup_key())
                .then_with(|| a.to_json().cmp(&b.to_json()))
        })
    });
    // Repeats are now adjacent; the first (smallest) of each dedup key stays.
    recs.dedup_by(|later, kept| {
        later.at == kept.at && later.stage == kept.stage && later.dedup_key() == kept.dedup_key()
    });
    // A P2/P3 recovered from the stored message (lost with a broker crash or a stage-stream
    // outage otherwise) goes when the broker's own is there.
    let broker_wrote = |stage: Stage, recs: &[StageRecord]| {
        recs.iter().any(|r| r.stage == stage && !r.is_recovered())
    };
    let (p2, p3) = (
        broker_wrote(Stage::UploadReceived, &recs),
        broker_wrote(Stage::Stored, &recs),
    );
    let recovered_p3 = recs
        .iter()
        .filter(|r| r.stage == Stage::Stored && r.is_recovered())
        .map(|r| r.at);
    let delivered_stored = recs
        .iter()
        .filter(|r| matches!(r.stage, Stage::PushSent | Stage::PullSent))
        .filter_map(|r| r.stored_at);
    let js_stored_at = recovered_p3.chain(delivered_stored).min();
    recs.retain(|r| {
        !r.is_recovered()
            || !match r.stage {
                Stage::UploadReceived => p2,
                Stage::Stored => p3,
                _ => false,
            }
    });
    Some((recs, js_stored_at))
}

/// The trajectory's message-level fields, from all records; hops, states and groups empty.
fn header(recs: &[StageRecord]) -> Trajectory {
    let message_id = recs.iter().find_map(|r| r.message_id);
    let request_id = recs.iter().find_map(|r| r.request_id.clone());
    let producer = recs.iter().find_map(|r| r.producer.clone());
    let p2 = recs.iter().find(|r| r.stage == Stage::UploadReceived);
    let topic = p2
        .and_then(|r| r.topic.clone())
        .or_else(|| recs.iter().find_map(|r| r.topic.clone()));
    let trace_id = match (&message_id, &producer, &request_id) {
        (Some(m), _, _) => Some(m.trace_hex()),
        (None, Some(p), Some(r)) => Some(trace_ids::hex(&trace_ids::orphan_trace_id(p, r))),
        _ => None,
    };
    Trajectory {
        message_id,
        request_id,
        producer,
        topic,
        trace_id,
        attrs: p2.map(|r| r.attrs.clone()).unwrap_or_default(),
        payload_size: p2.and_then(|r| r.payload_size),
        payload_head: p2.and_then(|r| r.payload_head.clone()),
        traceparent: recs.iter().find_map(|r| r.traceparent.clone()),
        upload_attempts: 0,
        duplicates: 0,
        same_request: Vec::new(),
        first_at: recs.iter().map(|r| r.at).min().unwrap_or(0),
        last_at: recs.iter().map(|r| r.at).max().unwrap_or(0),
        state: super::model::MessageState::Sent,
        states: Vec::new(),
        hops: Vec::new(),
        groups: Vec::new(),
        failure: None,
        diagnosis: String::new(),
        other_records: Vec::new(),
        clocks: Vec::new(),
        record_count: recs.len(),
    }
}

/// The delivery attempt a fully keyed record belongs to.
fn full_key(r: &StageRecord) -> Option<DeliveryId> {
    Some(DeliveryId {
        group: r.group.as_ref()?.as_str().to_owned(),
        consumer: r.consumer.as_ref()?.as_str().to_owned(),
        attempt: r.attempt?,
        by_id: r.by_id,
    })
}

fn push_attempt(attempts: &mut BTreeMap<DeliveryId, AttemptRecs>, key: DeliveryId, r: StageRecord) {
    let e = attempts.entry(key).or_default();
    if is_process_stage(r.stage) {
        e.process.push(r)
    } else {
        e.deliver.push(r)
    }
}

/// Sorts the records by what they are about.
fn partition(recs: Vec<StageRecord>) -> Partition {
    let mut part = Partition {
        send: Vec::new(),
        store: Vec::new(),
        other: Vec::new(),
        attempts: BTreeMap::new(),
    };
    // Fully keyed delivery records first, so that partial ones can be matched to them.
    let mut partial = Vec::new();
    for r in recs {
        match r.stage {
            Stage::UploadSent | Stage::StoreConfirmed | Stage::Duplicate => part.send.push(r),
            Stage::UploadReceived | Stage::Stored => part.store.push(r),
            s if is_deliver_stage(s) || is_process_stage(s) || s == Stage::Redelivery => {
                match full_key(&r) {
                    Some(k) => push_attempt(&mut part.attempts, k, r),
                    None if r.consumer.is_some() || r.group.is_some() => partial.push(r),
                    None => part.other.push(r),
                }
            }
            _ => part.other.push(r),
        }
    }
    place_partial(&mut part.attempts, partial);
    for v in part.attempts.values_mut() {
        v.deliver.sort_by_key(|r| (r.at, r.stage));
        v.process.sort_by_key(|r| (r.at, r.stage));
    }
    part
}

/// Records that lack a group or an attempt go to the matching attempt that started last at
/// or before them (or the first one); with no match they get attempt 1.
fn place_partial(attempts: &mut BTreeMap<DeliveryId, AttemptRecs>, partial: Vec<StageRecord>) {
    let starts: BTreeMap<DeliveryId, u64> = attempts
        .iter()
        .map(|(k, v)| {
            let s = v.deliver.iter().chain(&v.process).map(|r| r.at).min();
            (k.clone(), s.unwrap_or(0))
        })
        .collect();
    for r in partial {
        let g = r.group.as_ref().map(|g| g.as_str());
        let c = r.consumer.as_ref().map(|c| c.as_str());
        let candidates: Vec<(&DeliveryId, &u64)> = starts
            .iter()
            .filter(|(k, _)| {
                k.by_id == r.by_id
                    && g.is_none_or(|g| g == k.group)
                    && c.is_none_or(|c| c == k.consumer)
                    && r.attempt.is_none_or(|a| a == k.attempt)
            })
            .collect();
        let chosen = candidates
            .iter()
            .filter(|(_, s)| **s <= r.at)
            .max_by_key(|(k, s)| (**s, (*k).clone()))
            .or_else(|| candidates.first())
            .map(|(k, _)| (*k).clone());
        let key = chosen.unwrap_or_else(|| DeliveryId {
            group: g.unwrap_or("unknown").to_owned(),
            consumer: c.unwrap_or("unknown").to_owned(),
            attempt: r.attempt.unwrap_or(1),
            by_id: r.by_id,
        });
        push_attempt(attempts, key, r);
    }
}

/// A P2 with outcome `refused` is the broker's answer to an upload it refused (too large,
/// topic not permitted, …): received, but never a message.
fn is_refusal(r: &StageRecord) -> bool {
    r.stage == Stage::UploadReceived && r.store_outcome() == Some(StoreOutcome::Refused)
}

fn upload_times(part: &Partition) -> UploadTimes {
    UploadTimes {
        p1_at: first_at(&part.send, &[Stage::UploadSent]),
        p2_at: part
            .store
            .iter()
            .filter(|r| r.stage == Stage::UploadReceived && !is_refusal(r))
            .map(|r| r.at)
            .min(),
        p3_at: last_at(&part.store, &[Stage::Stored]),
        first_delivery_at: part
            .attempts
            .values()
            .flat_map(|a| a.deliver.iter().chain(a.process.iter()))
            .filter(|r| r.stage != Stage::Redelivery)
            .map(|r| r.at)
            .min(),
        js_stored_at: None,
    }
}

/// A hop with no group, consumer or attempt.
fn upload_hop(ctx: &Ctx<'_>, id: HopId, start: u64, end: Option<u64>) -> HopSpan {
    HopSpan {
        kind: id.kind(),
        key: id.to_string(),
        parent: (id == HopId::Store).then(|| HopId::Send.to_string()),
        span_id: ctx.span(&id),
        group: None,
        consumer: None,
        attempt: None,
        mode: None,
        by_id: false,
        service: None,
        broker: None,
        start,
        end,
        latency_nanos: end.map(|e| e.saturating_sub(start)),
        status: HopStatus::Ok,
        reason: None,
        synthesized: false,
        inferred: false,
        impossible: None,
        stored_at: None,
        clock: None,
        on_broker_clock: None,
        arrival_nanos: None,
        arrival_bound_nanos: None,
        events: Vec::new(),
    }
}

/// The `store` hop: P2 → P3, or inferred from a delivery when the broker's records are
/// missing; none when there is neither. It ends when the message was stored: at the
/// broker's P3 (the PubAck) — or, when a delivery started before that or the P3 is missing,
/// when the message was deliverable: JetStream's stored time if known (a recovered P3, or
/// the `stored_at` of a C1/C5), else the first delivery's start.
fn store_hop(
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
fn stored_end(p3: u64, start: u64, js_stored: Option<u64>, first_deliver: Option<u64>) -> u64 {
    match first_deliver {
        Some(d) if d < p3 => js_stored.filter(|s| *s >= start && *s <= d).unwrap_or(d),
        _ => p3,
    }
}

/// Flags a hop that would end before it starts (its raw times come from clocks that
/// disagree, or are wrong): no latency, and it ends where it starts.
fn flag_impossible(hop: &mut HopSpan) {
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

fn store_status(
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
fn upload_counts(send: &[StageRecord], times: &UploadTimes) -> (u32, u32) {
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
fn send_hop(
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
fn unconfirmed_send_status(
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

/// Push or pull, from the first record that says.
fn delivery_mode(v: &AttemptRecs) -> Option<DeliveryMode> {
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
fn attempt_hop(ctx: &Ctx<'_>, id: HopId, parent: HopId, mode: Option<DeliveryMode>) -> HopSpan {
    let d = id.delivery().expect("an attempt hop names its delivery");
    HopSpan {
        kind: id.kind(),
        key: id.to_string(),
        parent: Some(parent.to_string()),
        span_id: ctx.span(&id),
        group: ClientId::new(d.group.clone()).ok(),
        consumer: ClientId::new(d.consumer.clone()).ok(),
        attempt: Some(d.attempt),
        mode,
        by_id: d.by_id,
        service: None,
        broker: None,
        start: 0,
        end: None,
        latency_nanos: None,
        status: HopStatus::Incomplete,
        reason: None,
        synthesized: false,
        inferred: false,
        impossible: None,
        stored_at: None,
        clock: None,
        on_broker_clock: None,
        arrival_nanos: None,
        arrival_bound_nanos: None,
        events: Vec::new(),
    }
}

/// The deliver and process hops, per attempt; a deliver hop that is a failure point adds
/// its reason to `failures`.
fn delivery_hops(
    ctx: &Ctx<'_>,
    attempts: BTreeMap<DeliveryId, AttemptRecs>,
    failures: &mut Vec<String>,
) -> Vec<HopSpan> {
    let mut hops = Vec::new();
    for (d, v) in attempts {
        let mode = delivery_mode(&v);
        let deliver_id = HopId::Deliver(d.clone());
        let how = if d.by_id { ", by message ID" } else { "" };
        let who = format!("consumer {} (group {}{how})", d.consumer, d.group);
        if !v.deliver.is_empty() || !v.process.is_empty() {
            let mut hop = attempt_hop(ctx, deliver_id.clone(), HopId::Store, mode);
            let process_start = v.process.iter().map(|r| r.at).min();
            let failure_point = fill_deliver_hop(ctx, &mut hop, v.deliver, process_start, &who);
            if failure_point {
                failures.push(hop.reason.clone().unwrap_or_default());
            }
            hops.push(hop);
        }
        if !v.process.is_empty() {
            let mut hop = attempt_hop(ctx, HopId::Process(d), deliver_id, mode);
            fill_process_hop(ctx, &mut hop, v.process, &who);
            hops.push(hop);
        }
    }
    hops
}

/// Times, status and events of a deliver hop (C1 → C4 or C5 → C8, or ended by an R1).
/// Returns whether it is a failure point of the trajectory: an error with no settle that is
/// not followed by a redelivery.
fn fill_deliver_hop(
    ctx: &Ctx<'_>,
    hop: &mut HopSpan,
    ev: Vec<StageRecord>,
    process_start: Option<u64>,
    who: &str,
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
fn settled_status(s: &StageRecord, who: &str) -> (Option<u64>, HopStatus, Option<String>) {
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
fn fill_process_hop(ctx: &Ctx<'_>, hop: &mut HopSpan, ev: Vec<StageRecord>, who: &str) {
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
fn order_hops(hops: &mut [HopSpan]) {
    hops.sort_by(|a, b| {
        let rank = |h: &HopSpan| match h.kind {
            HopKind::Send => 0,
            HopKind::Store => 1,
            _ => 2,
        };
        (rank(a), a.start, a.kind, &a.key).cmp(&(rank(b), b.start, b.kind, &b.key))
    });
}
