//! The listener's errors: configuration apart from runtime, and query results apart from
//! query failures so that "not found" never reads as "the query failed".

/// A configuration value that cannot work: the one shape every msgtrail part shares.
pub use msgtrail_core::ConfigError;

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
    /// The database file could not be opened or created.
    Open {
        /// The path.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// A read or write of the store's engine (fjall) failed.
    Engine(fjall::Error),
    /// A read of a store written by an earlier (redb) version failed while migrating it.
    Db(redb::Error),
    /// The blocking task running a store operation died.
    Task(tokio::task::JoinError),
    /// A stored value could not be decoded (a bug or a corrupted file).
    Corrupt(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Open { path, reason } => {
                write!(f, "cannot open the store at {path}: {reason}")
            }
            StoreError::Engine(_) => f.write_str("store engine failed"),
            StoreError::Db(_) => f.write_str("store migration (redb) failed"),
            StoreError::Task(_) => f.write_str("store task failed"),
            StoreError::Corrupt(what) => write!(f, "store holds an undecodable value: {what}"),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Engine(e) => Some(chain_root(e)),
            StoreError::Db(e) => Some(e),
            StoreError::Task(e) => Some(e),
            StoreError::Open { .. } | StoreError::Corrupt(_) => None,
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
