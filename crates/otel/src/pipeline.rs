//! The listener's side of the bridge in one piece: give it a trajectory whenever it changes
//! (and on the watchdog's ticks), and it exports each hop **once**, when the hop has ended
//! (ok or failed) and a short grace for stragglers has passed — or at once when its deadline
//! closed it — after asking the tail sampler.
//!
//! It remembers, per trace, which hops it exported and which the sampler left out (a 64-bit
//! hash and a flag per hop, about 100 bytes per trace). When a trajectory that was healthy
//! turns bad (processing fails at the end, a delivery gets stuck), the hops left out earlier
//! are exported with the failing one, so the trace is whole. The memory is bounded by
//! [`PipelineConfig::max_traces`], the oldest trace forgotten first; a forgotten trace that
//! changes again is exported again, which backends tolerate (same span IDs).
//!
//! ```no_run
//! # async fn demo(t: msgtrail_core::trajectory::Trajectory) -> Result<(), msgtrail_otel::ConfigError> {
//! use msgtrail_otel::{PipelineConfig, TracePipeline};
//! use std::time::Duration;
//!
//! let mut pipeline = TracePipeline::start(PipelineConfig::from_env()?)?;
//! let now = msgtrail_core::time::now_nanos();
//! pipeline.observe(&t, now); // after each change of the trajectory, and on ticks
//! println!("{}", pipeline.snapshot().render_prometheus());
//! pipeline.shutdown(Duration::from_secs(5)).await;
//! # Ok(()) }
//! ```

use crate::error::ConfigError;
use crate::export::{ExportConfig, ExportHandle, ExportStatsSnapshot, TraceExporter};
use crate::mapping::{hop_span, trajectory_trace_id, MappingOptions};
use crate::sampling::{Decision, SamplingPolicy, TailSampler};
use msgtrail_core::trajectory::{HopStatus, Trajectory};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Duration;

/// How long after a hop ends it is exported, in milliseconds (stragglers: events that arrive
/// late, such as a duplicate upload after the store-success notice).
pub(crate) const ENV_GRACE_MS: &str = "MSGTRAIL_OTEL_GRACE_MS";

/// `OTEL_EXPORTER_OTLP_ENDPOINT`.
pub(crate) const ENV_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`.
pub(crate) const ENV_TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
/// `OTEL_TRACES_EXPORTER`: `none` turns export off.
pub(crate) const ENV_TRACES_EXPORTER: &str = "OTEL_TRACES_EXPORTER";

/// Whether the environment asks for OTLP export: an OTLP endpoint is set and
/// `OTEL_TRACES_EXPORTER` is not `none`. The listener exports only then.
pub fn export_requested() -> bool {
    export_requested_in(|k| std::env::var(k).ok())
}

/// [`export_requested`] reading variables through `get`.
pub fn export_requested_in(get: impl Fn(&str) -> Option<String>) -> bool {
    let set = |k: &str| get(k).is_some_and(|v| !v.trim().is_empty());
    let off = get(ENV_TRACES_EXPORTER).is_some_and(|v| v.trim() == "none");
    !off && (set(ENV_ENDPOINT) || set(ENV_TRACES_ENDPOINT))
}

/// Configuration of a [`TracePipeline`].
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineConfig {
    /// The exporter.
    pub export: ExportConfig,
    /// The tail-sampling policy.
    pub sampling: SamplingPolicy,
    /// Grace after a hop's end before it is exported (default 2 s).
    pub grace: Duration,
    /// Most traces remembered at once (default 100,000, about 10 MB).
    pub max_traces: usize,
    /// Most trajectories kept waiting for a hop's grace (default 10,000); beyond it the one
    /// due first is exported early.
    pub max_waiting: usize,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            export: ExportConfig::default(),
            sampling: SamplingPolicy::default(),
            grace: Duration::from_secs(2),
            max_traces: 100_000,
            max_waiting: 10_000,
        }
    }
}

impl PipelineConfig {
    /// The defaults overridden by the environment ([`ExportConfig::from_env`],
    /// [`SamplingPolicy::from_env`], `ENV_GRACE_MS`).
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Like [`PipelineConfig::from_env`], reading variables through `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut c = PipelineConfig {
            export: ExportConfig::from_lookup(&get)?,
            sampling: SamplingPolicy::from_lookup(&get)?,
            ..Default::default()
        };
        if let Some(v) = get(ENV_GRACE_MS) {
            c.grace = Duration::from_millis(
                v.trim()
                    .parse()
                    .map_err(|_| ConfigError::invalid(ENV_GRACE_MS, &v, "milliseconds"))?,
            );
        }
        Ok(c)
    }
}

/// The hops decided for one trace: (hash of the hop key, exported?). Hashes rather than
/// keys keep a remembered trace small. (Not `TraceState`: that is the W3C `tracestate` of
/// `opentelemetry::trace`.)
#[derive(Debug, Default)]
struct TraceDecisions {
    hops: Vec<(u64, bool)>,
}

impl TraceDecisions {
    fn decided(&self, key: &str) -> bool {
        let h = key_hash(key);
        self.hops.iter().any(|(k, _)| *k == h)
    }

    fn skipped(&self, key: &str) -> bool {
        let h = key_hash(key);
        self.hops.iter().any(|(k, exported)| *k == h && !exported)
    }

    fn set(&mut self, key: &str, exported: bool) {
        let h = key_hash(key);
        match self.hops.iter_mut().find(|(k, _)| *k == h) {
            Some(e) => e.1 = exported,
            None => self.hops.push((h, exported)),
        }
    }
}

fn key_hash(key: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

/// Exports trajectories hop by hop, sampled, once each (see the module docs).
#[derive(Debug)]
pub struct TracePipeline {
    exporter: Option<TraceExporter>,
    handle: ExportHandle,
    sampler: TailSampler,
    mapping: MappingOptions,
    grace_nanos: u64,
    max_traces: usize,
    /// Per trace: what was decided, and the generation of its entry in `order`.
    traces: HashMap<String, (TraceDecisions, u64)>,
    /// Traces in the order they were first seen; entries of forgotten traces stay until
    /// compaction (their generation no longer matches), so forgetting is O(1).
    order: VecDeque<(String, u64)>,
    generation: u64,
    /// Trajectories with hops inside their grace, by trace, with when the next is due.
    waiting: HashMap<String, (Trajectory, u64)>,
    /// The same, ordered by due time.
    due_order: BTreeSet<(u64, String)>,
    max_waiting: usize,
}

impl TracePipeline {
    /// Validates the configuration and starts the exporter (within a tokio runtime).
    pub fn start(config: PipelineConfig) -> Result<Self, ConfigError> {
        let mapping = MappingOptions {
            broker_service: config.export.broker_service.clone(),
            now: None,
        };
        let exporter = TraceExporter::start(config.export)?;
        Ok(TracePipeline {
            handle: exporter.handle(),
            exporter: Some(exporter),
            sampler: TailSampler::new(config.sampling),
            mapping,
            grace_nanos: config.grace.as_nanos() as u64,
            max_traces: config.max_traces.max(1),
            traces: HashMap::new(),
            order: VecDeque::new(),
            generation: 0,
            waiting: HashMap::new(),
            due_order: BTreeSet::new(),
            max_waiting: config.max_waiting.max(1),
        })
    }

    /// Looks at the trajectory as it is at `now` (Unix nanoseconds) and exports the hops
    /// that are due. A trajectory with hops still inside their grace is kept (a copy, bounded
    /// by [`PipelineConfig::max_waiting`]) and exported by a later [`TracePipeline::observe`]
    /// or [`TracePipeline::tick`] once they are due, so the caller need not call again. Never
    /// blocks. Returns how many spans were enqueued.
    pub fn observe(&mut self, t: &Trajectory, now: u64) -> usize {
        let mut n = self.process(t, now);
        if let Some(trace) = trajectory_trace_id(t).map(|id| id.to_string()) {
            self.unwait(&trace);
            if let Some(due) = self.next_due(t, &trace, now) {
                self.wait(trace, t.clone(), due);
            }
        }
        n += self.tick(now);
        n
    }

    /// Exports the hops of kept trajectories whose grace has passed by `now`; call it on a
    /// timer (every few hundred milliseconds). Returns how many spans were enqueued.
    pub fn tick(&mut self, now: u64) -> usize {
        let mut n = 0;
        while let Some((due, trace)) = self.due_order.first().cloned() {
            if due > now {
                break;
            }
            self.due_order.remove(&(due, trace.clone()));
            if let Some((t, _)) = self.waiting.remove(&trace) {
                n += self.process(&t, now);
                if let Some(next) = self.next_due(&t, &trace, now) {
                    self.wait(trace, t, next);
                }
            }
        }
        n
    }

    /// How many trajectories are kept waiting for a hop's grace.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    fn wait(&mut self, trace: String, t: Trajectory, due: u64) {
        while self.waiting.len() >= self.max_waiting {
            // Full: the one due first goes now, a little early, rather than never.
            let Some((d, old)) = self.due_order.pop_first() else {
                break;
            };
            if let Some((ot, _)) = self.waiting.remove(&old) {
                self.process(&ot, d);
            }
        }
        self.due_order.insert((due, trace.clone()));
        self.waiting.insert(trace, (t, due));
    }

    fn unwait(&mut self, trace: &str) {
        if let Some((_, due)) = self.waiting.remove(trace) {
            self.due_order.remove(&(due, trace.to_owned()));
        }
    }

    /// When the next undecided hop of `t` that has ended comes out of its grace.
    fn next_due(&self, t: &Trajectory, trace: &str, now: u64) -> Option<u64> {
        let state = self.traces.get(trace).map(|(s, _)| s);
        t.hops
            .iter()
            .filter(|h| h.status != HopStatus::Incomplete)
            .filter(|h| !state.is_some_and(|s| s.decided(&h.key)))
            .filter_map(|h| h.end.map(|e| e.saturating_add(self.grace_nanos)))
            .filter(|due| *due > now)
            .min()
    }

    fn process(&mut self, t: &Trajectory, now: u64) -> usize {
        let Some(trace) = trajectory_trace_id(t).map(|id| id.to_string()) else {
            return 0;
        };
        let due: Vec<&str> = t
            .hops
            .iter()
            .filter(|h| match (h.status, h.end) {
                (HopStatus::Incomplete, _) => false,
                // Closed by its deadline: nothing more is coming.
                (HopStatus::Error, None) => true,
                // Ended, well or badly: wait for stragglers (the nack after a failure).
                (_, Some(end)) => now >= end.saturating_add(self.grace_nanos),
                (HopStatus::Ok, None) => true,
            })
            .map(|h| h.key.as_str())
            .collect();
        if !self.traces.contains_key(&trace) {
            if due.is_empty() {
                return 0;
            }
            self.remember(trace.clone());
        }
        let state = &mut self.traces.get_mut(&trace).expect("remembered above").0;
        let new: Vec<&str> = due.into_iter().filter(|k| !state.decided(k)).collect();
        if new.is_empty() {
            return 0;
        }
        let decision = self.sampler.decide(t, new.len());
        let keys: Vec<String> = match decision {
            Decision::Keep(reason) => {
                let mut keys: Vec<String> = new.iter().map(|k| (*k).to_owned()).collect();
                if reason != crate::sampling::KeepReason::Sampled {
                    // Turned bad: bring back what was left out, so the trace is whole.
                    keys.extend(
                        t.hops
                            .iter()
                            .filter(|h| state.skipped(&h.key))
                            .map(|h| h.key.clone()),
                    );
                }
                keys
            }
            Decision::DropRatio | Decision::DropBudget => {
                self.handle.stats().record_sampled_out(new.len() as u64);
                for k in new {
                    state.set(k, false);
                }
                return 0;
            }
        };
        let mapping = MappingOptions {
            now: Some(now),
            ..self.mapping.clone()
        };
        let spans: Vec<_> = keys
            .iter()
            .filter_map(|k| t.hop(k))
            .filter_map(|h| hop_span(t, h, &mapping))
            .collect();
        for k in &keys {
            state.set(k, true);
        }
        self.handle.try_export(spans)
    }

    fn remember(&mut self, trace: String) {
        while self.traces.len() >= self.max_traces {
            let Some((old, generation)) = self.order.pop_front() else {
                break;
            };
            if self.traces.get(&old).is_some_and(|(_, g)| *g == generation) {
                self.traces.remove(&old);
            }
        }
        if self.order.len() >= self.max_traces.saturating_mul(2) {
            let traces = &self.traces;
            self.order
                .retain(|(k, g)| traces.get(k).is_some_and(|(_, tg)| tg == g));
        }
        self.generation += 1;
        self.order.push_back((trace.clone(), self.generation));
        self.traces
            .insert(trace, (TraceDecisions::default(), self.generation));
    }

    /// Whether the pipeline remembers `t`'s trace (it decided some of its hops).
    pub fn knows(&self, t: &Trajectory) -> bool {
        trajectory_trace_id(t).is_some_and(|id| self.traces.contains_key(&id.to_string()))
    }

    /// Remembers hops of `t` as exported elsewhere (by another process, before this one took
    /// the trajectory's export over): they are not exported again here.
    pub fn mark_exported(&mut self, t: &Trajectory, hop_keys: &[String]) {
        let Some(trace) = trajectory_trace_id(t).map(|id| id.to_string()) else {
            return;
        };
        if hop_keys.is_empty() {
            return;
        }
        if !self.traces.contains_key(&trace) {
            self.remember(trace.clone());
        }
        let state = &mut self.traces.get_mut(&trace).expect("remembered above").0;
        for k in hop_keys {
            state.set(k, true);
        }
    }

    /// How many traces are remembered now.
    pub fn tracked_traces(&self) -> usize {
        self.traces.len()
    }

    /// The exporter's handle (for its counters, or to export spans directly).
    pub fn handle(&self) -> &ExportHandle {
        &self.handle
    }

    /// The exporter's counters now.
    pub fn snapshot(&self) -> ExportStatsSnapshot {
        self.handle.snapshot()
    }

    /// Exports what is still waiting for its grace (now rather than never), then drains the
    /// exporter within `grace` (see [`TraceExporter::shutdown`]).
    pub async fn shutdown(mut self, grace: Duration) -> ExportStatsSnapshot {
        self.due_order.clear();
        for (_, (t, _)) in std::mem::take(&mut self.waiting) {
            // At the end of the last grace, every ended hop is due.
            let last = t
                .hops
                .iter()
                .filter_map(|h| h.end.map(|e| e.saturating_add(self.grace_nanos)))
                .max()
                .unwrap_or(0);
            self.process(&t, last);
        }
        match self.exporter.take() {
            Some(e) => e.shutdown(grace).await,
            None => self.handle.snapshot(),
        }
    }
}
