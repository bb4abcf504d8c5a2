//! A small client of the listener's HTTP API, for the CLI and tests: hyper-util's pooled
//! HTTP/1 client (already in the tree for OTLP/HTTP export), `url` to parse the base URL and
//! `percent-encoding` for path segments and query values. Plain HTTP: the API is local or
//! behind a proxy that terminates TLS.

use crate::api::{ApiError, ClientClocks, ClientEvents};
use crate::stats::StatsSnapshot;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use msgtrail_core::trajectory::Trajectory;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use secrecy::{ExposeSecret, SecretString};
use serde::de::DeserializeOwned;
use std::fmt;
use std::time::Duration;

/// The default base URL of the listener.
pub const DEFAULT_URL: &str = "http://127.0.0.1:7380";
/// Environment variable naming the listener's base URL.
pub const ENV_LISTENER_URL: &str = "MSGTRAIL_LISTENER_URL";
/// Environment variable with the listener's API token (the listener requires it, the client
/// sends it).
pub const ENV_TOKEN: &str = "MSGTRAIL_LISTENER_TOKEN";

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ListenerClientError {
    /// The URL is not `http://host:port[/prefix]`.
    #[error("invalid listener url {url:?}: expected http://host:port")]
    Url {
        /// The URL as given.
        url: String,
        /// The URL parser's error, if it refused it (a URL that parses can still be unusable).
        #[source]
        source: Option<url::ParseError>,
    },
    /// The listener could not be reached.
    #[error("cannot reach the listener at {addr}")]
    Connect {
        /// host:port.
        addr: String,
        /// The HTTP client's error (its own message is terse: the connection's error is its
        /// source in turn).
        source: hyper_util::client::legacy::Error,
    },
    /// The listener did not answer in time.
    #[error("no answer from the listener at {addr} within {timeout:?}")]
    Timeout {
        /// host:port.
        addr: String,
        /// How long the client waited.
        timeout: Duration,
    },
    /// The listener answered with an error.
    #[error("listener answered {status}: {}", .body.error)]
    Api {
        /// The HTTP status.
        status: u16,
        /// The error body.
        body: ApiError,
    },
    /// The answer could not be understood.
    #[error("unexpected answer from the listener: {context}")]
    Protocol {
        /// What the client was doing.
        context: String,
        /// What failed.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl ListenerClientError {
    fn protocol(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        ListenerClientError::Protocol {
            context: context.into(),
            source: source.into(),
        }
    }

    /// Whether the listener said "not found" (as opposed to failing).
    pub fn is_not_found(&self) -> bool {
        matches!(self, ListenerClientError::Api { status: 404, .. })
    }
}

/// A client of one listener.
#[derive(Clone)]
pub struct ListenerClient {
    /// `host:port`, for messages.
    host_port: String,
    /// `http://host:port` and the path prefix, without a trailing `/`.
    base: String,
    prefix: String,
    token: Option<SecretString>,
    timeout: Duration,
    http: Client<HttpConnector, Empty<Bytes>>,
}

impl fmt::Debug for ListenerClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ListenerClient")
            .field("host_port", &self.host_port)
            .field("prefix", &self.prefix)
            .field("token", &self.token)
            .finish()
    }
}

/// What [`encode`] escapes: everything but unreserved characters (RFC 3986) and `:`.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~')
    .remove(b':');

/// Percent-encodes a path segment or query value.
pub fn encode(s: &str) -> String {
    utf8_percent_encode(s, COMPONENT).to_string()
}

impl ListenerClient {
    /// A client of the listener at `url` (`http://host:port`, optionally with a path prefix).
    pub fn new(url: &str, token: Option<String>) -> Result<Self, ListenerClientError> {
        let bad = || ListenerClientError::Url {
            url: url.to_owned(),
            source: None,
        };
        let parsed = url::Url::parse(url.trim()).map_err(|e| ListenerClientError::Url {
            url: url.to_owned(),
            source: Some(e),
        })?;
        if parsed.scheme() != "http" || parsed.query().is_some() {
            return Err(bad());
        }
        let host = match parsed.host().ok_or_else(bad)? {
            url::Host::Ipv6(a) => format!("[{a}]"),
            h => h.to_string(),
        };
        let host_port = format!("{host}:{}", parsed.port_or_known_default().unwrap_or(80));
        let prefix = parsed.path().trim_end_matches('/').to_owned();
        Ok(ListenerClient {
            base: format!("http://{host_port}{prefix}"),
            host_port,
            prefix,
            token: token.map(SecretString::from),
            timeout: Duration::from_secs(10),
            // No idle connections kept: the CLI asks once, and a kept-alive connection
            // would hold the listener's HTTP task (and its store) past a shutdown.
            http: Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(0)
                .build_http(),
        })
    }

    /// GETs `path` (starting with `/`) and returns the status and body.
    pub async fn get_raw(&self, path: &str) -> Result<(u16, Vec<u8>), ListenerClientError> {
        let uri: hyper::Uri = format!("{}{path}", self.base)
            .parse()
            .map_err(|e| ListenerClientError::protocol(format!("bad request path {path:?}"), e))?;
        let mut req = hyper::Request::get(uri).header(hyper::header::ACCEPT, "application/json");
        if let Some(t) = &self.token {
            let bearer = format!("Bearer {}", t.expose_secret());
            req = req.header(hyper::header::AUTHORIZATION, bearer);
        }
        let req = req
            .body(Empty::new())
            .map_err(|e| ListenerClientError::protocol("building the request", e))?;
        let fut =
            async {
                let resp = self.http.request(req).await.map_err(|source| {
                    ListenerClientError::Connect {
                        addr: self.host_port.clone(),
                        source,
                    }
                })?;
                let status = resp.status().as_u16();
                let body = resp
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| ListenerClientError::protocol("reading the answer", e))?
                    .to_bytes();
                Ok((status, body.to_vec()))
            };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| ListenerClientError::Timeout {
                addr: self.host_port.clone(),
                timeout: self.timeout,
            })?
    }

    /// GETs `path` and decodes a JSON answer, or the API error.
    pub async fn get_json<T: DeserializeOwned>(
        &self,
        path: &str,
    ) -> Result<T, ListenerClientError> {
        let (status, body) = self.get_raw(path).await?;
        if (200..300).contains(&status) {
            serde_json::from_slice(&body)
                .map_err(|e| ListenerClientError::protocol("decoding the answer", e))
        } else {
            let body = serde_json::from_slice(&body).unwrap_or_else(|_| ApiError {
                error: String::from_utf8_lossy(&body).trim().to_owned(),
                kind: "http".to_owned(),
                producers: vec![],
            });
            Err(ListenerClientError::Api { status, body })
        }
    }

    /// The trajectory of a message ID or request ID.
    pub async fn trajectory(
        &self,
        id: &str,
        producer: Option<&str>,
    ) -> Result<Trajectory, ListenerClientError> {
        let mut path = format!("/api/messages/{}", encode(id));
        if let Some(p) = producer {
            path.push_str(&format!("?producer={}", encode(p)));
        }
        self.get_json(&path).await
    }

    /// The client events (N1, A1) of a client, newest first, at most `limit`.
    pub async fn client_events(
        &self,
        client: &str,
        limit: usize,
    ) -> Result<ClientEvents, ListenerClientError> {
        self.get_json(&format!(
            "/api/clients/{}/events?limit={limit}",
            encode(client)
        ))
        .await
    }

    /// A client's clock estimates over the recent window, per broker instance.
    pub async fn client_clocks(&self, client: &str) -> Result<ClientClocks, ListenerClientError> {
        self.get_json(&format!("/api/clients/{}", encode(client)))
            .await
    }

    /// The statistics, optionally of one topic.
    pub async fn stats(&self, topic: Option<&str>) -> Result<StatsSnapshot, ListenerClientError> {
        self.stats_of(topic, None).await
    }

    /// The statistics, optionally of one topic and with observe mode's section of one
    /// observed stream only.
    pub async fn stats_of(
        &self,
        topic: Option<&str>,
        stream: Option<&str>,
    ) -> Result<StatsSnapshot, ListenerClientError> {
        let params: Vec<String> = [("topic", topic), ("stream", stream)]
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| format!("{k}={}", encode(v))))
            .collect();
        if params.is_empty() {
            self.get_json("/api/stats").await
        } else {
            self.get_json(&format!("/api/stats?{}", params.join("&")))
                .await
        }
    }

    /// A search; `query` is the query string without `?` (e.g. `state=stuck&since_secs=3600`).
    ///
    /// The answer is a list of the listener's shadow messages, `T` =
    /// `msgtrail_listener::MessageSummary`: that type stays with the listener's store, which
    /// encodes it, so this crate decodes into whatever type the caller names.
    pub async fn search<T: DeserializeOwned>(
        &self,
        query: &str,
    ) -> Result<Vec<T>, ListenerClientError> {
        if query.is_empty() {
            self.get_json("/api/messages").await
        } else {
            self.get_json(&format!("/api/messages?{query}")).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_encoding() {
        let c = ListenerClient::new("http://127.0.0.1:7380/", None).unwrap();
        assert_eq!(c.host_port, "127.0.0.1:7380");
        assert_eq!(c.prefix, "");
        let c = ListenerClient::new("http://example:8080/trail/", None).unwrap();
        assert_eq!(
            (c.host_port.as_str(), c.prefix.as_str()),
            ("example:8080", "/trail")
        );
        assert_eq!(c.base, "http://example:8080/trail");
        let c = ListenerClient::new("http://[::1]/", None).unwrap();
        assert_eq!(c.host_port, "[::1]:80");
        assert!(ListenerClient::new("https://x", None).is_err());
        assert!(ListenerClient::new("http://", None).is_err());
        assert!(ListenerClient::new("not a url", None).is_err());
        assert_eq!(encode("a b/c"), "a%20b%2Fc");
        assert_eq!(encode("order-1_x.y~z:1"), "order-1_x.y~z:1");
        assert_eq!(encode("ä?&="), "%C3%A4%3F%26%3D");
    }

    /// A listener that is not there is a connection error naming the address, and why in
    /// its causes (the error's own message is its level only: the chain renders them).
    #[tokio::test]
    async fn unreachable_listener_names_the_cause() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let c = ListenerClient::new(&format!("http://127.0.0.1:{port}"), None).unwrap();
        let err = c.get_raw("/api/stats").await.unwrap_err();
        let text = msgtrail_core::ErrorChain(&err).to_string();
        assert!(matches!(err, ListenerClientError::Connect { .. }), "{text}");
        assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
        assert!(text.to_lowercase().contains("refused"), "{text}");
    }
}
