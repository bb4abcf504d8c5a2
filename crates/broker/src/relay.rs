//! Relaying the clients' own stage records (P1, P4, C2/C3, C6/C7, X1/X2) into the stage
//! stream, after checking that each record belongs to the sender's channel (docs/ARCHITECTURE.md §3, decision 3).
//!
//! A report is newline-delimited JSON: each line a stage record, plus a `token` field where
//! the record speaks of something the broker handed out:
//! - every record: its stage must be one the channel's role reports, and the producer or
//!   consumer it names must be the channel's client (filled in when absent); `service` is
//!   set from the channel, so no client speaks for another service;
//! - consumer records (C2/C3, C6/C7, X1/X2): `token` = the delivery's ack token, signed by
//!   the brokers; it must have been issued to this consumer, and the record's message ID,
//!   group and attempt are taken from it (a record that names others is refused). C2/C3 need
//!   a push delivery, C6/C7 a pull delivery;
//! - P4: `token` = the upload reply's `receipt`, which binds producer, request ID and
//!   message ID;
//! - P1 needs none: a request ID lives in its producer's own namespace.
//!
//! The `token` is not written to the stage stream. A report is accepted whole or refused
//! whole, with the first offending line (record) named. Reports come as newline-delimited
//! JSON or as a binary report frame on `msgtrail.v1.stage`, or ride along upload and settle
//! batches ([`Relay::relay_reported`]); all three take the same checks. A settle's own
//! records (settle batch version 2) take them too, against the settle's token that the
//! settle path verified already ([`Relay::relay_own`]): no token travels or is checked per
//! record.

use crate::channels::{Channels, OpenChannel};
use crate::metrics::Metrics;
use crate::signing::SigningKey;
use crate::stage_sink::StageSink;
use crate::token::AckToken;
use crate::upload::required;
use msgtrail_core::frame::{self, ReportedRecord, ReportsOutcome};
use msgtrail_core::headers as h;
use msgtrail_core::{ErrorCode, Role, Stage, StageRecord, WireError};
use std::collections::HashMap;
use std::sync::Arc;

/// Most records in one report.
pub(crate) const MAX_REPORT_RECORDS: usize = 1000;
/// Largest report body.
pub(crate) const MAX_REPORT_BYTES: usize = 1024 * 1024;

/// Checks and relays client stage reports.
#[derive(Debug, Clone)]
pub(crate) struct Relay {
    /// Channels.
    pub channels: Channels,
    /// The stage sink.
    pub sink: StageSink,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Verifies tokens and receipts.
    pub key: SigningKey,
}

/// Ack tokens verified while handling one request, by their text: a delivery's token rides
/// in its settle and in each of its stage records, and is checked once.
#[derive(Debug, Default)]
pub(crate) struct TokenCache(HashMap<String, Vec<(String, Arc<AckToken>)>>);

/// Characters of a token's end that key the cache: the end of its HMAC tag, so hashing
/// ~16 bytes instead of the ~200 of the whole token (the full text is still compared).
const CACHE_KEY_CHARS: usize = 16;

impl TokenCache {
    /// An empty cache.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The token `text` verified for `consumer` ([`AckToken::decode_for`]), from the cache
    /// when it was verified before in this request.
    pub(crate) fn decode(
        &mut self,
        text: &str,
        consumer: &msgtrail_core::ClientId,
        key: &SigningKey,
    ) -> Result<Arc<AckToken>, WireError> {
        let start = text
            .char_indices()
            .rev()
            .nth(CACHE_KEY_CHARS - 1)
            .map_or(0, |(i, _)| i);
        let end = &text[start..];
        if let Some((_, t)) = self
            .0
            .get(end)
            .and_then(|slot| slot.iter().find(|(full, _)| full == text))
        {
            return Ok(t.clone());
        }
        let t = Arc::new(AckToken::decode_for(text, consumer, key)?);
        self.0
            .entry(end.to_owned())
            .or_default()
            .push((text.to_owned(), t.clone()));
        Ok(t)
    }
}

fn not_owned(line: usize, why: impl std::fmt::Display) -> WireError {
    WireError::new(ErrorCode::RecordNotOwned, format!("line {line}: {why}"))
}

fn invalid(line: usize, why: impl std::fmt::Display) -> WireError {
    WireError::new(ErrorCode::InvalidRecord, format!("line {line}: {why}"))
}

/// Fields a JSON record may leave out but never set to `null`: they name what the record is
/// about, and `null` would silently read as "absent".
const NEVER_NULL: &[&str] = &[
    "message_id",
    "request_id",
    "producer",
    "consumer",
    "group",
    "topic",
    "attempt",
    "stream_seq",
    "outcome",
    "detail",
];

/// Parses a newline-delimited JSON report: each line a record plus its `token`.
fn parse_json_report(payload: &[u8]) -> Result<Vec<ReportedRecord>, WireError> {
    let mut out = Vec::new();
    for (i, line) in payload.split(|b| *b == b'\n').enumerate() {
        if line.iter().all(|b| b.is_ascii_whitespace()) {
            continue;
        }
        if out.len() == MAX_REPORT_RECORDS {
            return Err(WireError::new(
                ErrorCode::InvalidRecord,
                format!("more than {MAX_REPORT_RECORDS} records in one report"),
            ));
        }
        let n = i + 1;
        let mut value: serde_json::Value =
            serde_json::from_slice(line).map_err(|e| invalid(n, e))?;
        let Some(object) = value.as_object_mut() else {
            return Err(invalid(n, "a record is a JSON object"));
        };
        let token = match object.remove("token") {
            Some(serde_json::Value::String(t)) => t,
            None => String::new(),
            Some(_) => return Err(invalid(n, "token must be a string")),
        };
        if let Some(field) = NEVER_NULL
            .iter()
            .find(|f| object.get(**f).is_some_and(|v| v.is_null()))
        {
            return Err(invalid(n, format!("{field} is null: leave it out instead")));
        }
        let record: StageRecord = serde_json::from_value(value).map_err(|e| invalid(n, e))?;
        out.push(ReportedRecord { record, token });
    }
    Ok(out)
}

impl Relay {
    /// Handles one `stage` report (newline-delimited JSON, or a binary report frame);
    /// returns how many records were accepted.
    pub(crate) async fn handle(&self, msg: &async_nats::Message) -> Result<usize, WireError> {
        Metrics::inc(&self.metrics.stage_reports);
        let headers = msg.headers.as_ref().ok_or_else(|| {
            WireError::new(
                ErrorCode::BadRequest,
                format!("missing header {}", h::CHANNEL),
            )
        })?;
        let budget = crate::settle::ReplyBudget::of(Some(headers))?;
        let channel = self.channels.lookup(required(headers, h::CHANNEL)?).await?;
        if msg.payload.len() > MAX_REPORT_BYTES {
            return Err(WireError::new(
                ErrorCode::InvalidRecord,
                format!("report is over {MAX_REPORT_BYTES} bytes"),
            ));
        }
        let reported = if frame::frame_kind(&msg.payload) == Some(frame::FrameKind::Report) {
            frame::decode_report(&msg.payload)?
                .map_err(|e| WireError::new(ErrorCode::InvalidRecord, e))?
        } else {
            parse_json_report(&msg.payload)?
        };
        let records = self.check_all(&channel, reported, &mut TokenCache::new())?;
        let n = self.relay(records);
        // A report is answered once its records are stored (a killed broker loses none).
        let _ = self.sink.stored(budget.stored_wait()).await;
        Ok(n)
    }

    /// Checks and relays the records that rode along an upload or settle batch. They are
    /// accepted whole or refused whole; a refusal never fails the request they rode on.
    pub(crate) async fn relay_reported(
        &self,
        channel: &OpenChannel,
        reported: Vec<ReportedRecord>,
        invalid: Option<String>,
        tokens: &mut TokenCache,
    ) -> ReportsOutcome {
        if let Some(why) = invalid {
            let e = WireError::new(ErrorCode::InvalidRecord, why);
            self.metrics.error(e.code);
            return ReportsOutcome {
                accepted: 0,
                error: Some(e),
            };
        }
        if reported.is_empty() {
            return ReportsOutcome::default();
        }
        match self.check_all(channel, reported, tokens) {
            Ok(records) => ReportsOutcome {
                accepted: self.relay(records) as u32,
                error: None,
            },
            Err(e) => {
                self.metrics.error(e.code);
                ReportsOutcome {
                    accepted: 0,
                    error: Some(e),
                }
            }
        }
    }

    /// Checks and relays the records a settle carries about its own delivery, whose `token`
    /// the settle path has verified for this channel's consumer: the same checks as a
    /// report's consumer records, without verifying the token again. Accepted whole or
    /// refused whole (per settle; the refusal is counted, never fails the settle); returns
    /// how many were relayed.
    pub(crate) fn relay_own(
        &self,
        channel: &OpenChannel,
        token: &AckToken,
        records: Vec<StageRecord>,
        invalid: Option<String>,
    ) -> usize {
        // What the token names is worked out once for all of the settle's records (`by_id`
        // derives a consumer name: thousands of instructions, per record before).
        let by_id = token.by_id();
        let checked = match invalid {
            Some(why) => Err(WireError::new(ErrorCode::InvalidRecord, why)),
            None => records
                .into_iter()
                .enumerate()
                .map(|(i, mut r)| {
                    self.check_owner(i + 1, &mut r, channel)?;
                    if matches!(r.stage, Stage::UploadSent | Stage::StoreConfirmed) {
                        return Err(not_owned(
                            i + 1,
                            format!("stage {} is not a delivery's", r.stage),
                        ));
                    }
                    apply_token(i + 1, &mut r, token, by_id)?;
                    Ok(r)
                })
                .collect::<Result<Vec<_>, _>>(),
        };
        match checked {
            Ok(records) => {
                let n = self.relay(records);
                self.metrics
                    .own_records
                    .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                n
            }
            Err(e) => {
                tracing::debug!(error = %e, "a settle's own stage records refused");
                self.metrics.error(e.code);
                0
            }
        }
    }

    fn relay(&self, records: Vec<StageRecord>) -> usize {
        let n = records.len();
        for r in records {
            self.sink.record(r);
        }
        self.metrics
            .relayed_records
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        n
    }

    /// Checks every record; the first offending one (1-based) refuses the lot. A token shared
    /// by several records (a delivery's C6, X1, X2, C7) is verified once.
    fn check_all(
        &self,
        channel: &OpenChannel,
        reported: Vec<ReportedRecord>,
        tokens: &mut TokenCache,
    ) -> Result<Vec<StageRecord>, WireError> {
        if reported.len() > MAX_REPORT_RECORDS {
            return Err(WireError::new(
                ErrorCode::InvalidRecord,
                format!("more than {MAX_REPORT_RECORDS} records in one report"),
            ));
        }
        let mut out = Vec::with_capacity(reported.len());
        for (i, rep) in reported.into_iter().enumerate() {
            let mut r = rep.record;
            let token = Some(rep.token).filter(|t| !t.is_empty());
            self.check(i + 1, &mut r, token.as_deref(), channel, tokens)?;
            out.push(r);
        }
        Ok(out)
    }

    /// Checks one reported record against the channel that reports it and fills in what the
    /// broker vouches for: owner and service always; for P4 the upload receipt; for a
    /// consumer stage the delivery its ack token names.
    fn check(
        &self,
        n: usize,
        r: &mut StageRecord,
        token: Option<&str>,
        channel: &OpenChannel,
        tokens: &mut TokenCache,
    ) -> Result<(), WireError> {
        self.check_owner(n, r, channel)?;
        match r.stage {
            Stage::UploadSent => {
                if r.request_id.is_none() {
                    return Err(invalid(n, "stage P1 needs a request_id"));
                }
            }
            Stage::StoreConfirmed => self.check_receipt(n, r, token, channel)?,
            _ => self.check_delivery(n, r, token, channel, tokens)?,
        }
        Ok(())
    }

    /// The checks of every record, whatever proves it: a stage the channel's role reports,
    /// naming no other client; fills in owner and service, and drops what only a broker
    /// says.
    fn check_owner(
        &self,
        n: usize,
        r: &mut StageRecord,
        channel: &OpenChannel,
    ) -> Result<(), WireError> {
        if !r.stage.reportable_by(channel.role) {
            return Err(not_owned(
                n,
                format!("a {} channel cannot report stage {}", channel.role, r.stage),
            ));
        }
        let who = match channel.role {
            Role::Producer => &mut r.producer,
            Role::Consumer => &mut r.consumer,
        };
        match who {
            Some(id) if *id != channel.client_id => {
                return Err(not_owned(
                    n,
                    format!(
                        "record names {} {id}, but the channel belongs to {}",
                        channel.role, channel.client_id
                    ),
                ));
            }
            _ => *who = Some(channel.client_id.clone()),
        }
        r.service = Some(channel.service_name.clone());
        // Only a broker names its instance and JetStream's stored time; a client that sends
        // them is not believed (the sink leaves a client's record without an instance).
        r.broker = None;
        r.stored_at = None;
        Ok(())
    }

    /// P4: the record's request and message must match the upload reply's receipt.
    fn check_receipt(
        &self,
        n: usize,
        r: &StageRecord,
        token: Option<&str>,
        channel: &OpenChannel,
    ) -> Result<(), WireError> {
        let (Some(req), Some(msg)) = (&r.request_id, &r.message_id) else {
            return Err(invalid(n, "stage P4 needs a request_id and a message_id"));
        };
        let receipt = token
            .ok_or_else(|| not_owned(n, "stage P4 needs token = the upload reply's receipt"))?;
        if !self
            .key
            .verify_receipt(&channel.client_id, req, msg, receipt)
        {
            return Err(not_owned(
                n,
                format!(
                    "receipt does not match {} / request {req} / message {msg}",
                    channel.client_id
                ),
            ));
        }
        Ok(())
    }

    /// A consumer stage: the ack token must be one of this channel's deliveries, of the same
    /// mode (push or pull), and the record must not contradict it; the record then takes
    /// the delivery's message, group, attempt, sequence and topic.
    fn check_delivery(
        &self,
        n: usize,
        r: &mut StageRecord,
        token: Option<&str>,
        channel: &OpenChannel,
        tokens: &mut TokenCache,
    ) -> Result<(), WireError> {
        let text = token.ok_or_else(|| {
            not_owned(
                n,
                format!("stage {} needs token = the delivery's ack token", r.stage),
            )
        })?;
        let t = tokens
            .decode(text, &channel.client_id, &self.key)
            .map_err(|e| not_owned(n, e.message))?;
        apply_token(n, r, &t, t.by_id())
    }
}

/// A consumer stage against its delivery's verified ack token: of the same mode (push or
/// pull), not contradicting it; the record then takes the delivery's message, group,
/// attempt, sequence and topic, and `by_id` (the token's [`AckToken::by_id`]).
fn apply_token(n: usize, r: &mut StageRecord, t: &AckToken, by_id: bool) -> Result<(), WireError> {
    let push_stage = matches!(r.stage, Stage::PushReceived | Stage::PushAckSent);
    let pull_stage = matches!(r.stage, Stage::PullReceived | Stage::PullAckSent);
    if (push_stage && !t.p) || (pull_stage && t.p) {
        return Err(not_owned(
            n,
            format!(
                "stage {} does not match a {} delivery",
                r.stage,
                if t.p { "push" } else { "pull" }
            ),
        ));
    }
    if r.message_id.is_some_and(|m| m != t.m)
        || r.group.as_ref().is_some_and(|g| *g != t.g)
        || r.attempt.is_some_and(|a| a != t.n)
        || r.topic.as_ref().is_some_and(|topic| *topic != t.t)
    {
        return Err(not_owned(
            n,
            "record's message, group, attempt or topic differ from its delivery token",
        ));
    }
    r.message_id = Some(t.m);
    r.group = Some(t.g.clone());
    r.attempt = Some(t.n);
    r.stream_seq = Some(t.q);
    r.topic = Some(t.t.clone());
    r.by_id = by_id;
    Ok(())
}
