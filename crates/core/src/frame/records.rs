//! The compact stage-record encoding (stage stream version 2) and the records clients report
//! alongside an upload or settle batch ([`ReportedRecord`], [`ReportsOutcome`]).

use super::*;

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

// The field bits both compact layouts share ([`crate::record_fields`]); bit 15 is this
// layout's own.
use crate::record_fields as fields;
/// A flag without a value: the record's `by_id` (a decoder that predates it ignores it).
pub(super) const F_BY_ID: u16 = 1 << 15;
/// Set in the stage byte when an extension byte follows the field bits: the 16 field bits
/// are all taken. A record without extended fields is encoded exactly as before it.
pub(super) const STAGE_EXTENDED: u8 = 0x80;
/// Extension bit: the broker instance that wrote the record (`str8`).
pub(super) const E_BROKER: u8 = 1 << 0;
/// Extension bit: JetStream's stored time of a delivered message (`u64`).
pub(super) const E_STORED_AT: u8 = 1 << 1;
/// Extension bits this code knows; a record with another is refused (its value bytes
/// could not be skipped).
pub(super) const E_KNOWN: u8 = E_BROKER | E_STORED_AT;

/// The extension byte of a record, 0 when it has no extended field.
pub(super) fn extension_bits(r: &StageRecord) -> u8 {
    let mut ext = 0;
    if r.broker.is_some() {
        ext |= E_BROKER;
    }
    if r.stored_at.is_some() {
        ext |= E_STORED_AT;
    }
    ext
}

pub(super) fn write_record(w: &mut Writer, r: &StageRecord) {
    let present = fields::present(r) | if r.by_id { F_BY_ID } else { 0 };
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
pub(super) fn write_extension_fields(w: &mut Writer, r: &StageRecord) {
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
pub(super) fn read_record(r: &mut Reader<'_>) -> Result<Result<StageRecord, String>, FrameError> {
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
    if has(fields::MESSAGE_ID) {
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
    if has(fields::REQUEST_ID) {
        let text = r.str8()?;
        match crate::ids::RequestId::new(text) {
            Ok(v) => rec.request_id = Some(v),
            Err(e) => note(&mut bad, e.to_string()),
        }
    }
    if has(fields::PRODUCER) {
        rec.producer = client_id(r, &mut bad)?;
    }
    if has(fields::CONSUMER) {
        rec.consumer = client_id(r, &mut bad)?;
    }
    if has(fields::GROUP) {
        // A group name has a client ID's grammar.
        rec.group = client_id(r, &mut bad)?.map(crate::GroupId::from);
    }
    if has(fields::TOPIC) {
        rec.topic = Some(r.str16()?);
    }
    if has(fields::ATTEMPT) {
        rec.attempt = Some(r.u32()?);
    }
    if has(fields::STREAM_SEQ) {
        rec.stream_seq = Some(r.u64()?);
    }
    if has(fields::OUTCOME) {
        rec.outcome = Some(r.str8()?);
    }
    if has(fields::DETAIL) {
        rec.detail = Some(r.str16()?);
    }
    if has(fields::SERVICE) {
        rec.service = Some(r.str8()?);
    }
    if has(fields::TRACEPARENT) {
        rec.traceparent = Some(r.str8()?);
    }
    if has(fields::ATTRS) {
        rec.attrs = r.attrs()?.into_iter().collect();
    }
    if has(fields::PAYLOAD_SIZE) {
        rec.payload_size = Some(r.u64()?);
    }
    rec.by_id = has(F_BY_ID);
    if has(fields::PAYLOAD_HEAD) {
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
pub(super) fn write_reports(w: &mut Writer, reports: &[ReportedRecord]) {
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
pub(super) fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Reads the reported records of a request: structurally always (the frame goes on after
/// them), semantically as a whole — the first invalid record (1-based) refuses them all
/// without failing the request they ride on.
pub(super) fn read_reports(
    r: &mut Reader<'_>,
) -> Result<Result<Vec<ReportedRecord>, String>, FrameError> {
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

pub(super) fn write_outcome(w: &mut Writer, o: &ReportsOutcome) {
    w.u32(o.accepted);
    match &o.error {
        None => w.u8(0),
        Some(e) => {
            w.u8(1);
            w.error(e);
        }
    }
}

pub(super) fn read_outcome(r: &mut Reader<'_>) -> Result<ReportsOutcome, FrameError> {
    let accepted = r.u32()?;
    let error = match r.u8()? {
        0 => None,
        _ => Some(r.error()?),
    };
    Ok(ReportsOutcome { accepted, error })
}
