//! Clock offsets from the stage records themselves: P1–P4 are exactly NTP's four timestamps
//! (the producer sends, the broker receives, the broker answers, the producer receives), and
//! so are C1–C4 and C5–C8 with the roles swapped (the broker sends, the consumer receives,
//! the consumer settles, the broker receives the settle).
//!
//! [`estimate`] runs over the finished hops (after [`super::assembly`] ordered them): it
//! gives each hop its exchange's estimate ([`HopSpan::clock`]), keeps the best estimate per
//! client and broker instance (smallest round trip:
//! [`Trajectory::clocks`](super::Trajectory::clocks)), and with
//! it places the client-clock hops on the broker's clock ([`HopSpan::on_broker_clock`]) and
//! measures the arrivals across the two clocks ([`HopSpan::arrival_nanos`]). Offsets are
//! the client's clock minus the broker's; an exchange whose times are impossible (a negative
//! round trip or a negative duration on one side) gives no estimate.
//!
//! **One broker instance per estimate.** Several brokers serve one deployment, each on its
//! own clock. An exchange's broker-side times (P2/P3, C1/C4, C5/C8) must come from one
//! instance ([`StageRecord::broker`]): a delivery sent by one broker and settled at another
//! gives no estimate, and a client's estimates against two instances are kept apart.

use super::model::{ClockEstimate, CorrectedSpan, HopKind, HopSpan};
use crate::ids::{BrokerInstance, ClientId};
use crate::record::StageRecord;
use crate::stage::Stage;
use std::collections::BTreeMap;

/// The four times of one exchange, by the initiator's role: it sends at `t0` (its clock),
/// the other side receives at `t1` and answers at `t2` (the other's clock), it receives the
/// answer at `t3` (its clock).
#[derive(Debug, Clone, Copy)]
struct Exchange {
    t0: u64,
    t1: u64,
    t2: u64,
    t3: u64,
}

impl Exchange {
    /// The other side's clock minus the initiator's, and the round trip without the other
    /// side's time; `None` when a duration is negative.
    fn offset(self) -> Option<(i64, u64)> {
        let (t0, t1, t2, t3) = (
            i128::from(self.t0),
            i128::from(self.t1),
            i128::from(self.t2),
            i128::from(self.t3),
        );
        let round_trip = (t3 - t0) - (t2 - t1);
        if t3 < t0 || t2 < t1 || round_trip < 0 {
            return None;
        }
        let theta = ((t1 - t0) + (t2 - t3)) / 2;
        Some((i64::try_from(theta).ok()?, u64::try_from(round_trip).ok()?))
    }
}

fn first(events: &[StageRecord], stages: &[Stage]) -> Option<u64> {
    events
        .iter()
        .filter(|r| stages.contains(&r.stage))
        .map(|r| r.at)
        .min()
}

fn last(events: &[StageRecord], stages: &[Stage]) -> Option<u64> {
    events
        .iter()
        .filter(|r| stages.contains(&r.stage))
        .map(|r| r.at)
        .max()
}

/// A hop's estimate from one exchange, for `client` against `broker`.
fn estimate_of(
    client: ClientId,
    broker: Option<BrokerInstance>,
    offset_nanos: i64,
    round_trip_nanos: u64,
) -> ClockEstimate {
    ClockEstimate {
        client,
        offset_nanos,
        bound_nanos: round_trip_nanos / 2,
        round_trip_nanos,
        samples: 1,
        broker,
    }
}

impl ClockEstimate {
    /// The producer's estimate from one upload's four times (P1 and P4 on its clock, P2 and
    /// P3 on the broker instance's); `None` when a duration is negative.
    pub fn from_upload(
        producer: ClientId,
        broker: Option<BrokerInstance>,
        [p1, p2, p3, p4]: [u64; 4],
    ) -> Option<ClockEstimate> {
        let x = Exchange {
            t0: p1,
            t1: p2,
            t2: p3,
            t3: p4,
        };
        let (broker_minus_producer, rtt) = x.offset()?;
        Some(estimate_of(producer, broker, -broker_minus_producer, rtt))
    }

    /// The consumer's estimate from one delivery's four times (C1/C5 and C4/C8 on the
    /// broker instance's clock, C2/C6 and C3/C7 on the consumer's); `None` when a duration
    /// is negative.
    pub fn from_delivery(
        consumer: ClientId,
        broker: Option<BrokerInstance>,
        [c1, c2, c3, c4]: [u64; 4],
    ) -> Option<ClockEstimate> {
        let x = Exchange {
            t0: c1,
            t1: c2,
            t2: c3,
            t3: c4,
        };
        let (offset, rtt) = x.offset()?;
        Some(estimate_of(consumer, broker, offset, rtt))
    }
}

/// The one broker instance of the broker-written records of an exchange: `Err` when two
/// of them name different instances (their times are on two clocks, which no offset
/// relates), `Ok(None)` when none names one (records of brokers that predate instances).
fn one_instance<'a>(
    records: impl Iterator<Item = &'a StageRecord>,
) -> Result<Option<BrokerInstance>, ()> {
    let mut seen: Option<&BrokerInstance> = None;
    for b in records.filter_map(|r| r.broker.as_ref()) {
        match seen {
            Some(s) if s != b => return Err(()),
            _ => seen = Some(b),
        }
    }
    Ok(seen.cloned())
}

/// The upload's estimate (producer minus broker), from the send and store hops.
fn upload_estimate(send: &HopSpan, store: &HopSpan) -> Option<ClockEstimate> {
    if send.synthesized {
        return None;
    }
    let producer = send.events.iter().find_map(|r| r.producer.clone())?;
    let broker_p2 = store
        .events
        .iter()
        .filter(|r| r.stage == Stage::UploadReceived && !r.is_recovered())
        .map(|r| r.at)
        .min();
    let stages = [Stage::UploadReceived, Stage::Stored];
    let instance = one_instance(store.events.iter().filter(|r| stages.contains(&r.stage))).ok()?;
    let times = [
        first(&send.events, &[Stage::UploadSent])?,
        broker_p2.or_else(|| first(&store.events, &[Stage::UploadReceived]))?,
        last(&store.events, &[Stage::Stored])?,
        last(&send.events, &[Stage::StoreConfirmed])?,
    ];
    ClockEstimate::from_upload(producer, instance, times)
}

/// When the consumer received the delivery (C2/C6), on its clock.
fn received_at(process: &HopSpan) -> Option<u64> {
    first(&process.events, &[Stage::PushReceived, Stage::PullReceived])
}

/// When the broker sent the delivery (C1/C5), on its clock.
fn sent_at(deliver: &HopSpan) -> Option<u64> {
    first(&deliver.events, &[Stage::PushSent, Stage::PullSent])
}

/// A delivery's estimate (consumer minus broker), from its deliver and process hops: none
/// when its send and its settle were recorded by different broker instances.
fn delivery_estimate(deliver: &HopSpan, process: &HopSpan) -> Option<ClockEstimate> {
    let stages = [
        Stage::PushSent,
        Stage::PullSent,
        Stage::PushAckReceived,
        Stage::PullAckReceived,
    ];
    let instance =
        one_instance(deliver.events.iter().filter(|r| stages.contains(&r.stage))).ok()?;
    let times = [
        sent_at(deliver)?,
        received_at(process)?,
        last(&process.events, &[Stage::PushAckSent, Stage::PullAckSent])?,
        last(
            &deliver.events,
            &[Stage::PushAckReceived, Stage::PullAckReceived],
        )?,
    ];
    ClockEstimate::from_delivery(process.consumer.clone()?, instance, times)
}

/// A time on a client's clock moved onto the broker's.
fn to_broker(at: u64, offset_nanos: i64) -> u64 {
    at.saturating_add_signed(offset_nanos.saturating_neg())
}

/// Gives each hop its exchange's estimate, and returns the best estimate per (client, broker
/// instance), sorted by client then instance; places the client-clock hops on the broker's clock and measures the arrivals.
pub(super) fn estimate(hops: &mut [HopSpan]) -> Vec<ClockEstimate> {
    let index: BTreeMap<String, usize> = hops
        .iter()
        .enumerate()
        .map(|(i, h)| (h.key.clone(), i))
        .collect();
    let send = index.get("send").copied();
    let store = index.get("store").copied();
    let mut per_hop: Vec<(usize, ClockEstimate)> = Vec::new();
    if let (Some(a), Some(b)) = (send, store) {
        if let Some(e) = upload_estimate(&hops[a], &hops[b]) {
            per_hop.extend([(a, e.clone()), (b, e)]);
        }
    }
    for (p, process) in hops.iter().enumerate() {
        let deliver = process.parent.as_ref().and_then(|k| index.get(k)).copied();
        if let (HopKind::Process, Some(d)) = (process.kind, deliver) {
            if let Some(e) = delivery_estimate(&hops[d], process) {
                per_hop.extend([(d, e.clone()), (p, e)]);
            }
        }
    }
    let best = best_per_client(per_hop.iter().map(|(_, e)| e));
    for (i, e) in per_hop {
        hops[i].clock = Some(e);
    }
    place(hops, &index, &best);
    best.into_values().collect()
}

/// Whose clock against which broker instance's: the key of a best estimate.
type Pair = (ClientId, Option<BrokerInstance>);

/// The best estimate per (client, broker instance): smallest round trip (then bound, then
/// offset), with the number of exchanges seen (each exchange is on two hops: counted once).
fn best_per_client<'a>(
    estimates: impl Iterator<Item = &'a ClockEstimate>,
) -> BTreeMap<Pair, ClockEstimate> {
    let mut best: BTreeMap<Pair, ClockEstimate> = BTreeMap::new();
    let mut halves: BTreeMap<Pair, u32> = BTreeMap::new();
    for e in estimates {
        let pair = (e.client.clone(), e.broker.clone());
        *halves.entry(pair.clone()).or_default() += 1;
        let key = |e: &ClockEstimate| (e.round_trip_nanos, e.bound_nanos, e.offset_nanos);
        match best.get(&pair) {
            Some(b) if key(b) <= key(e) => {}
            _ => {
                best.insert(pair, e.clone());
            }
        }
    }
    for (pair, e) in &mut best {
        e.samples = halves.get(pair).map_or(1, |n| n.div_ceil(2));
    }
    best
}

/// Places the `send` and `process` hops on the broker's clock, and measures the arrival of
/// the `store` hop (after P1) and of the `process` hops (after their C1/C5). Each uses the
/// client's best estimate against the broker instance of its exchange (the store hop's,
/// the deliver hop's): never one measured against another instance's clock.
fn place(
    hops: &mut [HopSpan],
    index: &BTreeMap<String, usize>,
    best: &BTreeMap<Pair, ClockEstimate>,
) {
    let p1 = index
        .get("send")
        .and_then(|i| first(&hops[*i].events, &[Stage::UploadSent]));
    let producer = index
        .get("send")
        .and_then(|i| hops[*i].events.iter().find_map(|r| r.producer.clone()));
    let store_broker = index.get("store").and_then(|i| hops[*i].broker.clone());
    let producer_best = producer.and_then(|p| best.get(&(p, store_broker)));
    let delivery_sent: BTreeMap<String, (u64, Option<BrokerInstance>)> = hops
        .iter()
        .filter(|h| h.kind == HopKind::Deliver)
        .filter_map(|h| Some((h.key.clone(), (sent_at(h)?, h.broker.clone()))))
        .collect();
    for h in hops.iter_mut() {
        let deliver = h.parent.as_ref().and_then(|k| delivery_sent.get(k));
        let est = match h.kind {
            HopKind::Send | HopKind::Store => producer_best,
            HopKind::Process => h
                .consumer
                .clone()
                .and_then(|c| best.get(&(c, deliver.and_then(|d| d.1.clone())))),
            HopKind::Deliver => None,
        };
        let Some(est) = est else {
            continue;
        };
        let off = est.offset_nanos;
        match h.kind {
            HopKind::Send if !h.synthesized => {
                h.on_broker_clock = Some(CorrectedSpan {
                    start: to_broker(h.start, off),
                    end: h.end.map(|e| to_broker(e, off)),
                    bound_nanos: est.bound_nanos,
                });
            }
            HopKind::Store => {
                let p2 = first(&h.events, &[Stage::UploadReceived]);
                if let (Some(p1), Some(p2)) = (p1, p2) {
                    h.arrival_nanos = Some(arrival(to_broker(p1, off), p2));
                    h.arrival_bound_nanos = Some(est.bound_nanos);
                }
            }
            HopKind::Process => {
                h.on_broker_clock = Some(CorrectedSpan {
                    start: to_broker(h.start, off),
                    end: h.end.map(|e| to_broker(e, off)),
                    bound_nanos: est.bound_nanos,
                });
                if let (Some((c1, _)), Some(c2)) = (deliver, received_at(h)) {
                    h.arrival_nanos = Some(arrival(*c1, to_broker(c2, off)));
                    h.arrival_bound_nanos = Some(est.bound_nanos);
                }
            }
            _ => {}
        }
    }
}

/// `to − from`, signed, saturating.
fn arrival(from: u64, to: u64) -> i64 {
    i64::try_from(i128::from(to) - i128::from(from)).unwrap_or(i64::MAX)
}
