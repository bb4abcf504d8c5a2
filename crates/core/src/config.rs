//! The one shape of a configuration error, shared by the broker's, the listener's and the
//! OpenTelemetry exporter's validation: a configuration is refused before anything is bound,
//! and the message names the setting at fault.

/// Any error a configuration value can carry as its cause.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A configuration that cannot work, refused before anything starts.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A variable or option has a value outside its grammar.
    #[error("invalid {name}={value:?}: expected {expected}")]
    Invalid {
        /// The variable or option.
        name: String,
        /// The refused value.
        value: String,
        /// What it should be, in words.
        expected: &'static str,
    },
    /// A field parses but its value cannot work (out of range, inconsistent).
    #[error("invalid {scope} configuration: {field} {reason}")]
    Field {
        /// Whose configuration: `broker`, `listener`, …
        scope: &'static str,
        /// The field at fault.
        field: &'static str,
        /// Why, in words.
        reason: String,
    },
    /// A value cannot be used, for a reason another library gave.
    #[error("invalid {what} {value:?}")]
    Unusable {
        /// What the value is (`OTLP endpoint`, `OTLP header`).
        what: &'static str,
        /// The value as configured.
        value: String,
        /// Why not.
        #[source]
        source: BoxError,
    },
}

impl ConfigError {
    /// A value outside its grammar.
    pub fn invalid(name: &str, value: &str, expected: &'static str) -> Self {
        ConfigError::Invalid {
            name: name.to_owned(),
            value: value.to_owned(),
            expected,
        }
    }

    /// A field of `scope`'s configuration whose value cannot work.
    pub fn field(scope: &'static str, field: &'static str, reason: impl Into<String>) -> Self {
        ConfigError::Field {
            scope,
            field,
            reason: reason.into(),
        }
    }

    /// A value another library refused, with its reason as the source.
    pub fn unusable(what: &'static str, value: &str, source: impl Into<BoxError>) -> Self {
        ConfigError::Unusable {
            what,
            value: value.to_owned(),
            source: source.into(),
        }
    }

    /// The field or variable at fault.
    pub fn field_name(&self) -> &str {
        match self {
            ConfigError::Invalid { name, .. } => name,
            ConfigError::Field { field, .. } => field,
            ConfigError::Unusable { what, .. } => what,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_setting() {
        let e = ConfigError::field("broker", "replicas", "must be 1 to 5, got 7");
        assert_eq!(
            e.to_string(),
            "invalid broker configuration: replicas must be 1 to 5, got 7"
        );
        assert_eq!(e.field_name(), "replicas");
        let e = ConfigError::invalid("OTEL_X", "abc", "milliseconds");
        assert_eq!(
            e.to_string(),
            "invalid OTEL_X=\"abc\": expected milliseconds"
        );
        let cause = "x".parse::<u8>().unwrap_err();
        let e = ConfigError::unusable("OTLP endpoint", "::", cause);
        assert_eq!(e.to_string(), "invalid OTLP endpoint \"::\"");
        assert!(std::error::Error::source(&e).is_some());
    }
}
