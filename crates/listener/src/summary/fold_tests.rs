//! The folded summary against the assembly: random messages (uploads answered or not,
//! retried, one or two groups by push, pull or fetch by ID, attempts that fail, are
//! redelivered or dead-lettered, records missing), their records folded one at a time in a
//! random order with repeats; after every record, whenever [`Folded::summary`] decides, it
//! equals [`MessageSummary::of`] the assembled records so far — at a time within the
//! deadlines and at one long past them.

use super::{Folded, MessageSummary};
use msgtrail_core::trajectory::{AssembleOptions, Deadlines, Trajectory};
use msgtrail_core::{ClientId, MessageId, RequestId, Stage, StageRecord};
use proptest::prelude::*;
use std::collections::HashSet;

const T0: u64 = 1_800_000_000_000_000_000;
const MS: u64 = 1_000_000;

/// One group's consumption.
#[derive(Debug, Clone)]
struct Consumption {
    push: bool,
    by_id: bool,
    /// Attempts that fail before the last one.
    failures: u32,
    /// The last attempt fails too.
    last_fails: bool,
    /// A failed last attempt is dead-lettered (else nothing follows it).
    dead: bool,
}

/// How one message goes.
#[derive(Debug, Clone)]
struct Shape {
    /// The broker answered (a message ID exists).
    answered: bool,
    /// The producer retried (a second P1 and a D1).
    retried: bool,
    groups: Vec<Consumption>,
    /// Records dropped (by index, modulo the count).
    dropped: Vec<usize>,
    /// All records within a few instants (ties on time).
    crowded: bool,
}

fn consumption() -> impl Strategy<Value = Consumption> {
    (
        any::<bool>(),
        prop::bool::weighted(0.2),
        0u32..3,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(push, by_id, failures, last_fails, dead)| Consumption {
            push,
            by_id,
            failures,
            last_fails,
            dead,
        })
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        prop::bool::weighted(0.9),
        prop::bool::weighted(0.2),
        prop::collection::vec(consumption(), 0..3),
        prop::collection::vec(0usize..64, 0..3),
        prop::bool::weighted(0.15),
    )
        .prop_map(|(answered, retried, groups, dropped, crowded)| Shape {
            answered,
            retried,
            groups,
            dropped,
            crowded,
        })
}

/// The records of a message shaped as `s`, and its key.
fn message(s: &Shape) -> (String, Vec<StageRecord>) {
    let producer = ClientId::new("p").unwrap();
    let request = RequestId::new("r").unwrap();
    let m =
        MessageId::from_u128((u128::from(T0 / MS) << 80) | (0x7 << 76) | (2 << 62) | 1).unwrap();
    let upload = |stage: Stage, at: u64| {
        let mut r = StageRecord::at(stage, at);
        r.producer = Some(producer.clone());
        r.request_id = Some(request.clone());
        r.topic = Some("orders".into());
        if stage != Stage::UploadSent {
            r.message_id = Some(m);
        }
        r
    };
    let mut out = Vec::new();
    let mut p1 = upload(Stage::UploadSent, T0);
    p1.attempt = Some(1);
    out.push(p1);
    if !s.answered {
        let key = format!("orphan/{}/{}", producer.as_str(), request.as_str());
        return (key, out);
    }
    let mut p2 = upload(Stage::UploadReceived, T0 + MS / 10);
    p2.attrs.insert("kind".into(), "a".into());
    out.push(p2);
    out.push(upload(Stage::Stored, T0 + 2 * MS / 10));
    out.push(upload(Stage::StoreConfirmed, T0 + 3 * MS / 10));
    if s.retried {
        let mut p1b = upload(Stage::UploadSent, T0 + 5 * MS);
        p1b.message_id = None;
        p1b.attempt = Some(2);
        out.push(p1b);
        let mut d1 = upload(Stage::Duplicate, T0 + 5 * MS + MS / 10);
        d1.attempt = Some(2);
        out.push(d1);
    }
    for (gi, g) in s.groups.iter().enumerate() {
        let group = msgtrail_core::GroupId::new(format!("g{gi}")).unwrap();
        let consumer = ClientId::new(format!("c{gi}")).unwrap();
        let stages = if g.push {
            [
                Stage::PushSent,
                Stage::PushReceived,
                Stage::PushAckSent,
                Stage::PushAckReceived,
            ]
        } else {
            [
                Stage::PullSent,
                Stage::PullReceived,
                Stage::PullAckSent,
                Stage::PullAckReceived,
            ]
        };
        let last = g.failures + 1;
        for a in 1..=last {
            let at = T0 + u64::from(a) * 10 * MS + gi as u64 * MS;
            let fails = a < last || g.last_fails;
            let rec = |stage: Stage, at: u64| {
                let mut r = StageRecord::at(stage, at);
                r.message_id = Some(m);
                r.topic = Some("orders".into());
                r.group = Some(group.clone());
                r.consumer = Some(consumer.clone());
                r.attempt = Some(a);
                r.by_id = g.by_id;
                r
            };
            out.push(rec(stages[0], at));
            out.push(rec(stages[1], at + 100_000));
            out.push(rec(Stage::ProcessStarted, at + 200_000));
            let mut x2 = rec(Stage::ProcessFinished, at + 300_000);
            x2.outcome = Some(if fails { "failed" } else { "ok" }.into());
            if fails {
                x2.detail = Some(format!("boom {a}"));
            }
            out.push(x2);
            let settle = if fails { "nack" } else { "ack" };
            let mut c3 = rec(stages[2], at + 400_000);
            c3.outcome = Some(settle.into());
            out.push(c3);
            let mut c4 = rec(stages[3], at + 500_000);
            c4.outcome = Some(settle.into());
            out.push(c4);
            if fails && (a < last || g.dead) {
                let mut r1 = rec(Stage::Redelivery, at + 600_000);
                let dead = a == last;
                r1.outcome = Some(if dead { "dead_letter" } else { "redeliver" }.into());
                r1.detail = dead.then(|| "max deliveries".to_owned());
                out.push(r1);
            }
        }
    }
    for d in &s.dropped {
        if out.len() > 1 {
            out.remove(d % out.len());
        }
    }
    if s.crowded {
        for (i, r) in out.iter_mut().enumerate() {
            r.at = T0 + (i as u64 % 3) * MS;
        }
    }
    (m.to_string(), out)
}

/// A message's records, an arrival order with repeats, and whether `now` is long past.
fn workload() -> impl Strategy<Value = (Shape, Vec<usize>, bool)> {
    shape().prop_flat_map(|s| {
        let n = message(&s).1.len();
        let order = Just((0..n).collect::<Vec<usize>>()).prop_shuffle();
        let repeats = prop::collection::vec(0..n, 0..n / 2 + 1);
        (Just(s), order, repeats, any::<bool>()).prop_map(|(s, mut order, repeats, late)| {
            for (k, r) in repeats.into_iter().enumerate() {
                let at = (k * 5 + r) % (order.len() + 1);
                order.insert(at, r);
            }
            (s, order, late)
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn folded_summaries_match_the_assembled_ones((s, order, late) in workload()) {
        let (key, recs) = message(&s);
        let now = if late { T0 + 3_600_000 * MS } else { T0 + 200 * MS };
        let deadlines = Deadlines::default();
        let opts = AssembleOptions { now: Some(now), deadlines };
        let mut folded = Folded::default();
        let mut held: Vec<StageRecord> = Vec::new();
        let mut seen = HashSet::new();
        let mut decided = None;
        for i in order {
            let r = &recs[i];
            // The store folds a record once (a repeat has the dedup key of one it holds).
            if !seen.insert(r.dedup_key()) {
                continue;
            }
            folded.fold(r);
            held.push(r.clone());
            let want = Trajectory::assemble(held.clone(), &opts).map(|t| MessageSummary::of(&key, &t));
            decided = folded.summary(&key, now, &deadlines);
            if let Some(got) = &decided {
                prop_assert_eq!(Some(got), want.as_ref());
            }
        }
        prop_assert_eq!(&Folded::of(&held), &folded);
        // The production shape (every record there, in time, no ties) is always decided.
        if !late && !s.crowded && s.dropped.is_empty() {
            prop_assert!(decided.is_some(), "undecided: {:?}", s);
        }
    }
}
