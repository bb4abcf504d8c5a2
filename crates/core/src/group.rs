//! [`GroupId`]: the name of a consumer group, as subscriptions carry it and the SDK hands
//! it out.

use crate::wire::Subscription;
use crate::{ClientId, IdError};
use serde::{Deserialize, Serialize};
use std::borrow::Borrow;
use std::fmt;

/// The name of a consumer group: consumers of one group share its messages, and every group
/// gets all of them. It follows the rules of a [`ClientId`] (the broker names the group's
/// JetStream consumer after it), but it names a group, not a client, so the two cannot be
/// mixed up. On the wire it is the same string as a client ID.
///
/// ```
/// use msgtrail_core::GroupId;
/// let billing = GroupId::new("billing")?;
/// assert_eq!(billing.as_str(), "billing");
/// # Ok::<(), msgtrail_core::IdError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GroupId(ClientId);

impl GroupId {
    /// A group name, validated like a client ID.
    pub fn new(name: impl AsRef<str>) -> Result<Self, IdError> {
        ClientId::new(name.as_ref()).map(GroupId)
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// A subscription of this group to the topics matching `topic_filter` (NATS wildcards:
    /// `orders.*`, `orders.>`), for the SDK consumer's `fetch` and
    /// `subscribe`; add attribute filters to its `filter`. The broker
    /// checks the filter.
    ///
    /// ```
    /// use msgtrail_core::GroupId;
    /// let sub = GroupId::new("billing")?.subscription("orders.*");
    /// assert_eq!((sub.group.as_str(), sub.topic.as_str()), ("billing", "orders.*"));
    /// # Ok::<(), msgtrail_core::IdError>(())
    /// ```
    pub fn subscription(&self, topic_filter: impl Into<String>) -> Subscription {
        Subscription {
            group: self.clone(),
            topic: topic_filter.into(),
            filter: Default::default(),
            message_id: None,
        }
    }
}

impl From<ClientId> for GroupId {
    fn from(id: ClientId) -> Self {
        GroupId(id)
    }
}

impl From<GroupId> for ClientId {
    fn from(g: GroupId) -> Self {
        g.0
    }
}

/// A group borrows as its name, so maps keyed by group can be looked up by a name as text
/// (a [`GroupId`] orders, compares and hashes as its name does).
impl Borrow<str> for GroupId {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq<str> for GroupId {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for GroupId {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_the_wire_a_group_is_the_string_a_client_id_was() {
        let sub = GroupId::new("billing").unwrap().subscription("orders.*");
        let json = serde_json::to_string(&sub).unwrap();
        assert_eq!(json, r#"{"group":"billing","topic":"orders.*"}"#);
        let back: Subscription = serde_json::from_str(&json).unwrap();
        assert_eq!(back, sub);
        // The same rules as a client ID: a name that is not one is refused when decoding.
        let bad = serde_json::from_str::<Subscription>(r#"{"group":"bil ling","topic":"t"}"#);
        assert!(bad.is_err());
        let as_client: ClientId = serde_json::from_str(r#""billing""#).unwrap();
        assert_eq!(GroupId::from(as_client), sub.group);
    }
}
