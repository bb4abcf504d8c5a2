//! End to end: send → consume with the real broker and SDK, the stage records read from the
//! stage stream, the trajectory assembled, and its spans exported over OTLP (gRPC, HTTP with
//! protobuf and with JSON) to a real receiver — trace ID = message ID, the parent chain, each party's service name,
//! every stage record a span event, a failed attempt an ERROR span.

use msgtrail_client::Outgoing;
use msgtrail_core::trace_ids::{self, Hop};
use msgtrail_core::trajectory::{AssembleOptions, Trajectory};
use msgtrail_core::wire::Subscription;
use msgtrail_core::{GroupId, MessageId, Stage, StageRecord};
use msgtrail_e2e::{has_all, TestSystem};
use msgtrail_otel::{trajectory_spans, ExportConfig, MappingOptions, Protocol, TraceExporter};
use msgtrail_test_support::{OtlpProtocol, OtlpReceiver, ReceivedSpan};
use std::collections::BTreeMap;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(2);

fn sub() -> Subscription {
    Subscription {
        group: GroupId::new("billing").unwrap(),
        topic: "orders.*".into(),
        filter: BTreeMap::new(),
        message_id: None,
    }
}

/// Sends one message, fetches it, fails the first attempt if `fail_first`, processes it
/// successfully, and returns its ID and its stage records once they are all there.
/// Sends one message and consumes it (failing the first attempt if asked); returns its ID,
/// its stage records, and the `process` traceparent the handler saw on each attempt.
async fn send_and_consume(
    sys: &TestSystem,
    fail_first: bool,
) -> (MessageId, Vec<StageRecord>, Vec<String>) {
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("billing-1").await;
    let reply = producer
        .send_message(Outgoing::new("orders.eu", "hello"))
        .await
        .unwrap();
    let mut attempts = 0;
    let mut handler_parents = vec![];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        assert!(tokio::time::Instant::now() < deadline, "never processed");
        let got = consumer.fetch(&sub(), 1, WAIT).await.unwrap();
        let Some(m) = got.into_iter().next() else {
            continue;
        };
        attempts += 1;
        handler_parents.push(m.process_traceparent());
        let fail = fail_first && attempts == 1;
        let outcome = consumer
            .process(m, |_| async move {
                if fail {
                    Err("insufficient funds")
                } else {
                    Ok(())
                }
            })
            .await
            .unwrap();
        if outcome.is_ok() {
            break;
        }
    }
    let want = [
        Stage::UploadReceived,
        Stage::Stored,
        Stage::StoreConfirmed,
        Stage::PullSent,
        Stage::PullReceived,
        Stage::ProcessStarted,
        Stage::ProcessFinished,
        Stage::PullAckSent,
        Stage::PullAckReceived,
    ];
    let n_acks = if fail_first { 2 } else { 1 };
    let recs = sys
        .records_for(reply.message_id, |r| {
            has_all(r, &want)
                && r.iter()
                    .filter(|x| x.stage == Stage::PullAckReceived)
                    .count()
                    >= n_acks
        })
        .await;
    // P1 carries no message ID yet: find the producer's by request ID.
    let mut all = recs;
    loop {
        let p1: Vec<StageRecord> = sys
            .stage_records()
            .await
            .into_iter()
            .filter(|r| {
                r.stage == Stage::UploadSent && r.request_id.as_ref() == Some(&reply.request_id)
            })
            .collect();
        if !p1.is_empty() {
            all.extend(p1);
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no P1 record");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (reply.message_id, all, handler_parents)
}

fn assemble(records: Vec<StageRecord>) -> Trajectory {
    Trajectory::assemble(records, &AssembleOptions::default()).expect("a trajectory")
}

async fn export_and_receive(
    t: &Trajectory,
    protocol: OtlpProtocol,
    export: Protocol,
) -> Vec<ReceivedSpan> {
    let mut rx = OtlpReceiver::start(protocol, None).await.unwrap();
    let exporter = TraceExporter::start(ExportConfig {
        protocol: export,
        endpoint: Some(rx.endpoint()),
        batch_delay: Duration::from_millis(10),
        ..Default::default()
    })
    .unwrap();
    let spans = trajectory_spans(t, &MappingOptions::default());
    let n = spans.len();
    assert_eq!(exporter.try_export(spans), n);
    let got = rx.spans(n, Duration::from_secs(10)).await;
    let stats = exporter.shutdown(Duration::from_secs(5)).await;
    assert_eq!(stats.exported as usize, n);
    got
}

fn span<'a>(got: &'a [ReceivedSpan], hop: &str) -> &'a ReceivedSpan {
    got.iter()
        .find(|s| s.attr("msgtrail.hop.key").as_deref() == Some(hop))
        .unwrap_or_else(|| {
            panic!(
                "no span for {hop}: {:?}",
                got.iter()
                    .map(|s| s.attr("msgtrail.hop.key"))
                    .collect::<Vec<_>>()
            )
        })
}

fn sid(id: &MessageId, hop: &Hop<'_>) -> String {
    trace_ids::hex(&trace_ids::span_id(id, hop))
}

fn codes(s: &ReceivedSpan) -> Vec<String> {
    s.span
        .events
        .iter()
        .map(|e| e.name.split(' ').next().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumed_message_is_one_trace_over_grpc() {
    let sys = TestSystem::start().await;
    let (id, records, handler_parents) = send_and_consume(&sys, false).await;
    let t = assemble(records);
    assert!(!t.hops.iter().any(|h| h.synthesized), "{:#?}", t.hops);
    let got = export_and_receive(&t, OtlpProtocol::Grpc, Protocol::Grpc).await;
    assert_eq!(got.len(), 4, "send, store, deliver, process");
    for s in &got {
        assert_eq!(s.trace_hex(), id.trace_hex(), "trace ID = message ID");
    }
    let deliver_hop = Hop::Deliver {
        group: "billing",
        consumer: "billing-1",
        attempt: 1,
    };
    let send = span(&got, "send");
    let store = span(&got, "store");
    let deliver = span(&got, &deliver_hop.key());
    let process = span(&got, "process/billing/billing-1/1");
    // The handler knew its process span without any propagation: its own spans nest there.
    assert_eq!(
        handler_parents,
        [format!(
            "00-{}-{}-01",
            process.trace_hex(),
            process.span_hex()
        )]
    );
    assert_eq!(send.parent_hex(), "");
    assert_eq!(store.parent_hex(), sid(&id, &Hop::Send));
    assert_eq!(deliver.parent_hex(), sid(&id, &Hop::Store));
    assert_eq!(process.parent_hex(), sid(&id, &deliver_hop));
    // The producer, the broker and the consumer as separate services.
    assert_eq!(send.service_name, "shop-svc");
    assert_eq!(store.service_name, "msgtrail-broker");
    assert_eq!(deliver.service_name, "msgtrail-broker");
    assert_eq!(process.service_name, "billing-1-svc");
    // Every stage log as a span event.
    assert_eq!(codes(send), ["P1", "P4"]);
    assert_eq!(codes(store), ["P2", "P3"]);
    assert_eq!(codes(deliver), ["C5", "C8"]);
    assert_eq!(codes(process), ["C6", "X1", "X2", "C7"]);
    assert_eq!(send.span.name, "send orders.eu");
    assert_eq!(
        process.attr("messaging.consumer.group.name").as_deref(),
        Some("billing")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempt_is_an_error_span_over_http() {
    let sys = TestSystem::start().await;
    let (id, records, handler_parents) = send_and_consume(&sys, true).await;
    let t = assemble(records);
    let got = export_and_receive(&t, OtlpProtocol::HttpProtobuf, Protocol::HttpProtobuf).await;
    for s in &got {
        assert_eq!(s.trace_hex(), id.trace_hex());
    }
    let failed = span(&got, "process/billing/billing-1/1");
    let retried = span(&got, "process/billing/billing-1/2");
    assert_eq!(
        handler_parents,
        [failed, retried].map(|s| format!("00-{}-{}-01", s.trace_hex(), s.span_hex())),
        "each attempt's handler sees its own process span"
    );
    let status = failed.span.status.as_ref().expect("a status");
    assert_eq!(status.code, 2, "ERROR");
    assert!(
        status.message.contains("insufficient funds"),
        "{}",
        status.message
    );
    let ok = span(&got, "process/billing/billing-1/2");
    assert_ne!(ok.span.status.as_ref().map(|s| s.code), Some(2));
    assert_eq!(
        ok.parent_hex(),
        sid(
            &id,
            &Hop::Deliver {
                group: "billing",
                consumer: "billing-1",
                attempt: 2
            }
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumed_message_is_one_trace_over_http_json() {
    let sys = TestSystem::start().await;
    let (id, records, _) = send_and_consume(&sys, true).await;
    let t = assemble(records);
    let got = export_and_receive(&t, OtlpProtocol::HttpProtobuf, Protocol::HttpJson).await;
    // send, store, 2 × (deliver, process), IDs intact through the JSON hex encoding.
    assert_eq!(got.len(), 6);
    for s in &got {
        assert_eq!(s.trace_hex(), id.trace_hex());
    }
    assert_eq!(span(&got, "store").parent_hex(), sid(&id, &Hop::Send));
    let failed = span(&got, "process/billing/billing-1/1");
    assert_eq!(failed.span.status.as_ref().map(|s| s.code), Some(2));
    assert_eq!(
        span(&got, "send").span.start_time_unix_nano,
        t.hop("send").expect("a send hop").start,
        "64-bit times survive JSON (as strings)"
    );
}

/// The whole chain: broker and SDK write the stage stream, the listener reads it, assembles
/// the trajectory and exports it through msgtrail-otel's pipeline to the receiver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_exports_each_consumed_message_as_one_trace() {
    use msgtrail_otel::PipelineConfig;
    let sys = TestSystem::start().await;
    let mut rx = OtlpReceiver::start_grpc().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let listener = msgtrail_listener::start(msgtrail_listener::ListenerConfig {
        nats: msgtrail_client::NatsOptions::url(sys.server.url()),
        data_dir: dir.path().to_path_buf(),
        http_addr: "127.0.0.1:0".parse().unwrap(),
        watchdog_interval: Duration::from_millis(100),
        otel: Some(PipelineConfig {
            export: ExportConfig {
                protocol: Protocol::Grpc,
                endpoint: Some(rx.endpoint()),
                batch_delay: Duration::from_millis(10),
                ..Default::default()
            },
            grace: Duration::from_millis(200),
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .expect("listener starts");
    let (id, _, _) = send_and_consume(&sys, true).await;
    // send, store, 2 × (deliver, process)
    let got = rx.spans(6, Duration::from_secs(20)).await;
    let mine: Vec<&ReceivedSpan> = got
        .iter()
        .filter(|s| s.trace_hex() == id.trace_hex())
        .collect();
    assert_eq!(
        mine.len(),
        6,
        "{:#?}",
        got.iter()
            .map(|s| s.attr("msgtrail.hop.key"))
            .collect::<Vec<_>>()
    );
    let services: std::collections::BTreeSet<&str> =
        mine.iter().map(|s| s.service_name.as_str()).collect();
    assert_eq!(
        services.into_iter().collect::<Vec<_>>(),
        ["billing-1-svc", "msgtrail-broker", "shop-svc"]
    );
    let failed = span(&got, "process/billing/billing-1/1");
    assert_eq!(failed.span.status.as_ref().map(|s| s.code), Some(2));
    assert_eq!(span(&got, "send").parent_hex(), "");
    assert_eq!(span(&got, "store").parent_hex(), sid(&id, &Hop::Send));
    listener.shutdown().await.unwrap();
    // Each hop once.
    assert!(rx.spans(1, Duration::from_millis(500)).await.is_empty());
}
