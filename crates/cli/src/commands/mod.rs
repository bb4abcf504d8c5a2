//! One module per subcommand, each with its `Args` and `run`.

pub(crate) mod audit;
#[cfg(feature = "bench")]
pub(crate) mod bench;
pub(crate) mod broker;
pub(crate) mod consume;
#[cfg(feature = "dev")]
pub(crate) mod dev;
pub(crate) mod listener;
pub(crate) mod send;
pub(crate) mod stats;
pub(crate) mod trace;
