//! Listener configuration: every default in one `impl Default`, every environment variable a
//! documented constant, validated once before anything binds.

use msgtrail_core::trajectory::Deadlines;
use msgtrail_nats::NatsOptions;
use secrecy::{ExposeSecret, SecretString};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Directory of the listener's store.
pub const ENV_DATA_DIR: &str = "MSGTRAIL_LISTENER_DATA_DIR";
/// Address the HTTP API binds (`127.0.0.1:7380` by default; port 0 picks a free one).
pub const ENV_HTTP_ADDR: &str = "MSGTRAIL_LISTENER_ADDR";
/// Optional bearer token required by `/api/*` and `/metrics` (the client's constant: both
/// sides read the same variable).
pub use msgtrail_listener_client::ENV_TOKEN;
/// Name of the durable JetStream consumer on the stage stream.
pub const ENV_DURABLE: &str = "MSGTRAIL_LISTENER_DURABLE";

/// The default HTTP address of the listener.
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:7380";
/// The default durable consumer name.
pub const DEFAULT_DURABLE: &str = "msgtrail-listener";

/// Everything the listener needs to run. `Debug` shows the token as `[REDACTED]`.
#[derive(Debug, Clone)]
pub struct ListenerConfig {
    /// How to reach NATS: the same options as the broker's (URLs, credentials, TLS, …).
    pub nats: NatsOptions,
    /// Directory of the embedded store (created if missing).
    pub data_dir: PathBuf,
    /// Address the HTTP API binds.
    pub http_addr: SocketAddr,
    /// Bearer token required on `/api/*` and `/metrics`; `None` leaves them open.
    pub token: Option<SecretString>,
    /// Name of the durable consumer on the stage stream; the consumer on the message stream
    /// (store evidence) is named after it, `<durable_name>-stored`.
    pub durable_name: String,
    /// Most stage-stream messages applied in one store transaction.
    pub batch_size: usize,
    /// Most stage-stream payload bytes applied in one store transaction (a larger single
    /// message still makes one of its own): what bounds a transaction's length, and so the
    /// time from a record's arrival to its being queryable, whatever the brokers' batches
    /// look like. Default [`DEFAULT_BATCH_BYTES`].
    pub batch_bytes: usize,
    /// How long JetStream waits for the listener's ack before redelivering a stage-stream or
    /// stored message: after a crash, the batches that were in flight come back after this,
    /// so a restarted listener resumes within it. A store transaction that runs longer keeps
    /// its messages with progress acks. At least 1 s; default 5 s.
    pub ack_wait: Duration,
    /// How many payload bytes of each message to keep (0 keeps none).
    pub payload_head_bytes: usize,
    /// In-flight messages kept in memory so that ingest does not read them back from the
    /// store (0 keeps none). Each costs about 0.6–0.7 KB counted (its records, fingerprints and summary fields).
    pub cache_messages: usize,
    /// Bytes of the store engine's block cache (fjall), on top of the in-flight cache and
    /// fjall's write buffers: the process's memory grows up to about this much as the store
    /// is read. Default [`crate::DEFAULT_STORE_CACHE_BYTES`] (256 MiB).
    pub store_cache_bytes: usize,
    /// Deadlines of the watchdog, per hop.
    pub deadlines: Deadlines,
    /// How often the watchdog looks for overdue messages and polls the ingest lag.
    pub watchdog_interval: Duration,
    /// Messages whose first record is older than this are deleted (`None`: kept).
    pub retention_max_age: Option<Duration>,
    /// When the stored records exceed this many bytes, the oldest messages are deleted
    /// (`None`: no limit).
    pub retention_max_bytes: Option<u64>,
    /// How often retention runs.
    pub retention_interval: Duration,
    /// Width of the sliding window the latency percentiles are computed over.
    pub stats_window: Duration,
    /// Trace export over OTLP; `None` exports nothing. The CLI fills it from the standard
    /// `OTEL_EXPORTER_OTLP_*` variables when an endpoint is set
    /// (`msgtrail_otel::export_requested`).
    pub otel: Option<msgtrail_otel::PipelineConfig>,
    /// Where the page links a message's trace (Jaeger or Grafana); the CLI reads
    /// `MSGTRAIL_TRACE_UI_URL` (`msgtrail_otel::TraceUi::from_env`).
    pub trace_ui: Option<msgtrail_otel::TraceUi>,
    /// Recover P2/P3 of stored messages from the message stream itself (their headers and
    /// JetStream's stored time; see `crate::evidence`). On by default: the broker's own P2/P3
    /// wait in its memory until they reach the stage stream, so a broker crash or a stage
    /// stream without a leader can lose them, the stored message never. Off, the listener
    /// reads the stage stream alone (`msgtrail listener --no-store-evidence`).
    pub store_evidence: bool,
    /// Replicas of the stage stream: what a listener that creates it gives it, and the least
    /// an existing one is raised to. `None` (the default) keeps an existing stream's replicas
    /// and creates a new one with one; the listener never lowers them (the brokers'
    /// `--replicas` sets them too).
    pub replicas: Option<usize>,
    /// Observe mode: also trace these JetStream streams of applications that do not use
    /// msgtrail (`msgtrail listener --observe`; see `crate::observe`). `None`: off.
    pub observe: Option<crate::ObserveConfig>,
    /// Membership of a group of listeners sharing the stage partitions (`--group`); `None`
    /// (the default) reads every stage record alone, as a single listener always has.
    pub group: Option<crate::cluster::GroupConfig>,
}

/// Default of [`ListenerConfig::batch_bytes`]: 512 KiB of stage records, about 7 k records
/// (a few tens of milliseconds of one core's ingest). Smaller transactions cost more per
/// record (a message's records spread over more of them: on the bench's mix, instructions
/// per record +7 % at 1 MiB, +20 % at 256 KiB against unbounded transactions of 65 k
/// records, BENCHMARKS.md round 12).
pub const DEFAULT_BATCH_BYTES: usize = 512 * 1024;

impl Default for ListenerConfig {
    fn default() -> Self {
        ListenerConfig {
            nats: NatsOptions::url(msgtrail_nats::DEFAULT_URL),
            data_dir: PathBuf::from("msgtrail-listener-data"),
            http_addr: DEFAULT_HTTP_ADDR.parse().expect("valid default address"),
            token: None,
            durable_name: DEFAULT_DURABLE.to_owned(),
            batch_size: 512,
            batch_bytes: DEFAULT_BATCH_BYTES,
            ack_wait: Duration::from_secs(5),
            payload_head_bytes: 256,
            cache_messages: crate::cache::DEFAULT_CACHE_MESSAGES,
            store_cache_bytes: crate::store::DEFAULT_STORE_CACHE_BYTES,
            deadlines: Deadlines::default(),
            watchdog_interval: Duration::from_secs(2),
            retention_max_age: Some(Duration::from_secs(7 * 24 * 3600)),
            retention_max_bytes: Some(1 << 30),
            retention_interval: Duration::from_secs(30),
            stats_window: Duration::from_secs(300),
            otel: None,
            trace_ui: None,
            store_evidence: true,
            replicas: None,
            observe: None,
            group: None,
        }
    }
}

impl ListenerConfig {
    /// The bounds of one store transaction: `batch_size` messages, `batch_bytes` bytes.
    pub fn batch_limits(&self) -> crate::BatchLimits {
        crate::BatchLimits {
            messages: self.batch_size,
            bytes: self.batch_bytes,
        }
    }

    /// Checks the values that cannot work, with a message naming the field.
    pub fn validate(&self) -> Result<(), crate::ConfigError> {
        let bad =
            |field: &'static str, why: &str| Err(crate::ConfigError::field("listener", field, why));
        if self.nats.urls.iter().all(|u| u.trim().is_empty()) {
            return bad("nats", "must name at least one server URL");
        }
        if self.batch_size == 0 || self.batch_size > 100_000 {
            return bad("batch_size", "must be between 1 and 100000");
        }
        if self.batch_bytes == 0 {
            return bad("batch_bytes", "must be at least 1");
        }
        if self.durable_name.is_empty()
            || !self
                .durable_name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return bad("durable_name", "must be 1+ characters of A-Z a-z 0-9 _ -");
        }
        if self.replicas.is_some_and(|r| r == 0 || r > 5) {
            return bad("replicas", "must be 1 to 5");
        }
        if let Some(o) = &self.observe {
            o.validate()?;
            if o.only && self.group.is_some() {
                return bad(
                    "group",
                    "cannot be set with observe-only: an observe-only listener holds no \
                     stage partitions to share (drop --group or --observe-only)",
                );
            }
        }
        if let Some(g) = &self.group {
            g.validate()?;
        }
        if self.ack_wait < Duration::from_secs(1) {
            return bad("ack_wait", "must be at least one second");
        }
        if self.watchdog_interval.is_zero() || self.retention_interval.is_zero() {
            return bad("watchdog_interval", "intervals must be positive");
        }
        if self.stats_window < Duration::from_secs(1) {
            return bad("stats_window", "must be at least one second");
        }
        if self
            .token
            .as_ref()
            .is_some_and(|t| t.expose_secret().is_empty())
        {
            return bad("token", "must not be empty when set");
        }
        Ok(())
    }
}
