//! The settle path: [`Settler`] queues one delivery's settle for the consumer's batcher, with
//! the delivery's stage records the reporter held for it (C6, X1, X2, C7: docs/PROTOCOL.md
//! §18.4, version 2), and [`Settles`] sends the batches to `msgtrail.v1.settle` (other stage
//! records riding along after the settles).

use super::message::Received;
use super::options::ConsumerOptions;
use crate::batch::{self, Flight, Job, Limits, Queue};
use crate::channel::Channel;
use crate::error::ClientError;
use crate::hooks::{HookEvent, Hooks};
use crate::reporter::{self, Outbox};
use futures::future::BoxFuture;
use msgtrail_core::frame::{self, SettleBatch, SettleEntry, SettleResults};
use msgtrail_core::subjects as s;
use msgtrail_core::sync::Recover;
use msgtrail_core::time::now_nanos;
use msgtrail_core::wire::SettleKind as WireKind;
use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The result of one settle.
type Settled = Result<(), ClientError>;

/// The encoded size of a settle entry in a version 2 batch frame: with its records' count
/// byte and its records (a bound for version 1, which has no count byte).
pub(super) fn settle_size(e: &SettleEntry) -> usize {
    let records = 1 + e
        .records
        .iter()
        .map(crate::reporter::record_size)
        .sum::<usize>();
    1 + 1 + e.delay_ms.map_or(0, |_| 8) + 2 + e.token.len() + 2 + e.reason.len() + records
}

/// Bytes of a settle batch frame besides its entries and reports.
pub(super) const SETTLE_FRAME_OVERHEAD: usize = 4 + 2 + 2;

/// A consumer's settle path, shared by the consumer and every message it hands out; cheap to
/// clone (clones share one batcher).
#[derive(Debug, Clone)]
pub(crate) struct Settler {
    hooks: Hooks,
    /// Where the reporter holds the deliveries' records for their settles, when it reports.
    outbox: Option<Arc<Outbox>>,
    settles: Queue<Settles>,
    /// Tokens of deliveries whose last settle timed out: applied or not, nobody knows. Each
    /// holder does one insert, lookup or removal, which leave the set whole if it panicked.
    timed_out: Arc<Mutex<TimedOut>>,
}

/// At most this many tokens are remembered as timed out (a few hundred bytes each); past it
/// the oldest are forgotten, and a late retry of one of those reads as a plain refusal.
const TIMED_OUT_TOKENS: usize = 4096;

/// The tokens whose last settle attempt timed out, oldest first.
#[derive(Debug, Default)]
struct TimedOut {
    order: VecDeque<String>,
    tokens: HashSet<String>,
}

impl TimedOut {
    fn insert(&mut self, token: &str) {
        if self.tokens.insert(token.to_owned()) {
            self.order.push_back(token.to_owned());
            while self.order.len() > TIMED_OUT_TOKENS {
                if let Some(old) = self.order.pop_front() {
                    self.tokens.remove(&old);
                }
            }
        }
    }

    // Both are on every settle's path, where the set is nearly always empty: no hashing then.
    fn contains(&self, token: &str) -> bool {
        !self.tokens.is_empty() && self.tokens.contains(token)
    }

    fn remove(&mut self, token: &str) {
        if !self.tokens.is_empty() && self.tokens.remove(token) {
            self.order.retain(|t| t != token);
        }
    }
}

/// What a settle's result says given whether an earlier attempt of it timed out: a retry
/// refused `delivery_expired` after a timeout is [`ClientError::SettleAmbiguous`] — the
/// refusal says "not applied by this request", not "not applied".
fn settled(result: Settled, earlier_timed_out: bool) -> Settled {
    match result {
        Err(ClientError::Refused(w))
            if earlier_timed_out && w.code == msgtrail_core::ErrorCode::DeliveryExpired =>
        {
            Err(ClientError::SettleAmbiguous { refused: w })
        }
        other => other,
    }
}

impl Settler {
    /// Starts the settle batcher of a consumer on `channel`; a batch frame stays within
    /// `max_bytes`.
    pub(super) fn start(
        channel: &Arc<Channel>,
        hooks: &Hooks,
        outbox: Option<Arc<Outbox>>,
        options: &ConsumerOptions,
        max_bytes: usize,
    ) -> Self {
        let limits = Limits {
            max_messages: options.max_batch_messages,
            max_bytes: max_bytes.saturating_sub(SETTLE_FRAME_OVERHEAD),
            max_inflight: options.max_inflight_batches,
            linger: options.linger,
        }
        .clamped(frame::MAX_BATCH_ENTRIES);
        let flight = Arc::new(Settles {
            channel: channel.clone(),
            outbox: outbox.clone(),
        });
        Settler {
            hooks: hooks.clone(),
            outbox,
            settles: batch::spawn(flight, limits),
            timed_out: Arc::default(),
        }
    }

    /// Settles `msg`: tells the hooks (stage C3/C7), queues the entry with the delivery's
    /// held records, waits for its result.
    pub(super) async fn settle(
        &self,
        msg: &Received,
        kind: WireKind,
        delay: Option<Duration>,
        reason: String,
    ) -> Settled {
        self.hooks.emit_with(|| HookEvent::Settled {
            delivery: msg.info(),
            kind,
            at: now_nanos(),
        });
        let entry = SettleEntry {
            token: msg.ack_token.clone(),
            kind,
            delay_ms: delay.map(|d| d.as_millis() as u64),
            reason,
            records: self
                .outbox
                .as_ref()
                .map(|o| o.take_held(&msg.ack_token))
                .unwrap_or_default(),
            records_invalid: None,
        };
        let size = settle_size(&entry);
        let (job, rx) = Job::new(entry, size);
        batch::submit(&self.settles, vec![job]).await?;
        let result = rx.await.unwrap_or_else(|_| Err(batch::stopped()));
        let mut timed_out = self.timed_out.lock().recover();
        let result = settled(result, timed_out.contains(&msg.ack_token));
        match &result {
            Err(ClientError::Timeout { .. }) => timed_out.insert(&msg.ack_token),
            Err(ClientError::SettleAmbiguous { .. }) => {}
            _ => timed_out.remove(&msg.ack_token),
        }
        result
    }
}

/// Sends settle batches: the consumer's [`Flight`].
#[derive(Debug)]
pub(crate) struct Settles {
    channel: Arc<Channel>,
    outbox: Option<Arc<Outbox>>,
}

impl Flight for Settles {
    type Item = SettleEntry;
    type Output = Settled;

    fn send(
        self: Arc<Self>,
        batch: Vec<Job<SettleEntry, Settled>>,
        spare_bytes: usize,
    ) -> BoxFuture<'static, ()> {
        Box::pin(async move { self.settle(batch, spare_bytes).await })
    }
}

impl Settles {
    async fn settle(&self, batch: Vec<Job<SettleEntry, Settled>>, spare_bytes: usize) {
        let (entries, replies): (Vec<_>, Vec<_>) =
            batch.into_iter().map(|j| (j.item, j.reply)).unzip();
        let (reports, mut ticket) = reporter::ride_along(
            self.outbox.as_ref(),
            spare_bytes.saturating_sub(SETTLE_FRAME_OVERHEAD),
        );
        // The settles' own records are answered with the ride-along ones.
        let own: usize = entries.iter().map(|e: &SettleEntry| e.records.len()).sum();
        if let (Some(outbox), Some(t), true) = (&self.outbox, ticket.as_mut(), own > 0) {
            t.absorb(outbox.ticket(own));
        }
        let body = SettleBatch {
            entries,
            reports,
            ..Default::default()
        }
        .encode();
        let reply = self
            .channel
            .request_on_channel(s::SETTLE, body, self.channel.timeout)
            .await;
        let reply = reply.and_then(|m| {
            let r = SettleResults::decode(&m.payload).map_err(ClientError::decode)?;
            Ok((r.results, r.reports))
        });
        let results = reporter::batch_results(reply, replies.len(), ("settle", "settles"), ticket);
        match results {
            Ok(results) => {
                for (res, reply) in results.into_iter().zip(replies) {
                    let _ = reply.send(match res {
                        None => Ok(()),
                        Some(e) => Err(ClientError::Refused(e)),
                    });
                }
            }
            Err(e) => {
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use msgtrail_core::{ErrorCode, WireError};

    fn expired() -> Settled {
        Err(ClientError::Refused(WireError::new(
            ErrorCode::DeliveryExpired,
            "too late",
        )))
    }

    #[test]
    fn a_late_retry_after_a_timeout_is_ambiguous_and_a_first_late_settle_is_not() {
        assert!(settled(expired(), true).unwrap_err().is_settle_ambiguous());
        let plain = settled(expired(), false).unwrap_err();
        assert!(plain.is_delivery_expired() && !plain.is_settle_ambiguous());
        // Other outcomes pass through, whatever came before.
        assert!(settled(Ok(()), true).is_ok());
        let other = Err(ClientError::Refused(WireError::new(
            ErrorCode::BadRequest,
            "x",
        )));
        assert!(!settled(other, true).unwrap_err().is_settle_ambiguous());
    }

    #[test]
    fn timed_out_tokens_are_bounded_and_forgotten_once_settled() {
        let mut t = TimedOut::default();
        for i in 0..TIMED_OUT_TOKENS + 10 {
            t.insert(&format!("token-{i}"));
        }
        assert_eq!(t.tokens.len(), TIMED_OUT_TOKENS);
        assert_eq!(t.order.len(), TIMED_OUT_TOKENS);
        assert!(!t.contains("token-0"), "the oldest is forgotten");
        assert!(t.contains(&format!("token-{}", TIMED_OUT_TOKENS + 9)));
        t.remove("token-100");
        assert!(!t.contains("token-100"));
        assert_eq!(t.order.len(), TIMED_OUT_TOKENS - 1);
    }

    #[test]
    fn settle_sizes_match_the_encoding() {
        let entries = vec![
            SettleEntry {
                token: "t".repeat(300),
                kind: WireKind::Nack,
                delay_ms: Some(5),
                reason: "db busy".into(),
                records: vec![],
                records_invalid: None,
            },
            SettleEntry {
                token: "u".repeat(280),
                kind: WireKind::Ack,
                delay_ms: None,
                reason: String::new(),
                records: vec![],
                records_invalid: None,
            },
        ];
        let v1: usize = entries.iter().map(settle_size).sum();
        let got = SettleBatch {
            entries: entries.clone(),
            ..Default::default()
        }
        .encode()
        .len();
        assert_eq!(got, SETTLE_FRAME_OVERHEAD + v1 - entries.len());
        // With a settle's own records the frame is version 2: every settle has its count byte.
        let mut entries = entries;
        let mut x2 = msgtrail_core::StageRecord::at(msgtrail_core::Stage::ProcessFinished, 7);
        x2.outcome = Some("failed".into());
        x2.detail = Some("db busy ✗".into());
        entries[0].records = vec![
            msgtrail_core::StageRecord::at(msgtrail_core::Stage::PullReceived, 5),
            x2,
        ];
        let want: usize = entries.iter().map(settle_size).sum();
        let got = SettleBatch {
            entries,
            reports: vec![],
            ..Default::default()
        }
        .encode()
        .len();
        assert_eq!(got, SETTLE_FRAME_OVERHEAD + want);
    }
}
