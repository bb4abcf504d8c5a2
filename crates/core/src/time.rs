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

/// Formats Unix nanoseconds as an RFC 3339 UTC time with millisecond precision
/// (`2026-12-01T12:00:01.003Z`), for humans.
pub fn format_rfc3339_millis(nanos: u64) -> String {
    let secs = (nanos / 1_000_000_000) as i64;
    let millis = (nanos / 1_000_000) % 1000;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (h, m, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    let (y, mo, d) = civil_from_days(days);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{m:02}:{s:02}.{millis:03}Z")
}

/// Howard Hinnant's days-to-civil algorithm (proleptic Gregorian calendar).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
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
