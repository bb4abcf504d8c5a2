//! # msgtrail-otel
//!
//! msgtrail's OpenTelemetry bridge: a message's trajectory (from
//! [`msgtrail_core::trajectory`]) becomes an ordinary trace — trace ID = message ID, one span
//! per hop with explicit IDs and times, every stage record a span event — exported over OTLP
//! to Jaeger, Tempo or any collector. It knows nothing about NATS: the listener feeds it
//! trajectories.
//!
//! ## Layout
//! - `mapping`: hop → [`SpanData`](opentelemetry_sdk::trace::SpanData) (names, kinds,
//!   messaging semantic-convention attributes, events, links, status), and the span context a
//!   consumer's handler can nest its own spans under ([`process_span_context`]).
//! - `sampling`: tail sampling — errors, stuck and slow trajectories always, healthy ones
//!   at a ratio and under a spans-per-second budget ([`TailSampler`]).
//! - `export`: a bounded, never-blocking queue in front of a worker that batches spans and
//!   keeps several OTLP requests in flight, over gRPC, HTTP/protobuf or HTTP/JSON, with
//!   retry, backoff and drop counters ([`TraceExporter`]); its module docs hold the
//!   exporter's contract and why the SDK's `BatchSpanProcessor` is not used.
//! - `otlp`: spans → OTLP request bodies with `opentelemetry-proto`, one `ResourceSpans`
//!   per `service.name` in one request.
//! - `transport`: one request on the wire (tonic for gRPC, hyper for HTTP).
//! - `pipeline`: the listener's entry point — observe a trajectory whenever it changes and
//!   each hop is exported once, after a grace, sampled, with left-out hops brought back when
//!   the trajectory turns bad ([`TracePipeline`]).
//! - `links`: links to a message's trace in Jaeger or Grafana/Tempo ([`TraceUi`]).
//! - `error`: configuration errors ([`ConfigError`]).

mod error;
mod export;
mod links;
mod mapping;
mod otlp;
mod pipeline;
mod sampling;
mod transport;

pub use error::ConfigError;
pub use export::{
    Compression, ExportConfig, ExportHandle, ExportStats, ExportStatsSnapshot, ExportedHook,
    ExportedHop, Protocol, TraceExporter,
};
pub use links::TraceUi;
pub use mapping::{
    hop_span, orphan_send_span_id, parse_hop_key, parse_traceparent, process_span_context,
    trajectory_spans, MappingOptions, ServiceSpan,
};
pub use otlp::{encode as encode_otlp, Encoding, Resources};
pub use pipeline::{export_requested, export_requested_in, PipelineConfig, TracePipeline};
pub use sampling::{in_ratio, Decision, KeepReason, SamplingPolicy, TailSampler};
