//! Resummarize boards: the ranking is the sum of the live slices, summed again in the
//! worker and swapped in whole. Also the pieces rebuild and verify share: summing the
//! slices ([`sum_slices`]), the rows to stage ([`staged`]) and staging and swapping them
//! ([`replace`]).

use std::collections::{BTreeMap, HashMap};

use tracing::debug;

use crate::domain::board::{Board, View, MAX_TOTAL};
use crate::domain::keys::unique_token;
use crate::roll::RollError;
use crate::store::{StageTargets, Staged, Store, StoreError, SwapCheck, STAGE_CALL_ROWS};

/// Per member: exact total, number of slices holding it, newest slice holding it.
pub(crate) type Sums = BTreeMap<String, (i128, i64, i64)>;

/// Sums the registered slices above `above` (all of them for `None`) in the worker,
/// paging with HSCAN.
///
/// HSCAN may return a field more than once: when a hash shrinks between two pages, Redis
/// rehashes it and the pages after that repeat fields of buckets already read. A slice
/// shrinks under a sum when another replica, whose roll raised the watermark to it,
/// expires it meanwhile. A field is one member's amount in one slice, so each field of a
/// slice counts once, at the last value read.
pub(crate) async fn sum_slices(
    store: &Store,
    view: &View<'_>,
    scope: Option<&str>,
    watermark: Option<i64>,
    chunk: usize,
) -> Result<Sums, StoreError> {
    let k = store.instance(view, scope);
    let mut sums = Sums::new();
    for n in store
        .live_slices(view, scope, watermark.unwrap_or(i64::MIN))
        .await?
    {
        for (member, amount) in slice_fields(store, &k.slice(n), chunk).await? {
            let slot = sums.entry(member).or_insert((0, 0, n));
            slot.0 += i128::from(amount);
            slot.1 += 1;
            slot.2 = slot.2.max(n);
        }
    }
    Ok(sums)
}

/// Every field of the slice `key` with its amount, paging with HSCAN (a field read twice
/// keeps the last value read).
async fn slice_fields(
    store: &Store,
    key: &str,
    chunk: usize,
) -> Result<HashMap<String, i64>, StoreError> {
    let mut fields: HashMap<String, i64> = HashMap::new();
    let mut cursor = "0".to_string();
    loop {
        let (next, page) = store.scan("HSCAN", key, &cursor, chunk).await?;
        for (member, value) in page {
            let amount: i64 = value
                .parse()
                .map_err(|_| StoreError::Reply(format!("{key} holds {value:?} for {member:?}")))?;
            fields.insert(member, amount);
        }
        if next == "0" {
            return Ok(fields);
        }
        cursor = next;
    }
}

/// The rows to stage. With `repair`, a member that `members` has lost is given the last
/// millisecond of its newest slice as its tie-break time (the exact time is not kept), at
/// most 2^53 - 1, the latest time an event can have: the slice holding that time ends
/// after it, and a later time is one no script accepts back.
pub(crate) fn staged(board: &Board, sums: Sums, repair: bool) -> Result<Vec<Staged>, RollError> {
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

/// Writes each part's rows into the scratch keys of one run and swaps them all in at
/// once; false when the swap was refused (see [`SwapCheck`]). Also returns the members
/// whose lost `members` entry was restored (see [`Staged::fallback_ts`]).
pub(crate) async fn replace(
    store: &Store,
    view: &View<'_>,
    scope: Option<&str>,
    parts: &[(StageTargets, &[Staged])],
    chunk: usize,
    check: SwapCheck<'_>,
) -> Result<(bool, Vec<String>), StoreError> {
    let token = unique_token();
    let mut all = StageTargets::default();
    let mut repaired = Vec::new();
    let outcome = async {
        for (targets, rows) in parts {
            all.result |= targets.result;
            all.ranked |= targets.ranked;
            all.refs |= targets.refs;
            all.totals |= targets.totals;
            // At least one call per part, so that the run's marker exists even when empty.
            store.stage(view, scope, &token, *targets, &[]).await?;
            for part in rows.chunks(chunk.clamp(1, STAGE_CALL_ROWS)) {
                repaired.extend(store.stage(view, scope, &token, *targets, part).await?.1);
            }
        }
        store.swap(view, scope, &token, all, check).await
    }
    .await;
    if !matches!(outcome, Ok(true)) {
        store.discard(view, scope, &token).await?;
    }
    repaired.sort();
    repaired.dedup();
    Ok((outcome?, repaired))
}

/// The stage targets of a resummarize ranking: the result and its ranked copy, positive
/// totals only.
pub(crate) fn ranking_targets() -> StageTargets {
    StageTargets {
        result: true,
        ranked: true,
        positive_only: true,
        ..StageTargets::default()
    }
}

/// Re-sums the live slices into a new ranking and renames it over the result: readers
/// see the old or the new ranking, never a half. Leaves an instance that no apply or
/// expiry has changed since its ranking was summed (above the same watermark) as it is;
/// true when it summed.
pub async fn resummarize(
    store: &Store,
    view: &View<'_>,
    scope: Option<&str>,
    watermark: i64,
    now: i64,
    chunk: usize,
) -> Result<bool, RollError> {
    let board = view.board();
    // Read before the slices: a change after this read moves `gen` past what the swap
    // records, so the next run sums again.
    let summed = store.summed(view, scope).await?;
    if summed.unchanged(watermark, now) {
        return Ok(false);
    }
    let rows = staged(
        board,
        sum_slices(store, view, scope, Some(watermark), chunk).await?,
        false,
    )?;
    let check = SwapCheck {
        watermark: Some(watermark),
        summed_at: Some((&summed.gen, now)),
        ..SwapCheck::default()
    };
    let parts = [(ranking_targets(), rows.as_slice())];
    let (swapped, _) = replace(store, view, scope, &parts, chunk, check).await?;
    if !swapped {
        // Only a newer run's sum (a higher watermark, or the same one read later: another
        // replica's run), a sum over slices that a raised watermark made dead meanwhile, or
        // a resent swap is refused.
        debug!(board = %board.name, scope = ?scope, watermark,
               "recomputed ranking not swapped in: a newer one already was");
    }
    Ok(true)
}
