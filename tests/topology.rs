//! The JetStream topology on a real 3-node cluster: whichever of the listener and the brokers
//! starts first, every msgtrail stream and bucket ends with the brokers' replicas, and
//! processes started at the same moment all come up.

use msgtrail_broker::{BrokerConfig, ClientRegistry, RunningBroker};
use msgtrail_client::NatsOptions;
use msgtrail_listener::{ListenerConfig, ListenerHandle};
use msgtrail_test_support::NatsCluster;
use std::time::{Duration, Instant};

/// Every stream msgtrail creates: the three streams and the buckets' streams.
const STREAMS: [&str; 6] = [
    "MSGTRAIL_MESSAGES",
    "MSGTRAIL_STAGES",
    "MSGTRAIL_DEAD_LETTERS",
    "KV_msgtrail_channels",
    "KV_msgtrail_nonces",
    "KV_msgtrail_broker",
];

fn cluster() -> NatsCluster {
    let cluster = NatsCluster::start(3).expect("a 3-node nats cluster starts");
    cluster
        .meta_leader(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    cluster
}

fn broker_config(cluster: &NatsCluster, adjust: impl FnOnce(&mut BrokerConfig)) -> BrokerConfig {
    let mut config = BrokerConfig {
        nats: NatsOptions {
            urls: cluster.urls(),
            ..Default::default()
        },
        clients: ClientRegistry::new(vec![]).unwrap(),
        replicas: 3,
        ..Default::default()
    };
    adjust(&mut config);
    config
}

async fn start_listener(
    cluster: &NatsCluster,
    dir: &tempfile::TempDir,
    durable: &str,
) -> Result<ListenerHandle, msgtrail_listener::ListenerError> {
    let config = ListenerConfig {
        nats: NatsOptions {
            urls: cluster.urls(),
            ..Default::default()
        },
        data_dir: dir.path().to_path_buf(),
        http_addr: "127.0.0.1:0".parse().unwrap(),
        durable_name: durable.to_owned(),
        ..Default::default()
    };
    msgtrail_listener::start(config).await
}

async fn admin(cluster: &NatsCluster) -> async_nats::jetstream::Context {
    let client = async_nats::ConnectOptions::new()
        .connect(cluster.urls())
        .await
        .expect("admin connects");
    async_nats::jetstream::new(client)
}

/// Waits until `name` has `replicas` replicas placed (its configuration and its peers).
async fn assert_replicas(js: &async_nats::jetstream::Context, name: &str, replicas: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut stream = js.get_stream(name).await.expect("stream exists");
        let info = stream.info().await.expect("stream info").clone();
        let peers = info.cluster.as_ref().map_or(0, |c| c.replicas.len() + 1);
        if info.config.num_replicas == replicas && peers == replicas {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: {} replicas configured, {peers} placed; want {replicas}",
            info.config.num_replicas
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn stop(brokers: Vec<RunningBroker>, listeners: Vec<ListenerHandle>) {
    for b in brokers {
        b.shutdown().await;
    }
    for l in listeners {
        l.shutdown().await.expect("listener stops");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_first_then_brokers_with_three_replicas_leave_every_stream_r3() {
    let cluster = cluster();
    let js = admin(&cluster).await;
    let dir = tempfile::tempdir().unwrap();

    // The listener first: it creates the stage stream with its default, one replica.
    let listener = start_listener(&cluster, &dir, "first")
        .await
        .expect("listener starts");
    assert_replicas(&js, "MSGTRAIL_STAGES", 1).await;

    // Then two brokers with three replicas: the stage stream is raised to theirs.
    let mut brokers = Vec::new();
    for _ in 0..2 {
        brokers.push(
            msgtrail_broker::start(broker_config(&cluster, |_| {}))
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "broker starts: {}\n{}",
                        msgtrail_core::ErrorChain(&e),
                        cluster.logs()
                    )
                }),
        );
    }
    for name in STREAMS {
        assert_replicas(&js, name, 3).await;
    }

    // A listener started later keeps them, as does a restart of the first.
    let dir2 = tempfile::tempdir().unwrap();
    let second = start_listener(&cluster, &dir2, "second")
        .await
        .expect("second listener");
    assert_replicas(&js, "MSGTRAIL_STAGES", 3).await;

    // A broker that would lower them refuses to start, naming the command that would.
    let err = match msgtrail_broker::start(broker_config(&cluster, |c| c.replicas = 1)).await {
        Ok(_) => panic!("a broker with one replica started on R3 streams"),
        Err(e) => msgtrail_core::ErrorChain(&e).to_string(),
    };
    assert!(
        err.contains("nats stream edit MSGTRAIL_MESSAGES --replicas=1 --force"),
        "{err}"
    );
    for name in STREAMS {
        assert_replicas(&js, name, 3).await;
    }
    stop(brokers, vec![listener, second]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_and_a_broker_started_together_both_come_up() {
    let cluster = cluster();
    let js = admin(&cluster).await;
    for round in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let config = broker_config(&cluster, |c| c.dedup_window = Duration::from_secs(5));
        let (listener, broker) = tokio::join!(
            start_listener(&cluster, &dir, "together"),
            msgtrail_broker::start(config),
        );
        let listener = listener.unwrap_or_else(|e| {
            panic!(
                "round {round}: listener: {}\n{}",
                msgtrail_core::ErrorChain(&e),
                cluster.logs()
            )
        });
        let broker = broker.unwrap_or_else(|e| {
            panic!(
                "round {round}: broker: {}\n{}",
                msgtrail_core::ErrorChain(&e),
                cluster.logs()
            )
        });
        assert_replicas(&js, "MSGTRAIL_STAGES", 3).await;
        let mut messages = js.get_stream("MSGTRAIL_MESSAGES").await.unwrap();
        let window = messages.info().await.unwrap().config.duplicate_window;
        assert_eq!(window, Duration::from_secs(5), "round {round}");
        stop(vec![broker], vec![listener]).await;
        // The next round starts from nothing again.
        for name in STREAMS {
            js.delete_stream(name).await.expect("stream deleted");
        }
    }
}
