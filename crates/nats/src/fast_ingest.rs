//! Fast-ingest batch publishing (nats-server ≥ 2.14, ADR-50): a batch of messages into one
//! stream with **one** JetStream acknowledgement at its end instead of one PubAck per message.
//!
//! async-nats 0.51 knows only the stream setting (`allow_batched`); this module is the
//! publisher side. Each message of a batch carries a reply subject that names the batch, its
//! sequence in the batch and the operation (`<inbox>.<id>.<flow>.fail.<n>.<op>.$FI`: start,
//! append, commit with the last message); the server answers with a flow-control ack after the
//! first message and, once the last is stored, one PubAck naming the batch's last stream
//! sequence. Gap mode `fail`: after an error no later message of the batch is stored.
//!
//! **Every stored message's own stream sequence is proven**, not inferred: message `i` (from 0)
//! carries `Nats-Expected-Last-Sequence: base + i`, so JetStream stores it only as sequence
//! `base + i + 1` (it refuses it if any other message came in between). A message refused
//! that way ends the batch; so the stored messages are always a prefix of the batch, at
//! `base + 1 ..`, and [`Stored::count`] = final sequence − `base`. What is not in the prefix
//! was not stored by the batch — or was a duplicate, which JetStream drops *silently* in a
//! fast batch — and the caller publishes it again the ordinary way (per-message PubAcks),
//! where a duplicate is reported with the original's sequence.
//!
//! One batch at a time per [`FastIngest`] (a lock held from the first publish to the PubAck,
//! which the caller's ordinary publishes share: [`FastIngest::pause`]):
//! the next batch's `base` is the last one's final sequence, known without asking. When it is
//! not known (the first batch, or after a batch that did not store everything) the stream's
//! last sequence is read with one `STREAM.INFO` request. The server's flow control is honoured
//! by the batch size: a batch is at most the caller's request (bounded by the broker's batch
//! limit), no more than the same messages published with all their acks in flight.

use async_nats::header::HeaderMap;
use async_nats::subject::ToSubject;
use async_nats::Client;
use bytes::Bytes;
use futures::StreamExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// The header JetStream checks against the stream's last sequence before storing.
const EXPECTED_LAST_SEQUENCE: &str = "Nats-Expected-Last-Sequence";

/// The error code nats-server answers when the stream does not allow fast batches.
const ERR_BATCH_DISABLED: u64 = 10205;

/// Why a fast batch could not be used at all (nothing of the batch was stored by it).
#[derive(Debug, thiserror::Error)]
pub enum FastIngestError {
    /// The stream does not allow fast-ingest batches (`allow_batched` is off): publish the
    /// ordinary way from now on.
    #[error("stream {0} does not allow fast-ingest batches")]
    Disabled(String),
    /// The batch was sent but its PubAck did not come: within the timeout (`no_responders`
    /// false; the server may have stored any prefix of it), or nobody listens on the stream's
    /// subjects (`no_responders`: nothing of it was stored). Publishing the rest the ordinary
    /// way would wait as long again: the caller answers its uploads as not stored instead.
    #[error("fast-ingest batch on stream {stream}: {}", if *.no_responders { "no responders (no stream listens on the subject)" } else { "no acknowledgement within the timeout" })]
    NotAcknowledged {
        /// The stream.
        stream: String,
        /// Whether the server said nobody listens (NATS status 503).
        no_responders: bool,
    },
    /// Talking to NATS failed (publish, subscribe, stream info).
    #[error("fast-ingest batch on stream {stream}: {cause}")]
    Nats {
        /// The stream.
        stream: String,
        /// What failed.
        cause: String,
    },
}

/// What a fast batch stored: its first [`count`](Self::count) messages, at stream sequences
/// `first_seq`, `first_seq + 1`, …; the others were not stored by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    /// How many of the batch's messages (a prefix) were stored.
    pub count: usize,
    /// The stream sequence of the first of them.
    pub first_seq: u64,
}

/// One message of a batch.
#[derive(Debug)]
pub struct FastMessage {
    /// Subject (in the stream).
    pub subject: String,
    /// Headers (the batch adds `Nats-Expected-Last-Sequence`).
    pub headers: HeaderMap,
    /// Payload.
    pub payload: Bytes,
}

/// While alive, no batch of its [`FastIngest`] is being sent ([`FastIngest::pause`]).
#[derive(Debug)]
pub struct Paused<'a> {
    _state: tokio::sync::RwLockReadGuard<'a, State>,
}

/// A publisher of fast-ingest batches into one stream.
#[derive(Debug)]
pub struct FastIngest {
    client: Client,
    stream: String,
    timeout: Duration,
    /// Whether each message carries `Nats-Expected-Last-Sequence` (module doc);
    /// [`FastIngest::unproven`] publishers do not.
    prove: bool,
    /// Set once the server said the stream does not allow fast batches.
    disabled: AtomicBool,
    /// Times this process published into the stream outside its batches
    /// ([`FastIngest::pause`]).
    others: AtomicU64,
    /// Batches take it exclusively, publishes outside batches shared ([`FastIngest::pause`]).
    state: tokio::sync::RwLock<State>,
}

#[derive(Debug)]
struct State {
    /// `<inbox>`; replies come on `<inbox>.>`.
    prefix: String,
    sub: async_nats::Subscriber,
    /// The stream's last sequence after this publisher's last batch, if known, and the
    /// count of other publishes then: when that count has moved, it is read again.
    last: Option<(u64, u64)>,
    /// Batches started (their IDs).
    batches: u64,
}

/// The server's answer at the end of a batch (or its error).
#[derive(Debug, serde::Deserialize)]
struct PubAck {
    #[serde(default)]
    seq: u64,
    /// The batch's messages the server counted (up to the first failure, gap mode `fail`).
    #[serde(default)]
    count: u64,
    #[serde(default)]
    error: Option<ApiError>,
}

#[derive(Debug, serde::Deserialize)]
struct ApiError {
    #[serde(default)]
    err_code: u64,
    #[serde(default)]
    description: String,
}

/// The part of `STREAM.INFO` read here.
#[derive(Debug, serde::Deserialize)]
struct StreamInfo {
    #[serde(default)]
    config: Option<serde_json::Value>,
    #[serde(default)]
    state: Option<StreamState>,
    #[serde(default)]
    error: Option<ApiError>,
}

#[derive(Debug, serde::Deserialize)]
struct StreamState {
    last_seq: u64,
}

/// Whether `version` (a nats-server `INFO` version such as `2.14.1`) has fast-ingest batches.
pub fn server_supports(version: &str) -> bool {
    let mut parts = version
        .split(['.', '-'])
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    (major, minor) >= (2, 14)
}

/// Turns `allow_batched` on for `stream` if the server supports it and it is off, keeping
/// every other setting as the server has it. Returns whether the stream allows fast batches.
pub async fn enable_on_stream(client: &Client, stream: &str) -> Result<bool, FastIngestError> {
    if !server_supports(&client.server_info().version) {
        return Ok(false);
    }
    let nats = |cause: String| FastIngestError::Nats {
        stream: stream.to_owned(),
        cause,
    };
    let info = client
        .request(format!("$JS.API.STREAM.INFO.{stream}"), Bytes::new())
        .await
        .map_err(|e| nats(e.to_string()))?;
    let info: StreamInfo =
        serde_json::from_slice(&info.payload).map_err(|e| nats(format!("stream info: {e}")))?;
    if let Some(e) = info.error {
        return Err(nats(e.description));
    }
    let Some(mut config) = info.config else {
        return Err(nats("stream info without a config".into()));
    };
    if config.get("allow_batched").and_then(|v| v.as_bool()) == Some(true) {
        return Ok(true);
    }
    config["allow_batched"] = serde_json::Value::Bool(true);
    let body = serde_json::to_vec(&config).map_err(|e| nats(e.to_string()))?;
    let reply = client
        .request(format!("$JS.API.STREAM.UPDATE.{stream}"), body.into())
        .await
        .map_err(|e| nats(e.to_string()))?;
    let reply: StreamInfo =
        serde_json::from_slice(&reply.payload).map_err(|e| nats(format!("stream update: {e}")))?;
    match reply.error {
        Some(e) => Err(nats(format!("enabling allow_batched: {}", e.description))),
        None => Ok(true),
    }
}

impl FastIngest {
    /// A publisher into `stream` (which must allow fast batches: [`enable_on_stream`]); a
    /// batch whose PubAck does not come within `timeout` counts as not stored.
    pub async fn new(
        client: Client,
        stream: impl Into<String>,
        timeout: Duration,
    ) -> Result<Self, FastIngestError> {
        Self::build(client, stream.into(), timeout, true).await
    }

    /// A publisher whose messages carry no sequence proof: many of them may publish into one
    /// stream at once, and [`Stored::count`] is what the server counted, `first_seq` 0 (not
    /// known). For raw throughput (the benchmark's S1F), not for msgtrail's uploads.
    pub async fn unproven(
        client: Client,
        stream: impl Into<String>,
        timeout: Duration,
    ) -> Result<Self, FastIngestError> {
        Self::build(client, stream.into(), timeout, false).await
    }

    async fn build(
        client: Client,
        stream: String,
        timeout: Duration,
        prove: bool,
    ) -> Result<Self, FastIngestError> {
        let prefix = client.new_inbox();
        let sub =
            client
                .subscribe(format!("{prefix}.>"))
                .await
                .map_err(|e| FastIngestError::Nats {
                    stream: stream.clone(),
                    cause: e.to_string(),
                })?;
        Ok(Self {
            client,
            stream,
            timeout,
            prove,
            disabled: AtomicBool::new(false),
            others: AtomicU64::new(0),
            state: tokio::sync::RwLock::new(State {
                prefix,
                sub,
                last: None,
                batches: 0,
            }),
        })
    }

    /// Holds this publisher's batches back while the caller publishes into the stream the
    /// ordinary way (one PubAck per message): such a message between two messages of a batch
    /// would end it early. Any number of such publishers may hold it at once; hold it until
    /// their PubAcks are in, so that the next batch reads a last sequence that counts them.
    pub async fn pause(&self) -> Paused<'_> {
        let state = self.state.read().await;
        self.others.fetch_add(1, Ordering::Relaxed);
        Paused { _state: state }
    }

    /// Whether the server has said the stream does not allow fast batches (every later
    /// [`publish`](Self::publish) fails at once with [`FastIngestError::Disabled`]).
    pub fn is_disabled(&self) -> bool {
        self.disabled.load(Ordering::Relaxed)
    }

    /// Publishes `messages` as one fast batch and says which prefix of them it stored.
    /// `Ok` with a count below the batch's length is not an error: the rest must be published
    /// the ordinary way (module doc).
    pub async fn publish(&self, messages: Vec<FastMessage>) -> Result<Stored, FastIngestError> {
        let n = messages.len();
        if n == 0 {
            return Ok(Stored {
                count: 0,
                first_seq: 0,
            });
        }
        if self.is_disabled() {
            return Err(FastIngestError::Disabled(self.stream.clone()));
        }
        let mut state = self.state.write().await;
        let others = self.others.load(Ordering::Relaxed);
        let base = match state.last {
            _ if !self.prove => 0,
            Some((last, at)) if at == others => last,
            _ => self.last_sequence().await?,
        };
        state.batches += 1;
        let id = state.batches;
        // The server sends a flow-control ack every `flow` stored messages; asking for the
        // whole batch leaves one after the first message and the final PubAck.
        let flow = n.clamp(1, u16::MAX as usize);
        for (i, m) in messages.into_iter().enumerate() {
            let seq = i + 1;
            let op = if seq == n {
                2
            } else if seq == 1 {
                0
            } else {
                1
            };
            let reply = format!("{}.{id}.{flow}.fail.{seq}.{op}.$FI", state.prefix);
            let mut headers = m.headers;
            if self.prove {
                headers.insert(
                    EXPECTED_LAST_SEQUENCE,
                    (base + i as u64).to_string().as_str(),
                );
            }
            if let Err(e) = self
                .client
                .publish_with_reply_and_headers(m.subject.to_subject(), reply, headers, m.payload)
                .await
            {
                // Nothing is known of what was sent: the caller publishes it all again.
                state.last = None;
                return Err(self.nats(e.to_string()));
            }
        }
        let ack = match self.await_pub_ack(&mut state, id).await {
            Ok(ack) => ack,
            Err(no_responders) => {
                state.last = None;
                return Err(FastIngestError::NotAcknowledged {
                    stream: self.stream.clone(),
                    no_responders,
                });
            }
        };
        let stored = {
            match ack.error {
                Some(e) if e.err_code == ERR_BATCH_DISABLED => {
                    state.last = None;
                    self.disabled.store(true, Ordering::Relaxed);
                    return Err(FastIngestError::Disabled(self.stream.clone()));
                }
                Some(_) => 0,
                None if !self.prove => ack.count.min(n as u64) as usize,
                None => ack.seq.saturating_sub(base).min(n as u64) as usize,
            }
        };
        if !self.prove {
            return Ok(Stored {
                count: stored,
                first_seq: 0,
            });
        }
        state.last = if stored == n {
            Some((base + n as u64, others))
        } else {
            None
        };
        Ok(Stored {
            count: stored,
            first_seq: base + 1,
        })
    }

    /// Waits for the PubAck of batch `id` (flow-control, gap and error notes are skipped;
    /// replies to earlier batches too). A status reply (no responders: no stream listens on
    /// the subject — JetStream is down, disabled itself, or the stream has no leader) ends
    /// the wait at once: nothing more will come.
    /// `Err(true)`: no responders; `Err(false)`: the timeout passed.
    async fn await_pub_ack(&self, state: &mut State, id: u64) -> Result<PubAck, bool> {
        let prefix_len = state.prefix.len() + 1;
        let want = id.to_string();
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            let msg = match tokio::time::timeout_at(deadline, state.sub.next()).await {
                Ok(Some(msg)) => msg,
                Ok(None) | Err(_) => return Err(false),
            };
            let subject = msg.subject.as_str();
            let of_this = subject
                .get(prefix_len..)
                .and_then(|rest| rest.split('.').next())
                .is_some_and(|b| b == want);
            if !of_this || msg.payload.starts_with(b"{\"type\"") {
                continue;
            }
            if msg
                .status
                .is_some_and(|s| s == async_nats::StatusCode::NO_RESPONDERS)
            {
                return Err(true);
            }
            if let Ok(ack) = serde_json::from_slice::<PubAck>(&msg.payload) {
                return Ok(ack);
            }
        }
    }

    /// The stream's last sequence, read from the server.
    async fn last_sequence(&self) -> Result<u64, FastIngestError> {
        let info = self
            .client
            .request(format!("$JS.API.STREAM.INFO.{}", self.stream), Bytes::new())
            .await
            .map_err(|e| self.nats(e.to_string()))?;
        let info: StreamInfo = serde_json::from_slice(&info.payload)
            .map_err(|e| self.nats(format!("stream info: {e}")))?;
        if let Some(e) = info.error {
            return Err(self.nats(e.description));
        }
        info.state
            .map(|s| s.last_seq)
            .ok_or_else(|| self.nats("stream info without a state".into()))
    }

    fn nats(&self, cause: String) -> FastIngestError {
        FastIngestError::Nats {
            stream: self.stream.clone(),
            cause,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_2_14_support_fast_batches() {
        assert!(server_supports("2.14.0"));
        assert!(server_supports("2.15.1"));
        assert!(server_supports("3.0.0"));
        assert!(server_supports("2.14.0-beta.1"));
        assert!(!server_supports("2.12.8"));
        assert!(!server_supports("2.10.0"));
        assert!(!server_supports(""));
    }
}
