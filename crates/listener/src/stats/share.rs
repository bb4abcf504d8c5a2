//! A member's share of a listener group's statistics ([`StatsShare`]: what it answers for
//! an exact set of stage partitions) and the merge of shares ([`Merged`]).
//!
//! A share carries counters under their plain names (summed over its partitions) and, per
//! (topic, segment), the window's and the since-start latency histograms serialized as
//! their recorded buckets: `[value, count]` pairs, each value the highest equivalent value
//! of its bucket. Recording those pairs again into a histogram of the same precision puts
//! each count back in the same bucket, so a merged histogram is the one that would have
//! recorded every sample, and its percentiles are recomputed from it (never an average of
//! the members' percentiles).

use super::window::hist;
use hdrhistogram::Histogram;
use msgtrail_core::partition::Partition;
use msgtrail_core::trajectory::Segment;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A histogram's recorded buckets: `[highest equivalent value, count]`, in value order.
pub(crate) type Buckets = Vec<(u64, u64)>;

/// One (topic, segment)'s latency histograms in a share (microseconds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HistogramShare {
    /// The topic (`""` when unknown).
    pub topic: String,
    /// The segment.
    pub segment: Segment,
    /// Over the sliding window.
    pub window: Buckets,
    /// Since the member started (and the window it refilled at start).
    pub total: Buckets,
}

/// What a member answers for an exact set of partitions (`GET /api/share/stats`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StatsShare {
    /// The partitions this share covers.
    pub partitions: Vec<Partition>,
    /// Their counters, summed, under the plain names (`stage.P1`, `funnel.acked`,
    /// `topic/orders/state.consumed`, …).
    pub counters: BTreeMap<String, u64>,
    /// Their latency histograms, merged, per (topic, segment).
    pub latency: Vec<HistogramShare>,
}

/// Shares added up: counters summed, histograms merged.
#[derive(Default)]
pub(crate) struct Merged {
    /// Counters by plain name.
    pub counters: BTreeMap<String, u64>,
    /// (window, since start) per (topic, segment).
    hists: BTreeMap<(String, Segment), (Histogram<u64>, Histogram<u64>)>,
}

impl std::fmt::Debug for Merged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Merged")
            .field("counters", &self.counters)
            .field("histograms", &self.hists.len())
            .finish()
    }
}

/// The recorded buckets of `h`.
fn buckets(h: &Histogram<u64>) -> Buckets {
    h.iter_recorded()
        .map(|v| (v.value_iterated_to(), v.count_at_value()))
        .collect()
}

/// Records `buckets` into `h`.
fn record(h: &mut Histogram<u64>, buckets: &Buckets) {
    for (v, n) in buckets {
        // An auto-resizing histogram only fails past u64 bucket arithmetic.
        let _ = h.record_n(*v, *n);
    }
}

impl Merged {
    /// Merges one (topic, segment)'s histograms in.
    pub(crate) fn add_histograms(
        &mut self,
        topic: &str,
        segment: Segment,
        window: &Histogram<u64>,
        total: &Histogram<u64>,
    ) {
        let (w, t) = self
            .hists
            .entry((topic.to_owned(), segment))
            .or_insert_with(|| (hist(), hist()));
        // Same precision on both sides: adding cannot fail but for u64 overflow.
        let _ = w.add(window);
        let _ = t.add(total);
    }

    /// Adds a member's share: its counters summed, its histograms merged.
    pub(crate) fn add(&mut self, share: &StatsShare) {
        for (name, v) in &share.counters {
            *self.counters.entry(name.clone()).or_default() += v;
        }
        for h in &share.latency {
            let (w, t) = self
                .hists
                .entry((h.topic.clone(), h.segment))
                .or_insert_with(|| (hist(), hist()));
            record(w, &h.window);
            record(t, &h.total);
        }
    }

    /// The merged histograms: (topic, segment, window, since start).
    pub(crate) fn histograms(
        &self,
    ) -> impl Iterator<Item = (&str, Segment, &Histogram<u64>, &Histogram<u64>)> {
        self.hists
            .iter()
            .map(|((t, s), (w, total))| (t.as_str(), *s, w, total))
    }

    /// The share of `partitions` these figures are.
    pub(crate) fn into_share(self, partitions: Vec<Partition>) -> StatsShare {
        StatsShare {
            partitions,
            counters: self.counters,
            latency: self
                .hists
                .iter()
                .map(|((topic, segment), (w, t))| HistogramShare {
                    topic: topic.clone(),
                    segment: *segment,
                    window: buckets(w),
                    total: buckets(t),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::window::put;
    use super::*;

    fn of(values: impl IntoIterator<Item = u64>) -> Histogram<u64> {
        let mut h = hist();
        for v in values {
            put(&mut h, v);
        }
        h
    }

    fn share_of(p: u16, counters: &[(&str, u64)], h: &Histogram<u64>) -> StatsShare {
        let mut m = Merged {
            counters: counters.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            ..Default::default()
        };
        m.add_histograms("orders", Segment::EndToEnd, h, h);
        m.into_share(vec![Partition::new(p).unwrap()])
    }

    /// Two members' skewed samples: the merged percentiles are those of one histogram of
    /// every sample, not the average of the members' percentiles; counters add up.
    #[test]
    fn merged_histograms_recompute_percentiles() {
        let fast: Vec<u64> = (1..=900).map(|i| 1_000 + i).collect();
        let slow: Vec<u64> = (1..=100).map(|i| 500_000 + i * 1_000).collect();
        let (a, b) = (of(fast.clone()), of(slow.clone()));
        let all = of(fast.into_iter().chain(slow));
        // Over the wire and back.
        let wire = |s: StatsShare| -> StatsShare {
            serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap()
        };
        let mut m = Merged::default();
        m.add(&wire(share_of(0, &[("stage.P1", 900)], &a)));
        m.add(&wire(share_of(
            1,
            &[("stage.P1", 100), ("funnel.acked", 7)],
            &b,
        )));
        assert_eq!(m.counters["stage.P1"], 1000);
        assert_eq!(m.counters["funnel.acked"], 7);
        let (_, _, w, t) = m.histograms().next().unwrap();
        for q in [0.5, 0.9, 0.95, 0.99, 1.0] {
            assert_eq!(w.value_at_quantile(q), all.value_at_quantile(q), "q {q}");
        }
        assert_eq!(w.len(), 1000);
        assert_eq!((w.max(), w.min()), (all.max(), all.min()));
        assert_eq!(w.mean(), all.mean());
        assert_eq!(t.len(), 1000);
        // What averaging the two p95s would have said is far from the truth.
        let averaged = (a.value_at_quantile(0.95) + b.value_at_quantile(0.95)) / 2;
        assert!(averaged.abs_diff(all.value_at_quantile(0.95)) > 100_000);
    }
}
