//! `msgtrail dev`: a whole local system in one command — a nats-server child with JetStream
//! in a temporary directory on a free port, a broker and a listener in this process (the
//! listener's page and API on 127.0.0.1:7380, or a free port when that is taken; OTLP export
//! when `OTEL_EXPORTER_OTLP_ENDPOINT` is set), and dev identities written to the dev file (see
//! [`DevFile::path`]) so that `send`, `consume`, `trace` and `stats` work with no setup.
//! `--demo` adds a small load: a producer, a consumer group that fails some messages (most
//! recover on a redelivery, those with an expired card are dead-lettered), a second group,
//! and now and then a message to a topic no group reads (stuck after 20 s), so that every
//! view of the page has something to show within a minute. Ctrl-C stops everything it
//! started.

use crate::common::{DevFile, DevIdentity};
use anyhow::Context;
use clap::Args;
use futures::StreamExt;
use msgtrail_broker::{BrokerConfig, ClientEntry, ClientRegistry};
use msgtrail_client::{Consumer, Identity, NatsOptions, Outgoing, Producer, PushOptions};
use msgtrail_core::wire::Subscription;
use msgtrail_core::{ClientId, GroupId, Role};
use msgtrail_devkit::NatsServer;
use std::time::Duration;

/// Options of `msgtrail dev`.
#[derive(Debug, Args)]
pub(crate) struct DevArgs {
    /// Also run a demo load.
    #[arg(long)]
    pub demo: bool,
    /// Demo: pause between sends.
    #[arg(long, default_value = "1s", value_parser = crate::common::parse_duration)]
    pub demo_every: Duration,
    /// Stop the demo after this many messages (default: run until Ctrl-C).
    #[arg(long)]
    pub demo_messages: Option<u64>,
}

fn ids(name: &str) -> anyhow::Result<ClientId> {
    Ok(ClientId::new(name)?)
}

/// Runs the dev system until Ctrl-C.
pub(crate) async fn run(args: DevArgs) -> anyhow::Result<()> {
    let server = NatsServer::start().context("starting nats-server")?;
    let ids = DevIdentities::generate()?;
    let broker = msgtrail_broker::start(broker_config(server.url(), &ids)?).await?;
    let listener_dir =
        std::env::temp_dir().join(format!("msgtrail-dev-listener-{}", std::process::id()));
    let listener = start_listener(server.url(), &listener_dir).await?;
    let listener_url = format!("http://{}", listener.http_addr());
    let dev = DevFile {
        nats_url: server.url().to_owned(),
        producer: DevIdentity {
            id: ids.producer.client_id.to_string(),
            seed: ids.producer.seed(),
        },
        consumer: DevIdentity {
            id: ids.consumer.client_id.to_string(),
            seed: ids.consumer.seed(),
        },
        listener_url: Some(listener_url.clone()),
    };
    let path = dev.save()?;
    print_welcome(&server, &listener_url, &listener_dir, &path);

    let nats = async_nats::connect(server.url()).await?;
    let demo = if args.demo {
        Some(tokio::spawn(demo(
            nats,
            ids.producer,
            ids.demo_billing,
            ids.demo_audit,
            args.demo_every,
            args.demo_messages,
        )))
    } else {
        None
    };
    crate::signal::shutdown_signal().await;
    println!("stopping");
    if let Some(d) = demo {
        d.abort();
    }
    broker.shutdown().await;
    if let Err(e) = listener.shutdown().await {
        eprintln!("listener: {}", msgtrail_core::ErrorChain(&e));
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&listener_dir);
    Ok(())
}

/// The identities `msgtrail dev` registers: the CLI's producer and consumer, and the demo's
/// two consumer services.
struct DevIdentities {
    producer: Identity,
    consumer: Identity,
    demo_billing: Identity,
    demo_audit: Identity,
}

impl DevIdentities {
    fn generate() -> anyhow::Result<Self> {
        Ok(DevIdentities {
            producer: Identity::generate(ids("dev-producer")?).with_service_name("dev-producer"),
            consumer: Identity::generate(ids("dev-consumer")?).with_service_name("dev-consumer"),
            demo_billing: Identity::generate(ids("demo-billing")?).with_service_name("billing"),
            demo_audit: Identity::generate(ids("demo-audit")?).with_service_name("audit"),
        })
    }
}

/// The dev broker: every identity registered for every topic, a short ack wait and three
/// deliveries, so that the demo's failures show redeliveries and dead letters quickly.
fn broker_config(nats_url: &str, ids: &DevIdentities) -> anyhow::Result<BrokerConfig> {
    let mut entries = vec![];
    for (role, ident) in [
        (Role::Producer, &ids.producer),
        (Role::Consumer, &ids.consumer),
        (Role::Consumer, &ids.demo_billing),
        (Role::Consumer, &ids.demo_audit),
    ] {
        entries.push(ClientEntry {
            id: ident.client_id.clone(),
            role,
            public_key: ident.public_key(),
            topics: vec![">".into()],
            service_name: ident.service_name.clone(),
        });
    }
    Ok(BrokerConfig {
        nats: NatsOptions::url(nats_url),
        clients: ClientRegistry::new(entries)?,
        ack_wait: Duration::from_secs(5),
        max_deliver: 3,
        ..Default::default()
    })
}

/// What is running and what to try.
fn print_welcome(
    server: &NatsServer,
    listener_url: &str,
    listener_dir: &std::path::Path,
    identities: &std::path::Path,
) {
    println!("msgtrail dev is running");
    println!(
        "  nats-server   {} (pid {}, JetStream in {})",
        server.url(),
        server.pid(),
        server.store_dir().display()
    );
    println!("  broker        in this process (NATS service \"msgtrail\")");
    println!(
        "  listener      {listener_url} (page, API, /metrics; store in {})",
        listener_dir.display()
    );
    if msgtrail_otel::export_requested() {
        println!("  traces        exported over OTLP (OTEL_EXPORTER_OTLP_* settings)");
    }
    println!(
        "  identities    {} (producer dev-producer, consumer dev-consumer)",
        identities.display()
    );
    let bin = this_binary();
    println!("try (in another terminal, from this folder):");
    println!("  {bin} send --topic orders.eu --attr category=refund --data hello");
    println!("  {bin} consume --topic 'orders.*' --group billing --pull --max 1");
    println!("  {bin} trace <message-id or request-id>");
    println!("  {bin} stats");
    println!("Ctrl-C stops everything.");
}

/// How to run this very binary from the current folder, as the welcome prints it.
fn this_binary() -> String {
    let exe = std::env::current_exe().ok();
    let cwd = std::env::current_dir().ok();
    let path = std::env::var_os("PATH");
    invocation(exe.as_deref(), cwd.as_deref(), path.as_deref())
}

/// `msgtrail` when that name on the PATH is this binary; else its path relative to `cwd`
/// when it lies below it (`target/debug/msgtrail`), else its absolute path; quoted for a
/// POSIX shell when it needs to be.
fn invocation(
    exe: Option<&std::path::Path>,
    cwd: Option<&std::path::Path>,
    path_var: Option<&std::ffi::OsStr>,
) -> String {
    let Some(exe) = exe else {
        return "msgtrail".to_owned();
    };
    let same = |p: &std::path::Path| {
        std::fs::canonicalize(p).ok() == std::fs::canonicalize(exe).ok() && p.exists()
    };
    if let Some(name) = exe.file_name() {
        let on_path = path_var
            .into_iter()
            .flat_map(std::env::split_paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file());
        if on_path.is_some_and(|p| same(&p)) {
            return name.to_string_lossy().into_owned();
        }
    }
    let shown = cwd
        .and_then(|c| exe.strip_prefix(c).ok())
        .map(std::path::Path::to_path_buf)
        .unwrap_or_else(|| exe.to_path_buf());
    let text = shown.to_string_lossy();
    if text
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+".contains(c))
    {
        text.into_owned()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

/// How long a stored message may wait for its first delivery before the dev listener calls
/// it stuck (the default is a minute).
const DEV_DELIVERED_DEADLINE_MS: u64 = 20_000;

/// Starts the listener in this process, on 127.0.0.1:7380 or else a free port.
async fn start_listener(
    nats_url: &str,
    data_dir: &std::path::Path,
) -> anyhow::Result<msgtrail_listener::ListenerHandle> {
    let mut config = msgtrail_listener::ListenerConfig {
        nats: NatsOptions::url(nats_url),
        data_dir: data_dir.to_owned(),
        trace_ui: msgtrail_otel::TraceUi::from_env(),
        ..Default::default()
    };
    // The demo's stuck messages show within a minute (stored, delivered to no group).
    config.deadlines.delivered_ms = DEV_DELIVERED_DEADLINE_MS;
    if msgtrail_otel::export_requested() {
        config.otel = Some(
            msgtrail_otel::PipelineConfig::from_env().context("OpenTelemetry export settings")?,
        );
    }
    match msgtrail_listener::start(config.clone()).await {
        Ok(l) => Ok(l),
        Err(first) => {
            config.http_addr = "127.0.0.1:0".parse().expect("valid address");
            msgtrail_listener::start(config)
                .await
                .with_context(|| format!("starting the listener (on its default port: {first})"))
        }
    }
}

async fn demo(
    nats: async_nats::Client,
    producer: Identity,
    billing: Identity,
    audit: Identity,
    every: Duration,
    limit: Option<u64>,
) -> anyhow::Result<()> {
    let producer = Producer::connect(nats.clone(), producer).await?;
    let billing = Consumer::connect(nats.clone(), billing).await?;
    let audit = Consumer::connect(nats.clone(), audit).await?;
    let sub = |group: &str| -> anyhow::Result<Subscription> {
        Ok(Subscription {
            group: GroupId::new(group)?,
            topic: "orders.*".into(),
            filter: Default::default(),
            message_id: None,
        })
    };
    // Billing is pushed every message and fails about one in five ("insufficient funds") on
    // its first two attempts (the third succeeds), and every attempt of a message whose card
    // expired ("card expired"): after 3 failures it is dead-lettered.
    let mut pushed = billing
        .subscribe(&sub("billing")?, PushOptions::default())
        .await?;
    tokio::spawn(async move {
        while let Some(m) = pushed.next().await {
            let expired = m.attributes.get("card").is_some_and(|c| c == "expired");
            let fail = expired || (m.message_id.as_u128() % 5 == 0 && m.delivery_attempt < 3);
            let id = m.message_id;
            let attempt = m.delivery_attempt;
            let outcome = billing
                .process(m, |_| async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    if expired {
                        Err("card expired")
                    } else if fail {
                        Err("insufficient funds")
                    } else {
                        Ok(())
                    }
                })
                .await;
            if let Ok(Err(e)) = outcome {
                println!("demo: billing failed {id} (attempt {attempt}): {e}");
            }
        }
    });
    // Audit pulls in batches every 3 s.
    let audit_sub = sub("audit")?;
    tokio::spawn(async move {
        loop {
            if let Ok(batch) = audit
                .fetch(&audit_sub, 50, Duration::from_millis(100))
                .await
            {
                for m in batch {
                    let _ = m.ack().await;
                }
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
    });
    let regions = ["eu", "us", "apac"];
    let categories = ["refund", "sale", "sale", "subscription"];
    let mut n: u64 = 0;
    while limit.is_none_or(|l| n < l) {
        // Every 10th message (from the 4th) goes to payments.eu, which no group reads: it
        // waits in the queue and is stuck after DEV_DELIVERED_DEADLINE_MS. Every 7th order
        // (from the 2nd) has an expired card: billing dead-letters it.
        let topic = if n % 10 == 3 {
            "payments.eu".to_owned()
        } else {
            format!("orders.{}", regions[(n % 3) as usize])
        };
        let mut msg = Outgoing::new(topic, format!("{{\"order\":{n}}}"))
            .attr("category", categories[(n % 4) as usize]);
        if n % 7 == 1 {
            msg = msg.attr("card", "expired");
        }
        match producer.send_message(msg).await {
            Ok(r) => println!("demo: sent {} request_id={}", r.message_id, r.request_id),
            Err(e) => println!("demo: send failed: {}", msgtrail_core::ErrorChain(&e)),
        }
        n += 1;
        tokio::time::sleep(every).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::invocation;
    use std::path::Path;

    #[test]
    fn the_welcome_names_the_binary_as_it_can_be_run() {
        let dir = tempfile::tempdir().unwrap();
        let bin_dir = dir.path().join("target/debug");
        std::fs::create_dir_all(&bin_dir).unwrap();
        let exe = bin_dir.join("msgtrail");
        std::fs::write(&exe, b"").unwrap();
        // Below the current folder, not on the PATH: the relative path.
        assert_eq!(
            invocation(Some(&exe), Some(dir.path()), Some("/usr/bin".as_ref())),
            "target/debug/msgtrail"
        );
        // On the PATH: its name.
        let path = std::env::join_paths([Path::new("/nonexistent"), &bin_dir]).unwrap();
        assert_eq!(
            invocation(Some(&exe), Some(Path::new("/")), Some(&path)),
            "msgtrail"
        );
        // Elsewhere: the absolute path, quoted when it must be.
        let other = tempfile::tempdir().unwrap();
        assert_eq!(
            invocation(Some(&exe), Some(other.path()), None),
            exe.display().to_string()
        );
        assert_eq!(
            invocation(Some(Path::new("/opt/my tools/msgtrail")), None, None),
            "'/opt/my tools/msgtrail'"
        );
        assert_eq!(invocation(None, None, None), "msgtrail");
    }
}
