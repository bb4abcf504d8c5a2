//! `msgtrail`: the command-line front door. Each subcommand parses its options and calls a
//! library; the logic lives in the crates.

use clap::{Parser, Subcommand};

/// mimalloc instead of glibc's malloc: the message path allocates many small, short-lived
/// buffers per message, and glibc's allocator spent a quarter of the process's CPU on them
/// (BENCHMARKS.md, "Where the time goes").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod commands;
mod common;
#[cfg(test)]
mod help_defaults;
mod present;
mod report;
mod signal;

/// msgtrail: a message broker over NATS that records the trajectory of every message.
#[derive(Debug, Parser)]
#[command(name = "msgtrail", version, about)]
struct Cli {
    #[command(flatten)]
    nats: common::NatsArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start nats-server, a broker and dev identities locally (--demo adds a load).
    #[cfg(feature = "dev")]
    Dev(commands::dev::DevArgs),
    /// Run a broker.
    Broker(commands::broker::BrokerArgs),
    /// Send one message.
    Send(commands::send::SendArgs),
    /// Consume messages (pull or push).
    Consume(commands::consume::ConsumeArgs),
    /// Run a listener: shadow messages, trajectories, statistics, HTTP API.
    Listener(commands::listener::Args),
    /// Show a message's trajectory by message ID or request ID.
    Trace(commands::trace::Args),
    /// Show latency percentiles, counts by state, the funnel and ingest lag.
    Stats(commands::stats::Args),
    /// Check the listener's recent trajectories for what a trajectory must never show.
    Audit(commands::audit::Args),
    /// Benchmark msgtrail against raw JetStream, recording off vs on, listener, lookup, export.
    #[cfg(feature = "bench")]
    Bench(commands::bench::Args),
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        #[cfg(feature = "dev")]
        Command::Dev(a) => commands::dev::run(a).await,
        Command::Broker(a) => commands::broker::run(&cli.nats, a).await,
        Command::Send(a) => commands::send::run(&cli.nats, a).await,
        Command::Consume(a) => commands::consume::run(&cli.nats, a).await,
        Command::Listener(a) => commands::listener::run(&cli.nats, a).await,
        Command::Trace(a) => commands::trace::run(a).await,
        Command::Stats(a) => commands::stats::run(a).await,
        Command::Audit(a) => commands::audit::run(a).await,
        #[cfg(feature = "bench")]
        Command::Bench(a) => commands::bench::run(&cli.nats, a).await,
    };
    if let Err(e) = result {
        eprintln!("{}", report::render(&e));
        std::process::exit(1);
    }
}
