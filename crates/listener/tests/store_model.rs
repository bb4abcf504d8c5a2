//! The store against a plain in-memory reference: random record sets — shuffled, with
//! repeats, split into batches applied across restarts, orphan uploads whose P2 comes
//! before or after their P1, or never — give the same trajectories, summaries and counters
//! as assembling each message's records at once; and a search by the summary's flags
//! (failure, redelivery, dead letter, attribute) finds what the trajectories say.

use msgtrail_core::trajectory::{AssembleOptions, Deadlines, MessageState, Trajectory};
use msgtrail_core::{ClientId, MessageId, RequestId, Stage, StageRecord};
use msgtrail_listener::MessageSummary;
use msgtrail_listener::SearchQuery;
use msgtrail_listener::Store;
use msgtrail_listener::{had_failure, redelivered};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

const T0: u64 = 1_800_000_000_000_000_000;
const MS: u64 = 1_000_000;

/// How one message goes: which stages happen, in one group.
#[derive(Debug, Clone)]
struct Shape {
    /// The broker answered the upload (P2 and later happen).
    answered: bool,
    /// Delivery attempts in the group (0: never delivered).
    attempts: u32,
    /// The last attempt's processing fails.
    fails: bool,
    /// The producer retried the upload (a D1).
    duplicate: bool,
    /// A last attempt that fails is dead-lettered (an R1 `dead_letter`).
    dead: bool,
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        any::<bool>(),
        0u32..3,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(a, attempts, fails, duplicate, dead)| Shape {
            answered: a || attempts > 0,
            attempts,
            fails,
            duplicate,
            dead,
        })
}

/// The records of message `i` shaped as `s`.
fn records(i: u64, s: &Shape) -> Vec<StageRecord> {
    let t = T0 + i * 10 * MS;
    let producer = ClientId::new(format!("p{}", i % 2)).unwrap();
    let request = RequestId::new(format!("r{i}")).unwrap();
    let upload = |stage: Stage, at: u64| {
        let mut r = StageRecord::at(stage, at);
        r.producer = Some(producer.clone());
        r.request_id = Some(request.clone());
        r.topic = Some(format!("t{}", i % 3));
        r
    };
    let mut p1 = upload(Stage::UploadSent, t);
    p1.attempt = Some(1);
    let mut out = vec![p1];
    if !s.answered {
        return out;
    }
    let m =
        MessageId::from_u128((u128::from(t / MS) << 80) | (0x7 << 76) | (2 << 62) | u128::from(i))
            .unwrap();
    for (stage, dt) in [
        (Stage::UploadReceived, 1),
        (Stage::Stored, 2),
        (Stage::StoreConfirmed, 3),
    ] {
        let mut r = upload(stage, t + dt * 100_000);
        r.message_id = Some(m);
        if stage == Stage::UploadReceived {
            r.attrs.insert("kind".into(), format!("k{}", i % 2));
        }
        out.push(r);
    }
    if s.duplicate {
        let mut d = upload(Stage::Duplicate, t + 4 * 100_000);
        d.message_id = Some(m);
        d.attempt = Some(2);
        out.push(d);
    }
    for a in 1..=s.attempts {
        let at = t + u64::from(a) * MS;
        let fails = a < s.attempts || s.fails;
        let deliver = |stage: Stage, at: u64| {
            let mut r = StageRecord::at(stage, at);
            r.message_id = Some(m);
            r.group = Some(msgtrail_core::GroupId::new("g").unwrap());
            r.consumer = Some(ClientId::new("c").unwrap());
            r.attempt = Some(a);
            r
        };
        out.push(deliver(Stage::PullSent, at));
        out.push(deliver(Stage::PullReceived, at + 10_000));
        out.push(deliver(Stage::ProcessStarted, at + 20_000));
        let mut x2 = deliver(Stage::ProcessFinished, at + 30_000);
        x2.outcome = Some(if fails { "failed" } else { "ok" }.into());
        out.push(x2);
        let mut c8 = deliver(Stage::PullAckReceived, at + 40_000);
        c8.outcome = Some(if fails { "nack" } else { "ack" }.into());
        out.push(c8);
        if fails && (a < s.attempts || s.dead) {
            let mut r1 = deliver(Stage::Redelivery, at + 50_000);
            let dead = a == s.attempts;
            r1.outcome = Some(if dead { "dead_letter" } else { "redeliver" }.into());
            out.push(r1);
        }
    }
    out
}

/// A workload: messages, the order their records arrive in (indexes into the flat list,
/// repeats allowed), and where batches and restarts fall.
fn workload() -> impl Strategy<Value = (Vec<StageRecord>, Vec<usize>, Vec<usize>, Vec<bool>)> {
    proptest::collection::vec(shape(), 1..8).prop_flat_map(|shapes| {
        let recs: Vec<StageRecord> = shapes
            .iter()
            .enumerate()
            .flat_map(|(i, s)| records(i as u64, s))
            .collect();
        let n = recs.len();
        let order = Just((0..n).collect::<Vec<usize>>()).prop_shuffle();
        let repeats = proptest::collection::vec(0..n, 0..n / 2 + 1);
        let cuts = proptest::collection::vec(1usize..6, 1..n + 1);
        let restarts = proptest::collection::vec(any::<bool>(), 1..n + 1);
        (Just(recs), order, repeats, cuts, restarts).prop_map(
            |(recs, mut order, repeats, cuts, restarts)| {
                // Repeats land anywhere later (a redelivered batch, a retried report).
                for (k, r) in repeats.into_iter().enumerate() {
                    let at = (k * 7 + r) % (order.len() + 1);
                    order.insert(at, r);
                }
                (recs, order, cuts, restarts)
            },
        )
    })
}

/// The reference: every message's records at once, keyed as the store keys them.
fn reference(recs: &[StageRecord], now: u64) -> BTreeMap<String, Trajectory> {
    let mut by_request: BTreeMap<(String, String), MessageId> = BTreeMap::new();
    for r in recs {
        if let (Some(m), Some(p), Some(q)) = (r.message_id, &r.producer, &r.request_id) {
            by_request.insert((p.as_str().into(), q.as_str().into()), m);
        }
    }
    let mut groups: BTreeMap<String, Vec<StageRecord>> = BTreeMap::new();
    for r in recs {
        let key = match (r.message_id, &r.producer, &r.request_id) {
            (Some(m), _, _) => m.to_string(),
            (None, Some(p), Some(q)) => {
                match by_request.get(&(p.as_str().into(), q.as_str().into())) {
                    Some(m) => m.to_string(),
                    None => format!("orphan/{}/{}", p.as_str(), q.as_str()),
                }
            }
            _ => continue,
        };
        groups.entry(key).or_default().push(r.clone());
    }
    let opts = AssembleOptions {
        now: Some(now),
        deadlines: Deadlines::default(),
    };
    groups
        .into_iter()
        .filter_map(|(k, rs)| Trajectory::assemble(rs, &opts).map(|t| (k, t)))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_the_reference((recs, order, cuts, restarts) in workload()) {
        let now = T0 + 3_600_000 * MS;
        let dir = tempfile::tempdir().unwrap();
        let open = || Store::open(dir.path(), 0, Deadlines::default()).unwrap();
        let mut store = open();
        let mut pos = 0;
        for (i, cut) in cuts.iter().cycle().enumerate() {
            if pos >= order.len() {
                break;
            }
            let end = (pos + cut).min(order.len());
            let batch: Vec<StageRecord> = order[pos..end].iter().map(|k| recs[*k].clone()).collect();
            store.apply(batch, now).unwrap();
            pos = end;
            if restarts[i % restarts.len()] {
                drop(store);
                store = open();
            }
        }
        let want = reference(&recs, now);
        // Trajectories.
        for (key, t) in &want {
            let got = store.trajectory(key, now).unwrap();
            prop_assert_eq!(got.as_ref(), Some(t), "trajectory of {}", key);
        }
        // Summaries: one per message, as the reference's.
        let found = store.search(&SearchQuery { limit: Some(10_000), ..Default::default() }).unwrap();
        let got: BTreeMap<String, MessageSummary> = found.into_iter().map(|s| (s.key.clone(), s)).collect();
        let expected: BTreeMap<String, MessageSummary> =
            want.iter().map(|(k, t)| (k.clone(), MessageSummary::of(k, t))).collect();
        prop_assert_eq!(&got, &expected);
        // Searches by the summary's flags find what the trajectories say.
        let keys = |q: SearchQuery| -> BTreeSet<String> {
            let q = SearchQuery { limit: Some(10_000), ..q };
            store.search(&q).unwrap().into_iter().map(|s| s.key).collect()
        };
        let traj = |f: &dyn Fn(&Trajectory) -> bool| -> BTreeSet<String> {
            want.iter().filter(|(_, t)| f(t)).map(|(k, _)| k.clone()).collect()
        };
        prop_assert_eq!(
            keys(SearchQuery { failed: true, ..Default::default() }),
            traj(&|t| had_failure(t))
        );
        prop_assert_eq!(
            keys(SearchQuery { redelivered: true, ..Default::default() }),
            traj(&|t| redelivered(t))
        );
        prop_assert_eq!(
            keys(SearchQuery { dead_lettered: true, ..Default::default() }),
            traj(&|t| t.groups.iter().any(|g| g.state == MessageState::DeadLettered))
        );
        let attr = ("kind".to_owned(), "k1".to_owned());
        prop_assert_eq!(
            keys(SearchQuery { attr: Some(attr.clone()), ..Default::default() }),
            traj(&|t| t.attrs.get(&attr.0) == Some(&attr.1))
        );
        // Counters: records per stage, each counted once; the funnel; the states.
        let counters = store.counters().unwrap();
        let distinct: BTreeSet<String> = recs.iter().map(|r| r.dedup_key()).collect();
        for stage in Stage::ALL {
            let n = recs
                .iter()
                .filter(|r| r.stage == *stage)
                .map(|r| r.dedup_key())
                .collect::<BTreeSet<_>>()
                .len() as u64;
            let c = counters.get(&format!("stage.{stage}")).copied().unwrap_or(0);
            prop_assert_eq!(c, n, "stage {}", stage);
        }
        prop_assert!(distinct.len() as u64 >= counters.get("stage.P1").copied().unwrap_or(0));
        for (i, step) in ["sent", "stored", "delivered", "acked"].iter().enumerate() {
            let n = expected.values().filter(|s| s.funnel[i]).count() as u64;
            let c = counters.get(&format!("funnel.{step}")).copied().unwrap_or(0);
            prop_assert_eq!(c, n, "funnel {}", step);
        }
        let mut states: BTreeMap<MessageState, u64> = BTreeMap::new();
        for s in expected.values() {
            *states.entry(s.state).or_default() += 1;
        }
        prop_assert_eq!(store.state_totals().unwrap(), states);
    }
}
