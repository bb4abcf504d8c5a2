//! Scenario 16: network partitions, for real. Every process runs in a Linux network
//! namespace of its own on one bridge (`SystemOptions::netns`; crates/test-support's
//! `netns`): the three cluster nodes (`n1`–`n3`), the two brokers, the listener, and the
//! test's producer, consumer and oracle on the root end (`root`). A cut moves one side's
//! bridge ports onto another bridge: packets between the sides are dropped and nobody is
//! told (no reset, links up), as in a real partition. After [`CUT`] the partition heals.
//!
//! Who is cut off ([`Cut`]): the node leading a stream alone (its clients must leave it for
//! the majority); that node together with broker-1 and the test's own clients (a minority
//! with a broker and clients on it: nothing may be reported stored there that the majority
//! does not hold); broker-1 alone; the listener alone.
//!
//! Besides the oracle, the scenario watches every node's `/connz` that the test can still
//! reach (its own side) and reports, per process, when its connections left the cut-off
//! side or were dropped by the server across the cut ([`Movement`]), and when each was back
//! after healing; and for a cut node when a new stream leader was elected and when it was a
//! current member of both streams again.

use crate::harness::*;
use crate::{
    blocking, cluster_of, oracle, rejoined, separate_leaders, stage_records, stream_leader, Role,
    TRAJECTORY_WAIT,
};
use msgtrail_core::subjects::{MESSAGE_STREAM, STAGE_STREAM};
use msgtrail_test_support::ROOT;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long a partition lasts: longer than 3 ping intervals (every client leaves a silent
/// node), the SDK's 3 × 2 s attempts and a JetStream election.
pub(crate) const CUT: Duration = Duration::from_secs(10);

/// What a scenario cuts off from the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cut {
    /// The node leading `role`'s stream; with `with_clients`, broker-1 and the test's own
    /// clients are on its (minority) side.
    Node {
        /// Which stream's leader.
        role: Role,
        /// broker-1 and the test's clients cut off with it.
        with_clients: bool,
    },
    /// broker-1 alone.
    Broker,
    /// The listener alone.
    Listener,
}

impl Cut {
    fn describe(self, sync_always: bool) -> String {
        let what = match self {
            Cut::Node {
                role,
                with_clients: false,
            } => format!("{} of a 3-node R3 cluster, alone", role.describe()),
            Cut::Node {
                role,
                with_clients: true,
            } => format!(
                "{} of a 3-node R3 cluster with broker-1 and the test's producer, consumer \
                 and oracle on its (minority) side",
                role.describe()
            ),
            Cut::Broker => "broker-1 of 2 (3-node R3 cluster)".into(),
            Cut::Listener => "the listener (3-node R3 cluster, 2 brokers)".into(),
        };
        let fsync = if sync_always {
            "sync_interval: always"
        } else {
            "default fsync"
        };
        format!(
            "network partition: {what} cut off at a third of a paced load for {} s, then \
             healed; {fsync}",
            CUT.as_secs()
        )
    }
}

/// The host label of a cluster node name (`faults-n2` → `n2`).
fn node_label(node: &str) -> String {
    node.trim_start_matches("faults-").to_owned()
}

/// A client connection as a node lists it: the node's index and its connection ID.
type ConnId = (usize, u64);

/// Client connections by the host they come from (its label), on the nodes `nodes` (by
/// index) — those the test can reach; a node that does not answer lists nothing.
fn connections_by_host(sys: &System, nodes: &[usize]) -> BTreeMap<String, BTreeSet<ConnId>> {
    let net = sys.network().expect("a partition scenario has namespaces");
    let by_ip: HashMap<String, String> = net
        .hosts()
        .iter()
        .map(|h| (h.addr().to_string(), h.label().to_owned()))
        .collect();
    let cluster = cluster_of(sys);
    let mut out: BTreeMap<String, BTreeSet<ConnId>> = BTreeMap::new();
    for &i in nodes {
        let Ok(v) = blocking(|| cluster.nodes[i].monitor("/connz?limit=1024")) else {
            continue;
        };
        for c in v["connections"].as_array().into_iter().flatten() {
            let ip = c["ip"].as_str().unwrap_or_default();
            let label = by_ip.get(ip).cloned().unwrap_or_else(|| ip.to_owned());
            let cid = c["cid"].as_u64().unwrap_or_default();
            out.entry(label).or_default().insert((i, cid));
        }
    }
    out
}

fn count(conns: &BTreeMap<String, BTreeSet<ConnId>>, label: &str) -> usize {
    conns.get(label).map_or(0, BTreeSet::len)
}

/// The leader of `stream` as the node `i` sees it (`/jsz?accounts=true&streams=true`; no
/// NATS connection involved, so it answers while the test's own connection moves).
fn stream_leader_seen_by(sys: &System, i: usize, stream: &str) -> Option<String> {
    let v = blocking(|| {
        cluster_of(sys).nodes[i].monitor("/jsz?accounts=true&streams=true&config=true")
    })
    .ok()?;
    v["account_details"]
        .as_array()?
        .iter()
        .flat_map(|a| a["stream_detail"].as_array().cloned().unwrap_or_default())
        .find(|s| s["name"].as_str() == Some(stream))
        .and_then(|s| s["cluster"]["leader"].as_str().map(str::to_owned))
        .filter(|l| !l.is_empty())
}

/// When each process's connections reached where they belong during and after the cut.
#[derive(Debug, Default)]
struct Movement {
    /// Connections per host before the cut (all nodes).
    before: BTreeMap<String, BTreeSet<ConnId>>,
    /// The connections of `before` the cut broke (host and node on different sides).
    broken: BTreeSet<ConnId>,
    /// Per host on the test's side: ms after the cut until all its connections were on the
    /// nodes of that side again (it left the cut-off node). Per host across the cut: ms until
    /// the test's side's nodes held none of its connections (the server dropped them).
    settled_ms: BTreeMap<String, Option<f64>>,
    /// Per host: ms after healing until the nodes held as many of its connections as before
    /// the cut, not counting connections the cut broke that a node still lists.
    back_ms: BTreeMap<String, Option<f64>>,
    /// ms after healing until no node listed any connection the cut broke (a server keeps a
    /// black-holed client until its own pings fail: nats-server's default interval is 2 min).
    broken_gone_ms: Option<f64>,
    /// Broken connections still listed at the moment of healing.
    broken_listed_at_heal: usize,
    /// ms after the cut until a node of the test's side named a new leader of the stream
    /// (node cuts only).
    new_leader_ms: Option<f64>,
}

impl Movement {
    fn json(&self) -> Value {
        let before: BTreeMap<&String, usize> =
            self.before.iter().map(|(k, v)| (k, v.len())).collect();
        json!({
            "connections_before": before,
            "connections_broken_by_cut": self.broken.len(),
            "broken_still_listed_at_heal": self.broken_listed_at_heal,
            "broken_gone_after_heal_ms": self.broken_gone_ms,
            "settled_after_cut_ms": self.settled_ms,
            "back_after_heal_ms": self.back_ms,
            "new_stream_leader_after_ms": self.new_leader_ms,
        })
    }
}

fn ms(since: Instant) -> f64 {
    (since.elapsed().as_secs_f64() * 10_000.0).round() / 10.0
}

/// Runs one partition scenario: see the module docs.
pub(crate) async fn partition(scenario: &str, cut: Cut, sync_always: bool) {
    let scale = Scale::pick(300, 1000);
    for rep in 1..=scale.reps {
        let mut sys = System::start(SystemOptions {
            cluster: true,
            netns: true,
            nats_sync_always: sync_always,
            brokers: 2,
            ..Default::default()
        })
        .await;
        let before = separate_leaders(&sys).await;
        // Paced (8 tasks, 250 ms apart: ~10 s undisturbed) so that the load still runs when
        // the partition heals.
        let load = Load {
            pace: Duration::from_millis(250),
            ..Load::new(scale.messages)
        };
        let run = run_load(&sys, load).await;
        run.progress
            .wait_acked(scale.messages / 3, Duration::from_secs(60))
            .await;
        let names = cluster_of(&sys).names();
        let victim_node = match cut {
            Cut::Node { role, .. } => {
                let js = async_nats::jetstream::new(sys.admin.clone());
                let stream = match role {
                    Role::StageStream => STAGE_STREAM,
                    _ => MESSAGE_STREAM,
                };
                Some(
                    stream_leader(&js, stream)
                        .await
                        .unwrap_or_else(|| panic!("no leader of {stream}")),
                )
            }
            _ => None,
        };
        let mut side: Vec<String> = match cut {
            Cut::Node { with_clients, .. } => {
                let mut s = vec![node_label(victim_node.as_deref().unwrap())];
                if with_clients {
                    s.extend(["broker-1".to_owned(), ROOT.to_owned()]);
                }
                s
            }
            Cut::Broker => vec!["broker-1".into()],
            Cut::Listener => vec!["listener".into()],
        };
        side.sort();
        let test_side_cut = side.iter().any(|l| l == ROOT);
        let on_test_side = |label: &str| side.iter().any(|l| l == label) == test_side_cut;
        let all: Vec<usize> = (0..names.len()).collect();
        let reachable: Vec<usize> = all
            .iter()
            .copied()
            .filter(|&i| on_test_side(&node_label(&names[i])))
            .collect();
        let mut mv = Movement {
            before: connections_by_host(&sys, &all),
            ..Default::default()
        };
        let side_of = |label: &str| side.iter().any(|l| l == label);
        mv.broken = mv
            .before
            .iter()
            .flat_map(|(label, ids)| {
                ids.iter()
                    .filter(|(node, _)| side_of(&node_label(&names[*node])) != side_of(label))
                    .copied()
                    .collect::<Vec<_>>()
            })
            .collect();
        let leads_at_cut = match &victim_node {
            Some(v) => crate::led_by(&sys, v, &crate::Leaders::read(&sys).await).await,
            None => vec![],
        };
        let acked_at_cut = run.progress.acked.load(Ordering::SeqCst);
        let fault_ms = run.history.now_ms();
        let side_refs: Vec<&str> = side.iter().map(String::as_str).collect();
        let cut_at = Instant::now();
        sys.cut_off(&side_refs);
        // Watch the test's side of the partition while it lasts.
        let stream = match cut {
            Cut::Node {
                role: Role::StageStream,
                ..
            } => STAGE_STREAM,
            _ => MESSAGE_STREAM,
        };
        while cut_at.elapsed() < CUT {
            let now = connections_by_host(&sys, &reachable);
            for (label, ids) in &mv.before {
                let settled = if on_test_side(label) {
                    count(&now, label) >= ids.len()
                } else {
                    count(&now, label) == 0
                };
                let entry = mv.settled_ms.entry(label.clone()).or_insert(None);
                if settled && entry.is_none() {
                    *entry = Some(ms(cut_at));
                }
            }
            if let (Some(v), None) = (&victim_node, mv.new_leader_ms) {
                let seen = reachable
                    .iter()
                    .filter(|&&i| names[i] != *v)
                    .find_map(|&i| stream_leader_seen_by(&sys, i, stream));
                if seen.is_some_and(|l| l != *v) {
                    mv.new_leader_ms = Some(ms(cut_at));
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let acked_during_cut = run.progress.acked.load(Ordering::SeqCst) - acked_at_cut;
        let healed_ms = run.history.now_ms();
        let healed_at = Instant::now();
        sys.heal();
        let mid_load = !run.progress.producers_done.load(Ordering::SeqCst);
        // Every process's connections back; a cut node a current member of both streams.
        let js = async_nats::jetstream::new(sys.admin.clone());
        let mut rejoin_ms = None;
        let mut brokers_back_ms = None;
        let mut first = true;
        while healed_at.elapsed() < Duration::from_secs(60) {
            let now = connections_by_host(&sys, &all);
            let listed_broken = now
                .values()
                .flatten()
                .filter(|c| mv.broken.contains(c))
                .count();
            if first {
                mv.broken_listed_at_heal = listed_broken;
                first = false;
            }
            if listed_broken == 0 && mv.broken_gone_ms.is_none() {
                mv.broken_gone_ms = Some(ms(healed_at));
            }
            for (label, ids) in &mv.before {
                let working = now
                    .get(label)
                    .map_or(0, |c| c.iter().filter(|c| !mv.broken.contains(c)).count());
                let entry = mv.back_ms.entry(label.clone()).or_insert(None);
                if entry.is_none() && working >= ids.len() {
                    *entry = Some(ms(healed_at));
                }
            }
            if brokers_back_ms.is_none() && sys.broker_instances().await >= 2 {
                brokers_back_ms = Some(ms(healed_at));
            }
            if let (Some(v), None) = (&victim_node, rejoin_ms) {
                if rejoined(&js, MESSAGE_STREAM, v).await && rejoined(&js, STAGE_STREAM, v).await {
                    rejoin_ms = Some(ms(healed_at));
                }
            }
            let all_back = mv.back_ms.values().all(Option::is_some) && brokers_back_ms.is_some();
            // Broken connections a node still lists are waited for 20 s at most.
            let broken_done =
                mv.broken_gone_ms.is_some() || healed_at.elapsed() > Duration::from_secs(20);
            if all_back && broken_done && (victim_node.is_none() || rejoin_ms.is_some()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let finished = run.finish().await;
        let after = crate::Leaders::read(&sys).await;
        let mut r = oracle(&sys, scenario, &scale, rep, &finished, TRAJECTORY_WAIT).await;
        let stored = drain_messages(&sys.admin).await;
        let records = stage_records(&sys.admin).await;
        let contradictions = crate::pauses::stage_contradictions(&records, &stored);
        let h = &finished.history;
        r.set("fault", json!(cut.describe(sync_always)))
            .set("cut_off", json!(side))
            .set("sync_always", json!(sync_always))
            .set("fault_at_ms", json!(fault_ms.round()))
            .set("healed_at_ms", json!(healed_ms.round()))
            .set("healed_mid_load", json!(mid_load))
            .set("acked_at_cut", json!(acked_at_cut))
            .set("acked_during_cut", json!(acked_during_cut))
            .set("movement", mv.json())
            .set("brokers_answering_after_heal_ms", json!(brokers_back_ms))
            .set("stage_contradictions", json!(contradictions.len()))
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
            .set("recovery_ms", json!(h.recovery_ms(fault_ms)))
            .set("leaders_before_load", before.json())
            .set("leaders_after", after.json());
        if let Some(v) = &victim_node {
            r.set("cut_node", json!(v))
                .set("cut_node_leads", json!(leads_at_cut))
                .set("rejoined_after_heal_ms", json!(rejoin_ms));
        }
        let unconsumed = crate::pauses::unconsumed_diagnoses(&sys, &finished, 3).await;
        if !unconsumed.is_empty() {
            let ids: Vec<&String> = unconsumed.keys().collect();
            let mut attempts = BTreeMap::new();
            for o in h.ops().iter().filter(|o| o.kind == "ack") {
                if ids.contains(&&o.key) {
                    let e = attempts.entry(o.key.clone()).or_insert_with(Vec::new);
                    e.push(format!("{:.0}-{:.0} {:?}", o.start_ms, o.end_ms, o.outcome));
                }
            }
            r.set("unconsumed_diagnosis", json!(unconsumed))
                .set("unconsumed_ack_calls", json!(attempts));
        }
        r.print();
        r.assert_sound(true, &sys);
        assert!(
            contradictions.is_empty(),
            "stage records contradict the stream: {contradictions:?}"
        );
        assert_eq!(r.n("given_up"), 0, "uploads given up: {:?}", r.json);
        assert!(
            acked_at_cut < scale.messages,
            "the load was over before the cut: nothing was tested"
        );
        if let Some(v) = &victim_node {
            assert!(
                rejoin_ms.is_some(),
                "{v} did not rejoin both streams within 60 s of healing: {:?}",
                r.json
            );
        }
        let back: Vec<&String> = mv
            .back_ms
            .iter()
            .filter(|(_, t)| t.is_none())
            .map(|(l, _)| l)
            .collect();
        assert!(
            back.is_empty(),
            "not connected again 60 s after healing: {back:?}; {:?}",
            r.json
        );
        assert!(
            brokers_back_ms.is_some(),
            "not both brokers answer service discovery 60 s after healing: {:?}",
            r.json
        );
        if matches!(cut, Cut::Broker) {
            assert!(
                acked_during_cut > 0,
                "broker-2 acked nothing while broker-1 was cut off: {:?}",
                r.json
            );
        }
    }
}
