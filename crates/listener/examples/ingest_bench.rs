//! Listener ingest and query throughput against a real nats-server (not a test).
//!
//! Publishes the stage records of `MESSAGES` complete trajectories (10 records each: upload,
//! store, one pull delivery with processing) in NDJSON batches of `BATCH` records, as the
//! broker does, then starts a listener on that backlog and times how long it takes to apply
//! everything; then times trajectory look-ups over HTTP.
//!
//! ```text
//! cargo run --release -p msgtrail-listener --example ingest_bench [messages] [records-per-batch]
//! ```

use msgtrail_core::encode_batch;
use msgtrail_core::subjects::STAGE_SUBJECT;
use msgtrail_core::Stage;
use msgtrail_core::{ClientId, MessageId, RequestId, StageRecord};
use msgtrail_listener::ListenerClient;
use msgtrail_listener::ListenerConfig;
use msgtrail_nats::topology::{stage_stream, DEFAULT_STAGE_MAX_AGE};
use msgtrail_test_support::NatsServer;
use std::time::{Duration, Instant};

fn trajectory(t0: u64, i: u64) -> (MessageId, Vec<StageRecord>) {
    let id = MessageId::new();
    let req = RequestId::new(format!("req-{i}")).unwrap();
    let producer = ClientId::new("bench-producer").unwrap();
    let group = msgtrail_core::GroupId::new("billing").unwrap();
    let consumer = ClientId::new("b-1").unwrap();
    let mk = |stage: Stage, us: u64| {
        let mut r = StageRecord::at(stage, t0 + i * 1_000 + us * 1_000);
        r.topic = Some(format!("orders.t{}", i % 8));
        r
    };
    let mut out = Vec::new();
    for (stage, us) in [
        (Stage::UploadSent, 0),
        (Stage::UploadReceived, 100),
        (Stage::Stored, 300),
        (Stage::StoreConfirmed, 400),
    ] {
        let mut r = mk(stage, us);
        r.request_id = Some(req.clone());
        r.producer = Some(producer.clone());
        if stage != Stage::UploadSent {
            r.message_id = Some(id);
        }
        out.push(r);
    }
    for (stage, us, outcome) in [
        (Stage::PullSent, 1_000, None),
        (Stage::PullReceived, 1_200, None),
        (Stage::ProcessStarted, 1_300, None),
        (Stage::ProcessFinished, 2_300, Some("ok")),
        (Stage::PullAckSent, 2_400, Some("ack")),
        (Stage::PullAckReceived, 2_600, Some("ack")),
    ] {
        let mut r = mk(stage, us);
        r.message_id = Some(id);
        r.group = Some(group.clone());
        r.consumer = Some(consumer.clone());
        r.attempt = Some(1);
        r.outcome = outcome.map(Into::into);
        out.push(r);
    }
    (id, out)
}

#[tokio::main]
async fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let messages = args.first().copied().unwrap_or(20_000);
    let batch = args.get(1).copied().unwrap_or(50) as usize;
    let server = NatsServer::start().expect("nats-server");
    let dir = tempfile::tempdir().unwrap();
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    js.get_or_create_stream(stage_stream(1, DEFAULT_STAGE_MAX_AGE))
        .await
        .unwrap();

    let (ids, ordered) = interleaved_records(messages);
    let total = ordered.len() as u64;
    parts_alone(&ordered, batch);
    publish_backlog(&js, &ordered, batch, messages).await;

    let config = ListenerConfig {
        nats: msgtrail_nats::NatsOptions::url(server.url()),
        data_dir: dir.path().to_path_buf(),
        http_addr: "127.0.0.1:0".parse().unwrap(),
        retention_max_age: None,
        retention_max_bytes: None,
        ..Default::default()
    };
    let start = Instant::now();
    let handle = msgtrail_listener::start(config).await.unwrap();
    loop {
        let s = handle.stats(None);
        if s.ingest.records >= total {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = start.elapsed();
    let s = handle.stats(None);
    println!(
        "ingest: {total} records in {took:.2?} = {:.0} records/s ({:.0} messages/s); {} batches in {} transactions; consumed {}",
        total as f64 / took.as_secs_f64(),
        messages as f64 / took.as_secs_f64(),
        s.ingest.batches,
        s.ingest.transactions,
        s.states.values().sum::<u64>()
    );
    let size: u64 = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    println!(
        "store: {:.1} MB on disk ({:.0} bytes per message)",
        size as f64 / 1e6,
        size as f64 / messages as f64
    );
    time_queries(&handle, &ids).await;
    handle.shutdown().await.unwrap();
}

/// The records of `messages` trajectories, interleaved as a busy broker would: batches'
/// contents shuffled a little by striding through the records; and the message IDs.
fn interleaved_records(messages: u64) -> (Vec<MessageId>, Vec<StageRecord>) {
    let t0 = msgtrail_core::time::now_nanos();
    let mut records = Vec::new();
    let mut ids = Vec::new();
    for i in 0..messages {
        let (id, rs) = trajectory(t0, i);
        ids.push(id);
        records.extend(rs);
    }
    let stride = 7usize;
    let mut ordered = Vec::with_capacity(records.len());
    for k in 0..stride {
        ordered.extend(records.iter().skip(k).step_by(stride).cloned());
    }
    (ids, ordered)
}

/// The parts alone, on this thread: decoding the batches, then the store.
fn parts_alone(ordered: &[StageRecord], batch: usize) {
    let total = ordered.len() as u64;
    let batches: Vec<Vec<u8>> = ordered.chunks(batch).map(encode_batch).collect();
    let start = Instant::now();
    let mut decoded = Vec::with_capacity(ordered.len());
    for b in &batches {
        decoded.extend(msgtrail_core::decode_batch(b).unwrap());
    }
    let took = start.elapsed();
    println!(
        "decode only: {total} records in {took:.2?} = {:.0} records/s",
        total as f64 / took.as_secs_f64()
    );
    let alone = tempfile::tempdir().unwrap();
    let store = msgtrail_listener::Store::open(alone.path(), 256, Default::default()).unwrap();
    let per_txn = batch * 512;
    let start = Instant::now();
    let mut txns = 0;
    for chunk in decoded.chunks(per_txn) {
        store
            .apply(chunk.to_vec(), msgtrail_core::time::now_nanos())
            .unwrap();
        txns += 1;
    }
    let took = start.elapsed();
    println!(
        "store.apply only: {total} records in {txns} transactions in {took:.2?} = {:.0} records/s",
        total as f64 / took.as_secs_f64()
    );
}

/// Publishes the records in batches of `batch` to the stage stream, 256 acks in flight.
async fn publish_backlog(
    js: &async_nats::jetstream::Context,
    ordered: &[StageRecord],
    batch: usize,
    messages: u64,
) {
    let total = ordered.len() as u64;
    let start = Instant::now();
    let mut acks = Vec::new();
    for chunk in ordered.chunks(batch) {
        acks.push(
            js.publish(STAGE_SUBJECT, encode_batch(chunk).into())
                .await
                .unwrap(),
        );
        if acks.len() >= 256 {
            for a in acks.drain(..) {
                a.await.unwrap();
            }
        }
    }
    for a in acks.drain(..) {
        a.await.unwrap();
    }
    println!(
        "published {total} records ({messages} messages) in {} NATS messages in {:.2?}",
        total.div_ceil(batch as u64),
        start.elapsed()
    );
}

/// Times up to 2,000 trajectory look-ups over HTTP, one after the other.
async fn time_queries(handle: &msgtrail_listener::ListenerHandle, ids: &[MessageId]) {
    let c = ListenerClient::new(&format!("http://{}", handle.http_addr()), None).unwrap();
    let n = 2_000.min(ids.len());
    let start = Instant::now();
    for id in ids.iter().step_by(ids.len() / n).take(n) {
        c.trajectory(&id.to_string(), None).await.unwrap();
    }
    let took = start.elapsed();
    println!(
        "query: {n} trajectories over HTTP in {took:.2?} = {:.0} µs each (sequential)",
        took.as_micros() as f64 / n as f64
    );
}
