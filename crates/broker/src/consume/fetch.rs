//! `fetch`: a pull of matching messages, or of one message by ID, and the N1 notice when none
//! matched.

use super::*;

impl Deliverer {
    /// `fetch`: pull matching messages, or answer with a no-matching-message notice; the
    /// reply is a JSON [`FetchReply`] or a binary [`DeliveryBatch`], as the request asks.
    #[tracing::instrument(name = "fetch", skip_all, fields(
        channel = %req.channel,
        group = %req.subscription.group,
        topic = %req.subscription.topic,
        message_id = req.subscription.message_id.map(tracing::field::display),
        max = req.max,
    ))]
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
    pub(super) async fn take_by_id(
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

    pub(super) async fn find_by_id(
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
}
