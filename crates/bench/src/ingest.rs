//! S4: listener ingest alone. The stage-stream messages recorded during S3 are replayed —
//! `copies` times, each copy under other message and request IDs so that nothing is skipped
//! as a repeat — through what the listener's ingest does per batch (decode, one store
//! transaction, statistics), on one thread: records per second on one core, drops, and the
//! resident memory each in-flight message costs.
//!
//! NATS is left out on purpose: S3 reports the listener's catch-up behind a real stage
//! stream; S4 isolates the listener's own cost.

use crate::error::BenchError;
use crate::measure::{rss_bytes, Progress, Throughput};
use bytes::Bytes;
use msgtrail_core::record::{decode_batch, encode_batch};
use msgtrail_core::{MessageId, RequestId, StageRecord};
use msgtrail_listener::stats::Stats;
use msgtrail_listener::Store;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// What S4 measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IngestResult {
    /// Stage-stream messages replayed.
    pub stage_messages: u64,
    /// Store transactions (listener batches).
    pub transactions: u64,
    /// Records replayed, per second, on one thread.
    pub records: Throughput,
    /// Records stored for the first time.
    pub new_records: u64,
    /// Records skipped as already stored.
    pub repeated_records: u64,
    /// Records lost: in undecodable stage messages or in failed transactions.
    pub drops: u64,
    /// Messages whose records were replayed.
    pub messages: u64,
    /// In-flight messages (P1–P3 only: stored, not yet delivered) applied for the memory
    /// measurement.
    pub inflight_messages: u64,
    /// Resident memory growth per in-flight message, bytes.
    pub rss_bytes_per_inflight_message: f64,
    /// Store file size per message after the replay, bytes (disk, not memory).
    pub store_bytes_per_message: f64,
}

/// Gives a record of copy `k` other IDs: the message ID with its low bits flipped (still a
/// UUIDv7) and the request ID with a `.k` suffix. Copy 0 is left as it is.
pub fn relabel(r: &mut StageRecord, k: u64) {
    if k == 0 {
        return;
    }
    if let Some(m) = r.message_id {
        if let Ok(n) = MessageId::from_u128(m.as_u128() ^ u128::from(k)) {
            r.message_id = Some(n);
        }
    }
    if let Some(q) = &r.request_id {
        if let Ok(n) = RequestId::new(format!("{}.{k}", q.as_str())) {
            r.request_id = Some(n);
        }
    }
}

/// Decodes recorded stage-stream messages (skipping undecodable ones).
pub fn decode_all(batches: &[Bytes]) -> Vec<Vec<StageRecord>> {
    batches
        .iter()
        .filter_map(|b| decode_batch(b).ok())
        .collect()
}

/// The recorded messages, `copies` times under other IDs, encoded again as stage messages.
pub fn replay_set(recorded: &[Vec<StageRecord>], copies: u64) -> Vec<Vec<u8>> {
    let mut out = Vec::with_capacity(recorded.len() * copies as usize);
    for k in 0..copies {
        for batch in recorded {
            let mut b = batch.clone();
            b.iter_mut().for_each(|r| relabel(r, k));
            out.push(encode_batch(b.iter()));
        }
    }
    out
}

fn open_store(dir: &std::path::Path) -> Result<Store, BenchError> {
    Store::open(dir, 256, Default::default()).map_err(|e| BenchError::Listener(e.to_string()))
}

/// Runs S4 on the current thread (call it from a blocking thread).
pub fn run(
    recorded: &[Bytes],
    copies: u64,
    batch: usize,
    progress: &Progress,
) -> Result<IngestResult, BenchError> {
    let decoded = decode_all(recorded);
    if decoded.is_empty() {
        return Err(BenchError::Config(
            "S4 has no recorded stage records to replay (S3 recorded nothing)".into(),
        ));
    }
    let set = replay_set(&decoded, copies);
    let dir = tempfile::Builder::new()
        .prefix("msgtrail-bench-ingest-")
        .tempdir()?;
    let store = open_store(dir.path())?;
    let stats = Stats::new(
        Duration::from_secs(300),
        msgtrail_core::time::now_nanos(),
        BTreeMap::new(),
        BTreeMap::new(),
    );
    let total: u64 = decoded.iter().map(|b| b.len() as u64).sum::<u64>() * copies;
    let phase = progress.phase("S4 listener ingest", total);
    let mut out = IngestResult {
        stage_messages: set.len() as u64,
        ..Default::default()
    };
    let mut messages = BTreeSet::new();
    let start = Instant::now();
    let mut replayed = 0u64;
    for chunk in set.chunks(batch) {
        // What the listener's ingest does with one batch of stage-stream messages.
        let mut records = Vec::new();
        for m in chunk {
            match decode_batch(m) {
                Ok(rs) => records.extend(rs),
                Err(_) => out.drops += 1,
            }
        }
        let n = records.len() as u64;
        messages.extend(records.iter().filter_map(|r| r.message_id));
        let now = msgtrail_core::time::now_nanos();
        match store.apply(records, now) {
            Ok(o) => {
                stats.record_batch(chunk.len() as u64, &o, now);
                out.new_records += o.new_records;
                out.repeated_records += o.repeated_records;
            }
            Err(e) => {
                tracing::warn!(error = %e, "S4 store transaction failed");
                out.drops += n;
            }
        }
        out.transactions += 1;
        replayed += n;
        phase.add(n);
    }
    out.records = Throughput::new(replayed, start.elapsed());
    drop(phase);
    out.messages = messages.len() as u64;
    drop(store);
    let file = std::fs::metadata(dir.path().join("listener.redb"))
        .map(|m| m.len())
        .unwrap_or(0);
    out.store_bytes_per_message = file as f64 / out.messages.max(1) as f64;

    // Memory: in-flight messages only (uploaded and stored, nothing delivered yet), in a
    // fresh store, resident memory before and after.
    let inflight: Vec<Vec<StageRecord>> = set
        .iter()
        .filter_map(|m| decode_batch(m).ok())
        .map(|b| {
            b.into_iter()
                .filter(|r| matches!(r.stage.code(), "P1" | "P2" | "P3"))
                .collect::<Vec<_>>()
        })
        .filter(|b| !b.is_empty())
        .collect();
    let dir = tempfile::Builder::new()
        .prefix("msgtrail-bench-inflight-")
        .tempdir()?;
    let store = open_store(dir.path())?;
    let mut ids = BTreeSet::new();
    let before = rss_bytes();
    for chunk in inflight.chunks(batch) {
        let records: Vec<StageRecord> = chunk.iter().flatten().cloned().collect();
        ids.extend(records.iter().filter_map(|r| r.message_id));
        let now = msgtrail_core::time::now_nanos();
        if let Ok(o) = store.apply(records, now) {
            stats.record_batch(chunk.len() as u64, &o, now);
        }
    }
    let after = rss_bytes();
    out.inflight_messages = ids.len() as u64;
    out.rss_bytes_per_inflight_message =
        after.saturating_sub(before) as f64 / out.inflight_messages.max(1) as f64;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use msgtrail_core::Stage;

    #[test]
    fn relabelled_copies_are_other_messages_of_the_same_shape() {
        let mut r = StageRecord::now(Stage::UploadReceived);
        r.message_id = Some(MessageId::new());
        r.request_id = Some(RequestId::generate());
        let mut c = r.clone();
        relabel(&mut c, 7);
        assert_ne!(c.message_id, r.message_id);
        assert_ne!(c.request_id, r.request_id);
        assert_eq!(c.stage, r.stage);
        // Still a UUIDv7 with the same timestamp.
        let (a, b) = (r.message_id.unwrap(), c.message_id.unwrap());
        assert_eq!(a.unix_millis(), b.unix_millis());
        let mut same = r.clone();
        relabel(&mut same, 0);
        assert_eq!(same, r);
    }

    #[test]
    fn replay_set_holds_every_copy() {
        let mut r = StageRecord::now(Stage::UploadReceived);
        r.message_id = Some(MessageId::new());
        let set = replay_set(&[vec![r.clone(), r]], 3);
        assert_eq!(set.len(), 3);
        let ids: BTreeSet<_> = set
            .iter()
            .flat_map(|b| decode_batch(b).unwrap())
            .filter_map(|r| r.message_id)
            .collect();
        assert_eq!(ids.len(), 3);
    }
}
