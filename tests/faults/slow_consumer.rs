//! Scenario 9: consumers slower than the group's ack wait. The broker runs with `--ack-wait
//! 1s --max-deliver 3`; two consumers of the group process each delivery in its own task,
//! some of them for longer than the ack wait, so JetStream redelivers them (to either
//! consumer) while the first delivery is still being processed, and its ack comes late.
//!
//! Messages by their load index `i` (the payload's `order`):
//! - `i % 5 == 0`, **always slow**: every delivery takes 1.5 × the ack wait, then acks;
//! - `i % 5 in {1, 2}`, **slow once**: the first delivery takes 1.5 × the ack wait, later
//!   ones are fast;
//! - `i % 20 == 9`, **hung**: every delivery takes (max deliver + 1) × the ack wait;
//! - the others are fast.
//!
//! An ack after its delivery's ack wait is refused (`delivery_expired`, RELIABILITY.md finding 7):
//! so a slow-once message is consumed through a later, fast delivery, and an always-slow or
//! hung one is dead-lettered after its last delivery, every ack of it refused. The scenario
//! asserts that no ack answered ok is late (its message delivered again afterwards) and that
//! no dead-lettered message had an ack answered ok.

use crate::harness::*;
use crate::TRAJECTORY_WAIT;
use msgtrail_client::Received;
use msgtrail_core::trajectory::{MessageState, Trajectory};
use msgtrail_core::{MessageId, Stage};
use serde_json::json;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The group's ack wait in this scenario.
const ACK_WAIT_MS: u64 = 1000;
/// Deliveries before JetStream gives up on a message.
const MAX_DELIVER: u32 = 3;
/// Handler tasks in flight per consumer.
const IN_FLIGHT: usize = 16;
/// How long the consumers keep fetching after the last message was settled, to see any late
/// redelivery.
const QUIET: Duration = Duration::from_secs(3);

/// How a message's handler behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Class {
    Fast,
    SlowOnce,
    AlwaysSlow,
    Hung,
}

impl Class {
    fn of(order: u64) -> Class {
        if order % 20 == 9 {
            Class::Hung
        } else if order.is_multiple_of(5) {
            Class::AlwaysSlow
        } else if order % 5 == 1 || order % 5 == 2 {
            Class::SlowOnce
        } else {
            Class::Fast
        }
    }

    /// How long the handler takes on delivery `attempt`.
    fn work(self, attempt: u32) -> Duration {
        let ms = match self {
            Class::Fast => 0,
            Class::SlowOnce if attempt > 1 => 0,
            Class::SlowOnce | Class::AlwaysSlow => ACK_WAIT_MS * 3 / 2,
            Class::Hung => ACK_WAIT_MS * (u64::from(MAX_DELIVER) + 1),
        };
        Duration::from_millis(ms)
    }

    fn name(self) -> &'static str {
        match self {
            Class::Fast => "fast",
            Class::SlowOnce => "slow_once",
            Class::AlwaysSlow => "always_slow",
            Class::Hung => "hung",
        }
    }
}

/// What the consumers saw of one message.
#[derive(Debug, Clone, Default)]
struct Seen {
    class: Option<Class>,
    /// Delivery attempts received (by either consumer).
    attempts: Vec<u32>,
    /// Attempts whose ack the broker answered ok.
    acked: Vec<u32>,
    /// Attempts whose ack the broker refused as `delivery_expired`.
    expired: Vec<u32>,
    /// Acks that failed otherwise (code or error text).
    other_failures: Vec<String>,
    /// When the first ack was answered ok, or when the last delivery was received.
    last_event: Option<Instant>,
}

/// Shared by the two consumers.
#[derive(Debug, Default)]
struct Deliveries {
    by_id: Mutex<HashMap<MessageId, Seen>>,
    last_delivery: Mutex<Option<Instant>>,
}

fn order_of(m: &Received) -> u64 {
    serde_json::from_slice::<serde_json::Value>(&m.payload)
        .ok()
        .and_then(|v| v["order"].as_u64())
        .unwrap_or(u64::MAX)
}

/// Handles one delivery: works as long as its class says, then acks (recorded in `history`).
async fn handle(
    c: msgtrail_client::Consumer,
    m: Received,
    seen: Arc<Deliveries>,
    history: Arc<History>,
) {
    let class = Class::of(order_of(&m));
    let (mid, attempt) = (m.message_id, m.delivery_attempt);
    {
        let mut by_id = seen.by_id.lock().unwrap();
        let s = by_id.entry(mid).or_default();
        s.class = Some(class);
        s.attempts.push(attempt);
        s.last_event = Some(Instant::now());
    }
    *seen.last_delivery.lock().unwrap() = Some(Instant::now());
    let work = class.work(attempt);
    let start = Instant::now();
    let result = c
        .process(m, move |_| async move {
            tokio::time::sleep(work).await;
            Ok::<(), String>(())
        })
        .await;
    let outcome = match &result {
        Ok(_) => Outcome::Ok,
        Err(e) if e.is_delivery_expired() => Outcome::Fail(e.to_string()),
        Err(e) => Outcome::Unknown(e.to_string()),
    };
    history_push(&history, mid, start, outcome.clone());
    let mut by_id = seen.by_id.lock().unwrap();
    let s = by_id.entry(mid).or_default();
    match outcome {
        Outcome::Ok => {
            s.acked.push(attempt);
            s.last_event = Some(Instant::now());
        }
        Outcome::Fail(_) => s.expired.push(attempt),
        Outcome::Unknown(e) => s.other_failures.push(e),
    }
}

fn history_push(history: &History, mid: MessageId, start: Instant, outcome: Outcome) {
    history.record("ack", mid.to_string(), start, outcome);
}

/// One consumer: fetches while fewer than [`IN_FLIGHT`] of its handlers run, each delivery in
/// its own task, until `done`.
async fn consume(
    c: msgtrail_client::Consumer,
    seen: Arc<Deliveries>,
    history: Arc<History>,
    done: Arc<std::sync::atomic::AtomicBool>,
) {
    let sub = subscription();
    let mut tasks: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    while !done.load(Ordering::SeqCst) {
        tasks.retain(|t| !t.is_finished());
        let room = IN_FLIGHT.saturating_sub(tasks.len());
        if room == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let start = Instant::now();
        match c.fetch(&sub, room as u32, Duration::from_millis(200)).await {
            Ok(batch) => {
                history.record("fetch", String::new(), start, Outcome::Ok);
                for m in batch {
                    tasks.push(tokio::spawn(handle(
                        c.clone(),
                        m,
                        seen.clone(),
                        history.clone(),
                    )));
                }
            }
            Err(e) => {
                history.record(
                    "fetch",
                    String::new(),
                    start,
                    Outcome::Unknown(e.to_string()),
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// The R1 records of a trajectory's group `GROUP`: (redeliveries, dead letters).
fn r1_counts(t: &Trajectory) -> (usize, usize) {
    let mut seen = HashSet::new();
    let (mut redeliver, mut dead) = (0, 0);
    let records = t
        .hops
        .iter()
        .flat_map(|h| h.events.iter())
        .chain(t.other_records.iter());
    for r in records {
        if r.stage != Stage::Redelivery || r.group.as_ref().map(|g| g.as_str()) != Some(GROUP) {
            continue;
        }
        if !seen.insert((r.attempt, r.outcome.clone())) {
            continue;
        }
        match r.outcome.as_deref() {
            Some("dead_letter") => dead += 1,
            _ => redeliver += 1,
        }
    }
    (redeliver, dead)
}

/// What a message's trajectory must show, given what the consumers saw; empty: it does.
fn judge(t: &Trajectory, seen: &Seen) -> Vec<String> {
    let mut out = missing(t, false);
    let Some(g) = t.groups.iter().find(|g| g.group.as_str() == GROUP) else {
        out.push(format!("no group {GROUP}"));
        return out;
    };
    let max_seen = seen.attempts.iter().copied().max().unwrap_or(0);
    if g.attempts < max_seen {
        out.push(format!(
            "{} attempts in the trajectory, {max_seen} delivered",
            g.attempts
        ));
    }
    let (redeliver, dead) = r1_counts(t);
    if max_seen > 1 && redeliver + dead == 0 {
        out.push(format!("delivered {max_seen} times, no R1 record"));
    }
    match seen.class {
        // Every delivery outlasts the ack wait, so every ack is refused: dead-lettered once
        // the last delivery's ack wait ran out, never consumed.
        Some(Class::Hung | Class::AlwaysSlow) => {
            if dead == 0 || g.state != MessageState::DeadLettered {
                out.push(format!(
                    "a message whose every ack came too late is {}, not dead-lettered ({dead} \
                     dead-letter records)",
                    g.state
                ));
            }
        }
        _ => {
            if g.state != MessageState::Consumed || g.acked_at.is_none() {
                out.push(format!("group {GROUP} is {}, not consumed", g.state));
            }
        }
    }
    out
}

/// The scenario: uploads first (no consumer), then two slow consumers until every message
/// was settled and nothing came back for [`QUIET`].
pub(crate) async fn slower_than_ack_wait(scenario: &str) {
    let scale = Scale::pick(60, 300);
    for rep in 1..=scale.reps {
        let sys = System::start(SystemOptions {
            brokers: 1,
            broker_args: vec![
                "--ack-wait".into(),
                format!("{ACK_WAIT_MS}ms"),
                "--max-deliver".into(),
                MAX_DELIVER.to_string(),
            ],
            ..Default::default()
        })
        .await;
        let uploaded = run_load(
            &sys,
            Load {
                consume: false,
                ..Load::new(scale.messages)
            },
        )
        .await
        .finish()
        .await;
        let uploads = uploaded.progress.uploads.lock().unwrap().clone();
        let history = uploaded.history.clone();
        let seen = Arc::new(Deliveries::default());
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let consumers = [sys.consumer().await, sys.consumer().await];
        let started = Instant::now();
        let tasks: Vec<_> = consumers
            .iter()
            .map(|c| {
                tokio::spawn(consume(
                    c.clone(),
                    seen.clone(),
                    history.clone(),
                    done.clone(),
                ))
            })
            .collect();
        let deadline = started + Duration::from_secs(if scale.long { 180 } else { 60 });
        let ids: HashSet<MessageId> = uploads.values().map(|a| a.message_id).collect();
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let settled = {
                let by_id = seen.by_id.lock().unwrap();
                ids.iter().all(|m| {
                    by_id.get(m).is_some_and(|s| {
                        !s.acked.is_empty() || s.attempts.len() >= MAX_DELIVER as usize
                    })
                })
            };
            let quiet = seen
                .last_delivery
                .lock()
                .unwrap()
                .is_none_or(|t| t.elapsed() > QUIET);
            if (settled && quiet) || Instant::now() > deadline {
                break;
            }
        }
        done.store(true, Ordering::SeqCst);
        for t in tasks {
            t.await.expect("consumer task");
        }
        let consumed_in_ms = started.elapsed().as_millis() as u64;
        for c in consumers {
            let _ = tokio::time::timeout(Duration::from_secs(10), c.close()).await;
        }
        // The oracle: the stream, then every trajectory against what the consumers saw.
        let stored = drain_messages(&sys.admin).await;
        let stream = judge_stream(&uploads, &stored);
        let by_id = seen.by_id.lock().unwrap().clone();
        let client = sys.listener_client();
        let wait_until = Instant::now() + TRAJECTORY_WAIT;
        let mut incomplete = BTreeMap::new();
        let mut states: BTreeMap<String, usize> = BTreeMap::new();
        let mut per_class: BTreeMap<&str, serde_json::Value> = BTreeMap::new();
        let mut class_counts: BTreeMap<Class, (usize, usize, usize, usize, u32)> = BTreeMap::new();
        let (mut hung_acked_ok, mut hung_diagnosis) = (0, None);
        let mut dead_lettered_acks_not_refused = 0;
        for a in uploads.values() {
            let s = by_id.get(&a.message_id).cloned().unwrap_or_default();
            let (verdict, traj) = loop {
                let (v, t) = match client.trajectory(&a.message_id.to_string(), None).await {
                    Ok(t) => (judge(&t, &s), Some(t)),
                    Err(e) => (vec![e.to_string()], None),
                };
                if v.is_empty() || Instant::now() > wait_until {
                    break (v, t);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            let class = s.class.unwrap_or(Class::Fast);
            let e = class_counts.entry(class).or_default();
            e.0 += 1;
            if let Some(t) = &traj {
                let g = t.groups.iter().find(|g| g.group.as_str() == GROUP);
                let state = g.map(|g| g.state.to_string()).unwrap_or("none".into());
                *states.entry(state).or_default() += 1;
                let (redeliver, dead) = r1_counts(t);
                if redeliver > 0 {
                    e.1 += 1;
                }
                if dead > 0 {
                    e.2 += 1;
                }
                if g.is_some_and(|g| g.state == MessageState::Consumed) {
                    e.3 += 1;
                }
                e.4 = e.4.max(g.map(|g| g.attempts).unwrap_or(0));
            }
            let dead_lettered = traj.as_ref().is_some_and(|t| r1_counts(t).1 > 0);
            if dead_lettered && !s.acked.is_empty() {
                hung_acked_ok += 1;
                if hung_diagnosis.is_none() {
                    hung_diagnosis = traj.as_ref().map(|t| t.diagnosis.clone());
                }
            }
            if dead_lettered && s.expired.len() < s.attempts.len() {
                dead_lettered_acks_not_refused += 1;
            }
            if !verdict.is_empty() {
                incomplete.insert(a.message_id.to_string(), verdict);
            }
        }
        for (class, (n, redelivered, dead, consumed, max_attempts)) in &class_counts {
            per_class.insert(
                class.name(),
                json!({"messages": n, "redelivered": redelivered, "dead_lettered": dead,
                       "consumed": consumed, "max_attempts": max_attempts}),
            );
        }
        let deliveries: usize = by_id.values().map(|s| s.attempts.len()).sum();
        let late_acks: usize = by_id
            .values()
            .map(|s| {
                let last = s.attempts.iter().copied().max().unwrap_or(0);
                s.acked.iter().filter(|a| **a < last).count()
            })
            .sum();
        let never_acked = ids
            .iter()
            .filter(|m| by_id.get(m).is_none_or(|s| s.acked.is_empty()))
            .count();
        let redelivered = by_id.values().filter(|s| s.attempts.len() > 1).count();
        let acks_refused_expired: usize = by_id.values().map(|s| s.expired.len()).sum();
        let other_ack_failures: Vec<String> = by_id
            .values()
            .flat_map(|s| s.other_failures.iter().cloned())
            .collect();
        let (a_ok, a_fail, a_unknown) = history.counts("ack");
        let mut r = Report::bare(scenario, &scale, rep);
        r.set("messages", json!(scale.messages))
            .set(
                "fault",
                json!(format!(
                    "two consumers slower than the ack wait ({ACK_WAIT_MS} ms, max deliver \
                     {MAX_DELIVER}): handlers of 1.5× and {}× the ack wait",
                    MAX_DELIVER + 1
                )),
            )
            .set("acked", json!(uploads.len()))
            .set(
                "given_up",
                json!(uploaded.progress.given_up.lock().unwrap().len()),
            )
            .set("lost", json!(stream.lost.len()))
            .set("duplicated", json!(stream.duplicated))
            .set("mismatched", json!(stream.mismatched.len()))
            .set("incomplete", json!(incomplete.len()))
            .set("deliveries", json!(deliveries))
            .set("redelivered_messages", json!(redelivered))
            .set("late_acks_answered_ok", json!(late_acks))
            .set("never_acked", json!(never_acked))
            .set(
                "ack_calls",
                json!({"ok": a_ok, "fail": a_fail, "unknown": a_unknown}),
            )
            .set("acks_refused_delivery_expired", json!(acks_refused_expired))
            .set("other_ack_failures", json!(other_ack_failures))
            .set("group_states", json!(states))
            .set("dead_lettered_yet_ack_answered_ok", json!(hung_acked_ok))
            .set(
                "dead_lettered_with_an_ack_not_refused",
                json!(dead_lettered_acks_not_refused),
            )
            .set("dead_lettered_diagnosis", json!(hung_diagnosis))
            .set("by_class", json!(per_class))
            .set("settled_after_ms", json!(consumed_in_ms));
        if !incomplete.is_empty() {
            let sample: BTreeMap<_, _> = incomplete.iter().take(5).collect();
            r.set("incomplete_sample", json!(sample));
        }
        let warnings = sys.logged_warnings(8);
        if !warnings.is_empty() {
            let w: serde_json::Map<String, serde_json::Value> =
                warnings.into_iter().map(|(k, n)| (k, json!(n))).collect();
            r.set("logged_warnings", serde_json::Value::Object(w));
        }
        r.print();
        r.assert_sound(true, &sys);
        assert!(
            redelivered > 0,
            "no delivery came back: the handlers were not slower than the ack wait"
        );
        // Finding 7: a late ack is refused, never answered ok.
        assert_eq!(
            late_acks, 0,
            "acks answered ok although their message was delivered again"
        );
        assert_eq!(
            hung_acked_ok, 0,
            "dead-lettered messages whose ack was answered ok"
        );
        assert_eq!(
            dead_lettered_acks_not_refused, 0,
            "dead-lettered messages with an ack not refused as delivery_expired"
        );
        assert!(
            acks_refused_expired > 0,
            "no ack was refused as delivery_expired"
        );
        assert!(
            other_ack_failures.is_empty(),
            "acks failed otherwise: {other_ack_failures:?}"
        );
    }
}
