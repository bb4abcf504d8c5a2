//! The stage records of hook events (P4, C2/C3, C6/C7, X1/X2), the proof each carries, and
//! their encoded size.

use crate::hooks::{DeliveryInfo, HookEvent};
use msgtrail_core::frame::ReportedRecord;
use msgtrail_core::outcome::{ConfirmOutcome, ProcessOutcome};
use msgtrail_core::{Stage, StageRecord};

/// The stage record of an event, if it has one. ([`HookEvent::BeforeSend`] maps to P1, which
/// the SDK does not report through the outbox: it travels as the upload's `sent_at`.)
pub(crate) fn record_of(event: &HookEvent) -> Option<StageRecord> {
    let r = match event {
        HookEvent::BeforeSend {
            request_id,
            topic,
            attempt,
            traceparent,
            at,
        } => {
            let mut r = StageRecord::at(Stage::UploadSent, *at);
            r.request_id = Some(request_id.clone());
            r.topic = Some(topic.to_string());
            r.attempt = Some(*attempt);
            r.traceparent = traceparent.clone();
            r
        }
        HookEvent::StoreConfirmed { reply, at } => {
            let mut r = StageRecord::at(Stage::StoreConfirmed, *at);
            r.request_id = Some(reply.request_id.clone());
            r.message_id = Some(reply.message_id);
            r.stream_seq = Some(reply.stream_seq);
            if reply.duplicate {
                r.set_outcome(ConfirmOutcome::Duplicate);
            }
            r
        }
        HookEvent::Received { delivery, at } => {
            let stage = if delivery.push {
                Stage::PushReceived
            } else {
                Stage::PullReceived
            };
            delivery_record(stage, delivery, *at)
        }
        HookEvent::ProcessingStarted { delivery, at } => {
            delivery_record(Stage::ProcessStarted, delivery, *at)
        }
        HookEvent::ProcessingFinished {
            delivery,
            outcome,
            at,
        } => {
            let mut r = delivery_record(Stage::ProcessFinished, delivery, *at);
            match outcome {
                Ok(()) => r.set_outcome(ProcessOutcome::Ok),
                Err(e) => {
                    r.set_outcome(ProcessOutcome::Failed);
                    r.detail = Some(e.chars().take(1024).collect());
                }
            }
            r
        }
        HookEvent::Settled { delivery, kind, at } => {
            let stage = if delivery.push {
                Stage::PushAckSent
            } else {
                Stage::PullAckSent
            };
            let mut r = delivery_record(stage, delivery, *at);
            r.set_outcome(*kind);
            r
        }
        HookEvent::AfterSend { .. } => return None,
    };
    Some(r)
}

/// The proof the broker wants with the event's record: the delivery's ack token for consumer
/// stages, the upload receipt for P4, nothing for P1.
pub(crate) fn token_of(event: &HookEvent) -> Option<String> {
    match event {
        HookEvent::StoreConfirmed { reply, .. } => {
            Some(reply.receipt.clone()).filter(|r| !r.is_empty())
        }
        HookEvent::Received { delivery, .. }
        | HookEvent::ProcessingStarted { delivery, .. }
        | HookEvent::ProcessingFinished { delivery, .. }
        | HookEvent::Settled { delivery, .. } => Some(delivery.ack_token.clone()),
        HookEvent::BeforeSend { .. } | HookEvent::AfterSend { .. } => None,
    }
}

/// The record the reporting hook puts in the outbox for `event`, with its token: P4, C2/C3,
/// C6/C7, X1/X2. `None` for P1 (it rides as `sent_at`), for events without a stage, and for a
/// P4 without a receipt (the broker would refuse it, and every record riding with it).
pub(crate) fn reported(event: &HookEvent) -> Option<ReportedRecord> {
    if matches!(
        event,
        HookEvent::BeforeSend { .. } | HookEvent::AfterSend { .. }
    ) {
        return None;
    }
    let token = token_of(event)?;
    Some(ReportedRecord {
        record: record_of(event)?,
        token,
    })
}

/// True for the events of a delivery (C2/C3, C6/C7, X1/X2): their records are held for the
/// delivery's settle.
pub(crate) fn of_a_delivery(event: &HookEvent) -> bool {
    matches!(
        event,
        HookEvent::Received { .. }
            | HookEvent::ProcessingStarted { .. }
            | HookEvent::ProcessingFinished { .. }
            | HookEvent::Settled { .. }
    )
}

/// A delivery's record without what its ack token names (message, group, attempt, topic):
/// the broker fills those in from the token, in a settle or a report alike
/// (docs/PROTOCOL.md §11), so they need not travel.
pub(crate) fn proven_by_token(mut r: StageRecord) -> StageRecord {
    r.message_id = None;
    r.group = None;
    r.attempt = None;
    r.topic = None;
    r
}

fn delivery_record(stage: Stage, d: &DeliveryInfo, at: u64) -> StageRecord {
    let mut r = StageRecord::at(stage, at);
    r.message_id = Some(d.message_id);
    r.group = Some(d.group.clone());
    r.attempt = Some(d.attempt);
    r.topic = Some(d.topic.as_str().to_owned());
    r
}

/// The encoded size of a reported record in a frame (an upper bound: every field present
/// counts with its length prefix, and the record as if it were alone in its token's group —
/// records sharing a token take less).
pub(crate) fn reported_size(r: &ReportedRecord) -> usize {
    2 + r.token.len()
        + 2 // the group's record count
        + record_size(&r.record)
}

/// The encoded size of a compact record (docs/PROTOCOL.md §18.6) without a token: what a
/// settle's own record takes in its entry.
pub(crate) fn record_size(rec: &StageRecord) -> usize {
    let s8 = |v: Option<&str>| v.map_or(0, |v| 1 + v.len());
    let s16 = |v: Option<&str>| v.map_or(0, |v| 2 + v.len());
    1 // stage
        + 8 // at
        + 2 // present bits
        + rec.message_id.map_or(0, |_| 16)
        + s8(rec.request_id.as_ref().map(|v| v.as_str()))
        + s8(rec.producer.as_ref().map(|v| v.as_str()))
        + s8(rec.consumer.as_ref().map(|v| v.as_str()))
        + s8(rec.group.as_ref().map(|v| v.as_str()))
        + s16(rec.topic.as_deref())
        + rec.attempt.map_or(0, |_| 4)
        + rec.stream_seq.map_or(0, |_| 8)
        + s8(rec.outcome.as_deref())
        + s16(rec.detail.as_deref())
        + s8(rec.service.as_deref())
        + s8(rec.traceparent.as_deref())
        + if rec.attrs.is_empty() {
            0
        } else {
            1 + rec
                .attrs
                .iter()
                .map(|(k, v)| 3 + k.len() + v.len())
                .sum::<usize>()
        }
        + rec.payload_size.map_or(0, |_| 8)
        + s16(rec.payload_head.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reporter::flush::REPORT_FRAME_OVERHEAD;
    use msgtrail_core::frame;
    use msgtrail_core::wire::{SettleKind, UploadReply};
    use msgtrail_core::{ClientId, MessageId, RequestId};

    fn delivery() -> DeliveryInfo {
        DeliveryInfo {
            message_id: MessageId::new(),
            topic: msgtrail_core::Topic::new("orders.eu").unwrap(),
            group: ClientId::new("billing").unwrap().into(),
            attempt: 2,
            push: false,
            ack_token: "tok".into(),
        }
    }

    #[test]
    fn p1_does_not_ride_in_the_outbox_and_p4_needs_its_receipt() {
        let before = HookEvent::BeforeSend {
            request_id: RequestId::new("r").unwrap(),
            topic: msgtrail_core::Topic::new("t").unwrap(),
            attempt: 1,
            traceparent: None,
            at: 1,
        };
        assert_eq!(record_of(&before).unwrap().stage, Stage::UploadSent);
        assert!(reported(&before).is_none());
        let mut reply = UploadReply {
            message_id: MessageId::new(),
            request_id: RequestId::new("r").unwrap(),
            stream_seq: 3,
            duplicate: true,
            receipt: String::new(),
        };
        let p4 = |reply: &UploadReply| HookEvent::StoreConfirmed {
            reply: reply.clone(),
            at: 2,
        };
        assert!(reported(&p4(&reply)).is_none());
        reply.receipt = "receipt".into();
        let r = reported(&p4(&reply)).unwrap();
        assert_eq!(
            (r.record.stage, r.token.as_str()),
            (Stage::StoreConfirmed, "receipt")
        );
        assert_eq!(r.record.outcome.as_deref(), Some("duplicate"));
        let c7 = reported(&HookEvent::Settled {
            delivery: delivery(),
            kind: SettleKind::Nack,
            at: 3,
        })
        .unwrap();
        assert_eq!(c7.record.stage, Stage::PullAckSent);
        assert_eq!(c7.token, "tok");
    }

    #[test]
    fn the_size_bound_covers_the_encoding() {
        let mut rec = record_of(&HookEvent::ProcessingFinished {
            delivery: delivery(),
            outcome: Err("boom ✗".into()),
            at: 5,
        })
        .unwrap();
        rec.attrs.insert("k".into(), "v".into());
        rec.service = Some("svc".into());
        let r = ReportedRecord {
            record: rec,
            token: "t".repeat(300),
        };
        let framed = frame::encode_report(std::slice::from_ref(&r)).len();
        assert_eq!(framed, REPORT_FRAME_OVERHEAD + reported_size(&r));
    }
}
