//! Observe mode end to end: a plain async-nats application that knows nothing of msgtrail
//! (its own stream, two durable pull consumers with explicit acks, acks, a nak with delay,
//! a term, a poison message reaching max deliveries) and a listener started with
//! `observe: ORDERS`; every message's trajectory has the right hops, attempts and outcomes,
//! and a message sent with a W3C `traceparent` joins that trace. Then: the spans at a real
//! OTLP receiver, a push consumer, and a listener killed (SIGKILL) and restarted while the
//! app keeps running.

use async_nats::jetstream::{self, consumer, AckKind};
use futures::StreamExt;
use msgtrail_core::observed::observed_message_id;
use msgtrail_core::trajectory::{HopKind, Trajectory};
use msgtrail_core::Stage;
use msgtrail_listener::ListenerConfig;
use msgtrail_test_support::NatsServer;
use std::time::Duration;

mod common;
use common::*;

const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// The app's pull consumer `name`: explicit acks, every ack sampled, short ack wait.
async fn app_consumer(s: &jetstream::stream::Stream, name: &str) -> consumer::PullConsumer {
    filtered_consumer(s, name, "", Duration::from_secs(1)).await
}

/// The app's pull consumer `name` on `filter` (`""`: every subject): explicit acks, every
/// ack sampled, at most 3 deliveries, `ack_wait` to ack.
async fn filtered_consumer(
    s: &jetstream::stream::Stream,
    name: &str,
    filter: &str,
    ack_wait: Duration,
) -> consumer::PullConsumer {
    s.create_consumer(consumer::pull::Config {
        durable_name: Some(name.into()),
        filter_subject: filter.into(),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait,
        max_deliver: 3,
        sample_frequency: 100,
        ..Default::default()
    })
    .await
    .unwrap()
}

/// Publishes `body` on `subject` and waits for JetStream's ack.
async fn publish(js: &jetstream::Context, subject: &'static str, body: &'static str) {
    js.publish(subject, body.into())
        .await
        .unwrap()
        .await
        .unwrap();
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
    let handle = msgtrail_listener::start(ListenerConfig {
        batch_size: 16,
        ..observing(server.url(), dir.path(), Duration::from_millis(200))
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

    let _pulling = play(&js, &audit, &billing, None).await;

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
    assert_eq!(v["streams"]["ORDERS"]["reads_messages"], true);
    assert_eq!(
        v["streams"]["ORDERS"]["consumers"]["billing"]["every_ack_sampled"],
        true
    );
    assert!(v["streams"]["ORDERS"]["consumers"]
        .get("msgtrail-listener-observe")
        .is_none());
    handle.shutdown().await.unwrap();
}

/// The app's stream `ORDERS` on `orders.>`.
async fn orders(js: &jetstream::Context) -> jetstream::stream::Stream {
    js.create_stream(jetstream::stream::Config {
        name: "ORDERS".into(),
        subjects: vec!["orders.>".into()],
        ..Default::default()
    })
    .await
    .unwrap()
}

/// The trajectory of the message at `seq` of `ORDERS`, if the store has it.
fn observed(store: &msgtrail_listener::Store, seq: u64) -> Option<Trajectory> {
    let key = observed_message_id("ORDERS", seq).to_string();
    store.trajectory(&key, now()).ok().flatten()
}

/// The spans of an observed app at a real OTLP receiver: the trace ID is the observed
/// message ID's (or the producer's, from a stored `traceparent`, the root span then a child
/// of the producer's span); there is one span per hop — send, store, a deliver per consumer
/// (a pull and a push one; its events hold the delivery and the ack) — each with the span ID the hop key gives and the
/// observe attributes; none is exported twice, even though the deliveries are stored
/// before the stored messages are read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observed_spans_reach_an_otlp_receiver() {
    use msgtrail_core::trace_ids::{hex, span_id, Hop};
    use msgtrail_test_support::OtlpReceiver;

    let server = NatsServer::start().unwrap();
    let js = nats(&server).await;
    let mut rx = OtlpReceiver::start_grpc().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The stream appears after the listener started, so its stored messages are read only
    // at discovery's next look, after the deliveries and acks: the spans must wait for them.
    let mut cfg = observing(server.url(), dir.path(), Duration::from_millis(1500));
    cfg.otel = Some(export_to(&rx));
    let handle = msgtrail_listener::start(cfg).await.unwrap();
    // The stored reader's first look (the stream not there) is over.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stream = orders(&js).await;
    let billing = app_consumer(&stream, "billing").await;
    let shipping = stream
        .create_consumer(consumer::push::Config {
            durable_name: Some("shipping".into()),
            deliver_subject: "app.shipping.deliver".into(),
            ack_policy: consumer::AckPolicy::Explicit,
            sample_frequency: 100,
            ..Default::default()
        })
        .await
        .unwrap();

    // seq 1 with the producer's traceparent, seq 2 without; billing acks both.
    let mut hs = async_nats::HeaderMap::new();
    hs.insert("Nats-Msg-Id", "ord-otlp-1");
    hs.insert("traceparent", TRACEPARENT);
    js.publish_with_headers("orders.eu", hs, "one".into())
        .await
        .unwrap()
        .await
        .unwrap();
    js.publish("orders.us", "two".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let mut b = billing.messages().await.unwrap();
    let mut p = shipping.messages().await.unwrap();
    for _ in 0..2 {
        b.next().await.unwrap().unwrap().ack().await.unwrap();
        p.next().await.unwrap().unwrap().ack().await.unwrap();
    }

    let spans = rx.spans(8, Duration::from_secs(20)).await;
    let names: Vec<(String, Option<String>)> = spans
        .iter()
        .map(|s| (s.trace_hex(), s.attr("msgtrail.hop.key")))
        .collect();
    assert_eq!(spans.len(), 8, "{names:#?}");
    let deliver_key = "deliver/billing/billing/1";
    let push_key = "deliver/shipping/shipping/1";
    for (seq, trace) in [
        (1u64, "0af7651916cd43dd8448eb211c80319c".to_owned()),
        (2, observed_message_id("ORDERS", 2).trace_hex()),
    ] {
        let id = observed_message_id("ORDERS", seq);
        let mine: Vec<_> = spans.iter().filter(|s| s.trace_hex() == trace).collect();
        let mut keys: Vec<String> = mine
            .iter()
            .map(|s| s.attr("msgtrail.hop.key").unwrap())
            .collect();
        keys.sort();
        assert_eq!(
            keys,
            [deliver_key, push_key, "send", "store"],
            "seq {seq}: {names:#?}"
        );
        for s in &mine {
            let key = s.attr("msgtrail.hop.key").unwrap();
            let hop = Hop::parse(&key).unwrap();
            assert_eq!(s.span_hex(), hex(&span_id(&id, &hop)), "seq {seq} {key}");
            assert_eq!(s.attr("msgtrail.observed").as_deref(), Some("true"));
            assert_eq!(s.attr("msgtrail.observe.stream").as_deref(), Some("ORDERS"));
            assert_eq!(s.attr("msgtrail.observe.stream_seq"), Some(seq.to_string()));
            assert_eq!(s.attr("messaging.message.id"), Some(id.to_string()));
        }
        let span = |key: &str| {
            *mine
                .iter()
                .find(|s| s.attr("msgtrail.hop.key").as_deref() == Some(key))
                .unwrap()
        };
        let (send, store) = (span("send"), span("store"));
        // The send span is the root: the producer's span is its parent when the message
        // carried a traceparent; store and deliver hang below it.
        let root_parent = if seq == 1 { "b7ad6b7169203331" } else { "" };
        assert_eq!(send.parent_hex(), root_parent, "seq {seq}");
        assert_eq!(store.parent_hex(), send.span_hex(), "seq {seq}");
        assert_eq!(store.service_name, "nats-server");
        // Pull deliveries are C5 → C8, push deliveries C1 → C4, the ack the last event.
        for (key, mode, sent, acked) in [
            (deliver_key, "pull", "C5 ", "C8 "),
            (push_key, "push", "C1 ", "C4 "),
        ] {
            let deliver = span(key);
            assert_ne!(deliver.parent_hex(), "", "seq {seq} {key}");
            assert!(
                mine.iter().any(|s| s.span_hex() == deliver.parent_hex()),
                "seq {seq} {key}: the deliver span's parent is in the trace"
            );
            assert_eq!(
                deliver.attr("msgtrail.delivery.mode").as_deref(),
                Some(mode),
                "seq {seq} {key}"
            );
            let events: Vec<&str> = deliver
                .span
                .events
                .iter()
                .map(|e| e.name.as_str())
                .collect();
            assert!(
                events.iter().any(|e| e.starts_with(sent))
                    && events.iter().any(|e| e.starts_with(acked)),
                "seq {seq} {key}: the deliver span holds the delivery and the ack: {events:?}"
            );
        }
        let store_events: Vec<&str> = store.span.events.iter().map(|e| e.name.as_str()).collect();
        assert!(
            store_events.iter().any(|e| e.starts_with("P3 ")),
            "seq {seq}: {store_events:?}"
        );
    }
    handle.shutdown().await.unwrap();
    let more = rx.spans(1, Duration::from_millis(300)).await;
    assert!(more.is_empty(), "{} spans exported twice", more.len());
}

/// A push consumer (a deliver subject, explicit acks) is observed like a pull consumer:
/// its deliveries are push deliveries (C1, C4) with their acks, naks, expired ack waits and
/// max deliveries, even when it is created after the listener started and used before
/// discovery's next look (the default 5 s interval).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_consumer_is_observed() {
    let server = NatsServer::start().unwrap();
    let js = nats(&server).await;
    let stream = orders(&js).await;
    let dir = tempfile::tempdir().unwrap();
    let handle =
        msgtrail_listener::start(observing(server.url(), dir.path(), Duration::from_secs(5)))
            .await
            .unwrap();
    // Discovery's first looks are over before the app creates its consumer.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let shipping = stream
        .create_consumer(consumer::push::Config {
            durable_name: Some("shipping".into()),
            deliver_subject: "app.shipping.deliver".into(),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(1),
            max_deliver: 3,
            sample_frequency: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    for body in ["ok", "nak-once", "slow", "poison"] {
        js.publish("orders.eu", body.into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let mut msgs = shipping.messages().await.unwrap();
    // "slow" is left unacked on its first delivery (its ack wait expires), "poison" on
    // every one (max deliveries).
    let (mut acked, mut poison) = (0, 0);
    while acked < 3 || poison < 3 {
        let m = tokio::time::timeout(Duration::from_secs(10), msgs.next())
            .await
            .expect("the push consumer gets its messages")
            .unwrap()
            .unwrap();
        let delivered = m.info().unwrap().delivered;
        match (&*m.payload, delivered) {
            (b"nak-once", 1) => m.ack_with(AckKind::Nak(None)).await.unwrap(),
            (b"slow", 1) => {}
            (b"poison", _) => poison += 1,
            _ => {
                m.ack().await.unwrap();
                acked += 1;
            }
        }
    }

    let store = handle.store().clone();
    let t = eventually("message 1 pushed and acked", || async {
        let t = observed(&store, 1)?;
        attempts(&t, "shipping")
            .iter()
            .any(|(n, e)| *n == 1 && has(e, Stage::PushAckReceived, "ack"))
            .then_some(t)
    })
    .await;
    let d: Vec<_> = t
        .hops
        .iter()
        .filter(|h| h.kind == HopKind::Deliver)
        .collect();
    assert_eq!(d.len(), 1, "{:#?}", t.hops);
    assert_eq!(
        d[0].mode,
        Some(msgtrail_core::trajectory::DeliveryMode::Push)
    );
    assert_eq!(
        d[0].events.iter().map(|r| r.stage).collect::<Vec<_>>(),
        [Stage::PushSent, Stage::PushAckReceived]
    );
    let t = eventually("message 2 naked, then pushed again and acked", || async {
        let t = observed(&store, 2)?;
        let a = attempts(&t, "shipping");
        (a.iter()
            .any(|(n, e)| *n == 1 && has(e, Stage::PushAckReceived, "nack"))
            && a.iter()
                .any(|(n, e)| *n == 2 && has(e, Stage::PushAckReceived, "ack")))
        .then_some(t)
    })
    .await;
    // No pull stage anywhere: the consumer is known as a push consumer from its first event.
    let pull = t
        .hops
        .iter()
        .flat_map(|h| &h.events)
        .any(|r| matches!(r.stage, Stage::PullSent | Stage::PullAckReceived));
    assert!(!pull, "{:#?}", t.hops);
    assert_eq!(
        t.record_count, 5,
        "P2, P3, C4 nack, C1 + C4 ack: {:#?}",
        t.hops
    );

    eventually(
        "message 3's ack wait expired, then pushed again and acked",
        || async {
            let a = attempts(&observed(&store, 3)?, "shipping");
            (a.iter()
                .any(|(n, e)| *n == 1 && has(e, Stage::Redelivery, "redeliver"))
                && a.iter()
                    .any(|(n, e)| *n == 2 && has(e, Stage::PushAckReceived, "ack")))
            .then_some(())
        },
    )
    .await;
    eventually("message 4 dead-lettered", || async {
        let a = attempts(&observed(&store, 4)?, "shipping");
        (a.iter()
            .any(|(n, e)| *n == 3 && has(e, Stage::Redelivery, "dead_letter"))
            && a.iter()
                .any(|(n, e)| *n == 2 && has(e, Stage::Redelivery, "redeliver")))
        .then_some(())
    })
    .await;
    // And the API says so.
    let (_, body) = client(&handle).get_raw("/api/observe").await.unwrap();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        v["streams"]["ORDERS"]["consumers"]["shipping"]["mode"],
        "push"
    );
    handle.shutdown().await.unwrap();
}

/// One record as the restart test compares them: (consumer, stage, attempt, outcome).
type Rec = (Option<String>, Stage, Option<u32>, Option<String>);

/// Records applied to `store` so far (the sum of its `stage.*` counters, one per distinct
/// record).
fn stage_records(store: &msgtrail_listener::Store) -> u64 {
    store
        .counters()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.starts_with("stage."))
        .map(|(_, v)| *v)
        .sum()
}

/// Not a test on its own: the restart test runs this test binary again with only this
/// test, as an observing listener process it can SIGKILL. Without the environment it does
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by a_killed_observer_restarts_without_loss_or_double_counting as its child"]
async fn child_observer_process() {
    let Some((url, dir, addr_file)) = child_settings() else {
        return;
    };
    let mut cfg = observing(&url, &dir, Duration::from_millis(200));
    // Small batches: many transactions, so the kill lands between some of them.
    cfg.batch_size = 2;
    cfg.retention_max_age = None;
    let handle = msgtrail_listener::start(cfg).await.unwrap();
    announce_address(&handle, &addr_file);
    std::future::pending::<()>().await;
}

/// The observing listener is killed with SIGKILL mid-run while the app keeps publishing,
/// consuming, acking and nak-ing, and started again on the same store: every observed
/// message ends with exactly its records (P2, P3; per consumer C5 + C8 ack, with before
/// them a C8 nack for billing's nak-ed messages, an R1 "ack wait expired" for audit's
/// unacked first attempts), none lost and none counted twice, in each trajectory and in the
/// store's counters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_observer_restarts_without_loss_or_double_counting() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    const N: u64 = 80;
    // billing naks these once; audit lets their first attempt's ack wait expire.
    let naked = |seq: u64| seq.is_multiple_of(10);
    let expired = |seq: u64| seq % 10 == 5;
    let expected = |seq: u64| 6 + u64::from(naked(seq)) + u64::from(expired(seq));
    let total: u64 = (1..=N).map(expected).sum();

    let server = NatsServer::start().unwrap();
    let js = nats(&server).await;
    let stream = orders(&js).await;
    let billing = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("billing".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            // Long: no redelivery but the nak's.
            ack_wait: Duration::from_secs(30),
            sample_frequency: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let addr_file = dir.path().join("child.addr");
    let mut child = spawn_test_child(
        "child_observer_process",
        server.url(),
        &store_dir,
        &addr_file,
    );
    let c = child_client(&addr_file).await;

    // The app: publishes N messages over about 2 s; consumes them, nak-ing every tenth
    // once (by its sequence), acking the rest.
    let published = Arc::new(AtomicU64::new(0));
    let producer = {
        let (js, published) = (js.clone(), published.clone());
        tokio::spawn(async move {
            for i in 1..=N {
                js.publish("orders.eu", format!("order {i}").into())
                    .await
                    .unwrap()
                    .await
                    .unwrap();
                published.store(i, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        })
    };
    let audit = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("audit".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(1),
            sample_frequency: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    let auditor = tokio::spawn(async move {
        let mut msgs = audit.messages().await.unwrap();
        let mut acked = 0;
        while acked < N {
            let m = msgs.next().await.unwrap().unwrap();
            let info = m.info().unwrap();
            if !(expired(info.stream_sequence) && info.delivered == 1) {
                m.ack().await.unwrap();
                acked += 1;
            }
        }
    });
    let app = tokio::spawn(async move {
        let mut msgs = billing.messages().await.unwrap();
        let mut acked = 0;
        while acked < N {
            let m = msgs.next().await.unwrap().unwrap();
            let info = m.info().unwrap();
            let (seq, delivered) = (info.stream_sequence, info.delivered);
            if naked(seq) && delivered == 1 {
                m.ack_with(AckKind::Nak(None)).await.unwrap();
            } else {
                m.ack().await.unwrap();
                acked += 1;
            }
        }
    });

    // Killed mid-run: a quarter of the records in.
    eventually(
        "the child listener applied a quarter of the records",
        || async {
            let s = c.stats(None).await.ok()?;
            (s.ingest.records >= total / 4).then_some(())
        },
    )
    .await;
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let published_at_kill = published.load(Ordering::SeqCst);
    let applied_before = {
        let store = msgtrail_listener::Store::open(&store_dir, 256, Default::default()).unwrap();
        stage_records(&store)
    };
    assert!(
        published_at_kill < N && applied_before < total,
        "the kill came too late to test anything ({published_at_kill} published, {applied_before} records applied)"
    );
    eprintln!("killed after {published_at_kill} of {N} published, {applied_before} of {total} records applied");
    // The app goes on without a listener for a while.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut cfg = observing(server.url(), &store_dir, Duration::from_millis(200));
    cfg.retention_max_age = None;
    let handle = msgtrail_listener::start(cfg).await.unwrap();
    producer.await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), app)
        .await
        .expect("the app consumes every message")
        .unwrap();
    tokio::time::timeout(Duration::from_secs(20), auditor)
        .await
        .expect("the auditor consumes every message")
        .unwrap();

    let store = handle.store().clone();
    eventually("every message's records", || async {
        (stage_records(&store) >= total).then_some(())
    })
    .await;
    // Stragglers (events redelivered after the restart) have had time to arrive.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(stage_records(&store), total, "records counted once each");
    for seq in 1..=N {
        let t = observed(&store, seq).unwrap_or_else(|| panic!("message {seq} lost"));
        // Every record once (the synthesized send hop shows the store hop's P2/P3 again).
        let mut records: Vec<Rec> = t
            .hops
            .iter()
            .filter(|h| h.kind != HopKind::Send)
            .flat_map(|h| &h.events)
            .chain(&t.other_records)
            .map(|r| {
                let c = r.consumer.as_ref().map(|c| c.to_string());
                (c, r.stage, r.attempt, r.outcome.clone())
            })
            .collect();
        records.sort();
        let s = |x: &str| Some(x.to_owned());
        let (b, a) = (s("billing"), s("audit"));
        let mut want: Vec<Rec> = vec![
            (None, Stage::UploadReceived, Some(1), s("observed")),
            (None, Stage::Stored, Some(1), s("observed")),
        ];
        let mut last = |c: &Option<String>, first: Option<(Stage, &str)>| {
            let n = match first {
                Some((stage, outcome)) => {
                    want.push((c.clone(), stage, Some(1), s(outcome)));
                    2
                }
                None => 1,
            };
            want.push((c.clone(), Stage::PullSent, Some(n), None));
            want.push((c.clone(), Stage::PullAckReceived, Some(n), s("ack")));
        };
        last(&b, naked(seq).then_some((Stage::PullAckReceived, "nack")));
        last(&a, expired(seq).then_some((Stage::Redelivery, "redeliver")));
        want.sort();
        assert_eq!(records, want, "message {seq}");
        assert_eq!(t.record_count, want.len(), "message {seq}");
    }
    handle.shutdown().await.unwrap();
}

/// The app's pull consumer `name` with `sample_freq` `sample` (0: unset) and explicit acks.
async fn sampled_consumer(
    s: &jetstream::stream::Stream,
    name: &str,
    sample: u8,
) -> consumer::PullConsumer {
    s.create_consumer(consumer::pull::Config {
        durable_name: Some(name.into()),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: Duration::from_secs(30),
        sample_frequency: sample,
        ..Default::default()
    })
    .await
    .unwrap()
}

/// Consumers nats-server does not sample every ack of (`sample_freq` unset or under 100 %)
/// are named as such by `GET /api/observe`, with the command that fixes them; their acks
/// leave no record (nats-server emits no ack metric) while their naks still do (advisories
/// are not sampled); `--observe-set-sample-freq` sets them to 100 % on the server, and the
/// API then says every ack is sampled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsampled_consumers_are_named_and_can_be_fixed() {
    let server = NatsServer::start().unwrap();
    let js = nats(&server).await;
    let stream = orders(&js).await;
    let sampled = sampled_consumer(&stream, "sampled", 100).await;
    let unsampled = sampled_consumer(&stream, "unsampled", 0).await;
    sampled_consumer(&stream, "half", 50).await;
    let dir = tempfile::tempdir().unwrap();
    let handle = msgtrail_listener::start(observing(
        server.url(),
        dir.path(),
        Duration::from_millis(200),
    ))
    .await
    .unwrap();
    let api = |h: &msgtrail_listener::ListenerHandle| {
        let c = client(h);
        async move {
            let (status, body) = c.get_raw("/api/observe").await.unwrap();
            assert_eq!(status, 200);
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            v["streams"]["ORDERS"]["consumers"].clone()
        }
    };
    let cs = eventually("the three consumers discovered", || async {
        let cs = api(&handle).await;
        (cs.as_object()?.len() == 3).then_some(cs)
    })
    .await;
    assert_eq!(cs["sampled"]["every_ack_sampled"], true);
    assert!(cs["sampled"].get("fix").is_none());
    for (name, freq) in [("unsampled", 0), ("half", 50)] {
        assert_eq!(cs[name]["every_ack_sampled"], false, "{name}");
        assert_eq!(cs[name]["sample_freq"], freq, "{name}");
        assert_eq!(
            cs[name]["fix"],
            format!("nats consumer edit ORDERS {name} --sample 100 --force"),
            "{name}"
        );
    }

    // Both consumers ack message 1; "unsampled" naks it first.
    js.publish("orders.eu", "one".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let m = sampled
        .messages()
        .await
        .unwrap()
        .next()
        .await
        .unwrap()
        .unwrap();
    m.ack().await.unwrap();
    let mut u = unsampled.messages().await.unwrap();
    let m = u.next().await.unwrap().unwrap();
    m.ack_with(AckKind::Nak(None)).await.unwrap();
    let m = u.next().await.unwrap().unwrap();
    assert_eq!(m.info().unwrap().delivered, 2);
    m.ack().await.unwrap();
    let store = handle.store().clone();
    let t = eventually("the sampled ack and the unsampled nak", || async {
        let t = observed(&store, 1)?;
        let ok = attempts(&t, "sampled")
            .iter()
            .any(|(n, e)| *n == 1 && has(e, Stage::PullAckReceived, "ack"));
        let nak = attempts(&t, "unsampled")
            .iter()
            .any(|(n, e)| *n == 1 && has(e, Stage::PullAckReceived, "nack"));
        (ok && nak).then_some(t)
    })
    .await;
    // The unsampled ack of attempt 2 leaves nothing (give it time to show up if it would).
    tokio::time::sleep(Duration::from_millis(700)).await;
    let t2 = observed(&store, 1).unwrap();
    assert_eq!(t2.record_count, t.record_count);
    let u = attempts(&t2, "unsampled");
    assert_eq!(
        u.len(),
        1,
        "only the nak-ed attempt of the unsampled consumer: {u:?}"
    );
    handle.shutdown().await.unwrap();

    // With --observe-set-sample-freq the listener raises both to 100 %.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = observing(server.url(), dir.path(), Duration::from_millis(200));
    cfg.observe.as_mut().unwrap().set_sample_freq = true;
    let handle = msgtrail_listener::start(cfg).await.unwrap();
    let cs = eventually("every consumer sampled", || async {
        let cs = api(&handle).await;
        let all = cs.as_object()?.len() == 3
            && ["sampled", "unsampled", "half"]
                .iter()
                .all(|n| cs[n]["every_ack_sampled"] == true);
        all.then_some(cs)
    })
    .await;
    assert!(cs["unsampled"].get("fix").is_none());
    for name in ["unsampled", "half"] {
        let mut c: consumer::PullConsumer = stream.get_consumer(name).await.unwrap();
        assert_eq!(
            c.info().await.unwrap().config.sample_frequency,
            100,
            "{name}"
        );
    }
    handle.shutdown().await.unwrap();
}

/// A work-queue stream is never read (a reader would take its messages away from the app
/// and keep the app's unfiltered consumers out): with the listener running first, the
/// app's consumers are still created and get every message; `GET /api/observe` says the
/// stream's messages are not read. The deliveries are exported at once (not held for a
/// stored message that cannot come), in the trace of the observed message ID, and every
/// trajectory still carries its `observed` block (stream and sequence, `stored` false, the
/// stored message named as unseen). A consumer that does not sample every ack is named on
/// the trajectories it may lack hops on (the API's and the spans'), with its fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_work_queue_stream_is_traced_from_its_deliveries_alone() {
    use msgtrail_test_support::OtlpReceiver;

    let server = NatsServer::start().unwrap();
    let js = nats(&server).await;
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: "ORDERS".into(),
            subjects: vec!["orders.>".into()],
            retention: jetstream::stream::RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut rx = OtlpReceiver::start_grpc().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = observing(server.url(), dir.path(), Duration::from_millis(200));
    cfg.otel = Some(export_to(&rx));
    let handle = msgtrail_listener::start(cfg).await.unwrap();
    // The listener's first looks are over before the app's consumers come.
    tokio::time::sleep(Duration::from_millis(600)).await;
    // An unfiltered one and one under 100 %: a work-queue stream with a consumer of its own
    // (msgtrail's) would refuse both.
    let billing = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("billing".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            filter_subject: "orders.eu.>".into(),
            sample_frequency: 100,
            ..Default::default()
        })
        .await
        .expect("the app's consumer is created beside the observer");
    let audit = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("audit".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            filter_subject: "orders.us.>".into(),
            ..Default::default()
        })
        .await
        .expect("the app's consumer is created beside the observer");
    let v = eventually("the stream found, its messages not read", || async {
        let (_, body) = client(&handle).get_raw("/api/observe").await.ok()?;
        let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
        let s = v["streams"]["ORDERS"].clone();
        (s["exists"] == true && s["consumers"].get("audit").is_some()).then_some(s)
    })
    .await;
    assert_eq!(v["reads_messages"], false, "{v}");
    assert_eq!(
        v["consumers"]["audit"]["filter_subjects"][0], "orders.us.>",
        "{v}"
    );
    let mut info = stream.clone();
    let names: Vec<String> = info
        .consumer_names()
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert!(
        !names.iter().any(|n| n.contains("observe")),
        "msgtrail made no consumer on the work queue: {names:?}"
    );
    let _ = info.info().await.unwrap();

    js.publish("orders.eu.1", "one".into())
        .await
        .unwrap()
        .await
        .unwrap();
    js.publish("orders.us.1", "two".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let mut b = billing.messages().await.unwrap();
    b.next().await.unwrap().unwrap().ack().await.unwrap();
    let mut a = audit.messages().await.unwrap();
    let m = a.next().await.unwrap().unwrap();
    assert_eq!(
        m.subject.as_str(),
        "orders.us.1",
        "the app gets its message"
    );
    m.ack_with(AckKind::Nak(None)).await.unwrap();
    a.next().await.unwrap().unwrap().ack().await.unwrap();
    let t0 = tokio::time::Instant::now();
    let spans = rx.spans(2, Duration::from_secs(20)).await;
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "exported at once, not after the hold's limit: {:?}",
        t0.elapsed()
    );
    let keys: Vec<_> = spans.iter().map(|s| s.attr("msgtrail.hop.key")).collect();
    let span = |key: &str| {
        let found: Vec<_> = spans
            .iter()
            .filter(|s| s.attr("msgtrail.hop.key").as_deref() == Some(key))
            .collect();
        assert_eq!(found.len(), 1, "{key}: {keys:?}");
        found[0]
    };
    let deliver = span("deliver/billing/billing/1");
    assert_eq!(
        deliver.trace_hex(),
        observed_message_id("ORDERS", 1).trace_hex()
    );
    assert_eq!(deliver.service_name, "nats-server");
    assert_eq!(
        deliver.attr("msgtrail.delivery.mode").as_deref(),
        Some("pull")
    );
    assert_eq!(deliver.attr("msgtrail.observed").as_deref(), Some("true"));
    assert_eq!(
        deliver.attr("msgtrail.observe.stream_seq").as_deref(),
        Some("1")
    );
    let naked = span("deliver/audit/audit/1");
    assert_eq!(
        naked.trace_hex(),
        observed_message_id("ORDERS", 2).trace_hex()
    );
    let unsampled = naked
        .attr("msgtrail.observe.unsampled_consumers")
        .expect("the unsampled consumer named on its spans");
    assert!(unsampled.contains("\"audit\""), "{unsampled}");
    assert!(!unsampled.contains("billing"), "{unsampled}");

    // The API: both trajectories observed without their stored message; the audit one
    // names its consumer as unsampled, with the fix (its ack of attempt 2 is missing).
    let c = client(&handle);
    let (_, body) = c
        .get_raw(&format!(
            "/api/messages/{}",
            observed_message_id("ORDERS", 2)
        ))
        .await
        .unwrap();
    let t: Trajectory = serde_json::from_slice(&body).unwrap();
    let o = t
        .observed
        .as_ref()
        .expect("observed block on a work-queue message");
    assert_eq!(
        (o.stream.as_str(), o.stream_seq, o.stored),
        ("ORDERS", 2, false)
    );
    assert!(
        o.unseen
            .iter()
            .any(|u| u == msgtrail_core::observed::UNSEEN_STORED),
        "{:?}",
        o.unseen
    );
    assert_eq!(
        attempts(&t, "audit").len(),
        1,
        "the unsampled ack left nothing"
    );
    let names: Vec<_> = o.unsampled.iter().map(|u| u.consumer.as_str()).collect();
    assert_eq!(names, ["audit"]);
    assert_eq!(
        o.unsampled[0].fix,
        "nats consumer edit ORDERS audit --sample 100 --force"
    );
    let (_, body) = c
        .get_raw(&format!(
            "/api/messages/{}",
            observed_message_id("ORDERS", 1)
        ))
        .await
        .unwrap();
    let t: Trajectory = serde_json::from_slice(&body).unwrap();
    let o = t
        .observed
        .as_ref()
        .expect("observed block on a work-queue message");
    assert_eq!((o.stream_seq, o.stored), (1, false));
    // Its subject is unknown (not read), so the filtered unsampled consumer may take it;
    // billing acked it and samples every ack.
    let names: Vec<_> = o.unsampled.iter().map(|u| u.consumer.as_str()).collect();
    assert_eq!(names, ["audit"]);
    // The queue holds nothing more: the app got and removed both messages.
    let mut s = stream.clone();
    assert_eq!(s.info().await.unwrap().state.messages, 0);
    handle.shutdown().await.unwrap();
}

/// The app's consumers at work on the four messages "ok", "nak-once", "term", "poison":
/// audit acks everything; billing naks "nak-once" once (with a delay) then acks it, terms
/// "term" (with `term_reason`, if given), never acks "poison" (its ack wait expires until
/// max deliveries), acks the rest. Returns billing's message stream: its pull request must
/// stay for nats-server to try a fourth delivery of "poison", which it refuses with the
/// max-deliveries advisory.
async fn play(
    js: &jetstream::Context,
    audit: &consumer::PullConsumer,
    billing: &consumer::PullConsumer,
    term_reason: Option<&str>,
) -> consumer::pull::Stream {
    let mut a = audit.messages().await.unwrap();
    for _ in 0..4 {
        a.next().await.unwrap().unwrap().ack().await.unwrap();
    }
    let mut b = billing.messages().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut poison_seen = 0;
    while tokio::time::Instant::now() < deadline && poison_seen < 3 {
        let Ok(Some(Ok(m))) = tokio::time::timeout(Duration::from_millis(500), b.next()).await
        else {
            continue;
        };
        let deliveries = m.info().unwrap().delivered;
        match (&*m.payload, deliveries, term_reason) {
            (b"nak-once", 1, _) => m
                .ack_with(AckKind::Nak(Some(Duration::from_millis(100))))
                .await
                .unwrap(),
            (b"term", _, None) => m.ack_with(AckKind::Term).await.unwrap(),
            // A term with a reason: `+TERM <reason>` on the reply subject (the protocol;
            // async-nats has no call for it).
            (b"term", _, Some(why)) => {
                let nats = js.client();
                let reply = m.reply.clone().unwrap();
                nats.publish(reply, format!("+TERM {why}").into())
                    .await
                    .unwrap();
                nats.flush().await.unwrap();
            }
            (b"poison", _, _) => poison_seen += 1,
            _ => m.ack().await.unwrap(),
        }
    }
    assert_eq!(
        poison_seen, 3,
        "the poison message is delivered max_deliver times"
    );
    b
}

/// `observed[stream].consumers[name]` of a stats snapshot, as JSON.
fn consumer_stats<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["observed"][0]["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["consumer"] == name)
        .unwrap_or_else(|| panic!("consumer {name} in {v}"))
}

/// The figures of a snapshot the test checks exactly: per consumer (deliveries,
/// redeliveries, acks, naks, terms, term reasons, max deliveries, ack waits expired, queue
/// wait and ack time sample counts since start) and the stream's stored and stuck counts.
fn exact_figures(v: &serde_json::Value) -> serde_json::Value {
    let per = |name: &str| {
        let c = consumer_stats(v, name);
        serde_json::json!([
            c["deliveries"],
            c["redeliveries"],
            c["acks"],
            c["naks"],
            c["terms"],
            c["term_reasons"],
            c["max_deliveries"],
            c["ack_wait_expired"],
            c["queue_wait"]["total"]["count"],
            c["ack_time"]["total"]["count"],
        ])
    };
    serde_json::json!({
        "stored": v["observed"][0]["stored"],
        "stuck": v["observed"][0]["stuck"],
        "billing": per("billing"),
        "audit": per("audit"),
        "lazy": per("lazy"),
    })
}

/// Per-stream and per-consumer statistics of an app that knows nothing of msgtrail: exact
/// counts per consumer (an ack, a nak then an ack, a term with a reason, a poison message
/// redelivered until max deliveries), queue-wait and ack-time percentiles within what the
/// test measured, the messages a consumer leaves unacked and one no consumer takes (stuck);
/// the same figures after a restart, through `msgtrail stats --json` (the real binary) and
/// `--stream`, and on `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_consumer_statistics_are_exact() {
    let server = NatsServer::start().unwrap();
    let js = nats(&server).await;
    let stream = orders(&js).await;
    let eu = |name| filtered_consumer(&stream, name, "orders.eu", Duration::from_secs(1));
    let (billing, audit) = (eu("billing").await, eu("audit").await);
    // lazy's ack wait is long: what it takes stays unacked.
    let lazy = filtered_consumer(&stream, "lazy", "orders.eu", Duration::from_secs(120)).await;

    let dir = tempfile::tempdir().unwrap();
    let config = || {
        let mut c = observing(server.url(), dir.path(), Duration::from_millis(200));
        // Stuck: stored, and no consumer's delivery seen within 1.5 s.
        c.deadlines.delivered_ms = 1_500;
        c
    };
    let handle = msgtrail_listener::start(config()).await.unwrap();

    let began = std::time::Instant::now();
    for body in ["ok", "nak-once", "term", "poison"] {
        publish(&js, "orders.eu", body).await;
    }
    // No consumer takes orders.us: stuck once the deadline passed.
    publish(&js, "orders.us", "nobody").await;

    // lazy takes two and never acks them.
    let mut taken = lazy.fetch().max_messages(2).messages().await.unwrap();
    let mut lazy_held = Vec::new();
    while let Some(m) = taken.next().await {
        lazy_held.push(m.unwrap());
    }
    assert_eq!(lazy_held.len(), 2);
    let pulling = play(&js, &audit, &billing, Some("bad input")).await;
    let measured_ms = began.elapsed().as_secs_f64() * 1000.0;

    // billing: ok 1 + nak-once 2 + term 1 + poison 3 deliveries; audit 4, each acked once;
    // lazy's deliveries are unseen (no ack), but it holds them unacked.
    let want = serde_json::json!({
        "stored": 5,
        "stuck": 1,
        "billing": [7, 3, 2, 1, 1, {"bad input": 1}, 1, 1, 1, 2],
        "audit": [4, 0, 4, 0, 0, null, 0, 0, 4, 4],
        "lazy": [0, 0, 0, 0, 0, null, 0, 0, 0, 0],
    });
    let c = client(&handle);
    let api = |path: &'static str| {
        let c = c.clone();
        async move {
            let (status, body) = c.get_raw(path).await.unwrap();
            assert_eq!(status, 200);
            serde_json::from_slice::<serde_json::Value>(&body).unwrap()
        }
    };
    // The last figures seen, printed when they change (what a timeout left).
    let last = std::sync::Mutex::new(serde_json::Value::Null);
    let v = eventually("the observed figures", || async {
        let v = api("/api/stats").await;
        let lazy = &consumer_stats(&v, "lazy")["now"];
        let got = serde_json::json!([exact_figures(&v), lazy]);
        if last.lock().unwrap()[0] != got[0] {
            eprintln!("observed figures now: {got}");
            *last.lock().unwrap() = got;
        }
        // Consumer info is read every discovery interval: billing's dead letter leaves its
        // unacked messages at the look after.
        let unacked = &v["observed"][0]["unacked"];
        (exact_figures(&v) == want && lazy["unacked"] == 2 && lazy["pending"] == 2 && *unacked == 2)
            .then_some(v)
    })
    .await;
    let s = &v["observed"][0];
    assert_eq!(s["stream"], "ORDERS");
    assert_eq!(s["unacked"], 2, "only lazy holds unacked messages: {s}");
    assert_eq!(s["states"]["stuck"], 1);
    let total: u64 = s["states"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(total, 5, "every observed message in one state: {s}");
    for name in ["billing", "audit"] {
        let cs = consumer_stats(&v, name);
        let now = &cs["now"];
        assert_eq!(
            (now["unacked"].as_u64(), now["pending"].as_u64()),
            (Some(0), Some(0)),
            "{name}: {cs}"
        );
        for kind in ["queue_wait", "ack_time"] {
            for period in ["window", "total"] {
                let l = &cs[kind][period];
                let f = |k: &str| l[k].as_f64().unwrap();
                assert!(
                    f("p50_ms") <= f("p90_ms")
                        && f("p90_ms") <= f("p99_ms")
                        && f("p99_ms") <= f("max_ms"),
                    "{name} {kind} {period} percentiles ordered: {l}"
                );
                // HDR keeps 2 significant digits: 1 % above what the test measured at most.
                assert!(
                    f("max_ms") <= measured_ms * 1.01,
                    "{name} {kind} {period} within the {measured_ms} ms the test measured: {l}"
                );
                assert_eq!(
                    l["count"], cs[kind]["total"]["count"],
                    "all in the window: {l}"
                );
            }
        }
    }
    // Only the stream asked for; none for a stream not observed.
    let only = api("/api/stats?stream=ORDERS").await;
    assert_eq!(exact_figures(&only), want);
    let none = api("/api/stats?stream=PAYMENTS").await;
    assert!(none.get("observed").is_none(), "{none}");
    // The metrics carry them with stream and consumer labels.
    let (_, metrics) = c.get_raw("/metrics").await.unwrap();
    let metrics = String::from_utf8(metrics).unwrap();
    for line in [
        r#"msgtrail_observed_consumer_events_total{stream="ORDERS",consumer="billing",event="delivery"} 7"#,
        r#"msgtrail_observed_consumer_events_total{stream="ORDERS",consumer="billing",event="max_deliveries"} 1"#,
        r#"msgtrail_observed_consumer_messages{stream="ORDERS",consumer="lazy",what="unacked"} 2"#,
        r#"msgtrail_observed_stream_messages{stream="ORDERS",state="stuck"} 1"#,
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }
    handle.shutdown().await.unwrap();

    // Restarted on the same store: the same counts, the window's samples refilled.
    let handle = msgtrail_listener::start(config()).await.unwrap();
    let c = client(&handle);
    let v = eventually("the figures after a restart", || async {
        let (_, body) = c.get_raw("/api/stats").await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let lazy = &v["observed"][0]["consumers"];
        let polled = lazy
            .as_array()
            .is_some_and(|cs| cs.iter().all(|c| !c["now"].is_null()));
        (v["observed"][0]["consumers"]
            .as_array()
            .is_some_and(|cs| cs.len() == 3)
            && polled)
            .then_some(v)
    })
    .await;
    assert_eq!(exact_figures(&v), want, "{v}");

    // `msgtrail stats --json --stream ORDERS`, the real binary, prints the same; the table
    // names every consumer.
    let bin = msgtrail_test_support::msgtrail_binary().unwrap();
    let url = format!("http://{}", handle.http_addr());
    let out = tokio::process::Command::new(&bin)
        .args([
            "stats",
            "--json",
            "--stream",
            "ORDERS",
            "--listener-url",
            &url,
        ])
        .env_remove("MSGTRAIL_LISTENER_TOKEN")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let cli: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(exact_figures(&cli), want, "{cli}");
    assert_eq!(consumer_stats(&cli, "lazy")["now"]["unacked"], 2);
    let out = tokio::process::Command::new(&bin)
        .args(["stats", "--listener-url", &url])
        .env_remove("MSGTRAIL_LISTENER_TOKEN")
        .env("NO_COLOR", "1")
        .output()
        .await
        .unwrap();
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        table.contains("observed stream ORDERS  stored 5 · stuck 1 · unacked 2"),
        "{table}"
    );
    let row = |name: &str| -> Vec<String> {
        table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("a row for {name} in\n{table}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        row("billing")[..10],
        ["billing", "7", "3", "2", "1", "1", "1", "1", "0", "0"]
    );
    assert_eq!(
        row("lazy")[..9],
        ["lazy", "0", "0", "0", "0", "0", "0", "0", "2"]
    );
    drop((lazy_held, pulling));
    handle.shutdown().await.unwrap();
}
