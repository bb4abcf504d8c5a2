//! Merged answers of a group: `GET /api/stats` (and, through the same [`gather`], the
//! groups and dead-letter views) answered for every partition by any member.
//!
//! With `--copies R` each partition is on R members, so adding up members' answers would
//! count each message R times. Instead [`gather`] picks ONE live owner per partition
//! ([`ClusterView::pick_owners`]: ready ones first, this member first among equals), asks
//! each picked member in parallel for exactly its assigned partitions (a member-local
//! request: [`LOCAL_HEADER`](super::LOCAL_HEADER) and `partitions=0,3,7`), and asks again
//! elsewhere for the partitions of a member that did not answer. What no member answered
//! for is said in the headers: [`PARTIAL_HEADER`] names the members that did not answer
//! and [`MISSING_PARTITIONS_HEADER`] the partitions left out.
//!
//! The group views merge their tallies and raw latency samples
//! (`crate::views::group_share`); the dead letters are listed as one listener holding every
//! message would list them. The statistics merge their shares ([`crate::stats::Merged`]): counters summed, latency
//! histograms merged, percentiles recomputed from the merged histograms.

use super::fanout::{body_json, forward, Fanout, Forward};
use super::{MAX_COPIES, PARTIAL_HEADER};
use crate::stats::{Merged, StatsShare};
use crate::views::dead_letters::{merge, DeadLetter};
use crate::views::group_share::{GroupDetailShare, GroupsShare};
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use msgtrail_core::partition::Partition;
use serde::de::DeserializeOwned;
use serde::Deserialize;

/// The header of a merged answer that lacks some partitions: their numbers (`3,7`).
pub const MISSING_PARTITIONS_HEADER: &str = "x-msgtrail-missing-partitions";

/// One owner's answer for each partition, as [`gather`] got them.
pub(super) struct Gathered<T> {
    /// The answers, one per member asked (each for its assigned partitions).
    pub(super) answers: Vec<T>,
    /// Members that did not answer (their partitions were asked of another owner).
    pub(super) failed: Vec<String>,
    /// Partitions no owner answered for.
    pub(super) missing: Vec<Partition>,
}

impl<T> Gathered<T> {
    /// Marks `resp` partial when partitions are missing: the failed members and the
    /// missing partitions in their headers.
    pub(super) fn mark(&self, mut resp: Response) -> Response {
        if self.missing.is_empty() {
            return resp;
        }
        let parts: Vec<String> = self.missing.iter().map(|p| p.index().to_string()).collect();
        for (name, value) in [
            (PARTIAL_HEADER, self.failed.join(",")),
            (MISSING_PARTITIONS_HEADER, parts.join(",")),
        ] {
            if let Ok(v) = HeaderValue::from_str(&value) {
                resp.headers_mut().insert(name, v);
            }
        }
        resp
    }
}

/// Asks one owner of every partition for its share, in parallel: `path(parts)` is the
/// member-local request for `parts`. A member that fails is skipped and its partitions asked
/// of another owner, up to [`MAX_COPIES`] rounds.
pub(super) async fn gather<T: DeserializeOwned>(
    f: &Fanout,
    authorization: Option<HeaderValue>,
    path: impl Fn(&str) -> String,
) -> Gathered<T> {
    let mut todo: Vec<Partition> = Partition::all().collect();
    let mut out = Gathered {
        answers: Vec::new(),
        failed: Vec::new(),
        missing: Vec::new(),
    };
    for _ in 0..MAX_COPIES {
        if todo.is_empty() {
            break;
        }
        let (picked, unowned) = f.view.pick_owners(&todo, &out.failed);
        if picked.is_empty() {
            break;
        }
        let calls = picked.into_iter().map(|((name, url), parts)| {
            let list: Vec<String> = parts.iter().map(|p| p.index().to_string()).collect();
            let fwd = Forward {
                path_and_query: path(&list.join(",")),
                authorization: authorization.clone(),
            };
            async move {
                let answer = match forward(f, &url, &fwd).await {
                    Ok(r) if r.status().is_success() => body_json::<T>(r).await,
                    Ok(r) => {
                        tracing::debug!(member = %name, status = %r.status(), "share refused");
                        None
                    }
                    Err(e) => {
                        tracing::debug!(member = %name, error = %e, "share request failed");
                        None
                    }
                };
                (name, parts, answer)
            }
        });
        todo = unowned;
        for (name, parts, answer) in futures::future::join_all(calls).await {
            match answer {
                Some(a) => out.answers.push(a),
                None => {
                    out.failed.push(name);
                    todo.extend(parts);
                }
            }
        }
    }
    todo.sort();
    todo.dedup();
    out.missing = todo;
    out
}

#[derive(Debug, Default, Deserialize)]
struct StatsQuery {
    topic: Option<String>,
}

/// A merged answer's query (its parameters, leniently: a bad one is the default) and the
/// caller's `Authorization`; `None` while this member knows no members yet (it then
/// answers alone).
fn merging<Q: DeserializeOwned + Default>(
    f: &Fanout,
    req: &Request,
) -> Option<(Q, Option<HeaderValue>)> {
    f.view.roles()?;
    let q = axum::extract::Query::<Q>::try_from_uri(req.uri())
        .map(|q| q.0)
        .unwrap_or_default();
    Some((q, req.headers().get(header::AUTHORIZATION).cloned()))
}

/// `GET /api/stats` for the whole group: one owner's [`StatsShare`] of every partition,
/// merged; this member's own answer while it knows no members yet.
pub(super) async fn stats(f: &Fanout, req: Request, next: Next) -> Response {
    let Some((q, auth)) = merging::<StatsQuery>(f, &req) else {
        return next.run(req).await;
    };
    let got: Gathered<StatsShare> = gather(f, auth, |parts| {
        format!("/api/share/stats?partitions={parts}")
    })
    .await;
    let mut merged = Merged::default();
    for share in &got.answers {
        merged.add(share);
    }
    let now = msgtrail_core::time::now_nanos();
    let snapshot = f.stats.merged_snapshot(&merged, q.topic.as_deref(), now);
    got.mark(axum::Json(snapshot).into_response())
}

#[derive(Debug, Default, Deserialize)]
struct LimitQuery {
    limit: Option<usize>,
}

/// `GET /api/dead-letters` for the whole group: one owner's dead letters of every
/// partition, each message once (a partition is asked of one member), merged as one
/// listener holding them all lists them ([`merge`]).
pub(super) async fn dead_letters(f: &Fanout, req: Request, next: Next) -> Response {
    let Some((q, auth)) = merging::<LimitQuery>(f, &req) else {
        return next.run(req).await;
    };
    let limit = q.limit.unwrap_or(100).clamp(1, 1_000);
    let got: Gathered<Vec<DeadLetter>> = gather(f, auth, |parts| {
        format!("/api/dead-letters?limit={limit}&partitions={parts}")
    })
    .await;
    let all = merge(got.answers.iter().flatten().cloned().collect(), limit);
    got.mark(axum::Json(all).into_response())
}

#[derive(Debug, Default, Deserialize)]
struct WindowQuery {
    since_secs: Option<u64>,
}

impl WindowQuery {
    /// `since_secs=S&` when the caller gave one, for a share's query.
    fn param(&self) -> String {
        self.since_secs
            .map(|s| format!("since_secs={s}&"))
            .unwrap_or_default()
    }
}

/// The shares of `got` added up with `add`; `None` when no member answered.
fn sum<T>(got: &mut Gathered<T>, add: impl Fn(&mut T, T)) -> Option<T> {
    let mut shares = std::mem::take(&mut got.answers).into_iter();
    let mut merged = shares.next()?;
    for s in shares {
        add(&mut merged, s);
    }
    Some(merged)
}

/// `GET /api/groups` for the whole group: one owner's [`GroupsShare`] of every partition,
/// tallies added up, counts computed from the sum.
pub(super) async fn groups(f: &Fanout, req: Request, next: Next) -> Response {
    let Some((q, auth)) = merging::<WindowQuery>(f, &req) else {
        return next.run(req).await;
    };
    let since = q.param();
    let mut got: Gathered<GroupsShare> = gather(f, auth, |parts| {
        format!("/api/share/groups?{since}partitions={parts}")
    })
    .await;
    let Some(merged) = sum(&mut got, |m, s| m.add(&s)) else {
        return got.mark(no_answer());
    };
    let now = msgtrail_core::time::now_nanos();
    got.mark(axum::Json(merged.overview(now)).into_response())
}

/// `GET /api/groups/{group}` for the whole group: one owner's [`GroupDetailShare`] of every
/// partition, added up; percentiles over every member's samples.
pub(super) async fn group(f: &Fanout, group: &str, req: Request, next: Next) -> Response {
    let Some((q, auth)) = merging::<WindowQuery>(f, &req) else {
        return next.run(req).await;
    };
    let since = q.param();
    let encoded = percent_encoding::utf8_percent_encode(group, percent_encoding::NON_ALPHANUMERIC);
    let mut got: Gathered<GroupDetailShare> = gather(f, auth, |parts| {
        format!("/api/share/groups/{encoded}?{since}partitions={parts}")
    })
    .await;
    let Some(merged) = sum(&mut got, GroupDetailShare::add) else {
        return got.mark(no_answer());
    };
    let now = msgtrail_core::time::now_nanos();
    let since = q.since_secs.unwrap_or(crate::http::GROUP_WINDOW_SECS);
    match merged.detail(group, now) {
        Some(d) => got.mark(axum::Json(d).into_response()),
        None => got.mark(crate::http::error(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no message of the last {since} s was delivered to the group {group:?}"),
            vec![],
        )),
    }
}

/// The answer when no member answered at all.
fn no_answer() -> Response {
    (StatusCode::BAD_GATEWAY, "no member of the group answered\n").into_response()
}
