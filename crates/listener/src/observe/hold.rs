//! Which observed trajectories the trace export holds back: those whose stored message is
//! still to come. The two readers are independent, so a message's delivery records can be
//! stored before its P2/P3; exported then, its spans would have the message ID as trace ID
//! even when the stored message carries a `traceparent` (the producer's trace), and a
//! synthesized store hop — and, exported once per hop, they would stay so. Held back, the
//! trajectory goes with its next change: the P2/P3 the stored reader brings.
//!
//! Not held (exported as they are, without a store hop): messages of a stream msgtrail does
//! not read ([`Reader::Refused`]: a work-queue stream, or one that refused its consumer), messages before the stream's
//! first sequence (gone before the reader got to them), and any message held for
//! [`MAX_HOLD`] already. [`Held`] remembers the held ones; [`recheck`] reads them from the
//! store again every [`RECHECK`] and offers them once more, so none waits for a change
//! that never comes.

use super::discovery::{ObserveStatus, Reader};
use super::Observer;
use msgtrail_core::observed::observed_message_id;
use msgtrail_core::trajectory::Trajectory;
use msgtrail_core::MessageId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a trajectory is held at most: past it, its stored message is taken as never
/// coming and it is exported as it is.
pub(crate) const MAX_HOLD: Duration = Duration::from_secs(30);
/// How often the held trajectories are read again and offered.
pub(crate) const RECHECK: Duration = Duration::from_millis(500);
/// Most trajectories held at once; beyond, new ones are exported as they are.
const MAX_HELD: usize = 100_000;

/// The trajectories held back, by message ID, with when they were first held.
#[derive(Debug, Default)]
pub(crate) struct Held {
    ids: Mutex<HashMap<MessageId, Instant>>,
}

impl Held {
    /// The export's hold: whether `t` waits for its stored message ([`held`]), for
    /// [`MAX_HOLD`] at most; remembers it for [`recheck`] while it does.
    pub(crate) fn hold(&self, t: &Trajectory, status: &ObserveStatus) -> bool {
        let Some(id) = t.message_id.filter(|m| m.is_observed()) else {
            return false; // a broker's message: no lock taken
        };
        let waits = held(t, status);
        let mut ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
        if !waits {
            ids.remove(&id);
            return false;
        }
        let now = Instant::now();
        let since = match ids.get(&id) {
            Some(s) => *s,
            None if ids.len() >= MAX_HELD => return false,
            None => *ids.entry(id).or_insert(now),
        };
        if now.duration_since(since) >= MAX_HOLD {
            ids.remove(&id);
            return false;
        }
        true
    }

    /// The message IDs held now.
    fn ids(&self) -> Vec<MessageId> {
        let ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
        ids.keys().copied().collect()
    }
}

/// Until stopped: every [`RECHECK`], reads the held trajectories from the store and offers
/// them to the export again (held again while they still wait, for [`MAX_HOLD`] at most).
pub(crate) async fn recheck(obs: Arc<Observer>, held: Arc<Held>) {
    let Some(exporter) = obs.sinks.exporter.clone() else {
        return;
    };
    loop {
        tokio::select! {
            _ = obs.stop.cancelled() => return,
            _ = tokio::time::sleep(RECHECK) => {}
        }
        let ids = held.ids();
        if ids.is_empty() {
            continue;
        }
        let store = obs.sinks.store.clone();
        let read = tokio::task::spawn_blocking(move || {
            let now = msgtrail_core::time::now_nanos();
            ids.iter()
                .filter_map(|id| store.trajectory(&id.to_string(), now).ok().flatten())
                .collect::<Vec<_>>()
        })
        .await;
        match read {
            Ok(ts) => exporter.offer(ts),
            Err(e) => tracing::debug!(error = %e, "held trajectories not read again"),
        }
    }
}

/// Whether `t` waits for its stored message before it may be exported.
pub(crate) fn held(t: &Trajectory, status: &ObserveStatus) -> bool {
    if t.observed.as_ref().is_some_and(|o| o.stored) {
        return false; // its P3 is in
    }
    let Some(id) = t.message_id.filter(|m| m.is_observed()) else {
        return false; // a broker's message
    };
    let Some(seq) = t
        .hops
        .iter()
        .flat_map(|h| &h.events)
        .chain(&t.other_records)
        .find_map(|r| r.stream_seq)
    else {
        return false;
    };
    status
        .stream_names()
        .iter()
        .find(|s| observed_message_id(s, seq) == id)
        .is_some_and(|s| status.reader(s) != Reader::Refused && seq >= status.first_seq(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::event::{ConsumerEvent, What};
    use crate::observe::records::{event_records, stored_records, StoredMessage};
    use msgtrail_core::trajectory::DeliveryMode;

    fn assemble(rs: Vec<msgtrail_core::StageRecord>) -> Trajectory {
        Trajectory::assemble(rs, &Default::default()).unwrap()
    }

    fn acked(seq: u64) -> Vec<msgtrail_core::StageRecord> {
        let e = ConsumerEvent {
            stream: "ORDERS".into(),
            consumer: "billing".into(),
            stream_seq: seq,
            deliveries: 1,
            at: 2_000_000,
            what: What::Acked { ack_time: 1_000 },
        };
        event_records(&e, DeliveryMode::Pull, &mut |_, _, _| false).unwrap()
    }

    #[test]
    fn held_ones_are_remembered_until_they_go() {
        let status = ObserveStatus::new(&["ORDERS".to_owned()]);
        let h = Held::default();
        let deliveries = assemble(acked(3));
        assert!(h.hold(&deliveries, &status));
        assert_eq!(h.ids(), [deliveries.message_id.unwrap()]);
        status.set_reader("ORDERS", Reader::Refused);
        assert!(!h.hold(&deliveries, &status));
        assert!(h.ids().is_empty(), "released");
    }

    #[test]
    fn deliveries_wait_for_their_stored_message_unless_it_cannot_come() {
        let status = ObserveStatus::new(&["ORDERS".to_owned()]);
        let deliveries = assemble(acked(7));
        assert!(
            held(&deliveries, &status),
            "the stored reader is still to come"
        );
        status.set_reader("ORDERS", Reader::Reading);
        assert!(held(&deliveries, &status));
        let mut all = acked(7);
        all.extend(
            stored_records(StoredMessage {
                stream: "ORDERS",
                subject: "orders.eu",
                stream_seq: 7,
                stored_at: 1_000_000,
                headers: None,
            })
            .unwrap(),
        );
        assert!(!held(&assemble(all), &status), "complete: exported");
        status.set_reader("ORDERS", Reader::Refused);
        assert!(!held(&deliveries, &status), "no stored message will come");
        // Another stream's message: not this listener's to hold.
        let other = ObserveStatus::new(&["PAYMENTS".to_owned()]);
        assert!(!held(&deliveries, &other));
    }
}
