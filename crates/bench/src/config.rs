//! What to run and how much of it. Every default lives in [`BenchConfig::default`]; the
//! presets adjust it.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The benchmark's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchConfig {
    /// Run against this NATS server instead of starting one (no durable variant then). The
    /// pipeline runs purge msgtrail's streams there, so the run refuses a server whose
    /// streams hold data.
    pub nats_url: Option<String>,
    /// Messages per S1–S3 run (per payload size).
    pub messages: u64,
    /// Payload sizes, bytes; S1–S3 run once per size.
    pub payload_sizes: Vec<usize>,
    /// Producers (S2, S3) and publishing tasks (S1).
    pub producers: usize,
    /// Consumers in one group (S2, S3) and fetching tasks (S1).
    pub consumers: usize,
    /// Sends (S2, S3) or publish acks (S1) in flight per producer.
    pub window: usize,
    /// Most messages per fetch.
    pub fetch_batch: usize,
    /// Latency runs (S1–S3): messages per second offered, in all — well below what S3
    /// sustains, so that latency is the path's and not a queue's.
    pub latency_rate: f64,
    /// Latency runs: messages.
    pub latency_messages: u64,
    /// S4: messages of the synthetic workload (about 12 records each).
    pub ingest_messages: u64,
    /// S4: copies of the recorded stage records replayed (each copy with other IDs).
    pub ingest_copies: u64,
    /// S4: stage-stream messages applied per store transaction (the listener's batch size).
    pub ingest_batch: usize,
    /// S5: messages stored before lookups.
    pub lookup_messages: u64,
    /// S5: lookups timed.
    pub lookup_queries: u64,
    /// S6: spans exported.
    pub export_spans: u64,
    /// Also run S1–S3 on a nats-server with JetStream `sync_interval: always`.
    pub durable: bool,
    /// Upper bound of one scenario; beyond it the run fails instead of hanging.
    pub scenario_timeout: Duration,
    /// The preset's name, for the report.
    pub preset: String,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            nats_url: None,
            messages: 20_000,
            payload_sizes: vec![128, 1024],
            producers: 4,
            consumers: 4,
            window: 64,
            fetch_batch: 128,
            latency_rate: 500.0,
            latency_messages: 3_000,
            ingest_messages: 100_000,
            ingest_copies: 4,
            ingest_batch: 512,
            lookup_messages: 200_000,
            lookup_queries: 10_000,
            export_spans: 100_000,
            durable: false,
            scenario_timeout: Duration::from_secs(300),
            preset: "default".to_owned(),
        }
    }
}

impl BenchConfig {
    /// `--quick`: every scenario with small counts, well under a minute (CI runs it).
    pub fn quick() -> Self {
        BenchConfig {
            messages: 400,
            payload_sizes: vec![128, 1024],
            producers: 2,
            consumers: 2,
            window: 16,
            fetch_batch: 64,
            latency_messages: 100,
            ingest_messages: 2_000,
            ingest_copies: 2,
            lookup_messages: 2_000,
            lookup_queries: 500,
            export_spans: 2_000,
            scenario_timeout: Duration::from_secs(60),
            preset: "quick".to_owned(),
            ..Default::default()
        }
    }

    /// `--large`: S5 with 10 M stored messages: about 100 M records written (~5 minutes at
    /// ~330 k records/s on 2 cores) and ~20 GB of store on disk (BENCHMARKS.md).
    pub fn large(mut self) -> Self {
        self.lookup_messages = 10_000_000;
        self.scenario_timeout = Duration::from_secs(6 * 3600);
        self.preset = format!("{}+large", self.preset);
        self
    }

    /// Checks the values that would make a scenario meaningless.
    pub fn validate(&self) -> Result<(), crate::BenchError> {
        let bad = |m: &str| Err(crate::BenchError::Config(m.to_owned()));
        if self.messages == 0 {
            return bad("messages must be at least 1");
        }
        if self.payload_sizes.is_empty() || self.payload_sizes.iter().any(|s| *s < 16) {
            return bad(
                "payload sizes must be given and at least 16 bytes (a timestamp lives in them)",
            );
        }
        if self.producers == 0 || self.consumers == 0 || self.window == 0 || self.fetch_batch == 0 {
            return bad("producers, consumers, window and fetch batch must be at least 1");
        }
        if self.latency_messages == 0 || !self.latency_rate.is_finite() || self.latency_rate <= 0.0
        {
            return bad("latency messages and rate must be positive");
        }
        if self.ingest_messages == 0 || self.ingest_copies == 0 || self.ingest_batch == 0 {
            return bad("ingest messages, copies and batch must be at least 1");
        }
        if self.lookup_messages == 0 || self.lookup_queries == 0 || self.export_spans == 0 {
            return bad("lookup messages, lookup queries and export spans must be at least 1");
        }
        Ok(())
    }
}
