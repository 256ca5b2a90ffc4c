//! Benchmarks of DESIGN.md section 7 (memory and expiry) against a private `redis-server`.
//!
//! Run with `cargo bench --bench rollboard -- [memory] [expiry] [--chunk N[,N...]] [--members N]`
//! (no scenario: both).
//!
//! * `memory`: applies 100 000 distinct members (one event each, batches of 500) to an
//!   incremental, earliest-tie-break board (slice 1h, window 7d) and reports Redis bytes per
//!   ranked member from the `used_memory` delta of `INFO memory`, broken down by key with
//!   `MEMORY USAGE <key> SAMPLES 0`, plus bytes per remembered idempotency key. Baseline: a
//!   plain ZSet of the same names and scores written with `ZADD`.
//! * `expiry`: fills one slice with 1 000 000 members (slice 1h, window 2h), rolls it away
//!   with `roll::run_once` and reads every command's Redis execution time from the slow log
//!   (threshold 0): count, longest call, p50/p99 and total of the `EVALSHA` calls, Redis time
//!   per expired member, and the wall-clock roll time; once per chunk size (default 1000, 100
//!   and 5000; `--chunk` replaces the list). Baseline: the least work a chunked expiry can do,
//!   on a plain Hash and a plain ZSet of the same members (HSCAN, then one script per chunk
//!   doing `HGET`, `ZINCRBY`, `ZREM` at 0 and `HDEL`).
//!
//! `--members N` replaces the member count of the scenarios that run. Nothing about timing
//! is asserted: results are plain text lines, with ratios against the baseline of the same
//! run. The only exit-status failures are errors and wrong data (a roll that leaves members).
//!
//! The server listens on 127.0.0.1 only, on a free port, without persistence, with its
//! working directory in a temporary directory; it is killed when the program ends, also on
//! error or panic.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use fred::prelude::*;
use fred::types::scripts::Script;
use fred::types::{ClusterHash, CustomCommand};
use rollboard::board::{Board, Dedup, Mode, TieBreak};
use rollboard::roll;
use rollboard::store::{ApplyEvent, Outcome, Reconnect, Store};
use tokio_util::sync::CancellationToken;

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;
/// Start of the slice every event falls into (an hour boundary in November 2025).
const T0: i64 = 1_763_700_000_000 / HOUR * HOUR;
const MEMORY_MEMBERS: usize = 100_000;
const MEMORY_BATCH: usize = 500;
const EXPIRY_MEMBERS: usize = 1_000_000;
const EXPIRY_BATCH: usize = 1_000;
const DEFAULT_CHUNKS: [usize; 3] = [1_000, 100, 5_000];
const PLAIN_ZSET: &str = "plain:zset";
const BASE_RESULT: &str = "base:{x}:result";
const BASE_SLICE: &str = "base:{x}:slice";
const SLOWLOG_NOTE: &str = "slow log at threshold 0 records every command, which costs some \
     time per command; durations are Redis execution time only, in µs";

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

/// rollboard's scripts by SHA1, to tell the slow-log entries apart.
const SCRIPTS: [(&str, &str); 9] = [
    ("apply", include_str!("../src/lua/apply.lua")),
    ("watermark", include_str!("../src/lua/watermark.lua")),
    ("expire", include_str!("../src/lua/expire.lua")),
    ("drop_slice", include_str!("../src/lua/drop_slice.lua")),
    ("trim_seen", include_str!("../src/lua/trim_seen.lua")),
    ("query", include_str!("../src/lua/query.lua")),
    ("stage", include_str!("../src/lua/stage.lua")),
    ("swap", include_str!("../src/lua/swap.lua")),
    ("cleanup", include_str!("../src/lua/cleanup.lua")),
];

fn main() -> ExitCode {
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

const USAGE: &str =
    "usage: cargo bench --bench rollboard -- [memory] [expiry] [--chunk N[,N...]] [--members N]";

/// Command-line options.
#[derive(Debug)]
struct Options {
    memory: bool,
    expiry: bool,
    chunks: Vec<usize>,
    members: Option<usize>,
}

impl Options {
    fn parse(args: impl Iterator<Item = String>) -> Result<Options> {
        let mut options = Options {
            memory: false,
            expiry: false,
            chunks: Vec::new(),
            members: None,
        };
        let mut args = args.peekable();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                // cargo passes `--bench` to every harness-less bench.
                "--bench" => {}
                "memory" => options.memory = true,
                "expiry" => options.expiry = true,
                "--chunk" => {
                    let list = args.next().context("--chunk needs a value")?;
                    for n in list.split(',') {
                        options.chunks.push(positive(n, "--chunk")?);
                    }
                }
                "--members" => {
                    let n = args.next().context("--members needs a value")?;
                    options.members = Some(positive(&n, "--members")?);
                }
                other => bail!("unknown argument {other:?}"),
            }
        }
        if !options.memory && !options.expiry {
            options.memory = true;
            options.expiry = true;
        }
        if options.chunks.is_empty() {
            options.chunks = DEFAULT_CHUNKS.to_vec();
        }
        Ok(options)
    }
}

fn positive(text: &str, what: &str) -> Result<usize> {
    match text.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => bail!("{what} takes a positive integer, not {text:?}"),
    }
}

/// Runs the selected scenarios; false when a correctness check failed.
fn run(options: &Options) -> Result<bool> {
    let server = RedisServer::start()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let ok = runtime.block_on(async {
        let store = Store::connect(&server.url(), "rb", 2, Reconnect::Never)
            .await
            .context("connect to the bench redis-server")?;
        println!(
            "redis-server {} on 127.0.0.1:{}",
            server.version(),
            server.port
        );
        let mut ok = true;
        if options.memory {
            ok &= memory(&store, options.members.unwrap_or(MEMORY_MEMBERS)).await?;
        }
        if options.expiry {
            let members = options.members.unwrap_or(EXPIRY_MEMBERS);
            for &chunk in &options.chunks {
                ok &= expiry(&store, members, chunk).await?;
            }
        }
        anyhow::Ok(ok)
    })?;
    drop(server);
    Ok(ok)
}

// ---------------------------------------------------------------------------------------
// The private redis-server

/// A `redis-server` child on a free loopback port; killed on drop.
struct RedisServer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    fn start() -> Result<RedisServer> {
        for _ in 0..20 {
            let dir = tempfile::tempdir().context("temp dir")?;
            let port = free_port()?;
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("start redis-server (is it installed?)")?;
            let mut server = RedisServer {
                child,
                port,
                _dir: dir,
            };
            if server.wait_ready(Duration::from_secs(5)) {
                return Ok(server);
            }
            // The port was taken between probing and binding: try another one.
            server.kill();
        }
        bail!("could not start redis-server")
    }

    fn wait_ready(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if ping(self.port) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn version(&self) -> String {
        Command::new("redis-server")
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("probe a free port")?;
    Ok(listener.local_addr()?.port())
}

/// Whether a server on the loopback `port` answers `PING`.
fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let mut reply = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG\r\n"
}

// ---------------------------------------------------------------------------------------
// Redis helpers

/// Sends one command that fred has no typed method for.
async fn command(client: &Client, name: &'static str, args: Vec<Value>) -> Result<Value> {
    let hash = match name {
        "ZADD" | "HSET" | "ZCARD" | "HLEN" | "EXISTS" => ClusterHash::FirstKey,
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

async fn used_memory(client: &Client) -> Result<i64> {
    let info = admin(client, "INFO", &["memory"]).await?;
    let text = info.as_str_lossy().unwrap_or_default().into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .context("INFO memory has no used_memory")
}

async fn memory_usage(client: &Client, key: &str) -> Result<i64> {
    let v = admin(client, "MEMORY", &["USAGE", key, "SAMPLES", "0"]).await?;
    Ok(v.as_i64().unwrap_or(0))
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
        slice_ms: window_ms / n,
        mode: Mode::Incremental,
        tie_break: TieBreak::Earliest,
        allow_negative: false,
        dedup: Dedup::Window,
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

/// Applies events `0..members` in batches, all inside the slice at [`T0`]; returns the time.
async fn apply_all(store: &Store, board: &Board, members: usize, batch: usize) -> Result<Duration> {
    let now = T0 + HOUR - 1;
    let start = Instant::now();
    for from in (0..members).step_by(batch) {
        let events: Vec<ApplyEvent> = (from..(from + batch).min(members)).map(event).collect();
        let outcomes = store.apply(board, None, &events, now).await?;
        if let Some(o) = outcomes.iter().find(|o| **o != Outcome::Applied) {
            bail!("event of batch at {from} was not applied: {o:?}");
        }
    }
    Ok(start.elapsed())
}

/// Writes `pairs(from, to)` for `0..members` with `name key pair...` in batches.
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

// ---------------------------------------------------------------------------------------
// Scenario: memory

async fn memory(store: &Store, members: usize) -> Result<bool> {
    let client = store.client();
    let b = board("mem_7d", 7 * 24, 7 * DAY);
    println!();
    println!(
        "== memory: {members} members, one event each, batches of {MEMORY_BATCH}; \
         board slice 1h window 7d, incremental, tie-break earliest"
    );
    println!(
        "   member names like {:?} ({} B), idempotency keys like {:?} ({} B)",
        member_name(0),
        member_name(0).len(),
        event(0).id,
        event(0).id.len()
    );
    admin(client, "FLUSHALL", &["SYNC"]).await?;
    store.load_scripts().await?;
    let before = used_memory(client).await?;
    let took = apply_all(store, &b, members, MEMORY_BATCH).await?;
    let after = used_memory(client).await?;
    println!(
        "apply: {:.2} s, {:.0} events/s",
        took.as_secs_f64(),
        members as f64 / took.as_secs_f64()
    );
    let k = store.instance(&b, None);
    let keys = [
        ("result ZSet", k.result()),
        ("members Hash", k.members()),
        ("slice Hash", k.slice(b.slice_of(T0))),
        ("seen ZSet", k.seen()),
        ("meta Hash", k.meta()),
        ("slices ZSet", k.slices()),
    ];
    let ranked = integer(client, "ZCARD", &[&k.result()]).await?;
    let seen = integer(client, "ZCARD", &[&k.seen()]).await?;
    let ok = ranked == members as i64;
    println!(
        "check: ZCARD result = {ranked} (expected {members}) {}",
        verdict(ok)
    );
    let per = |bytes: i64| bytes as f64 / members as f64;
    println!(
        "used_memory: before {before} B, after {after} B, delta {} B = {:.1} B per ranked member",
        after - before,
        per(after - before)
    );
    println!("MEMORY USAGE <key> SAMPLES 0:");
    let mut sum = 0;
    let mut seen_bytes = 0;
    for (label, key) in &keys {
        let bytes = memory_usage(client, key).await?;
        println!("  {label:<13} {bytes:>11} B  {:>7.1} B/member", per(bytes));
        sum += bytes;
        if key == &k.seen() {
            seen_bytes = bytes;
        }
    }
    println!("  {:<13} {sum:>11} B  {:>7.1} B/member", "sum", per(sum));
    println!(
        "  {:<13} {:>11} B  {:>7.1} B/member",
        "sum w/o seen",
        sum - seen_bytes,
        per(sum - seen_bytes)
    );
    println!(
        "idempotency: {seen} keys remembered, {:.1} B per key (seen ZSet MEMORY USAGE / ZCARD)",
        seen_bytes as f64 / seen.max(1) as f64
    );
    let (plain_delta, plain_usage) = plain_zset(client, members).await?;
    println!(
        "baseline plain ZSet ({members} ZADDs of the same names and scores, no tie-break): \
         MEMORY USAGE {plain_usage} B = {:.1} B/member; used_memory delta {plain_delta} B = {:.1} B/member",
        per(plain_usage),
        per(plain_delta)
    );
    println!(
        "ratio rollboard / plain ZSet: {:.2}x by used_memory delta, {:.2}x by MEMORY USAGE; \
         without the seen ZSet {:.2}x by MEMORY USAGE",
        ratio(after - before, plain_delta),
        ratio(sum, plain_usage),
        ratio(sum - seen_bytes, plain_usage)
    );
    Ok(ok)
}

/// Writes the baseline ZSet; returns its used_memory delta and MEMORY USAGE.
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

fn ratio(a: i64, b: i64) -> f64 {
    a as f64 / b as f64
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "ok"
    } else {
        "MISMATCH"
    }
}

// ---------------------------------------------------------------------------------------
// Scenario: expiry

async fn expiry(store: &Store, members: usize, chunk: usize) -> Result<bool> {
    let client = store.client();
    let b = board("exp_2h", 2, 2 * HOUR);
    println!();
    println!(
        "== expiry: {members} members in one slice (board slice 1h window 2h, incremental, \
         tie-break earliest), chunk {chunk}"
    );
    admin(client, "FLUSHALL", &["SYNC"]).await?;
    store.load_scripts().await?;
    let base_script = Script::from_lua(BASELINE_EXPIRE);
    base_script.load(client).await?;
    let took = apply_all(store, &b, members, EXPIRY_BATCH).await?;
    println!(
        "fill: {members} events in batches of {EXPIRY_BATCH}: {:.1} s, {:.0} events/s",
        took.as_secs_f64(),
        members as f64 / took.as_secs_f64()
    );
    write_plain(client, "HSET", BASE_SLICE, members, 1_000, field_amount).await?;
    write_plain(client, "ZADD", BASE_RESULT, members, 1_000, score_member).await?;

    // The first roll time at which the slice at T0 is out of the window.
    let now = T0 + b.window_ms;
    slowlog_start(client).await?;
    let start = Instant::now();
    let reports = roll::run_once(
        store,
        std::slice::from_ref(&b),
        roll::Job::All,
        None,
        now,
        chunk,
        &CancellationToken::new(),
    )
    .await?;
    let wall = start.elapsed();
    let log = slowlog_take(client).await?;
    for r in &reports {
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
    let ok = check_empty(store, &b).await?;
    println!("slow log: {SLOWLOG_NOTE}");
    let scripts = script_names();
    let evalsha = report_roll(&log, &scripts, members);

    slowlog_start(client).await?;
    let start = Instant::now();
    baseline_expire(store, &base_script, chunk).await?;
    let base_wall = start.elapsed();
    let base_log = slowlog_take(client).await?;
    let base_ok = check_baseline_empty(client).await?;
    let base_sha = base_script.sha1().to_ascii_lowercase();
    let base = Stats::of(
        base_log
            .iter()
            .filter(|e| e.sha.as_deref() == Some(base_sha.as_str()))
            .map(|e| e.micros),
    );
    let hscan = Stats::of(
        base_log
            .iter()
            .filter(|e| e.command == "HSCAN")
            .map(|e| e.micros),
    );
    println!(
        "baseline: plain Hash -> plain ZSet, HSCAN COUNT {chunk} + one script per chunk \
         (HGET, ZINCRBY, ZREM at 0, HDEL); wall clock {:.2} s",
        base_wall.as_secs_f64()
    );
    println!("  {}", base.line("EVALSHA", members));
    println!("  {}", hscan.line("HSCAN", members));
    let expire = &evalsha.expire;
    println!(
        "ratio rollboard expire.lua / baseline script: {:.2}x Redis time per member, \
         {:.2}x longest call, {:.2}x p99; roll wall clock / baseline wall clock {:.2}x",
        ratio(expire.total as i64, base.total as i64),
        ratio(expire.max as i64, base.max as i64),
        ratio(expire.p99 as i64, base.p99 as i64),
        wall.as_secs_f64() / base_wall.as_secs_f64()
    );
    println!(
        "ratio rollboard EVALSHA all / baseline script: {:.2}x Redis time per member",
        ratio(evalsha.all.total as i64, base.total as i64)
    );
    Ok(ok && base_ok)
}

async fn check_empty(store: &Store, b: &Board) -> Result<bool> {
    let client = store.client();
    let k = store.instance(b, None);
    let result = integer(client, "ZCARD", &[&k.result()]).await?;
    let members = integer(client, "HLEN", &[&k.members()]).await?;
    let slice = integer(client, "EXISTS", &[&k.slice(b.slice_of(T0))]).await?;
    let seen = integer(client, "ZCARD", &[&k.seen()]).await?;
    let ok = result == 0 && members == 0 && slice == 0 && seen == 0;
    println!(
        "check after roll: ZCARD result = {result}, HLEN members = {members}, \
         EXISTS slice = {slice}, ZCARD seen = {seen} {}",
        verdict(ok)
    );
    Ok(ok)
}

async fn check_baseline_empty(client: &Client) -> Result<bool> {
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

/// The EVALSHA figures of one roll.
struct RollStats {
    all: Stats,
    expire: Stats,
}

/// Prints the slow-log figures of the roll, by command and by script.
fn report_roll(log: &[SlowEntry], scripts: &BTreeMap<String, &str>, members: usize) -> RollStats {
    let name_of = |e: &SlowEntry| {
        e.sha
            .as_deref()
            .and_then(|s| scripts.get(s).copied())
            .unwrap_or("unknown")
    };
    let evalsha: Vec<&SlowEntry> = log.iter().filter(|e| e.command == "EVALSHA").collect();
    let all = Stats::of(evalsha.iter().map(|e| e.micros));
    println!("  {}", all.line("EVALSHA (all)", members));
    let mut by_script: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for e in &evalsha {
        by_script.entry(name_of(e)).or_default().push(e.micros);
    }
    for (name, micros) in &by_script {
        let label = format!("  {name}.lua");
        println!(
            "  {}",
            Stats::of(micros.iter().copied()).line(&label, members)
        );
    }
    let mut others: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for e in log.iter().filter(|e| e.command != "EVALSHA") {
        others.entry(e.command.as_str()).or_default().push(e.micros);
    }
    for (command, micros) in &others {
        println!(
            "  {}",
            Stats::of(micros.iter().copied()).line(command, members)
        );
    }
    let total = Stats::of(log.iter().map(|e| e.micros));
    println!("  {}", total.line("all commands", members));
    let expire = by_script
        .get("expire")
        .map(|m| Stats::of(m.iter().copied()))
        .unwrap_or_default();
    RollStats { all, expire }
}

fn script_names() -> BTreeMap<String, &'static str> {
    SCRIPTS
        .iter()
        .map(|(name, lua)| (fred::util::sha1_hash(lua), *name))
        .collect()
}

// ---------------------------------------------------------------------------------------
// Slow log

/// One slow-log entry: the command (upper case), the script SHA of an EVALSHA, the time.
struct SlowEntry {
    command: String,
    sha: Option<String>,
    micros: u64,
}

/// Logs every command from now on, into an emptied slow log.
async fn slowlog_start(client: &Client) -> Result<()> {
    admin(client, "CONFIG", &["SET", "slowlog-max-len", "1000000"]).await?;
    admin(client, "CONFIG", &["SET", "slowlog-log-slower-than", "0"]).await?;
    admin(client, "SLOWLOG", &["RESET"]).await?;
    Ok(())
}

/// Stops logging and returns the entries logged since [`slowlog_start`], oldest first,
/// without the slow-log and config commands themselves.
async fn slowlog_take(client: &Client) -> Result<Vec<SlowEntry>> {
    let raw = admin(client, "SLOWLOG", &["GET", "-1"]).await?;
    admin(client, "CONFIG", &["SET", "slowlog-log-slower-than", "-1"]).await?;
    admin(client, "SLOWLOG", &["RESET"]).await?;
    let mut entries = Vec::new();
    for entry in raw.into_array().into_iter().rev() {
        let e = slow_entry(entry)?;
        if e.command != "SLOWLOG" && e.command != "CONFIG" {
            entries.push(e);
        }
    }
    Ok(entries)
}

/// Decodes `[id, timestamp, duration µs, [argv...], client, name]`.
fn slow_entry(entry: Value) -> Result<SlowEntry> {
    let mut fields = entry.into_array().into_iter();
    let micros = fields
        .nth(2)
        .and_then(|d| d.as_u64())
        .context("slow-log entry without a duration")?;
    let argv = fields.next().map(Value::into_array).unwrap_or_default();
    let text = |i: usize| argv.get(i).and_then(Value::as_string);
    let command = text(0).unwrap_or_default().to_ascii_uppercase();
    let sha = (command == "EVALSHA")
        .then(|| text(1).map(|s| s.to_ascii_lowercase()))
        .flatten();
    Ok(SlowEntry {
        command,
        sha,
        micros,
    })
}

/// Count and distribution of durations in µs.
#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    count: usize,
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
            max: v[v.len() - 1],
            p50: percentile(&v, 0.50),
            p99: percentile(&v, 0.99),
            total: v.iter().sum(),
        }
    }

    /// One line: `label count max p50 p99 total per-member`.
    fn line(&self, label: &str, members: usize) -> String {
        format!(
            "{label:<17} count {:>7}  max {:>7} µs  p50 {:>6} µs  p99 {:>7} µs  \
             total {:>9.1} ms  per expired member {:.3} µs",
            self.count,
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
