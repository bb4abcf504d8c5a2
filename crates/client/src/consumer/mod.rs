//! The consumer: opens a consumer channel, then pulls ([`Consumer::fetch`]) or is pushed
//! ([`Consumer::subscribe`], a `Stream`) the messages of a [`Subscription`]; each
//! [`Received`] message is settled through its own methods ([`Received::ack`],
//! [`Received::nack`], [`Received::term`], [`Received::settle`] with an [`AckKind`]).
//! [`Consumer::process`] wraps a handler: it reports processing start and finish (X1, X2),
//! acks on success and nacks on error.
//!
//! ## Batching
//! Deliveries travel as binary frames with raw payload bytes: a fetch asks for
//! `"format":"binary"` and gets one delivery frame; a push subscription asks for it too, and
//! each push is a frame of one or more deliveries, which [`PushStream`] hands out one by one.
//! Settles go through the consumer's batcher to `msgtrail.v1.settle`, with the same adaptive
//! scheme as the producer's uploads: an idle consumer's settle leaves at once, alone; settles
//! made while [`ConsumerOptions::max_inflight_batches`] settle requests are in flight leave
//! together in the next one. Each call still gets its own result: a forged token fails alone.
//!
//! The consumer's stage records (C2/C3, C6/C7, X1/X2) ride along the settle batches
//! (docs/PROTOCOL.md §18).
//!
//! ## What a settle's result means
//! `Ok` means JetStream confirmed the settle (the broker waits for it). A settle made after
//! the delivery's ack wait ran out is refused with
//! [`ClientError::is_delivery_expired`]: it was **not** applied — the message is delivered
//! again (maybe to another consumer of the group) or, after the last attempt, was
//! dead-lettered — so a handler slower than the ack wait must expect the message again.
//! Settling again cannot help. A transient error ([`ClientError::is_transient`]) can be
//! retried with the same delivery; if that retry comes after the deadline, it is refused
//! [`ClientError::is_already_settled`] when JetStream shows the group done with the message
//! (nothing left to do), or else the earlier attempt may still have been applied
//! ([`ClientError::is_settle_ambiguous`]).
//!
//! A [`Received`] message holds a share of its consumer's settle path, so it can be settled
//! after the consumer handle that fetched it is dropped; the consumer's stage reporting ends
//! when the last consumer clone and the last of its messages are gone (or at
//! [`Consumer::close`]).
//!
//! ```no_run
//! # async fn demo(nats: async_nats::Client, me: msgtrail_client::Identity) -> Result<(), Box<dyn std::error::Error>> {
//! use futures::StreamExt;
//! use msgtrail_client::{Consumer, GroupId, PushOptions};
//! let consumer = Consumer::connect(nats, me).await?;
//! let sub = GroupId::new("billing")?.subscription("orders.*");
//! let mut stream = consumer.subscribe(&sub, PushOptions::default()).await?;
//! while let Some(msg) = stream.next().await {
//!     if msg.attributes.get("category").is_some_and(|c| c == "spam") {
//!         msg.term("spam").await?;
//!         continue;
//!     }
//!     let handled = consumer.process(msg, |m| async move {
//!         println!("{} {:?}", m.message_id, m.payload);
//!         Ok::<_, std::io::Error>(())
//!     }).await?;
//!     if let Err(e) = handled {
//!         eprintln!("nacked: {e}");
//!     }
//! }
//! # Ok(()) }
//! ```

mod decode;
mod message;
mod options;
mod push;
mod settle;

pub use message::{AckKind, Received};
pub use options::{ConsumerOptions, PushOptions};
pub use push::PushStream;

use crate::channel::{decode as decode_reply, frame_budget, request_json, request_raw, Channel};
use crate::error::ClientError;
use crate::hooks::{HookEvent, Hooks};
use crate::identity::Identity;
use crate::reporter::{Reporter, Reporting};
use decode::Recipient;
use msgtrail_core::subjects as s;
use msgtrail_core::time::now_nanos;
use msgtrail_core::wire::{
    FetchRequest, Format, SettleKind as WireKind, SubscribeReply, SubscribeRequest, Subscription,
};
use msgtrail_core::{ClientId, Role};
use settle::Settler;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// A consumer; cheap to clone (clones share one settle batcher).
#[derive(Debug, Clone)]
pub struct Consumer {
    channel: Arc<Channel>,
    hooks: Hooks,
    reporting: Reporting,
    settler: Settler,
}

impl Consumer {
    /// Opens a consumer channel with default options (reporting stage records).
    pub async fn connect(
        client: async_nats::Client,
        identity: Identity,
    ) -> Result<Self, ClientError> {
        Self::connect_with(client, identity, ConsumerOptions::default()).await
    }

    /// Opens a consumer channel with `options`.
    pub async fn connect_with(
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
        let outbox = reporting.outbox.clone();
        let settler = Settler::start(&channel, &hooks, outbox, &options, max_bytes);
        Ok(Consumer {
            channel,
            hooks,
            reporting,
            settler,
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

    fn recipient(&self) -> Recipient<'_> {
        Recipient {
            consumer: self.client_id(),
            settler: Some(&self.settler),
        }
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
        let to = self.recipient();
        let mut out = if decode::is_frame(&reply.payload) {
            decode::frame_deliveries(&reply.payload, &to, false)?
        } else {
            // A broker that predates binary deliveries answers in JSON.
            decode::json_deliveries(decode_reply(&reply)?, &to)?
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

    /// Runs `handler` on a delivery: reports processing start and finish (X1, X2), acks on
    /// `Ok`, nacks on `Err` (with the error text as the reason). The outer result is the
    /// settle's; the inner one is the handler's own, error type and all.
    pub async fn process<F, Fut, E>(
        &self,
        msg: Received,
        handler: F,
    ) -> Result<Result<(), E>, ClientError>
    where
        F: FnOnce(Received) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: std::fmt::Display,
    {
        self.hooks.emit_with(|| HookEvent::ProcessingStarted {
            delivery: msg.info(),
            at: now_nanos(),
        });
        let outcome = handler(msg.clone()).await;
        let text = outcome.as_ref().map(|_| ()).map_err(|e| e.to_string());
        self.hooks.emit_with(|| HookEvent::ProcessingFinished {
            delivery: msg.info(),
            outcome: text.clone(),
            at: now_nanos(),
        });
        match text {
            Ok(()) => {
                self.settler
                    .settle(&msg, WireKind::Ack, None, String::new())
                    .await?
            }
            Err(reason) => {
                self.settler
                    .settle(&msg, WireKind::Nack, None, reason)
                    .await?
            }
        }
        Ok(outcome)
    }

    /// Sends the stage reports still queued (waiting up to the request timeout), then closes
    /// the channel. Without `close`, dropping the last clone (and the last of its messages)
    /// still sends them.
    pub async fn close(self) -> Result<(), ClientError> {
        self.reporting
            .finish(&self.hooks, self.channel.timeout)
            .await;
        self.channel.close().await
    }
}
