//! A trajectory's hops as the trace exporter maps them (`GET /api/messages/{id}/spans`): per
//! hop its span's name, kind, `service.name` and the exported `msgtrail.*`/`messaging.*`
//! attributes, so that the page's hop detail shows what Jaeger or Tempo will show.
//!
//! The mapping is `msgtrail_otel::hop_span` itself (not a copy), with the broker's default
//! `service.name` when its records name none; an open hop is mapped as it stands now.

use msgtrail_core::trajectory::Trajectory;
use msgtrail_otel::{hop_span, MappingOptions};
use serde::{Deserialize, Serialize};

/// The exported spans of one trajectory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TrajectorySpans {
    /// One per hop that maps to a span, in the trajectory's hop order.
    pub spans: Vec<HopSpanView>,
}

/// One hop's span, as exported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HopSpanView {
    /// The hop key (`send`, `store`, `deliver/<group>/<consumer>/<attempt>`, …).
    pub hop: String,
    /// The span ID, 16 hex digits.
    pub span_id: String,
    /// The span name.
    pub name: String,
    /// The span kind (`Producer`, `Consumer`, `Internal`, …).
    pub kind: String,
    /// The resource's `service.name`.
    pub service: String,
    /// The span's attributes as `[key, value]`, in the exporter's order.
    pub attributes: Vec<(String, String)>,
}

/// Maps each hop of `t` as the exporter would at `now` (Unix nanoseconds).
pub(crate) fn spans(t: &Trajectory, now: u64) -> TrajectorySpans {
    let opts = MappingOptions {
        now: Some(now),
        ..MappingOptions::default()
    };
    let spans = t
        .hops
        .iter()
        .filter_map(|h| {
            let s = hop_span(t, h, &opts)?;
            Some(HopSpanView {
                hop: h.key.clone(),
                span_id: s.span.span_context.span_id().to_string(),
                name: s.span.name.to_string(),
                kind: format!("{:?}", s.span.span_kind),
                service: s.service_name,
                attributes: s
                    .span
                    .attributes
                    .iter()
                    .map(|kv| (kv.key.as_str().to_owned(), kv.value.to_string()))
                    .collect(),
            })
        })
        .collect();
    TrajectorySpans { spans }
}
