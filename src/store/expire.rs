//! Rolling the window: the board's and each instance's watermark, key scans, expiring a
//! dead slice in bounded chunks, dropping empty slices and forgetting idempotency keys.

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};

use super::{
    as_array, as_i64, as_string, feed_args, mode_flag, negative_flag, reply_err, tie_flag, Store,
    StoreError,
};
use crate::domain::board::{Board, View};
use crate::domain::keys::Keys;
use crate::domain::limits::per_request;

/// Result of expiring one chunk of a slice.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expired {
    /// Slice fields subtracted and deleted by this call.
    pub fields: u64,
    /// Members that left the instance (no live events remain).
    pub members_removed: u64,
}

/// Most fields of a dead slice that one `expire.lua` call expires. docs/design.md, *Bounded calls*: no
/// call may hold Redis for more than about 2 ms; an expired field costs ~16 µs of Redis
/// time on the reference machine when its member leaves a 1M-member ranking, and calls of
/// 64 fields ran 1.0 ms at the median but 5 ms at p99 on the shared 2-core machine (`cargo
/// bench --bench rollboard -- expiry`). The roll job splits each HSCAN page of
/// `schedule.chunk` fields into calls of at most this many.
pub const EXPIRE_CALL_FIELDS: usize = 32;

// `FCALL`, the function, the key count, at most eight keys and six ARGV, then the fields.
const _: () = assert!(EXPIRE_CALL_FIELDS <= per_request(3 + 8 + 6, 1));

/// Most legacy idempotency keys that one `trim_seen.lua` call forgets (same bound; `ZREM`
/// from a 1M-member legacy `seen` ZSet).
pub const TRIM_CALL_IDS: usize = 128;

/// Most forget-log entries that one `trim_seen.lua` call takes: each addresses a bucket
/// of about 16 entries of the digest table, rewritten once per call.
pub const TRIM_CALL_LOG: usize = 128;

/// What one `trim_seen.lua` call forgot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Trimmed {
    /// Raw ids removed from the legacy `seen` ZSet.
    pub legacy: u64,
    /// Forget-log entries taken (fewer than [`TRIM_CALL_LOG`]: the log is drained).
    pub taken: u64,
    /// Digests removed from the digest table.
    pub digests: u64,
}

impl Store {
    /// Raises the board's own watermark of the window `view` (see
    /// [`Keys::window`](crate::domain::keys::Keys::window)) to at least `target`; returns it. Every
    /// roll does this before it touches an instance.
    pub async fn raise_board_watermark(
        &self,
        view: &View<'_>,
        target: i64,
        now: i64,
    ) -> Result<i64, StoreError> {
        let v = self
            .eval(
                &self.scripts.floor,
                vec![self.keys.window(&view.board().name)],
                vec![
                    target.into(),
                    now.into(),
                    Keys::floor_field(view.window_suffix().as_deref()).into(),
                ],
            )
            .await?;
        as_i64(&v).ok_or_else(|| reply_err("floor: not a number"))
    }

    /// The latest time a roll of `board` ran at (the board's `last_roll`, which the roll
    /// of every window raises), or `None` before the first roll.
    pub async fn board_last_roll(&self, board: &Board) -> Result<Option<i64>, StoreError> {
        let key = self.keys.window(&board.name);
        let text: Option<String> = self.client().hget(key.as_str(), "last_roll").await?;
        text.map(|t| {
            // As the scripts write it (no '+', no leading zero), as floor.lua reads it.
            t.parse::<i64>()
                .ok()
                .filter(|n| n.to_string() == t)
                .ok_or_else(|| {
                    reply_err(format!(
                        "ROLLBOARD corrupt: {key} last_roll {t:?} is not an integer"
                    ))
                })
        })
        .transpose()
    }

    /// Raises the instance's watermark to at least `target`; returns the watermark and the
    /// registered slices at or below it (the ones to expire), oldest first.
    pub async fn raise_watermark(
        &self,
        view: &View<'_>,
        scope: Option<&str>,
        target: i64,
        now: i64,
    ) -> Result<(i64, Vec<i64>), StoreError> {
        let k = self.instance(view, scope);
        let out = as_array(
            self.eval(
                &self.scripts.watermark,
                vec![k.meta(), k.slices()],
                vec![target.into(), now.into(), view.fingerprint().into()],
            )
            .await?,
        )
        .ok_or_else(|| reply_err("watermark: not an array"))?;
        let mut it = out.into_iter();
        let w = it
            .next()
            .as_ref()
            .and_then(as_i64)
            .ok_or_else(|| reply_err("watermark: no watermark"))?;
        let slices = it
            .next()
            .and_then(as_array)
            .unwrap_or_default()
            .iter()
            .map(|v| as_i64(v).ok_or_else(|| reply_err("watermark: slice is not a number")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((w, slices))
    }

    /// One page of `HSCAN`/`ZSCAN`/`SSCAN`: the next cursor and the (field, value) pairs.
    pub async fn scan(
        &self,
        command: &'static str,
        key: &str,
        cursor: &str,
        count: usize,
    ) -> Result<(String, Vec<(String, String)>), StoreError> {
        let v: Value = self
            .client()
            .custom(
                CustomCommand::new_static(command, ClusterHash::FirstKey, false),
                vec![
                    Value::from(key),
                    Value::from(cursor),
                    "COUNT".into(),
                    Value::from(count as i64),
                ],
            )
            .await?;
        let mut parts = as_array(v)
            .ok_or_else(|| reply_err("scan: not an array"))?
            .into_iter();
        let next = parts
            .next()
            .and_then(as_string)
            .ok_or_else(|| reply_err("scan: no cursor"))?;
        let items = parts.next().and_then(as_array).unwrap_or_default();
        let mut pairs = Vec::with_capacity(items.len() / 2);
        let mut it = items.into_iter();
        while let (Some(f), Some(v)) = (it.next(), it.next()) {
            let f = as_string(f).ok_or_else(|| reply_err("scan: field is not text"))?;
            let v = as_string(v).ok_or_else(|| reply_err("scan: value is not text"))?;
            pairs.push((f, v));
        }
        Ok((next, pairs))
    }

    /// Subtracts and deletes the given fields of dead slice `n` in one script call,
    /// exactly once: a field that a concurrent or crashed roller already expired is no
    /// longer in the slice and is skipped. The amounts are read by the script itself (a
    /// dead slice never changes). Callers pass at most [`EXPIRE_CALL_FIELDS`] names.
    pub async fn expire_chunk(
        &self,
        view: &View<'_>,
        scope: Option<&str>,
        n: i64,
        members: &[String],
    ) -> Result<Expired, StoreError> {
        let board = view.board();
        let k = self.instance(view, scope);
        let mut keys = vec![
            k.meta(),
            k.result(),
            k.members(),
            k.refs(),
            k.totals(),
            k.slice(n),
        ];
        let feed = board.incremental_feed();
        keys.extend(feed.map(|_| k.changes()));
        keys.extend(board.dense_rank.then(|| k.dense()));
        let args: Vec<Value> = [
            Value::from(mode_flag(board)),
            Value::from(negative_flag(board)),
            Value::from(view.fingerprint()),
            Value::from(tie_flag(board)),
        ]
        .into_iter()
        .chain(feed_args(feed))
        .chain(members.iter().map(|m| Value::from(m.as_str())))
        .collect();
        let out = as_array(self.eval(&self.scripts.expire, keys, args).await?)
            .ok_or_else(|| reply_err("expire: not an array"))?;
        let field = |i: usize| {
            out.get(i)
                .and_then(as_i64)
                .map(|v| v as u64)
                .ok_or_else(|| reply_err("expire: missing count"))
        };
        Ok(Expired {
            fields: field(0)?,
            members_removed: field(1)?,
        })
    }

    /// Unregisters slice `n` if it is empty; false when fields remain.
    pub async fn drop_slice(
        &self,
        view: &View<'_>,
        scope: Option<&str>,
        n: i64,
    ) -> Result<bool, StoreError> {
        let k = self.instance(view, scope);
        let v = self
            .eval(
                &self.scripts.drop_slice,
                vec![k.slices(), k.slice(n)],
                vec![n.into()],
            )
            .await?;
        Ok(as_i64(&v) == Some(1))
    }

    /// The registered slices of the instance `scope` in the window `view` (the widest, whose
    /// instance holds the idempotency keys) whose idempotency keys may be forgotten at
    /// `now` ([`Board::forget_at`]), oldest first: with `dedup_window = "window"` only dead
    /// slices, with a shorter window live ones too.
    pub async fn forgettable_slices(
        &self,
        view: &View<'_>,
        scope: Option<&str>,
        now: i64,
    ) -> Result<Vec<i64>, StoreError> {
        let k = self.instance(view, scope);
        let through = view.board().forgettable_through(now);
        let found: Vec<String> = self
            .client()
            .zrangebyscore(k.slices(), "-inf", through, false, None)
            .await?;
        found
            .iter()
            .map(|n| {
                n.parse()
                    .map_err(|_| reply_err(format!("slice registry holds {n:?}")))
            })
            .collect()
    }

    /// One bounded step of forgetting: takes up to [`TRIM_CALL_LOG`] entries of the forget
    /// log of `slice` (one whose ids may be forgotten at `now`) and removes that slice's
    /// digests from the table, and forgets up to `chunk` legacy raw ids due at `now`
    /// (callers keep `chunk` at or below [`TRIM_CALL_IDS`]).
    ///
    /// The legacy `seen` ZSet (the idempotency layout before digests) is removed in 0.3 or
    /// after 2027-03-01, whichever comes first; until then apply calls carry raw ids to an
    /// instance that still holds it and the roll drains it.
    pub async fn trim_seen(
        &self,
        view: &View<'_>,
        scope: Option<&str>,
        slice: Option<i64>,
        now: i64,
        chunk: usize,
    ) -> Result<Trimmed, StoreError> {
        let k = self.instance(view, scope);
        let log = slice.map_or_else(|| k.seen_log(0), |n| k.seen_log(n));
        let v = as_array(
            self.eval(
                &self.scripts.trim_seen,
                vec![k.seen(), k.seen_table(), log],
                vec![
                    now.into(),
                    (chunk as i64).into(),
                    slice.map_or(Value::from(""), Value::from),
                    (TRIM_CALL_LOG as i64).into(),
                ],
            )
            .await?,
        )
        .ok_or_else(|| reply_err("trim_seen: not an array"))?;
        let field = |i: usize| {
            v.get(i)
                .and_then(as_i64)
                .map(|n| n.max(0) as u64)
                .ok_or_else(|| reply_err("trim_seen: missing count"))
        };
        Ok(Trimmed {
            legacy: field(0)?,
            taken: field(1)?,
            digests: field(2)?,
        })
    }
}
