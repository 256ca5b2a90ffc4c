//! How Redis answered: failed operations per kind, reconnections, writes that too few
//! replicas confirmed, reachability, clock skew, and the time of each Lua script call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use prometheus::{
    Gauge, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Registry,
};

use super::{counter_vec, histogram_vec, register, Metrics};

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

/// What the metrics read of a failed Redis call (the store's errors implement it).
pub trait Failure: std::fmt::Display {
    /// A small fixed label, one of [`ERROR_KINDS`].
    fn kind(&self) -> &'static str;
    /// Whether the write was not confirmed by enough replicas in time.
    fn is_replica_ack_failure(&self) -> bool;
}

/// The Redis families.
pub(super) struct RedisFamilies {
    /// `rollboard_redis_errors_total`.
    errors: IntCounterVec,
    /// `rollboard_redis_reconnects_total`.
    reconnects: IntCounter,
    /// `rollboard_replica_ack_failures_total`.
    replica_ack_failures: IntCounter,
    /// `rollboard_redis_up`.
    up: Gauge,
    /// `rollboard_clock_skew_seconds`.
    clock_skew: Gauge,
    /// `rollboard_clock_skewed`.
    clock_skewed: IntGauge,
    /// `rollboard_script_duration_seconds`.
    script_duration: HistogramVec,
    /// `rollboard_judged_instances_total`.
    judged: IntCounterVec,
    /// `rollboard_judge_aborts_total`.
    judge_aborts: IntCounter,
}

impl RedisFamilies {
    /// Registers the families, at zero for every error kind.
    pub(super) fn new(registry: &Registry) -> RedisFamilies {
        let families = RedisFamilies {
            errors: counter_vec(
                registry,
                "rollboard_redis_errors_total",
                "Failed Redis operations, per kind (every kind but `data` is an outage, retried).",
                &["kind"],
            ),
            reconnects: register(
                registry,
                IntCounter::new(
                    "rollboard_redis_reconnects_total",
                    "Reconnections to Redis after a lost connection.",
                )
                .expect("valid metric"),
            ),
            replica_ack_failures: register(
                registry,
                IntCounter::new(
                    "rollboard_replica_ack_failures_total",
                    "Batches not acked and appends not confirmed because fewer replicas than \
                     redis.min_replicas_acked acknowledged their writes in time.",
                )
                .expect("valid metric"),
            ),
            up: register(
                registry,
                Gauge::new(
                    "rollboard_redis_up",
                    "1 when the last readiness check reached Redis, else 0.",
                )
                .expect("valid metric"),
            ),
            clock_skew: register(
                registry,
                Gauge::new(
                    "rollboard_clock_skew_seconds",
                    "This host's clock minus Redis's (TIME), as last measured; time is always judged by Redis's.",
                )
                .expect("valid metric"),
            ),
            clock_skewed: register(
                registry,
                IntGauge::new(
                    "rollboard_clock_skewed",
                    "1 while this host's clock is off from Redis's by more than redis.max_clock_skew, else 0.",
                )
                .expect("valid metric"),
            ),
            script_duration: histogram_vec(
                registry,
                HistogramOpts::new(
                    "rollboard_script_duration_seconds",
                    "Time of one Lua script call as seen by the daemon (round trip included), \
                     per script.",
                )
                .buckets(vec![
                    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
                ]),
                &["script"],
            ),
            judged: counter_vec(
                registry,
                "rollboard_judged_instances_total",
                "Instance applies (a pack's instance, or a chunk of a large instance's events) \
                 of the shape judged in the worker, per where they were judged: `worker` \
                 (native commands under WATCH) or `script` (left to fold.lua).",
                &["by"],
            ),
            judge_aborts: register(
                registry,
                IntCounter::new(
                    "rollboard_judge_aborts_total",
                    "Transactions of instances judged in the worker that Redis aborted, as \
                     another client wrote a watched key first; read and judged again.",
                )
                .expect("valid metric"),
            ),
        };
        for kind in ERROR_KINDS {
            families.errors.with_label_values(&[kind]);
        }
        for by in ["worker", "script"] {
            families.judged.with_label_values(&[by]);
        }
        families
    }

    /// Counts `n` failed operations of `kind`.
    pub(super) fn errors_of_kind(&self, kind: &str, n: u64) {
        self.errors.with_label_values(&[kind]).inc_by(n);
    }
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

    /// A Redis operation failed.
    pub fn redis_error(&self, error: &dyn Failure) {
        self.redis.errors.with_label_values(&[error.kind()]).inc();
        if error.is_replica_ack_failure() {
            self.redis.replica_ack_failures.inc();
        }
    }

    /// A connection to Redis was re-established.
    pub fn reconnected(&self) {
        self.redis.reconnects.inc();
    }

    /// Whether the last readiness check reached Redis.
    pub fn redis_up(&self, up: bool) {
        self.redis.up.set(if up { 1.0 } else { 0.0 });
    }

    /// The skew of this host's clock from Redis's was measured (ms, local minus Redis).
    pub fn clock_skew(&self, skew_ms: i64, skewed: bool) {
        self.redis.clock_skew.set(skew_ms as f64 / 1000.0);
        self.redis.clock_skewed.set(i64::from(skewed));
    }

    /// Registers the duration series of every script in `scripts` (at 0 calls until the
    /// first), so that each shows from the start.
    pub fn scripts(&self, scripts: &[&str]) {
        for script in scripts {
            self.redis.script_duration.with_label_values(&[script]);
        }
    }

    /// `worker` instance applies were judged in the worker and `script` ones of the same
    /// shape left to `fold.lua`.
    pub fn judged(&self, worker: u64, script: u64) {
        self.redis
            .judged
            .with_label_values(&["worker"])
            .inc_by(worker);
        self.redis
            .judged
            .with_label_values(&["script"])
            .inc_by(script);
    }

    /// Redis aborted the transaction of instances judged in the worker.
    pub fn judge_aborted(&self) {
        self.redis.judge_aborts.inc();
    }

    /// One call of the Lua script `script` took `seconds`.
    pub fn script_call(&self, script: &str, seconds: f64) {
        self.redis
            .script_duration
            .with_label_values(&[script])
            .observe(seconds);
    }
}
