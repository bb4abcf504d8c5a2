//! One HDR latency histogram over a sliding window (in [`SLOTS`] slots) and since start.

use super::*;

pub(super) struct Windowed {
    pub(super) slot_nanos: u64,
    pub(super) slots: VecDeque<(u64, Histogram<u64>)>,
    pub(super) total: Histogram<u64>,
}

/// An auto-resizing histogram of microseconds with 2 significant digits (1 % error):
/// it grows with the largest value seen, ~16 KiB for values up to a minute, where 3 digits
/// would take ~130 KiB per (topic, segment, window slot).
pub(super) fn hist() -> Histogram<u64> {
    Histogram::new(2).expect("2 significant digits is valid")
}

/// Records a value; an auto-resizing histogram only fails past `u64` bucket arithmetic,
/// which microsecond latencies never reach.
pub(super) fn put(h: &mut Histogram<u64>, micros: u64) {
    let _ = h.record(micros);
}

impl Windowed {
    pub(super) fn new(window: Duration) -> Self {
        Windowed {
            slot_nanos: (window.as_nanos() as u64 / SLOTS).max(1),
            slots: VecDeque::new(),
            total: hist(),
        }
    }

    pub(super) fn expire(&mut self, now: u64) {
        let cur = now / self.slot_nanos;
        while self.slots.front().is_some_and(|(s, _)| *s + SLOTS <= cur) {
            self.slots.pop_front();
        }
    }

    pub(super) fn record(&mut self, now: u64, micros: u64) {
        let micros = micros.max(1);
        put(&mut self.total, micros);
        self.expire(now);
        let cur = now / self.slot_nanos;
        match self.slots.back_mut() {
            Some((s, h)) if *s == cur => put(h, micros),
            _ => {
                let mut h = hist();
                put(&mut h, micros);
                self.slots.push_back((cur, h));
            }
        }
    }

    pub(super) fn window(&mut self, now: u64) -> Histogram<u64> {
        self.expire(now);
        let mut merged = hist();
        for (_, h) in &self.slots {
            let _ = merged.add(h);
        }
        merged
    }
}

pub(super) fn summarize(h: &Histogram<u64>, secs: f64) -> LatencyStats {
    let ms = |micros: u64| micros as f64 / 1000.0;
    LatencyStats {
        count: h.len(),
        rate_per_sec: if secs > 0.0 {
            h.len() as f64 / secs
        } else {
            0.0
        },
        p50_ms: ms(h.value_at_quantile(0.5)),
        p90_ms: ms(h.value_at_quantile(0.9)),
        p99_ms: ms(h.value_at_quantile(0.99)),
        max_ms: ms(h.max()),
        mean_ms: h.mean() / 1000.0,
    }
}
