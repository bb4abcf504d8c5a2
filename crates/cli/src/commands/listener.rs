//! `msgtrail listener`: run a listener (stage stream → shadow messages, trajectories,
//! statistics, HTTP API) until SIGINT/SIGTERM.

use crate::common::NatsArgs;
use anyhow::Context;
use clap::Args as ClapArgs;
use msgtrail_core::trajectory::Deadlines;
use msgtrail_listener::config::{
    DEFAULT_DURABLE, DEFAULT_HTTP_ADDR, ENV_DATA_DIR, ENV_DURABLE, ENV_HTTP_ADDR, ENV_TOKEN,
};
use msgtrail_listener::ListenerConfig;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Parses durations with units up to days: `500ms`, `30s`, `5m`, `12h`, `7d`.
pub fn parse_long_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: use e.g. 500ms, 30s, 5m, 12h, 7d"))?;
    let ms = match unit {
        "ms" => 1,
        "s" | "" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "invalid duration unit in {s:?}: use ms, s, m, h or d"
            ))
        }
    };
    Ok(Duration::from_millis(n.saturating_mul(ms)))
}

/// Parses sizes: `500`, `64KiB`, `100MiB`, `2GiB` (also KB/MB/GB as powers of 1000).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid size {s:?}: use e.g. 500MiB or 2GiB"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return Err(format!("invalid size unit in {s:?}: use B, KiB, MiB, GiB")),
    };
    Ok(n.saturating_mul(mult))
}

/// Options of `msgtrail listener`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Directory of the listener's store.
    #[arg(long, env = ENV_DATA_DIR, default_value = "msgtrail-listener-data")]
    pub data_dir: PathBuf,
    /// Address of the HTTP API.
    #[arg(long, env = ENV_HTTP_ADDR, default_value = DEFAULT_HTTP_ADDR)]
    pub addr: SocketAddr,
    /// Bearer token required by /api/* and /metrics.
    #[arg(long, env = ENV_TOKEN, hide_env_values = true)]
    pub token: Option<String>,
    /// Name of the durable consumer on the stage stream (each listener with its own store
    /// needs its own name: two sharing one would split the records between them).
    #[arg(long, env = ENV_DURABLE, default_value = DEFAULT_DURABLE)]
    pub durable: String,
    /// Most stage-stream messages applied per store transaction.
    #[arg(long, default_value_t = 512)]
    pub batch_size: usize,
    /// Payload bytes kept per message (0 keeps none).
    #[arg(long, default_value_t = 256)]
    pub payload_head_bytes: usize,
    /// In-flight messages kept in memory for ingest (0 keeps none; each costs ~9–18 KB).
    #[arg(long, default_value_t = msgtrail_listener::cache::DEFAULT_CACHE_MESSAGES)]
    pub cache_messages: usize,
    /// Deadline from upload to stored before a message is "stuck" / "did not reach the broker".
    #[arg(long, default_value = "10s", value_parser = parse_long_duration)]
    pub deadline_stored: Duration,
    /// Deadline from stored to the first delivery.
    #[arg(long, default_value = "60s", value_parser = parse_long_duration)]
    pub deadline_delivered: Duration,
    /// Deadline from a delivery to its ack.
    #[arg(long, default_value = "60s", value_parser = parse_long_duration)]
    pub deadline_acked: Duration,
    /// Deadline from processing start to its end.
    #[arg(long, default_value = "60s", value_parser = parse_long_duration)]
    pub deadline_processed: Duration,
    /// Delete messages older than this (0 keeps them).
    #[arg(long, default_value = "7d", value_parser = parse_long_duration)]
    pub retention_max_age: Duration,
    /// Delete the oldest messages when their stored records exceed this many bytes (0: no
    /// limit). Counts record bytes, not the file: the file is about twice as large.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    pub retention_max_size: u64,
    /// Width of the sliding window of the latency percentiles.
    #[arg(long, default_value = "5m", value_parser = parse_long_duration)]
    pub stats_window: Duration,
    /// Do not recover P2/P3 (received, stored) from the stored messages' headers in the
    /// message stream; read the stage stream alone. Then a broker killed right after its
    /// reply, or a stage stream without a leader, leaves messages without a store hop.
    #[arg(long)]
    pub no_store_evidence: bool,
    /// Ack wait of the listener's consumers: after a crash, a restarted listener resumes
    /// the batches in flight within it (long transactions send progress acks).
    #[arg(long, default_value = "5s", value_parser = parse_long_duration)]
    pub ack_wait: Duration,
}

impl Args {
    /// The listener configuration these options describe.
    pub fn config(&self, nats_url: String) -> ListenerConfig {
        let ms = |d: Duration| d.as_millis() as u64;
        ListenerConfig {
            nats_url,
            data_dir: self.data_dir.clone(),
            http_addr: self.addr,
            token: self.token.clone(),
            durable_name: self.durable.clone(),
            batch_size: self.batch_size,
            payload_head_bytes: self.payload_head_bytes,
            cache_messages: self.cache_messages,
            deadlines: Deadlines {
                stored_ms: ms(self.deadline_stored),
                delivered_ms: ms(self.deadline_delivered),
                acked_ms: ms(self.deadline_acked),
                processed_ms: ms(self.deadline_processed),
            },
            retention_max_age: (!self.retention_max_age.is_zero())
                .then_some(self.retention_max_age),
            retention_max_bytes: (self.retention_max_size > 0).then_some(self.retention_max_size),
            stats_window: self.stats_window,
            store_evidence: !self.no_store_evidence,
            ack_wait: self.ack_wait,
            ..Default::default()
        }
    }
}

/// Runs a listener until a signal.
pub async fn run(nats: &NatsArgs, args: Args) -> anyhow::Result<()> {
    let opts = nats.options()?;
    let mut config = args.config(opts.urls.join(","));
    if msgtrail_otel::export_requested() {
        config.otel = Some(
            msgtrail_otel::PipelineConfig::from_env().context("OpenTelemetry export settings")?,
        );
    }
    config.trace_ui = msgtrail_otel::TraceUi::from_env();
    config.validate()?;
    let export = config.otel.is_some();
    let client = opts.connect().await.context("connecting to NATS")?;
    let handle = msgtrail_listener::start_with_client(config, client)
        .await
        .context("listener failed to start")?;
    println!("listener on http://{}", handle.http_addr());
    if export {
        println!("exporting traces over OTLP (OTEL_EXPORTER_OTLP_* settings)");
    }
    handle
        .run_until(crate::signal::shutdown_signal())
        .await
        .context("listener failed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_long_durations_and_sizes() {
        assert_eq!(parse_long_duration("7d").unwrap().as_secs(), 7 * 86_400);
        assert_eq!(parse_long_duration("12h").unwrap().as_secs(), 12 * 3600);
        assert_eq!(parse_long_duration("250ms").unwrap().as_millis(), 250);
        assert!(parse_long_duration("3y").is_err());
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("100MB").unwrap(), 100_000_000);
        assert_eq!(parse_size("0").unwrap(), 0);
        assert!(parse_size("lots").is_err());
    }
}
