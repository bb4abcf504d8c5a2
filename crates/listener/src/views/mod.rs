//! Views the page shows beside one trajectory, computed on demand from what the listener
//! already keeps (the shadow messages and, for a bounded sample, the trajectories): no
//! state of their own, so nothing to keep consistent with the store.
//!
//! - [`groups`]: per consumer group, its messages by state, backlog, ack rate, dead letters;
//!   for one group also its members, redeliveries and latency percentiles per hop segment
//!   (`GET /api/groups`, `GET /api/groups/{group}`).
//! - [`dead_letters`]: the dead-lettered messages, newest first, with the group, the
//!   consumer and why, as the broker's R1 record says (`GET /api/dead-letters`).
//! - [`group_share`]: the group views as shares a listener group merges (what a member
//!   answers for some stage partitions: tallies and raw latency samples).
//! - [`spans`]: a trajectory's hops as the trace exporter maps them, with their exported
//!   attributes (`GET /api/messages/{id}/spans`).

pub(crate) mod dead_letters;
pub(crate) mod group_share;
pub(crate) mod groups;
pub(crate) mod spans;

pub(crate) use dead_letters::dead_letters;
pub(crate) use groups::{group_detail, groups};
pub(crate) use spans::spans;

use serde::{Deserialize, Serialize};

/// Latency percentiles of one segment over a sample, in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Percentiles {
    /// The segment: `queue_wait`, `deliver`, `process` or `end_to_end`.
    pub segment: String,
    /// How many samples.
    pub count: usize,
    /// The median.
    pub p50_ms: f64,
    /// The 99th percentile (nearest rank).
    pub p99_ms: f64,
    /// The largest.
    pub max_ms: f64,
}

impl Percentiles {
    /// The percentiles of `nanos` (nearest rank); `None` for no sample.
    pub(crate) fn of(segment: &str, mut nanos: Vec<u64>) -> Option<Percentiles> {
        if nanos.is_empty() {
            return None;
        }
        nanos.sort_unstable();
        let rank = |p: f64| {
            let i = ((p * nanos.len() as f64).ceil() as usize).clamp(1, nanos.len());
            nanos[i - 1] as f64 / 1e6
        };
        Some(Percentiles {
            segment: segment.to_owned(),
            count: nanos.len(),
            p50_ms: rank(0.5),
            p99_ms: rank(0.99),
            max_ms: nanos[nanos.len() - 1] as f64 / 1e6,
        })
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod percentile_tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        assert_eq!(Percentiles::of("deliver", vec![]), None);
        let p =
            Percentiles::of("deliver", (1..=100).rev().map(|v| v * 1_000_000).collect()).unwrap();
        assert_eq!(
            (p.count, p.p50_ms, p.p99_ms, p.max_ms),
            (100, 50.0, 99.0, 100.0)
        );
        let one = Percentiles::of("process", vec![2_500_000]).unwrap();
        assert_eq!((one.p50_ms, one.p99_ms), (2.5, 2.5));
    }
}
