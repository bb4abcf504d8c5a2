//! S5: trajectory lookup latency with many stored messages. The store is filled with copies
//! of one recorded trajectory (from S3) under other IDs, in large transactions, then random
//! stored message IDs are looked up the way `GET /api/messages/<id>` does it
//! ([`Store::lookup`]: the records of the message, assembled into a trajectory).

use crate::error::BenchError;
use crate::ingest::relabel;
use crate::measure::{Latency, Progress, Recorder, Throughput};
use msgtrail_core::{MessageId, StageRecord};
use msgtrail_listener::Store;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Instant;

/// Messages written per store transaction while filling.
const FILL_BATCH: u64 = 2_000;

/// What S5 measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LookupResult {
    /// Messages stored.
    pub stored_messages: u64,
    /// Records per message.
    pub records_per_message: u64,
    /// Filling: records per second, in transactions of 2,000 messages.
    pub fill: Throughput,
    /// Store file size after filling, bytes.
    pub store_bytes: u64,
    /// Lookups timed, per second (one thread).
    pub lookups: Throughput,
    /// Lookups that found the message.
    pub found: u64,
    /// Lookup latency.
    pub latency: Latency,
}

/// The records of the recorded message with the most records (a whole trajectory).
pub(crate) fn template(recorded: &[Vec<StageRecord>]) -> Option<Vec<StageRecord>> {
    let mut by_id: BTreeMap<MessageId, Vec<StageRecord>> = BTreeMap::new();
    for r in recorded.iter().flatten() {
        if let Some(m) = r.message_id {
            by_id.entry(m).or_default().push(r.clone());
        }
    }
    // P1 carries no message ID: bring it in through the request ID.
    let p1: Vec<&StageRecord> = recorded
        .iter()
        .flatten()
        .filter(|r| r.message_id.is_none() && r.request_id.is_some())
        .collect();
    let (_, mut best) = by_id.into_iter().max_by_key(|(_, v)| v.len())?;
    if let Some(q) = best.iter().find_map(|r| r.request_id.clone()) {
        best.extend(
            p1.iter()
                .filter(|r| r.request_id.as_ref() == Some(&q))
                .map(|r| (*r).clone()),
        );
    }
    Some(best)
}

/// A small xorshift generator: lookups need spread, not cryptography.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Runs S5 on the current thread (call it from a blocking thread).
pub(crate) fn run(
    template: &[StageRecord],
    messages: u64,
    queries: u64,
    progress: &Progress,
) -> Result<LookupResult, BenchError> {
    let base = template
        .iter()
        .find_map(|r| r.message_id)
        .ok_or_else(|| BenchError::Config("S5 template has no message id".into()))?;
    let dir = tempfile::Builder::new()
        .prefix("msgtrail-bench-lookup-")
        .tempdir()?;
    let store = Store::open(dir.path(), 256, Default::default())
        .map_err(|e| BenchError::Listener(e.into()))?;
    let per = template.len() as u64;
    let phase = progress.phase("S5 fill store (records)", messages * per);
    let start = Instant::now();
    let mut k = 1u64;
    while k <= messages {
        let end = (k + FILL_BATCH).min(messages + 1);
        let mut records = Vec::with_capacity(((end - k) * per) as usize);
        for i in k..end {
            for r in template {
                let mut r = r.clone();
                relabel(&mut r, i);
                records.push(r);
            }
        }
        let n = records.len() as u64;
        store
            .apply(records, msgtrail_core::time::now_nanos())
            .map_err(|e| BenchError::Listener(e.into()))?;
        phase.add(n);
        k = end;
    }
    let fill = Throughput::new(messages * per, start.elapsed());
    drop(phase);
    let store_bytes = crate::measure::disk_bytes(dir.path());

    let phase = progress.phase("S5 lookups", queries);
    let mut rec = Recorder::default();
    let mut found = 0;
    let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ messages;
    let start = Instant::now();
    for _ in 0..queries {
        let i = 1 + next(&mut rng) % messages;
        let id = MessageId::from_u128(base.as_u128() ^ u128::from(i))
            .map_err(BenchError::Id)?
            .to_string();
        let t = Instant::now();
        let r = store.lookup(&id, None, msgtrail_core::time::now_nanos());
        rec.record(t.elapsed());
        if r.is_ok() {
            found += 1;
        }
        phase.add(1);
    }
    let lookups = Throughput::new(queries, start.elapsed());
    drop(phase);
    Ok(LookupResult {
        stored_messages: messages,
        records_per_message: per,
        fill,
        store_bytes,
        lookups,
        found,
        latency: rec.summary(),
    })
}
