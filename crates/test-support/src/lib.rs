//! # msgtrail-test-support
//!
//! Real parts for tests: a `nats-server` child process with JetStream, on a free loopback
//! port, with its store in a temporary directory, killed and cleaned when dropped. `msgtrail
//! dev` uses the same launcher.
//!
//! ## Layout
//! - [`nats_server`]: finding the binary and running a server ([`NatsServer`]).
//! - [`otlp_receiver`]: an OTLP trace receiver over gRPC and HTTP/protobuf that hands each
//!   export request to the test ([`OtlpReceiver`]); `examples/otlp_dump.rs` runs one that
//!   prints every span, a stand-in for Jaeger on a machine without Docker.

pub mod nats_node;
pub mod nats_server;
pub mod otlp_receiver;
pub mod process;

pub use nats_server::{find_nats_server, NatsServer, NatsServerError, NatsServerOptions};
pub use otlp_receiver::{OtlpProtocol, OtlpReceiver, ReceivedSpan};
