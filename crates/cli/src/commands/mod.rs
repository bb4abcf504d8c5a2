//! One module per subcommand, each with its `Args` and `run`.

pub(crate) mod audit;
pub(crate) mod bench;
pub(crate) mod broker;
pub(crate) mod consume;
pub(crate) mod dev;
pub(crate) mod listener;
pub(crate) mod send;
pub(crate) mod stats;
pub(crate) mod trace;
