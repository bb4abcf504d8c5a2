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
//!
//! ## A group's merged statistics
//!
//! A member of a listener group ([`Stats::partitioned`]) also keeps its latency histograms
//! per stage partition, beside the per-partition counters the store keeps
//! (`part/<NN>/<name>`). [`Stats::share`] is its answer for an exact set of partitions
//! (counters and serialized histograms, `share`); the member that answers `GET /api/stats`
//! for the group adds up one owner's share of every partition ([`Merged`]: counters summed,
//! histograms merged) and [`Stats::merged_snapshot`] recomputes the percentiles from the
//! merged histograms.
//!
//! The parts: `msgtrail_listener_client::stats` (the types a snapshot is made of), `window` (one sliding-window
//! histogram), `share` (a member's share of a group's statistics, and their merge), [`Stats`]
//! here (recording and snapshots), `metrics` (the Prometheus side).

use crate::counters::{
    split_partition_counter, topic_counter, topic_state_of, Counter, CounterKey, FunnelStep,
    STAGE_PREFIX,
};
use crate::store::{ApplyOutcome, TopicState};
use hdrhistogram::Histogram;
use msgtrail_core::partition::Partition;
use msgtrail_core::trajectory::{MessageState, Segment};
use msgtrail_core::MessageId;
use msgtrail_core::Stage;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter as PromCounter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::{Duration, UNIX_EPOCH};

mod metrics;
mod observed;
mod share;
mod window;
pub(crate) use metrics::*;
pub use msgtrail_listener_client::stats::*;
pub(crate) use observed::ObservedLive;
pub(crate) use share::{Merged, StatsShare};
use window::*;
#[cfg(test)]
mod tests;

/// How many slots the sliding window is cut into.
const SLOTS: u64 = 5;

struct Inner {
    hists: BTreeMap<(String, Segment), Windowed>,
    /// As `hists`, per stage partition (kept only when [`Stats::partitioned`]).
    part_hists: BTreeMap<(Partition, String, Segment), Windowed>,
    states: BTreeMap<TopicState, u64>,
    counters: BTreeMap<String, u64>,
    ingest: IngestCounts,
    lag: IngestLag,
    /// Failed attempts in the current store outage (0 while the store writes).
    outage_failures: u64,
    /// Observe mode's queue-wait and ack-time histograms.
    observed: observed::ObservedHists,
}

/// How a store outage ended ([`Stats::store_written`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutageEnd {
    /// How long the store could not write, nanoseconds.
    pub lasted_nanos: u64,
    /// Failed attempts during the outage.
    pub failures: u64,
}

/// The live statistics of a listener. Shared behind an `Arc`; every method takes a short
/// lock and never does I/O.
pub struct Stats {
    window: Duration,
    started_at: u64,
    inner: Mutex<Inner>,
    /// Whether latencies are also kept per stage partition (a group member).
    partitioned: bool,
    /// `msgtrail_hop_latency_seconds`: since start, with exemplars (locks of its own).
    hop_latency: HopLatency,
    /// Observe mode's discovery, once observing: the streams, consumers and their figures
    /// now.
    observed_live: std::sync::OnceLock<std::sync::Arc<dyn ObservedLive>>,
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
                part_hists: BTreeMap::new(),
                states,
                counters,
                ingest: IngestCounts::default(),
                lag: IngestLag::default(),
                outage_failures: 0,
                observed: BTreeMap::new(),
            }),
            partitioned: false,
            hop_latency: Family::new_with_constructor(hop_histogram),
            observed_live: std::sync::OnceLock::new(),
        }
    }

    /// Also keeps the latency histograms per stage partition (a member of a listener group),
    /// for [`Stats::share`].
    pub fn partitioned(mut self, on: bool) -> Self {
        self.partitioned = on;
        self
    }

    /// Adds per-partition counter changes (`part/<NN>/<name>`) the store made.
    pub fn add_partition_counters(&self, deltas: &BTreeMap<String, i64>) {
        let mut g = self.lock();
        for (name, by) in deltas {
            let e = g.counters.entry(name.clone()).or_default();
            *e = e.saturating_add_signed(*by);
        }
    }

    /// Records one latency sample at `now` in the histograms (and in its partition's, when
    /// kept).
    fn record_latency(
        &self,
        g: &mut Inner,
        (topic, seg, nanos, id): (&str, Segment, u64, Option<&MessageId>),
        now: u64,
    ) {
        let window = self.window;
        g.hists
            .entry((topic.to_owned(), seg))
            .or_insert_with(|| Windowed::new(window))
            .record(now, nanos / 1000);
        if let (true, Some(id)) = (self.partitioned, id) {
            g.part_hists
                .entry((Partition::of_message(id), topic.to_owned(), seg))
                .or_insert_with(|| Windowed::new(window))
                .record(now, nanos / 1000);
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
        for (k, v) in &outcome.partition_counters {
            let e = g.counters.entry(k.clone()).or_default();
            *e = e.saturating_add_signed(*v);
        }
        observed::record(&mut g.observed, self.window, &outcome.observed, now);
        for (topic, seg, nanos, id) in &outcome.latencies {
            self.record_latency(&mut g, (topic, *seg, *nanos, id.as_ref()), now);
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
        let snapshot = self.snapshot(None, now);
        register_snapshot(&snapshot, registry);
        observed::register(&snapshot.observed, registry);
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
        for s in summaries {
            let topic = s.topic.as_deref().unwrap_or_default();
            for (seg, nanos) in &s.segments {
                let sample = (topic, *seg, *nanos, s.message_id.as_ref());
                self.record_latency(&mut g, sample, s.last_at);
            }
        }
    }

    /// Counts a stage-stream message that could not be decoded.
    pub fn decode_error(&self) {
        self.lock().ingest.decode_errors += 1;
    }

    /// Counts a transaction the store could not commit at `now`; returns whether it begins
    /// an outage (the store wrote until then), so the caller logs once per outage.
    ///
    /// The outage's reason (`/healthz`, the stats) is `error`'s chain rendered once here
    /// ([`msgtrail_core::ErrorChain`]): each level and cause named once.
    pub fn store_failed(&self, now: u64, error: &(dyn std::error::Error + 'static)) -> bool {
        let mut g = self.lock();
        g.ingest.store_errors += 1;
        g.outage_failures += 1;
        if g.ingest.store_unwritable_since.is_some() {
            return false;
        }
        g.ingest.store_outages += 1;
        g.ingest.store_unwritable_since = Some(now);
        g.ingest.store_error = Some(msgtrail_core::ErrorChain(error).to_string());
        true
    }

    /// Notes a transaction the store committed at `now`: the end of an outage, if one was on.
    pub fn store_written(&self, now: u64) -> Option<OutageEnd> {
        let mut g = self.lock();
        let since = g.ingest.store_unwritable_since.take()?;
        g.ingest.store_error = None;
        let failures = std::mem::take(&mut g.outage_failures);
        Some(OutageEnd {
            lasted_nanos: now.saturating_sub(since),
            failures,
        })
    }

    /// Whether the store writes (no outage is on): `/healthz` and the housekeeping ask.
    pub fn store_writable(&self) -> bool {
        self.lock().ingest.store_unwritable_since.is_none()
    }

    /// The current outage, if one is on: since when (Unix nanoseconds) and its first error.
    pub fn store_outage(&self) -> Option<(u64, String)> {
        let g = self.lock();
        let since = g.ingest.store_unwritable_since?;
        Some((since, g.ingest.store_error.clone().unwrap_or_default()))
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

    /// Refills observe mode's histograms after a restart: each message's samples (all of
    /// its records counted at once) at its last record time, oldest first.
    pub(crate) fn seed_observed(
        &self,
        messages: &[(u64, Vec<crate::observe::stats::ObservedSample>)],
    ) {
        let mut g = self.lock();
        for (at, samples) in messages {
            observed::record(&mut g.observed, self.window, samples, *at);
        }
    }

    /// Makes the snapshots carry the `observed` section, from `live` (discovery) and the
    /// observed counters; set once, when observe mode starts.
    pub(crate) fn set_observed_live(&self, live: std::sync::Arc<dyn ObservedLive>) {
        let _ = self.observed_live.set(live);
    }

    /// Mirrors counter changes a housekeeping pass persisted (observe mode's per-stream
    /// states).
    pub(crate) fn add_counters(&self, deltas: &crate::store::Deltas) {
        let mut g = self.lock();
        for (k, v) in deltas {
            let e = g.counters.entry(k.to_string()).or_default();
            *e = e.saturating_add_signed(*v);
        }
    }

    /// A snapshot, optionally of one topic's latencies only.
    pub fn snapshot(&self, topic: Option<&str>, now: u64) -> StatsSnapshot {
        self.snapshot_of(topic, None, now)
    }

    /// A snapshot, optionally of one topic's latencies only and of one observed stream only.
    pub fn snapshot_of(
        &self,
        topic: Option<&str>,
        stream: Option<&str>,
        now: u64,
    ) -> StatsSnapshot {
        // Discovery's figures first, outside the statistics' lock.
        let live = self.observed_live.get().map(|l| l.consumers_now());
        let mut g = self.lock();
        let periods = self.periods(now);
        let mut latency = Vec::new();
        for ((t, seg), w) in g.hists.iter_mut() {
            if topic.is_some_and(|want| want != t) {
                continue;
            }
            let win = w.window(now);
            latency.push(latency_row(t, *seg, &win, &w.total, periods));
        }
        let inner = &mut *g;
        let observed = match &live {
            Some(live) => observed::snapshot(
                &inner.counters,
                &mut inner.observed,
                live,
                stream,
                now,
                observed::Periods {
                    window_secs: periods.0,
                    uptime_secs: periods.1,
                },
            ),
            None => Vec::new(),
        };
        let (ingest, lag) = (g.ingest.clone(), g.lag.clone());
        let mut snapshot = self.build(&g.counters, &g.states, latency, ingest, lag, topic, now);
        snapshot.observed = observed;
        snapshot
    }

    /// This member's share of a group's statistics for exactly `partitions`: their
    /// counters (summed, under the plain names) and latency histograms (merged).
    pub(crate) fn share(&self, partitions: &[Partition], now: u64) -> StatsShare {
        let mut g = self.lock();
        let mut merged = Merged::default();
        for (name, v) in &g.counters {
            if let Some((p, plain)) = split_partition_counter(name) {
                if partitions.contains(&p) {
                    *merged.counters.entry(plain.to_owned()).or_default() += v;
                }
            }
        }
        for ((p, t, seg), w) in g.part_hists.iter_mut() {
            if partitions.contains(p) {
                merged.add_histograms(t, *seg, &w.window(now), &w.total);
            }
        }
        merged.into_share(partitions.to_vec())
    }

    /// The snapshot of a group's merged shares: counters, states and latencies from
    /// `merged` (percentiles recomputed from the merged histograms); ingest and lag are
    /// this member's own.
    pub(crate) fn merged_snapshot(
        &self,
        merged: &Merged,
        topic: Option<&str>,
        now: u64,
    ) -> StatsSnapshot {
        let periods = self.periods(now);
        let latency = merged
            .histograms()
            .filter(|(t, _, _, _)| topic.is_none_or(|want| want == *t))
            .map(|(t, seg, win, total)| latency_row(t, seg, win, total, periods))
            .collect();
        let mut states = BTreeMap::new();
        for (name, n) in &merged.counters {
            if let Some(ts) = topic_state_of(name) {
                states.insert(ts, *n);
            }
        }
        let g = self.lock();
        let (ingest, lag) = (g.ingest.clone(), g.lag.clone());
        drop(g);
        self.build(&merged.counters, &states, latency, ingest, lag, topic, now)
    }

    /// The seconds the window and the totals cover now: (window, since start).
    fn periods(&self, now: u64) -> (f64, f64) {
        let uptime = (now.saturating_sub(self.started_at) as f64 / 1e9).max(1e-9);
        (self.window.as_secs_f64().min(uptime), uptime)
    }

    /// A snapshot of `counters` (by name) and `states`, with its latency rows.
    #[allow(clippy::too_many_arguments)]
    fn build(
        &self,
        counters: &BTreeMap<String, u64>,
        states_by_topic: &BTreeMap<TopicState, u64>,
        latency: Vec<LatencyRow>,
        mut ingest: IngestCounts,
        lag: IngestLag,
        topic: Option<&str>,
        now: u64,
    ) -> StatsSnapshot {
        let named = |name: &str| counters.get(name).copied().unwrap_or(0);
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
        let stages: BTreeMap<String, u64> = counters
            .iter()
            .filter_map(|(k, v)| k.strip_prefix(STAGE_PREFIX).map(|s| (s.to_owned(), *v)))
            .collect();
        ingest.records = stages
            .values()
            .sum::<u64>()
            .saturating_sub(c(Counter::Unkeyed));
        ingest.unkeyed_records = c(Counter::Unkeyed);
        let mut states: BTreeMap<MessageState, u64> = BTreeMap::new();
        let mut topics: BTreeMap<String, BTreeMap<MessageState, u64>> = BTreeMap::new();
        for ((t, st), n) in states_by_topic {
            if *n == 0 {
                continue;
            }
            if topic.is_none_or(|want| want == t) {
                *states.entry(*st).or_default() += n;
            }
            if topic.is_none() {
                *topics.entry(t.clone()).or_default().entry(*st).or_default() += n;
            }
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
            observed: Vec::new(),
        }
    }
}

/// One latency row from a (topic, segment)'s window and since-start histograms, over the
/// periods ([`Stats::periods`]) they cover.
fn latency_row(
    topic: &str,
    segment: Segment,
    window: &Histogram<u64>,
    total: &Histogram<u64>,
    (window_secs, uptime): (f64, f64),
) -> LatencyRow {
    LatencyRow {
        topic: topic.to_owned(),
        segment,
        window: summarize(window, window_secs),
        total: summarize(total, uptime),
    }
}
