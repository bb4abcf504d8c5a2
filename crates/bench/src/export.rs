//! S6: OTLP export. Trajectories (copies of one recorded in S3, under other IDs) are mapped
//! to spans by `msgtrail-otel` and pushed through its [`TraceExporter`] — the bounded queue
//! and OTLP/gRPC exporter the listener uses — to the OTLP receiver of
//! `msgtrail-test-support` on loopback, which counts what arrives.

use crate::error::BenchError;
use crate::ingest::relabel;
use crate::measure::{Progress, Throughput};
use msgtrail_core::trajectory::{AssembleOptions, Trajectory};
use msgtrail_core::StageRecord;
use msgtrail_otel::{trajectory_spans, ExportConfig, MappingOptions, Protocol, TraceExporter};
use msgtrail_test_support::OtlpReceiver;
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
    /// Spans the receiver accepted, per second, from the first enqueue to the last ack.
    pub export: Throughput,
    /// Spans the receiver counted.
    pub received_spans: u64,
    /// Export requests the receiver got.
    pub requests: u64,
    /// Spans dropped by the exporter (queue full, retries, shutdown).
    pub dropped: u64,
}

/// Runs S6.
pub async fn run(
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

    let mut receiver = OtlpReceiver::start_grpc()
        .await
        .map_err(|e| BenchError::Otlp(e.to_string()))?;
    let config = ExportConfig {
        protocol: Protocol::Grpc,
        endpoint: Some(receiver.endpoint()),
        timeout: Some(Duration::from_secs(10)),
        queue_capacity: 20_000,
        max_batch: CHUNK,
        batch_delay: Duration::from_millis(5),
        ..Default::default()
    };
    let capacity = config.queue_capacity as u64;
    let received = Arc::new(AtomicU64::new(0));
    let requests = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let counter = tokio::spawn({
        let (received, requests, stop) = (received.clone(), requests.clone(), stop.clone());
        async move {
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
        }
    });
    let exporter = TraceExporter::start(config).map_err(|e| BenchError::Otlp(e.to_string()))?;
    let phase = progress.phase("S6 OTLP export (spans)", spans);
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
        while exporter.snapshot().in_flight + CHUNK as u64 > capacity {
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
    Ok(ExportResult {
        spans_per_trajectory: per,
        mapping: mapping_tp,
        export: Throughput::new(snap.exported, elapsed),
        received_spans: received.load(Ordering::Relaxed),
        requests: requests.load(Ordering::Relaxed),
        dropped: snap.dropped(),
    })
}
