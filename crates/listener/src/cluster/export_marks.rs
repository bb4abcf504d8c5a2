//! Exactly one export per trace in a group: the hops a partition's primary exported are
//! **marked** in a JetStream stream, so that the member that takes the partition over (a copy
//! promoted when the primary dies, or the primary come back) exports the others and only
//! those.
//!
//! - *Marking*: the exporter tells [`ExportGate::hook`] the hops of every request the OTLP
//!   receiver accepted whole (`msgtrail_otel::ExportHandle::on_exported`); one task puts, per
//!   message, the set of its hops exported so far on `msgtrail.exported.<group>.<p>.<id>` in
//!   [`EXPORT_MARKS_STREAM`] (one message kept per subject, so the stream is a key-value map
//!   of the group's exported traces, with [`MARK_HORIZON`] as its maximum age). Marks follow
//!   the receiver's acceptance, so a hop queued or in flight when its primary died is not
//!   marked, and the next primary exports it.
//! - *Admitting*: before the export task looks at a trajectory, [`ExportGate::admit`] drops it
//!   unless this member is its partition's primary now, and for a trajectory that began
//!   before this member became primary (plus [`HANDOVER_MARGIN`]) and that this member's
//!   pipeline does not know yet, reads its mark (one direct get) and hands the marked hops to
//!   the pipeline as exported elsewhere. Traces born later were never anyone else's: no read.
//! - *Handing over*: a new primary's partition worker waits [`HANDOVER_SETTLE`] (the former
//!   primary, which sees the membership change within a beat, stops exporting the partition
//!   and its last accepted requests get marked), then offers again the trajectories its
//!   partition applied in the last [`super::RECENT_WINDOW`] — those whose hops the dead
//!   primary held in its grace, queue or requests and never exported.
//!
//! What it bounds: a hop is exported twice only when the receiver accepted it and its
//! primary died before the mark was put (a few milliseconds), when a mark cannot be read or
//! written (NATS down: logged), or when a trace changes again more than [`MARK_HORIZON`]
//! after its last mark; it is never exported when its primary died holding it and the
//! trajectory was last applied more than [`super::RECENT_WINDOW`] before the takeover. The
//! cost: one JetStream put per accepted request per message (with export on), and one
//! direct get per trace a takeover inherits.

use super::ClusterView;
use crate::error::ListenerError;
use async_nats::jetstream::{self, stream};
use msgtrail_core::partition::Partition;
use msgtrail_core::trajectory::Trajectory;
use msgtrail_otel::{ExportedHook, ExportedHop};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The stream of export marks, shared by every group (subjects name the group).
pub const EXPORT_MARKS_STREAM: &str = "MSGTRAIL_EXPORTED";
/// The subjects' prefix: `msgtrail.exported.<group>.<partition>.<message id>`.
pub const EXPORT_MARKS_SUBJECT_PREFIX: &str = "msgtrail.exported";
/// How long a mark is kept: a trace that changes again later than this after its last
/// export is exported again by a member that took it over.
pub(crate) const MARK_HORIZON: Duration = Duration::from_secs(3600);
/// How long a new primary waits before it exports a partition it took over.
pub(crate) const HANDOVER_SETTLE: Duration = Duration::from_secs(2);
/// Traces that began up to this long after this member became a partition's primary are
/// still looked up (the former primary may have exported them meanwhile; clocks differ).
pub(crate) const HANDOVER_MARGIN: Duration = Duration::from_secs(7);
/// Messages whose mark this member remembers (to put each mark whole), oldest forgotten
/// first; a forgotten one is read again before its next put.
const REMEMBERED: usize = 100_000;

/// The stream's configuration: one message per subject, limits on age.
fn stream_config(replicas: usize) -> stream::Config {
    stream::Config {
        name: EXPORT_MARKS_STREAM.to_owned(),
        description: Some(
            "msgtrail listener groups: hops each partition's primary exported".into(),
        ),
        subjects: vec![format!("{EXPORT_MARKS_SUBJECT_PREFIX}.>")],
        max_messages_per_subject: 1,
        max_age: MARK_HORIZON,
        storage: stream::StorageType::File,
        num_replicas: replicas,
        allow_direct: true,
        ..Default::default()
    }
}

/// The mark subject of message `id` in `group`.
fn subject(group: &str, id: &str) -> String {
    let p = id
        .parse::<msgtrail_core::MessageId>()
        .map(|m| Partition::of_message(&m).index())
        .unwrap_or(0);
    format!("{EXPORT_MARKS_SUBJECT_PREFIX}.{group}.{p}.{id}")
}

/// What the export task does with a trajectory ([`ExportGate::admit`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Not this member's to export (it is not the partition's primary).
    Skip,
    /// Export it, these hops excepted (another member exported them).
    Export(Vec<String>),
}

/// What the mark writer gets.
enum Note {
    /// Hops the receiver accepted.
    Exported(Vec<ExportedHop>),
    /// A mark read from the stream: its hops are part of the next put.
    Read(String, Vec<String>),
}

/// The gate between a group member's trajectories and its export (see the module docs).
#[derive(Debug)]
pub(crate) struct ExportGate {
    view: Arc<ClusterView>,
    stream: stream::Stream,
    group: String,
    notes: mpsc::UnboundedSender<Note>,
}

impl std::fmt::Debug for Note {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Note::Exported(h) => write!(f, "Exported({})", h.len()),
            Note::Read(id, h) => write!(f, "Read({id}, {})", h.len()),
        }
    }
}

impl ExportGate {
    /// Gets (or creates) the marks stream and returns the gate and its mark writer's task.
    pub(crate) async fn start(
        js: &jetstream::Context,
        group: &str,
        replicas: Option<usize>,
        view: Arc<ClusterView>,
        stop: CancellationToken,
    ) -> Result<
        (
            Arc<ExportGate>,
            impl std::future::Future<Output = Result<(), ListenerError>>,
        ),
        ListenerError,
    > {
        let r = replicas.unwrap_or(1);
        let stream = msgtrail_nats::topology::ensure_stream(
            js,
            &stream_config(r),
            msgtrail_nats::topology::Policy::owner(r),
        )
        .await
        .map_err(|e| ListenerError::nats("export marks stream", e))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let gate = Arc::new(ExportGate {
            view,
            stream,
            group: group.to_owned(),
            notes: tx,
        });
        let writer = write_marks(js.clone(), group.to_owned(), rx, stop);
        Ok((gate, writer))
    }

    /// The exporter's hook: accepted hops go to the mark writer.
    pub(crate) fn hook(self: &Arc<Self>) -> ExportedHook {
        let tx = self.notes.clone();
        Arc::new(move |hops| {
            let _ = tx.send(Note::Exported(hops));
        })
    }

    /// Whether and how `t` is exported here; `known`: this member's pipeline already
    /// remembers its trace.
    pub(crate) async fn admit(&self, t: &Trajectory, known: bool) -> Admit {
        let partition = match (&t.message_id, &t.request_id) {
            (Some(m), _) => Partition::of_message(m),
            (None, Some(r)) => Partition::of_request(r),
            // Neither: nothing to partition by, and no trace ID to export it under.
            (None, None) => return Admit::Export(vec![]),
        };
        let Some(since) = self.view.primary_since(partition) else {
            return Admit::Skip;
        };
        let Some(id) = t.message_id.map(|m| m.to_string()) else {
            return Admit::Export(vec![]);
        };
        let inherited = t.first_at < since.saturating_add(HANDOVER_MARGIN.as_nanos() as u64);
        if known || !inherited {
            return Admit::Export(vec![]);
        }
        let hops = self.read(&id).await;
        if !hops.is_empty() {
            let _ = self.notes.send(Note::Read(id, hops.clone()));
        }
        Admit::Export(hops)
    }

    /// The hops marked exported for message `id` (none when unmarked or unreadable).
    async fn read(&self, id: &str) -> Vec<String> {
        match self
            .stream
            .direct_get_last_for_subject(subject(&self.group, id))
            .await
        {
            Ok(m) => serde_json::from_slice(&m.payload).unwrap_or_default(),
            Err(e) if e.kind() == stream::DirectGetErrorKind::NotFound => vec![],
            Err(e) => {
                tracing::warn!(message_id = %id, error = %e, "cannot read an export mark; the trace's exported hops may be exported again");
                vec![]
            }
        }
    }
}

/// The mark writer: per message, the union of its hops exported (and read) so far, put on
/// its subject after each accepted request.
async fn write_marks(
    js: jetstream::Context,
    group: String,
    mut rx: mpsc::UnboundedReceiver<Note>,
    stop: CancellationToken,
) -> Result<(), ListenerError> {
    let mut marks: HashMap<String, BTreeSet<String>> = HashMap::new();
    let mut order: VecDeque<String> = VecDeque::new();
    let mut remember = |marks: &mut HashMap<String, BTreeSet<String>>, id: &str| {
        if !marks.contains_key(id) {
            while marks.len() >= REMEMBERED {
                match order.pop_front() {
                    Some(old) => {
                        marks.remove(&old);
                    }
                    None => break,
                }
            }
            order.push_back(id.to_owned());
            marks.insert(id.to_owned(), BTreeSet::new());
        }
    };
    loop {
        let note = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            n = rx.recv() => match n { Some(n) => n, None => return Ok(()) },
        };
        match note {
            Note::Read(id, hops) => {
                remember(&mut marks, &id);
                marks.get_mut(&id).expect("remembered").extend(hops);
            }
            Note::Exported(hops) => {
                let mut touched: Vec<String> = Vec::new();
                for h in hops {
                    remember(&mut marks, &h.message_id);
                    marks
                        .get_mut(&h.message_id)
                        .expect("remembered")
                        .insert(h.hop_key);
                    if !touched.contains(&h.message_id) {
                        touched.push(h.message_id);
                    }
                }
                let mut acks = Vec::with_capacity(touched.len());
                for id in touched {
                    let body = serde_json::to_vec(&marks[&id]).expect("hop keys serialize");
                    match js.publish(subject(&group, &id), body.into()).await {
                        Ok(ack) => acks.push(ack),
                        Err(e) => {
                            tracing::warn!(message_id = %id, error = %e, "cannot put an export mark; a member taking the partition over may export the trace's hops again")
                        }
                    }
                }
                for ack in acks {
                    if let Err(e) = ack.await {
                        tracing::warn!(error = %e, "an export mark was not stored; a member taking the partition over may export its hops again");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_subject_names_the_group_the_partition_and_the_message() {
        let id = msgtrail_core::MessageId::new();
        let p = Partition::of_message(&id).index();
        assert_eq!(
            subject("g", &id.to_string()),
            format!("msgtrail.exported.g.{p}.{id}")
        );
    }
}
