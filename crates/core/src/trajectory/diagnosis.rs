//! The plain-words account of a trajectory: one clause per step, in the order things
//! happened, joined by `; `. Runs last, on the finished [`Trajectory`] (hops, groups, state
//! and failure), and again when [`Trajectory::set_same_request`] names other uploads.
//!
//! Times are the broker's where a client's clock offset is known: a client's time is moved
//! onto the broker's clock (`≈ 12:00:01.003 ± 1.1 ms`), and a duration between a client's
//! time and a broker's says how uncertain it is (`≈ 4.0 ms ± 1.0 ms`). Without an offset the
//! raw times are used, as recorded.

use super::model::{HopKind, HopSpan, HopStatus, MessageState, Trajectory};
use crate::ids::MessageId;
use crate::time::{format_duration as latency_words, format_time_of_day as clock_words};

/// The clause saying that the request ID was stored as several messages (uploaded again
/// after the dedup window, a duplicate the broker no longer recognised), naming the others
/// in upload order.
fn same_request_clause(t: &Trajectory) -> Option<String> {
    if t.same_request.is_empty() {
        return None;
    }
    let req = t
        .request_id
        .as_ref()
        .map(|r| format!("request id {r}"))
        .unwrap_or_else(|| "its request id".to_owned());
    let n = t.same_request.len() + 1;
    let list = |ids: &[MessageId]| {
        ids.iter()
            .map(|m| m.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (before, after): (Vec<MessageId>, Vec<MessageId>) = t
        .same_request
        .iter()
        .partition(|m| t.message_id.is_some_and(|own| **m < own));
    Some(if before.is_empty() {
        format!(
            "duplicate after the dedup window: {req} was stored again as message {}: {n} messages",
            list(&after)
        )
    } else {
        let later = if after.is_empty() {
            String::new()
        } else {
            format!(", then as message {}", list(&after))
        };
        format!(
            "duplicate after the dedup window: {req} was stored before as message {}, and again as this one{later}: {n} messages",
            list(&before)
        )
    })
}

/// The plain-words account: one clause per step, joined by `; `.
pub(super) fn diagnose(t: &Trajectory) -> String {
    let mut parts: Vec<String> = Vec::new();
    upload_clauses(t, &mut parts);
    let delivers: Vec<&HopSpan> = t
        .hops
        .iter()
        .filter(|h| h.kind == HopKind::Deliver)
        .collect();
    for (i, d) in delivers.iter().enumerate() {
        // Each group's outcome after its last delivery.
        let last_of_group = !delivers[i + 1..]
            .iter()
            .any(|later| later.group == d.group && later.by_id == d.by_id);
        delivery_clauses(t, d, last_of_group, &mut parts);
    }
    if t.groups.is_empty() && t.state == MessageState::Enqueued {
        parts.push("not delivered yet".to_owned());
    }
    if let Some(f) = &t.failure {
        if !parts.iter().any(|p| p == f) {
            parts.push(f.clone());
        }
    }
    let s = parts.join("; ");
    if s.is_empty() {
        format!("state {}", t.state)
    } else {
        s
    }
}

/// The producer's send start on the broker's clock and its bound, when the producer's
/// clock offset is known (the send hop is placed on the broker's clock).
fn send_on_broker_clock(t: &Trajectory) -> Option<(u64, u64)> {
    let send = t.hop("send").filter(|s| !s.synthesized)?;
    send.on_broker_clock.map(|c| (c.start, c.bound_nanos))
}

/// A time of a client's clock moved onto the broker's, in words: `≈ 12:00:01.003 ± 1.1 ms`.
fn corrected_clock_words(at: u64, bound: u64) -> String {
    format!("≈ {} ± {}", clock_words(at), latency_words(bound))
}

/// A duration between a client's time (corrected, right within `bound`) and a broker's, in
/// words: `≈ 4.0 ms ± 1.0 ms`; exact when the bound is zero.
fn uncertain_duration_words(nanos: u64, bound: u64) -> String {
    if bound == 0 {
        latency_words(nanos)
    } else {
        format!("≈ {} ± {}", latency_words(nanos), latency_words(bound))
    }
}

/// Sent (by whom, how often), duplicates, the same request stored again, stored. The send
/// time is the producer's moved onto the broker's clock when its offset is known (then the
/// time to storing is a duration on one clock, uncertain by the offset's bound); else the
/// producer's raw time.
fn upload_clauses(t: &Trajectory, parts: &mut Vec<String>) {
    let send = t.hop("send");
    let corrected = send_on_broker_clock(t);
    if let Some(send) = send.filter(|s| !s.synthesized) {
        let who = t.producer.as_ref().map(|p| format!(" by {p}"));
        let tries = (t.upload_attempts > 1).then(|| format!(" ({} attempts)", t.upload_attempts));
        let when = match corrected {
            Some((at, bound)) => corrected_clock_words(at, bound),
            None => clock_words(send.start),
        };
        parts.push(format!(
            "sent{} {when}{}",
            who.unwrap_or_default(),
            tries.unwrap_or_default()
        ));
    }
    if t.duplicates > 0 {
        parts.push(format!("{} duplicate upload(s) suppressed", t.duplicates));
    }
    parts.extend(same_request_clause(t));
    match (t.hop("store"), send) {
        (Some(st), _) => match st.end {
            Some(end) => {
                let lat = send.filter(|s| !s.synthesized).map(|s| {
                    let l = match corrected {
                        Some((at, bound)) => {
                            uncertain_duration_words(end.saturating_sub(at), bound)
                        }
                        None => latency_words(end.saturating_sub(s.start)),
                    };
                    format!(" ({l} after sending)")
                });
                parts.push(format!(
                    "stored {}{}",
                    clock_words(end),
                    lat.unwrap_or_default()
                ));
            }
            None => parts.push(format!(
                "received by the broker {}, not stored",
                clock_words(st.start)
            )),
        },
        (None, send) => parts.extend(send.and_then(|s| s.reason.clone())),
    }
}

/// One delivery: to whom and when, the processing's trouble, the ack or why not, and the
/// group's end-to-end time after its last delivery.
fn delivery_clauses(t: &Trajectory, d: &HopSpan, last_of_group: bool, parts: &mut Vec<String>) {
    let corrected = send_on_broker_clock(t);
    let g = d.group.as_ref().map(|g| g.as_str()).unwrap_or("?");
    let c = d.consumer.as_ref().map(|c| c.as_str()).unwrap_or("?");
    let a = d.attempt.unwrap_or(1);
    let how = if d.by_id { " by message ID" } else { "" };
    parts.push(if a > 1 {
        format!(
            "redelivered to {g}/{c}{how}, attempt {a}, at {}",
            clock_words(d.start)
        )
    } else {
        format!("delivered to {g}/{c}{how} at {}", clock_words(d.start))
    });
    let process = t
        .hops
        .iter()
        .find(|h| h.kind == HopKind::Process && h.parent.as_ref() == Some(&d.key));
    parts.extend(
        process
            .filter(|p| p.status != HopStatus::Ok)
            .and_then(|p| p.reason.clone()),
    );
    match d.status {
        HopStatus::Ok => parts.push(format!(
            "acked after {}",
            latency_words(d.latency_nanos.unwrap_or(0))
        )),
        _ => parts.extend(d.reason.clone()),
    }
    let summary = t
        .groups
        .iter()
        .find(|s| Some(&s.group) == d.group.as_ref() && s.by_id == d.by_id);
    if let (true, Some(e)) = (last_of_group, summary.and_then(|s| s.end_to_end_nanos)) {
        // From the producer's send (its clock) to the broker's ack: on one clock when the
        // producer's offset is known.
        let words = match (corrected, summary.and_then(|s| s.acked_at)) {
            (Some((at, bound)), Some(acked)) => {
                uncertain_duration_words(acked.saturating_sub(at), bound)
            }
            _ => latency_words(e),
        };
        parts.push(format!("group {g} done {words} end to end"));
    }
}
