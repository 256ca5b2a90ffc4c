//! Checking and repairing an instance's derived state against its slices: [`verify`]
//! compares the stored ranking with the sums, [`rebuild`] recomputes and swaps it in.
//!
//! Both work on one window of a board: given its [`View`]
//! ([`Board::view`](crate::domain::board::Board::view), [`Board::views`](crate::domain::board::Board::views)),
//! they read and write only that window's instance keys. A narrower window's instance
//! holds its own slices, ranking and bookkeeping, and no idempotency key, so rebuilding it
//! leaves the widest window's instance, which keeps them, as it was.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::domain::board::{Mode, View};
use crate::roll::resummarize::{ranking_targets, replace, staged, sum_slices};
use crate::roll::RollError;
use crate::store::{StageTargets, Staged, Store, SwapCheck};

/// Most times a gen-checked recomputation is retried while ingest keeps changing it.
const MAX_ATTEMPTS: usize = 8;

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
    /// The window checked, as configured (`24h`), on a board with several windows (each
    /// window's instance is checked against its own slices); absent on a board with one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    /// `incremental` or `resummarize`.
    pub mode: &'static str,
    /// Members compared.
    pub members: u64,
    /// Every difference (incremental: drift; resummarize: how far behind the result is).
    pub differences: Vec<Drift>,
    /// Sum of the absolute differences, in minor units.
    pub amount_behind: i128,
    /// On `dense_rank` boards: each total that the stored distinct totals hold while no
    /// ranked member does, or lack while one does (a recount of the stored ranking).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dense_drift: Vec<i64>,
}

impl Verified {
    /// Whether this instance fails verification (`strict` also fails lagging resummarize).
    pub fn fails(&self, strict: bool) -> bool {
        (!self.differences.is_empty() && (strict || self.mode == Mode::Incremental.as_str()))
            || !self.dense_drift.is_empty()
    }
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
///
/// `view` is one window: a board with several is rebuilt one window at a time.
pub async fn rebuild(
    store: &Store,
    view: &View<'_>,
    scope: Option<&str>,
    chunk: usize,
) -> Result<Rebuilt, RollError> {
    let board = view.board();
    // A member repaired by an attempt whose swap was refused (the repair itself moves
    // `gen`) is known to `members` at the next attempt: it counts as estimated all the same.
    let mut estimated_all: Vec<String> = Vec::new();
    for _ in 0..MAX_ATTEMPTS {
        let (watermark, gen) = store.meta(view, scope).await?;
        let every = staged(
            board,
            sum_slices(store, view, scope, None, chunk).await?,
            true,
        )?;
        let before: BTreeMap<String, i64> = store
            .result_entries(view, scope)
            .await?
            .into_iter()
            .collect();
        let (swapped, estimated, ranked) = match board.mode {
            Mode::Incremental => swap_every(store, view, scope, &every, &gen, chunk).await?,
            Mode::Resummarize => {
                swap_live(store, view, scope, &every, (watermark, &gen), chunk).await?
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

/// Whether a rebuild's swap landed, the members it restored, and the ranking it swapped
/// in (member -> total).
type Swapped = (bool, Vec<String>, BTreeMap<String, i64>);

/// The rebuild of an incremental instance: every registered slice, summed, becomes the
/// ranking, unless `gen` moved since it was read.
async fn swap_every(
    store: &Store,
    view: &View<'_>,
    scope: Option<&str>,
    every: &[Staged],
    gen: &str,
    chunk: usize,
) -> Result<Swapped, RollError> {
    let board = view.board();
    let targets = StageTargets {
        result: true,
        refs: board.allow_negative,
        ..StageTargets::default()
    };
    let check = SwapCheck {
        gen: Some(gen),
        ..SwapCheck::default()
    };
    let (swapped, estimated) =
        replace(store, view, scope, &[(targets, every)], chunk, check).await?;
    Ok((swapped, estimated, totals(every, false)))
}

/// The rebuild of a resummarize instance: every registered slice becomes the `totals`
/// bookkeeping and the live slices (above the watermark read with `gen`) the ranking.
async fn swap_live(
    store: &Store,
    view: &View<'_>,
    scope: Option<&str>,
    every: &[Staged],
    (watermark, gen): (Option<i64>, &str),
    chunk: usize,
) -> Result<Swapped, RollError> {
    let board = view.board();
    let live = staged(
        board,
        sum_slices(store, view, scope, watermark, chunk).await?,
        true,
    )?;
    let bookkeeping = StageTargets {
        refs: board.allow_negative,
        totals: true,
        ..StageTargets::default()
    };
    // The swap records `gen` as the sum's (it is current when the check passes), so a run
    // that summed before it is refused; no run time is recorded, so the next resummarize
    // run sums again all the same.
    let check = SwapCheck {
        gen: Some(gen),
        watermark,
        summed_at: None,
    };
    let parts = [(bookkeeping, every), (ranking_targets(), live.as_slice())];
    let (swapped, estimated) = replace(store, view, scope, &parts, chunk, check).await?;
    Ok((swapped, estimated, totals(&live, true)))
}

/// Member -> total of `rows` (with `positive`, only positive totals: what a ranking holds).
fn totals(rows: &[Staged], positive: bool) -> BTreeMap<String, i64> {
    rows.iter()
        .filter(|r| !positive || r.total > 0)
        .map(|r| (r.member.clone(), r.total))
        .collect()
}

/// Compares an instance's stored ranking with its slices: on incremental boards with the
/// sum of every registered slice (fields of dead slices count until their chunk is
/// expired), on resummarize boards with the sum of the live slices, in the window `view`,
/// whose instance is compared with its own slices.
pub async fn verify(
    store: &Store,
    view: &View<'_>,
    scope: Option<&str>,
    chunk: usize,
) -> Result<Verified, RollError> {
    let board = view.board();
    for attempt in 0..MAX_ATTEMPTS {
        let (watermark, gen) = store.meta(view, scope).await?;
        let above = match board.mode {
            Mode::Incremental => None,
            Mode::Resummarize => watermark,
        };
        let sums = staged(
            board,
            sum_slices(store, view, scope, above, chunk).await?,
            false,
        )?;
        let stored: BTreeMap<String, i64> = store
            .result_entries(view, scope)
            .await?
            .into_iter()
            .collect();
        let distinct = if board.dense_rank {
            store.dense_entries(view, scope).await?
        } else {
            Vec::new()
        };
        if store.meta(view, scope).await?.1 != gen && board.mode == Mode::Incremental {
            continue;
        }
        let dense_drift = if board.dense_rank {
            let held: BTreeSet<i64> = stored.values().copied().filter(|t| *t > 0).collect();
            let kept: BTreeSet<i64> = distinct.into_iter().collect();
            let drift: Vec<i64> = held.symmetric_difference(&kept).copied().collect();
            // A resummarize swap between the two reads above moves both keys at once:
            // read them again rather than report a difference that never was.
            if !drift.is_empty() && attempt + 1 < MAX_ATTEMPTS {
                continue;
            }
            drift
        } else {
            Vec::new()
        };
        let expected = totals(&sums, board.mode == Mode::Resummarize);
        let names = expected
            .keys()
            .chain(stored.keys())
            .collect::<BTreeSet<_>>()
            .len();
        let (differences, amount_behind) = drift(&expected, &stored);
        return Ok(Verified {
            board: board.name.clone(),
            scope: scope.map(str::to_string),
            window: board
                .has_several_windows()
                .then(|| view.window_name().to_string()),
            mode: board.mode.as_str(),
            members: names as u64,
            differences,
            amount_behind,
            dense_drift,
        });
    }
    Err(RollError::Busy(board.name.clone()))
}

/// Every member whose total differs between `expected` and `stored`, and the sum of the
/// absolute differences.
fn drift(expected: &BTreeMap<String, i64>, stored: &BTreeMap<String, i64>) -> (Vec<Drift>, i128) {
    let mut differences = Vec::new();
    let mut amount: i128 = 0;
    let names: BTreeSet<&String> = expected.keys().chain(stored.keys()).collect();
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
