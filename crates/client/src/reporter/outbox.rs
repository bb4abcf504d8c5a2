//! The shared, bounded outbox of reported records, and the [`Ticket`] that says what became
//! of the records a request took from it.
//!
//! It holds records two ways: a queue, oldest first, that any batch request takes from (or
//! the flusher sends as a report), and the records of deliveries **held for their settle**,
//! by ack token, that the delivery's settle takes into its own entry. A held delivery not
//! settled within [`super::HOLD`] is released into the queue (the flusher's job).

use super::records::reported_size;
use super::Reporter;
use msgtrail_core::frame::{ReportedRecord, ReportsOutcome};
use msgtrail_core::sync::Recover;
use msgtrail_core::StageRecord;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;
use tokio::time::Instant;

#[derive(Debug, Default)]
pub(super) struct Queued {
    pub(super) records: VecDeque<ReportedRecord>,
    /// When the oldest record still queued arrived (for the flusher's linger).
    pub(super) oldest: Option<Instant>,
    /// Records of deliveries waiting for their settle, by ack token.
    pub(super) held: HashMap<String, Vec<StageRecord>>,
    /// Held records, counted against the capacity with the queue.
    pub(super) held_records: usize,
    /// When each delivery was first held, oldest first (an entry whose token has been taken
    /// since is stale and skipped).
    pub(super) held_since: VecDeque<(Instant, String)>,
}

/// The shared, bounded outbox of reported records, and the reporter's counters.
#[derive(Debug)]
pub(crate) struct Outbox {
    /// The records and when the oldest came. Poison is recovered ([`Recover`]): holders push
    /// or take records and set the time, each a complete step (at worst a stale `oldest`
    /// shortens or lengthens one linger).
    queued: Mutex<Queued>,
    capacity: usize,
    /// Records taken into requests not answered yet.
    pub(super) in_flight: AtomicUsize,
    /// Signalled when records arrive from outside the reporting task.
    pub(super) arrived: Notify,
    /// Signalled when a request's records are answered.
    answered: Notify,
    pub(super) counters: Arc<Reporter>,
}

impl Outbox {
    pub(super) fn new(capacity: usize, counters: Arc<Reporter>) -> Self {
        Outbox {
            queued: Mutex::new(Queued::default()),
            capacity,
            in_flight: AtomicUsize::new(0),
            arrived: Notify::new(),
            answered: Notify::new(),
            counters,
        }
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Queued> {
        self.queued.lock().recover()
    }

    fn drop_one(&self) {
        self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        self.counters.failed.fetch_add(1, Ordering::Relaxed);
    }

    /// Queues a record, or drops and counts it when the outbox is full; true when it is the
    /// first of an empty queue.
    pub(super) fn push_quiet(&self, r: ReportedRecord) -> bool {
        let mut q = self.lock();
        if q.records.len() + q.held_records >= self.capacity {
            drop(q);
            self.drop_one();
            return false;
        }
        let first = q.records.is_empty();
        if first {
            q.oldest = Some(Instant::now());
        }
        q.records.push_back(r);
        first
    }

    /// Queues a record; wakes the flusher when it is the first (it arms the linger).
    pub(crate) fn push(&self, r: ReportedRecord) {
        if self.push_quiet(r) {
            self.arrived.notify_one();
        }
    }

    /// Holds a record of the delivery `token` for its settle to take ([`Outbox::take_held`]),
    /// or drops and counts it when the outbox is full; wakes the flusher when it is the
    /// first held (it arms the hold's deadline).
    pub(crate) fn hold(&self, token: &str, record: StageRecord) {
        let mut q = self.lock();
        if q.records.len() + q.held_records >= self.capacity {
            drop(q);
            self.drop_one();
            return;
        }
        q.held_records += 1;
        let first = q.held_since.is_empty();
        match q.held.get_mut(token) {
            Some(records) => records.push(record),
            None => {
                q.held.insert(token.to_owned(), vec![record]);
                q.held_since.push_back((Instant::now(), token.to_owned()));
            }
        }
        drop(q);
        if first {
            self.arrived.notify_one();
        }
    }

    /// The held records of the delivery `token`, taken into its settle (none when reporting
    /// holds nothing for it). They count as in flight until the settle's ticket says what
    /// became of them ([`Outbox::ticket`]).
    pub(crate) fn take_held(&self, token: &str) -> Vec<StageRecord> {
        let mut q = self.lock();
        if q.held_records == 0 {
            return Vec::new();
        }
        let records = q.held.remove(token).unwrap_or_default();
        q.held_records -= records.len();
        records
    }

    /// A ticket for `n` records taken out of the outbox some other way than [`Outbox::take`]
    /// (a settle's own records).
    pub(crate) fn ticket(self: &Arc<Self>, n: usize) -> Ticket {
        self.in_flight.fetch_add(n, Ordering::Relaxed);
        Ticket {
            outbox: self.clone(),
            n,
        }
    }

    /// Moves the records of deliveries held since `before` (every one with `None`) into the
    /// queue, with their token: their settle did not come in time, so they go as a report.
    pub(super) fn release_held(&self, before: Option<Instant>) {
        let mut q = self.lock();
        while let Some((since, _)) = q.held_since.front() {
            if before.is_some_and(|b| *since > b) {
                break;
            }
            let Some((_, token)) = q.held_since.pop_front() else {
                break;
            };
            let Some(records) = q.held.remove(&token) else {
                continue; // settled since
            };
            q.held_records -= records.len();
            if q.records.is_empty() {
                q.oldest = Some(Instant::now());
            }
            for record in records {
                q.records.push_back(ReportedRecord {
                    record,
                    token: token.clone(),
                });
            }
        }
        if q.held.is_empty() {
            q.held_since.clear();
        }
    }

    /// True when nothing is queued or held.
    pub(super) fn is_empty(&self) -> bool {
        let q = self.lock();
        q.records.is_empty() && q.held_records == 0
    }

    pub(super) fn oldest(&self) -> Option<Instant> {
        self.lock().oldest
    }

    /// When the delivery held longest was first held (stale entries dropped on the way).
    pub(super) fn oldest_held(&self) -> Option<Instant> {
        let mut q = self.lock();
        while let Some((since, token)) = q.held_since.front() {
            if q.held.contains_key(token) {
                return Some(*since);
            }
            q.held_since.pop_front();
        }
        None
    }

    /// Takes the oldest records, at most `max_records` and `max_bytes` of them (encoded), for
    /// a request about to be sent. The ticket says what became of them.
    pub(crate) fn take(
        self: &Arc<Self>,
        max_records: usize,
        max_bytes: usize,
    ) -> (Vec<ReportedRecord>, Ticket) {
        let mut out = Vec::new();
        {
            let mut q = self.lock();
            let mut bytes = 0usize;
            while out.len() < max_records {
                let Some(next) = q.records.front() else { break };
                let size = reported_size(next);
                if bytes + size > max_bytes {
                    break;
                }
                bytes += size;
                out.extend(q.records.pop_front());
            }
            if q.records.is_empty() {
                q.oldest = None;
            }
        }
        self.in_flight.fetch_add(out.len(), Ordering::Relaxed);
        let ticket = Ticket {
            outbox: self.clone(),
            n: out.len(),
        };
        (out, ticket)
    }

    /// Waits until no taken record is unanswered.
    pub(super) async fn settled(&self) {
        loop {
            let answered = self.answered.notified();
            tokio::pin!(answered);
            answered.as_mut().enable();
            if self.in_flight.load(Ordering::Acquire) == 0 {
                return;
            }
            answered.await;
        }
    }
}

/// Records taken from the outbox into one request: say what the broker made of them. A ticket
/// dropped unanswered counts its records as failed.
#[derive(Debug)]
pub(crate) struct Ticket {
    outbox: Arc<Outbox>,
    n: usize,
}

impl Ticket {
    /// The broker accepted `accepted` of the records (the rest are lost).
    pub(crate) fn accepted(mut self, accepted: usize) {
        let n = std::mem::take(&mut self.n);
        let c = &self.outbox.counters;
        c.sent.fetch_add(accepted.min(n) as u64, Ordering::Relaxed);
        c.failed
            .fetch_add(n.saturating_sub(accepted) as u64, Ordering::Relaxed);
        self.done(n);
    }

    /// The records were lost: refused, or their request failed.
    pub(crate) fn failed(mut self, why: &dyn std::fmt::Display) {
        let n = std::mem::take(&mut self.n);
        if n > 0 {
            tracing::warn!(records = n, error = %why, "stage records lost");
            self.outbox
                .counters
                .failed
                .fetch_add(n as u64, Ordering::Relaxed);
        }
        self.done(n);
    }

    /// What the broker said about the records riding along a batch: `accepted` of them
    /// were (those inside its entries included, which an `error` about the others does not
    /// concern), the rest are lost.
    pub(crate) fn outcome(self, o: &ReportsOutcome) {
        if let Some(e) = &o.error {
            tracing::warn!(error = %e, "stage records refused");
        }
        self.accepted(o.accepted as usize)
    }

    /// Adds the records of `other` to this ticket (one request carrying both).
    pub(crate) fn absorb(&mut self, mut other: Ticket) {
        self.n += std::mem::take(&mut other.n);
    }

    fn done(&self, n: usize) {
        if n > 0 {
            self.outbox.in_flight.fetch_sub(n, Ordering::AcqRel);
            self.outbox.answered.notify_waiters();
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let n = std::mem::take(&mut self.n);
        if n > 0 {
            self.outbox
                .counters
                .failed
                .fetch_add(n as u64, Ordering::Relaxed);
            self.done(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use msgtrail_core::{Stage, StageRecord};

    #[tokio::test]
    async fn the_outbox_is_bounded_and_takes_within_the_limits() {
        let counters = Arc::new(Reporter::default());
        let outbox = Arc::new(Outbox::new(3, counters.clone()));
        let rec = |i: u32| ReportedRecord {
            record: StageRecord::at(Stage::PullReceived, i as u64),
            token: "tok".into(),
        };
        for i in 0..5 {
            outbox.push(rec(i));
        }
        assert_eq!((counters.dropped(), counters.failed()), (2, 2));
        let one = reported_size(&rec(0));
        let (taken, ticket) = outbox.take(10, 2 * one);
        assert_eq!(taken.len(), 2);
        assert_eq!(outbox.in_flight.load(Ordering::Relaxed), 2);
        ticket.outcome(&ReportsOutcome {
            accepted: 2,
            error: None,
        });
        assert_eq!(counters.sent(), 2);
        let (taken, ticket) = outbox.take(10, 1 << 20);
        assert_eq!(taken.len(), 1);
        assert!(outbox.is_empty() && outbox.oldest().is_none());
        drop(ticket);
        assert_eq!(counters.failed(), 3, "a dropped ticket loses its records");
        outbox.settled().await;
    }

    #[tokio::test]
    async fn held_records_wait_for_their_settle_or_are_released_as_reports() {
        let counters = Arc::new(Reporter::default());
        let outbox = Arc::new(Outbox::new(4, counters.clone()));
        let at = |i: u64| StageRecord::at(Stage::PullReceived, i);
        outbox.hold("a", at(1));
        outbox.hold("b", at(2));
        outbox.hold("a", at(3));
        assert!(
            outbox.oldest().is_none(),
            "nothing queued: held records do not linger"
        );
        assert!(outbox.oldest_held().is_some());
        let a = outbox.take_held("a");
        assert_eq!(a.iter().map(|r| r.at).collect::<Vec<_>>(), [1, 3]);
        assert!(outbox.take_held("a").is_empty());
        // The capacity counts held and queued records alike.
        outbox.hold("c", at(4));
        outbox.push(ReportedRecord {
            record: at(5),
            token: "d".into(),
        });
        outbox.hold("e", at(6));
        outbox.hold("e", at(7));
        assert_eq!(counters.dropped(), 1);
        // Held before now: released into the queue with their token, oldest first; the
        // settled "a" is skipped.
        outbox.release_held(Some(Instant::now()));
        assert!(outbox.oldest_held().is_none());
        assert!(outbox.take_held("b").is_empty());
        let (queued, ticket) = outbox.take(10, 1 << 20);
        let got: Vec<(u64, &str)> = queued
            .iter()
            .map(|r| (r.record.at, r.token.as_str()))
            .collect();
        assert_eq!(got, [(5, "d"), (2, "b"), (4, "c"), (6, "e")]);
        assert!(outbox.is_empty());
        let mut ticket = ticket;
        ticket.absorb(outbox.ticket(2));
        assert_eq!(outbox.in_flight.load(Ordering::Relaxed), 6);
        ticket.outcome(&ReportsOutcome {
            accepted: 5,
            error: None,
        });
        assert_eq!((counters.sent(), counters.failed()), (5, 2));
        outbox.settled().await;
    }
}
