//! Telling "the stream has no leader right now" from "JetStream is not answering at all".
//!
//! A publish into the message stream that nobody answers (NATS no-responders) looks the same
//! in both cases. During an election the JetStream API still answers; when nats-server has
//! disabled JetStream — it does so by itself when its store runs out of space, and keeps it
//! off until restarted — or runs without it, nothing under `$JS.API` answers either. One
//! `$JS.API.INFO` request tells them apart; its answer is kept for a second, so that a burst
//! of failed uploads costs one probe.

use msgtrail_core::sync::Recover;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long one probe's answer is reused.
const FRESH: Duration = Duration::from_secs(1);
/// How long a probe waits for the JetStream API.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// What the probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JetStreamState {
    /// The JetStream API answered (the stream may still lack a leader).
    Answering,
    /// Nothing under `$JS.API` answered.
    NotAnswering,
}

/// The probe and its last answer.
#[derive(Debug, Default)]
pub(crate) struct JetStreamProbe {
    /// The last answer and when it was taken. A plain value swapped under the lock: a
    /// panicking holder cannot leave it half-written.
    last: Mutex<Option<(Instant, JetStreamState)>>,
}

impl JetStreamProbe {
    /// The JetStream API's state, probed at most once per [`FRESH`].
    pub(crate) async fn state(&self, client: &async_nats::Client) -> JetStreamState {
        if let Some((at, state)) = *self.last.lock().recover() {
            if at.elapsed() < FRESH {
                return state;
            }
        }
        let reply = tokio::time::timeout(
            PROBE_TIMEOUT,
            client.request("$JS.API.INFO", bytes::Bytes::new()),
        )
        .await;
        let state = match reply {
            Ok(Ok(_)) => JetStreamState::Answering,
            // No responders, a timeout, a closed connection: nothing answers.
            Ok(Err(_)) | Err(_) => JetStreamState::NotAnswering,
        };
        *self.last.lock().recover() = Some((Instant::now(), state));
        state
    }
}
