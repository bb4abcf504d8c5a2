//! `msgtrail broker`: run a broker until SIGINT/SIGTERM.

use crate::common::{duration_arg, NatsArgs};
use anyhow::Context;
use clap::Args;
use msgtrail_broker::{BrokerConfig, ClientRegistry};
use std::path::PathBuf;

/// The broker's defaults, where every option's default comes from.
fn defaults() -> BrokerConfig {
    BrokerConfig::default()
}

/// Options of `msgtrail broker`.
#[derive(Debug, Args)]
pub(crate) struct BrokerArgs {
    /// The clients file (JSON; see the README).
    #[arg(long, env = "MSGTRAIL_CLIENTS")]
    pub clients: PathBuf,
    /// The broker's service.name on its stage records.
    #[arg(long, env = "OTEL_SERVICE_NAME", default_value_t = defaults().service_name)]
    pub service_name: String,
    /// Replicas of streams and buckets (3 in a cluster).
    #[arg(long, default_value_t = defaults().replicas)]
    pub replicas: usize,
    /// Largest payload accepted, in bytes.
    #[arg(long, default_value_t = defaults().max_payload)]
    pub max_payload: usize,
    /// Ack wait before redelivery (e.g. 30s).
    #[arg(long, default_value_t = defaults().ack_wait.into(), value_parser = duration_arg)]
    pub ack_wait: humantime::Duration,
    /// Longest wait for JetStream to acknowledge an upload's store before answering it
    /// `unavailable` (e.g. 4s); keep it below the clients' request timeout (SDK default 5 s).
    #[arg(long, default_value_t = defaults().store_timeout.into(), value_parser = duration_arg)]
    pub store_timeout: humantime::Duration,
    /// Deliveries before a message is dead-lettered.
    #[arg(long, default_value_t = defaults().max_deliver)]
    pub max_deliver: u32,
    /// Dedup window for repeated request IDs (e.g. 2m).
    #[arg(long, default_value_t = defaults().dedup_window.into(), value_parser = duration_arg)]
    pub dedup_window: humantime::Duration,
    /// Payload bytes kept in the P2 record (0 = none).
    #[arg(long, default_value_t = defaults().record_payload_bytes)]
    pub record_payload_bytes: usize,
    /// Requests handled at once; beyond it requests wait in NATS and producers slow down.
    #[arg(long, default_value_t = defaults().max_concurrent_requests)]
    pub max_concurrent_requests: usize,
    /// This broker's name on its stage records, logs and stats (default: generated at
    /// start, `b-` and eight hex digits); unique among running brokers.
    #[arg(long, env = "MSGTRAIL_INSTANCE_NAME")]
    pub instance_name: Option<msgtrail_core::BrokerInstance>,
    /// Publish stage records split by partition on `msgtrail.stages.<p>`, for a group of
    /// listeners (`msgtrail listener --group`); a single listener reads either.
    #[arg(long, env = "MSGTRAIL_STAGE_PARTITIONS")]
    pub stage_partitions: bool,
}

/// Runs the broker until a signal.
pub(crate) async fn run(nats: &NatsArgs, args: BrokerArgs) -> anyhow::Result<()> {
    let clients = ClientRegistry::load(&args.clients)?;
    let config = BrokerConfig {
        nats: nats.options()?,
        service_name: args.service_name,
        clients,
        replicas: args.replicas,
        max_payload: args.max_payload,
        ack_wait: args.ack_wait.into(),
        store_timeout: args.store_timeout.into(),
        max_deliver: args.max_deliver,
        dedup_window: args.dedup_window.into(),
        record_payload_bytes: args.record_payload_bytes,
        max_concurrent_requests: args.max_concurrent_requests,
        instance_name: args.instance_name,
        stage_partitions: args.stage_partitions,
        ..Default::default()
    };
    config.validate()?;
    tracing::info!(clients = config.clients.len(), urls = ?config.nats.urls, "starting broker");
    msgtrail_broker::run(config, crate::signal::shutdown_signal())
        .await
        .context("broker failed")
}
