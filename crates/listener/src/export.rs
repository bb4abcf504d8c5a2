//! Trace export: trajectories that changed go, through a bounded channel, to one task that
//! owns the OTLP pipeline of `msgtrail-otel`. Ingest never waits for it: when the channel is
//! full the trajectory is counted as dropped (the pipeline would see it again on its next
//! change or watchdog tick).
//!
//! The pipeline exports an ok hop only after a grace for stragglers, so trajectories with a
//! hop still inside its grace are kept (bounded) and looked at again on every tick.

use msgtrail_core::time::now_nanos;
use msgtrail_core::trajectory::{HopStatus, Trajectory};
use msgtrail_otel::{PipelineConfig, TracePipeline};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Trajectories waiting for the export task.
const CHANNEL: usize = 4096;
/// Trajectories kept for a later look (a hop inside its grace).
const MAX_PENDING: usize = 100_000;
/// How often pending trajectories are looked at again.
const TICK: Duration = Duration::from_millis(250);
/// How long the exporter may take to drain at shutdown.
const DRAIN: Duration = Duration::from_secs(5);

/// The ingest side: hands trajectories to the export task without waiting.
#[derive(Debug, Clone)]
pub struct ExportSender {
    tx: mpsc::Sender<Trajectory>,
    dropped: Arc<AtomicU64>,
    exporter: msgtrail_otel::ExportHandle,
}

impl ExportSender {
    /// Offers trajectories; those that do not fit are counted as dropped.
    pub fn offer(&self, ts: Vec<Trajectory>) {
        for t in ts {
            if self.tx.try_send(t).is_err() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Trajectories dropped because the export task was behind.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The exporter's counters in Prometheus text.
    pub fn prometheus(&self) -> String {
        let mut s = self.exporter.snapshot().render_prometheus();
        s.push_str(&format!(
            "# HELP msgtrail_listener_export_dropped_total Trajectories not handed to the exporter because its queue was full.\n# TYPE msgtrail_listener_export_dropped_total counter\nmsgtrail_listener_export_dropped_total {}\n",
            self.dropped()
        ));
        s
    }
}

fn has_future_due(t: &Trajectory, now: u64, grace: u64) -> bool {
    t.hops
        .iter()
        .any(|h| h.status == HopStatus::Ok && h.end.is_some_and(|e| e.saturating_add(grace) > now))
}

/// Starts the pipeline (within the runtime) and returns the sender and the task.
pub fn spawn(
    config: PipelineConfig,
    mut stop: watch::Receiver<bool>,
) -> Result<
    (
        ExportSender,
        impl std::future::Future<Output = Result<(), crate::ListenerError>>,
    ),
    msgtrail_otel::ConfigError,
> {
    let grace = config.grace.as_nanos() as u64;
    let mut pipeline = TracePipeline::start(config)?;
    let (tx, mut rx) = mpsc::channel::<Trajectory>(CHANNEL);
    let sender = ExportSender {
        tx,
        dropped: Arc::new(AtomicU64::new(0)),
        exporter: pipeline.handle().clone(),
    };
    let task = async move {
        // Keyed by trace ID, oldest first for eviction.
        let mut pending: BTreeMap<String, Trajectory> = BTreeMap::new();
        let mut order: VecDeque<String> = VecDeque::new();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = crate::stopped(&mut stop) => break,
                t = rx.recv() => {
                    let Some(t) = t else { break };
                    let now = now_nanos();
                    pipeline.observe(&t, now);
                    if let Some(id) = t.trace_id.clone() {
                        if has_future_due(&t, now, grace) {
                            if !pending.contains_key(&id) {
                                order.push_back(id.clone());
                            }
                            pending.insert(id, t);
                            while pending.len() > MAX_PENDING {
                                match order.pop_front() {
                                    Some(old) => { pending.remove(&old); }
                                    None => break,
                                }
                            }
                        } else {
                            pending.remove(&id);
                        }
                    }
                }
                _ = tick.tick() => {
                    let now = now_nanos();
                    pending.retain(|_, t| {
                        pipeline.observe(t, now);
                        has_future_due(t, now, grace)
                    });
                    order.retain(|k| pending.contains_key(k));
                }
            }
        }
        // Whatever is still inside its grace goes now rather than never.
        let far = now_nanos().saturating_add(grace);
        for t in pending.values() {
            pipeline.observe(t, far);
        }
        let stats = pipeline.shutdown(DRAIN).await;
        tracing::info!(
            exported = stats.exported,
            dropped = stats.dropped(),
            "trace export stopped"
        );
        Ok(())
    };
    Ok((sender, task))
}
