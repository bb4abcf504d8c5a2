//! # msgtrail-client
//!
//! The producer and consumer SDK. Applications never propagate trace context: the broker
//! assigns message IDs and the trace of a message is computed from its ID. The SDK reports the
//! client's own stage records through its authenticated channel, built on the hook registry
//! users can add their own functions to.
//!
//! ## The message path is batched
//! The API is per message — [`Producer::send`] returns that message's reply, [`Consumer::ack`]
//! that delivery's result — but the wire is batched (docs/PROTOCOL.md §18):
//! - **uploads**: a producer's sends go through its batcher task to
//!   `msgtrail.v1.upload.batch` as binary frames with raw payloads, one result per message;
//! - **deliveries**: fetches and push subscriptions ask for binary delivery frames, so
//!   payloads arrive as raw bytes, several deliveries per push when there are several;
//! - **settles**: acks, nacks and terms go through the consumer's batcher to
//!   `msgtrail.v1.settle`, one result per settle;
//! - **stage reports** ride along: P1 is each upload entry's send time (the broker writes the
//!   record), and P4, C2/C3, C6/C7, X1/X2 wait in an outbox that the next upload or settle
//!   batch takes from; what no batch takes within 20 ms goes alone to `msgtrail.v1.stage`.
//!
//! Batching adapts to load and adds no latency when idle: with no batch request in flight an
//! item leaves at once, alone; while requests are in flight (up to
//! [`ProducerOptions::max_inflight_batches`]), items queue and the next request takes them all,
//! within [`ProducerOptions::max_batch_messages`] and [`ProducerOptions::max_batch_bytes`].
//! Each message keeps its own fate: retries with the same request ID, a refusal that fails it
//! alone, and the same hook events as one request per message would give.
//!
//! ## Layout
//! - [`connect`]: NATS connection options (URLs, user/password, token, creds, nkey, TLS).
//! - [`identity`]: client ID, nkey and service name; signs channel nonces.
//! - [`channel`]: open, keepalive, reopen, close; the request/reply helpers.
//! - [`producer`]: [`Producer`]: batched sends with retries under one request ID.
//! - [`consumer`]: [`Consumer`]: pull, push stream, batched settles, and the processing wrapper.
//! - [`hooks`]: [`Hooks`]: events of a message's life, each hook on its own bounded queue.
//! - [`reporter`]: the stage-reporting hook and the outbox its records ride along from.
//! - `batch` (internal): the adaptive batcher behind uploads and settles.
//! - [`error`]: the error type, [`ClientError`].

mod batch;
pub mod channel;
pub mod consumer;
pub mod error;
pub mod hooks;
pub mod identity;
pub mod producer;
pub mod reporter;

pub use consumer::{Consumer, ConsumerOptions, PushOptions, PushStream, Received};
pub use error::{BatcherStopped, Cause, ClientError};
pub use hooks::{HookEvent, HookKind, Hooks};
pub use identity::Identity;
/// Connecting to NATS: the options every msgtrail part shares (the `msgtrail-nats` crate).
pub use msgtrail_nats as connect;
pub use msgtrail_nats::{ConnectError, NatsOptions};
pub use producer::{Outgoing, Producer, ProducerOptions};

/// The README's Rust examples, compiled as doc tests so the front door stays true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeExamples;
