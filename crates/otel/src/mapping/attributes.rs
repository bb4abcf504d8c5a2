//! A hop's attributes (messaging semantic conventions and `msgtrail.*`), its operation
//! and kind, its service and its `error.type`.

use super::*;

/// Why a hop failed, as a short `error.type`.
pub(super) fn error_type(hop: &HopSpan) -> &'static str {
    // Typed outcomes are read per stage: a settle outcome only from C3/C4/C7/C8, and so on.
    let outcome = |o: Outcome| {
        hop.events
            .iter()
            .any(|r| r.typed_outcome() == Some(o.clone()))
    };
    if outcome(RedeliveryOutcome::DeadLetter.into()) {
        "dead_letter"
    } else if outcome(ProcessOutcome::Failed.into()) {
        "processing_failed"
    } else if outcome(SettleOutcome::Nack.into()) {
        "nack"
    } else if outcome(SettleOutcome::Term.into()) {
        "term"
    } else if outcome(RedeliveryOutcome::Redeliver.into()) {
        "no_ack"
    } else if hop.end.is_none() {
        "timeout"
    } else {
        "error"
    }
}

pub(super) fn operation(hop: &HopSpan) -> (&'static str, &'static str, SpanKind) {
    match hop.kind {
        HopKind::Send => ("send", "send", SpanKind::Producer),
        // The broker takes the upload in and stores it: CONSUMER, so `process`.
        HopKind::Store => ("store", "process", SpanKind::Consumer),
        // The broker sends the message on, pushed or as the answer to a fetch: PRODUCER, so
        // `send` either way (`receive` is the fetching client's, a CLIENT span).
        HopKind::Deliver => ("deliver", "send", SpanKind::Producer),
        HopKind::Process => ("process", "process", SpanKind::Consumer),
    }
}

pub(super) fn service_name(t: &Trajectory, hop: &HopSpan, opts: &MappingOptions) -> String {
    if let Some(s) = hop.service.as_ref().filter(|s| !s.is_empty()) {
        return s.clone();
    }
    match hop.kind {
        HopKind::Send => t
            .producer
            .as_ref()
            .map(|p| p.to_string())
            .unwrap_or_else(|| "unknown-producer".to_owned()),
        HopKind::Store | HopKind::Deliver => opts.broker_service.clone(),
        HopKind::Process => hop
            .consumer
            .as_ref()
            .map(|c| c.to_string())
            .unwrap_or_else(|| "unknown-consumer".to_owned()),
    }
}

/// The attributes every hop's span has: messaging system and operation, hop key and status,
/// topic, message ID (or `msgtrail.orphan`) and request ID.
pub(super) fn common_attributes(
    t: &Trajectory,
    hop: &HopSpan,
    op_name: &'static str,
    op_type: &'static str,
) -> Vec<KeyValue> {
    let mut attrs = vec![
        KeyValue::new(attribute::MESSAGING_SYSTEM, MESSAGING_SYSTEM),
        KeyValue::new(attribute::MESSAGING_OPERATION_NAME, op_name),
        KeyValue::new(attribute::MESSAGING_OPERATION_TYPE, op_type),
        KeyValue::new(HOP_KEY, hop.key.clone()),
        KeyValue::new(
            "msgtrail.hop.status",
            match hop.status {
                HopStatus::Ok => "ok",
                HopStatus::Error => "error",
                HopStatus::Incomplete => "incomplete",
            },
        ),
    ];
    if let Some(topic) = &t.topic {
        attrs.push(KeyValue::new(
            attribute::MESSAGING_DESTINATION_NAME,
            topic.clone(),
        ));
    }
    if let Some(m) = &t.message_id {
        attrs.push(KeyValue::new(
            attribute::MESSAGING_MESSAGE_ID,
            m.to_string(),
        ));
    } else {
        attrs.push(KeyValue::new("msgtrail.orphan", true));
    }
    if let Some(r) = &t.request_id {
        attrs.push(KeyValue::new(
            attribute::MESSAGING_MESSAGE_CONVERSATION_ID,
            r.to_string(),
        ));
    }
    attrs
}

/// The producer side's attributes (send and store hops): client ID, body size, upload
/// attempts and duplicates, stream sequence.
pub(super) fn producer_attributes(t: &Trajectory, hop: &HopSpan, attrs: &mut Vec<KeyValue>) {
    if let Some(p) = &t.producer {
        attrs.push(KeyValue::new(attribute::MESSAGING_CLIENT_ID, p.to_string()));
    }
    if let Some(size) = t.payload_size {
        attrs.push(KeyValue::new(
            attribute::MESSAGING_MESSAGE_BODY_SIZE,
            size as i64,
        ));
    }
    if hop.kind == HopKind::Send {
        attrs.push(KeyValue::new(
            "msgtrail.upload.attempts",
            i64::from(t.upload_attempts),
        ));
        if t.duplicates > 0 {
            attrs.push(KeyValue::new(
                "msgtrail.upload.duplicates",
                i64::from(t.duplicates),
            ));
        }
    }
    if let Some(seq) = hop.events.iter().find_map(|r| r.stream_seq) {
        attrs.push(KeyValue::new("msgtrail.stream_seq", seq as i64));
    }
}

/// The consumer side's attributes (deliver and process hops): group, consumer, attempt and
/// delivery mode.
pub(super) fn consumer_attributes(hop: &HopSpan, attrs: &mut Vec<KeyValue>) {
    if let Some(g) = &hop.group {
        attrs.push(KeyValue::new(
            attribute::MESSAGING_CONSUMER_GROUP_NAME,
            g.to_string(),
        ));
    }
    if let Some(c) = &hop.consumer {
        attrs.push(KeyValue::new(attribute::MESSAGING_CLIENT_ID, c.to_string()));
    }
    if let Some(a) = hop.attempt {
        attrs.push(KeyValue::new("msgtrail.attempt", i64::from(a)));
    }
    if let Some(m) = hop.mode {
        let mode = match m {
            DeliveryMode::Push => "push",
            DeliveryMode::Pull => "pull",
        };
        attrs.push(KeyValue::new("msgtrail.delivery.mode", mode));
    }
}

/// What a hop says of itself: synthesized, the broker that timed it, its clock estimate,
/// impossible timestamps, the reason.
pub(super) fn detail_attributes(hop: &HopSpan, attrs: &mut Vec<KeyValue>) {
    if hop.synthesized {
        attrs.push(KeyValue::new("msgtrail.synthesized", true));
    }
    // Broker-side spans (store, deliver) name the broker process whose clock timed them.
    if let Some(b) = &hop.broker {
        attrs.push(KeyValue::new(BROKER_INSTANCE, b.to_string()));
    }
    if let Some(c) = &hop.clock {
        attrs.push(KeyValue::new("msgtrail.clock.offset", c.offset_nanos));
        attrs.push(KeyValue::new(
            "msgtrail.clock.bound",
            i64::try_from(c.bound_nanos).unwrap_or(i64::MAX),
        ));
    }
    if let Some(why) = &hop.impossible {
        attrs.push(KeyValue::new("msgtrail.timestamps.impossible", why.clone()));
    }
    if let Some(reason) = &hop.reason {
        attrs.push(KeyValue::new("msgtrail.reason", reason.clone()));
    }
}

/// What every span of an observed trajectory says (observe mode, docs/ARCHITECTURE.md):
/// `msgtrail.observed`, the stream and its sequence, and the stream's consumers that do not
/// sample every ack and so may lack hops on it.
pub(super) fn observed_attributes(t: &Trajectory, attrs: &mut Vec<KeyValue>) {
    let Some(o) = &t.observed else {
        return;
    };
    attrs.push(KeyValue::new("msgtrail.observed", true));
    attrs.push(KeyValue::new("msgtrail.observe.stream", o.stream.clone()));
    attrs.push(KeyValue::new(
        "msgtrail.observe.stream_seq",
        i64::try_from(o.stream_seq).unwrap_or(i64::MAX),
    ));
    if !o.unsampled.is_empty() {
        let names = o
            .unsampled
            .iter()
            .map(|u| opentelemetry::StringValue::from(u.consumer.clone()))
            .collect();
        attrs.push(KeyValue::new(
            "msgtrail.observe.unsampled_consumers",
            opentelemetry::Value::Array(opentelemetry::Array::String(names)),
        ));
    }
}
