//! The byte-level primitives of the listener's stored forms: varints, length-prefixed
//! strings, message IDs, with a reader that checks every length against what is left and
//! fails with a [`CodecError`] naming the offset instead of panicking or guessing.
//! [`crate::store::records`] (a message's records) and [`crate::summary`] (its summary)
//! are written with them.

use msgtrail_core::MessageId;

/// Why a stored value did not decode.
#[derive(Debug, thiserror::Error)]
#[error("stored value is corrupt at byte {at}: {what}")]
pub struct CodecError {
    /// Where reading stopped.
    pub at: usize,
    /// What was wrong.
    pub what: String,
}

/// Appends primitives to a buffer.
#[derive(Debug, Default)]
pub(crate) struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// An empty writer with room for `n` bytes.
    pub(crate) fn with_capacity(n: usize) -> Self {
        Writer {
            buf: Vec::with_capacity(n),
        }
    }

    /// One byte.
    pub(crate) fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    /// An unsigned LEB128 varint.
    pub(crate) fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    /// A signed value as a zigzag varint (small magnitudes take few bytes either way).
    pub(crate) fn zigzag(&mut self, v: i64) {
        self.varint(((v << 1) ^ (v >> 63)) as u64);
    }

    /// Raw bytes.
    pub(crate) fn bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    /// A string: its length as a varint, then its bytes.
    pub(crate) fn str(&mut self, s: &str) {
        self.varint(s.len() as u64);
        self.bytes(s.as_bytes());
    }

    /// An optional string: a presence byte, then the string.
    pub(crate) fn opt_str(&mut self, s: Option<&str>) {
        match s {
            Some(s) => {
                self.u8(1);
                self.str(s);
            }
            None => self.u8(0),
        }
    }

    /// Bytes written so far.
    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }

    /// The bytes.
    pub(crate) fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads primitives from a slice, checking every length.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `bytes`.
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, pos: 0 }
    }

    /// An error at the current offset.
    pub(crate) fn fail<T>(&self, what: impl Into<String>) -> Result<T, CodecError> {
        Err(CodecError {
            at: self.pos,
            what: what.into(),
        })
    }

    /// One byte.
    pub(crate) fn u8(&mut self) -> Result<u8, CodecError> {
        match self.bytes.get(self.pos) {
            Some(b) => {
                self.pos += 1;
                Ok(*b)
            }
            None => self.fail("unexpected end"),
        }
    }

    /// `n` raw bytes.
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        match self.bytes.get(self.pos..self.pos.saturating_add(n)) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => self.fail(format!("{n} bytes announced past the end")),
        }
    }

    /// An unsigned LEB128 varint.
    pub(crate) fn varint(&mut self) -> Result<u64, CodecError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        self.fail("varint longer than 64 bits")
    }

    /// A zigzag varint.
    pub(crate) fn zigzag(&mut self) -> Result<i64, CodecError> {
        let z = self.varint()?;
        Ok(((z >> 1) as i64) ^ -((z & 1) as i64))
    }

    /// A count of items that each take at least one byte: more than the bytes left is a
    /// lie, refused before anything is allocated for it.
    pub(crate) fn count(&mut self) -> Result<usize, CodecError> {
        let n = self.varint()?;
        if n > (self.bytes.len() - self.pos) as u64 {
            return self.fail(format!(
                "{n} items announced in {} bytes",
                self.bytes.len() - self.pos
            ));
        }
        Ok(n as usize)
    }

    /// A string written by [`Writer::str`].
    pub(crate) fn str(&mut self) -> Result<&'a str, CodecError> {
        let n = self.count()?;
        let raw = self.take(n)?;
        std::str::from_utf8(raw).or_else(|e| self.fail(e.to_string()))
    }

    /// An optional string written by [`Writer::opt_str`].
    pub(crate) fn opt_str(&mut self) -> Result<Option<&'a str>, CodecError> {
        match self.u8()? {
            0 => Ok(None),
            1 => self.str().map(Some),
            b => self.fail(format!("presence byte {b}")),
        }
    }

    /// A message ID (16 bytes, big-endian), checked to be a UUIDv7.
    pub(crate) fn message_id(&mut self) -> Result<MessageId, CodecError> {
        let raw: [u8; 16] = self.take(16)?.try_into().expect("16 bytes");
        MessageId::from_u128(u128::from_be_bytes(raw)).or_else(|e| self.fail(e.to_string()))
    }

    /// Fails unless every byte was read.
    pub(crate) fn end(&self) -> Result<(), CodecError> {
        if self.pos != self.bytes.len() {
            return self.fail("bytes after the end");
        }
        Ok(())
    }
}
