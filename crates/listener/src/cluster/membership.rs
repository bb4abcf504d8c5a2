//! Membership of a listener group, on a JetStream key-value bucket with a time to live: each
//! member puts a heartbeat `<group>.<instance>` every [`HEARTBEAT`] (its HTTP address and the
//! partitions it holds); an entry not refreshed within [`MEMBER_TTL`] expires, and with it
//! the member. Every member lists the group's keys on the same beat, so all of them see the
//! same live set within a beat or two and compute the same assignment
//! ([`super::assignment`]). No election, no leader: the bucket is the only shared state, and
//! JetStream (replicated with the stage stream's replicas) keeps it.

use super::assignment::Role;
use crate::error::ListenerError;
use async_nats::jetstream::{self, kv};
use futures::TryStreamExt;
use msgtrail_core::partition::Partition;
use msgtrail_nats::topology::{self, Policy};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// The bucket of listener heartbeats, shared by every group (keys are `<group>.<instance>`).
pub const MEMBER_BUCKET: &str = "msgtrail_listeners";
/// How often a member puts its heartbeat and reads the others'.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long a heartbeat lives: a member silent this long (killed, cut off) is gone, and its
/// partitions move. Five beats: a busy machine's late beat does not evict a live member.
pub const MEMBER_TTL: Duration = Duration::from_secs(5);

/// What a member says of itself in its heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    /// The member's instance name (unique in its group).
    pub name: String,
    /// Its HTTP API's base URL, `http://host:port` (the fan-out's target).
    pub url: String,
    /// The partitions it holds and serves, with its role in each.
    #[serde(default)]
    pub partitions: Vec<HeldPartition>,
}

/// A partition a member holds, as its heartbeat says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldPartition {
    /// The partition.
    pub partition: Partition,
    /// Whether the member is its primary (the exporter).
    pub primary: bool,
    /// Whether the member has caught up with the partition's stage subject (a new owner
    /// rebuilding it is not ready).
    pub ready: bool,
}

impl HeldPartition {
    /// A held partition in `role`.
    pub(crate) fn new(partition: Partition, role: Role, ready: bool) -> Self {
        HeldPartition {
            partition,
            primary: role == Role::Primary,
            ready,
        }
    }
}

/// The group's bucket and this member's key in it.
#[derive(Debug, Clone)]
pub(crate) struct Membership {
    kv: kv::Store,
    group: String,
    me: String,
}

impl Membership {
    /// Gets (or creates) the bucket; `replicas` as the stage stream's.
    pub(crate) async fn join(
        js: &jetstream::Context,
        group: &str,
        me: &str,
        replicas: Option<usize>,
    ) -> Result<Self, ListenerError> {
        let config = topology::bucket(MEMBER_BUCKET, replicas.unwrap_or(1), MEMBER_TTL);
        let kv = topology::ensure_bucket(
            js,
            &config,
            Policy::owner_of_ephemeral(replicas.unwrap_or(1)),
        )
        .await
        .map_err(|e| ListenerError::nats(format!("membership bucket {MEMBER_BUCKET}"), e))?;
        Ok(Membership {
            kv,
            group: group.to_owned(),
            me: me.to_owned(),
        })
    }

    /// Puts this member's heartbeat.
    pub(crate) async fn beat(&self, info: &MemberInfo) -> Result<(), ListenerError> {
        let body = serde_json::to_vec(info).expect("a member's heartbeat serializes");
        self.kv
            .put(self.key(&self.me), body.into())
            .await
            .map_err(|e| ListenerError::nats("membership heartbeat", e))?;
        Ok(())
    }

    /// Removes this member's heartbeat (a clean shutdown: the others take over at once
    /// instead of after the time to live).
    pub(crate) async fn leave(&self) {
        if let Err(e) = self.kv.purge(self.key(&self.me)).await {
            tracing::debug!(error = %e, "leaving the group failed; the heartbeat expires");
        }
    }

    /// The live members of the group, by name.
    pub(crate) async fn members(&self) -> Result<BTreeMap<String, MemberInfo>, ListenerError> {
        let prefix = format!("{}.", self.group);
        let keys: Vec<String> = self
            .kv
            .keys()
            .await
            .map_err(|e| ListenerError::nats("membership keys", e))?
            .try_collect()
            .await
            .map_err(|e| ListenerError::nats("membership keys", e))?;
        let mut out = BTreeMap::new();
        for key in keys.into_iter().filter(|k| k.starts_with(&prefix)) {
            let Some(body) = self
                .kv
                .get(&key)
                .await
                .map_err(|e| ListenerError::nats("membership entry", e))?
            else {
                continue;
            };
            match serde_json::from_slice::<MemberInfo>(&body) {
                Ok(info) => {
                    out.insert(info.name.clone(), info);
                }
                Err(e) => tracing::warn!(%key, error = %e, "unreadable heartbeat ignored"),
            }
        }
        Ok(out)
    }

    fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.group)
    }
}
