//! The note on a request ID that names several messages (uploaded again after the dedup
//! window).

use super::*;

/// When `asked` was a request ID that names several messages (uploaded again after the
/// dedup window): which one the answer is, and the others, in upload order.
pub(crate) fn request_note(t: &Trajectory, asked: &str) -> Option<String> {
    let own = t.message_id?;
    if t.same_request.is_empty() || asked.trim() == own.to_string() {
        return None;
    }
    let others: Vec<String> = t.same_request.iter().map(|m| m.to_string()).collect();
    let latest = if t.same_request.iter().all(|m| *m < own) {
        "the latest, "
    } else {
        ""
    };
    Some(format!(
        "request id {} names {} messages (uploaded again after the dedup window); showing {latest}{own}; the other(s): {} (msgtrail trace <message-id>)",
        asked.trim(),
        t.same_request.len() + 1,
        others.join(", ")
    ))
}

/// The messages stored under the trajectory's request ID, in upload order, this one marked.
pub(super) fn same_request_line(t: &Trajectory) -> Option<String> {
    if t.same_request.is_empty() {
        return None;
    }
    let mut all: Vec<(msgtrail_core::MessageId, bool)> =
        t.same_request.iter().map(|m| (*m, false)).collect();
    if let Some(own) = t.message_id {
        all.push((own, true));
    }
    all.sort();
    let list: Vec<String> = all
        .iter()
        .map(|(m, own)| {
            if *own {
                format!("{m} (this one)")
            } else {
                m.to_string()
            }
        })
        .collect();
    let req = t
        .request_id
        .as_ref()
        .map(|r| format!("request {r}"))
        .unwrap_or_else(|| "the request id".to_owned());
    Some(format!(
        "{req} stored as {} messages (uploaded again after the dedup window): {}",
        all.len(),
        list.join(", ")
    ))
}
