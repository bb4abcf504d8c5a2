//! The listener's pipeline against a real OTLP receiver: hops go out once, after the grace;
//! failures at once; hops sampled out come back when the trajectory turns bad; a stuck hop is
//! closed as an error at the watchdog's time.

mod common;

use common::*;
use msgtrail_otel::{ExportConfig, PipelineConfig, Protocol, SamplingPolicy, TracePipeline};
use msgtrail_test_support::{OtlpReceiver, ReceivedSpan};
use std::collections::BTreeSet;
use std::time::Duration;

async fn pipeline(sampling: SamplingPolicy) -> (TracePipeline, OtlpReceiver) {
    let rx = OtlpReceiver::start_grpc().await.unwrap();
    let p = TracePipeline::start(PipelineConfig {
        export: ExportConfig {
            protocol: Protocol::Grpc,
            endpoint: Some(rx.endpoint()),
            batch_delay: Duration::from_millis(10),
            ..Default::default()
        },
        sampling,
        grace: Duration::from_secs(2),
        ..Default::default()
    })
    .unwrap();
    (p, rx)
}

fn hops(spans: &[ReceivedSpan]) -> BTreeSet<String> {
    spans
        .iter()
        .map(|s| s.attr("msgtrail.hop.key").unwrap())
        .collect()
}

/// The four hops of a message delivered once.
fn all_four() -> BTreeSet<String> {
    [
        "send",
        "store",
        "deliver/billing/billing-1/1",
        "process/billing/billing-1/1",
    ]
    .map(String::from)
    .into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_hops_go_out_once_after_the_grace() {
    let (mut p, mut rx) = pipeline(SamplingPolicy::default()).await;
    let t = success();
    assert_eq!(p.observe(&t, ms(16)), 0, "within the grace");
    assert_eq!(p.observe(&t, ms(2_003)), 2, "send and store are due");
    assert_eq!(p.observe(&t, ms(2_003)), 0, "not twice");
    assert_eq!(p.observe(&t, ms(5_000)), 2, "deliver and process");
    assert_eq!(p.observe(&t, ms(9_000)), 0);
    assert_eq!(p.tracked_traces(), 1);
    let got = rx.spans(4, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 4);
    assert_eq!(hops(&got), all_four());
    let stats = p.shutdown(Duration::from_secs(5)).await;
    assert_eq!(stats.exported, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hops_left_out_come_back_when_the_trajectory_turns_bad() {
    let (mut p, mut rx) = pipeline(SamplingPolicy {
        healthy_ratio: 0.0,
        ..Default::default()
    })
    .await;
    // Healthy so far: the upload. Sampled out.
    let uploaded = assemble(upload(true), None);
    assert_eq!(p.observe(&uploaded, ms(3_000)), 0);
    assert_eq!(p.snapshot().sampled_out, 2);
    // Then processing fails: everything goes out, the upload's hops included.
    let mut r = upload(true);
    r.extend(delivery(1, 10, false));
    let failed = assemble(r, None);
    assert_eq!(
        p.observe(&failed, ms(20)),
        0,
        "failures wait for stragglers too"
    );
    assert_eq!(p.observe(&failed, ms(3_000)), 4);
    let got = rx.spans(4, Duration::from_secs(10)).await;
    assert_eq!(hops(&got), all_four());
    for s in &got {
        assert_eq!(s.trace_hex(), message_id().trace_hex());
    }
    p.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_delivery_is_exported_as_an_error_at_the_watchdog_time() {
    let (mut p, mut rx) = pipeline(SamplingPolicy::default()).await;
    let mut r = upload(true);
    let mut d = delivery(1, 10, true);
    d.truncate(1); // C5 only: never received, never acked
    r.extend(d);
    let now = ms(120_000);
    let stuck = assemble(r, Some(now));
    assert_eq!(
        p.observe(&stuck, now),
        3,
        "send, store and the stuck deliver"
    );
    let got = rx.spans(3, Duration::from_secs(10)).await;
    let deliver = got
        .iter()
        .find(|s| s.span.name == "deliver orders.eu")
        .expect("deliver span");
    let status = deliver.span.status.as_ref().unwrap();
    assert_eq!(status.code, 2, "STATUS_CODE_ERROR");
    assert!(status.message.contains("stuck"), "{}", status.message);
    assert_eq!(deliver.attr("error.type").as_deref(), Some("timeout"));
    assert_eq!(deliver.span.end_time_unix_nano, now);
    p.shutdown(Duration::from_secs(5)).await;
}

#[test]
fn export_is_requested_by_an_endpoint_variable() {
    use msgtrail_otel::export_requested_in;
    assert!(!export_requested_in(|_| None));
    assert!(export_requested_in(|k| {
        (k == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| "http://jaeger:4317".into())
    }));
    assert!(!export_requested_in(|k| match k {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" => Some("http://tempo:4318/v1/traces".into()),
        "OTEL_TRACES_EXPORTER" => Some("none".into()),
        _ => None,
    }));
    let c = PipelineConfig::from_lookup(|k| (k == "MSGTRAIL_OTEL_GRACE_MS").then(|| "500".into()))
        .unwrap();
    assert_eq!(c.grace, Duration::from_millis(500));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_is_bounded_by_max_traces() {
    let rx = OtlpReceiver::start_grpc().await.unwrap();
    let mut p = TracePipeline::start(PipelineConfig {
        export: ExportConfig {
            protocol: Protocol::Grpc,
            endpoint: Some(rx.endpoint()),
            ..Default::default()
        },
        max_traces: 3,
        ..Default::default()
    })
    .unwrap();
    for _ in 0..10 {
        let mut t = success();
        t.message_id = Some(msgtrail_core::MessageId::new());
        assert_eq!(p.observe(&t, ms(10_000)), 4);
        assert!(p.tracked_traces() <= 3);
    }
    assert_eq!(p.tracked_traces(), 3);
    p.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hops_inside_their_grace_are_kept_and_go_out_on_tick_or_shutdown() {
    let (mut p, mut rx) = pipeline(SamplingPolicy::default()).await;
    let mut r = upload(true);
    r.extend(delivery(1, 10, false));
    let failed = assemble(r, None);
    // Observed once, while every hop is inside its grace: nothing yet, but kept.
    assert_eq!(p.observe(&failed, ms(20)), 0);
    assert_eq!(p.waiting(), 1);
    assert_eq!(p.tick(ms(1_000)), 0);
    // The caller never observes it again: the tick exports it.
    assert_eq!(p.tick(ms(2_003)), 2, "send and store");
    assert_eq!(p.tick(ms(2_020)), 2, "the failed deliver and process");
    assert_eq!(p.waiting(), 0);
    assert_eq!(
        hops(&rx.spans(4, Duration::from_secs(10)).await),
        all_four()
    );

    // Shutdown exports what is still waiting rather than dropping it.
    let mut other = success();
    other.message_id = Some(msgtrail_core::MessageId::new());
    assert_eq!(p.observe(&other, ms(20)), 0);
    assert_eq!(p.waiting(), 1);
    let stats = p.shutdown(Duration::from_secs(5)).await;
    assert_eq!(stats.exported, 8);
}

/// A member taking a trace's export over: the hops another one exported (marked) are not
/// exported again, the rest go out; the exporter reports what the receiver accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hops_marked_exported_elsewhere_are_not_exported_again_and_accepted_hops_are_reported() {
    let (mut p, mut rx) = pipeline(SamplingPolicy::default()).await;
    let reported = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = reported.clone();
    assert!(p.handle().on_exported(std::sync::Arc::new(move |hops| {
        sink.lock().unwrap().extend(hops)
    })));
    let t = success();
    assert!(!p.knows(&t));
    p.mark_exported(&t, &["send".to_owned(), "store".to_owned()]);
    assert!(p.knows(&t));
    assert_eq!(p.observe(&t, ms(9_000)), 2, "deliver and process only");
    let got = rx.spans(2, Duration::from_secs(10)).await;
    assert_eq!(
        hops(&got),
        ["deliver/billing/billing-1/1", "process/billing/billing-1/1"]
            .map(String::from)
            .into()
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while reported.lock().unwrap().len() < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let reported: BTreeSet<String> = reported
        .lock()
        .unwrap()
        .iter()
        .map(|h| {
            assert_eq!(h.message_id, t.message_id.unwrap().to_string());
            h.hop_key.clone()
        })
        .collect();
    assert_eq!(reported, hops(&got));
    p.shutdown(Duration::from_secs(5)).await;
}
