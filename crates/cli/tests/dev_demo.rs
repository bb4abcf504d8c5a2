//! `msgtrail dev --demo` shows every feature of the page within a minute: the built binary
//! runs a real nats-server, broker and listener, and its listener's API soon holds a
//! redelivered message, a dead letter (billing's "card expired") and a stuck message (one
//! no group reads).
//!
//! Needs nats-server (`scripts/install-nats-server.sh`, or `NATS_SERVER_BIN`).

use serde_json::Value;
use std::io::{Read, Write};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};

/// A plain HTTP/1.0 GET of `path` on `base` (`http://127.0.0.1:port`): the JSON body of a 200.
fn get_json(base: &str, path: &str) -> Option<Value> {
    let addr = base.strip_prefix("http://")?.trim_end_matches('/');
    let mut s = match std::net::TcpStream::connect(addr) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("connect {addr}: {e}");
            return None;
        }
    };
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut raw = String::new();
    if let Err(e) = s.read_to_string(&mut raw) {
        eprintln!("GET {path}: {e}");
        return None;
    }
    let Some((head, body)) = raw.split_once("\r\n\r\n") else {
        eprintln!("GET {path}: {raw:?}");
        return None;
    };
    if head.split_whitespace().nth(1) != Some("200") {
        eprintln!("GET {path}: {head}");
        return None;
    }
    serde_json::from_str(body).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_dead_letters_and_sticks_within_a_minute() {
    let nats = std::env::var("NATS_SERVER_BIN").unwrap_or_else(|_| {
        panic!("set NATS_SERVER_BIN (scripts/install-nats-server.sh prints its path)")
    });
    let home = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_msgtrail"))
        .args(["dev", "--demo"])
        .env("NATS_SERVER_BIN", nats)
        .env("MSGTRAIL_DEV_FILE", home.path().join("dev.json"))
        .env("XDG_CONFIG_HOME", home.path())
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("MSGTRAIL_TRACE_UI_URL")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("msgtrail dev runs");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let started = Instant::now();
    let url = loop {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("msgtrail dev prints its listener within 30 s")
            .unwrap()
            .expect("msgtrail dev keeps running");
        if let Some(rest) = line.trim_start().strip_prefix("listener") {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    // The rest of its output is drained so that it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let mut seen = (false, false, false);
    while started.elapsed() < Duration::from_secs(60) && seen != (true, true, true) {
        let dead = get_json(&url, "/api/dead-letters").unwrap_or(Value::Null);
        let expired = dead.as_array().is_some_and(|d| {
            d.iter().any(|d| {
                d["group"] == "billing"
                    && d["last_error"]
                        .as_str()
                        .is_some_and(|e| e.contains("card expired"))
            })
        });
        let stuck = get_json(&url, "/api/messages?state=stuck&topic=payments.eu")
            .and_then(|v| v.as_array().map(|a| !a.is_empty()))
            .unwrap_or(false);
        let again = get_json(&url, "/api/messages?redelivered=true")
            .and_then(|v| v.as_array().map(|a| !a.is_empty()))
            .unwrap_or(false);
        seen = (seen.0 || expired, seen.1 || stuck, seen.2 || again);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        seen,
        (true, true, true),
        "(a dead letter for an expired card, a stuck message, a redelivery) within a minute; dead letters: {:?}",
        get_json(&url, "/api/dead-letters")
    );
    child.kill().await.unwrap();
}
