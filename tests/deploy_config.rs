//! Checks deploy/ without Docker (a test of the msgtrail-e2e package): every YAML file parses and says what the deployment needs,
//! the Grafana dashboard loads, the NATS config passes `nats-server -t`, and the 3-node
//! JetStream cluster starts **from the same config files** as plain processes on loopback,
//! takes an R3 stream, and enforces the permissions: clients may only send requests to
//! `msgtrail.v1.>`, never publish into the streams or call the JetStream API — and two real
//! brokers, the SDK's producer and consumer (authenticated by the demo nkeys) and the
//! listener's durable consumer all work within those permissions.
//!
//! YAML is parsed with `serde_norway`, the maintained fork of the archived `serde_yaml` (same
//! API, libyaml-based, YAML 1.1 merge keys via `apply_merge`, which compose's `<<: *anchor`
//! needs). Python's yaml module would work on this machine but is not a project dependency.

use futures::StreamExt;
use msgtrail_broker::{BrokerConfig, ClientRegistry};
use msgtrail_client::{Consumer, Identity, NatsOptions, Outgoing, Producer, PushOptions};
use msgtrail_core::record::decode_batch;
use msgtrail_core::wire::Subscription;
use msgtrail_core::{ClientId, Stage};
use msgtrail_test_support::find_nats_server;
use serde_norway::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BROKER_PASSWORD: &str = "test-broker-secret";
const LISTENER_PASSWORD: &str = "test-listener-secret";
const CLIENT_PASSWORD: &str = "test-client-secret";

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn read(rel: &str) -> String {
    let p = deploy_dir().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn yaml(rel: &str) -> Value {
    let mut v: Value =
        serde_norway::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel} is not YAML: {e}"));
    v.apply_merge()
        .unwrap_or_else(|e| panic!("{rel}: merge keys: {e}"));
    v
}

fn strs(v: &Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| {
            s.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn compose_file_describes_the_whole_deployment() {
    let compose = yaml("docker-compose.yml");
    let services = compose["services"]
        .as_mapping()
        .expect("services is a mapping");
    for name in [
        "nats-1",
        "nats-2",
        "nats-3",
        "broker-1",
        "broker-2",
        "listener",
        "otel-collector",
        "jaeger",
        "tempo",
        "prometheus",
        "grafana",
    ] {
        assert!(services.contains_key(name), "service {name} is missing");
    }
    // Three NATS nodes from one config file, each with its own name and store.
    for n in 1..=3 {
        let svc = &compose["services"][format!("nats-{n}").as_str()];
        assert_eq!(
            svc["environment"]["NATS_SERVER_NAME"].as_str(),
            Some(format!("nats-{n}").as_str())
        );
        let cmd = strs(&svc["command"]).join(" ");
        assert!(cmd.contains("/etc/nats/nats.conf"), "{cmd}");
        for r in 1..=3 {
            assert_eq!(
                svc["environment"][format!("NATS_ROUTE_{r}").as_str()].as_str(),
                Some(format!("nats://nats-{r}:6222").as_str())
            );
        }
    }
    // Both brokers are built from the one Dockerfile, run R3 and know every node.
    let env = |svc: &Value, k: &str| svc["environment"][k].as_str().map(str::to_owned);
    // Every node is a seed of every msgtrail process.
    let all_nodes = |svc: &Value| {
        let url = env(svc, "NATS_URL").unwrap_or_default();
        let seeds: Vec<&str> = url.split(',').collect();
        (1..=3).all(|n| seeds.contains(&format!("nats://nats-{n}:4222").as_str()))
    };
    for b in ["broker-1", "broker-2"] {
        let svc = &compose["services"][b];
        let cmd = strs(&svc["command"]);
        assert_eq!(cmd.first().map(String::as_str), Some("broker"));
        assert!(cmd.iter().any(|a| a == "--replicas=3"), "{b}: {cmd:?}");
        assert!(
            cmd.iter().any(|a| a.starts_with("--clients=")),
            "{b}: {cmd:?}"
        );
        assert_eq!(env(svc, "NATS_USER").as_deref(), Some("broker"), "{b}");
        assert!(env(svc, "NATS_PASSWORD").is_some(), "{b}");
        assert!(all_nodes(svc), "{b}");
        assert_eq!(svc["build"]["dockerfile"].as_str(), Some("Dockerfile"));
    }
    let listener = &compose["services"]["listener"];
    let cmd = strs(&listener["command"]);
    assert_eq!(cmd.first().map(String::as_str), Some("listener"));
    assert_eq!(env(listener, "NATS_USER").as_deref(), Some("listener"));
    assert!(all_nodes(listener));
    assert_eq!(
        env(listener, "MSGTRAIL_LISTENER_ADDR").as_deref(),
        Some("0.0.0.0:7380")
    );
    assert!(env(listener, "OTEL_EXPORTER_OTLP_ENDPOINT").is_some());
    // Every file a service mounts from the repository exists.
    for (name, svc) in services {
        for vol in strs(&svc["volumes"]) {
            if let Some(rel) = vol.split(':').next().filter(|s| s.starts_with("./")) {
                let p = deploy_dir().join(rel);
                assert!(p.exists(), "{name:?} mounts {rel}, which is missing");
            }
        }
    }
    let dockerfile = std::fs::read_to_string(deploy_dir().join("../Dockerfile")).unwrap();
    assert!(dockerfile.contains("-p msgtrail-cli"));
    assert!(dockerfile.contains("ENTRYPOINT [\"msgtrail\"]"));
}

#[test]
fn tracing_stack_configs_parse_and_connect() {
    let tempo = yaml("tempo/tempo.yaml");
    assert_eq!(tempo["server"]["http_listen_port"].as_u64(), Some(3200));
    assert_eq!(
        tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].as_str(),
        Some("0.0.0.0:4317"),
        "Tempo must listen for OTLP beyond localhost"
    );
    assert_eq!(tempo["storage"]["trace"]["backend"].as_str(), Some("local"));

    let collector = yaml("otel-collector/config.yaml");
    let exporters = strs(&collector["service"]["pipelines"]["traces"]["exporters"]);
    assert_eq!(exporters, ["otlp/jaeger", "otlp/tempo"]);
    for e in &exporters {
        assert!(
            collector["exporters"][e.as_str()]["endpoint"]
                .as_str()
                .is_some(),
            "{e}"
        );
    }

    let prom = yaml("prometheus/prometheus.yml");
    let jobs = prom["scrape_configs"].as_sequence().unwrap();
    let listener = jobs
        .iter()
        .find(|j| j["job_name"].as_str() == Some("msgtrail-listener"))
        .expect("a scrape job for the listener");
    assert_eq!(listener["metrics_path"].as_str(), Some("/metrics"));
    assert_eq!(
        strs(&listener["static_configs"][0]["targets"]),
        ["listener:7380"]
    );

    let ds = yaml("grafana/provisioning/datasources/datasources.yaml");
    let uids: Vec<&str> = ds["datasources"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|d| d["uid"].as_str())
        .collect();
    for uid in ["prometheus", "tempo", "jaeger"] {
        assert!(uids.contains(&uid), "datasource {uid} missing: {uids:?}");
    }
    let dash_prov = yaml("grafana/provisioning/dashboards/dashboards.yaml");
    assert_eq!(
        dash_prov["providers"][0]["options"]["path"].as_str(),
        Some("/var/lib/grafana/dashboards")
    );

    // The dashboard loads, and every panel queries the provisioned Prometheus.
    let dash: serde_json::Value =
        serde_json::from_str(&read("grafana/dashboards/msgtrail-listener.json"))
            .expect("dashboard is JSON");
    assert_eq!(dash["uid"], "msgtrail-listener");
    let panels = dash["panels"].as_array().unwrap();
    assert!(panels.len() >= 8);
    let mut ids = std::collections::HashSet::new();
    for p in panels {
        assert!(ids.insert(p["id"].as_u64().unwrap()), "duplicate panel id");
        assert_eq!(p["datasource"]["uid"], "prometheus", "{}", p["title"]);
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty());
        for t in targets {
            let expr = t["expr"].as_str().unwrap();
            assert!(expr.contains("msgtrail_"), "{expr}");
        }
    }
}

/// Ports and directories of one loopback node.
struct NodePorts {
    client: u16,
    monitor: u16,
    cluster: u16,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The environment that turns deploy/nats/nats.conf into node `i` (0-based) on loopback.
fn node_env(i: usize, nodes: &[NodePorts], store: &Path) -> Vec<(String, String)> {
    let mut env = vec![
        ("NATS_SERVER_NAME".into(), format!("test-nats-{}", i + 1)),
        ("NATS_HOST".into(), "127.0.0.1".into()),
        ("NATS_CLIENT_PORT".into(), nodes[i].client.to_string()),
        ("NATS_MONITOR_PORT".into(), nodes[i].monitor.to_string()),
        ("NATS_CLUSTER_PORT".into(), nodes[i].cluster.to_string()),
        ("NATS_STORE_DIR".into(), store.display().to_string()),
        ("NATS_SYS_PASSWORD".into(), "test-sys-secret".into()),
        ("MSGTRAIL_BROKER_PASSWORD".into(), BROKER_PASSWORD.into()),
        (
            "MSGTRAIL_LISTENER_PASSWORD".into(),
            LISTENER_PASSWORD.into(),
        ),
        ("MSGTRAIL_CLIENT_PASSWORD".into(), CLIENT_PASSWORD.into()),
    ];
    for (r, n) in nodes.iter().enumerate() {
        env.push((
            format!("NATS_ROUTE_{}", r + 1),
            format!("nats://127.0.0.1:{}", n.cluster),
        ));
    }
    env
}

#[test]
fn nats_config_passes_the_config_test() {
    let bin = find_nats_server().expect("nats-server");
    let dir = tempfile::tempdir().unwrap();
    let nodes: Vec<NodePorts> = (0..3)
        .map(|i| NodePorts {
            client: 4222 + i,
            monitor: 8222 + i,
            cluster: 6222 + i,
        })
        .collect();
    for i in 0..3 {
        let out = Command::new(&bin)
            .arg("-t")
            .arg("-c")
            .arg(deploy_dir().join("nats/nats.conf"))
            .envs(node_env(i, &nodes, &dir.path().join(i.to_string())))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr).to_string()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "node {i}: {text}");
        assert!(text.contains("is valid"), "{text}");
    }
    // A missing password is refused rather than defaulted.
    let out = Command::new(&bin)
        .arg("-t")
        .arg("-c")
        .arg(deploy_dir().join("nats/nats.conf"))
        .envs(
            node_env(0, &nodes, dir.path())
                .into_iter()
                .filter(|(k, _)| k != "MSGTRAIL_BROKER_PASSWORD"),
        )
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// A node of the loopback cluster, killed on drop.
struct Node {
    child: Child,
    log: PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Cluster {
    nodes: Vec<Node>,
    ports: Vec<NodePorts>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Cluster {
        let bin = find_nats_server().expect("nats-server");
        let dir = tempfile::Builder::new()
            .prefix("msgtrail-deploy-")
            .tempdir()
            .unwrap();
        let ports: Vec<NodePorts> = (0..3)
            .map(|_| NodePorts {
                client: free_port(),
                monitor: free_port(),
                cluster: free_port(),
            })
            .collect();
        let mut nodes = Vec::new();
        for i in 0..3 {
            let log = dir.path().join(format!("nats-{i}.log"));
            let f = std::fs::File::create(&log).unwrap();
            let child = Command::new(&bin)
                .arg("-c")
                .arg(deploy_dir().join("nats/nats.conf"))
                .envs(node_env(i, &ports, &dir.path().join(format!("store-{i}"))))
                .stdin(Stdio::null())
                .stdout(f.try_clone().unwrap())
                .stderr(f)
                .spawn()
                .unwrap();
            nodes.push(Node { child, log });
        }
        let mut cluster = Cluster {
            nodes,
            ports,
            _dir: dir,
        };
        cluster.wait_listening();
        cluster
    }

    /// Waits until every node accepts client connections.
    fn wait_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        for i in 0..self.nodes.len() {
            let port = self.ports[i].client;
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                if let Ok(Some(status)) = self.nodes[i].child.try_wait() {
                    panic!("node {i} exited with {status}:\n{}", self.logs());
                }
                assert!(
                    Instant::now() < deadline,
                    "node {i} not up:\n{}",
                    self.logs()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Every node's client URL, as the SDK's `NatsOptions` takes them.
    fn url_strings(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("nats://127.0.0.1:{}", p.client))
            .collect()
    }

    fn urls(&self) -> Vec<async_nats::ServerAddr> {
        self.ports
            .iter()
            .map(|p| format!("nats://127.0.0.1:{}", p.client).parse().unwrap())
            .collect()
    }

    fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| std::fs::read_to_string(&n.log).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n----\n")
    }
}

/// Server errors (permission violations) a connection was told about.
type Errors = Arc<Mutex<Vec<String>>>;

async fn connect(
    opts: async_nats::ConnectOptions,
    urls: &[async_nats::ServerAddr],
) -> (async_nats::Client, Errors) {
    let errors: Errors = Arc::default();
    let sink = errors.clone();
    let opts = opts.event_callback(move |event| {
        let sink = sink.clone();
        async move {
            if let async_nats::Event::ServerError(e) = event {
                sink.lock().unwrap().push(e.to_string());
            }
        }
    });
    let client = opts.connect(urls.to_vec()).await.expect("connect");
    (client, errors)
}

async fn wait_for_error(errors: &Errors, needle: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if errors
            .lock()
            .unwrap()
            .iter()
            .any(|e| e.to_lowercase().contains(&needle.to_lowercase()))
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Connects as the `listener` user and opens its durable consumer on the stage stream, as
/// the listener does.
async fn listener_reader(
    urls: &[async_nats::ServerAddr],
) -> (
    async_nats::Client,
    Errors,
    async_nats::jetstream::consumer::PullConsumer,
) {
    let (listener, errors) = connect(
        async_nats::ConnectOptions::with_user_and_password(
            "listener".into(),
            LISTENER_PASSWORD.into(),
        ),
        urls,
    )
    .await;
    let stages = async_nats::jetstream::new(listener.clone())
        .get_stream("MSGTRAIL_STAGES")
        .await
        .expect("stage stream info");
    let reader = stages
        .get_or_create_consumer(
            "msgtrail-listener",
            async_nats::jetstream::consumer::pull::Config {
                durable_name: Some("msgtrail-listener".into()),
                ..Default::default()
            },
        )
        .await
        .expect("durable consumer");
    (listener, errors, reader)
}

/// Creates an R3 stream, retrying while the cluster elects its JetStream meta leader.
async fn create_r3_stream(
    js: &async_nats::jetstream::Context,
    name: &str,
    subject: &str,
    cluster: &Cluster,
) -> async_nats::jetstream::stream::Stream {
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        let config = async_nats::jetstream::stream::Config {
            name: name.into(),
            subjects: vec![subject.into()],
            num_replicas: 3,
            ..Default::default()
        };
        match js.get_or_create_stream(config).await {
            Ok(s) => return s,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => panic!("no R3 stream {name}: {e}\n{}", cluster.logs()),
        }
    }
}

/// Publishes to `subject` and asserts the server answers with a permissions violation.
async fn assert_publish_refused(client: &async_nats::Client, errors: &Errors, subject: &str) {
    client
        .publish(subject.to_owned(), "forged".into())
        .await
        .unwrap();
    client.flush().await.unwrap();
    let needle = format!("publish to \"{subject}\"");
    assert!(
        wait_for_error(errors, &needle).await,
        "no permissions violation for {subject}: {:?}",
        errors.lock().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_node_cluster_from_the_deploy_config_enforces_permissions() {
    let cluster = Cluster::start();
    let urls = cluster.urls();

    // The broker creates an R3 stream once the cluster has elected a JetStream meta leader.
    let broker_opts = || {
        async_nats::ConnectOptions::with_user_and_password("broker".into(), BROKER_PASSWORD.into())
    };
    let (broker, broker_errors) = connect(broker_opts(), &urls).await;
    let js = async_nats::jetstream::new(broker.clone());
    let mut stream = create_r3_stream(&js, "MSGTRAIL_MESSAGES", "msgtrail.msg.>", &cluster).await;
    let _stages = create_r3_stream(&js, "MSGTRAIL_STAGES", "msgtrail.stages", &cluster).await;
    let info = stream.info().await.unwrap().clone();
    let cl = info.cluster.expect("clustered stream");
    assert_eq!(cl.name.as_deref(), Some("msgtrail"));
    assert!(cl.leader.is_some());
    assert_eq!(cl.replicas.len(), 2, "R3 = leader + 2 replicas: {cl:?}");

    // The broker may write to the streams.
    js.publish("msgtrail.msg.orders", "stored".into())
        .await
        .unwrap()
        .await
        .expect("broker publish is stored");
    js.publish("msgtrail.stages", "{}".into())
        .await
        .unwrap()
        .await
        .expect("broker writes stage records");

    // The broker serves msgtrail.v1.> in its queue group.
    let mut requests = broker
        .queue_subscribe("msgtrail.v1.>", "msgtrail-broker".into())
        .await
        .unwrap();
    broker.flush().await.unwrap();

    // A demo client, authenticated by its nkey (the same one it opens its channel with).
    let seed = read("msgtrail/demo-keys/shop.nk").trim().to_owned();
    let (client, client_errors) = connect(async_nats::ConnectOptions::with_nkey(seed), &urls).await;

    // Allowed: a request to msgtrail.v1.upload reaches the broker, and the reply comes back.
    let responder = tokio::spawn({
        let broker = broker.clone();
        async move {
            let msg = requests.next().await.expect("a request");
            assert_eq!(msg.subject.as_str(), "msgtrail.v1.upload");
            broker
                .publish(msg.reply.expect("reply subject"), "ok".into())
                .await
                .unwrap();
        }
    });
    let reply = tokio::time::timeout(
        Duration::from_secs(5),
        client.request("msgtrail.v1.upload", "payload".into()),
    )
    .await
    .expect("reply in time")
    .expect("upload request allowed");
    assert_eq!(&reply.payload[..], b"ok");
    responder.await.unwrap();

    // Refused: publishing into the message stream directly, the JetStream API, forging
    // stage records.
    assert_publish_refused(&client, &client_errors, "msgtrail.msg.x").await;
    assert_publish_refused(
        &client,
        &client_errors,
        "$JS.API.STREAM.INFO.MSGTRAIL_MESSAGES",
    )
    .await;
    assert_publish_refused(&client, &client_errors, "msgtrail.stages").await;
    // Refused: reading the streams' subjects.
    let _sub = client.subscribe("msgtrail.msg.>").await.unwrap();
    client.flush().await.unwrap();
    assert!(wait_for_error(&client_errors, "subscription to \"msgtrail.msg.>\"").await);
    // Nothing forged was stored: the stream holds the broker's one message.
    assert_eq!(stream.info().await.unwrap().state.messages, 1);

    // The password client has the same rights as the nkey clients.
    let (pw_client, pw_errors) = connect(
        async_nats::ConnectOptions::with_user_and_password("client".into(), CLIENT_PASSWORD.into()),
        &urls,
    )
    .await;
    assert_publish_refused(&pw_client, &pw_errors, "msgtrail.msg.y").await;

    // The listener reads the stage stream through a durable consumer and acks…
    let (listener, listener_errors, consumer) = listener_reader(&urls).await;
    let mut batch = consumer.fetch().max_messages(1).messages().await.unwrap();
    let m = tokio::time::timeout(Duration::from_secs(5), batch.next())
        .await
        .expect("a stage batch in time")
        .unwrap()
        .unwrap();
    assert_eq!(&m.payload[..], b"{}");
    m.ack().await.expect("ack allowed");
    // …but cannot write stage records.
    assert_publish_refused(&listener, &listener_errors, "msgtrail.stages").await;

    assert!(
        broker_errors.lock().unwrap().is_empty(),
        "the broker hit a permission: {:?}",
        broker_errors.lock().unwrap()
    );
}

/// Connects an SDK client with its demo nkey, which authenticates both the NATS connection
/// (a NATS nkey user in accounts.conf) and the msgtrail channel (clients.json).
async fn demo_client(cluster: &Cluster, id: &str) -> (async_nats::Client, Identity) {
    let seed = read(&format!("msgtrail/demo-keys/{id}.nk"))
        .trim()
        .to_owned();
    let nats = NatsOptions {
        urls: cluster.url_strings(),
        nkey_seed: Some(seed.clone()),
        ..Default::default()
    }
    .connect()
    .await
    .expect("nkey client connects");
    let identity = Identity::from_seed(ClientId::new(id).unwrap(), &seed).unwrap();
    (nats, identity)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_brokers_and_nkey_clients_work_within_the_deploy_permissions() {
    let cluster = Cluster::start();
    let clients = ClientRegistry::load(&deploy_dir().join("msgtrail/clients.json")).unwrap();
    let broker_config = || BrokerConfig {
        nats: NatsOptions {
            urls: cluster.url_strings(),
            user: Some("broker".into()),
            password: Some(BROKER_PASSWORD.into()),
            ..Default::default()
        },
        clients: clients.clone(),
        replicas: 3,
        stage_batch_linger: Duration::from_millis(5),
        ack_wait: Duration::from_secs(1),
        max_deliver: 2,
        ..Default::default()
    };
    // The first start may race the cluster's JetStream leader election.
    let deadline = Instant::now() + Duration::from_secs(45);
    let mut brokers = Vec::new();
    while brokers.len() < 2 {
        match msgtrail_broker::start(broker_config()).await {
            Ok(b) => brokers.push(b),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!(
                "broker under the deploy permissions: {e}\n{}",
                cluster.logs()
            ),
        }
    }

    // The streams are R3.
    let (admin, _) = connect(
        async_nats::ConnectOptions::with_user_and_password("broker".into(), BROKER_PASSWORD.into()),
        &cluster.urls(),
    )
    .await;
    let js = async_nats::jetstream::new(admin);
    for name in ["MSGTRAIL_MESSAGES", "MSGTRAIL_STAGES"] {
        let mut s = js.get_stream(name).await.unwrap();
        let cl = s.info().await.unwrap().cluster.clone().expect("clustered");
        assert_eq!(cl.replicas.len(), 2, "{name} is R3: {cl:?}");
    }

    // The demo producer uploads; the demo consumer fetches, processes and acks.
    let (pn, pid) = demo_client(&cluster, "shop").await;
    let producer = Producer::connect(pn, pid).await.expect("producer channel");
    let reply = producer
        .send_message(Outgoing::new("orders.eu", "hello"))
        .await
        .expect("upload within the permissions");
    let (cn, cid) = demo_client(&cluster, "billing-1").await;
    let consumer = Consumer::connect(cn, cid).await.expect("consumer channel");
    let sub = Subscription {
        group: ClientId::new("billing").unwrap(),
        topic: "orders.>".into(),
        filter: Default::default(),
        message_id: None,
    };
    let got = consumer
        .fetch(&sub, 1, Duration::from_secs(5))
        .await
        .expect("fetch within the permissions");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message_id, reply.message_id);
    let outcome = consumer
        .process(got[0].clone(), |_| async { Ok::<(), String>(()) })
        .await
        .expect("ack within the permissions");
    assert!(outcome.is_ok());

    // A message that fails every attempt is dead-lettered (the max-deliveries advisory).
    let poison = producer
        .send_message(Outgoing::new("orders.eu", "poison"))
        .await
        .unwrap();
    let only = |id| Subscription {
        message_id: Some(id),
        ..sub.clone()
    };
    for attempt in 1..=2 {
        let got = consumer
            .fetch(&only(poison.message_id), 1, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(got.len(), 1, "attempt {attempt}");
        let _ = consumer
            .process(got[0].clone(), |_| async {
                Err::<(), _>("insufficient funds")
            })
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut dlq = js.get_stream("MSGTRAIL_DEAD_LETTERS").await.unwrap();
        if dlq.info().await.unwrap().state.messages == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "never dead-lettered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Push delivery to the consumer's inbox (a new group gets both messages).
    let mut push = consumer
        .subscribe(
            &Subscription {
                group: ClientId::new("billing-push").unwrap(),
                ..sub.clone()
            },
            PushOptions::default(),
        )
        .await
        .expect("push subscription within the permissions");
    let mut pushed = Vec::new();
    while pushed.len() < 2 {
        let m = tokio::time::timeout(Duration::from_secs(10), push.next())
            .await
            .expect("pushed messages in time")
            .expect("a pushed message");
        consumer.ack(&m).await.expect("ack of a push");
        pushed.push(m.message_id);
    }
    assert!(pushed.contains(&reply.message_id), "{pushed:?}");

    // The listener user reads the whole trajectory from the stage stream.
    let (_listener, _, reader) = listener_reader(&cluster.urls()).await;
    let want = [
        Stage::UploadReceived,
        Stage::Stored,
        Stage::StoreConfirmed,
        Stage::PullSent,
        Stage::PullAckReceived,
        Stage::ProcessFinished,
        Stage::PushSent,
    ];
    let mut seen = std::collections::HashSet::new();
    let mut dead_lettered = false;
    let deadline = Instant::now() + Duration::from_secs(15);
    while !(dead_lettered && want.iter().all(|s| seen.contains(s))) {
        assert!(
            Instant::now() < deadline,
            "stage records seen: {seen:?}, dead letter: {dead_lettered}"
        );
        let mut batch = reader
            .fetch()
            .max_messages(50)
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .unwrap();
        while let Some(Ok(m)) = batch.next().await {
            for r in decode_batch(&m.payload).unwrap() {
                if r.message_id == Some(reply.message_id) {
                    seen.insert(r.stage);
                }
                if r.message_id == Some(poison.message_id)
                    && r.outcome.as_deref() == Some("dead_letter")
                {
                    dead_lettered = true;
                }
            }
            m.ack().await.expect("ack allowed");
        }
    }
    for b in brokers {
        b.shutdown().await;
    }
    // Nobody needed more than the deploy config grants.
    let logs = cluster.logs();
    let violations: Vec<&str> = logs.lines().filter(|l| l.contains("Violation")).collect();
    assert!(violations.is_empty(), "{violations:#?}");
}
