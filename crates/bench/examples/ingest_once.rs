//! Ingests a synthetic workload into a fresh listener store once, for profilers
//! (`perf record`, `valgrind --tool=callgrind`): `cargo run --release -p msgtrail-bench
//! --example ingest_once -- [messages] [stage messages per transaction] [plain|mix]
//! [bytes per transaction]`; `plain` ingests plain successes of exactly ten records each
//! instead of the production mix; transactions are cut as the listener cuts them
//! (`BatchLimits`), with no byte bound when the last argument is left out.

use msgtrail_bench::{stage_messages, Mix};
use std::time::Instant;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let mut args = std::env::args().skip(1);
    let messages: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let per_tx: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let mix = match args.next().as_deref() {
        Some("plain") => Mix::plain(messages),
        _ => Mix::realistic(messages),
    };
    let limits = msgtrail_listener::BatchLimits {
        messages: per_tx,
        bytes: args
            .next()
            .and_then(|a| a.parse().ok())
            .unwrap_or(usize::MAX),
    };
    let t0 = msgtrail_core::time::now_nanos();
    let decoded = stage_messages(&mix, t0);
    let total: usize = decoded.iter().map(Vec::len).sum();
    // As the stage stream holds them: what the listener decodes.
    let set: Vec<Vec<u8>> = decoded
        .iter()
        .map(msgtrail_core::frame::encode_stage_batch)
        .collect();
    drop(decoded);
    let dir = tempfile::tempdir().expect("temp dir");
    let record_bytes: usize = set.iter().map(Vec::len).sum();
    let wrote_before = written();
    let store = msgtrail_listener::Store::open(dir.path(), 0, Default::default())
        .expect("open")
        .cache_capacity(messages as usize);
    let start = Instant::now();
    let mut transactions = 0usize;
    for chunk in limits.split(&set) {
        transactions += 1;
        let mut records = Vec::new();
        for m in chunk {
            records.extend(msgtrail_core::decode_batch(m).expect("decodes"));
        }
        store
            .apply(records, msgtrail_core::time::now_nanos())
            .expect("apply");
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{total} records of {messages} messages in {secs:.2} s: {:.0} records/s ({transactions} transactions)",
        total as f64 / secs
    );
    let cache = store.cache_stats();
    let report = store.storage().expect("storage report");
    // Bytes the process wrote to disk (its memtables flushed by `storage`) per byte of
    // stage records ingested (as the stage stream carries them).
    let wrote = written() - wrote_before;
    println!(
        "write amplification {:.2} ({wrote} B written for {record_bytes} B of stage records); cache {:.0} B per cached message ({} messages)",
        wrote as f64 / record_bytes as f64,
        cache.bytes as f64 / cache.messages.max(1) as f64,
        cache.messages
    );
    println!(
        "summaries: {} from the folded state, {} assembled",
        cache.summaries_folded, cache.summaries_assembled
    );
    // The store is a directory (fjall): what its files take on disk.
    fn disk(dir: &std::path::Path) -> u64 {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| match e.metadata() {
                Ok(m) if m.is_dir() => disk(&e.path()),
                Ok(m) => std::os::unix::fs::MetadataExt::blocks(&m) * 512,
                Err(_) => 0,
            })
            .sum()
    }
    let file = disk(dir.path());
    println!(
        "file: {:.0} B per message, pages in use {:.0} B per message",
        file as f64 / messages as f64,
        report.allocated_bytes as f64 / messages as f64
    );
    println!("table: rows, stored / metadata / fragmented bytes per message");
    for t in report.tables {
        let per = |b: u64| b as f64 / messages as f64;
        println!(
            "{:>20}: {:>9} rows, {:>6.0} / {:>5.0} / {:>5.0}",
            t.name,
            t.entries,
            per(t.stored_bytes),
            per(t.metadata_bytes),
            per(t.fragmented_bytes)
        );
    }
}

/// `write_bytes` of this process (`/proc/self/io`): bytes it caused to be written to disk.
fn written() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("write_bytes: "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}
