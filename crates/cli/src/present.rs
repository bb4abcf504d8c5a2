//! Presentation helpers of the CLI: latencies and clock times in words for people
//! (`msgtrail trace`, `msgtrail stats`). The trajectory model carries nanoseconds; how they
//! read is the reader's business.

/// A latency in words for humans: `0.8 ms`, `41 ms`, `2.97 s` (the diagnosis's wording).
pub(crate) use msgtrail_core::time::format_duration as format_latency;

/// A signed duration in words: `+250 ms`, `-40 ms`, `0.3 ms`.
pub(crate) fn format_signed(nanos: i64) -> String {
    let sign = if nanos < 0 { "-" } else { "+" };
    format!("{sign}{}", format_latency(nanos.unsigned_abs()))
}

/// A measurement with its error bound: `4.1 ms ± 0.3 ms` (negative values keep their sign).
pub(crate) fn format_bounded(nanos: i64, bound_nanos: u64) -> String {
    let value = if nanos < 0 {
        format_signed(nanos)
    } else {
        format_latency(nanos.unsigned_abs())
    };
    format!("{value} ± {}", format_latency(bound_nanos))
}

/// The UTC time of day with milliseconds: `12:00:01.003`.
pub(crate) use msgtrail_core::time::format_time_of_day as format_clock;

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

    #[test]
    fn bounded_and_signed_durations() {
        assert_eq!(format_bounded(4_100_000, 300_000), "4.1 ms ± 0.3 ms");
        assert_eq!(format_bounded(-1_200_000, 300_000), "-1.2 ms ± 0.3 ms");
        assert_eq!(format_signed(250_000_000), "+250 ms");
        assert_eq!(format_signed(-40_000_000), "-40 ms");
    }
}
