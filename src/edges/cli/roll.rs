//! `rollboard roll`: the roll and resummarize jobs run once, as of a time no later than
//! Redis's clock, one report line per board.

use tokio_util::sync::CancellationToken;

use super::connect::{check_settings, connect_unchecked};
use super::time::show_time;
use super::{Usage, EXIT_UNAVAILABLE};
use crate::config::Settings;
use crate::domain::board::Mode;
use crate::roll::{self, Job, Report};

/// `roll`: runs every job on every board (or on `board`) once, as of `at` (default: Redis's
/// clock); exit 75 when every failure was an outage, 1 for any other.
pub(super) async fn roll(
    settings: &Settings,
    board: Option<String>,
    at: Option<i64>,
    force: bool,
) -> anyhow::Result<u8> {
    if let Some(name) = &board {
        settings
            .board(name)
            .ok_or_else(|| Usage(format!("unknown board {name:?}")))?;
    }
    let store = connect_unchecked(settings).await?;
    // The one clock: Redis's, the same the daemons judge by. A refused roll writes
    // nothing, not even a first board's settings record.
    let clock = store.time_ms().await?;
    if let Some(at) = at.filter(|_| !force) {
        check_roll_time(at, clock)?;
    }
    check_settings(settings, &store).await?;
    let now = at.unwrap_or(clock);
    let reports = roll::run_once(
        &store,
        &settings.boards,
        Job::All,
        board.as_deref(),
        now,
        settings.schedule.chunk,
        &CancellationToken::new(),
    )
    .await?;
    Ok(print_reports(reports))
}

/// Prints one line per board (and one per board that failed); the exit status.
fn print_reports(reports: Vec<Report>) -> u8 {
    let mut failed = false;
    // Exit 75 when every failure was an outage: then running it again may succeed.
    let mut only_outages = true;
    for r in reports {
        let mut resummed = if r.mode == Mode::Resummarize.as_str() {
            format!(", {} re-summed", r.resummed)
        } else {
            String::new()
        };
        if r.periods_removed > 0 {
            resummed += &format!(", {} closed period(s) deleted", r.periods_removed);
        }
        println!(
            "{} ({}): {} instance(s), {} slice(s) expired, {} member(s) removed, {} id(s) forgotten{resummed}",
            r.board, r.mode, r.instances, r.slices_expired, r.members_removed, r.ids_forgotten
        );
        if let Some(error) = &r.first_error {
            eprintln!(
                "{}: {} instance(s) failed, first: {error}",
                r.board, r.instances_failed
            );
            failed = true;
            only_outages &= !r.redis_errors.is_empty()
                && r.redis_errors.keys().all(|kind| *kind != "data")
                && r.redis_errors.values().sum::<u64>() >= r.instances_failed;
        }
    }
    match (failed, only_outages) {
        (false, _) => 0,
        (true, true) => EXIT_UNAVAILABLE,
        (true, false) => 1,
    }
}

/// Refuses a roll time later than Redis's clock: a roll expires every slice that is dead
/// at that time, forgets the idempotency keys due by then and raises the watermark for
/// good, so a roll ahead of the clock would drop live tips from the rankings and refuse
/// them as late (the one clock, see [`crate::domain::clock`]).
pub fn check_roll_time(at: i64, clock: i64) -> Result<(), Usage> {
    if at <= clock {
        return Ok(());
    }
    Err(Usage(format!(
        "--at {} is {} ms ahead of Redis's clock ({}); a roll cannot be undone (it expires \
         every slice dead at that time and forgets the ids due by then, for good): check the \
         time, or give --force",
        show_time(at),
        at - clock,
        show_time(clock),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roll_times_ahead_of_redis_are_refused() {
        let clock = 1_763_700_000_000;
        assert!(check_roll_time(clock - 86_400_000, clock).is_ok());
        assert!(check_roll_time(clock, clock).is_ok());
        let refused = check_roll_time(clock + 1, clock).map_err(|u| u.0);
        assert!(refused.is_err_and(|m| m.contains("Redis's clock") && m.contains("--force")));
    }
}
