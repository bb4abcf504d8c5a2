//! The spans msgtrail exports, checked by the OpenTelemetry project's own checker: OTel
//! Weaver's `registry live-check` receives them over OTLP/gRPC from the exporter and compares
//! every attribute with the project's registry (`semconv/`, which depends on the official
//! model vendored in `semconv/official/`). No violation may remain. The same check over 30 s
//! of `msgtrail dev --demo` is `scripts/semconv-live-check.sh`.
//!
//! Weaver is not served by any package registry, so this test is `#[ignore]`d: it runs when
//! asked (`cargo test -p msgtrail-otel --test semconv -- --ignored`), with the binary named by
//! `WEAVER_BIN`. `scripts/test.sh` asks whenever `WEAVER_BIN` is set or `weaver` is on the
//! PATH, and says so. What must always hold without Weaver (every attribute defined with its
//! type, span kinds) is `tests/conventions.rs`.

mod common;

use common::*;
use msgtrail_otel::{ExportConfig, Protocol, TraceExporter};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The repository root (the live-check runs there: the registry's dependency path is
/// relative to it).
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Weaver's binary: `WEAVER_BIN`. Asked for, it must be there.
fn weaver() -> PathBuf {
    let bin = std::env::var_os("WEAVER_BIN").expect(
        "set WEAVER_BIN to OTel Weaver's binary (build it from \
         https://github.com/open-telemetry/weaver: `cargo build --release`)",
    );
    let bin = PathBuf::from(bin);
    assert!(
        bin.is_file(),
        "WEAVER_BIN={} is not a file (build OTel Weaver from \
         https://github.com/open-telemetry/weaver)",
        bin.display()
    );
    bin
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs OTel Weaver (WEAVER_BIN); scripts/test.sh runs it when Weaver is present"]
async fn weaver_live_check_finds_no_violation() {
    let weaver = weaver();
    let out = tempfile::tempdir().unwrap();
    let (otlp, admin) = (free_port(), free_port());
    let mut child = Command::new(&weaver)
        .current_dir(root())
        .args([
            "registry",
            "live-check",
            "-r",
            "semconv",
            "--include-unreferenced",
        ])
        .args(["--format", "json"])
        .args(["--otlp-grpc-port", &otlp.to_string()])
        .args(["--admin-port", &admin.to_string()])
        .args(["--inactivity-timeout", "60", "-o"])
        .arg(out.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("weaver starts");
    // Wait for its OTLP port.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", otlp)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "weaver never listened"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let exporter = TraceExporter::start(ExportConfig {
        protocol: Protocol::Grpc,
        endpoint: Some(format!("http://127.0.0.1:{otlp}")),
        batch_delay: Duration::from_millis(10),
        ..Default::default()
    })
    .unwrap();
    let spans = every_fixture_spans();
    let n = spans.len() as u64;
    assert_eq!(exporter.try_export(spans) as u64, n);
    let stats = exporter.shutdown(Duration::from_secs(10)).await;
    assert_eq!(stats.exported, n, "{stats:?}");

    stop(admin);
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    let report = std::fs::read_to_string(out.path().join("live_check.json"))
        .unwrap_or_else(|e| panic!("no report ({status}): {e}"));
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    let stats = &report["statistics"];
    assert!(
        stats["total_entities"].as_u64().unwrap_or(0) >= n,
        "weaver saw too little: {stats}"
    );
    assert_eq!(
        stats["advice_level_counts"]["violation"]
            .as_u64()
            .unwrap_or(0),
        0,
        "violations: {}",
        stats["advice_message_counts"]
    );
}

/// Asks weaver to stop and write its report (a bare HTTP/1.1 POST: no client crate needed).
fn stop(admin: u16) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", admin)).expect("admin port");
    write!(
        s,
        "POST /stop HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    assert!(resp.starts_with("HTTP/1.1 2"), "{resp}");
}
