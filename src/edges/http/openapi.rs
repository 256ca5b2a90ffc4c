//! `GET /v1/openapi.json`: the OpenAPI 3.1 description of every route, generated from the
//! handlers and the types of their answers (see docs/api.md).

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

use super::error::{ApiResult, ErrorBody};
use super::params::none;
use super::AppState;
use crate::domain::board::Board;

/// The description of the API: every route, its parameters, bodies and answers.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "rollboard",
        description = "Exact rolling-window leaderboards kept in Redis: the query API, the \
                       event intake and the operator routes. Each role can require a bearer \
                       token (`reader`, `producer`, `operator`); a route whose role has no \
                       token is open. `/healthz` and `/readyz` are always open. Every error \
                       answer is a JSON object with an `error`."
    ),
    paths(
        super::query::boards,
        super::board::board,
        super::query::top,
        super::query::rank,
        super::query::around,
        super::query::ranks,
        super::changes::changes,
        super::intake::events,
        super::health::metrics,
        super::health::healthz,
        super::health::readyz,
        openapi,
        super::page::page,
    ),
    modifiers(&Tokens),
    tags(
        (name = "boards", description = "The query API: boards, pages, ranks (the reader's token)"),
        (name = "intake", description = "Sending events (the producer's token)"),
        (name = "operations", description = "Metrics (the operator's token) and the open probes; on `http.admin_listen` when set"),
        (name = "meta", description = "This document (the reader's token) and the live page (open: its script sends the reader's token)"),
    )
)]
pub(super) struct ApiDoc;

/// Adds the bearer token of each role as a security scheme.
struct Tokens;

impl Modify for Tokens {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        for (role, routes, setting) in [
            (
                "reader",
                "the `/v1/boards` routes (the change feed included) and this document",
                "query",
            ),
            ("producer", "`POST /v1/events`", "intake"),
            ("operator", "`GET /metrics`", "metrics"),
        ] {
            let description = format!(
                "The {role}'s bearer token, for {routes}: one of the tokens of \
                 `http.{setting}_token_file` (one per line: two during a rotation) or \
                 `ROLLBOARD_{}_TOKEN`. Without one configured, the routes are open. A \
                 missing or wrong token answers 401 with `WWW-Authenticate: Bearer`.",
                setting.to_ascii_uppercase()
            );
            components.add_security_scheme(
                role,
                SecurityScheme::Http(
                    HttpBuilder::new()
                        .scheme(HttpAuthScheme::Bearer)
                        .description(Some(description))
                        .build(),
                ),
            );
        }
    }
}

/// An OpenAPI 3.1 document, as this route answers it.
// Described only: the document is utoipa's.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(super) struct OpenApiDocument {
    /// The OpenAPI version, `3.1.0`.
    #[schema(example = "3.1.0")]
    openapi: String,
    /// The API's title, version and description.
    #[schema(value_type = Object)]
    info: (),
    /// Every route.
    #[schema(value_type = Object)]
    paths: (),
    /// The schemas of the bodies and answers, and the bearer tokens.
    #[schema(value_type = Object)]
    components: (),
}

/// The document of this API for `boards`, as JSON (see [`super::document`]).
pub(super) fn document(boards: &[Board]) -> String {
    let generic = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
    // Plain data: serializing it cannot fail.
    serde_json::to_string(&super::document::served(generic, boards)).unwrap_or_default()
}

/// `GET /v1/openapi.json`: this API's OpenAPI 3.1 document.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "meta",
    security((), ("reader" = [])),
    responses(
        (status = 200, description = "The OpenAPI 3.1 document of this API with the boards this daemon is configured with: each board its own paths", body = OpenApiDocument),
        (status = 400, description = "A query parameter (this route takes none)", body = ErrorBody),
        (status = 401, description = "The reader's token is required", body = ErrorBody),
    )
)]
pub(super) async fn openapi(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> ApiResult<Response> {
    none(query)?;
    Ok((
        [(header::CONTENT_TYPE, "application/json")],
        state.document.clone(),
    )
        .into_response())
}
