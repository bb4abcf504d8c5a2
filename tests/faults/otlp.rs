//! Scenario 8: the listener exports to an OTLP endpoint that hangs (a black hole that accepts
//! TCP connections and never answers) or refuses (a closed port). Export must cost the
//! message path and the listener's ingest nothing, say what happened in its counters, and
//! keep its queue bounded; the listener's API must keep answering.

use crate::harness::*;
use crate::{blocking, oracle, TRAJECTORY_WAIT};
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bound of the listener's export queue in the scenario (`MSGTRAIL_OTEL_QUEUE_SPANS`): small,
/// so that a short run overflows it (300 consumed messages are well over 1000 spans).
const QUEUE_SPANS: u64 = 500;
/// The exporter's per-call timeout (`OTEL_EXPORTER_OTLP_TIMEOUT`, ms): a black-holed export
/// call ends after it.
const EXPORT_TIMEOUT_MS: u64 = 2000;
/// How long one probe of the listener's API may take before it counts as unanswered.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The endpoint the listener exports to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// Accepts TCP connections, reads nothing, answers nothing, closes nothing.
    BlackHole,
    /// A port nothing listens on: every connection is refused.
    Refused,
}

impl Endpoint {
    fn describe(self) -> &'static str {
        match self {
            Endpoint::BlackHole => {
                "the listener's OTLP endpoint accepts TCP connections and never answers"
            }
            Endpoint::Refused => "the listener's OTLP endpoint refuses connections (closed port)",
        }
    }
}

/// A TCP server that accepts every connection and then does nothing with it (the sockets are
/// kept open until it is dropped).
struct BlackHole {
    port: u16,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl BlackHole {
    async fn start() -> BlackHole {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the black hole");
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                held.push(socket);
            }
        });
        BlackHole {
            port,
            accepted,
            task,
        }
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The listener's OTLP counters, read from its `/metrics`.
#[derive(Debug, Clone, Copy, Default)]
struct ExportCounters {
    exported: u64,
    failures: u64,
    dropped_queue_full: u64,
    dropped_retries: u64,
    queued: u64,
    /// Spans accepted and not yet exported or dropped (queued, batching, in requests).
    in_flight: u64,
    /// Trajectories not handed to the export task (its channel full).
    trajectories_dropped: u64,
}

impl ExportCounters {
    fn parse(text: &str) -> Option<ExportCounters> {
        let get = |name: &str| -> Option<u64> {
            text.lines()
                .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.trim().parse::<f64>().ok())
                .map(|v| v as u64)
        };
        Some(ExportCounters {
            exported: get("msgtrail_otel_spans_exported_total")?,
            failures: get("msgtrail_otel_export_failures_total")?,
            dropped_queue_full: get("msgtrail_otel_spans_dropped_total{reason=\"queue_full\"}")?,
            dropped_retries: get("msgtrail_otel_spans_dropped_total{reason=\"retries\"}")?,
            queued: get("msgtrail_otel_queue_spans")?,
            in_flight: get("msgtrail_otel_in_flight_spans")?,
            trajectories_dropped: get("msgtrail_listener_export_dropped_total").unwrap_or(0),
        })
    }

    fn json(&self) -> serde_json::Value {
        json!({"exported": self.exported, "export_failures": self.failures,
               "dropped_queue_full": self.dropped_queue_full,
               "dropped_retries": self.dropped_retries, "queued": self.queued,
               "in_flight": self.in_flight,
               "trajectories_dropped": self.trajectories_dropped})
    }
}

/// What the probe of the listener's API saw.
#[derive(Debug, Default)]
struct Probes {
    answered: AtomicUsize,
    unanswered: AtomicUsize,
    /// Latencies of the answered probes, ms.
    latencies: Mutex<Vec<f64>>,
    /// Export counters, one reading per probe.
    counters: Mutex<Vec<ExportCounters>>,
    stop: AtomicBool,
}

/// Probes the listener every 100 ms: `GET /api/stats` (must answer 200 within
/// [`PROBE_TIMEOUT`]) and `GET /metrics` (the export counters), until stopped.
fn probe(sys: &System) -> (Arc<Probes>, tokio::task::JoinHandle<()>) {
    let client = sys.listener_client();
    let probes = Arc::new(Probes::default());
    let p = probes.clone();
    let task = tokio::spawn(async move {
        while !p.stop.load(Ordering::SeqCst) {
            let start = Instant::now();
            match tokio::time::timeout(PROBE_TIMEOUT, client.get_raw("/api/stats")).await {
                Ok(Ok((200, _))) => {
                    p.answered.fetch_add(1, Ordering::SeqCst);
                    p.latencies
                        .lock()
                        .unwrap()
                        .push(start.elapsed().as_secs_f64() * 1000.0);
                }
                _ => {
                    p.unanswered.fetch_add(1, Ordering::SeqCst);
                }
            }
            if let Ok(Ok((200, body))) =
                tokio::time::timeout(PROBE_TIMEOUT, client.get_raw("/metrics")).await
            {
                if let Some(c) = ExportCounters::parse(&String::from_utf8_lossy(&body)) {
                    p.counters.lock().unwrap().push(c);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    (probes, task)
}

/// Resident memory of a process, KiB (`VmRSS` of `/proc/<pid>/status`).
fn rss_kib(pid: Option<u32>) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid?)).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// Runs the standard load with the listener exporting to `endpoint`; checks the oracle, the
/// API's answers, the export counters and the queue bound.
pub(crate) async fn otlp_endpoint_down(scenario: &str, endpoint: Endpoint) {
    let scale = Scale::pick(300, 2000);
    for rep in 1..=scale.reps {
        let hole = match endpoint {
            Endpoint::BlackHole => Some(BlackHole::start().await),
            Endpoint::Refused => None,
        };
        let port = match &hole {
            Some(h) => h.port,
            None => msgtrail_test_support::free_port(),
        };
        let env = |k: &str, v: String| (k.to_owned(), v);
        let mut sys = System::start(SystemOptions {
            brokers: 1,
            listener_env: vec![
                env(
                    "OTEL_EXPORTER_OTLP_ENDPOINT",
                    format!("http://127.0.0.1:{port}"),
                ),
                env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".into()),
                env("OTEL_EXPORTER_OTLP_TIMEOUT", EXPORT_TIMEOUT_MS.to_string()),
                env("MSGTRAIL_OTEL_QUEUE_SPANS", QUEUE_SPANS.to_string()),
                env("MSGTRAIL_OTEL_GRACE_MS", "100".into()),
            ],
            ..Default::default()
        })
        .await;
        let pid = sys.listener.as_ref().and_then(|l| l.pid());
        let rss_start = rss_kib(pid);
        let (probes, probe_task) = probe(&sys);
        let run = run_load(&sys, Load::new(scale.messages)).await;
        let finished = run.finish().await;
        let mut r = oracle(&sys, scenario, &scale, rep, &finished, TRAJECTORY_WAIT).await;
        // A few more seconds of the endpoint down: failed calls keep coming, the queue stays
        // bounded.
        tokio::time::sleep(Duration::from_millis(EXPORT_TIMEOUT_MS * 2)).await;
        probes.stop.store(true, Ordering::SeqCst);
        probe_task.await.expect("probe task");
        let rss_end = rss_kib(pid);
        let counters = probes.counters.lock().unwrap().clone();
        let last = counters.last().copied().unwrap_or_default();
        let max_queued = counters.iter().map(|c| c.queued).max().unwrap_or(0);
        let lat = probes.latencies.lock().unwrap().clone();
        let running = sys.listener.as_mut().is_some_and(|l| l.is_running());
        r.set("fault", json!(endpoint.describe()))
            .set(
                "otlp",
                json!({"protocol": "http/protobuf", "timeout_ms": EXPORT_TIMEOUT_MS,
                       "queue_spans": QUEUE_SPANS}),
            )
            .set("export", last.json())
            .set("export_max_queued", json!(max_queued))
            .set(
                "black_hole_connections",
                json!(hole.as_ref().map(|h| h.accepted.load(Ordering::SeqCst))),
            )
            .set(
                "api_probes",
                json!({"answered": probes.answered.load(Ordering::SeqCst),
                       "unanswered": probes.unanswered.load(Ordering::SeqCst),
                       "p50_ms": percentile(&lat, 50.0), "p99_ms": percentile(&lat, 99.0),
                       "max_ms": percentile(&lat, 100.0)}),
            )
            .set(
                "listener_rss_kib",
                json!({"start": rss_start, "end": rss_end}),
            )
            .set("listener_running", json!(running));
        r.print();
        r.assert_sound(true, &sys);
        assert!(running, "the listener died: {}", sys.diagnostics());
        assert_eq!(
            probes.unanswered.load(Ordering::SeqCst),
            0,
            "the listener's API did not answer within {PROBE_TIMEOUT:?}: {:?}",
            r.json
        );
        assert!(
            probes.answered.load(Ordering::SeqCst) > 0,
            "no probe answered"
        );
        assert!(!counters.is_empty(), "no export counters in /metrics");
        assert_eq!(last.exported, 0, "spans exported to a dead endpoint");
        assert!(
            last.failures > 0,
            "no failed export call counted: {:?}",
            r.json
        );
        assert!(
            last.dropped_queue_full > 0,
            "more spans than the queue holds, and none counted as dropped: {:?}",
            r.json
        );
        assert!(
            max_queued <= QUEUE_SPANS,
            "the export queue grew past its bound: {:?}",
            r.json
        );
        // Everything held (queued, being batched, in requests) stays under twice the queue's
        // bound: the exporter caps its batches at queue / (requests in flight + 1).
        let max_held = counters.iter().map(|c| c.in_flight).max().unwrap_or(0);
        assert!(
            max_held <= 2 * QUEUE_SPANS,
            "the exporter held {max_held} spans, past twice its queue's bound: {:?}",
            r.json
        );
        if let Some(h) = &hole {
            assert!(
                h.accepted.load(Ordering::SeqCst) > 0,
                "the exporter never reached the black hole"
            );
        }
        drop(blocking(|| sys.listener.as_mut().map(|l| l.kill9())));
    }
}
