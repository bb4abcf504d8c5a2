//! The topology's reconciliation against a real nats-server: a stream created by another
//! process with other settings is updated where that is safe and refused (with the command)
//! where it is not, and a create that loses the race to another process's (JetStream error
//! 10058) ends with the winner's stream reconciled.

use async_nats::jetstream::{self, ErrorCode};
use msgtrail_devkit::NatsServer;
use msgtrail_nats::topology::{self, Policy, TopologyError};
use std::time::Duration;

const DAY: Duration = Duration::from_secs(24 * 3600);

async fn js(server: &NatsServer) -> jetstream::Context {
    jetstream::new(async_nats::connect(server.url()).await.unwrap())
}

#[tokio::test]
async fn an_existing_stream_is_brought_to_the_owners_settings_or_refused() {
    let server = NatsServer::start().expect("nats-server starts");
    let js = js(&server).await;
    // As an older listener left it: a shorter age, the default duplicate window.
    js.create_stream(topology::message_stream(1, DAY, Duration::ZERO))
        .await
        .unwrap();

    let wanted = topology::message_stream(1, 2 * DAY, Duration::from_secs(5));
    let mut s = topology::ensure_stream(&js, &wanted, Policy::owner(1))
        .await
        .expect("a longer age and another window are safe");
    let config = s.info().await.unwrap().config.clone();
    assert_eq!(config.max_age, 2 * DAY);
    assert_eq!(config.duplicate_window, Duration::from_secs(5));

    // A reader keeps the owner's limits.
    let reader = topology::message_stream(1, DAY, Duration::from_secs(120));
    let mut s = topology::ensure_stream(&js, &reader, Policy::reader(None))
        .await
        .unwrap();
    assert_eq!(s.info().await.unwrap().config.max_age, 2 * DAY);

    // A shorter age would delete messages: refused, with the command, and nothing changed.
    let shorter = topology::message_stream(1, DAY, Duration::from_secs(5));
    let err = topology::ensure_stream(&js, &shorter, Policy::owner(1))
        .await
        .unwrap_err();
    assert!(matches!(err, TopologyError::Refused { .. }), "{err:?}");
    assert!(!err.is_transient());
    assert!(
        err.to_string()
            .contains("`nats stream edit MSGTRAIL_MESSAGES --max-age=86400s --force`"),
        "{err}"
    );
    let mut s = js.get_stream("MSGTRAIL_MESSAGES").await.unwrap();
    assert_eq!(s.info().await.unwrap().config.max_age, 2 * DAY);
}

#[tokio::test]
async fn a_create_that_loses_the_race_reads_the_winners_stream() {
    let server = NatsServer::start().expect("nats-server starts");
    let js = js(&server).await;
    js.create_stream(topology::stage_stream(1, DAY))
        .await
        .unwrap();
    // What the loser of the race gets from JetStream: 10058, a typed code.
    let err = js
        .create_stream(topology::stage_stream(1, 2 * DAY))
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), jetstream::context::CreateStreamErrorKind::JetStream(e) if e.error_code() == ErrorCode::STREAM_NAME_EXIST),
        "{err:?}"
    );
    // Many processes at once: every one comes up with the one stream.
    let desired = topology::stage_stream(1, 2 * DAY);
    let tries = (0..8).map(|i| {
        let js = js.clone();
        let desired = desired.clone();
        async move {
            let name = format!("RACE_{}", i % 2);
            let config = async_nats::jetstream::stream::Config {
                name,
                subjects: vec![format!("race.{}", i % 2)],
                max_age: DAY * (1 + i % 3),
                ..desired
            };
            topology::ensure_stream(&js, &config, Policy::reader(None)).await
        }
    });
    for r in futures::future::join_all(tries).await {
        r.expect("every racer comes up");
    }

    let buckets = (0..4).map(|_| {
        let js = js.clone();
        async move {
            let b = topology::bucket("racing", 1, Duration::from_secs(60));
            topology::ensure_bucket(&js, &b, Policy::owner_of_ephemeral(1)).await
        }
    });
    for r in futures::future::join_all(buckets).await {
        r.expect("every racer opens the bucket");
    }
}
