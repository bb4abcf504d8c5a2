//! Batched settles (`msgtrail.v1.settle`): one request settles many deliveries — ack, nack
//! with an optional delay, or term with a reason — each checked on its own, so a forged or
//! foreign token fails alone. The consumer's own stage records about those deliveries (C2/C3,
//! C6/C7, X1/X2) may ride along and are relayed with the same checks as a stage report.
//!
//! The request is a binary [`SettleBatch`] frame or JSON ([`SettleRequest`]); the reply has
//! the same form. Each settle is answered ok only once JetStream has confirmed it (a double
//! ack, `Deliverer::settle`); the whole batch's settles are in flight at once, so a batch
//! costs one round trip to the server, not one per delivery. A settle after its delivery's
//! ack wait is refused (`delivery_expired`). The reply waits until the batch's stage records
//! are stored in the stage stream ([`STORED_WAIT`] at most): a broker killed right after
//! answering loses no record of what it answered.

use crate::channels::OpenChannel;
use crate::consume::Deliverer;
use crate::push::PushManager;
use crate::relay::{Relay, TokenCache};
use crate::upload::required;
use bytes::Bytes;
use msgtrail_core::frame::{self, SettleBatch, SettleEntry, SettleResults};
use msgtrail_core::headers as h;
use msgtrail_core::wire::{ItemResult, SettleReply, SettleRequest};
use msgtrail_core::{ErrorCode, Role, WireError};

/// Longest a settle waits for its stage records to be stored before answering anyway (the
/// writer keeps retrying them): about a stage-stream leader election.
pub(crate) const STORED_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Handles settle batches.
#[derive(Debug, Clone)]
pub(crate) struct Settler {
    /// Settles deliveries.
    pub deliverer: Deliverer,
    /// Frees push subscriptions' in-flight slots.
    pub push: PushManager,
    /// Relays the records that ride along.
    pub relay: Relay,
}

impl Settler {
    /// Handles one settle request, binary or JSON.
    pub(crate) async fn handle(&self, msg: &async_nats::Message) -> Result<Bytes, WireError> {
        if frame::frame_kind(&msg.payload) == Some(frame::FrameKind::SettleBatch) {
            let headers = msg.headers.as_ref().ok_or_else(|| {
                WireError::new(
                    ErrorCode::BadRequest,
                    format!("missing header {}", h::CHANNEL),
                )
            })?;
            let channel = self
                .consumer_channel(required(headers, h::CHANNEL)?)
                .await?;
            let batch = SettleBatch::decode(&msg.payload)?;
            let mut tokens = TokenCache::new();
            let reports = self
                .relay
                .relay_reported(&channel, batch.reports, batch.reports_invalid, &mut tokens)
                .await;
            let results = self.settle_all(&channel, &batch.entries, &mut tokens).await;
            self.records_stored().await;
            return Ok(SettleResults {
                results: results.into_iter().map(Result::err).collect(),
                reports,
            }
            .encode());
        }
        let req: SettleRequest = serde_json::from_slice(&msg.payload).map_err(|e| {
            WireError::new(ErrorCode::BadRequest, format!("invalid request body: {e}"))
        })?;
        let channel = self.consumer_channel(&req.channel).await?;
        let entries: Vec<SettleEntry> = req
            .settles
            .into_iter()
            .map(|s| SettleEntry {
                token: s.token,
                kind: s.kind,
                delay_ms: s.delay_ms,
                reason: s.reason.unwrap_or_default(),
            })
            .collect();
        if entries.len() > frame::MAX_BATCH_ENTRIES {
            return Err(too_many(entries.len()));
        }
        let results = self
            .settle_all(&channel, &entries, &mut TokenCache::new())
            .await;
        self.records_stored().await;
        let reply = SettleReply {
            results: results.iter().map(ItemResult::of).collect(),
        };
        Ok(serde_json::to_vec(&reply)
            .expect("replies serialize")
            .into())
    }

    /// Waits until this request's records (C4/C8, R1, and what rode along) are in the stage
    /// stream, so that a broker killed right after its reply loses none of them.
    async fn records_stored(&self) {
        let sink = &self.deliverer.shared.sink;
        if !sink.stored(STORED_WAIT).await {
            tracing::warn!("settle answered before its stage records were stored (the stage stream is slow or electing a leader); they are retried");
        }
    }

    async fn consumer_channel(&self, id: &str) -> Result<OpenChannel, WireError> {
        self.deliverer
            .shared
            .channels
            .lookup_role(id, Role::Consumer)
            .await
    }

    /// Settles every entry; an entry's error is its own. The tokens are checked one after
    /// another (the cache needs it), then every settle is sent to JetStream at once and their
    /// confirmations are awaited together: a batch costs one round trip to the server, not
    /// one per delivery.
    async fn settle_all(
        &self,
        channel: &OpenChannel,
        entries: &[SettleEntry],
        tokens: &mut TokenCache,
    ) -> Vec<Result<(), WireError>> {
        let decoded: Vec<_> = entries
            .iter()
            .map(|e| tokens.decode(&e.token, &channel.client_id, &self.deliverer.shared.key))
            .collect();
        let settles = entries.iter().zip(decoded).map(|(e, token)| async move {
            let token = token?;
            let reason = Some(e.reason.as_str()).filter(|r| !r.is_empty());
            self.deliverer
                .settle(&token, e.kind, e.delay_ms, reason)
                .await
        });
        let settled = futures::future::join_all(settles).await;
        let mut results = Vec::with_capacity(settled.len());
        for s in settled {
            match s {
                Ok(slot) => {
                    if let Some((sub, seq)) = slot {
                        self.push.notify_settled(&sub, seq).await;
                    }
                    results.push(Ok(()));
                }
                Err(err) => {
                    self.deliverer.shared.metrics.error(err.code);
                    results.push(Err(err));
                }
            }
        }
        results
    }
}

fn too_many(n: usize) -> WireError {
    WireError::new(
        ErrorCode::BadRequest,
        format!(
            "{n} settles in one request; at most {}",
            frame::MAX_BATCH_ENTRIES
        ),
    )
}
