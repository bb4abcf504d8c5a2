//! The order of a run: S1–S3 per payload size against one nats-server (started here, or
//! `nats_url`), again on a `sync_interval: always` server with `durable`, then S4–S6 from the
//! stage records S3 wrote.

use crate::config::BenchConfig;
use crate::error::BenchError;
use crate::export::ExportResult;
use crate::ingest::IngestResult;
use crate::lookup::LookupResult;
use crate::measure::Progress;
use crate::pipeline::{ListenerTiming, PipelineParams};
use crate::raw::Load;
use crate::report::{Machine, PayloadRun, Report};
use crate::{export, ingest, lookup, pipeline, raw};
use bytes::Bytes;
use msgtrail_core::subjects::{MESSAGE_STREAM, STAGE_STREAM};
use msgtrail_devkit::{NatsServer, NatsServerOptions};
use std::time::Instant;

/// The JetStream block of the durable variant: every write fsynced before it is acked.
pub(crate) fn durable_jetstream_config(store_dir: &std::path::Path) -> String {
    format!(
        "jetstream {{ store_dir: {:?}, sync_interval: always }}",
        store_dir.display().to_string()
    )
}

/// Runs every scenario and returns the report; progress goes to stderr when `progress`.
pub async fn run(config: BenchConfig, progress: bool) -> Result<Report, BenchError> {
    config.validate()?;
    let progress = Progress::new(progress);
    let started = Instant::now();
    let (_server, url) = main_server(&config)?;
    let client = async_nats::connect(url.as_str())
        .await
        .map_err(BenchError::nats)?;
    if config.nats_url.is_some() {
        refuse_live_data(&client).await?;
    }
    let machine = Machine::detect(&client);
    let (runs, recorded) = variant(&config, &url, "", &progress).await?;
    let durable = durable_variant(&config, &progress).await?;
    let (s4, s5, s6) = replay_scenarios(&config, recorded, &progress).await?;

    let mut report = Report {
        machine,
        own_server: config.nats_url.is_none(),
        settings: config,
        runs,
        durable,
        s4,
        s5,
        s6,
        targets: Vec::new(),
        total_seconds: started.elapsed().as_secs_f64(),
    };
    report.check_targets();
    Ok(report)
}

/// The server S1–S3 run against: `nats_url`, or one started here (kept alive by the
/// returned handle); and its URL.
fn main_server(config: &BenchConfig) -> Result<(Option<NatsServer>, String), BenchError> {
    Ok(match &config.nats_url {
        Some(u) => (None, u.clone()),
        None => {
            let s = NatsServer::start()?;
            let url = s.url().to_owned();
            (Some(s), url)
        }
    })
}

/// S1–S3 again on a `sync_interval: always` server the harness starts, when `durable` is
/// asked for (skipped, with a warning, against `nats_url`).
async fn durable_variant(
    config: &BenchConfig,
    progress: &Progress,
) -> Result<Option<Vec<PayloadRun>>, BenchError> {
    if config.durable && config.nats_url.is_none() {
        let dir = tempfile::Builder::new()
            .prefix("msgtrail-bench-durable-")
            .tempdir()?;
        let server = NatsServer::start_with(NatsServerOptions {
            jetstream: false,
            extra_config: durable_jetstream_config(&dir.path().join("jetstream")),
            ..Default::default()
        })?;
        let (runs, _) = variant(config, server.url(), "durable ", progress).await?;
        drop(server);
        Ok(Some(runs))
    } else {
        if config.durable {
            tracing::warn!(
                "--durable needs a nats-server the harness starts; skipped with --nats-url"
            );
        }
        Ok(None)
    }
}

/// S4–S6 from the stage-stream messages S3 `recorded`: ingest them, look trajectories up,
/// export spans.
async fn replay_scenarios(
    config: &BenchConfig,
    recorded: Vec<Bytes>,
    progress: &Progress,
) -> Result<(IngestResult, LookupResult, ExportResult), BenchError> {
    let progress = *progress;
    let decoded = ingest::decode_all(&recorded);
    let template = lookup::template(&decoded)
        .ok_or_else(|| BenchError::Config("S3 recorded no trajectory to replay".into()))?;
    let (messages, copies, batch) = (
        config.ingest_messages,
        config.ingest_copies,
        config.ingest_batch,
    );
    let s4 = tokio::task::spawn_blocking(move || {
        ingest::run(&recorded, messages, copies, batch, &progress)
    })
    .await
    .map_err(|e| BenchError::Listener(e.into()))??;
    let (tpl, n, q) = (
        template.clone(),
        config.lookup_messages,
        config.lookup_queries,
    );
    let s5 = tokio::task::spawn_blocking(move || lookup::run(&tpl, n, q, &progress))
        .await
        .map_err(|e| BenchError::Listener(e.into()))??;
    let s6 = export::run(
        &template,
        config.export_spans,
        config.scenario_timeout,
        &progress,
    )
    .await?;
    Ok((s4, s5, s6))
}

/// The pipeline runs purge msgtrail's streams between runs: on a server the harness did not
/// start, refuse to run when they hold anything (a deployment's data).
async fn refuse_live_data(client: &async_nats::Client) -> Result<(), BenchError> {
    let js = async_nats::jetstream::new(client.clone());
    for name in [MESSAGE_STREAM, STAGE_STREAM] {
        if let Ok(mut stream) = js.get_stream(name).await {
            let n = stream
                .info()
                .await
                .map_err(BenchError::nats)?
                .state
                .messages;
            if n > 0 {
                return Err(BenchError::Config(format!(
                    "stream {name} on that server holds {n} messages; the bench purges it \
                     between runs, so point --nats-url at a scratch server (or purge it first)"
                )));
            }
        }
    }
    Ok(())
}

/// S1–S3 for every payload size against `url`; returns the runs and the stage-stream
/// messages every S3 run wrote.
async fn variant(
    config: &BenchConfig,
    url: &str,
    label: &str,
    progress: &Progress,
) -> Result<(Vec<PayloadRun>, Vec<Bytes>), BenchError> {
    let client = async_nats::connect(url).await.map_err(BenchError::nats)?;
    let mut runs = Vec::new();
    let mut recorded = Vec::new();
    for &size in &config.payload_sizes {
        let load = Load::of(config, size);
        let paced = load.paced(config);
        let s1 = raw::run(
            &client,
            &load,
            &paced,
            progress,
            &format!("{label}{size} B"),
        )
        .await?;
        let params = |tag: &str, listener: ListenerTiming, batch: Option<usize>| {
            PipelineParams {
                nats_url: url.to_owned(),
                load: load.clone(),
                // The latency runs compare S1, S2 and S3; the other variants only report
                // throughput.
                paced: if tag == "s2" || tag == "s3" {
                    paced.clone()
                } else {
                    Load {
                        messages: 0,
                        ..paced.clone()
                    }
                },
                record_stages: listener != ListenerTiming::None,
                listener,
                batch_messages: batch,
                fast_ingest: true,
                tag: format!("{tag}_{size}"),
            }
        };
        let s2 = pipeline::run(&params("s2", ListenerTiming::None, None), progress).await?;
        let s2_batch1 =
            pipeline::run(&params("s2b1", ListenerTiming::None, Some(1)), progress).await?;
        let s3 = pipeline::run(&params("s3", ListenerTiming::After, None), progress).await?;
        recorded.extend(pipeline::stage_batches(&client).await?);
        let s3l = pipeline::run(&params("s3l", ListenerTiming::During, None), progress).await?;
        let s1f = raw::run_fast(&client, &load, progress, &format!("{label}{size} B")).await?;
        runs.push(PayloadRun::new(s1, s2, s3, s3l, s2_batch1, s1f));
    }
    // Leave msgtrail's streams empty, as the next run expects them on a shared server.
    let js = async_nats::jetstream::new(client.clone());
    for name in [MESSAGE_STREAM, STAGE_STREAM] {
        if let Ok(stream) = js.get_stream(name).await {
            let _ = stream.purge().await;
        }
    }
    Ok((runs, recorded))
}
