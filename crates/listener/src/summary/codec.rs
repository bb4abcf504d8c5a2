//! The summary's compact stored form: [`MessageSummary::encode`] writes the second version
//! (states and segments as fixed numeric codes, tagged optional fields); [`MessageSummary::decode`]
//! reads it, the first version and JSON.

use super::MessageSummary;
use msgtrail_core::codec::{CodecError, CodecFault, Reader, Writer};
use msgtrail_core::trajectory::{MessageState, Segment};
use msgtrail_core::{ClientId, GroupId, MessageId, RequestId};
use std::collections::BTreeMap;

/// The version byte of the first compact form: states and segments by name.
const SUMMARY_V1: u8 = 1;
/// The version byte of the current form: states and segments by their stable codes
/// ([`state_code`], [`segment_code`]), the message ID left out when it is the key.
const SUMMARY_V2: u8 = 2;

/// The tags of the fields after the fixed ones (version 2): each is written as the tag, its
/// length in bytes (varint) and its bytes, and only when it is not empty; tag 0 ends the
/// value. A tag this version does not know is skipped by its length, so fields added later
/// never break a reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Tag {
    /// The end of the value.
    End = 0,
    /// One byte: bit 0 failed, bit 1 redelivered, bit 2 dead-lettered.
    Flags = 1,
    /// The attributes: a count, then key and value strings.
    Attrs = 2,
    /// The delivery attempts over all groups: a varint (absent in values written before it).
    Attempts = 3,
}

/// How a stored summary names its message ID.
const ID_NONE: u8 = 0;
const ID_WRITTEN: u8 = 1;
const ID_IS_KEY: u8 = 2;

/// A state's stored code. The numbers are fixed forever (never derived from the enum's
/// order), so a new state takes a new number and old values keep their meaning.
pub(crate) fn state_code(s: MessageState) -> u8 {
    match s {
        MessageState::Sent => 0,
        MessageState::Enqueued => 1,
        MessageState::Delivered => 2,
        MessageState::Consuming => 3,
        MessageState::Consumed => 4,
        MessageState::Failed => 5,
        MessageState::DeadLettered => 6,
        MessageState::Stuck => 7,
        MessageState::Lost => 8,
    }
}

/// A segment's stored code; fixed forever like [`state_code`].
fn segment_code(s: Segment) -> u8 {
    match s {
        Segment::SentToStored => 0,
        Segment::StoredToDelivered => 1,
        Segment::DeliveredToReceived => 2,
        Segment::Processing => 3,
        Segment::ReceivedToAcked => 4,
        Segment::EndToEnd => 5,
    }
}

fn read_state_code(r: &mut Reader<'_>) -> Result<MessageState, CodecError> {
    let code = r.u8()?;
    match MessageState::ALL.iter().find(|s| state_code(**s) == code) {
        Some(s) => Ok(*s),
        None => r.fail(format!("unknown state code {code}")),
    }
}

fn read_segment_code(r: &mut Reader<'_>) -> Result<Segment, CodecError> {
    let code = r.u8()?;
    match Segment::ALL.iter().find(|s| segment_code(**s) == code) {
        Some(s) => Ok(*s),
        None => r.fail(format!("unknown segment code {code}")),
    }
}

/// How the two compact versions name states and segments.
#[derive(Clone, Copy)]
enum Naming {
    /// Version 1: by name.
    Names,
    /// Version 2: by stable code.
    Codes,
}

impl Naming {
    fn state(self, r: &mut Reader<'_>) -> Result<MessageState, CodecError> {
        match self {
            Naming::Names => read_state(r),
            Naming::Codes => read_state_code(r),
        }
    }

    fn segment(self, r: &mut Reader<'_>) -> Result<Segment, CodecError> {
        match self {
            Naming::Codes => read_segment_code(r),
            Naming::Names => {
                let name = r.str()?;
                match Segment::ALL.iter().find(|s| s.as_str() == name) {
                    Some(seg) => Ok(*seg),
                    None => r.fail(format!("unknown segment {name:?}")),
                }
            }
        }
    }
}

impl MessageSummary {
    /// The compact stored form (the key is the table's key, not repeated, nor the message
    /// ID when it is the key). States and segments are written as stable codes, so that new
    /// variants never shift old values; flags and attributes follow as tagged fields.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(96);
        w.u8(SUMMARY_V2);
        match self.message_id {
            Some(m) if self.key.parse::<MessageId>().ok() == Some(m) => w.u8(ID_IS_KEY),
            Some(m) => {
                w.u8(ID_WRITTEN);
                w.bytes(m.as_bytes());
            }
            None => w.u8(ID_NONE),
        }
        w.opt_str(self.request_id.as_ref().map(|v| v.as_str()));
        w.opt_str(self.producer.as_ref().map(|v| v.as_str()));
        w.opt_str(self.topic.as_deref());
        w.u8(state_code(self.state));
        w.varint(self.groups.len() as u64);
        for (g, st) in &self.groups {
            w.str(g.as_str());
            w.u8(state_code(*st));
        }
        w.varint(self.first_at);
        w.varint(self.last_at.wrapping_sub(self.first_at));
        w.opt_str(self.failure.as_deref());
        w.varint(self.records as u64);
        let funnel = self
            .funnel
            .iter()
            .enumerate()
            .fold(0u8, |acc, (i, f)| acc | (u8::from(*f) << i));
        w.u8(funnel);
        w.varint(self.segments.len() as u64);
        for (seg, v) in &self.segments {
            w.u8(segment_code(*seg));
            w.varint(*v);
        }
        self.write_tagged(&mut w);
        w.finish()
    }

    fn write_tagged(&self, w: &mut Writer) {
        let flags = u8::from(self.failed)
            | (u8::from(self.redelivered) << 1)
            | (u8::from(self.dead_lettered) << 2);
        if flags != 0 {
            w.u8(Tag::Flags as u8);
            w.varint(1);
            w.u8(flags);
        }
        if !self.attrs.is_empty() {
            let mut a = Writer::with_capacity(32);
            a.varint(self.attrs.len() as u64);
            for (k, v) in &self.attrs {
                a.str(k);
                a.str(v);
            }
            let a = a.finish();
            w.u8(Tag::Attrs as u8);
            w.varint(a.len() as u64);
            w.bytes(&a);
        }
        if let Some(n) = self.attempts {
            let mut a = Writer::with_capacity(5);
            a.varint(u64::from(n));
            let a = a.finish();
            w.u8(Tag::Attempts as u8);
            w.varint(a.len() as u64);
            w.bytes(&a);
        }
        w.u8(Tag::End as u8);
    }

    /// Reads what [`MessageSummary::encode`] wrote (or the first compact version), for the
    /// message stored under `key`. A value that starts with `{` is the first version's JSON
    /// form, read as such.
    pub fn decode(key: &str, bytes: &[u8]) -> Result<MessageSummary, CodecError> {
        if bytes.first() == Some(&b'{') {
            let mut s: MessageSummary = serde_json::from_slice(bytes).map_err(|e| CodecError {
                at: e.column(),
                fault: CodecFault::Invalid(format!("first-version summary: {e}")),
            })?;
            s.derive_missing_flags();
            return Ok(s);
        }
        let mut r = Reader::new(bytes);
        let naming = match r.u8()? {
            SUMMARY_V1 => Naming::Names,
            SUMMARY_V2 => Naming::Codes,
            v => return r.fail(format!("unknown summary version {v}")),
        };
        let message_id = match r.u8()? {
            ID_NONE => None,
            ID_IS_KEY if matches!(naming, Naming::Codes) => match key.parse::<MessageId>() {
                Ok(m) => Some(m),
                Err(_) => return r.fail(format!("key {key:?} is no message ID")),
            },
            _ => Some(r.message_id()?),
        };
        let request_id = match r.opt_str()? {
            Some(s) => Some(RequestId::new(s).or_else(|e| r.fail(e.to_string()))?),
            None => None,
        };
        let producer = match r.opt_str()? {
            Some(s) => Some(ClientId::new(s).or_else(|e| r.fail(e.to_string()))?),
            None => None,
        };
        let topic = r.opt_str()?.map(str::to_owned);
        let state = naming.state(&mut r)?;
        let n = r.count()?;
        let mut groups = BTreeMap::new();
        for _ in 0..n {
            let g = r.str()?;
            let g = GroupId::new(g).or_else(|e| r.fail(e.to_string()))?;
            groups.insert(g, naming.state(&mut r)?);
        }
        let first_at = r.varint()?;
        let last_at = first_at.wrapping_add(r.varint()?);
        let failure = r.opt_str()?.map(str::to_owned);
        let records = r.varint()? as usize;
        let bits = r.u8()?;
        let funnel = std::array::from_fn(|i| bits & (1 << i) != 0);
        let n = r.count()?;
        let mut segments = Vec::with_capacity(n);
        for _ in 0..n {
            let seg = naming.segment(&mut r)?;
            segments.push((seg, r.varint()?));
        }
        let mut s = MessageSummary {
            key: key.to_owned(),
            message_id,
            request_id,
            producer,
            topic,
            state,
            groups,
            first_at,
            last_at,
            failure,
            records,
            funnel,
            segments,
            failed: false,
            redelivered: false,
            dead_lettered: false,
            attrs: BTreeMap::new(),
            attempts: None,
        };
        match naming {
            Naming::Names => s.derive_missing_flags(),
            Naming::Codes => read_tagged(&mut r, &mut s)?,
        }
        r.end()?;
        Ok(s)
    }
}

/// Reads the tagged fields of a version-2 value, up to its end tag.
fn read_tagged(r: &mut Reader<'_>, s: &mut MessageSummary) -> Result<(), CodecError> {
    loop {
        let tag = r.u8()?;
        if tag == Tag::End as u8 {
            return Ok(());
        }
        let len = r.count()?;
        let body = r.take(len)?;
        let mut f = Reader::new(body);
        if tag == Tag::Flags as u8 {
            let bits = f.u8()?;
            s.failed = bits & 1 != 0;
            s.redelivered = bits & 2 != 0;
            s.dead_lettered = bits & 4 != 0;
        } else if tag == Tag::Attrs as u8 {
            for _ in 0..f.count()? {
                let k = f.str()?.to_owned();
                s.attrs.insert(k, f.str()?.to_owned());
            }
        } else if tag == Tag::Attempts as u8 {
            let n = f.varint()?;
            s.attempts = Some(u32::try_from(n).or_else(|_| f.fail(format!("{n} attempts")))?);
        } else {
            continue; // a field of a later version
        }
        f.end()?;
    }
}

fn read_state(r: &mut Reader<'_>) -> Result<MessageState, CodecError> {
    let name = r.str()?;
    name.parse::<MessageState>()
        .or_else(|_| r.fail(format!("unknown state {name:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> MessageSummary {
        MessageSummary {
            key: "k".into(),
            message_id: Some(MessageId::new()),
            request_id: Some(RequestId::new("order-1").unwrap()),
            producer: Some(ClientId::new("shop").unwrap()),
            topic: Some("orders.created".into()),
            state: MessageState::Consumed,
            groups: [
                (GroupId::new("billing").unwrap(), MessageState::Consumed),
                (GroupId::new("audit").unwrap(), MessageState::Failed),
            ]
            .into(),
            first_at: 1_700_000_000_000_000_000,
            last_at: 1_700_000_000_500_000_000,
            failure: Some("audit: processing failed".into()),
            records: 12,
            funnel: [true, true, false, true],
            segments: vec![(Segment::SentToStored, 300_000), (Segment::EndToEnd, 9)],
            failed: true,
            redelivered: true,
            dead_lettered: false,
            attrs: [("category".to_owned(), "refund".to_owned())].into(),
            attempts: Some(3),
        }
    }

    /// The first compact form, as the previous listener wrote it.
    fn version_1(s: &MessageSummary) -> Vec<u8> {
        let mut w = Writer::with_capacity(96);
        w.u8(SUMMARY_V1);
        match s.message_id {
            Some(m) => {
                w.u8(1);
                w.bytes(m.as_bytes());
            }
            None => w.u8(0),
        }
        w.opt_str(s.request_id.as_ref().map(|v| v.as_str()));
        w.opt_str(s.producer.as_ref().map(|v| v.as_str()));
        w.opt_str(s.topic.as_deref());
        w.str(s.state.as_str());
        w.varint(s.groups.len() as u64);
        for (g, st) in &s.groups {
            w.str(g.as_str());
            w.str(st.as_str());
        }
        w.varint(s.first_at);
        w.varint(s.last_at.wrapping_sub(s.first_at));
        w.opt_str(s.failure.as_deref());
        w.varint(s.records as u64);
        let funnel = s
            .funnel
            .iter()
            .enumerate()
            .fold(0u8, |acc, (i, f)| acc | (u8::from(*f) << i));
        w.u8(funnel);
        w.varint(s.segments.len() as u64);
        for (seg, v) in &s.segments {
            w.str(seg.as_str());
            w.varint(*v);
        }
        w.finish()
    }

    #[test]
    fn a_version_1_value_written_byte_by_byte_decodes() {
        // Version 1; no message ID; no request ID; no producer; topic "t"; state "failed";
        // one group "g" failed; first 5, last 5 + 2; no failure; 3 records; funnel 0b0111;
        // no segment.
        let mut v1 = vec![1, 0, 0, 0, 1, 1, b't', 6];
        v1.extend(b"failed");
        v1.extend([1, 1, b'g', 6]);
        v1.extend(b"failed");
        v1.extend([5, 2, 0, 3, 0b0111, 0]);
        let s = MessageSummary::decode("k", &v1).unwrap();
        assert_eq!(
            (s.topic.as_deref(), s.state, s.records),
            (Some("t"), MessageState::Failed, 3)
        );
        assert_eq!(
            (s.first_at, s.last_at, s.funnel),
            (5, 7, [true, true, true, false])
        );
        assert!(s.failed && !s.redelivered && !s.dead_lettered && s.attrs.is_empty());
        assert_eq!(s.attempts, None, "version 1 kept no attempt count");
        // Written again, it is version 2 and reads back the same.
        assert_eq!(s.encode()[0], SUMMARY_V2);
        assert_eq!(MessageSummary::decode("k", &s.encode()).unwrap(), s);
    }

    #[test]
    fn a_version_1_value_still_decodes_with_the_flags_it_implies() {
        let s = sample();
        let got = MessageSummary::decode("k", &version_1(&s)).unwrap();
        // Its failure point and failed group say it failed; redeliveries and attributes
        // were not kept then.
        assert!(got.failed && !got.redelivered && !got.dead_lettered && got.attrs.is_empty());
        assert_eq!(
            (got.groups, got.segments, got.records),
            (s.groups, s.segments, s.records)
        );
        let mut clean = sample();
        clean.failure = None;
        clean.groups = [(GroupId::new("billing").unwrap(), MessageState::DeadLettered)].into();
        clean.state = MessageState::DeadLettered;
        let got = MessageSummary::decode("k", &version_1(&clean)).unwrap();
        assert!(got.failed && got.dead_lettered, "{got:?}");
        // The first version's JSON, without the new fields, too.
        let mut json = serde_json::to_value(&clean).unwrap();
        for f in ["failed", "redelivered", "dead_lettered", "attrs"] {
            json.as_object_mut().unwrap().remove(f);
        }
        let got = MessageSummary::decode("k", json.to_string().as_bytes()).unwrap();
        assert!(
            got.failed && got.dead_lettered && !got.redelivered,
            "{got:?}"
        );
    }

    #[test]
    fn flags_and_attributes_cost_bytes_only_when_present() {
        let mut s = sample();
        let full = s.encode().len();
        (s.failed, s.redelivered, s.dead_lettered) = (false, false, false);
        s.attrs.clear();
        let plain = s.encode().len();
        assert_eq!(
            full,
            plain + 3 + 2 + 1 + 1 + "category".len() + 1 + "refund".len()
        );
        // An unknown tagged field (a later version's) is skipped.
        let mut later = s.encode();
        later.pop();
        later.extend([9, 2, 0xAB, 0xCD, Tag::End as u8]);
        assert_eq!(MessageSummary::decode("k", &later).unwrap(), s);
    }

    #[test]
    fn the_attempt_count_is_kept_and_unknown_in_values_written_before_it() {
        let mut s = sample();
        let with = s.encode();
        assert_eq!(
            MessageSummary::decode("k", &with).unwrap().attempts,
            Some(3)
        );
        s.attempts = None;
        let without = s.encode();
        // Tag, length, one varint byte.
        assert_eq!(with.len(), without.len() + 3);
        assert_eq!(
            MessageSummary::decode("k", &without).unwrap().attempts,
            None
        );
        s.attempts = Some(300);
        assert_eq!(
            MessageSummary::decode("k", &s.encode()).unwrap().attempts,
            Some(300)
        );
    }

    #[test]
    fn round_trip_and_json_fallback() {
        let s = sample();
        let bytes = s.encode();
        assert_eq!(MessageSummary::decode("k", &bytes).unwrap(), s);
        let json = serde_json::to_vec(&s).unwrap();
        assert_eq!(MessageSummary::decode("k", &json).unwrap(), s);
        assert!(
            bytes.len() * 2 < json.len(),
            "{} vs {}",
            bytes.len(),
            json.len()
        );
        let mut empty = sample();
        empty.message_id = None;
        empty.request_id = None;
        empty.producer = None;
        empty.topic = None;
        empty.failure = None;
        empty.groups.clear();
        empty.segments.clear();
        empty.last_at = 0; // before first_at: still round-trips
        assert_eq!(MessageSummary::decode("k", &empty.encode()).unwrap(), empty);
    }

    #[test]
    fn a_message_id_that_is_the_key_is_not_written_twice() {
        let mut s = sample();
        let id = s.message_id.unwrap();
        let apart = s.encode();
        s.key = id.to_string();
        let keyed = s.encode();
        assert_eq!(keyed.len() + 16, apart.len());
        assert_eq!(MessageSummary::decode(&s.key, &keyed).unwrap(), s);
        // A value that says "the key" under a key that is no message ID is refused.
        assert!(MessageSummary::decode("orphan/shop/r1", &keyed).is_err());
    }

    #[test]
    fn codes_are_unique_and_round_trip() {
        let states: std::collections::BTreeSet<u8> =
            MessageState::ALL.iter().map(|s| state_code(*s)).collect();
        assert_eq!(states.len(), MessageState::ALL.len());
        let segments: std::collections::BTreeSet<u8> =
            Segment::ALL.iter().map(|s| segment_code(*s)).collect();
        assert_eq!(segments.len(), Segment::ALL.len());
        for st in MessageState::ALL {
            let mut s = sample();
            s.state = *st;
            s.segments = Segment::ALL.iter().map(|g| (*g, 7)).collect();
            assert_eq!(MessageSummary::decode("k", &s.encode()).unwrap(), s);
        }
    }

    #[test]
    fn truncated_values_are_errors() {
        let bytes = sample().encode();
        for n in 0..bytes.len() {
            assert!(MessageSummary::decode("k", &bytes[..n]).is_err(), "at {n}");
        }
    }

    #[test]
    fn a_stored_group_that_is_not_a_group_name_is_an_error() {
        let mut bytes = sample().encode();
        // The groups come before the failure text that names a group too.
        let pos = bytes.windows(5).position(|w| w == b"audit").unwrap();
        bytes[pos + 2] = b' ';
        assert!(MessageSummary::decode("k", &bytes).is_err());
    }

    #[test]
    fn as_json_the_groups_are_keyed_by_their_names() {
        let s = sample();
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.contains(r#""groups":{"audit":"#), "{json}");
        assert_eq!(serde_json::from_str::<MessageSummary>(&json).unwrap(), s);
        let bad = json.replace(r#""audit":"#, r#""au it":"#);
        assert!(serde_json::from_str::<MessageSummary>(&bad).is_err());
    }
}
