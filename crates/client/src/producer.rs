//! The producer: opens a producer channel and uploads messages, retrying on timeout with the
//! same request ID so that the broker stores a retried message once.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use msgtrail_client::{Identity, Producer};
//! use msgtrail_core::ClientId;
//! let nats = async_nats::connect("nats://127.0.0.1:4222").await?;
//! let me = Identity::from_seed(ClientId::new("shop")?, "SUA…")?;
//! let producer = Producer::connect(nats, me).await?;
//! let reply = producer.send("orders.eu", "hello").await?;
//! println!("stored as {}", reply.message_id);
//! # Ok(()) }
//! ```

use crate::channel::{decode, request_raw, Channel, DEFAULT_TIMEOUT};
use crate::error::ClientError;
use crate::hooks::{HookEvent, Hooks};
use crate::identity::Identity;
use crate::reporter::{Reporter, Reporting};
use async_nats::HeaderMap;
use bytes::Bytes;
use msgtrail_core::headers as h;
use msgtrail_core::subjects as s;
use msgtrail_core::time::now_nanos;
use msgtrail_core::wire::UploadReply;
use msgtrail_core::{RequestId, Role, Topic};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// One message to send.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// Topic.
    pub topic: String,
    /// Payload.
    pub payload: Bytes,
    /// Request ID; generated when `None`.
    pub request_id: Option<RequestId>,
    /// Attributes (`category=refund`).
    pub attrs: BTreeMap<String, String>,
    /// A W3C traceparent to link the message's trace to.
    pub traceparent: Option<String>,
}

impl Outgoing {
    /// A message with just a topic and payload.
    pub fn new(topic: impl Into<String>, payload: impl Into<Bytes>) -> Self {
        Outgoing {
            topic: topic.into(),
            payload: payload.into(),
            request_id: None,
            attrs: BTreeMap::new(),
            traceparent: None,
        }
    }

    /// Sets the request ID.
    pub fn request_id(mut self, id: RequestId) -> Self {
        self.request_id = Some(id);
        self
    }

    /// Adds an attribute.
    pub fn attr(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.attrs.insert(key.into(), value.into());
        self
    }
}

/// Producer settings; defaults in one place.
#[derive(Debug, Clone)]
pub struct ProducerOptions {
    /// Timeout of one upload attempt.
    pub timeout: Duration,
    /// Attempts per message (1 = no retry).
    pub max_attempts: u32,
    /// Pause before a retry (doubles each time).
    pub retry_backoff: Duration,
    /// Report this producer's stage records (P1, P4).
    pub report_stages: bool,
}

impl Default for ProducerOptions {
    fn default() -> Self {
        ProducerOptions {
            timeout: DEFAULT_TIMEOUT,
            max_attempts: 3,
            retry_backoff: Duration::from_millis(100),
            report_stages: true,
        }
    }
}

/// A producer; cheap to clone, and many sends may be in flight at once.
#[derive(Debug, Clone)]
pub struct Producer {
    channel: Arc<Channel>,
    hooks: Hooks,
    options: ProducerOptions,
    reporting: Reporting,
}

impl Producer {
    /// Opens a producer channel with default options.
    pub async fn connect(
        client: async_nats::Client,
        identity: Identity,
    ) -> Result<Self, ClientError> {
        Self::connect_with(client, identity, ProducerOptions::default()).await
    }

    /// Opens a producer channel.
    pub async fn connect_with(
        client: async_nats::Client,
        identity: Identity,
        options: ProducerOptions,
    ) -> Result<Self, ClientError> {
        let channel = Channel::open(client, identity, Role::Producer, options.timeout).await?;
        let hooks = Hooks::default();
        let reporting = Reporting::start(options.report_stages, &hooks, &channel);
        Ok(Producer {
            channel,
            hooks,
            options,
            reporting,
        })
    }

    /// The hook registry: register functions for send events here.
    pub fn hooks(&self) -> &Hooks {
        &self.hooks
    }

    /// The stage reporter's counters, if reporting is on.
    pub fn reporter(&self) -> Option<&Reporter> {
        self.reporting.counters.as_deref()
    }

    /// Sends `payload` to `topic` with a generated request ID.
    pub async fn send(
        &self,
        topic: &str,
        payload: impl Into<Bytes>,
    ) -> Result<UploadReply, ClientError> {
        self.send_message(Outgoing::new(topic, payload)).await
    }

    /// Sends a message, retrying transient failures with the same request ID.
    pub async fn send_message(&self, msg: Outgoing) -> Result<UploadReply, ClientError> {
        Topic::new(msg.topic.as_str()).map_err(|e| ClientError::Invalid(e.to_string()))?;
        for (k, v) in &msg.attrs {
            h::validate_attr_key(k).map_err(ClientError::Invalid)?;
            h::validate_attr_value(k, v).map_err(ClientError::Invalid)?;
        }
        let request_id = msg.request_id.clone().unwrap_or_else(RequestId::generate);
        let mut backoff = self.options.retry_backoff;
        let mut attempt = 1;
        loop {
            let result = self.attempt(&msg, &request_id, attempt).await;
            self.hooks.emit(HookEvent::AfterSend {
                request_id: request_id.clone(),
                topic: msg.topic.clone(),
                attempt,
                result: result
                    .as_ref()
                    .map(Clone::clone)
                    .map_err(ToString::to_string),
                at: now_nanos(),
            });
            match result {
                Ok(reply) => {
                    self.hooks.emit(HookEvent::StoreConfirmed {
                        reply: reply.clone(),
                        at: now_nanos(),
                    });
                    return Ok(reply);
                }
                Err(e) if e.is_transient() && attempt < self.options.max_attempts => {
                    tracing::debug!(%request_id, attempt, error = %e, "upload failed; retrying with the same request id");
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn attempt(
        &self,
        msg: &Outgoing,
        request_id: &RequestId,
        attempt: u32,
    ) -> Result<UploadReply, ClientError> {
        self.hooks.emit(HookEvent::BeforeSend {
            request_id: request_id.clone(),
            topic: msg.topic.clone(),
            attempt,
            traceparent: msg.traceparent.clone(),
            at: now_nanos(),
        });
        let ch = &self.channel;
        let reply = ch
            .with_channel(|id| {
                let mut headers = HeaderMap::new();
                headers.insert(h::CHANNEL, id.as_str());
                headers.insert(h::REQUEST_ID, request_id.as_str());
                headers.insert(h::TOPIC, msg.topic.as_str());
                headers.insert(h::ATTEMPT, attempt.to_string().as_str());
                for (k, v) in &msg.attrs {
                    headers.insert(format!("{}{k}", h::ATTR_PREFIX).as_str(), v.as_str());
                }
                if let Some(tp) = &msg.traceparent {
                    headers.insert(h::TRACEPARENT, tp.as_str());
                }
                request_raw(
                    &ch.client,
                    s::UPLOAD,
                    Some(headers),
                    msg.payload.clone(),
                    self.options.timeout,
                )
            })
            .await?;
        decode(&reply)
    }

    /// Sends the stage reports still queued (waiting up to the request timeout), then closes
    /// the channel. Without `close`, dropping the last clone still sends them, and the
    /// channel expires by itself.
    pub async fn close(self) -> Result<(), ClientError> {
        self.reporting
            .finish(&self.hooks, self.options.timeout)
            .await;
        self.channel.close().await
    }
}
