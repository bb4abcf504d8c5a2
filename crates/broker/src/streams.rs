//! The JetStream streams and key-value buckets the broker needs, created if missing and
//! brought to the broker's settings if they differ (their definitions and the rules:
//! [`msgtrail_nats::topology`]).

use crate::config::BrokerConfig;
use async_nats::jetstream::{self, kv, stream};
use msgtrail_core::subjects as s;
use msgtrail_nats::topology::{self, Policy, TopologyError};

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

/// Creates the streams and buckets if they do not exist, and brings existing ones to the
/// broker's replicas, maximum ages and duplicate window.
pub(crate) async fn ensure(
    js: &jetstream::Context,
    config: &BrokerConfig,
) -> Result<Storage, TopologyError> {
    let owner = Policy::owner(config.replicas);
    let messages =
        topology::message_stream(config.replicas, config.message_max_age, config.dedup_window);
    let messages = topology::ensure_stream(js, &messages, owner).await?;
    let stages = topology::stage_stream(config.replicas, config.stage_max_age);
    topology::ensure_stream(js, &stages, owner).await?;
    let dead_letters = topology::dead_letter_stream(config.replicas, config.message_max_age);
    topology::ensure_stream(js, &dead_letters, owner).await?;
    let ephemeral = Policy::owner_of_ephemeral(config.replicas);
    let channels = topology::bucket(s::CHANNEL_BUCKET, config.replicas, config.channel_ttl);
    let channels = topology::ensure_bucket(js, &channels, ephemeral).await?;
    let nonces = topology::bucket(s::NONCE_BUCKET, config.replicas, config.nonce_ttl);
    let nonces = topology::ensure_bucket(js, &nonces, ephemeral).await?;
    Ok(Storage {
        messages,
        channels,
        nonces,
    })
}
