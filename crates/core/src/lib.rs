//! # msgtrail-core
//!
//! The vocabulary every msgtrail part shares. It does no I/O: the broker, the client SDK,
//! the listener and the OpenTelemetry bridge all depend on it and on nothing of each other.
//!
//! ## Layout
//! The root holds the shared values: [`Backoff`] (exponential backoff with jitter, for every
//! retry loop), [`ErrorChain`] (an error and its causes on one line, each once),
//! [`ConfigError`] (the one shape of a refused configuration), the IDs
//! ([`MessageId`] as UUIDv7, [`RequestId`], [`ClientId`], [`GroupId`], [`BrokerInstance`],
//! [`Topic`] and the topic grammar), the stage model ([`Stage`]: P1–P4, C1–C8, X1/X2, N1, A1, R1, D1) and
//! a stage record with its JSON encoding ([`StageRecord`], [`encode_batch`]; stage stream
//! version 1, reports). The protocol's vocabularies stay in namespaces of their own, because
//! their names only make sense together (`frame::UploadBatch`, `wire::SettleKind`,
//! `subjects::MESSAGE_STREAM`):
//! - [`trace_ids`]: the documented derivation of OpenTelemetry trace and span IDs from
//!   message IDs, so every part computes the same IDs without propagating context.
//! - [`observed`]: observe mode's message IDs (UUIDv8 of stream and sequence), the trace a
//!   stored `traceparent` joins, and what observe mode cannot see.
//! - [`outcome`]: the typed outcome of each stage (per-stage enums over the record's
//!   outcome text).
//! - [`frame`]: the binary frames of the batched message path and the compact stage-record
//!   encoding (stage stream version 2).
//! - [`subjects`]: the NATS subjects and stream names of the protocol.
//! - [`partition`]: the documented hash that splits stage records into partitions
//!   (`msgtrail.stages.<p>`) so that several listeners share them.
//! - [`headers`]: the NATS header names of the protocol.
//! - [`stored`]: the compact `Msgtrail-Stored` header of stored messages, and a reader of
//!   it and of the separate headers of earlier brokers.
//! - [`wire`]: the JSON bodies of requests and replies, and the error codes.
//! - [`time`]: wall-clock timestamps as Unix nanoseconds.
//! - [`sync`]: taking a lock's guard back when an earlier holder panicked ([`sync::Recover`]),
//!   for the locks whose state a panic cannot tear.
//! - [`trajectory`]: assembling one message's records into hops, latencies, shadow-message
//!   state and a plain-words diagnosis (order-independent; the listener's query result).
//!
//! docs/PROTOCOL.md at the repository root describes the same protocol for clients in
//! other languages.

mod backoff;
mod chain;
pub mod codec;
mod config;
pub mod frame;
mod group;
pub mod headers;
mod ids;
pub mod observed;
pub mod outcome;
pub mod partition;
mod record;
pub mod record_fields;
mod stage;
pub mod stored;
pub mod subjects;
pub mod sync;
pub mod time;
pub mod trace_ids;
pub mod trajectory;
pub mod wire;

pub use backoff::Backoff;
pub use chain::ErrorChain;
pub use config::{BoxError, ConfigError};
pub use group::GroupId;
pub use ids::{
    topic_matches, validate_topic_filter, BrokerInstance, ClientId, IdError, MessageId, RequestId,
    Topic,
};
pub use record::{decode_batch, encode_batch, RecordError, StageRecord, RECOVERED};
pub use stage::{Emitter, Role, Stage};
pub use wire::{ErrorCode, WireError};
