//! S7: search latency at S5's store size. The store is filled with the synthetic production
//! mix ([`crate::synth`], [`Mix::realistic`]: eight topics in four hierarchies, a `region`
//! and a `category` attribute on every stored message, redeliveries, dead letters, orphans),
//! one message after another in transactions of 2,000 messages; then the searches the page
//! and `GET /api/messages?…` make ([`Store::search`], limit 100) run one after another, the
//! kinds taking turns ([`Kind`]), each inside a random time window of a quarter of the
//! stored span.
//!
//! S5's own store cannot serve: it holds copies of one recorded trajectory (one topic, one
//! set of attributes, all consumed), on which every search selects everything or nothing. S7
//! fills a store of the same size instead (S5's is deleted first, so the disk holds one).
//!
//! The *selectivity* of a kind is the share of stored messages its filters select, the time
//! window aside: measured on a sample of the stored summaries (the newest, up to 10,000),
//! with the store's own predicate ([`SearchQuery::wants`], state and topic checked as the
//! store checks them).

use crate::error::BenchError;
use crate::measure::{Latency, Progress, Recorder, Throughput};
use crate::synth::{self, Mix, Rng};
use msgtrail_core::trajectory::MessageState;
use msgtrail_listener::{MessageSummary, SearchQuery, Store};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Instant;

/// Messages written per store transaction while filling.
const FILL_BATCH: u64 = 2_000;
/// Results per search, as the page asks.
const LIMIT: usize = 100;
/// The share of the stored span a search's time window covers.
const WINDOW_SHARE: f64 = 0.25;
/// Most summaries sampled for the selectivities.
const SAMPLE_MAX: usize = 10_000;

/// The topic patterns the topic searches take turns with (`orders.*` 3/8 of the topics,
/// `billing.>` and `shipping.*` 2/8 each).
const PATTERNS: [&str; 3] = ["orders.*", "billing.>", "shipping.*"];

/// One kind of search S7 times; every search also has a time range and the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// A topic pattern and a time range.
    Topic,
    /// An attribute (`region`) and a time range.
    Attr,
    /// A topic pattern, an attribute (`category`) and a time range.
    TopicAttr,
    /// Failed at any hop (the `failed` flag) and a time range.
    Failed,
    /// In the dead-lettered state (the state index) and a time range.
    DeadLettered,
}

impl Kind {
    /// Every kind, in the order they take turns.
    pub(crate) const ALL: [Kind; 5] = [
        Kind::Topic,
        Kind::Attr,
        Kind::TopicAttr,
        Kind::Failed,
        Kind::DeadLettered,
    ];

    /// The JSON key of the kind (`s7.kinds.<name>`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Topic => "topic",
            Kind::Attr => "attribute",
            Kind::TopicAttr => "topic_attribute",
            Kind::Failed => "failed",
            Kind::DeadLettered => "dead_lettered",
        }
    }

    /// Its `n`-th query (the variants take turns), within `[from, to)`.
    pub(crate) fn query(self, n: usize, from: u64, to: u64) -> SearchQuery {
        let mut q = SearchQuery {
            from: Some(from),
            to: Some(to),
            limit: Some(LIMIT),
            ..Default::default()
        };
        let pattern = || PATTERNS[n % PATTERNS.len()].to_owned();
        match self {
            Kind::Topic => q.topic_pattern = Some(pattern()),
            Kind::Attr => {
                let region = synth::REGIONS[n % synth::REGIONS.len()];
                q.attr = Some(("region".into(), region.into()));
            }
            Kind::TopicAttr => {
                q.topic_pattern = Some(pattern());
                let category = synth::CATEGORIES[n % synth::CATEGORIES.len()];
                q.attr = Some(("category".into(), category.into()));
            }
            Kind::Failed => q.failed = true,
            Kind::DeadLettered => q.state = Some(MessageState::DeadLettered),
        }
        q
    }

    /// How many variants the kind takes turns with.
    fn variants(self) -> usize {
        match self {
            Kind::Topic => PATTERNS.len(),
            Kind::Attr => synth::REGIONS.len(),
            // Both counts are coprime with each other: every pair comes up.
            Kind::TopicAttr => PATTERNS.len() * synth::CATEGORIES.len(),
            Kind::Failed | Kind::DeadLettered => 1,
        }
    }
}

/// Whether a summary passes `q`'s filters, its time range aside: what [`Store::search`]
/// checks of each candidate.
pub(crate) fn selects(q: &SearchQuery, s: &MessageSummary) -> bool {
    q.state.is_none_or(|st| st == s.state)
        && q.topic
            .as_deref()
            .is_none_or(|t| s.topic.as_deref() == Some(t))
        && q.wants(s)
}

/// The share of `sample` a kind's filters select, averaged over its variants (0 for an
/// empty sample).
pub(crate) fn selectivity(kind: Kind, sample: &[MessageSummary]) -> f64 {
    if sample.is_empty() {
        return 0.0;
    }
    let v = kind.variants();
    let total: f64 = (0..v)
        .map(|n| {
            let q = kind.query(n, 0, u64::MAX);
            sample.iter().filter(|s| selects(&q, s)).count() as f64 / sample.len() as f64
        })
        .sum();
    total / v as f64
}

/// What S7 measured of one kind of search.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KindResult {
    /// Searches of this kind timed.
    pub queries: u64,
    /// Median latency, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile, milliseconds.
    pub p99_ms: f64,
    /// Maximum, milliseconds.
    pub max_ms: f64,
    /// Results returned over all of the kind's searches.
    pub results: u64,
    /// Results per search (at most the limit, 100).
    pub mean_results: f64,
    /// Searches that returned nothing.
    pub empty: u64,
    /// Searches that returned the limit (more would have matched).
    pub full: u64,
    /// The share of stored messages the kind's filters select, the time window aside
    /// (sampled; see the module docs).
    pub selectivity: f64,
}

/// What S7 measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SearchResult {
    /// Messages of the synthetic mix stored (S5's count; orphan uploads included).
    pub stored_messages: u64,
    /// Records stored.
    pub records: u64,
    /// Filling: records per second, in transactions of 2,000 messages.
    pub fill: Throughput,
    /// Store size on disk after filling, bytes.
    pub store_bytes: u64,
    /// Whether S5's store was searched (false: one filled alike for S7, see the module docs).
    pub reused_s5_store: bool,
    /// Results asked per search.
    pub limit: u64,
    /// The share of the stored span each search's time window covers.
    pub window_share: f64,
    /// Summaries the selectivities were measured on.
    pub sample: u64,
    /// Searches timed, per second (one thread).
    pub searches: Throughput,
    /// Latency over every kind.
    pub latency: Latency,
    /// Results returned over every search.
    pub results: u64,
    /// Per kind of search, by [`Kind::name`].
    pub kinds: BTreeMap<String, KindResult>,
}

/// Fills `store` with `messages` messages of the realistic mix whose first starts at `t0`;
/// returns the records written.
fn fill(store: &Store, messages: u64, t0: u64, progress: &Progress) -> Result<u64, BenchError> {
    let mix = Mix::realistic(messages);
    let mut rng = Rng::new(mix.seed);
    let phase = progress.phase("S7 fill store (messages)", messages);
    let mut written = 0;
    let mut k = 0u64;
    while k < messages {
        let end = (k + FILL_BATCH).min(messages);
        let mut records = Vec::new();
        for i in k..end {
            records.extend(synth::message_records(i, t0, &mix, &mut rng));
        }
        written += records.len() as u64;
        store
            .apply(records, msgtrail_core::time::now_nanos())
            .map_err(|e| BenchError::Listener(e.into()))?;
        phase.add(end - k);
        k = end;
    }
    Ok(written)
}

/// The newest stored summaries, up to [`SAMPLE_MAX`].
fn sample(store: &Store) -> Result<Vec<MessageSummary>, BenchError> {
    store
        .search(&SearchQuery {
            limit: Some(SAMPLE_MAX),
            ..Default::default()
        })
        .map_err(|e| BenchError::Listener(e.into()))
}

/// Runs S7 on the current thread (call it from a blocking thread): fills a store with
/// `messages` messages, then times `queries` searches of every kind.
pub(crate) fn run(
    messages: u64,
    queries: u64,
    progress: &Progress,
) -> Result<SearchResult, BenchError> {
    let dir = tempfile::Builder::new()
        .prefix("msgtrail-bench-search-")
        .tempdir()?;
    let store = Store::open(dir.path(), 256, Default::default())
        .map_err(|e| BenchError::Listener(e.into()))?;
    let t0 = msgtrail_core::time::now_nanos();
    let start = Instant::now();
    let records = fill(&store, messages, t0, progress)?;
    let fill_tp = Throughput::new(records, start.elapsed());
    let store_bytes = crate::measure::disk_bytes(dir.path());

    let span = messages.max(1) * synth::MESSAGE_SPACING_NANOS;
    let width = ((span as f64 * WINDOW_SHARE) as u64).max(1);
    let sampled = sample(&store)?;
    let mut per_kind: BTreeMap<Kind, (Recorder, KindResult)> = Kind::ALL
        .iter()
        .map(|k| {
            let r = KindResult {
                selectivity: selectivity(*k, &sampled),
                ..Default::default()
            };
            (*k, (Recorder::default(), r))
        })
        .collect();
    let phase = progress.phase("S7 searches", queries * Kind::ALL.len() as u64);
    let mut all = Recorder::default();
    let mut rng = Rng::new(0x5ea7c4 ^ messages);
    let start = Instant::now();
    for n in 0..queries as usize {
        for kind in Kind::ALL {
            let from = t0 + rng.below(span.saturating_sub(width).max(1));
            let q = kind.query(n, from, from + width);
            let t = Instant::now();
            let found = store
                .search(&q)
                .map_err(|e| BenchError::Listener(e.into()))?
                .len() as u64;
            let took = t.elapsed();
            all.record(took);
            let (rec, r) = per_kind.get_mut(&kind).expect("every kind is there");
            rec.record(took);
            r.queries += 1;
            r.results += found;
            r.empty += u64::from(found == 0);
            r.full += u64::from(found >= LIMIT as u64);
            phase.add(1);
        }
    }
    let searches = Throughput::new(queries * Kind::ALL.len() as u64, start.elapsed());
    drop(phase);
    let results = per_kind.values().map(|(_, r)| r.results).sum();
    let kinds = per_kind
        .into_iter()
        .map(|(k, (rec, mut r))| {
            let l = rec.summary();
            (r.p50_ms, r.p99_ms, r.max_ms) = (l.p50_ms, l.p99_ms, l.max_ms);
            r.mean_results = r.results as f64 / r.queries.max(1) as f64;
            (k.name().to_owned(), r)
        })
        .collect();
    Ok(SearchResult {
        stored_messages: messages,
        records,
        fill: fill_tp,
        store_bytes,
        reused_s5_store: false,
        limit: LIMIT as u64,
        window_share: WINDOW_SHARE,
        sample: sampled.len() as u64,
        searches,
        latency: all.summary(),
        results,
        kinds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(topic: &str, attrs: &[(&str, &str)], state: MessageState) -> MessageSummary {
        let mut s = MessageSummary {
            key: "k".into(),
            message_id: None,
            request_id: None,
            producer: None,
            topic: Some(topic.into()),
            state,
            groups: BTreeMap::new(),
            first_at: 1,
            last_at: 2,
            failure: None,
            records: 1,
            funnel: [false; 4],
            segments: Vec::new(),
            failed: state == MessageState::Failed,
            redelivered: false,
            dead_lettered: false,
            attrs: BTreeMap::new(),
            attempts: None,
        };
        for (k, v) in attrs {
            s.attrs.insert((*k).into(), (*v).into());
        }
        s
    }

    #[test]
    fn every_kind_filters_what_it_names_within_its_window() {
        for kind in Kind::ALL {
            for n in 0..kind.variants() {
                let q = kind.query(n, 10, 20);
                assert_eq!((q.from, q.to, q.limit), (Some(10), Some(20), Some(LIMIT)));
                let filters = [
                    q.topic_pattern.is_some(),
                    q.attr.is_some(),
                    q.failed,
                    q.state.is_some(),
                ];
                let want = match kind {
                    Kind::TopicAttr => 2,
                    _ => 1,
                };
                assert_eq!(filters.iter().filter(|f| **f).count(), want, "{kind:?}");
            }
        }
        assert_eq!(Kind::TopicAttr.variants(), 6);
    }

    #[test]
    fn selectivity_is_the_share_a_kind_selects_averaged_over_its_variants() {
        let c = MessageState::Consumed;
        let sample = vec![
            summary(
                "orders.paid",
                &[("region", "eu-west"), ("category", "sale")],
                c,
            ),
            summary("billing.invoice", &[("region", "us-east")], c),
            summary(
                "users.signup",
                &[("region", "eu-west")],
                MessageState::Failed,
            ),
            summary("shipping.track", &[], MessageState::DeadLettered),
        ];
        // orders.* 1 of 4, billing.> 1 of 4, shipping.* 1 of 4.
        assert!((selectivity(Kind::Topic, &sample) - 0.25).abs() < 1e-12);
        // eu-west 2, eu-central 0, us-east 1, ap-south 0: (2 + 0 + 1 + 0) / 4 / 4.
        assert!((selectivity(Kind::Attr, &sample) - 3.0 / 16.0).abs() < 1e-12);
        // Only orders.* with sale: 1 of 4 in one of six variants.
        assert!((selectivity(Kind::TopicAttr, &sample) - 0.25 / 6.0).abs() < 1e-12);
        assert!((selectivity(Kind::Failed, &sample) - 0.25).abs() < 1e-12);
        assert!((selectivity(Kind::DeadLettered, &sample) - 0.25).abs() < 1e-12);
        assert_eq!(selectivity(Kind::Topic, &[]), 0.0);
    }

    #[test]
    fn a_small_store_answers_every_kind_with_a_fraction() {
        let r = run(3_000, 10, &Progress::new(false)).expect("S7 runs");
        assert_eq!(r.stored_messages, 3_000);
        assert!(r.records > 3_000 * 8, "{r:?}");
        assert_eq!(r.sample, 3_000, "every message sampled: {r:?}");
        assert_eq!(r.kinds.len(), Kind::ALL.len());
        for (name, k) in &r.kinds {
            assert_eq!(k.queries, 10, "{name}");
            assert!(k.results > 0, "{name}: {k:?}");
            assert!(
                k.selectivity > 0.0 && k.selectivity < 0.6,
                "{name} selects a fraction: {k:?}"
            );
            assert!(
                k.p99_ms >= k.p50_ms && k.max_ms >= k.p99_ms,
                "{name}: {k:?}"
            );
        }
        assert_eq!(r.latency.count, 10 * Kind::ALL.len() as u64);
        assert_eq!(r.results, r.kinds.values().map(|k| k.results).sum::<u64>());
    }
}
