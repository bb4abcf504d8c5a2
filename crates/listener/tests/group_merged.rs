//! A listener group's merged answers, end to end on a real nats-server: three members
//! holding every partition twice (`--copies 2`) and, beside them, a single listener (no
//! group) reading the same stage stream — the single truth. A known load of consumed,
//! redelivered and dead-lettered messages is published per partition as brokers with
//! `--stage-partitions` do. `GET /api/stats` of EVERY member equals the truth (exact funnel,
//! events, states and latency histograms: no partition counted twice, none left out); so do
//! the group and dead-letter views. Then a member is killed: the survivors' answers stay
//! complete (each of its partitions has another ready owner) and stay equal to the truth as
//! more load arrives.

mod common;
use common::scenario::Scenario;
use common::*;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use msgtrail_core::trajectory::MessageState;
use msgtrail_core::{Stage, StageRecord};
use msgtrail_listener::cluster::{MISSING_PARTITIONS_HEADER, PARTIAL_HEADER};
use msgtrail_listener::ListenerHandle;
use msgtrail_listener::{LatencyStats, StatsSnapshot};
use msgtrail_nats::topology::{stage_stream, DEFAULT_STAGE_MAX_AGE};
use msgtrail_test_support::NatsServer;
use std::time::Duration;

/// The consumer group of the load.
const GROUP: &str = "billing";
/// Its consumer.
const CONSUMER: &str = "b-1";

/// What happens to one message of the load.
#[derive(Clone, Copy, PartialEq)]
enum Fate {
    /// Delivered once and acked.
    Consumed,
    /// Failed once (nacked, redelivered), acked on the second attempt.
    Redelivered,
    /// Failed once and dead-lettered.
    DeadLettered,
}

/// The fate of the `i`-th message: every 4th redelivered, every 7th dead-lettered.
fn fate(i: u64) -> Fate {
    if i % 7 == 3 {
        Fate::DeadLettered
    } else if i % 4 == 1 {
        Fate::Redelivered
    } else {
        Fate::Consumed
    }
}

/// `n` messages of the load (`prefix` keeps request IDs apart); their records.
fn load(n: u64, prefix: &str) -> Vec<StageRecord> {
    let t0 = now();
    let mut all = Vec::new();
    for i in 0..n {
        let mut s = Scenario::new(t0, "shop", &format!("{prefix}-{i}"), "orders.eu");
        // Latencies that differ per message, so that the percentiles mean something.
        s.stored(i);
        let at = i + 20 + (i * 37) % 400;
        match fate(i) {
            Fate::Consumed => {
                s.pull(at, GROUP, CONSUMER, 1, None);
            }
            Fate::Redelivered => {
                s.pull(at, GROUP, CONSUMER, 1, Some("boom")).pull(
                    at + 30,
                    GROUP,
                    CONSUMER,
                    2,
                    None,
                );
            }
            Fate::DeadLettered => {
                dead_letter(&mut s, at);
            }
        }
        all.extend(s.out);
    }
    all
}

/// A failed delivery the broker dead-letters (its R1 `dead_letter`).
fn dead_letter(s: &mut Scenario, ms: u64) {
    let d = |s: &mut Scenario, stage, ms, outcome, detail| {
        s.deliver(stage, ms, GROUP, CONSUMER, 1, outcome, detail);
    };
    d(s, Stage::PullSent, ms, None, None);
    d(s, Stage::PullReceived, ms + 1, None, None);
    d(s, Stage::ProcessStarted, ms + 2, None, None);
    d(
        s,
        Stage::ProcessFinished,
        ms + 5,
        Some("failed"),
        Some("boom"),
    );
    d(s, Stage::PullAckSent, ms + 6, Some("term"), None);
    d(s, Stage::PullAckReceived, ms + 7, Some("term"), None);
    d(
        s,
        Stage::Redelivery,
        ms + 8,
        Some("dead_letter"),
        Some("max deliveries reached"),
    );
}

/// How many of the first `n` messages meet `f`.
fn count(n: u64, f: Fate) -> u64 {
    (0..n).filter(|i| fate(*i) == f).count() as u64
}

/// An answer of the API: status, the partial-answer headers, the body.
struct Answer {
    status: u16,
    partial: Option<String>,
    missing: Option<String>,
    body: Vec<u8>,
}

/// `GET path` of `h`'s API.
async fn get(h: &ListenerHandle, path: &str) -> Answer {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let uri: hyper::Uri = format!("http://{}{path}", h.http_addr()).parse().unwrap();
    let resp = client.get(uri).await.unwrap();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let (status, partial, missing) = (
        resp.status().as_u16(),
        header(PARTIAL_HEADER),
        header(MISSING_PARTITIONS_HEADER),
    );
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Answer {
        status,
        partial,
        missing,
        body,
    }
}

/// The figures of a snapshot that must agree between the group and the truth: everything
/// but this process's own ingest counters, lag and times, and the latency rates (each over
/// its listener's uptime).
fn figures(s: &StatsSnapshot) -> serde_json::Value {
    let latency: Vec<_> = s
        .latency
        .iter()
        .map(|r| {
            // The mean to a nanosecond: a merged histogram sums its buckets in another
            // float order.
            let l = |x: &LatencyStats| {
                let mean = (x.mean_ms * 1e6).round();
                (x.count, x.p50_ms, x.p90_ms, x.p99_ms, x.max_ms, mean)
            };
            (r.topic.clone(), r.segment, l(&r.window), l(&r.total))
        })
        .collect();
    serde_json::json!({
        "states": s.states,
        "topics": s.topics,
        "funnel": s.funnel,
        "events": s.events,
        "stages": s.stages,
        "records": s.ingest.records,
        "latency": latency,
    })
}

/// A complete merged `/api/stats` of `h` whose figures are `want`'s; fails after 20 s
/// with the last difference.
async fn stats_equal(who: &str, h: &ListenerHandle, want: &StatsSnapshot) -> StatsSnapshot {
    let want_f = figures(want);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let a = get(h, "/api/stats").await;
        assert_eq!(a.status, 200);
        let s: StatsSnapshot = serde_json::from_slice(&a.body).unwrap();
        let complete = a.partial.is_none() && a.missing.is_none();
        let f = figures(&s);
        if complete && f == want_f {
            return s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{who}'s /api/stats (partial {:?}, missing {:?}):\n{f}\nthe truth:\n{want_f}",
            a.partial,
            a.missing
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A view's JSON without what depends on when and where it was computed: the window's
/// start, the time of the answer, rates.
fn timeless(mut v: serde_json::Value) -> serde_json::Value {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                for k in ["from", "generated_at", "ack_rate_per_sec"] {
                    m.remove(k);
                }
                m.values_mut().for_each(strip);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    v
}

/// The JSON of `h`'s answer to `path`, [`timeless`].
async fn view(h: &ListenerHandle, path: &str) -> serde_json::Value {
    timeless(serde_json::from_slice(&get(h, path).await.body).unwrap())
}

/// A complete merged answer of `h` to `path` equal to the truth's ([`timeless`]); fails
/// after 20 s with the last difference.
async fn view_equal(who: &str, h: &ListenerHandle, truth: &ListenerHandle, path: &str) {
    let want = view(truth, path).await;
    let want_status = get(truth, path).await.status;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let a = get(h, path).await;
        let got = timeless(serde_json::from_slice(&a.body).unwrap());
        if a.status == want_status && a.partial.is_none() && a.missing.is_none() && got == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{who}'s {path} ({}, partial {:?}, missing {:?}):\n{got}\nthe truth:\n{want}",
            a.status,
            a.partial,
            a.missing
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The truth once it applied `n` messages of the load (every record of them).
async fn truth_after(h: &ListenerHandle, n: u64) -> StatsSnapshot {
    eventually(
        &format!("the truth having {n} messages settled"),
        || async {
            let s = h.stats(None);
            let settled = s.states.get(&MessageState::Consumed).copied().unwrap_or(0)
                + s.states
                    .get(&MessageState::DeadLettered)
                    .copied()
                    .unwrap_or(0);
            (settled == n && s.funnel.sent == n).then_some(s)
        },
    )
    .await
}

/// The exact figures of `n` messages of the load.
fn assert_exact(s: &StatsSnapshot, n: u64) {
    let (dead, again) = (count(n, Fate::DeadLettered), count(n, Fate::Redelivered));
    assert_eq!(s.funnel.sent, n);
    assert_eq!(s.funnel.stored, n);
    assert_eq!(s.funnel.delivered, n);
    assert_eq!(s.funnel.acked, n - dead);
    assert_eq!(s.events.redeliveries, again);
    assert_eq!(s.events.dead_letters, dead);
    assert_eq!(
        s.states.get(&MessageState::Consumed).copied(),
        Some(n - dead)
    );
    assert_eq!(
        s.states.get(&MessageState::DeadLettered).copied(),
        Some(dead)
    );
    assert_eq!(s.stages.get("P1").copied(), Some(n));
    assert_eq!(s.stages.get("R1").copied(), Some(again + dead));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_member_answers_the_group_s_statistics_once_per_partition() {
    let server = NatsServer::start().unwrap();
    let js = nats(&server).await;
    js.get_or_create_stream(stage_stream(1, DEFAULT_STAGE_MAX_AGE))
        .await
        .unwrap();
    let dirs: Vec<tempfile::TempDir> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let truth = msgtrail_listener::start(single_listener(server.url(), dirs[3].path()))
        .await
        .unwrap();
    let mut members = Vec::new();
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        let cfg = group_member(server.url(), dirs[i].path(), "g", name, 2);
        members.push(msgtrail_listener::start(cfg).await.unwrap());
    }

    let n = 70;
    publish_partitioned(&js, &load(n, "first")).await;
    let want = truth_after(&truth, n).await;
    assert_exact(&want, n);
    for (name, h) in ["a", "b", "c"].iter().zip(&members) {
        let got = stats_equal(name, h, &want).await;
        assert_exact(&got, n);
        // What `msgtrail stats` reads (the API client) is the merged figures too.
        let cli = client(h).stats(None).await.unwrap();
        assert_eq!(figures(&cli), figures(&want), "{name}: msgtrail stats");
    }
    // Every dead letter once, wherever its partition lives.
    let dead: serde_json::Value =
        serde_json::from_slice(&get(&truth, "/api/dead-letters?limit=1000").await.body).unwrap();
    assert_eq!(
        dead.as_array().unwrap().len() as u64,
        count(n, Fate::DeadLettered)
    );
    for (name, h) in ["a", "b", "c"].iter().zip(&members) {
        view_equal(name, h, &truth, "/api/dead-letters?limit=1000").await;
        view_equal(name, h, &truth, "/api/dead-letters?limit=3").await;
    }
    // The consumer-group views: counts of every message once, percentiles over every
    // member's samples.
    let overview = view(&truth, "/api/groups").await;
    let billing = &overview["groups"][0];
    assert_eq!(billing["group"], GROUP);
    assert_eq!(billing["messages"], n);
    assert_eq!(billing["consumed"], n - count(n, Fate::DeadLettered));
    assert_eq!(billing["dead_letters"], count(n, Fate::DeadLettered));
    let detail = view(&truth, "/api/groups/billing").await;
    assert_eq!(detail["redeliveries"], count(n, Fate::Redelivered));
    assert_eq!(detail["sample"], n);
    for (name, h) in ["a", "b", "c"].iter().zip(&members) {
        view_equal(name, h, &truth, "/api/groups").await;
        view_equal(name, h, &truth, "/api/groups/billing").await;
        view_equal(name, h, &truth, "/api/groups/nobody").await;
    }
    // What a merged answer costs here (three members on one machine): printed, not judged.
    let mut took: Vec<Duration> = Vec::new();
    for _ in 0..20 {
        let start = std::time::Instant::now();
        assert_eq!(get(&members[1], "/api/stats").await.status, 200);
        took.push(start.elapsed());
    }
    took.sort();
    eprintln!(
        "merged /api/stats: median {:?}, max {:?}",
        took[10], took[19]
    );

    // Adding the members' own answers (what each /api/stats said before the merge) counts
    // every message at least twice: each partition is on two members.
    let own_sent: u64 = members.iter().map(|h| h.stats(None).funnel.sent).sum();
    assert!(
        own_sent >= 2 * n,
        "the copies: {own_sent} sent over the members"
    );

    // Kill member a: its partitions are on b or c too, so the answers stay complete.
    let a = members.remove(0);
    a.abort().await;
    let n2 = 35;
    publish_partitioned(&js, &load(n2, "second")).await;
    let want = truth_after(&truth, n + n2).await;
    assert_exact_sum(&want, n, n2);
    for (name, h) in ["b", "c"].iter().zip(&members) {
        stats_equal(name, h, &want).await;
        view_equal(name, h, &truth, "/api/dead-letters?limit=1000").await;
        view_equal(name, h, &truth, "/api/groups/billing").await;
    }
    for h in members {
        h.shutdown().await.unwrap();
    }
    truth.shutdown().await.unwrap();
}

/// [`assert_exact`] of two loads of `n1` and `n2` messages.
fn assert_exact_sum(s: &StatsSnapshot, n1: u64, n2: u64) {
    let dead = count(n1, Fate::DeadLettered) + count(n2, Fate::DeadLettered);
    let again = count(n1, Fate::Redelivered) + count(n2, Fate::Redelivered);
    let n = n1 + n2;
    assert_eq!(
        (s.funnel.sent, s.funnel.acked),
        (n, n - dead),
        "funnel {:?}",
        s.funnel
    );
    assert_eq!(
        (s.events.redeliveries, s.events.dead_letters),
        (again, dead)
    );
    assert_eq!(
        s.states.get(&MessageState::DeadLettered).copied(),
        Some(dead)
    );
}

/// Counters by name.
type Counters = std::collections::BTreeMap<String, u64>;

/// A store's plain counters, and its per-partition ones (`part/<NN>/<name>`) summed over
/// the partitions by plain name.
fn split_counters(store: &msgtrail_listener::Store) -> (Counters, Counters) {
    let (mut plain, mut summed) = (Counters::new(), Counters::new());
    for (name, v) in store.counters().unwrap() {
        match name.strip_prefix("part/").and_then(|r| r.split_once('/')) {
            Some((_, rest)) => *summed.entry(rest.to_owned()).or_default() += v,
            None => {
                plain.insert(name, v);
            }
        }
    }
    (plain, summed)
}

/// A group member's store keeps every counter per partition too: a batch of mixed
/// partitions (as store evidence is) splits by partition, and the partitions add up to the
/// plain counters exactly. A single listener's store keeps no partition counters, and its
/// plain counters are the same.
#[test]
fn a_partitioned_store_s_partitions_add_up_to_its_counters() {
    let records = load(40, "mixed");
    let (single_dir, member_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let single =
        msgtrail_listener::Store::open(single_dir.path(), 256, Default::default()).unwrap();
    let member = msgtrail_listener::Store::open(member_dir.path(), 256, Default::default())
        .unwrap()
        .partitioned(true);
    let t = now();
    for batch in records.chunks(100) {
        single.apply(batch.to_vec(), t).unwrap();
        member.apply(batch.to_vec(), t).unwrap();
    }
    let (plain, none) = split_counters(&single);
    assert!(none.is_empty(), "no partition counters: {none:?}");
    let (global, summed) = split_counters(&member);
    assert_eq!(
        global, plain,
        "the plain counters do not depend on partitions"
    );
    assert_eq!(
        summed, global,
        "the partitions add up to the plain counters"
    );
    assert_eq!(global["funnel.sent"], 40);
    assert_eq!(
        global["topic/orders.eu/state.dead_lettered"],
        count(40, Fate::DeadLettered)
    );
}

/// A store written without partition counters (a single listener's, an older version's)
/// keeps its counters when it joins a group: they stay in the plain names ("unpartitioned",
/// what a single listener shows), and only what it applies as a member counts per partition.
#[test]
fn counters_written_before_partitions_stay_unpartitioned() {
    let dir = tempfile::tempdir().unwrap();
    let t = now();
    let before = {
        let old = msgtrail_listener::Store::open(dir.path(), 256, Default::default()).unwrap();
        old.apply(load(20, "old"), t).unwrap();
        old.counters().unwrap()
    };
    let member = msgtrail_listener::Store::open(dir.path(), 256, Default::default())
        .unwrap()
        .partitioned(true);
    let (plain, summed) = split_counters(&member);
    assert_eq!(plain, before, "the old counters are kept as they were");
    assert!(summed.is_empty(), "{summed:?}");
    member.apply(load(15, "new"), t).unwrap();
    let (plain, summed) = split_counters(&member);
    assert_eq!(
        plain["funnel.sent"], 35,
        "the plain counters count everything"
    );
    assert_eq!(
        summed["funnel.sent"], 15,
        "the partitions count what came since"
    );
    assert_eq!(summed["dead_letters"], count(15, Fate::DeadLettered));
}
