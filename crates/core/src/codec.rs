//! The one binary codec of msgtrail's compact forms: LEB128 varints, zigzag integers,
//! length-prefixed strings and message IDs, written by a [`Writer`] and read back strictly by
//! a [`Reader`] that checks every length against what is left and fails with a
//! [`CodecError`] naming the offset instead of panicking or guessing.
//!
//! Who uses it: the broker's ack tokens (`msgtrail-broker`, the settle deadline), the
//! listener's stored forms (a message's record chunks, its summary, request-ID rows). The
//! wire frames ([`crate::frame`]) are fixed-width, big-endian and versioned by the protocol;
//! they share this module's error rules, not its layout.
//!
//! Varints are prost's (`prost::encoding`, the functions every generated protobuf message
//! calls, already in the tree through the OTLP exporter): one encoder and one overflow rule
//! for the whole workspace — a varint longer than ten bytes, or whose tenth byte carries bits
//! past the 64th, is refused, never truncated.

use crate::MessageId;
use bytes::BufMut;

/// Why a compact value did not decode.
#[derive(Debug, thiserror::Error)]
#[error("stored value is corrupt at byte {at}: {fault}")]
pub struct CodecError {
    /// Where reading stopped.
    pub at: usize,
    /// What was wrong.
    pub fault: CodecFault,
}

/// What a [`Reader`] found wrong.
#[derive(Debug, thiserror::Error)]
pub enum CodecFault {
    /// The value ends before the field does.
    #[error("unexpected end")]
    UnexpectedEnd,
    /// A length announces more bytes than are left.
    #[error("{announced} bytes announced past the end")]
    PastTheEnd {
        /// The length read.
        announced: usize,
    },
    /// A varint longer than ten bytes or wider than 64 bits.
    #[error("malformed varint (longer than 64 bits)")]
    Varint,
    /// A count of items, each at least one byte, larger than the bytes left.
    #[error("{announced} items announced in {left} bytes")]
    TooManyItems {
        /// The count read.
        announced: u64,
        /// The bytes left.
        left: usize,
    },
    /// A string that is not UTF-8.
    #[error("string is not UTF-8: {0}")]
    Utf8(#[from] std::str::Utf8Error),
    /// A presence byte other than 0 or 1.
    #[error("presence byte {0}")]
    Presence(u8),
    /// Sixteen bytes that are not a UUIDv7 message ID.
    #[error("not a message ID: {0}")]
    MessageId(String),
    /// Bytes left after the last field.
    #[error("bytes after the end")]
    Trailing,
    /// A value the form at hand does not allow (its own words).
    #[error("{0}")]
    Invalid(String),
}

/// Appends primitives to a buffer.
#[derive(Debug, Default)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// An empty writer with room for `n` bytes.
    pub fn with_capacity(n: usize) -> Self {
        Writer {
            buf: Vec::with_capacity(n),
        }
    }

    /// One byte.
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    /// An unsigned LEB128 varint.
    pub fn varint(&mut self, v: u64) {
        put_varint(&mut self.buf, v);
    }

    /// A signed value as a zigzag varint (small magnitudes take few bytes either way).
    pub fn zigzag(&mut self, v: i64) {
        self.varint(((v << 1) ^ (v >> 63)) as u64);
    }

    /// Raw bytes.
    pub fn bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    /// A string: its length as a varint, then its bytes.
    pub fn str(&mut self, s: &str) {
        self.varint(s.len() as u64);
        self.bytes(s.as_bytes());
    }

    /// An optional string: a presence byte, then the string.
    pub fn opt_str(&mut self, s: Option<&str>) {
        match s {
            Some(s) => {
                self.u8(1);
                self.str(s);
            }
            None => self.u8(0),
        }
    }

    /// A message ID: its 16 bytes, big-endian (so IDs sort by time as bytes).
    pub fn message_id(&mut self, id: MessageId) {
        self.bytes(&id.as_u128().to_be_bytes());
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether nothing was written yet.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The bytes.
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// Appends `v` to `buf` as an LEB128 varint (1 to 10 bytes).
pub fn put_varint(buf: &mut impl BufMut, v: u64) {
    prost::encoding::encode_varint(v, buf);
}

/// Reads an LEB128 varint from the start of `bytes`: the value and how many bytes it took.
pub fn get_varint(bytes: &[u8]) -> Result<(u64, usize), CodecFault> {
    if bytes.is_empty() {
        return Err(CodecFault::UnexpectedEnd);
    }
    let mut rest = bytes;
    match prost::encoding::decode_varint(&mut rest) {
        Ok(v) => Ok((v, bytes.len() - rest.len())),
        // prost says "invalid varint" both for a cut one and an overlong one: a varint whose
        // every byte has its continuation bit set and that is shorter than ten bytes is cut.
        Err(_) if bytes.len() < 10 && bytes.iter().all(|b| b & 0x80 != 0) => {
            Err(CodecFault::UnexpectedEnd)
        }
        Err(_) => Err(CodecFault::Varint),
    }
}

/// Reads primitives from a slice, checking every length.
#[derive(Debug)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, pos: 0 }
    }

    /// An error at the current offset.
    pub fn fault<T>(&self, fault: CodecFault) -> Result<T, CodecError> {
        Err(CodecError {
            at: self.pos,
            fault,
        })
    }

    /// An error at the current offset, in the words of the form being read.
    pub fn fail<T>(&self, what: impl Into<String>) -> Result<T, CodecError> {
        self.fault(CodecFault::Invalid(what.into()))
    }

    /// How many bytes are left.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// One byte.
    pub fn u8(&mut self) -> Result<u8, CodecError> {
        match self.bytes.get(self.pos) {
            Some(b) => {
                self.pos += 1;
                Ok(*b)
            }
            None => self.fault(CodecFault::UnexpectedEnd),
        }
    }

    /// `n` raw bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        match self.bytes.get(self.pos..self.pos.saturating_add(n)) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => self.fault(CodecFault::PastTheEnd { announced: n }),
        }
    }

    /// An unsigned LEB128 varint.
    pub fn varint(&mut self) -> Result<u64, CodecError> {
        match get_varint(&self.bytes[self.pos..]) {
            Ok((v, n)) => {
                self.pos += n;
                Ok(v)
            }
            Err(f) => self.fault(f),
        }
    }

    /// A zigzag varint.
    pub fn zigzag(&mut self) -> Result<i64, CodecError> {
        let z = self.varint()?;
        Ok(((z >> 1) as i64) ^ -((z & 1) as i64))
    }

    /// A count of items that each take at least one byte: more than the bytes left is a
    /// lie, refused before anything is allocated for it.
    pub fn count(&mut self) -> Result<usize, CodecError> {
        let n = self.varint()?;
        let left = self.remaining();
        if n > left as u64 {
            return self.fault(CodecFault::TooManyItems { announced: n, left });
        }
        Ok(n as usize)
    }

    /// A string written by [`Writer::str`].
    pub fn str(&mut self) -> Result<&'a str, CodecError> {
        let n = self.count()?;
        let raw = self.take(n)?;
        std::str::from_utf8(raw).or_else(|e| self.fault(e.into()))
    }

    /// An optional string written by [`Writer::opt_str`].
    pub fn opt_str(&mut self) -> Result<Option<&'a str>, CodecError> {
        match self.u8()? {
            0 => Ok(None),
            1 => self.str().map(Some),
            b => self.fault(CodecFault::Presence(b)),
        }
    }

    /// A message ID written by [`Writer::message_id`], checked to be a UUIDv7.
    pub fn message_id(&mut self) -> Result<MessageId, CodecError> {
        let raw: [u8; 16] = self.take(16)?.try_into().expect("take(16) gives 16 bytes");
        MessageId::from_u128(u128::from_be_bytes(raw))
            .or_else(|e| self.fault(CodecFault::MessageId(e.to_string())))
    }

    /// Fails unless every byte was read.
    pub fn end(&self) -> Result<(), CodecError> {
        if self.pos != self.bytes.len() {
            return self.fault(CodecFault::Trailing);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One field of a random value, as written and as it must read back.
    #[derive(Debug, Clone)]
    enum Field {
        U8(u8),
        Varint(u64),
        Zigzag(i64),
        Str(String),
        OptStr(Option<String>),
        Bytes(Vec<u8>),
    }

    fn field() -> impl Strategy<Value = Field> {
        prop_oneof![
            any::<u8>().prop_map(Field::U8),
            any::<u64>().prop_map(Field::Varint),
            any::<i64>().prop_map(Field::Zigzag),
            ".{0,40}".prop_map(Field::Str),
            proptest::option::of(".{0,20}").prop_map(Field::OptStr),
            proptest::collection::vec(any::<u8>(), 0..24).prop_map(Field::Bytes),
        ]
    }

    fn write(fields: &[Field]) -> Vec<u8> {
        let mut w = Writer::with_capacity(64);
        for f in fields {
            match f {
                Field::U8(v) => w.u8(*v),
                Field::Varint(v) => w.varint(*v),
                Field::Zigzag(v) => w.zigzag(*v),
                Field::Str(s) => w.str(s),
                Field::OptStr(s) => w.opt_str(s.as_deref()),
                Field::Bytes(b) => {
                    w.varint(b.len() as u64);
                    w.bytes(b);
                }
            }
        }
        w.finish()
    }

    fn read(bytes: &[u8], fields: &[Field]) -> Result<(), CodecError> {
        let mut r = Reader::new(bytes);
        for f in fields {
            match f {
                Field::U8(v) => assert_eq!(r.u8()?, *v),
                Field::Varint(v) => assert_eq!(r.varint()?, *v),
                Field::Zigzag(v) => assert_eq!(r.zigzag()?, *v),
                Field::Str(s) => assert_eq!(r.str()?, s),
                Field::OptStr(s) => assert_eq!(r.opt_str()?, s.as_deref()),
                Field::Bytes(b) => {
                    let n = r.count()?;
                    assert_eq!(r.take(n)?, &b[..]);
                }
            }
        }
        r.end()
    }

    proptest! {
        /// Whatever is written reads back the same, to the last byte.
        #[test]
        fn every_value_round_trips(fields in proptest::collection::vec(field(), 0..12)) {
            let bytes = write(&fields);
            prop_assert!(read(&bytes, &fields).is_ok());
        }

        /// A value cut anywhere, or with bytes after its end, is refused with an error (never
        /// a panic, never a value).
        #[test]
        fn a_cut_or_padded_value_is_refused(
            fields in proptest::collection::vec(field(), 1..12),
            cut in any::<prop::sample::Index>(),
            extra in 1u8..=255,
        ) {
            let bytes = write(&fields);
            prop_assume!(!bytes.is_empty());
            let at = cut.index(bytes.len());
            prop_assert!(read(&bytes[..at], &fields).is_err(), "cut at {} of {}", at, bytes.len());
            let mut padded = bytes.clone();
            padded.push(extra);
            let e = read(&padded, &fields).unwrap_err();
            prop_assert!(matches!(e.fault, CodecFault::Trailing), "{e}");
        }

        /// Random bytes never panic a reader of any field.
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut r = Reader::new(&bytes);
            let _ = r.str();
            let _ = r.opt_str();
            let _ = r.zigzag();
            let _ = r.message_id();
            let _ = r.count();
        }
    }

    #[test]
    fn varints_have_one_overflow_rule() {
        // Eleven bytes: refused.
        let long = [0x80u8; 10]
            .iter()
            .copied()
            .chain([0x01])
            .collect::<Vec<_>>();
        assert!(matches!(get_varint(&long), Err(CodecFault::Varint)));
        // Ten bytes whose last carries bits past the 64th: refused, not truncated.
        let wide = [0xffu8; 9]
            .iter()
            .copied()
            .chain([0x7f])
            .collect::<Vec<_>>();
        assert!(matches!(get_varint(&wide), Err(CodecFault::Varint)));
        // The widest legal one: u64::MAX.
        let mut max = Vec::new();
        put_varint(&mut max, u64::MAX);
        assert_eq!(max.len(), 10);
        assert_eq!(get_varint(&max).unwrap(), (u64::MAX, 10));
        // Cut: an unexpected end, not a malformed varint.
        assert!(matches!(
            get_varint(&[0x80, 0x80]),
            Err(CodecFault::UnexpectedEnd)
        ));
        assert!(matches!(get_varint(&[]), Err(CodecFault::UnexpectedEnd)));
    }

    #[test]
    fn a_count_larger_than_the_bytes_left_is_refused_before_allocating() {
        let mut w = Writer::default();
        w.varint(1 << 40);
        let bytes = w.finish();
        let e = Reader::new(&bytes).count().unwrap_err();
        assert!(matches!(e.fault, CodecFault::TooManyItems { .. }), "{e}");
    }

    #[test]
    fn message_ids_round_trip_and_other_bytes_are_refused() {
        let id = MessageId::new();
        let mut w = Writer::default();
        w.message_id(id);
        let bytes = w.finish();
        assert_eq!(Reader::new(&bytes).message_id().unwrap(), id);
        let e = Reader::new(&[0u8; 16]).message_id().unwrap_err();
        assert!(matches!(e.fault, CodecFault::MessageId(_)), "{e}");
    }
}
