//! A message's summary kept up to date record by record: [`Folded`] holds what
//! [`MessageSummary::of`] reads off an assembled trajectory, and each record the store
//! inserts updates it ([`Folded::fold`], constant work per record), so that the store
//! derives a touched message's summary ([`Folded::summary`]) without assembling its records.
//!
//! The derivation follows the assembly's rules (`msgtrail_core::trajectory`: the upload,
//! store and send hops, one deliver and one process hop per delivery attempt, the groups'
//! states, the overall state, the failure point, the latency segments) for the cases it
//! decides exactly, and answers `None` for the rest — then the store assembles the message
//! as before. Those are: a record it does not fold (a recovered P2/P3, a refused upload, a
//! delivery record missing its group, consumer or attempt, a delivery naming JetStream's
//! stored time), two records tied on the time that decides between them (the assembly's
//! total order then looks at the whole record), and a hop past its deadline (the states
//! stuck and lost, and their words).

use crate::summary::MessageSummary;
use msgtrail_core::outcome::StoreOutcome;
use msgtrail_core::outcome::{Outcome, ProcessOutcome, RedeliveryOutcome, SettleOutcome};
use msgtrail_core::trajectory::{Deadlines, DeliveryId, HopId, MessageState, Segment};
use msgtrail_core::{ClientId, GroupId, MessageId, RequestId, Stage, StageRecord};
use std::collections::BTreeMap;

/// The value of the earliest record (by time, then stage) that has one; `tie` when two
/// records at that place disagree (the assembly's order then depends on the whole record).
#[derive(Debug, Clone, PartialEq, Eq)]
struct First<T> {
    at: (u64, Stage),
    value: T,
    tie: bool,
}

/// Offers `value` of a record at (`at`, `stage`) to an earliest-first slot (copied only
/// when it takes the place).
fn offer_first<T: PartialEq + Clone>(
    slot: &mut Option<First<T>>,
    at: u64,
    stage: Stage,
    value: &T,
) {
    match slot {
        Some(f) if (at, stage) > f.at => {}
        Some(f) if (at, stage) == f.at => f.tie |= f.value != *value,
        _ => {
            *slot = Some(First {
                at: (at, stage),
                value: value.clone(),
                tie: false,
            })
        }
    }
}

/// The value of the latest record of some kind; `tie` when two records at that time
/// disagree.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Last<T> {
    at: u64,
    value: T,
    tie: bool,
}

/// Offers `value` of a record at `at` to a latest-first slot.
fn offer_last<T: PartialEq>(slot: &mut Option<Last<T>>, at: u64, value: T) {
    match slot {
        Some(l) if at < l.at => {}
        Some(l) if at == l.at => l.tie |= l.value != value,
        _ => {
            *slot = Some(Last {
                at,
                value,
                tie: false,
            })
        }
    }
}

fn tied<T>(slot: &Option<Last<T>>) -> bool {
    slot.as_ref().is_some_and(|l| l.tie)
}

fn min_in(slot: &mut Option<u64>, at: u64) {
    *slot = Some(slot.map_or(at, |v| v.min(at)));
}

fn max_in(slot: &mut Option<u64>, at: u64) {
    *slot = Some(slot.map_or(at, |v| v.max(at)));
}

/// One delivery attempt (a deliver hop and, when the consumer reported, a process hop).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Attempt {
    /// Any broker-side record (C1/C4, C5/C8, R1): the deliver hop is not synthesized.
    deliver: bool,
    /// Any consumer-side record: there is a process hop.
    process: bool,
    /// The first C1/C5.
    sent: Option<u64>,
    /// The earliest broker-side record, R1 included.
    deliver_earliest: Option<u64>,
    /// The earliest consumer-side record.
    process_earliest: Option<u64>,
    /// The earliest record that is not an R1 (proof the message was stored).
    delivered: Option<u64>,
    /// The latest C4/C8: whether it acked (an ack, or no outcome).
    settle: Option<Last<bool>>,
    /// Some C4/C8 did not ack.
    bad_settle: bool,
    /// The latest acking C4/C8.
    acked: Option<u64>,
    /// The latest R1: dead letter, and its detail.
    r1: Option<Last<(bool, Option<String>)>>,
    /// Some R1 dead-lettered.
    dead: bool,
    /// The first C2/C6.
    received: Option<u64>,
    /// The first X1.
    x1: Option<u64>,
    /// The first X2.
    x2_first: Option<u64>,
    /// The latest X2: whether it failed.
    x2: Option<Last<bool>>,
    /// The latest failed X2's error text.
    failed_x2: Option<Last<String>>,
    /// The latest C3/C7: whether it sent something else than an ack.
    ack_sent: Option<Last<bool>>,
}

impl Attempt {
    /// Folds one record of this attempt.
    fn fold(&mut self, r: &StageRecord) {
        if r.stage.is_process_side() {
            self.process = true;
            min_in(&mut self.process_earliest, r.at);
            min_in(&mut self.delivered, r.at);
            match r.stage {
                Stage::PushReceived | Stage::PullReceived => min_in(&mut self.received, r.at),
                Stage::ProcessStarted => min_in(&mut self.x1, r.at),
                Stage::ProcessFinished => {
                    min_in(&mut self.x2_first, r.at);
                    let failed = r.process_outcome() == Some(ProcessOutcome::Failed);
                    offer_last(&mut self.x2, r.at, failed);
                    if failed {
                        let text = r.detail.clone().unwrap_or_else(|| "failed".into());
                        offer_last(&mut self.failed_x2, r.at, text);
                    }
                }
                _ => {
                    let not_ack = r
                        .typed_outcome()
                        .is_some_and(|o| o != Outcome::Settle(SettleOutcome::Ack));
                    offer_last(&mut self.ack_sent, r.at, not_ack);
                }
            }
            return;
        }
        self.deliver = true;
        min_in(&mut self.deliver_earliest, r.at);
        match r.stage {
            Stage::Redelivery => {
                let dead = r.redelivery_outcome() == Some(RedeliveryOutcome::DeadLetter);
                self.dead |= dead;
                offer_last(&mut self.r1, r.at, (dead, r.detail.clone()));
                return;
            }
            Stage::PushSent | Stage::PullSent => min_in(&mut self.sent, r.at),
            _ => {
                let ack = matches!(
                    r.typed_outcome(),
                    None | Some(Outcome::Settle(SettleOutcome::Ack))
                );
                offer_last(&mut self.settle, r.at, ack);
                self.bad_settle |= !ack;
                if ack {
                    max_in(&mut self.acked, r.at);
                }
            }
        }
        min_in(&mut self.delivered, r.at);
    }

    fn tied(&self) -> bool {
        tied(&self.settle)
            || tied(&self.r1)
            || tied(&self.x2)
            || tied(&self.failed_x2)
            || tied(&self.ack_sent)
    }

    /// When the deliver hop starts: the C1/C5, else its earliest record or the process's.
    fn start(&self) -> u64 {
        self.sent
            .or_else(|| {
                self.deliver_earliest
                    .into_iter()
                    .chain(self.process_earliest)
                    .min()
            })
            .unwrap_or(0)
    }

    /// When the process hop starts: the receipt, else X1, else its earliest record.
    fn process_start(&self) -> u64 {
        self.received
            .or(self.x1)
            .or(self.process_earliest)
            .unwrap_or(0)
    }

    /// Whether the process hop ended in error (a failed X2, or something else than an ack
    /// sent), and whether it ended at all.
    fn process_status(&self) -> (bool, bool) {
        let failed = self.x2.as_ref().is_some_and(|x| x.value);
        let not_acked = self.ack_sent.as_ref().is_some_and(|a| a.value);
        (
            failed || not_acked,
            self.x2.is_some() || self.ack_sent.is_some(),
        )
    }
}

/// What the first P2 says of the message: its topic and attributes.
type Upload = (Option<String>, BTreeMap<String, String>);

/// What a message's summary follows from, folded from its records one at a time (see the
/// module documentation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Folded {
    /// Records folded.
    records: usize,
    /// A record was folded that the derivation does not decide.
    undecided: bool,
    first_at: Option<u64>,
    last_at: Option<u64>,
    message_id: Option<First<MessageId>>,
    request_id: Option<First<RequestId>>,
    producer: Option<First<ClientId>>,
    topic: Option<First<String>>,
    /// The first P2's topic and attributes.
    p2: Option<First<Upload>>,
    /// The first P1.
    p1_at: Option<u64>,
    /// The first P2.
    p2_at: Option<u64>,
    /// The last P3.
    p3_at: Option<u64>,
    /// The last P4.
    p4_at: Option<u64>,
    /// The earliest P1, P4 or D1.
    send_at: Option<u64>,
    /// Any P2 or P3.
    store_records: bool,
    /// The delivery attempts.
    attempts: BTreeMap<DeliveryId, Attempt>,
}

impl Folded {
    /// Folds every record of a message.
    pub(crate) fn of<'r>(records: impl IntoIterator<Item = &'r StageRecord>) -> Folded {
        let mut f = Folded::default();
        for r in records {
            f.fold(r);
        }
        f
    }

    /// Folds one more record (one the message did not hold: the store folds each record
    /// once, after its dedup).
    pub(crate) fn fold(&mut self, r: &StageRecord) {
        self.records += 1;
        min_in(&mut self.first_at, r.at);
        max_in(&mut self.last_at, r.at);
        let (at, stage) = (r.at, r.stage);
        if let Some(m) = r.message_id {
            offer_first(&mut self.message_id, at, stage, &m);
        }
        if let Some(q) = &r.request_id {
            offer_first(&mut self.request_id, at, stage, q);
        }
        if let Some(p) = &r.producer {
            offer_first(&mut self.producer, at, stage, p);
        }
        if let Some(t) = &r.topic {
            offer_first(&mut self.topic, at, stage, t);
        }
        match stage {
            Stage::UploadSent => {
                min_in(&mut self.p1_at, at);
                min_in(&mut self.send_at, at);
            }
            Stage::StoreConfirmed => {
                max_in(&mut self.p4_at, at);
                min_in(&mut self.send_at, at);
            }
            Stage::Duplicate => min_in(&mut self.send_at, at),
            Stage::UploadReceived | Stage::Stored => {
                if matches!(
                    r.store_outcome(),
                    Some(StoreOutcome::Recovered | StoreOutcome::Refused)
                ) {
                    self.undecided = true;
                    return;
                }
                self.store_records = true;
                if stage == Stage::Stored {
                    max_in(&mut self.p3_at, at);
                } else {
                    min_in(&mut self.p2_at, at);
                    let v = (r.topic.clone(), r.attrs.clone());
                    offer_first(&mut self.p2, at, stage, &v);
                }
            }
            s if s.is_deliver_side() || s.is_process_side() || s == Stage::Redelivery => {
                self.fold_delivery(r)
            }
            _ => {}
        }
    }

    fn fold_delivery(&mut self, r: &StageRecord) {
        let (Some(group), Some(consumer), Some(attempt)) = (&r.group, &r.consumer, r.attempt)
        else {
            // A record of no attempt (no group and no consumer) is of no hop; one naming
            // only some of them is placed by the assembly among the others.
            self.undecided |= r.group.is_some() || r.consumer.is_some();
            return;
        };
        if matches!(r.stage, Stage::PushSent | Stage::PullSent) && r.stored_at.is_some() {
            self.undecided = true;
        }
        let d = DeliveryId {
            group: group.as_str().to_owned(),
            consumer: consumer.as_str().to_owned(),
            attempt,
            by_id: r.by_id,
        };
        self.attempts.entry(d).or_default().fold(r);
    }

    fn tied(&self) -> bool {
        fn tie<T>(f: &Option<First<T>>) -> bool {
            f.as_ref().is_some_and(|f| f.tie)
        }
        tie(&self.message_id)
            || tie(&self.request_id)
            || tie(&self.producer)
            || tie(&self.topic)
            || tie(&self.p2)
            || self.attempts.values().any(Attempt::tied)
    }

    /// The summary of the message stored under `key`, as [`MessageSummary::of`] gives it
    /// for the message's assembled trajectory at `now` (Unix nanoseconds); `None` when the
    /// derivation cannot decide it (see the module documentation).
    pub(crate) fn summary(&self, key: &str, now: u64, d: &Deadlines) -> Option<MessageSummary> {
        if self.undecided || self.records == 0 || self.tied() {
            return None;
        }
        let overdue =
            |since: u64, ms: u64| now.saturating_sub(since) > ms.saturating_mul(1_000_000);
        let first_delivery_at = self.attempts.values().filter_map(|a| a.delivered).min();
        // The deliver and process hops, by attempt: their failure points and errors.
        let mut failures: Vec<String> = Vec::new();
        let mut hop_error = false;
        let mut first_deliver_start: Option<u64> = None;
        for (id, a) in &self.attempts {
            let start = a.start();
            if a.deliver {
                first_deliver_start = Some(first_deliver_start.map_or(start, |s| s.min(start)));
            }
            match (&a.settle, &a.r1) {
                (Some(s), _) => hop_error |= !s.value,
                (None, Some(r1)) => {
                    hop_error = true;
                    let (dead, detail) = &r1.value;
                    if *dead {
                        let why = detail.as_deref().map(|d| format!(": {d}"));
                        failures.push(format!(
                            "no ack from {}; dead-lettered{}",
                            who(id),
                            why.unwrap_or_default()
                        ));
                    }
                }
                (None, None) if overdue(start, d.acked_ms) => return None,
                (None, None) => {}
            }
            if a.process {
                let (error, ended) = a.process_status();
                if !error && !ended && overdue(a.process_start(), d.processed_ms) {
                    return None;
                }
                hop_error |= error;
            }
        }
        let store = self.store_hop(first_delivery_at, first_deliver_start, &overdue, d)?;
        let send = self.send_hop(store.as_ref(), &overdue, d)?;
        // The groups (one per consumption: a group's subscriptions, or its fetches by ID).
        let e2e_from = send.filter(|s| !s.inferred).map(|s| s.start).or(self.p2_at);
        let mut consumptions: BTreeMap<(&str, bool), Vec<(&DeliveryId, &Attempt)>> =
            BTreeMap::new();
        for (id, a) in &self.attempts {
            consumptions
                .entry((id.group.as_str(), id.by_id))
                .or_default()
                .push((id, a));
        }
        let mut groups = Vec::with_capacity(consumptions.len());
        for ((group, by_id), attempts) in &consumptions {
            let g = group_of(group, attempts, e2e_from)?;
            if g.state == MessageState::DeadLettered {
                let last = g
                    .last_error
                    .as_deref()
                    .map(|e| format!("; last error: {e}"));
                let how = if *by_id {
                    " (fetched by message ID)"
                } else {
                    ""
                };
                failures.push(format!(
                    "dead-lettered by group {group}{how} after {} attempt(s){}",
                    g.attempts,
                    last.unwrap_or_default()
                ));
            }
            groups.push(g);
        }
        let state = self.overall_state(&groups, first_delivery_at, &overdue, d)?;
        let stored_at = store.filter(|s| !s.inferred).and_then(|s| s.end);
        let mut segments = Vec::new();
        if let (Some(f), Some(s)) = (send.filter(|s| !s.inferred).map(|s| s.start), stored_at) {
            segments.push((Segment::SentToStored, s.saturating_sub(f)));
        }
        for g in &groups {
            if let (Some(s), Some(first)) = (stored_at, g.first_delivery) {
                segments.push((Segment::StoredToDelivered, first.saturating_sub(s)));
            }
            if let Some(e) = g.end_to_end {
                segments.push((Segment::EndToEnd, e));
            }
        }
        self.attempt_segments(&mut segments);
        let bad = |s: MessageState| crate::search::bad(s);
        let failure = failures.into_iter().next();
        let mut group_states = BTreeMap::new();
        for g in &groups {
            // Always a group name: the delivery IDs were made of the records' groups.
            group_states.insert(GroupId::new(g.group).ok()?, g.state);
        }
        let p2 = self.p2.as_ref().map(|f| &f.value);
        let any_topic = self.topic.as_ref().map(|f| f.value.clone());
        Some(MessageSummary {
            key: key.to_owned(),
            message_id: self.message_id.as_ref().map(|f| f.value),
            request_id: self.request_id.as_ref().map(|f| f.value.clone()),
            producer: self.producer.as_ref().map(|f| f.value.clone()),
            topic: match p2 {
                Some((t, _)) => t.clone().or(any_topic),
                None => any_topic,
            },
            state,
            first_at: self.first_at.unwrap_or(0),
            last_at: self.last_at.unwrap_or(0),
            records: self.records,
            funnel: [
                send.is_some(),
                store.is_some_and(|s| s.end.is_some()),
                !self.attempts.is_empty(),
                groups.iter().any(|g| g.acked),
            ],
            segments,
            failed: failure.is_some()
                || bad(state)
                || hop_error
                || groups
                    .iter()
                    .any(|g| g.last_error.is_some() || bad(g.state)),
            redelivered: self
                .attempts
                .iter()
                .any(|(id, a)| id.attempt > 1 || a.r1.is_some()),
            dead_lettered: state == MessageState::DeadLettered
                || groups.iter().any(|g| g.state == MessageState::DeadLettered),
            failure,
            groups: group_states,
            attrs: p2.map(|(_, a)| a.clone()).unwrap_or_default(),
            attempts: Some(u32::try_from(self.attempts.len()).unwrap_or(u32::MAX)),
        })
    }

    /// The store hop (P2 → P3, or inferred from a delivery); `None` (outer) when past its
    /// deadline.
    fn store_hop(
        &self,
        first_delivery_at: Option<u64>,
        first_deliver_start: Option<u64>,
        overdue: &dyn Fn(u64, u64) -> bool,
        d: &Deadlines,
    ) -> Option<Option<Span>> {
        let delivered_by = first_delivery_at
            .into_iter()
            .chain(first_deliver_start)
            .min();
        if !self.store_records {
            return Some(delivered_by.map(|at| Span {
                start: at,
                end: Some(at),
                inferred: true,
            }));
        }
        let start = self.p2_at.or(self.p3_at).unwrap_or(0);
        let inferred = self.p3_at.is_none() && first_delivery_at.is_some();
        if self.p3_at.is_none() && !inferred && overdue(start, d.stored_ms) {
            return None;
        }
        let end = match self.p3_at {
            Some(p3) => Some(match first_deliver_start {
                Some(first) if first < p3 => first,
                _ => p3,
            }),
            None if inferred => Some(delivered_by.unwrap_or(start)),
            None => None,
        };
        // A hop that would end before it starts ends where it starts.
        let end = end.map(|e| e.max(start));
        Some(Some(Span {
            start,
            end,
            inferred,
        }))
    }

    /// The send hop (P1 → P4, or synthesized over the store hop); `None` (outer) when past
    /// its deadline.
    fn send_hop(
        &self,
        store: Option<&Span>,
        overdue: &dyn Fn(u64, u64) -> bool,
        d: &Deadlines,
    ) -> Option<Option<Span>> {
        let producer_records = self.p1_at.is_some() || self.p4_at.is_some();
        if !producer_records && store.is_none() {
            return Some(None);
        }
        let start = self
            .p1_at
            .or(self.p2_at)
            .or(self.p4_at)
            .or(self.p3_at)
            .or(self.send_at)
            .or(store.map(|s| s.start))
            .unwrap_or(0);
        if producer_records && self.p4_at.is_none() {
            let late = match (store, self.p3_at) {
                (None, _) => overdue(start, d.stored_ms),
                (Some(_), Some(p3)) => overdue(p3, d.stored_ms),
                // Waits on the store hop, decided already.
                (Some(_), None) => false,
            };
            if late {
                return None;
            }
        }
        Some(Some(Span {
            start,
            end: None,
            inferred: !producer_records && store.is_some_and(|s| s.inferred),
        }))
    }

    /// The overall state; `None` when a deadline decides it.
    fn overall_state(
        &self,
        groups: &[Group<'_>],
        first_delivery_at: Option<u64>,
        overdue: &dyn Fn(u64, u64) -> bool,
        d: &Deadlines,
    ) -> Option<MessageState> {
        let stored = self.p3_at.is_some() || self.p2_at.is_some() || first_delivery_at.is_some();
        if !stored {
            // Lost only once the send is past its deadline (not decided here).
            return Some(MessageState::Sent);
        }
        if groups.is_empty() {
            let late = match self.p3_at {
                Some(p3) => overdue(p3, d.delivered_ms),
                None => overdue(self.p2_at.unwrap_or(0), d.stored_ms),
            };
            return (!late).then_some(MessageState::Enqueued);
        }
        Some(MessageState::worst_of_groups(
            groups.iter().map(|g| g.state),
        ))
    }

    /// The per-attempt segments, in the order of the process hops (by start, then key).
    fn attempt_segments(&self, out: &mut Vec<(Segment, u64)>) {
        let mut process: Vec<(&DeliveryId, &Attempt)> =
            self.attempts.iter().filter(|(_, a)| a.process).collect();
        if process.len() > 1 {
            process.sort_by_cached_key(|(id, a)| {
                (a.process_start(), HopId::Process((*id).clone()).key())
            });
        }
        for (_, a) in process {
            if let (Some(x1), Some(x2)) = (a.x1, a.x2_first) {
                out.push((Segment::Processing, x2.saturating_sub(x1)));
            }
            if let (Some(s), Some(r)) = (a.sent, a.received) {
                out.push((Segment::DeliveredToReceived, r.saturating_sub(s)));
            }
            if let (Some(r), Some(s)) = (a.received, &a.settle) {
                out.push((Segment::ReceivedToAcked, s.at.saturating_sub(r)));
            }
        }
    }
}

/// An upload-side hop, as far as the summary reads it.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: u64,
    end: Option<u64>,
    inferred: bool,
}

/// One consumption, as far as the summary reads it.
struct Group<'a> {
    group: &'a str,
    state: MessageState,
    attempts: u32,
    acked: bool,
    last_error: Option<String>,
    first_delivery: Option<u64>,
    end_to_end: Option<u64>,
}

/// A consumption's state from its attempts (the latest decides); `None` on a tie.
fn group_of<'a>(
    group: &'a str,
    attempts: &[(&DeliveryId, &Attempt)],
    e2e_from: Option<u64>,
) -> Option<Group<'a>> {
    let max_attempt = attempts.iter().map(|(id, _)| id.attempt).max().unwrap_or(0);
    let acked_at = attempts.iter().filter_map(|(_, a)| a.acked).max();
    let dead = attempts.iter().any(|(_, a)| a.dead);
    let mut last_error: Option<&Last<String>> = None;
    for (_, a) in attempts {
        let Some(e) = &a.failed_x2 else { continue };
        match last_error {
            Some(l) if e.at < l.at => {}
            Some(l) if e.at == l.at && e.value != l.value => return None,
            _ => last_error = Some(e),
        }
    }
    let latest = || {
        attempts
            .iter()
            .filter(move |(id, _)| id.attempt == max_attempt)
            .map(|(_, a)| *a)
    };
    let state = if dead {
        MessageState::DeadLettered
    } else if acked_at.is_some() {
        MessageState::Consumed
    } else if latest().any(|a| (a.process && a.process_status().0) || a.bad_settle) {
        MessageState::Failed
    } else if latest().any(|a| a.x1.is_some()) {
        MessageState::Consuming
    } else {
        MessageState::Delivered
    };
    Some(Group {
        group,
        state,
        attempts: max_attempt,
        acked: acked_at.is_some(),
        last_error: last_error.map(|l| l.value.clone()),
        first_delivery: attempts.iter().map(|(_, a)| a.start()).min(),
        end_to_end: match (e2e_from, acked_at) {
            (Some(f), Some(a)) => Some(a.saturating_sub(f)),
            _ => None,
        },
    })
}

/// Who a delivery attempt went to, as the assembly's reasons name it.
fn who(d: &DeliveryId) -> String {
    let how = if d.by_id { ", by message ID" } else { "" };
    format!("consumer {} (group {}{how})", d.consumer, d.group)
}
