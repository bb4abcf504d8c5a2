//! Channels: a producer or consumer proves who it is and gets a channel ID that
//! every later request carries.
//!
//! Authentication is an nkey challenge–response, NATS' own scheme: the client asks for a
//! nonce (`channel.challenge`), signs it with its nkey seed and opens the channel
//! (`channel.open`) with the signature; the broker verifies it against the public key in its
//! clients file. Nonces and channels live in JetStream key-value buckets, so any broker of
//! the queue group can verify a nonce another issued, and serve a channel another opened.
//! Each broker watches the channel bucket into a local cache so that the message path does
//! not pay a round trip to look a channel up. A channel expires `channel_ttl` after its last
//! open or keepalive (the bucket's max age); closing deletes it. Expiry and closing are
//! recorded as A1 (`expired`, `closed`).

use crate::clients::ClientRegistry;
use crate::metrics::Metrics;
use crate::stage_sink::StageSink;
use async_nats::jetstream::kv::{Operation, Store};
use base64::Engine;
use futures::StreamExt;
use msgtrail_core::outcome::ChannelOutcome;
use msgtrail_core::wire::{ChallengeReply, KeepaliveReply, OpenReply, OpenRequest};
use msgtrail_core::{ClientId, ErrorCode, Role, Stage, StageRecord, WireError};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// An open channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OpenChannel {
    /// The channel ID.
    pub id: String,
    /// Producer or consumer.
    pub role: Role,
    /// Who opened it.
    pub client_id: ClientId,
    /// The client's OpenTelemetry `service.name`.
    pub service_name: String,
    /// Topic filters the client may use.
    pub topics: Vec<String>,
    /// When it expires unless kept alive, Unix milliseconds.
    pub expires_at_ms: u64,
}

const USED_NONCE: &[u8] = b"used";

/// The channel registry shared by the request handlers of one broker.
#[derive(Debug, Clone)]
pub(crate) struct Channels {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    kv: Store,
    nonces: Store,
    /// parking_lot's lock: it cannot poison (a panic while it is held leaves the map as it
    /// is; every change is one insert or remove).
    cache: RwLock<HashMap<String, OpenChannel>>,
    clients: ClientRegistry,
    ttl: Duration,
    sink: StageSink,
    metrics: Arc<Metrics>,
    service_name: String,
}

fn now_ms() -> u64 {
    msgtrail_core::time::now_nanos() / 1_000_000
}

impl Channels {
    /// Creates the registry and starts watching the channel bucket.
    pub(crate) async fn start(
        kv: Store,
        nonces: Store,
        clients: ClientRegistry,
        ttl: Duration,
        sink: StageSink,
        metrics: Arc<Metrics>,
        service_name: String,
    ) -> Result<Self, async_nats::Error> {
        let channels = Channels {
            inner: Arc::new(Inner {
                kv,
                nonces,
                cache: RwLock::new(HashMap::new()),
                clients,
                ttl,
                sink,
                metrics,
                service_name,
            }),
        };
        let mut watch = channels.inner.kv.watch_all().await?;
        let weak = Arc::downgrade(&channels.inner);
        tokio::spawn(async move {
            while let Some(Ok(entry)) = watch.next().await {
                let Some(inner) = weak.upgrade() else { break };
                let mut cache = inner.cache.write();
                match entry.operation {
                    Operation::Put => {
                        if let Ok(ch) = serde_json::from_slice::<OpenChannel>(&entry.value) {
                            cache.insert(entry.key, ch);
                        }
                    }
                    Operation::Delete | Operation::Purge => {
                        cache.remove(&entry.key);
                    }
                }
            }
        });
        tokio::spawn(sweep_expired(Arc::downgrade(&channels.inner)));
        Ok(channels)
    }

    /// `channel.challenge`: issues a one-time nonce for `client_id`.
    pub(crate) async fn challenge(
        &self,
        client_id: &ClientId,
    ) -> Result<ChallengeReply, WireError> {
        let nonce = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        self.inner
            .nonces
            .create(&nonce, client_id.as_str().as_bytes().to_vec().into())
            .await
            .map_err(|e| {
                WireError::new(ErrorCode::Unavailable, format!("cannot store nonce: {e}"))
            })?;
        Ok(ChallengeReply { nonce })
    }

    /// `channel.open`: verifies the signed nonce and opens a channel, recording A1 either way.
    #[tracing::instrument(name = "channel.open", skip_all, fields(client_id = %req.client_id, role = ?req.role))]
    pub(crate) async fn open(
        &self,
        req: OpenRequest,
    ) -> Result<(OpenChannel, OpenReply), WireError> {
        let result = self.try_open(&req).await;
        let mut rec = StageRecord::now(Stage::Channel);
        match req.role {
            Role::Producer => rec.producer = Some(req.client_id.clone()),
            Role::Consumer => rec.consumer = Some(req.client_id.clone()),
        }
        rec.service = Some(self.inner.service_name.clone());
        match &result {
            Ok(_) => {
                Metrics::inc(&self.inner.metrics.channels_opened);
                rec.set_outcome(ChannelOutcome::Opened);
            }
            Err(e) => {
                Metrics::inc(&self.inner.metrics.channels_refused);
                rec.set_outcome(ChannelOutcome::Refused);
                rec.detail = Some(e.to_string());
            }
        }
        self.inner.sink.record(rec);
        result
    }

    async fn try_open(&self, req: &OpenRequest) -> Result<(OpenChannel, OpenReply), WireError> {
        let inner = &self.inner;
        let entry = inner.clients.get(req.role, &req.client_id).ok_or_else(|| {
            WireError::new(
                ErrorCode::UnknownClient,
                format!(
                    "no {} with id {:?} is configured on this broker",
                    req.role,
                    req.client_id.as_str()
                ),
            )
        })?;
        let nonce_entry = inner
            .nonces
            .entry(&req.nonce)
            .await
            .ok()
            .flatten()
            .filter(|e| e.operation == Operation::Put)
            .ok_or_else(|| {
                WireError::new(
                    ErrorCode::BadNonce,
                    "unknown or expired nonce: ask channel.challenge for a new one",
                )
            })?;
        if nonce_entry.value.as_ref() != req.client_id.as_str().as_bytes() {
            return Err(WireError::new(
                ErrorCode::BadNonce,
                "nonce already used or issued to another client",
            ));
        }
        let signature = decode_signature(&req.signature)?;
        let key = nkeys::KeyPair::from_public_key(&entry.public_key).map_err(|e| {
            WireError::new(ErrorCode::Internal, format!("configured key invalid: {e}"))
        })?;
        key.verify(req.nonce.as_bytes(), &signature).map_err(|_| {
            WireError::new(
                ErrorCode::BadSignature,
                format!(
                    "signature does not verify with the public key of {:?}",
                    req.client_id.as_str()
                ),
            )
        })?;
        // Consume the nonce: a compare-and-set on its revision, so it opens one channel only.
        inner
            .nonces
            .update(&req.nonce, USED_NONCE.to_vec().into(), nonce_entry.revision)
            .await
            .map_err(|_| WireError::new(ErrorCode::BadNonce, "nonce already used"))?;
        let channel = OpenChannel {
            id: uuid::Uuid::new_v4().simple().to_string(),
            role: req.role,
            client_id: req.client_id.clone(),
            service_name: req
                .service_name
                .clone()
                .filter(|s| !s.trim().is_empty() && s.len() <= 128)
                .or_else(|| entry.service_name.clone())
                .unwrap_or_else(|| req.client_id.to_string()),
            topics: entry.topics.clone(),
            expires_at_ms: now_ms() + inner.ttl.as_millis() as u64,
        };
        self.store(&channel).await?;
        let reply = OpenReply {
            channel: channel.id.clone(),
            ttl_ms: inner.ttl.as_millis() as u64,
            topics: channel.topics.clone(),
        };
        Ok((channel, reply))
    }

    async fn store(&self, channel: &OpenChannel) -> Result<(), WireError> {
        let value = serde_json::to_vec(channel).expect("channel serializes");
        self.inner
            .kv
            .put(&channel.id, value.into())
            .await
            .map_err(|e| {
                WireError::new(ErrorCode::Unavailable, format!("cannot store channel: {e}"))
            })?;
        self.inner
            .cache
            .write()
            .insert(channel.id.clone(), channel.clone());
        Ok(())
    }

    /// Looks an open, unexpired channel up.
    pub(crate) async fn lookup(&self, id: &str) -> Result<OpenChannel, WireError> {
        let unknown = || {
            WireError::new(
                ErrorCode::UnknownChannel,
                format!("channel {id:?} is not open (never opened, closed, or expired without keepalive)"),
            )
        };
        if id.is_empty() || id.len() > 64 {
            return Err(unknown());
        }
        let now = now_ms();
        let cached = self.inner.cache.read().get(id).cloned();
        if let Some(ch) = cached.filter(|c| c.expires_at_ms > now) {
            return Ok(ch);
        }
        // Opened or kept alive on another broker a moment ago: ask the bucket.
        let entry = self
            .inner
            .kv
            .entry(id)
            .await
            .ok()
            .flatten()
            .ok_or_else(unknown)?;
        if entry.operation != Operation::Put {
            return Err(unknown());
        }
        let ch: OpenChannel = serde_json::from_slice(&entry.value).map_err(|_| unknown())?;
        if ch.expires_at_ms <= now {
            return Err(unknown());
        }
        Ok(ch)
    }

    /// Looks a channel up and checks its role.
    pub(crate) async fn lookup_role(&self, id: &str, role: Role) -> Result<OpenChannel, WireError> {
        let ch = self.lookup(id).await?;
        if ch.role != role {
            return Err(WireError::new(
                ErrorCode::NotPermitted,
                format!(
                    "channel {id:?} is a {} channel; this request needs a {role} channel",
                    ch.role
                ),
            ));
        }
        Ok(ch)
    }

    /// `channel.keepalive`: extends the channel's life.
    pub(crate) async fn keepalive(&self, id: &str) -> Result<KeepaliveReply, WireError> {
        let mut ch = self.lookup(id).await?;
        ch.expires_at_ms = now_ms() + self.inner.ttl.as_millis() as u64;
        self.store(&ch).await?;
        Ok(KeepaliveReply {
            ttl_ms: self.inner.ttl.as_millis() as u64,
        })
    }

    /// `channel.close`: closes the channel, recording A1 `closed`.
    pub(crate) async fn close(&self, id: &str) -> Result<(), WireError> {
        let ch = self.lookup(id).await?;
        self.inner.kv.delete(id).await.map_err(|e| {
            WireError::new(ErrorCode::Unavailable, format!("cannot close channel: {e}"))
        })?;
        self.inner.cache.write().remove(id);
        let mut rec = StageRecord::now(Stage::Channel);
        match ch.role {
            Role::Producer => rec.producer = Some(ch.client_id.clone()),
            Role::Consumer => rec.consumer = Some(ch.client_id.clone()),
        }
        rec.set_outcome(ChannelOutcome::Closed);
        rec.service = Some(self.inner.service_name.clone());
        self.inner.sink.record(rec);
        Ok(())
    }
}

/// Drops expired channels from the cache and records A1 `expired` for each, once per
/// deployment: every broker sees every channel, so the brokers race to create a marker key in
/// the nonce bucket and only the winner writes the record.
async fn sweep_expired(inner: std::sync::Weak<Inner>) {
    loop {
        let period = match inner.upgrade() {
            Some(i) => (i.ttl / 4).max(Duration::from_millis(250)),
            None => break,
        };
        tokio::time::sleep(period).await;
        let Some(inner) = inner.upgrade() else { break };
        let now = now_ms();
        let expired: Vec<OpenChannel> = {
            let mut cache = inner.cache.write();
            let gone: Vec<String> = cache
                .iter()
                .filter(|(_, c)| c.expires_at_ms <= now)
                .map(|(k, _)| k.clone())
                .collect();
            gone.iter().filter_map(|k| cache.remove(k)).collect()
        };
        for ch in expired {
            let marker = format!("expired-{}", ch.id);
            if inner
                .nonces
                .create(&marker, USED_NONCE.to_vec().into())
                .await
                .is_err()
            {
                continue; // another broker recorded it
            }
            let mut rec = StageRecord::now(Stage::Channel);
            match ch.role {
                Role::Producer => rec.producer = Some(ch.client_id.clone()),
                Role::Consumer => rec.consumer = Some(ch.client_id.clone()),
            }
            rec.set_outcome(ChannelOutcome::Expired);
            rec.detail = Some(format!("no keepalive within {} ms", inner.ttl.as_millis()));
            rec.service = Some(inner.service_name.clone());
            inner.sink.record(rec);
        }
    }
}

fn decode_signature(sig: &str) -> Result<Vec<u8>, WireError> {
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    URL_SAFE_NO_PAD
        .decode(sig.trim_end_matches('='))
        .or_else(|_| STANDARD.decode(sig))
        .map_err(|_| WireError::new(ErrorCode::BadSignature, "signature is not base64url"))
}
