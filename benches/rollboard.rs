//! Benchmarks of memory and expiry against a private `redis-server`.
//!
//! ```text
//! cargo bench --bench rollboard -- [memory] [expiry] [--chunk N[,N...]] [--members N] [--slowlog-us N]
//! ```
//!
//! Without a scenario both run.
//!
//! * `table` (with `--quick` for smaller sizes): every figure of docs/benchmarks.md in one
//!   summary table — memory and expiry here at the default chunk, plus a query round on the
//!   filled instance under the slow log, then the naive, end-to-end, query and freshness
//!   scenarios of `benches/ingest.rs` — each with its baseline from the same run, the ratio,
//!   the target and whether it is met, and the SLOWLOG count above 2 ms per kind of call;
//!   then the capacity runs of `benches/cluster.rs` (benches/support/cluster.rs) on a 3 + 3 Redis Cluster (one board
//!   beyond one core: `rooms_7d` in 1, 3 and 6 shards), whose busiest master's CPU per event
//!   is one row of the table and whose own table follows it.
//!   Missed targets do not change the exit status.
//!
//! * `memory`: applies 100 000 distinct members (one event each, batches of 500) to an
//!   incremental, earliest-tie-break board (slice 1h, window 7d) and reports Redis bytes per
//!   ranked member from the `used_memory` delta of `INFO memory`, broken down by key with
//!   `MEMORY USAGE <key> SAMPLES 0`, plus bytes per remembered idempotency key. Baseline: a
//!   plain ZSet of the same names and scores written with `ZADD`.
//! * `expiry`: fills one slice with 1 000 000 members (slice 1h, window 2h), then for each
//!   chunk size (default 250 — the shipped `schedule.chunk` — 100 and 1000; `--chunk`
//!   replaces the list) copies that filled instance with `COPY` and rolls the copy away with
//!   `roll::run_once`. It reports the wall-clock roll time; the exact count and Redis time of
//!   the script calls (`FCALL`, the baselines' `EVALSHA`) and `HSCAN` from `INFO commandstats`; and from the slow log the
//!   longest call, p50 and p99 per script.
//!   Baseline, at the first chunk size only: the least work a chunked expiry can do, on a
//!   plain Hash and a plain ZSet of the same members (HSCAN, then one script per page doing
//!   `HGET`, `ZINCRBY`, `ZREM` at 0 and `HDEL`), measured the same way. The other chunk sizes
//!   are compared with the first one.
//!
//!   The same scenario also proves the call bound of docs/design.md (*Bounded calls*) with the slow log:
//!   the fill is measured (every apply call, `fold.lua` within `FOLD_BUDGET`) against a
//!   tenth of the events applied unsplit (one call per 1000-event batch); at the first chunk
//!   size a board in resummarize mode holding a COPY of the slice is resummarized twice (the
//!   second run replaces a ranking of every member: `stage.lua` calls, `swap.lua`, then
//!   `UNLINK` of the old value) against an unbounded baseline (one script call per page of
//!   rows, then `RENAME` over the old ranking inside a script). It closes with one line per
//!   kind of work: the calls above 2 ms, rollboard's and the baseline's, and their ratios,
//!   and two controls of fixed work that tell the machine's own interruptions: one called
//!   beside the work while it is measured (`FixedWork::beside`), one after it (`control`).
//!   The default run takes about 5 minutes on 2 cores.
//!
//! Redis 7 also writes the commands run *inside* a script to the slow log, so a threshold of
//! 0 logs about five entries per expired member: it overflows any sane `slowlog-max-len` at
//! 1M members and the logging slows the scripts down. The slow log therefore runs at
//! `--slowlog-us` (default 10 µs), which keeps almost all of those out while still catching
//! every chunk script; the output says how many script calls it caught.
//!
//! `--members N` replaces the member count of the scenarios that run. Nothing about timing
//! is asserted: results are plain text lines, with ratios against the baseline of the same
//! run. The exit status is 1 on errors and on wrong data (a roll that leaves members behind).
//!
//! The server listens on 127.0.0.1 only, on a free port, without persistence, with its
//! working directory in a temporary directory; it is killed when the program ends, also on
//! error or panic.

use std::collections::BTreeMap;
use std::future::Future;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use fred::prelude::*;
use fred::types::scripts::Script;
use fred::types::{ClusterHash, CustomCommand};
use rollboard::domain::board::{Board, Dedup, Mode, TieBreak};
use rollboard::domain::ranking::encode_member;
use rollboard::roll::{self, Report};
use rollboard::store::{
    apply_call, ApplyEvent, Outcome, Reconnect, Store, EXPIRE_CALL_FIELDS, FOLD_BUDGET,
    STAGE_CALL_ROWS, TRIM_CALL_IDS,
};
use support::{
    invoked_by_cargo_bench, slowlog_start, slowlog_stop, slowlog_take, RedisServer, SlowEntry,
    BOUND_US, SLOWLOG_MAX_LEN,
};
use tokio_util::sync::CancellationToken;

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;
/// Start of the slice every event falls into (an hour boundary in November 2025).
const T0: i64 = 1_763_700_000_000 / HOUR * HOUR;
const MEMORY_MEMBERS: usize = 100_000;
const MEMORY_BATCH: usize = 500;
const EXPIRY_MEMBERS: usize = 1_000_000;
/// `--quick` sizes.
const QUICK_MEMORY_MEMBERS: usize = 20_000;
const QUICK_EXPIRY_MEMBERS: usize = 100_000;
const EXPIRY_BATCH: usize = 1_000;
const DEFAULT_CHUNKS: [usize; 3] = [250, 100, 1_000];
const DEFAULT_SLOWLOG_US: u64 = 10;
const PLAIN_ZSET: &str = "plain:zset";
const PLAIN_IDS: &str = "plain:ids";
/// The filled instance every expiry round starts from, and the instance it rolls.
const FILLED_BOARD: &str = "exp_filled";
const ROLLED_BOARD: &str = "exp_2h";
/// The baseline's slice Hash and ranking ZSet.
const BASE_SLICE: &str = "base:{x}:slice";
const BASE_RESULT: &str = "base:{x}:result";

/// The baseline expiry: the least a chunked expiry must do per field of the dead slice.
const BASELINE_EXPIRE: &str = r#"
local done = {}
for i = 1, #ARGV do
  local v = redis.call('HGET', KEYS[2], ARGV[i])
  if v then
    done[#done + 1] = ARGV[i]
    if tonumber(redis.call('ZINCRBY', KEYS[1], -tonumber(v), ARGV[i])) <= 0 then
      redis.call('ZREM', KEYS[1], ARGV[i])
    end
  end
end
if #done > 0 then redis.call('HDEL', KEYS[2], unpack(done)) end
return #done
"#;

/// rollboard's scripts, to name the slow-log entries by function (`fold.lua`, grouped or
/// judging each event on its own, counts as `apply`).
const SCRIPTS: [(&str, &str); 10] = [
    ("apply", "fold.lua"),
    ("watermark", "watermark.lua"),
    ("expire", "expire.lua"),
    ("drop_slice", "drop_slice.lua"),
    ("trim_seen", "trim_seen.lua"),
    ("query", "query.lua"),
    ("stage", "stage.lua"),
    ("swap", "swap.lua"),
    ("cleanup", "cleanup.lua"),
    ("floor", "floor.lua"),
];

/// The resummarize board that rolls a COPY of the filled slice.
const RESUMMARIZED_BOARD: &str = "res_2h";
/// The resummarize baseline's scratch and ranking ZSets.
const BASE_TMP: &str = "base:{r}:tmp";
const BASE_RANKING: &str = "base:{r}:result";

/// The resummarize baseline, unbounded: one call writes a whole page of rows into the
/// scratch ZSet; a second one RENAMEs it over the live ranking (freeing the old one there).
const BASELINE_STAGE: &str = r#"
for i = 1, #ARGV, 2 do redis.call('ZADD', KEYS[1], ARGV[i], ARGV[i + 1]) end
return #ARGV / 2
"#;
const BASELINE_SWAP: &str = "return redis.call('RENAME', KEYS[1], KEYS[2])";

const USAGE: &str = "usage: cargo bench --bench rollboard -- [table] [memory] [expiry] [quiet] \
                     [--quick] [--chunk N[,N...]] [--members N] [--slowlog-us N]";

// The table runs the ingest bench's scenarios too; the shared helpers come with it.
#[allow(dead_code)]
#[path = "ingest.rs"]
mod ingest;
use ingest::support;
use support::cluster;
use support::workload::Spread;

fn main() -> ExitCode {
    if !invoked_by_cargo_bench() {
        println!("rollboard bench: skipped (run it with `cargo bench --bench rollboard`)");
        return ExitCode::SUCCESS;
    }
    let options = match Options::parse(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(e) => {
            eprintln!("error: {e:#}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&options) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("error: a correctness check failed (see MISMATCH above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Command-line options.
#[derive(Debug)]
struct Options {
    table: bool,
    quick: bool,
    memory: bool,
    expiry: bool,
    quiet: bool,
    chunks: Vec<usize>,
    members: Option<usize>,
    slowlog_us: u64,
}

impl Options {
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Options> {
        let mut options = Options {
            table: false,
            quick: false,
            memory: false,
            expiry: false,
            quiet: false,
            chunks: Vec::new(),
            members: None,
            slowlog_us: DEFAULT_SLOWLOG_US,
        };
        while let Some(arg) = args.next() {
            let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
            match arg.as_str() {
                // cargo passes `--bench` to every harness-less bench.
                "--bench" => {}
                "table" => options.table = true,
                "--quick" => options.quick = true,
                "memory" => options.memory = true,
                "expiry" => options.expiry = true,
                "quiet" => options.quiet = true,
                "--chunk" => {
                    for n in value()?.split(',') {
                        options.chunks.push(number(n, "--chunk", 1)? as usize);
                    }
                }
                "--members" => options.members = Some(number(&value()?, "--members", 1)? as usize),
                "--slowlog-us" => options.slowlog_us = number(&value()?, "--slowlog-us", 0)?,
                other => bail!("unknown argument {other:?}"),
            }
        }
        if options.table {
            // Every figure, at the default chunk (schedule.chunk = 1000).
            options.memory = true;
            options.expiry = true;
            if options.chunks.is_empty() {
                options.chunks = vec![DEFAULT_CHUNKS[0]];
            }
        }
        if !options.memory && !options.expiry && !options.quiet {
            options.memory = true;
            options.expiry = true;
        }
        if options.chunks.is_empty() {
            options.chunks = DEFAULT_CHUNKS.to_vec();
        }
        Ok(options)
    }
}

fn number(text: &str, what: &str, min: u64) -> Result<u64> {
    match text.parse::<u64>() {
        Ok(n) if n >= min => Ok(n),
        _ => bail!("{what} takes an integer of at least {min}, not {text:?}"),
    }
}

/// Runs the selected scenarios on a fresh server; false when a correctness check failed.
fn run(options: &Options) -> Result<bool> {
    let runtime = if options.table {
        // The table's ingest scenarios run a consumer, an HTTP server and clients at once.
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    }
    .context("tokio runtime")?;
    runtime.block_on(async {
        let started = Instant::now();
        if options.table {
            println!(
                "== table{}: every figure of the measured table; load average at start {}",
                if options.quick { " (quick)" } else { "" },
                load_average()
            );
        }
        let (mut ok, memory_figures, expiry_figures) = if options.memory || options.expiry {
            rollboard_scenarios(options).await?
        } else {
            (true, None, None)
        };
        if options.quiet {
            ok &= quiet(options.quick).await?;
        }
        if options.table {
            let sizes = if options.quick {
                ingest::QUICK
            } else {
                ingest::FULL
            };
            let scenarios = ["naive", "pipelined", "e2e", "query", "freshness"];
            let figures = ingest::run(&scenarios, sizes)
                .await
                .map_err(anyhow::Error::msg)?;
            println!("== capacity on Redis Cluster (benches/cluster.rs)");
            let capacity = cluster::capacity(cluster::events(options.quick))
                .await
                .unwrap_or_else(|e| {
                    println!("the capacity runs failed: {e}");
                    Vec::new()
                });
            ok &= print_table(
                options,
                memory_figures.unwrap_or_default(),
                &expiry_figures.unwrap_or_default(),
                &figures,
                &capacity,
            );
            if !capacity.is_empty() {
                let command = format!(
                    "cargo bench --bench rollboard -- table{}",
                    if options.quick { " --quick" } else { "" }
                );
                cluster::print_table(&capacity, &command);
            }
            println!(
                "run time {:.0} s; load average at the end {}",
                started.elapsed().as_secs_f64(),
                load_average()
            );
        }
        anyhow::Ok(ok)
    })
}

/// Memory and expiry on one server (stopped before the table's ingest scenarios start).
async fn rollboard_scenarios(
    options: &Options,
) -> Result<(bool, Option<MemoryFigures>, Option<ExpiryFigures>)> {
    let server = RedisServer::start().map_err(anyhow::Error::msg)?;
    let store = Store::connect(&server.url(), "rb", 2, Reconnect::Never)
        .await
        .context("connect to the bench redis-server")?;
    println!("{} on 127.0.0.1:{}", redis_version(), server.port);
    // The slow log stays off except while a roll is measured.
    slowlog_stop(store.client())
        .await
        .map_err(anyhow::Error::msg)?;
    let mut ok = true;
    let (mut memory_figures, mut expiry_figures) = (None, None);
    if options.memory {
        let default = if options.quick {
            QUICK_MEMORY_MEMBERS
        } else {
            MEMORY_MEMBERS
        };
        let (o, f) = memory(&store, options.members.unwrap_or(default)).await?;
        ok &= o;
        memory_figures = Some(f);
    }
    if options.expiry {
        let default = if options.quick {
            QUICK_EXPIRY_MEMBERS
        } else {
            EXPIRY_MEMBERS
        };
        let members = options.members.unwrap_or(default);
        let (o, f) = expiry(&store, members, &options.chunks, options.slowlog_us).await?;
        ok &= o;
        expiry_figures = Some(f);
    }
    Ok((ok, memory_figures, expiry_figures))
}

/// `/proc/loadavg`'s three load averages.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// One line of the table.
struct Row {
    figure: String,
    ours: String,
    base: String,
    ratio: String,
    target: &'static str,
    met: bool,
}

/// Prints the summary table; false when a figure is missing (a scenario failed to run).
fn print_table(
    options: &Options,
    memory: MemoryFigures,
    expiry: &ExpiryFigures,
    ingest_figures: &ingest::Figures,
    capacity: &[cluster::Row],
) -> bool {
    let mut rows = Vec::new();
    let members = options.members.unwrap_or(if options.quick {
        QUICK_EXPIRY_MEMBERS
    } else {
        EXPIRY_MEMBERS
    });
    let calls = |s: &Stats| {
        format!(
            "{} > 2 ms of {} logged, longest {:.2} ms",
            s.above,
            s.count,
            s.max as f64 / 1e3
        )
    };
    for b in &expiry.bounds {
        let (p_beside, p_after) = b.p_same();
        rows.push(Row {
            figure: format!(
                "longest Redis call, {} ({members} members); controls: fixed work beside it \
                 and after it (p against each)",
                b.kind
            ),
            ours: format!(
                "{}; control beside {} > 2 ms of {}, longest {:.2} ms; after {} > 2 ms of {}, \
                 longest {:.2} ms; p = {:.3} / {:.3}",
                calls(&b.ours),
                b.beside.above,
                b.beside.count,
                b.beside.max as f64 / 1e3,
                b.control.above,
                b.control.count,
                b.control.max as f64 / 1e3,
                p_beside,
                p_after
            ),
            base: calls(&b.base),
            ratio: ratio(b.ours.max as f64, b.base.max as f64),
            target: "0 calls > 2 ms (beyond the control's share)",
            met: b.met(),
        });
    }
    if let Some(q) = ingest_figures.query {
        for (what, i) in [("top-10", 1), ("rank", 3)] {
            rows.push(Row {
                figure: format!(
                    "{what} p99 over HTTP while ingesting (~{:.0} events/s applied) vs idle",
                    q.applied
                ),
                ours: format!("{:.2} ms", q.busy[i].as_secs_f64() * 1e3),
                base: format!("{:.2} ms idle", q.idle[i].as_secs_f64() * 1e3),
                ratio: ratio(q.busy[i].as_secs_f64(), q.idle[i].as_secs_f64()),
                target: "<= 3 ms (idle <= 0.6 ms)",
                met: q.busy[i] <= Duration::from_millis(3)
                    && q.idle[i] <= Duration::from_micros(600),
            });
        }
    }
    let workload = |spread: Spread| {
        ingest_figures
            .workloads
            .iter()
            .find(|(s, _)| *s == spread)
            .map(|(_, w)| *w)
            .unwrap_or_default()
    };
    let targets = [
        (Spread::Shipped, 10.0, 4.0),
        (Spread::ShippedNow, 10.0, 4.0),
        (Spread::Skewed, 10.0, 4.0),
        (Spread::Uniform, 8.0, 10.0),
    ];
    for (spread, times, _) in targets {
        if let ingest::WorkloadFigures {
            naive: Some(n),
            e2e: Some(e),
            ..
        } = workload(spread)
        {
            let cold = |t: &ingest::Throughput| match t.cold {
                Some(c) => format!(" ({:.0} from an empty Redis)", c.rate),
                None => String::new(),
            };
            rows.push(Row {
                figure: format!(
                    "ingest end to end vs naive, second pass (new events on the first pass's \
                     instances), {}",
                    spread.describe()
                ),
                ours: format!("{:.0} events/s{}", e.rate, cold(&e)),
                base: format!("{:.0} events/s{}", n.rate, cold(&n)),
                ratio: ratio(e.rate, n.rate),
                target: if times == 10.0 { ">= 10x" } else { ">= 8x" },
                met: e.rate >= times * n.rate,
            });
        }
    }
    for (spread, _, micros) in targets {
        if let ingest::WorkloadFigures {
            naive: Some(n),
            e2e: Some(e),
            ..
        } = workload(spread)
        {
            let cold = |t: &ingest::Throughput| match t.cold {
                Some(c) => format!(" ({:.2} from an empty Redis)", c.redis_us),
                None => String::new(),
            };
            rows.push(Row {
                figure: format!(
                    "Redis time per applied event (every command), second pass, {}",
                    spread.describe()
                ),
                ours: format!("{:.2} µs{}", e.redis_us, cold(&e)),
                base: format!("{:.2} µs naive{}", n.redis_us, cold(&n)),
                ratio: ratio(e.redis_us, n.redis_us),
                target: if micros == 10.0 {
                    "<= 10 µs"
                } else {
                    "<= 4 µs"
                },
                met: e.redis_us <= micros,
            });
        }
    }
    // The target of the apply path's price: Redis CPU per event against the naive commands
    // pipelined, on both shipped workloads; this process's CPU (the consumer's) beside it.
    for (spread, most) in [(Spread::Shipped, 1.5), (Spread::ShippedNow, 0.75)] {
        if let ingest::WorkloadFigures {
            naive: Some(n),
            pipelined: Some(p),
            e2e: Some(e),
            ..
        } = workload(spread)
        {
            let cold = |t: &ingest::Throughput| match t.cold {
                Some(c) => format!(" ({:.2} from an empty Redis)", c.cpu_us),
                None => String::new(),
            };
            rows.push(Row {
                figure: format!(
                    "Redis CPU per event (user + sys), second pass, {}, vs the naive commands \
                     pipelined {} events at a time on the same events",
                    spread.describe(),
                    ingest::NAIVE_PIPELINE
                ),
                ours: format!(
                    "{:.2} µs{} (commandstats {:.2} µs); the consumer's own CPU {:.2} µs",
                    e.cpu_us,
                    cold(&e),
                    e.redis_us,
                    e.own_us
                ),
                base: format!(
                    "{:.2} µs pipelined{} (commandstats {:.2} µs); one command at a time {:.2} µs",
                    p.cpu_us,
                    cold(&p),
                    p.redis_us,
                    n.cpu_us
                ),
                ratio: ratio(e.cpu_us, p.cpu_us),
                target: if most == 1.5 { "<= 1.5x" } else { "<= 0.75x" },
                met: e.cpu_us <= most * p.cpu_us,
            });
        }
    }
    if options.expiry {
        rows.push(Row {
            figure: format!(
                "expiry, Redis time per expired member (script calls + HSCAN), {members}-member slice"
            ),
            ours: format!("{:.2} µs", expiry.per_member_us),
            base: format!("{:.2} µs", expiry.base_per_member_us),
            ratio: ratio(expiry.per_member_us, expiry.base_per_member_us),
            target: "<= 10 µs",
            met: expiry.per_member_us <= 10.0,
        });
    }
    if options.memory {
        let r = memory.per_member / memory.plain_per_member;
        rows.push(Row {
            figure: "bytes per ranked member (used_memory delta; the idempotency keys have \
                     their own row) vs a plain ZSet"
                .into(),
            ours: format!(
                "{:.1} B ({:.1} B with the id of its one event)",
                memory.per_member, memory.with_ids_per_member
            ),
            base: format!("{:.1} B", memory.plain_per_member),
            ratio: ratio(memory.per_member, memory.plain_per_member),
            target: "<= 2.5x",
            met: r <= 2.5,
        });
        rows.push(Row {
            figure: "bytes per remembered idempotency key (used_memory deleting them gives \
                     back) vs a plain ZSet of the ids"
                .into(),
            ours: format!("{:.1} B", memory.per_key),
            base: format!("{:.1} B", memory.plain_per_key),
            ratio: ratio(memory.per_key, memory.plain_per_key),
            target: "<= 40 B",
            met: memory.per_key <= 40.0,
        });
    }
    if let Some((busy, idle)) = ingest_figures.freshness {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        rows.push(Row {
            figure: format!(
                "freshness, XADD to visible in top (`http.max_staleness = 0s`), p50 / p99 \
                 (max) at {:.0} events/s (half the shipped shape's first-pass e2e rate) vs \
                 probes alone",
                busy.offered
            ),
            ours: format!(
                "{:.1} / {:.1} ({:.1}) ms",
                ms(busy.p50),
                ms(busy.p99),
                ms(busy.max)
            ),
            base: format!(
                "{:.1} / {:.1} ({:.1}) ms",
                ms(idle.p50),
                ms(idle.p99),
                ms(idle.max)
            ),
            ratio: ratio(ms(busy.p99), ms(idle.p99)),
            target: "p99 <= 50 ms",
            met: busy.p99 <= Duration::from_millis(50),
        });
    }
    if let Some((one, split)) = beyond_one_core(capacity) {
        let figure = |r: &cluster::Row| {
            format!(
                "{:.1} µs/event ({:.0} % of the masters')",
                r.busiest(),
                r.busiest_share() * 100.0
            )
        };
        rows.push(Row {
            figure: format!(
                "one board beyond one core: the busiest master's Redis CPU, `rooms_7d` alone \
                 in {} shards vs 1 (3 + 3 cluster, {} partitions, {} events)",
                split.layout.shards, split.layout.partitions, split.events
            ),
            ours: figure(split),
            base: figure(one),
            ratio: ratio(split.busiest(), one.busiest()),
            target: "< 1x: no master carries the whole board",
            met: split.busiest() < one.busiest(),
        });
    }
    println!();
    println!(
        "== table{} (ratios: rollboard / baseline, same run; a missed target is reported, \
         not an error)",
        if options.quick { " (quick sizes)" } else { "" }
    );
    println!();
    println!("| figure | rollboard | baseline (same run) | ratio | target | met? |");
    println!("|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            r.figure,
            r.ours,
            r.base,
            r.ratio,
            r.target,
            if r.met { "yes" } else { "**no**" }
        );
    }
    let above: usize = expiry.bounds.iter().map(|b| b.ours.above).sum();
    let control: usize = expiry.bounds.iter().map(|b| b.control.above).sum();
    let beside: usize = expiry.bounds.iter().map(|b| b.beside.above).sum();
    let per_kind: Vec<String> = expiry
        .bounds
        .iter()
        .map(|b| {
            format!(
                "{} {} (control beside {} of {}, after {} of {})",
                b.kind,
                b.ours.above,
                b.beside.above,
                b.beside.count,
                b.control.above,
                b.control.count
            )
        })
        .collect();
    println!();
    println!(
        "SLOWLOG count above 2 ms, rollboard's calls at the default config: {above} ({}; \
         target 0); calls of fixed work beside the work: {beside}; after it, as long as \
         rollboard's median, as many: {control}",
        per_kind.join(", ")
    );
    println!(
        "while ingesting (every end-to-end drain, both passes of every workload, SLOWLOG at \
         >= {} µs): {}",
        ingest::E2E_SLOWLOG_US,
        ingest_figures.calls.describe()
    );
    println!(
        "targets met: {} of {}",
        rows.iter().filter(|r| r.met).count(),
        rows.len()
    );
    let expected = 4 + 2 + 3 + 3 + 1 + 1 + 2 + 1 + 1;
    if rows.len() < expected {
        println!("MISMATCH: {} of {expected} figures measured", rows.len());
    }
    rows.len() >= expected
}

/// The capacity runs of `rooms_7d` alone in one shard and in 3: the one board beyond one
/// core figure.
fn beyond_one_core(rows: &[cluster::Row]) -> Option<(&cluster::Row, &cluster::Row)> {
    let alone = |shards: u32| {
        rows.iter()
            .find(|r| r.layout.boards == cluster::Boards::RoomsOnly && r.layout.shards == shards)
    };
    Some((alone(1)?, alone(3)?))
}

/// The version line of the redis-server binary.
fn redis_version() -> String {
    Command::new("redis-server")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// Redis helpers

/// Sends one command that fred has no typed method for.
async fn command(client: &Client, name: &'static str, args: Vec<Value>) -> Result<Value> {
    let hash = match name {
        "ZADD" | "HSET" | "ZCARD" | "HLEN" | "EXISTS" | "COPY" => ClusterHash::FirstKey,
        _ => ClusterHash::Random,
    };
    client
        .custom(CustomCommand::new_static(name, hash, false), args)
        .await
        .with_context(|| format!("redis {name}"))
}

/// [`command`] with text arguments.
async fn admin(client: &Client, name: &'static str, args: &[&str]) -> Result<Value> {
    command(client, name, args.iter().map(|a| Value::from(*a)).collect()).await
}

async fn integer(client: &Client, name: &'static str, args: &[&str]) -> Result<i64> {
    let v = admin(client, name, args).await?;
    v.as_i64()
        .with_context(|| format!("{name} {args:?} answered {v:?}"))
}

/// The lines of one `INFO` section.
async fn info(client: &Client, section: &str) -> Result<String> {
    let v = admin(client, "INFO", &[section]).await?;
    Ok(v.as_str_lossy().unwrap_or_default().into_owned())
}

async fn used_memory(client: &Client) -> Result<i64> {
    info(client, "memory")
        .await?
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .context("INFO memory has no used_memory")
}

async fn memory_usage(client: &Client, key: &str) -> Result<i64> {
    let v = admin(client, "MEMORY", &["USAGE", key, "SAMPLES", "0"]).await?;
    Ok(v.as_i64().unwrap_or(0))
}

/// Per command (lower case): calls and total µs, from `INFO commandstats`.
async fn commandstats(client: &Client) -> Result<BTreeMap<String, (u64, u64)>> {
    let text = info(client, "commandstats").await?;
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some((name, fields)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let field = |key: &str| {
            fields
                .split(',')
                .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        out.insert(name.to_string(), (field("calls"), field("usec")));
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Quiet instances

/// Scoped instances of the `quiet` scenario (`--quick`: fewer), each with
/// [`QUIET_SLICES`] live slices of [`QUIET_MEMBERS`] members.
const QUIET_INSTANCES: usize = 2_000;
const QUICK_QUIET_INSTANCES: usize = 300;
const QUIET_SLICES: usize = 12;
const QUIET_MEMBERS: usize = 5;
/// One instance in this many receives an event between two runs.
const QUIET_ACTIVE_EVERY: usize = 100;

/// The resummarize job over many scoped instances, most of them quiet between two runs
/// (the shipped `fans_7d` shape: one instance per room). Redis time (`INFO commandstats`)
/// and wall time of a run in which every instance is summed (each instance's record of its
/// last sum deleted first: what every run did before unchanged instances were left as they
/// are) against a run in which one instance in [`QUIET_ACTIVE_EVERY`] changed, and one in
/// which none did. False when a ranking is not what its slices say after a run.
async fn quiet(quick: bool) -> Result<bool> {
    let server = RedisServer::start().map_err(anyhow::Error::msg)?;
    let store = Store::connect(&server.url(), "rb", 2, Reconnect::Never)
        .await
        .context("connect to the bench redis-server")?;
    let instances = if quick {
        QUICK_QUIET_INSTANCES
    } else {
        QUIET_INSTANCES
    };
    let mut b = board("quiet", 24, DAY);
    b.mode = Mode::Resummarize;
    b.scope = Some("room".into());
    let scope = |r: usize| format!("room{r:05}");
    let now = T0 + QUIET_SLICES as i64 * HOUR;
    println!(
        "== quiet: resummarize job over {instances} scoped instances, {QUIET_SLICES} live slices \
         x {QUIET_MEMBERS} members each; {} on 127.0.0.1:{}",
        redis_version(),
        server.port
    );
    let filled = Instant::now();
    for r in 0..instances {
        let events: Vec<ApplyEvent> = (0..QUIET_SLICES * QUIET_MEMBERS)
            .map(|i| ApplyEvent {
                id: format!("{}-{i}", scope(r)),
                ts: T0 + (i / QUIET_MEMBERS) as i64 * HOUR + r as i64,
                member: member_name(i % QUIET_MEMBERS + r % 7),
                amount: amount_of(i),
            })
            .collect();
        store.apply(&b, Some(&scope(r)), &events, now).await?;
    }
    println!(
        "fill: {} events in {:.1} s",
        instances * QUIET_SLICES * QUIET_MEMBERS,
        filled.elapsed().as_secs_f64()
    );
    let run = async |label: &str, at: i64| -> Result<(u64, u64, u64)> {
        let before = commandstats(store.client()).await?;
        let started = Instant::now();
        let reports = roll::run_once(
            &store,
            std::slice::from_ref(&b),
            roll::Job::Resummarize,
            None,
            at,
            250,
            &CancellationToken::new(),
        )
        .await?;
        let wall = started.elapsed();
        let after = commandstats(store.client()).await?;
        let usec: u64 = after
            .iter()
            .filter(|(name, _)| name.as_str() != "info")
            .map(|(name, (_, usec))| usec - before.get(name).map_or(0, |b| b.1))
            .sum();
        let r = &reports[0];
        println!(
            "{label:<44} {:>5} of {} instances summed: Redis {:>8.1} ms, wall {:>7.1} ms",
            r.resummed,
            r.instances,
            usec as f64 / 1000.0,
            wall.as_secs_f64() * 1000.0
        );
        if !r.complete() {
            bail!("the run failed: {:?}", r.first_error);
        }
        Ok((r.resummed, usec, wall.as_micros() as u64))
    };
    run("first run (every instance new)", now).await?;
    for r in 0..instances {
        let meta = store.instance(&b.widest(), Some(&scope(r))).meta();
        let _: i64 = store.client().hdel(meta, "summed_gen").await?;
    }
    let every = run("every instance summed (record deleted)", now + 1).await?;
    let none = run("no instance changed", now + 2).await?;
    let at = now + 3;
    let active: Vec<usize> = (0..instances).step_by(QUIET_ACTIVE_EVERY).collect();
    for &r in &active {
        let e = ApplyEvent {
            id: format!("{}-new", scope(r)),
            ts: at,
            member: member_name(r % 7),
            amount: 1_000,
        };
        store.apply(&b, Some(&scope(r)), &[e], at).await?;
    }
    let some = run(&format!("1 in {QUIET_ACTIVE_EVERY} instances changed"), at).await?;
    let mut ok = every.0 == instances as u64 && none.0 == 0 && some.0 == active.len() as u64;
    for r in active.iter().copied().chain([1, instances - 1]) {
        let v = roll::verify(&store, &b.widest(), Some(&scope(r)), 250).await?;
        if !v.differences.is_empty() {
            println!(
                "MISMATCH: {} behind its slices: {:?}",
                scope(r),
                v.differences
            );
            ok = false;
        }
    }
    println!(
        "ratio to every instance summed: no change {} Redis time, {} wall; 1 in {QUIET_ACTIVE_EVERY} \
         changed {} Redis time, {} wall; check: {}",
        ratio(none.1 as f64, every.1 as f64),
        ratio(none.2 as f64, every.2 as f64),
        ratio(some.1 as f64, every.1 as f64),
        ratio(some.2 as f64, every.2 as f64),
        verdict(ok)
    );
    Ok(ok)
}

// ---------------------------------------------------------------------------------------
// Workload

fn board(name: &str, n: i64, window_ms: i64) -> Board {
    Board {
        name: name.into(),
        member: "user".into(),
        scope: None,
        amount: "amount".into(),
        scale: 0,
        window_ms,
        windows: Vec::new(),
        slice_ms: window_ms / n,
        mode: Mode::Incremental,
        tie_break: TieBreak::Earliest,
        allow_negative: false,
        dense_rank: false,
        changes: None,
        dedup: Dedup::Window,
        period: None,
        shards: 1,
    }
}

fn member_name(i: usize) -> String {
    format!("user:{i:08}")
}

fn amount_of(i: usize) -> i64 {
    1 + (i % 1_000) as i64
}

/// Event `i`: member `i` at a distinct millisecond of the slice starting at [`T0`].
fn event(i: usize) -> ApplyEvent {
    ApplyEvent {
        id: format!("tip-{i:010}"),
        ts: T0 + i as i64 % HOUR,
        member: member_name(i),
        amount: amount_of(i),
    }
}

fn describe_names() -> String {
    format!(
        "member names like {:?} ({} B), idempotency keys like {:?} ({} B)",
        member_name(0),
        member_name(0).len(),
        event(0).id,
        event(0).id.len()
    )
}

/// Applies events `0..members` in batches, all inside the slice at [`T0`]; returns the time.
async fn apply_all(store: &Store, board: &Board, members: usize, batch: usize) -> Result<Duration> {
    let now = T0 + HOUR - 1;
    let start = Instant::now();
    for from in (0..members).step_by(batch) {
        let events: Vec<ApplyEvent> = (from..(from + batch).min(members)).map(event).collect();
        let outcomes = store.apply(board, None, &events, now).await?;
        if let Some(o) = outcomes.iter().find(|o| **o != Outcome::Applied) {
            bail!("an event of the batch at {from} was not applied: {o:?}");
        }
    }
    Ok(start.elapsed())
}

/// Sends `name key pair(i)...` for `i` in `0..members`, `batch` pairs per command.
async fn write_plain(
    client: &Client,
    name: &'static str,
    key: &str,
    members: usize,
    batch: usize,
    pair: fn(usize) -> [Value; 2],
) -> Result<()> {
    for from in (0..members).step_by(batch) {
        let mut args = vec![Value::from(key)];
        args.extend((from..(from + batch).min(members)).flat_map(pair));
        command(client, name, args).await?;
    }
    Ok(())
}

fn score_member(i: usize) -> [Value; 2] {
    [amount_of(i).into(), member_name(i).into()]
}

fn field_amount(i: usize) -> [Value; 2] {
    [member_name(i).into(), amount_of(i).into()]
}

fn per_second(n: usize, took: Duration) -> f64 {
    n as f64 / took.as_secs_f64()
}

/// `a / b` as `1.23x`, or `n/a` when there is nothing to compare with.
fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}x", a / b)
    } else {
        "n/a".into()
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "ok"
    } else {
        "MISMATCH"
    }
}

// ---------------------------------------------------------------------------------------
// Scenario: memory

/// The memory figures of the table: bytes per ranked member (rollboard's `used_memory`
/// delta without its idempotency keys, and the plain ZSet's) and bytes per remembered
/// idempotency key (the `used_memory` deleting them gives back, and a plain ZSet of the
/// same ids scored by time).
#[derive(Debug, Default, Clone, Copy)]
struct MemoryFigures {
    /// The ranking's keys alone (the ids have `per_key`).
    per_member: f64,
    /// Every key of the instance, the idempotency keys of its one event per member too.
    with_ids_per_member: f64,
    plain_per_member: f64,
    per_key: f64,
    plain_per_key: f64,
}

async fn memory(store: &Store, members: usize) -> Result<(bool, MemoryFigures)> {
    let client = store.client();
    let b = board("mem_7d", 7 * 24, 7 * DAY);
    println!();
    println!(
        "== memory: {members} members, one event each, batches of {MEMORY_BATCH}; \
         board slice 1h window 7d, incremental, tie-break earliest"
    );
    println!("   {}", describe_names());
    admin(client, "FLUSHALL", &["SYNC"]).await?;
    store.load_library().await?;
    let before = used_memory(client).await?;
    let took = apply_all(store, &b, members, MEMORY_BATCH).await?;
    let after = used_memory(client).await?;
    let delta = after - before;
    println!(
        "apply: {:.2} s, {:.0} events/s",
        took.as_secs_f64(),
        per_second(members, took)
    );
    let k = store.instance(&b.widest(), None);
    let ranked = integer(client, "ZCARD", &[&k.result()]).await?;
    let ok = ranked == members as i64;
    println!(
        "check: ZCARD result = {ranked} (expected {members}) {}",
        verdict(ok)
    );
    let per = |bytes: i64| bytes as f64 / members as f64;
    println!(
        "used_memory: before {before} B, after {after} B, delta {delta} B = {:.1} B per ranked member",
        per(delta)
    );
    println!("MEMORY USAGE <key> SAMPLES 0:");
    let keys = [
        ("result ZSet", k.result()),
        ("members Hash", k.members()),
        ("slice Hash", k.slice(b.slice_of(T0))),
        ("seen table", k.seen_table()),
        ("seen log", k.seen_log(b.slice_of(T0))),
        ("meta Hash", k.meta()),
        ("slices ZSet", k.slices()),
    ];
    let mut sizes = BTreeMap::new();
    for (label, key) in &keys {
        let bytes = memory_usage(client, key).await?;
        println!("  {label:<13} {bytes:>11} B  {:>7.1} B/member", per(bytes));
        sizes.insert(*label, bytes);
    }
    let sum: i64 = sizes.values().sum();
    let seen_bytes = sizes["seen table"] + sizes["seen log"];
    println!("  {:<13} {sum:>11} B  {:>7.1} B/member", "sum", per(sum));
    let ranking = sum - seen_bytes;
    println!(
        "  {:<13} {ranking:>11} B  {:>7.1} B/member",
        "sum w/o seen",
        per(ranking)
    );
    let seen: i64 = client
        .hget::<Option<i64>, _, _>(k.seen_table(), "#n")
        .await?
        .unwrap_or(0);
    println!(
        "idempotency: {seen} keys remembered, {:.1} B per key (MEMORY USAGE of the digest \
         table and the slice's forget log / #n)",
        seen_bytes as f64 / seen.max(1) as f64
    );
    let (plain_delta, plain_usage) = plain_zset(client, members).await?;
    println!(
        "baseline plain ZSet (ZADD of the same names and scores, no tie-break prefix): \
         MEMORY USAGE {plain_usage} B = {:.1} B/member; used_memory delta {plain_delta} B = {:.1} B/member",
        per(plain_usage),
        per(plain_delta)
    );
    println!(
        "ratio rollboard / plain ZSet: {} by used_memory delta, {} by MEMORY USAGE; \
         {} by MEMORY USAGE without the idempotency keys",
        ratio(delta as f64, plain_delta as f64),
        ratio(sum as f64, plain_usage as f64),
        ratio(ranking as f64, plain_usage as f64)
    );
    // The ids have a figure of their own: what deleting them gives back is theirs, the
    // rest of the delta is the ranking's.
    let with_ids = used_memory(client).await?;
    admin(
        client,
        "DEL",
        &[&k.seen_table(), &k.seen_log(b.slice_of(T0))],
    )
    .await?;
    let freed = with_ids - used_memory(client).await?;
    println!(
        "used_memory given back by deleting the idempotency keys: {freed} B = {:.1} B per \
         key; the ranking keeps {} B = {:.1} B per ranked member ({} of the plain ZSet)",
        freed as f64 / seen.max(1) as f64,
        delta - freed,
        per(delta - freed),
        ratio((delta - freed) as f64, plain_delta as f64)
    );
    let ids = plain_ids(client, members).await?;
    println!(
        "baseline plain ZSet of the same {members} idempotency keys scored by time: \
         MEMORY USAGE {ids} B = {:.1} B/key",
        per(ids)
    );
    let figures = MemoryFigures {
        per_member: per(delta - freed),
        with_ids_per_member: per(delta),
        plain_per_member: per(plain_delta),
        per_key: freed as f64 / seen.max(1) as f64,
        plain_per_key: per(ids),
    };
    Ok((ok, figures))
}

/// Writes a plain ZSet of the events' ids scored by their time; its MEMORY USAGE.
async fn plain_ids(client: &Client, members: usize) -> Result<i64> {
    write_plain(client, "ZADD", PLAIN_IDS, members, MEMORY_BATCH, |i| {
        let e = event(i);
        [e.ts.into(), e.id.into()]
    })
    .await?;
    memory_usage(client, PLAIN_IDS).await
}

/// Writes the baseline ZSet; returns its used_memory delta and its MEMORY USAGE.
async fn plain_zset(client: &Client, members: usize) -> Result<(i64, i64)> {
    let before = used_memory(client).await?;
    write_plain(
        client,
        "ZADD",
        PLAIN_ZSET,
        members,
        MEMORY_BATCH,
        score_member,
    )
    .await?;
    let after = used_memory(client).await?;
    Ok((after - before, memory_usage(client, PLAIN_ZSET).await?))
}

// ---------------------------------------------------------------------------------------
// Scenario: expiry

/// What one expiry round measures for rollboard or for the baseline.
struct Measured {
    wall: Duration,
    /// `INFO commandstats` deltas: command -> (calls, µs).
    calls: BTreeMap<String, (u64, u64)>,
    log: Vec<SlowEntry>,
    log_full: bool,
    /// The calls of the fixed work ([`FixedWork`]): of the control beside the work, when one
    /// ran, counted as sent (calls shorter than the slow log's threshold are not in it).
    fixed: Stats,
}

impl Measured {
    fn calls(&self, command: &str) -> (u64, u64) {
        self.calls.get(command).copied().unwrap_or_default()
    }
}

/// The expiry figures of the table: script calls per kind of work (rollboard, baseline)
/// and Redis time per expired member (script calls + HSCAN, INFO commandstats).
#[derive(Debug, Default)]
struct ExpiryFigures {
    bounds: Vec<Bound>,
    per_member_us: f64,
    base_per_member_us: f64,
}

async fn expiry(
    store: &Store,
    members: usize,
    chunks: &[usize],
    slowlog_us: u64,
) -> Result<(bool, ExpiryFigures)> {
    let client = store.client();
    let filled = board(FILLED_BOARD, 2, 2 * HOUR);
    println!();
    println!(
        "== expiry: {members} members in one slice; board slice 1h window 2h, incremental, \
         tie-break earliest; chunks {chunks:?} (baseline at chunk {})",
        chunks[0]
    );
    println!("   {}", describe_names());
    println!(
        "   Redis time and call counts: INFO commandstats (exact, no logging cost). \
         Longest call, p50, p99: slow log at slowlog-log-slower-than {slowlog_us} µs; Redis 7 \
         also logs the commands run inside scripts, so threshold 0 would log ~5 entries per \
         member (overflowing the log) and slow the scripts; logging still costs a little \
         per logged command"
    );
    admin(client, "FLUSHALL", &["SYNC"]).await?;
    store.load_library().await?;
    let beside = FixedWork::start(client).await?;
    println!(
        "   control beside each measured kind of work: a call of fixed work ({} loops, ~{BESIDE_CALL_US:.0} µs) every {} ms on a connection of its own",
        beside.loops(BESIDE_CALL_US),
        BESIDE_EVERY.as_millis()
    );
    let fill = async { apply_all(store, &filled, members, EXPIRY_BATCH).await };
    let (took, filled_log) = measure_beside(client, slowlog_us, Some(&beside), fill).await?;
    println!(
        "fill: {members} events in batches of {EXPIRY_BATCH} with Store::apply (fold.lua calls \
         of at most {FOLD_BUDGET} work units): {:.1} s, {:.0} events/s (each round rolls a COPY of this \
         instance)",
        took.as_secs_f64(),
        per_second(members, took)
    );
    let apply = by_script(&filled_log).remove("apply").unwrap_or_default();
    println!("    {}", apply.line("fold.lua", members));
    let apply_base = apply_unsplit(store, members.div_ceil(10), slowlog_us).await?;
    let mut bounds = vec![(
        format!(
            "apply (fold.lua calls of at most {FOLD_BUDGET} units vs one fold.lua call judging \
             each event of a 1000-event batch)"
        ),
        apply,
        apply_base,
    )];
    let mut figures = ExpiryFigures::default();
    figures
        .bounds
        .push(Bound::new("apply", apply, apply_base, filled_log.fixed));
    let (query, query_base, query_beside) =
        query_bound(store, members, slowlog_us, &beside).await?;
    bounds.push((
        "query (top-10 and rank scripts vs plain ZREVRANGE, HGET + ZREVRANK)".to_string(),
        query,
        query_base,
    ));
    figures
        .bounds
        .push(Bound::new("query", query, query_base, query_beside));
    let mut ok = true;
    let mut first: Option<(usize, Figures)> = None;
    for &chunk in chunks {
        let (round_ok, rolled) = roll_round(store, members, chunk, slowlog_us, &beside).await?;
        ok &= round_ok;
        match &first {
            None => {
                let (base_ok, base) =
                    baseline_round(store, members, chunk, slowlog_us, &rolled).await?;
                ok &= base_ok;
                bounds.push((
                    format!(
                        "expiry, chunk {chunk} (every rollboard script and HSCAN page vs one call per HSCAN page)"
                    ),
                    rolled.all,
                    base.script,
                ));
                figures.bounds.push(Bound::new(
                    "expire/roll",
                    rolled.all,
                    base.script,
                    rolled.beside,
                ));
                figures.per_member_us =
                    (rolled.script_us + rolled.hscan_us) as f64 / members as f64;
                figures.base_per_member_us =
                    (base.script_us + base.hscan_us) as f64 / members as f64;
                let (res_ok, res, res_base, res_beside) =
                    resummarize_round(store, members, chunk, slowlog_us, &beside).await?;
                ok &= res_ok;
                bounds.push((
                    format!(
                        "resummarize, chunk {chunk} (stage + swap and HSCAN pages vs unbounded stage + RENAME)"
                    ),
                    res,
                    res_base,
                ));
                figures
                    .bounds
                    .push(Bound::new("stage/swap", res, res_base, res_beside));
                first = Some((chunk, rolled));
            }
            Some((reference, figures)) => {
                print_ratios(
                    &format!("chunk {chunk} / chunk {reference}"),
                    &rolled,
                    figures,
                );
            }
        }
    }
    println!();
    println!(
        "== bound: script calls above 2 ms of Redis time (SLOWLOG), rollboard at the default \
         config ({EXPIRE_CALL_FIELDS} fields per expire.lua call, {STAGE_CALL_ROWS} rows per \
         stage.lua call, {TRIM_CALL_IDS} ids per trim_seen.lua call) / baseline, same run; \
         controls: calls of fixed work beside the work (see `FixedWork::beside`) and after it, as long \
         as rollboard's median (the machine's own interruptions, see `control`)"
    );
    for ((what, ours, base), bound) in bounds.iter().zip(&mut figures.bounds) {
        bound.control = control(client, &beside, ours, slowlog_us).await?;
        let (c, d) = (&bound.control, &bound.beside);
        let (p_beside, p_after) = bound.p_same();
        println!(
            "  {what}: {} of {} calls above 2 ms, longest {} µs; baseline {} of {}, longest \
             {} µs; ratio of calls above 2 ms {}, of the longest call {}; control beside {} \
             of {} above 2 ms (p50 {} µs), longest {} µs; control after {} of {} above 2 ms \
             (p50 {} µs), longest {} µs; p = {:.3} (beside) and {:.3} (after) that \
             rollboard's share of calls above 2 ms is the control's or less",
            ours.above,
            ours.count,
            ours.max,
            base.above,
            base.count,
            base.max,
            ratio(ours.above as f64, base.above as f64),
            ratio(ours.max as f64, base.max as f64),
            d.above,
            d.count,
            d.p50,
            d.max,
            c.above,
            c.count,
            c.p50,
            c.max,
            p_beside,
            p_after
        );
    }
    Ok((ok, figures))
}

/// The call bound of one kind of work: rollboard's calls, the baseline's, and the control
/// of fixed work ([`control`]), from the slow log.
#[derive(Debug)]
struct Bound {
    kind: &'static str,
    ours: Stats,
    base: Stats,
    /// The control run after the work ([`control`]).
    control: Stats,
    /// The control run beside the work ([`FixedWork::beside`]).
    beside: Stats,
}

impl Bound {
    fn new(kind: &'static str, ours: Stats, base: Stats, beside: Stats) -> Bound {
        Bound {
            kind,
            ours,
            base,
            control: Stats::default(),
            beside,
        }
    }

    /// [`p_same`] against the control beside the work, and against the one after it (1
    /// for a control that did not run).
    fn p_same(&self) -> (f64, f64) {
        let p = |control: &Stats| {
            if control.count == 0 {
                1.0
            } else {
                p_same(&self.ours, control)
            }
        };
        (p(&self.beside), p(&self.control))
    }

    /// Met: no call above 2 ms, or no more than either control's share of them as far as
    /// the test can tell (p >= 0.01 against each). The control beside the work met the
    /// same conditions but makes fewer calls; the one after it makes as many (at most
    /// 20 000) on a quieter machine: a share of calls above 2 ms that only one of them can
    /// tell from rollboard's is counted against rollboard.
    fn met(&self) -> bool {
        let (beside, after) = self.p_same();
        self.ours.above == 0 || (beside >= 0.01 && after >= 0.01)
    }
}

/// The chance of `ours` having as many calls above 2 ms as it had, or more, if its calls
/// went above 2 ms no more often than `control`'s: the one-sided binomial test of the two
/// shares, given the number of such calls in both (1 when it had none).
fn p_same(ours: &Stats, control: &Stats) -> f64 {
    let (a, b) = (ours.above, control.above);
    let (n, m) = (ours.count, control.count);
    if a == 0 {
        return 1.0;
    }
    if n + m == 0 || m == 0 {
        return 0.0;
    }
    let k = a + b;
    let q = n as f64 / (n + m) as f64;
    if q >= 1.0 {
        return 1.0;
    }
    // ln P[X = i] for X ~ Binomial(k, q), i from 0 up; the tail from `a` summed.
    let mut ln_pmf = k as f64 * (1.0 - q).ln();
    let step = (q / (1.0 - q)).ln();
    let mut tail = 0.0;
    for i in 0..=k {
        if i >= a {
            tail += ln_pmf.exp();
        }
        ln_pmf += ((k - i) as f64).ln() - ((i + 1) as f64).ln() + step;
    }
    tail.min(1.0)
}

/// Loops of the fixed work per call while calibrating it, and how many such calls.
const CALIBRATION_LOOPS: i64 = 100_000;
const CALIBRATION_CALLS: usize = 50;
/// Most calls the control after the work makes, and how many it keeps in flight.
const CONTROL_CALLS: usize = 20_000;
const CONTROL_IN_FLIGHT: usize = 16;

/// The fixed work both controls of the call bound call: a Redis function looping `n` times
/// round, touching no key and allocating nothing (called read-only, so that `INFO
/// commandstats` counts it as `fcall_ro`, apart from the work's `FCALL` and the baselines'
/// `EVALSHA`), on a connection of its own.
struct FixedWork {
    client: Client,
    /// Redis time of one loop, calibrated once.
    loop_us: f64,
}

/// The Redis function library of [`FixedWork`].
const FIXED_WORK_LIBRARY: &str = "#!lua name=rbbench\n\
    redis.register_function{function_name = 'fixed_work', flags = {'no-writes'}, \
    callback = function(keys, args) local s = 0 for i = 1, tonumber(args[1]) do \
    s = s + i % 7 end return s end}";
/// How often the control beside the work calls, and how long each of its calls lasts.
const BESIDE_EVERY: Duration = Duration::from_millis(4);
const BESIDE_CALL_US: f64 = 500.0;

impl FixedWork {
    /// Connects, loads the function and times its loop.
    async fn start(like: &Client) -> Result<FixedWork> {
        let client = Client::new(like.client_config(), None, None, None);
        client.init().await.context("connect the control")?;
        let _: Value = client
            .function_load(true, FIXED_WORK_LIBRARY)
            .await
            .context("FUNCTION LOAD")?;
        admin(&client, "CONFIG", &["RESETSTAT"]).await?;
        for _ in 0..CALIBRATION_CALLS {
            client_call(&client, CALIBRATION_LOOPS).await?;
        }
        let (calls, micros) = commandstats(&client)
            .await?
            .get("fcall_ro")
            .copied()
            .unwrap_or_default();
        let loop_us = micros as f64 / (calls.max(1) as f64 * CALIBRATION_LOOPS as f64);
        Ok(FixedWork { client, loop_us })
    }

    /// Loops per call for a call of `micros` of Redis time.
    fn loops(&self, micros: f64) -> i64 {
        ((micros / self.loop_us.max(1e-6)) as i64).max(1)
    }

    /// The control beside the work: a call of [`BESIDE_CALL_US`] every [`BESIDE_EVERY`]
    /// until `done`; returns the calls made. Unlike [`control`], run after the work, its
    /// calls meet the same conditions as the work's: the same load on the machine's cores,
    /// the same moments of the hypervisor taking the CPU away. It takes about an eighth of
    /// Redis's time.
    async fn beside(&self, done: &CancellationToken) -> Result<usize> {
        let loops = self.loops(BESIDE_CALL_US);
        let mut tick = tokio::time::interval(BESIDE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sent = 0;
        loop {
            tokio::select! {
                _ = done.cancelled() => return Ok(sent),
                _ = tick.tick() => {}
            }
            client_call(&self.client, loops).await?;
            sent += 1;
        }
    }
}

/// One call of the fixed work, `loops` times round.
async fn client_call(client: &Client, loops: i64) -> Result<()> {
    let _: i64 = client
        .fcall_ro("fixed_work", Vec::<String>::new(), vec![loops])
        .await?;
    Ok(())
}

/// The control after the work, of the machine's own calls above 2 ms: Redis times a call
/// by the clock, so its slow log also counts the time the OS or the hypervisor took the CPU
/// away from it in the middle of a call. This sends as many calls of the fixed work as
/// `like` holds (at most [`CONTROL_CALLS`]), each as long as `like`'s median; its calls
/// above 2 ms are such interruptions alone. (Measured on the reference VM: 1 to 21 of
/// 40 000 such calls of ~0.5 ms went above 2 ms, the longest 3.6 to 50 ms, also with Redis
/// at real-time priority.)
async fn control(
    client: &Client,
    fixed: &FixedWork,
    like: &Stats,
    slowlog_us: u64,
) -> Result<Stats> {
    if like.count == 0 {
        return Ok(Stats::default());
    }
    let loops = fixed.loops(like.p50 as f64);
    let count = like.count.min(CONTROL_CALLS);
    let work = async {
        for first in (0..count).step_by(CONTROL_IN_FLIGHT) {
            let batch = (first..(first + CONTROL_IN_FLIGHT).min(count))
                .map(|_| client_call(&fixed.client, loops));
            futures_util::future::try_join_all(batch).await?;
        }
        anyhow::Ok(())
    };
    let (_, m) = measure(client, slowlog_us, work).await?;
    Ok(m.fixed)
}

/// How many top-10 and rank queries the query bound sends (each).
const QUERY_CALLS: usize = 1_000;

/// Top-10 and rank queries on the filled instance, under the slow log, against the same
/// reads done with plain commands on its keys (ZREVRANGE, HGET + ZREVRANK); returns the
/// slow-log figures of both. The slow log's threshold leaves out short calls, so the counts
/// are of calls above it.
async fn query_bound(
    store: &Store,
    members: usize,
    slowlog_us: u64,
    beside: &FixedWork,
) -> Result<(Stats, Stats, Stats)> {
    let client = store.client();
    let b = board(FILLED_BOARD, 2, 2 * HOUR);
    let now = T0 + HOUR - 1;
    let work = async {
        for i in 0..QUERY_CALLS {
            store.top(&b.widest(), None, 0, 10, now).await?;
            store
                .rank(&b.widest(), None, &member_name(i * 7919 % members), now)
                .await?;
        }
        anyhow::Ok(())
    };
    let (_, m) = measure_beside(client, slowlog_us, Some(beside), work).await?;
    let ours = by_script(&m).remove("query").unwrap_or_default();
    let k = store.instance(&b.widest(), None);
    let (result, index) = (k.result(), k.members());
    let work = async {
        for i in 0..QUERY_CALLS {
            admin(client, "ZREVRANGE", &[&result, "0", "9", "WITHSCORES"]).await?;
            let name = member_name(i * 7919 % members);
            let ts = admin(client, "HGET", &[&index, &name])
                .await?
                .as_string()
                .unwrap_or_default();
            let zmember = encode_member(b.tie_break, &name, ts.parse().unwrap_or_default());
            admin(client, "ZREVRANK", &[&result, &zmember]).await?;
        }
        anyhow::Ok(())
    };
    let (_, plain) = measure(client, slowlog_us, work).await?;
    let base = Stats::of(
        plain
            .log
            .iter()
            .filter(|e| matches!(e.command.as_str(), "ZREVRANGE" | "HGET" | "ZREVRANK"))
            .map(|e| e.micros),
    );
    println!(
        "query: {QUERY_CALLS} top-10 and {QUERY_CALLS} rank calls on the {members}-member \
         instance; wall clock {:.2} s (plain commands {:.2} s)",
        m.wall.as_secs_f64(),
        plain.wall.as_secs_f64()
    );
    println!("    {}", ours.line("query.lua", members));
    println!("    {}", base.line("plain commands", members));
    Ok((ours, base, m.fixed))
}

/// The apply baseline: `fold.lua` judging each event on its own ([`apply_call`]), called
/// once per 1000-event batch (no split) on a fresh instance with `members` events; returns
/// the slow-log figures of those calls.
async fn apply_unsplit(store: &Store, members: usize, slowlog_us: u64) -> Result<Stats> {
    let client = store.client();
    let b = board("apply_unsplit", 2, 2 * HOUR);
    let k = store.instance(&b.widest(), None);
    store.load_library().await?;
    let function = rollboard::store::lua::library().function("fold.lua");
    let fingerprint = b.widest().fingerprint();
    let now = T0 + HOUR - 1;
    let work = async {
        for from in (0..members).step_by(EXPIRY_BATCH) {
            let events: Vec<ApplyEvent> = (from..(from + EXPIRY_BATCH).min(members))
                .map(event)
                .collect();
            let (keys, args) = apply_call(&b, &k, &fingerprint, &events, now, false);
            let _: Value = client.fcall(function.as_str(), keys, args).await?;
        }
        anyhow::Ok(())
    };
    let (_, m) = measure(client, slowlog_us, work).await?;
    let stats = by_script(&m).remove("apply").unwrap_or_default();
    println!(
        "apply baseline: {members} events on a fresh instance, one fold.lua call judging each \
         event of a {EXPIRY_BATCH}-event batch (no split); wall clock {:.2} s",
        m.wall.as_secs_f64()
    );
    println!("    {}", stats.line("fold.lua, each event", members));
    Ok(stats)
}

/// Slow-log figures of rollboard's function calls, per script name.
fn by_script(m: &Measured) -> BTreeMap<&'static str, Stats> {
    let names = script_names();
    let mut micros: BTreeMap<&'static str, Vec<u64>> = BTreeMap::new();
    for e in m.log.iter().filter(|e| e.is_script()) {
        let name = e.script.as_deref().and_then(|s| names.get(s).copied());
        micros
            .entry(name.unwrap_or("unknown"))
            .or_default()
            .push(e.micros);
    }
    micros
        .into_iter()
        .map(|(name, v)| (name, Stats::of(v.into_iter())))
        .collect()
}

/// Resummarizes a COPY of the filled slice on a resummarize board twice (the second run
/// replaces a ranking of every member), then the unbounded baseline on plain keys; returns
/// whether the ranking is complete and the slow-log figures of the second run's scripts and
/// of the baseline's.
async fn resummarize_round(
    store: &Store,
    members: usize,
    chunk: usize,
    slowlog_us: u64,
    beside: &FixedWork,
) -> Result<(bool, Stats, Stats, Stats)> {
    let client = store.client();
    let filled = board(FILLED_BOARD, 2, 2 * HOUR);
    let mut b = board(RESUMMARIZED_BOARD, 2, 2 * HOUR);
    b.mode = Mode::Resummarize;
    println!();
    println!(
        "-- resummarize, chunk {chunk}: a board in resummarize mode holding a COPY of the slice"
    );
    let (a, k) = (
        store.instance(&filled.widest(), None),
        store.instance(&b.widest(), None),
    );
    let n = filled.slice_of(T0);
    for (src, dst) in [
        (a.members(), k.members()),
        (a.slices(), k.slices()),
        (a.slice(n), k.slice(n)),
    ] {
        copy(client, &src, &dst).await?;
    }
    let cancel = CancellationToken::new();
    let boards = std::slice::from_ref(&b);
    let mut last = None;
    let mut summed_both = true;
    for (run, now) in [
        ("first run (no ranking yet)", T0 + HOUR - 2),
        ("second run (replaces it)", T0 + HOUR - 1),
    ] {
        // Nothing changes between the two runs, which would leave the ranking as it is:
        // without the record of the first sum the second sums and replaces it.
        let _: i64 = client.hdel(k.meta(), "summed_gen").await?;
        let job = roll::run_once(
            store,
            boards,
            roll::Job::Resummarize,
            None,
            now,
            chunk,
            &cancel,
        );
        let (reports, m) =
            measure_beside(client, slowlog_us, Some(beside), async { Ok(job.await?) }).await?;
        println!("{run}: wall clock {:.2} s", m.wall.as_secs_f64());
        if reports.first().map(|r| r.resummed) != Some(1) {
            println!("MISMATCH: the {run} did not sum the instance");
            summed_both = false;
        }
        print_calls(&m, "fcall", members);
        print_calls(&m, "hscan", members);
        print_calls(&m, "unlink", members);
        for (name, stats) in by_script(&m) {
            println!("    {}", stats.line(&format!("  {name}.lua"), members));
        }
        print_logged(&m, "UNLINK", members);
        last = Some(m);
    }
    let m = last.context("no run")?;
    let ours = Stats::of(
        m.log
            .iter()
            .filter(|e| (e.is_script() || e.command == "HSCAN") && !e.is_nested())
            .map(|e| e.micros),
    );
    let ranked = integer(client, "ZCARD", &[&k.result()]).await?;
    let scratch = admin(
        client,
        "KEYS",
        &[&format!("{}:tmp:*", k.result().trim_end_matches(":result"))],
    )
    .await?
    .into_array()
    .len();
    let ok = summed_both && ranked == members as i64 && scratch == 0;
    println!(
        "check: ZCARD result = {ranked} (expected {members}), scratch keys left {scratch} {}",
        verdict(ok)
    );

    let stage = Script::from_lua(BASELINE_STAGE);
    let swap = Script::from_lua(BASELINE_SWAP);
    stage.load(client).await?;
    swap.load(client).await?;
    write_plain(client, "ZADD", BASE_RANKING, members, 1_000, score_member).await?;
    let work = async {
        for from in (0..members).step_by(chunk) {
            let rows: Vec<Value> = (from..(from + chunk).min(members))
                .flat_map(score_member)
                .collect();
            let _: i64 = stage.evalsha(client, vec![BASE_TMP], rows).await?;
        }
        let _: Value = swap
            .evalsha(client, vec![BASE_TMP, BASE_RANKING], Vec::<Value>::new())
            .await?;
        anyhow::Ok(())
    };
    let (_, base) = measure(client, slowlog_us, work).await?;
    let shas = [
        stage.sha1().to_ascii_lowercase(),
        swap.sha1().to_ascii_lowercase(),
    ];
    let baseline = Stats::of(
        base.log
            .iter()
            .filter(|e| e.script.as_ref().is_some_and(|s| shas.contains(s)))
            .map(|e| e.micros),
    );
    let renamed = Stats::of(
        base.log
            .iter()
            .filter(|e| e.script.as_deref() == Some(shas[1].as_str()))
            .map(|e| e.micros),
    );
    println!(
        "baseline: plain ZSet, one script call per page of {chunk} rows (ZADD each), then \
         RENAME over a {members}-member ranking; wall clock {:.2} s",
        base.wall.as_secs_f64()
    );
    println!("    {}", baseline.line("EVALSHA (all)", members));
    println!("    {}", renamed.line("  RENAME call", members));
    let _: i64 = client.unlink(vec![BASE_RANKING, BASE_TMP]).await?;
    Ok((ok, ours, baseline, m.fixed))
}

/// The figures two expiry runs are compared by.
struct Figures {
    wall: Duration,
    /// Redis time of every script call (FCALL for rollboard, EVALSHA for a baseline) (commandstats), µs.
    script_us: u64,
    /// Redis time of every HSCAN call (commandstats), µs.
    hscan_us: u64,
    /// Slow-log figures of the chunk script (expire.lua or the baseline script).
    script: Stats,
    /// Slow-log figures of every script call of the round.
    all: Stats,
    /// The control run beside the round's work ([`FixedWork::beside`]).
    beside: Stats,
}

fn print_ratios(what: &str, a: &Figures, b: &Figures) {
    println!(
        "ratio {what}: script Redis time per member {} (all scripts), {} (chunk script only); \
         longest chunk-script call {}, p99 {}; wall clock {}",
        ratio(a.script_us as f64, b.script_us as f64),
        ratio(a.script.total as f64, b.script.total as f64),
        ratio(a.script.max as f64, b.script.max as f64),
        ratio(a.script.p99 as f64, b.script.p99 as f64),
        ratio(a.wall.as_secs_f64(), b.wall.as_secs_f64())
    );
}

/// Copies the filled instance, rolls the copy at `chunk`, checks and reports.
async fn roll_round(
    store: &Store,
    members: usize,
    chunk: usize,
    slowlog_us: u64,
    beside: &FixedWork,
) -> Result<(bool, Figures)> {
    let filled = board(FILLED_BOARD, 2, 2 * HOUR);
    let b = board(ROLLED_BOARD, 2, 2 * HOUR);
    println!();
    println!("-- expiry, chunk {chunk}");
    copy_instance(store, &filled, &b).await?;
    // The first roll time at which the slice at T0 has left the window.
    let now = T0 + b.window_ms;
    let cancel = CancellationToken::new();
    let boards = std::slice::from_ref(&b);
    let job = roll::run_once(store, boards, roll::Job::All, None, now, chunk, &cancel);
    let (reports, rolled) = measure_beside(store.client(), slowlog_us, Some(beside), async {
        Ok(job.await?)
    })
    .await?;
    for r in &reports {
        print_report(r, rolled.wall);
    }
    let ok = check_rolled(store, &b).await?;
    let script = report_rollboard(&rolled, members, slowlog_us);
    let all = Stats::of(
        rolled
            .log
            .iter()
            .filter(|e| (e.is_script() || e.command == "HSCAN") && !e.is_nested())
            .map(|e| e.micros),
    );
    let figures = Figures {
        wall: rolled.wall,
        script_us: rolled.calls("fcall").1,
        hscan_us: rolled.calls("hscan").1,
        script,
        all,
        beside: rolled.fixed,
    };
    Ok((ok, figures))
}

/// Fills the baseline's Hash and ZSet, expires them at `chunk`, reports and compares.
async fn baseline_round(
    store: &Store,
    members: usize,
    chunk: usize,
    slowlog_us: u64,
    rolled: &Figures,
) -> Result<(bool, Figures)> {
    let client = store.client();
    let script = Script::from_lua(BASELINE_EXPIRE);
    script.load(client).await?;
    write_plain(client, "HSET", BASE_SLICE, members, 1_000, field_amount).await?;
    write_plain(client, "ZADD", BASE_RESULT, members, 1_000, score_member).await?;
    let work = baseline_expire(store, &script, chunk);
    let (_, base) = measure(client, slowlog_us, work).await?;
    let ok = check_baseline(client).await?;
    let sha = script.sha1().to_ascii_lowercase();
    let figures = Figures {
        wall: base.wall,
        script_us: base.calls("evalsha").1,
        hscan_us: base.calls("hscan").1,
        script: report_baseline(&base, &sha, members),
        all: Stats::default(),
        beside: Stats::default(),
    };
    print_ratios("rollboard / baseline", rolled, &figures);
    Ok((ok, figures))
}

/// Runs `work` with fresh command statistics and slow log; returns its output and figures.
async fn measure<T>(
    client: &Client,
    slowlog_us: u64,
    work: impl Future<Output = Result<T>>,
) -> Result<(T, Measured)> {
    measure_beside(client, slowlog_us, None, work).await
}

/// [`measure`], with the control `beside` (if any) calling its fixed work all the while.
/// Calls of the fixed work (this control's or [`control`]'s) are left out of the returned
/// slow log and counted in [`Measured::fixed`].
async fn measure_beside<T>(
    client: &Client,
    slowlog_us: u64,
    beside: Option<&FixedWork>,
    work: impl Future<Output = Result<T>>,
) -> Result<(T, Measured)> {
    slowlog_start(client, slowlog_us)
        .await
        .map_err(anyhow::Error::msg)?;
    admin(client, "CONFIG", &["RESETSTAT"]).await?;
    let cpu = CpuTimes::of(client).await?;
    let start = Instant::now();
    let done = CancellationToken::new();
    let work = async {
        let out = work.await;
        done.cancel();
        out
    };
    let control = async {
        match beside {
            Some(b) => b.beside(&done).await,
            None => Ok(0),
        }
    };
    let (out, sent) = tokio::join!(work, control);
    let (out, sent) = (out?, sent?);
    let wall = start.elapsed();
    if let (Some(before), Some(after)) = (cpu, CpuTimes::of(client).await?) {
        println!("    {}", before.until(&after));
    }
    let calls = commandstats(client).await?;
    let log = slowlog_take(client).await.map_err(anyhow::Error::msg)?;
    let log_full = log.len() >= SLOWLOG_MAX_LEN;
    let (controls, log): (Vec<SlowEntry>, Vec<SlowEntry>) = log
        .into_iter()
        .filter(|e| !e.is_admin())
        .partition(|e| e.command == "FCALL_RO");
    let mut fixed = Stats::of(controls.iter().map(|e| e.micros));
    if sent > 0 {
        println!(
            "    control beside the work: {sent} calls of fixed work, {} above 2 ms, longest {} µs, p50 {} µs",
            fixed.above, fixed.max, fixed.p50
        );
        fixed.count = sent;
    }
    Ok((
        out,
        Measured {
            wall,
            calls,
            log,
            log_full,
            fixed,
        },
    ))
}

/// Where the time of Redis's main thread went, from the kernel: how long it ran and how long
/// it was ready to run but waited for a core (`/proc/<pid>/schedstat`, ns), and the time the
/// hypervisor took from the whole VM (`steal` of `/proc/stat`, in clock ticks). A call that
/// waited for a core, or lost it to the hypervisor, shows that wait in the slow log.
struct CpuTimes {
    ran_ns: u64,
    waited_ns: u64,
    steal_ticks: u64,
}

impl CpuTimes {
    /// The figures now, or `None` where `/proc` does not have them (not Linux, or the server
    /// runs elsewhere).
    async fn of(client: &Client) -> Result<Option<CpuTimes>> {
        let server = info(client, "server").await?;
        let Some(pid) = server
            .lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .map(|v| v.trim().to_string())
        else {
            return Ok(None);
        };
        let Ok(sched) = std::fs::read_to_string(format!("/proc/{pid}/schedstat")) else {
            return Ok(None);
        };
        let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
            return Ok(None);
        };
        let sched: Vec<u64> = sched
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        // `cpu  user nice system idle iowait irq softirq steal ...`
        let steal = stat
            .lines()
            .next()
            .and_then(|l| l.split_whitespace().nth(8))
            .and_then(|v| v.parse().ok());
        Ok(match (sched.as_slice(), steal) {
            ([ran, waited, ..], Some(steal)) => Some(CpuTimes {
                ran_ns: *ran,
                waited_ns: *waited,
                steal_ticks: steal,
            }),
            _ => None,
        })
    }

    /// One line on what happened between `self` and `later`.
    fn until(&self, later: &CpuTimes) -> String {
        let ran = later.ran_ns.saturating_sub(self.ran_ns) as f64 / 1e9;
        let waited = later.waited_ns.saturating_sub(self.waited_ns) as f64 / 1e9;
        // USER_HZ is 100 on Linux.
        let steal = later.steal_ticks.saturating_sub(self.steal_ticks) as f64 / 100.0;
        format!(
            "cpu: redis-server's main thread ran {ran:.2} s and waited {waited:.2} s for a core \
             ({:.1}% of its run time); the hypervisor stole {steal:.2} s from the VM",
            if ran > 0.0 { 100.0 * waited / ran } else { 0.0 }
        )
    }
}

/// Copies every key of the `from` instance onto the `to` instance.
async fn copy_instance(store: &Store, from: &Board, to: &Board) -> Result<()> {
    let (a, b) = (
        store.instance(&from.widest(), None),
        store.instance(&to.widest(), None),
    );
    let n = from.slice_of(T0);
    let pairs = [
        (a.meta(), b.meta()),
        (a.result(), b.result()),
        (a.members(), b.members()),
        (a.slices(), b.slices()),
        (a.seen_table(), b.seen_table()),
        (a.seen_log(n), b.seen_log(n)),
        (a.slice(n), b.slice(n)),
    ];
    for (src, dst) in &pairs {
        copy(store.client(), src, dst).await?;
    }
    Ok(())
}

async fn copy(client: &Client, src: &str, dst: &str) -> Result<()> {
    if integer(client, "COPY", &[src, dst, "REPLACE"]).await? != 1 {
        bail!("COPY {src} {dst}: no such key");
    }
    Ok(())
}

fn print_report(r: &Report, wall: Duration) {
    println!(
        "roll: wall clock {:.2} s; slices_expired {}, fields_expired {}, members_removed {}, \
         ids_forgotten {}",
        wall.as_secs_f64(),
        r.slices_expired,
        r.fields_expired,
        r.members_removed,
        r.ids_forgotten
    );
}

async fn check_rolled(store: &Store, b: &Board) -> Result<bool> {
    let client = store.client();
    let k = store.instance(&b.widest(), None);
    let result = integer(client, "ZCARD", &[&k.result()]).await?;
    let members = integer(client, "HLEN", &[&k.members()]).await?;
    let slice = integer(client, "EXISTS", &[&k.slice(b.slice_of(T0))]).await?;
    let seen: i64 = client
        .hget::<Option<i64>, _, _>(k.seen_table(), "#n")
        .await?
        .unwrap_or(0);
    let log = integer(client, "EXISTS", &[&k.seen_log(b.slice_of(T0))]).await?;
    let ok = result == 0 && members == 0 && slice == 0 && seen == 0 && log == 0;
    println!(
        "check after roll: ZCARD result = {result}, HLEN members = {members}, \
         EXISTS slice = {slice}, seen #n = {seen}, EXISTS seen log = {log} {}",
        verdict(ok)
    );
    Ok(ok)
}

async fn check_baseline(client: &Client) -> Result<bool> {
    let result = integer(client, "ZCARD", &[BASE_RESULT]).await?;
    let slice = integer(client, "EXISTS", &[BASE_SLICE]).await?;
    let ok = result == 0 && slice == 0;
    if !ok {
        println!("check baseline: ZCARD = {result}, EXISTS slice = {slice} MISMATCH");
    }
    Ok(ok)
}

/// The baseline roll: HSCAN the plain Hash and expire each page with one script call,
/// until the Hash is gone (as rollboard does).
async fn baseline_expire(store: &Store, script: &Script, chunk: usize) -> Result<()> {
    let client = store.client();
    while integer(client, "EXISTS", &[BASE_SLICE]).await? == 1 {
        let mut cursor = "0".to_string();
        loop {
            let (next, page) = store.scan("HSCAN", BASE_SLICE, &cursor, chunk).await?;
            if !page.is_empty() {
                let fields: Vec<Value> = page.into_iter().map(|(f, _)| f.into()).collect();
                let _: i64 = script
                    .evalsha(client, vec![BASE_RESULT, BASE_SLICE], fields)
                    .await?;
            }
            if next == "0" {
                break;
            }
            cursor = next;
        }
    }
    Ok(())
}

/// Prints rollboard's figures of one round; returns the slow-log figures of expire.lua.
fn report_rollboard(m: &Measured, members: usize, slowlog_us: u64) -> Stats {
    println!("  INFO commandstats:");
    print_calls(m, "fcall", members);
    print_calls(m, "hscan", members);
    println!("  slow log (threshold {slowlog_us} µs):");
    let names = script_names();
    let mut by_script: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for e in m.log.iter().filter(|e| e.is_script()) {
        let name = e.script.as_deref().and_then(|s| names.get(s).copied());
        by_script
            .entry(name.unwrap_or("unknown"))
            .or_default()
            .push(e.micros);
    }
    let all = Stats::of(by_script.values().flatten().copied());
    println!("    {}", all.line("FCALL (all)", members));
    for (name, micros) in &by_script {
        let stats = Stats::of(micros.iter().copied());
        println!("    {}", stats.line(&format!("  {name}.lua"), members));
    }
    print_logged(m, "HSCAN", members);
    print_capture(m, all.count);
    by_script
        .get("expire")
        .map(|m| Stats::of(m.iter().copied()))
        .unwrap_or_default()
}

/// Prints the baseline's figures of one round; returns the slow-log figures of its script.
fn report_baseline(m: &Measured, sha: &str, members: usize) -> Stats {
    println!(
        "baseline: plain Hash -> plain ZSet, HSCAN + one script per page (HGET, ZINCRBY, \
         ZREM at 0, HDEL); wall clock {:.2} s",
        m.wall.as_secs_f64()
    );
    println!("  INFO commandstats:");
    print_calls(m, "evalsha", members);
    print_calls(m, "hscan", members);
    println!("  slow log:");
    let script = Stats::of(
        m.log
            .iter()
            .filter(|e| e.script.as_deref() == Some(sha))
            .map(|e| e.micros),
    );
    println!("    {}", script.line("EVALSHA", members));
    print_logged(m, "HSCAN", members);
    print_capture(m, script.count);
    script
}

fn print_calls(m: &Measured, command: &str, members: usize) {
    let (calls, micros) = m.calls(command);
    println!(
        "    {:<17} calls {calls:>7}  total {:>9.1} ms  mean {:>7.1} µs  per member {:.3} µs",
        command.to_ascii_uppercase(),
        micros as f64 / 1_000.0,
        micros as f64 / calls.max(1) as f64,
        micros as f64 / members as f64
    );
}

fn print_logged(m: &Measured, command: &str, members: usize) {
    let stats = Stats::of(
        m.log
            .iter()
            .filter(|e| e.command == command)
            .map(|e| e.micros),
    );
    println!("    {}", stats.line(command, members));
}

/// Says how many of the script calls (EVALSHA, FCALL) the slow log caught, and whether it overflowed.
fn print_capture(m: &Measured, logged: usize) {
    let calls = m.calls("evalsha").0 + m.calls("fcall").0;
    let nested = m.log.iter().filter(|e| e.is_nested()).count();
    println!(
        "    slow log caught {logged} of {calls} script calls and {nested} commands run inside scripts{}",
        if m.log_full {
            "; it is FULL, so the oldest entries are lost"
        } else {
            ""
        }
    );
}

fn script_names() -> BTreeMap<String, &'static str> {
    let library = rollboard::store::lua::library();
    SCRIPTS
        .iter()
        .map(|(name, file)| (library.function(file), *name))
        .collect()
}

// ---------------------------------------------------------------------------------------
// Slow log

/// Count and distribution of durations in µs.
#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    count: usize,
    /// Calls longer than [`BOUND_US`].
    above: usize,
    max: u64,
    p50: u64,
    p99: u64,
    total: u64,
}

impl Stats {
    fn of(micros: impl Iterator<Item = u64>) -> Stats {
        let mut v: Vec<u64> = micros.collect();
        if v.is_empty() {
            return Stats::default();
        }
        v.sort_unstable();
        Stats {
            count: v.len(),
            above: v.iter().filter(|&&us| us > BOUND_US).count(),
            max: v[v.len() - 1],
            p50: percentile(&v, 0.50),
            p99: percentile(&v, 0.99),
            total: v.iter().sum(),
        }
    }

    /// One line: label, count, calls above 2 ms, longest, p50, p99, total and total per
    /// member.
    fn line(&self, label: &str, members: usize) -> String {
        format!(
            "{label:<17} count {:>7}  > 2 ms {:>5}  max {:>7} µs  p50 {:>6} µs  p99 {:>7} µs  \
             total {:>9.1} ms  per member {:.3} µs",
            self.count,
            self.above,
            self.max,
            self.p50,
            self.p99,
            self.total as f64 / 1_000.0,
            self.total as f64 / members as f64
        )
    }
}

/// Nearest-rank percentile of sorted, non-empty `v`.
fn percentile(v: &[u64], q: f64) -> u64 {
    let rank = (q * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}
