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
use serde_json::{json, Value};
use tracing::warn;

use super::error::{ApiError, ApiResult};
use super::params::params;
use super::AppState;
use crate::domain::roles::Role;
use crate::ingest::stream::{self, group_info};
use crate::store::StoreError;

/// How long `/readyz` waits for Redis.
const READY_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// `GET /metrics`: every metric in the Prometheus text format.
pub(super) async fn metrics(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> ApiResult<Response> {
    params(query, &[])?;
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
pub(super) async fn healthz(RawQuery(query): RawQuery) -> Result<Json<Value>, ApiError> {
    params(query, &[]).map(|_| Json(json!({ "status": "ok" })))
}

/// `GET /readyz`: 200 when Redis answers and every consumer's group exists, 503 otherwise;
/// the body also reports failing boards, the consumer's error and the clock skew.
pub(super) async fn readyz(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> Response {
    if let Err(e) = params(query, &[]) {
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
        Json(json!({
            "ready": ready,
            "redis": redis_ok,
            "group": group,
            "degraded": !failing.is_empty() || ingest_error.is_some() || skewed,
            "failing_boards": failing,
            "ingest_error": ingest_error,
            "clock_skew_ms": state.clock.skew_ms(),
            "clock_skewed": skewed,
        })),
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
