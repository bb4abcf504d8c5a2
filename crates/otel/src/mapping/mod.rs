//! From a [`Trajectory`]'s hops to OpenTelemetry [`SpanData`], built after the fact with
//! explicit IDs and times (docs/ARCHITECTURE.md §3, decision 10; opentelemetry 0.32 removed
//! `SpanBuilder::with_trace_id`, so `SpanData` is filled directly).
//!
//! | hop | span name | kind | `service.name` | parent | `messaging.operation.type` |
//! | --- | --- | --- | --- | --- | --- |
//! | `send` (P1 → P4) | `send {topic}` | PRODUCER | the producer's | none: the root | `send` |
//! | `store` (P2 → P3) | `store {topic}` | CONSUMER | the broker's | `send` | `process` |
//! | `deliver` (C1 → C4, C5 → C8) | `deliver {topic}` | PRODUCER | the broker's | `store` | `send` (push and pull) |
//! | `process` (C2/C6 → C3/C7, X1, X2) | `process {topic}` | CONSUMER | the consumer's | its `deliver` | `process` |
//!
//! The kinds pair up as PRODUCER → CONSUMER twice, so Tempo's service graph draws
//! producer → broker → consumer; the operation types agree with the kinds as the messaging
//! conventions pair them (`send` with PRODUCER, `process` with CONSUMER; `receive` would be a
//! CLIENT span). IDs:
//!
//! - trace ID = the message ID's 16 bytes ([`msgtrail_core::trace_ids::trace_id`]); for an
//!   upload that never reached the broker, the orphan hash of (producer, request ID);
//! - span ID = [`msgtrail_core::trace_ids::span_id`] of (message ID, hop); an orphan's only
//!   span, its `send`, takes the last 8 bytes of the orphan trace ID (`00…01` if zero);
//! - observe mode ([`msgtrail_core::observed`]): when the stored message carried a W3C
//!   `traceparent`, the trace ID is the producer's and the root (`send`) span's parent is
//!   the producer's span (remote), so the hops show inside the app's own trace; every span
//!   of an observed trajectory carries `msgtrail.observed = true`.
//!
//! Every stage record of a hop becomes a span event at its exact time, named
//! `{code} {what}` (`P1 upload sent`) with the record's IDs as attributes. A failed or
//! timed-out hop has status ERROR with the trajectory's reason as description and an
//! `error.type`. A synthesized root (no producer record) carries `msgtrail.synthesized =
//! true`. A producer's W3C `traceparent` becomes a link on the send span.
//!
//! Attributes follow the messaging semantic conventions: `messaging.system` (`msgtrail`),
//! `messaging.operation.name` / `.type`, `messaging.destination.name` (the topic),
//! `messaging.message.id`, `messaging.message.conversation_id` (the request ID),
//! `messaging.consumer.group.name`, `messaging.client.id`, `messaging.message.body.size`;
//! names come from `opentelemetry-semantic-conventions`. msgtrail's own are under
//! `msgtrail.*` (`msgtrail.hop.key`, `msgtrail.hop.status`, `msgtrail.attempt`,
//! `msgtrail.delivery.mode`, `msgtrail.synthesized`, …), each defined with a brief, a type
//! and examples in the project's semantic-convention registry, `semconv/` at the repository
//! root (checked by OTel Weaver, `scripts/semconv-live-check.sh`).
//!
//! ## Layout
//! This module holds the options and the mapping of a hop ([`hop_span`]) and of a whole
//! trajectory ([`trajectory_spans`]); `ids` the trace and span IDs, parents, hop keys and
//! `traceparent` links; `events` the stage records as span events; `attributes` the
//! attributes, operation, kind, service and `error.type` of a hop.

use msgtrail_core::outcome::{Outcome, ProcessOutcome, RedeliveryOutcome, SettleOutcome};
use msgtrail_core::trace_ids::{self, Hop};
use msgtrail_core::trajectory::{DeliveryMode, HopId, HopKind, HopSpan, HopStatus, Trajectory};
use msgtrail_core::{MessageId, Stage, StageRecord};
use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
use opentelemetry::trace::{
    Event, Link, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use opentelemetry_semantic_conventions::attribute;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod attributes;
mod events;
mod ids;

use attributes::*;
use events::*;
pub(crate) use ids::trajectory_trace_id;
use ids::*;
pub use ids::{orphan_send_span_id, parse_hop_key, parse_traceparent, process_span_context};

/// `msgtrail.hop.key`: the hop a span is (`send`, `store`, `deliver/<group>/<consumer>/<n>`,
/// `process/…`). Not `msgtrail.hop`, which would be both an attribute and the prefix of
/// `msgtrail.hop.status` (semconv/ defines every `msgtrail.*` attribute).
pub(crate) const HOP_KEY: &str = "msgtrail.hop.key";

/// `msgtrail.broker.instance`: on broker-side spans (store, deliver), the broker process
/// whose records (and clock) the span's times come from.
pub(crate) const BROKER_INSTANCE: &str = "msgtrail.broker.instance";

/// The instrumentation scope name of every span msgtrail emits.
pub(crate) const SCOPE_NAME: &str = "msgtrail";

/// `messaging.system` of msgtrail spans.
pub(crate) const MESSAGING_SYSTEM: &str = "msgtrail";

/// The broker's `service.name` when neither its records nor `OTEL_SERVICE_NAME` give one.
pub(crate) const DEFAULT_BROKER_SERVICE: &str = "msgtrail-broker";

/// How to map hops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappingOptions {
    /// `service.name` of broker hops whose records name no service (`OTEL_SERVICE_NAME` of
    /// the listener, by default `DEFAULT_BROKER_SERVICE`).
    pub broker_service: String,
    /// The current time, Unix nanoseconds: the end of an errored hop that never ended (its
    /// deadline closed it). Without it, such a hop ends at its last event.
    pub now: Option<u64>,
}

impl Default for MappingOptions {
    fn default() -> Self {
        MappingOptions {
            broker_service: DEFAULT_BROKER_SERVICE.to_owned(),
            now: None,
        }
    }
}

/// A span with the `service.name` of the party that did the work: the exporter groups spans
/// by it into OTLP resources.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceSpan {
    /// The resource's `service.name`.
    pub service_name: String,
    /// The span.
    pub span: SpanData,
}

/// Maps one hop of `t` to a span. `None` when the trajectory has no trace ID (no message ID
/// and no producer/request ID) or the hop's span ID cannot be computed.
pub fn hop_span(t: &Trajectory, hop: &HopSpan, opts: &MappingOptions) -> Option<ServiceSpan> {
    let trace_id = trajectory_trace_id(t)?;
    let span_id = hop_span_id(t, hop, trace_id)?;
    let (op_name, op_type, kind) = operation(hop);
    let name = match &t.topic {
        Some(topic) => format!("{op_name} {topic}"),
        None => op_name.to_owned(),
    };

    let mut attrs = common_attributes(t, hop, op_name, op_type);
    match hop.kind {
        HopKind::Send | HopKind::Store => producer_attributes(t, hop, &mut attrs),
        HopKind::Deliver | HopKind::Process => consumer_attributes(hop, &mut attrs),
    }
    detail_attributes(hop, &mut attrs);
    observed_attributes(t, &mut attrs);
    let status = match hop.status {
        HopStatus::Error => {
            attrs.push(KeyValue::new(attribute::ERROR_TYPE, error_type(hop)));
            Status::error(hop.reason.clone().unwrap_or_else(|| "failed".to_owned()))
        }
        HopStatus::Ok | HopStatus::Incomplete => Status::Unset,
    };

    let (events, links) = events_and_links(t, hop);
    let end = span_end(hop, opts);

    let mut span_events = SpanEvents::default();
    span_events.events = events;
    let mut span_links = SpanLinks::default();
    span_links.links = links;
    let span = SpanData {
        span_context: SpanContext::new(
            trace_id,
            span_id,
            TraceFlags::SAMPLED,
            false,
            TraceState::NONE,
        ),
        parent_span_id: parent_span_id(t, hop),
        // Only the root of an observed trajectory has a parent outside it: the producer's.
        parent_span_is_remote: hop.parent.is_none() && joined_trace(t).is_some(),
        span_kind: kind,
        name: name.into(),
        start_time: time(hop.start),
        end_time: time(end),
        attributes: attrs,
        dropped_attributes_count: 0,
        events: span_events,
        links: span_links,
        status,
        instrumentation_scope: scope(),
    };
    Some(ServiceSpan {
        service_name: service_name(t, hop, opts),
        span,
    })
}

/// Where the span ends: the hop's end, else (failed hops) now, else its last record; never
/// before it starts.
fn span_end(hop: &HopSpan, opts: &MappingOptions) -> u64 {
    let last_event = hop.events.iter().map(|r| r.at).max();
    hop.end
        .or(match hop.status {
            HopStatus::Error => opts.now.or(last_event),
            _ => last_event,
        })
        .unwrap_or(hop.start)
        .max(hop.start)
}

fn scope() -> InstrumentationScope {
    InstrumentationScope::builder(SCOPE_NAME)
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}

/// Maps every hop of `t` that has ended (ok, or error: failed or closed by its deadline);
/// open hops are left for later.
pub fn trajectory_spans(t: &Trajectory, opts: &MappingOptions) -> Vec<ServiceSpan> {
    t.hops
        .iter()
        .filter(|h| h.status != HopStatus::Incomplete)
        .filter_map(|h| hop_span(t, h, opts))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use msgtrail_core::trajectory::AssembleOptions;
    use msgtrail_core::{ClientId, RequestId};

    const T0: u64 = 1_796_126_400_000_000_000;

    fn message_id() -> MessageId {
        "0193a5f2-7c1e-7b2a-9f10-3c4d5e6f7a8b".parse().unwrap()
    }

    /// An uploaded and stored message (P1–P4): its send and store hops.
    fn stored() -> Trajectory {
        let producer = ClientId::new("shop").unwrap();
        let request = RequestId::new("order-42").unwrap();
        let records: Vec<StageRecord> = [
            Stage::UploadSent,
            Stage::UploadReceived,
            Stage::Stored,
            Stage::StoreConfirmed,
        ]
        .into_iter()
        .zip(0..)
        .map(|(stage, ms)| {
            let mut r = StageRecord::at(stage, T0 + ms * 1_000_000);
            r.producer = Some(producer.clone());
            r.request_id = Some(request.clone());
            r.topic = Some("orders".into());
            if stage != Stage::UploadSent {
                r.message_id = Some(message_id());
            }
            r
        })
        .collect();
        Trajectory::assemble(records, &AssembleOptions::default()).expect("a trajectory")
    }

    fn hop(t: &Trajectory, kind: HopKind) -> HopSpan {
        t.hops
            .iter()
            .find(|h| h.kind == kind)
            .cloned()
            .unwrap_or_else(|| panic!("no {kind:?} hop in {t:?}"))
    }

    fn with_outcome(stage: Stage, outcome: &str) -> StageRecord {
        let mut r = StageRecord::at(stage, T0);
        r.outcome = Some(outcome.into());
        r
    }

    #[test]
    fn error_type_names_the_most_telling_outcome() {
        let mut h = hop(&stored(), HopKind::Store);
        let dead = with_outcome(Stage::Redelivery, "dead_letter");
        let failed = with_outcome(Stage::ProcessFinished, "failed");
        let nack = with_outcome(Stage::PullAckSent, "nack");
        let cases = [
            (vec![failed.clone(), dead], "dead_letter"),
            (vec![nack.clone(), failed], "processing_failed"),
            (
                vec![with_outcome(Stage::PushAckReceived, "term"), nack.clone()],
                "nack",
            ),
            (vec![with_outcome(Stage::PushAckReceived, "term")], "term"),
            (vec![with_outcome(Stage::Redelivery, "redeliver")], "no_ack"),
            // An outcome is read only where its stage has it: "failed" on a settle is none.
            (vec![with_outcome(Stage::PullAckSent, "failed")], "error"),
        ];
        for (events, want) in cases {
            h.events = events;
            h.end = Some(T0);
            assert_eq!(error_type(&h), want, "{:?}", h.events);
        }
        h.events.clear();
        h.end = None;
        assert_eq!(
            error_type(&h),
            "timeout",
            "a hop closed by its deadline never ended"
        );
    }

    #[test]
    fn span_kinds_draw_producer_broker_consumer() {
        let mut h = hop(&stored(), HopKind::Send);
        let mut seen = Vec::new();
        for kind in [
            HopKind::Send,
            HopKind::Store,
            HopKind::Deliver,
            HopKind::Process,
        ] {
            h.kind = kind;
            seen.push(operation(&h));
        }
        assert_eq!(
            seen,
            [
                ("send", "send", SpanKind::Producer),
                ("store", "process", SpanKind::Consumer),
                ("deliver", "send", SpanKind::Producer),
                ("process", "process", SpanKind::Consumer),
            ]
        );
    }

    #[test]
    fn service_names_fall_back_to_the_client_ids_and_the_broker() {
        let t = stored();
        let opts = MappingOptions::default();
        let mut h = hop(&t, HopKind::Send);
        h.service = Some(String::new());
        assert_eq!(
            service_name(&t, &h, &opts),
            "shop",
            "an empty service is no service"
        );
        h.service = Some("shop-frontend".into());
        assert_eq!(service_name(&t, &h, &opts), "shop-frontend");
        h.service = None;
        h.kind = HopKind::Store;
        assert_eq!(service_name(&t, &h, &opts), DEFAULT_BROKER_SERVICE);
        h.kind = HopKind::Process;
        h.consumer = None;
        assert_eq!(service_name(&t, &h, &opts), "unknown-consumer");
        h.consumer = Some(ClientId::new("billing-1").unwrap());
        assert_eq!(service_name(&t, &h, &opts), "billing-1");
        let mut orphan = t.clone();
        orphan.producer = None;
        h.kind = HopKind::Send;
        assert_eq!(service_name(&orphan, &h, &opts), "unknown-producer");
    }

    #[test]
    fn a_parent_without_records_still_has_its_computed_id() {
        let mut t = stored();
        let trace = trajectory_trace_id(&t).expect("a message ID");
        let send = hop(&t, HopKind::Send);
        let store = hop(&t, HopKind::Store);
        assert_eq!(store.parent.as_deref(), Some(send.key.as_str()));
        let want = hop_span_id(&t, &send, trace).expect("computable");
        assert_eq!(parent_span_id(&t, &store), want);
        // Without the parent hop in the trajectory, its ID comes from its key.
        t.hops.retain(|h| h.kind != HopKind::Send);
        assert_eq!(parent_span_id(&t, &store), want);
        let mut root = send;
        root.parent = None;
        assert_eq!(parent_span_id(&t, &root), SpanId::INVALID);
    }

    #[test]
    fn an_orphan_send_span_id_is_never_zero() {
        let mut bytes = [0xab; 16];
        bytes[8..].copy_from_slice(&[0, 0, 0, 0, 0, 0, 0, 7]);
        let id = orphan_send_span_id(TraceId::from_bytes(bytes));
        assert_eq!(id, SpanId::from_bytes([0, 0, 0, 0, 0, 0, 0, 7]));
        let zero_low = orphan_send_span_id(TraceId::from_bytes(
            [[0xab; 8], [0; 8]].concat().try_into().unwrap(),
        ));
        assert_eq!(zero_low, SpanId::from_bytes([0, 0, 0, 0, 0, 0, 0, 1]));
    }

    #[test]
    fn a_record_becomes_an_event_at_its_time_with_its_ids() {
        let mut r = StageRecord::at(Stage::UploadSent, T0 + 5);
        r.request_id = Some(RequestId::new("order-42").unwrap());
        r.attempt = Some(2);
        r.topic = Some("orders".into());
        let e = record_event(&r);
        assert_eq!(e.name, "P1 upload sent");
        assert_eq!(e.timestamp, UNIX_EPOCH + Duration::from_nanos(T0 + 5));
        let attr = |k: &str| {
            e.attributes
                .iter()
                .find(|kv| kv.key.as_str() == k)
                .map(|kv| kv.value.clone())
        };
        assert_eq!(attr("msgtrail.stage"), Some("P1".into()));
        assert_eq!(attr("msgtrail.attempt"), Some(2i64.into()));
        assert_eq!(
            attr(attribute::MESSAGING_MESSAGE_CONVERSATION_ID),
            Some("order-42".into())
        );
        assert_eq!(
            attr(attribute::MESSAGING_DESTINATION_NAME),
            Some("orders".into())
        );
        assert_eq!(
            attr(attribute::MESSAGING_MESSAGE_ID),
            None,
            "no empty attributes"
        );
    }
}
