//! `ack`: settling a delivery (ack, nack, term), confirmed by JetStream before the broker
//! answers, and refused as `delivery_expired` past the delivery's ack wait.

use super::*;

impl Deliverer {
    /// `ack`: settles one delivery (ack, nack with optional delay, or term); returns the
    /// push subscription and sequence whose in-flight slot the settle frees, if any.
    #[tracing::instrument(name = "ack", skip_all, fields(channel = %req.channel, kind = ?req.kind))]
    pub(crate) async fn ack(
        &self,
        req: AckRequest,
        budget: crate::settle::ReplyBudget,
    ) -> Result<Option<(String, u64)>, WireError> {
        let channel = self
            .shared
            .channels
            .lookup_role(&req.channel, Role::Consumer)
            .await?;
        let token = AckToken::decode_for(&req.token, &channel.client_id, &self.shared.key)?;
        let freed = self
            .settle(&token, req.kind, req.delay_ms, req.reason.as_deref())
            .await?;
        // As for settle batches: the reply waits for the settle's records to be stored.
        let _ = self.shared.sink.stored(budget.stored_wait()).await;
        Ok(freed)
    }

    /// Settles one delivery whose token was verified for the settling consumer: refuses it
    /// when its ack wait has run out, tells JetStream and waits for its confirmation, then
    /// records C4/C8 (and R1 for a dead letter). Settles of a batch run concurrently: each
    /// waits for its own confirmation, all of them in flight at once.
    pub(crate) async fn settle(
        &self,
        token: &AckToken,
        kind: SettleKind,
        delay_ms: Option<u64>,
        reason: Option<&str>,
    ) -> Result<Option<(String, u64)>, WireError> {
        if let Err(expired) = self.check_in_time(token, kind) {
            return Err(self.refuse_late(token, expired).await);
        }
        let (effective, payload) = self.jetstream_settle(token, kind, delay_ms);
        self.confirm(token, effective, payload).await?;
        self.settled(token, kind, effective, reason).await;
        Ok(token.s.clone().map(|s| (s, token.q)))
    }

    /// Refuses a settle that comes after the delivery's ack wait ran out (counted in
    /// `settles_expired`). Nothing goes to JetStream: the delivery is no longer this
    /// consumer's, and an ack JetStream might still take would be one that it answers the same
    /// way whether it took it or not (after a dead letter).
    pub(crate) fn check_in_time(
        &self,
        token: &AckToken,
        kind: SettleKind,
    ) -> Result<(), WireError> {
        let Some(late_ms) = token.expired_by(unix_ms()) else {
            return Ok(());
        };
        Metrics::inc(&self.shared.metrics.settles_expired);
        let next = if token.n >= self.shared.config.max_deliver {
            "it was the last allowed attempt, so the message is dead-lettered"
        } else {
            "the message is delivered again"
        };
        Err(WireError::new(
            ErrorCode::DeliveryExpired,
            format!(
                "{} of delivery attempt {} came {late_ms} ms after the delivery's ack wait ran out: \
                 JetStream no longer holds this delivery ({next}); the {} was not applied",
                kind.as_str(),
                token.n,
                kind.as_str(),
            ),
        ))
    }

    /// The refusal of a settle past its deadline (`expired`, from [`Self::check_in_time`]):
    /// `already_settled` when JetStream shows the message settled in the group — its
    /// consumer's ack floor at or past the message's stream sequence, so it was acked (by an
    /// earlier attempt of this very settle whose answer was lost, or by another delivery) or
    /// dead-lettered — and `expired` otherwise (still pending: it is delivered again). A
    /// retry after a lost answer thus learns that the group is done instead of "not applied"
    /// (RELIABILITY.md, finding 8). One consumer-info request, on this rare path only; no
    /// answer within [`SETTLE_CONFIRM_WAIT`] keeps `expired`.
    pub(crate) async fn refuse_late(&self, token: &AckToken, expired: WireError) -> WireError {
        let Some(consumer) = ack_subject_consumer(&token.a) else {
            return expired;
        };
        let info = tokio::time::timeout(
            SETTLE_CONFIRM_WAIT,
            self.shared.stream.consumer_info(consumer),
        )
        .await;
        match info {
            Ok(Ok(info)) if info.ack_floor.stream_sequence >= token.q => {
                Metrics::inc(&self.shared.metrics.settles_already_settled);
                WireError::new(
                    ErrorCode::AlreadySettled,
                    format!(
                        "delivery attempt {} came after its ack wait, and the message (stream \
                         sequence {}) is already settled in this group: JetStream's ack floor is \
                         at {} (it was acked, by an earlier attempt of this settle or another \
                         delivery, or dead-lettered); nothing is left to do",
                        token.n, token.q, info.ack_floor.stream_sequence
                    ),
                )
            }
            _ => expired,
        }
    }

    /// What to send JetStream: a nack of the last allowed attempt is a dead letter, so it is
    /// sent as a term.
    pub(crate) fn jetstream_settle(
        &self,
        token: &AckToken,
        kind: SettleKind,
        delay_ms: Option<u64>,
    ) -> (SettleKind, Bytes) {
        let last_attempt = token.n >= self.shared.config.max_deliver;
        match kind {
            SettleKind::Ack => (SettleKind::Ack, Bytes::from_static(b"+ACK")),
            SettleKind::Nack if !last_attempt => match delay_ms {
                Some(ms) => (
                    SettleKind::Nack,
                    format!("-NAK {{\"delay\": {}}}", u128::from(ms) * 1_000_000).into(),
                ),
                None => (SettleKind::Nack, Bytes::from_static(b"-NAK")),
            },
            SettleKind::Nack | SettleKind::Term => (SettleKind::Term, Bytes::from_static(b"+TERM")),
        }
    }

    /// Sends the settle to the delivery's ack subject as a request and waits for the
    /// consumer's leader to answer (a double ack): an ok then means JetStream took it, not
    /// only that it left this broker. In a cluster the leader answers once the ack is
    /// replicated.
    pub(crate) async fn confirm(
        &self,
        token: &AckToken,
        effective: SettleKind,
        payload: Bytes,
    ) -> Result<(), WireError> {
        let request = async_nats::Request::new()
            .payload(payload)
            .timeout(Some(SETTLE_CONFIRM_WAIT));
        let answered = self
            .shared
            .client
            .send_request(token.a.clone(), request)
            .await;
        answered.map(|_| ()).map_err(|e| {
            use async_nats::RequestErrorKind as K;
            let why = match e.kind() {
                K::TimedOut => format!(
                    "JetStream did not confirm the {} within {} ms",
                    effective.as_str(),
                    SETTLE_CONFIRM_WAIT.as_millis()
                ),
                K::NoResponders => format!(
                    "no JetStream consumer answered the {} (its leader is being elected, or the \
                     consumer is gone)",
                    effective.as_str()
                ),
                _ => format!("JetStream did not take the {}: {e}", effective.as_str()),
            };
            WireError::new(
                ErrorCode::Unavailable,
                format!("{why}; settle again with the same token"),
            )
        })
    }

    /// Counts a confirmed settle and records C4/C8 (and R1 `dead_letter` for a term).
    pub(crate) async fn settled(
        &self,
        token: &AckToken,
        kind: SettleKind,
        effective: SettleKind,
        reason: Option<&str>,
    ) {
        match effective {
            SettleKind::Ack => Metrics::inc(&self.shared.metrics.acks),
            SettleKind::Nack => Metrics::inc(&self.shared.metrics.nacks),
            SettleKind::Term => Metrics::inc(&self.shared.metrics.terms),
        }
        let stage = if token.p {
            Stage::PushAckReceived
        } else {
            Stage::PullAckReceived
        };
        let mut settle = self.record(stage, token);
        settle.set_outcome(kind);
        settle.detail = reason.map(str::to_owned);
        self.shared.sink.record(settle);
        if effective == SettleKind::Term {
            let because = reason.map(|r| format!(": {r}")).unwrap_or_default();
            let why = match kind {
                SettleKind::Nack => format!(
                    "nacked on the last allowed delivery attempt ({} of {}){because}",
                    token.n, self.shared.config.max_deliver,
                ),
                _ => format!("terminated by consumer {}{because}", token.c),
            };
            self.dead_letter(
                token.q,
                &token.g,
                Some(&token.c),
                token.n,
                token.by_id(),
                &why,
            )
            .await;
        }
    }
}

/// The JetStream consumer named in an ack subject: `$JS.ACK.<stream>.<consumer>.…` (9
/// tokens), or with a domain and account hash `$JS.ACK.<domain>.<account>.<stream>.<consumer>.…`
/// (12 or more).
fn ack_subject_consumer(ack_subject: &str) -> Option<&str> {
    let tokens: Vec<&str> = ack_subject.split('.').collect();
    match tokens.len() {
        9 => Some(tokens[3]),
        12.. => Some(tokens[5]),
        _ => None,
    }
}
