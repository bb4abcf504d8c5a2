//! Observe mode's statistics in a snapshot (`GET /api/stats`, its `observed` section): per
//! observed JetStream stream and per durable consumer on it, what nats-server showed of the
//! deliveries (counts, queue-wait and ack-time percentiles) and what the consumer holds now.

use crate::stats::LatencyStats;
use msgtrail_core::trajectory::MessageState;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Percentiles over the sliding window and since start.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WindowedLatency {
    /// Over the sliding window (`window_secs` of the snapshot).
    pub window: LatencyStats,
    /// Since the listener started (after a restart: also the window before it).
    pub total: LatencyStats,
}

/// What a consumer holds now, from nats-server's consumer info at discovery's last look.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerNow {
    /// Messages stored and matching the consumer, not delivered to it yet (`num_pending`).
    pub pending: u64,
    /// Messages delivered and not acknowledged yet: unacked (`num_ack_pending`).
    pub unacked: u64,
    /// Of the unacked, those delivered more than once (`num_redelivered`).
    pub redelivered: u64,
    /// Pull requests waiting (`num_waiting`).
    pub waiting: u64,
    /// The stream sequence every message up to which is acknowledged (`ack_floor`).
    pub ack_floor_stream_seq: u64,
    /// The consumer sequence of the ack floor.
    pub ack_floor_consumer_seq: u64,
    /// The stream sequence last delivered (`delivered`).
    pub delivered_stream_seq: u64,
    /// When discovery read these figures, Unix nanoseconds.
    pub polled_at: u64,
}

/// One durable consumer of an observed stream. Counts persist across restarts (they live
/// in the listener's store) and count each event once.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ObservedConsumerStats {
    /// The durable consumer's name (its group on the trajectories).
    pub consumer: String,
    /// Delivery attempts: per message, the highest attempt number an event of this consumer
    /// named (an ack metric, a nak, term or max-deliveries advisory: nats-server's delivery
    /// count, so attempts whose ack wait expired unseen count too), summed over messages.
    pub deliveries: u64,
    /// Of those, attempts after the first (redeliveries).
    pub redeliveries: u64,
    /// Acks (ack metrics).
    pub acks: u64,
    /// Naks (nak advisories).
    pub naks: u64,
    /// Terms (term advisories).
    pub terms: u64,
    /// Terms by reason (`""`: none given; a reason is cut to 80 characters).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub term_reasons: BTreeMap<String, u64>,
    /// Attempts redelivered because their ack wait expired (inferred: attempt n showed up
    /// and attempt n − 1 had no outcome).
    pub ack_wait_expired: u64,
    /// Messages that reached the consumer's max deliveries (max-deliveries advisories).
    pub max_deliveries: u64,
    /// Queue wait: JetStream's stored time → the first attempt's delivery (ack metric time −
    /// `ack_time`), of messages whose first attempt was acked.
    pub queue_wait: WindowedLatency,
    /// Ack time: delivery → ack, of every acked attempt (the metric's `ack_time`).
    pub ack_time: WindowedLatency,
    /// What it holds now (`None` until discovery saw it).
    #[serde(default)]
    pub now: Option<ConsumerNow>,
}

/// One observed stream.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ObservedStreamStats {
    /// The stream's name.
    pub stream: String,
    /// Stored messages read (their store hop recorded).
    pub stored: u64,
    /// Observed messages of the stream per state (the states of every trajectory).
    pub states: BTreeMap<MessageState, u64>,
    /// Stuck messages: stored, and no consumer's delivery seen within the listener's
    /// delivered deadline (`states["stuck"]`).
    pub stuck: u64,
    /// Unacked messages now, summed over its consumers (their `now.unacked`).
    pub unacked: u64,
    /// Its durable consumers, by name.
    pub consumers: Vec<ObservedConsumerStats>,
}
