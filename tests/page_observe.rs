//! Observe mode on the listener page, in a real headless Chromium over WebDriver: an
//! observed trajectory says it was observed (the stream and sequence, the `Nats-Msg-Id`,
//! the producer's trace it joins), a work-queue stream's trajectory says its stored message
//! was not read, a consumer that does not sample every ack is named with the command that
//! fixes it, and the "Observed streams" view shows `GET /api/observe`: the streams, their
//! consumers, the unsampled ones with their fix, and each consumer's statistics (`GET
//! /api/stats`, `observed`). The application is plain async-nats.

use async_nats::jetstream::{self, consumer};
use futures::StreamExt;
use msgtrail_core::observed::observed_message_id;
use msgtrail_core::trajectory::{HopKind, Trajectory};
use msgtrail_e2e::browser::Browser;
use msgtrail_e2e::TestSystem;
use msgtrail_listener::ObserveConfig;
use std::time::Duration;

const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

async fn pull_consumer(
    s: &jetstream::stream::Stream,
    name: &str,
    sample: u8,
) -> consumer::PullConsumer {
    s.create_consumer(consumer::pull::Config {
        durable_name: Some(name.into()),
        ack_policy: consumer::AckPolicy::Explicit,
        sample_frequency: sample,
        ..Default::default()
    })
    .await
    .unwrap()
}

/// Pulls one message of `c` and acks it; its subject.
async fn ack_one(c: &consumer::PullConsumer) -> String {
    let m = c.messages().await.unwrap().next().await.unwrap().unwrap();
    m.ack().await.unwrap();
    m.subject.to_string()
}

fn acked_by(t: &Trajectory, consumer: &str) -> bool {
    t.hops.iter().any(|h| {
        h.kind == HopKind::Deliver
            && h.consumer.as_ref().is_some_and(|c| c.as_str() == consumer)
            && h.events.iter().any(|r| r.outcome.as_deref() == Some("ack"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_observed_trajectories_and_the_observe_status() {
    let sys = TestSystem::start().await;
    let js = jetstream::new(sys.nats.clone());
    let orders = js
        .create_stream(jetstream::stream::Config {
            name: "ORDERS".into(),
            subjects: vec!["shop.orders.>".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    let jobs = js
        .create_stream(jetstream::stream::Config {
            name: "JOBS".into(),
            subjects: vec!["jobs.>".into()],
            retention: jetstream::stream::RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await
        .unwrap();
    let billing = pull_consumer(&orders, "billing", 100).await;
    let audit = pull_consumer(&orders, "audit", 0).await;
    let worker = pull_consumer(&jobs, "worker", 100).await;
    let l = sys
        .start_listener(|c| {
            let mut o = ObserveConfig::streams(["ORDERS", "JOBS"]);
            o.discovery_interval = Duration::from_millis(200);
            c.observe = Some(o);
        })
        .await;

    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", "ord-1");
    headers.insert("traceparent", TRACEPARENT);
    js.publish_with_headers("shop.orders.eu", headers, "one".into())
        .await
        .unwrap()
        .await
        .unwrap();
    js.publish("jobs.resize", "two".into())
        .await
        .unwrap()
        .await
        .unwrap();
    ack_one(&billing).await;
    ack_one(&audit).await;
    ack_one(&worker).await;
    let order = observed_message_id("ORDERS", 1).to_string();
    let job = observed_message_id("JOBS", 1).to_string();
    l.trajectory_when(&order, |t| {
        t.observed.as_ref().is_some_and(|o| o.stored) && acked_by(t, "billing")
    })
    .await;
    l.trajectory_when(&job, |t| t.observed.is_some() && acked_by(t, "worker"))
        .await;

    let b = Browser::start(1280).await;
    b.open(&format!("{}/#{order}", l.url())).await;
    b.until(
        "the observed block of the trajectory",
        "document.querySelector('#observed') && document.querySelector('#observed').innerText.includes('ord-1')",
        "document.querySelector('#traceBody').innerText",
    )
    .await;
    let obs = b.text("#observed").await;
    for want in [
        "source: observed",
        "stream ORDERS",
        "sequence 1",
        "Nats-Msg-Id ord-1",
        "0af7651916cd43dd8448eb211c80319c",
        "What observe mode cannot see",
    ] {
        assert!(obs.contains(want), "{want:?} in {obs}");
    }
    // audit acked unsampled: its delivery is missing, and the page says why and how to fix it.
    let unsampled = b.text("#unsampled").await;
    assert!(unsampled.contains("Hops may be missing"), "{unsampled}");
    assert!(unsampled.contains("audit samples 0 %"), "{unsampled}");
    assert!(
        unsampled.contains("nats consumer edit ORDERS audit --sample 100 --force"),
        "{unsampled}"
    );
    assert!(!unsampled.contains("billing"), "{unsampled}");
    // The list marks observed messages.
    b.until(
        "both observed messages listed with their mark",
        &format!("[...document.querySelectorAll('#list tr.msg')].filter(r => r.querySelector('.badge.obs')).map(r => r.dataset.id).sort().join(' ') === {:?}",
            { let mut v = [order.clone(), job.clone()]; v.sort(); v.join(" ") }),
        "document.querySelector('#list').innerText",
    )
    .await;

    // The work-queue message: observed, its stored message not read, nothing unsampled.
    b.open(&format!("{}/#{job}", l.url())).await;
    b.until(
        "the work-queue trajectory's observed block",
        "document.querySelector('#observed') && document.querySelector('#observed').innerText.includes('JOBS')",
        "document.querySelector('#traceBody').innerText",
    )
    .await;
    let obs = b.text("#observed").await;
    assert!(obs.contains("stored message was not read"), "{obs}");
    assert!(obs.contains("sequence 1"), "{obs}");
    let none = b
        .js("return document.querySelector('#unsampled') === null")
        .await;
    assert_eq!(none, serde_json::json!(true), "{obs}");

    // The header links to the observe status, with the count of unsampled consumers.
    b.until(
        "the observe link",
        "!document.querySelector('#nav-observe').hidden && /1 unsampled/.test(document.querySelector('#nav-observe').innerText)",
        "document.querySelector('#nav').innerText",
    )
    .await;
    b.click("#nav-observe").await;
    b.until(
        "the observed streams view",
        "document.querySelector('#viewBody .stream[data-stream=\"JOBS\"]') && document.querySelector('#viewBody .stream[data-stream=\"ORDERS\"]')",
        "document.querySelector('#viewBody').innerText",
    )
    .await;
    let orders_view = b.text("#viewBody .stream[data-stream=\"ORDERS\"]").await;
    assert!(
        orders_view.contains("its stored messages are read"),
        "{orders_view}"
    );
    let audit_row = b
        .text("#viewBody .stream[data-stream=\"ORDERS\"] tr[data-consumer=\"audit\"]")
        .await;
    assert!(
        audit_row.contains("acked deliveries missing"),
        "{audit_row}"
    );
    assert!(
        audit_row.contains("nats consumer edit ORDERS audit --sample 100 --force"),
        "{audit_row}"
    );
    let billing_row = b
        .text("#viewBody .stream[data-stream=\"ORDERS\"] tr[data-consumer=\"billing\"]")
        .await;
    assert!(billing_row.contains("every ack sampled"), "{billing_row}");
    // Its statistics: billing's one delivery, acked, with its ack time; nothing unacked.
    let figure = |consumer: &str, k: &str| {
        format!("(document.querySelector('#viewBody .stream[data-stream=\"ORDERS\"] tr[data-figures=\"{consumer}\"] td[data-k=\"{k}\"]') || {{}}).innerText")
    };
    b.until(
        "billing's statistics in the view",
        &format!(
            "{} === '1' && {} === '1' && {} === '0'",
            figure("billing", "deliveries"),
            figure("billing", "acks"),
            figure("billing", "unacked")
        ),
        "document.querySelector('#viewBody').innerText",
    )
    .await;
    let ack_time = b
        .js(&format!("return {}", figure("billing", "ack_time")))
        .await;
    assert!(
        ack_time
            .as_str()
            .is_some_and(|t| t.contains(" / ") && t.ends_with(" ms")),
        "billing's ack time p50 / p99: {ack_time}"
    );
    let samples = b
        .js("return document.querySelector('#viewBody .stream[data-stream=\"ORDERS\"] tr[data-figures=\"billing\"] td[data-k=\"ack_time\"] span').title")
        .await;
    assert!(
        samples
            .as_str()
            .is_some_and(|t| t.ends_with(", 1 sample(s)")),
        "one ack-time sample: {samples}"
    );
    let stored = b
        .text("#viewBody .stream[data-stream=\"ORDERS\"] [data-n=\"stored\"] b")
        .await;
    assert_eq!(stored, "1", "one stored message read");
    let jobs_view = b.text("#viewBody .stream[data-stream=\"JOBS\"]").await;
    assert!(jobs_view.contains("not read"), "{jobs_view}");
    assert!(jobs_view.contains("worker"), "{jobs_view}");
    b.close().await;
}
