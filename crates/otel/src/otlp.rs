//! Spans → OTLP request bodies, with `opentelemetry-proto` directly: one
//! `ExportTraceServiceRequest` carries many resources (one `ResourceSpans` per
//! `service.name`, one `ScopeSpans` per instrumentation scope within it), so a batch of
//! spans from a producer, the broker and a consumer goes out in one request rather than one
//! per service.
//!
//! [`Resources`] builds each service's resource once (with `OTEL_RESOURCE_ATTRIBUTES`, as the
//! SDK's `Resource::builder` reads it) and keeps a bounded number of them;
//! [`Resources::group`] sorts a batch into [`Group`]s; [`encode`] turns groups into bodies
//! (protobuf or OTLP/JSON, gzip for HTTP when asked), each under a byte limit so receivers
//! with the usual 4 MiB message limit take them. The export worker ([`crate::export`])
//! hands the bodies to [`crate::transport`].

use crate::mapping::ServiceSpan;
use bytes::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::resource::v1::Resource as ProtoResource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_sdk::trace::SpanData;
use opentelemetry_sdk::Resource;
use prost::Message;
use std::collections::HashMap;
use std::io::Write as _;
use std::sync::Arc;

/// How request bodies are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Protobuf (OTLP/gRPC and OTLP/HTTP `http/protobuf`).
    Protobuf,
    /// OTLP/JSON (`http/json`): hex trace and span IDs, enums as numbers, 64-bit integers
    /// as strings, lowerCamelCase keys (opentelemetry-proto's serde mapping).
    Json,
}

/// One service's resource, converted once.
#[derive(Debug)]
pub struct ServiceResource {
    resource: ProtoResource,
    schema_url: String,
}

/// The resources of the services seen, built once each and kept up to a bound.
#[derive(Debug)]
pub struct Resources {
    map: HashMap<String, Arc<ServiceResource>>,
    max: usize,
}

/// The spans of one service, with its resource.
#[derive(Debug)]
pub struct Group {
    /// The service's resource.
    pub resource: Arc<ServiceResource>,
    /// Its spans.
    pub spans: Vec<SpanData>,
}

impl Resources {
    /// Keeps at most `max` resources (beyond it the oldest-built is rebuilt when needed
    /// again, which is correct, only slower).
    pub fn new(max: usize) -> Self {
        Resources {
            map: HashMap::new(),
            max: max.max(1),
        }
    }

    /// The resource of `service`: `service.name` plus `OTEL_RESOURCE_ATTRIBUTES` and the
    /// SDK's defaults (`telemetry.sdk.*`).
    pub fn get(&mut self, service: &str) -> Arc<ServiceResource> {
        if let Some(r) = self.map.get(service) {
            return r.clone();
        }
        if self.map.len() >= self.max {
            self.map.clear();
        }
        let sdk = Resource::builder()
            .with_service_name(service.to_owned())
            .build();
        let attrs = ResourceAttributesWithSchema::from(&sdk);
        let r = Arc::new(ServiceResource {
            resource: ProtoResource {
                attributes: attrs.attributes.0,
                ..Default::default()
            },
            schema_url: attrs.schema_url.unwrap_or_default(),
        });
        self.map.insert(service.to_owned(), r.clone());
        r
    }

    /// Sorts spans by `service.name`, in order of first appearance.
    pub fn group(&mut self, spans: impl IntoIterator<Item = ServiceSpan>) -> Vec<Group> {
        let mut groups: Vec<(String, Group)> = Vec::new();
        for s in spans {
            match groups.iter_mut().find(|(name, _)| *name == s.service_name) {
                Some((_, g)) => g.spans.push(s.span),
                None => {
                    let resource = self.get(&s.service_name);
                    groups.push((
                        s.service_name,
                        Group {
                            resource,
                            spans: vec![s.span],
                        },
                    ));
                }
            }
        }
        groups.into_iter().map(|(_, g)| g).collect()
    }
}

/// One request with a resource per group and a scope per instrumentation scope.
pub(crate) fn request(groups: Vec<Group>) -> ExportTraceServiceRequest {
    let resource_spans = groups
        .into_iter()
        .map(|g| {
            let mut scopes: Vec<(opentelemetry::InstrumentationScope, ScopeSpans)> = Vec::new();
            for span in g.spans {
                let at = match scopes
                    .iter()
                    .position(|(s, _)| *s == span.instrumentation_scope)
                {
                    Some(i) => i,
                    None => {
                        let scope = span.instrumentation_scope.clone();
                        let proto = ScopeSpans {
                            scope: Some((&scope, None).into()),
                            schema_url: scope.schema_url().unwrap_or_default().to_owned(),
                            spans: Vec::new(),
                        };
                        scopes.push((scope, proto));
                        scopes.len() - 1
                    }
                };
                scopes[at].1.spans.push(span.into());
            }
            ResourceSpans {
                resource: Some(g.resource.resource.clone()),
                scope_spans: scopes.into_iter().map(|(_, s)| s).collect(),
                schema_url: g.resource.schema_url.clone(),
            }
        })
        .collect();
    ExportTraceServiceRequest { resource_spans }
}

/// A request body ready to send, and how many spans it carries.
#[derive(Debug, Clone)]
pub struct Body {
    /// The encoded (and maybe compressed) request.
    pub bytes: Bytes,
    /// Spans in it.
    pub spans: u64,
}

/// Encodes `groups` as one body, or several when one would exceed `max_bytes` (halved until
/// each fits or holds a single span). `gzip` compresses the bodies (HTTP; gRPC compresses
/// its frames itself).
pub fn encode(
    groups: Vec<Group>,
    encoding: Encoding,
    gzip: bool,
    max_bytes: usize,
) -> Result<Vec<Body>, std::io::Error> {
    let mut out = Vec::new();
    encode_into(request(groups), encoding, gzip, max_bytes, &mut out)?;
    Ok(out)
}

fn encode_into(
    req: ExportTraceServiceRequest,
    encoding: Encoding,
    gzip: bool,
    max_bytes: usize,
    out: &mut Vec<Body>,
) -> Result<(), std::io::Error> {
    let spans = span_count(&req);
    let too_big = |len: usize| len > max_bytes && spans > 1;
    let raw = match encoding {
        Encoding::Protobuf if too_big(req.encoded_len()) => None,
        Encoding::Protobuf => Some(req.encode_to_vec()),
        Encoding::Json => Some(serde_json::to_vec(&req)?).filter(|b| !too_big(b.len())),
    };
    let Some(raw) = raw else {
        let [a, b] = halve(req, spans / 2);
        encode_into(a, encoding, gzip, max_bytes, out)?;
        return encode_into(b, encoding, gzip, max_bytes, out);
    };
    let bytes = if gzip { gzip_bytes(&raw)? } else { raw };
    out.push(Body {
        bytes: Bytes::from(bytes),
        spans: spans as u64,
    });
    Ok(())
}

fn gzip_bytes(raw: &[u8]) -> Result<Vec<u8>, std::io::Error> {
    let mut e = flate2::write::GzEncoder::new(
        Vec::with_capacity(raw.len() / 4),
        flate2::Compression::fast(),
    );
    e.write_all(raw)?;
    e.finish()
}

/// Spans in a request.
pub(crate) fn span_count(req: &ExportTraceServiceRequest) -> usize {
    req.resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .map(|s| s.spans.len())
        .sum()
}

/// Splits a request into its first `first` spans and the rest, each keeping its resources
/// and scopes.
fn halve(req: ExportTraceServiceRequest, first: usize) -> [ExportTraceServiceRequest; 2] {
    let mut a = ExportTraceServiceRequest::default();
    let mut b = ExportTraceServiceRequest::default();
    let mut left = first;
    for mut rs in req.resource_spans {
        let mut rest = ResourceSpans {
            resource: rs.resource.clone(),
            schema_url: rs.schema_url.clone(),
            scope_spans: Vec::new(),
        };
        let mut kept = Vec::new();
        for mut ss in std::mem::take(&mut rs.scope_spans) {
            let take = left.min(ss.spans.len());
            left -= take;
            let tail = ss.spans.split_off(take);
            if !tail.is_empty() {
                rest.scope_spans.push(ScopeSpans {
                    scope: ss.scope.clone(),
                    schema_url: ss.schema_url.clone(),
                    spans: tail,
                });
            }
            if !ss.spans.is_empty() {
                kept.push(ss);
            }
        }
        rs.scope_spans = kept;
        if !rs.scope_spans.is_empty() {
            a.resource_spans.push(rs);
        }
        if !rest.scope_spans.is_empty() {
            b.resource_spans.push(rest);
        }
    }
    [a, b]
}
