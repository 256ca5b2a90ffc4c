//! The `window` of a query (`window=` over HTTP, a `ranks` body's `"window"`, `--window` on
//! the command line): which of a board's windows it reads.

use crate::domain::board::{Board, View};
use crate::domain::event::shown;

/// The board's window that `window` names (see [`Board::view`]): its name as the
/// configuration writes it (`24h`) or an equal duration (`1d`), the first configured when
/// absent. A calendar-period board's one window is its period: `window` is then its
/// length (`week`) or absent. Anything else is refused with a message naming the board's
/// windows; `option` is how the caller spells the option (`window`, `--window`).
pub fn view<'a>(board: &'a Board, window: Option<&str>, option: &str) -> Result<View<'a>, String> {
    if let Some(calendar) = &board.period {
        let length = calendar.period_name();
        return match window {
            None => Ok(board.widest()),
            Some(w) if w == length => Ok(board.widest()),
            Some(w) => Err(format!(
                "board {} has one period, {length}: {option} must be it or absent, not {}",
                board.name,
                shown(w.as_bytes())
            )),
        };
    }
    board.view(window).ok_or_else(|| {
        let names: Vec<String> = board.window_list().into_iter().map(|w| w.name).collect();
        let asked = shown(window.unwrap_or_default().as_bytes());
        match names.as_slice() {
            [one] => format!(
                "board {} has one window, {one}: {option} must be it or absent, not {asked}",
                board.name
            ),
            _ => format!(
                "board {} has the windows {}: {option} must be one of them (the first when \
                 absent), not {asked}",
                board.name,
                names.join(", ")
            ),
        }
    })
}
