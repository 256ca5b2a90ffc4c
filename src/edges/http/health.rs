//! What monitoring reads: `/metrics` (the Prometheus text), `/healthz` (the process
//! answers) and `/readyz` (Redis answers, the consumer groups exist; degraded parts
//! reported but never a reason to take the pod out of service).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use tracing::warn;
use utoipa::ToSchema;

use super::error::{ApiError, ApiResult, ErrorBody};
use super::params::none;
use super::AppState;
use crate::domain::roles::Role;
use crate::ingest::stream::{self, group_info};
use crate::store::StoreError;

/// How long `/readyz` waits for Redis.
const READY_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// The answer of `GET /healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub(super) struct Health {
    /// Always `ok`.
    #[schema(example = "ok")]
    status: &'static str,
}

/// The answer of `GET /readyz` (200 or 503 alike).
// The fields are declared in the order of their names, the order the answer has always
// had.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub(super) struct Readiness {
    /// How far this host's clock is off Redis's, in ms.
    clock_skew_ms: i64,
    /// Whether the skew is over `redis.max_clock_skew` (reported, never a reason for 503).
    clock_skewed: bool,
    /// Whether a part is degraded: a failing board, a failing consumer or a skewed clock.
    degraded: bool,
    /// The boards whose events are being dead-lettered.
    failing_boards: Vec<String>,
    /// Whether every consumer group exists (always true without the `consume` role).
    group: bool,
    /// The error of the consumer's last step while its steps keep failing, else null.
    #[schema(required = true)]
    ingest_error: Option<String>,
    /// Whether the process is ready: Redis answers and the groups exist (200, else 503).
    ready: bool,
    /// Whether Redis answered the check (and the scripts are loaded).
    redis: bool,
}

/// `GET /metrics`: every metric in the Prometheus text format.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    security((), ("operator" = [])),
    responses(
        (status = 200, description = "Every metric, in the Prometheus text format",
         content_type = "text/plain; version=0.0.4; charset=utf-8", body = String),
        (status = 400, description = "A query parameter (this route takes none)", body = ErrorBody),
        (status = 401, description = "The operator's token is required", body = ErrorBody),
    )
)]
pub(super) async fn metrics(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> ApiResult<Response> {
    none(query)?;
    state.answers.count_held().await;
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response())
}

/// `GET /healthz`: the process answers.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    responses(
        (status = 200, description = "The process runs (its start-up checks passed)", body = Health),
        (status = 400, description = "A query parameter (this route takes none)", body = ErrorBody),
    )
)]
pub(super) async fn healthz(RawQuery(query): RawQuery) -> Result<Json<Health>, ApiError> {
    none(query).map(|_| Json(Health { status: "ok" }))
}

/// `GET /readyz`: 200 when Redis answers and every consumer's group exists, 503 otherwise;
/// the body also reports failing boards, the consumer's error and the clock skew.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "Ready: Redis answers, the groups exist, the scripts are loaded", body = Readiness),
        (status = 400, description = "A query parameter (this route takes none)", body = ErrorBody),
        (status = 503, description = "Not ready", body = Readiness),
    )
)]
pub(super) async fn readyz(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> Response {
    if let Err(e) = none(query) {
        return e.into_response();
    }
    let (redis_ok, group) = match check(&state).await {
        Ok(group) => (true, group),
        Err(e) => {
            state.metrics.redis_error(&e);
            warn!(redis = %state.settings.redis.host(), error = %e, "readiness check failed: redis unreachable or not answering");
            (false, false)
        }
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
    // E.g. `OOM` at maxmemory: Redis answers the check, but the consumer cannot apply.
    let ingest_error = state.metrics.consumer_error();
    // Reported, never a reason to take the pod out: time is judged by Redis's clock.
    let skewed = state.clock.is_skewed();
    (
        status,
        Json(Readiness {
            clock_skew_ms: state.clock.skew_ms(),
            clock_skewed: skewed,
            degraded: !failing.is_empty() || ingest_error.is_some() || skewed,
            failing_boards: failing,
            group,
            ingest_error,
            ready,
            redis: redis_ok,
        }),
    )
        .into_response()
}

/// Whether Redis answers within [`READY_CHECK_TIMEOUT`] (an error otherwise) and, if so,
/// whether every consumer's group exists and is known to its consumer.
async fn check(state: &AppState) -> Result<bool, StoreError> {
    let check = async {
        state.store.ping().await?;
        let ingest = &state.settings.ingest;
        // Only a consumer needs the group; an intake creates the stream by appending.
        let keys = if state.settings.roles.has(Role::Consume) {
            stream::keys(ingest)
        } else {
            Vec::new()
        };
        let groups = futures_util::future::try_join_all(
            keys.iter()
                .map(|key| group_info(state.store.client(), key, &ingest.group)),
        )
        .await?;
        let group = groups.iter().all(Option::is_some);
        state.store.ensure_library().await?;
        Ok::<bool, StoreError>(group)
    };
    // A failed check is counted and logged: during a partition the daemon's own calls
    // only fail when their timeouts (up to 30 s) run out, so the probe is the first to see it.
    match tokio::time::timeout(READY_CHECK_TIMEOUT, check).await {
        Ok(Ok(group)) => Ok(group
            && state
                .group_ready
                .iter()
                .all(|ready| ready.load(Ordering::SeqCst))),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(StoreError::Redis(fred::error::Error::new(
            fred::error::ErrorKind::Timeout,
            "the readiness check got no answer from redis within 2 s",
        ))),
    }
}
