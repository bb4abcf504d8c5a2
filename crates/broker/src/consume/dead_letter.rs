//! Dead letters: copying a message to the dead-letter stream (R1 `dead_letter`), also when
//! JetStream reports the maximum deliveries reached.

use super::*;

impl Deliverer {
    /// Copies a message to the dead-letter stream and records R1 `dead_letter`.
    pub(crate) async fn dead_letter(
        &self,
        seq: u64,
        group: &GroupId,
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
                let headers = dead_letter_headers(&m.headers, group, seq, why);
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
            let Some(group) = group_of_durable(consumer).and_then(|g| GroupId::new(g).ok()) else {
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

/// The headers of a dead letter: the original's, `Nats-Msg-Id: dlq:<group>:<seq>` instead of
/// its own, `Msgtrail-Dead-Letter-Reason` and `Msgtrail-Group`. A message stored with
/// `Msgtrail-Stored` (docs/PROTOCOL.md §14.1) names its producer only in the `Nats-Msg-Id`
/// replaced here, so its copy gets `Msgtrail-Producer` (dead letters are rare; operators read
/// them with the `nats` CLI).
pub(super) fn dead_letter_headers(
    original: &async_nats::HeaderMap,
    group: &GroupId,
    seq: u64,
    why: &str,
) -> async_nats::HeaderMap {
    let mut headers = original.clone();
    let get = |n: &str| original.get(n).map(|v| v.as_str());
    if get(h::PRODUCER).is_none() {
        if let Some(producer) = msgtrail_core::stored::producer(get) {
            headers.insert(h::PRODUCER, producer);
        }
    }
    headers.insert(h::NATS_MSG_ID, format!("dlq:{group}:{seq}").as_str());
    headers.insert(
        "Msgtrail-Dead-Letter-Reason",
        why.replace(['\r', '\n'], " ").as_str(),
    );
    headers.insert(h::GROUP, group.as_str());
    headers
}
