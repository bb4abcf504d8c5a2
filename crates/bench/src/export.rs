//! S6: OTLP export. Trajectories (copies of one recorded in S3, under other IDs) are mapped
//! to spans by `msgtrail-otel` and pushed through its [`TraceExporter`] — the bounded queue,
//! batching and requests in flight the listener uses, with its default batch and concurrency
//! — to the OTLP receiver of `msgtrail-devkit` on loopback, which counts what arrives:
//! once over OTLP/gRPC, once over OTLP/HTTP (protobuf). Then, over gRPC, spans are offered
//! at 80 % of the rate just measured, in small chunks, and each chunk's time from being
//! handed to the exporter to being acknowledged by the receiver is recorded: the exporter's
//! share of the time from a trajectory's last stage to its spans in the backend.

use crate::error::BenchError;
use crate::ingest::relabel;
use crate::measure::{Latency, Progress, Recorder, Throughput};
use msgtrail_core::trajectory::{AssembleOptions, Trajectory};
use msgtrail_core::StageRecord;
use msgtrail_devkit::{OtlpProtocol, OtlpReceiver};
use msgtrail_otel::{
    trajectory_spans, ExportConfig, MappingOptions, Protocol, ServiceSpan, TraceExporter,
};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Distinct trajectories the spans come from (cycled to the span count).
const TRAJECTORIES: u64 = 1_000;
/// Spans handed to the exporter at once.
const CHUNK: usize = 512;

/// What S6 measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExportResult {
    /// Spans per trajectory.
    pub spans_per_trajectory: f64,
    /// Mapping trajectories to spans, spans per second (one thread, no I/O).
    pub mapping: Throughput,
    /// OTLP/gRPC: spans the receiver accepted, per second, from the first enqueue to the
    /// last ack.
    pub export: Throughput,
    /// OTLP/gRPC: spans the receiver counted.
    pub received_spans: u64,
    /// OTLP/gRPC: export requests the receiver got.
    pub requests: u64,
    /// OTLP/gRPC: spans dropped by the exporter (queue full, retries, shutdown).
    pub dropped: u64,
    /// The same over OTLP/HTTP with protobuf bodies.
    #[serde(default)]
    pub http: ProtocolRun,
    /// OTLP/gRPC at 80 % of the measured rate: per chunk of spans, the time from being
    /// handed to the exporter to the receiver's acknowledgement.
    #[serde(default)]
    pub latency_at_80pct: Latency,
    /// The paced run's offer: the rate asked for and the rate the exporter took.
    #[serde(default)]
    pub paced: PacedOffer,
}

/// What the paced run offered. The offer waits while the exporter's queue is within a
/// chunk of its bound (as a producer that respects back-pressure does), so an exporter
/// that cannot keep up with the asked rate shows here as a lower `offered_per_sec` and a
/// longer latency — not as dropped spans.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PacedOffer {
    /// Spans per second asked for: 80 % of the gRPC run's rate.
    pub target_per_sec: f64,
    /// Spans per second actually handed to the exporter, first offer to last.
    pub offered_per_sec: f64,
    /// Spans offered.
    pub spans: u64,
    /// Times the offer waited for room in the queue.
    pub backpressure_waits: u64,
}

/// One protocol's run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProtocolRun {
    /// Spans the receiver accepted, per second, from the first enqueue to the last ack.
    pub export: Throughput,
    /// Spans the receiver counted.
    pub received_spans: u64,
    /// Export requests the receiver got.
    pub requests: u64,
    /// Spans dropped by the exporter.
    pub dropped: u64,
}

/// Runs S6.
pub(crate) async fn run(
    template: &[StageRecord],
    spans: u64,
    timeout: Duration,
    progress: &Progress,
) -> Result<ExportResult, BenchError> {
    let opts = AssembleOptions::default();
    let mapping = MappingOptions::default();
    let trajectories: Vec<Trajectory> = (1..=TRAJECTORIES)
        .filter_map(|k| {
            let recs = template.iter().cloned().map(|mut r| {
                relabel(&mut r, k);
                r
            });
            Trajectory::assemble(recs, &opts)
        })
        .collect();
    let start = Instant::now();
    let mapped: Vec<_> = trajectories
        .iter()
        .flat_map(|t| trajectory_spans(t, &mapping))
        .collect();
    let mapping_tp = Throughput::new(mapped.len() as u64, start.elapsed());
    if mapped.is_empty() {
        return Err(BenchError::Config(
            "S6: the template maps to no span".into(),
        ));
    }
    let per = mapped.len() as f64 / trajectories.len().max(1) as f64;
    let all: Vec<_> = mapped
        .iter()
        .cycle()
        .take(spans as usize)
        .cloned()
        .collect();
    let grpc = run_protocol(Protocol::Grpc, &all, timeout, progress).await?;
    let http = run_protocol(Protocol::HttpProtobuf, &all, timeout, progress).await?;
    let rate = grpc.export.per_sec * 0.8;
    let (latency_at_80pct, paced) = paced_latency(&all, rate, timeout).await?;
    Ok(ExportResult {
        spans_per_trajectory: per,
        mapping: mapping_tp,
        export: grpc.export,
        received_spans: grpc.received_spans,
        requests: grpc.requests,
        dropped: grpc.dropped,
        http,
        latency_at_80pct,
        paced,
    })
}

/// Spans per chunk offered in the paced run.
const PACED_CHUNK: usize = 64;

/// Offers `all` over gRPC at `rate` spans per second (at most 5 s of them), in chunks of
/// [`PACED_CHUNK`], and records each chunk's time from offer to acknowledgement: a chunk is
/// acknowledged when the exporter's exported count covers it (requests may complete out of
/// order, so this is an upper bound per chunk). The offer respects the queue's bound (see
/// [`PacedOffer`]); a span dropped all the same (by retries running out) fails the run.
async fn paced_latency(
    all: &[ServiceSpan],
    rate: f64,
    timeout: Duration,
) -> Result<(Latency, PacedOffer), BenchError> {
    let receiver = OtlpReceiver::start_grpc()
        .await
        .map_err(|e| BenchError::Otlp(e.into()))?;
    let config = ExportConfig {
        protocol: Protocol::Grpc,
        endpoint: Some(receiver.endpoint()),
        timeout: Some(Duration::from_secs(10)),
        ..Default::default()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let counter = count_received(
        receiver,
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        stop.clone(),
    );
    let capacity = config.queue_capacity as u64;
    let exporter = TraceExporter::start(config).map_err(|e| BenchError::Otlp(e.into()))?;
    let spans = ((rate.max(1.0) * 5.0) as usize).min(all.len());
    let mut waits = 0u64;
    let interval = Duration::from_secs_f64(PACED_CHUNK as f64 / rate.max(1.0));
    let mut offered: Vec<(u64, Instant)> = Vec::new();
    let mut recorder = Recorder::default();
    let (mut next, mut cumulative) = (0usize, 0u64);
    let start = Instant::now();
    let deadline = start + timeout;
    let mut record = |offered: &[(u64, Instant)], next: &mut usize, exported: u64| {
        while *next < offered.len() && offered[*next].0 <= exported {
            recorder.record(offered[*next].1.elapsed());
            *next += 1;
        }
    };
    for (i, chunk) in all[..spans].chunks(PACED_CHUNK).enumerate() {
        let due = start + interval * i as u32;
        while Instant::now() < due {
            record(&offered, &mut next, exporter.snapshot().exported);
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        // The chunk's time starts when it is offered, so a wait for room counts in it.
        let offered_at = Instant::now();
        while exporter.snapshot().queued + chunk.len() as u64 > capacity {
            waits += 1;
            record(&offered, &mut next, exporter.snapshot().exported);
            if Instant::now() > deadline {
                return Err(paced_late(
                    timeout,
                    exporter.snapshot().exported,
                    cumulative,
                ));
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        exporter.try_export(chunk.iter().cloned());
        cumulative += chunk.len() as u64;
        offered.push((cumulative, offered_at));
    }
    let offer_elapsed = start.elapsed();
    while next < offered.len() {
        let s = exporter.snapshot();
        record(&offered, &mut next, s.exported);
        if s.dropped() > 0 {
            return Err(BenchError::Config(format!(
                "S6 paced export: the exporter dropped {} of {cumulative} spans (queue full {}, retries {}, rejected {}, shutdown {})",
                s.dropped(),
                s.dropped_queue_full,
                s.dropped_retries,
                s.rejected,
                s.dropped_shutdown,
            )));
        }
        if Instant::now() > deadline {
            return Err(paced_late(timeout, s.exported, cumulative));
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    exporter.shutdown(Duration::from_secs(5)).await;
    stop.store(true, Ordering::Relaxed);
    let _ = counter.await;
    let offer = PacedOffer {
        target_per_sec: rate,
        offered_per_sec: cumulative as f64 / offer_elapsed.as_secs_f64().max(1e-9),
        spans: cumulative,
        backpressure_waits: waits,
    };
    Ok((recorder.summary(), offer))
}

/// The paced run did not finish in time.
fn paced_late(timeout: Duration, done: u64, total: u64) -> BenchError {
    BenchError::Timeout {
        scenario: "S6 paced export".into(),
        secs: timeout.as_secs(),
        done,
        total,
    }
}

/// Counts the spans and requests a receiver gets until `stop`.
fn count_received(
    mut receiver: OtlpReceiver,
    received: Arc<AtomicU64>,
    requests: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            if let Some(req) = receiver.next_request(Duration::from_millis(100)).await {
                let n: usize = req
                    .resource_spans
                    .iter()
                    .flat_map(|r| &r.scope_spans)
                    .map(|s| s.spans.len())
                    .sum();
                received.fetch_add(n as u64, Ordering::Relaxed);
                requests.fetch_add(1, Ordering::Relaxed);
            }
        }
        receiver.stop().await;
    })
}

/// Exports `all` over one protocol and measures it.
async fn run_protocol(
    protocol: Protocol,
    all: &[ServiceSpan],
    timeout: Duration,
    progress: &Progress,
) -> Result<ProtocolRun, BenchError> {
    let spans = all.len() as u64;
    let receiver = match protocol {
        Protocol::Grpc => OtlpReceiver::start_grpc().await,
        _ => OtlpReceiver::start(OtlpProtocol::HttpProtobuf, None).await,
    }
    .map_err(|e| BenchError::Otlp(e.into()))?;
    let config = ExportConfig {
        protocol,
        endpoint: Some(receiver.endpoint()),
        timeout: Some(Duration::from_secs(10)),
        batch_delay: Duration::from_millis(5),
        ..Default::default()
    };
    let capacity = config.queue_capacity as u64;
    let received = Arc::new(AtomicU64::new(0));
    let requests = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let counter = count_received(receiver, received.clone(), requests.clone(), stop.clone());
    let exporter = TraceExporter::start(config).map_err(|e| BenchError::Otlp(e.into()))?;
    let name = format!("S6 OTLP export over {} (spans)", protocol.as_str());
    let phase = progress.phase(&name, spans);
    let deadline = Instant::now() + timeout;
    let start = Instant::now();
    let late = |done: u64| BenchError::Timeout {
        scenario: "S6 export".into(),
        secs: timeout.as_secs(),
        done,
        total: spans,
    };
    for chunk in all.chunks(CHUNK) {
        // Stay under the queue bound: a benchmark of the exporter, not of its drop counter.
        while exporter.snapshot().queued + CHUNK as u64 > capacity {
            if Instant::now() > deadline {
                return Err(late(exporter.snapshot().exported));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        exporter.try_export(chunk.iter().cloned());
        phase
            .counter()
            .store(exporter.snapshot().exported, Ordering::Relaxed);
    }
    loop {
        let s = exporter.snapshot();
        phase.counter().store(s.exported, Ordering::Relaxed);
        if s.exported + s.dropped() >= spans {
            break;
        }
        if Instant::now() > deadline {
            return Err(late(s.exported));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = start.elapsed();
    drop(phase);
    let snap = exporter.shutdown(Duration::from_secs(5)).await;
    // Let the receiver count the last requests.
    let wait_until = Instant::now() + Duration::from_secs(5);
    while received.load(Ordering::Relaxed) < snap.exported && Instant::now() < wait_until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let _ = counter.await;
    Ok(ProtocolRun {
        export: Throughput::new(snap.exported, elapsed),
        received_spans: received.load(Ordering::Relaxed),
        requests: requests.load(Ordering::Relaxed),
        dropped: snap.dropped(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{stage_messages, Mix};

    /// Spans of synthetic trajectories, at least `n` of them.
    fn spans(n: usize) -> Vec<ServiceSpan> {
        let recorded = stage_messages(&Mix::plain(64), 1_700_000_000_000_000_000);
        let template = crate::lookup::template(&recorded).expect("a template trajectory");
        let t = Trajectory::assemble(template, &AssembleOptions::default()).expect("assembles");
        let one = trajectory_spans(&t, &MappingOptions::default());
        assert!(!one.is_empty());
        one.iter().cycle().take(n).cloned().collect()
    }

    /// An offer far faster than any exporter waits for room in the queue instead of
    /// dropping spans (three queues' worth, so the bound is reached), and says so.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_paced_offer_faster_than_the_exporter_waits_instead_of_dropping() {
        let capacity = ExportConfig::default().queue_capacity;
        let all = spans(3 * capacity);
        let (latency, offer) = paced_latency(&all, 1e9, Duration::from_secs(120))
            .await
            .expect("the paced run finishes without drops");
        assert_eq!(offer.spans, all.len() as u64);
        assert_eq!(latency.count as usize, all.len().div_ceil(PACED_CHUNK));
        assert!(offer.backpressure_waits > 0, "{offer:?}");
        assert!(offer.offered_per_sec < offer.target_per_sec, "{offer:?}");
    }
}
