//! The SDK's batched message path against a scripted broker on a real NATS server: batching,
//! per-message results and retries, channel reopening, binary deliveries, batched settles and
//! ride-along stage reports. (The real broker is exercised by the workspace's tests/ crate.)

use bytes::Bytes;
use futures::StreamExt;
use msgtrail_client::{
    AckKind, ClientError, Consumer, ConsumerOptions, HookEvent, HookKind, Identity, Outgoing,
    Producer, ProducerOptions, PushOptions,
};
use msgtrail_core::frame::{
    self, DeliveredMessage, DeliveryBatch, ReportedRecord, ReportsOutcome, SettleBatch,
    SettleResults, UploadBatch, UploadResult, UploadResults,
};
use msgtrail_core::headers as h;
use msgtrail_core::subjects as s;
use msgtrail_core::wire::{FetchRequest, Format, SubscribeRequest, Subscription};
use msgtrail_core::{ClientId, ErrorCode, MessageId, RequestId, Stage, WireError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the scripted broker saw.
#[derive(Debug, Default)]
struct Seen {
    /// Entries per upload batch.
    upload_batches: Vec<usize>,
    /// (request ID, attempt, sent_at) of every upload entry.
    entries: Vec<(String, u32, u64)>,
    /// Settles per settle batch.
    settle_batches: Vec<usize>,
    /// (token, kind, delay in ms, reason) of every settle.
    settles: Vec<(String, &'static str, Option<u64>, String)>,
    /// Records accepted (riding along or reported alone).
    records: Vec<ReportedRecord>,
    /// Records reported alone on the stage subject.
    stage_reports: usize,
    /// Records that came inside their delivery's settle.
    own_records: usize,
    /// Channel IDs that sent uploads.
    channels: Vec<String>,
    /// Fetch and subscribe requests asked for binary.
    binary_asked: Vec<bool>,
}

#[derive(Debug, Default)]
struct Script {
    seen: Mutex<Seen>,
    /// Channels opened so far.
    opened: Mutex<u32>,
    /// Answer the next upload with `unknown_channel`.
    forget_channel: Mutex<bool>,
}

fn error_reply(code: ErrorCode, message: &str) -> async_nats::HeaderMap {
    let mut hs = async_nats::HeaderMap::new();
    hs.insert(
        h::NATS_SERVICE_ERROR_CODE,
        code.status().to_string().as_str(),
    );
    hs.insert(h::NATS_SERVICE_ERROR, format!("{code}: {message}").as_str());
    hs.insert(h::ERROR, code.as_str());
    hs
}

fn delivery(token: &str, payload: &'static [u8]) -> DeliveredMessage {
    DeliveredMessage {
        message_id: MessageId::new(),
        topic: "orders.eu".into(),
        producer: "shop".into(),
        group: "billing".into(),
        delivery_attempt: 1,
        stream_seq: 1,
        ack_token: token.into(),
        attributes: vec![("category".into(), "refund".into())],
        payload: Bytes::from_static(payload),
    }
}

/// Records are refused whole when one carries the token "bad-report", or when there are more
/// than the broker takes in one request.
fn take_reports(script: &Script, reports: Vec<ReportedRecord>) -> ReportsOutcome {
    assert!(
        reports.len() <= 1000,
        "{} records in one request",
        reports.len()
    );
    if reports.iter().any(|r| r.token == "bad-report") {
        return ReportsOutcome {
            accepted: 0,
            error: Some(WireError::new(ErrorCode::RecordNotOwned, "record 1: no")),
        };
    }
    let n = reports.len() as u32;
    script.seen.lock().unwrap().records.extend(reports);
    ReportsOutcome {
        accepted: n,
        error: None,
    }
}

async fn serve(client: async_nats::Client, script: Arc<Script>) {
    let mut sub = client.subscribe("msgtrail.v1.>").await.unwrap();
    while let Some(m) = sub.next().await {
        let client = client.clone();
        let script = script.clone();
        tokio::spawn(async move {
            let Some(reply) = m.reply.clone() else { return };
            let channel = m
                .headers
                .as_ref()
                .and_then(|hs| hs.get(h::CHANNEL))
                .map(|v| v.as_str().to_owned());
            let body: Result<Bytes, async_nats::HeaderMap> = match m.subject.as_str() {
                s::CHANNEL_CHALLENGE => Ok(r#"{"nonce":"n"}"#.into()),
                s::CHANNEL_OPEN => {
                    let mut n = script.opened.lock().unwrap();
                    *n += 1;
                    Ok(format!(r#"{{"channel":"ch-{n}","ttl_ms":60000,"topics":[">"]}}"#).into())
                }
                s::CHANNEL_KEEPALIVE => Ok(r#"{"ttl_ms":60000}"#.into()),
                s::CHANNEL_CLOSE | s::UNSUBSCRIBE => Ok(r#"{"ok":true}"#.into()),
                s::UPLOAD_BATCH => {
                    let forget = std::mem::take(&mut *script.forget_channel.lock().unwrap());
                    let batch = UploadBatch::decode(&m.payload).unwrap();
                    if forget {
                        Err(error_reply(ErrorCode::UnknownChannel, "expired"))
                    } else if batch
                        .entries
                        .iter()
                        .any(|e| e.request_id.starts_with("slow-") && e.attempt == 1)
                    {
                        return; // no reply: the client times out
                    } else {
                        let mut results = vec![];
                        {
                            let mut seen = script.seen.lock().unwrap();
                            seen.upload_batches.push(batch.entries.len());
                            seen.channels.extend(channel);
                            for e in &batch.entries {
                                seen.entries
                                    .push((e.request_id.clone(), e.attempt, e.sent_at));
                            }
                        }
                        for e in &batch.entries {
                            results.push(if e.topic.starts_with("refuse.") {
                                UploadResult::Refused(WireError::new(
                                    ErrorCode::NotPermitted,
                                    "not yours",
                                ))
                            } else if e.topic == "flaky" && e.attempt == 1 {
                                UploadResult::Refused(WireError::new(
                                    ErrorCode::Unavailable,
                                    "try again",
                                ))
                            } else {
                                UploadResult::Stored {
                                    message_id: MessageId::new(),
                                    stream_seq: 7,
                                    duplicate: false,
                                    receipt: format!("r-{}", e.request_id),
                                }
                            });
                        }
                        let reports = take_reports(&script, batch.reports);
                        Ok(UploadResults { results, reports }.encode())
                    }
                }
                s::FETCH => {
                    let req: FetchRequest = serde_json::from_slice(&m.payload).unwrap();
                    script
                        .seen
                        .lock()
                        .unwrap()
                        .binary_asked
                        .push(req.format == Format::Binary);
                    let batch = if req.subscription.topic == "empty" {
                        DeliveryBatch {
                            no_matching_message: true,
                            messages: vec![],
                        }
                    } else {
                        DeliveryBatch {
                            no_matching_message: false,
                            messages: vec![delivery("t1", b"\x00one"), delivery("t2", b"two")],
                        }
                    };
                    Ok(batch.encode())
                }
                s::SUBSCRIBE => {
                    let req: SubscribeRequest = serde_json::from_slice(&m.payload).unwrap();
                    script
                        .seen
                        .lock()
                        .unwrap()
                        .binary_asked
                        .push(req.format == Format::Binary);
                    let push = DeliveryBatch {
                        no_matching_message: false,
                        messages: vec![
                            delivery("p1", b"a"),
                            delivery("bad-report", b"b"),
                            delivery("p3", b"c"),
                        ],
                    };
                    let subject = req.deliver_subject.clone();
                    let client = client.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        client.publish(subject, push.encode()).await.unwrap();
                    });
                    Ok(r#"{"subscription_id":"sub-1"}"#.into())
                }
                s::SETTLE => {
                    let batch = SettleBatch::decode(&m.payload).unwrap();
                    {
                        let mut seen = script.seen.lock().unwrap();
                        seen.settle_batches.push(batch.entries.len());
                        seen.settles.extend(batch.entries.iter().map(|e| {
                            let kind = e.kind.as_str();
                            (e.token.clone(), kind, e.delay_ms, e.reason.clone())
                        }));
                    }
                    let results = batch
                        .entries
                        .iter()
                        .map(|e| match e.token.as_str() {
                            "forged" => Some(WireError::new(ErrorCode::BadAckToken, "forged")),
                            "expired" => Some(WireError::new(
                                ErrorCode::DeliveryExpired,
                                "ack of delivery attempt 1 came 500 ms after the delivery's \
                                 ack wait ran out",
                            )),
                            _ => None,
                        })
                        .collect();
                    let mut reports = take_reports(&script, batch.reports);
                    // A settle's own records, as the broker takes them: per settle, refused
                    // with a forged token (and with "bad-report"), proven by its token.
                    for e in batch.entries {
                        if e.records.is_empty() || ["forged", "bad-report"].contains(&&*e.token) {
                            continue;
                        }
                        reports.accepted += e.records.len() as u32;
                        let mut seen = script.seen.lock().unwrap();
                        seen.own_records += e.records.len();
                        seen.records
                            .extend(e.records.into_iter().map(|record| ReportedRecord {
                                record,
                                token: e.token.clone(),
                            }));
                    }
                    Ok(SettleResults { results, reports }.encode())
                }
                s::STAGE_REPORT => {
                    let records = frame::decode_report(&m.payload).unwrap().unwrap();
                    let n = records.len();
                    script.seen.lock().unwrap().stage_reports += n;
                    let o = take_reports(&script, records);
                    match o.error {
                        Some(e) => Err(error_reply(e.code, &e.message)),
                        None => Ok(format!(r#"{{"ok":true,"accepted":{n}}}"#).into()),
                    }
                }
                other => panic!("unexpected subject {other}"),
            };
            let _ = match body {
                Ok(b) => client.publish(reply, b).await,
                Err(hs) => client.publish_with_headers(reply, hs, Bytes::new()).await,
            };
        });
    }
}

struct Fake {
    _server: msgtrail_test_support::NatsServer,
    url: String,
    script: Arc<Script>,
}

async fn fake() -> Fake {
    let server = msgtrail_test_support::NatsServer::start().unwrap();
    let url = server.url().to_owned();
    let broker = async_nats::connect(url.as_str()).await.unwrap();
    let script = Arc::new(Script::default());
    tokio::spawn(serve(broker.clone(), script.clone()));
    broker.flush().await.unwrap();
    Fake {
        _server: server,
        url,
        script,
    }
}

impl Fake {
    async fn producer(&self, options: ProducerOptions) -> Producer {
        let nats = async_nats::connect(self.url.as_str()).await.unwrap();
        let me = Identity::generate(ClientId::new("shop").unwrap());
        Producer::connect_with(nats, me, options).await.unwrap()
    }

    async fn consumer(&self, options: ConsumerOptions) -> Consumer {
        let nats = async_nats::connect(self.url.as_str()).await.unwrap();
        let me = Identity::generate(ClientId::new("billing-1").unwrap());
        Consumer::connect_with(nats, me, options).await.unwrap()
    }

    fn seen<T>(&self, f: impl FnOnce(&Seen) -> T) -> T {
        f(&self.script.seen.lock().unwrap())
    }

    fn stages(&self) -> Vec<Stage> {
        self.seen(|s| s.records.iter().map(|r| r.record.stage).collect())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_coalesce_and_each_message_keeps_its_fate() {
    let f = fake().await;
    let p = f.producer(ProducerOptions::default()).await;
    let events = Arc::new(Mutex::new(Vec::new()));
    let ev = events.clone();
    p.hooks().register(
        &[
            HookKind::BeforeSend,
            HookKind::AfterSend,
            HookKind::StoreConfirmed,
        ],
        move |e| ev.lock().unwrap().push(e.clone()),
    );

    // Idle: one message, one batch of one, P1 as its send time.
    let first = p.send("orders.eu", "hello").await.unwrap();
    assert_eq!(first.receipt, format!("r-{}", first.request_id));
    assert_eq!(f.seen(|s| s.upload_batches.clone()), [1]);
    assert!(f.seen(|s| s.entries[0].2) > 0, "sent_at carries P1");

    // 300 at once: they leave in far fewer requests, each with its own reply.
    let replies = futures::future::join_all((0..300).map(|i| p.send("orders.eu", format!("m{i}"))))
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let mut ids: Vec<_> = replies.iter().map(|r| r.message_id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 300);
    let batches = f.seen(|s| s.upload_batches.clone());
    assert_eq!(batches.iter().sum::<usize>(), 301);
    assert!(batches.len() < 100, "{batches:?}");
    assert!(batches.iter().all(|n| *n <= 256), "{batches:?}");

    // One refused, one retried after a transient refusal, one fine: in one call.
    let flaky = RequestId::new("flaky-1").unwrap();
    let results = p
        .send_batch(vec![
            Outgoing::new("orders.eu", "ok"),
            Outgoing::new("refuse.me", "no"),
            Outgoing::new("flaky", "again").request_id(flaky.clone()),
            Outgoing::new("orders.*", "invalid"),
        ])
        .await;
    assert!(results[0].is_ok());
    assert_eq!(
        results[1].as_ref().unwrap_err().code(),
        Some(ErrorCode::NotPermitted)
    );
    assert_eq!(results[2].as_ref().unwrap().request_id, flaky);
    assert!(matches!(results[3], Err(ClientError::Invalid(_))));
    let attempts: Vec<u32> = f.seen(|s| {
        s.entries
            .iter()
            .filter(|e| e.0 == "flaky-1")
            .map(|e| e.1)
            .collect()
    });
    assert_eq!(attempts, [1, 2], "retried with the same request ID");

    // Hooks saw what one request per message would show.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let flaky_events: Vec<String> = events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            HookEvent::BeforeSend {
                request_id,
                attempt,
                ..
            } if *request_id == flaky => Some(format!("before {attempt}")),
            HookEvent::AfterSend {
                request_id,
                attempt,
                result,
                ..
            } if *request_id == flaky => Some(format!("after {attempt} {}", result.is_ok())),
            HookEvent::StoreConfirmed { reply, .. } if reply.request_id == flaky => {
                Some("stored".into())
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        flaky_events,
        [
            "before 1",
            "after 1 false",
            "before 2",
            "after 2 true",
            "stored"
        ]
    );

    // Every stored message's P4 reaches the broker by close, riding along or alone.
    let reporter_sent = {
        let p = p.clone();
        p.close().await.unwrap();
        let stored = 1 + 300 + 2;
        let p4 = f
            .stages()
            .iter()
            .filter(|s| **s == Stage::StoreConfirmed)
            .count();
        assert_eq!(p4, stored);
        assert!(f.seen(|s| s.records.iter().all(|r| r.token.starts_with("r-"))));
        stored
    };
    assert_eq!(p.reporter().unwrap().sent() as usize, reporter_sent);
    assert_eq!(p.reporter().unwrap().failed(), 0);
    assert!(
        f.stages().iter().all(|s| *s != Stage::UploadSent),
        "P1 is not reported separately"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_message_per_request_and_no_records_without_reporting() {
    let f = fake().await;
    let p = f
        .producer(
            ProducerOptions::default()
                .max_batch_messages(1)
                .report_stages(false),
        )
        .await;
    let n = futures::future::join_all((0..40).map(|i| p.send("orders.eu", format!("m{i}"))))
        .await
        .into_iter()
        .filter(Result::is_ok)
        .count();
    assert_eq!(n, 40);
    assert_eq!(f.seen(|s| s.upload_batches.clone()), [1; 40]);
    assert!(f.seen(|s| s.entries.iter().all(|e| e.2 == 0)), "no P1");
    p.close().await.unwrap();
    assert!(f.stages().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn byte_bound_splits_batches() {
    let f = fake().await;
    let p = f
        .producer(
            ProducerOptions::default()
                .max_batch_bytes(10_000)
                .max_inflight_batches(1),
        )
        .await;
    let sends = (0..20).map(|_| p.send("orders.eu", vec![1u8; 3000]));
    for r in futures::future::join_all(sends).await {
        r.unwrap();
    }
    let batches = f.seen(|s| s.upload_batches.clone());
    assert_eq!(batches.iter().sum::<usize>(), 20);
    assert!(batches.iter().all(|n| *n <= 3), "{batches:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_batch_retries_and_a_forgotten_channel_reopens() {
    let f = fake().await;
    let p = f
        .producer(ProducerOptions::default().timeout(Duration::from_millis(300)))
        .await;
    let slow = RequestId::new("slow-1").unwrap();
    let reply = p
        .send_message(Outgoing::new("orders.eu", "x").request_id(slow.clone()))
        .await
        .unwrap();
    assert_eq!(reply.request_id, slow);
    assert_eq!(
        f.seen(|s| s.entries.iter().map(|e| e.1).collect::<Vec<_>>()),
        [2]
    );

    *f.script.forget_channel.lock().unwrap() = true;
    p.send("orders.eu", "after expiry").await.unwrap();
    assert_eq!(f.seen(|s| s.channels.last().cloned()).unwrap(), "ch-2");

    p.clone().close().await.unwrap();
    // Attempt 1 may never have reached the broker: its P1 is reported.
    let p1: Vec<_> = f.seen(|s| {
        s.records
            .iter()
            .filter(|r| r.record.stage == Stage::UploadSent)
            .map(|r| (r.record.request_id.clone(), r.record.attempt))
            .collect()
    });
    assert_eq!(p1, [(Some(slow), Some(1))]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_deliveries_batched_settles_and_refused_reports() {
    let f = fake().await;
    let c = f.consumer(ConsumerOptions::default()).await;
    let sub = Subscription {
        group: msgtrail_core::GroupId::new("billing").unwrap(),
        topic: "orders.*".into(),
        filter: Default::default(),
        message_id: None,
    };
    let got = c.fetch(&sub, 10, Duration::from_millis(10)).await.unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].payload, Bytes::from_static(b"\x00one"));
    assert_eq!(got[0].attributes["category"], "refund");
    assert!(!got[0].push);
    let empty = Subscription {
        topic: "empty".into(),
        ..sub.clone()
    };
    assert!(c.fetch(&empty, 1, Duration::ZERO).await.unwrap().is_empty());

    // One push frame, three deliveries.
    let mut stream = c.subscribe(&sub, PushOptions::default()).await.unwrap();
    let mut pushed = vec![];
    for _ in 0..3 {
        let m = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .unwrap()
            .unwrap();
        assert!(m.push);
        pushed.push(m);
    }
    assert_eq!(
        pushed
            .iter()
            .map(|m| m.ack_token.as_str())
            .collect::<Vec<_>>(),
        ["p1", "bad-report", "p3"]
    );
    assert_eq!(f.seen(|s| s.binary_asked.clone()), [true, true, true]);

    // Settles: each its own result, a forged token fails alone.
    let mut forged = got[1].clone();
    forged.ack_token = "forged".into();
    let (a, b, x) = tokio::join!(got[0].ack(), forged.ack(), pushed[0].nack(None));
    assert!(a.is_ok() && x.is_ok());
    assert_eq!(b.unwrap_err().code(), Some(ErrorCode::BadAckToken));
    // An ack too late for its delivery: refused for good, and said so.
    let mut late = got[0].clone();
    late.ack_token = "expired".into();
    let e = late.ack().await.unwrap_err();
    assert!(e.is_delivery_expired(), "{e}");
    assert!(!e.is_transient(), "{e}");
    assert!(e.to_string().contains("delivery_expired"), "{e}");
    let results = futures::future::join_all(
        (0..50).map(|i| pushed[2].term(if i % 2 == 0 { "poison" } else { "bad" })),
    )
    .await;
    assert!(results.iter().all(Result::is_ok));
    let batches = f.seen(|s| s.settle_batches.clone());
    // 3 + the late ack (sent once: not retried) + 50.
    assert_eq!(batches.iter().sum::<usize>(), 54);
    assert!(batches.len() < 54, "{batches:?}");

    // Records of the "bad-report" delivery are refused with whatever rode with them: counted
    // as failed, and the settle that carried them still succeeded.
    c.process(pushed[1].clone(), |_| async { Ok::<_, String>(()) })
        .await
        .unwrap()
        .unwrap();
    let reporter_failed = {
        let c2 = c.clone();
        c2.close().await.unwrap();
        c.reporter().unwrap().failed()
    };
    assert!(reporter_failed > 0);
    // (The "bad-report" delivery's C2, X1, X2 and C3 came inside its settle and were refused
    // with it.)
    let stages = f.stages();
    for stage in [Stage::PullReceived, Stage::PushAckSent] {
        assert!(stages.contains(&stage), "{stage} missing from {stages:?}");
    }
    assert_eq!(
        c.reporter().unwrap().sent() as usize + reporter_failed as usize,
        // C6 ×2, C2 ×3, C7 ×3 (the late ack's too: it was sent) + C3 ×51, X1 + X2 + C3 for
        // the processed one.
        2 + 3 + 3 + 51 + 3
    );
    // Inside their settles: C6 + C7 of got[0], C2 + C3 of pushed[0], the late ack's C7, C2 and
    // the 50 C3s of pushed[2]; not the forged settle's C7 or the "bad-report" delivery's.
    // The C6 of got[1], never settled with its own token, went as a report at close.
    assert_eq!(f.seen(|s| s.own_records), 2 + 2 + 1 + 51);
    assert_eq!(f.seen(|s| s.stage_reports), 1);
}

/// A message settles through its own methods, with any [`AckKind`], even after the consumer
/// handle that fetched it is gone: it holds a share of the consumer's settle path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_settles_itself_after_its_consumer_is_dropped() {
    let f = fake().await;
    let c = f.consumer(ConsumerOptions::default()).await;
    let sub = Subscription {
        group: msgtrail_core::GroupId::new("billing").unwrap(),
        topic: "orders.*".into(),
        filter: Default::default(),
        message_id: None,
    };
    let got = c.fetch(&sub, 10, Duration::from_millis(10)).await.unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].group, "billing");
    drop(c);
    got[0].settle(AckKind::Ack).await.unwrap();
    got[1]
        .settle(AckKind::Nack {
            delay: Some(Duration::from_millis(5)),
        })
        .await
        .unwrap();
    got[1]
        .settle(AckKind::Term {
            reason: Some("poison".into()),
        })
        .await
        .unwrap();
    let settles = f.seen(|s| s.settles.clone());
    let t0 = got[0].ack_token.clone();
    let t1 = got[1].ack_token.clone();
    assert_eq!(
        settles,
        [
            (t0, "ack", None, String::new()),
            (t1.clone(), "nack", Some(5), String::new()),
            (t1, "term", None, "poison".to_owned()),
        ],
        "every settle reached the broker as its kind said"
    );
}

/// With no broker at all, the SDK says so (NATS "no responders"), not "no reply within 0 ms",
/// and counts it as transient (retried with the same request ID).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_broker_at_all_is_named_as_such() {
    let server = msgtrail_test_support::NatsServer::start().unwrap();
    let nats = async_nats::connect(server.url()).await.unwrap();
    let me = msgtrail_client::Identity::generate(ClientId::new("shop").unwrap());
    let err = msgtrail_client::Producer::connect(nats, me)
        .await
        .expect_err("nobody answers the channel challenge");
    assert!(
        matches!(err, msgtrail_client::ClientError::NoBroker { .. }),
        "{err:?}"
    );
    assert!(err.is_transient());
    let text = err.to_string();
    assert!(text.contains("no msgtrail broker is listening"), "{text}");
    assert!(!text.contains("0 ms"), "{text}");
}
