//! Scenario 13: a process freezes mid-load (SIGSTOP, a GC stall, a stopped container, a VM
//! migration) for longer than every timeout, and comes back (SIGCONT) while the others moved
//! on: one of two brokers, the listener, the only nats-server. (A paused node of the 3-node
//! cluster is scenario 7's function with a pause instead of a kill; a paused consumer is
//! `paused_consumer.rs`.)
//!
//! A paused broker wakes holding requests whose clients have long retried elsewhere: it
//! stores them (JetStream's dedup window names them duplicates) and answers them into
//! inboxes nobody reads any more. The oracle's `duplicated` and `mismatched` say whether
//! anything was stored twice or a client took a stale answer for its own, and
//! [`stage_contradictions`] whether a stage record disagrees with the stream.

use crate::harness::*;
use crate::{blocking, oracle, stage_records, TRAJECTORY_WAIT};
use msgtrail_core::{Stage, StageRecord};
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How long a paused process stays frozen: longer than the SDK's request timeout (2 s in the
/// suite) times its 3 attempts, the group's ack wait (2 s), a settle's wait for its stage
/// records (5 s) and 3 ping intervals (msgtrail's default 2 s: every peer's connection to the
/// frozen process is dropped before it wakes).
pub(crate) const PAUSE: Duration = Duration::from_secs(8);

/// The process a scenario freezes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Paused {
    /// broker-1 of 2.
    Broker,
    /// The listener.
    Listener,
    /// The only nats-server.
    NatsServer,
}

impl Paused {
    fn describe(self) -> &'static str {
        match self {
            Paused::Broker => "SIGSTOP broker-1 of 2 for 8 s at a third of the load, then SIGCONT",
            Paused::Listener => "SIGSTOP the listener for 8 s at a third of the load, then SIGCONT",
            Paused::NatsServer => {
                "SIGSTOP the only nats-server for 8 s at a third of the load, then SIGCONT"
            }
        }
    }
}

/// Stage records that contradict the message stream: a record naming a message ID that no
/// stored message has, or a request ID together with another message ID than the one it is
/// stored under (what a broker waking with stale requests could write).
pub(crate) fn stage_contradictions(
    records: &[StageRecord],
    stored: &[StoredMessage],
) -> Vec<String> {
    let by_request: HashMap<&str, &str> = stored
        .iter()
        .map(|m| (m.request_id.as_str(), m.message_id.as_str()))
        .collect();
    let ids: std::collections::HashSet<&str> =
        stored.iter().map(|m| m.message_id.as_str()).collect();
    let mut out = vec![];
    for r in records {
        let Some(mid) = r.message_id.map(|m| m.to_string()) else {
            continue;
        };
        if !ids.contains(mid.as_str()) {
            out.push(format!("{} of never-stored message {mid}", r.stage.code()));
            continue;
        }
        if let Some(rid) = &r.request_id {
            if let Some(want) = by_request.get(rid.as_str()) {
                if *want != mid {
                    out.push(format!(
                        "{} says request {rid} is {mid}, the stream says {want}",
                        r.stage.code()
                    ));
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// D1 records (a duplicate upload suppressed) written at or after `from_unix_ns`.
pub(crate) fn duplicates_recorded_since(records: &[StageRecord], from_unix_ns: u64) -> usize {
    records
        .iter()
        .filter(|r| r.stage == Stage::Duplicate && r.at >= from_unix_ns)
        .count()
}

/// The listener's diagnosis of up to `n` acked uploads the consumer never got to ack.
pub(crate) async fn unconsumed_diagnoses(
    sys: &System,
    finished: &Finished,
    n: usize,
) -> std::collections::BTreeMap<String, String> {
    let ids: Vec<String> = {
        let uploads = finished.progress.uploads.lock().unwrap();
        let consumed = finished.progress.consumed_ids.lock().unwrap();
        uploads
            .values()
            .filter(|a| !consumed.contains(&a.message_id))
            .take(n)
            .map(|a| a.message_id.to_string())
            .collect()
    };
    let client = sys.listener_client();
    let mut out = std::collections::BTreeMap::new();
    for mid in ids {
        let d = match client.trajectory(&mid, None).await {
            Ok(t) => t.diagnosis.clone(),
            Err(e) => format!("listener: {e}"),
        };
        out.insert(mid, d);
    }
    out
}

/// Two brokers on one nats-server, a consumer group; `target` is frozen for [`PAUSE`] at a
/// third of the load and woken again.
pub(crate) async fn single_node_pause(scenario: &str, target: Paused) {
    let scale = Scale::pick(300, 2000);
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
        let acked_before = run.progress.acked.load(Ordering::SeqCst);
        let fault_ms = run.history.now_ms();
        blocking(|| match target {
            Paused::Broker => sys.brokers[0].pause(),
            Paused::Listener => sys.listener.as_mut().expect("a listener").pause(),
            Paused::NatsServer => match &mut sys.nats {
                Nats::Single(n) => n.pause(),
                Nats::Cluster(_) => unreachable!("one node"),
            },
        })
        .expect("SIGSTOP");
        tokio::time::sleep(PAUSE).await;
        let acked_while_paused = run.progress.acked.load(Ordering::SeqCst) - acked_before;
        let woke_unix = msgtrail_core::time::now_nanos();
        let woke_ms = run.history.now_ms();
        blocking(|| match target {
            Paused::Broker => sys.brokers[0].resume(),
            Paused::Listener => sys.listener.as_mut().expect("a listener").resume(),
            Paused::NatsServer => match &mut sys.nats {
                Nats::Single(n) => n.resume(),
                Nats::Cluster(_) => unreachable!("one node"),
            },
        })
        .expect("SIGCONT");
        let finished = run.finish().await;
        let mut r = oracle(&sys, scenario, &scale, rep, &finished, TRAJECTORY_WAIT).await;
        let stored = drain_messages(&sys.admin).await;
        let records = stage_records(&sys.admin).await;
        let contradictions = stage_contradictions(&records, &stored);
        let h = &finished.history;
        r.set("fault", json!(target.describe()))
            .set("fault_at_ms", json!(fault_ms.round()))
            .set("paused_ms", json!((woke_ms - fault_ms).round()))
            .set("acked_while_paused", json!(acked_while_paused))
            .set(
                "duplicates_suppressed_after_wake",
                json!(duplicates_recorded_since(&records, woke_unix)),
            )
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
            )
            .set("stage_contradictions", json!(contradictions.len()))
            .set("recovery_ms", json!(h.recovery_ms(fault_ms)));
        let unconsumed = unconsumed_diagnoses(&sys, &finished, 3).await;
        if !unconsumed.is_empty() {
            r.set("unconsumed_diagnosis", json!(unconsumed));
        }
        if !contradictions.is_empty() {
            r.set(
                "stage_contradiction_sample",
                json!(&contradictions[..contradictions.len().min(5)]),
            );
        }
        r.print();
        r.assert_sound(true, &sys);
        assert!(
            contradictions.is_empty(),
            "stage records contradict the stream: {:?}",
            r.json
        );
        assert_eq!(
            r.n("given_up"),
            0,
            "uploads given up after the pause: {:?}",
            r.json
        );
        if target == Paused::Broker {
            // The other broker carried the load while broker-1 was frozen.
            assert!(
                acked_while_paused > 0,
                "nothing acked while one of two brokers was paused: {:?}",
                r.json
            );
        }
    }
}
