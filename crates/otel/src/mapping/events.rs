//! Stage records as span events (`{code} {what}` at the record's time) and a hop's events
//! and links.

use super::*;

/// What each stage record means, for span event names.
pub(crate) fn stage_label(stage: Stage) -> &'static str {
    match stage {
        Stage::UploadSent => "upload sent",
        Stage::UploadReceived => "upload received, message ID assigned",
        Stage::Stored => "stored, store-success sent",
        Stage::StoreConfirmed => "store-success received",
        Stage::PushSent => "pushed to consumer",
        Stage::PushReceived => "push received",
        Stage::PushAckSent => "ack sent",
        Stage::PushAckReceived => "ack received",
        Stage::PullSent => "fetch answered",
        Stage::PullReceived => "fetched message received",
        Stage::PullAckSent => "ack sent",
        Stage::PullAckReceived => "ack received",
        Stage::ProcessStarted => "processing started",
        Stage::ProcessFinished => "processing finished",
        Stage::NoMatch => "no matching message",
        Stage::Channel => "channel",
        Stage::Redelivery => "redelivery",
        Stage::Duplicate => "duplicate upload suppressed",
    }
}

pub(super) fn time(nanos: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(nanos)
}

/// One stage record as a span event at its exact time.
pub(crate) fn record_event(r: &StageRecord) -> Event {
    let mut attrs = vec![KeyValue::new("msgtrail.stage", r.stage.code())];
    let mut put = |k: &'static str, v: Option<String>| {
        if let Some(v) = v {
            attrs.push(KeyValue::new(k, v));
        }
    };
    put(
        attribute::MESSAGING_MESSAGE_ID,
        r.message_id.map(|m| m.to_string()),
    );
    put(
        attribute::MESSAGING_MESSAGE_CONVERSATION_ID,
        r.request_id.as_ref().map(|x| x.to_string()),
    );
    put(
        "msgtrail.producer",
        r.producer.as_ref().map(|x| x.to_string()),
    );
    put(
        "msgtrail.consumer",
        r.consumer.as_ref().map(|x| x.to_string()),
    );
    put(
        attribute::MESSAGING_CONSUMER_GROUP_NAME,
        r.group.as_ref().map(|x| x.to_string()),
    );
    put(attribute::MESSAGING_DESTINATION_NAME, r.topic.clone());
    put("msgtrail.outcome", r.outcome.clone());
    put("msgtrail.detail", r.detail.clone());
    put("msgtrail.service", r.service.clone());
    if let Some(a) = r.attempt {
        attrs.push(KeyValue::new("msgtrail.attempt", i64::from(a)));
    }
    if let Some(s) = r.stream_seq {
        attrs.push(KeyValue::new("msgtrail.stream_seq", s as i64));
    }
    Event::new(
        format!("{} {}", r.stage.code(), stage_label(r.stage)),
        time(r.at),
        attrs,
        0,
    )
}

/// The span's events (its records, and for the send hop the records of no hop) in time order,
/// and its links (the producer's traceparent, on the send hop).
pub(super) fn events_and_links(t: &Trajectory, hop: &HopSpan) -> (Vec<Event>, Vec<Link>) {
    let mut events: Vec<Event> = hop.events.iter().map(record_event).collect();
    let mut links = Vec::new();
    if hop.kind == HopKind::Send {
        // Records that belong to no hop but carry this message's IDs (a D1 without a P1,
        // for instance) still show on the trace: on its root.
        events.extend(t.other_records.iter().map(record_event));
        let tp = t
            .traceparent
            .as_deref()
            .or_else(|| hop.events.iter().find_map(|r| r.traceparent.as_deref()));
        if let Some(cx) = tp.and_then(parse_traceparent) {
            links.push(Link::new(
                cx,
                vec![KeyValue::new("msgtrail.link", "producer traceparent")],
                0,
            ));
        }
    }
    events.sort_by_key(|e| e.timestamp);

    (events, links)
}
