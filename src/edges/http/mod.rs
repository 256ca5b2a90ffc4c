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
//! but those that prove the data wrong, see [`crate::store::StoreError::is_outage`]) answers 503 with
//! `Retry-After` (at once, naming the host, while every connection is known lost; see
//! [`crate::store::Store::known_down`]), and so does an intake over `http.max_concurrent_intake`; a Redis
//! error that proves the data wrong (`WRONGTYPE`: a key holding data rollboard did not
//! write, or a script's consistency check) answers 500. Nothing a client sends can produce a 500.
//!
//! Layout: this file holds the state, the thread the server runs on, the routers and the
//! connection loop; `query`, `board`, `changes` (the change feed's Server-Sent Events),
//! `page` (the live page at `/`), `intake` and `health` the handlers of each route group, `openapi` the document describing them all (`GET /v1/openapi.json`) and `document` its
//! form for the boards configured,
//! `params` the query string they share, `auth` the bearer tokens, `middleware` the
//! route metrics, `error` the error answers and the Redis error mapping, `answers` the
//! query answers kept and their `ETag` and `Cache-Control`.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::error_handling::HandleErrorLayer;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::{any, get, post};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceBuilder;
use tower_http::timeout::TimeoutLayer;
use tracing::{debug, warn, Instrument};

use crate::config::{HttpSettings, Settings};
use crate::domain::clock::Clock;
use crate::domain::roles::Role;
use crate::metrics::Metrics;
use crate::store::{Generations, Store};

mod answers;
mod auth;
mod board;
mod changes;
mod document;
mod error;
mod health;
mod intake;
mod middleware;
mod openapi;
mod page;
mod params;
mod query;

pub use answers::Answers;
pub use changes::{Closer, Hub};
pub use error::{ApiError, ApiResult};

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 4 << 20;
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
    /// The change feeds being streamed, and their subscribers' slots.
    pub hub: Hub,
    /// The query answers kept (see [`Answers`]).
    pub answers: Answers,
    /// The OpenAPI document of this API with these boards, as JSON.
    pub document: String,
}

/// The store the API reads through.
pub enum ApiStore {
    /// The process's own store: a process that neither consumes nor runs jobs shares it,
    /// nothing keeping its runtime busy.
    Shared(Arc<Store>),
    /// Connections of the API's own, counting what they write in the process's write
    /// counters, which the consumers and jobs count theirs in too (see
    /// [`crate::store::Generations`]).
    Own(Arc<Generations>),
}

/// How long the API waits for its own Redis connections before it serves.
const CONNECT_WAIT: Duration = Duration::from_secs(5);

/// Connections of the API's own store: one for appends, plus its read connection.
const POOL_SIZE: usize = 1;

/// Tells [`spawn`] whether the http thread serves, or why it could not start.
type Started = oneshot::Sender<anyhow::Result<()>>;

/// What the http thread is handed to serve.
struct Parts {
    /// The API's listener (every route when `admin` is `None`).
    listener: std::net::TcpListener,
    /// The listener of `http.admin_listen`, when set.
    admin: Option<std::net::TcpListener>,
    settings: Arc<Settings>,
    metrics: Arc<Metrics>,
    clock: Arc<Clock>,
    group_ready: Vec<Arc<AtomicBool>>,
    /// The store to read through.
    store: ApiStore,
}

/// Serves the API on `listener` (and `/metrics` and the probes on `http.admin_listen` when
/// set, bound here) from a thread of its own, with its own runtime and its own Redis
/// connections, until `cancel` fires; returns once it is serving (or could not start). Ingest and the roll jobs keep the daemon's runtime busy in long stretches of
/// CPU work (decoding a batch, summing it per member); on a thread apart, a query waits
/// for neither them nor their connections. A process that neither consumes nor runs jobs
/// passes its own store instead ([`ApiStore::Shared`]): nothing keeps its runtime busy,
/// and the API then holds no connection of its own.
pub async fn spawn(
    listener: std::net::TcpListener,
    settings: Arc<Settings>,
    metrics: Arc<Metrics>,
    clock: Arc<Clock>,
    group_ready: Vec<Arc<AtomicBool>>,
    store: ApiStore,
    cancel: CancellationToken,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    listener
        .set_nonblocking(true)
        .context("cannot make the http listener non-blocking")?;
    let admin = bind_admin(&settings.http)?;
    let parts = Parts {
        listener,
        admin,
        settings,
        metrics,
        clock,
        group_ready,
        store,
    };
    let (started, ready) = oneshot::channel::<anyhow::Result<()>>();
    let thread = std::thread::Builder::new()
        .name("rollboard-http".into())
        .spawn(move || run_thread(parts, started, cancel))
        .context("cannot start the http thread")?;
    ready
        .await
        .context("the http thread ended before serving")??;
    Ok(thread)
}

/// Binds `http.admin_listen` when it is set.
fn bind_admin(http: &HttpSettings) -> anyhow::Result<Option<std::net::TcpListener>> {
    let Some(address) = http.admin_listen else {
        return Ok(None);
    };
    let admin = std::net::TcpListener::bind(address)
        .with_context(|| format!("cannot listen on {address} (http.admin_listen)"))?;
    admin
        .set_nonblocking(true)
        .context("cannot make the admin listener non-blocking")?;
    tracing::info!(listen = %address, "admin http listening");
    Ok(Some(admin))
}

/// The body of the http thread: its own runtime, serving until `cancel` fires.
fn run_thread(parts: Parts, started: Started, cancel: CancellationToken) {
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
    runtime.block_on(serve_parts(parts, started, cancel));
}

/// Connects the API's store (unless shared), reports the start, serves every listener.
async fn serve_parts(parts: Parts, started: Started, cancel: CancellationToken) {
    let Parts {
        listener,
        admin,
        settings,
        metrics,
        clock,
        group_ready,
        store,
    } = parts;
    let setup = async {
        let store = match store {
            ApiStore::Shared(store) => store,
            ApiStore::Own(generations) => own_store(&settings, &metrics, generations).await?,
        };
        let listener = TcpListener::from_std(listener).context("cannot serve the http listener")?;
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
    let hub = Hub::new(
        settings.redis.clone(),
        metrics.clone(),
        settings.http.max_subscribers,
        settings.http.changes_heartbeat,
        cancel.clone(),
    );
    let state = Arc::new(AppState {
        store,
        settings: settings.clone(),
        answers: Answers::new(&settings.http, metrics.clone()),
        metrics,
        group_ready,
        clock,
        hub,
        document: openapi::document(&settings.boards),
    });
    let _ = started.send(Ok(()));
    serve_listeners(state, listener, admin, cancel).await;
}

/// The API's own store, connected (within [`CONNECT_WAIT`]) before the first request.
async fn own_store(
    settings: &Settings,
    metrics: &Arc<Metrics>,
    generations: Arc<Generations>,
) -> anyhow::Result<Arc<Store>> {
    let store = Store::connect_with(&settings.redis, POOL_SIZE, crate::store::Reconnect::Forever)
        .await
        .context("cannot create the http server's redis client")?
        .with_metrics(metrics.clone())
        .with_generations(generations);
    for client in store.pool().clients() {
        metrics.watch_reconnects(client);
    }
    // The daemon opens the API once Redis answered its start-up checks: connect now, so
    // that the first request does not wait for a connection (and its handshake) while
    // Redis may be refusing commands. Bounded: a Redis gone meanwhile is an outage the
    // requests report.
    let connected = futures_util::future::join_all(
        store
            .pool()
            .clients()
            .iter()
            .map(fred::interfaces::ClientLike::wait_for_connect),
    );
    let _ = tokio::time::timeout(CONNECT_WAIT, connected).await;
    Ok(Arc::new(store))
}

/// Serves every route on `listener`, or the API there and the admin routes on `admin`.
async fn serve_listeners(
    state: Arc<AppState>,
    listener: TcpListener,
    admin: Option<TcpListener>,
    cancel: CancellationToken,
) {
    let http = &state.settings.http;
    match admin {
        None => {
            serve(listener, router(state.clone()), http, cancel)
                .instrument(tracing::info_span!("http"))
                .await
        }
        Some(admin) => {
            let api = serve(
                listener,
                finish(api_routes(&state), state.clone()),
                http,
                cancel.clone(),
            )
            .instrument(tracing::info_span!("http"));
            let admin = serve(
                admin,
                finish(admin_routes(&state), state.clone()),
                http,
                cancel,
            )
            .instrument(tracing::info_span!("admin_http"));
            tokio::join!(api, admin);
        }
    }
}

/// The router with every route (the API and the admin routes on one listener), limited by
/// `http.*`: a request (body upload included) that takes longer than `request_timeout`
/// answers 408, and intake requests beyond `max_concurrent_intake` answer 503 at once.
pub fn router(state: Arc<AppState>) -> Router {
    finish(api_routes(&state).merge(admin_routes(&state)), state)
}

/// The API: the query routes (reader's token) and the intake (producer's token).
pub fn api_routes(state: &AppState) -> Router<Arc<AppState>> {
    let roles = state.settings.roles;
    let queries = if roles.has(Role::Query) {
        query_routes(state)
    } else {
        // Same paths, so that the answer names the role rather than "no such route".
        Router::new()
            .route("/v1/boards", any(not_run(Role::Query)))
            .route("/v1/boards/{*rest}", any(not_run(Role::Query)))
            .route("/v1/openapi.json", any(not_run(Role::Query)))
            .route("/", any(not_run(Role::Query)))
    };
    let intake = if roles.has(Role::Intake) {
        intake_route(state)
    } else {
        any(not_run(Role::Intake))
    };
    queries.route("/v1/events", intake)
}

/// The query routes and the API's OpenAPI document, each behind the reader's token.
fn query_routes(state: &AppState) -> Router<Arc<AppState>> {
    let tokens = &state.settings.http.tokens;
    let reader = || axum::middleware::from_fn_with_state(tokens.query.clone(), auth::bearer);
    Router::new()
        .route("/v1/boards", get(query::boards).layer(reader()))
        .route("/v1/boards/{board}", get(board::board).layer(reader()))
        .route("/v1/boards/{board}/top", get(query::top).layer(reader()))
        .route(
            "/v1/boards/{board}/ranks",
            post(query::ranks).layer(reader()),
        )
        .route(
            "/v1/boards/{board}/members/{member}",
            get(query::rank).layer(reader()),
        )
        .route(
            "/v1/boards/{board}/members/{member}/around",
            get(query::around).layer(reader()),
        )
        .route(
            "/v1/boards/{board}/changes",
            get(changes::changes).layer(reader()),
        )
        .route("/v1/openapi.json", get(openapi::openapi).layer(reader()))
        // The page holds no data: its script sends the reader's token with each request.
        .route("/", get(page::page))
}

/// `POST /v1/events` behind the producer's token and `http.max_concurrent_intake`.
fn intake_route(state: &AppState) -> axum::routing::MethodRouter<Arc<AppState>> {
    let limits = &state.settings.http;
    let intake = post(intake::events).layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(|_: tower::BoxError| async {
                ApiError::Unavailable(
                    "too many intake requests at once (http.max_concurrent_intake); retry".into(),
                )
            }))
            .load_shed()
            .concurrency_limit(limits.max_concurrent_intake),
    );
    // Outermost: a request without the token is refused before it takes an intake slot
    // or its body is read.
    intake.layer(axum::middleware::from_fn_with_state(
        limits.tokens.intake.clone(),
        auth::bearer,
    ))
}

/// What monitoring reads: `/metrics` (operator's token) and the open probes.
pub fn admin_routes(state: &AppState) -> Router<Arc<AppState>> {
    Router::new()
        .route(
            "/metrics",
            get(health::metrics).layer(axum::middleware::from_fn_with_state(
                state.settings.http.tokens.metrics.clone(),
                auth::bearer,
            )),
        )
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
}

/// `routes` with the layers every listener shares: route timing, the body limit, the
/// request timeout and JSON error bodies.
fn finish(routes: Router<Arc<AppState>>, state: Arc<AppState>) -> Router {
    let timeout = state.settings.http.request_timeout;
    let metrics = state.metrics.clone();
    routes
        .route_layer(axum::middleware::from_fn_with_state(
            state.metrics.clone(),
            middleware::timed,
        ))
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            timeout,
        ))
        .layer(axum::middleware::from_fn_with_state(
            metrics,
            middleware::counted,
        ))
        .layer(axum::middleware::map_response(error::json_errors))
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

/// Serves `app` on `listener` until `cancel` fires.
///
/// HTTP/1.1 only: a client must send a request's head within `header_timeout` (an idle
/// connection is closed after as long), at most `max_connections` are served at once (more
/// wait in the listen backlog, holding no memory here). At shutdown the listener closes
/// (new connections are refused), idle and half-received connections are closed at once;
/// a request being handled gets [`SHUTDOWN_DRAIN`] to answer. A change-feed stream ends
/// at once at shutdown (its response then completes), so it does not hold the drain.
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
        connections.spawn(connection(
            stream,
            app.clone(),
            limits.header_timeout,
            permit,
            cancel.clone(),
        ));
    }
    // Closed before the drain: a client that connects now is refused at once instead of
    // waiting in the backlog for an accept that never comes.
    drop(listener);
    connections.close();
    connections.wait().await;
}

/// Serves one connection, holding its `permit`, until it ends or `cancel` fires.
async fn connection(
    stream: TcpStream,
    app: Router,
    header_timeout: Duration,
    permit: OwnedSemaphorePermit,
    cancel: CancellationToken,
) {
    let _permit = permit;
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let closer = Closer::default();
    let close = closer.0.clone();
    let app = tower::ServiceExt::map_request(app, move |mut request: axum::http::Request<_>| {
        request.extensions_mut().insert(closer.clone());
        request
    });
    let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => {
            if let Err(e) = result {
                debug!(error = %e, "connection ended");
            }
        }
        // A change-feed client too slow to keep up: dropped at once, whatever it has not
        // read yet.
        _ = close.cancelled() => debug!("connection closed: a change-feed client too slow"),
        _ = cancel.cancelled() => {
            // Closes the connection at once unless a request head has been received.
            conn.as_mut().graceful_shutdown();
            if tokio::time::timeout(SHUTDOWN_DRAIN, conn).await.is_err() {
                debug!("connection closed mid-request at shutdown");
            }
        }
    }
}
