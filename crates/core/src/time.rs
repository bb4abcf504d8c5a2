//! Wall-clock timestamps. Every stage record carries the time it happened as Unix
//! nanoseconds (UTC), which is what OpenTelemetry span events carry too.

use std::time::{SystemTime, UNIX_EPOCH};

/// The current wall-clock time as Unix nanoseconds.
pub fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// RFC 3339 in UTC with exactly three fractional digits.
const RFC3339_MILLIS: &[time::format_description::BorrowedFormatItem<'static>] = time::macros::format_description!(
    "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
);

/// Formats Unix nanoseconds as an RFC 3339 UTC time with millisecond precision
/// (`2026-12-01T12:00:01.003Z`), for humans.
pub fn format_rfc3339_millis(nanos: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(nanos))
        .ok()
        .and_then(|t| t.format(RFC3339_MILLIS).ok())
        // Unreachable: every u64 of nanoseconds is a year before 2555, and the format only
        // names components a UTC time has.
        .unwrap_or_else(|| format!("{nanos} ns after the Unix epoch"))
}

/// A duration in words, as the diagnosis and the CLI write it: `0.8 ms`, `41 ms`, `2.97 s`.
pub fn format_duration(nanos: u64) -> String {
    let ms = nanos as f64 / 1e6;
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else if ms >= 10.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{ms:.1} ms")
    }
}

/// The UTC time of day with milliseconds (`12:00:01.003`), as the diagnosis and the CLI
/// write it.
pub fn format_time_of_day(nanos: u64) -> String {
    // `2026-12-01T12:00:01.003Z` → `12:00:01.003`
    let s = format_rfc3339_millis(nanos);
    s.get(11..23).unwrap_or(&s).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(format_rfc3339_millis(0), "1970-01-01T00:00:00.000Z");
        // 2026-12-01T12:00:01.003Z
        let n = 1_796_126_401_003_000_000u64;
        assert_eq!(format_rfc3339_millis(n), "2026-12-01T12:00:01.003Z");
        assert_eq!(
            format_rfc3339_millis(951_782_400_000_000_000),
            "2000-02-29T00:00:00.000Z"
        );
    }
}
