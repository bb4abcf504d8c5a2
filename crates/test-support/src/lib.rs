//! # msgtrail-test-support
//!
//! Real parts for tests. The nats-server launcher and the OTLP receiver live in
//! `msgtrail-devkit` (the `msgtrail dev` command uses them too, and a production binary
//! should not depend on a test crate); they are re-exported here ([`NatsServer`],
//! [`OtlpReceiver`] and their options).
//!
//! ## Layout
//! - `nats_node`: nats-server nodes and clusters whose ports and stores outlive a kill
//!   ([`NatsNode`], [`NatsCluster`]).
//! - `netns`: Linux network namespaces on a bridge, for partitions ([`Network`], [`Host`]:
//!   cut a side off, heal); `nats_netns` runs a nats-server inside one
//!   ([`NatsNode::start_in`], [`NatsCluster::start_in`]).
//! - `process`: the `msgtrail` binary and child processes a test can kill and restart
//!   ([`msgtrail_binary`], [`ChildProcess`], [`ProcessSpec`], [`free_port`]).

mod nats_netns;
mod nats_node;
mod netns;
mod process;

pub use msgtrail_devkit::{
    find_nats_server, NatsServer, NatsServerError, NatsServerOptions, OtlpProtocol, OtlpReceiver,
    ReceivedSpan,
};
pub use nats_netns::{CLIENT_PORT, MONITOR_PORT, ROUTE_PORT};
pub use nats_node::{NatsCluster, NatsNode};
pub use netns::{Host, NetnsError, Network, ROOT};
pub use process::{
    free_port, msgtrail_binary, signal, workspace_root, ChildProcess, ProcessError, ProcessSpec,
};
