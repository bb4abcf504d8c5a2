//! [`PushStream`]: the pushed messages of one subscription, as a `Stream`.

use super::decode::{self, Recipient};
use super::message::Received;
use super::Consumer;
use crate::channel::request_json;
use crate::hooks::HookEvent;
use futures::{Stream, StreamExt};
use msgtrail_core::frame::DeliveryBatch;
use msgtrail_core::subjects as s;
use msgtrail_core::time::now_nanos;
use msgtrail_core::wire::{OkReply, UnsubscribeRequest};
use msgtrail_core::GroupId;
use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Pushed messages of one subscription. Dropping it unsubscribes.
#[derive(Debug)]
pub struct PushStream {
    pub(super) subscriber: async_nats::Subscriber,
    pub(super) consumer: Consumer,
    pub(super) group: GroupId,
    pub(super) subscription_id: String,
    /// Deliveries of a frame not handed out yet.
    pub(super) buffered: VecDeque<Received>,
}

impl PushStream {
    /// The broker's ID of this subscription.
    pub fn subscription_id(&self) -> &str {
        &self.subscription_id
    }

    /// The deliveries of one push: a binary frame of one or more, or (from a broker that
    /// predates binary pushes) one delivery in headers. Malformed ones are logged and skipped.
    fn parse(&self, m: async_nats::Message) -> Vec<Received> {
        let to = Recipient {
            consumer: self.consumer.client_id(),
            settler: Some(&self.consumer.settler),
        };
        if decode::is_frame(&m.payload) {
            return match DeliveryBatch::decode(&m.payload) {
                Ok(batch) => batch
                    .messages
                    .into_iter()
                    .filter_map(|d| match decode::received(d, &to, true) {
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
        match decode::header_delivery(&m, &self.group, &to) {
            Some(r) => vec![r],
            None => {
                tracing::warn!("ignored a malformed push delivery");
                Vec::new()
            }
        }
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
