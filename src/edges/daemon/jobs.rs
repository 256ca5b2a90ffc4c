//! The scheduled roll and resummarize jobs: one run at a time in this process, and each
//! tick run by one replica, the one that takes the tick's lease in Redis (renewed while
//! the run goes on, released at its end).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio_cron_scheduler::{Job as CronJob, JobScheduler};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn, Instrument};

use super::Shared;
use crate::config::Settings;
use crate::domain::board::{Board, Mode};
use crate::domain::clock::Clock;
use crate::domain::keys::unique_token;
use crate::metrics::Metrics;
use crate::roll::{self, Job, RollError};
use crate::store::{Lease, Store, StoreError};

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

/// A token unique to this process: host, process id and a [`unique_token`].
fn process_token() -> String {
    let host = hostname::get()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{host}:{}:{}", std::process::id(), unique_token())
}

/// Schedules both jobs on their cron expressions and runs each once now, every run on the
/// daemon's tracker; the scheduler, to stop at shutdown.
pub(super) async fn start(shared: &Shared) -> anyhow::Result<JobScheduler> {
    let jobs = Arc::new(Jobs {
        token: process_token(),
        store: shared.store.clone(),
        clock: shared.clock.clone(),
        settings: shared.settings.clone(),
        metrics: shared.metrics.clone(),
        cancel: shared.cancel.clone(),
        rolling: Mutex::new(None),
        resummarizing: Mutex::new(None),
    });
    let scheduler = schedule(jobs.clone(), shared.tracker.clone()).await?;
    let tick = tick_of(jobs.clock.now());
    for job in [Job::Roll, Job::Resummarize] {
        let jobs = jobs.clone();
        shared.tracker.spawn(
            async move { jobs.run(job, tick).await }
                .instrument(tracing::info_span!("startup_job", ?job)),
        );
    }
    Ok(scheduler)
}

/// Adds both jobs to a started scheduler; each fire runs its tick on `tracker`.
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
        if self.cancel.is_cancelled() || !Self::enter(flag, job) {
            return;
        }
        self.leased(job, tick).await;
        if let Ok(mut running) = flag.lock() {
            *running = None;
        }
    }

    /// Marks `job` running in `flag`; `false` (the run is skipped) when a run of it is
    /// still going, with a warning once that run has gone on for [`STALLED`].
    fn enter(flag: &Mutex<Option<Running>>, job: Job) -> bool {
        let Ok(mut running) = flag.lock() else {
            return false;
        };
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
            return false;
        }
        *running = Some(Running {
            since: Instant::now(),
            warned: false,
        });
        true
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
        self.hold(job, tick, &lease).await;
        match self.store.release_lease(&lease).await {
            Ok(_) => {}
            // It expires on its own within `ttl`.
            Err(e) => {
                self.metrics.redis_error(&e);
                debug!(job = name, error = %e, "cannot release the job's lease; it expires");
            }
        }
    }

    /// Runs `job` while renewing `lease`, until the run ends; the loss of the lease stops it.
    async fn hold(&self, job: Job, tick: i64, lease: &Lease) {
        let ttl = self.settings.schedule.lease;
        let name = job_name(job);
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
                    match self.store.renew_lease(lease, ttl).await {
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
    }

    /// The boards `job` covers.
    fn covered(&self, job: Job) -> impl Iterator<Item = &Board> {
        self.settings.boards.iter().filter(move |b| match job {
            Job::Roll => b.mode == Mode::Incremental,
            Job::Resummarize => b.mode == Mode::Resummarize,
            Job::All => true,
        })
    }

    /// Counts a run of `job` that could not start (no lease without Redis) as failed for
    /// each board it covers, as a run that failed on every board would be.
    fn failed(&self, job: Job, e: &StoreError) {
        for board in self.covered(job) {
            self.metrics
                .roll_failed(&board.name, board.mode.as_str(), Some(e));
        }
        warn!(job = job_name(job), error = %e, "cannot take the job's lease; the next run catches up");
    }

    /// Rolls every board `job` covers, until done or `stop` fires.
    async fn boards(&self, job: Job, stop: &CancellationToken) {
        for board in self.covered(job) {
            if self.board(board, stop).await.is_err() {
                break;
            }
        }
    }

    /// Rolls one board at Redis's clock; `Err` when `stop` fired meanwhile.
    async fn board(&self, board: &Board, stop: &CancellationToken) -> Result<(), RollError> {
        // Without a connection every command would wait for the reconnection: count the
        // run as failed now rather than hold the job (and every later run) silently.
        if !self.store.is_connected() {
            let e = Store::not_connected();
            self.metrics
                .roll_failed(&board.name, board.mode.as_str(), Some(&e));
            warn!(board = %board.name, error = %e, "roll failed; the next run catches up");
            return Ok(());
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
                return Ok(());
            }
        };
        match roll::roll_board(&self.store, board, now, self.settings.schedule.chunk, stop).await {
            Ok(report) => self.rolled(&report, started, now),
            Err(RollError::Cancelled) => return Err(RollError::Cancelled),
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
        Ok(())
    }

    /// Reports one board's roll: its figures, and what it expired.
    fn rolled(&self, report: &roll::Report, started: Instant, now: i64) {
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
}
