//! One module per subcommand, each with its `Args` and `run`.

pub mod audit;
pub mod bench;
pub mod broker;
pub mod consume;
pub mod dev;
pub mod listener;
pub mod send;
pub mod stats;
pub mod trace;
