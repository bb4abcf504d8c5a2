//! The report: every scenario's figures, the ratios side by side, the checks against the
//! project's targets (BENCHMARKS.md), as a table for people and as JSON for machines.
//!
//! With repetitions ([`crate::BenchConfig::reps`]) every rate under the existing keys is the
//! median of the repetitions; beside it `reps` (each repetition's rate, in run order) and
//! `spread` ((max − min) ÷ median); the ratios are of the medians, and
//! [`PayloadRun::paired`] gives each throughput ratio over paired repetitions (min, max,
//! each). `crate::reps` computes them.

use crate::export::ExportResult;
use crate::ingest::IngestResult;
use crate::lookup::LookupResult;
use crate::measure::{Latency, Throughput};
use crate::observed::ObserveResult;
use crate::pipeline::PipelineResult;
use crate::raw::RawResult;
use crate::reps::{median, median_index, spread, PairedRatio};
use crate::search::SearchResult;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// The machine the run happened on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// Logical CPUs available to the process.
    pub cores: usize,
    /// CPU model (`/proc/cpuinfo`).
    pub cpu: String,
    /// Total memory, bytes (`/proc/meminfo`).
    pub memory_bytes: u64,
    /// nats-server version (from the server's INFO).
    pub nats_server: String,
    /// Whether this binary was built with optimizations.
    pub release_build: bool,
}

impl Machine {
    /// Reads the machine's facts; the NATS version from a connected client.
    pub fn detect(client: &async_nats::Client) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name")?.split_once(':').map(|x| x.1))
            .unwrap_or("unknown")
            .trim()
            .to_owned();
        let memory_bytes = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                let l = m.lines().find(|l| l.starts_with("MemTotal:"))?;
                l.split_whitespace().nth(1)?.parse::<u64>().ok()
            })
            .map(|kb| kb * 1024)
            .unwrap_or(0);
        Machine {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu,
            memory_bytes,
            nats_server: client.server_info().version,
            release_build: !cfg!(debug_assertions),
        }
    }
}

/// The ratios of one payload size, side by side.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Ratios {
    /// S2 throughput ÷ S1 pipeline throughput (target ≥ 0.70).
    pub s2_over_s1: f64,
    /// S3 throughput ÷ S2 throughput (target ≥ 0.95).
    pub s3_over_s2: f64,
    /// Stage-stream messages per stored message in S3 (target ≤ 0.25).
    pub stage_messages_per_message: f64,
    /// S3 end-to-end p99 ÷ S2 end-to-end p99, latency runs at the same fixed rate
    /// (target ≤ 1.10).
    pub e2e_p99_s3_over_s2: f64,
    /// The same in the throughput runs, where each side is saturated (a queue's latency).
    pub e2e_p99_s3_over_s2_saturated: f64,
    /// S2 end-to-end p99 ÷ S1 end-to-end p99, latency runs (no target; what the broker's
    /// hops cost).
    pub e2e_p99_s2_over_s1: f64,
    /// S2 end-to-end p50 − S1 end-to-end p50 in the latency runs, milliseconds (target
    /// ≤ +0.5 ms).
    pub e2e_p50_s2_minus_s1_ms: f64,
    /// S3L throughput (listener ingesting during the load, same cores) ÷ S2.
    pub s3l_over_s2: f64,
    /// S2 with one message per upload and settle request ÷ S1 pipeline: the path without
    /// batching.
    pub s2_batch1_over_s1: f64,
    /// S2 ÷ S2 with one message per request: what batching gains.
    pub batching_gain: f64,
    /// S2 ÷ S1F (raw JetStream with fast-ingest batches; 0 on a server before 2.14): against
    /// what a JetStream expert reaches. Reported, the targets stay on S1.
    #[serde(default)]
    pub s2_over_s1f: f64,
}

/// The throughput ratios of one payload size over paired repetitions (repetition *k* of
/// the numerator ÷ repetition *k* of the denominator): how far a ratio moves between
/// back-to-back runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PairedRatios {
    /// S2 ÷ S1 pipeline.
    pub s2_over_s1: PairedRatio,
    /// S3 ÷ S2.
    pub s3_over_s2: PairedRatio,
    /// S3L ÷ S2.
    pub s3l_over_s2: PairedRatio,
    /// S2 batch 1 ÷ S1 pipeline.
    pub s2_batch1_over_s1: PairedRatio,
    /// S2 ÷ S2 batch 1.
    pub batching_gain: PairedRatio,
    /// S2 ÷ S1F (empty on a server before 2.14).
    pub s2_over_s1f: PairedRatio,
}

/// One repetition of every saturated scenario of one payload size, as run.
#[derive(Debug, Clone, Default)]
pub(crate) struct Repetition {
    pub(crate) s1: RawResult,
    pub(crate) s2: PipelineResult,
    pub(crate) s3: PipelineResult,
    pub(crate) s3l: PipelineResult,
    pub(crate) s2_batch1: PipelineResult,
    pub(crate) s1f: Option<Throughput>,
}

/// The median repetition of a pipeline scenario, its rates replaced by the medians, the
/// first repetition's latency run, each repetition's rate and the spread.
fn median_pipeline(reps: &[&PipelineResult]) -> PipelineResult {
    let rates: Vec<f64> = reps.iter().map(|r| r.throughput.per_sec).collect();
    let sends: Vec<f64> = reps.iter().map(|r| r.send.per_sec).collect();
    let i = median_index(&rates);
    let mut out = reps[i].clone();
    out.throughput.per_sec = median(&rates);
    out.send.per_sec = median(&sends);
    out.paced = reps[0].paced.clone();
    out.spread = spread(&rates);
    out.reps = rates;
    out.repetition = i as u32;
    out
}

/// S1's median repetition (by the pipeline rate, the one the ratios use), its publish and
/// consume rates the medians of theirs, the first repetition's latency run.
fn median_raw(reps: &[&RawResult]) -> RawResult {
    let rates = |f: fn(&RawResult) -> f64| reps.iter().map(|r| f(r)).collect::<Vec<f64>>();
    let pipeline = rates(|r| r.pipeline.per_sec);
    let publish = rates(|r| r.publish.per_sec);
    let consume = rates(|r| r.consume.per_sec);
    let i = median_index(&pipeline);
    let mut out = reps[i].clone();
    out.repetition = i as u32;
    out.pipeline.per_sec = median(&pipeline);
    out.publish.per_sec = median(&publish);
    out.consume.per_sec = median(&consume);
    out.paced = reps[0].paced.clone();
    out.spread = spread(&pipeline);
    out.publish_spread = spread(&publish);
    out.consume_spread = spread(&consume);
    out.reps = pipeline;
    out.publish_reps = publish;
    out.consume_reps = consume;
    out
}

/// S1, S2 and S3 of one payload size.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PayloadRun {
    /// Payload size, bytes.
    pub payload_bytes: usize,
    /// Raw JetStream.
    pub s1: RawResult,
    /// msgtrail, recording off.
    pub s2: PipelineResult,
    /// msgtrail, recording on; the listener ingests after the load (own machine in
    /// production, so outside the throughput window).
    pub s3: PipelineResult,
    /// msgtrail, recording on, the listener ingesting during the load on the same cores.
    pub s3l: PipelineResult,
    /// msgtrail, recording off, one message per upload and settle request.
    pub s2_batch1: PipelineResult,
    /// S1F: raw JetStream with fast-ingest batches (pipeline throughput; absent on a server
    /// before 2.14).
    #[serde(default)]
    pub s1f: Option<Throughput>,
    /// The ratios (of the medians).
    pub ratios: Ratios,
    /// Repetitions of every saturated scenario.
    #[serde(default)]
    pub repetitions: u32,
    /// S1F msgs/s of each repetition (empty on a server before 2.14).
    #[serde(default)]
    pub s1f_reps: Vec<f64>,
    /// (max − min) ÷ median of `s1f_reps`.
    #[serde(default)]
    pub s1f_spread: f64,
    /// The throughput ratios over paired repetitions.
    #[serde(default)]
    pub paired: PairedRatios,
}

impl PayloadRun {
    /// Puts the results together and computes the ratios.
    pub fn new(
        s1: RawResult,
        s2: PipelineResult,
        s3: PipelineResult,
        s3l: PipelineResult,
        s2_batch1: PipelineResult,
        s1f: Option<Throughput>,
    ) -> Self {
        let ratios = Ratios {
            s2_over_s1: s2.throughput.per_sec / s1.pipeline.per_sec,
            s3_over_s2: s3.throughput.per_sec / s2.throughput.per_sec,
            stage_messages_per_message: s3.stage_messages_per_message,
            e2e_p99_s3_over_s2: s3.paced.e2e.p99_ms / s2.paced.e2e.p99_ms,
            e2e_p99_s3_over_s2_saturated: s3.e2e.p99_ms / s2.e2e.p99_ms,
            e2e_p99_s2_over_s1: s2.paced.e2e.p99_ms / s1.paced.e2e.p99_ms,
            e2e_p50_s2_minus_s1_ms: s2.paced.e2e.p50_ms - s1.paced.e2e.p50_ms,
            s3l_over_s2: s3l.throughput.per_sec / s2.throughput.per_sec,
            s2_batch1_over_s1: s2_batch1.throughput.per_sec / s1.pipeline.per_sec,
            batching_gain: s2.throughput.per_sec / s2_batch1.throughput.per_sec,
            s2_over_s1f: s1f
                .as_ref()
                .map_or(0.0, |f| s2.throughput.per_sec / f.per_sec),
        };
        PayloadRun {
            payload_bytes: s1.payload_bytes,
            repetitions: 1,
            s1,
            s2,
            s3,
            s3l,
            s2_batch1,
            s1f,
            ratios,
            s1f_reps: Vec::new(),
            s1f_spread: 0.0,
            paired: PairedRatios::default(),
        }
    }

    /// The medians of the repetitions (at least one) under the existing keys, the ratios of
    /// the medians, each repetition and the spreads, and the ratios over paired repetitions.
    pub(crate) fn from_reps(reps: Vec<Repetition>) -> Self {
        let pick = |f: fn(&Repetition) -> &PipelineResult| {
            median_pipeline(&reps.iter().map(f).collect::<Vec<_>>())
        };
        let (s2, s3, s3l, s2_batch1) = (
            pick(|r| &r.s2),
            pick(|r| &r.s3),
            pick(|r| &r.s3l),
            pick(|r| &r.s2_batch1),
        );
        let s1 = median_raw(&reps.iter().map(|r| &r.s1).collect::<Vec<_>>());
        let s1f_reps: Vec<f64> = reps
            .iter()
            .filter_map(|r| r.s1f.as_ref().map(|t| t.per_sec))
            .collect();
        let s1f = (s1f_reps.len() == reps.len() && !reps.is_empty()).then(|| {
            let mut t = reps[median_index(&s1f_reps)]
                .s1f
                .clone()
                .unwrap_or_default();
            t.per_sec = median(&s1f_reps);
            t
        });
        let paired = PairedRatios {
            s2_over_s1: PairedRatio::of(&s2.reps, &s1.reps),
            s3_over_s2: PairedRatio::of(&s3.reps, &s2.reps),
            s3l_over_s2: PairedRatio::of(&s3l.reps, &s2.reps),
            s2_batch1_over_s1: PairedRatio::of(&s2_batch1.reps, &s1.reps),
            batching_gain: PairedRatio::of(&s2.reps, &s2_batch1.reps),
            s2_over_s1f: if s1f.is_some() {
                PairedRatio::of(&s2.reps, &s1f_reps)
            } else {
                PairedRatio::default()
            },
        };
        let n = reps.len() as u32;
        let s1f_spread = spread(&s1f_reps);
        PayloadRun {
            repetitions: n,
            s1f_reps,
            s1f_spread,
            paired,
            ..PayloadRun::new(s1, s2, s3, s3l, s2_batch1, s1f)
        }
    }
}

/// The ratios of the scenarios that do not run per payload size.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReportRatios {
    /// S8: the application's msgs/s observed by a listener ÷ alone (medians; no target).
    pub s8_observed_over_raw: f64,
    /// S4P: two listeners' aggregate ingest ÷ one listener's (target ≥ 1.8).
    #[serde(default)]
    pub s4p_scaling: f64,
}

/// One of the project's targets and whether this run met it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetCheck {
    /// What is measured.
    pub name: String,
    /// The target, in words.
    pub target: String,
    /// The measured value.
    pub value: f64,
    /// Met or missed.
    pub met: bool,
}

/// Everything one `msgtrail bench` run measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The machine.
    pub machine: Machine,
    /// The settings.
    pub settings: crate::BenchConfig,
    /// Against a nats-server the harness started (false: `--nats-url`).
    pub own_server: bool,
    /// S1–S3 per payload size, JetStream's default sync (fsync every 2 minutes).
    pub runs: Vec<PayloadRun>,
    /// S1–S3 per payload size with JetStream `sync_interval: always` (`--durable`).
    pub durable: Option<Vec<PayloadRun>>,
    /// S4.
    pub s4: IngestResult,
    /// S5.
    pub s5: LookupResult,
    /// S6.
    pub s6: ExportResult,
    /// S7: search latency at S5's store size.
    #[serde(default)]
    pub s7: SearchResult,
    /// S8: observe mode's overhead on an unmodified JetStream application.
    #[serde(default)]
    pub s8: ObserveResult,
    /// S4P: a listener group's ingest scaling and fan-out cost.
    #[serde(default)]
    pub s4p: crate::ScaleOutResult,
    /// Ratios beyond the per-payload ones (S8, S4P).
    #[serde(default)]
    pub ratios: ReportRatios,
    /// The project's targets (BENCHMARKS.md).
    pub targets: Vec<TargetCheck>,
    /// Wall-clock seconds of the whole run.
    pub total_seconds: f64,
    /// The estimate printed at the start ([`crate::BenchConfig::estimate`]), seconds.
    #[serde(default)]
    pub estimated_seconds: f64,
}

fn check(name: String, target: &str, value: f64, met: bool) -> TargetCheck {
    TargetCheck {
        name,
        target: target.to_owned(),
        value,
        met,
    }
}

impl Report {
    /// Fills [`Report::targets`] from the figures.
    pub fn check_targets(&mut self) {
        let mut t = Vec::new();
        t.push(check(
            "S4P two listeners' ingest ÷ one listener's".to_owned(),
            "≥ 1.8",
            self.ratios.s4p_scaling,
            self.ratios.s4p_scaling >= 1.8,
        ));
        for r in &self.runs {
            let b = r.payload_bytes;
            let x = &r.ratios;
            t.push(check(
                format!("S2 ÷ S1 throughput, {b} B"),
                "≥ 0.70",
                x.s2_over_s1,
                x.s2_over_s1 >= 0.70,
            ));
            t.push(check(
                format!("S3 ÷ S2 throughput, {b} B"),
                "≥ 0.95",
                x.s3_over_s2,
                x.s3_over_s2 >= 0.95,
            ));
            t.push(check(
                format!("S3L ÷ S2 throughput (listener in the window), {b} B"),
                "≥ 0.80",
                x.s3l_over_s2,
                x.s3l_over_s2 >= 0.80,
            ));
            t.push(check(
                format!("stage-stream messages per message, {b} B"),
                "≤ 0.25",
                x.stage_messages_per_message,
                x.stage_messages_per_message <= 0.25,
            ));
            t.push(check(
                format!("e2e p99 S3 ÷ S2 at a fixed rate, {b} B"),
                "≤ 1.10",
                x.e2e_p99_s3_over_s2,
                x.e2e_p99_s3_over_s2 <= 1.10,
            ));
            t.push(check(
                format!("e2e p50 S2 − S1 at a fixed rate, ms, {b} B"),
                "≤ +0.5",
                x.e2e_p50_s2_minus_s1_ms,
                x.e2e_p50_s2_minus_s1_ms <= 0.5,
            ));
        }
        let s4 = &self.s4;
        t.push(check(
            "listener records/s on one core (S4)".into(),
            "≥ 1,000,000, zero drops",
            s4.records.per_sec,
            s4.records.per_sec >= 1e6 && s4.drops == 0,
        ));
        t.push(check(
            "listener memory per in-flight message, bytes (S4)".into(),
            "≤ 512",
            s4.counted_bytes_per_inflight_message,
            s4.counted_bytes_per_inflight_message > 0.0
                && s4.counted_bytes_per_inflight_message <= 512.0,
        ));
        t.push(check(
            "store bytes in use per message of ten records (S4)".into(),
            "≤ 1,024",
            s4.store_bytes_in_use_per_ten_record_message,
            s4.store_bytes_in_use_per_ten_record_message > 0.0
                && s4.store_bytes_in_use_per_ten_record_message <= 1024.0,
        ));
        t.push(check(
            "arrival to queryable p99 ms at 80 % of max ingest (S4)".into(),
            "≤ 1,000",
            s4.queryable_ms.p99_ms,
            s4.queryable_ms.count > 0 && s4.queryable_ms.p99_ms <= 1000.0,
        ));
        t.push(check(
            format!("lookup p99 ms with {} stored (S5)", self.s5.stored_messages),
            "≤ 5 ms at 10 M",
            self.s5.latency.p99_ms,
            self.s5.latency.p99_ms <= 5.0 && self.s5.stored_messages >= 10_000_000,
        ));
        t.push(check(
            format!("S7 search p99 ms with {} stored", self.s7.stored_messages),
            "≤ 50 ms",
            self.s7.latency.p99_ms,
            self.s7.latency.count > 0 && self.s7.latency.p99_ms <= 50.0,
        ));
        for (name, run) in [
            ("gRPC", (&self.s6.export, self.s6.dropped)),
            ("HTTP", (&self.s6.http.export, self.s6.http.dropped)),
        ] {
            t.push(check(
                format!("OTLP/{name} export spans/s (S6)"),
                "≥ 100,000, zero drops",
                run.0.per_sec,
                run.0.per_sec >= 100_000.0 && run.1 == 0,
            ));
        }
        self.targets = t;
    }

    /// The report as a plain-text table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        self.header_lines(&mut s);
        pipeline_table(&mut s, "S1–S3 (JetStream default sync)", &self.runs);
        if let Some(d) = &self.durable {
            pipeline_table(&mut s, "S1–S3 durable (JetStream sync_interval: always)", d);
        }
        self.s4_s5_lines(&mut s);
        self.s6_lines(&mut s);
        self.s7_s8_lines(&mut s);
        self.target_lines(&mut s);
        s
    }

    /// The machine and the settings of the run.
    fn header_lines(&self, s: &mut String) {
        let m = &self.machine;
        let _ = writeln!(
            s,
            "msgtrail bench ({}) — {} cores ({}), {:.1} GiB, nats-server {}, {} build, {:.0} s",
            self.settings.preset,
            m.cores,
            m.cpu,
            m.memory_bytes as f64 / (1u64 << 30) as f64,
            m.nats_server,
            if m.release_build { "release" } else { "debug" },
            self.total_seconds
        );
        let c = &self.settings;
        let span = match c.timed() {
            Some(t) => format!(
                "saturated runs: {:.1} s window after {:.1} s warm-up",
                t.window.as_secs_f64(),
                t.warmup.as_secs_f64()
            ),
            None => format!("saturated runs: {} messages", c.messages),
        };
        let _ = writeln!(
            s,
            "{span}, median of {} repetition(s) (interleaved; spread = (max − min) ÷ median); expected {:.0} s",
            c.reps, self.estimated_seconds
        );
        let _ = writeln!(
            s,
            "{} producers × {} in flight, {} consumers, fetch {}{}",
            c.producers,
            c.window,
            c.consumers,
            c.fetch_batch,
            if self.own_server {
                ""
            } else {
                " (external nats-server)"
            }
        );
    }

    /// S4 (listener ingest) and S5 (lookup), one line each.
    fn s4_s5_lines(&self, s: &mut String) {
        let s4 = &self.s4;
        let _ = writeln!(
            s,
            "\nS4 listener ingest (one thread), synthetic production mix: {:.0} records/s ({} records of {} messages, {} stage messages, {} transactions, {:.2} s), drops {}, repeated {}; S3's records replayed: {:.0} records/s; {:.0} B counted per in-flight message ({} messages); store {:.0} B/message ({:.0} B in use; {:.0} B in use at ten records per message); transactions p50 {:.0} ms, p99 {:.0} ms; arrival to queryable at {:.0} records/s offered: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
            s4.records.per_sec,
            s4.records.count,
            s4.messages,
            s4.stage_messages,
            s4.transactions,
            s4.records.seconds,
            s4.drops,
            s4.repeated_records,
            s4.recorded_records.per_sec,
            s4.counted_bytes_per_inflight_message,
            s4.inflight_messages,
            s4.store_bytes_per_message,
            s4.store_bytes_in_use_per_message,
            s4.store_bytes_in_use_per_ten_record_message,
            s4.transaction_ms.p50_ms,
            s4.transaction_ms.p99_ms,
            s4.queryable_offered_records_per_sec,
            s4.queryable_ms.p50_ms,
            s4.queryable_ms.p99_ms,
            s4.queryable_ms.max_ms,
        );
        let _ = writeln!(
            s,
            "S4 write amplification {:.2} ({:.1} MiB written to disk for {:.1} MiB of stage messages ingested); peak RSS {:.0} MiB ({})",
            s4.write_amplification,
            s4.disk_write_bytes as f64 / (1u64 << 20) as f64,
            s4.logical_bytes as f64 / (1u64 << 20) as f64,
            s4.peak_rss_bytes as f64 / (1u64 << 20) as f64,
            s4.peak_rss_method,
        );
        let p = &self.s4p;
        let _ = writeln!(
            s,
            "S4P two listeners at once (half the partitions each{}): {:.0} records/s against one listener's {:.0} = {:.2}× (median of {}, spread {:.2}–{:.2}; {} records of {} messages); fan-out in a group of two: lookup p50 {:.3} ms forwarded vs {:.3} ms local ({:.2}×), search p50 {:.3} ms merged vs {:.3} ms one store ({:.2}×)",
            if p.pinned { ", one core each" } else { ", not pinned to cores" },
            p.two_listeners_records_per_sec,
            p.one_listener_records_per_sec,
            p.scaling,
            p.reps,
            p.scaling_spread[0],
            p.scaling_spread[1],
            p.records,
            p.messages,
            p.fanout.lookup_forwarded_ms.p50_ms,
            p.fanout.lookup_local_ms.p50_ms,
            p.fanout.lookup_p50_ratio,
            p.fanout.search_merged_ms.p50_ms,
            p.fanout.search_local_ms.p50_ms,
            p.fanout.search_p50_ratio,
        );
        let s5 = &self.s5;
        let _ = writeln!(
            s,
            "S5 lookup with {} stored messages ({} records each; fill {:.0} records/s, store {:.1} MiB): p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms ({} lookups, {} found, {:.0}/s)",
            s5.stored_messages,
            s5.records_per_message,
            s5.fill.per_sec,
            s5.store_bytes as f64 / (1u64 << 20) as f64,
            s5.latency.p50_ms,
            s5.latency.p99_ms,
            s5.latency.max_ms,
            s5.lookups.count,
            s5.found,
            s5.lookups.per_sec,
        );
    }

    /// S6 (OTLP export over gRPC, over HTTP, and its latency at 80 % of the rate).
    fn s6_lines(&self, s: &mut String) {
        let s6 = &self.s6;
        let _ = writeln!(
            s,
            "S6 OTLP/gRPC export: {:.0} spans/s ({} spans, {} received in {} requests, {} dropped); mapping {:.0} spans/s; {:.1} spans per trajectory",
            s6.export.per_sec,
            s6.export.count,
            s6.received_spans,
            s6.requests,
            s6.dropped,
            s6.mapping.per_sec,
            s6.spans_per_trajectory,
        );
        let _ = writeln!(
            s,
            "S6 OTLP/HTTP (protobuf) export: {:.0} spans/s ({} spans, {} received in {} requests, {} dropped)",
            s6.http.export.per_sec,
            s6.http.export.count,
            s6.http.received_spans,
            s6.http.requests,
            s6.http.dropped,
        );
        let l = &s6.latency_at_80pct;
        let _ = writeln!(
            s,
            "S6 OTLP/gRPC at 80 % of that rate, offer to acknowledgement: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} chunks); offered {:.0} of {:.0} spans/s asked ({} waits for queue room)",
            l.p50_ms, l.p99_ms, l.max_ms, l.count,
            s6.paced.offered_per_sec, s6.paced.target_per_sec, s6.paced.backpressure_waits,
        );
    }

    /// S7 (search, overall and per kind) and S8 (observe mode's overhead).
    fn s7_s8_lines(&self, s: &mut String) {
        let s7 = &self.s7;
        let _ = writeln!(
            s,
            "S7 search with {} stored messages of the synthetic mix ({} records; fill {:.0} records/s, store {:.1} MiB; own store, not S5's), limit {}, time window {:.0} % of the stored span: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms ({} searches, {:.0}/s, {} results)",
            s7.stored_messages,
            s7.records,
            s7.fill.per_sec,
            s7.store_bytes as f64 / (1u64 << 20) as f64,
            s7.limit,
            s7.window_share * 100.0,
            s7.latency.p50_ms,
            s7.latency.p99_ms,
            s7.latency.max_ms,
            s7.latency.count,
            s7.searches.per_sec,
            s7.results,
        );
        for (name, k) in &s7.kinds {
            let _ = writeln!(
                s,
                "  S7 {name:<20} p50 {:>8.3} ms  p99 {:>8.3} ms  max {:>8.3} ms  results {:>6.1}/search ({} empty, {} full of {})  selects {:.2} % of the store (window aside, {} sampled)",
                k.p50_ms,
                k.p99_ms,
                k.max_ms,
                k.mean_results,
                k.empty,
                k.full,
                k.queries,
                k.selectivity * 100.0,
                s7.sample,
            );
        }
        let s8 = &self.s8;
        let (records, consumed) = s8
            .listener
            .first()
            .map_or((0.0, 0), |l| (l.records_per_message, l.consumed));
        let _ = writeln!(
            s,
            "S8 observe mode, raw JetStream app ({} B, S1's pipeline): alone {:.0} msgs/s (spread {}), observed by an in-process listener {:.0} msgs/s (spread {}); observed ÷ alone {:.3} (paired {:.3}–{:.3}); {:.2} records stored per message (median; first repetition {:.2}, {} messages consumed)",
            s8.payload_bytes,
            s8.raw.per_sec,
            pct(s8.raw_spread),
            s8.observed.per_sec,
            pct(s8.observed_spread),
            self.ratios.s8_observed_over_raw,
            s8.paired.min,
            s8.paired.max,
            s8.records_per_message,
            records,
            consumed,
        );
    }

    /// Every target, met or missed.
    fn target_lines(&self, s: &mut String) {
        let _ = writeln!(s, "\nTargets");
        for t in &self.targets {
            let _ = writeln!(
                s,
                "  {:<4} {:<52} {:>12.3}  (target {})",
                if t.met { "met" } else { "MISS" },
                t.name,
                t.value,
                t.target
            );
        }
    }
}

fn lat(l: &Latency) -> String {
    format!("{:.2}/{:.2}", l.p50_ms, l.p99_ms)
}

/// S1–S3 of every payload size: one row per scenario, then two lines of ratios.
fn pipeline_table(s: &mut String, title: &str, runs: &[PayloadRun]) {
    let _ = writeln!(s, "\n{title}");
    let _ = writeln!(
        s,
        "  {:<7} {:<26} {:>11} {:>8} {:>17} {:>17}",
        "payload", "scenario", "msgs/s", "spread", "e2e p50/p99 ms", "send p50/p99 ms"
    );
    for r in runs {
        scenario_rows(s, r);
        ratio_lines(s, r);
        cpu_lines(s, r);
    }
}

/// CPU per message of each saturated scenario's median repetition ([`crate::cpu`]): the bench
/// process (broker, SDK clients, listener, drivers) and nats-server.
fn cpu_lines(s: &mut String, r: &PayloadRun) {
    let b = format!("{} B", r.payload_bytes);
    let rows = [
        ("S1", r.s1.pipeline.cpu.as_ref()),
        ("S1F", r.s1f.as_ref().and_then(|f| f.cpu.as_ref())),
        ("S2", r.s2.throughput.cpu.as_ref()),
        ("S3", r.s3.throughput.cpu.as_ref()),
        ("S3L", r.s3l.throughput.cpu.as_ref()),
    ];
    let cells: Vec<String> = rows
        .iter()
        .filter_map(|(name, cpu)| {
            cpu.map(|c| {
                format!(
                    "{name} {:.1} ({:.1} bench + {:.1} nats-server; {:.2} cores)",
                    c.total_us_per_msg, c.bench_us_per_msg, c.nats_server_us_per_msg, c.cores_busy
                )
            })
        })
        .collect();
    if !cells.is_empty() {
        let _ = writeln!(s, "  {b:<7} CPU µs per message: {}", cells.join("  "));
    }
}

fn pct(spread: f64) -> String {
    format!("{:.1} %", spread * 100.0)
}

/// One row per scenario of a payload size: rate (median), spread, e2e and send latency.
fn scenario_rows(s: &mut String, r: &PayloadRun) {
    let b = format!("{} B", r.payload_bytes);
    let row = |s: &mut String, name: &str, rate: f64, spread: String, e2e: String, send: String| {
        let _ = writeln!(
            s,
            "  {b:<7} {name:<26} {rate:>11.0} {spread:>8} {e2e:>17} {send:>17}"
        );
    };
    row(
        s,
        "S1 raw publish (window)",
        r.s1.publish.per_sec,
        pct(r.s1.publish_spread),
        "-".into(),
        lat(&r.s1.publish_ack),
    );
    row(
        s,
        "S1 raw fetch + ack",
        r.s1.consume.per_sec,
        pct(r.s1.consume_spread),
        "-".into(),
        "-".into(),
    );
    row(
        s,
        "S1 raw both at once",
        r.s1.pipeline.per_sec,
        pct(r.s1.spread),
        lat(&r.s1.e2e),
        "-".into(),
    );
    if let Some(f) = &r.s1f {
        row(
            s,
            "S1F raw fast-ingest batches",
            f.per_sec,
            pct(r.s1f_spread),
            "-".into(),
            "-".into(),
        );
    }
    for (name, x) in [
        ("S2 msgtrail, recording off", &r.s2),
        ("S2 batch 1, recording off", &r.s2_batch1),
        ("S3 recording on", &r.s3),
        ("S3L + listener in window", &r.s3l),
    ] {
        row(
            s,
            name,
            x.throughput.per_sec,
            pct(x.spread),
            lat(&x.e2e),
            lat(&x.send_latency),
        );
    }
    for (name, x) in [
        ("S1 raw", &r.s1.paced),
        ("S2 recording off", &r.s2.paced),
        ("S3 recording on", &r.s3.paced),
    ] {
        let rate = x.rate_per_sec;
        let name = format!("{name} @ {rate:.0}/s");
        row(s, &name, rate, "-".into(), lat(&x.e2e), lat(&x.send));
    }
}

/// The ratios of a payload size's scenarios (the targets compare them).
fn ratio_lines(s: &mut String, r: &PayloadRun) {
    let b = format!("{} B", r.payload_bytes);
    let x = &r.ratios;
    let catch_up = r.s3.listener.as_ref().map_or(0.0, |l| l.catch_up_seconds);
    let catch_up_l = r.s3l.listener.as_ref().map_or(0.0, |l| l.catch_up_seconds);
    let _ = writeln!(
        s,
        "  {b:<7} ratios: S2/S1 {:.3} (S2/S1F {:.3}: S1F {:.0} msgs/s; batch 1: {:.3}, batching ×{:.2}; mean batch {:.1} uploads, {:.1} settles)  S3/S2 {:.3}  S3L/S2 {:.3}  e2e p50 at the fixed rate S2−S1 {:+.2} ms  listener ingest after the load {:.2} s (in window: caught up {:.2} s after)",
        x.s2_over_s1,
        x.s2_over_s1f,
        r.s1f.as_ref().map_or(0.0, |f| f.per_sec),
        x.s2_batch1_over_s1,
        x.batching_gain,
        r.s2.broker.uploads as f64 / r.s2.broker.upload_requests.max(1) as f64,
        r.s2.broker.acks as f64 / r.s2.broker.settle_requests.max(1) as f64,
        x.s3_over_s2,
        x.s3l_over_s2,
        x.e2e_p50_s2_minus_s1_ms,
        catch_up,
        catch_up_l,
    );
    let _ = writeln!(
        s,
        "  {b:<7} ratios: stage msgs/msg {:.3} ({:.1} records/msg, {} dropped)  e2e p99 at {:.0}/s S3/S2 {:.3}  S2/S1 {:.3} (saturated S3/S2 {:.3})",
        x.stage_messages_per_message,
        r.s3.stage_records_per_message,
        r.s3.broker.stage_dropped,
        r.s3.paced.rate_per_sec,
        x.e2e_p99_s3_over_s2,
        x.e2e_p99_s2_over_s1,
        x.e2e_p99_s3_over_s2_saturated,
    );
    if r.repetitions > 1 {
        let q = &r.paired;
        let range = |p: &PairedRatio| format!("{:.3}–{:.3}", p.min, p.max);
        let _ = writeln!(
            s,
            "  {b:<7} ratios over paired repetitions (min–max of {}): S2/S1 {}  S3/S2 {}  S3L/S2 {}  S2/S1F {}  batching ×{}",
            r.repetitions,
            range(&q.s2_over_s1),
            range(&q.s3_over_s2),
            range(&q.s3l_over_s2),
            range(&q.s2_over_s1f),
            range(&q.batching_gain),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipeline(rate: f64, p99: f64) -> PipelineResult {
        PipelineResult {
            throughput: Throughput {
                count: rate as u64,
                seconds: 1.0,
                per_sec: rate,
                cpu: None,
            },
            e2e: Latency {
                p99_ms: p99,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn rep(s1: f64, s2: f64, s3: f64) -> Repetition {
        Repetition {
            s1: RawResult {
                pipeline: Throughput {
                    per_sec: s1,
                    ..Default::default()
                },
                ..Default::default()
            },
            s2: pipeline(s2, s2),
            s3: pipeline(s3, s3),
            s3l: pipeline(s3, s3),
            s2_batch1: pipeline(s2 / 2.0, 1.0),
            s1f: Some(Throughput {
                per_sec: s1 * 2.0,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn repetitions_give_medians_spreads_and_paired_ratios() {
        let r = PayloadRun::from_reps(vec![
            rep(100.0, 40.0, 38.0),
            rep(120.0, 30.0, 30.0),
            rep(110.0, 50.0, 45.0),
        ]);
        assert_eq!(r.repetitions, 3);
        // Existing keys: medians.
        assert_eq!(r.s1.pipeline.per_sec, 110.0);
        assert_eq!(r.s2.throughput.per_sec, 40.0);
        assert_eq!(r.s3.throughput.per_sec, 38.0);
        // The other fields come from the median repetition.
        assert_eq!(r.s2.repetition, 0);
        assert_eq!(r.s2.e2e.p99_ms, 40.0);
        assert_eq!(r.s2.reps, vec![40.0, 30.0, 50.0]);
        assert!((r.s2.spread - 0.5).abs() < 1e-12);
        assert!((r.s1.spread - 20.0 / 110.0).abs() < 1e-12);
        assert_eq!(r.s1f.as_ref().unwrap().per_sec, 220.0);
        assert_eq!(r.s1f_reps, vec![200.0, 240.0, 220.0]);
        // Ratios of the medians, and over paired repetitions.
        assert!((r.ratios.s2_over_s1 - 40.0 / 110.0).abs() < 1e-12);
        assert_eq!(r.paired.s2_over_s1.reps, vec![0.4, 0.25, 50.0 / 110.0]);
        assert_eq!(r.paired.s2_over_s1.min, 0.25);
        assert_eq!(r.paired.s2_over_s1.max, 50.0 / 110.0);
        assert_eq!(r.paired.batching_gain.reps, vec![2.0, 2.0, 2.0]);
    }
}
