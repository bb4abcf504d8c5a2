//! The API and the CLI agree: the built `msgtrail` binary's `trace --json`, `stats --json`
//! and `audit --json` against the listener's HTTP API, on trajectories made by the real broker and SDK; `trace`
//! tells "not found" (exit 2) from "the query failed" (exit 1).

use msgtrail_client::Outgoing;
use msgtrail_core::trajectory::{MessageState, Trajectory};
use msgtrail_core::wire::Subscription;
use msgtrail_core::{GroupId, RequestId};
use msgtrail_e2e::{settled, TestListener, TestSystem};
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Output;
use std::time::Duration;

/// Runs the built `msgtrail` with `args` (which name the listener), with no listener token
/// from the environment and no colours.
async fn msgtrail(args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_msgtrail"))
        .args(args)
        .env_remove("MSGTRAIL_LISTENER_TOKEN")
        .env("NO_COLOR", "1")
        .output()
        .await
        .expect("msgtrail runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `msgtrail trace <id> --json` as JSON, after checking it exited 0.
async fn cli_trace_json(l: &TestListener, id: &str) -> Value {
    let out = msgtrail(&["trace", id, "--json", "--listener-url", &l.url()]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("trace --json prints JSON")
}

/// `GET /api/messages/{id}` as JSON.
async fn api_trace_json(l: &TestListener, id: &str) -> Value {
    let (status, body) = l
        .client
        .get_raw(&format!("/api/messages/{id}"))
        .await
        .unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

/// The parts of a statistics snapshot that do not move while nothing happens (not the
/// snapshot time, the sliding-window rates or the lag poll).
fn settled_stats(v: &Value) -> Value {
    let latency: Vec<Value> = v["latency"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| serde_json::json!([r["topic"], r["segment"], r["total"]["count"]]))
        .collect();
    serde_json::json!({
        "states": v["states"],
        "topics": v["topics"],
        "funnel": v["funnel"],
        "events": v["events"],
        "stages": v["stages"],
        "records": v["ingest"]["records"],
        "latency": latency,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_and_the_cli_agree() {
    let sys = TestSystem::start().await;
    let l = sys.start_listener(|c| c.deadlines.stored_ms = 300).await;
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("billing-1").await;

    // A consumed message (pull), and an upload the broker refused (topic not permitted).
    let reply = producer.send("orders.eu", "agree").await.unwrap();
    let sub = Subscription {
        group: GroupId::new("billing").unwrap(),
        topic: "orders.*".into(),
        filter: BTreeMap::new(),
        message_id: None,
    };
    let got = consumer
        .fetch(&sub, 1, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    consumer
        .process(got[0].clone(), |_| async { Ok::<_, String>(()) })
        .await
        .unwrap()
        .unwrap();
    let refused = RequestId::new("cli-refused-1").unwrap();
    // Kept alive: the producer's stage reports (this P1) go out after the call returns.
    let narrow = sys.producer("shop-2").await;
    narrow
        .send_message(Outgoing::new("payments.card", "no").request_id(refused.clone()))
        .await
        .unwrap_err();

    let id = reply.message_id.to_string();
    let t = l
        .trajectory_when(&id, |t| {
            t.state == MessageState::Consumed && t.hops.len() == 4 && settled(t)
        })
        .await;
    l.trajectory_when(refused.as_str(), |t| {
        t.state == MessageState::Lost && t.hop("send").is_some_and(|h| !h.synthesized)
    })
    .await;

    // The whole trajectory, by message ID and by request ID, is the API's.
    let api = api_trace_json(&l, &id).await;
    assert_eq!(cli_trace_json(&l, &id).await, api);
    assert_eq!(
        cli_trace_json(&l, reply.request_id.as_str()).await,
        api,
        "the request ID gives the same trajectory"
    );
    assert_eq!(api["state"], "consumed");
    assert_eq!(serde_json::from_value::<Trajectory>(api).unwrap(), t);

    // A refused upload: the same (the time of its last state is nulled, as a lost message's
    // would be the query time).
    let mut api = api_trace_json(&l, refused.as_str()).await;
    let mut cli = cli_trace_json(&l, refused.as_str()).await;
    for v in [&mut api, &mut cli] {
        let lost = v["states"].as_array_mut().unwrap().last_mut().unwrap();
        assert_eq!(lost["state"], "lost");
        lost["at"] = Value::Null;
    }
    assert_eq!(cli, api);
    assert!(api["failure"]
        .as_str()
        .unwrap()
        .contains("refused by the broker: not_permitted"));

    // The timeline says the same in words.
    let out = msgtrail(&["trace", &id, "--listener-url", &l.url()]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = stdout(&out);
    for want in [
        format!("message {id}"),
        "state consumed".to_owned(),
        format!("diagnosis: {}", t.diagnosis),
    ] {
        assert!(text.contains(&want), "{want:?} missing from:\n{text}");
    }
    let out = msgtrail(&["trace", refused.as_str(), "--listener-url", &l.url()]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        stdout(&out).contains("failure point: refused by the broker"),
        "{}",
        stdout(&out)
    );

    // Not found is exit 2, for a message ID and for a request ID; a failed query is exit 1.
    for unknown in ["0193a5f2-7c1e-7b2a-9f10-3c4d5e6f7a8b", "no-such-request"] {
        let out = msgtrail(&["trace", unknown, "--listener-url", &l.url()]).await;
        assert_eq!(out.status.code(), Some(2), "{unknown}: {out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
    }
    let closed = {
        let s = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap()
    };
    let out = msgtrail(&["trace", &id, "--listener-url", &format!("http://{closed}")]).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");

    // `stats --json` is `/api/stats`, once nothing is moving.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let api_stats = || async {
            let (status, body) = l.client.get_raw("/api/stats").await.unwrap();
            assert_eq!(status, 200);
            settled_stats(&serde_json::from_slice(&body).unwrap())
        };
        let before = api_stats().await;
        let out = msgtrail(&["stats", "--json", "--listener-url", &l.url()]).await;
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let cli = settled_stats(&serde_json::from_slice(&out.stdout).unwrap());
        let after = api_stats().await;
        // The watchdog counts the lost upload on its own schedule.
        let counted = before["states"]["consumed"] == 1
            && before["states"]["lost"] == 1
            && before["funnel"]["acked"] == 1;
        if before == after && counted {
            assert_eq!(cli, before);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the statistics never settled: {after:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // `audit` reads both trajectories and finds nothing a trajectory must not show; the
    // consumed one's send and delivery exchanges are complete, so its hops carry bounds.
    let out = msgtrail(&["audit", "--json", "--listener-url", &l.url()]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["checked"], 2, "{report:#}");
    assert_eq!(report["violations"], serde_json::json!({}), "{report:#}");
    assert!(
        report["hops_with_clock_bound"].as_u64().unwrap() >= 4,
        "{report:#}"
    );
    // A listener that is not there fails the audit.
    let out = msgtrail(&["audit", "--listener-url", &format!("http://{closed}")]).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

/// `msgtrail trace --client` prints the listener's window estimate of the client's clock,
/// against the broker instance that timed the exchanges (a producer whose SDK clock runs
/// 250 ms ahead), and its `--json` carries it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_client_prints_the_window_clock_estimate() {
    let sys = TestSystem::start().await;
    let l = sys.start_listener(|_| {}).await;
    let producer = msgtrail_client::Producer::connect_with(
        sys.nats.clone(),
        sys.identity("shop"),
        msgtrail_client::ProducerOptions::default().clock_offset_nanos(250_000_000),
    )
    .await
    .unwrap();
    let reply = producer.send("orders.eu", "skewed").await.unwrap();
    let id = reply.message_id.to_string();
    l.trajectory_when(&id, |t| settled(t) && !t.clocks.is_empty())
        .await;
    let instance = sys.broker.as_ref().unwrap().instance.to_string();
    let out = msgtrail(&["trace", "--client", "shop", "--listener-url", &l.url()]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = stdout(&out);
    assert!(text.contains("best of the last 60 s"), "{text}");
    assert!(
        text.contains(&format!("clock of shop vs broker {instance}: +2")),
        "{text}"
    );
    let out = msgtrail(&[
        "trace",
        "--client",
        "shop",
        "--json",
        "--listener-url",
        &l.url(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["clocks"][0]["broker"], instance.as_str(), "{json}");
    assert_eq!(json["clocks"][0]["client"], "shop", "{json}");
    assert_eq!(json["window_secs"], 60, "{json}");
    let (offset, bound) = (
        json["clocks"][0]["offset_nanos"].as_i64().unwrap(),
        json["clocks"][0]["bound_nanos"].as_i64().unwrap(),
    );
    assert!((offset - 250_000_000).abs() <= bound + 1, "{json}");
    assert!(json["events"].is_array(), "{json}");
}
