//! An upload as received ([`RawUpload`]) and as accepted ([`Upload`]), and the checks of its
//! headers: required and single-valued headers, their size, `traceparent`, attributes.

use super::*;

/// An upload as received, before validation: from the headers of a single upload or from
/// one entry of a batch.
#[derive(Debug)]
pub(super) struct RawUpload<'a> {
    pub(super) request_id: &'a str,
    pub(super) topic: &'a str,
    pub(super) attempt: u32,
    /// P1 as the producer reported it (0: none).
    pub(super) sent_at: u64,
    pub(super) traceparent: Option<&'a str>,
    pub(super) attrs: Vec<(&'a str, &'a str)>,
    pub(super) payload: Bytes,
}

/// A validated upload.
#[derive(Debug)]
pub(super) struct Upload {
    pub(super) request_id: RequestId,
    pub(super) topic: Topic,
    pub(super) attempt: u32,
    pub(super) attrs: BTreeMap<String, String>,
    pub(super) traceparent: Option<String>,
    pub(super) payload: Bytes,
}

pub(super) fn bad(message: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::BadRequest, message)
}

/// The value of a required header.
pub(crate) fn required<'a>(headers: &'a HeaderMap, name: &str) -> Result<&'a str, WireError> {
    headers
        .get(name)
        .map(|v| v.as_str())
        .ok_or_else(|| bad(format!("missing header {name}")))
}

/// The value of a header that may appear at most once.
pub(super) fn single<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, WireError> {
    match headers.get_all(name).count() {
        0 => Ok(None),
        1 => Ok(headers.get(name).map(|v| v.as_str())),
        n => Err(bad(format!("header {name} is given {n} times"))),
    }
}

/// Total size of the headers as NATS encodes them (`Name: value\r\n`).
pub(super) fn header_bytes(headers: &HeaderMap) -> usize {
    headers
        .iter()
        .map(|(k, vs)| {
            vs.iter()
                .map(|v| AsRef::<str>::as_ref(k).len() + v.as_str().len() + 4)
                .sum::<usize>()
        })
        .sum()
}

/// Checks a W3C `traceparent`: `00-<32 hex>-<16 hex>-<2 hex>`, IDs not all zero.
pub(crate) fn valid_traceparent(tp: &str) -> bool {
    let parts: Vec<&str> = tp.split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    };
    parts.len() == 4
        && hex(parts[0], 2)
        && parts[0] != "ff"
        && hex(parts[1], 32)
        && parts[1].bytes().any(|b| b != b'0')
        && hex(parts[2], 16)
        && parts[2].bytes().any(|b| b != b'0')
        && hex(parts[3], 2)
}

/// Validates the attributes of one upload: keys by the grammar (stored lowercase), one value
/// each, no two keys that differ only in case, at most [`h::MAX_ATTRIBUTES`].
pub(super) fn validate_attrs(
    attrs: &[(&str, &str)],
) -> Result<BTreeMap<String, String>, WireError> {
    let invalid = |m: String| WireError::new(ErrorCode::InvalidAttribute, m);
    let mut out = BTreeMap::new();
    for (name, value) in attrs {
        let key = h::validate_attr_key(name).map_err(|e| invalid(e.to_string()))?;
        h::validate_attr_value(&key, value).map_err(|e| invalid(e.to_string()))?;
        if out.insert(key.clone(), (*value).to_owned()).is_some() {
            return Err(invalid(format!(
                "attribute {key:?} is given more than once (keys are case-insensitive)"
            )));
        }
    }
    if out.len() > h::MAX_ATTRIBUTES {
        return Err(invalid(format!(
            "{} attributes; at most {} are accepted",
            out.len(),
            h::MAX_ATTRIBUTES
        )));
    }
    Ok(out)
}
