//! Scenario 10: permission bypass attempts under deploy/nats/accounts.conf while real clients
//! work. nats-server runs with deploy's accounts (the file's own text), the brokers as user
//! `broker`, the listener as `listener`, the workload's producer and consumer as the
//! password client `client` on its inbox prefix `_INBOX_CLIENT.client`. The attacker is
//! deploy's demo producer `shop`: a legitimate NATS user of the CLIENTS account (its nkey)
//! and a legitimate msgtrail producer (its own channel, topics `orders.>` only).
//!
//! `tests/deploy_config.rs` proves each rule once on deploy's 3-node cluster with no load
//! (channel theft: `a_client_cannot_read_another_clients_replies`; replies aimed at the
//! streams: `a_client_cannot_aim_the_brokers_replies_at_the_streams`). This scenario runs
//! the attempts against the real processes **during** a load and judges the load with the
//! suite's oracle: every attempt refused, nothing leaked, nothing forged stored, and the real
//! clients lose nothing.

use crate::harness::*;
use crate::{oracle, stage_records, TRAJECTORY_WAIT};
use futures::StreamExt;
use msgtrail_client::{Consumer, ConsumerOptions, Identity, Outgoing, Producer, ProducerOptions};
use msgtrail_core::subjects::{self, STAGE_STREAM};
use msgtrail_core::wire::ChallengeRequest;
use msgtrail_core::ClientId;
use serde_json::json;
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Server errors (permission violations) the attacker's connection was told about.
type Errors = Arc<Mutex<Vec<String>>>;

/// The demo producer's nkey seed (deploy/msgtrail/demo-keys/shop.nk).
fn shop_seed() -> String {
    let path = msgtrail_test_support::workspace_root().join("deploy/msgtrail/demo-keys/shop.nk");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_owned()
}

/// Connects as the demo nkey user `shop` on its own inbox prefix, collecting server errors.
async fn attacker(urls: &[String]) -> (async_nats::Client, Errors) {
    let errors: Errors = Arc::default();
    let sink = errors.clone();
    let addrs: Vec<async_nats::ServerAddr> = urls.iter().map(|u| u.parse().unwrap()).collect();
    let client = async_nats::ConnectOptions::with_nkey(shop_seed())
        .custom_inbox_prefix("_INBOX_CLIENT.shop")
        .event_callback(move |event| {
            let sink = sink.clone();
            async move {
                if let async_nats::Event::ServerError(e) = event {
                    sink.lock().unwrap().push(e.to_string());
                }
            }
        })
        .connect(addrs)
        .await
        .expect("the demo nkey user connects");
    (client, errors)
}

/// Waits up to 5 s for a server error containing `needle` (case-insensitive).
async fn refused(errors: &Errors, needle: &str) -> bool {
    let needle = needle.to_lowercase();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if errors
            .lock()
            .unwrap()
            .iter()
            .any(|e| e.to_lowercase().contains(&needle))
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Subscriptions the attacker tries: the real clients' inbox, every inbox, everything, the
/// streams' subjects, the JetStream acks.
const SUBSCRIBE: &[&str] = &[
    "_INBOX_CLIENT.client.>",
    "_INBOX_CLIENT.>",
    "_INBOX.>",
    ">",
    "msgtrail.msg.>",
    "msgtrail.stages",
    "msgtrail.internal.>",
    "$JS.API.>",
];

/// Publishes the attacker tries: storing into the message stream, forging stage records,
/// settling for the brokers, reading the stage stream (stream info, direct get, a consumer of
/// its own), pulling the workload group's deliveries, overwriting the brokers' signing key.
fn publishes() -> Vec<String> {
    vec![
        format!("{}.faults.orders", subjects::MESSAGE_SUBJECT_PREFIX),
        subjects::STAGE_SUBJECT.to_owned(),
        "msgtrail.internal.settled.x".to_owned(),
        format!("$JS.API.STREAM.INFO.{STAGE_STREAM}"),
        format!("$JS.API.DIRECT.GET.{STAGE_STREAM}"),
        format!("$JS.API.CONSUMER.CREATE.{STAGE_STREAM}"),
        format!("$JS.API.CONSUMER.CREATE.{STAGE_STREAM}.thief"),
        format!(
            "$JS.API.CONSUMER.MSG.NEXT.{}.g-{GROUP}",
            subjects::MESSAGE_STREAM
        ),
        "$KV.msgtrail_broker.token-key".to_owned(),
    ]
}

/// What the attacker got through with, attempt by attempt.
#[derive(Debug, Default)]
struct Attempts {
    /// NATS-level attempts not refused with a permissions violation.
    not_refused: Vec<String>,
    /// NATS-level attempts in all.
    nats_level: usize,
    /// msgtrail-level attempts (through the broker) that succeeded.
    accepted_by_broker: Vec<String>,
    /// msgtrail-level attempts in all.
    broker_level: usize,
    /// What the refused msgtrail-level attempts were told.
    broker_answers: BTreeMap<String, String>,
}

/// The NATS-level attempts; returns the subscriptions (to see what they receive).
async fn nats_attempts(
    nats: &async_nats::Client,
    errors: &Errors,
    out: &mut Attempts,
) -> Vec<async_nats::Subscriber> {
    let mut taps = Vec::new();
    for pattern in SUBSCRIBE {
        out.nats_level += 1;
        taps.push(nats.subscribe(pattern.to_string()).await.unwrap());
        let _ = nats.flush().await;
        if !refused(errors, &format!("subscription to \"{pattern}\"")).await {
            out.not_refused.push(format!("subscribe {pattern}"));
        }
    }
    for subject in publishes() {
        out.nats_level += 1;
        let _ = nats.publish(subject.clone(), "forged".into()).await;
        let _ = nats.flush().await;
        if !refused(errors, &format!("publish to \"{subject}\"")).await {
            out.not_refused.push(format!("publish {subject}"));
        }
    }
    taps
}

/// Requests to the broker whose reply subject names msgtrail's own subjects: the broker
/// answers across the account boundary, where they are nothing.
async fn aimed_replies(nats: &async_nats::Client) {
    let challenge = serde_json::to_vec(&ChallengeRequest {
        client_id: ClientId::new("shop").unwrap(),
    })
    .unwrap();
    for reply in [
        "$KV.msgtrail_broker.token-key",
        "msgtrail.msg.faults.orders",
        subjects::STAGE_SUBJECT,
        "msgtrail.internal.settled.x",
    ] {
        let _ = nats
            .publish_with_reply(subjects::CHANNEL_CHALLENGE, reply, challenge.clone().into())
            .await;
    }
    let _ = nats.flush().await;
}

/// The msgtrail-level attempts through the broker, with the attacker's own key: open a
/// channel as the workload's producer or consumer, open a consumer channel as itself (it is a
/// producer), upload on the workload's topic (not among its topics).
async fn broker_attempts(sys: &System, out: &mut Attempts) {
    let urls = sys.nats.urls();
    let seed = shop_seed();
    let nats = || async {
        let addrs: Vec<async_nats::ServerAddr> = urls.iter().map(|u| u.parse().unwrap()).collect();
        async_nats::ConnectOptions::with_nkey(shop_seed())
            .custom_inbox_prefix("_INBOX_CLIENT.shop")
            .connect(addrs)
            .await
            .expect("the demo nkey user connects")
    };
    let options = ProducerOptions::default()
        .timeout(Duration::from_secs(2))
        .max_attempts(1);
    let as_id = |id: &str| Identity::from_seed(ClientId::new(id).unwrap(), &seed).unwrap();
    let mut note = |what: &str, result: Result<(), String>| {
        out.broker_level += 1;
        match result {
            Ok(()) => out.accepted_by_broker.push(what.to_owned()),
            Err(e) => {
                out.broker_answers.insert(what.to_owned(), e);
            }
        }
    };
    let r = Producer::connect_with(nats().await, as_id("faults-shop"), options.clone()).await;
    note(
        "open a producer channel as faults-shop",
        r.map(|_| ()).map_err(|e| e.to_string()),
    );
    let r = Consumer::connect_with(
        nats().await,
        as_id("faults-billing-1"),
        ConsumerOptions::default()
            .timeout(Duration::from_secs(2))
            .report_stages(false),
    )
    .await;
    note(
        "open a consumer channel as faults-billing-1",
        r.map(|_| ()).map_err(|e| e.to_string()),
    );
    let r = Consumer::connect_with(
        nats().await,
        as_id("shop"),
        ConsumerOptions::default()
            .timeout(Duration::from_secs(2))
            .report_stages(false),
    )
    .await;
    note(
        "open a consumer channel as itself (a producer)",
        r.map(|_| ()).map_err(|e| e.to_string()),
    );
    // Its own producer channel is legitimate; the workload's topic is not its to write.
    let own = Producer::connect_with(nats().await, as_id("shop"), options)
        .await
        .expect("the demo producer opens its own channel");
    let r = own
        .send_message(Outgoing::new(TOPIC, "forged order"))
        .await
        .map(|_| ())
        .map_err(|e| e.to_string());
    note("upload on faults.orders with its own channel", r);
    let _ = tokio::time::timeout(Duration::from_secs(5), own.close()).await;
}

/// The scenario.
pub(crate) async fn bypass_attempts_under_load(scenario: &str) {
    let scale = Scale::pick(300, 2000);
    for rep in 1..=scale.reps {
        let sys = System::start(SystemOptions {
            brokers: 2,
            deploy_accounts: true,
            ..Default::default()
        })
        .await;
        let js = async_nats::jetstream::new(sys.admin.clone());
        let kv = js
            .get_key_value("msgtrail_broker")
            .await
            .expect("the brokers' KV bucket");
        let key_before = kv.get("token-key").await.expect("read the brokers' key");
        let run = run_load(&sys, Load::new(scale.messages)).await;
        run.progress
            .wait_acked(scale.messages / 3, Duration::from_secs(60))
            .await;
        let fault_ms = run.history.now_ms();
        let (thief, errors) = attacker(&sys.nats.urls()).await;
        let mut attempts = Attempts::default();
        let taps = nats_attempts(&thief, &errors, &mut attempts).await;
        let stolen = Arc::new(Mutex::new(Vec::<String>::new()));
        let tap = tokio::spawn({
            let stolen = stolen.clone();
            let mut all = futures::stream::select_all(taps);
            async move {
                while let Some(m) = all.next().await {
                    stolen.lock().unwrap().push(m.subject.to_string());
                }
            }
        });
        aimed_replies(&thief).await;
        broker_attempts(&sys, &mut attempts).await;
        let attacks_ms = run.history.now_ms() - fault_ms;
        let finished = run.finish().await;
        tap.abort();
        let mut r = oracle(&sys, scenario, &scale, rep, &finished, TRAJECTORY_WAIT).await;
        // Nothing forged in the streams or the KV bucket.
        let key_after = kv.get("token-key").await.expect("read the brokers' key");
        let stored = drain_messages(&sys.admin).await;
        let acked: HashSet<String> = finished
            .progress
            .uploads
            .lock()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        let foreign = stored
            .iter()
            .filter(|m| !acked.contains(&m.request_id))
            .count();
        let real: HashSet<&str> = stored.iter().map(|m| m.message_id.as_str()).collect();
        let records = stage_records(&sys.admin).await;
        let forged_records = records
            .iter()
            .filter(|r| {
                r.message_id
                    .is_some_and(|m| !real.contains(m.to_string().as_str()))
            })
            .count();
        // Every permission violation nats-server logged was the attacker's.
        let logs = sys.nats.logs();
        let others: Vec<String> = logs
            .lines()
            .filter(|l| l.contains("Violation") && !l.contains(DEMO_SHOP_PUBLIC_KEY))
            .map(str::to_owned)
            .take(5)
            .collect();
        let logged = logs.lines().filter(|l| l.contains("Violation")).count();
        let stolen = stolen.lock().unwrap().clone();
        r.set(
            "fault",
            json!(
                "deploy's demo producer `shop` tries other clients' inboxes, the streams, \
                   the JetStream API, the brokers' KV and subjects, channels as other \
                   clients, and a topic not its own, at a third of the load"
            ),
        )
        .set("nats_level_attempts", json!(attempts.nats_level))
        .set("nats_level_not_refused", json!(attempts.not_refused))
        .set("broker_level_attempts", json!(attempts.broker_level))
        .set("broker_level_accepted", json!(attempts.accepted_by_broker))
        .set("broker_answers", json!(attempts.broker_answers))
        .set("messages_received_by_attacker", json!(stolen.len()))
        .set("stored_not_by_the_workload", json!(foreign))
        .set("stage_records_of_unknown_messages", json!(forged_records))
        .set("brokers_key_unchanged", json!(key_before == key_after))
        .set("violations_logged", json!(logged))
        .set("violations_not_by_the_attacker", json!(others))
        .set("attacks_ms", json!(attacks_ms.round()))
        .set("fault_at_ms", json!(fault_ms.round()));
        r.print();
        r.assert_sound(true, &sys);
        assert_eq!(r.n("given_up"), 0, "real uploads given up: {:?}", r.json);
        assert!(
            attempts.not_refused.is_empty(),
            "not refused: {:?}",
            attempts.not_refused
        );
        assert!(
            attempts.accepted_by_broker.is_empty(),
            "the broker accepted: {:?}",
            attempts.accepted_by_broker
        );
        assert!(stolen.is_empty(), "the attacker received: {stolen:?}");
        assert_eq!(
            foreign, 0,
            "messages stored that the workload did not upload"
        );
        assert_eq!(forged_records, 0, "stage records of messages never stored");
        assert!(
            key_before.is_some() && key_before == key_after,
            "the brokers' key changed"
        );
        assert!(
            logged > 0,
            "nats-server logged no violation: the log check proves nothing"
        );
        assert!(
            others.is_empty(),
            "permission violations of real clients: {others:?}"
        );
    }
}
