//! Trace and span IDs computed from message IDs, so that no part has to propagate context.
//!
//! The derivation is part of the protocol (docs/PROTOCOL.md, "Trace IDs"); any language can
//! reproduce it with SHA-256:
//!
//! - **trace ID of a message** = the 16 bytes of its message ID (UUIDv7), unchanged.
//! - **span ID of a hop** = the first 8 bytes of `SHA-256(message-id-bytes ‖ hop-key)`, where
//!   `hop-key` is the UTF-8 text of [`Hop::key`] (`send`, `store`,
//!   `deliver/<group>/<consumer>/<attempt>`, `process/<group>/<consumer>/<attempt>`, and for
//!   a fetch by message ID the same with `/by-id` appended). An all-zero result (invalid in
//!   OpenTelemetry) becomes `00…01`.
//! - **trace ID of an orphan upload** (a P1 that never reached the broker, so it has no
//!   message ID) = the first 16 bytes of `SHA-256("msgtrail-orphan" ‖ 0x00 ‖ producer ‖ 0x00 ‖
//!   request-id)`, with the same zero rule.

use crate::ids::{ClientId, MessageId, RequestId};
use sha2::{Digest, Sha256};
use std::fmt;

/// One hop of a trajectory, the unit that becomes one span.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Hop<'a> {
    /// Producer side of the upload: P1 → P4.
    Send,
    /// Broker side of the upload: P2 → P3.
    Store,
    /// One delivery attempt to one consumer: C1 → C4 (push) or C5 → C8 (pull).
    Deliver {
        /// Consumer group.
        group: &'a str,
        /// Consumer ID.
        consumer: &'a str,
        /// Delivery attempt, from 1.
        attempt: u32,
    },
    /// The consumer processing one delivery: receive → ack, with X1/X2.
    Process {
        /// Consumer group.
        group: &'a str,
        /// Consumer ID.
        consumer: &'a str,
        /// Delivery attempt, from 1.
        attempt: u32,
    },
    /// One delivery attempt of a fetch by message ID (its own attempt count, apart from
    /// the group's subscriptions): C5 → C8.
    DeliverById {
        /// Consumer group.
        group: &'a str,
        /// Consumer ID.
        consumer: &'a str,
        /// Delivery attempt of the fetch by ID, from 1.
        attempt: u32,
    },
    /// The consumer processing one delivery of a fetch by message ID.
    ProcessById {
        /// Consumer group.
        group: &'a str,
        /// Consumer ID.
        consumer: &'a str,
        /// Delivery attempt of the fetch by ID, from 1.
        attempt: u32,
    },
}

impl<'a> Hop<'a> {
    /// The hop key hashed into the span ID (the [`Display`](fmt::Display) form), built
    /// directly: assembly makes one per hop and the formatting machinery costs several
    /// times the copying.
    pub fn key(&self) -> String {
        let (kind, group, consumer, attempt, by_id) = match *self {
            Hop::Send => return "send".to_owned(),
            Hop::Store => return "store".to_owned(),
            Hop::Deliver {
                group,
                consumer,
                attempt,
            } => ("deliver/", group, consumer, attempt, false),
            Hop::Process {
                group,
                consumer,
                attempt,
            } => ("process/", group, consumer, attempt, false),
            Hop::DeliverById {
                group,
                consumer,
                attempt,
            } => ("deliver/", group, consumer, attempt, true),
            Hop::ProcessById {
                group,
                consumer,
                attempt,
            } => ("process/", group, consumer, attempt, true),
        };
        let mut k = String::with_capacity(kind.len() + group.len() + consumer.len() + 18);
        k.push_str(kind);
        k.push_str(group);
        k.push('/');
        k.push_str(consumer);
        k.push('/');
        push_decimal(&mut k, attempt);
        if by_id {
            k.push_str("/by-id");
        }
        k
    }

    /// Reads a hop key (docs/PROTOCOL.md §13):
    ///
    /// ```text
    /// hop-key  = "send" / "store" / kind "/" group "/" consumer "/" attempt [ "/by-id" ]
    /// kind     = "deliver" / "process"   ; "/by-id": a delivery of a fetch by message ID
    /// group    = client-id            ; 1–64 of A-Z a-z 0-9 _ -
    /// consumer = client-id
    /// attempt  = 1*DIGIT              ; from 1
    /// ```
    pub fn parse(key: &'a str) -> Result<Hop<'a>, HopKeyError> {
        let bad = |why: &'static str| HopKeyError {
            key: key.to_owned(),
            why,
        };
        let mut parts = key.split('/');
        let kind = parts.next().unwrap_or_default();
        let hop = match kind {
            "send" => Hop::Send,
            "store" => Hop::Store,
            "deliver" | "process" => {
                let mut name = || {
                    parts
                        .next()
                        .filter(|p| !p.is_empty())
                        .ok_or_else(|| bad("a delivery hop names its group, consumer and attempt"))
                };
                let (group, consumer) = (name()?, name()?);
                let attempt = name()?
                    .parse()
                    .map_err(|_| bad("the attempt is not a number"))?;
                let by_id = match parts.next() {
                    None => false,
                    Some("by-id") => true,
                    Some(_) => {
                        return Err(bad("a delivery hop key ends with its attempt or /by-id"))
                    }
                };
                Hop::delivery(kind == "deliver", by_id, group, consumer, attempt)
            }
            _ => return Err(bad("unknown hop kind")),
        };
        match parts.next() {
            None => Ok(hop),
            Some(_) => Err(bad("too many parts")),
        }
    }
}

impl<'a> Hop<'a> {
    /// A deliver (or else process) hop, of a fetch by message ID or of a subscription.
    pub fn delivery(
        deliver: bool,
        by_id: bool,
        group: &'a str,
        consumer: &'a str,
        attempt: u32,
    ) -> Hop<'a> {
        match (deliver, by_id) {
            (true, false) => Hop::Deliver {
                group,
                consumer,
                attempt,
            },
            (false, false) => Hop::Process {
                group,
                consumer,
                attempt,
            },
            (true, true) => Hop::DeliverById {
                group,
                consumer,
                attempt,
            },
            (false, true) => Hop::ProcessById {
                group,
                consumer,
                attempt,
            },
        }
    }
}

impl fmt::Display for Hop<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Hop::Send => f.write_str("send"),
            Hop::Store => f.write_str("store"),
            Hop::Deliver {
                group,
                consumer,
                attempt,
            } => write!(f, "deliver/{group}/{consumer}/{attempt}"),
            Hop::Process {
                group,
                consumer,
                attempt,
            } => write!(f, "process/{group}/{consumer}/{attempt}"),
            Hop::DeliverById {
                group,
                consumer,
                attempt,
            } => write!(f, "deliver/{group}/{consumer}/{attempt}/by-id"),
            Hop::ProcessById {
                group,
                consumer,
                attempt,
            } => write!(f, "process/{group}/{consumer}/{attempt}/by-id"),
        }
    }
}

/// Appends `n` in decimal.
fn push_decimal(out: &mut String, mut n: u32) {
    let mut digits = [0u8; 10];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend(digits[i..].iter().map(|&d| char::from(d)));
}

/// A text that is not a hop key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid hop key {key:?}: {why}")]
pub struct HopKeyError {
    /// The text.
    pub key: String,
    /// What is wrong with it.
    pub why: &'static str,
}

/// The trace ID of a message: its 16 bytes.
pub fn trace_id(message_id: &MessageId) -> [u8; 16] {
    *message_id.as_bytes()
}

/// The span ID of one hop of a message (never all zero).
pub fn span_id(message_id: &MessageId, hop: &Hop<'_>) -> [u8; 8] {
    let mut h = Sha256::new();
    h.update(message_id.as_bytes());
    h.update(hop.key().as_bytes());
    let digest = h.finalize();
    let mut out = [0u8; 8];
    out.copy_from_slice(&digest[..8]);
    non_zero(&mut out);
    out
}

/// The trace ID of an upload that has no message ID (a P1 that never reached the broker).
pub fn orphan_trace_id(producer: &ClientId, request_id: &RequestId) -> [u8; 16] {
    let mut h = Sha256::new();
    h.update(b"msgtrail-orphan\0");
    h.update(producer.as_str().as_bytes());
    h.update([0u8]);
    h.update(request_id.as_str().as_bytes());
    let digest = h.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&digest[..16]);
    non_zero(&mut out);
    out
}

fn non_zero(bytes: &mut [u8]) {
    if bytes.iter().all(|b| *b == 0) {
        let last = bytes.len() - 1;
        bytes[last] = 1;
    }
}

/// Lowercase hex of a byte slice (trace and span IDs as OpenTelemetry prints them).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_id_is_the_message_id() {
        let id: MessageId = "0193a5f2-7c1e-7b2a-9f10-3c4d5e6f7a8b".parse().unwrap();
        assert_eq!(hex(&trace_id(&id)), "0193a5f27c1e7b2a9f103c4d5e6f7a8b");
    }

    #[test]
    fn span_ids_are_stable_distinct_and_documented() {
        let id: MessageId = "0193a5f2-7c1e-7b2a-9f10-3c4d5e6f7a8b".parse().unwrap();
        let send = span_id(&id, &Hop::Send);
        let store = span_id(&id, &Hop::Store);
        let d1 = span_id(
            &id,
            &Hop::Deliver {
                group: "g",
                consumer: "c",
                attempt: 1,
            },
        );
        let d2 = span_id(
            &id,
            &Hop::Deliver {
                group: "g",
                consumer: "c",
                attempt: 2,
            },
        );
        assert_ne!(send, store);
        assert_ne!(d1, d2);
        assert_eq!(send, span_id(&id, &Hop::Send));
        // Reference value, reproducible with:
        // python3 -c "import hashlib,uuid;print(hashlib.sha256(uuid.UUID('0193a5f2-7c1e-7b2a-9f10-3c4d5e6f7a8b').bytes+b'send').hexdigest()[:16])"
        assert_eq!(hex(&send), "48c7eb5f9750d85c");
    }

    #[test]
    fn the_built_key_is_the_display_form() {
        for attempt in [0, 1, 9, 10, 99, 100, 12_345, u32::MAX] {
            let (group, consumer) = ("grp", "c-1");
            let hops = [
                Hop::Send,
                Hop::Store,
                Hop::Deliver {
                    group,
                    consumer,
                    attempt,
                },
                Hop::Process {
                    group,
                    consumer,
                    attempt,
                },
                Hop::DeliverById {
                    group,
                    consumer,
                    attempt,
                },
                Hop::ProcessById {
                    group,
                    consumer,
                    attempt,
                },
            ];
            for h in hops {
                assert_eq!(h.key(), h.to_string());
            }
        }
    }

    #[test]
    fn hop_keys_round_trip_and_bad_ones_say_why() {
        let hops = [
            Hop::Send,
            Hop::Store,
            Hop::Deliver {
                group: "g",
                consumer: "c-1",
                attempt: 3,
            },
            Hop::Process {
                group: "g_2",
                consumer: "c",
                attempt: 1,
            },
            Hop::DeliverById {
                group: "g",
                consumer: "c-1",
                attempt: 3,
            },
            Hop::ProcessById {
                group: "g",
                consumer: "c-1",
                attempt: 1,
            },
        ];
        for h in hops {
            assert_eq!(Hop::parse(&h.key()), Ok(h.clone()));
        }
        for bad in [
            "",
            "nope",
            "deliver/g/c",
            "deliver/g/c/x",
            "deliver//c/1",
            "send/x",
            "store/",
            "deliver/g/c/1/by-id/2",
            "process/g/c/1/by",
        ] {
            let e = Hop::parse(bad).unwrap_err();
            assert_eq!(e.key, bad);
        }
        let by_id = Hop::DeliverById {
            group: "g",
            consumer: "c",
            attempt: 1,
        };
        assert_eq!(by_id.key(), "deliver/g/c/1/by-id");
        let id: MessageId = "0193a5f2-7c1e-7b2a-9f10-3c4d5e6f7a8b".parse().unwrap();
        let topic = Hop::Deliver {
            group: "g",
            consumer: "c",
            attempt: 1,
        };
        assert_ne!(span_id(&id, &by_id), span_id(&id, &topic));
    }

    #[test]
    fn orphan_trace_ids_depend_on_producer_and_request() {
        let p = ClientId::new("p1").unwrap();
        let q = ClientId::new("p2").unwrap();
        let r = RequestId::new("r-1").unwrap();
        assert_ne!(orphan_trace_id(&p, &r), orphan_trace_id(&q, &r));
        assert_eq!(orphan_trace_id(&p, &r), orphan_trace_id(&p, &r));
    }
}
