//! The reads: top, rank and around, each one `query.lua` call decoded into a page.

use fred::prelude::*;

use super::{
    as_array, as_i64, as_string, parse_watermark, reply_err, score, tie_flag, Store, StoreError,
};
use crate::domain::board::{Board, Mode};
use crate::domain::keys::InstanceKeys;
use crate::domain::ranking::{decode_member, Entry, MemberRank, Page, Percentile};

struct Snapshot {
    count: u64,
    rank: Option<u64>,
    window_from: i64,
    window_to: i64,
    as_of: Option<i64>,
    entries: Vec<Entry>,
}

impl Store {
    /// The Hash that holds the tie-break time of each ranked member's ZSet member.
    fn lookup(&self, board: &Board, k: &InstanceKeys) -> String {
        match board.mode {
            Mode::Incremental => k.members(),
            Mode::Resummarize => k.ranked(),
        }
    }

    async fn query(
        &self,
        board: &Board,
        scope: Option<&str>,
        mut args: Vec<Value>,
        now: i64,
    ) -> Result<Snapshot, StoreError> {
        let k = self.instance(board, scope);
        let keys = vec![k.meta(), k.result(), self.lookup(board, &k)];
        args.insert(1, Value::from(tie_flag(board)));
        let (out, board_watermark, board_rolled) = self.snapshot(board, scope, keys, args).await?;
        let out = as_array(out).ok_or_else(|| reply_err("query: not an array"))?;
        let mut it = out.into_iter();
        let expired = it.next().as_ref().and_then(as_i64).max(board_watermark);
        let mut num = || {
            it.next()
                .as_ref()
                .and_then(as_i64)
                .ok_or_else(|| reply_err("query: missing number"))
        };
        let count = num()?.max(0) as u64;
        let rank = num()?;
        let first_competition = num()?.max(0) as u64;
        let start = num()?.max(0) as u64;
        let rows = it.next().and_then(as_array).unwrap_or_default();
        let mut stamp = || it.next().as_ref().and_then(as_i64);
        let (rolled, changed, summed) = (stamp(), stamp(), stamp());
        // When the ranking last changed: an incremental ranking changes with every apply
        // and every roll (the board's own, for a scope); a resummarize ranking only when a
        // run swaps in a new sum.
        let as_of = match board.mode {
            Mode::Incremental => changed.max(rolled).max(board_rolled),
            Mode::Resummarize => summed,
        };
        let (window_from, window_to) = board.live_range(now, expired);
        let entries = entries(board, rows, start, first_competition, count)?;
        Ok(Snapshot {
            count,
            rank: u64::try_from(rank).ok().map(|r| r + 1),
            window_from,
            window_to,
            as_of,
            entries,
        })
    }

    /// The query's script call and, for a scoped instance, the board's watermark and last
    /// roll read beside it.
    ///
    /// A scoped instance follows the board's watermark too (see [`Store::raise_board_watermark`]);
    /// both reads go out together on one connection, so this costs no extra round trip.
    /// The watermark lives in another slot, which may move on its own: it is retried like
    /// the script call.
    async fn snapshot(
        &self,
        board: &Board,
        scope: Option<&str>,
        keys: Vec<String>,
        args: Vec<Value>,
    ) -> Result<(Value, Option<i64>, Option<i64>), StoreError> {
        let client = self.reader();
        let snapshot = self.timed(
            &self.scripts.query,
            Box::pin(super::redirected(|| {
                let query = &self.scripts.query;
                query.evalsha_with_reload(client, keys.clone(), args.clone())
            })),
        );
        if scope.is_none() {
            return Ok((snapshot.await?, None, None));
        }
        let window = self.keys.window(&board.name);
        let board_watermark = Box::pin(super::redirected(|| {
            client.hmget::<(Option<String>, Option<String>), _, _>(
                window.as_str(),
                vec!["expired_through", "last_roll"],
            )
        }));
        let (out, (watermark, rolled)) = tokio::try_join!(snapshot, board_watermark)?;
        Ok((
            out,
            parse_watermark(watermark)?,
            rolled.and_then(|t| t.parse::<i64>().ok()),
        ))
    }

    fn page(board: &Board, scope: Option<&str>, snap: Snapshot) -> Page {
        Page {
            board: board.name.clone(),
            scope: scope.map(str::to_string),
            scale: board.scale,
            count: snap.count,
            window_from: snap.window_from,
            window_to: snap.window_to,
            as_of: snap.as_of,
            entries: snap.entries,
        }
    }

    fn member_rank(board: &Board, scope: Option<&str>, member: &str, snap: Snapshot) -> MemberRank {
        let entry = snap
            .entries
            .into_iter()
            .next()
            .filter(|_| snap.rank.is_some());
        MemberRank {
            board: board.name.clone(),
            scope: scope.map(str::to_string),
            scale: board.scale,
            count: snap.count,
            window_from: snap.window_from,
            window_to: snap.window_to,
            as_of: snap.as_of,
            member: member.to_string(),
            rank: entry.as_ref().map(|e| e.rank),
            competition_rank: entry.as_ref().map(|e| e.competition_rank),
            percentile: entry.as_ref().map(|e| e.percentile),
            total: entry.as_ref().map(|e| e.total),
            last_ts: entry.and_then(|e| e.last_ts),
        }
    }

    /// The ranking from position `offset` (0-based), at most `limit` entries.
    pub async fn top(
        &self,
        board: &Board,
        scope: Option<&str>,
        offset: u64,
        limit: u64,
        now: i64,
    ) -> Result<Page, StoreError> {
        let snap = self
            .query(
                board,
                scope,
                vec![
                    "top".into(),
                    (offset.min(i64::MAX as u64) as i64).into(),
                    (limit as i64).into(),
                ],
                now,
            )
            .await?;
        Ok(Self::page(board, scope, snap))
    }

    /// The position of `member`; its rank fields are null when it is not on the board.
    pub async fn rank(
        &self,
        board: &Board,
        scope: Option<&str>,
        member: &str,
        now: i64,
    ) -> Result<MemberRank, StoreError> {
        let snap = self
            .query(board, scope, vec!["rank".into(), member.into()], now)
            .await?;
        Ok(Self::member_rank(board, scope, member, snap))
    }

    /// The entries from `rank - radius` to `rank + radius` around `member`; when the
    /// member is not on the board, its rank answer instead (rank fields null), so that
    /// "not on the board" has the one shape of [`Store::rank`]'s.
    pub async fn around(
        &self,
        board: &Board,
        scope: Option<&str>,
        member: &str,
        radius: u64,
        now: i64,
    ) -> Result<Result<Page, MemberRank>, StoreError> {
        let snap = self
            .query(
                board,
                scope,
                vec!["around".into(), member.into(), (radius as i64).into()],
                now,
            )
            .await?;
        if snap.rank.is_none() {
            return Ok(Err(Self::member_rank(board, scope, member, snap)));
        }
        Ok(Ok(Self::page(board, scope, snap)))
    }
}

/// The entries of a page from the script's `member, score` rows: ranks from `start + 1`,
/// competition ranks from the first row's (`first_competition`), shared by equal totals;
/// percentiles among the snapshot's `count` ranked members.
fn entries(
    board: &Board,
    rows: Vec<Value>,
    start: u64,
    first_competition: u64,
    count: u64,
) -> Result<Vec<Entry>, StoreError> {
    let mut entries = Vec::with_capacity(rows.len() / 2);
    let mut rows = rows.into_iter();
    while let (Some(z), Some(s)) = (rows.next(), rows.next()) {
        let total = score(&s)
            .ok_or_else(|| reply_err(format!("query: score {s:?} is not an exact integer")))?;
        let z = as_string(z).ok_or_else(|| reply_err("query: member is not text"))?;
        let (member, last_ts) = decode_member(board.tie_break, &z);
        let rank = start + entries.len() as u64 + 1;
        let competition_rank = match entries.last() {
            None => first_competition,
            Some(Entry {
                total: prev,
                competition_rank,
                ..
            }) if *prev == total => *competition_rank,
            Some(_) => rank,
        };
        let percentile = Percentile::of(rank, count)
            .ok_or_else(|| reply_err(format!("query: rank {rank} beyond count {count}")))?;
        entries.push(Entry {
            rank,
            competition_rank,
            percentile,
            member,
            total,
            last_ts,
        });
    }
    Ok(entries)
}
