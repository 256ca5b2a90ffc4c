//! Read-side types (entries, pages, member ranks) and the decoding of ZSet members.
//!
//! A ZSet member is the plain member behind a fixed-width tie-break prefix: 16 decimal
//! digits of `2^53-1 - last_ts` (earliest) or `last_ts` (latest), then `:`. Redis orders
//! equal scores by member bytes, so `ZREVRANGE` yields exactly the order of docs/design.md (*Window and order*).

use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::board::{TieBreak, MAX_TOTAL};

/// Width of the tie-break prefix, in digits.
const PREFIX_DIGITS: usize = 16;

/// The ZSet member string for `member` whose latest contribution is at `ts`.
pub fn encode_member(tie: TieBreak, member: &str, ts: i64) -> String {
    match tie {
        TieBreak::Earliest => format!("{:016}:{member}", MAX_TOTAL - ts),
        TieBreak::Latest => format!("{ts:016}:{member}"),
        TieBreak::None => member.to_string(),
    }
}

/// The plain member and its `last_ts` behind a ZSet member string.
pub fn decode_member(tie: TieBreak, zmember: &str) -> (String, Option<i64>) {
    if tie == TieBreak::None {
        return (zmember.to_string(), None);
    }
    let prefix = zmember
        .get(..PREFIX_DIGITS)
        .and_then(|p| p.parse::<i64>().ok());
    match (prefix, zmember.get(PREFIX_DIGITS + 1..)) {
        (Some(p), Some(member)) => {
            let ts = if tie == TieBreak::Earliest {
                MAX_TOTAL - p
            } else {
                p
            };
            (member.to_string(), Some(ts))
        }
        // Not written by rollboard: show it as it is rather than fail the whole page.
        _ => (zmember.to_string(), None),
    }
}

/// The share of ranked members placed strictly below a member, in percent, rounded down
/// to hundredths: `100 * (count - rank) / count` (the top member of 200 is 99.5).
///
/// Held as an integer of hundredths, computed with integers only, so no float ever rounds
/// it up across a boundary; it is written as a JSON number with at most two decimals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Percentile(u32);

impl Percentile {
    /// The percentile of position `rank` (1-based) among `count` ranked members; `None`
    /// when `rank` is not in `1..=count`.
    pub fn of(rank: u64, count: u64) -> Option<Percentile> {
        if rank == 0 || rank > count {
            return None;
        }
        let below = u128::from(count - rank) * 10_000 / u128::from(count);
        // below <= 10_000: (count - rank) < count.
        Some(Percentile(below as u32))
    }

    /// The value in hundredths of a percent (99.5 is 9950).
    pub fn hundredths(self) -> u32 {
        self.0
    }
}

impl std::fmt::Display for Percentile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (whole, part) = (self.0 / 100, self.0 % 100);
        match part {
            0 => write!(f, "{whole}"),
            p if p % 10 == 0 => write!(f, "{whole}.{}", p / 10),
            p => write!(f, "{whole}.{p:02}"),
        }
    }
}

/// In the API's schema: a number from 0 to 100 with at most two decimals.
impl utoipa::PartialSchema for Percentile {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::Number)
            .minimum(Some(0))
            .maximum(Some(100))
            .multiple_of(Some(0.01))
            .description(Some(
                "The share of the ranked members placed strictly below, in percent: \
                 100 * (count - rank) / count rounded down to hundredths (at most two decimals)",
            ))
            .examples([serde_json::json!(99.5)])
            .into()
    }
}

impl ToSchema for Percentile {}

impl Serialize for Percentile {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // serde_json keeps a number's text as written (arbitrary precision): the digits
        // of the exact value, never a float's.
        let number: serde_json::Number = self
            .to_string()
            .parse()
            .map_err(serde::ser::Error::custom)?;
        number.serialize(serializer)
    }
}

/// One ranked member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Entry {
    /// 1-based position in the order (unique).
    pub rank: u64,
    /// 1 + number of members with a strictly greater total.
    pub competition_rank: u64,
    /// 1 + number of distinct totals strictly greater (1, 1, 2); on `dense_rank` boards
    /// only, absent from the answers of others.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, nullable = false)]
    pub dense_rank: Option<u64>,
    /// Share of the ranked members placed strictly below this one, in percent.
    pub percentile: Percentile,
    /// The member.
    pub member: String,
    /// Exact total in the board's minor units.
    pub total: i64,
    /// Time of the member's latest live contribution (null for `tie_break = "none"`).
    #[schema(required = true)]
    pub last_ts: Option<i64>,
}

/// What every answer about one window of a board opens with: the board, scope and window
/// read, the scale of its totals, how many members it ranks, its live range and when its
/// ranking last changed. A page, a member's rank and a subset answer each open with
/// these fields, in this order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Envelope {
    /// Board name.
    pub board: String,
    /// Scope value, for scoped boards.
    #[schema(required = true)]
    pub scope: Option<String>,
    /// The window read, as the configuration writes it (`24h`); on a calendar-period
    /// board, the period's length (`week`).
    #[schema(example = "7d")]
    pub window: String,
    /// Decimal places of `total` (total = amount x 10^scale).
    pub scale: u32,
    /// Number of ranked members (of the whole board, in a subset answer).
    pub count: u64,
    /// Start of the live range, epoch ms.
    pub window_from: i64,
    /// End of the live range, epoch ms.
    pub window_to: i64,
    /// When the ranking last changed, epoch ms (Redis's clock): the last apply or roll of
    /// an incremental instance, the last run that summed a resummarize one; null when
    /// nothing has been recorded yet (an instance never written).
    #[schema(required = true)]
    pub as_of: Option<i64>,
}

/// A page of a ranking (`top`, `around`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Page {
    /// The board, window and live range read.
    #[serde(flatten)]
    #[schema(inline)]
    pub envelope: Envelope,
    /// The entries, best first.
    pub entries: Vec<Entry>,
}

/// The position of one member (`rank`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct MemberRank {
    /// The board, window and live range read.
    #[serde(flatten)]
    #[schema(inline)]
    pub envelope: Envelope,
    /// The member.
    pub member: String,
    /// 1-based position, null when the member is not on the board.
    #[schema(required = true)]
    pub rank: Option<u64>,
    /// Competition rank, null when the member is not on the board.
    #[schema(required = true)]
    pub competition_rank: Option<u64>,
    /// Dense rank, on `dense_rank` boards only: null when the member is not on the
    /// board; absent from the answers of other boards.
    // `Some(None)`: a dense_rank board, the member not on it; `None`: another board.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>, minimum = 1)]
    pub dense_rank: Option<Option<u64>>,
    /// Share of ranked members placed below this one, null when it is not on the board.
    #[schema(required = true)]
    pub percentile: Option<Percentile>,
    /// Exact total, null when the member is not on the board.
    #[schema(required = true)]
    pub total: Option<i64>,
    /// Latest live contribution time.
    #[schema(required = true)]
    pub last_ts: Option<i64>,
}

impl MemberRank {
    /// Whether the member is ranked.
    pub fn is_ranked(&self) -> bool {
        self.rank.is_some()
    }

    /// The one shape of "not on the board", shared by the HTTP 404 body and the CLI's
    /// `rank --json` / `around --json` (exit 3): this answer (rank fields null) with an
    /// `error` naming the member and the board.
    pub fn not_on_board(&self) -> serde_json::Value {
        // Plain fields: serializing them cannot fail.
        let mut value = serde_json::to_value(self).unwrap_or_default();
        let scope = self
            .envelope
            .scope
            .as_deref()
            .map(|s| format!(" (scope {s:?})"))
            .unwrap_or_default();
        if let serde_json::Value::Object(fields) = &mut value {
            fields.insert(
                "error".into(),
                format!(
                    "{:?} is not on board {}{scope}",
                    self.member, self.envelope.board
                )
                .into(),
            );
        }
        value
    }
}

/// One member in every window of its board, from one snapshot
/// (`members/{member}?all_windows=true`, `rollboard rank --all-windows`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct MemberWindows {
    /// Board name.
    pub board: String,
    /// Scope value, for scoped boards.
    #[schema(required = true)]
    pub scope: Option<String>,
    /// Decimal places of every `total`.
    pub scale: u32,
    /// The member.
    pub member: String,
    /// Calendar-period boards only: the id of the period read.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "2026-W48", nullable = false)]
    pub period: Option<String>,
    /// The member in each window of the board, in the configuration's order (one on a
    /// board with one window).
    pub windows: Vec<WindowRank>,
}

/// One member's place in one window of its board ([`MemberWindows`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct WindowRank {
    /// The window, as the configuration writes it (`24h`); on a calendar-period board,
    /// the period's length (`week`).
    #[schema(example = "7d")]
    pub window: String,
    /// 1-based position in this window, null when the member is not ranked in it.
    #[schema(required = true)]
    pub rank: Option<u64>,
    /// Competition rank in this window, null when not ranked in it.
    #[schema(required = true)]
    pub competition_rank: Option<u64>,
    /// Dense rank in this window, on `dense_rank` boards only: null when not ranked in
    /// it; absent from the answers of other boards.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>, minimum = 1)]
    pub dense_rank: Option<Option<u64>>,
    /// Exact total over this window in the board's minor units, null when not ranked in
    /// it.
    #[schema(required = true)]
    pub total: Option<i64>,
    /// Number of members ranked in this window.
    pub count: u64,
    /// Share of this window's ranked members placed below the member, null when not
    /// ranked in it.
    #[schema(required = true)]
    pub percentile: Option<Percentile>,
    /// Start of this window's live range, epoch ms.
    pub window_from: i64,
    /// End of this window's live range, epoch ms.
    pub window_to: i64,
}

impl MemberWindows {
    /// Whether the member is ranked in at least one window.
    pub fn is_ranked(&self) -> bool {
        self.windows.iter().any(|w| w.rank.is_some())
    }
}

impl WindowRank {
    /// The window `window` of a member's rank answer in it.
    pub fn of(window: String, rank: &MemberRank) -> WindowRank {
        WindowRank {
            window,
            rank: rank.rank,
            competition_rank: rank.competition_rank,
            dense_rank: rank.dense_rank,
            total: rank.total,
            count: rank.envelope.count,
            percentile: rank.percentile,
            window_from: rank.envelope.window_from,
            window_to: rank.envelope.window_to,
        }
    }
}

/// One member of a subset answer ([`Subset`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct SubsetEntry {
    /// The member.
    pub member: String,
    /// 1-based position on the whole board, null when the member is not on the board.
    #[schema(required = true)]
    pub rank: Option<u64>,
    /// Competition rank on the whole board, null when not on the board.
    #[schema(required = true)]
    pub competition_rank: Option<u64>,
    /// Dense rank on the whole board, on `dense_rank` boards only: null when the member is
    /// not on the board; absent from the answers of other boards.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>, minimum = 1)]
    pub dense_rank: Option<Option<u64>>,
    /// 1-based position among the ranked members asked for, in the board's order; null
    /// when not on the board.
    #[schema(required = true)]
    pub subset_rank: Option<u64>,
    /// Exact total, null when not on the board.
    #[schema(required = true)]
    pub total: Option<i64>,
    /// Share of the board's ranked members placed below this one, null when not on it.
    #[schema(required = true)]
    pub percentile: Option<Percentile>,
}

/// Several members re-ranked among themselves, from one snapshot (`POST .../ranks`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Subset {
    /// The board, window and live range read.
    #[serde(flatten)]
    #[schema(inline)]
    pub envelope: Envelope,
    /// The ranked members asked for, best first, then the others in the order asked.
    pub entries: Vec<SubsetEntry>,
}

/// Formats a total in minor units as a decimal with `scale` fraction digits.
pub fn format_total(total: i64, scale: u32) -> String {
    if scale == 0 {
        return total.to_string();
    }
    let digits = total.unsigned_abs().to_string();
    let scale = scale as usize;
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{}{int}.{frac}", if total < 0 { "-" } else { "" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_round_trip() {
        for tie in [TieBreak::Earliest, TieBreak::Latest, TieBreak::None] {
            let z = encode_member(tie, "room:42", 1_763_700_000_123);
            let (m, ts) = decode_member(tie, &z);
            assert_eq!(m, "room:42");
            assert_eq!(ts, (tie != TieBreak::None).then_some(1_763_700_000_123));
        }
        assert_eq!(
            encode_member(TieBreak::Earliest, "a", 0),
            "9007199254740991:a"
        );
        assert_eq!(
            encode_member(TieBreak::Latest, "a", 5),
            "0000000000000005:a"
        );
    }

    #[test]
    fn byte_order_of_prefixes_is_time_order() {
        let old = encode_member(TieBreak::Earliest, "a", 1_000);
        let new = encode_member(TieBreak::Earliest, "b", 2_000);
        assert!(old > new, "earliest: the older contribution sorts higher");
        let old = encode_member(TieBreak::Latest, "a", 1_000);
        let new = encode_member(TieBreak::Latest, "b", 2_000);
        assert!(new > old, "latest: the newer contribution sorts higher");
    }

    fn shown(rank: u64, count: u64) -> String {
        Percentile::of(rank, count)
            .map(|p| p.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn percentiles_round_down_at_every_boundary() {
        assert_eq!(shown(1, 200), "99.5");
        assert_eq!(shown(200, 200), "0");
        assert_eq!(shown(1, 1), "0");
        assert_eq!(shown(1, 2), "50");
        assert_eq!(shown(1, 3), "66.66", "2/3 rounds down, never up to 66.67");
        assert_eq!(shown(2, 3), "33.33");
        assert_eq!(shown(1, 10_000), "99.99");
        assert_eq!(shown(1, 10_001), "99.99", "99.990000999 rounds down");
        assert_eq!(shown(1, 20_001), "99.99");
        assert_eq!(
            shown(1, 1_000_000),
            "99.99",
            "99.9999 rounds down, never to 100"
        );
        assert_eq!(shown(11, 100), "89");
        assert_eq!(shown(2, 20), "90");
        assert_eq!(shown(96, 100), "4");
        assert_eq!(shown(10, 101), "90.09");
        assert_eq!(shown(1, u64::MAX), "99.99");
        assert_eq!(shown(u64::MAX - 1, u64::MAX), "0");
        assert_eq!(Percentile::of(0, 5), None);
        assert_eq!(Percentile::of(6, 5), None);
        assert_eq!(Percentile::of(1, 0), None);
    }

    #[test]
    fn percentiles_agree_with_exact_fractions() {
        for count in 1..=300u64 {
            for rank in 1..=count {
                let h = Percentile::of(rank, count).map(Percentile::hundredths);
                let h = u64::from(h.unwrap_or(u32::MAX));
                // h/100 <= 100 (count - rank)/count < (h + 1)/100, in integers.
                assert!(h * count <= 10_000 * (count - rank), "{rank}/{count}");
                assert!(10_000 * (count - rank) < (h + 1) * count, "{rank}/{count}");
            }
        }
    }

    #[test]
    fn percentiles_serialize_as_numbers_with_at_most_two_decimals() {
        let json =
            |rank, count| serde_json::to_string(&Percentile::of(rank, count)).unwrap_or_default();
        assert_eq!(json(1, 200), "99.5");
        assert_eq!(json(2, 3), "33.33");
        assert_eq!(json(10, 101), "90.09");
        assert_eq!(json(1, 2), "50");
        assert_eq!(json(3, 3), "0");
        assert_eq!(json(4, 3), "null");
        let value: serde_json::Value = serde_json::from_str(&json(1, 200)).unwrap_or_default();
        assert_eq!(value.as_f64(), Some(99.5));
    }

    fn envelope() -> Envelope {
        Envelope {
            board: "tips".into(),
            scope: Some("r1".into()),
            window: "7d".into(),
            scale: 2,
            count: 1,
            window_from: 10,
            window_to: 20,
            as_of: None,
        }
    }

    #[test]
    fn the_envelope_opens_every_answer_with_its_fields_in_order() {
        let page = Page {
            envelope: envelope(),
            entries: Vec::new(),
        };
        let head = r#""board":"tips","scope":"r1","window":"7d","scale":2,"count":1,"window_from":10,"window_to":20,"as_of":null"#;
        assert_eq!(
            serde_json::to_string(&page).unwrap_or_default(),
            format!("{{{head},\"entries\":[]}}")
        );
        let rank = MemberRank {
            envelope: envelope(),
            member: "ann".into(),
            rank: Some(1),
            competition_rank: Some(1),
            dense_rank: None,
            percentile: Percentile::of(1, 1),
            total: Some(5),
            last_ts: None,
        };
        assert_eq!(
            serde_json::to_string(&rank).unwrap_or_default(),
            format!(
                "{{{head},\"member\":\"ann\",\"rank\":1,\"competition_rank\":1,\
                 \"percentile\":0,\"total\":5,\"last_ts\":null}}"
            )
        );
        let subset = Subset {
            envelope: envelope(),
            entries: Vec::new(),
        };
        assert_eq!(
            serde_json::to_string(&subset).unwrap_or_default(),
            format!("{{{head},\"entries\":[]}}")
        );
    }

    #[test]
    fn totals_format_with_scale() {
        assert_eq!(format_total(1500, 0), "1500");
        assert_eq!(format_total(1500, 2), "15.00");
        assert_eq!(format_total(5, 2), "0.05");
        assert_eq!(format_total(-310, 2), "-3.10");
        assert_eq!(format_total(i64::MIN, 2), "-92233720368547758.08");
    }
}
