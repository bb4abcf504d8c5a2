//! The JetStream streams and key-value buckets the broker needs, created if missing.

use crate::config::BrokerConfig;
use async_nats::jetstream::{self, kv, stream};
use msgtrail_core::subjects as s;

/// Handles to what [`ensure`] created or found.
#[derive(Debug, Clone)]
pub(crate) struct Storage {
    /// The message stream.
    pub messages: stream::Stream,
    /// The channel bucket.
    pub channels: kv::Store,
    /// The nonce bucket.
    pub nonces: kv::Store,
}

/// The stage stream's configuration; the listener creates it the same way if it starts first.
pub(crate) fn stage_stream_config(replicas: usize, max_age: std::time::Duration) -> stream::Config {
    stream::Config {
        name: s::STAGE_STREAM.to_owned(),
        subjects: vec![s::STAGE_SUBJECT.to_owned()],
        storage: stream::StorageType::File,
        num_replicas: replicas,
        max_age,
        allow_direct: true,
        description: Some("msgtrail stage records (newline-delimited JSON batches)".into()),
        ..Default::default()
    }
}

/// Creates the streams and buckets if they do not exist.
pub(crate) async fn ensure(
    js: &jetstream::Context,
    config: &BrokerConfig,
) -> Result<Storage, async_nats::Error> {
    let messages = js
        .get_or_create_stream(stream::Config {
            name: s::MESSAGE_STREAM.to_owned(),
            subjects: vec![format!("{}.>", s::MESSAGE_SUBJECT_PREFIX)],
            storage: stream::StorageType::File,
            num_replicas: config.replicas,
            duplicate_window: config.dedup_window,
            max_age: config.message_max_age,
            allow_direct: true,
            description: Some("msgtrail messages: msgtrail.msg.<topic>".into()),
            ..Default::default()
        })
        .await?;
    js.get_or_create_stream(stage_stream_config(config.replicas, config.stage_max_age))
        .await?;
    js.get_or_create_stream(stream::Config {
        name: s::DEAD_LETTER_STREAM.to_owned(),
        subjects: vec![format!("{}.>", s::DEAD_LETTER_SUBJECT_PREFIX)],
        storage: stream::StorageType::File,
        num_replicas: config.replicas,
        max_age: config.message_max_age,
        allow_direct: true,
        description: Some("msgtrail dead letters: msgtrail.dlq.<group>.<topic>".into()),
        ..Default::default()
    })
    .await?;
    let channels = bucket(js, s::CHANNEL_BUCKET, config.channel_ttl, config.replicas).await?;
    let nonces = bucket(js, s::NONCE_BUCKET, config.nonce_ttl, config.replicas).await?;
    Ok(Storage {
        messages,
        channels,
        nonces,
    })
}

async fn bucket(
    js: &jetstream::Context,
    name: &str,
    max_age: std::time::Duration,
    replicas: usize,
) -> Result<kv::Store, async_nats::Error> {
    if let Ok(store) = js.get_key_value(name).await {
        return Ok(store);
    }
    Ok(js
        .create_key_value(kv::Config {
            bucket: name.to_owned(),
            history: 1,
            max_age,
            storage: stream::StorageType::File,
            num_replicas: replicas,
            ..Default::default()
        })
        .await?)
}
