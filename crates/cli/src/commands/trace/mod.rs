//! `msgtrail trace <message-id | request-id>`: a message's trajectory as a timeline, from
//! the listener's HTTP API (`--json` prints the whole trajectory as the API gives it).
//!
//! A request ID its producer uploaded again after the broker's dedup window names several
//! messages: the listener answers with the latest, and both the note above the timeline and
//! the timeline's header name every one of them.
//!
//! ## Layout
//! This module holds the options and [`run`]; `timeline` renders a trajectory (header,
//! hops against a time bar, clocks, groups, diagnosis); `request` the note on a request ID
//! that names several messages; `client` a client's events and clock offsets
//! (`--client`).

use crate::present::{
    format_bounded as bounded, format_clock as clock, format_latency as ms, format_signed as signed,
};
use anyhow::Context;
use clap::Args as ClapArgs;
use msgtrail_core::outcome::RedeliveryOutcome;
use msgtrail_core::trajectory::{
    DeliveryMode, HopKind, HopSpan, HopStatus, MessageState, Trajectory,
};
use msgtrail_core::Stage;
use msgtrail_core::StageRecord;
use msgtrail_listener_client::ClientClocks;
use msgtrail_listener_client::ENV_TOKEN;
use msgtrail_listener_client::{ListenerClient, DEFAULT_URL, ENV_LISTENER_URL};
use std::io::IsTerminal;

mod client;
mod request;
mod timeline;

use client::*;
use request::*;
use timeline::*;

/// Where the listener's API is.
#[derive(Debug, Clone, ClapArgs)]
pub(crate) struct ListenerArgs {
    /// The listener's base URL. Defaults to the dev system's listener, then http://127.0.0.1:7380.
    #[arg(long, env = ENV_LISTENER_URL)]
    pub listener_url: Option<String>,
    /// The listener's bearer token, if it requires one.
    #[arg(long, env = ENV_TOKEN, hide_env_values = true)]
    pub listener_token: Option<String>,
}

impl ListenerArgs {
    /// A client of the listener.
    pub(crate) fn client(&self) -> anyhow::Result<ListenerClient> {
        let url = match &self.listener_url {
            Some(u) => u.clone(),
            None => crate::common::DevFile::load()
                .ok()
                .and_then(|d| d.listener_url)
                .unwrap_or_else(|| DEFAULT_URL.to_owned()),
        };
        Ok(ListenerClient::new(&url, self.listener_token.clone())?)
    }
}

/// When to colour the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ColorChoice {
    /// On a terminal, unless NO_COLOR is set.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

impl ColorChoice {
    /// Whether to colour stdout.
    pub(crate) fn enabled(self) -> bool {
        match self {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => {
                std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
            }
        }
    }
}

/// Exit status of `msgtrail trace` when nothing carries the ID (a failed query exits 1).
pub(crate) const NOT_FOUND_EXIT: i32 = 2;

/// Options of `msgtrail trace`. Exit status: 0 found (complete or not: the state says),
/// 2 not found, 1 the query failed.
#[derive(Debug, ClapArgs)]
pub(crate) struct Args {
    /// A message ID (UUIDv7) or a request ID.
    #[arg(required_unless_present_any = ["client", "stream"])]
    pub id: Option<String>,
    /// Observe mode: the observed JetStream stream of the message (with --seq or --msg-id).
    #[arg(long, conflicts_with_all = ["id", "client"])]
    pub stream: Option<String>,
    /// With --stream: the message's stream sequence.
    #[arg(long, requires = "stream", conflicts_with = "msg_id")]
    pub seq: Option<u64>,
    /// With --stream: the message's Nats-Msg-Id.
    #[arg(long, requires = "stream")]
    pub msg_id: Option<String>,
    /// Instead of a message: the client events (no-match notices N1, channel events A1) of
    /// this producer or consumer, newest first.
    #[arg(long, conflicts_with = "id")]
    pub client: Option<String>,
    /// With `--client`: at most this many events.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    /// With a request ID several producers used: whose.
    #[arg(long)]
    pub producer: Option<String>,
    /// Print the whole trajectory as JSON.
    #[arg(long)]
    pub json: bool,
    /// Colour the timeline.
    #[arg(long, value_enum, default_value = "auto")]
    pub color: ColorChoice,
    /// Where the listener is.
    #[command(flatten)]
    pub listener: ListenerArgs,
}

/// Fetches and prints the trajectory.
pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let client = args.listener.client()?;
    if let Some(who) = &args.client {
        let events = client
            .client_events(who, args.limit)
            .await
            .context("query failed")?;
        let clocks = client.client_clocks(who).await.context("query failed")?;
        if args.json {
            // The events' body with the window estimates beside them.
            let mut body = serde_json::to_value(&events)?;
            body["window_secs"] = clocks.window_secs.into();
            body["clocks"] = serde_json::to_value(&clocks.clocks)?;
            println!("{}", serde_json::to_string_pretty(&body)?);
        } else {
            print!("{}", render_client_clocks(&clocks));
            print!("{}", render_client_events(who, &events.events));
        }
        return Ok(());
    }
    let (id, producer) = match (&args.stream, args.seq, &args.msg_id) {
        // An observed message's ID is computed from its stream and sequence; its
        // Nats-Msg-Id is its request ID, the stream its producer (msgtrail_core::observed).
        (Some(stream), Some(seq), _) => (
            msgtrail_core::observed::observed_message_id(stream, seq).to_string(),
            None,
        ),
        (Some(stream), None, Some(msg_id)) => (msg_id.clone(), Some(stream.clone())),
        (Some(_), None, None) => anyhow::bail!("--stream needs --seq or --msg-id"),
        _ => (args.id.clone().unwrap_or_default(), args.producer.clone()),
    };
    let t = match client.trajectory(&id, producer.as_deref()).await {
        Ok(t) => t,
        Err(e) if e.is_not_found() => {
            // Exit status 2 tells scripts "not found" apart from a failed query (1).
            eprintln!(
                "msgtrail: not found: no stage record carries {:?} (the listener has seen nothing of it)",
                id
            );
            std::process::exit(NOT_FOUND_EXIT);
        }
        Err(e) => return Err(e).context("query failed"),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&t)?);
    } else {
        if let Some(note) = request_note(&t, &id) {
            println!("{note}\n");
        }
        print!("{}", render(&t, args.color.enabled()));
        if let (Some(ui), Some(trace)) = (msgtrail_otel::TraceUi::from_env(), &t.trace_id) {
            println!("trace: {}", ui.link_hex(trace));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use msgtrail_core::trajectory::AssembleOptions;
    use msgtrail_core::{ClientId, MessageId, RequestId};

    fn sample() -> Trajectory {
        let id = MessageId::new();
        let t0 = 1_796_126_401_000_000_000u64;
        let mk = |stage, ms: u64| {
            let mut r = StageRecord::at(stage, t0 + ms * 1_000_000);
            r.message_id = Some(id);
            r.request_id = Some(RequestId::new("req-9").unwrap());
            r.producer = Some(ClientId::new("shop").unwrap());
            r.topic = Some("orders".into());
            r
        };
        let dl = |stage, ms: u64, outcome: Option<&str>| {
            let mut r = mk(stage, ms);
            r.group = Some(msgtrail_core::GroupId::new("billing").unwrap());
            r.consumer = Some(ClientId::new("b-1").unwrap());
            r.attempt = Some(1);
            r.outcome = outcome.map(Into::into);
            if outcome == Some("failed") {
                r.detail = Some("insufficient funds".into());
            }
            r
        };
        let recs = vec![
            mk(Stage::UploadSent, 0),
            mk(Stage::UploadReceived, 1),
            mk(Stage::Stored, 3),
            dl(Stage::PullSent, 10, None),
            dl(Stage::PullReceived, 11, None),
            dl(Stage::ProcessFinished, 15, Some("failed")),
        ];
        Trajectory::assemble(recs, &AssembleOptions::default()).unwrap()
    }

    #[test]
    fn plain_timeline_names_hops_latencies_and_the_failure() {
        let out = render(&sample(), false);
        assert!(!out.contains('\x1b'), "no colour when disabled");
        assert!(out.contains("topic orders"), "{out}");
        assert!(out.contains("store "), "{out}");
        assert!(out.contains("deliver billing/b-1 #1 (pull)"), "{out}");
        assert!(out.contains("  process billing/b-1 #1 (pull)"), "{out}");
        assert!(
            out.contains("processing failed: insufficient funds"),
            "{out}"
        );
        assert!(out.contains("P3 stored"), "{out}");
        assert!(out.contains("2.0 ms"), "store latency: {out}");
        assert!(out.contains("diagnosis: "), "{out}");
    }

    #[test]
    fn a_request_id_stored_twice_names_every_message() {
        let mut t = sample();
        let own = t.message_id.unwrap();
        let earlier: MessageId = "0190aaaa-0000-7000-8000-000000000001".parse().unwrap();
        assert!(!render(&t, false).contains("uploaded again"));
        assert_eq!(request_note(&t, "req-9"), None);
        t.set_same_request([earlier]);
        let out = render(&t, false);
        assert!(
            out.contains(&format!(
                "request req-9 stored as 2 messages (uploaded again after the dedup window): {earlier}, {own} (this one)"
            )),
            "{out}"
        );
        assert!(
            out.contains(&format!(
                "duplicate after the dedup window: request id req-9 was stored before as message {earlier}"
            )),
            "diagnosis: {out}"
        );
        let note = request_note(&t, "req-9").unwrap();
        assert!(
            note.contains("names 2 messages")
                && note.contains(&format!("showing the latest, {own}"))
                && note.contains(&earlier.to_string()),
            "{note}"
        );
        // Asked by message ID: the header says it, no note.
        assert_eq!(request_note(&t, &own.to_string()), None);
    }

    #[test]
    fn clock_offsets_show_with_their_bounds() {
        let t0 = 1_796_126_401_000_000_000u64;
        let mk = |stage, us: u64| {
            let mut r = StageRecord::at(stage, t0 + us * 1_000);
            r.message_id = Some(MessageId::new());
            r.request_id = Some(RequestId::new("req-9").unwrap());
            r.producer = Some(ClientId::new("shop").unwrap());
            r
        };
        // The producer's clock 250 ms ahead; round trip 0.6 ms.
        let recs = vec![
            mk(Stage::UploadSent, 250_000),
            mk(Stage::UploadReceived, 300),
            mk(Stage::Stored, 1_000),
            mk(Stage::StoreConfirmed, 251_300),
        ];
        let mut recs = recs;
        let id = recs[0].message_id;
        recs.iter_mut().for_each(|r| r.message_id = id);
        let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
        let out = render(&t, false);
        assert!(out.contains("clock of shop: +250 ms ± 0.3 ms"), "{out}");
        assert!(
            out.contains("arrived 0.3 ms ± 0.3 ms after the producer sent it"),
            "{out}"
        );
        assert!(out.contains("shop             +250 ms ± 0.3 ms"), "{out}");
        // With the broker instance on the broker's records, the estimate names it.
        let recs: Vec<StageRecord> = t
            .hops
            .iter()
            .flat_map(|h| h.events.clone())
            .map(|mut r| {
                if matches!(r.stage, Stage::UploadReceived | Stage::Stored) {
                    r.broker = Some("b-1a2b".parse().unwrap());
                }
                r
            })
            .collect();
        let t = Trajectory::assemble(recs, &AssembleOptions::default()).unwrap();
        let out = render(&t, false);
        assert!(
            out.contains("clock of shop vs broker b-1a2b: +250 ms ± 0.3 ms"),
            "{out}"
        );
        assert!(out.contains("exchange(s), vs broker b-1a2b"), "{out}");
        let window = ClientClocks {
            client: "shop".into(),
            window_secs: 60,
            clocks: vec![msgtrail_listener_client::WindowEstimate {
                estimate: t.clocks[0].clone(),
                measured_at: t0,
                newest_at: t0,
            }],
        };
        let out = render_client_clocks(&window);
        assert!(out.contains("best of the last 60 s"), "{out}");
        assert!(
            out.contains("clock of shop vs broker b-1a2b: +250 ms ± 0.3 ms  round trip 0.6 ms, 1 exchange(s)"),
            "{out}"
        );
    }

    #[test]
    fn client_events_read_newest_first() {
        let mut n1 = StageRecord::at(Stage::NoMatch, 1_796_126_401_000_000_000);
        n1.group = Some(msgtrail_core::GroupId::new("billing").unwrap());
        n1.topic = Some("orders.*".into());
        let out = render_client_events("billing-1", &[n1]);
        assert!(out.contains("client billing-1: 1 event(s)"), "{out}");
        assert!(
            out.contains("N1 no matching message, group billing, topic orders.*"),
            "{out}"
        );
        assert!(render_client_events("x", &[]).contains("no no-match notice"));
    }

    #[test]
    fn colour_uses_ansi_codes() {
        let out = render(&sample(), true);
        assert!(out.contains("\x1b[31;1m"), "errors in red");
        assert!(out.contains("\x1b[32m"), "ok hops in green");
    }
}
