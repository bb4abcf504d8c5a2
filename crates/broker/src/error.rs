//! Why the broker could not start: configuration apart from NATS apart from JetStream setup,
//! each with its cause. Errors of single requests are wire replies
//! ([`msgtrail_core::WireError`]), built where the request is answered.

/// Why the broker could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] msgtrail_core::ConfigError),
    /// NATS could not be reached.
    #[error(transparent)]
    Connect(#[from] msgtrail_nats::ConnectError),
    /// JetStream or the service API refused something at startup.
    #[error("broker setup failed ({step})")]
    Setup {
        /// What the broker was setting up.
        step: &'static str,
        /// What NATS answered.
        #[source]
        source: async_nats::Error,
    },
}

impl BrokerError {
    /// A setup step that failed.
    pub(crate) fn setup(step: &'static str, source: impl Into<async_nats::Error>) -> Self {
        BrokerError::Setup {
            step,
            source: source.into(),
        }
    }
}
