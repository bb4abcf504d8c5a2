//! Export CPU per span without I/O, for instruction counters: maps a trajectory (the wire
//! tests' consumed message: send, store, deliver, process) `n` times and, with `encode`,
//! groups the spans by service and encodes them as OTLP requests the way the exporter does
//! (batches of the default 2,048 spans).
//!
//! ```sh
//! cargo build --release -p msgtrail-otel --example encode_once
//! for n in 1000 11000; do
//!   valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$n \
//!     target/release/examples/encode_once $n encode
//! done
//! # instructions per span = (Ir(11000) - Ir(1000)) / (10000 × 4)
//! ```
//! Modes: `map` (mapping only), `encode` (mapping + protobuf), `json` (mapping + OTLP/JSON).
//! Prints spans and encoded bytes.

#[path = "../tests/common/mod.rs"]
mod common;

use msgtrail_otel::{encode_otlp as encode, Encoding, Resources};
use msgtrail_otel::{trajectory_spans, ExportConfig, MappingOptions};

/// The allocator of the `msgtrail` binary, so that counts match what it runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let usage = "usage: encode_once <trajectories> map|encode|json";
    let n: usize = std::env::args().nth(1).ok_or(usage)?.parse()?;
    let encoding = match std::env::args().nth(2).as_deref() {
        Some("map") => None,
        Some("encode") => Some(Encoding::Protobuf),
        Some("json") => Some(Encoding::Json),
        _ => return Err(usage.into()),
    };
    let defaults = ExportConfig::default();
    let t = common::success();
    let opts = MappingOptions::default();
    let mut resources = Resources::new(defaults.max_services);
    let (mut spans, mut bytes) = (0usize, 0usize);
    let mut batch = Vec::with_capacity(defaults.max_batch);
    for i in 0..n {
        batch.extend(trajectory_spans(&t, &opts));
        if batch.len() >= defaults.max_batch || i + 1 == n {
            spans += batch.len();
            let Some(encoding) = encoding else {
                batch.clear();
                continue;
            };
            let groups = resources.group(batch.drain(..));
            for body in encode(groups, encoding, false, defaults.max_request_bytes)? {
                bytes += body.bytes.len();
            }
        }
    }
    println!("{spans} spans, {bytes} bytes encoded");
    Ok(())
}
