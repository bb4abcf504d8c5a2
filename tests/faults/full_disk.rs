//! Scenario 15: nats-server's JetStream store on a small filesystem (a 32 MB tmpfs) that
//! fills mid-load (another writer takes every free byte), then gets its space back. Uploads
//! meanwhile must fail with an error that says why (the broker's store timeout, below the
//! clients' request timeout, names the cause: nats-server keeps a stream unwritable after a
//! write error and answers none of its publishes until restarted), nothing may be reported
//! stored that was not (lost = 0), and once space is freed and nats-server restarted (the
//! operator's step) uploads must succeed again.
//! Root only (mounting a tmpfs), as in CI. The listener's own full disk is another scenario.

use crate::harness::*;
use crate::{blocking, oracle, TRAJECTORY_WAIT};
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A size-limited tmpfs mounted on a fresh directory, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size_mb: u32) -> Tmpfs {
        let dir = tempfile::Builder::new()
            .prefix("msgtrail-faults-js-")
            .tempdir()
            .unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mb}m"), "tmpfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "cannot mount a tmpfs on {} (the full-disk scenario runs as root, as in CI)",
            dir.path().display()
        );
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Writes `path` until the filesystem is full; returns the bytes written.
fn fill(path: &Path) -> u64 {
    let mut f = std::fs::File::create(path).expect("create the filler");
    let chunk = vec![0u8; 64 * 1024];
    let mut n = 0u64;
    while f.write_all(&chunk).is_ok() {
        n += chunk.len() as u64;
    }
    // The last partial chunk.
    let mut small = vec![0u8; 4096];
    while f.write_all(&small).is_ok() {
        n += small.len() as u64;
    }
    small.clear();
    let _ = f.flush();
    n
}

pub(crate) async fn nats_store_fills(scenario: &str) {
    let scale = Scale::pick(300, 2000);
    for rep in 1..=scale.reps {
        let tmpfs = Tmpfs::mount(32);
        let store: PathBuf = tmpfs.path().join("jetstream");
        let mut sys = System::start(SystemOptions {
            brokers: 1,
            nats_store: Some(store),
            // Below the suite's 2 s client timeout: a store JetStream never acknowledges
            // reaches the clients as the broker's error, which says why.
            broker_args: vec!["--store-timeout".into(), "1500ms".into()],
            ..Default::default()
        })
        .await;
        let run = run_load(
            &sys,
            Load {
                pace: Duration::from_millis(20),
                ..Load::new(scale.messages)
            },
        )
        .await;
        run.progress
            .wait_acked(scale.messages / 3, Duration::from_secs(60))
            .await;
        let filler = tmpfs.path().join("filler");
        let full_ms = run.history.now_ms();
        let filled = blocking(|| fill(&filler));
        tokio::time::sleep(Duration::from_secs(4)).await;
        let acked_while_full = run.progress.acked.load(std::sync::atomic::Ordering::SeqCst);
        std::fs::remove_file(&filler).expect("free the space");
        let freed_ms = run.history.now_ms();
        // nats-server keeps a stream unwritable after a write error ("Critical write
        // error", the filestore's sticky write error) and answers none of its publishes,
        // space or not, until it is restarted: the operator's step (RELIABILITY.md,
        // finding 10). Every acked upload must survive the restart.
        let Nats::Single(node) = &mut sys.nats else {
            unreachable!("one node")
        };
        blocking(|| node.restart()).expect("nats-server restarts on the same store");
        let finished = run.finish().await;
        let mut r = oracle(&sys, scenario, &scale, rep, &finished, TRAJECTORY_WAIT).await;
        let h = &finished.history;
        let storage_errors: usize = h
            .error_counts(usize::MAX)
            .iter()
            .filter(|(e, _)| {
                e.contains("did not store")
                    || e.contains("did not acknowledge the store")
                    || e.contains("storage")
                    || e.contains("resources")
            })
            .map(|(_, n)| n)
            .sum();
        r.set(
            "fault",
            json!("nats-server's JetStream store on a 32 MB tmpfs filled mid-load for 4 s, then freed"),
        )
        .set("filler_bytes", json!(filled))
        .set("full_at_ms", json!(full_ms.round()))
        .set("freed_at_ms", json!(freed_ms.round()))
        .set("acked_until_freed", json!(acked_while_full))
        .set("storage_errors", json!(storage_errors))
        .set("upload_failure_window_ms", json!(h.failure_window_ms("attempt", full_ms)))
        .set("longest_without_acked_upload_ms", json!(h.longest_gap_ms("send", full_ms)))
        .set("recovery_after_freed_ms", json!(h.recovery_ms(freed_ms)));
        r.print();
        r.assert_sound(true, &sys);
        assert!(
            storage_errors > 0,
            "uploads while the store was full failed without saying why: {:?}",
            r.json
        );
        assert_eq!(
            r.n("given_up"),
            0,
            "uploads never stored after the space was freed: {:?}\n{}",
            r.json,
            sys.diagnostics()
        );
        drop(sys);
    }
}
