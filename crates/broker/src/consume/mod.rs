//! Consumption: consumer groups on JetStream, pull (`fetch`), settling (`ack`), redelivery
//! and dead letters. Push subscriptions (push.rs) deliver through the same [`Deliverer`].
//!
//! Each (group, topic filter, attribute filter) is one durable JetStream pull consumer named
//! `g-<group>-<hash>`: consumers of one group share its messages, and every group has its own
//! consumer, so every group gets every message. JetStream cannot filter on headers, so
//! attribute filters are applied here: a message that does not match is acked on the group's
//! consumer (it is not for this subscription) and never delivered.
//!
//! Records: C5 (pull sent) / C1 (push sent) per delivery, R1 `redeliver` when a delivery is a
//! redelivery, C8 / C4 when JetStream has confirmed the settle (outcome ack | nack | term),
//! R1 `dead_letter` on term, on a nack of the last allowed attempt, and when JetStream reports
//! the maximum deliveries reached after ack timeouts; N1 for a fetch that matched nothing.
//!
//! Settles are confirmed, not just sent: the broker sends each one as a request to its
//! JetStream ack subject (a "double ack") and answers ok only when the consumer's leader has
//! answered. A settle after the delivery's ack wait ran out (the deadline in its token) is
//! not sent at all and is refused as `delivery_expired`, with no C4/C8: JetStream no longer
//! holds the delivery (it redelivers the message, or dead-letters it after the last attempt),
//! and JetStream itself would answer an ack of a message it already dead-lettered as if it
//! had taken it.
//!
//! Here live the [`Deliverer`] and the naming of durable consumers; its methods are split by
//! job: `take` (a group's consumer and the delivery records), `fetch` (pull requests, by
//! filter or by ID), `settle` (confirmed acks, nacks and terms) and `dead_letter`.

mod dead_letter;
mod fetch;
mod settle;
mod take;

#[cfg(test)]
mod tests;

use crate::channels::OpenChannel;
use crate::clients::may_subscribe;
use crate::metrics::Metrics;
use crate::shared::Shared;
use crate::token::AckToken;
use async_nats::jetstream::{self, consumer::pull, consumer::AckPolicy, consumer::DeliverPolicy};
use base64::Engine;
use bytes::Bytes;
use futures::StreamExt;
use msgtrail_core::frame::{DeliveredMessage, DeliveryBatch};
use msgtrail_core::headers as h;
use msgtrail_core::outcome::RedeliveryOutcome;
use msgtrail_core::subjects::{
    dead_letter_subject, message_subject, topic_of_subject, MESSAGE_STREAM,
};
use msgtrail_core::validate_topic_filter;
use msgtrail_core::wire::{
    AckRequest, Delivery, FetchReply, FetchRequest, Format, SettleKind, Subscription,
    NO_MATCHING_MESSAGE,
};
use msgtrail_core::{ClientId, ErrorCode, GroupId, MessageId, Role, Stage, StageRecord, WireError};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Longest a fetch may wait.
pub(crate) const MAX_FETCH_WAIT: Duration = Duration::from_secs(30);
/// Most messages one fetch may return.
pub(crate) const MAX_FETCH: u32 = 1000;
/// How far after a message ID's timestamp a fetch by ID searches the stream.
const FIND_BY_ID_WINDOW_MS: u64 = 10_000;
/// How long an idle group consumer is kept by JetStream.
const GROUP_INACTIVE: Duration = Duration::from_secs(7 * 24 * 3600);
/// Longest a settle waits for JetStream's confirmation. Below the SDK's request timeouts
/// (2 s in the fault suite, 5 s by default), so that a lost confirmation is answered
/// `unavailable` (settle again) rather than left to the client's timeout.
pub(crate) const SETTLE_CONFIRM_WAIT: Duration = Duration::from_millis(1500);
/// The most a delivery's settle deadline is set before JetStream's ack wait runs out: room
/// for the broker's receipt of the delivery and the settle's trip to the NATS server, so that
/// a settle the broker lets through reaches JetStream while the delivery is still its own.
const SETTLE_MARGIN_MAX: Duration = Duration::from_millis(50);

/// Delivers messages to consumers and settles them.
#[derive(Clone)]
pub(crate) struct Deliverer {
    /// What every handler shares.
    pub shared: Arc<Shared>,
    /// The group consumers created or looked up so far, by durable name. Poison is recovered
    /// (`msgtrail_core::sync::Recover`): one get or insert of a cache that may lose nothing.
    pub(crate) consumers: Arc<Mutex<HashMap<String, jetstream::consumer::PullConsumer>>>,
}

impl std::fmt::Debug for Deliverer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deliverer")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

/// A message taken from JetStream, parsed.
#[derive(Debug)]
pub(crate) struct Taken {
    pub message_id: MessageId,
    pub topic: String,
    pub producer: ClientId,
    pub attrs: BTreeMap<String, String>,
    pub payload: bytes::Bytes,
    pub attempt: u32,
    pub stream_seq: u64,
    pub ack_subject: String,
    /// When a settle of this delivery is too late (Unix ms, this broker's clock).
    pub settle_by_ms: u64,
    /// When JetStream stored the message (Unix ns, the nats-server's clock), from the
    /// delivery's metadata: the C1/C5's `stored_at`.
    pub stored_at: Option<u64>,
}

/// Milliseconds since the Unix epoch, by this broker's clock.
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The settle deadline of a delivery received now from a consumer with this ack wait: the ack
/// wait less a tenth of it, at most [`SETTLE_MARGIN_MAX`]. JetStream started the ack wait
/// when it sent the delivery, a little before the broker received it.
pub(crate) fn settle_deadline_ms(now_ms: u64, ack_wait: Duration) -> u64 {
    let margin = (ack_wait / 10).min(SETTLE_MARGIN_MAX);
    now_ms + ack_wait.saturating_sub(margin).as_millis() as u64
}

/// Deliveries and their ack tokens as one binary frame (an empty one is the
/// no-matching-message notice).
pub(crate) fn delivery_batch(delivered: Vec<(Taken, String)>, group: &GroupId) -> DeliveryBatch {
    DeliveryBatch {
        no_matching_message: delivered.is_empty(),
        messages: delivered
            .into_iter()
            .map(|(t, ack_token)| DeliveredMessage {
                message_id: t.message_id,
                topic: t.topic,
                producer: t.producer.to_string(),
                group: group.to_string(),
                delivery_attempt: t.attempt,
                stream_seq: t.stream_seq,
                ack_token,
                attributes: t.attrs.into_iter().collect(),
                payload: t.payload,
            })
            .collect(),
    }
}

/// FNV-1a 64, to name group consumers after their subscription.
fn fnv64(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0u8)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    h
}

/// The durable consumer name of a subscription.
pub fn durable_name(sub: &Subscription) -> String {
    let mut parts: Vec<&str> = vec![&sub.topic];
    for (k, v) in &sub.filter {
        parts.push(k);
        parts.push(v);
    }
    format!("g-{}-{:016x}", sub.group, fnv64(&parts))
}

/// The durable consumer of a group's fetches by message ID of one message
/// (`g-<group>-m<32 hex>`, docs/PROTOCOL.md §8.2).
pub(crate) fn by_id_durable_name(group: &str, id: &MessageId) -> String {
    format!("g-{group}-m{}", id.trace_hex())
}

/// Whether a durable consumer name is one of fetches by message ID (`g-<group>-m<32 hex>`).
pub(crate) fn is_by_id_durable(name: &str) -> bool {
    name.strip_prefix("g-")
        .and_then(|s| s.rsplit_once('-'))
        .and_then(|(_, last)| last.strip_prefix('m'))
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The group of a durable consumer name (`g-<group>-<hash>`).
pub(crate) fn group_of_durable(name: &str) -> Option<&str> {
    name.strip_prefix("g-")
        .and_then(|s| s.rsplit_once('-'))
        .map(|(g, _)| g)
}

fn matches_filter(filter: &BTreeMap<String, String>, attrs: &BTreeMap<String, String>) -> bool {
    filter.iter().all(|(k, v)| attrs.get(k) == Some(v))
}
