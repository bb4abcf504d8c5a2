//! A trajectory as text: the header, each hop against a time bar with its records, the
//! clock notes, the groups and the diagnosis, with ANSI styles when colour is on.

use super::*;

/// ANSI styles, or nothing.
pub(super) struct Style {
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

pub(super) fn hop_label(h: &HopSpan) -> String {
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

pub(super) const BAR: usize = 24;

pub(super) fn bar(h: &HopSpan, t0: u64, span: u64) -> String {
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
pub(super) fn clock_notes(h: &HopSpan) -> Vec<String> {
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
pub(super) fn clocks_section(t: &Trajectory, st: &Style, o: &mut String) {
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
pub(super) fn header_section(t: &Trajectory, st: &Style, o: &mut String) {
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
pub(super) fn timeline_section(t: &Trajectory, st: &Style, o: &mut String) {
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
pub(super) fn groups_section(t: &Trajectory, st: &Style, o: &mut String) {
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
pub(super) fn diagnosis_section(t: &Trajectory, st: &Style, o: &mut String) {
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
