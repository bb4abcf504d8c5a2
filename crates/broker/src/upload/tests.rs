use super::{store_failure, valid_traceparent};
use async_nats::jetstream::context::{PublishError, PublishErrorKind};

#[test]
fn a_stream_without_a_leader_is_explained() {
    let e = store_failure(&PublishError::new(PublishErrorKind::StreamNotFound));
    assert_eq!(e.code, msgtrail_core::ErrorCode::Unavailable);
    assert!(e.message.contains("no leader right now"), "{e}");
    assert!(e.message.contains("retry"), "{e}");
    let e = store_failure(&PublishError::new(PublishErrorKind::TimedOut));
    assert!(!e.message.contains("leader"), "{e}");
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
