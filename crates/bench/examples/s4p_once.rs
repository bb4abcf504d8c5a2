//! S4P's ingest figure once, for profilers and for looking at thread placement
//! (`/proc/<pid>/task/*/status`) while it runs: `cargo run --release -p msgtrail-bench
//! --example s4p_once -- [messages] [stage messages per transaction] [repetitions]
//! [bytes per transaction]` (the listener's default `--batch-bytes` when left out).

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let mut args = std::env::args().skip(1);
    let messages: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let per_tx: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let reps: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let bytes: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(msgtrail_listener::DEFAULT_BATCH_BYTES);
    let limits = msgtrail_listener::BatchLimits {
        messages: per_tx,
        bytes,
    };
    let r = msgtrail_bench::ingest_scaling(
        messages,
        limits,
        reps,
        &msgtrail_bench::Progress::new(false),
    )
    .expect("S4P ingest");
    println!(
        "one {:.0} records/s; two {:.0} records/s ({:?} each); scaling {:.2} (spread {:?}); pinned {}",
        r.one_listener_records_per_sec,
        r.two_listeners_records_per_sec,
        r.per_listener_records_per_sec
            .iter()
            .map(|v| v.round())
            .collect::<Vec<_>>(),
        r.scaling,
        r.scaling_spread,
        r.pinned
    );
}
