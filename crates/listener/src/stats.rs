//! Statistics: latency histograms per topic and segment (HDR, over a sliding window and
//! since start), counts by state, the completeness funnel, event counters, ingest lag, and
//! their Prometheus text form.
//!
//! Counters and state counts are persistent (they come from the store at start); latency
//! histograms live in memory and are refilled at start from the stored messages of the last
//! window (each message's summary keeps its completed segments), so a restart keeps the
//! window's percentiles; "since start" then also covers that window.

use crate::counters::{topic_counter, Counter, CounterKey, FunnelStep, STAGE_PREFIX};
use crate::store::{ApplyOutcome, TopicState};
use hdrhistogram::Histogram;
use msgtrail_core::trajectory::{MessageState, Segment};
use msgtrail_core::Stage;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

/// How many slots the sliding window is cut into.
const SLOTS: u64 = 5;

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
    /// Store failures since start (the batch is redelivered later).
    pub store_errors: u64,
    /// Stored messages of the message stream applied since start (store evidence: their
    /// P2/P3 committed, then acked), including those that carried no evidence. With the
    /// stage-stream `batches`, what tells that the listener caught up with both sources.
    #[serde(default)]
    pub stored_messages: u64,
    /// Of `stored_messages`, those that yielded no record: no `Msgtrail-Received-At` header
    /// (stored with stage recording off, or by a broker that wrote P2/P3 itself), or headers
    /// that name no valid message ID.
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
}

struct Windowed {
    slot_nanos: u64,
    slots: VecDeque<(u64, Histogram<u64>)>,
    total: Histogram<u64>,
}

/// An auto-resizing histogram of microseconds with 2 significant digits (1 % error):
/// it grows with the largest value seen, ~16 KiB for values up to a minute, where 3 digits
/// would take ~130 KiB per (topic, segment, window slot).
fn hist() -> Histogram<u64> {
    Histogram::new(2).expect("2 significant digits is valid")
}

/// Records a value; an auto-resizing histogram only fails past `u64` bucket arithmetic,
/// which microsecond latencies never reach.
fn put(h: &mut Histogram<u64>, micros: u64) {
    let _ = h.record(micros);
}

impl Windowed {
    fn new(window: Duration) -> Self {
        Windowed {
            slot_nanos: (window.as_nanos() as u64 / SLOTS).max(1),
            slots: VecDeque::new(),
            total: hist(),
        }
    }

    fn expire(&mut self, now: u64) {
        let cur = now / self.slot_nanos;
        while self.slots.front().is_some_and(|(s, _)| *s + SLOTS <= cur) {
            self.slots.pop_front();
        }
    }

    fn record(&mut self, now: u64, micros: u64) {
        let micros = micros.max(1);
        put(&mut self.total, micros);
        self.expire(now);
        let cur = now / self.slot_nanos;
        match self.slots.back_mut() {
            Some((s, h)) if *s == cur => put(h, micros),
            _ => {
                let mut h = hist();
                put(&mut h, micros);
                self.slots.push_back((cur, h));
            }
        }
    }

    fn window(&mut self, now: u64) -> Histogram<u64> {
        self.expire(now);
        let mut merged = hist();
        for (_, h) in &self.slots {
            let _ = merged.add(h);
        }
        merged
    }
}

fn summarize(h: &Histogram<u64>, secs: f64) -> LatencyStats {
    let ms = |micros: u64| micros as f64 / 1000.0;
    LatencyStats {
        count: h.len(),
        rate_per_sec: if secs > 0.0 {
            h.len() as f64 / secs
        } else {
            0.0
        },
        p50_ms: ms(h.value_at_quantile(0.5)),
        p90_ms: ms(h.value_at_quantile(0.9)),
        p99_ms: ms(h.value_at_quantile(0.99)),
        max_ms: ms(h.max()),
        mean_ms: h.mean() / 1000.0,
    }
}

struct Inner {
    hists: BTreeMap<(String, Segment), Windowed>,
    states: BTreeMap<TopicState, u64>,
    counters: BTreeMap<String, u64>,
    ingest: IngestCounts,
    lag: IngestLag,
}

/// The live statistics of a listener. Shared behind an `Arc`; every method takes a short
/// lock and never does I/O.
pub struct Stats {
    window: Duration,
    started_at: u64,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stats")
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

impl Stats {
    /// Statistics starting from the persistent counters and state counts of the store.
    pub fn new(
        window: Duration,
        started_at: u64,
        counters: BTreeMap<String, u64>,
        states: BTreeMap<TopicState, u64>,
    ) -> Self {
        Stats {
            window,
            started_at,
            inner: Mutex::new(Inner {
                hists: BTreeMap::new(),
                states,
                counters,
                ingest: IngestCounts::default(),
                lag: IngestLag::default(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain counters behind: keep serving them.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies state changes to the counts by state.
    pub fn apply_state_changes(&self, changes: &[crate::store::StateDelta]) {
        let mut g = self.lock();
        for (old, new) in changes {
            if let Some(o) = old {
                let e = g.states.entry(o.clone()).or_default();
                *e = e.saturating_sub(1);
            }
            if let Some(n) = new {
                *g.states.entry(n.clone()).or_default() += 1;
            }
        }
        g.states.retain(|_, v| *v > 0);
    }

    /// Records what a batch of stage-stream messages changed.
    pub fn record_batch(&self, batches: u64, outcome: &ApplyOutcome, now: u64) {
        self.lock().ingest.batches += batches;
        self.record_outcome(outcome, now);
    }

    /// Records what a batch of stored messages (store evidence) changed; `outcome` is `None`
    /// when none of them carried evidence, so that no transaction was needed.
    pub fn record_stored_batch(
        &self,
        messages: u64,
        without_evidence: u64,
        outcome: Option<&ApplyOutcome>,
        now: u64,
    ) {
        {
            let mut g = self.lock();
            g.ingest.stored_messages += messages;
            g.ingest.stored_without_evidence += without_evidence;
        }
        if let Some(o) = outcome {
            self.record_outcome(o, now);
        }
    }

    /// Records what one store transaction changed.
    fn record_outcome(&self, outcome: &ApplyOutcome, now: u64) {
        self.apply_state_changes(&outcome.state_changes);
        let mut g = self.lock();
        g.ingest.transactions += 1;
        g.ingest.repeated_records += outcome.repeated_records;
        for (k, v) in &outcome.counters {
            let e = g.counters.entry(k.to_string()).or_default();
            *e = e.saturating_add_signed(*v);
        }
        let window = self.window;
        for (topic, seg, nanos) in &outcome.latencies {
            g.hists
                .entry((topic.clone(), *seg))
                .or_insert_with(|| Windowed::new(window))
                .record(now, nanos / 1000);
        }
    }

    /// Refills the latency histograms from stored summaries (oldest first), each sample at
    /// its message's last record time, so that a restart keeps the sliding window.
    pub fn seed(&self, summaries: &[crate::store::MessageSummary]) {
        let mut g = self.lock();
        let window = self.window;
        for s in summaries {
            let topic = s.topic.clone().unwrap_or_default();
            for (seg, nanos) in &s.segments {
                g.hists
                    .entry((topic.clone(), *seg))
                    .or_insert_with(|| Windowed::new(window))
                    .record(s.last_at, nanos / 1000);
            }
        }
    }

    /// Counts a stage-stream message that could not be decoded.
    pub fn decode_error(&self) {
        self.lock().ingest.decode_errors += 1;
    }

    /// Counts a batch the store could not apply.
    pub fn store_error(&self) {
        self.lock().ingest.store_errors += 1;
    }

    /// Adds to a persistent counter mirror (retention).
    pub fn add_counter(&self, counter: Counter, by: u64) {
        let name = CounterKey::Global(counter).to_string();
        *self.lock().counters.entry(name).or_default() += by;
    }

    /// Sets the consumer-side lag figures.
    pub fn set_pending(&self, pending: u64, ack_pending: u64, now: u64) {
        let mut g = self.lock();
        g.lag.pending = pending;
        g.lag.ack_pending = ack_pending;
        g.lag.polled_at = Some(now);
    }

    /// Sets the age of the last applied stage-stream message.
    pub fn set_last_lag(&self, lag_ms: f64) {
        self.lock().lag.last_lag_ms = Some(lag_ms);
    }

    /// Sets the lag figures of the store-evidence consumer on the message stream.
    pub fn set_stored_pending(&self, pending: u64, ack_pending: u64, now: u64) {
        let mut g = self.lock();
        g.lag.stored_pending = pending;
        g.lag.stored_ack_pending = ack_pending;
        g.lag.stored_polled_at = Some(now);
    }

    /// Sets the age of the last applied stored message.
    pub fn set_stored_last_lag(&self, lag_ms: f64) {
        self.lock().lag.stored_last_lag_ms = Some(lag_ms);
    }

    /// A snapshot, optionally of one topic's latencies only.
    pub fn snapshot(&self, topic: Option<&str>, now: u64) -> StatsSnapshot {
        let mut g = self.lock();
        let named = |name: &str| g.counters.get(name).copied().unwrap_or(0);
        let c = |counter: Counter| named(&CounterKey::Global(counter).to_string());
        // Funnel, duplicates, redeliveries, dead letters and states are kept per topic too.
        let scoped = |counter: Counter| match topic {
            Some(t) => named(&topic_counter(t, counter)),
            None => c(counter),
        };
        let step = |s: FunnelStep| scoped(Counter::Funnel(s));
        let funnel = Funnel {
            sent: step(FunnelStep::Sent),
            stored: step(FunnelStep::Stored),
            delivered: step(FunnelStep::Delivered),
            acked: step(FunnelStep::Acked),
        };
        let events = EventCounts {
            duplicates: match topic {
                Some(t) => named(&topic_counter(t, Counter::Duplicates)),
                None => c(Counter::Stage(Stage::Duplicate)),
            },
            duplicates_after_window: scoped(Counter::DuplicatesAfterWindow),
            redeliveries: scoped(Counter::Redeliveries),
            dead_letters: scoped(Counter::DeadLetters),
            no_match: c(Counter::Stage(Stage::NoMatch)),
            channels_refused: c(Counter::ChannelsRefused),
            retention_deleted: c(Counter::RetentionDeleted),
        };
        let stages: BTreeMap<String, u64> = g
            .counters
            .iter()
            .filter_map(|(k, v)| k.strip_prefix(STAGE_PREFIX).map(|s| (s.to_owned(), *v)))
            .collect();
        let records = stages
            .values()
            .sum::<u64>()
            .saturating_sub(c(Counter::Unkeyed));
        let mut ingest = g.ingest.clone();
        ingest.records = records;
        ingest.unkeyed_records = c(Counter::Unkeyed);
        let window_secs = self.window.as_secs_f64();
        let uptime = (now.saturating_sub(self.started_at) as f64 / 1e9).max(1e-9);
        let wsecs = window_secs.min(uptime);
        let mut latency = Vec::new();
        let mut states: BTreeMap<MessageState, u64> = BTreeMap::new();
        for ((t, st), n) in &g.states {
            if topic.is_none_or(|want| want == t) && *n > 0 {
                *states.entry(*st).or_default() += n;
            }
        }
        let topics: BTreeMap<String, BTreeMap<MessageState, u64>> = if topic.is_none() {
            let mut m: BTreeMap<String, BTreeMap<MessageState, u64>> = BTreeMap::new();
            for ((t, st), n) in &g.states {
                if *n > 0 {
                    *m.entry(t.clone()).or_default().entry(*st).or_default() += n;
                }
            }
            m
        } else {
            BTreeMap::new()
        };
        let lag = g.lag.clone();
        for ((t, seg), w) in g.hists.iter_mut() {
            if topic.is_some_and(|want| want != t) {
                continue;
            }
            let win = w.window(now);
            latency.push(LatencyRow {
                topic: t.clone(),
                segment: *seg,
                window: summarize(&win, wsecs),
                total: summarize(&w.total, uptime),
            });
        }
        StatsSnapshot {
            topic: topic.map(str::to_owned),
            topics,
            generated_at: now,
            started_at: self.started_at,
            window_secs: self.window.as_secs(),
            states,
            funnel,
            events,
            stages,
            ingest,
            lag,
            latency,
        }
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Renders a snapshot in the Prometheus text exposition format (version 0.0.4).
pub fn prometheus(s: &StatsSnapshot) -> String {
    let mut o = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, rows: Vec<(String, f64)>| {
        let _ = writeln!(o, "# HELP {name} {help}");
        let _ = writeln!(o, "# TYPE {name} {kind}");
        for (labels, v) in rows {
            let _ = writeln!(o, "{name}{labels} {v}");
        }
    };
    metric(
        "msgtrail_messages",
        "gauge",
        "Shadow messages by topic and state.",
        if s.topics.is_empty() {
            MessageState::ALL
                .iter()
                .map(|st| {
                    (
                        format!("{{state=\"{st}\"}}"),
                        s.states.get(st).copied().unwrap_or(0) as f64,
                    )
                })
                .collect()
        } else {
            s.topics
                .iter()
                .flat_map(|(t, states)| {
                    MessageState::ALL.iter().map(move |st| {
                        (
                            format!("{{topic=\"{}\",state=\"{st}\"}}", escape(t)),
                            states.get(st).copied().unwrap_or(0) as f64,
                        )
                    })
                })
                .collect()
        },
    );
    metric(
        "msgtrail_funnel_messages_total",
        "counter",
        "Messages that reached each step: sent, stored, delivered, acked.",
        [
            ("sent", s.funnel.sent),
            ("stored", s.funnel.stored),
            ("delivered", s.funnel.delivered),
            ("acked", s.funnel.acked),
        ]
        .iter()
        .map(|(k, v)| (format!("{{step=\"{k}\"}}"), *v as f64))
        .collect(),
    );
    metric(
        "msgtrail_events_total",
        "counter",
        "Notable events: duplicates, request IDs stored again after the dedup window, redeliveries, dead letters, no-match notices, refused channels, retention deletions.",
        [
            ("duplicate", s.events.duplicates),
            ("duplicate_after_window", s.events.duplicates_after_window),
            ("redelivery", s.events.redeliveries),
            ("dead_letter", s.events.dead_letters),
            ("no_match", s.events.no_match),
            ("channel_refused", s.events.channels_refused),
            ("retention_deleted", s.events.retention_deleted),
        ]
        .iter()
        .map(|(k, v)| (format!("{{event=\"{k}\"}}"), *v as f64))
        .collect(),
    );
    metric(
        "msgtrail_stage_records_total",
        "counter",
        "Stage records ingested, by stage code.",
        s.stages
            .iter()
            .map(|(k, v)| (format!("{{stage=\"{}\"}}", escape(k)), *v as f64))
            .collect(),
    );
    metric(
        "msgtrail_listener_decode_errors_total",
        "counter",
        "Stage-stream messages dropped because they could not be decoded.",
        vec![(String::new(), s.ingest.decode_errors as f64)],
    );
    metric(
        "msgtrail_listener_repeated_records_total",
        "counter",
        "Redelivered stage records skipped because they were already applied.",
        vec![(String::new(), s.ingest.repeated_records as f64)],
    );
    metric(
        "msgtrail_listener_stored_messages_total",
        "counter",
        "Stored messages of the message stream applied as store evidence (P2/P3), since start.",
        vec![(String::new(), s.ingest.stored_messages as f64)],
    );
    metric(
        "msgtrail_listener_stored_without_evidence_total",
        "counter",
        "Stored messages that carried no store evidence (no Msgtrail-Received-At), since start.",
        vec![(String::new(), s.ingest.stored_without_evidence as f64)],
    );
    metric(
        "msgtrail_listener_stored_pending_messages",
        "gauge",
        "Stored messages not yet delivered to the listener's store-evidence consumer.",
        vec![(String::new(), s.lag.stored_pending as f64)],
    );
    metric(
        "msgtrail_listener_stored_ack_pending_messages",
        "gauge",
        "Stored messages delivered to the store-evidence consumer and not yet applied.",
        vec![(String::new(), s.lag.stored_ack_pending as f64)],
    );
    metric(
        "msgtrail_listener_pending_messages",
        "gauge",
        "Stage-stream messages not yet delivered to the listener.",
        vec![(String::new(), s.lag.pending as f64)],
    );
    metric(
        "msgtrail_listener_ack_pending_messages",
        "gauge",
        "Stage-stream messages delivered to the listener and not yet applied.",
        vec![(String::new(), s.lag.ack_pending as f64)],
    );
    metric(
        "msgtrail_listener_lag_seconds",
        "gauge",
        "Age of the last applied stage-stream message when it was applied.",
        vec![(String::new(), s.lag.last_lag_ms.unwrap_or(0.0) / 1000.0)],
    );
    metric(
        "msgtrail_listener_stored_lag_seconds",
        "gauge",
        "Age of the last applied stored message (since JetStream stored it) when it was applied.",
        vec![(
            String::new(),
            s.lag.stored_last_lag_ms.unwrap_or(0.0) / 1000.0,
        )],
    );
    let mut rows = Vec::new();
    for r in &s.latency {
        let l = format!("topic=\"{}\",segment=\"{}\"", escape(&r.topic), r.segment);
        for (q, v) in [
            ("0.5", r.window.p50_ms),
            ("0.9", r.window.p90_ms),
            ("0.99", r.window.p99_ms),
            ("1", r.window.max_ms),
        ] {
            rows.push((format!("{{{l},quantile=\"{q}\"}}"), v / 1000.0));
        }
    }
    metric(
        "msgtrail_hop_latency_seconds",
        "summary",
        "Latency per topic and segment over the sliding window.",
        rows,
    );
    // _count and _sum belong to the summary family: they follow its samples, which the
    // summary above wrote last.
    for r in &s.latency {
        let l = format!("topic=\"{}\",segment=\"{}\"", escape(&r.topic), r.segment);
        let _ = writeln!(
            o,
            "msgtrail_hop_latency_seconds_count{{{l}}} {}",
            r.window.count
        );
        let _ = writeln!(
            o,
            "msgtrail_hop_latency_seconds_sum{{{l}}} {}",
            r.window.mean_ms * r.window.count as f64 / 1000.0
        );
    }
    o
}
