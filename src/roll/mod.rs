//! Keeping the window rolling (docs/design.md, *Writes*): incremental expiry, resummarize,
//! rebuild and verify. Every function takes `now` as a parameter.
//!
//! Expiry is exactly-once by construction: the watermark is raised before a slice is
//! touched (so no event can land in it), the worker only *lists* field names with HSCAN,
//! and each chunk script reads, subtracts and deletes those fields atomically, skipping
//! any that a concurrent or crashed roller already handled.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::StreamExt;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::domain::board::{Board, Mode, MAX_TOTAL};
use crate::metrics::Rolled;
use crate::store::{
    StageTargets, Staged, Store, StoreError, SwapCheck, EXPIRE_CALL_FIELDS, STAGE_CALL_ROWS,
    TRIM_CALL_IDS, TRIM_CALL_LOG,
};

/// Most times a gen-checked recomputation is retried while ingest keeps changing it.
const MAX_ATTEMPTS: usize = 8;
/// Instances of one scoped board rolled concurrently.
const INSTANCES_AT_ONCE: usize = 8;
/// Expiry calls of one instance in flight at once: Redis runs the next while the worker
/// reads a reply, yet other clients' commands still get in between two bounded calls.
const EXPIRE_CALLS_IN_FLIGHT: usize = 2;

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

/// The instances of a board: its scopes, or the one unscoped instance.
pub async fn instances(store: &Store, board: &Board) -> Result<Vec<Option<String>>, StoreError> {
    if board.is_scoped() {
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

/// Rolls every instance of one board at `now`, a few instances at a time. An instance
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
    let target = store
        .raise_floor(board, board.slice_of(now) - board.slices_in_window(), now)
        .await?;
    let outcomes: Vec<(Option<String>, Result<Report, RollError>)> =
        futures_util::stream::iter(instances(store, board).await?)
            .map(|scope| async move {
                let mut part = Report::default();
                let outcome = roll_instance(
                    store,
                    board,
                    scope.as_deref(),
                    now,
                    target,
                    chunk,
                    cancel,
                    &mut part,
                )
                .await;
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
        match outcome {
            Ok(part) => {
                report.instances += part.instances;
                report.slices_expired += part.slices_expired;
                report.fields_expired += part.fields_expired;
                report.members_removed += part.members_removed;
                report.ids_forgotten += part.ids_forgotten;
                report.scopes_removed += part.scopes_removed;
                report.resummed += part.resummed;
                if !board.is_scoped() {
                    report.expired_through = report.expired_through.max(part.expired_through);
                }
            }
            Err(RollError::Cancelled) => return Err(RollError::Cancelled),
            Err(e) => {
                warn!(board = %board.name, scope = ?scope, error = %e, "instance not rolled; the next run retries it");
                report.instances_failed += 1;
                report.first_error.get_or_insert_with(|| e.to_string());
                if let RollError::Store(e) = &e {
                    *report.redis_errors.entry(e.kind()).or_default() += 1;
                }
            }
        }
    }
    if let Some(w) = report.expired_through {
        let (from, to) = board.live_range(now, Some(w));
        (report.window_from, report.window_to) = (Some(from), Some(to));
    }
    Ok(report)
}

/// Rolls one instance: raise the watermark to at least `target` (the board's watermark
/// after [`Store::raise_floor`] at `now`), expire every dead slice in chunks (oldest
/// first, catching up on any missed run), forget due idempotency keys, and for
/// resummarize boards rebuild the ranking from the live slices.
#[allow(clippy::too_many_arguments)]
pub async fn roll_instance(
    store: &Store,
    board: &Board,
    scope: Option<&str>,
    now: i64,
    target: i64,
    chunk: usize,
    cancel: &CancellationToken,
    report: &mut Report,
) -> Result<(), RollError> {
    report.instances += 1;
    let (watermark, dead) = store.raise_watermark(board, scope, target, now).await?;
    report.expired_through = Some(watermark);
    for n in dead {
        expire_slice(store, board, scope, n, now, chunk, cancel, report).await?;
    }
    forget_seen(store, board, scope, now, chunk, cancel, report).await?;
    if board.mode == Mode::Resummarize
        && resummarize(store, board, scope, watermark, now, chunk).await?
    {
        report.resummed += 1;
    }
    if let Some(scope) = scope {
        if store.cleanup(board, Some(scope)).await?
            && store.unregister_scope(board, scope, watermark).await?
        {
            report.scopes_removed += 1;
        }
    }
    Ok(())
}

/// Forgets the idempotency keys of every registered slice whose ids may be forgotten at
/// `now`, draining each slice's forget log in bounded calls, and the legacy raw ids that
/// are due. (A dead slice's log is drained by [`expire_slice`] before it drops the slice.)
async fn forget_seen(
    store: &Store,
    board: &Board,
    scope: Option<&str>,
    now: i64,
    chunk: usize,
    cancel: &CancellationToken,
    report: &mut Report,
) -> Result<(), RollError> {
    let per_call = chunk.clamp(1, TRIM_CALL_IDS);
    let mut due = store
        .forgettable_slices(board, scope, now)
        .await?
        .into_iter();
    let mut slice = due.next();
    loop {
        let trimmed = store.trim_seen(board, scope, slice, now, per_call).await?;
        report.ids_forgotten += trimmed.legacy + trimmed.digests;
        if trimmed.taken < TRIM_CALL_LOG as u64 {
            slice = due.next();
        }
        if slice.is_none() && trimmed.legacy < per_call as u64 {
            return Ok(());
        }
        if cancel.is_cancelled() {
            return Err(RollError::Cancelled);
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn expire_slice(
    store: &Store,
    board: &Board,
    scope: Option<&str>,
    n: i64,
    now: i64,
    chunk: usize,
    cancel: &CancellationToken,
    report: &mut Report,
) -> Result<(), RollError> {
    let key = store.instance(board, scope).slice(n);
    // One full HSCAN pass returns every field present for its whole duration, and no field
    // can be added (the watermark is above n), so a pass normally empties the slice; the
    // outer loop only repeats when a concurrent roller raced us on the same fields.
    loop {
        let mut cursor = "0".to_string();
        loop {
            if cancel.is_cancelled() {
                return Err(RollError::Cancelled);
            }
            let (next, page) = store.scan("HSCAN", &key, &cursor, chunk).await?;
            let names: Vec<String> = page.into_iter().map(|(member, _)| member).collect();
            expire_fields(
                store,
                board,
                scope,
                n,
                &names,
                EXPIRE_CALL_FIELDS,
                cancel,
                report,
            )
            .await?;
            if next == "0" {
                break;
            }
            cursor = next;
        }
        // The slice's idempotency keys go before its registration: the forget log is
        // found through the registry.
        let per_call = chunk.clamp(1, TRIM_CALL_IDS);
        loop {
            let trimmed = store
                .trim_seen(board, scope, Some(n), now, per_call)
                .await?;
            report.ids_forgotten += trimmed.legacy + trimmed.digests;
            if trimmed.taken < TRIM_CALL_LOG as u64 {
                break;
            }
            if cancel.is_cancelled() {
                return Err(RollError::Cancelled);
            }
        }
        if store.drop_slice(board, scope, n).await? {
            report.slices_expired += 1;
            return Ok(());
        }
    }
}

/// Expires the fields `names` of dead slice `n` in script calls of at most `per_call`
/// fields each, a few in flight at once. Each call claims its fields atomically, so the
/// order of the calls does not matter and a stop between two of them (cancellation, a
/// crash, a failed call) leaves every field either expired once or still in the slice for
/// the next roll.
#[allow(clippy::too_many_arguments)]
pub async fn expire_fields(
    store: &Store,
    board: &Board,
    scope: Option<&str>,
    n: i64,
    names: &[String],
    per_call: usize,
    cancel: &CancellationToken,
    report: &mut Report,
) -> Result<(), RollError> {
    // Collected first: a lazily mapped stream of borrowing futures is not provably `Send`
    // to the spawned job that awaits it.
    let calls: Vec<_> = names
        .chunks(per_call.max(1))
        .map(|part| async move {
            if cancel.is_cancelled() {
                return Err(RollError::Cancelled);
            }
            Ok(store.expire_chunk(board, scope, n, part).await?)
        })
        .collect();
    let mut calls = futures_util::stream::iter(calls).buffered(EXPIRE_CALLS_IN_FLIGHT);
    while let Some(done) = calls.next().await {
        let done = done?;
        report.fields_expired += done.fields;
        report.members_removed += done.members_removed;
    }
    Ok(())
}

/// Per member: exact total, number of slices holding it, newest slice holding it.
type Sums = BTreeMap<String, (i128, i64, i64)>;

/// Sums the registered slices above `above` (all of them for `None`) in the worker,
/// paging with HSCAN.
///
/// HSCAN may return a field more than once: when a hash shrinks between two pages, Redis
/// rehashes it and the pages after that repeat fields of buckets already read. A slice
/// shrinks under a sum when another replica, whose roll raised the watermark to it,
/// expires it meanwhile. A field is one member's amount in one slice, so each field of a
/// slice counts once, at the last value read.
async fn sum_slices(
    store: &Store,
    board: &Board,
    scope: Option<&str>,
    watermark: Option<i64>,
    chunk: usize,
) -> Result<Sums, StoreError> {
    let k = store.instance(board, scope);
    let mut sums = Sums::new();
    for n in store
        .live_slices(board, scope, watermark.unwrap_or(i64::MIN))
        .await?
    {
        let key = k.slice(n);
        let mut fields: HashMap<String, i64> = HashMap::new();
        let mut cursor = "0".to_string();
        loop {
            let (next, page) = store.scan("HSCAN", &key, &cursor, chunk).await?;
            for (member, value) in page {
                let amount: i64 = value.parse().map_err(|_| {
                    StoreError::Reply(format!("{key} holds {value:?} for {member:?}"))
                })?;
                fields.insert(member, amount);
            }
            if next == "0" {
                break;
            }
            cursor = next;
        }
        for (member, amount) in fields {
            let slot = sums.entry(member).or_insert((0, 0, n));
            slot.0 += i128::from(amount);
            slot.1 += 1;
            slot.2 = slot.2.max(n);
        }
    }
    Ok(sums)
}

/// The rows to stage. With `repair`, a member that `members` has lost is given the last
/// millisecond of its newest slice as its tie-break time (the exact time is not kept), at
/// most 2^53 - 1, the latest time an event can have: the slice holding that time ends
/// after it, and a later time is one no script accepts back.
fn staged(board: &Board, sums: Sums, repair: bool) -> Result<Vec<Staged>, RollError> {
    sums.into_iter()
        .map(|(member, (total, slices, newest))| {
            if total.abs() > i128::from(MAX_TOTAL) {
                return Err(RollError::Range {
                    board: board.name.clone(),
                    member,
                });
            }
            Ok(Staged {
                member,
                total: total as i64,
                slices,
                fallback_ts: repair.then(|| ((newest + 1) * board.slice_ms - 1).min(MAX_TOTAL)),
            })
        })
        .collect()
}

fn token() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "{:x}{:x}{:x}",
        nanos,
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Writes each part's rows into the scratch keys of one run and swaps them all in at
/// once; false when the swap was refused (see [`SwapCheck`]). Also returns the members
/// whose lost `members` entry was restored (see [`Staged::fallback_ts`]).
async fn replace(
    store: &Store,
    board: &Board,
    scope: Option<&str>,
    parts: &[(StageTargets, &[Staged])],
    chunk: usize,
    check: SwapCheck<'_>,
) -> Result<(bool, Vec<String>), StoreError> {
    let token = token();
    let mut all = StageTargets::default();
    let mut repaired = Vec::new();
    let outcome = async {
        for (targets, rows) in parts {
            all.result |= targets.result;
            all.ranked |= targets.ranked;
            all.refs |= targets.refs;
            all.totals |= targets.totals;
            // At least one call per part, so that the run's marker exists even when empty.
            store.stage(board, scope, &token, *targets, &[]).await?;
            for part in rows.chunks(chunk.clamp(1, STAGE_CALL_ROWS)) {
                repaired.extend(store.stage(board, scope, &token, *targets, part).await?.1);
            }
        }
        store.swap(board, scope, &token, all, check).await
    }
    .await;
    if !matches!(outcome, Ok(true)) {
        store.discard(board, scope, &token).await?;
    }
    repaired.sort();
    repaired.dedup();
    Ok((outcome?, repaired))
}

/// Re-sums the live slices into a new ranking and renames it over the result: readers
/// see the old or the new ranking, never a half. Leaves an instance that no apply or
/// expiry has changed since its ranking was summed (above the same watermark) as it is;
/// true when it summed.
pub async fn resummarize(
    store: &Store,
    board: &Board,
    scope: Option<&str>,
    watermark: i64,
    now: i64,
    chunk: usize,
) -> Result<bool, RollError> {
    // Read before the slices: a change after this read moves `gen` past what the swap
    // records, so the next run sums again.
    let summed = store.summed(board, scope).await?;
    if summed.unchanged(watermark, now) {
        return Ok(false);
    }
    let rows = staged(
        board,
        sum_slices(store, board, scope, Some(watermark), chunk).await?,
        false,
    )?;
    let targets = StageTargets {
        result: true,
        ranked: true,
        positive_only: true,
        ..StageTargets::default()
    };
    let check = SwapCheck {
        watermark: Some(watermark),
        summed_at: Some((&summed.gen, now)),
        ..SwapCheck::default()
    };
    let (swapped, _) = replace(store, board, scope, &[(targets, &rows)], chunk, check).await?;
    if !swapped {
        // Only a newer run's sum (a higher watermark, or the same one read later: another
        // replica's run), a sum over slices that a raised watermark made dead meanwhile, or
        // a resent swap is refused.
        debug!(board = %board.name, scope = ?scope, watermark,
               "recomputed ranking not swapped in: a newer one already was");
    }
    Ok(true)
}

/// Recomputes an instance's derived state from its slices and the tie-break times in
/// `members`: on incremental boards the ranking holds every slice field not yet expired
/// (a roll cancelled between chunks leaves a dead slice partly subtracted, and the next
/// roll finishes it), so it is the sum of every registered slice; on resummarize boards the
/// ranking is the sum of the live slices and the `totals` bookkeeping that of every slice.
/// Retries while ingest changes the instance underneath.
///
/// A member that holds slice data but has lost its `members` entry (the source of its
/// tie-break time) is restored with the last millisecond of its newest slice as that
/// time, and listed in [`Rebuilt::estimated`]: its total is exact, its place among equal
/// totals may not be.
pub async fn rebuild(
    store: &Store,
    board: &Board,
    scope: Option<&str>,
    chunk: usize,
) -> Result<Rebuilt, RollError> {
    // A member repaired by an attempt whose swap was refused (the repair itself moves
    // `gen`) is known to `members` at the next attempt: it counts as estimated all the same.
    let mut estimated_all: Vec<String> = Vec::new();
    for _ in 0..MAX_ATTEMPTS {
        let (watermark, gen) = store.meta(board, scope).await?;
        let every = staged(
            board,
            sum_slices(store, board, scope, None, chunk).await?,
            true,
        )?;
        let before: BTreeMap<String, i64> = store
            .result_entries(board, scope)
            .await?
            .into_iter()
            .collect();
        let expected = |rows: &[Staged], positive: bool| -> BTreeMap<String, i64> {
            rows.iter()
                .filter(|r| !positive || r.total > 0)
                .map(|r| (r.member.clone(), r.total))
                .collect()
        };
        let mut ranked = expected(&every, false);
        let (swapped, estimated) = match board.mode {
            Mode::Incremental => {
                let targets = StageTargets {
                    result: true,
                    refs: board.allow_negative,
                    ..StageTargets::default()
                };
                let check = SwapCheck {
                    gen: Some(&gen),
                    ..SwapCheck::default()
                };
                replace(store, board, scope, &[(targets, &every)], chunk, check).await?
            }
            Mode::Resummarize => {
                let live = staged(
                    board,
                    sum_slices(store, board, scope, watermark, chunk).await?,
                    true,
                )?;
                let bookkeeping = StageTargets {
                    refs: board.allow_negative,
                    totals: true,
                    ..StageTargets::default()
                };
                let ranking = StageTargets {
                    result: true,
                    ranked: true,
                    positive_only: true,
                    ..StageTargets::default()
                };
                // The swap records `gen` as the sum's (it is current when the check
                // passes), so a run that summed before it is refused; no run time is
                // recorded, so the next resummarize run sums again all the same.
                let check = SwapCheck {
                    gen: Some(&gen),
                    watermark,
                    summed_at: None,
                };
                ranked = expected(&live, true);
                let parts = [(bookkeeping, every.as_slice()), (ranking, live.as_slice())];
                replace(store, board, scope, &parts, chunk, check).await?
            }
        };
        estimated_all.extend(estimated);
        if swapped {
            estimated_all.sort();
            estimated_all.dedup();
            let (changed, _) = drift(&ranked, &before);
            return Ok(Rebuilt {
                members: every.len() as u64,
                changed: changed.len() as u64,
                estimated: estimated_all,
            });
        }
    }
    Err(RollError::Busy(board.name.clone()))
}

/// What a rebuild of one instance did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Rebuilt {
    /// Members with slice data (all now ranked by their exact totals).
    pub members: u64,
    /// Members whose stored total the rebuild changed (added, removed or corrected).
    pub changed: u64,
    /// Members whose tie-break time was lost and is now estimated (see [`rebuild`]).
    pub estimated: Vec<String>,
}

/// One member whose stored total differs from its slices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Drift {
    /// The member.
    pub member: String,
    /// Total over the live slices (null: in no live slice).
    pub expected: Option<i64>,
    /// Total in the stored ranking (null: not stored).
    pub stored: Option<i64>,
}

/// The outcome of verifying one instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verified {
    /// Board name.
    pub board: String,
    /// Scope value.
    pub scope: Option<String>,
    /// `incremental` or `resummarize`.
    pub mode: &'static str,
    /// Members compared.
    pub members: u64,
    /// Every difference (incremental: drift; resummarize: how far behind the result is).
    pub differences: Vec<Drift>,
    /// Sum of the absolute differences, in minor units.
    pub amount_behind: i128,
}

impl Verified {
    /// Whether this instance fails verification (`strict` also fails lagging resummarize).
    pub fn fails(&self, strict: bool) -> bool {
        !self.differences.is_empty() && (strict || self.mode == Mode::Incremental.as_str())
    }
}

/// Compares an instance's stored ranking with its slices: on incremental boards with the
/// sum of every registered slice (fields of dead slices count until their chunk is
/// expired), on resummarize boards with the sum of the live slices.
pub async fn verify(
    store: &Store,
    board: &Board,
    scope: Option<&str>,
    chunk: usize,
) -> Result<Verified, RollError> {
    for _ in 0..MAX_ATTEMPTS {
        let (watermark, gen) = store.meta(board, scope).await?;
        let above = match board.mode {
            Mode::Incremental => None,
            Mode::Resummarize => watermark,
        };
        let sums = staged(
            board,
            sum_slices(store, board, scope, above, chunk).await?,
            false,
        )?;
        let stored: BTreeMap<String, i64> = store
            .result_entries(board, scope)
            .await?
            .into_iter()
            .collect();
        if store.meta(board, scope).await?.1 != gen && board.mode == Mode::Incremental {
            continue;
        }
        let mut expected: BTreeMap<String, i64> =
            sums.into_iter().map(|s| (s.member, s.total)).collect();
        if board.mode == Mode::Resummarize {
            expected.retain(|_, t| *t > 0);
        }
        let names = expected
            .keys()
            .chain(stored.keys())
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        let (differences, amount_behind) = drift(&expected, &stored);
        return Ok(Verified {
            board: board.name.clone(),
            scope: scope.map(str::to_string),
            mode: board.mode.as_str(),
            members: names as u64,
            differences,
            amount_behind,
        });
    }
    Err(RollError::Busy(board.name.clone()))
}

/// Every member whose total differs between `expected` and `stored`, and the sum of the
/// absolute differences.
fn drift(expected: &BTreeMap<String, i64>, stored: &BTreeMap<String, i64>) -> (Vec<Drift>, i128) {
    let mut differences = Vec::new();
    let mut amount: i128 = 0;
    let names: std::collections::BTreeSet<&String> = expected.keys().chain(stored.keys()).collect();
    for member in names {
        let (e, s) = (expected.get(member).copied(), stored.get(member).copied());
        if e != s {
            amount += (i128::from(e.unwrap_or(0)) - i128::from(s.unwrap_or(0))).abs();
            differences.push(Drift {
                member: member.clone(),
                expected: e,
                stored: s,
            });
        }
    }
    (differences, amount)
}
