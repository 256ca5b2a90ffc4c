//! Calendar-period boards: each period is an instance of its own (named
//! [`period_instance`], registered like a scope), so an apply splits its events by period;
//! a registry of the board's periods (scored by their start) answers which archives exist,
//! and the roll deletes the archives beyond `keep_periods` once their grace has passed.

use std::collections::BTreeMap;

use fred::prelude::*;

use super::{ApplyEvent, Outcome, Store, StoreError};
use crate::domain::board::{period_instance, Board, Calendar};
use crate::domain::limits::per_request;
use crate::domain::period::Span;

/// How long after its grace an archive beyond `keep_periods` is still left alone: a replica
/// whose measure of Redis's clock lags the roll's (by up to `max_clock_skew`) could still
/// judge one of its events in time and write the instance again after the delete.
pub const PERIOD_DELETE_MARGIN_MS: i64 = 60_000;

/// What [`Store::forget_periods`] deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForgottenPeriods {
    /// Periods deleted (their ids, oldest first).
    pub periods: Vec<String>,
    /// Instances deleted (one per period, one per scope and period on a scoped board).
    pub instances: u64,
}

/// Where a period board stands at `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeriodState {
    /// The current period.
    pub current: Span,
    /// The closed periods kept (ids, newest first, at most `keep_periods`).
    pub archived: Vec<String>,
}

impl Store {
    /// [`Store::apply`] on a period board: the events split by the period of their `ts`
    /// (each period an instance of its own, in stream order within it), each period
    /// registered before its first apply. A period whose grace has passed at `now` is not
    /// written at all: its events are late (the script would say so too, judging at `now`
    /// or later).
    pub(super) async fn apply_periods(
        &self,
        board: &Board,
        calendar: &Calendar,
        scope: Option<&str>,
        events: &[ApplyEvent],
        now: i64,
    ) -> Result<Vec<Outcome>, StoreError> {
        let mut parts: BTreeMap<i64, (Span, Vec<usize>)> = BTreeMap::new();
        for (i, e) in events.iter().enumerate() {
            let span = calendar.span_at(e.ts);
            parts
                .entry(span.start_ms)
                .or_insert_with(|| (span, Vec::new()))
                .1
                .push(i);
        }
        let mut out = vec![Outcome::Late; events.len()];
        let open: Vec<&(Span, Vec<usize>)> = parts
            .values()
            .filter(|(span, _)| !calendar.is_sealed(span, now))
            .collect();
        if open.is_empty() {
            return Ok(out);
        }
        let registry: Vec<(f64, String)> = open
            .iter()
            .map(|(span, _)| (span.start_ms as f64, span.id.clone()))
            .collect();
        // `ZADD`, the key and `NX`, then two arguments a period; `NX` judges each period
        // on its own, so several `ZADD`s register what one would.
        for piece in registry.chunks(per_request(3, 2)) {
            let _: i64 = self
                .client()
                .zadd(
                    self.keys.periods(&board.name),
                    Some(SetOptions::NX),
                    None,
                    false,
                    false,
                    piece.to_vec(),
                )
                .await?;
        }
        for (span, indexes) in open {
            let share: Vec<ApplyEvent> = indexes.iter().map(|&i| events[i].clone()).collect();
            let instance = period_instance(scope, &span.id);
            let outcomes = self
                .apply_instance(board, Some(&instance), &share, now)
                .await?;
            for (&i, outcome) in indexes.iter().zip(outcomes) {
                out[i] = outcome;
            }
        }
        Ok(out)
    }

    /// The period board's current period and its archives at `now`.
    pub async fn period_state(
        &self,
        board: &Board,
        calendar: &Calendar,
        now: i64,
    ) -> Result<PeriodState, StoreError> {
        let current = calendar.span_at(now);
        let archived = if calendar.keep == 0 {
            Vec::new()
        } else {
            self.client()
                .zrevrangebyscore(
                    self.keys.periods(&board.name),
                    (current.start_ms - 1) as f64,
                    "-inf",
                    false,
                    Some((0, i64::from(calendar.keep))),
                )
                .await?
        };
        Ok(PeriodState { current, archived })
    }

    /// Deletes every closed period of a period board beyond the newest `keep_periods`
    /// whose grace (and [`PERIOD_DELETE_MARGIN_MS`]) has passed at `now`: each of its
    /// instances, then its entries in the instance registry, then its registry entry (last,
    /// so that a roll that stops half-way finds it again).
    pub async fn forget_periods(
        &self,
        board: &Board,
        calendar: &Calendar,
        now: i64,
    ) -> Result<ForgottenPeriods, StoreError> {
        let current = calendar.span_at(now);
        let periods_key = self.keys.periods(&board.name);
        let closed: Vec<String> = self
            .client()
            .zrevrangebyscore(
                &periods_key,
                (current.start_ms - 1) as f64,
                "-inf",
                false,
                None,
            )
            .await?;
        let mut forgotten = ForgottenPeriods::default();
        for id in closed.into_iter().skip(calendar.keep as usize).rev() {
            // An id this board cannot have written (another period length): nothing of it
            // is an instance of the board; it only leaves the registry.
            if let Some(span) = calendar.period.parse_id(calendar.zone, &id) {
                if !calendar.is_sealed(&span, now - PERIOD_DELETE_MARGIN_MS) {
                    continue;
                }
                forgotten.instances += self.delete_period(board, calendar, &span).await?;
            }
            let _: i64 = self.client().zrem(&periods_key, id.as_str()).await?;
            forgotten.periods.push(id);
        }
        Ok(forgotten)
    }

    /// Deletes every instance of one sealed period (registered in the instance registry
    /// with the period's slice number as score); returns how many.
    async fn delete_period(
        &self,
        board: &Board,
        calendar: &Calendar,
        span: &Span,
    ) -> Result<u64, StoreError> {
        let n = calendar.slice_of_span(span);
        let registry = self.keys.scopes(&board.name);
        let suffix = format!("@{}", span.id);
        let mut names: Vec<String> = self
            .client()
            .zrangebyscore(&registry, n as f64, n as f64, false, None)
            .await?;
        names.retain(|name| name.ends_with(&suffix));
        if board.scope.is_none() && !names.contains(&suffix) {
            names.push(suffix);
        }
        for name in &names {
            let k = self.instance(&board.widest(), Some(name));
            let mut keys = k.apply_keys();
            // The distinct totals and the change stream too: they are the period's alone.
            keys.extend([
                k.ranked(),
                k.dense(),
                k.changes(),
                k.slice(n),
                k.seen_log(n),
            ]);
            let unlinked = self.client().unlink::<i64, _>(keys.clone()).await;
            self.wrote_keys(&keys);
            unlinked?;
        }
        // `ZREM` and the key, then one argument an instance: an archive of a scoped board
        // holds an instance per scope.
        for piece in names.chunks(per_request(2, 1)) {
            let _: i64 = self.client().zrem(&registry, piece.to_vec()).await?;
        }
        Ok(names.len() as u64)
    }
}
