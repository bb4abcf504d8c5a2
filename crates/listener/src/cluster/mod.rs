//! A group of listeners sharing the stage partitions (`--group`): membership on a KV
//! bucket with a time to live, ownership by rendezvous hashing, one durable consumer per
//! (listener, partition), and an HTTP layer that lets any member answer for all
//! (docs/ARCHITECTURE.md, decision 12).
//!
//! How the parts meet: [`run`] is one task that beats ([`membership`]), reads the live
//! members, computes the partitions this member holds ([`assignment`]) and starts or stops
//! one [`partition_ingest`] worker per held partition (the primary's exports); it publishes
//! what it knows in a [`ClusterView`], which [`fanout`] reads to route lookups to an owner
//! and to merge searches over every member; [`merged`] asks one owner of each partition
//! for its share of the statistics and the views and merges them. Store evidence in a group
//! ([`evidence`]) reads the same view: each member applies the evidence of the partitions it
//! holds, and replays the message stream's evidence for a partition it takes over.

mod assignment;
pub(crate) mod evidence;
pub(crate) mod export_marks;
mod fanout;
mod membership;
mod merged;
mod partition_ingest;

pub use membership::{HeldPartition, MemberInfo, HEARTBEAT, MEMBER_BUCKET, MEMBER_TTL};

pub use evidence::COVERAGE_FILE as EVIDENCE_COVERAGE_FILE;
pub use export_marks::{EXPORT_MARKS_STREAM, EXPORT_MARKS_SUBJECT_PREFIX};
pub use fanout::{LOCAL_HEADER, PARTIAL_HEADER};
pub use merged::MISSING_PARTITIONS_HEADER;

pub(crate) use assignment::Role;
pub(crate) use fanout::layer;

use crate::error::ListenerError;
use crate::export::ExportSender;
use msgtrail_core::partition::{Partition, PARTITIONS};
use msgtrail_core::sync::Recover;
use partition_ingest::PartitionIngest;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How long a partition remembers the messages it applied, for a new primary to offer
/// their trajectories to the export again ([`export_marks`]): longer than a dead member's
/// heartbeat lives plus the export's grace and queue.
pub(crate) const RECENT_WINDOW: std::time::Duration = std::time::Duration::from_secs(30);
/// Most messages a partition remembers for [`RECENT_WINDOW`].
const RECENT_MAX: usize = 50_000;

/// Most owners a partition can be given.
pub const MAX_COPIES: usize = 5;

/// A listener's membership of a group (`--group`, `--instance-name`, `--copies`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupConfig {
    /// The group's name: listeners with the same name share the partitions.
    pub name: String,
    /// This listener's name in the group (unique among its members).
    pub instance: String,
    /// Owners of each partition (2 survives one listener's death with no gap).
    pub copies: usize,
    /// The base URL the others reach this listener's API at; `None`: `http://<bound address>`.
    pub advertise_url: Option<String>,
}

impl GroupConfig {
    /// `<group>-<instance>`: the base of this member's consumer names (its partitions'
    /// `<base>-pNN`, its store evidence's `<base>-stored` and `<base>-stored-replay`).
    pub fn durable_base(&self) -> String {
        format!("{}-{}", self.name, self.instance)
    }

    /// Checks the names (they become consumer names and KV keys) and the copies.
    pub fn validate(&self) -> Result<(), crate::ConfigError> {
        let bad =
            |field: &'static str, why: &str| Err(crate::ConfigError::field("listener", field, why));
        let name_ok = |s: &str| {
            !s.is_empty()
                && s.len() <= 64
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        };
        if !name_ok(&self.name) {
            return bad("group", "must be 1-64 characters of A-Z a-z 0-9 _ -");
        }
        if !name_ok(&self.instance) {
            return bad(
                "instance_name",
                "must be 1-64 characters of A-Z a-z 0-9 _ -",
            );
        }
        if self.copies == 0 || self.copies > MAX_COPIES {
            return bad("copies", "must be 1 to 5");
        }
        Ok(())
    }
}

/// Members picked to answer for partitions: (name, API URL) → the partitions each answers
/// for ([`ClusterView::pick_owners`]).
pub(crate) type Picked = BTreeMap<(String, String), Vec<Partition>>;

/// What a member knows of its group, shared by the coordinator, the partition workers and
/// the HTTP fan-out.
#[derive(Debug)]
pub(crate) struct ClusterView {
    me: String,
    copies: usize,
    /// Members and held partitions. Poison is recovered ([`Recover`]): writers replace the
    /// member map and adjust the held map with map operations only, so a panicking holder
    /// leaves a view the next heartbeat round corrects.
    inner: RwLock<ViewState>,
    /// Per partition, the messages applied in the last [`RECENT_WINDOW`] (Unix nanoseconds
    /// of the apply), for a new primary's handover.
    recent: Vec<std::sync::Mutex<std::collections::VecDeque<(u64, msgtrail_core::MessageId)>>>,
}

#[derive(Debug, Default)]
struct ViewState {
    /// The live members (this one included once it has beaten).
    members: BTreeMap<String, MemberInfo>,
    /// Held partitions: role, and messages still pending in the partition's consumer
    /// (`None` until first polled).
    held: BTreeMap<Partition, (Role, Option<u64>)>,
    /// Whether the coordinator has made its first assignment (`held` is meaningful).
    assigned: bool,
    /// Held partitions whose store evidence is still being replayed ([`evidence`]): not
    /// ready until it is done.
    evidence_pending: [bool; PARTITIONS as usize],
    /// Since when (Unix nanoseconds) this member is each partition's primary.
    primary_since: [Option<u64>; PARTITIONS as usize],
}

/// The role this member holds each partition in (`None`: not held), by partition index.
pub(crate) type Roles = [Option<Role>; PARTITIONS as usize];

impl ClusterView {
    fn new(me: &str, copies: usize) -> Self {
        ClusterView {
            me: me.to_owned(),
            copies,
            inner: RwLock::new(ViewState::default()),
            recent: (0..PARTITIONS)
                .map(|_| std::sync::Mutex::new(std::collections::VecDeque::new()))
                .collect(),
        }
    }

    /// Since when this member is `p`'s primary (Unix nanoseconds); `None` when it is not.
    pub(crate) fn primary_since(&self, p: Partition) -> Option<u64> {
        self.inner.read().recover().primary_since[usize::from(p.index())]
    }

    /// Notes messages `p` applied at `now`, forgetting those older than [`RECENT_WINDOW`].
    pub(crate) fn applied(
        &self,
        p: Partition,
        ids: impl IntoIterator<Item = msgtrail_core::MessageId>,
        now: u64,
    ) {
        let mut q = self.recent[usize::from(p.index())].lock().recover();
        for id in ids {
            if q.back().is_none_or(|(_, last)| *last != id) {
                q.push_back((now, id));
            }
        }
        let oldest = now.saturating_sub(RECENT_WINDOW.as_nanos() as u64);
        while q.front().is_some_and(|(at, _)| *at < oldest) || q.len() > RECENT_MAX {
            q.pop_front();
        }
    }

    /// The distinct messages `p` applied in the last [`RECENT_WINDOW`].
    pub(crate) fn recently_applied(&self, p: Partition) -> Vec<msgtrail_core::MessageId> {
        let q = self.recent[usize::from(p.index())].lock().recover();
        let mut ids: Vec<msgtrail_core::MessageId> = q.iter().map(|(_, id)| *id).collect();
        ids.sort();
        ids.dedup();
        ids
    }

    /// This member's name.
    pub(crate) fn me(&self) -> &str {
        &self.me
    }

    /// Notes a held partition's pending count; returns whether it was ready before.
    pub(crate) fn partition_progress(&self, p: Partition, pending: u64) -> bool {
        let mut s = self.inner.write().recover();
        match s.held.get_mut(&p) {
            Some((_, seen)) => {
                let was = *seen == Some(0);
                // Once caught up it stays ready: a backlog under load is not a rebuild.
                if !was {
                    *seen = Some(pending);
                }
                was
            }
            None => false,
        }
    }

    /// The partitions held, with role and readiness, for the heartbeat and `/metrics`. A
    /// partition is ready once its stage subject is caught up and its store evidence
    /// replayed.
    pub(crate) fn held(&self) -> Vec<HeldPartition> {
        let s = self.inner.read().recover();
        s.held
            .iter()
            .map(|(p, (r, pending))| {
                let evidence_done = !s.evidence_pending[usize::from(p.index())];
                HeldPartition::new(*p, *r, *pending == Some(0) && evidence_done)
            })
            .collect()
    }

    /// The role this member holds each partition in now; `None` before the first
    /// assignment.
    pub(crate) fn roles(&self) -> Option<Roles> {
        let s = self.inner.read().recover();
        if !s.assigned {
            return None;
        }
        let mut roles = [None; PARTITIONS as usize];
        for (p, (r, _)) in &s.held {
            roles[usize::from(p.index())] = Some(*r);
        }
        Some(roles)
    }

    /// Marks the partitions whose store evidence is being replayed (`true`), so that they
    /// are not announced ready until it is done.
    pub(crate) fn set_evidence_pending(&self, pending: [bool; PARTITIONS as usize]) {
        self.inner.write().recover().evidence_pending = pending;
    }

    /// Messages still to replay in partitions being rebuilt (for `/metrics`).
    pub(crate) fn rebuild_pending(&self) -> u64 {
        let s = self.inner.read().recover();
        s.held
            .values()
            .filter(|(_, p)| *p != Some(0))
            .map(|(_, p)| p.unwrap_or(0))
            .sum()
    }

    /// The live members' URLs in the order to ask them for `p`: its owners, ready ones
    /// first, primary first; then nobody else (an ID of `p` is only stored by its owners).
    pub(crate) fn owners_of(&self, p: Partition) -> Vec<(String, String)> {
        let s = self.inner.read().recover();
        let owners = assignment::owners(p, s.members.keys().map(String::as_str), self.copies);
        let ready = |name: &str| {
            s.members
                .get(name)
                .is_some_and(|m| m.partitions.iter().any(|h| h.partition == p && h.ready))
        };
        let mut out: Vec<(bool, String, String)> = owners
            .iter()
            .filter_map(|n| {
                s.members
                    .get(*n)
                    .map(|m| (!ready(n), n.to_string(), m.url.clone()))
            })
            .collect();
        out.sort_by_key(|(not_ready, _, _)| *not_ready);
        out.into_iter().map(|(_, n, u)| (n, u)).collect()
    }

    /// One live owner of each of `partitions` to ask for its share of a merged answer,
    /// skipping the members in `skip` (they failed to answer): a ready owner when there is
    /// one, and among equals this member first, then a member already picked (fewer
    /// requests). Returns the picked members ((name, URL) → their partitions) and the
    /// partitions no live owner is left for.
    pub(crate) fn pick_owners(
        &self,
        partitions: &[Partition],
        skip: &[String],
    ) -> (Picked, Vec<Partition>) {
        let s = self.inner.read().recover();
        let mut picked = Picked::new();
        let mut unowned = Vec::new();
        for &p in partitions {
            let owners = assignment::owners(p, s.members.keys().map(String::as_str), self.copies);
            let best = owners
                .iter()
                .filter(|n| !skip.iter().any(|x| x == *n))
                .filter_map(|n| s.members.get(*n).map(|m| (*n, m)))
                .min_by_key(|(n, m)| {
                    let ready = m.partitions.iter().any(|h| h.partition == p && h.ready);
                    let asked = picked.keys().any(|(k, _)| k == n);
                    (!ready, *n != self.me, !asked)
                });
            match best {
                Some((n, m)) => picked
                    .entry((n.to_owned(), m.url.clone()))
                    .or_default()
                    .push(p),
                None => unowned.push(p),
            }
        }
        (picked, unowned)
    }

    /// Members that together hold every partition (one owner each, ready ones preferred),
    /// this one first when it is among them: the targets of a merged search.
    pub(crate) fn cover(&self) -> Vec<(String, String)> {
        let mut picked: Vec<(String, String)> = Vec::new();
        for p in Partition::all() {
            let owners = self.owners_of(p);
            if owners.iter().any(|o| picked.contains(o)) {
                continue;
            }
            if let Some(o) = owners
                .iter()
                .find(|(n, _)| *n == self.me)
                .or(owners.first())
            {
                picked.push(o.clone());
            }
        }
        picked.sort_by_key(|(n, _)| *n != self.me);
        picked
    }
}

/// Everything the coordinator needs.
#[derive(Debug)]
pub(crate) struct Coordinator {
    /// The group.
    pub group: GroupConfig,
    /// This member's API base URL.
    pub url: String,
    /// What each partition worker needs.
    pub ingest: PartitionIngestDeps,
    /// The trace export, handed to the primary's workers.
    pub exporter: Option<ExportSender>,
}

/// The parts of a partition worker that do not depend on the partition.
#[derive(Debug, Clone)]
pub(crate) struct PartitionIngestDeps {
    /// JetStream.
    pub js: async_nats::jetstream::Context,
    /// Replicas of the stage stream and the membership bucket, as configured.
    pub replicas: Option<usize>,
    /// Most messages and bytes per store transaction.
    pub limits: crate::batch_limits::BatchLimits,
    /// The consumers' ack wait.
    pub ack_wait: std::time::Duration,
    /// The store.
    pub store: Arc<crate::store::Store>,
    /// The statistics.
    pub stats: Arc<crate::stats::Stats>,
}

/// Joins the group: creates the membership bucket and the stage stream (as a reader) and
/// returns the view and the coordinator's task.
pub(crate) async fn start(
    c: Coordinator,
    stop: CancellationToken,
) -> Result<
    (
        Arc<ClusterView>,
        impl std::future::Future<Output = Result<(), ListenerError>>,
    ),
    ListenerError,
> {
    let js = &c.ingest.js;
    let membership =
        membership::Membership::join(js, &c.group.name, &c.group.instance, c.ingest.replicas)
            .await?;
    let desired = msgtrail_nats::topology::stage_stream(
        c.ingest.replicas.unwrap_or(1),
        msgtrail_nats::topology::DEFAULT_STAGE_MAX_AGE,
    );
    let stream = msgtrail_nats::topology::ensure_stream(
        js,
        &desired,
        msgtrail_nats::topology::Policy::reader(c.ingest.replicas),
    )
    .await
    .map_err(|e| ListenerError::nats("stage stream", e))?;
    let view = Arc::new(ClusterView::new(&c.group.instance, c.group.copies));
    // With export on, the primaries' exports are marked and a takeover reads the marks.
    let marks = match &c.exporter {
        Some(x) => {
            let (gate, writer) = export_marks::ExportGate::start(
                js,
                &c.group.name,
                c.ingest.replicas,
                view.clone(),
                stop.clone(),
            )
            .await?;
            x.gate(gate);
            Some(writer)
        }
        None => None,
    };
    let worker = PartitionIngest {
        stream,
        durable_base: c.group.durable_base(),
        limits: c.ingest.limits,
        ack_wait: c.ingest.ack_wait,
        store: c.ingest.store.clone(),
        stats: c.ingest.stats.clone(),
        view: view.clone(),
    };
    let coordinator = run(c, membership, worker, view.clone(), stop);
    let task = async move {
        match marks {
            Some(writer) => futures::future::try_join(coordinator, writer)
                .await
                .map(|_| ()),
            None => coordinator.await,
        }
    };
    Ok((view, task))
}

/// The coordinator: beat, read the members, hold what the assignment says, until `stop`.
async fn run(
    c: Coordinator,
    membership: membership::Membership,
    worker: PartitionIngest,
    view: Arc<ClusterView>,
    stop: CancellationToken,
) -> Result<(), ListenerError> {
    let me = c.group.instance.clone();
    let mut workers: HashMap<Partition, (Role, CancellationToken)> = HashMap::new();
    let mut tasks: JoinSet<Result<(), ListenerError>> = JoinSet::new();
    let mut tick = tokio::time::interval(HEARTBEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Wait a couple of beats before the first assignment, so that listeners started together
    // see each other before anyone takes every partition.
    let mut beats = 0u32;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
            Some(r) = tasks.join_next(), if !tasks.is_empty() => {
                if let Ok(Err(e)) = r {
                    tracing::warn!(error = %msgtrail_core::ErrorChain(&e), "partition worker ended");
                }
                continue;
            }
        }
        beats += 1;
        let info = MemberInfo {
            name: me.clone(),
            url: c.url.clone(),
            partitions: view.held(),
        };
        if let Err(e) = membership.beat(&info).await {
            tracing::warn!(error = %msgtrail_core::ErrorChain(&e), "heartbeat failed");
            continue;
        }
        let mut members = match membership.members().await {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %msgtrail_core::ErrorChain(&e), "reading the members failed");
                continue;
            }
        };
        members.insert(me.clone(), info);
        let want: BTreeMap<Partition, Role> = if beats >= 2 {
            assignment::held(&me, members.keys().map(String::as_str), c.group.copies)
                .into_iter()
                .collect()
        } else {
            BTreeMap::new()
        };
        // Stop what is no longer held (or held in another role: restarted below).
        workers.retain(|p, (role, token)| {
            let keep = want.get(p) == Some(role);
            if !keep {
                token.cancel();
            }
            keep
        });
        let mut changed = false;
        {
            let mut s = view.inner.write().recover();
            s.members = members;
            s.assigned |= beats >= 2;
            s.held.retain(|p, _| want.contains_key(p));
            for (p, role) in &want {
                let e = s.held.entry(*p).or_insert((*role, None));
                e.0 = *role;
            }
            let now = msgtrail_core::time::now_nanos();
            for p in Partition::all() {
                let i = usize::from(p.index());
                s.primary_since[i] = match want.get(&p) {
                    Some(Role::Primary) => Some(s.primary_since[i].unwrap_or(now)),
                    _ => None,
                };
            }
        }
        for (p, role) in want {
            if workers.contains_key(&p) {
                continue;
            }
            changed = true;
            let token = stop.child_token();
            let exporter = (role == Role::Primary)
                .then(|| c.exporter.clone())
                .flatten();
            tasks.spawn(worker.clone().run(p, exporter, token.clone()));
            workers.insert(p, (role, token));
        }
        if changed {
            let mut held: Vec<String> = workers
                .iter()
                .map(|(p, (r, _))| format!("{p}{}", if *r == Role::Primary { "*" } else { "" }))
                .collect();
            held.sort();
            tracing::info!(members = view.inner.read().recover().members.len(), held = %held.join(","), "partitions assigned (* primary)");
        }
    }
    membership.leave().await;
    while tasks.join_next().await.is_some() {}
    Ok(())
}
