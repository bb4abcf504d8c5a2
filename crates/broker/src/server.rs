//! The broker as a NATS service: connects, makes sure the streams exist, serves every request
//! subject in the `msgtrail-broker` queue group (so several brokers share the work), and shuts
//! down gracefully: stop taking requests, finish those in flight, flush stage records.
//!
//! It is a NATS micro service named `msgtrail`, so `nats micro ls/info/stats msgtrail` work;
//! the broker's counters are in each endpoint's stats `data`.

use crate::channels::Channels;
use crate::config::BrokerConfig;
use crate::consume::Deliverer;
pub use crate::error::BrokerError;
use crate::metrics::Metrics;
use crate::push::PushManager;
use crate::relay::Relay;
use crate::stage_sink::{SinkMode, StageSink};
use crate::upload::Uploader;
use async_nats::service::{self, ServiceExt};
use async_nats::HeaderMap;
use bytes::Bytes;
use futures::StreamExt;
use msgtrail_core::headers as h;
use msgtrail_core::subjects as s;
use msgtrail_core::wire::{
    AckRequest, ChallengeRequest, ChannelRequest, FetchRequest, OkReply, OpenRequest,
    SubscribeRequest, UnsubscribeRequest,
};
use msgtrail_core::BrokerInstance;
use msgtrail_core::{ErrorCode, WireError};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// The request kinds, one per endpoint.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Challenge,
    Open,
    Keepalive,
    Close,
    Upload,
    UploadBatch,
    Fetch,
    Subscribe,
    Unsubscribe,
    Ack,
    Settle,
    Stage,
}

impl Kind {
    /// The endpoint's name (`upload`, `fetch`, …), as in [`ENDPOINTS`]: the `kind` of the
    /// request's span.
    fn name(self) -> &'static str {
        ENDPOINTS
            .iter()
            .find(|(k, ..)| std::mem::discriminant(k) == std::mem::discriminant(&self))
            .map_or("unknown", |(_, name, _)| name)
    }
}

const ENDPOINTS: &[(Kind, &str, &str)] = &[
    (Kind::Challenge, "channel-challenge", s::CHANNEL_CHALLENGE),
    (Kind::Open, "channel-open", s::CHANNEL_OPEN),
    (Kind::Keepalive, "channel-keepalive", s::CHANNEL_KEEPALIVE),
    (Kind::Close, "channel-close", s::CHANNEL_CLOSE),
    (Kind::Upload, "upload", s::UPLOAD),
    (Kind::UploadBatch, "upload-batch", s::UPLOAD_BATCH),
    (Kind::Fetch, "fetch", s::FETCH),
    (Kind::Subscribe, "subscribe", s::SUBSCRIBE),
    (Kind::Unsubscribe, "unsubscribe", s::UNSUBSCRIBE),
    (Kind::Ack, "ack", s::ACK),
    (Kind::Settle, "settle", s::SETTLE),
    (Kind::Stage, "stage", s::STAGE_REPORT),
];

/// The request handlers of one broker.
#[derive(Debug)]
struct Handlers {
    channels: Channels,
    uploader: Uploader,
    deliverer: Deliverer,
    push: PushManager,
    settler: crate::settle::Settler,
    relay: Relay,
    metrics: Arc<Metrics>,
}

fn parse<T: DeserializeOwned>(payload: &[u8]) -> Result<T, WireError> {
    serde_json::from_slice(payload)
        .map_err(|e| WireError::new(ErrorCode::BadRequest, format!("invalid request body: {e}")))
}

fn json<T: Serialize>(v: &T) -> Result<Bytes, WireError> {
    Ok(serde_json::to_vec(v).expect("replies serialize").into())
}

fn ok() -> Result<Bytes, WireError> {
    json(&OkReply {
        ok: true,
        accepted: None,
    })
}

impl Handlers {
    async fn handle(&self, kind: Kind, msg: &async_nats::Message) -> Result<Bytes, WireError> {
        let p = &msg.payload;
        match kind {
            Kind::Upload | Kind::UploadBatch => Metrics::inc(&self.metrics.upload_requests),
            Kind::Ack | Kind::Settle => Metrics::inc(&self.metrics.settle_requests),
            _ => {}
        }
        match kind {
            Kind::Challenge => json(
                &self
                    .channels
                    .challenge(&parse::<ChallengeRequest>(p)?.client_id)
                    .await?,
            ),
            Kind::Open => json(&self.channels.open(parse::<OpenRequest>(p)?).await?.1),
            Kind::Keepalive => json(
                &self
                    .channels
                    .keepalive(&parse::<ChannelRequest>(p)?.channel)
                    .await?,
            ),
            Kind::Close => {
                self.channels
                    .close(&parse::<ChannelRequest>(p)?.channel)
                    .await?;
                ok()
            }
            Kind::Upload => json(&self.uploader.handle(msg).await?),
            Kind::UploadBatch => self.uploader.handle_batch(msg).await,
            Kind::Fetch => self.deliverer.fetch(parse::<FetchRequest>(p)?).await,
            Kind::Settle => self.settler.handle(msg).await,
            Kind::Subscribe => json(&self.push.subscribe(parse::<SubscribeRequest>(p)?).await?),
            Kind::Unsubscribe => {
                self.push
                    .unsubscribe(parse::<UnsubscribeRequest>(p)?)
                    .await?;
                ok()
            }
            Kind::Ack => {
                let budget = crate::settle::ReplyBudget::of(msg.headers.as_ref())?;
                let req = parse::<AckRequest>(p)?;
                // The single form of `settle`.
                if let Some((sub, seq)) = self.deliverer.ack(req, budget).await? {
                    self.push.notify_settled(&sub, seq).await;
                }
                ok()
            }
            Kind::Stage => {
                let n = self.relay.handle(msg).await?;
                json(&OkReply {
                    ok: true,
                    accepted: Some(n),
                })
            }
        }
    }

    async fn respond(&self, kind: Kind, req: service::Request) {
        // A reply goes out with the broker's own rights: never aim it at JetStream's API,
        // the KV buckets or msgtrail's streams, whatever reply subject a request names
        // (deploy/'s accounts also keep clients from naming one; this holds without them).
        if let Some(reply) = &req.message.reply {
            if forbidden_reply(reply.as_str()) {
                self.metrics.error(ErrorCode::NotPermitted);
                tracing::warn!(reply = %reply, "request with a reply subject the broker never answers to; dropped");
                return;
            }
        }
        let span = request_span(kind, &req.message);
        let answer = async {
            let sent = match self.handle(kind, &req.message).await {
                Ok(body) => {
                    tracing::debug!(reply_bytes = body.len(), "request answered");
                    req.respond(Ok(body)).await
                }
                Err(e) => {
                    self.metrics.error(e.code);
                    tracing::Span::current().record("code", e.code.as_str());
                    tracing::debug!(code = %e.code, error = %e.message, "request refused");
                    let mut headers = HeaderMap::new();
                    headers.insert(h::ERROR, e.code.as_str());
                    let err = service::error::Error {
                        status: e.to_string().replace(['\r', '\n'], " "),
                        code: usize::from(e.code.status()),
                    };
                    req.respond_with_headers(Err(err), headers).await
                }
            };
            if let Err(e) = sent {
                tracing::debug!(error = %e, "reply not sent (requester gone?)");
            }
        };
        answer.instrument(span).await;
    }
}

/// The span of one request (`RUST_LOG=msgtrail_broker=debug` shows it on every line the
/// request logs): its endpoint, the channel and request ID where the request's headers carry
/// them (uploads, binary settles; the JSON requests' handlers add theirs), its size, and the
/// error code if it is refused. Never the payload.
fn request_span(kind: Kind, msg: &async_nats::Message) -> tracing::Span {
    let header = |name: &str| {
        msg.headers
            .as_ref()
            .and_then(|hs| hs.get(name))
            .map(|v| v.as_str().to_owned())
    };
    tracing::info_span!(
        "request",
        kind = kind.name(),
        channel = header(h::CHANNEL),
        request_id = header(h::REQUEST_ID),
        bytes = msg.payload.len(),
        code = tracing::field::Empty,
    )
}

/// Reply subjects the broker refuses to publish to: JetStream and system subjects (`$…`) and
/// msgtrail's own (`msgtrail.…`: streams, internal notices).
fn forbidden_reply(subject: &str) -> bool {
    subject.starts_with('$') || subject.starts_with("msgtrail.")
}

/// A broker running in this process.
#[derive(Debug)]
pub struct RunningBroker {
    /// The broker's counters.
    pub metrics: Arc<Metrics>,
    /// The instance name on the stage records this broker writes.
    pub instance: BrokerInstance,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl RunningBroker {
    /// Stops taking requests, finishes those in flight, flushes stage records, and returns.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

/// Runs a broker until `shutdown` resolves, then shuts down gracefully.
pub async fn run(
    config: BrokerConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), BrokerError> {
    let broker = start(config).await?;
    shutdown.await;
    tracing::info!("shutting down: no new requests, finishing those in flight");
    broker.shutdown().await;
    Ok(())
}

/// Starts a broker in the background.
pub async fn start(config: BrokerConfig) -> Result<RunningBroker, BrokerError> {
    config.validate()?;
    let config = Arc::new(config);
    let client = config.nats.connect().await?;
    let js = async_nats::jetstream::new(client.clone());
    let storage = ensure_storage(&js, &config)
        .await
        .map_err(|e| BrokerError::setup("streams and signing key", e))?;
    let metrics = Arc::new(Metrics::default());
    let instance = config
        .instance_name
        .clone()
        .unwrap_or_else(BrokerInstance::generate);
    tracing::info!(instance = %instance, "broker instance");
    let (sink, writer) = StageSink::start(
        js.clone(),
        instance.clone(),
        metrics.clone(),
        config.stage_buffer,
        config.stage_batch_max,
        config.stage_batch_linger,
        SinkMode::of(&config),
    );
    let shutdown = CancellationToken::new();
    let (handlers, deliverer) =
        build_handlers(&config, &client, js, storage, sink, &metrics, &shutdown).await?;
    let (service, endpoints) = start_service(&client, &metrics, &instance).await?;
    let advisories = tokio::spawn(deliverer.watch_max_deliveries(shutdown.clone()));
    let serving = Serving {
        endpoints,
        handlers,
        max_concurrent: config.max_concurrent_requests,
        grace: config.shutdown_grace,
        signal: shutdown.clone(),
        advisories,
        service,
        writer,
        client,
    };
    let task = tokio::spawn(serving.run());
    Ok(RunningBroker {
        metrics,
        instance,
        shutdown,
        task,
    })
}

/// The fast-ingest publisher into the message stream, if configured and the server has it
/// (turning `allow_batched` on for the stream); otherwise uploads keep one PubAck each.
async fn fast_ingest(
    config: &BrokerConfig,
    client: &async_nats::Client,
) -> Option<Arc<msgtrail_nats::fast_ingest::FastIngest>> {
    use msgtrail_nats::fast_ingest::{enable_on_stream, FastIngest};
    if !config.fast_ingest {
        return None;
    }
    let stream = msgtrail_core::subjects::MESSAGE_STREAM;
    match enable_on_stream(client, stream).await {
        Ok(true) => {}
        Ok(false) => {
            tracing::info!(
                server = %client.server_info().version,
                "nats-server before 2.14: uploads stored with one PubAck per message"
            );
            return None;
        }
        Err(e) => {
            tracing::warn!(error = %e, "fast-ingest batches not available; uploads stored with one PubAck per message");
            return None;
        }
    }
    match FastIngest::new(client.clone(), stream, config.store_timeout).await {
        Ok(f) => Some(Arc::new(f)),
        Err(e) => {
            tracing::warn!(error = %e, "fast-ingest publisher not started; uploads stored with one PubAck per message");
            None
        }
    }
}

/// Builds the request handlers over one shared state; returns them and the deliverer (whose
/// advisory watch the caller starts). The stage sink is dropped here: from then on only the
/// handlers hold it, so the writer ends when they do.
async fn build_handlers(
    config: &Arc<BrokerConfig>,
    client: &async_nats::Client,
    js: async_nats::jetstream::Context,
    (storage, key): (crate::streams::Storage, crate::signing::SigningKey),
    sink: StageSink,
    metrics: &Arc<Metrics>,
    shutdown: &CancellationToken,
) -> Result<(Arc<Handlers>, Deliverer), BrokerError> {
    let channels = Channels::start(
        storage.channels.clone(),
        storage.nonces.clone(),
        config.clients.clone(),
        config.channel_ttl,
        sink.clone(),
        metrics.clone(),
        config.service_name.clone(),
    )
    .await
    .map_err(|e| BrokerError::setup("channels bucket", e))?;
    let fast = fast_ingest(config, client).await;
    // Uploads wait for their PubAcks at most the store timeout (BrokerConfig::store_timeout).
    let mut js = js;
    js.set_timeout(config.store_timeout);
    let shared = Arc::new(crate::shared::Shared {
        js,
        stream: storage.messages.clone(),
        fast,
        client: client.clone(),
        channels: channels.clone(),
        sink: sink.clone(),
        metrics: metrics.clone(),
        config: config.clone(),
        key: key.clone(),
        js_probe: Arc::default(),
    });
    let relay = Relay {
        key,
        channels: channels.clone(),
        sink: sink.clone(),
        metrics: metrics.clone(),
    };
    let uploader = Uploader {
        shared: shared.clone(),
        relay: relay.clone(),
    };
    let deliverer = Deliverer {
        shared,
        consumers: Default::default(),
    };
    let push = PushManager::new(deliverer.clone(), shutdown.clone());
    // Shared, not cloned, per request: a clone deep-copies the stream handles and their info.
    let handlers = Arc::new(Handlers {
        settler: crate::settle::Settler {
            deliverer: deliverer.clone(),
            push: push.clone(),
            relay: relay.clone(),
        },
        push,
        relay,
        channels,
        uploader,
        deliverer: deliverer.clone(),
        metrics: metrics.clone(),
    });
    drop(sink);
    Ok((handlers, deliverer))
}

/// Starts the NATS service (queue group, stats handler with the instance) and adds one
/// endpoint per request kind.
async fn start_service(
    client: &async_nats::Client,
    metrics: &Arc<Metrics>,
    instance: &BrokerInstance,
) -> Result<(service::Service, Vec<(Kind, service::endpoint::Endpoint)>), BrokerError> {
    let stats_metrics = metrics.clone();
    let stats_instance = instance.clone();
    let service = client
        .service_builder()
        .description("msgtrail broker: channels, upload, fetch, push, ack, stage reports")
        .queue_group(s::BROKER_QUEUE_GROUP)
        .stats_handler(move |_, _| {
            let mut stats = stats_metrics.snapshot();
            stats["instance"] = serde_json::Value::from(stats_instance.as_str());
            stats
        })
        .start("msgtrail", env!("CARGO_PKG_VERSION"))
        .await
        .map_err(|e| BrokerError::setup("service", e))?;
    let mut endpoints = Vec::new();
    for (kind, name, subject) in ENDPOINTS {
        let ep = service
            .endpoint_builder()
            .name(*name)
            .add(*subject)
            .await
            .map_err(|e| BrokerError::setup("service endpoint", e))?;
        endpoints.push((*kind, ep));
    }
    Ok((service, endpoints))
}

/// What the broker's background task serves with, until its shutdown signal.
struct Serving {
    endpoints: Vec<(Kind, service::endpoint::Endpoint)>,
    handlers: Arc<Handlers>,
    max_concurrent: usize,
    grace: std::time::Duration,
    signal: CancellationToken,
    advisories: JoinHandle<()>,
    service: service::Service,
    writer: JoinHandle<()>,
    client: async_nats::Client,
}

impl Serving {
    /// Serves every endpoint until the signal, then waits for the requests in flight (up to
    /// the grace period), the advisory watch, the service's stop, the stage writer's flush
    /// and the client's, each bounded by the grace period.
    async fn run(self) {
        // Every request handler runs on the tracker, so the shutdown can wait for those in flight.
        let in_flight = TaskTracker::new();
        let permits = Arc::new(Semaphore::new(self.max_concurrent));
        let grace = self.grace;
        let loops: Vec<_> = self
            .endpoints
            .into_iter()
            .map(|(kind, ep)| {
                tokio::spawn(serve(
                    kind,
                    ep,
                    self.handlers.clone(),
                    in_flight.clone(),
                    permits.clone(),
                    self.max_concurrent,
                    self.signal.clone(),
                ))
            })
            .collect();
        drop(self.handlers);
        for l in loops {
            let _ = l.await;
        }
        // Every endpoint has stopped taking requests; wait for those in flight.
        in_flight.close();
        if tokio::time::timeout(grace, in_flight.wait()).await.is_err() {
            tracing::warn!(
                grace_ms = grace.as_millis() as u64,
                "requests still in flight after the grace period"
            );
        }
        let _ = self.advisories.await;
        // Each step is bounded: when NATS is already gone (a Ctrl-C reaches nats-server too),
        // stopping the service or flushing would otherwise wait for a reconnect forever.
        let _ = tokio::time::timeout(grace, self.service.stop()).await;
        // The handlers are gone, so every sink clone is dropped: the writer flushes and ends.
        let _ = tokio::time::timeout(grace, self.writer).await;
        let _ = tokio::time::timeout(grace, self.client.flush()).await;
        tracing::info!("broker stopped");
    }
}

/// Attempts at creating streams and buckets before giving up.
const SETUP_ATTEMPTS: u32 = 8;

/// Creates or finds the streams, buckets and signing key, retrying with backoff: brokers
/// starting together against a fresh cluster race to create replicated streams, and JetStream
/// answers "no responders" or times out while a stream's replicas are being placed.
async fn ensure_storage(
    js: &async_nats::jetstream::Context,
    config: &BrokerConfig,
) -> Result<(crate::streams::Storage, crate::signing::SigningKey), async_nats::Error> {
    let mut backoff = msgtrail_core::Backoff::new(
        std::time::Duration::from_millis(250),
        std::time::Duration::from_secs(5),
    );
    let mut attempt = 1;
    loop {
        let result = async {
            let storage = crate::streams::ensure(js, config).await?;
            let key = crate::signing::SigningKey::load_or_create(js, config.replicas).await?;
            Ok::<_, async_nats::Error>((storage, key))
        }
        .await;
        match result {
            Ok(done) => return Ok(done),
            // A stream the broker refuses to change stays so: say it at once.
            Err(e) if attempt < SETUP_ATTEMPTS && is_transient(&*e) => {
                tracing::warn!(attempt, error = %msgtrail_core::ErrorChain(&*e), "JetStream setup failed; retrying");
                tokio::time::sleep(backoff.next_pause()).await;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Whether a setup error may go away by itself (anything but a topology error that says
/// otherwise, such as a stream the broker will not change).
fn is_transient(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<msgtrail_nats::topology::TopologyError>()
        .is_none_or(|t| t.is_transient())
}

/// How long an endpoint may take to unsubscribe at shutdown.
const ENDPOINT_STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

async fn serve(
    kind: Kind,
    mut endpoint: service::endpoint::Endpoint,
    handlers: Arc<Handlers>,
    in_flight: TaskTracker,
    permits: Arc<Semaphore>,
    max_concurrent: usize,
    shutdown: CancellationToken,
) {
    loop {
        let req = tokio::select! {
            r = endpoint.next() => match r { Some(r) => r, None => break },
            _ = shutdown.cancelled() => break,
        };
        // Backpressure: no permit, no next request taken from NATS (all endpoints share the
        // bound); requests wait in the subscription, and producers slow down. The permit is
        // taken after a request arrived, so idle endpoints never hold one.
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = shutdown.cancelled() => break,
        };
        let busy = (max_concurrent - permits.available_permits()) as u64;
        handlers
            .metrics
            .peak_concurrent_requests
            .fetch_max(busy, std::sync::atomic::Ordering::Relaxed);
        let handlers = handlers.clone();
        in_flight.spawn(async move {
            handlers.respond(kind, req).await;
            drop(permit);
        });
    }
    let _ = tokio::time::timeout(ENDPOINT_STOP_WAIT, endpoint.stop()).await;
}
