//! Consumption: consumer groups on JetStream, pull (`fetch`), settling (`ack`), redelivery
//! and dead letters. Push subscriptions (push.rs) deliver through the same [`Deliverer`].
//!
//! Each (group, topic filter, attribute filter) is one durable JetStream pull consumer named
//! `g-<group>-<hash>`: consumers of one group share its messages, and every group has its own
//! consumer, so every group gets every message. JetStream cannot filter on headers, so
//! attribute filters are applied here: a message that does not match is acked on the group's
//! consumer (it is not for this subscription) and never delivered.
//!
//! Records: C5 (pull sent) / C1 (push sent) per delivery, R1 `redeliver` when a delivery is a
//! redelivery, C8 / C4 when JetStream has confirmed the settle (outcome ack | nack | term),
//! R1 `dead_letter` on term, on a nack of the last allowed attempt, and when JetStream reports
//! the maximum deliveries reached after ack timeouts; N1 for a fetch that matched nothing.
//!
//! Settles are confirmed, not just sent: the broker sends each one as a request to its
//! JetStream ack subject (a "double ack") and answers ok only when the consumer's leader has
//! answered. A settle after the delivery's ack wait ran out (the deadline in its token) is
//! not sent at all and is refused as `delivery_expired`, with no C4/C8: JetStream no longer
//! holds the delivery (it redelivers the message, or dead-letters it after the last attempt),
//! and JetStream itself would answer an ack of a message it already dead-lettered as if it
//! had taken it.

use crate::channels::OpenChannel;
use crate::clients::may_subscribe;
use crate::metrics::Metrics;
use crate::shared::Shared;
use crate::token::AckToken;
use async_nats::jetstream::{self, consumer::pull, consumer::AckPolicy, consumer::DeliverPolicy};
use base64::Engine;
use bytes::Bytes;
use futures::StreamExt;
use msgtrail_core::frame::{DeliveredMessage, DeliveryBatch};
use msgtrail_core::headers as h;
use msgtrail_core::outcome::RedeliveryOutcome;
use msgtrail_core::subjects::{
    dead_letter_subject, message_subject, topic_of_subject, MESSAGE_STREAM,
};
use msgtrail_core::validate_topic_filter;
use msgtrail_core::wire::{
    AckKind, AckRequest, Delivery, FetchReply, FetchRequest, Format, Subscription,
    NO_MATCHING_MESSAGE,
};
use msgtrail_core::{ClientId, ErrorCode, MessageId, Role, Stage, StageRecord, WireError};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Longest a fetch may wait.
pub(crate) const MAX_FETCH_WAIT: Duration = Duration::from_secs(30);
/// Most messages one fetch may return.
pub(crate) const MAX_FETCH: u32 = 1000;
/// How far after a message ID's timestamp a fetch by ID searches the stream.
const FIND_BY_ID_WINDOW_MS: u64 = 10_000;
/// How long an idle group consumer is kept by JetStream.
const GROUP_INACTIVE: Duration = Duration::from_secs(7 * 24 * 3600);
/// Longest a settle waits for JetStream's confirmation. Below the SDK's request timeouts
/// (2 s in the fault suite, 5 s by default), so that a lost confirmation is answered
/// `unavailable` (settle again) rather than left to the client's timeout.
pub(crate) const SETTLE_CONFIRM_WAIT: Duration = Duration::from_millis(1500);
/// The most a delivery's settle deadline is set before JetStream's ack wait runs out: room
/// for the broker's receipt of the delivery and the settle's trip to the NATS server, so that
/// a settle the broker lets through reaches JetStream while the delivery is still its own.
const SETTLE_MARGIN_MAX: Duration = Duration::from_millis(50);

/// Delivers messages to consumers and settles them.
#[derive(Clone)]
pub(crate) struct Deliverer {
    /// What every handler shares.
    pub shared: Arc<Shared>,
    /// The group consumers created or looked up so far, by durable name.
    pub(crate) consumers: Arc<Mutex<HashMap<String, jetstream::consumer::PullConsumer>>>,
}

impl std::fmt::Debug for Deliverer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deliverer")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

/// A message taken from JetStream, parsed.
#[derive(Debug)]
pub(crate) struct Taken {
    pub message_id: MessageId,
    pub topic: String,
    pub producer: ClientId,
    pub attrs: BTreeMap<String, String>,
    pub payload: bytes::Bytes,
    pub attempt: u32,
    pub stream_seq: u64,
    pub ack_subject: String,
    /// When a settle of this delivery is too late (Unix ms, this broker's clock).
    pub settle_by_ms: u64,
    /// When JetStream stored the message (Unix ns, the nats-server's clock), from the
    /// delivery's metadata: the C1/C5's `stored_at`.
    pub stored_at: Option<u64>,
}

/// Milliseconds since the Unix epoch, by this broker's clock.
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The settle deadline of a delivery received now from a consumer with this ack wait: the ack
/// wait less a tenth of it, at most [`SETTLE_MARGIN_MAX`]. JetStream started the ack wait
/// when it sent the delivery, a little before the broker received it.
pub(crate) fn settle_deadline_ms(now_ms: u64, ack_wait: Duration) -> u64 {
    let margin = (ack_wait / 10).min(SETTLE_MARGIN_MAX);
    now_ms + ack_wait.saturating_sub(margin).as_millis() as u64
}

/// Deliveries and their ack tokens as one binary frame (an empty one is the
/// no-matching-message notice).
pub(crate) fn delivery_batch(delivered: Vec<(Taken, String)>, group: &ClientId) -> DeliveryBatch {
    DeliveryBatch {
        no_matching_message: delivered.is_empty(),
        messages: delivered
            .into_iter()
            .map(|(t, ack_token)| DeliveredMessage {
                message_id: t.message_id,
                topic: t.topic,
                producer: t.producer.to_string(),
                group: group.to_string(),
                delivery_attempt: t.attempt,
                stream_seq: t.stream_seq,
                ack_token,
                attributes: t.attrs.into_iter().collect(),
                payload: t.payload,
            })
            .collect(),
    }
}

/// FNV-1a 64, to name group consumers after their subscription.
fn fnv64(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0u8)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    h
}

/// The durable consumer name of a subscription.
pub fn durable_name(sub: &Subscription) -> String {
    let mut parts: Vec<&str> = vec![&sub.topic];
    for (k, v) in &sub.filter {
        parts.push(k);
        parts.push(v);
    }
    format!("g-{}-{:016x}", sub.group, fnv64(&parts))
}

/// The durable consumer of a group's fetches by message ID of one message
/// (`g-<group>-m<32 hex>`, docs/PROTOCOL.md §8.2).
pub(crate) fn by_id_durable_name(group: &str, id: &MessageId) -> String {
    format!("g-{group}-m{}", id.trace_hex())
}

/// Whether a durable consumer name is one of fetches by message ID (`g-<group>-m<32 hex>`).
pub(crate) fn is_by_id_durable(name: &str) -> bool {
    name.strip_prefix("g-")
        .and_then(|s| s.rsplit_once('-'))
        .and_then(|(_, last)| last.strip_prefix('m'))
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The group of a durable consumer name (`g-<group>-<hash>`).
pub(crate) fn group_of_durable(name: &str) -> Option<&str> {
    name.strip_prefix("g-")
        .and_then(|s| s.rsplit_once('-'))
        .map(|(g, _)| g)
}

fn matches_filter(filter: &BTreeMap<String, String>, attrs: &BTreeMap<String, String>) -> bool {
    filter.iter().all(|(k, v)| attrs.get(k) == Some(v))
}

impl Deliverer {
    /// Validates a subscription for a consumer channel.
    pub(crate) fn check_subscription(
        &self,
        channel: &OpenChannel,
        sub: &Subscription,
    ) -> Result<(), WireError> {
        validate_topic_filter(&sub.topic)
            .map_err(|e| WireError::new(ErrorCode::InvalidTopic, e.to_string()))?;
        if !may_subscribe(&channel.topics, &sub.topic) {
            return Err(WireError::new(
                ErrorCode::NotPermitted,
                format!(
                    "consumer {} may not consume topic filter {}",
                    channel.client_id, sub.topic
                ),
            ));
        }
        if sub.filter.len() > h::MAX_ATTRIBUTES {
            return Err(WireError::new(
                ErrorCode::InvalidAttribute,
                "too many attribute filters",
            ));
        }
        for (k, v) in &sub.filter {
            let key = h::validate_attr_key(k)
                .map_err(|e| WireError::new(ErrorCode::InvalidAttribute, e))?;
            if &key != k {
                return Err(WireError::new(
                    ErrorCode::InvalidAttribute,
                    format!("attribute filter key {k:?} must be lowercase"),
                ));
            }
            h::validate_attr_value(k, v)
                .map_err(|e| WireError::new(ErrorCode::InvalidAttribute, e))?;
        }
        Ok(())
    }

    /// The group's durable consumer for a subscription, created on first use.
    pub(crate) async fn group_consumer(
        &self,
        sub: &Subscription,
    ) -> Result<jetstream::consumer::PullConsumer, WireError> {
        let name = durable_name(sub);
        if let Some(c) = self
            .consumers
            .lock()
            .expect("consumer cache poisoned")
            .get(&name)
        {
            return Ok(c.clone());
        }
        let config = pull::Config {
            durable_name: Some(name.clone()),
            filter_subject: message_subject(&sub.topic),
            ack_policy: AckPolicy::Explicit,
            ack_wait: self.shared.config.ack_wait,
            max_deliver: i64::from(self.shared.config.max_deliver),
            deliver_policy: DeliverPolicy::All,
            inactive_threshold: GROUP_INACTIVE,
            num_replicas: self.shared.config.replicas,
            ..Default::default()
        };
        let consumer = self.create_consumer(config).await?;
        self.consumers
            .lock()
            .expect("consumer cache poisoned")
            .insert(name, consumer.clone());
        Ok(consumer)
    }

    async fn create_consumer(
        &self,
        config: pull::Config,
    ) -> Result<jetstream::consumer::PullConsumer, WireError> {
        let name = config.durable_name.clone().unwrap_or_default();
        self.shared
            .stream
            .get_or_create_consumer::<pull::Config>(&name, config)
            .await
            .map_err(|e| {
                WireError::new(
                    ErrorCode::Unavailable,
                    format!("cannot create consumer {name}: {e}"),
                )
            })
    }

    /// Takes up to `max` messages from `consumer`, waiting up to `wait` for the first.
    /// Messages not matching `filter` are acked and skipped.
    pub(crate) async fn take(
        &self,
        consumer: &jetstream::consumer::PullConsumer,
        filter: &BTreeMap<String, String>,
        only: Option<(MessageId, u64)>,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Taken>, WireError> {
        let unavailable = |e: &dyn std::fmt::Display| {
            WireError::new(ErrorCode::Unavailable, format!("fetch failed: {e}"))
        };
        let deadline = tokio::time::Instant::now() + wait;
        // The consumer's own ack wait: it may have been created by a broker configured otherwise.
        let ack_wait = consumer.cached_info().config.ack_wait;
        let mut out = Vec::new();
        // A consumer JetStream has just created (or moved, on a cluster) can answer 503 for a
        // moment: until the deadline that is a reason to pull again, not to fail the fetch.
        let transient = |e: &dyn std::fmt::Display| {
            let text = e.to_string();
            text.contains("503") || text.contains("no responders")
        };
        loop {
            // Whatever is there now, without waiting.
            let mut got = 0;
            let pulled = async {
                let mut batch = consumer
                    .fetch()
                    .max_messages(max - out.len())
                    .messages()
                    .await?;
                while let Some(m) = batch.next().await {
                    let m = m?;
                    got += 1;
                    if let Some(t) = self.accept(m, filter, only, ack_wait).await {
                        out.push(t);
                    }
                }
                Ok::<_, async_nats::Error>(())
            }
            .await;
            if let Err(e) = pulled {
                if !out.is_empty() {
                    return Ok(out);
                }
                if transient(&e) && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                return Err(unavailable(&e));
            }
            if !out.is_empty() {
                return Ok(out);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(out);
            }
            if got > 0 {
                continue;
            }
            // Nothing there: wait for one message, up to the deadline.
            let remaining = (deadline - now).max(Duration::from_millis(10));
            let mut one = consumer
                .batch()
                .max_messages(1)
                .expires(remaining)
                .messages()
                .await
                .map_err(|e| unavailable(&e))?;
            let mut woke = false;
            while let Some(m) = one.next().await {
                let m = m.map_err(|e| unavailable(&e))?;
                woke = true;
                if let Some(t) = self.accept(m, filter, only, ack_wait).await {
                    out.push(t);
                }
            }
            if !out.is_empty() || (!woke && tokio::time::Instant::now() >= deadline) {
                return Ok(out);
            }
        }
    }

    /// Parses a JetStream message; acks and drops it if it is not for this subscription.
    async fn accept(
        &self,
        m: jetstream::Message,
        filter: &BTreeMap<String, String>,
        only: Option<(MessageId, u64)>,
        ack_wait: Duration,
    ) -> Option<Taken> {
        let settle_by_ms = settle_deadline_ms(unix_ms(), ack_wait);
        let info = m.info().ok()?;
        let (seq, attempt) = (info.stream_sequence, info.delivered.max(1) as u32);
        let stored_at = u64::try_from(info.published.unix_timestamp_nanos()).ok();
        let ack_subject = m.reply.as_ref()?.to_string();
        // Read in place: a clone of the header map is an allocation per header.
        let parsed = m.headers.as_ref().and_then(|hs| {
            let get = |n: &str| hs.get(n).map(|v| v.as_str());
            let message_id: MessageId = get(h::MESSAGE_ID)?.parse().ok()?;
            let producer = ClientId::new(get(h::PRODUCER)?).ok()?;
            let topic = topic_of_subject(m.subject.as_str())?.to_owned();
            let mut attrs = BTreeMap::new();
            for (name, values) in hs.iter() {
                let name: &str = name.as_ref();
                if let Some(k) = name.strip_prefix(h::ATTR_PREFIX) {
                    if let Some(v) = values.first() {
                        attrs.insert(k.to_owned(), v.as_str().to_owned());
                    }
                }
            }
            Some((message_id, producer, topic, attrs))
        });
        let wanted = match (&parsed, only) {
            (Some((id, ..)), Some((want, want_seq))) => *id == want && seq == want_seq,
            (Some((.., attrs)), None) => matches_filter(filter, attrs),
            (None, _) => false,
        };
        if !wanted {
            // Not for this subscription (or not a msgtrail message): settle it for the group.
            let _ = m.ack().await;
            return None;
        }
        let (message_id, producer, topic, attrs) = parsed?;
        Some(Taken {
            message_id,
            topic,
            producer,
            attrs,
            payload: m.payload.clone(),
            attempt,
            stream_seq: seq,
            ack_subject,
            settle_by_ms,
            stored_at,
        })
    }

    /// Records the delivery (C1 or C5, and R1 for a redelivery) and builds its token.
    pub(crate) fn delivered(
        &self,
        t: &Taken,
        group: &ClientId,
        consumer: &ClientId,
        push: Option<&str>,
    ) -> String {
        Metrics::inc(&self.shared.metrics.deliveries);
        let token = AckToken {
            m: t.message_id,
            g: group.clone(),
            c: consumer.clone(),
            n: t.attempt,
            q: t.stream_seq,
            t: t.topic.clone(),
            p: push.is_some(),
            s: push.map(str::to_owned),
            a: t.ack_subject.clone(),
            e: Some(t.settle_by_ms),
        };
        if t.attempt > 1 {
            Metrics::inc(&self.shared.metrics.redeliveries);
            let mut r1 = self.record(Stage::Redelivery, &token);
            r1.set_outcome(RedeliveryOutcome::Redeliver);
            r1.detail = Some(format!(
                "delivery attempt {} of {}: the previous delivery was nacked or not acked within the ack wait ({} ms)",
                t.attempt,
                self.shared.config.max_deliver,
                self.shared.config.ack_wait.as_millis()
            ));
            self.shared.sink.record(r1);
        }
        let stage = if push.is_some() {
            Stage::PushSent
        } else {
            Stage::PullSent
        };
        let mut sent = self.record(stage, &token);
        sent.stored_at = t.stored_at;
        self.shared.sink.record(sent);
        token.encode(&self.shared.key)
    }

    fn record(&self, stage: Stage, token: &AckToken) -> StageRecord {
        let mut r = StageRecord::now(stage);
        r.message_id = Some(token.m);
        r.consumer = Some(token.c.clone());
        r.group = Some(token.g.clone());
        r.attempt = Some(token.n);
        r.topic = Some(token.t.clone());
        r.stream_seq = Some(token.q);
        r.service = Some(self.shared.config.service_name.clone());
        r.by_id = token.by_id();
        r
    }

    /// `fetch`: pull matching messages, or answer with a no-matching-message notice; the
    /// reply is a JSON [`FetchReply`] or a binary [`DeliveryBatch`], as the request asks.
    pub(crate) async fn fetch(&self, req: FetchRequest) -> Result<Bytes, WireError> {
        let channel = self
            .shared
            .channels
            .lookup_role(&req.channel, Role::Consumer)
            .await?;
        let sub = &req.subscription;
        self.check_subscription(&channel, sub)?;
        if req.max == 0 || req.max > MAX_FETCH {
            return Err(WireError::new(
                ErrorCode::BadRequest,
                format!("max must be 1 to {MAX_FETCH}, got {}", req.max),
            ));
        }
        let wait = Duration::from_millis(req.wait_ms).min(MAX_FETCH_WAIT);
        let taken = match sub.message_id {
            Some(id) => self.take_by_id(sub, id, wait).await?,
            None => {
                let consumer = self.group_consumer(sub).await?;
                self.take(&consumer, &sub.filter, None, req.max as usize, wait)
                    .await?
            }
        };
        if taken.is_empty() {
            self.no_match(&channel, sub);
        }
        let delivered: Vec<(Taken, String)> = taken
            .into_iter()
            .map(|t| {
                let token = self.delivered(&t, &sub.group, &channel.client_id, None);
                (t, token)
            })
            .collect();
        Ok(match req.format {
            Format::Binary => delivery_batch(delivered, &sub.group).encode(),
            Format::Json => {
                let reply = if delivered.is_empty() {
                    FetchReply {
                        messages: vec![],
                        notice: Some(NO_MATCHING_MESSAGE.into()),
                    }
                } else {
                    FetchReply {
                        messages: delivered
                            .into_iter()
                            .map(|(t, ack_token)| Delivery {
                                message_id: t.message_id,
                                topic: t.topic,
                                attributes: t.attrs,
                                payload: base64::engine::general_purpose::STANDARD
                                    .encode(&t.payload),
                                delivery_attempt: t.attempt,
                                stream_seq: t.stream_seq,
                                producer: t.producer,
                                group: sub.group.clone(),
                                ack_token,
                            })
                            .collect(),
                        notice: None,
                    }
                };
                serde_json::to_vec(&reply)
                    .expect("replies serialize")
                    .into()
            }
        })
    }

    /// Records N1 for a consume request that matched nothing.
    pub(crate) fn no_match(&self, channel: &OpenChannel, sub: &Subscription) {
        Metrics::inc(&self.shared.metrics.no_match);
        let mut n1 = StageRecord::now(Stage::NoMatch);
        n1.consumer = Some(channel.client_id.clone());
        n1.group = Some(sub.group.clone());
        n1.topic = Some(sub.topic.clone());
        n1.message_id = sub.message_id;
        if !sub.filter.is_empty() {
            n1.detail = Some(
                sub.filter
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(","),
            );
        }
        n1.service = Some(self.shared.config.service_name.clone());
        self.shared.sink.record(n1);
    }

    /// Fetch by message ID: find the message's sequence from the time in its UUIDv7, then
    /// deliver it through a per-message durable consumer of the group, so acks, redelivery
    /// and dead letters work as for any delivery.
    async fn take_by_id(
        &self,
        sub: &Subscription,
        id: MessageId,
        wait: Duration,
    ) -> Result<Vec<Taken>, WireError> {
        let Some((seq, subject)) = self.find_by_id(sub, id).await? else {
            return Ok(vec![]);
        };
        let name = by_id_durable_name(sub.group.as_str(), &id);
        let config = pull::Config {
            durable_name: Some(name),
            filter_subject: subject,
            ack_policy: AckPolicy::Explicit,
            ack_wait: self.shared.config.ack_wait,
            max_deliver: i64::from(self.shared.config.max_deliver),
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: seq,
            },
            inactive_threshold: Duration::from_secs(3600),
            num_replicas: self.shared.config.replicas,
            ..Default::default()
        };
        let consumer = self.create_consumer(config).await?;
        self.take(&consumer, &BTreeMap::new(), Some((id, seq)), 1, wait)
            .await
    }

    async fn find_by_id(
        &self,
        sub: &Subscription,
        id: MessageId,
    ) -> Result<Option<(u64, String)>, WireError> {
        let unavailable = |e: &dyn std::fmt::Display| {
            WireError::new(
                ErrorCode::Unavailable,
                format!("search by message id failed: {e}"),
            )
        };
        let start_ms = id.unix_millis().saturating_sub(1000);
        let start =
            time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(start_ms) * 1_000_000)
                .map_err(|e| unavailable(&e))?;
        let consumer = self
            .shared
            .stream
            .create_consumer(pull::OrderedConfig {
                filter_subject: message_subject(&sub.topic),
                deliver_policy: DeliverPolicy::ByStartTime { start_time: start },
                headers_only: true,
                ..Default::default()
            })
            .await
            .map_err(|e| unavailable(&e))?;
        let mut messages = consumer.messages().await.map_err(|e| unavailable(&e))?;
        let until = id.unix_millis() + FIND_BY_ID_WINDOW_MS;
        loop {
            let next = tokio::time::timeout(Duration::from_millis(500), messages.next()).await;
            let Ok(Some(Ok(m))) = next else {
                return Ok(None);
            };
            let Ok(info) = m.info() else { return Ok(None) };
            if m.headers
                .as_ref()
                .and_then(|hs| hs.get(h::MESSAGE_ID))
                .map(|v| v.as_str())
                == Some(id.to_string().as_str())
            {
                return Ok(Some((info.stream_sequence, m.subject.to_string())));
            }
            let published_ms = (info.published.unix_timestamp_nanos() / 1_000_000) as u64;
            if published_ms > until || info.pending == 0 {
                return Ok(None);
            }
        }
    }

    /// `ack`: settles one delivery (ack, nack with optional delay, or term); returns the
    /// push subscription and sequence whose in-flight slot the settle frees, if any.
    pub(crate) async fn ack(&self, req: AckRequest) -> Result<Option<(String, u64)>, WireError> {
        let channel = self
            .shared
            .channels
            .lookup_role(&req.channel, Role::Consumer)
            .await?;
        let token = AckToken::decode_for(&req.token, &channel.client_id, &self.shared.key)?;
        let freed = self
            .settle(&token, req.kind, req.delay_ms, req.reason.as_deref())
            .await?;
        // As for settle batches: the reply waits for the settle's records to be stored.
        let _ = self.shared.sink.stored(crate::settle::STORED_WAIT).await;
        Ok(freed)
    }

    /// Settles one delivery whose token was verified for the settling consumer: refuses it
    /// when its ack wait has run out, tells JetStream and waits for its confirmation, then
    /// records C4/C8 (and R1 for a dead letter). Settles of a batch run concurrently: each
    /// waits for its own confirmation, all of them in flight at once.
    pub(crate) async fn settle(
        &self,
        token: &AckToken,
        kind: AckKind,
        delay_ms: Option<u64>,
        reason: Option<&str>,
    ) -> Result<Option<(String, u64)>, WireError> {
        self.check_in_time(token, kind)?;
        let (effective, payload) = self.jetstream_settle(token, kind, delay_ms);
        self.confirm(token, effective, payload).await?;
        self.settled(token, kind, effective, reason).await;
        Ok(token.s.clone().map(|s| (s, token.q)))
    }

    /// Refuses a settle that comes after the delivery's ack wait ran out (counted in
    /// `settles_expired`). Nothing goes to JetStream: the delivery is no longer this
    /// consumer's, and an ack JetStream might still take would be one that it answers the same
    /// way whether it took it or not (after a dead letter).
    fn check_in_time(&self, token: &AckToken, kind: AckKind) -> Result<(), WireError> {
        let Some(late_ms) = token.expired_by(unix_ms()) else {
            return Ok(());
        };
        Metrics::inc(&self.shared.metrics.settles_expired);
        let next = if token.n >= self.shared.config.max_deliver {
            "it was the last allowed attempt, so the message is dead-lettered"
        } else {
            "the message is delivered again"
        };
        Err(WireError::new(
            ErrorCode::DeliveryExpired,
            format!(
                "{} of delivery attempt {} came {late_ms} ms after the delivery's ack wait ran out: \
                 JetStream no longer holds this delivery ({next}); the {} was not applied",
                kind.as_str(),
                token.n,
                kind.as_str(),
            ),
        ))
    }

    /// What to send JetStream: a nack of the last allowed attempt is a dead letter, so it is
    /// sent as a term.
    fn jetstream_settle(
        &self,
        token: &AckToken,
        kind: AckKind,
        delay_ms: Option<u64>,
    ) -> (AckKind, Bytes) {
        let last_attempt = token.n >= self.shared.config.max_deliver;
        match kind {
            AckKind::Ack => (AckKind::Ack, Bytes::from_static(b"+ACK")),
            AckKind::Nack if !last_attempt => match delay_ms {
                Some(ms) => (
                    AckKind::Nack,
                    format!("-NAK {{\"delay\": {}}}", u128::from(ms) * 1_000_000).into(),
                ),
                None => (AckKind::Nack, Bytes::from_static(b"-NAK")),
            },
            AckKind::Nack | AckKind::Term => (AckKind::Term, Bytes::from_static(b"+TERM")),
        }
    }

    /// Sends the settle to the delivery's ack subject as a request and waits for the
    /// consumer's leader to answer (a double ack): an ok then means JetStream took it, not
    /// only that it left this broker. In a cluster the leader answers once the ack is
    /// replicated.
    async fn confirm(
        &self,
        token: &AckToken,
        effective: AckKind,
        payload: Bytes,
    ) -> Result<(), WireError> {
        let request = async_nats::Request::new()
            .payload(payload)
            .timeout(Some(SETTLE_CONFIRM_WAIT));
        let answered = self
            .shared
            .client
            .send_request(token.a.clone(), request)
            .await;
        answered.map(|_| ()).map_err(|e| {
            use async_nats::RequestErrorKind as K;
            let why = match e.kind() {
                K::TimedOut => format!(
                    "JetStream did not confirm the {} within {} ms",
                    effective.as_str(),
                    SETTLE_CONFIRM_WAIT.as_millis()
                ),
                K::NoResponders => format!(
                    "no JetStream consumer answered the {} (its leader is being elected, or the \
                     consumer is gone)",
                    effective.as_str()
                ),
                _ => format!("JetStream did not take the {}: {e}", effective.as_str()),
            };
            WireError::new(
                ErrorCode::Unavailable,
                format!("{why}; settle again with the same token"),
            )
        })
    }

    /// Counts a confirmed settle and records C4/C8 (and R1 `dead_letter` for a term).
    async fn settled(
        &self,
        token: &AckToken,
        kind: AckKind,
        effective: AckKind,
        reason: Option<&str>,
    ) {
        match effective {
            AckKind::Ack => Metrics::inc(&self.shared.metrics.acks),
            AckKind::Nack => Metrics::inc(&self.shared.metrics.nacks),
            AckKind::Term => Metrics::inc(&self.shared.metrics.terms),
        }
        let stage = if token.p {
            Stage::PushAckReceived
        } else {
            Stage::PullAckReceived
        };
        let mut settle = self.record(stage, token);
        settle.set_outcome(kind);
        settle.detail = reason.map(str::to_owned);
        self.shared.sink.record(settle);
        if effective == AckKind::Term {
            let because = reason.map(|r| format!(": {r}")).unwrap_or_default();
            let why = match kind {
                AckKind::Nack => format!(
                    "nacked on the last allowed delivery attempt ({} of {}){because}",
                    token.n, self.shared.config.max_deliver,
                ),
                _ => format!("terminated by consumer {}{because}", token.c),
            };
            self.dead_letter(
                token.q,
                &token.g,
                Some(&token.c),
                token.n,
                token.by_id(),
                &why,
            )
            .await;
        }
    }

    /// Copies a message to the dead-letter stream and records R1 `dead_letter`.
    pub(crate) async fn dead_letter(
        &self,
        seq: u64,
        group: &ClientId,
        consumer: Option<&ClientId>,
        attempt: u32,
        by_id: bool,
        why: &str,
    ) {
        Metrics::inc(&self.shared.metrics.dead_letters);
        let original = self.shared.stream.direct_get(seq).await;
        let mut r1 = StageRecord::now(Stage::Redelivery);
        r1.set_outcome(RedeliveryOutcome::DeadLetter);
        r1.detail = Some(why.to_owned());
        r1.group = Some(group.clone());
        r1.consumer = consumer.cloned();
        r1.attempt = Some(attempt);
        r1.by_id = by_id;
        r1.stream_seq = Some(seq);
        r1.service = Some(self.shared.config.service_name.clone());
        match original {
            Ok(m) => {
                r1.message_id = m
                    .headers
                    .get(h::MESSAGE_ID)
                    .and_then(|v| v.as_str().parse().ok());
                let topic = topic_of_subject(m.subject.as_str())
                    .unwrap_or("unknown")
                    .to_owned();
                r1.topic = Some(topic.clone());
                let mut headers = m.headers.clone();
                headers.insert(h::NATS_MSG_ID, format!("dlq:{group}:{seq}").as_str());
                headers.insert(
                    "Msgtrail-Dead-Letter-Reason",
                    why.replace(['\r', '\n'], " ").as_str(),
                );
                headers.insert(h::GROUP, group.as_str());
                let published = self
                    .shared
                    .js
                    .publish_with_headers(
                        dead_letter_subject(group.as_str(), &topic),
                        headers,
                        m.payload.clone(),
                    )
                    .await;
                if let Err(e) = match published {
                    Ok(ack) => ack.await.map(|_| ()),
                    Err(e) => Err(e),
                } {
                    tracing::warn!(seq, error = %e, "dead letter not copied");
                }
            }
            Err(e) => {
                tracing::warn!(seq, error = %e, "dead-lettered message no longer in the stream")
            }
        }
        self.shared.sink.record(r1);
    }

    /// Watches JetStream's max-deliveries advisories (ack timeouts on the last attempt) and
    /// dead-letters those messages. Brokers share the advisories through the queue group.
    pub(crate) async fn watch_max_deliveries(self, shutdown: tokio_util::sync::CancellationToken) {
        let subject = format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{MESSAGE_STREAM}.*");
        let mut sub = match self
            .shared
            .client
            .queue_subscribe(subject, msgtrail_core::subjects::BROKER_QUEUE_GROUP.into())
            .await
        {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot watch max-deliveries advisories: no dead letters after ack timeouts");
                return;
            }
        };
        loop {
            let msg = tokio::select! {
                _ = shutdown.cancelled() => break,
                m = sub.next() => match m { Some(m) => m, None => break },
            };
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(&msg.payload) else {
                continue;
            };
            let (Some(seq), Some(consumer)) = (v["stream_seq"].as_u64(), v["consumer"].as_str())
            else {
                continue;
            };
            let Some(group) = group_of_durable(consumer).and_then(|g| ClientId::new(g).ok()) else {
                continue;
            };
            let attempt = v["deliveries"].as_u64().unwrap_or(0) as u32;
            let why = format!(
                "not acked within the ack wait ({} ms) on any of {attempt} delivery attempts",
                self.shared.config.ack_wait.as_millis()
            );
            let by_id = is_by_id_durable(consumer);
            self.dead_letter(seq, &group, None, attempt, by_id, &why)
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_settle_deadline_is_the_ack_wait_less_a_small_margin() {
        let now = 1_764_000_000_000;
        // A tenth of a short ack wait, at most 50 ms of a long one.
        assert_eq!(
            settle_deadline_ms(now, Duration::from_millis(200)),
            now + 180
        );
        assert_eq!(settle_deadline_ms(now, Duration::from_secs(1)), now + 950);
        assert_eq!(
            settle_deadline_ms(now, Duration::from_secs(30)),
            now + 29_950
        );
    }

    #[test]
    fn durable_names_depend_on_the_whole_subscription() {
        let mut sub = Subscription {
            group: ClientId::new("billing-eu").unwrap(),
            topic: "orders.*".into(),
            filter: BTreeMap::new(),
            message_id: None,
        };
        let a = durable_name(&sub);
        sub.filter.insert("category".into(), "refund".into());
        let b = durable_name(&sub);
        assert_ne!(a, b);
        assert!(a.starts_with("g-billing-eu-"));
        assert_eq!(group_of_durable(&a), Some("billing-eu"));
    }
}
