//! Broker counters. They are reported in the NATS service API's stats (`$SRV.STATS.msgtrail`,
//! `nats micro stats msgtrail`) under each endpoint's `data`, and readable in-process.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Monotonic counters of what the broker did and refused.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Messages stored.
    pub uploads: AtomicU64,
    /// Upload requests (single or batch): `uploads` ÷ this is the mean batch size.
    pub upload_requests: AtomicU64,
    /// Settle requests (single ack or batch).
    pub settle_requests: AtomicU64,
    /// Uploads suppressed as duplicates.
    pub duplicates: AtomicU64,
    /// Fast-ingest batches published to the message stream (one JetStream ack each).
    pub fast_batches: AtomicU64,
    /// Uploads a fast-ingest batch did not store (a duplicate, another publisher in between,
    /// no answer) and that were published again with a PubAck each.
    pub fast_batch_fallbacks: AtomicU64,
    /// Deliveries sent (pull and push, including redeliveries).
    pub deliveries: AtomicU64,
    /// Redeliveries among them.
    pub redeliveries: AtomicU64,
    /// Settles by kind.
    pub acks: AtomicU64,
    /// Nacks.
    pub nacks: AtomicU64,
    /// Terms.
    pub terms: AtomicU64,
    /// Settles refused because they came after their delivery's ack wait (`delivery_expired`).
    pub settles_expired: AtomicU64,
    /// Of those, the ones JetStream showed already settled in the group (`already_settled`).
    pub settles_already_settled: AtomicU64,
    /// Messages dead-lettered.
    pub dead_letters: AtomicU64,
    /// No-matching-message notices.
    pub no_match: AtomicU64,
    /// Channels opened.
    pub channels_opened: AtomicU64,
    /// Channel requests refused.
    pub channels_refused: AtomicU64,
    /// Stage records accepted into the buffer.
    pub stage_records: AtomicU64,
    /// Stage records dropped because the buffer was full.
    pub stage_dropped: AtomicU64,
    /// Stage records given up after the stage stream refused their batch (retry queue full,
    /// or still unstored at shutdown).
    pub stage_publish_failed: AtomicU64,
    /// Stage-stream publishes tried again after a failure.
    pub stage_publish_retries: AtomicU64,
    /// Stage-stream messages written (batches).
    pub stage_batches: AtomicU64,
    /// Client stage records relayed.
    pub relayed_records: AtomicU64,
    /// Of them, the records relayed from inside their delivery's settle (settle batch
    /// version 2), proven by the settle's token.
    pub own_records: AtomicU64,
    /// Stage reports received on their own (`msgtrail.v1.stage`), not riding along a batch.
    pub stage_reports: AtomicU64,
    /// The most requests handled at once so far (bounded by `max_concurrent_requests`).
    pub peak_concurrent_requests: AtomicU64,
    errors: Mutex<BTreeMap<&'static str, u64>>,
}

impl Metrics {
    /// Adds one to a counter.
    pub fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an error reply by its code.
    pub fn error(&self, code: msgtrail_core::ErrorCode) {
        *self.errors.lock().entry(code.as_str()).or_default() += 1;
    }

    /// Error replies so far, by code.
    pub fn errors(&self) -> BTreeMap<&'static str, u64> {
        self.errors.lock().clone()
    }

    /// All counters as JSON.
    pub fn snapshot(&self) -> serde_json::Value {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        serde_json::json!({
            "uploads": g(&self.uploads),
            "upload_requests": g(&self.upload_requests),
            "settle_requests": g(&self.settle_requests),
            "duplicates": g(&self.duplicates),
            "fast_batches": g(&self.fast_batches),
            "fast_batch_fallbacks": g(&self.fast_batch_fallbacks),
            "deliveries": g(&self.deliveries),
            "redeliveries": g(&self.redeliveries),
            "acks": g(&self.acks),
            "nacks": g(&self.nacks),
            "terms": g(&self.terms),
            "settles_expired": g(&self.settles_expired),
            "settles_already_settled": g(&self.settles_already_settled),
            "dead_letters": g(&self.dead_letters),
            "no_match": g(&self.no_match),
            "channels_opened": g(&self.channels_opened),
            "channels_refused": g(&self.channels_refused),
            "stage_records": g(&self.stage_records),
            "stage_dropped": g(&self.stage_dropped),
            "stage_publish_failed": g(&self.stage_publish_failed),
            "stage_publish_retries": g(&self.stage_publish_retries),
            "stage_batches": g(&self.stage_batches),
            "relayed_records": g(&self.relayed_records),
            "own_records": g(&self.own_records),
            "stage_reports": g(&self.stage_reports),
            "peak_concurrent_requests": g(&self.peak_concurrent_requests),
            "errors": self.errors(),
        })
    }
}
