//! The HTTP interface (axum): query API, event intake, `/metrics`, `/healthz`, `/readyz`.
//!
//! Client mistakes answer 400 or 404 with a JSON `{"error": ...}` body; Redis trouble
//! answers 503. Nothing a client sends can produce a 500.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::board::Board;
use crate::cli::{append, now_ms};
use crate::config::Settings;
use crate::event::{check_name, fields_from_json, validate};
use crate::ingest::group_info;
use crate::metrics::Metrics;
use crate::store::{Store, StoreError};

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 4 << 20;
/// Most events one `POST /v1/events` may carry.
pub const MAX_EVENTS: usize = 10_000;
/// How long a request waits for Redis before answering 503.
const REDIS_TIMEOUT: Duration = Duration::from_secs(5);

/// What the handlers share.
pub struct AppState {
    /// Redis access.
    pub store: Arc<Store>,
    /// The settings (boards, stream names).
    pub settings: Arc<Settings>,
    /// The metrics registry.
    pub metrics: Arc<Metrics>,
    /// Whether the consumer group is known to exist.
    pub group_ready: Arc<AtomicBool>,
}

/// An error answer.
#[derive(Debug)]
pub enum ApiError {
    /// 400 with a message.
    BadRequest(String),
    /// 404 with a message.
    NotFound(String),
    /// 400 with a structured body (invalid events).
    Invalid(Value),
    /// 413: the request body is over the limit.
    TooLarge(String),
    /// 503: Redis failed or timed out.
    Unavailable(String),
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::BadRequest(m) => {
                (StatusCode::BAD_REQUEST, Json(json!({ "error": m }))).into_response()
            }
            ApiError::NotFound(m) => {
                (StatusCode::NOT_FOUND, Json(json!({ "error": m }))).into_response()
            }
            ApiError::Invalid(body) => (StatusCode::BAD_REQUEST, Json(body)).into_response(),
            ApiError::TooLarge(m) => {
                (StatusCode::PAYLOAD_TOO_LARGE, Json(json!({ "error": m }))).into_response()
            }
            ApiError::Unavailable(m) => {
                (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "error": m }))).into_response()
            }
        }
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// The router with every route.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/boards", get(boards))
        .route("/v1/boards/{board}/top", get(top))
        .route("/v1/boards/{board}/members/{member}", get(rank))
        .route("/v1/boards/{board}/members/{member}/around", get(around))
        .route("/v1/events", post(events))
        .route("/metrics", get(metrics))
        .route(
            "/healthz",
            get(|| async { Json(json!({ "status": "ok" })) }),
        )
        .route("/readyz", get(readyz))
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

async fn redis<T>(
    state: &AppState,
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> ApiResult<T> {
    match tokio::time::timeout(REDIS_TIMEOUT, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            state.metrics.redis_error(&e);
            Err(ApiError::Unavailable(format!("redis: {e}")))
        }
        Err(_) => {
            state
                .metrics
                .redis_error(&StoreError::Redis(fred::error::Error::new(
                    fred::error::ErrorKind::Timeout,
                    "no answer within the request timeout",
                )));
            Err(ApiError::Unavailable("redis did not answer in time".into()))
        }
    }
}

fn board<'a>(state: &'a AppState, name: &str) -> ApiResult<&'a Board> {
    state
        .settings
        .board(name)
        .ok_or_else(|| ApiError::NotFound(format!("unknown board {name:?}")))
}

fn scope_of<'a>(board: &Board, params: &'a HashMap<String, String>) -> ApiResult<Option<&'a str>> {
    let scope = params.get("scope").map(String::as_str);
    match (&board.scope, scope) {
        (Some(field), None) => Err(ApiError::BadRequest(format!(
            "board {} is scoped by `{field}`: give ?scope=",
            board.name
        ))),
        (None, Some(_)) => Err(ApiError::BadRequest(format!(
            "board {} is not scoped: drop ?scope=",
            board.name
        ))),
        (_, Some(s)) => check_name(s.as_bytes())
            .map(Some)
            .map_err(|why| ApiError::BadRequest(format!("scope {why}"))),
        _ => Ok(None),
    }
}

fn number(
    params: &HashMap<String, String>,
    name: &str,
    default: u64,
    range: std::ops::RangeInclusive<u64>,
) -> ApiResult<u64> {
    let Some(text) = params.get(name) else {
        return Ok(default);
    };
    text.parse::<u64>()
        .ok()
        .filter(|n| range.contains(n))
        .ok_or_else(|| {
            ApiError::BadRequest(format!(
                "{name} must be an integer from {} to {}, got {text:?}",
                range.start(),
                range.end()
            ))
        })
}

/// The path parameters, or a JSON 400 when they cannot be decoded (e.g. invalid UTF-8).
fn path<T>(extracted: Result<Path<T>, PathRejection>) -> ApiResult<T> {
    extracted
        .map(|Path(value)| value)
        .map_err(|e| ApiError::BadRequest(format!("invalid path: {}", e.body_text())))
}

fn member_of(member: &str) -> ApiResult<&str> {
    check_name(member.as_bytes()).map_err(|why| ApiError::BadRequest(format!("member {why}")))
}

async fn boards(State(state): State<Arc<AppState>>) -> Json<Value> {
    let list: Vec<Value> = state
        .settings
        .boards
        .iter()
        .map(|b| {
            json!({
                "name": b.name, "member": b.member, "scope": b.scope, "amount": b.amount,
                "scale": b.scale, "window_ms": b.window_ms, "slice_ms": b.slice_ms,
                "mode": b.mode.as_str(), "tie_break": b.tie_break.as_str(),
                "allow_negative": b.allow_negative,
            })
        })
        .collect();
    Json(json!({ "boards": list }))
}

async fn top(
    State(state): State<Arc<AppState>>,
    name: Result<Path<String>, PathRejection>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Response> {
    let name = path(name)?;
    let b = board(&state, &name)?;
    let scope = scope_of(b, &params)?;
    let limit = number(&params, "limit", 10, 1..=1000)?;
    let offset = number(&params, "offset", 0, 0..=u64::MAX)?;
    let page = redis(&state, state.store.top(b, scope, offset, limit, now_ms())).await?;
    Ok(Json(page).into_response())
}

async fn rank(
    State(state): State<Arc<AppState>>,
    names: Result<Path<(String, String)>, PathRejection>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Response> {
    let (name, member) = path(names)?;
    let b = board(&state, &name)?;
    let scope = scope_of(b, &params)?;
    let member = member_of(&member)?;
    let rank = redis(&state, state.store.rank(b, scope, member, now_ms())).await?;
    let status = if rank.rank.is_some() {
        StatusCode::OK
    } else {
        StatusCode::NOT_FOUND
    };
    Ok((status, Json(rank)).into_response())
}

async fn around(
    State(state): State<Arc<AppState>>,
    names: Result<Path<(String, String)>, PathRejection>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Response> {
    let (name, member) = path(names)?;
    let b = board(&state, &name)?;
    let scope = scope_of(b, &params)?;
    let member = member_of(&member)?;
    let radius = number(&params, "radius", 5, 0..=100)?;
    match redis(
        &state,
        state.store.around(b, scope, member, radius, now_ms()),
    )
    .await?
    {
        Some(page) => Ok(Json(page).into_response()),
        None => Err(ApiError::NotFound(format!(
            "{member:?} is not on board {}",
            b.name
        ))),
    }
}

async fn events(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let body = body.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => {
            ApiError::TooLarge(format!("the body is larger than {MAX_BODY_BYTES} bytes"))
        }
        _ => ApiError::BadRequest(format!("cannot read the body: {e}")),
    })?;
    let value: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::BadRequest(format!("body is not JSON: {e}")))?;
    let items = match value {
        Value::Array(items) => items,
        object @ Value::Object(_) => vec![object],
        _ => {
            return Err(ApiError::BadRequest(
                "body must be one JSON object or an array of them".into(),
            ))
        }
    };
    if items.len() > MAX_EVENTS {
        return Err(ApiError::BadRequest(format!(
            "at most {MAX_EVENTS} events per request, got {}",
            items.len()
        )));
    }
    let mut accepted = Vec::with_capacity(items.len());
    let mut invalid = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let checked = fields_from_json(item)
            .map_err(|detail| json!({ "index": index, "reason": "fields", "detail": detail }))
            .and_then(|fields| match validate(&fields, &state.settings.boards) {
                Ok(_) => Ok(fields),
                Err(r) => {
                    Err(json!({ "index": index, "reason": r.reason.as_str(), "detail": r.detail }))
                }
            });
        match checked {
            Ok(fields) => accepted.push(fields),
            Err(e) => invalid.push(e),
        }
    }
    if !invalid.is_empty() {
        return Err(ApiError::Invalid(json!({
            "error": format!("{} invalid event(s); nothing was appended", invalid.len()),
            "invalid": invalid,
        })));
    }
    let stream = state.settings.ingest.stream.as_str();
    // Bounded like every other Redis call here, so an unreachable Redis answers 503 instead
    // of holding the client for the Redis client's own 30 s command timeout. A 503 after EXEC
    // reached the server may still have appended the events (and the queued transaction may
    // still go out once Redis is back): that is safe because `append` gave every event an `id`
    // first, so a repeat of this append is a duplicate. A producer that retries the POST
    // itself is exactly-once only when it sends its own `id`.
    redis(&state, async {
        append(state.store.client(), stream, &accepted)
            .await
            .map_err(StoreError::from)
    })
    .await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "appended": accepted.len() })),
    )
        .into_response())
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    let check = async {
        state.store.ping().await?;
        let ingest = &state.settings.ingest;
        let group = group_info(state.store.client(), &ingest.stream, &ingest.group)
            .await?
            .is_some();
        state.store.ensure_scripts().await?;
        Ok::<bool, StoreError>(group)
    };
    let (redis_ok, group) = match tokio::time::timeout(Duration::from_secs(2), check).await {
        Ok(Ok(group)) => (true, group && state.group_ready.load(Ordering::SeqCst)),
        _ => (false, false),
    };
    state.metrics.redis_up(redis_ok);
    let ready = redis_ok && group;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    // A board whose applies keep failing is reported, not made a reason to take the pod
    // out of service: the other boards, the queries and the intake still work.
    let failing = state.metrics.failing_boards();
    (
        status,
        Json(json!({
            "ready": ready,
            "redis": redis_ok,
            "group": group,
            "degraded": !failing.is_empty(),
            "failing_boards": failing,
        })),
    )
        .into_response()
}
