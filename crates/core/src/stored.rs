//! The msgtrail-only metadata of a stored message (docs/PROTOCOL.md §14.1): one compact
//! header, `Msgtrail-Stored`, in a versioned text layout, and a reader of both layouts —
//! that header, or the separate headers earlier brokers wrote (streams keep their messages
//! for days).
//!
//! ## How the parts meet
//! - The broker builds the header with [`encode`] when it stores an upload; what an operator
//!   needs stays in headers of its own (`Nats-Msg-Id` = `<producer>:<request id>`,
//!   `Msgtrail-Message-Id`, the topic in the subject).
//! - Every reader of stored messages (the broker's delivery path, its dead letters, the
//!   listener's store evidence, the test harness) calls [`read`] with a header lookup and gets
//!   [`StoredFields`], whichever layout the message has. Fields borrow from the header values;
//!   only an escaped service name is decoded into a new string.
//! - Malformed or unknown-version metadata is a [`StoredError`], never a guess.
//!
//! ## Layout version 1
//! `1;<request id>;<producer service>` with stage recording off, and
//! `1;<request id>;<producer service>;<attempt>;<received-at>;<broker service>` with it on
//! (attempt and received-at Unix nanoseconds in decimal). Request IDs cannot contain `;`,
//! `%` or spaces (`A-Z a-z 0-9 . _ : -`); service names are free text, so in them `%`, `;`,
//! space and every control character are written `%XX` (two uppercase hex digits of the byte).
//! A reader refuses any other field count, a bad escape, and a version it does not know: a
//! later layout gets a new version exactly so that earlier readers refuse it instead of
//! misreading it.

use crate::headers as h;
use std::borrow::Cow;

/// The layout version [`encode`] writes.
pub const VERSION: &str = "1";

/// What is wrong with a stored message's metadata.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoredError {
    /// `Msgtrail-Stored` has a version this reader does not know; none of its fields is read.
    #[error("Msgtrail-Stored layout version {0:?} is unknown to this reader")]
    UnknownVersion(String),
    /// `Msgtrail-Stored` does not follow its layout.
    #[error("malformed Msgtrail-Stored {value:?}: {reason}")]
    Malformed {
        /// The header value (at most 200 bytes of it).
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An old-layout message whose `Msgtrail-Received-At` is not Unix nanoseconds.
    #[error("Msgtrail-Received-At is {0:?}, not Unix nanoseconds")]
    ReceivedAt(String),
}

/// The store evidence of a message stored with stage recording on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreEvidence<'a> {
    /// The upload attempt; `None` when an old-layout `Msgtrail-Attempt` does not parse (an
    /// absent one means 1).
    pub attempt: Option<u32>,
    /// When the broker received the upload (P2), Unix nanoseconds.
    pub received_at: u64,
    /// The `service.name` of the broker that stored it.
    pub broker_service: Option<Cow<'a, str>>,
}

/// The msgtrail-only fields of a stored message, from either layout. Text fields are as
/// stored, not validated: callers wrap them in their ID types.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoredFields<'a> {
    /// The producer's request ID.
    pub request_id: Option<&'a str>,
    /// The producer ID (`Msgtrail-Producer`, or the part of `Nats-Msg-Id` before its first `:`).
    pub producer: Option<&'a str>,
    /// The producer's `service.name`.
    pub producer_service: Option<Cow<'a, str>>,
    /// The store evidence, when recorded.
    pub evidence: Option<StoreEvidence<'a>>,
    /// Whether the fields came from `Msgtrail-Stored` (else from the separate headers).
    pub compact: bool,
}

/// Appends the version-1 `Msgtrail-Stored` value to `out`; `evidence` is the attempt,
/// received-at nanos and broker service when stage recording is on.
pub fn encode(
    out: &mut String,
    request_id: &str,
    producer_service: &str,
    evidence: Option<(u32, u64, &str)>,
) {
    out.push_str(VERSION);
    out.push(';');
    out.push_str(request_id);
    out.push(';');
    escape_into(out, producer_service);
    if let Some((attempt, received_at, broker_service)) = evidence {
        out.push(';');
        push_decimal(out, u64::from(attempt));
        out.push(';');
        push_decimal(out, received_at);
        out.push(';');
        escape_into(out, broker_service);
    }
}

/// The producer ID in a `Nats-Msg-Id` of `<producer>:<request id>` (producer IDs have no `:`).
pub fn producer_of_msg_id(msg_id: &str) -> Option<&str> {
    msg_id
        .split_once(':')
        .map(|(p, _)| p)
        .filter(|p| !p.is_empty())
}

/// The producer ID of a stored message of either layout: `Msgtrail-Producer`, else from
/// `Nats-Msg-Id` (the delivery path's only need, without parsing `Msgtrail-Stored`).
pub fn producer<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Option<&'a str> {
    get(h::PRODUCER).or_else(|| get(h::NATS_MSG_ID).and_then(producer_of_msg_id))
}

/// Reads the msgtrail-only fields of a stored message through `get` (a header lookup by
/// name): from `Msgtrail-Stored` when present, else from the separate headers of earlier
/// brokers.
pub fn read<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Result<StoredFields<'a>, StoredError> {
    let producer = producer(&get);
    match get(h::STORED) {
        Some(value) => parse(value).map(|mut f| {
            f.producer = producer;
            f
        }),
        None => read_separate(&get, producer),
    }
}

/// The separate headers of earlier brokers.
fn read_separate<'a>(
    get: &impl Fn(&str) -> Option<&'a str>,
    producer: Option<&'a str>,
) -> Result<StoredFields<'a>, StoredError> {
    let evidence = match get(h::RECEIVED_AT) {
        None => None,
        Some(received) => Some(StoreEvidence {
            received_at: received
                .trim()
                .parse()
                .map_err(|_| StoredError::ReceivedAt(received.to_owned()))?,
            attempt: match get(h::ATTEMPT) {
                None => Some(1),
                Some(v) => v.trim().parse().ok(),
            },
            broker_service: get(h::BROKER_SERVICE).map(Cow::Borrowed),
        }),
    };
    Ok(StoredFields {
        request_id: get(h::REQUEST_ID),
        producer,
        producer_service: get(h::PRODUCER_SERVICE).map(Cow::Borrowed),
        evidence,
        compact: false,
    })
}

/// Parses a `Msgtrail-Stored` value (the producer is left to [`read`]).
pub fn parse(value: &str) -> Result<StoredFields<'_>, StoredError> {
    let bad = |reason| StoredError::Malformed {
        value: value.chars().take(200).collect(),
        reason,
    };
    let mut fields = value.split(';');
    let version = fields.next().unwrap_or_default();
    if version != VERSION {
        if version.is_empty() || !version.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("the first field is not a layout version"));
        }
        return Err(StoredError::UnknownVersion(version.to_owned()));
    }
    let (Some(request_id), Some(producer_service)) = (fields.next(), fields.next()) else {
        return Err(bad("fewer than 3 fields"));
    };
    if request_id.is_empty() {
        return Err(bad("empty request id"));
    }
    let producer_service = unescape(producer_service).ok_or_else(|| bad("bad %-escape"))?;
    let evidence = match fields.next() {
        None => None,
        Some(attempt) => {
            let (Some(received_at), Some(broker_service), None) =
                (fields.next(), fields.next(), fields.next())
            else {
                return Err(bad("neither 3 nor 6 fields"));
            };
            Some(StoreEvidence {
                attempt: Some(
                    parse_decimal(attempt)
                        .and_then(|a| u32::try_from(a).ok())
                        .ok_or_else(|| bad("attempt is not a whole number"))?,
                ),
                received_at: parse_decimal(received_at)
                    .ok_or_else(|| bad("received-at is not Unix nanoseconds"))?,
                broker_service: Some(unescape(broker_service).ok_or_else(|| bad("bad %-escape"))?),
            })
        }
    };
    Ok(StoredFields {
        request_id: Some(request_id),
        producer: None,
        producer_service: Some(producer_service),
        evidence,
        compact: true,
    })
}

/// Whether a service-name byte is written `%XX`.
fn needs_escape(b: u8) -> bool {
    b == b'%' || b == b';' || b == b' ' || b < 0x20 || b == 0x7f
}

/// Appends `s` with `%`, `;`, space and control characters escaped as `%XX`.
fn escape_into(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    if !s.bytes().any(needs_escape) {
        out.push_str(s);
        return;
    }
    for c in s.chars() {
        match u8::try_from(c).ok().filter(|&b| needs_escape(b)) {
            Some(b) => {
                out.push('%');
                out.push(HEX[usize::from(b >> 4)] as char);
                out.push(HEX[usize::from(b & 15)] as char);
            }
            None => out.push(c),
        }
    }
}

/// Undoes [`escape_into`]: borrowed when there is no escape; `None` for a bad escape (not two
/// hex digits, or bytes that are not UTF-8).
fn unescape(s: &str) -> Option<Cow<'_, str>> {
    if !s.contains('%') {
        return Some(Cow::Borrowed(s));
    }
    let hex = |b: u8| char::from(b).to_digit(16).map(|d| d as u8);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hi = hex(*bytes.get(i + 1)?)?;
            let lo = hex(*bytes.get(i + 2)?)?;
            out.push(hi << 4 | lo);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok().map(Cow::Owned)
}

/// Appends `n` in decimal without a formatter.
fn push_decimal(out: &mut String, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    out.push_str(std::str::from_utf8(&buf[i..]).unwrap_or_default());
}

/// A decimal number of 1–20 ASCII digits that fits a `u64`.
fn parse_decimal(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup<'a>(m: &'a HashMap<&'static str, String>) -> impl Fn(&str) -> Option<&'a str> {
        move |n| m.get(n).map(String::as_str)
    }

    fn encoded(service: &str, evidence: Option<(u32, u64, &str)>) -> String {
        let mut s = String::new();
        encode(&mut s, "ord-1:a.b", service, evidence);
        s
    }

    #[test]
    fn the_documented_values() {
        assert_eq!(encoded("shop-svc", None), "1;ord-1:a.b;shop-svc");
        assert_eq!(
            encoded("shop-svc", Some((2, 1_700_000_000_100_000_000, "broker-a"))),
            "1;ord-1:a.b;shop-svc;2;1700000000100000000;broker-a"
        );
        // The example of docs/PROTOCOL.md §14.1.
        let mut doc = String::new();
        encode(
            &mut doc,
            "order-43",
            "shop eu",
            Some((2, 1_764_000_000_123_456_789, "msgtrail-broker")),
        );
        assert_eq!(
            doc,
            "1;order-43;shop%20eu;2;1764000000123456789;msgtrail-broker"
        );
        assert_eq!(
            encoded("shop; 100%\n", Some((1, 0, "b"))),
            "1;ord-1:a.b;shop%3B%20100%25%0A;1;0;b"
        );
    }

    #[test]
    fn new_layout_round_trips_and_borrows() {
        for service in ["shop-svc", "shop; 100%", " edge ", "ünï;code\t", "%41"] {
            for ev in [None, Some((7, u64::MAX, "the broker; 2"))] {
                let value = encoded(service, ev);
                let f = parse(&value).unwrap();
                assert_eq!(f.request_id, Some("ord-1:a.b"));
                assert_eq!(f.producer_service.as_deref(), Some(service));
                assert!(f.compact);
                match ev {
                    None => assert_eq!(f.evidence, None),
                    Some((a, r, b)) => {
                        let e = f.evidence.unwrap();
                        assert_eq!((e.attempt, e.received_at), (Some(a), r));
                        assert_eq!(e.broker_service.as_deref(), Some(b));
                    }
                }
            }
        }
        let value = encoded("plain", Some((1, 5, "broker-a")));
        let f = parse(&value).unwrap();
        assert!(matches!(f.producer_service, Some(Cow::Borrowed(_))));
        assert!(matches!(
            f.evidence.unwrap().broker_service,
            Some(Cow::Borrowed(_))
        ));
    }

    #[test]
    fn read_takes_the_producer_from_nats_msg_id() {
        let m = HashMap::from([
            (h::NATS_MSG_ID, "shop:ord-1:a.b".to_owned()),
            (h::STORED, encoded("shop-svc", Some((2, 42, "broker-a")))),
        ]);
        let f = read(lookup(&m)).unwrap();
        assert_eq!(
            (f.producer, f.request_id),
            (Some("shop"), Some("ord-1:a.b"))
        );
        assert_eq!(f.evidence.unwrap().received_at, 42);
    }

    #[test]
    fn read_takes_the_old_layout() {
        let mut m = HashMap::from([
            (h::NATS_MSG_ID, "shop:ord-1".to_owned()),
            (h::REQUEST_ID, "ord-1".to_owned()),
            (h::PRODUCER, "shop".to_owned()),
            (h::PRODUCER_SERVICE, "shop svc".to_owned()),
            (h::ATTEMPT, "3".to_owned()),
            (h::RECEIVED_AT, "1700000000100000000".to_owned()),
            (h::BROKER_SERVICE, "broker-a".to_owned()),
        ]);
        let f = read(lookup(&m)).unwrap();
        assert!(!f.compact);
        assert_eq!(
            (f.request_id, f.producer, f.producer_service.as_deref()),
            (Some("ord-1"), Some("shop"), Some("shop svc"))
        );
        let e = f.evidence.unwrap();
        assert_eq!(
            (e.attempt, e.received_at, e.broker_service.as_deref()),
            (Some(3), 1_700_000_000_100_000_000, Some("broker-a"))
        );
        m.remove(h::ATTEMPT);
        assert_eq!(read(lookup(&m)).unwrap().evidence.unwrap().attempt, Some(1));
        m.remove(h::RECEIVED_AT);
        assert_eq!(read(lookup(&m)).unwrap().evidence, None);
        m.insert(h::RECEIVED_AT, "yesterday".into());
        assert!(matches!(
            read(lookup(&m)),
            Err(StoredError::ReceivedAt(v)) if v == "yesterday"
        ));
    }

    #[test]
    fn malformed_values_are_errors() {
        for value in [
            "",
            "x;ord;svc",
            "1",
            "1;ord",
            "1;;svc",
            "1;ord;svc;1",
            "1;ord;svc;1;2",
            "1;ord;svc;1;2;b;extra",
            "1;ord;svc;one;2;b",
            "1;ord;svc;1;-2;b",
            "1;ord;svc;99999999999;2;b",
            "1;ord;svc;1;99999999999999999999;b",
            "1;ord;sv%c;1;2;b",
            "1;ord;svc%4;",
            "1;ord;svc;1;2;%FF",
        ] {
            match parse(value) {
                Err(StoredError::Malformed { value: v, .. }) => assert_eq!(v, value),
                other => panic!("{value:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn an_unknown_version_is_refused_whole() {
        for value in ["2;ord;svc", "10", "2;anything at all;;;"] {
            let e = parse(value).unwrap_err();
            assert_eq!(
                e,
                StoredError::UnknownVersion(value.split(';').next().unwrap().into())
            );
            assert!(e.to_string().contains("unknown"), "{e}");
        }
    }
}
