//! Trajectory fidelity end to end: a producer and a consumer whose SDK clocks are
//! deliberately off (the SDK's test-only `clock_offset_nanos`: +250 ms and −40 ms) against a
//! real nats-server, broker and listener. The listener's clock estimates, from the stage
//! records alone, must hold the true offsets within their bounds; the corrected timeline
//! must be causal within the bound; and the trajectory must show no state regression, no
//! hop ending before it starts and no delivery before the message was deliverable.
//!
//! The broker's instance is on its records, its hops and each estimate, and the listener
//! serves each client's best estimate of the last minute per broker instance
//! (`GET /api/clients/{id}`).
//!
//! And the records that name no message — no-match notices (N1) and channel events (A1) —
//! are queryable per client (`GET /api/clients/{id}/events`).

use msgtrail_client::{Consumer, ConsumerOptions, Outgoing, Producer, ProducerOptions};
use msgtrail_core::trajectory::{ClockEstimate, HopKind, MessageState, Trajectory};
use msgtrail_core::wire::Subscription;
use msgtrail_core::{GroupId, Stage};
use msgtrail_e2e::{settled, TestSystem};
use std::collections::BTreeMap;
use std::time::Duration;

const MS: i64 = 1_000_000;
const PRODUCER_AHEAD: i64 = 250 * MS;
const CONSUMER_AHEAD: i64 = -40 * MS;

fn clock_of<'a>(t: &'a Trajectory, client: &str) -> &'a ClockEstimate {
    t.clocks
        .iter()
        .find(|c| c.client.as_str() == client)
        .unwrap_or_else(|| panic!("no clock estimate of {client}: {:?}", t.clocks))
}

/// The true offset lies within the estimate's bound (1 ns for the halving), and the bound
/// is a loopback round trip, far below the skew.
fn assert_holds(e: &ClockEstimate, truth: i64) {
    let err = (e.offset_nanos - truth).unsigned_abs();
    assert!(err <= e.bound_nanos + 1, "{e:?} misses {truth} by {err} ns");
    assert!(e.bound_nanos < 50 * MS as u64, "bound too wide: {e:?}");
}

/// The causal invariants of what is shown.
fn assert_causal(t: &Trajectory) {
    for h in &t.hops {
        assert!(h.impossible.is_none(), "{}: {:?}", h.key, h.impossible);
        assert!(
            h.end.is_none_or(|e| e >= h.start),
            "{} ends before it starts",
            h.key
        );
    }
    let deliverable = t.hop("store").and_then(|s| s.end).expect("stored");
    for d in t.hops.iter().filter(|h| h.kind == HopKind::Deliver) {
        assert!(d.start >= deliverable, "{} before deliverable", d.key);
    }
    let order: Vec<MessageState> = t.states.iter().map(|s| s.state).collect();
    assert_eq!(
        order,
        [
            MessageState::Sent,
            MessageState::Enqueued,
            MessageState::Delivered,
            MessageState::Consuming,
            MessageState::Consumed
        ],
        "{:?}",
        t.states
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_sdk_clocks_are_estimated_within_their_bounds() {
    let sys = TestSystem::start().await;
    let l = sys.start_listener(|_| {}).await;
    let producer = Producer::connect_with(
        sys.nats.clone(),
        sys.identity("shop"),
        ProducerOptions::default().clock_offset_nanos(PRODUCER_AHEAD),
    )
    .await
    .unwrap();
    let consumer = Consumer::connect_with(
        sys.nats.clone(),
        sys.identity("billing-1"),
        ConsumerOptions::default().clock_offset_nanos(CONSUMER_AHEAD),
    )
    .await
    .unwrap();
    let reply = producer
        .send_message(Outgoing::new("orders.eu", "skewed"))
        .await
        .unwrap();
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
    let outcome = consumer
        .process(got[0].clone(), |_| async { Ok::<(), String>(()) })
        .await
        .unwrap();
    assert_eq!(outcome, Ok(()));
    let id = reply.message_id.to_string();
    let t = l
        .trajectory_when(&id, |t| {
            settled(t) && t.state == MessageState::Consumed && t.clocks.len() == 2
        })
        .await;

    // The estimates, from the records alone, hold the true offsets.
    let shop = clock_of(&t, "shop");
    assert_holds(shop, PRODUCER_AHEAD);
    let billing = clock_of(&t, "billing-1");
    assert_holds(billing, CONSUMER_AHEAD);
    assert_eq!(t.hop("send").unwrap().clock.as_ref(), Some(shop));
    let deliver = t.hop("deliver/billing/billing-1/1").unwrap();
    assert_eq!(deliver.clock.as_ref(), Some(billing));

    // Raw, the producer's send reads 250 ms after the broker got it; corrected, it precedes
    // it within the bound.
    let send = t.hop("send").unwrap();
    let store = t.hop("store").unwrap();
    assert!(
        send.start > store.start + 200 * MS as u64,
        "raw times are skewed"
    );
    let on_broker = send
        .on_broker_clock
        .expect("the send on the broker's clock");
    assert!(on_broker.start <= store.start + on_broker.bound_nanos);
    assert!(on_broker.end.unwrap() + on_broker.bound_nanos >= store.events[0].at);
    let arrival = store.arrival_nanos.expect("the upload's arrival");
    assert!(arrival + (store.arrival_bound_nanos.unwrap() as i64) >= 0);

    // Raw, the consumer received it 40 ms before the broker sent it; corrected, after.
    let process = t.hop("process/billing/billing-1/1").unwrap();
    assert!(
        process.start + 30 * MS as u64 <= deliver.start,
        "raw times are skewed"
    );
    let p = process
        .on_broker_clock
        .expect("the process on the broker's clock");
    assert!(p.start + p.bound_nanos >= deliver.start);
    assert!(p.end.unwrap() <= deliver.end.unwrap() + p.bound_nanos);
    let arrival = process.arrival_nanos.expect("the delivery's arrival");
    assert!(arrival + (process.arrival_bound_nanos.unwrap() as i64) >= 0);

    assert_causal(&t);

    // The API's JSON names them.
    let (status, body) = l
        .client
        .get_raw(&format!("/api/messages/{id}"))
        .await
        .unwrap();
    assert_eq!(status, 200);
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(json["clocks"][0]["bound_nanos"].is_u64(), "{json}");
    assert!(json["hops"][0]["clock"]["offset_nanos"].is_i64(), "{json}");

    // The broker instance: on the broker's records, the broker-side hops and every
    // estimate (measured against that broker's clock); never on a client's record.
    let instance = sys.broker.as_ref().unwrap().instance.clone();
    assert_eq!(shop.broker.as_ref(), Some(&instance));
    assert_eq!(billing.broker.as_ref(), Some(&instance));
    assert_eq!(store.broker.as_ref(), Some(&instance));
    assert_eq!(deliver.broker.as_ref(), Some(&instance));
    for h in &t.hops {
        for r in &h.events {
            let by_broker = r.stage.emitter() == msgtrail_core::Emitter::Broker;
            assert_eq!(r.broker.is_some(), by_broker, "{r:?}");
        }
    }
    assert_eq!(json["hops"][1]["broker"], instance.as_str(), "{json}");
    // The delivery carries JetStream's stored time.
    let c5 = deliver
        .events
        .iter()
        .find(|r| r.stage == Stage::PullSent)
        .unwrap();
    let stored_at = c5.stored_at.expect("the C5 carries the stored time");
    assert!(
        stored_at >= store.start && stored_at <= c5.at,
        "{c5:?} {store:?}"
    );

    // The listener's window estimate per (client, broker instance), over the API.
    for (client, truth) in [("shop", PRODUCER_AHEAD), ("billing-1", CONSUMER_AHEAD)] {
        let clocks = l.client.client_clocks(client).await.unwrap();
        assert_eq!((clocks.client.as_str(), clocks.window_secs), (client, 60));
        assert_eq!(clocks.clocks.len(), 1, "{clocks:?}");
        let w = &clocks.clocks[0];
        assert_eq!(w.estimate.broker.as_ref(), Some(&instance));
        assert_holds(&w.estimate, truth);
        assert!(w.estimate.samples >= 1 && w.newest_at >= w.measured_at);
    }
    let (status, body) = l.client.get_raw("/api/clients/nobody").await.unwrap();
    assert_eq!(status, 200);
    let none: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(none["clocks"], serde_json::json!([]), "{none}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_match_notices_and_channel_events_are_queryable_per_client() {
    let sys = TestSystem::start().await;
    let l = sys.start_listener(|_| {}).await;
    let consumer = sys.consumer("billing-1").await;
    let sub = Subscription {
        group: GroupId::new("billing").unwrap(),
        topic: "orders.*".into(),
        filter: BTreeMap::new(),
        message_id: None,
    };
    for _ in 0..2 {
        let got = consumer
            .fetch(&sub, 1, Duration::from_millis(100))
            .await
            .unwrap();
        assert!(got.is_empty());
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let events = loop {
        let e = l.client.client_events("billing-1", 50).await.unwrap();
        let n1s = e
            .events
            .iter()
            .filter(|r| r.stage == Stage::NoMatch)
            .count();
        if n1s >= 2 && e.events.iter().any(|r| r.stage == Stage::Channel) {
            break e;
        }
        assert!(tokio::time::Instant::now() < deadline, "never: {e:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(events.client, "billing-1");
    let n1 = events
        .events
        .iter()
        .find(|r| r.stage == Stage::NoMatch)
        .unwrap();
    assert_eq!(n1.group.as_ref().map(|g| g.as_str()), Some("billing"));
    assert_eq!(n1.topic.as_deref(), Some("orders.*"));
    let opened = events
        .events
        .iter()
        .find(|r| r.stage == Stage::Channel)
        .unwrap();
    assert_eq!(opened.outcome.as_deref(), Some("opened"));
    assert!(
        events.events.windows(2).all(|w| w[0].at >= w[1].at),
        "newest first"
    );
    // Another client's events stay apart; a limit holds.
    let other = l.client.client_events("shop", 50).await.unwrap();
    assert!(other.events.iter().all(|r| r.consumer.is_none()));
    let one = l.client.client_events("billing-1", 1).await.unwrap();
    assert_eq!(one.events.len(), 1);
}
