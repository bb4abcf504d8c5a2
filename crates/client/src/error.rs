//! Client errors. Each keeps its cause: [`ClientError`]'s `source()` is what NATS, the
//! decoder or the validation said, not a copy of its text, and its `Display` is its own level
//! only: [`msgtrail_core::ErrorChain`] renders the error with its causes, each once.

use msgtrail_core::{ErrorCode, WireError};
use std::fmt;
use std::sync::Arc;

/// The underlying error of a [`ClientError`], shared (the error is `Clone`).
pub type SharedError = Arc<dyn std::error::Error + Send + Sync>;

/// What caused a [`ClientError`], with what the client was doing when it happened.
/// With a context, `Display` is the context alone and `source()` the original error; without
/// one it stands for the original error itself (its `Display` and its `source()`), so that a
/// rendering of the chain ([`msgtrail_core::ErrorChain`]) names each cause once.
#[derive(Debug, Clone)]
pub struct Cause {
    context: Option<String>,
    source: SharedError,
}

impl Cause {
    /// A cause without further context.
    pub fn new(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Cause {
            context: None,
            source: Arc::from(source.into()),
        }
    }

    /// A cause, and what was being done (`payload of <message id>`).
    pub fn with_context(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Cause {
            context: Some(context.into()),
            ..Cause::new(source)
        }
    }

    /// The original error.
    pub fn inner(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.source
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.context {
            Some(c) => f.write_str(c),
            None => self.source.fmt(f),
        }
    }
}

/// A cause equals itself and its clones (the same underlying error, the same context), not
/// another error that happens to read the same: what lets a [`ClientError`] in a
/// [`crate::HookEvent`] be compared.
impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        self.context == other.context && Arc::ptr_eq(&self.source, &other.source)
    }
}

impl Eq for Cause {}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.context {
            Some(_) => Some(&*self.source),
            None => self.source.source(),
        }
    }
}

/// The client's background batcher is gone (the runtime is shutting down).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the client's batcher has stopped")]
pub struct BatcherStopped;

/// What went wrong with a request to the broker. `Clone`, so that one failed batch request can
/// answer every message it carried (and hooks see it: [`crate::HookEvent::AfterSend`]);
/// equal when it is the same failure (see [`Cause`]'s `PartialEq`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
    #[error("nats")]
    Nats(#[source] Cause),
    /// The reply could not be decoded.
    #[error("invalid reply from broker")]
    Decode(#[source] Cause),
    /// The caller's input is invalid before anything is sent.
    #[error(transparent)]
    Invalid(Cause),
    /// A settle retried after an earlier attempt of it timed out was refused as too late
    /// (`delivery_expired`): the earlier attempt **may have been applied** (the broker
    /// answered it, the answer was lost) — or not, and then the message is delivered again.
    /// Which of the two, only the message's trajectory (the group's C8) or a redelivery
    /// tells. See [`ClientError::is_settle_ambiguous`].
    #[error("settle outcome unknown: an earlier attempt timed out and may have been applied; this retry came too late ({refused})")]
    SettleAmbiguous {
        /// The broker's refusal of the retry.
        refused: WireError,
    },
}

impl ClientError {
    /// NATS trouble, with NATS' own error as the cause.
    pub(crate) fn nats(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        ClientError::Nats(Cause::new(e))
    }

    /// A reply that could not be decoded, with the decoder's error as the cause.
    pub(crate) fn decode(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        ClientError::Decode(Cause::new(e))
    }

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

    /// Whether a settle past its delivery's ack wait was refused because the message is
    /// already settled in the group (`already_settled`): JetStream shows it acked — by an
    /// earlier attempt of this settle whose answer was lost, or by another delivery — or
    /// dead-lettered. Nothing is left to do for it: it is not delivered to this group again.
    /// Not transient.
    pub fn is_already_settled(&self) -> bool {
        self.code() == Some(ErrorCode::AlreadySettled)
    }

    /// Whether this is a settle whose outcome nobody knows: a retry refused as too late
    /// after an earlier attempt timed out ([`ClientError::SettleAmbiguous`]). Not transient:
    /// a further retry gets the same answer.
    pub fn is_settle_ambiguous(&self) -> bool {
        matches!(self, ClientError::SettleAmbiguous { .. })
    }

    /// Whether retrying the same request may succeed (timeouts, unavailable JetStream).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ClientError::Timeout { .. } | ClientError::NoBroker { .. }
        ) || self.code() == Some(ErrorCode::Unavailable)
    }
}
