//! Prometheus metrics. One [`Metrics`] value owns the registry; each notable happening is
//! one method that counts it (and logs where an operator would want a line). Labels come
//! from small fixed sets (board names from the config, reasons, kinds): never member names
//! or raw error text.
//!
//! # Layout
//!
//! The families are grouped by what reports them, each group in its own file with the
//! methods that count into it: `ingest` (events applied, skipped, dead-lettered; failing
//! boards), `roll` (the scheduled jobs and the live windows), `redis` (errors, replicas,
//! reachability, clock skew, script times), `streams` (lag, lengths, trims), `http`
//! (requests, intake results, token files) and `process` (build and process info).

mod http;
mod ingest;
mod process;
mod redis;
mod roll;
mod streams;

use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

pub use self::http::{
    Disconnect, Intake, ANSWER_SOURCES, HTTP_ROUTES, TOKEN_ROLES, UNMATCHED_ROUTE,
};
pub use self::ingest::{Skip, FAILING_HOLD};
pub use self::process::COMMIT;
pub use self::redis::{Failure, ERROR_KINDS};
pub use self::roll::Rolled;
use crate::domain::board::Board;

/// The process's metrics.
pub struct Metrics {
    /// Every family below, for the exposition.
    registry: Registry,
    /// Events applied, skipped and dead-lettered; failing board instances.
    ingest: ingest::IngestFamilies,
    /// Roll and resummarize runs, job ticks, live windows.
    roll: roll::RollFamilies,
    /// Redis errors, reconnections, replica acks, reachability, clock skew, scripts.
    redis: redis::RedisFamilies,
    /// Consumer group lag, stream lengths and trims.
    streams: streams::StreamFamilies,
    /// HTTP requests, intake results, token files.
    http: http::HttpFamilies,
}

impl Metrics {
    /// Registers every family with help text and a zero for every known label value, so a
    /// scrape right after start-up shows the whole contract.
    pub fn new(boards: &[Board]) -> Metrics {
        let registry = Registry::new();
        let metrics = Metrics {
            ingest: ingest::IngestFamilies::new(&registry, boards),
            roll: roll::RollFamilies::new(&registry, boards),
            redis: redis::RedisFamilies::new(&registry),
            streams: streams::StreamFamilies::new(&registry),
            http: http::HttpFamilies::new(&registry),
            registry,
        };
        process::register_families(&metrics.registry);
        metrics
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metric families.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

fn register<T: prometheus::core::Collector + Clone + 'static>(registry: &Registry, metric: T) -> T {
    // Names are fixed and distinct, so registration cannot collide.
    registry
        .register(Box::new(metric.clone()))
        .expect("metric names are unique");
    metric
}

/// A registered counter family.
fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(
        registry,
        IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

/// A registered integer gauge family.
fn int_gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    register(
        registry,
        IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

/// A registered gauge family.
fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    register(
        registry,
        GaugeVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

/// A registered histogram family.
fn histogram_vec(registry: &Registry, opts: HistogramOpts, labels: &[&str]) -> HistogramVec {
    register(
        registry,
        HistogramVec::new(opts, labels).expect("valid metric"),
    )
}

#[cfg(test)]
mod tests {
    use crate::domain::board::Board;

    /// Two boards, `week` and `day`.
    pub(super) fn boards() -> Vec<Board> {
        crate::config::Settings::from_toml(
            "[[boards]]\nname = \"week\"\nmember = \"room\"\nwindow = \"7d\"\nslice = \"6h\"\n\
             [[boards]]\nname = \"day\"\nmember = \"user\"\nwindow = \"24h\"\nslice = \"1h\"\n",
        )
        .expect("boards")
        .boards
    }

    /// The value of the sample written exactly `series` in the exposition.
    pub(super) fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    }
}
