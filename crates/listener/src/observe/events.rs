//! nats-server's consumer events about the observed streams, captured in `MSGTRAIL_OBSERVE`
//! (created through `msgtrail_nats::topology`, so the events are kept while the listener is
//! down) and read by the durable consumer `<durable>-observe-events`: each batch becomes
//! records ([`super::records::event_records`]), one store transaction, then the acks — a
//! restart loses nothing and doubles nothing.
//!
//! A record's stages depend on the consumer's mode (push: C1/C4, pull: C5/C8), which
//! discovery knows. An event of a consumer discovery has not seen yet (created since its
//! last look) first makes the reader look at that stream again ([`learn_consumers`], at
//! most once a second per stream), so a push consumer's first deliveries are push
//! deliveries, not pull ones.
//!
//! The ack-wait inference (an attempt n ≥ 2 whose attempt n − 1 has no outcome) asks the
//! store and the batch itself, on a blocking thread.

use super::event::{parse, subject_names};
use super::records::{event_records, is_outcome};
use super::Observer;
use crate::ingest::{apply, Batch, Source};
use crate::store::Store;
use async_nats::jetstream::{self, consumer};
use futures::StreamExt;
use msgtrail_core::trajectory::HopKind;
use msgtrail_core::{MessageId, StageRecord};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How soon an event of an unknown consumer may make the reader look at a stream again.
const RELEARN: Duration = Duration::from_secs(1);
/// Most consumers remembered as not found by a look (ephemeral ones); then forgotten.
const NOT_FOUND: usize = 10_000;

/// What the event reader remembers of its looks for consumers discovery did not know.
#[derive(Debug, Default)]
struct Relearn {
    /// When each stream was last looked at.
    last: HashMap<String, Instant>,
    /// (stream, consumer) a look did not find: ephemeral, taken as pull, not looked for
    /// again.
    not_found: HashSet<(String, String)>,
}

/// The consumer of `MSGTRAIL_OBSERVE`.
pub(crate) fn consumer_config(
    name: &str,
    batch_size: usize,
    ack_wait: Duration,
) -> consumer::pull::Config {
    consumer::pull::Config {
        durable_name: Some(name.to_owned()),
        description: Some("msgtrail listener, observe mode: consumer events".into()),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait,
        max_ack_pending: (batch_size * 8).max(1024) as i64,
        deliver_policy: consumer::DeliverPolicy::All,
        ..Default::default()
    }
}

/// Whether the store holds an outcome for `attempt` of `consumer` on message `id`.
fn stored_outcome(store: &Store, id: MessageId, consumer: &str, attempt: u32) -> bool {
    let now = msgtrail_core::time::now_nanos();
    match store.trajectory(&id.to_string(), now) {
        Ok(Some(t)) => t.hops.iter().any(|h| {
            h.kind == HopKind::Deliver
                && h.attempt == Some(attempt)
                && h.consumer.as_ref().is_some_and(|c| c.as_str() == consumer)
                && h.events.iter().any(is_outcome)
        }),
        Ok(None) => false,
        // Unknown: infer nothing rather than something false.
        Err(_) => true,
    }
}

/// Looks again at the streams whose events in `msgs` name consumers discovery has not
/// seen (at most once per [`RELEARN`] per stream), so that their mode is known before the
/// events are decoded. A consumer such a look does not find (an ephemeral one) stays
/// unknown (pull) and makes no further look.
async fn learn_consumers(obs: &Observer, msgs: &[jetstream::Message], memo: &mut Relearn) {
    let unknown: Vec<(&str, &str)> = msgs
        .iter()
        .filter_map(|m| subject_names(m.subject.as_str()))
        .filter(|(s, c)| !obs.status.knows(s, c))
        .filter(|(s, _)| obs.config.streams.iter().any(|o| o == s))
        .filter(|(s, c)| !memo.not_found.contains(&((*s).to_owned(), (*c).to_owned())))
        .collect();
    let mut streams: Vec<&str> = unknown.iter().map(|(s, _)| *s).collect();
    streams.sort_unstable();
    streams.dedup();
    for s in streams {
        if memo.last.get(s).is_some_and(|t| t.elapsed() < RELEARN) {
            continue;
        }
        memo.last.insert(s.to_owned(), Instant::now());
        tracing::debug!(stream = %s, "event of a consumer not discovered yet: looking at the stream again");
        let _ = super::discovery::discover(
            &obs.js,
            &obs.status,
            s,
            &obs.own_consumer,
            obs.config.set_sample_freq,
        )
        .await;
        if memo.not_found.len() >= NOT_FOUND {
            memo.not_found.clear();
        }
        for (_, c) in unknown
            .iter()
            .filter(|(us, c)| *us == s && !obs.status.knows(s, c))
        {
            memo.not_found.insert((s.to_owned(), (*c).to_owned()));
        }
    }
}

/// The records of a batch of captured events, in order; `warn` logs the unusable ones.
fn decode(obs: &Observer, msgs: &[jetstream::Message], warn: bool) -> Vec<StageRecord> {
    let mut out = Vec::new();
    let mut settled: HashSet<(MessageId, String, u32)> = HashSet::new();
    for m in msgs {
        let e = match parse(m.subject.as_str(), &m.payload) {
            Ok(e) => e,
            Err(e) => {
                if warn {
                    tracing::warn!(error = %msgtrail_core::ErrorChain(&e), "unreadable nats-server event skipped");
                }
                continue;
            }
        };
        let mode = obs.status.mode(&e.stream, &e.consumer);
        let mut unsettled = |id: MessageId, c: &str, a: u32| {
            !settled.contains(&(id, c.to_owned(), a)) && !stored_outcome(&obs.sinks.store, id, c, a)
        };
        match event_records(&e, mode, &mut unsettled) {
            Ok(rs) => {
                for r in &rs {
                    if let (true, Some(id), Some(a)) = (is_outcome(r), r.message_id, r.attempt) {
                        settled.insert((id, e.consumer.clone(), a));
                    }
                }
                out.extend(rs);
            }
            Err(err) if warn => tracing::warn!(error = %err, "nats-server event skipped"),
            Err(_) => {}
        }
    }
    out
}

/// Reads the captured events until stopped.
pub(crate) async fn run(
    obs: Arc<Observer>,
    stream: jetstream::stream::Stream,
) -> Result<(), crate::ListenerError> {
    let name = format!("{}-events", obs.own_consumer);
    let c = crate::ingest::durable_consumer(
        &stream,
        consumer_config(&name, obs.batch_size, obs.ack_wait),
    )
    .await
    .map_err(|e| crate::ListenerError::nats("observe events consumer", e))?;
    let messages = c
        .stream()
        .max_messages_per_batch(obs.batch_size)
        .heartbeat(Duration::from_secs(5))
        .expires(Duration::from_secs(30))
        .messages()
        .await
        .map_err(|e| crate::ListenerError::nats("observe events consumer", e))?;
    let mut chunks = messages.ready_chunks(obs.batch_size);
    let mut relearned = Relearn::default();
    loop {
        let chunk = tokio::select! {
            _ = obs.stop.cancelled() => return Ok(()),
            c = chunks.next() => match c {
                Some(c) => c,
                None => return Err(crate::ListenerError::ConsumerEnded),
            },
        };
        let msgs: Vec<jetstream::Message> = chunk
            .into_iter()
            .filter_map(|m| {
                m.map_err(|e| tracing::warn!(error = %e, "observe events consumer error"))
                    .ok()
            })
            .collect();
        if msgs.is_empty() {
            continue;
        }
        learn_consumers(&obs, &msgs, &mut relearned).await;
        let (o, redo) = (obs.clone(), obs.clone());
        let (records, msgs) = match tokio::task::spawn_blocking(move || {
            let rs = decode(&o, &msgs, true);
            (rs, msgs)
        })
        .await
        {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "observe decode task failed");
                continue;
            }
        };
        let mut batch = Batch::with_redecode(
            Source::Observed,
            Arc::new(move |m: &[jetstream::Message]| decode(&redo, m, false)),
        );
        batch.records = records;
        for m in msgs {
            batch.ack_after_commit(m);
        }
        apply(
            batch,
            &obs.sinks.store,
            &obs.sinks.stats,
            obs.sinks.exporter.as_ref(),
            &obs.stop,
        )
        .await;
    }
}
