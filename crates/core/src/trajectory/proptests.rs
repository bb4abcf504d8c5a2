//! Property tests of the promise the module makes: any permutation or duplication of a
//! record set gives the same trajectory (and the same summary assembly).

use super::*;
use crate::ids::{ClientId, RequestId};
use crate::stage::Stage;
use proptest::prelude::*;
use proptest::sample::Index;

const T0: u64 = 1_796_126_401_000_000_000;
const MS: u64 = 1_000_000;

/// The outcome texts a record of `stage` may carry: the stage's own, an unknown one, none.
fn outcomes(stage: Stage) -> &'static [Option<&'static str>] {
    match stage {
        Stage::UploadReceived | Stage::Stored => &[None, Some("refused"), Some("recovered")],
        Stage::StoreConfirmed => &[None, Some("duplicate")],
        Stage::PushAckSent
        | Stage::PushAckReceived
        | Stage::PullAckSent
        | Stage::PullAckReceived => &[None, Some("ack"), Some("nack"), Some("term"), Some("weird")],
        Stage::ProcessFinished => &[None, Some("ok"), Some("failed")],
        Stage::Channel => &[Some("opened"), Some("expired")],
        Stage::Redelivery => &[None, Some("redeliver"), Some("dead_letter")],
        _ => &[None],
    }
}

/// One record of one message: coarse times (so that ties happen), two groups and two
/// consumers or none, attempts 1–3 or none, any outcome its stage may carry, deliveries of
/// a fetch by message ID or of a subscription.
pub(super) fn arb_record() -> impl Strategy<Value = StageRecord> {
    (
        any::<Index>(),
        0u64..40,
        0usize..3,
        0usize..3,
        0u32..4,
        any::<Index>(),
        any::<bool>(),
        0u8..3,
        any::<bool>(),
    )
        .prop_map(
            |(stage, ms, g, c, attempt, outcome, with_id, detail, by_id)| {
                let stage = Stage::ALL[stage.index(Stage::ALL.len())];
                let mut r = StageRecord::at(stage, T0 + ms * MS);
                let names = ["alpha", "beta"];
                r.group = names.get(g).map(|n| crate::GroupId::new(*n).unwrap());
                r.consumer = ["c-1", "c-2"].get(c).map(|n| ClientId::new(*n).unwrap());
                r.attempt = (attempt > 0).then_some(attempt);
                let choices = outcomes(stage);
                r.outcome = choices[outcome.index(choices.len())].map(str::to_owned);
                r.detail = (detail > 0).then(|| format!("detail {detail}"));
                if with_id || !matches!(stage, Stage::UploadSent | Stage::UploadReceived) {
                    r.message_id = Some("0193a5f2-7c1e-7b2a-9f10-3c4d5e6f7a8b".parse().unwrap());
                }
                r.request_id = Some(RequestId::new("req-1").unwrap());
                r.producer = Some(ClientId::new("shop").unwrap());
                r.service = (ms % 3 == 0).then(|| "svc".to_owned());
                r.by_id = by_id
                    && matches!(
                        stage,
                        Stage::PullSent
                            | Stage::PullReceived
                            | Stage::PullAckSent
                            | Stage::PullAckReceived
                            | Stage::ProcessStarted
                            | Stage::ProcessFinished
                            | Stage::Redelivery
                    );
                r
            },
        )
}

/// A record set, and the same set shuffled with some of its records repeated.
fn arb_set_and_variant() -> impl Strategy<Value = (Vec<StageRecord>, Vec<StageRecord>)> {
    prop::collection::vec(arb_record(), 1..24).prop_flat_map(|recs| {
        let repeats = prop::collection::vec(any::<Index>(), 0..8);
        (Just(recs.clone()), repeats).prop_flat_map(|(recs, repeats)| {
            let mut variant = recs.clone();
            variant.extend(repeats.iter().map(|i| recs[i.index(recs.len())].clone()));
            (Just(recs), Just(variant).prop_shuffle())
        })
    })
}

fn options(now_ms: Option<u64>) -> AssembleOptions {
    AssembleOptions {
        now: now_ms.map(|ms| T0 + ms * MS),
        deadlines: Deadlines {
            stored_ms: 5,
            delivered_ms: 20,
            acked_ms: 10,
            processed_ms: 10,
        },
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_permutation_or_duplication_gives_the_same_trajectory_with_unique_spans(
        (recs, variant) in arb_set_and_variant(),
        now_ms in prop::option::of(0u64..200),
    ) {
        let o = options(now_ms);
        let base = Trajectory::assemble(recs.clone(), &o).unwrap();
        prop_assert_eq!(&Trajectory::assemble(variant.clone(), &o).unwrap(), &base);
        let spans: std::collections::BTreeSet<&str> =
            base.hops.iter().filter_map(|h| h.span_id.as_deref()).collect();
        if base.message_id.is_some() {
            prop_assert_eq!(spans.len(), base.hops.len(), "one span ID per hop");
        }
        let lite = Trajectory::assemble_for_summary(recs, &o).unwrap();
        prop_assert_eq!(Trajectory::assemble_for_summary(variant, &o).unwrap(), lite);
    }
}

use super::invariants::causal_violations;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn no_trajectory_regresses_or_delivers_before_deliverable(
        recs in prop::collection::vec(arb_record(), 1..24),
        recovered_ms in prop::option::of(0u64..40),
        now_ms in prop::option::of(0u64..200),
    ) {
        let mut recs = recs;
        if let Some(ms) = recovered_ms {
            let mut r = StageRecord::at(Stage::Stored, T0 + ms * MS);
            r.message_id = Some("0193a5f2-7c1e-7b2a-9f10-3c4d5e6f7a8b".parse().unwrap());
            r.outcome = Some(RECOVERED.into());
            recs.push(r);
        }
        let t = Trajectory::assemble(recs, &options(now_ms)).unwrap();
        let v = causal_violations(&t);
        prop_assert!(v.is_empty(), "{v:?} in {t:#?}");
    }
}
