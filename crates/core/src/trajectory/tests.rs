//! Tests of the assembly, through the public API.

use super::*;
use crate::ids::{ClientId, RequestId};
use crate::stage::Stage;

pub(super) const T0: u64 = 1_796_126_401_000_000_000;
pub(super) const MS: u64 = 1_000_000;

pub(super) fn rec(stage: Stage, at_ms: u64) -> StageRecord {
    StageRecord::at(stage, T0 + at_ms * MS)
}

pub(super) fn id() -> MessageId {
    "0193a5f2-7c1e-7b2a-9f10-3c4d5e6f7a8b".parse().unwrap()
}

pub(super) fn up(stage: Stage, at_ms: u64, with_id: bool) -> StageRecord {
    let mut r = rec(stage, at_ms);
    r.request_id = Some(RequestId::new("req-1").unwrap());
    r.producer = Some(ClientId::new("shop").unwrap());
    r.topic = Some("orders".into());
    if with_id {
        r.message_id = Some(id());
    }
    r
}

pub(super) fn dl(
    stage: Stage,
    at_ms: u64,
    group: &str,
    consumer: &str,
    attempt: u32,
) -> StageRecord {
    let mut r = rec(stage, at_ms);
    r.message_id = Some(id());
    r.group = Some(crate::GroupId::new(group).unwrap());
    r.consumer = Some(ClientId::new(consumer).unwrap());
    r.attempt = Some(attempt);
    r
}

pub(super) fn with_outcome(mut r: StageRecord, o: &str, detail: Option<&str>) -> StageRecord {
    r.outcome = Some(o.into());
    r.detail = detail.map(Into::into);
    r
}

#[test]
fn same_request_names_the_other_uploads_in_the_diagnosis_and_the_json() {
    let recs = failure_then_success();
    let mut t = Trajectory::assemble(recs.clone(), &AssembleOptions::default()).unwrap();
    let plain = t.clone();
    assert!(t.same_request.is_empty());
    assert!(!serde_json::to_string(&t).unwrap().contains("same_request"));
    let earlier: MessageId = "0193a5f2-0000-7000-8000-000000000001".parse().unwrap();
    let later: MessageId = "0193a5f3-0000-7000-8000-000000000002".parse().unwrap();
    // Its own ID and repeats are dropped; the others are sorted (upload order).
    t.set_same_request([later, id(), earlier, later]);
    assert_eq!(t.same_request, vec![earlier, later]);
    assert!(
        t.diagnosis.contains(&format!(
            "duplicate after the dedup window: request id req-1 was stored before as message {earlier}, and again as this one, then as message {later}: 3 messages"
        )),
        "{}",
        t.diagnosis
    );
    let back: Trajectory = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
    assert_eq!(back, t);
    t.set_same_request([later]);
    assert!(
        t.diagnosis.contains(&format!(
            "duplicate after the dedup window: request id req-1 was stored again as message {later}: 2 messages"
        )),
        "{}",
        t.diagnosis
    );
    // Nothing else changes, and naming none gives the plain trajectory back.
    t.set_same_request([]);
    assert_eq!(t, plain);
    // A summary assembly has no diagnosis to add it to.
    let mut lite = Trajectory::assemble_for_summary(recs, &AssembleOptions::default()).unwrap();
    lite.set_same_request([later]);
    assert!(lite.diagnosis.is_empty());
    assert_eq!(lite.same_request, vec![later]);
}

/// Upload, then a failed first attempt (pull) and a successful redelivery.
fn failure_then_success() -> Vec<StageRecord> {
    let mut p1 = up(Stage::UploadSent, 0, false);
    p1.attempt = Some(1);
    vec![
        p1,
        up(Stage::UploadReceived, 1, true),
        up(Stage::Stored, 3, true),
        up(Stage::StoreConfirmed, 4, true),
        dl(Stage::PullSent, 10, "billing", "b-2", 1),
        dl(Stage::PullReceived, 11, "billing", "b-2", 1),
        dl(Stage::ProcessStarted, 12, "billing", "b-2", 1),
        with_outcome(
            dl(Stage::ProcessFinished, 15, "billing", "b-2", 1),
            "failed",
            Some("insufficient funds"),
        ),
        with_outcome(
            dl(Stage::PullAckSent, 16, "billing", "b-2", 1),
            "nack",
            None,
        ),
        with_outcome(
            dl(Stage::PullAckReceived, 17, "billing", "b-2", 1),
            "nack",
            None,
        ),
        with_outcome(
            dl(Stage::Redelivery, 17, "billing", "b-2", 1),
            "redeliver",
            Some("nack"),
        ),
        dl(Stage::PullSent, 30, "billing", "b-2", 2),
        dl(Stage::PullReceived, 31, "billing", "b-2", 2),
        dl(Stage::ProcessStarted, 32, "billing", "b-2", 2),
        with_outcome(
            dl(Stage::ProcessFinished, 40, "billing", "b-2", 2),
            "ok",
            None,
        ),
        with_outcome(dl(Stage::PullAckSent, 41, "billing", "b-2", 2), "ack", None),
        with_outcome(
            dl(Stage::PullAckReceived, 42, "billing", "b-2", 2),
            "ack",
            None,
        ),
    ]
}

#[test]
fn failure_then_success_on_redelivery() {
    let t = Trajectory::assemble(failure_then_success(), &AssembleOptions::default()).unwrap();
    assert_eq!(t.message_id, Some(id()));
    assert_eq!(t.state, MessageState::Consumed);
    let keys: Vec<&str> = t.hops.iter().map(|h| h.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "send",
            "store",
            "deliver/billing/b-2/1",
            "process/billing/b-2/1",
            "deliver/billing/b-2/2",
            "process/billing/b-2/2"
        ]
    );
    let p1 = t.hop("process/billing/b-2/1").unwrap();
    assert_eq!(p1.status, HopStatus::Error);
    assert_eq!(
        p1.reason.as_deref(),
        Some("processing failed: insufficient funds")
    );
    assert_eq!(p1.parent.as_deref(), Some("deliver/billing/b-2/1"));
    assert_eq!(
        t.hop("deliver/billing/b-2/2").unwrap().status,
        HopStatus::Ok
    );
    assert_eq!(t.hop("send").unwrap().latency_nanos, Some(4 * MS));
    assert_eq!(
        t.hop("send").unwrap().span_id.as_deref(),
        Some("48c7eb5f9750d85c")
    );
    let g = &t.groups[0];
    assert_eq!(g.attempts, 2);
    assert_eq!(g.state, MessageState::Consumed);
    assert_eq!(g.end_to_end_nanos, Some(42 * MS));
    assert_eq!(g.last_error.as_deref(), Some("insufficient funds"));
    assert!(
        t.diagnosis.contains("stored 12:00:01.003"),
        "{}",
        t.diagnosis
    );
    assert!(
        t.diagnosis
            .contains("processing failed: insufficient funds"),
        "{}",
        t.diagnosis
    );
    assert!(
        t.diagnosis
            .contains("redelivered to billing/b-2, attempt 2"),
        "{}",
        t.diagnosis
    );
    assert!(t.failure.is_none(), "{:?}", t.failure);
    let segs = t.segment_latencies();
    assert!(segs.contains(&(Segment::SentToStored, 3 * MS)));
    assert!(segs.contains(&(Segment::EndToEnd, 42 * MS)));
    assert!(segs.contains(&(Segment::Processing, 8 * MS)));
    // serializes and round-trips
    let json = serde_json::to_string(&t).unwrap();
    let back: Trajectory = serde_json::from_str(&json).unwrap();
    assert_eq!(back, t);
}

#[test]
fn the_summary_assembly_differs_only_by_diagnosis_span_ids_and_clocks() {
    let opts = AssembleOptions {
        now: Some(u64::MAX / 2),
        deadlines: Deadlines::default(),
    };
    let mut sets = vec![failure_then_success()];
    sets.push(vec![up(Stage::UploadSent, 0, false)]);
    sets.push(failure_then_success()[..5].to_vec());
    for recs in sets {
        for o in [AssembleOptions::default(), opts] {
            let full = Trajectory::assemble(recs.clone(), &o).unwrap();
            let mut lite = Trajectory::assemble_for_summary(recs.clone(), &o).unwrap();
            assert!(lite.diagnosis.is_empty());
            assert!(lite.hops.iter().all(|h| h.span_id.is_none()));
            assert!(lite.clocks.is_empty() && lite.hops.iter().all(|h| h.clock.is_none()));
            lite.diagnosis = full.diagnosis.clone();
            lite.clocks = full.clocks.clone();
            for (l, f) in lite.hops.iter_mut().zip(&full.hops) {
                l.span_id = f.span_id.clone();
                l.clock = f.clock.clone();
                l.on_broker_clock = f.on_broker_clock;
                l.arrival_nanos = f.arrival_nanos;
                l.arrival_bound_nanos = f.arrival_bound_nanos;
            }
            assert_eq!(lite, full);
            assert_eq!(lite.segment_latencies(), full.segment_latencies());
        }
    }
}

#[test]
fn any_order_and_repeats_give_the_same_trajectory() {
    let recs = failure_then_success();
    let base = Trajectory::assemble(recs.clone(), &AssembleOptions::default()).unwrap();
    // Deterministic pseudo-random permutations (xorshift), plus repeated records.
    let mut seed = 0x9e3779b97f4a7c15u64;
    for round in 0..50 {
        let mut v = recs.clone();
        for i in (1..v.len()).rev() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            v.swap(i, (seed % (i as u64 + 1)) as usize);
        }
        if round % 3 == 0 {
            v.extend(recs.iter().take(round % 7 + 1).cloned());
        }
        assert_eq!(
            Trajectory::assemble(v, &AssembleOptions::default()).unwrap(),
            base
        );
    }
}

#[test]
fn a_p1_that_never_reached_the_broker() {
    let mut p1 = up(Stage::UploadSent, 0, false);
    p1.attempt = Some(3);
    let open = Trajectory::assemble([p1.clone()], &AssembleOptions::default()).unwrap();
    assert_eq!(open.state, MessageState::Sent);
    assert_eq!(open.hops[0].status, HopStatus::Incomplete);
    assert!(open.trace_id.is_some());
    assert!(open.hops[0].span_id.is_none());
    let late = AssembleOptions {
        now: Some(T0 + 60_000 * MS),
        ..Default::default()
    };
    let t = Trajectory::assemble([p1], &late).unwrap();
    assert_eq!(t.state, MessageState::Lost);
    assert_eq!(t.hops[0].status, HopStatus::Error);
    assert!(t
        .failure
        .as_deref()
        .unwrap()
        .starts_with("did not reach the broker"));
    assert_eq!(t.upload_attempts, 3);
}

#[test]
fn the_same_request_sent_twice_counts_two_attempts() {
    let first = up(Stage::UploadSent, 0, false);
    let again = up(Stage::UploadSent, 10, false); // a new send, attempt 1 again
    let mut d1 = up(Stage::Duplicate, 11, true);
    d1.attempt = Some(1);
    let recs = vec![
        first,
        up(Stage::UploadReceived, 1, true),
        up(Stage::Stored, 2, true),
        again,
        d1,
    ];
    let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
    assert_eq!((t.upload_attempts, t.duplicates), (2, 1));
}

#[test]
fn a_refused_upload_says_why() {
    let p1 = up(Stage::UploadSent, 0, false);
    let mut p2 = up(Stage::UploadReceived, 1, false);
    p2.outcome = Some("refused".into());
    p2.detail = Some("payload_too_large: payload is 2048 bytes".into());
    let t = Trajectory::assemble([p1.clone(), p2.clone()], &AssembleOptions::default()).unwrap();
    assert_eq!(t.state, MessageState::Lost);
    let store = t.hop("store").unwrap();
    assert_eq!(store.status, HopStatus::Error);
    assert_eq!(store.end, Some(store.start));
    assert_eq!(
        t.failure.as_deref(),
        Some("refused by the broker: payload_too_large: payload is 2048 bytes")
    );
    // A later attempt that went through wins.
    let recs = vec![
        p1,
        p2,
        up(Stage::UploadReceived, 5, true),
        up(Stage::Stored, 6, true),
    ];
    let ok = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
    assert_eq!(ok.hop("store").unwrap().status, HopStatus::Ok);
    assert_eq!(ok.state, MessageState::Enqueued);
}

#[test]
fn a_delivery_never_acked_is_stuck_at_the_consumer() {
    let recs = vec![
        up(Stage::UploadReceived, 1, true),
        up(Stage::Stored, 2, true),
        dl(Stage::PushSent, 5, "audit", "a-1", 1),
        dl(Stage::PushReceived, 6, "audit", "a-1", 1),
    ];
    let t = Trajectory::assemble(recs.clone(), &AssembleOptions::default()).unwrap();
    assert_eq!(t.state, MessageState::Delivered);
    let send = t.hop("send").unwrap();
    assert!(send.synthesized);
    let late = AssembleOptions {
        now: Some(T0 + 3_600_000 * MS),
        ..Default::default()
    };
    let t = Trajectory::assemble(recs, &late).unwrap();
    assert_eq!(t.state, MessageState::Stuck);
    let f = t.failure.clone().unwrap();
    assert!(f.contains("stuck at consumer a-1 (group audit)"), "{f}");
    assert_eq!(
        t.hop("deliver/audit/a-1/1").unwrap().mode,
        Some(DeliveryMode::Push)
    );
}

#[test]
fn dead_letter_duplicates_and_two_groups() {
    let mut d1 = up(Stage::Duplicate, 2, true);
    d1.attempt = Some(2);
    let recs = vec![
        up(Stage::UploadSent, 0, false),
        up(Stage::UploadReceived, 1, true),
        d1,
        up(Stage::Stored, 2, true),
        dl(Stage::PushSent, 5, "a", "a1", 1),
        with_outcome(dl(Stage::PushAckReceived, 9, "a", "a1", 1), "ack", None),
        dl(Stage::PullSent, 5, "b", "b1", 1),
        with_outcome(dl(Stage::PullAckReceived, 9, "b", "b1", 1), "term", None),
        with_outcome(
            dl(Stage::Redelivery, 10, "b", "b1", 1),
            "dead_letter",
            Some("terminated"),
        ),
    ];
    let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
    assert_eq!(t.duplicates, 1);
    assert_eq!(t.upload_attempts, 2);
    assert_eq!(t.groups.len(), 2);
    assert_eq!(t.groups[0].state, MessageState::Consumed);
    assert_eq!(t.groups[1].state, MessageState::DeadLettered);
    assert_eq!(t.state, MessageState::DeadLettered);
    assert!(t.failure.unwrap().contains("dead-lettered by group b"));
}

#[test]
fn the_diagnosis_follows_time_across_groups() {
    let recs = vec![
        up(Stage::UploadReceived, 1, true),
        up(Stage::Stored, 2, true),
        dl(Stage::PushSent, 5, "zeta", "z1", 1),
        with_outcome(dl(Stage::PushAckReceived, 6, "zeta", "z1", 1), "ack", None),
        dl(Stage::PullSent, 9, "alpha", "a1", 1),
        with_outcome(
            dl(Stage::PullAckReceived, 12, "alpha", "a1", 1),
            "ack",
            None,
        ),
    ];
    let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
    let z = t.diagnosis.find("delivered to zeta/z1").unwrap();
    let a = t.diagnosis.find("delivered to alpha/a1").unwrap();
    assert!(z < a, "{}", t.diagnosis);
    assert!(
        t.diagnosis.contains("group zeta done 5.0 ms end to end"),
        "{}",
        t.diagnosis
    );
}

#[test]
fn records_without_group_or_attempt_are_matched() {
    let mut x1 = rec(Stage::ProcessStarted, 32);
    x1.message_id = Some(id());
    x1.consumer = Some(ClientId::new("b-2").unwrap());
    let recs = vec![
        up(Stage::Stored, 2, true),
        dl(Stage::PullSent, 10, "billing", "b-2", 1),
        dl(Stage::PullSent, 30, "billing", "b-2", 2),
        dl(Stage::PullReceived, 31, "billing", "b-2", 2),
        x1,
    ];
    let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
    let p = t.hop("process/billing/b-2/2").unwrap();
    assert!(p.events.iter().any(|r| r.stage == Stage::ProcessStarted));
    assert_eq!(t.state, MessageState::Consuming);
}

/// A pull delivery acked: P1, C5–C8 and the producer's P4, without the broker's P2/P3.
fn delivered_and_acked_without(store: &[Stage]) -> Vec<StageRecord> {
    let mut recs = vec![
        up(Stage::UploadSent, 1, false),
        up(Stage::UploadReceived, 2, true),
        up(Stage::Stored, 3, true),
        up(Stage::StoreConfirmed, 4, true),
        dl(Stage::PullSent, 10, "billing", "b-1", 1),
        dl(Stage::PullReceived, 11, "billing", "b-1", 1),
        dl(Stage::PullAckSent, 12, "billing", "b-1", 1),
        with_outcome(
            dl(Stage::PullAckReceived, 13, "billing", "b-1", 1),
            "ack",
            None,
        ),
    ];
    recs.retain(|r| !store.contains(&r.stage));
    recs
}

#[test]
fn a_delivery_implies_the_message_was_stored() {
    let late = AssembleOptions {
        now: Some(T0 + 3_600_000 * MS),
        ..Default::default()
    };
    // Both of the broker's store records lost: consumed, never "sent".
    let recs = delivered_and_acked_without(&[Stage::UploadReceived, Stage::Stored]);
    let t = Trajectory::assemble(recs, &late).unwrap();
    assert_eq!(t.state, MessageState::Consumed);
    let store = t.hop("store").expect("an inferred store hop");
    assert!(store.inferred);
    assert_eq!(store.status, HopStatus::Ok);
    assert!(store.events.is_empty());
    let states: Vec<MessageState> = t.states.iter().map(|s| s.state).collect();
    assert_eq!(
        states,
        [
            MessageState::Sent,
            MessageState::Enqueued,
            MessageState::Delivered,
            MessageState::Consumed
        ]
    );
    assert!(t.failure.is_none(), "{:?}", t.failure);
    assert!(!t.diagnosis.contains("not stored"), "{}", t.diagnosis);

    // Only P3 lost: stored (inferred), not "not stored … within" at the same time.
    let recs = delivered_and_acked_without(&[Stage::Stored]);
    let t = Trajectory::assemble(recs, &late).unwrap();
    assert_eq!(t.state, MessageState::Consumed);
    let store = t.hop("store").unwrap();
    assert!(store.inferred);
    assert_eq!(store.status, HopStatus::Ok);
    assert!(t.failure.is_none(), "{:?}", t.failure);
    assert!(!t.diagnosis.contains("not stored"), "{}", t.diagnosis);

    // With every record there, nothing is inferred.
    let t = Trajectory::assemble(delivered_and_acked_without(&[]), &late).unwrap();
    assert!(!t.hop("store").unwrap().inferred);
}

#[test]
fn the_brokers_p3_wins_over_a_recovered_one() {
    let mut recovered = up(Stage::Stored, 2, true);
    recovered.outcome = Some(RECOVERED.into());
    let mut recs = delivered_and_acked_without(&[Stage::Stored]);
    recs.push(recovered.clone());
    let t = Trajectory::assemble(recs.clone(), &AssembleOptions::default()).unwrap();
    let store = t.hop("store").unwrap();
    assert_eq!(
        store.end,
        Some(T0 + 2 * MS),
        "the recovered P3 ends the hop"
    );
    assert!(!store.inferred);
    recs.push(up(Stage::Stored, 3, true));
    let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
    assert_eq!(t.hop("store").unwrap().end, Some(T0 + 3 * MS));
}

#[test]
fn deliveries_alone_give_hops_on_their_own_time_axis() {
    let recs = vec![
        dl(Stage::PullSent, 10, "billing", "b-1", 1),
        dl(Stage::PullReceived, 11, "billing", "b-1", 1),
        dl(Stage::PullAckSent, 12, "billing", "b-1", 1),
        with_outcome(
            dl(Stage::PullAckReceived, 13, "billing", "b-1", 1),
            "ack",
            None,
        ),
    ];
    let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
    let send = t.hop("send").unwrap();
    assert!(send.synthesized);
    assert_eq!(send.start, T0 + 10 * MS);
    assert!(send.inferred);
    let segments: Vec<Segment> = t.segment_latencies().iter().map(|(s, _)| *s).collect();
    assert!(!segments.contains(&Segment::EndToEnd), "{segments:?}");
    assert!(!segments.contains(&Segment::SentToStored), "{segments:?}");
    assert!(t.groups.iter().all(|g| g.end_to_end_nanos.is_none()));
    assert!(t.first_at >= T0);
}

#[test]
fn a_fetch_by_id_and_a_subscription_delivery_are_different_hops() {
    let by_id = |mut r: StageRecord| {
        r.by_id = true;
        r
    };
    let recs = vec![
        up(Stage::UploadReceived, 1, true),
        up(Stage::Stored, 2, true),
        by_id(dl(Stage::PullSent, 5, "billing", "b-1", 1)),
        by_id(dl(Stage::PullReceived, 6, "billing", "b-1", 1)),
        by_id(with_outcome(
            dl(Stage::PullAckReceived, 8, "billing", "b-1", 1),
            "ack",
            None,
        )),
        dl(Stage::PullSent, 10, "billing", "b-1", 1),
        dl(Stage::PullReceived, 11, "billing", "b-1", 1),
    ];
    let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
    let keys: Vec<&str> = t.hops.iter().map(|h| h.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "send",
            "store",
            "deliver/billing/b-1/1/by-id",
            "process/billing/b-1/1/by-id",
            "deliver/billing/b-1/1",
            "process/billing/b-1/1"
        ]
    );
    let spans: std::collections::BTreeSet<&str> =
        t.hops.iter().filter_map(|h| h.span_id.as_deref()).collect();
    assert_eq!(spans.len(), t.hops.len(), "one span ID per hop");
    for h in &t.hops {
        assert_eq!(h.id().unwrap().to_string(), h.key);
    }
    // The fetch by ID is not the group's consumption: the subscription's delivery is open.
    assert_eq!(t.groups.len(), 2);
    let (sub, fetched) = (&t.groups[0], &t.groups[1]);
    assert!(!sub.by_id && fetched.by_id);
    assert_eq!(fetched.state, MessageState::Consumed);
    assert_eq!(sub.state, MessageState::Delivered);
    assert_eq!(t.state, MessageState::Delivered);
    assert!(
        t.diagnosis
            .contains("delivered to billing/b-1 by message ID at"),
        "{}",
        t.diagnosis
    );
    // Records without the flag are not taken for the fetch by ID (nor the other way).
    let d = t.hop("deliver/billing/b-1/1/by-id").unwrap();
    assert!(d.by_id && d.events.iter().all(|r| r.by_id));
}

/// A message delivered before the broker heard the PubAck (P3 at 8 ms, delivery at 5 ms),
/// with a consumer clock 2 ms behind the broker's (its C6 and X1 read earlier than C5).
fn delivered_before_the_puback() -> Vec<StageRecord> {
    vec![
        up(Stage::UploadSent, 1, false),
        up(Stage::UploadReceived, 2, true),
        up(Stage::Stored, 8, true),
        up(Stage::StoreConfirmed, 9, true),
        dl(Stage::PullSent, 5, "billing", "b-1", 1),
        dl(Stage::PullReceived, 4, "billing", "b-1", 1),
        dl(Stage::ProcessStarted, 4, "billing", "b-1", 1),
        dl(Stage::ProcessFinished, 6, "billing", "b-1", 1),
        dl(Stage::PullAckSent, 6, "billing", "b-1", 1),
        with_outcome(
            dl(Stage::PullAckReceived, 10, "billing", "b-1", 1),
            "ack",
            None,
        ),
    ]
}

#[test]
fn the_store_hop_ends_when_the_message_was_stored_and_states_only_move_forward() {
    // JetStream's stored time known (recovered P3 at 3 ms): the store hop ends there, the
    // PubAck stays an event, the recovered record does not.
    let mut recs = delivered_before_the_puback();
    let mut recovered = up(Stage::Stored, 3, true);
    recovered.outcome = Some(RECOVERED.into());
    recs.push(recovered);
    let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
    let store = t.hop("store").unwrap();
    assert_eq!((store.start, store.end), (T0 + 2 * MS, Some(T0 + 3 * MS)));
    assert_eq!(store.stored_at, Some(T0 + 3 * MS));
    let p3s: Vec<u64> = store
        .events
        .iter()
        .filter(|r| r.stage == Stage::Stored)
        .map(|r| r.at)
        .collect();
    assert_eq!(p3s, [T0 + 8 * MS], "the PubAck is the event");
    let states: Vec<MessageState> = t.states.iter().map(|s| s.state).collect();
    assert_eq!(
        states,
        [
            MessageState::Sent,
            MessageState::Enqueued,
            MessageState::Delivered,
            MessageState::Consuming,
            MessageState::Consumed
        ]
    );
    assert_eq!(t.states[1].at, T0 + 3 * MS, "enqueued when stored");
    // The consumer's X1 reads earlier than the delivery: shown as recorded, not reordered.
    assert!(t.states[3].at < t.states[2].at);
    assert!(super::invariants::causal_violations(&t).is_empty());

    // Stored time unknown: the delivery proves it was deliverable by then.
    let t =
        Trajectory::assemble(delivered_before_the_puback(), &AssembleOptions::default()).unwrap();
    let store = t.hop("store").unwrap();
    assert_eq!(store.end, Some(T0 + 5 * MS));
    assert_eq!(store.stored_at, None);
    assert!(super::invariants::causal_violations(&t).is_empty());
}

#[test]
fn a_hop_with_impossible_times_is_flagged_instead_of_shown() {
    let mut recs = delivered_and_acked_without(&[]);
    // The ack reaches the broker "before" the delivery was sent: a broken clock.
    recs.retain(|r| r.stage != Stage::PullAckReceived);
    recs.push(with_outcome(
        dl(Stage::PullAckReceived, 7, "billing", "b-1", 1),
        "ack",
        None,
    ));
    let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
    let deliver = t.hop("deliver/billing/b-1/1").unwrap();
    assert!(deliver
        .impossible
        .as_deref()
        .unwrap()
        .contains("3.000 ms before"));
    assert_eq!(deliver.latency_nanos, None);
    assert_eq!(deliver.end, Some(deliver.start));
    assert!(super::invariants::causal_violations(&t).is_empty());
}

#[test]
fn the_invariant_check_finds_regressions() {
    let change = |state, at, group: Option<&str>, attempt| StateChange {
        state,
        at,
        group: group.map(|g| crate::GroupId::new(g).unwrap()),
        consumer: None,
        by_id: false,
        attempt,
    };
    let states = [
        change(MessageState::Sent, 1, None, None),
        change(MessageState::Delivered, 2, Some("g"), Some(1)),
        change(MessageState::Enqueued, 3, None, None),
        change(MessageState::Consumed, 4, Some("g"), Some(1)),
        change(MessageState::Delivered, 5, Some("g"), Some(1)),
    ];
    let v = super::invariants::state_regressions(&states);
    assert_eq!(v.len(), 2, "{v:?}");
}

#[test]
fn clock_offsets_come_from_the_records_with_their_bounds() {
    // True times: P1 0, P2 1, P3 3, P4 4.2; C5 10, C6 10.4, C7 12, C8 12.6 (ms). The producer's
    // clock is 250 ms ahead, the consumer's 40 ms behind.
    let shift = |mut r: StageRecord, ms: f64, skew_ms: i64| {
        r.at = (T0 + (ms * 1e6).round() as u64).wrapping_add_signed(skew_ms * 1_000_000);
        r
    };
    let recs = vec![
        shift(up(Stage::UploadSent, 0, false), 0.0, 250),
        shift(up(Stage::UploadReceived, 0, true), 1.0, 0),
        shift(up(Stage::Stored, 0, true), 3.0, 0),
        shift(up(Stage::StoreConfirmed, 0, true), 4.2, 250),
        shift(dl(Stage::PullSent, 0, "billing", "b-1", 1), 10.0, 0),
        shift(dl(Stage::PullReceived, 0, "billing", "b-1", 1), 10.4, -40),
        shift(dl(Stage::PullAckSent, 0, "billing", "b-1", 1), 12.0, -40),
        with_outcome(
            shift(dl(Stage::PullAckReceived, 0, "billing", "b-1", 1), 12.6, 0),
            "ack",
            None,
        ),
    ];
    let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
    let shop = t
        .clocks
        .iter()
        .find(|c| c.client.as_str() == "shop")
        .unwrap();
    // Round trip 4.2 − 2 = 2.2 ms, bound 1.1 ms; the estimate is right within it.
    assert_eq!(shop.round_trip_nanos, 2_200_000);
    assert_eq!(shop.bound_nanos, 1_100_000);
    assert!((shop.offset_nanos - 250_000_000).unsigned_abs() <= shop.bound_nanos);
    let b1 = t
        .clocks
        .iter()
        .find(|c| c.client.as_str() == "b-1")
        .unwrap();
    assert_eq!(b1.round_trip_nanos, 1_000_000);
    assert!((b1.offset_nanos + 40_000_000).unsigned_abs() <= b1.bound_nanos);
    assert_eq!(t.hop("send").unwrap().clock.as_ref(), Some(shop));
    assert_eq!(
        t.hop("deliver/billing/b-1/1").unwrap().clock.as_ref(),
        Some(b1)
    );
    // On the broker's clock the send starts before the store, within the bound.
    let send = t.hop("send").unwrap().on_broker_clock.unwrap();
    assert!(send.start <= t.hop("store").unwrap().start + send.bound_nanos);
    let store = t.hop("store").unwrap();
    assert_eq!(store.arrival_bound_nanos, Some(1_100_000));
    assert!((store.arrival_nanos.unwrap() - 1_000_000).unsigned_abs() <= 1_100_000);
    let process = t.hop("process/billing/b-1/1").unwrap();
    assert!((process.arrival_nanos.unwrap() - 400_000).unsigned_abs() <= 500_000);
    let json = serde_json::to_string(&t).unwrap();
    assert!(json.contains("\"offset_nanos\""), "{json}");
}

/// A complete trajectory passes the audit, with a clock bound on each hop whose four
/// timestamps were reported; taking a bound away, or giving two hops one span ID, is found.
#[test]
fn the_audit_finds_what_a_trajectory_must_not_show() {
    let recs = vec![
        up(Stage::UploadSent, 0, false),
        up(Stage::UploadReceived, 1, true),
        up(Stage::Stored, 2, true),
        up(Stage::StoreConfirmed, 3, true),
        dl(Stage::PullSent, 4, "g", "c", 1),
        dl(Stage::PullReceived, 5, "g", "c", 1),
        dl(Stage::ProcessStarted, 5, "g", "c", 1),
        with_outcome(dl(Stage::ProcessFinished, 6, "g", "c", 1), "ok", None),
        with_outcome(dl(Stage::PullAckSent, 7, "g", "c", 1), "ack", None),
        with_outcome(dl(Stage::PullAckReceived, 8, "g", "c", 1), "ack", None),
    ];
    let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
    assert_eq!(t.audit(), Vec::<String>::new());
    let bounded = t.hops.iter().filter(|h| h.clock.is_some()).count();
    assert!(
        bounded >= 2,
        "send and deliver hops carry bounds: {bounded}"
    );
    let mut broken = t.clone();
    for h in &mut broken.hops {
        h.clock = None;
    }
    let found = super::invariants::missing_clock_bounds(&broken);
    assert!(found.len() >= 2, "{found:?}");
    let mut broken = t.clone();
    let first = broken.hops[0].span_id.clone();
    broken.hops[1].span_id = first;
    assert_eq!(super::invariants::span_id_collisions(&broken).len(), 1);
    let mut broken = t;
    let end = broken.hops[0].start - 1;
    broken.hops[0].end = Some(end);
    assert!(broken
        .audit()
        .iter()
        .any(|v| v.contains("ends before it starts")));
}
