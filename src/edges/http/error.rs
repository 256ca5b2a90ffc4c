//! Error answers: every one a JSON `{"error": ...}` with its status, a Redis failure mapped
//! to 503 (an outage, with `Retry-After`) or 500 (data rollboard did not write), and the
//! JSON body given to the error answers axum and tower make themselves.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::AppState;
use crate::store::{Store, StoreError};

/// The `Retry-After` of every 503, in seconds.
const RETRY_AFTER_SECS: &str = "1";
/// How long a request waits for Redis before answering 503.
const REDIS_TIMEOUT: Duration = Duration::from_secs(5);

/// The body of every error answer (but the 404 of a member not on the board, which is
/// the member's rank answer with an `error`, and the 400 of invalid events, which lists
/// them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(deny_unknown_fields)] // in the schema: no other field
pub struct ErrorBody {
    /// What went wrong; never echoes unbounded input.
    pub error: String,
}

impl ErrorBody {
    /// The body of an error saying `message`.
    pub fn new(message: impl Into<String>) -> Json<ErrorBody> {
        Json(ErrorBody {
            error: message.into(),
        })
    }
}

/// An error answer.
#[derive(Debug, Clone)]
pub enum ApiError {
    /// 400 with a message.
    BadRequest(String),
    /// 404 with a message.
    NotFound(String),
    /// 400 with a structured body (invalid events).
    Invalid(Value),
    /// 404 whose body is the member's rank answer with null rank fields and an `error`
    /// (see [`crate::domain::ranking::MemberRank::not_on_board`]).
    NotOnBoard(Value),
    /// 413: the request body is over the limit.
    TooLarge(String),
    /// 415: the body is not declared as JSON.
    UnsupportedMediaType(String),
    /// 500: Redis refused an operation for a reason other than an outage (the data in
    /// Redis is not what rollboard wrote, a script found an inconsistency).
    Internal(String),
    /// 503 with `Retry-After`: Redis failed or timed out (an outage), or the intake is at
    /// its concurrency limit.
    Unavailable(String),
}

impl ApiError {
    /// Why a request body could not be read: 413 over [`super::MAX_BODY_BYTES`], else 400.
    pub fn of_body(rejection: axum::extract::rejection::BytesRejection) -> ApiError {
        match rejection.status() {
            StatusCode::PAYLOAD_TOO_LARGE => ApiError::TooLarge(format!(
                "the body is larger than {} bytes",
                super::MAX_BODY_BYTES
            )),
            _ => ApiError::BadRequest("cannot read the body".into()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::BadRequest(m) => (StatusCode::BAD_REQUEST, ErrorBody::new(m)).into_response(),
            ApiError::NotFound(m) => (StatusCode::NOT_FOUND, ErrorBody::new(m)).into_response(),
            ApiError::Invalid(body) => (StatusCode::BAD_REQUEST, Json(body)).into_response(),
            ApiError::NotOnBoard(body) => (StatusCode::NOT_FOUND, Json(body)).into_response(),
            ApiError::TooLarge(m) => {
                (StatusCode::PAYLOAD_TOO_LARGE, ErrorBody::new(m)).into_response()
            }
            ApiError::UnsupportedMediaType(m) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, ErrorBody::new(m)).into_response()
            }
            ApiError::Internal(m) => {
                (StatusCode::INTERNAL_SERVER_ERROR, ErrorBody::new(m)).into_response()
            }
            ApiError::Unavailable(m) => (
                StatusCode::SERVICE_UNAVAILABLE,
                // Every 503 is worth retrying (the same request, with the same ids).
                [(header::RETRY_AFTER, RETRY_AFTER_SECS)],
                ErrorBody::new(m),
            )
                .into_response(),
        }
    }
}

/// A handler's result.
pub type ApiResult<T> = Result<T, ApiError>;

/// Runs one Redis call of a handler, bounded by [`REDIS_TIMEOUT`]: an outage (or no answer
/// in time) is a 503, any other Redis error a 500; each failure is counted.
pub(super) async fn redis<T>(
    state: &AppState,
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> ApiResult<T> {
    // Known down: every connection of the pool is lost. A command sent now would wait for
    // the reconnection until REDIS_TIMEOUT; the client is told to come back at once.
    if let Some(last) = state.store.known_down() {
        state.metrics.redis_error(&Store::not_connected());
        return Err(ApiError::Unavailable(format!(
            "redis is unavailable: not connected to {} ({last})",
            state.settings.redis.host()
        )));
    }
    match tokio::time::timeout(REDIS_TIMEOUT, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            state.metrics.redis_error(&e);
            let detail = match &e {
                StoreError::Redis(e) => e.details().to_string(),
                StoreError::Reply(what) => format!("unexpected reply: {what}"),
            };
            Err(if e.is_outage() {
                ApiError::Unavailable(format!("redis is unavailable: {detail}"))
            } else {
                ApiError::Internal(format!(
                    "redis refused the operation; the data in redis is not what rollboard \
                     expects (not an outage): {detail}"
                ))
            })
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

/// Gives every error answer that is not JSON yet (axum's 405, the timeout's 408, a
/// rejection's plain text) a JSON `{"error": ...}` body naming only its status.
pub(super) async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let message = match status {
        StatusCode::METHOD_NOT_ALLOWED => "method not allowed".to_string(),
        StatusCode::REQUEST_TIMEOUT => {
            "the request was not received and answered within http.request_timeout".to_string()
        }
        other => other
            .canonical_reason()
            .unwrap_or("error")
            .to_ascii_lowercase(),
    };
    let (mut parts, _) = response.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let body = serde_json::to_vec(&ErrorBody { error: message }).unwrap_or_default();
    Response::from_parts(parts, Body::from(body))
}
