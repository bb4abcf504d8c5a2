//! Stage reporting, built on the hooks: a hook turns the client's events into its stage
//! records (P1, P4, C2/C3, C6/C7, X1/X2), each with the proof the broker asks for (`token`:
//! the delivery's ack token, or the upload receipt for P4), and a task sends them in batches
//! to the broker's stage subject through the channel, which checks and relays them. Reporting is best
//! effort and never delays the message path: events beyond the queue are dropped and
//! counted by [`crate::hooks::Hooks::dropped`], and batches the broker refuses are counted by
//! [`Reporter::failed`].

use crate::channel::{request_raw, Channel};
use crate::hooks::{HookEvent, Hooks};
use async_nats::HeaderMap;
use msgtrail_core::headers as h;
use msgtrail_core::subjects as s;
use msgtrail_core::{Stage, StageRecord};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// Records per report.
const BATCH: usize = 256;
/// Longest a record waits for its batch.
const LINGER: Duration = Duration::from_millis(20);
/// Queue length of the reporting hook.
const QUEUE: usize = 65_536;

/// Counters of the reporter.
#[derive(Debug, Default)]
pub struct Reporter {
    sent: AtomicU64,
    failed: AtomicU64,
}

impl Reporter {
    /// Records accepted by the broker.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Records lost because a report failed.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}

/// The stage record of an event, if it has one.
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
                r.outcome = Some("duplicate".into());
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
                Ok(()) => r.outcome = Some("ok".into()),
                Err(e) => {
                    r.outcome = Some("failed".into());
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
            r.outcome = Some(kind.as_str().into());
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

/// One report line: the event's record with its `token`, or `None` for events without a stage.
pub fn report_line(event: &HookEvent) -> Option<serde_json::Value> {
    let mut v = serde_json::to_value(record_of(event)?).expect("records serialize");
    if let Some(t) = token_of(event) {
        v["token"] = serde_json::Value::String(t);
    }
    Some(v)
}

fn encode_report(lines: &[serde_json::Value]) -> Vec<u8> {
    let mut out = Vec::new();
    for l in lines {
        serde_json::to_writer(&mut out, l).expect("values serialize");
        out.push(b'\n');
    }
    out
}

fn delivery_record(stage: Stage, d: &crate::hooks::DeliveryInfo, at: u64) -> StageRecord {
    let mut r = StageRecord::at(stage, at);
    r.message_id = Some(d.message_id);
    r.group = Some(d.group.clone());
    r.attempt = Some(d.attempt);
    r.topic = Some(d.topic.clone());
    r
}

/// Registers the reporting hook on `hooks`, sending through `channel`. The task keeps the
/// channel open until every event is reported: it ends when the hooks are closed
/// ([`Hooks::close`]) or dropped with the last producer or consumer clone, after sending what
/// it still holds.
pub(crate) fn install(hooks: &Hooks, channel: Arc<Channel>) -> (Arc<Reporter>, JoinHandle<()>) {
    let reporter = Arc::new(Reporter::default());
    let mut rx = hooks.channel(&[], QUEUE);
    let counters = reporter.clone();
    let task = tokio::spawn(async move {
        let ch = channel;
        let mut batch: Vec<serde_json::Value> = Vec::with_capacity(BATCH);
        while let Some(first) = rx.recv().await {
            batch.extend(report_line(&first));
            let deadline = tokio::time::Instant::now() + LINGER;
            while batch.len() < BATCH {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(ev)) => batch.extend(report_line(&ev)),
                    _ => break,
                }
            }
            if batch.is_empty() {
                continue;
            }
            let n = batch.len() as u64;
            let body = encode_report(&batch);
            batch.clear();
            let result = ch
                .with_channel(|id| {
                    let mut headers = HeaderMap::new();
                    headers.insert(h::CHANNEL, id.as_str());
                    request_raw(
                        &ch.client,
                        s::STAGE_REPORT,
                        Some(headers),
                        body.clone().into(),
                        ch.timeout,
                    )
                })
                .await;
            match result {
                Ok(_) => counters.sent.fetch_add(n, Ordering::Relaxed),
                Err(e) => {
                    tracing::warn!(records = n, error = %e, "stage report failed");
                    counters.failed.fetch_add(n, Ordering::Relaxed)
                }
            };
        }
    });
    (reporter, task)
}

/// A producer's or consumer's reporting: the counters and the task, shared by its clones.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reporting {
    /// The counters, when reporting is on.
    pub(crate) counters: Option<Arc<Reporter>>,
    task: Arc<std::sync::Mutex<Option<JoinHandle<()>>>>,
}

impl Reporting {
    /// Starts reporting through `channel` if `enabled`.
    pub(crate) fn start(enabled: bool, hooks: &Hooks, channel: &Arc<Channel>) -> Self {
        if !enabled {
            return Reporting::default();
        }
        let (counters, task) = install(hooks, channel.clone());
        Reporting {
            counters: Some(counters),
            task: Arc::new(std::sync::Mutex::new(Some(task))),
        }
    }

    /// Closes the hooks and waits up to `timeout` for the reports still queued to be sent.
    pub(crate) async fn finish(&self, hooks: &Hooks, timeout: std::time::Duration) {
        hooks.close();
        let task = self.task.lock().expect("reporter task poisoned").take();
        if let Some(task) = task {
            if tokio::time::timeout(timeout, task).await.is_err() {
                tracing::warn!("stage reports still unsent at close");
            }
        }
    }
}
