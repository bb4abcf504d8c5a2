//! Store evidence: P2 (upload received, ID assigned) and P3 (stored) recovered from the
//! stored message itself, so that they survive a broker crash or a stage-stream outage
//! (docs/ARCHITECTURE.md §3, decision 6).
//!
//! When stage recording is on, the broker stamps every message it stores in
//! `MSGTRAIL_MESSAGES` with its store evidence: the `Msgtrail-Stored` header
//! (`msgtrail_core::stored`, docs/PROTOCOL.md §14.1) holds the request ID, producer service,
//! upload attempt, when the broker received the upload (Unix nanoseconds) and the broker's
//! service, next to `Nats-Msg-Id` (`<producer>:<request id>`), `Msgtrail-Message-Id`,
//! `Msgtrail-Attr-<key>`, `traceparent` and optionally `Msgtrail-Payload-Head`. Messages of
//! earlier brokers carry the same fields in separate headers (`Msgtrail-Received-At`,
//! `Msgtrail-Broker-Service`, `Msgtrail-Request-Id`, `Msgtrail-Producer`, `Msgtrail-Topic`,
//! `Msgtrail-Attempt`); both layouts are read. Those headers are stored atomically with the
//! message, and JetStream records when it stored it: together they are the store hop.
//!
//! ## How the parts meet
//! - [`run`] waits for the message stream (the broker creates it; until then it retries
//!   every second and logs once), then reads it through a durable pull consumer named
//!   `<durable_name>-stored` ([`consumer_config`]: filter `msgtrail.msg.>`, headers only,
//!   deliver all, explicit acks after each transaction commits). Headers-only delivery keeps payloads off the wire;
//!   JetStream then adds `Nats-Msg-Size`, the payload size.
//! - [`records_of`] turns one stored message into its P2 and P3 [`StageRecord`]s — the same
//!   fields and the same P2 time as the P2 the broker writes, plus the outcome [`RECOVERED`].
//!   A recovered record has a dedup key of its own ([`StageRecord::dedup_key`]), so the store
//!   keeps the broker's record whichever arrives first, and trajectory assembly uses a
//!   recovered P2/P3 only where the broker's own is missing (lost in a crash or an outage).
//!   A message without store evidence (recording off, or an older broker) yields nothing;
//!   one whose `Msgtrail-Stored` is malformed or of an unknown version yields an
//!   [`EvidenceError`] (logged, counted as without evidence).
//! - The records of a chunk of stored messages form one [`crate::ingest::Batch`], applied by
//!   [`crate::ingest::apply`] exactly like a stage-stream batch: one store transaction, then
//!   the acks. A crash before the acks makes JetStream redeliver; the store skips what it
//!   already holds, so every message gets its P2/P3 once.
//! - The statistics count the messages (`ingest.stored_messages`,
//!   `ingest.stored_without_evidence`) and the consumer's lag (`lag.stored_*`), polled here.
//! - [`Scope`] says whose evidence a reading applies: a single listener's [`run`] applies
//!   every message's ([`Scope::All`]); a group member (`crate::cluster::evidence`) applies
//!   only the messages whose partition ([`partition_of`]) it holds when the chunk is applied
//!   ([`Scope::Held`], split into a batch of the primary's partitions, exported, and one of
//!   the copies'), and replays the older messages of the partitions it takes over
//!   ([`Scope::Replay`], up to a stream sequence, [`read`] returning [`Ended::Reached`]).
//!
//! Trajectory assembly (`msgtrail_core::trajectory`) merges records per message ID whatever
//! their source and order: a P2/P3 recovered after the deliveries were recorded (the store
//! hop is inferred from the delivery until then), or before the producer's P1, gives the
//! same trajectory in the end.

use crate::cluster::evidence::Coverage;
use crate::cluster::Role;
use crate::error::ListenerError;
use crate::export::ExportSender;
use crate::ingest::{apply, Batch, Redecode, Source};
use crate::stats::Stats;
use crate::store::Store;
use async_nats::jetstream::{self, consumer, stream};
use async_nats::HeaderMap;
use futures::StreamExt;
use msgtrail_core::headers as h;
use msgtrail_core::outcome::StoreOutcome;
use msgtrail_core::partition::{Partition, PARTITIONS};
use msgtrail_core::stored;
use msgtrail_core::subjects::{topic_of_subject, MESSAGE_STREAM, MESSAGE_SUBJECT_PREFIX};
use msgtrail_core::{ClientId, MessageId, RequestId, Stage, StageRecord};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Header JetStream adds to a message delivered by a headers-only consumer: the size of the
/// payload it left out, in bytes.
pub(crate) const NATS_MSG_SIZE: &str = "Nats-Msg-Size";

/// Suffix of the store-evidence consumer's name: `<durable_name>-stored`.
pub(crate) const CONSUMER_SUFFIX: &str = "-stored";

/// How often [`run`] looks for the message stream while it does not exist.
pub(crate) const STREAM_RETRY: Duration = Duration::from_secs(1);

/// The name of the store-evidence consumer of a listener whose stage-stream consumer is
/// `durable`.
pub fn consumer_name(durable: &str) -> String {
    format!("{durable}{CONSUMER_SUFFIX}")
}

/// The store-evidence consumer: every stored message (`msgtrail.msg.>`) from the start of
/// the stream, headers only; each transaction's messages acknowledged once its records are
/// committed (explicit acks, see `ingest::ack_batch`).
pub(crate) fn consumer_config(
    name: &str,
    batch_size: usize,
    ack_wait: Duration,
) -> consumer::pull::Config {
    consumer::pull::Config {
        durable_name: Some(name.to_owned()),
        description: Some("msgtrail listener: store evidence (P2/P3) of stored messages".into()),
        filter_subject: format!("{MESSAGE_SUBJECT_PREFIX}.>"),
        headers_only: true,
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait,
        max_ack_pending: (batch_size * 8).max(1024) as i64,
        deliver_policy: consumer::DeliverPolicy::All,
        ..Default::default()
    }
}

/// Why a stored message with store evidence (or a malformed `Msgtrail-Stored`) gave no record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stored message {stream_seq}: {reason}")]
pub(crate) struct EvidenceError {
    /// Its sequence in the message stream.
    pub stream_seq: u64,
    /// What was wrong with its headers.
    pub reason: String,
}

/// What JetStream says about a stored message besides its headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StoredAt<'a> {
    /// Its subject, `msgtrail.msg.<topic>` (the topic when `Msgtrail-Topic` is missing).
    pub subject: &'a str,
    /// Its sequence in the message stream.
    pub stream_seq: u64,
    /// When JetStream stored it, Unix nanoseconds (the message's `published` time).
    pub stored_at: u64,
    /// The payload size when there is no `Nats-Msg-Size` header (a consumer that delivers
    /// payloads).
    pub payload_len: usize,
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).map(|v| v.as_str())
}

/// The P2 and P3 of a stored message, from its headers and where JetStream stored it.
///
/// `Ok(None)` when the message carries no store evidence (stored with stage recording off,
/// or by a broker that wrote P2/P3 to the stage stream itself). An error when its
/// `Msgtrail-Stored` is malformed or of an unknown version, when an old-layout
/// `Msgtrail-Received-At` is not a decimal number, or when `Msgtrail-Message-Id` is not a
/// message ID: such records could not be placed on any trajectory.
///
/// Both records carry the message ID, request ID, producer, topic, upload attempt
/// (old layout: `Msgtrail-Attempt`, absent means 1, as for an upload), the broker's `service.name` and
/// the outcome [`RECOVERED`] (what tells them from the broker's own records).
/// P2 is at the received-at time with the attributes (`Msgtrail-Attr-<key>`, keys
/// lowercase), `traceparent`, payload size (`Nats-Msg-Size`) and payload head
/// (`Msgtrail-Payload-Head`); P3 is at the stored time with the stream sequence. Optional
/// headers that do not parse are left out.
pub(crate) fn records_of(
    headers: &HeaderMap,
    at: StoredAt<'_>,
) -> Result<Option<[StageRecord; 2]>, EvidenceError> {
    let bad = |reason: String| EvidenceError {
        stream_seq: at.stream_seq,
        reason,
    };
    let fields = stored::read(|n| header(headers, n)).map_err(|e| bad(e.to_string()))?;
    let Some(evidence) = fields.evidence else {
        return Ok(None);
    };
    let received_at = evidence.received_at;
    let message_id: MessageId = header(headers, h::MESSAGE_ID)
        .ok_or_else(|| bad(format!("store evidence without {}", h::MESSAGE_ID)))?
        .parse()
        .map_err(|e| bad(format!("{}: {e}", h::MESSAGE_ID)))?;
    let request_id = fields.request_id.and_then(|v| RequestId::new(v).ok());
    let producer = fields.producer.and_then(|v| ClientId::new(v).ok());
    let topic = header(headers, h::TOPIC)
        .or_else(|| topic_of_subject(at.subject))
        .map(str::to_owned);
    let attempt = evidence.attempt;
    let service = evidence.broker_service.map(|s| s.into_owned());
    let base = |stage: Stage, when: u64| {
        let mut r = StageRecord::at(stage, when);
        r.message_id = Some(message_id);
        r.request_id = request_id.clone();
        r.producer = producer.clone();
        r.topic = topic.clone();
        r.attempt = attempt;
        r.service = service.clone();
        r.set_outcome(StoreOutcome::Recovered);
        r
    };

    let mut p2 = base(Stage::UploadReceived, received_at);
    for (name, values) in headers.iter() {
        let name: &str = name.as_ref();
        let n = h::ATTR_PREFIX.len();
        if name.len() > n && name[..n].eq_ignore_ascii_case(h::ATTR_PREFIX) {
            if let Some(v) = values.first() {
                p2.attrs
                    .insert(name[n..].to_ascii_lowercase(), v.as_str().to_owned());
            }
        }
    }
    p2.traceparent = header(headers, h::TRACEPARENT).map(str::to_owned);
    p2.payload_size = Some(
        header(headers, NATS_MSG_SIZE)
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(at.payload_len as u64),
    );
    p2.payload_head = header(headers, h::PAYLOAD_HEAD)
        .filter(|v| !v.is_empty())
        .map(str::to_owned);

    let mut p3 = base(Stage::Stored, at.stored_at);
    p3.stream_seq = Some(at.stream_seq);
    Ok(Some([p2, p3]))
}

/// Which partitions' evidence a batch keeps, by partition index.
pub(crate) type Mask = [bool; PARTITIONS as usize];

/// Every partition's: a single listener keeps all the evidence it reads.
pub(crate) const ALL: Mask = [true; PARTITIONS as usize];

/// The partition of a stored message, from its `Msgtrail-Message-Id` (`None` without a
/// usable one: such a message carries no usable evidence either).
pub(crate) fn partition_of(m: &jetstream::Message) -> Option<Partition> {
    let id: MessageId = m
        .headers
        .as_ref()?
        .get(h::MESSAGE_ID)?
        .as_str()
        .parse()
        .ok()?;
    Some(Partition::of_message(&id))
}

/// Turns a chunk of stored messages into one batch: the records of those that carry
/// evidence of a partition in `keep`, every message to be acked after the commit.
fn batch_of(msgs: Vec<jetstream::Message>, keep: Mask) -> Batch {
    let (records, without_evidence) = evidence_of(&msgs, true, &keep);
    // A retry after the store failed decodes the same messages again with the same mask
    // (their warnings were logged the first time).
    let redecode: Redecode = Arc::new(move |msgs| evidence_of(msgs, false, &keep).0);
    let mut batch = Batch::with_redecode(Source::Stored { without_evidence }, redecode);
    batch.records = records;
    for m in msgs {
        batch.ack_after_commit(m);
    }
    batch
}

/// The P2/P3 records of stored messages of the partitions in `keep`, and how many of them
/// carried no (usable) evidence; `warn` logs those whose evidence is unusable.
fn evidence_of(msgs: &[jetstream::Message], warn: bool, keep: &Mask) -> (Vec<StageRecord>, u64) {
    let mut records = Vec::with_capacity(msgs.len() * 2);
    let mut without_evidence = 0u64;
    for m in msgs {
        let found = match m.info() {
            Ok(info) => {
                let stored_at = info.published.unix_timestamp_nanos().max(0) as u64;
                let empty = HeaderMap::new();
                records_of(
                    m.headers.as_ref().unwrap_or(&empty),
                    StoredAt {
                        subject: m.subject.as_str(),
                        stream_seq: info.stream_sequence,
                        stored_at,
                        payload_len: m.payload.len(),
                    },
                )
            }
            Err(e) => Err(EvidenceError {
                stream_seq: 0,
                reason: format!("no JetStream metadata: {e}"),
            }),
        };
        match found {
            Ok(Some(rs)) => {
                let kept = rs[0]
                    .message_id
                    .is_some_and(|id| keep[usize::from(Partition::of_message(&id).index())]);
                if kept {
                    records.extend(rs);
                }
            }
            Ok(None) => without_evidence += 1,
            Err(e) => {
                // Acked all the same: its headers will not get any better on redelivery.
                if warn {
                    tracing::warn!(error = %e, "stored message without usable store evidence");
                }
                without_evidence += 1;
            }
        }
    }
    (records, without_evidence)
}

/// Whose evidence a reading of the message stream applies.
#[derive(Debug, Clone)]
pub(crate) enum Scope {
    /// Every stored message's (a single listener).
    All,
    /// A group member's live consumer: the messages of the partitions the member holds at
    /// the time each chunk is applied (`crate::cluster::evidence`); the primary's exported.
    Held(Arc<Coverage>),
    /// A group member's takeover replay: the messages of the partitions in `only` that the
    /// member still holds, up to stream sequence `until` (the stream's last message when the
    /// replay began). `only` loses every partition the member stops holding meanwhile.
    Replay {
        /// What the member holds and has covered.
        coverage: Arc<Coverage>,
        /// The partitions replayed.
        only: Mask,
        /// The last stream sequence to replay.
        until: u64,
    },
}

impl Scope {
    /// The chunk's batches, each with the exporter of its trajectories: one for a single
    /// listener; in a group with an exporter one of the primary's partitions (exported) and
    /// one of the rest (copies' evidence, not exported), without one a single batch of the
    /// held partitions. Messages of partitions not held are only acked.
    fn batches(
        &mut self,
        msgs: Vec<jetstream::Message>,
        exporter: Option<&ExportSender>,
    ) -> Vec<(Batch, Option<ExportSender>)> {
        let replay = matches!(self, Scope::Replay { .. });
        let (coverage, mut only) = match self {
            Scope::All => return vec![(batch_of(msgs, ALL), exporter.cloned())],
            Scope::Held(c) => (c, None),
            Scope::Replay { coverage, only, .. } => (coverage, Some(only)),
        };
        let roles = coverage.note_roles();
        let (mut primary, mut copy) = ([false; PARTITIONS as usize], [false; PARTITIONS as usize]);
        for (i, role) in roles.iter().enumerate() {
            if let Some(only) = only.as_mut() {
                only[i] &= role.is_some();
                if !only[i] {
                    continue;
                }
            }
            match role {
                Some(Role::Primary) => primary[i] = true,
                Some(Role::Copy) => copy[i] = true,
                None => {}
            }
        }
        let mut out = match exporter {
            // Nothing exported: one transaction for the primary's and the copies' evidence.
            None => {
                let mut held = primary;
                for (h, c) in held.iter_mut().zip(copy) {
                    *h |= c;
                }
                vec![(batch_of(msgs, held), None)]
            }
            Some(x) => {
                let (mine, rest): (Vec<_>, Vec<_>) = msgs.into_iter().partition(|m| {
                    partition_of(m).is_some_and(|p| primary[usize::from(p.index())])
                });
                vec![
                    (batch_of(mine, primary), Some(x.clone())),
                    (batch_of(rest, copy), None),
                ]
            }
        };
        if replay {
            // Old messages: their age is no lag of the live consumer's.
            for (b, _) in &mut out {
                b.oldest_published = None;
            }
        }
        out
    }
}

/// Why reading the message stream stopped.
#[derive(Debug)]
pub(crate) enum Ended {
    /// The listener is stopping.
    Stopped,
    /// The consumer went away (stream or consumer deleted): wait for the stream again. With
    /// NATS' error, when it gave one.
    Lost(Option<async_nats::Error>),
    /// A replay reached its last sequence (or the stream's end); with the partitions it
    /// replayed to the end (those still held).
    Reached(Mask),
}

/// Everything [`run`] needs.
#[derive(Debug, Clone)]
pub(crate) struct EvidenceSource {
    /// JetStream of the listener's connection.
    pub js: jetstream::Context,
    /// The consumer's name (see [`consumer_name`]).
    pub name: String,
    /// Most stored messages applied in one store transaction.
    pub batch_size: usize,
    /// How long JetStream waits for an ack before redelivering.
    pub ack_wait: Duration,
    /// How often the consumer's lag is polled.
    pub poll_interval: Duration,
}

/// Where the applied evidence goes.
#[derive(Debug, Clone)]
pub(crate) struct Sinks {
    /// The store.
    pub store: Arc<Store>,
    /// The statistics.
    pub stats: Arc<Stats>,
    /// The trace export, when configured.
    pub exporter: Option<ExportSender>,
}

/// Applies the store evidence of stored messages until `stop` is cancelled. Never fails for a
/// missing message stream: it waits for it (retrying every [`STREAM_RETRY`]), and goes back
/// to waiting when the stream or the consumer is deleted.
pub(crate) async fn run(
    source: EvidenceSource,
    sinks: Sinks,
    stop: CancellationToken,
) -> Result<(), ListenerError> {
    loop {
        let Some(consumer) = wait_for_consumer(&source, &stop).await else {
            return Ok(());
        };
        tracing::info!(
            stream = MESSAGE_STREAM,
            consumer = %source.name,
            "reading store evidence from the message stream"
        );
        match read(&source, consumer, Scope::All, &sinks, &stop).await {
            Ended::Stopped => return Ok(()),
            Ended::Lost(why) => log_lost(why),
            Ended::Reached(_) => unreachable!("only a replay reaches an end"),
        }
    }
}

/// Logs that a store-evidence consumer went away.
pub(crate) fn log_lost(why: Option<async_nats::Error>) {
    let reason = why.map_or_else(
        || "the consumer's message stream ended".to_owned(),
        |e| e.to_string(),
    );
    tracing::warn!(%reason, "store-evidence consumer lost; waiting for the message stream again");
}

/// Gets (or creates) the consumer once the message stream exists; `None` when stopped first.
pub(crate) async fn wait_for_consumer(
    source: &EvidenceSource,
    stop: &CancellationToken,
) -> Option<consumer::PullConsumer> {
    let mut logged = false;
    loop {
        let attempt = async {
            let stream: stream::Stream = source
                .js
                .get_stream(MESSAGE_STREAM)
                .await
                .map_err(|e| format!("message stream {MESSAGE_STREAM}: {e}"))?;
            crate::ingest::durable_consumer(
                &stream,
                consumer_config(&source.name, source.batch_size, source.ack_wait),
            )
            .await
            .map_err(|e| format!("store-evidence consumer {}: {e}", source.name))
        };
        let result = tokio::select! {
            _ = stop.cancelled() => return None,
            r = attempt => r,
        };
        match result {
            Ok(c) => return Some(c),
            Err(e) if !logged => {
                tracing::info!(error = %e, "store evidence waits for the message stream (the broker creates it); retrying every second");
                logged = true;
            }
            Err(e) => tracing::debug!(error = %e, "message stream still unavailable"),
        }
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(STREAM_RETRY) => {}
        }
    }
}

/// Reads the consumer until stopped, until it goes away, or (a [`Scope::Replay`]) until it
/// reached its last sequence. The live consumers' lag goes to the statistics.
pub(crate) async fn read(
    source: &EvidenceSource,
    consumer: consumer::PullConsumer,
    mut scope: Scope,
    sinks: &Sinks,
    stop: &CancellationToken,
) -> Ended {
    let mut info_consumer = consumer.clone();
    let messages = match consumer
        .stream()
        .max_messages_per_batch(source.batch_size)
        .heartbeat(Duration::from_secs(5))
        .expires(Duration::from_secs(30))
        .messages()
        .await
    {
        Ok(m) => m,
        Err(e) => return Ended::Lost(Some(e.into())),
    };
    let mut chunks = messages.ready_chunks(source.batch_size);
    let mut poll = tokio::time::interval(source.poll_interval);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let chunk = tokio::select! {
            _ = stop.cancelled() => return Ended::Stopped,
            _ = poll.tick() => {
                match info_consumer.info().await {
                    Ok(info) => match &scope {
                        Scope::Replay { only, .. } => {
                            // Everything up to the stream's end delivered and acked.
                            if info.num_pending == 0 && info.num_ack_pending == 0 {
                                return Ended::Reached(*only);
                            }
                        }
                        _ => sinks.stats.set_stored_pending(
                            info.num_pending,
                            info.num_ack_pending as u64,
                            msgtrail_core::time::now_nanos(),
                        ),
                    },
                    Err(e) => tracing::debug!(error = %e, "store-evidence consumer info unavailable"),
                }
                continue;
            }
            c = chunks.next() => match c {
                Some(c) => c,
                None => return Ended::Lost(None),
            },
        };
        let mut msgs = Vec::with_capacity(chunk.len());
        for m in chunk {
            match m {
                Ok(m) => msgs.push(m),
                Err(e) if e.kind() == consumer::pull::MessagesErrorKind::ConsumerDeleted => {
                    return Ended::Lost(Some(e.into()));
                }
                Err(e) => tracing::warn!(error = %e, "store-evidence consumer error"),
            }
        }
        if msgs.is_empty() {
            continue;
        }
        let last = msgs
            .iter()
            .filter_map(|m| m.info().ok().map(|i| i.stream_sequence))
            .max()
            .unwrap_or(0);
        for (batch, exporter) in scope.batches(msgs, sinks.exporter.as_ref()) {
            apply(batch, &sinks.store, &sinks.stats, exporter.as_ref(), stop).await;
        }
        if stop.is_cancelled() {
            return Ended::Stopped;
        }
        if let Scope::Replay { only, until, .. } = &scope {
            if last >= *until || !only.contains(&true) {
                return Ended::Reached(*only);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use msgtrail_core::trajectory::RECOVERED;

    const SEQ: u64 = 17;
    const STORED: u64 = 1_700_000_000_123_456_789;

    fn at() -> StoredAt<'static> {
        StoredAt {
            subject: "msgtrail.msg.orders.eu",
            stream_seq: SEQ,
            stored_at: STORED,
            payload_len: 0,
        }
    }

    /// The headers of a message the broker stored, except those named in `without`.
    fn stamped_without(id: MessageId, without: &[&str]) -> HeaderMap {
        let id = id.to_string();
        let all = [
            (h::NATS_MSG_ID, "shop:ord-1"),
            (h::MESSAGE_ID, id.as_str()),
            (h::REQUEST_ID, "ord-1"),
            (h::PRODUCER, "shop"),
            (h::PRODUCER_SERVICE, "shop-svc"),
            (h::TOPIC, "orders.eu"),
            (h::ATTEMPT, "2"),
            ("Msgtrail-Attr-Category", "refund"),
            ("Msgtrail-Attr-region", "eu"),
            (
                h::TRACEPARENT,
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
            (h::RECEIVED_AT, "1700000000100000000"),
            (h::BROKER_SERVICE, "broker-a"),
            (h::PAYLOAD_HEAD, "aGVsbG8="),
            (NATS_MSG_SIZE, "5"),
        ];
        let mut m = HeaderMap::new();
        for (k, v) in all {
            if !without.contains(&k) {
                m.insert(k, v);
            }
        }
        m
    }

    fn stamped(id: MessageId) -> HeaderMap {
        stamped_without(id, &[])
    }

    #[test]
    fn a_stamped_message_gives_p2_and_p3() {
        let id = MessageId::new();
        let [p2, p3] = records_of(&stamped(id), at()).unwrap().unwrap();
        assert_eq!(
            (p2.stage, p2.at),
            (Stage::UploadReceived, 1_700_000_000_100_000_000)
        );
        assert_eq!((p3.stage, p3.at), (Stage::Stored, STORED));
        for r in [&p2, &p3] {
            assert_eq!(r.message_id, Some(id));
            assert_eq!(r.request_id.as_ref().map(|r| r.as_str()), Some("ord-1"));
            assert_eq!(r.producer.as_ref().map(|p| p.as_str()), Some("shop"));
            assert_eq!(r.topic.as_deref(), Some("orders.eu"));
            assert_eq!(r.attempt, Some(2));
            assert_eq!(r.service.as_deref(), Some("broker-a"));
            assert_eq!((r.consumer.as_ref(), r.group.as_ref()), (None, None));
            assert_eq!(r.outcome.as_deref(), Some(RECOVERED));
            assert_eq!(r.detail, None);
        }
        assert_eq!(
            p2.attrs.iter().collect::<Vec<_>>(),
            vec![
                (&"category".to_owned(), &"refund".to_owned()),
                (&"region".to_owned(), &"eu".to_owned())
            ]
        );
        assert_eq!(p2.payload_size, Some(5));
        assert_eq!(p2.payload_head.as_deref(), Some("aGVsbG8="));
        assert!(p2.traceparent.is_some());
        assert_eq!(p2.stream_seq, None);
        assert_eq!(p3.stream_seq, Some(SEQ));
        assert!(p3.attrs.is_empty() && p3.payload_size.is_none() && p3.traceparent.is_none());
    }

    #[test]
    fn p2_matches_the_brokers_own_p2() {
        // What the broker writes to the stage stream (crates/broker/src/upload/): the same
        // record but for the outcome, and a dedup key of its own, so the store keeps both and
        // the assembly prefers the broker's.
        let id = MessageId::new();
        let mut broker = StageRecord::at(Stage::UploadReceived, 1_700_000_000_100_000_000);
        broker.message_id = Some(id);
        broker.request_id = Some(RequestId::new("ord-1").unwrap());
        broker.producer = Some(ClientId::new("shop").unwrap());
        broker.topic = Some("orders.eu".into());
        broker.attempt = Some(2);
        broker.service = Some("broker-a".into());
        broker.attrs.insert("category".into(), "refund".into());
        broker.attrs.insert("region".into(), "eu".into());
        broker.traceparent = Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into());
        broker.payload_size = Some(5);
        broker.payload_head = Some("aGVsbG8=".into());
        let [p2, _] = records_of(&stamped(id), at()).unwrap().unwrap();
        assert_eq!(p2.dedup_key(), format!("{}|recovered", broker.dedup_key()));
        // Field for field the broker's, but for the outcome that says where it came from.
        broker.outcome = Some(RECOVERED.into());
        assert_eq!(p2, broker);
    }

    #[test]
    fn no_received_at_gives_nothing() {
        let m = stamped_without(MessageId::new(), &[h::RECEIVED_AT]);
        assert_eq!(records_of(&m, at()).unwrap(), None);
        assert_eq!(records_of(&HeaderMap::new(), at()).unwrap(), None);
    }

    #[test]
    fn unusable_evidence_is_an_error() {
        let mut m = stamped(MessageId::new());
        m.insert(h::RECEIVED_AT, "yesterday");
        let e = records_of(&m, at()).unwrap_err();
        assert_eq!(e.stream_seq, SEQ);
        assert!(e.reason.contains(h::RECEIVED_AT), "{e}");
        let m = stamped_without(MessageId::new(), &[h::MESSAGE_ID]);
        assert!(records_of(&m, at())
            .unwrap_err()
            .reason
            .contains(h::MESSAGE_ID));
        let mut m = stamped(MessageId::new());
        m.insert(h::MESSAGE_ID, "not-an-id");
        assert!(records_of(&m, at()).is_err());
    }

    #[test]
    fn defaults_for_missing_optional_headers() {
        let id = MessageId::new();
        let mut m = HeaderMap::new();
        m.insert(h::MESSAGE_ID, id.to_string().as_str());
        m.insert(h::RECEIVED_AT, "42");
        let mut stored = at();
        stored.payload_len = 9;
        let [p2, p3] = records_of(&m, stored).unwrap().unwrap();
        // The topic from the subject, attempt 1 as for an upload without the header, the
        // payload size from the delivered payload.
        assert_eq!(p2.topic.as_deref(), Some("orders.eu"));
        assert_eq!((p2.attempt, p3.attempt), (Some(1), Some(1)));
        assert_eq!(p2.payload_size, Some(9));
        assert_eq!(
            (p2.payload_head.as_ref(), p2.service.as_ref()),
            (None, None)
        );
        assert!(p2.attrs.is_empty());
    }

    /// The headers of a message this broker stores: `Msgtrail-Stored` instead of the
    /// separate headers (`stored` is its value).
    fn compact(id: MessageId, stored: &str) -> HeaderMap {
        let mut m = stamped_without(
            id,
            &[
                h::REQUEST_ID,
                h::PRODUCER,
                h::PRODUCER_SERVICE,
                h::TOPIC,
                h::ATTEMPT,
                h::RECEIVED_AT,
                h::BROKER_SERVICE,
            ],
        );
        m.insert(h::STORED, stored);
        m
    }

    const COMPACT: &str = "1;ord-1;shop-svc;2;1700000000100000000;broker-a";

    #[test]
    fn both_layouts_give_the_same_records() {
        let id = MessageId::new();
        let old = records_of(&stamped(id), at()).unwrap().unwrap();
        let new = records_of(&compact(id, COMPACT), at()).unwrap().unwrap();
        assert_eq!(new, old);
        assert_eq!(new[0].producer.as_ref().map(|p| p.as_str()), Some("shop"));
        assert_eq!(new[0].topic.as_deref(), Some("orders.eu"));
    }

    #[test]
    fn a_compact_message_without_evidence_gives_nothing() {
        let m = compact(MessageId::new(), "1;ord-1;shop-svc");
        assert_eq!(records_of(&m, at()).unwrap(), None);
    }

    #[test]
    fn a_malformed_or_unknown_msgtrail_stored_is_an_error() {
        for (value, says) in [
            ("1;ord-1;shop-svc;2;soon;broker-a", "malformed"),
            ("1;ord-1;shop-svc;2", "malformed"),
            ("1;ord-1;shop%zzsvc", "malformed"),
            ("2;ord-1;shop-svc;2;1700000000100000000;broker-a", "unknown"),
        ] {
            let e = records_of(&compact(MessageId::new(), value), at()).unwrap_err();
            assert_eq!(e.stream_seq, SEQ);
            assert!(e.reason.contains(says), "{e}");
            assert!(e.reason.contains(h::STORED), "{e}");
        }
    }

    #[test]
    fn the_consumer_reads_headers_of_every_stored_message() {
        let c = consumer_config(
            &consumer_name("msgtrail-listener"),
            16,
            Duration::from_secs(3),
        );
        assert_eq!(c.durable_name.as_deref(), Some("msgtrail-listener-stored"));
        assert_eq!(c.filter_subject, "msgtrail.msg.>");
        assert!(c.headers_only);
        assert_eq!(c.ack_policy, consumer::AckPolicy::Explicit);
        assert_eq!(c.deliver_policy, consumer::DeliverPolicy::All);
    }
}
