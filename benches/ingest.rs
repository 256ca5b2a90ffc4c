//! Ingest throughput, query latency and freshness (docs/benchmarks.md), each scenario
//! against its own redis-server started here, each figure with its baseline from the same
//! run. The summary table of every section-7 figure is `cargo bench --bench rollboard --
//! table`, which runs these scenarios too.
//!
//! ```sh
//! cargo bench --bench ingest                 # every scenario
//! cargo bench --bench ingest -- naive pipelined script e2e ceiling query freshness [--quick]
//! cargo bench --bench ingest -- partitions   # 1 and 3 partitions, 1 and 2 consumers
//! cargo bench --bench ingest -- reads        # stream reads: one call per batch vs pieces
//! cargo bench --bench ingest -- dense        # the cost of dense_rank = true (valgrind)
//! cargo bench --bench ingest -- feed         # the cost of changes_top = 10 (valgrind)
//! cargo bench --bench ingest -- windows      # the cost of a 2nd and 3rd window (valgrind)
//! cargo bench --bench ingest -- instructions # Redis under callgrind (needs valgrind)
//! cargo bench --bench ingest -- cost         # rollboard alone on the shipped shapes (valgrind)
//! ROLLBOARD_BENCH_CALLGRIND_DIR=/tmp/cg cargo bench --bench ingest -- cost  # and keep each dump
//! ```
//!
//! Four workloads: `Skewed` (a power law over 10 000 rooms) and `Uniform` (100 000 rooms)
//! on one unscoped board, their events within the last day; and `Shipped`, the shape of
//! config/rollboard.toml: every event reaches an unscoped incremental `rooms_7d` board and
//! its room's instance of the scoped resummarize `fans_7d` board, power-law skewed over
//! rooms and over the fans of a room, its events over the last 5 days, and `ShippedNow`,
//! the same with every event within the last minute (a live platform). Every event carries
//! an id.
//!
//! * `naive`: one client sending HINCRBY then ZINCRBY per event and per board, awaited one at
//!   a time; two passes, as `e2e`.
//! * `pipelined`: the same commands, sent 500 events to a round trip, on the events of `e2e`
//!   (its two passes): the cheapest the naive commands are for Redis.
//! * `script`: the apply script called directly with batches of 500 (no consumer around it;
//!   one-board workloads).
//! * `e2e`: events pre-filled into the stream, drained by one consumer (XREADGROUP,
//!   validation, apply, XACK) until the group has nothing pending; Redis time per event is
//!   the INFO commandstats delta of every command the consumer sent, Redis CPU per event the
//!   server's user + sys CPU (INFO cpu) over the drain; the slow log, on from 100 µs, gives
//!   per kind of call (FCALL per function, XREADGROUP, XACK, ...) the calls above 2 ms and
//!   the longest, and INFO commandstats the stream commands' µs per call. Two passes: the first
//!   from an empty Redis, the second of as many new events of the same workload on the
//!   keys the first left (the steady state of a running board); the figures are the
//!   second's, with the first's beside them.
//! * `instructions`: what `naive` and `e2e` measure in time, counted in instructions that
//!   Redis runs per event (valgrind's callgrind, smoke-run sizes): the same count for the
//!   same work however busy the machine is, so two versions compare on any host. Named
//!   explicitly only: it takes about ten minutes.
//! * `cost`: as `instructions`, rollboard's consumer alone, on the two shipped workloads:
//!   the figure to compare two versions of the apply path by. Named explicitly only.
//! * `ceiling`: the same apply script driven by redis-benchmark (Redis-side ceiling).
//! * `query`: top-10 and rank latency over HTTP (served as the daemon serves it, on a thread
//!   and connections of its own; the client on another thread), idle and while one consumer
//!   drains a backlog at full speed.
//! * `freshness`: the shipped shape, from an empty Redis, at half the end-to-end rate of the
//!   first pass measured first: a paced
//!   producer XADDs events and, every 20 ms, a probe event on a dedicated room that tops the
//!   `rooms_7d` board; a watcher polls `top` over HTTP and takes the time each probe shows.
//!   Baseline: the same probes with no other traffic. The HTTP server answers with
//!   `http.max_staleness = 0s` (every query reads Redis): the figure is how long an event
//!   takes to be applied, not how long the server keeps an answer (with the default `1s`,
//!   another process's writes show in its answers up to a second later).
//!   `ROLLBOARD_BENCH_FRESHNESS_RATE=<events/s>` offers that rate instead of half the
//!   first pass's, so that two builds are compared at one load.
//! * `partitions`: events pre-filled by the partition rule into 1 or 3 stream partitions,
//!   drained by 1 or 2 consumer processes' worth of consumers (each its own connections and
//!   one reader per partition, in this process); events/s and Redis time per event (INFO
//!   commandstats of FCALL, XREADGROUP and XACK, and the server's user+sys CPU).
//! * `reads`: the shipped shape's drain with each batch read in one call (`XREADGROUP` and
//!   `XAUTOCLAIM` `COUNT 500`) and in pieces (the defaults), for new entries, the
//!   consumer's own pending ones and a gone consumer's: µs per stream call, the longest and
//!   the count above 2 ms (SLOWLOG), and the drain's events/s and Redis CPU per event.
//! * `dense`: as `instructions`, rollboard alone, with every board plain and with
//!   `dense_rank = true` (skewed and shipped): instructions per event of each and their
//!   ratio. Named explicitly only.
//! * `feed`: as `dense`, with every board plain and with `changes_top = 10` (the change
//!   feed of its top 10; on the shipped shape it is written by `rooms_7d`'s applies, as
//!   `fans_7d`, a resummarize board, writes its feed at its runs' swaps, outside the drain).
//! * `windows`: as `dense`, with every board ranking its one window (7d), then
//!   `windows = ["24h", "7d"]`, then `windows = ["24h", "7d", "30d"]` (every event of the
//!   workload falls in the last day, so it counts in every window): instructions per event
//!   of each and the ratios against one window. Named explicitly only.

pub(crate) mod support;

use std::collections::BTreeMap;
use std::ops::Range;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The daemon's allocator (src/main.rs), so that a consumer run here costs what it costs
/// in the daemon.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use fred::prelude::*;
use rollboard::config::{IngestSettings, ScriptCalls, Settings};
use rollboard::domain::board::Board;
use rollboard::ingest::{consumer::Ingest, stream::group_info};
use rollboard::metrics::Metrics;
use rollboard::store::{apply_call, ApplyEvent, Reconnect, Store, APPLY_CHUNK};
use support::workload::{apply_event, fields, fill_stream, Spread, MEMBERS, SKEWED_ROOMS};
use support::{
    cpu, invoked_by_cargo_bench, latency_of, percentile, slow_by_kind, slowlog_start, slowlog_take,
    RedisServer,
};
use tokio_util::sync::CancellationToken;

const BATCH: usize = 500;

/// How much work each scenario does.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// Events of the script and end-to-end runs.
    pub events: usize,
    /// Events of the naive client.
    pub naive_events: usize,
    /// Requests of each query round.
    pub queries: usize,
    /// Length of the loaded freshness run.
    pub freshness: Duration,
}

/// The sizes of the figures in docs/benchmarks.md.
pub const FULL: Sizes = Sizes {
    events: 200_000,
    naive_events: 20_000,
    queries: 2_000,
    freshness: Duration::from_secs(10),
};

/// A smoke run.
pub const QUICK: Sizes = Sizes {
    events: 30_000,
    naive_events: 4_000,
    queries: 500,
    freshness: Duration::from_secs(3),
};

/// The one-board workloads' configuration; `ingest.batch_size` is left at its default, as
/// in every workload here.
const CONFIG: &str = r#"
[ingest]
block = "100ms"
[[boards]]
name = "rooms"
member = "room"
window = "7d"
slice = "1h"
"#;

/// The two boards of config/rollboard.toml that tips feed by room and by fan.
const SHIPPED_CONFIG: &str = r#"
[ingest]
block = "1s"
[[boards]]
name = "rooms_7d"
member = "room"
amount = "amount"
scale = 0
window = "7d"
slice = "6h"
mode = "incremental"
tie_break = "earliest"
allow_negative = false
[[boards]]
name = "fans_7d"
member = "user"
scope = "room"
window = "7d"
slice = "1h"
mode = "resummarize"
"#;

type Result<T> = std::result::Result<T, String>;

#[allow(dead_code)] // `cargo bench --bench rollboard -- table` compiles this file as a module
fn main() -> ExitCode {
    if !invoked_by_cargo_bench() {
        println!("ingest bench: skipped (run it with `cargo bench --bench ingest`)");
        return ExitCode::SUCCESS;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sizes = if args.iter().any(|a| a == "--quick") {
        QUICK
    } else {
        FULL
    };
    let wanted: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    // Run only when named: `instructions`, `cost`, `dense`, `feed` and `windows` run Redis
    // under valgrind (minutes), `partitions` and `reads` compare layouts.
    let named_only = 7;
    let all = [
        "instructions",
        "cost",
        "dense",
        "feed",
        "windows",
        "partitions",
        "reads",
        "naive",
        "pipelined",
        "script",
        "e2e",
        "ceiling",
        "query",
        "freshness",
    ];
    let chosen: Vec<&str> = if wanted.is_empty() {
        all[named_only..].to_vec()
    } else {
        all.iter()
            .copied()
            .filter(|s| wanted.iter().any(|w| w == s))
            .collect()
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&chosen, sizes)) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn settings(redis: &RedisServer, spread: Spread) -> Result<Settings> {
    settings_with(redis, spread, Variant::Plain)
}

/// How a bench changes every board of a workload's config.
#[derive(Debug, Clone, Copy)]
enum Variant<'a> {
    /// As written.
    Plain,
    /// With this line (e.g. `dense_rank = true`).
    Line(&'a str),
    /// Ranking these windows (e.g. `["24h", "7d"]`) instead of its one `window = "7d"`.
    Windows(&'a str),
}

impl Variant<'_> {
    fn describe(self) -> String {
        match self {
            Variant::Plain => "plain".into(),
            Variant::Line(line) => line.into(),
            Variant::Windows(list) => format!("windows = {list}"),
        }
    }
}

/// The settings of `spread`, every board changed as `variant` says.
fn settings_with(redis: &RedisServer, spread: Spread, variant: Variant) -> Result<Settings> {
    let boards = match spread {
        s if s.is_shipped() => SHIPPED_CONFIG,
        _ => CONFIG,
    };
    let boards = match variant {
        Variant::Plain => boards.to_string(),
        Variant::Line(line) => boards.replace("\nslice = ", &format!("\n{line}\nslice = ")),
        Variant::Windows(list) => {
            boards.replace("\nwindow = \"7d\"\n", &format!("\nwindows = {list}\n"))
        }
    };
    let text = format!("[redis]\nurl = \"{}\"\n{boards}", redis.url());
    Settings::from_toml(&text).map_err(|e| e.to_string())
}

fn now_ms() -> i64 {
    rollboard::domain::clock::local_ms()
}

/// The dedicated room of the freshness probes.
const PROBE_ROOM: &str = "probe";
/// The first probe's amount: more than any room collects, so the probe room tops the board.
const PROBE_BASE: i64 = 1_000_000_000_000;

/// Probe `k` of the freshness run: the first one makes the probe room the leader.
fn probe_fields(k: usize) -> Vec<(String, String)> {
    let amount = if k == 0 { PROBE_BASE } else { 1 };
    vec![
        ("room".into(), PROBE_ROOM.into()),
        ("user".into(), "prober".into()),
        ("amount".into(), amount.to_string()),
        ("id".into(), format!("probe{k}")),
        ("ts".into(), now_ms().to_string()),
    ]
}

/// A store on `redis` with `size` connections, calling the scripts as
/// `ROLLBOARD__REDIS__SCRIPTS` says (`functions`, `eval`; unset or else: `auto`), the
/// variable that sets a daemon's `redis.scripts`: the same bench measures either way.
async fn connect(redis: &RedisServer, size: usize) -> Result<Store> {
    let scripts = match std::env::var("ROLLBOARD__REDIS__SCRIPTS").as_deref() {
        Ok("eval") => ScriptCalls::Eval,
        Ok("functions") => ScriptCalls::Functions,
        _ => ScriptCalls::Auto,
    };
    Ok(Store::connect(&redis.url(), "rb", size, Reconnect::Never)
        .await
        .map_err(|e| e.to_string())?
        .with_script_calls(scripts))
}

/// Total Redis-side time spent in `command` so far, in µs (INFO commandstats).
fn command_usec(redis: &RedisServer, command: &str) -> f64 {
    command_calls(redis).get(command).map_or(0.0, |c| c.1)
}

/// Every command's calls and total µs since the last `CONFIG RESETSTAT` (INFO
/// commandstats), by its lower-case name (`xinfo|groups` for a subcommand).
fn command_calls(redis: &RedisServer) -> BTreeMap<String, (u64, f64)> {
    redis
        .cli(&["INFO", "commandstats"])
        .lines()
        .filter_map(|l| l.strip_prefix("cmdstat_")?.split_once(':'))
        .map(|(name, stats)| {
            let field = |key: &str| {
                stats
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                    .and_then(|v| v.trim().parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            (name.to_string(), (field("calls") as u64, field("usec")))
        })
        .collect()
}

/// Total Redis-side time of every command since the last `CONFIG RESETSTAT`, in µs (INFO
/// commandstats), leaving out what the bench itself sends to watch (INFO, CONFIG, XINFO,
/// PING, SLOWLOG). INFO commandstats also counts the commands run inside scripts, whose
/// time is already in the script's FCALL: with `scripts`, the commands rollboard's
/// scripts use are left out (so is the same command sent directly, e.g. the ZADD that
/// registers a scope: a small undercount).
fn workload_usec(redis: &RedisServer, scripts: bool) -> f64 {
    let nested: Vec<String> = if scripts {
        rollboard::store::script_commands()
            .iter()
            .map(|c| format!("{}:", c.to_ascii_lowercase()))
            .collect()
    } else {
        Vec::new()
    };
    redis
        .cli(&["INFO", "commandstats"])
        .lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter(|l| {
            !["info:", "config|", "xinfo|", "ping:", "slowlog|"]
                .iter()
                .any(|p| l.starts_with(p))
                && !nested.iter().any(|n| l.starts_with(n.as_str()))
        })
        .filter_map(|l| l.split(',').find_map(|kv| kv.strip_prefix("usec=")))
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

/// The commands that took the most Redis time since the last `CONFIG RESETSTAT`: name,
/// calls and µs per event, most first.
fn heaviest_commands(redis: &RedisServer, events: usize) -> String {
    let mut rows: Vec<(String, u64, f64)> = command_calls(redis)
        .into_iter()
        .map(|(name, (calls, usec))| (name, calls, usec))
        .collect();
    rows.sort_by(|a, b| b.2.total_cmp(&a.2));
    rows.iter()
        .take(6)
        .map(|(name, calls, usec)| format!("{name} {calls} calls {:.2} µs", usec / events as f64))
        .collect::<Vec<_>>()
        .join(", ")
}

fn reset_stats(redis: &RedisServer) {
    redis.cli(&["CONFIG", "RESETSTAT"]);
}

fn rate(events: usize, elapsed: Duration) -> f64 {
    events as f64 / elapsed.as_secs_f64()
}

/// Rate and Redis cost per event of one pass.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pass {
    /// Events per second.
    pub rate: f64,
    /// Redis time of every command, per event (µs, INFO commandstats).
    pub redis_us: f64,
    /// The server process's user + sys CPU, per event (µs, INFO cpu): also what commandstats
    /// leaves out, reading requests and writing replies.
    pub cpu_us: f64,
    /// This process's user + sys CPU per event (µs): the consumer's (validation, grouping,
    /// building calls, decoding replies) or the naive client's.
    pub own_us: f64,
}

/// Throughput and Redis cost per event of one run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Throughput {
    /// Events per second.
    pub rate: f64,
    /// Redis time of every command, per event (µs, INFO commandstats).
    pub redis_us: f64,
    /// The server's user + sys CPU per event (µs).
    pub cpu_us: f64,
    /// This process's CPU per event (µs), as [`Pass::own_us`].
    pub own_us: f64,
    /// The first pass, from an empty Redis, when the figures are of a second one.
    pub cold: Option<Pass>,
}

impl Throughput {
    /// The figures of `steady`, with `cold` beside them.
    fn of(steady: Pass, cold: Pass) -> Throughput {
        Throughput {
            rate: steady.rate,
            redis_us: steady.redis_us,
            cpu_us: steady.cpu_us,
            own_us: steady.own_us,
            cold: Some(cold),
        }
    }
}

/// The figures of one workload.
#[derive(Debug, Clone, Copy, Default)]
pub struct WorkloadFigures {
    /// The naive client, one command round trip at a time.
    pub naive: Option<Throughput>,
    /// The naive client pipelined [`NAIVE_PIPELINE`] events at a time, on the events of
    /// `e2e`.
    pub pipelined: Option<Throughput>,
    pub script: Option<f64>,
    pub e2e: Option<Throughput>,
}

/// Query latencies: top-10 p50, p99, rank p50, p99.
#[derive(Debug, Clone, Copy, Default)]
pub struct QueryFigures {
    pub idle: [Duration; 4],
    pub busy: [Duration; 4],
    /// Events applied per second while the busy round ran.
    pub applied: f64,
}

/// XADD-to-visible latencies of the probes.
#[derive(Debug, Clone, Copy, Default)]
pub struct FreshnessFigures {
    pub probes: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    /// Events appended per second (0 for the idle baseline).
    pub offered: f64,
}

/// The slow log's threshold while a drain is measured (µs): above what most stream reads
/// and acks take, below what any call near the 2 ms bound takes.
pub const E2E_SLOWLOG_US: u64 = 100;

/// The calls Redis served while one consumer drained the stream.
#[derive(Debug, Clone, Default)]
pub struct CallFigures {
    /// Per kind of call ([`support::SlowEntry::kind`]): calls the slow log caught (at
    /// least [`E2E_SLOWLOG_US`]), those above 2 ms, the longest (µs).
    pub slow: BTreeMap<String, (usize, usize, u64)>,
    /// Per command: calls and total µs (INFO commandstats).
    pub per_call: BTreeMap<String, (u64, f64)>,
}

/// The kind under which [`CallFigures::slow`] holds the transactions (`EXEC`), read from
/// `LATENCY HISTOGRAM` (buckets of powers of 2 µs: above 128 µs, above 2 048 µs, and the
/// longest one's bucket bound).
pub const EXEC_KIND: &str = "EXEC (LATENCY HISTOGRAM, > 128 µs, > 2.048 ms)";

/// The stream commands whose µs per call the drains print.
const STREAM_COMMANDS: [&str; 3] = ["xreadgroup", "xack", "xautoclaim"];

impl CallFigures {
    /// Adds `other`'s calls to these.
    fn merge(&mut self, other: &CallFigures) {
        for (kind, (logged, above, max)) in &other.slow {
            let k = self.slow.entry(kind.clone()).or_default();
            k.0 += logged;
            k.1 += above;
            k.2 = k.2.max(*max);
        }
        for (command, (calls, usec)) in &other.per_call {
            let c = self.per_call.entry(command.clone()).or_default();
            c.0 += calls;
            c.1 += usec;
        }
    }

    /// One line: the stream commands' µs per call, then per kind of call the slow log's
    /// count above 2 ms, of the calls it caught, and the longest.
    pub fn describe(&self) -> String {
        let per_call: Vec<String> = STREAM_COMMANDS
            .iter()
            .filter_map(|c| {
                let (calls, usec) = self.per_call.get(*c)?;
                (*calls > 0).then(|| {
                    format!(
                        "{} {calls} calls, {:.1} µs per call",
                        c.to_ascii_uppercase(),
                        usec / *calls as f64
                    )
                })
            })
            .collect();
        let slow: Vec<String> = self
            .slow
            .iter()
            .map(|(kind, (logged, above, max))| {
                format!(
                    "{kind} {above} > 2 ms of {logged} >= {E2E_SLOWLOG_US} µs, longest {:.2} ms",
                    *max as f64 / 1e3
                )
            })
            .collect();
        format!(
            "stream calls (INFO commandstats): {}; SLOWLOG by kind of call: {}",
            per_call.join(", "),
            if slow.is_empty() {
                "none".to_string()
            } else {
                slow.join("; ")
            }
        )
    }
}

/// Everything [`run`] measured.
#[derive(Debug, Default)]
pub struct Figures {
    pub workloads: Vec<(Spread, WorkloadFigures)>,
    /// The calls of every end-to-end drain, both passes of every workload.
    pub calls: CallFigures,
    pub query: Option<QueryFigures>,
    /// Loaded run, idle baseline.
    pub freshness: Option<(FreshnessFigures, FreshnessFigures)>,
}

/// Runs the `chosen` scenarios, each on a fresh redis-server, and prints a summary.
pub async fn run(chosen: &[&str], sizes: Sizes) -> Result<Figures> {
    let mut figures = Figures::default();
    let spreads = [
        Spread::Shipped,
        Spread::ShippedNow,
        Spread::Skewed,
        Spread::Uniform,
    ];
    for spread in spreads {
        let mut w = WorkloadFigures::default();
        for scenario in chosen {
            let applies = match *scenario {
                "naive" | "pipelined" | "e2e" | "instructions" => true,
                "cost" => spread.is_shipped(),
                "script" => !spread.is_shipped(),
                "ceiling" => spread == Spread::Uniform,
                "query" => spread == Spread::Skewed,
                "dense" | "feed" | "windows" => {
                    spread == Spread::Shipped || spread == Spread::Skewed
                }
                "partitions" => spread == Spread::Skewed,
                "reads" => spread == Spread::Shipped,
                _ => false,
            };
            if !applies {
                continue;
            }
            let redis = RedisServer::start()?;
            println!(
                "\n== {scenario}, {} (redis-server on 127.0.0.1:{})",
                spread.describe(),
                redis.port
            );
            match *scenario {
                "naive" => w.naive = Some(bench_naive(&redis, spread, sizes).await?),
                "pipelined" => {
                    let events = sizes.events;
                    let t = bench_naive_in(&redis, spread, events, NAIVE_PIPELINE).await?;
                    w.pipelined = Some(t);
                }
                "script" => w.script = Some(bench_script(&redis, spread, sizes).await?),
                "e2e" => {
                    let (t, calls) = bench_e2e(&redis, spread, sizes).await?;
                    figures.calls.merge(&calls);
                    w.e2e = Some(t);
                }
                "ceiling" => bench_ceiling(&redis).await?,
                "query" => figures.query = Some(bench_query(&redis, spread, sizes).await?),
                "instructions" => {
                    drop(redis);
                    bench_instructions(spread).await?
                }
                "cost" => {
                    drop(redis);
                    let count = instructions_per_event(spread, Variant::Plain).await?;
                    println!("== cost, instructions per event: {count:.0}");
                }
                "dense" => {
                    drop(redis);
                    bench_option(spread, "dense_rank = true").await?
                }
                "feed" => {
                    drop(redis);
                    bench_option(spread, "changes_top = 10").await?
                }
                "windows" => {
                    drop(redis);
                    bench_windows(spread).await?
                }
                "partitions" => {
                    drop(redis);
                    bench_partitions(spread, sizes).await?
                }
                "reads" => {
                    drop(redis);
                    bench_reads(spread, sizes).await?
                }
                _ => {}
            }
        }
        figures.workloads.push((spread, w));
    }
    if chosen.contains(&"freshness") {
        let shipped = figures
            .workloads
            .iter()
            .find(|(s, _)| *s == Spread::Shipped)
            .and_then(|(_, w)| w.e2e);
        // The freshness run starts from an empty Redis: its maximum is the first pass's.
        let max = match shipped {
            Some(t) => t.cold.map_or(t.rate, |c| c.rate),
            None => {
                let redis = RedisServer::start()?;
                println!(
                    "\n== e2e for the freshness rate, {}",
                    Spread::Shipped.describe()
                );
                let (t, _) = bench_e2e(&redis, Spread::Shipped, sizes).await?;
                t.cold.map_or(t.rate, |c| c.rate)
            }
        };
        // ROLLBOARD_BENCH_FRESHNESS_RATE offers that many events/s instead: two builds
        // compared at one rate.
        let rate = std::env::var("ROLLBOARD_BENCH_FRESHNESS_RATE")
            .ok()
            .and_then(|r| r.parse::<f64>().ok())
            .unwrap_or(max / 2.0);
        let redis = RedisServer::start()?;
        println!(
            "\n== freshness, {} at {rate:.0} events/s, half of {max:.0} unless set (redis-server on 127.0.0.1:{})",
            Spread::Shipped.describe(),
            redis.port
        );
        figures.freshness = Some(bench_freshness(&redis, rate, sizes).await?);
    }
    print_summary(&figures);
    Ok(figures)
}

fn print_summary(figures: &Figures) {
    println!(
        "\n== summary (events/s; Redis µs per event from INFO commandstats, and the server's \
         user + sys CPU per event from INFO cpu; second passes, the first beside them)"
    );
    for (spread, w) in &figures.workloads {
        if w.naive.is_none() && w.pipelined.is_none() && w.script.is_none() && w.e2e.is_none() {
            continue;
        }
        println!("-- {}", spread.describe());
        let line = |label: &str, t: &Throughput| {
            let first = match t.cold {
                Some(c) => format!(
                    "   (first pass {:.0}, {:.2} µs, CPU {:.2} µs, own CPU {:.2} µs)",
                    c.rate, c.redis_us, c.cpu_us, c.own_us
                ),
                None => String::new(),
            };
            println!(
                "{label:<22} {:>12.0}   {:>6.2} µs/event   CPU {:>6.2} µs/event   own CPU \
                 {:>6.2} µs/event{first}",
                t.rate, t.redis_us, t.cpu_us, t.own_us
            );
        };
        if let Some(n) = w.naive {
            line("naive client", &n);
        }
        if let Some(p) = w.pipelined {
            line(&format!("naive pipelined {NAIVE_PIPELINE}"), &p);
        }
        if let Some(s) = w.script {
            println!("apply script direct    {s:>12.0}");
        }
        if let Some(e) = w.e2e {
            line("end to end", &e);
        }
        if let (Some(e), Some(p)) = (w.e2e, w.pipelined) {
            println!(
                "Redis CPU per event, end to end / naive pipelined = {:.2}x{} (commandstats \
                 {:.2}x)",
                e.cpu_us / p.cpu_us,
                match spread {
                    Spread::Shipped => " (target <= 1.5x)",
                    Spread::ShippedNow => " (target <= 0.75x)",
                    _ => "",
                },
                e.redis_us / p.redis_us
            );
        }
        if let (Some(e), Some(n)) = (w.e2e, w.naive) {
            println!(
                "end to end / naive            = {:.1}x (target >= {}x)",
                e.rate / n.rate,
                if *spread == Spread::Uniform { 8 } else { 10 }
            );
        }
        if let (Some(e), Some(s)) = (w.e2e, w.script) {
            println!(
                "end to end / script direct    = {:.2} (within 2x: >= 0.5)",
                e.rate / s
            );
        }
    }
    if let Some((busy, idle)) = figures.freshness {
        for (label, f) in [("idle", idle), ("loaded", busy)] {
            println!(
                "freshness {label:<7} ({} probes, {:.0} events/s): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
                f.probes,
                f.offered,
                ms(f.p50),
                ms(f.p99),
                ms(f.max)
            );
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One event at a time, each command awaited: per board, HINCRBY into the slice Hash and
/// ZINCRBY into the ranking (the fans board's keys per room).
async fn bench_naive(redis: &RedisServer, spread: Spread, sizes: Sizes) -> Result<Throughput> {
    bench_naive_in(redis, spread, sizes.naive_events, 1).await
}

/// Events the pipelined naive client sends per round trip (the consumer's batch).
pub const NAIVE_PIPELINE: usize = 500;

/// The naive client on `n` events a pass, its commands for `per_trip` events sent in one
/// pipeline per round trip (1: each command awaited in turn, the blog client).
async fn bench_naive_in(
    redis: &RedisServer,
    spread: Spread,
    n: usize,
    per_trip: usize,
) -> Result<Throughput> {
    let store = connect(redis, 1).await?;
    let client = store.client();
    let now = now_ms();
    let how = match per_trip {
        1 => "one event at a time".to_string(),
        k => format!("pipelined {k} events at a time"),
    };
    // As the end-to-end run: a first pass from an empty Redis, then new events on its keys.
    let mut passes = Vec::new();
    for (pass, events) in [("first pass", 0..n), ("second pass", n..2 * n)] {
        reset_stats(redis);
        let cpu = server_cpu_seconds(redis);
        let own = own_cpu();
        let started = Instant::now();
        let all: Vec<usize> = events.collect();
        for trip in all.chunks(per_trip) {
            let pipeline = (per_trip > 1).then(|| client.pipeline());
            for &i in trip {
                let e = apply_event(spread, i, now);
                let mut writes = vec![(
                    format!("naive:rooms:slice:{}", e.ts / 3_600_000),
                    "naive:rooms:result".to_string(),
                    e.member.clone(),
                )];
                if spread.is_shipped() {
                    writes.push((
                        format!("naive:fans:{}:slice:{}", e.member, e.ts / 3_600_000),
                        format!("naive:fans:{}:result", e.member),
                        spread.user(i),
                    ));
                }
                for (slice, result, member) in writes {
                    if let Some(pipeline) = &pipeline {
                        let _: () = pipeline
                            .hincrby(&slice, &member, e.amount)
                            .await
                            .map_err(|e| e.to_string())?;
                        let _: () = pipeline
                            .zincrby(&result, e.amount as f64, &member)
                            .await
                            .map_err(|e| e.to_string())?;
                    } else {
                        let _: i64 = client
                            .hincrby(&slice, &member, e.amount)
                            .await
                            .map_err(|e| e.to_string())?;
                        let _: f64 = client
                            .zincrby(&result, e.amount as f64, &member)
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                }
            }
            if let Some(pipeline) = pipeline {
                let _: Vec<Value> = pipeline.all().await.map_err(|e| e.to_string())?;
            }
        }
        let r = rate(n, started.elapsed());
        let cpu_us = (server_cpu_seconds(redis) - cpu) * 1e6 / n as f64;
        let own_us = (own_cpu() - own).as_secs_f64() * 1e6 / n as f64;
        let redis_us = workload_usec(redis, false) / n as f64;
        println!(
            "naive HINCRBY+ZINCRBY per board, {how}, {pass}: {n} events, {r:.0} events/s, \
             Redis {redis_us:.2} µs per event, CPU {cpu_us:.2} µs per event, client CPU \
             {own_us:.2} µs per event"
        );
        passes.push(Pass {
            rate: r,
            redis_us,
            cpu_us,
            own_us,
        });
    }
    Ok(Throughput::of(passes[1], passes[0]))
}

async fn bench_script(redis: &RedisServer, spread: Spread, sizes: Sizes) -> Result<f64> {
    let store = connect(redis, 1).await?;
    let board = settings(redis, spread)?.boards.remove(0);
    let now = now_ms();
    let n = sizes.events;
    let events: Vec<ApplyEvent> = (0..n).map(|i| apply_event(spread, i, now)).collect();
    let started = Instant::now();
    for batch in events.chunks(BATCH) {
        store
            .apply(&board, None, batch, now)
            .await
            .map_err(|e| e.to_string())?;
    }
    let r = rate(n, started.elapsed());
    println!("apply script, batches of {BATCH}, one connection: {n} events, {r:.0} events/s");
    println!(
        "redis time inside FCALL: {:.2} µs per event",
        command_usec(redis, "fcall") / n as f64
    );
    Ok(r)
}

fn start_consumer(
    store: Arc<Store>,
    reader: Client,
    settings: &Settings,
    cancel: &CancellationToken,
) -> Arc<AtomicBool> {
    let metrics = Arc::new(Metrics::new(&settings.boards));
    let ingest = Ingest::new(
        store,
        reader,
        settings.ingest.clone(),
        Arc::new(settings.boards.clone()),
        metrics,
    );
    let ready = ingest.group_ready();
    tokio::spawn(ingest.run(cancel.clone()));
    ready
}

/// Two passes of `sizes.events` events each through one consumer: the first from an empty
/// Redis (every instance, slice and digest table created on the way), the second, of new
/// events of the same workload, on what the first left: the steady state of a board that
/// has been running for a while, where nearly every event meets instances that exist.
/// Returns the steady pass, with the first as `cold`, and the calls of both.
async fn bench_e2e(
    redis: &RedisServer,
    spread: Spread,
    sizes: Sizes,
) -> Result<(Throughput, CallFigures)> {
    let settings = settings(redis, spread)?;
    let store = Arc::new(connect(redis, 4).await?);
    two_passes(redis, &store, &settings, spread, sizes.events, now_ms()).await
}

/// The two passes of [`bench_e2e`], `n` events each, drained by one consumer: the second
/// as the figures with the first as `cold`, and the calls of both.
async fn two_passes(
    redis: &RedisServer,
    store: &Arc<Store>,
    settings: &Settings,
    spread: Spread,
    n: usize,
    now: i64,
) -> Result<(Throughput, CallFigures)> {
    println!("-- first pass, from an empty Redis");
    let (cold, mut calls) =
        drain_pass(redis, store, settings, spread, 0..n, now, Backlog::New).await?;
    println!("-- second pass, new events of the same workload on the instances the first left");
    let (steady, more) =
        drain_pass(redis, store, settings, spread, n..2 * n, now, Backlog::New).await?;
    calls.merge(&more);
    Ok((Throughput::of(steady, cold), calls))
}

/// What a board option (`dense_rank = true`, `changes_top = 10`) costs, in instructions
/// Redis runs per event (as `instructions`): the same events drained with every board
/// plain, then with the option, each on a redis-server of its own under callgrind; both
/// figures and their ratio.
async fn bench_option(spread: Spread, option: &str) -> Result<()> {
    let plain = instructions_per_event(spread, Variant::Plain).await?;
    let with = instructions_per_event(spread, Variant::Line(option)).await?;
    println!(
        "== {option}, instructions per event: plain {plain:.0}, with it {with:.0}: {:.3}x",
        with / plain
    );
    Ok(())
}

/// What ranking a 2nd and a 3rd window costs, in instructions Redis runs per event (as
/// [`bench_option`]): the same events drained with every board ranking its one window
/// (7d), two (24h and 7d) and three (24h, 7d and 30d), each on a redis-server of its own
/// under callgrind. Every event falls in the last day, so it counts in every window: the
/// dearest case. The three figures and each one's ratio to one window's.
async fn bench_windows(spread: Spread) -> Result<()> {
    let variants = [
        Variant::Plain,
        Variant::Windows(r#"["24h", "7d"]"#),
        Variant::Windows(r#"["24h", "7d", "30d"]"#),
    ];
    let mut counts = Vec::with_capacity(variants.len());
    for variant in variants {
        counts.push(instructions_per_event(spread, variant).await?);
    }
    println!(
        "== windows, instructions per event: one window (7d) {:.0}; two (24h, 7d) {:.0}: \
         {:.3}x; three (24h, 7d, 30d) {:.0}: {:.3}x",
        counts[0],
        counts[1],
        counts[1] / counts[0],
        counts[2],
        counts[2] / counts[0]
    );
    Ok(())
}

/// Instructions Redis runs per event (as `instructions`, rollboard's consumer alone) to
/// drain the two passes of `spread`'s events with every board changed as `variant` says,
/// on a redis-server of its own under callgrind.
async fn instructions_per_event(spread: Spread, variant: Variant<'_>) -> Result<f64> {
    let sizes = QUICK;
    let redis = RedisServer::start_counted()?;
    println!(
        "-- {} (redis-server under callgrind on 127.0.0.1:{})",
        variant.describe(),
        redis.port
    );
    let settings = counted(settings_with(&redis, spread, variant)?);
    let store = Arc::new(connect(&redis, 4).await?);
    let (now, n) = (now_ms(), sizes.events);
    redis.instructions(&[])?;
    two_passes(&redis, &store, &settings, spread, n, now).await?;
    let (total, _) = redis.instructions(&ROLLBOARD_FUNCTIONS)?;
    Ok(total as f64 / n as f64)
}

/// `settings` for a drain under callgrind, which runs Redis some 50 times slower: no
/// entry of the drain is idle long enough to be claimed again (a batch redelivered that
/// way would be applied twice, as duplicates, and counted), so that the count is the same
/// however busy the machine is.
fn counted(mut settings: Settings) -> Settings {
    settings.ingest.claim_idle = Duration::from_secs(24 * 3600);
    settings
}

/// The C functions of redis-server that run rollboard's consumer's commands (each with
/// all it calls, scripts' commands included).
const ROLLBOARD_FUNCTIONS: [&str; 3] = ["fcallCommand", "xreadCommand", "xackCommand"];

/// Instructions Redis runs per event, counted by callgrind on a server of its own: the
/// naive client's two passes, then rollboard's end-to-end second pass (as `e2e`: the first
/// pass run but not counted, nor the filling of the stream). Everything the server runs
/// is counted (reading requests, writing replies, the event loop), less the bench's own
/// few polls. Unlike time, the count does not move with the machine's load, so two
/// versions compare on a busy host. Smoke-run sizes: valgrind runs the server some 50
/// times slower.
async fn bench_instructions(spread: Spread) -> Result<()> {
    let sizes = QUICK;
    let redis = RedisServer::start_counted()?;
    println!(
        "\n== instructions, {} (redis-server under callgrind on 127.0.0.1:{})",
        spread.describe(),
        redis.port
    );
    redis.instructions(&[])?;
    bench_naive(&redis, spread, sizes).await?;
    let (naive, _) = redis.instructions(&[])?;
    let naive = naive as f64 / (2 * sizes.naive_events) as f64;
    // The pipelined client's first pass from an empty Redis too (FLUSHALL not counted).
    redis.cli(&["FLUSHALL"]);
    redis.instructions(&[])?;
    bench_naive_in(&redis, spread, sizes.naive_events, NAIVE_PIPELINE).await?;
    let (pipelined, _) = redis.instructions(&[])?;
    let pipelined = pipelined as f64 / (2 * sizes.naive_events) as f64;
    let settings = counted(settings(&redis, spread)?);
    let store = Arc::new(connect(&redis, 4).await?);
    let now = now_ms();
    let n = sizes.events;
    two_passes(&redis, &store, &settings, spread, n, now).await?;
    let (total, each) = redis.instructions(&ROLLBOARD_FUNCTIONS)?;
    let per_event = |i: u64| i as f64 / n as f64;
    println!(
        "== instructions per event: naive {naive:.0}; rollboard {:.0} (inside FCALL {:.0}, \
         XREADGROUP {:.0}, XACK {:.0}): {:.2}x the naive client's",
        per_event(total),
        per_event(each[0]),
        per_event(each[1]),
        per_event(each[2]),
        per_event(total) / naive
    );
    println!(
        "== instructions per event: naive pipelined {NAIVE_PIPELINE} events at a time \
         {pipelined:.0}; rollboard {:.2}x it",
        per_event(total) / pipelined
    );
    Ok(())
}

/// Fills the stream with events `events`, drains it with one consumer and measures that,
/// under the slow log ([`E2E_SLOWLOG_US`]). On a server under callgrind its instruction
/// counts are zeroed once the stream is filled, the slow log stays off, and the end of the
/// drain is polled for less often: each poll's instructions would be counted too.
async fn drain_pass(
    redis: &RedisServer,
    store: &Arc<Store>,
    settings: &Settings,
    spread: Spread,
    events: Range<usize>,
    now: i64,
    backlog: Backlog,
) -> Result<(Pass, CallFigures)> {
    let n = events.len();
    let stream = &settings.ingest.stream;
    fill_stream(
        store.client(),
        stream,
        spread,
        events.start,
        events.end,
        now,
    )
    .await?;
    deliver(store.client(), &settings.ingest, backlog).await?;
    let reader = Store::dedicated(&redis.url(), Reconnect::Never)
        .await
        .map_err(|e| e.to_string())?;
    let cancel = CancellationToken::new();
    reset_stats(redis);
    let poll = if redis.counted {
        redis.instructions(&[])?;
        Duration::from_millis(250)
    } else {
        slowlog_start(store.client(), E2E_SLOWLOG_US).await?;
        // Each poll costs Redis CPU too: every 20 ms keeps that under 1% of the drain's.
        Duration::from_millis(20)
    };
    let cpu = server_cpu_seconds(redis);
    let own = own_cpu();
    let started = Instant::now();
    start_consumer(store.clone(), reader, settings, &cancel);
    loop {
        let info = group_info(store.client(), stream, &settings.ingest.group).await;
        if matches!(info, Ok(Some((0, Some(0))))) {
            break;
        }
        if started.elapsed() > Duration::from_secs(1800) {
            return Err("the consumer did not drain the stream in 30 minutes".into());
        }
        tokio::time::sleep(poll).await;
    }
    let elapsed = started.elapsed();
    let cpu_us = (server_cpu_seconds(redis) - cpu) * 1e6 / n as f64;
    let own_us = (own_cpu() - own).as_secs_f64() * 1e6 / n as f64;
    let redis_us = workload_usec(redis, true) / n as f64;
    let mut calls = CallFigures {
        per_call: command_calls(redis),
        ..CallFigures::default()
    };
    if !redis.counted {
        calls.slow = slow_by_kind(&slowlog_take(store.client()).await?);
        // The transactions of the instances judged in the worker, whole: the slow log
        // takes their commands one by one.
        if let Some(exec) = latency_of(store.client(), "exec").await {
            calls.slow.insert(EXEC_KIND.to_string(), exec);
        }
    }
    println!(
        "heaviest commands per event: {}",
        heaviest_commands(redis, n)
    );
    cancel.cancel();
    let r = rate(n, elapsed);
    println!(
        "end to end, one consumer, batch {}: {n} events in {:.2}s, {r:.0} events/s",
        settings.ingest.batch_size,
        elapsed.as_secs_f64()
    );
    let per_event = |command: &str| command_usec(redis, command) / n as f64;
    println!(
        "redis time per event: every command (script time once) {redis_us:.2} µs (FCALL {:.2}, XREADGROUP {:.2}, \
         XACK {:.2}); server CPU {cpu_us:.2} µs; consumer CPU {own_us:.2} µs; wall {:.2} µs",
        per_event("fcall"),
        per_event("xreadgroup"),
        per_event("xack"),
        elapsed.as_secs_f64() * 1e6 / n as f64
    );
    println!("{}", calls.describe());
    let first = &settings.boards[0].name;
    let count: i64 = store
        .client()
        .zcard(format!("rb:{{{first}}}:result"))
        .await
        .map_err(|e| e.to_string())?;
    println!("check: {count} ranked rooms on {first}");
    let pass = Pass {
        rate: r,
        redis_us,
        cpu_us,
        own_us,
    };
    Ok((pass, calls))
}

/// Where the entries of a drain are when its consumer starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backlog {
    /// Never delivered: read with `XREADGROUP >`.
    New,
    /// Delivered to the consumer's own name and not acked (as after a crash): re-read from
    /// its pending list with `XREADGROUP <id>`.
    Own,
    /// Delivered to a consumer that is gone: claimed with `XAUTOCLAIM` once idle for
    /// `claim_idle`.
    Gone,
}

/// Consumer name of the [`Backlog::Gone`] entries.
const GONE: &str = "gone";

/// Delivers every entry of the stream to the consumer `backlog` names, unless it is
/// [`Backlog::New`]; for [`Backlog::Gone`], waits until they are idle for `claim_idle`.
async fn deliver(client: &Client, ingest: &IngestSettings, backlog: Backlog) -> Result<()> {
    let consumer = match backlog {
        Backlog::New => return Ok(()),
        Backlog::Own => ingest.consumer.as_str(),
        Backlog::Gone => GONE,
    };
    rollboard::ingest::stream::ensure_group(client, &ingest.stream, &ingest.group)
        .await
        .map_err(|e| e.to_string())?;
    loop {
        let v: Value = client
            .xreadgroup(
                ingest.group.as_str(),
                consumer,
                Some(10_000),
                None,
                false,
                ingest.stream.as_str(),
                ">",
            )
            .await
            .map_err(|e| e.to_string())?;
        if v.is_null() {
            break;
        }
    }
    if backlog == Backlog::Gone {
        tokio::time::sleep(ingest.claim_idle + Duration::from_millis(50)).await;
    }
    Ok(())
}

/// `reads`: the stream calls of the shipped shape's drain, with each batch read in one call
/// (`XREADGROUP COUNT 500`, `XAUTOCLAIM COUNT 500`: the consumer before it read in pieces)
/// and in pieces of the default `READ_PIECE` / `CLAIM_PIECE`, each on a redis-server of
/// its own and for each kind of backlog in turn ([`Backlog`]: new entries, own pending
/// ones, a gone consumer's); per call µs (INFO commandstats), the slow log's longest and
/// count above 2 ms, and the drain's rate and Redis CPU per event, with their ratios.
async fn bench_reads(spread: Spread, sizes: Sizes) -> Result<()> {
    use rollboard::config::ingest::{CLAIM_PIECE, READ_PIECE};
    let n = sizes.events;
    let layouts = [
        ("one call per batch", BATCH, BATCH),
        ("pieces", READ_PIECE, CLAIM_PIECE),
    ];
    let backlogs = [Backlog::New, Backlog::Own, Backlog::Gone];
    let mut measured = Vec::new();
    for (label, read_piece, claim_piece) in layouts {
        let redis = RedisServer::start()?;
        let mut settings = settings(&redis, spread)?;
        settings.ingest.read_piece = read_piece;
        settings.ingest.claim_piece = claim_piece;
        settings.ingest.block = Duration::from_millis(100);
        let store = Arc::new(connect(&redis, 4).await?);
        let now = now_ms();
        for (k, backlog) in backlogs.into_iter().enumerate() {
            println!(
                "\n== reads, {label} (XREADGROUP COUNT {read_piece}, XAUTOCLAIM COUNT \
                 {claim_piece}), backlog {backlog:?}, {} (redis-server on 127.0.0.1:{})",
                spread.describe(),
                redis.port
            );
            let mut settings = settings.clone();
            if backlog == Backlog::Gone {
                settings.ingest.claim_idle = Duration::from_millis(200);
            }
            let events = k * n..(k + 1) * n;
            let (pass, calls) =
                drain_pass(&redis, &store, &settings, spread, events, now, backlog).await?;
            measured.push((label, backlog, pass, calls));
        }
    }
    println!(
        "\n== reads: the stream calls of each backlog, one call per batch of {BATCH} vs pieces"
    );
    let call = |calls: &CallFigures, command: &str, kind: &str| {
        let (count, usec) = calls.per_call.get(command).copied().unwrap_or_default();
        let (logged, above, max) = calls.slow.get(kind).copied().unwrap_or_default();
        format!(
            "{kind} {count} calls, {:.0} µs per call, longest {} ({logged} >= {E2E_SLOWLOG_US} µs), \
             {above} > 2 ms",
            usec / count.max(1) as f64,
            if logged > 0 {
                format!("{:.2} ms", max as f64 / 1e3)
            } else {
                format!("< {E2E_SLOWLOG_US} µs")
            }
        )
    };
    for backlog in backlogs {
        let of = |label: &str| {
            measured
                .iter()
                .find(|m| m.0 == label && m.1 == backlog)
                .map(|m| (m.2, &m.3))
        };
        let (Some((one, one_calls)), Some((pieces, piece_calls))) =
            (of(layouts[0].0), of(layouts[1].0))
        else {
            continue;
        };
        let (command, kind) = match backlog {
            Backlog::Gone => ("xautoclaim", "XAUTOCLAIM"),
            _ => ("xreadgroup", "XREADGROUP"),
        };
        println!("-- backlog {backlog:?}");
        for (label, pass, calls) in [
            (layouts[0].0, one, one_calls),
            (layouts[1].0, pieces, piece_calls),
        ] {
            println!(
                "{label:<20} {}; {:.0} events/s, Redis CPU {:.2} µs per event",
                call(calls, command, kind),
                pass.rate,
                pass.cpu_us
            );
        }
        println!(
            "pieces / one call per batch: events/s {:.2}x, Redis CPU per event {:.2}x",
            pieces.rate / one.rate,
            pieces.cpu_us / one.cpu_us
        );
    }
    Ok(())
}

/// The server process's user + sys CPU so far, in seconds (INFO cpu).
/// This process's CPU time so far (the consumer's, or the naive client's, and the bench's
/// polls beside it).
fn own_cpu() -> Duration {
    cpu(std::process::id())
}

fn server_cpu_seconds(redis: &RedisServer) -> f64 {
    redis
        .cli(&["INFO", "cpu"])
        .lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_sys:")
                .or_else(|| l.strip_prefix("used_cpu_user:"))
        })
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

/// Drains `EVENTS` events spread by the partition rule over `partitions` streams with
/// `daemons` sets of consumers (one per partition each, as `rollboard run` starts them).
async fn bench_partitions(spread: Spread, sizes: Sizes) -> Result<()> {
    let events = sizes.events;
    let mut rows = Vec::new();
    for (partitions, daemons) in [(1, 1), (1, 2), (3, 1), (3, 2)] {
        let redis = RedisServer::start()?;
        let text = format!(
            "[redis]\nurl = \"{}\"\n{}",
            redis.url(),
            CONFIG.replacen(
                "[ingest]\n",
                &format!("[ingest]\npartitions = {partitions}\n"),
                1
            )
        );
        let settings = Settings::from_toml(&text).map_err(|e| e.to_string())?;
        let keys = rollboard::ingest::stream::keys(&settings.ingest);
        let fill = connect(&redis, 4).await?;
        let now = now_ms();
        let indexes: Vec<usize> = (0..events).collect();
        for chunk in indexes.chunks(1000) {
            futures_util::future::try_join_all(chunk.iter().map(|i| {
                let f = fields(spread, *i, now);
                let p = rollboard::domain::partition::partition_of(f[2].1.as_bytes(), partitions);
                fill.client()
                    .xadd::<String, _, _, _, _>(keys[p].as_str(), false, None, "*", f)
            }))
            .await
            .map_err(|e| e.to_string())?;
        }
        redis.cli(&["CONFIG", "RESETSTAT"]);
        let cpu_before = server_cpu_seconds(&redis);
        let cancel = CancellationToken::new();
        let started = Instant::now();
        for d in 0..daemons {
            let mut settings = settings.clone();
            settings.ingest.consumer = format!("d{d}");
            let store = Arc::new(connect(&redis, 4).await?);
            for key in &keys {
                let reader = Store::dedicated(&redis.url(), Reconnect::Never)
                    .await
                    .map_err(|e| e.to_string())?;
                let ingest = Ingest::new(
                    store.clone(),
                    reader,
                    settings.ingest.clone(),
                    Arc::new(settings.boards.clone()),
                    Arc::new(Metrics::new(&settings.boards)),
                )
                .reading(key.clone(), false);
                tokio::spawn(ingest.run(cancel.clone()));
            }
        }
        loop {
            let mut done = true;
            for key in &keys {
                let info = group_info(fill.client(), key, &settings.ingest.group).await;
                done &= matches!(info, Ok(Some((0, Some(0)))));
            }
            if done {
                break;
            }
            if started.elapsed() > Duration::from_secs(600) {
                return Err("the consumers did not drain the streams in 10 minutes".into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let elapsed = started.elapsed();
        let cpu = (server_cpu_seconds(&redis) - cpu_before) * 1e6 / events as f64;
        let per_event = |command: &str| command_usec(&redis, command) / events as f64;
        // The consumer's own commands (the commands the scripts call are inside FCALL).
        let usec = per_event("fcall") + per_event("xreadgroup") + per_event("xack");
        cancel.cancel();
        let r = rate(events, elapsed);
        println!(
            "{partitions} partition(s), {daemons} consumer set(s): {events} events in {:.2}s, {r:.0} events/s; \
             redis per event: {usec:.2} µs (FCALL {:.2}, XREADGROUP {:.2}, XACK {:.2}), server cpu {cpu:.2} µs",
            elapsed.as_secs_f64(),
            per_event("fcall"),
            per_event("xreadgroup"),
            per_event("xack"),
        );
        rows.push((partitions, daemons, r, usec, cpu));
        // Let the consumers see the cancellation before the server goes.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    println!("\npartitions daemons   events/s  redis µs/event (commandstats)  redis cpu µs/event");
    for (p, d, r, usec, cpu) in rows {
        println!("{p:>10} {d:>7} {r:>10.0} {usec:>30.2} {cpu:>19.2}");
    }
    Ok(())
}

async fn bench_ceiling(redis: &RedisServer) -> Result<()> {
    let board: Board = settings(redis, Spread::Uniform)?.boards.remove(0);
    let store = connect(redis, 1).await?;
    store.load_library().await.map_err(|e| e.to_string())?;
    let function = rollboard::store::lua::library().function("fold.lua");
    let now = now_ms();
    let k = store.instance(&board.widest(), None);
    // One chunk of the size the store sends; ids get independent random numbers per
    // request, so every call applies new events (the members are one fixed random draw).
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let events: Vec<ApplyEvent> = (0..APPLY_CHUNK)
        .map(|i| {
            rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            ApplyEvent {
                id: format!("e__rand_int____rand_int__{i}"),
                ts: now,
                member: format!("room{}", (rng >> 33) as usize % MEMBERS),
                amount: 7,
            }
        })
        .collect();
    let (keys, values) = apply_call(
        &board,
        &k,
        &board.widest().fingerprint(),
        &events,
        now,
        false,
    );
    let mut args: Vec<String> = vec!["FCALL".into(), function, keys.len().to_string()];
    args.extend(keys);
    args.extend(values.iter().map(|v| v.as_string().unwrap_or_default()));
    let requests = FULL.events / APPLY_CHUNK;
    for clients in [1, 4] {
        let out = std::process::Command::new("redis-benchmark")
            .args([
                "-p",
                &redis.port.to_string(),
                "-n",
                &requests.to_string(),
                "-c",
                &clients.to_string(),
            ])
            .args(["-r", &MEMBERS.to_string(), "-q"])
            .args(&args)
            .output()
            .map_err(|e| format!("redis-benchmark: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let rps = text
            .split_whitespace()
            .zip(text.split_whitespace().skip(1))
            .find(|(_, unit)| unit.starts_with("requests"))
            .and_then(|(v, _)| v.parse::<f64>().ok())
            .ok_or_else(|| format!("unexpected redis-benchmark output: {text}"))?;
        println!(
            "redis-benchmark FCALL apply ({APPLY_CHUNK} events per call), {clients} client(s): {rps:.0} calls/s = {:.0} events/s",
            rps * APPLY_CHUNK as f64
        );
    }
    Ok(())
}

/// Runs `work` to completion on a thread and runtime of its own.
fn apart<T: Send + 'static>(
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<T> {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map(|runtime| runtime.block_on(work))
            .map_err(|e| e.to_string())
    })
    .join()
    .map_err(|_| "the query thread panicked".to_string())?
}

async fn query_latencies(
    base: &str,
    http: &reqwest::Client,
    queries: usize,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let (mut top, mut rank) = (Vec::with_capacity(queries), Vec::with_capacity(queries));
    for i in 0..queries {
        let t = Instant::now();
        let r = http
            .get(format!("{base}/v1/boards/rooms/top?limit=10"))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        r.bytes().await.map_err(|e| e.to_string())?;
        top.push(t.elapsed());
        let t = Instant::now();
        let member = format!("room{}", Spread::Uniform.room(i) % SKEWED_ROOMS);
        let r = http
            .get(format!("{base}/v1/boards/rooms/members/{member}"))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        r.bytes().await.map_err(|e| e.to_string())?;
        rank.push(t.elapsed());
    }
    Ok((top, rank))
}

fn show(label: &str, top: &mut [Duration], rank: &mut [Duration]) -> [Duration; 4] {
    let figures = [
        percentile(top, 50.0),
        percentile(top, 99.0),
        percentile(rank, 50.0),
        percentile(rank, 99.0),
    ];
    println!(
        "{label:<28} top-10 p50 {:>7.3} ms p99 {:>7.3} ms | rank p50 {:>7.3} ms p99 {:>7.3} ms",
        ms(figures[0]),
        ms(figures[1]),
        ms(figures[2]),
        ms(figures[3])
    );
    figures
}

/// Serves the HTTP API as the daemon does (its own thread, runtime and connections) on a
/// free loopback port; its base URL.
async fn serve(settings: Arc<Settings>) -> Result<String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let base = format!(
        "http://{}",
        listener.local_addr().map_err(|e| e.to_string())?
    );
    let metrics = Arc::new(Metrics::new(&settings.boards));
    let ready = vec![Arc::new(AtomicBool::new(true))];
    // The server lives as long as the bench.
    rollboard::edges::http::spawn(
        listener,
        settings,
        metrics,
        std::sync::Arc::new(rollboard::domain::clock::Clock::new(2_000)),
        ready,
        rollboard::edges::http::ApiStore::Own(Default::default()),
        CancellationToken::new(),
    )
    .await
    .map_err(|e| format!("{e:#}"))?;
    Ok(base)
}

async fn bench_query(redis: &RedisServer, spread: Spread, sizes: Sizes) -> Result<QueryFigures> {
    let settings = Arc::new(settings(redis, spread)?);
    let store = Arc::new(connect(redis, 4).await?);
    let now = now_ms();
    // A board of MEMBERS rooms to query.
    let board = settings.boards[0].clone();
    let events: Vec<ApplyEvent> = (0..MEMBERS * 2)
        .map(|i| apply_event(spread, i, now))
        .collect();
    for batch in events.chunks(BATCH) {
        store
            .apply(&board, None, batch, now)
            .await
            .map_err(|e| e.to_string())?;
    }
    let base = serve(settings.clone()).await?;
    let http = reqwest::Client::new();
    query_latencies(&base, &http, sizes.queries).await?; // warm-up
    let (mut top, mut rank) = query_latencies(&base, &http, sizes.queries).await?;
    let idle = show("idle", &mut top, &mut rank);

    // Ingest at full speed: one consumer draining a backlog appended beforehand, so that
    // what the queries meet is rollboard's own work, not a producer's flood of XADDs.
    let backlog = sizes.queries * 200;
    let stream = settings.ingest.stream.clone();
    fill_stream(
        store.client(),
        &stream,
        spread,
        MEMBERS * 2,
        MEMBERS * 2 + backlog,
        now_ms(),
    )
    .await?;
    let cancel = CancellationToken::new();
    let reader = Store::dedicated(&redis.url(), Reconnect::Never)
        .await
        .map_err(|e| e.to_string())?;
    start_consumer(store.clone(), reader, &settings, &cancel);
    let unapplied = || async {
        match group_info(store.client(), &stream, &settings.ingest.group).await {
            Ok(Some((pending, Some(lag)))) => Ok((pending + lag) as usize),
            other => Err(format!("XINFO GROUPS: {other:?}")),
        }
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = unapplied().await?;
    let started = Instant::now();
    // The queries come from a thread of their own, as from another process: on the bench's
    // runtime they would wait for the consumer's work.
    let (mut top, mut rank) = apart({
        let (base, queries) = (base.clone(), sizes.queries);
        async move { query_latencies(&base, &reqwest::Client::new(), queries).await }
    })??;
    let elapsed = started.elapsed();
    let after = unapplied().await?;
    let busy = show("while ingesting", &mut top, &mut rank);
    cancel.cancel();
    if after == 0 {
        return Err(format!(
            "the backlog of {backlog} events ran out before the queries ended: raise it"
        ));
    }
    let applied = (before - after) as f64 / elapsed.as_secs_f64();
    println!(
        "ingest during the queries: {} events applied (~{applied:.0}/s, the consumer's full \
         speed: {after} still waiting at the end)",
        before - after
    );
    println!(
        "ratio under ingest / idle: top-10 p50 {:.2}x p99 {:.2}x, rank p50 {:.2}x p99 {:.2}x",
        busy[0].as_secs_f64() / idle[0].as_secs_f64(),
        busy[1].as_secs_f64() / idle[1].as_secs_f64(),
        busy[2].as_secs_f64() / idle[2].as_secs_f64(),
        busy[3].as_secs_f64() / idle[3].as_secs_f64()
    );
    Ok(QueryFigures {
        idle,
        busy,
        applied,
    })
}

/// Probes sent (with their XADD start) and seen (with the time `top` first showed them).
#[derive(Default)]
struct Probes {
    sent: Vec<Instant>,
    seen: Vec<Instant>,
}

/// How often a probe is sent.
const PROBE_EVERY: Duration = Duration::from_millis(20);

/// Freshness of the shipped shape at `rate` events/s, then with probes only; returns both.
async fn bench_freshness(
    redis: &RedisServer,
    rate: f64,
    sizes: Sizes,
) -> Result<(FreshnessFigures, FreshnessFigures)> {
    let spread = Spread::Shipped;
    let mut settings = settings(redis, spread)?;
    settings.http.max_staleness = Duration::ZERO;
    let settings = Arc::new(settings);
    let store = Arc::new(connect(redis, 4).await?);
    let reader = Store::dedicated(&redis.url(), Reconnect::Never)
        .await
        .map_err(|e| e.to_string())?;
    let cancel = CancellationToken::new();
    start_consumer(store.clone(), reader, &settings, &cancel);
    let base = serve(settings.clone()).await?;
    let probes = Arc::new(Mutex::new(Probes::default()));
    let watcher = {
        let (probes, cancel) = (probes.clone(), cancel.clone());
        let url = format!("{base}/v1/boards/{}/top?limit=1", settings.boards[0].name);
        tokio::spawn(watch(url, probes, cancel))
    };
    // The first probe puts the probe room on top; the measured ones start once it shows.
    let stream = settings.ingest.stream.clone();
    let client = store.client().clone();
    send_probe(&client, &stream, &probes).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while lock(&probes).seen.is_empty() {
        if Instant::now() > deadline {
            return Err("the first probe did not show in `top` within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let idle = paced(&client, &stream, &probes, 0.0, sizes.freshness / 4).await?;
    let busy = paced(&client, &stream, &probes, rate, sizes.freshness).await?;
    cancel.cancel();
    let _ = watcher.await;
    Ok((busy, idle))
}

fn lock(probes: &Mutex<Probes>) -> std::sync::MutexGuard<'_, Probes> {
    probes.lock().unwrap_or_else(|e| e.into_inner())
}

async fn send_probe(client: &Client, stream: &str, probes: &Mutex<Probes>) -> Result<()> {
    let k = {
        let mut p = lock(probes);
        p.sent.push(Instant::now());
        p.sent.len() - 1
    };
    let _: String = client
        .xadd(stream, false, None, "*", probe_fields(k))
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Polls `top` (limit 1) over HTTP; the probe room's total says how many probes it holds.
async fn watch(url: String, probes: Arc<Mutex<Probes>>, cancel: CancellationToken) {
    let http = reqwest::Client::new();
    while !cancel.is_cancelled() {
        let page: Option<serde_json::Value> = match http.get(&url).send().await {
            Ok(r) => r.json().await.ok(),
            Err(_) => None,
        };
        let now = Instant::now();
        let entry = page
            .as_ref()
            .and_then(|p| p.get("entries")?.get(0).cloned());
        let total = entry
            .as_ref()
            .filter(|e| e.get("member").and_then(|m| m.as_str()) == Some(PROBE_ROOM))
            .and_then(|e| e.get("total"))
            .and_then(|t| t.to_string().parse::<i64>().ok());
        if let Some(total) = total {
            let held = (total - PROBE_BASE + 1).max(0) as usize;
            let mut p = lock(&probes);
            while p.seen.len() < held.min(p.sent.len()) {
                p.seen.push(now);
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// For `length`, XADDs `rate` events/s on a 1 ms schedule plus a probe every
/// [`PROBE_EVERY`]; waits for the last probe to show and returns the probes' latencies.
async fn paced(
    client: &Client,
    stream: &str,
    probes: &Arc<Mutex<Probes>>,
    rate: f64,
    length: Duration,
) -> Result<FreshnessFigures> {
    let first = lock(probes).sent.len();
    let now = now_ms();
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    let (mut sent, mut next_probe) = (0usize, Duration::ZERO);
    // Event numbers far from those of the other runs, so that ids never repeat.
    let offset = 100_000_000;
    while started.elapsed() < length {
        tick.tick().await;
        let due = (started.elapsed().as_secs_f64() * rate) as usize;
        if due > sent {
            let batch = futures_util::future::try_join_all((sent..due).map(|i| {
                client.xadd::<String, _, _, _, _>(
                    stream,
                    false,
                    None,
                    "*",
                    fields(Spread::Shipped, offset + i, now),
                )
            }));
            let probe = async {
                if started.elapsed() >= next_probe {
                    next_probe += PROBE_EVERY;
                    send_probe(client, stream, probes).await
                } else {
                    Ok(())
                }
            };
            let (b, p) = tokio::join!(batch, probe);
            b.map_err(|e| e.to_string())?;
            p?;
            sent = due;
        } else if started.elapsed() >= next_probe {
            next_probe += PROBE_EVERY;
            send_probe(client, stream, probes).await?;
        }
    }
    let offered = sent as f64 / started.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        {
            let p = lock(probes);
            if p.seen.len() >= p.sent.len() {
                break;
            }
        }
        if Instant::now() > deadline {
            return Err("probes did not show in `top` within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let p = lock(probes);
    let mut latencies: Vec<Duration> = (first..p.sent.len())
        .map(|k| p.seen[k].saturating_duration_since(p.sent[k]))
        .collect();
    let figures = FreshnessFigures {
        probes: latencies.len(),
        p50: percentile(&mut latencies, 50.0),
        p99: percentile(&mut latencies, 99.0),
        max: latencies.last().copied().unwrap_or_default(),
        offered,
    };
    println!(
        "{} {:.0} events/s offered, {} probes: XADD to visible in top p50 {:.1} ms, p99 {:.1} ms, \
         max {:.1} ms",
        if rate > 0.0 { "loaded:" } else { "idle:  " },
        figures.offered,
        figures.probes,
        ms(figures.p50),
        ms(figures.p99),
        ms(figures.max)
    );
    Ok(figures)
}
