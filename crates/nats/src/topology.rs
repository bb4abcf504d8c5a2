//! The JetStream topology of a msgtrail deployment, in one place: every stream and key-value
//! bucket msgtrail uses, with the settings each is created with, and how a process brings an
//! existing one to its own settings.
//!
//! The broker and the listener both create what they need if it is missing, so whoever
//! starts first creates it: each definition here is the only one. A stream that already
//! exists is compared with what the process would create ([`reconcile`], pure): replicas,
//! maximum age, subjects and duplicate window. A difference that is safe to apply (more
//! replicas, a longer maximum age, subjects added, another duplicate window) is applied with
//! a stream update and logged at WARN; one that is not (fewer replicas, a shorter maximum
//! age on a stream of messages or stage records) is refused with [`TopologyError::Refused`],
//! whose message names the `nats stream edit …` command that would make it.
//!
//! What a process insists on is its [`Policy`]: the broker owns every setting
//! ([`Policy::owner`]); the listener only reads the stage stream, so it keeps the stream's
//! maximum age and never lowers its replicas ([`Policy::reader`]).
//!
//! Processes that start together race to create a stream: the loser's create fails with
//! JetStream error 10058 (stream name already in use with a different configuration) and
//! [`ensure_stream`] then reads the winner's stream and reconciles with it, matching on the
//! JetStream error code, never on error text.

use async_nats::jetstream::context::{
    CreateStreamError, CreateStreamErrorKind, GetStreamError, GetStreamErrorKind,
};
use async_nats::jetstream::{self, kv, stream, ErrorCode};
use msgtrail_core::subjects as s;
use std::fmt;
use std::time::Duration;

/// The bucket of broker-wide settings (the key that signs ack tokens and receipts).
pub const BROKER_BUCKET: &str = "msgtrail_broker";

/// How long the stage stream keeps records unless the broker is told otherwise
/// (`--stage-max-age`); also what a listener that creates the stream uses.
pub const DEFAULT_STAGE_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

/// How many times [`ensure_stream`] goes back to reading a stream that another process
/// created under it (error 10058) before giving up.
const CREATE_RACES: u32 = 3;

/// The message stream, `MSGTRAIL_MESSAGES`: every uploaded message, on
/// `msgtrail.msg.<topic>`, deduplicated by message ID within `dedup_window`.
pub fn message_stream(
    replicas: usize,
    max_age: Duration,
    dedup_window: Duration,
) -> stream::Config {
    stream::Config {
        name: s::MESSAGE_STREAM.to_owned(),
        subjects: vec![format!("{}.>", s::MESSAGE_SUBJECT_PREFIX)],
        storage: stream::StorageType::File,
        num_replicas: replicas,
        duplicate_window: dedup_window,
        max_age,
        allow_direct: true,
        description: Some("msgtrail messages: msgtrail.msg.<topic>".into()),
        ..Default::default()
    }
}

/// The stage stream, `MSGTRAIL_STAGES`: batches of stage records the brokers write and the
/// listeners read, on the legacy `msgtrail.stages` and the partitions' `msgtrail.stages.<p>`
/// (`msgtrail_core::partition`). Limits retention with the maximum age: a listener that takes
/// a partition over rebuilds it by replaying the partition's subject from the start, so the
/// stream must keep as long as the listeners keep (the default age is both's default).
pub fn stage_stream(replicas: usize, max_age: Duration) -> stream::Config {
    stream::Config {
        name: s::STAGE_STREAM.to_owned(),
        subjects: vec![
            s::STAGE_SUBJECT.to_owned(),
            msgtrail_core::partition::wildcard(),
        ],
        storage: stream::StorageType::File,
        retention: stream::RetentionPolicy::Limits,
        num_replicas: replicas,
        max_age,
        allow_direct: true,
        description: Some("msgtrail stage records (batches of compact binary records)".into()),
        ..Default::default()
    }
}

/// The dead-letter stream, `MSGTRAIL_DEAD_LETTERS`, on `msgtrail.dlq.<group>.<topic>`.
pub fn dead_letter_stream(replicas: usize, max_age: Duration) -> stream::Config {
    stream::Config {
        name: s::DEAD_LETTER_STREAM.to_owned(),
        subjects: vec![format!("{}.>", s::DEAD_LETTER_SUBJECT_PREFIX)],
        storage: stream::StorageType::File,
        num_replicas: replicas,
        max_age,
        allow_direct: true,
        description: Some("msgtrail dead letters: msgtrail.dlq.<group>.<topic>".into()),
        ..Default::default()
    }
}

/// The stream observe mode captures nats-server's events into, `MSGTRAIL_OBSERVE`.
pub const OBSERVE_STREAM: &str = "MSGTRAIL_OBSERVE";

/// The nats-server event subjects observe mode captures for one observed stream: the
/// consumer ack metrics and the nak, term and max-deliveries advisories of every consumer
/// on it (core NATS events, lost when nobody listens; this stream keeps them).
pub fn observe_subjects(stream: &str) -> [String; 4] {
    [
        format!("$JS.EVENT.METRIC.CONSUMER.ACK.{stream}.*"),
        format!("$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED.{stream}.*"),
        format!("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.{stream}.*"),
        format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.*"),
    ]
}

/// The observe stream, `MSGTRAIL_OBSERVE`: the events of [`observe_subjects`] for each
/// observed stream, kept `max_age`, read by the listener's durable consumer.
pub fn observe_stream(streams: &[String], replicas: usize, max_age: Duration) -> stream::Config {
    stream::Config {
        name: OBSERVE_STREAM.to_owned(),
        subjects: streams.iter().flat_map(|s| observe_subjects(s)).collect(),
        storage: stream::StorageType::File,
        retention: stream::RetentionPolicy::Limits,
        num_replicas: replicas,
        max_age,
        description: Some(
            "msgtrail observe mode: ack metrics and nak/term/max-deliveries advisories of observed streams"
                .into(),
        ),
        ..Default::default()
    }
}

/// A bucket of the brokers' state: one value per key, entries expire after `ttl` (zero:
/// never).
pub fn bucket(name: &str, replicas: usize, ttl: Duration) -> kv::Config {
    kv::Config {
        bucket: name.to_owned(),
        history: 1,
        max_age: ttl,
        storage: stream::StorageType::File,
        num_replicas: replicas,
        ..Default::default()
    }
}

/// How many replicas a process wants of a stream it finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replicas {
    /// Exactly this many: more are added, fewer are refused (the broker's `--replicas`).
    Exactly(usize),
    /// At least this many: more are added, an existing stream with more keeps them.
    AtLeast(usize),
    /// Whatever the existing stream has (a new one gets one replica).
    Existing,
}

impl Replicas {
    /// The replicas of a stream this process creates.
    pub fn when_creating(self) -> usize {
        match self {
            Replicas::Exactly(n) | Replicas::AtLeast(n) => n,
            Replicas::Existing => 1,
        }
    }
}

/// What a process insists on when it finds a stream that exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// The replicas.
    pub replicas: Replicas,
    /// Whether the maximum age and the duplicate window are this process's to set (the
    /// broker's); otherwise the existing stream's are kept.
    pub limits: bool,
    /// Whether a shorter maximum age may be applied: true for buckets of short-lived state
    /// (channels, nonces), false for streams whose records someone still has to read.
    pub may_shorten_max_age: bool,
}

impl Policy {
    /// The broker's: every setting is its own; `replicas` exactly.
    pub const fn owner(replicas: usize) -> Self {
        Policy {
            replicas: Replicas::Exactly(replicas),
            limits: true,
            may_shorten_max_age: false,
        }
    }

    /// The broker's for a bucket of short-lived state: as [`Policy::owner`], and a shorter
    /// time to live is applied too (entries only expire sooner).
    pub const fn owner_of_ephemeral(replicas: usize) -> Self {
        Policy {
            may_shorten_max_age: true,
            ..Policy::owner(replicas)
        }
    }

    /// A reader's (the listener's): the existing stream's limits, and replicas raised to
    /// `replicas` when configured, never lowered.
    pub const fn reader(replicas: Option<usize>) -> Self {
        Policy {
            replicas: match replicas {
                Some(n) => Replicas::AtLeast(n),
                None => Replicas::Existing,
            },
            limits: false,
            may_shorten_max_age: false,
        }
    }
}

/// One setting of an existing stream that differs from this process's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The number of replicas.
    Replicas {
        /// The stream's.
        from: usize,
        /// This process's.
        to: usize,
    },
    /// The maximum age (zero: unlimited).
    MaxAge {
        /// The stream's.
        from: Duration,
        /// This process's.
        to: Duration,
    },
    /// The duplicate window.
    DuplicateWindow {
        /// The stream's.
        from: Duration,
        /// This process's.
        to: Duration,
    },
    /// Subjects this process needs that the stream does not capture.
    Subjects {
        /// The stream's.
        from: Vec<String>,
        /// The stream's and the missing ones.
        to: Vec<String>,
    },
}

impl Change {
    /// The `nats stream edit` flag that makes this change.
    fn flag(&self) -> String {
        match self {
            Change::Replicas { to, .. } => format!("--replicas={to}"),
            Change::MaxAge { to, .. } => format!("--max-age={}", go_duration(*to)),
            Change::DuplicateWindow { to, .. } => format!("--dupe-window={}", go_duration(*to)),
            Change::Subjects { to, .. } => format!("--subjects={}", to.join(",")),
        }
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Replicas { from, to } => write!(f, "replicas {from} -> {to}"),
            Change::MaxAge { from, to } => {
                write!(f, "max age {} -> {}", go_duration(*from), go_duration(*to))
            }
            Change::DuplicateWindow { from, to } => write!(
                f,
                "duplicate window {} -> {}",
                go_duration(*from),
                go_duration(*to)
            ),
            Change::Subjects { from, to } => {
                write!(f, "subjects [{}] -> [{}]", from.join(","), to.join(","))
            }
        }
    }
}

/// The changes, comma-separated.
fn list(changes: &[Change]) -> String {
    changes
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A duration as Go (and so the `nats` CLI) reads it; zero is unlimited (`-1`).
fn go_duration(d: Duration) -> String {
    if d.is_zero() {
        "-1".to_owned()
    } else if d.subsec_millis() == 0 && d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// What [`reconcile`] found: the settings to apply, those it would not apply, and those
/// it keeps on purpose.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reconciliation {
    /// Safe changes, applied by updating the stream to [`Reconciliation::update`].
    pub apply: Vec<Change>,
    /// Changes that would lose data or durability: refused.
    pub refuse: Vec<Change>,
    /// Differences the policy keeps as they are (a reader's limits, more replicas).
    pub keep: Vec<Change>,
    /// The existing configuration with [`Reconciliation::apply`] made, when there is any.
    pub update: Option<stream::Config>,
}

impl Reconciliation {
    /// The command that would make every change this process wants, refused ones included.
    pub fn command(&self, stream: &str) -> String {
        let flags: Vec<String> = self
            .apply
            .iter()
            .chain(&self.refuse)
            .map(Change::flag)
            .collect();
        format!("nats stream edit {stream} {} --force", flags.join(" "))
    }
}

/// Compares an existing stream's configuration with what this process would create
/// (`desired`), under `policy`.
pub fn reconcile(
    existing: &stream::Config,
    desired: &stream::Config,
    policy: Policy,
) -> Reconciliation {
    let mut r = Reconciliation::default();
    let mut update = existing.clone();

    let have = existing.num_replicas.max(1);
    match policy.replicas {
        Replicas::Existing => {}
        Replicas::Exactly(want) | Replicas::AtLeast(want) if want > have => {
            r.apply.push(Change::Replicas {
                from: have,
                to: want,
            });
            update.num_replicas = want;
        }
        Replicas::Exactly(want) if want < have => r.refuse.push(Change::Replicas {
            from: have,
            to: want,
        }),
        Replicas::AtLeast(want) if want < have => r.keep.push(Change::Replicas {
            from: have,
            to: want,
        }),
        _ => {}
    }

    // Zero is unlimited: the longest of all.
    let longer = |a: Duration, b: Duration| !b.is_zero() && (a.is_zero() || a > b);
    if existing.max_age != desired.max_age {
        let change = Change::MaxAge {
            from: existing.max_age,
            to: desired.max_age,
        };
        if !policy.limits {
            r.keep.push(change);
        } else if longer(desired.max_age, existing.max_age) || policy.may_shorten_max_age {
            update.max_age = desired.max_age;
            r.apply.push(change);
        } else {
            r.refuse.push(change);
        }
    }

    // Zero asks for the server's default: nothing to compare.
    if !desired.duplicate_window.is_zero() && existing.duplicate_window != desired.duplicate_window
    {
        let change = Change::DuplicateWindow {
            from: existing.duplicate_window,
            to: desired.duplicate_window,
        };
        if policy.limits {
            update.duplicate_window = desired.duplicate_window;
            r.apply.push(change);
        } else {
            r.keep.push(change);
        }
    }
    // JetStream refuses a duplicate window longer than the maximum age.
    if !update.max_age.is_zero() && update.duplicate_window > update.max_age {
        update.duplicate_window = update.max_age;
    }

    let missing: Vec<&String> = desired
        .subjects
        .iter()
        .filter(|s| !existing.subjects.contains(s))
        .collect();
    if !missing.is_empty() {
        let mut to = existing.subjects.clone();
        to.extend(missing.into_iter().cloned());
        r.apply.push(Change::Subjects {
            from: existing.subjects.clone(),
            to: to.clone(),
        });
        update.subjects = to;
    }

    if !r.apply.is_empty() && r.refuse.is_empty() {
        r.update = Some(update);
    }
    r
}

/// Why a stream or bucket could not be created, found or brought to this process's settings.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TopologyError {
    /// Reading the stream failed (other than its not existing).
    #[error("cannot read stream {stream}")]
    Get {
        /// The stream.
        stream: String,
        /// What JetStream answered.
        #[source]
        source: GetStreamError,
    },
    /// Creating the stream failed.
    #[error("cannot create stream {stream}")]
    Create {
        /// The stream.
        stream: String,
        /// What JetStream answered.
        #[source]
        source: CreateStreamError,
    },
    /// Updating the stream to this process's settings failed.
    #[error("cannot update stream {stream} ({changes}); run `{command}` with JetStream rights")]
    Update {
        /// The stream.
        stream: String,
        /// The changes it tried.
        changes: String,
        /// The command that would make them.
        command: String,
        /// What JetStream answered.
        #[source]
        source: CreateStreamError,
    },
    /// The stream differs from this process's settings in a way it will not change itself.
    #[error(
        "stream {stream} differs from this process's settings ({changes}) and changing it \
         could lose data or durability; configure this process to match the stream, or run \
         `{command}`"
    )]
    Refused {
        /// The stream.
        stream: String,
        /// Every change this process wants, refused ones included.
        changes: String,
        /// The command that would make them.
        command: String,
    },
    /// Another process kept creating the stream with other settings under this one.
    #[error(
        "stream {stream} was created by another process {CREATE_RACES} times but cannot be read"
    )]
    Raced {
        /// The stream.
        stream: String,
    },
    /// Opening a key-value bucket whose stream exists failed.
    #[error("cannot open bucket {bucket}")]
    Bucket {
        /// The bucket.
        bucket: String,
        /// What JetStream answered.
        #[source]
        source: jetstream::context::KeyValueError,
    },
}

impl TopologyError {
    /// Whether trying again may succeed (JetStream unavailable, a timeout, no leader yet);
    /// a refusal or a bad configuration stays.
    pub fn is_transient(&self) -> bool {
        let jetstream_code = is_transient_code;
        let create = |e: &CreateStreamError| match e.kind() {
            CreateStreamErrorKind::JetStream(e) => jetstream_code(e.error_code()),
            CreateStreamErrorKind::TimedOut
            | CreateStreamErrorKind::JetStreamUnavailable
            | CreateStreamErrorKind::Response => true,
            _ => false,
        };
        match self {
            TopologyError::Get { source, .. } => match source.kind() {
                GetStreamErrorKind::Request => true,
                GetStreamErrorKind::JetStream(e) => jetstream_code(e.error_code()),
                _ => false,
            },
            TopologyError::Create { source, .. } | TopologyError::Update { source, .. } => {
                create(source)
            }
            TopologyError::Raced { .. } | TopologyError::Bucket { .. } => true,
            TopologyError::Refused { .. } => false,
        }
    }
}

/// Whether a JetStream error code says the cluster is not ready yet (no leader, not
/// available, no peers with room), so that the request may succeed when tried again.
pub fn is_transient_code(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::CLUSTER_NOT_AVAILABLE
            | ErrorCode::CLUSTER_NOT_ACTIVE
            | ErrorCode::CLUSTER_NOT_LEADER
            | ErrorCode::CLUSTER_NOT_ASSIGNED
            | ErrorCode::INSUFFICIENT_RESOURCES
    )
}

/// Whether `e` is JetStream's answer to creating a stream that exists with another
/// configuration (10058).
fn is_name_in_use(e: &CreateStreamError) -> bool {
    matches!(e.kind(), CreateStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NAME_EXIST)
}

/// Gets the stream `desired` names, creating it if it is missing and bringing an existing
/// one to `desired` under `policy` (see the module documentation).
pub async fn ensure_stream(
    js: &jetstream::Context,
    desired: &stream::Config,
    policy: Policy,
) -> Result<stream::Stream, TopologyError> {
    let name = desired.name.as_str();
    for _ in 0..CREATE_RACES {
        match js.get_stream(name).await {
            Ok(found) => return bring_to(js, found, desired, policy).await,
            Err(e) if is_not_found(&e) => {}
            Err(source) => {
                return Err(TopologyError::Get {
                    stream: name.to_owned(),
                    source,
                })
            }
        }
        let mut create = desired.clone();
        create.num_replicas = policy.replicas.when_creating();
        match js.create_stream(create).await {
            Ok(created) => {
                tracing::info!(
                    stream = name,
                    replicas = created.cached_info().config.num_replicas,
                    "stream created"
                );
                return js
                    .get_stream(name)
                    .await
                    .map_err(|source| TopologyError::Get {
                        stream: name.to_owned(),
                        source,
                    });
            }
            // Another process created it first, with other settings: read it and reconcile.
            Err(e) if is_name_in_use(&e) => {
                tracing::debug!(stream = name, "stream created by another process meanwhile");
            }
            Err(source) => {
                return Err(TopologyError::Create {
                    stream: name.to_owned(),
                    source,
                })
            }
        }
    }
    Err(TopologyError::Raced {
        stream: name.to_owned(),
    })
}

fn is_not_found(e: &GetStreamError) -> bool {
    matches!(e.kind(), GetStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND)
}

/// Reconciles a found stream with `desired`: logs what differs, applies what is safe,
/// refuses the rest.
async fn bring_to(
    js: &jetstream::Context,
    found: stream::Stream,
    desired: &stream::Config,
    policy: Policy,
) -> Result<stream::Stream, TopologyError> {
    let name = desired.name.as_str();
    let r = reconcile(&found.cached_info().config, desired, policy);
    if !r.keep.is_empty() {
        tracing::info!(stream = name, kept = %list(&r.keep), "existing stream's settings kept");
    }
    if !r.refuse.is_empty() {
        let all: Vec<Change> = r.apply.iter().chain(&r.refuse).cloned().collect();
        return Err(TopologyError::Refused {
            stream: name.to_owned(),
            changes: list(&all),
            command: r.command(name),
        });
    }
    let Some(update) = &r.update else {
        return Ok(found);
    };
    tracing::warn!(stream = name, changes = %list(&r.apply), "existing stream differs from this process's settings; updating it");
    js.update_stream(update)
        .await
        .map_err(|source| TopologyError::Update {
            stream: name.to_owned(),
            changes: list(&r.apply),
            command: r.command(name),
            source,
        })?;
    js.get_stream(name)
        .await
        .map_err(|source| TopologyError::Get {
            stream: name.to_owned(),
            source,
        })
}

/// Gets the bucket `desired` names, creating it if it is missing and bringing an existing
/// one's stream (`KV_<bucket>`) to `desired` under `policy`, as [`ensure_stream`] does.
pub async fn ensure_bucket(
    js: &jetstream::Context,
    desired: &kv::Config,
    policy: Policy,
) -> Result<kv::Store, TopologyError> {
    let stream_name = format!("KV_{}", desired.bucket);
    match js.get_stream(&stream_name).await {
        Ok(found) => {
            // The stream a bucket would be created with, for the settings compared.
            let wanted = stream::Config {
                name: stream_name.clone(),
                subjects: vec![format!("$KV.{}.>", desired.bucket)],
                num_replicas: desired.num_replicas,
                max_age: desired.max_age,
                ..Default::default()
            };
            bring_to(js, found, &wanted, policy).await?;
        }
        Err(e) if is_not_found(&e) => {
            let mut create = desired.clone();
            create.num_replicas = policy.replicas.when_creating();
            match js.create_key_value(create).await {
                Ok(store) => return Ok(store),
                Err(e) => {
                    let source = std::error::Error::source(&e)
                        .and_then(|s| s.downcast_ref::<CreateStreamError>());
                    // Created by another broker meanwhile: open it below.
                    if !source.is_some_and(is_name_in_use) {
                        return Err(TopologyError::Bucket {
                            bucket: desired.bucket.clone(),
                            source: jetstream::context::KeyValueError::with_source(
                                jetstream::context::KeyValueErrorKind::JetStream,
                                e,
                            ),
                        });
                    }
                }
            }
        }
        Err(source) => {
            return Err(TopologyError::Get {
                stream: stream_name,
                source,
            })
        }
    }
    js.get_key_value(desired.bucket.as_str())
        .await
        .map_err(|source| TopologyError::Bucket {
            bucket: desired.bucket.clone(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    #[test]
    fn the_broker_raises_replicas_and_age_and_refuses_to_lower_them() {
        let listener_made = stage_stream(1, DEFAULT_STAGE_MAX_AGE);
        let r = reconcile(
            &listener_made,
            &stage_stream(3, DEFAULT_STAGE_MAX_AGE),
            Policy::owner(3),
        );
        assert_eq!(r.apply, vec![Change::Replicas { from: 1, to: 3 }]);
        assert_eq!(r.update.as_ref().map(|c| c.num_replicas), Some(3));

        let r = reconcile(
            &stage_stream(3, 7 * DAY),
            &stage_stream(1, DAY),
            Policy::owner(1),
        );
        assert!(r.update.is_none());
        assert_eq!(
            r.refuse,
            vec![
                Change::Replicas { from: 3, to: 1 },
                Change::MaxAge {
                    from: 7 * DAY,
                    to: DAY
                }
            ]
        );
        assert_eq!(
            r.command("MSGTRAIL_STAGES"),
            "nats stream edit MSGTRAIL_STAGES --replicas=1 --max-age=86400s --force"
        );
    }

    #[test]
    fn the_listener_keeps_more_replicas_and_the_brokers_limits() {
        let broker_made = stage_stream(3, DAY);
        let r = reconcile(
            &broker_made,
            &stage_stream(1, DEFAULT_STAGE_MAX_AGE),
            Policy::reader(None),
        );
        assert!(
            r.apply.is_empty() && r.refuse.is_empty() && r.update.is_none(),
            "{r:?}"
        );
        let r = reconcile(
            &broker_made,
            &stage_stream(1, DEFAULT_STAGE_MAX_AGE),
            Policy::reader(Some(1)),
        );
        assert!(r.refuse.is_empty() && r.update.is_none(), "{r:?}");
        assert!(r.keep.contains(&Change::Replicas { from: 3, to: 1 }));
        let r = reconcile(
            &stage_stream(1, DAY),
            &stage_stream(3, DAY),
            Policy::reader(Some(3)),
        );
        assert_eq!(r.apply, vec![Change::Replicas { from: 1, to: 3 }]);
    }

    #[test]
    fn duplicate_window_and_subjects_are_brought_to_the_owners() {
        let existing = message_stream(1, DAY, Duration::from_secs(120));
        let mut desired = message_stream(1, DAY, Duration::from_secs(5));
        desired.subjects.push("extra.>".into());
        let r = reconcile(&existing, &desired, Policy::owner(1));
        assert!(r.refuse.is_empty());
        let update = r.update.clone().expect("an update");
        assert_eq!(update.duplicate_window, Duration::from_secs(5));
        assert_eq!(
            update.subjects,
            vec!["msgtrail.msg.>".to_owned(), "extra.>".to_owned()]
        );
        assert!(r.command("MSGTRAIL_MESSAGES").contains("--dupe-window=5s"));
    }

    #[test]
    fn a_shorter_bucket_ttl_is_applied_with_the_duplicate_window_within_it() {
        let existing = stream::Config {
            max_age: Duration::from_secs(600),
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        };
        let desired = stream::Config {
            max_age: Duration::from_secs(30),
            ..Default::default()
        };
        let r = reconcile(&existing, &desired, Policy::owner_of_ephemeral(1));
        let update = r.update.expect("applied");
        assert_eq!(update.max_age, Duration::from_secs(30));
        assert_eq!(update.duplicate_window, Duration::from_secs(30));
        // An unlimited age (zero) is the longest.
        let r = reconcile(&desired, &existing, Policy::owner(1));
        assert!(r.refuse.is_empty());
        let unlimited = stream::Config::default();
        let r = reconcile(&unlimited, &existing, Policy::owner(1));
        assert_eq!(r.refuse.len(), 1, "{r:?}");
        assert_eq!(go_duration(Duration::ZERO), "-1");
    }
}
