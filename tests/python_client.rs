//! A client in another language, following only docs/PROTOCOL.md: examples/python/raw_client.py
//! (nats-py + nkeys, no msgtrail SDK) opens both channels, uploads, retries, fetches, reports
//! its own stage records and acks, against a real nats-server and a broker in this process.
//! The test checks what the script printed and what the stage stream holds for the message.
//!
//! Needs `python3 -m pip install nats-py nkeys`; without them the test fails and says so.

use msgtrail_broker::{BrokerConfig, ClientEntry, ClientRegistry};
use msgtrail_client::{Identity, NatsOptions};
use msgtrail_core::record::decode_batch;
use msgtrail_core::subjects::{STAGE_STREAM, STAGE_SUBJECT};
use msgtrail_core::{ClientId, MessageId, Role, Stage, StageRecord};
use msgtrail_test_support::NatsServer;
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

const INSTALL: &str = "python3 -m pip install nats-py nkeys";
const TOPIC: &str = "py.orders.eu";
const GROUP: &str = "py-group";
const PAYLOAD: &str = r#"{"order":42,"note":"from python"}"#;

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
        .args(["--request-id", request_id])
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
    if !out.status.success() {
        eprintln!(
            "raw_client.py exited with {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
            out.status
        );
    }
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
        out.extend(decode_batch(&m.payload).expect("stage batches are NDJSON records"));
    }
    out
}

fn of(recs: &[StageRecord], stage: Stage) -> Vec<&StageRecord> {
    recs.iter().filter(|r| r.stage == stage).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_raw_client_walks_the_protocol_and_its_trajectory_is_recorded() {
    require_python_packages().await;
    let server = NatsServer::start().expect("nats-server starts");
    let producer = Identity::generate(ClientId::new("py-producer").unwrap());
    let consumer = Identity::generate(ClientId::new("py-consumer").unwrap());
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
            entry(&producer, Role::Producer, &["py.>"]),
            entry(&consumer, Role::Consumer, &["py.orders.*"]),
        ])
        .unwrap(),
        stage_batch_linger: Duration::from_millis(5),
        ..Default::default()
    })
    .await
    .expect("broker starts");
    let nats = async_nats::connect(server.url()).await.unwrap();

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
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
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
    let recs = loop {
        let recs: Vec<StageRecord> = stage_records(&nats)
            .await
            .into_iter()
            .filter(|r| {
                r.message_id == Some(message_id)
                    || r.request_id.as_ref().map(|r| r.as_str()) == Some(request_id)
                    || (r.stage == Stage::NoMatch && r.topic.as_deref() == Some(TOPIC))
            })
            .collect();
        if want.iter().all(|w| recs.iter().any(|r| r.stage == *w)) {
            break recs;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "stage records never completed: {:?}",
            recs.iter().map(|r| r.stage).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
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
    assert_eq!(n1.detail.as_deref(), Some("category=refund"));
    // The client's records are stamped with its own clock, before the broker's matching ones.
    assert!(p1.at <= p2.at, "P1 at {} after P2 at {}", p1.at, p2.at);
    assert!(one(Stage::PullAckSent).at <= one(Stage::PullAckReceived).at);

    // Channels: A1 opened for both (and refused for the wrong key), closed for both.
    let all = stage_records(&nats).await;
    let a1 = |outcome: &str| {
        of(&all, Stage::Channel)
            .into_iter()
            .filter(|r| r.outcome.as_deref() == Some(outcome))
            .count()
    };
    assert_eq!(a1("opened"), 2);
    assert_eq!(a1("refused"), 1);
    assert_eq!(a1("closed"), 2);

    broker.shutdown().await;
}
