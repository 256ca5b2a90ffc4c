//! The reads of a sharded board (`shards = K`): its one ranking is spread over K
//! instances, a member in the shard its name hashes to ([`Board::shard_of`](crate::domain::board::Board::shard_of)), each shard
//! under a hash tag (so a cluster slot, so a core) of its own. Every answer is as exact
//! as one instance's, made here from one `query.lua` call per shard, sent at once:
//!
//! * **top**: each shard's first `offset + limit` entries, merged in the board's order
//!   (total, then the ZSet member: the tie-break, then the name). Every entry above the
//!   page is among them, so ranks and competition ranks are counted, not estimated. A page
//!   reaches at most [`SHARDED_DEPTH`].
//! * **rank**: the member's own shard gives its total and ZSet member; every shard then
//!   says where an entry of that total and ZSet member would rank in it (`above`): the
//!   rank is the sum of the entries above it in each, the competition rank one more than
//!   the sum of the greater totals, the count the sum of the counts.
//! * **around**: the same, then each shard's entries from `radius` above that place to
//!   `radius` below it (`near`), merged: the `radius` entries nearest the member on either
//!   side are among them.
//! * **ranks** of a subset: each member's total from its shard, then one `above` call per
//!   shard for all of them.
//!
//! The shards are read at once, not in one snapshot: an apply between two shards' reads
//! shows in one and not the other (each instance's own reads stay one snapshot).

use std::cmp::Ordering;

use fred::prelude::*;
use futures_util::future::try_join_all;

use super::query::{entries, subset, Firsts, Snapshot};
use super::{as_i64, as_string, reply_err, score, Store, StoreError};
use crate::domain::board::View;
use crate::domain::ranking::{MemberRank, Page, Subset};

/// The deepest rank a page of a sharded board reaches (`offset + limit`): each shard
/// reads its own first `offset + limit` entries for it.
pub const SHARDED_DEPTH: u64 = 10_000;

/// One ranked entry of a shard's answer: its ZSet member, its score as answered, and its
/// total.
struct Row {
    z: String,
    score: Value,
    total: i64,
}

/// A member as its own shard answers it: its row, the shard's index, and its place there
/// (entries above it, entries with a greater total).
type Own = (Row, usize, (u64, u64));

/// The `zmember, score` rows of a shard's answer.
fn rows_of(values: Vec<Value>) -> Result<Vec<Row>, StoreError> {
    let mut out = Vec::with_capacity(values.len() / 2);
    let mut it = values.into_iter();
    while let (Some(z), Some(s)) = (it.next(), it.next()) {
        let total = score(&s)
            .ok_or_else(|| reply_err(format!("query: score {s:?} is not an exact integer")))?;
        let z = as_string(z).ok_or_else(|| reply_err("query: member is not text"))?;
        out.push(Row { z, score: s, total });
    }
    Ok(out)
}

/// The board's order, as `ZREVRANGE` orders one instance: the greater total first, then
/// the ZSet member (the tie-break time as written, then the name) by its bytes, descending.
fn board_order(a: &Row, b: &Row) -> Ordering {
    b.total
        .cmp(&a.total)
        .then_with(|| b.z.as_bytes().cmp(a.z.as_bytes()))
}

/// `rows` as the script writes them, for [`entries`].
fn flat(rows: &[Row]) -> Vec<Value> {
    rows.iter()
        .flat_map(|r| [Value::from(r.z.as_str()), r.score.clone()])
        .collect()
}

/// The shards' answers as one: the counts summed; the live range and `as_of` of the
/// shard rolled last.
fn joined(
    snaps: &[Snapshot],
    rank: Option<u64>,
    entries: Vec<crate::domain::ranking::Entry>,
) -> Snapshot {
    let latest = snaps.iter().max_by_key(|s| (s.window_from, s.as_of));
    Snapshot {
        count: snaps.iter().map(|s| s.count).sum(),
        rank,
        first_competition: 0,
        window_from: latest.map_or(0, |s| s.window_from),
        window_to: latest.map_or(0, |s| s.window_to),
        as_of: snaps.iter().filter_map(|s| s.as_of).max(),
        entries,
        subset: Vec::new(),
    }
}

/// The (above, greater) pairs of an `above` answer.
fn positions(snap: &Snapshot) -> Result<Vec<(u64, u64)>, StoreError> {
    let numbers: Vec<u64> = snap
        .subset
        .iter()
        .map(|v| as_i64(v).and_then(|n| u64::try_from(n).ok()))
        .collect::<Option<_>>()
        .ok_or_else(|| reply_err("query: a position is not a number"))?;
    Ok(numbers.chunks_exact(2).map(|p| (p[0], p[1])).collect())
}

impl Store {
    /// One `query.lua` call per shard of `view`'s board but `except`, at once, the rows left
    /// undecoded.
    async fn each_shard(
        &self,
        view: &View<'_>,
        except: Option<&str>,
        args: Vec<Value>,
        now: i64,
    ) -> Result<Vec<Snapshot>, StoreError> {
        try_join_all(
            view.board()
                .shard_names()
                .into_iter()
                .filter(|shard| Some(shard.as_str()) != except)
                .map(|shard| {
                    let args = args.clone();
                    async move { self.query_as(view, Some(&shard), args, now, true).await }
                }),
        )
        .await
    }

    /// Where the entries `rows` rank in every shard but `except`: per shard, per row,
    /// (entries above it, entries with a greater total); and those shards' answers.
    async fn placed(
        &self,
        view: &View<'_>,
        except: Option<&str>,
        rows: &[&Row],
        now: i64,
    ) -> Result<(Vec<Vec<(u64, u64)>>, Vec<Snapshot>), StoreError> {
        let mut args: Vec<Value> = vec!["above".into()];
        for row in rows {
            args.extend([row.score.clone(), Value::from(row.z.as_str())]);
        }
        let snaps = self.each_shard(view, except, args, now).await?;
        let mut per_shard = Vec::with_capacity(snaps.len());
        for snap in &snaps {
            let found = positions(snap)?;
            if found.len() != rows.len() {
                return Err(reply_err("query: one position per entry expected"));
            }
            per_shard.push(found);
        }
        Ok((per_shard, snaps))
    }

    /// `member`'s shard, its row there (`None`: not ranked) and that shard's answer.
    async fn own_row(
        &self,
        view: &View<'_>,
        member: &str,
        now: i64,
    ) -> Result<(String, Option<Row>, Snapshot), StoreError> {
        let Some(shard) = view.board().shard_of(member) else {
            return Err(reply_err("query: the board has no shards"));
        };
        let mut snap = self
            .query_as(
                view,
                Some(&shard),
                vec!["rank".into(), member.into()],
                now,
                true,
            )
            .await?;
        let row = rows_of(std::mem::take(&mut snap.subset))?
            .into_iter()
            .next();
        Ok((shard, row, snap))
    }

    /// [`Store::top`] of a sharded board.
    pub(super) async fn sharded_top(
        &self,
        view: &View<'_>,
        offset: u64,
        limit: u64,
        now: i64,
    ) -> Result<Page, StoreError> {
        if offset.saturating_add(limit) > SHARDED_DEPTH {
            return Err(reply_err(format!(
                "query: a page of a sharded board reaches at most rank {SHARDED_DEPTH}"
            )));
        }
        let depth = offset + limit;
        let snaps = self
            .each_shard(
                view,
                None,
                vec!["top".into(), 0.into(), (depth as i64).into()],
                now,
            )
            .await?;
        let mut rows = Vec::new();
        for snap in &snaps {
            rows.extend(rows_of(snap.subset.clone())?);
        }
        rows.sort_by(board_order);
        rows.truncate(depth as usize);
        let start = (offset as usize).min(rows.len());
        // Every entry above the page is here: the first row's competition rank counts them.
        let competition = rows.get(start).map_or(0, |first| {
            rows[..start]
                .iter()
                .filter(|r| r.total > first.total)
                .count() as u64
                + 1
        });
        let first = Firsts {
            start: offset,
            competition,
            dense: None,
        };
        let count = snaps.iter().map(|s| s.count).sum();
        let page = entries(view.board(), flat(&rows[start..]), first, count)?;
        Ok(Self::page(view, None, joined(&snaps, None, page)))
    }

    /// [`Store::rank`] of a sharded board: one call to the member's shard, then one to
    /// each other shard, at once.
    pub(super) async fn sharded_rank(
        &self,
        view: &View<'_>,
        member: &str,
        now: i64,
    ) -> Result<MemberRank, StoreError> {
        let (shard, own, own_snap) = self.own_row(view, member, now).await?;
        let rows: Vec<&Row> = own.iter().collect();
        let (placed, mut snaps) = self.placed(view, Some(&shard), &rows, now).await?;
        // On its own shard the member is `rank` and has `competition - 1` greater totals.
        let own_above = own_snap.rank.map_or(0, |r| r - 1);
        let own_greater = own_snap.first_competition.saturating_sub(1);
        snaps.push(own_snap);
        let count = snaps.iter().map(|s| s.count).sum();
        let Some(row) = own.as_ref() else {
            return Ok(Self::member_rank(
                view,
                None,
                member,
                joined(&snaps, None, Vec::new()),
            ));
        };
        let above = own_above + placed.iter().map(|p| p[0].0).sum::<u64>();
        let greater = own_greater + placed.iter().map(|p| p[0].1).sum::<u64>();
        let first = Firsts {
            start: above,
            competition: greater + 1,
            dense: None,
        };
        let found = entries(view.board(), flat(std::slice::from_ref(row)), first, count)?;
        Ok(Self::member_rank(
            view,
            None,
            member,
            joined(&snaps, Some(above + 1), found),
        ))
    }

    /// [`Store::around`] of a sharded board.
    pub(super) async fn sharded_around(
        &self,
        view: &View<'_>,
        member: &str,
        radius: u64,
        now: i64,
    ) -> Result<Result<Page, MemberRank>, StoreError> {
        let (_, Some(own), _) = self.own_row(view, member, now).await? else {
            return Ok(Err(self.sharded_rank(view, member, now).await?));
        };
        let args: Vec<Value> = vec![
            "near".into(),
            own.score.clone(),
            own.z.as_str().into(),
            (radius as i64).into(),
        ];
        let snaps = self.each_shard(view, None, args, now).await?;
        // Each shard's `near` rank is the place the member takes there, plus one.
        let mut above = 0;
        let mut greater = 0;
        let mut rows = Vec::new();
        for snap in &snaps {
            let at = snap
                .rank
                .ok_or_else(|| reply_err("query: a shard gave no place"))?;
            above += at - 1;
            greater += snap.first_competition;
            rows.extend(rows_of(snap.subset.clone())?);
        }
        rows.sort_by(board_order);
        let Some(i) = rows.iter().position(|r| r.z == own.z) else {
            // The member left its shard's ranking between the two reads.
            return Ok(Err(self.sharded_rank(view, member, now).await?));
        };
        let radius = radius as usize;
        let (lo, hi) = (i.saturating_sub(radius), (i + radius + 1).min(rows.len()));
        let page = &rows[lo..hi];
        let start = above - (i - lo) as u64;
        let competition = match page.first() {
            Some(first) if first.total == own.total => greater + 1,
            Some(first) => {
                let first_row = [first];
                let (placed, _) = self.placed(view, None, &first_row, now).await?;
                placed.iter().map(|p| p[0].1).sum::<u64>() + 1
            }
            None => 0,
        };
        let first = Firsts {
            start,
            competition,
            dense: None,
        };
        let count = snaps.iter().map(|s| s.count).sum();
        let found = entries(view.board(), flat(page), first, count)?;
        Ok(Ok(Self::page(
            view,
            None,
            joined(&snaps, Some(above + 1), found),
        )))
    }

    /// [`Store::ranks`] of a sharded board (`members` without repeats).
    pub(super) async fn sharded_ranks(
        &self,
        view: &View<'_>,
        members: &[&str],
        now: i64,
    ) -> Result<Subset, StoreError> {
        // Each member's row on its shard: one `ranks` call per shard holding any of them.
        let mut by_shard: std::collections::BTreeMap<String, Vec<usize>> = Default::default();
        for (i, member) in members.iter().enumerate() {
            let shard = view
                .board()
                .shard_of(member)
                .ok_or_else(|| reply_err("query: the board has no shards"))?;
            by_shard.entry(shard).or_default().push(i);
        }
        let answers = try_join_all(by_shard.iter().map(|(shard, of_shard)| {
            let mut args: Vec<Value> = vec!["ranks".into()];
            args.extend(of_shard.iter().map(|&i| Value::from(members[i])));
            async move { self.query_as(view, Some(shard), args, now, true).await }
        }))
        .await?;
        // Per member: its row, its shard's index and its place there (entries above it,
        // entries with a greater total), as that shard answered.
        let names = view.board().shard_names();
        let mut own: Vec<Option<Own>> = members.iter().map(|_| None).collect();
        for ((shard, of_shard), snap) in by_shard.iter().zip(answers) {
            if snap.subset.len() != 5 * of_shard.len() {
                return Err(reply_err("query: five fields per member expected"));
            }
            let at = names.iter().position(|n| n == shard).unwrap_or_default();
            for (&i, fields) in of_shard.iter().zip(snap.subset.chunks_exact(5)) {
                let number = |v: &Value| as_i64(v).and_then(|n| u64::try_from(n).ok());
                if let (Some(rank), Some(competition)) = (number(&fields[0]), number(&fields[3])) {
                    let row = rows_of(fields[1..3].to_vec())?.into_iter().next();
                    own[i] = row.map(|row| (row, at, (rank, competition.saturating_sub(1))));
                }
            }
        }
        let ranked: Vec<&Row> = own.iter().flatten().map(|(row, _, _)| row).collect();
        let (placed, snaps) = self.placed(view, None, &ranked, now).await?;
        // The rows `ranks` answers (see query.lua), with each member's place on the board:
        // on its own shard as that shard answered first (an apply between the two reads
        // could otherwise place the member against its own newer entry).
        let mut rows = Vec::with_capacity(5 * members.len());
        let mut k = 0;
        for found in &own {
            match found {
                Some((row, at, (own_above, own_greater))) => {
                    let others = || placed.iter().enumerate().filter(|(t, _)| t != at);
                    let above = own_above + others().map(|(_, p)| p[k].0).sum::<u64>();
                    let greater = own_greater + others().map(|(_, p)| p[k].1).sum::<u64>();
                    k += 1;
                    rows.extend([
                        Value::from(above as i64),
                        Value::from(row.z.as_str()),
                        row.score.clone(),
                        Value::from(greater as i64 + 1),
                        Value::from(0),
                    ]);
                }
                None => rows.extend([
                    Value::from(-1),
                    Value::Boolean(false),
                    Value::Boolean(false),
                    Value::from(0),
                    Value::from(0),
                ]),
            }
        }
        let mut snap = joined(&snaps, None, Vec::new());
        snap.subset = rows;
        subset(view, None, members, snap)
    }
}
