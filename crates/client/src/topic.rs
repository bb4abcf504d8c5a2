//! [`ToTopic`]: what the producer accepts where a [`Topic`] is meant, like async-nats'
//! `ToSubject`.

use msgtrail_core::{IdError, Topic};

/// A topic argument: a [`Topic`], or text that is validated as one. Text that is not a
/// topic fails the send with [`crate::ClientError::Invalid`] before anything is sent.
///
/// ```
/// use msgtrail_client::ToTopic;
/// use msgtrail_core::Topic;
/// assert_eq!("orders.eu".to_topic()?, Topic::new("orders.eu")?);
/// assert!("orders.*".to_topic().is_err(), "a topic has no wildcards");
/// # Ok::<(), msgtrail_core::IdError>(())
/// ```
pub trait ToTopic {
    /// The topic, validated.
    fn to_topic(self) -> Result<Topic, IdError>;
}

impl ToTopic for Topic {
    fn to_topic(self) -> Result<Topic, IdError> {
        Ok(self)
    }
}

impl ToTopic for &Topic {
    fn to_topic(self) -> Result<Topic, IdError> {
        Ok(self.clone())
    }
}

impl ToTopic for &str {
    fn to_topic(self) -> Result<Topic, IdError> {
        Topic::new(self)
    }
}

impl ToTopic for String {
    fn to_topic(self) -> Result<Topic, IdError> {
        Topic::new(self)
    }
}

impl ToTopic for &String {
    fn to_topic(self) -> Result<Topic, IdError> {
        Topic::new(self.as_str())
    }
}
