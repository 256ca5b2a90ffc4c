//! Board definitions and the window arithmetic of docs/design.md (*Window and order*), as pure functions.
//!
//! Time is always a parameter (epoch milliseconds); nothing here reads the clock.
//!
//! A [`Board`] is the definition and what concerns it whole (its slices' numbering, how
//! long its idempotency keys live, its shards); a [`View`] is one of its windows, whose
//! instances are read, written and rolled on their own (docs/design.md, *Several
//! windows*): the width a window's arithmetic (watermark, live range, lateness) and its
//! instances' keys and settings fingerprint depend on.
//!
//! A calendar-period board ([`Calendar`]) keeps one instance per period, each holding one
//! slice that lives until the period's end plus its grace: the same window arithmetic then
//! judges its events late exactly when the grace has passed (see [`Calendar::slice_of`]).

use std::fmt;

use chrono::Weekday;
use chrono_tz::Tz;

use super::period::{Period, Span};

/// Largest magnitude an amount or a total may have: 2^53 - 1, exact in a double.
pub const MAX_TOTAL: i64 = (1 << 53) - 1;

/// How a board keeps its ranking current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Apply updates slices and the ranking; the roll job subtracts expired slices.
    Incremental,
    /// Apply updates only slices; a job re-sums the live slices into the ranking.
    Resummarize,
}

impl Mode {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Incremental => "incremental",
            Mode::Resummarize => "resummarize",
        }
    }
}

/// How equal totals are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TieBreak {
    /// The member whose latest contribution is older ranks first.
    Earliest,
    /// The member whose latest contribution is newer ranks first.
    Latest,
    /// No time is kept; equal totals fall back to member name order.
    None,
}

impl TieBreak {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TieBreak::Earliest => "earliest",
            TieBreak::Latest => "latest",
            TieBreak::None => "none",
        }
    }
}

/// How long an idempotency key is remembered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dedup {
    /// For as long as the event's slice is live: exact.
    Window,
    /// For this many milliseconds after the event's slice ends (never past its liveness).
    AfterSlice(i64),
}

/// One validated leaderboard definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Board {
    /// Board name, `[a-z0-9_-]{1,64}`.
    pub name: String,
    /// Event field holding the ranked member.
    pub member: String,
    /// Event field whose value selects the instance, for scoped boards.
    pub scope: Option<String>,
    /// Event field holding the amount.
    pub amount: String,
    /// Decimal places accepted in the amount; totals are in units of 10^-scale.
    pub scale: u32,
    /// Width of the board's widest window in milliseconds (its one window unless
    /// `windows` lists several), a whole multiple of `slice_ms`: the window whose instance
    /// keeps the board's idempotency keys. Each window is read through its [`View`]
    /// ([`Board::view`], [`Board::views`]).
    pub window_ms: i64,
    /// Every window of the board as configured (`windows = ["24h", "7d"]`, or the one
    /// `window`), in the configuration's order, each with the text written there (the name
    /// answers carry). Empty on a board built in code with one window (`window_ms`, named
    /// by [`format_duration_ms`]) and on a period board.
    pub windows: Vec<Window>,
    /// Slice width in milliseconds.
    pub slice_ms: i64,
    /// Incremental or resummarize.
    pub mode: Mode,
    /// Order of equal totals.
    pub tie_break: TieBreak,
    /// Whether negative amounts (refunds) are accepted.
    pub allow_negative: bool,
    /// Whether answers carry `dense_rank`, kept exact by a ZSet of the distinct totals.
    pub dense_rank: bool,
    /// How long idempotency keys are remembered.
    pub dedup: Dedup,
    /// The calendar period of a period board (`None`: a rolling window).
    pub period: Option<Calendar>,
    /// The change feed of the board's top N (`None`: no feed).
    pub changes: Option<Changes>,
    /// How many shards an unscoped board's ranking is spread over (1: none; see
    /// [`Board::shard_of`]).
    pub shards: u32,
}

/// One window of a board with several: its width as written in the configuration (`24h`)
/// and in milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// The text written in the configuration, which answers carry as `window`.
    pub name: String,
    /// The width in milliseconds, a whole multiple of the board's slice.
    pub ms: i64,
}

/// One window of a board: the board seen through one of its windows, whose instances
/// (one per scope, shard or period) have their own slices, ranking, watermark and feed
/// (docs/design.md, *Several windows*). Everything that reads or writes one window's
/// instance takes a view; what concerns the whole board (its settings, its slices'
/// numbering, its idempotency keys' lifetime) stays on [`Board`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View<'a> {
    /// The board.
    board: &'a Board,
    /// The window: its name as configured and its width.
    window: Window,
}

/// A board's change feed: every change of the membership or order of its top `top`,
/// recorded by the script call that makes it in a stream per instance
/// ([`crate::domain::keys::Keys::changes`]) capped at `max_len` entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Changes {
    /// How many of the top are watched (`changes_top`).
    pub top: u32,
    /// The cap of each change stream (`changes_max_len`): every write trims it to this
    /// many entries.
    pub max_len: u64,
}

/// Width of the clock's slices on a period board: its slice numbers count seconds, so a
/// period's one slice is numbered by the second at which its grace ends.
pub const PERIOD_TICK_MS: i64 = 1_000;

/// How a period board cuts time: a day, week or month in a time zone, each period's
/// archive open to late events for `grace_ms` after its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Calendar {
    /// Day, week (from its first weekday) or month.
    pub period: Period,
    /// The IANA zone whose midnights bound the periods.
    pub zone: Tz,
    /// How long after its end a closed period still takes events (a whole number of
    /// seconds).
    pub grace_ms: i64,
    /// Closed periods kept besides the current one.
    pub keep: u32,
}

/// Which period a query asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeriodSelector {
    /// The period holding `now`.
    Current,
    /// The period before it.
    Previous,
    /// The period with this id.
    Id(String),
}

impl PeriodSelector {
    /// `current`, `previous` or a period id (checked against the board by
    /// [`Calendar::select`]).
    pub fn parse(text: &str) -> PeriodSelector {
        match text {
            "current" => PeriodSelector::Current,
            "previous" => PeriodSelector::Previous,
            id => PeriodSelector::Id(id.to_string()),
        }
    }
}

impl Calendar {
    /// The period holding the instant `ts`.
    pub fn span_at(&self, ts: i64) -> Span {
        self.period.span_at(self.zone, ts)
    }

    /// The period `selector` names at `now`, or `None` for an id that names no period of
    /// this board.
    pub fn select(&self, selector: &PeriodSelector, now: i64) -> Option<Span> {
        match selector {
            PeriodSelector::Current => Some(self.span_at(now)),
            PeriodSelector::Previous => Some(self.period.previous(self.zone, &self.span_at(now))),
            PeriodSelector::Id(id) => self.period.parse_id(self.zone, id),
        }
    }

    /// The number of the one slice of `span`'s instance: the last second before the grace
    /// ends. With [`PERIOD_TICK_MS`]-wide slices and a window of one, the slice leaves the
    /// window (its events are late, its ids forgettable) exactly when
    /// `end_ms + grace_ms <= now`; period bounds and the grace are whole seconds.
    pub fn slice_of_span(&self, span: &Span) -> i64 {
        (span.end_ms + self.grace_ms).div_euclid(PERIOD_TICK_MS) - 1
    }

    /// The slice number of the period holding `ts` ([`Calendar::slice_of_span`]).
    pub fn slice_of(&self, ts: i64) -> i64 {
        self.slice_of_span(&self.span_at(ts))
    }

    /// Whether the data of `span` is still kept at `now`: a period not yet closed for good
    /// (the current one, a later one, one within its grace), or one of the newest `keep`
    /// closed periods. The roll deletes the others.
    pub fn keeps(&self, span: &Span, now: i64) -> bool {
        let mut oldest = self.span_at(now);
        for _ in 0..self.keep {
            oldest = self.period.previous(self.zone, &oldest);
        }
        span.start_ms >= oldest.start_ms || !self.is_sealed(span, now)
    }

    /// Whether `span` is closed for good at `now`: its grace has passed.
    pub fn is_sealed(&self, span: &Span, now: i64) -> bool {
        span.end_ms + self.grace_ms <= now
    }

    /// The config spelling of the period (`day`, `week`, `month`).
    pub fn period_name(&self) -> &'static str {
        match self.period {
            Period::Day => "day",
            Period::Week(_) => "week",
            Period::Month => "month",
        }
    }

    /// The first day of a week (`monday`, ...), for a weekly board.
    pub fn week_start(&self) -> Option<&'static str> {
        match self.period {
            Period::Week(day) => Some(weekday_name(day)),
            _ => None,
        }
    }

    /// What shapes the board's instances: the period (with its first weekday) and zone.
    fn shaping(&self) -> [(&'static str, String); 2] {
        let period = match self.week_start() {
            Some(day) => format!("week:{day}"),
            None => self.period_name().to_string(),
        };
        [
            ("period", period),
            ("time_zone", self.zone.name().to_string()),
        ]
    }
}

/// The instance name of one period of a period board: `@<id>`, or `<scope>@<id>` on a
/// scoped board. It is the instance's scope in the key schema (`rb:{tips:@2026-11}:...`),
/// so a period's keys share one hash tag; period ids hold no `@`, so the last `@` splits it.
pub fn period_instance(scope: Option<&str>, period_id: &str) -> String {
    format!("{}@{period_id}", scope.unwrap_or(""))
}

/// The scope part of a period instance name (`None` for an unscoped board's).
pub fn scope_of_period_instance(instance: &str) -> Option<&str> {
    instance
        .rsplit_once('@')
        .map(|(scope, _)| scope)
        .filter(|s| !s.is_empty())
}

/// `monday` ... `sunday`.
pub fn weekday_name(day: Weekday) -> &'static str {
    match day {
        Weekday::Mon => "monday",
        Weekday::Tue => "tuesday",
        Weekday::Wed => "wednesday",
        Weekday::Thu => "thursday",
        Weekday::Fri => "friday",
        Weekday::Sat => "saturday",
        Weekday::Sun => "sunday",
    }
}

/// Parses `monday` ... `sunday`.
pub fn parse_weekday(text: &str) -> Option<Weekday> {
    [
        Weekday::Mon,
        Weekday::Tue,
        Weekday::Wed,
        Weekday::Thu,
        Weekday::Fri,
        Weekday::Sat,
        Weekday::Sun,
    ]
    .into_iter()
    .find(|d| weekday_name(*d) == text)
}

impl Board {
    /// The change feed that applies and expiries write (`None` on a resummarize board,
    /// whose ranking changes only when a run or a rebuild swaps a new one in: the swap
    /// writes its feed).
    pub fn incremental_feed(&self) -> Option<Changes> {
        self.changes.filter(|_| self.mode == Mode::Incremental)
    }

    /// The board's windows as configured, in the configuration's order (one for a board
    /// built in code with `windows` left empty).
    pub fn window_list(&self) -> Vec<Window> {
        if self.windows.is_empty() {
            return vec![Window {
                name: format_duration_ms(self.window_ms),
                ms: self.window_ms,
            }];
        }
        self.windows.clone()
    }

    /// Whether the board ranks several windows (`windows = [...]` with more than one).
    pub fn has_several_windows(&self) -> bool {
        self.windows.len() > 1
    }

    /// The widest of the board's windows, in ms: its instance keeps the board's
    /// idempotency keys, and its liveness decides whether an event is late.
    pub fn widest_ms(&self) -> i64 {
        self.windows
            .iter()
            .map(|w| w.ms)
            .max()
            .unwrap_or(self.window_ms)
            .max(self.window_ms)
    }

    /// The board's window `window` (its name as configured, or a duration equal to one
    /// of its windows; `None`: the first configured), or `None` when the board has no such
    /// window. A period board has one window, of one [`PERIOD_TICK_MS`] slice.
    pub fn view(&self, window: Option<&str>) -> Option<View<'_>> {
        if self.period.is_some() {
            return window.is_none().then(|| self.widest());
        }
        let list = self.window_list();
        let found = match window {
            None => list.first(),
            Some(text) => list.iter().find(|w| w.name == text).or_else(|| {
                let ms = parse_duration_ms(text)?;
                list.iter().find(|w| w.ms == ms)
            }),
        }?;
        Some(self.view_of(found.ms))
    }

    /// The board's widest window: the one whose instance keeps the idempotency keys,
    /// decides what is late, and stands for a scope in the registry (a board's only
    /// window unless it has several).
    pub fn widest(&self) -> View<'_> {
        self.view_of(self.widest_ms())
    }

    /// Every window of the board, narrowest first (the order a roll takes them in: the
    /// widest, whose instance holds the idempotency keys, last).
    pub fn views(&self) -> Vec<View<'_>> {
        let mut widths: Vec<i64> = self.window_list().iter().map(|w| w.ms).collect();
        widths.sort_unstable();
        widths.dedup();
        widths.into_iter().map(|ms| self.view_of(ms)).collect()
    }

    /// The windows other than the widest, narrowest first: an apply writes them beside the
    /// widest in one call.
    pub fn narrower_views(&self) -> Vec<View<'_>> {
        self.views()
            .into_iter()
            .filter(|v| !v.is_widest())
            .collect()
    }

    /// The board's window of `ms`, named as configured (by [`format_duration_ms`] on a
    /// board built in code with one window, and on a period board).
    fn view_of(&self, ms: i64) -> View<'_> {
        let name = self
            .windows
            .iter()
            .find(|w| w.ms == ms)
            .map_or_else(|| format_duration_ms(ms), |w| w.name.clone());
        View {
            board: self,
            window: Window { name, ms },
        }
    }

    /// Slices in the widest window: how long idempotency keys are remembered.
    fn slices_in_widest(&self) -> i64 {
        self.widest_ms() / self.slice_ms
    }

    /// The slice an event time falls into: `floor(ts / slice_ms)`; on a period board the
    /// one slice of the period holding `ts` ([`Calendar::slice_of`]).
    pub fn slice_of(&self, ts: i64) -> i64 {
        match &self.period {
            Some(calendar) => calendar.slice_of(ts),
            None => ts.div_euclid(self.slice_ms),
        }
    }

    /// Time (epoch ms) from which an idempotency key of slice `n` may be forgotten.
    pub fn forget_at(&self, n: i64) -> i64 {
        let leaves_window = (n + self.slices_in_widest()) * self.slice_ms;
        match self.dedup {
            Dedup::Window => leaves_window,
            Dedup::AfterSlice(ms) => ((n + 1) * self.slice_ms + ms).min(leaves_window),
        }
    }

    /// The newest slice whose idempotency keys may be forgotten at `now`: the largest `n`
    /// with `forget_at(n) <= now` ([`Board::forget_at`] grows with `n`).
    pub fn forgettable_through(&self, now: i64) -> i64 {
        let leaves_window = now.div_euclid(self.slice_ms) - self.slices_in_widest();
        match self.dedup {
            Dedup::Window => leaves_window,
            Dedup::AfterSlice(ms) => {
                leaves_window.max((now.saturating_sub(ms)).div_euclid(self.slice_ms) - 1)
            }
        }
    }

    /// The settings pinned when the board's data is first written: the widest window's
    /// shaping settings ([`View::shaping_settings`]) and `scope` (the event field naming the instance, `""` for an unscoped board). A
    /// change of scope would start the board over empty under other keys and orphan its
    /// data, so it is refused like the others. `scope` is not part of the instances'
    /// [`View::fingerprint`]: every key of an instance already says whether it is scoped.
    pub fn pinned_settings(&self) -> Vec<(&'static str, String)> {
        let mut pinned = self.widest().shaping_settings();
        pinned.push(("scope", self.scope.clone().unwrap_or_default()));
        pinned
    }

    /// Whether this board ranks one instance per scope value.
    pub fn is_scoped(&self) -> bool {
        self.scope.is_some()
    }

    /// Whether this board's one ranking is spread over several shards.
    pub fn is_sharded(&self) -> bool {
        self.shards > 1
    }

    /// Whether the board's data lives in several instances, each registered in the
    /// board's scope registry and following the board's watermark: one per scope value,
    /// or one per shard.
    pub fn has_many_instances(&self) -> bool {
        self.is_scoped() || self.is_sharded()
    }

    /// The instance holding `member` on a sharded board: the shard
    /// `crc32(member) mod shards` (CRC-32/IEEE of the member's bytes), named `#<shard>`
    /// where a scoped board names a scope value (its keys `rb:{<board>:#<shard>}:…`, a
    /// hash tag, so a cluster slot, of its own); `None` on a board without shards.
    pub fn shard_of(&self, member: &str) -> Option<String> {
        self.is_sharded()
            .then(|| shard_name(crc32fast::hash(member.as_bytes()) % self.shards))
    }

    /// Every shard's instance name, in shard order (none on a board without shards).
    pub fn shard_names(&self) -> Vec<String> {
        if !self.is_sharded() {
            return Vec::new();
        }
        (0..self.shards).map(shard_name).collect()
    }
}

impl<'a> View<'a> {
    /// The board this is a window of.
    pub fn board(&self) -> &'a Board {
        self.board
    }

    /// The window's name as configured (`24h`), as answers carry it.
    pub fn window_name(&self) -> &str {
        &self.window.name
    }

    /// The window's width in milliseconds.
    pub fn window_ms(&self) -> i64 {
        self.window.ms
    }

    /// Whether this is the board's widest window ([`Board::widest`]).
    pub fn is_widest(&self) -> bool {
        self.window.ms == self.board.widest_ms()
    }

    /// The suffix of this window in its instances' keys: `None` for the widest window (the
    /// keys of a board with one window), else the width as [`format_duration_ms`] writes
    /// it, in its largest whole unit (`1d` for `24h` or `1d`).
    pub fn window_suffix(&self) -> Option<String> {
        (!self.is_widest()).then(|| format_duration_ms(self.window.ms))
    }

    /// Number of slices in the window (`N`).
    pub fn slices_in_window(&self) -> i64 {
        self.window.ms / self.board.slice_ms
    }

    /// The watermark at `now`: the last dead slice, slices at or below it being outside the
    /// window: the stored watermark (the `expired_through` field) or the clock's, whichever
    /// is later.
    pub fn watermark_at(&self, now: i64, stored: Option<i64>) -> i64 {
        let by_clock = now.div_euclid(self.board.slice_ms) - self.slices_in_window();
        stored.map_or(by_clock, |w| w.max(by_clock))
    }

    /// The earliest time at which the clock alone puts the watermark at `watermark`:
    /// judging events at this time or later is judging them against that watermark.
    pub fn time_of_watermark(&self, watermark: i64) -> i64 {
        watermark
            .saturating_add(self.slices_in_window())
            .saturating_mul(self.board.slice_ms)
    }

    /// Whether an event at `ts` is late at `now`: its slice left the window, or (with a
    /// `dedup_window` duration) the idempotency keys of its slice may be forgotten. An id
    /// is forgotten only once events of its slice can no longer be applied.
    pub fn is_late(&self, ts: i64, now: i64, expired_through: Option<i64>) -> bool {
        let slice = self.board.slice_of(ts);
        slice <= self.watermark_at(now, expired_through)
            || slice <= self.board.forgettable_through(now)
    }

    /// Start (inclusive) and end (exclusive) of the live range in epoch ms; on a period
    /// board, the current period.
    pub fn live_range(&self, now: i64, expired_through: Option<i64>) -> (i64, i64) {
        if let Some(calendar) = &self.board.period {
            let span = calendar.span_at(now);
            return (span.start_ms, span.end_ms);
        }
        let from = (self.watermark_at(now, expired_through) + 1) * self.board.slice_ms;
        (from, from + self.window.ms)
    }

    /// The settings that shape this window's instances' keys and scores, as (name, value) pairs in a
    /// fixed order: a board whose stored settings differ must be rebuilt or renamed.
    /// A period board has `period` and `time_zone` where a rolling one has `window` and
    /// `slice` (the grace and the archives kept change no key or score). A setting of
    /// [`DEFAULTED_SETTINGS`] is listed only away from its default, so the settings (and
    /// the fingerprint) of a board that leaves it alone are those it had before the
    /// setting existed.
    pub fn shaping_settings(&self) -> Vec<(&'static str, String)> {
        let mut settings = vec![
            ("mode", self.board.mode.as_str().to_string()),
            ("tie_break", self.board.tie_break.as_str().to_string()),
            ("allow_negative", self.board.allow_negative.to_string()),
            ("scale", self.board.scale.to_string()),
        ];
        match &self.board.period {
            Some(calendar) => settings.extend(calendar.shaping()),
            None => settings.extend([
                ("window", format!("{}ms", self.window.ms)),
                ("slice", format!("{}ms", self.board.slice_ms)),
            ]),
        }
        if self.board.has_several_windows() {
            // Each window's instance holds what was applied since it existed: a window
            // added, removed or resized over existing data needs a rebuild. Their order
            // (which one queries default to) and how each is written shape nothing.
            let mut ms: Vec<i64> = self.board.windows.iter().map(|w| w.ms).collect();
            ms.sort_unstable();
            let widths: Vec<String> = ms.iter().map(|ms| format!("{ms}ms")).collect();
            settings.push(("windows", widths.join(" ")));
        }
        if self.board.dense_rank {
            // The distinct totals exist only for data written with it: turning it on or
            // off over existing data needs a rebuild, like the settings above.
            settings.push(("dense_rank", "true".into()));
        }
        if self.board.is_sharded() {
            // A member's shard depends on their number: with another, its events would
            // go to another shard than its total.
            settings.push(("shards", self.board.shards.to_string()));
        }
        settings
    }

    /// [`View::shaping_settings`] as one string, stored in every instance's `meta` and
    /// checked by every script that writes the instance.
    pub fn fingerprint(&self) -> String {
        self.shaping_settings()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl fmt::Display for Board {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// The shaping settings added after boards were first pinned, with the value that a
/// stored record or fingerprint without them stands for (see [`View::shaping_settings`]).
pub const DEFAULTED_SETTINGS: [(&str, &str); 3] =
    [("dense_rank", "false"), ("windows", ""), ("shards", "1")];

/// Most shards one board may be spread over (`shards`).
pub const MAX_SHARDS: u32 = 64;

/// The instance name of shard `shard` (see [`Board::shard_of`]).
fn shard_name(shard: u32) -> String {
    format!("#{shard}")
}

/// Whether `name` is a valid board name, `[a-z0-9_-]{1,64}`: the key schema relies on board
/// names holding no `:`, `{`, `}` or glob character.
pub fn is_board_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// Formats a duration in milliseconds in the largest unit that divides it (`7d`, `90m`,
/// `1500ms`): [`parse_duration_ms`] reads it back.
pub fn format_duration_ms(ms: i64) -> String {
    for (unit, factor) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms != 0 && ms % factor == 0 {
            return format!("{}{unit}", ms / factor);
        }
    }
    format!("{ms}ms")
}

/// Parses a duration of the form `500ms`, `30s`, `5m`, `6h`, `7d` into milliseconds.
pub fn parse_duration_ms(text: &str) -> Option<i64> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() {
        return None;
    }
    let value: i64 = digits.parse().ok()?;
    let factor = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    value.checked_mul(factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn board(window: i64, slice: i64) -> Board {
        Board {
            name: "b".into(),
            member: "m".into(),
            scope: None,
            amount: "amount".into(),
            scale: 0,
            window_ms: window,
            windows: Vec::new(),
            slice_ms: slice,
            mode: Mode::Incremental,
            tie_break: TieBreak::Earliest,
            allow_negative: false,
            dense_rank: false,
            changes: None,
            dedup: Dedup::Window,
            period: None,
            shards: 1,
        }
    }

    #[test]
    fn dense_rank_leaves_the_fingerprint_of_other_boards_alone() {
        let mut b = board(4_000, 1_000);
        assert_eq!(
            b.widest().fingerprint(),
            "mode=incremental,tie_break=earliest,allow_negative=false,scale=0,window=4000ms,slice=1000ms"
        );
        b.dense_rank = true;
        assert_eq!(
            b.widest().fingerprint(),
            "mode=incremental,tie_break=earliest,allow_negative=false,scale=0,window=4000ms,slice=1000ms,dense_rank=true"
        );
        assert_eq!(b.pinned_settings().last(), Some(&("scope", String::new())));
    }

    #[test]
    fn the_window_list_is_pinned_by_its_widths_whatever_their_order_and_spelling() {
        let with = |list: &[(&str, i64)]| {
            let mut b = board(list.iter().map(|w| w.1).max().unwrap_or(0), 1_000);
            b.windows = list
                .iter()
                .map(|&(name, ms)| Window {
                    name: name.into(),
                    ms,
                })
                .collect();
            b
        };
        let two = with(&[("2s", 2_000), ("6s", 6_000)]);
        assert_eq!(
            two.widest().fingerprint(),
            "mode=incremental,tie_break=earliest,allow_negative=false,scale=0,window=6000ms,slice=1000ms,windows=2000ms 6000ms"
        );
        // Another order or spelling of the same widths: the same data.
        for same in [
            with(&[("6s", 6_000), ("2s", 2_000)]),
            with(&[("2000ms", 2_000), ("6s", 6_000)]),
        ] {
            assert_eq!(same.pinned_settings(), two.pinned_settings());
        }
        // A window added, removed or resized: other data.
        for other in [
            with(&[("1s", 1_000), ("2s", 2_000), ("6s", 6_000)]),
            with(&[("3s", 3_000), ("6s", 6_000)]),
            with(&[("6s", 6_000)]),
        ] {
            assert_ne!(other.pinned_settings(), two.pinned_settings());
        }
        // A list of one is the board's one `window`.
        assert_eq!(
            with(&[("6s", 6_000)]).widest().fingerprint(),
            board(6_000, 1_000).widest().fingerprint()
        );
        // Each narrower view keeps the list and names its own window.
        let views: Vec<String> = two.views().iter().map(View::fingerprint).collect();
        assert_eq!(views[1], two.widest().fingerprint());
        assert!(
            views[0].contains("window=2000ms,") && views[0].ends_with("windows=2000ms 6000ms"),
            "{}",
            views[0]
        );
    }

    #[test]
    fn durations_parse_exactly() {
        assert_eq!(parse_duration_ms("500ms"), Some(500));
        assert_eq!(parse_duration_ms("30s"), Some(30_000));
        assert_eq!(parse_duration_ms("5m"), Some(300_000));
        assert_eq!(parse_duration_ms("6h"), Some(21_600_000));
        assert_eq!(parse_duration_ms("7d"), Some(604_800_000));
        for bad in [
            "",
            "5",
            "h",
            "5 h",
            "1.5h",
            "-1h",
            "5w",
            "99999999999999999999d",
        ] {
            assert_eq!(parse_duration_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn durations_format_in_the_largest_unit() {
        for (ms, text) in [
            (604_800_000, "7d"),
            (90_000_000, "25h"),
            (5_400_000, "90m"),
            (30_000, "30s"),
            (1_500, "1500ms"),
        ] {
            assert_eq!(format_duration_ms(ms), text);
            assert_eq!(parse_duration_ms(text), Some(ms));
        }
    }

    #[test]
    fn slices_are_aligned_to_the_epoch() {
        let b = board(4_000, 1_000);
        assert_eq!(b.slice_of(0), 0);
        assert_eq!(b.slice_of(999), 0);
        assert_eq!(b.slice_of(1_000), 1);
        assert_eq!(b.widest().slices_in_window(), 4);
    }

    #[test]
    fn liveness_follows_the_definition() {
        let b = board(4_000, 1_000);
        let now = 10_500; // slice 10: live slices are 7..=10
        assert!(b.widest().is_late(6_999, now, None));
        assert!(!b.widest().is_late(7_000, now, None));
        assert_eq!(b.widest().live_range(now, None), (7_000, 11_000));
        // A watermark ahead of the clock wins; one behind it does not.
        assert!(b.widest().is_late(7_000, now, Some(7)));
        assert!(!b.widest().is_late(7_000, now, Some(2)));
        assert_eq!(b.widest().live_range(now, Some(8)), (9_000, 13_000));
        // The clock reaches a watermark at the start of the slice N after it.
        assert_eq!(b.widest().time_of_watermark(8), 12_000);
        assert_eq!(
            b.widest()
                .watermark_at(b.widest().time_of_watermark(8), None),
            8
        );
        assert_eq!(
            b.widest()
                .watermark_at(b.widest().time_of_watermark(8) - 1, None),
            7
        );
    }

    #[test]
    fn dedup_memory_never_outlives_liveness() {
        let mut b = board(4_000, 1_000);
        assert_eq!(b.forget_at(7), 11_000);
        b.dedup = Dedup::AfterSlice(500);
        assert_eq!(b.forget_at(7), 8_500);
        b.dedup = Dedup::AfterSlice(1_000_000);
        assert_eq!(b.forget_at(7), 11_000);
    }

    #[test]
    fn an_event_whose_ids_may_be_forgotten_is_late() {
        let mut b = board(4_000, 1_000);
        b.dedup = Dedup::AfterSlice(500);
        // Slice 7 ends at 8_000; its ids may be forgotten from 8_500 on.
        assert!(!b.widest().is_late(7_000, 8_499, None));
        assert!(b.widest().is_late(7_999, 8_500, None));
        assert!(!b.widest().is_late(8_000, 8_500, None));
        b.dedup = Dedup::Window;
        assert!(!b.widest().is_late(7_000, 10_999, None));
        assert!(b.widest().is_late(7_000, 11_000, None));
    }

    #[test]
    fn forgettable_through_is_the_last_slice_due() {
        let mut b = board(4_000, 1_000);
        for dedup in [
            Dedup::Window,
            Dedup::AfterSlice(0),
            Dedup::AfterSlice(500),
            Dedup::AfterSlice(2_500),
            Dedup::AfterSlice(1_000_000),
        ] {
            b.dedup = dedup;
            for now in [
                -3_001, -1, 0, 1, 999, 1_000, 8_499, 8_500, 10_999, 11_000, 12_345,
            ] {
                let n = b.forgettable_through(now);
                assert!(b.forget_at(n) <= now, "{dedup:?} at {now}");
                assert!(b.forget_at(n + 1) > now, "{dedup:?} at {now}");
            }
        }
    }
}
