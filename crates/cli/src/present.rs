//! Presentation helpers of the CLI: latencies and clock times in words for people
//! (`msgtrail trace`, `msgtrail stats`). The trajectory model carries nanoseconds; how they
//! read is the reader's business.

use msgtrail_core::time::format_rfc3339_millis;

/// A latency in words for humans: `0.8 ms`, `41 ms`, `2.97 s`.
pub fn format_latency(nanos: u64) -> String {
    let ms = nanos as f64 / 1e6;
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else if ms >= 10.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{ms:.1} ms")
    }
}

/// The UTC time of day with milliseconds: `12:00:01.003`.
pub fn format_clock(nanos: u64) -> String {
    // `2026-12-01T12:00:01.003Z` → `12:00:01.003`
    let s = format_rfc3339_millis(nanos);
    s.get(11..23).unwrap_or(&s).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_and_clock_times_read_as_before() {
        assert_eq!(format_latency(800_000), "0.8 ms");
        assert_eq!(format_latency(41_000_000), "41 ms");
        assert_eq!(format_latency(2_970_000_000), "2.97 s");
        assert_eq!(format_clock(1_796_126_401_003_000_000), "12:00:01.003");
    }
}
