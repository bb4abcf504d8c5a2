//! [`GroupId`]: the name of a consumer group.

use msgtrail_core::wire::Subscription;
use msgtrail_core::{ClientId, IdError};
use std::fmt;

/// The name of a consumer group: consumers of one group share its messages, and every group
/// gets all of them. It follows the rules of a [`ClientId`] (the broker names the group's
/// JetStream consumer after it), but it names a group, not a client, so the two cannot be
/// mixed up.
///
/// ```
/// use msgtrail_client::GroupId;
/// let billing = GroupId::new("billing")?;
/// assert_eq!(billing.as_str(), "billing");
/// # Ok::<(), msgtrail_core::IdError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
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
    /// `orders.*`, `orders.>`), for [`crate::Consumer::fetch`] and
    /// [`crate::Consumer::subscribe`]; add attribute filters to its `filter`. The broker
    /// checks the filter.
    ///
    /// ```
    /// use msgtrail_client::GroupId;
    /// let sub = GroupId::new("billing")?.subscription("orders.*");
    /// assert_eq!((sub.group.as_str(), sub.topic.as_str()), ("billing", "orders.*"));
    /// # Ok::<(), msgtrail_core::IdError>(())
    /// ```
    pub fn subscription(&self, topic_filter: impl Into<String>) -> Subscription {
        Subscription {
            group: self.0.clone(),
            topic: topic_filter.into(),
            filter: Default::default(),
            message_id: None,
        }
    }

    /// The name as the wire types ([`msgtrail_core::wire::Subscription::group`], stage
    /// records) carry it.
    pub fn as_client_id(&self) -> &ClientId {
        &self.0
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
