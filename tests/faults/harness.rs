//! The fault suite's harness: a system of real processes, a workload that keeps a history of
//! every client operation, and an oracle that reads the streams on its own.
//!
//! - [`System`] runs nats-server (one restartable node or a 3-node cluster), brokers and a
//!   listener as child processes of the built `msgtrail` binary, identities in a clients file.
//! - [`run_load`] starts producers (the Rust SDK, retried with the same request ID until acked)
//!   and a pull consumer group, every call recorded in a [`History`] as ok / fail / unknown.
//! - the oracle ([`drain_messages`], [`judge_stream`], [`judge_trajectories`]) drains
//!   `MSGTRAIL_MESSAGES` with a fresh ordered consumer (lost and duplicated uploads by request
//!   ID) and reads every acked message's trajectory from the listener's HTTP API
//!   (complete: a real store hop with P2 and P3, and, for a consumed message, the group's
//!   delivery acknowledged).
//! - [`Report`] prints one JSON line per scenario on stdout.

use futures::StreamExt;
use msgtrail_client::{
    Consumer, ConsumerOptions, HookEvent, HookKind, Identity, Outgoing, Producer, ProducerOptions,
};
use msgtrail_core::trajectory::{HopKind, MessageState, Trajectory};
use msgtrail_core::wire::Subscription;
use msgtrail_core::{ClientId, MessageId, RequestId, Stage};
use msgtrail_listener::ListenerClient;
use msgtrail_test_support::{free_port, msgtrail_binary, ChildProcess, ProcessSpec};
use msgtrail_test_support::{NatsCluster, NatsNode, Network};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The topic every workload message goes to.
pub(crate) const TOPIC: &str = "faults.orders";
/// The consumer group of the workload's consumer.
pub(crate) const GROUP: &str = "faults-billing";
/// Ack wait of the brokers: a delivery lost with a broker comes back this soon.
pub(crate) const ACK_WAIT: &str = "2s";

/// One scenario is serialised with the others: they measure latencies and recovery times,
/// and two of them on two shared cores would measure each other.
pub(crate) static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How big a run is: the short variant in `cargo test`, the long one with
/// `MSGTRAIL_FAULTS_LONG=1`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scale {
    /// Messages per run.
    pub messages: usize,
    /// Repetitions.
    pub reps: usize,
    /// Whether this is the long variant.
    pub long: bool,
}

impl Scale {
    /// `short` messages once, or with `MSGTRAIL_FAULTS_LONG=1` `long` messages three times.
    pub(crate) fn pick(short: usize, long: usize) -> Scale {
        let is_long = std::env::var("MSGTRAIL_FAULTS_LONG").is_ok_and(|v| v == "1");
        if is_long {
            Scale {
                messages: long,
                reps: 3,
                long: true,
            }
        } else {
            Scale {
                messages: short,
                reps: 1,
                long: false,
            }
        }
    }

    /// `short` or `long`.
    pub(crate) fn variant(&self) -> &'static str {
        if self.long {
            "long"
        } else {
            "short"
        }
    }
}

/// Milliseconds since `t0`, as a float.
pub(crate) fn ms_since(t0: Instant, t: Instant) -> f64 {
    t.saturating_duration_since(t0).as_secs_f64() * 1000.0
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// The commit under test: `git rev-parse --short HEAD`, with `+dirty` when the tree has
/// changes.
pub(crate) fn commit() -> String {
    let root = msgtrail_test_support::workspace_root();
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .current_dir(&root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let head = run(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty =
        run(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty {
        format!("{head}+dirty")
    } else {
        head
    }
}

// ---------------------------------------------------------------------------------------
// The system
// ---------------------------------------------------------------------------------------

/// The NATS side of a system.
#[derive(Debug)]
pub(crate) enum Nats {
    /// One node, restartable on the same port and store.
    Single(Box<NatsNode>),
    /// A cluster of nodes.
    Cluster(NatsCluster),
}

impl Nats {
    /// Every client URL.
    pub(crate) fn urls(&self) -> Vec<String> {
        match self {
            Nats::Single(n) => vec![n.url().to_owned()],
            Nats::Cluster(c) => c.urls(),
        }
    }

    /// The logs of every node.
    pub(crate) fn logs(&self) -> String {
        match self {
            Nats::Single(n) => n.logs(),
            Nats::Cluster(c) => c.logs(),
        }
    }
}

/// How to start a [`System`].
#[derive(Debug, Clone)]
pub(crate) struct SystemOptions {
    /// A 3-node cluster with R3 streams instead of one node.
    pub cluster: bool,
    /// Broker processes.
    pub brokers: usize,
    /// Start the listener process with the system.
    pub listener: bool,
    /// More `msgtrail broker` arguments (`--dedup-window 1s`).
    pub broker_args: Vec<String>,
    /// More `msgtrail listener` arguments (`--batch-size 4`).
    pub listener_args: Vec<String>,
    /// More environment of the listener process (`OTEL_EXPORTER_OTLP_ENDPOINT`, …).
    pub listener_env: Vec<(String, String)>,
    /// More environment of each broker process, by index (broker-1's first; brokers past
    /// the end get none): libfaketime's `LD_PRELOAD` and `FAKETIME` for a skewed clock.
    pub broker_env: Vec<Vec<(String, String)>>,
    /// The single node's JetStream store directory instead of one in the scenario's
    /// directory (a size-limited tmpfs, for a full disk).
    pub nats_store: Option<PathBuf>,
    /// Run nats-server under deploy/nats/accounts.conf (accounts, users, permissions): the
    /// brokers connect as `broker`, the listener as `listener`, the test's producer and
    /// consumer as the password client `client` with its inbox prefix, the oracle as `broker`.
    pub deploy_accounts: bool,
    /// Every process in a network namespace of its own (crates/test-support's `netns`): the
    /// cluster's nodes (hosts `n1`–`n3`), each broker (`broker-<n>`) and the listener
    /// (`listener`) on one bridge, the test's clients on the root end (`root`), so that a
    /// scenario can partition them ([`System::cut_off`]). Needs root, `ip` and `cluster`.
    /// The test's own clients then ping every 2 s like the SDK's `NatsOptions`.
    pub netns: bool,
    /// JetStream `sync_interval: always` on the nodes (only with `netns`).
    pub nats_sync_always: bool,
}

impl SystemOptions {
    /// `user` under deploy's accounts, `None` (no authentication) otherwise.
    fn user(&self, user: &'static NatsUser) -> Option<&'static NatsUser> {
        self.deploy_accounts.then_some(user)
    }
}

impl Default for SystemOptions {
    fn default() -> Self {
        SystemOptions {
            cluster: false,
            brokers: 1,
            listener: true,
            broker_args: vec![],
            listener_args: vec![],
            listener_env: vec![],
            broker_env: vec![],
            nats_store: None,
            deploy_accounts: false,
            netns: false,
            nats_sync_always: false,
        }
    }
}

/// nats-server, brokers and a listener as real processes, and the test's clients.
pub(crate) struct System {
    /// The NATS node or cluster.
    pub nats: Nats,
    /// The broker processes, in start order.
    pub brokers: Vec<ChildProcess>,
    /// The listener process, once started.
    pub listener: Option<ChildProcess>,
    /// The listener's API address.
    pub listener_addr: String,
    /// The producer's identity (client `faults-shop`).
    pub producer_id: Identity,
    /// The consumer's identity (client `faults-billing-1`).
    pub consumer_id: Identity,
    /// A plain NATS connection for the oracle and for raw requests.
    pub admin: async_nats::Client,
    options: SystemOptions,
    clients_file: PathBuf,
    listener_data: PathBuf,
    dir: tempfile::TempDir,
    /// The namespaces (with `netns`); last, so that every process is gone before they are.
    network: Option<Network>,
}

fn id(s: &str) -> ClientId {
    ClientId::new(s).expect("valid client id")
}

/// A NATS user of deploy/nats/accounts.conf, with the inbox prefix it must use.
#[derive(Debug, Clone)]
pub(crate) struct NatsUser {
    /// The user name.
    pub user: &'static str,
    /// Its password (the suite's own, handed to nats-server as the config's variables).
    pub password: &'static str,
    /// The inbox prefix its permissions allow (`None`: `_INBOX`).
    pub inbox_prefix: Option<&'static str>,
}

/// The public key of deploy's demo producer `shop` (deploy/msgtrail/clients.json), a NATS
/// nkey user of the CLIENTS account with the inbox prefix `_INBOX_CLIENT.shop`.
pub(crate) const DEMO_SHOP_PUBLIC_KEY: &str =
    "UCDCVLQXCRQX2PV7XTBYNHKMAMZXHZTPO4GQWK7GQWZVEVL6DQQLF6ZX";

/// The brokers' user.
pub(crate) const BROKER_USER: NatsUser = NatsUser {
    user: "broker",
    password: "faults-broker-secret",
    inbox_prefix: None,
};
/// The listener's user.
pub(crate) const LISTENER_USER: NatsUser = NatsUser {
    user: "listener",
    password: "faults-listener-secret",
    inbox_prefix: None,
};
/// The password client of the CLIENTS account, on its own inbox prefix.
pub(crate) const CLIENT_USER: NatsUser = NatsUser {
    user: "client",
    password: "faults-client-secret",
    inbox_prefix: Some("_INBOX_CLIENT.client"),
};

/// deploy/nats/accounts.conf as nats-server configuration text, its password variables
/// defined before it (nats-server's `include` takes no absolute path, so the file's text is
/// appended as it is).
pub(crate) fn deploy_accounts_config() -> String {
    let path = msgtrail_test_support::workspace_root().join("deploy/nats/accounts.conf");
    let accounts =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    format!(
        "NATS_SYS_PASSWORD: \"faults-sys-secret\"\n\
         MSGTRAIL_BROKER_PASSWORD: \"{}\"\n\
         MSGTRAIL_LISTENER_PASSWORD: \"{}\"\n\
         MSGTRAIL_CLIENT_PASSWORD: \"{}\"\n\
         MSGTRAIL_APP_PASSWORD: \"faults-app-secret\"\n\
         MSGTRAIL_OBSERVER_PASSWORD: \"faults-observer-secret\"\n{accounts}\n",
        BROKER_USER.password, LISTENER_USER.password, CLIENT_USER.password
    )
}

/// Connects to every URL of `urls` (each a seed), retrying until `within` passes.
pub(crate) async fn connect(urls: &[String]) -> async_nats::Client {
    connect_as(urls, None, None).await
}

/// Connects to every URL of `urls` as `user` (`None`: no authentication), pinging after
/// `ping` without traffic (`None`: async-nats' 60 s), retrying for up to 20 s.
pub(crate) async fn connect_as(
    urls: &[String],
    user: Option<&NatsUser>,
    ping: Option<Duration>,
) -> async_nats::Client {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let addrs: Vec<async_nats::ServerAddr> = urls.iter().map(|u| u.parse().unwrap()).collect();
        let mut options = match user {
            Some(u) => {
                async_nats::ConnectOptions::with_user_and_password(u.user.into(), u.password.into())
            }
            None => async_nats::ConnectOptions::new(),
        };
        if let Some(prefix) = user.and_then(|u| u.inbox_prefix) {
            options = options.custom_inbox_prefix(prefix);
        }
        if let Some(ping) = ping {
            options = options.ping_interval(ping);
        }
        match options.retry_on_initial_connect().connect(addrs).await {
            Ok(c) => return c,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("cannot connect to {urls:?}: {e}"),
        }
    }
}

impl System {
    /// Starts nats-server (or a cluster), the brokers and (if asked) the listener, and waits
    /// until every broker answers service discovery and the listener answers `/healthz`.
    pub(crate) async fn start(options: SystemOptions) -> System {
        let dir = tempfile::Builder::new()
            .prefix("msgtrail-faults-")
            .tempdir()
            .unwrap();
        let mut network = options.netns.then(|| {
            assert!(options.cluster, "SystemOptions::netns runs a cluster");
            Network::create().unwrap_or_else(|e| panic!("{e}"))
        });
        let nats = if let Some(net) = network.as_mut() {
            Nats::Cluster(
                NatsCluster::start_in(net, 3, options.nats_sync_always)
                    .expect("a 3-node nats cluster starts in network namespaces"),
            )
        } else if options.cluster {
            Nats::Cluster(NatsCluster::start(3).expect("a 3-node nats cluster starts"))
        } else if options.deploy_accounts {
            Nats::Single(Box::new(
                NatsNode::start_with(
                    "nats",
                    &dir.path().join("jetstream"),
                    free_port(),
                    deploy_accounts_config(),
                )
                .expect("nats-server starts under deploy/nats/accounts.conf"),
            ))
        } else {
            let store = options
                .nats_store
                .clone()
                .unwrap_or_else(|| dir.path().join("jetstream"));
            Nats::Single(Box::new(
                NatsNode::start(&store).expect("nats-server must start"),
            ))
        };
        let producer_id = Identity::generate(id("faults-shop")).with_service_name("faults-shop");
        let consumer_id =
            Identity::generate(id("faults-billing-1")).with_service_name("faults-billing");
        let clients_file = dir.path().join("clients.json");
        let mut clients = json!({ "clients": [
            { "id": "faults-shop", "role": "producer", "public_key": producer_id.public_key(),
              "topics": ["faults.>"], "service_name": "faults-shop" },
            { "id": "faults-billing-1", "role": "consumer", "public_key": consumer_id.public_key(),
              "topics": ["faults.>"], "service_name": "faults-billing" },
        ]});
        if options.deploy_accounts {
            // deploy's demo producer `shop` (its nkey is also a NATS user of the CLIENTS
            // account), allowed on orders.> only: a legitimate client of its own.
            clients["clients"].as_array_mut().unwrap().push(json!(
                { "id": "shop", "role": "producer", "public_key": DEMO_SHOP_PUBLIC_KEY,
                  "topics": ["orders.>"], "service_name": "shop-frontend" }));
        }
        std::fs::write(&clients_file, serde_json::to_vec_pretty(&clients).unwrap()).unwrap();
        let ping = options
            .netns
            .then_some(msgtrail_nats::DEFAULT_PING_INTERVAL);
        let admin = connect_as(&nats.urls(), options.user(&BROKER_USER), ping).await;
        let listener_data = dir.path().join("listener-data");
        let listener_addr = match network.as_mut() {
            Some(net) => {
                let host = net.add_host("listener").unwrap_or_else(|e| panic!("{e}"));
                format!("{}:8080", host.addr())
            }
            None => format!("127.0.0.1:{}", free_port()),
        };
        let mut sys = System {
            nats,
            brokers: vec![],
            listener: None,
            listener_addr,
            producer_id,
            consumer_id,
            admin,
            options: options.clone(),
            clients_file,
            listener_data,
            dir,
            network,
        };
        for _ in 0..options.brokers {
            sys.spawn_broker();
        }
        sys.wait_brokers(options.brokers, Duration::from_secs(60))
            .await;
        if options.listener {
            sys.spawn_listener();
            sys.wait_listener(Duration::from_secs(30)).await;
        }
        sys
    }

    fn bin() -> PathBuf {
        msgtrail_binary().unwrap_or_else(|e| {
            panic!("{e}\n(the fault suite runs the real `msgtrail` binary as child processes)")
        })
    }

    fn base_spec(&self, name: &str) -> ProcessSpec {
        let spec = ProcessSpec::new(
            name,
            Self::bin(),
            self.dir.path().join(format!("{name}.log")),
        )
        .env("NATS_URL", self.nats.urls().join(","))
        .env("RUST_LOG", "warn")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_SERVICE_NAME")
        .env_remove("NATS_USER")
        .env_remove("NATS_PASSWORD");
        // Under deploy's accounts a broker connects as `broker`, anything else as `listener`.
        let user = if name.starts_with("broker") {
            &BROKER_USER
        } else {
            &LISTENER_USER
        };
        let spec = match self.options.user(user) {
            Some(u) => spec
                .env("NATS_USER", u.user)
                .env("NATS_PASSWORD", u.password),
            None => spec,
        };
        // With namespaces, a broker or the listener runs in the host of its name.
        match self.network.as_ref().and_then(|n| n.host(name).ok()) {
            Some(host) => host.wrap(spec),
            None => spec,
        }
    }

    /// The network of namespaces (with `netns`).
    pub(crate) fn network(&self) -> Option<&Network> {
        self.network.as_ref()
    }

    /// Partitions the system: the hosts labelled `side` (`n1`, `broker-1`, `listener`,
    /// `root` for the test's own clients) from all others (with `netns`).
    pub(crate) fn cut_off(&mut self, side: &[&str]) {
        let net = self
            .network
            .as_mut()
            .expect("a partition needs SystemOptions::netns");
        net.cut_off(side)
            .unwrap_or_else(|e| panic!("cut off {side:?}: {e}"));
    }

    /// Ends the partition.
    pub(crate) fn heal(&mut self) {
        let net = self
            .network
            .as_mut()
            .expect("a partition needs SystemOptions::netns");
        net.heal().unwrap_or_else(|e| panic!("heal: {e}"));
    }

    /// How often the test's own clients ping a silent server (`None`: async-nats' 60 s).
    fn client_ping(&self) -> Option<Duration> {
        self.options
            .netns
            .then_some(msgtrail_nats::DEFAULT_PING_INTERVAL)
    }

    /// Starts another `msgtrail` process (`args`, e.g. `consume …`) named `name`, connected
    /// like the brokers, with `env` added; its stdout and stderr go to `<name>.log`.
    pub(crate) fn spawn_msgtrail(
        &self,
        name: &str,
        args: &[String],
        env: &[(String, String)],
    ) -> ChildProcess {
        let mut spec = self.base_spec(name).args(args.iter().cloned());
        for (k, v) in env {
            spec = spec.env(k, v);
        }
        ChildProcess::spawn(spec).unwrap_or_else(|e| panic!("{name} starts: {e}"))
    }

    /// The scenario's scratch directory (logs, clients file, stores).
    pub(crate) fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The NATS user of the test's own clients (`None` without deploy's accounts).
    pub(crate) fn client_user(&self) -> Option<&'static NatsUser> {
        self.options.user(&CLIENT_USER)
    }

    /// Starts one more broker process (`broker-<n>`) and returns its index; does not wait.
    pub(crate) fn spawn_broker(&mut self) -> usize {
        let n = self.brokers.len() + 1;
        let name = format!("broker-{n}");
        if let Some(net) = self.network.as_mut() {
            net.add_host(&name).unwrap_or_else(|e| panic!("{e}"));
        }
        let mut args: Vec<String> = vec![
            "broker".into(),
            "--clients".into(),
            self.clients_file.display().to_string(),
            "--service-name".into(),
            name.clone(),
        ];
        // The suite's defaults, unless the scenario sets its own.
        for (flag, value) in [("--ack-wait", ACK_WAIT), ("--max-deliver", "20")] {
            if !self.options.broker_args.iter().any(|a| a == flag) {
                args.extend([flag.into(), value.into()]);
            }
        }
        if self.options.cluster {
            args.extend(["--replicas".into(), "3".into()]);
        }
        args.extend(self.options.broker_args.iter().cloned());
        let mut spec = self.base_spec(&name).args(args);
        for (k, v) in self.options.broker_env.get(n - 1).into_iter().flatten() {
            spec = spec.env(k, v);
        }
        self.brokers
            .push(ChildProcess::spawn(spec).expect("broker process starts"));
        self.brokers.len() - 1
    }

    /// How many brokers answer the NATS service discovery ping of service `msgtrail`.
    pub(crate) async fn broker_instances(&self) -> usize {
        let inbox = self.admin.new_inbox();
        let Ok(mut sub) = self.admin.subscribe(inbox.clone()).await else {
            return 0;
        };
        if self
            .admin
            .publish_with_reply("$SRV.PING.msgtrail", inbox, "".into())
            .await
            .is_err()
        {
            return 0;
        }
        let _ = self.admin.flush().await;
        let mut ids = HashSet::new();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(300);
        while let Ok(Some(m)) = tokio::time::timeout_at(deadline, sub.next()).await {
            if let Ok(v) = serde_json::from_slice::<Value>(&m.payload) {
                ids.insert(v["id"].as_str().unwrap_or_default().to_owned());
            }
        }
        ids.len()
    }

    /// Waits until `n` brokers answer service discovery; a broker process that exited (it
    /// may race a cluster's JetStream election at startup) is started again.
    pub(crate) async fn wait_brokers(&mut self, n: usize, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            for b in &mut self.brokers {
                if !b.is_running() {
                    b.restart().expect("broker restarts");
                }
            }
            if self.broker_instances().await >= n {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "{n} brokers never answered service discovery\n{}",
                    self.diagnostics()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Starts the listener process (or starts it again: same store, same durable, same
    /// address); does not wait.
    pub(crate) fn spawn_listener(&mut self) {
        if let Some(l) = &mut self.listener {
            l.restart().expect("listener restarts");
            return;
        }
        let mut args: Vec<String> = vec![
            "listener".into(),
            "--data-dir".into(),
            self.listener_data.display().to_string(),
            "--addr".into(),
            self.listener_addr.clone(),
        ];
        args.extend(self.options.listener_args.iter().cloned());
        let mut spec = self.base_spec("listener").args(args);
        for (k, v) in &self.options.listener_env {
            spec = spec.env(k, v);
        }
        self.listener = Some(ChildProcess::spawn(spec).expect("listener process starts"));
    }

    /// Starts a second listener process `name` with its own store, durable consumers
    /// (`name`, `name-stored`) and address, and more arguments (`--no-store-evidence`);
    /// waits until it answers `/healthz`.
    pub(crate) async fn extra_listener(
        &self,
        name: &str,
        args: &[&str],
    ) -> (ChildProcess, ListenerClient) {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut all: Vec<String> = vec![
            "listener".into(),
            "--data-dir".into(),
            self.dir
                .path()
                .join(format!("{name}-data"))
                .display()
                .to_string(),
            "--addr".into(),
            addr.clone(),
            "--durable".into(),
            name.into(),
        ];
        all.extend(args.iter().map(|a| a.to_string()));
        let mut child =
            ChildProcess::spawn(self.base_spec(name).args(all)).expect("listener process starts");
        let client = ListenerClient::new(&format!("http://{addr}"), None).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !matches!(client.get_raw("/healthz").await, Ok((200, _))) {
            if !child.is_running() || Instant::now() > deadline {
                panic!("listener {name} never came up\n{}", child.log_tail(30));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        (child, client)
    }

    /// Waits until the listener answers `/healthz`.
    pub(crate) async fn wait_listener(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        let client = self.listener_client();
        loop {
            if let Ok((200, _)) = client.get_raw("/healthz").await {
                return;
            }
            let exited = self.listener.as_mut().is_some_and(|l| !l.is_running());
            if exited || Instant::now() > deadline {
                panic!("the listener never came up\n{}", self.diagnostics());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A client of the listener's HTTP API.
    pub(crate) fn listener_client(&self) -> ListenerClient {
        ListenerClient::new(&format!("http://{}", self.listener_addr), None).unwrap()
    }

    /// A producer on its own NATS connection (every URL a seed), with a short request timeout
    /// so that a dead broker costs a retry, not a long wait.
    pub(crate) async fn producer(&self) -> Producer {
        let nats = connect_as(&self.nats.urls(), self.client_user(), self.client_ping()).await;
        let options = ProducerOptions::default().timeout(Duration::from_secs(2));
        retry_open(|| {
            Producer::connect_with(nats.clone(), self.producer_id.clone(), options.clone())
        })
        .await
    }

    /// A consumer on its own NATS connection.
    pub(crate) async fn consumer(&self) -> Consumer {
        let nats = connect_as(&self.nats.urls(), self.client_user(), self.client_ping()).await;
        retry_open(|| {
            Consumer::connect_with(
                nats.clone(),
                self.consumer_id.clone(),
                ConsumerOptions::default().timeout(Duration::from_secs(2)),
            )
        })
        .await
    }

    /// The warnings and errors the brokers and the listener logged (`WARN`/`ERROR` lines,
    /// without timestamps and colours, `field=<number>` as `field=N`), by text with their
    /// counts, the most frequent first (at most `n` texts).
    pub(crate) fn logged_warnings(&self, n: usize) -> Vec<(String, usize)> {
        let mut counts: HashMap<String, usize> = HashMap::new();
        let procs = self.brokers.iter().chain(self.listener.iter());
        for p in procs {
            let kind = if p.name().starts_with("broker") {
                "broker"
            } else {
                "listener"
            };
            for line in p.log().lines() {
                let line = strip_ansi(line);
                let Some(at) = line.find(" WARN ").or_else(|| line.find(" ERROR ")) else {
                    continue;
                };
                let text: String = numbers_out(line[at..].trim()).chars().take(200).collect();
                *counts.entry(format!("{kind}: {text}")).or_default() += 1;
            }
        }
        let mut v: Vec<(String, usize)> = counts.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v.truncate(n);
        v
    }

    /// The tail of every process log, for failure messages.
    pub(crate) fn diagnostics(&self) -> String {
        let mut out = String::new();
        for b in &self.brokers {
            out.push_str(&format!("---- {} ----\n{}\n", b.name(), b.log_tail(30)));
        }
        if let Some(l) = &self.listener {
            out.push_str(&format!("---- listener ----\n{}\n", l.log_tail(30)));
        }
        let nats = self.nats.logs();
        let tail: Vec<&str> = nats.lines().rev().take(30).collect();
        out.push_str("---- nats ----\n");
        for l in tail.into_iter().rev() {
            out.push_str(l);
            out.push('\n');
        }
        out
    }
}

/// `s` with every `=<digits>` written `=N`, so that log lines differing in a count group.
fn numbers_out(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == '=' && chars.peek().is_some_and(char::is_ascii_digit) {
            while chars.peek().is_some_and(char::is_ascii_digit) {
                chars.next();
            }
            out.push('N');
        }
    }
    out
}

/// `s` without ANSI colour sequences (`ESC [ … m`).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Opens a channel, retrying for up to 30 s (a broker may still be coming up).
async fn retry_open<T, F, Fut>(open: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, msgtrail_client::ClientError>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match open().await {
            Ok(x) => return x,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("cannot open a channel: {e}"),
        }
    }
}

// ---------------------------------------------------------------------------------------
// History
// ---------------------------------------------------------------------------------------

/// What a client call came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// It was done.
    Ok,
    /// It was definitely not done (the broker refused it for good).
    Fail(String),
    /// Maybe done, maybe not (timeout, connection trouble, storage unavailable).
    Unknown(String),
}

/// One client call.
#[derive(Debug, Clone)]
pub(crate) struct Op {
    /// `send`, `fetch` or `ack`.
    pub kind: &'static str,
    /// The request ID (send) or message ID (ack).
    pub key: String,
    /// When it started, ms since the history's start.
    pub start_ms: f64,
    /// When it ended.
    pub end_ms: f64,
    /// How it ended.
    pub outcome: Outcome,
}

/// Every client call of a run.
#[derive(Debug)]
pub(crate) struct History {
    /// When the run started.
    pub t0: Instant,
    /// The same moment, Unix nanoseconds (hook events carry Unix times).
    t0_unix: u64,
    ops: Mutex<Vec<Op>>,
    /// Upload attempts begun (BeforeSend) and not ended yet: (request ID, attempt) → start.
    attempts: Mutex<HashMap<(String, u32), u64>>,
}

impl History {
    /// An empty history starting now.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(History {
            t0: Instant::now(),
            t0_unix: msgtrail_core::time::now_nanos(),
            ops: Mutex::new(Vec::new()),
            attempts: Mutex::new(HashMap::new()),
        })
    }

    fn unix_ms(&self, at: u64) -> f64 {
        (at as f64 - self.t0_unix as f64) / 1e6
    }

    /// Records every upload attempt of `producer` (the SDK retries inside one call) as an
    /// `attempt` op, from its hook events.
    pub(crate) fn watch_attempts(self: &Arc<Self>, producer: &Producer) {
        let me = self.clone();
        producer.hooks().register_with_capacity(
            &[HookKind::BeforeSend, HookKind::AfterSend],
            1 << 20,
            move |ev| match ev {
                HookEvent::BeforeSend {
                    request_id,
                    attempt,
                    at,
                    ..
                } => {
                    me.attempts
                        .lock()
                        .unwrap()
                        .insert((request_id.to_string(), *attempt), *at);
                }
                HookEvent::AfterSend {
                    request_id,
                    attempt,
                    result,
                    at,
                    ..
                } => {
                    let key = (request_id.to_string(), *attempt);
                    let start = me.attempts.lock().unwrap().remove(&key).unwrap_or(*at);
                    let outcome = match result {
                        Ok(_) => Outcome::Ok,
                        Err(e) => classify(e),
                    };
                    let op = Op {
                        kind: "attempt",
                        key: key.0,
                        start_ms: me.unix_ms(start),
                        end_ms: me.unix_ms(*at),
                        outcome,
                    };
                    me.ops.lock().unwrap().push(op);
                }
                _ => {}
            },
        );
    }

    /// Now, in ms since the start.
    pub(crate) fn now_ms(&self) -> f64 {
        ms_since(self.t0, Instant::now())
    }

    /// Records a call of `kind` on `key` that started at `start` and ends now.
    pub(crate) fn record(&self, kind: &'static str, key: String, start: Instant, outcome: Outcome) {
        self.push(kind, key, start, outcome);
    }

    fn push(&self, kind: &'static str, key: String, start: Instant, outcome: Outcome) {
        let op = Op {
            kind,
            key,
            start_ms: ms_since(self.t0, start),
            end_ms: self.now_ms(),
            outcome,
        };
        self.ops.lock().unwrap().push(op);
    }

    /// A copy of every op so far.
    pub(crate) fn ops(&self) -> Vec<Op> {
        self.ops.lock().unwrap().clone()
    }

    /// Counts of `kind` ops by outcome: (ok, fail, unknown).
    pub(crate) fn counts(&self, kind: &str) -> (usize, usize, usize) {
        let ops = self.ops.lock().unwrap();
        let mut c = (0, 0, 0);
        for o in ops.iter().filter(|o| o.kind == kind) {
            match o.outcome {
                Outcome::Ok => c.0 += 1,
                Outcome::Fail(_) => c.1 += 1,
                Outcome::Unknown(_) => c.2 += 1,
            }
        }
        c
    }

    /// Time from `fault_ms` until the last upload disturbed by it was acknowledged: an upload
    /// that was in flight at the fault or had a failed call or attempt after it. 0 when none
    /// was.
    pub(crate) fn recovery_ms(&self, fault_ms: f64) -> f64 {
        let ops = self.ops();
        let mut by_key: HashMap<&str, Vec<&Op>> = HashMap::new();
        for o in ops
            .iter()
            .filter(|o| o.kind == "send" || o.kind == "attempt")
        {
            by_key.entry(o.key.as_str()).or_default().push(o);
        }
        let mut worst: f64 = 0.0;
        for calls in by_key.values() {
            let first = calls.iter().map(|o| o.start_ms).fold(f64::MAX, f64::min);
            let Some(acked) = calls
                .iter()
                .filter(|o| o.outcome == Outcome::Ok)
                .map(|o| o.end_ms)
                .reduce(f64::min)
            else {
                continue;
            };
            let in_flight = first <= fault_ms && acked >= fault_ms;
            let failed_after = calls
                .iter()
                .any(|o| o.outcome != Outcome::Ok && o.end_ms >= fault_ms);
            if in_flight || failed_after {
                worst = worst.max(acked - fault_ms);
            }
        }
        round1(worst)
    }

    /// The longest time after `from_ms` with no `kind` call (`send`, `ack`) ending ok: between
    /// two ok ends, or from `from_ms` to the first one. 0 when none ended ok after `from_ms`.
    pub(crate) fn longest_gap_ms(&self, kind: &str, from_ms: f64) -> f64 {
        let mut ends: Vec<f64> = self
            .ops()
            .iter()
            .filter(|o| o.kind == kind && o.outcome == Outcome::Ok && o.end_ms >= from_ms)
            .map(|o| o.end_ms)
            .collect();
        ends.sort_by(f64::total_cmp);
        let mut last = from_ms;
        let mut worst: f64 = 0.0;
        for e in ends {
            worst = worst.max(e - last);
            last = e;
        }
        round1(worst)
    }

    /// From the first to the last end of a `kind` call that did not end ok after `from_ms`
    /// (`None` when every one did): the window in which such calls failed or timed out.
    pub(crate) fn failure_window_ms(&self, kind: &str, from_ms: f64) -> Option<(f64, f64)> {
        let ends: Vec<f64> = self
            .ops()
            .iter()
            .filter(|o| o.kind == kind && o.outcome != Outcome::Ok && o.end_ms >= from_ms)
            .map(|o| o.end_ms)
            .collect();
        let first = ends.iter().copied().reduce(f64::min)?;
        let last = ends.iter().copied().reduce(f64::max)?;
        Some((round1(first), round1(last)))
    }

    /// Latencies of the successful `send` calls, ms.
    pub(crate) fn send_latencies(&self) -> Vec<f64> {
        self.ops()
            .iter()
            .filter(|o| o.kind == "send" && o.outcome == Outcome::Ok)
            .map(|o| o.end_ms - o.start_ms)
            .collect()
    }

    /// Writes every op as a JSON line to `<dir>/<name>.jsonl` when `$MSGTRAIL_FAULTS_HISTORY`
    /// names a directory (for a look at a run's history after the fact).
    pub(crate) fn dump(&self, name: &str) {
        let Some(dir) = std::env::var_os("MSGTRAIL_FAULTS_HISTORY") else {
            return;
        };
        let dir = PathBuf::from(dir);
        let _ = std::fs::create_dir_all(&dir);
        let mut text = String::new();
        for o in self.ops() {
            let (outcome, error) = match &o.outcome {
                Outcome::Ok => ("ok", String::new()),
                Outcome::Fail(e) => ("fail", e.clone()),
                Outcome::Unknown(e) => ("unknown", e.clone()),
            };
            let line = json!({"kind": o.kind, "key": o.key, "start_ms": round1(o.start_ms),
                              "end_ms": round1(o.end_ms), "outcome": outcome, "error": error});
            text.push_str(&line.to_string());
            text.push('\n');
        }
        let _ = std::fs::write(dir.join(format!("{name}.jsonl")), text);
    }

    /// The failed and unknown calls by kind and error text, with their counts (at most `n`
    /// texts, the most frequent first), for the report.
    pub(crate) fn error_counts(&self, n: usize) -> Vec<(String, usize)> {
        let mut counts: HashMap<String, usize> = HashMap::new();
        for o in self.ops() {
            let text = match &o.outcome {
                Outcome::Ok => continue,
                Outcome::Fail(e) => format!("{} fail: {e}", o.kind),
                Outcome::Unknown(e) => format!("{} unknown: {e}", o.kind),
            };
            *counts.entry(text).or_default() += 1;
        }
        let mut v: Vec<(String, usize)> = counts.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v.truncate(n);
        v
    }
}

/// Percentile `p` (0–100) of `xs` (sorted here), ms.
pub(crate) fn percentile(xs: &[f64], p: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    round1(v[i.min(v.len() - 1)])
}

fn classify(e: &msgtrail_client::ClientError) -> Outcome {
    use msgtrail_client::ClientError as E;
    match e {
        E::Refused(w) if !e.is_transient() => Outcome::Fail(format!("{}: {}", w.code, w.message)),
        other => Outcome::Unknown(msgtrail_core::ErrorChain(other).to_string()),
    }
}

// ---------------------------------------------------------------------------------------
// The workload
// ---------------------------------------------------------------------------------------

/// What [`run_load`] does.
#[derive(Debug, Clone)]
pub(crate) struct Load {
    /// Messages to upload.
    pub messages: usize,
    /// Producer tasks (sends in flight at once).
    pub concurrency: usize,
    /// Pause of each producer task between two messages.
    pub pace: Duration,
    /// Run the consumer group alongside.
    pub consume: bool,
    /// Give up on a message that is still not acked after this long (from the run's start).
    pub deadline: Duration,
}

impl Load {
    /// `messages` uploads by 8 tasks, 2 ms apart each (so that requests are always in
    /// flight when the fault comes), consumed alongside, 90 s at most.
    pub(crate) fn new(messages: usize) -> Self {
        Load {
            messages,
            concurrency: 8,
            pace: Duration::from_millis(2),
            consume: true,
            deadline: Duration::from_secs(90),
        }
    }
}

/// One acknowledged upload.
#[derive(Debug, Clone)]
pub(crate) struct Acked {
    /// The message ID the broker answered with.
    pub message_id: MessageId,
    /// Whether the broker said it was a duplicate of an earlier upload.
    pub duplicate: bool,
    /// The stream sequence the broker answered with (of the original, for a duplicate).
    pub stream_seq: u64,
}

/// Shared state of a running load, readable while it runs.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// Uploads acknowledged so far.
    pub acked: AtomicUsize,
    /// Deliveries acknowledged so far.
    pub consumed: AtomicUsize,
    /// Set when every producer task is done.
    pub producers_done: AtomicBool,
    /// Set to stop the consumer early.
    pub stop: AtomicBool,
    /// Acked uploads by request ID.
    pub uploads: Mutex<BTreeMap<String, Acked>>,
    /// Request IDs never acked.
    pub given_up: Mutex<Vec<String>>,
    /// Message IDs whose delivery the consumer acked (the broker said ok).
    pub consumed_ids: Mutex<HashSet<MessageId>>,
    /// Deliveries of messages the consumer had already acked (redeliveries after a lost
    /// ack reply, or JetStream redeliveries).
    pub redelivered_after_ack: AtomicUsize,
    /// Deliveries whose ack timed out (unknown) and whose retry with the same token was then
    /// refused `delivery_expired`: the first try may have been applied (RELIABILITY.md,
    /// finding 8). The oracle requires their trajectories to show the group's ack, unless a
    /// redelivery was consumed.
    pub ack_ambiguous: Mutex<HashSet<MessageId>>,
}

impl Progress {
    /// The message IDs of every acked upload so far.
    pub(crate) fn acked_message_ids(&self) -> HashSet<MessageId> {
        self.uploads
            .lock()
            .unwrap()
            .values()
            .map(|a| a.message_id)
            .collect()
    }

    /// Waits until `n` uploads are acked (or `within` passes).
    pub(crate) async fn wait_acked(&self, n: usize, within: Duration) {
        let deadline = Instant::now() + within;
        while self.acked.load(Ordering::SeqCst) < n && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A running load: its progress, and the tasks to await.
pub(crate) struct Running {
    /// Progress, shared with the tasks.
    pub progress: Arc<Progress>,
    /// The history of every call.
    pub history: Arc<History>,
    producers: Vec<tokio::task::JoinHandle<()>>,
    consumer: Option<tokio::task::JoinHandle<()>>,
    /// The producer (kept so that its stage reports are flushed at the end).
    pub producer: Producer,
    /// The consumer.
    pub consumer_client: Option<Consumer>,
}

/// Uploads `msg` with request ID `rid` until acked or `deadline`, each SDK call in the
/// history (the SDK itself retries timeouts with the same request ID).
pub(crate) async fn send_until_acked(
    producer: &Producer,
    history: &History,
    rid: &RequestId,
    payload: String,
    deadline: Instant,
) -> Option<Acked> {
    let mut pause = Duration::from_millis(50);
    loop {
        let start = Instant::now();
        let msg = Outgoing::new(TOPIC, payload.clone()).request_id(rid.clone());
        match producer.send_message(msg).await {
            Ok(reply) => {
                history.push("send", rid.to_string(), start, Outcome::Ok);
                return Some(Acked {
                    message_id: reply.message_id,
                    duplicate: reply.duplicate,
                    stream_seq: reply.stream_seq,
                });
            }
            Err(e) => {
                let outcome = classify(&e);
                let definite = matches!(outcome, Outcome::Fail(_));
                history.push("send", rid.to_string(), start, outcome);
                if definite || Instant::now() > deadline {
                    return None;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
        }
    }
}

/// Starts a load on `sys`: producers (and a consumer) as tasks; returns at once.
pub(crate) async fn run_load(sys: &System, load: Load) -> Running {
    let history = History::new();
    let progress = Arc::new(Progress::default());
    let producer = sys.producer().await;
    history.watch_attempts(&producer);
    let next = Arc::new(AtomicUsize::new(0));
    let deadline = history.t0 + load.deadline;
    let done_tasks = Arc::new(AtomicUsize::new(0));
    let mut producers = Vec::new();
    for _ in 0..load.concurrency {
        let (producer, history, progress, next, done_tasks) = (
            producer.clone(),
            history.clone(),
            progress.clone(),
            next.clone(),
            done_tasks.clone(),
        );
        let (n, pace, tasks) = (load.messages, load.pace, load.concurrency);
        producers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= n {
                    break;
                }
                let rid = RequestId::generate();
                let payload = format!("{{\"order\":{i}}}");
                match send_until_acked(&producer, &history, &rid, payload, deadline).await {
                    Some(a) => {
                        progress.uploads.lock().unwrap().insert(rid.to_string(), a);
                        progress.acked.fetch_add(1, Ordering::SeqCst);
                    }
                    None => progress.given_up.lock().unwrap().push(rid.to_string()),
                }
                if !pace.is_zero() {
                    tokio::time::sleep(pace).await;
                }
            }
            if done_tasks.fetch_add(1, Ordering::SeqCst) + 1 == tasks {
                progress.producers_done.store(true, Ordering::SeqCst);
            }
        }));
    }
    let (consumer, consumer_client) = if load.consume {
        let c = sys.consumer().await;
        let task = tokio::spawn(consume(
            c.clone(),
            history.clone(),
            progress.clone(),
            deadline,
        ));
        (Some(task), Some(c))
    } else {
        (None, None)
    };
    Running {
        progress,
        history,
        producers,
        consumer,
        producer,
        consumer_client,
    }
}

/// The subscription of the workload's consumer group.
pub(crate) fn subscription() -> Subscription {
    Subscription {
        group: msgtrail_core::GroupId::new(GROUP).unwrap(),
        topic: "faults.>".into(),
        filter: Default::default(),
        message_id: None,
    }
}

/// The consumer: fetch, process, ack (an ack that fails is tried again with the same token),
/// until the producers are done and every acked upload was consumed, or `deadline`.
async fn consume(c: Consumer, history: Arc<History>, progress: Arc<Progress>, deadline: Instant) {
    let sub = subscription();
    // When the last ambiguous ack was seen: its message, if the ack was not applied, comes
    // back after the ack wait, so the consumer keeps fetching for two ack waits after it.
    let mut last_ambiguous: Option<Instant> = None;
    let ack_wait = Duration::from_secs(
        ACK_WAIT
            .trim_end_matches('s')
            .parse()
            .expect("the suite's ack wait is whole seconds"),
    );
    loop {
        if progress.stop.load(Ordering::SeqCst) || Instant::now() > deadline {
            return;
        }
        if progress.producers_done.load(Ordering::SeqCst) {
            let acked = progress.acked_message_ids();
            let consumed = progress.consumed_ids.lock().unwrap();
            let ambiguous = progress.ack_ambiguous.lock().unwrap();
            let settled = acked
                .iter()
                .all(|m| consumed.contains(m) || ambiguous.contains(m));
            let waited = last_ambiguous.is_none_or(|t| t.elapsed() > ack_wait * 2);
            if settled && waited {
                return;
            }
        }
        let start = Instant::now();
        let batch = match c.fetch(&sub, 64, Duration::from_millis(300)).await {
            Ok(b) => {
                history.push("fetch", String::new(), start, Outcome::Ok);
                b
            }
            Err(e) => {
                history.push("fetch", String::new(), start, classify(&e));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        for m in batch {
            let mid = m.message_id;
            if progress.consumed_ids.lock().unwrap().contains(&mid) {
                progress
                    .redelivered_after_ack
                    .fetch_add(1, Ordering::SeqCst);
            }
            let start = Instant::now();
            let mut result = c
                .process(m.clone(), |_| async { Ok::<(), String>(()) })
                .await
                .map(|_| ());
            let mut tries = 1;
            let mut unknown_before = false;
            while let Err(e) = &result {
                let outcome = classify(e);
                history.push("ack", mid.to_string(), start, outcome.clone());
                if unknown_before && (e.is_delivery_expired() || e.is_settle_ambiguous()) {
                    progress.ack_ambiguous.lock().unwrap().insert(mid);
                    last_ambiguous = Some(Instant::now());
                }
                unknown_before |= matches!(outcome, Outcome::Unknown(_));
                if tries >= 5 || matches!(outcome, Outcome::Fail(_)) {
                    break;
                }
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
                result = m.ack().await;
            }
            if result.is_ok() {
                history.push("ack", mid.to_string(), start, Outcome::Ok);
                if progress.consumed_ids.lock().unwrap().insert(mid) {
                    progress.consumed.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    }
}

impl Running {
    /// Waits for the producers, then for the consumer (until it consumed every acked
    /// upload, or its deadline), and flushes both clients' stage reports.
    pub(crate) async fn finish(self) -> Finished {
        for p in self.producers {
            p.await.expect("producer task");
        }
        if let Some(c) = self.consumer {
            c.await.expect("consumer task");
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), self.producer.close()).await;
        if let Some(c) = self.consumer_client {
            let _ = tokio::time::timeout(Duration::from_secs(10), c.close()).await;
        }
        Finished {
            progress: self.progress,
            history: self.history,
        }
    }
}

/// A finished load.
pub(crate) struct Finished {
    /// What it did.
    pub progress: Arc<Progress>,
    /// Every call.
    pub history: Arc<History>,
}

// ---------------------------------------------------------------------------------------
// The oracle
// ---------------------------------------------------------------------------------------

/// A message found in `MSGTRAIL_MESSAGES`.
#[derive(Debug, Clone)]
pub(crate) struct StoredMessage {
    /// Its stream sequence.
    pub seq: u64,
    /// Its request ID (`Msgtrail-Stored`, or `Msgtrail-Request-Id` of earlier brokers).
    pub request_id: String,
    /// `Msgtrail-Message-Id`.
    pub message_id: String,
    /// Whether it carries store evidence (the received-at time).
    pub has_received_at: bool,
}

/// Reads every message of `MSGTRAIL_MESSAGES` with a fresh ordered consumer (headers only),
/// independently of the brokers and the listener.
pub(crate) async fn drain_messages(client: &async_nats::Client) -> Vec<StoredMessage> {
    use async_nats::jetstream::consumer::pull::OrderedConfig;
    use msgtrail_core::headers as h;
    let js = async_nats::jetstream::new(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last_err = String::new();
    while Instant::now() < deadline {
        let attempt = async {
            let mut stream = js
                .get_stream(msgtrail_core::subjects::MESSAGE_STREAM)
                .await
                .map_err(|e| e.to_string())?;
            let info = stream.info().await.map_err(|e| e.to_string())?.clone();
            let last = info.state.last_sequence;
            let mut out = Vec::new();
            if info.state.messages == 0 {
                return Ok(out);
            }
            let consumer = stream
                .create_consumer(OrderedConfig {
                    headers_only: true,
                    ..Default::default()
                })
                .await
                .map_err(|e| e.to_string())?;
            let mut msgs = consumer.messages().await.map_err(|e| e.to_string())?;
            loop {
                let m = tokio::time::timeout(Duration::from_secs(10), msgs.next())
                    .await
                    .map_err(|_| "the ordered consumer stalled".to_string())?
                    .ok_or("the ordered consumer ended")?
                    .map_err(|e| e.to_string())?;
                let seq = m.info().map_err(|e| e.to_string())?.stream_sequence;
                let hs = m.headers.clone().unwrap_or_default();
                let get = |k: &str| hs.get(k).map(|v| v.as_str().to_owned()).unwrap_or_default();
                // Either layout (msgtrail_core::stored): Msgtrail-Stored or the separate
                // headers of earlier brokers.
                let fields = msgtrail_core::stored::read(|k| hs.get(k).map(|v| v.as_str()))
                    .map_err(|e| format!("stored message {seq}: {e}"))?;
                out.push(StoredMessage {
                    seq,
                    request_id: fields.request_id.unwrap_or_default().to_owned(),
                    message_id: get(h::MESSAGE_ID),
                    has_received_at: fields.evidence.is_some(),
                });
                if seq >= last {
                    return Ok::<_, String>(out);
                }
            }
        };
        match attempt.await {
            Ok(out) => return out,
            Err(e) => {
                last_err = e;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    panic!("cannot drain MSGTRAIL_MESSAGES: {last_err}");
}

/// What the store says about the acked uploads.
#[derive(Debug, Clone, Default)]
pub(crate) struct StreamVerdict {
    /// Acked uploads with no stored message of their request ID.
    pub lost: Vec<String>,
    /// For each lost upload: what the broker answered and what the stream holds at the
    /// sequence it named — tells a wrong sequence in the answer from a stream that lost
    /// its tail.
    pub lost_detail: Vec<Value>,
    /// Extra stored copies of a request ID (a request stored three times counts 2).
    pub duplicated: usize,
    /// Request IDs stored more than once.
    pub duplicated_ids: Vec<String>,
    /// Acked uploads whose stored message has another message ID than the ack said.
    pub mismatched: Vec<String>,
    /// Stored messages in all.
    pub stored: usize,
    /// Stored messages without store evidence.
    pub without_evidence: usize,
}

/// Compares the acked uploads with the stored messages.
pub(crate) fn judge_stream(
    uploads: &BTreeMap<String, Acked>,
    stored: &[StoredMessage],
) -> StreamVerdict {
    let mut by_rid: HashMap<&str, Vec<&StoredMessage>> = HashMap::new();
    for m in stored {
        by_rid.entry(m.request_id.as_str()).or_default().push(m);
    }
    let mut v = StreamVerdict {
        stored: stored.len(),
        without_evidence: stored.iter().filter(|m| !m.has_received_at).count(),
        ..Default::default()
    };
    for (rid, copies) in &by_rid {
        if copies.len() > 1 {
            v.duplicated += copies.len() - 1;
            v.duplicated_ids.push((*rid).to_owned());
        }
    }
    let by_seq: HashMap<u64, &StoredMessage> = stored.iter().map(|m| (m.seq, m)).collect();
    let last_seq = stored.iter().map(|m| m.seq).max().unwrap_or(0);
    for (rid, a) in uploads {
        match by_rid.get(rid.as_str()) {
            None => {
                v.lost.push(rid.clone());
                let at_seq = by_seq
                    .get(&a.stream_seq)
                    .map(|m| json!({"request_id": m.request_id, "message_id": m.message_id}));
                v.lost_detail.push(json!({
                    "request_id": rid,
                    "message_id": a.message_id.to_string(),
                    "acked_seq": a.stream_seq,
                    "acked_duplicate": a.duplicate,
                    "stream_holds_at_acked_seq": at_seq,
                    "stream_last_seq": last_seq,
                }));
            }
            Some(copies) => {
                if !copies
                    .iter()
                    .any(|m| m.message_id == a.message_id.to_string())
                {
                    v.mismatched.push(rid.clone());
                }
            }
        }
    }
    v.duplicated_ids.sort();
    v
}

/// What is missing from a trajectory, in words (empty: complete). Complete means a store
/// hop built from real P2 and P3 records (not inferred from a later delivery) and, when the
/// workload's consumer acked the message, the group's acknowledged delivery (C4/C8 ack).
pub(crate) fn missing(t: &Trajectory, consumed: bool) -> Vec<String> {
    let mut out = Vec::new();
    match t.hop("store") {
        None => out.push("no store hop".to_owned()),
        Some(h) => {
            let has = |s: Stage| h.events.iter().any(|r| r.stage == s);
            if h.inferred {
                out.push("store hop only inferred".to_owned());
            }
            if !has(Stage::UploadReceived) {
                out.push("no P2".to_owned());
            }
            if !has(Stage::Stored) {
                out.push("no P3".to_owned());
            }
        }
    }
    if consumed {
        let group = t.groups.iter().find(|g| g.group.as_str() == GROUP);
        match group {
            None => out.push(format!("no delivery to group {GROUP}")),
            Some(g) if g.state != MessageState::Consumed || g.acked_at.is_none() => {
                let delivered = t
                    .hops
                    .iter()
                    .any(|h| h.kind == HopKind::Deliver && h.group.as_ref() == Some(&g.group));
                out.push(format!(
                    "group {GROUP} is {} (no ack record C4/C8; deliver hop {})",
                    g.state,
                    if delivered { "present" } else { "missing" }
                ));
            }
            Some(_) => {}
        }
    }
    out
}

/// The trajectories of acked messages, as the listener serves them.
#[derive(Debug, Clone, Default)]
pub(crate) struct TrajectoryVerdict {
    /// Message IDs whose trajectory is still incomplete at the deadline, with what is missing.
    pub incomplete: BTreeMap<String, Vec<String>>,
    /// How long until every trajectory was complete (or the deadline), ms.
    pub complete_after_ms: f64,
    /// The trajectories as last read, by message ID.
    pub trajectories: HashMap<String, Trajectory>,
}

/// Polls `GET /api/messages/<id>` for every acked message until each is complete (consumed
/// ones with their delivery) or `within` passes.
pub(crate) async fn judge_trajectories(
    client: &ListenerClient,
    uploads: &BTreeMap<String, Acked>,
    consumed: &HashSet<MessageId>,
    within: Duration,
) -> TrajectoryVerdict {
    let start = Instant::now();
    let deadline = start + within;
    let mut pending: BTreeMap<String, bool> = uploads
        .values()
        .map(|a| (a.message_id.to_string(), consumed.contains(&a.message_id)))
        .collect();
    let mut v = TrajectoryVerdict::default();
    loop {
        let mut still = BTreeMap::new();
        for (mid, was_consumed) in &pending {
            match client.trajectory(mid, None).await {
                Ok(t) => {
                    let m = missing(&t, *was_consumed);
                    v.trajectories.insert(mid.clone(), t);
                    if !m.is_empty() {
                        still.insert(mid.clone(), m);
                    }
                }
                Err(e) if e.is_not_found() => {
                    still.insert(mid.clone(), vec!["unknown to the listener (404)".into()]);
                }
                Err(e) => {
                    still.insert(mid.clone(), vec![format!("listener: {e}")]);
                }
            }
        }
        v.complete_after_ms = round1(ms_since(start, Instant::now()));
        if still.is_empty() || Instant::now() > deadline {
            v.incomplete = still;
            return v;
        }
        pending.retain(|k, _| still.contains_key(k));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// ---------------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------------

/// One scenario's figures: printed as one JSON line, and asserted on.
#[derive(Debug, Clone)]
pub(crate) struct Report {
    /// The JSON object.
    pub json: serde_json::Map<String, Value>,
}

impl Report {
    /// A report with only the scenario's name, variant, repetition and commit.
    pub(crate) fn bare(scenario: &str, scale: &Scale, rep: usize) -> Report {
        let mut json = serde_json::Map::new();
        json.insert("scenario".into(), json!(scenario));
        json.insert("variant".into(), json!(scale.variant()));
        json.insert("rep".into(), json!(rep));
        json.insert("commit".into(), json!(commit()));
        Report { json }
    }

    /// The common figures of a scenario run.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        scenario: &str,
        scale: &Scale,
        rep: usize,
        finished: &Finished,
        stream: &StreamVerdict,
        traj: &TrajectoryVerdict,
    ) -> Report {
        finished
            .history
            .dump(&format!("{scenario}-{}-{rep}", scale.variant()));
        let p = &finished.progress;
        let uploads = p.uploads.lock().unwrap();
        let consumed = p.consumed_ids.lock().unwrap();
        let unconsumed = uploads
            .values()
            .filter(|a| !consumed.contains(&a.message_id))
            .count();
        let (s_ok, s_fail, s_unknown) = finished.history.counts("send");
        let (a_ok, a_fail, a_unknown) = finished.history.counts("ack");
        let (t_ok, t_fail, t_unknown) = finished.history.counts("attempt");
        let lat = finished.history.send_latencies();
        let mut json = serde_json::Map::new();
        let mut put = |k: &str, v: Value| {
            json.insert(k.to_owned(), v);
        };
        put("scenario", json!(scenario));
        put("variant", json!(scale.variant()));
        put("rep", json!(rep));
        put("commit", json!(commit()));
        put("messages", json!(scale.messages));
        put("acked", json!(uploads.len()));
        put("given_up", json!(p.given_up.lock().unwrap().len()));
        put("lost", json!(stream.lost.len()));
        put("duplicated", json!(stream.duplicated));
        put("mismatched", json!(stream.mismatched.len()));
        put("incomplete", json!(traj.incomplete.len()));
        put("stored", json!(stream.stored));
        put("consumed", json!(consumed.len()));
        put("unconsumed", json!(unconsumed));
        put(
            "redelivered_after_ack",
            json!(p.redelivered_after_ack.load(Ordering::SeqCst)),
        );
        put(
            "send_calls",
            json!({"ok": s_ok, "fail": s_fail, "unknown": s_unknown}),
        );
        put(
            "upload_attempts",
            json!({"ok": t_ok, "fail": t_fail, "unknown": t_unknown}),
        );
        put(
            "ack_calls",
            json!({"ok": a_ok, "fail": a_fail, "unknown": a_unknown}),
        );
        put(
            "send_ms",
            json!({"p50": percentile(&lat, 50.0), "p99": percentile(&lat, 99.0),
                   "max": percentile(&lat, 100.0)}),
        );
        put(
            "trajectories_complete_after_ms",
            json!(traj.complete_after_ms),
        );
        if !traj.incomplete.is_empty() {
            let sample: Vec<Value> = traj
                .incomplete
                .iter()
                .take(5)
                .map(|(k, v)| json!({"message_id": k, "missing": v}))
                .collect();
            put("incomplete_sample", json!(sample));
        }
        if !stream.lost.is_empty() {
            put(
                "lost_sample",
                json!(stream.lost.iter().take(5).collect::<Vec<_>>()),
            );
            put(
                "lost_detail",
                json!(stream.lost_detail.iter().take(5).collect::<Vec<_>>()),
            );
        }
        let errors = finished.history.error_counts(5);
        if !errors.is_empty() {
            let errors: serde_json::Map<String, Value> =
                errors.into_iter().map(|(k, n)| (k, json!(n))).collect();
            put("errors", Value::Object(errors));
        }
        Report { json }
    }

    /// Adds a figure.
    pub(crate) fn set(&mut self, key: &str, value: Value) -> &mut Self {
        self.json.insert(key.to_owned(), value);
        self
    }

    /// A figure as u64 (0 when absent).
    pub(crate) fn n(&self, key: &str) -> u64 {
        self.json.get(key).and_then(Value::as_u64).unwrap_or(0)
    }

    /// Prints the JSON line on stdout (and appends it to `$MSGTRAIL_FAULTS_REPORT` if set).
    pub(crate) fn print(&self) {
        let line = Value::Object(self.json.clone()).to_string();
        println!("{line}");
        if let Some(path) = std::env::var_os("MSGTRAIL_FAULTS_REPORT") {
            use std::io::Write;
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
            {
                let _ = writeln!(f, "{line}");
            }
        }
    }

    /// Asserts lost 0, duplicated 0 and (when `complete`) incomplete 0, with the figures and
    /// the processes' logs in the message.
    pub(crate) fn assert_sound(&self, complete: bool, sys: &System) {
        let line = Value::Object(self.json.clone()).to_string();
        assert_eq!(
            self.n("lost"),
            0,
            "acked uploads lost: {line}\n{}",
            sys.diagnostics()
        );
        assert_eq!(
            self.n("mismatched"),
            0,
            "stored under another message ID than acked: {line}"
        );
        assert_eq!(
            self.n("duplicated"),
            0,
            "uploads stored twice: {line}\n{}",
            sys.diagnostics()
        );
        if complete {
            assert_eq!(
                self.n("incomplete"),
                0,
                "incomplete trajectories: {line}\n{}",
                sys.diagnostics()
            );
        }
    }
}
