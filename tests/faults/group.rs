//! Scenario 17: a listener group loses a member. Three `msgtrail listener` processes in one
//! group (`--group faults --copies 2`), brokers with `--stage-partitions`, the usual load with
//! the consumer group, every member exporting to one OTLP receiver (this test's). At a third
//! of the load one member is SIGKILLed; once the load is done it starts again on its store.
//!
//! The oracle, beyond the usual one (read through a survivor's fan-out):
//! - **served**: every message acked before the kill whose partition the killed member held
//!   is answered by both survivors within 10 s of the kill;
//! - **every member answers every message**: the usual completeness check through each
//!   survivor, and through the restarted member once it has caught up;
//! - **caught up**: the restarted member announces each partition it holds ready, and its own
//!   store (`x-msgtrail-local`) holds every acked message of those partitions;
//! - **no record twice**: both owners of a message's partition hold the same number of
//!   records for it, and no trajectory lists a hop twice;
//! - **exactly one export per trace**: at the receiver, each ended hop of each acked
//!   message's trajectory arrived once — not twice (a takeover or a catch-up exporting
//!   again), not never (an export lost with the killed member).

use crate::harness::*;
use crate::{blocking, oracle, TRAJECTORY_WAIT};
use msgtrail_core::partition::Partition;
use msgtrail_core::trajectory::{HopStatus, Trajectory};
use msgtrail_core::MessageId;
use msgtrail_devkit::{flatten, OtlpReceiver};
use msgtrail_listener::cluster::{MemberInfo, LOCAL_HEADER, MEMBER_BUCKET};
use msgtrail_listener::ListenerClient;
use msgtrail_test_support::{free_port, ChildProcess};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The group's name.
const GROUP_NAME: &str = "faults";
/// The members, the first the one killed.
const MEMBERS: [&str; 3] = ["listener-a", "listener-b", "listener-c"];
/// How soon after the kill the survivors must answer for the killed member's partitions.
const SERVED_WITHIN: Duration = Duration::from_secs(10);
/// The exporters' grace for stragglers (`MSGTRAIL_OTEL_GRACE_MS`): short, so that a short
/// run's exports are done soon after its load.
const GRACE_MS: u64 = 300;

/// One member process and a client of its API.
struct Member {
    name: &'static str,
    addr: String,
    child: ChildProcess,
    client: ListenerClient,
}

/// Starts member `name` of the group, exporting to `otlp`; does not wait.
fn spawn_member(sys: &System, name: &'static str, otlp: &str) -> Member {
    let addr = format!("127.0.0.1:{}", free_port());
    let data = sys.dir().join(format!("{name}-data"));
    let args: Vec<String> = [
        "listener",
        "--data-dir",
        &data.display().to_string(),
        "--addr",
        &addr,
        "--group",
        GROUP_NAME,
        "--instance-name",
        name,
        "--copies",
        "2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let env = |k: &str, v: &str| (k.to_owned(), v.to_owned());
    let env = [
        env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp),
        env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        env("MSGTRAIL_OTEL_GRACE_MS", &GRACE_MS.to_string()),
        env("MSGTRAIL_OTEL_SAMPLE_RATIO", "1"),
        env("MSGTRAIL_OTEL_SPANS_PER_SECOND", "1000000"),
        env("RUST_LOG", "info"),
    ];
    let child = sys.spawn_msgtrail(name, &args, &env);
    let client = ListenerClient::new(&format!("http://{addr}"), None).unwrap();
    Member {
        name,
        addr,
        child,
        client,
    }
}

/// Waits until `m` answers `/healthz`.
async fn wait_healthy(m: &mut Member) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(m.client.get_raw("/healthz").await, Ok((200, _))) {
        if !m.child.is_running() || Instant::now() > deadline {
            panic!("{} never came up\n{}", m.name, m.child.log_tail(30));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The group's live members as their heartbeats say.
async fn heartbeats(sys: &System) -> BTreeMap<String, MemberInfo> {
    let js = async_nats::jetstream::new(sys.admin.clone());
    let mut out = BTreeMap::new();
    let Ok(kv) = js.get_key_value(MEMBER_BUCKET).await else {
        return out;
    };
    let Ok(keys) = kv.keys().await else {
        return out;
    };
    let keys: Vec<String> = futures::StreamExt::collect::<Vec<_>>(keys)
        .await
        .into_iter()
        .filter_map(Result::ok)
        .filter(|k| k.starts_with(&format!("{GROUP_NAME}.")))
        .collect();
    for k in keys {
        if let Ok(Some(v)) = kv.get(&k).await {
            if let Ok(info) = serde_json::from_slice::<MemberInfo>(&v) {
                out.insert(info.name.clone(), info);
            }
        }
    }
    out
}

/// Waits until exactly `live` members beat, every partition has two ready owners among them
/// and every member holds its share (none more, none nothing); returns how long it took.
async fn settled(sys: &System, live: &[&str], within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let hb = heartbeats(sys).await;
        let names: BTreeSet<&str> = hb.keys().map(String::as_str).collect();
        let want: BTreeSet<&str> = live.iter().copied().collect();
        let covered = Partition::all().all(|p| {
            hb.values()
                .filter(|m| m.partitions.iter().any(|h| h.partition == p && h.ready))
                .count()
                == 2
        });
        // Every copy placed once (a member that left released its share, one that came
        // back took its own again).
        let held: usize = hb.values().map(|m| m.partitions.len()).sum();
        let placed =
            held == 2 * Partition::all().count() && hb.values().all(|m| !m.partitions.is_empty());
        if names == want && covered && placed {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "the group never settled on {live:?} with two ready owners per partition: {hb:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `GET path` on `addr` with [`LOCAL_HEADER`] (the member's own store, no fan-out): status
/// and body.
async fn get_local(addr: &str, path: &str) -> Option<(u16, Vec<u8>)> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{LOCAL_HEADER}: 1\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let status: u16 = head.split_whitespace().nth(1)?.parse().ok()?;
    let mut body = buf[head_end + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    Some((status, body))
}

/// The body of a chunked HTTP/1.1 answer.
fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&b[..eol]).trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = eol + 2;
        out.extend_from_slice(&b[start..(start + size).min(b.len())]);
        b = &b[(start + size + 2).min(b.len())..];
    }
    out
}

/// The message's record count in `addr`'s own store (`None`: it does not hold it).
async fn local_records(addr: &str, mid: &str) -> Option<usize> {
    let (status, body) = get_local(addr, &format!("/api/messages/{mid}")).await?;
    if status != 200 {
        return None;
    }
    serde_json::from_slice::<Trajectory>(&body)
        .ok()
        .map(|t| t.record_count)
}

/// What the OTLP receiver got: per (message ID, hop key), how many times.
fn exports_by_hop(rx: &mut OtlpReceiver, into: &mut HashMap<(String, String), usize>) -> usize {
    let spans = flatten(&rx.drain());
    for s in &spans {
        let mid = s.attr("messaging.message.id").unwrap_or_default();
        let hop = s.attr("msgtrail.hop.key").unwrap_or_default();
        *into.entry((mid, hop)).or_default() += 1;
    }
    spans.len()
}

/// Runs the scenario (see the module docs).
pub(crate) async fn group_member_kill_9(scenario: &str) {
    let scale = Scale::pick(300, 2000);
    for rep in 1..=scale.reps {
        let mut rx = OtlpReceiver::start_http().await.expect("OTLP receiver");
        let mut sys = System::start(SystemOptions {
            brokers: 2,
            listener: false,
            broker_args: vec!["--stage-partitions".into()],
            ..Default::default()
        })
        .await;
        let mut members: Vec<Member> = MEMBERS
            .iter()
            .map(|n| spawn_member(&sys, n, &rx.endpoint()))
            .collect();
        for m in &mut members {
            wait_healthy(m).await;
        }
        let joined_ms = settled(&sys, &MEMBERS, Duration::from_secs(60)).await;
        // The oracle reads through a survivor's fan-out.
        sys.listener_addr = members[1].addr.clone();
        let killed_held: BTreeSet<Partition> = heartbeats(&sys).await[MEMBERS[0]]
            .partitions
            .iter()
            .map(|h| h.partition)
            .collect();

        let run = run_load(&sys, Load::new(scale.messages)).await;
        run.progress
            .wait_acked(scale.messages / 3, Duration::from_secs(60))
            .await;
        let fault_ms = run.history.now_ms();
        blocking(|| members[0].child.kill9()).expect("kill -9 listener-a");
        let killed = Instant::now();
        // Served: every message acked so far in the killed member's partitions answered by
        // both survivors.
        let before: Vec<MessageId> = run
            .progress
            .acked_message_ids()
            .into_iter()
            .filter(|m| killed_held.contains(&Partition::of_message(m)))
            .collect();
        let mut served_ms = 0.0;
        for m in &members[1..] {
            for mid in &before {
                loop {
                    if m.client.trajectory(&mid.to_string(), None).await.is_ok() {
                        break;
                    }
                    assert!(
                        killed.elapsed() < SERVED_WITHIN,
                        "{} did not serve {mid} of the killed member's partition {} within {SERVED_WITHIN:?}",
                        m.name,
                        Partition::of_message(mid)
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            served_ms = ms_since(killed, Instant::now());
        }
        let redundant_ms = settled(&sys, &MEMBERS[1..], Duration::from_secs(60)).await;
        let finished = run.finish().await;
        let mut r = oracle(&sys, scenario, &scale, rep, &finished, TRAJECTORY_WAIT).await;
        let uploads = finished.progress.uploads.lock().unwrap().clone();
        let consumed = finished.progress.consumed_ids.lock().unwrap().clone();
        // The other survivor answers every message too.
        let via_c =
            judge_trajectories(&members[2].client, &uploads, &consumed, TRAJECTORY_WAIT).await;

        // The killed member starts again on its store and catches up.
        blocking(|| members[0].child.restart()).expect("listener-a restarts");
        let restarted = Instant::now();
        wait_healthy(&mut members[0]).await;
        settled(&sys, &MEMBERS, Duration::from_secs(60)).await;
        let catch_up_ms = ms_since(restarted, Instant::now());
        let via_a =
            judge_trajectories(&members[0].client, &uploads, &consumed, TRAJECTORY_WAIT).await;
        let hb = heartbeats(&sys).await;
        let held_again: BTreeSet<Partition> = hb[MEMBERS[0]]
            .partitions
            .iter()
            .map(|h| h.partition)
            .collect();
        let owners = |p: Partition| -> BTreeSet<&str> {
            hb.values()
                .filter(|m| m.partitions.iter().any(|h| h.partition == p))
                .map(|m| m.name.as_str())
                .collect()
        };

        // Records: every store holding a message holds it whole, the same.
        let mut missing_locally = Vec::new();
        let mut records_disagree = Vec::new();
        let mut hops_twice = 0;
        for a in uploads.values() {
            let mid = a.message_id.to_string();
            // Its partition's owners now (a member that held it for a while after the kill
            // keeps what it applied then, and is not asked).
            let owned_by = owners(Partition::of_message(&a.message_id));
            let mut counts = BTreeMap::new();
            for m in members.iter().filter(|m| owned_by.contains(m.name)) {
                if let Some(n) = local_records(&m.addr, &mid).await {
                    counts.insert(m.name, n);
                }
            }
            if held_again.contains(&Partition::of_message(&a.message_id))
                && !counts.contains_key(MEMBERS[0])
            {
                missing_locally.push(mid.clone());
            }
            let distinct: BTreeSet<usize> = counts.values().copied().collect();
            if distinct.len() > 1 || counts.len() < 2 {
                records_disagree.push(json!({"message_id": mid, "records": counts}));
            }
            if let Some(t) = r_trajectory(&via_a, &mid) {
                let keys: BTreeSet<&str> = t.hops.iter().map(|h| h.key.as_str()).collect();
                if keys.len() != t.hops.len() {
                    hops_twice += 1;
                }
            }
        }

        // Exports: wait until nothing new arrives for a few graces, then count per hop.
        let mut exports = HashMap::new();
        let mut spans = 0;
        let mut quiet_since = Instant::now();
        while quiet_since.elapsed() < Duration::from_millis(GRACE_MS * 10 + 2000) {
            let n = exports_by_hop(&mut rx, &mut exports);
            if n > 0 {
                spans += n;
                quiet_since = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let mut exported_twice = Vec::new();
        let mut never_exported = Vec::new();
        let mut expected_hops = 0;
        for a in uploads.values() {
            let mid = a.message_id.to_string();
            let Some(t) = r_trajectory(&via_a, &mid) else {
                continue;
            };
            for h in t.hops.iter().filter(|h| h.status != HopStatus::Incomplete) {
                expected_hops += 1;
                match exports.get(&(mid.clone(), h.key.clone())).copied() {
                    None => never_exported.push(format!("{mid} {}", h.key)),
                    Some(1) => {}
                    Some(n) => exported_twice.push(format!("{mid} {} ×{n}", h.key)),
                }
            }
        }

        r.set(
            "fault",
            json!("SIGKILL listener-a of 3 (--group, --copies 2) at a third of the load; restarted on its store after the load"),
        )
        .set("fault_at_ms", json!(fault_ms.round()))
        .set("group_joined_ms", json!(joined_ms.as_millis() as u64))
        .set("killed_member_partitions", json!(killed_held.len()))
        .set("served_after_kill_ms", json!(served_ms.round()))
        .set("served_messages_checked", json!(before.len()))
        .set("two_copies_again_after_kill_ms", json!(redundant_ms.as_millis() as u64))
        .set("incomplete_via_listener_c", json!(via_c.incomplete.len()))
        .set("incomplete_via_restarted_listener_a", json!(via_a.incomplete.len()))
        .set("restart_caught_up_ms", json!(catch_up_ms.round()))
        .set("restarted_missing_own_partition_messages", json!(missing_locally.len()))
        .set("records_disagree", json!(records_disagree.len()))
        .set("hops_listed_twice", json!(hops_twice))
        .set(
            "export",
            json!({"spans_received": spans, "hops_expected": expected_hops,
                   "exported_twice": exported_twice.len(),
                   "never_exported": never_exported.len()}),
        );
        if !records_disagree.is_empty() {
            r.set(
                "records_disagree_sample",
                json!(records_disagree.iter().take(5).collect::<Vec<_>>()),
            );
        }
        if !exported_twice.is_empty() {
            r.set(
                "exported_twice_sample",
                json!(exported_twice.iter().take(5).collect::<Vec<_>>()),
            );
        }
        if !never_exported.is_empty() {
            r.set(
                "never_exported_sample",
                json!(never_exported.iter().take(5).collect::<Vec<_>>()),
            );
        }
        r.print();
        let logs = || {
            members
                .iter()
                .map(|m| format!("---- {} ----\n{}", m.name, m.child.log_tail(20)))
                .collect::<Vec<_>>()
                .join("\n")
        };
        r.assert_sound(true, &sys);
        let line = serde_json::Value::Object(r.json.clone()).to_string();
        assert!(
            !before.is_empty(),
            "nothing acked before the kill in its partitions"
        );
        assert_eq!(via_c.incomplete.len(), 0, "via listener-c: {line}");
        assert_eq!(
            via_a.incomplete.len(),
            0,
            "via the restarted listener-a: {line}\n{}",
            logs()
        );
        assert!(
            missing_locally.is_empty(),
            "the restarted member did not catch up: {line}"
        );
        assert!(
            records_disagree.is_empty(),
            "stores disagree on a message's records: {line}"
        );
        assert_eq!(hops_twice, 0, "a hop listed twice: {line}");
        assert!(expected_hops > 0, "no hop to export: {line}");
        assert!(
            exported_twice.is_empty(),
            "hops exported twice: {line}\n{}",
            logs()
        );
        assert!(
            never_exported.is_empty(),
            "hops never exported: {line}\n{}",
            logs()
        );
        for m in &mut members {
            drop(blocking(|| m.child.kill9()));
        }
    }
}

/// The trajectory of `mid` the verdict read.
fn r_trajectory<'a>(v: &'a TrajectoryVerdict, mid: &str) -> Option<&'a Trajectory> {
    v.trajectories.get(mid)
}
