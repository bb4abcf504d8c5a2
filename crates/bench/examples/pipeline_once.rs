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
//! payload bytes; optionally `windowed` (the broker stores with one PubAck per message, as
//! on servers before 2.14, instead of fast-ingest batches). Starts its own nats-server (not
//! instrumented: valgrind does not follow children unless asked) with a monitoring port, and
//! prints the run's figures as JSON, with what nats-server handled per stored message
//! (`/varz` `in_msgs`/`out_msgs`, both runs, setup included).

use msgtrail_bench::{run_pipeline, ListenerTiming, Load, PipelineParams, Progress};
use msgtrail_devkit::{NatsServer, NatsServerOptions};
use std::io::{Read, Write};
use std::time::Duration;

/// The allocator of the `msgtrail` binary, so that counts match what it runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: pipeline_once s2|s3 <messages> <payload bytes> [windowed]";
    let record = match args.get(1).map(String::as_str) {
        Some("s2") => false,
        Some("s3") => true,
        _ => return Err(usage.into()),
    };
    let messages: u64 = args.get(2).ok_or(usage)?.parse()?;
    let payload_bytes: usize = args.get(3).ok_or(usage)?.parse()?;
    let fast_ingest = match args.get(4).map(String::as_str) {
        None => true,
        Some("windowed") => false,
        Some(_) => return Err(usage.into()),
    };
    let server = NatsServer::start_with(NatsServerOptions {
        monitoring: true,
        ..Default::default()
    })?;
    let monitor = server.monitor_url().ok_or("no monitoring port")?.to_owned();
    let load = Load {
        messages,
        payload_bytes,
        producers: 4,
        window: 64,
        consumers: 4,
        fetch_batch: 128,
        rate: None,
        timeout: Duration::from_secs(3600),
        // A fixed count: the profile compares instruction counts of `messages` messages.
        timed: None,
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
        fast_ingest,
        tag: if record { "s3_once" } else { "s2_once" }.into(),
    };
    let before = varz(&monitor)?;
    let result = run_pipeline(&params, &Progress::new(false)).await?;
    let after = varz(&monitor)?;
    let stored = result.broker.uploads.max(1) as f64;
    let per = |key: &str| {
        (after[key].as_u64().unwrap_or(0) - before[key].as_u64().unwrap_or(0)) as f64 / stored
    };
    let mut out = serde_json::to_value(&result)?;
    out["nats_in_msgs_per_message"] = per("in_msgs").into();
    out["nats_out_msgs_per_message"] = per("out_msgs").into();
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

/// nats-server's `/varz`, over a plain HTTP/1.0 request.
fn varz(monitor: &str) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let addr = monitor.trim_start_matches("http://").trim_end_matches('/');
    let mut conn = std::net::TcpStream::connect(addr)?;
    write!(conn, "GET /varz HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut body = String::new();
    conn.read_to_string(&mut body)?;
    let json = body
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .ok_or("bad /varz reply")?;
    Ok(serde_json::from_str(json)?)
}
