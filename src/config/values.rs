//! Parsers of the value kinds several sections share (durations, bounded counts, required
//! text); each refusal names the key.

use std::time::Duration;

use super::error::{invalid, ConfigError};
use crate::domain::board::parse_duration_ms;

/// Longest duration any key accepts: 100 years keeps every time computed from it (such as
/// `now - window`) far inside the ±2^53 ms that scores and replies carry exactly.
const MAX_DURATION_MS: i64 = 36_500 * 86_400_000;

/// A duration such as `500ms` or `7d`, in ms, at most [`MAX_DURATION_MS`].
pub(super) fn duration(key: &str, text: &str) -> Result<i64, ConfigError> {
    match parse_duration_ms(text) {
        Some(ms) if ms <= MAX_DURATION_MS => Ok(ms),
        Some(_) => Err(invalid(key, text, "must be at most 36500d")),
        None => Err(invalid(
            key,
            text,
            "not a duration such as 500ms, 30s, 5m, 6h or 7d",
        )),
    }
}

/// A duration of at least one second.
pub(super) fn seconds_at_least_one(key: &str, text: &str) -> Result<Duration, ConfigError> {
    match duration(key, text)? {
        ms if ms < 1_000 => Err(invalid(key, text, "must be at least 1s")),
        ms => Ok(Duration::from_millis(ms as u64)),
    }
}

/// A duration longer than zero, in ms.
pub(super) fn positive_duration(key: &str, text: &str) -> Result<i64, ConfigError> {
    match duration(key, text)? {
        0 => Err(invalid(key, text, "must be longer than zero")),
        ms => Ok(ms),
    }
}

/// A count inside `range`.
pub(super) fn count(
    key: &str,
    value: i64,
    range: std::ops::RangeInclusive<i64>,
) -> Result<usize, ConfigError> {
    if range.contains(&value) {
        Ok(value as usize)
    } else {
        Err(invalid(
            key,
            value.to_string(),
            format!("must be between {} and {}", range.start(), range.end()),
        ))
    }
}

/// Text that must not be empty.
pub(super) fn non_empty(key: &str, text: &str) -> Result<String, ConfigError> {
    if text.is_empty() {
        Err(invalid(key, text, "must not be empty"))
    } else {
        Ok(text.to_string())
    }
}
