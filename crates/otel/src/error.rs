//! Errors of the OpenTelemetry bridge: configuration (refused before anything starts) apart
//! from export (at run time, counted rather than returned: export never blocks ingest).
//!
//! A configuration error has the one shape every msgtrail part shares,
//! [`msgtrail_core::ConfigError`]: a bad variable, an unsupported protocol, an endpoint or
//! header that cannot be used.

pub use msgtrail_core::ConfigError;

/// An OTLP endpoint that cannot be used, with the reason.
pub(crate) fn endpoint(endpoint: &str, source: impl Into<msgtrail_core::BoxError>) -> ConfigError {
    ConfigError::unusable("OTLP endpoint", endpoint, source)
}

/// A header of `OTEL_EXPORTER_OTLP_HEADERS` that cannot be sent, with the reason.
pub(crate) fn header(name: &str, source: impl Into<msgtrail_core::BoxError>) -> ConfigError {
    ConfigError::unusable("OTLP header", name, source)
}
