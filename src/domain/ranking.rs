//! Read-side types (entries, pages, member ranks) and the decoding of ZSet members.
//!
//! A ZSet member is the plain member behind a fixed-width tie-break prefix: 16 decimal
//! digits of `2^53-1 - last_ts` (earliest) or `last_ts` (latest), then `:`. Redis orders
//! equal scores by member bytes, so `ZREVRANGE` yields exactly the order of docs/design.md (*Window and order*).

use serde::Serialize;

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

/// One ranked member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    /// 1-based position in the order (unique).
    pub rank: u64,
    /// 1 + number of members with a strictly greater total.
    pub competition_rank: u64,
    /// The member.
    pub member: String,
    /// Exact total in the board's minor units.
    pub total: i64,
    /// Time of the member's latest live contribution (null for `tie_break = "none"`).
    pub last_ts: Option<i64>,
}

/// A page of a ranking (`top`, `around`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Page {
    /// Board name.
    pub board: String,
    /// Scope value, for scoped boards.
    pub scope: Option<String>,
    /// Decimal places of `total` (total = amount x 10^scale).
    pub scale: u32,
    /// Number of ranked members.
    pub count: u64,
    /// Start of the live range, epoch ms.
    pub window_from: i64,
    /// End of the live range, epoch ms.
    pub window_to: i64,
    /// When the ranking last changed, epoch ms (Redis's clock): the last apply or roll of
    /// an incremental instance, the last run that summed a resummarize one; null when
    /// nothing has been recorded yet (an instance never written).
    pub as_of: Option<i64>,
    /// The entries, best first.
    pub entries: Vec<Entry>,
}

/// The position of one member (`rank`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberRank {
    /// Board name.
    pub board: String,
    /// Scope value, for scoped boards.
    pub scope: Option<String>,
    /// Decimal places of `total`.
    pub scale: u32,
    /// Number of ranked members.
    pub count: u64,
    /// Start of the live range, epoch ms.
    pub window_from: i64,
    /// End of the live range, epoch ms.
    pub window_to: i64,
    /// When the ranking last changed, epoch ms (Redis's clock): the last apply or roll of
    /// an incremental instance, the last run that summed a resummarize one; null when
    /// nothing has been recorded yet (an instance never written).
    pub as_of: Option<i64>,
    /// The member.
    pub member: String,
    /// 1-based position, null when the member is not on the board.
    pub rank: Option<u64>,
    /// Competition rank, null when the member is not on the board.
    pub competition_rank: Option<u64>,
    /// Exact total, null when the member is not on the board.
    pub total: Option<i64>,
    /// Latest live contribution time.
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
            .scope
            .as_deref()
            .map(|s| format!(" (scope {s:?})"))
            .unwrap_or_default();
        if let serde_json::Value::Object(fields) = &mut value {
            fields.insert(
                "error".into(),
                format!("{:?} is not on board {}{scope}", self.member, self.board).into(),
            );
        }
        value
    }
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

    #[test]
    fn totals_format_with_scale() {
        assert_eq!(format_total(1500, 0), "1500");
        assert_eq!(format_total(1500, 2), "15.00");
        assert_eq!(format_total(5, 2), "0.05");
        assert_eq!(format_total(-310, 2), "-3.10");
        assert_eq!(format_total(i64::MIN, 2), "-92233720368547758.08");
    }
}
