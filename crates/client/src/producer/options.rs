//! [`ProducerOptions`] (every default in one `impl Default`, chainable setters) and
//! [`Outgoing`], one message to send.

use crate::channel::DEFAULT_TIMEOUT;
use crate::topic::ToTopic;
use bytes::Bytes;
use msgtrail_core::{IdError, RequestId, Topic};
use std::collections::BTreeMap;
use std::time::Duration;

/// One message to send, built like async-nats' `PublishMessage`:
///
/// ```
/// use msgtrail_client::Outgoing;
/// let msg = Outgoing::new("orders.eu", "hello").attr("category", "refund");
/// assert_eq!(msg.topic().map(|t| t.as_str()), Some("orders.eu"));
/// ```
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// The topic, or why the text given is not one (reported when the message is sent).
    pub(crate) topic: Result<Topic, IdError>,
    pub(crate) payload: Bytes,
    pub(crate) request_id: Option<RequestId>,
    pub(crate) attrs: BTreeMap<String, String>,
    pub(crate) traceparent: Option<String>,
}

impl Outgoing {
    /// A message with just a topic and payload. A topic given as text that is not one fails
    /// the send with [`crate::ClientError::Invalid`].
    pub fn new(topic: impl ToTopic, payload: impl Into<Bytes>) -> Self {
        Outgoing {
            topic: topic.to_topic(),
            payload: payload.into(),
            request_id: None,
            attrs: BTreeMap::new(),
            traceparent: None,
        }
    }

    /// Sets the request ID (generated when not set).
    pub fn request_id(mut self, id: RequestId) -> Self {
        self.request_id = Some(id);
        self
    }

    /// Adds an attribute (`category=refund`).
    pub fn attr(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.attrs.insert(key.into(), value.into());
        self
    }

    /// Links the message's trace to a W3C `traceparent`.
    pub fn traceparent(mut self, traceparent: impl Into<String>) -> Self {
        self.traceparent = Some(traceparent.into());
        self
    }

    /// The topic, if the one given is valid.
    pub fn topic(&self) -> Option<&Topic> {
        self.topic.as_ref().ok()
    }

    /// The payload.
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }
}

/// Producer settings. Start from [`ProducerOptions::default`] and change what you need:
///
/// ```
/// use msgtrail_client::ProducerOptions;
/// use std::time::Duration;
/// let options = ProducerOptions::default()
///     .timeout(Duration::from_secs(2))
///     .max_attempts(5)
///     .max_batch_messages(1);
/// # let _ = options;
/// ```
#[derive(Debug, Clone)]
pub struct ProducerOptions {
    pub(crate) timeout: Duration,
    pub(crate) max_attempts: u32,
    pub(crate) retry_backoff: Duration,
    pub(crate) report_stages: bool,
    pub(crate) max_batch_messages: usize,
    pub(crate) max_batch_bytes: Option<usize>,
    pub(crate) max_inflight_batches: usize,
    pub(crate) linger: Duration,
    pub(crate) clock_offset_nanos: i64,
}

impl Default for ProducerOptions {
    fn default() -> Self {
        ProducerOptions {
            timeout: DEFAULT_TIMEOUT,
            max_attempts: 3,
            retry_backoff: Duration::from_millis(100),
            report_stages: true,
            max_batch_messages: 256,
            max_batch_bytes: None,
            max_inflight_batches: 4,
            linger: Duration::ZERO,
            clock_offset_nanos: 0,
        }
    }
}

impl ProducerOptions {
    /// Timeout of one upload attempt (one batch request). Default 5 s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Attempts per message (1 = no retry). Default 3.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// Pause before a retry (doubles each time, less up to a fifth at random:
    /// `msgtrail_core::backoff`). Default 100 ms.
    pub fn retry_backoff(mut self, pause: Duration) -> Self {
        self.retry_backoff = pause;
        self
    }

    /// Report this producer's stage records: P1 (as each entry's send time) and P4. Default
    /// true; false sends no record at all.
    pub fn report_stages(mut self, report: bool) -> Self {
        self.report_stages = report;
        self
    }

    /// Most messages in one upload batch request, 1 to 1024 (1 = one message per request).
    /// Default 256.
    pub fn max_batch_messages(mut self, max: usize) -> Self {
        self.max_batch_messages = max;
        self
    }

    /// Most bytes of messages (payload plus per-message fields) in one batch request; a
    /// single larger message still goes, alone. By default 1 MiB or the NATS server's
    /// `max_payload` if smaller, less 4 KiB; a value above that is cut to it.
    pub fn max_batch_bytes(mut self, max: usize) -> Self {
        self.max_batch_bytes = Some(max);
        self
    }

    /// Most upload batch requests in flight at once; while that many are, new messages queue
    /// for the next batch. Default 4.
    pub fn max_inflight_batches(mut self, max: usize) -> Self {
        self.max_inflight_batches = max;
        self
    }

    /// How long a batch that is not full waits for more messages before it is sent. Default
    /// zero: an idle producer sends each message at once.
    pub fn linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// **Test only.** Shifts every time this SDK reports in its stage records (and the P1
    /// send time of its uploads) by this many nanoseconds, as if its clock were that far
    /// ahead (negative: behind). Lets tests check the listener's clock-offset estimates
    /// against a known skew. Default 0; never set it in production.
    #[doc(hidden)]
    pub fn clock_offset_nanos(mut self, offset: i64) -> Self {
        self.clock_offset_nanos = offset;
        self
    }
}
