//! The harness's error type. Failures of the parts it drives keep their cause as `source()`.

use msgtrail_core::BoxError;

/// Why a benchmark run could not complete.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// The configuration makes no sense (zero messages, no payload size, …).
    #[error("invalid benchmark configuration: {0}")]
    Config(String),
    /// A generated ID is outside its grammar (a bug in the harness).
    #[error("invalid benchmark configuration: {0}")]
    Id(#[from] msgtrail_core::IdError),
    /// nats-server could not be started.
    #[error("nats-server: {0}")]
    Server(#[from] msgtrail_devkit::NatsServerError),
    /// NATS or JetStream refused or failed.
    #[error("nats: {0}")]
    Nats(#[source] BoxError),
    /// The broker could not start.
    #[error("broker: {0}")]
    Broker(#[source] BoxError),
    /// A producer or consumer failed.
    #[error("client: {0}")]
    Client(#[from] msgtrail_client::ClientError),
    /// The listener or its store failed.
    #[error("listener: {0}")]
    Listener(#[source] BoxError),
    /// The OTLP exporter or receiver failed.
    #[error("otlp: {0}")]
    Otlp(#[source] BoxError),
    /// A scenario did not finish within its time bound.
    #[error("{scenario} did not finish in {secs} s ({done} of {total} done)")]
    Timeout {
        /// The scenario.
        scenario: String,
        /// The bound, seconds.
        secs: u64,
        /// Work done.
        done: u64,
        /// Work asked for.
        total: u64,
    },
    /// A filesystem or process error.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

impl BenchError {
    /// A NATS error, kept as the cause.
    pub fn nats(e: impl Into<BoxError>) -> Self {
        BenchError::Nats(e.into())
    }
}
