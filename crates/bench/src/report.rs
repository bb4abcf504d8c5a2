//! The report: every scenario's figures, the ratios side by side, the checks against the
//! project's targets (BENCHMARKS.md), as a table for people and as JSON for machines.

use crate::export::ExportResult;
use crate::ingest::IngestResult;
use crate::lookup::LookupResult;
use crate::measure::{Latency, Throughput};
use crate::pipeline::PipelineResult;
use crate::raw::RawResult;
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
    /// The ratios.
    pub ratios: Ratios,
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
            s1,
            s2,
            s3,
            s3l,
            s2_batch1,
            s1f,
            ratios,
        }
    }
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
    /// The project's targets (BENCHMARKS.md).
    pub targets: Vec<TargetCheck>,
    /// Wall-clock seconds of the whole run.
    pub total_seconds: f64,
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
        let _ = writeln!(
            s,
            "{} messages per run, {} producers × {} in flight, {} consumers, fetch {}{}",
            c.messages,
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
        "  {:<7} {:<26} {:>11} {:>17} {:>17}",
        "payload", "scenario", "msgs/s", "e2e p50/p99 ms", "send p50/p99 ms"
    );
    for r in runs {
        scenario_rows(s, r);
        ratio_lines(s, r);
    }
}

/// One row per scenario of a payload size: rate, e2e and send latency.
fn scenario_rows(s: &mut String, r: &PayloadRun) {
    let b = format!("{} B", r.payload_bytes);
    let row = |s: &mut String, name: &str, rate: f64, e2e: String, send: String| {
        let _ = writeln!(s, "  {b:<7} {name:<26} {rate:>11.0} {e2e:>17} {send:>17}");
    };
    row(
        s,
        "S1 raw publish (window)",
        r.s1.publish.per_sec,
        "-".into(),
        lat(&r.s1.publish_ack),
    );
    row(
        s,
        "S1 raw fetch + ack",
        r.s1.consume.per_sec,
        "-".into(),
        "-".into(),
    );
    row(
        s,
        "S1 raw both at once",
        r.s1.pipeline.per_sec,
        lat(&r.s1.e2e),
        "-".into(),
    );
    row(
        s,
        "S2 msgtrail, recording off",
        r.s2.throughput.per_sec,
        lat(&r.s2.e2e),
        lat(&r.s2.send_latency),
    );
    row(
        s,
        "S2 batch 1, recording off",
        r.s2_batch1.throughput.per_sec,
        lat(&r.s2_batch1.e2e),
        lat(&r.s2_batch1.send_latency),
    );
    row(
        s,
        "S3 recording on",
        r.s3.throughput.per_sec,
        lat(&r.s3.e2e),
        lat(&r.s3.send_latency),
    );
    row(
        s,
        "S3L + listener in window",
        r.s3l.throughput.per_sec,
        lat(&r.s3l.e2e),
        lat(&r.s3l.send_latency),
    );
    for (name, x) in [
        ("S1 raw", &r.s1.paced),
        ("S2 recording off", &r.s2.paced),
        ("S3 recording on", &r.s3.paced),
    ] {
        let rate = x.rate_per_sec;
        let name = format!("{name} @ {rate:.0}/s");
        row(s, &name, rate, lat(&x.e2e), lat(&x.send));
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
}
