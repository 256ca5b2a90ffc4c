//! Times on the command line: `--at` parsed from RFC 3339 or epoch milliseconds, and times
//! shown as RFC 3339 in UTC.

use chrono::{DateTime, SecondsFormat, Utc};

/// Parses a time given as RFC 3339 or epoch milliseconds.
pub fn parse_time(text: &str) -> Result<i64, String> {
    let ms = if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        text.parse::<i64>()
            .map_err(|_| format!("{text:?} is out of range"))?
    } else {
        DateTime::parse_from_rfc3339(text)
            .map(|t| t.timestamp_millis())
            .map_err(|_| format!("{text:?} is neither RFC 3339 nor epoch milliseconds"))?
    };
    if !(0..=crate::domain::board::MAX_TOTAL).contains(&ms) {
        return Err(format!("{text:?} is outside 1970 .. 2^53-1 ms"));
    }
    Ok(ms)
}

/// `ms` as RFC 3339 in UTC with milliseconds (the bare number when out of range).
pub(super) fn show_time(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
        .unwrap_or_else(|| ms.to_string())
}

/// `, as of <time>` when the ranking's last change is known.
pub(super) fn as_of(at: Option<i64>) -> String {
    at.map(|t| format!(", as of {}", show_time(t)))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_both_ways() {
        assert_eq!(parse_time("1763700000123"), Ok(1_763_700_000_123));
        assert_eq!(
            parse_time("2025-11-21T04:40:00.123Z"),
            Ok(1_763_700_000_123)
        );
        assert_eq!(
            parse_time("2025-11-21T05:40:00.123+01:00"),
            Ok(1_763_700_000_123)
        );
        assert!(parse_time("yesterday").is_err());
        assert!(parse_time("-5").is_err());
        assert!(parse_time("9223372036854775807").is_err());
        assert!(parse_time("1969-12-31T23:59:59Z").is_err());
    }
}
