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
use serde::Serialize;
use serde_json::{json, Value};
use utoipa::openapi::schema::{
    ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, SchemaType, Type,
};
use utoipa::openapi::RefOr;
use utoipa::{PartialSchema, ToSchema};

use super::error::{redis, ApiError, ApiResult, ErrorBody};
use super::params::none;
use super::AppState;
use crate::domain::limits::MAX_EVENT_FIELDS;
use crate::ingest::intake::{self, BodyError, MAX_EVENTS};
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

/// The answer of an accepted `POST /v1/events`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub(super) struct Appended {
    /// The number of events appended: every event of the request.
    appended: usize,
}

/// The 400 of a body with invalid events: each one named by its index; nothing was
/// appended.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub(super) struct InvalidEvents {
    /// How many events are invalid.
    error: String,
    /// Each invalid event.
    #[schema(value_type = Vec<InvalidEvent>)]
    invalid: Vec<Value>,
}

/// One invalid event of an `InvalidEvents` answer.
// Described only: `intake::parse_body` builds it.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(super) struct InvalidEvent {
    /// Its position in the body (0 for a single object).
    index: u64,
    /// Why: `fields` (not an object of strings and numbers, a repeated key), or the reason
    /// the consumer would dead-letter it (`no_board`, `member`, `scope`, `id`, `amount`,
    /// `ts`, `future`, ...).
    reason: String,
    /// What is wrong with it.
    detail: String,
}

/// A 400 of `POST /v1/events`: the body as a whole refused (`ErrorBody`), or invalid
/// events (`InvalidEvents`).
// Described only.
#[derive(ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(super) enum EventsRefused {
    /// Not UTF-8, not JSON, not objects, too many events, a query parameter.
    Malformed(ErrorBody),
    /// Some events are invalid.
    Invalid(InvalidEvents),
}

/// One event, in the API's schema (see its description below).
pub(super) struct Event;

impl PartialSchema for Event {
    fn schema() -> RefOr<Schema> {
        let field =
            ObjectBuilder::new().schema_type(SchemaType::from_iter([Type::String, Type::Number]));
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .additional_properties(Some(field))
            .max_properties(Some(MAX_EVENT_FIELDS))
            .description(Some(format!(
                "One event: its fields are strings or JSON numbers (taken exactly as written), \
                 at most {MAX_EVENT_FIELDS}. It needs the fields of the boards it is meant for \
                 (their member, amount and scope fields); `id` (the idempotency key, given one \
                 when absent) and `ts` (epoch ms, decimal digits) are optional. A repeated key \
                 makes it invalid."
            )))
            .examples([json!({"id": "tip-1", "room": "room42", "user": "u7", "amount": "15"})])
            .into()
    }
}

impl ToSchema for Event {}

/// The body of `POST /v1/events`, in the API's schema: one event or an array of 1 to
/// [`MAX_EVENTS`] (sent with `Content-Type: application/json`, at most 4 MiB).
pub(super) struct EventsBody;

impl PartialSchema for EventsBody {
    fn schema() -> RefOr<Schema> {
        let event = utoipa::openapi::Ref::from_schema_name(Event::name());
        OneOfBuilder::new()
            .item(event.clone())
            .item(ArrayBuilder::new().items(event).max_items(Some(MAX_EVENTS)))
            .description(Some(format!(
                "One event, or an array of at most {MAX_EVENTS}: all valid, all appended \
                 (202); any invalid, none appended (400). A byte-order mark is skipped."
            )))
            .into()
    }
}

impl ToSchema for EventsBody {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((Event::name().into(), Event::schema()));
    }
}

/// `POST /v1/events`: 202 with the number appended, or an error answer naming what was
/// refused (nothing is appended then).
#[utoipa::path(
    post,
    path = "/v1/events",
    tag = "intake",
    security((), ("producer" = [])),
    request_body(
        content = EventsBody,
        content_type = "application/json",
        description = "One event or an array of them (`application/json` or `application/*+json`)",
    ),
    responses(
        (status = 202, description = "Every event appended", body = Appended),
        (status = 400, description = "Nothing appended: the body is refused, or events are invalid (each listed with its index)", body = EventsRefused),
        (status = 401, description = "The producer's token is required; nothing appended", body = ErrorBody),
        (status = 408, description = "The body came too slowly (`http.request_timeout`)", body = ErrorBody),
        (status = 413, description = "The body is over 4 MiB; nothing appended", body = ErrorBody),
        (status = 415, description = "Not sent with `Content-Type: application/json`; nothing appended", body = ErrorBody),
        (status = 500, description = "Redis proved the data wrong; nothing appended", body = ErrorBody),
        (status = 503, description = "A Redis outage or `http.max_concurrent_intake` reached; with `Retry-After`: retry with the same ids", body = ErrorBody),
    )
)]
pub(super) async fn events(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let metrics = &state.metrics;
    none(query).inspect_err(|_| metrics.intake(Intake::Malformed, 1))?;
    if !is_json(&headers) {
        metrics.intake(Intake::Malformed, 1);
        return Err(ApiError::UnsupportedMediaType(
            "the body must be sent with Content-Type: application/json".into(),
        ));
    }
    let body = body
        .map_err(ApiError::of_body)
        .inspect_err(|_| metrics.intake(Intake::Malformed, 1))?;
    let accepted = intake::parse_body(&body, &state.settings.boards).map_err(|e| match e {
        BodyError::Invalid(invalid) => {
            metrics.intake(Intake::Invalid, intake::events_in(&body));
            ApiError::Invalid(json!(InvalidEvents {
                error: format!("{} invalid event(s); nothing was appended", invalid.len()),
                invalid,
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
        Json(Appended {
            appended: accepted.len(),
        }),
    )
        .into_response())
}
