//! Keeping the window rolling (docs/design.md, *Writes*): incremental expiry, resummarize,
//! rebuild and verify. Every function takes `now` as a parameter.
//!
//! * `expire.rs`: one instance rolled: watermark raised, dead slices expired, due
//!   idempotency keys forgotten ([`InstanceRoll`]).
//! * `resummarize.rs`: the live slices summed again and swapped in whole ([`resummarize`]).
//! * `verify.rs`: an instance's ranking compared with its slices ([`verify`]), or rebuilt
//!   from them ([`rebuild`]).
//!
//! This file holds the jobs: [`run_once`] over the boards, [`roll_board`] over the
//! instances of one board.

mod expire;
mod resummarize;
mod verify;

pub use expire::InstanceRoll;
pub use resummarize::resummarize;
pub use verify::{rebuild, verify, Drift, Rebuilt, Verified};

use std::collections::BTreeMap;

use futures_util::StreamExt;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::domain::board::{Board, Calendar, Mode, View};
use crate::metrics::Rolled;
use crate::store::{Store, StoreError};

/// Instances of one scoped board rolled concurrently.
const INSTANCES_AT_ONCE: usize = 8;

/// Why a job stopped.
#[derive(Debug, thiserror::Error)]
pub enum RollError {
    /// Redis failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Shutdown was requested between two chunks.
    #[error("cancelled")]
    Cancelled,
    /// The slices of a member add up to more than 2^53 - 1.
    #[error("board {board}: the live total of {member:?} is beyond 2^53-1")]
    Range {
        /// Board name.
        board: String,
        /// The member.
        member: String,
    },
    /// Ingest changed the instance during every attempt of a recomputation.
    #[error("board {0}: the instance kept changing; try again with less ingest")]
    Busy(String),
}

/// What one job did for one board.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Board name.
    pub board: String,
    /// `incremental` or `resummarize`.
    pub mode: &'static str,
    /// Instances visited.
    pub instances: u64,
    /// Slices expired and unregistered.
    pub slices_expired: u64,
    /// Slice fields subtracted and deleted.
    pub fields_expired: u64,
    /// Members that left an instance.
    pub members_removed: u64,
    /// Idempotency keys forgotten.
    pub ids_forgotten: u64,
    /// Scopes dropped from the registry because their instance emptied.
    pub scopes_removed: u64,
    /// Closed periods deleted beyond `keep_periods` (period boards).
    pub periods_removed: u64,
    /// Resummarize instances whose live slices were summed again (the others had not
    /// changed since their ranking was summed, and kept it).
    pub resummed: u64,
    /// Instances whose roll failed (retried at the next run).
    pub instances_failed: u64,
    /// The first failure, for the operator.
    pub first_error: Option<String>,
    /// Failed instances per Redis error kind (`connection`, `timeout`, `script`, `other`).
    pub redis_errors: BTreeMap<&'static str, u64>,
    /// The board's watermark after the run: for a scoped board its own (the floor of every
    /// instance's), for an unscoped one that of its instance.
    pub expired_through: Option<i64>,
    /// Start of the live range after the run (epoch ms), as `window_from` in queries.
    pub window_from: Option<i64>,
    /// End (exclusive) of the live range after the run (epoch ms), as `window_to`.
    pub window_to: Option<i64>,
}

impl Report {
    /// Whether every instance was rolled.
    pub fn complete(&self) -> bool {
        self.instances_failed == 0
    }

    /// Adds the work counted in `part` (instances, slices, fields, members, ids, scopes,
    /// runs) to this report's.
    fn add_work(&mut self, part: &Report) {
        self.instances += part.instances;
        self.slices_expired += part.slices_expired;
        self.fields_expired += part.fields_expired;
        self.members_removed += part.members_removed;
        self.ids_forgotten += part.ids_forgotten;
        self.scopes_removed += part.scopes_removed;
        self.resummed += part.resummed;
    }

    /// Adds what rolling the instance `scope` of `board` did; a failure is logged and
    /// counted, and only cancellation is passed on (it stops the whole board).
    fn add_instance(
        &mut self,
        board: &Board,
        scope: Option<String>,
        outcome: Result<Report, RollError>,
    ) -> Result<(), RollError> {
        match outcome {
            Ok(part) => {
                self.add_work(&part);
                if !board.has_many_instances() {
                    self.expired_through = self.expired_through.max(part.expired_through);
                }
            }
            Err(RollError::Cancelled) => return Err(RollError::Cancelled),
            Err(e) => {
                warn!(board = %board.name, scope = ?scope, error = %e, "instance not rolled; the next run retries it");
                self.instances_failed += 1;
                self.first_error.get_or_insert_with(|| e.to_string());
                if let RollError::Store(e) = &e {
                    *self.redis_errors.entry(e.kind()).or_default() += 1;
                }
            }
        }
        Ok(())
    }

    /// The run in the plain numbers the metrics take.
    pub fn figures(&self) -> Rolled<'_> {
        Rolled {
            board: &self.board,
            mode: self.mode,
            slices_expired: self.slices_expired,
            members_removed: self.members_removed,
            resummed: self.resummed,
            complete: self.complete(),
            redis_errors: &self.redis_errors,
            window: self.window_from.zip(self.window_to),
        }
    }
}

/// Which boards a job covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Job {
    /// Incremental boards (the roll job).
    Roll,
    /// Resummarize boards (the resummarize job).
    Resummarize,
    /// Both (`rollboard roll`).
    All,
}

impl Job {
    fn covers(self, board: &Board) -> bool {
        match self {
            Job::Roll => board.mode == Mode::Incremental,
            Job::Resummarize => board.mode == Mode::Resummarize,
            Job::All => true,
        }
    }
}

/// The instances of a board: its scopes (or shards) registered, or the one unscoped
/// instance; on a period board every registered instance (one per period, and per scope).
pub async fn instances(store: &Store, board: &Board) -> Result<Vec<Option<String>>, StoreError> {
    if board.has_many_instances() || board.period.is_some() {
        Ok(store.scopes(board).await?.into_iter().map(Some).collect())
    } else {
        Ok(vec![None])
    }
}

/// Runs `job` once at `now` for every covered board (or only `only`).
pub async fn run_once(
    store: &Store,
    boards: &[Board],
    job: Job,
    only: Option<&str>,
    now: i64,
    chunk: usize,
    cancel: &CancellationToken,
) -> Result<Vec<Report>, RollError> {
    let mut reports = Vec::new();
    for board in boards
        .iter()
        .filter(|b| job.covers(b) && only.is_none_or(|o| o == b.name))
    {
        reports.push(roll_board(store, board, now, chunk, cancel).await?);
    }
    Ok(reports)
}

/// The roll of a period board at `now`: nothing expires (a period is closed by the
/// clock, its archive read-only once its grace has passed); the archives beyond
/// `keep_periods` are deleted.
pub async fn roll_periods(
    store: &Store,
    board: &Board,
    calendar: &Calendar,
    now: i64,
) -> Result<Report, RollError> {
    let current = calendar.span_at(now);
    let mut report = Report {
        board: board.name.clone(),
        mode: board.mode.as_str(),
        window_from: Some(current.start_ms),
        window_to: Some(current.end_ms),
        ..Report::default()
    };
    match store.forget_periods(board, calendar, now).await {
        Ok(forgotten) => {
            report.instances = forgotten.instances;
            report.periods_removed = forgotten.periods.len() as u64;
        }
        // Like a failed instance: counted, and the next run deletes what is left.
        Err(e) => {
            warn!(board = %board.name, error = %e, "closed periods not deleted; the next run retries");
            report.instances_failed = 1;
            report.first_error = Some(e.to_string());
            *report.redis_errors.entry(e.kind()).or_default() += 1;
        }
    }
    Ok(report)
}

/// Rolls every instance of one board at `now`, a few instances at a time (a period board:
/// [`roll_periods`]). An instance
/// that fails is logged and counted in [`Report::instances_failed`] without stopping the
/// others; only cancellation stops the whole board.
///
/// The board's own watermark is raised first, to `slice_of(now) - N` or more: it holds
/// for instances that are not in the scope registry (any more), and every instance
/// rolled here is brought up to it.
pub async fn roll_board(
    store: &Store,
    board: &Board,
    now: i64,
    chunk: usize,
    cancel: &CancellationToken,
) -> Result<Report, RollError> {
    if let Some(calendar) = &board.period {
        return roll_periods(store, board, calendar, now).await;
    }
    if !board.has_several_windows() {
        return roll_window(store, &board.widest(), now, chunk, cancel).await;
    }
    // A roll at a later time (a forced `roll --at`) that stopped after the narrower
    // windows left the board's last roll ahead of `now`. Applies judge every window at
    // that time already (an event older than it allows is late in the widest window
    // too), so every window rolls at it at least: the widest then lets go of what it
    // would no longer take, as the stopped roll would have.
    let now = store
        .board_last_roll(board)
        .await?
        .map_or(now, |rolled| now.max(rolled));
    // Narrowest first: the widest, whose instances hold the idempotency keys and leave
    // the scope registry when empty, last. The report is the widest's, with every
    // window's work added.
    let mut report = Report::default();
    for view in board.views() {
        let part = roll_window(store, &view, now, chunk, cancel).await?;
        report.add_work(&part);
        report.instances_failed += part.instances_failed;
        if report.first_error.is_none() {
            report.first_error = part.first_error;
        }
        for (kind, n) in part.redis_errors {
            *report.redis_errors.entry(kind).or_default() += n;
        }
        (report.board, report.mode) = (part.board, part.mode);
        report.expired_through = part.expired_through;
        (report.window_from, report.window_to) = (part.window_from, part.window_to);
    }
    Ok(report)
}

/// [`roll_board`] for one window of the board.
async fn roll_window(
    store: &Store,
    view: &View<'_>,
    now: i64,
    chunk: usize,
    cancel: &CancellationToken,
) -> Result<Report, RollError> {
    let board = view.board();
    let target = store
        .raise_board_watermark(view, board.slice_of(now) - view.slices_in_window(), now)
        .await?;
    let outcomes: Vec<(Option<String>, Result<Report, RollError>)> =
        futures_util::stream::iter(instances(store, board).await?)
            .map(|scope| async move {
                let mut part = Report::default();
                let instance = InstanceRoll {
                    store,
                    view,
                    scope: scope.as_deref(),
                    now,
                    chunk,
                    cancel,
                };
                let outcome = instance.roll(target, &mut part).await;
                (scope, outcome.map(|()| part))
            })
            .buffer_unordered(INSTANCES_AT_ONCE)
            .collect()
            .await;
    let mut report = Report {
        board: board.name.clone(),
        mode: board.mode.as_str(),
        expired_through: Some(target),
        ..Report::default()
    };
    for (scope, outcome) in outcomes {
        report.add_instance(board, scope, outcome)?;
    }
    if let Some(w) = report.expired_through {
        let (from, to) = view.live_range(now, Some(w));
        (report.window_from, report.window_to) = (Some(from), Some(to));
    }
    Ok(report)
}
