//! The bodies of the listener API's answers that are not a [`crate::stats`] snapshot or a
//! core type ([`msgtrail_core::trajectory::Trajectory`]): errors, a client's clocks and its
//! client events. The listener serves them; [`crate::ListenerClient`] decodes them.

use msgtrail_core::trajectory::ClockEstimate;
use serde::{Deserialize, Serialize};

/// The body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// What went wrong, in words.
    pub error: String,
    /// `not_found`, `ambiguous`, `bad_request`, `unauthorized` or `store`.
    pub kind: String,
    /// For `ambiguous`: the producers that used the request ID.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub producers: Vec<String>,
}

/// The body of `GET /api/clients/{id}/events`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientEvents {
    /// The client asked about.
    pub client: String,
    /// Its N1 and A1 records, newest first.
    pub events: Vec<msgtrail_core::StageRecord>,
}

/// One client's window estimates: the body of `GET /api/clients/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientClocks {
    /// The client asked about.
    pub client: String,
    /// The window, seconds of record time (`WINDOW`).
    pub window_secs: u64,
    /// Per broker instance the client exchanged with, the best estimate of the window,
    /// sorted by instance (records without an instance, from older brokers, last).
    pub clocks: Vec<WindowEstimate>,
}

/// The best estimate of one (client, broker instance) over the window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowEstimate {
    /// The estimate: its `samples` is the number of exchanges in the window, its `broker`
    /// the instance.
    #[serde(flatten)]
    pub estimate: ClockEstimate,
    /// When the best exchange happened (its broker-side time), Unix nanoseconds.
    pub measured_at: u64,
    /// The newest exchange of the pair (broker-side time), Unix nanoseconds: the window
    /// ends there.
    pub newest_at: u64,
}
