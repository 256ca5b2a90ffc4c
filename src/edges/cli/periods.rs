//! `--period` of `top`, `rank` and `around` on a calendar-period board: the answers
//! printed with the board's scope, the period's id and bounds.

use super::output::print_page;
use super::time::show_time;
use super::Usage;
use crate::domain::board::Board;
use crate::domain::ranking::{MemberRank, Page};
use crate::edges::periods::{select, Selected};

/// The period `--period` names on `board` at `now` (the current one by default).
pub(super) fn period_of(
    board: &Board,
    scope: Option<&str>,
    period: Option<&str>,
    now: i64,
) -> Result<Selected, Usage> {
    select(board, scope, period, now)
        .map_err(|why| Usage(why.to_string().replace("drop the period", "drop --period")))
}

/// Prints a page as `print_page` does, relabelled for its period (JSON: `period`,
/// `window_from`/`window_to` the period's bounds; text: a line naming the period).
pub(super) fn print_period_page(
    mut page: Page,
    selected: &Selected,
    scope: Option<&str>,
    json: bool,
) -> anyhow::Result<()> {
    let Some(span) = selected.span() else {
        return print_page(&page, json);
    };
    if json {
        println!("{}", selected.relabel(serde_json::to_value(&page)?, scope));
        return Ok(());
    }
    println!(
        "period {} ({} .. {})",
        span.id,
        show_time(span.start_ms),
        show_time(span.end_ms)
    );
    page.envelope.scope = scope.map(str::to_string);
    (page.envelope.window_from, page.envelope.window_to) = (span.start_ms, span.end_ms);
    page.envelope.window = selected.length().unwrap_or_default().to_string();
    print_page(&page, false)
}

/// A member answer with the board's scope and the period's bounds, and its JSON with the
/// period's id (see [`Selected::relabel`]).
pub(super) fn period_rank(
    mut rank: MemberRank,
    selected: &Selected,
    scope: Option<&str>,
) -> (MemberRank, serde_json::Value) {
    let found = rank.is_ranked();
    let json = if found {
        serde_json::to_value(&rank).unwrap_or_default()
    } else {
        rank.not_on_board()
    };
    let json = selected.relabel(json, scope);
    if let Some(span) = selected.span() {
        rank.envelope.scope = scope.map(str::to_string);
        (rank.envelope.window_from, rank.envelope.window_to) = (span.start_ms, span.end_ms);
        rank.envelope.window = selected.length().unwrap_or_default().to_string();
    }
    (rank, json)
}
