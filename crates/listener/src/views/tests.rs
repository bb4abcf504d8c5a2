//! The views over hand-made trajectories: what each number counts.

use super::dead_letters::of_trajectory;
use super::groups::{count, of_sample};
use crate::summary::MessageSummary;
use msgtrail_core::trajectory::{AssembleOptions, MessageState, Trajectory};
use msgtrail_core::{ClientId, MessageId, Stage, StageRecord};

const T0: u64 = 1_800_000_000_000_000_000;
const MS: u64 = 1_000_000;

fn id(i: u64) -> MessageId {
    MessageId::from_u128((u128::from(T0 / MS + i) << 80) | (0x7 << 76) | (2 << 62) | u128::from(i))
        .unwrap()
}

fn rec(stage: Stage, m: MessageId, at: u64) -> StageRecord {
    let mut r = StageRecord::at(stage, at);
    r.message_id = Some(m);
    r.topic = Some("orders".into());
    r
}

/// A stored message `i`, then each delivery attempt to `g` by the consumer named: its
/// processing fails (`false`) or succeeds; a failed last attempt is dead-lettered when
/// `dead` says why.
fn message(i: u64, attempts: &[(&str, bool)], dead: Option<&str>) -> Trajectory {
    let m = id(i);
    let t = T0 + i * 100 * MS;
    let mut recs = vec![
        rec(Stage::UploadReceived, m, t),
        rec(Stage::Stored, m, t + MS),
    ];
    for (a, (consumer, ok)) in attempts.iter().enumerate() {
        let at = t + 10 * MS * (a as u64 + 1);
        let d = |stage: Stage, at: u64| {
            let mut r = rec(stage, m, at);
            r.group = Some(msgtrail_core::GroupId::new("g").unwrap());
            r.consumer = Some(ClientId::new(*consumer).unwrap());
            r.attempt = Some(a as u32 + 1);
            r
        };
        recs.push(d(Stage::PullSent, at));
        recs.push(d(Stage::PullReceived, at + MS));
        let mut x2 = d(Stage::ProcessFinished, at + 2 * MS);
        x2.outcome = Some(if *ok { "ok" } else { "failed" }.into());
        x2.detail = (!ok).then(|| "card declined".into());
        recs.push(x2);
        recs.push(d(Stage::PullAckSent, at + 3 * MS));
        let mut c8 = d(Stage::PullAckReceived, at + 4 * MS);
        c8.outcome = Some(if *ok { "ack" } else { "nack" }.into());
        recs.push(c8);
        let last = a + 1 == attempts.len();
        if !ok && (!last || dead.is_some()) {
            let mut r1 = d(Stage::Redelivery, at + 5 * MS);
            r1.outcome = Some(if last { "dead_letter" } else { "redeliver" }.into());
            r1.detail = dead.filter(|_| last).map(str::to_owned);
            recs.push(r1);
        }
    }
    Trajectory::assemble(recs, &AssembleOptions::default()).unwrap()
}

fn summaries(ts: &[Trajectory]) -> Vec<MessageSummary> {
    ts.iter()
        .map(|t| MessageSummary::of(&t.message_id.unwrap().to_string(), t))
        .collect()
}

#[test]
fn group_counts_backlog_rates_and_dead_letters() {
    let ts = [
        message(0, &[("c1", false), ("c2", true)], None),
        message(1, &[("c1", false)], Some("3 attempts")),
        message(2, &[("c2", false)], None),
        message(3, &[], None),
        message(4, &[("c1", true)], None),
    ];
    assert_eq!(ts[1].state, MessageState::DeadLettered);
    let now = T0 + 11 * 1_000 * MS;
    let got = count(&summaries(&ts), now);
    assert_eq!(got.len(), 1, "{got:?}");
    let g = &got[0];
    assert_eq!((g.group.as_str(), g.messages), ("g", 4));
    assert_eq!((g.consumed, g.dead_letters), (2, 1));
    // Failed, waiting for a redelivery: not settled; message 3 is stored, not delivered.
    assert_eq!(
        (g.in_flight, g.unsettled, g.not_delivered, g.backlog),
        (0, 1, 1, 2)
    );
    // Two consumed over the 11 s since the first message.
    assert!((g.ack_rate_per_sec - 2.0 / 11.0).abs() < 1e-9, "{g:?}");
}

/// The counts of messages split over members (each message in one share) are those of all
/// of them: a share whose only message of the topic the group did not get (message 3) still
/// counts in the group's backlog once merged, and the ack rate is over the oldest message.
#[test]
fn group_tallies_of_a_split_add_up_to_the_whole() {
    use super::group_share::Tally;
    let ts = [
        message(0, &[("c1", false), ("c2", true)], None),
        message(1, &[("c1", false)], Some("3 attempts")),
        message(2, &[("c2", false)], None),
        message(3, &[], None),
        message(4, &[("c1", true)], None),
    ];
    let all = summaries(&ts);
    let now = T0 + 11 * 1_000 * MS;
    let mut merged = Tally::of(&[all[3].clone(), all[4].clone()]);
    merged.add(&Tally::of(&all[..3]));
    assert_eq!(merged.counts(now), count(&all, now));
    // Alone, the share of messages 3 and 4 would not know message 3 is the group's topic's.
    let lone = Tally::of(&[all[3].clone()]).counts(now);
    assert!(lone.is_empty(), "{lone:?}");
}

/// A sample split over members gives the members, redeliveries and percentiles of the
/// whole.
#[test]
fn sample_parts_of_a_split_add_up_to_the_whole() {
    use super::group_share::SampleParts;
    let ts = [
        message(0, &[("c1", false), ("c2", true)], None),
        message(1, &[("c1", false)], Some("3 attempts")),
        message(4, &[("c1", true)], None),
    ];
    let mut merged = SampleParts::of("g", &ts[1..]);
    merged.add(SampleParts::of("g", &ts[..1]));
    assert_eq!(merged.detail(empty_counts()), of_sample("g", &ts));
}

fn empty_counts() -> super::groups::GroupCounts {
    super::groups::empty("g")
}

#[test]
fn members_redeliveries_and_segments_of_a_sample() {
    let ts = [
        message(0, &[("c1", false), ("c2", true)], None),
        message(4, &[("c1", true)], None),
    ];
    let d = of_sample("g", &ts);
    assert_eq!((d.sample, d.redeliveries), (2, 1));
    let members: Vec<(&str, u64)> = d
        .members
        .iter()
        .map(|m| (m.consumer.as_str(), m.deliveries))
        .collect();
    // c1 was seen last (message 4 is the newer one).
    assert_eq!(members, [("c1", 2), ("c2", 1)]);
    let seg = |name: &str| d.segments.iter().find(|s| s.segment == name).unwrap();
    // Stored at +1 ms, first delivery at +10 ms.
    assert_eq!(
        (seg("queue_wait").count, seg("queue_wait").p50_ms),
        (2, 9.0)
    );
    assert_eq!((seg("deliver").count, seg("deliver").max_ms), (3, 4.0));
    assert_eq!(seg("process").count, 3);
    assert!(of_sample("other", &ts).members.is_empty());
}

#[test]
fn a_dead_letter_says_who_gave_up_and_why() {
    let t = message(1, &[("c1", false), ("c2", false)], Some("3 attempts"));
    let d = of_trajectory("k", &t);
    assert_eq!(d.len(), 1, "{d:?}");
    let d = &d[0];
    assert_eq!(d.group.as_ref().map(|g| g.as_str()), Some("g"));
    assert_eq!(d.consumer.as_ref().map(|c| c.as_str()), Some("c2"));
    assert_eq!(
        (d.attempt, d.reason.as_deref()),
        (Some(2), Some("3 attempts"))
    );
    assert_eq!(d.last_error.as_deref(), Some("card declined"));
    assert_eq!(d.at, T0 + 100 * MS + 25 * MS);
    assert!(of_trajectory("k", &message(0, &[("c1", true)], None)).is_empty());
}
