//! S4: listener ingest alone, on one thread, through what the listener's ingest does per
//! batch (decode the stage-stream messages, one store transaction, statistics):
//! - the main figure ingests a synthetic workload with a production mix ([`crate::synth`]:
//!   successes, redeliveries, dead letters, orphans, duplicates, client reports arriving
//!   after later broker records), with one stage message in a hundred delivered twice (a
//!   redelivered batch, skipped as repeats), on the shape it had before S7 ([`Mix::narrow`]:
//!   three topics, one attribute, so that its store bytes compare across rounds);
//! - the stage-stream messages recorded during S3 are replayed too, `copies` times under
//!   other IDs (the real shape of this version's records);
//! - memory per in-flight message is counted, not read from the resident set (which swings
//!   with the allocator's arenas: 0.27 B one run, 1,137 B the next): the bytes the store's
//!   in-memory state holds ([`msgtrail_listener::CacheStats::bytes`], counted from
//!   the sizes of what it holds) after applying uploaded-but-undelivered messages (P1–P3),
//!   per message, as many messages as it keeps in memory. redb's page cache is bounded by
//!   its own setting, not per message, and is not in the figure.
//!
//! - write amplification: the bytes this process wrote to the storage layer while the
//!   synthetic mix was ingested, flushed and closed (`/proc/self/io` `write_bytes`: the
//!   store exposes its size on disk but no count of bytes written, [`crate::procfs`]) ÷ the
//!   logical bytes ingested (the encoded stage-stream messages, redelivered ones included);
//! - the process's peak resident set over all of S4 ([`crate::procfs::PeakRss`]).
//!
//! NATS is left out on purpose: S3 reports the listener's catch-up behind a real stage
//! stream; S4 isolates the listener's own cost.

use crate::error::BenchError;
use crate::measure::{Latency, Progress, Recorder, Throughput};
use crate::synth::{stage_messages, Mix};
use bytes::Bytes;
use msgtrail_core::{decode_batch, encode_batch};
use msgtrail_core::{MessageId, RequestId, StageRecord};
use msgtrail_listener::BatchLimits;
use msgtrail_listener::Stats;
use msgtrail_listener::Store;
use msgtrail_listener::DEFAULT_CACHE_MESSAGES;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// What S4 measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IngestResult {
    /// Stage-stream messages of the synthetic workload, redelivered ones included.
    pub stage_messages: u64,
    /// Store transactions (listener batches) of the synthetic workload.
    pub transactions: u64,
    /// Records of the synthetic workload ingested, per second, on one thread.
    pub records: Throughput,
    /// Records stored for the first time.
    pub new_records: u64,
    /// Records skipped as already stored (the redelivered stage messages).
    pub repeated_records: u64,
    /// Records lost: in undecodable stage messages or in failed transactions.
    pub drops: u64,
    /// Messages of the synthetic workload (orphan uploads included).
    pub messages: u64,
    /// The stage records S3 recorded, replayed `copies` times, per second on one thread.
    #[serde(default)]
    pub recorded_records: Throughput,
    /// In-flight messages (P1–P3 only: stored, not yet delivered) for the memory count.
    pub inflight_messages: u64,
    /// Bytes the store's in-memory state holds per in-flight message, counted.
    #[serde(default)]
    pub counted_bytes_per_inflight_message: f64,
    /// Time per store transaction of the synthetic workload (decode, apply, commit), at full
    /// speed. A record is queryable once its transaction commits; at any load below the
    /// maximum, it waits at most one transaction for its batch to be taken and one for it
    /// to commit, so twice the p99 bounds the time from arrival to queryable.
    #[serde(default)]
    pub transaction_ms: Latency,
    /// Store file size per message after the synthetic workload, bytes (disk, not memory;
    /// payload heads off).
    pub store_bytes_per_message: f64,
    /// The store's pages in use per message, bytes: the file less the room it grew ahead
    /// and the pages it keeps free for reuse.
    pub store_bytes_in_use_per_message: f64,
    /// The store's pages in use per message when every message has exactly ten records (a
    /// plain success: P1–P4, sent, received, processing started and finished, ack sent and
    /// received; [`Mix::plain`]), bytes: the store's size on the shape its targets name.
    #[serde(default)]
    pub store_bytes_in_use_per_ten_record_message: f64,
    /// Records per second offered to the paced run: 80 % of `records`.
    #[serde(default)]
    pub queryable_offered_records_per_sec: f64,
    /// Time from a stage message's arrival to its transaction's commit (queryable), per
    /// stage message, with the synthetic workload offered at 80 % of the
    /// maximum ingest ([`crate::queryable`]).
    #[serde(default)]
    pub queryable_ms: Latency,
    /// Logical bytes the synthetic-mix run ingested: the encoded stage-stream messages
    /// (what the stage stream would deliver), redelivered ones included.
    #[serde(default)]
    pub logical_bytes: u64,
    /// Bytes this process wrote to the storage layer during that run, the store's flush and
    /// close included (`/proc/self/io` `write_bytes` before and after; 0 where unreadable).
    #[serde(default)]
    pub disk_write_bytes: u64,
    /// `disk_write_bytes ÷ logical_bytes` (0 where unreadable).
    #[serde(default)]
    pub write_amplification: f64,
    /// Peak resident set of the process during S4, bytes.
    #[serde(default)]
    pub peak_rss_bytes: u64,
    /// How it was read: `VmHWM after clear_refs 5` (the kernel's high-water mark, reset
    /// at the start of S4) or `VmRSS sampled every 50 ms` (the reset refused).
    #[serde(default)]
    pub peak_rss_method: String,
}

/// The share of the measured maximum ingest at which arrival-to-queryable is measured.
pub(crate) const QUERYABLE_LOAD: f64 = 0.8;

/// Gives a record of copy `k` other IDs: the message ID with its low bits flipped (still a
/// UUIDv7) and the request ID with a `.k` suffix. Copy 0 is left as it is.
pub(crate) fn relabel(r: &mut StageRecord, k: u64) {
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
pub(crate) fn decode_all(batches: &[Bytes]) -> Vec<Vec<StageRecord>> {
    batches
        .iter()
        .filter_map(|b| decode_batch(b).ok())
        .collect()
}

/// The recorded messages, `copies` times under other IDs, encoded again as stage messages.
pub(crate) fn replay_set(recorded: &[Vec<StageRecord>], copies: u64) -> Vec<Vec<u8>> {
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

/// The synthetic workload again, into a fresh store, offered at `rate` records per second.
fn paced_run(
    messages: u64,
    rate: f64,
    batch: BatchLimits,
    progress: &Progress,
) -> Result<crate::queryable::Paced, BenchError> {
    let dir = tempfile::Builder::new()
        .prefix("msgtrail-bench-paced-")
        .tempdir()?;
    let store = open_store(dir.path(), 0)?;
    crate::queryable::run(&store, synthetic_set(messages), rate, batch, progress)
}

/// Ingests `messages` plain successes (ten records each, payload heads off) into a fresh
/// store and returns its pages in use per message.
fn ten_record_bytes(
    messages: u64,
    batch: BatchLimits,
    progress: &Progress,
) -> Result<f64, BenchError> {
    let set: Vec<Vec<u8>> = stage_messages(&Mix::plain(messages), msgtrail_core::time::now_nanos())
        .iter()
        .map(msgtrail_core::frame::encode_stage_batch)
        .collect();
    let dir = tempfile::Builder::new()
        .prefix("msgtrail-bench-ten-")
        .tempdir()?;
    let store = open_store(dir.path(), 0)?;
    let phase = progress.phase("S4 store size (ten records per message)", messages * 10);
    let got = ingest(&store, &set, batch, &phase);
    drop(phase);
    if got.drops > 0 {
        return Err(BenchError::Config(format!(
            "S4's ten-record workload dropped {} records",
            got.drops
        )));
    }
    let in_use = store
        .storage()
        .map_err(|e| BenchError::Listener(e.into()))?
        .allocated_bytes;
    Ok(in_use as f64 / messages.max(1) as f64)
}

pub(crate) fn open_store(dir: &std::path::Path, payload_head: usize) -> Result<Store, BenchError> {
    Store::open(dir, payload_head, Default::default()).map_err(|e| BenchError::Listener(e.into()))
}

fn new_stats() -> Stats {
    Stats::new(
        Duration::from_secs(300),
        msgtrail_core::time::now_nanos(),
        BTreeMap::new(),
        BTreeMap::new(),
    )
}

/// What ingesting one set of stage messages gave.
#[derive(Debug, Default)]
pub(crate) struct Ingested {
    pub(crate) records: u64,
    pub(crate) new_records: u64,
    pub(crate) repeated_records: u64,
    pub(crate) drops: u64,
    pub(crate) transactions: u64,
    pub(crate) seconds: f64,
    /// Time per transaction (decode, apply, commit).
    pub(crate) per_transaction: Latency,
}

/// Ingests encoded stage messages into `store`, cut into transactions by `batch` as the listener
/// cuts them ([`BatchLimits`]), and as it does: decode, apply, statistics.
pub(crate) fn ingest(
    store: &Store,
    set: &[Vec<u8>],
    batch: BatchLimits,
    progress: &crate::measure::Phase,
) -> Ingested {
    let stats = new_stats();
    let mut out = Ingested::default();
    let mut per_tx = Recorder::default();
    let start = Instant::now();
    for chunk in batch.split(set) {
        let tx_start = Instant::now();
        let mut records = Vec::new();
        for m in chunk {
            match decode_batch(m) {
                Ok(rs) => records.extend(rs),
                Err(_) => out.drops += 1,
            }
        }
        let n = records.len() as u64;
        let now = msgtrail_core::time::now_nanos();
        match store.apply(records, now) {
            Ok(o) => {
                stats.record_batch(chunk.len() as u64, &o, now);
                out.new_records += o.new_records;
                out.repeated_records += o.repeated_records;
            }
            Err(e) => {
                tracing::warn!(error = %msgtrail_core::ErrorChain(&e), "S4 store transaction failed");
                out.drops += n;
            }
        }
        per_tx.record(tx_start.elapsed());
        out.transactions += 1;
        out.records += n;
        progress.add(n);
    }
    out.seconds = start.elapsed().as_secs_f64();
    out.per_transaction = per_tx.summary();
    out
}

/// The synthetic workload as the stage stream holds it: encoded stage messages, one in a
/// hundred delivered a second time a hundred stage messages later (a redelivery after a lost ack).
pub(crate) fn synthetic_set(messages: u64) -> Vec<Vec<u8>> {
    let decoded = stage_messages(&Mix::narrow(messages), msgtrail_core::time::now_nanos());
    let encoded: Vec<Vec<u8>> = decoded
        .iter()
        .map(msgtrail_core::frame::encode_stage_batch)
        .collect();
    let mut out = Vec::with_capacity(encoded.len() + encoded.len() / 100);
    for (i, m) in encoded.iter().enumerate() {
        out.push(m.clone());
        if i >= 100 && i % 100 == 0 {
            out.push(encoded[i - 100].clone());
        }
    }
    out
}

/// Counts the bytes a fresh store holds per in-flight message: the first `n` messages of
/// the synthetic mix, uploaded and stored (P1–P3) but not delivered.
fn counted_inflight(n: u64, batch: BatchLimits) -> Result<(u64, f64), BenchError> {
    let inflight: Vec<Vec<StageRecord>> =
        stage_messages(&Mix::narrow(n), msgtrail_core::time::now_nanos())
            .into_iter()
            .map(|b| {
                b.into_iter()
                    .filter(|r| matches!(r.stage.code(), "P1" | "P2" | "P3"))
                    .collect::<Vec<_>>()
            })
            .filter(|b| !b.is_empty())
            .collect();
    let ids: BTreeSet<MessageId> = inflight
        .iter()
        .flatten()
        .filter_map(|r| r.message_id)
        .collect();
    let dir = tempfile::Builder::new()
        .prefix("msgtrail-bench-inflight-")
        .tempdir()?;
    let store = open_store(dir.path(), 0)?.cache_capacity(n as usize);
    for chunk in inflight.chunks(batch.messages) {
        let records: Vec<StageRecord> = chunk.iter().flatten().cloned().collect();
        store
            .apply(records, msgtrail_core::time::now_nanos())
            .map_err(|e| BenchError::Listener(e.into()))?;
    }
    let cache = store.cache_stats();
    let per = cache.bytes as f64 / cache.messages.max(1) as f64;
    drop(store);
    Ok((ids.len() as u64, per))
}

/// Runs S4 on the current thread (call it from a blocking thread): the synthetic mix of
/// `messages` messages, then S3's recorded stage messages `copies` times.
pub(crate) fn run(
    recorded: &[Bytes],
    messages: u64,
    copies: u64,
    batch: BatchLimits,
    progress: &Progress,
) -> Result<IngestResult, BenchError> {
    let peak = crate::procfs::PeakRss::start();
    let set = synthetic_set(messages);
    let logical_bytes: u64 = set.iter().map(|m| m.len() as u64).sum();
    let total: u64 = set
        .iter()
        .filter_map(|m| decode_batch(m).ok())
        .map(|b| b.len() as u64)
        .sum();
    let dir = tempfile::Builder::new()
        .prefix("msgtrail-bench-ingest-")
        .tempdir()?;
    let written_before = crate::procfs::write_bytes();
    let store = open_store(dir.path(), 0)?;
    let phase = progress.phase("S4 listener ingest (synthetic mix)", total);
    let got = ingest(&store, &set, batch, &phase);
    drop(phase);
    let in_use = store
        .storage()
        .map_err(|e| BenchError::Listener(e.into()))?
        .allocated_bytes;
    drop(store);
    let disk_write_bytes = match (written_before, crate::procfs::write_bytes()) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => 0,
    };
    let file = crate::measure::disk_bytes(dir.path());
    let mut out = IngestResult {
        stage_messages: set.len() as u64,
        transactions: got.transactions,
        records: Throughput::new(got.records, Duration::from_secs_f64(got.seconds)),
        new_records: got.new_records,
        repeated_records: got.repeated_records,
        drops: got.drops,
        messages,
        store_bytes_per_message: file as f64 / messages.max(1) as f64,
        store_bytes_in_use_per_message: in_use as f64 / messages.max(1) as f64,
        transaction_ms: got.per_transaction,
        logical_bytes,
        disk_write_bytes,
        write_amplification: disk_write_bytes as f64 / logical_bytes.max(1) as f64,
        ..Default::default()
    };
    drop(set);
    let paced = paced_run(
        messages,
        QUERYABLE_LOAD * out.records.per_sec,
        batch,
        progress,
    )?;
    out.queryable_offered_records_per_sec = paced.offered_per_sec;
    out.queryable_ms = paced.latency;
    out.drops += paced.drops;
    out.store_bytes_in_use_per_ten_record_message = ten_record_bytes(messages, batch, progress)?;

    let decoded = decode_all(recorded);
    if decoded.is_empty() {
        return Err(BenchError::Config(
            "S4 has no recorded stage records to replay (S3 recorded nothing)".into(),
        ));
    }
    let replay = replay_set(&decoded, copies);
    let total: u64 = decoded.iter().map(|b| b.len() as u64).sum::<u64>() * copies;
    let dir = tempfile::Builder::new()
        .prefix("msgtrail-bench-replay-")
        .tempdir()?;
    let store = open_store(dir.path(), 256)?;
    let phase = progress.phase("S4 listener ingest (S3's records)", total);
    let got = ingest(&store, &replay, batch, &phase);
    drop(phase);
    out.recorded_records = Throughput::new(got.records, Duration::from_secs_f64(got.seconds));
    out.drops += got.drops;
    drop(store);

    let (n, per) = counted_inflight(DEFAULT_CACHE_MESSAGES as u64, batch)?;
    out.inflight_messages = n;
    out.counted_bytes_per_inflight_message = per;
    let (rss, method) = peak.finish();
    out.peak_rss_bytes = rss;
    out.peak_rss_method = method.to_owned();
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
