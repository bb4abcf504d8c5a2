//! # msgtrail-devkit
//!
//! The throwaway parts of a development system, used by `msgtrail dev`, `msgtrail bench` and
//! the tests: a `nats-server` child process with JetStream, on a free loopback port, with its
//! store in a temporary directory, killed and cleaned when dropped; and an OTLP trace
//! receiver. What only tests need (processes to kill, nats-server clusters) is in the
//! `msgtrail-test-support` crate, which re-exports this one.
//!
//! ## Layout
//! - `nats_server`: finding the binary and running a server ([`NatsServer`]).
//! - `otlp_receiver`: an OTLP trace receiver over gRPC and HTTP/protobuf that hands each
//!   export request to its owner ([`OtlpReceiver`]); `examples/otlp_dump.rs` runs one that
//!   prints every span, a stand-in for Jaeger on a machine without Docker.

mod nats_server;
mod otlp_receiver;

pub use nats_server::{find_nats_server, NatsServer, NatsServerError, NatsServerOptions};
pub use otlp_receiver::{flatten, OtlpProtocol, OtlpReceiver, ReceivedSpan};
