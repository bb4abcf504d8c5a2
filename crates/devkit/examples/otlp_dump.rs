//! Prints every span an OTLP exporter sends, one line each: a stand-in for Jaeger when
//! trying the listener's export on a machine without Docker.
//!
//! ```text
//! cargo run -p msgtrail-devkit --example otlp_dump -- grpc 127.0.0.1:4317
//! OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 OTEL_EXPORTER_OTLP_PROTOCOL=grpc msgtrail listener
//! ```
//!
//! The first argument is `grpc` or `http` (OTLP/HTTP protobuf on `/v1/traces`), the second
//! the address to listen on (default `127.0.0.1:4317` or `127.0.0.1:4318`).

use msgtrail_devkit::{flatten, OtlpProtocol, OtlpReceiver};
use std::time::Duration;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let (protocol, default) = match args.next().as_deref() {
        Some("http") => (OtlpProtocol::HttpProtobuf, "127.0.0.1:4318"),
        _ => (OtlpProtocol::Grpc, "127.0.0.1:4317"),
    };
    let addr = args
        .next()
        .unwrap_or_else(|| default.to_owned())
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut rx = OtlpReceiver::start(protocol, Some(addr)).await?;
    eprintln!("OTLP {protocol:?} receiver on {}", rx.endpoint());
    loop {
        let Some(req) = rx.next_request(Duration::from_secs(3600)).await else {
            continue;
        };
        for s in flatten(&[req]) {
            let status = s.span.status.as_ref().map_or(0, |st| st.code);
            println!(
                "trace={} span={} parent={:<16} service={:<16} status={} name={:?} events={}",
                s.trace_hex(),
                s.span_hex(),
                s.parent_hex(),
                s.service_name,
                status,
                s.span.name,
                s.span
                    .events
                    .iter()
                    .map(|e| e.name.split(' ').next().unwrap_or_default())
                    .collect::<Vec<_>>()
                    .join(",")
            );
        }
    }
}
