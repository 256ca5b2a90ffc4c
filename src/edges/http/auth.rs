//! Bearer tokens: the layer that lets a request of a role through only with one of the
//! role's tokens (see [`crate::config::tokens`]), when the role has any.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::error::ErrorBody;
use crate::config::tokens::RoleTokens;

/// Lets a request through when its route's role has no token, or when it carries
/// `Authorization: Bearer <token>` with one of the role's tokens valid now (compared in
/// constant time); answers 401 with `WWW-Authenticate: Bearer` otherwise. The token is
/// never logged.
pub(super) async fn bearer(
    State(tokens): State<Arc<RoleTokens>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if tokens.is_open() {
        return next.run(request).await;
    }
    let presented = request.headers().get(header::AUTHORIZATION).and_then(|v| {
        let v = v.as_bytes();
        let scheme = v.get(..7)?;
        scheme
            .eq_ignore_ascii_case(b"bearer ")
            .then(|| v[7..].trim_ascii())
    });
    let (message, challenge) = match presented {
        Some(presented) if tokens.accepts(presented) => return next.run(request).await,
        Some(_) => (
            "invalid bearer token",
            r#"Bearer realm="rollboard", error="invalid_token""#,
        ),
        None => (
            "this route needs an Authorization: Bearer token",
            r#"Bearer realm="rollboard""#,
        ),
    };
    let mut response = (StatusCode::UNAUTHORIZED, ErrorBody::new(message)).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(challenge),
    );
    response
}
