//! Observe mode end to end with an application in another language that knows nothing of
//! msgtrail: examples/python/observed_app.py (nats-py only) creates its stream, two durable
//! pull consumers with explicit acks and a durable push consumer, publishes with and
//! without `Nats-Msg-Id` and `traceparent`, acks, naks with a delay, terms, and fails a
//! poison message until max deliveries — while a listener observes the stream and exports
//! to a real OTLP receiver. Every message's trajectory has exactly the hops, attempts and
//! outcomes the app caused; the spans carry the app's trace ID where it sent a
//! `traceparent` (the root a child of the app's span), the observed message ID's otherwise.
//!
//! Needs `python3 -m pip install nats-py` (scripts/test.sh installs it); without it the test
//! fails and says so.

use msgtrail_core::observed::observed_message_id;
use msgtrail_core::trajectory::{HopKind, Trajectory};
use msgtrail_listener::ListenerConfig;
use msgtrail_test_support::{NatsServer, OtlpReceiver};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

mod common;
use common::*;

const INSTALL: &str = "python3 -m pip install nats-py";
const APP_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const APP_SPAN: &str = "b7ad6b7169203331";
const POISON_TRACE: &str = "1bf7651916cd43dd8448eb211c80319c";
const POISON_SPAN: &str = "c7ad6b7169203331";

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/python/observed_app.py")
}

/// Runs the app to its end; its JSON lines (it must succeed).
async fn run_app(url: &str) -> Vec<Value> {
    let probe = tokio::process::Command::new("python3")
        .args(["-c", "import nats"])
        .output()
        .await
        .unwrap_or_else(|e| panic!("python3 is needed for this test ({e}); then run: {INSTALL}"));
    assert!(
        probe.status.success(),
        "nats-py is missing ({}); run: {INSTALL} (scripts/test.sh does)",
        String::from_utf8_lossy(&probe.stderr).trim()
    );
    let run = tokio::process::Command::new("python3")
        .arg(script())
        .args(["--nats-url", url])
        .args(["--traceparent", &format!("00-{APP_TRACE}-{APP_SPAN}-01")])
        .args([
            "--poison-traceparent",
            &format!("00-{POISON_TRACE}-{POISON_SPAN}-01"),
        ])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("observed_app.py finishes within 60 s")
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "observed_app.py failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

/// Per deliver hop of `t`: (consumer, attempt) → its outcomes (sorted) and whether the
/// delivery itself (C1/C5) is timed.
fn deliveries(t: &Trajectory) -> BTreeMap<(String, u32), (Vec<String>, bool)> {
    t.hops
        .iter()
        .filter(|h| h.kind == HopKind::Deliver)
        .map(|h| {
            let mut outcomes: Vec<String> =
                h.events.iter().filter_map(|r| r.outcome.clone()).collect();
            outcomes.sort();
            let timed = h.events.iter().any(|r| {
                matches!(
                    r.stage,
                    msgtrail_core::Stage::PullSent | msgtrail_core::Stage::PushSent
                )
            });
            let c = h.consumer.as_ref().map(|c| c.as_str().to_owned());
            (
                (c.unwrap_or_default(), h.attempt.unwrap_or(0)),
                (outcomes, timed),
            )
        })
        .collect()
}

/// What the app did to the message at `seq`, as deliver hops: (consumer, attempt) →
/// (outcomes, timed). Acked attempts are timed (the ack metric gives the delivery time);
/// others carry only their outcome.
fn expected(seq: u64) -> BTreeMap<(String, u32), (Vec<String>, bool)> {
    let acked = |c: &str, n| ((c.to_owned(), n), (vec!["ack".to_owned()], true));
    let only = |c: &str, n, o: &[&str]| {
        let mut v: Vec<String> = o.iter().map(|s| (*s).to_owned()).collect();
        v.sort();
        ((c.to_owned(), n), (v, false))
    };
    let mut want: BTreeMap<_, _> = [acked("shipping", 1), acked("audit", 1)].into();
    let billing = match seq {
        1 => vec![acked("billing", 1)],
        2 => vec![only("billing", 1, &["nack"]), acked("billing", 2)],
        3 => vec![only("billing", 1, &["term"])],
        4 => vec![
            only("billing", 1, &["nack"]),
            // No event of its own: its ack wait expired, inferred from attempt 3.
            only("billing", 2, &["redeliver"]),
            only("billing", 3, &["nack", "dead_letter"]),
        ],
        _ => unreachable!(),
    };
    want.extend(billing);
    want
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_py_application_is_traced_without_a_code_change() {
    let server = NatsServer::start().unwrap();
    let mut rx = OtlpReceiver::start_grpc().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let handle = msgtrail_listener::start(ListenerConfig {
        batch_size: 16,
        otel: Some(export_to(&rx)),
        ..observing(server.url(), dir.path(), Duration::from_millis(200))
    })
    .await
    .unwrap();

    // The stream does not exist until the app creates it: observation starts then.
    let lines = run_app(server.url()).await;
    assert_eq!(lines.last().unwrap()["done"], true, "{lines:?}");
    let published: Vec<u64> = lines
        .iter()
        .filter_map(|l| l["published"].as_u64())
        .collect();
    assert_eq!(published, [1, 2, 3, 4]);

    let c = client(&handle);
    let get = |seq: u64| {
        let c = c.clone();
        async move {
            c.trajectory(&observed_message_id("ORDERS", seq).to_string(), None)
                .await
                .ok()
        }
    };
    for seq in 1..=4 {
        let want = expected(seq);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let t = get(seq).await;
            let got = t.as_ref().map(deliveries);
            if t.as_ref()
                .is_some_and(|t| t.observed.as_ref().is_some_and(|o| o.stored))
                && got.as_ref() == Some(&want)
            {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "message {seq}: want {want:?}, got {got:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Nothing more comes (a record counted twice, an attempt invented).
        tokio::time::sleep(Duration::from_millis(300)).await;
        let t = get(seq).await.unwrap();
        assert_eq!(deliveries(&t), want, "message {seq}");
        assert_eq!(
            t.hops.iter().filter(|h| h.kind == HopKind::Store).count(),
            1,
            "message {seq}: one store hop"
        );
        let o = t.observed.as_ref().unwrap();
        assert_eq!((o.stream.as_str(), o.stream_seq), ("ORDERS", seq));
        assert!(o.unsampled.is_empty(), "every consumer samples every ack");
        let (msg_id, trace) = match seq {
            1 => (Some("py-ok"), APP_TRACE.to_owned()),
            2 => (None, observed_message_id("ORDERS", 2).trace_hex()),
            3 => (
                Some("py-term"),
                observed_message_id("ORDERS", 3).trace_hex(),
            ),
            _ => (None, POISON_TRACE.to_owned()),
        };
        assert_eq!(o.nats_msg_id.as_deref(), msg_id, "message {seq}");
        assert_eq!(t.trace_id.as_deref(), Some(trace.as_str()), "message {seq}");
        let audit = t
            .hops
            .iter()
            .find(|h| h.consumer.as_ref().is_some_and(|c| c.as_str() == "audit"))
            .unwrap();
        assert!(
            audit.events.iter().all(|r| matches!(
                r.stage,
                msgtrail_core::Stage::PushSent | msgtrail_core::Stage::PushAckReceived
            )),
            "audit is a push consumer: {:?}",
            audit.events
        );
    }
    // Found by its Nats-Msg-Id (the stream stands for the producer).
    let t = c.trajectory("py-term", Some("ORDERS")).await.unwrap();
    assert_eq!(t.message_id, Some(observed_message_id("ORDERS", 3)));

    // The spans: per message one per hop (send, store, each delivery attempt), each once,
    // in the app's trace where it sent a traceparent.
    let traces: BTreeMap<u64, String> = (1..=4)
        .map(|seq| {
            let t = match seq {
                1 => APP_TRACE.to_owned(),
                4 => POISON_TRACE.to_owned(),
                s => observed_message_id("ORDERS", s).trace_hex(),
            };
            (seq, t)
        })
        .collect();
    let want_keys = |seq: u64| -> BTreeSet<String> {
        let mut keys: BTreeSet<String> = ["send".to_owned(), "store".to_owned()].into();
        for (c, n) in expected(seq).keys() {
            keys.insert(format!("deliver/{c}/{c}/{n}"));
        }
        keys
    };
    let total: usize = (1..=4).map(|s| want_keys(s).len()).sum();
    let mut spans = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while spans.len() < total && tokio::time::Instant::now() < deadline {
        spans.extend(rx.spans(1, Duration::from_secs(1)).await);
    }
    // Give a doubled export time to show up.
    spans.extend(rx.spans(usize::MAX, Duration::from_millis(700)).await);
    for (seq, trace) in &traces {
        let mine: Vec<_> = spans.iter().filter(|s| &s.trace_hex() == trace).collect();
        let mut keys: Vec<String> = mine
            .iter()
            .map(|s| s.attr("msgtrail.hop.key").unwrap_or_default())
            .collect();
        keys.sort();
        let want: Vec<String> = want_keys(*seq).into_iter().collect();
        assert_eq!(keys, want, "message {seq}: each hop's span, once");
        for s in &mine {
            assert_eq!(s.attr("msgtrail.observed").as_deref(), Some("true"));
            assert_eq!(
                s.attr("msgtrail.observe.stream_seq").as_deref(),
                Some(seq.to_string().as_str())
            );
        }
        let root = mine
            .iter()
            .find(|s| s.attr("msgtrail.hop.key").as_deref() == Some("send"))
            .unwrap();
        let parent = match seq {
            1 => APP_SPAN,
            4 => POISON_SPAN,
            _ => "",
        };
        assert_eq!(root.parent_hex(), parent, "message {seq}'s root");
        let audit = mine
            .iter()
            .find(|s| s.attr("msgtrail.hop.key").as_deref() == Some("deliver/audit/audit/1"))
            .unwrap();
        assert_eq!(
            audit.attr("msgtrail.delivery.mode").as_deref(),
            Some("push")
        );
    }
    assert_eq!(spans.len(), total, "no other span");
    handle.shutdown().await.unwrap();
}
