//! `[schedule]`: when the roll and resummarize jobs run, how much of a board they read per
//! page, and how long a replica's lease on a tick lasts.

use std::time::Duration;

use serde::Deserialize;

use super::error::{invalid, ConfigError};
use super::values::{count, duration};

/// `[schedule]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawSchedule {
    /// `schedule.roll`: 6-field cron of the roll job.
    roll: String,
    /// `schedule.resummarize`: 6-field cron of the resummarize job.
    resummarize: String,
    /// `schedule.chunk`: fields listed per HSCAN page.
    chunk: i64,
    /// `schedule.lease`: how long a lease on a tick lasts without renewal.
    lease: String,
}

impl Default for RawSchedule {
    fn default() -> Self {
        RawSchedule {
            roll: "0 * * * * *".into(),
            resummarize: "0 * * * * *".into(),
            chunk: 250,
            lease: "30s".into(),
        }
    }
}

/// Scheduler settings.
#[derive(Debug, Clone)]
pub struct ScheduleSettings {
    /// 6-field cron of the roll job (incremental boards).
    pub roll: String,
    /// 6-field cron of the resummarize job.
    pub resummarize: String,
    /// Fields listed per HSCAN page by the roll and resummarize jobs (script calls are split
    /// into smaller, fixed budgets: see `store::EXPIRE_CALL_FIELDS`).
    pub chunk: usize,
    /// How long a replica's lease on a job's tick lasts without renewal (the holder renews
    /// it every third of this while it runs): how soon another replica takes the job over
    /// when the holder dies.
    pub lease: Duration,
}

impl RawSchedule {
    /// The validated `[schedule]` section.
    pub(super) fn validate(&self) -> Result<ScheduleSettings, ConfigError> {
        let chunk = count("schedule.chunk", self.chunk, 1..=5_000)?;
        Ok(ScheduleSettings {
            roll: check_cron("schedule.roll", &self.roll)?,
            resummarize: check_cron("schedule.resummarize", &self.resummarize)?,
            chunk,
            lease: lease_duration(&self.lease)?,
        })
    }
}

/// The lease of a job tick: at least 1 s (it is renewed every third of it, and a renewal
/// must reach Redis in time), at most an hour (a dead holder blocks the job that long).
fn lease_duration(text: &str) -> Result<Duration, ConfigError> {
    match duration("schedule.lease", text)? {
        ms if !(1_000..=3_600_000).contains(&ms) => {
            Err(invalid("schedule.lease", text, "must be between 1s and 1h"))
        }
        ms => Ok(Duration::from_millis(ms as u64)),
    }
}

/// The cron grammar accepted: in each field, a comma-separated list of numbers, three-letter
/// month or day names and `*`, as ranges (`a-b`) and steps (`/n`). The scheduler's extensions
/// (`L`, `W`, `#`, `?`, a `+` for day-of-month AND day-of-week) are refused: with them, as
/// with an empty list item, an expression may parse yet never fire, and the scheduler then
/// searches for its next time for seconds to minutes before the daemon could start.
fn plain_cron(expr: &str) -> Result<(), String> {
    for field in expr.split_whitespace() {
        for item in field.split(',') {
            if item.is_empty() {
                return Err(format!("field {field:?} has an empty list item"));
            }
            for part in item.split(['-', '/']) {
                let number = !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
                let name = part.len() == 3 && part.bytes().all(|b| b.is_ascii_alphabetic());
                if !(part == "*" || number || name) {
                    return Err(format!(
                        "{part:?} in field {field:?}: only numbers, three-letter names, *, \
                         ranges a-b, steps /n and lists a,b are accepted"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A 6-field cron expression in the plain grammar that the scheduler accepts.
fn check_cron(key: &str, expr: &str) -> Result<String, ConfigError> {
    if expr.split_whitespace().count() != 6 {
        return Err(invalid(
            key,
            expr,
            "expected a 6-field cron expression, seconds first",
        ));
    }
    plain_cron(expr).map_err(|why| invalid(key, expr, why))?;
    tokio_cron_scheduler::Job::new_async(expr, |_, _| Box::pin(async {}))
        .map(|_| expr.to_string())
        .map_err(|e| invalid(key, expr, format!("not a valid cron expression: {e}")))
}

#[cfg(test)]
mod tests {
    use super::plain_cron;
    use crate::config::testing::{refusal, BOARD};

    #[test]
    fn a_cron_expression_needs_six_fields() {
        let e = refusal(&format!("[schedule]\nroll = \"* * * * *\"\n{BOARD}"));
        assert!(e.contains("schedule.roll"), "{e}");
    }

    #[test]
    fn cron_expressions_that_never_fire_are_refused_at_once() {
        // Each of these made loading take from seconds to minutes (found by the config fuzz
        // target): the scheduler searched for a next time that never comes.
        for expr in [
            "0 * * * * +",
            "0 , * * * *",
            ", * * * * *",
            "0 * * , * *",
            "0 * * * * L",
        ] {
            let e = refusal(&format!("[schedule]\nroll = \"{expr}\"\n{BOARD}"));
            assert!(e.contains("schedule.roll"), "{expr}: {e}");
        }
        for expr in [
            "0 * * * * *",
            "*/15 0-59 * * JAN-DEC MON,TUE",
            "30 5 1 1,15 * *",
        ] {
            assert_eq!(plain_cron(expr), Ok(()), "{expr}");
        }
    }
}
