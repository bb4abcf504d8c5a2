//! Tail sampling of trajectories: what the anchors lack.
//!
//! Every trajectory that went wrong is exported in full; healthy ones are exported at a
//! ratio and under a spans-per-second budget:
//!
//! | trajectory | decision |
//! | --- | --- |
//! | a hop is `error` (failed, nacked, timed out), or the state is failed, dead-lettered, stuck or lost | keep ([`KeepReason::Error`]) |
//! | a hop took longer than [`SamplingPolicy::slow_threshold`] | keep ([`KeepReason::Slow`]) |
//! | healthy, and its trace ID falls in the ratio, and the budget has room | keep ([`KeepReason::Sampled`]) |
//! | otherwise | drop, counted |
//!
//! The ratio test looks at the trace ID (like the SDK's `TraceIdRatioBased`), so every hop of
//! one trajectory — exported at different times, as the hops complete — gets the same answer.
//! The budget is a token bucket of spans per second that only healthy spans draw from.
//!
//! A trajectory can turn bad after some of its hops were sampled out (processing fails at the
//! end): the caller then exports all of its hops, the earlier ones included — span IDs are
//! deterministic, so they join the same trace.
//!
//! Defaults: ratio 1.0 (keep every healthy trajectory), budget 2,000 healthy spans/s, slow
//! threshold 1 s. Environment: [`ENV_RATIO`], [`ENV_BUDGET`], [`ENV_SLOW_MS`].

use crate::error::ConfigError;
use msgtrail_core::trajectory::{HopStatus, MessageState, Trajectory};
use std::time::{Duration, Instant};

/// Healthy-trajectory ratio, 0.0–1.0.
pub(crate) const ENV_RATIO: &str = "MSGTRAIL_OTEL_SAMPLE_RATIO";
/// Healthy spans per second.
pub(crate) const ENV_BUDGET: &str = "MSGTRAIL_OTEL_SPANS_PER_SECOND";
/// Slow threshold in milliseconds.
pub(crate) const ENV_SLOW_MS: &str = "MSGTRAIL_OTEL_SLOW_MS";

/// The tail-sampling policy.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingPolicy {
    /// Share of healthy trajectories to export, 0.0–1.0.
    pub healthy_ratio: f64,
    /// At most this many healthy spans per second (a token bucket with one second of burst).
    pub healthy_spans_per_second: u32,
    /// A hop slower than this makes the whole trajectory interesting.
    pub slow_threshold: Duration,
}

impl Default for SamplingPolicy {
    fn default() -> Self {
        SamplingPolicy {
            healthy_ratio: 1.0,
            healthy_spans_per_second: 2_000,
            slow_threshold: Duration::from_secs(1),
        }
    }
}

impl SamplingPolicy {
    /// The defaults overridden by `ENV_RATIO`, `ENV_BUDGET` and `ENV_SLOW_MS`.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Like [`SamplingPolicy::from_env`], reading variables through `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut p = SamplingPolicy::default();
        if let Some(v) = get(ENV_RATIO) {
            p.healthy_ratio = v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|r| (0.0..=1.0).contains(r))
                .ok_or_else(|| ConfigError::invalid(ENV_RATIO, &v, "a number from 0 to 1"))?;
        }
        if let Some(v) = get(ENV_BUDGET) {
            p.healthy_spans_per_second = v
                .trim()
                .parse()
                .map_err(|_| ConfigError::invalid(ENV_BUDGET, &v, "a whole number"))?;
        }
        if let Some(v) = get(ENV_SLOW_MS) {
            p.slow_threshold = Duration::from_millis(
                v.trim()
                    .parse()
                    .map_err(|_| ConfigError::invalid(ENV_SLOW_MS, &v, "milliseconds"))?,
            );
        }
        Ok(p)
    }
}

/// Why a trajectory is exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepReason {
    /// Something failed, timed out, or the message is stuck, lost or dead-lettered.
    Error,
    /// A hop was slower than the threshold.
    Slow,
    /// Healthy, and chosen by the ratio within the budget.
    Sampled,
}

/// A sampling decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Export the spans.
    Keep(KeepReason),
    /// Healthy and not chosen by the ratio.
    DropRatio,
    /// Healthy and chosen, but over the spans-per-second budget.
    DropBudget,
}

impl Decision {
    /// Whether to export.
    pub fn keep(self) -> bool {
        matches!(self, Decision::Keep(_))
    }
}

/// Classifies a trajectory as error, slow or healthy (no budget, no ratio).
pub(crate) fn classify(t: &Trajectory, slow_threshold: Duration) -> Option<KeepReason> {
    let bad_state = matches!(
        t.state,
        MessageState::Failed
            | MessageState::DeadLettered
            | MessageState::Stuck
            | MessageState::Lost
    );
    if bad_state || t.hops.iter().any(|h| h.status == HopStatus::Error) {
        return Some(KeepReason::Error);
    }
    let slow = slow_threshold.as_nanos() as u64;
    if t.hops
        .iter()
        .any(|h| h.latency_nanos.is_some_and(|l| l > slow))
    {
        return Some(KeepReason::Slow);
    }
    None
}

/// Whether a trace ID falls in `ratio`: its lower 64 bits against `ratio × 2⁶⁴`, as the
/// SDK's `TraceIdRatioBased` does, so the answer is the same for every hop of a trace.
pub fn in_ratio(trace_id: [u8; 16], ratio: f64) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio <= 0.0 {
        return false;
    }
    let mut low = [0u8; 8];
    low.copy_from_slice(&trace_id[8..]);
    let x = u64::from_be_bytes(low) >> 1;
    x < (ratio * (1u64 << 63) as f64) as u64
}

/// The tail sampler: the policy and its token bucket.
#[derive(Debug)]
pub struct TailSampler {
    policy: SamplingPolicy,
    tokens: f64,
    refilled: Instant,
}

impl TailSampler {
    /// A sampler with a full bucket.
    pub fn new(policy: SamplingPolicy) -> Self {
        TailSampler {
            tokens: f64::from(policy.healthy_spans_per_second),
            refilled: Instant::now(),
            policy,
        }
    }

    /// The policy.
    pub fn policy(&self) -> &SamplingPolicy {
        &self.policy
    }

    /// Decides whether to export `spans` spans of `t` now; a kept healthy decision draws
    /// them from the budget.
    pub fn decide(&mut self, t: &Trajectory, spans: usize) -> Decision {
        self.decide_at(t, spans, Instant::now())
    }

    /// [`TailSampler::decide`] at a given instant (for tests).
    pub fn decide_at(&mut self, t: &Trajectory, spans: usize, now: Instant) -> Decision {
        if let Some(reason) = classify(t, self.policy.slow_threshold) {
            return Decision::Keep(reason);
        }
        let trace = crate::mapping::trajectory_trace_id(t)
            .map(|id| id.to_bytes())
            .unwrap_or_default();
        if !in_ratio(trace, self.policy.healthy_ratio) {
            return Decision::DropRatio;
        }
        let rate = f64::from(self.policy.healthy_spans_per_second);
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(rate);
        self.refilled = now;
        let need = spans as f64;
        if self.tokens >= need {
            self.tokens -= need;
            Decision::Keep(KeepReason::Sampled)
        } else {
            Decision::DropBudget
        }
    }
}
