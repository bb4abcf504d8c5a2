//! Statistics: latency histograms per topic and segment (HDR, over a sliding window and
//! since start), counts by state, the completeness funnel, event counters, ingest lag, and
//! their metrics for `GET /metrics`.
//!
//! Counters and state counts are persistent (they come from the store at start); latency
//! histograms live in memory and are refilled at start from the stored messages of the last
//! window (each message's summary keeps its completed segments), so a restart keeps the
//! window's percentiles; "since start" then also covers that window.
//!
//! ## How the metrics are made
//!
//! [`Stats::record_batch`] gets each completed latency with its message ID from the store
//! ([`ApplyOutcome::latencies`]) and also observes it in a Prometheus histogram per (topic,
//! segment), `msgtrail_hop_latency_seconds` ([`prometheus_client`]'s histogram with
//! exemplars): each bucket keeps the last sample that fell in it as an OpenMetrics exemplar
//! labelled `trace_id` = the message ID in hex, which is the trace ID of the message's
//! OpenTelemetry trace, so a dashboard can open the trace of a slow bucket. That histogram
//! counts since the process started (a restart resets it, as Prometheus expects of
//! counters; [`Stats::seed`] refills only the HDR windows).
//!
//! For each scrape, [`Stats::register_metrics`] adds a snapshot's counters and gauges and
//! the live histograms to a fresh [`Registry`] (the HTTP layer adds the exporter's), and
//! [`Exposition`] encodes it: OpenMetrics 1.0 (with exemplars) when the scraper's `Accept`
//! asks for `application/openmetrics-text`, otherwise the Prometheus text format 0.0.4
//! (no exemplars).

use crate::counters::{topic_counter, Counter, CounterKey, FunnelStep, STAGE_PREFIX};
use crate::store::{ApplyOutcome, TopicState};
use hdrhistogram::Histogram;
use msgtrail_core::trajectory::{MessageState, Segment};
use msgtrail_core::MessageId;
use msgtrail_core::Stage;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter as PromCounter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::{Duration, UNIX_EPOCH};

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
    /// `msgtrail_hop_latency_seconds`: since start, with exemplars (locks of its own).
    hop_latency: HopLatency,
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
            hop_latency: Family::new_with_constructor(hop_histogram),
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
        for (topic, seg, nanos, _) in &outcome.latencies {
            g.hists
                .entry((topic.clone(), *seg))
                .or_insert_with(|| Windowed::new(window))
                .record(now, nanos / 1000);
        }
        drop(g);
        self.observe_latencies(&outcome.latencies, now);
    }

    /// Observes latency samples in the Prometheus histograms, each with its message's trace
    /// ID as the exemplar of the bucket it falls in.
    fn observe_latencies(&self, latencies: &[(String, Segment, u64, Option<MessageId>)], now: u64) {
        let at = UNIX_EPOCH + Duration::from_nanos(now);
        for (topic, seg, nanos, id) in latencies {
            let labels = HopLabels {
                topic: topic.clone(),
                segment: seg.as_str(),
            };
            let exemplar = id.map(|id| TraceLabel {
                trace_id: TraceHex(id),
            });
            self.hop_latency.get_or_create(&labels).observe(
                *nanos as f64 / 1e9,
                exemplar,
                Some(at),
            );
        }
    }

    /// Adds the metrics of a snapshot taken now (counters and gauges) and the live latency
    /// histograms (`msgtrail_hop_latency_seconds`, with exemplars) to `registry`.
    pub fn register_metrics(&self, registry: &mut Registry, now: u64) {
        register_snapshot(&self.snapshot(None, now), registry);
        registry.register_with_unit(
            "msgtrail_hop_latency",
            "Latency per topic and segment since the listener started; exemplars carry the trace ID (the message ID in hex) of the last sample in each bucket",
            Unit::Seconds,
            self.hop_latency.clone(),
        );
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

/// The labels of `msgtrail_hop_latency_seconds`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct HopLabels {
    topic: String,
    segment: &'static str,
}

/// The exemplar label: `trace_id`, the message ID as the 32 hex digits of its trace ID.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TraceLabel {
    trace_id: TraceHex,
}

/// A message ID written as its trace ID (32 lowercase hex digits, no dashes) when encoded,
/// so that recording a sample allocates nothing for its exemplar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct TraceHex(MessageId);

impl EncodeLabelValue for TraceHex {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        use std::fmt::Write as _;
        write!(encoder, "{:032x}", self.0.as_u128())
    }
}

/// The latency histograms per (topic, segment).
type HopLatency = Family<
    HopLabels,
    HistogramWithExemplars<TraceLabel>,
    fn() -> HistogramWithExemplars<TraceLabel>,
>;

/// Upper bounds of the latency buckets, seconds: 0.5 ms to 5 min, about 2.5× apart (a
/// message's hops range from sub-millisecond stores to consumers that hold it for minutes).
const LATENCY_BUCKETS: [f64; 17] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
];

/// A new latency histogram with [`LATENCY_BUCKETS`].
fn hop_histogram() -> HistogramWithExemplars<TraceLabel> {
    HistogramWithExemplars::new(LATENCY_BUCKETS.into_iter())
}

/// Label pairs of a sample.
type Labels = Vec<(&'static str, String)>;

/// A counter holding `v`.
fn counter(v: u64) -> PromCounter {
    let c = PromCounter::default();
    c.inc_by(v);
    c
}

/// A gauge holding `v` (saturating at `i64::MAX`).
fn gauge(v: u64) -> Gauge {
    let g = Gauge::default();
    g.set(i64::try_from(v).unwrap_or(i64::MAX));
    g
}

/// A gauge holding the float `v`.
fn gauge_f64(v: f64) -> Gauge<f64, AtomicU64> {
    let g = Gauge::<f64, AtomicU64>::default();
    g.set(v);
    g
}

/// A counter family with one `key` label, from (value, count) pairs.
fn counters<'a>(
    key: &'static str,
    rows: impl IntoIterator<Item = (&'a str, u64)>,
) -> Family<Labels, PromCounter> {
    let f = Family::<Labels, PromCounter>::default();
    for (k, v) in rows {
        f.get_or_create(&vec![(key, k.to_owned())]).inc_by(v);
    }
    f
}

/// `msgtrail_messages`: by state, and by topic too when the snapshot has topics.
fn messages_by_state(s: &StatsSnapshot) -> Family<Labels, Gauge> {
    let f = Family::<Labels, Gauge>::default();
    if s.topics.is_empty() {
        for st in MessageState::ALL {
            let n = s.states.get(st).copied().unwrap_or(0);
            f.get_or_create(&vec![("state", st.to_string())])
                .set(gauge(n).get());
        }
    } else {
        for (t, states) in &s.topics {
            for st in MessageState::ALL {
                let n = states.get(st).copied().unwrap_or(0);
                f.get_or_create(&vec![("topic", t.clone()), ("state", st.to_string())])
                    .set(gauge(n).get());
            }
        }
    }
    f
}

/// Adds a snapshot's counters and gauges to `r`, under the names the deploy/ dashboard and
/// docs/API.md name (a counter's `_total` is added by the encoder).
pub(crate) fn register_snapshot(s: &StatsSnapshot, r: &mut Registry) {
    r.register(
        "msgtrail_messages",
        "Shadow messages by topic and state",
        messages_by_state(s),
    );
    r.register(
        "msgtrail_funnel_messages",
        "Messages that reached each step: sent, stored, delivered, acked",
        counters(
            "step",
            [
                ("sent", s.funnel.sent),
                ("stored", s.funnel.stored),
                ("delivered", s.funnel.delivered),
                ("acked", s.funnel.acked),
            ],
        ),
    );
    r.register(
        "msgtrail_events",
        "Notable events: duplicates, request IDs stored again after the dedup window, redeliveries, dead letters, no-match notices, refused channels, retention deletions",
        counters(
            "event",
            [
                ("duplicate", s.events.duplicates),
                ("duplicate_after_window", s.events.duplicates_after_window),
                ("redelivery", s.events.redeliveries),
                ("dead_letter", s.events.dead_letters),
                ("no_match", s.events.no_match),
                ("channel_refused", s.events.channels_refused),
                ("retention_deleted", s.events.retention_deleted),
            ],
        ),
    );
    r.register(
        "msgtrail_stage_records",
        "Stage records ingested, by stage code",
        counters("stage", s.stages.iter().map(|(k, v)| (k.as_str(), *v))),
    );
    let plain_counters = [
        (
            "msgtrail_listener_decode_errors",
            "Stage-stream messages dropped because they could not be decoded",
            s.ingest.decode_errors,
        ),
        (
            "msgtrail_listener_repeated_records",
            "Redelivered stage records skipped because they were already applied",
            s.ingest.repeated_records,
        ),
        (
            "msgtrail_listener_stored_messages",
            "Stored messages of the message stream applied as store evidence (P2/P3), since start",
            s.ingest.stored_messages,
        ),
        (
            "msgtrail_listener_stored_without_evidence",
            "Stored messages that carried no store evidence (no Msgtrail-Received-At), since start",
            s.ingest.stored_without_evidence,
        ),
    ];
    for (name, help, v) in plain_counters {
        r.register(name, help, counter(v));
    }
    let plain_gauges = [
        (
            "msgtrail_listener_stored_pending_messages",
            "Stored messages not yet delivered to the listener's store-evidence consumer",
            s.lag.stored_pending,
        ),
        (
            "msgtrail_listener_stored_ack_pending_messages",
            "Stored messages delivered to the store-evidence consumer and not yet applied",
            s.lag.stored_ack_pending,
        ),
        (
            "msgtrail_listener_pending_messages",
            "Stage-stream messages not yet delivered to the listener",
            s.lag.pending,
        ),
        (
            "msgtrail_listener_ack_pending_messages",
            "Stage-stream messages delivered to the listener and not yet applied",
            s.lag.ack_pending,
        ),
    ];
    for (name, help, v) in plain_gauges {
        r.register(name, help, gauge(v));
    }
    r.register_with_unit(
        "msgtrail_listener_lag",
        "Age of the last applied stage-stream message when it was applied",
        Unit::Seconds,
        gauge_f64(s.lag.last_lag_ms.unwrap_or(0.0) / 1000.0),
    );
    r.register_with_unit(
        "msgtrail_listener_stored_lag",
        "Age of the last applied stored message (since JetStream stored it) when it was applied",
        Unit::Seconds,
        gauge_f64(s.lag.stored_last_lag_ms.unwrap_or(0.0) / 1000.0),
    );
}

/// The two text formats `/metrics` serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exposition {
    /// The Prometheus text format, version 0.0.4: what a scraper gets unless it asks for
    /// OpenMetrics. No exemplars.
    Prometheus,
    /// OpenMetrics 1.0 text, with the latency histograms' exemplars.
    OpenMetrics,
}

impl Exposition {
    /// The format an `Accept` header asks for: OpenMetrics when it names
    /// `application/openmetrics-text` with a quality above 0 and at least that of
    /// `text/plain` (Prometheus asks for OpenMetrics first), otherwise Prometheus text.
    pub(crate) fn negotiate(accept: Option<&str>) -> Exposition {
        let (mut openmetrics, mut plain) = (0.0_f64, 0.0_f64);
        for range in accept.unwrap_or("").split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.trim().strip_prefix("q="))
                .find_map(|q| q.trim().parse::<f64>().ok())
                .unwrap_or(1.0);
            match media.as_str() {
                "application/openmetrics-text" => openmetrics = openmetrics.max(q),
                "text/plain" => plain = plain.max(q),
                _ => {}
            }
        }
        if openmetrics > 0.0 && openmetrics >= plain {
            Exposition::OpenMetrics
        } else {
            Exposition::Prometheus
        }
    }

    /// The `Content-Type` of the format.
    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Exposition::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Exposition::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }

    /// Encodes a registry in the format (OpenMetrics ends with `# EOF`).
    pub(crate) fn encode(self, registry: &Registry) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        match self {
            Exposition::Prometheus => {
                prometheus_client::encoding::prometheus_text::encode(&mut out, registry)?
            }
            Exposition::OpenMetrics => {
                prometheus_client::encoding::text::encode(&mut out, registry)?
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats_with(latencies: Vec<(String, Segment, u64, Option<MessageId>)>) -> Stats {
        let s = Stats::new(Duration::from_secs(60), 1, BTreeMap::new(), BTreeMap::new());
        let outcome = ApplyOutcome {
            latencies,
            ..Default::default()
        };
        s.record_batch(1, &outcome, 2_000_000_000);
        s
    }

    fn render(s: &Stats, format: Exposition) -> String {
        let mut r = Registry::default();
        s.register_metrics(&mut r, 3_000_000_000);
        format.encode(&r).unwrap()
    }

    #[test]
    fn openmetrics_buckets_carry_the_last_sample_s_trace_id() {
        let (a, b) = (MessageId::new(), MessageId::new());
        let s = stats_with(vec![
            ("orders".into(), Segment::EndToEnd, 3_000_000, Some(a)),
            ("orders".into(), Segment::EndToEnd, 4_000_000, Some(b)),
            ("orders".into(), Segment::EndToEnd, 40_000_000_000, None),
        ]);
        let text = render(&s, Exposition::OpenMetrics);
        let bucket = |le: &str| {
            let head =
                format!("msgtrail_hop_latency_seconds_bucket{{le=\"{le}\",topic=\"orders\",segment=\"end_to_end\"}}");
            text.lines()
                .find(|l| l.starts_with(&head))
                .unwrap_or_else(|| panic!("no {head} in {text}"))
                .to_owned()
        };
        // 3 ms and 4 ms fall in (2.5 ms, 5 ms]: the later one is the exemplar.
        assert_eq!(
            bucket("0.005"),
            format!(
                "msgtrail_hop_latency_seconds_bucket{{le=\"0.005\",topic=\"orders\",segment=\"end_to_end\"}} 2 # {{trace_id=\"{}\"}} 0.004 2.0",
                b.trace_hex()
            )
        );
        // A sample without a message ID counts and leaves no exemplar.
        assert_eq!(
            bucket("60.0"),
            "msgtrail_hop_latency_seconds_bucket{le=\"60.0\",topic=\"orders\",segment=\"end_to_end\"} 3"
        );
        assert!(
            text.contains("# TYPE msgtrail_hop_latency_seconds histogram\n"),
            "{text}"
        );
        assert!(
            text.contains("# UNIT msgtrail_hop_latency_seconds seconds\n"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn prometheus_text_keeps_the_names_and_has_no_exemplars() {
        let s = stats_with(vec![(
            "orders".into(),
            Segment::EndToEnd,
            3_000_000,
            Some(MessageId::new()),
        )]);
        let text = render(&s, Exposition::Prometheus);
        for line in [
            "# TYPE msgtrail_hop_latency_seconds histogram\n",
            "msgtrail_hop_latency_seconds_count{topic=\"orders\",segment=\"end_to_end\"} 1\n",
            "msgtrail_funnel_messages_total{step=\"acked\"} 0\n",
            "# TYPE msgtrail_listener_decode_errors_total counter\n",
            "msgtrail_listener_decode_errors_total 0\n",
            "msgtrail_listener_pending_messages 0\n",
            "msgtrail_messages{state=\"consumed\"} 0\n",
        ] {
            assert!(text.contains(line), "{line:?} missing from {text}");
        }
        assert!(!text.contains("trace_id"), "{text}");
        assert!(!text.contains("# EOF"), "{text}");
    }

    #[test]
    fn openmetrics_only_when_asked_for() {
        use Exposition::*;
        let prometheus_2 = "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        assert_eq!(Exposition::negotiate(Some(prometheus_2)), OpenMetrics);
        assert_eq!(
            Exposition::negotiate(Some("application/openmetrics-text")),
            OpenMetrics
        );
        assert_eq!(Exposition::negotiate(None), Prometheus);
        assert_eq!(Exposition::negotiate(Some("*/*")), Prometheus);
        assert_eq!(Exposition::negotiate(Some("application/json")), Prometheus);
        assert_eq!(
            Exposition::negotiate(Some("text/plain, application/openmetrics-text;q=0.5")),
            Prometheus
        );
        assert_eq!(
            Exposition::negotiate(Some("application/openmetrics-text;q=0")),
            Prometheus
        );
    }

    const SEC: u64 = 1_000_000_000;

    fn latency(topic: &str, millis: u64) -> (String, Segment, u64, Option<MessageId>) {
        (topic.into(), Segment::EndToEnd, millis * 1_000_000, None)
    }

    fn record(s: &Stats, at: u64, latencies: Vec<(String, Segment, u64, Option<MessageId>)>) {
        let outcome = ApplyOutcome {
            latencies,
            ..Default::default()
        };
        s.record_batch(1, &outcome, at);
    }

    #[test]
    fn the_window_forgets_old_samples_and_the_total_keeps_them() {
        let s = Stats::new(Duration::from_secs(60), 0, BTreeMap::new(), BTreeMap::new());
        record(&s, 10 * SEC, vec![latency("orders", 5)]);
        let row = s.snapshot(None, 20 * SEC).latency.remove(0);
        assert_eq!((row.window.count, row.total.count), (1, 1));
        // Two significant digits: within 1 % of 5 ms.
        assert!((row.window.p50_ms - 5.0).abs() < 0.05, "{row:?}");
        assert!((row.window.max_ms - 5.0).abs() < 0.05, "{row:?}");
        // The window is 60 s in 5 slots of 12 s: the sample's slot (0 to 12 s) is gone once
        // the current slot is 5 slots later.
        let row = s.snapshot(None, 59 * SEC).latency.remove(0);
        assert_eq!(row.window.count, 1, "still inside the window at 59 s");
        let row = s.snapshot(None, 61 * SEC).latency.remove(0);
        assert_eq!((row.window.count, row.total.count), (0, 1), "{row:?}");
    }

    #[test]
    fn rates_divide_by_the_window_or_the_uptime_when_shorter() {
        let s = Stats::new(Duration::from_secs(60), 0, BTreeMap::new(), BTreeMap::new());
        record(&s, SEC, (0..10).map(|_| latency("orders", 2)).collect());
        let row = s.snapshot(None, 5 * SEC).latency.remove(0);
        assert!((row.window.rate_per_sec - 2.0).abs() < 1e-9, "{row:?}");
        assert!((row.total.rate_per_sec - 2.0).abs() < 1e-9, "{row:?}");
        let row = s.snapshot(None, 50 * SEC).latency.remove(0);
        assert!((row.window.rate_per_sec - 0.2).abs() < 1e-9, "{row:?}");
    }

    #[test]
    fn state_changes_move_counts_and_a_topic_filter_keeps_its_own() {
        let s = Stats::new(Duration::from_secs(60), 0, BTreeMap::new(), BTreeMap::new());
        let st = |t: &str, m: MessageState| Some((t.to_owned(), m));
        s.apply_state_changes(&[
            (None, st("a", MessageState::Enqueued)),
            (None, st("a", MessageState::Enqueued)),
            (None, st("b", MessageState::Enqueued)),
            (
                st("a", MessageState::Enqueued),
                st("a", MessageState::Consumed),
            ),
            // A removal of a state never counted does not go below zero.
            (st("b", MessageState::Failed), None),
        ]);
        record(&s, SEC, vec![latency("a", 1), latency("b", 2)]);
        let all = s.snapshot(None, 2 * SEC);
        let want =
            |pairs: &[(MessageState, u64)]| pairs.iter().copied().collect::<BTreeMap<_, _>>();
        assert_eq!(
            all.states,
            want(&[(MessageState::Enqueued, 2), (MessageState::Consumed, 1)])
        );
        assert_eq!(all.topics["b"], want(&[(MessageState::Enqueued, 1)]));
        assert_eq!(all.latency.len(), 2);
        let a = s.snapshot(Some("a"), 2 * SEC);
        assert_eq!(
            a.states,
            want(&[(MessageState::Enqueued, 1), (MessageState::Consumed, 1)])
        );
        assert!(
            a.topics.is_empty(),
            "the per-topic map is for the unfiltered view"
        );
        assert_eq!(a.latency.len(), 1);
        assert_eq!(a.latency[0].topic, "a");
        s.apply_state_changes(&[(st("b", MessageState::Enqueued), None)]);
        assert!(
            !s.snapshot(None, 3 * SEC).topics.contains_key("b"),
            "zeros are dropped"
        );
    }

    #[test]
    fn ingest_and_lag_figures_reach_the_snapshot() {
        let s = Stats::new(Duration::from_secs(60), 0, BTreeMap::new(), BTreeMap::new());
        s.record_stored_batch(10, 3, None, SEC);
        s.record_stored_batch(5, 0, Some(&ApplyOutcome::default()), SEC);
        s.decode_error();
        s.store_error();
        s.set_pending(7, 2, 4 * SEC);
        s.set_last_lag(12.5);
        s.set_stored_pending(1, 0, 5 * SEC);
        let snap = s.snapshot(None, 6 * SEC);
        assert_eq!(snap.ingest.stored_messages, 15);
        assert_eq!(snap.ingest.stored_without_evidence, 3);
        assert_eq!(
            snap.ingest.transactions, 1,
            "only the batch with evidence wrote"
        );
        assert_eq!(
            (snap.ingest.decode_errors, snap.ingest.store_errors),
            (1, 1)
        );
        assert_eq!((snap.lag.pending, snap.lag.ack_pending), (7, 2));
        assert_eq!(snap.lag.polled_at, Some(4 * SEC));
        assert_eq!(snap.lag.last_lag_ms, Some(12.5));
        assert_eq!(snap.lag.stored_pending, 1);
        assert_eq!(snap.lag.stored_polled_at, Some(5 * SEC));
    }
}
