//! `[[boards]]`: each board's event fields, window and slice (or calendar period), mode and
//! tie break, validated into a [`Board`]; and the checks across boards (distinct names, slices the digest table
//! can tell apart).

use std::collections::HashSet;

use serde::Deserialize;

use super::error::{invalid, ConfigError};
use super::values::{duration, non_empty, positive_duration};
use crate::domain::board::{
    is_board_name, parse_weekday, Board, Calendar, Changes, Dedup, Mode, TieBreak, Window,
    MAX_SHARDS, PERIOD_TICK_MS,
};
use crate::domain::period::Period;

/// `period_grace` when not given: a tip buffered a few minutes across midnight still counts
/// for the day it happened.
pub const DEFAULT_PERIOD_GRACE: &str = "5m";
/// `keep_periods` when not given.
pub const DEFAULT_KEEP_PERIODS: i64 = 12;
/// Most archives a period board may keep.
pub const MAX_KEEP_PERIODS: i64 = 10_000;
/// Longest `period_grace`: a year keeps a period's one slice number within the digest
/// table's reach (see [`MAX_SLICES_REACHED`]; it counts seconds on a period board).
const MAX_PERIOD_GRACE_MS: i64 = 366 * 86_400_000;

/// Largest `changes_top`. One call writes one `passed` entry per pair of members that
/// swap places, up to N(N-1)/2 (300 at 25, about 1 ms of Redis time in the worst case of a
/// top reversed at once; 4 950 at 100 took 13 ms).
pub const MAX_CHANGES_TOP: i64 = 25;
/// `changes_max_len` when not given.
pub const DEFAULT_CHANGES_MAX_LEN: i64 = 10_000;
/// Largest `changes_max_len`.
pub const MAX_CHANGES_MAX_LEN: i64 = 10_000_000;

/// Most windows one board may rank (`windows = [...]`): every apply writes each.
pub const MAX_WINDOWS: usize = 8;

/// Most slices a board's window and `ingest.max_future` may span together: the digest
/// table tags each remembered id with its slice number mod 2^32 and counts it while the
/// tag is less than 2^31 slices above the slice whose ids may be forgotten (`counts` in
/// `fold.lua`); a few slices of margin for the rounding of each bound.
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
    /// `window`: how far back the board counts (not on a period board).
    #[serde(default)]
    window: Option<String>,
    /// `windows`: several windows ranked from one ingest, instead of `window`.
    #[serde(default)]
    windows: Option<Vec<String>>,
    /// `slice`: the window's granularity (not on a period board).
    #[serde(default)]
    slice: Option<String>,
    /// `period`: `day`, `week` or `month`: a calendar-period board instead of a window.
    #[serde(default)]
    period: Option<String>,
    /// `time_zone`: the IANA zone of the periods (default `UTC`).
    #[serde(default)]
    time_zone: Option<String>,
    /// `week_start`: the first day of a week (default `monday`).
    #[serde(default)]
    week_start: Option<String>,
    /// `period_grace`: how long a closed period still takes late events.
    #[serde(default)]
    period_grace: Option<String>,
    /// `keep_periods`: closed periods kept.
    #[serde(default)]
    keep_periods: Option<i64>,
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
    /// `changes_top`: the size of the top whose changes the board's change feed records.
    #[serde(default)]
    changes_top: Option<i64>,
    /// `changes_max_len`: the entries each change stream keeps (approximately, at least).
    #[serde(default)]
    changes_max_len: Option<i64>,
    /// `shards`: how many shards (each its own cluster slot) the ranking is spread over.
    #[serde(default)]
    shards: Option<i64>,
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
        let reach = board.widest().slices_in_window() + max_future_ms / board.slice_ms;
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
        let period = self.calendar(&key)?;
        let (windows, slice_ms) = match period {
            // One slice per period instance, numbered in seconds (see `Calendar::slice_of`).
            Some(_) => (Vec::new(), PERIOD_TICK_MS),
            None => self.span(&key)?,
        };
        // The widest: its instance keeps the idempotency keys (`Board::widest`).
        let window_ms = windows.iter().map(|w| w.ms).max().unwrap_or(PERIOD_TICK_MS);
        if period.is_some() && self.mode != "incremental" {
            return Err(invalid(
                key("mode"),
                &self.mode,
                "a period board is incremental (it never subtracts, nothing to re-sum)",
            ));
        }
        let changes = self.changes(&key)?;
        let shards = self.shards(&key, &scope, period.is_some())?;
        Ok(Board {
            mode: self.mode(&key)?,
            tie_break: self.tie_break(&key)?,
            name: self.name,
            member,
            scope,
            amount,
            scale: self.scale as u32,
            window_ms,
            windows,
            slice_ms,
            allow_negative: self.allow_negative,
            dense_rank: self.dense_rank,
            changes,
            dedup,
            period,
            shards,
        })
    }

    /// `shards`: 1 (the default) to [`MAX_SHARDS`]; more than one only on an unscoped
    /// rolling board without a dense rank or a change feed (each is one instance's, and
    /// the shards' would not add up to the board's).
    fn shards(
        &self,
        key: &impl Fn(&str) -> String,
        scope: &Option<String>,
        period: bool,
    ) -> Result<u32, ConfigError> {
        let Some(shards) = self.shards else {
            return Ok(1);
        };
        if !(1..=i64::from(MAX_SHARDS)).contains(&shards) {
            return Err(invalid(
                key("shards"),
                shards.to_string(),
                format!("must be between 1 and {MAX_SHARDS}"),
            ));
        }
        let refused = [
            (
                scope.is_some(),
                "a scoped board's instances are spread by scope already",
            ),
            (period, "a period board cannot be sharded"),
            (
                self.dense_rank,
                "a dense rank cannot be kept exact across shards",
            ),
            (
                self.changes_top.is_some(),
                "a change feed follows one instance's top, not the shards'",
            ),
        ];
        match refused.into_iter().find(|(is, _)| *is && shards > 1) {
            Some((_, why)) => Err(invalid(key("shards"), shards.to_string(), why)),
            None => Ok(shards as u32),
        }
    }

    /// `changes_top` and `changes_max_len`: the board's change feed, if it has one.
    fn changes(&self, key: &impl Fn(&str) -> String) -> Result<Option<Changes>, ConfigError> {
        let Some(top) = self.changes_top else {
            return match self.changes_max_len {
                Some(len) => Err(invalid(
                    key("changes_max_len"),
                    len.to_string(),
                    "a change stream needs changes_top",
                )),
                None => Ok(None),
            };
        };
        if !(1..=MAX_CHANGES_TOP).contains(&top) {
            return Err(invalid(
                key("changes_top"),
                top.to_string(),
                format!("must be between 1 and {MAX_CHANGES_TOP}"),
            ));
        }
        let max_len = self.changes_max_len.unwrap_or(DEFAULT_CHANGES_MAX_LEN);
        // A stream must hold what one call may write, or a reader that never falls behind
        // could still miss the first entries of a call: every member leaving and as many
        // entering (2N), or every pair passing (N(N-1)/2).
        let least = (2 * top).max(top * (top - 1) / 2);
        if !(least..=MAX_CHANGES_MAX_LEN).contains(&max_len) {
            return Err(invalid(
                key("changes_max_len"),
                max_len.to_string(),
                format!(
                    "must be between {least} (what one call may write for changes_top = \
                     {top}) and {MAX_CHANGES_MAX_LEN}"
                ),
            ));
        }
        Ok(Some(Changes {
            top: top as u32,
            max_len: max_len as u64,
        }))
    }

    /// `period`, `time_zone`, `week_start`, `period_grace` and `keep_periods`: a calendar
    /// for a period board (which has no `window` or `slice`); none of them elsewhere.
    fn calendar(&self, key: &impl Fn(&str) -> String) -> Result<Option<Calendar>, ConfigError> {
        let Some(period) = &self.period else {
            let given = [
                ("time_zone", self.time_zone.is_some()),
                ("week_start", self.week_start.is_some()),
                ("period_grace", self.period_grace.is_some()),
                ("keep_periods", self.keep_periods.is_some()),
            ];
            if let Some((name, _)) = given.into_iter().find(|(_, given)| *given) {
                return Err(invalid(
                    key(name),
                    "",
                    "only a board with a period (day, week or month) takes it",
                ));
            }
            return Ok(None);
        };
        if let Some(windows) = &self.windows {
            return Err(invalid(
                key("windows"),
                format!("{windows:?}"),
                "a period board has no window or slice: it counts from the start of the period",
            ));
        }
        for (name, given) in [("window", &self.window), ("slice", &self.slice)] {
            if let Some(value) = given {
                return Err(invalid(
                    key(name),
                    value,
                    "a period board has no window or slice: it counts from the start of the period",
                ));
            }
        }
        let week_start = match &self.week_start {
            Some(day) => parse_weekday(day).ok_or_else(|| {
                invalid(
                    key("week_start"),
                    day,
                    "expected monday, tuesday, ..., sunday",
                )
            })?,
            None => chrono::Weekday::Mon,
        };
        if self.week_start.is_some() && period != "week" {
            return Err(invalid(
                key("week_start"),
                self.week_start.as_deref().unwrap_or_default(),
                "only a weekly board (period = \"week\") takes it",
            ));
        }
        let period = Period::parse(period, week_start)
            .ok_or_else(|| invalid(key("period"), period, "expected day, week or month"))?;
        let zone = match &self.time_zone {
            Some(name) => name.parse::<chrono_tz::Tz>().map_err(|_| {
                invalid(
                    key("time_zone"),
                    name,
                    "not an IANA time zone such as UTC or Europe/Berlin",
                )
            })?,
            None => chrono_tz::UTC,
        };
        let grace_text = self.period_grace.as_deref().unwrap_or(DEFAULT_PERIOD_GRACE);
        let grace_ms = duration(&key("period_grace"), grace_text)?;
        if grace_ms % PERIOD_TICK_MS != 0 || grace_ms > MAX_PERIOD_GRACE_MS {
            return Err(invalid(
                key("period_grace"),
                grace_text,
                "must be a whole number of seconds, at most 366d",
            ));
        }
        let keep = self.keep_periods.unwrap_or(DEFAULT_KEEP_PERIODS);
        if !(0..=MAX_KEEP_PERIODS).contains(&keep) {
            return Err(invalid(
                key("keep_periods"),
                keep.to_string(),
                format!("must be between 0 and {MAX_KEEP_PERIODS}"),
            ));
        }
        Ok(Some(Calendar {
            period,
            zone,
            grace_ms,
            keep: keep as u32,
        }))
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

    /// `window` (or `windows`) and `slice`: the windows as written and in ms, each a whole
    /// number of slices, none twice; and the slice in ms.
    fn span(&self, key: &impl Fn(&str) -> String) -> Result<(Vec<Window>, i64), ConfigError> {
        let written: Vec<(String, String)> = match (&self.window, &self.windows) {
            (Some(_), Some(list)) => {
                return Err(invalid(
                    key("windows"),
                    format!("{list:?}"),
                    "give either window or windows, not both",
                ))
            }
            (Some(window), None) => vec![(key("window"), window.clone())],
            (None, Some(list)) if list.is_empty() || list.len() > MAX_WINDOWS => {
                return Err(invalid(
                    key("windows"),
                    format!("{list:?}"),
                    format!("must list 1 to {MAX_WINDOWS} windows"),
                ))
            }
            (None, Some(list)) => list
                .iter()
                .enumerate()
                .map(|(j, w)| (key(&format!("windows[{j}]")), w.clone()))
                .collect(),
            (None, None) => {
                return Err(invalid(
                    key("window"),
                    "",
                    "required (or give the board a period: day, week or month)",
                ))
            }
        };
        let slice = self.slice.clone().ok_or_else(|| {
            invalid(
                key("slice"),
                "",
                "required (or give the board a period: day, week or month)",
            )
        })?;
        let slice_ms = positive_duration(&key("slice"), &slice)?;
        let mut windows: Vec<Window> = Vec::with_capacity(written.len());
        for (name, window) in written {
            let ms = positive_duration(&name, &window)?;
            if ms % slice_ms != 0 {
                return Err(invalid(
                    name,
                    &window,
                    format!("must be a whole multiple of the slice ({slice})"),
                ));
            }
            if windows.iter().any(|w| w.ms == ms) {
                return Err(invalid(name, &window, "listed twice"));
            }
            windows.push(Window { name: window, ms });
        }
        Ok((windows, slice_ms))
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
    fn a_change_feed_takes_its_top_and_a_cap() {
        use crate::domain::board::Changes;
        let board = |extra: &str| {
            crate::config::Settings::from_toml(&format!("{BOARD}{extra}"))
                .expect("valid")
                .boards
                .remove(0)
        };
        assert_eq!(board("").changes, None);
        assert_eq!(
            board("changes_top = 10\n").changes,
            Some(Changes {
                top: 10,
                max_len: 10_000
            })
        );
        assert_eq!(
            board("changes_top = 25\nchanges_max_len = 300\n").changes,
            Some(Changes {
                top: 25,
                max_len: 300
            })
        );
        for (extra, key, value) in [
            ("changes_top = 0\n", "changes_top", "0"),
            ("changes_top = 26\n", "changes_top", "26"),
            (
                "changes_top = 10\nchanges_max_len = 44\n",
                "changes_max_len",
                "between 45",
            ),
            (
                "changes_top = 3\nchanges_max_len = 5\n",
                "changes_max_len",
                "between 6",
            ),
            (
                "changes_max_len = 50\n",
                "changes_max_len",
                "needs changes_top",
            ),
        ] {
            let e = refusal(&format!("{BOARD}{extra}"));
            assert!(
                e.contains(&format!("boards[0].{key}")) && e.contains(value),
                "{extra}: {e}"
            );
        }
    }

    const PERIOD: &str = "[[boards]]\nname = \"p\"\nmember = \"room\"\nperiod = \"week\"\n";

    #[test]
    fn period_boards_take_defaults_and_their_own_keys() {
        use crate::domain::period::Period;
        let s = crate::config::Settings::from_toml(PERIOD).expect("valid");
        let c = s.boards[0].period.expect("a period board");
        assert_eq!(c.period, Period::Week(chrono::Weekday::Mon));
        assert_eq!(c.zone, chrono_tz::UTC);
        assert_eq!(c.grace_ms, 300_000);
        assert_eq!(c.keep, 12);
        let text = format!(
            "{PERIOD}time_zone = \"Europe/Berlin\"\nweek_start = \"sunday\"\nperiod_grace = \"10m\"\nkeep_periods = 3\n"
        );
        let c = crate::config::Settings::from_toml(&text)
            .expect("valid")
            .boards[0]
            .period
            .expect("a period board");
        assert_eq!(c.period, Period::Week(chrono::Weekday::Sun));
        assert_eq!(c.zone, chrono_tz::Europe::Berlin);
        assert_eq!((c.grace_ms, c.keep), (600_000, 3));
    }

    #[test]
    fn period_refusals_name_key_and_value() {
        let cases = [
            (
                PERIOD.replace("week", "fortnight"),
                "boards[0].period",
                "fortnight",
            ),
            (
                format!("{PERIOD}time_zone = \"Mars/Olympus\"\n"),
                "boards[0].time_zone",
                "Mars/Olympus",
            ),
            (
                format!("{PERIOD}week_start = \"funday\"\n"),
                "boards[0].week_start",
                "funday",
            ),
            (
                PERIOD.replace("week", "day") + "week_start = \"sunday\"\n",
                "boards[0].week_start",
                "weekly",
            ),
            (
                format!("{PERIOD}window = \"7d\"\n"),
                "boards[0].window",
                "no window",
            ),
            (
                format!("{PERIOD}period_grace = \"1500ms\"\n"),
                "boards[0].period_grace",
                "whole number",
            ),
            (
                format!("{PERIOD}keep_periods = -1\n"),
                "boards[0].keep_periods",
                "-1",
            ),
            (
                format!("{PERIOD}mode = \"resummarize\"\n"),
                "boards[0].mode",
                "incremental",
            ),
            (
                format!("{BOARD}time_zone = \"UTC\"\n"),
                "boards[0].time_zone",
                "period",
            ),
            (
                "[[boards]]\nname = \"r\"\nmember = \"room\"\nslice = \"6h\"\n".to_string(),
                "boards[0].window",
                "required",
            ),
        ];
        for (text, key, detail) in cases {
            let e = refusal(&text);
            assert!(e.contains(key) && e.contains(detail), "{text}: {e}");
        }
    }

    /// [`BOARD`] with `windows = <list>` in place of its `window`.
    fn with_windows(list: &str) -> String {
        BOARD.replace("window = \"7d\"", &format!("windows = {list}"))
    }

    #[test]
    fn several_windows_keep_their_order_and_names_and_the_widest_is_the_boards() {
        use crate::domain::board::Window;
        let b = crate::config::Settings::from_toml(&with_windows("[\"1d\", \"7d\", \"12h\"]"))
            .expect("valid")
            .boards
            .remove(0);
        let day = 86_400_000;
        assert_eq!(
            b.windows,
            [
                Window {
                    name: "1d".into(),
                    ms: day
                },
                Window {
                    name: "7d".into(),
                    ms: 7 * day
                },
                Window {
                    name: "12h".into(),
                    ms: day / 2
                },
            ]
        );
        assert_eq!(b.window_ms, 7 * day);
        assert!(b.has_several_windows());
        // One `window` is a list of one.
        let one = crate::config::Settings::from_toml(BOARD)
            .expect("valid")
            .boards
            .remove(0);
        assert_eq!(
            one.windows,
            [Window {
                name: "7d".into(),
                ms: 7 * day
            }]
        );
        assert!(!one.has_several_windows());
    }

    #[test]
    fn window_list_refusals_name_key_and_value() {
        let nine: Vec<String> = (1..=super::MAX_WINDOWS + 1)
            .map(|n| format!("\"{}h\"", 6 * n))
            .collect();
        let eight = format!("[{}]", nine[..super::MAX_WINDOWS].join(", "));
        let nine = format!("[{}]", nine.join(", "));
        let cases = [
            (
                BOARD.replace("window = \"7d\"", "window = \"7d\"\nwindows = [\"1d\"]"),
                "boards[0].windows",
                "= \"[\\\"1d\\\"]\": give either window or windows",
            ),
            (with_windows("[]"), "boards[0].windows", "1 to 8"),
            (
                with_windows("[\"1d\", \"25h\"]"),
                "boards[0].windows[1]",
                "whole multiple of the slice (6h)",
            ),
            (
                with_windows("[\"1d\", \"7d\", \"1d\"]"),
                "boards[0].windows[2]",
                "listed twice",
            ),
            (
                with_windows("[\"1d\", \"24h\"]"),
                "boards[0].windows[1]",
                "listed twice",
            ),
            (
                with_windows("[\"1d\", \"soon\"]"),
                "boards[0].windows[1]",
                "soon",
            ),
            (with_windows(&nine), "boards[0].windows", "1 to 8"),
            (
                format!("{PERIOD}windows = [\"1d\", \"7d\"]\n"),
                "boards[0].windows",
                "no window",
            ),
        ];
        for (text, key, detail) in cases {
            let e = refusal(&text);
            assert!(e.contains(&format!("`{key}`")), "{text}: {e}");
            assert!(e.contains(detail), "{text}: {e}");
        }
        // Exactly MAX_WINDOWS is accepted.
        let b = crate::config::Settings::from_toml(&with_windows(&eight))
            .expect("valid")
            .boards
            .remove(0);
        assert_eq!(b.windows.len(), super::MAX_WINDOWS);
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
