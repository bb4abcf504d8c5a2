//! Exponential backoff with jitter: the one schedule every retry loop of msgtrail uses (the
//! broker's JetStream setup and stage-batch republishing, the SDK's upload retries, the OTLP
//! exporter).
//!
//! A pause doubles from `first` up to `max`, and each pause is shortened by up to a fifth
//! at random, so that many clients failing at the same moment do not retry in lockstep — and
//! no pause is ever longer than the plain doubling would give.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// Largest share of a pause taken off at random, in percent.
const JITTER_PERCENT: u64 = 20;

/// An exponential backoff schedule: `first`, `2·first`, `4·first`, … at most `max`, each
/// less a random share of up to a fifth.
///
/// ```
/// use msgtrail_core::Backoff;
/// use std::time::Duration;
///
/// let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
/// let first = b.next_pause();
/// assert!(first <= Duration::from_millis(100) && first >= Duration::from_millis(80));
/// assert!(b.nth(10) <= Duration::from_secs(1));
/// ```
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    /// A schedule from `first`, doubling up to `max`.
    pub const fn new(first: Duration, max: Duration) -> Self {
        Backoff {
            first,
            max,
            attempt: 0,
        }
    }

    /// The pause before retry number `n` (0 for the first), without advancing the schedule.
    pub fn nth(&self, n: u32) -> Duration {
        jitter(self.plain(n))
    }

    /// The next pause of the schedule (the first call gives about `first`).
    pub fn next_pause(&mut self) -> Duration {
        let pause = self.nth(self.attempt);
        self.attempt = self.attempt.saturating_add(1);
        pause
    }

    /// `first · 2ⁿ`, at most `max`, without jitter.
    fn plain(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX);
        self.first.saturating_mul(factor).min(self.max)
    }
}

/// `pause` less a random share of up to [`JITTER_PERCENT`] percent.
pub(crate) fn jitter(pause: Duration) -> Duration {
    // Each RandomState is seeded from the OS's randomness (then varied per instance): enough
    // to spread retries, and no random-number crate for it.
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let nanos = pause.as_nanos().min(u128::from(u64::MAX)) as u64;
    let off = (u128::from(nanos) * u128::from(r % (JITTER_PERCENT + 1)) / 100) as u64;
    pause.saturating_sub(Duration::from_nanos(off))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_jitters_downwards_only() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_millis(500));
        for (n, plain) in [(0, 100), (1, 200), (2, 400), (3, 500), (40, 500)] {
            let plain = Duration::from_millis(plain);
            for _ in 0..50 {
                let p = b.nth(n);
                assert!(p <= plain, "retry {n}: {p:?} > {plain:?}");
                assert!(p >= plain * 4 / 5, "retry {n}: {p:?} < 80 % of {plain:?}");
            }
        }
        let spread: std::collections::HashSet<_> = (0..50).map(|_| b.nth(2)).collect();
        assert!(spread.len() > 1, "the pauses vary");
    }

    #[test]
    fn next_pause_walks_the_schedule_and_saturates() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::MAX);
        let pauses: Vec<_> = (0..4).map(|_| b.next_pause()).collect();
        for (p, plain) in pauses.iter().zip([1, 2, 4, 8]) {
            assert!(*p <= Duration::from_secs(plain) && *p >= Duration::from_secs(plain) * 4 / 5);
        }
        for _ in 0..100 {
            b.next_pause();
        }
        assert!(b.next_pause() > Duration::from_secs(1 << 20));
    }
}
