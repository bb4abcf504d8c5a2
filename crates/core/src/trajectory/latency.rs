//! Latency segments for statistics, read off a finished [`Trajectory`]'s hops: what the
//! listener's histograms are fed with. Inferred hops measure nothing and feed none.

use super::model::{HopKind, HopSpan, Segment, Trajectory};
use crate::stage::Stage;

/// The earliest time of a hop's events of these stages.
fn first_event(h: &HopSpan, stages: &[Stage]) -> Option<u64> {
    h.events
        .iter()
        .filter(|r| stages.contains(&r.stage))
        .map(|r| r.at)
        .min()
}

/// The latest time of a hop's events of these stages.
fn last_event(h: &HopSpan, stages: &[Stage]) -> Option<u64> {
    h.events
        .iter()
        .filter(|r| stages.contains(&r.stage))
        .map(|r| r.at)
        .max()
}

impl Trajectory {
    /// The latency of each segment this trajectory completed, for statistics: one entry per
    /// segment and group (for per-group segments) or per delivery attempt.
    pub fn segment_latencies(&self) -> Vec<(Segment, u64)> {
        let mut out = Vec::new();
        let stored = self.stored_at();
        if let (Some(f), Some(s)) = (self.first_send_at(), stored) {
            out.push((Segment::SentToStored, s.saturating_sub(f)));
        }
        for g in &self.groups {
            let first_delivery = self
                .hops
                .iter()
                .filter(|h| h.kind == HopKind::Deliver && h.by_id == g.by_id)
                .filter(|h| h.group.as_ref() == Some(&g.group))
                .map(|h| h.start)
                .min();
            if let (Some(s), Some(d)) = (stored, first_delivery) {
                out.push((Segment::StoredToDelivered, d.saturating_sub(s)));
            }
            if let Some(e) = g.end_to_end_nanos {
                out.push((Segment::EndToEnd, e));
            }
        }
        for h in self.hops.iter().filter(|h| h.kind == HopKind::Process) {
            self.attempt_latencies(h, &mut out);
        }
        out
    }

    /// The segments of one delivery attempt, from its process hop and its deliver hop.
    fn attempt_latencies(&self, process: &HopSpan, out: &mut Vec<(Segment, u64)>) {
        let received = first_event(process, &[Stage::PushReceived, Stage::PullReceived]);
        let x1 = first_event(process, &[Stage::ProcessStarted]);
        let x2 = first_event(process, &[Stage::ProcessFinished]);
        if let (Some(a), Some(b)) = (x1, x2) {
            out.push((Segment::Processing, b.saturating_sub(a)));
        }
        let Some(deliver) = self.deliver_of(process) else {
            return;
        };
        let sent = first_event(deliver, &[Stage::PushSent, Stage::PullSent]);
        let acked = last_event(deliver, &[Stage::PushAckReceived, Stage::PullAckReceived]);
        if let (Some(s), Some(r)) = (sent, received) {
            out.push((Segment::DeliveredToReceived, r.saturating_sub(s)));
        }
        if let (Some(r), Some(a)) = (received, acked) {
            out.push((Segment::ReceivedToAcked, a.saturating_sub(r)));
        }
    }

    /// The deliver hop a process hop belongs to (its parent).
    pub(super) fn deliver_of(&self, process: &HopSpan) -> Option<&HopSpan> {
        let parent = process.parent.as_deref()?;
        self.hops
            .iter()
            .find(|d| d.kind == HopKind::Deliver && d.key == parent)
    }

    /// When the first upload was sent (not inferred).
    pub(super) fn first_send_at(&self) -> Option<u64> {
        self.hop("send").filter(|h| !h.inferred).map(|h| h.start)
    }

    /// When the message was stored (not inferred).
    pub(super) fn stored_at(&self) -> Option<u64> {
        self.hop("store")
            .filter(|h| !h.inferred)
            .and_then(|h| h.end)
    }
}
