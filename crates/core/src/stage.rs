//! The stage model (docs/ARCHITECTURE.md §2): every step of a message's life has a code, and each code
//! has exactly one kind of emitter.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Which side of a channel a client is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Uploads messages.
    Producer,
    /// Consumes messages.
    Consumer,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Producer => "producer",
            Role::Consumer => "consumer",
        })
    }
}

/// Who writes a stage record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Emitter {
    /// The broker writes it to the stage stream itself.
    Broker,
    /// A client reports it through its channel; the broker checks and relays it.
    Client(Role),
}

macro_rules! stages {
    ($($(#[$doc:meta])* $variant:ident = $code:literal, $emitter:expr;)*) => {
        /// A stage of a message's life. The serialized form is the code (`"P1"`, `"C5"`, …).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Stage {
            $($(#[$doc])* $variant,)*
        }

        impl Stage {
            /// Every stage, in the order of the table in docs/ARCHITECTURE.md §2.
            pub const ALL: &'static [Stage] = &[$(Stage::$variant,)*];

            /// The short code (`P1`, `C5`, …).
            pub fn code(self) -> &'static str {
                match self { $(Stage::$variant => $code,)* }
            }

            /// Who emits records of this stage.
            pub fn emitter(self) -> Emitter {
                match self { $(Stage::$variant => $emitter,)* }
            }
        }

        impl FromStr for Stage {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($code => Ok(Stage::$variant),)*
                    other => Err(format!("unknown stage code {other:?}")),
                }
            }
        }
    };
}

const BROKER: Emitter = Emitter::Broker;
const PRODUCER: Emitter = Emitter::Client(Role::Producer);
const CONSUMER: Emitter = Emitter::Client(Role::Consumer);

stages! {
    /// P1: the producer sent the upload request.
    UploadSent = "P1", PRODUCER;
    /// P2: the broker received the upload and assigned the message ID.
    UploadReceived = "P2", BROKER;
    /// P3: the broker stored the message and sent the store-success notice.
    Stored = "P3", BROKER;
    /// P4: the producer received the store-success notice.
    StoreConfirmed = "P4", PRODUCER;
    /// C1: push — the broker sent the message to a consumer.
    PushSent = "C1", BROKER;
    /// C2: push — the consumer received it.
    PushReceived = "C2", CONSUMER;
    /// C3: push — the consumer sent its ack.
    PushAckSent = "C3", CONSUMER;
    /// C4: push — the broker received the ack.
    PushAckReceived = "C4", BROKER;
    /// C5: pull — the broker answered a fetch with the message.
    PullSent = "C5", BROKER;
    /// C6: pull — the consumer received it.
    PullReceived = "C6", CONSUMER;
    /// C7: pull — the consumer sent its ack.
    PullAckSent = "C7", CONSUMER;
    /// C8: pull — the broker received the ack.
    PullAckReceived = "C8", BROKER;
    /// X1: the consumer started processing the message ("consuming").
    ProcessStarted = "X1", CONSUMER;
    /// X2: the consumer finished processing: ok, or failed with an error text.
    ProcessFinished = "X2", CONSUMER;
    /// N1: the broker answered a consume request with a no-matching-message notice.
    NoMatch = "N1", BROKER;
    /// A1: the broker opened or refused a channel.
    Channel = "A1", BROKER;
    /// R1: a redelivery was scheduled (nack, ack timeout) or the message was dead-lettered.
    Redelivery = "R1", BROKER;
    /// D1: a duplicate upload (same producer and request ID) was suppressed.
    Duplicate = "D1", BROKER;
}

impl Stage {
    /// Whether a client with this role may report this stage through its channel.
    pub fn reportable_by(self, role: Role) -> bool {
        self.emitter() == Emitter::Client(role)
    }

    /// Whether the broker writes the stage about a delivery attempt: a delivery sent (C1, C5)
    /// or its settle received (C4, C8). R1 is the broker's too, but ends the attempt.
    pub fn is_deliver_side(self) -> bool {
        matches!(
            self,
            Stage::PushSent | Stage::PushAckReceived | Stage::PullSent | Stage::PullAckReceived
        )
    }

    /// Whether the consumer writes the stage about a delivery attempt: received (C2, C6),
    /// ack sent (C3, C7), processing started and finished (X1, X2).
    pub fn is_process_side(self) -> bool {
        matches!(
            self,
            Stage::PushReceived
                | Stage::PushAckSent
                | Stage::PullReceived
                | Stage::PullAckSent
                | Stage::ProcessStarted
                | Stage::ProcessFinished
        )
    }

    /// Whether the stage belongs to push delivery (C1–C4).
    pub fn is_push(self) -> bool {
        matches!(
            self,
            Stage::PushSent | Stage::PushReceived | Stage::PushAckSent | Stage::PushAckReceived
        )
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

impl Serialize for Stage {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.code())
    }
}

impl<'de> Deserialize<'de> for Stage {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for s in Stage::ALL {
            assert_eq!(s.code().parse::<Stage>().unwrap(), *s);
        }
        assert_eq!(Stage::ALL.len(), 18);
        assert!("Z9".parse::<Stage>().is_err());
    }

    #[test]
    fn roles_report_only_their_own_stages() {
        assert!(Stage::UploadSent.reportable_by(Role::Producer));
        assert!(!Stage::UploadSent.reportable_by(Role::Consumer));
        assert!(Stage::ProcessFinished.reportable_by(Role::Consumer));
        assert!(!Stage::Stored.reportable_by(Role::Producer));
        assert!(!Stage::PullAckReceived.reportable_by(Role::Consumer));
    }
}
