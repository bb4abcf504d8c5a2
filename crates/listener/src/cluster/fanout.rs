//! Any member answers for all: an HTTP layer over the listener's API that sends a message
//! lookup (`GET /api/messages/<id>`) to an owner of the ID's partition and merges a search
//! (`GET /api/messages?…`) over members that together hold every partition. A request the
//! layer forwards carries [`LOCAL_HEADER`], so the member asked answers from its own store
//! and never forwards again; the caller's `Authorization` goes along (every member of a
//! group shares the token).
//!
//! A lookup by message ID asks the partition's owners in order (ready ones first, this
//! member answering itself when it is one) until one has it; a lookup by anything else (a
//! request ID) asks one owner of every partition until one has it. Statistics
//! (`GET /api/stats`), groups and dead letters are merged from one owner's share of each
//! partition (`super::merged`).

use super::ClusterView;
use crate::stats::Stats;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use msgtrail_core::partition::Partition;
use msgtrail_core::MessageId;
use std::sync::Arc;
use std::time::Duration;

/// The header of a request one member forwards to another: answer from your own store.
pub const LOCAL_HEADER: &str = "x-msgtrail-local";
/// The header of a merged answer some members did not contribute to (their names).
pub const PARTIAL_HEADER: &str = "x-msgtrail-partial";
/// How long a member waits for another's answer.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub(super) struct Fanout {
    pub(super) view: Arc<ClusterView>,
    client: Client<HttpConnector, Empty<Bytes>>,
    /// This member's statistics: a merged snapshot adds its ingest and lag figures.
    pub(super) stats: Arc<Stats>,
}

/// Wraps the API router in the fan-out layer of `view`'s group.
pub(crate) fn layer(router: Router, view: Arc<ClusterView>, stats: Arc<Stats>) -> Router {
    let client = Client::builder(TokioExecutor::new()).build_http();
    router.layer(axum::middleware::from_fn_with_state(
        Fanout {
            view,
            client,
            stats,
        },
        fan,
    ))
}

async fn fan(State(f): State<Fanout>, req: Request, next: Next) -> Response {
    if req.method() != Method::GET || req.headers().contains_key(LOCAL_HEADER) {
        return next.run(req).await;
    }
    let path = req.uri().path().to_owned();
    if let Some(id) = path
        .strip_prefix("/api/messages/")
        .filter(|id| !id.is_empty() && !id.contains('/'))
    {
        let id = percent_encoding::percent_decode_str(id)
            .decode_utf8_lossy()
            .into_owned();
        let targets = match id.parse::<MessageId>() {
            Ok(m) => f.view.owners_of(Partition::of_message(&m)),
            Err(_) => f.view.cover(),
        };
        return first_found(&f, targets, req, next).await;
    }
    if path == "/api/messages" {
        return merged_search(&f, req, next).await;
    }
    if path == "/api/stats" {
        return super::merged::stats(&f, req, next).await;
    }
    if path == "/api/dead-letters" {
        return super::merged::dead_letters(&f, req, next).await;
    }
    if path == "/api/groups" {
        return super::merged::groups(&f, req, next).await;
    }
    if let Some(group) = path
        .strip_prefix("/api/groups/")
        .filter(|g| !g.is_empty() && !g.contains('/'))
    {
        let group = percent_encoding::percent_decode_str(group)
            .decode_utf8_lossy()
            .into_owned();
        return super::merged::group(&f, &group, req, next).await;
    }
    if path == "/metrics" {
        return with_partition_metrics(&f.view, next.run(req).await).await;
    }
    next.run(req).await
}

/// Adds this member's share to its metrics: partitions held by role, and the messages its
/// rebuilding partitions still have to replay (0 once every held partition caught up).
async fn with_partition_metrics(view: &ClusterView, r: Response) -> Response {
    if !r.status().is_success() {
        return r;
    }
    let (parts, body) = r.into_parts();
    let Ok(bytes) = body.collect().await.map(|b| b.to_bytes()) else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let text = String::from_utf8_lossy(&bytes);
    let held = view.held();
    let primary = held.iter().filter(|h| h.primary).count();
    let extra = format!(
        "# HELP msgtrail_listener_partitions_held Stage partitions this member holds, by role.\n\
         # TYPE msgtrail_listener_partitions_held gauge\n\
         msgtrail_listener_partitions_held{{role=\"primary\"}} {primary}\n\
         msgtrail_listener_partitions_held{{role=\"copy\"}} {}\n\
         # HELP msgtrail_listener_partition_rebuild_pending Stage-stream messages the partitions being rebuilt still have to replay.\n\
         # TYPE msgtrail_listener_partition_rebuild_pending gauge\n\
         msgtrail_listener_partition_rebuild_pending {}\n",
        held.len() - primary,
        view.rebuild_pending()
    );
    // OpenMetrics ends with `# EOF`: the additions go before it.
    let out = match text.strip_suffix("# EOF\n") {
        Some(head) => format!("{head}{extra}# EOF\n"),
        None => format!("{text}{extra}"),
    };
    let mut parts = parts;
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(out))
}

/// What a forwarded request needs of the original.
pub(super) struct Forward {
    /// The path and query to ask for.
    pub(super) path_and_query: String,
    /// The caller's `Authorization`, passed on.
    pub(super) authorization: Option<HeaderValue>,
}

impl Forward {
    fn of(req: &Request) -> Self {
        Forward {
            path_and_query: req
                .uri()
                .path_and_query()
                .map_or_else(|| req.uri().path().to_owned(), |p| p.as_str().to_owned()),
            authorization: req.headers().get(header::AUTHORIZATION).cloned(),
        }
    }
}

/// Asks `targets` in order (this member by running the local handler) until one answers
/// anything but 404; the last answer otherwise.
async fn first_found(
    f: &Fanout,
    targets: Vec<(String, String)>,
    req: Request,
    next: Next,
) -> Response {
    let fwd = Forward::of(&req);
    let mut local = Some((req, next));
    let mut last: Option<Response> = None;
    for (name, url) in targets {
        let answer = if name == f.view.me() {
            match local.take() {
                Some((req, next)) => next.run(req).await,
                None => continue,
            }
        } else {
            match forward(f, &url, &fwd).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(member = %name, error = %e, "forwarded lookup failed");
                    continue;
                }
            }
        };
        if answer.status() != StatusCode::NOT_FOUND {
            return answer;
        }
        last = Some(answer);
    }
    match (last, local) {
        (Some(r), _) => r,
        // No owner answered (none live yet): this member's own answer.
        (None, Some((req, next))) => next.run(req).await,
        (None, None) => (
            StatusCode::BAD_GATEWAY,
            "no owner of the partition answered\n",
        )
            .into_response(),
    }
}

/// Runs the search on one owner of every partition and merges the lists: newest first,
/// each message once, at most the asked limit.
async fn merged_search(f: &Fanout, req: Request, next: Next) -> Response {
    let fwd = Forward::of(&req);
    let limit = req
        .uri()
        .query()
        .and_then(|q| {
            q.split('&')
                .find_map(|kv| kv.strip_prefix("limit="))
                .and_then(|v| v.parse::<usize>().ok())
        })
        .unwrap_or(100)
        .clamp(1, 10_000);
    let mut local = Some((req, next));
    let mut all: Vec<serde_json::Value> = Vec::new();
    let mut missing: Vec<String> = Vec::new();
    for (name, url) in f.view.cover() {
        let answer = if name == f.view.me() {
            match local.take() {
                Some((req, next)) => next.run(req).await,
                None => continue,
            }
        } else {
            match forward(f, &url, &fwd).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(member = %name, error = %e, "forwarded search failed");
                    missing.push(name);
                    continue;
                }
            }
        };
        if !answer.status().is_success() {
            // A bad query is bad everywhere: say so as the member did.
            if answer.status().is_client_error() {
                return answer;
            }
            missing.push(name);
            continue;
        }
        match body_json(answer).await {
            Some(serde_json::Value::Array(items)) => all.extend(items),
            _ => missing.push(name),
        }
    }
    if all.is_empty() && missing.is_empty() {
        if let Some((req, next)) = local {
            return next.run(req).await;
        }
    }
    let first_at = |v: &serde_json::Value| v.get("first_at").and_then(|t| t.as_u64()).unwrap_or(0);
    all.sort_by_key(|v| std::cmp::Reverse(first_at(v)));
    let mut seen = std::collections::HashSet::new();
    all.retain(|v| seen.insert(v.get("key").map(ToString::to_string).unwrap_or_default()));
    all.truncate(limit);
    let mut resp = axum::Json(all).into_response();
    if !missing.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&missing.join(",")) {
            resp.headers_mut().insert(PARTIAL_HEADER, v);
        }
    }
    resp
}

pub(super) async fn body_json<T: serde::de::DeserializeOwned>(r: Response) -> Option<T> {
    let bytes = r.into_body().collect().await.ok()?.to_bytes();
    serde_json::from_slice(&bytes).ok()
}

/// Why a forwarded request failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum ForwardError {
    #[error("bad member url {0:?}")]
    Url(String),
    #[error("request failed")]
    Request(#[source] hyper_util::client::legacy::Error),
    #[error("reading the answer failed")]
    Body(#[source] hyper::Error),
    #[error("no answer within {} s", FORWARD_TIMEOUT.as_secs())]
    Timeout,
}

/// Sends the request to the member at `url` with [`LOCAL_HEADER`] and returns its answer.
pub(super) async fn forward(
    f: &Fanout,
    url: &str,
    fwd: &Forward,
) -> Result<Response, ForwardError> {
    let uri: hyper::Uri = format!("{}{}", url.trim_end_matches('/'), fwd.path_and_query)
        .parse()
        .map_err(|_| ForwardError::Url(url.to_owned()))?;
    let mut builder = hyper::Request::get(uri).header(LOCAL_HEADER, "1");
    if let Some(a) = &fwd.authorization {
        builder = builder.header(header::AUTHORIZATION, a.clone());
    }
    let request = builder
        .body(Empty::new())
        .map_err(|_| ForwardError::Url(url.to_owned()))?;
    let call = async {
        let resp = f
            .client
            .request(request)
            .await
            .map_err(ForwardError::Request)?;
        let (parts, body) = resp.into_parts();
        let bytes = body.collect().await.map_err(ForwardError::Body)?.to_bytes();
        Ok::<_, ForwardError>(Response::from_parts(parts, Body::from(bytes)))
    };
    tokio::time::timeout(FORWARD_TIMEOUT, call)
        .await
        .map_err(|_| ForwardError::Timeout)?
}
