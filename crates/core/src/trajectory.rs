//! Trajectory assembly: from the stage records of one message to its hops, latencies, state
//! and a plain-words diagnosis.
//!
//! A [`Trajectory`] is pure data, serializable as JSON (it is the body of the listener's
//! `/api/messages/{id}` and of `msgtrail trace --json`). [`Trajectory::assemble`] builds it
//! from any set of records of one message — **in any order**: records are deduplicated by
//! [`StageRecord::dedup_key`] and sorted before anything is derived, so every permutation of
//! the same set gives the same trajectory.
//!
//! ## Hops
//! Each hop becomes one OpenTelemetry span (DESIGN.md §3.10). Its `key` is the
//! [`trace_ids::Hop::key`] hashed into its span ID, and `parent` is the key of its parent:
//!
//! | kind | from → to | events | parent |
//! | --- | --- | --- | --- |
//! | `send` | P1 → P4 (producer) | P1 (every attempt), P4, D1 | none: the root |
//! | `store` | P2 → P3 (broker) | P2, P3 | `send` |
//! | `deliver` | C1 → C4 (push) or C5 → C8 (pull), per (group, consumer, attempt) | C1/C4 or C5/C8, R1 | `store` |
//! | `process` | C2 → C3 or C6 → C7 (consumer), per (group, consumer, attempt) | C2/C3 or C6/C7, X1, X2 | its `deliver` |
//!
//! When no producer record exists (a raw NATS client uploaded), the `send` hop is
//! synthesized from the broker's P2/P3 and marked `synthesized`, so no span has a dangling
//! parent.
//!
//! A hop is `ok`, `error` (a nack, a failed processing, a dead letter, or a deadline missed:
//! the failure point) or `incomplete` (still open, no deadline passed yet); `reason` says why
//! in words. Deadlines apply only when [`AssembleOptions::now`] is given.

use crate::ids::{ClientId, MessageId, RequestId};
use crate::record::StageRecord;
use crate::stage::Stage;
use crate::time::format_rfc3339_millis;
use crate::trace_ids;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

pub use crate::record::RECOVERED;

/// How long each hop may stay open before the watchdog calls it stuck, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Deadlines {
    /// From the first upload attempt (P1) to the broker storing it (P3), and from P3 to the
    /// producer's confirmation (P4).
    pub stored_ms: u64,
    /// From storing (P3) to the first delivery to any consumer.
    pub delivered_ms: u64,
    /// From a delivery (C1/C5) to the broker receiving the consumer's ack (C4/C8).
    pub acked_ms: u64,
    /// From the consumer starting processing (X1 or receipt) to finishing it (X2 or ack sent).
    pub processed_ms: u64,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            stored_ms: 10_000,
            delivered_ms: 60_000,
            acked_ms: 60_000,
            processed_ms: 60_000,
        }
    }
}

/// Options of [`Trajectory::assemble`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AssembleOptions {
    /// The current time (Unix nanoseconds). `None` applies no deadline: open hops stay
    /// `incomplete`. With a time, a hop open longer than its deadline becomes an `error`.
    pub now: Option<u64>,
    /// The deadlines of the watchdog.
    pub deadlines: Deadlines,
}

/// What a hop is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HopKind {
    /// Producer side of the upload: P1 → P4.
    Send,
    /// Broker side of the upload: P2 → P3.
    Store,
    /// One delivery attempt, broker side: C1 → C4 or C5 → C8.
    Deliver,
    /// One delivery attempt, consumer side: receipt → ack, with processing X1/X2.
    Process,
}

impl fmt::Display for HopKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HopKind::Send => "send",
            HopKind::Store => "store",
            HopKind::Deliver => "deliver",
            HopKind::Process => "process",
        })
    }
}

/// Push (C1–C4) or pull (C5–C8) delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryMode {
    /// The broker pushed the message to a subscription.
    Push,
    /// The consumer fetched the message.
    Pull,
}

/// How a hop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HopStatus {
    /// It completed as it should.
    Ok,
    /// It failed, or missed its deadline: this is a failure point.
    Error,
    /// It has not completed yet and no deadline has passed (or none was applied).
    Incomplete,
}

/// One hop of a trajectory: the unit that becomes one span.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HopSpan {
    /// What the hop is.
    pub kind: HopKind,
    /// The hop key ([`trace_ids::Hop::key`]): `send`, `store`,
    /// `deliver/<group>/<consumer>/<attempt>`, `process/<group>/<consumer>/<attempt>`.
    pub key: String,
    /// The key of the parent hop; `None` for the root `send` hop.
    pub parent: Option<String>,
    /// The span ID (16 hex digits) when the message ID is known.
    pub span_id: Option<String>,
    /// The consumer group (deliver and process hops).
    pub group: Option<ClientId>,
    /// The consumer (deliver and process hops).
    pub consumer: Option<ClientId>,
    /// The delivery attempt, from 1 (deliver and process hops).
    pub attempt: Option<u32>,
    /// Push or pull (deliver and process hops).
    pub mode: Option<DeliveryMode>,
    /// The `service.name` of the party that did the work, from the hop's records.
    pub service: Option<String>,
    /// When the hop started, Unix nanoseconds.
    pub start: u64,
    /// When the hop ended, Unix nanoseconds; `None` while it is open.
    pub end: Option<u64>,
    /// `end - start`, nanoseconds.
    pub latency_nanos: Option<u64>,
    /// How it ended.
    pub status: HopStatus,
    /// Why it is `error` or `incomplete`, in words.
    pub reason: Option<String>,
    /// Built from another party's records (a `send` hop with no producer record).
    pub synthesized: bool,
    /// Implied by later evidence rather than recorded: a `store` hop whose P2/P3 are missing
    /// although the message was delivered (a delivery proves it was stored by then), and the
    /// `send` hop synthesized over it. Their times are bounds, not measurements: no latency
    /// statistic uses them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inferred: bool,
    /// The stage records of the hop, sorted by time: its span events.
    pub events: Vec<StageRecord>,
}

/// The shadow-message state of seed 001.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageState {
    /// The producer sent it (P1); the broker has not answered yet.
    Sent,
    /// The broker stored it (P2/P3).
    Enqueued,
    /// Delivered to a consumer (C1/C5 or receipt).
    Delivered,
    /// A consumer is processing it (X1).
    Consuming,
    /// Processed and acknowledged.
    Consumed,
    /// Processing failed, or the consumer nacked or terminated it.
    Failed,
    /// Given up and moved to the dead-letter stream (R1 `dead_letter`).
    DeadLettered,
    /// A deadline passed with a hop still open.
    Stuck,
    /// Sent but never reached the broker (P1 with no P2 past the store deadline).
    Lost,
}

impl MessageState {
    /// Every state, in lifecycle order.
    pub const ALL: &'static [MessageState] = &[
        MessageState::Sent,
        MessageState::Enqueued,
        MessageState::Delivered,
        MessageState::Consuming,
        MessageState::Consumed,
        MessageState::Failed,
        MessageState::DeadLettered,
        MessageState::Stuck,
        MessageState::Lost,
    ];

    /// The snake_case name used in JSON and query strings.
    pub fn as_str(self) -> &'static str {
        match self {
            MessageState::Sent => "sent",
            MessageState::Enqueued => "enqueued",
            MessageState::Delivered => "delivered",
            MessageState::Consuming => "consuming",
            MessageState::Consumed => "consumed",
            MessageState::Failed => "failed",
            MessageState::DeadLettered => "dead_lettered",
            MessageState::Stuck => "stuck",
            MessageState::Lost => "lost",
        }
    }

    /// Whether nothing more is expected (consumed, dead-lettered or lost).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            MessageState::Consumed | MessageState::DeadLettered | MessageState::Lost
        )
    }
}

impl fmt::Display for MessageState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for MessageState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        MessageState::ALL
            .iter()
            .copied()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| format!("unknown state {s:?}"))
    }
}

/// One state change of the shadow message, with its time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateChange {
    /// The new state.
    pub state: MessageState,
    /// When, Unix nanoseconds.
    pub at: u64,
    /// The consumer group, for per-group states.
    pub group: Option<ClientId>,
    /// The consumer, for per-group states.
    pub consumer: Option<ClientId>,
}

/// The consumption of the message by one consumer group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSummary {
    /// The group.
    pub group: ClientId,
    /// The group's state.
    pub state: MessageState,
    /// Delivery attempts seen (the highest attempt number).
    pub attempts: u32,
    /// The consumers that got a delivery, sorted.
    pub consumers: Vec<ClientId>,
    /// When the group acknowledged the message for good, Unix nanoseconds.
    pub acked_at: Option<u64>,
    /// First upload (P1, or P2 without one) → the group's final ack, nanoseconds.
    pub end_to_end_nanos: Option<u64>,
    /// The last processing error text of the group (X2 `failed`).
    pub last_error: Option<String>,
}

/// The latency segments statistics are kept for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Segment {
    /// First P1 (or P2) → P3.
    SentToStored,
    /// P3 → a group's first delivery.
    StoredToDelivered,
    /// Delivery (C1/C5) → receipt (C2/C6).
    DeliveredToReceived,
    /// X1 → X2.
    Processing,
    /// Receipt (C2/C6) → ack received by the broker (C4/C8).
    ReceivedToAcked,
    /// First P1 (or P2) → a group's final ack.
    EndToEnd,
}

impl Segment {
    /// Every segment, in path order.
    pub const ALL: &'static [Segment] = &[
        Segment::SentToStored,
        Segment::StoredToDelivered,
        Segment::DeliveredToReceived,
        Segment::Processing,
        Segment::ReceivedToAcked,
        Segment::EndToEnd,
    ];

    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Segment::SentToStored => "sent_to_stored",
            Segment::StoredToDelivered => "stored_to_delivered",
            Segment::DeliveredToReceived => "delivered_to_received",
            Segment::Processing => "processing",
            Segment::ReceivedToAcked => "received_to_acked",
            Segment::EndToEnd => "end_to_end",
        }
    }
}

impl fmt::Display for Segment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The whole trajectory of one message (or of one upload that never got a message ID).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trajectory {
    /// The message ID, once the broker assigned one.
    pub message_id: Option<MessageId>,
    /// The producer's request ID.
    pub request_id: Option<RequestId>,
    /// The producer.
    pub producer: Option<ClientId>,
    /// The topic.
    pub topic: Option<String>,
    /// The trace ID (32 hex digits): the message ID, or the orphan-upload hash.
    pub trace_id: Option<String>,
    /// The message's attributes (from P2).
    pub attrs: BTreeMap<String, String>,
    /// The payload size in bytes (from P2).
    pub payload_size: Option<u64>,
    /// The first bytes of the payload, base64 (from P2).
    pub payload_head: Option<String>,
    /// The producer's W3C traceparent, if it passed one.
    pub traceparent: Option<String>,
    /// Upload attempts (the highest P1/D1 attempt number).
    pub upload_attempts: u32,
    /// Duplicate uploads the broker suppressed (D1 records).
    pub duplicates: u32,
    /// The other messages stored under the same producer and request ID, in upload order
    /// (message ID order): the same request ID uploaded again after the broker's dedup
    /// window, which stores it anew. Assembly leaves it empty (it knows one message's
    /// records); the listener fills it at lookup time ([`Trajectory::set_same_request`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub same_request: Vec<MessageId>,
    /// The earliest record time, Unix nanoseconds.
    pub first_at: u64,
    /// The latest record time, Unix nanoseconds.
    pub last_at: u64,
    /// The overall shadow-message state.
    pub state: MessageState,
    /// Every state change with its time, in order.
    pub states: Vec<StateChange>,
    /// The hops in causal order: send, store, then per (group, consumer, attempt) deliver and
    /// its process.
    pub hops: Vec<HopSpan>,
    /// Per consumer group, sorted by group.
    pub groups: Vec<GroupSummary>,
    /// The first failure point, in words, if any.
    pub failure: Option<String>,
    /// The plain-words account of the trajectory.
    pub diagnosis: String,
    /// Records that belong to no hop (channel and no-match records, for instance).
    pub other_records: Vec<StageRecord>,
    /// How many distinct records the trajectory was built from.
    pub record_count: usize,
}

type DeliveryKey = (String, String, u32);

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

/// A latency in words for humans: `0.8 ms`, `41 ms`, `2.97 s`.
pub fn format_latency(nanos: u64) -> String {
    let ms = nanos as f64 / 1e6;
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else if ms >= 10.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{ms:.1} ms")
    }
}

/// The UTC time of day with milliseconds: `12:00:01.003`.
pub fn format_clock(nanos: u64) -> String {
    // `2026-12-01T12:00:01.003Z` → `12:00:01.003`
    let s = format_rfc3339_millis(nanos);
    s.get(11..23).unwrap_or(&s).to_owned()
}

fn first_service(events: &[StageRecord]) -> Option<String> {
    events.iter().find_map(|r| r.service.clone())
}

impl Trajectory {
    /// Assembles the trajectory of the message (or orphan upload) the records belong to.
    /// Returns `None` when there is no record. The result does not depend on the order of
    /// the records, nor on repeated records.
    pub fn assemble(
        records: impl IntoIterator<Item = StageRecord>,
        options: &AssembleOptions,
    ) -> Option<Trajectory> {
        Self::assemble_with(records, options, false)
    }

    /// Like [`Trajectory::assemble`], without what only a reader of the trajectory needs:
    /// the diagnosis is empty and the hops have no span ID. Everything else (states,
    /// hops, groups, failure, latencies) is the same; the listener uses it for shadow-message
    /// summaries and statistics, where assembly runs once per touched message per batch.
    pub fn assemble_for_summary(
        records: impl IntoIterator<Item = StageRecord>,
        options: &AssembleOptions,
    ) -> Option<Trajectory> {
        Self::assemble_with(records, options, true)
    }

    /// Names the other messages stored under this message's producer and request ID
    /// (sorted, without this message's own ID) and, when the trajectory has a diagnosis,
    /// says so in it.
    pub fn set_same_request(&mut self, others: impl IntoIterator<Item = MessageId>) {
        let mut v: Vec<MessageId> = others
            .into_iter()
            .filter(|m| Some(*m) != self.message_id)
            .collect();
        v.sort_unstable();
        v.dedup();
        self.same_request = v;
        if !self.diagnosis.is_empty() {
            self.diagnosis = diagnose(self);
        }
    }

    fn assemble_with(
        records: impl IntoIterator<Item = StageRecord>,
        options: &AssembleOptions,
        lite: bool,
    ) -> Option<Trajectory> {
        let mut recs: Vec<StageRecord> = records.into_iter().collect();
        if recs.is_empty() {
            return None;
        }
        // A total order on records, so that every permutation gives the same result. The
        // dedup key starts with the stage and the time, so only records that tie on those
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
            later.at == kept.at
                && later.stage == kept.stage
                && later.dedup_key() == kept.dedup_key()
        });
        // A P2/P3 recovered from the stored message stands in for the broker's own only when
        // that one is missing (lost with a broker crash or a stage-stream outage).
        let broker_wrote = |stage: Stage, recs: &[StageRecord]| {
            recs.iter().any(|r| r.stage == stage && !r.is_recovered())
        };
        let (p2, p3) = (
            broker_wrote(Stage::UploadReceived, &recs),
            broker_wrote(Stage::Stored, &recs),
        );
        recs.retain(|r| {
            !r.is_recovered()
                || !match r.stage {
                    Stage::UploadReceived => p2,
                    Stage::Stored => p3,
                    _ => false,
                }
        });
        Some(Builder::new(recs, options, lite).build())
    }

    /// The latency of each segment this trajectory completed, for statistics: one entry per
    /// segment and group (for per-group segments) or per delivery attempt.
    pub fn segment_latencies(&self) -> Vec<(Segment, u64)> {
        let mut out = Vec::new();
        let first = self.first_send_at();
        let stored = self.stored_at();
        if let (Some(f), Some(s)) = (first, stored) {
            out.push((Segment::SentToStored, s.saturating_sub(f)));
        }
        for g in &self.groups {
            if let Some(s) = stored {
                let first_delivery = self
                    .hops
                    .iter()
                    .filter(|h| h.kind == HopKind::Deliver && h.group.as_ref() == Some(&g.group))
                    .map(|h| h.start)
                    .min();
                if let Some(d) = first_delivery {
                    out.push((Segment::StoredToDelivered, d.saturating_sub(s)));
                }
            }
            if let Some(e) = g.end_to_end_nanos {
                out.push((Segment::EndToEnd, e));
            }
        }
        for h in self.hops.iter().filter(|h| h.kind == HopKind::Process) {
            let at = |st: &[Stage]| {
                h.events
                    .iter()
                    .filter(|r| st.contains(&r.stage))
                    .map(|r| r.at)
                    .min()
            };
            let received = at(&[Stage::PushReceived, Stage::PullReceived]);
            let x1 = at(&[Stage::ProcessStarted]);
            let x2 = at(&[Stage::ProcessFinished]);
            if let (Some(a), Some(b)) = (x1, x2) {
                out.push((Segment::Processing, b.saturating_sub(a)));
            }
            let deliver = self.hops.iter().find(|d| {
                d.kind == HopKind::Deliver
                    && d.group == h.group
                    && d.consumer == h.consumer
                    && d.attempt == h.attempt
            });
            if let Some(d) = deliver {
                let sent = d
                    .events
                    .iter()
                    .filter(|r| matches!(r.stage, Stage::PushSent | Stage::PullSent))
                    .map(|r| r.at)
                    .min();
                let acked = d
                    .events
                    .iter()
                    .filter(|r| matches!(r.stage, Stage::PushAckReceived | Stage::PullAckReceived))
                    .map(|r| r.at)
                    .max();
                if let (Some(s), Some(r)) = (sent, received) {
                    out.push((Segment::DeliveredToReceived, r.saturating_sub(s)));
                }
                if let (Some(r), Some(a)) = (received, acked) {
                    out.push((Segment::ReceivedToAcked, a.saturating_sub(r)));
                }
            }
        }
        out
    }

    /// The hop with this key.
    pub fn hop(&self, key: &str) -> Option<&HopSpan> {
        self.hops.iter().find(|h| h.key == key)
    }

    /// Whether the message reached the broker (a P2 or P3 exists).
    pub fn reached_broker(&self) -> bool {
        self.stored_at().is_some() || self.hop("store").is_some()
    }

    fn first_send_at(&self) -> Option<u64> {
        self.hop("send").filter(|h| !h.inferred).map(|h| h.start)
    }

    fn stored_at(&self) -> Option<u64> {
        self.hop("store")
            .filter(|h| !h.inferred)
            .and_then(|h| h.end)
    }
}

struct Builder<'a> {
    recs: Vec<StageRecord>,
    /// Skip the diagnosis and the span IDs ([`Trajectory::assemble_for_summary`]).
    lite: bool,
    opts: &'a AssembleOptions,
}

#[derive(Default)]
struct AttemptRecs {
    deliver: Vec<StageRecord>,
    process: Vec<StageRecord>,
}

impl<'a> Builder<'a> {
    fn new(recs: Vec<StageRecord>, opts: &'a AssembleOptions, lite: bool) -> Self {
        Builder { recs, opts, lite }
    }

    fn overdue(&self, since: u64, deadline_ms: u64) -> bool {
        match self.opts.now {
            Some(now) => now.saturating_sub(since) > deadline_ms.saturating_mul(1_000_000),
            None => false,
        }
    }

    fn build(mut self) -> Trajectory {
        let recs = std::mem::take(&mut self.recs);
        let d = self.opts.deadlines;
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
        // What the result needs from all records, taken before they are moved into hops.
        let attrs = p2.map(|r| r.attrs.clone()).unwrap_or_default();
        let payload_size = p2.and_then(|r| r.payload_size);
        let payload_head = p2.and_then(|r| r.payload_head.clone());
        let traceparent = recs.iter().find_map(|r| r.traceparent.clone());
        let record_count = recs.len();
        let first_at = recs.iter().map(|r| r.at).min().unwrap_or(0);
        let last_at = recs.iter().map(|r| r.at).max().unwrap_or(0);
        let lite = self.lite;
        let span = |key: &str, hop: trace_ids::Hop<'_>| -> Option<String> {
            let _ = key;
            if lite {
                return None;
            }
            message_id.map(|m| trace_ids::hex(&trace_ids::span_id(&m, &hop)))
        };

        // ---- partition the records
        let mut send_recs = Vec::new();
        let mut store_recs = Vec::new();
        let mut other = Vec::new();
        let mut attempts: BTreeMap<DeliveryKey, AttemptRecs> = BTreeMap::new();
        // Fully keyed delivery records first, so that partial ones can be matched to them.
        let full_key = |r: &StageRecord| -> Option<DeliveryKey> {
            Some((
                r.group.as_ref()?.as_str().to_owned(),
                r.consumer.as_ref()?.as_str().to_owned(),
                r.attempt?,
            ))
        };
        let mut partial = Vec::new();
        for r in recs {
            match r.stage {
                Stage::UploadSent | Stage::StoreConfirmed | Stage::Duplicate => send_recs.push(r),
                Stage::UploadReceived | Stage::Stored => store_recs.push(r),
                s if is_deliver_stage(s) || is_process_stage(s) || s == Stage::Redelivery => {
                    match full_key(&r) {
                        Some(k) => {
                            let e = attempts.entry(k).or_default();
                            if is_process_stage(s) {
                                e.process.push(r)
                            } else {
                                e.deliver.push(r)
                            }
                        }
                        None if r.consumer.is_some() || r.group.is_some() => partial.push(r),
                        None => other.push(r),
                    }
                }
                _ => other.push(r),
            }
        }
        // Records that lack a group or an attempt go to the matching attempt that started
        // last at or before them (or the first one); with no match they get attempt 1.
        let starts: BTreeMap<DeliveryKey, u64> = attempts
            .iter()
            .map(|(k, v)| {
                let s = v
                    .deliver
                    .iter()
                    .chain(v.process.iter())
                    .map(|r| r.at)
                    .min()
                    .unwrap_or(0);
                (k.clone(), s)
            })
            .collect();
        for r in partial {
            let g = r.group.as_ref().map(|g| g.as_str());
            let c = r.consumer.as_ref().map(|c| c.as_str());
            let candidates: Vec<(&DeliveryKey, &u64)> = starts
                .iter()
                .filter(|((kg, kc, ka), _)| {
                    g.is_none_or(|g| g == kg)
                        && c.is_none_or(|c| c == kc)
                        && r.attempt.is_none_or(|a| a == *ka)
                })
                .collect();
            let chosen = candidates
                .iter()
                .filter(|(_, s)| **s <= r.at)
                .max_by_key(|(k, s)| (**s, (*k).clone()))
                .or_else(|| candidates.first())
                .map(|(k, _)| (*k).clone());
            let key = chosen.unwrap_or_else(|| {
                (
                    g.unwrap_or("unknown").to_owned(),
                    c.unwrap_or("unknown").to_owned(),
                    r.attempt.unwrap_or(1),
                )
            });
            let e = attempts.entry(key).or_default();
            if is_process_stage(r.stage) {
                e.process.push(r)
            } else {
                e.deliver.push(r)
            }
        }
        for v in attempts.values_mut() {
            v.deliver.sort_by_key(|r| (r.at, r.stage));
            v.process.sort_by_key(|r| (r.at, r.stage));
        }

        let at_of = |rs: &[StageRecord], st: &[Stage]| -> Option<u64> {
            rs.iter()
                .filter(|r| st.contains(&r.stage))
                .map(|r| r.at)
                .min()
        };
        let last_at_of = |rs: &[StageRecord], st: &[Stage]| -> Option<u64> {
            rs.iter()
                .filter(|r| st.contains(&r.stage))
                .map(|r| r.at)
                .max()
        };

        let mut hops = Vec::new();
        let mut failure: Option<String> = None;
        let note_failure = |f: &mut Option<String>, s: String| {
            if f.is_none() {
                *f = Some(s);
            }
        };

        // ---- store hop
        // A P2 with outcome `refused` is the broker's answer to an upload it refused (too
        // large, topic not permitted, …): received, but never a message.
        let is_refusal = |r: &StageRecord| {
            r.stage == Stage::UploadReceived && r.outcome.as_deref() == Some("refused")
        };
        let refusal = store_recs
            .iter()
            .filter(|r| is_refusal(r))
            .max_by_key(|r| r.at);
        let p2_at = store_recs
            .iter()
            .filter(|r| r.stage == Stage::UploadReceived && !is_refusal(r))
            .map(|r| r.at)
            .min();
        let p3_at = last_at_of(&store_recs, &[Stage::Stored]);
        // A delivery (or anything a consumer did) proves the message was stored by then.
        let first_delivery_at = attempts
            .values()
            .flat_map(|a| a.deliver.iter().chain(a.process.iter()))
            .filter(|r| r.stage != Stage::Redelivery)
            .map(|r| r.at)
            .min();
        let store_hop = if store_recs.is_empty() {
            first_delivery_at.map(|at| HopSpan {
                kind: HopKind::Store,
                key: "store".into(),
                parent: Some("send".into()),
                span_id: span("store", trace_ids::Hop::Store),
                group: None,
                consumer: None,
                attempt: None,
                mode: None,
                service: None,
                start: at,
                end: Some(at),
                latency_nanos: Some(0),
                status: HopStatus::Ok,
                reason: Some(
                    "stored (inferred: the message was delivered, but the broker's store records are missing)"
                        .to_owned(),
                ),
                synthesized: true,
                inferred: true,
                events: Vec::new(),
            })
        } else {
            let start = p2_at.or(p3_at).or(refusal.map(|r| r.at)).unwrap_or(0);
            let inferred = p3_at.is_none() && first_delivery_at.is_some();
            let (status, reason) = match (p3_at, refusal) {
                (Some(_), _) => (HopStatus::Ok, None),
                (None, _) if inferred => (
                    HopStatus::Ok,
                    Some(
                        "stored (inferred: the message was delivered, but the broker's P3 record is missing)"
                            .to_owned(),
                    ),
                ),
                (None, Some(r)) if p2_at.is_none() => (
                    HopStatus::Error,
                    Some(format!(
                        "refused by the broker: {}",
                        r.detail.as_deref().unwrap_or("no reason given")
                    )),
                ),
                (None, _) if self.overdue(start, d.stored_ms) => (
                    HopStatus::Error,
                    Some(format!(
                        "not stored: the broker received it but stored nothing within {} ms",
                        d.stored_ms
                    )),
                ),
                (None, _) => (
                    HopStatus::Incomplete,
                    Some("received by the broker, not stored yet".to_owned()),
                ),
            };
            let end = p3_at
                .or(if inferred { first_delivery_at } else { None })
                .or_else(|| refusal.filter(|_| p2_at.is_none()).map(|r| r.at));
            Some(HopSpan {
                kind: HopKind::Store,
                key: "store".into(),
                parent: Some("send".into()),
                span_id: span("store", trace_ids::Hop::Store),
                group: None,
                consumer: None,
                attempt: None,
                mode: None,
                service: first_service(&store_recs),
                start,
                end,
                latency_nanos: end.map(|e| e.saturating_sub(start)),
                status,
                reason,
                synthesized: false,
                inferred,
                events: store_recs.clone(),
            })
        };

        // ---- send hop
        let p1_at = at_of(&send_recs, &[Stage::UploadSent]);
        let p4_at = last_at_of(&send_recs, &[Stage::StoreConfirmed]);
        // Every P1 is an attempt (a retry, or the same request ID sent again); the highest
        // attempt number also counts, for attempts whose own P1 never arrived.
        let sent_p1s = send_recs
            .iter()
            .filter(|r| r.stage == Stage::UploadSent)
            .count() as u32;
        let upload_attempts = send_recs
            .iter()
            .filter(|r| matches!(r.stage, Stage::UploadSent | Stage::Duplicate))
            .filter_map(|r| r.attempt)
            .max()
            .unwrap_or(if p1_at.is_some() || p2_at.is_some() {
                1
            } else {
                0
            })
            .max(sent_p1s);
        let duplicates = send_recs
            .iter()
            .filter(|r| r.stage == Stage::Duplicate)
            .count() as u32;
        let has_producer_records = p1_at.is_some() || p4_at.is_some();
        if has_producer_records || store_hop.is_some() {
            let synthesized = !has_producer_records;
            let start = p1_at
                .or(p2_at)
                .or(p4_at)
                .or(p3_at)
                .or_else(|| send_recs.iter().map(|r| r.at).min())
                // An inferred store hop starts at the first delivery: so does its send.
                .or(store_hop.as_ref().map(|h| h.start))
                .unwrap_or(0);
            let (end, status, reason) = if synthesized {
                let st = store_hop.as_ref().expect("store hop exists");
                (st.end, st.status, st.reason.clone())
            } else if let Some(p4) = p4_at {
                (Some(p4), HopStatus::Ok, None)
            } else if store_hop.is_none() {
                if self.overdue(start, d.stored_ms) {
                    (
                        None,
                        HopStatus::Error,
                        Some(format!(
                            "did not reach the broker: no answer to the upload within {} ms",
                            d.stored_ms
                        )),
                    )
                } else {
                    (
                        None,
                        HopStatus::Incomplete,
                        Some("sent, the broker has not answered yet".to_owned()),
                    )
                }
            } else if let Some(p3) = p3_at {
                if self.overdue(p3, d.stored_ms) {
                    (
                        None,
                        HopStatus::Error,
                        Some(
                            "stored, but the producer never confirmed the store-success notice"
                                .to_owned(),
                        ),
                    )
                } else {
                    (
                        None,
                        HopStatus::Incomplete,
                        Some("stored, the producer has not confirmed yet".to_owned()),
                    )
                }
            } else {
                // Received by the broker, not stored: the send waits on the store.
                let st = store_hop.as_ref();
                (
                    None,
                    st.map_or(HopStatus::Incomplete, |s| s.status),
                    st.and_then(|s| s.reason.clone()),
                )
            };
            let mut events = send_recs.clone();
            if synthesized {
                events.extend(store_recs.iter().cloned());
                events.sort_by_key(|r| (r.at, r.stage));
            }
            let service = if synthesized {
                None
            } else {
                send_recs
                    .iter()
                    .filter(|r| r.stage != Stage::Duplicate)
                    .find_map(|r| r.service.clone())
            };
            if status == HopStatus::Error {
                note_failure(&mut failure, reason.clone().unwrap_or_default());
            }
            hops.push(HopSpan {
                kind: HopKind::Send,
                key: "send".into(),
                parent: None,
                span_id: span("send", trace_ids::Hop::Send),
                group: None,
                consumer: None,
                attempt: None,
                mode: None,
                service,
                start,
                end,
                latency_nanos: end.map(|e| e.saturating_sub(start)),
                status,
                reason,
                synthesized,
                inferred: synthesized && store_hop.as_ref().is_some_and(|h| h.inferred),
                events,
            });
        } else if !send_recs.is_empty() {
            // Only D1 records: keep them visible.
            other.extend(send_recs.iter().cloned());
        }
        if let Some(st) = store_hop {
            if st.status == HopStatus::Error {
                note_failure(&mut failure, st.reason.clone().unwrap_or_default());
            }
            hops.push(st);
        }

        // ---- deliver and process hops, per (group, consumer, attempt)
        let group_names: BTreeSet<String> = attempts.keys().map(|(g, _, _)| g.clone()).collect();
        for ((g, c, a), mut v) in attempts {
            let (g, c, a) = (&g, &c, &a);
            let group = ClientId::new(g.clone()).ok();
            let consumer = ClientId::new(c.clone()).ok();
            let mode = v
                .deliver
                .iter()
                .chain(v.process.iter())
                .find(|r| {
                    r.stage != Stage::Redelivery
                        && !matches!(r.stage, Stage::ProcessStarted | Stage::ProcessFinished)
                })
                .map(|r| {
                    if r.stage.is_push() {
                        DeliveryMode::Push
                    } else {
                        DeliveryMode::Pull
                    }
                });
            let hop_ref = trace_ids::Hop::Deliver {
                group: g,
                consumer: c,
                attempt: *a,
            };
            let deliver_key = hop_ref.key();
            let who = format!("consumer {c} (group {g})");
            if !v.deliver.is_empty() || !v.process.is_empty() {
                let ev = &v.deliver;
                let sent = at_of(ev, &[Stage::PushSent, Stage::PullSent]);
                let settle = ev
                    .iter()
                    .filter(|r| matches!(r.stage, Stage::PushAckReceived | Stage::PullAckReceived))
                    .max_by_key(|r| r.at);
                let r1 = ev.iter().rev().find(|r| r.stage == Stage::Redelivery);
                let start = sent
                    .or_else(|| ev.iter().chain(v.process.iter()).map(|r| r.at).min())
                    .unwrap_or(0);
                let (end, status, reason) = match settle {
                    Some(s) => match s.outcome.as_deref().unwrap_or("ack") {
                        "ack" => (Some(s.at), HopStatus::Ok, None),
                        "nack" => (
                            Some(s.at),
                            HopStatus::Error,
                            Some(format!("nacked by {who}")),
                        ),
                        other => (
                            Some(s.at),
                            HopStatus::Error,
                            Some(format!("{other} by {who}")),
                        ),
                    },
                    None => match r1 {
                        Some(r) => {
                            let what = if r.outcome.as_deref() == Some("dead_letter") {
                                "dead-lettered"
                            } else {
                                "redelivery scheduled"
                            };
                            let why = r
                                .detail
                                .as_deref()
                                .map(|d| format!(": {d}"))
                                .unwrap_or_default();
                            (
                                Some(r.at),
                                HopStatus::Error,
                                Some(format!("no ack from {who}; {what}{why}")),
                            )
                        }
                        None if self.overdue(start, d.acked_ms) => (
                            None,
                            HopStatus::Error,
                            Some(format!("stuck at {who}: no ack within {} ms", d.acked_ms)),
                        ),
                        None => (
                            None,
                            HopStatus::Incomplete,
                            Some(format!("waiting for the ack of {who}")),
                        ),
                    },
                };
                if status == HopStatus::Error
                    && r1.is_none_or(|r| r.outcome.as_deref() == Some("dead_letter"))
                    && settle.is_none()
                {
                    note_failure(&mut failure, reason.clone().unwrap_or_default());
                }
                hops.push(HopSpan {
                    kind: HopKind::Deliver,
                    key: deliver_key.clone(),
                    parent: Some("store".into()),
                    span_id: span(&deliver_key, hop_ref.clone()),
                    group: group.clone(),
                    consumer: consumer.clone(),
                    attempt: Some(*a),
                    mode,
                    service: first_service(ev),
                    start,
                    end,
                    latency_nanos: end.map(|e| e.saturating_sub(start)),
                    status,
                    reason,
                    synthesized: ev.is_empty(),
                    inferred: false,
                    events: std::mem::take(&mut v.deliver),
                });
            }
            if !v.process.is_empty() {
                let ev = &v.process;
                let phop = trace_ids::Hop::Process {
                    group: g,
                    consumer: c,
                    attempt: *a,
                };
                let key = phop.key();
                let received = at_of(ev, &[Stage::PushReceived, Stage::PullReceived]);
                let x1 = at_of(ev, &[Stage::ProcessStarted]);
                let x2 = ev
                    .iter()
                    .filter(|r| r.stage == Stage::ProcessFinished)
                    .max_by_key(|r| r.at);
                let ack_sent = ev
                    .iter()
                    .filter(|r| matches!(r.stage, Stage::PushAckSent | Stage::PullAckSent))
                    .max_by_key(|r| r.at);
                let start = received
                    .or(x1)
                    .unwrap_or_else(|| ev.iter().map(|r| r.at).min().unwrap_or(0));
                let end = match (ack_sent, x2) {
                    (Some(a), Some(x)) => Some(a.at.max(x.at)),
                    (Some(a), None) => Some(a.at),
                    (None, Some(x)) => Some(x.at),
                    (None, None) => None,
                };
                let failed = x2.filter(|x| x.outcome.as_deref() == Some("failed"));
                let settle_outcome = ack_sent.and_then(|a| a.outcome.clone());
                let (status, reason) = if let Some(f) = failed {
                    (
                        HopStatus::Error,
                        Some(format!(
                            "processing failed: {}",
                            f.detail.as_deref().unwrap_or("no error text")
                        )),
                    )
                } else if let Some(o) = settle_outcome.as_deref().filter(|o| *o != "ack") {
                    (HopStatus::Error, Some(format!("{who} sent {o}")))
                } else if end.is_some() && (ack_sent.is_some() || x2.is_some()) {
                    (HopStatus::Ok, None)
                } else if self.overdue(start, d.processed_ms) {
                    let what = if x1.is_some() {
                        "processing did not finish"
                    } else {
                        "no ack sent"
                    };
                    (
                        HopStatus::Error,
                        Some(format!(
                            "stuck at {who}: {what} within {} ms",
                            d.processed_ms
                        )),
                    )
                } else {
                    (
                        HopStatus::Incomplete,
                        Some(if x1.is_some() {
                            format!("being processed by {who}")
                        } else {
                            format!("received by {who}, not acked yet")
                        }),
                    )
                };
                hops.push(HopSpan {
                    kind: HopKind::Process,
                    key: key.clone(),
                    parent: Some(deliver_key.clone()),
                    span_id: span(&key, phop),
                    group,
                    consumer,
                    attempt: Some(*a),
                    mode,
                    service: first_service(ev),
                    start,
                    end,
                    latency_nanos: end.map(|e| e.saturating_sub(start)),
                    status,
                    reason,
                    synthesized: false,
                    inferred: false,
                    events: std::mem::take(&mut v.process),
                });
            }
        }
        // Causal order: send, store, then by (start, kind, key).
        hops.sort_by(|a, b| {
            let rank = |h: &HopSpan| match h.kind {
                HopKind::Send => 0,
                HopKind::Store => 1,
                _ => 2,
            };
            (rank(a), a.start, a.kind, &a.key).cmp(&(rank(b), b.start, b.kind, &b.key))
        });

        // ---- per group
        // Times implied by inference are no measurements: no latency starts at them.
        let first_at_send = hops
            .iter()
            .find(|h| h.kind == HopKind::Send && !h.inferred)
            .map(|h| h.start);
        let mut groups = Vec::new();
        for g in &group_names {
            let Ok(group) = ClientId::new(g.clone()) else {
                continue;
            };
            let gh: Vec<&HopSpan> = hops
                .iter()
                .filter(|h| h.group.as_ref() == Some(&group))
                .collect();
            let all_recs: Vec<&StageRecord> = gh.iter().flat_map(|h| h.events.iter()).collect();
            let consumers: BTreeSet<ClientId> =
                gh.iter().filter_map(|h| h.consumer.clone()).collect();
            let max_attempt = gh.iter().filter_map(|h| h.attempt).max().unwrap_or(0);
            let acked_at = all_recs
                .iter()
                .filter(|r| {
                    matches!(r.stage, Stage::PushAckReceived | Stage::PullAckReceived)
                        && r.outcome.as_deref().unwrap_or("ack") == "ack"
                })
                .map(|r| r.at)
                .max();
            let dead = all_recs.iter().any(|r| {
                r.stage == Stage::Redelivery && r.outcome.as_deref() == Some("dead_letter")
            });
            let last_error = all_recs
                .iter()
                .filter(|r| {
                    r.stage == Stage::ProcessFinished && r.outcome.as_deref() == Some("failed")
                })
                .max_by_key(|r| r.at)
                .map(|r| r.detail.clone().unwrap_or_else(|| "failed".into()));
            // The latest attempt decides the state.
            let latest: Vec<&&HopSpan> = gh
                .iter()
                .filter(|h| h.attempt == Some(max_attempt))
                .collect();
            let latest_recs: Vec<&StageRecord> =
                latest.iter().flat_map(|h| h.events.iter()).collect();
            let state = if dead {
                MessageState::DeadLettered
            } else if acked_at.is_some() {
                MessageState::Consumed
            } else if latest.iter().any(|h| {
                h.status == HopStatus::Error
                    && h.reason.as_deref().is_some_and(|r| r.starts_with("stuck"))
            }) {
                MessageState::Stuck
            } else if latest
                .iter()
                .any(|h| h.kind == HopKind::Process && h.status == HopStatus::Error)
                || latest_recs.iter().any(|r| {
                    matches!(r.stage, Stage::PushAckReceived | Stage::PullAckReceived)
                        && r.outcome.as_deref().is_some_and(|o| o != "ack")
                })
            {
                MessageState::Failed
            } else if latest_recs.iter().any(|r| r.stage == Stage::ProcessStarted) {
                MessageState::Consuming
            } else {
                MessageState::Delivered
            };
            if state == MessageState::DeadLettered {
                note_failure(
                    &mut failure,
                    format!(
                        "dead-lettered by group {g} after {max_attempt} attempt(s){}",
                        last_error
                            .as_deref()
                            .map(|e| format!("; last error: {e}"))
                            .unwrap_or_default()
                    ),
                );
            }
            if state == MessageState::Stuck {
                if let Some(r) = latest
                    .iter()
                    .find(|h| h.status == HopStatus::Error)
                    .and_then(|h| h.reason.clone())
                {
                    note_failure(&mut failure, r);
                }
            }
            let e2e_from = first_at_send.or(p2_at);
            groups.push(GroupSummary {
                group,
                state,
                attempts: max_attempt,
                consumers: consumers.into_iter().collect(),
                acked_at,
                end_to_end_nanos: match (e2e_from, acked_at) {
                    (Some(f), Some(a)) => Some(a.saturating_sub(f)),
                    _ => None,
                },
                last_error,
            });
        }

        // ---- overall state and state history
        // A later stage implies the earlier ones: a delivered message was stored.
        let stored = p3_at.is_some() || p2_at.is_some() || first_delivery_at.is_some();
        let send_hop = hops.iter().find(|h| h.kind == HopKind::Send);
        let mut stuck_reason = None;
        let state = if !stored {
            match send_hop {
                Some(h) if h.status == HopStatus::Error => MessageState::Lost,
                _ => MessageState::Sent,
            }
        } else if groups.is_empty() {
            let since = p3_at.or(p2_at).unwrap_or(0);
            if p3_at.is_some() && self.overdue(since, d.delivered_ms) {
                stuck_reason = Some(format!(
                    "stored, but not delivered to any consumer within {} ms",
                    d.delivered_ms
                ));
                MessageState::Stuck
            } else if p3_at.is_none() && self.overdue(since, d.stored_ms) {
                stuck_reason = Some("received by the broker, never stored".to_owned());
                MessageState::Stuck
            } else {
                MessageState::Enqueued
            }
        } else {
            let worst = |s: MessageState| groups.iter().any(|g| g.state == s);
            if worst(MessageState::DeadLettered) {
                MessageState::DeadLettered
            } else if worst(MessageState::Stuck) {
                MessageState::Stuck
            } else if worst(MessageState::Failed) {
                MessageState::Failed
            } else if worst(MessageState::Consuming) {
                MessageState::Consuming
            } else if worst(MessageState::Delivered) {
                MessageState::Delivered
            } else {
                MessageState::Consumed
            }
        };
        if let Some(r) = stuck_reason {
            note_failure(&mut failure, r);
        }
        if state == MessageState::Lost {
            if let Some(r) = send_hop.and_then(|h| h.reason.clone()) {
                note_failure(&mut failure, r);
            }
        }

        let mut states = Vec::new();
        let mut push_state =
            |s: MessageState, at: Option<u64>, g: Option<&ClientId>, c: Option<&ClientId>| {
                if let Some(at) = at {
                    states.push(StateChange {
                        state: s,
                        at,
                        group: g.cloned(),
                        consumer: c.cloned(),
                    });
                }
            };
        push_state(MessageState::Sent, p1_at, None, None);
        push_state(
            MessageState::Enqueued,
            p3_at.or(p2_at).or(first_delivery_at),
            None,
            None,
        );
        for h in &hops {
            let (g, c) = (h.group.as_ref(), h.consumer.as_ref());
            for r in &h.events {
                let s = match r.stage {
                    Stage::PushSent | Stage::PullSent => Some(MessageState::Delivered),
                    Stage::ProcessStarted => Some(MessageState::Consuming),
                    Stage::ProcessFinished if r.outcome.as_deref() == Some("failed") => {
                        Some(MessageState::Failed)
                    }
                    Stage::PushAckReceived | Stage::PullAckReceived => {
                        match r.outcome.as_deref().unwrap_or("ack") {
                            "ack" => Some(MessageState::Consumed),
                            _ => Some(MessageState::Failed),
                        }
                    }
                    Stage::Redelivery if r.outcome.as_deref() == Some("dead_letter") => {
                        Some(MessageState::DeadLettered)
                    }
                    _ => None,
                };
                if let Some(s) = s {
                    push_state(s, Some(r.at), g, c);
                }
            }
        }
        if matches!(state, MessageState::Stuck | MessageState::Lost) {
            push_state(state, self.opts.now, None, None);
        }
        states.sort_by(|a, b| {
            (a.at, a.state, &a.group, &a.consumer).cmp(&(b.at, b.state, &b.group, &b.consumer))
        });

        let mut t = Trajectory {
            message_id,
            request_id,
            producer,
            topic,
            trace_id,
            attrs,
            payload_size,
            payload_head,
            traceparent,
            upload_attempts,
            duplicates,
            same_request: Vec::new(),
            first_at,
            last_at,
            state,
            states,
            hops,
            groups,
            failure,
            diagnosis: String::new(),
            other_records: other,
            record_count,
        };
        if !self.lite {
            t.diagnosis = diagnose(&t);
        }
        t
    }
}

/// The clause saying that the request ID was stored as several messages (uploaded again
/// after the dedup window, a duplicate the broker no longer recognised), naming the others
/// in upload order.
fn same_request_clause(t: &Trajectory) -> Option<String> {
    if t.same_request.is_empty() {
        return None;
    }
    let req = t
        .request_id
        .as_ref()
        .map(|r| format!("request id {r}"))
        .unwrap_or_else(|| "its request id".to_owned());
    let n = t.same_request.len() + 1;
    let list = |ids: &[MessageId]| {
        ids.iter()
            .map(|m| m.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (before, after): (Vec<MessageId>, Vec<MessageId>) = t
        .same_request
        .iter()
        .partition(|m| t.message_id.is_some_and(|own| **m < own));
    Some(if before.is_empty() {
        format!(
            "duplicate after the dedup window: {req} was stored again as message {}: {n} messages",
            list(&after)
        )
    } else {
        let later = if after.is_empty() {
            String::new()
        } else {
            format!(", then as message {}", list(&after))
        };
        format!(
            "duplicate after the dedup window: {req} was stored before as message {}, and again as this one{later}: {n} messages",
            list(&before)
        )
    })
}

/// The plain-words account: one clause per step, joined by `; `.
fn diagnose(t: &Trajectory) -> String {
    let mut parts: Vec<String> = Vec::new();
    if let Some(send) = t.hop("send") {
        if !send.synthesized {
            let who = t
                .producer
                .as_ref()
                .map(|p| format!(" by {p}"))
                .unwrap_or_default();
            let tries = if t.upload_attempts > 1 {
                format!(" ({} attempts)", t.upload_attempts)
            } else {
                String::new()
            };
            parts.push(format!("sent{who} {}{tries}", format_clock(send.start)));
        }
    }
    if t.duplicates > 0 {
        parts.push(format!("{} duplicate upload(s) suppressed", t.duplicates));
    }
    if let Some(clause) = same_request_clause(t) {
        parts.push(clause);
    }
    match t.hop("store") {
        Some(st) => match st.end {
            Some(end) => {
                let lat = t
                    .hop("send")
                    .filter(|s| !s.synthesized)
                    .map(|s| {
                        format!(
                            " ({} after sending)",
                            format_latency(end.saturating_sub(s.start))
                        )
                    })
                    .unwrap_or_default();
                parts.push(format!("stored {}{lat}", format_clock(end)));
            }
            None => parts.push(format!(
                "received by the broker {}, not stored",
                format_clock(st.start)
            )),
        },
        None => {
            if let Some(r) = t.hop("send").and_then(|s| s.reason.clone()) {
                parts.push(r);
            }
        }
    }
    // Deliveries in the order they happened, across groups; each group's outcome after its
    // last delivery.
    let delivers: Vec<&HopSpan> = t
        .hops
        .iter()
        .filter(|h| h.kind == HopKind::Deliver)
        .collect();
    for (i, d) in delivers.iter().enumerate() {
        let g = d.group.as_ref().map(|g| g.as_str()).unwrap_or("?");
        let c = d.consumer.as_ref().map(|c| c.as_str()).unwrap_or("?");
        let a = d.attempt.unwrap_or(1);
        parts.push(if a > 1 {
            format!(
                "redelivered to {g}/{c}, attempt {a}, at {}",
                format_clock(d.start)
            )
        } else {
            format!("delivered to {g}/{c} at {}", format_clock(d.start))
        });
        let p = t.hops.iter().find(|h| {
            h.kind == HopKind::Process
                && h.group == d.group
                && h.consumer == d.consumer
                && h.attempt == d.attempt
        });
        if let Some(r) = p
            .filter(|p| p.status != HopStatus::Ok)
            .and_then(|p| p.reason.clone())
        {
            parts.push(r);
        }
        match d.status {
            HopStatus::Ok => parts.push(format!(
                "acked after {}",
                format_latency(d.latency_nanos.unwrap_or(0))
            )),
            _ => {
                if let Some(r) = &d.reason {
                    parts.push(r.clone());
                }
            }
        }
        let last_of_group = !delivers[i + 1..].iter().any(|later| later.group == d.group);
        let summary = t.groups.iter().find(|s| Some(&s.group) == d.group.as_ref());
        if let (true, Some(e)) = (last_of_group, summary.and_then(|s| s.end_to_end_nanos)) {
            parts.push(format!("group {g} done {} end to end", format_latency(e)));
        }
    }
    if t.groups.is_empty() && t.state == MessageState::Enqueued {
        parts.push("not delivered yet".to_owned());
    }
    if let Some(f) = &t.failure {
        if !parts.iter().any(|p| p == f) {
            parts.push(f.clone());
        }
    }
    let mut s = parts.join("; ");
    if s.is_empty() {
        s = format!("state {}", t.state);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_796_126_401_000_000_000;
    const MS: u64 = 1_000_000;

    fn rec(stage: Stage, at_ms: u64) -> StageRecord {
        StageRecord::at(stage, T0 + at_ms * MS)
    }

    fn id() -> MessageId {
        "0193a5f2-7c1e-7b2a-9f10-3c4d5e6f7a8b".parse().unwrap()
    }

    fn up(stage: Stage, at_ms: u64, with_id: bool) -> StageRecord {
        let mut r = rec(stage, at_ms);
        r.request_id = Some(RequestId::new("req-1").unwrap());
        r.producer = Some(ClientId::new("shop").unwrap());
        r.topic = Some("orders".into());
        if with_id {
            r.message_id = Some(id());
        }
        r
    }

    fn dl(stage: Stage, at_ms: u64, group: &str, consumer: &str, attempt: u32) -> StageRecord {
        let mut r = rec(stage, at_ms);
        r.message_id = Some(id());
        r.group = Some(ClientId::new(group).unwrap());
        r.consumer = Some(ClientId::new(consumer).unwrap());
        r.attempt = Some(attempt);
        r
    }

    fn with_outcome(mut r: StageRecord, o: &str, detail: Option<&str>) -> StageRecord {
        r.outcome = Some(o.into());
        r.detail = detail.map(Into::into);
        r
    }

    #[test]
    fn same_request_names_the_other_uploads_in_the_diagnosis_and_the_json() {
        let recs = failure_then_success();
        let mut t = Trajectory::assemble(recs.clone(), &AssembleOptions::default()).unwrap();
        let plain = t.clone();
        assert!(t.same_request.is_empty());
        assert!(!serde_json::to_string(&t).unwrap().contains("same_request"));
        let earlier: MessageId = "0193a5f2-0000-7000-8000-000000000001".parse().unwrap();
        let later: MessageId = "0193a5f3-0000-7000-8000-000000000002".parse().unwrap();
        // Its own ID and repeats are dropped; the others are sorted (upload order).
        t.set_same_request([later, id(), earlier, later]);
        assert_eq!(t.same_request, vec![earlier, later]);
        assert!(
            t.diagnosis.contains(&format!(
                "duplicate after the dedup window: request id req-1 was stored before as message {earlier}, and again as this one, then as message {later}: 3 messages"
            )),
            "{}",
            t.diagnosis
        );
        let back: Trajectory = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(back, t);
        t.set_same_request([later]);
        assert!(
            t.diagnosis.contains(&format!(
                "duplicate after the dedup window: request id req-1 was stored again as message {later}: 2 messages"
            )),
            "{}",
            t.diagnosis
        );
        // Nothing else changes, and naming none gives the plain trajectory back.
        t.set_same_request([]);
        assert_eq!(t, plain);
        // A summary assembly has no diagnosis to add it to.
        let mut lite = Trajectory::assemble_for_summary(recs, &AssembleOptions::default()).unwrap();
        lite.set_same_request([later]);
        assert!(lite.diagnosis.is_empty());
        assert_eq!(lite.same_request, vec![later]);
    }

    /// Upload, then a failed first attempt (pull) and a successful redelivery.
    fn failure_then_success() -> Vec<StageRecord> {
        let mut p1 = up(Stage::UploadSent, 0, false);
        p1.attempt = Some(1);
        vec![
            p1,
            up(Stage::UploadReceived, 1, true),
            up(Stage::Stored, 3, true),
            up(Stage::StoreConfirmed, 4, true),
            dl(Stage::PullSent, 10, "billing", "b-2", 1),
            dl(Stage::PullReceived, 11, "billing", "b-2", 1),
            dl(Stage::ProcessStarted, 12, "billing", "b-2", 1),
            with_outcome(
                dl(Stage::ProcessFinished, 15, "billing", "b-2", 1),
                "failed",
                Some("insufficient funds"),
            ),
            with_outcome(
                dl(Stage::PullAckSent, 16, "billing", "b-2", 1),
                "nack",
                None,
            ),
            with_outcome(
                dl(Stage::PullAckReceived, 17, "billing", "b-2", 1),
                "nack",
                None,
            ),
            with_outcome(
                dl(Stage::Redelivery, 17, "billing", "b-2", 1),
                "redeliver",
                Some("nack"),
            ),
            dl(Stage::PullSent, 30, "billing", "b-2", 2),
            dl(Stage::PullReceived, 31, "billing", "b-2", 2),
            dl(Stage::ProcessStarted, 32, "billing", "b-2", 2),
            with_outcome(
                dl(Stage::ProcessFinished, 40, "billing", "b-2", 2),
                "ok",
                None,
            ),
            with_outcome(dl(Stage::PullAckSent, 41, "billing", "b-2", 2), "ack", None),
            with_outcome(
                dl(Stage::PullAckReceived, 42, "billing", "b-2", 2),
                "ack",
                None,
            ),
        ]
    }

    #[test]
    fn failure_then_success_on_redelivery() {
        let t = Trajectory::assemble(failure_then_success(), &AssembleOptions::default()).unwrap();
        assert_eq!(t.message_id, Some(id()));
        assert_eq!(t.state, MessageState::Consumed);
        let keys: Vec<&str> = t.hops.iter().map(|h| h.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "send",
                "store",
                "deliver/billing/b-2/1",
                "process/billing/b-2/1",
                "deliver/billing/b-2/2",
                "process/billing/b-2/2"
            ]
        );
        let p1 = t.hop("process/billing/b-2/1").unwrap();
        assert_eq!(p1.status, HopStatus::Error);
        assert_eq!(
            p1.reason.as_deref(),
            Some("processing failed: insufficient funds")
        );
        assert_eq!(p1.parent.as_deref(), Some("deliver/billing/b-2/1"));
        assert_eq!(
            t.hop("deliver/billing/b-2/2").unwrap().status,
            HopStatus::Ok
        );
        assert_eq!(t.hop("send").unwrap().latency_nanos, Some(4 * MS));
        assert_eq!(
            t.hop("send").unwrap().span_id.as_deref(),
            Some("48c7eb5f9750d85c")
        );
        let g = &t.groups[0];
        assert_eq!(g.attempts, 2);
        assert_eq!(g.state, MessageState::Consumed);
        assert_eq!(g.end_to_end_nanos, Some(42 * MS));
        assert_eq!(g.last_error.as_deref(), Some("insufficient funds"));
        assert!(
            t.diagnosis.contains("stored 12:00:01.003"),
            "{}",
            t.diagnosis
        );
        assert!(
            t.diagnosis
                .contains("processing failed: insufficient funds"),
            "{}",
            t.diagnosis
        );
        assert!(
            t.diagnosis
                .contains("redelivered to billing/b-2, attempt 2"),
            "{}",
            t.diagnosis
        );
        assert!(t.failure.is_none(), "{:?}", t.failure);
        let segs = t.segment_latencies();
        assert!(segs.contains(&(Segment::SentToStored, 3 * MS)));
        assert!(segs.contains(&(Segment::EndToEnd, 42 * MS)));
        assert!(segs.contains(&(Segment::Processing, 8 * MS)));
        // serializes and round-trips
        let json = serde_json::to_string(&t).unwrap();
        let back: Trajectory = serde_json::from_str(&json).unwrap();
        assert_eq!(back, t);
    }

    #[test]
    fn the_summary_assembly_differs_only_by_diagnosis_and_span_ids() {
        let opts = AssembleOptions {
            now: Some(u64::MAX / 2),
            deadlines: Deadlines::default(),
        };
        let mut sets = vec![failure_then_success()];
        sets.push(vec![up(Stage::UploadSent, 0, false)]);
        sets.push(failure_then_success()[..5].to_vec());
        for recs in sets {
            for o in [AssembleOptions::default(), opts] {
                let full = Trajectory::assemble(recs.clone(), &o).unwrap();
                let mut lite = Trajectory::assemble_for_summary(recs.clone(), &o).unwrap();
                assert!(lite.diagnosis.is_empty());
                assert!(lite.hops.iter().all(|h| h.span_id.is_none()));
                lite.diagnosis = full.diagnosis.clone();
                for (l, f) in lite.hops.iter_mut().zip(&full.hops) {
                    l.span_id = f.span_id.clone();
                }
                assert_eq!(lite, full);
                assert_eq!(lite.segment_latencies(), full.segment_latencies());
            }
        }
    }

    #[test]
    fn any_order_and_repeats_give_the_same_trajectory() {
        let recs = failure_then_success();
        let base = Trajectory::assemble(recs.clone(), &AssembleOptions::default()).unwrap();
        // Deterministic pseudo-random permutations (xorshift), plus repeated records.
        let mut seed = 0x9e3779b97f4a7c15u64;
        for round in 0..50 {
            let mut v = recs.clone();
            for i in (1..v.len()).rev() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                v.swap(i, (seed % (i as u64 + 1)) as usize);
            }
            if round % 3 == 0 {
                v.extend(recs.iter().take(round % 7 + 1).cloned());
            }
            assert_eq!(
                Trajectory::assemble(v, &AssembleOptions::default()).unwrap(),
                base
            );
        }
    }

    #[test]
    fn a_p1_that_never_reached_the_broker() {
        let mut p1 = up(Stage::UploadSent, 0, false);
        p1.attempt = Some(3);
        let open = Trajectory::assemble([p1.clone()], &AssembleOptions::default()).unwrap();
        assert_eq!(open.state, MessageState::Sent);
        assert_eq!(open.hops[0].status, HopStatus::Incomplete);
        assert!(open.trace_id.is_some());
        assert!(open.hops[0].span_id.is_none());
        let late = AssembleOptions {
            now: Some(T0 + 60_000 * MS),
            ..Default::default()
        };
        let t = Trajectory::assemble([p1], &late).unwrap();
        assert_eq!(t.state, MessageState::Lost);
        assert_eq!(t.hops[0].status, HopStatus::Error);
        assert!(t
            .failure
            .as_deref()
            .unwrap()
            .starts_with("did not reach the broker"));
        assert_eq!(t.upload_attempts, 3);
    }

    #[test]
    fn the_same_request_sent_twice_counts_two_attempts() {
        let first = up(Stage::UploadSent, 0, false);
        let again = up(Stage::UploadSent, 10, false); // a new send, attempt 1 again
        let mut d1 = up(Stage::Duplicate, 11, true);
        d1.attempt = Some(1);
        let recs = vec![
            first,
            up(Stage::UploadReceived, 1, true),
            up(Stage::Stored, 2, true),
            again,
            d1,
        ];
        let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
        assert_eq!((t.upload_attempts, t.duplicates), (2, 1));
    }

    #[test]
    fn a_refused_upload_says_why() {
        let p1 = up(Stage::UploadSent, 0, false);
        let mut p2 = up(Stage::UploadReceived, 1, false);
        p2.outcome = Some("refused".into());
        p2.detail = Some("payload_too_large: payload is 2048 bytes".into());
        let t =
            Trajectory::assemble([p1.clone(), p2.clone()], &AssembleOptions::default()).unwrap();
        assert_eq!(t.state, MessageState::Lost);
        let store = t.hop("store").unwrap();
        assert_eq!(store.status, HopStatus::Error);
        assert_eq!(store.end, Some(store.start));
        assert_eq!(
            t.failure.as_deref(),
            Some("refused by the broker: payload_too_large: payload is 2048 bytes")
        );
        // A later attempt that went through wins.
        let recs = vec![
            p1,
            p2,
            up(Stage::UploadReceived, 5, true),
            up(Stage::Stored, 6, true),
        ];
        let ok = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
        assert_eq!(ok.hop("store").unwrap().status, HopStatus::Ok);
        assert_eq!(ok.state, MessageState::Enqueued);
    }

    #[test]
    fn a_delivery_never_acked_is_stuck_at_the_consumer() {
        let recs = vec![
            up(Stage::UploadReceived, 1, true),
            up(Stage::Stored, 2, true),
            dl(Stage::PushSent, 5, "audit", "a-1", 1),
            dl(Stage::PushReceived, 6, "audit", "a-1", 1),
        ];
        let t = Trajectory::assemble(recs.clone(), &AssembleOptions::default()).unwrap();
        assert_eq!(t.state, MessageState::Delivered);
        let send = t.hop("send").unwrap();
        assert!(send.synthesized);
        let late = AssembleOptions {
            now: Some(T0 + 3_600_000 * MS),
            ..Default::default()
        };
        let t = Trajectory::assemble(recs, &late).unwrap();
        assert_eq!(t.state, MessageState::Stuck);
        let f = t.failure.clone().unwrap();
        assert!(f.contains("stuck at consumer a-1 (group audit)"), "{f}");
        assert_eq!(
            t.hop("deliver/audit/a-1/1").unwrap().mode,
            Some(DeliveryMode::Push)
        );
    }

    #[test]
    fn dead_letter_duplicates_and_two_groups() {
        let mut d1 = up(Stage::Duplicate, 2, true);
        d1.attempt = Some(2);
        let recs = vec![
            up(Stage::UploadSent, 0, false),
            up(Stage::UploadReceived, 1, true),
            d1,
            up(Stage::Stored, 2, true),
            dl(Stage::PushSent, 5, "a", "a1", 1),
            with_outcome(dl(Stage::PushAckReceived, 9, "a", "a1", 1), "ack", None),
            dl(Stage::PullSent, 5, "b", "b1", 1),
            with_outcome(dl(Stage::PullAckReceived, 9, "b", "b1", 1), "term", None),
            with_outcome(
                dl(Stage::Redelivery, 10, "b", "b1", 1),
                "dead_letter",
                Some("terminated"),
            ),
        ];
        let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
        assert_eq!(t.duplicates, 1);
        assert_eq!(t.upload_attempts, 2);
        assert_eq!(t.groups.len(), 2);
        assert_eq!(t.groups[0].state, MessageState::Consumed);
        assert_eq!(t.groups[1].state, MessageState::DeadLettered);
        assert_eq!(t.state, MessageState::DeadLettered);
        assert!(t.failure.unwrap().contains("dead-lettered by group b"));
    }

    #[test]
    fn the_diagnosis_follows_time_across_groups() {
        let recs = vec![
            up(Stage::UploadReceived, 1, true),
            up(Stage::Stored, 2, true),
            dl(Stage::PushSent, 5, "zeta", "z1", 1),
            with_outcome(dl(Stage::PushAckReceived, 6, "zeta", "z1", 1), "ack", None),
            dl(Stage::PullSent, 9, "alpha", "a1", 1),
            with_outcome(
                dl(Stage::PullAckReceived, 12, "alpha", "a1", 1),
                "ack",
                None,
            ),
        ];
        let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
        let z = t.diagnosis.find("delivered to zeta/z1").unwrap();
        let a = t.diagnosis.find("delivered to alpha/a1").unwrap();
        assert!(z < a, "{}", t.diagnosis);
        assert!(
            t.diagnosis.contains("group zeta done 5.0 ms end to end"),
            "{}",
            t.diagnosis
        );
    }

    #[test]
    fn records_without_group_or_attempt_are_matched() {
        let mut x1 = rec(Stage::ProcessStarted, 32);
        x1.message_id = Some(id());
        x1.consumer = Some(ClientId::new("b-2").unwrap());
        let recs = vec![
            up(Stage::Stored, 2, true),
            dl(Stage::PullSent, 10, "billing", "b-2", 1),
            dl(Stage::PullSent, 30, "billing", "b-2", 2),
            dl(Stage::PullReceived, 31, "billing", "b-2", 2),
            x1,
        ];
        let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
        let p = t.hop("process/billing/b-2/2").unwrap();
        assert!(p.events.iter().any(|r| r.stage == Stage::ProcessStarted));
        assert_eq!(t.state, MessageState::Consuming);
    }

    /// A pull delivery acked: P1, C5–C8 and the producer's P4, without the broker's P2/P3.
    fn delivered_and_acked_without(store: &[Stage]) -> Vec<StageRecord> {
        let mut recs = vec![
            up(Stage::UploadSent, 1, false),
            up(Stage::UploadReceived, 2, true),
            up(Stage::Stored, 3, true),
            up(Stage::StoreConfirmed, 4, true),
            dl(Stage::PullSent, 10, "billing", "b-1", 1),
            dl(Stage::PullReceived, 11, "billing", "b-1", 1),
            dl(Stage::PullAckSent, 12, "billing", "b-1", 1),
            with_outcome(
                dl(Stage::PullAckReceived, 13, "billing", "b-1", 1),
                "ack",
                None,
            ),
        ];
        recs.retain(|r| !store.contains(&r.stage));
        recs
    }

    #[test]
    fn a_delivery_implies_the_message_was_stored() {
        let late = AssembleOptions {
            now: Some(T0 + 3_600_000 * MS),
            ..Default::default()
        };
        // Both of the broker's store records lost: consumed, never "sent".
        let recs = delivered_and_acked_without(&[Stage::UploadReceived, Stage::Stored]);
        let t = Trajectory::assemble(recs, &late).unwrap();
        assert_eq!(t.state, MessageState::Consumed);
        let store = t.hop("store").expect("an inferred store hop");
        assert!(store.inferred);
        assert_eq!(store.status, HopStatus::Ok);
        assert!(store.events.is_empty());
        let states: Vec<MessageState> = t.states.iter().map(|s| s.state).collect();
        assert_eq!(
            states,
            [
                MessageState::Sent,
                MessageState::Enqueued,
                MessageState::Delivered,
                MessageState::Consumed
            ]
        );
        assert!(t.failure.is_none(), "{:?}", t.failure);
        assert!(!t.diagnosis.contains("not stored"), "{}", t.diagnosis);

        // Only P3 lost: stored (inferred), not "not stored … within" at the same time.
        let recs = delivered_and_acked_without(&[Stage::Stored]);
        let t = Trajectory::assemble(recs, &late).unwrap();
        assert_eq!(t.state, MessageState::Consumed);
        let store = t.hop("store").unwrap();
        assert!(store.inferred);
        assert_eq!(store.status, HopStatus::Ok);
        assert!(t.failure.is_none(), "{:?}", t.failure);
        assert!(!t.diagnosis.contains("not stored"), "{}", t.diagnosis);

        // With every record there, nothing is inferred.
        let t = Trajectory::assemble(delivered_and_acked_without(&[]), &late).unwrap();
        assert!(!t.hop("store").unwrap().inferred);
    }

    #[test]
    fn the_brokers_p3_wins_over_a_recovered_one() {
        let mut recovered = up(Stage::Stored, 2, true);
        recovered.outcome = Some(RECOVERED.into());
        let mut recs = delivered_and_acked_without(&[Stage::Stored]);
        recs.push(recovered.clone());
        let t = Trajectory::assemble(recs.clone(), &AssembleOptions::default()).unwrap();
        let store = t.hop("store").unwrap();
        assert_eq!(
            store.end,
            Some(T0 + 2 * MS),
            "the recovered P3 ends the hop"
        );
        assert!(!store.inferred);
        recs.push(up(Stage::Stored, 3, true));
        let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
        assert_eq!(t.hop("store").unwrap().end, Some(T0 + 3 * MS));
    }

    #[test]
    fn deliveries_alone_give_hops_on_their_own_time_axis() {
        let recs = vec![
            dl(Stage::PullSent, 10, "billing", "b-1", 1),
            dl(Stage::PullReceived, 11, "billing", "b-1", 1),
            dl(Stage::PullAckSent, 12, "billing", "b-1", 1),
            with_outcome(
                dl(Stage::PullAckReceived, 13, "billing", "b-1", 1),
                "ack",
                None,
            ),
        ];
        let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
        let send = t.hop("send").unwrap();
        assert!(send.synthesized);
        assert_eq!(send.start, T0 + 10 * MS);
        assert!(send.inferred);
        let segments: Vec<Segment> = t.segment_latencies().iter().map(|(s, _)| *s).collect();
        assert!(!segments.contains(&Segment::EndToEnd), "{segments:?}");
        assert!(!segments.contains(&Segment::SentToStored), "{segments:?}");
        assert!(t.groups.iter().all(|g| g.end_to_end_nanos.is_none()));
        assert!(t.first_at >= T0);
    }
}
