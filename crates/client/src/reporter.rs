//! Stage reporting, built on the hooks, riding along the message path.
//!
//! An inline observer of the hooks (called synchronously as each event happens, no queue or
//! task hop of its own) turns the client's events into its stage records — P4, C2/C3, C6/C7,
//! X1/X2 — each with the proof the broker asks for (`token`: the delivery's ack token, or the
//! upload receipt for P4), and puts them into a shared bounded **outbox**. P1 is not reported this
//! way: each upload entry carries its send time (`sent_at`) and the broker writes P1 from it.
//!
//! The outbox empties three ways:
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

use crate::channel::{decode, Channel};
use crate::error::ClientError;
use crate::hooks::{HookEvent, Hooks};
use msgtrail_core::frame::{self, ReportedRecord, ReportsOutcome};
use msgtrail_core::outcome::{ConfirmOutcome, ProcessOutcome};
use msgtrail_core::subjects as s;
use msgtrail_core::wire::OkReply;
use msgtrail_core::{Stage, StageRecord};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, Notify};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// A time shifted by a (test-only) clock offset, saturating.
pub(crate) fn shifted(at: u64, offset_nanos: i64) -> u64 {
    at.saturating_add_signed(offset_nanos)
}

/// Most records one request carries, riding along or alone: the broker accepts at most 1000
/// per report (docs/PROTOCOL.md §11) and refuses a larger lot whole, although a frame could
/// hold [`frame::MAX_REPORTED_RECORDS`].
pub const MAX_RECORDS_PER_REQUEST: usize = 1000;
/// Longest a record waits in the outbox for a batch to take it before it is sent alone.
pub const LINGER: Duration = Duration::from_millis(20);
/// Most records the outbox holds; more are dropped and counted.
pub const OUTBOX_CAPACITY: usize = 65_536;

/// Counters of the reporter.
#[derive(Debug, Default)]
pub struct Reporter {
    sent: AtomicU64,
    failed: AtomicU64,
    dropped: AtomicU64,
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

/// The stage record of an event, if it has one. ([`HookEvent::BeforeSend`] maps to P1, which
/// the SDK does not report through the outbox: it travels as the upload's `sent_at`.)
pub fn record_of(event: &HookEvent) -> Option<StageRecord> {
    let r = match event {
        HookEvent::BeforeSend {
            request_id,
            topic,
            attempt,
            traceparent,
            at,
        } => {
            let mut r = StageRecord::at(Stage::UploadSent, *at);
            r.request_id = Some(request_id.clone());
            r.topic = Some(topic.clone());
            r.attempt = Some(*attempt);
            r.traceparent = traceparent.clone();
            r
        }
        HookEvent::StoreConfirmed { reply, at } => {
            let mut r = StageRecord::at(Stage::StoreConfirmed, *at);
            r.request_id = Some(reply.request_id.clone());
            r.message_id = Some(reply.message_id);
            r.stream_seq = Some(reply.stream_seq);
            if reply.duplicate {
                r.set_outcome(ConfirmOutcome::Duplicate);
            }
            r
        }
        HookEvent::Received { delivery, at } => {
            let stage = if delivery.push {
                Stage::PushReceived
            } else {
                Stage::PullReceived
            };
            delivery_record(stage, delivery, *at)
        }
        HookEvent::ProcessingStarted { delivery, at } => {
            delivery_record(Stage::ProcessStarted, delivery, *at)
        }
        HookEvent::ProcessingFinished {
            delivery,
            outcome,
            at,
        } => {
            let mut r = delivery_record(Stage::ProcessFinished, delivery, *at);
            match outcome {
                Ok(()) => r.set_outcome(ProcessOutcome::Ok),
                Err(e) => {
                    r.set_outcome(ProcessOutcome::Failed);
                    r.detail = Some(e.chars().take(1024).collect());
                }
            }
            r
        }
        HookEvent::Settled { delivery, kind, at } => {
            let stage = if delivery.push {
                Stage::PushAckSent
            } else {
                Stage::PullAckSent
            };
            let mut r = delivery_record(stage, delivery, *at);
            r.set_outcome(*kind);
            r
        }
        HookEvent::AfterSend { .. } => return None,
    };
    Some(r)
}

/// The proof the broker wants with the event's record: the delivery's ack token for consumer
/// stages, the upload receipt for P4, nothing for P1.
pub fn token_of(event: &HookEvent) -> Option<String> {
    match event {
        HookEvent::StoreConfirmed { reply, .. } => {
            Some(reply.receipt.clone()).filter(|r| !r.is_empty())
        }
        HookEvent::Received { delivery, .. }
        | HookEvent::ProcessingStarted { delivery, .. }
        | HookEvent::ProcessingFinished { delivery, .. }
        | HookEvent::Settled { delivery, .. } => Some(delivery.ack_token.clone()),
        HookEvent::BeforeSend { .. } | HookEvent::AfterSend { .. } => None,
    }
}

/// The record the reporting hook puts in the outbox for `event`, with its token: P4, C2/C3,
/// C6/C7, X1/X2. `None` for P1 (it rides as `sent_at`), for events without a stage, and for a
/// P4 without a receipt (the broker would refuse it, and every record riding with it).
pub fn reported(event: &HookEvent) -> Option<ReportedRecord> {
    if matches!(
        event,
        HookEvent::BeforeSend { .. } | HookEvent::AfterSend { .. }
    ) {
        return None;
    }
    let token = token_of(event)?;
    Some(ReportedRecord {
        record: record_of(event)?,
        token,
    })
}

fn delivery_record(stage: Stage, d: &crate::hooks::DeliveryInfo, at: u64) -> StageRecord {
    let mut r = StageRecord::at(stage, at);
    r.message_id = Some(d.message_id);
    r.group = Some(d.group.clone());
    r.attempt = Some(d.attempt);
    r.topic = Some(d.topic.clone());
    r
}

/// The encoded size of a reported record in a frame (an upper bound: every field present
/// counts with its length prefix, and the record as if it were alone in its token's group —
/// records sharing a token take less).
pub(crate) fn reported_size(r: &ReportedRecord) -> usize {
    let rec = &r.record;
    let s8 = |v: Option<&str>| v.map_or(0, |v| 1 + v.len());
    let s16 = |v: Option<&str>| v.map_or(0, |v| 2 + v.len());
    2 + r.token.len()
        + 2 // the group's record count
        + 1 // stage
        + 8 // at
        + 2 // present bits
        + rec.message_id.map_or(0, |_| 16)
        + s8(rec.request_id.as_ref().map(|v| v.as_str()))
        + s8(rec.producer.as_ref().map(|v| v.as_str()))
        + s8(rec.consumer.as_ref().map(|v| v.as_str()))
        + s8(rec.group.as_ref().map(|v| v.as_str()))
        + s16(rec.topic.as_deref())
        + rec.attempt.map_or(0, |_| 4)
        + rec.stream_seq.map_or(0, |_| 8)
        + s8(rec.outcome.as_deref())
        + s16(rec.detail.as_deref())
        + s8(rec.service.as_deref())
        + s8(rec.traceparent.as_deref())
        + if rec.attrs.is_empty() {
            0
        } else {
            1 + rec
                .attrs
                .iter()
                .map(|(k, v)| 3 + k.len() + v.len())
                .sum::<usize>()
        }
        + rec.payload_size.map_or(0, |_| 8)
        + s16(rec.payload_head.as_deref())
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

/// Bytes of a report frame around its records: the frame head and the record count.
const REPORT_FRAME_OVERHEAD: usize = 4 + 2;

#[derive(Debug, Default)]
struct Queued {
    records: VecDeque<ReportedRecord>,
    /// When the oldest record still queued arrived (for the flusher's linger).
    oldest: Option<Instant>,
}

/// The shared, bounded outbox of reported records, and the reporter's counters.
#[derive(Debug)]
pub(crate) struct Outbox {
    queued: Mutex<Queued>,
    capacity: usize,
    /// Records taken into requests not answered yet.
    in_flight: AtomicUsize,
    /// Signalled when records arrive from outside the reporting task.
    arrived: Notify,
    /// Signalled when a request's records are answered.
    answered: Notify,
    counters: Arc<Reporter>,
}

impl Outbox {
    fn new(capacity: usize, counters: Arc<Reporter>) -> Self {
        Outbox {
            queued: Mutex::new(Queued::default()),
            capacity,
            in_flight: AtomicUsize::new(0),
            arrived: Notify::new(),
            answered: Notify::new(),
            counters,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queued> {
        self.queued.lock().expect("outbox poisoned")
    }

    /// Queues a record, or drops and counts it when the outbox is full.
    /// Queues a record; true when it is the first of an empty outbox.
    fn push_quiet(&self, r: ReportedRecord) -> bool {
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

    fn is_empty(&self) -> bool {
        self.lock().records.is_empty()
    }

    fn oldest(&self) -> Option<Instant> {
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
    async fn settled(&self) {
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

/// Sends records as one binary report to the broker's stage subject.
async fn send_report(channel: Arc<Channel>, records: Vec<ReportedRecord>, ticket: Ticket) {
    if records.is_empty() {
        return;
    }
    let body = frame::encode_report(&records);
    let reply = channel
        .request_on_channel(s::STAGE_REPORT, body, channel.timeout)
        .await
        .and_then(|m| decode::<OkReply>(&m));
    match reply {
        Ok(r) => ticket.accepted(r.accepted.unwrap_or(records.len())),
        Err(e) => ticket.failed(&e),
    }
}

/// The reporting task: sends what no batch took from the outbox within [`LINGER`]. When the
/// hooks are closed or dropped (`lifeline` ends) it sends everything left and waits for the
/// records in flight, then ends.
async fn run(
    mut lifeline: mpsc::Receiver<Arc<HookEvent>>,
    outbox: Arc<Outbox>,
    channel: Arc<Channel>,
    max_bytes: usize,
) {
    let mut reports: JoinSet<()> = JoinSet::new();
    let mut open = true;
    let take = |outbox: &Arc<Outbox>| {
        outbox.take(
            MAX_RECORDS_PER_REQUEST,
            max_bytes.saturating_sub(REPORT_FRAME_OVERHEAD),
        )
    };
    while open {
        let deadline = outbox.oldest().map(|t| t + LINGER);
        tokio::select! {
            ev = lifeline.recv() => if ev.is_none() {
                open = false;
            },
            _ = outbox.arrived.notified() => {},
            _ = sleep_until(deadline), if deadline.is_some() => {
                // Still there after the linger: no batch took these.
                if outbox.oldest().is_some_and(|t| t + LINGER <= Instant::now()) {
                    let (records, ticket) = take(&outbox);
                    reports.spawn(send_report(channel.clone(), records, ticket));
                }
            },
            Some(_) = reports.join_next(), if !reports.is_empty() => {},
        }
    }
    // Closing: send what is left, then wait for what batches took.
    while reports.join_next().await.is_some() {}
    while !outbox.is_empty() {
        let (records, ticket) = take(&outbox);
        if records.is_empty() {
            // A single record over the byte bound: it can never be sent.
            let n = outbox.lock().records.drain(..).count();
            outbox
                .counters
                .failed
                .fetch_add(n as u64, Ordering::Relaxed);
            break;
        }
        send_report(channel.clone(), records, ticket).await;
    }
    outbox.settled().await;
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
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
            if let Some(mut r) = reported(ev) {
                r.record.at = shifted(r.record.at, clock_offset_nanos);
                observed.push(r);
            }
        }));
        let task = tokio::spawn(run(
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
        let task = self.task.lock().expect("reporter task poisoned").take();
        if let Some(task) = task {
            if tokio::time::timeout(timeout, task).await.is_err() {
                tracing::warn!("stage reports still unsent at close");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hooks::DeliveryInfo;
    use msgtrail_core::wire::{AckKind, UploadReply};
    use msgtrail_core::{ClientId, MessageId, RequestId};

    fn delivery() -> DeliveryInfo {
        DeliveryInfo {
            message_id: MessageId::new(),
            topic: "orders.eu".into(),
            group: ClientId::new("billing").unwrap(),
            attempt: 2,
            push: false,
            ack_token: "tok".into(),
        }
    }

    #[test]
    fn p1_does_not_ride_in_the_outbox_and_p4_needs_its_receipt() {
        let before = HookEvent::BeforeSend {
            request_id: RequestId::new("r").unwrap(),
            topic: "t".into(),
            attempt: 1,
            traceparent: None,
            at: 1,
        };
        assert_eq!(record_of(&before).unwrap().stage, Stage::UploadSent);
        assert!(reported(&before).is_none());
        let mut reply = UploadReply {
            message_id: MessageId::new(),
            request_id: RequestId::new("r").unwrap(),
            stream_seq: 3,
            duplicate: true,
            receipt: String::new(),
        };
        let p4 = |reply: &UploadReply| HookEvent::StoreConfirmed {
            reply: reply.clone(),
            at: 2,
        };
        assert!(reported(&p4(&reply)).is_none());
        reply.receipt = "receipt".into();
        let r = reported(&p4(&reply)).unwrap();
        assert_eq!(
            (r.record.stage, r.token.as_str()),
            (Stage::StoreConfirmed, "receipt")
        );
        assert_eq!(r.record.outcome.as_deref(), Some("duplicate"));
        let c7 = reported(&HookEvent::Settled {
            delivery: delivery(),
            kind: AckKind::Nack,
            at: 3,
        })
        .unwrap();
        assert_eq!(c7.record.stage, Stage::PullAckSent);
        assert_eq!(c7.token, "tok");
    }

    #[test]
    fn the_size_bound_covers_the_encoding() {
        let mut rec = record_of(&HookEvent::ProcessingFinished {
            delivery: delivery(),
            outcome: Err("boom ✗".into()),
            at: 5,
        })
        .unwrap();
        rec.attrs.insert("k".into(), "v".into());
        rec.service = Some("svc".into());
        let r = ReportedRecord {
            record: rec,
            token: "t".repeat(300),
        };
        let framed = frame::encode_report(std::slice::from_ref(&r)).len();
        assert_eq!(framed, REPORT_FRAME_OVERHEAD + reported_size(&r));
    }

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
