//! The reads: top, rank, around and a subset's ranks, each one `query.lua` call decoded
//! into a page.

use fred::prelude::*;

use super::{
    as_array, as_i64, as_string, parse_watermark, reply_err, score, tie_flag, Store, StoreError,
};
use crate::domain::board::{Board, Mode, View};
use crate::domain::keys::{InstanceKeys, Keys};
use crate::domain::ranking::{
    decode_member, Entry, Envelope, MemberRank, MemberWindows, Page, Percentile, Subset,
    SubsetEntry, WindowRank,
};

pub(super) struct Snapshot {
    pub(super) count: u64,
    /// The member's 1-based rank (or the answer's position, plus one, for `near`).
    pub(super) rank: Option<u64>,
    /// The first row's competition rank (the entries with a greater total, for `near`).
    pub(super) first_competition: u64,
    pub(super) window_from: i64,
    pub(super) window_to: i64,
    pub(super) as_of: Option<i64>,
    pub(super) entries: Vec<Entry>,
    /// The rows of a `ranks` call, or of any call decoded `raw`, undecoded (empty for the
    /// other calls).
    pub(super) subset: Vec<Value>,
}

impl Store {
    /// The Hash that holds the tie-break time of each ranked member's ZSet member.
    fn lookup(&self, board: &Board, k: &InstanceKeys) -> String {
        match board.mode {
            Mode::Incremental => k.members(),
            Mode::Resummarize => k.ranked(),
        }
    }

    /// The keys `query.lua` reads for one window of an instance: its `meta`, `result`,
    /// lookup and, on a dense_rank board, `dense`.
    fn query_keys(&self, view: &View<'_>, scope: Option<&str>) -> Vec<String> {
        let board = view.board();
        let k = self.instance(view, scope);
        let mut keys = vec![k.meta(), k.result(), self.lookup(board, &k)];
        keys.extend(board.dense_rank.then(|| k.dense()));
        keys
    }

    /// The sum of this process's write counters of what a query of `scope` in the window
    /// `view` reads (see [`super::Generations`]): every window's instance (they share its
    /// hash tag), every shard of a sharded board, and the board's own watermark. It grows
    /// whenever this process writes any of them.
    pub fn read_generation(&self, view: &View<'_>, scope: Option<&str>) -> u64 {
        let board = view.board();
        let mut keys = vec![self.keys.window(&board.name)];
        if scope.is_none() && board.is_sharded() {
            keys.extend(
                board
                    .shard_names()
                    .iter()
                    .map(|shard| self.instance(view, Some(shard)).meta()),
            );
        } else {
            keys.push(self.instance(view, scope).meta());
        }
        self.generations.of(keys.iter().map(String::as_str))
    }

    pub(super) async fn query(
        &self,
        view: &View<'_>,
        scope: Option<&str>,
        args: Vec<Value>,
        now: i64,
    ) -> Result<Snapshot, StoreError> {
        let subset = args.first().and_then(|op| op.as_str()).as_deref() == Some("ranks");
        self.query_as(view, scope, args, now, subset).await
    }

    /// One `query.lua` call (`args` without the tie-break, which is added here) of the
    /// instance `scope` in the window `view`, decoded; with `raw` its rows are left
    /// undecoded, in [`Snapshot::subset`].
    pub(super) async fn query_as(
        &self,
        view: &View<'_>,
        scope: Option<&str>,
        mut args: Vec<Value>,
        now: i64,
        raw: bool,
    ) -> Result<Snapshot, StoreError> {
        let keys = self.query_keys(view, scope);
        args.insert(1, Value::from(tie_flag(view.board())));
        let views = std::slice::from_ref(view);
        let (out, board_watermarks, board_rolled) = self.snapshot(views, scope, keys, args).await?;
        let board_watermark = board_watermarks.into_iter().next().flatten();
        decode(view, out, board_watermark, board_rolled, raw, now)
    }

    /// The script call and, for a scoped instance, the board's watermark of each of
    /// `views` (the windows read) and its last roll, read beside it.
    ///
    /// A scoped instance follows the board's watermark too (see [`Store::raise_board_watermark`]);
    /// both reads go out together on one connection, so this costs no extra round trip.
    /// The watermark lives in another slot, which may move on its own: it is retried like
    /// the script call.
    async fn snapshot(
        &self,
        views: &[View<'_>],
        scope: Option<&str>,
        keys: Vec<String>,
        args: Vec<Value>,
    ) -> Result<(Value, Vec<Option<i64>>, Option<i64>), StoreError> {
        let client = self.reader();
        let snapshot = self.timed(
            &self.scripts.query,
            Box::pin(super::redirected(|| {
                self.fcall(client, &self.scripts.query, keys.clone(), args.clone())
            })),
        );
        let Some(first) = views.first().filter(|_| scope.is_some()) else {
            return Ok((snapshot.await?, vec![None; views.len()], None));
        };
        let window = self.keys.window(&first.board().name);
        let mut fields: Vec<String> = views
            .iter()
            .map(|v| Keys::floor_field(v.window_suffix().as_deref()))
            .collect();
        fields.push("last_roll".to_string());
        let board_watermark = Box::pin(super::redirected(|| {
            client.hmget::<Vec<Option<String>>, _, _>(window.as_str(), fields.clone())
        }));
        let (out, mut read) = tokio::try_join!(snapshot, board_watermark)?;
        let rolled = read.pop().flatten().and_then(|t| t.parse::<i64>().ok());
        let watermarks = read
            .into_iter()
            .map(parse_watermark)
            .collect::<Result<Vec<_>, _>>()?;
        Ok((out, watermarks, rolled))
    }

    pub(super) fn page(view: &View<'_>, scope: Option<&str>, snap: Snapshot) -> Page {
        Page {
            envelope: envelope(view, scope, &snap),
            entries: snap.entries,
        }
    }

    pub(super) fn member_rank(
        view: &View<'_>,
        scope: Option<&str>,
        member: &str,
        snap: Snapshot,
    ) -> MemberRank {
        let board = view.board();
        let envelope = envelope(view, scope, &snap);
        let entry = snap
            .entries
            .into_iter()
            .next()
            .filter(|_| snap.rank.is_some());
        MemberRank {
            envelope,
            member: member.to_string(),
            rank: entry.as_ref().map(|e| e.rank),
            competition_rank: entry.as_ref().map(|e| e.competition_rank),
            dense_rank: board
                .dense_rank
                .then(|| entry.as_ref().and_then(|e| e.dense_rank)),
            percentile: entry.as_ref().map(|e| e.percentile),
            total: entry.as_ref().map(|e| e.total),
            last_ts: entry.and_then(|e| e.last_ts),
        }
    }

    /// The ranking from position `offset` (0-based), at most `limit` entries.
    pub async fn top(
        &self,
        view: &View<'_>,
        scope: Option<&str>,
        offset: u64,
        limit: u64,
        now: i64,
    ) -> Result<Page, StoreError> {
        if scope.is_none() && view.board().is_sharded() {
            return self.sharded_top(view, offset, limit, now).await;
        }
        let snap = self
            .query(
                view,
                scope,
                vec![
                    "top".into(),
                    (offset.min(i64::MAX as u64) as i64).into(),
                    (limit as i64).into(),
                ],
                now,
            )
            .await?;
        Ok(Self::page(view, scope, snap))
    }

    /// The position of `member`; its rank fields are null when it is not on the board.
    pub async fn rank(
        &self,
        view: &View<'_>,
        scope: Option<&str>,
        member: &str,
        now: i64,
    ) -> Result<MemberRank, StoreError> {
        if scope.is_none() && view.board().is_sharded() {
            return self.sharded_rank(view, member, now).await;
        }
        let snap = self
            .query(view, scope, vec!["rank".into(), member.into()], now)
            .await?;
        Ok(Self::member_rank(view, scope, member, snap))
    }

    /// The position of `member` in every window of `board`, in the configuration's order
    /// (one on a board with one window, and on a period board, whose `scope` is then the
    /// period's instance): rank fields null in a window where it is not ranked.
    ///
    /// One round trip: every window's instance of one scope shares its hash tag, so one
    /// `query.lua` call (`windows`) reads the member in each of them, one snapshot of
    /// them all (an apply writes every window in one call, so no answer shows it in one
    /// window and not yet in another); a scoped instance's board watermarks go out beside
    /// it on the same connection, as for every query.
    pub async fn rank_in_windows(
        &self,
        board: &Board,
        scope: Option<&str>,
        member: &str,
        now: i64,
    ) -> Result<MemberWindows, StoreError> {
        let views: Vec<View<'_>> = if board.period.is_some() {
            vec![board.widest()]
        } else {
            board
                .window_list()
                .iter()
                .filter_map(|w| board.view(Some(&w.name)))
                .collect()
        };
        let windows = if scope.is_none() && board.is_sharded() {
            // One read of the shards per window (the windows of one shard share its
            // hash tag, but a member's place in each needs every shard).
            let mut windows = Vec::with_capacity(views.len());
            for view in &views {
                let rank = self.sharded_rank(view, member, now).await?;
                windows.push(WindowRank::of(view.window_name().to_string(), &rank));
            }
            windows
        } else {
            self.windows_in_one_call(board, &views, scope, member, now)
                .await?
        };
        Ok(MemberWindows {
            board: board.name.clone(),
            scope: scope.map(str::to_string),
            scale: board.scale,
            member: member.to_string(),
            period: None,
            windows,
        })
    }

    /// The member's rank in each of `views` (the windows of one instance of `board`), from
    /// one `query.lua` call (`windows`) reading them all: one snapshot.
    async fn windows_in_one_call(
        &self,
        board: &Board,
        views: &[View<'_>],
        scope: Option<&str>,
        member: &str,
        now: i64,
    ) -> Result<Vec<WindowRank>, StoreError> {
        let mut keys = Vec::new();
        for view in views {
            keys.extend(self.query_keys(view, scope));
        }
        let per_window = keys.len() / views.len().max(1);
        let args: Vec<Value> = vec![
            "windows".into(),
            tie_flag(board).into(),
            member.into(),
            (per_window as i64).into(),
        ];
        let (out, board_watermarks, board_rolled) = self.snapshot(views, scope, keys, args).await?;
        let answers = as_array(out).ok_or_else(|| reply_err("query: not an array"))?;
        if answers.len() != views.len() {
            return Err(reply_err(format!(
                "query: {} answers for {} windows",
                answers.len(),
                views.len()
            )));
        }
        let mut windows = Vec::with_capacity(views.len());
        for ((view, out), watermark) in views.iter().zip(answers).zip(board_watermarks) {
            let snap = decode(view, out, watermark, board_rolled, false, now)?;
            let rank = Self::member_rank(view, scope, member, snap);
            windows.push(WindowRank::of(view.window_name().to_string(), &rank));
        }
        Ok(windows)
    }

    /// The ranks of `members` (one listed twice is answered once) on the board and among themselves, in
    /// one script call: the ranked ones in the board's order, then the others as listed.
    /// Callers pass at most [`MAX_RANKS_MEMBERS`](crate::domain::limits::MAX_RANKS_MEMBERS),
    /// which keeps that call (and on a sharded board each shard's) within
    /// [`MAX_REQUEST_ARGS`](crate::domain::limits::MAX_REQUEST_ARGS).
    pub async fn ranks(
        &self,
        view: &View<'_>,
        scope: Option<&str>,
        members: &[&str],
        now: i64,
    ) -> Result<Subset, StoreError> {
        let mut seen = std::collections::HashSet::new();
        let members: Vec<&str> = members
            .iter()
            .copied()
            .filter(|m| seen.insert(*m))
            .collect();
        if scope.is_none() && view.board().is_sharded() {
            return self.sharded_ranks(view, &members, now).await;
        }
        let mut args: Vec<Value> = Vec::with_capacity(members.len() + 1);
        args.push("ranks".into());
        args.extend(members.iter().map(|&m| Value::from(m)));
        let snap = self.query(view, scope, args, now).await?;
        subset(view, scope, &members, snap)
    }

    /// The entries from `rank - radius` to `rank + radius` around `member`; when the
    /// member is not on the board, its rank answer instead (rank fields null), so that
    /// "not on the board" has the one shape of [`Store::rank`]'s.
    pub async fn around(
        &self,
        view: &View<'_>,
        scope: Option<&str>,
        member: &str,
        radius: u64,
        now: i64,
    ) -> Result<Result<Page, MemberRank>, StoreError> {
        if scope.is_none() && view.board().is_sharded() {
            return self.sharded_around(view, member, radius, now).await;
        }
        let snap = self
            .query(
                view,
                scope,
                vec!["around".into(), member.into(), (radius as i64).into()],
                now,
            )
            .await?;
        if snap.rank.is_none() {
            return Ok(Err(Self::member_rank(view, scope, member, snap)));
        }
        Ok(Ok(Self::page(view, scope, snap)))
    }
}

/// One `query.lua` answer (`out`) decoded for the window `view` read: the board's
/// watermark of that window and last roll, for a scoped instance, are read beside it.
pub(super) fn decode(
    view: &View<'_>,
    out: Value,
    board_watermark: Option<i64>,
    board_rolled: Option<i64>,
    subset: bool,
    now: i64,
) -> Result<Snapshot, StoreError> {
    let board = view.board();
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
    let first_dense = stamp()
        .and_then(|d| u64::try_from(d).ok())
        .filter(|_| board.dense_rank);
    // When the ranking last changed: an incremental ranking changes with every apply
    // and every roll (the board's own, for a scope); a resummarize ranking only when a
    // run swaps in a new sum.
    let as_of = match board.mode {
        Mode::Incremental => changed.max(rolled).max(board_rolled),
        Mode::Resummarize => summed,
    };
    let (window_from, window_to) = view.live_range(now, expired);
    let (entries, subset) = if subset {
        (Vec::new(), rows)
    } else {
        let first = Firsts {
            start,
            competition: first_competition,
            dense: first_dense,
        };
        (entries(board, rows, first, count)?, Vec::new())
    };
    Ok(Snapshot {
        count,
        rank: u64::try_from(rank).ok().map(|r| r + 1),
        first_competition,
        window_from,
        window_to,
        as_of,
        entries,
        subset,
    })
}

/// The subset answer from the script's `ranks` rows (five per member asked, in order).
pub(super) fn subset(
    view: &View<'_>,
    scope: Option<&str>,
    members: &[&str],
    snap: Snapshot,
) -> Result<Subset, StoreError> {
    let board = view.board();
    let count = snap.count;
    let envelope = envelope(view, scope, &snap);
    let mut ranked = Vec::new();
    let mut unranked = Vec::new();
    let mut rows = snap.subset.into_iter();
    for member in members {
        let mut field = || rows.next().ok_or_else(|| reply_err("query: missing row"));
        let (rank, z, s, competition, dense) = (field()?, field()?, field()?, field()?, field()?);
        let rank = as_i64(&rank).and_then(|r| u64::try_from(r).ok());
        let not_ranked = SubsetEntry {
            member: member.to_string(),
            rank: None,
            competition_rank: None,
            dense_rank: board.dense_rank.then_some(None),
            subset_rank: None,
            total: None,
            percentile: None,
        };
        let Some(rank) = rank.map(|r| r + 1) else {
            unranked.push(not_ranked);
            continue;
        };
        let total = score(&s)
            .ok_or_else(|| reply_err(format!("query: score {s:?} is not an exact integer")))?;
        let z = as_string(z).ok_or_else(|| reply_err("query: member is not text"))?;
        let (decoded, _) = decode_member(board.tie_break, &z);
        if decoded != *member {
            return Err(reply_err(format!(
                "query: {member:?} read back as {decoded:?}"
            )));
        }
        let percentile = Percentile::of(rank, count)
            .ok_or_else(|| reply_err(format!("query: rank {rank} beyond count {count}")))?;
        ranked.push(SubsetEntry {
            rank: Some(rank),
            competition_rank: as_i64(&competition).and_then(|c| u64::try_from(c).ok()),
            dense_rank: board
                .dense_rank
                .then(|| as_i64(&dense).and_then(|d| u64::try_from(d).ok())),
            total: Some(total),
            percentile: Some(percentile),
            ..not_ranked
        });
    }
    // The board's position orders the subset exactly as the board does (total, then the
    // tie-break, then the member's bytes).
    ranked.sort_by_key(|e| e.rank);
    for (i, e) in ranked.iter_mut().enumerate() {
        e.subset_rank = Some(i as u64 + 1);
    }
    ranked.extend(unranked);
    Ok(Subset {
        envelope,
        entries: ranked,
    })
}

/// The envelope of an answer from `snap`, a read of the instance `scope` in the window
/// `view`.
fn envelope(view: &View<'_>, scope: Option<&str>, snap: &Snapshot) -> Envelope {
    Envelope {
        board: view.board().name.clone(),
        scope: scope.map(str::to_string),
        window: view.window_name().to_string(),
        scale: view.board().scale,
        count: snap.count,
        window_from: snap.window_from,
        window_to: snap.window_to,
        as_of: snap.as_of,
    }
}

/// What a page's first row is, by the script's answer.
pub(super) struct Firsts {
    /// Its 0-based position.
    pub(super) start: u64,
    /// Its competition rank.
    pub(super) competition: u64,
    /// Its dense rank, on `dense_rank` boards.
    pub(super) dense: Option<u64>,
}

/// The entries of a page from the script's `member, score` rows: ranks from `start + 1`,
/// competition ranks from the first row's, shared by equal totals; dense ranks from the
/// first row's, one more at each lower total (a page holds every member between its
/// first and last row, so every distinct total between them is on it); percentiles among
/// the snapshot's `count` ranked members.
pub(super) fn entries(
    board: &Board,
    rows: Vec<Value>,
    first: Firsts,
    count: u64,
) -> Result<Vec<Entry>, StoreError> {
    let Firsts {
        start,
        competition: first_competition,
        dense: first_dense,
    } = first;
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
        let dense_rank = match entries.last() {
            None => first_dense,
            Some(prev) if prev.total == total => prev.dense_rank,
            Some(prev) => prev.dense_rank.map(|d| d + 1),
        };
        let percentile = Percentile::of(rank, count)
            .ok_or_else(|| reply_err(format!("query: rank {rank} beyond count {count}")))?;
        entries.push(Entry {
            rank,
            competition_rank,
            dense_rank,
            percentile,
            member,
            total,
            last_ts,
        });
    }
    Ok(entries)
}
