//! End-to-end tests of the broker, the SDK and the stage stream against a real nats-server.

use msgtrail_client::{ClientError, Identity, Outgoing, PushOptions};
use msgtrail_core::subjects::{DEAD_LETTER_STREAM, MESSAGE_STREAM};
use msgtrail_core::wire::Subscription;
use msgtrail_core::{ClientId, ErrorCode, RequestId, Stage, StageRecord};
use msgtrail_e2e::{collect, has_all, stages, TestSystem, ACK_WAIT, MAX_DELIVER};
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

fn sub(group: &str, topic: &str) -> Subscription {
    Subscription {
        group: msgtrail_core::GroupId::new(group).unwrap(),
        topic: topic.into(),
        filter: BTreeMap::new(),
        message_id: None,
    }
}

/// Waits for a message's R1 `dead_letter` record; returns it and all the message's records.
async fn dead_letter_record(
    sys: &TestSystem,
    id: msgtrail_core::MessageId,
) -> (StageRecord, Vec<StageRecord>) {
    let is_dead = |r: &StageRecord| r.outcome.as_deref() == Some("dead_letter");
    let recs = sys.records_for(id, |r| r.iter().any(is_dead)).await;
    let dead = recs.iter().find(|r| is_dead(r)).cloned().unwrap();
    (dead, recs)
}

fn count(recs: &[StageRecord], stage: Stage) -> usize {
    recs.iter().filter(|r| r.stage == stage).count()
}

const WAIT: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_store_pull_ack_records_p1_to_p4_and_c5_to_c8() {
    let sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("billing-1").await;
    let rid = RequestId::new("order-1").unwrap();
    let reply = producer
        .send_message(
            Outgoing::new("orders.eu", "hello")
                .request_id(rid.clone())
                .attr("category", "refund"),
        )
        .await
        .unwrap();
    assert!(!reply.duplicate);
    assert_eq!(reply.request_id, rid);
    assert_eq!(reply.stream_seq, 1);

    let got = consumer
        .fetch(&sub("billing", "orders.*"), 10, WAIT)
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    let m = &got[0];
    assert_eq!(m.message_id, reply.message_id);
    assert_eq!(&m.payload[..], b"hello");
    assert_eq!(m.topic, "orders.eu");
    assert_eq!(
        m.attributes.get("category").map(String::as_str),
        Some("refund")
    );
    assert_eq!(m.delivery_attempt, 1);
    assert_eq!(m.producer.as_str(), "shop");
    m.ack().await.unwrap();

    let want = [
        Stage::UploadReceived,
        Stage::Stored,
        Stage::StoreConfirmed,
        Stage::PullSent,
        Stage::PullReceived,
        Stage::PullAckSent,
        Stage::PullAckReceived,
    ];
    let recs = sys
        .records_for(reply.message_id, |r| has_all(r, &want))
        .await;
    // Exactly one of each, and nothing else for this message.
    let mut seen: Vec<Stage> = stages(&recs);
    seen.sort();
    let mut expected = want.to_vec();
    expected.sort();
    assert_eq!(seen, expected, "records: {recs:#?}");
    for r in &recs {
        match r.stage {
            Stage::UploadReceived | Stage::Stored | Stage::StoreConfirmed => {
                assert_eq!(r.request_id.as_ref(), Some(&rid));
                assert_eq!(r.producer.as_ref().map(|p| p.as_str()), Some("shop"));
            }
            _ => {
                assert_eq!(r.consumer.as_ref().map(|p| p.as_str()), Some("billing-1"));
                assert_eq!(r.group.as_ref().map(|p| p.as_str()), Some("billing"));
                assert_eq!(r.attempt, Some(1));
            }
        }
    }
    let p2 = recs
        .iter()
        .find(|r| r.stage == Stage::UploadReceived)
        .unwrap();
    assert_eq!(p2.attrs.get("category").map(String::as_str), Some("refund"));
    assert_eq!(p2.payload_size, Some(5));
    assert_eq!(p2.service.as_deref(), Some("msgtrail-broker"));
    let c6 = recs
        .iter()
        .find(|r| r.stage == Stage::PullReceived)
        .unwrap();
    assert_eq!(
        c6.service.as_deref(),
        Some("billing-1-svc"),
        "client records carry the client's service name"
    );
    // P1 carries no message ID: it is found by request ID.
    let all = sys.stage_records().await;
    let p1: Vec<_> = all
        .iter()
        .filter(|r| r.stage == Stage::UploadSent && r.request_id.as_ref() == Some(&rid))
        .collect();
    assert_eq!(p1.len(), 1);
    assert_eq!(p1[0].producer.as_ref().map(|p| p.as_str()), Some("shop"));
    assert_eq!(p1[0].attempt, Some(1));
    // Acked: nothing left for the group.
    assert!(consumer
        .fetch(&sub("billing", "orders.*"), 10, Duration::from_millis(300))
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_immediate_records_c1_to_c4() {
    let sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("billing-1").await;
    let mut stream = consumer
        .subscribe(&sub("billing", "orders.>"), PushOptions::default())
        .await
        .unwrap();
    let reply = producer.send("orders.eu.new", "pushed").await.unwrap();
    let got = collect(&mut stream, 1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1, "the message is pushed");
    assert_eq!(got[0].message_id, reply.message_id);
    assert!(got[0].push);
    consumer
        .process(got[0].clone(), |m| async move {
            assert_eq!(&m.payload[..], b"pushed");
            Ok::<_, String>(())
        })
        .await
        .unwrap()
        .unwrap();
    let want = [
        Stage::PushSent,
        Stage::PushReceived,
        Stage::ProcessStarted,
        Stage::ProcessFinished,
        Stage::PushAckSent,
        Stage::PushAckReceived,
    ];
    let recs = sys
        .records_for(reply.message_id, |r| has_all(r, &want))
        .await;
    assert_eq!(count(&recs, Stage::PullSent), 0);
    let x2 = recs
        .iter()
        .find(|r| r.stage == Stage::ProcessFinished)
        .unwrap();
    assert_eq!(x2.outcome.as_deref(), Some("ok"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_on_a_schedule_delivers_in_batches() {
    let sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("billing-1").await;
    let every = Duration::from_millis(1500);
    let mut stream = consumer
        .subscribe(
            &sub("billing", "batch"),
            PushOptions::default().every(every).max_inflight(100),
        )
        .await
        .unwrap();
    let mut ids = HashSet::new();
    for i in 0..5 {
        ids.insert(
            producer
                .send("batch", format!("m{i}"))
                .await
                .unwrap()
                .message_id,
        );
    }
    let got = collect(&mut stream, 5, Duration::from_secs(10)).await;
    assert_eq!(
        got.iter().map(|m| m.message_id).collect::<HashSet<_>>(),
        ids
    );
    // Sent together before the first round, so the round carries all of them.
    let seqs: Vec<u64> = got.iter().map(|m| m.stream_seq).collect();
    assert_eq!(seqs, {
        let mut s = seqs.clone();
        s.sort();
        s
    });
    for m in &got {
        m.ack().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_respects_max_inflight() {
    let sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("billing-1").await;
    for i in 0..6 {
        producer.send("inflight", format!("m{i}")).await.unwrap();
    }
    let mut stream = consumer
        .subscribe(
            &sub("billing", "inflight"),
            PushOptions::default().max_inflight(2),
        )
        .await
        .unwrap();
    let first = collect(&mut stream, 3, Duration::from_millis(700)).await;
    assert_eq!(
        first.len(),
        2,
        "no more than max_inflight unsettled deliveries"
    );
    for m in &first {
        m.ack().await.unwrap();
    }
    let next = collect(&mut stream, 2, Duration::from_secs(5)).await;
    assert_eq!(next.len(), 2, "settling frees the slots");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_match_gets_a_notice_and_n1() {
    let sys = TestSystem::start().await;
    let consumer = sys.consumer("billing-1").await;
    let got = consumer
        .fetch(
            &sub("billing", "nothing.here"),
            5,
            Duration::from_millis(200),
        )
        .await
        .unwrap();
    assert!(got.is_empty());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let recs = sys.stage_records().await;
        if let Some(n1) = recs.iter().find(|r| r.stage == Stage::NoMatch) {
            assert_eq!(n1.consumer.as_ref().map(|c| c.as_str()), Some("billing-1"));
            assert_eq!(n1.topic.as_deref(), Some("nothing.here"));
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no N1 record");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_shares_and_every_group_gets_everything() {
    let sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    let b1 = sys.consumer("billing-1").await;
    let b2 = sys.consumer("billing-2").await;
    let audit = sys.consumer("audit-1").await;
    let mut sent = HashSet::new();
    for i in 0..10 {
        sent.insert(
            producer
                .send("orders.eu", format!("m{i}"))
                .await
                .unwrap()
                .message_id,
        );
    }
    let first = b1
        .fetch(&sub("billing", "orders.*"), 4, WAIT)
        .await
        .unwrap();
    let second = b2
        .fetch(&sub("billing", "orders.*"), 10, WAIT)
        .await
        .unwrap();
    assert_eq!(first.len(), 4);
    assert_eq!(second.len(), 6);
    let a: HashSet<_> = first.iter().map(|m| m.message_id).collect();
    let b: HashSet<_> = second.iter().map(|m| m.message_id).collect();
    assert!(a.is_disjoint(&b), "members of one group share the messages");
    assert_eq!(a.union(&b).copied().collect::<HashSet<_>>(), sent);
    let all = audit
        .fetch(&sub("audit", "orders.*"), 100, WAIT)
        .await
        .unwrap();
    assert_eq!(
        all.iter().map(|m| m.message_id).collect::<HashSet<_>>(),
        sent,
        "another group gets all"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attribute_filters_select_messages() {
    let sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("billing-1").await;
    let refund = producer
        .send_message(Outgoing::new("pay", "r").attr("category", "refund"))
        .await
        .unwrap();
    producer
        .send_message(Outgoing::new("pay", "s").attr("category", "sale"))
        .await
        .unwrap();
    producer.send("pay", "none").await.unwrap();
    let mut s = sub("refunds", "pay");
    s.filter.insert("category".into(), "refund".into());
    let got = consumer.fetch(&s, 10, WAIT).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message_id, refund.message_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_by_message_id() {
    let sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("billing-1").await;
    let mut ids = vec![];
    for i in 0..5 {
        ids.push(producer.send("orders.eu", format!("m{i}")).await.unwrap());
    }
    let target = &ids[2];
    let mut s = sub("lookup", "orders.*");
    s.message_id = Some(target.message_id);
    let got = consumer.fetch(&s, 1, WAIT).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message_id, target.message_id);
    assert_eq!(&got[0].payload[..], b"m2");
    got[0].ack().await.unwrap();
    // An unknown (but well-formed) ID gets the no-match notice.
    s.message_id = Some(msgtrail_core::MessageId::new());
    assert!(consumer
        .fetch(&s, 1, Duration::from_millis(300))
        .await
        .unwrap()
        .is_empty());
}

/// A fetch by message ID and a delivery through the group's topic subscription are two
/// deliveries: their records say which is which (`by_id`, stamped by the broker also on the
/// consumer's reports), so the trajectory has a hop and a span ID for each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_by_id_and_a_subscription_delivery_are_different_hops() {
    use msgtrail_core::trajectory::{AssembleOptions, Trajectory};
    let sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("billing-1").await;
    let sent = producer.send("orders.eu", "m").await.unwrap();
    let mut by_id = sub("billing", "orders.*");
    by_id.message_id = Some(sent.message_id);
    let fetched = consumer.fetch(&by_id, 1, WAIT).await.unwrap();
    assert!(fetched[0].by_id);
    consumer
        .process(fetched[0].clone(), |_| async { Ok::<(), String>(()) })
        .await
        .unwrap()
        .unwrap();
    // Not the group's consumption: its topic subscription delivers the message too.
    let again = consumer
        .fetch(&sub("billing", "orders.*"), 1, WAIT)
        .await
        .unwrap();
    assert_eq!(again[0].message_id, sent.message_id);
    assert!(!again[0].by_id);
    assert_ne!(fetched[0].process_span_ids(), again[0].process_span_ids());
    again[0].ack().await.unwrap();
    let recs = sys
        .records_for(sent.message_id, |r| {
            r.iter()
                .filter(|r| r.stage == Stage::PullAckReceived)
                .count()
                == 2
                && r.iter().any(|r| r.stage == Stage::ProcessFinished)
        })
        .await;
    let flagged = |stage: Stage| {
        recs.iter()
            .filter(|r| r.stage == stage)
            .map(|r| r.by_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(flagged(Stage::ProcessFinished), [true], "{recs:#?}");
    let mut c5 = flagged(Stage::PullSent);
    c5.sort();
    assert_eq!(c5, [false, true]);
    let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
    assert!(
        t.hop("deliver/billing/billing-1/1/by-id").is_some(),
        "{t:#?}"
    );
    assert!(t.hop("deliver/billing/billing-1/1").is_some(), "{t:#?}");
    let (_, span) = fetched[0].process_span_ids();
    let process = t.hop("process/billing/billing-1/1/by-id").unwrap();
    assert_eq!(
        process.span_id.as_deref(),
        Some(msgtrail_core::trace_ids::hex(&span).as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_request_id_is_stored_once_with_the_same_message_id() {
    let sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    let rid = RequestId::new("retry-me").unwrap();
    let first = producer
        .send_message(Outgoing::new("orders.eu", "x").request_id(rid.clone()))
        .await
        .unwrap();
    let second = producer
        .send_message(Outgoing::new("orders.eu", "x").request_id(rid.clone()))
        .await
        .unwrap();
    assert!(!first.duplicate);
    assert!(second.duplicate);
    assert_eq!(first.message_id, second.message_id);
    assert_eq!(first.stream_seq, second.stream_seq);
    assert_eq!(
        sys.stream_messages(MESSAGE_STREAM).await.len(),
        1,
        "stored once"
    );
    // Another producer may use the same request ID for its own message.
    let other = sys.producer("shop-2").await;
    let third = other
        .send_message(Outgoing::new("orders.eu", "y").request_id(rid.clone()))
        .await
        .unwrap();
    assert!(!third.duplicate);
    assert_ne!(third.message_id, first.message_id);
    let recs = sys
        .records_for(first.message_id, |r| count(r, Stage::Duplicate) == 1)
        .await;
    let d1 = recs.iter().find(|r| r.stage == Stage::Duplicate).unwrap();
    assert_eq!(d1.request_id.as_ref(), Some(&rid));
    assert_eq!(count(&recs, Stage::UploadReceived), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacked_delivery_is_redelivered_after_the_ack_wait() {
    let sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("billing-1").await;
    let reply = producer.send("orders.eu", "slow").await.unwrap();
    let first = consumer
        .fetch(&sub("billing", "orders.*"), 1, WAIT)
        .await
        .unwrap();
    assert_eq!(first[0].delivery_attempt, 1);
    // Not acked: after the ack wait it comes back.
    let again = consumer
        .fetch(&sub("billing", "orders.*"), 1, ACK_WAIT * 4)
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].message_id, reply.message_id);
    assert_eq!(again[0].delivery_attempt, 2);
    again[0].ack().await.unwrap();
    let recs = sys
        .records_for(reply.message_id, |r| {
            count(r, Stage::Redelivery) == 1 && count(r, Stage::PullAckReceived) == 1
        })
        .await;
    let r1 = recs.iter().find(|r| r.stage == Stage::Redelivery).unwrap();
    assert_eq!(r1.outcome.as_deref(), Some("redeliver"));
    assert_eq!(r1.attempt, Some(2));
    assert_eq!(count(&recs, Stage::PullSent), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_up_to_max_deliveries_dead_letter_the_message() {
    let sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("billing-1").await;
    let reply = producer.send("orders.eu", "poison").await.unwrap();
    for attempt in 1..=MAX_DELIVER {
        let got = consumer
            .fetch(&sub("billing", "orders.*"), 1, WAIT)
            .await
            .unwrap();
        assert_eq!(got.len(), 1, "attempt {attempt}");
        assert_eq!(got[0].delivery_attempt, attempt);
        let outcome = consumer
            .process(got[0].clone(), |_| async {
                Err::<(), _>("insufficient funds".to_string())
            })
            .await
            .unwrap();
        assert_eq!(outcome, Err("insufficient funds".to_string()));
    }
    assert!(
        consumer
            .fetch(&sub("billing", "orders.*"), 1, ACK_WAIT * 2)
            .await
            .unwrap()
            .is_empty(),
        "never delivered again"
    );
    let dlq = sys.stream_messages(DEAD_LETTER_STREAM).await;
    assert_eq!(dlq.len(), 1);
    assert_eq!(dlq[0].subject.as_str(), "msgtrail.dlq.billing.orders.eu");
    assert_eq!(&dlq[0].payload[..], b"poison");
    let (dead, recs) = dead_letter_record(&sys, reply.message_id).await;
    assert_eq!(dead.attempt, Some(MAX_DELIVER));
    assert!(
        dead.detail
            .as_deref()
            .unwrap()
            .contains("insufficient funds"),
        "{dead:?}"
    );
    let failed: Vec<_> = recs
        .iter()
        .filter(|r| r.stage == Stage::ProcessFinished)
        .collect();
    assert_eq!(failed.len(), MAX_DELIVER as usize);
    assert!(failed.iter().all(|r| r.outcome.as_deref() == Some("failed")
        && r.detail.as_deref() == Some("insufficient funds")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_with_delay_redelivers_later() {
    let sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("billing-1").await;
    let reply = producer.send("orders.eu", "later").await.unwrap();
    let got = consumer
        .fetch(&sub("billing", "orders.*"), 1, WAIT)
        .await
        .unwrap();
    got[0]
        .nack(Some(Duration::from_millis(2000)))
        .await
        .unwrap();
    assert!(
        consumer
            .fetch(&sub("billing", "orders.*"), 1, Duration::from_millis(300))
            .await
            .unwrap()
            .is_empty(),
        "not before the delay"
    );
    let again = consumer
        .fetch(&sub("billing", "orders.*"), 1, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].message_id, reply.message_id);
    assert_eq!(again[0].delivery_attempt, 2);
    let recs = sys
        .records_for(reply.message_id, |r| count(r, Stage::PullAckReceived) >= 1)
        .await;
    assert!(recs
        .iter()
        .any(|r| r.stage == Stage::PullAckReceived && r.outcome.as_deref() == Some("nack")));
}

fn refused(e: ClientError) -> ErrorCode {
    e.code()
        .unwrap_or_else(|| panic!("expected a refusal, got {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_refuse_unknown_clients_bad_signatures_and_foreign_topics() {
    let sys = TestSystem::start().await;
    let stranger = Identity::generate(ClientId::new("stranger").unwrap());
    let e = msgtrail_client::Producer::connect(sys.nats.clone(), stranger)
        .await
        .unwrap_err();
    assert_eq!(refused(e), ErrorCode::UnknownClient);

    // Right ID, wrong key.
    let impostor = Identity::generate(ClientId::new("shop").unwrap());
    let e = msgtrail_client::Producer::connect(sys.nats.clone(), impostor)
        .await
        .unwrap_err();
    assert_eq!(refused(e), ErrorCode::BadSignature);

    // A consumer identity cannot open a producer channel.
    let e = msgtrail_client::Producer::connect(sys.nats.clone(), sys.identity("billing-1"))
        .await
        .unwrap_err();
    assert_eq!(refused(e), ErrorCode::UnknownClient);

    let narrow = sys.consumer("narrow-1").await;
    let e = narrow
        .fetch(&sub("n", "payments.*"), 1, Duration::from_millis(100))
        .await
        .unwrap_err();
    assert_eq!(refused(e), ErrorCode::NotPermitted);
    assert!(narrow
        .fetch(&sub("n", "orders.*"), 1, Duration::from_millis(100))
        .await
        .unwrap()
        .is_empty());

    let limited = sys.producer("shop-2").await;
    let e = limited.send("payments.x", "no").await.unwrap_err();
    assert_eq!(refused(e), ErrorCode::NotPermitted);

    let metrics = &sys.broker.as_ref().unwrap().metrics;
    let errors = metrics.errors();
    assert_eq!(errors.get("unknown_client"), Some(&2));
    assert_eq!(errors.get("bad_signature"), Some(&1));
    let refusals: Vec<_> = {
        tokio::time::sleep(Duration::from_millis(200)).await;
        sys.stage_records()
            .await
            .into_iter()
            .filter(|r| r.stage == Stage::Channel && r.outcome.as_deref() == Some("refused"))
            .collect()
    };
    assert_eq!(refusals.len(), 3, "each refusal is an A1 record");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_payloads_and_malformed_headers_are_refused_precisely() {
    let sys = TestSystem::start_with(|c| c.max_payload = 1024).await;
    let producer = sys.producer("shop").await;
    let e = producer
        .send("orders.eu", vec![0u8; 2048])
        .await
        .unwrap_err();
    assert_eq!(refused(e), ErrorCode::PayloadTooLarge);

    let bad_tp = Outgoing::new("orders.eu", "x").traceparent("00-nothex-01");
    assert_eq!(
        refused(producer.send_message(bad_tp).await.unwrap_err()),
        ErrorCode::BadRequest
    );
    let bad_attr = Outgoing::new("orders.eu", "x").attr("bad key", "v");
    assert!(
        matches!(
            producer.send_message(bad_attr).await.unwrap_err(),
            ClientError::Invalid(_)
        ),
        "checked before sending"
    );
    assert!(matches!(
        producer.send("bad..topic", "x").await.unwrap_err(),
        ClientError::Invalid(_)
    ));

    // Raw requests: no channel header, a bad attempt header, malformed JSON.
    let reply = sys
        .nats
        .request("msgtrail.v1.upload", "x".into())
        .await
        .unwrap();
    let hs = reply.headers.unwrap();
    assert_eq!(hs.get("Msgtrail-Error").unwrap().as_str(), "bad_request");
    assert_eq!(hs.get("Nats-Service-Error-Code").unwrap().as_str(), "400");
    assert!(hs
        .get("Nats-Service-Error")
        .unwrap()
        .as_str()
        .contains("Msgtrail-Channel"));
    let mut hs = async_nats::HeaderMap::new();
    hs.insert("Msgtrail-Channel", "whatever");
    hs.insert("Msgtrail-Attr-category", "x".repeat(300).as_str());
    let reply = sys
        .nats
        .request_with_headers("msgtrail.v1.upload", hs, "x".into())
        .await
        .unwrap();
    assert_eq!(
        reply
            .headers
            .unwrap()
            .get("Msgtrail-Error")
            .unwrap()
            .as_str(),
        "unknown_channel",
        "the channel is checked first"
    );
    let reply = sys
        .nats
        .request("msgtrail.v1.fetch", "{not json".into())
        .await
        .unwrap();
    assert_eq!(
        reply
            .headers
            .unwrap()
            .get("Msgtrail-Error")
            .unwrap()
            .as_str(),
        "bad_request"
    );
    let reply = sys
        .nats
        .request(
            "msgtrail.v1.ack",
            r#"{"channel":"nope","token":"x","kind":"ack"}"#.into(),
        )
        .await
        .unwrap();
    assert_eq!(
        reply
            .headers
            .unwrap()
            .get("Msgtrail-Error")
            .unwrap()
            .as_str(),
        "unknown_channel"
    );

    // Nothing was stored, and the broker still works.
    assert_eq!(sys.stream_messages(MESSAGE_STREAM).await.len(), 0);
    assert!(!producer.send("orders.eu", "fine").await.unwrap().duplicate);
    let errors = sys.broker.as_ref().unwrap().metrics.errors();
    assert_eq!(errors.get("payload_too_large"), Some(&1));
}

/// Opens a channel with raw requests, as a client in another language would.
async fn raw_channel(sys: &TestSystem, role: &str, name: &str) -> String {
    let ident = sys.identity(name);
    let challenge = format!(r#"{{"client_id":"{name}"}}"#);
    let ch: serde_json::Value = serde_json::from_slice(
        &sys.nats
            .request("msgtrail.v1.channel.challenge", challenge.into())
            .await
            .unwrap()
            .payload,
    )
    .unwrap();
    let nonce = ch["nonce"].as_str().unwrap();
    let open = serde_json::json!({"role":role,"client_id":name,"nonce":nonce,"signature":ident.sign(nonce),"service_name":format!("{name}-svc")});
    let opened: serde_json::Value = serde_json::from_slice(
        &sys.nats
            .request("msgtrail.v1.channel.open", open.to_string().into())
            .await
            .unwrap()
            .payload,
    )
    .unwrap();
    opened["channel"].as_str().unwrap().to_owned()
}

/// Sends a raw stage report; returns the error code, if refused.
async fn report(sys: &TestSystem, channel: &str, body: String) -> Option<String> {
    let mut hs = async_nats::HeaderMap::new();
    hs.insert("Msgtrail-Channel", channel);
    let r = sys
        .nats
        .request_with_headers("msgtrail.v1.stage", hs, body.into())
        .await
        .unwrap();
    r.headers
        .and_then(|h| h.get("Msgtrail-Error").map(|v| v.as_str().to_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_cannot_report_records_that_are_not_theirs() {
    let sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    let stored = producer.send("orders.eu", "x").await.unwrap();
    let b1 = sys.consumer("billing-1").await;
    let got = b1
        .fetch(&sub("billing", "orders.*"), 1, WAIT)
        .await
        .unwrap();
    let token = got[0].ack_token.clone();
    let id = stored.message_id;
    let mine = raw_channel(&sys, "consumer", "billing-1").await;
    let mallory = raw_channel(&sys, "consumer", "billing-2").await;

    let line = |stage: &str, extra: &str| format!(r#"{{"stage":"{stage}","at":7{extra}}}"#);
    // Wrong role, wrong name, broker-only stage, garbage.
    assert_eq!(
        report(&sys, &mine, line("P1", r#","request_id":"r""#))
            .await
            .as_deref(),
        Some("record_not_owned")
    );
    assert_eq!(
        report(
            &sys,
            &mine,
            line(
                "C6",
                &format!(r#","consumer":"billing-2","token":"{token}""#)
            )
        )
        .await
        .as_deref(),
        Some("record_not_owned")
    );
    assert_eq!(
        report(&sys, &mine, line("C5", &format!(r#","message_id":"{id}""#)))
            .await
            .as_deref(),
        Some("record_not_owned")
    );
    assert_eq!(
        report(&sys, &mine, "garbage".into()).await.as_deref(),
        Some("invalid_record")
    );
    // No proof of delivery, another consumer's proof, a proof that does not fit the record.
    assert_eq!(
        report(&sys, &mine, line("X1", &format!(r#","message_id":"{id}""#)))
            .await
            .as_deref(),
        Some("record_not_owned")
    );
    assert_eq!(
        report(
            &sys,
            &mallory,
            line(
                "C6",
                &format!(r#","message_id":"{id}","group":"billing","token":"{token}""#)
            )
        )
        .await
        .as_deref(),
        Some("record_not_owned"),
        "a token seen by another consumer does not make the delivery theirs"
    );
    let other = msgtrail_core::MessageId::new();
    assert_eq!(
        report(
            &sys,
            &mine,
            line(
                "X1",
                &format!(r#","message_id":"{other}","token":"{token}""#)
            )
        )
        .await
        .as_deref(),
        Some("record_not_owned")
    );
    assert_eq!(
        report(&sys, &mine, line("C2", &format!(r#","token":"{token}""#)))
            .await
            .as_deref(),
        Some("record_not_owned"),
        "C2 needs a push delivery"
    );
    // The real thing: IDs come from the token, service from the channel.
    assert_eq!(
        report(
            &sys,
            &mine,
            line("X1", &format!(r#","service":"forged","token":"{token}""#))
        )
        .await,
        None
    );
    let recs = sys
        .records_for(id, |r| {
            r.iter()
                .any(|r| r.stage == Stage::ProcessStarted && r.at == 7)
        })
        .await;
    let x1: Vec<_> = recs.iter().filter(|r| r.at == 7).collect();
    assert_eq!(x1.len(), 1, "only the valid record was relayed: {recs:#?}");
    assert_eq!(
        x1[0].consumer.as_ref().map(|c| c.as_str()),
        Some("billing-1")
    );
    assert_eq!(x1[0].group.as_ref().map(|c| c.as_str()), Some("billing"));
    assert_eq!(x1[0].attempt, Some(1));
    assert_eq!(
        x1[0].service.as_deref(),
        Some("billing-1-svc"),
        "service comes from the channel"
    );

    // A producer's P4 needs the receipt of its own upload.
    let shop2 = raw_channel(&sys, "producer", "shop-2").await;
    let p4 = |receipt: &str| {
        line(
            "P4",
            &format!(
                r#","request_id":"{}","message_id":"{id}","token":"{receipt}""#,
                stored.request_id
            ),
        )
    };
    assert_eq!(
        report(&sys, &shop2, p4(&stored.receipt)).await.as_deref(),
        Some("record_not_owned"),
        "not shop-2's upload"
    );
    let shop = raw_channel(&sys, "producer", "shop").await;
    assert_eq!(
        report(&sys, &shop, p4("bm9wZQ")).await.as_deref(),
        Some("record_not_owned")
    );
    assert_eq!(report(&sys, &shop, p4(&stored.receipt)).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_cannot_settle_another_consumers_delivery() {
    let sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    producer.send("orders.eu", "x").await.unwrap();
    let b1 = sys.consumer("billing-1").await;
    let got = b1
        .fetch(&sub("billing", "orders.*"), 1, WAIT)
        .await
        .unwrap();
    let mallory = raw_channel(&sys, "consumer", "billing-2").await;
    // Rewrite the consumer inside the token body and keep the signature.
    let (body, tag) = got[0].ack_token.split_once('.').unwrap();
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut bytes = b64.decode(body).unwrap();
    let at = bytes
        .windows(9)
        .position(|w| w == b"billing-1")
        .expect("the token names its consumer");
    bytes[at..at + 9].copy_from_slice(b"billing-2");
    let forged = format!("{}.{tag}", b64.encode(&bytes));
    let req = serde_json::json!({"channel": mallory, "token": forged, "kind": "ack"});
    let r = sys
        .nats
        .request("msgtrail.v1.ack", req.to_string().into())
        .await
        .unwrap();
    assert_eq!(
        r.headers.unwrap().get("Msgtrail-Error").unwrap().as_str(),
        "bad_ack_token"
    );
    // The delivery is still billing-1's to settle.
    got[0].ack().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_sends_share_one_request_id_and_graceful_shutdown_flushes() {
    let mut sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    let mut ids = vec![];
    let sends: Vec<_> = (0..50)
        .map(|i| producer.send("orders.eu", format!("m{i}")))
        .collect();
    for r in futures::future::join_all(sends).await {
        ids.push(r.unwrap().message_id);
    }
    sys.stop_broker().await;
    // Every P3 of the accepted uploads is in the stage stream after a graceful stop.
    let recs = sys.stage_records().await;
    for id in &ids {
        assert!(
            recs.iter()
                .any(|r| r.stage == Stage::Stored && r.message_id == Some(*id)),
            "P3 of {id} flushed"
        );
    }
    // With no broker, a send fails after its retries with a transient error.
    let e = producer.send("orders.eu", "lost").await.unwrap_err();
    assert!(e.is_transient(), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_timeouts_up_to_max_deliveries_dead_letter_the_message() {
    let sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("billing-1").await;
    let reply = producer.send("orders.eu", "ignored").await.unwrap();
    for attempt in 1..=MAX_DELIVER {
        let got = consumer
            .fetch(&sub("billing", "orders.*"), 1, ACK_WAIT * 3)
            .await
            .unwrap();
        assert_eq!(got.len(), 1, "attempt {attempt}");
        assert_eq!(got[0].delivery_attempt, attempt);
    }
    // JetStream notices the exhausted message when the group asks for more.
    assert!(consumer
        .fetch(&sub("billing", "orders.*"), 1, ACK_WAIT * 3)
        .await
        .unwrap()
        .is_empty());
    let (dead, _) = dead_letter_record(&sys, reply.message_id).await;
    assert!(
        dead.detail.as_deref().unwrap().contains("not acked"),
        "{dead:?}"
    );
    assert_eq!(dead.group.as_ref().map(|g| g.as_str()), Some("billing"));
    assert_eq!(sys.stream_messages(DEAD_LETTER_STREAM).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_brokers_share_the_work_and_unsubscribe_reaches_the_owner() {
    let mut sys = TestSystem::start().await;
    sys.start_another_broker().await;
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("billing-1").await;
    // Several subscriptions: the queue group spreads them (and their unsubscribes) over both.
    let mut streams = vec![];
    for i in 0..6 {
        let s = sub(&format!("g{i}"), "two.brokers");
        streams.push(
            consumer
                .subscribe(&s, PushOptions::default())
                .await
                .unwrap(),
        );
    }
    let reply = producer.send("two.brokers", "x").await.unwrap();
    for s in streams.iter_mut() {
        let got = collect(s, 1, Duration::from_secs(10)).await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].message_id, reply.message_id);
        got[0].ack().await.unwrap();
    }
    let channel = raw_channel(&sys, "consumer", "billing-1").await;
    // Unsubscribing needs the subscription's own channel, wherever the request lands.
    for s in &streams {
        let req = serde_json::json!({"channel": channel, "subscription_id": s.subscription_id()});
        let r = sys
            .nats
            .request("msgtrail.v1.unsubscribe", req.to_string().into())
            .await
            .unwrap();
        assert_eq!(
            r.headers.unwrap().get("Msgtrail-Error").unwrap().as_str(),
            "unknown_subscription"
        );
    }
    let ids: Vec<String> = streams
        .iter()
        .map(|s| s.subscription_id().to_owned())
        .collect();
    drop(streams); // the SDK unsubscribes on drop, through whichever broker takes the request
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = producer.send("two.brokers", "y").await.unwrap();
    // No subscription pushes any more: every group's message is still there to fetch.
    for (i, id) in ids.iter().enumerate() {
        let got = consumer
            .fetch(&sub(&format!("g{i}"), "two.brokers"), 5, WAIT)
            .await
            .unwrap();
        let seen: Vec<_> = got
            .iter()
            .map(|m| (m.message_id, m.delivery_attempt))
            .collect();
        assert_eq!(
            seen,
            vec![(second.message_id, 1)],
            "group g{i}: subscription {id} still pushed"
        );
    }
    for b in sys.more_brokers.drain(..) {
        b.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_expire_without_keepalive_and_close_explicitly() {
    let mut sys = TestSystem::start_with(|c| c.channel_ttl = Duration::from_secs(1)).await;
    sys.start_another_broker().await;
    let fetch = |channel: String| {
        let nats = sys.nats.clone();
        async move {
            let req =
                serde_json::json!({"channel": channel, "group": "g", "topic": "t", "wait_ms": 0});
            let r = nats
                .request("msgtrail.v1.fetch", req.to_string().into())
                .await
                .unwrap();
            r.headers
                .and_then(|h| h.get("Msgtrail-Error").map(|v| v.as_str().to_owned()))
        }
    };
    let idle = raw_channel(&sys, "consumer", "billing-1").await;
    assert_eq!(fetch(idle.clone()).await, None, "open channel works");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        fetch(idle).await.as_deref(),
        Some("unknown_channel"),
        "expired without keepalive"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let expired: Vec<StageRecord> = sys
            .stage_records()
            .await
            .into_iter()
            .filter(|r| r.stage == Stage::Channel && r.outcome.as_deref() == Some("expired"))
            .collect();
        if !expired.is_empty() {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let again = sys
                .stage_records()
                .await
                .into_iter()
                .filter(|r| r.stage == Stage::Channel && r.outcome.as_deref() == Some("expired"))
                .count();
            assert_eq!(again, 1, "recorded once, though both brokers saw it expire");
            assert_eq!(
                expired[0].consumer.as_ref().map(|c| c.as_str()),
                Some("billing-1")
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no A1 expired record"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let kept = raw_channel(&sys, "consumer", "billing-1").await;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let req = serde_json::json!({"channel": kept});
        let r = sys
            .nats
            .request("msgtrail.v1.channel.keepalive", req.to_string().into())
            .await
            .unwrap();
        assert!(r.headers.is_none(), "keepalive accepted");
    }
    assert_eq!(fetch(kept.clone()).await, None, "kept alive past its ttl");
    let req = serde_json::json!({"channel": kept});
    sys.nats
        .request("msgtrail.v1.channel.close", req.to_string().into())
        .await
        .unwrap();
    assert_eq!(
        fetch(kept).await.as_deref(),
        Some("unknown_channel"),
        "closed"
    );
    // The SDK keeps its channel alive by itself.
    let consumer = sys.consumer("billing-2").await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(consumer
        .fetch(&sub("g", "t"), 1, Duration::from_millis(100))
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn term_dead_letters_at_once_with_the_reason() {
    let sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("billing-1").await;
    let reply = producer.send("orders.eu", "bad order").await.unwrap();
    let got = consumer
        .fetch(&sub("billing", "orders.*"), 1, WAIT)
        .await
        .unwrap();
    got[0].term("malformed order").await.unwrap();
    assert!(consumer
        .fetch(&sub("billing", "orders.*"), 1, ACK_WAIT * 2)
        .await
        .unwrap()
        .is_empty());
    let (dead, recs) = dead_letter_record(&sys, reply.message_id).await;
    assert_eq!(dead.attempt, Some(1));
    assert!(
        dead.detail.as_deref().unwrap().contains("malformed order"),
        "{dead:?}"
    );
    assert!(recs
        .iter()
        .any(|r| r.stage == Stage::PullAckReceived && r.outcome.as_deref() == Some("term")));
    assert_eq!(sys.stream_messages(DEAD_LETTER_STREAM).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brokers_starting_together_on_a_fresh_server_all_come_up() {
    let server = msgtrail_test_support::NatsServer::start().unwrap();
    let config = msgtrail_broker::BrokerConfig {
        nats: msgtrail_client::NatsOptions::url(server.url()),
        ..Default::default()
    };
    let (a, b, c) = tokio::join!(
        msgtrail_broker::start(config.clone()),
        msgtrail_broker::start(config.clone()),
        msgtrail_broker::start(config),
    );
    for broker in [a, b, c] {
        broker.expect("every broker starts").shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_survive_dropping_the_producer_and_consumer_right_away() {
    let sys = TestSystem::start().await;
    let rid = RequestId::new("drop-me").unwrap();
    let reply = {
        let producer = sys.producer("shop").await;
        producer
            .send_message(Outgoing::new("orders.eu", "x").request_id(rid.clone()))
            .await
            .unwrap()
    };
    {
        let consumer = sys.consumer("billing-1").await;
        let got = consumer
            .fetch(&sub("billing", "orders.*"), 1, WAIT)
            .await
            .unwrap();
        got[0].ack().await.unwrap();
    }
    let recs = sys
        .records_for(reply.message_id, |r| {
            has_all(
                r,
                &[
                    Stage::StoreConfirmed,
                    Stage::PullReceived,
                    Stage::PullAckSent,
                ],
            )
        })
        .await;
    assert_eq!(count(&recs, Stage::StoreConfirmed), 1);
    let p1 = sys
        .stage_records()
        .await
        .into_iter()
        .filter(|r| r.stage == Stage::UploadSent && r.request_id.as_ref() == Some(&rid))
        .count();
    assert_eq!(p1, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_even_when_nats_is_already_gone() {
    let sys = TestSystem::start_with(|c| c.shutdown_grace = Duration::from_secs(1)).await;
    let producer = sys.producer("shop").await;
    producer.send("orders.eu", "x").await.unwrap();
    let TestSystem {
        server, mut broker, ..
    } = sys;
    drop(server); // as when a Ctrl-C reaches nats-server and the broker at once
    let stopped =
        tokio::time::timeout(Duration::from_secs(20), broker.take().unwrap().shutdown()).await;
    assert!(stopped.is_ok(), "the broker must stop without NATS");
}

/// Issue 14, finding 7: a consumer slower than the ack wait. Its late ack is refused with
/// `delivery_expired` (not transient), counted, records no C8, and the message comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_after_the_ack_wait_is_refused_as_delivery_expired() {
    let sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("billing-1").await;
    let reply = producer.send("orders.eu", "slow").await.unwrap();
    let first = consumer
        .fetch(&sub("billing", "orders.*"), 1, WAIT)
        .await
        .unwrap();
    assert_eq!(first[0].delivery_attempt, 1);
    tokio::time::sleep(ACK_WAIT + Duration::from_millis(200)).await;
    let late = first[0].ack().await.unwrap_err();
    assert!(late.is_delivery_expired(), "{late}");
    assert!(!late.is_transient(), "{late}");
    assert!(
        late.to_string()
            .contains("after the delivery's ack wait ran out"),
        "{late}"
    );
    // The refused ack was not applied: the message comes back, and this ack is taken.
    let again = consumer
        .fetch(&sub("billing", "orders.*"), 1, ACK_WAIT * 3)
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].message_id, reply.message_id);
    assert_eq!(again[0].delivery_attempt, 2);
    again[0].ack().await.unwrap();
    let metrics = &sys.broker.as_ref().unwrap().metrics;
    assert_eq!(
        metrics
            .settles_expired
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(metrics.errors().get("delivery_expired"), Some(&1));
    // One C8, the second delivery's: the refused ack left no record saying it was taken.
    let recs = sys
        .records_for(reply.message_id, |r| count(r, Stage::PullAckReceived) == 1)
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let recs = {
        let later = sys.records_for(reply.message_id, |_| true).await;
        assert!(later.len() >= recs.len());
        later
    };
    let acks: Vec<_> = recs
        .iter()
        .filter(|r| r.stage == Stage::PullAckReceived)
        .collect();
    assert_eq!(acks.len(), 1, "{recs:?}");
    assert_eq!(acks[0].attempt, Some(2));
}

/// Issue 14, finding 7: an ack that arrives after the broker dead-lettered the message (the
/// last delivery's ack wait ran out) is refused, and the trajectory keeps no C8 for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_after_the_dead_letter_is_refused_and_not_recorded() {
    let sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("billing-1").await;
    let reply = producer.send("orders.eu", "hung").await.unwrap();
    let mut deliveries = vec![];
    for attempt in 1..=MAX_DELIVER {
        let got = consumer
            .fetch(&sub("billing", "orders.*"), 1, ACK_WAIT * 3)
            .await
            .unwrap();
        assert_eq!(got.len(), 1, "attempt {attempt}");
        assert_eq!(got[0].delivery_attempt, attempt);
        deliveries.push(got[0].clone());
    }
    // JetStream notices the exhausted message when the group asks for more.
    assert!(consumer
        .fetch(&sub("billing", "orders.*"), 1, ACK_WAIT * 3)
        .await
        .unwrap()
        .is_empty());
    let (dead, _) = dead_letter_record(&sys, reply.message_id).await;
    assert_eq!(dead.attempt, Some(MAX_DELIVER));
    // The hung handler finishes now and acks every delivery it got: all refused.
    for d in &deliveries {
        let e = d.ack().await.unwrap_err();
        assert!(
            e.is_delivery_expired(),
            "attempt {}: {e}",
            d.delivery_attempt
        );
    }
    let last = deliveries.last().unwrap();
    let e = last.ack().await.unwrap_err();
    assert!(
        e.to_string().contains("last allowed attempt"),
        "the error says the message was dead-lettered: {e}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let recs = sys.records_for(reply.message_id, |_| true).await;
    assert_eq!(count(&recs, Stage::PullAckReceived), 0, "{recs:?}");
    assert_eq!(sys.stream_messages(DEAD_LETTER_STREAM).await.len(), 1);
}

/// Issue 14, finding 4: a settle is answered ok only when JetStream confirms it. With the
/// group's consumer gone (as while its leader is lost) nothing answers the ack: the consumer is
/// told `unavailable` (transient: settle again), not ok, and no C8 claims it was taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_jetstream_does_not_confirm_is_not_answered_ok() {
    let sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("billing-1").await;
    let reply = producer.send("orders.eu", "x").await.unwrap();
    let subscription = sub("billing", "orders.*");
    let got = consumer.fetch(&subscription, 1, WAIT).await.unwrap();
    assert_eq!(got.len(), 1);
    let js = async_nats::jetstream::new(sys.nats.clone());
    let stream = js.get_stream(MESSAGE_STREAM).await.unwrap();
    assert!(
        stream
            .delete_consumer(&msgtrail_broker::durable_name(&subscription))
            .await
            .unwrap()
            .success
    );
    let e = got[0].ack().await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unavailable), "{e}");
    assert!(e.is_transient(), "{e}");
    assert!(e.to_string().contains("settle again"), "{e}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let recs = sys.records_for(reply.message_id, |_| true).await;
    assert_eq!(count(&recs, Stage::PullAckReceived), 0, "{recs:?}");
}

/// JetStream switched off under a running broker — nats-server does this by itself when its
/// store runs out of space, and keeps it off until a reload or restart (RELIABILITY.md,
/// finding 10). An upload meanwhile fails with an error that says JetStream is not
/// answering and what the operator does — not a timeout, not "no leader"; once JetStream is
/// back (a config reload, as an operator would do), the same producer's uploads are stored
/// and delivered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_while_jetstream_is_off_say_so_and_resume_when_it_is_back() {
    let mut sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    producer.send("orders.eu", "before").await.unwrap();

    sys.server.reload_with_jetstream(false).unwrap();
    // JetStream is off once its API stops answering.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while sys
        .nats
        .request("$JS.API.INFO", bytes::Bytes::new())
        .await
        .is_ok()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "JetStream still answers after the reload; log:\n{}",
            sys.server.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let err = producer
        .send("orders.eu", "while off")
        .await
        .expect_err("nothing can be stored while JetStream is off");
    let text = err.to_string();
    assert_eq!(err.code(), Some(ErrorCode::Unavailable), "{text}");
    assert!(text.contains("JetStream is not answering"), "{text}");
    assert!(text.contains("restart nats-server"), "{text}");
    assert!(!text.contains("no leader"), "{text}");

    sys.server.reload_with_jetstream(true).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let stored = loop {
        match producer.send("orders.eu", "after").await {
            Ok(reply) => break reply,
            Err(e) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "uploads did not resume after JetStream came back: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let consumer = sys.consumer("billing-1").await;
    let mut by_id = sub("g-js-off", "orders.*");
    by_id.message_id = Some(stored.message_id);
    let got = consumer
        .fetch(&by_id, 1, Duration::from_secs(5))
        .await
        .expect("fetch after JetStream is back");
    assert_eq!(
        got.len(),
        1,
        "the upload stored after JetStream came back is delivered"
    );
    assert_eq!(&got[0].payload[..], b"after");
    got[0].ack().await.expect("and acked");
}

/// The SDK's consumer records of a delivery (C6, X1, X2, C7) travel inside its settle: no
/// stage report of their own, the same records in the stage stream. A delivery never settled
/// has its C6 sent as a report once the hold runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deliverys_records_travel_inside_its_settle_without_a_report_of_their_own() {
    use std::sync::atomic::Ordering::Relaxed;
    const N: usize = 12;
    let sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    let mut ids = Vec::new();
    for i in 0..=N {
        let reply = producer
            .send_message(Outgoing::new("inside.x", format!("m{i}")))
            .await
            .unwrap();
        ids.push(reply.message_id);
    }
    // The producer's P4s are in before the consumer starts (the last goes as a report).
    for id in &ids {
        sys.records_for(*id, |r| has_all(r, &[Stage::StoreConfirmed]))
            .await;
    }
    let metrics = sys.broker.as_ref().unwrap().metrics.clone();
    let reports_before = metrics.stage_reports.load(Relaxed);
    let own_before = metrics.own_records.load(Relaxed);

    let consumer = sys.consumer("billing-1").await;
    let mut got = Vec::new();
    while got.len() < N + 1 {
        got.extend(
            consumer
                .fetch(&sub("inside", "inside.*"), (N + 1 - got.len()) as u32, WAIT)
                .await
                .unwrap(),
        );
    }
    let unsettled = got.pop().unwrap();
    for m in got.clone() {
        let outcome = consumer
            .process(m, |_| async { Ok::<(), String>(()) })
            .await
            .unwrap();
        assert_eq!(outcome, Ok(()));
    }
    let want = [
        Stage::PullReceived,
        Stage::ProcessStarted,
        Stage::ProcessFinished,
        Stage::PullAckSent,
        Stage::PullAckReceived,
    ];
    for m in &got {
        let recs = sys.records_for(m.message_id, |r| has_all(r, &want)).await;
        for stage in &want[..4] {
            let of: Vec<&StageRecord> = recs.iter().filter(|r| r.stage == *stage).collect();
            assert_eq!(of.len(), 1, "{stage}: {recs:#?}");
            let r = of[0];
            assert_eq!(r.consumer.as_ref().map(|c| c.as_str()), Some("billing-1"));
            assert_eq!(r.group.as_ref().map(|g| g.as_str()), Some("inside"));
            assert_eq!((r.attempt, r.topic.as_deref()), (Some(1), Some("inside.x")));
            assert_eq!(r.service.as_deref(), Some("billing-1-svc"));
        }
    }
    assert_eq!(
        metrics.own_records.load(Relaxed) - own_before,
        4 * N as u64,
        "C6, X1, X2, C7 of each delivery inside its settle"
    );
    assert_eq!(
        metrics.stage_reports.load(Relaxed),
        reports_before,
        "no stage report was sent for settled deliveries"
    );
    // The delivery not settled: its C6 waits for the hold, then goes as a report.
    let recs = sys
        .records_for(unsettled.message_id, |r| has_all(r, &[Stage::PullReceived]))
        .await;
    assert_eq!(count(&recs, Stage::PullReceived), 1);
    assert!(metrics.stage_reports.load(Relaxed) > reports_before);
    // (Past the test broker's 1 s ack wait by now: not acked.)
    drop(unsettled);
    consumer.close().await.unwrap();
}

/// A settle's reply waits for its stage records to be stored, but never past the client's own
/// timeout, which the SDK sends as `Msgtrail-Timeout-Ms` (RELIABILITY.md, finding 6): with
/// the stage stream gone — what a broker sees while the stream elects a leader — a consumer
/// whose requests time out after 800 ms gets its ack answered ok in time (with the broker's
/// fixed 3 s wait it timed out, retried past the delivery's deadline and could not tell
/// whether the ack was applied), and the C8 is stored once the stream is back. A header that
/// is not a number of milliseconds is refused precisely.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_is_answered_within_the_clients_timeout_while_the_stage_stream_is_away() {
    use msgtrail_core::subjects::STAGE_STREAM;
    let sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    let consumer = msgtrail_client::Consumer::connect_with(
        sys.nats.clone(),
        sys.identity("billing-1"),
        msgtrail_client::ConsumerOptions::default().timeout(Duration::from_millis(800)),
    )
    .await
    .unwrap();
    let reply = producer.send("orders.eu", "x").await.unwrap();
    let js = async_nats::jetstream::new(sys.nats.clone());
    // Every record so far is stored; then the stage stream goes away.
    sys.records_for(reply.message_id, |r| count(r, Stage::Stored) == 1)
        .await;
    let got = consumer
        .fetch(&sub("billing", "orders.*"), 1, WAIT)
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    let config = js
        .get_stream(STAGE_STREAM)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .config
        .clone();
    assert!(js.delete_stream(STAGE_STREAM).await.unwrap().success);
    let started = std::time::Instant::now();
    got[0]
        .ack()
        .await
        .expect("the ack is answered ok before the client's timeout");
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(800),
        "answered after {took:?}, past the client's 800 ms"
    );
    // The stream is back: the broker's writer stores the ack's C8 it kept.
    js.create_stream(config).await.unwrap();
    let recs = sys
        .records_for(reply.message_id, |r| count(r, Stage::PullAckReceived) == 1)
        .await;
    assert_eq!(count(&recs, Stage::PullAckReceived), 1, "{recs:?}");

    // A malformed timeout header: refused as such, before anything else is looked at.
    let mut hs = async_nats::HeaderMap::new();
    hs.insert("Msgtrail-Timeout-Ms", "soon");
    let r = sys
        .nats
        .request_with_headers("msgtrail.v1.settle", hs, "{}".into())
        .await
        .unwrap();
    let headers = r.headers.expect("an error reply has headers");
    assert_eq!(
        headers.get("Msgtrail-Error").map(|v| v.as_str()),
        Some("bad_request")
    );
    let text = headers
        .get("Nats-Service-Error")
        .unwrap()
        .as_str()
        .to_owned();
    assert!(text.contains("Msgtrail-Timeout-Ms"), "{text}");
}

/// A settle retried after its delivery's deadline, for a message JetStream already took from
/// the group (the earlier attempt was applied, its answer lost), is refused `already_settled`
/// — the group is done, nothing to do — not `delivery_expired` ("not applied; delivered
/// again"), which would be false (RELIABILITY.md, finding 8). The message is indeed never
/// delivered again. A late settle of a delivery JetStream still holds stays `delivery_expired`
/// (`a_settle_after_the_ack_wait_is_refused_as_delivery_expired`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_retry_of_an_applied_ack_is_told_the_group_is_done() {
    let sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("billing-1").await;
    let reply = producer.send("orders.eu", "once").await.unwrap();
    let subscription = sub("billing", "orders.*");
    let got = consumer.fetch(&subscription, 1, WAIT).await.unwrap();
    assert_eq!(got.len(), 1);
    got[0].ack().await.unwrap();
    tokio::time::sleep(ACK_WAIT + Duration::from_millis(300)).await;
    let late = got[0].ack().await.unwrap_err();
    assert!(late.is_already_settled(), "{late}");
    assert!(!late.is_delivery_expired(), "{late}");
    assert!(!late.is_transient(), "{late}");
    assert!(late.to_string().contains("already settled"), "{late}");
    // Not delivered again, and the late retry recorded no second C8.
    let again = consumer
        .fetch(&subscription, 1, ACK_WAIT * 2)
        .await
        .unwrap();
    assert!(again.is_empty(), "delivered again: {again:?}");
    let recs = sys.records_for(reply.message_id, |_| true).await;
    assert_eq!(count(&recs, Stage::PullAckReceived), 1, "{recs:?}");
    let metrics = &sys.broker.as_ref().unwrap().metrics;
    assert_eq!(
        metrics
            .settles_already_settled
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(metrics.errors().get("already_settled"), Some(&1));
}
