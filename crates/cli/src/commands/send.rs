//! `msgtrail send`: upload one message.

use crate::common::{parse_kv, IdentityArgs, NatsArgs};
use anyhow::Context;
use clap::Args;
use msgtrail_client::{Outgoing, Producer};
use msgtrail_core::RequestId;
use std::io::Read;
use std::path::PathBuf;

/// Options of `msgtrail send`.
#[derive(Debug, Args)]
pub(crate) struct SendArgs {
    /// Topic to send to.
    #[arg(long)]
    pub topic: String,
    /// Request ID (generated when absent); repeat it to retry without duplicates.
    #[arg(long)]
    pub request_id: Option<String>,
    /// Attribute key=value (repeatable).
    #[arg(long = "attr", value_parser = parse_kv)]
    pub attrs: Vec<(String, String)>,
    /// Payload text.
    #[arg(long, conflicts_with = "file")]
    pub data: Option<String>,
    /// Payload file (stdin when neither --data nor --file is given).
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// A W3C traceparent to link the message's trace to.
    #[arg(long)]
    pub traceparent: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub identity: IdentityArgs,
}

/// Sends the message and prints its ID.
pub(crate) async fn run(nats: &NatsArgs, args: SendArgs) -> anyhow::Result<()> {
    let payload = match (&args.data, &args.file) {
        (Some(d), _) => d.clone().into_bytes(),
        (None, Some(f)) => std::fs::read(f).with_context(|| format!("reading {}", f.display()))?,
        (None, None) => {
            let mut buf = vec![];
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("reading stdin")?;
            buf
        }
    };
    let client = nats.options()?.connect().await?;
    let producer = Producer::connect(client, args.identity.identity(true)?).await?;
    let mut msg = Outgoing::new(args.topic, payload);
    if let Some(r) = args.request_id {
        msg = msg.request_id(RequestId::new(r)?);
    }
    for (k, v) in args.attrs {
        msg = msg.attr(k, v);
    }
    if let Some(tp) = args.traceparent {
        msg = msg.traceparent(tp);
    }
    let reply = producer.send_message(msg).await?;
    if args.json {
        println!("{}", serde_json::to_string(&reply)?);
    } else {
        println!(
            "{} message_id={} request_id={} stream_seq={}",
            if reply.duplicate {
                "duplicate"
            } else {
                "stored"
            },
            reply.message_id,
            reply.request_id,
            reply.stream_seq
        );
    }
    producer.close().await?;
    Ok(())
}
