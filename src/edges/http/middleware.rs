//! The layers that measure the routes: every answer counted by route template and status,
//! every matched route timed.

use std::sync::Arc;

use axum::extract::{MatchedPath, State};
use axum::response::Response;

use crate::metrics::Metrics;

/// The route template a request matched, filled in by [`timed`] (inside the router, where
/// the match is known) for [`counted`] (outside it, where every answer passes).
#[derive(Clone, Default)]
struct MatchedRoute(Arc<std::sync::OnceLock<String>>);

/// Counts every answer in `rollboard_http_requests_total` by route template and status,
/// those of the timeout and of unknown paths included (`unmatched`).
pub(super) async fn counted(
    State(metrics): State<Arc<Metrics>>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let matched = MatchedRoute::default();
    request.extensions_mut().insert(matched.clone());
    let response = next.run(request).await;
    metrics.http_response(
        matched.0.get().map(String::as_str),
        response.status().as_u16(),
    );
    response
}

/// Observes how long a matched route took to answer, labelled by its template (the
/// fallback, unknown paths, is not timed, so a scan cannot grow the label set).
pub(super) async fn timed(
    State(metrics): State<Arc<Metrics>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string());
    if let (Some(route), Some(matched)) = (&route, request.extensions().get::<MatchedRoute>()) {
        // Set once per request: this layer runs once per matched request.
        let _ = matched.0.set(route.clone());
    }
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    if let Some(route) = route {
        metrics.http_request(&route, started.elapsed().as_secs_f64());
    }
    response
}
