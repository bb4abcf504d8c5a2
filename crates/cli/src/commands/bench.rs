//! `msgtrail bench`: the benchmark harness (S1 raw JetStream, S2/S3 msgtrail with stage
//! recording off/on, S4 listener ingest, S5 lookup, S6 OTLP export) with ratios side by side.
//! The logic lives in `msgtrail-bench`; this parses options and prints.

use crate::common::NatsArgs;
use clap::Args as ClapArgs;
use msgtrail_bench::BenchConfig;

/// Options of `msgtrail bench`.
#[derive(Debug, ClapArgs)]
pub(crate) struct Args {
    /// Small counts: every scenario, well under a minute.
    #[arg(long)]
    pub quick: bool,
    /// S5 with 10 M stored messages (~25 min of store writes, 80–110 GB of disk).
    #[arg(long)]
    pub large: bool,
    /// Also run S1–S3 on a nats-server with JetStream `sync_interval: always`.
    #[arg(long)]
    pub durable: bool,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// No progress on stderr.
    #[arg(long)]
    pub quiet: bool,
    /// Messages per S1–S3 run.
    #[arg(long)]
    pub messages: Option<u64>,
    /// Payload sizes in bytes, comma-separated (default 128,1024).
    #[arg(long, value_delimiter = ',')]
    pub payload: Option<Vec<usize>>,
    /// Producers (and S1 publishing tasks).
    #[arg(long)]
    pub producers: Option<usize>,
    /// Consumers in the group (and S1 fetching tasks).
    #[arg(long)]
    pub consumers: Option<usize>,
    /// Sends in flight per producer.
    #[arg(long)]
    pub window: Option<usize>,
    /// Latency runs: messages per second offered (default 500).
    #[arg(long)]
    pub latency_rate: Option<f64>,
    /// Latency runs: messages (default 3000).
    #[arg(long)]
    pub latency_messages: Option<u64>,
    /// S4: copies of the recorded stage records replayed (default 4).
    #[arg(long)]
    pub ingest_copies: Option<u64>,
    /// S5: stored messages.
    #[arg(long)]
    pub lookup_messages: Option<u64>,
    /// S6: spans exported.
    #[arg(long)]
    pub export_spans: Option<u64>,
}

/// Runs the benchmark and prints the report. Only an explicit `--nats-url` (or `NATS_URL`)
/// points it at an existing server; otherwise it starts its own.
pub(crate) async fn run(nats: &NatsArgs, args: Args) -> anyhow::Result<()> {
    let mut config = if args.quick {
        BenchConfig::quick()
    } else {
        BenchConfig::default()
    };
    if args.large {
        config = config.large();
    }
    config.nats_url = nats.nats_url.clone();
    config.durable = args.durable;
    if let Some(v) = args.messages {
        config.messages = v;
    }
    if let Some(v) = args.payload {
        config.payload_sizes = v;
    }
    if let Some(v) = args.producers {
        config.producers = v;
    }
    if let Some(v) = args.consumers {
        config.consumers = v;
    }
    if let Some(v) = args.window {
        config.window = v;
    }
    if let Some(v) = args.latency_rate {
        config.latency_rate = v;
    }
    if let Some(v) = args.latency_messages {
        config.latency_messages = v;
    }
    if let Some(v) = args.ingest_copies {
        config.ingest_copies = v;
    }
    if let Some(v) = args.lookup_messages {
        config.lookup_messages = v;
    }
    if let Some(v) = args.export_spans {
        config.export_spans = v;
    }
    let report = msgtrail_bench::run(config, !args.quiet).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table());
    }
    Ok(())
}
