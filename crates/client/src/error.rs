//! Client errors.

use msgtrail_core::{ErrorCode, WireError};

/// What went wrong with a request to the broker. `Clone`, so that one failed batch request can
/// answer every message it carried.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The broker refused the request, with a code and a precise message.
    #[error("broker refused: {0}")]
    Refused(WireError),
    /// No broker answered in time (none running, or overloaded).
    #[error("no reply from a msgtrail broker on {subject} within {timeout_ms} ms (is a broker running?)")]
    Timeout {
        /// The request subject.
        subject: String,
        /// The timeout.
        timeout_ms: u64,
    },
    /// No broker listens on the subject at all (NATS "no responders"): none is running, or
    /// all are restarting. Nothing was sent to a broker.
    #[error("no msgtrail broker is listening on {subject} (no responders: none running, or all restarting)")]
    NoBroker {
        /// The request subject.
        subject: String,
    },
    /// NATS trouble (connection, permissions).
    #[error("nats: {0}")]
    Nats(String),
    /// The reply could not be decoded.
    #[error("invalid reply from broker: {0}")]
    Decode(String),
    /// The caller's input is invalid before anything is sent.
    #[error("{0}")]
    Invalid(String),
}

impl ClientError {
    /// The broker's error code, if the broker refused.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Refused(e) => Some(e.code),
            _ => None,
        }
    }

    /// Whether a settle was refused because it came after the delivery's ack wait
    /// (`delivery_expired`): it was **not** applied. JetStream delivers the message again
    /// (to this consumer or another of the group), or has dead-lettered it after the last
    /// attempt; either way the work done on this delivery was not acknowledged, and settling
    /// it again cannot succeed. Not transient.
    pub fn is_delivery_expired(&self) -> bool {
        self.code() == Some(ErrorCode::DeliveryExpired)
    }

    /// Whether retrying the same request may succeed (timeouts, unavailable JetStream).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ClientError::Timeout { .. } | ClientError::NoBroker { .. }
        ) || self.code() == Some(ErrorCode::Unavailable)
    }
}
