//! What to run and how much of it. Every default lives in [`BenchConfig::default`]; the
//! presets adjust it.

use serde::{Deserialize, Serialize};
use std::time::Duration;

fn one() -> u32 {
    1
}

fn search_default() -> u64 {
    BenchConfig::default().search_queries
}

fn batch_bytes_default() -> usize {
    msgtrail_listener::DEFAULT_BATCH_BYTES
}

fn replay_default() -> usize {
    BenchConfig::default().replay_stage_messages
}

/// The benchmark's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchConfig {
    /// Run against this NATS server instead of starting one (no durable variant then). The
    /// pipeline runs purge msgtrail's streams there, so the run refuses a server whose
    /// streams hold data.
    pub nats_url: Option<String>,
    /// Messages per S1–S3 saturated run (per payload size) when `measure_window` is zero
    /// (a fixed-count run, measured from the start to the last completion); unused by
    /// timed runs.
    pub messages: u64,
    /// The measured window of every saturated S1–S3 run (wall clock; rate = completions in
    /// the window ÷ the window). Zero: fixed-count runs of `messages` instead.
    #[serde(default)]
    pub measure_window: Duration,
    /// Load before the window that is not counted (timed runs only).
    #[serde(default)]
    pub warmup: Duration,
    /// Repetitions of every saturated S1–S3 run, interleaved (all scenarios, then all again).
    #[serde(default = "one")]
    pub reps: u32,
    /// Most stage-stream messages of S3 (its first repetition, per payload size) kept for
    /// S4's replay and S5/S6's template, so that S4's length does not grow with the window.
    #[serde(default = "replay_default")]
    pub replay_stage_messages: usize,
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
    /// S4: stage-record bytes applied per store transaction at most (the listener's
    /// `--batch-bytes`); whichever of this and `ingest_batch` comes first ends a transaction.
    #[serde(default = "batch_bytes_default")]
    pub ingest_batch_bytes: usize,
    /// S5: messages stored before lookups.
    pub lookup_messages: u64,
    /// S5: lookups timed.
    pub lookup_queries: u64,
    /// S6: spans exported.
    pub export_spans: u64,
    /// S7: searches timed per kind of search (five kinds), on a store of `lookup_messages`.
    #[serde(default = "search_default")]
    pub search_queries: u64,
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
            measure_window: Duration::from_secs(5),
            warmup: Duration::from_secs(1),
            reps: 3,
            replay_stage_messages: 5_000,
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
            ingest_batch_bytes: msgtrail_listener::DEFAULT_BATCH_BYTES,
            lookup_messages: 200_000,
            lookup_queries: 10_000,
            export_spans: 100_000,
            search_queries: 200,
            durable: false,
            scenario_timeout: Duration::from_secs(300),
            preset: "default".to_owned(),
        }
    }
}

impl BenchConfig {
    /// How S4, its paced run and S4P cut the stage messages into store transactions: the
    /// listener's rule with `ingest_batch` and `ingest_batch_bytes`.
    pub fn batch_limits(&self) -> msgtrail_listener::BatchLimits {
        msgtrail_listener::BatchLimits {
            messages: self.ingest_batch,
            bytes: self.ingest_batch_bytes,
        }
    }

    /// `--quick`: every scenario with small counts and 300 ms windows after 100 ms of
    /// warm-up, twice: about a minute (CI runs it).
    pub fn quick() -> Self {
        BenchConfig {
            messages: 400,
            measure_window: Duration::from_millis(300),
            warmup: Duration::from_millis(100),
            reps: 2,
            replay_stage_messages: 1_000,
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
            search_queries: 20,
            scenario_timeout: Duration::from_secs(60),
            preset: "quick".to_owned(),
            ..Default::default()
        }
    }

    /// `--large`: S5 and S7 with 10 M stored messages each (one store after the other): about
    /// 100 M records written for S5 (~5 minutes at ~330 k records/s on 2 cores) and ~20 GB
    /// of store on disk (BENCHMARKS.md), about 120 M more for S7's synthetic mix.
    pub fn large(mut self) -> Self {
        self.lookup_messages = 10_000_000;
        self.scenario_timeout = Duration::from_secs(6 * 3600);
        self.preset = format!("{}+large", self.preset);
        self
    }

    /// The span of a saturated run: `None` for fixed-count runs (`measure_window` zero).
    pub fn timed(&self) -> Option<crate::Timed> {
        (!self.measure_window.is_zero()).then_some(crate::Timed {
            warmup: self.warmup,
            window: self.measure_window,
        })
    }

    /// A rough estimate of the whole run's wall clock, printed at the start. Per variant
    /// (and `--durable` doubles it), payload size and repetition: eight saturated runs (S1
    /// publish, fetch + ack, both at once; S1F; S2; S2 batch 1; S3; S3L) of warm-up + window
    /// (a fixed-count run: `messages` at an assumed 10,000 msgs/s), plus about 1 s each of
    /// setup and drain, plus S3's listener catching up (assumed as long as the load); the
    /// latency runs once per payload size (three of `latency_messages` at `latency_rate`);
    /// S4–S6 from their counts at rates measured before (BENCHMARKS.md: ~200 k records/s
    /// ingest, ~300 k records/s fill, ~70 k spans/s export); S7 as a fill of ~12 records a
    /// message at the same rate (the searches are short); S8 two saturated runs per
    /// repetition, plus about 2 s each for the listener's start and catch-up.
    pub fn estimate(&self) -> Duration {
        let load = match self.timed() {
            Some(t) => (t.warmup + t.window).as_secs_f64(),
            None => self.messages as f64 / 10_000.0,
        };
        let per_rep = 8.0 * (load + 1.0) + load;
        let sizes = self.payload_sizes.len() as f64;
        let paced = 3.0 * self.latency_messages as f64 / self.latency_rate;
        let variants = if self.durable && self.nats_url.is_none() {
            2.0
        } else {
            1.0
        };
        let s1_s3 = variants * sizes * (f64::from(self.reps) * per_rep + paced);
        // S4: the mix (~12 records a message) three times, the ten-record workload, the
        // replay; S5: ~10 records a message; S6: three exports.
        let s4 = (self.ingest_messages as f64 * 46.0
            + (self.replay_stage_messages as f64 * 50.0 * self.ingest_copies as f64))
            / 200_000.0;
        let s5 = self.lookup_messages as f64 * 10.0 / 300_000.0;
        let s6 = self.export_spans as f64 * 3.0 / 70_000.0;
        let s7 = self.lookup_messages as f64 * 12.0 / 300_000.0;
        let s8 = f64::from(self.reps) * (2.0 * (load + 1.0) + 2.0);
        Duration::from_secs_f64(s1_s3 + s4 + s5 + s6 + s7 + s8 + 5.0)
    }

    /// Checks the values that would make a scenario meaningless.
    pub fn validate(&self) -> Result<(), crate::BenchError> {
        let bad = |m: &str| Err(crate::BenchError::Config(m.to_owned()));
        if self.messages == 0 && self.measure_window.is_zero() {
            return bad("messages must be at least 1 (or a measured window given)");
        }
        if self.reps == 0 {
            return bad("reps must be at least 1");
        }
        if self.replay_stage_messages == 0 {
            return bad("the replay must keep at least one stage-stream message");
        }
        if self.warmup + self.measure_window >= self.scenario_timeout {
            return bad("warm-up + window must be shorter than the scenario timeout");
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
        if self.ingest_messages == 0
            || self.ingest_copies == 0
            || self.ingest_batch == 0
            || self.ingest_batch_bytes == 0
        {
            return bad("ingest messages, copies and batch must be at least 1");
        }
        if self.lookup_messages == 0 || self.lookup_queries == 0 || self.export_spans == 0 {
            return bad("lookup messages, lookup queries and export spans must be at least 1");
        }
        if self.search_queries == 0 {
            return bad("search queries must be at least 1");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_grows_with_windows_repetitions_and_durable() {
        let d = BenchConfig::default();
        let base = d.estimate();
        let more = BenchConfig {
            reps: 5,
            ..d.clone()
        }
        .estimate();
        let longer = BenchConfig {
            measure_window: Duration::from_secs(10),
            ..d.clone()
        }
        .estimate();
        let durable = BenchConfig {
            durable: true,
            ..d.clone()
        }
        .estimate();
        assert!(more > base && longer > base && durable > base);
        // Three repetitions of 8 runs of 6 s on two payload sizes: at least 288 s of load.
        assert!(base >= Duration::from_secs(288), "{base:?}");
        assert!(BenchConfig::quick().estimate() < Duration::from_secs(120));
        let fixed = BenchConfig {
            measure_window: Duration::ZERO,
            ..d
        };
        assert!(fixed.timed().is_none() && fixed.validate().is_ok());
    }
}
