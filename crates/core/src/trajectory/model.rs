//! The data of a trajectory: what `super::assembly` produces and every reader (the
//! listener's API, `msgtrail trace`, the OpenTelemetry bridge) consumes. Pure data, serializable
//! as JSON; the only logic here is naming (hop keys, state and segment names).

use crate::ids::{BrokerInstance, ClientId, MessageId, RequestId};
use crate::record::StageRecord;
use crate::trace_ids::{self, Hop, HopKeyError};
use crate::GroupId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

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
    /// The hop key, the text of its [`HopId`] ([`HopSpan::id`] reads it back): `send`,
    /// `store`, `deliver/<group>/<consumer>/<attempt>`, `process/<group>/<consumer>/<attempt>`.
    pub key: String,
    /// The key of the parent hop; `None` for the root `send` hop.
    pub parent: Option<String>,
    /// The span ID (16 hex digits) when the message ID is known.
    pub span_id: Option<String>,
    /// The consumer group (deliver and process hops).
    pub group: Option<GroupId>,
    /// The consumer (deliver and process hops).
    pub consumer: Option<ClientId>,
    /// The delivery attempt, from 1 (deliver and process hops).
    pub attempt: Option<u32>,
    /// Push or pull (deliver and process hops).
    pub mode: Option<DeliveryMode>,
    /// A deliver or process hop of a fetch by message ID (docs/PROTOCOL.md §8.2): its own
    /// consumption, apart from the group's subscriptions.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub by_id: bool,
    /// The `service.name` of the party that did the work, from the hop's records.
    pub service: Option<String>,
    /// `store` and `deliver` hops: the broker instance of the hop's first broker-written
    /// record (its clock is the one the hop's broker times are on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broker: Option<BrokerInstance>,
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
    /// Why the hop's raw timestamps are impossible (it would end before it starts: clocks
    /// that disagree), when they are. Such a hop shows no latency (`latency_nanos` is
    /// `None`) and ends where it starts; its events keep the raw times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impossible: Option<String>,
    /// The `store` hop only: when JetStream stored the message (its stored time, from the
    /// store evidence the listener recovered), Unix nanoseconds, when known. The store hop
    /// ends there rather than at the broker's P3 (the PubAck, which stays an event) when a
    /// delivery started before the PubAck.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_at: Option<u64>,
    /// The clock offset of the hop's client (the producer for `send` and `store`, the
    /// consumer for `deliver` and `process`) against the broker, from this hop's own
    /// exchange (P1–P4 or C1–C4/C5–C8), when both sides reported all four times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<ClockEstimate>,
    /// `send` and `process` hops (timed by a client's clock): the hop's start and end moved
    /// onto the broker's clock with the client's best estimate ([`Trajectory::clocks`]),
    /// right within that estimate's bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_broker_clock: Option<CorrectedSpan>,
    /// `store` and `process` hops: how long after the other party's send (P1 for `store`,
    /// C1/C5 for `process`) this hop started, across the two clocks, corrected with the
    /// client's best estimate; right within `arrival_bound_nanos`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrival_nanos: Option<i64>,
    /// The error bound of `arrival_nanos` (the best estimate's bound), nanoseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrival_bound_nanos: Option<u64>,
    /// The stage records of the hop, sorted by time: its span events.
    pub events: Vec<StageRecord>,
}

/// The shadow-message state (docs/ARCHITECTURE.md §2).
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
    /// The overall state of a message its groups (one state each, at least one) consumed:
    /// the worst of them — dead-lettered, stuck, failed, consuming, delivered — else
    /// consumed.
    pub fn worst_of_groups(groups: impl Iterator<Item = MessageState> + Clone) -> MessageState {
        [
            MessageState::DeadLettered,
            MessageState::Stuck,
            MessageState::Failed,
            MessageState::Consuming,
            MessageState::Delivered,
        ]
        .into_iter()
        .find(|s| groups.clone().any(|g| g == *s))
        .unwrap_or(MessageState::Consumed)
    }

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

impl FromStr for MessageState {
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
    pub group: Option<GroupId>,
    /// The consumer, for per-group states.
    pub consumer: Option<ClientId>,
    /// For per-group states: of the group's fetches by message ID rather than of its
    /// subscriptions.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub by_id: bool,
    /// For per-group states: the delivery attempt the change belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
}

/// The consumption of the message by one consumer group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSummary {
    /// The group.
    pub group: GroupId,
    /// The group's fetches by message ID, summarized apart: a fetch by ID is not the
    /// group's consumption (its subscriptions deliver the message all the same,
    /// docs/PROTOCOL.md §8.2).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub by_id: bool,
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
    /// Every state change with its time, in causal order: `sent`, `enqueued`, then each
    /// consumption's changes (per group, attempt by attempt, only forward: delivered →
    /// consuming → consumed | failed | dead-lettered), consumptions interleaved by time, and
    /// `stuck`/`lost` last. Times come from different clocks, so they need not increase
    /// along the list: overlap is shown as it was recorded, never reordered into a
    /// regression.
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
    /// Per client (producer and consumers) and broker instance whose exchanges the
    /// trajectory holds, the best clock estimate (smallest round trip), sorted by client
    /// then instance. Exchanges with different broker instances never mix.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clocks: Vec<ClockEstimate>,
    /// How many distinct records the trajectory was built from.
    pub record_count: usize,
    /// Set when the trajectory was built in observe mode, from nats-server's own events
    /// about a stream msgtrail does not own: the stream and sequence, the producer's trace
    /// it joins, and what observe mode cannot see.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<crate::observed::Observation>,
}

/// A client's clock offset against the broker's, from one NTP-style exchange: the client
/// sends at t0 (P1, or C2's sender C1 with roles swapped), the broker receives at t1 and
/// answers at t2, the client receives at t3. For an upload (P1–P4), the broker's offset
/// against the client is ((P2 − P1) + (P3 − P4)) / 2; for a delivery (C1–C4, C5–C8) the
/// consumer's against the broker is ((C2 − C1) + (C3 − C4)) / 2. Here both are given the
/// same way round: **the client's clock minus the broker's**.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockEstimate {
    /// The client (producer or consumer) whose clock this is.
    pub client: ClientId,
    /// How far the client's clock is ahead of the broker's (negative: behind), nanoseconds.
    pub offset_nanos: i64,
    /// The error bound: the true offset is within `offset_nanos ± bound_nanos` (half of the
    /// round trip without the other side's own time), nanoseconds.
    pub bound_nanos: u64,
    /// The round trip without the other side's own time, nanoseconds.
    pub round_trip_nanos: u64,
    /// How many exchanges of the client the trajectory holds (1 for a hop's own estimate);
    /// the best one (smallest round trip) is kept.
    pub samples: u32,
    /// The broker instance whose clock the client's is measured against: the instance on
    /// the broker-written records of the exchange (P2/P3, C1/C4, C5/C8), which must agree.
    /// Absent for records of brokers that predate instances.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broker: Option<BrokerInstance>,
}

/// A client-clock hop placed on the broker's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CorrectedSpan {
    /// The start on the broker's clock, Unix nanoseconds.
    pub start: u64,
    /// The end on the broker's clock, Unix nanoseconds.
    pub end: Option<u64>,
    /// Both are right within ± this, nanoseconds.
    pub bound_nanos: u64,
}

/// One delivery attempt of the message to one consumer of a group: what a `deliver` hop and
/// its `process` hop are about.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeliveryId {
    /// The consumer group.
    pub group: String,
    /// The consumer.
    pub consumer: String,
    /// The delivery attempt, from 1.
    pub attempt: u32,
    /// A delivery of a fetch by message ID (its attempts are counted apart from the group's
    /// subscriptions'), rather than through a topic subscription.
    pub by_id: bool,
}

/// The identity of a hop: what its key names and its span ID is computed from. Its
/// [`Display`](fmt::Display) form is the hop key and [`FromStr`] reads one back (the grammar
/// of [`trace_ids::Hop::parse`], docs/PROTOCOL.md §13).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HopId {
    /// The producer's upload: `send`.
    Send,
    /// The broker storing it: `store`.
    Store,
    /// One delivery attempt, broker side: `deliver/<group>/<consumer>/<attempt>`, with
    /// `/by-id` appended for a fetch by message ID.
    Deliver(DeliveryId),
    /// The same attempt, consumer side: `process/<group>/<consumer>/<attempt>[/by-id]`.
    Process(DeliveryId),
}

impl HopId {
    /// The borrowed form the span-ID derivation takes.
    pub fn as_hop(&self) -> Hop<'_> {
        match self {
            HopId::Send => Hop::Send,
            HopId::Store => Hop::Store,
            HopId::Deliver(d) => Hop::delivery(true, d.by_id, &d.group, &d.consumer, d.attempt),
            HopId::Process(d) => Hop::delivery(false, d.by_id, &d.group, &d.consumer, d.attempt),
        }
    }

    /// What kind of hop it is.
    pub fn kind(&self) -> HopKind {
        match self {
            HopId::Send => HopKind::Send,
            HopId::Store => HopKind::Store,
            HopId::Deliver(_) => HopKind::Deliver,
            HopId::Process(_) => HopKind::Process,
        }
    }

    /// The delivery attempt a deliver or process hop is about.
    pub fn delivery(&self) -> Option<&DeliveryId> {
        match self {
            HopId::Deliver(d) | HopId::Process(d) => Some(d),
            HopId::Send | HopId::Store => None,
        }
    }

    /// The hop key ([`Hop::key`]; the same text as the [`Display`](fmt::Display) form).
    pub fn key(&self) -> String {
        self.as_hop().key()
    }

    /// The span ID of this hop of a message ([`trace_ids::span_id`]).
    pub fn span_id(&self, message_id: &MessageId) -> [u8; 8] {
        trace_ids::span_id(message_id, &self.as_hop())
    }
}

impl From<Hop<'_>> for HopId {
    fn from(h: Hop<'_>) -> HopId {
        let delivery = |group: &str, consumer: &str, attempt: u32, by_id: bool| DeliveryId {
            group: group.to_owned(),
            consumer: consumer.to_owned(),
            attempt,
            by_id,
        };
        match h {
            Hop::Send => HopId::Send,
            Hop::Store => HopId::Store,
            Hop::Deliver {
                group,
                consumer,
                attempt,
            } => HopId::Deliver(delivery(group, consumer, attempt, false)),
            Hop::Process {
                group,
                consumer,
                attempt,
            } => HopId::Process(delivery(group, consumer, attempt, false)),
            Hop::DeliverById {
                group,
                consumer,
                attempt,
            } => HopId::Deliver(delivery(group, consumer, attempt, true)),
            Hop::ProcessById {
                group,
                consumer,
                attempt,
            } => HopId::Process(delivery(group, consumer, attempt, true)),
        }
    }
}

impl fmt::Display for HopId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_hop().fmt(f)
    }
}

impl FromStr for HopId {
    type Err = HopKeyError;
    fn from_str(s: &str) -> Result<HopId, HopKeyError> {
        Hop::parse(s).map(HopId::from)
    }
}

impl HopSpan {
    /// The hop's identity, read from its key.
    pub fn id(&self) -> Result<HopId, HopKeyError> {
        self.key.parse()
    }
}
