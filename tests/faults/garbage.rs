//! A garbage flood on every broker subject: random bytes, malformed JSON, bad binary frames
//! (wrong magic, wrong version, truncated, lying counts), well-formed requests on unknown
//! channels, forged stage reports, channel opens with bad signatures for a real client, and
//! subjects no broker serves. Each is a request with a reply inbox, so the brokers do all the
//! work of answering; replies are counted.

use bytes::Bytes;
use futures::StreamExt;
use msgtrail_core::frame::{encode_report, ReportedRecord, UploadBatch, UploadEntry};
use msgtrail_core::subjects as s;
use msgtrail_core::{MessageId, Stage, StageRecord};
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Every subject the broker serves, and two it does not.
const SUBJECTS: &[&str] = &[
    s::CHANNEL_CHALLENGE,
    s::CHANNEL_OPEN,
    s::CHANNEL_KEEPALIVE,
    s::CHANNEL_CLOSE,
    s::UPLOAD,
    s::UPLOAD_BATCH,
    s::SETTLE,
    s::FETCH,
    s::SUBSCRIBE,
    s::UNSUBSCRIBE,
    s::ACK,
    s::STAGE_REPORT,
    "msgtrail.v1.nothing",
    "msgtrail.v1.upload.batch.extra",
];

/// A small xorshift generator: no dependency, reproducible from its seed.
#[derive(Debug, Clone)]
pub(crate) struct TestRng(u64);

impl TestRng {
    /// A generator from `seed` (0 is replaced).
    pub(crate) fn new(seed: u64) -> Self {
        TestRng(seed.max(1))
    }
    /// The next number.
    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// A number below `n`.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// `n` random bytes.
    pub(crate) fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn upload_batch(rng: &mut TestRng, entries: usize) -> Bytes {
    UploadBatch {
        entries: (0..entries)
            .map(|i| UploadEntry {
                request_id: format!("garbage-{}-{i}", rng.next()),
                topic: "faults.orders".into(),
                attempt: 1,
                sent_at: 1,
                traceparent: String::new(),
                attrs: vec![],
                payload: Bytes::from(rng.bytes(32)),
            })
            .collect(),
        reports: vec![],
        ..Default::default()
    }
    .encode()
}

fn forged_report(rng: &mut TestRng) -> Bytes {
    let stages = [
        Stage::UploadReceived,
        Stage::Stored,
        Stage::PullAckReceived,
        Stage::PullAckSent,
        Stage::ProcessFinished,
        Stage::Redelivery,
    ];
    let reports: Vec<ReportedRecord> = (0..4)
        .map(|_| {
            let mut r = StageRecord::now(stages[rng.below(stages.len())]);
            r.message_id = Some(MessageId::new());
            r.outcome = Some("nack".into());
            ReportedRecord {
                record: r,
                token: format!("forged.{}", rng.next()),
            }
        })
        .collect();
    encode_report(&reports)
}

/// One piece of garbage: a subject, headers, a body, and its kind for the counts.
fn garbage(rng: &mut TestRng) -> (String, async_nats::HeaderMap, Bytes, &'static str) {
    let mut headers = async_nats::HeaderMap::new();
    let bogus_channel = format!("ch-{:x}", rng.next());
    let subject = SUBJECTS[rng.below(SUBJECTS.len())].to_owned();
    let (body, kind): (Bytes, &str) = match rng.below(10) {
        0 => {
            let n = rng.below(512);
            (Bytes::from(rng.bytes(n)), "random bytes")
        }
        1 => (
            Bytes::from_static(b"{\"channel\": \"x\", \"token\": "),
            "truncated json",
        ),
        2 => (
            Bytes::from(
                json!({"client_id": rng.next(), "channel": [1, 2], "max": "many", "wait_ms": -5})
                    .to_string(),
            ),
            "json of the wrong types",
        ),
        3 => {
            // A frame with the right magic but a version from the future, or a kind that
            // does not exist.
            let mut b = vec![b'M', b'T', b"USRxZ"[rng.below(5)], 1 + rng.below(3) as u8];
            let n = rng.below(64);
            b.extend(rng.bytes(n));
            (Bytes::from(b), "bad frame head")
        }
        4 => {
            // A real upload batch, truncated somewhere.
            let full = upload_batch(rng, 3);
            let cut = 4 + rng.below(full.len() - 4);
            headers.insert(msgtrail_core::headers::CHANNEL, bogus_channel.as_str());
            (full.slice(..cut), "truncated frame")
        }
        5 => {
            // A frame whose count promises far more entries than it holds.
            let mut b = vec![b'M', b'T', b'U', 1, 0xff, 0xff, 0xff, 0xff];
            b.extend(rng.bytes(16));
            (Bytes::from(b), "frame with a lying count")
        }
        6 => {
            // A well-formed batch on a channel that does not exist.
            headers.insert(msgtrail_core::headers::CHANNEL, bogus_channel.as_str());
            let n = 1 + rng.below(8);
            return (
                s::UPLOAD_BATCH.to_owned(),
                headers,
                upload_batch(rng, n),
                "upload on an unknown channel",
            );
        }
        7 => {
            // Well-formed JSON requests on an unknown channel.
            let body = json!({
                "channel": bogus_channel, "group": "faults-billing", "topic": "faults.>",
                "max": 10, "wait_ms": 0, "token": "x.y", "kind": "ack",
            });
            let subject =
                [s::FETCH, s::ACK, s::CHANNEL_KEEPALIVE, s::CHANNEL_CLOSE][rng.below(4)].to_owned();
            return (
                subject,
                headers,
                Bytes::from(body.to_string()),
                "json request on an unknown channel",
            );
        }
        8 => {
            // Forged stage reports about made-up messages.
            headers.insert(msgtrail_core::headers::CHANNEL, bogus_channel.as_str());
            return (
                s::STAGE_REPORT.to_owned(),
                headers,
                forged_report(rng),
                "forged stage report",
            );
        }
        _ => {
            // A channel open for the real producer, with a nonce and signature it never got.
            let body = json!({
                "role": "producer", "client_id": "faults-shop",
                "nonce": format!("{:x}", rng.next()), "signature": "AAAA",
            });
            return (
                s::CHANNEL_OPEN.to_owned(),
                headers,
                Bytes::from(body.to_string()),
                "open with a bad signature",
            );
        }
    };
    (subject, headers, body, kind)
}

/// A running flood.
pub(crate) struct Flood {
    stop_sending: Arc<AtomicBool>,
    stop_receiving: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    replies: Arc<AtomicU64>,
    error_replies: Arc<AtomicU64>,
    senders: Vec<tokio::task::JoinHandle<()>>,
    receiver: tokio::task::JoinHandle<()>,
    started: Instant,
}

/// What a flood did.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FloodStats {
    /// Garbage requests sent.
    pub sent: u64,
    /// Replies received.
    pub replies: u64,
    /// Of those, error replies (`Msgtrail-Error` or `Nats-Service-Error`).
    pub error_replies: u64,
    /// Requests per second achieved.
    pub rate: f64,
}

impl Flood {
    /// Starts `tasks` flooders sending `rate` garbage requests per second in all, on their
    /// own connection.
    pub(crate) async fn start(
        client: async_nats::Client,
        rate: u64,
        tasks: usize,
        seed: u64,
    ) -> Flood {
        let stop_sending = Arc::new(AtomicBool::new(false));
        let stop_receiving = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let replies = Arc::new(AtomicU64::new(0));
        let error_replies = Arc::new(AtomicU64::new(0));
        let inbox_prefix = client.new_inbox();
        let mut sub = client
            .subscribe(format!("{inbox_prefix}.>"))
            .await
            .expect("flood inbox");
        let receiver = {
            let (replies, error_replies, stop) = (
                replies.clone(),
                error_replies.clone(),
                stop_receiving.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    match tokio::time::timeout(Duration::from_millis(200), sub.next()).await {
                        Ok(Some(m)) => {
                            replies.fetch_add(1, Ordering::Relaxed);
                            let is_error = m.headers.as_ref().is_some_and(|h| {
                                h.get(msgtrail_core::headers::ERROR).is_some()
                                    || h.get(msgtrail_core::headers::NATS_SERVICE_ERROR).is_some()
                            });
                            if is_error {
                                error_replies.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Ok(None) => return,
                        Err(_) => {}
                    }
                }
            })
        };
        let mut senders = Vec::new();
        let per_tick = (rate as f64 / 100.0 / tasks as f64).max(1.0);
        for t in 0..tasks {
            let (client, stop, sent, prefix) = (
                client.clone(),
                stop_sending.clone(),
                sent.clone(),
                inbox_prefix.clone(),
            );
            let mut rng = TestRng::new(seed ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            senders.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(10));
                let mut owed = 0.0;
                let mut n: u64 = 0;
                while !stop.load(Ordering::SeqCst) {
                    tick.tick().await;
                    owed += per_tick;
                    while owed >= 1.0 {
                        owed -= 1.0;
                        let (subject, headers, body, _kind) = garbage(&mut rng);
                        n += 1;
                        let reply = format!("{prefix}.{t}.{n}");
                        let r = if headers.is_empty() {
                            client.publish_with_reply(subject, reply, body).await
                        } else {
                            client
                                .publish_with_reply_and_headers(subject, reply, headers, body)
                                .await
                        };
                        if r.is_ok() {
                            sent.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }));
        }
        Flood {
            stop_sending,
            stop_receiving,
            sent,
            replies,
            error_replies,
            senders,
            receiver,
            started: Instant::now(),
        }
    }

    /// Garbage requests sent so far.
    pub(crate) fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Stops the flood and returns what it did (replies still in flight get 1 s).
    pub(crate) async fn stop(self) -> FloodStats {
        self.stop_sending.store(true, Ordering::SeqCst);
        for t in self.senders {
            let _ = t.await;
        }
        let elapsed = self.started.elapsed().as_secs_f64();
        let sent = self.sent.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.stop_receiving.store(true, Ordering::SeqCst);
        let _ = self.receiver.await;
        FloodStats {
            sent,
            replies: self.replies.load(Ordering::Relaxed),
            error_replies: self.error_replies.load(Ordering::Relaxed),
            rate: (sent as f64 / elapsed * 10.0).round() / 10.0,
        }
    }
}
