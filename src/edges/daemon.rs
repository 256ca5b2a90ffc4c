//! `rollboard run`: the stream consumer, the scheduled roll and resummarize jobs, the HTTP
//! server and a consumer-group poller, all under one cancellation token and task tracker;
//! of these, the parts of the process's roles ([`crate::domain::roles`]).
//!
//! Start-up order: metrics, Redis connections, the permission and board settings checks
//! (retried until Redis answers; no listener is open until they pass, so no probe passes
//! for a process that then refuses to run), HTTP, consumers, scheduler. Shutdown: stop reading, let the batch and the expiry chunk in flight finish, stop
//! the scheduler, drain under a grace timeout.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use fred::prelude::*;
use tokio_cron_scheduler::{Job as CronJob, JobScheduler};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn, Instrument};

use crate::config::Settings;
use crate::domain::clock::Clock;
use crate::domain::roles::{Role, Roles};
use crate::ingest::consumer::Ingest;
use crate::ingest::stream::{self, group_info};
use crate::metrics::Metrics;
use crate::roll::{self, Job, RollError};
use crate::store::{Conflicts, Denied, Reconnect, Refused, Store};

/// How long in-flight work may take to finish after a shutdown signal.
pub const GRACE: Duration = Duration::from_secs(30);
/// Connections in the command pool.
const POOL_SIZE: usize = 4;

/// The scheduled jobs, each guarded so that one run at a time happens in this process, and
/// each tick run by one replica: the one that takes the tick's lease in Redis.
struct Jobs {
    /// Unique to this process: the holder part of the lease values it writes.
    token: String,
    store: Arc<Store>,
    /// Redis's clock as seen from here: what names a tick.
    clock: Arc<Clock>,
    settings: Arc<Settings>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
    rolling: Mutex<Option<Running>>,
    resummarizing: Mutex<Option<Running>>,
}

/// A job run in progress, as seen by the next scheduled run of the same job.
struct Running {
    since: Instant,
    warned: bool,
}

/// How long a run may go on before the skipped runs behind it are logged as a warning.
const STALLED: Duration = Duration::from_secs(5);

/// The name of a scheduled job, as its lease key and its `job` label know it.
fn job_name(job: Job) -> &'static str {
    match job {
        Job::Resummarize => "resummarize",
        _ => "roll",
    }
}

/// The tick a cron fire at `now` (Redis's clock as this process sees it) stands for: the
/// nearest whole second. Each replica's cron fires just after a second of its own host's
/// clock; read on the one clock, the replicas' fires of one tick land within their hosts'
/// sub-second skew of that second, so they name the same tick even when a host's clock is
/// whole seconds off.
fn tick_of(now: i64) -> i64 {
    (now + 500).div_euclid(1_000) * 1_000
}

/// A token unique to this process: host, process id and a random part.
fn process_token() -> String {
    let host = hostname::get()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!(
        "{host}:{}:{}",
        std::process::id(),
        uuid::Uuid::now_v7().simple()
    )
}

impl Jobs {
    /// Runs the tick `tick` of `job` if this replica takes its lease: the lease is renewed
    /// every third of `schedule.lease` while the run goes on (a run longer than a tick
    /// keeps it, so no other replica starts the next tick meanwhile) and released at the
    /// end. A lease that could not be renewed in time (this process stalled past its time
    /// to live) may be another replica's by now: the run stops at its next instance.
    async fn run(&self, job: Job, tick: i64) {
        let flag = match job {
            Job::Resummarize => &self.resummarizing,
            _ => &self.rolling,
        };
        if self.cancel.is_cancelled() {
            return;
        }
        {
            let Ok(mut running) = flag.lock() else { return };
            if let Some(run) = running.as_mut() {
                let going = run.since.elapsed();
                if going >= STALLED && !run.warned {
                    run.warned = true;
                    warn!(
                        ?job,
                        seconds = going.as_secs(),
                        "a run is still going; later runs are skipped until it ends"
                    );
                } else {
                    debug!(?job, "previous run still going; skipped");
                }
                return;
            }
            *running = Some(Running {
                since: Instant::now(),
                warned: false,
            });
        }
        self.leased(job, tick).await;
        if let Ok(mut running) = flag.lock() {
            *running = None;
        }
    }

    /// Takes the lease of `tick`, runs the job under it, releases it.
    async fn leased(&self, job: Job, tick: i64) {
        let ttl = self.settings.schedule.lease;
        let name = job_name(job);
        // Without a connection every command would wait for the reconnection: count the
        // run as failed now rather than hold the job (and every later run) silently.
        if !self.store.is_connected() {
            self.failed(job, &Store::not_connected());
            return;
        }
        let lease = match self.store.acquire_lease(name, &self.token, tick, ttl).await {
            Ok(Some(lease)) => lease,
            Ok(None) => {
                debug!(job = name, tick, "the tick is run by another replica");
                return;
            }
            Err(e) => {
                self.failed(job, &e);
                return;
            }
        };
        self.metrics.job_run(name);
        debug!(job = name, tick, "running the tick under the lease");
        // Stopped by shutdown, or by the loss of the lease.
        let stop = self.cancel.child_token();
        let work = self.boards(job, &stop);
        tokio::pin!(work);
        let mut renew = tokio::time::interval(ttl / 3);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick completes at once: the lease was just taken.
        renew.tick().await;
        loop {
            // Cancel safety: `work` is pinned outside the loop and polled to its end;
            // an interval tick is not lost when the other branch completes first.
            tokio::select! {
                _ = &mut work => break,
                _ = renew.tick(), if !stop.is_cancelled() => {
                    match self.store.renew_lease(&lease, ttl).await {
                        Ok(true) => {}
                        Ok(false) => {
                            warn!(job = name, tick, "the job's lease expired before it was renewed; stopping this run");
                            stop.cancel();
                        }
                        Err(e) => {
                            self.metrics.redis_error(&e);
                            warn!(job = name, error = %e, "cannot renew the job's lease; retrying");
                        }
                    }
                }
            }
        }
        match self.store.release_lease(&lease).await {
            Ok(_) => {}
            // It expires on its own within `ttl`.
            Err(e) => {
                self.metrics.redis_error(&e);
                debug!(job = name, error = %e, "cannot release the job's lease; it expires");
            }
        }
    }

    /// The boards `job` covers.
    fn covered(&self, job: Job) -> impl Iterator<Item = &crate::domain::board::Board> {
        self.settings.boards.iter().filter(move |b| match job {
            Job::Roll => b.mode == crate::domain::board::Mode::Incremental,
            Job::Resummarize => b.mode == crate::domain::board::Mode::Resummarize,
            Job::All => true,
        })
    }

    /// Counts a run of `job` that could not start (no lease without Redis) as failed for
    /// each board it covers, as a run that failed on every board would be.
    fn failed(&self, job: Job, e: &crate::store::StoreError) {
        for board in self.covered(job) {
            self.metrics
                .roll_failed(&board.name, board.mode.as_str(), Some(e));
        }
        warn!(job = job_name(job), error = %e, "cannot take the job's lease; the next run catches up");
    }

    /// Rolls every board `job` covers, until done or `stop` fires.
    async fn boards(&self, job: Job, stop: &CancellationToken) {
        for board in self.covered(job) {
            // Without a connection every command would wait for the reconnection: count the
            // run as failed now rather than hold the job (and every later run) silently.
            if !self.store.is_connected() {
                let e = Store::not_connected();
                self.metrics
                    .roll_failed(&board.name, board.mode.as_str(), Some(&e));
                warn!(board = %board.name, error = %e, "roll failed; the next run catches up");
                continue;
            }
            let started = Instant::now();
            // Read from Redis for each roll rather than from the measured offset: the
            // measure can go stale (TIME failing) while this host's clock is stepped, and a
            // roll ahead of Redis's clock cannot be undone.
            let now = match self.store.time_ms().await {
                Ok(now) => now,
                Err(e) => {
                    self.metrics
                        .roll_failed(&board.name, board.mode.as_str(), Some(&e));
                    warn!(board = %board.name, error = %e, "cannot read Redis's clock; roll skipped, the next run catches up");
                    continue;
                }
            };
            match roll::roll_board(&self.store, board, now, self.settings.schedule.chunk, stop)
                .await
            {
                Ok(report) => {
                    if !report.complete() {
                        warn!(board = %report.board, failed = report.instances_failed,
                              error = report.first_error.as_deref().unwrap_or_default(),
                              "some instances were not rolled; the next run catches up");
                    }
                    self.metrics
                        .rolled(&report.figures(), started.elapsed().as_secs_f64(), now);
                    if report.slices_expired > 0 || report.members_removed > 0 {
                        info!(board = %report.board, mode = report.mode, slices = report.slices_expired,
                              members_removed = report.members_removed, "window rolled");
                    }
                }
                Err(RollError::Cancelled) => break,
                Err(RollError::Store(e)) => {
                    self.metrics
                        .roll_failed(&board.name, board.mode.as_str(), Some(&e));
                    warn!(board = %board.name, error = %e, "roll failed; the next run catches up");
                }
                Err(e) => {
                    self.metrics
                        .roll_failed(&board.name, board.mode.as_str(), None);
                    warn!(board = %board.name, error = %e, "roll failed; the next run catches up")
                }
            }
        }
    }
}

async fn schedule(jobs: Arc<Jobs>, tracker: TaskTracker) -> anyhow::Result<JobScheduler> {
    let scheduler = JobScheduler::new()
        .await
        .context("cannot create the scheduler")?;
    for (cron, job) in [
        (&jobs.settings.schedule.roll, Job::Roll),
        (&jobs.settings.schedule.resummarize, Job::Resummarize),
    ] {
        let (jobs, tracker) = (jobs.clone(), tracker.clone());
        let cron_job = CronJob::new_async(cron.as_str(), move |_, _| {
            let (jobs, tracker) = (jobs.clone(), tracker.clone());
            Box::pin(async move {
                let tick = tick_of(jobs.clock.now());
                let span = tracing::info_span!("job", ?job);
                let _ = tracker
                    .spawn(async move { jobs.run(job, tick).await }.instrument(span))
                    .await;
            })
        })
        .with_context(|| format!("invalid cron expression {cron:?}"))?;
        scheduler.add(cron_job).await.context("cannot add a job")?;
    }
    scheduler
        .start()
        .await
        .context("cannot start the scheduler")?;
    Ok(scheduler)
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

/// Logs every connection error of the pool's first connection, naming the Redis host
/// (never the password), until `cancel` fires. Commands sent meanwhile wait for the
/// reconnection, so without this an outage would show only as their timeouts.
async fn log_connection_errors(store: Arc<Store>, host: String, cancel: CancellationToken) {
    use fred::interfaces::EventInterface;
    let Some(client) = store.pool().clients().first() else {
        return;
    };
    let mut errors = client.error_rx();
    loop {
        // Cancel safety: a broadcast receive loses nothing when it is dropped.
        let received = tokio::select! {
            _ = cancel.cancelled() => return,
            received = errors.recv() => received,
        };
        match received {
            Ok((error, _)) => {
                warn!(redis = %host, error = %error, "redis connection error; reconnecting")
            }
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Waits until Redis answers the permission probe and the board settings check.
/// `Ok(false)`: shutdown came first; an error: the Redis user lacks a permission, or a
/// board's settings conflict with its data (the daemon must not start either way).
async fn settings_gate(
    store: &Store,
    settings: &Settings,
    metrics: &Metrics,
    cancel: &CancellationToken,
) -> anyhow::Result<bool> {
    let boards = &settings.boards;
    let mut backoff = Duration::from_millis(100);
    let mut permitted = false;
    // Connection errors never reach a queued command (it waits for the reconnection), so
    // they are watched here: credentials or a certificate that Redis or rustls refuse stop
    // the start, anything else is retried.
    let mut errors = store.client().error_rx();
    loop {
        if !permitted && !store.is_connected() {
            tokio::select! {
                _ = cancel.cancelled() => return Ok(false),
                error = errors.recv() => {
                    if let Ok((error, _)) = error {
                        if let Some(refused) = Refused::from_error(&error) {
                            cancel.cancel();
                            return Err(refused.into());
                        }
                        let e = crate::store::StoreError::Redis(error);
                        metrics.redis_error(&e);
                        warn!(redis = %settings.redis.host(), error = %e, "cannot connect to redis yet; retrying");
                    }
                }
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
            continue;
        }
        if !permitted {
            match stream::check_permissions(store, boards, &settings.ingest).await {
                Ok(denied) if denied.is_empty() => permitted = true,
                Ok(denied) => {
                    cancel.cancel();
                    return Err(Denied(denied).into());
                }
                Err(e) => {
                    if let Some(denied) = Denied::from_error(&e) {
                        cancel.cancel();
                        return Err(denied.into());
                    }
                    metrics.redis_error(&e);
                    warn!(error = %e, "cannot check the redis permissions yet; retrying");
                }
            }
        }
        let checked = if permitted {
            Some(store.check_settings(boards).await)
        } else {
            None
        };
        match checked {
            None => {}
            Some(Ok(conflicts)) if conflicts.is_empty() => return Ok(true),
            Some(Ok(conflicts)) => {
                cancel.cancel();
                return Err(Conflicts(conflicts).into());
            }
            Some(Err(e)) => {
                metrics.redis_error(&e);
                warn!(error = %e, "cannot check the board settings in redis yet; retrying");
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return Ok(false),
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// How often the offset to Redis's clock is measured again.
const CLOCK_SYNC: Duration = Duration::from_secs(5);

/// Measures the offset to Redis's clock until it succeeds; `false`: shutdown came first.
async fn sync_clock(
    store: &Store,
    clock: &Clock,
    metrics: &Metrics,
    cancel: &CancellationToken,
) -> bool {
    let mut backoff = Duration::from_millis(100);
    loop {
        match clock.sync(store.time_ms()).await {
            Ok(skew) => {
                metrics.clock_skew(skew, clock.is_skewed());
                if clock.is_skewed() {
                    warn!(
                        skew_ms = skew,
                        "this host's clock is off from Redis's; time is judged by Redis's"
                    );
                }
                return true;
            }
            Err(e) => {
                metrics.redis_error(&e);
                warn!(error = %e, "cannot read Redis's clock yet; retrying");
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return false,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Measures the offset to Redis's clock every [`CLOCK_SYNC`], reporting the skew (a
/// warning each time it goes beyond `redis.max_clock_skew`). A failed measure keeps the
/// last offset: the local clock drifts by far less than a slice between two measures.
async fn keep_clock(
    store: Arc<Store>,
    clock: Arc<Clock>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let mut skewed = clock.is_skewed();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(CLOCK_SYNC) => {}
        }
        match clock.sync(store.time_ms()).await {
            Ok(skew) => {
                metrics.clock_skew(skew, clock.is_skewed());
                if clock.is_skewed() && !skewed {
                    warn!(
                        skew_ms = skew,
                        "this host's clock is off from Redis's; time is judged by Redis's"
                    );
                } else if !clock.is_skewed() && skewed {
                    info!(
                        skew_ms = skew,
                        "this host's clock agrees with Redis's again"
                    );
                }
                skewed = clock.is_skewed();
            }
            Err(e) => metrics.redis_error(&e),
        }
    }
}

/// Reads partitions of other layouts (left by a change of `ingest.partitions`) while they
/// hold entries the group has not finished: checked at start and every `claim_idle`, one
/// consumer per such partition, which stops once the group has nothing left there.
async fn watch_retired(
    store: Arc<Store>,
    settings: Arc<Settings>,
    boards: Arc<Vec<crate::domain::board::Board>>,
    metrics: Arc<Metrics>,
    clock: Arc<Clock>,
    tracker: TaskTracker,
    cancel: CancellationToken,
) {
    let ingest = &settings.ingest;
    let mut running: Vec<(String, tokio::task::JoinHandle<()>)> = Vec::new();
    loop {
        running.retain(|(_, task)| !task.is_finished());
        for key in crate::domain::partition::retired_keys(&ingest.stream, ingest.partitions) {
            if running.iter().any(|(k, _)| *k == key) {
                continue;
            }
            match stream::holds_work(store.client(), &key, &ingest.group).await {
                Ok(false) => {}
                Ok(true) => {
                    let reader =
                        match Store::dedicated_with(&settings.redis, Reconnect::Forever).await {
                            Ok(reader) => reader,
                            Err(e) => {
                                warn!(error = %e, "cannot create a reader for a retired partition");
                                continue;
                            }
                        };
                    warn!(stream = %key, partitions = ingest.partitions,
                          "a stream of another ingest.partitions layout holds unfinished entries; reading it until it is drained");
                    let consumer = Ingest::new(
                        store.clone(),
                        reader,
                        ingest.clone(),
                        boards.clone(),
                        metrics.clone(),
                    )
                    .reading(key.clone(), true)
                    .with_clock(clock.clone());
                    let span = tracing::info_span!("consumer", stream = %key, retired = true);
                    let task = tracker.spawn(
                        consume(
                            consumer,
                            store.clone(),
                            ingest.group.clone(),
                            ingest.consumer.clone(),
                            cancel.clone(),
                        )
                        .instrument(span),
                    );
                    running.push((key, task));
                }
                // A user without rights on the other layouts' keys cannot have appended there.
                Err(e) if e.to_string().contains("NOPERM") => {
                    debug!(stream = %key, "no permission on a key of another layout; not read");
                }
                Err(e) => metrics.redis_error(&e),
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(ingest.claim_idle) => {}
        }
    }
}

/// Runs `consumer` (reading `stream`) until `cancel` fires; on that clean exit, with its own
/// pending list drained, removes it from the group, so that a replaced pod's name does not
/// stay in the group for ever. A consumer still holding entries stays: another claims them.
async fn consume(
    consumer: Ingest,
    store: Arc<Store>,
    group: String,
    name: String,
    cancel: CancellationToken,
) {
    let stream = consumer.stream().to_string();
    consumer.run(cancel.clone()).await;
    if !cancel.is_cancelled() {
        return;
    }
    match store.forget_consumer(&stream, &group, &name).await {
        Ok(true) => info!(stream = %stream, consumer = %name, "consumer removed from the group"),
        Ok(false) => {
            info!(stream = %stream, consumer = %name, "consumer holds pending entries (or no group); left in the group")
        }
        Err(e) => warn!(stream = %stream, error = %e, "cannot remove the consumer from the group"),
    }
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
    if roles.has(Role::Consume) {
        metrics.streams(&stream::keys(&settings.ingest));
        metrics.capped_stream(
            &settings.ingest.dead_letter_stream,
            settings.ingest.dead_letter_max_len,
        );
    }
    let url = settings.redis.redacted_url();
    let store = Arc::new(
        Store::connect_with(&settings.redis, pool_size(roles), Reconnect::Forever)
            .await
            .with_context(|| format!("invalid redis url {url}"))?
            .with_metrics(metrics.clone()),
    );
    for client in store.pool().clients() {
        metrics.watch_reconnects(client);
    }
    let clock = Arc::new(Clock::new(settings.redis.max_clock_skew_ms));
    // One consumer per partition, each with its own reader (XREADGROUP blocks it).
    let boards = Arc::new(settings.boards.clone());
    let mut consumers = Vec::new();
    if roles.has(Role::Consume) {
        for key in stream::keys(&settings.ingest) {
            let reader = Store::dedicated_with(&settings.redis, Reconnect::Forever)
                .await
                .context("cannot create the stream reader")?;
            metrics.watch_reconnects(&reader);
            consumers.push(
                Ingest::new(
                    store.clone(),
                    reader,
                    settings.ingest.clone(),
                    boards.clone(),
                    metrics.clone(),
                )
                .reading(key, false)
                .with_clock(clock.clone()),
            );
        }
    }
    let group_ready = consumers.iter().map(Ingest::group_ready).collect();

    // Nothing touches board data, and no listener opens, before the stored settings are
    // known to agree: a probe must never pass for a process that is about to refuse to run.
    if !settings_gate(&store, &settings, &metrics, &cancel).await? {
        return Ok(());
    }
    // Every time the daemon judges is Redis's: nothing runs before the first measure.
    if !sync_clock(&store, &clock, &metrics, &cancel).await {
        return Ok(());
    }
    // A process that may roll shows its boards' windows from now on, not 0 until its first
    // complete roll (which may be a tick away, or held by another replica's lease).
    if roles.has(Role::Jobs) {
        metrics.windows_at(&settings.boards, clock.now());
    }
    let tracker = TaskTracker::new();
    tracker.spawn(
        log_connection_errors(store.clone(), settings.redis.host(), cancel.clone())
            .instrument(tracing::info_span!("redis")),
    );
    tracker.spawn(
        keep_clock(
            store.clone(),
            clock.clone(),
            metrics.clone(),
            cancel.clone(),
        )
        .instrument(tracing::info_span!("clock")),
    );
    let listener = std::net::TcpListener::bind(settings.http.listen)
        .with_context(|| format!("cannot listen on {}", settings.http.listen))?;
    info!(listen = %settings.http.listen, "http listening");
    let http = crate::edges::http::spawn(
        listener,
        settings.clone(),
        metrics.clone(),
        clock.clone(),
        group_ready,
        // The API keeps connections of its own only when it serves routes beside the
        // consumer or the jobs; a worker's probes and metrics need none.
        (!(roles.works() && roles.serves())).then(|| store.clone()),
        cancel.clone(),
    )
    .await?;

    if roles.has(Role::Consume) {
        for ingest in consumers {
            let span = tracing::info_span!("consumer", stream = %ingest.stream());
            tracker.spawn(
                consume(
                    ingest,
                    store.clone(),
                    settings.ingest.group.clone(),
                    settings.ingest.consumer.clone(),
                    cancel.clone(),
                )
                .instrument(span),
            );
        }
        tracker.spawn(
            watch_retired(
                store.clone(),
                settings.clone(),
                boards.clone(),
                metrics.clone(),
                clock.clone(),
                tracker.clone(),
                cancel.clone(),
            )
            .instrument(tracing::info_span!("retired_partitions")),
        );
        tracker.spawn(
            poll_groups(
                store.clone(),
                metrics.clone(),
                settings.clone(),
                cancel.clone(),
            )
            .instrument(tracing::info_span!("group_poller")),
        );
    }

    let mut scheduler = None;
    if roles.has(Role::Jobs) {
        let jobs = Arc::new(Jobs {
            token: process_token(),
            store: store.clone(),
            clock: clock.clone(),
            settings: settings.clone(),
            metrics: metrics.clone(),
            cancel: cancel.clone(),
            rolling: Mutex::new(None),
            resummarizing: Mutex::new(None),
        });
        scheduler = Some(schedule(jobs.clone(), tracker.clone()).await?);
        let tick = tick_of(jobs.clock.now());
        for job in [Job::Roll, Job::Resummarize] {
            let jobs = jobs.clone();
            tracker.spawn(
                async move { jobs.run(job, tick).await }
                    .instrument(tracing::info_span!("startup_job", ?job)),
            );
        }
    }

    cancel.cancelled().await;
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
    info!("rollboard stopped");
    Ok(())
}

/// Reports each partition's pending and lag every 5 s, and their sums.
async fn poll_groups(
    store: Arc<Store>,
    metrics: Arc<Metrics>,
    settings: Arc<Settings>,
    cancel: CancellationToken,
) {
    let ingest = &settings.ingest;
    let keys = stream::keys(ingest);
    loop {
        let (mut pending, mut lag, mut known) = (0, Some(0), false);
        for key in &keys {
            match group_info(store.client(), key, &ingest.group).await {
                Ok(Some((p, l))) => {
                    metrics.stream_group(key, p, l);
                    pending += p;
                    lag = lag.zip(l).map(|(a, b)| a + b);
                    known = true;
                }
                Ok(None) => {}
                Err(e) => metrics.redis_error(&e),
            }
        }
        if known {
            metrics.consumer(pending, lag);
        }
        for key in keys.iter().chain([&ingest.dead_letter_stream]) {
            match stream::length(store.client(), key).await {
                Ok(length) => metrics.stream_length(key, length),
                Err(e) => metrics.redis_error(&e),
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tick_is_the_nearest_second_on_the_one_clock() {
        assert_eq!(tick_of(1_700_000_005_000), 1_700_000_005_000);
        assert_eq!(tick_of(1_700_000_005_499), 1_700_000_005_000);
        assert_eq!(tick_of(1_700_000_004_500), 1_700_000_005_000);
        assert_eq!(tick_of(1_700_000_006_001), 1_700_000_006_000);
    }

    #[test]
    fn a_sidecar_pool_is_one_write_connection() {
        use crate::domain::roles::{Role, Roles};
        assert_eq!(pool_size(Roles::of(&[Role::Intake, Role::Query])), 1);
        assert_eq!(pool_size(Roles::of(&[Role::Jobs])), POOL_SIZE);
        assert_eq!(pool_size(Roles::ALL), POOL_SIZE);
    }
}
