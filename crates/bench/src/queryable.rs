//! S4's time from a record's arrival to being queryable, at a fraction of the maximum ingest.
//!
//! A feeder thread releases the synthetic workload's stage messages on a schedule (records
//! at `rate` per second, each stage message due when its records are); the ingesting thread
//! does what the listener's ingest loop does: wait for the first pending message, take every
//! message already pending while the listener's batch limits admit it (messages and bytes,
//! `msgtrail_listener::BatchLimits`), decode, apply in one transaction. A record
//! is queryable when its transaction commits, so each stage message's latency is its commit
//! time less the time it was *due* (not the time it was taken: a slow transaction delays
//! the messages queued behind it, and they count that wait).

use crate::error::BenchError;
use crate::measure::{Latency, Progress, Recorder};
use msgtrail_core::decode_batch;
use msgtrail_listener::{BatchLimits, Store};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What the paced run measured.
#[derive(Debug, Clone, Default)]
pub(crate) struct Paced {
    /// Records per second offered.
    pub(crate) offered_per_sec: f64,
    /// Arrival (due time) to commit, per stage message.
    pub(crate) latency: Latency,
    /// Records lost (undecodable messages or failed transactions).
    pub(crate) drops: u64,
}

/// Feeds `set` into `store` at `rate` records per second, transactions cut by `batch` as
/// the listener cuts them, and measures arrival to commit.
pub(crate) fn run(
    store: &Store,
    set: Vec<Vec<u8>>,
    rate: f64,
    batch: BatchLimits,
    progress: &Progress,
) -> Result<Paced, BenchError> {
    if !(rate.is_finite() && rate > 0.0) {
        return Err(BenchError::Config(format!(
            "S4's paced run needs a positive rate, got {rate}"
        )));
    }
    let sizes: Vec<u64> = set
        .iter()
        .map(|m| decode_batch(m).map_or(0, |b| b.len() as u64))
        .collect();
    let total: u64 = sizes.iter().sum();
    let phase = progress.phase("S4 arrival to queryable (paced)", total);
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let start = Instant::now();
    let feeder = std::thread::spawn(move || {
        let mut due_records = 0u64;
        for (m, n) in set.into_iter().zip(sizes) {
            due_records += n;
            let due = start + Duration::from_secs_f64(due_records as f64 / rate);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            if tx.send((due, m)).is_err() {
                return;
            }
        }
    });
    let mut out = Paced {
        offered_per_sec: rate,
        ..Paced::default()
    };
    let mut latency = Recorder::default();
    // The first pending message the limits refused, for the next transaction.
    let mut held = None;
    while let Some(first) = held.take().or_else(|| rx.recv().ok()) {
        let (taken, refused) = batch.gather(first, || rx.try_recv().ok(), |(_, m)| m.len());
        held = refused;
        let mut records = Vec::new();
        for (_, m) in &taken {
            match decode_batch(m) {
                Ok(rs) => records.extend(rs),
                Err(_) => out.drops += 1,
            }
        }
        let n = records.len() as u64;
        if let Err(e) = store.apply(records, msgtrail_core::time::now_nanos()) {
            tracing::warn!(error = %msgtrail_core::ErrorChain(&e), "S4 paced transaction failed");
            out.drops += n;
        }
        let committed = Instant::now();
        for (due, _) in &taken {
            latency.record(committed.saturating_duration_since(*due));
        }
        phase.add(n);
    }
    feeder
        .join()
        .map_err(|_| BenchError::Config("S4's feeder thread panicked".into()))?;
    out.latency = latency.summary();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::synthetic_set;

    #[test]
    fn every_stage_message_is_measured_once_and_stored() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Store::open(dir.path(), 0, Default::default()).expect("opens");
        let set = synthetic_set(300);
        let stage_messages = set.len() as u64;
        let limits = BatchLimits {
            messages: 4,
            bytes: usize::MAX,
        };
        let got = run(&store, set, 200_000.0, limits, &Progress::new(false)).expect("runs");
        assert_eq!(got.drops, 0);
        assert_eq!(got.latency.count, stage_messages);
        assert!(got.latency.max_ms >= got.latency.p50_ms);
        let stored: u64 = store.state_totals().expect("totals").values().sum();
        assert!(stored >= 300, "{stored} messages stored");
    }

    #[test]
    fn a_rate_that_is_not_positive_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Store::open(dir.path(), 0, Default::default()).expect("opens");
        let limits = crate::BenchConfig::default().batch_limits();
        for rate in [0.0, -1.0, f64::NAN] {
            let err = run(&store, Vec::new(), rate, limits, &Progress::new(false)).unwrap_err();
            assert!(err.to_string().contains("positive rate"), "{err}");
        }
    }
}
