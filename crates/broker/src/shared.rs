//! What every request handler of one broker shares.

use crate::channels::Channels;
use crate::config::BrokerConfig;
use crate::metrics::Metrics;
use crate::signing::SigningKey;
use crate::stage_sink::StageSink;
use async_nats::jetstream;
use std::sync::Arc;

/// The broker's shared parts, built once at startup.
#[derive(Debug, Clone)]
pub(crate) struct Shared {
    /// JetStream.
    pub js: jetstream::Context,
    /// The message stream (direct gets, consumers).
    pub stream: jetstream::stream::Stream,
    /// Fast-ingest batches into the message stream, when the server has them and
    /// [`BrokerConfig::fast_ingest`] is on.
    pub fast: Option<Arc<msgtrail_nats::fast_ingest::FastIngest>>,
    /// Core NATS client (settles, pushes, internal notices).
    pub client: async_nats::Client,
    /// Channels.
    pub channels: Channels,
    /// The stage sink.
    pub sink: StageSink,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Configuration.
    pub config: Arc<BrokerConfig>,
    /// Signs ack tokens and upload receipts.
    pub key: SigningKey,
    /// Tells a stream without a leader from JetStream not answering at all.
    pub js_probe: Arc<crate::js_probe::JetStreamProbe>,
}
