//! What the scheduled jobs did: roll and resummarize runs per board (their time, what they
//! expired, whether they finished), the ticks this process ran, and each board's live
//! window.
//!
//! A board with several windows has one series per board, not per window: the counters
//! add up the work of every window's instances, and the window gauges show the widest
//! window, the one whose start is the oldest event still counted anywhere (an older one is
//! late) and whose instances keep the idempotency keys. Every window's range ends at the
//! same time.

use std::collections::BTreeMap;

use prometheus::{GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, Registry};

use super::{counter_vec, gauge_vec, histogram_vec, Failure, Metrics};
use crate::domain::board::{Board, Mode};

/// What one roll or resummarize run of a board did, in plain numbers.
#[derive(Debug, Clone, Copy)]
pub struct Rolled<'a> {
    /// Board name.
    pub board: &'a str,
    /// `incremental` or `resummarize`.
    pub mode: &'a str,
    /// Slices expired and unregistered.
    pub slices_expired: u64,
    /// Members that left an instance.
    pub members_removed: u64,
    /// Instances whose live slices were summed again.
    pub resummed: u64,
    /// Whether every instance was rolled.
    pub complete: bool,
    /// Failed instances per Redis error kind.
    pub redis_errors: &'a BTreeMap<&'static str, u64>,
    /// The live range after the run (epoch ms, end exclusive), when known.
    pub window: Option<(i64, i64)>,
}

/// The jobs' families.
pub(super) struct RollFamilies {
    /// `rollboard_roll_duration_seconds`.
    duration: HistogramVec,
    /// `rollboard_slices_expired_total`.
    slices_expired: IntCounterVec,
    /// `rollboard_members_removed_total`.
    members_removed: IntCounterVec,
    /// `rollboard_instances_resummed_total`.
    resummed: IntCounterVec,
    /// `rollboard_last_roll_timestamp_seconds`.
    last_roll: GaugeVec,
    /// `rollboard_roll_failures_total`.
    failures: IntCounterVec,
    /// `rollboard_job_runs_total`.
    job_runs: IntCounterVec,
    /// `rollboard_window_start_timestamp_seconds`.
    window_start: GaugeVec,
    /// `rollboard_window_end_timestamp_seconds`.
    window_end: GaugeVec,
}

impl RollFamilies {
    /// Registers the families, at zero for every board and job.
    pub(super) fn new(registry: &Registry, boards: &[Board]) -> RollFamilies {
        let families = RollFamilies {
            duration: histogram_vec(
                registry,
                HistogramOpts::new(
                    "rollboard_roll_duration_seconds",
                    "Time of one roll or resummarize run of a board.",
                )
                .buckets(vec![
                    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0,
                ]),
                &["board", "mode"],
            ),
            slices_expired: counter_vec(
                registry,
                "rollboard_slices_expired_total",
                "Slices expired by the roll jobs.",
                &["board"],
            ),
            members_removed: counter_vec(
                registry,
                "rollboard_members_removed_total",
                "Members that left a board instance because none of their events is live.",
                &["board"],
            ),
            resummed: counter_vec(
                registry,
                "rollboard_instances_resummed_total",
                "Resummarize instances whose live slices were summed again (one that no apply or expiry changed since its last sum keeps its ranking).",
                &["board"],
            ),
            last_roll: gauge_vec(
                registry,
                "rollboard_last_roll_timestamp_seconds",
                "Unix time of the last completed roll of a board.",
                &["board"],
            ),
            failures: counter_vec(
                registry,
                "rollboard_roll_failures_total",
                "Roll or resummarize runs of a board that did not roll every instance (the next \
                 run catches up).",
                &["board", "mode"],
            ),
            job_runs: counter_vec(
                registry,
                "rollboard_job_runs_total",
                "Ticks of a scheduled job (roll, resummarize) this process ran, under the job's \
                 lease; summed over the replicas, one per tick.",
                &["job"],
            ),
            window_start: gauge_vec(
                registry,
                "rollboard_window_start_timestamp_seconds",
                "Start of the oldest live slice of a board (of its widest window) as of its \
                 last complete roll, or as of the clock at start-up before this process's \
                 first one (window_from in queries), Unix time.",
                &["board"],
            ),
            window_end: gauge_vec(
                registry,
                "rollboard_window_end_timestamp_seconds",
                "End of the live range of a board as of its last complete roll, or as of the \
                 clock at start-up before this process's first one (window_to in queries), \
                 Unix time: once the clock passes it, a slice that left the window is \
                 still counted until the next roll.",
                &["board"],
            ),
        };
        families.zero(boards);
        families
    }

    /// Every series of a known board and job, at zero.
    fn zero(&self, boards: &[Board]) {
        for job in ["roll", "resummarize"] {
            self.job_runs.with_label_values(&[job]);
        }
        for b in boards {
            let board_mode = [b.name.as_str(), b.mode.as_str()];
            self.failures.with_label_values(&board_mode);
            self.duration.with_label_values(&board_mode);
            self.window_start.with_label_values(&[&b.name]);
            self.window_end.with_label_values(&[&b.name]);
            self.slices_expired.with_label_values(&[&b.name]);
            self.members_removed.with_label_values(&[&b.name]);
            if b.mode == Mode::Resummarize {
                self.resummed.with_label_values(&[&b.name]);
            }
            self.last_roll.with_label_values(&[&b.name]);
        }
    }

    /// Sets the window gauges of `board` to `from`..`to` (epoch ms).
    fn window(&self, board: &str, from: i64, to: i64) {
        self.window_start
            .with_label_values(&[board])
            .set(from as f64 / 1000.0);
        self.window_end
            .with_label_values(&[board])
            .set(to as f64 / 1000.0);
    }
}

impl Metrics {
    /// Sets the window gauges of every board (its widest window) from its definition and
    /// `now_ms` (Redis's clock), as a roll at `now_ms` on a board rolled on time would: the process shows its
    /// boards' windows from the start instead of 0 until its first complete roll. A complete
    /// roll sets them again, from the stored watermark.
    pub fn windows_at(&self, boards: &[Board], now_ms: i64) {
        for board in boards {
            let (from, to) = board.widest().live_range(now_ms, None);
            self.roll.window(&board.name, from, to);
        }
    }

    /// A roll or resummarize run of one board finished. What it expired counts either way;
    /// the last-roll time and the window move only when every instance was rolled, else
    /// the run counts as failed (with one Redis error per instance that failed on one).
    pub fn rolled(&self, report: &Rolled<'_>, seconds: f64, now_ms: i64) {
        let roll = &self.roll;
        roll.duration
            .with_label_values(&[report.board, report.mode])
            .observe(seconds);
        roll.slices_expired
            .with_label_values(&[report.board])
            .inc_by(report.slices_expired);
        roll.members_removed
            .with_label_values(&[report.board])
            .inc_by(report.members_removed);
        if report.resummed > 0 {
            roll.resummed
                .with_label_values(&[report.board])
                .inc_by(report.resummed);
        }
        if !report.complete {
            for (kind, n) in report.redis_errors {
                self.redis.errors_of_kind(kind, *n);
            }
            self.roll_failed(report.board, report.mode, None);
            return;
        }
        roll.last_roll
            .with_label_values(&[report.board])
            .set(now_ms as f64 / 1000.0);
        if let Some((from, to)) = report.window {
            roll.window(report.board, from, to);
        }
    }

    /// A roll or resummarize run of one board did not roll every instance; `error` is the
    /// Redis error that stopped the whole run, if one did.
    pub fn roll_failed(&self, board: &str, mode: &str, error: Option<&dyn Failure>) {
        if let Some(error) = error {
            self.redis_error(error);
        }
        self.roll.failures.with_label_values(&[board, mode]).inc();
    }

    /// This process took the lease of a tick of `job` (`roll`, `resummarize`) and runs it.
    pub fn job_run(&self, job: &str) {
        self.roll.job_runs.with_label_values(&[job]).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{boards, sample};
    use super::Metrics;

    #[test]
    fn the_window_gauges_of_a_board_with_several_windows_show_its_widest() {
        let boards = crate::config::Settings::from_toml(
            "[[boards]]\nname = \"tips\"\nmember = \"user\"\nwindows = [\"24h\", \"7d\", \"1h\"]\nslice = \"1h\"\n",
        )
        .expect("boards")
        .boards;
        let metrics = Metrics::new(&boards);
        // 2026-11-26T10:30:00Z: the live range ends at 11:00 in every window.
        let now = 1_795_689_000_000;
        metrics.windows_at(&boards, now);
        let text = metrics.render();
        let gauge = |name: &str| {
            sample(
                &text,
                &format!("rollboard_window_{name}_timestamp_seconds{{board=\"tips\"}}"),
            )
        };
        assert_eq!(gauge("end"), Some(1_795_690_800.0));
        assert_eq!(gauge("start"), Some(1_795_690_800.0 - 7.0 * 86_400.0));
        assert_eq!(
            text.matches("rollboard_window_start_timestamp_seconds{")
                .count(),
            1
        );
    }

    #[test]
    fn window_gauges_are_the_live_range_at_start_up() {
        let boards = boards();
        let metrics = Metrics::new(&boards);
        // 2026-11-26T10:30:00Z: the day board's live range ends at 11:00, the week's at 12:00.
        let now = 1_795_689_000_000;
        metrics.windows_at(&boards, now);
        let text = metrics.render();
        let gauge = |name: &str, board: &str| {
            sample(
                &text,
                &format!("rollboard_window_{name}_timestamp_seconds{{board=\"{board}\"}}"),
            )
        };
        assert_eq!(gauge("end", "day"), Some(1_795_690_800.0));
        assert_eq!(gauge("start", "day"), Some(1_795_690_800.0 - 86_400.0));
        assert_eq!(gauge("end", "week"), Some(1_795_694_400.0));
        assert_eq!(
            gauge("start", "week"),
            Some(1_795_694_400.0 - 7.0 * 86_400.0)
        );
    }
}
