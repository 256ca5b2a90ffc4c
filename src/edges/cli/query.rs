//! `rollboard top|rank|around`: the read commands, answered at Redis's clock, and the
//! checks of their board, scope, window and member arguments.

use super::connect::connect;
use super::output::{head_line, member_width};
use super::periods::{period_of, period_rank, print_period_page};
use super::time::{as_of, show_time};
use super::{Usage, EXIT_NOT_FOUND};
use crate::config::Settings;
use crate::domain::board::{Board, View};
use crate::domain::event::check_name;
use crate::domain::limits::MAX_RANKS_MEMBERS;
use crate::domain::ranking::{format_total, MemberRank, MemberWindows, Subset};
use crate::edges::periods::Selected;
use crate::store::{Store, SHARDED_DEPTH};

/// Looks up a board and checks the scope argument against it.
pub fn resolve_board<'a>(
    settings: &'a Settings,
    name: &str,
    scope: Option<&str>,
) -> Result<&'a Board, Usage> {
    let board = settings
        .board(name)
        .ok_or_else(|| Usage(format!("unknown board {name:?}")))?;
    match (&board.scope, scope) {
        (Some(field), None) => Err(Usage(format!(
            "board {name} is scoped by `{field}`: give --scope"
        ))),
        (None, Some(_)) => Err(Usage(format!("board {name} is not scoped: drop --scope"))),
        (_, Some(s)) => check_name(s.as_bytes())
            .map(|_| board)
            .map_err(|why| Usage(format!("scope {why}"))),
        _ => Ok(board),
    }
}

/// The ranking a read command reads of its board: of the instance `--scope` and `--period`
/// name, in the window `--window` names (`rank --all-windows` reads all of its windows).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Ranking<'a> {
    /// The scope value, on a scoped board.
    pub scope: Option<&'a str>,
    /// The period of a period board (the current one when absent).
    pub period: Option<&'a str>,
    /// The window (the first configured when absent).
    pub window: Option<&'a str>,
}

/// The board's window `--window` names: the first configured when absent; a window the
/// board does not rank is a usage error naming those it does.
fn view_of<'a>(board: &'a Board, window: Option<&str>) -> Result<View<'a>, Usage> {
    crate::edges::windows::view(board, window, "--window").map_err(Usage)
}

/// Connects for a read of `board` and reads Redis's clock; the period it names (a bad
/// `--period` is a usage error before any connection: ids need no clock).
async fn open(
    settings: &Settings,
    board: &Board,
    Ranking { scope, period, .. }: Ranking<'_>,
) -> anyhow::Result<(Store, i64, Selected)> {
    period_of(board, scope, period, 0)?;
    let store = connect(settings).await?;
    let now = store.time_ms().await?;
    let selected = period_of(board, scope, period, now)?;
    Ok((store, now, selected))
}

fn check_member(member: &str) -> Result<(), Usage> {
    check_name(member.as_bytes())
        .map(|_| ())
        .map_err(|why| Usage(format!("member {why}")))
}

/// `top`: one page of the board's ranking (of one period on a period board).
pub(super) async fn top(
    settings: &Settings,
    board: &str,
    ranking: Ranking<'_>,
    limit: u64,
    offset: u64,
    json: bool,
) -> anyhow::Result<u8> {
    let scope = ranking.scope;
    let board = resolve_board(settings, board, scope)?;
    let view = view_of(board, ranking.window)?;
    if board.is_sharded() && offset.saturating_add(limit) > SHARDED_DEPTH {
        return Err(Usage(format!(
            "a page of a sharded board reaches at most rank {SHARDED_DEPTH}: --offset + --limit is {}",
            offset.saturating_add(limit)
        ))
        .into());
    }
    let (store, now, selected) = open(settings, board, ranking).await?;
    let page = store
        .top(&view, selected.instance(scope), offset, limit, now)
        .await?;
    print_period_page(page, &selected, scope, json)?;
    Ok(0)
}

/// `rank`: one member's rank (exit 3 when it is not on the board).
pub(super) async fn rank(
    settings: &Settings,
    board: &str,
    member: &str,
    ranking: Ranking<'_>,
    json: bool,
) -> anyhow::Result<u8> {
    let scope = ranking.scope;
    let board = resolve_board(settings, board, scope)?;
    let view = view_of(board, ranking.window)?;
    check_member(member)?;
    let (store, now, selected) = open(settings, board, ranking).await?;
    let rank = store
        .rank(&view, selected.instance(scope), member, now)
        .await?;
    let found = rank.is_ranked();
    let (rank, answer) = period_rank(rank, &selected, scope);
    if json {
        println!("{answer}");
    } else {
        print_rank(&rank);
    }
    Ok(if found { 0 } else { EXIT_NOT_FOUND })
}

/// The text line of `rank`.
fn print_rank(rank: &MemberRank) {
    if let (Some(r), Some(c), Some(t)) = (rank.rank, rank.competition_rank, rank.total) {
        let percentile = rank.percentile.map(|p| p.to_string()).unwrap_or_default();
        let dense = rank
            .dense_rank
            .flatten()
            .map(|d| format!(", dense rank {d}"))
            .unwrap_or_default();
        println!(
            "{} rank {r} (competition rank {c}{dense}) of {} on {} ({}), percentile {percentile}: total {}{}{}",
            rank.member,
            rank.envelope.count,
            rank.envelope.board,
            rank.envelope.window,
            format_total(t, rank.envelope.scale),
            rank.last_ts
                .map(|ts| format!(", last {}", show_time(ts)))
                .unwrap_or_default(),
            as_of(rank.envelope.as_of)
        );
    } else {
        println!(
            "{} is not on {} ({} ranked)",
            rank.member, rank.envelope.board, rank.envelope.count
        );
    }
}

/// `rank` with several members: each one's rank on the board and among them, from one
/// snapshot (exit 3 when none of them is on the board).
pub(super) async fn ranks(
    settings: &Settings,
    board: &str,
    members: &[String],
    ranking: Ranking<'_>,
    json: bool,
) -> anyhow::Result<u8> {
    let scope = ranking.scope;
    let board = resolve_board(settings, board, scope)?;
    let view = view_of(board, ranking.window)?;
    if members.len() > MAX_RANKS_MEMBERS {
        return Err(Usage(format!(
            "rank takes at most {MAX_RANKS_MEMBERS} members, not {}",
            members.len()
        ))
        .into());
    }
    for member in members {
        check_member(member)?;
    }
    let (store, now, selected) = open(settings, board, ranking).await?;
    let names: Vec<&str> = members.iter().map(String::as_str).collect();
    let mut subset = store
        .ranks(&view, selected.instance(scope), &names, now)
        .await?;
    // A period's instance is the board's period, not a scope of its own.
    subset.envelope.scope = scope.map(str::to_string);
    if json {
        println!(
            "{}",
            selected.relabel(serde_json::to_value(&subset)?, scope)
        );
    } else {
        print_subset(&subset);
    }
    let found = subset.entries.iter().any(|e| e.rank.is_some());
    Ok(if found { 0 } else { EXIT_NOT_FOUND })
}

/// The table of `rank` with several members.
fn print_subset(subset: &Subset) {
    println!("{}", head_line(&subset.envelope));
    let width = member_width(subset.entries.iter().map(|e| e.member.as_str()));
    let dense = subset.entries.iter().any(|e| e.dense_rank.is_some());
    println!(
        "{:>6} {:>6} {:>6}{}  {:>6}  {:<width$}  {:>20}",
        "SUB",
        "RANK",
        "COMP",
        if dense { "  DENSE" } else { "" },
        "PCTL",
        "MEMBER",
        "TOTAL"
    );
    let show = |n: Option<u64>| n.map_or_else(|| "-".to_string(), |n| n.to_string());
    for e in &subset.entries {
        let dense = match e.dense_rank {
            Some(d) => format!(" {:>6}", show(d)),
            None => String::new(),
        };
        println!(
            "{:>6} {:>6} {:>6}{dense}  {:>6}  {:<width$}  {:>20}",
            show(e.subset_rank),
            show(e.rank),
            show(e.competition_rank),
            e.percentile
                .map_or_else(|| "-".to_string(), |p| p.to_string()),
            e.member,
            e.total.map_or_else(
                || "not on the board".to_string(),
                |t| format_total(t, subset.envelope.scale)
            ),
        );
    }
}

/// `around`: the entries on each side of one member (exit 3 when it is not on the board).
pub(super) async fn around(
    settings: &Settings,
    board: &str,
    member: &str,
    ranking: Ranking<'_>,
    radius: u64,
    json: bool,
) -> anyhow::Result<u8> {
    let scope = ranking.scope;
    let board = resolve_board(settings, board, scope)?;
    let view = view_of(board, ranking.window)?;
    check_member(member)?;
    let (store, now, selected) = open(settings, board, ranking).await?;
    let instance = selected.instance(scope);
    match store.around(&view, instance, member, radius, now).await? {
        Ok(page) => {
            print_period_page(page, &selected, scope, json)?;
            Ok(0)
        }
        Err(missing) => {
            let (missing, answer) = period_rank(missing, &selected, scope);
            if json {
                println!("{answer}");
            } else {
                println!(
                    "{} is not on {} ({} ranked)",
                    missing.member, missing.envelope.board, missing.envelope.count
                );
            }
            Ok(EXIT_NOT_FOUND)
        }
    }
}

/// `rank --all-windows`: one member's place in every window of the board, from one
/// snapshot (exit 3 when it is ranked in none).
pub(super) async fn rank_all_windows(
    settings: &Settings,
    board: &str,
    member: &str,
    ranking: Ranking<'_>,
    json: bool,
) -> anyhow::Result<u8> {
    let scope = ranking.scope;
    let board = resolve_board(settings, board, scope)?;
    check_member(member)?;
    let (store, now, selected) = open(settings, board, ranking).await?;
    let mut answer = store
        .rank_in_windows(board, selected.instance(scope), member, now)
        .await?;
    selected.relabel_windows(&mut answer, scope);
    if json {
        println!("{}", serde_json::to_string(&answer)?);
    } else {
        print_windows(&answer);
    }
    Ok(if answer.is_ranked() {
        0
    } else {
        EXIT_NOT_FOUND
    })
}

/// The table of `rank --all-windows`: a head line, then one row per window.
fn print_windows(answer: &MemberWindows) {
    let scope = answer
        .scope
        .as_deref()
        .map(|s| format!(" [{s}]"))
        .unwrap_or_default();
    let period = answer
        .period
        .as_deref()
        .map(|p| format!(", period {p}"))
        .unwrap_or_default();
    println!("{} on {}{scope}{period}", answer.member, answer.board);
    let width = answer
        .windows
        .iter()
        .map(|w| w.window.chars().count())
        .max()
        .unwrap_or(6)
        .max(6);
    println!(
        "{:<width$}  {:>6} {:>6} {:>6}  {:>20}  {:>6}  FROM .. TO",
        "WINDOW", "RANK", "COMP", "PCTL", "TOTAL", "COUNT"
    );
    let show = |n: Option<u64>| n.map_or_else(|| "-".to_string(), |n| n.to_string());
    for w in &answer.windows {
        println!(
            "{:<width$}  {:>6} {:>6} {:>6}  {:>20}  {:>6}  {} .. {}",
            w.window,
            show(w.rank),
            show(w.competition_rank),
            w.percentile
                .map_or_else(|| "-".to_string(), |p| p.to_string()),
            w.total.map_or_else(
                || "not ranked".to_string(),
                |t| format_total(t, answer.scale)
            ),
            w.count,
            show_time(w.window_from),
            show_time(w.window_to),
        );
    }
}
