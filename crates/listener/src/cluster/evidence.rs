//! Store evidence in a listener group (docs/ARCHITECTURE.md, decision 12): each member reads
//! the message stream through a consumer of its own and keeps the recovered P2/P3 of the
//! messages whose partition it holds (primary or copy), so that a message's evidence lives
//! exactly where its stage records do.
//!
//! ## How the parts meet
//! - The **live** consumer `<group>-<instance>-stored` ([`crate::evidence::consumer_name`] of
//!   the member's durable base) reads every stored message's headers, as a single listener's
//!   does, and applies the evidence of the partitions the member holds when the chunk is
//!   applied ([`crate::evidence::Scope::Held`]); the others' messages are only acked. It
//!   starts reading once the coordinator has made its first assignment, so that a restarted
//!   member does not ack away the messages of the partitions it is about to hold again.
//! - A member that **takes over** a partition has skipped that partition's older messages:
//!   its **replay** consumer `<group>-<instance>-stored-replay` reads the message stream
//!   from its first message up to its last one at the time the replay began, applying the
//!   evidence of the partitions taken over only, then is deleted. Later messages are the live
//!   consumer's: a message stored after the replay read the stream's last sequence is
//!   applied by the live consumer after the member already held its partition. Partitions
//!   taken over while a replay runs wait for the next one (one replay at a time, each one
//!   headers-only pass over the stream). Until its replay is done, a partition is not
//!   announced ready, so the fan-out asks a ready copy first.
//! - [`Coverage`] is what the member knows: the partitions whose evidence its store holds up
//!   to the live consumer's position, kept in the file `evidence-partitions` of the data
//!   directory (written before a released partition's messages are skipped, and when a replay
//!   ends). A restarted member replays only the partitions it holds and had not covered; a
//!   member whose live consumer is new (it starts at the stream's first message) covers what
//!   it holds without a replay.
//! - [`ReplayInProgress`] (the file `evidence-replay`) names the replay under way: a member
//!   restarted mid-replay whose replay consumer JetStream still keeps, and whose replay's
//!   partitions it still wants, resumes that replay after the consumer's ack floor, up to the
//!   same last sequence, instead of reading the stream from its first message again.

use super::{ClusterView, Roles};
use crate::error::ListenerError;
use crate::evidence::{self, EvidenceSource, Mask, Scope, Sinks};
use msgtrail_core::partition::{Partition, PARTITIONS};
use msgtrail_core::subjects::MESSAGE_STREAM;
use msgtrail_core::sync::Recover;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The file of the data directory that lists the covered partitions (comma-separated
/// partition numbers).
pub const COVERAGE_FILE: &str = "evidence-partitions";

/// The file, in the data directory, naming the replay under way (`<partitions> until
/// <sequence>`), so that a member restarted mid-replay resumes it ([`ReplayInProgress`]).
pub(crate) const REPLAY_FILE: &str = "evidence-replay";

/// A replay under way, as [`REPLAY_FILE`] records it: its partitions and the message
/// stream's last sequence when it began. A member that died during it finds it on restart;
/// when its replay consumer is still there (JetStream keeps it for `REPLAY_INACTIVE`), the
/// replay resumes after that consumer's ack floor (what it applied was acked after its
/// commit) instead of reading the stream from its first message again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReplayInProgress {
    /// The partitions replayed.
    pub(crate) only: Mask,
    /// The last sequence the replay reads.
    pub(crate) until: u64,
}

impl ReplayInProgress {
    /// The replay recorded at `path`, if any (an unreadable file is none: start over).
    pub(crate) fn load(path: &std::path::Path) -> Option<Self> {
        let text = std::fs::read_to_string(path).ok()?;
        let (parts, until) = text.trim().split_once(" until ")?;
        let mut only = [false; PARTITIONS as usize];
        for p in parts
            .split(',')
            .filter_map(|t| t.trim().parse::<u16>().ok())
            .filter_map(Partition::new)
        {
            only[usize::from(p.index())] = true;
        }
        Some(ReplayInProgress {
            only,
            until: until.trim().parse().ok()?,
        })
    }

    /// Records this replay at `path` (written before the replay reads anything).
    pub(crate) fn save(&self, path: &std::path::Path) {
        let tmp = path.with_extension("tmp");
        let text = format!("{} until {}\n", list(&self.only), self.until);
        if let Err(e) = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path)) {
            tracing::warn!(path = %path.display(), error = %e, "store-evidence replay not recorded; a restart mid-replay starts it over");
        }
    }

    /// Forgets the replay at `path` (it ended).
    pub(crate) fn clear(path: &std::path::Path) {
        let _ = std::fs::remove_file(path);
    }
}

/// Suffix of the replay consumer's name, after the live consumer's.
pub(crate) const REPLAY_SUFFIX: &str = "-replay";

/// How often the member looks for partitions to replay.
const TAKEOVER_CHECK: Duration = Duration::from_secs(1);

/// A replay consumer nobody reads for this long is removed by JetStream (a member that died
/// during a replay replays again when it comes back: the partitions were not covered).
const REPLAY_INACTIVE: Duration = Duration::from_secs(300);

/// The name of a member's replay consumer, whose live consumer is `live`.
pub(crate) fn replay_name(live: &str) -> String {
    format!("{live}{REPLAY_SUFFIX}")
}

/// The partitions whose store evidence this member's store holds up to its live consumer's
/// position, and the held partitions still to replay (announced to the view).
#[derive(Debug)]
pub(crate) struct Coverage {
    view: Arc<ClusterView>,
    path: PathBuf,
    covered: Mutex<Mask>,
    /// How many times each partition was seen not held (by any reading or check): a replay
    /// covers only the partitions never seen released while it ran, since the live consumer
    /// skipped their messages meanwhile.
    unheld: Mutex<Releases>,
}

/// Per partition, how many times it was seen not held ([`Coverage::releases`]).
pub(crate) type Releases = [u64; PARTITIONS as usize];

impl Coverage {
    /// The coverage the file at `path` records (none when it is missing or unreadable).
    pub(crate) fn load(view: Arc<ClusterView>, path: PathBuf) -> Self {
        let mut covered = [false; PARTITIONS as usize];
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                for p in text
                    .split(|c: char| c == ',' || c.is_whitespace())
                    .filter_map(|t| t.parse::<u16>().ok())
                    .filter_map(Partition::new)
                {
                    covered[usize::from(p.index())] = true;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "store-evidence coverage unreadable; replaying every held partition")
            }
        }
        Coverage {
            view,
            path,
            covered: Mutex::new(covered),
            unheld: Mutex::new([0; PARTITIONS as usize]),
        }
    }

    /// The roles held now, after forgetting the coverage of partitions no longer held (on
    /// disk first: their messages are skipped from now on) and announcing those still to
    /// replay. Before the first assignment: nothing held, and the coverage kept as it is.
    pub(crate) fn note_roles(&self) -> Roles {
        let Some(roles) = self.view.roles() else {
            // No assignment yet: nothing held, nothing forgotten.
            return [None; PARTITIONS as usize];
        };
        for (n, r) in self.unheld.lock().recover().iter_mut().zip(&roles) {
            *n += u64::from(r.is_none());
        }
        let mut covered = self.covered.lock().recover();
        let before = *covered;
        for (c, r) in covered.iter_mut().zip(&roles) {
            *c &= r.is_some();
        }
        if *covered != before {
            self.save(&covered);
        }
        self.view.set_evidence_pending(pending(&roles, &covered));
        roles
    }

    /// Marks `partitions` covered (those still held).
    pub(crate) fn cover(&self, partitions: Mask) {
        let roles = self.note_roles();
        let mut covered = self.covered.lock().recover();
        let before = *covered;
        for i in 0..covered.len() {
            covered[i] |= partitions[i] && roles[i].is_some();
        }
        if *covered != before {
            self.save(&covered);
        }
        self.view.set_evidence_pending(pending(&roles, &covered));
    }

    /// The count of times each partition was seen not held, to give [`Coverage::cover_since`].
    pub(crate) fn releases(&self) -> Releases {
        *self.unheld.lock().recover()
    }

    /// Marks `partitions` covered, those still held and not seen released since `since`
    /// ([`Coverage::releases`] when their replay began): one released and taken back during
    /// a replay has a gap where the live consumer skipped its messages, and is replayed
    /// again.
    pub(crate) fn cover_since(&self, partitions: Mask, since: Releases) {
        let now = self.releases();
        let mut kept = partitions;
        for i in 0..kept.len() {
            kept[i] &= now[i] == since[i];
        }
        self.cover(kept);
    }

    /// The held partitions not covered: those to replay.
    pub(crate) fn to_replay(&self) -> Mask {
        let roles = self.note_roles();
        pending(&roles, &self.covered.lock().recover())
    }

    fn save(&self, covered: &Mask) {
        let list: Vec<String> = (0..PARTITIONS)
            .filter(|i| covered[usize::from(*i)])
            .map(|i| i.to_string())
            .collect();
        let tmp = self.path.with_extension("tmp");
        let result = std::fs::write(&tmp, format!("{}\n", list.join(",")))
            .and_then(|()| std::fs::rename(&tmp, &self.path));
        if let Err(e) = result {
            tracing::warn!(path = %self.path.display(), error = %e, "store-evidence coverage not saved");
        }
    }
}

/// Held and not covered.
fn pending(roles: &Roles, covered: &Mask) -> Mask {
    let mut out = [false; PARTITIONS as usize];
    for i in 0..out.len() {
        out[i] = roles[i].is_some() && !covered[i];
    }
    out
}

/// Whether JetStream says the message stream does not exist.
fn stream_not_found(e: &async_nats::jetstream::context::GetStreamError) -> bool {
    use async_nats::jetstream::context::GetStreamErrorKind;
    matches!(e.kind(), GetStreamErrorKind::JetStream(j)
        if j.error_code() == async_nats::jetstream::ErrorCode::STREAM_NOT_FOUND)
}

/// The partitions of a mask, for the log.
fn list(mask: &Mask) -> String {
    (0..PARTITIONS)
        .filter(|i| mask[usize::from(*i)])
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Everything a member's store evidence needs.
#[derive(Debug, Clone)]
pub(crate) struct GroupEvidence {
    /// The live consumer (its name `<group>-<instance>-stored`) and the reading settings.
    pub source: EvidenceSource,
    /// The group's view.
    pub view: Arc<ClusterView>,
    /// The data directory (where the coverage file lives).
    pub data_dir: PathBuf,
    /// Where the evidence goes.
    pub sinks: Sinks,
}

/// Runs a member's store evidence until `stop`: the live consumer and the takeover replays.
pub(crate) async fn run(g: GroupEvidence, stop: CancellationToken) -> Result<(), ListenerError> {
    // Nothing is read before the first assignment: until then every message would be skipped.
    while g.view.roles().is_none() {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
    let coverage = Arc::new(Coverage::load(
        g.view.clone(),
        g.data_dir.join(COVERAGE_FILE),
    ));
    let (live_ready, ready) = tokio::sync::watch::channel(false);
    tokio::join!(
        live(&g, coverage.clone(), live_ready, &stop),
        takeovers(&g, coverage, ready, &stop)
    );
    Ok(())
}

/// The live consumer, until `stop`; `ready` turns true once it is set up (a new consumer's
/// coverage noted).
async fn live(
    g: &GroupEvidence,
    coverage: Arc<Coverage>,
    ready: tokio::sync::watch::Sender<bool>,
    stop: &CancellationToken,
) {
    loop {
        let Some(mut consumer) = evidence::wait_for_consumer(&g.source, stop).await else {
            return;
        };
        match consumer.info().await {
            // A consumer that delivered nothing starts at the stream's first message: it
            // reads every held partition's evidence itself.
            Ok(info) if info.delivered.stream_sequence == 0 => coverage.cover(evidence::ALL),
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "store-evidence consumer info unavailable"),
        }
        ready.send_replace(true);
        tracing::info!(stream = MESSAGE_STREAM, consumer = %g.source.name, "reading the held partitions' store evidence from the message stream");
        match evidence::read(
            &g.source,
            consumer,
            Scope::Held(coverage.clone()),
            &g.sinks,
            stop,
        )
        .await
        {
            evidence::Ended::Stopped => return,
            evidence::Ended::Lost(why) => evidence::log_lost(why),
            evidence::Ended::Reached(_) => {}
        }
    }
}

/// Replays the held partitions not covered, one replay at a time, until `stop`.
async fn takeovers(
    g: &GroupEvidence,
    coverage: Arc<Coverage>,
    live_ready: tokio::sync::watch::Receiver<bool>,
    stop: &CancellationToken,
) {
    let replay = replay_name(&g.source.name);
    let mut refused = 0u64;
    let mut tick = tokio::time::interval(TAKEOVER_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let wanted = coverage.to_replay();
        if !wanted.contains(&true) {
            continue;
        }
        let since = coverage.releases();
        let stream = match g.source.js.get_stream(MESSAGE_STREAM).await {
            Ok(s) => s,
            Err(e) if stream_not_found(&e) => {
                // No message stream: no older evidence. Whatever is stored from now on is
                // stored while the partitions are held, and read by the live consumer.
                coverage.cover_since(wanted, since);
                continue;
            }
            Err(e) => {
                tracing::debug!(error = %e, "message stream unavailable for a store-evidence replay");
                continue;
            }
        };
        // The live consumer's coverage first (a new one covers everything held).
        if !*live_ready.borrow() {
            continue;
        }
        let wanted = coverage.to_replay();
        if !wanted.contains(&true) {
            continue;
        }
        let since = coverage.releases();
        let until = match stream.get_info().await {
            Ok(info) => info.state.last_sequence,
            Err(e) => {
                tracing::debug!(error = %e, "message stream info unavailable");
                continue;
            }
        };
        if until == 0 {
            coverage.cover_since(wanted, since);
            continue;
        }
        // A replay this member began before it died, whose consumer is still there and whose
        // partitions are all still wanted, resumes after its ack floor; anything else starts
        // over (a consumer left by an earlier run is deleted first).
        let replay_file = g.data_dir.join(REPLAY_FILE);
        let resumed = match ReplayInProgress::load(&replay_file) {
            Some(r)
                if r.only.contains(&true)
                    && (0..usize::from(PARTITIONS)).all(|i| !r.only[i] || wanted[i])
                    && stream.consumer_info(&replay).await.is_ok() =>
            {
                Some(r)
            }
            _ => None,
        };
        let (wanted, until) = match &resumed {
            Some(r) => {
                tracing::info!(partitions = %list(&r.only), until = r.until, "resuming the store-evidence replay a restart interrupted, after its last acknowledged message");
                (r.only, r.until)
            }
            None => {
                tracing::info!(partitions = %list(&wanted), until, "replaying the store evidence of partitions taken over");
                let _ = stream.delete_consumer(&replay).await;
                (wanted, until)
            }
        };
        let mut config = evidence::consumer_config(&replay, g.source.batch_size, g.source.ack_wait);
        config.description =
            Some("msgtrail listener: store evidence replay of partitions taken over".into());
        config.inactive_threshold = REPLAY_INACTIVE;
        // Creating a consumer that exists with the same configuration binds to it.
        let consumer = match stream.get_or_create_consumer(&replay, config).await {
            Ok(c) => c,
            Err(e) => {
                // Once a minute at most (a permission refused it, say: the partitions stay
                // not ready until it works).
                if refused.is_multiple_of(60) {
                    tracing::warn!(consumer = %replay, error = %e, attempts = refused + 1, "store-evidence replay consumer not created; the partitions taken over are not ready until it is; trying again every second");
                }
                refused += 1;
                continue;
            }
        };
        refused = 0;
        ReplayInProgress {
            only: wanted,
            until,
        }
        .save(&replay_file);
        let scope = Scope::Replay {
            coverage: coverage.clone(),
            only: wanted,
            until,
        };
        let source = EvidenceSource {
            name: replay.clone(),
            ..g.source.clone()
        };
        let ended = evidence::read(&source, consumer, scope, &g.sinks, stop).await;
        if let Err(e) = stream.delete_consumer(&replay).await {
            tracing::debug!(consumer = %replay, error = %e, "replay consumer not deleted (JetStream removes it when inactive)");
        }
        if !matches!(ended, evidence::Ended::Stopped) {
            ReplayInProgress::clear(&replay_file);
        }
        match ended {
            evidence::Ended::Stopped => return,
            evidence::Ended::Lost(why) => evidence::log_lost(why),
            evidence::Ended::Reached(done) => {
                coverage.cover_since(done, since);
                tracing::info!(partitions = %list(&done), "store evidence of the partitions taken over replayed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Role;

    /// A view of member `me` that holds `held` (primary), assigned.
    fn view_holding(held: &[u16]) -> Arc<ClusterView> {
        let view = Arc::new(ClusterView::new("me", 1));
        set_held(&view, held);
        view
    }

    fn set_held(view: &ClusterView, held: &[u16]) {
        let mut s = view.inner.write().unwrap();
        s.assigned = true;
        s.held = held
            .iter()
            .map(|i| (Partition::new(*i).unwrap(), (Role::Primary, Some(0))))
            .collect();
    }

    fn mask(ps: &[u16]) -> Mask {
        let mut m = [false; PARTITIONS as usize];
        for p in ps {
            m[usize::from(*p)] = true;
        }
        m
    }

    fn ready(view: &ClusterView) -> Vec<u16> {
        view.held()
            .iter()
            .filter(|h| h.ready)
            .map(|h| h.partition.index())
            .collect()
    }

    #[test]
    fn a_replay_in_progress_is_recorded_and_read_back_and_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(REPLAY_FILE);
        assert_eq!(ReplayInProgress::load(&path), None);
        let r = ReplayInProgress {
            only: mask(&[2, 7, 15]),
            until: 4242,
        };
        r.save(&path);
        assert_eq!(ReplayInProgress::load(&path), Some(r));
        ReplayInProgress::clear(&path);
        assert_eq!(ReplayInProgress::load(&path), None);
        std::fs::write(&path, "garbage").unwrap();
        assert_eq!(
            ReplayInProgress::load(&path),
            None,
            "unreadable: start over"
        );
    }

    #[test]
    fn held_partitions_not_covered_are_replayed_and_not_ready_until_then() {
        let dir = tempfile::tempdir().unwrap();
        let view = view_holding(&[1, 2, 3]);
        let c = Coverage::load(view.clone(), dir.path().join(COVERAGE_FILE));
        assert_eq!(c.to_replay(), mask(&[1, 2, 3]));
        assert_eq!(ready(&view), Vec::<u16>::new());
        // A partition covered that is not held stays uncovered.
        c.cover(mask(&[2, 9]));
        assert_eq!(c.to_replay(), mask(&[1, 3]));
        assert_eq!(ready(&view), vec![2]);
        c.cover(evidence::ALL);
        assert_eq!(c.to_replay(), mask(&[]));
        assert_eq!(ready(&view), vec![1, 2, 3]);
    }

    #[test]
    fn coverage_survives_a_restart_and_forgets_released_partitions_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(COVERAGE_FILE);
        let view = view_holding(&[0, 5, 15]);
        let c = Coverage::load(view.clone(), path.clone());
        c.cover(evidence::ALL);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "0,5,15\n");
        // Restarted holding the same partitions: nothing to replay.
        let again = Coverage::load(view_holding(&[0, 5, 15]), path.clone());
        assert_eq!(again.to_replay(), mask(&[]));
        // Partition 5 released: forgotten on disk at once; taken back: replayed.
        set_held(&view, &[0, 15]);
        assert_eq!(c.note_roles()[5], None);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "0,15\n");
        set_held(&view, &[0, 5, 15]);
        assert_eq!(c.to_replay(), mask(&[5]));
        let restarted = Coverage::load(view_holding(&[0, 5, 15]), path);
        assert_eq!(restarted.to_replay(), mask(&[5]));
    }

    #[test]
    fn a_partition_released_and_taken_back_during_its_replay_is_replayed_again() {
        let dir = tempfile::tempdir().unwrap();
        let view = view_holding(&[1, 2]);
        let c = Coverage::load(view.clone(), dir.path().join(COVERAGE_FILE));
        assert_eq!(c.to_replay(), mask(&[1, 2]));
        let since = c.releases();
        // During the replay the live consumer sees 2 released (and skips its messages), then
        // 2 comes back.
        set_held(&view, &[1]);
        c.note_roles();
        set_held(&view, &[1, 2]);
        c.cover_since(mask(&[1, 2]), since);
        assert_eq!(c.to_replay(), mask(&[2]));
        // Its next replay, undisturbed, covers it.
        let since = c.releases();
        c.cover_since(mask(&[2]), since);
        assert_eq!(c.to_replay(), mask(&[]));
    }

    #[test]
    fn nothing_is_held_before_the_first_assignment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(COVERAGE_FILE);
        std::fs::write(&path, "3,4\n").unwrap();
        let view = Arc::new(ClusterView::new("me", 1));
        let c = Coverage::load(view.clone(), path.clone());
        assert!(c.note_roles().iter().all(Option::is_none));
        // Not forgotten either: the assignment has not been made.
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "3,4\n");
        set_held(&view, &[3, 4, 7]);
        assert_eq!(c.to_replay(), mask(&[7]));
    }
}
