//! `msgtrail listener`: run a listener (stage stream → shadow messages, trajectories,
//! statistics, HTTP API) until SIGINT/SIGTERM.

use crate::common::{duration_arg, size_arg, NatsArgs};
use anyhow::Context;
use bytesize::ByteSize;
use clap::Args as ClapArgs;
use msgtrail_core::trajectory::Deadlines;
use msgtrail_listener::ListenerConfig;
use msgtrail_listener::{
    DEFAULT_DURABLE, DEFAULT_HTTP_ADDR, ENV_DATA_DIR, ENV_DURABLE, ENV_HTTP_ADDR, ENV_TOKEN,
};
use msgtrail_nats::NatsOptions;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The listener's defaults, where every option's default comes from.
fn defaults() -> ListenerConfig {
    ListenerConfig::default()
}

/// A duration as the help shows it.
fn shown(d: Duration) -> humantime::Duration {
    d.into()
}

/// A deadline of [`Deadlines::default`], in milliseconds there.
fn deadline(pick: fn(&Deadlines) -> u64) -> humantime::Duration {
    shown(Duration::from_millis(pick(&Deadlines::default())))
}

/// Options of `msgtrail listener`.
#[derive(Debug, ClapArgs)]
pub(crate) struct Args {
    /// Directory of the listener's store.
    #[arg(long, env = ENV_DATA_DIR, default_value_os_t = defaults().data_dir)]
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
    #[arg(long, default_value_t = defaults().batch_size)]
    pub batch_size: usize,
    /// Most stage-record bytes applied per store transaction (bounds how long a record waits
    /// to be queryable, whatever the brokers' batches look like).
    #[arg(long, default_value_t = ByteSize(defaults().batch_bytes as u64), value_parser = size_arg)]
    pub batch_bytes: ByteSize,
    /// Payload bytes kept per message (0 keeps none).
    #[arg(long, default_value_t = defaults().payload_head_bytes)]
    pub payload_head_bytes: usize,
    /// In-flight messages kept in memory for ingest (0 keeps none; each costs ~0.6–0.7 KB counted).
    #[arg(long, default_value_t = defaults().cache_messages)]
    pub cache_messages: usize,
    /// Block cache of the store engine (fjall), on top of the in-flight messages: the process
    /// grows up to about this much as the store is read and written.
    #[arg(long, default_value_t = ByteSize(defaults().store_cache_bytes as u64), value_parser = size_arg)]
    pub store_cache: ByteSize,
    /// Deadline from upload to stored before a message is "stuck" / "did not reach the broker".
    #[arg(long, default_value_t = deadline(|d| d.stored_ms), value_parser = duration_arg)]
    pub deadline_stored: humantime::Duration,
    /// Deadline from stored to the first delivery.
    #[arg(long, default_value_t = deadline(|d| d.delivered_ms), value_parser = duration_arg)]
    pub deadline_delivered: humantime::Duration,
    /// Deadline from a delivery to its ack.
    #[arg(long, default_value_t = deadline(|d| d.acked_ms), value_parser = duration_arg)]
    pub deadline_acked: humantime::Duration,
    /// Deadline from processing start to its end.
    #[arg(long, default_value_t = deadline(|d| d.processed_ms), value_parser = duration_arg)]
    pub deadline_processed: humantime::Duration,
    /// Delete messages older than this (0 keeps them).
    #[arg(long, default_value_t = shown(defaults().retention_max_age.unwrap_or_default()), value_parser = duration_arg)]
    pub retention_max_age: humantime::Duration,
    /// Delete the oldest messages when their stored records exceed this many bytes (0: no
    /// limit). Counts record bytes, not the file: the file is about twice as large.
    #[arg(long, default_value_t = ByteSize(defaults().retention_max_bytes.unwrap_or(0)), value_parser = size_arg)]
    pub retention_max_size: ByteSize,
    /// Width of the sliding window of the latency percentiles.
    #[arg(long, default_value_t = shown(defaults().stats_window), value_parser = duration_arg)]
    pub stats_window: humantime::Duration,
    /// Do not recover P2/P3 (received, stored) from the stored messages' headers in the
    /// message stream; read the stage stream alone. Then a broker killed right after its
    /// reply, or a stage stream without a leader, leaves messages without a store hop.
    #[arg(long)]
    pub no_store_evidence: bool,
    /// Ack wait of the listener's consumers: after a crash, a restarted listener resumes
    /// the batches in flight within it (long transactions send progress acks).
    #[arg(long, default_value_t = shown(defaults().ack_wait), value_parser = duration_arg)]
    pub ack_wait: humantime::Duration,
    /// Replicas of the stage stream when the listener creates it, and the least an existing
    /// one is raised to (1 to 5). Unset: an existing stream keeps its replicas, a new one gets
    /// one. The listener never lowers them.
    #[arg(long)]
    pub replicas: Option<usize>,
    /// Observe mode: also trace these JetStream streams of applications that do not use
    /// msgtrail (comma-separated; they need not exist yet), from their stored messages and
    /// nats-server's ack metrics and nak/term/max-deliveries advisories.
    #[arg(long, value_delimiter = ',')]
    pub observe: Vec<String>,
    /// With --observe: set every observed consumer's sample_freq to 100% (without it, a
    /// consumer that does not sample every ack is only named, with the command that fixes it).
    #[arg(long, requires = "observe")]
    pub observe_set_sample_freq: bool,
    /// With --observe: observe only — read no stage stream and no store evidence (no
    /// msgtrail broker here); runs with only the NATS rights of an observer
    /// (deploy/nats/accounts.conf, user `observer`).
    #[arg(long, requires = "observe")]
    pub observe_only: bool,
    /// Join a group of listeners sharing the stage partitions (the brokers then run with
    /// `--stage-partitions`); every member answers for all. Unset: one listener reads every
    /// record, as before.
    #[arg(long, env = "MSGTRAIL_LISTENER_GROUP")]
    pub group: Option<String>,
    /// This listener's name in its group (unique among the members; required with --group).
    #[arg(long, env = "MSGTRAIL_INSTANCE_NAME", requires = "group")]
    pub instance_name: Option<String>,
    /// Listeners holding each partition (2 survives one listener's death with no gap).
    #[arg(long, default_value_t = 1, requires = "group")]
    pub copies: usize,
    /// The URL the other members reach this one's API at (default: http://<--addr>).
    #[arg(long, requires = "group")]
    pub advertise_url: Option<String>,
}

impl Args {
    /// The listener configuration these options describe.
    pub(crate) fn config(&self, nats: NatsOptions) -> ListenerConfig {
        let ms = |d: humantime::Duration| Duration::from(d).as_millis() as u64;
        let retention_max_age = Duration::from(self.retention_max_age);
        let retention_max_size = self.retention_max_size.as_u64();
        ListenerConfig {
            nats,
            data_dir: self.data_dir.clone(),
            http_addr: self.addr,
            token: self.token.as_deref().map(Into::into),
            durable_name: self.durable.clone(),
            batch_size: self.batch_size,
            batch_bytes: usize::try_from(self.batch_bytes.as_u64()).unwrap_or(usize::MAX),
            payload_head_bytes: self.payload_head_bytes,
            cache_messages: self.cache_messages,
            store_cache_bytes: usize::try_from(self.store_cache.as_u64()).unwrap_or(usize::MAX),
            deadlines: Deadlines {
                stored_ms: ms(self.deadline_stored),
                delivered_ms: ms(self.deadline_delivered),
                acked_ms: ms(self.deadline_acked),
                processed_ms: ms(self.deadline_processed),
            },
            retention_max_age: (!retention_max_age.is_zero()).then_some(retention_max_age),
            retention_max_bytes: (retention_max_size > 0).then_some(retention_max_size),
            stats_window: self.stats_window.into(),
            store_evidence: !self.no_store_evidence,
            ack_wait: self.ack_wait.into(),
            replicas: self.replicas,
            observe: (!self.observe.is_empty()).then(|| msgtrail_listener::ObserveConfig {
                set_sample_freq: self.observe_set_sample_freq,
                only: self.observe_only,
                ..msgtrail_listener::ObserveConfig::streams(self.observe.clone())
            }),
            group: self
                .group
                .clone()
                .map(|name| msgtrail_listener::cluster::GroupConfig {
                    instance: self.instance_name.clone().unwrap_or_default(),
                    name,
                    copies: self.copies,
                    advertise_url: self.advertise_url.clone(),
                }),
            ..Default::default()
        }
    }
}

/// Runs a listener until a signal.
pub(crate) async fn run(nats: &NatsArgs, args: Args) -> anyhow::Result<()> {
    let opts = nats.options()?;
    let mut config = args.config(opts.clone());
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
        let parse_long_duration = crate::common::parse_duration;
        let parse_size = |s| size_arg(s).map(|b| b.as_u64());
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
