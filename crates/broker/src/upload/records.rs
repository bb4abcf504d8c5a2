//! The stage records of the upload path: P1 from a batch entry's `sent_at`, P2, P3, and the
//! refusals (of an entry, or of a request whose headers fail).

use super::*;

impl Uploader {
    /// Records P1 from a batch entry's `sent_at`: the producer's send time rode in the
    /// request instead of a separate report.
    pub(super) fn record_sent(&self, channel: &OpenChannel, raw: &RawUpload<'_>) {
        if raw.sent_at == 0 || !self.shared.sink.enabled() {
            return;
        }
        let Ok(request_id) = RequestId::new(raw.request_id) else {
            return;
        };
        let mut p1 = StageRecord::at(Stage::UploadSent, raw.sent_at);
        p1.request_id = Some(request_id);
        p1.producer = Some(channel.client_id.clone());
        p1.topic = Topic::new(raw.topic).ok().map(|t| t.to_string());
        p1.attempt = Some(raw.attempt);
        p1.traceparent = raw.traceparent.map(str::to_owned);
        p1.service = Some(channel.service_name.clone());
        self.shared.sink.record(p1);
    }

    /// Records a refused upload as P2 with outcome `refused`, so that the trajectory of the
    /// request says why it went no further. Only with a valid request ID: anything else
    /// cannot be placed on a trajectory.
    pub(super) fn record_refusal(
        &self,
        channel: &OpenChannel,
        raw: &RawUpload<'_>,
        at: u64,
        e: &WireError,
    ) {
        let Ok(request_id) = RequestId::new(raw.request_id) else {
            return;
        };
        let mut p2 = StageRecord::at(Stage::UploadReceived, at);
        p2.request_id = Some(request_id);
        p2.producer = Some(channel.client_id.clone());
        p2.topic = Topic::new(raw.topic).ok().map(|t| t.to_string());
        p2.attempt = Some(raw.attempt);
        p2.set_outcome(StoreOutcome::Refused);
        p2.detail = Some(e.to_string());
        p2.service = Some(self.shared.config.service_name.clone());
        self.shared.sink.record(p2);
    }

    /// [`Self::record_refusal`] for a single upload, whose fields are still in its headers:
    /// only on an open producer channel.
    pub(super) async fn record_header_refusal(&self, headers: &HeaderMap, at: u64, e: &WireError) {
        let Some(channel) = headers.get(h::CHANNEL) else {
            return;
        };
        let Ok(channel) = self
            .shared
            .channels
            .lookup_role(channel.as_str(), Role::Producer)
            .await
        else {
            return;
        };
        let raw = RawUpload {
            request_id: headers.get(h::REQUEST_ID).map_or("", |v| v.as_str()),
            topic: headers.get(h::TOPIC).map_or("", |v| v.as_str()),
            attempt: headers
                .get(h::ATTEMPT)
                .and_then(|a| a.as_str().parse().ok())
                .unwrap_or(1),
            sent_at: 0,
            traceparent: None,
            attrs: vec![],
            payload: Bytes::new(),
        };
        self.record_refusal(&channel, &raw, at, e);
    }

    pub(super) fn base_record(
        &self,
        stage: Stage,
        at: u64,
        channel: &OpenChannel,
        up: &Upload,
        id: MessageId,
    ) -> StageRecord {
        let mut r = StageRecord::at(stage, at);
        r.message_id = Some(id);
        r.request_id = Some(up.request_id.clone());
        r.producer = Some(channel.client_id.clone());
        r.topic = Some(up.topic.to_string());
        r.attempt = Some(up.attempt);
        r.service = Some(self.shared.config.service_name.clone());
        r
    }

    pub(super) async fn original_id(&self, seq: u64) -> Result<MessageId, WireError> {
        let original = self.shared.stream.direct_get(seq).await.map_err(|e| {
            WireError::new(
                ErrorCode::Unavailable,
                format!("cannot read the original of a duplicate: {e}"),
            )
        })?;
        original
            .headers
            .get(h::MESSAGE_ID)
            .and_then(|v| v.as_str().parse().ok())
            .ok_or_else(|| {
                WireError::new(
                    ErrorCode::Internal,
                    format!("stored message {seq} has no message id"),
                )
            })
    }
}
