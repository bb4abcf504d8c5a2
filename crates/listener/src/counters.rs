//! The persistent counters, typed: what each counts ([`Counter`]) and whether over all
//! topics or within one ([`CounterKey`]). The store adds deltas by key while it applies a
//! batch and writes each distinct counter once per transaction under its name
//! ([`CounterKey`]'s `Display`), the form the counters table, the statistics and the API
//! have always used: `stage.P1`, `funnel.acked`, `topic/orders/redeliveries`,
//! `topic/orders/state.consumed`, …; observe mode's `observed/<stream>/<consumer>/acks`, ….
//!
//! A member of a listener group (`--group`) also keeps every counter per stage partition,
//! under `part/<NN>/<name>` ([`partition_counter`]), so that a merged answer can take each
//! partition from one of its owners and never count a message twice.

use msgtrail_core::trajectory::MessageState;
use msgtrail_core::Stage;
use std::fmt;

/// A step of the completeness funnel: a message reached it or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FunnelStep {
    /// A send was recorded (a P1, or the broker's P2).
    Sent,
    /// The store hop ended.
    Stored,
    /// Some group got a delivery.
    Delivered,
    /// Some group acked it.
    Acked,
}

impl FunnelStep {
    /// The steps, in order.
    pub const ALL: [FunnelStep; 4] = [
        FunnelStep::Sent,
        FunnelStep::Stored,
        FunnelStep::Delivered,
        FunnelStep::Acked,
    ];

    /// The step's name.
    pub fn as_str(self) -> &'static str {
        match self {
            FunnelStep::Sent => "sent",
            FunnelStep::Stored => "stored",
            FunnelStep::Delivered => "delivered",
            FunnelStep::Acked => "acked",
        }
    }
}

/// What a counter counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Counter {
    /// Bytes of stored records (keys and values): what size retention measures.
    Bytes,
    /// Messages deleted by retention.
    RetentionDeleted,
    /// Records of a stage, new to the store.
    Stage(Stage),
    /// P2/P3 recovered from the stored message itself (store evidence).
    StageRecovered(Stage),
    /// Messages that reached a funnel step.
    Funnel(FunnelStep),
    /// R1 records with outcome `redeliver`.
    Redeliveries,
    /// R1 records with outcome `dead_letter`.
    DeadLetters,
    /// D1 records: duplicate uploads suppressed (kept per topic; globally it is `stage.D1`).
    Duplicates,
    /// Messages stored under a producer's request ID that already named another message
    /// (uploaded again after the broker's dedup window); each past the first counts once.
    DuplicatesAfterWindow,
    /// A1 records with outcome `refused`.
    ChannelsRefused,
    /// Records that name no message, request or client (counted, not stored).
    Unkeyed,
    /// Messages now in a state (kept per topic, so a start reads them instead of every
    /// summary).
    State(MessageState),
}

impl fmt::Display for Counter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Counter::Bytes => f.write_str("bytes"),
            Counter::RetentionDeleted => f.write_str("retention_deleted"),
            Counter::Stage(s) => write!(f, "{STAGE_PREFIX}{s}"),
            Counter::StageRecovered(s) => write!(f, "{STAGE_PREFIX}{s}.recovered"),
            Counter::Funnel(step) => write!(f, "{FUNNEL_PREFIX}{}", step.as_str()),
            Counter::Redeliveries => f.write_str("redeliveries"),
            Counter::DeadLetters => f.write_str("dead_letters"),
            Counter::Duplicates => f.write_str("duplicates"),
            Counter::DuplicatesAfterWindow => f.write_str("duplicates_after_window"),
            Counter::ChannelsRefused => f.write_str("channels_refused"),
            Counter::Unkeyed => f.write_str("unkeyed_records"),
            Counter::State(s) => write!(f, "{STATE_PREFIX}{s}"),
        }
    }
}

/// Prefix of the per-stage counters' names (`stage.P1`, `stage.P2.recovered`).
pub(crate) const STAGE_PREFIX: &str = "stage.";
/// Prefix of the funnel counters' names (`funnel.sent` …).
pub(crate) const FUNNEL_PREFIX: &str = "funnel.";
/// Prefix of the per-topic counters' names: `topic/<topic>/<counter>` (`/` is not in the
/// topic grammar, so a per-topic name cannot be mistaken for a global one).
pub(crate) const TOPIC_PREFIX: &str = "topic/";
/// Prefix of the state counters' names, after the topic (`topic/<topic>/state.<state>`).
pub(crate) const STATE_PREFIX: &str = "state.";

/// Prefix of the per-partition counters' names: `part/<NN>/<name>` (two digits).
pub(crate) const PARTITION_PREFIX: &str = "part/";

/// The name of counter `name` within stage partition `p`: `part/<NN>/<name>`.
pub(crate) fn partition_counter(p: msgtrail_core::partition::Partition, name: &str) -> String {
    format!("{PARTITION_PREFIX}{:02}/{name}", p.index())
}

/// The partition and the plain name of a per-partition counter's name; `None` for others.
pub(crate) fn split_partition_counter(
    name: &str,
) -> Option<(msgtrail_core::partition::Partition, &str)> {
    let rest = name.strip_prefix(PARTITION_PREFIX)?;
    let (n, plain) = rest.split_once('/')?;
    let p = msgtrail_core::partition::Partition::new(n.parse().ok()?)?;
    Some((p, plain))
}

/// The topic and state a state counter's name counts (`topic/<topic>/state.<state>`);
/// `None` for other names.
pub(crate) fn topic_state_of(name: &str) -> Option<(String, MessageState)> {
    let rest = name.strip_prefix(TOPIC_PREFIX)?;
    let (topic, state) = rest.rsplit_once(&format!("/{STATE_PREFIX}"))?;
    Some((topic.to_owned(), state.parse().ok()?))
}

/// A counter, over all topics or within one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CounterKey {
    /// Over all topics.
    Global(Counter),
    /// Within one topic (`""` for messages whose topic is unknown).
    Topic(String, Counter),
    /// Observe mode's, of an observed stream or one of its consumers
    /// ([`crate::observe::stats`]).
    Observed(crate::observe::stats::ObservedKey),
}

impl fmt::Display for CounterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CounterKey::Global(c) => c.fmt(f),
            CounterKey::Topic(t, c) => write!(f, "{TOPIC_PREFIX}{t}/{c}"),
            CounterKey::Observed(k) => k.fmt(f),
        }
    }
}

impl From<Counter> for CounterKey {
    fn from(c: Counter) -> Self {
        CounterKey::Global(c)
    }
}

/// The name of a counter within a topic: `topic/<topic>/<name>`.
pub(crate) fn topic_counter(topic: &str, counter: Counter) -> String {
    CounterKey::Topic(topic.to_owned(), counter).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_stored_ones() {
        let names: Vec<String> = [
            CounterKey::Global(Counter::Bytes),
            Counter::Stage(Stage::UploadSent).into(),
            Counter::StageRecovered(Stage::Stored).into(),
            Counter::Funnel(FunnelStep::Acked).into(),
            Counter::Unkeyed.into(),
            CounterKey::Topic("orders".into(), Counter::Redeliveries),
            CounterKey::Topic(String::new(), Counter::State(MessageState::Consumed)),
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        assert_eq!(
            names,
            [
                "bytes",
                "stage.P1",
                "stage.P3.recovered",
                "funnel.acked",
                "unkeyed_records",
                "topic/orders/redeliveries",
                "topic//state.consumed",
            ]
        );
    }

    #[test]
    fn partition_names_round_trip() {
        let p = msgtrail_core::partition::Partition::new(7).unwrap();
        let name = partition_counter(p, "topic/orders/state.consumed");
        assert_eq!(name, "part/07/topic/orders/state.consumed");
        assert_eq!(
            split_partition_counter(&name),
            Some((p, "topic/orders/state.consumed"))
        );
        assert_eq!(split_partition_counter("stage.P1"), None);
        assert_eq!(split_partition_counter("part/16/stage.P1"), None);
    }
}
