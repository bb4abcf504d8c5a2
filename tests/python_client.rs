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
        .args(["--request-id", request_id, "--trace"])
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
        out.extend(decode_batch(&m.payload).expect("stage batches are NDJSON records"));
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
        pushed["subject"].as_str().unwrap().starts_with("_INBOX."),
        "{pushed}"
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
