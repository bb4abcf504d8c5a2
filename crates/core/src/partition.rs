//! Stage partitions: which of the [`PARTITIONS`] slices of the stage stream a record belongs
//! to, so that every record of one message reaches the listeners that own its partition
//! (docs/ARCHITECTURE.md, decision 12).
//!
//! The partition of a record is the first of:
//! 1. its message ID's partition: the low four bits of the ID's last byte
//!    ([`Partition::of_message`]) — every record from P2 on, the relayed client records,
//!    recovered store evidence, late reports;
//! 2. the hash of its request ID (UTF-8 bytes, [`Partition::of_request`]) — a client's P1,
//!    which carries no message ID, kept under (producer, request ID) until a record carrying
//!    both IDs links it;
//! 3. the hash of its producer, else its consumer (UTF-8 bytes) — channel and subscription
//!    records (A1, N1) that belong to no message;
//! 4. nothing: partition 0.
//!
//! **One request, one partition.** The broker mints each message ID *in its request's
//! partition* ([`crate::MessageId::new_in`]: a UUIDv7 whose last four random bits are the
//! partition of the request ID), so a P1 (request ID only) and every record of the message
//! stored for it (message ID) land in the same partition, and the listener that owns it
//! links them as a single listener does — also for a request stored again after the dedup
//! window (a new message ID, the same partition). An ID minted otherwise (an older broker,
//! an observed message's UUIDv8) has random low bits: its records still share one
//! partition, evenly spread; only the link to a P1 of another partition is then missing.
//!
//! The hash is 64-bit FNV-1a over the key's bytes, taken modulo [`PARTITIONS`]: stable across
//! versions, languages and platforms (a client in another language computes the same
//! partition with a dozen lines) and cheap (one multiply per byte).
//!
//! Records are published on [`subject`]`(p)`, `msgtrail.stages.<p>`; the legacy
//! [`crate::subjects::STAGE_SUBJECT`] stays part of the stage stream, for brokers that do
//! not partition (a listener in a group reads it too and keeps the records of the
//! partitions it holds).

use crate::subjects::STAGE_SUBJECT;
use crate::StageRecord;
use std::fmt;

/// How many partitions the stage stream is split into. Fixed for a deployment: every broker
/// and listener computes partitions with this constant, and changing it moves records between
/// partitions (a new stage-stream version, not a setting).
pub const PARTITIONS: u16 = 16;

/// The bits of a message ID's last byte that name its partition ([`PARTITIONS`] − 1).
pub(crate) const PARTITION_BITS: u8 = (PARTITIONS - 1) as u8;
const _: () = assert!(PARTITIONS.is_power_of_two() && PARTITIONS <= 256);

/// One partition of the stage stream, `0..PARTITIONS`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct Partition(u16);

impl Partition {
    /// The partition numbered `n`, if it is below [`PARTITIONS`].
    pub fn new(n: u16) -> Option<Self> {
        (n < PARTITIONS).then_some(Partition(n))
    }

    /// Every partition, in order.
    pub fn all() -> impl Iterator<Item = Partition> {
        (0..PARTITIONS).map(Partition)
    }

    /// The partition's number.
    pub fn index(self) -> u16 {
        self.0
    }

    /// The partition of a key's bytes: FNV-1a 64 modulo [`PARTITIONS`].
    pub fn of_bytes(key: &[u8]) -> Self {
        Partition((fnv1a64(key) % u64::from(PARTITIONS)) as u16)
    }

    /// The partition of a message ID: the low four bits of its last byte (random in a
    /// UUIDv7, the request's partition in one minted by [`crate::MessageId::new_in`]).
    pub fn of_message(id: &crate::MessageId) -> Self {
        Partition(u16::from(id.as_bytes()[15] & PARTITION_BITS))
    }

    /// The partition of a request ID: the hash of its UTF-8 bytes.
    pub fn of_request(request: &crate::RequestId) -> Self {
        Self::of_bytes(request.as_str().as_bytes())
    }

    /// The partition of a record: by its partition key (module docs).
    pub fn of_record(r: &StageRecord) -> Self {
        if let Some(id) = &r.message_id {
            Self::of_message(id)
        } else if let Some(req) = &r.request_id {
            Self::of_request(req)
        } else if let Some(c) = r.producer.as_ref().or(r.consumer.as_ref()) {
            Self::of_bytes(c.as_str().as_bytes())
        } else {
            Partition(0)
        }
    }

    /// The partition's subject, `msgtrail.stages.<p>`.
    pub fn subject(self) -> String {
        subject(self)
    }
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The subject of a partition's stage batches, `msgtrail.stages.<p>`.
pub fn subject(p: Partition) -> String {
    format!("{STAGE_SUBJECT}.{}", p.0)
}

/// The wildcard that captures every partition's subject, `msgtrail.stages.*`.
pub fn wildcard() -> String {
    format!("{STAGE_SUBJECT}.*")
}

/// The partition a stage-stream subject names: `Some(p)` for `msgtrail.stages.<p>`, `None`
/// for the legacy subject and anything else.
pub fn of_subject(subject: &str) -> Option<Partition> {
    subject
        .strip_prefix(STAGE_SUBJECT)?
        .strip_prefix('.')?
        .parse()
        .ok()
        .and_then(Partition::new)
}

/// Splits records by partition, keeping their order within each partition; partitions
/// without records are left out.
pub fn split(records: impl IntoIterator<Item = StageRecord>) -> Vec<(Partition, Vec<StageRecord>)> {
    let mut by: Vec<Vec<StageRecord>> = (0..PARTITIONS).map(|_| Vec::new()).collect();
    for r in records {
        by[usize::from(Partition::of_record(&r).0)].push(r);
    }
    by.into_iter()
        .enumerate()
        .filter(|(_, v)| !v.is_empty())
        .map(|(p, v)| (Partition(p as u16), v))
        .collect()
}

/// 64-bit FNV-1a (offset basis 0xcbf29ce484222325, prime 0x100000001b3).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ClientId, MessageId, RequestId, Stage};

    fn record(stage: Stage) -> StageRecord {
        StageRecord::at(stage, 1)
    }

    #[test]
    fn fnv_matches_the_published_vectors() {
        // From the FNV reference (isthe.com/chongo/tech/comp/fnv): "" and "a".
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn a_message_id_has_one_partition_and_its_records_all_go_there() {
        let id = MessageId::new();
        let mut p2 = record(Stage::UploadReceived);
        p2.message_id = Some(id);
        p2.request_id = Some(RequestId::new("req-1").unwrap());
        let mut c8 = record(Stage::PullAckReceived);
        c8.message_id = Some(id);
        assert_eq!(Partition::of_record(&p2), Partition::of_message(&id));
        assert_eq!(Partition::of_record(&c8), Partition::of_message(&id));
    }

    #[test]
    fn a_request_and_the_message_minted_for_it_share_a_partition() {
        for i in 0..200 {
            let req = RequestId::new(format!("req-{i}")).unwrap();
            let mut p1 = record(Stage::UploadSent);
            p1.request_id = Some(req.clone());
            let id = MessageId::new_in(Partition::of_request(&req));
            let mut c8 = record(Stage::PullAckReceived);
            c8.message_id = Some(id);
            assert_eq!(
                Partition::of_record(&p1),
                Partition::of_record(&c8),
                "{req}"
            );
            // Still a UUIDv7 of now: the partition takes random bits only.
            assert_eq!(id.as_u128() >> 76 & 0xF, 7, "version 7: {id}");
            assert!(MessageId::from_u128(id.as_u128()).is_ok());
        }
        // The partition is in the ID itself: anyone computes it from the text form.
        let id: MessageId = "01a236af-0ba1-7175-aa0a-477e0f3bfac7".parse().unwrap();
        assert_eq!(Partition::of_message(&id).index(), 7);
    }

    #[test]
    fn orphans_go_by_request_id_and_channel_records_by_client() {
        let mut p1 = record(Stage::UploadSent);
        p1.request_id = Some(RequestId::new("req-1").unwrap());
        p1.producer = Some(ClientId::new("shop").unwrap());
        assert_eq!(Partition::of_record(&p1), Partition::of_bytes(b"req-1"));
        let mut a1 = record(Stage::Channel);
        a1.consumer = Some(ClientId::new("billing").unwrap());
        assert_eq!(Partition::of_record(&a1), Partition::of_bytes(b"billing"));
        assert_eq!(Partition::of_record(&record(Stage::Channel)).index(), 0);
    }

    #[test]
    fn message_ids_spread_over_every_partition() {
        let mut counts = [0u32; PARTITIONS as usize];
        for _ in 0..16_000 {
            counts[usize::from(Partition::of_message(&MessageId::new()).index())] += 1;
        }
        // 1,000 expected each; a fair hash stays well within ±20 %.
        assert!(counts.iter().all(|c| (800..1200).contains(c)), "{counts:?}");
    }

    #[test]
    fn subjects_round_trip_and_the_legacy_subject_has_no_partition() {
        for p in Partition::all() {
            assert_eq!(of_subject(&p.subject()), Some(p));
        }
        assert_eq!(subject(Partition(7)), "msgtrail.stages.7");
        assert_eq!(of_subject(STAGE_SUBJECT), None);
        assert_eq!(of_subject("msgtrail.stages.16"), None);
        assert_eq!(of_subject("msgtrail.stagesx.1"), None);
        assert!(Partition::new(PARTITIONS).is_none());
    }

    #[test]
    fn split_keeps_order_within_a_partition() {
        let id = MessageId::new();
        let recs: Vec<StageRecord> = (0..5)
            .map(|i| {
                let mut r = StageRecord::at(Stage::PushSent, i);
                r.message_id = Some(id);
                r
            })
            .collect();
        let parts = split(recs);
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].0, Partition::of_message(&id));
        let ats: Vec<u64> = parts[0].1.iter().map(|r| r.at).collect();
        assert_eq!(ats, vec![0, 1, 2, 3, 4]);
    }
}
