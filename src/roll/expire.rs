//! Incremental expiry of one board instance: raise its watermark, expire every dead slice
//! in bounded chunks, forget the idempotency keys that are due, and drop an emptied scope.
//!
//! Expiry is exactly-once by construction: the watermark is raised before a slice is
//! touched (so no event can land in it), the worker only *lists* field names with HSCAN,
//! and each chunk script reads, subtracts and deletes those fields atomically, skipping
//! any that a concurrent or crashed roller already handled.

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::domain::board::{Mode, View};
use crate::roll::resummarize::resummarize;
use crate::roll::{Report, RollError};
use crate::store::{Store, EXPIRE_CALL_FIELDS, TRIM_CALL_IDS, TRIM_CALL_LOG};

/// Expiry calls of one instance in flight at once: Redis runs the next while the worker
/// reads a reply, yet other clients' commands still get in between two bounded calls.
const EXPIRE_CALLS_IN_FLIGHT: usize = 2;

/// One instance's roll: what every step of it shares (the instance, the time it is rolled
/// at, the page size of its scans, the job's cancellation). Each step adds what it did to
/// the [`Report`] it is given.
pub struct InstanceRoll<'a> {
    /// Where the instance lives.
    pub store: &'a Store,
    /// The window of its board it is in.
    pub view: &'a View<'a>,
    /// Its scope (or shard, or period), `None` for an unscoped board.
    pub scope: Option<&'a str>,
    /// The time it is rolled at (epoch ms, Redis's clock).
    pub now: i64,
    /// Fields per `HSCAN` page (`schedule.chunk`).
    pub chunk: usize,
    /// The job's cancellation, checked between two bounded calls.
    pub cancel: &'a CancellationToken,
}

impl InstanceRoll<'_> {
    /// Rolls the instance: raise the watermark to at least `target` (the board's watermark
    /// after [`Store::raise_board_watermark`] at `now`), expire every dead slice in chunks
    /// (oldest first, catching up on any missed run), forget due idempotency keys, and for
    /// resummarize boards rebuild the ranking from the live slices.
    pub async fn roll(&self, target: i64, report: &mut Report) -> Result<(), RollError> {
        let Self {
            store,
            view,
            scope,
            now,
            chunk,
            ..
        } = *self;
        report.instances += 1;
        let (watermark, dead) = store.raise_watermark(view, scope, target, now).await?;
        report.expired_through = Some(watermark);
        for n in dead {
            self.expire_slice(n, report).await?;
        }
        // The widest window's instance holds the idempotency keys and stands for the scope
        // in the registry (a narrower window's instance empties first, and is cleaned up on
        // its own).
        let widest = view.is_widest();
        if widest {
            self.forget_seen(report).await?;
        }
        if view.board().mode == Mode::Resummarize
            && resummarize(store, view, scope, watermark, now, chunk).await?
        {
            report.resummed += 1;
        }
        if let Some(scope) = scope {
            if store.cleanup(view, Some(scope)).await?
                && widest
                && narrower_cleaned_up(store, view, scope).await?
                && store
                    .unregister_scope(view.board(), scope, watermark)
                    .await?
            {
                report.scopes_removed += 1;
            }
        }
        Ok(())
    }

    /// Forgets the idempotency keys of every registered slice whose ids may be forgotten
    /// at `now`, draining each slice's forget log in bounded calls, and the legacy raw ids
    /// that are due. (A dead slice's log is drained by [`InstanceRoll::expire_slice`]
    /// before it drops the slice.)
    async fn forget_seen(&self, report: &mut Report) -> Result<(), RollError> {
        let Self {
            store,
            view,
            scope,
            now,
            ..
        } = *self;
        let per_call = self.chunk.clamp(1, TRIM_CALL_IDS);
        let mut due = store
            .forgettable_slices(view, scope, now)
            .await?
            .into_iter();
        let mut slice = due.next();
        loop {
            let trimmed = store.trim_seen(view, scope, slice, now, per_call).await?;
            report.ids_forgotten += trimmed.legacy + trimmed.digests;
            if trimmed.taken < TRIM_CALL_LOG as u64 {
                slice = due.next();
            }
            if slice.is_none() && trimmed.legacy < per_call as u64 {
                return Ok(());
            }
            self.check_cancelled()?;
        }
    }

    /// Expires dead slice `n` whole: its fields, then its idempotency keys, then its
    /// registration.
    async fn expire_slice(&self, n: i64, report: &mut Report) -> Result<(), RollError> {
        // One full HSCAN pass returns every field present for its whole duration, and no
        // field can be added (the watermark is above n), so a pass normally empties the
        // slice; the loop only repeats when a concurrent roller raced us on the same fields.
        loop {
            self.expire_pass(n, report).await?;
            // The slice's idempotency keys go before its registration: the forget log is
            // found through the registry.
            self.forget_slice(n, report).await?;
            if self.store.drop_slice(self.view, self.scope, n).await? {
                report.slices_expired += 1;
                return Ok(());
            }
        }
    }

    /// One full HSCAN pass over dead slice `n`, expiring each page's fields.
    async fn expire_pass(&self, n: i64, report: &mut Report) -> Result<(), RollError> {
        let key = self.store.instance(self.view, self.scope).slice(n);
        let mut cursor = "0".to_string();
        loop {
            self.check_cancelled()?;
            let (next, page) = self.store.scan("HSCAN", &key, &cursor, self.chunk).await?;
            let names: Vec<String> = page.into_iter().map(|(member, _)| member).collect();
            self.expire_fields(n, &names, EXPIRE_CALL_FIELDS, report)
                .await?;
            if next == "0" {
                return Ok(());
            }
            cursor = next;
        }
    }

    /// Drains the forget log of dead slice `n` in bounded calls.
    async fn forget_slice(&self, n: i64, report: &mut Report) -> Result<(), RollError> {
        let per_call = self.chunk.clamp(1, TRIM_CALL_IDS);
        loop {
            let trimmed = self
                .store
                .trim_seen(self.view, self.scope, Some(n), self.now, per_call)
                .await?;
            report.ids_forgotten += trimmed.legacy + trimmed.digests;
            if trimmed.taken < TRIM_CALL_LOG as u64 {
                return Ok(());
            }
            self.check_cancelled()?;
        }
    }

    /// Expires the fields `names` of dead slice `n` in script calls of at most `per_call`
    /// fields each, a few in flight at once. Each call claims its fields atomically, so
    /// the order of the calls does not matter and a stop between two of them
    /// (cancellation, a crash, a failed call) leaves every field either expired once or
    /// still in the slice for the next roll.
    pub async fn expire_fields(
        &self,
        n: i64,
        names: &[String],
        per_call: usize,
        report: &mut Report,
    ) -> Result<(), RollError> {
        let Self {
            store,
            view,
            scope,
            cancel,
            ..
        } = *self;
        // Collected first: a lazily mapped stream of borrowing futures is not provably
        // `Send` to the spawned job that awaits it.
        let calls: Vec<_> = names
            .chunks(per_call.max(1))
            .map(|part| async move {
                if cancel.is_cancelled() {
                    return Err(RollError::Cancelled);
                }
                Ok(store.expire_chunk(view, scope, n, part).await?)
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

    /// [`RollError::Cancelled`] once the job is cancelled.
    fn check_cancelled(&self) -> Result<(), RollError> {
        if self.cancel.is_cancelled() {
            return Err(RollError::Cancelled);
        }
        Ok(())
    }
}

/// Whether every window's instance of `scope` narrower than `widest` is cleaned up too (holds no slice
/// and ranks no member), so that the scope may leave the registry: the registry is how a
/// roll finds every window's instance, so a narrower one whose roll failed (and still
/// holds a dead slice) keeps the scope listed until a roll has expired it.
async fn narrower_cleaned_up(
    store: &Store,
    widest: &View<'_>,
    scope: &str,
) -> Result<bool, RollError> {
    for view in widest.board().narrower_views() {
        if !store.cleanup(&view, Some(scope)).await? {
            return Ok(false);
        }
    }
    Ok(true)
}
