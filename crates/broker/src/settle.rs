//! Batched settles (`msgtrail.v1.settle`): one request settles many deliveries — ack, nack
//! with an optional delay, or term with a reason — each checked on its own, so a forged or
//! foreign token fails alone. The consumer's own stage records about those deliveries (C2/C3,
//! C6/C7, X1/X2) may ride along and are relayed with the same checks as a stage report —
//! after the settles, each with its token, or (frame version 2) inside the settle of their
//! delivery, proven by the settle's token: that token is verified once, for the settle and
//! its records together (`Relay::relay_own`).
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
use msgtrail_core::wire::{ItemResult, SettleKind, SettleReply, SettleRequest};
use msgtrail_core::{ErrorCode, Role, WireError};
use std::sync::atomic::Ordering;

/// Longest a settle (or a stage report) waits for its stage records to be stored before
/// answering anyway (the writer keeps retrying them): a typical stage-stream leader election.
///
/// It is chosen so that the reply reaches the client before the SDK's default request
/// timeout (5 s) even when the settle also waited the whole
/// [`crate::consume::SETTLE_CONFIRM_WAIT`] (1.5 s) for JetStream's confirmation: 1.5 s + 3 s
/// leaves 0.5 s for the trips. A wait as long as the client's timeout (5 s until round 11)
/// turned every long election into client timeouts, retries after the delivery's deadline
/// and ambiguous acks (RELIABILITY.md, findings 6 and 8). The trade-off: a settle answered
/// after a longer election is answered before its records are stored; they are not lost
/// unless this broker is also killed before its writer stores them (two faults at once).
pub(crate) const STORED_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The SDK's default request timeout (`msgtrail-client`, 5 s): a settle's longest wait must
/// end before it, with room for the trips.
const SDK_DEFAULT_TIMEOUT_MS: u128 = 5_000;
const _: () = assert!(
    crate::consume::SETTLE_CONFIRM_WAIT.as_millis() + STORED_WAIT.as_millis() + 250
        <= SDK_DEFAULT_TIMEOUT_MS,
    "a settle's longest wait must end before the SDK's default request timeout"
);

/// What is left of a request's reply time for waiting on its stage records: [`STORED_WAIT`],
/// or less when the client said in `Msgtrail-Timeout-Ms` that it gives up sooner, less
/// [`REPLY_MARGIN`] for the reply's trip and what the request already took here. A reply is
/// worth more to a client before its timeout than after it: after it the client retries,
/// possibly past the delivery's deadline, and cannot tell whether its first settle was applied
/// (RELIABILITY.md, findings 6 and 8).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReplyBudget {
    received: std::time::Instant,
    client_timeout: Option<std::time::Duration>,
}

/// Room left for a reply's trip back to the client.
pub(crate) const REPLY_MARGIN: std::time::Duration = std::time::Duration::from_millis(200);

impl ReplyBudget {
    /// The budget of a request received now, from its headers; a `Msgtrail-Timeout-Ms` that is
    /// not a whole number of milliseconds is refused (`bad_request`).
    pub(crate) fn of(headers: Option<&async_nats::HeaderMap>) -> Result<Self, WireError> {
        let client_timeout = match headers.and_then(|hs| hs.get(h::TIMEOUT_MS)) {
            None => None,
            Some(v) => Some(v.as_str().trim().parse::<u64>().map_err(|_| {
                WireError::new(
                    ErrorCode::BadRequest,
                    format!(
                        "header {} must be a whole number of milliseconds, not {:?}",
                        h::TIMEOUT_MS,
                        v.as_str()
                    ),
                )
            })?),
        }
        .map(std::time::Duration::from_millis);
        Ok(ReplyBudget {
            received: std::time::Instant::now(),
            client_timeout,
        })
    }

    /// How long the reply may still wait for its stage records.
    pub(crate) fn stored_wait(&self) -> std::time::Duration {
        match self.client_timeout {
            None => STORED_WAIT,
            Some(t) => t
                .saturating_sub(REPLY_MARGIN)
                .saturating_sub(self.received.elapsed())
                .min(STORED_WAIT),
        }
    }
}

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
    #[tracing::instrument(name = "settle", skip_all, fields(entries = tracing::field::Empty))]
    pub(crate) async fn handle(&self, msg: &async_nats::Message) -> Result<Bytes, WireError> {
        let wait = ReplyBudget::of(msg.headers.as_ref())?;
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
            let mut batch = SettleBatch::decode(&msg.payload)?;
            tracing::Span::current().record("entries", batch.entries.len());
            let mut tokens = TokenCache::new();
            let mut reports = self
                .relay
                .relay_reported(&channel, batch.reports, batch.reports_invalid, &mut tokens)
                .await;
            let own: Vec<OwnRecords> = batch
                .entries
                .iter_mut()
                .map(|e| (std::mem::take(&mut e.records), e.records_invalid.take()))
                .collect();
            let (results, relayed) = self
                .settle_all(&channel, &batch.entries, own, &mut tokens)
                .await;
            reports.accepted += relayed as u32;
            self.records_stored(wait).await;
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
                delay_ms: s.delay_ms,
                reason: s.reason.unwrap_or_default(),
                ..SettleEntry::new(s.token, s.kind)
            })
            .collect();
        if entries.len() > frame::MAX_BATCH_ENTRIES {
            return Err(too_many(entries.len()));
        }
        let (results, _) = self
            .settle_all(&channel, &entries, Vec::new(), &mut TokenCache::new())
            .await;
        self.records_stored(wait).await;
        let reply = SettleReply {
            results: results.iter().map(ItemResult::of).collect(),
        };
        Ok(serde_json::to_vec(&reply)
            .expect("replies serialize")
            .into())
    }

    /// Waits until this request's records (C4/C8, R1, and what rode along) are in the stage
    /// stream, so that a broker killed right after its reply loses none of them.
    async fn records_stored(&self, budget: ReplyBudget) {
        let sink = &self.deliverer.shared.sink;
        if !sink.stored(budget.stored_wait()).await {
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
    /// another (the cache needs it); then, per JetStream consumer, every settle but the last
    /// goes as a plain publish and the last as a request that the consumer answers once it
    /// has processed it (a double ack). JetStream processes one connection's settles of one
    /// consumer in order, so that answer confirms the earlier ones too: a batch costs one
    /// confirmation per consumer, not one per delivery ([`consumer_key`]).
    ///
    /// `own` holds each settle's own records (empty for a version 1 frame or JSON): they are
    /// relayed once their settle's token is verified, whether or not the settle is then
    /// applied in time; the second value is how many were.
    async fn settle_all(
        &self,
        channel: &OpenChannel,
        entries: &[SettleEntry],
        mut own: Vec<OwnRecords>,
        tokens: &mut TokenCache,
    ) -> (Vec<Result<(), WireError>>, usize) {
        let d = &self.deliverer;
        let mut relayed = 0;
        own.resize_with(entries.len(), Default::default);
        // Settles past their deadline, with their tokens: refused after JetStream is asked
        // whether the group already settled them (`Deliverer::refuse_late`).
        let mut late = Vec::new();
        let mut prepared: Vec<Result<Prepared, WireError>> = entries
            .iter()
            .zip(own)
            .enumerate()
            .map(|(i, (e, (records, invalid)))| {
                let token = tokens.decode(&e.token, &channel.client_id, &d.shared.key)?;
                if !records.is_empty() || invalid.is_some() {
                    relayed += self.relay.relay_own(channel, &token, records, invalid);
                }
                if let Err(expired) = d.check_in_time(&token, e.kind) {
                    late.push((i, token));
                    return Err(expired);
                }
                let (effective, payload) = d.jetstream_settle(&token, e.kind, e.delay_ms);
                Ok(Prepared {
                    token,
                    effective,
                    payload,
                    last: false,
                })
            })
            .collect();
        for (i, token) in late {
            if let Err(expired) = &prepared[i] {
                let refusal = d.refuse_late(&token, expired.clone()).await;
                prepared[i] = Err(refusal);
            }
        }
        // The last settle of each consumer is the confirmed one.
        let mut last_of = std::collections::HashMap::new();
        for (i, p) in prepared.iter().enumerate() {
            if let Ok(p) = p {
                last_of.insert(consumer_key(&p.token.a).to_owned(), i);
            }
        }
        for &i in last_of.values() {
            if let Ok(p) = &mut prepared[i] {
                p.last = true;
            }
        }
        let connects = || {
            d.shared
                .client
                .statistics()
                .connects
                .load(Ordering::Relaxed)
        };
        let before = connects();
        let mut sent: Vec<Option<Result<(), WireError>>> = Vec::with_capacity(prepared.len());
        for p in &prepared {
            sent.push(match p {
                Ok(p) if !p.last => Some(
                    d.shared
                        .client
                        .publish(p.token.a.clone(), p.payload.clone())
                        .await
                        .map_err(|e| unconfirmed(p.effective, &e)),
                ),
                _ => None,
            });
        }
        let confirms = prepared.iter().enumerate().filter_map(|(i, p)| match p {
            Ok(p) if p.last => Some(async move {
                let r = d.confirm(&p.token, p.effective, p.payload.clone()).await;
                (consumer_key(&p.token.a).to_owned(), (i, r))
            }),
            _ => None,
        });
        let confirmed: std::collections::HashMap<String, (usize, Result<(), WireError>)> =
            futures::future::join_all(confirms)
                .await
                .into_iter()
                .collect();
        // A reconnect in between may have lost plain settles sent on the old connection,
        // which the new one's confirmation does not cover.
        let reconnected = connects() != before;
        let mut results = Vec::with_capacity(prepared.len());
        for ((p, sent), e) in prepared.into_iter().zip(sent).zip(entries) {
            let outcome = p.and_then(|p| {
                let (_, group) = &confirmed[consumer_key(&p.token.a)];
                match (sent, group) {
                    (_, Err(err)) => Err(err.clone()),
                    (Some(Err(err)), _) => Err(err),
                    (Some(Ok(())), Ok(())) if reconnected => Err(WireError::new(
                        ErrorCode::Unavailable,
                        format!(
                            "the connection to NATS was re-established while the {} was sent; \
                             settle again with the same token",
                            p.effective.as_str()
                        ),
                    )),
                    _ => Ok(p),
                }
            });
            match outcome {
                Ok(p) => {
                    let reason = Some(e.reason.as_str()).filter(|r| !r.is_empty());
                    d.settled(&p.token, e.kind, p.effective, reason).await;
                    if let Some(sub) = &p.token.s {
                        self.push.notify_settled(sub, p.token.q).await;
                    }
                    results.push(Ok(()));
                }
                Err(err) => {
                    d.shared.metrics.error(err.code);
                    results.push(Err(err));
                }
            }
        }
        (results, relayed)
    }
}

/// A settle's own records as decoded, and why they were refused by the decoder, if they were.
type OwnRecords = (Vec<msgtrail_core::StageRecord>, Option<String>);

/// One settle, checked and ready for JetStream.
struct Prepared {
    token: std::sync::Arc<crate::token::AckToken>,
    effective: SettleKind,
    payload: Bytes,
    /// The last settle of its consumer in this batch: sent as a double ack.
    last: bool,
}

/// The JetStream consumer an ack subject belongs to: the subject without its per-delivery
/// tokens (`$JS.ACK.<stream>.<consumer>` + 5 tokens, or with domain and account hash
/// `$JS.ACK.<domain>.<hash>.<stream>.<consumer>` + 6). Any other shape is its own key, so
/// its settle is confirmed on its own.
fn consumer_key(ack_subject: &str) -> &str {
    let tokens = ack_subject.split('.').count();
    let keep = match tokens {
        9 => 4,
        12.. => 6,
        _ => return ack_subject,
    };
    match ack_subject.match_indices('.').nth(keep - 1) {
        Some((at, _)) => &ack_subject[..at],
        None => ack_subject,
    }
}

fn unconfirmed(kind: SettleKind, e: &dyn std::fmt::Display) -> WireError {
    WireError::new(
        ErrorCode::Unavailable,
        format!(
            "the {} was not sent to JetStream: {e}; settle again with the same token",
            kind.as_str()
        ),
    )
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

#[cfg(test)]
mod tests {
    use super::consumer_key;

    #[test]
    fn ack_subjects_group_by_their_consumer() {
        assert_eq!(
            consumer_key("$JS.ACK.MSGTRAIL_MESSAGES.g-billing.1.17.9.1700000000000000000.3"),
            "$JS.ACK.MSGTRAIL_MESSAGES.g-billing"
        );
        assert_eq!(
            consumer_key("$JS.ACK.hub.ACCHASH.MSGTRAIL_MESSAGES.g-billing.1.17.9.170.3.xyz"),
            "$JS.ACK.hub.ACCHASH.MSGTRAIL_MESSAGES.g-billing"
        );
        assert_eq!(consumer_key("$JS.ACK.odd.shape"), "$JS.ACK.odd.shape");
    }
}
