//! `msgtrail stats [--topic T] [--stream S] [--json]`: the listener's statistics as a table,
//! with observe mode's per-stream and per-consumer figures when the listener observes
//! streams.

use super::trace::ListenerArgs;
use crate::present::format_latency as ms;
use anyhow::Context;
use clap::Args as ClapArgs;
use msgtrail_core::trajectory::MessageState;
use msgtrail_listener_client::observed::ObservedStreamStats;
use msgtrail_listener_client::LatencyStats;
use msgtrail_listener_client::StatsSnapshot;

/// Options of `msgtrail stats`.
#[derive(Debug, ClapArgs)]
pub(crate) struct Args {
    /// Only the latencies of this topic.
    #[arg(long)]
    pub topic: Option<String>,
    /// Observe mode: only this observed stream's figures.
    #[arg(long)]
    pub stream: Option<String>,
    /// Print the statistics as JSON.
    #[arg(long)]
    pub json: bool,
    /// Where the listener is.
    #[command(flatten)]
    pub listener: ListenerArgs,
}

/// Fetches and prints the statistics.
pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let client = args.listener.client()?;
    let s = client
        .stats_of(args.topic.as_deref(), args.stream.as_deref())
        .await
        .context("query failed")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", render(&s));
    }
    Ok(())
}

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        String::new()
    } else {
        format!(" ({:.0}%)", part as f64 * 100.0 / whole as f64)
    }
}

fn lat(v: f64) -> String {
    ms((v * 1e6) as u64)
}

fn row(topic: &str, segment: &str, l: &LatencyStats) -> String {
    format!(
        "{topic:<20} {segment:<22} {:>7} {:>8.2} {:>9} {:>9} {:>9} {:>9}\n",
        l.count,
        l.rate_per_sec,
        lat(l.p50_ms),
        lat(l.p90_ms),
        lat(l.p99_ms),
        lat(l.max_ms)
    )
}

/// The statistics as printed by `msgtrail stats`.
pub(crate) fn render(s: &StatsSnapshot) -> String {
    let mut o = String::new();
    if let Some(t) = &s.topic {
        o.push_str(&format!(
            "topic {t} (no-match, refused channels, ingest and lag are for all topics)\n"
        ));
    }
    render_states(&mut o, s);
    render_counts(&mut o, s);
    o.push('\n');
    render_latency(&mut o, s);
    for st in &s.observed {
        o.push('\n');
        render_observed(&mut o, st, s.window_secs);
    }
    o
}

/// One observed stream: its counts, a row per consumer, then each consumer's queue wait
/// and ack time.
fn render_observed(o: &mut String, st: &ObservedStreamStats, window_secs: u64) {
    let states = state_line(&st.states);
    o.push_str(&format!(
        "observed stream {}  stored {} · stuck {} · unacked {} · by state: {}\n",
        st.stream,
        st.stored,
        st.stuck,
        st.unacked,
        if states.is_empty() {
            "none yet".to_owned()
        } else {
            states.join(" · ")
        }
    ));
    if st.consumers.is_empty() {
        o.push_str("  no durable consumer yet\n");
        return;
    }
    o.push_str(&format!(
        "  {:<18} {:>10} {:>12} {:>6} {:>6} {:>6} {:>8} {:>9} {:>8} {:>8} {:>9}\n",
        "consumer",
        "deliveries",
        "redelivered",
        "acks",
        "naks",
        "terms",
        "max-dlv",
        "ack-wait",
        "unacked",
        "pending",
        "ack-floor"
    ));
    let dash = || "–".to_owned();
    for c in &st.consumers {
        let now = c.now.as_ref();
        o.push_str(&format!(
            "  {:<18} {:>10} {:>12} {:>6} {:>6} {:>6} {:>8} {:>9} {:>8} {:>8} {:>9}\n",
            c.consumer,
            c.deliveries,
            c.redeliveries,
            c.acks,
            c.naks,
            c.terms,
            c.max_deliveries,
            c.ack_wait_expired,
            now.map(|n| n.unacked.to_string()).unwrap_or_else(dash),
            now.map(|n| n.pending.to_string()).unwrap_or_else(dash),
            now.map(|n| n.ack_floor_stream_seq.to_string())
                .unwrap_or_else(dash),
        ));
        for (why, n) in &c.term_reasons {
            let why = if why.is_empty() { "(no reason)" } else { why };
            o.push_str(&format!("    term {why:?} {n}\n"));
        }
    }
    o.push_str(&format!(
        "  latency over the last {window_secs} s (since start below each): queue wait = stored → first delivery, ack time = delivery → ack\n"
    ));
    o.push_str(&format!(
        "{:<20} {:<22} {:>7} {:>8} {:>9} {:>9} {:>9} {:>9}\n",
        "  consumer", "", "count", "rate/s", "p50", "p90", "p99", "max"
    ));
    for c in &st.consumers {
        for (kind, l) in [("queue wait", &c.queue_wait), ("ack time", &c.ack_time)] {
            if l.total.count == 0 {
                continue;
            }
            o.push_str(&row(&format!("  {}", c.consumer), kind, &l.window));
            o.push_str(&row("", "  since start", &l.total));
        }
    }
}

/// "x 3 · y 4" for the states a count map has, in lifecycle order.
fn state_line(states: &std::collections::BTreeMap<MessageState, u64>) -> Vec<String> {
    MessageState::ALL
        .iter()
        .filter_map(|st| states.get(st).map(|n| format!("{st} {n}")))
        .collect()
}

/// Messages by state, and per topic when there are several.
fn render_states(o: &mut String, s: &StatsSnapshot) {
    let states = state_line(&s.states);
    o.push_str(&format!(
        "messages by state   {}\n",
        if states.is_empty() {
            "none yet".to_owned()
        } else {
            states.join(" · ")
        }
    ));
    if s.topics.len() > 1 {
        for (topic, states) in &s.topics {
            let topic = if topic.is_empty() { "?" } else { topic };
            o.push_str(&format!(
                "  {topic:<17} {}\n",
                state_line(states).join(" · ")
            ));
        }
    }
}

/// The funnel, the events, ingest, lag and retention lines.
fn render_counts(o: &mut String, s: &StatsSnapshot) {
    let f = &s.funnel;
    o.push_str(&format!(
        "funnel              sent {} → stored {}{} → delivered {}{} → acked {}{}\n",
        f.sent,
        f.stored,
        pct(f.stored, f.sent),
        f.delivered,
        pct(f.delivered, f.sent),
        f.acked,
        pct(f.acked, f.sent)
    ));
    let e = &s.events;
    o.push_str(&format!(
        "events              stuck {} · lost {} · duplicates {} · redeliveries {} · dead letters {} · no-match {} · refused channels {}\n",
        s.states.get(&MessageState::Stuck).copied().unwrap_or(0),
        s.states.get(&MessageState::Lost).copied().unwrap_or(0),
        e.duplicates,
        e.redeliveries,
        e.dead_letters,
        e.no_match,
        e.channels_refused
    ));
    let i = &s.ingest;
    o.push_str(&format!(
        "ingest              {} records · {} repeated (skipped) · {} undecodable batches dropped · {} store errors\n",
        i.records, i.repeated_records, i.decode_errors, i.store_errors
    ));
    o.push_str(&format!(
        "lag                 {} pending · {} being applied · last batch {} old\n",
        s.lag.pending,
        s.lag.ack_pending,
        s.lag.last_lag_ms.map(lat).unwrap_or_else(|| "–".to_owned())
    ));
    if e.retention_deleted > 0 {
        o.push_str(&format!(
            "retention           {} messages deleted\n",
            e.retention_deleted
        ));
    }
}

/// The latency table: per topic and segment, the window's figures and, below, since start.
fn render_latency(o: &mut String, s: &StatsSnapshot) {
    if s.latency.is_empty() {
        o.push_str("no latency samples yet\n");
        return;
    }
    o.push_str(&format!(
        "latency over the last {} s (since start below each)\n",
        s.window_secs
    ));
    o.push_str(&format!(
        "{:<20} {:<22} {:>7} {:>8} {:>9} {:>9} {:>9} {:>9}\n",
        "topic", "segment", "count", "rate/s", "p50", "p90", "p99", "max"
    ));
    for r in &s.latency {
        let topic = if r.topic.is_empty() { "?" } else { &r.topic };
        o.push_str(&row(topic, r.segment.as_str(), &r.window));
        o.push_str(&row("", "  since start", &r.total));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use msgtrail_core::trajectory::Segment;
    use msgtrail_listener_client::{Funnel, LatencyRow};

    #[test]
    fn table_shows_states_funnel_and_latencies() {
        let mut s = StatsSnapshot {
            window_secs: 300,
            funnel: Funnel {
                sent: 4,
                stored: 4,
                delivered: 3,
                acked: 2,
            },
            ..Default::default()
        };
        s.states.insert(MessageState::Consumed, 2);
        s.states.insert(MessageState::Stuck, 1);
        s.latency.push(LatencyRow {
            topic: "orders".into(),
            segment: Segment::EndToEnd,
            window: LatencyStats {
                count: 2,
                rate_per_sec: 0.5,
                p50_ms: 12.0,
                p90_ms: 40.0,
                p99_ms: 41.0,
                max_ms: 41.0,
                mean_ms: 26.5,
            },
            total: LatencyStats::default(),
        });
        let out = render(&s);
        assert!(out.contains("consumed 2 · stuck 1"), "{out}");
        assert!(out.contains("acked 2 (50%)"), "{out}");
        assert!(out.contains("stuck 1 · lost 0"), "{out}");
        assert!(out.contains("end_to_end"), "{out}");
        assert!(out.contains("12 ms"), "{out}");
        assert!(!out.contains("observed stream"), "{out}");
    }

    #[test]
    fn observed_streams_show_each_consumer() {
        use msgtrail_listener_client::observed::{ConsumerNow, ObservedConsumerStats};
        let mut c = ObservedConsumerStats {
            consumer: "billing".into(),
            deliveries: 7,
            redeliveries: 3,
            acks: 2,
            naks: 1,
            terms: 1,
            max_deliveries: 1,
            ack_wait_expired: 2,
            now: Some(ConsumerNow {
                unacked: 5,
                pending: 9,
                ack_floor_stream_seq: 4,
                ..Default::default()
            }),
            ..Default::default()
        };
        c.term_reasons.insert("bad input".into(), 1);
        c.ack_time.total.count = 2;
        c.ack_time.total.p99_ms = 41.0;
        let mut st = ObservedStreamStats {
            stream: "ORDERS".into(),
            stored: 4,
            stuck: 1,
            unacked: 5,
            consumers: vec![c],
            ..Default::default()
        };
        st.states.insert(MessageState::Stuck, 1);
        let s = StatsSnapshot {
            window_secs: 300,
            observed: vec![st],
            ..Default::default()
        };
        let out = render(&s);
        assert!(
            out.contains(
                "observed stream ORDERS  stored 4 · stuck 1 · unacked 5 · by state: stuck 1"
            ),
            "{out}"
        );
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with("billing "))
            .unwrap();
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            cells,
            ["billing", "7", "3", "2", "1", "1", "1", "2", "5", "9", "4"]
        );
        assert!(out.contains("term \"bad input\" 1"), "{out}");
        assert!(out.contains("ack time"), "{out}");
        assert!(out.contains("41 ms"), "{out}");
        assert!(
            !out.contains("queue wait  "),
            "no queue-wait row without samples: {out}"
        );
    }
}
