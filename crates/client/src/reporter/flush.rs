//! The reporting task: flushes what no batch took from the outbox within [`LINGER`] as one
//! binary report to `msgtrail.v1.stage`, releases into it the records of deliveries not
//! settled within [`HOLD`], and sends everything left at close.

use super::outbox::{Outbox, Ticket};
use super::{HOLD, LINGER, MAX_RECORDS_PER_REQUEST};
use crate::channel::{decode, Channel};
use crate::hooks::HookEvent;
use msgtrail_core::frame::{self, ReportedRecord};
use msgtrail_core::subjects as s;
use msgtrail_core::wire::OkReply;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Bytes of a report frame around its records: the frame head and the record count.
pub(super) const REPORT_FRAME_OVERHEAD: usize = 4 + 2;

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
pub(super) async fn run(
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
        let lingered = outbox.oldest().map(|t| t + LINGER);
        let held = outbox.oldest_held().map(|t| t + HOLD);
        let deadline = match (lingered, held) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        tokio::select! {
            ev = lifeline.recv() => if ev.is_none() {
                open = false;
            },
            _ = outbox.arrived.notified() => {},
            _ = sleep_until(deadline), if deadline.is_some() => {
                // Deliveries still unsettled after the hold: their records go as a report.
                if let Some(before) = Instant::now().checked_sub(HOLD) {
                    outbox.release_held(Some(before));
                }
                // Still there after the linger: no batch took these.
                if outbox.oldest().is_some_and(|t| t + LINGER <= Instant::now()) {
                    let (records, ticket) = take(&outbox);
                    reports.spawn(send_report(channel.clone(), records, ticket));
                }
            },
            Some(_) = reports.join_next(), if !reports.is_empty() => {},
        }
    }
    // Closing: send what is left (held records too), then wait for what batches took.
    while reports.join_next().await.is_some() {}
    outbox.release_held(None);
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
