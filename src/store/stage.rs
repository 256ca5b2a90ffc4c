//! Resummarize: reading the live slices, writing a recomputed instance into scratch keys
//! in bounded calls, swapping it over the live keys, and discarding or cleaning up.

use fred::prelude::*;

use super::{
    as_array, as_i64, as_string, feed_args, reply_err, score, tie_flag, Store, StoreError,
};
use crate::domain::board::View;
use crate::domain::keys::InstanceKeys;
use crate::domain::limits::per_request;
use crate::domain::ranking::{decode_member, encode_member};

/// Most rows that one `stage.lua` call writes into the scratch keys of a recomputation
/// (same bound and measurement as [`EXPIRE_CALL_FIELDS`](super::EXPIRE_CALL_FIELDS):
/// 11–14 µs of Redis time per row on the reference machine while the scratch ranking
/// grows to 1M members: calls of 64 rows reached 1.7 ms at p99, too near the bound).
pub const STAGE_CALL_ROWS: usize = 32;

// `FCALL`, the function, the key count, at most eight keys and three ARGV, then four ARGV a
// row.
const _: () = assert!(STAGE_CALL_ROWS <= per_request(3 + 8 + 3, 4));

/// One member of a recomputed instance, as written by [`Store::stage`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staged {
    /// The member.
    pub member: String,
    /// Its exact total over the live slices.
    pub total: i64,
    /// How many live slices hold it.
    pub slices: i64,
    /// The tie-break time to record when `members` has lost the member (a repair by
    /// rebuild); `None` skips such a member (it left the instance while being summed).
    pub fallback_ts: Option<i64>,
}

/// Which scratch structures [`Store::stage`] writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageTargets {
    /// The ranking ZSet.
    pub result: bool,
    /// The resummarize lookup Hash (member -> zmember as ranked).
    pub ranked: bool,
    /// The live-slice counts.
    pub refs: bool,
    /// The live totals.
    pub totals: bool,
    /// Write `result`/`ranked` only for totals above 0.
    pub positive_only: bool,
}

impl StageTargets {
    fn flags(self) -> String {
        [
            (self.result, 'r'),
            (self.ranked, 'n'),
            (self.refs, 'f'),
            (self.totals, 't'),
            (self.positive_only, 'p'),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, c)| *c)
        .collect()
    }

    /// The (scratch, live) key pairs these targets replace; a ranking of a board with
    /// `dense` rank comes with its distinct totals.
    fn pairs(self, k: &InstanceKeys, token: &str, dense: bool) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if self.result {
            out.push((k.scratch(token, "result"), k.result()));
        }
        if self.result && dense {
            out.push((k.scratch(token, "dense"), k.dense()));
        }
        if self.ranked {
            out.push((k.scratch(token, "ranked"), k.ranked()));
        }
        if self.refs {
            out.push((k.scratch(token, "refs"), k.refs()));
        }
        if self.totals {
            out.push((k.scratch(token, "totals"), k.totals()));
        }
        out
    }
}

/// How long the change stream of an instance that emptied stays, for its readers to read
/// its last entries (one day).
pub const CHANGES_RETAIN_MS: i64 = 86_400_000;

/// What a swap checks before it replaces the live keys, and what it records.
#[derive(Debug, Clone, Copy, Default)]
pub struct SwapCheck<'a> {
    /// The instance's `gen` when the sums were read: refuse if anything changed since.
    /// With `watermark` and no `summed_at`, it is also the `gen` recorded for the sum (with
    /// no run time, so the next run sums again), which refuses any run that summed before.
    pub gen: Option<&'a str>,
    /// The watermark the live sums were taken above: refuse if a sum above a higher one was
    /// swapped in, or the watermark was raised above it (slices it summed are dead now, and
    /// may have been expired part way under its HSCANs).
    pub watermark: Option<i64>,
    /// With `watermark`: the `gen` read before the live slices were summed, and the run's
    /// time (epoch ms). Recorded with the watermark (see [`Summed`]); refuse if a sum above
    /// the same watermark read at a later `gen` was swapped in (two replicas' runs race,
    /// and the one that summed first may swap last).
    pub summed_at: Option<(&'a str, i64)>,
}

/// An instance's change counter and what its ranking was last summed at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summed {
    /// `gen`, bumped by every apply and expiry call that changes the instance ("0" if none).
    pub gen: String,
    /// The `gen` read before the live slices of the ranking swapped in last were summed.
    pub summed_gen: Option<String>,
    /// The watermark that sum was taken above.
    pub summed_through: Option<i64>,
    /// The time of the run that took it (epoch ms).
    pub summed_ms: Option<i64>,
}

/// How long a resummarize ranking that nothing changed is kept before it is summed again
/// all the same (ms): a bound on how long anything a `gen` does not count (a write by
/// hand, an older version's run racing a newer one's) can stay in the ranking.
pub const RESUM_AT_LEAST_EVERY_MS: i64 = 60 * 60 * 1000;

impl Summed {
    /// Whether a sum of the live slices above `watermark` at `now` would give the ranking
    /// that is already in place: no apply or expiry has changed the instance since that
    /// ranking was summed, above the same watermark, less than
    /// [`RESUM_AT_LEAST_EVERY_MS`] ago.
    pub fn unchanged(&self, watermark: i64, now: i64) -> bool {
        self.summed_gen.as_deref() == Some(self.gen.as_str())
            && self.summed_through == Some(watermark)
            && self
                .summed_ms
                .is_some_and(|t| now.saturating_sub(t) < RESUM_AT_LEAST_EVERY_MS)
    }
}

/// How long scratch keys of a recomputation live if their run dies, in ms.
const SCRATCH_TTL_MS: i64 = 15 * 60 * 1000;

impl Store {
    /// The registered slices above `watermark` (the live ones), oldest first.
    pub async fn live_slices(
        &self,
        view: &View<'_>,
        scope: Option<&str>,
        watermark: i64,
    ) -> Result<Vec<i64>, StoreError> {
        let k = self.instance(view, scope);
        let v: Vec<String> = self
            .client()
            .zrangebyscore(k.slices(), format!("({watermark}"), "+inf", false, None)
            .await?;
        v.iter()
            .map(|s| {
                s.parse()
                    .map_err(|_| reply_err(format!("slice registry holds {s:?}")))
            })
            .collect()
    }

    /// What the instance's last swapped-in sum of its live slices was taken at (see
    /// [`Summed`]).
    pub async fn summed(&self, view: &View<'_>, scope: Option<&str>) -> Result<Summed, StoreError> {
        let k = self.instance(view, scope);
        let (gen, summed_gen, summed_through, summed_ms): (
            Option<String>,
            Option<String>,
            Option<String>,
            Option<String>,
        ) = self
            .client()
            .hmget(
                k.meta(),
                vec!["gen", "summed_gen", "summed_through", "summed_ms"],
            )
            .await?;
        Ok(Summed {
            gen: gen.unwrap_or_else(|| "0".into()),
            summed_gen,
            summed_through: summed_through.and_then(|w| w.parse().ok()),
            summed_ms: summed_ms.and_then(|t| t.parse().ok()),
        })
    }

    /// The instance's `expired_through` and `gen` (change counter).
    pub async fn meta(
        &self,
        view: &View<'_>,
        scope: Option<&str>,
    ) -> Result<(Option<i64>, String), StoreError> {
        let k = self.instance(view, scope);
        let (w, gen): (Option<String>, Option<String>) = self
            .client()
            .hmget(k.meta(), vec!["expired_through", "gen"])
            .await?;
        Ok((
            w.and_then(|w| w.parse().ok()),
            gen.unwrap_or_else(|| "0".into()),
        ))
    }

    /// Writes one chunk of a recomputed instance into the scratch keys of run `token`;
    /// returns how many members were skipped because they have left the instance, and
    /// the members given their fallback tie-break time (see [`Staged::fallback_ts`]).
    /// Callers pass at most [`STAGE_CALL_ROWS`] rows.
    pub async fn stage(
        &self,
        view: &View<'_>,
        scope: Option<&str>,
        token: &str,
        targets: StageTargets,
        rows: &[Staged],
    ) -> Result<(u64, Vec<String>), StoreError> {
        let board = view.board();
        let k = self.instance(view, scope);
        let mut keys = vec![
            k.members(),
            k.scratch(token, "result"),
            k.scratch(token, "ranked"),
            k.scratch(token, "refs"),
            k.scratch(token, "totals"),
            k.scratch(token, "marker"),
            k.meta(),
        ];
        keys.extend((board.dense_rank && targets.result).then(|| k.scratch(token, "dense")));
        let mut args: Vec<Value> = vec![
            targets.flags().into(),
            SCRATCH_TTL_MS.into(),
            tie_flag(board).into(),
        ];
        for r in rows {
            args.extend([
                Value::from(r.member.as_str()),
                Value::from(r.total),
                Value::from(r.slices),
                r.fallback_ts.map_or(Value::from(""), |ts| {
                    Value::from(encode_member(board.tie_break, &r.member, ts))
                }),
            ]);
        }
        let out = as_array(self.eval(&self.scripts.stage, keys, args).await?)
            .ok_or_else(|| reply_err("stage: not an array"))?;
        let mut it = out.into_iter();
        let skipped = it
            .next()
            .as_ref()
            .and_then(as_i64)
            .ok_or_else(|| reply_err("stage: no count"))?;
        let repaired = it
            .next()
            .and_then(as_array)
            .unwrap_or_default()
            .into_iter()
            .filter_map(as_string)
            .collect();
        Ok((skipped.max(0) as u64, repaired))
    }

    /// Renames the scratch keys of run `token` over the live ones, atomically, and then
    /// frees the replaced values with `UNLINK` (never inside the script call). Refused
    /// (false) when the run already swapped, or as `check` says.
    pub async fn swap(
        &self,
        view: &View<'_>,
        scope: Option<&str>,
        token: &str,
        targets: StageTargets,
        check: SwapCheck<'_>,
    ) -> Result<bool, StoreError> {
        let board = view.board();
        let k = self.instance(view, scope);
        let mut keys = vec![k.meta(), k.scratch(token, "marker")];
        // The ranking swapped in is a change of the top like any other: the feed records it.
        let feed = board.changes.filter(|_| targets.result);
        keys.extend(feed.map(|_| k.changes()));
        let mut trash = Vec::new();
        for (scratch, live) in targets.pairs(&k, token, board.dense_rank) {
            let old = format!("{scratch}:old");
            keys.extend([scratch, live, old.clone()]);
            trash.push(old);
        }
        let [top, max_len] = feed_args(feed);
        let args = vec![
            Value::from(check.gen.unwrap_or("")),
            check.watermark.map_or(Value::from(""), Value::from),
            Value::from(SCRATCH_TTL_MS),
            Value::from(check.summed_at.map_or("", |(gen, _)| gen)),
            check
                .summed_at
                .map_or(Value::from(""), |(_, ms)| Value::from(ms)),
            top,
            max_len,
            Value::from(tie_flag(board)),
        ];
        let v = self.eval(&self.scripts.swap, keys, args).await?;
        let swapped = as_i64(&v) == Some(1);
        if swapped {
            // The replaced values were renamed away inside the script; UNLINK frees them
            // in Redis's background thread instead of inside a call. Best effort: the swap
            // has happened whatever this answers, and their TTL frees them otherwise.
            let freed: Result<i64, _> = self.client().unlink(trash).await;
            drop(freed);
        }
        Ok(swapped)
    }

    /// Deletes the scratch keys of an abandoned run.
    pub async fn discard(
        &self,
        view: &View<'_>,
        scope: Option<&str>,
        token: &str,
    ) -> Result<(), StoreError> {
        let board = view.board();
        let k = self.instance(view, scope);
        let dense = board.dense_rank.then_some("dense");
        let keys: Vec<String> = ["result", "ranked", "refs", "totals", "marker"]
            .into_iter()
            .chain(dense)
            .map(|w| k.scratch(token, w))
            .collect();
        // UNLINK: a scratch copy of a large ranking is freed in the background.
        let _: i64 = self.client().unlink(keys).await?;
        Ok(())
    }

    /// Deletes the derived keys of an instance that holds no slice and no idempotency key
    /// (its `meta` stays, so its watermark keeps judging late events, and its change
    /// stream for [`CHANGES_RETAIN_MS`]); true when done.
    pub async fn cleanup(&self, view: &View<'_>, scope: Option<&str>) -> Result<bool, StoreError> {
        let board = view.board();
        let k = self.instance(view, scope);
        let mut keys = vec![
            k.slices(),
            k.seen(),
            k.result(),
            // Also when the board has no feed (any more): one left by an earlier one goes.
            k.changes(),
            k.seen_table(),
            k.members(),
            k.ranked(),
            k.refs(),
            k.totals(),
        ];
        keys.extend(board.dense_rank.then(|| k.dense()));
        let args = vec![Value::from(CHANGES_RETAIN_MS)];
        let v = self.eval(&self.scripts.cleanup, keys, args).await?;
        Ok(as_i64(&v) == Some(1))
    }

    /// Every total the distinct totals of a `dense_rank` instance hold (see
    /// [`InstanceKeys::dense`]).
    pub async fn dense_entries(
        &self,
        view: &View<'_>,
        scope: Option<&str>,
    ) -> Result<Vec<i64>, StoreError> {
        let k = self.instance(view, scope);
        let mut out = Vec::new();
        let mut cursor = "0".to_string();
        loop {
            let (next, page) = self.scan("ZSCAN", &k.dense(), &cursor, 1000).await?;
            for (t, s) in page {
                let total = score(&Value::from(s.as_str()))
                    .filter(|total| total.to_string() == t)
                    .ok_or_else(|| reply_err(format!("{}: {t:?} scored {s:?}", k.dense())))?;
                out.push(total);
            }
            if next == "0" {
                return Ok(out);
            }
            cursor = next;
        }
    }

    /// Every (member, total) pair of the stored ranking ZSet, decoded.
    pub async fn result_entries(
        &self,
        view: &View<'_>,
        scope: Option<&str>,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        let board = view.board();
        let k = self.instance(view, scope);
        let mut out = Vec::new();
        let mut cursor = "0".to_string();
        loop {
            let (next, page) = self.scan("ZSCAN", &k.result(), &cursor, 1000).await?;
            for (z, s) in page {
                let total = score(&Value::from(s.as_str()))
                    .ok_or_else(|| reply_err(format!("score {s:?} is not an exact integer")))?;
                out.push((decode_member(board.tie_break, &z).0, total));
            }
            if next == "0" {
                return Ok(out);
            }
            cursor = next;
        }
    }
}
