//! The query answers kept for `http.max_staleness`, as a client meets them: the HTTP API
//! served in this process, requests and what they were answered (headers included), the
//! answers' metrics, daemons with boards of their own whose jobs another replica holds,
//! tips applied, and Redis's clock clear of the hour.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use rollboard::config::Settings;
use rollboard::domain::board::Board;
use rollboard::domain::clock::Clock;
use rollboard::edges::http::ApiStore;
use rollboard::metrics::Metrics;
use rollboard::store::{Generations, Store};
use serde_json::Value;
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

use crate::support::boards::{apply_events, ev, redis_now, HOUR};
use crate::support::cli::text;
use crate::support::config::{config_for_url, edit_config, BOARDS};
use crate::support::daemon::Daemon;
use crate::support::events::xadd_one;
use crate::support::keys::{intake_stream, schema};
use crate::support::redis::{free_port, RedisServer};
use crate::support::wait::{drained, wait_for};

/// An unscoped board of rooms (slices of 6 h: no slice begins during a test, in practice).
pub const ROOMS_BOARD: &str =
    "[[boards]]\nname = \"rooms\"\nmember = \"room\"\nwindow = \"7d\"\nslice = \"6h\"\n";

/// Both jobs a replica takes a lease for: a daemon whose leases another holds never rolls
/// nor resummarizes.
pub const ALL_JOBS: &[&str] = &["roll", "resummarize"];

/// The HTTP API served in this process as the daemon serves it (its own thread, runtime and
/// Redis connections, `ApiStore::Own`), on Redis's clock. Stopped when dropped.
pub struct Api {
    /// Base URL of its HTTP server.
    pub base: String,
    /// Its HTTP port.
    pub port: u16,
    /// Its clock, synced to Redis's.
    pub clock: Arc<Clock>,
    settings: Arc<Settings>,
    cancel: CancellationToken,
}

impl Api {
    /// Serves `boards` of the Redis at `url` with the `[http]` lines `http`, on the clock
    /// of the Redis `store` reaches, with write counters of its own: every write of `store`
    /// is another process's.
    pub async fn start(url: &str, store: &Store, http: &str, boards: &str) -> Api {
        Api::counting(url, store, http, boards, Arc::new(Generations::new())).await
    }

    /// As [`Api::start`], sharing the write counters of `store`: its writes are this
    /// process's.
    pub async fn sharing(url: &str, store: &Store, http: &str, boards: &str) -> Api {
        Api::counting(url, store, http, boards, store.generations().clone()).await
    }

    /// As [`Api::start`], counting its writes (and reading those written) in
    /// `generations`: a store sharing them writes as this process.
    pub async fn counting(
        url: &str,
        store: &Store,
        http: &str,
        boards: &str,
        generations: Arc<Generations>,
    ) -> Api {
        let port = free_port();
        let text = format!(
            "[redis]\nurl = \"{url}\"\n[http]\nlisten = \"127.0.0.1:{port}\"\n{http}\n{boards}"
        );
        let settings =
            Arc::new(Settings::from_toml(&text).unwrap_or_else(|e| panic!("{e}:\n{text}")));
        let listener =
            std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind the API's port");
        let clock = Arc::new(Clock::new(settings.redis.max_clock_skew_ms));
        clock.sync(store.time_ms()).await.expect("Redis's TIME");
        let metrics = Arc::new(Metrics::new(&settings.boards));
        let cancel = CancellationToken::new();
        rollboard::edges::http::spawn(
            listener,
            settings.clone(),
            metrics,
            clock.clone(),
            vec![Arc::new(AtomicBool::new(true))],
            ApiStore::Own(generations),
            cancel.clone(),
        )
        .await
        .expect("the API serves");
        Api {
            base: format!("http://127.0.0.1:{port}"),
            port,
            clock,
            settings,
            cancel,
        }
    }

    /// The configured board `name`.
    pub fn board(&self, name: &str) -> Board {
        self.settings
            .board(name)
            .expect("a configured board")
            .clone()
    }

    /// The URL of `path` (with its query).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// What one request was answered.
#[derive(Debug, Clone)]
pub struct Answered {
    pub status: u16,
    /// Its headers, by lower-case name.
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

impl Answered {
    /// The header `name` (lower case), when given.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    pub fn etag(&self) -> Option<&str> {
        self.header("etag")
    }

    pub fn cache_control(&self) -> Option<&str> {
        self.header("cache-control")
    }

    pub fn text(&self) -> String {
        text(&self.body)
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}), status {}: {}", self.status, self.text()))
    }
}

/// Sends `request`; its answer (the server must answer, with ASCII headers).
pub async fn ask(request: reqwest::RequestBuilder) -> Answered {
    let response = request.send().await.expect("the server answers");
    let headers = response
        .headers()
        .iter()
        .map(|(name, value)| {
            let value = value.to_str().expect("an ASCII header");
            (name.as_str().to_string(), value.to_string())
        })
        .collect();
    let status = response.status().as_u16();
    let body = response.bytes().await.expect("the answer's body").to_vec();
    Answered {
        status,
        headers,
        body,
    }
}

/// The totals of `member` as `answer` shows it: in a page's or a subset's entries, in a
/// rank answer, or in each window of an `all_windows` answer (one element each but the
/// last).
pub fn totals_of(answer: &Value, member: &str) -> Vec<Option<i64>> {
    if let Some(windows) = answer["windows"].as_array() {
        return windows.iter().map(|w| w["total"].as_i64()).collect();
    }
    if let Some(entries) = answer["entries"].as_array() {
        let entry = entries.iter().find(|e| e["member"] == member);
        return vec![entry.and_then(|e| e["total"].as_i64())];
    }
    assert_eq!(answer["member"], member, "{answer}");
    vec![answer["total"].as_i64()]
}

/// The samples of `/metrics` at `base` (which must answer 200).
pub async fn scrape(client: &reqwest::Client, base: &str) -> prometheus_parse::Scrape {
    let answer = ask(client.get(format!("{base}/metrics"))).await;
    assert_eq!(answer.status, 200, "/metrics: {}", answer.text());
    prometheus_parse::Scrape::parse(answer.text().lines().map(|l| Ok(l.to_string())))
        .expect("prometheus text")
}

/// The value of the first sample of `name` with `labels` in `scrape`, when there is one
/// (NaN for a histogram's or a summary's).
pub fn sample(
    scrape: &prometheus_parse::Scrape,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<f64> {
    let labelled =
        |s: &&prometheus_parse::Sample| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v));
    let found = scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .find(labelled)?;
    Some(match found.value {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => v,
        _ => f64::NAN,
    })
}

/// `rollboard_http_answers_total` at `base`, from one scrape: hits, misses and waits (each
/// series must be there).
pub async fn answer_sources(client: &reqwest::Client, base: &str) -> [f64; 3] {
    let scrape = scrape(client, base).await;
    ["hit", "miss", "wait"].map(|source| {
        sample(
            &scrape,
            "rollboard_http_answers_total",
            &[("source", source)],
        )
        .unwrap_or_else(|| panic!("no rollboard_http_answers_total{{source={source}}}"))
    })
}

/// `rollboard_http_answers_held` and `rollboard_http_answers_held_bytes` at `base`, from one
/// scrape (both must be there).
pub async fn held_gauges(client: &reqwest::Client, base: &str) -> (f64, f64) {
    let scrape = scrape(client, base).await;
    let gauge = |name: &str| sample(&scrape, name, &[]).unwrap_or_else(|| panic!("no {name}"));
    (
        gauge("rollboard_http_answers_held"),
        gauge("rollboard_http_answers_held_bytes"),
    )
}

/// Returns once Redis's clock is at least `margin_ms` before the end of its hour (a day
/// ends on an hour too), waiting the turn out when it is closer: a test that counts hits or
/// compares answers across reads must not see a slice, a one-hour window or a day begin,
/// which makes every answer a new one.
pub async fn clear_of_the_hour(store: &Store, margin_ms: i64) {
    let now = redis_now(store).await;
    let turn = (now.div_euclid(HOUR) + 1) * HOUR;
    if turn - now < margin_ms {
        let wait = Duration::from_millis((turn - now) as u64) + Duration::from_secs(2);
        let turned = wait_for(wait, || async { redis_now(store).await > turn }).await;
        assert!(turned, "Redis's clock never reached {turn}");
    }
}

/// Takes the leases of `jobs` as another replica would: a daemon started now never runs
/// them, not even at start-up.
pub fn hold_leases(redis: &RedisServer, jobs: &[&str]) {
    for job in jobs {
        let key = schema().lease(job);
        let set = redis.cli(&["SET", &key, "another-replica@0", "PX", "600000"]);
        assert!(set.contains("OK"), "SET {key}: {set}");
    }
}

/// A fresh redis-server whose leases of `jobs` another replica holds ([`hold_leases`]),
/// and a store on it (counting its writes apart from any daemon's: another process's).
pub async fn server_holding(jobs: &[&str]) -> (RedisServer, Store) {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    hold_leases(&redis, jobs);
    (redis, store)
}

/// A daemon reaching Redis at `url`, up on a free port with the `[http]` lines `http` and
/// `env` in its environment, its boards `boards` or, when `None`, the test [`BOARDS`]
/// (which may also follow `http`); its temp dir, configuration and port.
pub async fn kept_daemon(
    url: &str,
    http: &str,
    boards: Option<&str>,
    env: &[(&str, String)],
) -> (TempDir, PathBuf, u16, Daemon) {
    let (dir, port, config) = config_for_url(url, "kept", http);
    if let Some(boards) = boards {
        edit_config(&config, BOARDS, boards);
    }
    let daemon = Daemon::spawn_with(&config, port, env);
    daemon.wait_up().await;
    (dir, config, port, daemon)
}

/// Appends a tip of `amount` from `user` in `room`, now, to the daemon's stream.
pub async fn append_tip(store: &Store, id: &str, room: &str, user: &str, amount: i64) {
    let ts = redis_now(store).await.to_string();
    let amount = amount.to_string();
    let fields = vec![
        ("id", id),
        ("ts", ts.as_str()),
        ("room", room),
        ("user", user),
        ("amount", amount.as_str()),
    ];
    xadd_one(store, intake_stream(), fields).await;
}

/// As [`append_tip`], then waits until the daemon's consumer applied and acknowledged it.
pub async fn tip_applied(
    store: &Store,
    daemon: &Daemon,
    id: &str,
    room: &str,
    user: &str,
    amount: i64,
) {
    append_tip(store, id, room, user, amount).await;
    assert!(
        drained(store).await,
        "the tip {id} was not applied; log:\n{}",
        daemon.logs()
    );
}

/// Applies through `store` a tip of each `(id, member, amount)` to the unscoped `board`, at
/// Redis's time now.
pub async fn apply_now(store: &Store, board: &Board, tips: &[(&str, &str, i64)]) {
    let now = redis_now(store).await;
    let events: Vec<_> = tips
        .iter()
        .map(|&(id, member, amount)| ev(id, now, member, amount))
        .collect();
    apply_events(store, board, &events, now).await;
}
