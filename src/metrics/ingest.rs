//! What the consumer did with its batches: events applied, skipped and dead-lettered, the
//! size and time of a batch, and the board instances whose apply keeps failing.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGaugeVec, Registry};
use tracing::warn;

use super::{counter_vec, int_gauge_vec, register, Failure, Metrics};
use crate::domain::board::Board;
use crate::domain::event::Reason;

/// How long a board stays reported as failing after its last failed apply when no apply
/// of it succeeds in between.
pub const FAILING_HOLD: Duration = Duration::from_secs(600);

/// Why an event was skipped at one board.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Its idempotency key was already applied.
    Duplicate,
    /// Its slice has left the board's window.
    Late,
}

impl Skip {
    fn as_str(self) -> &'static str {
        match self {
            Skip::Duplicate => "duplicate",
            Skip::Late => "late",
        }
    }
}

/// The consumer's families, and the failing board instances behind `/readyz`.
pub(super) struct IngestFamilies {
    /// `rollboard_events_applied_total`.
    applied: IntCounterVec,
    /// `rollboard_events_skipped_total`.
    skipped: IntCounterVec,
    /// `rollboard_events_dead_lettered_total`.
    dead_lettered: IntCounterVec,
    /// `rollboard_batch_events`.
    batch_events: Histogram,
    /// `rollboard_apply_duration_seconds`.
    apply_duration: Histogram,
    /// `rollboard_apply_failures_total`.
    apply_failures: IntCounterVec,
    /// `rollboard_board_apply_failing`.
    board_failing: IntGaugeVec,
    /// Board instances whose apply failed through every retry, and when that last happened.
    failing: Mutex<HashMap<(String, Option<String>), Instant>>,
    /// The error of the consumer's last step, while its steps fail (e.g. `OOM`), for `/readyz`.
    consumer_error: Mutex<Option<String>>,
    /// The configured board names (the `board` label values).
    boards: Vec<String>,
}

impl IngestFamilies {
    /// Registers the families, at zero for every board and reason.
    pub(super) fn new(registry: &Registry, boards: &[Board]) -> IngestFamilies {
        let families = IngestFamilies {
            applied: counter_vec(
                registry,
                "rollboard_events_applied_total",
                "Events applied, per board.",
                &["board"],
            ),
            skipped: counter_vec(
                registry,
                "rollboard_events_skipped_total",
                "Events not applied to a board because they were duplicates or late.",
                &["board", "reason"],
            ),
            dead_lettered: counter_vec(
                registry,
                "rollboard_events_dead_lettered_total",
                "Events moved to the dead-letter stream, per reason.",
                &["reason"],
            ),
            batch_events: histogram(
                registry,
                HistogramOpts::new(
                    "rollboard_batch_events",
                    "Entries per batch read from the stream.",
                )
                .buckets(vec![
                    1.0, 5.0, 10.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
                ]),
            ),
            apply_duration: histogram(
                registry,
                HistogramOpts::new(
                    "rollboard_apply_duration_seconds",
                    "Time to apply one batch: validation, scripts, dead letters and ack.",
                ),
            ),
            apply_failures: counter_vec(
                registry,
                "rollboard_apply_failures_total",
                "Applies of a board instance's share of a batch that failed for a reason other \
                 than an outage (a key of the wrong type, corrupt data, a script error), per board.",
                &["board"],
            ),
            board_failing: int_gauge_vec(
                registry,
                "rollboard_board_apply_failing",
                "Board instances whose events are being dead-lettered (apply_failed) because \
                 their apply failed through every retry.",
                &["board"],
            ),
            failing: Mutex::new(HashMap::new()),
            consumer_error: Mutex::new(None),
            boards: boards.iter().map(|b| b.name.clone()).collect(),
        };
        families.zero();
        families
    }

    /// Every series of a known board and reason, at zero.
    fn zero(&self) {
        for board in &self.boards {
            self.apply_failures.with_label_values(&[board]);
            self.board_failing.with_label_values(&[board]);
            self.applied.with_label_values(&[board]);
            for skip in [Skip::Duplicate, Skip::Late] {
                self.skipped
                    .with_label_values(&[board.as_str(), skip.as_str()]);
            }
        }
        for reason in Reason::ALL {
            self.dead_lettered.with_label_values(&[reason.as_str()]);
        }
    }
}

fn histogram(registry: &Registry, opts: HistogramOpts) -> Histogram {
    register(registry, Histogram::with_opts(opts).expect("valid metric"))
}

impl Metrics {
    /// A batch of `entries` stream entries was processed in `seconds`.
    pub fn batch(&self, entries: usize, seconds: f64) {
        self.ingest.batch_events.observe(entries as f64);
        self.ingest.apply_duration.observe(seconds);
    }

    /// `n` events were applied to `board`.
    pub fn applied(&self, board: &str, n: u64) {
        if n > 0 {
            self.ingest.applied.with_label_values(&[board]).inc_by(n);
        }
    }

    /// `n` events were skipped at `board`.
    pub fn skipped(&self, board: &str, why: Skip, n: u64) {
        if n > 0 {
            self.ingest
                .skipped
                .with_label_values(&[board, why.as_str()])
                .inc_by(n);
        }
    }

    /// One event was moved to the dead-letter stream.
    pub fn dead_lettered(&self, reason: Reason) {
        self.ingest
            .dead_lettered
            .with_label_values(&[reason.as_str()])
            .inc();
    }

    /// One apply attempt of a board instance failed (not an outage).
    pub fn apply_failed(&self, board: &str, scope: Option<&str>, error: &dyn Failure) {
        self.redis_error(error);
        self.ingest.apply_failures.with_label_values(&[board]).inc();
        warn!(board, scope, error = %error, "apply of a board instance failed");
    }

    /// A board instance's apply failed through every retry: its events are dead-lettered
    /// until one succeeds again.
    pub fn apply_gave_up(&self, board: &str, scope: Option<&str>, events: usize) {
        warn!(
            board,
            scope,
            events,
            "apply kept failing; the instance's events go to the dead-letter stream (apply_failed)"
        );
        if let Ok(mut failing) = self.ingest.failing.lock() {
            failing.insert(
                (board.to_string(), scope.map(str::to_string)),
                Instant::now(),
            );
        }
        self.refresh_failing();
    }

    /// An apply of a board instance succeeded.
    pub fn apply_ok(&self, board: &str, scope: Option<&str>) {
        let removed = self.ingest.failing.lock().is_ok_and(|mut failing| {
            failing
                .remove(&(board.to_string(), scope.map(str::to_string)))
                .is_some()
        });
        if removed {
            tracing::info!(board, scope, "apply of a board instance recovered");
            self.refresh_failing();
        }
    }

    /// Whether a board instance is currently failing (its events get one attempt, not the
    /// full retry, so that it cannot hold every batch back).
    pub fn is_failing(&self, board: &str, scope: Option<&str>) -> bool {
        self.ingest.failing.lock().is_ok_and(|failing| {
            failing
                .get(&(board.to_string(), scope.map(str::to_string)))
                .is_some_and(|t| t.elapsed() < FAILING_HOLD)
        })
    }

    /// The consumer's last step failed (`Some`) or succeeded (`None`).
    pub fn consumer_step(&self, error: Option<&dyn Failure>) {
        if let Ok(mut last) = self.ingest.consumer_error.lock() {
            *last = error.map(ToString::to_string);
        }
    }

    /// The error of the consumer's last step while its steps fail, for `/readyz`.
    pub fn consumer_error(&self) -> Option<String> {
        self.ingest
            .consumer_error
            .lock()
            .ok()
            .and_then(|e| e.clone())
    }

    /// The boards with a failing instance, sorted, for `/readyz`.
    pub fn failing_boards(&self) -> Vec<String> {
        self.refresh_failing()
    }

    /// Drops failures older than [`FAILING_HOLD`], sets the gauges and lists the boards.
    fn refresh_failing(&self) -> Vec<String> {
        let ingest = &self.ingest;
        let Ok(mut failing) = ingest.failing.lock() else {
            return Vec::new();
        };
        failing.retain(|_, t| t.elapsed() < FAILING_HOLD);
        let mut per_board: HashMap<&str, i64> = HashMap::new();
        for (board, _) in failing.keys() {
            *per_board.entry(board.as_str()).or_default() += 1;
        }
        for board in &ingest.boards {
            let n = per_board.get(board.as_str()).copied().unwrap_or(0);
            ingest.board_failing.with_label_values(&[board]).set(n);
        }
        let mut boards: Vec<String> = per_board.keys().map(|b| b.to_string()).collect();
        boards.sort();
        boards
    }
}
