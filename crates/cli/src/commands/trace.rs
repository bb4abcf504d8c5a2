//! `msgtrail trace <message-id | request-id>`: a message's trajectory as a timeline, from
//! the listener's HTTP API (`--json` prints the whole trajectory as the API gives it).
//!
//! A request ID its producer uploaded again after the broker's dedup window names several
//! messages: the listener answers with the latest, and both the note above the timeline and
//! the timeline's header name every one of them.

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
use msgtrail_listener::ClientClocks;
use msgtrail_listener::ENV_TOKEN;
use msgtrail_listener::{ListenerClient, DEFAULT_URL, ENV_LISTENER_URL};
use std::io::IsTerminal;

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
    #[arg(required_unless_present = "client")]
    pub id: Option<String>,
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
    let id = args.id.clone().unwrap_or_default();
    let t = match client.trajectory(&id, args.producer.as_deref()).await {
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

/// A client's clock offsets over the listener's recent window, per broker instance, as
/// `msgtrail trace --client` prints them before the events.
pub(crate) fn render_client_clocks(c: &ClientClocks) -> String {
    let mut o = format!(
        "client {}: clock, best of the last {} s of exchanges (client minus broker)\n",
        c.client, c.window_secs
    );
    if c.clocks.is_empty() {
        o.push_str("  no complete exchange with a broker in the window\n");
    }
    for w in &c.clocks {
        let e = &w.estimate;
        o.push_str(&format!(
            "  clock of {} vs {}: {} ± {}  round trip {}, {} exchange(s), newest {}\n",
            e.client,
            broker_words(e.broker.as_ref()),
            signed(e.offset_nanos),
            ms(e.bound_nanos),
            ms(e.round_trip_nanos),
            e.samples,
            msgtrail_core::time::format_rfc3339_millis(w.newest_at)
        ));
    }
    o
}

/// `broker b-1a2b3c4d`, or `the broker` for records of brokers that predate instances.
fn broker_words(b: Option<&msgtrail_core::BrokerInstance>) -> String {
    b.map_or_else(|| "the broker".to_owned(), |b| format!("broker {b}"))
}

/// A client's events (N1, A1), newest first, as `msgtrail trace --client` prints them.
pub(crate) fn render_client_events(client: &str, events: &[StageRecord]) -> String {
    let mut o = format!("client {client}: {} event(s), newest first\n", events.len());
    if events.is_empty() {
        o.push_str("  no no-match notice or channel event recorded\n");
    }
    for r in events {
        let mut what = describe(r);
        if let Some(g) = &r.group {
            what.push_str(&format!(", group {g}"));
        }
        if let Some(t) = &r.topic {
            what.push_str(&format!(", topic {t}"));
        }
        o.push_str(&format!(
            "  {}  {what}\n",
            msgtrail_core::time::format_rfc3339_millis(r.at)
        ));
    }
    o
}

/// When `asked` was a request ID that names several messages (uploaded again after the
/// dedup window): which one the answer is, and the others, in upload order.
pub(crate) fn request_note(t: &Trajectory, asked: &str) -> Option<String> {
    let own = t.message_id?;
    if t.same_request.is_empty() || asked.trim() == own.to_string() {
        return None;
    }
    let others: Vec<String> = t.same_request.iter().map(|m| m.to_string()).collect();
    let latest = if t.same_request.iter().all(|m| *m < own) {
        "the latest, "
    } else {
        ""
    };
    Some(format!(
        "request id {} names {} messages (uploaded again after the dedup window); showing {latest}{own}; the other(s): {} (msgtrail trace <message-id>)",
        asked.trim(),
        t.same_request.len() + 1,
        others.join(", ")
    ))
}

/// The messages stored under the trajectory's request ID, in upload order, this one marked.
fn same_request_line(t: &Trajectory) -> Option<String> {
    if t.same_request.is_empty() {
        return None;
    }
    let mut all: Vec<(msgtrail_core::MessageId, bool)> =
        t.same_request.iter().map(|m| (*m, false)).collect();
    if let Some(own) = t.message_id {
        all.push((own, true));
    }
    all.sort();
    let list: Vec<String> = all
        .iter()
        .map(|(m, own)| {
            if *own {
                format!("{m} (this one)")
            } else {
                m.to_string()
            }
        })
        .collect();
    let req = t
        .request_id
        .as_ref()
        .map(|r| format!("request {r}"))
        .unwrap_or_else(|| "the request id".to_owned());
    Some(format!(
        "{req} stored as {} messages (uploaded again after the dedup window): {}",
        all.len(),
        list.join(", ")
    ))
}

/// ANSI styles, or nothing.
struct Style {
    on: bool,
}

impl Style {
    fn paint(&self, code: &str, s: &str) -> String {
        if self.on {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_owned()
        }
    }
    fn bold(&self, s: &str) -> String {
        self.paint("1", s)
    }
    fn dim(&self, s: &str) -> String {
        self.paint("2", s)
    }
    fn status(&self, st: HopStatus, s: &str) -> String {
        match st {
            HopStatus::Ok => self.paint("32", s),
            HopStatus::Error => self.paint("31;1", s),
            HopStatus::Incomplete => self.paint("33", s),
        }
    }
    fn state(&self, st: MessageState) -> String {
        let code = match st {
            MessageState::Consumed => "32;1",
            MessageState::Failed
            | MessageState::DeadLettered
            | MessageState::Stuck
            | MessageState::Lost => "31;1",
            _ => "33;1",
        };
        self.paint(code, st.as_str())
    }
}

fn hop_label(h: &HopSpan) -> String {
    let who = match (&h.group, &h.consumer) {
        (Some(g), Some(c)) => format!(" {g}/{c}"),
        _ => String::new(),
    };
    let attempt = h.attempt.map(|a| format!(" #{a}")).unwrap_or_default();
    let mode = match h.mode {
        Some(DeliveryMode::Push) => " (push)",
        Some(DeliveryMode::Pull) => " (pull)",
        None => "",
    };
    let indent = if h.kind == HopKind::Process { "  " } else { "" };
    let synth = if h.synthesized { " (synthesized)" } else { "" };
    format!("{indent}{}{who}{attempt}{mode}{synth}", h.kind)
}

/// What a record says, in words.
pub(crate) fn describe(r: &StageRecord) -> String {
    let base = match r.stage {
        Stage::UploadSent => "upload sent",
        Stage::UploadReceived => "broker received it, assigned the message id",
        Stage::Stored => "stored",
        Stage::StoreConfirmed => "producer got the store-success notice",
        Stage::PushSent => "pushed to the consumer",
        Stage::PushReceived | Stage::PullReceived => "consumer received it",
        Stage::PushAckSent | Stage::PullAckSent => "consumer sent its settle",
        Stage::PushAckReceived | Stage::PullAckReceived => "broker got the settle",
        Stage::PullSent => "fetched by the consumer",
        Stage::ProcessStarted => "processing started",
        Stage::ProcessFinished => "processing finished",
        Stage::NoMatch => "no matching message",
        Stage::Channel => "channel",
        Stage::Redelivery => match r.redelivery_outcome() {
            Some(RedeliveryOutcome::DeadLetter) => "dead-lettered",
            _ => "redelivery scheduled",
        },
        Stage::Duplicate => "duplicate upload suppressed",
    };
    let mut s = format!("{} {base}", r.stage);
    if let Some(a) = r.attempt {
        s.push_str(&format!(", attempt {a}"));
    }
    if let Some(o) = &r.outcome {
        if r.stage != Stage::Redelivery {
            s.push_str(&format!(": {o}"));
        }
    }
    if let Some(d) = &r.detail {
        s.push_str(&format!(" ({d})"));
    }
    if let Some(svc) = &r.service {
        s.push_str(&format!(" [{svc}]"));
    }
    s
}

const BAR: usize = 24;

fn bar(h: &HopSpan, t0: u64, span: u64) -> String {
    let pos = |t: u64| ((t.saturating_sub(t0)) as f64 / span.max(1) as f64 * BAR as f64) as usize;
    let a = pos(h.start).min(BAR - 1);
    let b = h.end.map(pos).unwrap_or(BAR).clamp(a + 1, BAR);
    let fill = if h.end.is_some() { '█' } else { '░' };
    let mut s = String::with_capacity(BAR * 3);
    for i in 0..BAR {
        s.push(if i >= a && i < b { fill } else { '·' });
    }
    s
}

/// The lines under a hop about clocks: impossible raw times, the arrival across two clocks
/// with its bound, the hop's own clock estimate and where a client-clock hop lies on the
/// broker's clock.
fn clock_notes(h: &HopSpan) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(why) = &h.impossible {
        notes.push(format!("! {why}: latency not shown"));
    }
    if let (Some(a), Some(b)) = (h.arrival_nanos, h.arrival_bound_nanos) {
        let after = match h.kind {
            HopKind::Store => "after the producer sent it (P1)",
            _ => "after the broker sent it (C1/C5)",
        };
        notes.push(format!("arrived {} {after}, across clocks", bounded(a, b)));
    }
    if let Some(c) = &h.clock {
        let vs = c.broker.as_ref().map(|b| format!(" vs broker {b}"));
        notes.push(format!(
            "clock of {}{}: {} ± {} against the broker's (this exchange, round trip {})",
            c.client,
            vs.unwrap_or_default(),
            signed(c.offset_nanos),
            ms(c.bound_nanos),
            ms(c.round_trip_nanos)
        ));
    }
    if let Some(c) = &h.on_broker_clock {
        let lat = c.end.map(|e| e.saturating_sub(c.start));
        notes.push(format!(
            "on the broker's clock: {} ± {}{}",
            clock(c.start),
            ms(c.bound_nanos),
            lat.map(|l| format!(", {}", ms(l))).unwrap_or_default()
        ));
    }
    notes
}

/// The best clock estimate per client, after the hops.
fn clocks_section(t: &Trajectory, st: &Style, o: &mut String) {
    if t.clocks.is_empty() {
        return;
    }
    o.push('\n');
    o.push_str(&st.bold("clocks"));
    o.push_str(&st.dim(" (client minus broker, best of the trajectory's exchanges)"));
    o.push('\n');
    for c in &t.clocks {
        let vs = c.broker.as_ref().map(|b| format!(", vs broker {b}"));
        o.push_str(&format!(
            "  {:<16} {} ± {}  round trip {}, {} exchange(s){}\n",
            c.client.as_str(),
            signed(c.offset_nanos),
            ms(c.bound_nanos),
            ms(c.round_trip_nanos),
            c.samples,
            vs.unwrap_or_default()
        ));
    }
}

/// The timeline of a trajectory, as printed by `msgtrail trace`: the header, one line per
/// hop with its records, the clocks, the consumer groups and the diagnosis.
pub(crate) fn render(t: &Trajectory, color: bool) -> String {
    let st = Style { on: color };
    let mut o = String::new();
    header_section(t, &st, &mut o);
    timeline_section(t, &st, &mut o);
    clocks_section(t, &st, &mut o);
    groups_section(t, &st, &mut o);
    diagnosis_section(t, &st, &mut o);
    o
}

/// The title, the message's facts, a same-request note, its attributes and its state.
fn header_section(t: &Trajectory, st: &Style, o: &mut String) {
    let title = match (&t.message_id, &t.request_id) {
        (Some(m), _) => format!("message {m}"),
        (None, Some(r)) => format!("upload {r} (no message id: the broker never answered)"),
        _ => "trajectory".to_owned(),
    };
    o.push_str(&st.bold(&title));
    o.push('\n');
    let mut facts = Vec::new();
    if let Some(tr) = &t.trace_id {
        facts.push(format!("trace {tr}"));
    }
    if let Some(tp) = &t.topic {
        facts.push(format!("topic {tp}"));
    }
    if let Some(p) = &t.producer {
        facts.push(format!("producer {p}"));
    }
    if let Some(r) = &t.request_id {
        facts.push(format!("request {r}"));
    }
    if let Some(n) = t.payload_size {
        facts.push(format!("{n} bytes"));
    }
    if t.upload_attempts > 1 {
        facts.push(format!("{} upload attempts", t.upload_attempts));
    }
    if t.duplicates > 0 {
        facts.push(format!("{} duplicate(s) suppressed", t.duplicates));
    }
    o.push_str(&st.dim(&facts.join(" · ")));
    o.push('\n');
    if let Some(line) = same_request_line(t) {
        o.push_str(&st.paint("33;1", &line));
        o.push('\n');
    }
    if !t.attrs.is_empty() {
        let a: Vec<String> = t.attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        o.push_str(&st.dim(&format!("attributes {}", a.join(" "))));
        o.push('\n');
    }
    o.push_str(&format!("state {}\n\n", st.state(t.state)));
}

/// One line per hop (time, offset, latency, a bar on the common time axis, status), with
/// its clock notes and records under it.
fn timeline_section(t: &Trajectory, st: &Style, o: &mut String) {
    let t0 = t.first_at;
    let t_end = t
        .hops
        .iter()
        .map(|h| h.end.unwrap_or(h.start))
        .chain(std::iter::once(t.last_at))
        .max()
        .unwrap_or(t0);
    let span = t_end.saturating_sub(t0);
    let label_w = t
        .hops
        .iter()
        .map(|h| hop_label(h).chars().count())
        .max()
        .unwrap_or(10);
    o.push_str(&st.dim(&format!(
        "{:<12}  {:>10}  {:<label_w$}  {:>9}  {:<BAR$}  status\n",
        "time", "offset", "hop", "latency", "timeline"
    )));
    for h in &t.hops {
        let latency = match (&h.impossible, h.latency_nanos) {
            (Some(_), _) => "?".to_owned(),
            (None, Some(l)) => ms(l),
            (None, None) => "…".to_owned(),
        };
        let status = match h.status {
            HopStatus::Ok => "ok".to_owned(),
            HopStatus::Error => "error".to_owned(),
            HopStatus::Incomplete => "incomplete".to_owned(),
        };
        let reason = h
            .reason
            .as_deref()
            .map(|r| format!("  {r}"))
            .unwrap_or_default();
        o.push_str(&format!(
            "{:<12}  {:>10}  {:<label_w$}  {:>9}  {}  {}{}\n",
            clock(h.start),
            format!("+{}", ms(h.start.saturating_sub(t0))),
            hop_label(h),
            latency,
            st.status(h.status, &bar(h, t0, span)),
            st.status(h.status, &status),
            st.status(h.status, &reason),
        ));
        for note in clock_notes(h) {
            o.push_str(&st.dim(&format!("{:<12}  {:>10}      {note}\n", "", "")));
        }
        for r in &h.events {
            o.push_str(&st.dim(&format!(
                "{:<12}  {:>10}      {}\n",
                clock(r.at),
                format!("+{}", ms(r.at.saturating_sub(t0))),
                describe(r)
            )));
        }
    }
}

/// Each consumer group's state, attempts, end-to-end latency and last error.
fn groups_section(t: &Trajectory, st: &Style, o: &mut String) {
    if !t.groups.is_empty() {
        o.push('\n');
        o.push_str(&st.bold("consumer groups"));
        o.push('\n');
        for g in &t.groups {
            let e2e = g
                .end_to_end_nanos
                .map(|e| format!(", end to end {}", ms(e)))
                .unwrap_or_default();
            let err = g
                .last_error
                .as_deref()
                .map(|e| format!(", last error: {e}"))
                .unwrap_or_default();
            o.push_str(&format!(
                "  {:<16} {}  {} attempt(s){e2e}{err}\n",
                g.group.as_str(),
                st.state(g.state),
                g.attempts
            ));
        }
    }
}

/// The diagnosis in words, and the failure point when there is one.
fn diagnosis_section(t: &Trajectory, st: &Style, o: &mut String) {
    o.push('\n');
    o.push_str(&st.bold("diagnosis"));
    o.push_str(": ");
    o.push_str(&t.diagnosis);
    o.push('\n');
    if let Some(f) = &t.failure {
        o.push_str(&st.paint("31;1", &format!("failure point: {f}")));
        o.push('\n');
    }
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
            r.group = Some(ClientId::new("billing").unwrap());
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
            clocks: vec![msgtrail_listener::WindowEstimate {
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
        n1.group = Some(ClientId::new("billing").unwrap());
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
