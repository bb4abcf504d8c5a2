//! The fault-injection suite: msgtrail under one fault at a time, Jepsen-style.
//!
//! Each scenario starts its own nats-server(s) on free loopback ports, brokers and a
//! listener as **real child processes** of the built `msgtrail` binary (the suite runs
//! `cargo build -p msgtrail-cli` once, or uses `$MSGTRAIL_BIN`), runs a bounded workload with
//! the Rust SDK (uploads retried with the same request ID until acked; a pull consumer group
//! that processes and acks), records every client call as ok / fail / unknown, injects ONE
//! fault, and then asks an oracle that reads the streams on its own:
//! - `MSGTRAIL_MESSAGES`, drained with a fresh ordered consumer: every acked upload is stored
//!   exactly once (lost = 0, duplicated = 0, by request ID), under the message ID it was
//!   acked with;
//! - the listener's `GET /api/messages/<id>` for every acked message: complete = a real store
//!   hop (P2 and P3, not inferred) and, for a consumed message, the group's acknowledged
//!   delivery.
//!
//! Each scenario prints its figures as one JSON line on stdout (`-- --nocapture` shows them;
//! `MSGTRAIL_FAULTS_REPORT=<file>` also appends them to a file). The short variant runs in
//! `cargo test`; `MSGTRAIL_FAULTS_LONG=1` runs more messages, three times. RELIABILITY.md
//! describes the scenarios and holds the latest results.

#[path = "faults/full_disk.rs"]
mod full_disk;
#[path = "faults/garbage.rs"]
mod garbage;
#[path = "faults/group.rs"]
mod group;
#[path = "faults/harness.rs"]
mod harness;
#[path = "faults/otlp.rs"]
mod otlp;
#[path = "faults/partitions.rs"]
mod partitions;
#[path = "faults/paused_consumer.rs"]
mod paused_consumer;
#[path = "faults/pauses.rs"]
mod pauses;
#[path = "faults/permissions.rs"]
mod permissions;
#[path = "faults/skew.rs"]
mod skew;
#[path = "faults/slow_consumer.rs"]
mod slow_consumer;

use futures::StreamExt;
use harness::*;
use msgtrail_client::{Outgoing, ProducerOptions};
use msgtrail_core::decode_batch;
use msgtrail_core::subjects::{self, MESSAGE_STREAM, STAGE_STREAM};
use msgtrail_core::trajectory::HopKind;
use msgtrail_core::{RequestId, Stage};
use serde_json::json;
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

const FLOOD_FAULT: &str = "malformed bodies, bad frames, unknown channels, forged reports, \
bad opens on every msgtrail.v1 subject";
const DEDUP_FAULT: &str = "broker --dedup-window 1s; a quarter of the uploads retried with \
the same request ID 3 s later";
const DEDUP_GAP: &str = "bug 3: a retry past the dedup window is stored again under a new \
message ID, and no trajectory says so";

/// How long the oracle waits for every trajectory to be complete. After a listener restart
/// too: what the killed listener had fetched and not acked comes back after its ack wait (5 s
/// since the listener's restart stall was fixed; 30 s before, which made the catch-up take 30 s).
const TRAJECTORY_WAIT: Duration = Duration::from_secs(30);

/// Drains the message stream and reads the trajectories of `finished`'s acked uploads; adds
/// what the brokers and the listener logged as warnings.
async fn oracle(
    sys: &System,
    scenario: &str,
    scale: &Scale,
    rep: usize,
    finished: &Finished,
    wait: Duration,
) -> Report {
    let stored = drain_messages(&sys.admin).await;
    let uploads = finished.progress.uploads.lock().unwrap().clone();
    let mut consumed = finished.progress.consumed_ids.lock().unwrap().clone();
    // An ack that timed out and whose retry was refused `delivery_expired` must have been
    // applied unless the message came back (and then it was consumed): either way the
    // trajectory must show the group's ack (finding 8).
    let ambiguous = finished.progress.ack_ambiguous.lock().unwrap().clone();
    let ambiguous_unconsumed = ambiguous.iter().filter(|m| !consumed.contains(m)).count();
    consumed.extend(ambiguous.iter().copied());
    let stream = judge_stream(&uploads, &stored);
    let mut traj = judge_trajectories(&sys.listener_client(), &uploads, &consumed, wait).await;
    // Known limit (RELIABILITY.md, finding 8): an ack JetStream applied while the broker's
    // confirmation of it was lost (answered unknown, never redelivered) has no ack record
    // C4/C8. Such a trajectory is complete but for that record and its group's delivery is
    // there: counted on its own, never mistaken for any other gap.
    let never_redelivered: HashSet<String> = ambiguous
        .iter()
        .filter(|m| !finished.progress.consumed_ids.lock().unwrap().contains(m))
        .map(|m| m.to_string())
        .collect();
    let without_ack_record: Vec<String> = traj
        .incomplete
        .keys()
        .filter(|mid| never_redelivered.contains(*mid))
        .filter(|mid| {
            traj.trajectories.get(*mid).is_some_and(|t| {
                missing(t, false).is_empty()
                    && t.hops.iter().any(|h| {
                        h.kind == HopKind::Deliver
                            && h.group.as_ref().is_some_and(|g| g.as_str() == GROUP)
                    })
            })
        })
        .cloned()
        .collect();
    for mid in &without_ack_record {
        traj.incomplete.remove(mid);
    }
    let mut r = Report::new(scenario, scale, rep, finished, &stream, &traj);
    if !ambiguous.is_empty() {
        r.set("acks_ambiguous", json!(ambiguous.len()))
            .set(
                "acks_ambiguous_never_redelivered",
                json!(ambiguous_unconsumed),
            )
            .set(
                "acks_ambiguous_without_ack_record",
                json!(without_ack_record.len()),
            );
    }
    explain_incomplete(sys, &traj, &mut r).await;
    let warnings = sys.logged_warnings(8);
    if !warnings.is_empty() {
        let warnings: serde_json::Map<String, serde_json::Value> =
            warnings.into_iter().map(|(k, n)| (k, json!(n))).collect();
        r.set("logged_warnings", serde_json::Value::Object(warnings));
    }
    r
}

/// For the first incomplete trajectories: which stage codes the stage stream itself holds
/// for the message (absent there: the records never left the process that had them).
async fn explain_incomplete(sys: &System, traj: &TrajectoryVerdict, r: &mut Report) {
    if traj.incomplete.is_empty() {
        return;
    }
    let records = stage_records(&sys.admin).await;
    let mut out = BTreeMap::new();
    for mid in traj.incomplete.keys().take(5) {
        let mut codes: Vec<&str> = records
            .iter()
            .filter(|r| r.message_id.is_some_and(|m| m.to_string() == *mid))
            .map(|r| r.stage.code())
            .collect();
        codes.sort();
        codes.dedup();
        out.insert(mid.clone(), codes.join(" "));
    }
    r.set("incomplete_stage_stream_has", json!(out));
}

/// Every stage record in the stage stream (read directly, not through the listener).
pub(crate) async fn stage_records(client: &async_nats::Client) -> Vec<msgtrail_core::StageRecord> {
    let js = async_nats::jetstream::new(client.clone());
    let Ok(mut stream) = js.get_stream(STAGE_STREAM).await else {
        return vec![];
    };
    let last = stream
        .info()
        .await
        .map(|i| i.state.last_sequence)
        .unwrap_or(0);
    let mut out = vec![];
    for seq in 1..=last {
        if let Ok(m) = stream.direct_get(seq).await {
            out.extend(decode_batch(&m.payload).unwrap_or_default());
        }
    }
    out
}

/// Runs `f` without holding up the runtime's other tasks (process starts block).
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

// ---------------------------------------------------------------------------------------
// 1. A broker killed with SIGKILL mid-load; the SDK's retries reach the other broker.
// ---------------------------------------------------------------------------------------

/// Two brokers, one SIGKILLed at a third of the load; with `consume`, a consumer group
/// fetches and acks alongside (so the kill also hits deliveries and settles).
async fn broker_kill_9(scenario: &str, consume: bool) {
    let scale = Scale::pick(300, 2000);
    for rep in 1..=scale.reps {
        let mut sys = System::start(SystemOptions {
            brokers: 2,
            ..Default::default()
        })
        .await;
        let load = Load {
            consume,
            ..Load::new(scale.messages)
        };
        let run = run_load(&sys, load).await;
        run.progress
            .wait_acked(scale.messages / 3, Duration::from_secs(60))
            .await;
        let fault_ms = run.history.now_ms();
        blocking(|| sys.brokers[0].kill9()).expect("kill -9 broker-1");
        let finished = run.finish().await;
        let mut r = oracle(&sys, scenario, &scale, rep, &finished, TRAJECTORY_WAIT).await;
        r.set(
            "fault",
            json!("SIGKILL broker-1 of 2 at a third of the load"),
        )
        .set("consumer", json!(consume))
        .set("fault_at_ms", json!(fault_ms.round()))
        .set("recovery_ms", json!(finished.history.recovery_ms(fault_ms)));
        if !consume {
            r.set("unconsumed", json!(null));
        }
        r.print();
        r.assert_sound(true, &sys);
    }
}

/// Uploads only: every acked upload stored once, and its store hop (P2/P3) complete even
/// when its broker died before writing the records (recovered from the stored message).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1_broker_kill_9_mid_upload_load() {
    let _serial = SERIAL.lock().await;
    broker_kill_9("broker_kill_9_uploads", false).await;
}

/// Uploads and a consumer group: the same, and every consumed message's trajectory shows
/// its acknowledged delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1_broker_kill_9_mid_load_with_consumers() {
    let _serial = SERIAL.lock().await;
    broker_kill_9("broker_kill_9", true).await;
}

// ---------------------------------------------------------------------------------------
// 2. Bug 1's deterministic repro: the only broker is SIGKILLed the moment its OK reply
//    arrives; the message's store hop (P2/P3) must still reach the listener.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s2_broker_kill_9_the_moment_its_ok_reply_arrives() {
    let _serial = SERIAL.lock().await;
    let scale = Scale::pick(3, 10);
    for rep in 1..=scale.reps {
        let mut sys = System::start(SystemOptions::default()).await;
        let nats = connect(&sys.nats.urls()).await;
        let client = sys.listener_client();
        // The control: a listener that reads the stage stream alone, as before the fix.
        let (_control, control) = sys
            .extra_listener("control", &["--no-store-evidence"])
            .await;
        let mut killed_ids = Vec::new();
        let mut uploads = BTreeMap::new();
        let mut store_hop_after_ms = Vec::new();
        let mut incomplete = BTreeMap::new();
        for k in 0..scale.messages {
            let producer = msgtrail_client::Producer::connect_with(
                nats.clone(),
                sys.producer_id.clone(),
                ProducerOptions::default().max_attempts(1),
            )
            .await
            .expect("producer channel");
            let rid = RequestId::generate();
            let reply = producer
                .send_message(Outgoing::new(TOPIC, format!("bug 1 repro {k}")).request_id(rid))
                .await
                .expect("the upload is acked");
            // The moment the OK reply is in: SIGKILL, before the broker's stage batch (20 ms
            // linger) leaves.
            sys.brokers[0].kill9().expect("kill -9 the broker");
            let killed = Instant::now();
            drop(producer);
            let mid = reply.message_id;
            uploads.insert(
                reply.request_id.to_string(),
                Acked {
                    message_id: mid,
                    duplicate: reply.duplicate,
                    stream_seq: reply.stream_seq,
                },
            );
            killed_ids.push(mid);
            // The listener must show the store hop anyway (recovered from the stored
            // message), with no broker running.
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let what = match client.trajectory(&mid.to_string(), None).await {
                    Ok(t) => missing(&t, false),
                    Err(e) => vec![e.to_string()],
                };
                if what.is_empty() {
                    store_hop_after_ms.push(killed.elapsed().as_millis() as u64);
                    break;
                }
                if Instant::now() > deadline {
                    incomplete.insert(mid.to_string(), what);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if k + 1 < scale.messages {
                blocking(|| sys.brokers[0].restart()).expect("broker restarts");
                sys.wait_brokers(1, Duration::from_secs(30)).await;
            }
        }
        // What the control shows of the same messages: without store evidence, bug 1.
        let mut control_complete = 0;
        for mid in &killed_ids {
            if let Ok(t) = control.trajectory(&mid.to_string(), None).await {
                if missing(&t, false).is_empty() {
                    control_complete += 1;
                }
            }
        }
        // Did the broker's own P2 make it to the stage stream before the kill? (A restarted
        // broker never sends what its predecessor had buffered.)
        let records = stage_records(&sys.admin).await;
        let in_stage_stream = killed_ids
            .iter()
            .filter(|mid| {
                records
                    .iter()
                    .any(|r| r.message_id == Some(**mid) && r.stage == Stage::UploadReceived)
            })
            .count();
        let stored = drain_messages(&sys.admin).await;
        let stream = judge_stream(&uploads, &stored);
        let mut r = Report::bare("broker_kill_9_at_ok_reply", &scale, rep);
        r.set("messages", json!(scale.messages))
            .set(
                "fault",
                json!("SIGKILL the only broker the moment each upload's OK reply arrives"),
            )
            .set("acked", json!(uploads.len()))
            .set("lost", json!(stream.lost.len()))
            .set("duplicated", json!(stream.duplicated))
            .set("mismatched", json!(stream.mismatched.len()))
            .set("incomplete", json!(incomplete.len()))
            .set("p2_in_stage_stream_before_kill", json!(in_stage_stream))
            .set(
                "store_hop_complete_without_store_evidence",
                json!(control_complete),
            )
            .set(
                "stored_with_received_at",
                json!(stream.stored - stream.without_evidence),
            )
            .set("store_hop_visible_after_ms", json!(store_hop_after_ms));
        if !incomplete.is_empty() {
            r.set("incomplete_sample", json!(incomplete));
        }
        r.print();
        r.assert_sound(true, &sys);
    }
}

// ---------------------------------------------------------------------------------------
// 3. nats-server SIGKILLed mid-load and started again on the same port and store.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_nats_server_kill_9_and_restart() {
    let _serial = SERIAL.lock().await;
    let scale = Scale::pick(300, 2000);
    let outage = Duration::from_secs(1);
    for rep in 1..=scale.reps {
        let mut sys = System::start(SystemOptions {
            brokers: 2,
            ..Default::default()
        })
        .await;
        let run = run_load(&sys, Load::new(scale.messages)).await;
        run.progress
            .wait_acked(scale.messages / 3, Duration::from_secs(60))
            .await;
        let acked_before = run.progress.acked.load(std::sync::atomic::Ordering::SeqCst);
        let fault_ms = run.history.now_ms();
        let Nats::Single(node) = &mut sys.nats else {
            unreachable!("one node")
        };
        blocking(|| node.kill9());
        tokio::time::sleep(outage).await;
        blocking(|| node.restart()).expect("nats-server restarts on the same port and store");
        let restarted_ms = run.history.now_ms();
        let finished = run.finish().await;
        let mut r = oracle(
            &sys,
            "nats_server_kill_9_restart",
            &scale,
            rep,
            &finished,
            TRAJECTORY_WAIT,
        )
        .await;
        r.set(
            "fault",
            json!(
                "SIGKILL nats-server at a third of the load, restart on the same store after 1 s"
            ),
        )
        .set("acked_before_fault", json!(acked_before))
        .set("fault_at_ms", json!(fault_ms.round()))
        .set("outage_ms", json!((restarted_ms - fault_ms).round()))
        .set("recovery_ms", json!(finished.history.recovery_ms(fault_ms)));
        r.print();
        r.assert_sound(true, &sys);
    }
}

// ---------------------------------------------------------------------------------------
// 4. The listener SIGKILLed mid-backlog and started again: every trajectory complete.
// ---------------------------------------------------------------------------------------

fn stat(v: &serde_json::Value, path: &[&str]) -> u64 {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_u64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4_listener_kill_9_mid_backlog() {
    let _serial = SERIAL.lock().await;
    let scale = Scale::pick(300, 2000);
    for rep in 1..=scale.reps {
        // Small store transactions, so that the kill lands between some of them.
        let mut sys = System::start(SystemOptions {
            brokers: 1,
            listener: false,
            listener_args: vec!["--batch-size".into(), "2".into()],
            ..Default::default()
        })
        .await;
        // The backlog: a whole load while no listener runs.
        let finished = run_load(&sys, Load::new(scale.messages))
            .await
            .finish()
            .await;
        let js = async_nats::jetstream::new(sys.admin.clone());
        let stage_messages = js
            .get_stream(STAGE_STREAM)
            .await
            .unwrap()
            .info()
            .await
            .unwrap()
            .state
            .messages;
        sys.spawn_listener();
        sys.wait_listener(Duration::from_secs(30)).await;
        // Kill it once it has applied a part of the backlog.
        let client = sys.listener_client();
        let started = Instant::now();
        let mut applied = (0, 0);
        while started.elapsed() < Duration::from_secs(30) {
            if let Ok((200, body)) = client.get_raw("/api/stats").await {
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                applied = (
                    stat(&v, &["ingest", "batches"]),
                    stat(&v, &["ingest", "stored_messages"]),
                );
                if applied.0 + applied.1 > 0 {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        blocking(|| sys.listener.as_mut().unwrap().kill9()).expect("kill -9 the listener");
        let mid_backlog = applied.0 < stage_messages;
        sys.spawn_listener();
        let restarted = Instant::now();
        sys.wait_listener(Duration::from_secs(30)).await;
        let mut r = oracle(
            &sys,
            "listener_kill_9_mid_backlog",
            &scale,
            rep,
            &finished,
            TRAJECTORY_WAIT,
        )
        .await;
        let caught_up = restarted.elapsed().as_millis() as u64;
        r.set(
            "fault",
            json!("SIGKILL the listener while it applies a backlog (--batch-size 2), restart"),
        )
        .set("stage_stream_messages", json!(stage_messages))
        .set(
            "applied_at_kill",
            json!({"stage_batches": applied.0, "stored_messages": applied.1}),
        )
        .set("killed_mid_backlog", json!(mid_backlog))
        .set("catch_up_ms", json!(caught_up));
        r.print();
        r.assert_sound(true, &sys);
        assert!(
            mid_backlog,
            "the kill came after the whole backlog was applied: nothing was tested"
        );
    }
}

// ---------------------------------------------------------------------------------------
// 5. A garbage flood on every broker subject while real clients keep working.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s5_garbage_flood_on_every_broker_subject() {
    let _serial = SERIAL.lock().await;
    let scale = Scale::pick(300, 2000);
    let rate = 2000;
    for rep in 1..=scale.reps {
        let sys = System::start(SystemOptions {
            brokers: 2,
            ..Default::default()
        })
        .await;
        // Baseline: the same clients with no flood.
        let baseline = run_load(&sys, Load::new(scale.messages / 3))
            .await
            .finish()
            .await;
        let base_lat = baseline.history.send_latencies();
        let flood = garbage::Flood::start(
            connect(&sys.nats.urls()).await,
            rate,
            2,
            0x5eed ^ rep as u64,
        )
        .await;
        // The real clients start once the garbage is flowing.
        let flowing = Instant::now();
        while flood.sent() < rate / 2 && flowing.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let finished = run_load(&sys, Load::new(scale.messages))
            .await
            .finish()
            .await;
        let stats = flood.stop().await;
        let (ok, fail, unknown) = finished.history.counts("send");
        let lat = finished.history.send_latencies();
        // The oracle over both loads.
        let stored = drain_messages(&sys.admin).await;
        let mut uploads = baseline.progress.uploads.lock().unwrap().clone();
        uploads.extend(finished.progress.uploads.lock().unwrap().clone());
        let mut consumed = baseline.progress.consumed_ids.lock().unwrap().clone();
        consumed.extend(
            finished
                .progress
                .consumed_ids
                .lock()
                .unwrap()
                .iter()
                .copied(),
        );
        let stream = judge_stream(&uploads, &stored);
        let traj =
            judge_trajectories(&sys.listener_client(), &uploads, &consumed, TRAJECTORY_WAIT).await;
        let mut r = Report::new("garbage_flood", &scale, rep, &finished, &stream, &traj);
        // Forged reports name made-up message IDs: none may reach the stage stream.
        let real: HashSet<&str> = stored.iter().map(|m| m.message_id.as_str()).collect();
        let forged = stage_records(&sys.admin)
            .await
            .iter()
            .filter(|r| {
                r.message_id
                    .is_some_and(|m| !real.contains(m.to_string().as_str()))
            })
            .count();
        r.set("records_of_unknown_messages_in_stage_stream", json!(forged));
        let calls = (ok + fail + unknown).max(1) as f64;
        r.set("fault", json!(FLOOD_FAULT))
            .set(
                "flood",
                json!({"target_rate": rate, "rate": stats.rate, "sent": stats.sent,
                             "replies": stats.replies, "error_replies": stats.error_replies}),
            )
            .set(
                "baseline_acked",
                json!(baseline.progress.uploads.lock().unwrap().len()),
            )
            .set(
                "success_rate",
                json!((ok as f64 / calls * 1000.0).round() / 1000.0),
            )
            .set(
                "baseline_send_ms",
                json!({"p50": percentile(&base_lat, 50.0),
                                         "p99": percentile(&base_lat, 99.0)}),
            )
            .set(
                "flood_send_ms",
                json!({"p50": percentile(&lat, 50.0), "p99": percentile(&lat, 99.0),
                                      "max": percentile(&lat, 100.0)}),
            );
        r.print();
        r.assert_sound(true, &sys);
        assert_eq!(
            r.n("given_up"),
            0,
            "real clients could not get through the flood"
        );
        assert_eq!(forged, 0, "forged stage records were relayed: {:?}", r.json);
    }
}

// ---------------------------------------------------------------------------------------
// 6. A retry past the dedup window: the same request ID uploaded again after the window.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s6_retry_past_the_dedup_window() {
    let _serial = SERIAL.lock().await;
    let scale = Scale::pick(20, 100);
    let window = Duration::from_secs(1);
    for rep in 1..=scale.reps {
        let sys = System::start(SystemOptions {
            brokers: 1,
            broker_args: vec!["--dedup-window".into(), "1s".into()],
            ..Default::default()
        })
        .await;
        let producer = sys.producer().await;
        let history = History::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut first = BTreeMap::new();
        let mut rids = Vec::new();
        for i in 0..scale.messages {
            let rid = RequestId::generate();
            let a = send_until_acked(
                &producer,
                &history,
                &rid,
                format!("{{\"n\":{i}}}"),
                deadline,
            )
            .await
            .expect("acked");
            first.insert(rid.to_string(), a);
            rids.push(rid);
        }
        // Inside the window a retry is deduplicated (the control)...
        let control = send_until_acked(&producer, &history, &rids[0], "again".into(), deadline)
            .await
            .expect("acked");
        // ...after it, a quarter of the uploads are retried with the same request ID.
        tokio::time::sleep(window * 3).await;
        let retried: Vec<&RequestId> = rids.iter().skip(1).step_by(4).collect();
        let mut second = Vec::new();
        for rid in &retried {
            let a = send_until_acked(&producer, &history, rid, "late retry".into(), deadline)
                .await
                .expect("acked");
            second.push(((*rid).clone(), a));
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), producer.close()).await;
        let stored = drain_messages(&sys.admin).await;
        let stream = judge_stream(&first, &stored);
        // What the listener says: does a trajectory flag the second copy?
        let client = sys.listener_client();
        let mut flagged = 0;
        let mut by_request_id = Vec::new();
        let mut all_ids: BTreeMap<String, Acked> = first.clone();
        for (rid, a) in &second {
            all_ids.insert(format!("{rid}#2"), a.clone());
            let t1 = client
                .trajectory(&first[rid.as_str()].message_id.to_string(), None)
                .await;
            let t2 = client.trajectory(&a.message_id.to_string(), None).await;
            let flags = |t: &Result<msgtrail_core::trajectory::Trajectory, _>| {
                t.as_ref().is_ok_and(|t| {
                    t.duplicates > 0 || t.diagnosis.to_lowercase().contains("duplicate")
                })
            };
            if flags(&t1) || flags(&t2) {
                flagged += 1;
            }
            by_request_id.push(match client.trajectory(rid.as_str(), None).await {
                Ok(t) => format!(
                    "200 message {}",
                    if t.message_id == Some(a.message_id) {
                        "second"
                    } else {
                        "first"
                    }
                ),
                Err(e) => e.to_string(),
            });
        }
        let traj = judge_trajectories(&client, &all_ids, &HashSet::new(), TRAJECTORY_WAIT).await;
        let new_ids = second
            .iter()
            .filter(|(rid, a)| a.message_id != first[rid.as_str()].message_id)
            .count();
        let answered_duplicate = second.iter().filter(|(_, a)| a.duplicate).count();
        let mut r = Report::bare("retry_past_dedup_window", &scale, rep);
        r.set("messages", json!(scale.messages))
            .set("fault", json!(DEDUP_FAULT))
            .set("acked", json!(first.len()))
            .set("lost", json!(stream.lost.len()))
            .set("mismatched", json!(stream.mismatched.len()))
            .set(
                "control_retry_in_window_duplicate",
                json!(control.duplicate),
            )
            .set("retried_after_window", json!(second.len()))
            .set("retries_answered_duplicate", json!(answered_duplicate))
            .set("retries_given_a_new_message_id", json!(new_ids))
            .set("duplicated", json!(stream.duplicated))
            .set("stored", json!(stream.stored))
            .set("flagged_by_listener", json!(flagged))
            .set("get_by_request_id", json!(by_request_id.first()))
            .set("incomplete", json!(traj.incomplete.len()))
            .set(
                "known_gap",
                json!(if flagged < second.len() {
                    DEDUP_GAP
                } else {
                    ""
                }),
            );
        r.print();
        assert_eq!(r.n("lost"), 0, "acked uploads lost: {:?}", r.json);
        assert!(
            control.duplicate,
            "a retry inside the window must be deduplicated"
        );
        assert_eq!(
            control.message_id,
            first[rids[0].as_str()].message_id,
            "a deduplicated retry gets the original message ID"
        );
        assert_eq!(
            r.n("incomplete"),
            0,
            "incomplete trajectories: {:?}",
            r.json
        );
        // What happens past the window is recorded, not asserted (see RELIABILITY.md).
    }
}

// ---------------------------------------------------------------------------------------
// 7. A 3-node R3 cluster loses one node mid-load: the leader of the message stream, of the
//    stage stream, or of the JetStream meta group.
// ---------------------------------------------------------------------------------------

/// The leader a cluster scenario kills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// `MSGTRAIL_MESSAGES`'s stream leader.
    MessageStream,
    /// `MSGTRAIL_STAGES`'s stream leader.
    StageStream,
    /// The JetStream meta group's leader (it places streams and consumers).
    Meta,
    /// The leader of the consumer group's durable JetStream consumer (`g-faults-billing-…`),
    /// the one that takes the group's acks (RELIABILITY.md, finding 4).
    GroupConsumer,
}

impl Role {
    fn describe(self) -> &'static str {
        match self {
            Role::MessageStream => "the MSGTRAIL_MESSAGES stream leader",
            Role::StageStream => "the MSGTRAIL_STAGES stream leader",
            Role::Meta => "the JetStream meta leader",
            Role::GroupConsumer => "the leader of the group's JetStream consumer",
        }
    }
}

/// Who leads the meta group and each of the two streams.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Leaders {
    meta: Option<String>,
    messages: Option<String>,
    stages: Option<String>,
    group_consumer: Option<String>,
}

impl Leaders {
    /// The meta leader from the nodes' `/jsz`, the stream leaders from JetStream stream info.
    async fn read(sys: &System) -> Leaders {
        let cluster = cluster_of(sys);
        let meta = blocking(|| cluster.meta_leader(Duration::from_secs(15))).ok();
        let js = async_nats::jetstream::new(sys.admin.clone());
        Leaders {
            meta,
            messages: stream_leader(&js, MESSAGE_STREAM).await,
            stages: stream_leader(&js, STAGE_STREAM).await,
            group_consumer: group_consumer_leader(&js).await,
        }
    }

    fn of(&self, role: Role) -> Option<&String> {
        match role {
            Role::MessageStream => self.messages.as_ref(),
            Role::StageStream => self.stages.as_ref(),
            Role::Meta => self.meta.as_ref(),
            Role::GroupConsumer => self.group_consumer.as_ref(),
        }
    }

    /// Whether the three are three different nodes.
    fn separate(&self) -> bool {
        match (&self.meta, &self.messages, &self.stages) {
            (Some(a), Some(b), Some(c)) => a != b && a != c && b != c,
            _ => false,
        }
    }

    fn json(&self) -> serde_json::Value {
        json!({"meta": self.meta, "messages": self.messages, "stages": self.stages,
               "group_consumer": self.group_consumer})
    }
}

fn cluster_of(sys: &System) -> &msgtrail_test_support::NatsCluster {
    match &sys.nats {
        Nats::Cluster(c) => c,
        Nats::Single(_) => unreachable!("a cluster scenario runs a cluster"),
    }
}

/// The leader of `stream` as its stream info names it.
async fn stream_leader(js: &async_nats::jetstream::Context, stream: &str) -> Option<String> {
    let mut s = js.get_stream(stream).await.ok()?;
    let info = s.info().await.ok()?;
    info.cluster.clone().and_then(|c| c.leader)
}

/// The leader of the group's durable consumer on the message stream (`g-<group>-<hash>`;
/// `None` before the first fetch created it).
async fn group_consumer_leader(js: &async_nats::jetstream::Context) -> Option<String> {
    let stream = js.get_stream(MESSAGE_STREAM).await.ok()?;
    let mut consumers = stream.consumers();
    let prefix = format!("g-{GROUP}-");
    while let Ok(Some(Ok(c))) = tokio::time::timeout(Duration::from_secs(5), consumers.next()).await
    {
        if c.name.starts_with(&prefix) {
            return c.cluster.and_then(|c| c.leader);
        }
    }
    None
}

/// Asks `stream`'s leader to step down in favour of `to` (`$JS.API.STREAM.LEADER.STEPDOWN`
/// with a preferred placement) and waits up to 10 s until `to` leads.
async fn move_stream_leader(sys: &System, stream: &str, to: &str) {
    let js = async_nats::jetstream::new(sys.admin.clone());
    let body = json!({"placement": {"preferred": to}}).to_string();
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        sys.admin.request(
            format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}"),
            body.into(),
        ),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if stream_leader(&js, stream).await.as_deref() == Some(to) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Moves the stream leaders so that the meta leader, `MSGTRAIL_MESSAGES`'s leader and
/// `MSGTRAIL_STAGES`'s leader are three different nodes, so that a kill hits one of them
/// alone (the meta leader cannot be moved without the system account; the streams can).
async fn separate_leaders(sys: &System) -> Leaders {
    let names = cluster_of(sys).names();
    for _ in 0..5 {
        let l = Leaders::read(sys).await;
        if l.separate() {
            return l;
        }
        let (Some(meta), Some(msg), Some(stg)) = (&l.meta, &l.messages, &l.stages) else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        let others: Vec<&String> = names.iter().filter(|n| *n != meta).collect();
        let msg_to = if msg != meta {
            msg.clone()
        } else {
            others
                .iter()
                .find(|n| **n != stg)
                .copied()
                .unwrap_or(others[0])
                .clone()
        };
        let stg_to = others
            .iter()
            .find(|n| ***n != msg_to)
            .copied()
            .unwrap_or(others[0])
            .clone();
        if *msg != msg_to {
            move_stream_leader(sys, MESSAGE_STREAM, &msg_to).await;
        }
        if *stg != stg_to {
            move_stream_leader(sys, STAGE_STREAM, &stg_to).await;
        }
    }
    Leaders::read(sys).await
}

/// Every JetStream asset `node` leads: the meta group, streams, consumers (`stream/consumer`).
async fn led_by(sys: &System, node: &str, leaders: &Leaders) -> Vec<String> {
    let js = async_nats::jetstream::new(sys.admin.clone());
    let mut out = vec![];
    if leaders.meta.as_deref() == Some(node) {
        out.push("meta".to_owned());
    }
    let mut streams = js.streams();
    let mut infos = vec![];
    while let Ok(Some(Ok(info))) =
        tokio::time::timeout(Duration::from_secs(5), streams.next()).await
    {
        infos.push(info);
    }
    for info in infos {
        let name = info.config.name.clone();
        if info.cluster.as_ref().and_then(|c| c.leader.as_deref()) == Some(node) {
            out.push(format!("stream {name}"));
        }
        let Ok(stream) = js.get_stream(&name).await else {
            continue;
        };
        let mut consumers = stream.consumers();
        while let Ok(Some(Ok(c))) =
            tokio::time::timeout(Duration::from_secs(5), consumers.next()).await
        {
            if c.cluster.as_ref().and_then(|c| c.leader.as_deref()) == Some(node) {
                out.push(format!("consumer {name}/{}", c.name));
            }
        }
    }
    out.sort();
    out
}

/// The client connections on `node` (its `/connz`): `broker` (a `msgtrail` process
/// subscribed to the upload subject), `listener` (another `msgtrail` process) or `test` (the
/// suite's own producer, consumer and oracle). A request in flight through a killed node is
/// lost with it: its caller sees a timeout whatever the node led.
fn connections_on(sys: &System, node: &str) -> Vec<String> {
    let cluster = cluster_of(sys);
    let Some(i) = cluster.index_of(node) else {
        return vec![];
    };
    let Ok(v) = blocking(|| cluster.nodes[i].monitor("/connz?subs=1")) else {
        return vec!["unknown (/connz failed)".into()];
    };
    let mut out: Vec<String> = v["connections"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let subscribes_upload = c["subscriptions_list"]
                .as_array()
                .is_some_and(|l| l.iter().any(|s| s.as_str() == Some(subjects::UPLOAD)));
            match c["name"].as_str() {
                Some("msgtrail") if subscribes_upload => "broker",
                Some("msgtrail") | Some("msgtrail-listener") => "listener",
                _ => "test",
            }
            .to_owned()
        })
        .collect();
    out.sort();
    out
}

/// What happens to the node a cluster scenario picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NodeFault {
    /// SIGKILL; it stays down (scenario 7).
    Kill9,
    /// SIGSTOP for [`pauses::PAUSE`], then SIGCONT: it wakes believing it still leads
    /// (scenario 13).
    Pause,
}

/// A 3-node R3 cluster with two brokers; the leaders of the meta group and of the two streams
/// are moved to three different nodes, and at a third of the load the node leading `role`
/// is SIGKILLed (and stays down).
async fn cluster_leader_kill_9(scenario: &str, role: Role) {
    cluster_leader_fault(scenario, role, NodeFault::Kill9).await
}

/// [`cluster_leader_kill_9`] with the node's fault as a parameter.
async fn cluster_leader_fault(scenario: &str, role: Role, fault: NodeFault) {
    let scale = Scale::pick(300, 2000);
    for rep in 1..=scale.reps {
        let mut sys = System::start(SystemOptions {
            cluster: true,
            brokers: 2,
            ..Default::default()
        })
        .await;
        let before = separate_leaders(&sys).await;
        // A pause is measured on a paced load (8 tasks, 100 ms apart) that still runs when
        // the node wakes; a kill on the usual unpaced one.
        let load = match fault {
            NodeFault::Kill9 => Load::new(scale.messages),
            NodeFault::Pause => Load {
                pace: Duration::from_millis(100),
                ..Load::new(scale.messages)
            },
        };
        let run = run_load(&sys, load).await;
        run.progress
            .wait_acked(scale.messages / 3, Duration::from_secs(60))
            .await;
        // Read again right before the kill: the node that leads `role` now (the group's
        // consumer is created by the first fetch and may be between leaders for a moment).
        let mut at_kill = Leaders::read(&sys).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while at_kill.of(role).is_none() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
            at_kill = Leaders::read(&sys).await;
        }
        let victim = at_kill
            .of(role)
            .cloned()
            .unwrap_or_else(|| panic!("no {} to kill: {at_kill:?}", role.describe()));
        let victim_leads = led_by(&sys, &victim, &at_kill).await;
        let victim_connections = connections_on(&sys, &victim);
        let fault_ms = run.history.now_ms();
        let acked_at_fault = run.progress.acked.load(std::sync::atomic::Ordering::SeqCst);
        let Nats::Cluster(cluster) = &mut sys.nats else {
            unreachable!("a cluster")
        };
        let i = cluster
            .index_of(&victim)
            .expect("the leader is one of ours");
        let fault_text = match fault {
            NodeFault::Kill9 => {
                blocking(|| cluster.nodes[i].kill9());
                "SIGKILL"
            }
            NodeFault::Pause => {
                blocking(|| cluster.nodes[i].pause()).expect("SIGSTOP the node");
                tokio::time::sleep(pauses::PAUSE).await;
                blocking(|| cluster.nodes[i].resume()).expect("SIGCONT the node");
                "SIGSTOP for 8 s (then SIGCONT)"
            }
        };
        let finished = run.finish().await;
        let after = Leaders::read(&sys).await;
        let mut r = oracle(&sys, scenario, &scale, rep, &finished, TRAJECTORY_WAIT).await;
        if fault == NodeFault::Pause {
            r.set("acked_at_fault", json!(acked_at_fault));
            let stored = drain_messages(&sys.admin).await;
            let records = stage_records(&sys.admin).await;
            let contradictions = pauses::stage_contradictions(&records, &stored);
            let h = &finished.history;
            r.set("stage_contradictions", json!(contradictions.len()))
                .set(
                    "longest_without_acked_upload_ms",
                    json!(h.longest_gap_ms("send", fault_ms)),
                )
                .set(
                    "longest_without_ok_ack_ms",
                    json!(h.longest_gap_ms("ack", fault_ms)),
                )
                .set(
                    "upload_failure_window_ms",
                    json!(h.failure_window_ms("attempt", fault_ms)),
                );
            assert!(
                contradictions.is_empty(),
                "stage records contradict the stream: {contradictions:?}"
            );
            assert!(
                acked_at_fault < scale.messages,
                "the load was over before the pause: nothing was tested"
            );
        }
        r.set(
            "fault",
            json!(format!(
                "{fault_text} {} of a 3-node R3 cluster at a third of the load",
                role.describe()
            )),
        )
        .set("killed", json!(victim))
        .set("killed_leads", json!(victim_leads))
        .set("killed_node_connections", json!(victim_connections))
        .set("leaders_separate", json!(at_kill.separate()))
        .set("leaders_at_kill", at_kill.json())
        .set("leaders_after", after.json())
        .set("new_leader", json!(after.of(role)))
        .set("fault_at_ms", json!(fault_ms.round()))
        .set("recovery_ms", json!(finished.history.recovery_ms(fault_ms)));
        if before != at_kill {
            r.set("leaders_before_load", before.json());
        }
        r.print();
        r.assert_sound(true, &sys);
        if role == Role::GroupConsumer {
            // Finding 4: an ack is answered ok once the consumer's leader confirmed it, which
            // in a cluster is once it is replicated; so no acked delivery comes back when
            // that leader dies. (Before, acks published to the dead leader were dropped and
            // answered ok: 60–63 of 300 came back.)
            let again = finished
                .progress
                .redelivered_after_ack
                .load(std::sync::atomic::Ordering::SeqCst);
            assert_eq!(again, 0, "acked deliveries delivered again");
        }
    }
}

/// The leader of the group's JetStream consumer, which takes the acks: settles stall until
/// a new one is elected, and none answered ok may be undone (RELIABILITY.md, finding 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_cluster_loses_the_group_consumer_leader_mid_load() {
    let _serial = SERIAL.lock().await;
    cluster_leader_kill_9("cluster_group_consumer_leader_kill_9", Role::GroupConsumer).await;
}

/// The message stream's leader: uploads stall until a new leader is elected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_cluster_loses_the_stream_leader_mid_load() {
    let _serial = SERIAL.lock().await;
    cluster_leader_kill_9("cluster_stream_leader_kill_9", Role::MessageStream).await;
}

/// The stage stream's leader: stage records wait (the broker retries them) until a new
/// leader is elected; none may be lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_cluster_loses_the_stage_stream_leader_mid_load() {
    let _serial = SERIAL.lock().await;
    cluster_leader_kill_9("cluster_stage_leader_kill_9", Role::StageStream).await;
}

/// The JetStream meta leader (leading neither stream): stream and consumer management
/// stalls until a new one is elected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7_cluster_loses_the_meta_leader_mid_load() {
    let _serial = SERIAL.lock().await;
    cluster_leader_kill_9("cluster_meta_leader_kill_9", Role::Meta).await;
}

// ---------------------------------------------------------------------------------------
// 8. The listener's OTLP endpoint hangs (a black hole) or refuses connections.
// ---------------------------------------------------------------------------------------

/// An endpoint that accepts TCP connections and never answers: each export call waits out
/// its timeout; the message path, ingest and the API must not notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_otlp_endpoint_black_hole() {
    let _serial = SERIAL.lock().await;
    otlp::otlp_endpoint_down("otlp_black_hole", otlp::Endpoint::BlackHole).await;
}

/// An endpoint whose port is closed: every export call is refused at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_otlp_endpoint_refused() {
    let _serial = SERIAL.lock().await;
    otlp::otlp_endpoint_down("otlp_refused", otlp::Endpoint::Refused).await;
}

// ---------------------------------------------------------------------------------------
// 9. Consumers slower than the group's ack wait: redeliveries, late acks, dead letters.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s9_consumer_slower_than_the_ack_wait() {
    let _serial = SERIAL.lock().await;
    slow_consumer::slower_than_ack_wait("consumer_slower_than_ack_wait").await;
}

// ---------------------------------------------------------------------------------------
// 10. Permission bypass attempts under deploy/'s accounts while real clients work.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s10_permission_bypass_attempts_under_deploy_accounts() {
    let _serial = SERIAL.lock().await;
    permissions::bypass_attempts_under_load("permission_bypass").await;
}

// ---------------------------------------------------------------------------------------
// 11. A node of the R3 cluster comes back: killed mid-load, started again on its store.
// ---------------------------------------------------------------------------------------

/// Whether `node` is a current member of `stream`'s group again: its leader, or a replica
/// that is current and not offline.
async fn rejoined(js: &async_nats::jetstream::Context, stream: &str, node: &str) -> bool {
    let Ok(mut s) = js.get_stream(stream).await else {
        return false;
    };
    let Ok(info) = s.info().await else {
        return false;
    };
    let Some(cluster) = info.cluster.clone() else {
        return false;
    };
    cluster.leader.as_deref() == Some(node)
        || cluster
            .replicas
            .iter()
            .any(|p| p.name == node && p.current && !p.offline)
}

/// Waits up to `within` until `node` is a current member of both msgtrail streams again;
/// the time it took, or `None`.
async fn wait_rejoined(sys: &System, node: &str, within: Duration) -> Option<u64> {
    let js = async_nats::jetstream::new(sys.admin.clone());
    let start = Instant::now();
    while start.elapsed() < within {
        if rejoined(&js, MESSAGE_STREAM, node).await && rejoined(&js, STAGE_STREAM, node).await {
            return Some(start.elapsed().as_millis() as u64);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// The message stream's leader is SIGKILLed at a third of the load and started again on the
/// same port and store at half of it (the load paced so that it is still running): it must
/// rejoin both streams' groups, and the load lose nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s11_cluster_node_comes_back_mid_load() {
    let _serial = SERIAL.lock().await;
    let scale = Scale::pick(400, 2000);
    let pace = Duration::from_millis(if scale.long { 10 } else { 40 });
    for rep in 1..=scale.reps {
        let mut sys = System::start(SystemOptions {
            cluster: true,
            brokers: 2,
            ..Default::default()
        })
        .await;
        let before = separate_leaders(&sys).await;
        let run = run_load(
            &sys,
            Load {
                pace,
                ..Load::new(scale.messages)
            },
        )
        .await;
        run.progress
            .wait_acked(scale.messages / 3, Duration::from_secs(60))
            .await;
        let at_kill = Leaders::read(&sys).await;
        let victim = at_kill
            .of(Role::MessageStream)
            .cloned()
            .unwrap_or_else(|| panic!("no message stream leader: {at_kill:?}"));
        let victim_leads = led_by(&sys, &victim, &at_kill).await;
        let fault_ms = run.history.now_ms();
        let i = cluster_of(&sys)
            .index_of(&victim)
            .expect("the leader is one of ours");
        let Nats::Cluster(cluster) = &mut sys.nats else {
            unreachable!("a cluster")
        };
        blocking(|| cluster.nodes[i].kill9());
        run.progress
            .wait_acked(scale.messages / 2, Duration::from_secs(60))
            .await;
        let acked_at_restart = run.progress.acked.load(std::sync::atomic::Ordering::SeqCst);
        blocking(|| cluster.nodes[i].restart()).expect("the node starts again on its store");
        let restarted_ms = run.history.now_ms();
        let mid_load = !run
            .progress
            .producers_done
            .load(std::sync::atomic::Ordering::SeqCst);
        let rejoin_ms = wait_rejoined(&sys, &victim, Duration::from_secs(60)).await;
        let finished = run.finish().await;
        let after = Leaders::read(&sys).await;
        let mut r = oracle(
            &sys,
            "cluster_node_comes_back",
            &scale,
            rep,
            &finished,
            TRAJECTORY_WAIT,
        )
        .await;
        r.set(
            "fault",
            json!(
                "SIGKILL the MSGTRAIL_MESSAGES leader of a 3-node R3 cluster at a third of the \
                 load, start it again on the same port and store at half of it"
            ),
        )
        .set("killed", json!(victim))
        .set("killed_leads", json!(victim_leads))
        .set("leaders_at_kill", at_kill.json())
        .set("leaders_after", after.json())
        .set("fault_at_ms", json!(fault_ms.round()))
        .set("outage_ms", json!((restarted_ms - fault_ms).round()))
        .set("acked_at_restart", json!(acked_at_restart))
        .set("restarted_mid_load", json!(mid_load))
        .set("rejoined_after_ms", json!(rejoin_ms))
        .set("recovery_ms", json!(finished.history.recovery_ms(fault_ms)));
        if before != at_kill {
            r.set("leaders_before_load", before.json());
        }
        r.print();
        r.assert_sound(true, &sys);
        assert!(
            rejoin_ms.is_some(),
            "{victim} did not rejoin both streams within 60 s: {:?}",
            r.json
        );
        assert!(
            mid_load,
            "the node came back after the load: nothing was tested"
        );
    }
}

// ---------------------------------------------------------------------------------------
// 12. Two faults at once.
// ---------------------------------------------------------------------------------------

/// Which two processes die together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TwoFaults {
    /// broker-1 (stays down) and nats-server (started again on its store 1 s later).
    BrokerAndNatsServer,
    /// broker-1 (stays down) and the listener (started again on its store 1 s later).
    BrokerAndListener,
}

impl TwoFaults {
    fn describe(self) -> &'static str {
        match self {
            TwoFaults::BrokerAndNatsServer => {
                "SIGKILL broker-1 of 2 and nats-server at the same moment at a third of the \
                 load; nats-server started again on the same store 1 s later"
            }
            TwoFaults::BrokerAndListener => {
                "SIGKILL broker-1 of 2 and the listener at the same moment at a third of the \
                 load; the listener started again on the same store 1 s later"
            }
        }
    }
}

/// Two brokers, a consumer group, and two processes SIGKILLed at the same moment.
async fn two_faults_at_once(scenario: &str, faults: TwoFaults) {
    let scale = Scale::pick(300, 2000);
    let outage = Duration::from_secs(1);
    for rep in 1..=scale.reps {
        let mut sys = System::start(SystemOptions {
            brokers: 2,
            ..Default::default()
        })
        .await;
        let run = run_load(&sys, Load::new(scale.messages)).await;
        run.progress
            .wait_acked(scale.messages / 3, Duration::from_secs(60))
            .await;
        let fault_ms = run.history.now_ms();
        blocking(|| -> Result<(), String> {
            sys.brokers[0].kill9().map_err(|e| e.to_string())?;
            match faults {
                TwoFaults::BrokerAndNatsServer => match &mut sys.nats {
                    Nats::Single(node) => node.kill9(),
                    Nats::Cluster(_) => unreachable!("one node"),
                },
                TwoFaults::BrokerAndListener => {
                    if let Some(l) = sys.listener.as_mut() {
                        l.kill9().map_err(|e| e.to_string())?;
                    }
                }
            }
            Ok(())
        })
        .expect("kill -9 both");
        tokio::time::sleep(outage).await;
        match faults {
            TwoFaults::BrokerAndNatsServer => {
                let Nats::Single(node) = &mut sys.nats else {
                    unreachable!("one node")
                };
                blocking(|| node.restart()).expect("nats-server restarts on its store");
            }
            TwoFaults::BrokerAndListener => {
                sys.spawn_listener();
                sys.wait_listener(Duration::from_secs(30)).await;
            }
        }
        let restarted_ms = run.history.now_ms();
        let finished = run.finish().await;
        let mut r = oracle(&sys, scenario, &scale, rep, &finished, TRAJECTORY_WAIT).await;
        r.set("fault", json!(faults.describe()))
            .set("fault_at_ms", json!(fault_ms.round()))
            .set("outage_ms", json!((restarted_ms - fault_ms).round()))
            .set("recovery_ms", json!(finished.history.recovery_ms(fault_ms)));
        r.print();
        r.assert_sound(true, &sys);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s12_broker_and_nats_server_kill_9_at_once() {
    let _serial = SERIAL.lock().await;
    two_faults_at_once(
        "broker_and_nats_server_kill_9",
        TwoFaults::BrokerAndNatsServer,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s12_broker_and_listener_kill_9_at_once() {
    let _serial = SERIAL.lock().await;
    two_faults_at_once("broker_and_listener_kill_9", TwoFaults::BrokerAndListener).await;
}

// ---------------------------------------------------------------------------------------
// 13. A process freezes (SIGSTOP) for longer than every timeout and comes back (SIGCONT).
// ---------------------------------------------------------------------------------------

/// One of two brokers freezes: the SDK's retries reach the other; the frozen one wakes
/// holding requests already stored through the other, and must store nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s13_broker_paused_mid_load() {
    let _serial = SERIAL.lock().await;
    pauses::single_node_pause("broker_paused", pauses::Paused::Broker).await;
}

/// The listener freezes: ingest waits, nothing is lost, every trajectory completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s13_listener_paused_mid_load() {
    let _serial = SERIAL.lock().await;
    pauses::single_node_pause("listener_paused", pauses::Paused::Listener).await;
}

/// The only nats-server freezes: every process's connection is dropped after its pings go
/// unanswered, and reconnects once the server wakes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s13_nats_server_paused_mid_load() {
    let _serial = SERIAL.lock().await;
    pauses::single_node_pause("nats_server_paused", pauses::Paused::NatsServer).await;
}

/// The consumer's own process freezes past its deliveries' ack wait: its late acks are
/// refused `delivery_expired` and the trajectories show the redelivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s13_consumer_process_paused_past_the_ack_wait() {
    let _serial = SERIAL.lock().await;
    paused_consumer::consumer_process_paused("consumer_process_paused").await;
}

/// The cluster node leading `MSGTRAIL_MESSAGES` freezes and wakes believing it leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s13_cluster_stream_leader_paused_mid_load() {
    let _serial = SERIAL.lock().await;
    cluster_leader_fault(
        "cluster_stream_leader_paused",
        Role::MessageStream,
        NodeFault::Pause,
    )
    .await;
}

/// The cluster node leading `MSGTRAIL_STAGES` freezes and wakes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s13_cluster_stage_stream_leader_paused_mid_load() {
    let _serial = SERIAL.lock().await;
    cluster_leader_fault(
        "cluster_stage_leader_paused",
        Role::StageStream,
        NodeFault::Pause,
    )
    .await;
}

// ---------------------------------------------------------------------------------------
// 14. Clocks that disagree (libfaketime): skewed, two brokers apart, a clock that jumps.
// ---------------------------------------------------------------------------------------

/// A broker at +1.5 s and a consumer process at −0.7 s: causally ordered trajectories,
/// bounds that contain the true offsets, no audit violation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s14_broker_and_consumer_clocks_skewed() {
    let _serial = SERIAL.lock().await;
    skew::broker_and_consumer_skewed("broker_and_consumer_skewed").await;
}

/// Two brokers 2.5 s apart serving one producer and one group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s14_two_brokers_with_different_clocks() {
    let _serial = SERIAL.lock().await;
    skew::two_brokers_different_clocks("two_brokers_different_clocks").await;
}

/// The broker's wall clock jumps +3 s mid-load and back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s14_broker_clock_jumps_mid_load() {
    let _serial = SERIAL.lock().await;
    skew::broker_clock_jumps("broker_clock_jumps").await;
}

// ---------------------------------------------------------------------------------------
// 15. nats-server's JetStream store fills up, then gets space back.
// ---------------------------------------------------------------------------------------

/// Uploads fail with an error that names the cause while the store is full (the brokers'
/// store timeout below the clients' request timeout), nothing is reported stored that was
/// not, and uploads succeed again once space is freed and nats-server restarted — it keeps
/// a stream unwritable after a write error until then (RELIABILITY.md, finding 10).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15_nats_store_disk_fills_mid_load() {
    let _serial = SERIAL.lock().await;
    full_disk::nats_store_fills("nats_store_full").await;
}

// ---------------------------------------------------------------------------------------
// 16. Network partitions (every process in a network namespace; root and `ip` needed).
// ---------------------------------------------------------------------------------------

/// The node leading `MSGTRAIL_MESSAGES` cut off alone for 10 s mid-load, then healed: its
/// clients leave it, the majority elects a leader, nothing acked is lost, it rejoins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s16_partition_cuts_off_the_stream_leader() {
    let _serial = SERIAL.lock().await;
    let cut = partitions::Cut::Node {
        role: Role::MessageStream,
        with_clients: false,
    };
    partitions::partition("partition_stream_leader", cut, false).await;
}

/// The same with JetStream `sync_interval: always` on every node (the Jepsen comparison).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s16_partition_cuts_off_the_stream_leader_sync_always() {
    let _serial = SERIAL.lock().await;
    let cut = partitions::Cut::Node {
        role: Role::MessageStream,
        with_clients: false,
    };
    partitions::partition("partition_stream_leader_sync_always", cut, true).await;
}

/// A minority: the stream leader's node, broker-1 and the test's own clients on one side:
/// nothing may be acked there that the majority does not store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s16_partition_minority_with_a_broker_and_the_clients() {
    let _serial = SERIAL.lock().await;
    let cut = partitions::Cut::Node {
        role: Role::MessageStream,
        with_clients: true,
    };
    partitions::partition("partition_minority_with_clients", cut, false).await;
}

/// The node leading `MSGTRAIL_STAGES` cut off alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s16_partition_cuts_off_the_stage_stream_leader() {
    let _serial = SERIAL.lock().await;
    let cut = partitions::Cut::Node {
        role: Role::StageStream,
        with_clients: false,
    };
    partitions::partition("partition_stage_leader", cut, false).await;
}

/// broker-1 of 2 cut off from NATS: the clients' retries reach broker-2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s16_partition_cuts_off_a_broker() {
    let _serial = SERIAL.lock().await;
    partitions::partition("partition_broker", partitions::Cut::Broker, false).await;
}

/// The listener cut off from NATS and healed: it catches up, every trajectory complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s16_partition_cuts_off_the_listener() {
    let _serial = SERIAL.lock().await;
    partitions::partition("partition_listener", partitions::Cut::Listener, false).await;
}

// ---------------------------------------------------------------------------------------
// 17. A listener group (three members, two copies) loses a member mid-load; it comes back.
// ---------------------------------------------------------------------------------------

/// Every member answers every message, the killed member's partitions are served within
/// 10 s, each trace's spans reach the OTLP receiver once, and the member restarted on its
/// store catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s17_listener_group_member_kill_9_mid_load() {
    let _serial = SERIAL.lock().await;
    group::group_member_kill_9("listener_group_member_kill_9").await;
}
