//! # msgtrail-nats
//!
//! How every msgtrail part reaches NATS. The broker, the listener, the client SDK and the CLI
//! take the same [`NatsOptions`], so a deployment describes its NATS connection once, and the
//! broker does not depend on the client SDK for it.
//!
//! ## Layout
//! - [`connect`]: [`NatsOptions`] (every default in its `Default`; `Debug` hides secrets),
//!   connecting with them, and [`ConnectError`].

pub mod connect;

pub use connect::{ConnectError, NatsOptions, DEFAULT_PING_INTERVAL, DEFAULT_URL};
/// The type of every secret option, re-exported so callers need not name `secrecy`.
pub use secrecy::SecretString;
