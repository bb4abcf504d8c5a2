//! The consumer: opens a consumer channel, then pulls ([`Consumer::fetch`]) or is pushed
//! ([`Consumer::subscribe`], a `Stream`) the messages of a [`Subscription`], and settles each
//! one. [`Consumer::process`] wraps a handler: it reports processing start and finish (X1,
//! X2), acks on success and nacks on error.
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

use crate::channel::{request_json, Channel, DEFAULT_TIMEOUT};
use crate::error::ClientError;
use crate::hooks::{DeliveryInfo, HookEvent, Hooks};
use crate::identity::Identity;
use crate::reporter::{Reporter, Reporting};
use base64::Engine;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use msgtrail_core::headers as h;
use msgtrail_core::subjects as s;
use msgtrail_core::time::now_nanos;
use msgtrail_core::wire::{
    AckKind, AckRequest, FetchReply, FetchRequest, OkReply, SubscribeReply, SubscribeRequest,
    Subscription, UnsubscribeRequest,
};
use msgtrail_core::{ClientId, MessageId, Role};
use std::collections::BTreeMap;
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
    /// The token to settle it with.
    pub ack_token: String,
}

impl Received {
    /// The trace and span IDs of this delivery's `process` span, the span the listener
    /// exports for it: trace ID = message ID, span ID = the documented hash of
    /// (message ID, `process/<group>/<consumer>/<attempt>`). No propagation involved.
    pub fn process_span_ids(&self) -> ([u8; 16], [u8; 8]) {
        let hop = msgtrail_core::trace_ids::Hop::Process {
            group: self.group.as_str(),
            consumer: self.consumer.as_str(),
            attempt: self.delivery_attempt,
        };
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

/// A consumer; cheap to clone.
#[derive(Debug, Clone)]
pub struct Consumer {
    channel: Arc<Channel>,
    hooks: Hooks,
    reporting: Reporting,
}

impl Consumer {
    /// Opens a consumer channel, reporting stage records.
    pub async fn connect(
        client: async_nats::Client,
        identity: Identity,
    ) -> Result<Self, ClientError> {
        Self::connect_with(client, identity, DEFAULT_TIMEOUT, true).await
    }

    /// Opens a consumer channel with a request timeout, reporting stages or not.
    pub async fn connect_with(
        client: async_nats::Client,
        identity: Identity,
        timeout: Duration,
        report_stages: bool,
    ) -> Result<Self, ClientError> {
        let channel = Channel::open(client, identity, Role::Consumer, timeout).await?;
        let hooks = Hooks::default();
        let reporting = Reporting::start(report_stages, &hooks, &channel);
        Ok(Consumer {
            channel,
            hooks,
            reporting,
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
        let reply: FetchReply = ch
            .with_channel(|channel| {
                let req = FetchRequest {
                    channel,
                    subscription: sub.clone(),
                    max,
                    wait_ms: wait.as_millis() as u64,
                    format: Default::default(),
                };
                async move { request_json(&ch.client, s::FETCH, &req, timeout).await }
            })
            .await?;
        let mut out = Vec::with_capacity(reply.messages.len());
        for d in reply.messages {
            let payload = base64::engine::general_purpose::STANDARD
                .decode(&d.payload)
                .map_err(|e| ClientError::Decode(format!("payload of {}: {e}", d.message_id)))?;
            let r = Received {
                message_id: d.message_id,
                topic: d.topic,
                attributes: d.attributes,
                payload: payload.into(),
                delivery_attempt: d.delivery_attempt,
                stream_seq: d.stream_seq,
                producer: d.producer,
                group: d.group,
                consumer: self.client_id().clone(),
                push: false,
                ack_token: d.ack_token,
            };
            self.hooks.emit(HookEvent::Received {
                delivery: r.info(),
                at: now_nanos(),
            });
            out.push(r);
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
            .map_err(|e| ClientError::Nats(e.to_string()))?;
        let reply: SubscribeReply = ch
            .with_channel(|channel| {
                let req = SubscribeRequest {
                    channel,
                    subscription: sub.clone(),
                    deliver_subject: inbox.clone(),
                    every_ms: options.every.map(|d| d.as_millis() as u64),
                    max_inflight: options.max_inflight,
                    format: Default::default(),
                };
                async move { request_json(&ch.client, s::SUBSCRIBE, &req, ch.timeout).await }
            })
            .await?;
        Ok(PushStream {
            subscriber,
            consumer: self.clone(),
            group: sub.group.clone(),
            subscription_id: reply.subscription_id,
        })
    }

    /// Settles a delivery.
    pub async fn settle(
        &self,
        msg: &Received,
        kind: AckKind,
        delay: Option<Duration>,
        reason: Option<String>,
    ) -> Result<(), ClientError> {
        self.hooks.emit(HookEvent::Settled {
            delivery: msg.info(),
            kind,
            at: now_nanos(),
        });
        let ch = &self.channel;
        let _: OkReply = ch
            .with_channel(|channel| {
                let req = AckRequest {
                    channel,
                    token: msg.ack_token.clone(),
                    kind,
                    delay_ms: delay.map(|d| d.as_millis() as u64),
                    reason: reason.clone(),
                };
                async move { request_json(&ch.client, s::ACK, &req, ch.timeout).await }
            })
            .await?;
        Ok(())
    }

    /// Acks a delivery.
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
        let info = msg.info();
        self.hooks.emit(HookEvent::ProcessingStarted {
            delivery: info.clone(),
            at: now_nanos(),
        });
        let outcome = handler(msg.clone()).await.map_err(|e| e.to_string());
        self.hooks.emit(HookEvent::ProcessingFinished {
            delivery: info,
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
}

impl PushStream {
    /// The broker's ID of this subscription.
    pub fn subscription_id(&self) -> &str {
        &self.subscription_id
    }

    fn parse(&self, m: async_nats::Message) -> Option<Received> {
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
            ack_token: get(h::ACK_TOKEN)?,
        })
    }
}

impl Stream for PushStream {
    type Item = Received;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Received>> {
        loop {
            match self.subscriber.poll_next_unpin(cx) {
                Poll::Ready(Some(m)) => {
                    if let Some(r) = self.parse(m) {
                        self.consumer.hooks.emit(HookEvent::Received {
                            delivery: r.info(),
                            at: now_nanos(),
                        });
                        return Poll::Ready(Some(r));
                    }
                    tracing::warn!("ignored a malformed push delivery");
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
