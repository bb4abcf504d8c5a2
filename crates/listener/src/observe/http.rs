//! `GET /api/observe`: the observed streams and their consumers, with the consumers that do
//! not sample every ack and the command that fixes each (behind the API's bearer token).

use super::ObserveStatus;
use axum::routing::get;
use axum::{Json, Router};
use std::sync::Arc;

/// The observe route, behind the API's bearer token when one is set.
pub(crate) fn routes(status: Arc<ObserveStatus>, token: Option<secrecy::SecretString>) -> Router {
    let r = Router::new().route(
        "/api/observe",
        get(move || {
            let status = status.clone();
            async move { Json(serde_json::json!({ "streams": status.snapshot() })) }
        }),
    );
    crate::http::protect(r, token)
}
