//! Repetitions: every saturated scenario runs `reps` times, interleaved (`run`(mod@crate::run)),
//! and the report carries the median of the repetitions under the existing keys, each
//! repetition's rate and the spread beside it, and the range of each ratio over paired
//! repetitions (repetition *k* of one scenario against repetition *k* of the other: they ran
//! back to back, so drift hits both alike).

use serde::{Deserialize, Serialize};

/// The median of `xs` (the mean of the middle two for an even count; 0 when empty).
pub(crate) fn median(xs: &[f64]) -> f64 {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The spread of `xs`: (max − min) ÷ median, 0 for fewer than two values or a zero median.
pub(crate) fn spread(xs: &[f64]) -> f64 {
    let m = median(xs);
    if xs.len() < 2 || m == 0.0 {
        return 0.0;
    }
    let (lo, hi) = xs
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        });
    (hi - lo) / m
}

/// The index of the repetition whose value is the median (for an even count, the lower
/// of the middle two): the repetition the other fields of a scenario are taken from.
pub(crate) fn median_index(xs: &[f64]) -> usize {
    let mut idx: Vec<usize> = (0..xs.len()).collect();
    idx.sort_by(|&a, &b| xs[a].total_cmp(&xs[b]));
    idx.get(xs.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(0)
}

/// A ratio over paired repetitions: `num[k] ÷ den[k]` for every repetition `k`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PairedRatio {
    /// The smallest of the paired ratios.
    pub min: f64,
    /// The largest.
    pub max: f64,
    /// Each repetition's ratio, in run order.
    pub reps: Vec<f64>,
}

impl PairedRatio {
    /// The ratios of `num` over `den`, paired by repetition (the shorter one bounds them).
    pub fn of(num: &[f64], den: &[f64]) -> Self {
        let reps: Vec<f64> = num.iter().zip(den).map(|(n, d)| n / d).collect();
        let min = reps.iter().copied().fold(f64::INFINITY, f64::min);
        let max = reps.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if reps.is_empty() {
            return PairedRatio::default();
        }
        PairedRatio { min, max, reps }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[7.0]), 7.0);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn spread_is_range_over_median() {
        // range 40, median 100
        assert!((spread(&[90.0, 130.0, 100.0]) - 0.4).abs() < 1e-12);
        assert_eq!(spread(&[5.0]), 0.0);
        assert_eq!(spread(&[0.0, 0.0]), 0.0);
        assert_eq!(spread(&[2.0, 2.0, 2.0]), 0.0);
    }

    #[test]
    fn median_index_points_at_the_median_repetition() {
        assert_eq!(median_index(&[30.0, 10.0, 20.0]), 2);
        assert_eq!(median_index(&[40.0, 10.0, 30.0, 20.0]), 3);
        assert_eq!(median_index(&[]), 0);
    }

    #[test]
    fn paired_ratios_pair_by_repetition() {
        let r = PairedRatio::of(&[10.0, 30.0, 20.0], &[20.0, 30.0, 10.0]);
        assert_eq!(r.reps, vec![0.5, 1.0, 2.0]);
        assert_eq!((r.min, r.max), (0.5, 2.0));
        assert_eq!(PairedRatio::of(&[], &[]), PairedRatio::default());
    }
}
