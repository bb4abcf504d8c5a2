//! `msgtrail consume`: pull or be pushed messages, process and settle them.

use crate::common::{parse_duration, parse_kv, IdentityArgs, NatsArgs};
use base64::Engine;
use clap::Args;
use futures::StreamExt;
use msgtrail_client::{Consumer, PushOptions, Received};
use msgtrail_core::wire::Subscription;
use msgtrail_core::{GroupId, MessageId};
use std::time::Duration;

/// Options of `msgtrail consume`.
#[derive(Debug, Args)]
pub(crate) struct ConsumeArgs {
    /// Topic filter (NATS wildcards allowed: orders.*, orders.>).
    #[arg(long)]
    pub topic: String,
    /// Consumer group.
    #[arg(long)]
    pub group: String,
    /// Pull (the default).
    #[arg(long, conflicts_with = "push")]
    pub pull: bool,
    /// Be pushed messages.
    #[arg(long)]
    pub push: bool,
    /// With --push: deliver in batches on this period (e.g. 5s). With --pull: poll on this period.
    #[arg(long, value_parser = parse_duration)]
    pub every: Option<Duration>,
    /// Attribute filter key=value (repeatable).
    #[arg(long = "filter", value_parser = parse_kv)]
    pub filters: Vec<(String, String)>,
    /// Only this message ID.
    #[arg(long)]
    pub message_id: Option<MessageId>,
    /// Stop after this many messages (default: run until Ctrl-C; with --pull and no --every, one fetch).
    #[arg(long)]
    pub max: Option<u32>,
    /// Fail this fraction of messages (0.0–1.0) to exercise redelivery.
    #[arg(long, default_value_t = 0.0)]
    pub fail_rate: f64,
    /// How long one pull waits for messages.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub wait: Duration,
    /// Print JSON lines.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub identity: IdentityArgs,
}

/// Whether to fail this message, deterministically from its ID and attempt, so that
/// `--fail-rate` is reproducible.
fn should_fail(m: &Received, rate: f64) -> bool {
    if rate <= 0.0 {
        return false;
    }
    let x = (m.message_id.as_u128() as u64)
        ^ u64::from(m.delivery_attempt).wrapping_mul(0x9e3779b97f4a7c15);
    let x = x.wrapping_mul(0xbf58476d1ce4e5b9);
    ((x >> 11) as f64 / (1u64 << 53) as f64) < rate
}

fn print(m: &Received, outcome: &Result<(), String>, json: bool) {
    if json {
        let v = serde_json::json!({
            "message_id": m.message_id,
            "topic": m.topic,
            "attributes": m.attributes,
            "payload": String::from_utf8(m.payload.to_vec()).unwrap_or_else(|_| base64::engine::general_purpose::STANDARD.encode(&m.payload)),
            "delivery_attempt": m.delivery_attempt,
            "outcome": match outcome { Ok(()) => "ok".to_owned(), Err(e) => format!("failed: {e}") },
        });
        println!("{v}");
    } else {
        println!(
            "{} {} attempt={} {} {:?}",
            m.message_id,
            m.topic,
            m.delivery_attempt,
            match outcome {
                Ok(()) => "ok".to_owned(),
                Err(e) => format!("FAILED ({e})"),
            },
            String::from_utf8_lossy(&m.payload)
        );
    }
}

/// Processes and settles one delivery; returns whether the settle succeeded. A settle that
/// fails is said on standard error and the loop goes on: the message comes again after its
/// ack wait (or, after a timeout, the settle may have been applied) — a consumer that stopped
/// at the first failed settle would leave every delivery it holds to the ack wait, and stop
/// consuming. The command's exit status still says that some settle failed.
async fn handle(consumer: &Consumer, m: Received, args: &ConsumeArgs) -> bool {
    let fail = should_fail(&m, args.fail_rate);
    let shown = m.clone();
    let settled = consumer
        .process(m, |_| async move {
            if fail {
                Err("simulated failure (--fail-rate)".to_owned())
            } else {
                Ok(())
            }
        })
        .await;
    match settled {
        Ok(outcome) => {
            print(&shown, &outcome, args.json);
            true
        }
        Err(e) => {
            eprintln!(
                "{} {}: settle failed: {} ({})",
                shown.message_id,
                shown.topic,
                msgtrail_core::ErrorChain(&e),
                if e.is_already_settled() {
                    "the group is already done with this message; nothing to do"
                } else if e.is_delivery_expired() {
                    "not applied; the message is delivered again"
                } else {
                    "it may have been applied; if not, the message is delivered again"
                }
            );
            false
        }
    }
}

/// How long `consume` waits before fetching again after a transient failure.
const FETCH_RETRY: Duration = Duration::from_millis(500);

/// Consumes until `--max` messages or Ctrl-C.
pub(crate) async fn run(nats: &NatsArgs, args: ConsumeArgs) -> anyhow::Result<()> {
    if !(0.0..=1.0).contains(&args.fail_rate) {
        anyhow::bail!("--fail-rate must be between 0 and 1");
    }
    let client = nats.options()?.connect().await?;
    let consumer = Consumer::connect(client, args.identity.identity(false)?).await?;
    let sub = Subscription {
        group: GroupId::new(args.group.as_str())?,
        topic: args.topic.clone(),
        filter: args.filters.iter().cloned().collect(),
        message_id: args.message_id,
    };
    let limit = args.max.map(|m| m as usize).unwrap_or(usize::MAX);
    let mut done = 0usize;
    let mut failed_settles = 0usize;
    let stop = crate::signal::shutdown_signal();
    tokio::pin!(stop);
    if args.push {
        let mut stream = consumer
            .subscribe(
                &sub,
                match args.every {
                    Some(every) => PushOptions::default().every(every),
                    None => PushOptions::default(),
                }
                .max_inflight(64),
            )
            .await?;
        while done < limit {
            let m = tokio::select! {
                m = stream.next() => match m { Some(m) => m, None => break },
                _ = &mut stop => break,
            };
            failed_settles += usize::from(!handle(&consumer, m, &args).await);
            done += 1;
        }
    } else {
        loop {
            let want = (limit - done).min(100) as u32;
            let got = tokio::select! {
                g = consumer.fetch(&sub, want, args.wait) => g,
                _ = &mut stop => break,
            };
            // A broker restarting, an election, a timeout: fetch again; anything else (a
            // refused channel, bad credentials) ends the command.
            let got = match got {
                Ok(got) => got,
                Err(e) if e.is_transient() => {
                    eprintln!(
                        "fetch failed, fetching again: {}",
                        msgtrail_core::ErrorChain(&e)
                    );
                    tokio::select! {
                        _ = tokio::time::sleep(FETCH_RETRY) => continue,
                        _ = &mut stop => break,
                    }
                }
                Err(e) => return Err(e.into()),
            };
            if got.is_empty() && !args.json {
                eprintln!("no matching message");
            }
            for m in got {
                failed_settles += usize::from(!handle(&consumer, m, &args).await);
                done += 1;
            }
            if done >= limit {
                break;
            }
            match args.every {
                Some(every) => tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = &mut stop => break,
                },
                None if args.max.is_none() => break,
                None => {}
            }
        }
    }
    consumer.close().await?;
    if failed_settles > 0 {
        anyhow::bail!("{failed_settles} of {done} settles failed (each is said above)");
    }
    Ok(())
}
