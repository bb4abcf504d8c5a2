//! # msgtrail-core
//!
//! The vocabulary every msgtrail part shares. It does no I/O: the broker, the client SDK,
//! the listener and the OpenTelemetry bridge all depend on it and on nothing of each other.
//!
//! ## Layout
//! - [`backoff`]: exponential backoff with jitter, for every retry loop.
//! - [`config`]: [`ConfigError`], the one shape of a refused configuration.
//! - [`ids`]: message IDs (UUIDv7), request IDs, client IDs, broker instances, topics and
//!   their grammar.
//! - [`trace_ids`]: the documented derivation of OpenTelemetry trace and span IDs from
//!   message IDs, so every part computes the same IDs without propagating context.
//! - [`stage`]: the stage model (P1–P4, C1–C8, X1/X2, N1, A1, R1, D1).
//! - [`record`]: a stage record and its JSON encoding (stage stream version 1, reports).
//! - [`outcome`]: the typed outcome of each stage (per-stage enums over the record's
//!   outcome text).
//! - [`frame`]: the binary frames of the batched message path and the compact stage-record
//!   encoding (stage stream version 2).
//! - [`subjects`]: the NATS subjects and stream names of the protocol.
//! - [`headers`]: the NATS header names of the protocol.
//! - [`wire`]: the JSON bodies of requests and replies, and the error codes.
//! - [`time`]: wall-clock timestamps as Unix nanoseconds.
//! - [`trajectory`]: assembling one message's records into hops, latencies, shadow-message
//!   state and a plain-words diagnosis (order-independent; the listener's query result).
//!
//! docs/PROTOCOL.md at the repository root describes the same protocol for clients in
//! other languages.

pub mod backoff;
pub mod config;
pub mod frame;
pub mod headers;
pub mod ids;
pub mod outcome;
pub mod record;
pub mod stage;
pub mod subjects;
pub mod time;
pub mod trace_ids;
pub mod trajectory;
pub mod wire;

pub use config::ConfigError;
pub use ids::{BrokerInstance, ClientId, IdError, MessageId, RequestId, Topic};
pub use record::{RecordError, StageRecord};
pub use stage::{Role, Stage};
pub use wire::{ErrorCode, WireError};
