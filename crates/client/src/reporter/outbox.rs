//! The shared, bounded outbox of reported records, and the [`Ticket`] that says what became
//! of the records a request took from it.

use super::records::reported_size;
use super::Reporter;
use msgtrail_core::frame::{ReportedRecord, ReportsOutcome};
use msgtrail_core::sync::Recover;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;
use tokio::time::Instant;

#[derive(Debug, Default)]
pub(super) struct Queued {
    pub(super) records: VecDeque<ReportedRecord>,
    /// When the oldest record still queued arrived (for the flusher's linger).
    pub(super) oldest: Option<Instant>,
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

    /// Queues a record, or drops and counts it when the outbox is full.
    /// Queues a record; true when it is the first of an empty outbox.
    pub(super) fn push_quiet(&self, r: ReportedRecord) -> bool {
        let mut q = self.lock();
        if q.records.len() >= self.capacity {
            drop(q);
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            self.counters.failed.fetch_add(1, Ordering::Relaxed);
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

    pub(super) fn is_empty(&self) -> bool {
        self.lock().records.is_empty()
    }

    pub(super) fn oldest(&self) -> Option<Instant> {
        self.lock().oldest
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

    /// What the broker said about the records riding along a batch.
    pub(crate) fn outcome(self, o: &ReportsOutcome) {
        match &o.error {
            Some(e) => self.failed(e),
            None => self.accepted(o.accepted as usize),
        }
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
}
