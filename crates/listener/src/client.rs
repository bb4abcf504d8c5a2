//! A small client of the listener's HTTP API, for the CLI and tests.
//!
//! It speaks plain HTTP/1.0 GET over a tokio TCP stream (the server then answers with a
//! content-length or closes the connection, so no chunked decoding is needed): the API is
//! local or behind a proxy that terminates TLS, and a full HTTP client crate would double
//! the CLI's dependency tree for four GET routes.

use crate::http::ApiError;
use crate::stats::StatsSnapshot;
use crate::summary::MessageSummary;
use msgtrail_core::trajectory::Trajectory;
use serde::de::DeserializeOwned;
use std::fmt;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The default base URL of the listener.
pub const DEFAULT_URL: &str = "http://127.0.0.1:7380";
/// Environment variable naming the listener's base URL.
pub const ENV_LISTENER_URL: &str = "MSGTRAIL_LISTENER_URL";

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The URL is not `http://host:port[/prefix]`.
    #[error("invalid listener url {0:?}: expected http://host:port")]
    Url(String),
    /// The listener could not be reached.
    #[error("cannot reach the listener at {addr}: {reason}")]
    Connect {
        /// host:port.
        addr: String,
        /// What went wrong.
        reason: String,
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
    #[error("unexpected answer from the listener: {0}")]
    Protocol(String),
}

impl ClientError {
    /// Whether the listener said "not found" (as opposed to failing).
    pub fn is_not_found(&self) -> bool {
        matches!(self, ClientError::Api { status: 404, .. })
    }
}

/// A client of one listener.
#[derive(Clone)]
pub struct ListenerClient {
    host_port: String,
    prefix: String,
    token: Option<String>,
    timeout: Duration,
}

impl fmt::Debug for ListenerClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ListenerClient")
            .field("host_port", &self.host_port)
            .field("prefix", &self.prefix)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Percent-encodes a path segment or query value.
pub fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b':') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl ListenerClient {
    /// A client of the listener at `url` (`http://host:port`, optionally with a path prefix).
    pub fn new(url: &str, token: Option<String>) -> Result<Self, ClientError> {
        let rest = url
            .trim()
            .strip_prefix("http://")
            .ok_or_else(|| ClientError::Url(url.to_owned()))?;
        let (host_port, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if host_port.is_empty() {
            return Err(ClientError::Url(url.to_owned()));
        }
        let host_port = if host_port.contains(':') && !host_port.ends_with(']') {
            host_port.to_owned()
        } else {
            format!("{host_port}:80")
        };
        Ok(ListenerClient {
            host_port,
            prefix: prefix.to_owned(),
            token,
            timeout: Duration::from_secs(10),
        })
    }

    /// GETs `path` (starting with `/`) and returns the status and body.
    pub async fn get_raw(&self, path: &str) -> Result<(u16, Vec<u8>), ClientError> {
        let fut = async {
            let conn_err = |e: std::io::Error| ClientError::Connect {
                addr: self.host_port.clone(),
                reason: e.to_string(),
            };
            let mut s = tokio::net::TcpStream::connect(&self.host_port)
                .await
                .map_err(conn_err)?;
            let mut req = format!(
                "GET {}{path} HTTP/1.0\r\nHost: {}\r\nAccept: application/json\r\n",
                self.prefix, self.host_port
            );
            if let Some(t) = &self.token {
                req.push_str(&format!("Authorization: Bearer {t}\r\n"));
            }
            req.push_str("\r\n");
            s.write_all(req.as_bytes()).await.map_err(conn_err)?;
            let mut buf = Vec::new();
            s.read_to_end(&mut buf).await.map_err(conn_err)?;
            parse_response(&buf)
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| ClientError::Connect {
                addr: self.host_port.clone(),
                reason: format!("no answer within {:?}", self.timeout),
            })?
    }

    /// GETs `path` and decodes a JSON answer, or the API error.
    pub async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let (status, body) = self.get_raw(path).await?;
        if (200..300).contains(&status) {
            serde_json::from_slice(&body).map_err(|e| ClientError::Protocol(e.to_string()))
        } else {
            let body = serde_json::from_slice(&body).unwrap_or_else(|_| ApiError {
                error: String::from_utf8_lossy(&body).trim().to_owned(),
                kind: "http".to_owned(),
                producers: vec![],
            });
            Err(ClientError::Api { status, body })
        }
    }

    /// The trajectory of a message ID or request ID.
    pub async fn trajectory(
        &self,
        id: &str,
        producer: Option<&str>,
    ) -> Result<Trajectory, ClientError> {
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
    ) -> Result<crate::http::ClientEvents, ClientError> {
        self.get_json(&format!(
            "/api/clients/{}/events?limit={limit}",
            encode(client)
        ))
        .await
    }

    /// The statistics, optionally of one topic.
    pub async fn stats(&self, topic: Option<&str>) -> Result<StatsSnapshot, ClientError> {
        match topic {
            Some(t) => {
                self.get_json(&format!("/api/stats?topic={}", encode(t)))
                    .await
            }
            None => self.get_json("/api/stats").await,
        }
    }

    /// A search; `query` is the query string without `?` (e.g. `state=stuck&since_secs=3600`).
    pub async fn search(&self, query: &str) -> Result<Vec<MessageSummary>, ClientError> {
        if query.is_empty() {
            self.get_json("/api/messages").await
        } else {
            self.get_json(&format!("/api/messages?{query}")).await
        }
    }
}

fn parse_response(buf: &[u8]) -> Result<(u16, Vec<u8>), ClientError> {
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| ClientError::Protocol("no http header end".into()))?;
    let head = String::from_utf8_lossy(&buf[..end]);
    let status_line = head.lines().next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| ClientError::Protocol(format!("bad status line {status_line:?}")))?;
    let mut body = buf[end + 4..].to_vec();
    let length = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse::<usize>().ok())
            .flatten()
    });
    if let Some(n) = length {
        body.truncate(n);
    }
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_responses() {
        let c = ListenerClient::new("http://127.0.0.1:7380/", None).unwrap();
        assert_eq!(c.host_port, "127.0.0.1:7380");
        assert_eq!(c.prefix, "");
        let c = ListenerClient::new("http://example:8080/trail", None).unwrap();
        assert_eq!(c.prefix, "/trail");
        assert!(ListenerClient::new("https://x", None).is_err());
        let (s, b) =
            parse_response(b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\n{}extra").unwrap();
        assert_eq!((s, b.as_slice()), (404, b"{}".as_slice()));
        assert_eq!(encode("a b/c"), "a%20b%2Fc");
    }
}
