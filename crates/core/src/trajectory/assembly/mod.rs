//! From records to hops, in passes: [`normalize`] puts the records in one total order and
//! drops repeats; [`partition`] sorts them into the upload's records and one bucket per
//! delivery attempt; then one function per hop kind builds the hops ([`store_hop`],
//! [`send_hop`], [`delivery_hops`]), and [`assemble`] hands them to [`super::state`] for the
//! groups and states and to [`super::diagnosis`] for the words.
//!
//! The passes and the partition live here; the hop builders are split by side: `upload`
//! (upload, store and send hops) and `delivery` (attempts, deliver and process hops).

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

mod delivery;
mod upload;
use delivery::*;
use upload::*;

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
    s.is_deliver_side()
}

fn is_process_stage(s: Stage) -> bool {
    s.is_process_side()
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
    let observed = observation(recs);
    // An observed message whose producer passed a traceparent joins the producer's trace.
    let joined = observed.as_ref().and_then(|o| o.joins);
    let trace_id = match (&message_id, &producer, &request_id) {
        _ if joined.is_some() => joined.map(|j| j.trace_hex()),
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
        observed,
    }
}

/// How the message was observed: from its P3 when observe mode wrote one
/// ([`crate::outcome::StoreOutcome::Observed`]: its producer is the stream, its request ID
/// the `Nats-Msg-Id`); else from a delivery record observe mode wrote (service
/// [`crate::observed::OBSERVED_SERVICE`], an observed message ID, the stream as producer
/// and its sequence): a message whose stored copy msgtrail did not read.
fn observation(recs: &[StageRecord]) -> Option<crate::observed::Observation> {
    use crate::observed::{Observation, ObservedTrace, OBSERVED_SERVICE, UNSEEN, UNSEEN_STORED};
    use crate::outcome::StoreOutcome;
    let p3 = recs
        .iter()
        .find(|r| r.stage == Stage::Stored && r.store_outcome() == Some(StoreOutcome::Observed));
    let from = p3.or_else(|| {
        recs.iter().find(|r| {
            r.service.as_deref() == Some(OBSERVED_SERVICE)
                && r.message_id.is_some_and(|m| m.is_observed())
                && r.producer.is_some()
                && r.stream_seq.is_some()
        })
    })?;
    let stored = p3.is_some();
    let mut unseen: Vec<String> = UNSEEN.iter().map(|s| (*s).to_owned()).collect();
    if !stored {
        unseen.push(UNSEEN_STORED.to_owned());
    }
    Some(Observation {
        stream: from.producer.as_ref()?.as_str().to_owned(),
        stream_seq: from.stream_seq?,
        nats_msg_id: p3
            .and_then(|r| r.request_id.as_ref())
            .map(|r| r.as_str().to_owned()),
        joins: recs
            .iter()
            .find_map(|r| r.traceparent.as_deref())
            .and_then(ObservedTrace::from_traceparent),
        stored,
        unseen,
        unsampled: Vec::new(),
    })
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

/// A hop of `id` with nothing known yet: no group, consumer or attempt, no times, status
/// incomplete. The hop builders fill in what they know over it.
fn blank_hop(ctx: &Ctx<'_>, id: &HopId) -> HopSpan {
    HopSpan {
        kind: id.kind(),
        key: id.key(),
        parent: None,
        span_id: ctx.span(id),
        group: None,
        consumer: None,
        attempt: None,
        mode: None,
        by_id: false,
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
