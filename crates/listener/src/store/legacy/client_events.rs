//! Client events: the records that name no message — N1 (no-match notices) and A1 (channel
//! opened / refused / expired / closed) — kept per client, so that an operator can ask what
//! happened to one producer or consumer (`GET /api/clients/{id}/events`, `msgtrail trace
//! --client <id>`).
//!
//! How the parts meet: [`super::Store::apply`] hands every unkeyed record to [`record`]
//! inside its own write transaction (one call where it counts them); [`record`] keeps a
//! bounded ring per client (the newest [`PER_CLIENT`] events) in the [`EVENTS`] table, keyed
//! by (client, time, fingerprint) so that a redelivered batch stores an event once, with the
//! ring sizes in [`SIZES`]. [`super::Store::client_events`] reads one client's events back,
//! newest first; [`prune`] drops events older than the retention age (called by
//! [`super::Store::enforce_retention`]). The stored form is the record's JSON.

use super::tables::corrupt;
use super::Store;
use crate::error::StoreError;
use msgtrail_core::Stage;
use msgtrail_core::StageRecord;
use redb::{ReadableDatabase, ReadableTable, WriteTransaction};
use std::hash::{Hash, Hasher};

use crate::store::migrate::{EVENTS, EVENT_COUNTS as SIZES};

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
pub(super) fn record(tx: &WriteTransaction, r: &StageRecord) -> Result<bool, StoreError> {
    let Some(client) = client_of(r).filter(|_| is_client_event(r)) else {
        return Ok(false);
    };
    let mut events = tx.open_table(EVENTS)?;
    let mut sizes = tx.open_table(SIZES)?;
    let json = r.to_json();
    let fresh = events
        .insert((client, r.at, fingerprint(r)), json.as_bytes())?
        .is_none();
    if !fresh {
        return Ok(false);
    }
    let mut size = sizes.get(client)?.map(|v| v.value()).unwrap_or(0) + 1;
    while size > PER_CLIENT {
        let oldest = events
            .range((client, 0u64, 0u64)..=(client, u64::MAX, u64::MAX))?
            .next()
            .transpose()?
            .map(|(k, _)| (k.value().1, k.value().2));
        let Some((at, fp)) = oldest else { break };
        events.remove((client, at, fp))?;
        size -= 1;
    }
    sizes.insert(client, size)?;
    Ok(true)
}

/// Drops the client events older than `cutoff` (Unix nanoseconds); returns how many.
pub(super) fn prune(tx: &WriteTransaction, cutoff: u64) -> Result<u64, StoreError> {
    let mut events = tx.open_table(EVENTS)?;
    let mut sizes = tx.open_table(SIZES)?;
    let clients: Vec<String> = sizes
        .iter()?
        .map(|item| item.map(|(k, _)| k.value().to_owned()))
        .collect::<Result<_, _>>()?;
    let mut dropped = 0;
    for client in clients {
        let old: Vec<(u64, u64)> = events
            .range((client.as_str(), 0u64, 0u64)..(client.as_str(), cutoff, 0u64))?
            .map(|item| item.map(|(k, _)| (k.value().1, k.value().2)))
            .collect::<Result<_, _>>()?;
        for (at, fp) in &old {
            events.remove((client.as_str(), *at, *fp))?;
        }
        let n = old.len() as u64;
        dropped += n;
        let left = sizes
            .get(client.as_str())?
            .map(|v| v.value())
            .unwrap_or(0)
            .saturating_sub(n);
        if left == 0 {
            sizes.remove(client.as_str())?;
        } else {
            sizes.insert(client.as_str(), left)?;
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
        let tx = self.db()?.begin_read()?;
        let events = match tx.open_table(EVENTS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut out = Vec::new();
        for item in events
            .range((client, 0u64, 0u64)..=(client, u64::MAX, u64::MAX))?
            .rev()
            .take(limit.min(MAX_LIMIT))
        {
            let (_, v) = item?;
            out.push(serde_json::from_slice(v.value()).map_err(corrupt)?);
        }
        Ok(out)
    }
}
