//! Store evidence in a listener group, against a real nats-server: the test plays the broker
//! and its clients. Messages are stored in `MSGTRAIL_MESSAGES` with the broker's evidence
//! headers; their client records go to the stage stream's partition subjects, but for a third
//! of them the broker's own P2/P3 never reach it (as after a broker crash between storing a
//! message and publishing its stage records). Two members with one copy of each partition:
//!
//! - every message's recovered P2/P3 is in the store of the member holding its partition (as
//!   its heartbeat says) and in no other: each member keeps only its partitions' evidence;
//! - either member answers every message's full trajectory — the other's through the HTTP
//!   fan-out — with the store hop recovered where the broker's records are missing;
//! - when one member leaves, the other takes its partitions over and replays their older
//!   evidence from the message stream: it then holds every message's recovered P2/P3 and
//!   answers every full trajectory from its own store;
//! - the member that left restarts on its store, gets its partitions back and keeps the
//!   evidence of the messages stored while it was away.

mod common;
use common::scenario::{Scenario, MS};
use common::*;

use msgtrail_core::headers as h;
use msgtrail_core::partition::{self, Partition};
use msgtrail_core::subjects::{message_subject, MESSAGE_STREAM, MESSAGE_SUBJECT_PREFIX};
use msgtrail_core::trajectory::{AssembleOptions, MessageState, Trajectory, RECOVERED};
use msgtrail_core::{encode_batch, Stage, StageRecord};
use msgtrail_listener::cluster::{MemberInfo, MEMBER_BUCKET};
use msgtrail_listener::{ListenerConfig, ListenerHandle};
use msgtrail_nats::topology::{stage_stream, DEFAULT_STAGE_MAX_AGE};
use msgtrail_test_support::NatsServer;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

const BROKER_SERVICE: &str = "msgtrail-broker-eu";
const GROUP: &str = "g";

/// A member of group [`GROUP`] holding each partition once.
fn member(server: &NatsServer, dir: &Path, instance: &str) -> ListenerConfig {
    group_member(server.url(), dir, GROUP, instance, 1)
}

/// The message stream as the broker creates it (crates/broker/src/streams.rs).
fn message_stream_config() -> async_nats::jetstream::stream::Config {
    async_nats::jetstream::stream::Config {
        name: MESSAGE_STREAM.to_owned(),
        subjects: vec![format!("{MESSAGE_SUBJECT_PREFIX}.>")],
        storage: async_nats::jetstream::stream::StorageType::File,
        duplicate_window: Duration::from_secs(120),
        allow_direct: true,
        ..Default::default()
    }
}

/// One message: its records on the stage stream and the P2/P3 its stored copy yields.
struct Message {
    scenario: Scenario,
    /// Whether the broker's P2/P3 were lost (not published).
    crashed: bool,
    /// The P2/P3 the listener recovers from the stored message.
    recovered: Vec<StageRecord>,
}

impl Message {
    /// Every record a member holding the message's partition stores.
    fn all_records(&self) -> Vec<StageRecord> {
        let mut all = self.published();
        all.extend(self.recovered.iter().cloned());
        all
    }

    /// The records published on the stage stream: the clients', and the broker's P2/P3
    /// unless it crashed.
    fn published(&self) -> Vec<StageRecord> {
        self.scenario
            .out
            .iter()
            .filter(|r| !self.crashed || !matches!(r.stage, Stage::UploadReceived | Stage::Stored))
            .cloned()
            .collect()
    }

    /// The trajectory every member must answer.
    fn expected(&self) -> Trajectory {
        Trajectory::assemble(self.all_records(), &AssembleOptions::default()).unwrap()
    }
}

/// Stores message `i` as the broker does (evidence headers, P2 at the scenario's P2 time)
/// and returns it with the P2/P3 the listener must recover from it.
async fn store(js: &async_nats::jetstream::Context, i: usize, crashed: bool) -> Message {
    let mut s = Scenario::new(now(), "shop", &format!("ord-{i}"), "orders.eu");
    s.stored(0).pull(50, "billing", "b-1", 1, None);
    let received_at = s.t0 + MS; // the scenario's P2
    let payload = format!("order {i}").into_bytes();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(h::NATS_MSG_ID, format!("shop:{}", s.req).as_str());
    headers.insert(h::MESSAGE_ID, s.id.to_string().as_str());
    headers.insert(h::REQUEST_ID, s.req.as_str());
    headers.insert(h::PRODUCER, s.producer.as_str());
    headers.insert(h::TOPIC, s.topic.as_str());
    headers.insert(h::ATTEMPT, "1");
    headers.insert(h::RECEIVED_AT, received_at.to_string().as_str());
    headers.insert(h::BROKER_SERVICE, BROKER_SERVICE);
    let ack = js
        .publish_with_headers(message_subject(&s.topic), headers, payload.clone().into())
        .await
        .unwrap()
        .await
        .unwrap();
    let raw = js
        .get_stream(MESSAGE_STREAM)
        .await
        .unwrap()
        .get_raw_message(ack.sequence)
        .await
        .unwrap();
    let stored_at = raw.time.unix_timestamp_nanos() as u64;
    // What crates/listener/src/evidence.rs makes of those headers.
    let base = |stage: Stage, at: u64| {
        let mut r = StageRecord::at(stage, at);
        r.message_id = Some(s.id);
        r.request_id = Some(s.req.clone());
        r.producer = Some(s.producer.clone());
        r.topic = Some(s.topic.clone());
        r.attempt = Some(1);
        r.service = Some(BROKER_SERVICE.into());
        r.outcome = Some(RECOVERED.into());
        r
    };
    let mut p2 = base(Stage::UploadReceived, received_at);
    p2.payload_size = Some(payload.len() as u64);
    let mut p3 = base(Stage::Stored, stored_at);
    p3.stream_seq = Some(ack.sequence);
    Message {
        scenario: s,
        crashed,
        recovered: vec![p2, p3],
    }
}

/// Publishes the messages' stage records, split by partition onto their subjects.
async fn publish(js: &async_nats::jetstream::Context, messages: &[Message]) {
    let records: Vec<StageRecord> = messages.iter().flat_map(Message::published).collect();
    for batch in records.chunks(8) {
        for (p, part) in partition::split(batch.iter().cloned()) {
            js.publish(p.subject(), encode_batch(&part).into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
    }
}

/// Who holds each partition, as the members' heartbeats say, once every partition has one
/// ready owner among `members` and each of them holds some.
async fn owners(
    js: &async_nats::jetstream::Context,
    members: &[&str],
) -> BTreeMap<Partition, String> {
    let kv = js.get_key_value(MEMBER_BUCKET).await.unwrap();
    eventually("every partition held by one ready member", || async {
        let mut owners: BTreeMap<Partition, Vec<String>> = BTreeMap::new();
        for m in members {
            let entry = kv.get(format!("{GROUP}.{m}")).await.ok()??;
            let info: MemberInfo = serde_json::from_slice(&entry).ok()?;
            for held in info.partitions {
                if !held.ready {
                    return None;
                }
                owners
                    .entry(held.partition)
                    .or_default()
                    .push(info.name.clone());
            }
        }
        // Every member holds a share (one that just joined holds nothing for a beat or two).
        let all_hold = members
            .iter()
            .all(|m| owners.values().any(|o| o.iter().any(|n| n == m)));
        (all_hold
            && owners.len() == Partition::all().count()
            && owners.values().all(|o| o.len() == 1))
        .then(|| {
            owners
                .into_iter()
                .map(|(p, mut o)| (p, o.remove(0)))
                .collect()
        })
    })
    .await
}

/// The message's trajectory as `h`'s own store holds it (no fan-out).
fn local(h: &ListenerHandle, m: &Message) -> Option<Trajectory> {
    h.store()
        .trajectory(&m.scenario.id.to_string(), now())
        .unwrap()
}

/// Whether a trajectory's store hop has both recovered events.
fn has_recovered_store_hop(t: &Trajectory) -> bool {
    let recovered = |stage: Stage| {
        t.hop("store").is_some_and(|hop| {
            hop.events
                .iter()
                .any(|e| e.stage == stage && e.outcome.as_deref() == Some(RECOVERED))
        })
    };
    recovered(Stage::UploadReceived) && recovered(Stage::Stored)
}

/// Waits until `who` answers every message's full trajectory over HTTP.
async fn answers_all(who: &str, h: &ListenerHandle, messages: &[Message]) {
    let c = client(h);
    for m in messages {
        let expected = m.expected();
        assert_eq!(expected.state, MessageState::Consumed);
        let id = m.scenario.id.to_string();
        eventually(&format!("{who} answering {id} in full"), || async {
            let t = c.trajectory(&id, None).await.ok()?;
            (t == expected).then_some(())
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_member_keeps_the_store_evidence_of_its_partitions_and_a_takeover_replays_it() {
    let server = NatsServer::start().unwrap();
    let js = nats(&server).await;
    js.get_or_create_stream(stage_stream(1, DEFAULT_STAGE_MAX_AGE))
        .await
        .unwrap();
    js.get_or_create_stream(message_stream_config())
        .await
        .unwrap();

    // Messages stored before the group starts, and more once it runs; every third one's
    // broker P2/P3 lost.
    let mut messages = Vec::new();
    for i in 0..24 {
        messages.push(store(&js, i, i % 3 == 0).await);
    }
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let a = msgtrail_listener::start(member(&server, dirs[0].path(), "a"))
        .await
        .unwrap();
    let b = msgtrail_listener::start(member(&server, dirs[1].path(), "b"))
        .await
        .unwrap();
    let owner = owners(&js, &["a", "b"]).await;
    for i in 24..48 {
        messages.push(store(&js, i, i % 3 == 0).await);
    }
    publish(&js, &messages).await;
    let spread: std::collections::BTreeSet<&String> = messages
        .iter()
        .map(|m| &owner[&Partition::of_message(&m.scenario.id)])
        .collect();
    assert_eq!(
        spread.len(),
        2,
        "the messages span both members' partitions"
    );

    // Either member answers every message in full, the store hop recovered where the
    // broker's records were lost.
    answers_all("a", &a, &messages).await;
    answers_all("b", &b, &messages).await;
    for m in messages.iter().filter(|m| m.crashed) {
        assert!(has_recovered_store_hop(&m.expected()), "{:?}", m.expected());
    }

    // Each message's records, its recovered P2/P3 included, are in the store of the member
    // holding its partition, and in no other.
    for m in &messages {
        let p = Partition::of_message(&m.scenario.id);
        let (holder, other) = if owner[&p] == "a" { (&a, &b) } else { (&b, &a) };
        let held = local(holder, m).expect("the holder stores the message");
        assert_eq!(held, m.expected(), "partition {p}'s holder");
        assert_eq!(
            local(other, m),
            None,
            "partition {p} stored by its non-holder"
        );
    }

    // b leaves: a takes over b's partitions, rebuilds them from the stage stream and replays
    // their store evidence from the message stream.
    b.shutdown().await.unwrap();
    let after = owners(&js, &["a"]).await;
    assert!(after.values().all(|o| o == "a"));
    answers_all("a alone", &a, &messages).await;
    for m in &messages {
        let t = local(&a, m).expect("a stores every message after the takeover");
        // The same records, none twice (the replayed evidence of the messages a held
        // before is skipped by the store).
        assert_eq!(t, m.expected());
    }
    // What a would find again after a restart: every partition's evidence covered.
    let covered = std::fs::read_to_string(
        dirs[0]
            .path()
            .join(msgtrail_listener::cluster::EVIDENCE_COVERAGE_FILE),
    )
    .unwrap();
    let expected: Vec<String> = (0..16).map(|i| i.to_string()).collect();
    assert_eq!(covered.trim(), expected.join(","));

    // More messages while b is away, then b restarts on its store: it gets its partitions
    // back (the same owners) and its consumer resumes where it stopped — only once it holds
    // them again, so the messages stored meanwhile keep their evidence on b.
    let mut later = Vec::new();
    for i in 48..72 {
        later.push(store(&js, i, i % 3 == 0).await);
    }
    publish(&js, &later).await;
    let b = msgtrail_listener::start(member(&server, dirs[1].path(), "b"))
        .await
        .unwrap();
    assert_eq!(owners(&js, &["a", "b"]).await, owner);
    messages.extend(later);
    answers_all("b (restarted)", &b, &messages).await;
    for m in &messages {
        if owner[&Partition::of_message(&m.scenario.id)] == "b" {
            let t = local(&b, m).expect("b stores its partitions' messages");
            assert_eq!(t, m.expected(), "b after its restart");
        }
    }
    for h in [a, b] {
        h.shutdown().await.unwrap();
    }
}
