//! A pipeline run's clients and streams before the clock starts: empty streams, connected
//! producers, consumers whose group consumer exists.

use super::PipelineParams;
use crate::error::BenchError;
use async_nats::jetstream;
use msgtrail_client::{Consumer, ConsumerOptions, Identity, Producer, ProducerOptions};
use msgtrail_core::subjects::{MESSAGE_STREAM, STAGE_STREAM};
use msgtrail_core::wire::Subscription;
use std::time::Duration;

/// Empties msgtrail's streams: every run starts from empty streams, so runs do not see each
/// other's data.
pub(super) async fn purge_streams(js: &jetstream::Context) -> Result<(), BenchError> {
    for name in [MESSAGE_STREAM, STAGE_STREAM] {
        let mut s = js.get_stream(name).await.map_err(BenchError::nats)?;
        s.purge().await.map_err(BenchError::nats)?;
        let _ = s.info().await;
    }
    Ok(())
}

/// One SDK producer per identity, each on its own connection, with the run's settings.
pub(super) async fn connect_producers(
    p: &PipelineParams,
    ids: Vec<Identity>,
) -> Result<Vec<Producer>, BenchError> {
    let mut producers = Vec::new();
    for ident in ids {
        let nats = async_nats::connect(p.nats_url.as_str())
            .await
            .map_err(BenchError::nats)?;
        let mut options = ProducerOptions::default().report_stages(p.record_stages);
        if let Some(n) = p.batch_messages {
            options = options.max_batch_messages(n);
        }
        producers.push(Producer::connect_with(nats, ident, options).await?);
    }
    Ok(producers)
}

/// One SDK consumer per identity, each on its own connection; each fetches once so that the
/// group's JetStream consumer exists before the clock starts (and the topic is empty).
pub(super) async fn connect_consumers(
    p: &PipelineParams,
    ids: Vec<Identity>,
    sub: &Subscription,
) -> Result<Vec<Consumer>, BenchError> {
    let mut consumers = Vec::new();
    for ident in ids {
        let nats = async_nats::connect(p.nats_url.as_str())
            .await
            .map_err(BenchError::nats)?;
        let c = Consumer::connect_with(nats, ident, consumer_options(p)).await?;
        // Creates the group's JetStream consumer before the clock starts.
        let warm = c.fetch(sub, 1, Duration::ZERO).await?;
        if !warm.is_empty() {
            return Err(BenchError::Config("the bench topic is not empty".into()));
        }
        consumers.push(c);
    }
    Ok(consumers)
}

/// The consumers' settings of a run: the SDK's defaults, or one settle per request.
fn consumer_options(p: &PipelineParams) -> ConsumerOptions {
    let options = ConsumerOptions::default()
        .timeout(Duration::from_secs(10))
        .report_stages(p.record_stages);
    match p.batch_messages {
        Some(n) => options.max_batch_messages(n),
        None => options,
    }
}
