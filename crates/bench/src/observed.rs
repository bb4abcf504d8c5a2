//! S8: what observe mode costs an unmodified JetStream application. The application is S1's
//! pipeline (`producers` publishers with `window` acks in flight, `consumers` fetching
//! batches from one durable pull consumer and acking each message; [`crate::raw`]), run
//! twice per repetition against the same server, interleaved like the other saturated
//! scenarios:
//! - *raw*: alone;
//! - *observed*: with an in-process listener observing its stream
//!   (`msgtrail listener --observe BENCH_RAW --observe-set-sample-freq`: the listener's
//!   headers-only consumer on the stream, nats-server's ack metrics and advisories captured
//!   in `MSGTRAIL_OBSERVE`), on the same cores. The load starts once the listener has set
//!   the application's consumer's `sample_freq` to 100 %, so every ack in the window emits
//!   its metric.
//!
//! After the observed load the listener is given until its ingest stops growing to store
//! what nats-server emitted; its records per published message say how much of every
//! message's trajectory observe mode recovered.

use crate::error::BenchError;
use crate::measure::{Progress, Throughput};
use crate::raw::{self, Load, RAW_STREAM};
use crate::reps::{median, spread, PairedRatio};
use async_nats::jetstream::{self, stream};
use msgtrail_listener::{ListenerConfig, ListenerHandle, ObserveConfig};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// How long the listener's ingest must stay unchanged after the load to count as caught up.
const SETTLED: Duration = Duration::from_millis(500);

/// What the observing listener did in one observed run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ObservedIngest {
    /// Messages the application published in the run (warm-up and drain included).
    pub published: u64,
    /// Records the listener stored.
    pub records: u64,
    /// Records stored per published message.
    pub records_per_message: f64,
    /// Shadow messages in the store (one per stored message the listener saw).
    pub messages: u64,
    /// Of those, consumed (an ack metric seen).
    pub consumed: u64,
    /// Seconds from the end of the load until the ingest stopped growing.
    pub catch_up_seconds: f64,
    /// Store failures during the run.
    pub store_errors: u64,
}

/// What S8 measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ObserveResult {
    /// Payload size, bytes (the first configured).
    pub payload_bytes: usize,
    /// The application alone: messages consumed (fetched and acked) per second, the median
    /// of the repetitions.
    pub raw: Throughput,
    /// The application observed.
    pub observed: Throughput,
    /// `raw` msgs/s of each repetition, in run order.
    pub raw_reps: Vec<f64>,
    /// `observed` msgs/s of each repetition.
    pub observed_reps: Vec<f64>,
    /// (max − min) ÷ median of `raw_reps`.
    pub raw_spread: f64,
    /// (max − min) ÷ median of `observed_reps`.
    pub observed_spread: f64,
    /// observed ÷ raw over paired repetitions.
    pub paired: PairedRatio,
    /// The observing listener of each repetition.
    pub listener: Vec<ObservedIngest>,
    /// Records stored per published message, the median of the repetitions.
    pub records_per_message: f64,
}

impl ObserveResult {
    /// The medians of the repetitions (`raw` and `observed` paired by index), each
    /// repetition's rate, the spreads and the paired ratios.
    pub(crate) fn from_reps(
        payload_bytes: usize,
        raw: Vec<Throughput>,
        observed: Vec<(Throughput, ObservedIngest)>,
    ) -> Self {
        let raw_reps: Vec<f64> = raw.iter().map(|t| t.per_sec).collect();
        let observed_reps: Vec<f64> = observed.iter().map(|(t, _)| t.per_sec).collect();
        let pick = |all: &[Throughput], rates: &[f64]| {
            let mut t = all
                .get(crate::reps::median_index(rates))
                .cloned()
                .unwrap_or_default();
            t.per_sec = median(rates);
            t
        };
        let observed_tp: Vec<Throughput> = observed.iter().map(|(t, _)| t.clone()).collect();
        let listener: Vec<ObservedIngest> = observed.into_iter().map(|(_, l)| l).collect();
        let per: Vec<f64> = listener.iter().map(|l| l.records_per_message).collect();
        ObserveResult {
            payload_bytes,
            raw: pick(&raw, &raw_reps),
            observed: pick(&observed_tp, &observed_reps),
            raw_spread: spread(&raw_reps),
            observed_spread: spread(&observed_reps),
            paired: PairedRatio::of(&observed_reps, &raw_reps),
            records_per_message: median(&per),
            raw_reps,
            observed_reps,
            listener,
        }
    }

    /// observed ÷ raw msgs/s, of the medians (0 without a raw rate).
    pub fn ratio(&self) -> f64 {
        if self.raw.per_sec > 0.0 {
            self.observed.per_sec / self.raw.per_sec
        } else {
            0.0
        }
    }
}

/// A fresh application stream and its consumer.
async fn app(
    js: &jetstream::Context,
) -> Result<(stream::Stream, jetstream::consumer::PullConsumer), BenchError> {
    let s = raw::fresh_stream(js).await?;
    let c = raw::make_consumer(&s, "app").await?;
    Ok((s, c))
}

/// Starts a listener observing the application's stream, setting `sample_freq`.
async fn start_listener(
    url: &str,
    rep: u32,
    dir: &std::path::Path,
) -> Result<ListenerHandle, BenchError> {
    let mut observe = ObserveConfig::streams([RAW_STREAM]);
    observe.set_sample_freq = true;
    observe.discovery_interval = Duration::from_millis(500);
    msgtrail_listener::start(ListenerConfig {
        nats: msgtrail_client::NatsOptions::url(url.to_owned()),
        data_dir: dir.to_owned(),
        http_addr: "127.0.0.1:0".parse().expect("valid address"),
        durable_name: format!("bench-s8-r{rep}"),
        observe: Some(observe),
        ..Default::default()
    })
    .await
    .map_err(|e| BenchError::Listener(e.into()))
}

/// Waits until the application's consumer samples every ack (the listener set it).
async fn sampled(
    consumer: &mut jetstream::consumer::PullConsumer,
    timeout: Duration,
) -> Result<(), BenchError> {
    let deadline = Instant::now() + timeout;
    loop {
        let info = consumer.info().await.map_err(BenchError::nats)?;
        if info.config.sample_frequency >= 100 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(BenchError::Timeout {
                scenario: "S8 listener setting sample_freq".into(),
                secs: timeout.as_secs(),
                done: u64::from(info.config.sample_frequency),
                total: 100,
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the listener's stored records stop growing for [`SETTLED`], then reads what
/// it did and stops it.
async fn settle(
    handle: ListenerHandle,
    published: u64,
    load_end: Instant,
    timeout: Duration,
) -> Result<ObservedIngest, BenchError> {
    let deadline = Instant::now() + timeout;
    let (mut last, mut since) = (u64::MAX, Instant::now());
    loop {
        let now = handle.stats(None).ingest.records;
        if now != last {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() >= SETTLED || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let catch_up_seconds = (since - load_end.min(since)).as_secs_f64();
    let s = handle.stats(None);
    let totals = handle
        .store()
        .state_totals()
        .map_err(|e| BenchError::Listener(e.into()))?;
    handle
        .shutdown()
        .await
        .map_err(|e| BenchError::Listener(e.into()))?;
    Ok(ObservedIngest {
        published,
        records: s.ingest.records,
        records_per_message: s.ingest.records as f64 / published.max(1) as f64,
        messages: totals.values().sum(),
        consumed: totals
            .get(&msgtrail_core::trajectory::MessageState::Consumed)
            .copied()
            .unwrap_or(0),
        catch_up_seconds,
        store_errors: s.ingest.store_errors,
    })
}

/// One repetition: the application alone, then observed; returns both rates and what the
/// listener did.
async fn repetition(
    client: &async_nats::Client,
    url: &str,
    load: &Load,
    rep: u32,
    progress: &Progress,
    label: &str,
) -> Result<(Throughput, (Throughput, ObservedIngest)), BenchError> {
    let js = jetstream::new(client.clone());
    let (_, consumer) = app(&js).await?;
    let (_, _, _, raw_tp) =
        raw::pipeline_with(&js, consumer, load, progress, &format!("{label} S8 raw")).await?;

    let (_, mut consumer) = app(&js).await?;
    let dir = tempfile::Builder::new()
        .prefix("msgtrail-bench-observe-")
        .tempdir()?;
    let handle = start_listener(url, rep, dir.path()).await?;
    sampled(&mut consumer, Duration::from_secs(30).min(load.timeout)).await?;
    let (_, _, published, observed_tp) = raw::pipeline_with(
        &js,
        consumer,
        load,
        progress,
        &format!("{label} S8 observed"),
    )
    .await?;
    let ingest = settle(handle, published, Instant::now(), load.timeout).await?;
    // The next repetition's listener must not replay this one's events (same stream
    // sequences); the listener creates the events stream again.
    let _ = js.delete_stream(RAW_STREAM).await;
    let _ = js
        .delete_stream(msgtrail_nats::topology::OBSERVE_STREAM)
        .await;
    Ok((raw_tp, (observed_tp, ingest)))
}

/// Runs S8 `reps` times (raw, then observed, each repetition) with `load` against `url`.
pub(crate) async fn run(
    client: &async_nats::Client,
    url: &str,
    load: &Load,
    reps: u32,
    progress: &Progress,
) -> Result<ObserveResult, BenchError> {
    let mut raw_runs = Vec::new();
    let mut observed = Vec::new();
    for rep in 0..reps {
        let label = format!("{} B rep {}/{reps}", load.payload_bytes, rep + 1);
        let (r, o) = repetition(client, url, load, rep, progress, &label).await?;
        raw_runs.push(r);
        observed.push(o);
    }
    Ok(ObserveResult::from_reps(
        load.payload_bytes,
        raw_runs,
        observed,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(per_sec: f64) -> Throughput {
        Throughput {
            count: per_sec as u64,
            seconds: 1.0,
            per_sec,
            cpu: None,
        }
    }

    fn ingest(published: u64, records: u64) -> ObservedIngest {
        ObservedIngest {
            published,
            records,
            records_per_message: records as f64 / published as f64,
            ..Default::default()
        }
    }

    #[test]
    fn medians_spreads_and_the_ratio_over_paired_repetitions() {
        let r = ObserveResult::from_reps(
            128,
            vec![tp(100.0), tp(120.0), tp(110.0)],
            vec![
                (tp(90.0), ingest(100, 300)),
                (tp(96.0), ingest(100, 400)),
                (tp(55.0), ingest(100, 350)),
            ],
        );
        assert_eq!(r.raw.per_sec, 110.0);
        assert_eq!(r.observed.per_sec, 90.0);
        assert!((r.ratio() - 90.0 / 110.0).abs() < 1e-12);
        assert_eq!(r.paired.reps, vec![0.9, 0.8, 0.5]);
        assert_eq!((r.paired.min, r.paired.max), (0.5, 0.9));
        assert!((r.raw_spread - 20.0 / 110.0).abs() < 1e-12);
        assert_eq!(r.records_per_message, 3.5);
        assert_eq!(r.listener.len(), 3);
        assert_eq!(ObserveResult::default().ratio(), 0.0);
    }
}
