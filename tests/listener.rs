//! End to end through the real broker, the SDK and the listener on one nats-server: each
//! scenario is driven by producers and consumers, and the trajectory the listener serves over
//! its HTTP API is checked — state, hops with their status, attempts and groups, the failure
//! point and the diagnosis in words.

use msgtrail_client::{Consumer, Outgoing, PushOptions, Received};
use msgtrail_core::trace_ids;
use msgtrail_core::trajectory::{
    DeliveryMode, HopKind, HopSpan, HopStatus, MessageState, Segment, Trajectory,
};
use msgtrail_core::wire::Subscription;
use msgtrail_core::{ClientId, ErrorCode, RequestId, Stage};
use msgtrail_e2e::{collect, settled, TestListener, TestSystem, MAX_DELIVER};
use std::collections::BTreeMap;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(2);

fn sub(group: &str, topic: &str) -> Subscription {
    Subscription {
        group: msgtrail_core::GroupId::new(group).unwrap(),
        topic: topic.into(),
        filter: BTreeMap::new(),
        message_id: None,
    }
}

fn hop<'a>(t: &'a Trajectory, key: &str) -> &'a HopSpan {
    t.hop(key).unwrap_or_else(|| {
        panic!(
            "no hop {key}; hops: {:?}",
            t.hops.iter().map(|h| &h.key).collect::<Vec<_>>()
        )
    })
}

fn keys(t: &Trajectory) -> Vec<&str> {
    t.hops.iter().map(|h| h.key.as_str()).collect()
}

/// The stage codes of a hop's events, in time order.
fn codes(h: &HopSpan) -> Vec<String> {
    h.events.iter().map(|r| r.stage.to_string()).collect()
}

fn all_ok(t: &Trajectory) -> bool {
    t.hops.iter().all(|h| h.status == HopStatus::Ok)
}

/// Consumed by every group, every hop ok, every report in.
fn consumed(t: &Trajectory) -> bool {
    t.state == MessageState::Consumed
        && all_ok(t)
        && t.hops
            .iter()
            .filter(|h| h.kind == HopKind::Deliver)
            .all(|d| {
                t.hop(&d.key.replacen("deliver/", "process/", 1))
                    .is_some_and(|p| p.end.is_some())
            })
}

/// Polls `check` until it holds; panics after 10 s naming `what`.
async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn assert_contains(text: &str, words: &[&str]) {
    for w in words {
        assert!(text.contains(w), "{w:?} missing from {text:?}");
    }
}

/// The order the shadow message went through these states (each one's first change).
fn assert_state_order(t: &Trajectory, want: &[MessageState]) {
    let pos = |s: MessageState| {
        t.states
            .iter()
            .position(|c| c.state == s)
            .unwrap_or_else(|| panic!("no state change to {s}: {:?}", t.states))
    };
    let at: Vec<usize> = want.iter().map(|s| pos(*s)).collect();
    assert!(
        at.windows(2).all(|w| w[0] <= w[1]),
        "states out of order: {:?}",
        t.states
    );
}

/// Runs the SDK's `process` on a delivery (reports X1/X2, acks on success, nacks on
/// failure): the handler fails with `fail` if given.
async fn handle(consumer: &Consumer, m: &Received, fail: Option<&'static str>) {
    let outcome = consumer
        .process(m.clone(), move |_| async move {
            fail.map_or(Ok(()), |e| Err(e.to_owned()))
        })
        .await
        .unwrap();
    assert_eq!(outcome, fail.map_or(Ok(()), |e| Err(e.to_owned())));
}

/// Fetches the one waiting message for `group` as delivery `attempt`, and handles it.
async fn pull_and_handle(
    consumer: &Consumer,
    group: &str,
    attempt: u32,
    fail: Option<&'static str>,
) {
    let got = consumer
        .fetch(&sub(group, "orders.*"), 1, WAIT)
        .await
        .unwrap();
    assert_eq!(got.len(), 1, "attempt {attempt}");
    assert_eq!(got[0].delivery_attempt, attempt);
    handle(consumer, &got[0], fail).await;
}

async fn system_and_listener() -> (TestSystem, TestListener) {
    let sys = TestSystem::start().await;
    let listener = sys.start_listener(|_| {}).await;
    (sys, listener)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn success_by_pull() {
    let (sys, l) = system_and_listener().await;
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("billing-1").await;
    let reply = producer
        .send_message(Outgoing::new("orders.eu", "hello").attr("category", "refund"))
        .await
        .unwrap();
    pull_and_handle(&consumer, "billing", 1, None).await;

    let id = reply.message_id;
    let t = l.trajectory_when(&id.to_string(), consumed).await;
    assert_eq!(t.message_id, Some(id));
    assert_eq!(t.request_id.as_ref(), Some(&reply.request_id));
    assert_eq!(t.producer.as_ref().map(|p| p.as_str()), Some("shop"));
    assert_eq!(t.topic.as_deref(), Some("orders.eu"));
    assert_eq!(t.trace_id, Some(id.trace_hex()), "trace ID = message ID");
    assert_eq!(t.attrs.get("category").map(String::as_str), Some("refund"));
    assert_eq!(t.payload_size, Some(5));
    assert_eq!((t.upload_attempts, t.duplicates), (1, 0));
    assert_eq!(
        keys(&t),
        [
            "send",
            "store",
            "deliver/billing/billing-1/1",
            "process/billing/billing-1/1"
        ]
    );
    let send = hop(&t, "send");
    assert!(!send.synthesized);
    assert_eq!(send.service.as_deref(), Some("shop-svc"));
    assert_eq!(codes(send), ["P1", "P4"]);
    let store = hop(&t, "store");
    assert_eq!(store.service.as_deref(), Some("msgtrail-broker"));
    assert_eq!(codes(store), ["P2", "P3"]);
    let deliver = hop(&t, "deliver/billing/billing-1/1");
    assert_eq!(deliver.mode, Some(DeliveryMode::Pull));
    assert_eq!(deliver.attempt, Some(1));
    assert_eq!(deliver.group.as_ref().map(|g| g.as_str()), Some("billing"));
    assert_eq!(
        deliver.consumer.as_ref().map(|c| c.as_str()),
        Some("billing-1")
    );
    assert_eq!(codes(deliver), ["C5", "C8"]);
    let process = hop(&t, "process/billing/billing-1/1");
    assert_eq!(process.parent.as_deref(), Some(deliver.key.as_str()));
    assert_eq!(process.service.as_deref(), Some("billing-1-svc"));
    assert_eq!(codes(process), ["C6", "X1", "X2", "C7"]);
    assert!(t.hops.iter().all(|h| h.latency_nanos.is_some()));

    assert_eq!(t.groups.len(), 1);
    let g = &t.groups[0];
    assert_eq!(g.group.as_str(), "billing");
    assert_eq!(g.state, MessageState::Consumed);
    assert_eq!(g.attempts, 1);
    assert_eq!(g.consumers, [ClientId::new("billing-1").unwrap()]);
    assert!(g.end_to_end_nanos.is_some_and(|e| e > 0));
    assert_eq!(g.last_error, None);
    assert_eq!(t.failure, None);
    assert_state_order(
        &t,
        &[
            MessageState::Sent,
            MessageState::Enqueued,
            MessageState::Delivered,
            MessageState::Consuming,
            MessageState::Consumed,
        ],
    );
    assert_contains(
        &t.diagnosis,
        &[
            "sent by shop",
            "stored",
            "delivered to billing/billing-1",
            "acked after",
            "group billing done",
        ],
    );
    // The request ID finds the same message.
    let by_request = l
        .client
        .trajectory(reply.request_id.as_str(), None)
        .await
        .unwrap();
    assert_eq!(by_request.message_id, Some(id));
    assert_eq!(keys(&by_request), keys(&t));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn success_by_push() {
    let (sys, l) = system_and_listener().await;
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("audit-1").await;
    let mut stream = consumer
        .subscribe(&sub("audit", "orders.>"), PushOptions::default())
        .await
        .unwrap();
    let reply = producer.send("orders.us", "pushed").await.unwrap();
    let got = collect(&mut stream, 1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1, "the message is pushed");
    assert_eq!(got[0].message_id, reply.message_id);
    handle(&consumer, &got[0], None).await;

    let t = l
        .trajectory_when(&reply.message_id.to_string(), consumed)
        .await;
    assert_eq!(
        keys(&t),
        [
            "send",
            "store",
            "deliver/audit/audit-1/1",
            "process/audit/audit-1/1"
        ]
    );
    let deliver = hop(&t, "deliver/audit/audit-1/1");
    assert_eq!(deliver.mode, Some(DeliveryMode::Push));
    assert_eq!(codes(deliver), ["C1", "C4"]);
    let process = hop(&t, "process/audit/audit-1/1");
    assert_eq!(process.mode, Some(DeliveryMode::Push));
    assert_eq!(codes(process), ["C2", "X1", "X2", "C3"]);
    assert_eq!(t.groups.len(), 1);
    assert_eq!(t.groups[0].group.as_str(), "audit");
    assert_eq!(t.groups[0].state, MessageState::Consumed);
    assert!(t.groups[0].end_to_end_nanos.is_some());
    assert_eq!(t.failure, None);
    assert_contains(
        &t.diagnosis,
        &[
            "delivered to audit/audit-1",
            "acked after",
            "group audit done",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_failure_then_success_on_redelivery() {
    let (sys, l) = system_and_listener().await;
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("billing-1").await;
    let reply = producer.send("orders.eu", "retry me").await.unwrap();
    pull_and_handle(&consumer, "billing", 1, Some("insufficient funds")).await;
    pull_and_handle(&consumer, "billing", 2, None).await;

    let t = l
        .trajectory_when(&reply.message_id.to_string(), |t| {
            t.state == MessageState::Consumed && settled(t)
        })
        .await;
    assert_eq!(
        keys(&t),
        [
            "send",
            "store",
            "deliver/billing/billing-1/1",
            "process/billing/billing-1/1",
            "deliver/billing/billing-1/2",
            "process/billing/billing-1/2"
        ]
    );
    let d1 = hop(&t, "deliver/billing/billing-1/1");
    assert_eq!(d1.status, HopStatus::Error);
    assert_eq!(
        d1.reason.as_deref(),
        Some("nacked by consumer billing-1 (group billing)")
    );
    let p1 = hop(&t, "process/billing/billing-1/1");
    assert_eq!(p1.status, HopStatus::Error);
    assert_eq!(
        p1.reason.as_deref(),
        Some("processing failed: insufficient funds")
    );
    let d2 = hop(&t, "deliver/billing/billing-1/2");
    assert_eq!(d2.status, HopStatus::Ok);
    assert!(codes(d2).contains(&"R1".to_owned()), "{:?}", codes(d2));
    assert_eq!(hop(&t, "process/billing/billing-1/2").status, HopStatus::Ok);
    let g = &t.groups[0];
    assert_eq!(g.state, MessageState::Consumed);
    assert_eq!(g.attempts, 2);
    assert_eq!(g.last_error.as_deref(), Some("insufficient funds"));
    assert!(g.end_to_end_nanos.is_some());
    assert_eq!(t.failure, None, "it got through: no failure point");
    assert_state_order(
        &t,
        &[
            MessageState::Delivered,
            MessageState::Failed,
            MessageState::Consumed,
        ],
    );
    assert_contains(
        &t.diagnosis,
        &[
            "delivered to billing/billing-1",
            "processing failed: insufficient funds",
            "redelivered to billing/billing-1, attempt 2",
            "acked after",
            "group billing done",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_after_max_deliveries() {
    let (sys, l) = system_and_listener().await;
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("billing-1").await;
    let reply = producer.send("orders.eu", "poison").await.unwrap();
    for attempt in 1..=MAX_DELIVER {
        pull_and_handle(&consumer, "billing", attempt, Some("insufficient funds")).await;
    }

    let t = l
        .trajectory_when(&reply.message_id.to_string(), |t| {
            t.state == MessageState::DeadLettered
                && t.hops
                    .iter()
                    .filter(|h| h.key.starts_with("process/"))
                    .count()
                    == MAX_DELIVER as usize
                && t.hops.iter().all(|h| h.end.is_some())
        })
        .await;
    assert_eq!(t.groups.len(), 1);
    let g = &t.groups[0];
    assert_eq!(g.state, MessageState::DeadLettered);
    assert_eq!(g.attempts, MAX_DELIVER);
    assert_eq!(g.acked_at, None);
    assert_eq!(g.end_to_end_nanos, None);
    assert_eq!(g.last_error.as_deref(), Some("insufficient funds"));
    for a in 1..=MAX_DELIVER {
        let d = hop(&t, &format!("deliver/billing/billing-1/{a}"));
        assert_eq!(d.status, HopStatus::Error, "{d:#?}");
        let p = hop(&t, &format!("process/billing/billing-1/{a}"));
        assert_eq!(
            p.reason.as_deref(),
            Some("processing failed: insufficient funds")
        );
    }
    let last = hop(&t, &format!("deliver/billing/billing-1/{MAX_DELIVER}"));
    assert!(
        last.events
            .iter()
            .any(|r| r.stage.to_string() == "R1" && r.outcome.as_deref() == Some("dead_letter")),
        "{:?}",
        last.events
    );
    let failure = t.failure.as_deref().expect("a failure point");
    assert_contains(
        failure,
        &[
            "dead-lettered by group billing",
            &format!("after {MAX_DELIVER} attempt(s)"),
            "insufficient funds",
        ],
    );
    assert_contains(
        &t.diagnosis,
        &[
            &format!("redelivered to billing/billing-1, attempt {MAX_DELIVER}"),
            "dead-lettered",
        ],
    );
    assert_state_order(
        &t,
        &[
            MessageState::Delivered,
            MessageState::Failed,
            MessageState::DeadLettered,
        ],
    );
    eventually("a dead letter in the statistics", async || {
        l.handle.stats(None).events.dead_letters == 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_upload_says_why_it_went_no_further() {
    // The broker refuses both uploads before assigning an ID: the producer's P1 and the
    // broker's refusal (P2, outcome refused) are found by request ID, lost at once, with the
    // broker's reason as the failure point.
    let sys = TestSystem::start_with(|c| c.max_payload = 1024).await;
    let l = sys.start_listener(|c| c.deadlines.stored_ms = 300).await;
    let narrow = sys.producer("shop-2").await; // may publish to orders.> only
    let shop = sys.producer("shop").await;
    let forbidden = RequestId::new("refused-topic-1").unwrap();
    let err = narrow
        .send_message(Outgoing::new("payments.card", "x").request_id(forbidden.clone()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::NotPermitted), "{err}");
    let too_large = RequestId::new("refused-size-1").unwrap();
    let err = shop
        .send_message(Outgoing::new("orders.eu", vec![b'x'; 2048]).request_id(too_large.clone()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::PayloadTooLarge), "{err}");

    for (req, producer, topic, code) in [
        (&forbidden, "shop-2", "payments.card", "not_permitted"),
        (&too_large, "shop", "orders.eu", "payload_too_large"),
    ] {
        let t = l
            .trajectory_when(req.as_str(), |t| {
                // Lost as soon as the refusal is in; wait for the producer's P1 as well.
                t.state == MessageState::Lost
                    && t.hop("send")
                        .is_some_and(|h| h.events.iter().any(|r| r.stage == Stage::UploadSent))
            })
            .await;
        assert_eq!(t.message_id, None);
        assert_eq!(t.request_id.as_ref(), Some(req));
        assert_eq!(t.producer.as_ref().map(|p| p.as_str()), Some(producer));
        assert_eq!(t.topic.as_deref(), Some(topic));
        let p = ClientId::new(producer).unwrap();
        assert_eq!(
            t.trace_id,
            Some(trace_ids::hex(&trace_ids::orphan_trace_id(&p, req))),
            "an upload without a message ID is traced under the (producer, request ID) hash"
        );
        assert_eq!(keys(&t), ["send", "store"]);
        let send = hop(&t, "send");
        assert_eq!(codes(send), ["P1"]);
        assert_eq!(send.status, HopStatus::Error);
        let store = hop(&t, "store");
        assert_eq!(codes(store), ["P2"]);
        assert_eq!(store.status, HopStatus::Error);
        assert!(t.groups.is_empty());
        let failure = t.failure.as_deref().expect("a failure point");
        assert_contains(failure, &["refused by the broker", code]);
        assert_contains(
            &t.diagnosis,
            &[&format!("sent by {producer}"), "refused by the broker"],
        );
        assert_eq!(t.states.last().map(|s| s.state), Some(MessageState::Lost));
    }
    // The watchdog counts them as lost too.
    eventually("2 lost messages in the statistics", async || {
        l.handle.stats(None).states.get(&MessageState::Lost) == Some(&2)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_never_acked_is_stuck_at_its_consumer() {
    let sys = TestSystem::start().await;
    let l = sys
        .start_listener(|c| {
            c.deadlines.acked_ms = 300;
            c.deadlines.processed_ms = 300;
        })
        .await;
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("billing-2").await;
    let reply = producer.send("orders.eu", "held").await.unwrap();
    let got = consumer
        .fetch(&sub("billing", "orders.*"), 1, WAIT)
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    // Received, never processed nor settled; nobody fetches again, so no redelivery.

    let id = reply.message_id.to_string();
    let t = l
        .trajectory_when(&id, |t| {
            // Each hop crosses its deadline on its own (the receipt C6 comes after C5).
            t.state == MessageState::Stuck
                && t.hops.len() == 4
                && t.hops.iter().all(|h| h.status != HopStatus::Incomplete)
        })
        .await;
    let who = "stuck at consumer billing-2 (group billing)";
    let deliver = hop(&t, "deliver/billing/billing-2/1");
    assert_eq!(deliver.status, HopStatus::Error);
    assert_eq!(deliver.end, None);
    assert_contains(deliver.reason.as_deref().unwrap(), &[who, "no ack"]);
    let process = hop(&t, "process/billing/billing-2/1");
    assert_eq!(codes(process), ["C6"]);
    assert_eq!(process.status, HopStatus::Error);
    assert_eq!(t.groups.len(), 1);
    assert_eq!(t.groups[0].state, MessageState::Stuck);
    assert_eq!(t.groups[0].acked_at, None);
    assert_contains(t.failure.as_deref().expect("a failure point"), &[who]);
    assert_contains(&t.diagnosis, &["delivered to billing/billing-2", who]);
    assert_eq!(hop(&t, "store").status, HopStatus::Ok);

    // The watchdog marks it, so a search for stuck messages finds it.
    eventually("the message in a search for stuck ones", async || {
        let found = l
            .client
            .search::<msgtrail_listener::MessageSummary>("state=stuck&since_secs=3600")
            .await
            .unwrap();
        found
            .iter()
            .any(|s| s.message_id == Some(reply.message_id) && s.state == MessageState::Stuck)
    })
    .await;
    eventually("the stuck message in the statistics", async || {
        l.handle.stats(None).states.get(&MessageState::Stuck) == Some(&1)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_upload_is_one_message_with_the_duplicate_counted() {
    let (sys, l) = system_and_listener().await;
    let producer = sys.producer("shop").await;
    let req = RequestId::new("dup-req-1").unwrap();
    let first = producer
        .send_message(Outgoing::new("orders.dup", "once").request_id(req.clone()))
        .await
        .unwrap();
    let second = producer
        .send_message(Outgoing::new("orders.dup", "once").request_id(req.clone()))
        .await
        .unwrap();
    assert!(!first.duplicate);
    assert!(second.duplicate);
    assert_eq!(second.message_id, first.message_id);

    let t = l
        .trajectory_when(req.as_str(), |t| {
            t.duplicates == 1
                && t.hop("send").is_some_and(|h| {
                    h.events
                        .iter()
                        .filter(|r| r.stage.to_string() == "P4")
                        .count()
                        == 2
                })
        })
        .await;
    assert_eq!(t.message_id, Some(first.message_id));
    assert_eq!(t.state, MessageState::Enqueued);
    assert_eq!(keys(&t), ["send", "store"], "stored once");
    assert_eq!(codes(hop(&t, "store")), ["P2", "P3"]);
    let send = hop(&t, "send");
    assert_eq!(send.status, HopStatus::Ok);
    let mut send_codes = codes(send);
    send_codes.sort();
    assert_eq!(send_codes, ["D1", "P1", "P1", "P4", "P4"]);
    assert_eq!(t.upload_attempts, 2, "both sends count as attempts");
    assert_contains(
        &t.diagnosis,
        &["1 duplicate upload(s) suppressed", "stored"],
    );
    // One shadow message for the topic, and the duplicate in the statistics.
    let found = l
        .client
        .search::<msgtrail_listener::MessageSummary>("topic=orders.dup")
        .await
        .unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    eventually("the duplicate in the statistics", async || {
        l.handle.stats(None).events.duplicates == 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumer_groups_each_end_to_end() {
    let (sys, l) = system_and_listener().await;
    let producer = sys.producer("shop").await;
    let billing = sys.consumer("billing-1").await;
    let audit = sys.consumer("audit-1").await;
    let mut pushed = audit
        .subscribe(&sub("audit", "orders.*"), PushOptions::default())
        .await
        .unwrap();
    let reply = producer.send("orders.apac", "both").await.unwrap();
    let got = collect(&mut pushed, 1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1);
    handle(&audit, &got[0], None).await;
    pull_and_handle(&billing, "billing", 1, None).await;

    let t = l
        .trajectory_when(&reply.message_id.to_string(), |t| {
            consumed(t) && t.groups.len() == 2
        })
        .await;
    let names: Vec<&str> = t.groups.iter().map(|g| g.group.as_str()).collect();
    assert_eq!(names, ["audit", "billing"]);
    let sent_at = hop(&t, "send").start;
    for g in &t.groups {
        assert_eq!(g.state, MessageState::Consumed, "{g:?}");
        assert_eq!(g.attempts, 1);
        let acked = g.acked_at.expect("acked");
        assert_eq!(
            g.end_to_end_nanos,
            Some(acked - sent_at),
            "P1 → the group's ack"
        );
    }
    assert_eq!(t.groups[0].consumers, [ClientId::new("audit-1").unwrap()]);
    assert_eq!(t.groups[1].consumers, [ClientId::new("billing-1").unwrap()]);
    assert_eq!(
        hop(&t, "deliver/audit/audit-1/1").mode,
        Some(DeliveryMode::Push)
    );
    assert_eq!(
        hop(&t, "deliver/billing/billing-1/1").mode,
        Some(DeliveryMode::Pull)
    );
    assert!(hop(&t, "process/audit/audit-1/1").status == HopStatus::Ok);
    assert!(hop(&t, "process/billing/billing-1/1").status == HopStatus::Ok);
    assert_eq!(t.hops.len(), 6);
    assert_eq!(t.failure, None);
    assert_contains(
        &t.diagnosis,
        &[
            "delivered to audit/audit-1",
            "delivered to billing/billing-1",
            "group audit done",
            "group billing done",
        ],
    );
    // One end-to-end latency per group in the topic's statistics.
    eventually("2 end-to-end latencies for orders.apac", async || {
        l.handle
            .stats(Some("orders.apac"))
            .latency
            .iter()
            .any(|r| r.segment == Segment::EndToEnd && r.total.count == 2)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_stops_even_when_nats_is_already_gone() {
    let sys = TestSystem::start().await;
    let l = sys.start_listener(|_| {}).await;
    let TestSystem { server, .. } = sys;
    drop(server); // as when a Ctrl-C reaches nats-server and the listener at once
    let TestListener { handle, .. } = l;
    let stopped = tokio::time::timeout(Duration::from_secs(20), handle.shutdown()).await;
    assert!(stopped.is_ok(), "the listener must stop without NATS");
}
