//! Trajectories for the tests: built from stage records as the broker and clients write them.

#![allow(dead_code)]

use msgtrail_core::trajectory::{AssembleOptions, Trajectory};
use msgtrail_core::{BrokerInstance, ClientId, GroupId, MessageId, RequestId, Stage, StageRecord};

/// The broker instance on the broker's records.
pub(crate) const BROKER: &str = "b-1a2b3c4d";

/// 2026-12-01T12:00:00Z in Unix nanoseconds.
pub(crate) const T0: u64 = 1_796_126_400_000_000_000;
/// The producer's traceparent.
pub(crate) const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

pub(crate) fn ms(n: u64) -> u64 {
    T0 + n * 1_000_000
}

pub(crate) fn message_id() -> MessageId {
    "0193a5f2-7c1e-7b2a-9f10-3c4d5e6f7a8b".parse().unwrap()
}

fn rec(stage: Stage, at_ms: u64) -> StageRecord {
    let mut r = StageRecord::at(stage, ms(at_ms));
    r.topic = Some("orders.eu".into());
    r
}

/// P1–P4 records; the producer's carry its service name and traceparent.
pub(crate) fn upload(with_producer: bool) -> Vec<StageRecord> {
    let id = message_id();
    let req = RequestId::new("order-42").unwrap();
    let producer = ClientId::new("shop").unwrap();
    let mut out = Vec::new();
    for (stage, at, by_producer) in [
        (Stage::UploadSent, 0, true),
        (Stage::UploadReceived, 1, false),
        (Stage::Stored, 2, false),
        (Stage::StoreConfirmed, 3, true),
    ] {
        if by_producer && !with_producer {
            continue;
        }
        let mut r = rec(stage, at);
        r.request_id = Some(req.clone());
        r.producer = Some(producer.clone());
        if stage != Stage::UploadSent {
            r.message_id = Some(id);
        }
        if by_producer {
            r.service = Some("shop-frontend".into());
        } else {
            r.broker = Some(BrokerInstance::new(BROKER).unwrap());
        }
        match stage {
            Stage::UploadSent => {
                r.attempt = Some(1);
                r.traceparent = Some(TRACEPARENT.into());
            }
            Stage::UploadReceived => r.payload_size = Some(42),
            Stage::Stored => r.stream_seq = Some(7),
            _ => {}
        }
        out.push(r);
    }
    out
}

/// One pull delivery attempt to billing/billing-1 starting at `at` ms; `ok` decides the
/// processing outcome (failed → nack and a scheduled redelivery).
pub(crate) fn delivery(attempt: u32, at: u64, ok: bool) -> Vec<StageRecord> {
    let id = message_id();
    let mk = |stage, dt: u64, consumer_side: bool| {
        let mut r = rec(stage, at + dt);
        r.message_id = Some(id);
        r.group = Some(GroupId::new("billing").unwrap());
        r.consumer = Some(ClientId::new("billing-1").unwrap());
        r.attempt = Some(attempt);
        if consumer_side {
            r.service = Some("billing".into());
        } else {
            r.broker = Some(BrokerInstance::new(BROKER).unwrap());
        }
        r
    };
    let mut out = vec![
        mk(Stage::PullSent, 0, false),
        mk(Stage::PullReceived, 1, true),
        mk(Stage::ProcessStarted, 2, true),
    ];
    let mut x2 = mk(Stage::ProcessFinished, 4, true);
    let mut c7 = mk(Stage::PullAckSent, 5, true);
    let mut c8 = mk(Stage::PullAckReceived, 6, false);
    if ok {
        x2.outcome = Some("ok".into());
        c7.outcome = Some("ack".into());
        c8.outcome = Some("ack".into());
        out.extend([x2, c7, c8]);
    } else {
        x2.outcome = Some("failed".into());
        x2.detail = Some("insufficient funds".into());
        c7.outcome = Some("nack".into());
        c8.outcome = Some("nack".into());
        let mut r1 = mk(Stage::Redelivery, 7, false);
        r1.outcome = Some("redeliver".into());
        out.extend([x2, c7, c8, r1]);
    }
    out
}

pub(crate) fn assemble(records: Vec<StageRecord>, now: Option<u64>) -> Trajectory {
    Trajectory::assemble(
        records,
        &AssembleOptions {
            now,
            ..Default::default()
        },
    )
    .expect("records make a trajectory")
}

/// Upload and one successful pull delivery.
pub(crate) fn success() -> Trajectory {
    let mut r = upload(true);
    r.extend(delivery(1, 10, true));
    assemble(r, None)
}

/// Upload, a failed attempt (nack, redelivery), then a successful one.
pub(crate) fn failure_then_success() -> Trajectory {
    let mut r = upload(true);
    r.extend(delivery(1, 10, false));
    r.extend(delivery(2, 30, true));
    assemble(r, None)
}

/// A P1 that never reached the broker, closed by the store deadline.
pub(crate) fn orphan() -> Trajectory {
    let mut r = upload(true);
    r.truncate(1);
    assemble(r, Some(ms(60_000)))
}

/// A raw NATS client uploaded: no producer record at all.
pub(crate) fn synthesized_root() -> Trajectory {
    let mut r = upload(false);
    r.extend(delivery(1, 10, true));
    assemble(r, None)
}

/// An observed message (observe mode) whose stored `traceparent` makes it join the
/// producer's trace, with a consumer of its stream that does not sample every ack: the
/// `msgtrail.observed` and `msgtrail.observe.*` attributes.
pub(crate) fn observed() -> Trajectory {
    let id = msgtrail_core::observed::observed_message_id("ORDERS", 7);
    let mut r = upload(false);
    r.extend(delivery(1, 10, true));
    for x in r.iter_mut() {
        x.message_id = Some(id);
        if matches!(x.stage, Stage::UploadReceived | Stage::Stored) {
            x.outcome = Some("observed".into());
            x.producer = Some(ClientId::new("ORDERS").unwrap());
            x.stream_seq = Some(7);
            x.traceparent = Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into());
        }
    }
    let mut t = assemble(r, None);
    let o = t.observed.as_mut().expect("an observed trajectory");
    o.unsampled
        .push(msgtrail_core::observed::UnsampledConsumer {
            consumer: "audit".into(),
            sample_freq: 0,
            fix: "nats consumer edit ORDERS audit --sample 100 --force".into(),
        });
    t
}

/// A retried upload the broker flagged duplicate, a hop whose clock timestamps contradict
/// each other and a dead-lettered delivery: the attributes the plain fixtures do not reach.
pub(crate) fn dead_lettered_with_bad_clock() -> Trajectory {
    let mut records = upload(true);
    let mut duplicate = records
        .iter()
        .find(|r| r.stage == Stage::UploadReceived)
        .expect("an upload has a P2")
        .clone();
    duplicate.stage = Stage::Duplicate;
    duplicate.at = ms(5);
    records.push(duplicate);
    records.extend(delivery(1, 10, false));
    for r in records.iter_mut() {
        match r.stage {
            // Given up after the failed attempt: dead-lettered, not redelivered.
            Stage::Redelivery => r.outcome = Some("dead_letter".into()),
            // The producer's P4 before its own P1: impossible on one clock.
            Stage::StoreConfirmed => r.at = ms(0) - 5_000_000,
            _ => {}
        }
    }
    assemble(records, Some(ms(60_000)))
}

/// Spans of every trajectory the fixtures have: ok, a failed attempt, an orphan upload, a
/// synthesized root, a duplicate with a dead letter and impossible timestamps.
pub(crate) fn every_fixture_spans() -> Vec<msgtrail_otel::ServiceSpan> {
    let opts = msgtrail_otel::MappingOptions {
        now: Some(ms(60_000)),
        ..Default::default()
    };
    [
        success(),
        failure_then_success(),
        orphan(),
        synthesized_root(),
        dead_lettered_with_bad_clock(),
        observed(),
    ]
    .iter()
    .flat_map(|t| msgtrail_otel::trajectory_spans(t, &opts))
    .collect()
}
