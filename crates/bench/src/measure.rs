//! Measuring: HDR latency histograms summarised as percentiles, throughput, and a progress
//! line on stderr.
//!
//! The progress line is a plain thread that rewrites one stderr line every 200 ms from an
//! atomic counter: a progress-bar crate would add dependencies for one line of output.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A latency histogram in microseconds (3 significant digits, auto-resizing).
#[derive(Debug, Clone)]
pub(crate) struct Recorder(Histogram<u64>);

impl Default for Recorder {
    fn default() -> Self {
        Recorder(Histogram::new(3).expect("3 significant digits is valid"))
    }
}

impl Recorder {
    /// Records one latency.
    pub(crate) fn record(&mut self, d: Duration) {
        self.record_micros(d.as_micros().min(u128::from(u64::MAX)) as u64);
    }

    /// Records one latency in microseconds (at least 1, the histogram's floor).
    pub(crate) fn record_micros(&mut self, us: u64) {
        // Auto-resizing histograms only fail past u64 bucket arithmetic.
        let _ = self.0.record(us.max(1));
    }

    /// Adds another recorder's samples.
    pub(crate) fn merge(&mut self, other: &Recorder) {
        let _ = self.0.add(&other.0);
    }

    /// The percentiles.
    pub(crate) fn summary(&self) -> Latency {
        let h = &self.0;
        let ms = |v: u64| v as f64 / 1000.0;
        Latency {
            count: h.len(),
            p50_ms: ms(h.value_at_quantile(0.50)),
            p90_ms: ms(h.value_at_quantile(0.90)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            max_ms: ms(h.max()),
            mean_ms: if h.is_empty() { 0.0 } else { h.mean() / 1000.0 },
        }
    }
}

/// Latency percentiles, milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Samples.
    pub count: u64,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Maximum.
    pub max_ms: f64,
    /// Mean.
    pub mean_ms: f64,
}

/// How much was done in how long.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    /// Units done (messages, records, spans, lookups).
    pub count: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// `count / seconds`.
    pub per_sec: f64,
    /// CPU used in a timed window, by this process and by nats-server, per unit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<crate::cpu::CpuUse>,
}

impl Throughput {
    /// `count` units in `elapsed`.
    pub fn new(count: u64, elapsed: Duration) -> Self {
        let seconds = elapsed.as_secs_f64().max(1e-9);
        Throughput {
            count,
            seconds,
            per_sec: count as f64 / seconds,
            cpu: None,
        }
    }
}

/// Where progress goes: a line rewritten in place on a terminal, start and end lines
/// otherwise, nothing when quiet.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    enabled: bool,
    tty: bool,
}

impl Progress {
    /// Progress on stderr when `enabled`.
    pub fn new(enabled: bool) -> Self {
        Progress {
            enabled,
            tty: std::io::stderr().is_terminal(),
        }
    }

    /// Starts a phase of `total` units (0: a timed run, no total known); count done units on
    /// the returned `Phase`.
    pub fn phase(&self, name: &str, total: u64) -> Phase {
        let done = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let start = Instant::now();
        let ticker = if self.enabled && self.tty {
            let (done, stop, name) = (done.clone(), stop.clone(), name.to_owned());
            Some(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(200));
                    let d = done.load(Ordering::Relaxed);
                    let rate = d as f64 / start.elapsed().as_secs_f64().max(1e-9);
                    let line = match (d * 100).checked_div(total) {
                        Some(pct) => format!("{d:>10}/{total:<10} {pct:>3}%"),
                        None => format!("{d:>10} (timed)      "),
                    };
                    let _ = write!(
                        std::io::stderr(),
                        "\r\x1b[2K{name:<28} {line} {rate:>12.0}/s"
                    );
                }
            }))
        } else {
            if self.enabled && total > 0 {
                eprintln!("{name}: {total} …");
            } else if self.enabled {
                eprintln!("{name}: timed …");
            }
            None
        };
        Phase {
            name: name.to_owned(),
            done,
            stop,
            ticker,
            start,
            enabled: self.enabled,
            tty: self.tty,
        }
    }
}

/// One running phase of the progress indicator; finished on drop.
#[derive(Debug)]
pub struct Phase {
    name: String,
    done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    ticker: Option<std::thread::JoinHandle<()>>,
    start: Instant,
    enabled: bool,
    tty: bool,
}

impl Phase {
    /// The shared counter of done units, for tasks to add to.
    pub fn counter(&self) -> Arc<AtomicU64> {
        self.done.clone()
    }

    /// Adds `n` done units.
    pub fn add(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
    }
}

impl Drop for Phase {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
        if self.enabled {
            let d = self.done.load(Ordering::Relaxed);
            let secs = self.start.elapsed().as_secs_f64();
            let clear = if self.tty { "\r\x1b[2K" } else { "" };
            eprintln!("{clear}{:<28} {d:>10} in {secs:.2} s", self.name);
        }
    }
}

/// Counts done units towards a total, from many tasks, and notes when the last one was done:
/// a consumer still waiting on an empty fetch must not stretch the measured time. The total
/// is known at the start of a fixed-count run ([`Countdown::new`]); a timed run opens the
/// count ([`Countdown::open`]) and closes it with what the producers sent
/// ([`Countdown::close`]) once they stop.
#[derive(Debug, Clone)]
pub(crate) struct Countdown {
    done: Arc<AtomicU64>,
    total: Arc<AtomicU64>,
    finished: Arc<std::sync::Mutex<Option<Instant>>>,
    /// A count whose time is noted too ([`Countdown::marked`]); 0: none.
    mark: u64,
    marked: Arc<std::sync::Mutex<Option<Instant>>>,
}

impl Countdown {
    /// Counts into `done` (e.g. a [`Phase::counter`]) towards `total`.
    pub(crate) fn new(done: Arc<AtomicU64>, total: u64) -> Self {
        Countdown {
            done,
            total: Arc::new(AtomicU64::new(total)),
            finished: Arc::default(),
            mark: 0,
            marked: Arc::default(),
        }
    }

    /// Also notes when `mark` units are done (the end of a warm-up counted in units).
    pub(crate) fn with_mark(mut self, mark: u64) -> Self {
        self.mark = mark;
        self
    }

    /// When `mark` units were done (`None` before, or without a mark).
    pub(crate) fn marked(&self) -> Option<Instant> {
        *self.marked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts into `done` towards a total not known yet ([`Countdown::close`] gives it).
    pub(crate) fn open(done: Arc<AtomicU64>) -> Self {
        Countdown::new(done, u64::MAX)
    }

    /// The total is `total` from now on; finished at once when it is already reached.
    pub(crate) fn close(&self, total: u64) {
        self.total.store(total, Ordering::SeqCst);
        if self.done.load(Ordering::SeqCst) >= total {
            self.note_finished();
        }
    }

    fn note_finished(&self) {
        self.finished
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(Instant::now);
    }

    /// One more unit done.
    pub(crate) fn one(&self) {
        let n = self.done.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.mark {
            *self.marked.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        }
        if n >= self.total.load(Ordering::SeqCst) {
            self.note_finished();
        }
    }

    /// Units done so far.
    pub(crate) fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// The total (`u64::MAX` while open).
    pub(crate) fn total(&self) -> u64 {
        self.total.load(Ordering::SeqCst)
    }

    /// Whether the total is reached.
    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::SeqCst) >= self.total()
    }

    /// When the last unit was done.
    pub(crate) fn finished(&self) -> Option<Instant> {
        *self.finished.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The span of a timed saturated run: a warm-up that is not counted, then the measured
/// window (wall clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timed {
    /// Load before the window, not counted.
    pub warmup: Duration,
    /// The measured window.
    pub window: Duration,
}

/// Counts a run's completions (what "completed" is depends on the scenario: an ack
/// received, a message processed and acked) in its measured window.
///
/// Timed (`Some(Timed)`): only completions between the end of the warm-up and the end of
/// the window count, and the rate is that count ÷ the window. Fixed count (`None`): every
/// completion counts, from the start to the last one.
#[derive(Debug, Clone)]
pub(crate) struct Window {
    start: Instant,
    bounds: Option<(Instant, Instant)>,
    counted: Arc<AtomicU64>,
    /// The CPU meter of a timed window ([`crate::cpu`]); taken by the first
    /// [`Window::throughput`] of the window (a sibling has none).
    cpu: Arc<std::sync::Mutex<Option<crate::cpu::CpuMeter>>>,
}

impl Window {
    /// Starts the clock now.
    pub(crate) fn start(timed: Option<Timed>) -> Self {
        let start = Instant::now();
        let bounds = timed.map(|t| (start + t.warmup, start + t.warmup + t.window));
        Window {
            start,
            bounds,
            counted: Arc::default(),
            cpu: Arc::new(std::sync::Mutex::new(
                bounds.map(|(from, to)| crate::cpu::CpuMeter::watch(from, to)),
            )),
        }
    }

    /// The same window with a count of its own (a second kind of completion in the same
    /// run, e.g. uploads confirmed beside messages acked).
    pub(crate) fn sibling(&self) -> Self {
        Window {
            counted: Arc::default(),
            cpu: Arc::default(),
            ..self.clone()
        }
    }

    /// Whether now is inside the measured window (always in a fixed-count run).
    pub(crate) fn inside(&self) -> bool {
        match self.bounds {
            None => true,
            Some((from, to)) => {
                let now = Instant::now();
                now >= from && now < to
            }
        }
    }

    /// Notes one completion now; true when it counted (inside the window).
    pub(crate) fn note(&self) -> bool {
        let inside = self.inside();
        if inside {
            self.counted.fetch_add(1, Ordering::Relaxed);
        }
        inside
    }

    /// Whether a timed run's window has ended: producers stop then. Never in a fixed-count
    /// run.
    pub(crate) fn over(&self) -> bool {
        self.bounds.is_some_and(|(_, to)| Instant::now() >= to)
    }

    /// Whether this is a timed run.
    pub(crate) fn is_timed(&self) -> bool {
        self.bounds.is_some()
    }

    /// Completions counted so far.
    pub(crate) fn counted(&self) -> u64 {
        self.counted.load(Ordering::Relaxed)
    }

    /// The rate: timed, the completions in the window ÷ the window, the window cut short
    /// at `last` when the work ran out before its end (a drained stream); fixed count, every
    /// completion ÷ the time from the start to `last`.
    ///
    /// The first call on a timed window also gives its CPU use per completion
    /// ([`crate::cpu`]; it waits for the window's end).
    pub(crate) fn throughput(&self, last: Instant) -> Throughput {
        let mut tp = match self.bounds {
            None => Throughput::new(self.counted(), last - self.start),
            Some((from, to)) if last > from => Throughput::new(self.counted(), last.min(to) - from),
            // Done before the warm-up ended: nothing counted; report the whole run.
            Some(_) => Throughput::new(0, last - self.start),
        };
        let meter = self.cpu.lock().unwrap_or_else(|p| p.into_inner()).take();
        tp.cpu = meter.and_then(|m| m.finish(tp.count));
        tp
    }
}

/// Bytes a directory's files take on disk (allocated blocks, every level): the store's size
/// (`listener.fjall` is a directory of sorted tables and a journal).
pub(crate) fn disk_bytes(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut total = 0;
    for e in entries.flatten() {
        let Ok(m) = e.metadata() else { continue };
        total += if m.is_dir() {
            disk_bytes(&e.path())
        } else {
            std::os::unix::fs::MetadataExt::blocks(&m) * 512
        };
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn countdown_notes_the_last_unit() {
        let c = Countdown::new(Arc::new(AtomicU64::new(0)), 3);
        c.one();
        c.one();
        assert!(!c.is_done() && c.finished().is_none());
        c.one();
        assert!(c.is_done() && c.finished().is_some());
        assert!(c.marked().is_none());
        let m = Countdown::new(Arc::new(AtomicU64::new(0)), 3).with_mark(2);
        m.one();
        assert!(m.marked().is_none());
        m.one();
        let at = m.marked().expect("marked at 2");
        m.one();
        assert!(m.finished().unwrap() >= at);
    }

    #[test]
    fn open_countdown_finishes_when_closed_at_what_is_done() {
        let c = Countdown::open(Arc::new(AtomicU64::new(0)));
        c.one();
        c.one();
        assert!(!c.is_done() && c.finished().is_none());
        c.close(3);
        assert!(!c.is_done() && c.finished().is_none());
        c.one();
        assert!(c.is_done() && c.finished().is_some());
        let d = Countdown::open(Arc::new(AtomicU64::new(0)));
        d.one();
        d.close(1);
        assert!(d.is_done() && d.finished().is_some());
    }

    #[test]
    fn window_counts_only_after_the_warm_up() {
        let w = Window::start(Some(Timed {
            warmup: Duration::from_millis(40),
            window: Duration::from_millis(60),
        }));
        assert!(!w.note() && !w.over());
        std::thread::sleep(Duration::from_millis(50));
        assert!(w.note() && w.note());
        std::thread::sleep(Duration::from_millis(60));
        assert!(!w.note() && w.over());
        let t = w.throughput(Instant::now());
        assert_eq!(t.count, 2);
        assert!((t.seconds - 0.06).abs() < 1e-6, "{t:?}");
        let f = Window::start(None);
        assert!(f.note() && !f.over());
        assert_eq!(f.throughput(Instant::now()).count, 1);
    }

    #[test]
    fn percentiles_in_milliseconds() {
        let mut r = Recorder::default();
        for us in 1..=1000 {
            r.record_micros(us);
        }
        let s = r.summary();
        assert_eq!(s.count, 1000);
        assert!((s.p50_ms - 0.5).abs() < 0.01, "{s:?}");
        assert!((s.p99_ms - 0.99).abs() < 0.01, "{s:?}");
    }
}
