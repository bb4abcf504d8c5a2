//! A synthetic stage-record workload with the mix a production stage stream carries:
//! successes through pull and push groups, redeliveries after failed processing, dead
//! letters, duplicate uploads (D1), orphan uploads the broker never answered (P1 only), and
//! client reports that arrive after the broker's own records of later stages (out-of-order
//! batches).
//!
//! S4 ingests it (no NATS needed, so `--large` can store millions of messages) and the
//! listener's property tests use the same shapes. The generator is deterministic: a seed
//! gives the same records, in the same stage messages, every time.

use msgtrail_core::{ClientId, MessageId, RequestId, Stage, StageRecord};

/// How a workload is shaped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mix {
    /// Messages to generate.
    pub messages: u64,
    /// Share of messages whose first processing attempt fails and is redelivered.
    pub redelivered: f64,
    /// Share of messages that fail every attempt and are dead-lettered.
    pub dead_lettered: f64,
    /// Share of uploads retried with the same request ID (the broker writes a D1).
    pub duplicated: f64,
    /// Share of uploads the broker never answered (a P1 and nothing else).
    pub orphaned: f64,
    /// Share of messages consumed by a second (push) group besides the pull group.
    pub second_group: f64,
    /// Records per stage-stream message (the broker's stage batches).
    pub records_per_stage_message: usize,
    /// How far client reports lag the broker's records, in stage messages.
    pub client_lag: usize,
    /// The seed.
    pub seed: u64,
    /// Messages spread over all eight [`TOPICS`] and carrying a `region` attribute beside
    /// `category` (each drawn from the message number), so that searches select a fraction
    /// (S7). Off: the first three topics and `category` in turn, the shape S4's figures
    /// were measured on before S7.
    pub spread: bool,
}

impl Mix {
    /// The default mix for `messages` messages: 5 % redelivered, 1 % dead-lettered, 2 %
    /// duplicated, 2 % orphaned, 30 % in a second group; 128 records per stage message;
    /// spread over eight topics with a `region` and a `category` attribute.
    pub fn realistic(messages: u64) -> Self {
        Mix {
            messages,
            redelivered: 0.05,
            dead_lettered: 0.01,
            duplicated: 0.02,
            orphaned: 0.02,
            second_group: 0.3,
            records_per_stage_message: 128,
            client_lag: 2,
            seed: 0x5eed,
            spread: true,
        }
    }
}

impl Mix {
    /// The realistic mix on the shape S4 was measured on before S7 (not [`Mix::spread`]:
    /// three topics, one attribute), so that S4's figures stay comparable across rounds:
    /// the spread shape's `region` attribute adds about 70 bytes in use per stored message.
    pub fn narrow(messages: u64) -> Self {
        Mix {
            spread: false,
            ..Mix::realistic(messages)
        }
    }

    /// `messages` plain successes through one pull group: nothing redelivered, duplicated,
    /// orphaned or pushed, so every message has exactly ten records (P1–P4; sent, received,
    /// processing started and finished, ack sent and received), on three topics with one
    /// attribute (not [`Mix::spread`]: S4's store size per ten-record message stays
    /// comparable with the rounds before S7).
    pub fn plain(messages: u64) -> Self {
        Mix {
            redelivered: 0.0,
            dead_lettered: 0.0,
            duplicated: 0.0,
            orphaned: 0.0,
            second_group: 0.0,
            spread: false,
            ..Mix::realistic(messages)
        }
    }
}

/// A small deterministic generator (SplitMix64): enough for workload shapes.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// True with probability `p`.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// A number in `0..n` (`n` > 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// The topics of the workload, in four hierarchies (so that a topic pattern such as
/// `orders.*` selects a fraction of the messages); each message takes one at random.
pub(crate) const TOPICS: [&str; 8] = [
    "orders.created",
    "orders.paid",
    "orders.refund",
    "billing.invoice",
    "billing.dunning",
    "shipping.label",
    "shipping.track",
    "users.signup",
];
/// The values of the `region` attribute every stored message carries (one at random).
pub(crate) const REGIONS: [&str; 4] = ["eu-west", "eu-central", "us-east", "ap-south"];
/// The values of the `category` attribute every stored message carries (one at random).
pub(crate) const CATEGORIES: [&str; 2] = ["refund", "sale"];
/// Time between two messages' first records, nanoseconds (50,000 messages a second).
pub(crate) const MESSAGE_SPACING_NANOS: u64 = 20 * MICRO;
const MICRO: u64 = 1_000;

/// A message's topic, region (`None`: no `region` attribute) and category: spread, from its
/// number alone (a SplitMix64 hash, so that they are independent of each other and of the
/// mix's random draws); otherwise the first three topics and the categories in turn.
fn shape(i: u64, spread: bool) -> (usize, Option<usize>, usize) {
    if !spread {
        return ((i % 3) as usize, None, (i % 2) as usize);
    }
    let h = Rng::new(i ^ 0x70_1c5).next_u64();
    (
        (h % TOPICS.len() as u64) as usize,
        Some(((h >> 16) % REGIONS.len() as u64) as usize),
        ((h >> 32) % CATEGORIES.len() as u64) as usize,
    )
}

/// The records of one message, split by who writes them: the broker's records reach the
/// stage stream first, the clients' reports later.
#[derive(Debug, Default)]
struct MessageRecords {
    broker: Vec<StageRecord>,
    client: Vec<StageRecord>,
}

fn id(s: String) -> ClientId {
    ClientId::new(s).expect("generated client IDs are valid")
}

/// The records of message number `i`, starting at `t0` (Unix nanoseconds).
fn message(i: u64, t0: u64, mix: &Mix, rng: &mut Rng) -> MessageRecords {
    let mut out = MessageRecords::default();
    let producer = id(format!("producer-{}", i % 4));
    let request = RequestId::new(format!("req-{i}")).expect("generated request IDs are valid");
    let (t, region, category) = shape(i, mix.spread);
    let topic = TOPICS[t].to_owned();
    let base = |stage: Stage, at: u64| {
        let mut r = StageRecord::at(stage, at);
        r.topic = Some(topic.clone());
        r.producer = Some(producer.clone());
        r.request_id = Some(request.clone());
        r
    };
    let mut p1 = base(Stage::UploadSent, t0);
    p1.attempt = Some(1);
    p1.service = Some("shop".into());
    out.client.push(p1);
    if rng.chance(mix.orphaned) {
        return out;
    }
    let m = MessageId::from_u128(
        (u128::from(t0 / 1_000_000) << 80) | (0x7 << 76) | (2 << 62) | u128::from(i),
    )
    .expect("generated message IDs are UUIDv7");
    let mut p2 = base(Stage::UploadReceived, t0 + 60 * MICRO);
    p2.message_id = Some(m);
    p2.service = Some("msgtrail-broker".into());
    p2.attrs
        .insert("category".into(), CATEGORIES[category].into());
    if let Some(region) = region {
        p2.attrs.insert("region".into(), REGIONS[region].into());
    }
    p2.payload_size = Some(128);
    let mut p3 = base(Stage::Stored, t0 + 320 * MICRO);
    p3.message_id = Some(m);
    p3.stream_seq = Some(i + 1);
    let mut p4 = base(Stage::StoreConfirmed, t0 + 400 * MICRO);
    p4.message_id = Some(m);
    out.broker.extend([p2, p3]);
    out.client.push(p4);
    if rng.chance(mix.duplicated) {
        let mut p1b = base(Stage::UploadSent, t0 + 5_000 * MICRO);
        p1b.attempt = Some(2);
        out.client.push(p1b);
        let mut d1 = base(Stage::Duplicate, t0 + 5_050 * MICRO);
        d1.message_id = Some(m);
        d1.attempt = Some(2);
        out.broker.push(d1);
    }
    let failures = if rng.chance(mix.dead_lettered) {
        u32::MAX
    } else if rng.chance(mix.redelivered) {
        1
    } else {
        0
    };
    deliver(&mut out, m, &topic, "billing", false, failures, t0, rng);
    if rng.chance(mix.second_group) {
        deliver(&mut out, m, &topic, "audit", true, 0, t0, rng);
    }
    out
}

/// One group's deliveries of a message: attempts that fail `failures` times (then a
/// redelivery, or a dead letter after the third), then one that succeeds.
#[allow(clippy::too_many_arguments)]
fn deliver(
    out: &mut MessageRecords,
    m: MessageId,
    topic: &str,
    group: &str,
    push: bool,
    failures: u32,
    t0: u64,
    rng: &mut Rng,
) {
    const MAX_ATTEMPTS: u32 = 3;
    let consumer = id(format!("{group}-{}", rng.below(3)));
    let group_id = msgtrail_core::GroupId::from(id(group.to_owned()));
    let stages = if push {
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
    let mut at = t0 + (700 + rng.below(2_000)) * MICRO;
    for attempt in 1..=MAX_ATTEMPTS {
        let fails = attempt <= failures;
        let rec = |stage: Stage, at: u64| {
            let mut r = StageRecord::at(stage, at);
            r.message_id = Some(m);
            r.topic = Some(topic.to_owned());
            r.consumer = Some(consumer.clone());
            r.group = Some(group_id.clone());
            r.attempt = Some(attempt);
            r
        };
        let settle = if fails { "nack" } else { "ack" };
        let mut sent = rec(stages[0], at);
        sent.stream_seq = Some(1);
        out.broker.push(sent);
        out.client.push(rec(stages[1], at + 80 * MICRO));
        out.client.push(rec(Stage::ProcessStarted, at + 90 * MICRO));
        let mut x2 = rec(Stage::ProcessFinished, at + 600 * MICRO);
        x2.outcome = Some(if fails { "failed" } else { "ok" }.into());
        if fails {
            x2.detail = Some("payment service unavailable".into());
        }
        out.client.push(x2);
        let mut ack_sent = rec(stages[2], at + 610 * MICRO);
        ack_sent.outcome = Some(settle.into());
        out.client.push(ack_sent);
        let mut ack_got = rec(stages[3], at + 700 * MICRO);
        ack_got.outcome = Some(settle.into());
        out.broker.push(ack_got);
        if !fails {
            return;
        }
        let mut r1 = rec(Stage::Redelivery, at + 720 * MICRO);
        let last = attempt == MAX_ATTEMPTS;
        r1.outcome = Some(if last { "dead_letter" } else { "redeliver" }.into());
        out.broker.push(r1);
        if last {
            return;
        }
        at += 50_000 * MICRO;
    }
}

/// The records of message number `i` of a workload whose first message starts at `t0`
/// (Unix nanoseconds), the broker's and the clients' together: for filling a store one
/// message at a time (S7), without holding the whole workload.
pub(crate) fn message_records(i: u64, t0: u64, mix: &Mix, rng: &mut Rng) -> Vec<StageRecord> {
    let mut recs = message(i, t0 + i * MESSAGE_SPACING_NANOS, mix, rng);
    recs.broker.append(&mut recs.client);
    recs.broker
}

/// The workload as stage-stream messages (each a `Vec` of records, in stream order): the
/// broker's records in the order they happened, each client's reports `client_lag` stage
/// messages later, as relayed reports reach the stream.
pub fn stage_messages(mix: &Mix, t0: u64) -> Vec<Vec<StageRecord>> {
    let mut rng = Rng::new(mix.seed);
    let per = mix.records_per_stage_message.max(1);
    let mut out: Vec<Vec<StageRecord>> = Vec::new();
    let mut broker: Vec<StageRecord> = Vec::new();
    let mut pending_client: std::collections::VecDeque<Vec<StageRecord>> = Default::default();
    let mut client: Vec<StageRecord> = Vec::new();
    for i in 0..mix.messages {
        let recs = message(i, t0 + i * MESSAGE_SPACING_NANOS, mix, &mut rng);
        broker.extend(recs.broker);
        client.extend(recs.client);
        if broker.len() >= per {
            out.push(std::mem::take(&mut broker));
            pending_client.push_back(std::mem::take(&mut client));
            if pending_client.len() > mix.client_lag {
                out.extend(pending_client.pop_front().filter(|c| !c.is_empty()));
            }
        }
    }
    out.extend([broker, client].into_iter().filter(|b| !b.is_empty()));
    out.extend(pending_client.into_iter().filter(|c| !c.is_empty()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    #[test]
    fn deterministic_and_mixed() {
        let mix = Mix::realistic(2_000);
        let a = stage_messages(&mix, 1_700_000_000_000_000_000);
        let b = stage_messages(&mix, 1_700_000_000_000_000_000);
        assert_eq!(a, b);
        let all: Vec<&StageRecord> = a.iter().flatten().collect();
        let count = |s: Stage| all.iter().filter(|r| r.stage == s).count();
        let p1 = count(Stage::UploadSent);
        let p2 = count(Stage::UploadReceived);
        assert!(p1 > p2, "orphans and retries add P1s: {p1} vs {p2}");
        assert!(count(Stage::Duplicate) > 10);
        let outcome = |o: &str| {
            all.iter()
                .filter(|r| r.stage == Stage::Redelivery && r.outcome.as_deref() == Some(o))
                .count()
        };
        assert!(outcome("redeliver") > 50 && outcome("dead_letter") > 5);
        assert!(count(Stage::PushSent) > 300);
        let ids: BTreeSet<MessageId> = all.iter().filter_map(|r| r.message_id).collect();
        assert_eq!(ids.len(), p2);
        // Several topics and attributes, each value on a fair share of the messages.
        let p2s: Vec<&&StageRecord> = all
            .iter()
            .filter(|r| r.stage == Stage::UploadReceived)
            .collect();
        for (values, key) in [(&REGIONS[..], "region"), (&CATEGORIES[..], "category")] {
            for v in values {
                let n = p2s
                    .iter()
                    .filter(|r| r.attrs.get(key).map(String::as_str) == Some(*v))
                    .count();
                let share = n as f64 / p2s.len() as f64;
                let fair = 1.0 / values.len() as f64;
                assert!((share - fair).abs() < 0.06, "{key}={v}: {share}");
            }
        }
        let topics: BTreeSet<&str> = all.iter().filter_map(|r| r.topic.as_deref()).collect();
        assert_eq!(topics.len(), TOPICS.len(), "{topics:?}");
        // Records per message near the issue's ~10 (more with a second group).
        let per = all.len() as f64 / 2_000.0;
        assert!((8.0..20.0).contains(&per), "{per}");
    }

    #[test]
    fn message_by_message_gives_the_records_of_the_stage_messages() {
        let mix = Mix::realistic(300);
        let t0 = 1_700_000_000_000_000_000;
        let mut rng = Rng::new(mix.seed);
        let one_by_one: Vec<StageRecord> = (0..mix.messages)
            .flat_map(|i| message_records(i, t0, &mix, &mut rng))
            .collect();
        let mut a: Vec<String> = one_by_one.iter().map(|r| format!("{r:?}")).collect();
        let mut b: Vec<String> = stage_messages(&mix, t0)
            .iter()
            .flatten()
            .map(|r| format!("{r:?}"))
            .collect();
        a.sort();
        b.sort();
        assert_eq!(a, b);
    }

    #[test]
    fn the_narrow_mix_keeps_three_topics_and_one_attribute() {
        let all: Vec<StageRecord> = stage_messages(&Mix::narrow(600), 1_700_000_000_000_000_000)
            .into_iter()
            .flatten()
            .collect();
        let topics: BTreeSet<&str> = all.iter().filter_map(|r| r.topic.as_deref()).collect();
        assert_eq!(topics, TOPICS[..3].iter().copied().collect());
        let keys: BTreeSet<&str> = all
            .iter()
            .flat_map(|r| r.attrs.keys().map(String::as_str))
            .collect();
        assert_eq!(keys, BTreeSet::from(["category"]));
    }

    #[test]
    fn a_plain_mix_has_ten_records_per_message() {
        let all: Vec<StageRecord> = stage_messages(&Mix::plain(500), 1_700_000_000_000_000_000)
            .into_iter()
            .flatten()
            .collect();
        // P1 is written before the broker names the message: it counts under the message
        // its request ID is stored as.
        let named: BTreeMap<&str, MessageId> = all
            .iter()
            .filter_map(|r| Some((r.request_id.as_ref()?.as_str(), r.message_id?)))
            .collect();
        let mut per: BTreeMap<MessageId, Vec<Stage>> = BTreeMap::new();
        for r in &all {
            let m = r.message_id.unwrap_or_else(|| {
                let q = r.request_id.as_ref().expect("a P1 names its request");
                named[q.as_str()]
            });
            per.entry(m).or_default().push(r.stage);
        }
        assert_eq!(per.len(), 500);
        for (m, stages) in &per {
            assert_eq!(stages.len(), 10, "{m}: {stages:?}");
            let distinct: BTreeSet<&Stage> = stages.iter().collect();
            assert_eq!(distinct.len(), 10, "{m}: a stage twice in {stages:?}");
        }
    }
}
