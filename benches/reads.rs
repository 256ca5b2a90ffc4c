//! The read path over HTTP under a real load generator, `wrk`: how many ranking queries per
//! second the daemon answers, at what latency, and what each one costs Redis.
//!
//! ```sh
//! cargo bench --bench reads              # 200 000 events, rows of 8 s
//! cargo bench --bench reads -- --quick   # 20 000 events, rows of 2 s (a smoke run)
//! ```
//!
//! It starts a redis-server and the release `rollboard run` with the shipped
//! `config/rollboard.toml` (only `redis.url` and `http.listen` overridden from the
//! environment), XADDs the events of the shipped shape (benches/support/workload.rs) to the
//! intake stream, waits for the group to drain them and resummarizes `fans_7d` once
//! (`rollboard roll --board fans_7d`). Then each row is one `wrk --latency` run of 2 threads
//! (64 connections unless the row says otherwise): `/healthz` (the daemon's own HTTP
//! ceiling, no Redis), `rooms_7d` top 10, the rank of one room, `fans_7d` top 10 of the
//! busiest room, `rooms_7d` top 10 while a producer XADDs 2 000 events/s, `rooms_7d` top 100
//! with 256 connections; and last the same top 10 read straight from Redis with
//! `redis-benchmark` (`ZREVRANGE <result key> 0 9 WITHSCORES`).
//!
//! Per row: requests/s, its ratio to `/healthz`'s, p50 and p99 latency, the daemon's reads
//! of Redis per request (its own count of `query.lua` calls, which the ingest does not
//! make: the figure the loaded row is judged by) and how its answers were found (kept,
//! read by the request, waited for: `rollboard_http_answers_total`), Redis commands and
//! Redis CPU (user + sys) per request, and the commands split by name (`INFO
//! commandstats`). Redis counts the commands a script runs as commands too, in
//! `total_commands_processed` as in `commandstats`. The figures are the deltas over the row
//! less those of an idle control interval measured just before it (the daemon's own
//! background: the blocked stream read, clock reads, the trim), scaled to the row's length,
//! and on the loaded row less the producer's XADDs; the daemon's ingest of those events
//! stays in that row's figures. No row runs across a minute's start, when the shipped
//! schedule rolls and resummarizes: a row waits for those runs to end, and a row whose
//! control or run saw one anyway is measured again. A row with a non-2xx answer fails, and
//! the bench with it. The table is printed in Markdown.

mod support;

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use rollboard::config::Settings;
use rollboard::domain::keys::Keys;
use rollboard::ingest::stream::group_info;
use support::workload::{fields, fill_stream, Spread};
use support::{invoked_by_cargo_bench, Daemon, RedisServer};
use tokio_util::sync::CancellationToken;

type Result<T> = std::result::Result<T, String>;

/// wrk's threads.
const THREADS: u32 = 2;
/// wrk's connections, unless a row says otherwise.
const CONNECTIONS: u32 = 64;
/// The tips per second of the loaded row.
const TIPS_PER_S: u64 = 2_000;
/// The producer's pace: a batch every this long.
const TIP_EVERY: Duration = Duration::from_millis(10);
/// Event numbers of the producer, far from the fill's, so that no id repeats.
const PRODUCER_OFFSET: usize = 1_000_000_000;
/// The shipped schedule's period: its roll and resummarize fire at every minute's start.
const MINUTE_MS: u64 = 60_000;

/// How much work a run does.
#[derive(Clone, Copy)]
struct Sizes {
    /// Events filled before the rows.
    events: usize,
    /// Length of each row and of its idle control.
    row: Duration,
}

const FULL: Sizes = Sizes {
    events: 200_000,
    row: Duration::from_secs(8),
};

const QUICK: Sizes = Sizes {
    events: 20_000,
    row: Duration::from_secs(2),
};

fn main() -> ExitCode {
    if !invoked_by_cargo_bench() {
        println!("reads bench: skipped (run it with `cargo bench --bench reads`)");
        return ExitCode::SUCCESS;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(if quick { QUICK } else { FULL }, quick)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("error: a row failed (see FAILED above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Refuses to start without the load generators, saying how to install them.
fn check_tools() -> Result<()> {
    for (tool, flag, package) in [
        ("wrk", "-v", "wrk"),
        ("redis-benchmark", "--version", "redis-tools"),
    ] {
        match Command::new(tool).arg(flag).output() {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(format!(
                    "{tool} is not installed; install it with `apt-get install -y {package}`"
                ))
            }
            Err(e) => return Err(format!("cannot run {tool}: {e}")),
        }
    }
    Ok(())
}

/// The bench: a filled daemon, then every row; false when a row failed.
async fn run(sizes: Sizes, quick: bool) -> Result<bool> {
    check_tools()?;
    let started = Instant::now();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = root.join("config/rollboard.toml");
    let settings = Settings::load(&config).map_err(|e| format!("{}: {e}", config.display()))?;
    for board in ["rooms_7d", "fans_7d"] {
        if settings.board(board).is_none() {
            return Err(format!("{} has no board {board}", config.display()));
        }
    }
    let redis = RedisServer::start()?;
    let listen = free_address()?;
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let url = redis.url();
    let env = [
        ("ROLLBOARD__REDIS__URL", url.as_str()),
        ("ROLLBOARD__HTTP__LISTEN", listen.as_str()),
    ];
    let mut daemon = Daemon::start(&config, &env, &dir.path().join("daemon.log"))?;
    daemon
        .until_healthy(&listen, Duration::from_secs(30))
        .await?;
    let client = connect(&url).await?;
    let stream = settings.ingest.stream.clone();
    let group = settings.ingest.group.clone();
    println!(
        "reads: {}, the daemon on {listen}, {} events of the {}",
        redis_version(),
        sizes.events,
        Spread::Shipped.describe()
    );

    let fill = Instant::now();
    let now = rollboard::domain::clock::local_ms();
    fill_stream(&client, &stream, Spread::Shipped, 0, sizes.events, now).await?;
    let filled = fill.elapsed();
    drained(
        &client,
        &stream,
        &group,
        &mut daemon,
        Duration::from_secs(600),
    )
    .await?;
    println!(
        "filled in {:.1} s, drained {:.1} s later",
        filled.as_secs_f64(),
        (fill.elapsed() - filled).as_secs_f64()
    );
    resummarize(&config, &env, "fans_7d")?;

    let keys = Keys::new(settings.redis.key_prefix.as_str());
    let result_key = keys.instance("rooms_7d", None).result();
    let ranked: u64 = client
        .zcard(result_key.as_str())
        .await
        .map_err(|e| format!("ZCARD {result_key}: {e}"))?;
    if ranked == 0 {
        return Err(format!("{result_key} is empty after the fill"));
    }
    let base = format!("http://{listen}");
    let top = get_json(&format!("{base}/v1/boards/rooms_7d/top?limit=1000")).await?;
    let rooms: Vec<String> = top["entries"]
        .as_array()
        .map(|e| {
            e.iter()
                .filter_map(|e| e["member"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let (Some(busiest), Some(middle)) = (rooms.first(), rooms.get(rooms.len() / 2)) else {
        return Err(format!("rooms_7d's top answered no entries: {top}"));
    };
    let middle_rank = rooms.len() / 2 + 1;
    let fans_path = format!(
        "/v1/boards/fans_7d/top?scope={}&limit=10",
        utf8_percent_encode(busiest, NON_ALPHANUMERIC)
    );
    let fans = get_json(&format!("{base}{fans_path}")).await?;
    if fans["entries"].as_array().is_none_or(|e| e.is_empty()) {
        return Err(format!(
            "fans_7d of {busiest} is empty after the resummarize: {fans}"
        ));
    }
    println!(
        "rooms_7d ranks {ranked} rooms (busiest {busiest}); fans_7d of {busiest} ranks {} fans",
        fans["count"]
    );

    let top10 = "/v1/boards/rooms_7d/top?limit=10".to_string();
    let specs = [
        Spec::wrk("`/healthz`", "/healthz", CONNECTIONS),
        Spec::wrk("`rooms_7d` top 10", &top10, CONNECTIONS),
        Spec::wrk(
            &format!("`rooms_7d` rank of one room (`{middle}`, rank {middle_rank})"),
            &format!(
                "/v1/boards/rooms_7d/members/{}",
                utf8_percent_encode(middle, NON_ALPHANUMERIC)
            ),
            CONNECTIONS,
        ),
        Spec::wrk(
            &format!("`fans_7d` top 10 of the busiest room (`{busiest}`)"),
            &fans_path,
            CONNECTIONS,
        ),
        Spec {
            ingest: true,
            ..Spec::wrk(
                &format!("`rooms_7d` top 10 while {TIPS_PER_S} tips/s arrive"),
                &top10,
                CONNECTIONS,
            )
        },
        Spec::wrk(
            "`rooms_7d` top 100, 256 connections",
            "/v1/boards/rooms_7d/top?limit=100",
            256,
        ),
        Spec {
            label: format!(
                "the same top 10 straight from Redis (`redis-benchmark -c {CONNECTIONS}`)"
            ),
            load: Load::RedisBenchmark {
                key: result_key.clone(),
            },
            ingest: false,
        },
    ];
    let bench = Bench {
        client,
        producer: connect(&url).await?,
        redis: &redis,
        base,
        stream,
        group,
        keys,
        sizes,
    };
    let mut rows = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        println!("row {}/{}: {}", i + 1, specs.len(), spec.label);
        let row = bench.row(spec, &mut daemon).await?;
        println!("  {}", row.summary());
        rows.push(row);
        if spec.ingest {
            drained(
                &bench.client,
                &bench.stream,
                &bench.group,
                &mut daemon,
                Duration::from_secs(120),
            )
            .await?;
        }
    }
    if let Some(status) = daemon.exited() {
        return Err(format!(
            "the daemon exited ({status}):\n{}",
            daemon.log_tail()
        ));
    }
    print_table(&rows, sizes, quick, started.elapsed());
    Ok(rows.iter().all(|r| r.failure.is_none()))
}

/// A free loopback address for the daemon's API.
fn free_address() -> Result<String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.to_string())
        .map_err(|e| format!("no free port: {e}"))
}

async fn connect(url: &str) -> Result<Client> {
    let client = Builder::from_config(Config::from_url(url).map_err(|e| e.to_string())?)
        .build()
        .map_err(|e| e.to_string())?;
    client
        .init()
        .await
        .map_err(|e| format!("connect to {url}: {e}"))?;
    Ok(client)
}

fn redis_version() -> String {
    Command::new("redis-server")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .find_map(|w| w.strip_prefix("v=").map(|v| format!("Redis {v}")))
        })
        .unwrap_or_else(|| "Redis (version unknown)".into())
}

async fn get_json(url: &str) -> Result<serde_json::Value> {
    let answer = reqwest::get(url)
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    let status = answer.status();
    let body = answer.text().await.map_err(|e| format!("GET {url}: {e}"))?;
    if !status.is_success() {
        return Err(format!("GET {url}: {status}: {body}"));
    }
    serde_json::from_str(&body).map_err(|e| format!("GET {url}: {e}: {body}"))
}

/// Waits until the group has read every entry of `stream` and has none pending.
async fn drained(
    client: &Client,
    stream: &str,
    group: &str,
    daemon: &mut Daemon,
    limit: Duration,
) -> Result<()> {
    let started = Instant::now();
    loop {
        let info = group_info(client, stream, group)
            .await
            .map_err(|e| format!("XINFO GROUPS {stream}: {e}"))?;
        if matches!(info, Some((0, Some(0)))) {
            return Ok(());
        }
        if let Some(status) = daemon.exited() {
            return Err(format!(
                "the daemon exited ({status}):\n{}",
                daemon.log_tail()
            ));
        }
        if started.elapsed() > limit {
            return Err(format!(
                "the group did not drain {stream} within {limit:?} (pending, lag: {info:?})"
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `rollboard roll --board <board>`: resummarizes a resummarize board now, rather than at
/// the next minute's start.
fn resummarize(config: &Path, env: &[(&str, &str)], board: &str) -> Result<()> {
    let out = Command::new(env!("CARGO_BIN_EXE_rollboard"))
        .arg("--config")
        .arg(config)
        .args(["roll", "--board", board])
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("rollboard roll: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "rollboard roll --board {board}: {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// What drives a row.
enum Load {
    /// wrk on this path of the daemon's API.
    Wrk { path: String, connections: u32 },
    /// redis-benchmark's `ZREVRANGE key 0 9 WITHSCORES` against the server itself.
    RedisBenchmark { key: String },
}

/// One row to measure.
struct Spec {
    label: String,
    load: Load,
    /// Whether the producer sends tips during the row.
    ingest: bool,
}

impl Spec {
    fn wrk(label: &str, path: &str, connections: u32) -> Spec {
        Spec {
            label: label.to_string(),
            load: Load::Wrk {
                path: path.to_string(),
                connections,
            },
            ingest: false,
        }
    }

    fn connections(&self) -> u32 {
        match self.load {
            Load::Wrk { connections, .. } => connections,
            Load::RedisBenchmark { .. } => CONNECTIONS,
        }
    }
}

/// What a load generator reported.
struct Generated {
    requests: u64,
    per_second: f64,
    p50: Duration,
    p99: Duration,
    /// Answers other than 2xx and 3xx (wrk's `Non-2xx or 3xx responses`).
    non_2xx: u64,
    /// wrk's `Socket errors` line, when one of them is not 0.
    socket_errors: Option<String>,
}

/// Redis's counters at an instant (`INFO stats cpu commandstats`), or a difference of two.
#[derive(Clone, Default)]
struct Counters {
    /// `total_commands_processed`.
    commands: f64,
    /// `used_cpu_sys` + `used_cpu_user`, seconds.
    cpu: f64,
    /// Per command (`cmdstat_<name>`): calls and µs.
    by_command: BTreeMap<String, (f64, f64)>,
}

impl Counters {
    fn parse(info: &str) -> Counters {
        let mut c = Counters::default();
        for line in info.lines().map(str::trim) {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            match name {
                "total_commands_processed" => c.commands = value.parse().unwrap_or(0.0),
                "used_cpu_sys" | "used_cpu_user" => c.cpu += value.parse().unwrap_or(0.0),
                _ => {
                    if let Some(command) = name.strip_prefix("cmdstat_") {
                        let stat = |key: &str| -> f64 {
                            value
                                .split(',')
                                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                                .and_then(|v| v.parse().ok())
                                .unwrap_or(0.0)
                        };
                        c.by_command
                            .insert(command.to_string(), (stat("calls"), stat("usec")));
                    }
                }
            }
        }
        c
    }

    /// `self - other`, scaled by `k`, command by command.
    fn minus(&self, other: &Counters, k: f64) -> Counters {
        let mut by_command = self.by_command.clone();
        for (name, (calls, usec)) in &other.by_command {
            let e = by_command.entry(name.clone()).or_default();
            e.0 -= calls * k;
            e.1 -= usec * k;
        }
        Counters {
            commands: self.commands - other.commands * k,
            cpu: self.cpu - other.cpu * k,
            by_command,
        }
    }

    /// Every figure divided by `n`.
    fn per(&self, n: f64) -> Counters {
        Counters {
            commands: self.commands / n,
            cpu: self.cpu / n,
            by_command: self
                .by_command
                .iter()
                .map(|(k, (calls, usec))| (k.clone(), (calls / n, usec / n)))
                .collect(),
        }
    }
}

/// A measured row.
struct Row {
    label: String,
    connections: u32,
    generated: Generated,
    /// Redis's work per request, the background and the producer's XADDs taken out.
    per_request: Counters,
    /// On the loaded row: the tips sent and their rate.
    tips: Option<(u64, f64)>,
    /// The daemon's own count of its reads of Redis (`query.lua` calls) per request, and
    /// how its answers were found (kept, read, waited for), as shares of the requests.
    reads: DaemonReads,
    /// Why the row failed.
    failure: Option<String>,
    /// Measurements taken (more than one when a scheduled job ran during one).
    tries: u32,
}

impl Row {
    fn summary(&self) -> String {
        let g = &self.generated;
        let mut out = format!(
            "{} requests, {:.0}/s, p50 {}, p99 {}, {} Redis commands and {} µs of Redis CPU \
             per request",
            g.requests,
            g.per_second,
            latency(g.p50),
            latency(g.p99),
            fixed(self.per_request.commands, 2),
            fixed(self.per_request.cpu * 1e6, 1)
        );
        if let Some(why) = &self.failure {
            out.push_str(&format!("; FAILED: {why}"));
        }
        if let Some(errors) = &g.socket_errors {
            out.push_str(&format!("; WARNING: socket errors {errors}"));
        }
        out
    }
}

/// The daemon's counters of its reads (from its `/metrics`), or a difference of two.
#[derive(Debug, Clone, Copy, Default)]
struct DaemonReads {
    /// `rollboard_script_duration_seconds_count{script="query"}`: reads of Redis.
    query_calls: f64,
    /// `rollboard_http_answers_total` by source: hit, miss, wait.
    answers: [f64; 3],
}

impl DaemonReads {
    fn parse(text: &str) -> DaemonReads {
        let value = |series: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(series))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        DaemonReads {
            query_calls: value("rollboard_script_duration_seconds_count{script=\"query\"} "),
            answers: ["hit", "miss", "wait"]
                .map(|s| value(&format!("rollboard_http_answers_total{{source=\"{s}\"}} "))),
        }
    }

    fn minus(&self, other: &DaemonReads) -> DaemonReads {
        DaemonReads {
            query_calls: self.query_calls - other.query_calls,
            answers: [0, 1, 2].map(|i| self.answers[i] - other.answers[i]),
        }
    }
}

/// What every row uses.
struct Bench<'a> {
    /// The bench's own connection: counters and checks.
    client: Client,
    /// The loaded row's producer, on a connection of its own.
    producer: Client,
    redis: &'a RedisServer,
    /// `http://host:port` of the daemon's API.
    base: String,
    stream: String,
    group: String,
    keys: Keys,
    sizes: Sizes,
}

impl Bench<'_> {
    /// Measures `spec`: an idle control, then the row, both clear of the scheduled jobs.
    async fn row(&self, spec: &Spec, daemon: &mut Daemon) -> Result<Row> {
        let length = self.sizes.row;
        let mut tries = 0;
        loop {
            tries += 1;
            let requests = match &spec.load {
                Load::RedisBenchmark { key } => Some(self.calibrate(key).await?),
                Load::Wrk { .. } => None,
            };
            // The control, the row and the counters between them.
            self.clear_of_jobs(length * 2 + Duration::from_millis(1500))
                .await?;
            let ticks = self.ticks().await?;
            let (idle, idle_for) = {
                let before = self.counters().await?;
                let t = Instant::now();
                tokio::time::sleep(length).await;
                let after = self.counters().await?;
                (after.minus(&before, 1.0), t.elapsed())
            };
            let before = self.counters().await?;
            let reads_before = self.daemon_reads().await?;
            let t = Instant::now();
            let cancel = CancellationToken::new();
            let producer = spec.ingest.then(|| {
                tokio::spawn(produce(
                    self.producer.clone(),
                    self.stream.clone(),
                    cancel.clone(),
                ))
            });
            let generated = match &spec.load {
                Load::Wrk { path, connections } => {
                    wrk(&format!("{}{path}", self.base), *connections, length).await
                }
                Load::RedisBenchmark { key } => {
                    redis_benchmark(self.redis.port, key, requests.unwrap_or(0)).await
                }
            };
            cancel.cancel();
            let tips = match producer {
                Some(task) => Some(task.await.map_err(|e| format!("the producer: {e}"))??),
                None => None,
            };
            let after = self.counters().await?;
            let took = t.elapsed();
            let reads = self.daemon_reads().await?.minus(&reads_before);
            let generated = generated?;
            if let Some(status) = daemon.exited() {
                return Err(format!(
                    "the daemon exited ({status}):\n{}",
                    daemon.log_tail()
                ));
            }
            if self.ticks().await? != ticks && tries < 3 {
                println!(
                    "  a scheduled roll or resummarize ran during the row: measuring it again"
                );
                if spec.ingest {
                    drained(
                        &self.client,
                        &self.stream,
                        &self.group,
                        daemon,
                        Duration::from_secs(120),
                    )
                    .await?;
                }
                continue;
            }
            let mut work = after
                .minus(&before, 1.0)
                .minus(&idle, took.as_secs_f64() / idle_for.as_secs_f64());
            if let Some((sent, _)) = tips {
                work.commands -= sent as f64;
                if let Some(xadd) = work.by_command.get_mut("xadd") {
                    xadd.0 -= sent as f64;
                }
            }
            let failure = (generated.non_2xx > 0).then(|| {
                format!(
                    "{} of {} answers were not 2xx or 3xx",
                    generated.non_2xx, generated.requests
                )
            });
            let failure = match failure {
                None if generated.requests == 0 => Some("no request was answered".into()),
                f => f,
            };
            return Ok(Row {
                label: spec.label.clone(),
                connections: spec.connections(),
                per_request: work.per(generated.requests.max(1) as f64),
                generated,
                tips: tips.map(|(sent, took)| (sent, sent as f64 / took.as_secs_f64())),
                reads,
                failure,
                tries,
            });
        }
    }

    /// The daemon's counters of its reads, from its `/metrics`.
    async fn daemon_reads(&self) -> Result<DaemonReads> {
        let url = format!("{}/metrics", self.base);
        let answer = reqwest::get(&url)
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        let text = answer.text().await.map_err(|e| format!("GET {url}: {e}"))?;
        Ok(DaemonReads::parse(&text))
    }

    /// Requests of a redis-benchmark run that lasts about a row: a short run first gives
    /// the rate.
    async fn calibrate(&self, key: &str) -> Result<u64> {
        let probe = redis_benchmark(self.redis.port, key, 10_000).await?;
        let n = probe.per_second * self.sizes.row.as_secs_f64();
        Ok((n as u64).clamp(10_000, 10_000_000))
    }

    /// Redis's counters now.
    async fn counters(&self) -> Result<Counters> {
        let info: String = self
            .client
            .custom(
                CustomCommand::new_static("INFO", ClusterHash::Random, false),
                vec!["stats", "cpu", "commandstats"],
            )
            .await
            .map_err(|e| format!("INFO: {e}"))?;
        Ok(Counters::parse(&info))
    }

    /// The latest tick each scheduled job started (its lease's tick record).
    async fn ticks(&self) -> Result<Vec<Option<i64>>> {
        let mut out = Vec::new();
        for job in ["roll", "resummarize"] {
            let key = self.keys.lease_tick(job);
            let tick: Option<i64> = self
                .client
                .get(key.as_str())
                .await
                .map_err(|e| format!("GET {key}: {e}"))?;
            out.push(tick);
        }
        Ok(out)
    }

    /// Whether a scheduled job holds its lease (runs).
    async fn job_running(&self) -> Result<bool> {
        for job in ["roll", "resummarize"] {
            let key = self.keys.lease(job);
            let held: i64 = self
                .client
                .exists(key.as_str())
                .await
                .map_err(|e| format!("EXISTS {key}: {e}"))?;
            if held > 0 {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Returns once no scheduled job runs and none is due within `needed` (plus a margin):
    /// the shipped schedule rolls and resummarizes at every minute's start, so a row that
    /// would run across one waits for it and for those runs to end.
    async fn clear_of_jobs(&self, needed: Duration) -> Result<()> {
        let margin = Duration::from_secs(2);
        let limit = Instant::now() + Duration::from_secs(300);
        loop {
            if Instant::now() > limit {
                return Err("the scheduled jobs did not end within 300 s".into());
            }
            let now = wall_ms();
            let next = (now / MINUTE_MS + 1) * MINUTE_MS;
            let left = Duration::from_millis(next - now);
            if left > needed + margin {
                if !self.job_running().await? {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            let before = self.ticks().await?;
            tokio::time::sleep(left + Duration::from_millis(200)).await;
            // Both jobs take their tick's lease within moments of the minute's start; a job
            // still running an earlier tick skips this one, hence the bound.
            let waited = Instant::now();
            while self.ticks().await? == before && waited.elapsed() < Duration::from_secs(10) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let started = self.ticks().await?;
            while self.job_running().await? {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if started != before {
                println!("  (waited for the scheduled runs of the minute's start to end)");
            }
        }
    }
}

/// The epoch ms of this host's clock, the one the daemon's cron fires on.
fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// XADDs tips of the shipped shape at [`TIPS_PER_S`], a batch every [`TIP_EVERY`], until
/// `cancel`; the tips sent and for how long.
async fn produce(
    client: Client,
    stream: String,
    cancel: CancellationToken,
) -> Result<(u64, Duration)> {
    let now = rollboard::domain::clock::local_ms();
    let started = Instant::now();
    let mut tick = tokio::time::interval(TIP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sent = 0u64;
    loop {
        // Cancel safety: a batch is sent outside the select, so it is never cut short.
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tick.tick() => {}
        }
        let due = (started.elapsed().as_secs_f64() * TIPS_PER_S as f64) as u64;
        if due <= sent {
            continue;
        }
        let pipeline = client.pipeline();
        for k in sent..due {
            let tip = fields(Spread::Shipped, PRODUCER_OFFSET + k as usize, now);
            let _: () = pipeline
                .xadd(stream.as_str(), false, None::<()>, "*", tip)
                .await
                .map_err(|e| format!("XADD: {e}"))?;
        }
        let _: Vec<Value> = pipeline.all().await.map_err(|e| format!("XADD: {e}"))?;
        sent = due;
    }
    Ok((sent, started.elapsed()))
}

/// One `wrk --latency` run on `url`.
async fn wrk(url: &str, connections: u32, length: Duration) -> Result<Generated> {
    let out = tokio::process::Command::new("wrk")
        .arg("-t")
        .arg(THREADS.min(connections).to_string())
        .arg("-c")
        .arg(connections.to_string())
        .arg("-d")
        .arg(format!("{}s", length.as_secs().max(1)))
        .arg("--latency")
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("cannot run wrk: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "wrk {url}: {}: {text}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    parse_wrk(&text).map_err(|why| format!("wrk {url}: {why} in its output:\n{text}"))
}

/// Reads wrk's report: the request count, `Requests/sec:`, the 50% and 99% lines of the
/// `Latency Distribution` block, `Non-2xx or 3xx responses:` and `Socket errors:`.
fn parse_wrk(text: &str) -> Result<Generated> {
    let (mut requests, mut per_second, mut p50, mut p99) = (None, None, None, None);
    let (mut non_2xx, mut socket_errors) = (0, None);
    let mut distribution = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with("Latency Distribution") {
            distribution = true;
            continue;
        }
        if distribution {
            let mut words = line.split_whitespace();
            match (words.next(), words.next()) {
                (Some(share), Some(value)) if share.ends_with('%') => {
                    match share {
                        "50%" => p50 = Some(parse_latency(value)?),
                        "99%" => p99 = Some(parse_latency(value)?),
                        _ => {}
                    }
                    continue;
                }
                _ => distribution = false,
            }
        }
        if let Some(v) = line.strip_prefix("Requests/sec:") {
            per_second = Some(
                v.trim()
                    .parse::<f64>()
                    .map_err(|e| format!("Requests/sec {v:?}: {e}"))?,
            );
        } else if let Some(v) = line.strip_prefix("Non-2xx or 3xx responses:") {
            non_2xx = v
                .trim()
                .parse()
                .map_err(|e| format!("Non-2xx or 3xx responses {v:?}: {e}"))?;
        } else if let Some(v) = line.strip_prefix("Socket errors:") {
            let any = v
                .split(',')
                .filter_map(|kv| kv.split_whitespace().last())
                .any(|n| n != "0");
            socket_errors = any.then(|| v.trim().to_string());
        } else if let Some((n, _)) = line.split_once(" requests in ") {
            requests = Some(
                n.trim()
                    .parse::<u64>()
                    .map_err(|e| format!("request count {n:?}: {e}"))?,
            );
        }
    }
    Ok(Generated {
        requests: requests.ok_or("no `N requests in` line")?,
        per_second: per_second.ok_or("no Requests/sec line")?,
        p50: p50.ok_or("no 50% line in the Latency Distribution")?,
        p99: p99.ok_or("no 99% line in the Latency Distribution")?,
        non_2xx,
        socket_errors,
    })
}

/// A wrk latency: a number and its unit (`us`, `ms`, `s`, `m`, `h`).
fn parse_latency(text: &str) -> Result<Duration> {
    let split = text
        .find(|c: char| c.is_ascii_alphabetic())
        .ok_or_else(|| format!("latency {text:?} has no unit"))?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|e| format!("latency {text:?}: {e}"))?;
    let seconds = match unit {
        "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3_600.0,
        _ => return Err(format!("latency {text:?}: unknown unit {unit:?}")),
    };
    Ok(Duration::from_secs_f64(number * seconds))
}

/// `redis-benchmark -c 64 -n <requests> ZREVRANGE <key> 0 9 WITHSCORES` against the server
/// on `port`, read from its `--csv` report.
async fn redis_benchmark(port: u16, key: &str, requests: u64) -> Result<Generated> {
    let out = tokio::process::Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", &CONNECTIONS.to_string(), "-n", &requests.to_string()])
        .arg("--csv")
        .args(["ZREVRANGE", key, "0", "9", "WITHSCORES"])
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("cannot run redis-benchmark: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "redis-benchmark: {}: {text}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    parse_redis_benchmark(&text, requests)
        .map_err(|why| format!("redis-benchmark: {why} in its output:\n{text}"))
}

/// Reads redis-benchmark's `--csv` report: a header line (`"test","rps",...`) and a line of
/// values.
fn parse_redis_benchmark(text: &str, requests: u64) -> Result<Generated> {
    let cells = |line: &str| -> Vec<String> {
        line.trim()
            .trim_matches('"')
            .split("\",\"")
            .map(str::to_string)
            .collect()
    };
    let mut lines = text.lines().skip_while(|l| !l.starts_with("\"test\""));
    let header = cells(lines.next().ok_or("no header line")?);
    let values = cells(lines.next().ok_or("no line of figures")?);
    let column = |name: &str| -> Result<f64> {
        let i = header
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| format!("no column {name}"))?;
        values
            .get(i)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("no number in column {name}"))
    };
    let ms = |name: &str| column(name).map(|v| Duration::from_secs_f64(v / 1e3));
    Ok(Generated {
        requests,
        per_second: column("rps")?,
        p50: ms("p50_latency_ms")?,
        p99: ms("p99_latency_ms")?,
        non_2xx: 0,
        socket_errors: None,
    })
}

/// `v` with `places` decimals, a tiny negative (noise of the subtraction) shown as 0.
fn fixed(v: f64, places: usize) -> String {
    let v = if v < 0.0 && v > -0.5 * 10f64.powi(-(places as i32)) {
        0.0
    } else {
        v
    };
    format!("{v:.places$}")
}

/// A latency in ms.
fn latency(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms >= 100.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{ms:.2} ms")
    }
}

/// `n` with a space between groups of three digits.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// The table, in Markdown, then each row's commands by name.
fn print_table(rows: &[Row], sizes: Sizes, quick: bool, took: Duration) {
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let secs = sizes.row.as_secs();
    let healthz = rows.first().map_or(0.0, |r| r.generated.per_second);
    println!();
    println!(
        "### The read path over HTTP: `cargo bench --bench reads{}`, commit `{commit}`{}",
        if quick { " -- --quick" } else { "" },
        if dirty {
            " with uncommitted changes"
        } else {
            ""
        }
    );
    println!();
    println!(
        "{cores} cores, shared by wrk, the daemon and Redis; {}; the shipped \
         `config/rollboard.toml` filled with {} events of the shipped shape. Each row is one \
         `wrk -t{THREADS} -c<connections> -d{secs}s --latency` run ({CONNECTIONS} connections \
         unless it says otherwise; the last row `redis-benchmark -c {CONNECTIONS}` for about \
         {secs} s), after an idle control of {secs} s whose Redis commands and CPU, scaled to \
         the row's length, are taken out. Load average at the end {}.",
        redis_version(),
        thousands(sizes.events as u64),
        load_average()
    );
    println!();
    println!(
        "| row | requests/s | vs `/healthz` | p50 | p99 | reads of Redis / request | answers kept / read / waited | Redis commands / request \
         | Redis CPU / request |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        let g = &row.generated;
        let mark = if row.tips.is_some() { " (1)" } else { "" };
        let rate = match &row.failure {
            Some(why) => format!("**FAILED**: {why}"),
            None => thousands(g.per_second.round() as u64),
        };
        let n = g.requests.max(1) as f64;
        let (reads, sources) =
            if row.label.starts_with('/') || row.label.contains("redis-benchmark") {
                ("".to_string(), "".to_string())
            } else {
                let [hit, miss, wait] = row.reads.answers;
                (
                    fixed(row.reads.query_calls / n, 4),
                    format!(
                        "{}% / {}% / {}%",
                        fixed(100.0 * hit / n, 2),
                        fixed(100.0 * miss / n, 2),
                        fixed(100.0 * wait / n, 2)
                    ),
                )
            };
        println!(
            "| {} | {rate} | {}x | {} | {} | {reads} | {sources} | {}{mark} | {} µs{mark} |",
            row.label,
            fixed(g.per_second / healthz.max(f64::MIN_POSITIVE), 2),
            latency(g.p50),
            latency(g.p99),
            fixed(row.per_request.commands, 2),
            fixed(row.per_request.cpu * 1e6, 1),
        );
    }
    println!();
    if let Some(row) = rows.iter().find(|r| r.tips.is_some()) {
        let (sent, rate) = row.tips.unwrap_or_default();
        println!(
            "(1) With the daemon's ingest of the {} tips the producer sent during the row \
             ({rate:.0}/s): only the producer's XADDs are taken out.",
            thousands(sent)
        );
        println!();
    }
    println!(
        "Redis commands per request by name (`INFO commandstats` deltas, the same \
         subtraction; a script's own commands included), with their Redis µs per request (a \
         script's µs include its commands'):"
    );
    println!();
    for row in rows {
        let mut split: Vec<(&String, &(f64, f64))> = row
            .per_request
            .by_command
            .iter()
            .filter(|(name, (calls, _))| name.as_str() != "info" && calls.abs() >= 0.005)
            .collect();
        split.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
        let split: Vec<String> = split
            .iter()
            .map(|(name, (calls, usec))| {
                format!("{name} {} ({} µs)", fixed(*calls, 2), fixed(*usec, 2))
            })
            .collect();
        let mut notes = Vec::new();
        if row.connections != CONNECTIONS {
            notes.push(format!("{} connections", row.connections));
        }
        if row.tries > 1 {
            notes.push(format!(
                "measured {} times, a scheduled job ran during the first",
                row.tries
            ));
        }
        if let Some(errors) = &row.generated.socket_errors {
            notes.push(format!("wrk socket errors: {errors}"));
        }
        println!(
            "- {}: {}{}",
            row.label,
            if split.is_empty() {
                "none".to_string()
            } else {
                split.join(", ")
            },
            if notes.is_empty() {
                String::new()
            } else {
                format!(" ({})", notes.join("; "))
            }
        );
    }
    println!();
    println!("run time {:.0} s", took.as_secs_f64());
}
