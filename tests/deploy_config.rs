//! Checks deploy/ without Docker (a test of the msgtrail-e2e package): every YAML file parses and says what the deployment needs,
//! the Grafana dashboard loads, the NATS config passes `nats-server -t`, and the 3-node
//! JetStream cluster starts **from the same config files** as plain processes on loopback,
//! takes an R3 stream, and enforces the permissions: clients may only send requests to
//! `msgtrail.v1.>` and read their own inbox prefix (`_INBOX_CLIENT.<id>`), never publish into
//! the streams, call the JetStream API, read another client's replies or aim the broker's
//! replies at msgtrail's subjects (they live in an account of their own) — and two real
//! brokers, the SDK's producer and consumer (authenticated by the demo nkeys, connected with
//! their inbox prefixes) and the listener's durable consumers all work within those
//! permissions; so does an observe-only listener as the `observer` user, tracing an
//! application of the APP account.
//!
//! YAML is parsed with `serde_norway`, the maintained fork of the archived `serde_yaml` (same
//! API, libyaml-based, YAML 1.1 merge keys via `apply_merge`, which compose's `<<: *anchor`
//! needs). Python's yaml module would work on this machine but is not a project dependency.

use futures::StreamExt;
use msgtrail_broker::{BrokerConfig, ClientRegistry};
use msgtrail_client::{Consumer, Identity, NatsOptions, Outgoing, Producer, PushOptions};
use msgtrail_core::decode_batch;
use msgtrail_core::wire::{ChallengeReply, ChallengeRequest, OpenReply, OpenRequest, Subscription};
use msgtrail_core::{ClientId, Role, Stage};
use msgtrail_test_support::find_nats_server;
use serde_norway::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BROKER_PASSWORD: &str = "test-broker-secret";
const LISTENER_PASSWORD: &str = "test-listener-secret";
const CLIENT_PASSWORD: &str = "test-client-secret";
const APP_PASSWORD: &str = "test-app-secret";
const OBSERVER_PASSWORD: &str = "test-observer-secret";

/// The inbox prefix deploy/nats/accounts.conf gives the client user `user` (the demo nkey
/// users are named after their client IDs, the password user is `client`).
fn inbox_prefix(user: &str) -> String {
    format!("_INBOX_CLIENT.{user}")
}

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

/// deploy/docker-compose.group.yml turns the deployment into a listener group: the brokers
/// write per partition, three members (two copies of each partition) with distinct names,
/// volumes and advertised URLs, every one of them on the listener user.
#[test]
fn the_group_override_describes_a_listener_group() {
    let base = yaml("docker-compose.yml");
    let group = yaml("docker-compose.group.yml");
    let services = group["services"].as_mapping().expect("services");
    for b in ["broker-1", "broker-2"] {
        let cmd = strs(&group["services"][b]["command"]);
        let base_cmd = strs(&base["services"][b]["command"]);
        // The override keeps every base argument and adds --stage-partitions.
        for a in &base_cmd {
            assert!(cmd.contains(a), "{b}: {cmd:?} lacks {a}");
        }
        assert!(
            cmd.iter().any(|a| a == "--stage-partitions"),
            "{b}: {cmd:?}"
        );
    }
    let mut names = std::collections::BTreeSet::new();
    let mut urls = std::collections::BTreeSet::new();
    for l in ["listener", "listener-2", "listener-3"] {
        assert!(services.contains_key(l), "{l} is missing");
        let svc = &group["services"][l];
        let cmd = strs(&svc["command"]);
        assert_eq!(cmd.first().map(String::as_str), Some("listener"), "{l}");
        assert!(cmd.iter().any(|a| a == "--copies=2"), "{l}: {cmd:?}");
        let url = cmd
            .iter()
            .find_map(|a| a.strip_prefix("--advertise-url="))
            .unwrap_or_else(|| panic!("{l}: no --advertise-url in {cmd:?}"));
        assert_eq!(url, format!("http://{l}:7380"), "{l}");
        urls.insert(url.to_owned());
        let env = &svc["environment"];
        assert_eq!(env["NATS_USER"].as_str(), Some("listener"), "{l}");
        assert_eq!(
            env["MSGTRAIL_LISTENER_GROUP"].as_str(),
            Some("msgtrail"),
            "{l}"
        );
        names.insert(
            env["MSGTRAIL_INSTANCE_NAME"]
                .as_str()
                .expect("instance name")
                .to_owned(),
        );
        if l != "listener" {
            let vols = strs(&svc["volumes"]);
            assert!(
                vols.iter().any(|v| v.starts_with(&format!("{l}-data:"))),
                "{l}: {vols:?}"
            );
            assert!(group["volumes"]
                .as_mapping()
                .unwrap()
                .contains_key(format!("{l}-data").as_str()));
            assert_eq!(
                svc["image"], base["services"]["broker-1"]["image"],
                "{l}: the same image"
            );
        }
    }
    assert_eq!(names.len(), 3, "distinct instance names: {names:?}");
    assert_eq!(urls.len(), 3, "distinct advertised URLs: {urls:?}");
    // Each member's store-evidence consumers on the message stream are named in the
    // listener's permissions (a member missing there keeps no store evidence).
    let accounts = read("nats/accounts.conf");
    for n in &names {
        let live = msgtrail_listener::evidence_consumer_name(&format!("msgtrail-{n}"));
        for c in [live.clone(), format!("{live}-replay")] {
            for api in ["CREATE", "INFO", "DELETE", "MSG.NEXT"] {
                let subject = format!("\"$JS.API.CONSUMER.{api}.MSGTRAIL_MESSAGES.{c}\"");
                assert!(accounts.contains(&subject), "accounts.conf lacks {subject}");
            }
            let ack = format!("\"$JS.ACK.MSGTRAIL_MESSAGES.{c}.>\"");
            assert!(accounts.contains(&ack), "accounts.conf lacks {ack}");
        }
    }
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

/// The body of a GET of `path` on a node's monitoring port (plain HTTP/1.0 over loopback).
fn monitor_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).expect("monitor port");
    write!(conn, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    body.to_owned()
}

/// Ports and directories of one loopback node.
struct NodePorts {
    client: u16,
    monitor: u16,
    cluster: u16,
}

/// A port that was free a moment ago and that this test process has not handed out before
/// (several clusters start at once).
fn free_port() -> u16 {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut given = GIVEN.lock().unwrap();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
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
        ("MSGTRAIL_APP_PASSWORD".into(), APP_PASSWORD.into()),
        (
            "MSGTRAIL_OBSERVER_PASSWORD".into(),
            OBSERVER_PASSWORD.into(),
        ),
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
    /// Starts the cluster; when a node exits at once because another process took one of
    /// its ports in the meantime, starts it again on other ports.
    fn start() -> Cluster {
        let mut attempt = 1;
        loop {
            match Cluster::try_start() {
                Ok(cluster) => return cluster,
                Err(logs) if attempt < 3 && logs.contains("address already in use") => {
                    attempt += 1;
                }
                Err(logs) => panic!("the cluster did not start:\n{logs}"),
            }
        }
    }

    fn try_start() -> Result<Cluster, String> {
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
        cluster.wait_listening()?;
        Ok(cluster)
    }

    /// Waits until every node accepts client connections; the nodes' log when one exits.
    fn wait_listening(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            for (i, node) in self.nodes.iter_mut().enumerate() {
                if let Ok(Some(status)) = node.child.try_wait() {
                    return Err(format!("node {i} exited with {status}:\n{}", self.logs()));
                }
            }
            let up = self
                .ports
                .iter()
                .all(|p| std::net::TcpStream::connect(("127.0.0.1", p.client)).is_ok());
            if up {
                return Ok(());
            }
            assert!(Instant::now() < deadline, "nodes not up:\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(20));
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

    /// Asserts that no node logged a permission violation: nobody needed more than the
    /// deploy config grants.
    fn assert_no_violations(&self) {
        let logs = self.logs();
        let violations: Vec<&str> = logs.lines().filter(|l| l.contains("Violation")).collect();
        assert!(violations.is_empty(), "{violations:#?}");
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

/// Connects as the `listener` user and opens a durable consumer on the stage stream, as the
/// listener does (under a name of its own, so that it does not share the real listener's).
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
            "deploy-test-reader",
            async_nats::jetstream::consumer::pull::Config {
                durable_name: Some("deploy-test-reader".into()),
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

/// Subscribes to `subject` and asserts the server answers with a permissions violation.
async fn assert_subscribe_refused(client: &async_nats::Client, errors: &Errors, subject: &str) {
    let _sub = client.subscribe(subject.to_owned()).await.unwrap();
    client.flush().await.unwrap();
    let needle = format!("subscription to \"{subject}\"");
    assert!(
        wait_for_error(errors, &needle).await,
        "no permissions violation for a subscription to {subject}: {:?}",
        errors.lock().unwrap()
    );
}

/// Fetches one message. A new R3 consumer may answer 503 (no responders) until its leader is
/// elected, more so on a loaded machine: such a fetch is tried again, for up to 15 s.
async fn fetch_one(
    consumer: &async_nats::jetstream::consumer::PullConsumer,
) -> async_nats::jetstream::Message {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let error = match consumer
            .fetch()
            .max_messages(1)
            .expires(Duration::from_secs(2))
            .messages()
            .await
        {
            Ok(mut batch) => match batch.next().await {
                Some(Ok(m)) => return m,
                Some(Err(e)) => e.to_string(),
                None => "no message".to_owned(),
            },
            Err(e) => e.to_string(),
        };
        assert!(Instant::now() < deadline, "fetch: {error}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Opens the listener's store-evidence consumer on the message stream as the listener does:
/// durable `msgtrail-listener-stored`, every stored message, headers only.
async fn store_evidence_reader(
    listener: &async_nats::Client,
) -> async_nats::jetstream::consumer::PullConsumer {
    async_nats::jetstream::new(listener.clone())
        .get_stream("MSGTRAIL_MESSAGES")
        .await
        .expect("message stream info")
        .get_or_create_consumer(
            "msgtrail-listener-stored",
            async_nats::jetstream::consumer::pull::Config {
                durable_name: Some("msgtrail-listener-stored".into()),
                filter_subject: "msgtrail.msg.>".into(),
                headers_only: true,
                ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
                ..Default::default()
            },
        )
        .await
        .expect("store-evidence consumer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_node_cluster_from_the_deploy_config_enforces_permissions() {
    let cluster = Cluster::start();
    let urls = cluster.urls();

    // Every node pings its clients every 5 s and drops one after 3 missed pings (finding
    // 12: the 2-minute default kept a cut-off broker's subscription for the whole cut).
    for ports in &cluster.ports {
        let varz = monitor_get(ports.monitor, "/varz");
        let varz: serde_json::Value = serde_json::from_str(&varz).expect("/varz is JSON");
        assert_eq!(varz["ping_interval"], 5_000_000_000u64, "{varz}");
        assert_eq!(varz["ping_max"], 3, "{varz}");
    }

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
    let (client, client_errors) = connect(
        async_nats::ConnectOptions::with_nkey(seed).custom_inbox_prefix(inbox_prefix("shop")),
        &urls,
    )
    .await;

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
        async_nats::ConnectOptions::with_user_and_password("client".into(), CLIENT_PASSWORD.into())
            .custom_inbox_prefix(inbox_prefix("client")),
        &urls,
    )
    .await;
    assert_publish_refused(&pw_client, &pw_errors, "msgtrail.msg.y").await;
    assert_subscribe_refused(
        &pw_client,
        &pw_errors,
        &format!("{}.>", inbox_prefix("shop")),
    )
    .await;

    // The listener reads the stage stream through a durable consumer and acks…
    let (listener, listener_errors, consumer) = listener_reader(&urls).await;
    let m = fetch_one(&consumer).await;
    assert_eq!(&m.payload[..], b"{}");
    m.ack().await.expect("ack allowed");
    // …but cannot write stage records.
    assert_publish_refused(&listener, &listener_errors, "msgtrail.stages").await;

    // The listener reads the headers of the stored messages through its store-evidence
    // consumer, `<durable>-stored`, and acks them…
    let evidence = store_evidence_reader(&listener).await;
    let m = fetch_one(&evidence).await;
    assert_eq!(m.subject.as_str(), "msgtrail.msg.orders");
    assert!(m.payload.is_empty(), "headers only");
    m.ack().await.expect("ack allowed");
    // …but cannot write to the message stream, nor pull from any other consumer of it (the
    // brokers' group consumers), nor create one.
    assert_publish_refused(&listener, &listener_errors, "msgtrail.msg.orders").await;
    let group = js
        .get_stream("MSGTRAIL_MESSAGES")
        .await
        .unwrap()
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            durable_name: Some("billing".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let _ = group;
    assert_publish_refused(
        &listener,
        &listener_errors,
        "$JS.API.CONSUMER.MSG.NEXT.MSGTRAIL_MESSAGES.billing",
    )
    .await;
    assert_publish_refused(
        &listener,
        &listener_errors,
        "$JS.API.CONSUMER.CREATE.MSGTRAIL_MESSAGES.other",
    )
    .await;
    // Nor read the clients' replies.
    assert_subscribe_refused(&listener, &listener_errors, "_INBOX_CLIENT.>").await;

    assert!(
        broker_errors.lock().unwrap().is_empty(),
        "the broker hit a permission: {:?}",
        broker_errors.lock().unwrap()
    );
}

/// Connects an SDK client with its demo nkey, which authenticates both the NATS connection
/// (a NATS nkey user in accounts.conf) and the msgtrail channel (clients.json), and with the
/// inbox prefix accounts.conf gives that user.
async fn demo_client(cluster: &Cluster, id: &str) -> (async_nats::Client, Identity) {
    let seed = read(&format!("msgtrail/demo-keys/{id}.nk"))
        .trim()
        .to_owned();
    let nats = NatsOptions {
        urls: cluster.url_strings(),
        nkey_seed: Some(seed.as_str().into()),
        inbox_prefix: Some(inbox_prefix(id)),
        ..Default::default()
    }
    .connect()
    .await
    .expect("nkey client connects");
    let identity = Identity::from_seed(ClientId::new(id).unwrap(), &seed).unwrap();
    (nats, identity)
}

/// Starts `n` real brokers as the `broker` user with deploy's clients.json, R3.
async fn start_brokers(cluster: &Cluster, n: usize) -> Vec<msgtrail_broker::RunningBroker> {
    start_brokers_with(cluster, n, false).await
}

/// [`start_brokers`], writing stage records per partition (`--stage-partitions`) when
/// `stage_partitions` is set.
async fn start_brokers_with(
    cluster: &Cluster,
    n: usize,
    stage_partitions: bool,
) -> Vec<msgtrail_broker::RunningBroker> {
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
        stage_partitions,
        ..Default::default()
    };
    // The first start may race the cluster's JetStream leader election.
    let deadline = Instant::now() + Duration::from_secs(45);
    let mut brokers = Vec::new();
    while brokers.len() < n {
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
    brokers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_brokers_and_nkey_clients_work_within_the_deploy_permissions() {
    let cluster = Cluster::start();
    let brokers = start_brokers(&cluster, 2).await;

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
        group: msgtrail_core::GroupId::new("billing").unwrap(),
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
                group: msgtrail_core::GroupId::new("billing-push").unwrap(),
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
        m.ack().await.expect("ack of a push");
        pushed.push(m.message_id);
    }
    assert!(pushed.contains(&reply.message_id), "{pushed:?}");

    // The real listener, as the listener user: the stage stream and store evidence (its
    // headers-only consumer msgtrail-listener-stored on the message stream, from the start).
    let (listener_nats, _) = connect(
        async_nats::ConnectOptions::with_user_and_password(
            "listener".into(),
            LISTENER_PASSWORD.into(),
        ),
        &cluster.urls(),
    )
    .await;
    let listener_dir = tempfile::tempdir().unwrap();
    let listener = msgtrail_listener::start_with_client(
        msgtrail_listener::ListenerConfig {
            nats: msgtrail_client::NatsOptions {
                urls: cluster.url_strings(),
                ..Default::default()
            },
            data_dir: listener_dir.path().to_path_buf(),
            http_addr: "127.0.0.1:0".parse().unwrap(),
            ..Default::default()
        },
        listener_nats,
    )
    .await
    .expect("listener under the deploy permissions");

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
    // A listener that keeps store evidence (its default) read every stored message's headers
    // through its consumer msgtrail-listener-stored and acked them. (One that does not creates
    // no such consumer; were it refused by a permission, the log check below would say so.)
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut messages = js.get_stream("MSGTRAIL_MESSAGES").await.unwrap();
        let last = messages.info().await.unwrap().state.last_sequence;
        let acked = match messages
            .get_consumer::<async_nats::jetstream::consumer::pull::Config>(
                "msgtrail-listener-stored",
            )
            .await
        {
            Ok(mut c) => Some(c.info().await.unwrap().ack_floor.stream_sequence),
            Err(_) => None,
        };
        if acked == Some(last) {
            break;
        }
        if Instant::now() >= deadline {
            assert!(
                acked.is_none(),
                "store evidence acked up to {acked:?} of {last}"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    listener.shutdown().await.expect("listener shutdown");
    for b in brokers {
        b.shutdown().await;
    }
    // Nobody needed more than the deploy config grants.
    cluster.assert_no_violations();
}

/// Issue 14, bug 6 (channel theft): a client must not read another client's replies — the
/// channel ID of its `channel.open` reply, the ack tokens of its fetch replies, its pushed
/// messages — or it can act as that client. deploy/nats/accounts.conf gives each client user
/// its own inbox prefix; here client A (`shop`) tries every way to B's (`billing-1`) inbox
/// while B opens a channel, fetches, is pushed and acks, and must see nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_read_another_clients_replies() {
    let cluster = Cluster::start();
    let brokers = start_brokers(&cluster, 1).await;
    let urls = cluster.urls();
    let a_seed = read("msgtrail/demo-keys/shop.nk").trim().to_owned();
    let b_prefix = inbox_prefix("billing-1");

    // A, on its own prefix, may subscribe to no inbox but its own: not the shared _INBOX.>,
    // not the clients' root, not B's prefix. Whatever these subscriptions would get is kept.
    let (thief, thief_errors) = connect(
        async_nats::ConnectOptions::with_nkey(a_seed.clone())
            .custom_inbox_prefix(inbox_prefix("shop")),
        &urls,
    )
    .await;
    let mut taps = Vec::new();
    for pattern in [
        "_INBOX.>".to_owned(),
        "_INBOX_CLIENT.>".to_owned(),
        "_INBOX_CLIENT.*.>".to_owned(),
        format!("{b_prefix}.>"),
        ">".to_owned(),
    ] {
        taps.push(thief.subscribe(pattern.clone()).await.unwrap());
        thief.flush().await.unwrap();
        let needle = format!("subscription to \"{pattern}\"");
        assert!(
            wait_for_error(&thief_errors, &needle).await,
            "client A may subscribe to {pattern}: {:?}",
            thief_errors.lock().unwrap()
        );
    }
    let stolen: Arc<Mutex<Vec<async_nats::Message>>> = Arc::default();
    let tap = tokio::spawn({
        let stolen = stolen.clone();
        let mut all = futures::stream::select_all(taps);
        async move {
            while let Some(m) = all.next().await {
                stolen.lock().unwrap().push(m);
            }
        }
    });

    // A connecting with B's prefix gets no reply at all: its inbox subscription is refused.
    let (posing, posing_errors) = connect(
        async_nats::ConnectOptions::with_nkey(a_seed.clone()).custom_inbox_prefix(&b_prefix),
        &urls,
    )
    .await;
    let challenge = serde_json::to_vec(&ChallengeRequest {
        client_id: ClientId::new("billing-1").unwrap(),
    })
    .unwrap();
    let res = posing
        .send_request(
            msgtrail_core::subjects::CHANNEL_CHALLENGE.to_owned(),
            async_nats::Request::new()
                .payload(challenge.into())
                .timeout(Some(Duration::from_secs(2))),
        )
        .await;
    assert!(res.is_err(), "a reply reached A on B's prefix: {res:?}");
    assert!(
        wait_for_error(&posing_errors, &format!("subscription to \"{b_prefix}.")).await,
        "{:?}",
        posing_errors.lock().unwrap()
    );

    // B, on its prefix, opens a channel by the protocol (docs/PROTOCOL.md) to learn its ID.
    let (b_nats, b_identity) = demo_client(&cluster, "billing-1").await;
    let challenge: ChallengeReply = request_json(
        &b_nats,
        msgtrail_core::subjects::CHANNEL_CHALLENGE,
        &ChallengeRequest {
            client_id: b_identity.client_id.clone(),
        },
    )
    .await;
    let opened: OpenReply = request_json(
        &b_nats,
        msgtrail_core::subjects::CHANNEL_OPEN,
        &OpenRequest {
            role: Role::Consumer,
            client_id: b_identity.client_id.clone(),
            signature: b_identity.sign(&challenge.nonce),
            nonce: challenge.nonce,
            service_name: None,
        },
    )
    .await;
    let b_channel = opened.channel;
    assert!(!b_channel.is_empty());

    // The normal path, every client on its own prefix: A uploads, B fetches and acks, B is
    // pushed and acks.
    let (a_nats, a_identity) = demo_client(&cluster, "shop").await;
    let producer = Producer::connect(a_nats, a_identity)
        .await
        .expect("producer channel on its prefix");
    let first = producer
        .send_message(Outgoing::new("orders.eu", "for billing only"))
        .await
        .expect("upload on its prefix");
    let consumer = Consumer::connect(b_nats, b_identity)
        .await
        .expect("consumer channel on its prefix");
    let sub = Subscription {
        group: msgtrail_core::GroupId::new("billing").unwrap(),
        topic: "orders.>".into(),
        filter: Default::default(),
        message_id: None,
    };
    let got = consumer
        .fetch(&sub, 1, Duration::from_secs(5))
        .await
        .expect("fetch on its prefix");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message_id, first.message_id);
    got[0].ack().await.expect("ack on its prefix");
    let mut push = consumer
        .subscribe(
            &Subscription {
                group: msgtrail_core::GroupId::new("billing-push").unwrap(),
                ..sub.clone()
            },
            PushOptions::default(),
        )
        .await
        .expect("push subscription on its prefix");
    let second = producer
        .send_message(Outgoing::new("orders.eu", "also for billing only"))
        .await
        .unwrap();
    let mut pushed = Vec::new();
    while pushed.len() < 2 {
        let m = tokio::time::timeout(Duration::from_secs(10), push.next())
            .await
            .expect("pushed messages in time")
            .expect("a pushed message");
        m.ack().await.expect("ack of a push");
        pushed.push(m.message_id);
    }
    assert!(pushed.contains(&first.message_id) && pushed.contains(&second.message_id));

    // A saw nothing of it: no reply, no push, and never B's channel ID.
    tokio::time::sleep(Duration::from_millis(500)).await;
    tap.abort();
    let stolen = std::mem::take(&mut *stolen.lock().unwrap());
    let leaked: Vec<&async_nats::Message> = stolen
        .iter()
        .filter(|m| {
            let text = String::from_utf8_lossy(&m.payload);
            text.contains(&b_channel) || text.contains("for billing only")
        })
        .collect();
    assert!(
        leaked.is_empty(),
        "B's channel ID or messages reached A: {leaked:#?}"
    );
    assert!(stolen.is_empty(), "A received: {stolen:#?}");

    for b in brokers {
        b.shutdown().await;
    }
    // The only permission violations are A's attempts: neither the broker (replies and
    // pushes to the clients' prefixes) nor B hit one.
    let logs = cluster.logs();
    let a_user = Identity::from_seed(ClientId::new("shop").unwrap(), &a_seed)
        .unwrap()
        .public_key();
    let others: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("Violation") && !l.contains(&a_user))
        .collect();
    assert!(others.is_empty(), "{others:#?}");
}

/// Sends a JSON request and decodes its JSON reply.
async fn request_json<Q: serde::Serialize, T: serde::de::DeserializeOwned>(
    client: &async_nats::Client,
    subject: &str,
    body: &Q,
) -> T {
    let reply = tokio::time::timeout(
        Duration::from_secs(5),
        client.request(subject.to_owned(), serde_json::to_vec(body).unwrap().into()),
    )
    .await
    .unwrap_or_else(|_| panic!("no reply on {subject} in time"))
    .unwrap_or_else(|e| panic!("{subject}: {e}"));
    serde_json::from_slice(&reply.payload).unwrap_or_else(|e| {
        panic!(
            "{subject}: {e}: {}",
            String::from_utf8_lossy(&reply.payload)
        )
    })
}

/// A client cannot make the broker write for it by naming a stream, KV or internal subject as
/// the reply subject of a request: the broker publishes its reply there with its own rights
/// (which include the streams, the KV buckets and msgtrail.internal.>). With the clients in
/// their own account, a reply goes back through the service import into the CLIENTS account,
/// where those subjects are nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_aim_the_brokers_replies_at_the_streams() {
    let cluster = Cluster::start();
    let brokers = start_brokers(&cluster, 1).await;
    let urls = cluster.urls();
    let (admin, _) = connect(
        async_nats::ConnectOptions::with_user_and_password("broker".into(), BROKER_PASSWORD.into()),
        &urls,
    )
    .await;
    let js = async_nats::jetstream::new(admin.clone());
    let key = js.get_key_value("msgtrail_broker").await.unwrap();
    let signing_key = key
        .get("token-key")
        .await
        .unwrap()
        .expect("the brokers' key");
    let last_seq = |name: &'static str| {
        let js = js.clone();
        async move {
            js.get_stream(name)
                .await
                .unwrap()
                .info()
                .await
                .unwrap()
                .state
                .last_sequence
        }
    };
    let (stored, stages) = (
        last_seq("MSGTRAIL_MESSAGES").await,
        last_seq("MSGTRAIL_STAGES").await,
    );
    let mut internal = admin.subscribe("msgtrail.internal.>").await.unwrap();
    admin.flush().await.unwrap();

    let seed = read("msgtrail/demo-keys/shop.nk").trim().to_owned();
    let (client, _) = connect(
        async_nats::ConnectOptions::with_nkey(seed).custom_inbox_prefix(inbox_prefix("shop")),
        &urls,
    )
    .await;
    let challenge = serde_json::to_vec(&ChallengeRequest {
        client_id: ClientId::new("shop").unwrap(),
    })
    .unwrap();
    for (subject, body) in [
        // an error reply has an empty payload: the brokers' signing key would become empty
        (
            "$KV.msgtrail_broker.token-key",
            "not json".as_bytes().to_vec(),
        ),
        ("msgtrail.msg.orders.eu", challenge.clone()),
        ("msgtrail.stages", challenge.clone()),
        ("msgtrail.internal.settled.x", challenge.clone()),
    ] {
        client
            .publish_with_reply(
                msgtrail_core::subjects::CHANNEL_CHALLENGE,
                subject,
                body.into(),
            )
            .await
            .unwrap();
    }
    client.flush().await.unwrap();
    // The broker answered (the requests reached it) …
    let (probe, _) = demo_client(&cluster, "shop").await;
    let _: ChallengeReply = request_json(
        &probe,
        msgtrail_core::subjects::CHANNEL_CHALLENGE,
        &ChallengeRequest {
            client_id: ClientId::new("shop").unwrap(),
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // … and nothing it answered landed anywhere of msgtrail's.
    assert_eq!(
        key.get("token-key").await.unwrap().as_ref(),
        Some(&signing_key),
        "the brokers' signing key was overwritten"
    );
    // No challenge reply ({"nonce":…}) in the streams (the broker may write its own records).
    for (name, after) in [("MSGTRAIL_MESSAGES", stored), ("MSGTRAIL_STAGES", stages)] {
        let stream = js.get_stream(name).await.unwrap();
        for seq in after + 1..=last_seq(name).await {
            if let Ok(m) = stream.get_raw_message(seq).await {
                let text = String::from_utf8_lossy(&m.payload);
                assert!(!text.contains("nonce"), "{name} #{seq}: {text}");
            }
        }
    }
    let leaked = tokio::time::timeout(Duration::from_millis(200), internal.next()).await;
    assert!(leaked.is_err(), "{leaked:?}");
    for b in brokers {
        b.shutdown().await;
    }
}

/// The latency panels ask Prometheus for exemplars, Prometheus keeps them, and the Prometheus
/// datasource turns an exemplar's `trace_id` (the message ID in hex) into a Tempo link.
#[test]
fn latency_exemplars_link_to_tempo() {
    let compose = yaml("docker-compose.yml");
    let flags = strs(&compose["services"]["prometheus"]["command"]);
    assert!(
        flags
            .iter()
            .any(|f| f == "--enable-feature=exemplar-storage"),
        "{flags:?}"
    );

    let ds = yaml("grafana/provisioning/datasources/datasources.yaml");
    let prom = ds["datasources"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|d| d["uid"].as_str() == Some("prometheus"))
        .expect("the Prometheus datasource");
    let dest = &prom["jsonData"]["exemplarTraceIdDestinations"][0];
    assert_eq!(dest["name"].as_str(), Some("trace_id"));
    assert_eq!(dest["datasourceUid"].as_str(), Some("tempo"));

    let dash: serde_json::Value =
        serde_json::from_str(&read("grafana/dashboards/msgtrail-listener.json")).unwrap();
    let latency_targets: Vec<&serde_json::Value> = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap())
        .filter(|t| {
            t["expr"]
                .as_str()
                .unwrap()
                .contains("msgtrail_hop_latency_seconds")
        })
        .collect();
    assert!(latency_targets.len() >= 4, "{latency_targets:?}");
    for t in latency_targets {
        let expr = t["expr"].as_str().unwrap();
        // A histogram now: its buckets, never the summary's quantile label.
        assert!(
            expr.contains("msgtrail_hop_latency_seconds_bucket"),
            "{expr}"
        );
        assert!(!expr.contains("quantile=\""), "{expr}");
        assert_eq!(t["exemplar"], true, "{expr}");
    }
    assert!(dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["type"] == "heatmap"));
}

/// A listener group (`--group`, one copy of each partition) beside brokers writing their stage
/// records per partition (`--stage-partitions`), all within the deploy permissions: the
/// brokers publish to `msgtrail.stages.<p>`, each member keeps its heartbeat in the KV bucket
/// `msgtrail_listeners` and reads its partitions through durables of its own, and either
/// member answers every message — the ones the other holds through the HTTP fan-out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_group_and_partitioned_brokers_work_within_the_deploy_permissions() {
    let cluster = Cluster::start();
    let brokers = start_brokers_with(&cluster, 2, true).await;

    let mut members = Vec::new();
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    // The group and member names of deploy/docker-compose.group.yml: accounts.conf names
    // their store-evidence consumers.
    let instances = ["listener-1", "listener-2"];
    for (dir, instance) in dirs.iter().zip(instances) {
        let (nats, _) = connect(
            async_nats::ConnectOptions::with_user_and_password(
                "listener".into(),
                LISTENER_PASSWORD.into(),
            ),
            &cluster.urls(),
        )
        .await;
        let config = msgtrail_listener::ListenerConfig {
            nats: msgtrail_client::NatsOptions {
                urls: cluster.url_strings(),
                ..Default::default()
            },
            data_dir: dir.path().to_path_buf(),
            http_addr: "127.0.0.1:0".parse().unwrap(),
            group: Some(msgtrail_listener::cluster::GroupConfig {
                name: "msgtrail".into(),
                instance: instance.into(),
                copies: 1,
                advertise_url: None,
            }),
            ..Default::default()
        };
        let member = msgtrail_listener::start_with_client(config, nats)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "group member {instance} under the deploy permissions: {e}\n{}",
                    cluster.logs()
                )
            });
        members.push(member);
    }

    // Messages spread over the partitions, each produced and consumed.
    let (pn, pid) = demo_client(&cluster, "shop").await;
    let producer = Producer::connect(pn, pid).await.expect("producer channel");
    let (cn, cid) = demo_client(&cluster, "billing-1").await;
    let consumer = Consumer::connect(cn, cid).await.expect("consumer channel");
    let sub = Subscription {
        group: msgtrail_core::GroupId::new("billing").unwrap(),
        topic: "orders.>".into(),
        filter: Default::default(),
        message_id: None,
    };
    let mut ids = Vec::new();
    for i in 0..12 {
        let reply = producer
            .send_message(Outgoing::new("orders.eu", format!("order {i}")))
            .await
            .expect("upload");
        ids.push(reply.message_id);
    }
    let partitions: std::collections::BTreeSet<_> = ids
        .iter()
        .map(msgtrail_core::partition::Partition::of_message)
        .collect();
    assert!(
        partitions.len() > 1,
        "the messages span partitions: {partitions:?}"
    );
    let mut processed = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while processed < ids.len() {
        assert!(
            Instant::now() < deadline,
            "processed {processed} of {}",
            ids.len()
        );
        for m in consumer
            .fetch(&sub, 12, Duration::from_secs(2))
            .await
            .expect("fetch")
        {
            let outcome = consumer
                .process(m, |_| async { Ok::<(), String>(()) })
                .await
                .expect("ack");
            assert!(outcome.is_ok(), "{outcome:?}");
            processed += 1;
        }
    }

    // Either member answers every message, consumed.
    for member in &members {
        let client =
            msgtrail_listener::ListenerClient::new(&format!("http://{}", member.http_addr()), None)
                .unwrap();
        for id in &ids {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let t = client.trajectory(&id.to_string(), None).await;
                if matches!(&t, Ok(t) if t.state == msgtrail_core::trajectory::MessageState::Consumed)
                {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "member at {} on {id}: {t:?}\n{}",
                    member.http_addr(),
                    cluster.logs()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    // Store evidence in a group: each member read every stored message's headers through a
    // consumer of its own, msgtrail-<instance>-stored, and acked them all (refused by a
    // permission, it would have created none or acked nothing, and the log would say so).
    let (watcher, _) = connect(
        async_nats::ConnectOptions::with_user_and_password(
            "listener".into(),
            LISTENER_PASSWORD.into(),
        ),
        &cluster.urls(),
    )
    .await;
    let wjs = async_nats::jetstream::new(watcher);
    for instance in instances {
        let name = msgtrail_listener::evidence_consumer_name(&format!("msgtrail-{instance}"));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut messages = wjs.get_stream("MSGTRAIL_MESSAGES").await.unwrap();
            let last = messages.info().await.unwrap().state.last_sequence;
            let acked = match messages
                .get_consumer::<async_nats::jetstream::consumer::pull::Config>(&name)
                .await
            {
                Ok(mut c) => Some(c.info().await.unwrap().ack_floor.stream_sequence),
                Err(_) => None,
            };
            if last >= ids.len() as u64 && acked == Some(last) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{instance}'s store-evidence consumer {name} acked up to {acked:?} of {last}\n{}",
                cluster.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // A takeover within the permissions: listener-2 leaves, listener-1 takes its partitions
    // over and replays their store evidence through msgtrail-listener-1-stored-replay; the
    // file of the partitions it covers lists all 16 once that replay reached its end.
    members
        .pop()
        .unwrap()
        .shutdown()
        .await
        .expect("listener shutdown");
    let covered_file = dirs[0]
        .path()
        .join(msgtrail_listener::cluster::EVIDENCE_COVERAGE_FILE);
    let all: Vec<String> = (0..16).map(|i| i.to_string()).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let covered = std::fs::read_to_string(&covered_file).unwrap_or_default();
        if covered.trim() == all.join(",") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "listener-1 covers {covered:?} after the takeover\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for member in members {
        member.shutdown().await.expect("listener shutdown");
    }
    for b in brokers {
        b.shutdown().await;
    }
    cluster.assert_no_violations();
}

/// Observe mode within the deploy permissions: on the cluster started from the deploy
/// config, an application in the APP account (user `app`, plain async-nats, an R3 stream and
/// two durable pull consumers) is traced by a listener connected as `observer` with
/// `--observe-only`: every message's trajectory has its store hop and each consumer's
/// attempts and outcomes (ack, nak then ack, term), and no node logs a permission violation —
/// the observer's minimum rights are enough.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_traces_an_application_within_the_deploy_permissions() {
    use async_nats::jetstream::{consumer, AckKind};
    use msgtrail_core::observed::observed_message_id;
    use msgtrail_core::trajectory::{HopKind, Trajectory};

    let cluster = Cluster::start();
    let (app, _) = connect(
        async_nats::ConnectOptions::with_user_and_password("app".into(), APP_PASSWORD.into()),
        &cluster.urls(),
    )
    .await;
    let js = async_nats::jetstream::new(app.clone());
    let orders = create_r3_stream(&js, "ORDERS", "orders.>", &cluster).await;
    let pull = |name: &str| consumer::pull::Config {
        durable_name: Some(name.into()),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: Duration::from_secs(5),
        sample_frequency: 100,
        ..Default::default()
    };
    let billing: consumer::PullConsumer = orders.create_consumer(pull("billing")).await.unwrap();
    let audit: consumer::PullConsumer = orders.create_consumer(pull("audit")).await.unwrap();

    let (observer, _) = connect(
        async_nats::ConnectOptions::with_user_and_password(
            "observer".into(),
            OBSERVER_PASSWORD.into(),
        ),
        &cluster.urls(),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut observe = msgtrail_listener::ObserveConfig::streams(["ORDERS"]);
    observe.discovery_interval = Duration::from_millis(300);
    observe.only = true;
    let listener = msgtrail_listener::start_with_client(
        msgtrail_listener::ListenerConfig {
            nats: msgtrail_client::NatsOptions {
                urls: cluster.url_strings(),
                ..Default::default()
            },
            data_dir: dir.path().to_path_buf(),
            http_addr: "127.0.0.1:0".parse().unwrap(),
            observe: Some(observe),
            ..Default::default()
        },
        observer,
    )
    .await
    .expect("an observe-only listener under the observer's permissions");

    let mut hs = async_nats::HeaderMap::new();
    hs.insert("Nats-Msg-Id", "ord-1");
    js.publish_with_headers("orders.eu", hs, "ok".into())
        .await
        .unwrap()
        .await
        .unwrap();
    for body in ["nak-once", "term"] {
        js.publish("orders.eu", body.into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let mut a = audit.messages().await.unwrap();
    for _ in 0..3 {
        a.next().await.unwrap().unwrap().ack().await.unwrap();
    }
    let mut b = billing.messages().await.unwrap();
    let mut settled = 0;
    while settled < 3 {
        let m = tokio::time::timeout(Duration::from_secs(10), b.next())
            .await
            .expect("billing gets its messages")
            .unwrap()
            .unwrap();
        let n = m.info().unwrap().delivered;
        match (&*m.payload, n) {
            (b"nak-once", 1) => m.ack_with(AckKind::Nak(None)).await.unwrap(),
            (b"term", _) => {
                m.ack_with(AckKind::Term).await.unwrap();
                settled += 1;
            }
            _ => {
                m.ack().await.unwrap();
                settled += 1;
            }
        }
    }

    // (consumer, attempt, outcome) of every settled attempt.
    let outcomes = |t: &Trajectory| {
        let mut v: Vec<(String, u32, String)> = t
            .hops
            .iter()
            .filter(|h| h.kind == HopKind::Deliver)
            .flat_map(|h| {
                h.events.iter().filter_map(|r| {
                    Some((
                        h.consumer.as_ref()?.as_str().to_owned(),
                        h.attempt?,
                        r.outcome.clone()?,
                    ))
                })
            })
            .collect();
        v.sort();
        v
    };
    let own = |c: &str, n: u32, o: &str| (c.to_owned(), n, o.to_owned());
    let want = [
        vec![own("audit", 1, "ack"), own("billing", 1, "ack")],
        vec![
            own("audit", 1, "ack"),
            own("billing", 1, "nack"),
            own("billing", 2, "ack"),
        ],
        vec![own("audit", 1, "ack"), own("billing", 1, "term")],
    ];
    let store = listener.store().clone();
    for (i, want) in want.iter().enumerate() {
        let seq = i as u64 + 1;
        let key = observed_message_id("ORDERS", seq).to_string();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let now = msgtrail_core::time::now_nanos();
            let t = store.trajectory(&key, now).unwrap();
            let got = t
                .as_ref()
                .map(|t| (t.hops.iter().any(|h| h.kind == HopKind::Store), outcomes(t)));
            if got.as_ref() == Some(&(true, want.clone())) {
                let o = t.unwrap().observed.unwrap();
                assert_eq!((o.stream.as_str(), o.stream_seq), ("ORDERS", seq));
                assert_eq!(o.nats_msg_id.is_some(), seq == 1);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "message {seq}: want {want:?} with a store hop, got {got:?}\n{}",
                cluster.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Only msgtrail's own consumer was added to the app's stream.
    let mut names: Vec<String> = orders
        .consumer_names()
        .map(|n| n.unwrap())
        .collect::<Vec<_>>()
        .await;
    names.sort();
    assert_eq!(names, ["audit", "billing", "msgtrail-listener-observe"]);
    listener.shutdown().await.unwrap();
    cluster.assert_no_violations();
}
