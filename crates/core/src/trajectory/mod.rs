//! Trajectory assembly: from the stage records of one message to its hops, latencies, state
//! and a plain-words diagnosis.
//!
//! A [`Trajectory`] is pure data, serializable as JSON (it is the body of the listener's
//! `/api/messages/{id}` and of `msgtrail trace --json`). [`Trajectory::assemble`] builds it
//! from any set of records of one message — **in any order**: records are deduplicated by
//! [`StageRecord::dedup_key`] and sorted before anything is derived, so every permutation of
//! the same set gives the same trajectory.
//!
//! ## Hops
//! Each hop becomes one OpenTelemetry span (docs/ARCHITECTURE.md §3, decision 10). Its `key` is the
//! text of its [`HopId`] (the grammar of docs/PROTOCOL.md §13), hashed into its span
//! ID, and `parent` is the key of its parent:
//!
//! | kind | from → to | events | parent |
//! | --- | --- | --- | --- |
//! | `send` | P1 → P4 (producer) | P1 (every attempt), P4, D1 | none: the root |
//! | `store` | P2 → P3, or → stored time (broker; see *Causal order*) | P2, P3 | `send` |
//! | `deliver` | C1 → C4 (push) or C5 → C8 (pull), per (group, consumer, attempt) | C1/C4 or C5/C8, R1 | `store` |
//! | `process` | C2 → C3 or C6 → C7 (consumer), per (group, consumer, attempt) | C2/C3 or C6/C7, X1, X2 | its `deliver` |
//!
//! When no producer record exists (a raw NATS client uploaded), the `send` hop is
//! synthesized from the broker's P2/P3 and marked `synthesized`, so no span has a dangling
//! parent.
//!
//! ## Causal order
//! A message is deliverable once JetStream stored it, which can be before the broker hears
//! the PubAck (its P3). The `store` hop ends at the PubAck unless a delivery started before
//! it, or the P3 is missing while a delivery exists; then it ends when the message was
//! deliverable: JetStream's stored time ([`HopSpan::stored_at`], from a recovered P3 or the
//! `stored_at` the broker puts on a C1/C5) when known, else the first delivery's start.
//! The PubAck stays an event. So no delivery starts before the message was deliverable in
//! what is shown. A hop that would still end before it starts (clocks that disagree) is
//! flagged ([`HopSpan::impossible`]) and shows no latency. The state history only moves
//! forward ([`Trajectory::states`]), whatever the timestamps: times from different clocks
//! may overlap, and are shown as recorded rather than reordered.
//!
//! A hop is `ok`, `error` (a nack, a failed processing, a dead letter, or a deadline missed:
//! the failure point) or `incomplete` (still open, no deadline passed yet); `reason` says why
//! in words. Deadlines apply only when [`AssembleOptions::now`] is given.
//!
//! ## How the parts meet
//! - [`model`]: the data (the [`Trajectory`] and its hops, states, groups; [`HopId`]).
//! - `assembly`: records → hops. Normalizes (total order, no repeats), partitions the
//!   records by hop, then builds the store, send and delivery hops, one function each.
//! - `state`: hops → group summaries, overall state, state history, failure point.
//! - `latency`: hops → latency segments ([`Trajectory::segment_latencies`]).
//! - `diagnosis`: the finished trajectory → its plain-words account.
//!
//! Record outcomes are read through the typed view of [`crate::outcome`]. Presentation
//! (latencies and clock times for people) belongs to the readers; the diagnosis words its
//! own clauses.

mod assembly;
mod clock;
mod diagnosis;
#[cfg(test)]
mod fidelity_tests;
pub mod invariants;
mod latency;
pub mod model;
#[cfg(test)]
mod proptests;
mod state;
#[cfg(test)]
mod tests;

pub use crate::record::RECOVERED;
pub use model::{
    AssembleOptions, ClockEstimate, CorrectedSpan, Deadlines, DeliveryId, DeliveryMode,
    GroupSummary, HopId, HopKind, HopSpan, HopStatus, MessageState, Segment, StateChange,
    Trajectory,
};

use crate::ids::MessageId;
use crate::record::StageRecord;

impl Trajectory {
    /// Assembles the trajectory of the message (or orphan upload) the records belong to.
    /// Returns `None` when there is no record. The result does not depend on the order of
    /// the records, nor on repeated records.
    pub fn assemble(
        records: impl IntoIterator<Item = StageRecord>,
        options: &AssembleOptions,
    ) -> Option<Trajectory> {
        assembly::assemble(records, options, false)
    }

    /// Like [`Trajectory::assemble`], without what only a reader of the trajectory needs:
    /// the diagnosis is empty, the hops have no span ID and no clock estimates. Everything else (states,
    /// hops, groups, failure, latencies) is the same; the listener uses it for shadow-message
    /// summaries and statistics, where assembly runs once per touched message per batch.
    pub fn assemble_for_summary(
        records: impl IntoIterator<Item = StageRecord>,
        options: &AssembleOptions,
    ) -> Option<Trajectory> {
        assembly::assemble(records, options, true)
    }

    /// Names the other messages stored under this message's producer and request ID
    /// (sorted, without this message's own ID) and, when the trajectory has a diagnosis,
    /// says so in it.
    pub fn set_same_request(&mut self, others: impl IntoIterator<Item = MessageId>) {
        let mut v: Vec<MessageId> = others
            .into_iter()
            .filter(|m| Some(*m) != self.message_id)
            .collect();
        v.sort_unstable();
        v.dedup();
        self.same_request = v;
        if !self.diagnosis.is_empty() {
            self.diagnosis = diagnosis::diagnose(self);
        }
    }

    /// The hop with this key.
    pub fn hop(&self, key: &str) -> Option<&HopSpan> {
        self.hops.iter().find(|h| h.key == key)
    }

    /// Whether the message reached the broker (a P2 or P3 exists).
    pub fn reached_broker(&self) -> bool {
        self.stored_at().is_some() || self.hop("store").is_some()
    }
}
