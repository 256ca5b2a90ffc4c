//! The HTTP interface (axum on hyper's HTTP/1 server): query API, event intake, `/metrics`,
//! `/healthz`, `/readyz`, and the connection loop that bounds what a client can hold.
//!
//! Each role can require a bearer token (`http.*_token_file`, see [`crate::config::tokens`]): the
//! producer for `POST /v1/events`, the reader for the query routes, the operator for
//! `/metrics`; `/healthz` and `/readyz` stay open for probes. A missing or wrong token
//! answers 401. With `http.admin_listen` set, `/metrics` and the probes are served there
//! and only there: the API's port then carries only the API, so a network policy can let
//! the clients reach one port and the monitoring the other.
//!
//! A route of a role the process does not run (`--roles`, see [`crate::domain::roles`]) answers
//! 404 naming the role: the route is not there, and a retry here would not find it.
//!
//! Every error answer is a JSON `{"error": ...}` that never echoes unbounded input: client
//! mistakes answer 400, 401, 404, 405, 408, 413 or 415; a Redis outage (every Redis error
//! but those that prove the data wrong, see [`StoreError::is_outage`]) answers 503 with
//! `Retry-After` (at once, naming the host, while every connection is known lost; see
//! [`Store::known_down`]), and so does an intake over `http.max_concurrent_intake`; a Redis
//! error that proves the data wrong (`WRONGTYPE`: a key holding data rollboard did not
//! write, or a script's consistency check) answers 500. Nothing a client sends can produce a 500.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::error_handling::HandleErrorLayer;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, MatchedPath, Path, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceBuilder;
use tower_http::timeout::TimeoutLayer;
use tracing::{debug, warn, Instrument};

use crate::config::tokens::RoleTokens;
use crate::config::{HttpSettings, Settings};
use crate::domain::board::Board;
use crate::domain::clock::Clock;
use crate::domain::event::check_name;
use crate::domain::roles::Role;
use crate::ingest::intake::{self, BodyError};
use crate::ingest::stream::{self, group_info};
use crate::metrics::{Intake, Metrics};
use crate::store::{Store, StoreError};

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 4 << 20;
/// The `Retry-After` of every 503, in seconds.
const RETRY_AFTER_SECS: &str = "1";
/// How long a request waits for Redis before answering 503.
const REDIS_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a request in progress at shutdown may still take to answer before its
/// connection is closed (idle and half-received connections are closed at once).
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(2);

/// What the handlers share.
pub struct AppState {
    /// Redis access.
    pub store: Arc<Store>,
    /// The settings (boards, stream names).
    pub settings: Arc<Settings>,
    /// The metrics registry.
    pub metrics: Arc<Metrics>,
    /// Whether the consumer group is known to exist, one flag per partition's consumer.
    pub group_ready: Vec<Arc<AtomicBool>>,
    /// Redis's clock as seen from this process: the time queries are answered at.
    pub clock: Arc<Clock>,
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
            ApiError::NotOnBoard(body) => (StatusCode::NOT_FOUND, Json(body)).into_response(),
            ApiError::TooLarge(m) => {
                (StatusCode::PAYLOAD_TOO_LARGE, Json(json!({ "error": m }))).into_response()
            }
            ApiError::UnsupportedMediaType(m) => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                Json(json!({ "error": m })),
            )
                .into_response(),
            ApiError::Internal(m) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(json!({ "error": m })),
            )
                .into_response(),
            ApiError::Unavailable(m) => (
                StatusCode::SERVICE_UNAVAILABLE,
                // Every 503 is worth retrying (the same request, with the same ids).
                [(header::RETRY_AFTER, RETRY_AFTER_SECS)],
                Json(json!({ "error": m })),
            )
                .into_response(),
        }
    }
}

/// A handler's result.
pub type ApiResult<T> = Result<T, ApiError>;

/// How long the API waits for its own Redis connections before it serves.
const CONNECT_WAIT: Duration = Duration::from_secs(5);

/// Connections of the API's own store: one for appends, plus its read connection.
const POOL_SIZE: usize = 1;

/// Serves the API on `listener` (and `/metrics` and the probes on `http.admin_listen` when
/// set, bound here) from a thread of its own, with its own runtime and its own Redis
/// connections, until `cancel` fires; returns once it is serving (or could not start). Ingest and the roll jobs keep the daemon's runtime busy in long stretches of
/// CPU work (decoding a batch, summing it per member); on a thread apart, a query waits
/// for neither them nor their connections. A process that neither consumes nor runs jobs
/// passes its own store as `shared` instead: nothing keeps its runtime busy, and the API
/// then holds no connection of its own.
pub async fn spawn(
    listener: std::net::TcpListener,
    settings: Arc<Settings>,
    metrics: Arc<Metrics>,
    clock: Arc<Clock>,
    group_ready: Vec<Arc<AtomicBool>>,
    shared: Option<Arc<Store>>,
    cancel: CancellationToken,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    use anyhow::Context;
    listener
        .set_nonblocking(true)
        .context("cannot make the http listener non-blocking")?;
    let admin = match settings.http.admin_listen {
        Some(address) => {
            let admin = std::net::TcpListener::bind(address)
                .with_context(|| format!("cannot listen on {address} (http.admin_listen)"))?;
            admin
                .set_nonblocking(true)
                .context("cannot make the admin listener non-blocking")?;
            tracing::info!(listen = %address, "admin http listening");
            Some(admin)
        }
        None => None,
    };
    let (started, ready) = tokio::sync::oneshot::channel::<anyhow::Result<()>>();
    let thread = std::thread::Builder::new()
        .name("rollboard-http".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = started.send(Err(e).context("cannot start the http runtime"));
                    return;
                }
            };
            runtime.block_on(async move {
                let setup = async {
                    let store = match shared {
                        Some(store) => store,
                        None => {
                            let store = Store::connect_with(
                                &settings.redis,
                                POOL_SIZE,
                                crate::store::Reconnect::Forever,
                            )
                            .await
                            .context("cannot create the http server's redis client")?
                            .with_metrics(metrics.clone());
                            for client in store.pool().clients() {
                                metrics.watch_reconnects(client);
                            }
                            // The daemon opens the API once Redis answered its start-up
                            // checks: connect now, so that the first request does not wait
                            // for a connection (and its handshake) while Redis may be
                            // refusing commands. Bounded: a Redis gone meanwhile is an
                            // outage the requests report.
                            let connected = futures_util::future::join_all(
                                store
                                    .pool()
                                    .clients()
                                    .iter()
                                    .map(fred::interfaces::ClientLike::wait_for_connect),
                            );
                            let _ = tokio::time::timeout(CONNECT_WAIT, connected).await;
                            Arc::new(store)
                        }
                    };
                    let listener = TcpListener::from_std(listener)
                        .context("cannot serve the http listener")?;
                    let admin = admin
                        .map(TcpListener::from_std)
                        .transpose()
                        .context("cannot serve the admin listener")?;
                    anyhow::Ok((store, listener, admin))
                };
                let (store, listener, admin) = match setup.await {
                    Ok(parts) => parts,
                    Err(e) => {
                        let _ = started.send(Err(e));
                        return;
                    }
                };
                let state = Arc::new(AppState {
                    store,
                    settings: settings.clone(),
                    metrics,
                    group_ready,
                    clock,
                });
                let _ = started.send(Ok(()));
                match admin {
                    None => {
                        serve(listener, router(state), &settings.http, cancel)
                            .instrument(tracing::info_span!("http"))
                            .await
                    }
                    Some(admin) => {
                        let api = serve(
                            listener,
                            finish(api_routes(&state), state.clone()),
                            &settings.http,
                            cancel.clone(),
                        )
                        .instrument(tracing::info_span!("http"));
                        let admin = serve(
                            admin,
                            finish(admin_routes(&state), state.clone()),
                            &settings.http,
                            cancel,
                        )
                        .instrument(tracing::info_span!("admin_http"));
                        tokio::join!(api, admin);
                    }
                }
            });
        })
        .context("cannot start the http thread")?;
    ready
        .await
        .context("the http thread ended before serving")??;
    Ok(thread)
}

/// The router with every route (the API and the admin routes on one listener), limited by
/// `http.*`: a request (body upload included) that takes longer than `request_timeout`
/// answers 408, and intake requests beyond `max_concurrent_intake` answer 503 at once.
pub fn router(state: Arc<AppState>) -> Router {
    finish(api_routes(&state).merge(admin_routes(&state)), state)
}

/// The API: the query routes (reader's token) and the intake (producer's token).
pub fn api_routes(state: &AppState) -> Router<Arc<AppState>> {
    let limits = &state.settings.http;
    let intake = post(events).layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(|_: tower::BoxError| async {
                ApiError::Unavailable(
                    "too many intake requests at once (http.max_concurrent_intake); retry".into(),
                )
            }))
            .load_shed()
            .concurrency_limit(limits.max_concurrent_intake),
    );
    let tokens = &limits.tokens;
    let reader = || axum::middleware::from_fn_with_state(tokens.query.clone(), bearer);
    // Outermost: a request without the token is refused before it takes an intake slot
    // or its body is read.
    let intake = intake.layer(axum::middleware::from_fn_with_state(
        tokens.intake.clone(),
        bearer,
    ));
    let roles = state.settings.roles;
    let queries = Router::new()
        .route("/v1/boards", get(boards).layer(reader()))
        .route("/v1/boards/{board}/top", get(top).layer(reader()))
        .route(
            "/v1/boards/{board}/members/{member}",
            get(rank).layer(reader()),
        )
        .route(
            "/v1/boards/{board}/members/{member}/around",
            get(around).layer(reader()),
        );
    let queries = if roles.has(Role::Query) {
        queries
    } else {
        // Same paths, so that the answer names the role rather than "no such route".
        Router::new()
            .route("/v1/boards", any(not_run(Role::Query)))
            .route("/v1/boards/{*rest}", any(not_run(Role::Query)))
    };
    let intake = if roles.has(Role::Intake) {
        intake
    } else {
        any(not_run(Role::Intake))
    };
    queries.route("/v1/events", intake)
}

/// What monitoring reads: `/metrics` (operator's token) and the open probes.
pub fn admin_routes(state: &AppState) -> Router<Arc<AppState>> {
    Router::new()
        .route(
            "/metrics",
            get(metrics).layer(axum::middleware::from_fn_with_state(
                state.settings.http.tokens.metrics.clone(),
                bearer,
            )),
        )
        .route(
            "/healthz",
            get(|RawQuery(query): RawQuery| async move {
                params(query, &[]).map(|_| Json(json!({ "status": "ok" })))
            }),
        )
        .route("/readyz", get(readyz))
}

/// `routes` with the layers every listener shares: route timing, the body limit, the
/// request timeout and JSON error bodies.
fn finish(routes: Router<Arc<AppState>>, state: Arc<AppState>) -> Router {
    let timeout = state.settings.http.request_timeout;
    let metrics = state.metrics.clone();
    routes
        .route_layer(axum::middleware::from_fn_with_state(
            state.metrics.clone(),
            timed,
        ))
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            timeout,
        ))
        .layer(axum::middleware::from_fn_with_state(metrics, counted))
        .layer(axum::middleware::map_response(json_errors))
}

/// The handler of the routes of `role` in a process that does not run it: 404 naming it.
fn not_run(role: Role) -> impl Fn() -> std::future::Ready<ApiError> + Clone + Send + 'static {
    move || {
        std::future::ready(ApiError::NotFound(format!(
            "this process does not run the {} role (rollboard run --roles)",
            role.as_str()
        )))
    }
}

/// Lets a request through when its route's role has no token, or when it carries
/// `Authorization: Bearer <token>` with one of the role's tokens valid now (compared in
/// constant time); answers 401 with `WWW-Authenticate: Bearer` otherwise. The token is
/// never logged.
async fn bearer(
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
    let mut response =
        (StatusCode::UNAUTHORIZED, Json(json!({ "error": message }))).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(challenge),
    );
    response
}

/// The route template a request matched, filled in by [`timed`] (inside the router, where
/// the match is known) for [`counted`] (outside it, where every answer passes).
#[derive(Clone, Default)]
struct MatchedRoute(Arc<std::sync::OnceLock<String>>);

/// Counts every answer in `rollboard_http_requests_total` by route template and status,
/// those of the timeout and of unknown paths included (`unmatched`).
async fn counted(
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
async fn timed(
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

/// Gives every error answer that is not JSON yet (axum's 405, the timeout's 408, a
/// rejection's plain text) a JSON `{"error": ...}` body naming only its status.
async fn json_errors(response: Response) -> Response {
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
    Response::from_parts(parts, Body::from(json!({ "error": message }).to_string()))
}

/// Serves `app` on `listener` until `cancel` fires.
///
/// HTTP/1.1 only: a client must send a request's head within `header_timeout` (an idle
/// connection is closed after as long), at most `max_connections` are served at once (more
/// wait in the listen backlog, holding no memory here). At shutdown the listener closes
/// (new connections are refused), idle and half-received connections are closed at once;
/// a request being handled gets [`SHUTDOWN_DRAIN`] to answer.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: &HttpSettings,
    cancel: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let connections = TaskTracker::new();
    loop {
        // Cancel safety: both waits only take a permit or a connection when they complete.
        let permit = tokio::select! {
            _ = cancel.cancelled() => break,
            permit = slots.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let stream = tokio::select! {
            _ = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let (app, cancel) = (app.clone(), cancel.clone());
        let header_timeout = limits.header_timeout;
        connections.spawn(async move {
            let _permit = permit;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout);
            let conn =
                builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
            tokio::pin!(conn);
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        debug!(error = %e, "connection ended");
                    }
                }
                _ = cancel.cancelled() => {
                    // Closes the connection at once unless a request head has been received.
                    conn.as_mut().graceful_shutdown();
                    if tokio::time::timeout(SHUTDOWN_DRAIN, conn).await.is_err() {
                        debug!("connection closed mid-request at shutdown");
                    }
                }
            }
        });
    }
    // Closed before the drain: a client that connects now is refused at once instead of
    // waiting in the backlog for an accept that never comes.
    drop(listener);
    connections.close();
    connections.wait().await;
}

async fn redis<T>(
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

fn board<'a>(state: &'a AppState, name: &str) -> ApiResult<&'a Board> {
    state.settings.board(name).ok_or_else(|| {
        ApiError::NotFound(format!(
            "unknown board {}",
            crate::domain::event::shown(name.as_bytes())
        ))
    })
}

/// The query parameters, percent-decoded; a value that is not UTF-8 once decoded is a 400,
/// never silently replaced, and so is a parameter the route does not take (not in
/// `allowed`): a misspelt `?limt=5` is named, never ignored.
fn params(query: Option<String>, allowed: &[&str]) -> ApiResult<HashMap<String, String>> {
    let mut params = HashMap::new();
    for pair in query.as_deref().unwrap_or("").split('&') {
        if pair.is_empty() {
            continue;
        }
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |text: &str| {
            let spaced = text.replace('+', " ");
            percent_encoding::percent_decode_str(&spaced)
                .decode_utf8()
                .map(|v| v.into_owned())
        };
        let name = decode(name).map_err(|_| {
            ApiError::BadRequest("a query parameter name is not UTF-8 once decoded".into())
        })?;
        let value = decode(value).map_err(|_| {
            let shown: String = name.chars().take(32).collect();
            ApiError::BadRequest(format!(
                "query parameter {shown:?} is not UTF-8 once decoded"
            ))
        })?;
        if !allowed.contains(&name.as_str()) {
            let takes = match allowed {
                [] => "no query parameters".to_string(),
                names => format!("only {}", names.join(", ")),
            };
            return Err(ApiError::BadRequest(format!(
                "unknown query parameter {}: this route takes {takes}",
                crate::domain::event::shown(name.as_bytes())
            )));
        }
        params.insert(name, value);
    }
    Ok(params)
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
    // The value is not echoed: it can be arbitrarily long.
    text.parse::<u64>()
        .ok()
        .filter(|n| range.contains(n))
        .ok_or_else(|| {
            let to = match *range.end() {
                u64::MAX => String::new(),
                end => format!(" to {end}"),
            };
            ApiError::BadRequest(format!(
                "{name} must be an integer from {}{to}",
                range.start(),
            ))
        })
}

/// The path parameters, or a JSON 400 when they cannot be decoded (e.g. invalid UTF-8).
fn path<T>(extracted: Result<Path<T>, PathRejection>) -> ApiResult<T> {
    // The rejection's own text quotes the segment, which can be long: not echoed.
    extracted.map(|Path(value)| value).map_err(|_| {
        ApiError::BadRequest("invalid path: a segment is not UTF-8 once percent-decoded".into())
    })
}

fn member_of(member: &str) -> ApiResult<&str> {
    check_name(member.as_bytes()).map_err(|why| ApiError::BadRequest(format!("member {why}")))
}

async fn boards(
    State(state): State<Arc<AppState>>,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<Value>> {
    params(query, &[])?;
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
    Ok(Json(json!({ "boards": list })))
}

async fn top(
    State(state): State<Arc<AppState>>,
    name: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> ApiResult<Response> {
    let name = path(name)?;
    let params = params(query, &["limit", "offset", "scope"])?;
    let b = board(&state, &name)?;
    let scope = scope_of(b, &params)?;
    let limit = number(&params, "limit", 10, 1..=1000)?;
    let offset = number(&params, "offset", 0, 0..=u64::MAX)?;
    let page = redis(
        &state,
        state.store.top(b, scope, offset, limit, state.clock.now()),
    )
    .await?;
    Ok(Json(page).into_response())
}

async fn rank(
    State(state): State<Arc<AppState>>,
    names: Result<Path<(String, String)>, PathRejection>,
    RawQuery(query): RawQuery,
) -> ApiResult<Response> {
    let (name, member) = path(names)?;
    let params = params(query, &["scope"])?;
    let b = board(&state, &name)?;
    let scope = scope_of(b, &params)?;
    let member = member_of(&member)?;
    let rank = redis(
        &state,
        state.store.rank(b, scope, member, state.clock.now()),
    )
    .await?;
    if !rank.is_ranked() {
        return Err(ApiError::NotOnBoard(rank.not_on_board()));
    }
    Ok(Json(rank).into_response())
}

async fn around(
    State(state): State<Arc<AppState>>,
    names: Result<Path<(String, String)>, PathRejection>,
    RawQuery(query): RawQuery,
) -> ApiResult<Response> {
    let (name, member) = path(names)?;
    let params = params(query, &["radius", "scope"])?;
    let b = board(&state, &name)?;
    let scope = scope_of(b, &params)?;
    let member = member_of(&member)?;
    let radius = number(&params, "radius", 5, 0..=100)?;
    match redis(
        &state,
        state
            .store
            .around(b, scope, member, radius, state.clock.now()),
    )
    .await?
    {
        Ok(page) => Ok(Json(page).into_response()),
        Err(missing) => Err(ApiError::NotOnBoard(missing.not_on_board())),
    }
}

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

async fn events(
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

async fn metrics(
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

/// How long `/readyz` waits for Redis.
const READY_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

async fn readyz(State(state): State<Arc<AppState>>, RawQuery(query): RawQuery) -> Response {
    if let Err(e) = params(query, &[]) {
        return e.into_response();
    }
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
        state.store.ensure_scripts().await?;
        Ok::<bool, StoreError>(group)
    };
    // A failed check is counted and logged: during a partition the daemon's own calls
    // only fail when their timeouts (up to 30 s) run out, so the probe is the first to see it.
    let failed = match tokio::time::timeout(READY_CHECK_TIMEOUT, check).await {
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
    };
    let (redis_ok, group) = match failed {
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
