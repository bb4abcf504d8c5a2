//! S4P: what a listener group buys and costs (docs/ARCHITECTURE.md, decision 12).
//!
//! - *Ingest scaling*: S4's synthetic mix split by partition as brokers with
//!   `--stage-partitions` publish it, ingested by one listener (every partition) and by two
//!   at once (each half of the partitions, its own store), each on its own thread pinned to a
//!   core of its own (`taskset -p -c <cpu> <thread id>`; `pinned` says whether it took).
//!   `scaling` = the two's aggregate records per second (all records ÷ the slower one's
//!   time) ÷ the one's, per repetition (one, then two, `--reps` times); the report gives the
//!   median and the spread, since a single pair on two cores moves by ±20 % with whatever
//!   else the machine does. Target ≥ 1.8.
//! - *Fan-out cost*: two in-process listeners in a group (`--copies 1`) on the bench's
//!   nats-server, the mix's first messages published per partition; then `GET
//!   /api/messages/<id>` on member 1 for IDs member 2 holds (forwarded: one more HTTP hop)
//!   against the same member's own IDs read with `x-msgtrail-local` (a single listener's
//!   answer), and a search (`GET /api/messages?limit=50`) merged over both against one
//!   member's own (`x-msgtrail-local`). Latencies from this process, loopback HTTP/1.1.

use crate::error::BenchError;
use crate::ingest::{ingest, open_store, synthetic_set};
use crate::measure::{Latency, Progress, Recorder};
use msgtrail_core::decode_batch;
use msgtrail_core::partition::{self, Partition, PARTITIONS};
use msgtrail_listener::BatchLimits;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// What S4P measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ScaleOutResult {
    /// Messages of the synthetic mix.
    pub messages: u64,
    /// Stage records ingested (each listener count summed).
    pub records: u64,
    /// Whether each ingest thread was pinned to a core of its own (`taskset` present and
    /// at least two cores); without it the OS schedules them.
    pub pinned: bool,
    /// One listener, every partition: records per second.
    pub one_listener_records_per_sec: f64,
    /// Two listeners at once, half the partitions each: all records ÷ the slower one's
    /// seconds.
    pub two_listeners_records_per_sec: f64,
    /// Each of the two: its records per second.
    pub per_listener_records_per_sec: Vec<f64>,
    /// The median over the repetitions of each repetition's two ÷ one (target ≥ 1.8); one
    /// and two of a repetition run back to back, so they share the machine's conditions.
    pub scaling: f64,
    /// Repetitions (one listener, then two), interleaved; the rates above are their medians.
    #[serde(default)]
    pub reps: u32,
    /// The lowest and highest repetition's scaling: the figure's run-to-run spread.
    #[serde(default)]
    pub scaling_spread: [f64; 2],
    /// The fan-out's cost.
    pub fanout: FanoutResult,
}

/// A fanned-out lookup and search against a single listener's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FanoutResult {
    /// Messages stored in the group.
    pub messages: u64,
    /// `GET /api/messages/<id>` answered from the member's own store (`x-msgtrail-local`).
    pub lookup_local_ms: Latency,
    /// The same on an ID the other member holds (forwarded).
    pub lookup_forwarded_ms: Latency,
    /// A search answered by one member's own store.
    pub search_local_ms: Latency,
    /// The same search merged over both members.
    pub search_merged_ms: Latency,
    /// p50 of forwarded ÷ local lookups.
    pub lookup_p50_ratio: f64,
    /// p50 of merged ÷ local searches.
    pub search_p50_ratio: f64,
}

/// The partitions member `m` of two holds in the ingest figure: the lower or upper half.
fn member_of(p: Partition) -> usize {
    usize::from(p.index() >= PARTITIONS / 2)
}

/// The mix as `--stage-partitions` brokers publish it: each stage message split by partition;
/// with, for each, which of two members holds it.
fn split_set(messages: u64) -> Vec<(usize, Vec<u8>)> {
    let mut out = Vec::new();
    for m in synthetic_set(messages) {
        let Ok(records) = decode_batch(&m) else {
            continue;
        };
        for (p, part) in partition::split(records) {
            out.push((
                member_of(p),
                msgtrail_core::frame::encode_stage_batch(&part),
            ));
        }
    }
    out
}

/// Pins the calling thread to `cpu` with `taskset`; whether it took.
fn pin_to(cpu: usize) -> bool {
    let Ok(link) = std::fs::read_link("/proc/thread-self") else {
        return false;
    };
    let Some(tid) = link.file_name().and_then(|t| t.to_str()).map(str::to_owned) else {
        return false;
    };
    std::process::Command::new("taskset")
        .args(["-p", "-c", &cpu.to_string(), &tid])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Ingests `set` into a fresh store on a thread pinned to `cpu`: (records, seconds, pinned).
fn ingest_on(
    cpu: usize,
    set: &[Vec<u8>],
    batch: BatchLimits,
    phase: &crate::measure::Phase,
) -> Result<(u64, f64, bool), BenchError> {
    let pinned = pin_to(cpu);
    let dir = tempfile::Builder::new()
        .prefix("msgtrail-bench-s4p-")
        .tempdir()?;
    let store = open_store(dir.path(), 0)?;
    let got = ingest(&store, set, batch, phase);
    if got.drops > 0 {
        return Err(BenchError::Config(format!(
            "S4P: {} records dropped",
            got.drops
        )));
    }
    Ok((got.records, got.seconds, pinned))
}

/// S4P's ingest figure: S4's mix of `messages` split by partition, ingested by one store on
/// one core, then by two stores at once on a core each (transactions cut by `batch`),
/// `reps` times (at least once); blocking. The fan-out figure is left default.
pub fn ingest_scaling(
    messages: u64,
    batch: BatchLimits,
    reps: u32,
    progress: &Progress,
) -> Result<ScaleOutResult, BenchError> {
    let set = split_set(messages);
    let all: Vec<Vec<u8>> = set.iter().map(|(_, m)| m.clone()).collect();
    let halves: [Vec<Vec<u8>>; 2] = [0, 1].map(|k| {
        set.iter()
            .filter(|(m, _)| *m == k)
            .map(|(_, b)| b.clone())
            .collect()
    });
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut runs = Vec::new();
    for _ in 0..reps.max(1) {
        runs.push(one_repetition(&all, &halves, batch, cores, progress)?);
    }
    let records = runs[0].records;
    let pinned = cores >= 2 && runs.iter().all(|r| r.pinned);
    let median = |f: fn(&Repetition) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let scaling = median(Repetition::scaling);
    let typical = runs
        .iter()
        .min_by(|a, b| {
            (a.scaling() - scaling)
                .abs()
                .total_cmp(&(b.scaling() - scaling).abs())
        })
        .expect("at least one repetition");
    let spread = runs
        .iter()
        .map(Repetition::scaling)
        .fold([f64::INFINITY, f64::NEG_INFINITY], |[lo, hi], x| {
            [lo.min(x), hi.max(x)]
        });
    Ok(ScaleOutResult {
        messages,
        records,
        pinned,
        one_listener_records_per_sec: median(|r| r.one),
        two_listeners_records_per_sec: median(|r| r.two),
        per_listener_records_per_sec: typical.per_listener.clone(),
        scaling,
        reps: runs.len() as u32,
        scaling_spread: spread,
        fanout: FanoutResult::default(),
    })
}

/// One listener's ingest, then two at once: one repetition of the ingest figure.
struct Repetition {
    records: u64,
    pinned: bool,
    one: f64,
    two: f64,
    per_listener: Vec<f64>,
}

impl Repetition {
    fn scaling(&self) -> f64 {
        if self.one > 0.0 {
            self.two / self.one
        } else {
            0.0
        }
    }
}

fn one_repetition(
    all: &[Vec<u8>],
    halves: &[Vec<Vec<u8>>; 2],
    batch: BatchLimits,
    cores: usize,
    progress: &Progress,
) -> Result<Repetition, BenchError> {
    let phase = progress.phase("S4P one listener", all.len() as u64);
    let (one_records, one_secs, one_pinned) =
        std::thread::scope(|s| s.spawn(|| ingest_on(0, all, batch, &phase)).join())
            .map_err(|_| BenchError::Config("S4P ingest thread panicked".into()))??;
    drop(phase);
    let phase = progress.phase("S4P two listeners", all.len() as u64);
    let two: Vec<Result<(u64, f64, bool), BenchError>> = std::thread::scope(|s| {
        let handles: Vec<_> = halves
            .iter()
            .enumerate()
            .map(|(k, h)| {
                let phase = &phase;
                s.spawn(move || ingest_on(k % cores, h, batch, phase))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(BenchError::Config("S4P ingest thread panicked".into()))
                })
            })
            .collect()
    });
    drop(phase);
    let two = two.into_iter().collect::<Result<Vec<_>, _>>()?;
    let records: u64 = two.iter().map(|(r, _, _)| r).sum();
    let slowest = two.iter().map(|(_, s, _)| *s).fold(0.0, f64::max);
    let per = |r: u64, s: f64| if s > 0.0 { r as f64 / s } else { 0.0 };
    debug_assert_eq!(records, one_records, "the halves hold every record once");
    Ok(Repetition {
        records,
        pinned: one_pinned && two.iter().all(|(_, _, p)| *p),
        one: per(one_records, one_secs),
        two: per(records, slowest),
        per_listener: two.iter().map(|(r, s, _)| per(*r, *s)).collect(),
    })
}

/// `GET path` on `addr`, with `x-msgtrail-local` when `local`: the status.
async fn get(addr: &str, path: &str, local: bool) -> Result<u16, BenchError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let io = |e: std::io::Error| BenchError::Config(format!("S4P fan-out GET {path}: {e}"));
    let mut s = tokio::net::TcpStream::connect(addr).await.map_err(io)?;
    let local = if local {
        format!("{}: 1\r\n", msgtrail_listener::cluster::LOCAL_HEADER)
    } else {
        String::new()
    };
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{local}Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.map_err(io)?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.map_err(io)?;
    let head = String::from_utf8_lossy(&buf[..buf.len().min(64)]).to_string();
    head.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| BenchError::Config(format!("S4P fan-out GET {path}: no status")))
}

/// Times `n` requests of `path_of(i)` on `addr`; each must answer 200.
async fn timed(
    addr: &str,
    n: usize,
    local: bool,
    path_of: impl Fn(usize) -> String,
) -> Result<Latency, BenchError> {
    let mut r = Recorder::default();
    for i in 0..n {
        let path = path_of(i);
        let start = Instant::now();
        let status = get(addr, &path, local).await?;
        r.record(start.elapsed());
        if status != 200 {
            return Err(BenchError::Config(format!(
                "S4P fan-out GET {path} answered {status}"
            )));
        }
    }
    Ok(r.summary())
}

/// The fan-out figure (module docs) against the nats-server at `url`.
pub(crate) async fn fanout(
    url: &str,
    messages: u64,
    queries: usize,
) -> Result<FanoutResult, BenchError> {
    let js = async_nats::jetstream::new(async_nats::connect(url).await.map_err(BenchError::nats)?);
    let dirs = [tempfile::tempdir()?, tempfile::tempdir()?];
    let mut members = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        let cfg = msgtrail_listener::ListenerConfig {
            nats: msgtrail_nats::NatsOptions::url(url),
            data_dir: d.path().to_path_buf(),
            http_addr: "127.0.0.1:0".parse().expect("an address"),
            group: Some(msgtrail_listener::cluster::GroupConfig {
                name: "bench-s4p".into(),
                instance: format!("m{i}"),
                copies: 1,
                advertise_url: None,
            }),
            ..Default::default()
        };
        members.push(
            msgtrail_listener::start(cfg)
                .await
                .map_err(|e| BenchError::Listener(e.into()))?,
        );
    }
    // The mix's messages, each batch split by partition onto its subject.
    let mut ids = Vec::new();
    for m in synthetic_set(messages) {
        let Ok(records) = decode_batch(&m) else {
            continue;
        };
        ids.extend(records.iter().filter_map(|r| r.message_id));
        for (p, part) in partition::split(records) {
            js.publish(p.subject(), msgtrail_core::encode_batch(&part).into())
                .await
                .map_err(BenchError::nats)?
                .await
                .map_err(BenchError::nats)?;
        }
    }
    ids.sort();
    ids.dedup();
    // Which member holds which ID: its own store says, once both caught up.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (own, other) = loop {
        let held = |k: usize, id: &msgtrail_core::MessageId| {
            members[k]
                .store()
                .trajectory(&id.to_string(), msgtrail_core::time::now_nanos())
                .ok()
                .flatten()
                .is_some()
        };
        let own: Vec<String> = ids
            .iter()
            .filter(|i| held(0, i))
            .map(|i| i.to_string())
            .collect();
        let other: Vec<String> = ids
            .iter()
            .filter(|i| held(1, i))
            .map(|i| i.to_string())
            .collect();
        if own.len() + other.len() >= ids.len() && !own.is_empty() && !other.is_empty() {
            break (own, other);
        }
        if Instant::now() > deadline {
            return Err(BenchError::Config(format!(
                "S4P fan-out: the group held {} and {} of {} messages after 60 s",
                own.len(),
                other.len(),
                ids.len()
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let addr = members[0].http_addr().to_string();
    let lookup_local_ms = timed(&addr, queries, true, |i| {
        format!("/api/messages/{}", own[i % own.len()])
    })
    .await?;
    let lookup_forwarded_ms = timed(&addr, queries, false, |i| {
        format!("/api/messages/{}", other[i % other.len()])
    })
    .await?;
    let search = |_| "/api/messages?limit=50".to_owned();
    let search_local_ms = timed(&addr, queries, true, search).await?;
    let search_merged_ms = timed(&addr, queries, false, search).await?;
    for m in members {
        m.shutdown()
            .await
            .map_err(|e| BenchError::Listener(e.into()))?;
    }
    let ratio = |a: &Latency, b: &Latency| {
        if b.p50_ms > 0.0 {
            a.p50_ms / b.p50_ms
        } else {
            0.0
        }
    };
    Ok(FanoutResult {
        messages: ids.len() as u64,
        lookup_p50_ratio: ratio(&lookup_forwarded_ms, &lookup_local_ms),
        search_p50_ratio: ratio(&search_merged_ms, &search_local_ms),
        lookup_local_ms,
        lookup_forwarded_ms,
        search_local_ms,
        search_merged_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_split_keeps_every_record_and_gives_each_member_a_share() {
        let set = split_set(200);
        let records = |k: Option<usize>| -> usize {
            set.iter()
                .filter(|(m, _)| k.is_none_or(|k| *m == k))
                .map(|(_, b)| decode_batch(b).unwrap().len())
                .sum()
        };
        let whole: usize = synthetic_set(200)
            .iter()
            .map(|m| decode_batch(m).unwrap().len())
            .sum();
        assert_eq!(records(None), whole);
        assert!(records(Some(0)) > 0 && records(Some(1)) > 0);
        assert_eq!(records(Some(0)) + records(Some(1)), whole);
    }

    #[test]
    fn ingest_scaling_runs_on_a_small_mix() {
        let r = ingest_scaling(
            200,
            crate::BenchConfig::default().batch_limits(),
            3,
            &Progress::new(false),
        )
        .unwrap();
        eprintln!("S4P smoke (debug, 200 messages): {r:?}");
        assert!(r.records > 0);
        assert!(r.one_listener_records_per_sec > 0.0 && r.two_listeners_records_per_sec > 0.0);
        assert_eq!(r.per_listener_records_per_sec.len(), 2);
        assert!(r.scaling.is_finite() && r.scaling > 0.0);
        assert_eq!(r.reps, 3);
        let [lo, hi] = r.scaling_spread;
        assert!(lo <= r.scaling && r.scaling <= hi, "{r:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fanout_answers_forwarded_lookups_and_merged_searches() {
        let server = msgtrail_devkit::NatsServer::start().unwrap();
        let r = fanout(server.url(), 100, 20).await.unwrap();
        assert!(r.messages > 0);
        for l in [
            &r.lookup_local_ms,
            &r.lookup_forwarded_ms,
            &r.search_local_ms,
            &r.search_merged_ms,
        ] {
            assert_eq!(l.count, 20);
            assert!(l.p50_ms > 0.0);
        }
        assert!(r.lookup_p50_ratio > 0.0 && r.search_p50_ratio > 0.0);
    }
}
