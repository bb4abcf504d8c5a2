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

/// How late a request's timer may fire before this process counts as having been stalled
/// while it waited (frozen by SIGSTOP, a paused VM, a starved runtime).
const STALL: Duration = Duration::from_millis(250);

/// How long a stalled process still waits for a reply after its timer fired.
const STALL_GRACE: Duration = Duration::from_secs(1);

/// Waits up to `timeout` for `reply`; `None` when it did not come.
///
/// A timer that fires well after its deadline says the process did not run meanwhile, not
/// that the broker was slow: the reply may be in the socket already, read only once the
/// connection's task runs again — and on waking the timer often runs first. A reply that
/// was answered (a settle the broker applied) would then be reported as a timeout, and a
/// retry of it refused as expired. So a stalled wait gets [`STALL_GRACE`] more to read what
/// arrived; a wait that ran on time ends at its deadline.
pub(crate) async fn wait_for_reply<F: std::future::Future>(
    reply: F,
    timeout: Duration,
) -> Option<F::Output> {
    let start = tokio::time::Instant::now();
    tokio::pin!(reply);
    if let Ok(r) = tokio::time::timeout(timeout, &mut reply).await {
        return Some(r);
    }
    let late = start.elapsed().saturating_sub(timeout);
    if late < STALL {
        return None;
    }
    tracing::debug!(
        late_ms = late.as_millis() as u64,
        "request timer fired late (the process was stalled): reading what arrived"
    );
    tokio::time::timeout(STALL_GRACE, reply).await.ok()
}

/// Sends a request and decodes the reply, turning error replies into [`ClientError::Refused`].
pub(crate) async fn request_raw(
    client: &async_nats::Client,
    subject: &str,
    headers: Option<HeaderMap>,
    body: Bytes,
    timeout: Duration,
) -> Result<async_nats::Message, ClientError> {
    // The wait is ours, not async-nats' (see `wait_for_reply`).
    let req = async_nats::Request::new().payload(body).timeout(None);
    // The broker answers before this time is up instead of after we gave up (a settle
    // waiting for its stage records during a stage-stream election).
    let mut headers = headers.unwrap_or_default();
    headers.insert(h::TIMEOUT_MS, timeout.as_millis().to_string().as_str());
    let req = req.headers(headers);
    let timed_out = || ClientError::Timeout {
        subject: subject.to_owned(),
        timeout_ms: timeout.as_millis() as u64,
    };
    let reply = wait_for_reply(client.send_request(subject.to_owned(), req), timeout)
        .await
        .ok_or_else(timed_out)?
        .map_err(|e| match e.kind() {
            async_nats::RequestErrorKind::TimedOut => timed_out(),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A runtime that stops running for `stall` once the wait below has started, as a process
    /// frozen by SIGSTOP does; the reply is sent from outside at `reply_at`.
    fn stalled_wait(stall: Duration, reply_at: Duration, timeout: Duration) -> Option<u32> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async move {
            let (tx, rx) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                std::thread::sleep(reply_at);
                let _ = tx.send(7u32);
            });
            tokio::spawn(async move {
                tokio::task::yield_now().await;
                // Blocks the runtime's only thread: nothing else runs meanwhile.
                std::thread::sleep(stall);
            });
            wait_for_reply(rx, timeout).await.map(|r| r.unwrap())
        })
    }

    #[test]
    fn a_reply_read_after_a_stall_is_not_a_timeout() {
        // The timer (100 ms) fires at the end of the 600 ms stall, the reply comes 100 ms
        // later: a wait that was not stalled would have ended without it.
        assert_eq!(
            stalled_wait(
                Duration::from_millis(600),
                Duration::from_millis(700),
                Duration::from_millis(100)
            ),
            Some(7)
        );
    }

    #[test]
    fn a_wait_that_ran_on_time_ends_at_its_deadline() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let start = std::time::Instant::now();
        let got = rt.block_on(wait_for_reply(
            std::future::pending::<u32>(),
            Duration::from_millis(100),
        ));
        assert_eq!(got, None);
        assert!(start.elapsed() < STALL_GRACE, "{:?}", start.elapsed());
    }
}
