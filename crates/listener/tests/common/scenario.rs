//! A builder of one message's stage records, as a broker and its clients would report
//! them, relative to a base time (shared by the listener's integration tests).

use msgtrail_core::Stage;
use msgtrail_core::{ClientId, MessageId, RequestId, StageRecord};

/// One millisecond in nanoseconds.
pub(crate) const MS: u64 = 1_000_000;

/// Builds the records of one scenario, relative to a base time.
pub(crate) struct Scenario {
    pub(crate) t0: u64,
    pub(crate) id: MessageId,
    pub(crate) req: RequestId,
    pub(crate) producer: ClientId,
    pub(crate) topic: String,
    pub(crate) out: Vec<StageRecord>,
}

impl Scenario {
    pub(crate) fn new(t0: u64, producer: &str, req: &str, topic: &str) -> Self {
        let req = RequestId::new(req).unwrap();
        Scenario {
            t0,
            // As the broker mints it: in the request's stage partition.
            id: MessageId::new_in(msgtrail_core::partition::Partition::of_request(&req)),
            req,
            producer: ClientId::new(producer).unwrap(),
            topic: topic.to_owned(),
            out: Vec::new(),
        }
    }
    pub(crate) fn rec(&self, stage: Stage, ms: u64) -> StageRecord {
        let mut r = StageRecord::at(stage, self.t0 + ms * MS);
        r.topic = Some(self.topic.clone());
        r
    }
    pub(crate) fn upload(&mut self, stage: Stage, ms: u64, attempt: Option<u32>) -> &mut Self {
        let mut r = self.rec(stage, ms);
        r.request_id = Some(self.req.clone());
        r.producer = Some(self.producer.clone());
        r.attempt = attempt;
        if stage != Stage::UploadSent {
            r.message_id = Some(self.id);
        }
        if stage == Stage::UploadReceived {
            r.payload_size = Some(4);
            r.payload_head = Some("aGVsbG8=".into()); // "hello"
            r.attrs.insert("category".into(), "refund".into());
            r.service = Some("broker".into());
        }
        self.out.push(r);
        self
    }
    // One call per record keeps the scenarios readable as a table of stages.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn deliver(
        &mut self,
        stage: Stage,
        ms: u64,
        group: &str,
        consumer: &str,
        attempt: u32,
        outcome: Option<&str>,
        detail: Option<&str>,
    ) -> &mut Self {
        let mut r = self.rec(stage, ms);
        r.message_id = Some(self.id);
        r.group = Some(msgtrail_core::GroupId::new(group).unwrap());
        r.consumer = Some(ClientId::new(consumer).unwrap());
        r.attempt = Some(attempt);
        r.outcome = outcome.map(Into::into);
        r.detail = detail.map(Into::into);
        self.out.push(r);
        self
    }
    /// A full pull delivery that is processed with `result` and settled with `settle`.
    pub(crate) fn pull(
        &mut self,
        ms: u64,
        group: &str,
        consumer: &str,
        attempt: u32,
        fail: Option<&str>,
    ) -> &mut Self {
        let settle = if fail.is_some() { "nack" } else { "ack" };
        self.deliver(Stage::PullSent, ms, group, consumer, attempt, None, None)
            .deliver(
                Stage::PullReceived,
                ms + 1,
                group,
                consumer,
                attempt,
                None,
                None,
            )
            .deliver(
                Stage::ProcessStarted,
                ms + 2,
                group,
                consumer,
                attempt,
                None,
                None,
            )
            .deliver(
                Stage::ProcessFinished,
                ms + 5,
                group,
                consumer,
                attempt,
                Some(if fail.is_some() { "failed" } else { "ok" }),
                fail,
            )
            .deliver(
                Stage::PullAckSent,
                ms + 6,
                group,
                consumer,
                attempt,
                Some(settle),
                None,
            )
            .deliver(
                Stage::PullAckReceived,
                ms + 7,
                group,
                consumer,
                attempt,
                Some(settle),
                None,
            );
        if fail.is_some() {
            self.deliver(
                Stage::Redelivery,
                ms + 7,
                group,
                consumer,
                attempt,
                Some("redeliver"),
                Some("nack"),
            );
        }
        self
    }
    pub(crate) fn stored(&mut self, ms: u64) -> &mut Self {
        self.upload(Stage::UploadSent, ms, Some(1))
            .upload(Stage::UploadReceived, ms + 1, None)
            .upload(Stage::Stored, ms + 2, None)
            .upload(Stage::StoreConfirmed, ms + 3, None)
    }
}
