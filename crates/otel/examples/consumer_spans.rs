//! A consumer's own spans nested under the message's `process` span, with no propagation.
//!
//! The message's process span is computed from (message ID, group, consumer, attempt) — what
//! the msgtrail client hands a handler — so the application only makes it the parent of its
//! spans; the listener exports the process span itself, with the same IDs. With
//! `tracing` + `tracing-opentelemetry` instead of the OTel API, the same context goes to
//! `tracing::Span::current().set_parent(cx)`.
//!
//! Run it with an OTLP endpoint (Jaeger, Tempo, a collector):
//!
//! ```text
//! OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4317 \
//!   cargo run -p msgtrail-otel --example consumer_spans -- 0193a5f2-7c1e-7b2a-9f10-3c4d5e6f7a8b
//! ```
//!
//! and look the message ID up in the UI: `charge card` hangs under `process orders.eu`.

use msgtrail_core::MessageId;
use opentelemetry::trace::{Span, TraceContextExt, Tracer, TracerProvider};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let message_id: MessageId = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or_default();

    // The application's usual tracer; gRPC to OTEL_EXPORTER_OTLP_ENDPOINT (or localhost).
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name("billing").build())
        .build();
    let tracer = provider.tracer("billing-handler");

    // In the handler: the message's process span for this delivery is the parent.
    let parent = msgtrail_otel::process_span_context(&message_id, "billing", "billing-1", 1);
    let cx = Context::new().with_remote_span_context(parent.clone());
    let mut span = tracer.start_with_context("charge card", &cx);
    span.set_attribute(KeyValue::new("payment.amount", 42));
    // … the handler's work …
    span.end();

    println!(
        "span `charge card` in trace {} under process span {}",
        message_id.trace_hex(),
        parent.span_id()
    );
    tokio::task::spawn_blocking(move || provider.shutdown()).await??;
    Ok(())
}
