//! The consumer: opens a consumer channel, then pulls ([`Consumer::fetch`]) or is pushed
//! ([`Consumer::subscribe`], a `Stream`) the messages of a [`Subscription`], and settles each
//! one. [`Consumer::process`] wraps a handler: it reports processing start and finish (X1,
//! X2), acks on success and nacks on error.
//!
//! ## Batching
//! Deliveries travel as binary frames with raw payload bytes: a fetch asks for
//! `"format":"binary"` and gets one delivery frame; a push subscription asks for it too, and
//! each push is a frame of one or more deliveries, which [`PushStream`] hands out one by one.
//! Settles ([`Consumer::settle`], [`Consumer::ack`], …) go through the consumer's batcher
//! to `msgtrail.v1.settle`, with the same adaptive scheme as the
//! producer's uploads: an idle consumer's settle leaves at once, alone; settles made while
//! [`ConsumerOptions::max_inflight_batches`] settle requests are in flight leave together in
//! the next one. Each call still gets its own result: a forged token fails alone.
//!
//! The consumer's stage records (C2/C3, C6/C7, X1/X2) ride along the settle batches
//! ([`crate::reporter`]).
//!
//! ## What a settle's result means
//! `Ok` means JetStream confirmed the settle (the broker waits for it). A settle made after
//! the delivery's ack wait ran out is refused with
//! [`ClientError::is_delivery_expired`]: it was **not** applied — the message is delivered
//! again (maybe to another consumer of the group) or, after the last attempt, was
//! dead-lettered — so a handler slower than the ack wait must expect the message again.
//! Settling again cannot help. A transient error ([`ClientError::is_transient`]) can be
//! retried with the same delivery; if that retry comes after the deadline and is refused,
//! the earlier attempt may still have been applied.
//!
//! ```no_run
//! # async fn demo(nats: async_nats::Client, me: msgtrail_client::Identity) -> Result<(), Box<dyn std::error::Error>> {
//! use futures::StreamExt;
//! use msgtrail_client::{Consumer, PushOptions};
//! use msgtrail_core::{wire::Subscription, ClientId};
//! let consumer = Consumer::connect(nats, me).await?;
//! let sub = Subscription { group: ClientId::new("billing")?, topic: "orders.*".into(),
//!                          filter: Default::default(), message_id: None };
//! let mut stream = consumer.subscribe(&sub, PushOptions::default()).await?;
//! while let Some(msg) = stream.next().await {
//!     consumer.process(msg, |m| async move {
//!         println!("{} {:?}", m.message_id, m.payload);
//!         Ok::<_, String>(())
//!     }).await?;
//! }
//! # Ok(()) }
//! ```

use crate::batch::{self, Flight, Job, Limits, Queue};
use crate::channel::{decode, frame_budget, request_json, request_raw, Channel, DEFAULT_TIMEOUT};
use crate::error::{Cause, ClientError};
use crate::hooks::{DeliveryInfo, HookEvent, Hooks};
use crate::identity::Identity;
use crate::reporter::{self, Outbox, Reporter, Reporting};
use base64::Engine;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use msgtrail_core::frame::{
    self, DeliveredMessage, DeliveryBatch, FrameKind, SettleBatch, SettleEntry, SettleResults,
};
use msgtrail_core::headers as h;
use msgtrail_core::subjects as s;
use msgtrail_core::time::now_nanos;
use msgtrail_core::wire::{
    AckKind, FetchReply, FetchRequest, Format, OkReply, SubscribeReply, SubscribeRequest,
    Subscription, UnsubscribeRequest,
};
use msgtrail_core::{ClientId, MessageId, Role};
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// A delivered message.
#[derive(Debug, Clone)]
pub struct Received {
    /// Message ID (also the trace ID of its trajectory).
    pub message_id: MessageId,
    /// Topic.
    pub topic: String,
    /// Attributes.
    pub attributes: BTreeMap<String, String>,
    /// Payload.
    pub payload: Bytes,
    /// Delivery attempt (1 = first delivery to this group).
    pub delivery_attempt: u32,
    /// Sequence in the message stream.
    pub stream_seq: u64,
    /// The producer.
    pub producer: ClientId,
    /// The consumer group.
    pub group: ClientId,
    /// The consumer it was delivered to (this consumer).
    pub consumer: ClientId,
    /// Pushed (true) or pulled (false).
    pub push: bool,
    /// Fetched by message ID (docs/PROTOCOL.md §8.2): its hops have keys of their own.
    pub by_id: bool,
    /// The token to settle it with.
    pub ack_token: String,
}

impl Received {
    /// The trace and span IDs of this delivery's `process` span, the span the listener
    /// exports for it: trace ID = message ID, span ID = the documented hash of
    /// (message ID, `process/<group>/<consumer>/<attempt>`, with `/by-id` for a fetch by
    /// message ID). No propagation involved.
    pub fn process_span_ids(&self) -> ([u8; 16], [u8; 8]) {
        let hop = msgtrail_core::trace_ids::Hop::delivery(
            false,
            self.by_id,
            self.group.as_str(),
            self.consumer.as_str(),
            self.delivery_attempt,
        );
        (
            msgtrail_core::trace_ids::trace_id(&self.message_id),
            msgtrail_core::trace_ids::span_id(&self.message_id, &hop),
        )
    }

    /// The W3C `traceparent` of this delivery's `process` span, so that the application's
    /// own spans can be its children with any tracing library (extract it as a remote parent;
    /// with OpenTelemetry, `TraceContextPropagator`).
    pub fn process_traceparent(&self) -> String {
        let (trace, span) = self.process_span_ids();
        format!(
            "00-{}-{}-01",
            msgtrail_core::trace_ids::hex(&trace),
            msgtrail_core::trace_ids::hex(&span)
        )
    }

    fn info(&self) -> DeliveryInfo {
        DeliveryInfo {
            message_id: self.message_id,
            topic: self.topic.clone(),
            group: self.group.clone(),
            attempt: self.delivery_attempt,
            push: self.push,
            ack_token: self.ack_token.clone(),
        }
    }
}

/// Push subscription settings.
#[derive(Debug, Clone)]
pub struct PushOptions {
    /// Push in batches on this period; `None` pushes as soon as messages exist.
    pub every: Option<Duration>,
    /// At most this many unsettled deliveries.
    pub max_inflight: u32,
}

impl Default for PushOptions {
    fn default() -> Self {
        PushOptions {
            every: None,
            max_inflight: 64,
        }
    }
}

/// Consumer settings; defaults in one place.
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    /// Timeout of one request (a fetch waits this long beyond its own wait). Default 5 s.
    pub timeout: Duration,
    /// Report this consumer's stage records (C2/C3, C6/C7, X1/X2). Default true.
    pub report_stages: bool,
    /// Most settles in one settle batch request, 1 to 1024 (1 = one settle per request).
    /// Default 256.
    pub max_batch_messages: usize,
    /// Most settle batch requests in flight at once; while that many are, new settles queue
    /// for the next batch. Default 4.
    pub max_inflight_batches: usize,
    /// How long a settle batch that is not full waits for more before it is sent. Default
    /// zero: an idle consumer settles at once.
    pub linger: Duration,
    /// **Test only.** Shifts every time this SDK reports in its stage records by this many nanoseconds, as if its clock were that far
    /// ahead (negative: behind). Lets tests check the listener's clock-offset estimates
    /// against a known skew. Default 0; never set it in production.
    #[doc(hidden)]
    pub clock_offset_nanos: i64,
}

impl Default for ConsumerOptions {
    fn default() -> Self {
        ConsumerOptions {
            timeout: DEFAULT_TIMEOUT,
            report_stages: true,
            max_batch_messages: 256,
            max_inflight_batches: 4,
            linger: Duration::ZERO,
            clock_offset_nanos: 0,
        }
    }
}

/// A consumer; cheap to clone (clones share one settle batcher).
#[derive(Debug, Clone)]
pub struct Consumer {
    channel: Arc<Channel>,
    hooks: Hooks,
    reporting: Reporting,
    settles: Queue<Settles>,
}

/// The result of one settle.
type Settled = Result<(), ClientError>;

/// The encoded size of a settle entry in a batch frame.
fn settle_size(e: &SettleEntry) -> usize {
    1 + 1 + e.delay_ms.map_or(0, |_| 8) + 2 + e.token.len() + 2 + e.reason.len()
}

/// Bytes of a settle batch frame besides its entries and reports.
const SETTLE_FRAME_OVERHEAD: usize = 4 + 2 + 2;

/// Sends settle batches: the consumer's [`Flight`].
#[derive(Debug)]
struct Settles {
    channel: Arc<Channel>,
    outbox: Option<Arc<Outbox>>,
}

impl Flight for Settles {
    type Item = SettleEntry;
    type Output = Settled;

    fn send(
        self: Arc<Self>,
        batch: Vec<Job<SettleEntry, Settled>>,
        spare_bytes: usize,
    ) -> BoxFuture<'static, ()> {
        Box::pin(async move { self.settle(batch, spare_bytes).await })
    }
}

impl Settles {
    async fn settle(&self, batch: Vec<Job<SettleEntry, Settled>>, spare_bytes: usize) {
        let (entries, replies): (Vec<_>, Vec<_>) =
            batch.into_iter().map(|j| (j.item, j.reply)).unzip();
        let (reports, ticket) = reporter::ride_along(
            self.outbox.as_ref(),
            spare_bytes.saturating_sub(SETTLE_FRAME_OVERHEAD),
        );
        let body = SettleBatch {
            entries,
            reports,
            ..Default::default()
        }
        .encode();
        let reply = self
            .channel
            .request_on_channel(s::SETTLE, body, self.channel.timeout)
            .await;
        let reply = reply.and_then(|m| {
            let r = SettleResults::decode(&m.payload).map_err(ClientError::decode)?;
            Ok((r.results, r.reports))
        });
        let results = reporter::batch_results(reply, replies.len(), ("settle", "settles"), ticket);
        match results {
            Ok(results) => {
                for (res, reply) in results.into_iter().zip(replies) {
                    let _ = reply.send(match res {
                        None => Ok(()),
                        Some(e) => Err(ClientError::Refused(e)),
                    });
                }
            }
            Err(e) => {
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}

/// A delivery of a binary frame as the SDK hands it out.
fn received(d: DeliveredMessage, consumer: &ClientId, push: bool) -> Result<Received, ClientError> {
    let bad = |what: &str, e: msgtrail_core::IdError| {
        ClientError::Decode(Cause::with_context(
            format!("{what} of delivery {}", d.message_id),
            e,
        ))
    };
    let producer = ClientId::new(d.producer.as_str()).map_err(|e| bad("producer", e))?;
    let group = ClientId::new(d.group.as_str()).map_err(|e| bad("group", e))?;
    Ok(Received {
        message_id: d.message_id,
        topic: d.topic,
        attributes: d.attributes.into_iter().collect(),
        payload: d.payload,
        delivery_attempt: d.delivery_attempt,
        stream_seq: d.stream_seq,
        producer,
        group,
        consumer: consumer.clone(),
        push,
        by_id: false,
        ack_token: d.ack_token,
    })
}

impl Consumer {
    /// Opens a consumer channel, reporting stage records.
    pub async fn connect(
        client: async_nats::Client,
        identity: Identity,
    ) -> Result<Self, ClientError> {
        Self::connect_with(client, identity, DEFAULT_TIMEOUT, true).await
    }

    /// Opens a consumer channel with a request timeout, reporting stages or not (other
    /// settings at their defaults).
    pub async fn connect_with(
        client: async_nats::Client,
        identity: Identity,
        timeout: Duration,
        report_stages: bool,
    ) -> Result<Self, ClientError> {
        let options = ConsumerOptions {
            timeout,
            report_stages,
            ..ConsumerOptions::default()
        };
        Self::connect_with_options(client, identity, options).await
    }

    /// Opens a consumer channel with `options`.
    pub async fn connect_with_options(
        client: async_nats::Client,
        identity: Identity,
        options: ConsumerOptions,
    ) -> Result<Self, ClientError> {
        let max_bytes = frame_budget(&client, None);
        let channel = Channel::open(client, identity, Role::Consumer, options.timeout).await?;
        let hooks = Hooks::default();
        let reporting = Reporting::start(
            (options.report_stages, options.clock_offset_nanos),
            &hooks,
            &channel,
            max_bytes,
        );
        let limits = Limits {
            max_messages: options.max_batch_messages,
            max_bytes: max_bytes.saturating_sub(SETTLE_FRAME_OVERHEAD),
            max_inflight: options.max_inflight_batches,
            linger: options.linger,
        }
        .clamped(frame::MAX_BATCH_ENTRIES);
        let settles = batch::spawn(
            Arc::new(Settles {
                channel: channel.clone(),
                outbox: reporting.outbox.clone(),
            }),
            limits,
        );
        Ok(Consumer {
            channel,
            hooks,
            reporting,
            settles,
        })
    }

    /// The hook registry.
    pub fn hooks(&self) -> &Hooks {
        &self.hooks
    }

    /// The stage reporter's counters, if reporting is on.
    pub fn reporter(&self) -> Option<&Reporter> {
        self.reporting.counters.as_deref()
    }

    /// The consumer's ID.
    pub fn client_id(&self) -> &ClientId {
        &self.channel.identity.client_id
    }

    /// Pulls up to `max` matching messages, waiting up to `wait` for the first. An empty
    /// result is the broker's no-matching-message notice.
    pub async fn fetch(
        &self,
        sub: &Subscription,
        max: u32,
        wait: Duration,
    ) -> Result<Vec<Received>, ClientError> {
        let ch = &self.channel;
        let timeout = ch.timeout + wait;
        let reply = ch
            .with_channel(|channel| {
                let req = FetchRequest {
                    channel,
                    subscription: sub.clone(),
                    max,
                    wait_ms: wait.as_millis() as u64,
                    format: Format::Binary,
                };
                let body = serde_json::to_vec(&req).expect("requests serialize");
                async move { request_raw(&ch.client, s::FETCH, None, body.into(), timeout).await }
            })
            .await?;
        let me = self.client_id();
        let mut out = if frame::frame_kind(&reply.payload) == Some(FrameKind::Deliveries) {
            let batch = DeliveryBatch::decode(&reply.payload).map_err(ClientError::decode)?;
            batch
                .messages
                .into_iter()
                .map(|d| received(d, me, false))
                .collect::<Result<Vec<_>, _>>()?
        } else {
            // A broker that predates binary deliveries answers in JSON.
            json_deliveries(decode(&reply)?, me)?
        };
        for r in &mut out {
            r.by_id = sub.message_id.is_some();
        }
        for r in &out {
            self.hooks.emit_with(|| HookEvent::Received {
                delivery: r.info(),
                at: now_nanos(),
            });
        }
        Ok(out)
    }

    /// Starts a push subscription; messages arrive on the returned stream. Dropping the
    /// stream unsubscribes.
    pub async fn subscribe(
        &self,
        sub: &Subscription,
        options: PushOptions,
    ) -> Result<PushStream, ClientError> {
        let ch = &self.channel;
        let inbox = ch.client.new_inbox();
        let subscriber = ch
            .client
            .subscribe(inbox.clone())
            .await
            .map_err(ClientError::nats)?;
        let reply: SubscribeReply = ch
            .with_channel(|channel| {
                let req = SubscribeRequest {
                    channel,
                    subscription: sub.clone(),
                    deliver_subject: inbox.clone(),
                    every_ms: options.every.map(|d| d.as_millis() as u64),
                    max_inflight: options.max_inflight,
                    format: Format::Binary,
                };
                async move { request_json(&ch.client, s::SUBSCRIBE, &req, ch.timeout).await }
            })
            .await?;
        Ok(PushStream {
            subscriber,
            consumer: self.clone(),
            group: sub.group.clone(),
            subscription_id: reply.subscription_id,
            buffered: VecDeque::new(),
        })
    }

    /// Settles a delivery. The settle travels in a batch with this consumer's other settles
    /// (see the module docs); the result is this delivery's own.
    pub async fn settle(
        &self,
        msg: &Received,
        kind: AckKind,
        delay: Option<Duration>,
        reason: Option<String>,
    ) -> Result<(), ClientError> {
        self.hooks.emit_with(|| HookEvent::Settled {
            delivery: msg.info(),
            kind,
            at: now_nanos(),
        });
        let entry = SettleEntry {
            token: msg.ack_token.clone(),
            kind,
            delay_ms: delay.map(|d| d.as_millis() as u64),
            reason: reason.unwrap_or_default(),
        };
        let size = settle_size(&entry);
        let (job, rx) = Job::new(entry, size);
        batch::submit(&self.settles, vec![job]).await?;
        rx.await.unwrap_or_else(|_| Err(batch::stopped()))
    }

    /// Acks a delivery. `Ok` means JetStream took the ack: the message is not delivered to
    /// this group again. An ack that comes after the delivery's ack wait is refused with
    /// [`ClientError::is_delivery_expired`]: it was not applied, and the message is delivered
    /// again or was dead-lettered. A transient error ([`ClientError::is_transient`]) may be
    /// retried with the same delivery.
    pub async fn ack(&self, msg: &Received) -> Result<(), ClientError> {
        self.settle(msg, AckKind::Ack, None, None).await
    }

    /// Nacks a delivery: redeliver it (after `delay` if given).
    pub async fn nack(&self, msg: &Received, delay: Option<Duration>) -> Result<(), ClientError> {
        self.settle(msg, AckKind::Nack, delay, None).await
    }

    /// Terminates a delivery: never deliver it again (it is dead-lettered).
    pub async fn term(&self, msg: &Received, reason: &str) -> Result<(), ClientError> {
        self.settle(msg, AckKind::Term, None, Some(reason.to_owned()))
            .await
    }

    /// Runs `handler` on a delivery: reports processing start and finish, acks on `Ok`,
    /// nacks on `Err` (with the error text as the reason). Returns the handler's outcome.
    pub async fn process<F, Fut, E>(
        &self,
        msg: Received,
        handler: F,
    ) -> Result<Result<(), String>, ClientError>
    where
        F: FnOnce(Received) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: std::fmt::Display,
    {
        self.hooks.emit_with(|| HookEvent::ProcessingStarted {
            delivery: msg.info(),
            at: now_nanos(),
        });
        let outcome = handler(msg.clone()).await.map_err(|e| e.to_string());
        self.hooks.emit_with(|| HookEvent::ProcessingFinished {
            delivery: msg.info(),
            outcome: outcome.clone(),
            at: now_nanos(),
        });
        match &outcome {
            Ok(()) => self.ack(&msg).await?,
            Err(e) => {
                self.settle(&msg, AckKind::Nack, None, Some(e.clone()))
                    .await?
            }
        }
        Ok(outcome)
    }

    /// Sends the stage reports still queued (waiting up to the request timeout), then closes
    /// the channel. Without `close`, dropping the last clone still sends them.
    pub async fn close(self) -> Result<(), ClientError> {
        self.reporting
            .finish(&self.hooks, self.channel.timeout)
            .await;
        self.channel.close().await
    }
}

/// Pushed messages of one subscription. Dropping it unsubscribes.
#[derive(Debug)]
pub struct PushStream {
    subscriber: async_nats::Subscriber,
    consumer: Consumer,
    group: ClientId,
    subscription_id: String,
    /// Deliveries of a frame not handed out yet.
    buffered: VecDeque<Received>,
}

impl PushStream {
    /// The broker's ID of this subscription.
    pub fn subscription_id(&self) -> &str {
        &self.subscription_id
    }

    /// The deliveries of one push: a binary frame of one or more, or (from a broker that
    /// predates binary pushes) one delivery in headers.
    fn parse(&self, m: async_nats::Message) -> Vec<Received> {
        if frame::frame_kind(&m.payload) == Some(FrameKind::Deliveries) {
            let me = self.consumer.client_id();
            return match DeliveryBatch::decode(&m.payload) {
                Ok(batch) => batch
                    .messages
                    .into_iter()
                    .filter_map(|d| match received(d, me, true) {
                        Ok(r) => Some(r),
                        Err(e) => {
                            tracing::warn!(error = %e, "ignored a malformed push delivery");
                            None
                        }
                    })
                    .collect(),
                Err(e) => {
                    tracing::warn!(error = %e, "ignored a malformed push frame");
                    Vec::new()
                }
            };
        }
        match self.parse_headers(m) {
            Some(r) => vec![r],
            None => {
                tracing::warn!("ignored a malformed push delivery");
                Vec::new()
            }
        }
    }

    fn parse_headers(&self, m: async_nats::Message) -> Option<Received> {
        let hs = m.headers.as_ref()?;
        let get = |n: &str| hs.get(n).map(|v| v.as_str().to_owned());
        let mut attributes = BTreeMap::new();
        for (name, values) in hs.iter() {
            let name: &str = name.as_ref();
            if let (Some(k), Some(v)) = (name.strip_prefix(h::ATTR_PREFIX), values.first()) {
                attributes.insert(k.to_owned(), v.as_str().to_owned());
            }
        }
        Some(Received {
            message_id: get(h::MESSAGE_ID)?.parse().ok()?,
            topic: get(h::TOPIC)?,
            attributes,
            payload: m.payload.clone(),
            delivery_attempt: get(h::DELIVERY_ATTEMPT)?.parse().ok()?,
            stream_seq: get(h::STREAM_SEQ)?.parse().ok()?,
            producer: ClientId::new(get(h::PRODUCER)?).ok()?,
            group: self.group.clone(),
            consumer: self.consumer.client_id().clone(),
            push: true,
            by_id: false,
            ack_token: get(h::ACK_TOKEN)?,
        })
    }
}

impl Stream for PushStream {
    type Item = Received;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Received>> {
        loop {
            if let Some(r) = self.buffered.pop_front() {
                return Poll::Ready(Some(r));
            }
            match self.subscriber.poll_next_unpin(cx) {
                Poll::Ready(Some(m)) => {
                    let batch = self.parse(m);
                    let at = now_nanos();
                    for r in &batch {
                        self.consumer.hooks.emit_with(|| HookEvent::Received {
                            delivery: r.info(),
                            at,
                        });
                    }
                    self.buffered.extend(batch);
                }
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl Drop for PushStream {
    fn drop(&mut self) {
        let ch = self.consumer.channel.clone();
        let id = self.subscription_id.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let req = UnsubscribeRequest {
                    channel: ch.id(),
                    subscription_id: id,
                };
                let _: Result<OkReply, _> =
                    request_json(&ch.client, s::UNSUBSCRIBE, &req, ch.timeout).await;
            });
        }
    }
}

/// The deliveries of a JSON fetch reply (base64 payloads).
fn json_deliveries(reply: FetchReply, me: &ClientId) -> Result<Vec<Received>, ClientError> {
    reply
        .messages
        .into_iter()
        .map(|d| {
            let payload = base64::engine::general_purpose::STANDARD
                .decode(&d.payload)
                .map_err(|e| {
                    ClientError::Decode(Cause::with_context(
                        format!("payload of {}", d.message_id),
                        e,
                    ))
                })?;
            Ok(Received {
                message_id: d.message_id,
                topic: d.topic,
                attributes: d.attributes,
                payload: payload.into(),
                delivery_attempt: d.delivery_attempt,
                stream_seq: d.stream_seq,
                producer: d.producer,
                group: d.group,
                consumer: me.clone(),
                push: false,
                by_id: false,
                ack_token: d.ack_token,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settle_sizes_match_the_encoding() {
        let entries = vec![
            SettleEntry {
                token: "t".repeat(300),
                kind: AckKind::Nack,
                delay_ms: Some(5),
                reason: "db busy".into(),
            },
            SettleEntry {
                token: "u".repeat(280),
                kind: AckKind::Ack,
                delay_ms: None,
                reason: String::new(),
            },
        ];
        let want: usize = entries.iter().map(settle_size).sum();
        let got = SettleBatch {
            entries,
            reports: vec![],
            ..Default::default()
        }
        .encode()
        .len();
        assert_eq!(got, SETTLE_FRAME_OVERHEAD + want);
    }

    #[test]
    fn binary_deliveries_become_received_messages() {
        let me = ClientId::new("billing-1").unwrap();
        let d = DeliveredMessage {
            message_id: MessageId::new(),
            topic: "orders.eu".into(),
            producer: "shop".into(),
            group: "billing".into(),
            delivery_attempt: 2,
            stream_seq: 9,
            ack_token: "tok".into(),
            attributes: vec![("category".into(), "refund".into())],
            payload: Bytes::from_static(b"\x00raw"),
        };
        let r = received(d.clone(), &me, true).unwrap();
        assert_eq!(r.payload, Bytes::from_static(b"\x00raw"));
        assert_eq!(r.attributes["category"], "refund");
        assert_eq!(
            (r.push, r.delivery_attempt, r.consumer),
            (true, 2, me.clone())
        );
        let bad = DeliveredMessage {
            producer: "not a client id".into(),
            ..d
        };
        assert!(received(bad, &me, false).is_err());
    }
}
