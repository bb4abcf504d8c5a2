//! A real OTLP trace receiver for tests, over gRPC or HTTP (protobuf or JSON bodies).
//!
//! It listens on `127.0.0.1` (a free port unless one is given, so a test can stop a receiver
//! and start another on the same address), and forwards every `ExportTraceServiceRequest` it
//! is sent into a channel that the test reads, as opentelemetry-otlp's own `tests/smoke.rs`
//! does. The protobuf is kept as it arrived, so assertions see exactly what Jaeger or Tempo
//! would get. Both transports accept gzip-compressed requests (`OTEL_EXPORTER_OTLP_COMPRESSION`);
//! [`OtlpReceiver::gzip_requests`] counts them. The HTTP receiver takes protobuf or OTLP/JSON
//! bodies by their `Content-Type`, as the OpenTelemetry Collector does (JSON decoded with
//! opentelemetry-proto's serde mapping: hex IDs, lowerCamelCase keys);
//! [`OtlpReceiver::json_requests`] counts the JSON ones.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use msgtrail_devkit::OtlpReceiver;
//! use std::time::Duration;
//!
//! let mut receiver = OtlpReceiver::start_grpc().await?;
//! // point an exporter at receiver.endpoint(), export, then:
//! let spans = receiver.spans(3, Duration::from_secs(5)).await;
//! assert_eq!(spans.len(), 3);
//! # Ok(()) }
//! ```

use axum::body::Bytes;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// Which OTLP transport a receiver speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP/gRPC: the `TraceService/Export` RPC.
    Grpc,
    /// OTLP/HTTP: `POST /v1/traces`, protobuf or JSON bodies.
    HttpProtobuf,
}

/// One received span with the `service.name` of the resource it came under.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// The resource's `service.name` attribute (empty when absent).
    pub service_name: String,
    /// The instrumentation scope's name.
    pub scope_name: String,
    /// The span as it arrived.
    pub span: Span,
}

impl ReceivedSpan {
    /// The span's trace ID as 32 lowercase hex digits.
    pub fn trace_hex(&self) -> String {
        hex(&self.span.trace_id)
    }

    /// The span's ID as 16 lowercase hex digits.
    pub fn span_hex(&self) -> String {
        hex(&self.span.span_id)
    }

    /// The parent span ID as hex, empty for a root span.
    pub fn parent_hex(&self) -> String {
        hex(&self.span.parent_span_id)
    }

    /// A string attribute of the span.
    pub fn attr(&self, key: &str) -> Option<String> {
        attr_string(&self.span.attributes, key)
    }
}

/// Lowercase hex of bytes.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A string rendering of the attribute `key` (strings as they are, other scalars formatted).
pub(crate) fn attr_string(attrs: &[KeyValue], key: &str) -> Option<String> {
    let v = attrs.iter().find(|kv| kv.key == key)?.value.as_ref()?;
    Some(match v.value.as_ref()? {
        AnyValue::StringValue(s) => s.clone(),
        AnyValue::BoolValue(b) => b.to_string(),
        AnyValue::IntValue(i) => i.to_string(),
        AnyValue::DoubleValue(d) => d.to_string(),
        other => format!("{other:?}"),
    })
}

/// Flattens requests into spans, each with its resource's `service.name`.
pub fn flatten(requests: &[ExportTraceServiceRequest]) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for req in requests {
        for rs in &req.resource_spans {
            let service_name = rs
                .resource
                .as_ref()
                .and_then(|r| attr_string(&r.attributes, "service.name"))
                .unwrap_or_default();
            for ss in &rs.scope_spans {
                let scope_name = ss
                    .scope
                    .as_ref()
                    .map(|s| s.name.clone())
                    .unwrap_or_default();
                for span in &ss.spans {
                    out.push(ReceivedSpan {
                        service_name: service_name.clone(),
                        scope_name: scope_name.clone(),
                        span: span.clone(),
                    });
                }
            }
        }
    }
    out
}

/// A running OTLP trace receiver; stopped on drop.
#[derive(Debug)]
pub struct OtlpReceiver {
    protocol: OtlpProtocol,
    addr: SocketAddr,
    requests: mpsc::UnboundedReceiver<ExportTraceServiceRequest>,
    gzip: Arc<AtomicU64>,
    json: Arc<AtomicU64>,
    throttle: Arc<Throttle>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

/// The channel to the test, the count of gzip-compressed requests and of JSON ones, and
/// the throttling the test asked for.
#[derive(Clone)]
struct Forward(
    mpsc::UnboundedSender<ExportTraceServiceRequest>,
    Arc<AtomicU64>,
    Arc<AtomicU64>,
    Arc<Throttle>,
);

/// Requests to refuse as a throttling receiver does ([`OtlpReceiver::throttle`]).
#[derive(Debug, Default)]
struct Throttle {
    /// How many more requests to refuse.
    remaining: AtomicU64,
    /// The wait to ask for, in milliseconds.
    wait_ms: AtomicU64,
    /// Requests refused so far.
    refused: AtomicU64,
}

impl Throttle {
    /// The wait to ask of this request, when it is to be refused.
    fn take(&self) -> Option<Duration> {
        self.remaining
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .ok()?;
        self.refused.fetch_add(1, Ordering::SeqCst);
        Some(Duration::from_millis(self.wait_ms.load(Ordering::SeqCst)))
    }
}

#[tonic::async_trait]
impl TraceService for Forward {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        if let Some(wait) = self.3.take() {
            use tonic_types::{ErrorDetails, StatusExt};
            return Err(tonic::Status::with_error_details(
                tonic::Code::Unavailable,
                "throttled",
                ErrorDetails::with_retry_info(Some(wait)),
            ));
        }
        if request
            .metadata()
            .get("grpc-encoding")
            .is_some_and(|v| v.as_bytes() == b"gzip")
        {
            self.1.fetch_add(1, Ordering::Relaxed);
        }
        // A test that stopped reading is not the exporter's problem: accept anyway.
        let _ = self.0.send(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

async fn http_export(
    axum::extract::State(tx): axum::extract::State<Forward>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> axum::response::Response {
    if let Some(wait) = tx.3.take() {
        // Retry-After is in whole seconds.
        let secs = wait.as_millis().div_ceil(1000).to_string();
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, secs)],
            "throttled",
        )
            .into_response();
    }
    let gzip = headers
        .get(header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
    let body = if gzip {
        use std::io::Read;
        tx.1.fetch_add(1, Ordering::Relaxed);
        let mut out = Vec::new();
        if let Err(e) = flate2::read::GzDecoder::new(&body[..]).read_to_end(&mut out) {
            return (StatusCode::BAD_REQUEST, format!("bad gzip body: {e}")).into_response();
        }
        Bytes::from(out)
    } else {
        body
    };
    let json = headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    let decoded = if json {
        tx.2.fetch_add(1, Ordering::Relaxed);
        serde_json::from_slice::<ExportTraceServiceRequest>(&body).map_err(|e| e.to_string())
    } else {
        ExportTraceServiceRequest::decode(body).map_err(|e| e.to_string())
    };
    let req = match decoded {
        Ok(req) => req,
        Err(e) => return (StatusCode::BAD_REQUEST, e).into_response(),
    };
    let _ = tx.0.send(req);
    let response = ExportTraceServiceResponse {
        partial_success: None,
    };
    if json {
        let body = serde_json::to_vec(&response).unwrap_or_default();
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response()
    } else {
        let body = response.encode_to_vec();
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/x-protobuf")],
            body,
        )
            .into_response()
    }
}

impl OtlpReceiver {
    /// Starts an OTLP/gRPC receiver on a free loopback port.
    pub async fn start_grpc() -> std::io::Result<Self> {
        Self::start(OtlpProtocol::Grpc, None).await
    }

    /// Starts an OTLP/HTTP (protobuf) receiver on a free loopback port.
    pub async fn start_http() -> std::io::Result<Self> {
        Self::start(OtlpProtocol::HttpProtobuf, None).await
    }

    /// Starts a receiver speaking `protocol` on `addr`, or on a free loopback port when
    /// `None` (use the address of a stopped receiver to bring "the collector" back).
    pub async fn start(protocol: OtlpProtocol, addr: Option<SocketAddr>) -> std::io::Result<Self> {
        let bind = addr.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
        let listener = tokio::net::TcpListener::bind(bind).await?;
        let addr = listener.local_addr()?;
        let (tx, requests) = mpsc::unbounded_channel();
        let (shutdown, signal) = oneshot::channel::<()>();
        let signal = async move {
            let _ = signal.await;
        };
        let gzip = Arc::new(AtomicU64::new(0));
        let json = Arc::new(AtomicU64::new(0));
        let throttle = Arc::new(Throttle::default());
        let forward = Forward(tx, gzip.clone(), json.clone(), throttle.clone());
        let task = match protocol {
            OtlpProtocol::Grpc => tokio::spawn(async move {
                let incoming = tonic::transport::server::TcpIncoming::from(listener);
                // Like the receivers of the OpenTelemetry Collector, Jaeger and Tempo
                // (grpc-go: flow-control windows sized to the bandwidth-delay product), not
                // hyper's fixed 64 KiB that would throttle large requests.
                let _ = tonic::transport::Server::builder()
                    .http2_adaptive_window(Some(true))
                    .add_service(
                        TraceServiceServer::new(forward)
                            .accept_compressed(tonic::codec::CompressionEncoding::Gzip),
                    )
                    .serve_with_incoming_shutdown(incoming, signal)
                    .await;
            }),
            OtlpProtocol::HttpProtobuf => tokio::spawn(async move {
                // The OpenTelemetry Collector's OTLP/HTTP receiver takes bodies up to 20 MiB
                // (axum's own default is 2 MB).
                let app = axum::Router::new()
                    .route("/v1/traces", axum::routing::post(http_export))
                    .layer(axum::extract::DefaultBodyLimit::max(20 << 20))
                    .with_state(forward);
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(signal)
                    .await;
            }),
        };
        Ok(OtlpReceiver {
            protocol,
            addr,
            requests,
            gzip,
            json,
            throttle,
            shutdown: Some(shutdown),
            task: Some(task),
        })
    }

    /// How many requests arrived gzip-compressed.
    pub fn gzip_requests(&self) -> u64 {
        self.gzip.load(Ordering::Relaxed)
    }

    /// Refuses the next `requests` requests as a receiver that throttles does, asking the
    /// exporter to wait `wait`: HTTP 429 with `Retry-After` (whole seconds, rounded up),
    /// gRPC `UNAVAILABLE` with a `RetryInfo` in the status details.
    pub fn throttle(&self, requests: u64, wait: Duration) {
        self.throttle
            .wait_ms
            .store(wait.as_millis() as u64, Ordering::SeqCst);
        self.throttle.remaining.store(requests, Ordering::SeqCst);
    }

    /// How many requests were refused by [`OtlpReceiver::throttle`].
    pub fn throttled_requests(&self) -> u64 {
        self.throttle.refused.load(Ordering::SeqCst)
    }

    /// How many requests arrived as OTLP/JSON.
    pub fn json_requests(&self) -> u64 {
        self.json.load(Ordering::Relaxed)
    }

    /// The transport it speaks.
    pub fn protocol(&self) -> OtlpProtocol {
        self.protocol
    }

    /// The socket address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The endpoint to give an exporter: `http://127.0.0.1:<port>` for gRPC, and the full
    /// `http://127.0.0.1:<port>/v1/traces` for HTTP (what `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
    /// and `with_endpoint` expect).
    pub fn endpoint(&self) -> String {
        match self.protocol {
            OtlpProtocol::Grpc => format!("http://{}", self.addr),
            OtlpProtocol::HttpProtobuf => format!("http://{}/v1/traces", self.addr),
        }
    }

    /// The next export request, or `None` after `timeout`.
    pub async fn next_request(&mut self, timeout: Duration) -> Option<ExportTraceServiceRequest> {
        tokio::time::timeout(timeout, self.requests.recv())
            .await
            .ok()
            .flatten()
    }

    /// Every request received so far, without waiting.
    pub fn drain(&mut self) -> Vec<ExportTraceServiceRequest> {
        let mut out = Vec::new();
        while let Ok(r) = self.requests.try_recv() {
            out.push(r);
        }
        out
    }

    /// Collects spans until at least `n` have arrived or `timeout` has passed, and returns
    /// what arrived (so a test can assert on the count and show what it got).
    pub async fn spans(&mut self, n: usize, timeout: Duration) -> Vec<ReceivedSpan> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut out = Vec::new();
        while out.len() < n {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next_request(left).await {
                Some(req) => out.extend(flatten(std::slice::from_ref(&req))),
                None => break,
            }
        }
        out
    }

    /// Stops listening and closes the connections; the port is free again when it returns.
    pub async fn stop(mut self) {
        self.stop_inner().await;
    }

    async fn stop_inner(&mut self) {
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        if let Some(task) = self.task.take() {
            // Graceful shutdown waits for open connections; an exporter keeps its own open,
            // so give it a moment and then cut it.
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_millis(500), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};

    fn request() -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![KeyValue {
                        key: "service.name".into(),
                        value: Some(opentelemetry_proto::tonic::common::v1::AnyValue {
                            value: Some(AnyValue::StringValue("svc".into())),
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans: vec![Span {
                        trace_id: vec![1; 16],
                        span_id: vec![2; 8],
                        name: "send orders".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[tokio::test]
    async fn grpc_requests_are_forwarded() {
        let mut rx = OtlpReceiver::start_grpc().await.unwrap();
        let mut client = TraceServiceClient::connect(rx.endpoint()).await.unwrap();
        client.export(request()).await.unwrap();
        let spans = rx.spans(1, Duration::from_secs(5)).await;
        assert_eq!(spans.len(), 1);
        assert_eq!(spans[0].service_name, "svc");
        assert_eq!(spans[0].trace_hex(), "01".repeat(16));
        assert_eq!(spans[0].span.name, "send orders");
    }

    #[tokio::test]
    async fn http_requests_are_forwarded_and_restart_on_the_same_port() {
        let mut rx = OtlpReceiver::start_http().await.unwrap();
        let addr = rx.addr();
        post(addr, &request().encode_to_vec()).await;
        let got = rx.next_request(Duration::from_secs(5)).await.unwrap();
        assert_eq!(flatten(&[got])[0].span_hex(), "02".repeat(8));
        rx.stop().await;
        let mut again = OtlpReceiver::start(OtlpProtocol::HttpProtobuf, Some(addr))
            .await
            .unwrap();
        assert_eq!(again.addr(), addr);
        post(addr, &request().encode_to_vec()).await;
        assert!(again.next_request(Duration::from_secs(5)).await.is_some());
    }

    /// A minimal HTTP/1.1 POST, so the test needs no HTTP client crate.
    async fn post(addr: SocketAddr, body: &[u8]) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /v1/traces HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/x-protobuf\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(body).await.unwrap();
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).await.unwrap();
        assert!(
            resp.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&resp)
        );
    }
}
