//! Settle batches ([`SettleBatch`]: acks, nacks and terms) and their replies ([`SettleResults`]).

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
                0 => SettleKind::Ack,
                1 => SettleKind::Nack,
                2 => SettleKind::Term,
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
