//! The listener against a real nats-server: stage records are published to the stage stream
//! by the test itself (in shuffled order, in random batches, some twice), and the answers
//! are read back through the HTTP API.

use msgtrail_core::encode_batch;
use msgtrail_core::subjects::{STAGE_STREAM, STAGE_SUBJECT};
use msgtrail_core::trajectory::{AssembleOptions, HopStatus, MessageState, Trajectory};
use msgtrail_core::Stage;
use msgtrail_core::{MessageId, RequestId, StageRecord};
use msgtrail_listener::ListenerClient;
use msgtrail_listener::ListenerConfig;
use msgtrail_listener::MessageSummary;
use msgtrail_nats::topology::{stage_stream, DEFAULT_STAGE_MAX_AGE};
use msgtrail_test_support::NatsServer;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

mod common;
use common::scenario::{Scenario, MS};
use common::*;

/// Several trajectories: success by pull, failure then success, a P1 that never reached the
/// broker, a delivery never acked, a duplicate upload, two consumer groups with push.
fn scenarios(t0: u64) -> Vec<Scenario> {
    let mut ok = Scenario::new(t0, "shop", "ord-1", "orders.eu");
    ok.stored(0).pull(10, "billing", "b-1", 1, None);
    let mut retry = Scenario::new(t0, "shop", "ord-2", "orders.eu");
    retry
        .stored(5)
        .pull(20, "billing", "b-2", 1, Some("insufficient funds"))
        .pull(60, "billing", "b-2", 2, None);
    let mut orphan = Scenario::new(t0, "shop", "ord-3", "orders.eu");
    orphan
        .upload(Stage::UploadSent, 7, Some(1))
        .upload(Stage::UploadSent, 9, Some(2));
    let mut open = Scenario::new(t0, "shop", "ord-4", "orders.us");
    open.stored(8)
        .deliver(Stage::PushSent, 20, "audit", "a-1", 1, None, None)
        .deliver(Stage::PushReceived, 21, "audit", "a-1", 1, None, None);
    let mut dup = Scenario::new(t0, "kiosk", "ord-1", "orders.eu");
    dup.stored(3).upload(Stage::Duplicate, 30, Some(2));
    let mut two = Scenario::new(t0, "shop", "ord-5", "orders.eu");
    two.stored(11);
    for (g, c) in [("billing", "b-1"), ("audit", "a-1")] {
        two.deliver(Stage::PushSent, 30, g, c, 1, None, None)
            .deliver(Stage::PushReceived, 31, g, c, 1, None, None)
            .deliver(Stage::PushAckSent, 33, g, c, 1, Some("ack"), None)
            .deliver(Stage::PushAckReceived, 34, g, c, 1, Some("ack"), None);
    }
    vec![ok, retry, orphan, open, dup, two]
}

/// Publishes `records` in random batches of 1–7 to the stage stream.
async fn publish(js: &async_nats::jetstream::Context, records: &[StageRecord], rng: &mut TestRng) {
    let mut i = 0;
    while i < records.len() {
        let n = (1 + rng.next() % 7) as usize;
        let end = (i + n).min(records.len());
        js.publish(STAGE_SUBJECT, encode_batch(&records[i..end]).into())
            .await
            .unwrap()
            .await
            .unwrap();
        i = end;
    }
}

/// A nats-server, a store directory, and a JetStream context to publish stage batches with.
async fn setup() -> (
    NatsServer,
    tempfile::TempDir,
    async_nats::jetstream::Context,
) {
    let server = NatsServer::start().unwrap();
    let js = nats(&server).await;
    // As the broker would: the stream exists before any listener runs.
    js.get_or_create_stream(stage_stream(1, DEFAULT_STAGE_MAX_AGE))
        .await
        .unwrap();
    (server, tempfile::tempdir().unwrap(), js)
}

fn config(server: &NatsServer, dir: &Path) -> ListenerConfig {
    ListenerConfig {
        nats: msgtrail_nats::NatsOptions::url(server.url()),
        data_dir: dir.to_path_buf(),
        http_addr: "127.0.0.1:0".parse().unwrap(),
        batch_size: 16,
        ack_wait: Duration::from_secs(1),
        watchdog_interval: Duration::from_millis(100),
        retention_interval: Duration::from_millis(100),
        ..Default::default()
    }
}

async fn wait_for_records(client: &ListenerClient, n: u64) {
    eventually(&format!("{n} records ingested"), || async {
        let s = client.stats(None).await.ok()?;
        (s.ingest.records >= n).then_some(())
    })
    .await;
}

/// Waits until the listener has no stage message pending or unacknowledged (redeliveries
/// after a crash included).
async fn wait_until_idle(client: &ListenerClient) {
    eventually("no pending stage messages", || async {
        let s = client.stats(None).await.ok()?;
        (s.lag.polled_at.is_some() && s.lag.pending == 0 && s.lag.ack_pending == 0).then_some(())
    })
    .await;
}

/// `n` successful pull trajectories (10 records each), shuffled together.
fn successes(n: u64, prefix: &str, rng: &mut TestRng) -> Vec<StageRecord> {
    let t0 = now();
    let mut all = Vec::new();
    for i in 0..n {
        let mut s = Scenario::new(t0, "shop", &format!("{prefix}-{i}"), "orders.eu");
        s.stored(i).pull(i + 50, "billing", "b-1", 1, None);
        all.extend(s.out);
    }
    rng.shuffle(&mut all);
    all
}

fn expected(records: &[StageRecord], payload_head: Option<&str>) -> Trajectory {
    let mut recs = records.to_vec();
    for r in &mut recs {
        if r.payload_head.is_some() {
            r.payload_head = payload_head.map(Into::into);
        }
    }
    Trajectory::assemble(recs, &AssembleOptions::default()).unwrap()
}

#[tokio::test]
async fn shuffled_batches_give_the_same_trajectories_as_in_order() {
    let (server, dir, js) = setup().await;
    let mut cfg = config(&server, dir.path());
    cfg.payload_head_bytes = 2;
    let handle = msgtrail_listener::start(cfg).await.unwrap();
    let sc = scenarios(now());
    let mut all: Vec<StageRecord> = sc.iter().flat_map(|s| s.out.clone()).collect();
    let total = all.len() as u64;
    let mut rng = TestRng(0x5eed_1234_abcd_ef01);
    rng.shuffle(&mut all);
    // Publish everything, then a few batches again (as a broker retry would).
    publish(&js, &all, &mut rng).await;
    publish(&js, &all[..10], &mut rng).await;
    let c = client(&handle);
    wait_for_records(&c, total).await;

    // Each message: the same trajectory as assembling its records in order.
    for s in &sc {
        let got = match s.out.iter().any(|r| r.message_id.is_some()) {
            true => c.trajectory(&s.id.to_string(), None).await.unwrap(),
            false => c
                .trajectory(s.req.as_str(), Some(s.producer.as_str()))
                .await
                .unwrap(),
        };
        // "hello" kept to 2 bytes: "he".
        assert_eq!(got, expected(&s.out, Some("aGU=")), "{}", s.req);
    }
    let [ok, retry, _orphan, open, dup, two] = &sc[..] else {
        unreachable!()
    };
    let t = c.trajectory(&ok.id.to_string(), None).await.unwrap();
    assert_eq!(t.state, MessageState::Consumed);
    assert_eq!(t.attrs.get("category").map(String::as_str), Some("refund"));
    let t = c.trajectory(&retry.id.to_string(), None).await.unwrap();
    assert_eq!(t.state, MessageState::Consumed);
    assert_eq!(t.groups[0].attempts, 2);
    assert!(
        t.diagnosis
            .contains("processing failed: insufficient funds"),
        "{}",
        t.diagnosis
    );
    // Found but incomplete: the orphan (by request ID) and the open delivery.
    let t = c.trajectory("ord-3", Some("shop")).await.unwrap();
    assert_eq!((t.state, t.upload_attempts), (MessageState::Sent, 2));
    assert_eq!(t.hops[0].status, HopStatus::Incomplete);
    let t = c.trajectory(&open.id.to_string(), None).await.unwrap();
    assert_eq!(t.state, MessageState::Delivered);
    assert!(t.hops.iter().any(|h| h.status == HopStatus::Incomplete));
    let t = c.trajectory(&dup.id.to_string(), None).await.unwrap();
    assert_eq!(t.duplicates, 1);
    let t = c.trajectory(&two.id.to_string(), None).await.unwrap();
    assert_eq!(t.groups.len(), 2);
    assert!(t.groups.iter().all(|g| g.state == MessageState::Consumed));
    // A request ID two producers used is ambiguous without ?producer=; found with it.
    let err = c.trajectory("ord-1", None).await.unwrap_err();
    assert!(
        matches!(
            err,
            msgtrail_listener::ListenerClientError::Api { status: 409, .. }
        ),
        "{err}"
    );
    let t = c.trajectory("ord-1", Some("kiosk")).await.unwrap();
    assert_eq!(t.message_id, Some(dup.id));
    let t = c.trajectory("ord-2", None).await.unwrap();
    assert_eq!(t.message_id, Some(retry.id));
    // Not found is not a failure, and a malformed ID is a bad request.
    let err = c
        .trajectory(&MessageId::new().to_string(), None)
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let err = c.trajectory("nobody-sent-this", None).await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let err = c.trajectory("not a valid id!", None).await.unwrap_err();
    assert!(
        matches!(
            err,
            msgtrail_listener::ListenerClientError::Api { status: 400, .. }
        ),
        "{err}"
    );

    // Statistics: nothing doubled by the repeated batches.
    let s = c.stats(None).await.unwrap();
    assert_eq!(s.ingest.records, total);
    assert!(s.ingest.repeated_records >= 10);
    assert_eq!(s.funnel.sent, 6);
    assert_eq!(s.funnel.stored, 5);
    assert_eq!(s.funnel.delivered, 4);
    assert_eq!(s.funnel.acked, 3);
    assert_eq!(s.events.duplicates, 1);
    assert_eq!(s.events.redeliveries, 1);
    assert_eq!(s.states.get(&MessageState::Consumed), Some(&3));
    assert_eq!(s.states.values().sum::<u64>(), 6);
    let e2e_count = |s: &msgtrail_listener::StatsSnapshot| {
        s.latency
            .iter()
            .find(|r| r.topic == "orders.eu" && r.segment.as_str() == "end_to_end")
            .map(|r| r.total.count)
    };
    // ok, retry, and the two groups of `two`: one sample each, whatever the order.
    eventually("four end-to-end samples", || async {
        let s = c.stats(None).await.ok()?;
        (e2e_count(&s) == Some(4)).then_some(())
    })
    .await;
    // The values themselves (synthetic times): ok 17 ms, retry 62 ms, two 23 ms twice.
    let s = c.stats(Some("orders.eu")).await.unwrap();
    let e2e = &s
        .latency
        .iter()
        .find(|r| r.segment.as_str() == "end_to_end")
        .unwrap()
        .total;
    assert!((61.0..=63.0).contains(&e2e.max_ms), "{e2e:?}");
    assert!((22.0..=24.0).contains(&e2e.p50_ms), "{e2e:?}");
    let only_us = c.stats(Some("orders.us")).await.unwrap();
    assert!(only_us.latency.iter().all(|r| r.topic == "orders.us"));
    // Per topic: orders.us holds only the open delivery; orders.eu the other five.
    assert_eq!(
        only_us.funnel,
        msgtrail_listener::Funnel {
            sent: 1,
            stored: 1,
            delivered: 1,
            acked: 0
        }
    );
    assert_eq!(only_us.states.get(&MessageState::Delivered), Some(&1));
    assert_eq!(only_us.states.values().sum::<u64>(), 1);
    let eu = c.stats(Some("orders.eu")).await.unwrap();
    assert_eq!((eu.funnel.sent, eu.funnel.acked), (5, 3));
    assert_eq!((eu.events.duplicates, eu.events.redeliveries), (1, 1));
    let all = c.stats(None).await.unwrap();
    assert_eq!(
        all.topics["orders.us"].get(&MessageState::Delivered),
        Some(&1)
    );
    assert_eq!(all.topics["orders.eu"].values().sum::<u64>(), 5);

    // Search: by topic, by state.
    let eu = c.search::<MessageSummary>("topic=orders.eu").await.unwrap();
    assert_eq!(eu.len(), 5);
    let delivered = c.search::<MessageSummary>("state=delivered").await.unwrap();
    assert_eq!(delivered.len(), 1);
    assert_eq!(delivered[0].message_id, Some(open.id));
    let bad = c
        .search::<MessageSummary>("state=nonsense")
        .await
        .unwrap_err();
    assert!(matches!(
        bad,
        msgtrail_listener::ListenerClientError::Api { status: 400, .. }
    ));

    // Prometheus text.
    let (status, body) = c.get_raw("/metrics").await.unwrap();
    let body = String::from_utf8(body).unwrap();
    assert_eq!(status, 200);
    assert!(
        body.contains("msgtrail_messages{topic=\"orders.eu\",state=\"consumed\"} 3"),
        "{body}"
    );
    assert!(
        body.contains("msgtrail_funnel_messages_total{step=\"acked\"} 3"),
        "{body}"
    );
    assert!(
        body.contains(
            "msgtrail_hop_latency_seconds_count{topic=\"orders.eu\",segment=\"end_to_end\"} 4"
        ),
        "{body}"
    );
    // A request ID generated as a UUIDv7 (as the SDK does) is found as a request ID.
    let mut gen = Scenario::new(now(), "shop", RequestId::generate().as_str(), "orders.eu");
    gen.stored(0);
    publish(&js, &gen.out, &mut rng).await;
    wait_for_records(&c, total + 4).await;
    let t = c.trajectory(gen.req.as_str(), None).await.unwrap();
    assert_eq!(t.message_id, Some(gen.id));
    handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_restart_mid_stream_loses_nothing_and_doubles_nothing() {
    let (server, dir, js) = setup().await;
    let mut rng = TestRng(42);
    let all = successes(40, "r", &mut rng);
    let total = all.len() as u64;
    let (first, second) = all.split_at(all.len() / 2);

    let handle = msgtrail_listener::start(config(&server, dir.path()))
        .await
        .unwrap();
    publish(&js, first, &mut rng).await;
    // Crash while ingest may be mid-batch: no drain, no graceful ack.
    tokio::time::sleep(Duration::from_millis(5)).await;
    handle.abort().await;
    publish(&js, second, &mut rng).await;

    let handle = msgtrail_listener::start(config(&server, dir.path()))
        .await
        .unwrap();
    let c = client(&handle);
    wait_for_records(&c, total).await;
    // Let any redelivery settle, then check nothing was counted twice.
    wait_until_idle(&c).await;
    let s = c.stats(None).await.unwrap();
    assert_eq!(s.ingest.records, total);
    assert_eq!(s.funnel.sent, 40);
    assert_eq!(s.funnel.acked, 40);
    assert_eq!(s.states.get(&MessageState::Consumed), Some(&40));
    let list = c
        .search::<MessageSummary>("topic=orders.eu&limit=1000")
        .await
        .unwrap();
    assert_eq!(list.len(), 40);
    assert!(
        list.iter().all(|m| m.records == 10),
        "every message has its 10 records once"
    );
    handle.shutdown().await.unwrap();

    // A clean restart keeps the counters, the states and the latency window.
    let handle = msgtrail_listener::start(config(&server, dir.path()))
        .await
        .unwrap();
    let s = client(&handle).stats(None).await.unwrap();
    assert_eq!((s.ingest.records, s.funnel.acked), (total, 40));
    assert_eq!(s.states.get(&MessageState::Consumed), Some(&40));
    let e2e = s
        .latency
        .iter()
        .find(|r| r.segment.as_str() == "end_to_end")
        .expect("end-to-end latencies refilled from the store");
    assert_eq!(e2e.window.count, 40);
    handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_watchdog_names_the_failure_point() {
    let (server, dir, js) = setup().await;
    let mut cfg = config(&server, dir.path());
    cfg.deadlines.stored_ms = 300;
    cfg.deadlines.acked_ms = 300;
    let handle = msgtrail_listener::start(cfg).await.unwrap();
    let t0 = now();
    let mut lost = Scenario::new(t0, "shop", "never-arrived", "orders.eu");
    lost.upload(Stage::UploadSent, 0, Some(1));
    let mut stuck = Scenario::new(t0, "shop", "never-acked", "orders.eu");
    stuck
        .stored(0)
        .deliver(Stage::PullSent, 5, "billing", "b-7", 1, None, None);
    let mut rng = TestRng(7);
    publish(&js, &lost.out, &mut rng).await;
    publish(&js, &stuck.out, &mut rng).await;
    let c = client(&handle);
    let t = eventually("lost upload", || async {
        let t = c.trajectory("never-arrived", None).await.ok()?;
        (t.state == MessageState::Lost).then_some(t)
    })
    .await;
    assert!(t.failure.unwrap().starts_with("did not reach the broker"));
    let t = eventually("stuck delivery", || async {
        let t = c.trajectory(&stuck.id.to_string(), None).await.ok()?;
        (t.state == MessageState::Stuck).then_some(t)
    })
    .await;
    assert!(
        t.failure
            .as_deref()
            .unwrap()
            .contains("stuck at consumer b-7 (group billing)"),
        "{:?}",
        t.failure
    );
    // The state index follows the watchdog.
    let s = eventually("stuck counted", || async {
        let s = c.stats(None).await.ok()?;
        (s.states.get(&MessageState::Stuck) == Some(&1)).then_some(s)
    })
    .await;
    assert_eq!(s.states.get(&MessageState::Lost), Some(&1));
    let found = c
        .search::<MessageSummary>("state=stuck&since_secs=3600")
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_dead_letter_is_the_failure_point() {
    let (server, dir, js) = setup().await;
    let handle = msgtrail_listener::start(config(&server, dir.path()))
        .await
        .unwrap();
    let mut dead = Scenario::new(now(), "shop", "poison", "orders.eu");
    dead.stored(0)
        .pull(10, "billing", "b-1", 1, Some("bad payload"))
        .pull(30, "billing", "b-1", 2, Some("bad payload"));
    // The second failure is the last: dead-lettered rather than redelivered.
    dead.out
        .retain(|r| !(r.stage == Stage::Redelivery && r.attempt == Some(2)));
    dead.deliver(
        Stage::Redelivery,
        38,
        "billing",
        "b-1",
        2,
        Some("dead_letter"),
        Some("max deliveries reached"),
    );
    let mut rng = TestRng(11);
    let mut recs = dead.out.clone();
    rng.shuffle(&mut recs);
    publish(&js, &recs, &mut rng).await;
    let c = client(&handle);
    wait_for_records(&c, recs.len() as u64).await;
    let t = c.trajectory("poison", None).await.unwrap();
    assert_eq!(t.state, MessageState::DeadLettered);
    assert_eq!(t.groups[0].attempts, 2);
    assert_eq!(t.groups[0].last_error.as_deref(), Some("bad payload"));
    let f = t.failure.unwrap();
    assert!(
        f.contains("dead-lettered by group billing after 2 attempt(s)"),
        "{f}"
    );
    let s = c.stats(None).await.unwrap();
    assert_eq!((s.events.dead_letters, s.events.redeliveries), (1, 1));
    assert_eq!(s.states.get(&MessageState::DeadLettered), Some(&1));
    assert_eq!(s.funnel.acked, 0);
    handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn retention_deletes_old_messages_and_keeps_new_ones() {
    let (server, dir, js) = setup().await;
    // First without retention, so both messages are stored whole.
    let mut cfg = config(&server, dir.path());
    cfg.retention_max_age = None;
    cfg.retention_max_bytes = None;
    let handle = msgtrail_listener::start(cfg.clone()).await.unwrap();
    let mut old = Scenario::new(
        now() - 2 * 3600 * 1_000_000_000,
        "shop",
        "old-1",
        "orders.eu",
    );
    old.stored(0).pull(10, "billing", "b-1", 1, None);
    let mut new = Scenario::new(now(), "shop", "new-1", "orders.eu");
    new.stored(0).pull(10, "billing", "b-1", 1, None);
    let mut rng = TestRng(9);
    publish(&js, &old.out, &mut rng).await;
    publish(&js, &new.out, &mut rng).await;
    let c = client(&handle);
    wait_for_records(&c, (old.out.len() + new.out.len()) as u64).await;
    assert_eq!(
        c.trajectory("old-1", None).await.unwrap().message_id,
        Some(old.id)
    );
    handle.shutdown().await.unwrap();
    // Then with a maximum age of one hour: the two-hour-old message goes.
    cfg.retention_max_age = Some(Duration::from_secs(3600));
    let handle = msgtrail_listener::start(cfg).await.unwrap();
    let c = client(&handle);
    eventually("old message deleted", || async {
        let e = c.trajectory(&old.id.to_string(), None).await.err()?;
        e.is_not_found().then_some(())
    })
    .await;
    assert!(c
        .trajectory("old-1", None)
        .await
        .unwrap_err()
        .is_not_found());
    assert_eq!(
        c.trajectory("new-1", None).await.unwrap().message_id,
        Some(new.id)
    );
    let s = c.stats(None).await.unwrap();
    assert_eq!(s.events.retention_deleted, 1);
    assert_eq!(s.states.values().sum::<u64>(), 1);
    handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn size_retention_deletes_the_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = msgtrail_listener::Store::open(dir.path(), 256, Default::default()).unwrap();
    let t0 = now();
    let mut ids = Vec::new();
    for i in 0..20 {
        let mut s = Scenario::new(t0 + i * 1000 * MS, "shop", &format!("s-{i}"), "orders.eu");
        s.stored(0);
        ids.push(s.id);
        store.apply(s.out, now()).unwrap();
    }
    let bytes = store.counters().unwrap()["bytes"];
    let out = store
        .enforce_retention(now(), None, Some(bytes / 2), 1000)
        .unwrap();
    assert!(out.deleted >= 10, "{out:?}");
    let left = store.counters().unwrap()["bytes"];
    assert!(left <= bytes / 2 / 10 * 9, "{left} of {bytes}");
    // The oldest went first; the newest stayed.
    assert!(store
        .trajectory(&ids[0].to_string(), now())
        .unwrap()
        .is_none());
    assert!(store
        .trajectory(&ids[19].to_string(), now())
        .unwrap()
        .is_some());
    let counts: BTreeMap<_, _> = store.state_totals().unwrap();
    assert_eq!(counts.values().sum::<u64>(), 20 - out.deleted);
    let by_topic = store.state_counts().unwrap();
    assert_eq!(by_topic.values().sum::<u64>(), 20 - out.deleted);
}

#[tokio::test]
async fn a_token_guards_the_api_but_not_healthz() {
    let (server, dir, _js) = setup().await;
    let mut cfg = config(&server, dir.path());
    cfg.token = Some("s3cret".into());
    let handle = msgtrail_listener::start(cfg).await.unwrap();
    let anon = client(&handle);
    assert_eq!(anon.get_raw("/healthz").await.unwrap().0, 200);
    // The page is static and open; its data calls carry the token.
    let (status, page) = anon.get_raw("/").await.unwrap();
    assert_eq!(status, 200);
    assert!(String::from_utf8(page)
        .unwrap()
        .contains("<title>msgtrail listener</title>"));
    assert_eq!(anon.get_raw("/api/config").await.unwrap().0, 401);
    assert_eq!(anon.get_raw("/metrics").await.unwrap().0, 401);
    let err = anon.stats(None).await.unwrap_err();
    assert!(matches!(
        err,
        msgtrail_listener::ListenerClientError::Api { status: 401, .. }
    ));
    let wrong = ListenerClient::new(
        &format!("http://{}", handle.http_addr()),
        Some("nope".into()),
    )
    .unwrap();
    assert!(wrong.stats(None).await.is_err());
    let good = ListenerClient::new(
        &format!("http://{}", handle.http_addr()),
        Some("s3cret".into()),
    )
    .unwrap();
    assert!(good.stats(None).await.is_ok());
    handle.shutdown().await.unwrap();
}

/// The store alone, many orders and batch splits: counters, states and latency sample
/// counts come out the same every time (nothing counted twice, nothing missed).
#[test]
fn statistics_do_not_depend_on_arrival_order() {
    for seed in 1..60u64 {
        let dir = tempfile::tempdir().unwrap();
        let store = msgtrail_listener::Store::open(dir.path(), 256, Default::default()).unwrap();
        let sc = scenarios(now());
        let mut all: Vec<StageRecord> = sc.iter().flat_map(|s| s.out.clone()).collect();
        let total = all.len() as u64;
        let mut rng = TestRng(seed * 7919 + 1);
        rng.shuffle(&mut all);
        let mut samples: BTreeMap<&str, usize> = BTreeMap::new();
        let mut i = 0;
        while i < all.len() {
            let end = (i + (1 + rng.next() % 20) as usize).min(all.len());
            // Every batch twice, as a redelivery after a crash would.
            for _ in 0..2 {
                let out = store.apply(all[i..end].to_vec(), now()).unwrap();
                for (_, seg, _, _) in &out.latencies {
                    *samples.entry(seg.as_str()).or_default() += 1;
                }
            }
            i = end;
        }
        let c = store.counters().unwrap();
        let funnel: Vec<u64> = ["sent", "stored", "delivered", "acked"]
            .iter()
            .map(|f| c[&format!("funnel.{f}")])
            .collect();
        assert_eq!(funnel, [6, 5, 4, 3], "seed {seed}");
        let per_topic = |t: &str, f: &str| c.get(&format!("topic/{t}/funnel.{f}")).copied();
        assert_eq!(
            per_topic("orders.eu", "sent"),
            Some(5),
            "seed {seed}: {c:?}"
        );
        assert_eq!(per_topic("orders.eu", "acked"), Some(3), "seed {seed}");
        assert_eq!(per_topic("orders.us", "delivered"), Some(1), "seed {seed}");
        let stages: u64 = c
            .iter()
            .filter(|(k, _)| k.starts_with("stage."))
            .map(|(_, v)| v)
            .sum();
        assert_eq!(stages, total, "seed {seed}");
        assert_eq!(
            samples.get("end_to_end"),
            Some(&4),
            "seed {seed}: {samples:?}"
        );
        assert_eq!(
            samples.get("sent_to_stored"),
            Some(&5),
            "seed {seed}: {samples:?}"
        );
        let states = store.state_totals().unwrap();
        assert_eq!(states.values().sum::<u64>(), 6, "seed {seed}: {states:?}");
        assert_eq!(states.get(&MessageState::Consumed), Some(&3), "seed {seed}");
        // The persistent per-topic counts agree with the index.
        let by_topic = store.state_counts().unwrap();
        assert_eq!(
            by_topic.values().sum::<u64>(),
            6,
            "seed {seed}: {by_topic:?}"
        );
        let us = ("orders.us".to_owned(), MessageState::Delivered);
        assert_eq!(by_topic.get(&us), Some(&1), "seed {seed}: {by_topic:?}");
    }
}

#[tokio::test]
async fn trajectories_are_exported_as_spans_once_per_hop() {
    use msgtrail_test_support::OtlpReceiver;
    let (server, dir, js) = setup().await;
    let mut rx = OtlpReceiver::start_grpc().await.unwrap();
    let mut cfg = config(&server, dir.path());
    cfg.otel = Some(export_to(&rx));
    let handle = msgtrail_listener::start(cfg).await.unwrap();
    let sc = scenarios(now());
    let [ok, retry, ..] = &sc[..] else {
        unreachable!()
    };
    let mut records: Vec<StageRecord> = ok.out.iter().chain(&retry.out).cloned().collect();
    let mut rng = TestRng(3);
    rng.shuffle(&mut records);
    publish(&js, &records, &mut rng).await;
    // ok: send, store, deliver, process; retry: send, store, 2 x (deliver, process).
    let spans = rx.spans(10, Duration::from_secs(20)).await;
    let mut keys: Vec<(String, String)> = spans
        .iter()
        .map(|s| (s.trace_hex(), s.span.name.clone()))
        .collect();
    keys.sort();
    assert_eq!(spans.len(), 10, "{keys:#?}");
    assert_eq!(
        spans
            .iter()
            .filter(|s| s.trace_hex() == ok.id.trace_hex())
            .count(),
        4
    );
    assert_eq!(
        spans
            .iter()
            .filter(|s| s.trace_hex() == retry.id.trace_hex())
            .count(),
        6
    );
    // Every span once: distinct span IDs.
    let ids: std::collections::BTreeSet<String> = spans.iter().map(|s| s.span_hex()).collect();
    assert_eq!(ids.len(), 10);
    let (status, metrics) = client(&handle).get_raw("/metrics").await.unwrap();
    assert_eq!(status, 200);
    let metrics = String::from_utf8(metrics).unwrap();
    assert!(
        metrics.contains("msgtrail_otel_spans_exported_total"),
        "{metrics}"
    );
    handle.shutdown().await.unwrap();
    // Nothing more after the drain: no hop was exported twice.
    let more = rx.spans(1, Duration::from_millis(300)).await;
    assert!(more.is_empty(), "{} extra spans", more.len());
}

/// Not a test on its own: the kill -9 test runs this test binary again with only this
/// test, as a listener process it can SIGKILL. Without the environment it does nothing.
#[tokio::test]
#[ignore = "run by a_kill_9_mid_stream_loses_nothing as its child process"]
async fn child_listener_process() {
    let Some((url, dir, addr_file)) = child_settings() else {
        return;
    };
    let mut cfg = ListenerConfig {
        nats: msgtrail_nats::NatsOptions::url(url),
        data_dir: dir,
        http_addr: "127.0.0.1:0".parse().unwrap(),
        // Small batches: many transactions, so the kill lands between some of them.
        batch_size: 2,
        ack_wait: Duration::from_secs(1),
        ..Default::default()
    };
    cfg.retention_max_age = None;
    let handle = msgtrail_listener::start(cfg).await.unwrap();
    announce_address(&handle, &addr_file);
    std::future::pending::<()>().await;
}

fn spawn_child(server: &NatsServer, dir: &Path, addr_file: &Path) -> std::process::Child {
    spawn_test_child("child_listener_process", server.url(), dir, addr_file)
}

#[tokio::test]
async fn a_kill_9_mid_stream_loses_nothing_and_doubles_nothing() {
    let (server, dir, js) = setup().await;
    let addr_file = dir.path().join("child.addr");
    let store_dir = dir.path().join("store");
    let mut rng = TestRng(99);
    let all = successes(100, "k", &mut rng);
    let total = all.len() as u64;
    publish(&js, &all, &mut rng).await;

    let mut child = spawn_child(&server, &store_dir, &addr_file);
    let c = child_client(&addr_file).await;
    // Kill it while it is still applying the backlog.
    eventually("some records applied", || async {
        let s = c.stats(None).await.ok()?;
        (s.ingest.records > 0).then_some(())
    })
    .await;
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let applied_before = {
        let store = msgtrail_listener::Store::open(&store_dir, 256, Default::default()).unwrap();
        let c = store.counters().unwrap();
        c.iter()
            .filter(|(k, _)| k.starts_with("stage."))
            .map(|(_, v)| *v)
            .sum::<u64>()
    };
    assert!(
        applied_before < total,
        "the kill came too late to test anything"
    );

    let mut child = spawn_child(&server, &store_dir, &addr_file);
    let c = child_client(&addr_file).await;
    wait_for_records(&c, total).await;
    wait_until_idle(&c).await;
    let s = c.stats(None).await.unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(s.ingest.records, total);
    assert_eq!((s.funnel.sent, s.funnel.acked), (100, 100));
    assert_eq!(s.states.get(&MessageState::Consumed), Some(&100));
    let store = msgtrail_listener::Store::open(&store_dir, 256, Default::default()).unwrap();
    let list = store
        .search(&msgtrail_listener::SearchQuery {
            limit: Some(1000),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(list.len(), 100);
    assert!(list.iter().all(|m| m.records == 10));
}

/// The in-flight cache changes nothing: stores with no cache, a tiny one that evicts all
/// the time (and restarts midway) and the default one give the same outcome for every
/// batch, the same summaries, counters and trajectories; the tiny one stays within its
/// bound and counts its evictions.
#[test]
fn the_in_flight_cache_changes_nothing() {
    use msgtrail_listener::{SearchQuery, Store};
    for seed in 1..25u64 {
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let caps = [0usize, 2, 1_000];
        let open = |i: usize| {
            Store::open(dirs[i].path(), 256, Default::default())
                .unwrap()
                .cache_capacity(caps[i])
        };
        let mut stores: Vec<Store> = (0..3).map(open).collect();
        let t = now();
        let sc = scenarios(t);
        let mut all: Vec<StageRecord> = sc.iter().flat_map(|s| s.out.clone()).collect();
        let mut rng = TestRng(seed * 104_729 + 3);
        rng.shuffle(&mut all);
        let (mut i, mut batch) = (0, 0);
        let mut evictions = 0;
        while i < all.len() {
            let end = (i + (1 + rng.next() % 9) as usize).min(all.len());
            for _ in 0..2 {
                let outs: Vec<_> = stores
                    .iter()
                    .map(|s| s.apply(all[i..end].to_vec(), t).unwrap())
                    .collect();
                assert_eq!(outs[0], outs[1], "seed {seed} batch {batch}");
                assert_eq!(outs[0], outs[2], "seed {seed} batch {batch}");
            }
            batch += 1;
            if batch == 3 {
                // The watchdog an hour later: stuck marks go through the cache too.
                let outs: Vec<_> = stores
                    .iter()
                    .map(|s| s.check_deadlines(t + 3600 * 1000 * MS, 0, 1000).unwrap())
                    .collect();
                assert_eq!(outs[0], outs[1], "seed {seed}");
                assert_eq!(outs[0], outs[2], "seed {seed}");
            }
            if batch == 4 {
                // A restart of the tiny-cache store: it starts empty and reads back.
                evictions += stores[1].cache_stats().evictions;
                drop(stores.remove(1));
                stores.insert(1, open(1));
            }
            i = end;
        }
        let c = stores[0].cache_stats();
        assert_eq!((c.messages, c.capacity), (0, 0), "seed {seed}");
        let c = stores[1].cache_stats();
        assert!(c.messages <= 2, "seed {seed}: {c:?}");
        evictions += c.evictions;
        assert!(evictions > 0, "seed {seed}: {c:?}");
        let c = stores[2].cache_stats();
        assert!(c.hits > 0 && c.evictions == 0, "seed {seed}: {c:?}");
        let q = SearchQuery {
            limit: Some(1000),
            ..Default::default()
        };
        let summaries: Vec<_> = stores.iter().map(|s| s.search(&q).unwrap()).collect();
        assert_eq!(summaries[0].len(), 6, "seed {seed}");
        assert_eq!(summaries[0], summaries[1], "seed {seed}");
        assert_eq!(summaries[0], summaries[2], "seed {seed}");
        for s in &stores[1..] {
            assert_eq!(s.counters().unwrap(), stores[0].counters().unwrap());
            assert_eq!(s.state_counts().unwrap(), stores[0].state_counts().unwrap());
            assert_eq!(s.state_totals().unwrap(), stores[0].state_totals().unwrap());
        }
        for m in &summaries[0] {
            let want = stores[0].trajectory(&m.key, t).unwrap();
            assert!(want.is_some(), "seed {seed}: {}", m.key);
            for s in &stores[1..] {
                assert_eq!(s.trajectory(&m.key, t).unwrap(), want, "seed {seed}");
            }
        }
    }
}

/// Issue 14, bug 5: stage batches a crashed listener held (delivered, never acked) come back
/// within the listener's ack wait, 5 s by default — not the 30 s it used to be — and a
/// consumer created with a longer ack wait is brought down to the configured one.
#[tokio::test]
async fn a_restart_after_a_crash_resumes_within_the_default_ack_wait() {
    let (server, dir, js) = setup().await;
    let mut rng = TestRng(7);
    let all = successes(20, "held", &mut rng);
    let total = all.len() as u64;
    // The consumer as a crashed listener left it: created with the old 30 s ack wait, every
    // batch delivered to it and none acked.
    let stream = js
        .get_stream(msgtrail_core::subjects::STAGE_STREAM)
        .await
        .unwrap();
    let durable = "msgtrail-listener";
    let old: async_nats::jetstream::consumer::PullConsumer = stream
        .get_or_create_consumer(
            durable,
            async_nats::jetstream::consumer::pull::Config {
                durable_name: Some(durable.into()),
                ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    publish(&js, &all, &mut rng).await;
    let mut held = old.fetch().max_messages(1000).messages().await.unwrap();
    let mut n = 0;
    while let Some(m) = futures::StreamExt::next(&mut held).await {
        m.unwrap(); // delivered, never acked: the crash
        n += 1;
    }
    assert!(n > 0);

    let mut cfg = config(&server, dir.path());
    cfg.ack_wait = ListenerConfig::default().ack_wait;
    assert_eq!(cfg.ack_wait, Duration::from_secs(5));
    let started = tokio::time::Instant::now();
    let handle = msgtrail_listener::start(cfg).await.unwrap();
    let c = client(&handle);
    wait_for_records(&c, total).await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(15),
        "the held batches came back after {took:?}, not within the 5 s ack wait"
    );
    let mut consumer: async_nats::jetstream::consumer::PullConsumer =
        stream.get_consumer(durable).await.unwrap();
    assert_eq!(
        consumer.info().await.unwrap().config.ack_wait,
        Duration::from_secs(5)
    );
    handle.shutdown().await.unwrap();
}

/// `GET /metrics` asking for OpenMetrics, as Prometheus does: (content type, body).
async fn openmetrics(handle: &msgtrail_listener::ListenerHandle) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(handle.http_addr())
        .await
        .unwrap();
    let accept =
        "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
    let req = format!(
        "GET /metrics HTTP/1.1\r\nHost: listener\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    conn.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let content_type = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type:")
                .map(|v| v.trim().to_owned())
        })
        .expect("a content type");
    (content_type, body.to_owned())
}

/// One exemplar of a `msgtrail_hop_latency_seconds` bucket, as parsed from OpenMetrics text.
#[derive(Debug)]
struct Exemplar {
    topic: String,
    segment: String,
    le: f64,
    trace_id: String,
    value: f64,
}

/// `k="v",…` (no commas or quotes inside values here) as a map.
fn labels(s: &str) -> BTreeMap<String, String> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').expect("label=value");
            (k.to_owned(), v.trim_matches('"').to_owned())
        })
        .collect()
}

/// The exemplars of the latency buckets: `name{labels} count # {trace_id="…"} value [ts]`.
fn hop_exemplars(text: &str) -> Vec<Exemplar> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("msgtrail_hop_latency_seconds_bucket{") else {
            continue;
        };
        let Some((sample, exemplar)) = rest.split_once(" # {") else {
            continue;
        };
        let sample_labels = labels(sample.split_once('}').unwrap().0);
        let (ex_labels, ex_rest) = exemplar.split_once('}').unwrap();
        let value: f64 = ex_rest.split_whitespace().next().unwrap().parse().unwrap();
        let le = match sample_labels["le"].as_str() {
            "+Inf" => f64::INFINITY,
            le => le.parse().unwrap(),
        };
        out.push(Exemplar {
            topic: sample_labels["topic"].clone(),
            segment: sample_labels["segment"].clone(),
            le,
            trace_id: labels(ex_labels)["trace_id"].clone(),
            value,
        });
    }
    out
}

#[tokio::test]
async fn openmetrics_exemplars_name_traces_the_api_resolves() {
    let (server, dir, js) = setup().await;
    let handle = msgtrail_listener::start(config(&server, dir.path()))
        .await
        .unwrap();
    let c = client(&handle);
    let mut rng = TestRng(7);
    let all = successes(12, "ex", &mut rng);
    publish(&js, &all, &mut rng).await;
    wait_for_records(&c, all.len() as u64).await;

    let (content_type, text) = openmetrics(&handle).await;
    assert!(
        content_type.starts_with("application/openmetrics-text; version=1.0.0"),
        "{content_type}"
    );
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(
        text.contains("# TYPE msgtrail_hop_latency_seconds histogram\n"),
        "{text}"
    );
    let exemplars = hop_exemplars(&text);
    assert!(
        exemplars.iter().any(|e| e.segment == "end_to_end"),
        "no end-to-end exemplar in {text}"
    );
    let summaries = c
        .search::<MessageSummary>("topic=orders.eu&limit=100")
        .await
        .unwrap();
    for e in &exemplars {
        // The trace ID is a message ID the listener API resolves to its trajectory.
        let t = c.trajectory(&e.trace_id, None).await.unwrap();
        let id = t.message_id.expect("a message ID");
        assert_eq!(id.trace_hex(), e.trace_id, "{e:?}");
        assert_eq!(t.topic.as_deref(), Some(e.topic.as_str()), "{e:?}");
        // The message completed that segment, and the sample lies in its bucket. (The value
        // is the segment as first counted: with shuffled batches a late P1 may move its start
        // afterwards, which the summary shows and the statistics do not count again.)
        let s = summaries
            .iter()
            .find(|s| s.message_id == Some(id))
            .expect("the message among the topic's summaries");
        assert!(
            s.segments.iter().any(|(seg, _)| seg.as_str() == e.segment),
            "{e:?}: no such segment in {:?}",
            s.segments
        );
        assert!(e.value <= e.le, "{e:?}");
    }

    // Without asking for OpenMetrics: Prometheus text, the same histogram, no exemplars.
    let (status, body) = c.get_raw("/metrics").await.unwrap();
    let body = String::from_utf8(body).unwrap();
    assert_eq!(status, 200);
    assert!(
        body.contains(
            "msgtrail_hop_latency_seconds_count{topic=\"orders.eu\",segment=\"end_to_end\"} 12\n"
        ),
        "{body}"
    );
    assert!(!body.contains("trace_id"), "{body}");
    handle.shutdown().await.unwrap();
}

/// A size-limited tmpfs mounted for one test, unmounted when dropped (the test runs as root,
/// as the project's test machines do; it fails, saying so, where `mount` is not allowed).
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("run mount(8) (util-linux)");
        assert!(
            out.status.success(),
            "mounting a tmpfs needs root (CAP_SYS_ADMIN): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn resize(&self, size: &str) {
        let out = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Writes a file until the file system is full.
    fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.dir.path().join("ballast")).unwrap();
        let chunk = vec![0xa5u8; 64 * 1024];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.flush();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Issue 27: a full disk. The store stops committing; the listener acks nothing it could not
/// store, keeps answering, says so (`/healthz` 503, the metric, one outage in the counts
/// however many attempts fail), reopens the store after the I/O error, and once there is room
/// again stores every record exactly once.
#[tokio::test]
async fn a_full_disk_loses_nothing_and_recovers_when_space_is_freed() {
    let (server, _unused, js) = setup().await;
    let fs = Tmpfs::mount("12m");
    let store_dir = fs.path().join("store");
    let mut cfg = config(&server, &store_dir);
    cfg.ack_wait = Duration::from_secs(2);
    let durable = cfg.durable_name.clone();
    let handle = msgtrail_listener::start(cfg).await.unwrap();
    let c = client(&handle);
    let mut rng = TestRng(27);

    // Some messages stored while there is room.
    let before = successes(20, "room", &mut rng);
    publish(&js, &before, &mut rng).await;
    wait_for_records(&c, before.len() as u64).await;
    assert_eq!(c.get_raw("/healthz").await.unwrap().0, 200);

    // The disk fills up; records keep arriving until the store cannot write them.
    fs.fill();
    let mut during = Vec::new();
    let mut round = 0;
    let unhealthy = loop {
        let more = successes(20, &format!("full-{round}"), &mut rng);
        publish(&js, &more, &mut rng).await;
        during.extend(more);
        round += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (status, body) = c.get_raw("/healthz").await.unwrap();
        if status != 200 {
            break (status, String::from_utf8_lossy(&body).into_owned());
        }
        assert!(
            round < 100,
            "the store never failed to write on a full disk"
        );
    };
    assert_eq!(unhealthy.0, 503, "{}", unhealthy.1);
    assert!(
        unhealthy.1.contains("store cannot write"),
        "{}",
        unhealthy.1
    );
    // The reason is the store error's chain rendered once: its level, then the I/O error.
    assert!(
        unhealthy.1.contains(": store engine failed: "),
        "{}",
        unhealthy.1
    );
    assert_eq!(
        unhealthy.1.matches("No space left on device").count(),
        1,
        "{}",
        unhealthy.1
    );
    // A few more attempts fail while the disk stays full.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let s = c.stats(None).await.unwrap();
    assert!(s.ingest.store_unwritable_since.is_some());
    assert_eq!(
        s.ingest.store_outages, 1,
        "one outage however many attempts"
    );
    assert!(
        s.ingest.store_errors >= 2,
        "attempts go on: {}",
        s.ingest.store_errors
    );
    let (_, metrics) = c.get_raw("/metrics").await.unwrap();
    let metrics = String::from_utf8(metrics).unwrap();
    assert!(
        metrics.contains("msgtrail_listener_store_writable 0"),
        "{metrics}"
    );
    // Nothing published during the outage is acknowledged beyond what the store holds.
    let stored_then = s.ingest.records;
    assert!(stored_then < (before.len() + during.len()) as u64);
    let mut stream = js.get_stream(STAGE_STREAM).await.unwrap();
    let last_seq = stream.info().await.unwrap().state.last_sequence;
    let mut consumer: async_nats::jetstream::consumer::PullConsumer =
        stream.get_consumer(&durable).await.unwrap();
    let floor = consumer.info().await.unwrap().ack_floor.stream_sequence;
    assert!(
        floor < last_seq,
        "acked {floor} of {last_seq} while nothing could be stored"
    );
    // The API keeps answering, from the store too (reopened after the I/O error).
    assert_eq!(c.get_raw("/api/stats").await.unwrap().0, 200);
    let stored = eventually("a search answered during the outage", || async {
        c.search::<MessageSummary>("topic=orders.eu&limit=10000")
            .await
            .ok()
    })
    .await;
    assert!(stored.len() >= 20, "{} messages found", stored.len());
    let one = format!("/api/messages/{}", stored[0].message_id.unwrap());
    assert_eq!(c.get_raw(&one).await.unwrap().0, 200);

    // Room again: everything is stored, once.
    fs.resize("400m");
    let total = (before.len() + during.len()) as u64;
    wait_for_records(&c, total).await;
    eventually("healthz ok again", || async {
        (c.get_raw("/healthz").await.ok()?.0 == 200).then_some(())
    })
    .await;
    wait_until_idle(&c).await;
    let s = c.stats(None).await.unwrap();
    assert_eq!(s.ingest.records, total, "every record once");
    assert_eq!(s.ingest.store_unwritable_since, None);
    assert_eq!(s.ingest.store_outages, 1);
    let messages = (total / 10) as usize;
    let list = c
        .search::<MessageSummary>("topic=orders.eu&limit=10000")
        .await
        .unwrap();
    assert_eq!(list.len(), messages);
    assert!(
        list.iter().all(|m| m.records == 10),
        "10 records each, none doubled"
    );
    let floor = consumer.info().await.unwrap().ack_floor.stream_sequence;
    assert_eq!(floor, last_seq, "everything acknowledged once stored");
    handle.shutdown().await.unwrap();
}

/// `batch_bytes` bounds a store transaction by the bytes of its stage messages: on the same
/// backlog, a listener whose bound is smaller than any stage message applies one message
/// per transaction, and one with the default bound takes several at once. Both store every
/// record.
#[tokio::test]
async fn the_byte_bound_cuts_a_backlog_into_transactions_of_one_message() {
    let (server, dir, js) = setup().await;
    let mut rng = TestRng(7);
    let all = successes(40, "bb", &mut rng);
    let total = all.len() as u64;
    publish(&js, &all, &mut rng).await;
    let mut counts = Vec::new();
    for (name, batch_bytes) in [
        ("tiny", 1),
        ("default", ListenerConfig::default().batch_bytes),
    ] {
        let mut cfg = config(&server, &dir.path().join(name));
        cfg.durable_name = format!("listener-{name}");
        cfg.batch_bytes = batch_bytes;
        let handle = msgtrail_listener::start(cfg).await.unwrap();
        let c = client(&handle);
        wait_for_records(&c, total).await;
        wait_until_idle(&c).await;
        let s = c.stats(None).await.unwrap();
        assert_eq!(s.ingest.records, total, "{name}");
        assert_eq!(s.states.get(&MessageState::Consumed), Some(&40), "{name}");
        counts.push((s.ingest.batches, s.ingest.transactions));
        handle.shutdown().await.unwrap();
    }
    let [(tiny_batches, tiny_tx), (default_batches, default_tx)] = counts[..] else {
        unreachable!("two listeners ran")
    };
    assert_eq!(tiny_batches, default_batches, "the same backlog");
    assert_eq!(tiny_tx, tiny_batches, "one stage message per transaction");
    assert!(
        default_tx < default_batches,
        "the default bound takes several messages per transaction: {default_tx} of {default_batches}"
    );
}
