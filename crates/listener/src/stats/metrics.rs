//! The Prometheus side: the hop-latency histogram with trace-ID exemplars, a snapshot's
//! counters and gauges in a [`Registry`], and the text exposition ([`Exposition`]).

use super::*;

/// The labels of `msgtrail_hop_latency_seconds`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct HopLabels {
    pub(super) topic: String,
    pub(super) segment: &'static str,
}

/// The exemplar label: `trace_id`, the message ID as the 32 hex digits of its trace ID.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct TraceLabel {
    pub(super) trace_id: TraceHex,
}

/// A message ID written as its trace ID (32 lowercase hex digits, no dashes) when encoded,
/// so that recording a sample allocates nothing for its exemplar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct TraceHex(pub(super) MessageId);

impl EncodeLabelValue for TraceHex {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        use std::fmt::Write as _;
        write!(encoder, "{:032x}", self.0.as_u128())
    }
}

/// The latency histograms per (topic, segment).
pub(super) type HopLatency = Family<
    HopLabels,
    HistogramWithExemplars<TraceLabel>,
    fn() -> HistogramWithExemplars<TraceLabel>,
>;

/// Upper bounds of the latency buckets, seconds: 0.5 ms to 5 min, about 2.5× apart (a
/// message's hops range from sub-millisecond stores to consumers that hold it for minutes).
pub(super) const LATENCY_BUCKETS: [f64; 17] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
];

/// A new latency histogram with [`LATENCY_BUCKETS`].
pub(super) fn hop_histogram() -> HistogramWithExemplars<TraceLabel> {
    HistogramWithExemplars::new(LATENCY_BUCKETS.into_iter())
}

/// Label pairs of a sample.
pub(super) type Labels = Vec<(&'static str, String)>;

/// A counter holding `v`.
pub(super) fn counter(v: u64) -> PromCounter {
    let c = PromCounter::default();
    c.inc_by(v);
    c
}

/// A gauge holding `v` (saturating at `i64::MAX`).
pub(super) fn gauge(v: u64) -> Gauge {
    let g = Gauge::default();
    g.set(i64::try_from(v).unwrap_or(i64::MAX));
    g
}

/// A gauge holding the float `v`.
pub(super) fn gauge_f64(v: f64) -> Gauge<f64, AtomicU64> {
    let g = Gauge::<f64, AtomicU64>::default();
    g.set(v);
    g
}

/// A counter family with one `key` label, from (value, count) pairs.
pub(super) fn counters<'a>(
    key: &'static str,
    rows: impl IntoIterator<Item = (&'a str, u64)>,
) -> Family<Labels, PromCounter> {
    let f = Family::<Labels, PromCounter>::default();
    for (k, v) in rows {
        f.get_or_create(&vec![(key, k.to_owned())]).inc_by(v);
    }
    f
}

/// `msgtrail_messages`: by state, and by topic too when the snapshot has topics.
pub(super) fn messages_by_state(s: &StatsSnapshot) -> Family<Labels, Gauge> {
    let f = Family::<Labels, Gauge>::default();
    if s.topics.is_empty() {
        for st in MessageState::ALL {
            let n = s.states.get(st).copied().unwrap_or(0);
            f.get_or_create(&vec![("state", st.to_string())])
                .set(gauge(n).get());
        }
    } else {
        for (t, states) in &s.topics {
            for st in MessageState::ALL {
                let n = states.get(st).copied().unwrap_or(0);
                f.get_or_create(&vec![("topic", t.clone()), ("state", st.to_string())])
                    .set(gauge(n).get());
            }
        }
    }
    f
}

/// Adds a snapshot's counters and gauges to `r`, under the names the deploy/ dashboard and
/// docs/API.md name (a counter's `_total` is added by the encoder).
pub(crate) fn register_snapshot(s: &StatsSnapshot, r: &mut Registry) {
    register_messages(s, r);
    register_ingest(s, r);
}

/// What happened to the messages: states, funnel, events, stage records.
fn register_messages(s: &StatsSnapshot, r: &mut Registry) {
    r.register(
        "msgtrail_messages",
        "Shadow messages by topic and state",
        messages_by_state(s),
    );
    r.register(
        "msgtrail_funnel_messages",
        "Messages that reached each step: sent, stored, delivered, acked",
        counters(
            "step",
            [
                ("sent", s.funnel.sent),
                ("stored", s.funnel.stored),
                ("delivered", s.funnel.delivered),
                ("acked", s.funnel.acked),
            ],
        ),
    );
    r.register(
        "msgtrail_events",
        "Notable events: duplicates, request IDs stored again after the dedup window, redeliveries, dead letters, no-match notices, refused channels, retention deletions",
        counters(
            "event",
            [
                ("duplicate", s.events.duplicates),
                ("duplicate_after_window", s.events.duplicates_after_window),
                ("redelivery", s.events.redeliveries),
                ("dead_letter", s.events.dead_letters),
                ("no_match", s.events.no_match),
                ("channel_refused", s.events.channels_refused),
                ("retention_deleted", s.events.retention_deleted),
            ],
        ),
    );
    r.register(
        "msgtrail_stage_records",
        "Stage records ingested, by stage code",
        counters("stage", s.stages.iter().map(|(k, v)| (k.as_str(), *v))),
    );
}

/// How the listener's own ingest goes: its error and skip counters, its backlog and lag.
fn register_ingest(s: &StatsSnapshot, r: &mut Registry) {
    let plain_counters = [
        (
            "msgtrail_listener_decode_errors",
            "Stage-stream messages dropped because they could not be decoded",
            s.ingest.decode_errors,
        ),
        (
            "msgtrail_listener_store_errors",
            "Store transactions that failed (a full disk, an I/O error); their batches are kept unacknowledged and tried again",
            s.ingest.store_errors,
        ),
        (
            "msgtrail_listener_store_outages",
            "Episodes during which the store could not write, since start",
            s.ingest.store_outages,
        ),
        (
            "msgtrail_listener_repeated_records",
            "Redelivered stage records skipped because they were already applied",
            s.ingest.repeated_records,
        ),
        (
            "msgtrail_listener_stored_messages",
            "Stored messages of the message stream applied as store evidence (P2/P3), since start",
            s.ingest.stored_messages,
        ),
        (
            "msgtrail_listener_stored_without_evidence",
            "Stored messages that carried no usable store evidence (none, or a malformed Msgtrail-Stored), since start",
            s.ingest.stored_without_evidence,
        ),
    ];
    for (name, help, v) in plain_counters {
        r.register(name, help, counter(v));
    }
    let plain_gauges = [
        (
            "msgtrail_listener_store_writable",
            "1 while the store commits its transactions, 0 while it cannot write (full disk, I/O error)",
            u64::from(s.ingest.store_unwritable_since.is_none()),
        ),
        (
            "msgtrail_listener_stored_pending_messages",
            "Stored messages not yet delivered to the listener's store-evidence consumer",
            s.lag.stored_pending,
        ),
        (
            "msgtrail_listener_stored_ack_pending_messages",
            "Stored messages delivered to the store-evidence consumer and not yet applied",
            s.lag.stored_ack_pending,
        ),
        (
            "msgtrail_listener_pending_messages",
            "Stage-stream messages not yet delivered to the listener",
            s.lag.pending,
        ),
        (
            "msgtrail_listener_ack_pending_messages",
            "Stage-stream messages delivered to the listener and not yet applied",
            s.lag.ack_pending,
        ),
    ];
    for (name, help, v) in plain_gauges {
        r.register(name, help, gauge(v));
    }
    r.register_with_unit(
        "msgtrail_listener_lag",
        "Age of the last applied stage-stream message when it was applied",
        Unit::Seconds,
        gauge_f64(s.lag.last_lag_ms.unwrap_or(0.0) / 1000.0),
    );
    r.register_with_unit(
        "msgtrail_listener_stored_lag",
        "Age of the last applied stored message (since JetStream stored it) when it was applied",
        Unit::Seconds,
        gauge_f64(s.lag.stored_last_lag_ms.unwrap_or(0.0) / 1000.0),
    );
}

/// The two text formats `/metrics` serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exposition {
    /// The Prometheus text format, version 0.0.4: what a scraper gets unless it asks for
    /// OpenMetrics. No exemplars.
    Prometheus,
    /// OpenMetrics 1.0 text, with the latency histograms' exemplars.
    OpenMetrics,
}

impl Exposition {
    /// The format an `Accept` header asks for: OpenMetrics when it names
    /// `application/openmetrics-text` with a quality above 0 and at least that of
    /// `text/plain` (Prometheus asks for OpenMetrics first), otherwise Prometheus text.
    pub(crate) fn negotiate(accept: Option<&str>) -> Exposition {
        let (mut openmetrics, mut plain) = (0.0_f64, 0.0_f64);
        for range in accept.unwrap_or("").split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.trim().strip_prefix("q="))
                .find_map(|q| q.trim().parse::<f64>().ok())
                .unwrap_or(1.0);
            match media.as_str() {
                "application/openmetrics-text" => openmetrics = openmetrics.max(q),
                "text/plain" => plain = plain.max(q),
                _ => {}
            }
        }
        if openmetrics > 0.0 && openmetrics >= plain {
            Exposition::OpenMetrics
        } else {
            Exposition::Prometheus
        }
    }

    /// The `Content-Type` of the format.
    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Exposition::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Exposition::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }

    /// Encodes a registry in the format (OpenMetrics ends with `# EOF`).
    pub(crate) fn encode(self, registry: &Registry) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        match self {
            Exposition::Prometheus => {
                prometheus_client::encoding::prometheus_text::encode(&mut out, registry)?
            }
            Exposition::OpenMetrics => {
                prometheus_client::encoding::text::encode(&mut out, registry)?
            }
        }
        Ok(out)
    }
}
