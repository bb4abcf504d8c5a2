//! The listener's errors: configuration apart from runtime, and query results apart from
//! query failures so that "not found" never reads as "the query failed".

/// A configuration value that cannot work: the one shape every msgtrail part shares.
pub use msgtrail_core::ConfigError;

use std::path::PathBuf;

/// Why the listener stopped or could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ListenerError {
    /// The configuration was refused before anything started.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// NATS could not be reached (the options are inconsistent, or the server refused).
    #[error(transparent)]
    Connect(#[from] msgtrail_nats::ConnectError),
    /// Observe mode could not create or bring its stream (`MSGTRAIL_OBSERVE`) to its settings.
    #[error("observe mode")]
    Observe(#[from] Box<msgtrail_nats::topology::TopologyError>),
    /// JetStream refused the stream or the consumer.
    #[error("nats: {context}")]
    Nats {
        /// What the listener was doing.
        context: String,
        /// What NATS answered.
        source: async_nats::Error,
    },
    /// The stage stream's consumer stopped delivering (NATS closed it).
    #[error("nats: stage stream consumer ended")]
    ConsumerEnded,
    /// The store could not be opened or written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The HTTP address could not be bound.
    #[error("cannot bind the http api on {addr}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A worker task died.
    #[error("listener task failed")]
    Task(#[from] tokio::task::JoinError),
    /// The HTTP server failed.
    #[error("listener task failed: http server")]
    Http(#[source] std::io::Error),
}

/// The cause an error keeps as its `source()`, whatever its type.
pub type BoxedCause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A failure of the embedded store.
///
/// Each variant displays its own level only and returns its cause from `source()`; where it
/// is shown (the logs, `/healthz`) the chain is rendered once with
/// [`msgtrail_core::ErrorChain`].
///
/// fjall's and lsm-tree's errors display their `Debug` form, which already holds their own
/// cause (`FjallError: Io(Os { .. })`), and return that cause from `source()` too: as a chain
/// the root cause would appear twice. So [`StoreError::Engine`]'s `source()` is the root of
/// fjall's chain (the I/O error, directly or through lsm-tree), and fjall's error itself
/// only where it is the root (`Poisoned`, `Locked`, a bad format version, …).
#[derive(Debug)]
#[non_exhaustive]
pub enum StoreError {
    /// The database could not be opened or created.
    Open {
        /// The directory or file.
        path: PathBuf,
        /// Why: an I/O error of the directory, or the engine's (fjall's, redb's) error.
        source: BoxedCause,
    },
    /// The database was closed after an I/O error and [`crate::Store::recover`] has not yet
    /// opened it again.
    Closed {
        /// The directory or file.
        path: PathBuf,
    },
    /// A store written by an earlier (redb) version was migrated, but its file could not be
    /// renamed aside.
    MigratedRename {
        /// The redb file.
        from: PathBuf,
        /// Where it was to be renamed.
        to: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A read or write of the store's engine (fjall) failed.
    Engine(fjall::Error),
    /// A read of a store written by an earlier (redb) version failed while migrating it.
    Db(redb::Error),
    /// The blocking task running a store operation died.
    Task(tokio::task::JoinError),
    /// A stored value could not be decoded (a bug or a corrupted file).
    Corrupt {
        /// Which value (`request row [0a, 0b]`, `counter value [..]`).
        what: String,
        /// The decode error, where there is one (none for, e.g., a value of the wrong length).
        source: Option<BoxedCause>,
    },
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Open { path, .. } => {
                write!(f, "cannot open the store at {}", path.display())
            }
            StoreError::Closed { path } => write!(
                f,
                "the store at {} is closed after an I/O error, not yet reopened",
                path.display()
            ),
            StoreError::MigratedRename { from, to, .. } => write!(
                f,
                "migrated the store at {}, but cannot rename it to {}",
                from.display(),
                to.display()
            ),
            StoreError::Engine(_) => f.write_str("store engine failed"),
            StoreError::Db(_) => f.write_str("store migration (redb) failed"),
            StoreError::Task(_) => f.write_str("store task failed"),
            StoreError::Corrupt { what, .. } => write!(f, "store holds an undecodable {what}"),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Engine(e) => Some(chain_root(e)),
            StoreError::Db(e) => Some(e),
            StoreError::Task(e) => Some(e),
            StoreError::Open { source, .. } => Some(source.as_ref()),
            StoreError::MigratedRename { source, .. } => Some(source),
            StoreError::Corrupt { source, .. } => source.as_deref().map(|e| e as _),
            StoreError::Closed { .. } => None,
        }
    }
}

/// The last error of `e`'s `source()` chain (`e` itself when it has none).
fn chain_root<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> &'a (dyn std::error::Error + 'static) {
    let mut root = e;
    while let Some(next) = root.source() {
        root = next;
    }
    root
}

impl From<fjall::Error> for StoreError {
    fn from(e: fjall::Error) -> Self {
        StoreError::Engine(e)
    }
}

impl From<redb::Error> for StoreError {
    fn from(e: redb::Error) -> Self {
        StoreError::Db(e)
    }
}

impl From<tokio::task::JoinError> for StoreError {
    fn from(e: tokio::task::JoinError) -> Self {
        StoreError::Task(e)
    }
}

impl StoreError {
    /// The store at `path` could not be opened, because of `source`.
    pub(crate) fn open(path: impl Into<PathBuf>, source: impl Into<BoxedCause>) -> Self {
        StoreError::Open {
            path: path.into(),
            source: source.into(),
        }
    }

    /// The stored value `what` could not be decoded, because of `source`.
    pub(crate) fn corrupt(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        StoreError::Corrupt {
            what: what.into(),
            source: Some(Box::new(source)),
        }
    }

    /// The stored value `what` is wrong in itself (a bad length, an unknown tag): there is
    /// no underlying error.
    pub(crate) fn bad_value(what: impl Into<String>) -> Self {
        StoreError::Corrupt {
            what: what.into(),
            source: None,
        }
    }

    /// Whether this is an I/O error of the store's files (a full disk, a failing device):
    /// the engine refuses every later write (fjall poisons the database) until the store is
    /// opened again ([`crate::Store::recover`]).
    pub fn is_io(&self) -> bool {
        matches!(
            self,
            StoreError::Engine(fjall::Error::Io(_) | fjall::Error::Poisoned)
                | StoreError::Db(redb::Error::Io(_) | redb::Error::PreviousIo)
        ) || matches!(self, StoreError::Engine(fjall::Error::Storage(lsm_tree_io)) if is_lsm_io(lsm_tree_io))
    }
}

/// Whether an error of fjall's LSM tree is an I/O error.
fn is_lsm_io(e: &fjall::LsmError) -> bool {
    matches!(e, fjall::LsmError::Io(_))
}

impl ListenerError {
    /// A NATS operation that failed, and what it was for.
    pub(crate) fn nats(context: impl Into<String>, source: impl Into<async_nats::Error>) -> Self {
        ListenerError::Nats {
            context: context.into(),
            source: source.into(),
        }
    }
}

/// redb's specific errors all convert into `redb::Error`, which keeps them as they are.
macro_rules! db_error {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                StoreError::Db(redb::Error::from(e))
            }
        }
    )*};
}
db_error!(
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

/// The answer to a query that did not succeed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    /// Nothing is known about that message or request ID.
    #[error("not found: no stage record carries {0}")]
    NotFound(String),
    /// A request ID used by several producers: name the producer.
    #[error("request id {request_id} is used by several producers: {producers:?}; add ?producer=")]
    Ambiguous {
        /// The request ID.
        request_id: String,
        /// The producers that used it.
        producers: Vec<String>,
    },
    /// The query itself was malformed.
    #[error("bad query: {0}")]
    BadRequest(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    /// A store whose directory is blocked by a regular file fails to open with an `Open`
    /// error that names the path only and keeps the I/O error as its cause.
    #[test]
    fn open_displays_its_own_level_and_keeps_the_io_error() {
        let dir = tempfile::tempdir().unwrap();
        let blocked = dir.path().join("store");
        std::fs::write(&blocked, b"a regular file").unwrap();
        let e = match crate::Store::open(
            &blocked,
            0,
            msgtrail_core::trajectory::Deadlines::default(),
        ) {
            Err(e) => e,
            Ok(_) => panic!("a store opened where a regular file blocks its directory"),
        };
        assert!(
            matches!(&e, StoreError::Open { path, .. } if path == &blocked),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!("cannot open the store at {}", blocked.display())
        );
        let io = e
            .source()
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .expect("the cause is the I/O error");
        assert!(!e.to_string().contains(&io.to_string()), "{e}");
    }

    /// A `Corrupt` built from a decode failure keeps it as its cause, out of its own text;
    /// one without an underlying error has no source.
    #[test]
    fn corrupt_displays_its_own_level_and_keeps_the_decode_error() {
        let cause = "not json".parse::<u64>().unwrap_err();
        let e = StoreError::corrupt("request row [0a, 0b]", cause.clone());
        assert_eq!(
            e.to_string(),
            "store holds an undecodable request row [0a, 0b]"
        );
        let source = e.source().expect("the decode error is the source");
        assert_eq!(
            source.downcast_ref::<std::num::ParseIntError>(),
            Some(&cause)
        );

        let bad = StoreError::bad_value("counter value [01]");
        assert_eq!(
            bad.to_string(),
            "store holds an undecodable counter value [01]"
        );
        assert!(bad.source().is_none());
    }

    /// A closed store names its path and has no cause; a failed rename after a migration
    /// keeps the I/O error.
    #[test]
    fn closed_and_rename_display_their_own_level() {
        let closed = StoreError::Closed {
            path: PathBuf::from("/data/listener.fjall"),
        };
        assert_eq!(
            closed.to_string(),
            "the store at /data/listener.fjall is closed after an I/O error, not yet reopened"
        );
        assert!(closed.source().is_none());
        let rename = StoreError::MigratedRename {
            from: PathBuf::from("/data/listener.redb"),
            to: PathBuf::from("/data/listener.redb.migrated"),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        };
        assert_eq!(
            rename.to_string(),
            "migrated the store at /data/listener.redb, but cannot rename it to /data/listener.redb.migrated"
        );
        assert!(rename.source().unwrap().is::<std::io::Error>());
    }
}
