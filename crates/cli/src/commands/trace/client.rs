//! `msgtrail trace --client`: a client's clock offsets per broker instance and its
//! events (no-match notices N1, channel events A1).

use super::*;

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
pub(super) fn broker_words(b: Option<&msgtrail_core::BrokerInstance>) -> String {
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
