//! Shared harness of the end-to-end tests: a real nats-server, a broker in-process with test
//! clients configured, and helpers to read the stage stream.

pub mod browser;

use futures::StreamExt;
use msgtrail_broker::{BrokerConfig, ClientEntry, ClientRegistry, RunningBroker};
use msgtrail_client::{Consumer, Identity, NatsOptions, Producer};
use msgtrail_core::decode_batch;
use msgtrail_core::subjects::STAGE_STREAM;
use msgtrail_core::trajectory::{HopKind, Trajectory};
use msgtrail_core::{ClientId, MessageId, Role, Stage, StageRecord};
use msgtrail_listener::ListenerClient;
use msgtrail_listener::{ListenerConfig, ListenerHandle};
use msgtrail_test_support::NatsServer;
use std::time::Duration;

/// A running test system.
pub struct TestSystem {
    /// The nats-server.
    pub server: NatsServer,
    /// The broker.
    pub broker: Option<RunningBroker>,
    /// A plain NATS client.
    pub nats: async_nats::Client,
    /// Identities configured on the broker, by client ID.
    pub identities: Vec<(Role, Identity)>,
    /// The broker's configuration (to start more brokers of the same deployment).
    pub config: BrokerConfig,
    /// More brokers in the same queue group.
    pub more_brokers: Vec<RunningBroker>,
}

/// Ack wait of the test broker.
pub const ACK_WAIT: Duration = Duration::from_millis(1000);
/// Max deliveries of the test broker.
pub const MAX_DELIVER: u32 = 3;

fn id(s: &str) -> ClientId {
    ClientId::new(s).unwrap()
}

impl TestSystem {
    /// Starts nats-server and a broker with producers `shop`, `shop-2` and consumers
    /// `billing-1`, `billing-2`, `audit-1` (any topic) and `narrow-1` (only `orders.*`).
    pub async fn start() -> TestSystem {
        Self::start_with(|_| {}).await
    }

    /// Same as [`TestSystem::start`], letting the test adjust the broker configuration.
    pub async fn start_with(adjust: impl FnOnce(&mut BrokerConfig)) -> TestSystem {
        let server = NatsServer::start().expect("nats-server must start");
        let mut identities = vec![];
        let mut entries = vec![];
        for (role, name, topics) in [
            (Role::Producer, "shop", vec![">"]),
            (Role::Producer, "shop-2", vec!["orders.>"]),
            (Role::Consumer, "billing-1", vec![">"]),
            (Role::Consumer, "billing-2", vec![">"]),
            (Role::Consumer, "audit-1", vec![">"]),
            (Role::Consumer, "narrow-1", vec!["orders.*"]),
        ] {
            let ident = Identity::generate(id(name)).with_service_name(format!("{name}-svc"));
            entries.push(ClientEntry {
                id: id(name),
                role,
                public_key: ident.public_key(),
                topics: topics.into_iter().map(String::from).collect(),
                service_name: None,
            });
            identities.push((role, ident));
        }
        let mut config = BrokerConfig {
            nats: NatsOptions::url(server.url()),
            clients: ClientRegistry::new(entries).unwrap(),
            ack_wait: ACK_WAIT,
            max_deliver: MAX_DELIVER,
            stage_batch_linger: Duration::from_millis(5),
            ..Default::default()
        };
        adjust(&mut config);
        let broker = msgtrail_broker::start(config.clone())
            .await
            .expect("broker starts");
        let nats = async_nats::connect(server.url()).await.unwrap();
        TestSystem {
            server,
            broker: Some(broker),
            nats,
            identities,
            config,
            more_brokers: vec![],
        }
    }

    /// Starts another broker of the same deployment (same clients, same queue group).
    pub async fn start_another_broker(&mut self) {
        let b = msgtrail_broker::start(self.config.clone())
            .await
            .expect("second broker starts");
        self.more_brokers.push(b);
    }

    /// The identity of a configured client.
    pub fn identity(&self, name: &str) -> Identity {
        self.identities
            .iter()
            .find(|(_, i)| i.client_id.as_str() == name)
            .map(|(_, i)| i.clone())
            .unwrap_or_else(|| panic!("no test identity {name}"))
    }

    /// A producer for a configured client.
    pub async fn producer(&self, name: &str) -> Producer {
        Producer::connect(self.nats.clone(), self.identity(name))
            .await
            .expect("producer channel opens")
    }

    /// A consumer for a configured client.
    pub async fn consumer(&self, name: &str) -> Consumer {
        Consumer::connect(self.nats.clone(), self.identity(name))
            .await
            .expect("consumer channel opens")
    }

    /// Every stage record in the stage stream so far.
    pub async fn stage_records(&self) -> Vec<StageRecord> {
        let js = async_nats::jetstream::new(self.nats.clone());
        let stream = js.get_stream(STAGE_STREAM).await.unwrap();
        let last = stream.clone().info().await.unwrap().state.last_sequence;
        let mut out = vec![];
        for seq in 1..=last {
            if let Ok(m) = stream.direct_get(seq).await {
                out.extend(decode_batch(&m.payload).expect("stage batches decode"));
            }
        }
        out
    }

    /// Waits until the stage stream holds records for `message_id` that satisfy `done`, and
    /// returns them (in stream order); panics after 10 s with what it saw.
    pub async fn records_for(
        &self,
        message_id: MessageId,
        done: impl Fn(&[StageRecord]) -> bool,
    ) -> Vec<StageRecord> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let recs: Vec<StageRecord> = self
                .stage_records()
                .await
                .into_iter()
                .filter(|r| r.message_id == Some(message_id))
                .collect();
            if done(&recs) {
                return recs;
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "records for {message_id} never completed; saw {:?}",
                    stages(&recs)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops the broker gracefully.
    pub async fn stop_broker(&mut self) {
        if let Some(b) = self.broker.take() {
            b.shutdown().await;
        }
    }

    /// Reads every message of a stream subject (for dead letters).
    pub async fn stream_messages(
        &self,
        stream: &str,
    ) -> Vec<async_nats::jetstream::message::StreamMessage> {
        let js = async_nats::jetstream::new(self.nats.clone());
        let s = js.get_stream(stream).await.unwrap();
        let last = s.clone().info().await.unwrap().state.last_sequence;
        let mut out = vec![];
        for seq in 1..=last {
            if let Ok(m) = s.direct_get(seq).await {
                out.push(m);
            }
        }
        out
    }
}

/// A listener running in-process on a test system's nats-server, its store in a temporary
/// directory, and a client of its HTTP API.
pub struct TestListener {
    /// The running listener.
    pub handle: ListenerHandle,
    /// A client of its HTTP API.
    pub client: ListenerClient,
    _dir: tempfile::TempDir,
}

impl TestSystem {
    /// Starts a listener on this system's nats-server (HTTP on a free loopback port, the
    /// watchdog every 100 ms), letting the test adjust its configuration (deadlines, ...).
    pub async fn start_listener(&self, adjust: impl FnOnce(&mut ListenerConfig)) -> TestListener {
        let dir = tempfile::tempdir().unwrap();
        let mut config = ListenerConfig {
            nats: msgtrail_client::NatsOptions::url(self.server.url()),
            data_dir: dir.path().to_path_buf(),
            http_addr: "127.0.0.1:0".parse().unwrap(),
            watchdog_interval: Duration::from_millis(100),
            ..Default::default()
        };
        adjust(&mut config);
        let nats = async_nats::connect(self.server.url()).await.unwrap();
        let handle = msgtrail_listener::start_with_client(config, nats)
            .await
            .expect("listener starts");
        let client = ListenerClient::new(&format!("http://{}", handle.http_addr()), None).unwrap();
        TestListener {
            handle,
            client,
            _dir: dir,
        }
    }
}

impl TestListener {
    /// The base URL of the HTTP API.
    pub fn url(&self) -> String {
        format!("http://{}", self.handle.http_addr())
    }

    /// Polls `GET /api/messages/{id}` (a message ID or a request ID) until the trajectory
    /// satisfies `done`, and returns it; panics after 20 s with the last answer.
    pub async fn trajectory_when(
        &self,
        id: &str,
        done: impl Fn(&Trajectory) -> bool,
    ) -> Trajectory {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let last = self.client.trajectory(id, None).await;
            if let Ok(t) = &last {
                if done(t) {
                    return t.clone();
                }
            }
            if tokio::time::Instant::now() > deadline {
                panic!("the trajectory of {id} never got there; last answer: {last:#?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Whether every record of a trajectory that ended is in: no hop is open, and every
/// delivery has its consumer side with the consumer's settle (C3/C7). The producer's and the
/// consumers' reports travel apart from the broker's records, so they can arrive after the
/// broker's ack record (C4/C8).
pub fn settled(t: &Trajectory) -> bool {
    t.hops.iter().all(|h| h.end.is_some())
        && t.hops
            .iter()
            .filter(|h| h.kind == HopKind::Deliver)
            .all(|d| {
                t.hop(&d.key.replacen("deliver/", "process/", 1))
                    .is_some_and(|p| {
                        p.events
                            .iter()
                            .any(|r| matches!(r.stage, Stage::PushAckSent | Stage::PullAckSent))
                    })
            })
}

/// The stage codes of records, in order.
pub fn stages(recs: &[StageRecord]) -> Vec<Stage> {
    recs.iter().map(|r| r.stage).collect()
}

/// Whether `recs` hold each of `wanted` at least once.
pub fn has_all(recs: &[StageRecord], wanted: &[Stage]) -> bool {
    wanted.iter().all(|w| recs.iter().any(|r| r.stage == *w))
}

/// Drains a stream of futures' results, for readability.
pub async fn collect<S: futures::Stream + Unpin>(
    s: &mut S,
    n: usize,
    within: Duration,
) -> Vec<S::Item> {
    let mut out = vec![];
    let deadline = tokio::time::Instant::now() + within;
    while out.len() < n {
        match tokio::time::timeout_at(deadline, s.next()).await {
            Ok(Some(x)) => out.push(x),
            _ => break,
        }
    }
    out
}
