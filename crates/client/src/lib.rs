//! # msgtrail-client
//!
//! The producer and consumer SDK. Applications never propagate trace context: the broker
//! assigns message IDs and the trace of a message is computed from its ID. The SDK reports the
//! client's own stage records through its authenticated channel, built on the hook registry
//! users can add their own functions to.
//!
//! ## Layout
//! - [`connect`]: NATS connection options (URLs, user/password, token, creds, nkey, TLS).
//! - [`identity`]: client ID, nkey and service name; signs channel nonces.
//! - [`channel`]: open, keepalive, reopen, close; the request/reply helpers.
//! - [`producer`]: [`Producer`]: sends with retries under one request ID.
//! - [`consumer`]: [`Consumer`]: pull, push stream, settle, and the processing wrapper.
//! - [`hooks`]: [`Hooks`]: events of a message's life, each hook on its own bounded queue.
//! - [`reporter`]: the stage-reporting hook.
//! - [`error`]: the error type, [`ClientError`].

pub mod channel;
pub mod connect;
pub mod consumer;
pub mod error;
pub mod hooks;
pub mod identity;
pub mod producer;
pub mod reporter;

pub use connect::{ConnectError, NatsOptions};
pub use consumer::{Consumer, PushOptions, PushStream, Received};
pub use error::ClientError;
pub use hooks::{HookEvent, HookKind, Hooks};
pub use identity::Identity;
pub use producer::{Outgoing, Producer, ProducerOptions};

/// The README's Rust examples, compiled as doc tests so the front door stays true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeExamples;
