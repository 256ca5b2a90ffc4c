//! Soak: the release daemon under steady load for a bounded time, with minute-sized slices
//! rolled every minute, checking that nothing grows once the window is full.
//!
//! ```sh
//! cargo bench --bench soak -- --minutes 10              # half the measured maximum rate
//! cargo bench --bench soak -- --minutes 6 --rate 2000   # a fixed rate (events/s)
//! ```
//!
//! It starts a redis-server and `rollboard run` (one board: a 3-minute window of 1-minute
//! slices, `schedule.roll` every minute), measures the daemon's maximum drain rate with a
//! 30 000-event burst unless `--rate` is given, then sends events at the chosen rate (every
//! 20th one sent a second time with the same `id`, as a producer's retry would) and samples
//! every 10 s: daemon RSS, Redis `used_memory`, remembered idempotency keys, pending
//! entries, consumer lag, dead letters and the intake stream's length. The producer sets no
//! cap on the stream: the daemon trims it (`ingest.retain` of acked history, the default). At the end it stops sending, waits for the group to
//! drain and checks every live slice against a model of the events sent, runs
//! `rollboard verify`, prints the samples and the verdicts, and exits non-zero when one fails.
//!
//! Verdicts ("steady" = from one slice after the window is first full, when a roll has
//! expired a first slice; first and last steady minute each span one roll):
//! * daemon RSS and Redis `used_memory`: the last steady minute's maximum within +15 % of the
//!   first steady minute's;
//! * idempotency keys: at most the events sent in window + 2 slices (what one roll period can
//!   hold), and flat as above;
//! * pending entries at most two batches at every steady sample, none at the end; lag in
//!   the last minute at most 5 s of events;
//! * the intake stream at most the events of `ingest.retain` plus 10 s (the trim runs every
//!   2 s; `~` trims whole nodes) at every steady sample;
//! * no dead letter, every live slice equal to the model (nothing lost, nothing doubled),
//!   `rollboard verify` passes, and the sender kept 95 % of the rate.

mod support;

use std::collections::HashMap;
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fred::prelude::*;
use rollboard::domain::keys::Keys;
use support::{invoked_by_cargo_bench, Daemon, RedisServer};

const PREFIX: &str = "soak";
const STREAM: &str = "soak:events";
const DEAD: &str = "soak:events:dead";
const GROUP: &str = "rollboard";
const BOARD: &str = "rooms";
const SLICE_MS: i64 = 60_000;
const WINDOW_SLICES: i64 = 3;
const BATCH: u64 = 500;
const MEMBERS: u64 = 1_000;
const BURST: u64 = 30_000;
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
const TICK: Duration = Duration::from_millis(100);
/// Every N-th event is sent twice (same `id`, a new stream entry).
const RETRY_EVERY: u64 = 20;
/// `ingest.retain` of the daemon (the default): acked history the stream keeps.
const RETAIN_S: u64 = 60;
/// Allowed growth of a memory figure from the first to the last steady minute.
const FLAT_TOLERANCE: f64 = 0.15;

type Result<T> = std::result::Result<T, String>;

/// Events sent, per slice and member: what the board must hold.
type Model = HashMap<i64, HashMap<String, i64>>;

struct Args {
    minutes: u64,
    rate: Option<u64>,
}

fn args() -> Result<Args> {
    let mut args = Args {
        minutes: 10,
        rate: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut number = |name: &str| -> Result<u64> {
            it.next()
                .and_then(|v| v.parse().ok())
                .filter(|&v| v > 0)
                .ok_or(format!("{name} needs a positive integer"))
        };
        match arg.as_str() {
            "--minutes" => args.minutes = number("--minutes")?,
            "--rate" => args.rate = Some(number("--rate")?),
            _ => {} // --bench and the like, from cargo
        }
    }
    let least = (WINDOW_SLICES + 3) as u64;
    if args.minutes < least {
        return Err(format!(
            "--minutes must be at least {least} (window of {WINDOW_SLICES} min, one roll, two steady minutes)"
        ));
    }
    Ok(args)
}

fn main() -> ExitCode {
    if !invoked_by_cargo_bench() {
        println!("soak bench: skipped (run it with `cargo bench --bench soak`)");
        return ExitCode::SUCCESS;
    }
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("soak: a verdict failed");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn config(url: &str, listen: &str) -> String {
    format!(
        r#"
[redis]
url = "{url}"
key_prefix = "{PREFIX}"
[ingest]
stream = "{STREAM}"
group = "{GROUP}"
consumer = "soak"
batch_size = {BATCH}
block = "100ms"
dead_letter_stream = "{DEAD}"
retain = "{RETAIN_S}s"
[schedule]
roll = "0 * * * * *"
resummarize = "30 * * * * *"
[http]
listen = "{listen}"
[log]
level = "warn"
[[boards]]
name = "{BOARD}"
member = "room"
window = "{WINDOW_SLICES}m"
slice = "1m"
"#
    )
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// One sample of the figures watched.
#[derive(Clone, Debug)]
struct Sample {
    at: Duration,
    sent: u64,
    rss_kb: u64,
    used_memory: u64,
    seen: u64,
    pending: u64,
    lag: u64,
    dead: u64,
    slices: u64,
    /// Entries in the intake stream.
    stream: u64,
}

/// `XINFO GROUPS` of the stream, as field -> value of our group.
fn group(redis: &RedisServer) -> HashMap<String, String> {
    let out = redis.cli(&["XINFO", "GROUPS", STREAM]);
    let lines: Vec<&str> = out.lines().collect();
    lines
        .chunks(2)
        .filter(|p| p.len() == 2)
        .map(|p| (p[0].to_string(), p[1].to_string()))
        .collect()
}

fn int(text: &str) -> u64 {
    text.trim().parse().unwrap_or(0)
}

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .map(|v| int(v.trim_end_matches("kB")))
        })
        .unwrap_or(0)
}

fn sample(redis: &RedisServer, pid: u32, at: Duration, sent: u64) -> Sample {
    let keys = Keys::new(PREFIX).instance(BOARD, None);
    let info = redis.cli(&["INFO", "memory"]);
    let used_memory = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .map(int)
        .unwrap_or(0);
    let group = group(redis);
    let pending = redis
        .cli(&["XPENDING", STREAM, GROUP])
        .lines()
        .next()
        .map(int)
        .unwrap_or(0);
    Sample {
        at,
        sent,
        rss_kb: rss_kb(pid),
        used_memory,
        // The digest table's entry count (`#n`), plus the legacy ZSet while one exists.
        seen: int(&redis.cli(&["HGET", &keys.seen_table(), "#n"]))
            + int(&redis.cli(&["ZCARD", &keys.seen()])),
        pending,
        lag: group.get("lag").map_or(0, |v| int(v)),
        dead: int(&redis.cli(&["XLEN", DEAD])),
        slices: int(&redis.cli(&["ZCARD", &keys.slices()])),
        stream: int(&redis.cli(&["XLEN", STREAM])),
    }
}

/// Sends events; records each first send in the model.
struct Sender {
    client: Client,
    next: AtomicU64,
    model: Mutex<Model>,
}

impl Sender {
    /// Sends `count` new events (and the retries among them), all stamped now.
    async fn send(&self, count: u64) -> Result<u64> {
        let first = self.next.fetch_add(count, Ordering::SeqCst);
        let ts = now_ms();
        let mut sends = Vec::new();
        {
            let mut model = self.model.lock().map_err(|_| "model lock")?;
            let slice = model.entry(ts.div_euclid(SLICE_MS)).or_default();
            for i in first..first + count {
                let room = format!("room-{}", i % MEMBERS);
                let amount = 1 + (i % 7) as i64;
                *slice.entry(room.clone()).or_default() += amount;
                let fields = vec![
                    ("room", room),
                    ("amount", amount.to_string()),
                    ("id", format!("soak-{i}")),
                    ("ts", ts.to_string()),
                ];
                if i % RETRY_EVERY == 0 {
                    sends.push(fields.clone());
                }
                sends.push(fields);
            }
        }
        let sent = sends.len() as u64;
        let pipeline = self.client.pipeline();
        for fields in sends {
            let _: () = pipeline
                .xadd(STREAM, false, None::<()>, "*", fields)
                .await
                .map_err(|e| e.to_string())?;
        }
        let _: Vec<Value> = pipeline.all().await.map_err(|e| e.to_string())?;
        Ok(sent)
    }
}

/// Waits until the group has read everything and nothing is pending.
async fn drained(redis: &RedisServer, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let g = group(redis);
        if g.get("lag").is_some_and(|v| v == "0") && g.get("pending").is_some_and(|v| v == "0") {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

async fn run(args: Args) -> Result<bool> {
    let redis = RedisServer::start()?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .to_string();
    let config_path = dir.path().join("rollboard.toml");
    std::fs::write(&config_path, config(&redis.url(), &listen)).map_err(|e| e.to_string())?;
    let mut daemon = Daemon::start(&config_path, &[], &dir.path().join("daemon.log"))?;
    let started = Instant::now();
    while !group(&redis).contains_key("name") {
        if started.elapsed() > Duration::from_secs(20) || daemon.exited().is_some() {
            return Err(format!("the daemon did not start: {}", daemon.log_tail()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let client = Builder::from_config(Config::from_url(&redis.url()).map_err(|e| e.to_string())?)
        .build()
        .map_err(|e| e.to_string())?;
    client.init().await.map_err(|e| e.to_string())?;
    let sender = Arc::new(Sender {
        client,
        next: AtomicU64::new(0),
        model: Mutex::new(Model::new()),
    });

    let rate = match args.rate {
        Some(rate) => {
            println!("rate: {rate} events/s (given)");
            rate
        }
        None => {
            let t0 = Instant::now();
            for _ in 0..BURST / 1000 {
                sender.send(1000).await?;
            }
            if !drained(&redis, Duration::from_secs(120)).await {
                return Err("the burst did not drain within 120 s".into());
            }
            let max = BURST as f64 / t0.elapsed().as_secs_f64();
            let rate = (max / 2.0).max(1.0) as u64;
            println!("maximum: {max:.0} events/s ({BURST}-event burst drained); rate: {rate} events/s (half)");
            rate
        }
    };

    let duration = Duration::from_secs(args.minutes * 60);
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let load = {
        let (sender, stop, sent) = (sender.clone(), stop.clone(), sent.clone());
        tokio::spawn(async move {
            let t0 = Instant::now();
            let mut ticks = tokio::time::interval(TICK);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut due = 0u64;
            let mut done = 0u64;
            while !stop.load(Ordering::SeqCst) {
                ticks.tick().await;
                let want = (t0.elapsed().as_secs_f64() * rate as f64) as u64;
                due = due.max(want);
                if due > done {
                    let n = (due - done).min(rate.max(1));
                    sender.send(n).await?;
                    done += n;
                    sent.store(done, Ordering::SeqCst);
                }
            }
            Ok::<u64, String>(done)
        })
    };

    println!(
        "soak: {} min at {rate} events/s, window {WINDOW_SLICES} x 1 min slices, roll every minute, {MEMBERS} rooms",
        args.minutes
    );
    println!(
        "{:>6} {:>10} {:>9} {:>12} {:>9} {:>8} {:>8} {:>5} {:>7} {:>8}",
        "t", "sent", "rss_kb", "used_memory", "seen", "pending", "lag", "dead", "slices", "stream"
    );
    let t0 = Instant::now();
    let mut samples = Vec::new();
    let mut next = SAMPLE_EVERY;
    while t0.elapsed() < duration {
        tokio::time::sleep(next.saturating_sub(t0.elapsed())).await;
        let s = sample(
            &redis,
            daemon.pid(),
            t0.elapsed(),
            sent.load(Ordering::SeqCst),
        );
        println!(
            "{:>5}s {:>10} {:>9} {:>12} {:>9} {:>8} {:>8} {:>5} {:>7} {:>8}",
            s.at.as_secs(),
            s.sent,
            s.rss_kb,
            s.used_memory,
            s.seen,
            s.pending,
            s.lag,
            s.dead,
            s.slices,
            s.stream
        );
        samples.push(s);
        next += SAMPLE_EVERY;
        if load.is_finished() {
            break;
        }
    }
    stop.store(true, Ordering::SeqCst);
    let sent_events = load.await.map_err(|e| e.to_string())??;
    let elapsed = t0.elapsed();
    let drained = drained(&redis, Duration::from_secs(120)).await;

    // Every slice of the model still live must equal the board's slice Hash exactly. Not
    // within 3 s of a minute boundary, where the roll may be expiring the oldest slice.
    let into_minute = now_ms().rem_euclid(SLICE_MS);
    if into_minute > SLICE_MS - 3_000 {
        tokio::time::sleep(Duration::from_millis(
            (SLICE_MS - into_minute + 3_000) as u64,
        ))
        .await;
    }
    let keys = Keys::new(PREFIX).instance(BOARD, None);
    let model = sender.model.lock().map_err(|_| "model lock")?.clone();
    let current = now_ms().div_euclid(SLICE_MS);
    let (mut compared, mut lost, mut doubled, mut missing) = (0u64, 0i64, 0i64, 0u64);
    for (slice, members) in &model {
        if *slice <= current - WINDOW_SLICES {
            continue; // expired (or being expired) by the roll
        }
        let stored: HashMap<String, i64> = redis
            .cli(&["HGETALL", &keys.slice(*slice)])
            .lines()
            .collect::<Vec<_>>()
            .chunks(2)
            .filter(|p| p.len() == 2)
            .map(|p| (p[0].to_string(), p[1].trim().parse().unwrap_or(i64::MIN)))
            .collect();
        if stored.is_empty() {
            missing += 1;
            continue;
        }
        compared += 1;
        for (member, want) in members {
            let got = stored.get(member).copied().unwrap_or(0);
            if got < *want {
                lost += want - got;
            } else {
                doubled += got - want;
            }
        }
        for (member, got) in &stored {
            if !members.contains_key(member) {
                doubled += got;
            }
        }
    }
    let verify = Command::new(env!("CARGO_BIN_EXE_rollboard"))
        .arg("--config")
        .arg(&config_path)
        .arg("verify")
        .output()
        .map_err(|e| e.to_string())?;
    let last = sample(
        &redis,
        daemon.pid(),
        t0.elapsed(),
        sent.load(Ordering::SeqCst),
    );
    daemon.stop()?;

    // Verdicts.
    let steady_from = Duration::from_millis(((WINDOW_SLICES + 1) * SLICE_MS) as u64);
    let steady: Vec<&Sample> = samples.iter().filter(|s| s.at >= steady_from).collect();
    let minute = Duration::from_secs(60);
    let end = samples.last().map_or(Duration::ZERO, |s| s.at);
    let first: Vec<&Sample> = steady
        .iter()
        .copied()
        .filter(|s| s.at < steady_from + minute)
        .collect();
    let tail: Vec<&Sample> = steady
        .iter()
        .copied()
        .filter(|s| s.at + minute > end)
        .collect();
    let max = |of: &[&Sample], f: fn(&Sample) -> u64| of.iter().map(|s| f(s)).max().unwrap_or(0);
    let mut ok = true;
    let mut verdict = |pass: bool, text: String| {
        println!("{} {text}", if pass { "PASS" } else { "FAIL" });
        ok &= pass;
    };
    println!("== verdicts (steady from {}s)", steady_from.as_secs());
    verdict(
        !first.is_empty() && !tail.is_empty() && tail[0].at > first[first.len() - 1].at,
        format!(
            "steady samples: first minute {}, last minute {}",
            first.len(),
            tail.len()
        ),
    );
    let flat = |name: &str, f: fn(&Sample) -> u64| {
        let (a, b) = (max(&first, f), max(&tail, f));
        let limit = a as f64 * (1.0 + FLAT_TOLERANCE);
        (
            a > 0 && (b as f64) <= limit,
            format!(
                "{name} flat: last steady minute max {b} vs first {a} ({:+.1} %, limit +{:.0} %)",
                (b as f64 / a.max(1) as f64 - 1.0) * 100.0,
                FLAT_TOLERANCE * 100.0
            ),
        )
    };
    let (p, t) = flat("daemon RSS (kB)", |s| s.rss_kb);
    verdict(p, t);
    let (p, t) = flat("Redis used_memory (B)", |s| s.used_memory);
    verdict(p, t);
    if let (Some(start), Some(end)) = (steady.first(), steady.last()) {
        println!(
            "     Redis used_memory while steady: start {} B, end {} B, max {} B",
            start.used_memory,
            end.used_memory,
            max(&steady, |s| s.used_memory)
        );
    }
    let stream_max = max(&steady, |s| s.stream);
    let stream_bound = (rate + rate / RETRY_EVERY) * (RETAIN_S + 10);
    verdict(
        stream_max <= stream_bound,
        format!(
            "intake stream at most {stream_max} entries while steady, bound {stream_bound} (ingest.retain + 10 s of sends)"
        ),
    );
    let (p, t) = flat("idempotency keys", |s| s.seen);
    verdict(p, t);
    let seen_max = max(&samples.iter().collect::<Vec<_>>(), |s| s.seen);
    let seen_bound = rate * ((WINDOW_SLICES + 2) * SLICE_MS / 1000) as u64;
    verdict(
        seen_max <= seen_bound,
        format!(
            "idempotency keys at most {seen_max}, bound {seen_bound} (rate x (window + 2 slices))"
        ),
    );
    let pending_max = max(&steady, |s| s.pending);
    verdict(
        pending_max <= 2 * BATCH,
        format!(
            "pending at most {pending_max} while steady (limit {})",
            2 * BATCH
        ),
    );
    let lag_max = max(&tail, |s| s.lag);
    verdict(
        lag_max <= 5 * rate,
        format!(
            "lag in the last minute at most {lag_max} (limit {}: 5 s)",
            5 * rate
        ),
    );
    verdict(
        drained && last.pending == 0,
        format!("drained after the load stopped (pending {})", last.pending),
    );
    verdict(last.dead == 0, format!("dead letters: {}", last.dead));
    verdict(
        compared > 0 && lost == 0 && doubled == 0 && missing == 0,
        format!(
            "live slices equal the model: {compared} compared, lost {lost}, doubled {doubled}, missing slices {missing}"
        ),
    );
    verdict(
        verify.status.success(),
        format!(
            "rollboard verify: {} {}",
            verify.status,
            String::from_utf8_lossy(&verify.stdout).trim()
        ),
    );
    let achieved = sent_events as f64 / elapsed.as_secs_f64();
    verdict(
        achieved >= rate as f64 * 0.95,
        format!(
            "sent {sent_events} events (+{} retries) in {:.0} s: {achieved:.0}/s of {rate}/s",
            sent_events.div_ceil(RETRY_EVERY),
            elapsed.as_secs_f64()
        ),
    );
    println!(
        "final: rss {} kB, used_memory {} B, idempotency keys {}, slices {}",
        last.rss_kb, last.used_memory, last.seen, last.slices
    );
    if !ok {
        println!("daemon log tail:\n{}", daemon.log_tail());
    }
    Ok(ok)
}
