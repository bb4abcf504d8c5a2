//! The adaptive batcher behind [`crate::Producer`]'s sends and [`crate::Consumer`]'s settles.
//!
//! Callers hand single items (an upload attempt, a settle) to a task through a bounded queue,
//! each with a one-shot slot for its own result. The task sends a batch request as soon as
//! fewer than `max_inflight` batch requests are in flight, taking everything queued at that
//! moment, bounded by `max_messages` and `max_bytes`. So an idle client sends its first item
//! at once, alone (no added latency), and under load items pile up while requests are in
//! flight and leave together in the next batch. A `linger` above zero makes the task wait
//! that long after the oldest queued item for more, unless the batch is already full.
//!
//! The policy is the pure function [`decide`]; [`run`] is the task around it; a [`Flight`]
//! sends one batch and answers every item of it.

use crate::error::ClientError;
use futures::future::BoxFuture;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// The bounds of a batcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Most items in one batch (at least 1).
    pub(crate) max_messages: usize,
    /// Most encoded bytes of the items of one batch; a single larger item still goes, alone.
    pub(crate) max_bytes: usize,
    /// Most batch requests in flight at once (at least 1).
    pub(crate) max_inflight: usize,
    /// How long to wait for more after the oldest queued item; zero sends at once.
    pub(crate) linger: Duration,
}

impl Limits {
    /// The limits with `max_messages` in `1..=max_entries` and `max_inflight` at least 1.
    pub(crate) fn clamped(mut self, max_entries: usize) -> Self {
        self.max_messages = self.max_messages.clamp(1, max_entries.max(1));
        self.max_inflight = self.max_inflight.max(1);
        self
    }
}

/// How many of the queued items (their sizes, oldest first) the next batch takes, and their
/// total size: the oldest always, then as many as fit within `max_messages` and `max_bytes`.
pub(crate) fn batch_len(
    sizes: impl IntoIterator<Item = usize>,
    max_messages: usize,
    max_bytes: usize,
) -> (usize, usize) {
    let (mut n, mut bytes) = (0usize, 0usize);
    for s in sizes {
        if n > 0 && (n >= max_messages || bytes.saturating_add(s) > max_bytes) {
            break;
        }
        n += 1;
        bytes = bytes.saturating_add(s);
    }
    (n, bytes)
}

/// What the batcher does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BatchStep {
    /// Send a batch of the oldest `n` queued items now.
    Send(usize),
    /// Nothing to send before this instant (lingering), unless something else happens.
    WaitUntil(Instant),
    /// Nothing to send until an item arrives or a request completes.
    Wait,
}

/// The batching policy. `sizes` are the queued items' sizes, oldest first; `oldest` is when
/// the oldest was queued; `closing` means no more items will come (send without lingering).
pub(crate) fn decide(
    limits: &Limits,
    sizes: impl IntoIterator<Item = usize>,
    queued: usize,
    oldest: Option<Instant>,
    inflight: usize,
    closing: bool,
    now: Instant,
) -> BatchStep {
    if queued == 0 || inflight >= limits.max_inflight {
        return BatchStep::Wait;
    }
    let (n, _) = batch_len(sizes, limits.max_messages, limits.max_bytes);
    // Full: the count is reached, or the next queued item does not fit in the bytes.
    let full = n >= limits.max_messages || n < queued;
    if limits.linger.is_zero() || full || closing {
        return BatchStep::Send(n);
    }
    let deadline = oldest.unwrap_or(now) + limits.linger;
    if now >= deadline {
        BatchStep::Send(n)
    } else {
        BatchStep::WaitUntil(deadline)
    }
}

/// One item waiting for its batch, and where its result goes.
#[derive(Debug)]
pub(crate) struct Job<I, O> {
    /// The item.
    pub(crate) item: I,
    /// Its encoded size, for the byte bound.
    pub(crate) size: usize,
    /// When it was queued (for the linger).
    pub(crate) queued_at: Instant,
    /// Its result.
    pub(crate) reply: oneshot::Sender<O>,
}

impl<I, O> Job<I, O> {
    /// A job for `item` of `size` bytes, and the receiver of its result.
    pub(crate) fn new(item: I, size: usize) -> (Self, oneshot::Receiver<O>) {
        let (tx, rx) = oneshot::channel();
        let job = Job {
            item,
            size,
            queued_at: Instant::now(),
            reply: tx,
        };
        (job, rx)
    }
}

/// Sends one batch and answers every job in it (in any order, each exactly once).
pub(crate) trait Flight: Send + Sync + 'static {
    /// What a job carries.
    type Item: Send + 'static;
    /// What a job gets back.
    type Output: Send + 'static;
    /// Sends `batch`; `spare_bytes` is what the byte bound leaves for records riding along.
    fn send(
        self: Arc<Self>,
        batch: Vec<Job<Self::Item, Self::Output>>,
        spare_bytes: usize,
    ) -> BoxFuture<'static, ()>;
}

/// The queue into a batcher: each submission is one or more jobs queued together.
pub(crate) type Queue<F> = mpsc::Sender<Vec<Job<<F as Flight>::Item, <F as Flight>::Output>>>;

/// Starts a batcher for `flight`; it ends when every sender of the returned queue is gone,
/// after sending what was queued and waiting for the requests in flight.
pub(crate) fn spawn<F: Flight>(flight: Arc<F>, limits: Limits) -> Queue<F> {
    let capacity = (limits.max_messages * limits.max_inflight * 2).max(1024);
    let (tx, rx) = mpsc::channel(capacity);
    tokio::spawn(run(flight, rx, limits));
    tx
}

/// The error a caller sees when the batcher is gone (the runtime is shutting down).
pub(crate) fn stopped() -> ClientError {
    ClientError::nats(crate::error::BatcherStopped)
}

/// Queues one submission and waits for each job's result.
pub(crate) async fn submit<I, O>(
    queue: &mpsc::Sender<Vec<Job<I, O>>>,
    jobs: Vec<Job<I, O>>,
) -> Result<(), ClientError> {
    queue.send(jobs).await.map_err(|_| stopped())
}

/// The batcher task.
pub(crate) async fn run<F: Flight>(
    flight: Arc<F>,
    mut rx: mpsc::Receiver<Vec<Job<F::Item, F::Output>>>,
    limits: Limits,
) {
    let mut queue: VecDeque<Job<F::Item, F::Output>> = VecDeque::new();
    let mut inflight: JoinSet<()> = JoinSet::new();
    let mut open = true;
    loop {
        // Take what is already waiting, up to a batch's worth; the rest waits in the bounded
        // queue, so that callers feel backpressure.
        while open && queue.len() < limits.max_messages {
            match rx.try_recv() {
                Ok(jobs) => queue.extend(jobs),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => open = false,
            }
        }
        if !open && queue.is_empty() && inflight.is_empty() {
            break;
        }
        let decision = decide(
            &limits,
            queue.iter().map(|j| j.size),
            queue.len(),
            queue.front().map(|j| j.queued_at),
            inflight.len(),
            !open,
            Instant::now(),
        );
        let deadline = match decision {
            BatchStep::Send(n) => {
                let batch: Vec<_> = queue.drain(..n).collect();
                let bytes: usize = batch.iter().map(|j| j.size).sum();
                let spare = limits.max_bytes.saturating_sub(bytes);
                inflight.spawn(flight.clone().send(batch, spare));
                continue;
            }
            BatchStep::WaitUntil(d) => Some(d),
            BatchStep::Wait => None,
        };
        let can_take = open && queue.len() < limits.max_messages;
        tokio::select! {
            jobs = rx.recv(), if can_take => match jobs {
                Some(jobs) => queue.extend(jobs),
                None => open = false,
            },
            Some(done) = inflight.join_next(), if !inflight.is_empty() => {
                if let Err(e) = done {
                    // The jobs of that batch see their result slot dropped.
                    tracing::error!(error = %e, "a batch request task failed");
                }
            },
            _ = sleep_until(deadline), if deadline.is_some() => {},
            // Not reached: with nothing in flight, `decide` sends whatever is queued. Were
            // it reached, the queued jobs would see their result slots dropped.
            else => break,
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn limits(
        max_messages: usize,
        max_bytes: usize,
        max_inflight: usize,
        linger_ms: u64,
    ) -> Limits {
        Limits {
            max_messages,
            max_bytes,
            max_inflight,
            linger: Duration::from_millis(linger_ms),
        }
    }

    #[test]
    fn a_batch_takes_what_fits_and_always_the_oldest() {
        assert_eq!(batch_len([10, 10, 10], 256, 1000), (3, 30));
        assert_eq!(batch_len([10, 10, 10], 2, 1000), (2, 20));
        assert_eq!(batch_len([400, 400, 400], 256, 1000), (2, 800));
        // Bounded by bytes in order: a small item behind a big one waits its turn.
        assert_eq!(batch_len([400, 700, 10], 256, 1000), (1, 400));
        // An item over the byte bound still goes, alone.
        assert_eq!(batch_len([5000, 10], 256, 1000), (1, 5000));
        assert_eq!(batch_len([], 256, 1000), (0, 0));
        // One message per request.
        assert_eq!(batch_len([1, 1, 1], 1, 1000), (1, 1));
    }

    #[test]
    fn idle_sends_at_once_and_busy_queues() {
        let now = Instant::now();
        let l = limits(256, 1 << 20, 4, 0);
        // Idle: the first message goes at once, alone.
        assert_eq!(
            decide(&l, [10], 1, Some(now), 0, false, now),
            BatchStep::Send(1)
        );
        // Requests in flight below the limit: everything queued goes.
        assert_eq!(
            decide(&l, [10; 7], 7, Some(now), 3, false, now),
            BatchStep::Send(7)
        );
        // At the limit: wait for a request to complete.
        assert_eq!(
            decide(&l, [10; 7], 7, Some(now), 4, false, now),
            BatchStep::Wait
        );
        assert_eq!(decide(&l, [], 0, None, 0, false, now), BatchStep::Wait);
        // More queued than a batch holds: a full batch.
        assert_eq!(
            decide(&l, [10; 300], 300, Some(now), 0, false, now),
            BatchStep::Send(256)
        );
    }

    #[test]
    fn linger_waits_for_more_unless_full_or_closing() {
        let now = Instant::now();
        let l = limits(4, 100, 4, 5);
        let later = now + Duration::from_millis(5);
        assert_eq!(
            decide(&l, [10], 1, Some(now), 0, false, now),
            BatchStep::WaitUntil(later)
        );
        assert_eq!(
            decide(&l, [10], 1, Some(now), 0, false, later),
            BatchStep::Send(1)
        );
        assert_eq!(
            decide(&l, [10; 4], 4, Some(now), 0, false, now),
            BatchStep::Send(4)
        );
        // Full by bytes: the next one does not fit.
        assert_eq!(
            decide(&l, [60, 60], 2, Some(now), 0, false, now),
            BatchStep::Send(1)
        );
        assert_eq!(
            decide(&l, [10], 1, Some(now), 0, true, now),
            BatchStep::Send(1)
        );
    }

    #[test]
    fn limits_are_clamped() {
        let l = limits(0, 10, 0, 0).clamped(1024);
        assert_eq!((l.max_messages, l.max_inflight), (1, 1));
        assert_eq!(limits(5000, 10, 2, 0).clamped(1024).max_messages, 1024);
    }

    /// Records batch sizes; answers each job with its item after `delay`.
    struct Echo {
        batches: Mutex<Vec<usize>>,
        delay: Duration,
    }

    impl Flight for Echo {
        type Item = u32;
        type Output = u32;
        fn send(
            self: Arc<Self>,
            batch: Vec<Job<u32, u32>>,
            _spare: usize,
        ) -> BoxFuture<'static, ()> {
            Box::pin(async move {
                self.batches.lock().unwrap().push(batch.len());
                tokio::time::sleep(self.delay).await;
                for j in batch {
                    let _ = j.reply.send(j.item);
                }
            })
        }
    }

    async fn one(queue: &Queue<Echo>, i: u32) -> u32 {
        let (job, rx) = Job::new(i, 10);
        submit(queue, vec![job]).await.unwrap();
        rx.await.unwrap()
    }

    #[tokio::test]
    async fn concurrent_items_coalesce_while_a_batch_is_in_flight() {
        let echo = Arc::new(Echo {
            batches: Mutex::new(vec![]),
            delay: Duration::from_millis(50),
        });
        let queue = spawn(echo.clone(), limits(256, 1 << 20, 1, 0));
        // Idle: one item, one batch of 1.
        assert_eq!(one(&queue, 7).await, 7);
        assert_eq!(*echo.batches.lock().unwrap(), [1]);
        // 100 at once with one request in flight: the first alone, the rest together.
        let results = futures::future::join_all((0..100).map(|i| one(&queue, i))).await;
        assert_eq!(results, (0..100).collect::<Vec<_>>());
        let batches = echo.batches.lock().unwrap().clone();
        assert_eq!(batches.iter().sum::<usize>(), 101);
        assert!(batches.len() <= 4, "{batches:?}");
    }

    #[tokio::test]
    async fn one_message_per_request_and_the_queue_drains_on_close() {
        let echo = Arc::new(Echo {
            batches: Mutex::new(vec![]),
            delay: Duration::from_millis(1),
        });
        let queue = spawn(echo.clone(), limits(1, 1 << 20, 4, 0));
        let mut rxs = vec![];
        for i in 0..20 {
            let (job, rx) = Job::new(i, 10);
            submit(&queue, vec![job]).await.unwrap();
            rxs.push(rx);
        }
        drop(queue);
        for (i, rx) in rxs.into_iter().enumerate() {
            assert_eq!(rx.await.unwrap(), i as u32);
        }
        assert_eq!(*echo.batches.lock().unwrap(), [1; 20]);
    }
}
