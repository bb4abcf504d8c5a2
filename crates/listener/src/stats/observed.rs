//! Observe mode's statistics, per observed stream and per (stream, durable consumer): the
//! persistent counters `observed/<stream>/<consumer>/<counter>` (from the store, mirrored in
//! [`Stats`]'s counters like every other), the queue-wait and ack-time HDR histograms over
//! the sliding window and since start ([`ObservedHists`]), and what each consumer holds now
//! ([`ObservedLive`], discovery's consumer info). [`snapshot`] puts them together as the
//! `observed` section of `GET /api/stats`; [`register`] as metrics.
//!
//! Samples come from the store's apply ([`crate::observe::stats::count_records`], through
//! [`ApplyOutcome`]'s `observed`); after a restart [`Stats::seed_observed`] refills the
//! window from the stored observed messages of its last window, as the hop latencies are.

use super::*;
use crate::observe::stats::{ObservedCounter, ObservedKey, ObservedSample, SampleKind};
use msgtrail_listener_client::observed::{
    ConsumerNow, ObservedConsumerStats, ObservedStreamStats, WindowedLatency,
};

/// What discovery knows now: every observed stream, its durable consumers and what each
/// holds (`None` until its consumer info was read).
pub(crate) trait ObservedLive: Send + Sync {
    /// Stream → consumer → its figures now.
    fn consumers_now(&self) -> BTreeMap<String, BTreeMap<String, Option<ConsumerNow>>>;
}

/// The queue-wait and ack-time histograms per (stream, consumer, kind).
pub(super) type ObservedHists = BTreeMap<(String, String, SampleKind), Windowed>;

/// Records samples at `at` (Unix nanoseconds) in `hists`.
pub(super) fn record(
    hists: &mut ObservedHists,
    window: Duration,
    samples: &[ObservedSample],
    at: u64,
) {
    for s in samples {
        hists
            .entry((s.stream.clone(), s.consumer.clone(), s.kind))
            .or_insert_with(|| Windowed::new(window))
            .record(at, s.nanos / 1000);
    }
}

/// The periods a snapshot summarizes: the window (capped at the uptime) and since start,
/// seconds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Periods {
    pub(super) window_secs: f64,
    pub(super) uptime_secs: f64,
}

/// The consumers of a snapshot being made, by (stream, consumer).
type Consumers = BTreeMap<(String, String), ObservedConsumerStats>;

/// The consumer `name` of `stream` in `m`, added empty if new.
fn entry<'a>(m: &'a mut Consumers, stream: &str, name: &str) -> &'a mut ObservedConsumerStats {
    m.entry((stream.to_owned(), name.to_owned()))
        .or_insert_with(|| ObservedConsumerStats {
            consumer: name.to_owned(),
            ..Default::default()
        })
}

/// The `observed` section: every stream `live` names (only `only` when given), with the
/// consumers discovery knows and those the counters name, sorted by name.
pub(super) fn snapshot(
    counters: &BTreeMap<String, u64>,
    hists: &mut ObservedHists,
    live: &BTreeMap<String, BTreeMap<String, Option<ConsumerNow>>>,
    only: Option<&str>,
    now: u64,
    p: Periods,
) -> Vec<ObservedStreamStats> {
    let mut streams: BTreeMap<String, ObservedStreamStats> = live
        .keys()
        .filter(|s| only.is_none_or(|o| o == s.as_str()))
        .map(|s| {
            let stats = ObservedStreamStats {
                stream: s.clone(),
                ..Default::default()
            };
            (s.clone(), stats)
        })
        .collect();
    let mut consumers: Consumers = BTreeMap::new();
    for (stream, cs) in live {
        if !streams.contains_key(stream) {
            continue;
        }
        for (name, figures) in cs {
            entry(&mut consumers, stream, name).now = figures.clone();
        }
    }
    let range = counters.range(crate::observe::stats::OBSERVED_PREFIX.to_owned()..);
    for (name, v) in range {
        if !name.starts_with(crate::observe::stats::OBSERVED_PREFIX) {
            break;
        }
        let Some(k) = ObservedKey::parse(name) else {
            continue;
        };
        let Some(st) = streams.get_mut(&k.stream) else {
            continue;
        };
        if k.consumer.is_empty() {
            match k.counter {
                ObservedCounter::Stored => st.stored = *v,
                ObservedCounter::State(s) if *v > 0 => {
                    st.states.insert(s, *v);
                }
                _ => {}
            }
            continue;
        }
        let c = entry(&mut consumers, &k.stream, &k.consumer);
        match k.counter {
            ObservedCounter::Deliveries => c.deliveries = *v,
            ObservedCounter::Redeliveries => c.redeliveries = *v,
            ObservedCounter::Acks => c.acks = *v,
            ObservedCounter::Naks => c.naks = *v,
            ObservedCounter::Terms => c.terms = *v,
            ObservedCounter::TermReason(r) if *v > 0 => {
                c.term_reasons.insert(r, *v);
            }
            ObservedCounter::AckWaitExpired => c.ack_wait_expired = *v,
            ObservedCounter::MaxDeliveries => c.max_deliveries = *v,
            _ => {}
        }
    }
    for ((stream, name, kind), w) in hists.iter_mut() {
        if !streams.contains_key(stream) {
            continue;
        }
        let win = w.window(now);
        let lat = WindowedLatency {
            window: summarize(&win, p.window_secs),
            total: summarize(&w.total, p.uptime_secs),
        };
        let c = entry(&mut consumers, stream, name);
        match kind {
            SampleKind::QueueWait => c.queue_wait = lat,
            SampleKind::AckTime => c.ack_time = lat,
        }
    }
    for ((stream, _), c) in consumers {
        if let Some(st) = streams.get_mut(&stream) {
            st.unacked += c.now.as_ref().map_or(0, |n| n.unacked);
            st.consumers.push(c);
        }
    }
    for st in streams.values_mut() {
        st.stuck = st.states.get(&MessageState::Stuck).copied().unwrap_or(0);
    }
    streams.into_values().collect()
}

/// Adds the `observed` section's metrics to `r`: per (stream, consumer) the event counters
/// and what it holds now, per stream its messages by state, and the window's percentiles.
pub(super) fn register(streams: &[ObservedStreamStats], r: &mut Registry) {
    if streams.is_empty() {
        return;
    }
    let events = Family::<Labels, PromCounter>::default();
    let holds = Family::<Labels, Gauge>::default();
    let states = Family::<Labels, Gauge>::default();
    let stored = Family::<Labels, PromCounter>::default();
    let latency = Family::<Labels, Gauge<f64, AtomicU64>>::default();
    for st in streams {
        stored
            .get_or_create(&vec![("stream", st.stream.clone())])
            .inc_by(st.stored);
        for s in MessageState::ALL {
            let n = st.states.get(s).copied().unwrap_or(0);
            states
                .get_or_create(&vec![
                    ("stream", st.stream.clone()),
                    ("state", s.to_string()),
                ])
                .set(gauge(n).get());
        }
        for c in &st.consumers {
            let labels = |k: &'static str, v: &str| {
                vec![
                    ("stream", st.stream.clone()),
                    ("consumer", c.consumer.clone()),
                    (k, v.to_owned()),
                ]
            };
            for (e, n) in [
                ("delivery", c.deliveries),
                ("redelivery", c.redeliveries),
                ("ack", c.acks),
                ("nak", c.naks),
                ("term", c.terms),
                ("max_deliveries", c.max_deliveries),
                ("ack_wait_expired", c.ack_wait_expired),
            ] {
                events.get_or_create(&labels("event", e)).inc_by(n);
            }
            if let Some(now) = &c.now {
                for (what, n) in [
                    ("unacked", now.unacked),
                    ("pending", now.pending),
                    ("redelivered", now.redelivered),
                    ("waiting", now.waiting),
                ] {
                    holds
                        .get_or_create(&labels("what", what))
                        .set(gauge(n).get());
                }
            }
            for (kind, l) in [
                (SampleKind::QueueWait, &c.queue_wait.window),
                (SampleKind::AckTime, &c.ack_time.window),
            ] {
                for (q, ms) in [
                    ("0.5", l.p50_ms),
                    ("0.9", l.p90_ms),
                    ("0.99", l.p99_ms),
                    ("1", l.max_ms),
                ] {
                    let mut ls = labels("kind", kind.as_str());
                    ls.push(("quantile", q.to_owned()));
                    latency.get_or_create(&ls).set(ms / 1000.0);
                }
            }
        }
    }
    r.register(
        "msgtrail_observed_consumer_events",
        "Observe mode: per observed stream and durable consumer, delivery attempts seen, redeliveries, acks, naks, terms, max-deliveries reached, ack waits expired",
        events,
    );
    r.register(
        "msgtrail_observed_consumer_messages",
        "Observe mode: what each durable consumer holds now (consumer info): unacked, pending, redelivered, waiting pull requests",
        holds,
    );
    r.register(
        "msgtrail_observed_stream_messages",
        "Observe mode: observed messages per stream and state",
        states,
    );
    r.register(
        "msgtrail_observed_stored_messages",
        "Observe mode: stored messages read per stream",
        stored,
    );
    r.register_with_unit(
        "msgtrail_observed_latency",
        "Observe mode: queue wait (stored to first delivery) and ack time (delivery to ack) per stream and consumer over the sliding window, by quantile (1: the maximum)",
        Unit::Seconds,
        latency,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live() -> BTreeMap<String, BTreeMap<String, Option<ConsumerNow>>> {
        let now = ConsumerNow {
            unacked: 2,
            pending: 5,
            ..Default::default()
        };
        let orders = [
            ("billing".to_owned(), Some(now)),
            ("audit".to_owned(), None),
        ];
        BTreeMap::from([
            ("ORDERS".to_owned(), orders.into_iter().collect()),
            ("PAYMENTS".to_owned(), BTreeMap::new()),
        ])
    }

    /// Counters, histograms and discovery's figures meet per (stream, consumer); a consumer
    /// only the counters name (deleted since) is listed, a stream not observed is not.
    #[test]
    fn the_section_puts_counters_samples_and_consumer_info_together() {
        let counters: BTreeMap<String, u64> = [
            ("observed/ORDERS//stored", 4),
            ("observed/ORDERS//state.stuck", 1),
            ("observed/ORDERS//state.consumed", 0),
            ("observed/ORDERS/billing/deliveries", 3),
            ("observed/ORDERS/billing/term.bad", 1),
            ("observed/ORDERS/gone/acks", 7),
            ("observed/OLD/x/acks", 1),
            ("topic/orders/redeliveries", 9),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let mut hists = ObservedHists::new();
        let sample = |nanos| ObservedSample {
            stream: "ORDERS".into(),
            consumer: "audit".into(),
            kind: SampleKind::AckTime,
            nanos,
        };
        let window = Duration::from_secs(10);
        record(
            &mut hists,
            window,
            &[sample(2_000_000), sample(4_000_000)],
            1,
        );
        let p = Periods {
            window_secs: 10.0,
            uptime_secs: 10.0,
        };
        let all = snapshot(&counters, &mut hists, &live(), None, 2, p);
        let names: Vec<&str> = all.iter().map(|s| s.stream.as_str()).collect();
        assert_eq!(names, ["ORDERS", "PAYMENTS"]);
        let o = &all[0];
        assert_eq!((o.stored, o.stuck, o.unacked), (4, 1, 2));
        assert_eq!(o.states, BTreeMap::from([(MessageState::Stuck, 1)]));
        let cs: Vec<&str> = o.consumers.iter().map(|c| c.consumer.as_str()).collect();
        assert_eq!(cs, ["audit", "billing", "gone"]);
        let (audit, billing) = (&o.consumers[0], &o.consumers[1]);
        assert_eq!(
            (audit.ack_time.total.count, audit.ack_time.window.count),
            (2, 2)
        );
        assert!((audit.ack_time.window.max_ms - 4.0).abs() < 0.05);
        assert_eq!(audit.now, None);
        assert_eq!(billing.deliveries, 3);
        assert_eq!(
            billing.term_reasons,
            BTreeMap::from([("bad".to_owned(), 1)])
        );
        assert_eq!(billing.now.as_ref().map(|n| n.pending), Some(5));
        assert_eq!(o.consumers[2].acks, 7);

        let one = snapshot(&counters, &mut hists, &live(), Some("PAYMENTS"), 2, p);
        assert_eq!(one.len(), 1);
        assert!(one[0].consumers.is_empty());
    }
}
