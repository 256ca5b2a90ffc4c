//! What the HTTP server answered: request times per route template, responses per route
//! and status, the results of the events sent to the intake, the change-feed streams
//! (subscribers, events sent, disconnects by reason), and the re-reading of the roles'
//! token files.

use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry,
};

use super::{counter_vec, histogram_vec, int_gauge_vec, Metrics};
use crate::config::tokens::{Observer, Reload};

/// The route templates of the HTTP API (the `route` label values of
/// `rollboard_http_request_duration_seconds`): never raw paths.
pub const HTTP_ROUTES: [&str; 13] = [
    "/",
    "/v1/boards",
    "/v1/boards/{board}",
    "/v1/boards/{board}/top",
    "/v1/boards/{board}/ranks",
    "/v1/boards/{board}/members/{member}",
    "/v1/boards/{board}/members/{member}/around",
    "/v1/boards/{board}/changes",
    "/v1/events",
    "/v1/openapi.json",
    "/metrics",
    "/healthz",
    "/readyz",
];

/// The `route` label of `rollboard_http_requests_total` for a request that matched no
/// route (an unknown path): one fixed value, so a scan cannot grow the label set.
pub const UNMATCHED_ROUTE: &str = "unmatched";

/// Every `role` label of the token metrics.
pub const TOKEN_ROLES: [&str; 3] = ["intake", "query", "metrics"];

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

/// Why a change-feed stream ended (the `reason` label of
/// `rollboard_changes_disconnects_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disconnect {
    /// The client closed it.
    Client,
    /// The client did not take its events fast enough: its buffer stayed full for 5 s;
    /// its connection was closed.
    Slow,
    /// The server shut down.
    Shutdown,
}

impl Disconnect {
    /// Every reason, in the order of the metric's label values.
    pub const ALL: [Disconnect; 3] = [Disconnect::Client, Disconnect::Slow, Disconnect::Shutdown];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Disconnect::Client => "client",
            Disconnect::Slow => "slow",
            Disconnect::Shutdown => "shutdown",
        }
    }
}

/// The HTTP families.
pub(super) struct HttpFamilies {
    /// `rollboard_http_request_duration_seconds`.
    duration: HistogramVec,
    /// `rollboard_http_requests_total`.
    requests: IntCounterVec,
    /// `rollboard_intake_events_total`.
    intake: IntCounterVec,
    /// `rollboard_token_reloads_total`.
    token_reloads: IntCounterVec,
    /// `rollboard_token_file_stale`.
    token_file_stale: IntGaugeVec,
    /// `rollboard_changes_subscribers`.
    subscribers: IntGauge,
    /// `rollboard_changes_events_sent_total`.
    changes_sent: IntCounter,
    /// `rollboard_changes_disconnects_total`.
    disconnects: IntCounterVec,
    /// `rollboard_changes_feeds_read`.
    feeds_read: IntGauge,
    /// `rollboard_http_answers_total`.
    answers: IntCounterVec,
    /// `rollboard_http_answers_held_bytes`.
    answers_bytes: IntGauge,
    /// `rollboard_http_answers_held`.
    answers_held: IntGauge,
}

/// How a query's answer was found (the `source` label of `rollboard_http_answers_total`):
/// kept (`hit`), read from Redis by this request (`miss`), or read by another request
/// this one waited for (`wait`).
pub const ANSWER_SOURCES: [&str; 3] = ["hit", "miss", "wait"];

impl HttpFamilies {
    /// Registers the families, at zero for every route, intake result and role.
    pub(super) fn new(registry: &Registry) -> HttpFamilies {
        let families = HttpFamilies {
            duration: histogram_vec(
                registry,
                HistogramOpts::new(
                    "rollboard_http_request_duration_seconds",
                    "Time to answer one HTTP request, per route template.",
                )
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0,
                ]),
                &["route"],
            ),
            requests: counter_vec(
                registry,
                "rollboard_http_requests_total",
                "HTTP requests answered, per route template (`unmatched` for an unknown path) and \
                 status code.",
                &["route", "status"],
            ),
            intake: counter_vec(
                registry,
                "rollboard_intake_events_total",
                "Events sent to POST /v1/events, per result: accepted, invalid and unavailable \
                 count events, malformed counts requests whose body was refused as a whole.",
                &["result"],
            ),
            token_reloads: counter_vec(
                registry,
                "rollboard_token_reloads_total",
                "Token files re-read with tokens that replaced the previous ones, per HTTP role.",
                &["role"],
            ),
            token_file_stale: int_gauge_vec(
                registry,
                "rollboard_token_file_stale",
                "1 while a role's token file gives no usable token (empty, unreadable, too many lines): the tokens read last stay valid.",
                &["role"],
            ),
            subscribers: super::register(
                registry,
                IntGauge::new(
                    "rollboard_changes_subscribers",
                    "Change-feed streams (GET /v1/boards/{board}/changes) open now.",
                )
                .expect("a valid metric"),
            ),
            changes_sent: super::register(
                registry,
                IntCounter::new(
                    "rollboard_changes_events_sent_total",
                    "Change-feed events handed to subscribers' streams (resets included).",
                )
                .expect("a valid metric"),
            ),
            disconnects: counter_vec(
                registry,
                "rollboard_changes_disconnects_total",
                "Change-feed streams ended, per reason: client (closed by the client), slow (too \
                 slow to keep up, disconnected), shutdown.",
                &["reason"],
            ),
            feeds_read: super::register(
                registry,
                IntGauge::new(
                    "rollboard_changes_feeds_read",
                    "Change feeds read now: one reader (one Redis connection) per feed with at \
                     least one subscriber.",
                )
                .expect("a valid metric"),
            ),
            answers: counter_vec(
                registry,
                "rollboard_http_answers_total",
                "Query answers given from those kept (source=hit), read from Redis by the request \
                 (miss), or read by another request it waited for (wait); 0 everywhere when \
                 http.max_staleness or http.cache_bytes is 0.",
                &["source"],
            ),
            answers_bytes: super::register(
                registry,
                IntGauge::new(
                    "rollboard_http_answers_held_bytes",
                    "Bytes of the query answers kept, bodies and keys (bounded by \
                     http.cache_bytes), counted at each scrape.",
                )
                .expect("a valid metric"),
            ),
            answers_held: super::register(
                registry,
                IntGauge::new(
                    "rollboard_http_answers_held",
                    "Query answers kept (counted at each scrape).",
                )
                .expect("a valid metric"),
            ),
        };
        families.zero();
        families
    }

    /// Every series of a known route, result and role, at zero; of the requests, the
    /// unknown paths' one (its label values are fixed), so that the family is in the
    /// first scrape.
    fn zero(&self) {
        self.requests.with_label_values(&[UNMATCHED_ROUTE, "404"]);
        for route in HTTP_ROUTES {
            self.duration.with_label_values(&[route]);
        }
        for result in Intake::ALL {
            self.intake.with_label_values(&[result.as_str()]);
        }
        for reason in Disconnect::ALL {
            self.disconnects.with_label_values(&[reason.as_str()]);
        }
        for source in ANSWER_SOURCES {
            self.answers.with_label_values(&[source]);
        }
        for role in TOKEN_ROLES {
            self.token_reloads.with_label_values(&[role]);
            self.token_file_stale.with_label_values(&[role]);
        }
    }
}

impl Observer for Metrics {
    fn tokens_reloaded(&self, role: &'static str, outcome: &Reload) {
        let stale = &self.http.token_file_stale;
        match outcome {
            Reload::Fixed => {}
            Reload::Unchanged => stale.with_label_values(&[role]).set(0),
            Reload::Changed => {
                stale.with_label_values(&[role]).set(0);
                self.http.token_reloads.with_label_values(&[role]).inc();
            }
            Reload::Kept(_) => stale.with_label_values(&[role]).set(1),
        }
    }
}

impl Metrics {
    /// One request to the route template `route` (one of [`HTTP_ROUTES`]) was answered
    /// in `seconds`.
    pub fn http_request(&self, route: &str, seconds: f64) {
        self.http
            .duration
            .with_label_values(&[route])
            .observe(seconds);
    }

    /// A request was answered with `status`; `route` is its route template, `None` for a
    /// path that matched no route.
    pub fn http_response(&self, route: Option<&str>, status: u16) {
        self.http
            .requests
            .with_label_values(&[route.unwrap_or(UNMATCHED_ROUTE), &status.to_string()])
            .inc();
    }

    /// A query's answer came from `source` (one of [`ANSWER_SOURCES`]).
    pub fn answer_kept(&self, source: &str) {
        self.http.answers.with_label_values(&[source]).inc();
    }

    /// The answers kept weigh `bytes` and are `entries` many.
    pub fn answers_held(&self, bytes: u64, entries: u64) {
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.http.answers_bytes.set(gauge(bytes));
        self.http.answers_held.set(gauge(entries));
    }

    /// A change-feed stream opened.
    pub fn changes_subscribed(&self) {
        self.http.subscribers.inc();
    }

    /// A change-feed stream ended, for `reason`.
    pub fn changes_unsubscribed(&self, reason: Disconnect) {
        self.http.subscribers.dec();
        self.http
            .disconnects
            .with_label_values(&[reason.as_str()])
            .inc();
    }

    /// One change-feed event was handed to a subscriber's stream.
    pub fn changes_sent(&self) {
        self.http.changes_sent.inc();
    }

    /// A change feed's reader started (`true`) or stopped (`false`).
    pub fn changes_feed_read(&self, reading: bool) {
        if reading {
            self.http.feeds_read.inc();
        } else {
            self.http.feeds_read.dec();
        }
    }

    /// `n` events (or one malformed request, see [`Intake::Malformed`]) sent to the intake
    /// ended with `result`.
    pub fn intake(&self, result: Intake, n: u64) {
        if n > 0 {
            self.http
                .intake
                .with_label_values(&[result.as_str()])
                .inc_by(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{boards, sample};
    use super::super::COMMIT;
    use super::{Intake, Metrics};

    #[test]
    fn build_info_intake_results_and_unmatched_routes_are_fixed_labels() {
        let metrics = Metrics::new(&boards());
        let first = metrics.render();
        let unmatched = "rollboard_http_requests_total{route=\"unmatched\",status=\"404\"}";
        assert_eq!(sample(&first, unmatched), Some(0.0), "in the first scrape");
        for source in super::ANSWER_SOURCES {
            let series = format!("rollboard_http_answers_total{{source=\"{source}\"}}");
            assert_eq!(sample(&first, &series), Some(0.0), "{series}");
        }
        assert_eq!(
            sample(&first, "rollboard_http_answers_held_bytes"),
            Some(0.0)
        );
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
