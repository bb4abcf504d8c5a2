//! One msgtrail pipeline run (S2 or S3, no listener), for profilers: instruction counts of
//! the message path per message, without the other scenarios in the same process.
//!
//! ```sh
//! cargo build --release -p msgtrail-bench --example pipeline_once
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.s3 \
//!     target/release/examples/pipeline_once s3 5000 128
//! callgrind_annotate --inclusive=yes /tmp/cg.s3 | head -60
//! ```
//! Arguments: `s2` (recording off) or `s3` (recording on, clients reporting); messages;
//! payload bytes. Starts its own nats-server (not instrumented: valgrind does not follow
//! children unless asked). Prints the run's figures as JSON.

use msgtrail_bench::{run_pipeline, ListenerTiming, Load, PipelineParams, Progress};
use msgtrail_devkit::NatsServer;
use std::time::Duration;

/// The allocator of the `msgtrail` binary, so that counts match what it runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: pipeline_once s2|s3 <messages> <payload bytes>";
    let record = match args.get(1).map(String::as_str) {
        Some("s2") => false,
        Some("s3") => true,
        _ => return Err(usage.into()),
    };
    let messages: u64 = args.get(2).ok_or(usage)?.parse()?;
    let payload_bytes: usize = args.get(3).ok_or(usage)?.parse()?;
    let server = NatsServer::start()?;
    let load = Load {
        messages,
        payload_bytes,
        producers: 4,
        window: 64,
        consumers: 4,
        fetch_batch: 128,
        rate: None,
        timeout: Duration::from_secs(3600),
    };
    let params = PipelineParams {
        nats_url: server.url().to_owned(),
        paced: Load {
            messages: 0,
            ..load.clone()
        },
        load,
        record_stages: record,
        // No listener: the message path alone.
        listener: ListenerTiming::None,
        batch_messages: None,
        tag: if record { "s3_once" } else { "s2_once" }.into(),
    };
    let result = run_pipeline(&params, &Progress::new(false)).await?;
    println!("{}", serde_json::to_string_pretty(&result)?);
    Ok(())
}
