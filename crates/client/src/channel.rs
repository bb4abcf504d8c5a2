//! A channel to the broker: opened with the nkey challenge–response, kept alive in the
//! background, reopened transparently when the broker says it is gone, closed on drop.

use crate::error::ClientError;
use crate::identity::Identity;
use async_nats::HeaderMap;
use bytes::Bytes;
use msgtrail_core::headers as h;
use msgtrail_core::subjects as s;
use msgtrail_core::sync::Recover;
use msgtrail_core::wire::{
    ChallengeReply, ChallengeRequest, ChannelRequest, OpenReply, OpenRequest,
};
use msgtrail_core::{ErrorCode, Role, WireError};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Default request timeout.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest frame the SDK builds by default: 1 MiB or NATS' `max_payload` if smaller,
/// less [`FRAME_SLACK`].
pub(crate) const MAX_FRAME_BYTES: usize = 1024 * 1024;
/// Room left in a request for its headers and the frame's own fields.
pub(crate) const FRAME_SLACK: usize = 4 * 1024;

/// The byte bound of one batch request on `client`: `wanted` (or [`MAX_FRAME_BYTES`]), at
/// most the server's `max_payload`, less [`FRAME_SLACK`].
pub(crate) fn frame_budget(client: &async_nats::Client, wanted: Option<usize>) -> usize {
    let server = match client.server_info().max_payload {
        0 => MAX_FRAME_BYTES,
        n => n,
    };
    match wanted {
        Some(w) => w.min(server.saturating_sub(FRAME_SLACK)),
        None => MAX_FRAME_BYTES.min(server).saturating_sub(FRAME_SLACK),
    }
}

/// An open channel, shared by a producer's or consumer's clones.
#[derive(Debug)]
pub(crate) struct Channel {
    pub(crate) client: async_nats::Client,
    pub(crate) identity: Identity,
    pub(crate) role: Role,
    /// The channel ID, replaced when the channel is reopened. Poison is recovered
    /// ([`Recover`]): a read clones it, a write assigns it whole.
    id: RwLock<String>,
    pub(crate) timeout: Duration,
    keepalive: tokio::task::JoinHandle<()>,
}

/// Sends a request and decodes the reply, turning error replies into [`ClientError::Refused`].
pub(crate) async fn request_raw(
    client: &async_nats::Client,
    subject: &str,
    headers: Option<HeaderMap>,
    body: Bytes,
    timeout: Duration,
) -> Result<async_nats::Message, ClientError> {
    let req = async_nats::Request::new()
        .payload(body)
        .timeout(Some(timeout));
    let req = match headers {
        Some(hs) => req.headers(hs),
        None => req,
    };
    let reply = client
        .send_request(subject.to_owned(), req)
        .await
        .map_err(|e| match e.kind() {
            async_nats::RequestErrorKind::TimedOut => ClientError::Timeout {
                subject: subject.to_owned(),
                timeout_ms: timeout.as_millis() as u64,
            },
            async_nats::RequestErrorKind::NoResponders => ClientError::NoBroker {
                subject: subject.to_owned(),
            },
            _ => ClientError::nats(e),
        })?;
    if let Some(hs) = &reply.headers {
        if let Some(code) = hs.get(h::ERROR) {
            let text = hs
                .get(h::NATS_SERVICE_ERROR)
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default();
            let code = ErrorCode::parse(code.as_str());
            let message = text
                .strip_prefix(&format!("{code}: "))
                .unwrap_or(&text)
                .to_owned();
            return Err(ClientError::Refused(WireError::new(code, message)));
        }
        if let Some(text) = hs.get(h::NATS_SERVICE_ERROR) {
            return Err(ClientError::Refused(WireError::new(
                ErrorCode::Internal,
                text.as_str(),
            )));
        }
    }
    Ok(reply)
}

pub(crate) fn decode<T: DeserializeOwned>(reply: &async_nats::Message) -> Result<T, ClientError> {
    serde_json::from_slice(&reply.payload).map_err(ClientError::decode)
}

pub(crate) async fn request_json<Q: Serialize, T: DeserializeOwned>(
    client: &async_nats::Client,
    subject: &str,
    body: &Q,
    timeout: Duration,
) -> Result<T, ClientError> {
    let body = serde_json::to_vec(body).expect("requests serialize");
    decode(&request_raw(client, subject, None, body.into(), timeout).await?)
}

async fn open(
    client: &async_nats::Client,
    identity: &Identity,
    role: Role,
    timeout: Duration,
) -> Result<OpenReply, ClientError> {
    let challenge: ChallengeReply = request_json(
        client,
        s::CHANNEL_CHALLENGE,
        &ChallengeRequest {
            client_id: identity.client_id.clone(),
        },
        timeout,
    )
    .await?;
    let open = OpenRequest {
        role,
        client_id: identity.client_id.clone(),
        signature: identity.sign(&challenge.nonce),
        nonce: challenge.nonce,
        service_name: identity.service_name.clone(),
    };
    request_json(client, s::CHANNEL_OPEN, &open, timeout).await
}

impl Channel {
    /// Opens a channel and starts its keepalive.
    pub(crate) async fn open(
        client: async_nats::Client,
        identity: Identity,
        role: Role,
        timeout: Duration,
    ) -> Result<Arc<Self>, ClientError> {
        let reply = open(&client, &identity, role, timeout).await?;
        let ttl = Duration::from_millis(reply.ttl_ms.max(1000));
        let channel = Arc::new_cyclic(|weak: &std::sync::Weak<Channel>| {
            let weak = weak.clone();
            let keepalive = tokio::spawn(async move {
                loop {
                    tokio::time::sleep(ttl / 3).await;
                    let Some(ch) = weak.upgrade() else { break };
                    let body = ChannelRequest { channel: ch.id() };
                    let res: Result<serde_json::Value, _> =
                        request_json(&ch.client, s::CHANNEL_KEEPALIVE, &body, ch.timeout).await;
                    if let Err(e) = res {
                        tracing::debug!(error = %msgtrail_core::ErrorChain(&e), "keepalive failed; reopening the channel");
                        let _ = ch.reopen().await;
                    }
                }
            });
            Channel {
                client,
                identity,
                role,
                id: RwLock::new(reply.channel),
                timeout,
                keepalive,
            }
        });
        Ok(channel)
    }

    /// The current channel ID.
    pub(crate) fn id(&self) -> String {
        self.id.read().recover().clone()
    }

    async fn reopen(&self) -> Result<(), ClientError> {
        let reply = open(&self.client, &self.identity, self.role, self.timeout).await?;
        *self.id.write().recover() = reply.channel;
        Ok(())
    }

    /// Runs `f` with the channel ID; if the broker no longer knows the channel, reopens it
    /// once and runs `f` again.
    pub(crate) async fn with_channel<T, F, Fut>(&self, f: F) -> Result<T, ClientError>
    where
        F: Fn(String) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        match f(self.id()).await {
            Err(e) if e.code() == Some(ErrorCode::UnknownChannel) => {
                self.reopen().await?;
                f(self.id()).await
            }
            other => other,
        }
    }

    /// Sends `body` to `subject` with the channel ID in the `Msgtrail-Channel` header,
    /// reopening the channel once if the broker no longer knows it.
    pub(crate) async fn request_on_channel(
        &self,
        subject: &str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<async_nats::Message, ClientError> {
        self.with_channel(|id| {
            let mut headers = HeaderMap::new();
            headers.insert(h::CHANNEL, id.as_str());
            request_raw(&self.client, subject, Some(headers), body.clone(), timeout)
        })
        .await
    }

    /// Closes the channel on the broker.
    pub(crate) async fn close(&self) -> Result<(), ClientError> {
        self.keepalive.abort();
        let _: serde_json::Value = request_json(
            &self.client,
            s::CHANNEL_CLOSE,
            &ChannelRequest { channel: self.id() },
            self.timeout,
        )
        .await?;
        Ok(())
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        self.keepalive.abort();
    }
}
