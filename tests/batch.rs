//! End-to-end tests of the batched message path over raw NATS (no SDK): upload batches with
//! per-message results, settle batches with per-settle results, binary fetch and push, the
//! records that ride along, and the broker's bound on concurrent requests — against a real
//! nats-server and broker.

use async_nats::HeaderMap;
use bytes::Bytes;
use msgtrail_core::frame::{
    DeliveryBatch, ReportedRecord, SettleBatch, SettleEntry, SettleResults, UploadBatch,
    UploadEntry, UploadResult, UploadResults, MAX_BATCH_ENTRIES,
};
use msgtrail_core::headers as h;
use msgtrail_core::subjects as s;
use msgtrail_core::wire::{ChallengeReply, Format, OpenReply, SettleKind, SubscribeReply};
use msgtrail_core::{ErrorCode, MessageId, Role, Stage, StageRecord};
use msgtrail_e2e::TestSystem;
use serde_json::json;
use std::collections::HashSet;
use std::time::Duration;

/// A channel opened by hand, the way any NATS client would.
struct RawChannel {
    nats: async_nats::Client,
    id: String,
}

impl RawChannel {
    async fn open(sys: &TestSystem, name: &str, role: Role) -> RawChannel {
        let nats = async_nats::connect(sys.server.url()).await.unwrap();
        let ident = sys.identity(name);
        let c: ChallengeReply =
            request_json(&nats, s::CHANNEL_CHALLENGE, json!({ "client_id": name })).await;
        let open: OpenReply = request_json(
            &nats,
            s::CHANNEL_OPEN,
            json!({
                "role": role.to_string(),
                "client_id": name,
                "nonce": c.nonce,
                "signature": ident.sign(&c.nonce),
            }),
        )
        .await;
        RawChannel {
            nats,
            id: open.channel,
        }
    }

    /// A request with the channel header; returns the reply (error replies included).
    async fn request(&self, subject: &str, body: Bytes) -> async_nats::Message {
        let mut headers = HeaderMap::new();
        headers.insert(h::CHANNEL, self.id.as_str());
        self.nats
            .request_with_headers(subject.to_owned(), headers, body)
            .await
            .unwrap()
    }

    async fn upload(&self, batch: &UploadBatch) -> UploadResults {
        let reply = self.request(s::UPLOAD_BATCH, batch.encode()).await;
        assert_no_error(&reply);
        UploadResults::decode(&reply.payload).unwrap()
    }

    async fn fetch(&self, group: &str, topic: &str, max: u32) -> DeliveryBatch {
        let body = json!({
            "channel": self.id, "group": group, "topic": topic,
            "max": max, "wait_ms": 2000, "format": "binary",
        });
        let reply = self
            .nats
            .request(s::FETCH, serde_json::to_vec(&body).unwrap().into())
            .await
            .unwrap();
        assert_no_error(&reply);
        DeliveryBatch::decode(&reply.payload).unwrap()
    }

    async fn settle(&self, batch: &SettleBatch) -> SettleResults {
        let reply = self.request(s::SETTLE, batch.encode()).await;
        assert_no_error(&reply);
        SettleResults::decode(&reply.payload).unwrap()
    }
}

async fn request_json<T: serde::de::DeserializeOwned>(
    nats: &async_nats::Client,
    subject: &str,
    body: serde_json::Value,
) -> T {
    let reply = nats
        .request(
            subject.to_owned(),
            serde_json::to_vec(&body).unwrap().into(),
        )
        .await
        .unwrap();
    assert_no_error(&reply);
    serde_json::from_slice(&reply.payload).unwrap()
}

fn error_code(reply: &async_nats::Message) -> Option<String> {
    reply
        .headers
        .as_ref()
        .and_then(|hs| hs.get(h::ERROR))
        .map(|v| v.as_str().to_owned())
}

fn assert_no_error(reply: &async_nats::Message) {
    assert_eq!(error_code(reply), None, "error reply: {:?}", reply.headers);
}

fn entry(request_id: &str, topic: &str, payload: impl Into<Bytes>) -> UploadEntry {
    UploadEntry {
        request_id: request_id.into(),
        topic: topic.into(),
        attempt: 1,
        sent_at: msgtrail_core::time::now_nanos(),
        traceparent: String::new(),
        attrs: vec![],
        payload: payload.into(),
    }
}

/// An ack of the delivery with `token`.
fn ack_entry(token: &str) -> SettleEntry {
    SettleEntry::new(token, SettleKind::Ack)
}

/// A settle batch acking every one of `delivered`.
fn ack_all(delivered: &[msgtrail_core::frame::DeliveredMessage]) -> SettleBatch {
    SettleBatch {
        entries: delivered.iter().map(|m| ack_entry(&m.ack_token)).collect(),
        ..Default::default()
    }
}

fn stored(r: &UploadResult) -> (MessageId, u64, bool, String) {
    match r {
        UploadResult::Stored {
            message_id,
            stream_seq,
            duplicate,
            receipt,
        } => (*message_id, *stream_seq, *duplicate, receipt.clone()),
        UploadResult::Refused(e) => panic!("refused: {e}"),
    }
}

fn refused(r: &UploadResult) -> ErrorCode {
    match r {
        UploadResult::Refused(e) => e.code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn of_stage(recs: &[StageRecord], id: MessageId, stage: Stage) -> usize {
    recs.iter()
        .filter(|r| r.message_id == Some(id) && r.stage == stage)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_message_fails_alone_and_every_result_comes_in_order() {
    let sys = TestSystem::start().await;
    let ch = RawChannel::open(&sys, "shop-2", Role::Producer).await;
    let mut with_attr = entry("ok-2", "orders.us", "two");
    with_attr.attrs = vec![("category".into(), "refund".into())];
    let mut case_twice = entry("bad-attr", "orders.eu", "x");
    case_twice.attrs = vec![("k".into(), "1".into()), ("K".into(), "2".into())];
    let mut zero_attempt = entry("bad-attempt", "orders.eu", "x");
    zero_attempt.attempt = 0;
    let batch = UploadBatch {
        entries: vec![
            entry("ok-1", "orders.eu", "one"),
            entry("bad-topic", "orders..eu", "x"),
            with_attr,
            entry("not-mine", "payments.eu", "x"),
            entry("bad id!", "orders.eu", "x"),
            case_twice,
            entry("too-big", "orders.eu", vec![0u8; 512 * 1024 + 1]),
            zero_attempt,
            entry("empty", "orders.eu", Bytes::new()),
        ],
        reports: vec![],
        ..Default::default()
    };
    let res = ch.upload(&batch).await;
    assert_eq!(res.results.len(), batch.entries.len());
    let (first, seq1, dup1, receipt1) = stored(&res.results[0]);
    assert!(!dup1 && !receipt1.is_empty());
    assert_eq!(refused(&res.results[1]), ErrorCode::InvalidTopic);
    let (second, seq2, ..) = stored(&res.results[2]);
    assert_eq!(refused(&res.results[3]), ErrorCode::NotPermitted);
    assert_eq!(refused(&res.results[4]), ErrorCode::InvalidRequestId);
    assert_eq!(refused(&res.results[5]), ErrorCode::InvalidAttribute);
    assert_eq!(refused(&res.results[6]), ErrorCode::PayloadTooLarge);
    assert_eq!(refused(&res.results[7]), ErrorCode::BadRequest);
    let (empty, ..) = stored(&res.results[8]);
    assert_ne!(first, second);
    assert!(seq2 > seq1);

    // Exactly the three good messages are in the stream, in order, payloads intact.
    let consumer = RawChannel::open(&sys, "billing-1", Role::Consumer).await;
    let got = consumer.fetch("billing", "orders.*", 10).await;
    let ids: Vec<MessageId> = got.messages.iter().map(|m| m.message_id).collect();
    assert_eq!(ids, vec![first, second, empty]);
    assert_eq!(&got.messages[0].payload[..], b"one");
    assert_eq!(
        got.messages[1].attributes,
        vec![("category".to_owned(), "refund".to_owned())]
    );
    assert!(got.messages[2].payload.is_empty());

    // P1 rode in the entries: the broker wrote it, as it wrote P2/P3 and the refusals' P2.
    let recs = sys
        .records_for(first, |r| r.iter().any(|r| r.stage == Stage::Stored))
        .await;
    assert_eq!(of_stage(&recs, first, Stage::UploadReceived), 1);
    let all = sys.stage_records().await;
    let p1s: Vec<&StageRecord> = all
        .iter()
        .filter(|r| r.stage == Stage::UploadSent)
        .collect();
    assert!(p1s.iter().any(
        |r| r.request_id.as_ref().map(|x| x.as_str()) == Some("ok-1")
            && r.producer.as_ref().map(|p| p.as_str()) == Some("shop-2")
            && r.at == batch.entries[0].sent_at
    ));
    let refusals = all
        .iter()
        .filter(|r| r.outcome.as_deref() == Some("refused"))
        .count();
    assert!(
        refusals >= 5,
        "refused uploads with a valid request id are recorded: {refusals}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_inside_a_batch_and_across_batches_are_stored_once() {
    let sys = TestSystem::start().await;
    let ch = RawChannel::open(&sys, "shop", Role::Producer).await;
    let batch = UploadBatch {
        entries: vec![
            entry("order-1", "orders.eu", "a"),
            entry("order-1", "orders.eu", "a"),
            entry("order-2", "orders.eu", "b"),
        ],
        reports: vec![],
        ..Default::default()
    };
    let res = ch.upload(&batch).await;
    let (a, seq_a, dup_a, receipt_a) = stored(&res.results[0]);
    let (a2, seq_a2, dup_a2, receipt_a2) = stored(&res.results[1]);
    assert_eq!((a, seq_a, receipt_a.clone()), (a2, seq_a2, receipt_a2));
    assert!(!dup_a && dup_a2, "the second copy is the duplicate");
    let (b, ..) = stored(&res.results[2]);

    let again = ch
        .upload(&UploadBatch {
            entries: vec![
                entry("order-2", "orders.eu", "b"),
                entry("order-3", "orders.eu", "c"),
            ],
            reports: vec![],
            ..Default::default()
        })
        .await;
    let (b2, _, dup_b2, _) = stored(&again.results[0]);
    assert_eq!(b2, b);
    assert!(dup_b2);
    let (c, seq_c, dup_c, _) = stored(&again.results[1]);
    assert!(!dup_c);
    assert_eq!(seq_c, 3, "three messages stored in all");

    let recs = sys
        .records_for(b, |r| {
            r.iter().filter(|r| r.stage == Stage::Duplicate).count() == 1
        })
        .await;
    assert_eq!(of_stage(&recs, b, Stage::UploadReceived), 1);
    let recs = sys
        .records_for(a, |r| r.iter().any(|r| r.stage == Stage::Duplicate))
        .await;
    assert_eq!(of_stage(&recs, a, Stage::Stored), 1);
    assert_ne!(c, a);
}

/// On nats-server ≥ 2.14 the first attempts of a batch are stored as one fast-ingest batch
/// (one JetStream ack); on older servers with one PubAck each. Either way every message
/// answers with its own stream sequence, and a retry among them is reported as the
/// duplicate it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_attempts_go_as_one_fast_batch_with_their_own_sequences() {
    use std::sync::atomic::Ordering::Relaxed;
    let sys = TestSystem::start().await;
    let ch = RawChannel::open(&sys, "shop", Role::Producer).await;
    let fast = msgtrail_nats::fast_ingest::server_supports(&sys.nats.server_info().version);
    let res = ch
        .upload(&UploadBatch {
            entries: (0..20)
                .map(|i| entry(&format!("fast-{i}"), "orders.eu", format!("p{i}")))
                .collect(),
            ..Default::default()
        })
        .await;
    let metrics = &sys.broker.as_ref().unwrap().metrics;
    assert_eq!(metrics.fast_batches.load(Relaxed), u64::from(fast));
    assert_eq!(metrics.fast_batch_fallbacks.load(Relaxed), 0);
    let js = async_nats::jetstream::new(sys.nats.clone());
    let stream = js.get_stream(s::MESSAGE_STREAM).await.unwrap();
    let mut firsts = Vec::new();
    for r in &res.results {
        let (id, seq, dup, _) = stored(r);
        assert!(!dup);
        let m = stream.direct_get(seq).await.unwrap();
        assert_eq!(
            m.headers.get(h::MESSAGE_ID).unwrap().as_str(),
            id.to_string()
        );
        firsts.push((id, seq));
    }
    // A retry between two new messages: reported with the original's ID and sequence.
    let mut retry = entry("fast-3", "orders.eu", "p3");
    retry.attempt = 2;
    let res = ch
        .upload(&UploadBatch {
            entries: vec![
                entry("fast-20", "orders.eu", "p20"),
                retry,
                entry("fast-21", "orders.eu", "p21"),
            ],
            ..Default::default()
        })
        .await;
    let (_, seq20, dup20, _) = stored(&res.results[0]);
    let (id3, seq3, dup3, _) = stored(&res.results[1]);
    let (_, seq21, dup21, _) = stored(&res.results[2]);
    assert!(!dup20 && dup3 && !dup21);
    assert_eq!((id3, seq3), firsts[3]);
    assert_eq!((seq20, seq21), (21, 22));
    assert_eq!(metrics.fast_batches.load(Relaxed), 2 * u64::from(fast));
    // A first attempt that repeats a request ID (no retry says so) is still not stored
    // twice: the fast batch ends before it and it is published again, reported a duplicate.
    let res = ch
        .upload(&UploadBatch {
            entries: vec![
                entry("fast-22", "orders.eu", "p22"),
                entry("fast-5", "orders.eu", "p5"),
                entry("fast-23", "orders.eu", "p23"),
            ],
            ..Default::default()
        })
        .await;
    let (id5, seq5, dup5, _) = stored(&res.results[1]);
    assert!(dup5);
    assert_eq!((id5, seq5), firsts[5]);
    assert_eq!(stored(&res.results[2]).1, 24);
    assert_eq!(stream.clone().info().await.unwrap().state.messages, 24);
}

/// A settle batch is confirmed with one double ack per JetStream consumer (the others are
/// plain acks, which JetStream processes before it): when the reply says ok, JetStream has
/// processed every ack of the batch — none is pending any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_batch_answered_ok_is_processed_by_jetstream_whole() {
    use futures::StreamExt;
    let sys = TestSystem::start().await;
    let ch = RawChannel::open(&sys, "shop", Role::Producer).await;
    ch.upload(&UploadBatch {
        entries: (0..30)
            .map(|i| entry(&format!("s-{i}"), "orders.eu", "x"))
            .collect(),
        ..Default::default()
    })
    .await;
    let consumer = RawChannel::open(&sys, "billing-1", Role::Consumer).await;
    let mut delivered = Vec::new();
    while delivered.len() < 30 {
        delivered.extend(consumer.fetch("billing", "orders.*", 30).await.messages);
    }
    let res = consumer.settle(&ack_all(&delivered)).await;
    assert!(res.results.iter().all(Option::is_none), "{:?}", res.results);
    let js = async_nats::jetstream::new(sys.nats.clone());
    let stream = js.get_stream(s::MESSAGE_STREAM).await.unwrap();
    let mut names = stream.consumer_names();
    let mut checked = 0;
    while let Some(name) = names.next().await {
        let name = name.unwrap();
        let mut c: async_nats::jetstream::consumer::PullConsumer =
            stream.get_consumer(&name).await.unwrap();
        let info = c.info().await.unwrap();
        if info.delivered.stream_sequence > 0 {
            assert_eq!(info.num_ack_pending, 0, "consumer {name}");
            assert_eq!(info.ack_floor.stream_sequence, 30, "consumer {name}");
            checked += 1;
        }
    }
    assert_eq!(checked, 1, "one group consumer delivered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_beyond_the_limits_are_refused_precisely() {
    let sys = TestSystem::start().await;
    let ch = RawChannel::open(&sys, "shop", Role::Producer).await;
    // A frame claiming more messages than a batch may hold: the whole request is refused.
    let mut body = b"MTU\x01".to_vec();
    body.extend_from_slice(&((MAX_BATCH_ENTRIES + 1) as u16).to_be_bytes());
    let reply = ch.request(s::UPLOAD_BATCH, body.into()).await;
    assert_eq!(error_code(&reply).as_deref(), Some("bad_request"));
    // A truncated frame names where it stopped.
    let good = UploadBatch {
        entries: vec![entry("r1", "orders.eu", "x")],
        reports: vec![],
        ..Default::default()
    }
    .encode();
    let reply = ch
        .request(s::UPLOAD_BATCH, good.slice(..good.len() - 3))
        .await;
    assert_eq!(error_code(&reply).as_deref(), Some("bad_request"));
    let text = reply
        .headers
        .unwrap()
        .get(h::NATS_SERVICE_ERROR)
        .unwrap()
        .to_string();
    assert!(text.contains("at byte"), "{text}");
    // A consumer channel may not upload; an unknown channel is named.
    let consumer = RawChannel::open(&sys, "billing-1", Role::Consumer).await;
    let reply = consumer.request(s::UPLOAD_BATCH, good.clone()).await;
    assert_eq!(error_code(&reply).as_deref(), Some("not_permitted"));
    let stranger = RawChannel {
        nats: ch.nats.clone(),
        id: "nope".into(),
    };
    let reply = stranger.request(s::UPLOAD_BATCH, good).await;
    assert_eq!(error_code(&reply).as_deref(), Some("unknown_channel"));
    // Nothing of it was stored.
    let js = async_nats::jetstream::new(sys.nats.clone());
    let mut stream = js
        .get_stream(msgtrail_core::subjects::MESSAGE_STREAM)
        .await
        .unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_batches_mix_ack_nack_term_and_a_forged_token_fails_alone() {
    let sys = TestSystem::start().await;
    let producer = RawChannel::open(&sys, "shop", Role::Producer).await;
    let res = producer
        .upload(&UploadBatch {
            entries: (0..3)
                .map(|i| entry(&format!("m{i}"), "jobs.x", "p"))
                .collect(),
            reports: vec![],
            ..Default::default()
        })
        .await;
    let ids: Vec<MessageId> = res.results.iter().map(|r| stored(r).0).collect();
    let consumer = RawChannel::open(&sys, "billing-1", Role::Consumer).await;
    let got = consumer.fetch("workers", "jobs.*", 10).await;
    assert_eq!(got.messages.len(), 3);
    let tok = |i: usize| got.messages[i].ack_token.clone();
    // A token of another consumer's delivery.
    let other = RawChannel::open(&sys, "billing-2", Role::Consumer).await;
    let mut forged = tok(0);
    forged.push('x');
    // C6/X1/X2/C7 of the acked delivery ride along.
    let at = msgtrail_core::time::now_nanos();
    let reports = [
        Stage::PullReceived,
        Stage::ProcessStarted,
        Stage::ProcessFinished,
        Stage::PullAckSent,
    ]
    .into_iter()
    .enumerate()
    .map(|(i, stage)| {
        let mut r = StageRecord::at(stage, at + i as u64);
        if stage == Stage::ProcessFinished {
            r.outcome = Some("ok".into());
        }
        ReportedRecord {
            record: r,
            token: tok(0),
        }
    })
    .collect();
    let results = consumer
        .settle(&SettleBatch {
            entries: vec![
                ack_entry(&tok(0)),
                ack_entry(&forged),
                SettleEntry {
                    delay_ms: Some(0),
                    reason: "later".into(),
                    ..SettleEntry::new(tok(1), SettleKind::Nack)
                },
                SettleEntry {
                    reason: "poison".into(),
                    ..SettleEntry::new(tok(2), SettleKind::Term)
                },
            ],
            reports,
            ..Default::default()
        })
        .await;
    assert_eq!(results.results.len(), 4);
    assert_eq!(results.results[0], None);
    assert_eq!(
        results.results[1].as_ref().map(|e| e.code),
        Some(ErrorCode::BadAckToken)
    );
    assert_eq!(results.results[2], None);
    assert_eq!(results.results[3], None);
    assert_eq!(results.reports.accepted, 4);
    assert_eq!(results.reports.error, None);
    // Another consumer cannot settle these deliveries.
    let stolen = other
        .settle(&SettleBatch {
            entries: vec![ack_entry(&tok(1))],
            reports: vec![],
            ..Default::default()
        })
        .await;
    assert_eq!(
        stolen.results[0].as_ref().map(|e| e.code),
        Some(ErrorCode::BadAckToken)
    );

    // The nacked one comes back (attempt 2); the acked and termed ones do not.
    let again = consumer.fetch("workers", "jobs.*", 10).await;
    assert_eq!(again.messages.len(), 1);
    assert_eq!(again.messages[0].message_id, ids[1]);
    assert_eq!(again.messages[0].delivery_attempt, 2);

    let recs = sys
        .records_for(ids[0], |r| {
            [
                Stage::PullReceived,
                Stage::ProcessStarted,
                Stage::ProcessFinished,
                Stage::PullAckSent,
                Stage::PullAckReceived,
            ]
            .iter()
            .all(|s| r.iter().any(|x| x.stage == *s))
        })
        .await;
    let c7 = recs.iter().find(|r| r.stage == Stage::PullAckSent).unwrap();
    assert_eq!(c7.consumer.as_ref().unwrap().as_str(), "billing-1");
    assert_eq!(c7.group.as_ref().unwrap().as_str(), "workers");
    let dead = sys
        .records_for(ids[2], |r| {
            r.iter()
                .any(|x| x.outcome.as_deref() == Some("dead_letter"))
        })
        .await;
    assert!(dead
        .iter()
        .any(|r| r.detail.as_deref().is_some_and(|d| d.contains("poison"))));

    // Records that do not belong to the channel are refused whole, and the settles of the
    // same request still go through.
    let foreign = vec![ReportedRecord {
        record: StageRecord::at(Stage::PullReceived, at),
        token: String::new(),
    }];
    let res = consumer
        .settle(&SettleBatch {
            entries: vec![ack_entry(&again.messages[0].ack_token)],
            reports: foreign,
            ..Default::default()
        })
        .await;
    assert_eq!(res.results, vec![None]);
    assert_eq!(res.reports.accepted, 0);
    assert_eq!(
        res.reports.error.map(|e| e.code),
        Some(ErrorCode::RecordNotOwned)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_fetch_and_push_carry_empty_and_max_size_payloads() {
    let sys = TestSystem::start().await;
    let producer = RawChannel::open(&sys, "shop", Role::Producer).await;
    let max = sys.config.max_payload;
    let big: Bytes = (0..max)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into();
    let res = producer
        .upload(&UploadBatch {
            entries: vec![
                entry("e", "bin.a", Bytes::new()),
                entry("b", "bin.a", big.clone()),
            ],
            reports: vec![],
            ..Default::default()
        })
        .await;
    let ids: Vec<MessageId> = res.results.iter().map(|r| stored(r).0).collect();

    let consumer = RawChannel::open(&sys, "billing-1", Role::Consumer).await;
    let got = consumer.fetch("pullers", "bin.*", 10).await;
    assert!(!got.no_matching_message);
    assert_eq!(got.messages.len(), 2);
    assert!(got.messages[0].payload.is_empty());
    assert_eq!(got.messages[1].payload, big);
    assert_eq!(got.messages[1].producer, "shop");
    assert_eq!(got.messages[1].group, "pullers");
    let acked = consumer.settle(&ack_all(&got.messages)).await;
    assert_eq!(acked.results, vec![None, None]);
    let none = consumer.fetch("pullers", "bin.*", 10).await;
    assert!(none.no_matching_message && none.messages.is_empty());

    // Push, binary: a frame per batch on the consumer's inbox.
    let inbox = consumer.nats.new_inbox();
    let mut pushed = consumer.nats.subscribe(inbox.clone()).await.unwrap();
    let _: SubscribeReply = request_json(
        &consumer.nats,
        s::SUBSCRIBE,
        json!({
            "channel": consumer.id, "group": "pushed", "topic": "bin.*",
            "deliver_subject": inbox, "format": "binary",
        }),
    )
    .await;
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while seen.len() < 2 {
        let m = tokio::time::timeout_at(deadline, futures::StreamExt::next(&mut pushed))
            .await
            .expect("pushes arrive")
            .unwrap();
        assert!(m.headers.is_none(), "binary pushes carry no headers");
        seen.extend(DeliveryBatch::decode(&m.payload).unwrap().messages);
    }
    assert_eq!(seen.iter().map(|m| m.message_id).collect::<Vec<_>>(), ids);
    assert!(seen[0].payload.is_empty());
    assert_eq!(seen[1].payload, big);
    let settled = consumer.settle(&ack_all(&seen)).await;
    assert_eq!(settled.results, vec![None, None]);
    let recs = sys
        .records_for(ids[1], |r| {
            r.iter().any(|x| x.stage == Stage::PushAckReceived)
        })
        .await;
    assert_eq!(of_stage(&recs, ids[1], Stage::PushSent), 1);
    let _ = Format::Binary;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_concurrency_bound_slows_requests_and_loses_none() {
    // Two requests at a time for the whole broker, 200 batches of 5 at once.
    let sys = TestSystem::start_with(|c| c.max_concurrent_requests = 2).await;
    let ch = std::sync::Arc::new(RawChannel::open(&sys, "shop", Role::Producer).await);
    let tasks: Vec<_> = (0..200)
        .map(|b| {
            let ch = ch.clone();
            tokio::spawn(async move {
                let batch = UploadBatch {
                    entries: (0..5)
                        .map(|i| entry(&format!("b{b}-{i}"), "load.x", "p"))
                        .collect(),
                    reports: vec![],
                    ..Default::default()
                };
                ch.upload(&batch).await
            })
        })
        .collect();
    let mut ids = HashSet::new();
    for t in tasks {
        for r in t.await.unwrap().results {
            let (id, _, dup, _) = stored(&r);
            assert!(!dup);
            assert!(ids.insert(id));
        }
    }
    assert_eq!(ids.len(), 1000);
    let peak = sys
        .broker
        .as_ref()
        .unwrap()
        .metrics
        .peak_concurrent_requests
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        peak, 2,
        "the broker handled at most 2 requests at once, and was saturated"
    );
    let js = async_nats::jetstream::new(sys.nats.clone());
    let mut stream = js
        .get_stream(msgtrail_core::subjects::MESSAGE_STREAM)
        .await
        .unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 1000);
}

/// Records that ride along a settle batch give exactly the trajectory that the same records
/// sent as a separate (JSON) stage report give.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ride_along_records_give_the_same_trajectory_as_separate_reports() {
    use msgtrail_core::trajectory::{AssembleOptions, Trajectory};
    let sys = TestSystem::start().await;
    let producer = RawChannel::open(&sys, "shop", Role::Producer).await;
    let res = producer
        .upload(&UploadBatch {
            entries: vec![
                entry("ride", "same.x", "a"),
                entry("apart", "same.x", "b"),
                entry("inside", "same.x", "c"),
            ],
            ..Default::default()
        })
        .await;
    let (a, b) = (stored(&res.results[0]).0, stored(&res.results[1]).0);
    let c = stored(&res.results[2]).0;
    let consumer = RawChannel::open(&sys, "billing-1", Role::Consumer).await;
    let got = consumer.fetch("same", "same.*", 10).await;
    let token_of = |id: MessageId| {
        got.messages
            .iter()
            .find(|m| m.message_id == id)
            .unwrap()
            .ack_token
            .clone()
    };
    let t0 = msgtrail_core::time::now_nanos();
    let consumer_records = |base: u64| {
        [
            (Stage::PullReceived, None),
            (Stage::ProcessStarted, None),
            (Stage::ProcessFinished, Some("ok")),
            (Stage::PullAckSent, Some("ack")),
        ]
        .into_iter()
        .enumerate()
        .map(|(i, (stage, outcome))| {
            let mut r = StageRecord::at(stage, base + i as u64 * 1000);
            r.outcome = outcome.map(Into::into);
            r
        })
        .collect::<Vec<_>>()
    };
    // a: the records ride along its settle.
    let ride = consumer
        .settle(&SettleBatch {
            entries: vec![ack_entry(&token_of(a))],
            reports: consumer_records(t0)
                .into_iter()
                .map(|record| ReportedRecord {
                    record,
                    token: token_of(a),
                })
                .collect(),
            ..Default::default()
        })
        .await;
    assert_eq!((ride.results, ride.reports.accepted), (vec![None], 4));
    // b: the same records as a separate JSON report, then a settle without any.
    let lines: Vec<String> = consumer_records(t0)
        .into_iter()
        .map(|r| {
            let mut v = serde_json::to_value(&r).unwrap();
            v["token"] = token_of(b).into();
            v.to_string()
        })
        .collect();
    let reply = consumer
        .request(s::STAGE_REPORT, lines.join("\n").into())
        .await;
    assert_no_error(&reply);
    let apart = consumer
        .settle(&SettleBatch {
            entries: vec![ack_entry(&token_of(b))],
            ..Default::default()
        })
        .await;
    assert_eq!(apart.results, vec![None]);
    // c: the records inside its own settle (version 2), no token of their own.
    let own = SettleBatch {
        entries: vec![SettleEntry {
            records: consumer_records(t0),
            ..ack_entry(&token_of(c))
        }],
        ..Default::default()
    };
    assert_eq!(own.encode()[3], 2, "a version 2 frame");
    let inside = consumer.settle(&own).await;
    assert_eq!((inside.results, inside.reports.accepted), (vec![None], 4));

    let done = |r: &[StageRecord]| {
        [
            Stage::PullReceived,
            Stage::ProcessFinished,
            Stage::PullAckSent,
            Stage::PullAckReceived,
        ]
        .iter()
        .all(|s| r.iter().any(|x| x.stage == *s))
    };
    let recs_a = sys.records_for(a, done).await;
    let recs_b = sys.records_for(b, done).await;
    let recs_c = sys.records_for(c, done).await;
    // The consumer's records are the same but for what names the message.
    let consumer_side = |recs: &[StageRecord]| -> Vec<StageRecord> {
        let mut out: Vec<StageRecord> = recs
            .iter()
            .filter(|r| {
                matches!(
                    r.stage,
                    Stage::PullReceived
                        | Stage::ProcessStarted
                        | Stage::ProcessFinished
                        | Stage::PullAckSent
                )
            })
            .cloned()
            .map(|mut r| {
                r.message_id = None;
                r.stream_seq = None;
                r
            })
            .collect();
        out.sort_by_key(|r| r.at);
        out
    };
    assert_eq!(consumer_side(&recs_a), consumer_side(&recs_b));
    assert_eq!(consumer_side(&recs_a), consumer_side(&recs_c));
    assert!(
        recs_c
            .iter()
            .filter(|r| r.stage == Stage::ProcessStarted)
            .all(|r| r.message_id == Some(c)
                && r.group.as_ref().map(|g| g.as_str()) == Some("same")
                && r.attempt == Some(1)
                && r.consumer.as_ref().map(|g| g.as_str()) == Some("billing-1")),
        "the broker fills in what the settle's token names: {recs_c:#?}"
    );
    // And so are the trajectories' shapes: hops, statuses, events, state.
    let shape = |recs: Vec<StageRecord>| {
        let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
        let hops: Vec<(String, String, Vec<&'static str>)> = t
            .hops
            .iter()
            .map(|h| {
                (
                    h.key.clone(),
                    format!("{:?}", h.status),
                    h.events.iter().map(|r| r.stage.code()).collect(),
                )
            })
            .collect();
        (t.state, hops)
    };
    let shape_a = shape(recs_a);
    assert_eq!(shape_a, shape(recs_b));
    assert_eq!(shape_a, shape(recs_c));
}

/// A settle's own records are checked against its token per settle: a forged token refuses
/// its settle and its records, a record that contradicts its token (or is not a delivery's
/// stage, or of the other mode) refuses that settle's records only — the settle is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settles_own_records_are_checked_against_its_token_per_settle() {
    let sys = TestSystem::start().await;
    let producer = RawChannel::open(&sys, "shop", Role::Producer).await;
    let res = producer
        .upload(&UploadBatch {
            entries: (0..4)
                .map(|i| entry(&format!("own-{i}"), "own.x", "p"))
                .collect(),
            ..Default::default()
        })
        .await;
    let ids: Vec<MessageId> = res.results.iter().map(|r| stored(r).0).collect();
    let consumer = RawChannel::open(&sys, "billing-1", Role::Consumer).await;
    let got = consumer.fetch("own", "own.*", 10).await;
    assert_eq!(got.messages.len(), 4);
    let tok = |i: usize| {
        got.messages
            .iter()
            .find(|m| m.message_id == ids[i])
            .unwrap()
            .ack_token
            .clone()
    };
    let t0 = msgtrail_core::time::now_nanos();
    let rec = |stage: Stage, dt: u64| StageRecord::at(stage, t0 + dt);
    let with = |token: String, records: Vec<StageRecord>| SettleEntry {
        records,
        ..ack_entry(&token)
    };
    let (body, tag) = tok(3)
        .rsplit_once('.')
        .map(|(b, t)| (b.to_owned(), t.to_owned()))
        .unwrap();
    let forged = format!(
        "{body}.{}",
        if tag.starts_with('A') { "B" } else { "A" }.repeat(tag.len())
    );
    let mut other_group = rec(Stage::ProcessStarted, 2);
    other_group.group = Some(msgtrail_core::GroupId::new("elsewhere").unwrap());
    let reply = consumer
        .settle(&SettleBatch {
            entries: vec![
                // 0: fine — two records.
                with(
                    tok(0),
                    vec![rec(Stage::PullReceived, 1), rec(Stage::PullAckSent, 2)],
                ),
                // 1: one record names another group: this settle's records are refused.
                with(tok(1), vec![rec(Stage::PullReceived, 1), other_group]),
                // 2: a push stage for a pull delivery, and a producer stage: refused.
                with(tok(2), vec![rec(Stage::PushReceived, 1)]),
                // 3 (forged): refused with its records.
                with(forged, vec![rec(Stage::PullReceived, 1)]),
                // 3 (real), one producer stage: refused records, settle applied.
                with(tok(3), vec![rec(Stage::StoreConfirmed, 1)]),
            ],
            ..Default::default()
        })
        .await;
    assert_eq!(reply.results.len(), 5);
    assert_eq!(reply.results[0], None);
    assert_eq!(reply.results[1], None);
    assert_eq!(reply.results[2], None);
    assert_eq!(
        reply.results[3].as_ref().map(|e| e.code),
        Some(ErrorCode::BadAckToken)
    );
    assert_eq!(reply.results[4], None);
    assert_eq!(
        (reply.reports.accepted, reply.reports.error.clone()),
        (2, None),
        "only the first settle's records: {reply:?}"
    );
    // Every message was acked: its C8 is there; only message 0 has consumer records.
    for (i, id) in ids.iter().enumerate() {
        let recs = sys
            .records_for(*id, |r| r.iter().any(|x| x.stage == Stage::PullAckReceived))
            .await;
        let consumer_side = recs
            .iter()
            .filter(|r| {
                matches!(
                    r.stage,
                    Stage::PullReceived
                        | Stage::ProcessStarted
                        | Stage::PullAckSent
                        | Stage::PushReceived
                        | Stage::StoreConfirmed
                )
            })
            .count();
        assert_eq!(
            consumer_side,
            if i == 0 { 2 } else { 0 },
            "message {i}: {recs:#?}"
        );
    }
    let metrics = &sys.broker.as_ref().unwrap().metrics;
    assert_eq!(
        metrics
            .own_records
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
}

/// The stored headers of `seq` that a broker wrote (JetStream's own direct-get headers left
/// out): name and value per entry.
async fn stored_headers(sys: &TestSystem, seq: u64) -> Vec<(String, String)> {
    let js = async_nats::jetstream::new(sys.nats.clone());
    let stream = js.get_stream(s::MESSAGE_STREAM).await.unwrap();
    let m = stream.direct_get(seq).await.unwrap();
    let mut out = Vec::new();
    for (name, values) in m.headers.iter() {
        let name: &str = name.as_ref();
        let jetstream_own = name.starts_with("Nats-") && name != h::NATS_MSG_ID;
        if !jetstream_own {
            out.extend(
                values
                    .iter()
                    .map(|v| (name.to_owned(), v.as_str().to_owned())),
            );
        }
    }
    out
}

/// A stored message carries the operator's headers (`Nats-Msg-Id`, `Msgtrail-Message-Id`,
/// attributes, `traceparent`) and one `Msgtrail-Stored` for what only msgtrail reads — with
/// the store evidence when stages are recorded — and is delivered as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_message_carries_one_msgtrail_stored_header() {
    const TP: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    for record in [true, false] {
        let sys = TestSystem::start_with(|c| c.record_stages = record).await;
        let ch = RawChannel::open(&sys, "shop", Role::Producer).await;
        let mut e = entry("ord-1:x", "orders.eu", "p");
        e.attempt = 3;
        e.traceparent = TP.into();
        e.attrs = vec![("category".into(), "refund".into())];
        let res = ch
            .upload(&UploadBatch {
                entries: vec![e],
                ..Default::default()
            })
            .await;
        let (id, seq, _, _) = stored(&res.results[0]);
        let hs = stored_headers(&sys, seq).await;
        let mut names: Vec<&str> = hs.iter().map(|(n, _)| n.as_str()).collect();
        names.sort();
        println!(
            "record_stages={record}: {} header entries: {names:?}",
            hs.len()
        );
        assert_eq!(
            names,
            [
                "Msgtrail-Attr-category",
                h::MESSAGE_ID,
                h::STORED,
                h::NATS_MSG_ID,
                h::TRACEPARENT
            ],
            "record_stages={record}"
        );
        let get = |n: &str| hs.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
        assert_eq!(get(h::NATS_MSG_ID), Some("shop:ord-1:x"));
        assert_eq!(get(h::MESSAGE_ID), Some(id.to_string().as_str()));
        let f = msgtrail_core::stored::read(get).unwrap();
        assert_eq!(
            (f.request_id, f.producer, f.producer_service.as_deref()),
            (Some("ord-1:x"), Some("shop"), Some("shop"))
        );
        match f.evidence {
            Some(ev) => {
                assert!(record);
                assert_eq!(ev.attempt, Some(3));
                assert_eq!(
                    ev.broker_service.as_deref(),
                    Some(sys.config.service_name.as_str())
                );
                assert!(ev.received_at > 0);
            }
            None => assert!(!record, "store evidence with recording on"),
        }
        // Delivered as before: producer, topic and attributes.
        let consumer = RawChannel::open(&sys, "billing-1", Role::Consumer).await;
        let got = consumer.fetch("billing", "orders.eu", 1).await;
        assert_eq!(got.messages.len(), 1);
        let m = &got.messages[0];
        assert_eq!((m.message_id, m.producer.as_str()), (id, "shop"));
        assert_eq!(m.topic, "orders.eu");
        assert_eq!(m.attributes, vec![("category".into(), "refund".into())]);
    }
}
