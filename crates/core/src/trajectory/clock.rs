//! Clock offsets from the stage records themselves: P1–P4 are exactly NTP's four timestamps
//! (the producer sends, the broker receives, the broker answers, the producer receives), and
//! so are C1–C4 and C5–C8 with the roles swapped (the broker sends, the consumer receives,
//! the consumer settles, the broker receives the settle).
//!
//! [`estimate`] runs over the finished hops (after [`super::assembly`] ordered them): it
//! gives each hop its exchange's estimate ([`HopSpan::clock`]), keeps the best estimate per
//! client (smallest round trip: [`Trajectory::clocks`](super::Trajectory::clocks)), and with
//! it places the client-clock hops on the broker's clock ([`HopSpan::on_broker_clock`]) and
//! measures the arrivals across the two clocks ([`HopSpan::arrival_nanos`]). Offsets are
//! the client's clock minus the broker's; an exchange whose times are impossible (a negative
//! round trip or a negative duration on one side) gives no estimate.

use super::model::{ClockEstimate, CorrectedSpan, HopKind, HopSpan};
use crate::ids::ClientId;
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

/// A hop's estimate from one exchange, for `client`.
fn estimate_of(client: ClientId, offset_nanos: i64, round_trip_nanos: u64) -> ClockEstimate {
    ClockEstimate {
        client,
        offset_nanos,
        bound_nanos: round_trip_nanos / 2,
        round_trip_nanos,
        samples: 1,
    }
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
    let x = Exchange {
        t0: first(&send.events, &[Stage::UploadSent])?,
        t1: broker_p2.or_else(|| first(&store.events, &[Stage::UploadReceived]))?,
        t2: last(&store.events, &[Stage::Stored])?,
        t3: last(&send.events, &[Stage::StoreConfirmed])?,
    };
    let (broker_minus_producer, rtt) = x.offset()?;
    Some(estimate_of(producer, -broker_minus_producer, rtt))
}

/// When the consumer received the delivery (C2/C6), on its clock.
fn received_at(process: &HopSpan) -> Option<u64> {
    first(&process.events, &[Stage::PushReceived, Stage::PullReceived])
}

/// When the broker sent the delivery (C1/C5), on its clock.
fn sent_at(deliver: &HopSpan) -> Option<u64> {
    first(&deliver.events, &[Stage::PushSent, Stage::PullSent])
}

/// A delivery's estimate (consumer minus broker), from its deliver and process hops.
fn delivery_estimate(deliver: &HopSpan, process: &HopSpan) -> Option<ClockEstimate> {
    let x = Exchange {
        t0: sent_at(deliver)?,
        t1: received_at(process)?,
        t2: last(&process.events, &[Stage::PushAckSent, Stage::PullAckSent])?,
        t3: last(
            &deliver.events,
            &[Stage::PushAckReceived, Stage::PullAckReceived],
        )?,
    };
    let (offset, rtt) = x.offset()?;
    Some(estimate_of(process.consumer.clone()?, offset, rtt))
}

/// A time on a client's clock moved onto the broker's.
fn to_broker(at: u64, offset_nanos: i64) -> u64 {
    at.saturating_add_signed(offset_nanos.saturating_neg())
}

/// Gives each hop its exchange's estimate, and returns the best estimate per client, sorted
/// by client; places the client-clock hops on the broker's clock and measures the arrivals.
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

/// The best estimate per client: smallest round trip (then bound, then offset), with the
/// number of exchanges seen (each exchange is on two hops: counted once).
fn best_per_client<'a>(
    estimates: impl Iterator<Item = &'a ClockEstimate>,
) -> BTreeMap<ClientId, ClockEstimate> {
    let mut best: BTreeMap<ClientId, ClockEstimate> = BTreeMap::new();
    let mut halves: BTreeMap<ClientId, u32> = BTreeMap::new();
    for e in estimates {
        *halves.entry(e.client.clone()).or_default() += 1;
        let key = |e: &ClockEstimate| (e.round_trip_nanos, e.bound_nanos, e.offset_nanos);
        match best.get(&e.client) {
            Some(b) if key(b) <= key(e) => {}
            _ => {
                best.insert(e.client.clone(), e.clone());
            }
        }
    }
    for (client, e) in &mut best {
        e.samples = halves.get(client).map_or(1, |n| n.div_ceil(2));
    }
    best
}

/// Places the `send` and `process` hops on the broker's clock, and measures the arrival of
/// the `store` hop (after P1) and of the `process` hops (after their C1/C5).
fn place(
    hops: &mut [HopSpan],
    index: &BTreeMap<String, usize>,
    best: &BTreeMap<ClientId, ClockEstimate>,
) {
    let p1 = index
        .get("send")
        .and_then(|i| first(&hops[*i].events, &[Stage::UploadSent]));
    let producer = index
        .get("send")
        .and_then(|i| hops[*i].events.iter().find_map(|r| r.producer.clone()));
    let producer_best = producer.and_then(|p| best.get(&p));
    let delivery_sent: BTreeMap<String, u64> = hops
        .iter()
        .filter(|h| h.kind == HopKind::Deliver)
        .filter_map(|h| Some((h.key.clone(), sent_at(h)?)))
        .collect();
    for h in hops.iter_mut() {
        let est = match h.kind {
            HopKind::Send | HopKind::Store => producer_best,
            HopKind::Process => h.consumer.as_ref().and_then(|c| best.get(c)),
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
                let c1 = h.parent.as_ref().and_then(|k| delivery_sent.get(k));
                if let (Some(c1), Some(c2)) = (c1, received_at(h)) {
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
