//! Per-client clock estimates over a recent window: for each (client, broker instance), the
//! best estimate (smallest round trip) of the client's clock against that broker's among
//! the exchanges of the last [`WINDOW`] of records, served by `GET /api/clients/{id}`.
//!
//! A trajectory has the best estimate of its own exchanges; this is the client's over all
//! its messages. Ingest hands every stage batch to [`ClockWindow::observe`] before the store
//! sees it: the module only watches the exchange stages (P1–P4, C1–C8), collects each
//! exchange's four times until they are all there (in any order, across batches) and turns
//! them into an estimate with the same arithmetic as the trajectory
//! ([`ClockEstimate::from_upload`], [`ClockEstimate::from_delivery`]). Like the trajectory,
//! it pairs only the records of one broker instance: an exchange whose broker records name
//! two instances gives nothing.
//!
//! ## Bounds
//! Everything is bounded and kept in memory only (a restart starts empty, and refills within
//! one window of traffic):
//! - exchanges waiting for their records: at most [`MAX_PENDING`], dropped after
//!   [`PENDING_FOR`] of the listener's time or oldest first beyond the cap;
//! - (client, instance) pairs: at most [`MAX_PAIRS`], the least recently updated evicted;
//! - per pair, at most [`MAX_CANDIDATES`] candidate samples (a sample both older and no
//!   better than a newer one can never be the best again, and goes) and a per-second count
//!   of the exchanges in the window.
//!
//! The window is by record time (the broker's clock): samples more than [`WINDOW`] older than
//! the pair's newest sample no longer count. A client that went quiet keeps the estimate of
//! its last minute of traffic, with the time of its newest exchange (`newest_at`) to tell.
//! A redelivered stage batch repeats exchanges already counted: the best estimate is the
//! same, the count a little higher.

use msgtrail_core::trajectory::ClockEstimate;
use msgtrail_core::{BrokerInstance, ClientId, GroupId, MessageId, RequestId, Stage, StageRecord};
pub use msgtrail_listener_client::{ClientClocks, WindowEstimate};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

/// How far back (by record time) a client's exchanges count towards its window estimate.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);
/// Most (client, broker instance) pairs kept; beyond it the least recently updated goes.
pub(crate) const MAX_PAIRS: usize = 1024;
/// Most exchanges waiting for the rest of their four records.
pub(crate) const MAX_PENDING: usize = 65_536;
/// How long (listener time) an exchange may wait for the rest of its records.
pub(crate) const PENDING_FOR: Duration = Duration::from_secs(120);
/// Most candidate samples kept per pair.
pub(crate) const MAX_CANDIDATES: usize = 64;

/// Which exchange a record belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum ExchangeKey {
    /// An upload: P1–P4 share the producer and request ID.
    Upload(ClientId, RequestId),
    /// A delivery attempt: C1–C4 or C5–C8.
    Delivery {
        message: MessageId,
        group: GroupId,
        consumer: ClientId,
        attempt: u32,
        by_id: bool,
    },
}

/// An exchange's times so far, in NTP order (t0 … t3).
#[derive(Debug)]
struct Partial {
    times: [Option<u64>; 4],
    client: ClientId,
    broker: Option<BrokerInstance>,
    /// Two broker instances among the broker records: no estimate can come of it.
    mixed: bool,
    /// Listener time when the first record came, for [`PENDING_FOR`].
    since: u64,
    /// Its place in the pending order (a stale queue entry has another).
    generation: u64,
}

/// Where a record's time goes in its exchange: the index (t0 … t3) and whether several
/// records of that stage keep the earliest (true) or the latest.
fn slot(stage: Stage) -> Option<(usize, bool)> {
    Some(match stage {
        Stage::UploadSent | Stage::PushSent | Stage::PullSent => (0, true),
        Stage::UploadReceived | Stage::PushReceived | Stage::PullReceived => (1, true),
        Stage::Stored | Stage::PushAckSent | Stage::PullAckSent => (2, false),
        Stage::StoreConfirmed | Stage::PushAckReceived | Stage::PullAckReceived => (3, false),
        _ => return None,
    })
}

/// The exchange of a record and whose clock it measures, or `None` for a record that takes
/// part in none (or a recovered P2/P3, a refused upload: not the broker's own times).
fn key_of(r: &StageRecord) -> Option<(ExchangeKey, ClientId)> {
    if r.is_recovered() || (r.stage == Stage::UploadReceived && r.message_id.is_none()) {
        return None;
    }
    if matches!(
        r.stage,
        Stage::UploadSent | Stage::UploadReceived | Stage::Stored | Stage::StoreConfirmed
    ) {
        let producer = r.producer.clone()?;
        return Some((
            ExchangeKey::Upload(producer.clone(), r.request_id.clone()?),
            producer,
        ));
    }
    let consumer = r.consumer.clone()?;
    let key = ExchangeKey::Delivery {
        message: r.message_id?,
        group: r.group.clone()?,
        consumer: consumer.clone(),
        attempt: r.attempt?,
        by_id: r.by_id,
    };
    Some((key, consumer))
}

/// The candidates and counts of one (client, instance).
#[derive(Debug, Default)]
struct Samples {
    /// (broker-side time, estimate), none dominated by a newer one.
    candidates: Vec<(u64, ClockEstimate)>,
    /// Exchanges per second of broker-side time, oldest first.
    per_second: VecDeque<(u64, u32)>,
    newest: u64,
    /// Listener time of the last update, for eviction.
    touched: u64,
}

impl Samples {
    fn add(&mut self, at: u64, e: ClockEstimate) {
        let window = WINDOW.as_nanos() as u64;
        if self.newest != 0 && at.saturating_add(window) < self.newest {
            return;
        }
        self.newest = self.newest.max(at);
        let cut = self.newest.saturating_sub(window);
        let better =
            |a: &ClockEstimate, b: &ClockEstimate| a.round_trip_nanos <= b.round_trip_nanos;
        self.candidates
            .retain(|(t, c)| *t >= cut && !(*t <= at && better(&e, c)));
        if self.candidates.len() >= MAX_CANDIDATES {
            let oldest = (0..self.candidates.len()).min_by_key(|i| self.candidates[*i].0);
            if let Some(i) = oldest {
                self.candidates.swap_remove(i);
            }
        }
        self.candidates.push((at, e));
        let sec = at / 1_000_000_000;
        match self.per_second.iter_mut().find(|(s, _)| *s == sec) {
            Some((_, n)) => *n += 1,
            None => {
                let i = self.per_second.partition_point(|(s, _)| *s < sec);
                self.per_second.insert(i, (sec, 1));
            }
        }
        let cut_sec = cut / 1_000_000_000;
        while self.per_second.front().is_some_and(|(s, _)| *s < cut_sec) {
            self.per_second.pop_front();
        }
    }

    fn best(&self) -> Option<WindowEstimate> {
        let cut = self.newest.saturating_sub(WINDOW.as_nanos() as u64);
        let (at, e) = self
            .candidates
            .iter()
            .filter(|(t, _)| *t >= cut)
            .min_by_key(|(t, e)| (e.round_trip_nanos, e.bound_nanos, std::cmp::Reverse(*t)))?;
        let mut estimate = e.clone();
        estimate.samples = self.per_second.iter().map(|(_, n)| *n).sum();
        Some(WindowEstimate {
            estimate,
            measured_at: *at,
            newest_at: self.newest,
        })
    }
}

type Pair = (ClientId, Option<BrokerInstance>);

#[derive(Debug, Default)]
struct Inner {
    pending: HashMap<ExchangeKey, Partial>,
    /// Pending exchanges in arrival order, with the generation they were queued under.
    order: VecDeque<(ExchangeKey, u64)>,
    generation: u64,
    pairs: HashMap<Pair, Samples>,
}

/// The per-client window estimates; shared by ingest (which feeds it) and the HTTP API.
#[derive(Debug, Default)]
pub(crate) struct ClockWindow {
    // One short lock per stage batch; the HTTP reader takes it for one client's pairs.
    inner: Mutex<Inner>,
}

impl ClockWindow {
    /// An empty window.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Takes the exchange records of a batch (any others are skipped); `now` is the
    /// listener's time, Unix nanoseconds.
    pub(crate) fn observe<'a>(&self, records: impl IntoIterator<Item = &'a StageRecord>, now: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        for r in records {
            let Some((i, earliest)) = slot(r.stage) else {
                continue;
            };
            let Some((key, client)) = key_of(r) else {
                continue;
            };
            inner.note(key, client, r, (i, earliest), now);
        }
        inner.expire(now);
    }

    /// The window estimates of `client`, sorted by broker instance.
    pub(crate) fn client(&self, client: &str) -> ClientClocks {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut clocks: Vec<WindowEstimate> = inner
            .pairs
            .iter()
            .filter(|((c, _), _)| c.as_str() == client)
            .filter_map(|(_, s)| s.best())
            .collect();
        clocks.sort_by_key(|w| (w.estimate.broker.is_none(), w.estimate.broker.clone()));
        ClientClocks {
            client: client.to_owned(),
            window_secs: WINDOW.as_secs(),
            clocks,
        }
    }

    /// How many exchanges wait for records, and how many (client, instance) pairs are kept.
    #[cfg(test)]
    fn sizes(&self) -> (usize, usize) {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        (inner.pending.len(), inner.pairs.len())
    }
}

impl Inner {
    fn note(
        &mut self,
        key: ExchangeKey,
        client: ClientId,
        r: &StageRecord,
        (i, earliest): (usize, bool),
        now: u64,
    ) {
        if !self.pending.contains_key(&key) {
            self.generation += 1;
            self.order.push_back((key.clone(), self.generation));
            let partial = Partial {
                times: [None; 4],
                client,
                broker: None,
                mixed: false,
                since: now,
                generation: self.generation,
            };
            self.pending.insert(key.clone(), partial);
        }
        let p = self.pending.get_mut(&key).expect("inserted above");
        let t = &mut p.times[i];
        *t = Some(match *t {
            Some(old) if earliest => old.min(r.at),
            Some(old) => old.max(r.at),
            None => r.at,
        });
        if let Some(b) = &r.broker {
            match &p.broker {
                Some(seen) if seen != b => p.mixed = true,
                Some(_) => {}
                None => p.broker = Some(b.clone()),
            }
        }
        if let [Some(t0), Some(t1), Some(t2), Some(t3)] = p.times {
            let p = self.pending.remove(&key).expect("present");
            if !p.mixed {
                self.complete(&key, p, [t0, t1, t2, t3], now);
            }
        }
    }

    fn complete(&mut self, key: &ExchangeKey, p: Partial, times: [u64; 4], now: u64) {
        let (estimate, broker_at) = match key {
            ExchangeKey::Upload(..) => (
                ClockEstimate::from_upload(p.client.clone(), p.broker.clone(), times),
                times[1],
            ),
            ExchangeKey::Delivery { .. } => (
                ClockEstimate::from_delivery(p.client.clone(), p.broker.clone(), times),
                times[0],
            ),
        };
        let Some(estimate) = estimate else { return };
        let pair = (p.client, p.broker);
        if !self.pairs.contains_key(&pair) && self.pairs.len() >= MAX_PAIRS {
            let oldest = self
                .pairs
                .iter()
                .min_by_key(|(_, s)| s.touched)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.pairs.remove(&k);
            }
        }
        let samples = self.pairs.entry(pair).or_default();
        samples.touched = now;
        samples.add(broker_at, estimate);
    }

    /// Drops exchanges that waited too long or beyond the cap, oldest first, and compacts
    /// the order queue when it is mostly stale entries (completed exchanges).
    fn expire(&mut self, now: u64) {
        let too_old = now.saturating_sub(PENDING_FOR.as_nanos() as u64);
        while let Some((key, generation)) = self.order.front() {
            let live = self
                .pending
                .get(key)
                .filter(|p| p.generation == *generation);
            let drop = match live {
                None => true,
                Some(p) => p.since < too_old || self.pending.len() > MAX_PENDING,
            };
            if !drop {
                break;
            }
            let (key, generation) = self.order.pop_front().expect("front exists");
            if self
                .pending
                .get(&key)
                .is_some_and(|p| p.generation == generation)
            {
                self.pending.remove(&key);
            }
        }
        if self.order.len() > 2 * self.pending.len() + 1024 {
            let pending = &self.pending;
            self.order
                .retain(|(k, g)| pending.get(k).is_some_and(|p| p.generation == *g));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_796_126_401_000_000_000;
    const MS: u64 = 1_000_000;

    fn id(s: &str) -> ClientId {
        ClientId::new(s).unwrap()
    }

    /// A pull delivery's four records, the consumer's clock `skew_ms` ahead of the broker
    /// `broker`'s, sent at `at_ms` (broker time) with a round trip of `rtt_us`.
    fn delivery(
        broker: &str,
        at_ms: u64,
        attempt: u32,
        skew_ms: i64,
        rtt_us: u64,
    ) -> Vec<StageRecord> {
        let message = MessageId::new();
        let mk = |stage, at: u64, by_broker: bool| {
            let mut r = StageRecord::at(stage, at);
            r.message_id = Some(message);
            r.group = Some(GroupId::new("g").unwrap());
            r.consumer = Some(id("c-1"));
            r.attempt = Some(attempt);
            if by_broker {
                r.broker = Some(BrokerInstance::new(broker).unwrap());
            }
            r
        };
        let c1 = T0 + at_ms * MS;
        let shift = |t: u64| t.wrapping_add_signed(skew_ms * MS as i64);
        let half = rtt_us * 1_000 / 2;
        vec![
            mk(Stage::PullSent, c1, true),
            mk(Stage::PullReceived, shift(c1 + half), false),
            mk(Stage::PullAckSent, shift(c1 + half + MS), false),
            mk(Stage::PullAckReceived, c1 + 2 * half + MS, true),
        ]
    }

    #[test]
    fn the_best_exchange_of_the_window_per_broker_instance() {
        let w = ClockWindow::new();
        // Records in any order, split across batches.
        let mut a = delivery("b-1", 0, 1, 250, 800);
        a.reverse();
        w.observe(&a[..2], T0);
        assert_eq!(w.client("c-1").clocks, vec![]);
        w.observe(&a[2..], T0);
        w.observe(&delivery("b-1", 10, 1, 250, 300), T0);
        w.observe(&delivery("b-1", 20, 1, 250, 900), T0);
        w.observe(&delivery("b-2", 30, 1, -40, 500), T0);
        let got = w.client("c-1");
        assert_eq!(got.window_secs, 60);
        let brokers: Vec<&str> = got
            .clocks
            .iter()
            .map(|c| c.estimate.broker.as_ref().unwrap().as_str())
            .collect();
        assert_eq!(brokers, ["b-1", "b-2"]);
        let b1 = &got.clocks[0];
        assert_eq!(b1.estimate.round_trip_nanos, 300_000);
        assert_eq!(b1.estimate.samples, 3);
        assert_eq!(b1.measured_at, T0 + 10 * MS);
        assert_eq!(b1.newest_at, T0 + 20 * MS);
        assert!((b1.estimate.offset_nanos - 250_000_000).unsigned_abs() <= b1.estimate.bound_nanos);
        let b2 = &got.clocks[1];
        assert!((b2.estimate.offset_nanos + 40_000_000).unsigned_abs() <= b2.estimate.bound_nanos);
        assert!(w.client("nobody").clocks.is_empty());
        assert_eq!(w.sizes(), (0, 2));
    }

    #[test]
    fn exchanges_older_than_the_window_stop_counting() {
        let w = ClockWindow::new();
        w.observe(&delivery("b-1", 0, 1, 5, 100), T0);
        w.observe(&delivery("b-1", 30_000, 1, 5, 700), T0);
        assert_eq!(w.client("c-1").clocks[0].estimate.round_trip_nanos, 100_000);
        // 61 s later the 0.1 ms exchange is out of the window: the 0.7 ms one is the best.
        w.observe(&delivery("b-1", 61_000, 1, 5, 900), T0);
        let c = &w.client("c-1").clocks[0];
        assert_eq!(c.estimate.round_trip_nanos, 700_000);
        assert_eq!(c.estimate.samples, 2);
    }

    #[test]
    fn a_delivery_settled_at_another_broker_gives_no_estimate() {
        let w = ClockWindow::new();
        let mut recs = delivery("b-1", 0, 1, 0, 100);
        recs[3].broker = Some(BrokerInstance::new("b-2").unwrap());
        w.observe(&recs, T0);
        assert!(w.client("c-1").clocks.is_empty());
        assert_eq!(w.sizes(), (0, 0));
    }

    #[test]
    fn uploads_pair_by_producer_and_request_id() {
        let w = ClockWindow::new();
        let mk = |stage, at: u64| {
            let mut r = StageRecord::at(stage, at);
            r.producer = Some(id("shop"));
            r.request_id = Some(RequestId::new("order-1").unwrap());
            if stage != Stage::UploadSent {
                r.message_id = Some(MessageId::new());
            }
            if matches!(stage, Stage::UploadReceived | Stage::Stored) {
                r.broker = Some(BrokerInstance::new("b-1").unwrap());
            }
            r
        };
        let skew = 250 * MS;
        w.observe(
            &[
                mk(Stage::UploadSent, T0 + skew),
                mk(Stage::UploadReceived, T0 + 300_000),
                mk(Stage::Stored, T0 + MS),
                mk(Stage::StoreConfirmed, T0 + skew + 1_300_000),
            ],
            T0,
        );
        let c = &w.client("shop").clocks[0];
        assert_eq!(c.estimate.round_trip_nanos, 600_000);
        assert!((c.estimate.offset_nanos - 250_000_000).unsigned_abs() <= c.estimate.bound_nanos);
    }

    #[test]
    fn waiting_exchanges_and_pairs_stay_bounded() {
        let w = ClockWindow::new();
        // Exchanges that never complete wait at most PENDING_FOR.
        for n in 0..100 {
            w.observe(&delivery("b-1", n, 1, 0, 100)[..3], T0);
        }
        assert_eq!(w.sizes().0, 100);
        w.observe(std::iter::empty(), T0 + PENDING_FOR.as_nanos() as u64 + 1);
        assert_eq!(w.sizes().0, 0);
        // More pairs than the cap: the least recently updated go.
        for n in 0..(MAX_PAIRS + 10) {
            let mut recs = delivery(&format!("b-{n}"), 0, 1, 0, 100);
            for r in &mut recs {
                r.consumer = Some(id(&format!("c-{n}")));
            }
            w.observe(&recs, T0 + n as u64);
        }
        assert_eq!(w.sizes(), (0, MAX_PAIRS));
        assert!(w.client("c-0").clocks.is_empty());
        assert_eq!(w.client(&format!("c-{}", MAX_PAIRS + 9)).clocks.len(), 1);
    }
}
