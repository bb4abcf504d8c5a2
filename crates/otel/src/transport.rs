//! One OTLP request on the wire: an encoded `ExportTraceServiceRequest` body (from
//! [`crate::otlp`]) sent over gRPC (tonic, on one HTTP/2 connection that carries every
//! request in flight) or HTTP (hyper's pooled client, one connection per request in flight),
//! with the response read for a partial success.
//!
//! The body is encoded once by the caller and reused on every retry: gRPC goes through a
//! pass-through codec ([`BytesCodec`]) rather than tonic's prost codec, which would need the
//! request as a struct and encode it again on each attempt.
//!
//! Errors say whether a retry may help, as the OTLP specification lists: gRPC `UNAVAILABLE`,
//! `RESOURCE_EXHAUSTED`, … and HTTP 429/502/503/504 (and every connection error) are
//! retryable; anything else (a 400, `INVALID_ARGUMENT`) is not. A receiver that throttles
//! says how long to wait, and the exporter waits that long ([`SendError::retry_after`]):
//! HTTP 429/503 with `Retry-After` (seconds or an HTTP date), gRPC with a `RetryInfo` in the
//! status details.

use crate::error::ConfigError;
use crate::export::{Compression, ExportConfig, Protocol};
use bytes::{Buf, BufMut, Bytes};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use prost::Message;
use std::time::Duration;
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue, MetadataMap};
use tonic::transport::{Channel, Endpoint};

/// The gRPC method every OTLP trace export calls.
const GRPC_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// Why a request did not go through.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub(crate) struct SendError {
    /// Whether the same request may succeed later.
    pub retryable: bool,
    /// What went wrong, with its cause.
    pub message: String,
    /// How long the receiver asked to wait before the next try (it throttles), if it did.
    pub retry_after: Option<Duration>,
}

impl SendError {
    fn retry(message: impl std::fmt::Display) -> Self {
        SendError {
            retryable: true,
            message: message.to_string(),
            retry_after: None,
        }
    }

    fn fatal(message: impl std::fmt::Display) -> Self {
        SendError {
            retryable: false,
            message: message.to_string(),
            retry_after: None,
        }
    }
}

/// A configured OTLP client; cheap to clone (the connection or pool is shared).
#[derive(Debug, Clone)]
pub(crate) enum Transport {
    /// OTLP/gRPC.
    Grpc {
        /// The lazily connected channel.
        channel: Channel,
        /// Headers as gRPC metadata.
        metadata: MetadataMap,
        /// Per-request timeout.
        timeout: Duration,
        /// Whether bodies go gzip-compressed.
        gzip: bool,
    },
    /// OTLP/HTTP, protobuf or JSON bodies.
    Http {
        /// The pooled client (boxed: it is large beside the gRPC variant).
        client: Box<Client<HttpConnector, Full<Bytes>>>,
        /// The full URL, `…/v1/traces`.
        uri: hyper::Uri,
        /// `application/json` bodies (http/json) rather than protobuf.
        json: bool,
        /// Extra headers.
        headers: Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)>,
        /// Per-request timeout.
        timeout: Duration,
        /// Whether bodies are gzip-compressed (done by the caller, see [`crate::otlp`]).
        gzip: bool,
    },
}

impl Transport {
    /// Builds the client of `config` (within a tokio runtime: the gRPC channel spawns its
    /// worker). Connecting is lazy: an endpoint that is down shows as retryable errors.
    pub(crate) fn new(config: &ExportConfig) -> Result<Self, ConfigError> {
        let endpoint = config.endpoint_or_default();
        let timeout = config.timeout_or_default();
        let gzip = config.compression == Some(Compression::Gzip);
        match config.protocol {
            Protocol::Grpc => {
                let channel = Endpoint::from_shared(endpoint.clone())
                    .map_err(|e| crate::error::endpoint(&endpoint, e))?
                    .connect_timeout(timeout)
                    .connect_lazy();
                let mut metadata = MetadataMap::new();
                for (k, v) in &config.headers {
                    let key: AsciiMetadataKey =
                        k.parse().map_err(|e| crate::error::header(k, e))?;
                    let value: AsciiMetadataValue =
                        v.parse().map_err(|e| crate::error::header(k, e))?;
                    metadata.insert(key, value);
                }
                Ok(Transport::Grpc {
                    channel,
                    metadata,
                    timeout,
                    gzip,
                })
            }
            Protocol::HttpProtobuf | Protocol::HttpJson => {
                let uri: hyper::Uri = endpoint
                    .parse()
                    .map_err(|e| crate::error::endpoint(&endpoint, e))?;
                if uri.scheme_str() != Some("http") {
                    return Err(crate::error::endpoint(
                        &endpoint,
                        "only http:// is built in (no TLS): export to a local collector",
                    ));
                }
                let mut headers = Vec::new();
                for (k, v) in &config.headers {
                    let name = hyper::header::HeaderName::try_from(k.as_str())
                        .map_err(|e| crate::error::header(k, e))?;
                    let value = hyper::header::HeaderValue::try_from(v.as_str())
                        .map_err(|e| crate::error::header(k, e))?;
                    headers.push((name, value));
                }
                let mut connector = HttpConnector::new();
                connector.set_connect_timeout(Some(timeout));
                connector.set_nodelay(true);
                let client = Client::builder(TokioExecutor::new()).build(connector);
                Ok(Transport::Http {
                    client: Box::new(client),
                    uri,
                    json: config.protocol == Protocol::HttpJson,
                    headers,
                    timeout,
                    gzip,
                })
            }
        }
    }

    /// Sends one encoded request; returns the spans the receiver said it rejected (a partial
    /// success), 0 when it took them all.
    pub(crate) async fn send(&self, body: Bytes) -> Result<u64, SendError> {
        match self {
            Transport::Grpc {
                channel,
                metadata,
                timeout,
                gzip,
            } => send_grpc(channel.clone(), metadata, *timeout, *gzip, body).await,
            Transport::Http {
                client,
                uri,
                json,
                headers,
                timeout,
                gzip,
            } => {
                let request = http_request(uri, *json, headers, *gzip, body)?;
                let response = tokio::time::timeout(*timeout, client.request(request))
                    .await
                    .map_err(|_| SendError::retry("timed out"))?
                    .map_err(|e| SendError::retry(error_chain(&e)))?;
                read_http_response(response, *json, *timeout).await
            }
        }
    }
}

async fn send_grpc(
    channel: Channel,
    metadata: &MetadataMap,
    timeout: Duration,
    gzip: bool,
    body: Bytes,
) -> Result<u64, SendError> {
    let mut grpc = tonic::client::Grpc::new(channel);
    if gzip {
        grpc = grpc.send_compressed(CompressionEncoding::Gzip);
    }
    let exchange = async {
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unavailable(error_chain(&e)))?;
        let mut request = tonic::Request::new(body);
        *request.metadata_mut() = metadata.clone();
        request.set_timeout(timeout);
        let path = hyper::http::uri::PathAndQuery::from_static(GRPC_PATH);
        grpc.unary(request, path, BytesCodec).await
    };
    match tokio::time::timeout(timeout, exchange).await {
        Err(_) => Err(SendError::retry("timed out")),
        Ok(Ok(response)) => Ok(rejected(&response.into_inner())),
        Ok(Err(status)) => {
            use tonic::Code::*;
            let retryable = matches!(
                status.code(),
                Cancelled
                    | DeadlineExceeded
                    | ResourceExhausted
                    | Aborted
                    | OutOfRange
                    | Unavailable
                    | DataLoss
            );
            let message = format!("gRPC {:?}: {}", status.code(), status.message());
            // The OTLP specification: a retryable status may carry RetryInfo with the delay.
            let retry_after = retryable
                .then(|| {
                    use tonic_types::StatusExt;
                    status.get_details_retry_info()?.retry_delay
                })
                .flatten();
            Err(SendError {
                retryable,
                message,
                retry_after,
            })
        }
    }
}

fn http_request(
    uri: &hyper::Uri,
    json: bool,
    headers: &[(hyper::header::HeaderName, hyper::header::HeaderValue)],
    gzip: bool,
    body: Bytes,
) -> Result<hyper::Request<Full<Bytes>>, SendError> {
    use hyper::header::{CONTENT_ENCODING, CONTENT_TYPE};
    let content_type = if json {
        "application/json"
    } else {
        "application/x-protobuf"
    };
    let mut b = hyper::Request::post(uri.clone()).header(CONTENT_TYPE, content_type);
    if gzip {
        b = b.header(CONTENT_ENCODING, "gzip");
    }
    for (k, v) in headers {
        b = b.header(k, v);
    }
    b.body(Full::new(body)).map_err(SendError::fatal)
}

async fn read_http_response(
    response: hyper::Response<hyper::body::Incoming>,
    json: bool,
    timeout: Duration,
) -> Result<u64, SendError> {
    let status = response.status();
    let retry_after = response
        .headers()
        .get(hyper::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, std::time::SystemTime::now()));
    let body = tokio::time::timeout(timeout, response.into_body().collect())
        .await
        .map_err(|_| SendError::retry("timed out reading the response"))?
        .map_err(|e| SendError::retry(error_chain(&e)))?
        .to_bytes();
    if status.is_success() {
        // An empty body is a full success; an unreadable one is not worth a retry.
        let parsed = if body.is_empty() {
            None
        } else if json {
            serde_json::from_slice::<ExportTraceServiceResponse>(&body).ok()
        } else {
            ExportTraceServiceResponse::decode(body).ok()
        };
        return Ok(parsed.map_or(0, |r| rejected(&r)));
    }
    let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
    let message = format!("HTTP {status}: {text}");
    match status.as_u16() {
        // The OTLP specification: 429 and 503 may say how long to wait (Retry-After).
        429 | 503 => Err(SendError {
            retry_after,
            ..SendError::retry(message)
        }),
        502 | 504 => Err(SendError::retry(message)),
        _ => Err(SendError::fatal(message)),
    }
}

/// An HTTP `Retry-After` value: delay-seconds, or an HTTP date (then the time from `now`
/// until it; zero when it has passed). `None` when it is neither.
fn parse_retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

fn rejected(r: &ExportTraceServiceResponse) -> u64 {
    r.partial_success
        .as_ref()
        .map_or(0, |p| p.rejected_spans.max(0) as u64)
}

/// An error and its causes on one line.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

/// A gRPC codec that sends an already encoded protobuf body as it is and decodes the
/// response with prost.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BytesCodec;

/// The encoding half of [`BytesCodec`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BytesEncoder;

/// The decoding half of [`BytesCodec`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ResponseDecoder;

impl Codec for BytesCodec {
    type Encode = Bytes;
    type Decode = ExportTraceServiceResponse;
    type Encoder = BytesEncoder;
    type Decoder = ResponseDecoder;

    fn encoder(&mut self) -> BytesEncoder {
        BytesEncoder
    }

    fn decoder(&mut self) -> ResponseDecoder {
        ResponseDecoder
    }
}

impl Encoder for BytesEncoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for ResponseDecoder {
    type Item = ExportTraceServiceResponse;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut DecodeBuf<'_>,
    ) -> Result<Option<ExportTraceServiceResponse>, tonic::Status> {
        let n = src.remaining();
        ExportTraceServiceResponse::decode(src.copy_to_bytes(n))
            .map(Some)
            .map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    #[test]
    fn retry_after_is_seconds_or_an_http_date() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now),
            Some(Duration::ZERO),
            "a date that has passed: no wait"
        );
        assert_eq!(parse_retry_after("soon", SystemTime::now()), None);
        assert_eq!(parse_retry_after("-5", SystemTime::now()), None);
    }
}
