//! Prometheus metrics. One [`Metrics`] value owns the registry; each notable happening is
//! one method that counts it (and logs where an operator would want a line). Labels come
//! from small fixed sets (board names from the config, reasons, kinds): never member names
//! or raw error text.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use tracing::{debug, warn};

use crate::domain::board::Board;
use crate::domain::event::Reason;

/// Every `kind` label of `rollboard_redis_errors_total` ([`Failure::kind`]): all are
/// outages but `data`.
pub const ERROR_KINDS: [&str; 7] = [
    "connection",
    "timeout",
    "replicas",
    "redirected",
    "unavailable",
    "data",
    "other",
];

/// The route templates of the HTTP API (the `route` label values of
/// `rollboard_http_request_duration_seconds`): never raw paths.
pub const HTTP_ROUTES: [&str; 8] = [
    "/v1/boards",
    "/v1/boards/{board}/top",
    "/v1/boards/{board}/members/{member}",
    "/v1/boards/{board}/members/{member}/around",
    "/v1/events",
    "/metrics",
    "/healthz",
    "/readyz",
];

/// The `route` label of `rollboard_http_requests_total` for a request that matched no
/// route (an unknown path): one fixed value, so a scan cannot grow the label set.
pub const UNMATCHED_ROUTE: &str = "unmatched";

/// The result of events sent to `POST /v1/events` (the `result` label of
/// `rollboard_intake_events_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intake {
    /// Appended to the stream and confirmed (202), one per event.
    Accepted,
    /// In a request refused because at least one of its events is invalid (400): every
    /// event of the request counts, since none is appended.
    Invalid,
    /// A request whose body was refused as a whole before its events could be told apart
    /// (not JSON or UTF-8, too large, too many events, wrong content type): one per request.
    Malformed,
    /// Valid, but Redis did not confirm the append in time (503): one per event. The
    /// producer retries; a repeat is a duplicate, never a double count.
    Unavailable,
    /// Valid, but Redis refused the append for a reason that is not an outage (500).
    Failed,
}

impl Intake {
    /// Every result, in the order of the metric's label values.
    pub const ALL: [Intake; 5] = [
        Intake::Accepted,
        Intake::Invalid,
        Intake::Malformed,
        Intake::Unavailable,
        Intake::Failed,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Intake::Accepted => "accepted",
            Intake::Invalid => "invalid",
            Intake::Malformed => "malformed",
            Intake::Unavailable => "unavailable",
            Intake::Failed => "failed",
        }
    }
}

/// The commit the binary was built from (`build.rs`), or `unknown`.
pub const COMMIT: &str = match option_env!("ROLLBOARD_COMMIT") {
    Some(commit) => commit,
    None => "unknown",
};

/// What the metrics read of a failed Redis call (the store's errors implement it).
pub trait Failure: std::fmt::Display {
    /// A small fixed label, one of [`ERROR_KINDS`].
    fn kind(&self) -> &'static str;
    /// Whether the write was not confirmed by enough replicas in time.
    fn is_replica_ack_failure(&self) -> bool;
}

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
    pub redis_errors: &'a std::collections::BTreeMap<&'static str, u64>,
    /// The live range after the run (epoch ms, end exclusive), when known.
    pub window: Option<(i64, i64)>,
}

/// The process's metrics.
pub struct Metrics {
    registry: Registry,
    applied: IntCounterVec,
    skipped: IntCounterVec,
    dead_lettered: IntCounterVec,
    batch_events: Histogram,
    apply_duration: Histogram,
    roll_duration: HistogramVec,
    slices_expired: IntCounterVec,
    members_removed: IntCounterVec,
    resummed: IntCounterVec,
    last_roll: GaugeVec,
    pending: IntGauge,
    lag: IntGauge,
    stream_pending: IntGaugeVec,
    stream_lag: IntGaugeVec,
    stream_length: IntGaugeVec,
    stream_max_length: IntGaugeVec,
    stream_trimmed: IntCounterVec,
    redis_errors: IntCounterVec,
    reconnects: IntCounter,
    replica_ack_failures: IntCounter,
    up: Gauge,
    clock_skew: Gauge,
    clock_skewed: IntGauge,
    apply_failures: IntCounterVec,
    board_failing: IntGaugeVec,
    roll_failures: IntCounterVec,
    job_runs: IntCounterVec,
    window_start: GaugeVec,
    window_end: GaugeVec,
    script_duration: HistogramVec,
    http_duration: HistogramVec,
    http_requests: IntCounterVec,
    intake: IntCounterVec,
    token_reloads: IntCounterVec,
    token_file_stale: IntGaugeVec,
    /// Board instances whose apply failed through every retry, and when that last happened.
    failing: Mutex<HashMap<(String, Option<String>), Instant>>,
    /// The error of the consumer's last step, while its steps fail (e.g. `OOM`), for `/readyz`.
    consumer_error: Mutex<Option<String>>,
    /// The configured board names (the `board` label values).
    boards: Vec<String>,
}

/// Every `role` label of the token metrics.
pub const TOKEN_ROLES: [&str; 3] = ["intake", "query", "metrics"];

impl crate::config::tokens::Observer for Metrics {
    fn tokens_reloaded(&self, role: &'static str, outcome: &crate::config::tokens::Reload) {
        use crate::config::tokens::Reload;
        match outcome {
            Reload::Fixed => {}
            Reload::Unchanged => self.token_file_stale.with_label_values(&[role]).set(0),
            Reload::Changed => {
                self.token_file_stale.with_label_values(&[role]).set(0);
                self.token_reloads.with_label_values(&[role]).inc();
            }
            Reload::Kept(_) => self.token_file_stale.with_label_values(&[role]).set(1),
        }
    }
}

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

fn register<T: prometheus::core::Collector + Clone + 'static>(registry: &Registry, metric: T) -> T {
    // Names are fixed and distinct, so registration cannot collide.
    registry
        .register(Box::new(metric.clone()))
        .expect("metric names are unique");
    metric
}

impl Metrics {
    /// Counts `client`'s reconnections in `rollboard_redis_reconnects_total` (its first
    /// connection is not one) and logs each.
    pub fn watch_reconnects(self: &Arc<Self>, client: &fred::clients::Client) {
        use fred::interfaces::EventInterface;
        let first = Arc::new(AtomicBool::new(true));
        let metrics = self.clone();
        let listener = client.on_reconnect(move |server| {
            let (first, metrics) = (first.clone(), metrics.clone());
            async move {
                if !first.swap(false, Ordering::SeqCst) {
                    metrics.reconnected();
                    tracing::info!(server = %server, "reconnected to redis");
                }
                Ok(())
            }
        });
        // The listener runs for the life of the client; its handle is not needed.
        drop(listener);
    }

    /// Registers every family with help text and a zero for every known label value, so a
    /// scrape right after start-up shows the whole contract.
    pub fn new(boards: &[Board]) -> Metrics {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            register(
                &registry,
                IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
            )
        };
        let applied = counter(
            "rollboard_events_applied_total",
            "Events applied, per board.",
            &["board"],
        );
        let skipped = counter(
            "rollboard_events_skipped_total",
            "Events not applied to a board because they were duplicates or late.",
            &["board", "reason"],
        );
        let dead_lettered = counter(
            "rollboard_events_dead_lettered_total",
            "Events moved to the dead-letter stream, per reason.",
            &["reason"],
        );
        let slices_expired = counter(
            "rollboard_slices_expired_total",
            "Slices expired by the roll jobs.",
            &["board"],
        );
        let members_removed = counter(
            "rollboard_members_removed_total",
            "Members that left a board instance because none of their events is live.",
            &["board"],
        );
        let resummed = counter(
            "rollboard_instances_resummed_total",
            "Resummarize instances whose live slices were summed again (one that no apply or expiry changed since its last sum keeps its ranking).",
            &["board"],
        );
        let redis_errors = counter(
            "rollboard_redis_errors_total",
            "Failed Redis operations, per kind (every kind but `data` is an outage, retried).",
            &["kind"],
        );
        let batch_events = register(
            &registry,
            Histogram::with_opts(
                HistogramOpts::new(
                    "rollboard_batch_events",
                    "Entries per batch read from the stream.",
                )
                .buckets(vec![
                    1.0, 5.0, 10.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0,
                ]),
            )
            .expect("valid metric"),
        );
        let apply_duration = register(
            &registry,
            Histogram::with_opts(HistogramOpts::new(
                "rollboard_apply_duration_seconds",
                "Time to apply one batch: validation, scripts, dead letters and ack.",
            ))
            .expect("valid metric"),
        );
        let roll_duration = register(
            &registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "rollboard_roll_duration_seconds",
                    "Time of one roll or resummarize run of a board.",
                )
                .buckets(vec![
                    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0,
                ]),
                &["board", "mode"],
            )
            .expect("valid metric"),
        );
        let last_roll = register(
            &registry,
            GaugeVec::new(
                Opts::new(
                    "rollboard_last_roll_timestamp_seconds",
                    "Unix time of the last completed roll of a board.",
                ),
                &["board"],
            )
            .expect("valid metric"),
        );
        let pending = register(
            &registry,
            IntGauge::new(
                "rollboard_consumer_pending",
                "Entries delivered to the consumer group but not acknowledged (XINFO GROUPS).",
            )
            .expect("valid metric"),
        );
        let lag = register(
            &registry,
            IntGauge::new(
                "rollboard_consumer_lag",
                "Entries in the stream not yet delivered to the consumer group (XINFO GROUPS).",
            )
            .expect("valid metric"),
        );
        let stream_pending = register(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "rollboard_stream_pending",
                    "Entries of one stream (partition) delivered to the consumer group but not acknowledged (XINFO GROUPS).",
                ),
                &["stream"],
            )
            .expect("valid metric"),
        );
        let stream_length = register(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "rollboard_stream_length",
                    "Entries in one stream rollboard reads or writes: intake partitions and the dead-letter stream (XLEN).",
                ),
                &["stream"],
            )
            .expect("valid metric"),
        );
        let stream_max_length = register(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "rollboard_stream_max_length",
                    "The configured cap of a capped stream (the dead-letter stream: ingest.dead_letter_max_len).",
                ),
                &["stream"],
            )
            .expect("valid metric"),
        );
        let stream_trimmed = register(
            &registry,
            IntCounterVec::new(
                Opts::new(
                    "rollboard_stream_trimmed_total",
                    "Intake stream entries removed by this process's trims (XTRIM MINID).",
                ),
                &["stream"],
            )
            .expect("valid metric"),
        );
        let stream_lag = register(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "rollboard_stream_lag",
                    "Entries of one stream (partition) not yet delivered to the consumer group (XINFO GROUPS).",
                ),
                &["stream"],
            )
            .expect("valid metric"),
        );
        let reconnects = register(
            &registry,
            IntCounter::new(
                "rollboard_redis_reconnects_total",
                "Reconnections to Redis after a lost connection.",
            )
            .expect("valid metric"),
        );
        let replica_ack_failures = register(
            &registry,
            IntCounter::new(
                "rollboard_replica_ack_failures_total",
                "Batches not acked and appends not confirmed because fewer replicas than \
                 redis.min_replicas_acked acknowledged their writes in time.",
            )
            .expect("valid metric"),
        );
        let up = register(
            &registry,
            Gauge::new(
                "rollboard_redis_up",
                "1 when the last readiness check reached Redis, else 0.",
            )
            .expect("valid metric"),
        );
        let clock_skew = register(
            &registry,
            Gauge::new(
                "rollboard_clock_skew_seconds",
                "This host's clock minus Redis's (TIME), as last measured; time is always judged by Redis's.",
            )
            .expect("valid metric"),
        );
        let clock_skewed = register(
            &registry,
            IntGauge::new(
                "rollboard_clock_skewed",
                "1 while this host's clock is off from Redis's by more than redis.max_clock_skew, else 0.",
            )
            .expect("valid metric"),
        );
        let apply_failures = counter(
            "rollboard_apply_failures_total",
            "Applies of a board instance's share of a batch that failed for a reason other \
             than an outage (a key of the wrong type, corrupt data, a script error), per board.",
            &["board"],
        );
        let board_failing = register(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "rollboard_board_apply_failing",
                    "Board instances whose events are being dead-lettered (apply_failed) because \
                     their apply failed through every retry.",
                ),
                &["board"],
            )
            .expect("valid metric"),
        );
        let roll_failures = counter(
            "rollboard_roll_failures_total",
            "Roll or resummarize runs of a board that did not roll every instance (the next \
             run catches up).",
            &["board", "mode"],
        );
        let job_runs = counter(
            "rollboard_job_runs_total",
            "Ticks of a scheduled job (roll, resummarize) this process ran, under the job's \
             lease; summed over the replicas, one per tick.",
            &["job"],
        );
        for job in ["roll", "resummarize"] {
            job_runs.with_label_values(&[job]);
        }
        let window_gauge = |name: &str, help: &str| {
            register(
                &registry,
                GaugeVec::new(Opts::new(name, help), &["board"]).expect("valid metric"),
            )
        };
        let window_start = window_gauge(
            "rollboard_window_start_timestamp_seconds",
            "Start of the oldest live slice of a board as of its last complete roll, or \
             as of the clock at start-up before this process's first one (window_from in \
             queries), Unix time.",
        );
        let window_end = window_gauge(
            "rollboard_window_end_timestamp_seconds",
            "End of the live range of a board as of its last complete roll, or as of the \
             clock at start-up before this process's first one (window_to in queries), \
             Unix time: once the clock passes it, a slice that left the window is \
             still counted until the next roll.",
        );
        let script_duration = register(
            &registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "rollboard_script_duration_seconds",
                    "Time of one Lua script call as seen by the daemon (round trip included), \
                     per script.",
                )
                .buckets(vec![
                    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
                ]),
                &["script"],
            )
            .expect("valid metric"),
        );
        let http_duration = register(
            &registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "rollboard_http_request_duration_seconds",
                    "Time to answer one HTTP request, per route template.",
                )
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0,
                ]),
                &["route"],
            )
            .expect("valid metric"),
        );
        let http_requests = counter(
            "rollboard_http_requests_total",
            "HTTP requests answered, per route template (`unmatched` for an unknown path) and \
             status code.",
            &["route", "status"],
        );
        let intake = counter(
            "rollboard_intake_events_total",
            "Events sent to POST /v1/events, per result: accepted, invalid and unavailable \
             count events, malformed counts requests whose body was refused as a whole.",
            &["result"],
        );
        for result in Intake::ALL {
            intake.with_label_values(&[result.as_str()]);
        }
        let build_info = register(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "rollboard_build_info",
                    "1, labelled with the version and the commit (`unknown` when built \
                     without git) of the running binary.",
                ),
                &["version", "commit"],
            )
            .expect("valid metric"),
        );
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION"), COMMIT])
            .set(1);
        #[cfg(target_os = "linux")]
        {
            // process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds,
            // process_start_time_seconds, ...: read from /proc at each scrape.
            let process = prometheus::process_collector::ProcessCollector::for_self();
            registry
                .register(Box::new(process))
                .expect("process metric names are unique");
        }
        for route in HTTP_ROUTES {
            http_duration.with_label_values(&[route]);
        }
        for b in boards {
            roll_failures.with_label_values(&[b.name.as_str(), b.mode.as_str()]);
            window_start.with_label_values(&[&b.name]);
            window_end.with_label_values(&[&b.name]);
            apply_failures.with_label_values(&[&b.name]);
            board_failing.with_label_values(&[&b.name]);
            applied.with_label_values(&[&b.name]);
            for skip in [Skip::Duplicate, Skip::Late] {
                skipped.with_label_values(&[b.name.as_str(), skip.as_str()]);
            }
            slices_expired.with_label_values(&[&b.name]);
            members_removed.with_label_values(&[&b.name]);
            if b.mode == crate::domain::board::Mode::Resummarize {
                resummed.with_label_values(&[&b.name]);
            }
            roll_duration.with_label_values(&[b.name.as_str(), b.mode.as_str()]);
            last_roll.with_label_values(&[&b.name]);
        }
        for reason in Reason::ALL {
            dead_lettered.with_label_values(&[reason.as_str()]);
        }
        for kind in ERROR_KINDS {
            redis_errors.with_label_values(&[kind]);
        }
        let token_reloads = counter(
            "rollboard_token_reloads_total",
            "Token files re-read with tokens that replaced the previous ones, per HTTP role.",
            &["role"],
        );
        let token_file_stale = register(
            &registry,
            IntGaugeVec::new(
                Opts::new(
                    "rollboard_token_file_stale",
                    "1 while a role's token file gives no usable token (empty, unreadable, too many lines): the tokens read last stay valid.",
                ),
                &["role"],
            )
            .expect("valid metric"),
        );
        for role in TOKEN_ROLES {
            token_reloads.with_label_values(&[role]);
            token_file_stale.with_label_values(&[role]);
        }
        Metrics {
            registry,
            applied,
            skipped,
            dead_lettered,
            batch_events,
            apply_duration,
            roll_duration,
            slices_expired,
            members_removed,
            resummed,
            last_roll,
            pending,
            lag,
            stream_pending,
            stream_lag,
            stream_length,
            stream_max_length,
            stream_trimmed,
            redis_errors,
            reconnects,
            replica_ack_failures,
            up,
            clock_skew,
            clock_skewed,
            apply_failures,
            board_failing,
            roll_failures,
            job_runs,
            window_start,
            window_end,
            script_duration,
            http_duration,
            http_requests,
            intake,
            token_reloads,
            token_file_stale,
            failing: Mutex::new(HashMap::new()),
            consumer_error: Mutex::new(None),
            boards: boards.iter().map(|b| b.name.clone()).collect(),
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metric families.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    /// A batch of `entries` stream entries was processed in `seconds`.
    pub fn batch(&self, entries: usize, seconds: f64) {
        self.batch_events.observe(entries as f64);
        self.apply_duration.observe(seconds);
    }

    /// Registers the duration series of every script in `scripts` (at 0 calls until the
    /// first), so that each shows from the start.
    pub fn scripts(&self, scripts: &[&str]) {
        for script in scripts {
            self.script_duration.with_label_values(&[script]);
        }
    }

    /// One call of the Lua script `script` took `seconds`.
    pub fn script_call(&self, script: &str, seconds: f64) {
        self.script_duration
            .with_label_values(&[script])
            .observe(seconds);
    }

    /// One request to the route template `route` (one of [`HTTP_ROUTES`]) was answered
    /// in `seconds`.
    pub fn http_request(&self, route: &str, seconds: f64) {
        self.http_duration
            .with_label_values(&[route])
            .observe(seconds);
    }

    /// A request was answered with `status`; `route` is its route template, `None` for a
    /// path that matched no route.
    pub fn http_response(&self, route: Option<&str>, status: u16) {
        self.http_requests
            .with_label_values(&[route.unwrap_or(UNMATCHED_ROUTE), &status.to_string()])
            .inc();
    }

    /// `n` events (or one malformed request, see [`Intake::Malformed`]) sent to the intake
    /// ended with `result`.
    pub fn intake(&self, result: Intake, n: u64) {
        if n > 0 {
            self.intake.with_label_values(&[result.as_str()]).inc_by(n);
        }
    }

    /// Sets the window gauges of every board from its definition and `now_ms` (Redis's
    /// clock), as a roll at `now_ms` on a board rolled on time would: the process shows its
    /// boards' windows from the start instead of 0 until its first complete roll. A complete
    /// roll sets them again, from the stored watermark.
    pub fn windows_at(&self, boards: &[Board], now_ms: i64) {
        for board in boards {
            let (from, to) = board.live_range(now_ms, None);
            self.window_start
                .with_label_values(&[&board.name])
                .set(from as f64 / 1000.0);
            self.window_end
                .with_label_values(&[&board.name])
                .set(to as f64 / 1000.0);
        }
    }

    /// `n` events were applied to `board`.
    pub fn applied(&self, board: &str, n: u64) {
        if n > 0 {
            self.applied.with_label_values(&[board]).inc_by(n);
        }
    }

    /// `n` events were skipped at `board`.
    pub fn skipped(&self, board: &str, why: Skip, n: u64) {
        if n > 0 {
            self.skipped
                .with_label_values(&[board, why.as_str()])
                .inc_by(n);
        }
    }

    /// One event was moved to the dead-letter stream.
    pub fn dead_lettered(&self, reason: Reason) {
        self.dead_lettered
            .with_label_values(&[reason.as_str()])
            .inc();
    }

    /// A roll or resummarize run of one board finished. What it expired counts either way;
    /// the last-roll time and the window move only when every instance was rolled, else
    /// the run counts as failed (with one Redis error per instance that failed on one).
    pub fn rolled(&self, report: &Rolled<'_>, seconds: f64, now_ms: i64) {
        self.roll_duration
            .with_label_values(&[report.board, report.mode])
            .observe(seconds);
        self.slices_expired
            .with_label_values(&[report.board])
            .inc_by(report.slices_expired);
        self.members_removed
            .with_label_values(&[report.board])
            .inc_by(report.members_removed);
        if report.resummed > 0 {
            self.resummed
                .with_label_values(&[report.board])
                .inc_by(report.resummed);
        }
        if !report.complete {
            for (kind, n) in report.redis_errors {
                self.redis_errors.with_label_values(&[kind]).inc_by(*n);
            }
            self.roll_failed(report.board, report.mode, None);
            return;
        }
        self.last_roll
            .with_label_values(&[report.board])
            .set(now_ms as f64 / 1000.0);
        if let Some((from, to)) = report.window {
            self.window_start
                .with_label_values(&[report.board])
                .set(from as f64 / 1000.0);
            self.window_end
                .with_label_values(&[report.board])
                .set(to as f64 / 1000.0);
        }
    }

    /// A roll or resummarize run of one board did not roll every instance; `error` is the
    /// Redis error that stopped the whole run, if one did.
    pub fn roll_failed(&self, board: &str, mode: &str, error: Option<&dyn Failure>) {
        if let Some(error) = error {
            self.redis_error(error);
        }
        self.roll_failures.with_label_values(&[board, mode]).inc();
    }

    /// This process took the lease of a tick of `job` (`roll`, `resummarize`) and runs it.
    pub fn job_run(&self, job: &str) {
        self.job_runs.with_label_values(&[job]).inc();
    }

    /// A Redis operation failed.
    pub fn redis_error(&self, error: &dyn Failure) {
        self.redis_errors.with_label_values(&[error.kind()]).inc();
        if error.is_replica_ack_failure() {
            self.replica_ack_failures.inc();
        }
    }

    /// A connection to Redis was re-established.
    pub fn reconnected(&self) {
        self.reconnects.inc();
    }

    /// Registers the per-partition gauges of `streams` (at 0 until the first poll), so that
    /// every family shows from the start.
    pub fn streams(&self, streams: &[String]) {
        for stream in streams {
            self.stream_pending.with_label_values(&[stream.as_str()]);
            self.stream_lag.with_label_values(&[stream.as_str()]);
            self.stream_length.with_label_values(&[stream.as_str()]);
            self.stream_trimmed.with_label_values(&[stream.as_str()]);
        }
    }

    /// The dead-letter stream `stream` is capped at about `max_len` entries.
    pub fn capped_stream(&self, stream: &str, max_len: usize) {
        self.stream_length.with_label_values(&[stream]);
        self.stream_max_length
            .with_label_values(&[stream])
            .set(max_len as i64);
    }

    /// A stream's length was polled (XLEN).
    pub fn stream_length(&self, stream: &str, length: i64) {
        self.stream_length.with_label_values(&[stream]).set(length);
    }

    /// A trim of an intake stream removed `removed` entries below `minid`.
    pub fn stream_trimmed(&self, stream: &str, minid: &str, removed: u64) {
        if removed > 0 {
            debug!(stream, minid, removed, "stream trimmed");
        }
        self.stream_trimmed
            .with_label_values(&[stream])
            .inc_by(removed);
    }

    /// One partition's pending count and lag, from XINFO GROUPS on its stream.
    pub fn stream_group(&self, stream: &str, pending: i64, lag: Option<i64>) {
        self.stream_pending
            .with_label_values(&[stream])
            .set(pending);
        if let Some(lag) = lag {
            self.stream_lag.with_label_values(&[stream]).set(lag);
        }
    }

    /// The consumer group's pending count and lag over every partition, from XINFO GROUPS.
    pub fn consumer(&self, pending: i64, lag: Option<i64>) {
        self.pending.set(pending);
        if let Some(lag) = lag {
            self.lag.set(lag);
        }
    }

    /// Whether the last readiness check reached Redis.
    pub fn redis_up(&self, up: bool) {
        self.up.set(if up { 1.0 } else { 0.0 });
    }

    /// The skew of this host's clock from Redis's was measured (ms, local minus Redis).
    pub fn clock_skew(&self, skew_ms: i64, skewed: bool) {
        self.clock_skew.set(skew_ms as f64 / 1000.0);
        self.clock_skewed.set(i64::from(skewed));
    }

    /// One apply attempt of a board instance failed (not an outage).
    pub fn apply_failed(&self, board: &str, scope: Option<&str>, error: &dyn Failure) {
        self.redis_error(error);
        self.apply_failures.with_label_values(&[board]).inc();
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
        if let Ok(mut failing) = self.failing.lock() {
            failing.insert(
                (board.to_string(), scope.map(str::to_string)),
                Instant::now(),
            );
        }
        self.refresh_failing();
    }

    /// An apply of a board instance succeeded.
    pub fn apply_ok(&self, board: &str, scope: Option<&str>) {
        let removed = self.failing.lock().is_ok_and(|mut failing| {
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
        self.failing.lock().is_ok_and(|failing| {
            failing
                .get(&(board.to_string(), scope.map(str::to_string)))
                .is_some_and(|t| t.elapsed() < FAILING_HOLD)
        })
    }

    /// The consumer's last step failed (`Some`) or succeeded (`None`).
    pub fn consumer_step(&self, error: Option<&dyn Failure>) {
        if let Ok(mut last) = self.consumer_error.lock() {
            *last = error.map(ToString::to_string);
        }
    }

    /// The error of the consumer's last step while its steps fail, for `/readyz`.
    pub fn consumer_error(&self) -> Option<String> {
        self.consumer_error.lock().ok().and_then(|e| e.clone())
    }

    /// The boards with a failing instance, sorted, for `/readyz`.
    pub fn failing_boards(&self) -> Vec<String> {
        self.refresh_failing()
    }

    /// Drops failures older than [`FAILING_HOLD`], sets the gauges and lists the boards.
    fn refresh_failing(&self) -> Vec<String> {
        let Ok(mut failing) = self.failing.lock() else {
            return Vec::new();
        };
        failing.retain(|_, t| t.elapsed() < FAILING_HOLD);
        let mut per_board: HashMap<&str, i64> = HashMap::new();
        for (board, _) in failing.keys() {
            *per_board.entry(board.as_str()).or_default() += 1;
        }
        for board in &self.boards {
            let n = per_board.get(board.as_str()).copied().unwrap_or(0);
            self.board_failing.with_label_values(&[board]).set(n);
        }
        let mut boards: Vec<String> = per_board.keys().map(|b| b.to_string()).collect();
        boards.sort();
        boards
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boards() -> Vec<Board> {
        crate::config::Settings::from_toml(
            "[[boards]]\nname = \"week\"\nmember = \"room\"\nwindow = \"7d\"\nslice = \"6h\"\n\
             [[boards]]\nname = \"day\"\nmember = \"user\"\nwindow = \"24h\"\nslice = \"1h\"\n",
        )
        .expect("boards")
        .boards
    }

    /// The value of the sample written exactly `series` in the exposition.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
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

    #[test]
    fn build_info_intake_results_and_unmatched_routes_are_fixed_labels() {
        let metrics = Metrics::new(&boards());
        metrics.http_response(None, 404);
        metrics.http_response(None, 404);
        metrics.http_response(Some("/v1/events"), 202);
        metrics.intake(Intake::Invalid, 3);
        let text = metrics.render();
        // Label pairs are written sorted by name.
        let build = format!(
            "rollboard_build_info{{commit=\"{COMMIT}\",version=\"{}\"}}",
            env!("CARGO_PKG_VERSION")
        );
        assert_eq!(sample(&text, &build), Some(1.0));
        for result in Intake::ALL {
            let series = format!(
                "rollboard_intake_events_total{{result=\"{}\"}}",
                result.as_str()
            );
            let want = if result == Intake::Invalid { 3.0 } else { 0.0 };
            assert_eq!(sample(&text, &series), Some(want), "{series}");
        }
        let unmatched = "rollboard_http_requests_total{route=\"unmatched\",status=\"404\"}";
        assert_eq!(sample(&text, unmatched), Some(2.0));
        let events = "rollboard_http_requests_total{route=\"/v1/events\",status=\"202\"}";
        assert_eq!(sample(&text, events), Some(1.0));
        #[cfg(target_os = "linux")]
        assert!(text.contains("\nprocess_resident_memory_bytes "), "{text}");
    }
}
