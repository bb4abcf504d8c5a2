//! The IDs of the spans: a trajectory's trace ID, each hop's span ID and parent, the hop
//! keys, and a producer's W3C `traceparent` as a link.

use super::*;

/// The trace ID of a trajectory: the producer's when an observed message carried a
/// `traceparent` ([`msgtrail_core::observed::ObservedTrace`]), else its message ID, or the
/// orphan-upload hash.
pub(crate) fn trajectory_trace_id(t: &Trajectory) -> Option<TraceId> {
    if let Some(j) = joined_trace(t) {
        return Some(TraceId::from_bytes(j.trace_id));
    }
    if let Some(m) = &t.message_id {
        return Some(TraceId::from_bytes(trace_ids::trace_id(m)));
    }
    match (&t.producer, &t.request_id) {
        (Some(p), Some(r)) => Some(TraceId::from_bytes(trace_ids::orphan_trace_id(p, r))),
        _ => None,
    }
}

/// The span ID of the only span of an orphan upload (its `send`): the last 8 bytes of the
/// orphan trace ID, `00…01` if they are all zero.
pub fn orphan_send_span_id(trace_id: TraceId) -> SpanId {
    let bytes = trace_id.to_bytes();
    let mut out = [0u8; 8];
    out.copy_from_slice(&bytes[8..]);
    if out == [0; 8] {
        out[7] = 1;
    }
    SpanId::from_bytes(out)
}

/// The hop a hop key names ([`Hop::parse`], the grammar of docs/PROTOCOL.md §13); `None`
/// for a text that is not a hop key.
pub fn parse_hop_key(key: &str) -> Option<Hop<'_>> {
    Hop::parse(key).ok()
}

/// The span context of a message's process span for one delivery: what a consumer's
/// handler uses as the parent of its own spans, with no propagation (docs/ARCHITECTURE.md §3, decision 9). It is
/// marked remote and sampled.
///
/// ```
/// use msgtrail_core::MessageId;
/// use opentelemetry::trace::TraceContextExt;
///
/// let id: MessageId = "0193a5f2-7c1e-7b2a-9f10-3c4d5e6f7a8b".parse().unwrap();
/// let parent = msgtrail_otel::process_span_context(&id, "billing", "billing-1", 1);
/// assert_eq!(parent.trace_id().to_string(), id.trace_hex());
/// // Spans started in this context are children of the message's process span.
/// let cx = opentelemetry::Context::new().with_remote_span_context(parent);
/// # let _ = cx;
/// ```
pub fn process_span_context(
    message_id: &MessageId,
    group: &str,
    consumer: &str,
    attempt: u32,
) -> SpanContext {
    let hop = Hop::Process {
        group,
        consumer,
        attempt,
    };
    SpanContext::new(
        TraceId::from_bytes(trace_ids::trace_id(message_id)),
        SpanId::from_bytes(trace_ids::span_id(message_id, &hop)),
        TraceFlags::SAMPLED,
        true,
        TraceState::NONE,
    )
}

/// Parses a W3C `traceparent` (`00-<trace>-<span>-<flags>`) into a remote span context,
/// with the SDK's [`TraceContextPropagator`] (the W3C grammar, as every OpenTelemetry SDK
/// reads it: lowercase hex, version `ff` refused, no extra fields in version `00`, flags
/// other than `sampled` cleared). `None` when it is not a valid traceparent.
pub fn parse_traceparent(value: &str) -> Option<SpanContext> {
    use opentelemetry::trace::TraceContextExt as _;
    let cx = TraceContextPropagator::new().extract(&OneHeader(value));
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid().then(|| sc.clone())
}

/// A carrier holding only a `traceparent`.
pub(super) struct OneHeader<'a>(&'a str);

impl Extractor for OneHeader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        key.eq_ignore_ascii_case("traceparent").then_some(self.0)
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent"]
    }
}

pub(super) fn hop_span_id(t: &Trajectory, hop: &HopSpan, trace_id: TraceId) -> Option<SpanId> {
    if let Some(hex) = &hop.span_id {
        return SpanId::from_hex(hex).ok();
    }
    match (&t.message_id, hop.kind) {
        (Some(m), _) => hop.id().ok().map(|h| SpanId::from_bytes(h.span_id(m))),
        (None, HopKind::Send) => Some(orphan_send_span_id(trace_id)),
        (None, _) => None,
    }
}

/// The producer's trace an observed trajectory joins, if any.
pub(super) fn joined_trace(t: &Trajectory) -> Option<msgtrail_core::observed::ObservedTrace> {
    t.observed.as_ref().and_then(|o| o.joins)
}

/// The parent of a hop's span: its parent hop's span; for the root of an observed trajectory
/// that joins the producer's trace, the producer's span (remote); otherwise none.
pub(super) fn parent_span_id(t: &Trajectory, hop: &HopSpan) -> SpanId {
    let Some(key) = &hop.parent else {
        return joined_trace(t).map_or(SpanId::INVALID, |j| SpanId::from_bytes(j.parent_span_id));
    };
    if let Some(p) = t.hop(key).and_then(|p| p.span_id.as_deref()) {
        if let Ok(id) = SpanId::from_hex(p) {
            return id;
        }
    }
    // The parent has no record yet: its ID is computable all the same.
    match (&t.message_id, key.parse::<HopId>()) {
        (Some(m), Ok(h)) => SpanId::from_bytes(h.span_id(m)),
        _ => SpanId::INVALID,
    }
}
