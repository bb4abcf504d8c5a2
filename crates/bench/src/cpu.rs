//! Where the CPU went during a timed window: this process (broker, SDK clients, listener and
//! the bench's own drivers, which share one runtime) and its child processes (the
//! nats-server the bench started), read from `/proc` at the window's two bounds.
//!
//! Throughput says how fast; this says what each message cost, in CPU time, on each side of
//! the NATS connection — on two shared cores the ratio of two scenarios' totals bounds the
//! ratio of their throughputs. The kernel counts in clock ticks (`USER_HZ`, 100 per second
//! on every Linux architecture the project builds for: proc(5)), so a 5 s window at two
//! busy cores reads about 1,000 ticks: a resolution of 0.1 %.

use serde::{Deserialize, Serialize};
use std::time::Instant;

/// Clock ticks per second in `/proc/<pid>/stat` (`USER_HZ`; proc(5)).
const USER_HZ: f64 = 100.0;

/// CPU seconds used so far by this process and by its children (those alive now).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Sample {
    own: f64,
    children: f64,
}

impl Sample {
    fn now() -> Self {
        let own = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| parse_stat(&s))
            .map_or(0.0, |(_, ticks)| ticks);
        let me = std::process::id();
        let children: f64 = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .bytes()
                    .all(|b| b.is_ascii_digit())
            })
            .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
            .filter_map(|s| parse_stat(&s))
            .filter(|(ppid, _)| *ppid == me)
            .map(|(_, ticks)| ticks)
            .sum();
        Sample {
            own: own / USER_HZ,
            children: children / USER_HZ,
        }
    }
}

/// The parent PID and utime + stime (ticks) of a `/proc/<pid>/stat` line. The command name
/// (field 2) is in parentheses and may hold spaces, so fields are counted after its `)`.
fn parse_stat(stat: &str) -> Option<(u32, f64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) … utime(14) stime(15), i.e. indexes 0, 1 … 11, 12.
    let ppid = fields.get(1)?.parse().ok()?;
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((ppid, utime + stime))
}

/// CPU used during one measured window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuUse {
    /// The window, wall-clock seconds.
    pub seconds: f64,
    /// CPU seconds of this process (broker, clients, listener, drivers).
    pub bench_cpu_seconds: f64,
    /// CPU seconds of the child processes (the nats-server the bench started).
    pub nats_server_cpu_seconds: f64,
    /// Both, ÷ the window: how many cores were busy on average.
    pub cores_busy: f64,
    /// Microseconds of this process's CPU per completed message.
    pub bench_us_per_msg: f64,
    /// Microseconds of nats-server CPU per completed message.
    pub nats_server_us_per_msg: f64,
    /// Both.
    pub total_us_per_msg: f64,
}

impl CpuUse {
    fn between(a: Sample, b: Sample, seconds: f64) -> Self {
        let bench = (b.own - a.own).max(0.0);
        let nats = (b.children - a.children).max(0.0);
        CpuUse {
            seconds,
            bench_cpu_seconds: bench,
            nats_server_cpu_seconds: nats,
            cores_busy: (bench + nats) / seconds.max(1e-9),
            ..Default::default()
        }
    }

    /// The per-message figures for `messages` completed in the window.
    pub(crate) fn per_message(mut self, messages: u64) -> Self {
        let per = |s: f64| s * 1e6 / messages.max(1) as f64;
        self.bench_us_per_msg = per(self.bench_cpu_seconds);
        self.nats_server_us_per_msg = per(self.nats_server_cpu_seconds);
        self.total_us_per_msg = per(self.bench_cpu_seconds + self.nats_server_cpu_seconds);
        self
    }
}

/// Samples the CPU at `from` and `to` (a window's bounds) on a thread of its own, so that a
/// busy runtime does not delay the readings.
#[derive(Debug)]
pub(crate) struct CpuMeter {
    thread: std::thread::JoinHandle<Option<CpuUse>>,
}

impl CpuMeter {
    /// Starts watching the window `[from, to)`.
    pub(crate) fn watch(from: Instant, to: Instant) -> Self {
        let thread = std::thread::spawn(move || {
            sleep_until(from);
            let a = Sample::now();
            let start = Instant::now();
            sleep_until(to);
            let b = Sample::now();
            Some(CpuUse::between(a, b, start.elapsed().as_secs_f64()))
        });
        CpuMeter { thread }
    }

    /// The CPU use of the window (waits for its end), per message for `messages`.
    pub(crate) fn finish(self, messages: u64) -> Option<CpuUse> {
        self.thread
            .join()
            .ok()
            .flatten()
            .map(|c| c.per_message(messages))
    }
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn stat_fields_are_read_after_the_name() {
        let line = "4242 (nats server (x)) S 17 4242 17 0 -1 4194560 1 0 0 0 250 75 0 0 20 0 9 0";
        assert_eq!(parse_stat(line), Some((17, 325.0)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn a_busy_thread_shows_in_this_process_cpu() {
        let from = Instant::now();
        let to = from + Duration::from_millis(300);
        let meter = CpuMeter::watch(from, to);
        let mut x = 0u64;
        while Instant::now() < to {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let cpu = meter.finish(1000).expect("sampled");
        // One thread spun through the window: about 0.3 CPU seconds (ticks of 10 ms).
        assert!(cpu.bench_cpu_seconds >= 0.15, "{cpu:?}");
        assert!(cpu.bench_us_per_msg >= 150.0, "{cpu:?}");
        assert!(cpu.seconds >= 0.25, "{cpu:?}");
    }
}
