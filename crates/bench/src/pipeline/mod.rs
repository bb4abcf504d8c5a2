//! S2 and S3: the msgtrail pipeline — producers upload through a broker in this process,
//! consumers of one group fetch and process (ack) through it — with stage recording off
//! (S2: the broker writes no stage stream and the clients report nothing) and on (S3: every
//! stage recorded, clients reporting). The listener ingests the stage stream either after
//! the load (S3: on production hardware it runs on its own machine, so it does not share the
//! throughput window; its catch-up time is reported) or during it (S3L: everything on the same
//! cores, today's worst case, reported separately). S2 also runs with one message per upload
//! and settle request (`batch_messages: Some(1)`), so the gain of batching stays visible.
//!
//! Each payload carries its send time, so consumers measure end-to-end latency (send call to
//! receipt), the same definition as S1's pipeline run.
//!
//! A timed run ([`crate::measure::Window`]) sends until its window ends, then lets the
//! consumers drain every confirmed upload. Completed = a message processed by a consumer and
//! its ack confirmed by the broker (`Consumer::process` returned); the send rate counts
//! uploads confirmed. Only completions inside the window count, and end-to-end latency is
//! that of the messages completed inside it.

mod setup;

use crate::error::BenchError;
use crate::measure::{Countdown, Latency, Progress, Recorder, Throughput, Window};
use crate::raw::{payload_stamp, share, stamped_payload, Load, Paced};
use async_nats::jetstream;
use bytes::Bytes;
use futures::StreamExt;
use msgtrail_broker::{BrokerConfig, ClientEntry, ClientRegistry, RunningBroker};
use msgtrail_client::{Consumer, Identity, NatsOptions, Producer};
use msgtrail_core::subjects::STAGE_STREAM;
use msgtrail_core::wire::Subscription;
use msgtrail_core::{ClientId, GroupId, Role};
use serde::{Deserialize, Serialize};
use setup::{connect_consumers, connect_producers, purge_streams};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Everything one S2 or S3 run needs.
#[derive(Debug, Clone)]
pub struct PipelineParams {
    /// The NATS server.
    pub nats_url: String,
    /// The throughput run.
    pub load: Load,
    /// The latency run after it, on the same broker and clients.
    pub paced: Load,
    /// Stage recording on (S3) or off (S2).
    pub record_stages: bool,
    /// When the listener runs (recording on only).
    pub listener: ListenerTiming,
    /// Messages per upload and settle request: `None` the SDK's default batching, `Some(1)`
    /// one message per request.
    pub batch_messages: Option<usize>,
    /// The broker stores upload batches as fast-ingest batches when the server has them
    /// ([`BrokerConfig::fast_ingest`]); off: one PubAck per message.
    pub fast_ingest: bool,
    /// Names the run's topic, group and listener durable (`s2_128`).
    pub tag: String,
}

/// When the listener ingests the stage stream, relative to the measured load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ListenerTiming {
    /// No listener (recording off).
    #[default]
    None,
    /// Started when the load ends: it does not share the throughput window (S3).
    After,
    /// Running during the load, on the same cores (S3L).
    During,
}

/// The broker's counters after a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BrokerCounts {
    /// Messages stored.
    pub uploads: u64,
    /// Deliveries.
    pub deliveries: u64,
    /// Acks.
    pub acks: u64,
    /// Redeliveries.
    pub redeliveries: u64,
    /// Stage records accepted into the sink.
    pub stage_records: u64,
    /// Stage-stream messages written.
    pub stage_batches: u64,
    /// Stage records dropped (buffer full).
    pub stage_dropped: u64,
    /// Stage records lost to refused stage-stream writes.
    pub stage_publish_failed: u64,
    /// Client stage records relayed.
    pub relayed_records: u64,
    /// Of them, relayed from inside their delivery's settle (settle batch version 2).
    #[serde(default)]
    pub own_records: u64,
    /// Stage reports the clients sent on their own (one request each), not riding along.
    #[serde(default)]
    pub stage_reports: u64,
    /// Upload requests (one per message without batching).
    pub upload_requests: u64,
    /// Settle requests.
    pub settle_requests: u64,
    /// Fast-ingest batches the broker published (one JetStream ack each).
    #[serde(default)]
    pub fast_batches: u64,
    /// Uploads a fast-ingest batch did not store, published again with a PubAck each.
    #[serde(default)]
    pub fast_batch_fallbacks: u64,
}

/// What the listener did during an S3 run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ListenerIngest {
    /// Records stored.
    pub records: u64,
    /// Stage-stream messages applied.
    pub batches: u64,
    /// Stored messages read as store evidence (P2/P3 from the message stream).
    pub stored_messages: u64,
    /// When the listener ran.
    pub timing: ListenerTiming,
    /// Seconds from the end of the load (the latency run, after the throughput run) until
    /// the listener had applied every stage-stream message the broker wrote and the store
    /// evidence of every stored message. With [`ListenerTiming::After`] the listener starts at
    /// the end of the load, so this is its whole ingest time.
    pub catch_up_seconds: f64,
    /// Stage-stream messages that could not be decoded.
    pub decode_errors: u64,
    /// Store failures.
    pub store_errors: u64,
}

/// What one S2 or S3 run measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PipelineResult {
    /// Payload size, bytes.
    pub payload_bytes: usize,
    /// Stage recording on.
    pub record_stages: bool,
    /// Uploads confirmed per second (producers' view).
    pub send: Throughput,
    /// Upload round trip (send call to store confirmation).
    pub send_latency: Latency,
    /// Messages processed and acked per second, from the first send to the last ack.
    pub throughput: Throughput,
    /// End-to-end latency (send call to consumer receipt).
    pub e2e: Latency,
    /// The latency run at a fixed rate.
    pub paced: Paced,
    /// The broker's counters (both runs).
    pub broker: BrokerCounts,
    /// Stage-stream messages per stored message.
    pub stage_messages_per_message: f64,
    /// Stage records per stored message.
    pub stage_records_per_message: f64,
    /// The listener (S3 only).
    pub listener: Option<ListenerIngest>,
    /// Uploads confirmed in the throughput run, warm-up and drain included (the latency
    /// run's are not).
    #[serde(default)]
    pub sent: u64,
    /// `throughput` msgs/s of each repetition, in run order.
    #[serde(default)]
    pub reps: Vec<f64>,
    /// (max − min) ÷ median of `reps`.
    #[serde(default)]
    pub spread: f64,
    /// The repetition (0-based) every other field comes from: the one whose throughput is
    /// the median (the lower middle one for an even count). `throughput.per_sec` is the
    /// median itself; `paced` is always the first repetition's (the only one with a latency
    /// run), and `broker` counts it only when this is 0.
    #[serde(default)]
    pub repetition: u32,
}

fn id(s: &str) -> Result<ClientId, BenchError> {
    ClientId::new(s).map_err(BenchError::Id)
}

fn timeout_err(p: &PipelineParams, what: &str, done: u64) -> BenchError {
    BenchError::Timeout {
        scenario: format!("{} {what}", p.tag),
        secs: p.load.timeout.as_secs(),
        done,
        total: p.load.messages,
    }
}

/// Runs S2 (`record_stages` off) or S3 (on, with a listener) once.
pub async fn run(p: &PipelineParams, progress: &Progress) -> Result<PipelineResult, BenchError> {
    let producers: Vec<Identity> = (0..p.load.producers)
        .map(|i| Ok(Identity::generate(id(&format!("bench-p{i}"))?)))
        .collect::<Result<_, BenchError>>()?;
    let consumers: Vec<Identity> = (0..p.load.consumers)
        .map(|i| Ok(Identity::generate(id(&format!("bench-c{i}"))?)))
        .collect::<Result<_, BenchError>>()?;
    let entries = producers
        .iter()
        .map(|i| (Role::Producer, i))
        .chain(consumers.iter().map(|i| (Role::Consumer, i)))
        .map(|(role, i)| ClientEntry {
            id: i.client_id.clone(),
            role,
            public_key: i.public_key(),
            topics: vec![">".into()],
            service_name: None,
        })
        .collect();
    let config = BrokerConfig {
        nats: NatsOptions::url(p.nats_url.clone()),
        clients: ClientRegistry::new(entries).map_err(|e| BenchError::Broker(e.into()))?,
        record_stages: p.record_stages,
        fast_ingest: p.fast_ingest,
        ..Default::default()
    };
    let broker = msgtrail_broker::start(config)
        .await
        .map_err(|e| BenchError::Broker(e.into()))?;
    let result = run_with_broker(p, &broker, producers, consumers, progress).await;
    let (measured, paced, listener) = match result {
        Ok(v) => v,
        Err(e) => {
            broker.shutdown().await;
            return Err(e);
        }
    };
    let metrics = broker.metrics.clone();
    broker.shutdown().await;
    let broker = broker_counts(&metrics);
    let listener = match listener {
        Some((handle, _dir, load_end)) => Some(
            listener_catch_up(p, handle, broker.stage_batches, broker.uploads, load_end).await?,
        ),
        None => None,
    };
    let per = |n: u64| n as f64 / broker.uploads.max(1) as f64;
    Ok(PipelineResult {
        payload_bytes: p.load.payload_bytes,
        record_stages: p.record_stages,
        send: measured.send,
        send_latency: measured.send_latency,
        throughput: measured.throughput,
        e2e: measured.e2e,
        paced: Paced {
            rate_per_sec: p.paced.rate.unwrap_or_default(),
            messages: p.paced.messages,
            e2e: paced.e2e,
            send: paced.send_latency,
        },
        stage_messages_per_message: per(broker.stage_batches),
        stage_records_per_message: per(broker.stage_records),
        broker,
        listener,
        sent: measured.sent,
        ..Default::default()
    })
}

/// The broker's counters after a run.
fn broker_counts(metrics: &msgtrail_broker::Metrics) -> BrokerCounts {
    let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
    BrokerCounts {
        uploads: g(&metrics.uploads),
        deliveries: g(&metrics.deliveries),
        acks: g(&metrics.acks),
        redeliveries: g(&metrics.redeliveries),
        stage_records: g(&metrics.stage_records),
        stage_batches: g(&metrics.stage_batches),
        stage_dropped: g(&metrics.stage_dropped),
        stage_publish_failed: g(&metrics.stage_publish_failed),
        relayed_records: g(&metrics.relayed_records),
        own_records: g(&metrics.own_records),
        stage_reports: g(&metrics.stage_reports),
        upload_requests: g(&metrics.upload_requests),
        settle_requests: g(&metrics.settle_requests),
        fast_batches: g(&metrics.fast_batches),
        fast_batch_fallbacks: g(&metrics.fast_batch_fallbacks),
    }
}

#[derive(Default)]
struct Measured {
    send: Throughput,
    send_latency: Latency,
    throughput: Throughput,
    e2e: Latency,
    /// Uploads confirmed in all.
    sent: u64,
}

type RunningListener = (
    msgtrail_listener::ListenerHandle,
    tempfile::TempDir,
    Instant,
);

async fn run_with_broker(
    p: &PipelineParams,
    _broker: &RunningBroker,
    producer_ids: Vec<Identity>,
    consumer_ids: Vec<Identity>,
    progress: &Progress,
) -> Result<(Measured, Measured, Option<RunningListener>), BenchError> {
    let admin = async_nats::connect(p.nats_url.as_str())
        .await
        .map_err(BenchError::nats)?;
    purge_streams(&jetstream::new(admin.clone())).await?;
    let listener = if p.listener == ListenerTiming::During {
        Some(start_listener(p, &admin).await?)
    } else {
        None
    };

    let topic = format!("bench.{}", p.tag);
    let sub = Subscription {
        group: GroupId::new(format!("bench-{}", p.tag.replace('_', "-")))
            .map_err(BenchError::Id)?,
        topic: topic.clone(),
        filter: Default::default(),
        message_id: None,
    };
    let producers = connect_producers(p, producer_ids).await?;
    let consumers = connect_consumers(p, consumer_ids, &sub).await?;

    let name = scenario_name(p);
    let b = p.load.payload_bytes;
    let run = Drive {
        p,
        producers: &producers,
        consumers: &consumers,
        sub: &sub,
        topic: &topic,
    };
    let measured = run
        .drive(&p.load, progress, &format!("{name} {b} B"))
        .await?;
    let paced = if p.paced.messages > 0 {
        run.drive(&p.paced, progress, &format!("{name} {b} B paced"))
            .await?
    } else {
        Measured::default()
    };
    for pr in producers {
        let _ = pr.close().await;
    }
    for c in consumers {
        let _ = c.close().await;
    }
    let load_end = Instant::now();
    let listener = match listener {
        Some(l) => Some(l),
        None if p.listener == ListenerTiming::After => Some(start_listener(p, &admin).await?),
        None => None,
    };
    Ok((measured, paced, listener.map(|(h, d)| (h, d, load_end))))
}

/// The scenario's name in progress lines: S2, S2 batch 1, S3 or S3L.
fn scenario_name(p: &PipelineParams) -> &'static str {
    match (p.record_stages, p.listener, p.batch_messages) {
        (false, _, Some(1)) => "S2 batch 1",
        (false, ..) => "S2",
        (true, ListenerTiming::During, _) => "S3L",
        (true, ..) => "S3",
    }
}

/// Starts a listener on its own store, reading the stage stream from the start.
async fn start_listener(
    p: &PipelineParams,
    admin: &async_nats::Client,
) -> Result<(msgtrail_listener::ListenerHandle, tempfile::TempDir), BenchError> {
    let dir = tempfile::Builder::new()
        .prefix("msgtrail-bench-listener-")
        .tempdir()?;
    let config = msgtrail_listener::ListenerConfig {
        nats: msgtrail_client::NatsOptions::url(p.nats_url.clone()),
        data_dir: dir.path().to_owned(),
        http_addr: "127.0.0.1:0".parse().expect("valid address"),
        durable_name: format!("bench-{}", p.tag),
        ..Default::default()
    };
    let handle = msgtrail_listener::start_with_client(config, admin.clone())
        .await
        .map_err(|e| BenchError::Listener(e.into()))?;
    Ok((handle, dir))
}

/// The clients of one run, driving loads through the broker.
struct Drive<'a> {
    p: &'a PipelineParams,
    producers: &'a [Producer],
    consumers: &'a [Consumer],
    sub: &'a Subscription,
    topic: &'a str,
}

impl Drive<'_> {
    async fn drive(
        &self,
        load: &Load,
        progress: &Progress,
        label: &str,
    ) -> Result<Measured, BenchError> {
        let p = self.p;
        let phase = progress.phase(label, load.progress_total());
        let consumed = match load.timed {
            Some(_) => Countdown::open(phase.counter()),
            None => Countdown::new(phase.counter(), load.messages),
        };
        let window = Window::start(load.timed);
        let send_window = window.sibling();
        let deadline = tokio::time::Instant::now() + load.timeout;
        let consumer_tasks: Vec<_> = self
            .consumers
            .iter()
            .map(|c| {
                tokio::spawn(consume(
                    c.clone(),
                    self.sub.clone(),
                    load.fetch_batch,
                    consumed.clone(),
                    window.clone(),
                    deadline,
                ))
            })
            .collect();
        let sent = Arc::new(AtomicU64::new(0));
        let producer_tasks: Vec<_> = self
            .producers
            .iter()
            .enumerate()
            .map(|(i, pr)| {
                let n = match load.timed {
                    Some(_) => u64::MAX,
                    None => share(load.messages, load.producers, i),
                };
                tokio::spawn(produce(
                    pr.clone(),
                    self.topic.to_owned(),
                    load.clone(),
                    n,
                    sent.clone(),
                    send_window.clone(),
                ))
            })
            .collect();
        let mut send_latency = Recorder::default();
        for t in producer_tasks {
            let r = tokio::time::timeout_at(deadline, t)
                .await
                .map_err(|_| timeout_err(p, "send", sent.load(Ordering::Relaxed)))?
                .map_err(|e| BenchError::Broker(e.into()))??;
            send_latency.merge(&r);
        }
        let sent = sent.load(Ordering::SeqCst);
        let send = send_window.throughput(Instant::now());
        consumed.close(sent);
        let mut e2e = Recorder::default();
        for t in consumer_tasks {
            e2e.merge(&t.await.map_err(|e| BenchError::Broker(e.into()))??);
        }
        let end = consumed
            .finished()
            .ok_or_else(|| timeout_err(p, "consume", consumed.done()))?;
        Ok(Measured {
            send,
            send_latency: send_latency.summary(),
            throughput: window.throughput(end),
            e2e: e2e.summary(),
            sent,
        })
    }
}

/// Sends `n` messages (a timed run: `u64::MAX`, until `window` is over), `load.window` in
/// flight; returns the upload round trips of the confirmations inside the window.
async fn produce(
    producer: Producer,
    topic: String,
    load: Load,
    n: u64,
    sent: Arc<AtomicU64>,
    window: Window,
) -> Result<Recorder, BenchError> {
    let mut rec = Recorder::default();
    let (size, t0) = (load.payload_bytes, tokio::time::Instant::now());
    let sends = futures::stream::iter(0..n)
        .take_while(|_| futures::future::ready(!window.over()))
        .then(|i| {
            let at = load.slot(t0, i);
            async move {
                if let Some(at) = at {
                    tokio::time::sleep_until(at).await;
                }
            }
        })
        .map(|_| {
            let (producer, topic) = (&producer, &topic);
            async move {
                let t = Instant::now();
                producer
                    .send(topic, stamped_payload(size))
                    .await
                    .map(|_| t.elapsed())
            }
        })
        .buffer_unordered(load.window);
    let mut sends = std::pin::pin!(sends);
    while let Some(r) = sends.next().await {
        let took = r?;
        if window.note() {
            rec.record(took);
        }
        sent.fetch_add(1, Ordering::SeqCst);
    }
    Ok(rec)
}

async fn consume(
    consumer: Consumer,
    sub: Subscription,
    batch: usize,
    done: Countdown,
    window: Window,
    deadline: tokio::time::Instant,
) -> Result<Recorder, BenchError> {
    let mut rec = Recorder::default();
    while !done.is_done() && tokio::time::Instant::now() < deadline {
        let msgs = consumer
            .fetch(&sub, batch as u32, Duration::from_millis(200))
            .await?;
        // End to end is send to receipt; a message completes when its ack is confirmed.
        let now = msgtrail_core::time::now_nanos();
        let ages: Vec<Option<u64>> = msgs
            .iter()
            .map(|m| payload_stamp(&m.payload).map(|t| now.saturating_sub(t) / 1000))
            .collect();
        let settled = futures::future::join_all(
            msgs.into_iter()
                .map(|m| consumer.process(m, |_| async { Ok::<(), String>(()) })),
        )
        .await;
        for (s, age) in settled.into_iter().zip(ages) {
            s?.map_err(|e| BenchError::Broker(e.into()))?;
            if let (true, Some(us)) = (window.note(), age) {
                rec.record_micros(us);
            }
            done.one();
        }
    }
    Ok(rec)
}

async fn listener_catch_up(
    p: &PipelineParams,
    handle: msgtrail_listener::ListenerHandle,
    stage_batches: u64,
    stored: u64,
    load_end: Instant,
) -> Result<ListenerIngest, BenchError> {
    let deadline = Instant::now() + p.load.timeout;
    loop {
        let s = handle.stats(None);
        let caught_up = s.ingest.batches >= stage_batches && s.ingest.stored_messages >= stored;
        if caught_up || Instant::now() > deadline {
            let out = ListenerIngest {
                timing: p.listener,
                records: s.ingest.records,
                batches: s.ingest.batches,
                stored_messages: s.ingest.stored_messages,
                catch_up_seconds: load_end.elapsed().as_secs_f64(),
                decode_errors: s.ingest.decode_errors,
                store_errors: s.ingest.store_errors,
            };
            handle
                .shutdown()
                .await
                .map_err(|e| BenchError::Listener(e.into()))?;
            if !caught_up {
                return Err(BenchError::Timeout {
                    scenario: format!("{} listener ingest", p.tag),
                    secs: p.load.timeout.as_secs(),
                    done: out.batches,
                    total: stage_batches,
                });
            }
            return Ok(out);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The first `max` stage-stream messages now in the stream (the payloads, in order): what S4
/// replays.
pub(crate) async fn stage_batches(
    client: &async_nats::Client,
    max: usize,
) -> Result<Vec<Bytes>, BenchError> {
    let js = jetstream::new(client.clone());
    let mut stream = js
        .get_stream(STAGE_STREAM)
        .await
        .map_err(BenchError::nats)?;
    let state = stream.info().await.map_err(BenchError::nats)?.state.clone();
    let mut out = Vec::with_capacity((state.messages as usize).min(max));
    if state.messages == 0 {
        return Ok(out);
    }
    for seq in state.first_sequence..=state.last_sequence {
        if out.len() >= max {
            break;
        }
        match stream.get_raw_message(seq).await {
            Ok(m) => out.push(m.payload),
            Err(e) => tracing::debug!(seq, error = %e, "stage message gone"),
        }
    }
    Ok(out)
}
