//! Primitives of every frame: a [`Writer`] appending fields and a [`Reader`] taking them
//! back strictly (a bad length or truncated field is a [`FrameError`] naming the offset).

use super::*;

// ---------------------------------------------------------------------------------------
// Primitives
// ---------------------------------------------------------------------------------------

/// Appends frame fields to a buffer.
#[derive(Debug, Default)]
pub(super) struct Writer {
    pub(super) buf: Vec<u8>,
}

impl Writer {
    pub(super) fn new(kind: FrameKind, capacity: usize) -> Self {
        Writer::with_version(kind, VERSION, capacity)
    }
    /// A frame of a later format version (the kinds that have one say what it adds).
    pub(super) fn with_version(kind: FrameKind, version: u8, capacity: usize) -> Self {
        let mut buf = Vec::with_capacity(capacity + 4);
        buf.extend_from_slice(&MAGIC);
        buf.push(kind as u8);
        buf.push(version);
        Writer { buf }
    }
    pub(super) fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub(super) fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    pub(super) fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    pub(super) fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    /// Writes a string of at most 255 bytes (longer ones are cut at a character boundary).
    pub(super) fn str8(&mut self, s: &str) {
        let s = cut(s, u8::MAX as usize);
        self.u8(s.len() as u8);
        self.buf.extend_from_slice(s.as_bytes());
    }
    /// Writes a string of at most 65,535 bytes (longer ones are cut at a character boundary).
    pub(super) fn str16(&mut self, s: &str) {
        let s = cut(s, u16::MAX as usize);
        self.u16(s.len() as u16);
        self.buf.extend_from_slice(s.as_bytes());
    }
    pub(super) fn bytes32(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.buf.extend_from_slice(b);
    }
    pub(super) fn attrs(&mut self, attrs: &BTreeMap<String, String>) {
        self.u8(attrs.len().min(u8::MAX as usize) as u8);
        for (k, v) in attrs.iter().take(u8::MAX as usize) {
            self.str8(k);
            self.str16(v);
        }
    }
    pub(super) fn error(&mut self, e: &WireError) {
        self.str8(e.code.as_str());
        self.str16(&e.message);
    }
    pub(super) fn finish(self) -> Bytes {
        Bytes::from(self.buf)
    }
}

pub(super) fn cut(s: &str, max: usize) -> &str {
    &s[..floor_char_boundary(s, max.min(s.len()))]
}

/// Reads frame fields from a buffer, slicing payloads without copying.
pub(super) struct Reader<'a> {
    pub(super) bytes: &'a [u8],
    /// The buffer `bytes` is, when payloads can be sliced out of it without copying.
    pub(super) owner: Option<&'a Bytes>,
    pub(super) pos: usize,
    pub(super) kind: &'static str,
    /// The frame's format version (1 unless the kind has later ones).
    pub(super) version: u8,
}

impl<'a> Reader<'a> {
    pub(super) fn open(
        bytes: &'a Bytes,
        kind: FrameKind,
        name: &'static str,
    ) -> Result<Self, FrameError> {
        let mut r = Reader::open_slice(bytes, kind, name)?;
        r.owner = Some(bytes);
        Ok(r)
    }
    /// Opens a frame of `kind` in any format version from 1 to `newest`.
    pub(super) fn open_up_to(
        bytes: &'a Bytes,
        kind: FrameKind,
        name: &'static str,
        newest: u8,
    ) -> Result<Self, FrameError> {
        let mut r = Reader::open_versions(bytes, kind, name, newest)?;
        r.owner = Some(bytes);
        Ok(r)
    }
    pub(super) fn open_slice(
        bytes: &'a [u8],
        kind: FrameKind,
        name: &'static str,
    ) -> Result<Self, FrameError> {
        Reader::open_versions(bytes, kind, name, VERSION)
    }
    fn open_versions(
        bytes: &'a [u8],
        kind: FrameKind,
        name: &'static str,
        newest: u8,
    ) -> Result<Self, FrameError> {
        let mut r = Reader {
            bytes,
            owner: None,
            pos: 0,
            kind: name,
            version: VERSION,
        };
        let head = r.take(4)?;
        if head[..2] != MAGIC || head[2] != kind as u8 {
            return Err(r.err_at(
                0,
                format!("not a {name} frame (expected M T {:?})", kind as u8 as char),
            ));
        }
        if !(VERSION..=newest).contains(&head[3]) {
            return Err(r.err_at(3, format!("unsupported frame version {}", head[3])));
        }
        r.version = head[3];
        Ok(r)
    }
    pub(super) fn err_at(&self, offset: usize, what: impl Into<String>) -> FrameError {
        FrameError {
            kind: self.kind,
            offset,
            what: what.into(),
        }
    }
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
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
    pub(super) fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.take(1)?[0])
    }
    pub(super) fn u16(&mut self) -> Result<u16, FrameError> {
        Ok(u16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    pub(super) fn u32(&mut self) -> Result<u32, FrameError> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    pub(super) fn u64(&mut self) -> Result<u64, FrameError> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    pub(super) fn text(&mut self, n: usize) -> Result<String, FrameError> {
        let at = self.pos;
        let raw = self.take(n)?;
        std::str::from_utf8(raw)
            .map(str::to_owned)
            .map_err(|e| self.err_at(at, format!("invalid UTF-8: {e}")))
    }
    pub(super) fn str8(&mut self) -> Result<String, FrameError> {
        let n = self.u8()? as usize;
        self.text(n)
    }
    pub(super) fn str16(&mut self) -> Result<String, FrameError> {
        let n = self.u16()? as usize;
        self.text(n)
    }
    pub(super) fn bytes32(&mut self) -> Result<Bytes, FrameError> {
        let n = self.u32()? as usize;
        let start = self.pos;
        let raw = self.take(n)?;
        Ok(match self.owner {
            Some(b) => b.slice(start..start + n),
            None => Bytes::copy_from_slice(raw),
        })
    }
    pub(super) fn message_id(&mut self) -> Result<MessageId, FrameError> {
        let at = self.pos;
        let raw = self.take(16)?;
        MessageId::from_u128(u128::from_be_bytes(raw.try_into().expect("16 bytes")))
            .map_err(|e| self.err_at(at, e.to_string()))
    }
    /// Attributes as sent: keys are not validated here (the receiver does, per entry), but a
    /// key given twice is kept twice so that the receiver can refuse it.
    pub(super) fn attrs(&mut self) -> Result<Vec<(String, String)>, FrameError> {
        let n = self.u8()? as usize;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push((self.str8()?, self.str16()?));
        }
        Ok(out)
    }
    pub(super) fn count(&mut self, max: usize, what: &str) -> Result<usize, FrameError> {
        let at = self.pos;
        let n = self.u16()? as usize;
        if n > max {
            return Err(self.err_at(at, format!("{n} {what}; at most {max}")));
        }
        Ok(n)
    }
    pub(super) fn error(&mut self) -> Result<WireError, FrameError> {
        let code = ErrorCode::parse(&self.str8()?);
        Ok(WireError::new(code, self.str16()?))
    }
    pub(super) fn end(self) -> Result<(), FrameError> {
        if self.pos != self.bytes.len() {
            return Err(self.err_at(
                self.pos,
                format!("{} trailing bytes", self.bytes.len() - self.pos),
            ));
        }
        Ok(())
    }
}
