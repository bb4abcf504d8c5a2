//! # msgtrail-bench
//!
//! The benchmark harness behind `msgtrail bench`: it measures msgtrail against raw JetStream
//! and against itself with stage recording off, side by side in one run, and reports the
//! ratios the project's targets are stated in (BENCHMARKS.md). Benchmarks are not
//! tests: nothing here asserts a speed.
//!
//! ```no_run
//! # async fn demo() -> Result<(), msgtrail_bench::BenchError> {
//! let report = msgtrail_bench::run(msgtrail_bench::BenchConfig::quick(), true).await?;
//! println!("{}", report.table());
//! # Ok(()) }
//! ```
//!
//! ## Layout
//! - `config`: [`BenchConfig`]: counts, payload sizes, producers and consumers; the
//!   `--quick` and `--large` presets.
//! - `measure`: HDR latency summaries, throughput, the measured window of a timed run
//!   (warm-up, then the window), and the progress line on stderr.
//! - `reps`: the median and spread of a scenario's repetitions, ratios over paired
//!   repetitions.
//! - `procfs`: what the kernel says of this process (`/proc/self/io` bytes written, peak
//!   resident set), for S4.
//! - `raw`: S1, raw JetStream with async-nats (publish window, fetch + ack, both at once).
//! - `pipeline`: S2 and S3, the msgtrail pipeline with stage recording off and on (with a
//!   listener running); `pipeline::setup` readies its streams and clients.
//! - `ingest`: S4, listener ingest alone, replaying recorded stage records on one core.
//! - `lookup`: S5, trajectory lookup latency with many stored messages.
//! - `export`: S6, OTLP export of trajectory spans to a local receiver.
//! - `search`: S7, search latency (topic pattern, attribute, state, time range) on a store
//!   of S5's size filled with the synthetic mix.
//! - `observed`: S8, an unmodified JetStream application alone and observed by a listener
//!   (observe mode).
//! - `scaleout`: S4P, two listeners' ingest (one core each) ÷ one listener's, and the cost
//!   of a listener group's fanned-out lookup and search against a single listener's.
//! - `report`: [`Report`], its ratios and target checks, the table and the JSON.
//! - `synth`: a synthetic stage-record workload with a production mix, for S4 and S7.
//! - `run`(mod@run): the order of the scenarios and the nats-servers they run against.
//! - `error`: the harness's error type, [`BenchError`].

mod config;
mod cpu;
mod error;
mod export;
mod ingest;
mod lookup;
mod measure;
mod observed;
mod pipeline;
mod procfs;
mod queryable;
mod raw;
mod report;
mod reps;
mod run;
mod scaleout;
mod search;
mod synth;

pub use config::BenchConfig;
pub use error::BenchError;
pub use measure::{Progress, Timed};
pub use observed::{ObserveResult, ObservedIngest};
pub use pipeline::{run as run_pipeline, ListenerTiming, PipelineParams};
pub use raw::Load;
pub use report::Report;
pub use reps::PairedRatio;
pub use run::run;
pub use scaleout::{ingest_scaling, FanoutResult, ScaleOutResult};
pub use search::{KindResult, SearchResult};
pub use synth::{stage_messages, Mix};
