//! A client in another language, following only docs/PROTOCOL.md: examples/python/raw_client.py
//! (nats-py + nkeys, no msgtrail SDK) opens both channels, uploads, retries, fetches, reports
//! its own stage records and acks, against a real nats-server and a broker in this process;
//! then takes the batched binary path of §18 (an upload batch with one invalid message, a
//! binary report, a binary fetch, a settle batch with records riding along and one forged
//! token). The test checks what the script printed and what the stage stream holds for the
//! messages.
//!
//! Needs `python3 -m pip install nats-py nkeys`; without them the test fails and says so.

use bytes::Bytes;
use msgtrail_broker::{BrokerConfig, ClientEntry, ClientRegistry};
use msgtrail_client::{Identity, NatsOptions};
use msgtrail_core::decode_batch;
use msgtrail_core::frame::{
    self, FrameKind, ReportsOutcome, SettleResults, UploadBatch, UploadEntry, UploadResult,
    UploadResults,
};
use msgtrail_core::subjects::{STAGE_STREAM, STAGE_SUBJECT};
use msgtrail_core::{ClientId, ErrorCode, MessageId, Role, Stage, StageRecord, WireError};
use msgtrail_test_support::NatsServer;
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

const INSTALL: &str = "python3 -m pip install nats-py nkeys";
const TOPIC: &str = "py.orders.eu";
const GROUP: &str = "py-group";
const PAYLOAD: &str = r#"{"order":42,"note":"from python"}"#;
const INBOX_PREFIX: &str = "_INBOX_CLIENT.py";

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/python/raw_client.py")
}

/// Fails (never skips) when python3 or its packages are missing.
async fn require_python_packages() {
    let out = tokio::process::Command::new("python3")
        .args(["-c", "import nats, nkeys"])
        .output()
        .await
        .unwrap_or_else(|e| panic!("python3 is needed for this test ({e}); then run: {INSTALL}"));
    assert!(
        out.status.success(),
        "the Python packages of examples/python/raw_client.py are missing ({}); run: {INSTALL}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Runs the script; returns its exit success and its JSON lines.
async fn run_script(
    url: &str,
    producer: &Identity,
    producer_seed: &str,
    consumer: &Identity,
    request_id: &str,
) -> (bool, Vec<Value>) {
    let run = tokio::process::Command::new("python3")
        .arg(script())
        .args(["--nats-url", url])
        .args(["--producer-id", producer.client_id.as_str()])
        .args(["--consumer-id", consumer.client_id.as_str()])
        .args(["--topic", TOPIC, "--group", GROUP, "--payload", PAYLOAD])
        .args(["--request-id", request_id, "--trace"])
        // A private inbox prefix, as deploy/nats/accounts.conf requires (PROTOCOL.md §15).
        .args(["--inbox-prefix", INBOX_PREFIX])
        // Seeds through the environment, as the script recommends.
        .env("MSGTRAIL_PRODUCER_SEED", producer_seed)
        .env("MSGTRAIL_CONSUMER_SEED", consumer.seed())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("raw_client.py finishes within 60 s")
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = stdout
        .lines()
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}\nstderr:\n{stderr}"))
        })
        .collect();
    // The wire trace (--trace), shown when the test fails or runs with --nocapture.
    eprintln!(
        "raw_client.py exited with {}\nstdout:\n{stdout}\nstderr (wire trace):\n{stderr}",
        out.status
    );
    (out.status.success(), lines)
}

fn event<'a>(lines: &'a [Value], name: &str) -> Vec<&'a Value> {
    lines.iter().filter(|l| l["event"] == name).collect()
}

/// Every stage record in the stage stream.
async fn stage_records(nats: &async_nats::Client) -> Vec<StageRecord> {
    let js = async_nats::jetstream::new(nats.clone());
    let mut stream = js
        .get_stream(STAGE_STREAM)
        .await
        .expect("stage stream exists");
    let last = stream
        .info()
        .await
        .expect("stream info")
        .state
        .last_sequence;
    let mut out = vec![];
    for seq in 1..=last {
        // The stage stream does not allow direct gets: use the stream API's message get.
        let m = stream
            .get_raw_message(seq)
            .await
            .expect("stage batch readable");
        assert_eq!(m.subject.as_str(), STAGE_SUBJECT);
        // The broker writes stage stream version 2 (compact records, PROTOCOL.md §18.7).
        assert_eq!(
            frame::frame_kind(&m.payload),
            Some(FrameKind::StageBatch),
            "stage batch {seq} is not a version 2 frame"
        );
        out.extend(decode_batch(&m.payload).expect("stage batches decode"));
    }
    out
}

fn of(recs: &[StageRecord], stage: Stage) -> Vec<&StageRecord> {
    recs.iter().filter(|r| r.stage == stage).collect()
}

/// A nats-server and an in-process broker configured with `producer` (topics `ptopics`) and
/// `consumer` (topics `ctopics`).
struct System {
    server: NatsServer,
    broker: msgtrail_broker::RunningBroker,
    nats: async_nats::Client,
}

impl System {
    async fn start(
        producer: &Identity,
        ptopics: &[&str],
        consumer: &Identity,
        ctopics: &[&str],
    ) -> System {
        let server = NatsServer::start().expect("nats-server starts");
        let entry = |ident: &Identity, role: Role, topics: &[&str]| ClientEntry {
            id: ident.client_id.clone(),
            role,
            public_key: ident.public_key(),
            topics: topics.iter().map(|t| t.to_string()).collect(),
            service_name: None,
        };
        let broker = msgtrail_broker::start(BrokerConfig {
            nats: NatsOptions::url(server.url()),
            clients: ClientRegistry::new(vec![
                entry(producer, Role::Producer, ptopics),
                entry(consumer, Role::Consumer, ctopics),
            ])
            .unwrap(),
            stage_batch_linger: Duration::from_millis(5),
            ..Default::default()
        })
        .await
        .expect("broker starts");
        let nats = async_nats::connect(server.url()).await.unwrap();
        System {
            server,
            broker,
            nats,
        }
    }

    /// Waits until the stage stream holds every stage of `want` among the records `keep`
    /// selects, and returns those records; fails after 10 s with what it saw.
    async fn records_until(
        &self,
        want: &[Stage],
        keep: impl Fn(&StageRecord) -> bool,
    ) -> Vec<StageRecord> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let recs: Vec<StageRecord> = stage_records(&self.nats)
                .await
                .into_iter()
                .filter(|r| keep(r))
                .collect();
            if want.iter().all(|w| recs.iter().any(|r| r.stage == *w)) {
                return recs;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "stage records never completed: {:?}",
                recs.iter().map(|r| r.stage).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_raw_client_walks_the_protocol_and_its_trajectory_is_recorded() {
    require_python_packages().await;
    let producer = Identity::generate(ClientId::new("py-producer").unwrap());
    let consumer = Identity::generate(ClientId::new("py-consumer").unwrap());
    let sys = System::start(&producer, &["py.>"], &consumer, &["py.orders.*"]).await;
    let (server, nats) = (&sys.server, &sys.nats);

    // A wrong key is refused with the documented error reply, and the script says so.
    let (ok, lines) = run_script(
        server.url(),
        &producer,
        &consumer.seed(),
        &consumer,
        "py-wrong-key",
    )
    .await;
    assert!(
        !ok,
        "a producer signing with another key must fail: {lines:?}"
    );
    let err = lines.last().expect("an error line");
    assert_eq!(err["event"], "error", "{lines:?}");
    assert_eq!(err["code"], "bad_signature", "{err}");
    assert_eq!(err["status"], 401, "{err}");
    assert_eq!(err["subject"], "msgtrail.v1.channel.open", "{err}");

    // The whole walk.
    let request_id = "py-order-42";
    let (ok, lines) = run_script(
        server.url(),
        &producer,
        &producer.seed(),
        &consumer,
        request_id,
    )
    .await;
    assert!(ok, "raw_client.py failed: {lines:#?}");
    let names: Vec<&str> = lines.iter().filter_map(|l| l["event"].as_str()).collect();
    assert_eq!(
        names,
        [
            "channel_opened",
            "uploaded",
            "reported",
            "uploaded",
            "channel_opened",
            "keepalive",
            "fetched",
            "reported",
            "acked",
            "fetched_none",
            "subscribed",
            "uploaded",
            "pushed",
            "reported",
            "acked",
            "unsubscribed",
            "batch_uploaded",
            "batch_reported",
            "batch_fetched",
            "batch_settled",
            "batch_fetched_none",
            "closed"
        ]
    );
    let opened = event(&lines, "channel_opened");
    assert_eq!(opened[0]["role"], "producer");
    assert_eq!(opened[0]["topics"], serde_json::json!(["py.>"]));
    assert_eq!(opened[0]["ttl_ms"], 60_000);
    assert_eq!(opened[1]["role"], "consumer");

    let uploads = event(&lines, "uploaded");
    let message_id: MessageId = uploads[0]["message_id"]
        .as_str()
        .expect("message_id")
        .parse()
        .expect("the broker assigned a UUIDv7");
    assert_eq!(uploads[0]["request_id"], request_id);
    assert_eq!(uploads[0]["duplicate"], false);
    assert_eq!(uploads[0]["stream_seq"], 1);
    // The retry: stored once, same message ID, same sequence.
    assert_eq!(uploads[1]["message_id"], uploads[0]["message_id"]);
    assert_eq!(uploads[1]["duplicate"], true);
    assert_eq!(uploads[1]["stream_seq"], 1);

    let fetched = event(&lines, "fetched")[0];
    assert_eq!(fetched["message_id"], message_id.to_string());
    assert_eq!(fetched["payload"], PAYLOAD);
    assert_eq!(fetched["topic"], TOPIC);
    assert_eq!(
        fetched["attributes"],
        serde_json::json!({"category": "refund"})
    );
    assert_eq!(fetched["delivery_attempt"], 1);
    assert_eq!(fetched["producer"], "py-producer");
    assert_eq!(fetched["group"], GROUP);
    let reported = event(&lines, "reported");
    assert_eq!(reported[0]["accepted"], 2);
    assert_eq!(reported[1]["accepted"], 4);
    assert_eq!(
        event(&lines, "acked")[0]["message_id"],
        message_id.to_string()
    );
    assert_eq!(
        event(&lines, "fetched_none")[0]["notice"],
        "no_matching_message"
    );

    // The stage stream holds the whole trajectory, the client's records relayed by the broker.
    let want = [
        Stage::UploadSent,
        Stage::UploadReceived,
        Stage::Stored,
        Stage::StoreConfirmed,
        Stage::Duplicate,
        Stage::PullSent,
        Stage::PullReceived,
        Stage::ProcessStarted,
        Stage::ProcessFinished,
        Stage::PullAckSent,
        Stage::PullAckReceived,
        Stage::NoMatch,
    ];
    let recs = sys
        .records_until(&want, |r| {
            r.message_id == Some(message_id)
                || r.request_id.as_ref().map(|r| r.as_str()) == Some(request_id)
        })
        .await;
    for stage in want {
        assert_eq!(of(&recs, stage).len(), 1, "exactly one {stage}: {recs:#?}");
    }
    let one = |s: Stage| of(&recs, s)[0];
    // Production: P1 has the request ID only (no message ID yet); the rest carry both.
    let p1 = one(Stage::UploadSent);
    assert_eq!(p1.message_id, None);
    assert_eq!(
        p1.producer.as_ref().map(|p| p.as_str()),
        Some("py-producer")
    );
    assert_eq!(p1.service.as_deref(), Some("py-producer"));
    assert_eq!(p1.attempt, Some(1));
    for s in [
        Stage::UploadReceived,
        Stage::Stored,
        Stage::StoreConfirmed,
        Stage::Duplicate,
    ] {
        let r = one(s);
        assert_eq!(r.message_id, Some(message_id), "{s}");
        assert_eq!(
            r.request_id.as_ref().map(|r| r.as_str()),
            Some(request_id),
            "{s}"
        );
        assert_eq!(
            r.producer.as_ref().map(|p| p.as_str()),
            Some("py-producer"),
            "{s}"
        );
    }
    let p2 = one(Stage::UploadReceived);
    assert_eq!(p2.attrs.get("category").map(String::as_str), Some("refund"));
    assert_eq!(p2.payload_size, Some(PAYLOAD.len() as u64));
    assert_eq!(p2.service.as_deref(), Some("msgtrail-broker"));
    assert_eq!(one(Stage::Stored).stream_seq, Some(1));
    assert_eq!(one(Stage::Duplicate).attempt, Some(2));
    // Consumption: every C record names the consumer, the group and attempt 1.
    for s in [
        Stage::PullSent,
        Stage::PullReceived,
        Stage::ProcessStarted,
        Stage::ProcessFinished,
        Stage::PullAckSent,
        Stage::PullAckReceived,
    ] {
        let r = one(s);
        assert_eq!(r.message_id, Some(message_id), "{s}");
        assert_eq!(
            r.consumer.as_ref().map(|c| c.as_str()),
            Some("py-consumer"),
            "{s}"
        );
        assert_eq!(r.group.as_ref().map(|g| g.as_str()), Some(GROUP), "{s}");
        assert_eq!(r.attempt, Some(1), "{s}");
    }
    assert_eq!(
        one(Stage::PullReceived).service.as_deref(),
        Some("py-consumer")
    );
    assert_eq!(one(Stage::ProcessFinished).outcome.as_deref(), Some("ok"));
    assert_eq!(one(Stage::PullAckReceived).outcome.as_deref(), Some("ack"));
    let n1 = one(Stage::NoMatch);
    assert_eq!(
        n1.consumer.as_ref().map(|c| c.as_str()),
        Some("py-consumer")
    );
    assert_eq!(n1.group.as_ref().map(|g| g.as_str()), Some(GROUP));
    assert_eq!(
        n1.detail, None,
        "a fetch by message ID has no attribute filter"
    );
    // The client's records are stamped with its own clock, before the broker's matching ones.
    assert!(p1.at <= p2.at, "P1 at {} after P2 at {}", p1.at, p2.at);
    assert!(one(Stage::PullAckSent).at <= one(Stage::PullAckReceived).at);

    // Push: the second upload arrived on the script's inbox with the documented headers,
    // and its trajectory has the push stages C1–C4 with the consumer's C2/C3 relayed.
    let push_id: MessageId = uploads[2]["message_id"].as_str().unwrap().parse().unwrap();
    assert_ne!(push_id, message_id);
    assert_eq!(uploads[2]["duplicate"], false);
    let pushed = event(&lines, "pushed")[0];
    assert_eq!(pushed["message_id"], push_id.to_string());
    assert!(
        pushed["subject"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{INBOX_PREFIX}.")),
        "pushes come to an inbox under the client's prefix: {pushed}"
    );
    assert_eq!(pushed["payload"], PAYLOAD, "pushed payloads are raw bytes");
    assert_eq!(pushed["topic"], TOPIC);
    assert_eq!(pushed["group"], GROUP);
    assert_eq!(pushed["attempt"], 1);
    assert_eq!(pushed["producer"], "py-producer");
    assert_eq!(pushed["stream_seq"], uploads[2]["stream_seq"]);
    assert_eq!(
        pushed["attributes"].as_object().unwrap().len(),
        1,
        "{pushed}"
    );
    assert_eq!(reported[2]["accepted"], 4);
    assert_eq!(event(&lines, "acked")[1]["message_id"], push_id.to_string());
    let push_want = [
        Stage::UploadReceived,
        Stage::Stored,
        Stage::PushSent,
        Stage::PushReceived,
        Stage::ProcessStarted,
        Stage::ProcessFinished,
        Stage::PushAckSent,
        Stage::PushAckReceived,
    ];
    let push_recs = sys
        .records_until(&push_want, |r| r.message_id == Some(push_id))
        .await;
    for stage in push_want {
        let rs = of(&push_recs, stage);
        assert_eq!(rs.len(), 1, "exactly one {stage}: {push_recs:#?}");
        if stage.is_push() {
            assert_eq!(
                rs[0].consumer.as_ref().map(|c| c.as_str()),
                Some("py-consumer")
            );
            assert_eq!(rs[0].group.as_ref().map(|g| g.as_str()), Some(GROUP));
            assert_eq!(rs[0].attempt, Some(1));
        }
    }
    assert_eq!(
        of(&push_recs, Stage::PushAckReceived)[0].outcome.as_deref(),
        Some("ack")
    );
    assert!(
        !push_recs.iter().any(|r| matches!(
            r.stage,
            Stage::PullSent | Stage::PullReceived | Stage::PullAckSent | Stage::PullAckReceived
        )),
        "a pushed message has no pull stages: {push_recs:#?}"
    );

    check_batched_path(&sys, &lines, uploads[2]["stream_seq"].as_u64().unwrap()).await;

    // Channels: A1 opened for both (and refused for the wrong key), closed for both.
    let all = stage_records(nats).await;
    let a1 = |outcome: &str| {
        of(&all, Stage::Channel)
            .into_iter()
            .filter(|r| r.outcome.as_deref() == Some(outcome))
            .count()
    };
    assert_eq!(a1("opened"), 2);
    assert_eq!(a1("refused"), 1);
    assert_eq!(a1("closed"), 2);

    sys.broker.shutdown().await;
}

/// The batched binary path of the walk (PROTOCOL.md §18): what the script printed and what
/// the stage stream holds for the batched messages. `last_seq` is the stream sequence of the
/// upload before the batch.
async fn check_batched_path(sys: &System, lines: &[Value], last_seq: u64) {
    // One upload batch of four: per-message results in order, the invalid topic refused
    // alone, its neighbours stored.
    let uploaded = event(lines, "batch_uploaded")[0];
    let results = uploaded["results"].as_array().expect("results");
    assert_eq!(results.len(), 4, "{uploaded}");
    assert_eq!(
        uploaded["reports"],
        serde_json::json!({"accepted": 0, "error": null}),
        "nothing rode along the upload batch"
    );
    let refused = &results[2];
    assert_eq!(refused["ok"], false, "{refused}");
    assert_eq!(refused["code"], "invalid_topic", "{refused}");
    assert!(refused.get("message_id").is_none(), "{refused}");
    let mut batched: Vec<(MessageId, String, u64)> = vec![];
    for (i, r) in [&results[0], &results[1], &results[3]]
        .into_iter()
        .enumerate()
    {
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(r["duplicate"], false, "{r}");
        assert_eq!(
            r["stream_seq"],
            last_seq + 1 + i as u64,
            "stored in order: {r}"
        );
        batched.push((
            r["message_id"].as_str().unwrap().parse().expect("a UUIDv7"),
            r["request_id"].as_str().unwrap().to_owned(),
            r["sent_at"].as_u64().expect("sent_at"),
        ));
    }
    assert_eq!(event(lines, "batch_reported")[0]["accepted"], 3, "the P4s");

    // The binary fetch: raw payloads (one of 0 bytes), attributes, one frame.
    let fetched = event(lines, "batch_fetched")[0]["messages"]
        .as_array()
        .expect("messages");
    assert_eq!(fetched.len(), 3, "{fetched:#?}");
    let payloads = [
        (hex_of(br#"{"order": 43}"#), 13),
        (String::new(), 0),
        ("0001feff".to_owned(), 4),
    ];
    for ((m, (id, _, _)), (hex, size)) in fetched.iter().zip(&batched).zip(&payloads) {
        assert_eq!(m["message_id"], id.to_string(), "{m}");
        assert_eq!(m["payload_hex"], *hex, "{m}");
        assert_eq!(m["payload_size"], *size, "{m}");
        assert_eq!(m["topic"], TOPIC);
        assert_eq!(m["group"], GROUP);
        assert_eq!(m["producer"], "py-producer");
        assert_eq!(m["delivery_attempt"], 1);
        assert!(m["attributes"]["run"].is_string(), "{m}");
    }
    assert_eq!(fetched[0]["attributes"]["category"], "refund");

    // One settle batch: the three acks settled, the forged token refused alone, and the
    // twelve consumer records that rode along accepted.
    let settled = event(lines, "batch_settled")[0];
    let results = settled["results"].as_array().expect("results");
    assert_eq!(results.len(), 4, "{settled}");
    assert_eq!(results[1]["forged"], true);
    assert_eq!(results[1]["ok"], false, "{settled}");
    assert_eq!(results[1]["code"], "bad_ack_token", "{settled}");
    for (r, (id, _, _)) in [&results[0], &results[2], &results[3]]
        .into_iter()
        .zip(&batched)
    {
        assert_eq!(r["ok"], true, "{settled}");
        assert_eq!(r["message_id"], id.to_string());
    }
    assert_eq!(
        settled["reports"],
        serde_json::json!({"accepted": 12, "error": null}),
        "{settled}"
    );
    let none = event(lines, "batch_fetched_none")[0];
    assert_eq!(none["no_matching_message"], true, "{none}");
    assert_eq!(none["messages"], 0, "{none}");

    // The stage stream: the whole trajectory of each batched message — P1 from the entry's
    // sent_at, the broker's P2/P3/C5/C8, the relayed P4 and C6/X1/X2/C7.
    let want = [
        Stage::UploadSent,
        Stage::UploadReceived,
        Stage::Stored,
        Stage::StoreConfirmed,
        Stage::PullSent,
        Stage::PullReceived,
        Stage::ProcessStarted,
        Stage::ProcessFinished,
        Stage::PullAckSent,
        Stage::PullAckReceived,
    ];
    for (i, (id, request_id, sent_at)) in batched.iter().enumerate() {
        let recs = sys
            .records_until(&want, |r| {
                r.message_id == Some(*id)
                    || r.request_id.as_ref().map(|q| q.as_str()) == Some(request_id.as_str())
            })
            .await;
        for stage in want {
            assert_eq!(
                of(&recs, stage).len(),
                1,
                "{request_id}: exactly one {stage}: {recs:#?}"
            );
        }
        let one = |s: Stage| of(&recs, s)[0];
        let p1 = one(Stage::UploadSent);
        assert_eq!(p1.at, *sent_at, "P1 is the entry's sent_at");
        assert_eq!(p1.message_id, None);
        assert_eq!(p1.topic.as_deref(), Some(TOPIC));
        assert_eq!(p1.attempt, Some(1));
        assert_eq!(
            p1.producer.as_ref().map(|p| p.as_str()),
            Some("py-producer")
        );
        assert_eq!(p1.service.as_deref(), Some("py-producer"));
        assert_eq!(
            one(Stage::UploadReceived).payload_size,
            Some(payloads[i].1 as u64)
        );
        assert_eq!(
            one(Stage::StoreConfirmed).stream_seq,
            Some(last_seq + 1 + i as u64)
        );
        for s in [
            Stage::PullSent,
            Stage::PullReceived,
            Stage::ProcessStarted,
            Stage::ProcessFinished,
            Stage::PullAckSent,
            Stage::PullAckReceived,
        ] {
            let r = one(s);
            assert_eq!(r.message_id, Some(*id), "{s}");
            assert_eq!(
                r.consumer.as_ref().map(|c| c.as_str()),
                Some("py-consumer"),
                "{s}"
            );
            assert_eq!(r.group.as_ref().map(|g| g.as_str()), Some(GROUP), "{s}");
            assert_eq!(r.attempt, Some(1), "{s}");
        }
        assert_eq!(one(Stage::ProcessFinished).outcome.as_deref(), Some("ok"));
        assert_eq!(one(Stage::PullAckSent).outcome.as_deref(), Some("ack"));
        assert_eq!(one(Stage::PullAckReceived).outcome.as_deref(), Some("ack"));
        assert!(one(Stage::PullAckSent).at <= one(Stage::PullAckReceived).at);
    }

    // The refused entry: its P1 (the request ID is valid, the topic is not: left out) and a
    // P2 with outcome `refused` that says why; never stored.
    let refused_id = refused["request_id"].as_str().unwrap();
    let recs = sys
        .records_until(&[Stage::UploadSent, Stage::UploadReceived], |r| {
            r.request_id.as_ref().map(|q| q.as_str()) == Some(refused_id)
        })
        .await;
    let p1 = of(&recs, Stage::UploadSent);
    assert_eq!(p1.len(), 1, "{recs:#?}");
    assert_eq!(p1[0].at, refused["sent_at"].as_u64().unwrap());
    assert_eq!(p1[0].topic, None, "an invalid topic is not recorded");
    let p2 = of(&recs, Stage::UploadReceived);
    assert_eq!(p2.len(), 1, "{recs:#?}");
    assert_eq!(p2[0].outcome.as_deref(), Some("refused"));
    assert_eq!(p2[0].message_id, None);
    assert!(
        p2[0]
            .detail
            .as_deref()
            .is_some_and(|d| d.starts_with("invalid_topic")),
        "{:?}",
        p2[0].detail
    );
    assert!(of(&recs, Stage::Stored).is_empty(), "{recs:#?}");
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// docs/PROTOCOL.md, read at test time so the tests below check the document itself.
fn protocol_md() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/PROTOCOL.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The ```python block after the worked-example marker of docs/PROTOCOL.md.
fn worked_example() -> String {
    let doc = protocol_md();
    let marker = "<!-- worked-example:";
    let after = &doc[doc
        .find(marker)
        .expect("PROTOCOL.md has the worked-example marker")..];
    let start = after
        .find("```python\n")
        .expect("a python block follows the marker")
        + 10;
    let len = after[start..].find("\n```").expect("the python block ends");
    after[start..start + len + 1].to_owned()
}

/// The worked example of docs/PROTOCOL.md §17, run as written against a broker configured
/// like `msgtrail dev` (producer `dev-producer`, consumer `dev-consumer`, any topic), with
/// a dev file of the shape `msgtrail dev` writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_md_worked_example_runs_and_records_the_trajectory() {
    require_python_packages().await;
    let producer = Identity::generate(ClientId::new("dev-producer").unwrap());
    let consumer = Identity::generate(ClientId::new("dev-consumer").unwrap());
    let sys = System::start(&producer, &[">"], &consumer, &[">"]).await;
    // Another message waits in the topic first (sent with the Rust SDK): the example must
    // fetch its own message, not this one.
    let decoy = msgtrail_client::Producer::connect(sys.nats.clone(), producer.clone())
        .await
        .expect("SDK producer channel opens")
        .send("orders.eu", "an earlier message")
        .await
        .expect("decoy stored");
    let dir = std::env::temp_dir().join(format!(
        "msgtrail-worked-example-{}-{}",
        std::process::id(),
        msgtrail_core::time::now_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let dev_file = dir.join("dev.json");
    let script = dir.join("worked_example.py");
    std::fs::write(
        &dev_file,
        serde_json::json!({
            "nats_url": sys.server.url(),
            "producer": {"id": "dev-producer", "seed": producer.seed()},
            "consumer": {"id": "dev-consumer", "seed": consumer.seed()},
            "listener_url": null,
        })
        .to_string(),
    )
    .unwrap();
    std::fs::write(&script, worked_example()).unwrap();
    let run = tokio::process::Command::new("python3")
        .arg(&script)
        .env("MSGTRAIL_DEV_FILE", &dev_file)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the worked example finishes within 60 s")
        .expect("python3 runs");
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the worked example failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    let stored = &lines[0]["stored"];
    let message_id: MessageId = stored["message_id"].as_str().unwrap().parse().unwrap();
    assert_eq!(stored["duplicate"], false);
    assert_ne!(message_id, decoy.message_id);
    assert_eq!(lines[1]["received"], message_id.to_string());
    assert_eq!(lines[1]["payload"], r#"{"order": 42}"#);
    assert_eq!(
        lines[1]["attributes"],
        serde_json::json!({"category": "refund"})
    );
    assert_eq!(lines[2]["acked"], message_id.to_string());
    assert_eq!(lines[2]["trace_id"], message_id.trace_hex());

    let want = [
        Stage::UploadSent,
        Stage::UploadReceived,
        Stage::Stored,
        Stage::StoreConfirmed,
        Stage::PullSent,
        Stage::PullReceived,
        Stage::PullAckSent,
        Stage::PullAckReceived,
    ];
    let request_id = stored["request_id"].as_str().unwrap().to_owned();
    let recs = sys
        .records_until(&want, |r| {
            r.message_id == Some(message_id)
                || r.request_id.as_ref().map(|r| r.as_str()) == Some(request_id.as_str())
        })
        .await;
    for stage in want {
        assert_eq!(of(&recs, stage).len(), 1, "exactly one {stage}: {recs:#?}");
    }
    for s in [Stage::PullReceived, Stage::PullAckSent] {
        let r = of(&recs, s)[0];
        assert_eq!(
            r.consumer.as_ref().map(|c| c.as_str()),
            Some("dev-consumer")
        );
        assert_eq!(r.group.as_ref().map(|g| g.as_str()), Some("billing"));
        assert_eq!(r.attempt, Some(1));
    }
    assert_eq!(
        of(&recs, Stage::PullAckReceived)[0].outcome.as_deref(),
        Some("ack")
    );
    sys.broker.shutdown().await;
}

/// The bytes of the hex dump (```text block, `offset  xx xx …` lines) that follows `marker`
/// in docs/PROTOCOL.md.
fn hex_dump_after(doc: &str, marker: &str) -> Bytes {
    let after = &doc[doc
        .find(marker)
        .unwrap_or_else(|| panic!("PROTOCOL.md has the marker {marker}"))..];
    let start = after
        .find("```text\n")
        .expect("a text block follows the marker")
        + 8;
    let len = after[start..].find("```").expect("the text block ends");
    let mut out = vec![];
    for line in after[start..start + len].lines() {
        let mut tokens = line.split_whitespace();
        let offset = tokens.next().expect("each line starts with its offset");
        assert_eq!(
            usize::from_str_radix(offset, 16).ok(),
            Some(out.len()),
            "offset of line {line:?}"
        );
        for t in tokens {
            out.push(
                u8::from_str_radix(t, 16)
                    .unwrap_or_else(|_| panic!("not a hex byte: {t:?} in {line:?}")),
            );
        }
    }
    Bytes::from(out)
}

/// The ```python block that follows `marker` in docs/PROTOCOL.md.
fn python_block_after(doc: &str, marker: &str) -> String {
    let after = &doc[doc
        .find(marker)
        .unwrap_or_else(|| panic!("PROTOCOL.md has the marker {marker}"))..];
    let start = after
        .find("```python\n")
        .expect("a python block follows the marker")
        + 10;
    let len = after[start..].find("\n```").expect("the python block ends");
    after[start..start + len + 1].to_owned()
}

/// Runs `python3 -c code args…`; returns its stdout, failing the test on any error.
async fn python(code: &str, args: &[&str]) -> String {
    let out = tokio::process::Command::new("python3")
        .arg("-c")
        .arg(code)
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "python failed: {}\n{code}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// The frames of docs/PROTOCOL.md §18 are what msgtrail-core encodes and decodes, and what
/// the document's Python snippet and examples/python/raw_client.py write and read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_md_frame_examples_match_msgtrail_core_and_the_python_client() {
    require_python_packages().await;
    let doc = protocol_md();

    // The upload batch of §18.7: one message, its P1 time riding in the entry.
    let request = hex_dump_after(&doc, "<!-- frame-hex: upload-batch");
    let batch = UploadBatch::decode(&request).expect("the example upload batch decodes");
    assert_eq!(
        batch,
        UploadBatch {
            entries: vec![UploadEntry {
                request_id: "order-44".into(),
                topic: "orders.eu".into(),
                attempt: 1,
                sent_at: 1_796_129_311_004_043_022,
                traceparent: String::new(),
                attrs: vec![("category".into(), "refund".into())],
                payload: Bytes::from_static(br#"{"order": 44}"#),
            }],
            reports: vec![],
            ..Default::default()
        }
    );
    assert_eq!(
        batch.encode(),
        request,
        "msgtrail-core writes the same bytes"
    );
    let snippet = python_block_after(&doc, "<!-- frame-python: upload-batch");
    assert_eq!(
        python(&snippet, &[]).await.trim(),
        hex_of(&request),
        "the Python of §18.7 writes the bytes of its dump"
    );

    // Its reply, the settle results of raw_client.py's settle batch, and the stage batch of
    // §18.6.
    let reply = hex_dump_after(&doc, "<!-- frame-hex: upload-results");
    let results = UploadResults::decode(&reply).expect("the example reply decodes");
    assert_eq!(
        results,
        UploadResults {
            results: vec![UploadResult::Stored {
                message_id: "01a231a6-491c-76c3-aae6-cb02704bf130".parse().unwrap(),
                stream_seq: 6,
                duplicate: false,
                receipt: "XqxjwRniMYBWT54UcgUKaLcirK4uq1bGLD451fj7la4".into(),
            }],
            reports: ReportsOutcome::default(),
        }
    );
    assert_eq!(results.encode(), reply);
    let settled = hex_dump_after(&doc, "<!-- frame-hex: settle-results");
    let settle_results = SettleResults::decode(&settled).expect("the settle results decode");
    let forged = WireError::new(
        ErrorCode::BadAckToken,
        "ack token signature does not verify (altered, or not issued by this deployment)",
    );
    assert_eq!(
        settle_results,
        SettleResults {
            results: vec![None, Some(forged), None, None],
            reports: ReportsOutcome {
                accepted: 12,
                error: None,
            },
        }
    );
    assert_eq!(settle_results.encode(), settled);
    let stage_batch = hex_dump_after(&doc, "<!-- frame-hex: stage-batch");
    assert_eq!(frame::frame_kind(&stage_batch), Some(FrameKind::StageBatch));
    let records = decode_batch(&stage_batch).expect("the stage batch decodes");
    let p1: StageRecord = serde_json::from_str(
        r#"{"stage":"P1","at":1796129311004043022,"request_id":"order-44","producer":"dev-producer","topic":"orders.eu","attempt":1,"service":"dev-producer"}"#,
    )
    .unwrap();
    assert_eq!(records, vec![p1]);
    assert_eq!(frame::encode_stage_batch(&records), stage_batch.to_vec());

    // raw_client.py encodes the same upload batch and reads both replies alike.
    let client = python(
        r#"
import json, sys
sys.path.insert(0, sys.argv[1])
import raw_client as r
print(r.encode_upload_batch([{"request_id": "order-44", "topic": "orders.eu", "attempt": 1,
    "sent_at": 1796129311004043022, "attrs": {"category": "refund"},
    "payload": b'{"order": 44}'}]).hex())
print(json.dumps(r.decode_upload_results(bytes.fromhex(sys.argv[2]))))
print(json.dumps(r.decode_settle_results(bytes.fromhex(sys.argv[3]))))
"#,
        &[
            script().parent().unwrap().to_str().unwrap(),
            &hex_of(&reply),
            &hex_of(&settled),
        ],
    )
    .await;
    let lines: Vec<&str> = client.lines().collect();
    assert_eq!(lines.len(), 3, "{client}");
    assert_eq!(lines[0], hex_of(&request), "raw_client.py's upload batch");
    let uploaded: Value = serde_json::from_str(lines[1]).unwrap();
    assert_eq!(
        uploaded,
        serde_json::json!([[{"ok": true, "message_id": "01a231a6-491c-76c3-aae6-cb02704bf130",
            "stream_seq": 6, "duplicate": false,
            "receipt": "XqxjwRniMYBWT54UcgUKaLcirK4uq1bGLD451fj7la4"}],
            {"accepted": 0, "error": null}])
    );
    let settle: Value = serde_json::from_str(lines[2]).unwrap();
    assert_eq!(settle[0][1]["code"], "bad_ack_token", "{settle}");
    assert_eq!(settle[0].as_array().unwrap().len(), 4, "{settle}");
    assert_eq!(
        settle[1],
        serde_json::json!({"accepted": 12, "error": null})
    );
}

/// The span and orphan trace IDs printed in docs/PROTOCOL.md §13 are those msgtrail-core
/// computes.
#[test]
fn protocol_md_trace_id_examples_match_msgtrail_core() {
    use msgtrail_core::trace_ids::{hex, orphan_trace_id, span_id, trace_id, Hop};
    use msgtrail_core::RequestId;
    let doc = protocol_md();
    let m: MessageId = "0193a5f2-7c1e-7b2a-9f10-3c4d5e6f7a8b".parse().unwrap();
    assert!(doc.contains(&format!("# {}", hex(&trace_id(&m)))));
    let mut checked = 0;
    for line in doc.lines() {
        let Some((call, expected)) = line.split_once("# ") else {
            continue;
        };
        let expected = expected.trim();
        if let Some(hop) = call
            .trim()
            .strip_prefix("span_id(m, \"")
            .and_then(|r| r.strip_suffix("\")"))
        {
            let parts: Vec<&str> = hop.split('/').collect();
            let hop = match parts[..] {
                ["send"] => Hop::Send,
                ["store"] => Hop::Store,
                ["deliver", group, consumer, n] => Hop::Deliver {
                    group,
                    consumer,
                    attempt: n.parse().unwrap(),
                },
                ["process", group, consumer, n] => Hop::Process {
                    group,
                    consumer,
                    attempt: n.parse().unwrap(),
                },
                _ => panic!("unknown hop in PROTOCOL.md: {hop}"),
            };
            assert_eq!(hex(&span_id(&m, &hop)), expected, "{line}");
            checked += 1;
        } else if call.trim() == "orphan_trace_id(\"shop\", \"order-42\")" {
            let id = orphan_trace_id(
                &ClientId::new("shop").unwrap(),
                &RequestId::new("order-42").unwrap(),
            );
            assert_eq!(hex(&id), expected, "{line}");
            checked += 1;
        }
    }
    assert_eq!(
        checked, 5,
        "PROTOCOL.md §13 lists four span IDs and one orphan trace ID"
    );
}
