//! From what nats-server shows to stage records, with the broker's hop keys (pure).
//!
//! | seen | records |
//! | --- | --- |
//! | a stored message (headers-only consumer) | P2 and P3 at JetStream's stored time, outcome `observed`: subject as topic, `Nats-Msg-Id` as request ID, the stream as producer, `traceparent`, payload size, stream sequence |
//! | ack metric | C5 (pull) or C1 (push) at the event's time − `ack_time`, then C8/C4 `ack` at the event's time |
//! | nak advisory | C8/C4 `nack` at the event's time |
//! | term advisory | C8/C4 `term`, the reason as detail |
//! | max-deliveries advisory | R1 `dead_letter` of that attempt |
//! | any event of attempt n ≥ 2 whose attempt n − 1 has no outcome | R1 `redeliver` of attempt n − 1, "ack wait expired" |
//!
//! Every delivery record names the durable consumer as both group and consumer, the stream
//! as producer (as the stored records do), its attempt (`deliveries`) and the stream
//! sequence, and carries the `service.name` [`OBSERVED_SERVICE`]: so a trajectory of
//! delivery records alone (a work-queue stream, whose stored messages msgtrail does not
//! read) still says which stream and sequence it observed. Records depend only on the event, so a redelivered event gives the
//! same records and the store skips them; the ack-wait inference also asks whether the
//! previous attempt already has an outcome (in the store or earlier in the batch).

use super::event::{ConsumerEvent, What};
use async_nats::HeaderMap;
use msgtrail_core::observed::{observed_message_id, OBSERVED_SERVICE};
use msgtrail_core::outcome::{RedeliveryOutcome, SettleKind, StoreOutcome};
use msgtrail_core::trajectory::DeliveryMode;
use msgtrail_core::{headers as h, ClientId, GroupId, MessageId, RequestId, Stage, StageRecord};

/// A stored message of an observed stream, as the headers-only consumer sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StoredMessage<'a> {
    /// The stream.
    pub stream: &'a str,
    /// Its subject.
    pub subject: &'a str,
    /// Its stream sequence.
    pub stream_seq: u64,
    /// JetStream's stored time, Unix nanoseconds.
    pub stored_at: u64,
    /// Its headers (with `Nats-Msg-Size`, the payload size).
    pub headers: Option<&'a HeaderMap>,
}

/// Why a stream or consumer name cannot name a trajectory's producer or group.
#[derive(Debug, thiserror::Error)]
#[error("{what} {name:?} cannot be a msgtrail client ID (1–64 of A-Z a-z 0-9 _ -)")]
pub(crate) struct NameError {
    /// `stream` or `consumer`.
    pub what: &'static str,
    /// The name.
    pub name: String,
}

fn client_id(what: &'static str, name: &str) -> Result<ClientId, NameError> {
    ClientId::new(name).map_err(|_| NameError {
        what,
        name: name.to_owned(),
    })
}

/// P2 and P3 of a stored message: both at JetStream's stored time (nats-server tells no
/// other), outcome [`StoreOutcome::Observed`].
pub(crate) fn stored_records(m: StoredMessage<'_>) -> Result<[StageRecord; 2], NameError> {
    let producer = client_id("stream", m.stream)?;
    let header = |name: &str| m.headers.and_then(|hs| hs.get(name)).map(|v| v.as_str());
    let message_id = observed_message_id(m.stream, m.stream_seq);
    let base = |stage: Stage| {
        let mut r = StageRecord::at(stage, m.stored_at);
        r.message_id = Some(message_id);
        r.producer = Some(producer.clone());
        r.request_id = header(h::NATS_MSG_ID).and_then(|v| RequestId::new(v).ok());
        r.topic = Some(m.subject.to_owned());
        r.attempt = Some(1);
        r.service = Some(OBSERVED_SERVICE.to_owned());
        r.set_outcome(StoreOutcome::Observed);
        r
    };
    let mut p2 = base(Stage::UploadReceived);
    p2.traceparent = header(h::TRACEPARENT).map(str::to_owned);
    p2.payload_size = header(crate::evidence::NATS_MSG_SIZE).and_then(|v| v.trim().parse().ok());
    let mut p3 = base(Stage::Stored);
    p3.stream_seq = Some(m.stream_seq);
    Ok([p2, p3])
}

/// One delivery record of `e`'s message and consumer.
fn delivery(
    e: &ConsumerEvent,
    (id, stream): (MessageId, &ClientId),
    c: &ClientId,
    stage: Stage,
    at: u64,
    attempt: u32,
) -> StageRecord {
    let mut r = StageRecord::at(stage, at);
    r.message_id = Some(id);
    r.producer = Some(stream.clone());
    r.consumer = Some(c.clone());
    r.group = Some(GroupId::from(c.clone()));
    r.attempt = Some(attempt);
    r.stream_seq = Some(e.stream_seq);
    r.service = Some(OBSERVED_SERVICE.to_owned());
    r
}

/// The records of one consumer event. `mode` is the consumer's (push or pull; pull when
/// unknown). `unsettled(id, consumer, attempt)` says whether an earlier attempt has no
/// outcome yet: then it was redelivered because its ack wait expired.
pub(crate) fn event_records(
    e: &ConsumerEvent,
    mode: DeliveryMode,
    unsettled: &mut dyn FnMut(MessageId, &str, u32) -> bool,
) -> Result<Vec<StageRecord>, NameError> {
    let c = client_id("consumer", &e.consumer)?;
    let stream = client_id("stream", &e.stream)?;
    let id = observed_message_id(&e.stream, e.stream_seq);
    let msg = (id, &stream);
    let (sent, settled) = match mode {
        DeliveryMode::Push => (Stage::PushSent, Stage::PushAckReceived),
        DeliveryMode::Pull => (Stage::PullSent, Stage::PullAckReceived),
    };
    let n = e.deliveries;
    let mut out = Vec::with_capacity(3);
    if n >= 2 && unsettled(id, &e.consumer, n - 1) {
        let mut r1 = delivery(e, msg, &c, Stage::Redelivery, e.at, n - 1);
        if let What::Acked { ack_time } = e.what {
            // Redelivered when attempt n was delivered.
            r1.at = e.at.saturating_sub(ack_time);
        }
        r1.set_outcome(RedeliveryOutcome::Redeliver);
        r1.detail = Some(format!("ack wait expired (redelivered as attempt {n})"));
        out.push(r1);
    }
    match &e.what {
        What::Acked { ack_time } => {
            out.push(delivery(
                e,
                msg,
                &c,
                sent,
                e.at.saturating_sub(*ack_time),
                n,
            ));
            let mut ack = delivery(e, msg, &c, settled, e.at, n);
            ack.set_outcome(SettleKind::Ack);
            out.push(ack);
        }
        What::Naked => {
            let mut nak = delivery(e, msg, &c, settled, e.at, n);
            nak.set_outcome(SettleKind::Nack);
            out.push(nak);
        }
        What::Terminated { reason } => {
            let mut term = delivery(e, msg, &c, settled, e.at, n);
            term.set_outcome(SettleKind::Term);
            term.detail = reason.clone();
            out.push(term);
        }
        What::MaxDeliveries => {
            let mut dead = delivery(e, msg, &c, Stage::Redelivery, e.at, n);
            dead.set_outcome(RedeliveryOutcome::DeadLetter);
            dead.detail = Some(format!("max deliveries reached ({n})"));
            out.push(dead);
        }
    }
    Ok(out)
}

/// Whether `r` gives its attempt an outcome (a settle or an R1).
pub(crate) fn is_outcome(r: &StageRecord) -> bool {
    matches!(
        r.stage,
        Stage::PullAckReceived | Stage::PushAckReceived | Stage::Redelivery
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(what: What, deliveries: u32) -> ConsumerEvent {
        ConsumerEvent {
            stream: "ORDERS".into(),
            consumer: "billing".into(),
            stream_seq: 9,
            deliveries,
            at: 1_000_000,
            what,
        }
    }

    #[test]
    fn an_ack_gives_the_delivery_and_its_ack() {
        let rs = event_records(
            &ev(What::Acked { ack_time: 400 }, 1),
            DeliveryMode::Pull,
            &mut |_, _, _| true,
        )
        .unwrap();
        assert_eq!(rs.len(), 2);
        assert_eq!((rs[0].stage, rs[0].at), (Stage::PullSent, 999_600));
        assert_eq!(
            (rs[1].stage, rs[1].outcome.as_deref()),
            (Stage::PullAckReceived, Some("ack"))
        );
        assert_eq!(rs[1].group.as_ref().unwrap().as_str(), "billing");
        assert_eq!(rs[1].message_id, Some(observed_message_id("ORDERS", 9)));
    }

    #[test]
    fn a_later_attempt_infers_the_ack_wait_expiry_only_when_unsettled() {
        let e = ev(What::Acked { ack_time: 400 }, 3);
        let rs = event_records(&e, DeliveryMode::Push, &mut |_, c, a| {
            c == "billing" && a == 2
        })
        .unwrap();
        assert_eq!(rs[0].stage, Stage::Redelivery);
        assert_eq!(
            (rs[0].attempt, rs[0].outcome.as_deref()),
            (Some(2), Some("redeliver"))
        );
        assert_eq!(rs[1].stage, Stage::PushSent);
        let rs = event_records(&e, DeliveryMode::Push, &mut |_, _, _| false).unwrap();
        assert_eq!(rs.len(), 2);
    }

    #[test]
    fn nak_term_and_max_deliveries_say_what_happened() {
        let no = &mut |_: MessageId, _: &str, _: u32| false;
        let rs = event_records(&ev(What::Naked, 1), DeliveryMode::Pull, no).unwrap();
        assert_eq!(rs[0].outcome.as_deref(), Some("nack"));
        let rs = event_records(
            &ev(
                What::Terminated {
                    reason: Some("bad".into()),
                },
                1,
            ),
            DeliveryMode::Pull,
            no,
        )
        .unwrap();
        assert_eq!(
            (rs[0].outcome.as_deref(), rs[0].detail.as_deref()),
            (Some("term"), Some("bad"))
        );
        let rs = event_records(&ev(What::MaxDeliveries, 4), DeliveryMode::Pull, no).unwrap();
        assert_eq!(
            (rs[0].stage, rs[0].outcome.as_deref(), rs[0].attempt),
            (Stage::Redelivery, Some("dead_letter"), Some(4))
        );
        let mut bad = ev(What::Naked, 1);
        bad.consumer = "a.b".into();
        assert!(event_records(&bad, DeliveryMode::Pull, no).is_err());
    }

    #[test]
    fn deliveries_alone_still_say_what_was_observed() {
        let rs = event_records(
            &ev(What::Acked { ack_time: 400 }, 1),
            DeliveryMode::Pull,
            &mut |_, _, _| false,
        )
        .unwrap();
        assert!(rs
            .iter()
            .all(|r| r.producer.as_ref().map(|p| p.as_str()) == Some("ORDERS")));
        let t = msgtrail_core::trajectory::Trajectory::assemble(rs, &Default::default()).unwrap();
        let o = t
            .observed
            .as_ref()
            .expect("observed without a stored message");
        assert_eq!(
            (o.stream.as_str(), o.stream_seq, o.stored),
            ("ORDERS", 9, false)
        );
        assert_eq!(o.nats_msg_id, None);
        assert!(o
            .unseen
            .iter()
            .any(|u| u == msgtrail_core::observed::UNSEEN_STORED));
        assert_eq!(
            t.trace_id.as_deref(),
            Some(observed_message_id("ORDERS", 9).trace_hex().as_str())
        );
    }

    #[test]
    fn a_stored_message_gives_p2_and_p3_at_its_stored_time() {
        let mut hs = HeaderMap::new();
        hs.insert(h::NATS_MSG_ID, "ord-1");
        hs.insert(
            h::TRACEPARENT,
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        );
        hs.insert("Nats-Msg-Size", "12");
        let [p2, p3] = stored_records(StoredMessage {
            stream: "ORDERS",
            subject: "orders.eu",
            stream_seq: 9,
            stored_at: 5,
            headers: Some(&hs),
        })
        .unwrap();
        assert_eq!((p2.at, p3.at, p3.stream_seq), (5, 5, Some(9)));
        assert_eq!(p2.request_id.as_ref().unwrap().as_str(), "ord-1");
        assert_eq!(p2.payload_size, Some(12));
        assert!(p2.traceparent.is_some());
        assert_eq!(p3.outcome.as_deref(), Some("observed"));
        let t = msgtrail_core::trajectory::Trajectory::assemble(vec![p2, p3], &Default::default())
            .unwrap();
        let o = t.observed.as_ref().expect("observed");
        assert_eq!(
            (o.stream.as_str(), o.stream_seq, o.stored),
            ("ORDERS", 9, true)
        );
        assert!(!o
            .unseen
            .iter()
            .any(|u| u == msgtrail_core::observed::UNSEEN_STORED));
        assert_eq!(
            t.trace_id.as_deref(),
            Some("0af7651916cd43dd8448eb211c80319c")
        );
    }
}
