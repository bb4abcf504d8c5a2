//! What the kernel says of this process, for S4: bytes written to the storage layer
//! (`/proc/self/io` `write_bytes`, every thread of the process, counted when a page is
//! dirtied, so without waiting for writeback) and the peak resident set (`VmHWM` in
//! `/proc/self/status`, reset through `/proc/self/clear_refs` when the kernel permits,
//! otherwise `VmRSS` sampled every 50 ms by a thread).
//!
//! The listener's store (fjall) exposes its size on disk but no count of bytes written, so
//! write amplification is read from the kernel around the phase.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// `write_bytes` of `/proc/self/io`: bytes this process caused to be sent to the storage
/// layer so far (`None` where the file is missing or lacks the field).
pub(crate) fn write_bytes() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    field(&io, "write_bytes:")
}

/// A `/proc/self/status` field in kB, as bytes.
fn status_kb(name: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    field(&status, name).map(|kb| kb * 1024)
}

/// The number after `name` on its line of a `/proc` file.
fn field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// How a [`PeakRss`] reading was taken.
pub(crate) const HWM_METHOD: &str = "VmHWM after clear_refs 5";
/// The fallback.
pub(crate) const SAMPLED_METHOD: &str = "VmRSS sampled every 50 ms";

/// Watches the resident set from [`PeakRss::start`] to [`PeakRss::finish`].
#[derive(Debug)]
pub(crate) struct PeakRss {
    hwm_reset: bool,
    max: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    sampler: Option<std::thread::JoinHandle<()>>,
}

impl PeakRss {
    /// Resets the kernel's high-water mark if permitted and starts the 50 ms sampler (kept
    /// either way: it is the figure when the reset is refused).
    pub(crate) fn start() -> Self {
        let hwm_reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
        let max = Arc::new(AtomicU64::new(status_kb("VmRSS:").unwrap_or(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (max, stop) = (max.clone(), stop.clone());
            std::thread::Builder::new()
                .name("bench-rss".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if let Some(rss) = status_kb("VmRSS:") {
                            max.fetch_max(rss, Ordering::Relaxed);
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                })
                .ok()
        };
        PeakRss {
            hwm_reset,
            max,
            stop,
            sampler,
        }
    }

    /// The peak resident set since the start, bytes, and how it was read.
    pub(crate) fn finish(mut self) -> (u64, &'static str) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.sampler.take() {
            let _ = t.join();
        }
        let sampled = self.max.load(Ordering::Relaxed);
        match status_kb("VmHWM:") {
            Some(hwm) if self.hwm_reset => (hwm.max(sampled), HWM_METHOD),
            _ => (sampled, SAMPLED_METHOD),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_proc_fields() {
        assert_eq!(
            field("rchar: 1\nwrite_bytes: 4096\n", "write_bytes:"),
            Some(4096)
        );
        assert_eq!(field("VmHWM:\t  13560 kB\n", "VmHWM:"), Some(13560));
        assert_eq!(field("x: 1", "write_bytes:"), None);
    }

    #[test]
    fn writing_a_file_shows_in_write_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let before = write_bytes().expect("/proc/self/io readable");
        std::fs::write(dir.path().join("f"), vec![7u8; 1 << 20]).unwrap();
        let after = write_bytes().unwrap();
        // tmpfs counts nothing: the test's temp dir must be on a disk for the figure to mean
        // anything, so this fails there, as it should.
        assert!(after - before >= 1 << 20, "{before} -> {after}");
    }

    #[test]
    fn peak_rss_sees_an_allocation() {
        let peak = PeakRss::start();
        let v = vec![1u8; 64 << 20];
        std::thread::sleep(Duration::from_millis(120));
        let (bytes, method) = peak.finish();
        assert!(bytes >= 64 << 20, "{bytes} by {method}");
        drop(v);
    }
}
