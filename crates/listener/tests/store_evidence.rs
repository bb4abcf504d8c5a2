//! Store evidence against a real nats-server: the test plays the broker and stores messages
//! in `MSGTRAIL_MESSAGES` exactly as it does (same stream configuration, same headers), with
//! no P2/P3 on the stage stream; the listener must recover them from the stored messages.

use base64::Engine;
use msgtrail_core::encode_batch;
use msgtrail_core::headers as h;
use msgtrail_core::subjects::{
    message_subject, MESSAGE_STREAM, MESSAGE_SUBJECT_PREFIX, STAGE_SUBJECT,
};
use msgtrail_core::trajectory::{AssembleOptions, HopStatus, MessageState, Trajectory, RECOVERED};
use msgtrail_core::Stage;
use msgtrail_core::{ClientId, MessageId, RequestId, StageRecord};
use msgtrail_listener::evidence_consumer_name as consumer_name;
use msgtrail_listener::ListenerClient;
use msgtrail_listener::ListenerConfig;
use msgtrail_listener::MessageSummary;
use msgtrail_test_support::NatsServer;
use std::path::Path;
use std::time::{Duration, Instant};

mod common;
use common::*;

const BROKER_SERVICE: &str = "msgtrail-broker-eu";
const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// The message stream as the broker creates it (crates/broker/src/streams.rs, default
/// `BrokerConfig`: one replica, 2 min duplicate window, 7 days).
fn message_stream_config() -> async_nats::jetstream::stream::Config {
    async_nats::jetstream::stream::Config {
        name: MESSAGE_STREAM.to_owned(),
        subjects: vec![format!("{MESSAGE_SUBJECT_PREFIX}.>")],
        storage: async_nats::jetstream::stream::StorageType::File,
        num_replicas: 1,
        duplicate_window: Duration::from_secs(120),
        max_age: Duration::from_secs(7 * 24 * 3600),
        allow_direct: true,
        description: Some("msgtrail messages: msgtrail.msg.<topic>".into()),
        ..Default::default()
    }
}

/// The header layout of a stored message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// `Msgtrail-Stored`, as brokers write it now.
    Compact,
    /// The separate headers of earlier brokers (`Msgtrail-Request-Id`, …).
    Separate,
    /// A `Msgtrail-Stored` that does not follow the layout.
    Malformed,
}

/// A message the test stored as the broker would.
#[derive(Debug, Clone)]
struct Stored {
    id: MessageId,
    req: RequestId,
    producer: ClientId,
    topic: String,
    attempt: u32,
    payload: Vec<u8>,
    /// The received-at time of the store evidence, when stamped.
    received_at: Option<u64>,
    /// How its headers are laid out.
    layout: Layout,
    seq: u64,
    /// JetStream's stored time.
    stored_at: u64,
}

impl Stored {
    /// The P2 and P3 the broker used to write to the stage stream for this message, P3 at
    /// the given time (the broker's was its PubAck time).
    fn broker_records(&self, p3_at: u64) -> Vec<StageRecord> {
        let base = |stage: Stage, at: u64| {
            let mut r = StageRecord::at(stage, at);
            r.message_id = Some(self.id);
            r.request_id = Some(self.req.clone());
            r.producer = Some(self.producer.clone());
            r.topic = Some(self.topic.clone());
            r.attempt = Some(self.attempt);
            r.service = Some(BROKER_SERVICE.into());
            r
        };
        let mut p2 = base(Stage::UploadReceived, self.received_at.expect("stamped"));
        p2.attrs.insert("category".into(), "refund".into());
        p2.traceparent = Some(TRACEPARENT.into());
        p2.payload_size = Some(self.payload.len() as u64);
        p2.payload_head = Some(
            base64::engine::general_purpose::STANDARD
                .encode(&self.payload[..self.payload.len().min(256)]),
        );
        let mut p3 = base(Stage::Stored, p3_at);
        p3.stream_seq = Some(self.seq);
        vec![p2, p3]
    }

    /// The P2/P3 the listener must recover: the broker's, P3 at JetStream's stored time,
    /// both with the outcome `recovered`.
    fn evidence(&self) -> Vec<StageRecord> {
        let mut recs = self.broker_records(self.stored_at);
        for r in &mut recs {
            r.outcome = Some(RECOVERED.into());
        }
        recs
    }

    /// What the producer and a consumer report about this message (stage stream): P1, P4,
    /// one pull delivery processed and acked.
    fn client_records(&self) -> Vec<StageRecord> {
        let t = self.received_at.expect("stamped");
        let mut out = Vec::new();
        for (stage, at) in [
            (Stage::UploadSent, t - 1_000_000),
            (Stage::StoreConfirmed, t + 3_000_000),
        ] {
            let mut r = StageRecord::at(stage, at);
            r.request_id = Some(self.req.clone());
            r.producer = Some(self.producer.clone());
            r.topic = Some(self.topic.clone());
            r.attempt = Some(self.attempt);
            if stage == Stage::StoreConfirmed {
                r.message_id = Some(self.id);
            }
            out.push(r);
        }
        let group = msgtrail_core::GroupId::new("billing").unwrap();
        let consumer = ClientId::new("b-1").unwrap();
        for (i, (stage, outcome)) in [
            (Stage::PullSent, None),
            (Stage::PullReceived, None),
            (Stage::ProcessStarted, None),
            (Stage::ProcessFinished, Some("ok")),
            (Stage::PullAckSent, Some("ack")),
            (Stage::PullAckReceived, Some("ack")),
        ]
        .into_iter()
        .enumerate()
        {
            let mut r = StageRecord::at(stage, t + (10 + i as u64) * 1_000_000);
            r.message_id = Some(self.id);
            r.topic = Some(self.topic.clone());
            r.group = Some(group.clone());
            r.consumer = Some(consumer.clone());
            r.attempt = Some(1);
            r.outcome = outcome.map(Into::into);
            out.push(r);
        }
        out
    }
}

impl Stored {
    /// A message the broker received now (its ID assigned, its upload time fixed), not
    /// stored yet; `stamp` says whether the broker records stages (and so stamps it).
    fn received(req: &str, stamp: bool) -> Stored {
        let req = RequestId::new(req).unwrap();
        Stored {
            id: MessageId::new(),
            payload: format!("order {req}").into_bytes(),
            req,
            producer: ClientId::new("shop").unwrap(),
            topic: "orders.eu".into(),
            attempt: 1,
            received_at: stamp.then(now),
            layout: Layout::Compact,
            seq: 0,
            stored_at: 0,
        }
    }

    /// Stores it in the message stream with the headers the broker writes, and notes its
    /// sequence and JetStream's stored time.
    async fn store(&mut self, js: &async_nats::jetstream::Context) {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            h::NATS_MSG_ID,
            format!("{}:{}", self.producer, self.req).as_str(),
        );
        headers.insert(h::MESSAGE_ID, self.id.to_string().as_str());
        let evidence = self
            .received_at
            .map(|at| (self.attempt, at, BROKER_SERVICE));
        match self.layout {
            Layout::Compact => {
                let mut v = String::new();
                msgtrail_core::stored::encode(&mut v, self.req.as_str(), "shop-service", evidence);
                headers.insert(h::STORED, v.as_str());
            }
            Layout::Malformed => headers.insert(h::STORED, "1;ord-x;shop-service;1;soon;b"),
            Layout::Separate => {
                headers.insert(h::REQUEST_ID, self.req.as_str());
                headers.insert(h::PRODUCER, self.producer.as_str());
                headers.insert(h::PRODUCER_SERVICE, "shop-service");
                headers.insert(h::TOPIC, self.topic.as_str());
                headers.insert(h::ATTEMPT, self.attempt.to_string().as_str());
                if let Some(at) = self.received_at {
                    headers.insert(h::RECEIVED_AT, at.to_string().as_str());
                    headers.insert(h::BROKER_SERVICE, BROKER_SERVICE);
                }
            }
        }
        headers.insert(format!("{}category", h::ATTR_PREFIX).as_str(), "refund");
        headers.insert(h::TRACEPARENT, TRACEPARENT);
        if self.received_at.is_some() {
            headers.insert(
                h::PAYLOAD_HEAD,
                base64::engine::general_purpose::STANDARD
                    .encode(&self.payload)
                    .as_str(),
            );
        }
        let ack = js
            .publish_with_headers(
                message_subject(&self.topic),
                headers,
                self.payload.clone().into(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(!ack.duplicate);
        let stream = js.get_stream(MESSAGE_STREAM).await.unwrap();
        let raw = stream.get_raw_message(ack.sequence).await.unwrap();
        self.seq = ack.sequence;
        self.stored_at = raw.time.unix_timestamp_nanos() as u64;
    }
}

/// Stores a message as the broker does; `stamp` adds the store-evidence headers (what a
/// broker with stage recording on writes).
async fn store_message(js: &async_nats::jetstream::Context, req: &str, stamp: bool) -> Stored {
    let mut m = Stored::received(req, stamp);
    m.store(js).await;
    m
}

async fn publish_stage(js: &async_nats::jetstream::Context, records: &[StageRecord]) {
    js.publish(STAGE_SUBJECT, encode_batch(records).into())
        .await
        .unwrap()
        .await
        .unwrap();
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

/// Waits until this listener process applied `n` stored messages.
async fn wait_for_stored(c: &ListenerClient, n: u64) {
    eventually(&format!("{n} stored messages applied"), || async {
        let s = c.stats(None).await.ok()?;
        (s.ingest.stored_messages >= n).then_some(())
    })
    .await;
}

/// Waits until both consumers have nothing pending or unacknowledged.
async fn wait_until_idle(c: &ListenerClient) {
    eventually("both sources caught up", || async {
        let s = c.stats(None).await.ok()?;
        let l = &s.lag;
        (l.polled_at.is_some()
            && l.stored_polled_at.is_some()
            && l.pending + l.ack_pending + l.stored_pending + l.stored_ack_pending == 0)
            .then_some(())
    })
    .await;
}

fn expected(records: Vec<StageRecord>) -> Trajectory {
    Trajectory::assemble(records, &AssembleOptions::default()).unwrap()
}

/// The stages of the store hop's events, sorted.
fn store_stages(t: &Trajectory) -> Vec<Stage> {
    let mut v: Vec<Stage> = t
        .hop("store")
        .map(|h| h.events.iter().map(|e| e.stage).collect())
        .unwrap_or_default();
    v.sort();
    v
}

#[tokio::test]
async fn a_stored_message_alone_gives_its_store_hop() {
    let server = NatsServer::start().unwrap();
    let js = nats(&server).await;
    js.get_or_create_stream(message_stream_config())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let handle = msgtrail_listener::start(config(&server, dir.path()))
        .await
        .unwrap();
    let c = client(&handle);

    let a = store_message(&js, "ord-1", true).await;
    let plain = store_message(&js, "ord-2", false).await;
    wait_for_stored(&c, 2).await;

    // The trajectory is the one the broker's own P2/P3 would have given, P3 at the stored
    // time: nothing on the stage stream at all.
    let t = c.trajectory(&a.id.to_string(), None).await.unwrap();
    assert_eq!(t, expected(a.evidence()));
    assert_eq!(t.state, MessageState::Enqueued);
    assert_eq!(
        (t.producer.as_ref(), t.request_id.as_ref()),
        (Some(&a.producer), Some(&a.req))
    );
    assert_eq!(t.topic.as_deref(), Some("orders.eu"));
    assert_eq!(t.attrs.get("category").map(String::as_str), Some("refund"));
    assert_eq!(t.payload_size, Some(a.payload.len() as u64));
    let store = t.hop("store").expect("a store hop");
    assert_eq!(store.status, HopStatus::Ok);
    assert_eq!(
        (store.start, store.end),
        (a.received_at.unwrap(), Some(a.stored_at))
    );
    assert_eq!(store.service.as_deref(), Some(BROKER_SERVICE));
    let p3 = store
        .events
        .iter()
        .find(|e| e.stage == Stage::Stored)
        .unwrap();
    assert_eq!(p3.stream_seq, Some(a.seq));
    let p2 = store
        .events
        .iter()
        .find(|e| e.stage == Stage::UploadReceived)
        .unwrap();
    assert_eq!(p2.traceparent.as_deref(), Some(TRACEPARENT));
    assert_eq!(store.events.len(), 2);
    // Found by request ID too.
    let by_req = c.trajectory("ord-1", Some("shop")).await.unwrap();
    assert_eq!(by_req.message_id, Some(a.id));

    // Without store evidence: no trajectory.
    let err = c.trajectory(&plain.id.to_string(), None).await.unwrap_err();
    assert!(err.is_not_found(), "{err}");

    let s = c.stats(None).await.unwrap();
    assert_eq!(
        (s.ingest.stored_messages, s.ingest.stored_without_evidence),
        (2, 1)
    );
    assert_eq!(s.ingest.records, 2);
    assert_eq!(
        (s.stages.get("P2.recovered"), s.stages.get("P3.recovered")),
        (Some(&1), Some(&1))
    );
    assert_eq!(s.funnel.stored, 1);
    assert_eq!(s.states.get(&MessageState::Enqueued), Some(&1));
    let (_, body) = c.get_raw("/metrics").await.unwrap();
    let metrics = String::from_utf8(body).unwrap();
    assert!(
        metrics.contains("msgtrail_listener_stored_messages_total 2\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("msgtrail_listener_stored_without_evidence_total 1\n"),
        "{metrics}"
    );

    // The consumer is the one documented: durable, headers only, every stored message.
    let mut stream = js.get_stream(MESSAGE_STREAM).await.unwrap();
    let info = stream
        .consumer_info(consumer_name("msgtrail-listener"))
        .await
        .unwrap();
    assert!(info.config.headers_only);
    assert_eq!(info.config.filter_subject, "msgtrail.msg.>");
    // Explicit acks: a delivery lost in flight is redelivered, never acknowledged by a later ack.
    assert_eq!(
        info.config.ack_policy,
        async_nats::jetstream::consumer::AckPolicy::Explicit
    );
    assert_eq!(info.num_ack_pending, 0, "every stored message acked");
    let _ = stream.info().await.unwrap();
    handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn both_stored_layouts_give_the_store_hop_and_a_malformed_one_is_counted() {
    // Streams written by earlier brokers keep messages with the separate headers for days:
    // the listener reads them as it reads Msgtrail-Stored, and counts a malformed one.
    let server = NatsServer::start().unwrap();
    let js = nats(&server).await;
    js.get_or_create_stream(message_stream_config())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let handle = msgtrail_listener::start(config(&server, dir.path()))
        .await
        .unwrap();
    let c = client(&handle);
    let mut stored = Vec::new();
    for (req, layout) in [
        ("ord-new", Layout::Compact),
        ("ord-old", Layout::Separate),
        ("ord-bad", Layout::Malformed),
    ] {
        let mut m = Stored::received(req, true);
        m.layout = layout;
        m.store(&js).await;
        stored.push(m);
    }
    wait_for_stored(&c, 3).await;
    for m in &stored[..2] {
        let t = c.trajectory(&m.id.to_string(), None).await.unwrap();
        assert_eq!(t, expected(m.evidence()), "{:?}", m.layout);
        assert_eq!(
            (t.producer.as_ref(), t.request_id.as_ref()),
            (Some(&m.producer), Some(&m.req))
        );
        assert_eq!(t.topic.as_deref(), Some("orders.eu"));
    }
    let err = c
        .trajectory(&stored[2].id.to_string(), None)
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let s = c.stats(None).await.unwrap();
    assert_eq!(
        (s.ingest.stored_messages, s.ingest.stored_without_evidence),
        (3, 1)
    );
    assert_eq!(s.ingest.records, 4);
    handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_brokers_own_p2_is_not_doubled_and_its_p3_wins() {
    // The broker writes P2/P3 to the stage stream too: its P2 is the recovered one but for
    // the outcome, its P3 has its own time (the PubAck's). The store keeps both sources; the
    // trajectory shows the broker's records whichever arrived first.
    let server = NatsServer::start().unwrap();
    let js = nats(&server).await;
    js.get_or_create_stream(message_stream_config())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let handle = msgtrail_listener::start(config(&server, dir.path()))
        .await
        .unwrap();
    let c = client(&handle);

    // The stored message's evidence first, the broker's records later.
    let a = store_message(&js, "ord-1", true).await;
    wait_for_stored(&c, 1).await;
    let a_broker = a.broker_records(a.stored_at + 2_000_000);
    publish_stage(&js, &a_broker).await;
    // The broker's records first, the stored message later.
    let mut b = Stored::received("ord-2", true);
    let b_p3_at = b.received_at.unwrap() + 900_000_000;
    let b_broker = b.broker_records(b_p3_at);
    publish_stage(&js, &b_broker).await;
    eventually("the broker's records applied", || async {
        let s = c.stats(None).await.ok()?;
        (s.ingest.records >= 5).then_some(())
    })
    .await;
    b.store(&js).await;
    wait_for_stored(&c, 2).await;
    wait_until_idle(&c).await;

    // Both: the broker's P2 and P3, whichever source arrived first.
    for (m, want, p3_at) in [
        (&a, a_broker.clone(), a_broker[1].at),
        (&b, b_broker.clone(), b_p3_at),
    ] {
        let t = c.trajectory(&m.id.to_string(), None).await.unwrap();
        assert_eq!(t, expected(want), "{}", m.req);
        assert_eq!(
            store_stages(&t),
            [Stage::UploadReceived, Stage::Stored],
            "one P2 and one P3 whichever source came first"
        );
        let store = t.hop("store").unwrap();
        assert_eq!(store.end, Some(p3_at), "the broker's P3 ends the hop");
        assert_eq!(t.state, MessageState::Enqueued);
    }
    let s = c.stats(None).await.unwrap();
    assert_eq!(s.stages.get("P2"), Some(&2));
    assert_eq!(s.stages.get("P3"), Some(&2));
    assert_eq!(s.stages.get("P2.recovered"), Some(&2));
    assert_eq!(s.stages.get("P3.recovered"), Some(&2));
    assert_eq!(s.funnel.stored, 2);
    handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn other_records_before_or_after_the_stored_message_give_the_same_trajectory() {
    let server = NatsServer::start().unwrap();
    let js = nats(&server).await;
    js.get_or_create_stream(message_stream_config())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let handle = msgtrail_listener::start(config(&server, dir.path()))
        .await
        .unwrap();
    let c = client(&handle);

    // The stored message first, the producer's and the consumer's records later.
    let first = store_message(&js, "ord-first", true).await;
    wait_for_stored(&c, 1).await;
    let t = c.trajectory(&first.id.to_string(), None).await.unwrap();
    assert_eq!(t.state, MessageState::Enqueued);
    assert!(t.hop("send").unwrap().synthesized, "no producer record yet");
    publish_stage(&js, &first.client_records()).await;

    // Here the producer's and the consumer's records come first (a broker that crashed
    // before writing anything), the stored message's evidence after all of them.
    let mut later = Stored::received("ord-later", true);
    publish_stage(&js, &later.client_records()).await;
    let total = (first.client_records().len() * 2 + 2) as u64;
    eventually("the client records applied", || async {
        let s = c.stats(None).await.ok()?;
        (s.ingest.records >= total).then_some(())
    })
    .await;
    let t = c.trajectory(&later.id.to_string(), None).await.unwrap();
    let store = t.hop("store").unwrap();
    assert!(
        store.inferred && store.events.is_empty(),
        "no store evidence yet, only the delivery's word for it"
    );
    later.store(&js).await;
    wait_for_stored(&c, 2).await;
    wait_until_idle(&c).await;

    for m in [&first, &later] {
        let t = c.trajectory(&m.id.to_string(), None).await.unwrap();
        let mut all = m.evidence();
        all.extend(m.client_records());
        assert_eq!(t, expected(all), "{}", m.req);
        assert_eq!(t.state, MessageState::Consumed, "{}", m.req);
        assert!(!t.hop("send").unwrap().synthesized);
        let store = t.hop("store").unwrap();
        assert_eq!(store.status, HopStatus::Ok);
        assert!(!store.inferred);
        assert_eq!(
            (store.start, store.end),
            (m.received_at.unwrap(), Some(m.stored_at))
        );
        assert_eq!(store_stages(&t), [Stage::UploadReceived, Stage::Stored]);
    }
    let s = c.stats(None).await.unwrap();
    assert_eq!(s.funnel.sent, 2);
    assert_eq!(s.funnel.stored, 2);
    assert_eq!(s.funnel.acked, 2);
    assert_eq!(s.states.get(&MessageState::Consumed), Some(&2));
    assert_eq!(s.states.get(&MessageState::Enqueued), None);
    handle.shutdown().await.unwrap();
}

/// Every stored message's summary: exactly its P2 and P3, once each.
async fn assert_each_stored_once(c: &ListenerClient, messages: &[Stored]) {
    let list = c
        .search::<MessageSummary>("topic=orders.eu&limit=10000")
        .await
        .unwrap();
    assert_eq!(list.len(), messages.len());
    assert!(
        list.iter()
            .all(|m| m.records == 2 && m.state == MessageState::Enqueued),
        "every message has its P2 and P3 once: {:?}",
        list.iter().find(|m| m.records != 2)
    );
    for m in messages.iter().step_by(7) {
        let t = c.trajectory(&m.id.to_string(), None).await.unwrap();
        assert_eq!(t, expected(m.evidence()), "{}", m.req);
    }
}

#[tokio::test]
async fn a_restart_mid_way_gives_every_message_its_store_hop_once() {
    let server = NatsServer::start().unwrap();
    let js = nats(&server).await;
    js.get_or_create_stream(message_stream_config())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&server, dir.path());
    // Small batches: many transactions, so the crash lands between some of them.
    cfg.batch_size = 2;
    let mut all = Vec::new();
    // A backlog, then a crash while the listener is applying it.
    for i in 0..200 {
        all.push(store_message(&js, &format!("a-{i}"), true).await);
    }
    let handle = msgtrail_listener::start(cfg.clone()).await.unwrap();
    let c = client(&handle);
    wait_for_stored(&c, 1).await;
    handle.abort().await;
    let applied = {
        let store = msgtrail_listener::Store::open(dir.path(), 256, Default::default()).unwrap();
        let n = store
            .counters()
            .unwrap()
            .get("stage.P3")
            .copied()
            .unwrap_or(0);
        n
    };
    assert!(
        applied < 200,
        "the crash came too late to test anything ({applied} applied)"
    );
    for i in 0..50 {
        all.push(store_message(&js, &format!("b-{i}"), true).await);
    }
    let handle = msgtrail_listener::start(cfg.clone()).await.unwrap();
    let c = client(&handle);
    wait_until_idle(&c).await;
    let s = c.stats(None).await.unwrap();
    assert_eq!(s.ingest.records, 2 * all.len() as u64);
    assert_each_stored_once(&c, &all).await;
    // A clean stop, more messages, a start again.
    handle.shutdown().await.unwrap();
    for i in 0..50 {
        all.push(store_message(&js, &format!("c-{i}"), true).await);
    }
    let handle = msgtrail_listener::start(cfg).await.unwrap();
    let c = client(&handle);
    // This process applies the 50 new ones and nothing else (all before were acked).
    wait_for_stored(&c, 50).await;
    wait_until_idle(&c).await;
    let s = c.stats(None).await.unwrap();
    assert_eq!(s.ingest.stored_messages, 50);
    assert_eq!(s.ingest.records, 2 * all.len() as u64);
    assert_eq!(s.funnel.stored, all.len() as u64);
    assert_eq!(
        s.states.get(&MessageState::Enqueued),
        Some(&(all.len() as u64))
    );
    assert_each_stored_once(&c, &all).await;
    handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_message_stream_created_after_the_listener_started_is_picked_up() {
    let server = NatsServer::start().unwrap();
    let js = nats(&server).await;
    let dir = tempfile::tempdir().unwrap();
    let handle = msgtrail_listener::start(config(&server, dir.path()))
        .await
        .unwrap();
    let c = client(&handle);
    // Past the first retries: still serving, the stage stream read, the evidence waiting.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let s = c.stats(None).await.unwrap();
    assert!(s.lag.polled_at.is_some());
    assert_eq!(s.lag.stored_polled_at, None);
    assert!(
        js.get_stream(MESSAGE_STREAM).await.is_err(),
        "the listener does not create it"
    );

    // A listener that waits for the stream stops at once when asked to.
    let other_dir = tempfile::tempdir().unwrap();
    let mut other = config(&server, other_dir.path());
    other.durable_name = "other-listener".into();
    let waiting = msgtrail_listener::start(other).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t0 = Instant::now();
    waiting.shutdown().await.unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "shutdown took {:?}",
        t0.elapsed()
    );

    // The broker comes up and stores a message.
    js.get_or_create_stream(message_stream_config())
        .await
        .unwrap();
    let a = store_message(&js, "ord-1", true).await;
    let t = eventually("the late stream's message", || async {
        c.trajectory(&a.id.to_string(), None).await.ok()
    })
    .await;
    assert_eq!(t, expected(a.evidence()));
    wait_until_idle(&c).await;
    handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn without_store_evidence_the_message_stream_is_not_read() {
    let server = NatsServer::start().unwrap();
    let js = nats(&server).await;
    js.get_or_create_stream(message_stream_config())
        .await
        .unwrap();
    let a = store_message(&js, "ord-1", true).await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&server, dir.path());
    cfg.store_evidence = false;
    let handle = msgtrail_listener::start(cfg).await.unwrap();
    let c = client(&handle);
    // The stage stream is read (a record there is applied), the message stream is not.
    let mut p1 = StageRecord::at(Stage::UploadSent, now());
    p1.request_id = Some(RequestId::new("ord-9").unwrap());
    p1.producer = Some(ClientId::new("shop").unwrap());
    publish_stage(&js, &[p1]).await;
    eventually("the stage record applied", || async {
        let s = c.stats(None).await.ok()?;
        (s.ingest.records == 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stream = js.get_stream(MESSAGE_STREAM).await.unwrap();
    assert!(
        stream
            .consumer_info(consumer_name("msgtrail-listener"))
            .await
            .is_err(),
        "no store-evidence consumer"
    );
    let err = c.trajectory(&a.id.to_string(), None).await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let s = c.stats(None).await.unwrap();
    assert_eq!(
        (s.ingest.stored_messages, s.lag.stored_polled_at),
        (0, None)
    );
    handle.shutdown().await.unwrap();
}
