//! # msgtrail-broker
//!
//! The broker, over NATS JetStream: producers and consumers open authenticated
//! channels, producers upload messages that are stored once per request ID and get a UUIDv7
//! message ID, consumer groups pull or are pushed matching messages and settle them, and every
//! step is written as a stage record to the durable stage stream, which only the broker
//! writes. It knows nothing of OpenTelemetry: the listener turns the records into traces.
//!
//! ## Layout
//! - `shared`: the parts every request handler shares.
//! - `server`: the NATS service, request dispatch, startup and graceful shutdown.
//! - `config`: [`BrokerConfig`] and its defaults.
//! - `error`: [`BrokerError`], why the broker could not start.
//! - `clients`: the configured clients (IDs, nkeys, topic permissions).
//! - `channels`: nkey challenge–response, channel open/keepalive/close, shared in a KV bucket.
//! - `upload`: single and batched uploads: validation, ID assignment, storage with all
//!   JetStream acks of a batch in flight, deduplication, and the store evidence in headers.
//! - `consume`: consumer groups, fetch (JSON or binary frames), settling, redelivery and
//!   dead letters.
//! - `settle`: batched settles, with the consumer's stage records riding along.
//! - `push`: push subscriptions, immediate or scheduled, with an in-flight bound.
//! - `token`: signed, self-contained ack tokens, so any broker can settle any delivery.
//! - `signing`: the deployment-wide HMAC key behind ack tokens and upload receipts.
//! - `relay`: checking and relaying the clients' own stage records.
//! - `stage_sink`: the bounded, batching, never-blocking writer of the stage stream.
//! - `streams`: the streams and buckets, created if missing.
//! - `metrics`: counters, also in the service stats.
//!
//! Every long-running task watches one `tokio_util::sync::CancellationToken` (a push
//! subscription a child of it), and requests in flight run on a `TaskTracker` the shutdown
//! waits for, within the grace period.

mod channels;
mod clients;
mod config;
mod consume;
mod error;
mod js_probe;
mod metrics;
mod push;
mod relay;
mod server;
mod settle;
mod shared;
mod signing;
mod stage_sink;
mod streams;
mod token;
mod upload;

pub use clients::{ClientEntry, ClientRegistry, ClientsError, ClientsFile, RegistryError};
pub use config::BrokerConfig;
pub use consume::durable_name;
pub use metrics::Metrics;
pub use server::{run, start, BrokerError, RunningBroker};
