//! Errors of the OpenTelemetry bridge: configuration (refused before anything starts) apart
//! from export (at run time, counted rather than returned: export never blocks ingest).

/// A configuration that cannot work: a bad variable, an unsupported protocol, an exporter
/// that cannot be built.
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
    /// The OTLP exporter refused its configuration (endpoint, headers, compression…).
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

impl ConfigError {
    pub(crate) fn invalid(name: &str, value: &str, expected: &'static str) -> Self {
        ConfigError::Invalid {
            name: name.to_owned(),
            value: value.to_owned(),
            expected,
        }
    }
}
