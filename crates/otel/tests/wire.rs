//! Export against a real OTLP receiver (msgtrail-test-support) over gRPC, HTTP/protobuf and
//! HTTP/JSON:
//! spans arrive with trace ID = message ID, the parent chain and one resource per service;
//! a receiver that is down and comes back gets the spans; drops are counted at the bound.

mod common;

use common::*;
use msgtrail_core::trace_ids::{self, Hop};
use msgtrail_otel::{
    trajectory_spans, ExportConfig, MappingOptions, Protocol, ServiceSpan, TraceExporter,
};
use msgtrail_test_support::{OtlpProtocol, OtlpReceiver, ReceivedSpan};
use std::collections::BTreeSet;
use std::time::Duration;

fn config(protocol: Protocol, endpoint: String) -> ExportConfig {
    ExportConfig {
        protocol,
        endpoint: Some(endpoint),
        timeout: Some(Duration::from_secs(2)),
        batch_delay: Duration::from_millis(20),
        initial_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(200),
        ..Default::default()
    }
}

fn spans() -> Vec<ServiceSpan> {
    trajectory_spans(&success(), &MappingOptions::default())
}

fn hex(b: &[u8]) -> String {
    trace_ids::hex(b)
}

fn check_trace(got: &[ReceivedSpan]) {
    assert_eq!(got.len(), 4, "{got:#?}");
    let id = message_id();
    for s in got {
        assert_eq!(s.trace_hex(), id.trace_hex(), "trace ID = message ID");
        assert_eq!(s.scope_name, "msgtrail");
    }
    let find = |name: &str| {
        got.iter()
            .find(|s| s.span.name == name)
            .unwrap_or_else(|| panic!("no span {name}"))
    };
    let send = find("send orders.eu");
    let store = find("store orders.eu");
    let deliver = find("deliver orders.eu");
    let process = find("process orders.eu");
    let sid = |h: &Hop<'_>| hex(&trace_ids::span_id(&id, h));
    let d1 = Hop::Deliver {
        group: "billing",
        consumer: "billing-1",
        attempt: 1,
    };
    assert_eq!(send.span_hex(), sid(&Hop::Send));
    assert_eq!(send.parent_hex(), "");
    assert_eq!(store.parent_hex(), sid(&Hop::Send));
    assert_eq!(deliver.parent_hex(), sid(&Hop::Store));
    assert_eq!(process.parent_hex(), sid(&d1));
    assert_eq!(send.service_name, "shop-frontend");
    assert_eq!(store.service_name, "msgtrail-broker");
    assert_eq!(deliver.service_name, "msgtrail-broker");
    assert_eq!(process.service_name, "billing");
    assert_eq!(send.span.events.len(), 2);
    assert_eq!(send.span.events[0].time_unix_nano, ms(0));
    assert_eq!(send.span.links.len(), 1);
    assert_eq!(send.attr("messaging.message.id"), Some(id.to_string()));
    assert_eq!(
        process.attr("messaging.consumer.group.name").as_deref(),
        Some("billing")
    );
}

async fn round_trip(protocol: OtlpProtocol, export: Protocol) {
    let mut rx = OtlpReceiver::start(protocol, None).await.unwrap();
    let exporter = TraceExporter::start(config(export, rx.endpoint())).unwrap();
    assert_eq!(exporter.try_export(spans()), 4);
    let got = rx.spans(4, Duration::from_secs(10)).await;
    check_trace(&got);
    // One resource per service: the producer's, the broker's, the consumer's.
    let services: BTreeSet<String> = got.iter().map(|s| s.service_name.clone()).collect();
    assert_eq!(
        services.into_iter().collect::<Vec<_>>(),
        ["billing", "msgtrail-broker", "shop-frontend"]
    );
    let stats = exporter.shutdown(Duration::from_secs(5)).await;
    assert_eq!(stats.exported, 4);
    assert_eq!(stats.dropped(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_arrive_over_grpc() {
    round_trip(OtlpProtocol::Grpc, Protocol::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_arrive_over_http_protobuf() {
    round_trip(OtlpProtocol::HttpProtobuf, Protocol::HttpProtobuf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_arrive_over_http_json() {
    let mut rx = OtlpReceiver::start(OtlpProtocol::HttpProtobuf, None)
        .await
        .unwrap();
    let exporter = TraceExporter::start(config(Protocol::HttpJson, rx.endpoint())).unwrap();
    assert_eq!(exporter.try_export(spans()), 4);
    check_trace(&rx.spans(4, Duration::from_secs(10)).await);
    assert!(rx.json_requests() > 0, "not sent as OTLP/JSON");
    let stats = exporter.shutdown(Duration::from_secs(5)).await;
    assert_eq!((stats.exported, stats.dropped()), (4, 0));
}

#[test]
fn http_json_is_read_from_the_protocol_variable() {
    let c = ExportConfig::from_lookup(|k| {
        (k == "OTEL_EXPORTER_OTLP_PROTOCOL").then(|| "http/json".to_owned())
    })
    .unwrap();
    assert_eq!(c.protocol, Protocol::HttpJson);
    assert_eq!(c.endpoint_or_default(), "http://localhost:4318/v1/traces");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_wait_for_a_receiver_that_is_down_and_arrive_when_it_returns() {
    // Learn a free address, then take the receiver away.
    let rx = OtlpReceiver::start_grpc().await.unwrap();
    let addr = rx.addr();
    let endpoint = rx.endpoint();
    rx.stop().await;

    let exporter = TraceExporter::start(config(Protocol::Grpc, endpoint)).unwrap();
    assert_eq!(exporter.try_export(spans()), 4);
    // The exporter fails and keeps retrying.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while exporter.snapshot().export_failures < 2 {
        assert!(tokio::time::Instant::now() < deadline, "no failed attempt");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(exporter.snapshot().exported, 0);

    let mut back = OtlpReceiver::start(OtlpProtocol::Grpc, Some(addr))
        .await
        .unwrap();
    let got = back.spans(4, Duration::from_secs(15)).await;
    check_trace(&got);
    let stats = exporter.shutdown(Duration::from_secs(5)).await;
    assert_eq!(stats.exported, 4);
    assert_eq!(stats.dropped(), 0);
    assert!(stats.export_failures >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_is_bounded_and_drops_are_counted() {
    let rx = OtlpReceiver::start_http().await.unwrap();
    let endpoint = rx.endpoint();
    rx.stop().await;
    let exporter = TraceExporter::start(ExportConfig {
        queue_capacity: 8,
        max_batch: 4,
        max_in_flight: 2,
        ..config(Protocol::HttpProtobuf, endpoint)
    })
    .unwrap();
    let handle = exporter.handle();
    let mut offered = 0;
    let mut accepted = 0;
    for _ in 0..25 {
        let batch = spans();
        offered += batch.len();
        accepted += handle.try_export(batch);
    }
    let snap = handle.snapshot();
    assert_eq!(snap.enqueued as usize, accepted);
    assert_eq!((snap.enqueued + snap.dropped_queue_full) as usize, offered);
    // At most the queue, the requests in flight and the batch the worker fills.
    let bound = 8 + (2 + 1) * 4;
    assert!(accepted <= bound, "{accepted} accepted");
    assert!(
        snap.dropped_queue_full >= (offered - bound) as u64,
        "{snap:?}"
    );
    let text = snap.render_prometheus();
    assert!(text.contains(&format!(
        "msgtrail_otel_spans_dropped_total{{reason=\"queue_full\"}} {}",
        snap.dropped_queue_full
    )));
    // Shutdown with the endpoint still down: what was queued is counted as dropped too.
    let last = exporter.shutdown(Duration::from_secs(3)).await;
    assert_eq!(last.exported, 0);
    assert_eq!(last.dropped() as usize, offered, "{last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_keeps_failing_is_dropped_after_max_attempts() {
    let rx = OtlpReceiver::start_grpc().await.unwrap();
    let endpoint = rx.endpoint();
    rx.stop().await;
    let exporter = TraceExporter::start(ExportConfig {
        max_attempts: 3,
        initial_backoff: Duration::from_millis(10),
        ..config(Protocol::Grpc, endpoint)
    })
    .unwrap();
    exporter.try_export(spans());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while exporter.snapshot().dropped_retries < 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            exporter.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let snap = exporter.shutdown(Duration::from_secs(2)).await;
    assert_eq!(snap.dropped_retries, 4);
    assert_eq!(snap.in_flight, 0);
    assert!(snap.render_prometheus().contains("{reason=\"retries\"} 4"));
}

#[test]
fn export_config_reads_the_standard_variables() {
    let c = ExportConfig::from_lookup(|k| match k {
        "OTEL_EXPORTER_OTLP_PROTOCOL" => Some("http/protobuf".into()),
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" => Some("grpc".into()),
        "OTEL_SERVICE_NAME" => Some("broker-eu".into()),
        "MSGTRAIL_OTEL_QUEUE_SPANS" => Some("100".into()),
        _ => None,
    })
    .unwrap();
    assert_eq!(
        c.protocol,
        Protocol::Grpc,
        "the traces-specific variable wins"
    );
    assert_eq!(c.broker_service, "broker-eu");
    assert_eq!(c.queue_capacity, 100);
    assert_eq!(
        ExportConfig::from_lookup(|_| None).unwrap().protocol,
        Protocol::HttpProtobuf
    );
    let err = ExportConfig::from_lookup(|k| {
        (k == "OTEL_EXPORTER_OTLP_PROTOCOL").then(|| "http/xml".to_owned())
    })
    .unwrap_err();
    assert!(err.to_string().contains("http/json"), "{err}");
}

#[test]
fn export_config_reads_endpoint_headers_timeout_and_compression() {
    let c = ExportConfig::from_lookup(|k| match k {
        "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://collector:4318/".into()),
        "OTEL_EXPORTER_OTLP_HEADERS" => Some("x-tenant=eu, authorization=Basic%20abc".into()),
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT" => Some("2500".into()),
        "OTEL_EXPORTER_OTLP_COMPRESSION" => Some("gzip".into()),
        _ => None,
    })
    .unwrap();
    assert_eq!(
        c.endpoint.as_deref(),
        Some("http://collector:4318/v1/traces")
    );
    assert_eq!(
        c.headers,
        [
            ("x-tenant".to_owned(), "eu".to_owned()),
            ("authorization".to_owned(), "Basic abc".to_owned())
        ]
    );
    assert_eq!(c.timeout, Some(Duration::from_millis(2500)));
    assert_eq!(c.compression, Some(msgtrail_otel::Compression::Gzip));
    // The traces endpoint is taken as it is; gRPC gets the base endpoint unchanged.
    let grpc = ExportConfig::from_lookup(|k| match k {
        "OTEL_EXPORTER_OTLP_PROTOCOL" => Some("grpc".into()),
        "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://collector:4317".into()),
        _ => None,
    })
    .unwrap();
    assert_eq!(grpc.endpoint.as_deref(), Some("http://collector:4317"));
    let bad = ExportConfig::from_lookup(|k| {
        (k == "OTEL_EXPORTER_OTLP_COMPRESSION").then(|| "zstd".to_owned())
    });
    assert!(bad.is_err());
}

/// What examples/consumer_spans.rs does, against the receiver: the application's span made
/// with the SDK's tracer is a child of the message's process span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_spans_nest_under_the_process_span() {
    use opentelemetry::trace::{Span, TraceContextExt, Tracer, TracerProvider};
    let mut rx = OtlpReceiver::start_grpc().await.unwrap();
    let exporter = {
        use opentelemetry_otlp::WithExportConfig;
        opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(rx.endpoint())
            .build()
            .unwrap()
    };
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .build();
    let parent = msgtrail_otel::process_span_context(&message_id(), "billing", "billing-1", 1);
    let cx = opentelemetry::Context::new().with_remote_span_context(parent);
    provider
        .tracer("billing-handler")
        .start_with_context("charge card", &cx)
        .end();
    tokio::task::spawn_blocking(move || provider.shutdown())
        .await
        .unwrap()
        .unwrap();
    let got = rx.spans(1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].span.name, "charge card");
    assert_eq!(got[0].trace_hex(), message_id().trace_hex());
    let process = Hop::Process {
        group: "billing",
        consumer: "billing-1",
        attempt: 1,
    };
    assert_eq!(
        got[0].parent_hex(),
        hex(&trace_ids::span_id(&message_id(), &process))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_compression_over_both_transports() {
    for (protocol, export) in [
        (OtlpProtocol::Grpc, Protocol::Grpc),
        (OtlpProtocol::HttpProtobuf, Protocol::HttpProtobuf),
        (OtlpProtocol::HttpProtobuf, Protocol::HttpJson),
    ] {
        let mut rx = OtlpReceiver::start(protocol, None).await.unwrap();
        let exporter = TraceExporter::start(ExportConfig {
            compression: Some(msgtrail_otel::Compression::Gzip),
            ..config(export, rx.endpoint())
        })
        .unwrap();
        exporter.try_export(spans());
        check_trace(&rx.spans(4, Duration::from_secs(10)).await);
        assert!(rx.gzip_requests() > 0, "{export:?}: not compressed");
        exporter.shutdown(Duration::from_secs(5)).await;
    }
}

/// A receiver that throttles (HTTP 429 + `Retry-After`, gRPC `UNAVAILABLE` + `RetryInfo`)
/// is waited for as long as it asks, not the exporter's 50 ms backoff; then the spans go out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttling_receiver_is_waited_for_as_long_as_it_asks() {
    for (protocol, export) in [
        (OtlpProtocol::Grpc, Protocol::Grpc),
        (OtlpProtocol::HttpProtobuf, Protocol::HttpProtobuf),
    ] {
        let mut rx = OtlpReceiver::start(protocol, None).await.unwrap();
        let wait = Duration::from_secs(1);
        rx.throttle(1, wait);
        let exporter = TraceExporter::start(config(export, rx.endpoint())).unwrap();
        assert_eq!(exporter.try_export(spans()), 4);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while rx.throttled_requests() == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{protocol:?}: no request"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let refused_at = tokio::time::Instant::now();
        let got = rx.spans(4, Duration::from_secs(10)).await;
        let waited = refused_at.elapsed();
        check_trace(&got);
        // The polling above saw the refusal up to a few ms late.
        assert!(
            waited >= wait - Duration::from_millis(50),
            "{protocol:?}: retried after {waited:?}, asked to wait {wait:?}"
        );
        assert_eq!(rx.throttled_requests(), 1);
        let stats = exporter.shutdown(Duration::from_secs(5)).await;
        assert_eq!((stats.exported, stats.dropped()), (4, 0), "{protocol:?}");
        assert_eq!(stats.export_failures, 1, "{protocol:?}");
    }
}
