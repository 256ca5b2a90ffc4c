//! `GET /`: the live page, one HTML file embedded in the binary (`page.html`, no build
//! step): a board picker and the live top N of the board chosen, with rank arrows, fed by
//! the change feed (docs/api.md, "The page").

use axum::http::header;
use axum::response::{IntoResponse, Response};

/// The page, as served.
pub const PAGE: &str = include_str!("page.html");

/// `GET /`: the live page. It holds no data: its script asks the API, with the reader's
/// token when one is typed in (or given in the URL fragment, `#token=...`).
#[utoipa::path(
    get,
    path = "/",
    tag = "meta",
    responses(
        (status = 200, description = "The live page: a board picker and the board's top N, updated on every change", content_type = "text/html", body = String),
    )
)]
pub(super) async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        PAGE,
    )
        .into_response()
}
