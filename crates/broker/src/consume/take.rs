//! Taking messages from a group's JetStream consumer: the subscription check, the group's
//! durable consumer, the attribute filter, and the delivery records (C5/C1, R1 `redeliver`).

use super::*;
use msgtrail_core::sync::Recover;

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
                .map_err(|e| WireError::new(ErrorCode::InvalidAttribute, e.to_string()))?;
            if &key != k {
                return Err(WireError::new(
                    ErrorCode::InvalidAttribute,
                    format!("attribute filter key {k:?} must be lowercase"),
                ));
            }
            h::validate_attr_value(k, v)
                .map_err(|e| WireError::new(ErrorCode::InvalidAttribute, e.to_string()))?;
        }
        Ok(())
    }

    /// The group's durable consumer for a subscription, created on first use.
    pub(crate) async fn group_consumer(
        &self,
        sub: &Subscription,
    ) -> Result<jetstream::consumer::PullConsumer, WireError> {
        let name = durable_name(sub);
        if let Some(c) = self.consumers.lock().recover().get(&name) {
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
            .recover()
            .insert(name, consumer.clone());
        Ok(consumer)
    }

    pub(super) async fn create_consumer(
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
        loop {
            // Whatever is there now, without waiting.
            let got = match self
                .pull_ready(consumer, filter, only, max, ack_wait, &mut out)
                .await
            {
                Ok(got) => got,
                Err(e) => {
                    if !out.is_empty() {
                        return Ok(out);
                    }
                    if pull_status(&e) && tokio::time::Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    return Err(unavailable(&e));
                }
            };
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
            let woke = self
                .wait_for_one(consumer, filter, only, remaining, ack_wait, &mut out)
                .await
                .map_err(|e| unavailable(&e))?;
            if !out.is_empty() || (!woke && tokio::time::Instant::now() >= deadline) {
                return Ok(out);
            }
        }
    }

    /// Pulls what the consumer has now, without waiting, up to `max` messages in `out`;
    /// how many it pulled (taken or skipped).
    async fn pull_ready(
        &self,
        consumer: &jetstream::consumer::PullConsumer,
        filter: &BTreeMap<String, String>,
        only: Option<(MessageId, u64)>,
        max: usize,
        ack_wait: Duration,
        out: &mut Vec<Taken>,
    ) -> Result<usize, async_nats::Error> {
        let mut batch = consumer
            .fetch()
            .max_messages(max - out.len())
            .messages()
            .await?;
        let mut got = 0;
        while let Some(m) = batch.next().await {
            let m = m?;
            got += 1;
            if let Some(t) = self.accept(m, filter, only, ack_wait).await {
                out.push(t);
            }
        }
        Ok(got)
    }

    /// Waits up to `remaining` for one message and adds it to `out` if it is for this
    /// subscription; whether one came at all.
    async fn wait_for_one(
        &self,
        consumer: &jetstream::consumer::PullConsumer,
        filter: &BTreeMap<String, String>,
        only: Option<(MessageId, u64)>,
        remaining: Duration,
        ack_wait: Duration,
        out: &mut Vec<Taken>,
    ) -> Result<bool, async_nats::Error> {
        let mut one = consumer
            .batch()
            .max_messages(1)
            .expires(remaining)
            .messages()
            .await?;
        let mut woke = false;
        while let Some(m) = one.next().await {
            let m = m?;
            woke = true;
            if let Some(t) = self.accept(m, filter, only, ack_wait).await {
                out.push(t);
            }
        }
        Ok(woke)
    }

    /// Parses a JetStream message; acks and drops it if it is not for this subscription.
    pub(super) async fn accept(
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
        let parsed = m
            .headers
            .as_ref()
            .and_then(|hs| delivery_fields(hs, m.subject.as_str()));
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
        group: &GroupId,
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

    pub(super) fn record(&self, stage: Stage, token: &AckToken) -> StageRecord {
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
}

/// What a delivery needs of a stored message (either layout, `msgtrail_core::stored`): its
/// message ID, producer (`Msgtrail-Producer`, or from `Nats-Msg-Id`), topic (from the
/// subject) and attributes. `None` for a message that is not a msgtrail message. Read in
/// place: a clone of the header map is an allocation per header.
pub(super) fn delivery_fields(
    hs: &async_nats::HeaderMap,
    subject: &str,
) -> Option<(MessageId, ClientId, String, BTreeMap<String, String>)> {
    let get = |n: &str| hs.get(n).map(|v| v.as_str());
    let message_id: MessageId = get(h::MESSAGE_ID)?.parse().ok()?;
    let producer = ClientId::new(msgtrail_core::stored::producer(get)?).ok()?;
    let topic = topic_of_subject(subject)?.to_owned();
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
}

/// Whether a failed pull is JetStream answering it with a status instead of messages, a reason
/// to pull again until the deadline rather than to fail the fetch: a consumer JetStream has
/// just created (or moved, on a cluster) answers 503 (no responders) until it is placed, and
/// 409 while its leader changes, for a moment. async-nats 0.51 gives such a status no kind: its
/// `Batch` stream yields it as a `std::io::Error` (only its text holds the status), where a
/// fetch that could not start is a `BatchError` with a `BatchErrorKind`. The type is the match.
fn pull_status(e: &async_nats::Error) -> bool {
    e.is::<std::io::Error>()
}

#[cfg(test)]
mod pull_status_tests {
    use super::pull_status;
    use async_nats::jetstream::consumer::pull::{BatchError, BatchErrorKind};

    #[test]
    fn a_status_reply_is_transient_and_a_fetch_that_did_not_start_is_not() {
        let status: async_nats::Error = Box::new(std::io::Error::other(
            "error while processing messages from the stream: 503, None",
        ));
        assert!(pull_status(&status));
        for kind in [
            BatchErrorKind::Subscribe,
            BatchErrorKind::Pull,
            BatchErrorKind::Flush,
        ] {
            let start: async_nats::Error = Box::new(BatchError::new(kind));
            assert!(!pull_status(&start), "{kind}");
        }
    }
}
