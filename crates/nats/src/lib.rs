//! # msgtrail-nats
//!
//! How every msgtrail part reaches NATS. The broker, the listener, the client SDK and the CLI
//! take the same [`NatsOptions`], so a deployment describes its NATS connection once, and the
//! broker does not depend on the client SDK for it.
//!
//! ## Layout
//! - [`connect`]: [`NatsOptions`] (every default in its `Default`; `Debug` hides secrets),
//!   connecting with them, and [`ConnectError`].
//! - [`fast_ingest`]: fast-ingest batch publishing (nats-server ≥ 2.14), one JetStream ack
//!   per batch, every stored message's stream sequence proven.
//! - [`topology`]: every JetStream stream and bucket msgtrail uses, their settings, and how a
//!   process that finds one with other settings brings it to its own ([`topology::ensure_stream`]).

pub mod connect;
pub mod fast_ingest;
pub mod topology;

pub use connect::{ConnectError, NatsOptions, DEFAULT_PING_INTERVAL, DEFAULT_URL};
/// The type of every secret option, re-exported so callers need not name `secrecy`.
pub use secrecy::SecretString;
