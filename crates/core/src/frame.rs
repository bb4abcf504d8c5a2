//! Binary frames of the batched message path (docs/PROTOCOL.md §18): upload batches and their
//! replies, delivery batches (fetch replies and pushes), settle batches and their replies,
//! client stage reports, and the stage stream's compact record encoding (version 2).
//!
//! Every frame starts with four bytes: `M`, `T`, a kind byte and the format version (1).
//! Integers are big-endian. Strings are UTF-8 with a length prefix: `str8` (u8 length),
//! `str16` (u16 length); payloads are `bytes32` (u32 length) and are sliced out of the frame
//! without copying. An empty string stands for an absent optional field.
//!
//! Decoding is strict: a truncated frame, a bad length, invalid UTF-8 or trailing bytes fail
//! the whole frame with a [`FrameError`] naming the byte offset. *Semantic* checks (is this a
//! valid topic, may this producer publish there) belong to the receiver and apply per entry,
//! so that one bad message never fails its neighbours.
//!
//! ## How the parts meet
//! The client SDK encodes [`UploadBatch`] and [`SettleBatch`] (each may carry
//! [`ReportedRecord`]s: the client's own stage records, riding along); the broker decodes
//! them, answers with [`UploadResults`] / [`SettleResults`], sends deliveries as a
//! [`DeliveryBatch`], and writes the stage stream with [`encode_stage_batch`]; the listener
//! reads it back with [`crate::record::decode_batch`], which accepts both this encoding and the
//! version 1 newline-delimited JSON.

use crate::ids::MessageId;
use crate::record::StageRecord;
use crate::stage::Stage;
use crate::wire::{AckKind, ErrorCode, WireError};
use bytes::Bytes;
use std::collections::BTreeMap;

/// The first two bytes of every frame.
pub const MAGIC: [u8; 2] = *b"MT";
/// The frame format version this code writes and reads.
pub const VERSION: u8 = 1;
/// Most entries in one upload, delivery or settle batch.
pub const MAX_BATCH_ENTRIES: usize = 1024;
/// Most reported records riding along one request.
pub const MAX_REPORTED_RECORDS: usize = 4096;

/// What a frame holds: its third byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// Upload batch request (client → broker).
    UploadBatch = b'U',
    /// Upload batch reply (broker → client).
    UploadResults = b'u',
    /// Delivered messages: a fetch reply or a push (broker → client).
    Deliveries = b'D',
    /// Settle batch request (client → broker).
    SettleBatch = b'S',
    /// Settle batch reply (broker → client).
    SettleResults = b's',
    /// A stage report: the client's own records (client → broker).
    Report = b'R',
    /// A stage-stream batch of compact records (broker → stage stream → listener).
    StageBatch = b'T',
}

impl FrameKind {
    fn from_byte(b: u8) -> Option<FrameKind> {
        Some(match b {
            b'U' => FrameKind::UploadBatch,
            b'u' => FrameKind::UploadResults,
            b'D' => FrameKind::Deliveries,
            b'S' => FrameKind::SettleBatch,
            b's' => FrameKind::SettleResults,
            b'R' => FrameKind::Report,
            b'T' => FrameKind::StageBatch,
            _ => return None,
        })
    }
}

/// The kind of a binary frame, or `None` when `bytes` is not one (a JSON body, say).
pub fn frame_kind(bytes: &[u8]) -> Option<FrameKind> {
    match bytes {
        [b'M', b'T', k, _, ..] => FrameKind::from_byte(*k),
        _ => None,
    }
}

/// Why a frame could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed {kind} frame at byte {offset}: {what}")]
pub struct FrameError {
    /// The frame kind expected, in words.
    pub kind: &'static str,
    /// Where decoding stopped.
    pub offset: usize,
    /// What was wrong.
    pub what: String,
}

impl From<FrameError> for WireError {
    fn from(e: FrameError) -> Self {
        WireError::new(ErrorCode::BadRequest, e.to_string())
    }
}

// ---------------------------------------------------------------------------------------
// Primitives
// ---------------------------------------------------------------------------------------

/// Appends frame fields to a buffer.
#[derive(Debug, Default)]
struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn new(kind: FrameKind, capacity: usize) -> Self {
        let mut buf = Vec::with_capacity(capacity + 4);
        buf.extend_from_slice(&MAGIC);
        buf.push(kind as u8);
        buf.push(VERSION);
        Writer { buf }
    }
    fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    /// Writes a string of at most 255 bytes (longer ones are cut at a character boundary).
    fn str8(&mut self, s: &str) {
        let s = cut(s, u8::MAX as usize);
        self.u8(s.len() as u8);
        self.buf.extend_from_slice(s.as_bytes());
    }
    /// Writes a string of at most 65,535 bytes (longer ones are cut at a character boundary).
    fn str16(&mut self, s: &str) {
        let s = cut(s, u16::MAX as usize);
        self.u16(s.len() as u16);
        self.buf.extend_from_slice(s.as_bytes());
    }
    fn bytes32(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.buf.extend_from_slice(b);
    }
    fn attrs(&mut self, attrs: &BTreeMap<String, String>) {
        self.u8(attrs.len().min(u8::MAX as usize) as u8);
        for (k, v) in attrs.iter().take(u8::MAX as usize) {
            self.str8(k);
            self.str16(v);
        }
    }
    fn error(&mut self, e: &WireError) {
        self.str8(e.code.as_str());
        self.str16(&e.message);
    }
    fn finish(self) -> Bytes {
        Bytes::from(self.buf)
    }
}

fn cut(s: &str, max: usize) -> &str {
    &s[..floor_char_boundary(s, max.min(s.len()))]
}

/// Reads frame fields from a buffer, slicing payloads without copying.
struct Reader<'a> {
    bytes: &'a [u8],
    /// The buffer `bytes` is, when payloads can be sliced out of it without copying.
    owner: Option<&'a Bytes>,
    pos: usize,
    kind: &'static str,
}

impl<'a> Reader<'a> {
    fn open(bytes: &'a Bytes, kind: FrameKind, name: &'static str) -> Result<Self, FrameError> {
        let mut r = Reader::open_slice(bytes, kind, name)?;
        r.owner = Some(bytes);
        Ok(r)
    }
    fn open_slice(
        bytes: &'a [u8],
        kind: FrameKind,
        name: &'static str,
    ) -> Result<Self, FrameError> {
        let mut r = Reader {
            bytes,
            owner: None,
            pos: 0,
            kind: name,
        };
        let head = r.take(4)?;
        if head[..2] != MAGIC || head[2] != kind as u8 {
            return Err(r.err_at(
                0,
                format!("not a {name} frame (expected M T {:?})", kind as u8 as char),
            ));
        }
        if head[3] != VERSION {
            return Err(r.err_at(3, format!("unsupported frame version {}", head[3])));
        }
        Ok(r)
    }
    fn err_at(&self, offset: usize, what: impl Into<String>) -> FrameError {
        FrameError {
            kind: self.kind,
            offset,
            what: what.into(),
        }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        let bytes = self.bytes;
        if bytes.len() - self.pos < n {
            return Err(self.err_at(
                self.pos,
                format!("needs {n} more bytes, {} left", bytes.len() - self.pos),
            ));
        }
        let s = &bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, FrameError> {
        Ok(u16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self) -> Result<u32, FrameError> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, FrameError> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn text(&mut self, n: usize) -> Result<String, FrameError> {
        let at = self.pos;
        let raw = self.take(n)?;
        std::str::from_utf8(raw)
            .map(str::to_owned)
            .map_err(|e| self.err_at(at, format!("invalid UTF-8: {e}")))
    }
    fn str8(&mut self) -> Result<String, FrameError> {
        let n = self.u8()? as usize;
        self.text(n)
    }
    fn str16(&mut self) -> Result<String, FrameError> {
        let n = self.u16()? as usize;
        self.text(n)
    }
    fn bytes32(&mut self) -> Result<Bytes, FrameError> {
        let n = self.u32()? as usize;
        let start = self.pos;
        let raw = self.take(n)?;
        Ok(match self.owner {
            Some(b) => b.slice(start..start + n),
            None => Bytes::copy_from_slice(raw),
        })
    }
    fn message_id(&mut self) -> Result<MessageId, FrameError> {
        let at = self.pos;
        let raw = self.take(16)?;
        MessageId::from_u128(u128::from_be_bytes(raw.try_into().expect("16 bytes")))
            .map_err(|e| self.err_at(at, e.to_string()))
    }
    /// Attributes as sent: keys are not validated here (the receiver does, per entry), but a
    /// key given twice is kept twice so that the receiver can refuse it.
    fn attrs(&mut self) -> Result<Vec<(String, String)>, FrameError> {
        let n = self.u8()? as usize;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push((self.str8()?, self.str16()?));
        }
        Ok(out)
    }
    fn count(&mut self, max: usize, what: &str) -> Result<usize, FrameError> {
        let at = self.pos;
        let n = self.u16()? as usize;
        if n > max {
            return Err(self.err_at(at, format!("{n} {what}; at most {max}")));
        }
        Ok(n)
    }
    fn error(&mut self) -> Result<WireError, FrameError> {
        let code = ErrorCode::parse(&self.str8()?);
        Ok(WireError::new(code, self.str16()?))
    }
    fn end(self) -> Result<(), FrameError> {
        if self.pos != self.bytes.len() {
            return Err(self.err_at(
                self.pos,
                format!("{} trailing bytes", self.bytes.len() - self.pos),
            ));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Compact stage records (stage stream v2, and the records clients report)
// ---------------------------------------------------------------------------------------

/// The stage's byte in the compact encoding: its position in [`Stage::ALL`] (P1 = 0, P2 = 1,
/// P3 = 2, P4 = 3, C1 = 4 … C8 = 11, X1 = 12, X2 = 13, N1 = 14, A1 = 15, R1 = 16, D1 = 17).
pub fn stage_byte(stage: Stage) -> u8 {
    Stage::ALL
        .iter()
        .position(|s| *s == stage)
        .expect("every stage is in Stage::ALL") as u8
}

const F_MESSAGE_ID: u16 = 1 << 0;
const F_REQUEST_ID: u16 = 1 << 1;
const F_PRODUCER: u16 = 1 << 2;
const F_CONSUMER: u16 = 1 << 3;
const F_GROUP: u16 = 1 << 4;
const F_TOPIC: u16 = 1 << 5;
const F_ATTEMPT: u16 = 1 << 6;
const F_STREAM_SEQ: u16 = 1 << 7;
const F_OUTCOME: u16 = 1 << 8;
const F_DETAIL: u16 = 1 << 9;
const F_SERVICE: u16 = 1 << 10;
const F_TRACEPARENT: u16 = 1 << 11;
const F_ATTRS: u16 = 1 << 12;
const F_PAYLOAD_SIZE: u16 = 1 << 13;
const F_PAYLOAD_HEAD: u16 = 1 << 14;
/// A flag without a value: the record's `by_id` (a decoder that predates it ignores it).
const F_BY_ID: u16 = 1 << 15;
/// Set in the stage byte when an extension byte follows the field bits: the 16 field bits
/// are all taken. A record without extended fields is encoded exactly as before it.
const STAGE_EXTENDED: u8 = 0x80;
/// Extension bit: the broker instance that wrote the record (`str8`).
const E_BROKER: u8 = 1 << 0;
/// Extension bit: JetStream's stored time of a delivered message (`u64`).
const E_STORED_AT: u8 = 1 << 1;
/// Extension bits this code knows; a record with another is refused (its value bytes
/// could not be skipped).
const E_KNOWN: u8 = E_BROKER | E_STORED_AT;

/// The extension byte of a record, 0 when it has no extended field.
fn extension_bits(r: &StageRecord) -> u8 {
    let mut ext = 0;
    if r.broker.is_some() {
        ext |= E_BROKER;
    }
    if r.stored_at.is_some() {
        ext |= E_STORED_AT;
    }
    ext
}

fn write_record(w: &mut Writer, r: &StageRecord) {
    let mut present = 0u16;
    let mut flag = |cond: bool, bit: u16| {
        if cond {
            present |= bit
        }
    };
    flag(r.message_id.is_some(), F_MESSAGE_ID);
    flag(r.request_id.is_some(), F_REQUEST_ID);
    flag(r.producer.is_some(), F_PRODUCER);
    flag(r.consumer.is_some(), F_CONSUMER);
    flag(r.group.is_some(), F_GROUP);
    flag(r.topic.is_some(), F_TOPIC);
    flag(r.attempt.is_some(), F_ATTEMPT);
    flag(r.stream_seq.is_some(), F_STREAM_SEQ);
    flag(r.outcome.is_some(), F_OUTCOME);
    flag(r.detail.is_some(), F_DETAIL);
    flag(r.service.is_some(), F_SERVICE);
    flag(r.traceparent.is_some(), F_TRACEPARENT);
    flag(!r.attrs.is_empty(), F_ATTRS);
    flag(r.payload_size.is_some(), F_PAYLOAD_SIZE);
    flag(r.payload_head.is_some(), F_PAYLOAD_HEAD);
    flag(r.by_id, F_BY_ID);
    let ext = extension_bits(r);
    w.u8(stage_byte(r.stage) | if ext != 0 { STAGE_EXTENDED } else { 0 });
    w.u64(r.at);
    w.u16(present);
    if ext != 0 {
        w.u8(ext);
    }
    if let Some(m) = r.message_id {
        w.buf.extend_from_slice(m.as_bytes());
    }
    if let Some(v) = &r.request_id {
        w.str8(v.as_str());
    }
    if let Some(v) = &r.producer {
        w.str8(v.as_str());
    }
    if let Some(v) = &r.consumer {
        w.str8(v.as_str());
    }
    if let Some(v) = &r.group {
        w.str8(v.as_str());
    }
    if let Some(v) = &r.topic {
        w.str16(v);
    }
    if let Some(v) = r.attempt {
        w.u32(v);
    }
    if let Some(v) = r.stream_seq {
        w.u64(v);
    }
    if let Some(v) = &r.outcome {
        w.str8(v);
    }
    if let Some(v) = &r.detail {
        w.str16(v);
    }
    if let Some(v) = &r.service {
        w.str8(v);
    }
    if let Some(v) = &r.traceparent {
        w.str8(v);
    }
    if !r.attrs.is_empty() {
        w.attrs(&r.attrs);
    }
    if let Some(v) = r.payload_size {
        w.u64(v);
    }
    if let Some(v) = &r.payload_head {
        w.str16(v);
    }
    write_extension_fields(w, r);
}

/// The values of the extension byte's fields, in bit order, after every other field.
fn write_extension_fields(w: &mut Writer, r: &StageRecord) {
    if let Some(v) = &r.broker {
        w.str8(v.as_str());
    }
    if let Some(v) = r.stored_at {
        w.u64(v);
    }
}

/// Reads one record. The outer error is structural (the frame cannot be read on); the inner
/// one is semantic (a field breaks its grammar: an unknown stage, a bad ID) and names the
/// first such field, the record's bytes having been read past all the same.
fn read_record(r: &mut Reader<'_>) -> Result<Result<StageRecord, String>, FrameError> {
    let code = r.u8()?;
    let at = r.u64()?;
    let present = r.u16()?;
    let ext_at = r.pos;
    let ext = if code & STAGE_EXTENDED != 0 {
        r.u8()?
    } else {
        0
    };
    if ext & !E_KNOWN != 0 {
        return Err(r.err_at(ext_at, format!("unknown extension bits {ext:#04x}")));
    }
    let code = code & !STAGE_EXTENDED;
    let has = |bit: u16| present & bit != 0;
    let mut bad: Option<String> = None;
    fn note(bad: &mut Option<String>, e: String) {
        if bad.is_none() {
            *bad = Some(e);
        }
    }
    let stage = match Stage::ALL.get(code as usize) {
        Some(s) => *s,
        None => {
            note(&mut bad, format!("unknown stage byte {code}"));
            Stage::UploadSent
        }
    };
    let mut rec = StageRecord::at(stage, at);
    if has(F_MESSAGE_ID) {
        let raw = r.take(16)?;
        match MessageId::from_u128(u128::from_be_bytes(raw.try_into().expect("16 bytes"))) {
            Ok(m) => rec.message_id = Some(m),
            Err(e) => note(&mut bad, e.to_string()),
        }
    }
    let client_id = |r: &mut Reader<'_>,
                     bad: &mut Option<String>|
     -> Result<Option<crate::ids::ClientId>, FrameError> {
        let text = r.str8()?;
        Ok(crate::ids::ClientId::new(text)
            .map_err(|e| note(bad, e.to_string()))
            .ok())
    };
    if has(F_REQUEST_ID) {
        let text = r.str8()?;
        match crate::ids::RequestId::new(text) {
            Ok(v) => rec.request_id = Some(v),
            Err(e) => note(&mut bad, e.to_string()),
        }
    }
    if has(F_PRODUCER) {
        rec.producer = client_id(r, &mut bad)?;
    }
    if has(F_CONSUMER) {
        rec.consumer = client_id(r, &mut bad)?;
    }
    if has(F_GROUP) {
        rec.group = client_id(r, &mut bad)?;
    }
    if has(F_TOPIC) {
        rec.topic = Some(r.str16()?);
    }
    if has(F_ATTEMPT) {
        rec.attempt = Some(r.u32()?);
    }
    if has(F_STREAM_SEQ) {
        rec.stream_seq = Some(r.u64()?);
    }
    if has(F_OUTCOME) {
        rec.outcome = Some(r.str8()?);
    }
    if has(F_DETAIL) {
        rec.detail = Some(r.str16()?);
    }
    if has(F_SERVICE) {
        rec.service = Some(r.str8()?);
    }
    if has(F_TRACEPARENT) {
        rec.traceparent = Some(r.str8()?);
    }
    if has(F_ATTRS) {
        rec.attrs = r.attrs()?.into_iter().collect();
    }
    if has(F_PAYLOAD_SIZE) {
        rec.payload_size = Some(r.u64()?);
    }
    rec.by_id = has(F_BY_ID);
    if has(F_PAYLOAD_HEAD) {
        rec.payload_head = Some(r.str16()?);
    }
    if ext & E_BROKER != 0 {
        let text = r.str8()?;
        match crate::ids::BrokerInstance::new(text) {
            Ok(v) => rec.broker = Some(v),
            Err(e) => note(&mut bad, e.to_string()),
        }
    }
    if ext & E_STORED_AT != 0 {
        rec.stored_at = Some(r.u64()?);
    }
    Ok(match bad {
        None => Ok(rec),
        Some(e) => Err(e),
    })
}

/// Encodes records as one stage-stream message (format version 2 of the stage stream).
pub fn encode_stage_batch<'a>(records: impl IntoIterator<Item = &'a StageRecord>) -> Vec<u8> {
    let mut w = Writer::new(FrameKind::StageBatch, 4096);
    let count_at = w.buf.len();
    w.u32(0);
    let mut n = 0u32;
    for r in records {
        write_record(&mut w, r);
        n += 1;
    }
    w.buf[count_at..count_at + 4].copy_from_slice(&n.to_be_bytes());
    w.buf
}

/// Decodes a stage-stream message written by [`encode_stage_batch`].
pub fn decode_stage_batch(bytes: &[u8]) -> Result<Vec<StageRecord>, FrameError> {
    let mut r = Reader::open_slice(bytes, FrameKind::StageBatch, "stage batch")?;
    let n = r.u32()? as usize;
    // Every record takes at least 11 bytes: a count beyond that is a lie.
    if n > (bytes.len() - r.pos) / 11 {
        return Err(r.err_at(4, format!("claims {n} records in {} bytes", bytes.len())));
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let start = r.pos;
        match read_record(&mut r)? {
            Ok(rec) => out.push(rec),
            Err(e) => return Err(r.err_at(start, e)),
        }
    }
    r.end()?;
    Ok(out)
}

/// A stage record a client reports, with the proof the broker asks for: the delivery's ack
/// token for consumer stages, the upload receipt for P4, none for P1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedRecord {
    /// The record as the client sees it; the broker fills in and checks who it belongs to.
    pub record: StageRecord,
    /// The proof, or empty.
    pub token: String,
}

/// Writes reported records grouped by proof: each distinct token once, then its records (a
/// delivery's C6, X1, X2 and C7 share one ack token, so it travels and is verified once).
fn write_reports(w: &mut Writer, reports: &[ReportedRecord]) {
    let reports = &reports[..reports.len().min(MAX_REPORTED_RECORDS)];
    // Groups in order of first appearance. Tokens are long (~200 bytes) and end in a MAC:
    // their last 16 characters key the lookup, the full text decides.
    let mut groups: Vec<(&str, Vec<&StageRecord>)> = Vec::new();
    let mut by_end: std::collections::HashMap<&str, Vec<usize>> = std::collections::HashMap::new();
    for rep in reports {
        let token = rep.token.as_str();
        let end = &token[floor_char_boundary(token, token.len().saturating_sub(16))..];
        let slot = by_end.entry(end).or_default();
        match slot.iter().find(|&&i| groups[i].0 == token) {
            Some(&i) => groups[i].1.push(&rep.record),
            None => {
                slot.push(groups.len());
                groups.push((token, vec![&rep.record]));
            }
        }
    }
    w.u16(groups.len() as u16);
    for (token, records) in groups {
        w.str16(token);
        w.u16(records.len() as u16);
        for r in records {
            write_record(w, r);
        }
    }
}

/// The largest character boundary of `s` at or below `i`.
fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Reads the reported records of a request: structurally always (the frame goes on after
/// them), semantically as a whole — the first invalid record (1-based) refuses them all
/// without failing the request they ride on.
fn read_reports(r: &mut Reader<'_>) -> Result<Result<Vec<ReportedRecord>, String>, FrameError> {
    let groups = r.count(MAX_REPORTED_RECORDS, "groups of reported records")?;
    let mut out = Vec::new();
    let mut bad = None;
    let mut seen = 0usize;
    for _ in 0..groups {
        let token = r.str16()?;
        let n = r.count(MAX_REPORTED_RECORDS - seen, "reported records")?;
        for _ in 0..n {
            seen += 1;
            match read_record(r)? {
                Ok(record) => out.push(ReportedRecord {
                    record,
                    token: token.clone(),
                }),
                Err(e) if bad.is_none() => bad = Some(format!("record {seen}: {e}")),
                Err(_) => {}
            }
        }
    }
    Ok(match bad {
        None => Ok(out),
        Some(e) => Err(e),
    })
}

/// Encodes a stage report (the client's records alone, no messages).
pub fn encode_report(reports: &[ReportedRecord]) -> Bytes {
    let mut w = Writer::new(FrameKind::Report, 64 * reports.len());
    write_reports(&mut w, reports);
    w.finish()
}

/// Decodes a stage report: the frame, then the records (the inner error names the first
/// invalid one).
pub fn decode_report(bytes: &Bytes) -> Result<Result<Vec<ReportedRecord>, String>, FrameError> {
    let mut r = Reader::open(bytes, FrameKind::Report, "stage report")?;
    let out = read_reports(&mut r)?;
    r.end()?;
    Ok(out)
}

/// What the broker made of the records that rode along a request: how many it accepted, or
/// why it refused them (accepted whole or refused whole).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReportsOutcome {
    /// Records accepted and relayed.
    pub accepted: u32,
    /// Why the records were refused, if they were.
    pub error: Option<WireError>,
}

fn write_outcome(w: &mut Writer, o: &ReportsOutcome) {
    w.u32(o.accepted);
    match &o.error {
        None => w.u8(0),
        Some(e) => {
            w.u8(1);
            w.error(e);
        }
    }
}

fn read_outcome(r: &mut Reader<'_>) -> Result<ReportsOutcome, FrameError> {
    let accepted = r.u32()?;
    let error = match r.u8()? {
        0 => None,
        _ => Some(r.error()?),
    };
    Ok(ReportsOutcome { accepted, error })
}

// ---------------------------------------------------------------------------------------
// Upload batches
// ---------------------------------------------------------------------------------------

/// One message of an upload batch, as sent (not yet validated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadEntry {
    /// The producer's request ID (idempotency key).
    pub request_id: String,
    /// The topic.
    pub topic: String,
    /// The upload attempt, from 1.
    pub attempt: u32,
    /// P1: when the producer sent this attempt (Unix ns, its clock); 0 when it reports no P1.
    pub sent_at: u64,
    /// A W3C traceparent to link to, or empty.
    pub traceparent: String,
    /// Attributes, in the order sent.
    pub attrs: Vec<(String, String)>,
    /// The payload.
    pub payload: Bytes,
}

/// An upload batch: messages, and the producer's own records riding along (P4s).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UploadBatch {
    /// The messages, answered in this order.
    pub entries: Vec<UploadEntry>,
    /// The producer's stage records (P4 with its receipt).
    pub reports: Vec<ReportedRecord>,
    /// Set by decoding when a reported record breaks a grammar (then `reports` is empty):
    /// the records are refused, the messages are not. Ignored by encoding.
    pub reports_invalid: Option<String>,
}

impl UploadBatch {
    /// Encodes the batch.
    pub fn encode(&self) -> Bytes {
        let size: usize = self
            .entries
            .iter()
            .map(|e| e.payload.len() + e.request_id.len() + e.topic.len() + 64)
            .sum();
        let mut w = Writer::new(FrameKind::UploadBatch, size + 128 * self.reports.len());
        w.u16(self.entries.len().min(MAX_BATCH_ENTRIES) as u16);
        for e in self.entries.iter().take(MAX_BATCH_ENTRIES) {
            w.str8(&e.request_id);
            w.str16(&e.topic);
            w.u32(e.attempt);
            w.u64(e.sent_at);
            w.str8(&e.traceparent);
            w.u8(e.attrs.len().min(u8::MAX as usize) as u8);
            for (k, v) in e.attrs.iter().take(u8::MAX as usize) {
                w.str8(k);
                w.str16(v);
            }
            w.bytes32(&e.payload);
        }
        write_reports(&mut w, &self.reports);
        w.finish()
    }

    /// Decodes a batch; payloads share `bytes`' memory.
    pub fn decode(bytes: &Bytes) -> Result<UploadBatch, FrameError> {
        let mut r = Reader::open(bytes, FrameKind::UploadBatch, "upload batch")?;
        let n = r.count(MAX_BATCH_ENTRIES, "messages")?;
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            entries.push(UploadEntry {
                request_id: r.str8()?,
                topic: r.str16()?,
                attempt: r.u32()?,
                sent_at: r.u64()?,
                traceparent: r.str8()?,
                attrs: r.attrs()?,
                payload: r.bytes32()?,
            });
        }
        let reports = read_reports(&mut r)?;
        r.end()?;
        let (reports, reports_invalid) = match reports {
            Ok(v) => (v, None),
            Err(e) => (Vec::new(), Some(e)),
        };
        Ok(UploadBatch {
            entries,
            reports,
            reports_invalid,
        })
    }
}

/// The broker's answer for one message of an upload batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UploadResult {
    /// Stored (or, with `duplicate`, already stored under the same request ID).
    Stored {
        /// The message ID (the original's for a duplicate).
        message_id: MessageId,
        /// Its sequence in the message stream.
        stream_seq: u64,
        /// True when the request ID was already stored within the dedup window.
        duplicate: bool,
        /// The signed receipt the producer's P4 must carry.
        receipt: String,
    },
    /// This message was refused; its neighbours were not affected.
    Refused(WireError),
}

/// The reply to an upload batch: one result per message, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UploadResults {
    /// Per-message results, in the order of the request.
    pub results: Vec<UploadResult>,
    /// What became of the records that rode along.
    pub reports: ReportsOutcome,
}

impl UploadResults {
    /// Encodes the reply.
    pub fn encode(&self) -> Bytes {
        let mut w = Writer::new(FrameKind::UploadResults, 96 * self.results.len() + 16);
        w.u16(self.results.len() as u16);
        for res in &self.results {
            match res {
                UploadResult::Stored {
                    message_id,
                    stream_seq,
                    duplicate,
                    receipt,
                } => {
                    w.u8(u8::from(*duplicate));
                    w.buf.extend_from_slice(message_id.as_bytes());
                    w.u64(*stream_seq);
                    w.str8(receipt);
                }
                UploadResult::Refused(e) => {
                    w.u8(2);
                    w.error(e);
                }
            }
        }
        write_outcome(&mut w, &self.reports);
        w.finish()
    }

    /// Decodes the reply.
    pub fn decode(bytes: &Bytes) -> Result<UploadResults, FrameError> {
        let mut r = Reader::open(bytes, FrameKind::UploadResults, "upload results")?;
        let n = r.count(MAX_BATCH_ENTRIES, "results")?;
        let mut results = Vec::with_capacity(n);
        for _ in 0..n {
            let at = r.pos;
            results.push(match r.u8()? {
                s @ (0 | 1) => UploadResult::Stored {
                    message_id: r.message_id()?,
                    stream_seq: r.u64()?,
                    duplicate: s == 1,
                    receipt: r.str8()?,
                },
                2 => UploadResult::Refused(r.error()?),
                other => return Err(r.err_at(at, format!("unknown result status {other}"))),
            });
        }
        let reports = read_outcome(&mut r)?;
        r.end()?;
        Ok(UploadResults { results, reports })
    }
}

// ---------------------------------------------------------------------------------------
// Deliveries (fetch replies and pushes)
// ---------------------------------------------------------------------------------------

/// One delivered message, payload as raw bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveredMessage {
    /// The message ID.
    pub message_id: MessageId,
    /// Its topic.
    pub topic: String,
    /// The producer that uploaded it.
    pub producer: String,
    /// The consumer group it was delivered to.
    pub group: String,
    /// 1 for the first delivery to this group, 2 for the first redelivery, …
    pub delivery_attempt: u32,
    /// Its sequence in the message stream.
    pub stream_seq: u64,
    /// Settle it with this token.
    pub ack_token: String,
    /// Its attributes.
    pub attributes: Vec<(String, String)>,
    /// The payload.
    pub payload: Bytes,
}

/// Delivered messages: the binary fetch reply, and each binary push.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeliveryBatch {
    /// The no-matching-message notice (fetch only; then `messages` is empty).
    pub no_matching_message: bool,
    /// The messages.
    pub messages: Vec<DeliveredMessage>,
}

impl DeliveryBatch {
    /// Encodes the batch.
    pub fn encode(&self) -> Bytes {
        let size: usize = self
            .messages
            .iter()
            .map(|m| m.payload.len() + m.ack_token.len() + m.topic.len() + 96)
            .sum();
        let mut w = Writer::new(FrameKind::Deliveries, size);
        w.u8(u8::from(self.no_matching_message));
        w.u16(self.messages.len() as u16);
        for m in &self.messages {
            w.buf.extend_from_slice(m.message_id.as_bytes());
            w.str16(&m.topic);
            w.str8(&m.producer);
            w.str8(&m.group);
            w.u32(m.delivery_attempt);
            w.u64(m.stream_seq);
            w.str16(&m.ack_token);
            w.u8(m.attributes.len().min(u8::MAX as usize) as u8);
            for (k, v) in m.attributes.iter().take(u8::MAX as usize) {
                w.str8(k);
                w.str16(v);
            }
            w.bytes32(&m.payload);
        }
        w.finish()
    }

    /// Decodes a batch; payloads share `bytes`' memory.
    pub fn decode(bytes: &Bytes) -> Result<DeliveryBatch, FrameError> {
        let mut r = Reader::open(bytes, FrameKind::Deliveries, "deliveries")?;
        let no_matching_message = r.u8()? != 0;
        let n = r.count(MAX_BATCH_ENTRIES, "messages")?;
        let mut messages = Vec::with_capacity(n);
        for _ in 0..n {
            messages.push(DeliveredMessage {
                message_id: r.message_id()?,
                topic: r.str16()?,
                producer: r.str8()?,
                group: r.str8()?,
                delivery_attempt: r.u32()?,
                stream_seq: r.u64()?,
                ack_token: r.str16()?,
                attributes: r.attrs()?,
                payload: r.bytes32()?,
            });
        }
        r.end()?;
        Ok(DeliveryBatch {
            no_matching_message,
            messages,
        })
    }
}

// ---------------------------------------------------------------------------------------
// Settle batches
// ---------------------------------------------------------------------------------------

/// One settle of a settle batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettleEntry {
    /// The delivery's ack token.
    pub token: String,
    /// Ack, nack or term.
    pub kind: AckKind,
    /// For a nack: redeliver after this delay.
    pub delay_ms: Option<u64>,
    /// For a nack or term: why, or empty.
    pub reason: String,
}

/// A settle batch: settles, and the consumer's own records riding along (C2/C3, C6/C7,
/// X1/X2, each with its delivery's token).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SettleBatch {
    /// The settles, answered in this order.
    pub entries: Vec<SettleEntry>,
    /// The consumer's stage records.
    pub reports: Vec<ReportedRecord>,
    /// Set by decoding when a reported record breaks a grammar (then `reports` is empty):
    /// the records are refused, the settles are not. Ignored by encoding.
    pub reports_invalid: Option<String>,
}

fn kind_byte(k: AckKind) -> u8 {
    match k {
        AckKind::Ack => 0,
        AckKind::Nack => 1,
        AckKind::Term => 2,
    }
}

impl SettleBatch {
    /// Encodes the batch.
    pub fn encode(&self) -> Bytes {
        let mut w = Writer::new(
            FrameKind::SettleBatch,
            self.entries.len() * 400 + self.reports.len() * 420,
        );
        w.u16(self.entries.len().min(MAX_BATCH_ENTRIES) as u16);
        for e in self.entries.iter().take(MAX_BATCH_ENTRIES) {
            w.u8(kind_byte(e.kind));
            match e.delay_ms {
                None => w.u8(0),
                Some(d) => {
                    w.u8(1);
                    w.u64(d);
                }
            }
            w.str16(&e.token);
            w.str16(&e.reason);
        }
        write_reports(&mut w, &self.reports);
        w.finish()
    }

    /// Decodes a batch.
    pub fn decode(bytes: &Bytes) -> Result<SettleBatch, FrameError> {
        let mut r = Reader::open(bytes, FrameKind::SettleBatch, "settle batch")?;
        let n = r.count(MAX_BATCH_ENTRIES, "settles")?;
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            let at = r.pos;
            let kind = match r.u8()? {
                0 => AckKind::Ack,
                1 => AckKind::Nack,
                2 => AckKind::Term,
                other => return Err(r.err_at(at, format!("unknown settle kind {other}"))),
            };
            let delay_ms = match r.u8()? {
                0 => None,
                _ => Some(r.u64()?),
            };
            entries.push(SettleEntry {
                kind,
                delay_ms,
                token: r.str16()?,
                reason: r.str16()?,
            });
        }
        let reports = read_reports(&mut r)?;
        r.end()?;
        let (reports, reports_invalid) = match reports {
            Ok(v) => (v, None),
            Err(e) => (Vec::new(), Some(e)),
        };
        Ok(SettleBatch {
            entries,
            reports,
            reports_invalid,
        })
    }
}

/// The reply to a settle batch: one result per settle, in order (`None` = settled).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SettleResults {
    /// Per-settle results: `None` when settled, the error when refused.
    pub results: Vec<Option<WireError>>,
    /// What became of the records that rode along.
    pub reports: ReportsOutcome,
}

impl SettleResults {
    /// Encodes the reply.
    pub fn encode(&self) -> Bytes {
        let mut w = Writer::new(FrameKind::SettleResults, 8 * self.results.len() + 16);
        w.u16(self.results.len() as u16);
        for res in &self.results {
            match res {
                None => w.u8(0),
                Some(e) => {
                    w.u8(2);
                    w.error(e);
                }
            }
        }
        write_outcome(&mut w, &self.reports);
        w.finish()
    }

    /// Decodes the reply.
    pub fn decode(bytes: &Bytes) -> Result<SettleResults, FrameError> {
        let mut r = Reader::open(bytes, FrameKind::SettleResults, "settle results")?;
        let n = r.count(MAX_BATCH_ENTRIES, "results")?;
        let mut results = Vec::with_capacity(n);
        for _ in 0..n {
            let at = r.pos;
            results.push(match r.u8()? {
                0 => None,
                2 => Some(r.error()?),
                other => return Err(r.err_at(at, format!("unknown result status {other}"))),
            });
        }
        let reports = read_outcome(&mut r)?;
        r.end()?;
        Ok(SettleResults { results, reports })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{ClientId, RequestId};

    fn full_record() -> StageRecord {
        let mut r = StageRecord::at(Stage::UploadReceived, 1_700_000_000_123_456_789);
        r.message_id = Some(MessageId::new());
        r.request_id = Some(RequestId::new("order-1").unwrap());
        r.producer = Some(ClientId::new("shop").unwrap());
        r.consumer = Some(ClientId::new("billing-1").unwrap());
        r.group = Some(ClientId::new("billing").unwrap());
        r.topic = Some("orders.eu".into());
        r.attempt = Some(2);
        r.stream_seq = Some(77);
        r.outcome = Some("ok".into());
        r.detail = Some("détail ✓".into());
        r.service = Some("msgtrail-broker".into());
        r.traceparent = Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into());
        r.attrs.insert("category".into(), "refund".into());
        r.payload_size = Some(128);
        r.payload_head = Some("aGVsbG8=".into());
        r
    }

    #[test]
    fn stage_batches_round_trip_every_field_and_stage() {
        let mut records = vec![full_record()];
        for s in Stage::ALL {
            records.push(StageRecord::at(*s, 5));
        }
        let bytes = Bytes::from(encode_stage_batch(&records));
        assert_eq!(frame_kind(&bytes), Some(FrameKind::StageBatch));
        assert_eq!(decode_stage_batch(&bytes).unwrap(), records);
        // The same records as JSON are several times larger.
        let json = crate::record::encode_batch(&records);
        assert!(
            bytes.len() * 2 < json.len(),
            "{} vs {}",
            bytes.len(),
            json.len()
        );
    }

    #[test]
    fn by_id_is_a_flag_without_bytes_and_absent_records_encode_as_before() {
        let mut r = StageRecord::at(Stage::PullSent, 5);
        let plain = encode_stage_batch([&r]);
        let plain_json = r.to_json();
        r.by_id = true;
        let flagged = encode_stage_batch([&r]);
        assert_eq!(plain.len(), flagged.len(), "no value bytes, one flag bit");
        assert_eq!(
            decode_stage_batch(&Bytes::from(flagged)).unwrap(),
            vec![r.clone()]
        );
        assert!(!plain_json.contains("by_id"));
        assert!(r.to_json().ends_with(r#","by_id":true}"#));
        let back: StageRecord = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn broker_instance_and_stored_time_ride_in_an_extension_byte() {
        let mut r = StageRecord::at(Stage::PullSent, 5);
        r.message_id = Some(MessageId::new());
        // A record without them is encoded as by a broker that predates them, and such a
        // record (written before the extension existed) decodes to none of them.
        let old = encode_stage_batch([&r]);
        assert_eq!(old[8], stage_byte(Stage::PullSent));
        let decoded = decode_stage_batch(&old).unwrap();
        assert_eq!(
            (decoded[0].broker.as_ref(), decoded[0].stored_at),
            (None, None)
        );
        r.broker = Some(crate::ids::BrokerInstance::new("b-1a2b3c4d").unwrap());
        r.stored_at = Some(4);
        let new = encode_stage_batch([&r]);
        assert_eq!(new[8], stage_byte(Stage::PullSent) | 0x80);
        assert_eq!(new.len(), old.len() + 1 + 1 + 10 + 8);
        assert_eq!(decode_stage_batch(&new).unwrap(), vec![r.clone()]);
        // An extension bit this code does not know is refused, naming where.
        let mut unknown = new.clone();
        unknown[8 + 1 + 8 + 2] |= 0x40;
        let err = decode_stage_batch(&unknown).unwrap_err();
        assert!(err.what.contains("extension"), "{err}");
        // Every field together still round-trips.
        let mut full = full_record();
        full.broker = r.broker.clone();
        full.stored_at = Some(u64::MAX);
        full.by_id = true;
        let bytes = encode_stage_batch([&full]);
        assert_eq!(decode_stage_batch(&bytes).unwrap(), vec![full]);
    }

    #[test]
    fn truncated_and_trailing_bytes_are_refused_with_an_offset() {
        let bytes = Bytes::from(encode_stage_batch(&[full_record()]));
        for cut in [3, 8, 20, bytes.len() - 1] {
            let err = decode_stage_batch(&bytes.slice(..cut)).unwrap_err();
            assert!(err.offset <= cut, "{err}");
        }
        let mut long = bytes.to_vec();
        long.push(0);
        let err = decode_stage_batch(&Bytes::from(long)).unwrap_err();
        assert!(err.what.contains("trailing"), "{err}");
        let err = decode_stage_batch(&Bytes::from_static(b"MTT\x09\0\0\0\0")).unwrap_err();
        assert!(err.what.contains("version"), "{err}");
        assert_eq!(frame_kind(b"{\"stage\":\"P1\"}"), None);
    }

    #[test]
    fn upload_batches_round_trip_with_empty_and_large_payloads() {
        let mut report = StageRecord::at(Stage::StoreConfirmed, 9);
        report.message_id = Some(MessageId::new());
        let batch = UploadBatch {
            entries: vec![
                UploadEntry {
                    request_id: "r1".into(),
                    topic: "orders.eu".into(),
                    attempt: 1,
                    sent_at: 42,
                    traceparent: String::new(),
                    attrs: vec![("category".into(), "refund".into())],
                    payload: Bytes::new(),
                },
                UploadEntry {
                    request_id: "r2".into(),
                    topic: "orders.us".into(),
                    attempt: 3,
                    sent_at: 0,
                    traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
                    attrs: vec![],
                    payload: Bytes::from(vec![7u8; 512 * 1024]),
                },
            ],
            reports: vec![ReportedRecord {
                record: report,
                token: "receipt".into(),
            }],
            reports_invalid: None,
        };
        let bytes = batch.encode();
        assert_eq!(UploadBatch::decode(&bytes).unwrap(), batch);

        let results = UploadResults {
            results: vec![
                UploadResult::Stored {
                    message_id: MessageId::new(),
                    stream_seq: 4,
                    duplicate: true,
                    receipt: "abc".into(),
                },
                UploadResult::Refused(WireError::new(ErrorCode::InvalidTopic, "bad topic")),
            ],
            reports: ReportsOutcome {
                accepted: 0,
                error: Some(WireError::new(ErrorCode::RecordNotOwned, "record 1: no")),
            },
        };
        assert_eq!(UploadResults::decode(&results.encode()).unwrap(), results);
    }

    #[test]
    fn deliveries_and_settles_round_trip() {
        let d = DeliveryBatch {
            no_matching_message: false,
            messages: vec![DeliveredMessage {
                message_id: MessageId::new(),
                topic: "orders.eu".into(),
                producer: "shop".into(),
                group: "billing".into(),
                delivery_attempt: 2,
                stream_seq: 9,
                ack_token: "tok".into(),
                attributes: vec![("k".into(), "v".into())],
                payload: Bytes::from_static(b"hello"),
            }],
        };
        assert_eq!(DeliveryBatch::decode(&d.encode()).unwrap(), d);
        let none = DeliveryBatch {
            no_matching_message: true,
            messages: vec![],
        };
        assert_eq!(DeliveryBatch::decode(&none.encode()).unwrap(), none);

        let s = SettleBatch {
            entries: vec![
                SettleEntry {
                    token: "a".into(),
                    kind: AckKind::Ack,
                    delay_ms: None,
                    reason: String::new(),
                },
                SettleEntry {
                    token: "b".into(),
                    kind: AckKind::Nack,
                    delay_ms: Some(0),
                    reason: "later".into(),
                },
                SettleEntry {
                    token: "c".into(),
                    kind: AckKind::Term,
                    delay_ms: None,
                    reason: "poison".into(),
                },
            ],
            reports: vec![],
            reports_invalid: None,
        };
        assert_eq!(SettleBatch::decode(&s.encode()).unwrap(), s);
        let r = SettleResults {
            results: vec![None, Some(WireError::new(ErrorCode::BadAckToken, "forged"))],
            reports: ReportsOutcome::default(),
        };
        assert_eq!(SettleResults::decode(&r.encode()).unwrap(), r);
    }

    #[test]
    fn an_invalid_reported_record_refuses_the_records_not_the_batch() {
        let mut bad = StageRecord::at(Stage::StoreConfirmed, 9);
        bad.request_id = Some(RequestId::new("r1").unwrap());
        let good = ReportedRecord {
            record: bad.clone(),
            token: "t".into(),
        };
        let batch = UploadBatch {
            entries: vec![UploadEntry {
                request_id: "r2".into(),
                topic: "t".into(),
                attempt: 1,
                sent_at: 1,
                traceparent: String::new(),
                attrs: vec![],
                payload: Bytes::from_static(b"x"),
            }],
            reports: vec![good.clone(), good],
            reports_invalid: None,
        };
        // Make the second record's request ID break the grammar (same length, a space).
        let mut bytes = batch.encode().to_vec();
        let pos = bytes.windows(2).rposition(|w| w == b"r1").unwrap();
        bytes[pos] = b' ';
        let decoded = UploadBatch::decode(&Bytes::from(bytes)).unwrap();
        assert_eq!(decoded.entries, batch.entries);
        assert!(decoded.reports.is_empty());
        let why = decoded.reports_invalid.unwrap();
        assert!(why.starts_with("record 2:"), "{why}");
    }

    #[test]
    fn reported_records_travel_grouped_by_token() {
        let rec = |stage, token: &str| ReportedRecord {
            record: StageRecord::at(stage, 5),
            token: token.into(),
        };
        let long = "t".repeat(300);
        let reports = vec![
            rec(Stage::PullReceived, &long),
            rec(Stage::StoreConfirmed, "receipt"),
            rec(Stage::ProcessStarted, &long),
            rec(Stage::PullAckSent, &long),
        ];
        let bytes = encode_report(&reports);
        assert!(
            bytes.len() < 2 * long.len(),
            "the long token is written once"
        );
        let got = decode_report(&bytes).unwrap().unwrap();
        let stages: Vec<Stage> = got.iter().map(|r| r.record.stage).collect();
        assert_eq!(
            stages,
            [
                Stage::PullReceived,
                Stage::ProcessStarted,
                Stage::PullAckSent,
                Stage::StoreConfirmed
            ]
        );
        assert!(got[..3].iter().all(|r| r.token == long));
        assert_eq!(got[3].token, "receipt");
    }

    #[test]
    fn counts_beyond_the_limits_are_refused() {
        let mut w = Writer::new(FrameKind::UploadBatch, 8);
        w.u16((MAX_BATCH_ENTRIES + 1) as u16);
        let err = UploadBatch::decode(&w.finish()).unwrap_err();
        assert!(err.what.contains("at most"), "{err}");
    }
}
