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
//!
//! Here live the header every frame shares ([`FrameKind`], [`FrameError`]); `codec` holds
//! the field writer and strict reader the others encode with; `records` the compact stage
//! records and client reports; `upload`, `delivery` and `settle` one batch kind each.

use crate::ids::MessageId;
use crate::record::StageRecord;
use crate::stage::Stage;
use crate::wire::{ErrorCode, SettleKind, WireError};
use bytes::Bytes;
use std::collections::BTreeMap;

mod codec;
mod delivery;
mod records;
mod settle;
mod upload;
use codec::*;
pub use delivery::*;
pub use records::*;
pub use settle::*;
pub use upload::*;
#[cfg(test)]
mod tests;

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
