//! Fast-ingest batches against a real nats-server (≥ 2.14): one PubAck per batch, every
//! stored message at the sequence the batch proves, and what was not stored (a duplicate,
//! another publisher's message in between) outside the returned prefix.

use async_nats::jetstream::{self, stream};
use async_nats::HeaderMap;
use bytes::Bytes;
use msgtrail_devkit::NatsServer;
use msgtrail_nats::fast_ingest::{enable_on_stream, FastIngest, FastIngestError, FastMessage};
use std::time::Duration;

fn message(id: &str) -> FastMessage {
    let mut headers = HeaderMap::new();
    headers.insert("Nats-Msg-Id", id);
    FastMessage {
        subject: "fi.a".into(),
        headers,
        payload: Bytes::from(id.to_owned()),
    }
}

async fn setup(allow: bool) -> (NatsServer, async_nats::Client, jetstream::stream::Stream) {
    let server = NatsServer::start().expect("nats-server (scripts/install-nats-server.sh)");
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = jetstream::new(client.clone());
    let s = js
        .create_stream(stream::Config {
            name: "FI".into(),
            subjects: vec!["fi.>".into()],
            allow_direct: true,
            ..Default::default()
        })
        .await
        .unwrap();
    if allow {
        assert!(
            enable_on_stream(&client, "FI").await.unwrap(),
            "server ≥ 2.14"
        );
    }
    (server, client, s)
}

async fn payload_at(s: &jetstream::stream::Stream, seq: u64) -> String {
    let m = s.direct_get(seq).await.unwrap();
    String::from_utf8(m.payload.to_vec()).unwrap()
}

#[tokio::test]
async fn a_batch_is_stored_whole_at_proven_sequences_with_one_pub_ack() {
    let (_server, client, s) = setup(true).await;
    let fi = FastIngest::new(client.clone(), "FI", Duration::from_secs(5))
        .await
        .unwrap();
    let before = client
        .statistics()
        .in_messages
        .load(std::sync::atomic::Ordering::Relaxed);
    let stored = fi
        .publish((1..=50).map(|i| message(&format!("m{i}"))).collect())
        .await
        .unwrap();
    assert_eq!((stored.count, stored.first_seq), (50, 1));
    let replies = client
        .statistics()
        .in_messages
        .load(std::sync::atomic::Ordering::Relaxed)
        - before;
    // One flow-control ack after the first message and the final PubAck (and one stream
    // info answer to learn the stream's last sequence).
    assert!(replies <= 3, "{replies} replies for 50 messages");
    for i in [1u64, 17, 50] {
        assert_eq!(payload_at(&s, i).await, format!("m{i}"));
    }
    // The next batch starts where this one ended, without asking.
    let stored = fi
        .publish((51..=60).map(|i| message(&format!("m{i}"))).collect())
        .await
        .unwrap();
    assert_eq!((stored.count, stored.first_seq), (10, 51));
    assert_eq!(payload_at(&s, 60).await, "m60");
}

#[tokio::test]
async fn a_duplicate_ends_the_stored_prefix() {
    let (_server, client, s) = setup(true).await;
    let fi = FastIngest::new(client, "FI", Duration::from_secs(5))
        .await
        .unwrap();
    fi.publish(vec![message("a"), message("b")]).await.unwrap();
    // "a" again in the middle: JetStream drops it silently; the batch says only c, d stored.
    let stored = fi
        .publish(vec![message("c"), message("d"), message("a"), message("e")])
        .await
        .unwrap();
    assert_eq!((stored.count, stored.first_seq), (2, 3));
    assert_eq!(payload_at(&s, 4).await, "d");
    assert_eq!(s.clone().info().await.unwrap().state.last_sequence, 4);
    // A duplicate last: the prefix before it.
    let stored = fi.publish(vec![message("f"), message("b")]).await.unwrap();
    assert_eq!((stored.count, stored.first_seq), (1, 5));
    assert_eq!(s.clone().info().await.unwrap().state.last_sequence, 5);
}

#[tokio::test]
async fn another_publishers_message_in_between_is_never_taken_for_ours() {
    let (_server, client, s) = setup(true).await;
    let js = jetstream::new(client.clone());
    let fi = FastIngest::new(client, "FI", Duration::from_secs(5))
        .await
        .unwrap();
    fi.publish(vec![message("a"), message("b")]).await.unwrap();
    js.publish("fi.other", "foreign".into())
        .await
        .unwrap()
        .await
        .unwrap();
    // The publisher still believes the stream ends at 2: the first message is refused, and
    // nothing of this batch is stored.
    let stored = fi.publish(vec![message("c"), message("d")]).await.unwrap();
    assert_eq!(stored.count, 0);
    assert_eq!(s.clone().info().await.unwrap().state.last_sequence, 3);
    // The next batch reads the stream's last sequence again.
    let stored = fi.publish(vec![message("e"), message("f")]).await.unwrap();
    assert_eq!((stored.count, stored.first_seq), (2, 4));
    assert_eq!(payload_at(&s, 5).await, "f");
    // A publish of this process outside a batch, with the batches paused until its PubAck
    // is in: the next batch reads the last sequence first and stores everything.
    let paused = fi.pause().await;
    js.publish("fi.other", "own".into())
        .await
        .unwrap()
        .await
        .unwrap();
    drop(paused);
    let stored = fi.publish(vec![message("g"), message("h")]).await.unwrap();
    assert_eq!((stored.count, stored.first_seq), (2, 7));
}

#[tokio::test]
async fn a_stream_without_allow_batched_says_so() {
    let (_server, client, _s) = setup(false).await;
    let fi = FastIngest::new(client, "FI", Duration::from_secs(5))
        .await
        .unwrap();
    let err = fi
        .publish(vec![message("a"), message("b")])
        .await
        .unwrap_err();
    assert!(matches!(err, FastIngestError::Disabled(_)), "{err}");
    assert!(fi.is_disabled());
    let err = fi
        .publish(vec![message("c"), message("d")])
        .await
        .unwrap_err();
    assert!(matches!(err, FastIngestError::Disabled(_)), "{err}");
}
