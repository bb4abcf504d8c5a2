//! # msgtrail-client
//!
//! The producer and consumer SDK. Applications never propagate trace context: the broker
//! assigns message IDs and the trace of a message is computed from its ID. The SDK reports the
//! client's own stage records through its authenticated channel, built on the hook registry
//! users can add their own functions to.
//!
//! The API reads like async-nats' JetStream: a [`Producer`] sends, a [`Consumer`] fetches or
//! subscribes, and each [`Received`] message is settled through its own methods —
//! [`Received::ack`], [`Received::nack`], [`Received::term`], or [`Received::settle`] with an
//! [`AckKind`]. Settings are [`ProducerOptions`], [`ConsumerOptions`] and [`PushOptions`]:
//! `Default` plus chainable setters.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use msgtrail_client::{Consumer, ConsumerOptions, GroupId, Identity, Producer};
//! use msgtrail_core::ClientId;
//! use std::time::Duration;
//! let nats = async_nats::connect("nats://127.0.0.1:4222").await?;
//! let producer = Producer::connect(nats.clone(), Identity::generate(ClientId::new("shop")?)).await?;
//! producer.send("orders.eu", "hello").await?;
//!
//! let options = ConsumerOptions::default().timeout(Duration::from_secs(10));
//! let me = Identity::generate(ClientId::new("billing-1")?);
//! let consumer = Consumer::connect_with(nats, me, options).await?;
//! let sub = GroupId::new("billing")?.subscription("orders.*");
//! for msg in consumer.fetch(&sub, 10, Duration::from_secs(1)).await? {
//!     msg.ack().await?;
//! }
//! # Ok(()) }
//! ```
//!
//! ## The message path is batched
//! The API is per message — [`Producer::send`] returns that message's reply,
//! [`Received::ack`] that delivery's result — but the wire is batched (docs/PROTOCOL.md §18):
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
//! The modules are private; what they offer is re-exported here.
//! - [`connect`]: NATS connection options (URLs, user/password, token, creds, nkey, TLS).
//! - `identity`: [`Identity`]: client ID, nkey and service name; signs channel nonces.
//! - [`GroupId`], the name of a consumer group, is `msgtrail_core`'s (the wire types carry it).
//! - `topic`: [`ToTopic`], what the producer takes where a [`msgtrail_core::Topic`] is meant.
//! - `channel`: open, keepalive, reopen, close; the request/reply helpers.
//! - `producer`: [`Producer`]: batched sends with retries under one request ID;
//!   [`ProducerOptions`] and [`Outgoing`] in `producer::options`.
//! - `consumer`: [`Consumer`]: pull, push stream and the processing wrapper; `message`
//!   ([`Received`], [`AckKind`]), `settle` (the settle batcher), `push` ([`PushStream`]),
//!   `decode` (delivery frames), `options` ([`ConsumerOptions`], [`PushOptions`]).
//! - `hooks`: [`Hooks`]: events of a message's life, each hook on its own bounded queue.
//! - `reporter`: the stage-reporting hook ([`Reporter`] counters): `records` (the record of
//!   each event), `outbox` (where records wait to ride along), `flush` (the lone reports).
//! - `batch`: the adaptive batcher behind uploads and settles.
//! - `error`: the error type, [`ClientError`], and its [`Cause`].

mod batch;
mod channel;
mod consumer;
mod error;
mod hooks;
mod identity;
mod producer;
mod reporter;
mod topic;

pub use consumer::{AckKind, Consumer, ConsumerOptions, PushOptions, PushStream, Received};
pub use error::{BatcherStopped, Cause, ClientError, SharedError};
pub use hooks::{DeliveryInfo, HookEvent, HookKind, Hooks, DEFAULT_HOOK_CAPACITY};
pub use identity::Identity;
pub use msgtrail_core::GroupId;
/// Connecting to NATS: the options every msgtrail part shares (the `msgtrail-nats` crate).
pub use msgtrail_nats as connect;
pub use msgtrail_nats::{ConnectError, NatsOptions};
pub use producer::{Outgoing, Producer, ProducerOptions};
pub use reporter::Reporter;
pub use topic::ToTopic;

/// The README's Rust examples, compiled as doc tests so the front door stays true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeExamples;
