//! What a statistics snapshot holds ([`StatsSnapshot`]: latencies per topic and segment,
//! counts, the funnel, ingest lag): the JSON of `GET /api/stats`.

use msgtrail_core::trajectory::{MessageState, Segment};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Latency percentiles of one (topic, segment), in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencyStats {
    /// Samples.
    pub count: u64,
    /// Samples per second over the period.
    pub rate_per_sec: f64,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Maximum.
    pub max_ms: f64,
    /// Mean.
    pub mean_ms: f64,
}

/// One row of the latency table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatencyRow {
    /// The topic (`""` when unknown).
    pub topic: String,
    /// The segment.
    pub segment: Segment,
    /// Over the sliding window.
    pub window: LatencyStats,
    /// Since the listener started.
    pub total: LatencyStats,
}

/// How far the listener is behind the stage stream, and behind the message stream it
/// recovers store evidence from (the `stored_*` fields).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IngestLag {
    /// Stage-stream messages not yet delivered to the listener.
    pub pending: u64,
    /// Delivered but not yet acknowledged (being applied).
    pub ack_pending: u64,
    /// Age of the last applied stage-stream message when it was applied, milliseconds.
    pub last_lag_ms: Option<f64>,
    /// When the lag was last polled, Unix nanoseconds.
    pub polled_at: Option<u64>,
    /// Stored messages (message stream) not yet delivered to the listener's store-evidence
    /// consumer.
    #[serde(default)]
    pub stored_pending: u64,
    /// Stored messages delivered to it and not yet acknowledged (being applied).
    #[serde(default)]
    pub stored_ack_pending: u64,
    /// Age of the last applied stored message (since JetStream stored it) when it was
    /// applied, milliseconds.
    #[serde(default)]
    pub stored_last_lag_ms: Option<f64>,
    /// When the store-evidence consumer was last polled, Unix nanoseconds; `None` while the
    /// message stream does not exist yet or store evidence is off.
    #[serde(default)]
    pub stored_polled_at: Option<u64>,
}

/// Messages that reached each step (each counted once).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Funnel {
    /// Sent by a producer, or seen by the broker.
    pub sent: u64,
    /// Stored by the broker (P3).
    pub stored: u64,
    /// Delivered to at least one consumer.
    pub delivered: u64,
    /// Acknowledged by at least one consumer group.
    pub acked: u64,
}

/// Counts of notable events.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventCounts {
    /// Duplicate uploads suppressed (D1).
    pub duplicates: u64,
    /// Messages stored under a producer's request ID that already named another message:
    /// the request ID uploaded again after the broker's dedup window, stored anew (each
    /// message past the first of its request ID counts once).
    #[serde(default)]
    pub duplicates_after_window: u64,
    /// Redeliveries scheduled (R1 `redeliver`).
    pub redeliveries: u64,
    /// Messages dead-lettered (R1 `dead_letter`).
    pub dead_letters: u64,
    /// No-matching-message notices (N1).
    pub no_match: u64,
    /// Channels refused (A1 `refused`).
    pub channels_refused: u64,
    /// Messages deleted by retention.
    pub retention_deleted: u64,
}

/// Ingest counters of this listener process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IngestCounts {
    /// Stage-stream messages (batches) applied since start.
    pub batches: u64,
    /// Store transactions those were applied in, since start.
    pub transactions: u64,
    /// Records stored for the first time (persistent).
    pub records: u64,
    /// Records seen again (redeliveries) and skipped, since start.
    pub repeated_records: u64,
    /// Records naming no message (channel, no-match), persistent.
    pub unkeyed_records: u64,
    /// Stage-stream messages that could not be decoded and were dropped, since start.
    pub decode_errors: u64,
    /// Store failures since start: failed attempts of a transaction (the ingest keeps the
    /// batch, unacknowledged, and tries it again until the store can write).
    pub store_errors: u64,
    /// Episodes since start during which the store could not write (a full disk, an I/O
    /// error): each begins with the first failed transaction and ends with the next that
    /// commits.
    #[serde(default)]
    pub store_outages: u64,
    /// While the store cannot write: since when, Unix nanoseconds (`None` while it writes;
    /// `/healthz` answers 503 meanwhile).
    #[serde(default)]
    pub store_unwritable_since: Option<u64>,
    /// While the store cannot write: the error of the episode's first failure.
    #[serde(default)]
    pub store_error: Option<String>,
    /// Stored messages of the message stream applied since start (store evidence: their
    /// P2/P3 committed, then acked), including those that carried no evidence. With the
    /// stage-stream `batches`, what tells that the listener caught up with both sources.
    #[serde(default)]
    pub stored_messages: u64,
    /// Of `stored_messages`, those that yielded no record: no store evidence (stored with
    /// stage recording off, or by a broker that wrote P2/P3 itself), a malformed or
    /// unknown-version `Msgtrail-Stored` header, or headers that name no valid message ID.
    #[serde(default)]
    pub stored_without_evidence: u64,
}

/// The statistics as the API serves them (`GET /api/stats`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatsSnapshot {
    /// The topic the snapshot is limited to (`?topic=`): states, funnel, duplicates,
    /// redeliveries, dead letters and latencies are then of that topic; no-match notices,
    /// refused channels, retention, stages, ingest and lag are always global.
    #[serde(default)]
    pub topic: Option<String>,
    /// Without a topic: the states per topic (`""` for messages whose topic is unknown).
    #[serde(default)]
    pub topics: BTreeMap<String, BTreeMap<MessageState, u64>>,
    /// When the snapshot was taken, Unix nanoseconds.
    pub generated_at: u64,
    /// When the listener started, Unix nanoseconds.
    pub started_at: u64,
    /// Width of the sliding window, seconds.
    pub window_secs: u64,
    /// Shadow messages per state (all topics).
    pub states: BTreeMap<MessageState, u64>,
    /// The completeness funnel (all topics).
    pub funnel: Funnel,
    /// Notable events (all topics).
    pub events: EventCounts,
    /// Records per stage code; P2/P3 recovered from stored messages count under
    /// `P2.recovered` / `P3.recovered`.
    pub stages: BTreeMap<String, u64>,
    /// Ingest counters.
    pub ingest: IngestCounts,
    /// Ingest lag.
    pub lag: IngestLag,
    /// Latency per topic and segment, sorted by topic then segment.
    pub latency: Vec<LatencyRow>,
    /// Observe mode: per observed stream (`?stream=`: that one only), sorted by name; empty
    /// when the listener observes none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub observed: Vec<crate::observed::ObservedStreamStats>,
}
