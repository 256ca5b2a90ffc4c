//! Calendar periods: a day, a week or a month in an IANA time zone, DST included.
//!
//! A period starts at local midnight of its first day (`week_start` for a week, the 1st for
//! a month) and ends where the next one starts, so consecutive periods tile time with no gap
//! and no overlap. Where local midnight does not exist (a DST gap at midnight, or a day a
//! zone skipped) the period starts at the first instant after it; where it exists twice (a
//! fall-back at midnight), at the earlier one. A day is therefore 23, 24 or 25 hours long.
//!
//! Ids: `2026-11-26` for a day, `2026-11` for a month, the ISO week `2026-W48` for a week
//! starting on Monday, and the date of its first day (`2026-11-22`) for a week starting on
//! another day.

use chrono::{Datelike, Days, Months, NaiveDate, NaiveDateTime, NaiveTime, TimeZone, Weekday};
use chrono_tz::Tz;

/// The length of a calendar period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    /// A calendar day.
    Day,
    /// Seven days from the given weekday.
    Week(Weekday),
    /// A calendar month.
    Month,
}

/// One period in one time zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// The period's id (`2026-11-26`, `2026-W48`, `2026-11-22`, `2026-11`).
    pub id: String,
    /// Its first local day.
    pub first_day: NaiveDate,
    /// Its first instant (epoch ms).
    pub start_ms: i64,
    /// The first instant of the next period (epoch ms): when this one resets.
    pub end_ms: i64,
}

/// How long a search for the end of a skipped local midnight may go (a zone has skipped
/// a whole day, never more).
const MAX_GAP_MINUTES: u64 = 2 * 24 * 60;

impl Period {
    /// Parses `day`, `week` or `month`; a week starts on `week_start`.
    pub fn parse(period: &str, week_start: Weekday) -> Option<Period> {
        match period {
            "day" => Some(Period::Day),
            "week" => Some(Period::Week(week_start)),
            "month" => Some(Period::Month),
            _ => None,
        }
    }

    /// The period that holds the instant `ts_ms` in `zone`.
    pub fn span_at(self, zone: Tz, ts_ms: i64) -> Span {
        let local = match zone.timestamp_millis_opt(ts_ms).single() {
            Some(t) => t.date_naive(),
            // Out of chrono's range (about ±262 000 years): the nearest representable day.
            None if ts_ms < 0 => NaiveDate::MIN,
            None => NaiveDate::MAX,
        };
        self.span_of_day(zone, self.first_day(local))
    }

    /// The period before `span`.
    pub fn previous(self, zone: Tz, span: &Span) -> Span {
        self.span_at(zone, span.start_ms - 1)
    }

    /// The pattern of this period's ids (`2026-W48` for weeks from Monday, `2026-11-26`
    /// for days and other weeks, `2026-11` for months), without anchors: the shape an id
    /// has, whether or not it names a period ([`Period::parse_id`] tells).
    pub fn id_pattern(self) -> &'static str {
        match self {
            Period::Week(Weekday::Mon) => "[0-9]{4}-W[0-9]{2}",
            Period::Day | Period::Week(_) => "[0-9]{4}-[0-9]{2}-[0-9]{2}",
            Period::Month => "[0-9]{4}-[0-9]{2}",
        }
    }

    /// Whether `id` has the shape of this period's ids ([`Period::id_pattern`]).
    pub fn has_id_shape(self, id: &str) -> bool {
        let shape = match self {
            Period::Week(Weekday::Mon) => "dddd-Wdd",
            Period::Day | Period::Week(_) => "dddd-dd-dd",
            Period::Month => "dddd-dd",
        };
        id.len() == shape.len()
            && id.bytes().zip(shape.bytes()).all(|(c, s)| match s {
                b'd' => c.is_ascii_digit(),
                other => c == other,
            })
    }

    /// The period whose id is `id`, if `id` names one.
    pub fn parse_id(self, zone: Tz, id: &str) -> Option<Span> {
        let first = match self {
            Period::Day => NaiveDate::parse_from_str(id, "%Y-%m-%d").ok()?,
            Period::Month => NaiveDate::parse_from_str(&format!("{id}-01"), "%Y-%m-%d").ok()?,
            Period::Week(Weekday::Mon) => {
                let (year, week) = id.split_once("-W")?;
                let week: u32 = week.parse().ok().filter(|_| week.len() == 2)?;
                NaiveDate::from_isoywd_opt(year.parse().ok()?, week, Weekday::Mon)?
            }
            Period::Week(start) => Some(NaiveDate::parse_from_str(id, "%Y-%m-%d").ok()?)
                .filter(|d| d.weekday() == start)?,
        };
        let span = self.span_of_day(zone, first);
        // Only the canonical spelling names a period (`2026-11-5` does not).
        (span.id == id).then_some(span)
    }

    /// The first local day of the period that holds the local day `day`.
    fn first_day(self, day: NaiveDate) -> NaiveDate {
        match self {
            Period::Day => day,
            Period::Week(start) => {
                let back =
                    (7 + day.weekday().num_days_from_monday() - start.num_days_from_monday()) % 7;
                day.checked_sub_days(Days::new(back.into()))
                    .unwrap_or(NaiveDate::MIN)
            }
            Period::Month => day.with_day(1).unwrap_or(day),
        }
    }

    /// The first local day of the period after the one starting on `first`.
    fn next_first_day(self, first: NaiveDate) -> NaiveDate {
        let next = match self {
            Period::Day => first.checked_add_days(Days::new(1)),
            Period::Week(_) => first.checked_add_days(Days::new(7)),
            Period::Month => first.checked_add_months(Months::new(1)),
        };
        next.unwrap_or(NaiveDate::MAX)
    }

    /// The id of the period starting on the local day `first`.
    fn id(self, first: NaiveDate) -> String {
        match self {
            Period::Week(Weekday::Mon) => {
                let week = first.iso_week();
                format!("{:04}-W{:02}", week.year(), week.week())
            }
            Period::Day | Period::Week(_) => first.format("%Y-%m-%d").to_string(),
            Period::Month => first.format("%Y-%m").to_string(),
        }
    }

    /// The period starting on the local day `first`.
    fn span_of_day(self, zone: Tz, first: NaiveDate) -> Span {
        Span {
            id: self.id(first),
            first_day: first,
            start_ms: start_of_day(zone, first),
            end_ms: start_of_day(zone, self.next_first_day(first)),
        }
    }
}

/// The first instant of the local day `day` in `zone` (epoch ms): local midnight, the
/// earlier one when it happens twice, the first instant after it when it does not happen.
pub fn start_of_day(zone: Tz, day: NaiveDate) -> i64 {
    let midnight = day.and_time(NaiveTime::MIN);
    for minute in 0..=MAX_GAP_MINUTES {
        let local = midnight + chrono::Duration::minutes(minute as i64);
        if let Some(t) = zone.from_local_datetime(&local).earliest() {
            let mut ms = t.timestamp_millis();
            // After a gap the day starts at the transition, which may fall inside the
            // minute before `t`; zone transitions fall on whole seconds.
            if minute > 0 {
                while is_on_or_after(zone, ms - 1_000, midnight) {
                    ms -= 1_000;
                }
            }
            return ms;
        }
    }
    // No zone skips more than a day; the day's midnight in UTC.
    midnight.and_utc().timestamp_millis()
}

/// Whether the instant `ms` reads `local` or later on `zone`'s clocks.
fn is_on_or_after(zone: Tz, ms: i64, local: NaiveDateTime) -> bool {
    zone.timestamp_millis_opt(ms)
        .single()
        .is_some_and(|t| t.naive_local() >= local)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BERLIN: Tz = chrono_tz::Europe::Berlin;
    const NEW_YORK: Tz = chrono_tz::America::New_York;
    const HOUR: i64 = 3_600_000;

    fn day(text: &str) -> NaiveDate {
        NaiveDate::parse_from_str(text, "%Y-%m-%d").expect("a date")
    }

    fn at(zone: Tz, text: &str) -> i64 {
        let local =
            chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S").expect("a time");
        zone.from_local_datetime(&local)
            .earliest()
            .expect("exists")
            .timestamp_millis()
    }

    #[test]
    fn days_across_dst_are_23_and_25_hours_long() {
        let spring = Period::Day.span_at(BERLIN, at(BERLIN, "2026-03-29 12:00:00"));
        assert_eq!(spring.id, "2026-03-29");
        assert_eq!(spring.end_ms - spring.start_ms, 23 * HOUR);
        let fall = Period::Day.span_at(BERLIN, at(BERLIN, "2026-10-25 12:00:00"));
        assert_eq!(fall.end_ms - fall.start_ms, 25 * HOUR);
        let ny = Period::Day.span_at(NEW_YORK, at(NEW_YORK, "2026-11-01 00:30:00"));
        assert_eq!(ny.id, "2026-11-01");
        assert_eq!(ny.end_ms - ny.start_ms, 25 * HOUR);
    }

    #[test]
    fn ids_follow_the_period() {
        let ts = at(chrono_tz::UTC, "2026-11-26 10:00:00");
        let utc = chrono_tz::UTC;
        assert_eq!(Period::Day.span_at(utc, ts).id, "2026-11-26");
        assert_eq!(Period::Month.span_at(utc, ts).id, "2026-11");
        assert_eq!(Period::Week(Weekday::Mon).span_at(utc, ts).id, "2026-W48");
        let sunday = Period::Week(Weekday::Sun).span_at(utc, ts);
        assert_eq!(sunday.id, "2026-11-22");
        assert_eq!(sunday.first_day, day("2026-11-22"));
        // ISO weeks belong to the year of their Thursday.
        let new_year = at(utc, "2027-01-01 00:00:00");
        assert_eq!(
            Period::Week(Weekday::Mon).span_at(utc, new_year).id,
            "2026-W53"
        );
    }

    #[test]
    fn months_and_leap_days() {
        let utc = chrono_tz::UTC;
        let feb = Period::Month.span_at(utc, at(utc, "2028-02-29 23:59:59"));
        assert_eq!(feb.id, "2028-02");
        assert_eq!(feb.end_ms - feb.start_ms, 29 * 24 * HOUR);
        let leap = Period::Day.span_at(utc, at(utc, "2028-02-29 12:00:00"));
        assert_eq!(leap.id, "2028-02-29");
        assert_eq!(Period::Day.parse_id(utc, "2027-02-29"), None);
        let dec = Period::Month.span_at(BERLIN, at(BERLIN, "2026-12-31 23:30:00"));
        assert_eq!(Period::Month.span_at(BERLIN, dec.end_ms).id, "2027-01");
    }

    #[test]
    fn a_skipped_midnight_starts_the_day_at_the_first_instant_after_it() {
        // Santiago springs forward at 24:00 → 01:00 (2026-09-06).
        let santiago = chrono_tz::America::Santiago;
        let start = start_of_day(santiago, day("2026-09-06"));
        assert_eq!(start, at(santiago, "2026-09-06 01:00:00"));
        assert_eq!(
            Period::Day.span_at(santiago, start - 1).end_ms,
            start,
            "the day before ends where it starts"
        );
        // Samoa skipped 2011-12-30 entirely: the 29th ends where the 31st starts.
        let apia = chrono_tz::Pacific::Apia;
        let before = Period::Day.span_at(apia, at(apia, "2011-12-29 12:00:00"));
        let after = Period::Day.span_at(apia, before.end_ms);
        assert_eq!(after.id, "2011-12-31");
        assert_eq!(after.start_ms, before.end_ms);
    }

    #[test]
    fn only_canonical_ids_parse() {
        let utc = chrono_tz::UTC;
        for (period, id) in [
            (Period::Day, "2026-11-26"),
            (Period::Month, "2026-11"),
            (Period::Week(Weekday::Mon), "2026-W48"),
            (Period::Week(Weekday::Sun), "2026-11-22"),
        ] {
            assert_eq!(period.parse_id(utc, id).map(|s| s.id), Some(id.to_string()));
        }
        for (period, id) in [
            (Period::Day, "2026-11-5"),
            (Period::Day, "2026-13-01"),
            (Period::Month, "2026-1"),
            (Period::Week(Weekday::Mon), "2026-W8"),
            (Period::Week(Weekday::Mon), "2026-W54"),
            (Period::Week(Weekday::Sun), "2026-11-23"),
            (Period::Day, "current"),
        ] {
            assert_eq!(period.parse_id(utc, id), None, "{id}");
        }
    }

    fn any_period() -> impl Strategy<Value = Period> {
        prop_oneof![
            Just(Period::Day),
            Just(Period::Month),
            (0u8..7).prop_map(|d| Period::Week(Weekday::try_from(d).expect("0..7"))),
        ]
    }

    fn any_zone() -> impl Strategy<Value = Tz> {
        prop_oneof![
            Just(chrono_tz::UTC),
            Just(BERLIN),
            Just(NEW_YORK),
            Just(chrono_tz::America::Santiago),
            Just(chrono_tz::Australia::Lord_Howe),
            Just(chrono_tz::Asia::Kolkata),
            Just(chrono_tz::Pacific::Apia),
        ]
    }

    proptest! {
        #[test]
        fn periods_tile_time_and_ids_name_them(
            period in any_period(),
            zone in any_zone(),
            ts in 946_684_800_000i64..4_102_444_800_000,
        ) {
            let span = period.span_at(zone, ts);
            prop_assert!(span.start_ms <= ts && ts < span.end_ms, "{span:?} {ts}");
            let next = period.span_at(zone, span.end_ms);
            prop_assert_eq!(next.start_ms, span.end_ms);
            prop_assert_eq!(&period.previous(zone, &next), &span);
            let parsed = period.parse_id(zone, &span.id);
            prop_assert_eq!(parsed.as_ref(), Some(&span));
            // The start is a local midnight or the first instant after a skipped one.
            let local = zone.timestamp_millis_opt(span.start_ms).single().expect("one").naive_local();
            prop_assert_eq!(local.date(), span.first_day);
            let before = zone.timestamp_millis_opt(span.start_ms - 1_000).single().expect("one").naive_local();
            prop_assert!(before.date() < span.first_day, "{before} before {span:?}");
        }
    }
}
