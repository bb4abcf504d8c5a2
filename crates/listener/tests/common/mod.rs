//! Helpers the listener's integration tests share: time, a replayable shuffle, a JetStream
//! context, waiting for a condition, an API client.
#![allow(dead_code)]

pub(crate) mod scenario;

use msgtrail_listener::ListenerClient;
use msgtrail_listener::ListenerHandle;
use msgtrail_test_support::NatsServer;
use std::future::Future;
use std::time::Duration;

/// Now, Unix nanoseconds.
pub(crate) fn now() -> u64 {
    msgtrail_core::time::now_nanos()
}

/// Deterministic xorshift, so a failing shuffle can be replayed.
pub(crate) struct TestRng(pub u64);

impl TestRng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub(crate) fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
}

/// A JetStream context on `server`.
pub(crate) async fn nats(server: &NatsServer) -> async_nats::jetstream::Context {
    let client = async_nats::connect(server.url()).await.unwrap();
    async_nats::jetstream::new(client)
}

/// Polls `f` every 25 ms until it gives a value; fails the test after 20 s naming `what`.
pub(crate) async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A client of the listener's HTTP API.
pub(crate) fn client(h: &ListenerHandle) -> ListenerClient {
    ListenerClient::new(&format!("http://{}", h.http_addr()), None).unwrap()
}

/// Environment of a child listener process: the NATS URL, its store directory, the file it
/// announces its API address in.
const CHILD_ENV: [&str; 3] = [
    "MSGTRAIL_TEST_CHILD_NATS",
    "MSGTRAIL_TEST_CHILD_DIR",
    "MSGTRAIL_TEST_CHILD_ADDR_FILE",
];

/// Runs the ignored test `test` of this test binary as a child process — a listener the
/// test can kill with SIGKILL — on the nats-server at `nats_url` with its store in `dir`.
/// The child reads its settings with [`child_settings`] and announces its API with
/// [`announce_address`]; [`child_client`] waits for it.
pub(crate) fn spawn_test_child(
    test: &str,
    nats_url: &str,
    dir: &std::path::Path,
    addr_file: &std::path::Path,
) -> std::process::Child {
    let _ = std::fs::remove_file(addr_file);
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--ignored", "--nocapture"])
        .env(CHILD_ENV[0], nats_url)
        .env(CHILD_ENV[1], dir)
        .env(CHILD_ENV[2], addr_file)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// In a child process started by [`spawn_test_child`]: (NATS URL, store directory, address
/// file); `None` when the test runs on its own (it then does nothing).
pub(crate) fn child_settings() -> Option<(String, std::path::PathBuf, String)> {
    let var = |i: usize| std::env::var(CHILD_ENV[i]).ok();
    Some((var(0)?, var(1)?.into(), var(2)?))
}

/// In a child process: writes the listener's API address to `addr_file` (atomically).
pub(crate) fn announce_address(h: &ListenerHandle, addr_file: &str) {
    let tmp = format!("{addr_file}.tmp");
    std::fs::write(&tmp, h.http_addr().to_string()).unwrap();
    std::fs::rename(&tmp, addr_file).unwrap();
}

/// A client of the child listener that announces its address in `addr_file`.
pub(crate) async fn child_client(addr_file: &std::path::Path) -> ListenerClient {
    let addr = eventually("the child listener's address", || async {
        std::fs::read_to_string(addr_file).ok()
    })
    .await;
    ListenerClient::new(&format!("http://{addr}"), None).unwrap()
}

/// A single listener (no group) on the nats-server at `url`, with the short intervals the
/// tests need.
pub(crate) fn single_listener(
    url: &str,
    dir: &std::path::Path,
) -> msgtrail_listener::ListenerConfig {
    msgtrail_listener::ListenerConfig {
        nats: msgtrail_nats::NatsOptions::url(url),
        data_dir: dir.to_path_buf(),
        http_addr: "127.0.0.1:0".parse().unwrap(),
        batch_size: 16,
        ack_wait: Duration::from_secs(1),
        watchdog_interval: Duration::from_millis(100),
        retention_interval: Duration::from_millis(100),
        ..Default::default()
    }
}

/// A member `instance` of listener group `group` on the nats-server at `url`, holding each
/// partition `copies` times, with the short intervals the group tests need.
pub(crate) fn group_member(
    url: &str,
    dir: &std::path::Path,
    group: &str,
    instance: &str,
    copies: usize,
) -> msgtrail_listener::ListenerConfig {
    msgtrail_listener::ListenerConfig {
        group: Some(msgtrail_listener::cluster::GroupConfig {
            name: group.into(),
            instance: instance.into(),
            copies,
            advertise_url: None,
        }),
        ..single_listener(url, dir)
    }
}

/// Publishes `records` in batches of eight, each split by partition onto its subject (as
/// brokers with `--stage-partitions` do).
pub(crate) async fn publish_partitioned(
    js: &async_nats::jetstream::Context,
    records: &[msgtrail_core::StageRecord],
) {
    for batch in records.chunks(8) {
        for (p, part) in msgtrail_core::partition::split(batch.iter().cloned()) {
            js.publish(p.subject(), msgtrail_core::encode_batch(&part).into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
    }
}

/// Span export over OTLP/gRPC to `rx`, flushed quickly (10 ms batches, 100 ms grace), as the
/// tests that read spans at a receiver need.
pub(crate) fn export_to(rx: &msgtrail_test_support::OtlpReceiver) -> msgtrail_otel::PipelineConfig {
    msgtrail_otel::PipelineConfig {
        export: msgtrail_otel::ExportConfig {
            protocol: msgtrail_otel::Protocol::Grpc,
            endpoint: Some(rx.endpoint()),
            batch_delay: Duration::from_millis(10),
            ..Default::default()
        },
        grace: Duration::from_millis(100),
        ..Default::default()
    }
}

/// A listener's settings observing `ORDERS` on `server` with its store in `dir`: small
/// batches, short ack wait, discovery every `discovery`.
pub(crate) fn observing(
    server_url: &str,
    dir: &std::path::Path,
    discovery: Duration,
) -> msgtrail_listener::ListenerConfig {
    let mut observe = msgtrail_listener::ObserveConfig::streams(["ORDERS"]);
    observe.discovery_interval = discovery;
    msgtrail_listener::ListenerConfig {
        nats: msgtrail_nats::NatsOptions::url(server_url),
        data_dir: dir.to_path_buf(),
        http_addr: "127.0.0.1:0".parse().unwrap(),
        batch_size: 4,
        ack_wait: Duration::from_secs(1),
        watchdog_interval: Duration::from_millis(100),
        retention_interval: Duration::from_millis(100),
        observe: Some(observe),
        ..Default::default()
    }
}
