//! `rollboard run`: the stream consumer, the scheduled roll and resummarize jobs, the HTTP
//! server and a consumer-group poller, all under one cancellation token and task tracker;
//! of these, the parts of the process's roles ([`crate::domain::roles`]).
//!
//! Start-up order: metrics, Redis connections, the permission and board settings checks
//! (retried until Redis answers; no listener is open until they pass, so no probe passes
//! for a process that then refuses to run), HTTP, consumers, scheduler. Shutdown: stop reading, let the batch and the expiry chunk in flight finish, stop
//! the scheduler, drain under a grace timeout.
//!
//! Layout: [`run`] here is the start-up order, step by step; `gate` the start-up checks,
//! `clock` Redis's clock, `consumers` the stream consumers, `jobs` the scheduled jobs and
//! their leases, `watch` the background watchers of the connection and the groups.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio_cron_scheduler::JobScheduler;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn, Instrument};

use crate::config::Settings;
use crate::domain::board::Board;
use crate::domain::clock::Clock;
use crate::domain::roles::{Role, Roles};
use crate::edges::http::ApiStore;
use crate::ingest::consumer::Ingest;
use crate::ingest::stream;
use crate::metrics::Metrics;
use crate::store::{Reconnect, Store};

mod clock;
mod consumers;
mod gate;
mod jobs;
mod watch;

/// How long in-flight work may take to finish after a shutdown signal.
pub const GRACE: Duration = Duration::from_secs(30);
/// Connections in the command pool.
const POOL_SIZE: usize = 4;

/// What the running parts of the daemon share.
#[derive(Clone)]
struct Shared {
    /// The command pool (and its read connection).
    store: Arc<Store>,
    /// The validated settings.
    settings: Arc<Settings>,
    /// The boards the consumers apply to.
    boards: Arc<Vec<Board>>,
    /// The metrics registry.
    metrics: Arc<Metrics>,
    /// Redis's clock as seen from here.
    clock: Arc<Clock>,
    /// Every task of the daemon, waited for at shutdown.
    tracker: TaskTracker,
    /// Fires at shutdown.
    cancel: CancellationToken,
}

/// Connections of the daemon's own pool when it consumes or runs jobs (plus its read
/// connection): the API has its own.
fn pool_size(roles: Roles) -> usize {
    if roles.works() {
        POOL_SIZE
    } else {
        // Intake and query only: one write connection and the read connection, shared
        // with the API (see [`crate::edges::http::spawn`]): a sidecar holds two connections.
        1
    }
}

/// Runs the daemon until `cancel` fires, then drains. Only the parts of `settings.roles`
/// run, and only their Redis connections are made: the pool and its read connection
/// (shared with the API when the process neither consumes nor runs jobs), one reader per
/// stream partition with `consume`, the API's own pool otherwise.
pub async fn run(settings: Settings, cancel: CancellationToken) -> anyhow::Result<()> {
    let roles = settings.roles;
    info!(
        version = env!("CARGO_PKG_VERSION"),
        boards = settings.boards.len(),
        roles = %roles,
        redis = %settings.redis.host(),
        "rollboard starting"
    );
    let settings = Arc::new(settings);
    let metrics = start_metrics(&settings, &cancel);
    let store = connect(&settings, &metrics).await?;
    let shared = Shared {
        clock: Arc::new(Clock::new(settings.redis.max_clock_skew_ms)),
        boards: Arc::new(settings.boards.clone()),
        store,
        settings,
        metrics,
        tracker: TaskTracker::new(),
        cancel,
    };
    // One consumer per partition, each with its own reader (XREADGROUP blocks it).
    let consumers = if roles.has(Role::Consume) {
        consumers::build(&shared).await?
    } else {
        Vec::new()
    };
    if !ready_to_start(&shared).await? {
        return Ok(());
    }
    spawn_keepers(&shared);
    let group_ready = consumers.iter().map(Ingest::group_ready).collect();
    let http = start_http(&shared, group_ready).await?;
    if roles.has(Role::Consume) {
        spawn_consumers(consumers, &shared);
    }
    let scheduler = if roles.has(Role::Jobs) {
        Some(jobs::start(&shared).await?)
    } else {
        None
    };
    shared.cancel.cancelled().await;
    drain(scheduler, &shared.tracker, http).await;
    info!("rollboard stopped");
    Ok(())
}

/// The metrics registry, with the token watcher reporting into it and (for a consumer)
/// the streams it reads registered.
fn start_metrics(settings: &Arc<Settings>, cancel: &CancellationToken) -> Arc<Metrics> {
    let metrics = Arc::new(Metrics::new(&settings.boards));
    // Before Redis is reached: a SIGHUP while the start-up checks wait for it then re-reads
    // the tokens instead of ending the process (its default action).
    tokio::spawn(
        crate::config::tokens::watch(
            settings.http.tokens.roles(),
            settings.http.token_reload_interval,
            metrics.clone(),
            cancel.clone(),
        )
        .instrument(tracing::info_span!("tokens")),
    );
    if settings.roles.has(Role::Consume) {
        metrics.streams(&stream::keys(&settings.ingest));
        metrics.capped_stream(
            &settings.ingest.dead_letter_stream,
            settings.ingest.dead_letter_max_len,
        );
    }
    metrics
}

/// The daemon's command pool, its reconnections counted.
async fn connect(settings: &Settings, metrics: &Arc<Metrics>) -> anyhow::Result<Arc<Store>> {
    let url = settings.redis.redacted_url();
    let store = Arc::new(
        Store::connect_with(
            &settings.redis,
            pool_size(settings.roles),
            Reconnect::Forever,
        )
        .await
        .with_context(|| format!("invalid redis url {url}"))?
        .with_metrics(metrics.clone()),
    );
    for client in store.pool().clients() {
        metrics.watch_reconnects(client);
    }
    Ok(store)
}

/// Passes the start-up gate and measures Redis's clock; `Ok(false)`: shutdown came first.
async fn ready_to_start(shared: &Shared) -> anyhow::Result<bool> {
    let Shared {
        store,
        settings,
        metrics,
        clock,
        cancel,
        ..
    } = shared;
    // Nothing touches board data, and no listener opens, before the stored settings are
    // known to agree: a probe must never pass for a process that is about to refuse to run.
    if !gate::settings_gate(store, settings, metrics, cancel).await? {
        return Ok(false);
    }
    // Every time the daemon judges is Redis's: nothing runs before the first measure.
    if !clock::sync_clock(store, clock, metrics, cancel).await {
        return Ok(false);
    }
    // A process that may roll shows its boards' windows from now on, not 0 until its first
    // complete roll (which may be a tick away, or held by another replica's lease).
    if settings.roles.has(Role::Jobs) {
        metrics.windows_at(&settings.boards, clock.now());
    }
    Ok(true)
}

/// Spawns the watcher of the pool's connection errors and the keeper of Redis's clock.
fn spawn_keepers(shared: &Shared) {
    let Shared {
        store,
        settings,
        metrics,
        clock,
        tracker,
        cancel,
        ..
    } = shared;
    tracker.spawn(
        watch::log_connection_errors(store.clone(), settings.redis.host(), cancel.clone())
            .instrument(tracing::info_span!("redis")),
    );
    tracker.spawn(
        clock::keep_clock(
            store.clone(),
            clock.clone(),
            metrics.clone(),
            cancel.clone(),
        )
        .instrument(tracing::info_span!("clock")),
    );
}

/// Binds `http.listen` and starts the HTTP thread; its handle, to join at shutdown.
async fn start_http(
    shared: &Shared,
    group_ready: Vec<Arc<std::sync::atomic::AtomicBool>>,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let settings = &shared.settings;
    let roles = settings.roles;
    let listener = std::net::TcpListener::bind(settings.http.listen)
        .with_context(|| format!("cannot listen on {}", settings.http.listen))?;
    info!(listen = %settings.http.listen, "http listening");
    crate::edges::http::spawn(
        listener,
        settings.clone(),
        shared.metrics.clone(),
        shared.clock.clone(),
        group_ready,
        // The API keeps connections of its own only when it serves routes beside the
        // consumer or the jobs; a worker's probes and metrics need none.
        if roles.works() && roles.serves() {
            ApiStore::Own(shared.store.generations().clone())
        } else {
            ApiStore::Shared(shared.store.clone())
        },
        shared.cancel.clone(),
    )
    .await
}

/// Spawns the partitions' consumers, the watch of retired partitions and the group poller.
fn spawn_consumers(consumers: Vec<Ingest>, shared: &Shared) {
    consumers::spawn(consumers, shared);
    shared.tracker.spawn(
        consumers::watch_retired(shared.clone())
            .instrument(tracing::info_span!("retired_partitions")),
    );
    shared.tracker.spawn(
        watch::poll_groups(
            shared.store.clone(),
            shared.metrics.clone(),
            shared.settings.clone(),
            shared.cancel.clone(),
        )
        .instrument(tracing::info_span!("group_poller")),
    );
}

/// After the shutdown signal: stops the scheduler, lets the work in flight finish within
/// [`GRACE`], then waits for the HTTP thread.
async fn drain(
    scheduler: Option<JobScheduler>,
    tracker: &TaskTracker,
    http: std::thread::JoinHandle<()>,
) {
    if let Some(mut scheduler) = scheduler {
        if let Err(e) = scheduler.shutdown().await {
            warn!(error = %e, "scheduler did not stop cleanly");
        }
    }
    tracker.close();
    if tokio::time::timeout(GRACE, tracker.wait()).await.is_err() {
        warn!(
            grace_s = GRACE.as_secs(),
            "work still running after the grace period; exiting anyway"
        );
    }
    join_http(http).await;
}

/// Waits for the HTTP thread, which stops once the daemon's token fires (within
/// [`crate::edges::http::SHUTDOWN_DRAIN`]), but no longer than [`GRACE`].
async fn join_http(http: std::thread::JoinHandle<()>) {
    let joined = tokio::task::spawn_blocking(move || http.join());
    match tokio::time::timeout(GRACE, joined).await {
        Ok(Ok(Ok(()))) => {}
        Ok(_) => warn!("the http thread failed"),
        Err(_) => warn!("the http server still running after the grace period"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sidecar_pool_is_one_write_connection() {
        use crate::domain::roles::{Role, Roles};
        assert_eq!(pool_size(Roles::of(&[Role::Intake, Role::Query])), 1);
        assert_eq!(pool_size(Roles::of(&[Role::Jobs])), POOL_SIZE);
        assert_eq!(pool_size(Roles::ALL), POOL_SIZE);
    }
}
