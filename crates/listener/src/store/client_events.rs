//! Client events: the records that name no message — N1 (no-match notices) and A1 (channel
//! opened / refused / expired / closed) — kept per client, so that an operator can ask what
//! happened to one producer or consumer (`GET /api/clients/{id}/events`, `msgtrail trace
//! --client <id>`).
//!
//! How the parts meet: [`super::Store::apply`] hands every unkeyed record to [`record`]
//! inside its own write (one call where it counts them) — a write transaction whenever the
//! batch holds a client event, since the ring reads back what it wrote; [`record`] keeps a
//! bounded ring per client (the newest [`PER_CLIENT`] events) in the `client_events` keyspace,
//! keyed by (client, time, fingerprint) so that a redelivered batch stores an event once, with
//! the ring sizes in `client_event_counts`. [`super::Store::client_events`] reads one client's events back,
//! newest first; [`prune`] drops events older than the retention age (called by
//! [`super::Store::enforce_retention`]). The stored form is the record's JSON.

use super::tables::{corrupt, counter_value, keys, Tables};
use super::Store;
use crate::error::StoreError;
use fjall::Readable;
use msgtrail_core::Stage;
use msgtrail_core::StageRecord;
use std::hash::{Hash, Hasher};

/// The most events kept per client: older ones make room for new ones.
pub(crate) const PER_CLIENT: u64 = 512;

/// The most events one query returns.
pub(crate) const MAX_LIMIT: usize = 512;

/// Whether a record is a client event (N1 or A1).
pub(crate) fn is_client_event(r: &StageRecord) -> bool {
    matches!(r.stage, Stage::NoMatch | Stage::Channel)
}

/// The client a client event is about: the consumer, else the producer.
fn client_of(r: &StageRecord) -> Option<&str> {
    r.consumer
        .as_ref()
        .or(r.producer.as_ref())
        .map(|c| c.as_str())
}

/// A fingerprint of the record, so that the same record applied twice is stored once.
fn fingerprint(r: &StageRecord) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    r.dedup_key().hash(&mut h);
    r.outcome.hash(&mut h);
    r.detail.hash(&mut h);
    r.topic.hash(&mut h);
    h.finish()
}

/// Keeps `r` in its client's ring if it is a client event naming a client; returns whether
/// it was new. The oldest event of a full ring goes.
pub(super) fn record(t: &mut Tables<'_>, r: &StageRecord) -> Result<bool, StoreError> {
    let Some(client) = client_of(r).filter(|_| is_client_event(r)) else {
        return Ok(false);
    };
    let ks = t.ks;
    let key = keys::event(client, r.at, fingerprint(r));
    // The ring reads back what this write added: a batch with client events is applied in
    // a transaction (`Store::apply`).
    let tx = t
        .tx()
        .expect("client events are recorded in a write transaction");
    if tx.contains_key(&ks.events, &key)? {
        return Ok(false);
    }
    tx.insert(&ks.events, key, r.to_json().into_bytes());
    let mut size = match tx.get(&ks.event_counts, client)? {
        Some(v) => counter_value(&v)?,
        None => 0,
    } + 1;
    while size > PER_CLIENT {
        let oldest = tx.prefix(&ks.events, keys::event_prefix(client)).next();
        let Some(oldest) = oldest else { break };
        let k = oldest.key()?;
        tx.remove(&ks.events, k);
        size -= 1;
    }
    tx.insert(&ks.event_counts, client, size.to_be_bytes().as_slice());
    Ok(true)
}

/// Drops the client events older than `cutoff` (Unix nanoseconds); returns how many.
pub(super) fn prune(t: &mut Tables<'_>, cutoff: u64) -> Result<u64, StoreError> {
    let ks = t.ks;
    let tx = t
        .tx()
        .expect("client events are pruned in a write transaction");
    let mut clients = Vec::new();
    for item in tx.iter(&ks.event_counts) {
        let (k, v) = item.into_inner()?;
        let name = String::from_utf8(k.to_vec()).map_err(corrupt)?;
        clients.push((name, counter_value(&v)?));
    }
    let mut dropped = 0;
    for (client, size) in clients {
        let old: Vec<_> = tx
            .range(
                &ks.events,
                keys::event(&client, 0, 0)..keys::event(&client, cutoff, 0),
            )
            .map(|g| g.key())
            .collect::<Result<_, _>>()?;
        let n = old.len() as u64;
        for k in old {
            tx.remove(&ks.events, k);
        }
        dropped += n;
        let left = size.saturating_sub(n);
        if left == 0 {
            tx.remove(&ks.event_counts, client.as_str());
        } else if n > 0 {
            tx.insert(
                &ks.event_counts,
                client.as_str(),
                left.to_be_bytes().as_slice(),
            );
        }
    }
    Ok(dropped)
}

impl Store {
    /// The client events (N1, A1) of `client`, newest first, at most `limit` (capped at
    /// `MAX_LIMIT`).
    pub fn client_events(
        &self,
        client: &str,
        limit: usize,
    ) -> Result<Vec<StageRecord>, StoreError> {
        let db = self.db()?;
        let snap = db.db.read_tx();
        let mut out = Vec::new();
        for item in snap
            .prefix(&db.ks.events, keys::event_prefix(client))
            .rev()
            .take(limit.min(MAX_LIMIT))
        {
            let v = item.value()?;
            out.push(serde_json::from_slice(&v).map_err(corrupt)?);
        }
        Ok(out)
    }
}
