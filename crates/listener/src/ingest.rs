//! Reading the stage stream: a durable pull consumer, batches applied to the store in one
//! transaction each, acknowledged only after the transaction committed.
//!
//! A crash between commit and ack makes JetStream redeliver the batch; the store skips the
//! records it already holds, so nothing is lost and nothing is applied twice.
//!
//! [`apply`] is shared by both ingest sources: [`run`] here turns stage-stream messages into
//! a [`Batch`], [`crate::evidence`] turns stored messages of the message stream into one
//! (their recovered P2/P3), and each batch is one store transaction followed by the acks.

use crate::batch_limits::{BatchLimits, Chunks};
use crate::clocks::ClockWindow;
use crate::error::ListenerError;
use crate::error::StoreError;
use crate::export::ExportSender;
use crate::stats::Stats;
use crate::store::{ApplyOutcome, Store};
use async_nats::jetstream::consumer::FromConsumer;
use async_nats::jetstream::stream::{ConsumerError, ConsumerErrorKind};
use async_nats::jetstream::{self, consumer, AckKind};
use msgtrail_core::decode_batch;
use msgtrail_core::subjects::STAGE_STREAM;
use msgtrail_core::StageRecord;
use msgtrail_nats::topology::{self, Policy};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Attempts at finding the stage stream and creating the consumer before giving up: a
/// cluster that is still electing its leaders answers with timeouts for a few seconds.
const SETUP_ATTEMPTS: u32 = 8;

/// Creates (or gets) the stage stream and the listener's durable consumer on it, retrying
/// while JetStream is not ready. The listener only reads the stream: it keeps an existing
/// stream's maximum age and never lowers its replicas; `replicas` raises them
/// ([`Policy::reader`]).
pub(crate) async fn consumer(
    js: &jetstream::Context,
    durable: &str,
    batch_size: usize,
    ack_wait: Duration,
    replicas: Option<usize>,
) -> Result<consumer::PullConsumer, ListenerError> {
    let desired = topology::stage_stream(replicas.unwrap_or(1), topology::DEFAULT_STAGE_MAX_AGE);
    let config = consumer::pull::Config {
        durable_name: Some(durable.to_owned()),
        description: Some("msgtrail listener".to_owned()),
        // One reader applies batches in order and acks each with one ack (`apply`).
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait,
        max_ack_pending: (batch_size * 8).max(1024) as i64,
        deliver_policy: consumer::DeliverPolicy::All,
        ..Default::default()
    };
    let mut backoff =
        msgtrail_core::Backoff::new(Duration::from_millis(250), Duration::from_secs(5));
    let mut attempt = 1;
    loop {
        let (transient, error) =
            match topology::ensure_stream(js, &desired, Policy::reader(replicas)).await {
                Ok(stream) => match durable_consumer(&stream, config.clone()).await {
                    Ok(c) => return Ok(c),
                    Err(e) => (
                        e.downcast_ref::<ConsumerError>()
                            .is_some_and(consumer_error_is_transient),
                        ListenerError::nats(format!("durable consumer {durable}"), e),
                    ),
                },
                Err(e) => (
                    e.is_transient(),
                    ListenerError::nats(format!("stage stream {STAGE_STREAM}"), e),
                ),
            };
        if !transient || attempt == SETUP_ATTEMPTS {
            return Err(error);
        }
        tracing::warn!(attempt, error = %msgtrail_core::ErrorChain(&error), "stage stream setup failed; retrying");
        tokio::time::sleep(backoff.next_pause()).await;
        attempt += 1;
    }
}

/// Whether creating a consumer may succeed when tried again (a timeout, no leader yet).
fn consumer_error_is_transient(e: &ConsumerError) -> bool {
    match e.kind() {
        ConsumerErrorKind::TimedOut | ConsumerErrorKind::Request => true,
        ConsumerErrorKind::JetStream(e) => topology::is_transient_code(e.error_code()),
        _ => false,
    }
}

/// Gets or creates a durable pull consumer, and brings the ack wait of an existing one to
/// `config`'s: a listener started with a shorter ack wait than the consumer was created
/// with would otherwise still wait the old one out after a crash.
///
/// An existing consumer with another ack policy (one this branch of the code briefly created
/// with `AckPolicy::All`) is replaced by one that starts right after its ack floor, in stream
/// order; the store skips what it already holds. (JetStream cannot change an ack policy in
/// place.)
pub(crate) async fn durable_consumer(
    stream: &jetstream::stream::Stream,
    config: consumer::pull::Config,
) -> Result<consumer::PullConsumer, async_nats::Error> {
    let name = config.durable_name.clone().unwrap_or_default();
    let mut c: consumer::PullConsumer =
        stream.get_or_create_consumer(&name, config.clone()).await?;
    let info = c.info().await?.clone();
    if info.config.ack_policy != config.ack_policy {
        let start_sequence = info.ack_floor.stream_sequence + 1;
        tracing::info!(
            consumer = %name,
            ack_pending = info.num_ack_pending,
            from = ?info.config.ack_policy,
            to = ?config.ack_policy,
            start_sequence,
            "replacing the consumer: it resumes right after its ack floor, in stream order"
        );
        stream.delete_consumer(&name).await?;
        let resumed = consumer::pull::Config {
            deliver_policy: consumer::DeliverPolicy::ByStartSequence { start_sequence },
            ..config
        };
        return Ok(stream.create_consumer(resumed).await?);
    }
    if info.config.ack_wait != config.ack_wait {
        tracing::info!(consumer = %name, ack_wait_ms = config.ack_wait.as_millis() as u64, "updating the consumer's ack wait");
        // The consumer's own configuration with the new ack wait: its deliver policy may be
        // one this function set when it replaced it, which JetStream cannot update either.
        let updated = consumer::pull::Config {
            ack_wait: config.ack_wait,
            ..consumer::pull::Config::try_from_consumer_config(info.config)?
        };
        c = stream.update_consumer(updated).await?;
    }
    Ok(c)
}

/// Where the stage stream's batches go: the store (with its statistics and the export),
/// and the per-client clock window, which sees each batch before the store does.
#[derive(Debug, Clone)]
pub(crate) struct Sinks {
    /// The store.
    pub store: Arc<Store>,
    /// The statistics.
    pub stats: Arc<Stats>,
    /// The trace export, when configured.
    pub exporter: Option<ExportSender>,
    /// The per-client clock estimates over a recent window.
    pub clocks: Arc<ClockWindow>,
}

/// Applies stage-stream messages until `stop` is cancelled.
pub(crate) async fn run(
    consumer: consumer::PullConsumer,
    sinks: Sinks,
    limits: BatchLimits,
    stop: CancellationToken,
) -> Result<(), ListenerError> {
    let Sinks {
        store,
        stats,
        exporter,
        clocks,
    } = sinks;
    let messages = consumer
        .stream()
        .max_messages_per_batch(limits.messages)
        .heartbeat(Duration::from_secs(5))
        .expires(Duration::from_secs(30))
        .messages()
        .await
        .map_err(|e| ListenerError::nats("stage stream consumer", e))?;
    let mut chunks = Chunks::new(messages, limits);
    loop {
        let chunk = tokio::select! {
            _ = stop.cancelled() => break,
            c = chunks.next() => match c {
                Some(c) => c,
                None => return Err(ListenerError::ConsumerEnded),
            },
        };
        let mut msgs = Vec::with_capacity(chunk.len());
        for m in chunk {
            match m {
                Ok(m) => msgs.push(m),
                Err(e) => tracing::warn!(error = %e, "stage stream consumer error"),
            }
        }
        if msgs.is_empty() {
            continue;
        }
        let batch = decode_stage_messages(msgs, &stats).await;
        // A lock and a map update per exchange record: a small fraction of the batch's store
        // transaction, and apart from it (clocks.rs).
        clocks.observe(&batch.records, msgtrail_core::time::now_nanos());
        apply(batch, &store, &stats, exporter.as_ref(), &stop).await;
    }
    Ok(())
}

/// How often a store transaction still running tells JetStream its messages are in
/// progress; well under the shortest ack wait the configuration allows (1 s).
pub(crate) const PROGRESS_EVERY: Duration = Duration::from_millis(400);

/// Where a [`Batch`] comes from, for the statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// Stage-stream messages (batches of records the broker wrote).
    Stages,
    /// Stored messages of the message stream, their P2/P3 recovered by
    /// [`crate::evidence`]; `without_evidence` of them yielded no record.
    Stored {
        /// Messages that carried no store evidence (acked all the same).
        without_evidence: u64,
    },
    /// Observe mode ([`crate::observe`]): stored messages of an observed stream, or
    /// nats-server's consumer events captured in `MSGTRAIL_OBSERVE`.
    Observed,
}

/// One store transaction's worth of work: the records to apply and the JetStream messages
/// they came from, acknowledged only once the transaction committed. Both ingest sources
/// (the stage stream here, the message stream in [`crate::evidence`]) end in [`apply`].
pub(crate) struct Batch {
    /// Where the messages come from.
    pub source: Source,
    /// The records, in any order.
    pub records: Vec<StageRecord>,
    /// The messages to ack after the commit (or to nak when the store fails).
    pub acks: Vec<jetstream::Message>,
    /// The oldest JetStream stored time among `acks`, Unix nanoseconds (for the lag).
    pub oldest_published: Option<i128>,
    /// Decodes `acks` into the records again, for another attempt after the store failed
    /// (the first attempt consumed `records`).
    pub redecode: Redecode,
}

/// How a [`Batch`]'s messages are decoded into its records again.
pub(crate) type Redecode = Arc<dyn Fn(&[jetstream::Message]) -> Vec<StageRecord> + Send + Sync>;

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("source", &self.source)
            .field("records", &self.records.len())
            .field("acks", &self.acks.len())
            .field("oldest_published", &self.oldest_published)
            .finish_non_exhaustive()
    }
}

impl Batch {
    /// An empty batch from `source`, whose messages `redecode` turns into its records again.
    pub(crate) fn new(
        source: Source,
        redecode: fn(&[jetstream::Message]) -> Vec<StageRecord>,
    ) -> Self {
        Self::with_redecode(source, Arc::new(redecode))
    }

    /// An empty batch from `source` whose messages `redecode` (a closure, which may hold
    /// what decoding needs) turns into its records again.
    pub(crate) fn with_redecode(source: Source, redecode: Redecode) -> Self {
        Batch {
            source,
            records: Vec::new(),
            acks: Vec::new(),
            oldest_published: None,
            redecode,
        }
    }

    /// Adds a message to acknowledge after the commit, noting its stored time.
    pub(crate) fn ack_after_commit(&mut self, m: jetstream::Message) {
        if let Ok(info) = m.info() {
            let p = info.published.unix_timestamp_nanos();
            self.oldest_published = Some(self.oldest_published.map_or(p, |o| o.min(p)));
        }
        self.acks.push(m);
    }
}

/// Decodes stage-stream messages into a batch; a message that can never decode is counted
/// and terminated at once (it would come back forever).
async fn decode_stage_messages(msgs: Vec<jetstream::Message>, stats: &Stats) -> Batch {
    let mut batch = Batch::new(Source::Stages, redecode_stages);
    for m in msgs {
        match decode_batch(&m.payload) {
            Ok(rs) => {
                batch.records.extend(rs);
                batch.ack_after_commit(m);
            }
            Err(e) => {
                tracing::warn!(error = %msgtrail_core::ErrorChain(&e), "undecodable stage batch dropped");
                stats.decode_error();
                if let Err(e) = m.ack_with(AckKind::Term).await {
                    tracing::warn!(error = %e, "term of an undecodable batch failed");
                }
            }
        }
    }
    batch
}

/// How long [`apply`] waits after a failed transaction before it tries the same batch again;
/// doubling up to [`RETRY_MAX`].
pub(crate) const RETRY_FIRST: Duration = Duration::from_millis(100);

/// The longest wait between two attempts at a batch the store could not write.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(2);

/// The records of stage-stream messages already decoded once (undecodable ones were
/// terminated and are not in a batch).
fn redecode_stages(msgs: &[jetstream::Message]) -> Vec<StageRecord> {
    msgs.iter()
        .filter_map(|m| decode_batch(&m.payload).ok())
        .flatten()
        .collect()
}

/// Applies a batch to the store in one transaction, then acknowledges its messages: after
/// the commit, so that a crash loses nothing (JetStream redelivers what was not acked, and
/// the store skips the records it already holds); each message is acked explicitly
/// ([`ack_batch`] says why not one ack per transaction).
///
/// When the store cannot write (a full disk, an I/O error) the batch is kept and tried again
/// until it commits — never skipped — with
/// its messages kept in progress meanwhile: nothing is acked that was not stored, reads go
/// on, the outage is one error line and one recovery line however many attempts fail
/// (`Stats::store_failed`; `/healthz` answers 503 meanwhile), and the store is reopened when
/// the engine needs it after an I/O error ([`Store::recover`]). Returns without acking when
/// `stop` is cancelled during an outage (JetStream redelivers after the restart).
#[tracing::instrument(skip_all, fields(messages = batch.acks.len(), records = batch.records.len()))]
pub(crate) async fn apply(
    batch: Batch,
    store: &Arc<Store>,
    stats: &Arc<Stats>,
    exporter: Option<&ExportSender>,
    stop: &CancellationToken,
) {
    let Batch {
        source,
        records,
        acks,
        oldest_published,
        redecode,
    } = batch;
    if acks.is_empty() && records.is_empty() {
        return;
    }
    let mut records = Some(records);
    let mut wait = RETRY_FIRST;
    loop {
        let now = msgtrail_core::time::now_nanos();
        // The first attempt takes the decoded records; a retry decodes the messages again
        // (they are known to decode), so that the common path copies nothing.
        let recs = records.take().unwrap_or_else(|| redecode(&acks));
        // Stored messages that all carried no evidence need no transaction, only their acks.
        let result =
            if recs.is_empty() && matches!(source, Source::Stored { .. } | Source::Observed) {
                Ok(Ok(None))
            } else {
                store_in_progress(store, recs, now, &acks).await
            };
        let error = match result {
            Ok(Ok(mut outcome)) => {
                if let Some(end) = stats.store_written(now) {
                    tracing::info!(
                        lasted_ms = end.lasted_nanos / 1_000_000,
                        failed_attempts = end.failures,
                        ?source,
                        "the store writes again; the batches held during the outage are stored"
                    );
                }
                let lag_ms = oldest_published.map(|p| (now as i128 - p).max(0) as f64 / 1e6);
                count_applied(
                    stats,
                    source,
                    acks.len() as u64,
                    outcome.as_ref(),
                    lag_ms,
                    now,
                );
                if let (Some(x), Some(o)) = (exporter, outcome.as_mut()) {
                    x.offer(std::mem::take(&mut o.trajectories));
                }
                ack_batch(&acks, source).await;
                return;
            }
            Ok(Err(e)) => e,
            Err(e) => StoreError::Task(e),
        };
        if stats.store_failed(now, &error) {
            tracing::error!(
                error = %msgtrail_core::ErrorChain(&error),
                ?source,
                messages = acks.len(),
                "the store cannot write: holding the batch unacknowledged and trying again every {} s at most until it can (one line when it recovers; /healthz answers 503 meanwhile)",
                RETRY_MAX.as_secs()
            );
        }
        let st = store.clone();
        match tokio::task::spawn_blocking(move || st.recover()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::debug!(error = %msgtrail_core::ErrorChain(&e), "store reopen failed; trying again")
            }
            Err(e) => tracing::debug!(error = %e, "store reopen task failed; trying again"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        progress(&acks).await;
        wait = (wait * 2).min(RETRY_MAX);
    }
}

/// Acknowledges a committed batch: each of its messages (`AckPolicy::Explicit`).
///
/// Not one ack for the batch's highest sequence under `AckPolicy::All`: a pull response lost
/// on the way (a fetch that expired while the server was paused or cut off, whose messages
/// then went to an inbox nobody reads) leaves deliveries this reader never saw, and acking a
/// later message would acknowledge them too, unstored. Explicit acks let JetStream redeliver
/// them after the ack wait (the fault suite's paused nats-server caught exactly that).
async fn ack_batch(acks: &[jetstream::Message], source: Source) {
    for m in acks {
        if let Err(e) = m.ack().await {
            tracing::warn!(error = %e, ?source, "ack failed; the message will be redelivered and its records skipped");
        }
    }
}

/// Tells JetStream that a batch's messages are still in progress (no redelivery yet).
async fn progress(acks: &[jetstream::Message]) {
    for m in acks {
        let _ = m.ack_with(AckKind::Progress).await;
    }
}

/// Applies `records` to the store on a blocking thread; while the transaction runs, tells
/// JetStream every [`PROGRESS_EVERY`] that the batch's messages are in progress, so that the
/// ack wait can stay short (a restart after a crash resumes within it).
async fn store_in_progress(
    store: &Arc<Store>,
    records: Vec<StageRecord>,
    now: u64,
    acks: &[jetstream::Message],
) -> Result<Result<Option<ApplyOutcome>, StoreError>, tokio::task::JoinError> {
    let st = store.clone();
    let mut work = tokio::task::spawn_blocking(move || st.apply(records, now).map(Some));
    loop {
        tokio::select! {
            r = &mut work => break r,
            _ = tokio::time::sleep(PROGRESS_EVERY) => progress(acks).await,
        }
    }
}

/// Counts an applied batch of `messages` from `source` (what the store changed, when it
/// ran) and its lag behind the oldest message's publication.
fn count_applied(
    stats: &Stats,
    source: Source,
    messages: u64,
    outcome: Option<&ApplyOutcome>,
    lag_ms: Option<f64>,
    now: u64,
) {
    match source {
        Source::Stages => {
            // Stage batches always go through the store.
            if let Some(o) = outcome {
                stats.record_batch(messages, o, now);
            }
            if let Some(l) = lag_ms {
                stats.set_last_lag(l);
            }
        }
        Source::Observed => {
            if let Some(o) = outcome {
                stats.record_batch(messages, o, now);
            }
        }
        Source::Stored { without_evidence } => {
            stats.record_stored_batch(messages, without_evidence, outcome, now);
            if let Some(l) = lag_ms {
                stats.set_stored_last_lag(l);
            }
        }
    }
}
