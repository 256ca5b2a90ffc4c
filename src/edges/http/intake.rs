//! `POST /v1/events`: a JSON body of events checked and appended to the stream, all or
//! nothing, through [`crate::ingest::intake`] (the same path as `rollboard send`); every
//! outcome counted in the intake metrics.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::error::{redis, ApiError, ApiResult};
use super::params::params;
use super::{AppState, MAX_BODY_BYTES};
use crate::ingest::intake::{self, BodyError};
use crate::metrics::Intake;

/// Whether the request declares a JSON body (`application/json` or `application/*+json`).
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// `POST /v1/events`: 202 with the number appended, or an error answer naming what was
/// refused (nothing is appended then).
pub(super) async fn events(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let metrics = &state.metrics;
    params(query, &[]).inspect_err(|_| metrics.intake(Intake::Malformed, 1))?;
    if !is_json(&headers) {
        metrics.intake(Intake::Malformed, 1);
        return Err(ApiError::UnsupportedMediaType(
            "the body must be sent with Content-Type: application/json".into(),
        ));
    }
    let body = body
        .map_err(|e| match e.status() {
            StatusCode::PAYLOAD_TOO_LARGE => {
                ApiError::TooLarge(format!("the body is larger than {MAX_BODY_BYTES} bytes"))
            }
            _ => ApiError::BadRequest("cannot read the body".into()),
        })
        .inspect_err(|_| metrics.intake(Intake::Malformed, 1))?;
    let accepted = intake::parse_body(&body, &state.settings.boards).map_err(|e| match e {
        BodyError::Invalid(invalid) => {
            metrics.intake(Intake::Invalid, intake::events_in(&body));
            ApiError::Invalid(json!({
                "error": format!("{} invalid event(s); nothing was appended", invalid.len()),
                "invalid": invalid,
            }))
        }
        BodyError::Malformed(why) => {
            metrics.intake(Intake::Malformed, 1);
            ApiError::BadRequest(why)
        }
    })?;
    let events = accepted.len() as u64;
    // Bounded like every other Redis call here, so an unreachable Redis answers 503 instead
    // of holding the client for the Redis client's own 30 s command timeout. A 503 after EXEC
    // reached the server may still have appended the events (and the queued transaction may
    // still go out once Redis is back): that is safe because `append` gave every event an `id`
    // first, so a repeat of this append is a duplicate. A producer that retries the POST
    // itself is exactly-once only when it sends its own `id`.
    redis(
        &state,
        intake::append(&state.store, &state.settings.ingest, &accepted),
    )
    .await
    .inspect_err(|e| match e {
        ApiError::Unavailable(_) => metrics.intake(Intake::Unavailable, events),
        _ => metrics.intake(Intake::Failed, events),
    })?;
    metrics.intake(Intake::Accepted, events);
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "appended": accepted.len() })),
    )
        .into_response())
}
