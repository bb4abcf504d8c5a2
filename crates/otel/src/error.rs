//! Errors of the OpenTelemetry bridge: configuration (refused before anything starts) apart
//! from export (at run time, counted rather than returned: export never blocks ingest).

/// A configuration that cannot work: a bad variable, an unsupported protocol, an endpoint or
/// header that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// An environment variable or option has a value outside its grammar.
    #[error("invalid {name}={value:?}: expected {expected}")]
    Invalid {
        /// The variable or option.
        name: String,
        /// The refused value.
        value: String,
        /// What it should be, in words.
        expected: &'static str,
    },
    /// The OTLP endpoint cannot be used.
    #[error("invalid OTLP endpoint {endpoint:?}")]
    Endpoint {
        /// The endpoint as configured.
        endpoint: String,
        /// Why not.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A header of `OTEL_EXPORTER_OTLP_HEADERS` cannot be sent.
    #[error("invalid OTLP header {name:?}")]
    Header {
        /// The header's name.
        name: String,
        /// Why not.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl ConfigError {
    pub(crate) fn invalid(name: &str, value: &str, expected: &'static str) -> Self {
        ConfigError::Invalid {
            name: name.to_owned(),
            value: value.to_owned(),
            expected,
        }
    }

    pub(crate) fn endpoint(
        endpoint: &str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        ConfigError::Endpoint {
            endpoint: endpoint.to_owned(),
            source: source.into(),
        }
    }

    pub(crate) fn header(
        name: &str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        ConfigError::Header {
            name: name.to_owned(),
            source: source.into(),
        }
    }
}
