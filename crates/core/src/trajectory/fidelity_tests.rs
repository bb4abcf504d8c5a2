//! Tests of what makes a trajectory faithful across clocks: estimates pair only records of
//! one broker instance, the store hop ends at JetStream's stored time carried on a
//! delivery, and the diagnosis words client times on the broker's clock.

use super::tests::{dl, up, with_outcome, MS, T0};
use super::*;
use crate::ids::BrokerInstance;
use crate::stage::Stage;

fn on(mut r: StageRecord, broker: &str) -> StageRecord {
    r.broker = Some(BrokerInstance::new(broker).unwrap());
    r
}

/// Moves a record to `true_ms` after T0 as seen by a clock `skew_ms` ahead.
fn at(mut r: StageRecord, true_ms: f64, skew_ms: i64) -> StageRecord {
    r.at = (T0 + (true_ms * 1e6).round() as u64).wrapping_add_signed(skew_ms * 1_000_000);
    r
}

/// An upload through broker `b-up` (its clock true) by a producer 250 ms ahead, and a pull
/// delivery to consumer `c-1` (40 ms behind) sent by `sent_by` and settled at `settled_by`,
/// whose clock is `settle_skew_ms` off.
fn two_brokers(sent_by: &str, settled_by: &str, settle_skew_ms: i64) -> Vec<StageRecord> {
    vec![
        at(up(Stage::UploadSent, 0, false), 0.0, 250),
        on(at(up(Stage::UploadReceived, 0, true), 1.0, 0), "b-up"),
        on(at(up(Stage::Stored, 0, true), 3.0, 0), "b-up"),
        at(up(Stage::StoreConfirmed, 0, true), 4.2, 250),
        on(at(dl(Stage::PullSent, 0, "g", "c-1", 1), 10.0, 0), sent_by),
        at(dl(Stage::PullReceived, 0, "g", "c-1", 1), 10.4, -40),
        with_outcome(
            at(dl(Stage::PullAckSent, 0, "g", "c-1", 1), 12.0, -40),
            "ack",
            None,
        ),
        with_outcome(
            on(
                at(
                    dl(Stage::PullAckReceived, 0, "g", "c-1", 1),
                    12.6,
                    settle_skew_ms,
                ),
                settled_by,
            ),
            "ack",
            None,
        ),
    ]
}

#[test]
fn estimates_name_the_broker_instance_they_are_measured_against() {
    let t =
        Trajectory::assemble(two_brokers("b-1", "b-1", 0), &AssembleOptions::default()).unwrap();
    let pairs: Vec<(&str, Option<&str>)> = t
        .clocks
        .iter()
        .map(|c| (c.client.as_str(), c.broker.as_ref().map(|b| b.as_str())))
        .collect();
    assert_eq!(pairs, [("c-1", Some("b-1")), ("shop", Some("b-up"))]);
    let c1 = &t.clocks[0];
    assert!((c1.offset_nanos + 40_000_000).unsigned_abs() <= c1.bound_nanos);
    assert_eq!(
        t.hop("store").unwrap().broker.as_ref().unwrap().as_str(),
        "b-up"
    );
    assert_eq!(
        t.hop("deliver/g/c-1/1")
            .unwrap()
            .broker
            .as_ref()
            .unwrap()
            .as_str(),
        "b-1"
    );
    let process = t.hop("process/g/c-1/1").unwrap();
    assert!(process.on_broker_clock.is_some());
    assert_eq!(t.audit(), Vec::<String>::new());
    let json = serde_json::to_string(&t).unwrap();
    assert!(json.contains(r#""broker":"b-1""#), "{json}");
}

/// A delivery sent by one broker and settled at another (300 ms apart on their clocks) has
/// its broker times on two clocks: pairing them would give the consumer an offset off by
/// about 150 ms. No estimate comes of it, and the audit does not ask for one.
#[test]
fn two_brokers_with_different_clocks_never_mix() {
    let t =
        Trajectory::assemble(two_brokers("b-1", "b-2", 300), &AssembleOptions::default()).unwrap();
    assert!(
        t.clocks.iter().all(|c| c.client.as_str() != "c-1"),
        "{:?}",
        t.clocks
    );
    assert!(t.hop("deliver/g/c-1/1").unwrap().clock.is_none());
    let process = t.hop("process/g/c-1/1").unwrap();
    assert!(process.on_broker_clock.is_none() && process.arrival_nanos.is_none());
    assert_eq!(t.audit(), Vec::<String>::new());
    // The same records without instances (brokers that predate them) pair as before: the
    // mixed clocks then show as an estimate far off the truth.
    let mut anonymous = two_brokers("b-1", "b-2", 300);
    for r in &mut anonymous {
        r.broker = None;
    }
    let t = Trajectory::assemble(anonymous, &AssembleOptions::default()).unwrap();
    let c1 = t
        .clocks
        .iter()
        .find(|c| c.client.as_str() == "c-1")
        .unwrap();
    assert!(
        (c1.offset_nanos + 40_000_000).unsigned_abs() > 100_000_000,
        "{c1:?}"
    );
}

/// One client's exchanges with two broker instances give two estimates, each against its
/// own instance; each process hop is placed with the estimate of its own delivery's broker.
#[test]
fn a_client_has_one_best_estimate_per_broker_instance() {
    let mut recs = two_brokers("b-1", "b-1", 0);
    // Attempt 2 through b-2, whose clock is 300 ms ahead of b-1's.
    recs.extend([
        on(at(dl(Stage::PullSent, 0, "g", "c-1", 2), 20.0, 300), "b-2"),
        at(dl(Stage::PullReceived, 0, "g", "c-1", 2), 20.5, -40),
        with_outcome(
            at(dl(Stage::PullAckSent, 0, "g", "c-1", 2), 21.0, -40),
            "ack",
            None,
        ),
        with_outcome(
            on(
                at(dl(Stage::PullAckReceived, 0, "g", "c-1", 2), 21.5, 300),
                "b-2",
            ),
            "ack",
            None,
        ),
    ]);
    let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
    let of = |b: &str| {
        t.clocks
            .iter()
            .find(|c| c.client.as_str() == "c-1" && c.broker.as_ref().unwrap().as_str() == b)
            .unwrap_or_else(|| panic!("no estimate against {b}: {:?}", t.clocks))
    };
    assert!((of("b-1").offset_nanos + 40_000_000).unsigned_abs() <= of("b-1").bound_nanos);
    assert!((of("b-2").offset_nanos + 340_000_000).unsigned_abs() <= of("b-2").bound_nanos);
    let arrival = |key: &str| t.hop(key).unwrap().arrival_nanos.unwrap();
    assert!((arrival("process/g/c-1/1") - 400_000).abs() <= 500_000);
    assert!((arrival("process/g/c-1/2") - 500_000).abs() <= 500_000);
}

/// The broker's P3 never arrived (or arrived after the delivery): the store hop ends at
/// JetStream's stored time, carried on the C5, and the audit holds.
#[test]
fn a_delivery_carries_the_stored_time_that_ends_the_store_hop() {
    let stored_at = T0 + 2 * MS;
    let mut c5 = dl(Stage::PullSent, 10, "g", "c", 1);
    c5.stored_at = Some(stored_at);
    let rest = [
        dl(Stage::PullReceived, 11, "g", "c", 1),
        with_outcome(dl(Stage::PullAckSent, 12, "g", "c", 1), "ack", None),
        with_outcome(dl(Stage::PullAckReceived, 13, "g", "c", 1), "ack", None),
    ];
    let upload = [
        up(Stage::UploadSent, 0, false),
        up(Stage::UploadReceived, 1, true),
    ];
    // P3 missing.
    let recs: Vec<StageRecord> = upload
        .iter()
        .cloned()
        .chain([c5.clone()])
        .chain(rest.clone())
        .collect();
    let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
    let store = t.hop("store").unwrap();
    assert_eq!(
        (store.end, store.stored_at),
        (Some(stored_at), Some(stored_at))
    );
    assert_eq!(store.status, HopStatus::Ok);
    assert_eq!(t.audit(), Vec::<String>::new());
    // P3 after the delivery (the PubAck came late): the stored time ends the hop.
    let late_p3 = up(Stage::Stored, 20, true);
    let recs: Vec<StageRecord> = upload
        .iter()
        .cloned()
        .chain([late_p3, c5.clone()])
        .chain(rest.clone())
        .collect();
    let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
    let store = t.hop("store").unwrap();
    assert_eq!(
        (store.end, store.stored_at),
        (Some(stored_at), Some(stored_at))
    );
    assert!(store.events.iter().any(|r| r.stage == Stage::Stored));
    assert_eq!(t.audit(), Vec::<String>::new());
    // No store record at all: the store hop is the instant JetStream stored it.
    let recs: Vec<StageRecord> = [c5].into_iter().chain(rest).collect();
    let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
    let store = t.hop("store").unwrap();
    assert_eq!((store.start, store.end), (stored_at, Some(stored_at)));
    assert_eq!(store.stored_at, Some(stored_at));
    assert_eq!(t.audit(), Vec::<String>::new());
}

/// A stored time later than the delivery (the nats-server's clock ahead of the broker's)
/// cannot end the store hop: the delivery does, as without it.
#[test]
fn a_stored_time_after_the_delivery_is_not_used() {
    let mut c5 = dl(Stage::PullSent, 10, "g", "c", 1);
    c5.stored_at = Some(T0 + 11 * MS);
    let recs = vec![
        up(Stage::UploadSent, 0, false),
        up(Stage::UploadReceived, 1, true),
        c5,
    ];
    let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
    let store = t.hop("store").unwrap();
    assert_eq!((store.end, store.stored_at), (Some(T0 + 10 * MS), None));
    assert_eq!(t.audit(), Vec::<String>::new());
}

/// With the producer's offset known, the diagnosis gives its send time on the broker's
/// clock and the durations from it as uncertain; the raw producer times (250 ms ahead)
/// would have said the message was stored before it was sent.
#[test]
fn the_diagnosis_uses_times_on_the_brokers_clock() {
    let t =
        Trajectory::assemble(two_brokers("b-1", "b-1", 0), &AssembleOptions::default()).unwrap();
    let d = &t.diagnosis;
    // The producer sent at true 0 ms: estimated 0.1 ms earlier (within the bound) on the
    // broker's clock, not at the raw .250.
    assert!(d.contains("sent by shop ≈ 12:00:00.999 ± 1.1 ms"), "{d}");
    // Stored at 3 ms: about 3 ms after sending, within the bound; acked at 12.6 ms.
    assert!(
        d.contains("stored 12:00:01.003 (≈ 3.1 ms ± 1.1 ms after sending)"),
        "{d}"
    );
    assert!(
        d.contains("group g done ≈ 13 ms ± 1.1 ms end to end"),
        "{d}"
    );
    // Without the producer's P4 there is no offset: raw times, as recorded.
    let recs: Vec<StageRecord> = two_brokers("b-1", "b-1", 0)
        .into_iter()
        .filter(|r| r.stage != Stage::StoreConfirmed)
        .collect();
    let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
    assert!(
        t.diagnosis.contains("sent by shop 12:00:01.250"),
        "{}",
        t.diagnosis
    );
}
