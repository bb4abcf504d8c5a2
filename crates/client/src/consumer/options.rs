//! [`ConsumerOptions`] and [`PushOptions`]: every default in one `impl Default`, set through
//! chainable setters (like async-nats' `ConnectOptions`).

use crate::channel::DEFAULT_TIMEOUT;
use std::time::Duration;

/// Consumer settings. Start from [`ConsumerOptions::default`] and change what you need:
///
/// ```
/// use msgtrail_client::ConsumerOptions;
/// use std::time::Duration;
/// let options = ConsumerOptions::default()
///     .timeout(Duration::from_secs(10))
///     .max_batch_messages(1);
/// # let _ = options;
/// ```
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    pub(crate) timeout: Duration,
    pub(crate) report_stages: bool,
    pub(crate) max_batch_messages: usize,
    pub(crate) max_inflight_batches: usize,
    pub(crate) linger: Duration,
    pub(crate) clock_offset_nanos: i64,
}

impl Default for ConsumerOptions {
    fn default() -> Self {
        ConsumerOptions {
            timeout: DEFAULT_TIMEOUT,
            report_stages: true,
            max_batch_messages: 256,
            max_inflight_batches: 4,
            linger: Duration::ZERO,
            clock_offset_nanos: 0,
        }
    }
}

impl ConsumerOptions {
    /// Timeout of one request (a fetch waits this long beyond its own wait). Default 5 s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Report this consumer's stage records (C2/C3, C6/C7, X1/X2). Default true.
    pub fn report_stages(mut self, report: bool) -> Self {
        self.report_stages = report;
        self
    }

    /// Most settles in one settle batch request, 1 to 1024 (1 = one settle per request).
    /// Default 256.
    pub fn max_batch_messages(mut self, max: usize) -> Self {
        self.max_batch_messages = max;
        self
    }

    /// Most settle batch requests in flight at once; while that many are, new settles queue
    /// for the next batch. Default 4.
    pub fn max_inflight_batches(mut self, max: usize) -> Self {
        self.max_inflight_batches = max;
        self
    }

    /// How long a settle batch that is not full waits for more before it is sent. Default
    /// zero: an idle consumer settles at once.
    pub fn linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// **Test only.** Shifts every time this SDK reports in its stage records by this many
    /// nanoseconds, as if its clock were that far ahead (negative: behind). Lets tests check
    /// the listener's clock-offset estimates against a known skew. Default 0; never set it
    /// in production.
    #[doc(hidden)]
    pub fn clock_offset_nanos(mut self, offset: i64) -> Self {
        self.clock_offset_nanos = offset;
        self
    }
}

/// Push subscription settings. Start from [`PushOptions::default`] (push as soon as
/// messages exist, at most 64 unsettled):
///
/// ```
/// use msgtrail_client::PushOptions;
/// use std::time::Duration;
/// let every_5s = PushOptions::default().every(Duration::from_secs(5)).max_inflight(64);
/// # let _ = every_5s;
/// ```
#[derive(Debug, Clone)]
pub struct PushOptions {
    pub(crate) every: Option<Duration>,
    pub(crate) max_inflight: u32,
}

impl Default for PushOptions {
    fn default() -> Self {
        PushOptions {
            every: None,
            max_inflight: 64,
        }
    }
}

impl PushOptions {
    /// Push in batches on this period (default: as soon as messages exist).
    pub fn every(mut self, period: Duration) -> Self {
        self.every = Some(period);
        self
    }

    /// At most this many unsettled deliveries. Default 64.
    pub fn max_inflight(mut self, max: u32) -> Self {
        self.max_inflight = max;
        self
    }
}
