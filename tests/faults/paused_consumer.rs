//! Scenario 13f: the consumer's own process (the SDK, here `msgtrail consume`) freezes
//! (SIGSTOP 8 s, four times the group's 2 s ack wait) while it holds fetched deliveries, and
//! wakes (SIGCONT). The deliveries it held must come again (trajectories show the
//! redelivery), nothing is lost or left incomplete, and a message the process never saw
//! acked must have its ack in the trajectory (applied, the answer lost to the freeze). A
//! process that exits is started again, as a supervisor would (`consumer_exits`), and must not
//! have been needed: a failed settle is logged and the process goes on (RELIABILITY.md,
//! finding 11). Acks refused `delivery_expired` — the deliveries it held past their ack
//! wait — are counted from its log.

use crate::harness::*;
use crate::pauses::PAUSE;
use crate::skew::consumed_by;
use crate::{blocking, oracle, TRAJECTORY_WAIT};
use msgtrail_core::trajectory::HopKind;
use serde_json::json;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

pub(crate) async fn consumer_process_paused(scenario: &str) {
    let scale = Scale::pick(300, 2000);
    for rep in 1..=scale.reps {
        let sys = System::start(SystemOptions::default()).await;
        // The uploads first, so that the consumer has a backlog to hold when it freezes.
        let run = run_load(
            &sys,
            Load {
                consume: false,
                ..Load::new(scale.messages)
            },
        )
        .await;
        let finished = run.finish().await;
        let seed = sys.dir().join("consumer.seed");
        std::fs::write(&seed, sys.consumer_id.seed()).unwrap();
        let args: Vec<String> = [
            "consume", "--group", GROUP, "--topic", "faults.>", "--every", "100ms", "--json",
        ]
        .map(String::from)
        .to_vec();
        let env = vec![
            (
                "MSGTRAIL_CLIENT_ID".to_owned(),
                "faults-billing-1".to_owned(),
            ),
            ("MSGTRAIL_SEED_FILE".to_owned(), seed.display().to_string()),
            (
                "MSGTRAIL_SERVICE_NAME".to_owned(),
                "faults-billing".to_owned(),
            ),
        ];
        let mut consumer = sys.spawn_msgtrail("consumer", &args, &env);
        let deadline = Instant::now() + Duration::from_secs(30);
        while consumed_by(&consumer.log()).len() < scale.messages / 10 && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let before = consumed_by(&consumer.log()).len();
        blocking(|| consumer.pause()).expect("SIGSTOP the consumer");
        tokio::time::sleep(PAUSE).await;
        blocking(|| consumer.resume()).expect("SIGCONT the consumer");
        let acked = finished.progress.acked_message_ids();
        let mut exits = 0;
        let deadline = Instant::now() + Duration::from_secs(60);
        // Done when every message was consumed, or nothing new came for three ack waits
        // (what is left had its ack applied without the process learning it: finding 8).
        let (mut seen, mut since) = (0, Instant::now());
        loop {
            let got: HashSet<_> = consumed_by(&consumer.log()).into_iter().collect();
            if got.len() > seen {
                (seen, since) = (got.len(), Instant::now());
            }
            let quiet = since.elapsed() > Duration::from_secs(6);
            if acked.iter().all(|m| got.contains(m)) || quiet || Instant::now() > deadline {
                break;
            }
            if !consumer.is_running() {
                exits += 1;
                blocking(|| consumer.restart()).expect("restart the consumer");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        blocking(|| consumer.terminate(Duration::from_secs(5))).expect("stop the consumer");
        let log = consumer.log();
        {
            let mut consumed = finished.progress.consumed_ids.lock().unwrap();
            for m in consumed_by(&log) {
                if consumed.insert(m) {
                    finished.progress.consumed.fetch_add(1, Ordering::SeqCst);
                }
            }
            // Never printed as acked: the oracle requires their trajectories to show the
            // group's ack (applied, the answer lost to the freeze) — never neither.
            let mut ambiguous = finished.progress.ack_ambiguous.lock().unwrap();
            ambiguous.extend(acked.iter().filter(|m| !consumed.contains(m)).copied());
        }
        let mut r = oracle(&sys, scenario, &scale, rep, &finished, TRAJECTORY_WAIT).await;
        let refused = log.matches("delivery_expired").count();
        let errors: Vec<&str> = log
            .lines()
            .filter(|l| !l.starts_with('{') && !l.trim().is_empty() && !l.starts_with("==="))
            .take(5)
            .collect();
        let client = sys.listener_client();
        let mut redelivered = 0;
        for m in &acked {
            if let Ok(t) = client.trajectory(&m.to_string(), None).await {
                if t.hops
                    .iter()
                    .any(|h| h.kind == HopKind::Deliver && h.attempt.unwrap_or(1) >= 2)
                {
                    redelivered += 1;
                }
            }
        }
        r.set(
            "fault",
            json!("SIGSTOP the consumer process (msgtrail consume) for 8 s while it holds deliveries, then SIGCONT"),
        )
        .set("consumed_before_pause", json!(before))
        .set("consumer_log_delivery_expired", json!(refused))
        .set("consumer_exits", json!(exits))
        .set("consumer_error_lines", json!(errors))
        .set("trajectories_with_redelivery", json!(redelivered));
        r.print();
        r.assert_sound(true, &sys);
        assert!(
            redelivered > 0,
            "no trajectory shows a redelivery: {:?}",
            r.json
        );
        assert_eq!(
            exits, 0,
            "the consumer process exited on waking: {:?}",
            r.json
        );
    }
}
