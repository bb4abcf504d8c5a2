//! nats-server's consumer events as observe mode reads them from `MSGTRAIL_OBSERVE`: the
//! ack metric and the nak, term and max-deliveries advisories (nats-server's
//! `server/jetstream_events.go`), parsed into one typed [`ConsumerEvent`].

use serde::Deserialize;

/// Subject prefix of the consumer ack metrics (`<prefix>.<stream>.<consumer>`).
pub(crate) const ACK_METRIC: &str = "$JS.EVENT.METRIC.CONSUMER.ACK";
/// Subject prefix of the nak advisories.
pub(crate) const NAKED: &str = "$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED";
/// Subject prefix of the term advisories.
pub(crate) const TERMINATED: &str = "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED";
/// Subject prefix of the max-deliveries advisories.
pub(crate) const MAX_DELIVERIES: &str = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES";

/// What happened to one delivery attempt, as nats-server reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum What {
    /// Acked; the delivery was `ack_time` nanoseconds before the event.
    Acked {
        /// Nanoseconds from the delivery to the ack.
        ack_time: u64,
    },
    /// Negatively acknowledged (redelivered later, perhaps after a delay).
    Naked,
    /// Terminated (never redelivered), with the consumer's reason if it gave one.
    Terminated {
        /// The reason given with the term.
        reason: Option<String>,
    },
    /// The attempt was the last one the consumer's `max_deliver` allows.
    MaxDeliveries,
}

/// One consumer event about one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConsumerEvent {
    /// The observed stream.
    pub stream: String,
    /// The durable consumer (it stands for the group and the consumer).
    pub consumer: String,
    /// The message's sequence in the stream.
    pub stream_seq: u64,
    /// The delivery attempt the event is about, from 1 (`deliveries`).
    pub deliveries: u32,
    /// When nats-server emitted it, Unix nanoseconds.
    pub at: u64,
    /// What happened.
    pub what: What,
}

/// Why an event could not be read (it is acked all the same: it will not get better).
#[derive(Debug, thiserror::Error)]
pub(crate) enum EventError {
    /// The subject is none of the four observed kinds.
    #[error("subject {0:?} is not an observed consumer event")]
    Subject(String),
    /// The body is not the event's JSON.
    #[error("{subject}: the body is not the event's JSON")]
    Json {
        /// The event's subject.
        subject: String,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// The timestamp is not RFC 3339.
    #[error("{subject}: timestamp {timestamp:?} is not RFC 3339")]
    Timestamp {
        /// The event's subject.
        subject: String,
        /// The timestamp as sent.
        timestamp: String,
    },
}

/// The fields every one of the four events has (`TypedEvent` plus the consumer's).
#[derive(Debug, Deserialize)]
struct Body {
    timestamp: String,
    stream: String,
    consumer: String,
    stream_seq: u64,
    #[serde(default)]
    deliveries: u64,
    /// Ack metric only.
    #[serde(default)]
    ack_time: i64,
    /// Term advisory only.
    #[serde(default)]
    reason: Option<String>,
}

/// The stream and consumer an event's subject names (`<prefix>.<stream>.<consumer>`), read
/// without its body; `None` for a subject of none of the four kinds.
pub(crate) fn subject_names(subject: &str) -> Option<(&str, &str)> {
    let rest = [ACK_METRIC, NAKED, TERMINATED, MAX_DELIVERIES]
        .into_iter()
        .find_map(|p| subject.strip_prefix(p)?.strip_prefix('.'))?;
    let (stream, consumer) = rest.split_once('.')?;
    (!stream.is_empty() && !consumer.is_empty() && !consumer.contains('.'))
        .then_some((stream, consumer))
}

/// Parses one captured event from its subject and JSON body.
pub(crate) fn parse(subject: &str, payload: &[u8]) -> Result<ConsumerEvent, EventError> {
    let kind = [ACK_METRIC, NAKED, TERMINATED, MAX_DELIVERIES]
        .into_iter()
        .find(|p| subject.strip_prefix(p).is_some_and(|r| r.starts_with('.')))
        .ok_or_else(|| EventError::Subject(subject.to_owned()))?;
    let body: Body = serde_json::from_slice(payload).map_err(|source| EventError::Json {
        subject: subject.to_owned(),
        source,
    })?;
    let at = time::OffsetDateTime::parse(
        &body.timestamp,
        &time::format_description::well_known::Rfc3339,
    )
    .map_err(|_| EventError::Timestamp {
        subject: subject.to_owned(),
        timestamp: body.timestamp.clone(),
    })?
    .unix_timestamp_nanos()
    .max(0) as u64;
    let what = match kind {
        ACK_METRIC => What::Acked {
            ack_time: body.ack_time.max(0) as u64,
        },
        NAKED => What::Naked,
        TERMINATED => What::Terminated {
            reason: body.reason.filter(|r| !r.is_empty()),
        },
        _ => What::MaxDeliveries,
    };
    Ok(ConsumerEvent {
        stream: body.stream,
        consumer: body.consumer,
        stream_seq: body.stream_seq,
        deliveries: u32::try_from(body.deliveries.max(1)).unwrap_or(u32::MAX),
        at,
        what,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_four_events_parse_as_nats_server_writes_them() {
        let ack = br#"{"type":"io.nats.jetstream.metric.v1.consumer_ack","id":"x","timestamp":"2026-12-02T08:00:00.000000500Z","stream":"ORDERS","consumer":"billing","consumer_seq":3,"stream_seq":7,"ack_time":2500,"deliveries":2}"#;
        let e = parse("$JS.EVENT.METRIC.CONSUMER.ACK.ORDERS.billing", ack).unwrap();
        assert_eq!(e.stream, "ORDERS");
        assert_eq!(e.consumer, "billing");
        assert_eq!((e.stream_seq, e.deliveries), (7, 2));
        assert_eq!(e.what, What::Acked { ack_time: 2500 });
        assert_eq!(e.at % 1_000_000_000, 500);
        let term = br#"{"timestamp":"2026-12-02T08:00:00Z","stream":"ORDERS","consumer":"billing","consumer_seq":3,"stream_seq":8,"deliveries":1,"reason":"bad order"}"#;
        let e = parse(
            "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.ORDERS.billing",
            term,
        )
        .unwrap();
        assert_eq!(
            e.what,
            What::Terminated {
                reason: Some("bad order".into())
            }
        );
        let nak = br#"{"timestamp":"2026-12-02T08:00:00Z","stream":"ORDERS","consumer":"b","stream_seq":8,"deliveries":1}"#;
        let e = parse("$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED.ORDERS.b", nak).unwrap();
        assert_eq!(e.what, What::Naked);
        let e = parse("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.ORDERS.b", nak).unwrap();
        assert_eq!(e.what, What::MaxDeliveries);
    }

    #[test]
    fn the_subject_names_stream_and_consumer() {
        assert_eq!(
            subject_names("$JS.EVENT.METRIC.CONSUMER.ACK.ORDERS.billing"),
            Some(("ORDERS", "billing"))
        );
        assert_eq!(
            subject_names("$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED.ORDERS.b"),
            Some(("ORDERS", "b"))
        );
        assert_eq!(subject_names("$JS.EVENT.METRIC.CONSUMER.ACK.ORDERS"), None);
        assert_eq!(
            subject_names("$JS.EVENT.ADVISORY.CONSUMER.CREATED.O.b"),
            None
        );
        assert_eq!(subject_names("$JS.EVENT.METRIC.CONSUMER.ACKX.O.b"), None);
    }

    #[test]
    fn bad_events_are_precise_errors() {
        assert!(matches!(
            parse("$JS.EVENT.ADVISORY.CONSUMER.CREATED.ORDERS.b", b"{}"),
            Err(EventError::Subject(_))
        ));
        let json = parse("$JS.EVENT.METRIC.CONSUMER.ACK.ORDERS.b", b"not json").unwrap_err();
        assert!(matches!(json, EventError::Json { .. }));
        // Its own level only: the JSON decoder's words are its source, rendered once by the
        // chain.
        let cause = std::error::Error::source(&json).unwrap().to_string();
        assert!(!json.to_string().contains(&cause), "{json}");
        let chain = msgtrail_core::ErrorChain(&json).to_string();
        assert_eq!(chain.matches(&cause).count(), 1, "{chain}");
        let bad_time = br#"{"timestamp":"yesterday","stream":"O","consumer":"b","stream_seq":1}"#;
        assert!(matches!(
            parse("$JS.EVENT.METRIC.CONSUMER.ACK.O.b", bad_time),
            Err(EventError::Timestamp { .. })
        ));
    }
}
