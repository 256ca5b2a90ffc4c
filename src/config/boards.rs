//! `[[boards]]`: each board's event fields, window and slice, mode and tie break, validated
//! into a [`Board`]; and the checks across boards (distinct names, slices the digest table
//! can tell apart).

use std::collections::HashSet;

use serde::Deserialize;

use super::error::{invalid, ConfigError};
use super::values::{non_empty, positive_duration};
use crate::domain::board::{is_board_name, Board, Dedup, Mode, TieBreak};

/// Most slices a board's window and `ingest.max_future` may span together: the digest
/// table tags each remembered id with its slice number mod 2^32 and counts it while the
/// tag is less than 2^31 slices above the slice whose ids may be forgotten (`counts` in
/// `fold.lua` and `apply.lua`); a few slices of margin for the rounding of each bound.
pub const MAX_SLICES_REACHED: i64 = (1 << 31) - 4;

/// One `[[boards]]` entry as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBoard {
    /// `name`: the board's name, `[a-z0-9_-]{1,64}`.
    name: String,
    /// `member`: the event field ranked.
    member: String,
    /// `scope`: the event field that splits the board into instances, if any.
    #[serde(default)]
    scope: Option<String>,
    /// `amount`: the event field summed.
    #[serde(default = "default_amount")]
    amount: String,
    /// `scale`: decimal places of the amount.
    #[serde(default)]
    scale: i64,
    /// `window`: how far back the board counts.
    window: String,
    /// `slice`: the window's granularity.
    slice: String,
    /// `mode`: `incremental` or `resummarize`.
    #[serde(default = "default_mode")]
    mode: String,
    /// `tie_break`: `earliest`, `latest` or `none`.
    #[serde(default = "default_tie_break")]
    tie_break: String,
    /// `allow_negative`: whether amounts below zero are accepted.
    #[serde(default)]
    allow_negative: bool,
    /// `dense_rank`: whether answers carry a dense rank (1, 1, 2), kept exact on every write.
    #[serde(default)]
    dense_rank: bool,
}

fn default_amount() -> String {
    "amount".into()
}
fn default_mode() -> String {
    "incremental".into()
}
fn default_tie_break() -> String {
    "earliest".into()
}

/// The validated boards, in file order, each deduplicating by `dedup`; `max_future_ms` is
/// `ingest.max_future`.
pub(super) fn validate(
    raw: Vec<RawBoard>,
    dedup: Dedup,
    max_future_ms: i64,
) -> Result<Vec<Board>, ConfigError> {
    let mut names = HashSet::new();
    let mut boards = Vec::with_capacity(raw.len());
    for (i, raw) in raw.into_iter().enumerate() {
        let board = raw.validate(i, dedup)?;
        // The digest table tags each remembered id with its slice number mod 2^32 and
        // keeps it while the tag is less than 2^31 slices above the forget point: the
        // window's slices plus those an event ahead of the clock can land in must fit.
        let reach = board.slices_in_window() + max_future_ms / board.slice_ms;
        if reach > MAX_SLICES_REACHED {
            return Err(invalid(
                format!("boards[{i}].slice"),
                format!("{}ms", board.slice_ms),
                format!(
                    "too narrow: the window and ingest.max_future span {reach} slices, at \
                     most {MAX_SLICES_REACHED} are allowed"
                ),
            ));
        }
        if !names.insert(board.name.clone()) {
            return Err(invalid(
                format!("boards[{i}].name"),
                &board.name,
                "duplicate board name",
            ));
        }
        boards.push(board);
    }
    Ok(boards)
}

/// The event fields a board reads.
struct Fields {
    /// The ranked field.
    member: String,
    /// The summed field.
    amount: String,
    /// The field that splits the board, if any.
    scope: Option<String>,
}

impl RawBoard {
    /// The board at `boards[i]`.
    fn validate(self, i: usize, dedup: Dedup) -> Result<Board, ConfigError> {
        let key = |k: &str| format!("boards[{i}].{k}");
        if !is_board_name(&self.name) {
            return Err(invalid(
                key("name"),
                &self.name,
                "must match [a-z0-9_-]{1,64}",
            ));
        }
        let Fields {
            member,
            amount,
            scope,
        } = self.fields(&key)?;
        if !(0..=15).contains(&self.scale) {
            return Err(invalid(
                key("scale"),
                self.scale.to_string(),
                "must be between 0 and 15",
            ));
        }
        let (window_ms, slice_ms) = self.span(&key)?;
        Ok(Board {
            mode: self.mode(&key)?,
            tie_break: self.tie_break(&key)?,
            name: self.name,
            member,
            scope,
            amount,
            scale: self.scale as u32,
            window_ms,
            slice_ms,
            allow_negative: self.allow_negative,
            dense_rank: self.dense_rank,
            dedup,
        })
    }

    /// `member`, `amount` and `scope`: given, and three different fields.
    fn fields(&self, key: &impl Fn(&str) -> String) -> Result<Fields, ConfigError> {
        let member = non_empty(&key("member"), &self.member)?;
        let amount = non_empty(&key("amount"), &self.amount)?;
        let scope = match &self.scope {
            Some(s) => Some(non_empty(&key("scope"), s)?),
            None => None,
        };
        if scope.as_deref() == Some(member.as_str())
            || member == amount
            || scope.as_deref() == Some(amount.as_str())
        {
            return Err(invalid(
                key("member"),
                &member,
                "member, scope and amount must be different fields",
            ));
        }
        Ok(Fields {
            member,
            amount,
            scope,
        })
    }

    /// `window` and `slice` in ms: the window a whole number of slices.
    fn span(&self, key: &impl Fn(&str) -> String) -> Result<(i64, i64), ConfigError> {
        let window_ms = positive_duration(&key("window"), &self.window)?;
        let slice_ms = positive_duration(&key("slice"), &self.slice)?;
        if window_ms % slice_ms != 0 {
            return Err(invalid(
                key("window"),
                &self.window,
                format!("must be a whole multiple of the slice ({})", self.slice),
            ));
        }
        Ok((window_ms, slice_ms))
    }

    fn mode(&self, key: &impl Fn(&str) -> String) -> Result<Mode, ConfigError> {
        match self.mode.as_str() {
            "incremental" => Ok(Mode::Incremental),
            "resummarize" => Ok(Mode::Resummarize),
            other => Err(invalid(
                key("mode"),
                other,
                "expected incremental or resummarize",
            )),
        }
    }

    fn tie_break(&self, key: &impl Fn(&str) -> String) -> Result<TieBreak, ConfigError> {
        match self.tie_break.as_str() {
            "earliest" => Ok(TieBreak::Earliest),
            "latest" => Ok(TieBreak::Latest),
            "none" => Ok(TieBreak::None),
            other => Err(invalid(
                key("tie_break"),
                other,
                "expected earliest, latest or none",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::testing::{refusal, BOARD};

    #[test]
    fn board_refusals_name_key_and_value() {
        let e = refusal(&BOARD.replace("7d", "7h5m"));
        assert!(e.contains("boards[0].window") && e.contains("7h5m"), "{e}");
        let e = refusal(&BOARD.replace("\"7d\"", "\"25h\""));
        assert!(
            e.contains("boards[0].window") && e.contains("whole multiple"),
            "{e}"
        );
        let e = refusal(&BOARD.replace("\"r\"", "\"Rooms!\""));
        assert!(e.contains("boards[0].name") && e.contains("Rooms!"), "{e}");
        let e = refusal(&format!("{BOARD}{BOARD}"));
        assert!(
            e.contains("boards[1].name") && e.contains("duplicate"),
            "{e}"
        );
        let e = refusal(&format!("{BOARD}mode = \"fast\"\n"));
        assert!(e.contains("boards[0].mode") && e.contains("fast"), "{e}");
        let e = refusal(&format!("{BOARD}bogus = 1\n"));
        assert!(e.contains("bogus"), "{e}");
    }

    #[test]
    fn a_window_beyond_a_hundred_years_is_refused() {
        let e = refusal(&BOARD.replace("\"7d\"", "\"10000000000d\""));
        assert!(
            e.contains("boards[0].window") && e.contains("36500d"),
            "{e}"
        );
    }
}
