//! What observed records change in the per-stream and per-consumer statistics (pure): the
//! hook the store calls where it applies records ([`count_records`]) and where a message's
//! summary changes state ([`state_change`]).
//!
//! ## How the parts meet
//! - The store's apply, per touched message, passes the records it held and the records the
//!   batch inserted (new to the store: a redelivered batch inserts nothing, so nothing counts
//!   twice) to [`count_records`]; it adds the [`ObservedKey`] counters to the transaction's
//!   persistent counters (`CounterKey::Observed`, written once per transaction like every
//!   other counter, so they survive a restart) and hands the [`ObservedSample`]s to the
//!   statistics (`crate::stats`, whose `observed` part keeps them in sliding-window HDR
//!   histograms).
//! - Wherever a summary's state changes (apply, the deadline pass, retention),
//!   [`state_change`] moves the observed message between its stream's state counters.
//!
//! Counter names: `observed/<stream>/<consumer>/<counter>` (the consumer empty for the
//! stream's own counters). Stream and consumer names are NATS names of `A-Z a-z 0-9 _ -`
//! (observed records name them as client IDs), so `/` separates them unambiguously.

use crate::summary::MessageSummary;
use msgtrail_core::observed::OBSERVED_SERVICE;
use msgtrail_core::outcome::{RedeliveryOutcome, SettleKind};
use msgtrail_core::trajectory::MessageState;
use msgtrail_core::{Stage, StageRecord};
use std::collections::BTreeMap;
use std::fmt;

/// Prefix of every observed counter's name.
pub(crate) const OBSERVED_PREFIX: &str = "observed/";
/// Longest term reason kept as a counter (longer ones are cut, on a character boundary).
pub(crate) const TERM_REASON_MAX: usize = 80;

/// What an observed counter counts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObservedCounter {
    /// Stream: stored messages read (P3).
    Stored,
    /// Stream: observed messages now in a state.
    State(MessageState),
    /// Consumer: delivery attempts (per message, the highest attempt an event named).
    Deliveries,
    /// Consumer: of those, attempts after the first.
    Redeliveries,
    /// Consumer: acks.
    Acks,
    /// Consumer: naks.
    Naks,
    /// Consumer: terms.
    Terms,
    /// Consumer: terms with this reason (`""`: none).
    TermReason(String),
    /// Consumer: attempts whose ack wait expired (inferred R1 `redeliver`).
    AckWaitExpired,
    /// Consumer: max-deliveries advisories (R1 `dead_letter`).
    MaxDeliveries,
}

impl fmt::Display for ObservedCounter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ObservedCounter::Stored => f.write_str("stored"),
            ObservedCounter::State(s) => write!(f, "state.{s}"),
            ObservedCounter::Deliveries => f.write_str("deliveries"),
            ObservedCounter::Redeliveries => f.write_str("redeliveries"),
            ObservedCounter::Acks => f.write_str("acks"),
            ObservedCounter::Naks => f.write_str("naks"),
            ObservedCounter::Terms => f.write_str("terms"),
            ObservedCounter::TermReason(r) => write!(f, "term.{r}"),
            ObservedCounter::AckWaitExpired => f.write_str("ack_wait_expired"),
            ObservedCounter::MaxDeliveries => f.write_str("max_deliveries"),
        }
    }
}

impl ObservedCounter {
    /// The counter a name part names ([`fmt::Display`]'s inverse).
    fn parse(s: &str) -> Option<Self> {
        if let Some(r) = s.strip_prefix("term.") {
            return Some(ObservedCounter::TermReason(r.to_owned()));
        }
        if let Some(st) = s.strip_prefix("state.") {
            return st.parse().ok().map(ObservedCounter::State);
        }
        Some(match s {
            "stored" => ObservedCounter::Stored,
            "deliveries" => ObservedCounter::Deliveries,
            "redeliveries" => ObservedCounter::Redeliveries,
            "acks" => ObservedCounter::Acks,
            "naks" => ObservedCounter::Naks,
            "terms" => ObservedCounter::Terms,
            "ack_wait_expired" => ObservedCounter::AckWaitExpired,
            "max_deliveries" => ObservedCounter::MaxDeliveries,
            _ => return None,
        })
    }
}

/// An observed counter of a stream (`consumer` empty) or of one of its consumers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObservedKey {
    /// The stream.
    pub stream: String,
    /// The durable consumer; empty for the stream's own counters.
    pub consumer: String,
    /// What it counts.
    pub counter: ObservedCounter,
}

impl fmt::Display for ObservedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{OBSERVED_PREFIX}{}/{}/{}",
            self.stream, self.consumer, self.counter
        )
    }
}

impl ObservedKey {
    /// The key a stored counter name names, if it is an observed one.
    pub(crate) fn parse(name: &str) -> Option<Self> {
        let rest = name.strip_prefix(OBSERVED_PREFIX)?;
        let (stream, rest) = rest.split_once('/')?;
        let (consumer, counter) = rest.split_once('/')?;
        Some(ObservedKey {
            stream: stream.to_owned(),
            consumer: consumer.to_owned(),
            counter: ObservedCounter::parse(counter)?,
        })
    }

    fn of(stream: &str, consumer: &str, counter: ObservedCounter) -> Self {
        ObservedKey {
            stream: stream.to_owned(),
            consumer: consumer.to_owned(),
            counter,
        }
    }
}

/// Which latency an observed sample measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum SampleKind {
    /// Stored → the first attempt's delivery.
    QueueWait,
    /// A delivery → its ack.
    AckTime,
}

impl SampleKind {
    /// The snake_case name (the metrics' `kind` label).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SampleKind::QueueWait => "queue_wait",
            SampleKind::AckTime => "ack_time",
        }
    }
}

/// One latency sample of a consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ObservedSample {
    /// The stream.
    pub stream: String,
    /// The durable consumer.
    pub consumer: String,
    /// What it measures.
    pub kind: SampleKind,
    /// Nanoseconds.
    pub nanos: u64,
}

/// What the records a batch inserted for one message change.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Change {
    /// Counter increments.
    pub counters: Vec<(ObservedKey, i64)>,
    /// Completed latencies.
    pub samples: Vec<ObservedSample>,
}

/// Whether `r` is a record observe mode made (of an observed stream's message).
fn is_observed(r: &StageRecord) -> bool {
    r.message_id.is_some_and(|m| m.is_observed()) && r.service.as_deref() == Some(OBSERVED_SERVICE)
}

fn is_delivery(r: &StageRecord) -> bool {
    matches!(r.stage, Stage::PullSent | Stage::PushSent)
}

fn is_settle(r: &StageRecord) -> bool {
    matches!(r.stage, Stage::PullAckReceived | Stage::PushAckReceived)
}

/// The (consumer, attempt) a delivery-side record is about.
fn attempt_of(r: &StageRecord) -> Option<(&str, u32)> {
    let about_attempt = is_delivery(r) || is_settle(r) || r.stage == Stage::Redelivery;
    match (about_attempt, &r.consumer, r.attempt) {
        (true, Some(c), Some(a)) => Some((c.as_str(), a)),
        _ => None,
    }
}

/// A term reason as a counter: cut to [`TERM_REASON_MAX`] characters.
fn reason(detail: Option<&str>) -> String {
    detail
        .unwrap_or_default()
        .chars()
        .take(TERM_REASON_MAX)
        .collect()
}

/// The counters and samples that `inserted` (records new to the store) add to a message
/// that held `held` before; nothing unless they are observed records. Each attempt, event
/// and latency counts once, whatever order the records arrive in: a latency when the later
/// of its two records is inserted.
pub(crate) fn count_records(held: &[StageRecord], inserted: &[StageRecord]) -> Change {
    let mut out = Change::default();
    let Some(first) = inserted.iter().find(|r| is_observed(r)) else {
        return out;
    };
    let Some(stream) = first.producer.as_ref().map(|p| p.as_str().to_owned()) else {
        return out;
    };
    let mut bump = |consumer: &str, c: ObservedCounter| {
        out.counters
            .push((ObservedKey::of(&stream, consumer, c), 1));
    };
    for r in inserted.iter().filter(|r| is_observed(r)) {
        if r.stage == Stage::Stored {
            bump("", ObservedCounter::Stored);
        }
        let Some((consumer, _)) = attempt_of(r) else {
            continue;
        };
        if is_settle(r) {
            match r.settle_outcome() {
                Some(SettleKind::Ack) | None => bump(consumer, ObservedCounter::Acks),
                Some(SettleKind::Nack) => bump(consumer, ObservedCounter::Naks),
                Some(SettleKind::Term) => {
                    bump(consumer, ObservedCounter::Terms);
                    let why = reason(r.detail.as_deref());
                    bump(consumer, ObservedCounter::TermReason(why));
                }
            }
        }
        match r.redelivery_outcome() {
            Some(RedeliveryOutcome::Redeliver) => bump(consumer, ObservedCounter::AckWaitExpired),
            Some(RedeliveryOutcome::DeadLetter) => bump(consumer, ObservedCounter::MaxDeliveries),
            _ => {}
        }
    }
    // An event of attempt n says attempts 1..n were delivered (nats-server counts them):
    // a consumer's deliveries of the message are its highest attempt seen.
    let highest = |rs: &[StageRecord]| {
        let mut m: BTreeMap<String, u32> = BTreeMap::new();
        for (c, a) in rs.iter().filter(|r| is_observed(r)).filter_map(attempt_of) {
            let e = m.entry(c.to_owned()).or_default();
            *e = (*e).max(a);
        }
        m
    };
    let before = highest(held);
    for (consumer, now) in highest(inserted) {
        let was = before.get(&consumer).copied().unwrap_or(0);
        if now > was {
            let more = i64::from(now - was);
            let redelivered = i64::from(now.saturating_sub(1) - was.saturating_sub(1));
            out.counters.push((
                ObservedKey::of(&stream, &consumer, ObservedCounter::Deliveries),
                more,
            ));
            if redelivered > 0 {
                out.counters.push((
                    ObservedKey::of(&stream, &consumer, ObservedCounter::Redeliveries),
                    redelivered,
                ));
            }
        }
    }
    out.samples = samples(&stream, held, inserted);
    out
}

/// The latencies `inserted` completes: ack time of each inserted delivery (its ack came
/// with it, from the same ack metric), queue wait of each consumer's first attempt once
/// both it and the stored time are in and one of them is new.
fn samples(stream: &str, held: &[StageRecord], inserted: &[StageRecord]) -> Vec<ObservedSample> {
    let all = || held.iter().chain(inserted).filter(|r| is_observed(r));
    let sample = |consumer: &str, kind: SampleKind, nanos: u64| ObservedSample {
        stream: stream.to_owned(),
        consumer: consumer.to_owned(),
        kind,
        nanos,
    };
    let mut out = Vec::new();
    let stored_in = |rs: &[StageRecord]| {
        rs.iter()
            .find(|r| r.stage == Stage::Stored && is_observed(r))
            .map(|r| r.at)
    };
    let stored_new = stored_in(inserted);
    let stored_at = stored_new.or_else(|| stored_in(held));
    for d in all().filter(|r| is_delivery(r)) {
        let Some((consumer, attempt)) = attempt_of(d) else {
            continue;
        };
        let fresh = inserted.iter().any(|r| std::ptr::eq(r, d));
        if fresh {
            let ack = all().find(|r| {
                is_settle(r)
                    && attempt_of(r) == Some((consumer, attempt))
                    && matches!(r.settle_outcome(), Some(SettleKind::Ack) | None)
            });
            if let Some(ack) = ack {
                out.push(sample(
                    consumer,
                    SampleKind::AckTime,
                    ack.at.saturating_sub(d.at),
                ));
            }
        }
        if let (1, Some(stored)) = (attempt, stored_at) {
            if fresh || stored_new.is_some() {
                out.push(sample(
                    consumer,
                    SampleKind::QueueWait,
                    d.at.saturating_sub(stored),
                ));
            }
        }
    }
    out
}

/// The latency samples of the observed messages among `recent` (summaries, oldest first),
/// each at its last record time: what refills the sliding window after a restart.
pub(crate) fn recent_samples(
    store: &crate::store::Store,
    recent: &[MessageSummary],
) -> Result<Vec<(u64, Vec<ObservedSample>)>, crate::error::StoreError> {
    let mut out = Vec::new();
    for s in recent.iter().filter(|s| observed_stream(s).is_some()) {
        let samples = count_records(&[], &store.records_of(&s.key)?).samples;
        if !samples.is_empty() {
            out.push((s.last_at, samples));
        }
    }
    Ok(out)
}

/// The stream of an observed message's summary.
fn observed_stream(s: &MessageSummary) -> Option<&str> {
    let observed = s.message_id.is_some_and(|m| m.is_observed());
    s.producer.as_ref().map(|p| p.as_str()).filter(|_| observed)
}

/// Moves an observed message between its stream's state counters as its summary changes
/// from `old` to `new` (`None`: created or deleted); nothing for other messages.
pub(crate) fn state_change(
    old: Option<&MessageSummary>,
    new: Option<&MessageSummary>,
) -> Vec<(ObservedKey, i64)> {
    let at = |s: Option<&MessageSummary>| {
        s.and_then(|s| observed_stream(s).map(|stream| (stream.to_owned(), s.state)))
    };
    let (was, is) = (at(old), at(new));
    if was == is {
        return Vec::new();
    }
    let key = |(stream, st): (String, MessageState)| {
        ObservedKey::of(&stream, "", ObservedCounter::State(st))
    };
    was.map(|w| (key(w), -1))
        .into_iter()
        .chain(is.map(|i| (key(i), 1)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::event::{ConsumerEvent, What};
    use crate::observe::records::{event_records, stored_records, StoredMessage};
    use msgtrail_core::trajectory::DeliveryMode;

    /// The records of an event; `expired`: the attempt before has no outcome.
    fn event(what: What, deliveries: u32, at: u64, expired: bool) -> Vec<StageRecord> {
        let e = ConsumerEvent {
            stream: "ORDERS".into(),
            consumer: "billing".into(),
            stream_seq: 7,
            deliveries,
            at,
            what,
        };
        event_records(&e, DeliveryMode::Pull, &mut |_, _, _| expired).unwrap()
    }

    fn stored(at: u64) -> Vec<StageRecord> {
        stored_records(StoredMessage {
            stream: "ORDERS",
            subject: "orders.eu",
            stream_seq: 7,
            stored_at: at,
            headers: None,
        })
        .unwrap()
        .to_vec()
    }

    fn count(change: &Change, consumer: &str, c: ObservedCounter) -> i64 {
        change
            .counters
            .iter()
            .filter(|(k, _)| k.consumer == consumer && k.counter == c)
            .map(|(_, n)| n)
            .sum()
    }

    #[test]
    fn names_round_trip() {
        for c in [
            ObservedCounter::Stored,
            ObservedCounter::State(MessageState::Stuck),
            ObservedCounter::Deliveries,
            ObservedCounter::TermReason("bad / input".into()),
            ObservedCounter::TermReason(String::new()),
            ObservedCounter::MaxDeliveries,
        ] {
            let k = ObservedKey::of("ORDERS", "billing", c);
            assert_eq!(ObservedKey::parse(&k.to_string()), Some(k));
        }
        assert_eq!(
            ObservedKey::of("S", "", ObservedCounter::Stored).to_string(),
            "observed/S//stored"
        );
        assert_eq!(ObservedKey::parse("topic/orders/redeliveries"), None);
    }

    /// A nak at attempt 1, then an ack at attempt 2: two deliveries, one redelivery, one
    /// nak, one ack; the ack time of attempt 2; no queue wait (attempt 1's delivery time is
    /// not seen). The stored message arriving last adds nothing but `stored`.
    #[test]
    fn each_event_and_attempt_counts_once() {
        let nak = event(What::Naked, 1, 2_000, false);
        let c = count_records(&[], &nak);
        assert_eq!(count(&c, "billing", ObservedCounter::Deliveries), 1);
        assert_eq!(count(&c, "billing", ObservedCounter::Naks), 1);
        let ack = event(What::Acked { ack_time: 300 }, 2, 5_000, false);
        let c = count_records(&nak, &ack);
        assert_eq!(count(&c, "billing", ObservedCounter::Deliveries), 1);
        assert_eq!(count(&c, "billing", ObservedCounter::Redeliveries), 1);
        assert_eq!(count(&c, "billing", ObservedCounter::Acks), 1);
        assert_eq!(
            c.samples
                .iter()
                .map(|s| (s.kind, s.nanos))
                .collect::<Vec<_>>(),
            [(SampleKind::AckTime, 300)]
        );
        let held: Vec<StageRecord> = nak.into_iter().chain(ack).collect();
        let c = count_records(&held, &stored(1_000));
        assert_eq!(count(&c, "", ObservedCounter::Stored), 1);
        assert_eq!(count(&c, "billing", ObservedCounter::Deliveries), 0);
        assert!(c.samples.is_empty());
    }

    /// The queue wait is made by whichever of the stored message and the first delivery
    /// comes second, once.
    #[test]
    fn queue_wait_counts_once_in_either_order() {
        let ack = event(What::Acked { ack_time: 300 }, 1, 5_000, false);
        let st = stored(1_000);
        let qw = |c: &Change| {
            c.samples
                .iter()
                .filter(|s| s.kind == SampleKind::QueueWait)
                .map(|s| s.nanos)
                .collect::<Vec<_>>()
        };
        assert_eq!(qw(&count_records(&st, &ack)), [3_700]);
        assert_eq!(qw(&count_records(&ack, &st)), [3_700]);
        assert_eq!(qw(&count_records(&[], &[st, ack].concat())), [3_700]);
    }

    #[test]
    fn terms_count_by_reason_and_max_deliveries_and_expiries_apart() {
        let term = event(
            What::Terminated {
                reason: Some("x".repeat(100)),
            },
            1,
            2_000,
            false,
        );
        let c = count_records(&[], &term);
        assert_eq!(count(&c, "billing", ObservedCounter::Terms), 1);
        assert_eq!(
            count(
                &c,
                "billing",
                ObservedCounter::TermReason("x".repeat(TERM_REASON_MAX))
            ),
            1
        );
        // Attempt 2's max deliveries, attempt 1 without outcome: its ack wait expired.
        let dead = event(What::MaxDeliveries, 2, 9_000, true);
        let c = count_records(&[], &dead);
        assert_eq!(count(&c, "billing", ObservedCounter::MaxDeliveries), 1);
        assert_eq!(count(&c, "billing", ObservedCounter::AckWaitExpired), 1);
        assert_eq!(count(&c, "billing", ObservedCounter::Deliveries), 2);
        assert_eq!(count(&c, "billing", ObservedCounter::Redeliveries), 1);
    }

    #[test]
    fn broker_records_count_nothing() {
        let mut r = StageRecord::at(Stage::Stored, 1);
        r.message_id = Some(msgtrail_core::MessageId::new());
        assert_eq!(count_records(&[], &[r]), Change::default());
    }
}
