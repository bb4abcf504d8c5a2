//! A request ID stored twice: a producer that uploads `order-1`, waits past
//! the broker's dedup window and uploads `order-1` again gets two stored messages. Both
//! trajectories must name each other (`same_request`, and a clause of the diagnosis), the
//! statistics must count the re-upload once (`duplicates_after_window`), and the request-ID
//! lookup must say there are several — whatever the arrival order of the records, and
//! however often a batch is redelivered.
//!
//! The new fields are read from the raw JSON, as any client of the API would.

use msgtrail_core::encode_batch;
use msgtrail_core::subjects::STAGE_SUBJECT;
use msgtrail_core::trajectory::{AssembleOptions, Trajectory};
use msgtrail_core::Stage;
use msgtrail_core::{ClientId, MessageId, RequestId, StageRecord};
use msgtrail_listener::ListenerClient;
use msgtrail_listener::ListenerConfig;
use msgtrail_nats::topology::{stage_stream, DEFAULT_STAGE_MAX_AGE};
use msgtrail_test_support::NatsServer;
use serde_json::Value;
use std::time::Duration;

mod common;
use common::*;

const MS: u64 = 1_000_000;
/// Time between two uploads of the same request ID: past the default dedup window (2 min).
const GAP_MS: u64 = 150_000;

/// A message ID the broker would have assigned at `at` (Unix nanoseconds): UUIDv7 text
/// order is upload order.
fn id_at(at: u64) -> MessageId {
    let random = MessageId::new().as_u128() & ((1u128 << 80) - 1);
    MessageId::from_u128(((at / MS) as u128) << 80 | random).unwrap()
}

/// One upload of `req` by `producer` at `t0`, stored and consumed: its records.
struct Upload {
    id: MessageId,
    records: Vec<StageRecord>,
}

fn upload(t0: u64, producer: &str, req: &str, topic: &str) -> Upload {
    let id = id_at(t0 + MS);
    let mut records = Vec::new();
    let base = |stage, ms: u64| {
        let mut r = StageRecord::at(stage, t0 + ms * MS);
        r.topic = Some(topic.to_owned());
        r
    };
    for (stage, ms) in [
        (Stage::UploadSent, 0),
        (Stage::UploadReceived, 1),
        (Stage::Stored, 2),
        (Stage::StoreConfirmed, 3),
    ] {
        let mut r = base(stage, ms);
        r.request_id = Some(RequestId::new(req).unwrap());
        r.producer = Some(ClientId::new(producer).unwrap());
        r.attempt = Some(1);
        if stage != Stage::UploadSent {
            r.message_id = Some(id);
        }
        if stage == Stage::UploadReceived {
            r.payload_size = Some(5);
            r.service = Some("broker".into());
        }
        records.push(r);
    }
    for (stage, ms, outcome) in [
        (Stage::PullSent, 10, None),
        (Stage::PullReceived, 11, None),
        (Stage::ProcessStarted, 12, None),
        (Stage::ProcessFinished, 14, Some("ok")),
        (Stage::PullAckSent, 15, Some("ack")),
        (Stage::PullAckReceived, 16, Some("ack")),
    ] {
        let mut r = base(stage, ms);
        r.message_id = Some(id);
        r.group = Some(msgtrail_core::GroupId::new("billing").unwrap());
        r.consumer = Some(ClientId::new("b-1").unwrap());
        r.attempt = Some(1);
        r.outcome = outcome.map(Into::into);
        records.push(r);
    }
    Upload { id, records }
}

/// Publishes `records` in random batches of 1–7 to the stage stream, each applied before
/// the next is published, so that each is a transaction of its own: what arrives later
/// meets what came before in the store (and the cache), not in the same batch.
async fn publish(
    js: &async_nats::jetstream::Context,
    c: &ListenerClient,
    records: &[StageRecord],
    rng: &mut TestRng,
    published: &mut u64,
) {
    let mut i = 0;
    while i < records.len() {
        let n = (1 + rng.next() % 7) as usize;
        let end = (i + n).min(records.len());
        js.publish(STAGE_SUBJECT, encode_batch(&records[i..end]).into())
            .await
            .unwrap()
            .await
            .unwrap();
        *published += 1;
        let want = *published;
        eventually(&format!("stage message {want} applied"), || async {
            let (_, s) = get(c, "/api/stats").await;
            (s["ingest"]["batches"].as_u64()? >= want).then_some(())
        })
        .await;
        i = end;
    }
}

async fn get(c: &ListenerClient, path: &str) -> (u16, Value) {
    let (status, body) = c.get_raw(path).await.unwrap();
    let v = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("{path}: {e}: {}", String::from_utf8_lossy(&body)));
    (status, v)
}

/// The message IDs of a trajectory's `same_request` (absent: none).
fn same_request(t: &Value) -> Vec<String> {
    t.get("same_request")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|v| v.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

/// The trajectory JSON without what depends on the other messages (`same_request`, and the
/// diagnosis that mentions them): what assembling the message's own records gives.
fn own_part(mut t: Value) -> Value {
    let o = t.as_object_mut().unwrap();
    o.remove("same_request");
    o.remove("diagnosis");
    t
}

/// Each case: a request ID uploaded several times (the uploads of one case, in upload
/// order), and the order in which their records reach the stage stream.
struct Case {
    req: String,
    producer: &'static str,
    uploads: Vec<Upload>,
    order: Vec<StageRecord>,
}

fn cases(t0: u64, rng: &mut TestRng) -> Vec<Case> {
    let two = |i: usize, topic: &str| {
        let req = format!("order-{i}");
        let a = upload(t0, "shop", &req, topic);
        let b = upload(t0 + GAP_MS * MS, "shop", &req, topic);
        (req, vec![a, b])
    };
    let mut out = Vec::new();
    // 0: in upload order.
    let (req, ups) = two(0, "orders.eu");
    let order = ups.iter().flat_map(|u| u.records.clone()).collect();
    out.push((req, ups, order));
    // 1: the second message's records before the first's.
    let (req, ups) = two(1, "orders.eu");
    let order = ups.iter().rev().flat_map(|u| u.records.clone()).collect();
    out.push((req, ups, order));
    // 2: everything shuffled together.
    let (req, ups) = two(2, "orders.eu");
    let mut order: Vec<StageRecord> = ups.iter().flat_map(|u| u.records.clone()).collect();
    rng.shuffle(&mut order);
    out.push((req, ups, order));
    // 3: the second upload's P1 (no message ID yet) first, then the whole first message,
    // then the rest of the second.
    let (req, ups) = two(3, "orders.eu");
    let mut order = vec![ups[1].records[0].clone()];
    order.extend(ups[0].records.clone());
    order.extend(ups[1].records[1..].iter().cloned());
    out.push((req, ups, order));
    // 4: both P1s first, then the second message, then the first.
    let (req, ups) = two(4, "orders.eu");
    let mut order = vec![ups[0].records[0].clone(), ups[1].records[0].clone()];
    order.extend(ups[1].records[1..].iter().cloned());
    order.extend(ups[0].records[1..].iter().cloned());
    out.push((req, ups, order));
    // 5: three uploads on another topic, shuffled.
    let req = "order-5".to_owned();
    let ups: Vec<Upload> = (0..3)
        .map(|k| upload(t0 + k * GAP_MS * MS, "shop", &req, "orders.us"))
        .collect();
    let mut order: Vec<StageRecord> = ups.iter().flat_map(|u| u.records.clone()).collect();
    rng.shuffle(&mut order);
    out.push((req, ups, order));
    out.into_iter()
        .map(|(req, uploads, order)| Case {
            req,
            producer: "shop",
            uploads,
            order,
        })
        .collect()
}

fn expected(u: &Upload) -> Value {
    let t = Trajectory::assemble(u.records.clone(), &AssembleOptions::default()).unwrap();
    own_part(serde_json::to_value(t).unwrap())
}

#[tokio::test]
async fn a_request_id_stored_twice_names_every_message_in_any_order() {
    let server = NatsServer::start().unwrap();
    let nats = async_nats::connect(server.url()).await.unwrap();
    let js = async_nats::jetstream::new(nats);
    js.get_or_create_stream(stage_stream(1, DEFAULT_STAGE_MAX_AGE))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let handle = msgtrail_listener::start(ListenerConfig {
        nats: msgtrail_nats::NatsOptions::url(server.url()),
        data_dir: dir.path().to_path_buf(),
        http_addr: "127.0.0.1:0".parse().unwrap(),
        batch_size: 16,
        ack_wait: Duration::from_secs(1),
        watchdog_interval: Duration::from_millis(100),
        ..Default::default()
    })
    .await
    .unwrap();
    let c = ListenerClient::new(&format!("http://{}", handle.http_addr()), None).unwrap();

    // Uploads well in the past, so that every deadline has passed: the states are final.
    let t0 = now() - 2 * 3 * GAP_MS * MS;
    let mut rng = TestRng(0x0bad_5eed_1234_5678);
    let cases = cases(t0, &mut rng);
    // A request ID a second producer also used: still ambiguous without ?producer=.
    let kiosk = upload(t0 + 7 * MS, "kiosk", "order-0", "orders.eu");
    let mut total = kiosk.records.len();
    let mut published = 0;
    for case in &cases {
        publish(&js, &c, &case.order, &mut rng, &mut published).await;
        // A redelivered batch: nothing doubles.
        publish(&js, &c, &case.order[..4], &mut rng, &mut published).await;
        total += case.order.len();
    }
    publish(&js, &c, &kiosk.records, &mut rng, &mut published).await;
    eventually(&format!("{total} records ingested"), || async {
        let (_, s) = get(&c, "/api/stats").await;
        (s["ingest"]["records"].as_u64()? >= total as u64).then_some(())
    })
    .await;
    eventually("the listener caught up", || async {
        let (_, s) = get(&c, "/api/stats").await;
        let lag = &s["lag"];
        (lag["polled_at"].is_u64()
            && lag["pending"].as_u64() == Some(0)
            && lag["ack_pending"].as_u64() == Some(0))
        .then_some(())
    })
    .await;

    for case in &cases {
        let ids: Vec<String> = case.uploads.iter().map(|u| u.id.to_string()).collect();
        let n = ids.len();
        for (i, u) in case.uploads.iter().enumerate() {
            let (status, t) = get(&c, &format!("/api/messages/{}", u.id)).await;
            assert_eq!(status, 200, "{}: {t}", case.req);
            // Its own records only: the other upload's P1 is not counted as an attempt.
            assert_eq!(own_part(t.clone()), expected(u), "{} message {i}", case.req);
            let others: Vec<String> = ids.iter().filter(|x| **x != ids[i]).cloned().collect();
            assert_eq!(same_request(&t), others, "{} message {i}", case.req);
            let diagnosis = t["diagnosis"].as_str().unwrap();
            let clause = diagnosis
                .split("; ")
                .find(|c| c.contains("after the dedup window"))
                .unwrap_or_default();
            assert!(
                clause.starts_with(&format!(
                    "duplicate after the dedup window: request id {} was stored ",
                    case.req
                )) && clause.ends_with(&format!(": {n} messages"))
                    && others.iter().all(|o| clause.contains(o.as_str())),
                "{} message {i}: {diagnosis}",
                case.req
            );
        }
        // The request ID answers with the latest upload, naming the earlier ones.
        let path = format!("/api/messages/{}?producer={}", case.req, case.producer);
        let (status, t) = get(&c, &path).await;
        assert_eq!(status, 200, "{path}: {t}");
        assert_eq!(
            t["message_id"].as_str(),
            Some(ids[n - 1].as_str()),
            "{path}"
        );
        assert_eq!(same_request(&t), ids[..n - 1].to_vec(), "{path}");
        if case.req != "order-0" {
            let (status, t) = get(&c, &format!("/api/messages/{}", case.req)).await;
            assert_eq!(status, 200, "{}: {t}", case.req);
            assert_eq!(t["message_id"].as_str(), Some(ids[n - 1].as_str()));
        }
    }
    // The kiosk's single upload of order-0 names no other message, and order-0 without
    // ?producer= is still ambiguous.
    let (_, t) = get(&c, &format!("/api/messages/{}", kiosk.id)).await;
    assert_eq!(same_request(&t), Vec::<String>::new());
    assert!(
        !t["diagnosis"].as_str().unwrap().contains("stored again"),
        "{t}"
    );
    let (status, e) = get(&c, "/api/messages/order-0").await;
    assert_eq!(status, 409, "{e}");
    assert_eq!(e["producers"], serde_json::json!(["kiosk", "shop"]));

    // Counted once per message stored again: 1 for each pair, 2 for the three uploads.
    let (_, s) = get(&c, "/api/stats").await;
    assert_eq!(s["events"]["duplicates_after_window"], 7, "{}", s["events"]);
    assert_eq!(s["events"]["duplicates"], 0, "{}", s["events"]);
    assert_eq!(s["funnel"]["sent"], 14, "{}", s["funnel"]);
    assert_eq!(s["funnel"]["acked"], 14, "{}", s["funnel"]);
    assert_eq!(s["states"]["consumed"], 14, "{}", s["states"]);
    let (_, s) = get(&c, "/api/stats?topic=orders.us").await;
    assert_eq!(s["events"]["duplicates_after_window"], 2, "{}", s["events"]);
    let (_, body) = c.get_raw("/metrics").await.unwrap();
    let metrics = String::from_utf8(body).unwrap();
    assert!(
        metrics.contains("msgtrail_events_total{event=\"duplicate_after_window\"} 7\n"),
        "{metrics}"
    );
    handle.shutdown().await.unwrap();

    // The counter and the links survive a restart.
    let handle = msgtrail_listener::start(ListenerConfig {
        nats: msgtrail_nats::NatsOptions::url(server.url()),
        data_dir: dir.path().to_path_buf(),
        http_addr: "127.0.0.1:0".parse().unwrap(),
        ..Default::default()
    })
    .await
    .unwrap();
    let c = ListenerClient::new(&format!("http://{}", handle.http_addr()), None).unwrap();
    let (_, s) = get(&c, "/api/stats").await;
    assert_eq!(s["events"]["duplicates_after_window"], 7, "{}", s["events"]);
    let case = &cases[1];
    let (_, t) = get(&c, &format!("/api/messages/{}", case.uploads[0].id)).await;
    assert_eq!(same_request(&t), vec![case.uploads[1].id.to_string()]);
    handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn retention_of_one_upload_leaves_the_other_alone() {
    let server = NatsServer::start().unwrap();
    let nats = async_nats::connect(server.url()).await.unwrap();
    let js = async_nats::jetstream::new(nats);
    js.get_or_create_stream(stage_stream(1, DEFAULT_STAGE_MAX_AGE))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let t0 = now() - 10 * 60_000 * MS;
    // The first upload is older than the retention age, the second is not.
    let a = upload(t0, "shop", "order-r", "orders.eu");
    let b = upload(now() - 5_000 * MS, "shop", "order-r", "orders.eu");
    let mut rng = TestRng(0x1234_0bad_5eed_9876);
    let mut all: Vec<StageRecord> = a.records.iter().chain(&b.records).cloned().collect();
    rng.shuffle(&mut all);
    // One stage-stream message, so one transaction: retention cannot run between the two
    // uploads and see the first one come back.
    js.publish(STAGE_SUBJECT, encode_batch(&all).into())
        .await
        .unwrap()
        .await
        .unwrap();
    let handle = msgtrail_listener::start(ListenerConfig {
        nats: msgtrail_nats::NatsOptions::url(server.url()),
        data_dir: dir.path().to_path_buf(),
        http_addr: "127.0.0.1:0".parse().unwrap(),
        watchdog_interval: Duration::from_millis(100),
        retention_interval: Duration::from_millis(100),
        retention_max_age: Some(Duration::from_secs(5 * 60)),
        ..Default::default()
    })
    .await
    .unwrap();
    let c = ListenerClient::new(&format!("http://{}", handle.http_addr()), None).unwrap();
    eventually("the first upload deleted by retention", || async {
        let (_, s) = get(&c, "/api/stats").await;
        (s["events"]["retention_deleted"].as_u64()? >= 1
            && s["ingest"]["records"].as_u64()? >= all.len() as u64)
            .then_some(())
    })
    .await;
    let (status, _) = get(&c, &format!("/api/messages/{}", a.id)).await;
    assert_eq!(status, 404);
    // The second names no message that is gone; the request ID finds it.
    let (status, t) = get(&c, "/api/messages/order-r").await;
    assert_eq!(status, 200, "{t}");
    assert_eq!(t["message_id"].as_str(), Some(b.id.to_string().as_str()));
    assert_eq!(same_request(&t), Vec::<String>::new());
    // The re-upload itself was counted.
    let (_, s) = get(&c, "/api/stats").await;
    assert_eq!(s["events"]["duplicates_after_window"], 1, "{}", s["events"]);
    handle.shutdown().await.unwrap();
}

/// The store alone, many orders and batch splits (each batch applied twice, as after a
/// crash), with no cache, a tiny one and the default one: every summary, trajectory and
/// counter comes out as when all the records arrive in one batch. The byte count is of the
/// records as stored: one chunk per batch that brought a message records (issue 26: records
/// are appended, never rewritten), so it follows the split — but not the cache, and a
/// batch applied again adds no byte.
#[test]
fn the_store_gives_the_same_answer_in_any_order_and_split() {
    use msgtrail_listener::{SearchQuery, Store};
    let t = now();
    let t0 = t - 2 * 3 * GAP_MS * MS;
    let cases = cases(t0, &mut TestRng(7));
    let all: Vec<StageRecord> = cases
        .iter()
        .flat_map(|c| c.uploads.iter().flat_map(|u| u.records.clone()))
        .collect();
    let q = SearchQuery {
        limit: Some(1000),
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let reference = Store::open(dir.path(), 256, Default::default()).unwrap();
    reference.apply(all.clone(), t).unwrap();
    let summaries = reference.search(&q).unwrap();
    assert_eq!(summaries.len(), 13);
    // Counters that went up and down to 0 (intermediate states) are no difference.
    let nonzero = |s: &Store| {
        let mut c = s.counters().unwrap();
        c.retain(|k, v| *v != 0 && k != "bytes");
        c
    };
    let bytes = |s: &Store| s.counters().unwrap().get("bytes").copied().unwrap_or(0);
    let counters = nonzero(&reference);
    assert_eq!(counters.get("duplicates_after_window"), Some(&7));
    assert_eq!(
        counters.get("topic/orders.us/duplicates_after_window"),
        Some(&2)
    );
    let trajectories: Vec<_> = summaries
        .iter()
        .map(|s| reference.trajectory(&s.key, t).unwrap().unwrap())
        .collect();
    for tr in &trajectories {
        let n = if tr.request_id.as_ref().unwrap().as_str() == "order-5" {
            2
        } else {
            1
        };
        assert_eq!(tr.same_request.len(), n, "{}", tr.diagnosis);
        assert_eq!(tr.upload_attempts, 1, "{}", tr.diagnosis);
    }
    let check = |s: &Store, what: &str| {
        assert_eq!(s.search(&q).unwrap(), summaries, "{what}");
        assert_eq!(nonzero(s), counters, "{what}");
        assert_eq!(
            s.state_counts().unwrap(),
            reference.state_counts().unwrap(),
            "{what}"
        );
        for (sum, want) in summaries.iter().zip(&trajectories) {
            let got = s.trajectory(&sum.key, t).unwrap().unwrap();
            assert_eq!(&got, want, "{what}");
        }
    };
    // Every P1 first (no message ID yet: orphans), one batch at a time, then all the rest
    // at once: each orphan is merged in the batch where its request ID gains its messages.
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path(), 256, Default::default()).unwrap();
    let (p1, rest): (Vec<_>, Vec<_>) = all.iter().cloned().partition(|r| r.message_id.is_none());
    for r in p1 {
        s.apply(vec![r], t).unwrap();
    }
    s.apply(rest, t).unwrap();
    check(&s, "P1s first");
    for seed in 1..16u64 {
        let mut rng = TestRng(seed * 7919 + 5);
        let mut order = all.clone();
        rng.shuffle(&mut order);
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let stores: Vec<Store> = [0usize, 2, 1_000]
            .iter()
            .zip(&dirs)
            .map(|(cap, d)| {
                Store::open(d.path(), 256, Default::default())
                    .unwrap()
                    .cache_capacity(*cap)
            })
            .collect();
        let mut i = 0;
        while i < order.len() {
            let end = (i + (1 + rng.next() % 12) as usize).min(order.len());
            for s in &stores {
                s.apply(order[i..end].to_vec(), t).unwrap();
                let once = bytes(s);
                s.apply(order[i..end].to_vec(), t).unwrap();
                assert_eq!(bytes(s), once, "seed {seed}: a batch applied again");
            }
            i = end;
        }
        assert!(bytes(&stores[0]) >= bytes(&reference), "seed {seed}");
        for s in &stores[1..] {
            assert_eq!(
                bytes(s),
                bytes(&stores[0]),
                "seed {seed}: the cache changes no byte"
            );
        }
        for (k, s) in stores.iter().enumerate() {
            check(s, &format!("seed {seed} store {k}"));
        }
    }
}
