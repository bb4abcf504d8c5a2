use super::{store_failure, valid_traceparent};
use crate::js_probe::JetStreamState;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};

/// A store timeout.
const T: std::time::Duration = std::time::Duration::from_millis(1500);

#[test]
fn a_stream_without_a_leader_is_explained() {
    let not_found = PublishError::new(PublishErrorKind::StreamNotFound);
    let e = store_failure(&not_found, JetStreamState::Answering, T);
    assert_eq!(e.code, msgtrail_core::ErrorCode::Unavailable);
    assert!(e.message.contains("no leader right now"), "{e}");
    assert!(e.message.contains("retry"), "{e}");
    let e = store_failure(
        &PublishError::new(PublishErrorKind::Other),
        JetStreamState::NotAnswering,
        T,
    );
    assert!(!e.message.contains("leader"), "{e}");
    assert!(!e.message.contains("JetStream is not answering"), "{e}");
}

#[test]
fn jetstream_that_does_not_answer_at_all_is_explained() {
    let not_found = PublishError::new(PublishErrorKind::StreamNotFound);
    let e = store_failure(&not_found, JetStreamState::NotAnswering, T);
    assert_eq!(e.code, msgtrail_core::ErrorCode::Unavailable);
    assert!(e.message.contains("JetStream is not answering"), "{e}");
    assert!(e.message.contains("out of space"), "{e}");
    assert!(e.message.contains("restart nats-server"), "{e}");
    assert!(!e.message.contains("no leader"), "{e}");
}

#[test]
fn traceparent_grammar() {
    assert!(valid_traceparent(
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    ));
    assert!(!valid_traceparent(
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331"
    ));
    assert!(!valid_traceparent(
        "00-00000000000000000000000000000000-b7ad6b7169203331-01"
    ));
    assert!(!valid_traceparent(
        "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01"
    ));
    assert!(!valid_traceparent("garbage"));
}

fn channel(service: &str) -> crate::channels::OpenChannel {
    crate::channels::OpenChannel {
        id: "c1".into(),
        role: msgtrail_core::Role::Producer,
        client_id: msgtrail_core::ClientId::new("shop").unwrap(),
        service_name: service.into(),
        topics: vec!["orders.>".into()],
        expires_at_ms: 0,
    }
}

fn upload() -> super::Upload {
    super::Upload {
        request_id: msgtrail_core::RequestId::new("ord-1:x").unwrap(),
        topic: msgtrail_core::Topic::new("orders.eu").unwrap(),
        attempt: 2,
        attrs: [("category".to_owned(), "refund".to_owned())].into(),
        traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
        payload: bytes::Bytes::from_static(b"x"),
    }
}

#[test]
fn a_stored_message_carries_one_msgtrail_stored_header() {
    use msgtrail_core::headers as h;
    let id = msgtrail_core::MessageId::new();
    // With stage recording on (the broker's service given) and off.
    for broker in [Some("broker; a"), None] {
        let hs = super::store::stored_headers(&channel("shop svc"), &upload(), &id, 42, broker);
        // Nats-Msg-Id, Msgtrail-Message-Id, Msgtrail-Stored, one attribute, traceparent.
        assert_eq!(hs.iter().count(), 5);
        let get = |n: &str| hs.get(n).map(|v| v.as_str());
        assert_eq!(get(h::NATS_MSG_ID), Some("shop:ord-1:x"));
        assert_eq!(get(h::MESSAGE_ID), Some(id.to_string().as_str()));
        for old in [
            h::REQUEST_ID,
            h::PRODUCER,
            h::PRODUCER_SERVICE,
            h::TOPIC,
            h::ATTEMPT,
            h::RECEIVED_AT,
            h::BROKER_SERVICE,
        ] {
            assert_eq!(get(old), None, "{old}");
        }
        let f = msgtrail_core::stored::read(get).unwrap();
        assert_eq!(
            (f.request_id, f.producer, f.producer_service.as_deref()),
            (Some("ord-1:x"), Some("shop"), Some("shop svc"))
        );
        match broker {
            Some(b) => {
                let e = f.evidence.unwrap();
                assert_eq!((e.attempt, e.received_at), (Some(2), 42));
                assert_eq!(e.broker_service.as_deref(), Some(b));
            }
            None => assert_eq!(f.evidence, None),
        }
    }
}
