//! The harness's error type.

/// Why a benchmark run could not complete.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// The configuration makes no sense (zero messages, no payload size, …).
    #[error("invalid benchmark configuration: {0}")]
    Config(String),
    /// nats-server could not be started.
    #[error("nats-server: {0}")]
    Server(#[from] msgtrail_test_support::NatsServerError),
    /// NATS or JetStream refused or failed.
    #[error("nats: {0}")]
    Nats(String),
    /// The broker could not start.
    #[error("broker: {0}")]
    Broker(String),
    /// A producer or consumer failed.
    #[error("client: {0}")]
    Client(#[from] msgtrail_client::ClientError),
    /// The listener or its store failed.
    #[error("listener: {0}")]
    Listener(String),
    /// The OTLP exporter or receiver failed.
    #[error("otlp: {0}")]
    Otlp(String),
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
    /// A NATS error from anything displayable.
    pub fn nats(e: impl std::fmt::Display) -> Self {
        BenchError::Nats(e.to_string())
    }
}
