//! The mapping from trajectories to SpanData: IDs, parents, events, kinds, attributes and
//! status for success, failure with redelivery, an orphan upload and a synthesized root;
//! and the tail sampler's decisions.

mod common;

use common::*;
use msgtrail_core::trace_ids::{self, Hop};
use msgtrail_core::{ClientId, RequestId};
use msgtrail_otel::in_ratio;
use msgtrail_otel::{orphan_send_span_id, parse_hop_key};
use msgtrail_otel::{
    process_span_context, trajectory_spans, Decision, KeepReason, MappingOptions, SamplingPolicy,
    ServiceSpan, TailSampler,
};
use opentelemetry::trace::{SpanId, SpanKind, Status, TraceId};
use std::time::{Duration, Instant, UNIX_EPOCH};

fn attr(s: &ServiceSpan, key: &str) -> Option<String> {
    s.span
        .attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.as_str().into_owned())
}

fn by_hop<'a>(spans: &'a [ServiceSpan], hop: &str) -> &'a ServiceSpan {
    spans
        .iter()
        .find(|s| attr(s, "msgtrail.hop.key").as_deref() == Some(hop))
        .unwrap_or_else(|| panic!("no span for hop {hop}"))
}

fn sid(hop: &Hop<'_>) -> SpanId {
    SpanId::from_bytes(trace_ids::span_id(&message_id(), hop))
}

fn nanos(t: std::time::SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

const D1: Hop<'static> = Hop::Deliver {
    group: "billing",
    consumer: "billing-1",
    attempt: 1,
};
const P1: Hop<'static> = Hop::Process {
    group: "billing",
    consumer: "billing-1",
    attempt: 1,
};

#[test]
fn success_maps_to_four_spans_with_the_documented_ids_and_parent_chain() {
    let t = success();
    let spans = trajectory_spans(&t, &MappingOptions::default());
    assert_eq!(spans.len(), 4);
    let trace = TraceId::from_hex(&message_id().trace_hex()).unwrap();
    for s in &spans {
        assert_eq!(s.span.span_context.trace_id(), trace);
        assert!(s.span.span_context.is_sampled());
        assert_eq!(s.span.status, Status::Unset, "{}", s.span.name);
        assert_eq!(s.span.instrumentation_scope.name(), "msgtrail");
        assert!(s.span.end_time >= s.span.start_time);
    }
    let send = by_hop(&spans, "send");
    let store = by_hop(&spans, "store");
    let deliver = by_hop(&spans, "deliver/billing/billing-1/1");
    let process = by_hop(&spans, "process/billing/billing-1/1");

    // IDs: the documented hash; parents: send → store → deliver → process.
    assert_eq!(send.span.span_context.span_id(), sid(&Hop::Send));
    assert_eq!(send.span.parent_span_id, SpanId::INVALID);
    assert_eq!(store.span.span_context.span_id(), sid(&Hop::Store));
    assert_eq!(store.span.parent_span_id, sid(&Hop::Send));
    assert_eq!(deliver.span.span_context.span_id(), sid(&D1));
    assert_eq!(deliver.span.parent_span_id, sid(&Hop::Store));
    assert_eq!(process.span.span_context.span_id(), sid(&P1));
    assert_eq!(process.span.parent_span_id, sid(&D1));
    // The consumer's handler can nest under the process span with no propagation.
    let cx = process_span_context(&message_id(), "billing", "billing-1", 1);
    assert_eq!(cx.span_id(), process.span.span_context.span_id());
    assert_eq!(cx.trace_id(), trace);
    assert!(cx.is_remote());

    // Broker-side spans name the broker instance whose clock timed them; client-side
    // spans do not.
    for (s, instance) in [
        (send, None),
        (store, Some(BROKER)),
        (deliver, Some(BROKER)),
        (process, None),
    ] {
        assert_eq!(
            attr(s, "msgtrail.broker.instance").as_deref(),
            instance,
            "{}",
            s.span.name
        );
    }

    // Names and kinds.
    assert_eq!(send.span.name, "send orders.eu");
    assert_eq!(send.span.span_kind, SpanKind::Producer);
    assert_eq!(store.span.name, "store orders.eu");
    assert_eq!(store.span.span_kind, SpanKind::Consumer);
    assert_eq!(deliver.span.name, "deliver orders.eu");
    assert_eq!(deliver.span.span_kind, SpanKind::Producer);
    assert_eq!(process.span.name, "process orders.eu");
    assert_eq!(process.span.span_kind, SpanKind::Consumer);

    // service.name of the party that did the work.
    assert_eq!(send.service_name, "shop-frontend");
    assert_eq!(store.service_name, "msgtrail-broker");
    assert_eq!(deliver.service_name, "msgtrail-broker");
    assert_eq!(process.service_name, "billing");
    let named = trajectory_spans(
        &t,
        &MappingOptions {
            broker_service: "broker-eu".into(),
            now: None,
        },
    );
    assert_eq!(by_hop(&named, "store").service_name, "broker-eu");

    // Messaging semantic conventions.
    for s in &spans {
        assert_eq!(attr(s, "messaging.system").as_deref(), Some("msgtrail"));
        assert_eq!(
            attr(s, "messaging.message.id"),
            Some(message_id().to_string())
        );
        assert_eq!(
            attr(s, "messaging.message.conversation_id").as_deref(),
            Some("order-42")
        );
        assert_eq!(
            attr(s, "messaging.destination.name").as_deref(),
            Some("orders.eu")
        );
    }
    assert_eq!(
        attr(send, "messaging.operation.type").as_deref(),
        Some("send")
    );
    assert_eq!(attr(send, "messaging.client.id").as_deref(), Some("shop"));
    assert_eq!(
        attr(send, "messaging.message.body.size").as_deref(),
        Some("42")
    );
    assert_eq!(attr(store, "msgtrail.stream_seq").as_deref(), Some("7"));
    assert_eq!(
        attr(process, "messaging.operation.type").as_deref(),
        Some("process")
    );
    // Operation types agree with the kinds as the messaging conventions pair them: the
    // broker's store is a CONSUMER that processes, its deliver a PRODUCER that sends.
    assert_eq!(store.span.span_kind, SpanKind::Consumer);
    assert_eq!(
        attr(store, "messaging.operation.type").as_deref(),
        Some("process")
    );
    assert_eq!(deliver.span.span_kind, SpanKind::Producer);
    assert_eq!(
        attr(deliver, "messaging.operation.type").as_deref(),
        Some("send")
    );
    assert_eq!(
        attr(deliver, "messaging.consumer.group.name").as_deref(),
        Some("billing")
    );
    assert_eq!(
        attr(deliver, "messaging.client.id").as_deref(),
        Some("billing-1")
    );
    assert_eq!(
        attr(deliver, "msgtrail.delivery.mode").as_deref(),
        Some("pull")
    );
    assert_eq!(attr(process, "msgtrail.attempt").as_deref(), Some("1"));

    // Events: every stage record at its exact time, in order.
    let codes = |s: &ServiceSpan| -> Vec<String> {
        s.span
            .events
            .iter()
            .map(|e| e.name.split(' ').next().unwrap().to_owned())
            .collect()
    };
    assert_eq!(codes(send), ["P1", "P4"]);
    assert_eq!(codes(store), ["P2", "P3"]);
    assert_eq!(codes(deliver), ["C5", "C8"]);
    assert_eq!(codes(process), ["C6", "X1", "X2", "C7"]);
    assert_eq!(send.span.events.events[0].name, "P1 upload sent");
    assert_eq!(nanos(send.span.events.events[0].timestamp), ms(0));
    assert_eq!(nanos(send.span.events.events[1].timestamp), ms(3));
    assert_eq!(nanos(process.span.events.events[2].timestamp), ms(14));
    let x2 = &process.span.events.events[2];
    assert!(x2
        .attributes
        .iter()
        .any(|kv| kv.key.as_str() == "msgtrail.outcome" && kv.value.as_str() == "ok"));
    // Span times are the hop's.
    assert_eq!(nanos(send.span.start_time), ms(0));
    assert_eq!(nanos(send.span.end_time), ms(3));
    assert_eq!(nanos(store.span.start_time), ms(1));
    assert_eq!(nanos(store.span.end_time), ms(2));
    assert_eq!(nanos(deliver.span.start_time), ms(10));
    assert_eq!(nanos(deliver.span.end_time), ms(16));

    // The producer's traceparent is a link on the send span only.
    assert_eq!(send.span.links.links.len(), 1);
    let link = &send.span.links.links[0].span_context;
    assert_eq!(
        link.trace_id(),
        TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
    );
    assert_eq!(
        link.span_id(),
        SpanId::from_hex("00f067aa0ba902b7").unwrap()
    );
    assert!(store.span.links.links.is_empty());
}

#[test]
fn failure_and_redelivery_show_as_error_spans_then_a_healthy_attempt() {
    let t = failure_then_success();
    let spans = trajectory_spans(&t, &MappingOptions::default());
    assert_eq!(spans.len(), 6, "send, store, 2 × (deliver, process)");
    let p1 = by_hop(&spans, "process/billing/billing-1/1");
    match &p1.span.status {
        Status::Error { description } => {
            assert!(description.contains("insufficient funds"), "{description}")
        }
        other => panic!("process attempt 1 is {other:?}"),
    }
    assert_eq!(attr(p1, "error.type").as_deref(), Some("processing_failed"));
    let d1 = by_hop(&spans, "deliver/billing/billing-1/1");
    assert!(matches!(d1.span.status, Status::Error { .. }));
    assert_eq!(attr(d1, "error.type").as_deref(), Some("nack"));
    // The redelivery record is on the trace.
    assert!(d1.span.events.iter().any(|e| e.name.starts_with("R1")));
    let d2 = by_hop(&spans, "deliver/billing/billing-1/2");
    let p2 = by_hop(&spans, "process/billing/billing-1/2");
    assert_eq!(d2.span.status, Status::Unset);
    assert_eq!(p2.span.status, Status::Unset);
    assert_eq!(attr(p2, "msgtrail.attempt").as_deref(), Some("2"));
    // Both attempts hang off the store span; each process off its own deliver.
    assert_eq!(d2.span.parent_span_id, sid(&Hop::Store));
    assert_eq!(
        p2.span.parent_span_id,
        sid(&Hop::Deliver {
            group: "billing",
            consumer: "billing-1",
            attempt: 2
        })
    );
    assert_ne!(
        d1.span.span_context.span_id(),
        d2.span.span_context.span_id()
    );
}

#[test]
fn an_orphan_upload_gets_the_orphan_trace_id_and_a_timed_out_send_span() {
    let t = orphan();
    let spans = trajectory_spans(&t, &MappingOptions::default());
    assert_eq!(spans.len(), 1);
    let send = &spans[0];
    let trace = TraceId::from_bytes(trace_ids::orphan_trace_id(
        &ClientId::new("shop").unwrap(),
        &RequestId::new("order-42").unwrap(),
    ));
    assert_eq!(send.span.span_context.trace_id(), trace);
    assert_eq!(send.span.span_context.span_id(), orphan_send_span_id(trace));
    assert_eq!(send.span.parent_span_id, SpanId::INVALID);
    assert_eq!(attr(send, "msgtrail.orphan").as_deref(), Some("true"));
    assert_eq!(attr(send, "messaging.message.id"), None);
    assert_eq!(attr(send, "error.type").as_deref(), Some("timeout"));
    match &send.span.status {
        Status::Error { description } => {
            assert!(
                description.contains("did not reach the broker"),
                "{description}"
            )
        }
        other => panic!("{other:?}"),
    }
    // Closed at its last event when no "now" is given; at "now" when it is.
    assert_eq!(nanos(send.span.end_time), ms(0));
    let closed = trajectory_spans(
        &t,
        &MappingOptions {
            now: Some(ms(60_000)),
            ..Default::default()
        },
    );
    assert_eq!(nanos(closed[0].span.end_time), ms(60_000));
}

#[test]
fn a_missing_producer_gets_a_synthesized_marked_root() {
    let t = synthesized_root();
    let spans = trajectory_spans(&t, &MappingOptions::default());
    let send = by_hop(&spans, "send");
    assert_eq!(attr(send, "msgtrail.synthesized").as_deref(), Some("true"));
    assert_eq!(send.span.span_context.span_id(), sid(&Hop::Send));
    assert_eq!(send.span.parent_span_id, SpanId::INVALID);
    // Named after the producer ID the broker recorded; built from the broker's records.
    assert_eq!(send.service_name, "shop");
    let codes: Vec<&str> = send
        .span
        .events
        .iter()
        .map(|e| e.name.split(' ').next().unwrap())
        .collect();
    assert_eq!(codes, ["P2", "P3"]);
    assert_eq!(by_hop(&spans, "store").span.parent_span_id, sid(&Hop::Send));
    assert!(send.span.links.is_empty());
}

#[test]
fn open_hops_wait() {
    let mut r = upload(true);
    let mut d = delivery(1, 10, true);
    d.truncate(3); // delivered and being processed: no ack yet
    r.extend(d);
    let t = assemble(r, None);
    let spans = trajectory_spans(&t, &MappingOptions::default());
    let hops: Vec<String> = spans
        .iter()
        .map(|s| attr(s, "msgtrail.hop.key").unwrap())
        .collect();
    assert_eq!(hops, ["send", "store"]);
}

#[test]
fn hop_keys_parse_back() {
    assert_eq!(parse_hop_key("send"), Some(Hop::Send));
    assert_eq!(parse_hop_key(&D1.key()), Some(D1));
    assert_eq!(parse_hop_key(&P1.key()), Some(P1));
    assert_eq!(parse_hop_key("deliver/g/c"), None);
    assert_eq!(parse_hop_key("deliver/g/c/x"), None);
    assert_eq!(parse_hop_key("nope"), None);
}

#[test]
fn the_sampler_keeps_errors_and_slow_ones_and_bounds_healthy_ones() {
    let healthy = success();
    let failed = failure_then_success();
    let orphan = orphan();
    let none = SamplingPolicy {
        healthy_ratio: 0.0,
        ..Default::default()
    };
    let mut s = TailSampler::new(none.clone());
    assert_eq!(s.decide(&healthy, 4), Decision::DropRatio);
    assert_eq!(s.decide(&failed, 6), Decision::Keep(KeepReason::Error));
    assert_eq!(s.decide(&orphan, 1), Decision::Keep(KeepReason::Error));
    // Slow: a hop longer than the threshold.
    let mut slow = TailSampler::new(SamplingPolicy {
        slow_threshold: Duration::from_millis(2),
        ..none
    });
    assert_eq!(slow.decide(&healthy, 4), Decision::Keep(KeepReason::Slow));

    // Budget: 10 healthy spans per second.
    let mut b = TailSampler::new(SamplingPolicy {
        healthy_spans_per_second: 10,
        ..Default::default()
    });
    let t0 = Instant::now();
    assert_eq!(
        b.decide_at(&healthy, 4, t0),
        Decision::Keep(KeepReason::Sampled)
    );
    assert_eq!(
        b.decide_at(&healthy, 4, t0),
        Decision::Keep(KeepReason::Sampled)
    );
    assert_eq!(b.decide_at(&healthy, 4, t0), Decision::DropBudget);
    // Errors never draw from, nor wait for, the budget.
    assert_eq!(
        b.decide_at(&failed, 6, t0),
        Decision::Keep(KeepReason::Error)
    );
    // Half a second refills five tokens.
    assert!(b
        .decide_at(&healthy, 4, t0 + Duration::from_millis(500))
        .keep());
}

#[test]
fn the_ratio_is_decided_by_the_trace_id() {
    let low = [0u8; 16];
    let mut high = [0u8; 16];
    high[8] = 0xff;
    assert!(in_ratio(low, 0.5));
    assert!(!in_ratio(high, 0.5));
    assert!(in_ratio(high, 1.0));
    assert!(!in_ratio(low, 0.0));
    // About the ratio over many IDs.
    let kept = (0..10_000u64)
        .filter(|i| {
            let mut id = [0u8; 16];
            id[8..].copy_from_slice(&i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes());
            in_ratio(id, 0.25)
        })
        .count();
    assert!((2_000..3_000).contains(&kept), "{kept}");
}

#[test]
fn sampling_policy_reads_its_variables() {
    let env = |k: &str| match k {
        "MSGTRAIL_OTEL_SAMPLE_RATIO" => Some("0.1".to_owned()),
        "MSGTRAIL_OTEL_SPANS_PER_SECOND" => Some("50".to_owned()),
        "MSGTRAIL_OTEL_SLOW_MS" => Some("250".to_owned()),
        _ => None,
    };
    let p = SamplingPolicy::from_lookup(env).unwrap();
    assert_eq!(p.healthy_ratio, 0.1);
    assert_eq!(p.healthy_spans_per_second, 50);
    assert_eq!(p.slow_threshold, Duration::from_millis(250));
    let bad = SamplingPolicy::from_lookup(|k| {
        (k == "MSGTRAIL_OTEL_SAMPLE_RATIO").then(|| "2".to_owned())
    })
    .unwrap_err();
    assert!(
        bad.to_string().contains("MSGTRAIL_OTEL_SAMPLE_RATIO"),
        "{bad}"
    );
}

/// The producer's `traceparent` goes through the SDK's W3C propagator.
#[test]
fn traceparent_follows_the_w3c_grammar() {
    use msgtrail_otel::parse_traceparent;
    let sc = parse_traceparent(TRACEPARENT).expect("valid");
    assert_eq!(
        sc.trace_id().to_string(),
        "4bf92f3577b34da6a3ce929d0e0e4736"
    );
    assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
    assert!(sc.is_sampled() && sc.is_remote());
    // A later version may carry more fields; version 00 may not.
    assert!(parse_traceparent(&format!("01{}-extra", &TRACEPARENT[2..])).is_some());
    for bad in [
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
    ] {
        assert!(parse_traceparent(bad).is_none(), "{bad:?} accepted");
    }
}

/// Observe mode: an observed message with a stored traceparent joins the producer's trace;
/// its root span is a remote child of the producer's span, every span says it was observed.
#[test]
fn an_observed_message_joins_the_producers_trace() {
    let t = common::observed();
    let spans = msgtrail_otel::trajectory_spans(&t, &Default::default());
    assert!(spans.len() >= 3, "{}", spans.len());
    for s in &spans {
        let sc = &s.span.span_context;
        assert_eq!(
            sc.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert!(s
            .span
            .attributes
            .iter()
            .any(|kv| kv.key.as_str() == "msgtrail.observed"));
        let unsampled = s
            .span
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == "msgtrail.observe.unsampled_consumers")
            .map(|kv| kv.value.to_string());
        assert_eq!(unsampled.as_deref(), Some("[\"audit\"]"), "{}", s.span.name);
    }
    let root = spans
        .iter()
        .find(|s| s.span.name.starts_with("send"))
        .expect("a send span");
    assert_eq!(root.span.parent_span_id.to_string(), "b7ad6b7169203331");
    assert!(root.span.parent_span_is_remote);
    let store = spans
        .iter()
        .find(|s| s.span.name.starts_with("store"))
        .unwrap();
    assert_eq!(store.span.parent_span_id, root.span.span_context.span_id());
}
