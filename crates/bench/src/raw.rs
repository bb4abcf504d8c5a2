//! S1: raw JetStream with async-nats, no msgtrail in the way — the ceiling msgtrail is
//! measured against.
//!
//! Three runs on a stream of its own (`BENCH_RAW`, file storage like the message stream):
//! - *publish*: `producers` tasks each keep `window` publish acks in flight; completed = a
//!   publish ack received;
//! - *consume*: `consumers` tasks on one durable pull consumer fetch batches and ack each
//!   message explicitly, from a stream filled by the publish run; completed = a message
//!   fetched and its ack sent. In a timed run the stream holds what the timed publish run
//!   stored: the warm-up is the same share of those messages as of the publish run's time,
//!   and the window runs from the end of the warm-up until the stream is drained (shorter
//!   than the configured window when fetching outruns publishing; `consume.seconds` says);
//! - *pipeline*: both at once on an empty stream; each payload carries its send time, so the
//!   consumers measure end-to-end latency; completed = as for *consume*.
//!
//! A timed run ([`crate::measure::Window`]) publishes until its window ends, then lets the
//! consumers drain what was published, counting only what completed inside the window.

use crate::error::BenchError;
use crate::measure::{Countdown, Latency, Progress, Recorder, Throughput, Window};
use async_nats::jetstream::{self, consumer::pull, consumer::AckPolicy, stream};
use bytes::Bytes;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The stream S1 uses.
pub(crate) const RAW_STREAM: &str = "BENCH_RAW";
/// Its subject.
pub(crate) const RAW_SUBJECT: &str = "bench.raw.data";

/// What S1 measured for one payload size.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RawResult {
    /// Payload size, bytes.
    pub payload_bytes: usize,
    /// Publish with a window of acks in flight.
    pub publish: Throughput,
    /// Publish-to-ack latency.
    pub publish_ack: Latency,
    /// Fetch + explicit ack of a filled stream.
    pub consume: Throughput,
    /// Publish and consume at once: messages consumed per second.
    pub pipeline: Throughput,
    /// End-to-end latency (publish call to consumer receipt) in the pipeline run.
    pub e2e: Latency,
    /// The pipeline at a fixed rate.
    pub paced: Paced,
    /// The repetition (0-based) the latencies come from: the one whose `pipeline` rate is
    /// the median (the lower middle one for an even count); the rates are the medians.
    #[serde(default)]
    pub repetition: u32,
    /// `pipeline` msgs/s of each repetition, in run order.
    #[serde(default)]
    pub reps: Vec<f64>,
    /// (max − min) ÷ median of `reps`.
    #[serde(default)]
    pub spread: f64,
    /// `publish` msgs/s of each repetition.
    #[serde(default)]
    pub publish_reps: Vec<f64>,
    /// (max − min) ÷ median of `publish_reps`.
    #[serde(default)]
    pub publish_spread: f64,
    /// `consume` msgs/s of each repetition.
    #[serde(default)]
    pub consume_reps: Vec<f64>,
    /// (max − min) ÷ median of `consume_reps`.
    #[serde(default)]
    pub consume_spread: f64,
}

/// A payload of `size` bytes whose first 8 bytes are the send time (Unix nanoseconds).
pub(crate) fn stamped_payload(size: usize) -> Bytes {
    let mut v = vec![b'x'; size.max(8)];
    v[..8].copy_from_slice(&msgtrail_core::time::now_nanos().to_be_bytes());
    Bytes::from(v)
}

/// The send time a [`stamped_payload`] carries.
pub(crate) fn payload_stamp(p: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(p.get(..8)?.try_into().ok()?))
}

/// Shares `total` among `parts` as evenly as possible.
pub(crate) fn share(total: u64, parts: usize, i: usize) -> u64 {
    let parts = parts as u64;
    total / parts + u64::from((i as u64) < total % parts)
}

/// The shape of a load, the same for S1, S2 and S3 so that they compare.
#[derive(Debug, Clone)]
pub struct Load {
    /// Messages per run.
    pub messages: u64,
    /// Payload size.
    pub payload_bytes: usize,
    /// Producers (S1: publishing tasks), each its own connection in S2/S3.
    pub producers: usize,
    /// Sends (S1: publish acks) in flight per producer.
    pub window: usize,
    /// Consumers (S1: fetching tasks), one group in S2/S3.
    pub consumers: usize,
    /// Messages per fetch.
    pub fetch_batch: usize,
    /// Paced: send at this many messages per second in all (a latency run); `None` sends
    /// as fast as the window allows (a throughput run).
    pub rate: Option<f64>,
    /// Bound of each run.
    pub timeout: Duration,
    /// A timed run (warm-up, then the measured window; `messages` unused); `None`: a
    /// fixed-count run of `messages`.
    pub timed: Option<crate::measure::Timed>,
}

impl Load {
    /// The load of `config` with payloads of `payload_bytes`.
    pub fn of(config: &crate::BenchConfig, payload_bytes: usize) -> Self {
        Load {
            messages: config.messages,
            payload_bytes,
            producers: config.producers,
            window: config.window,
            consumers: config.consumers,
            fetch_batch: config.fetch_batch,
            rate: None,
            timeout: config.scenario_timeout,
            timed: config.timed(),
        }
    }

    /// The latency run of the same shape: `config.latency_messages` at
    /// `config.latency_rate` per second.
    pub fn paced(&self, config: &crate::BenchConfig) -> Self {
        Load {
            messages: config.latency_messages,
            rate: Some(config.latency_rate),
            timed: None,
            ..self.clone()
        }
    }

    /// The progress line's total: `messages`, or 0 for a timed run (no total known).
    pub(crate) fn progress_total(&self) -> u64 {
        if self.timed.is_some() {
            0
        } else {
            self.messages
        }
    }

    /// When one producer sends its message `i` (`None` unpaced: at once).
    pub fn slot(&self, start: tokio::time::Instant, i: u64) -> Option<tokio::time::Instant> {
        let per_producer = self.rate? / self.producers as f64;
        Some(start + Duration::from_secs_f64(i as f64 / per_producer))
    }
}

/// A latency run: a fixed rate well below saturation, so that latency is the path's own
/// and not the queue a saturated run builds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Paced {
    /// Messages per second offered, in all.
    pub rate_per_sec: f64,
    /// Messages.
    pub messages: u64,
    /// End-to-end latency (send call to consumer receipt).
    pub e2e: Latency,
    /// Send latency (S1: publish to ack; S2/S3: upload to store confirmation).
    pub send: Latency,
}

/// Runs S1 for one payload size.
pub(crate) async fn run(
    client: &async_nats::Client,
    p: &Load,
    paced: &Load,
    progress: &Progress,
    label: &str,
) -> Result<RawResult, BenchError> {
    let js = jetstream::new(client.clone());
    let stream = fresh_stream(&js).await?;

    // Publish alone.
    let phase = progress.phase(&format!("{label} S1 publish"), p.progress_total());
    let window = Window::start(p.timed);
    let (publish_ack, published, last) = publish(&js, p, &window, phase.counter()).await?;
    let publish_tp = window.throughput(last);
    drop(phase);

    // Consume alone, from the filled stream.
    let consumer = make_consumer(&stream, "raw-consume").await?;
    // Timed, the stream holds what the timed publish run stored, and consume drains it
    // faster than it was filled: the warm-up is the same share of its messages as of the
    // publish run's time, and the window runs from then until the stream is drained.
    let phase = progress.phase(&format!("{label} S1 consume"), published);
    let warm = p.timed.map_or(0, |t| {
        let share = t.warmup.as_secs_f64() / (t.warmup + t.window).as_secs_f64();
        (published as f64 * share) as u64
    });
    let window = Window::start(None);
    let done = Countdown::new(phase.counter(), published).with_mark(warm);
    let (_, end) = consume(consumer, p, done.clone(), window.clone(), "S1 consume").await?;
    let consume_tp = match done.marked() {
        Some(from) if p.timed.is_some() => Throughput::new(published - warm, end - from),
        _ => window.throughput(end),
    };
    drop(phase);

    // Both at once, on an empty stream: as fast as it goes, then paced (skipped when the
    // paced load has no messages: the repetitions after the first).
    let (e2e, _, pipeline_tp) = pipeline(
        &js,
        &stream,
        p,
        "raw-pipeline",
        progress,
        &format!("{label} S1 pipeline"),
    )
    .await?;
    let (paced_e2e, paced_send) = if paced.messages > 0 {
        let (e, s, _) = pipeline(
            &js,
            &stream,
            paced,
            "raw-paced",
            progress,
            &format!("{label} S1 paced"),
        )
        .await?;
        (e, s)
    } else {
        (Recorder::default(), Recorder::default())
    };
    let _ = js.delete_stream(RAW_STREAM).await;
    Ok(RawResult {
        payload_bytes: p.payload_bytes,
        publish: publish_tp,
        publish_ack: publish_ack.summary(),
        consume: consume_tp,
        pipeline: pipeline_tp,
        e2e: e2e.summary(),
        paced: Paced {
            rate_per_sec: paced.rate.unwrap_or_default(),
            messages: paced.messages,
            e2e: paced_e2e.summary(),
            send: paced_send.summary(),
        },
        ..Default::default()
    })
}

/// Publishes and consumes at once on the emptied stream; returns the end-to-end and
/// publish latencies and the throughput.
async fn pipeline(
    js: &jetstream::Context,
    stream: &stream::Stream,
    p: &Load,
    consumer_name: &str,
    progress: &Progress,
    label: &str,
) -> Result<(Recorder, Recorder, Throughput), BenchError> {
    stream.purge().await.map_err(BenchError::nats)?;
    let consumer = make_consumer(stream, consumer_name).await?;
    let (e2e, send, _, tp) = pipeline_with(js, consumer, p, progress, label).await?;
    Ok((e2e, send, tp))
}

/// Publishes and consumes at once through `consumer` (S1's pipeline, and S8's raw
/// JetStream application); returns the end-to-end and publish latencies, how many messages
/// were published in all (warm-up and drain included) and the throughput.
pub(crate) async fn pipeline_with(
    js: &jetstream::Context,
    consumer: jetstream::consumer::PullConsumer,
    p: &Load,
    progress: &Progress,
    label: &str,
) -> Result<(Recorder, Recorder, u64, Throughput), BenchError> {
    let phase = progress.phase(label, p.progress_total());
    let window = Window::start(p.timed);
    let done = counting(p, phase.counter());
    let consumers = tokio::spawn({
        let (p, done, window) = (p.clone(), done.clone(), window.clone());
        async move { consume(consumer, &p, done, window, "S1 pipeline").await }
    });
    let (send, published, _) = publish(js, p, &window, Arc::new(AtomicU64::new(0))).await?;
    done.close(published);
    let (e2e, end) = consumers.await.map_err(|e| BenchError::Nats(e.into()))??;
    Ok((e2e, send, published, window.throughput(end)))
}

/// The consumers' count of a run: towards `p.messages`, or open until the publishers of a
/// timed run stop and close it with what they published.
fn counting(p: &Load, done: Arc<AtomicU64>) -> Countdown {
    if p.timed.is_some() {
        Countdown::open(done)
    } else {
        Countdown::new(done, p.messages)
    }
}

/// A durable pull consumer with explicit acks, as an application makes it (no
/// `sample_freq`).
pub(crate) async fn make_consumer(
    stream: &stream::Stream,
    name: &str,
) -> Result<jetstream::consumer::PullConsumer, BenchError> {
    stream
        .create_consumer(pull::Config {
            durable_name: Some(name.to_owned()),
            ack_policy: AckPolicy::Explicit,
            max_ack_pending: 100_000,
            ..Default::default()
        })
        .await
        .map_err(BenchError::nats)
}

/// S1F: the S1 pipeline with the publishers using fast-ingest batches (ADR-50, one
/// JetStream ack per batch of `p.window` messages, one batch in flight per producer) — the
/// limit a JetStream expert reaches on this server. Throughput only (`None` on a server
/// before 2.14).
pub(crate) async fn run_fast(
    client: &async_nats::Client,
    p: &Load,
    progress: &Progress,
    label: &str,
) -> Result<Option<Throughput>, BenchError> {
    use msgtrail_nats::fast_ingest::{enable_on_stream, server_supports, FastIngest, FastMessage};
    if !server_supports(&client.server_info().version) {
        return Ok(None);
    }
    let nats = |e: msgtrail_nats::fast_ingest::FastIngestError| BenchError::Nats(e.into());
    let js = jetstream::new(client.clone());
    let stream = fresh_stream(&js).await?;
    enable_on_stream(client, RAW_STREAM).await.map_err(nats)?;
    let consumer = make_consumer(&stream, "raw-fast").await?;
    let phase = progress.phase(&format!("{label} S1F pipeline"), p.progress_total());
    let window = Window::start(p.timed);
    let done = counting(p, phase.counter());
    let consumers = tokio::spawn({
        let (p, done, window) = (p.clone(), done.clone(), window.clone());
        async move { consume(consumer, &p, done, window, "S1F pipeline").await }
    });
    let producers: Vec<_> = (0..p.producers)
        .map(|i| {
            let (client, p, window) = (client.clone(), p.clone(), window.clone());
            tokio::spawn(async move {
                let fast = FastIngest::unproven(client, RAW_STREAM, p.timeout)
                    .await
                    .map_err(nats)?;
                let mut left = share(p.messages, p.producers, i);
                let mut stored = 0u64;
                while if window.is_timed() {
                    !window.over()
                } else {
                    left > 0
                } {
                    let n = if window.is_timed() {
                        p.window.max(1) as u64
                    } else {
                        left.min(p.window.max(1) as u64)
                    };
                    let batch = (0..n)
                        .map(|_| FastMessage {
                            subject: RAW_SUBJECT.to_owned(),
                            headers: async_nats::HeaderMap::new(),
                            payload: stamped_payload(p.payload_bytes),
                        })
                        .collect();
                    // What the server did not store is sent again (the raw path has no
                    // dedup; the consumers count what arrives).
                    let count = fast.publish(batch).await.map_err(nats)?.count as u64;
                    left = left.saturating_sub(count);
                    stored += count;
                }
                Ok::<_, BenchError>(stored)
            })
        })
        .collect();
    let mut published = 0;
    for t in producers {
        published += t.await.map_err(|e| BenchError::Nats(e.into()))??;
    }
    done.close(published);
    let (_, end) = consumers.await.map_err(|e| BenchError::Nats(e.into()))??;
    drop(phase);
    let _ = js.delete_stream(RAW_STREAM).await;
    Ok(Some(window.throughput(end)))
}

/// The raw scenarios' stream, created afresh (any earlier one of that name deleted first):
/// file storage, one subject.
pub(crate) async fn fresh_stream(js: &jetstream::Context) -> Result<stream::Stream, BenchError> {
    let _ = js.delete_stream(RAW_STREAM).await;
    js.create_stream(stream::Config {
        name: RAW_STREAM.to_owned(),
        subjects: vec![RAW_SUBJECT.to_owned()],
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await
    .map_err(BenchError::nats)
}

/// Publishes from `p.producers` tasks, each with `p.window` acks in flight: `p.messages` in
/// all, or until `window` is over in a timed run; returns the publish-to-ack latencies
/// (inside the window), how many were published (acked) in all, and when the last ack came.
async fn publish(
    js: &jetstream::Context,
    p: &Load,
    window: &Window,
    done: Arc<AtomicU64>,
) -> Result<(Recorder, u64, Instant), BenchError> {
    let mut tasks = Vec::new();
    for i in 0..p.producers {
        let (js, done, load, window) = (js.clone(), done.clone(), p.clone(), window.clone());
        let (n, in_flight, size) = (share(p.messages, p.producers, i), p.window, p.payload_bytes);
        tasks.push(tokio::spawn(async move {
            let mut rec = Recorder::default();
            let mut acks = FuturesUnordered::new();
            let t0 = tokio::time::Instant::now();
            let mut k = 0u64;
            let mut acked = 0u64;
            let timed = window.is_timed();
            while if timed { !window.over() } else { k < n } {
                // Waiting for the slot, keep taking acks so that their latency is exact.
                if let Some(at) = load.slot(t0, k) {
                    loop {
                        tokio::select! {
                            _ = tokio::time::sleep_until(at) => break,
                            Some(r) = acks.next(), if !acks.is_empty() => {
                                note(&mut rec, &done, &window, r)?;
                                acked += 1;
                            }
                        }
                    }
                }
                while acks.len() >= in_flight {
                    if let Some(r) = acks.next().await {
                        note(&mut rec, &done, &window, r)?;
                        acked += 1;
                    }
                }
                let sent = Instant::now();
                let ack = js
                    .publish(RAW_SUBJECT, stamped_payload(size))
                    .await
                    .map_err(BenchError::nats)?;
                acks.push(async move { (sent, ack.await) });
                k += 1;
            }
            while let Some(r) = acks.next().await {
                note(&mut rec, &done, &window, r)?;
                acked += 1;
            }
            Ok::<_, BenchError>((rec, acked, Instant::now()))
        }));
    }
    let mut all = Recorder::default();
    let (mut published, mut last) = (0, Instant::now());
    let deadline = tokio::time::Instant::now() + p.timeout;
    for t in tasks {
        let (rec, acked, end) = tokio::time::timeout_at(deadline, t)
            .await
            .map_err(|_| BenchError::Timeout {
                scenario: "S1 publish".into(),
                secs: p.timeout.as_secs(),
                done: done.load(Ordering::Relaxed),
                total: p.messages,
            })?
            .map_err(|e| BenchError::Nats(e.into()))??;
        all.merge(&rec);
        published += acked;
        last = last.max(end);
    }
    Ok((all, published, last))
}

fn note<T, E: Into<msgtrail_core::BoxError>>(
    rec: &mut Recorder,
    done: &AtomicU64,
    window: &Window,
    (sent, r): (Instant, Result<T, E>),
) -> Result<(), BenchError> {
    r.map_err(BenchError::nats)?;
    if window.note() {
        rec.record(sent.elapsed());
    }
    done.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Fetches and acks from `p.consumers` tasks until `done` reaches its total; returns the
/// end-to-end latencies (of the messages acked inside `window`) and when the last message
/// was acked.
async fn consume(
    consumer: jetstream::consumer::PullConsumer,
    p: &Load,
    done: Countdown,
    window: Window,
    scenario: &str,
) -> Result<(Recorder, Instant), BenchError> {
    let deadline = tokio::time::Instant::now() + p.timeout;
    let mut tasks = Vec::new();
    for _ in 0..p.consumers {
        let (consumer, done, window) = (consumer.clone(), done.clone(), window.clone());
        let batch = p.fetch_batch;
        tasks.push(tokio::spawn(async move {
            let mut rec = Recorder::default();
            while !done.is_done() && tokio::time::Instant::now() < deadline {
                let mut msgs = consumer
                    .batch()
                    .max_messages(batch)
                    .expires(Duration::from_millis(100))
                    .messages()
                    .await
                    .map_err(BenchError::nats)?;
                while let Some(m) = msgs.next().await {
                    let m = m.map_err(BenchError::nats)?;
                    // End to end is send to receipt; the message completes with its ack.
                    let now = msgtrail_core::time::now_nanos();
                    let age_us = payload_stamp(&m.payload).map(|t| now.saturating_sub(t) / 1000);
                    m.ack().await.map_err(BenchError::nats)?;
                    if let (true, Some(us)) = (window.note(), age_us) {
                        rec.record_micros(us);
                    }
                    done.one();
                }
            }
            Ok::<_, BenchError>(rec)
        }));
    }
    let mut all = Recorder::default();
    for t in tasks {
        all.merge(&t.await.map_err(|e| BenchError::Nats(e.into()))??);
    }
    match done.finished() {
        Some(end) => Ok((all, end)),
        None => Err(BenchError::Timeout {
            scenario: scenario.to_owned(),
            secs: p.timeout.as_secs(),
            done: done.done(),
            total: match done.total() {
                u64::MAX => p.messages,
                t => t,
            },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_and_differ_by_at_most_one() {
        for (total, parts) in [(10, 3), (3, 4), (20_000, 4), (1, 1)] {
            let s: Vec<u64> = (0..parts).map(|i| share(total, parts, i)).collect();
            assert_eq!(s.iter().sum::<u64>(), total);
            assert!(s.iter().max().unwrap() - s.iter().min().unwrap() <= 1);
        }
    }

    #[test]
    fn payload_carries_its_send_time() {
        let before = msgtrail_core::time::now_nanos();
        let p = stamped_payload(128);
        assert_eq!(p.len(), 128);
        let t = payload_stamp(&p).unwrap();
        assert!(t >= before && t <= msgtrail_core::time::now_nanos());
        assert_eq!(payload_stamp(b"short"), None);
    }
}
