//! Observe mode end to end: a plain async-nats application that knows nothing of msgtrail
//! (its own stream, two durable pull consumers with explicit acks, acks, a nak with delay,
//! a term, a poison message reaching max deliveries) and a listener started with
//! `observe: ORDERS`; every message's trajectory has the right hops, attempts and outcomes,
//! and a message sent with a W3C `traceparent` joins that trace.

use async_nats::jetstream::{self, consumer, AckKind};
use futures::StreamExt;
use msgtrail_core::observed::observed_message_id;
use msgtrail_core::trajectory::{HopKind, Trajectory};
use msgtrail_core::Stage;
use msgtrail_listener::{ListenerConfig, ObserveConfig};
use msgtrail_test_support::NatsServer;
use std::time::Duration;

mod common;
use common::*;

const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// The app's pull consumer `name`: explicit acks, every ack sampled, short ack wait.
async fn app_consumer(s: &jetstream::stream::Stream, name: &str) -> consumer::PullConsumer {
    s.create_consumer(consumer::pull::Config {
        durable_name: Some(name.into()),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: Duration::from_secs(1),
        max_deliver: 3,
        sample_frequency: 100,
        ..Default::default()
    })
    .await
    .unwrap()
}

/// A deliver hop's events: (stage, outcome).
type Events = Vec<(Stage, Option<String>)>;

/// `(attempt, events)` of every deliver hop of `consumer`.
fn attempts(t: &Trajectory, consumer: &str) -> Vec<(u32, Events)> {
    t.hops
        .iter()
        .filter(|h| {
            h.kind == HopKind::Deliver
                && h.consumer.as_ref().is_some_and(|c| c.as_str() == consumer)
        })
        .map(|h| {
            (
                h.attempt.unwrap_or(0),
                h.events
                    .iter()
                    .map(|r| (r.stage, r.outcome.clone()))
                    .collect(),
            )
        })
        .collect()
}

fn has(events: &[(Stage, Option<String>)], stage: Stage, outcome: &str) -> bool {
    events
        .iter()
        .any(|(s, o)| *s == stage && o.as_deref() == Some(outcome))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unmodified_jetstream_app_is_traced() {
    let server = NatsServer::start().unwrap();
    let js = nats(&server).await;
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: "ORDERS".into(),
            subjects: vec!["orders.>".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    let billing = app_consumer(&stream, "billing").await;
    let audit = app_consumer(&stream, "audit").await;

    let dir = tempfile::tempdir().unwrap();
    let mut observe = ObserveConfig::streams(["ORDERS"]);
    observe.discovery_interval = Duration::from_millis(200);
    let handle = msgtrail_listener::start(ListenerConfig {
        nats: msgtrail_nats::NatsOptions::url(server.url()),
        data_dir: dir.path().to_path_buf(),
        http_addr: "127.0.0.1:0".parse().unwrap(),
        batch_size: 16,
        ack_wait: Duration::from_secs(1),
        watchdog_interval: Duration::from_millis(100),
        retention_interval: Duration::from_millis(100),
        observe: Some(observe),
        ..Default::default()
    })
    .await
    .unwrap();

    // The app publishes: with Nats-Msg-Id and traceparent, then plain messages.
    let mut hs = async_nats::HeaderMap::new();
    hs.insert("Nats-Msg-Id", "ord-1");
    hs.insert("traceparent", TRACEPARENT);
    js.publish_with_headers("orders.eu", hs, "ok".into())
        .await
        .unwrap()
        .await
        .unwrap();
    for body in ["nak-once", "term", "poison"] {
        js.publish("orders.eu", body.into())
            .await
            .unwrap()
            .await
            .unwrap();
    }

    // audit acks everything; billing naks "nak-once" once (with a delay), terms "term",
    // never acks "poison" (its ack wait expires until max deliveries).
    let mut a = audit.messages().await.unwrap();
    for _ in 0..4 {
        let m = a.next().await.unwrap().unwrap();
        m.ack().await.unwrap();
    }
    let mut b = billing.messages().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    let mut poison_seen = 0;
    while tokio::time::Instant::now() < deadline && poison_seen < 3 {
        let Ok(Some(Ok(m))) = tokio::time::timeout(Duration::from_millis(500), b.next()).await
        else {
            continue;
        };
        let deliveries = m.info().unwrap().delivered;
        match (&*m.payload, deliveries) {
            (b"nak-once", 1) => m
                .ack_with(AckKind::Nak(Some(Duration::from_millis(100))))
                .await
                .unwrap(),
            (b"term", _) => m.ack_with(AckKind::Term).await.unwrap(),
            (b"poison", _) => poison_seen += 1,
            _ => m.ack().await.unwrap(),
        }
    }
    assert_eq!(
        poison_seen, 3,
        "the poison message is delivered max_deliver times"
    );

    let store = handle.store().clone();
    let get = |seq: u64| {
        let store = store.clone();
        async move {
            let key = observed_message_id("ORDERS", seq).to_string();
            store.trajectory(&key, now()).ok().flatten()
        }
    };
    // 1: acked by both, in the app's trace.
    let t = eventually("message 1 acked by both consumers", || async {
        let t = get(1).await?;
        let ok = |c| {
            attempts(&t, c)
                .iter()
                .any(|(n, e)| *n == 1 && has(e, Stage::PullAckReceived, "ack"))
        };
        (ok("billing") && ok("audit")).then_some(t)
    })
    .await;
    assert_eq!(
        t.trace_id.as_deref(),
        Some("0af7651916cd43dd8448eb211c80319c")
    );
    let o = t.observed.as_ref().expect("an observed trajectory says so");
    assert_eq!(
        (o.stream.as_str(), o.stream_seq, o.nats_msg_id.as_deref()),
        ("ORDERS", 1, Some("ord-1"))
    );
    assert!(o.joins.is_some() && !o.unseen.is_empty());
    assert!(t.hops.iter().any(|h| h.kind == HopKind::Store));
    let deliver = t.hops.iter().find(|h| h.kind == HopKind::Deliver).unwrap();
    assert!(
        deliver.events.iter().any(|r| r.stage == Stage::PullSent),
        "an acked delivery has its time"
    );
    // Found by its Nats-Msg-Id too (the stream stands for the producer).
    let by_msg_id = store.lookup("ord-1", Some("ORDERS"), now()).unwrap();
    assert_eq!(by_msg_id.message_id, t.message_id);

    // 2: billing nak then ack on attempt 2.
    let t = eventually("message 2 naked then acked", || async {
        let t = get(2).await?;
        let b = attempts(&t, "billing");
        (b.iter()
            .any(|(n, e)| *n == 1 && has(e, Stage::PullAckReceived, "nack"))
            && b.iter()
                .any(|(n, e)| *n == 2 && has(e, Stage::PullAckReceived, "ack")))
        .then_some(t)
    })
    .await;
    assert_eq!(
        t.trace_id,
        t.message_id.map(|m| m.trace_hex()),
        "no traceparent: the trace ID is the observed ID"
    );
    assert!(t.observed.as_ref().unwrap().joins.is_none());

    // 3: terminated.
    eventually("message 3 terminated", || async {
        let t = get(3).await?;
        attempts(&t, "billing")
            .iter()
            .any(|(n, e)| *n == 1 && has(e, Stage::PullAckReceived, "term"))
            .then_some(())
    })
    .await;

    // 4: max deliveries, the ack wait of the attempt before inferred.
    let t = eventually("message 4 dead-lettered", || async {
        let t = get(4).await?;
        let b = attempts(&t, "billing");
        (b.iter()
            .any(|(n, e)| *n == 3 && has(e, Stage::Redelivery, "dead_letter"))
            && b.iter()
                .any(|(n, e)| *n == 2 && has(e, Stage::Redelivery, "redeliver")))
        .then_some(t)
    })
    .await;
    assert!(attempts(&t, "audit")
        .iter()
        .any(|(n, e)| *n == 1 && has(e, Stage::PullAckReceived, "ack")));

    // The API names the observed consumers, all sampling every ack.
    let c = client(&handle);
    let (status, body) = c.get_raw("/api/observe").await.unwrap();
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["streams"]["ORDERS"]["exists"], true);
    assert_eq!(
        v["streams"]["ORDERS"]["consumers"]["billing"]["every_ack_sampled"],
        true
    );
    assert!(v["streams"]["ORDERS"]["consumers"]
        .get("msgtrail-listener-observe")
        .is_none());
    handle.shutdown().await.unwrap();
}
