//! Broker configuration, validated once before anything is bound. Every default lives in
//! [`BrokerConfig::default`].

use crate::clients::ClientRegistry;
use msgtrail_core::{BrokerInstance, ConfigError};
use msgtrail_nats::NatsOptions;
use std::time::Duration;

/// Everything the broker needs to run.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// How to reach NATS.
    pub nats: NatsOptions,
    /// The broker's OpenTelemetry `service.name` (`OTEL_SERVICE_NAME`), carried on its
    /// stage records.
    pub service_name: String,
    /// The clients that may open channels.
    pub clients: ClientRegistry,
    /// Replicas of the streams and buckets (1 for one server, 3 for a cluster).
    pub replicas: usize,
    /// Largest accepted payload in bytes.
    pub max_payload: usize,
    /// Largest accepted total header size in bytes.
    pub max_header_bytes: usize,
    /// JetStream duplicate window: a repeated request ID within it is stored once.
    pub dedup_window: Duration,
    /// How long messages are kept in the message stream.
    pub message_max_age: Duration,
    /// How long stage records are kept in the stage stream.
    pub stage_max_age: Duration,
    /// A delivery not settled within this time is redelivered.
    pub ack_wait: Duration,
    /// Longest wait for JetStream to acknowledge an upload's store; past it the upload is
    /// answered `unavailable` ("did not acknowledge") and the client retries with the same
    /// request ID. Keep it below the clients' request timeout (the SDK's default is 5 s), so
    /// that a stream that stops acknowledging — nats-server keeps a stream unwritable after a
    /// write error such as a full disk, until it is restarted — reaches clients as an error
    /// that says so, not as a timeout.
    pub store_timeout: Duration,
    /// After this many deliveries a message is dead-lettered.
    pub max_deliver: u32,
    /// A channel without keepalive expires after this time.
    pub channel_ttl: Duration,
    /// A challenge nonce is valid this long.
    pub nonce_ttl: Duration,
    /// How many payload bytes the P2 record keeps (0 for none).
    pub record_payload_bytes: usize,
    /// Stage records buffered before new ones are dropped (and counted).
    pub stage_buffer: usize,
    /// Most records in one stage-stream message.
    pub stage_batch_max: usize,
    /// Longest a record waits for its batch to fill.
    pub stage_batch_linger: Duration,
    /// Turn stage recording off entirely (benchmarks only: msgtrail without its purpose).
    pub record_stages: bool,
    /// Publish stage batches split by partition on `msgtrail.stages.<p>`
    /// (`msgtrail_core::partition`), for a group of listeners; off, on the legacy
    /// `msgtrail.stages` (fewer, fuller batches for a single listener, which reads both).
    pub stage_partitions: bool,
    /// Store upload batches as fast-ingest batches (one JetStream ack per batch) when the
    /// server has them (nats-server ≥ 2.14; the broker turns `allow_batched` on for the
    /// message stream). Off, or on older servers: one PubAck per message, all in flight.
    pub fast_ingest: bool,
    /// Time allowed for in-flight work at shutdown.
    pub shutdown_grace: Duration,
    /// Requests handled at once; beyond it the broker stops taking new ones until one ends,
    /// so overload slows producers down instead of growing tasks without limit.
    pub max_concurrent_requests: usize,
    /// The name of this broker process on its stage records (`--instance-name`); `None`
    /// generates one at start ([`BrokerInstance::generate`]). Clock offsets pair only
    /// records of one instance, so two running brokers must not share a name.
    pub instance_name: Option<BrokerInstance>,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            nats: NatsOptions::url(msgtrail_nats::DEFAULT_URL),
            service_name: "msgtrail-broker".to_owned(),
            clients: ClientRegistry::default(),
            replicas: 1,
            max_payload: 512 * 1024,
            max_header_bytes: 8 * 1024,
            dedup_window: Duration::from_secs(120),
            message_max_age: Duration::from_secs(7 * 24 * 3600),
            stage_max_age: msgtrail_nats::topology::DEFAULT_STAGE_MAX_AGE,
            ack_wait: Duration::from_secs(30),
            store_timeout: Duration::from_secs(4),
            max_deliver: 5,
            channel_ttl: Duration::from_secs(60),
            nonce_ttl: Duration::from_secs(30),
            record_payload_bytes: 256,
            stage_buffer: 100_000,
            stage_batch_max: 256,
            stage_batch_linger: Duration::from_millis(20),
            record_stages: true,
            stage_partitions: false,
            fast_ingest: true,
            shutdown_grace: Duration::from_secs(10),
            max_concurrent_requests: 512,
            instance_name: None,
        }
    }
}

impl BrokerConfig {
    /// Checks the values that would fail later in confusing ways.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad =
            |field: &'static str, reason: &str| Err(ConfigError::field("broker", field, reason));
        if self.replicas == 0 || self.replicas > 5 {
            return bad(
                "replicas",
                &format!("must be 1 to 5, got {}", self.replicas),
            );
        }
        if self.max_deliver == 0 {
            return bad("max deliver", "must be at least 1");
        }
        if self.ack_wait < Duration::from_millis(100) {
            return bad("ack wait", "must be at least 100 ms");
        }
        if self.store_timeout < Duration::from_millis(100) {
            return bad("store timeout", "must be at least 100 ms");
        }
        if self.dedup_window.is_zero() {
            return bad("dedup window", "must be positive");
        }
        if self.stage_batch_max == 0 || self.stage_buffer == 0 {
            return bad("stage batch and buffer sizes", "must be positive");
        }
        if self.max_concurrent_requests == 0 {
            return bad("max concurrent requests", "must be at least 1");
        }
        if self.channel_ttl < Duration::from_secs(1) {
            return bad("channel ttl", "must be at least 1 s");
        }
        Ok(())
    }
}
