//! Settle batches ([`SettleBatch`]: acks, nacks and terms) and their replies ([`SettleResults`]).
//!
//! A settle batch comes in two versions of the frame format. Version 1 carries the settles
//! and, after them, reported records grouped by token. Version 2 (written when any settle
//! carries records of its own) adds to every settle the consumer's records of that delivery
//! (C2/C3, C6/C7, X1/X2): their proof is the settle's own token, so they carry none, and the
//! broker checks the token once for the settle and its records together.

use super::*;

// ---------------------------------------------------------------------------------------
// Settle batches
// ---------------------------------------------------------------------------------------

/// One settle of a settle batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettleEntry {
    /// The delivery's ack token.
    pub token: String,
    /// Ack, nack or term.
    pub kind: SettleKind,
    /// For a nack: redeliver after this delay.
    pub delay_ms: Option<u64>,
    /// For a nack or term: why, or empty.
    pub reason: String,
    /// The consumer's own records of this delivery (C2/C3, C6/C7, X1/X2), proven by `token`;
    /// the broker fills in what the token names (message, group, attempt, sequence, topic).
    /// Any record here makes the batch a version 2 frame.
    pub records: Vec<StageRecord>,
    /// Set by decoding when one of this settle's records breaks a grammar (then `records` is
    /// empty): the records are refused, the settle is not. Ignored by encoding.
    pub records_invalid: Option<String>,
}

impl SettleEntry {
    /// A settle of the delivery `token` without records of its own.
    pub fn new(token: impl Into<String>, kind: SettleKind) -> Self {
        SettleEntry {
            token: token.into(),
            kind,
            delay_ms: None,
            reason: String::new(),
            records: Vec::new(),
            records_invalid: None,
        }
    }
}

/// The frame version of a settle batch whose settles carry their own records.
pub const SETTLE_RECORDS_VERSION: u8 = 2;
/// Most records one settle carries (its delivery's C6, X1, X2, C7, and a few retries').
pub const MAX_ENTRY_RECORDS: usize = u8::MAX as usize;

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

pub(super) fn kind_byte(k: SettleKind) -> u8 {
    match k {
        SettleKind::Ack => 0,
        SettleKind::Nack => 1,
        SettleKind::Term => 2,
    }
}

impl SettleBatch {
    /// Encodes the batch.
    pub fn encode(&self) -> Bytes {
        let embedded = self.entries.iter().any(|e| !e.records.is_empty());
        let mut w = Writer::with_version(
            FrameKind::SettleBatch,
            if embedded {
                SETTLE_RECORDS_VERSION
            } else {
                VERSION
            },
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
            if embedded {
                let records = &e.records[..e.records.len().min(MAX_ENTRY_RECORDS)];
                w.u8(records.len() as u8);
                for r in records {
                    write_record(&mut w, r);
                }
            }
        }
        write_reports(&mut w, &self.reports);
        w.finish()
    }

    /// Decodes a batch.
    pub fn decode(bytes: &Bytes) -> Result<SettleBatch, FrameError> {
        let mut r = Reader::open_up_to(
            bytes,
            FrameKind::SettleBatch,
            "settle batch",
            SETTLE_RECORDS_VERSION,
        )?;
        let embedded = r.version == SETTLE_RECORDS_VERSION;
        let n = r.count(MAX_BATCH_ENTRIES, "settles")?;
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            let at = r.pos;
            let kind = match r.u8()? {
                0 => SettleKind::Ack,
                1 => SettleKind::Nack,
                2 => SettleKind::Term,
                other => return Err(r.err_at(at, format!("unknown settle kind {other}"))),
            };
            let delay_ms = match r.u8()? {
                0 => None,
                _ => Some(r.u64()?),
            };
            let token = r.str16()?;
            let reason = r.str16()?;
            let (records, records_invalid) = if embedded {
                read_entry_records(&mut r)?
            } else {
                (Vec::new(), None)
            };
            entries.push(SettleEntry {
                kind,
                delay_ms,
                token,
                reason,
                records,
                records_invalid,
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

/// Reads a settle's own records (`u8` count, then compact records): structurally always,
/// semantically as a whole — the first invalid one (1-based) refuses this settle's records.
fn read_entry_records(
    r: &mut Reader<'_>,
) -> Result<(Vec<StageRecord>, Option<String>), FrameError> {
    let n = r.u8()? as usize;
    let mut out = Vec::with_capacity(n);
    let mut bad = None;
    for i in 0..n {
        match read_record(r)? {
            Ok(rec) => out.push(rec),
            Err(e) if bad.is_none() => bad = Some(format!("record {}: {e}", i + 1)),
            Err(_) => {}
        }
    }
    Ok(match bad {
        None => (out, None),
        Some(e) => (Vec::new(), Some(e)),
    })
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
