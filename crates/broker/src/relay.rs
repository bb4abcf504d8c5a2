//! Relaying the clients' own stage records (P1, P4, C2/C3, C6/C7, X1/X2) into the stage
//! stream, after checking that each record belongs to the sender's channel (DESIGN.md §3.4):
//! its stage is one the channel's role reports, and the producer or consumer it names is the
//! channel's client (filled in when absent). The record's `service` is set from the channel,
//! so no client can speak for another service either. A batch is accepted whole or refused
//! whole, with the first offending line named.

use crate::channels::Channels;
use crate::metrics::Metrics;
use crate::stage_sink::StageSink;
use crate::upload::required;
use msgtrail_core::headers as h;
use msgtrail_core::record::decode_batch;
use msgtrail_core::{ErrorCode, Role, WireError};
use std::sync::Arc;

/// Most records in one report.
pub const MAX_REPORT_RECORDS: usize = 1000;

/// Checks and relays client stage reports.
#[derive(Debug, Clone)]
pub struct Relay {
    /// Channels.
    pub channels: Channels,
    /// The stage sink.
    pub sink: StageSink,
    /// Counters.
    pub metrics: Arc<Metrics>,
}

impl Relay {
    /// Handles one `stage` report; returns how many records were accepted.
    pub async fn handle(&self, msg: &async_nats::Message) -> Result<usize, WireError> {
        let headers = msg.headers.as_ref().ok_or_else(|| {
            WireError::new(
                ErrorCode::BadRequest,
                format!("missing header {}", h::CHANNEL),
            )
        })?;
        let channel = self.channels.lookup(required(headers, h::CHANNEL)?).await?;
        let mut records = decode_batch(&msg.payload)
            .map_err(|e| WireError::new(ErrorCode::InvalidRecord, e.to_string()))?;
        if records.len() > MAX_REPORT_RECORDS {
            return Err(WireError::new(
                ErrorCode::InvalidRecord,
                format!(
                    "{} records in one report; at most {MAX_REPORT_RECORDS}",
                    records.len()
                ),
            ));
        }
        for (i, r) in records.iter_mut().enumerate() {
            let line = i + 1;
            if !r.stage.reportable_by(channel.role) {
                return Err(WireError::new(
                    ErrorCode::RecordNotOwned,
                    format!(
                        "line {line}: a {} channel cannot report stage {}",
                        channel.role, r.stage
                    ),
                ));
            }
            let who = match channel.role {
                Role::Producer => &mut r.producer,
                Role::Consumer => &mut r.consumer,
            };
            match who {
                Some(id) if *id != channel.client_id => {
                    return Err(WireError::new(
                        ErrorCode::RecordNotOwned,
                        format!(
                            "line {line}: record names {} {id}, but the channel belongs to {}",
                            channel.role, channel.client_id
                        ),
                    ))
                }
                _ => *who = Some(channel.client_id.clone()),
            }
            if r.stage.reportable_by(Role::Producer) && r.request_id.is_none() {
                return Err(WireError::new(
                    ErrorCode::InvalidRecord,
                    format!("line {line}: stage {} needs a request_id", r.stage),
                ));
            }
            if r.stage.reportable_by(Role::Consumer) && r.message_id.is_none() {
                return Err(WireError::new(
                    ErrorCode::InvalidRecord,
                    format!("line {line}: stage {} needs a message_id", r.stage),
                ));
            }
            r.service = Some(channel.service_name.clone());
        }
        let n = records.len();
        for r in records {
            self.sink.record(r);
        }
        self.metrics
            .relayed_records
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(n)
    }
}
