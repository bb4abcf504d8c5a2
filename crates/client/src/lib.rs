//! # msgtrail-client
//!
//! placeholder
pub mod connect;
pub use connect::{ConnectError, NatsOptions};
