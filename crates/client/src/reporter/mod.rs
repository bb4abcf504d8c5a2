//! Stage reporting, built on the hooks, riding along the message path.
//!
//! An inline observer of the hooks (called synchronously as each event happens, no queue or
//! task hop of its own) turns the client's events into its stage records — P4, C2/C3, C6/C7,
//! X1/X2 — each with the proof the broker asks for (`token`: the delivery's ack token, or the
//! upload receipt for P4), and puts them into a shared bounded **outbox**. P1 is not reported this
//! way: each upload entry carries its send time (`sent_at`) and the broker writes P1 from it.
//!
//! A consumer's records of a delivery (C2/C3, C6/C7, X1/X2) are **held for its settle**: the
//! settle takes them into its own entry of the settle batch (docs/PROTOCOL.md §18.4, version
//! 2), where the settle's token proves them, so they cost neither a request nor a token of
//! their own and the broker checks that token once. A delivery not settled within [`HOLD`]
//! has its records released into the queue below.
//!
//! The outbox's queue (P4s, released deliveries' records) empties three ways:
//! - **riding along**: the upload and settle batchers take what it holds (up to
//!   [`MAX_RECORDS_PER_REQUEST`] records, within the request's byte bound) into the
//!   batch request they are about to send, so under load reports cost no request of their own;
//! - **flushed**: records no batch took within [`LINGER`] are sent as one binary report to
//!   the broker's stage subject (`msgtrail.v1.stage`);
//! - **at close**: [`crate::Producer::close`] and [`crate::Consumer::close`] send what is
//!   left and wait for the reports in flight.
//!
//! The broker accepts the records of one request whole or refuses them whole; a refusal never
//! fails the uploads or settles they rode with. Reporting is best effort and never delays the
//! message path: a record beyond the outbox is dropped and counted by [`Reporter::dropped`],
//! and records the broker refused or never answered are counted by [`Reporter::failed`].

mod flush;
mod outbox;
mod records;

pub(crate) use outbox::{Outbox, Ticket};
pub(crate) use records::{record_of, record_size};

use crate::channel::Channel;
use crate::error::ClientError;
use crate::hooks::{HookEvent, Hooks};
use msgtrail_core::frame::{ReportedRecord, ReportsOutcome};
use msgtrail_core::sync::Recover;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;

/// A time shifted by a (test-only) clock offset, saturating.
pub(crate) fn shifted(at: u64, offset_nanos: i64) -> u64 {
    at.saturating_add_signed(offset_nanos)
}

/// Most records one request carries, riding along or alone: the broker accepts at most 1000
/// per report (docs/PROTOCOL.md §11) and refuses a larger lot whole, although a frame could
/// hold [`frame::MAX_REPORTED_RECORDS`].
pub(crate) const MAX_RECORDS_PER_REQUEST: usize = 1000;
/// Longest a record waits in the outbox for a batch to take it before it is sent alone.
pub(crate) const LINGER: Duration = Duration::from_millis(20);
/// Longest a delivery's records wait for its settle to carry them; then they are sent as a
/// report (a handler that runs longer, a delivery never settled).
pub(crate) const HOLD: Duration = Duration::from_secs(1);
/// Most records the outbox holds; more are dropped and counted.
pub(crate) const OUTBOX_CAPACITY: usize = 65_536;

/// Counters of the reporter.
#[derive(Debug, Default)]
pub struct Reporter {
    pub(super) sent: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) dropped: AtomicU64,
}

impl Reporter {
    /// Records the broker accepted.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Records lost: refused by the broker, on a request that failed, or dropped because the
    /// outbox was full ([`Reporter::dropped`] counts those alone).
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Records dropped because the outbox was full (included in [`Reporter::failed`]).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The records a batch request about to be sent takes along from `outbox` (none without
/// reporting), within the `spare_bytes` its own entries left, and the ticket that says what
/// became of them.
pub(crate) fn ride_along(
    outbox: Option<&Arc<Outbox>>,
    spare_bytes: usize,
) -> (Vec<ReportedRecord>, Option<Ticket>) {
    match outbox {
        Some(o) => {
            let (r, t) = o.take(MAX_RECORDS_PER_REQUEST, spare_bytes);
            (r, Some(t))
        }
        None => (Vec::new(), None),
    }
}

/// Checks that a batch reply answers every item of its request (`what` names the results,
/// `items_name` the items), and
/// tells the ride-along ticket what became of its records: the reply's reports outcome, or
/// the request's failure.
pub(crate) fn batch_results<T>(
    reply: Result<(Vec<T>, ReportsOutcome), ClientError>,
    items: usize,
    (what, items_name): (&str, &str),
    ticket: Option<Ticket>,
) -> Result<Vec<T>, ClientError> {
    let checked = reply.and_then(|(r, reports)| {
        let n = r.len();
        if n != items {
            return Err(ClientError::decode(format!(
                "{n} {what} results for {items} {items_name}"
            )));
        }
        Ok((r, reports))
    });
    match checked {
        Ok((r, reports)) => {
            if let Some(t) = ticket {
                t.outcome(&reports);
            }
            Ok(r)
        }
        Err(e) => {
            if let Some(t) = ticket {
                t.failed(&e);
            }
            Err(e)
        }
    }
}

/// A producer's or consumer's reporting: the counters, the outbox and the task, shared by
/// its clones.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reporting {
    /// The counters, when reporting is on.
    pub(crate) counters: Option<Arc<Reporter>>,
    /// The outbox batches take records from, when reporting is on.
    pub(crate) outbox: Option<Arc<Outbox>>,
    /// The reporting task, taken once at close. Poison is recovered ([`Recover`]): the only
    /// critical section is that `take`.
    task: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl Reporting {
    /// Starts reporting through `channel` if `enabled`; a report frame stays within
    /// `max_bytes`. The task keeps the channel open until every record is sent: it ends when
    /// the hooks are closed ([`Hooks::close`]) or dropped with the last producer or consumer
    /// clone, after sending what it still holds.
    /// `clock_offset_nanos` shifts the time of every record (the test-only
    /// `clock_offset_nanos` of the options).
    pub(crate) fn start(
        (enabled, clock_offset_nanos): (bool, i64),
        hooks: &Hooks,
        channel: &Arc<Channel>,
        max_bytes: usize,
    ) -> Self {
        if !enabled {
            return Reporting::default();
        }
        let counters = Arc::new(Reporter::default());
        let outbox = Arc::new(Outbox::new(OUTBOX_CAPACITY, counters.clone()));
        // Records go into the outbox inline, as the events happen: no queue, no task hop.
        let observed = outbox.clone();
        hooks.observe(Arc::new(move |ev: &HookEvent| {
            if let Some(mut r) = records::reported(ev) {
                r.record.at = shifted(r.record.at, clock_offset_nanos);
                if records::of_a_delivery(ev) {
                    observed.hold(&r.token, records::proven_by_token(r.record));
                } else {
                    observed.push(r);
                }
            }
        }));
        let task = tokio::spawn(flush::run(
            hooks.lifeline(),
            outbox.clone(),
            channel.clone(),
            max_bytes,
        ));
        Reporting {
            counters: Some(counters),
            outbox: Some(outbox),
            task: Arc::new(Mutex::new(Some(task))),
        }
    }

    /// Closes the hooks and waits up to `timeout` for the records still queued to be sent.
    pub(crate) async fn finish(&self, hooks: &Hooks, timeout: Duration) {
        hooks.close();
        let task = self.task.lock().recover().take();
        if let Some(task) = task {
            if tokio::time::timeout(timeout, task).await.is_err() {
                tracing::warn!("stage reports still unsent at close");
            }
        }
    }
}
