//! The dead-letter view: the messages some group gave up on, newest first, each with the
//! group, the consumer, the attempt and why, as the broker's R1 `dead_letter` record says.

use crate::error::StoreError;
use crate::store::{SearchQuery, Store};
use msgtrail_core::outcome::RedeliveryOutcome;
use msgtrail_core::partition::Partition;
use msgtrail_core::trajectory::{MessageState, Trajectory};
use msgtrail_core::{ClientId, GroupId, MessageId, RequestId, Stage, StageRecord};
use serde::{Deserialize, Serialize};

/// One dead letter: a message one group gave up on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DeadLetter {
    /// The message key (what `GET /api/messages/{id}` takes is `message_id`).
    pub key: String,
    /// The message ID.
    pub message_id: Option<MessageId>,
    /// The producer's request ID.
    pub request_id: Option<RequestId>,
    /// The producer.
    pub producer: Option<ClientId>,
    /// The topic.
    pub topic: Option<String>,
    /// The group that gave up.
    pub group: Option<GroupId>,
    /// The consumer of the last attempt.
    pub consumer: Option<ClientId>,
    /// The last attempt.
    pub attempt: Option<u32>,
    /// When the broker dead-lettered it (Unix nanoseconds, the broker's clock).
    pub at: u64,
    /// The message's first record time (Unix nanoseconds): which messages a list of `limit`
    /// covers (the newest `limit` dead-lettered messages by this time).
    #[serde(default)]
    pub first_at: u64,
    /// Why, as the broker recorded it (the R1 record's detail).
    pub reason: Option<String>,
    /// The group's last processing error, when the consumer reported one.
    pub last_error: Option<String>,
}

/// The newest `limit` dead letters (one per message and group), of the messages of
/// `partitions` only when given (a group member's share).
pub(crate) fn dead_letters(
    store: &Store,
    now: u64,
    limit: usize,
    partitions: Option<Vec<Partition>>,
) -> Result<Vec<DeadLetter>, StoreError> {
    let found = store.search(&SearchQuery {
        dead_lettered: true,
        limit: Some(limit),
        partitions,
        ..Default::default()
    })?;
    let mut out = Vec::new();
    for s in found {
        if let Some(t) = store.trajectory(&s.key, now)? {
            out.extend(of_trajectory(&s.key, &t).into_iter().map(|d| DeadLetter {
                first_at: s.first_at,
                ..d
            }));
        }
    }
    newest_first(&mut out, limit);
    Ok(out)
}

/// Sorts dead letters newest first and keeps the first `limit`.
fn newest_first(out: &mut Vec<DeadLetter>, limit: usize) {
    out.sort_by(|a, b| (b.at, &b.key).cmp(&(a.at, &a.key)));
    out.truncate(limit);
}

/// Several members' dead letters (each message in one of them) as one listener holding them
/// all would list them: those of the newest `limit` messages by first record time (what its
/// search keeps), newest dead letter first, at most `limit`.
pub(crate) fn merge(mut all: Vec<DeadLetter>, limit: usize) -> Vec<DeadLetter> {
    let mut messages: Vec<(u64, &str)> = all.iter().map(|d| (d.first_at, d.key.as_str())).collect();
    messages.sort_by(|a, b| b.cmp(a));
    messages.dedup();
    messages.truncate(limit);
    let kept: std::collections::BTreeSet<String> =
        messages.into_iter().map(|(_, k)| k.to_owned()).collect();
    all.retain(|d| kept.contains(&d.key));
    newest_first(&mut all, limit);
    all
}

fn is_dead_letter(r: &StageRecord) -> bool {
    r.stage == Stage::Redelivery && r.redelivery_outcome() == Some(RedeliveryOutcome::DeadLetter)
}

/// A trajectory's dead letters: one per dead-lettered group, from its R1 record (or from
/// the group's state alone when the record is not there).
pub(crate) fn of_trajectory(key: &str, t: &Trajectory) -> Vec<DeadLetter> {
    let records: Vec<&StageRecord> = t
        .hops
        .iter()
        .flat_map(|h| h.events.iter())
        .chain(t.other_records.iter())
        .filter(|r| is_dead_letter(r))
        .collect();
    t.groups
        .iter()
        .filter(|g| g.state == MessageState::DeadLettered)
        .map(|g| {
            let r1 = records
                .iter()
                .filter(|r| r.group.as_ref() == Some(&g.group) && r.by_id == g.by_id)
                .max_by_key(|r| r.at);
            DeadLetter {
                key: key.to_owned(),
                message_id: t.message_id,
                request_id: t.request_id.clone(),
                producer: t.producer.clone(),
                topic: t.topic.clone(),
                group: Some(g.group.clone()),
                consumer: r1.and_then(|r| r.consumer.clone()),
                attempt: r1.and_then(|r| r.attempt).or(Some(g.attempts)),
                at: r1.map_or(t.last_at, |r| r.at),
                first_at: t.first_at,
                reason: r1.and_then(|r| r.detail.clone()),
                last_error: g.last_error.clone(),
            }
        })
        .collect()
}
