//! What an exporter is configured with ([`ExportConfig`], [`Protocol`], [`Compression`]) and
//! how that is read from the standard `OTEL_EXPORTER_OTLP_*` variables.

use super::*;

/// `OTEL_SERVICE_NAME`: the broker's `service.name`.
pub(crate) const ENV_SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
/// Bound of the export queue, in spans.
pub(crate) const ENV_QUEUE_CAPACITY: &str = "MSGTRAIL_OTEL_QUEUE_SPANS";

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC (tonic), default port 4317.
    Grpc,
    /// OTLP/HTTP with protobuf bodies, default port 4318.
    HttpProtobuf,
    /// OTLP/HTTP with JSON bodies, default port 4318.
    HttpJson,
}

impl Protocol {
    /// The value of `OTEL_EXPORTER_OTLP_PROTOCOL` that names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
            Protocol::HttpJson => "http/json",
        }
    }

    pub(super) fn parse(s: &str) -> Option<Self> {
        [Protocol::Grpc, Protocol::HttpProtobuf, Protocol::HttpJson]
            .into_iter()
            .find(|p| p.as_str() == s)
    }
}

/// Request compression (`OTEL_EXPORTER_OTLP_COMPRESSION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// gzip (at its fastest level: export CPU matters more than bytes on the wire).
    Gzip,
}

/// Everything the exporter needs; [`ExportConfig::default`] holds every default.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportConfig {
    /// The transport (default: HTTP/protobuf, as the OpenTelemetry spec says).
    pub protocol: Protocol,
    /// The endpoint; `None` is the protocol's default (`http://localhost:4317`, or
    /// `http://localhost:4318/v1/traces`). For HTTP this is the full URL with `/v1/traces`.
    pub endpoint: Option<String>,
    /// Per-request timeout; `None` is 10 s.
    pub timeout: Option<Duration>,
    /// Request compression (none by default).
    pub compression: Option<Compression>,
    /// Headers sent with every request (`OTEL_EXPORTER_OTLP_HEADERS`).
    pub headers: Vec<(String, String)>,
    /// `service.name` of the broker's spans (from `OTEL_SERVICE_NAME`).
    pub broker_service: String,
    /// Bound of the queue, in spans (default 20,000).
    pub queue_capacity: usize,
    /// Most spans per batch (default 2,048); a batch is one request unless its body would
    /// exceed [`ExportConfig::max_request_bytes`].
    pub max_batch: usize,
    /// Largest request body before compression (default 3 MiB, under the 4 MiB that
    /// collectors and tonic servers accept by default).
    pub max_request_bytes: usize,
    /// Requests in flight at once (default 4).
    pub max_in_flight: usize,
    /// How long the worker waits to fill a batch once it has a span (default 200 ms).
    pub batch_delay: Duration,
    /// First retry delay after a failed export (default 100 ms).
    pub initial_backoff: Duration,
    /// Longest retry delay (default 5 s).
    pub max_backoff: Duration,
    /// Attempts per request before it is dropped and counted in
    /// [`ExportStats::dropped_retries`] (default 60, about five minutes at the longest
    /// backoff): an endpoint that refuses a batch for good must not stall the queue.
    pub max_attempts: u32,
    /// Most service resources kept built at once (default 64).
    pub max_services: usize,
}

impl ExportConfig {
    /// Most spans per batch: [`ExportConfig::max_batch`], and never more than
    /// `queue_capacity / (max_in_flight + 1)`, so that the spans held in requests stay
    /// within the queue's bound (see the module doc).
    pub fn batch_limit(&self) -> usize {
        let share = self.queue_capacity / (self.max_in_flight.max(1) + 1);
        self.max_batch.min(share).max(1)
    }
}

impl Default for ExportConfig {
    fn default() -> Self {
        ExportConfig {
            protocol: Protocol::HttpProtobuf,
            endpoint: None,
            timeout: None,
            compression: None,
            headers: Vec::new(),
            broker_service: DEFAULT_BROKER_SERVICE.to_owned(),
            queue_capacity: 20_000,
            max_batch: 2_048,
            max_request_bytes: 3 << 20,
            max_in_flight: 4,
            batch_delay: Duration::from_millis(200),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            max_attempts: 60,
            max_services: 64,
        }
    }
}

/// The traces-specific variable `OTEL_EXPORTER_OTLP_TRACES_{suffix}` if set, else
/// `OTEL_EXPORTER_OTLP_{suffix}`, with the name that was read.
pub(super) fn otlp_var(
    get: &impl Fn(&str) -> Option<String>,
    suffix: &str,
) -> Option<(String, String)> {
    [
        format!("OTEL_EXPORTER_OTLP_TRACES_{suffix}"),
        format!("OTEL_EXPORTER_OTLP_{suffix}"),
    ]
    .into_iter()
    .find_map(|name| {
        get(&name)
            .filter(|v| !v.trim().is_empty())
            .map(|v| (name, v))
    })
}

impl ExportConfig {
    /// The defaults overridden by the standard variables (see the module docs) and
    /// `ENV_QUEUE_CAPACITY`.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Like [`ExportConfig::from_env`], reading variables through `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut c = ExportConfig::default();
        if let Some((name, v)) = otlp_var(&get, "PROTOCOL") {
            c.protocol = Protocol::parse(v.trim()).ok_or_else(|| {
                ConfigError::invalid(&name, &v, "grpc, http/protobuf or http/json")
            })?;
        }
        c.endpoint = endpoint_from(&get, c.protocol);
        if let Some((name, v)) = otlp_var(&get, "TIMEOUT") {
            let ms: u64 = v
                .trim()
                .parse()
                .map_err(|_| ConfigError::invalid(&name, &v, "milliseconds"))?;
            c.timeout = Some(Duration::from_millis(ms));
        }
        if let Some((name, v)) = otlp_var(&get, "COMPRESSION") {
            c.compression = match v.trim() {
                "gzip" => Some(Compression::Gzip),
                "none" => None,
                _ => return Err(ConfigError::invalid(&name, &v, "gzip or none")),
            };
        }
        if let Some((name, v)) = otlp_var(&get, "HEADERS") {
            c.headers = parse_headers(&v).ok_or_else(|| {
                ConfigError::invalid(&name, &v, "key=value pairs, comma-separated")
            })?;
        }
        if let Some(s) = get(ENV_SERVICE_NAME).filter(|s| !s.trim().is_empty()) {
            c.broker_service = s.trim().to_owned();
        }
        if let Some(v) = get(ENV_QUEUE_CAPACITY) {
            c.queue_capacity =
                v.trim().parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                    ConfigError::invalid(ENV_QUEUE_CAPACITY, &v, "a positive number")
                })?;
        }
        Ok(c)
    }

    /// The endpoint, or the protocol's default.
    pub fn endpoint_or_default(&self) -> String {
        match (&self.endpoint, self.protocol) {
            (Some(e), _) => e.clone(),
            (None, Protocol::Grpc) => "http://localhost:4317".to_owned(),
            (None, _) => "http://localhost:4318/v1/traces".to_owned(),
        }
    }

    /// The per-request timeout, 10 s unless set.
    pub fn timeout_or_default(&self) -> Duration {
        self.timeout.unwrap_or(Duration::from_secs(10))
    }

    pub(super) fn encoding(&self) -> Encoding {
        match self.protocol {
            Protocol::HttpJson => Encoding::Json,
            Protocol::Grpc | Protocol::HttpProtobuf => Encoding::Protobuf,
        }
    }
}

/// The endpoint the variables give: `…_TRACES_ENDPOINT` as it is, or `…_ENDPOINT` with
/// `/v1/traces` appended for HTTP.
pub(super) fn endpoint_from(
    get: &impl Fn(&str) -> Option<String>,
    protocol: Protocol,
) -> Option<String> {
    let set = |k: &str| {
        get(k)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    if let Some(e) = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        return Some(e);
    }
    let base = set("OTEL_EXPORTER_OTLP_ENDPOINT")?;
    Some(match protocol {
        Protocol::Grpc => base,
        _ => format!("{}/v1/traces", base.trim_end_matches('/')),
    })
}

/// `k1=v1,k2=v2` with percent-encoded values (the W3C baggage format the spec names).
pub(super) fn parse_headers(s: &str) -> Option<Vec<(String, String)>> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=')?;
            Some((k.trim().to_owned(), percent_decode(v.trim())?))
        })
        .collect()
}

/// Decodes `%XX` escapes; `None` for a `%` not followed by two hex digits or bytes that are
/// not UTF-8 (a malformed header value is refused, not passed on literally).
pub(super) fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let well_formed = b.iter().enumerate().all(|(i, c)| {
        *c != b'%'
            || b.get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    });
    if !well_formed {
        return None;
    }
    percent_encoding::percent_decode(b)
        .decode_utf8()
        .ok()
        .map(|c| c.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_are_percent_decoded() {
        let got = parse_headers("x-tenant=eu, authorization=Basic%20abc%3D%3D,,").unwrap();
        assert_eq!(
            got,
            vec![
                ("x-tenant".to_owned(), "eu".to_owned()),
                ("authorization".to_owned(), "Basic abc==".to_owned()),
            ]
        );
        assert_eq!(percent_decode("caf%C3%A9").as_deref(), Some("café"));
    }

    #[test]
    fn malformed_header_values_are_refused() {
        for bad in ["a=%zz", "a=%4", "a=50%", "a=%FF", "a=%+1", "no-equals-sign"] {
            assert_eq!(parse_headers(bad), None, "{bad}");
        }
    }
}
