//! The HTTP API (axum).
//!
//! | route | answer |
//! | --- | --- |
//! | `GET /api/messages/{message-id or request-id}[?producer=P]` | the [`Trajectory`] as JSON (a request ID stored as several messages, uploaded again after the dedup window: the latest, its `same_request` naming the others); 404 not found; 409 a request ID several producers used |
//! | `GET /api/messages/{id}/spans[?producer=P]` | [`TrajectorySpans`]: per hop, the span the trace exporter maps it to, with its `msgtrail.*`/`messaging.*` attributes |
//! | `GET /api/messages?topic=&state=&from=&to=&since_secs=&limit=&producer=&group=&min_ms=&failed=true&redelivered=true&dead_letter=true&attr=k=v` | matching [`MessageSummary`]s, newest first (`topic` may hold `*` and `>` wildcards; `min_ms` is the slowest group's end to end; `failed`, `redelivered`, `dead_letter`: at any hop) |
//! | `GET /api/groups[?since_secs=S]` | [`GroupsOverview`]: per consumer group, its messages first seen in the last S seconds (default 900) by state, backlog, in flight, ack rate, dead letters |
//! | `GET /api/groups/{group}[?since_secs=S]` | [`GroupDetail`]: the group's counts, and from its newest 300 trajectories its members, redeliveries and p50/p99 per hop segment; 404 when no message of the window reached it |
//! | `GET /api/share/groups?partitions=0,3,7[&since_secs=S]`, `GET /api/share/groups/{group}?partitions=…[&since_secs=S]` | [`GroupsShare`], [`GroupDetailShare`]: what this member's messages of those stage partitions give the group views, unsummarized (what a group member asks another, to merge) |
//! | `GET /api/dead-letters[?limit=N][&partitions=0,3,7]` | [`DeadLetter`]s, newest first (default 100, at most 1 000): topic, group, consumer, attempt, why; with `partitions`, of those stage partitions' messages only (a group member's share) |
//! | `GET /api/clients/{client-id}` | [`ClientClocks`]: the client's clock offset per broker instance, the best (smallest round trip) of its exchanges in the last 60 s of records ([`crate::clocks`]); none for a client not seen |
//! | `GET /api/clients/{client-id}/events[?limit=N]` | [`ClientEvents`]: the client's N1 (no-match) and A1 (channel) records, newest first (default 100, at most 512; the newest 512 per client are kept, subject to the age retention) |
//! | `GET /api/stats[?topic=T][&stream=S]` | [`StatsSnapshot`] (`stream`: observe mode's section of that stream only; in a group: every partition's, merged by the fan-out layer of `crate::cluster`) |
//! | `GET /api/share/stats?partitions=0,3,7` | [`StatsShare`]: this member's counters and latency histograms of exactly those stage partitions (what a group member asks another; a listener outside a group keeps no per-partition figures and answers zeros) |
//! | `GET /metrics` | Prometheus text 0.0.4, or OpenMetrics 1.0 with the latency histograms' exemplars (trace IDs) when `Accept` asks for `application/openmetrics-text` ([`Exposition`]) |
//! | `GET /healthz` | `ok`; 503 with the reason while the store cannot write (never needs the token) |
//! | `GET /` | the page: statistics, recent messages (observed ones marked), a trajectory's timeline (an observed one with its stream, sequence and unsampled consumers), the group, dead-letter, client and observed-streams (`/api/observe`) views (static, with its scripts `/page.js`, `/page-list.js`, `/page-trace.js` and `/page-views.js`; its data calls carry the token) |
//! | `GET /api/config` | `{"trace_ui_template": "http://…/trace/{trace_id}" or null, "span_ui_template": "…{trace_id}…{span_id}…" or null}` |
//! | `GET /favicon.ico` | the page's icon (SVG) |
//!
//! With a token configured, `/api/*` and `/metrics` require `Authorization: Bearer <token>`.
//! Errors are `{"error": "...", "kind": "not_found" | "ambiguous" | "bad_request" |
//! "unauthorized" | "store"}`, so "not found" never reads as "the query failed".
//!
//! [`Trajectory`]: msgtrail_core::trajectory::Trajectory
//! [`MessageSummary`]: crate::store::MessageSummary
//! [`StatsSnapshot`]: crate::stats::StatsSnapshot
//! [`StatsShare`]: crate::stats::StatsShare
//! [`ClientClocks`]: crate::clocks::ClientClocks
//! [`Exposition`]: crate::stats::Exposition
//! [`GroupsOverview`]: crate::views::GroupsOverview
//! [`GroupDetail`]: crate::views::GroupDetail
//! [`DeadLetter`]: crate::views::DeadLetter
//! [`GroupsShare`]: crate::views::group_share::GroupsShare
//! [`GroupDetailShare`]: crate::views::group_share::GroupDetailShare
//! [`TrajectorySpans`]: crate::views::spans::TrajectorySpans

use crate::clocks::ClockWindow;
use crate::error::QueryError;
use crate::export::ExportSender;
use crate::stats::{Exposition, Stats};
use crate::store::{SearchQuery, Store};
use axum::extract::{FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use msgtrail_core::partition::Partition;
use msgtrail_core::time::now_nanos;
use msgtrail_core::trajectory::MessageState;
use msgtrail_listener_client::{ApiError, ClientEvents};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use subtle::ConstantTimeEq;

pub(crate) fn error(
    status: StatusCode,
    kind: &str,
    msg: String,
    producers: Vec<String>,
) -> Response {
    (
        status,
        Json(ApiError {
            error: msg,
            kind: kind.to_owned(),
            producers,
        }),
    )
        .into_response()
}

impl IntoResponse for QueryError {
    fn into_response(self) -> Response {
        // The store's error names its cause as its source: the reply shows the chain once.
        let msg = msgtrail_core::ErrorChain(&self).to_string();
        match self {
            QueryError::NotFound(_) => error(StatusCode::NOT_FOUND, "not_found", msg, vec![]),
            QueryError::Ambiguous { producers, .. } => {
                error(StatusCode::CONFLICT, "ambiguous", msg, producers)
            }
            QueryError::BadRequest(_) => error(StatusCode::BAD_REQUEST, "bad_request", msg, vec![]),
            QueryError::Store(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "store", msg, vec![]),
        }
    }
}

#[derive(Clone)]
struct AppState {
    store: Arc<Store>,
    stats: Arc<Stats>,
    clocks: Arc<ClockWindow>,
    exporter: Option<ExportSender>,
    token: Option<Arc<SecretString>>,
    trace_ui_template: Option<String>,
    span_ui_template: Option<String>,
    /// Completes a served trajectory (observe mode's unsampled consumers).
    amend: Option<crate::export::Amend>,
}

/// What the page needs to know about this listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct UiConfig {
    /// A link to a trace with `{trace_id}` in place of the 32 hex digits, when a tracing UI
    /// is configured.
    pub trace_ui_template: Option<String>,
    /// A link to one span of a trace, with `{trace_id}` and `{span_id}` (16 hex digits) in
    /// place of the IDs, when a tracing UI is configured.
    pub span_ui_template: Option<String>,
}

/// The page, compiled in: its markup and style, and its four scripts (served apart so that
/// each file stays one concern; all of them work offline).
const PAGE: &str = include_str!("page.html");
/// The page's core script: API, token, times, statistics.
const PAGE_JS: &str = include_str!("page.js");
/// The page's search form and result list (sortable, scatter plot, live list).
const PAGE_LIST_JS: &str = include_str!("page-list.js");
/// The page's trajectory view: the waterfall, its minimap and zoom, the hop detail.
const PAGE_TRACE_JS: &str = include_str!("page-trace.js");
/// The page's views beside a trajectory: groups, dead letters, a client's events.
const PAGE_VIEWS_JS: &str = include_str!("page-views.js");

/// The page's icon: a trail of three dots (SVG), so that no request for it answers 404.
const FAVICON: &str = r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" rx="3" fill="#24292f"/><circle cx="4" cy="11" r="2" fill="#1a7f37"/><circle cx="8" cy="7" r="2" fill="#9a6700"/><circle cx="12" cy="4" r="2" fill="#0969da"/></svg>"##;

/// The placeholder the trace UI template carries.
const TRACE_ID_SLOT: &str = "{trace_id}";
/// The placeholder the span UI template carries.
const SPAN_ID_SLOT: &str = "{span_id}";

/// The bearer-token check of `/api/*` and `/metrics`, as one layer over those routes: with
/// a token configured, a request without `Authorization: Bearer <token>` gets 401 before any
/// handler or extractor runs. The comparison is constant-time (`subtle`): the token is a
/// secret, and the time a comparison takes must not say how much of a guess was right.
async fn require_token(State(st): State<AppState>, req: Request, next: Next) -> Response {
    check_token(st.token, req, next).await
}

/// Puts `router`'s routes behind the API's bearer token (for routes another module owns,
/// such as observe mode's `/api/observe`).
pub(crate) fn protect(router: Router, token: Option<SecretString>) -> Router {
    let token = token.map(Arc::new);
    router.route_layer(middleware::from_fn(move |req: Request, next: Next| {
        check_token(token.clone(), req, next)
    }))
}

/// Answers 401 unless the request carries `want` as its bearer token (any request passes
/// when no token is configured).
async fn check_token(want: Option<Arc<SecretString>>, req: Request, next: Next) -> Response {
    let Some(want) = want else {
        return next.run(req).await;
    };
    let got = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let ok = got.is_some_and(|g| bool::from(g.as_bytes().ct_eq(want.expose_secret().as_bytes())));
    if ok {
        next.run(req).await
    } else {
        error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong bearer token".to_owned(),
            vec![],
        )
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, QueryError> + Send + 'static,
) -> Result<T, QueryError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| QueryError::Store(crate::error::StoreError::Task(e)))?
}

/// Builds the router over a store, its statistics and the trace exporter (if any).
pub(crate) fn router(
    store: Arc<Store>,
    stats: Arc<Stats>,
    clocks: Arc<ClockWindow>,
    exporter: Option<ExportSender>,
    token: Option<SecretString>,
    trace_ui: Option<&msgtrail_otel::TraceUi>,
    amend: Option<crate::export::Amend>,
) -> Router {
    // Hex-looking markers survive any escaping the UI's link format applies.
    let (marker, span_marker) = ("f".repeat(32), "e".repeat(16));
    let state = AppState {
        store,
        stats,
        clocks,
        exporter,
        token: token.map(Arc::new),
        amend,
        trace_ui_template: trace_ui.map(|u| u.link_hex(&marker).replace(&marker, TRACE_ID_SLOT)),
        span_ui_template: trace_ui.map(|u| {
            u.span_link_hex(&marker, &span_marker)
                .replace(&marker, TRACE_ID_SLOT)
                .replace(&span_marker, SPAN_ID_SLOT)
        }),
    };
    let protected = Router::new()
        .route("/api/config", get(ui_config))
        .route("/metrics", get(metrics))
        .route("/api/stats", get(stats_handler))
        .route("/api/share/stats", get(stats_share))
        .route("/api/messages", get(search))
        .route("/api/messages/{id}", get(message))
        .route("/api/messages/{id}/spans", get(message_spans))
        .route("/api/clients/{id}", get(client_clocks))
        .route("/api/clients/{id}/events", get(client_events))
        .route("/api/groups", get(groups))
        .route("/api/groups/{group}", get(group))
        .route("/api/share/groups", get(groups_share))
        .route("/api/share/groups/{group}", get(group_share))
        .route("/api/dead-letters", get(dead_letters))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    Router::new()
        .route("/", get(page))
        .route(
            "/page.js",
            get(|| asset("text/javascript; charset=utf-8", PAGE_JS)),
        )
        .route(
            "/page-list.js",
            get(|| asset("text/javascript; charset=utf-8", PAGE_LIST_JS)),
        )
        .route(
            "/page-trace.js",
            get(|| asset("text/javascript; charset=utf-8", PAGE_TRACE_JS)),
        )
        .route(
            "/page-views.js",
            get(|| asset("text/javascript; charset=utf-8", PAGE_VIEWS_JS)),
        )
        .route("/favicon.ico", get(|| asset("image/svg+xml", FAVICON)))
        .route("/healthz", get(healthz))
        .merge(protected)
        .fallback(not_found)
        .with_state(state)
}

/// `ok` while the store writes; 503 with the outage while it cannot (a full disk, an I/O
/// error): reads go on, but nothing new is stored or acknowledged.
async fn healthz(State(st): State<AppState>) -> Response {
    match st.stats.store_outage() {
        None => "ok\n".into_response(),
        Some((since, error)) => {
            let secs = msgtrail_core::time::now_nanos().saturating_sub(since) / 1_000_000_000;
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("store cannot write for {secs} s: {error}\n"),
            )
                .into_response()
        }
    }
}

async fn page() -> Response {
    asset("text/html; charset=utf-8", PAGE).await
}

/// A compiled-in file of the page (never needs the token: it holds no data).
async fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

async fn ui_config(State(st): State<AppState>) -> Response {
    Json(UiConfig {
        trace_ui_template: st.trace_ui_template.clone(),
        span_ui_template: st.span_ui_template.clone(),
    })
    .into_response()
}

#[derive(Debug, Deserialize)]
struct MessageParams {
    producer: Option<String>,
}

async fn message(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(p): ApiQuery<MessageParams>,
) -> Response {
    let (store, amend) = (st.store.clone(), st.amend.clone());
    json(
        blocking(move || {
            let mut t = store.lookup(&id, p.producer.as_deref(), now_nanos())?;
            if let Some(a) = &amend {
                a(&mut t);
            }
            Ok(t)
        })
        .await,
    )
}

async fn message_spans(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(p): ApiQuery<MessageParams>,
) -> Response {
    let (store, amend) = (st.store.clone(), st.amend.clone());
    json(
        blocking(move || {
            let now = now_nanos();
            let mut t = store.lookup(&id, p.producer.as_deref(), now)?;
            if let Some(a) = &amend {
                a(&mut t);
            }
            Ok(crate::views::spans(&t, now))
        })
        .await,
    )
}

#[derive(Debug, Deserialize)]
struct ClientEventParams {
    limit: Option<usize>,
}

async fn client_events(
    State(st): State<AppState>,
    Path(client): Path<String>,
    ApiQuery(p): ApiQuery<ClientEventParams>,
) -> Response {
    let store = st.store.clone();
    let limit = p.limit.unwrap_or(100);
    let who = client.clone();
    match blocking(move || Ok(store.client_events(&who, limit)?)).await {
        Ok(events) => Json(ClientEvents { client, events }).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The window of the group views when the query does not say: 15 minutes.
pub(crate) const GROUP_WINDOW_SECS: u64 = 900;

#[derive(Debug, Deserialize)]
struct WindowParams {
    since_secs: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct ShareWindowParams {
    since_secs: Option<u64>,
    partitions: String,
}

impl ShareWindowParams {
    /// The window of a member's share.
    fn window(&self) -> Result<crate::views::groups::Window, BadPartitions> {
        Ok(crate::views::groups::Window {
            since_secs: self.since_secs.unwrap_or(GROUP_WINDOW_SECS),
            partitions: partitions_param(Some(&self.partitions))?,
        })
    }
}

/// A member's share of a group view over the window `p` names: `view` run on the store.
async fn share_of<T: serde::Serialize + Send + 'static>(
    st: &AppState,
    p: &ShareWindowParams,
    view: impl FnOnce(&Store, u64, &crate::views::groups::Window) -> Result<T, crate::StoreError>
        + Send
        + 'static,
) -> Response {
    let w = match p.window() {
        Ok(w) => w,
        Err(e) => return e.into_response(),
    };
    let store = st.store.clone();
    json(blocking(move || Ok(view(&store, now_nanos(), &w)?)).await)
}

async fn groups_share(
    State(st): State<AppState>,
    ApiQuery(p): ApiQuery<ShareWindowParams>,
) -> Response {
    share_of(&st, &p, crate::views::groups::groups_share).await
}

async fn group_share(
    State(st): State<AppState>,
    Path(group): Path<String>,
    ApiQuery(p): ApiQuery<ShareWindowParams>,
) -> Response {
    share_of(&st, &p, move |store, now, w| {
        crate::views::groups::group_detail_share(store, &group, now, w)
    })
    .await
}

/// The window a group view covers, in seconds: the query's `since_secs` or 15 minutes.
fn window(p: &WindowParams) -> u64 {
    p.since_secs.unwrap_or(GROUP_WINDOW_SECS)
}

async fn groups(State(st): State<AppState>, ApiQuery(p): ApiQuery<WindowParams>) -> Response {
    let since = window(&p);
    let store = st.store.clone();
    json(blocking(move || Ok(crate::views::groups(&store, now_nanos(), since)?)).await)
}

async fn group(
    State(st): State<AppState>,
    Path(group): Path<String>,
    ApiQuery(p): ApiQuery<WindowParams>,
) -> Response {
    let since = window(&p);
    let store = st.store.clone();
    let name = group.clone();
    match blocking(move || {
        Ok(crate::views::group_detail(
            &store,
            &group,
            now_nanos(),
            since,
        )?)
    })
    .await
    {
        Ok(Some(d)) => Json(d).into_response(),
        // Not QueryError::NotFound: its words are a message's ("no stage record carries").
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no message of the last {since} s was delivered to the group {name:?}"),
            vec![],
        ),
        Err(e) => e.into_response(),
    }
}

#[derive(Debug, Deserialize)]
struct LimitParams {
    limit: Option<usize>,
    /// Only these stage partitions' messages (`0,3,7`: a group member's share).
    partitions: Option<String>,
}

/// A `partitions` parameter that is not a list of partition numbers (answered 400).
#[derive(Debug)]
struct BadPartitions(String);

impl IntoResponse for BadPartitions {
    fn into_response(self) -> Response {
        error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("partitions: {:?} is not a list of 0 to 15", self.0),
            vec![],
        )
    }
}

/// The stage partitions of an optional `partitions` parameter (`None` without it).
fn partitions_param(list: Option<&str>) -> Result<Option<Vec<Partition>>, BadPartitions> {
    match list {
        None => Ok(None),
        Some(l) => parse_partitions(l)
            .map(Some)
            .ok_or_else(|| BadPartitions(l.to_owned())),
    }
}

async fn dead_letters(State(st): State<AppState>, ApiQuery(p): ApiQuery<LimitParams>) -> Response {
    let limit = p.limit.unwrap_or(100).clamp(1, 1_000);
    let parts = match partitions_param(p.partitions.as_deref()) {
        Ok(ps) => ps,
        Err(e) => return e.into_response(),
    };
    let store = st.store.clone();
    json(
        blocking(move || {
            Ok(crate::views::dead_letters(
                &store,
                now_nanos(),
                limit,
                parts,
            )?)
        })
        .await,
    )
}

/// A client's clock estimates over the last minute of records, per broker instance
/// ([`crate::clocks::ClientClocks`]); an unknown client has none (200, empty `clocks`).
async fn client_clocks(State(st): State<AppState>, Path(client): Path<String>) -> Response {
    Json(st.clocks.client(&client)).into_response()
}

#[derive(Debug, Deserialize)]
struct SearchParams {
    topic: Option<String>,
    state: Option<String>,
    from: Option<u64>,
    to: Option<u64>,
    since_secs: Option<u64>,
    limit: Option<usize>,
    producer: Option<String>,
    group: Option<String>,
    min_ms: Option<f64>,
    #[serde(default)]
    failed: bool,
    #[serde(default)]
    redelivered: bool,
    #[serde(default)]
    dead_letter: bool,
    attr: Option<String>,
}

/// The JSON of a result, or the error's response.
fn json<T: serde::Serialize>(r: Result<T, QueryError>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The query string's parameters, or the JSON error a bad one answers (never axum's plain
/// text): axum's `Query` with [`QueryError`] as its rejection.
struct ApiQuery<T>(T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = QueryError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, QueryError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(p)| ApiQuery(p))
            .map_err(|e| QueryError::BadRequest(e.body_text()))
    }
}

async fn search(State(st): State<AppState>, ApiQuery(p): ApiQuery<SearchParams>) -> Response {
    let state = match p
        .state
        .as_deref()
        .filter(|s| !s.is_empty())
        .map(str::parse::<MessageState>)
        .transpose()
    {
        Ok(s) => s,
        Err(e) => return QueryError::BadRequest(e).into_response(),
    };
    let attr = match p.attr.as_deref().filter(|a| !a.is_empty()).map(|a| {
        a.split_once('=')
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
    }) {
        None => None,
        Some(Some(kv)) => Some(kv),
        Some(None) => {
            let got = p.attr.unwrap_or_default();
            return QueryError::BadRequest(format!(
                "an attribute is searched as key=value (such as category=refund), not {got:?}"
            ))
            .into_response();
        }
    };
    if p.min_ms.is_some_and(|m| !m.is_finite() || m < 0.0) {
        return QueryError::BadRequest("min_ms must be a duration in milliseconds".into())
            .into_response();
    }
    let from = match (p.from, p.since_secs) {
        (Some(f), _) => Some(f),
        (None, Some(s)) => Some(now_nanos().saturating_sub(s.saturating_mul(1_000_000_000))),
        (None, None) => None,
    };
    let nonempty = |s: Option<String>| s.filter(|s| !s.is_empty());
    let topic = nonempty(p.topic);
    let (topic, topic_pattern) = match topic {
        Some(t) if crate::search::is_pattern(&t) => (None, Some(t)),
        t => (t, None),
    };
    let q = SearchQuery {
        topic,
        topic_pattern,
        producer: nonempty(p.producer),
        group: nonempty(p.group),
        min_end_to_end: p.min_ms.map(|m| (m * 1e6) as u64),
        dead_lettered: p.dead_letter,
        failed: p.failed,
        redelivered: p.redelivered,
        attr,
        state,
        from,
        to: p.to,
        partitions: None,
        limit: Some(p.limit.unwrap_or(100).clamp(1, 10_000)),
    };
    let store = st.store.clone();
    let found = blocking(move || Ok(store.search(&q)?)).await;
    json(found)
}

/// Any other `/api/…` path: the JSON 404 every API error is (other paths: a plain 404).
async fn not_found(uri: Uri) -> Response {
    if uri.path().starts_with("/api/") || uri.path() == "/api" {
        error(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no such API path: {}", uri.path()),
            vec![],
        )
    } else {
        (StatusCode::NOT_FOUND, "not found\n").into_response()
    }
}

#[derive(Debug, Deserialize)]
struct StatsParams {
    topic: Option<String>,
    /// Observe mode: only this stream in the `observed` section.
    stream: Option<String>,
}

async fn stats_handler(State(st): State<AppState>, ApiQuery(p): ApiQuery<StatsParams>) -> Response {
    let s = st
        .stats
        .snapshot_of(p.topic.as_deref(), p.stream.as_deref(), now_nanos());
    Json(s).into_response()
}

#[derive(Debug, Deserialize)]
struct ShareParams {
    partitions: String,
}

/// The stage partitions of a `partitions=0,3,7` parameter; `None` when one is not a
/// partition number.
pub(crate) fn parse_partitions(list: &str) -> Option<Vec<Partition>> {
    list.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| p.trim().parse::<u16>().ok().and_then(Partition::new))
        .collect()
}

async fn stats_share(State(st): State<AppState>, ApiQuery(p): ApiQuery<ShareParams>) -> Response {
    match partitions_param(Some(&p.partitions)) {
        Ok(parts) => Json(st.stats.share(&parts.unwrap_or_default(), now_nanos())).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn metrics(State(st): State<AppState>, headers: HeaderMap) -> Response {
    let mut registry = prometheus_client::registry::Registry::default();
    st.stats.register_metrics(&mut registry, now_nanos());
    if let Some(x) = &st.exporter {
        x.register_metrics(&mut registry);
    }
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = Exposition::negotiate(accept);
    match format.encode(&registry) {
        Ok(body) => ([(header::CONTENT_TYPE, format.content_type())], body).into_response(),
        Err(e) => {
            let msg = format!("encoding the metrics as {format:?}: {e}");
            (StatusCode::INTERNAL_SERVER_ERROR, msg).into_response()
        }
    }
}
