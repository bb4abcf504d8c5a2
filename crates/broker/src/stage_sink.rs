//! The stage sink: the only writer of the stage stream (docs/ARCHITECTURE.md §3, decisions 3 and 4).
//!
//! Handlers call [`StageSink::record`], which never waits: the record goes into a bounded
//! buffer, or is dropped and counted when the buffer is full. One writer task drains the
//! buffer into batches (up to `stage_batch_max` records or `stage_batch_linger` of waiting)
//! and publishes each batch as one JetStream message in the compact binary encoding (stage
//! stream version 2, [`msgtrail_core::frame::encode_stage_batch`]), with a window of publish
//! acks in flight. A batch the stage stream does not take (no leader during an election, a
//! lost connection) is published again with backoff, in order, until it is stored; only a
//! full retry queue or a shutdown that cannot drain it gives records up, counted in
//! `stage_publish_failed`. Every record is also a `tracing` event with target
//! `msgtrail::stage` (level DEBUG).
//!
//! Partitioned (`--stage-partitions`, for a group of listeners), a batch is split by
//! partition (`msgtrail_core::partition`) and each part published on its partition's
//! subject `msgtrail.stages.<p>`; otherwise every batch goes on the legacy `msgtrail.stages`.

use crate::metrics::Metrics;
use bytes::Bytes;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use msgtrail_core::frame::encode_stage_batch;
use msgtrail_core::partition;
use msgtrail_core::subjects::STAGE_SUBJECT;
use msgtrail_core::Backoff;
use msgtrail_core::Emitter;
use msgtrail_core::{BrokerInstance, StageRecord};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// Publish acks awaited concurrently by the writer.
const ACK_WINDOW: usize = 64;

/// What handlers hand the writer: a record, or a request to be told when every record
/// handed before it is stored.
#[derive(Debug)]
// Records are nearly every item: boxing them would cost an allocation per record to save the
// queue slots of the rare waiter.
#[allow(clippy::large_enum_variant)]
enum Item {
    Record(StageRecord),
    Stored(oneshot::Sender<()>),
}

/// Whether and where the sink writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SinkMode {
    /// Records are only traced, never written.
    Off,
    /// Every batch on the legacy `msgtrail.stages`.
    Legacy,
    /// Batches split by partition on `msgtrail.stages.<p>`.
    Partitioned,
}

impl SinkMode {
    /// The mode a broker's configuration asks for.
    pub(crate) fn of(config: &crate::BrokerConfig) -> Self {
        match (config.record_stages, config.stage_partitions) {
            (false, _) => SinkMode::Off,
            (true, false) => SinkMode::Legacy,
            (true, true) => SinkMode::Partitioned,
        }
    }
}

/// A cheap handle to hand stage records to the writer.
#[derive(Debug, Clone)]
pub(crate) struct StageSink {
    tx: Option<mpsc::Sender<Item>>,
    /// This broker process, stamped on the records it times itself.
    instance: BrokerInstance,
    metrics: Arc<Metrics>,
}

impl StageSink {
    /// Starts the writer task; it ends after every sink clone is dropped and the buffer is
    /// flushed. With [`SinkMode::Off`], records are only traced, never written.
    pub(crate) fn start(
        js: async_nats::jetstream::Context,
        instance: BrokerInstance,
        metrics: Arc<Metrics>,
        buffer: usize,
        batch_max: usize,
        linger: Duration,
        mode: SinkMode,
    ) -> (StageSink, JoinHandle<()>) {
        let partitioned = mode == SinkMode::Partitioned;
        if mode == SinkMode::Off {
            let sink = StageSink {
                tx: None,
                instance,
                metrics,
            };
            return (sink, tokio::spawn(async {}));
        }
        let (tx, rx) = mpsc::channel(buffer);
        let writer = tokio::spawn(write_batches(
            js,
            rx,
            metrics.clone(),
            batch_max,
            linger,
            partitioned,
        ));
        (
            StageSink {
                tx: Some(tx),
                instance,
                metrics,
            },
            writer,
        )
    }

    /// Resolves once every record handed to this sink before the call is stored in the stage
    /// stream, or after `within` (false then; the writer keeps retrying in the background).
    /// Without recording it resolves at once. The writer publishes at once, without its
    /// linger, for a caller waiting here.
    ///
    /// Why: a broker that answers a settle while the records of it (C8, the consumer's
    /// ride-along C6/X1/X2/C7) wait in its memory loses them when it is killed right after
    /// its reply; settles wait for them to be stored, uploads do not (a stored message
    /// carries its own store evidence, and P1/P4 losses leave the trajectory complete).
    pub(crate) async fn stored(&self, within: Duration) -> bool {
        let Some(tx) = &self.tx else { return true };
        let (done, wait) = oneshot::channel();
        if tx.try_send(Item::Stored(done)).is_err() {
            return false;
        }
        matches!(tokio::time::timeout(within, wait).await, Ok(Ok(())))
    }

    /// Whether records are written at all (stage recording is on).
    pub(crate) fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Records a stage without waiting. A record of a broker stage (timed by this broker's
    /// clock) gets this broker's instance; a client's record (relayed, or a P1 written from
    /// an upload entry's `sent_at`) keeps none: its time is on the client's clock, and an
    /// offset pairs it with the broker-written records of its exchange (docs/PROTOCOL.md §12).
    pub(crate) fn record(&self, mut rec: StageRecord) {
        rec.broker = (rec.stage.emitter() == Emitter::Broker).then(|| self.instance.clone());
        tracing::debug!(
            target: "msgtrail::stage",
            stage = %rec.stage,
            message_id = rec.message_id.map(|m| m.to_string()),
            request_id = rec.request_id.as_ref().map(|r| r.as_str()),
            producer = rec.producer.as_ref().map(|r| r.as_str()),
            consumer = rec.consumer.as_ref().map(|r| r.as_str()),
            group = rec.group.as_ref().map(|r| r.as_str()),
            attempt = rec.attempt,
            outcome = rec.outcome.as_deref(),
            "stage"
        );
        let Some(tx) = &self.tx else { return };
        match tx.try_send(Item::Record(rec)) {
            Ok(()) => Metrics::inc(&self.metrics.stage_records),
            Err(_) => Metrics::inc(&self.metrics.stage_dropped),
        }
    }
}

/// A stage-stream message waiting for its publish ack, or for another try.
struct Pending {
    /// The order in which the writer sent it, from 1.
    seq: u64,
    /// The subject: the legacy one, or the partition's of its records.
    subject: async_nats::Subject,
    bytes: Bytes,
    records: u64,
    tries: u32,
}

/// Callers waiting for records to be stored: each waits for every batch up to `seq`. A batch
/// given up counts as done for them (they are answered; the loss is counted).
#[derive(Default)]
struct Waiters {
    /// Batches acked, by sequence, beyond `stored_upto`.
    acked: std::collections::BTreeSet<u64>,
    /// Every batch up to this one is stored.
    stored_upto: u64,
    waiting: VecDeque<(u64, oneshot::Sender<()>)>,
}

impl Waiters {
    fn acked(&mut self, seq: u64) {
        self.acked.insert(seq);
        while self.acked.remove(&(self.stored_upto + 1)) {
            self.stored_upto += 1;
        }
        while self
            .waiting
            .front()
            .is_some_and(|(upto, _)| *upto <= self.stored_upto)
        {
            if let Some((_, w)) = self.waiting.pop_front() {
                let _ = w.send(());
            }
        }
    }

    fn wait(&mut self, upto: u64, w: oneshot::Sender<()>) {
        if upto <= self.stored_upto {
            let _ = w.send(());
        } else {
            self.waiting.push_back((upto, w));
        }
    }
}

/// First pause before a failed batch is published again; doubles up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(100);
/// Longest pause between tries of a failed batch: short, so that a batch refused during a
/// stage-stream leader election is stored within half a second of the new leader (settles
/// wait for it, `crate::settle::STORED_WAIT`).
const RETRY_MAX: Duration = Duration::from_millis(500);
/// Failed batches kept for another try (about 2.5 M records at full batches); beyond it the
/// oldest is given up and counted in `stage_publish_failed`.
const RETRY_QUEUE: usize = 10_000;
/// How long the writer keeps retrying after the last sink is dropped (shutdown).
const DRAIN: Duration = Duration::from_secs(5);

/// Why a stage batch was not stored (publishing it or JetStream's ack), kept for the log.
type PublishError = async_nats::jetstream::context::PublishError;

type AckFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = (Pending, Result<(), PublishError>)> + Send>,
>;

async fn publish(
    js: &async_nats::jetstream::Context,
    p: Pending,
) -> Result<AckFuture, (Pending, PublishError)> {
    match js.publish(p.subject.clone(), p.bytes.clone()).await {
        Ok(ack) => Ok(Box::pin(async move {
            let res = ack.await.map(|_| ());
            (p, res)
        })),
        Err(e) => Err((p, e)),
    }
}

/// The writer's side of the stage stream: acks in flight, failed batches waiting for
/// another try, and callers waiting for their records to be stored.
struct StageWriter {
    js: async_nats::jetstream::Context,
    metrics: Arc<Metrics>,
    acks: FuturesUnordered<AckFuture>,
    retry: VecDeque<(tokio::time::Instant, Pending)>,
    waiters: Waiters,
    /// Batches sent so far (the sequence of the last one).
    sent: u64,
    /// The failures since the stage stream last stored a batch, logged once per episode.
    outage: Outage,
    /// Whether batches are split by partition (module docs).
    partitioned: bool,
}

/// The writer task: one `select!` over publish acks, due retries and new records; a new
/// record starts a batch that [`fill_batch`] completes and [`StageWriter::send_batch`] publishes.
async fn write_batches(
    js: async_nats::jetstream::Context,
    mut rx: mpsc::Receiver<Item>,
    metrics: Arc<Metrics>,
    batch_max: usize,
    linger: Duration,
    partitioned: bool,
) {
    let mut w = StageWriter {
        js,
        metrics,
        acks: FuturesUnordered::new(),
        retry: VecDeque::new(),
        waiters: Waiters::default(),
        sent: 0,
        outage: Outage::default(),
        partitioned,
    };
    let mut batch = Vec::with_capacity(batch_max);
    let mut open = true;
    let mut drain_until = None;
    loop {
        if w.finished(open, drain_until) {
            break;
        }
        let next_retry = w.retry.front().map(|(at, _)| *at);
        // Someone waits for what is queued: publish without the linger.
        let mut urgent: Vec<oneshot::Sender<()>> = Vec::new();
        tokio::select! {
            biased;
            Some((p, res)) = w.acks.next(), if !w.acks.is_empty() => {
                w.on_ack(p, res);
                continue;
            }
            _ = sleep_until(next_retry), if next_retry.is_some() => {
                w.retry_due().await;
                continue;
            }
            first = rx.recv(), if open => {
                match first {
                    None => {
                        open = false;
                        drain_until = Some(tokio::time::Instant::now() + DRAIN);
                        continue;
                    }
                    Some(Item::Record(r)) => batch.push(r),
                    Some(Item::Stored(waiter)) => urgent.push(waiter),
                }
            }
        }
        fill_batch(&mut rx, &mut batch, &mut urgent, batch_max, linger).await;
        w.send_batch(&mut batch).await;
        // Every batch sent so far holds records handed before these waiters.
        for waiter in urgent {
            w.waiters.wait(w.sent, waiter);
        }
        w.keep_ack_window().await;
    }
    report_lost(&w.metrics, &w.retry);
}

impl StageWriter {
    /// Whether the writer stops: the last sink is gone and nothing is left to publish, or
    /// the drain time after it is over.
    fn finished(&self, open: bool, drain_until: Option<tokio::time::Instant>) -> bool {
        if !open && self.acks.is_empty() && self.retry.is_empty() {
            return true;
        }
        !open && drain_until.is_some_and(|d| tokio::time::Instant::now() >= d)
    }

    /// A publish ack came back: the batch is stored, or is queued for another try.
    fn on_ack(&mut self, p: Pending, res: Result<(), PublishError>) {
        match note_ack(&self.metrics, p, res) {
            Ok(seq) => {
                self.outage.stored(tokio::time::Instant::now());
                self.waiters.acked(seq)
            }
            Err((again, e)) => {
                self.outage
                    .failed(tokio::time::Instant::now(), &again, "not stored", &e);
                schedule(&self.metrics, &mut self.retry, &mut self.waiters, again)
            }
        }
    }

    /// Publishes the oldest failed batch again (its time has come).
    async fn retry_due(&mut self) {
        let (_, p) = self.retry.pop_front().expect("a retry is due");
        Metrics::inc(&self.metrics.stage_publish_retries);
        match publish(&self.js, p).await {
            Ok(ack) => self.acks.push(ack),
            Err((p, e)) => {
                self.outage
                    .failed(tokio::time::Instant::now(), &p, "not sent", &e);
                schedule(&self.metrics, &mut self.retry, &mut self.waiters, p);
            }
        }
    }

    /// Encodes and publishes the batch (if any) as the next stage-stream message, leaving
    /// `batch` empty; a publish that fails at once is queued for another try.
    async fn send_batch(&mut self, batch: &mut Vec<StageRecord>) {
        if batch.is_empty() {
            return;
        }
        if !self.partitioned {
            let bytes = encode_stage_batch(batch.iter()).into();
            let records = batch.len() as u64;
            batch.clear();
            return self.send_part(STAGE_SUBJECT.into(), bytes, records).await;
        }
        for (p, part) in partition::split(batch.drain(..)) {
            let bytes = encode_stage_batch(part.iter()).into();
            self.send_part(p.subject().into(), bytes, part.len() as u64)
                .await;
        }
    }

    /// Publishes one stage-stream message, or schedules it for another try.
    async fn send_part(&mut self, subject: async_nats::Subject, bytes: Bytes, records: u64) {
        self.sent += 1;
        let pending = Pending {
            seq: self.sent,
            subject,
            records,
            bytes,
            tries: 0,
        };
        match publish(&self.js, pending).await {
            Ok(ack) => self.acks.push(ack),
            Err((p, e)) => {
                self.outage
                    .failed(tokio::time::Instant::now(), &p, "not sent", &e);
                schedule(&self.metrics, &mut self.retry, &mut self.waiters, p);
            }
        }
    }

    /// Waits for acks until fewer than [`ACK_WINDOW`] are in flight.
    async fn keep_ack_window(&mut self) {
        while self.acks.len() >= ACK_WINDOW {
            if let Some((p, res)) = self.acks.next().await {
                self.on_ack(p, res);
            }
        }
    }
}

/// Adds to `batch` what is already queued, then waits out the linger for more: until the
/// batch is full, the linger is over, or someone waits for the records to be stored.
async fn fill_batch(
    rx: &mut mpsc::Receiver<Item>,
    batch: &mut Vec<StageRecord>,
    urgent: &mut Vec<oneshot::Sender<()>>,
    batch_max: usize,
    linger: Duration,
) {
    let deadline = tokio::time::Instant::now() + linger;
    while batch.len() < batch_max {
        // What is already there, without a timer per record; then wait out the linger
        // (unless someone waits for these records to be stored).
        while batch.len() < batch_max {
            match rx.try_recv() {
                Ok(Item::Record(r)) => batch.push(r),
                Ok(Item::Stored(w)) => urgent.push(w),
                Err(_) => break,
            }
        }
        if batch.len() >= batch_max || !urgent.is_empty() {
            break;
        }
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(Item::Record(r))) => batch.push(r),
            Ok(Some(Item::Stored(w))) => urgent.push(w),
            _ => break,
        }
    }
}

/// Counts and logs the records still waiting for a retry when the writer stops.
fn report_lost(metrics: &Metrics, retry: &VecDeque<(tokio::time::Instant, Pending)>) {
    let lost: u64 = retry.iter().map(|(_, p)| p.records).sum();
    if lost > 0 {
        metrics
            .stage_publish_failed
            .fetch_add(lost, Ordering::Relaxed);
        tracing::error!(records = lost, "stage records not stored before shutdown");
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Queues a failed batch for another try, with backoff; gives up the oldest when full.
fn schedule(
    metrics: &Metrics,
    retry: &mut VecDeque<(tokio::time::Instant, Pending)>,
    waiters: &mut Waiters,
    mut p: Pending,
) {
    p.tries += 1;
    let pause = Backoff::new(RETRY_FIRST, RETRY_MAX).nth(p.tries);
    if retry.len() >= RETRY_QUEUE {
        if let Some((_, old)) = retry.pop_front() {
            metrics
                .stage_publish_failed
                .fetch_add(old.records, Ordering::Relaxed);
            tracing::error!(
                records = old.records,
                "stage batch given up: the retry queue is full"
            );
            // Nothing more will come of it: waiters must not wait on it for ever.
            waiters.acked(old.seq);
        }
    }
    // Batches keep their order of first failure; a later one never overtakes an earlier one.
    let at = tokio::time::Instant::now() + pause;
    let at = retry.back().map_or(at, |(last, _)| at.max(*last));
    retry.push_back((at, p));
}

/// Counts an acked batch (its sequence), or hands a failed one back for another try.
fn note_ack(
    metrics: &Metrics,
    p: Pending,
    res: Result<(), PublishError>,
) -> Result<u64, (Pending, PublishError)> {
    match res {
        Ok(()) => {
            Metrics::inc(&metrics.stage_batches);
            Ok(p.seq)
        }
        Err(e) => Err((p, e)),
    }
}

/// How often an outage that goes on is logged again, with its counts so far.
const OUTAGE_REMINDER: Duration = Duration::from_secs(60);

/// A stretch of time in which the stage stream takes no batch (a leader election, a lost
/// connection): one WARN when it starts, one more every [`OUTAGE_REMINDER`] while it lasts,
/// and one INFO with the counts when a batch is stored again — instead of a line per retry
/// (thousands in a few seconds of an election).
#[derive(Debug, Default)]
struct Outage {
    /// When the first failure of the current outage happened; `None` while all is well.
    since: Option<tokio::time::Instant>,
    /// When it was last logged.
    logged: Option<tokio::time::Instant>,
    /// Failed publishes (first tries and retries) in it.
    failures: u64,
    /// Distinct batches that failed in it (a batch's first failure).
    batches: u64,
    /// The records of those batches.
    records: u64,
}

impl Outage {
    /// A publish of `p` failed (`what`: not sent, or not stored); logs when the outage
    /// starts or is due a reminder. Returns whether it logged.
    fn failed(
        &mut self,
        now: tokio::time::Instant,
        p: &Pending,
        what: &str,
        error: &dyn std::fmt::Display,
    ) -> bool {
        self.failures += 1;
        // `tries` counts the earlier failures: zero on a batch's first.
        if p.tries == 0 {
            self.batches += 1;
            self.records += p.records;
        }
        let since = *self.since.get_or_insert(now);
        let due = self.logged.is_none_or(|at| now >= at + OUTAGE_REMINDER);
        if !due {
            return false;
        }
        self.logged = Some(now);
        tracing::warn!(
            failures = self.failures,
            batches = self.batches,
            records = self.records,
            for_ms = (now - since).as_millis() as u64,
            error = %error,
            "stage batch {what}; retrying (one line per minute until the stage stream stores again)"
        );
        true
    }

    /// A batch was stored: ends the outage, if any, with one line of its counts. Returns
    /// whether it logged.
    fn stored(&mut self, now: tokio::time::Instant) -> bool {
        let Some(since) = self.since else {
            return false;
        };
        tracing::info!(
            failures = self.failures,
            batches = self.batches,
            records = self.records,
            for_ms = (now - since).as_millis() as u64,
            "stage stream stores again; the failed batches are retried in order"
        );
        *self = Outage::default();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_is_logged_when_it_starts_once_a_minute_and_when_it_ends() {
        let mut o = Outage::default();
        let t0 = tokio::time::Instant::now();
        let batch = |tries| Pending {
            seq: 1,
            subject: STAGE_SUBJECT.into(),
            records: 10,
            bytes: Bytes::new(),
            tries,
        };
        assert!(!o.stored(t0), "no outage: nothing to say");
        assert!(o.failed(t0, &batch(0), "not stored", &"no leader"));
        // A thousand retries within the minute: no line.
        for i in 0..1000u32 {
            let at = t0 + Duration::from_millis(u64::from(i) * 50);
            assert!(!o.failed(at, &batch(1 + i % 5), "not stored", &"no leader"));
        }
        assert!(!o.failed(
            t0 + Duration::from_secs(59),
            &batch(0),
            "not sent",
            &"no leader"
        ));
        assert!(o.failed(
            t0 + Duration::from_secs(61),
            &batch(2),
            "not stored",
            &"no leader"
        ));
        assert_eq!((o.failures, o.batches, o.records), (1003, 2, 20));
        assert!(o.stored(t0 + Duration::from_secs(62)));
        assert!(o.since.is_none() && o.failures == 0);
        assert!(
            !o.stored(t0 + Duration::from_secs(63)),
            "one line per outage"
        );
        assert!(o.failed(
            t0 + Duration::from_secs(64),
            &batch(0),
            "not stored",
            &"again"
        ));
    }

    #[test]
    fn waiters_are_told_once_every_batch_up_to_theirs_is_stored() {
        let mut w = Waiters::default();
        let (a, mut a_rx) = oneshot::channel();
        let (b, mut b_rx) = oneshot::channel();
        let (now, mut now_rx) = oneshot::channel();
        w.wait(0, now);
        assert!(
            now_rx.try_recv().is_ok(),
            "nothing sent yet: stored at once"
        );
        w.wait(2, a);
        w.wait(3, b);
        // Batch 2 is acked before batch 1 (a retry of 1 is still out): nobody is told.
        w.acked(2);
        assert!(a_rx.try_recv().is_err());
        w.acked(1);
        assert!(a_rx.try_recv().is_ok(), "1 and 2 stored");
        assert!(b_rx.try_recv().is_err());
        w.acked(3);
        assert!(b_rx.try_recv().is_ok());
        assert_eq!(w.stored_upto, 3);
        // A batch given up (marked done) does not hold back later waiters.
        let (c, mut c_rx) = oneshot::channel();
        w.wait(5, c);
        w.acked(5);
        assert!(c_rx.try_recv().is_err(), "4 is still out");
        w.acked(4); // given up
        assert!(c_rx.try_recv().is_ok());
    }
}
