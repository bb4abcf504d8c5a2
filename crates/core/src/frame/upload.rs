//! Upload batches ([`UploadBatch`]) and their per-entry replies ([`UploadResults`]).

use super::*;

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
