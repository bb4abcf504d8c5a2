//! Push subscriptions: the broker delivers matching messages to the consumer's subject as
//! soon as they exist, or on a schedule in batches (`every_ms`), with at most `max_inflight`
//! unsettled deliveries per subscription. A delivery travels as one NATS message with
//! headers, or — for a subscription with `"format":"binary"` — every batch taken from
//! JetStream travels as one binary delivery frame.
//!
//! A subscription lives on the broker that accepted it, as one task. Settles may reach any
//! broker of the queue group; the one that handles a settle tells the owner through the
//! internal subject `msgtrail.internal.settled.<subscription>` (clients cannot publish
//! there), which frees the in-flight slot. A slot whose settle never comes is freed after the
//! ack wait, when JetStream redelivers anyway. The task ends on unsubscribe, when its channel
//! closes or expires, and at shutdown. An unsubscribe that lands on another broker is passed
//! to the owner as a request on `msgtrail.internal.unsubscribe.<subscription>`.

use crate::consume::Deliverer;
use futures::StreamExt;
use msgtrail_core::frame;
use msgtrail_core::headers as h;
use msgtrail_core::sync::Recover;
use msgtrail_core::wire::{Format, SubscribeReply, SubscribeRequest, UnsubscribeRequest};
use msgtrail_core::{ErrorCode, Role, WireError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Prefix of the internal settle notifications.
pub(crate) const SETTLED_PREFIX: &str = "msgtrail.internal.settled";
/// Prefix of the internal unsubscribe requests, for a subscription owned by another broker.
pub(crate) const UNSUBSCRIBE_PREFIX: &str = "msgtrail.internal.unsubscribe";
/// Most unsettled deliveries one subscription may ask for.
pub(crate) const MAX_INFLIGHT: u32 = 10_000;
/// Shortest schedule period.
pub(crate) const MIN_EVERY: Duration = Duration::from_millis(10);
/// How long an immediate subscription waits for messages in one pull.
const LONG_POLL: Duration = Duration::from_secs(2);

#[derive(Debug)]
struct Handle {
    channel: String,
    /// Cancelled to stop the subscription; a child of the broker's shutdown token, so the
    /// shutdown stops every subscription too.
    stop: CancellationToken,
}

/// The push subscriptions of this broker.
#[derive(Debug, Clone)]
pub(crate) struct PushManager {
    deliverer: Deliverer,
    /// The running subscriptions by ID. Poison is recovered ([`Recover`]): each critical
    /// section is one insert, remove or lookup of the map, which a panic cannot leave half done.
    subs: Arc<Mutex<HashMap<String, Handle>>>,
    shutdown: CancellationToken,
}

fn valid_deliver_subject(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && !s.starts_with("msgtrail.")
        && !s.starts_with("$")
        // Service-import reply subjects: a push there would reach another account's requester.
        && !s.starts_with("_R_.")
        && s.split('.').all(|t| {
            !t.is_empty() && t != "*" && t != ">" && !t.contains(|c: char| c.is_whitespace())
        })
}

impl PushManager {
    /// A manager delivering through `deliverer`.
    pub(crate) fn new(deliverer: Deliverer, shutdown: CancellationToken) -> Self {
        PushManager {
            deliverer,
            subs: Arc::new(Mutex::new(HashMap::new())),
            shutdown,
        }
    }

    /// `subscribe`: validates and starts a subscription task.
    pub(crate) async fn subscribe(
        &self,
        req: SubscribeRequest,
    ) -> Result<SubscribeReply, WireError> {
        let d = &self.deliverer;
        let channel = d
            .shared
            .channels
            .lookup_role(&req.channel, Role::Consumer)
            .await?;
        d.check_subscription(&channel, &req.subscription)?;
        let every = check_push_request(&req)?;
        let consumer = d.group_consumer(&req.subscription).await?;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let settled = self.listen(format!("{SETTLED_PREFIX}.{id}")).await?;
        let remote_stop = self.listen(format!("{UNSUBSCRIBE_PREFIX}.{id}")).await?;
        let stop = self.shutdown.child_token();
        self.subs.lock().recover().insert(
            id.clone(),
            Handle {
                channel: req.channel.clone(),
                stop: stop.clone(),
            },
        );
        let task = PushTask {
            id: id.clone(),
            req,
            every,
            consumer,
            deliverer: d.clone(),
            consumer_id: channel.client_id,
            inflight: HashMap::new(),
        };
        tokio::spawn(
            self.clone()
                .serve_remote_stops(id.clone(), remote_stop, stop.clone()),
        );
        let subs = self.subs.clone();
        tokio::spawn(async move {
            let id = task.id.clone();
            task.run(settled, stop.clone()).await;
            // Ended on its own (channel closed): the remote-stop listener ends with it.
            stop.cancel();
            subs.lock().recover().remove(&id);
        });
        Ok(SubscribeReply {
            subscription_id: id,
        })
    }

    /// A NATS subscription the push task listens on (its settles, a remote stop).
    async fn listen(&self, subject: String) -> Result<async_nats::Subscriber, WireError> {
        self.deliverer
            .shared
            .client
            .subscribe(subject)
            .await
            .map_err(|e| WireError::new(ErrorCode::Unavailable, format!("cannot subscribe: {e}")))
    }

    /// `unsubscribe`: stops a subscription of the caller's channel, here or on the broker
    /// that owns it.
    pub(crate) async fn unsubscribe(&self, req: UnsubscribeRequest) -> Result<(), WireError> {
        self.deliverer
            .shared
            .channels
            .lookup_role(&req.channel, Role::Consumer)
            .await?;
        let unknown = || {
            WireError::new(
                ErrorCode::UnknownSubscription,
                format!(
                    "subscription {:?} is not open on this channel",
                    req.subscription_id
                ),
            )
        };
        if self
            .subs
            .lock()
            .recover()
            .contains_key(&req.subscription_id)
        {
            return if self.stop_local(&req.subscription_id, &req.channel) {
                Ok(())
            } else {
                Err(unknown())
            };
        }
        if req.subscription_id.is_empty()
            || !req
                .subscription_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric())
        {
            return Err(unknown());
        }
        let subject = format!("{UNSUBSCRIBE_PREFIX}.{}", req.subscription_id);
        let asked = tokio::time::timeout(
            Duration::from_secs(2),
            self.deliverer
                .shared
                .client
                .request(subject, req.channel.clone().into()),
        )
        .await;
        match asked {
            Ok(Ok(reply)) if &reply.payload[..] == b"ok" => Ok(()),
            _ => Err(unknown()),
        }
    }

    /// Stops a local subscription if it belongs to `channel`.
    fn stop_local(&self, id: &str, channel: &str) -> bool {
        let mut subs = self.subs.lock().recover();
        match subs.get(id) {
            Some(h) if h.channel == channel => {
                h.stop.cancel();
                subs.remove(id);
                true
            }
            _ => false,
        }
    }

    /// Answers other brokers' unsubscribe requests for subscription `id` until it stops.
    async fn serve_remote_stops(
        self,
        id: String,
        mut requests: async_nats::Subscriber,
        stopped: CancellationToken,
    ) {
        loop {
            let msg = tokio::select! {
                m = requests.next() => match m { Some(m) => m, None => break },
                _ = stopped.cancelled() => break,
            };
            let channel = String::from_utf8_lossy(&msg.payload).into_owned();
            let answer: &'static [u8] = if self.stop_local(&id, &channel) {
                b"ok"
            } else {
                b"unknown"
            };
            if let Some(reply) = msg.reply {
                let _ = self
                    .deliverer
                    .shared
                    .client
                    .publish(reply, answer.into())
                    .await;
            }
        }
    }

    /// Tells the owner of subscription `id` that the delivery at `seq` was settled.
    pub(crate) async fn notify_settled(&self, id: &str, seq: u64) {
        let _ = self
            .deliverer
            .shared
            .client
            .publish(format!("{SETTLED_PREFIX}.{id}"), seq.to_string().into())
            .await;
    }
}

/// Splits deliveries into frames of at most [`frame::MAX_BATCH_ENTRIES`] deliveries and
/// about `max_bytes` (a single larger delivery still goes, alone).
fn frame_chunks(
    delivered: Vec<(crate::consume::Taken, String)>,
    max_bytes: usize,
) -> Vec<Vec<(crate::consume::Taken, String)>> {
    let mut out: Vec<Vec<_>> = Vec::new();
    let mut bytes = 0;
    for d in delivered {
        let size = d.0.payload.len() + d.1.len() + d.0.topic.len() + 128;
        match out.last_mut() {
            Some(cur) if cur.len() < frame::MAX_BATCH_ENTRIES && bytes + size <= max_bytes => {
                bytes += size;
                cur.push(d);
            }
            _ => {
                bytes = size;
                out.push(vec![d]);
            }
        }
    }
    out
}

struct PushTask {
    id: String,
    req: SubscribeRequest,
    every: Option<Duration>,
    consumer: async_nats::jetstream::consumer::PullConsumer,
    deliverer: Deliverer,
    consumer_id: msgtrail_core::ClientId,
    /// Unsettled deliveries: stream sequence → when the slot frees itself.
    inflight: HashMap<u64, Instant>,
}

impl PushTask {
    async fn run(mut self, mut settled: async_nats::Subscriber, stop: CancellationToken) {
        let mut next_round = Instant::now() + self.every.unwrap_or_default();
        loop {
            if stop.is_cancelled() {
                break;
            }
            if self
                .deliverer
                .shared
                .channels
                .lookup(&self.req.channel)
                .await
                .is_err()
            {
                tracing::info!(subscription = %self.id, "push subscription ended: its channel is closed or expired");
                break;
            }
            let now = Instant::now();
            let ack_wait = self.deliverer.shared.config.ack_wait;
            self.inflight.retain(|_, expires| *expires > now);
            let free = self.req.max_inflight as usize
                - self.inflight.len().min(self.req.max_inflight as usize);
            let due = self.every.is_none() || now >= next_round;
            if free > 0 && due {
                let wait = if self.every.is_some() {
                    Duration::from_millis(10)
                } else {
                    LONG_POLL
                };
                let taken = tokio::select! {
                    t = self.deliverer.take(&self.consumer, &self.req.subscription.filter, None, free, wait) => t,
                    _ = stop.cancelled() => break,
                };
                match taken {
                    Ok(taken) => {
                        let expires = Instant::now() + ack_wait;
                        for t in &taken {
                            self.inflight.insert(t.stream_seq, expires);
                        }
                        match self.req.format {
                            Format::Json => {
                                for t in &taken {
                                    self.push(t).await;
                                }
                            }
                            Format::Binary => self.push_frame(taken).await,
                        }
                    }
                    Err(e) => {
                        tracing::warn!(subscription = %self.id, error = %e, "push pull failed");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
                if let Some(every) = self.every {
                    next_round += every;
                    if next_round < Instant::now() {
                        next_round = Instant::now() + every;
                    }
                }
                continue;
            }
            // Full, or not yet time: wait for a settle, the next round, or the stop.
            let wake = if due {
                Instant::now() + Duration::from_millis(500)
            } else {
                next_round
            };
            tokio::select! {
                m = settled.next() => {
                    if let Some(seq) = m.and_then(|m| std::str::from_utf8(&m.payload).ok()?.parse::<u64>().ok()) {
                        self.inflight.remove(&seq);
                    }
                }
                _ = tokio::time::sleep_until(wake) => {}
                _ = stop.cancelled() => break,
            }
        }
    }

    /// Pushes deliveries as one binary frame (the subscription asked for `binary`).
    async fn push_frame(&self, taken: Vec<crate::consume::Taken>) {
        if taken.is_empty() {
            return;
        }
        let d = &self.deliverer;
        let group = &self.req.subscription.group;
        let delivered = taken
            .into_iter()
            .map(|t| {
                let token = d.delivered(&t, group, &self.consumer_id, Some(&self.id));
                (t, token)
            })
            .collect();
        // One frame per chunk that decoders accept: at most MAX_BATCH_ENTRIES deliveries and
        // well under the server's max_payload.
        let max_bytes = (d.shared.client.server_info().max_payload / 2).max(64 * 1024);
        for chunk in frame_chunks(delivered, max_bytes) {
            let frame = crate::consume::delivery_batch(chunk, group).encode();
            if let Err(e) = d
                .shared
                .client
                .publish(self.req.deliver_subject.clone(), frame)
                .await
            {
                tracing::warn!(subscription = %self.id, error = %e, "push publish failed; JetStream redelivers after the ack wait");
            }
        }
    }

    /// Pushes one delivery as a NATS message with headers (the JSON form).
    async fn push(&self, t: &crate::consume::Taken) {
        let d = &self.deliverer;
        let token = d.delivered(
            t,
            &self.req.subscription.group,
            &self.consumer_id,
            Some(&self.id),
        );
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(h::MESSAGE_ID, t.message_id.to_string().as_str());
        headers.insert(h::TOPIC, t.topic.as_str());
        headers.insert(h::PRODUCER, t.producer.as_str());
        headers.insert(h::GROUP, self.req.subscription.group.as_str());
        headers.insert(h::DELIVERY_ATTEMPT, t.attempt.to_string().as_str());
        headers.insert(h::STREAM_SEQ, t.stream_seq.to_string().as_str());
        headers.insert(h::ACK_TOKEN, token.as_str());
        for (k, v) in &t.attrs {
            headers.insert(format!("{}{k}", h::ATTR_PREFIX).as_str(), v.as_str());
        }
        if let Err(e) = d
            .shared
            .client
            .publish_with_headers(self.req.deliver_subject.clone(), headers, t.payload.clone())
            .await
        {
            tracing::warn!(subscription = %self.id, error = %e, "push publish failed; JetStream redelivers after the ack wait");
        }
    }
}

/// Checks what a push subscription asks beyond its topic and group: not by message ID, a
/// plain deliver subject, a bounded window, a pace no faster than the minimum. Returns the
/// pace.
fn check_push_request(req: &SubscribeRequest) -> Result<Option<Duration>, WireError> {
    if req.subscription.message_id.is_some() {
        return Err(WireError::new(
            ErrorCode::BadRequest,
            "push by message id is not supported: fetch it by id instead",
        ));
    }
    if !valid_deliver_subject(&req.deliver_subject) {
        return Err(WireError::new(
            ErrorCode::BadRequest,
            format!("deliver_subject {:?} must be a plain subject (no wildcards, not msgtrail.* or $*), such as an inbox", req.deliver_subject),
        ));
    }
    if req.max_inflight == 0 || req.max_inflight > MAX_INFLIGHT {
        return Err(WireError::new(
            ErrorCode::BadRequest,
            format!("max_inflight must be 1 to {MAX_INFLIGHT}"),
        ));
    }
    let every = req.every_ms.filter(|ms| *ms > 0).map(Duration::from_millis);
    if every.is_some_and(|e| e < MIN_EVERY) {
        return Err(WireError::new(
            ErrorCode::BadRequest,
            "every_ms must be at least 10",
        ));
    }
    Ok(every)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consume::Taken;
    use msgtrail_core::{ClientId, MessageId};

    fn taken(payload: usize) -> (Taken, String) {
        (
            Taken {
                message_id: MessageId::new(),
                topic: "t".into(),
                producer: ClientId::new("p").unwrap(),
                attrs: Default::default(),
                payload: vec![0u8; payload].into(),
                attempt: 1,
                stream_seq: 1,
                ack_subject: "a".into(),
                settle_by_ms: 0,
                stored_at: None,
            },
            "token".into(),
        )
    }

    #[test]
    fn push_frames_stay_within_the_entry_and_byte_limits() {
        let many: Vec<_> = (0..2500).map(|_| taken(0)).collect();
        let sizes: Vec<usize> = frame_chunks(many, usize::MAX)
            .iter()
            .map(Vec::len)
            .collect();
        assert_eq!(
            sizes,
            [frame::MAX_BATCH_ENTRIES, frame::MAX_BATCH_ENTRIES, 452]
        );
        let big: Vec<_> = (0..5).map(|_| taken(400 * 1024)).collect();
        let sizes: Vec<usize> = frame_chunks(big, 512 * 1024).iter().map(Vec::len).collect();
        assert_eq!(
            sizes,
            [1, 1, 1, 1, 1],
            "a delivery larger than half the bound goes alone"
        );
        assert!(frame_chunks(vec![], 1).is_empty());
    }
}
