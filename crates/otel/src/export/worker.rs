//! The worker behind the queue: batching spans, building requests, keeping several in flight
//! and retrying each with backoff until it is delivered, refused or given up.

use super::*;

/// What the worker and its requests share.
pub(super) struct Shared {
    pub(super) config: ExportConfig,
    pub(super) stats: Arc<ExportStats>,
    pub(super) transport: Transport,
    /// Told of the hops of every request the receiver accepted whole
    /// ([`ExportHandle::on_exported`]).
    pub(super) exported: ExportedHookCell,
}

impl Shared {
    /// Moves `n` spans from in flight to `counter`.
    pub(super) fn settle(&self, counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
        self.stats.in_flight.fetch_sub(n, Ordering::Relaxed);
    }
}

/// The worker: takes batches off the queue and starts a request task for each, at most
/// [`ExportConfig::max_in_flight`] at once.
pub(super) async fn run(
    mut rx: mpsc::Receiver<ServiceSpan>,
    shared: Arc<Shared>,
    closing: CancellationToken,
) {
    let config = &shared.config;
    let permits = Arc::new(Semaphore::new(config.max_in_flight.max(1)));
    let mut resources = Resources::new(config.max_services);
    let mut tasks = JoinSet::new();
    let mut batch: Vec<ServiceSpan> = Vec::with_capacity(config.batch_limit());
    while next_batch(&mut rx, &mut batch, config, &closing).await {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        let groups = resources.group(batch.drain(..));
        tasks.spawn(deliver(groups, shared.clone(), closing.clone(), permit));
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

/// Fills `batch` (up to [`ExportConfig::max_batch`]): waits for a first span, then for more
/// within [`ExportConfig::batch_delay`]; once closing, takes only what is queued. `false`
/// when there is nothing more to send.
pub(super) async fn next_batch(
    rx: &mut mpsc::Receiver<ServiceSpan>,
    batch: &mut Vec<ServiceSpan>,
    config: &ExportConfig,
    closing: &CancellationToken,
) -> bool {
    let max = config.batch_limit();
    loop {
        if closing.is_cancelled() {
            while batch.len() < max {
                match rx.try_recv() {
                    Ok(s) => batch.push(s),
                    Err(_) => break,
                }
            }
            return !batch.is_empty();
        }
        tokio::select! {
            n = rx.recv_many(batch, max) => {
                if n == 0 {
                    return false;
                }
                break;
            }
            _ = closing.cancelled() => {}
        }
    }
    // Fill the batch for a moment, so that spans go out in few requests.
    let deadline = tokio::time::Instant::now() + config.batch_delay;
    while batch.len() < max {
        let room = max - batch.len();
        match tokio::time::timeout_at(deadline, rx.recv_many(batch, room)).await {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
    true
}

/// One batch: encodes it (here, on a runtime thread, not in the worker) and sends each body.
pub(super) async fn deliver(
    groups: Vec<Group>,
    shared: Arc<Shared>,
    closing: CancellationToken,
    _permit: OwnedSemaphorePermit,
) {
    let config = &shared.config;
    let n: u64 = groups.iter().map(|g| g.spans.len() as u64).sum();
    let gzip = config.compression == Some(Compression::Gzip) && config.protocol != Protocol::Grpc;
    // The hops of the spans, for the hook, before encoding consumes them.
    let hook = shared.exported.get().cloned();
    let hops: Vec<ExportedHop> = match &hook {
        Some(_) => groups
            .iter()
            .flat_map(|g| g.spans.iter())
            .filter_map(ExportedHop::of)
            .collect(),
        None => Vec::new(),
    };
    let bodies =
        match crate::otlp::encode(groups, config.encoding(), gzip, config.max_request_bytes) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(spans = n, error = %e, "cannot encode an OTLP request");
                shared.settle(&shared.stats.rejected, n);
                return;
            }
        };
    let mut whole = true;
    for body in bodies {
        whole &= send_with_retries(body, &shared, &closing).await;
    }
    if let (Some(hook), true) = (hook, whole) {
        if !hops.is_empty() {
            hook(hops);
        }
    }
}

/// The longest wait a throttling receiver gets (its `Retry-After` or `RetryInfo`).
pub(super) const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// Sends one body, retrying with backoff until it goes through, fails for good, runs out of
/// attempts, or shutdown starts (then one last attempt). Returns whether the receiver
/// accepted every span of it.
pub(super) async fn send_with_retries(
    body: Body,
    shared: &Shared,
    closing: &CancellationToken,
) -> bool {
    let (config, stats) = (&shared.config, &shared.stats);
    let n = body.spans;
    let mut backoff = Backoff::new(config.initial_backoff, config.max_backoff);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let last_try = closing.is_cancelled();
        let e = match shared.transport.send(body.bytes.clone()).await {
            Ok(rejected) => {
                let rejected = rejected.min(n);
                if rejected > 0 {
                    tracing::warn!(spans = n, rejected, "the OTLP receiver rejected spans");
                }
                shared.settle(&stats.exported, n - rejected);
                shared.settle(&stats.rejected, rejected);
                return rejected == 0;
            }
            Err(e) => e,
        };
        stats.export_failures.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(spans = n, error = %e, "OTLP export failed");
        if !e.retryable {
            tracing::warn!(spans = n, error = %e, "the OTLP receiver refused a request");
            shared.settle(&stats.rejected, n);
            return false;
        }
        if last_try {
            shared.settle(&stats.dropped_shutdown, n);
            return false;
        }
        if attempts >= config.max_attempts.max(1) {
            tracing::warn!(spans = n, attempts, error = %e, "OTLP export given up");
            shared.settle(&stats.dropped_retries, n);
            return false;
        }
        // A receiver that throttles says how long to wait: the OTLP specification asks the
        // client to honour it (capped, so that a bad value does not stall the queue).
        let pause = match e.retry_after {
            Some(wait) => {
                tracing::debug!(
                    spans = n,
                    wait_ms = wait.as_millis() as u64,
                    "the OTLP receiver throttles"
                );
                wait.min(MAX_RETRY_AFTER)
            }
            None => backoff.next_pause(),
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = closing.cancelled() => {}
        }
    }
}
