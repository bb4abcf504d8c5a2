//! The typed outcomes of stage records: one enum per stage that has an outcome, each
//! serializing to exactly the text the protocol uses (docs/PROTOCOL.md §12).
//!
//! On the wire, a record's outcome is a plain string ([`StageRecord::outcome`]): the JSON
//! and compact encodings stay as they are, and an outcome text this version does not know
//! (a hand-written client may report one) is carried through unchanged instead of failing
//! the whole batch. Code reads and writes it through the typed view:
//! [`StageRecord::typed_outcome`] parses the text according to the record's stage, and
//! [`StageRecord::set_outcome`] writes one of these enums' texts.
//!
//! | stage | enum | texts |
//! | --- | --- | --- |
//! | P2, P3 | [`StoreOutcome`] | `refused`, `recovered`, `observed` |
//! | P4 | [`ConfirmOutcome`] | `duplicate` |
//! | C3, C4, C7, C8 | [`SettleOutcome`] (= [`SettleKind`]) | `ack`, `nack`, `term` |
//! | X2 | [`ProcessOutcome`] | `ok`, `failed` |
//! | A1 | [`ChannelOutcome`] | `opened`, `refused`, `closed`, `expired` |
//! | R1 | [`RedeliveryOutcome`] | `redeliver`, `dead_letter` |

use crate::record::StageRecord;
use crate::stage::Stage;
pub use crate::wire::SettleKind;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The outcome of a settle record (C3, C4, C7, C8): the settle kind. A C4/C8 without an
/// outcome is an ack.
pub type SettleOutcome = SettleKind;

macro_rules! outcome_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $text:literal,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum $name {
            $($(#[$vdoc])* #[serde(rename = $text)] $variant,)*
        }

        impl $name {
            /// Every value.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The text of the outcome on the wire.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text,)* }
            }

            /// The value with this wire text.
            pub fn parse(text: &str) -> Option<Self> {
                match text { $($text => Some($name::$variant),)* _ => None }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

outcome_enum! {
    /// The outcome of a store record (P2, P3).
    StoreOutcome {
        /// P2: the broker refused the upload (no message ID; the error as `detail`).
        Refused = "refused",
        /// P2/P3: recovered by the listener from the stored message itself rather than
        /// written by the broker ([`crate::record::RECOVERED`]).
        Recovered = "recovered",
        /// P2/P3: observe mode read them from a message of a JetStream stream msgtrail does
        /// not own ([`crate::observed`]); both are at JetStream's stored time.
        Observed = "observed",
    }
}

outcome_enum! {
    /// The outcome of a store confirmation (P4).
    ConfirmOutcome {
        /// The broker answered that the upload was a duplicate of a stored message.
        Duplicate = "duplicate",
    }
}

outcome_enum! {
    /// The outcome of processing (X2).
    ProcessOutcome {
        /// Processed.
        Ok = "ok",
        /// The handler failed (its error as `detail`).
        Failed = "failed",
    }
}

outcome_enum! {
    /// The outcome of a channel record (A1).
    ChannelOutcome {
        /// The channel was opened.
        Opened = "opened",
        /// The channel was refused (the reason as `detail`).
        Refused = "refused",
        /// The client closed it.
        Closed = "closed",
        /// No keepalive within its TTL.
        Expired = "expired",
    }
}

outcome_enum! {
    /// The outcome of a redelivery record (R1).
    RedeliveryOutcome {
        /// Another delivery attempt was scheduled.
        Redeliver = "redeliver",
        /// Given up: moved to the dead-letter stream.
        DeadLetter = "dead_letter",
    }
}

fn parse_ack_kind(text: &str) -> Option<SettleKind> {
    [SettleKind::Ack, SettleKind::Nack, SettleKind::Term]
        .into_iter()
        .find(|k| k.as_str() == text)
}

/// The outcome of a record, read according to its stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// P2, P3.
    Store(StoreOutcome),
    /// P4.
    Confirm(ConfirmOutcome),
    /// C3, C4, C7, C8.
    Settle(SettleOutcome),
    /// X2.
    Process(ProcessOutcome),
    /// A1.
    Channel(ChannelOutcome),
    /// R1.
    Redelivery(RedeliveryOutcome),
    /// A text this version does not know for the record's stage, kept as it came.
    Unknown(String),
}

impl Outcome {
    /// Reads the wire text of an outcome of a record of `stage`. A text that is not one of
    /// the stage's outcomes is [`Outcome::Unknown`].
    pub fn parse(stage: Stage, text: &str) -> Outcome {
        let known = match stage {
            Stage::UploadReceived | Stage::Stored => StoreOutcome::parse(text).map(Outcome::Store),
            Stage::StoreConfirmed => ConfirmOutcome::parse(text).map(Outcome::Confirm),
            Stage::PushAckSent
            | Stage::PushAckReceived
            | Stage::PullAckSent
            | Stage::PullAckReceived => parse_ack_kind(text).map(Outcome::Settle),
            Stage::ProcessFinished => ProcessOutcome::parse(text).map(Outcome::Process),
            Stage::Channel => ChannelOutcome::parse(text).map(Outcome::Channel),
            Stage::Redelivery => RedeliveryOutcome::parse(text).map(Outcome::Redelivery),
            _ => None,
        };
        known.unwrap_or_else(|| Outcome::Unknown(text.to_owned()))
    }

    /// The wire text.
    pub fn as_str(&self) -> &str {
        match self {
            Outcome::Store(o) => o.as_str(),
            Outcome::Confirm(o) => o.as_str(),
            Outcome::Settle(o) => o.as_str(),
            Outcome::Process(o) => o.as_str(),
            Outcome::Channel(o) => o.as_str(),
            Outcome::Redelivery(o) => o.as_str(),
            Outcome::Unknown(s) => s,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

macro_rules! into_outcome {
    ($($ty:ty => $variant:ident),*) => {$(
        impl From<$ty> for Outcome {
            fn from(o: $ty) -> Outcome {
                Outcome::$variant(o)
            }
        }
    )*};
}

into_outcome!(
    StoreOutcome => Store,
    ConfirmOutcome => Confirm,
    SettleOutcome => Settle,
    ProcessOutcome => Process,
    ChannelOutcome => Channel,
    RedeliveryOutcome => Redelivery
);

impl StageRecord {
    /// The record's outcome, read according to its stage; `None` when it has none.
    pub fn typed_outcome(&self) -> Option<Outcome> {
        self.outcome
            .as_deref()
            .map(|text| Outcome::parse(self.stage, text))
    }

    /// Sets the outcome (its wire text).
    pub fn set_outcome(&mut self, outcome: impl Into<Outcome>) {
        self.outcome = Some(outcome.into().as_str().to_owned());
    }

    /// This record with the outcome set ([`StageRecord::set_outcome`]).
    pub fn with_outcome(mut self, outcome: impl Into<Outcome>) -> Self {
        self.set_outcome(outcome);
        self
    }

    /// The outcome of a P2/P3, if it is one of [`StoreOutcome`].
    pub fn store_outcome(&self) -> Option<StoreOutcome> {
        match self.typed_outcome()? {
            Outcome::Store(o) => Some(o),
            _ => None,
        }
    }

    /// The outcome of a settle record (C3, C4, C7, C8) if it is one of [`SettleOutcome`].
    /// An absent outcome is `None` (a C4/C8 without one means an ack).
    pub fn settle_outcome(&self) -> Option<SettleOutcome> {
        match self.typed_outcome()? {
            Outcome::Settle(o) => Some(o),
            _ => None,
        }
    }

    /// The outcome of an X2, if it is one of [`ProcessOutcome`].
    pub fn process_outcome(&self) -> Option<ProcessOutcome> {
        match self.typed_outcome()? {
            Outcome::Process(o) => Some(o),
            _ => None,
        }
    }

    /// The outcome of an A1, if it is one of [`ChannelOutcome`].
    pub fn channel_outcome(&self) -> Option<ChannelOutcome> {
        match self.typed_outcome()? {
            Outcome::Channel(o) => Some(o),
            _ => None,
        }
    }

    /// The outcome of an R1, if it is one of [`RedeliveryOutcome`].
    pub fn redelivery_outcome(&self) -> Option<RedeliveryOutcome> {
        match self.typed_outcome()? {
            Outcome::Redelivery(o) => Some(o),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_keeps_its_wire_text() {
        let cases: Vec<(Stage, Outcome, &str)> = vec![
            (
                Stage::UploadReceived,
                StoreOutcome::Refused.into(),
                "refused",
            ),
            (Stage::Stored, StoreOutcome::Recovered.into(), "recovered"),
            (Stage::Stored, StoreOutcome::Observed.into(), "observed"),
            (
                Stage::StoreConfirmed,
                ConfirmOutcome::Duplicate.into(),
                "duplicate",
            ),
            (Stage::PullAckReceived, SettleKind::Ack.into(), "ack"),
            (Stage::PushAckSent, SettleKind::Nack.into(), "nack"),
            (Stage::PushAckReceived, SettleKind::Term.into(), "term"),
            (Stage::ProcessFinished, ProcessOutcome::Ok.into(), "ok"),
            (
                Stage::ProcessFinished,
                ProcessOutcome::Failed.into(),
                "failed",
            ),
            (Stage::Channel, ChannelOutcome::Opened.into(), "opened"),
            (Stage::Channel, ChannelOutcome::Refused.into(), "refused"),
            (Stage::Channel, ChannelOutcome::Closed.into(), "closed"),
            (Stage::Channel, ChannelOutcome::Expired.into(), "expired"),
            (
                Stage::Redelivery,
                RedeliveryOutcome::Redeliver.into(),
                "redeliver",
            ),
            (
                Stage::Redelivery,
                RedeliveryOutcome::DeadLetter.into(),
                "dead_letter",
            ),
        ];
        for (stage, o, text) in cases {
            let r = StageRecord::at(stage, 1).with_outcome(o.clone());
            assert_eq!(r.outcome.as_deref(), Some(text));
            assert_eq!(r.typed_outcome(), Some(o));
            // Both encodings carry the text as before.
            assert!(r.to_json().contains(&format!("\"outcome\":\"{text}\"")));
            let bytes = crate::frame::encode_stage_batch([&r]);
            assert_eq!(crate::record::decode_batch(&bytes).unwrap(), vec![r]);
        }
        assert_eq!(
            serde_json::to_string(&RedeliveryOutcome::DeadLetter).unwrap(),
            "\"dead_letter\""
        );
    }

    #[test]
    fn unknown_texts_and_other_stages_are_kept() {
        let mut r = StageRecord::at(Stage::PullAckReceived, 1);
        assert_eq!(r.typed_outcome(), None);
        r.outcome = Some("maybe".into());
        assert_eq!(r.typed_outcome(), Some(Outcome::Unknown("maybe".into())));
        assert_eq!(r.settle_outcome(), None);
        // `refused` is a store outcome on P2 and a channel outcome on A1.
        r.stage = Stage::Channel;
        r.outcome = Some("refused".into());
        assert_eq!(r.channel_outcome(), Some(ChannelOutcome::Refused));
        assert_eq!(r.store_outcome(), None);
    }
}
