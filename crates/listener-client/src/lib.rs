//! A client of the msgtrail listener's HTTP API ([`ListenerClient`]) and the types of its
//! answers, without the listener itself: a caller of the API (the CLI's `trace`, `stats` and
//! `audit`, a test, an operator's tool) links hyper's HTTP/1 client and serde, not the
//! listener's store engine, HTTP server or NATS ingest.
//!
//! The parts: `client` (the requests, [`ListenerClientError`]), [`api`] (error, clock and
//! client-event bodies), [`stats`] (the `GET /api/stats` snapshot) and [`observed`] (its
//! observe-mode section). The listener serves
//! these types and re-exports them under their old paths (`msgtrail_listener::StatsSnapshot`,
//! …). The routes are listed in the listener's `http` module (docs/ARCHITECTURE.md).

pub mod api;
mod client;
pub mod observed;
pub mod stats;

pub use api::{ApiError, ClientClocks, ClientEvents, WindowEstimate};
pub use client::{
    encode, ListenerClient, ListenerClientError, DEFAULT_URL, ENV_LISTENER_URL, ENV_TOKEN,
};
pub use observed::{ConsumerNow, ObservedConsumerStats, ObservedStreamStats, WindowedLatency};
pub use stats::{Funnel, LatencyRow, LatencyStats, StatsSnapshot};
