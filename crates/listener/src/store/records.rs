//! The stored form of a message's records: one compact value per message (the `messages`
//! table), instead of one JSON row per record.
//!
//! A message's records repeat the same few strings (its topic, producer, request ID, its
//! consumers and groups, outcomes), so the value starts with a table of the distinct
//! strings and the records refer to them by index. The message ID is written once; a
//! record's time is a signed varint offset from the first record's. Twelve records of a
//! typical message take about 200 bytes, against about 3 KB as JSON rows.
//!
//! ```text
//! value   = version:u8 (1) · strings · has_id:u8 · [message id:16] · base_at:varint
//!           · count:varint · record*
//! strings = count:varint · (len:varint · utf-8)*
//! record  = stage:u8 · Δat:zigzag varint · fields:varint (bit set) · field values in bit order
//! ```
//! Decoding checks every index, length and ID, and fails with [`CodecError`] rather than
//! guess: a value that does not decode is corruption, which the store reports as such.

use msgtrail_core::codec::{CodecError, Reader as Bytes, Writer as Out};
use msgtrail_core::{BrokerInstance, ClientId, GroupId, MessageId, RequestId, Stage, StageRecord};

/// The version byte of the stored form.
const VERSION: u8 = 1;

// The field bits both compact layouts share ([`msgtrail_core::record_fields`], bits 0–14);
// the ones above are this layout's own.
use msgtrail_core::record_fields as fields;
/// The record's message ID differs from the value's (written in full after the bits).
const F_OTHER_MESSAGE_ID: u32 = 1 << 15;
/// A delivery fetched by message ID (no value bytes).
const F_BY_ID: u32 = 1 << 16;
/// The broker instance that wrote the record (a string index, after every older field).
const F_BROKER: u32 = 1 << 17;
/// JetStream's stored time of a delivery (a signed varint offset from the base time).
const F_STORED_AT: u32 = 1 << 18;

/// The records being written: their bytes, and the string table they refer to.
struct Writer<'a> {
    body: Out,
    /// The distinct strings so far. A message has a dozen or so, so a linear scan (most
    /// comparisons end at the length) beats hashing every string.
    strings: Vec<&'a str>,
}

impl<'a> Writer<'a> {
    /// Writes the index of `s` in the string table, adding it on first use.
    fn string(&mut self, s: &'a str) {
        let i = match self.strings.iter().position(|x| *x == s) {
            Some(i) => i,
            None => {
                self.strings.push(s);
                self.strings.len() - 1
            }
        };
        self.body.varint(i as u64);
    }
}

/// The message ID most records carry: the one the value is written under.
fn common_id(records: &[StageRecord]) -> Option<MessageId> {
    records.iter().find_map(|r| r.message_id)
}

/// Encodes a message's records.
pub(crate) fn encode(records: &[StageRecord]) -> Vec<u8> {
    let id = common_id(records);
    let base = records.iter().map(|r| r.at).min().unwrap_or(0);
    let mut w = Writer {
        body: Out::with_capacity(16 * records.len() + 32),
        strings: Vec::with_capacity(16),
    };
    for r in records {
        write_record(&mut w, r, id, base);
    }
    let mut out = Out::with_capacity(w.body.len() + 64);
    out.u8(VERSION);
    out.varint(w.strings.len() as u64);
    for s in &w.strings {
        out.str(s);
    }
    match id {
        Some(m) => {
            out.u8(1);
            out.bytes(m.as_bytes());
        }
        None => out.u8(0),
    }
    out.varint(base);
    out.varint(records.len() as u64);
    out.bytes(&w.body.finish());
    out.finish()
}

fn write_record<'a>(w: &mut Writer<'a>, r: &'a StageRecord, id: Option<MessageId>, base: u64) {
    let mut bits = u32::from(fields::present(r));
    let mut set = |cond: bool, bit: u32| {
        if cond {
            bits |= bit;
        }
    };
    set(
        r.message_id.is_some() && r.message_id != id,
        F_OTHER_MESSAGE_ID,
    );
    set(r.by_id, F_BY_ID);
    set(r.broker.is_some(), F_BROKER);
    set(r.stored_at.is_some(), F_STORED_AT);
    w.body.u8(msgtrail_core::frame::stage_byte(r.stage));
    w.body.zigzag(r.at.wrapping_sub(base) as i64);
    w.body.varint(u64::from(bits));
    if bits & F_OTHER_MESSAGE_ID != 0 {
        if let Some(m) = r.message_id {
            w.body.bytes(m.as_bytes());
        }
    }
    let strings = [
        r.request_id.as_ref().map(|v| v.as_str()),
        r.producer.as_ref().map(|v| v.as_str()),
        r.consumer.as_ref().map(|v| v.as_str()),
        r.group.as_ref().map(|v| v.as_str()),
        r.topic.as_deref(),
    ];
    for s in strings.into_iter().flatten() {
        w.string(s);
    }
    if let Some(v) = r.attempt {
        w.body.varint(u64::from(v));
    }
    if let Some(v) = r.stream_seq {
        w.body.varint(v);
    }
    for s in [
        r.outcome.as_deref(),
        r.detail.as_deref(),
        r.service.as_deref(),
    ]
    .into_iter()
    .flatten()
    {
        w.string(s);
    }
    if let Some(v) = &r.traceparent {
        w.string(v);
    }
    if !r.attrs.is_empty() {
        w.body.varint(r.attrs.len() as u64);
        for (k, v) in &r.attrs {
            w.string(k);
            w.string(v);
        }
    }
    if let Some(v) = r.payload_size {
        w.body.varint(v);
    }
    if let Some(v) = &r.payload_head {
        w.string(v);
    }
    if let Some(v) = &r.broker {
        w.string(v.as_str());
    }
    if let Some(v) = r.stored_at {
        w.body.zigzag(v.wrapping_sub(base) as i64);
    }
}

/// A value being read: its bytes and its string table.
struct Reader<'a> {
    bytes: Bytes<'a>,
    strings: Vec<&'a str>,
}

impl<'a> Reader<'a> {
    fn fail<T>(&self, what: impl Into<String>) -> Result<T, CodecError> {
        self.bytes.fail(what)
    }

    fn string(&mut self) -> Result<&'a str, CodecError> {
        let i = self.bytes.varint()? as usize;
        match self.strings.get(i) {
            Some(s) => Ok(s),
            None => self.fail(format!("string index {i} past the table")),
        }
    }

    fn client(&mut self) -> Result<ClientId, CodecError> {
        let s = self.string()?;
        ClientId::new(s).or_else(|e| self.fail(e.to_string()))
    }

    fn group(&mut self) -> Result<GroupId, CodecError> {
        let s = self.string()?;
        GroupId::new(s).or_else(|e| self.fail(e.to_string()))
    }
}

/// Decodes what [`encode`] wrote.
pub(crate) fn decode(bytes: &[u8]) -> Result<Vec<StageRecord>, CodecError> {
    let mut r = Reader {
        bytes: Bytes::new(bytes),
        strings: Vec::new(),
    };
    let version = r.bytes.u8()?;
    if version != VERSION {
        return r.fail(format!("unknown version {version}"));
    }
    let n = r.bytes.count()?;
    r.strings.reserve(n);
    for _ in 0..n {
        let s = r.bytes.str()?;
        r.strings.push(s);
    }
    let id = match r.bytes.u8()? {
        0 => None,
        _ => Some(r.bytes.message_id()?),
    };
    let base = r.bytes.varint()?;
    let count = r.bytes.count()?;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        out.push(read_record(&mut r, id, base)?);
    }
    r.bytes.end()?;
    Ok(out)
}

fn read_record(
    r: &mut Reader<'_>,
    id: Option<MessageId>,
    base: u64,
) -> Result<StageRecord, CodecError> {
    let code = r.bytes.u8()?;
    let Some(stage) = Stage::ALL.get(code as usize).copied() else {
        return r.fail(format!("unknown stage byte {code}"));
    };
    let delta = r.bytes.zigzag()?;
    let mut rec = StageRecord::at(stage, base.wrapping_add(delta as u64));
    let bits = u32::try_from(r.bytes.varint()?).or_else(|_| r.fail("field bits past 32"))?;
    let has = |bit: u32| bits & bit != 0;
    rec.by_id = has(F_BY_ID);
    if has(u32::from(fields::MESSAGE_ID)) {
        rec.message_id = if has(F_OTHER_MESSAGE_ID) {
            Some(r.bytes.message_id()?)
        } else {
            match id {
                Some(m) => Some(m),
                None => return r.fail("a record names the message but the value has no ID"),
            }
        };
    }
    if has(u32::from(fields::REQUEST_ID)) {
        let s = r.string()?;
        rec.request_id = Some(RequestId::new(s).or_else(|e| r.fail(e.to_string()))?);
    }
    if has(u32::from(fields::PRODUCER)) {
        rec.producer = Some(r.client()?);
    }
    if has(u32::from(fields::CONSUMER)) {
        rec.consumer = Some(r.client()?);
    }
    if has(u32::from(fields::GROUP)) {
        rec.group = Some(r.group()?);
    }
    if has(u32::from(fields::TOPIC)) {
        rec.topic = Some(r.string()?.to_owned());
    }
    if has(u32::from(fields::ATTEMPT)) {
        rec.attempt =
            Some(u32::try_from(r.bytes.varint()?).or_else(|_| r.fail("attempt past 32 bits"))?);
    }
    if has(u32::from(fields::STREAM_SEQ)) {
        rec.stream_seq = Some(r.bytes.varint()?);
    }
    if has(u32::from(fields::OUTCOME)) {
        rec.outcome = Some(r.string()?.to_owned());
    }
    if has(u32::from(fields::DETAIL)) {
        rec.detail = Some(r.string()?.to_owned());
    }
    if has(u32::from(fields::SERVICE)) {
        rec.service = Some(r.string()?.to_owned());
    }
    if has(u32::from(fields::TRACEPARENT)) {
        rec.traceparent = Some(r.string()?.to_owned());
    }
    if has(u32::from(fields::ATTRS)) {
        let n = r.bytes.varint()? as usize;
        for _ in 0..n {
            let k = r.string()?.to_owned();
            let v = r.string()?.to_owned();
            rec.attrs.insert(k, v);
        }
    }
    if has(u32::from(fields::PAYLOAD_SIZE)) {
        rec.payload_size = Some(r.bytes.varint()?);
    }
    if has(u32::from(fields::PAYLOAD_HEAD)) {
        rec.payload_head = Some(r.string()?.to_owned());
    }
    if has(F_BROKER) {
        let s = r.string()?;
        rec.broker = Some(BrokerInstance::new(s).or_else(|e| r.fail(e.to_string()))?);
    }
    if has(F_STORED_AT) {
        rec.stored_at = Some(base.wrapping_add(r.bytes.zigzag()? as u64));
    }
    Ok(rec)
}

/// A 64-bit fingerprint of a record's [`StageRecord::dedup_key`]: the store keeps these per
/// message to skip records it already holds (a redelivered batch), without the key strings.
pub(crate) fn dedup_hash(r: &StageRecord) -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    // Fingerprints live in memory only (a message's are recomputed from its records when it
    // is loaded), so the seed is per process: which records collide cannot be planned from
    // outside.
    static SEED: std::sync::LazyLock<foldhash::quality::RandomState> =
        std::sync::LazyLock::new(foldhash::quality::RandomState::default);
    let mut h = SEED.build_hasher();
    msgtrail_core::frame::stage_byte(r.stage).hash(&mut h);
    r.at.hash(&mut h);
    r.message_id.map(|m| m.as_u128()).hash(&mut h);
    r.request_id.as_ref().map(|v| v.as_str()).hash(&mut h);
    r.producer.as_ref().map(|v| v.as_str()).hash(&mut h);
    r.consumer.as_ref().map(|v| v.as_str()).hash(&mut h);
    r.group.as_ref().map(|v| v.as_str()).hash(&mut h);
    r.attempt.unwrap_or(0).hash(&mut h);
    r.is_recovered().hash(&mut h);
    r.by_id.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<StageRecord> {
        let m = MessageId::new();
        let mut p1 = StageRecord::at(Stage::UploadSent, 1_000_000_000_000_500);
        p1.request_id = Some(RequestId::new("order-1").unwrap());
        p1.producer = Some(ClientId::new("shop").unwrap());
        p1.topic = Some("orders.created".into());
        p1.traceparent = Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into());
        let mut p2 = p1.clone();
        p2.stage = Stage::UploadReceived;
        p2.at = 1_000_000_000_000_000; // earlier than P1: a negative offset
        p2.message_id = Some(m);
        p2.attrs.insert("category".into(), "refund".into());
        p2.payload_size = Some(128);
        p2.payload_head = Some("aGVsbG8=".into());
        p2.service = Some("msgtrail-broker".into());
        p2.broker = Some(BrokerInstance::new("b-1a2b3c4d").unwrap());
        let mut c5 = StageRecord::at(Stage::PullSent, 1_000_000_000_000_900);
        c5.message_id = Some(m);
        c5.broker = p2.broker.clone();
        c5.stored_at = Some(999_999_999_999_000); // before the base time: negative
        let mut x2 = StageRecord::at(Stage::ProcessFinished, u64::MAX);
        x2.message_id = Some(m);
        x2.consumer = Some(ClientId::new("billing-1").unwrap());
        x2.group = Some(GroupId::new("billing").unwrap());
        x2.attempt = Some(3);
        x2.outcome = Some("failed".into());
        x2.detail = Some("timeout ✗".into());
        x2.by_id = true;
        let mut other = StageRecord::at(Stage::Stored, 0);
        other.message_id = Some(MessageId::new());
        other.stream_seq = Some(u64::MAX);
        vec![p1, p2, c5, x2, other]
    }

    #[test]
    fn round_trip_keeps_every_field() {
        let recs = sample();
        let bytes = encode(&recs);
        assert_eq!(decode(&bytes).unwrap(), recs);
        assert_eq!(decode(&encode(&[])).unwrap(), Vec::<StageRecord>::new());
    }

    #[test]
    fn compact() {
        let recs = sample();
        let json: usize = recs.iter().map(|r| r.to_json().len()).sum();
        assert!(
            encode(&recs).len() * 2 < json,
            "{} vs {json}",
            encode(&recs).len()
        );
    }

    #[test]
    fn every_truncation_and_corruption_is_an_error() {
        let bytes = encode(&sample());
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n]).is_err(), "truncated at {n}");
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(decode(&extra).is_err());
        // No flipped byte panics (most are caught, some decode to other valid values).
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0xff;
            let _ = decode(&b);
        }
    }

    #[test]
    fn a_stored_group_that_is_not_a_group_name_is_an_error() {
        let mut r = StageRecord::at(Stage::ProcessStarted, 1_000_000_000_000_000);
        r.message_id = Some(MessageId::new());
        r.group = Some(GroupId::new("billing").unwrap());
        let mut bytes = encode(std::slice::from_ref(&r));
        assert_eq!(decode(&bytes).unwrap(), vec![r]);
        let pos = bytes.windows(7).position(|w| w == b"billing").unwrap();
        bytes[pos + 3] = b' ';
        assert!(decode(&bytes).is_err());
    }

    #[test]
    fn dedup_hash_follows_the_dedup_key() {
        let recs = sample();
        let mut again = recs[0].clone();
        assert_eq!(dedup_hash(&again), dedup_hash(&recs[0]));
        // Fields outside the dedup key (the detail, attributes) do not change it.
        again.detail = Some("x".into());
        assert_eq!(dedup_hash(&again), dedup_hash(&recs[0]));
        again.attempt = Some(2);
        assert_ne!(dedup_hash(&again), dedup_hash(&recs[0]));
        let mut recovered = recs[1].clone();
        recovered.outcome = Some(msgtrail_core::RECOVERED.into());
        assert_ne!(dedup_hash(&recovered), dedup_hash(&recs[1]));
    }
}
