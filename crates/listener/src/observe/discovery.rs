//! Which observed streams exist and which durable consumers are on them, found again every
//! discovery interval: a stream or consumer that appears later is picked up with a log line.
//!
//! A consumer whose `sample_freq` is not 100 % emits no ack metric for some acks; it is
//! named at once (WARN, with the `nats consumer edit` command that fixes it) and in
//! `GET /api/observe`; with `--observe-set-sample-freq` the listener sets it to 100 %
//! itself, the only change it ever makes to the observed application.

use async_nats::jetstream::{self, consumer};
use futures::TryStreamExt;
use msgtrail_core::observed::UnsampledConsumer;
use msgtrail_core::outcome::SettleKind;
use msgtrail_core::trajectory::{DeliveryMode, HopKind, Trajectory};
use msgtrail_listener_client::observed::ConsumerNow;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::RwLock;

/// One consumer on an observed stream, as discovery last saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ObservedConsumer {
    /// Push (a deliver subject) or pull.
    pub mode: &'static str,
    /// Its `sample_freq`, percent (0: unset).
    pub sample_freq: u8,
    /// Whether every ack emits a metric (`sample_freq` 100 %): without, acked attempts show
    /// no delivery or ack.
    pub every_ack_sampled: bool,
    /// The command that makes every ack sampled, when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// Its filter subjects (none: every subject of the stream).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub filter_subjects: Vec<String>,
}

impl ObservedConsumer {
    /// Whether it would be delivered a message on `topic` (an unknown topic: it may).
    fn takes(&self, topic: Option<&str>) -> bool {
        match topic {
            Some(t) if !self.filter_subjects.is_empty() => self
                .filter_subjects
                .iter()
                .any(|f| msgtrail_core::topic_matches(f, t)),
            _ => true,
        }
    }
}

/// One observed stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct ObservedStream {
    /// Whether the stream exists (observation starts when it appears).
    pub exists: bool,
    /// Whether msgtrail's headers-only consumer reads its stored messages (the store hops);
    /// false until it is created, and while the stream refuses it.
    pub reads_messages: bool,
    /// Its first sequence when discovery last looked (earlier messages are gone).
    #[serde(skip)]
    pub first_seq: u64,
    /// Its durable consumers (not msgtrail's own), by name.
    pub consumers: BTreeMap<String, ObservedConsumer>,
    /// What each of them held at the look (consumer info), for the statistics.
    #[serde(skip)]
    pub now: BTreeMap<String, ConsumerNow>,
}

/// Where msgtrail's headers-only consumer of a stream is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Reader {
    /// Not created yet (the stream may not exist yet).
    #[default]
    Waiting,
    /// Reading the stored messages.
    Reading,
    /// The stream exists but is not read: a work-queue stream (msgtrail never reads one),
    /// or it refused the consumer (missing permissions): its messages get no store hop.
    Refused,
}

/// What discovery knows, shared with the event reader (a consumer's mode), the stored
/// readers (their state), the trace export (what to hold back) and the API.
#[derive(Debug, Default)]
pub(crate) struct ObserveStatus {
    streams: RwLock<BTreeMap<String, ObservedStream>>,
    readers: RwLock<BTreeMap<String, Reader>>,
}

impl ObserveStatus {
    /// A status with every configured stream not found yet.
    pub(crate) fn new(streams: &[String]) -> Self {
        let map = streams
            .iter()
            .map(|s| (s.clone(), ObservedStream::default()))
            .collect();
        ObserveStatus {
            streams: RwLock::new(map),
            readers: RwLock::default(),
        }
    }

    /// Records where the stored reader of `stream` is.
    pub(crate) fn set_reader(&self, stream: &str, r: Reader) {
        self.readers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(stream.to_owned(), r);
    }

    /// Where the stored reader of `stream` is.
    pub(crate) fn reader(&self, stream: &str) -> Reader {
        let readers = self.readers.read().unwrap_or_else(|p| p.into_inner());
        readers.get(stream).copied().unwrap_or_default()
    }

    /// The first sequence of `stream` when discovery last looked (0: unknown).
    pub(crate) fn first_seq(&self, stream: &str) -> u64 {
        let streams = self.streams.read().unwrap_or_else(|p| p.into_inner());
        streams.get(stream).map_or(0, |s| s.first_seq)
    }

    /// The observed streams' names.
    pub(crate) fn stream_names(&self) -> Vec<String> {
        let streams = self.streams.read().unwrap_or_else(|p| p.into_inner());
        streams.keys().cloned().collect()
    }

    /// The delivery mode of a consumer: push when discovery saw a deliver subject, else pull.
    pub(crate) fn mode(&self, stream: &str, consumer: &str) -> DeliveryMode {
        let streams = self.streams.read().unwrap_or_else(|p| p.into_inner());
        match streams.get(stream).and_then(|s| s.consumers.get(consumer)) {
            Some(c) if c.mode == "push" => DeliveryMode::Push,
            _ => DeliveryMode::Pull,
        }
    }

    /// Whether discovery has seen the durable consumer `consumer` on `stream`.
    pub(crate) fn knows(&self, stream: &str, consumer: &str) -> bool {
        let streams = self.streams.read().unwrap_or_else(|p| p.into_inner());
        streams
            .get(stream)
            .is_some_and(|s| s.consumers.contains_key(consumer))
    }

    /// Names, on an observed trajectory, the consumers of its stream that do not sample
    /// every ack ([`Observation::unsampled`]): those that would take its subject and have no
    /// ack on it (their deliveries may be missing). As discovery last saw them: a consumer
    /// fixed since is no longer named, though the acks it made unsampled stay missing.
    ///
    /// [`Observation::unsampled`]: msgtrail_core::observed::Observation::unsampled
    pub(crate) fn mark_unsampled(&self, t: &mut Trajectory) {
        let Some(o) = &t.observed else { return };
        let acked = |consumer: &str| {
            t.hops.iter().any(|h| {
                h.kind == HopKind::Deliver
                    && h.consumer.as_ref().is_some_and(|c| c.as_str() == consumer)
                    && h.events
                        .iter()
                        .any(|r| r.outcome.as_deref() == Some(SettleKind::Ack.as_str()))
            })
        };
        let unsampled: Vec<UnsampledConsumer> = {
            let streams = self.streams.read().unwrap_or_else(|p| p.into_inner());
            let Some(s) = streams.get(&o.stream) else {
                return;
            };
            s.consumers
                .iter()
                .filter(|(name, c)| {
                    !c.every_ack_sampled && c.takes(t.topic.as_deref()) && !acked(name)
                })
                .map(|(name, c)| UnsampledConsumer {
                    consumer: name.clone(),
                    sample_freq: c.sample_freq,
                    fix: c
                        .fix
                        .clone()
                        .unwrap_or_else(|| fix_command(&o.stream, name)),
                })
                .collect()
        };
        if let Some(o) = &mut t.observed {
            o.unsampled = unsampled;
        }
    }

    /// Every observed stream and its consumers.
    pub(crate) fn snapshot(&self) -> BTreeMap<String, ObservedStream> {
        let mut out = self
            .streams
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for (name, s) in &mut out {
            s.reads_messages = self.reader(name) == Reader::Reading;
        }
        out
    }

    fn set(&self, stream: &str, value: ObservedStream) -> Option<ObservedStream> {
        self.streams
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(stream.to_owned(), value)
    }
}

/// What a consumer holds, from its info read at `polled_at`.
fn figures(info: &consumer::Info, polled_at: u64) -> ConsumerNow {
    ConsumerNow {
        pending: info.num_pending,
        unacked: info.num_ack_pending as u64,
        redelivered: info.num_redelivered as u64,
        waiting: info.num_waiting as u64,
        ack_floor_stream_seq: info.ack_floor.stream_sequence,
        ack_floor_consumer_seq: info.ack_floor.consumer_sequence,
        delivered_stream_seq: info.delivered.stream_sequence,
        polled_at,
    }
}

/// The statistics' view of discovery: every observed stream (existing or not yet), its
/// durable consumers and what each held at the last look.
impl crate::stats::ObservedLive for ObserveStatus {
    fn consumers_now(&self) -> BTreeMap<String, BTreeMap<String, Option<ConsumerNow>>> {
        let streams = self.streams.read().unwrap_or_else(|p| p.into_inner());
        streams
            .iter()
            .map(|(name, s)| {
                let cs = s
                    .consumers
                    .keys()
                    .map(|c| (c.clone(), s.now.get(c).cloned()))
                    .collect();
                (name.clone(), cs)
            })
            .collect()
    }
}

/// A consumer's filter subjects (`filter_subject` or `filter_subjects`).
fn filters(c: &consumer::Config) -> Vec<String> {
    let mut fs = c.filter_subjects.clone();
    if !c.filter_subject.is_empty() {
        fs.push(c.filter_subject.clone());
    }
    fs
}

/// The `nats` CLI command that samples every ack of a consumer.
pub(crate) fn fix_command(stream: &str, consumer: &str) -> String {
    format!("nats consumer edit {stream} {consumer} --sample 100 --force")
}

/// Looks at one stream once: whether it exists, its consumers (except `own`, msgtrail's),
/// logging what is new; with `set_sample_freq`, raises each consumer's `sample_freq` to 100.
pub(crate) async fn discover(
    js: &jetstream::Context,
    status: &ObserveStatus,
    stream: &str,
    own: &str,
    set_sample_freq: bool,
) -> Result<(), async_nats::Error> {
    let before = status.snapshot().remove(stream).unwrap_or_default();
    let s = match js.get_stream(stream).await {
        Ok(s) => s,
        Err(e) => {
            if before.exists {
                tracing::warn!(%stream, error = %e, "observed stream gone or unreachable; waiting for it");
            } else {
                tracing::debug!(%stream, error = %e, "observed stream not there yet");
            }
            status.set(stream, ObservedStream::default());
            return Err(e.into());
        }
    };
    if !before.exists {
        tracing::info!(%stream, "observing stream");
    }
    let mut now = ObservedStream {
        exists: true,
        reads_messages: false,
        first_seq: s.cached_info().state.first_sequence,
        consumers: BTreeMap::new(),
        now: BTreeMap::new(),
    };
    let polled_at = msgtrail_core::time::now_nanos();
    let infos: Vec<consumer::Info> = s.consumers().try_collect().await?;
    for info in infos {
        let Some(name) = info.config.durable_name.clone() else {
            continue; // ephemeral: no group a trajectory can name over time
        };
        if name == own {
            continue;
        }
        let mut freq = info.config.sample_frequency;
        if freq < 100 && set_sample_freq {
            let updated = consumer::Config {
                sample_frequency: 100,
                ..info.config.clone()
            };
            match s.update_consumer(updated).await {
                Ok(_) => {
                    tracing::info!(%stream, consumer = %name, from = freq, "set the consumer's sample_freq to 100% (--observe-set-sample-freq)");
                    freq = 100;
                }
                Err(e) => {
                    tracing::warn!(%stream, consumer = %name, error = %e, "could not set the consumer's sample_freq")
                }
            }
        }
        let mode = if info.config.deliver_subject.is_some() {
            "push"
        } else {
            "pull"
        };
        let c = ObservedConsumer {
            mode,
            sample_freq: freq,
            every_ack_sampled: freq >= 100,
            fix: (freq < 100).then(|| fix_command(stream, &name)),
            filter_subjects: filters(&info.config),
        };
        if before.consumers.get(&name) != Some(&c) {
            match &c.fix {
                Some(fix) => tracing::warn!(
                    %stream, consumer = %name, sample_freq = freq,
                    "observed consumer does not sample every ack: its acked deliveries will be missing; run `{fix}` (or start the listener with --observe-set-sample-freq)"
                ),
                None => tracing::info!(%stream, consumer = %name, mode, "observing consumer"),
            }
        }
        now.now.insert(name.clone(), figures(&info, polled_at));
        now.consumers.insert(name, c);
    }
    status.set(stream, now);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::event::{ConsumerEvent, What};
    use crate::observe::records::{event_records, stored_records, StoredMessage};

    fn consumer(sample_freq: u8, filter: &[&str]) -> ObservedConsumer {
        ObservedConsumer {
            mode: "pull",
            sample_freq,
            every_ack_sampled: sample_freq >= 100,
            fix: (sample_freq < 100).then(|| "fix it".to_owned()),
            filter_subjects: filter.iter().map(|f| (*f).to_owned()).collect(),
        }
    }

    fn acked_by(name: &str) -> Vec<msgtrail_core::StageRecord> {
        let e = ConsumerEvent {
            stream: "ORDERS".into(),
            consumer: name.into(),
            stream_seq: 4,
            deliveries: 1,
            at: 2_000_000,
            what: What::Acked { ack_time: 1_000 },
        };
        event_records(&e, DeliveryMode::Pull, &mut |_, _, _| false).unwrap()
    }

    /// Named: the consumers under 100 % that would take the message and have no ack on it;
    /// not the sampled one, not one that acked it all the same (sampled at 50 %), not one
    /// whose filter excludes its subject.
    #[test]
    fn unsampled_consumers_are_named_on_the_trajectories_they_may_lack_hops_on() {
        let status = ObserveStatus::new(&["ORDERS".to_owned()]);
        let consumers = [
            ("sampled", consumer(100, &[])),
            ("audit", consumer(0, &[])),
            ("half", consumer(50, &[])),
            ("us", consumer(0, &["orders.us.>"])),
            ("eu", consumer(20, &["orders.eu.*"])),
        ];
        status.set(
            "ORDERS",
            ObservedStream {
                exists: true,
                consumers: consumers
                    .into_iter()
                    .map(|(n, c)| (n.to_owned(), c))
                    .collect(),
                ..Default::default()
            },
        );
        let mut rs = acked_by("sampled");
        rs.extend(acked_by("half"));
        rs.extend(
            stored_records(StoredMessage {
                stream: "ORDERS",
                subject: "orders.eu.fr",
                stream_seq: 4,
                stored_at: 1_000_000,
                headers: None,
            })
            .unwrap(),
        );
        let mut t = Trajectory::assemble(rs.clone(), &Default::default()).unwrap();
        status.mark_unsampled(&mut t);
        let named: Vec<_> = t.observed.as_ref().unwrap().unsampled.clone();
        let names: Vec<_> = named.iter().map(|u| u.consumer.as_str()).collect();
        assert_eq!(names, ["audit", "eu"]);
        assert_eq!(
            (named[1].sample_freq, named[1].fix.as_str()),
            (20, "fix it")
        );

        // Without a subject (no stored message read) a filtered consumer may take it too.
        let mut t = Trajectory::assemble(acked_by("sampled"), &Default::default()).unwrap();
        status.mark_unsampled(&mut t);
        let names: Vec<_> = t
            .observed
            .as_ref()
            .unwrap()
            .unsampled
            .iter()
            .map(|u| u.consumer.clone())
            .collect();
        assert_eq!(names, ["audit", "eu", "half", "us"]);

        // Another stream's trajectory, or a broker's: nothing named.
        let other = ObserveStatus::new(&["PAYMENTS".to_owned()]);
        let mut t = Trajectory::assemble(rs, &Default::default()).unwrap();
        other.mark_unsampled(&mut t);
        assert!(t.observed.as_ref().unwrap().unsampled.is_empty());
    }
}
