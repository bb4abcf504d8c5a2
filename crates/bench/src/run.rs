//! The order of a run: S1–S3 per payload size against one nats-server (started here, or
//! `nats_url`), then S8 (an application alone and observed) against the same server, again
//! S1–S3 on a `sync_interval: always` server with `durable`, then S4–S6 from the stage
//! records S3 wrote and S7 (search) on a store of S5's size.
//!
//! The saturated S1–S3 runs repeat `reps` times, interleaved: every scenario of every
//! payload size, then all of them again, so that a drift of the machine (another process,
//! the page cache, thermal state) hits every scenario alike. The latency (paced) runs and
//! the stage records kept for S4 come from the first repetition only.

use crate::config::BenchConfig;
use crate::error::BenchError;
use crate::export::ExportResult;
use crate::ingest::IngestResult;
use crate::lookup::LookupResult;
use crate::measure::Progress;
use crate::pipeline::{ListenerTiming, PipelineParams};
use crate::raw::Load;
use crate::report::{Machine, PayloadRun, Repetition, Report};
use crate::search::SearchResult;
use crate::{export, ingest, lookup, observed, pipeline, raw, search};
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
    let estimate = config.estimate();
    if progress {
        eprintln!("{}", estimate_line(&config, estimate));
    }
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
    let s8 = observed::run(
        &client,
        &url,
        &Load::of(&config, config.payload_sizes[0]),
        config.reps,
        &progress,
    )
    .await?;
    let durable = durable_variant(&config, &progress).await?;
    let (s4, s5, s6) = replay_scenarios(&config, recorded, &progress).await?;
    let s7 = search_scenario(&config, &progress).await?;
    let s4p = scale_out_scenario(&config, &url, &progress).await?;

    let mut report = Report {
        machine,
        own_server: config.nats_url.is_none(),
        settings: config,
        runs,
        durable,
        s4,
        s5,
        s6,
        ratios: crate::report::ReportRatios {
            s8_observed_over_raw: s8.ratio(),
            s4p_scaling: s4p.scaling,
        },
        s4p,
        s7,
        s8,
        targets: Vec::new(),
        total_seconds: started.elapsed().as_secs_f64(),
        estimated_seconds: estimate.as_secs_f64(),
    };
    report.check_targets();
    Ok(report)
}

/// The line printed at the start: how long the run should take, and why.
fn estimate_line(config: &BenchConfig, estimate: std::time::Duration) -> String {
    let span = match config.timed() {
        Some(t) => format!("{:?} window after {:?} warm-up", t.window, t.warmup),
        None => format!("{} messages", config.messages),
    };
    format!(
        "msgtrail bench ({}): saturated runs of {span}, {} repetition(s), {} payload size(s){}; expected about {:.0} s ({:.1} min)",
        config.preset,
        config.reps,
        config.payload_sizes.len(),
        if config.durable { ", --durable" } else { "" },
        estimate.as_secs_f64(),
        estimate.as_secs_f64() / 60.0,
    )
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
        config.batch_limits(),
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

/// S4P: the ingest scaling on blocking threads (S4's message count and batch), then the
/// fan-out against the main server (S5's query count).
async fn scale_out_scenario(
    config: &BenchConfig,
    url: &str,
    progress: &Progress,
) -> Result<crate::ScaleOutResult, BenchError> {
    let progress = *progress;
    let (messages, batch, reps) = (config.ingest_messages, config.batch_limits(), config.reps);
    let mut r = tokio::task::spawn_blocking(move || {
        crate::scaleout::ingest_scaling(messages, batch, reps, &progress)
    })
    .await
    .map_err(|e| BenchError::Listener(e.into()))??;
    let fan_messages = config.lookup_messages.min(2_000);
    r.fanout =
        crate::scaleout::fanout(url, fan_messages, config.lookup_queries.min(2_000) as usize)
            .await?;
    Ok(r)
}

/// S7 on a blocking thread: a store of S5's size, filled with the synthetic mix, searched.
async fn search_scenario(
    config: &BenchConfig,
    progress: &Progress,
) -> Result<SearchResult, BenchError> {
    let (progress, n, q) = (*progress, config.lookup_messages, config.search_queries);
    tokio::task::spawn_blocking(move || search::run(n, q, &progress))
        .await
        .map_err(|e| BenchError::Listener(e.into()))?
}

/// The pipeline runs purge msgtrail's streams between runs, and S8 deletes observe mode's
/// event stream: on a server the harness did not start, refuse to run when they hold
/// anything (a deployment's data).
async fn refuse_live_data(client: &async_nats::Client) -> Result<(), BenchError> {
    let js = async_nats::jetstream::new(client.clone());
    for name in [
        MESSAGE_STREAM,
        STAGE_STREAM,
        msgtrail_nats::topology::OBSERVE_STREAM,
    ] {
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

/// S1–S3 for every payload size against `url`, `reps` times interleaved; returns the runs
/// (medians, repetitions, spreads) and the stage-stream messages the first repetition's S3
/// runs wrote (at most `replay_stage_messages` per payload size).
async fn variant(
    config: &BenchConfig,
    url: &str,
    label: &str,
    progress: &Progress,
) -> Result<(Vec<PayloadRun>, Vec<Bytes>), BenchError> {
    let client = async_nats::connect(url).await.map_err(BenchError::nats)?;
    let mut reps: Vec<Vec<Repetition>> = vec![Vec::new(); config.payload_sizes.len()];
    let mut recorded = Vec::new();
    for rep in 0..config.reps {
        for (k, &size) in config.payload_sizes.iter().enumerate() {
            let r = repetition(
                config,
                &client,
                url,
                label,
                size,
                rep,
                &mut recorded,
                progress,
            )
            .await?;
            reps[k].push(r);
        }
    }
    // Leave msgtrail's streams empty, as the next run expects them on a shared server.
    let js = async_nats::jetstream::new(client.clone());
    for name in [MESSAGE_STREAM, STAGE_STREAM] {
        if let Ok(stream) = js.get_stream(name).await {
            let _ = stream.purge().await;
        }
    }
    Ok((
        reps.into_iter().map(PayloadRun::from_reps).collect(),
        recorded,
    ))
}

/// One repetition of every saturated scenario of one payload size (S1, S2, S2 batch 1, S3,
/// S3L, S1F); the first (`rep` 0) with the latency runs, its S3's stage records added to
/// `recorded`.
#[allow(clippy::too_many_arguments)]
async fn repetition(
    config: &BenchConfig,
    client: &async_nats::Client,
    url: &str,
    label: &str,
    size: usize,
    rep: u32,
    recorded: &mut Vec<Bytes>,
    progress: &Progress,
) -> Result<Repetition, BenchError> {
    let first = rep == 0;
    let load = Load::of(config, size);
    let paced = Load {
        // The latency runs are not repeated.
        messages: if first { config.latency_messages } else { 0 },
        ..load.paced(config)
    };
    let rep_label = if config.reps > 1 {
        format!(" rep {}/{}", rep + 1, config.reps)
    } else {
        String::new()
    };
    let s1 = raw::run(
        client,
        &load,
        &paced,
        progress,
        &format!("{label}{size} B{rep_label}"),
    )
    .await?;
    let params = |tag: &str, listener: ListenerTiming, batch: Option<usize>| PipelineParams {
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
        // Each repetition its own topic, group and listener durable.
        tag: if first {
            format!("{tag}_{size}")
        } else {
            format!("{tag}_{size}_r{rep}")
        },
    };
    let s2 = pipeline::run(&params("s2", ListenerTiming::None, None), progress).await?;
    let s2_batch1 = pipeline::run(&params("s2b1", ListenerTiming::None, Some(1)), progress).await?;
    let s3 = pipeline::run(&params("s3", ListenerTiming::After, None), progress).await?;
    if first {
        recorded.extend(pipeline::stage_batches(client, config.replay_stage_messages).await?);
    }
    let s3l = pipeline::run(&params("s3l", ListenerTiming::During, None), progress).await?;
    let s1f = raw::run_fast(
        client,
        &load,
        progress,
        &format!("{label}{size} B{rep_label}"),
    )
    .await?;
    Ok(Repetition {
        s1,
        s2,
        s3,
        s3l,
        s2_batch1,
        s1f,
    })
}
