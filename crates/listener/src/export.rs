//! Trace export: trajectories that changed go, through a bounded channel, to one task that
//! feeds the OTLP pipeline of `msgtrail-otel` ([`TracePipeline`]). Ingest never waits for
//! it: when the channel is full the trajectory is counted as dropped (the pipeline would see
//! it again on its next change or watchdog tick).
//!
//! A source whose trajectories are not ready yet can hold them back
//! ([`ExportSender::hold_back`], observe mode until an observed message's stored copy is
//! in): a held trajectory is not offered, and is offered again with its next change.
//!
//! In a listener group a gate ([`ExportSender::gate`], `cluster::export_marks`) admits only
//! the trajectories of the partitions this member is the primary of, and the hops another
//! member exported already are handed to the pipeline as done.
//!
//! Everything else is the pipeline's: the grace for stragglers, the trajectories kept until
//! their hops are due (looked at again by [`TracePipeline::tick`], called here on a timer),
//! sampling, and the exporter's queue. This task only calls `observe`, `tick` and, at the
//! end, `shutdown`.

use msgtrail_core::time::now_nanos;
use msgtrail_core::trajectory::Trajectory;
use msgtrail_otel::{PipelineConfig, TracePipeline};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Trajectories waiting for the export task.
const CHANNEL: usize = 4096;
/// How often the pipeline looks again at the trajectories it keeps for their grace.
const TICK: Duration = Duration::from_millis(250);
/// How long the exporter may take to drain at shutdown.
const DRAIN: Duration = Duration::from_secs(5);

/// Says whether a trajectory is held back from the export for now.
pub(crate) type Hold = Box<dyn Fn(&Trajectory) -> bool + Send + Sync>;

/// Completes a trajectory from what the listener knows beside its records, before it is
/// exported or served (observe mode's unsampled consumers).
pub(crate) type Amend = Arc<dyn Fn(&mut Trajectory) + Send + Sync>;

/// The completion every clone of a sender shares, set once.
#[derive(Clone, Default)]
struct SharedAmend(Arc<OnceLock<Amend>>);

impl std::fmt::Debug for SharedAmend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "SharedAmend(set)"
        } else {
            "SharedAmend(none)"
        })
    }
}

/// The hold every clone of a sender shares, set once.
#[derive(Clone, Default)]
struct SharedHold(Arc<OnceLock<Hold>>);

impl std::fmt::Debug for SharedHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "SharedHold(set)"
        } else {
            "SharedHold(none)"
        })
    }
}

/// A listener group's gate, set once for every clone of a sender
/// ([`crate::cluster::export_marks`]): which trajectories this member exports, and which of
/// their hops another member exported already.
type SharedGate = Arc<OnceLock<Arc<crate::cluster::export_marks::ExportGate>>>;

/// The ingest side: hands trajectories to the export task without waiting.
#[derive(Debug, Clone)]
pub(crate) struct ExportSender {
    tx: mpsc::Sender<Trajectory>,
    dropped: Arc<AtomicU64>,
    exporter: msgtrail_otel::ExportHandle,
    hold: SharedHold,
    amend: SharedAmend,
    gate: SharedGate,
}

impl ExportSender {
    /// Exports, from now on, only what a group member's `gate` admits, and has the
    /// exporter's accepted hops marked through it; a second gate is ignored.
    pub(crate) fn gate(&self, gate: Arc<crate::cluster::export_marks::ExportGate>) {
        let hook = gate.hook();
        if self.gate.set(gate).is_ok() {
            self.exporter.on_exported(hook);
        }
    }

    /// Holds back, from now on and for every clone of this sender, the trajectories `hold`
    /// says are not ready; `false` when a hold was set already (it is kept).
    pub(crate) fn hold_back(&self, hold: Hold) -> bool {
        self.hold.0.set(hold).is_ok()
    }

    /// Completes, from now on and for every clone of this sender, every trajectory offered
    /// with `amend` before it is exported; `false` when one was set already (it is kept).
    pub(crate) fn amend_with(&self, amend: Amend) -> bool {
        self.amend.0.set(amend).is_ok()
    }

    /// Offers trajectories; those that do not fit are counted as dropped, those held back
    /// ([`ExportSender::hold_back`]) are left for their next change; the others are
    /// completed ([`ExportSender::amend_with`]) first.
    pub(crate) fn offer(&self, ts: Vec<Trajectory>) {
        let hold = self.hold.0.get();
        let amend = self.amend.0.get();
        for mut t in ts {
            if hold.is_some_and(|h| h(&t)) {
                continue;
            }
            if let Some(a) = amend {
                a(&mut t);
            }
            if self.tx.try_send(t).is_err() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Trajectories dropped because the export task was behind.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Adds the exporter's counters and `msgtrail_listener_export_dropped_total` to a
    /// metrics registry (one scrape of `GET /metrics`).
    pub(crate) fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        self.exporter.snapshot().register(registry);
        let dropped = prometheus_client::metrics::counter::Counter::<u64>::default();
        dropped.inc_by(self.dropped());
        registry.register(
            "msgtrail_listener_export_dropped",
            "Trajectories not handed to the exporter because its queue was full",
            dropped,
        );
    }
}

/// Starts the pipeline (within the runtime) and returns the sender and the task.
pub(crate) fn spawn(
    config: PipelineConfig,
    stop: CancellationToken,
) -> Result<
    (
        ExportSender,
        impl std::future::Future<Output = Result<(), crate::ListenerError>>,
    ),
    msgtrail_otel::ConfigError,
> {
    let mut pipeline = TracePipeline::start(config)?;
    let (tx, mut rx) = mpsc::channel::<Trajectory>(CHANNEL);
    let sender = ExportSender {
        tx,
        dropped: Arc::new(AtomicU64::new(0)),
        exporter: pipeline.handle().clone(),
        hold: SharedHold::default(),
        amend: SharedAmend::default(),
        gate: SharedGate::default(),
    };
    let gate = sender.gate.clone();
    let task = async move {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                t = rx.recv() => {
                    let Some(t) = t else { break };
                    if let Some(g) = gate.get() {
                        use crate::cluster::export_marks::Admit;
                        match g.admit(&t, pipeline.knows(&t)).await {
                            Admit::Skip => continue,
                            Admit::Export(elsewhere) => pipeline.mark_exported(&t, &elsewhere),
                        }
                    }
                    pipeline.observe(&t, now_nanos());
                }
                _ = tick.tick() => {
                    pipeline.tick(now_nanos());
                }
            }
        }
        // The pipeline exports what is still inside its grace, then drains.
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
