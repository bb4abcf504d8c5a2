//! `msgtrail bench`: the benchmark harness (S1 raw JetStream, S2/S3 msgtrail with stage
//! recording off/on, S4 listener ingest, S5 lookup, S6 OTLP export, S7 search, S8 observe
//! mode's overhead) with ratios side by side.
//! The logic lives in `msgtrail-bench`; this parses options and prints.

use crate::common::NatsArgs;
use clap::Args as ClapArgs;
use msgtrail_bench::BenchConfig;

/// Options of `msgtrail bench`.
#[derive(Debug, ClapArgs)]
pub(crate) struct Args {
    /// Small counts, 300 ms windows after 100 ms of warm-up, 2 repetitions: every scenario
    /// in about a minute.
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
    /// Fixed-count S1–S3 saturated runs of this many messages instead of timed windows
    /// (unless --window is given too).
    #[arg(long)]
    pub messages: Option<u64>,
    /// The measured window of every saturated S1–S3 run, wall clock, with a unit (default
    /// 5s; --quick 300ms). Rate = completions in the window ÷ the window.
    #[arg(long, value_parser = window_arg)]
    pub window: Option<std::time::Duration>,
    /// Load before each window that is not counted (default 1s; --quick 100ms).
    #[arg(long, value_parser = crate::common::parse_duration)]
    pub warmup: Option<std::time::Duration>,
    /// Repetitions of every saturated S1–S3 run, interleaved; the report gives the median
    /// and the spread (default 3; --quick 2).
    #[arg(long)]
    pub reps: Option<u32>,
    /// Payload sizes in bytes, comma-separated (default 128,1024).
    #[arg(long, value_delimiter = ',')]
    pub payload: Option<Vec<usize>>,
    /// Producers (and S1 publishing tasks).
    #[arg(long)]
    pub producers: Option<usize>,
    /// Consumers in the group (and S1 fetching tasks).
    #[arg(long)]
    pub consumers: Option<usize>,
    /// Sends in flight per producer (S1: publish acks in flight per task); `--window N`
    /// before windows were timed.
    #[arg(long)]
    pub in_flight: Option<usize>,
    /// Latency runs: messages per second offered (default 500).
    #[arg(long)]
    pub latency_rate: Option<f64>,
    /// Latency runs: messages (default 3000).
    #[arg(long)]
    pub latency_messages: Option<u64>,
    /// S4: copies of the recorded stage records replayed (default 4).
    #[arg(long)]
    pub ingest_copies: Option<u64>,
    /// S5: stored messages (S7 searches a store of as many).
    #[arg(long)]
    pub lookup_messages: Option<u64>,
    /// S7: searches timed per kind of search (five kinds; default 200).
    #[arg(long)]
    pub search_queries: Option<u64>,
    /// S6: spans exported.
    #[arg(long)]
    pub export_spans: Option<u64>,
}

/// `--window`: a duration with its unit. A bare number is refused rather than read as
/// seconds: it was the number of sends in flight before windows were timed (`--in-flight`).
fn window_arg(s: &str) -> Result<std::time::Duration, String> {
    if s.trim().parse::<u64>().is_ok() {
        return Err(format!(
            "--window is the measured window, a duration with a unit (5s, 300ms); sends in \
             flight per producer are --in-flight {s}"
        ));
    }
    crate::common::parse_duration(s)
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
        if args.window.is_none() {
            config.measure_window = std::time::Duration::ZERO;
        }
    }
    if let Some(v) = args.window {
        config.measure_window = v;
    }
    if let Some(v) = args.warmup {
        config.warmup = v;
    }
    if let Some(v) = args.reps {
        config.reps = v;
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
    if let Some(v) = args.in_flight {
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
    if let Some(v) = args.search_queries {
        config.search_queries = v;
    }
    let report = msgtrail_bench::run(config, !args.quiet).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::window_arg;
    use std::time::Duration;

    #[test]
    fn window_takes_a_duration_and_refuses_a_bare_count() {
        assert_eq!(window_arg("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(window_arg("300ms"), Ok(Duration::from_millis(300)));
        let e = window_arg("64").unwrap_err();
        assert!(e.contains("--in-flight 64"), "{e}");
    }
}
