//! Ingest throughput and query latency (DESIGN.md section 7), all against one redis-server
//! started here, each figure with its baseline from the same run.
//!
//! ```sh
//! cargo bench --bench ingest                 # every scenario
//! cargo bench --bench ingest -- naive script e2e ceiling query
//! ```
//!
//! * `naive`: one client sending HINCRBY then ZINCRBY per event, one event at a time.
//! * `script`: the apply script called directly with batches of 500 (no consumer around it).
//! * `e2e`: events pre-filled into the stream, drained by one consumer (XREADGROUP,
//!   validation, apply, XACK) until the group has nothing pending.
//! * `ceiling`: the same apply script driven by redis-benchmark (Redis-side ceiling).
//! * `query`: top-10 and rank latency over HTTP, idle and while ingest runs.

mod support;

use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::*;
use rollboard::board::Board;
use rollboard::config::Settings;
use rollboard::http::{router, AppState};
use rollboard::ingest::{group_info, Ingest};
use rollboard::metrics::Metrics;
use rollboard::store::{apply_call, ApplyEvent, Reconnect, Store, APPLY_CHUNK};
use support::{invoked_by_cargo_bench, percentile, RedisServer};
use tokio_util::sync::CancellationToken;

const EVENTS: usize = 200_000;
const NAIVE_EVENTS: usize = 20_000;
const MEMBERS: usize = 100_000;
const BATCH: usize = 500;
const QUERIES: usize = 2_000;

const CONFIG: &str = r#"
[ingest]
batch_size = 500
block = "100ms"
[[boards]]
name = "rooms"
member = "room"
window = "7d"
slice = "1h"
"#;

type Result<T> = std::result::Result<T, String>;

fn main() -> ExitCode {
    if !invoked_by_cargo_bench() {
        println!("ingest bench: skipped (run it with `cargo bench --bench ingest`)");
        return ExitCode::SUCCESS;
    }
    let wanted: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let all = ["naive", "script", "e2e", "ceiling", "query"];
    let chosen: Vec<&str> = if wanted.is_empty() {
        all.to_vec()
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
    match runtime.block_on(run(&chosen)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn settings(redis: &RedisServer) -> Result<Settings> {
    let text = format!("[redis]\nurl = \"{}\"\n{CONFIG}", redis.url());
    Settings::from_toml(&text).map_err(|e| e.to_string())
}

fn now_ms() -> i64 {
    rollboard::cli::now_ms()
}

/// How tips spread over rooms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spread {
    /// A power law over SKEWED_ROOMS rooms, as live tipping is: a few rooms take most tips.
    Skewed,
    /// Every one of MEMBERS rooms equally likely: nearly every event touches a new member.
    Uniform,
}

/// Rooms of the skewed workload.
const SKEWED_ROOMS: usize = 10_000;

impl Spread {
    fn room(self, i: usize) -> usize {
        match self {
            Spread::Uniform => (i * 7919) % MEMBERS,
            Spread::Skewed => {
                // A fixed pseudo-random u in [0, 1) per event; u^4 piles the mass on low ids.
                let mut x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5851_F42D_4C95_7F2D;
                x ^= x >> 29;
                x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
                x ^= x >> 32;
                let u = (x >> 11) as f64 / (1u64 << 53) as f64;
                (u.powi(4) * SKEWED_ROOMS as f64) as usize
            }
        }
    }

    fn rooms(self) -> usize {
        match self {
            Spread::Uniform => MEMBERS,
            Spread::Skewed => SKEWED_ROOMS,
        }
    }
}

/// Event `i`: a tip of 1..=50 to a room, within the last day.
fn apply_event(spread: Spread, i: usize, now: i64) -> ApplyEvent {
    ApplyEvent {
        id: format!("e{i}"),
        ts: now - (i as i64 * 431) % 86_400_000,
        member: format!("room{}", spread.room(i)),
        amount: 1 + (i % 50) as i64,
    }
}

/// The same event as stream fields.
fn fields(spread: Spread, i: usize, now: i64) -> Vec<(String, String)> {
    let e = apply_event(spread, i, now);
    vec![
        ("room".into(), e.member),
        ("amount".into(), e.amount.to_string()),
        ("id".into(), e.id),
        ("ts".into(), e.ts.to_string()),
    ]
}

async fn connect(redis: &RedisServer, size: usize) -> Result<Store> {
    Store::connect(&redis.url(), "rb", size, Reconnect::Never)
        .await
        .map_err(|e| e.to_string())
}

/// Total Redis-side time spent in `command` so far, in µs (INFO commandstats).
fn command_usec(redis: &RedisServer, command: &str) -> f64 {
    let prefix = format!("cmdstat_{command}:");
    redis
        .cli(&["INFO", "commandstats"])
        .lines()
        .find(|l| l.starts_with(&prefix))
        .and_then(|l| l.split(',').find_map(|kv| kv.strip_prefix("usec=")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

fn rate(events: usize, elapsed: Duration) -> f64 {
    events as f64 / elapsed.as_secs_f64()
}

async fn run(chosen: &[&str]) -> Result<()> {
    let mut summary = Vec::new();
    for spread in [Spread::Skewed, Spread::Uniform] {
        let (mut naive, mut script, mut e2e) = (None, None, None);
        for scenario in chosen {
            let redis = RedisServer::start()?;
            println!(
                "\n== {scenario}, {spread:?} over {} rooms (redis-server on 127.0.0.1:{})",
                spread.rooms(),
                redis.port
            );
            match *scenario {
                "naive" => naive = Some(bench_naive(&redis, spread).await?),
                "script" => script = Some(bench_script(&redis, spread).await?),
                "e2e" => e2e = Some(bench_e2e(&redis, spread).await?),
                "ceiling" if spread == Spread::Uniform => bench_ceiling(&redis).await?,
                "query" if spread == Spread::Skewed => bench_query(&redis, spread).await?,
                _ => {}
            }
        }
        summary.push((spread, naive, script, e2e));
    }
    println!("\n== summary (events/s)");
    for (spread, naive, script, e2e) in summary {
        println!("-- {spread:?} over {} rooms", spread.rooms());
        for (name, value) in [
            ("naive client", naive),
            ("apply script direct", script),
            ("end to end", e2e),
        ] {
            if let Some(v) = value {
                println!("{name:<22} {v:>12.0}");
            }
        }
        if let (Some(e), Some(n)) = (e2e, naive) {
            println!(
                "end to end / naive            = {:.1}x (target >= 10x)",
                e / n
            );
        }
        if let (Some(e), Some(s)) = (e2e, script) {
            println!(
                "end to end / script direct    = {:.2} (target >= 0.5, i.e. within 2x)",
                e / s
            );
        }
    }
    Ok(())
}

async fn bench_naive(redis: &RedisServer, spread: Spread) -> Result<f64> {
    let store = connect(redis, 1).await?;
    let client = store.client();
    let now = now_ms();
    let started = Instant::now();
    for i in 0..NAIVE_EVENTS {
        let e = apply_event(spread, i, now);
        let slice = format!("naive:slice:{}", e.ts / 3_600_000);
        let _: i64 = client
            .hincrby(&slice, &e.member, e.amount)
            .await
            .map_err(|e| e.to_string())?;
        let _: f64 = client
            .zincrby("naive:result", e.amount as f64, &e.member)
            .await
            .map_err(|e| e.to_string())?;
    }
    let r = rate(NAIVE_EVENTS, started.elapsed());
    println!("naive HINCRBY+ZINCRBY, one event at a time: {NAIVE_EVENTS} events, {r:.0} events/s");
    Ok(r)
}

async fn bench_script(redis: &RedisServer, spread: Spread) -> Result<f64> {
    let store = connect(redis, 1).await?;
    let board = settings(redis)?.boards.remove(0);
    let now = now_ms();
    let events: Vec<ApplyEvent> = (0..EVENTS).map(|i| apply_event(spread, i, now)).collect();
    let started = Instant::now();
    for batch in events.chunks(BATCH) {
        store
            .apply(&board, None, batch, now)
            .await
            .map_err(|e| e.to_string())?;
    }
    let r = rate(EVENTS, started.elapsed());
    println!("apply script, batches of {BATCH}, one connection: {EVENTS} events, {r:.0} events/s");
    println!(
        "redis time inside EVALSHA: {:.2} µs per event",
        command_usec(redis, "evalsha") / EVENTS as f64
    );
    Ok(r)
}

async fn fill_stream(
    client: &Client,
    stream: &str,
    spread: Spread,
    from: usize,
    to: usize,
    now: i64,
) -> Result<()> {
    let indexes: Vec<usize> = (from..to).collect();
    for chunk in indexes.chunks(1000) {
        futures_util::future::try_join_all(chunk.iter().map(|i| {
            client.xadd::<String, _, _, _, _>(stream, false, None, "*", fields(spread, *i, now))
        }))
        .await
        .map_err(|e| e.to_string())?;
    }
    Ok(())
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

async fn bench_e2e(redis: &RedisServer, spread: Spread) -> Result<f64> {
    let settings = settings(redis)?;
    let store = Arc::new(connect(redis, 4).await?);
    let now = now_ms();
    fill_stream(
        store.client(),
        &settings.ingest.stream,
        spread,
        0,
        EVENTS,
        now,
    )
    .await?;
    let reader = Store::dedicated(&redis.url(), Reconnect::Never)
        .await
        .map_err(|e| e.to_string())?;
    let cancel = CancellationToken::new();
    let started = Instant::now();
    start_consumer(store.clone(), reader, &settings, &cancel);
    loop {
        let info = group_info(
            store.client(),
            &settings.ingest.stream,
            &settings.ingest.group,
        )
        .await;
        if matches!(info, Ok(Some((0, Some(0))))) {
            break;
        }
        if started.elapsed() > Duration::from_secs(600) {
            return Err("the consumer did not drain the stream in 10 minutes".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    cancel.cancel();
    let r = rate(EVENTS, elapsed);
    println!(
        "end to end, one consumer, batch {BATCH}: {EVENTS} events in {:.2}s, {r:.0} events/s",
        elapsed.as_secs_f64()
    );
    let per_event = |command: &str| command_usec(redis, command) / EVENTS as f64;
    println!(
        "redis time per event: EVALSHA {:.2} µs, XREADGROUP {:.2} µs, XACK {:.2} µs; wall {:.2} µs",
        per_event("evalsha"),
        per_event("xreadgroup"),
        per_event("xack"),
        elapsed.as_secs_f64() * 1e6 / EVENTS as f64
    );
    let count: i64 = store
        .client()
        .zcard("rb:{rooms}:result")
        .await
        .map_err(|e| e.to_string())?;
    println!("check: {count} ranked rooms");
    Ok(r)
}

async fn bench_ceiling(redis: &RedisServer) -> Result<()> {
    let board: Board = settings(redis)?.boards.remove(0);
    let store = connect(redis, 1).await?;
    store.load_scripts().await.map_err(|e| e.to_string())?;
    let sha = fred::types::scripts::Script::from_lua(include_str!("../src/lua/apply.lua"))
        .sha1()
        .to_string();
    let now = now_ms();
    let k = store.instance(&board, None);
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
    let (keys, values) = apply_call(&board, &k, &board.fingerprint(), &events, now, false);
    let mut args: Vec<String> = vec!["EVALSHA".into(), sha, keys.len().to_string()];
    args.extend(keys);
    args.extend(values.iter().map(|v| v.as_string().unwrap_or_default()));
    let requests = EVENTS / APPLY_CHUNK;
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
            "redis-benchmark EVALSHA apply ({APPLY_CHUNK} events per call), {clients} client(s): {rps:.0} calls/s = {:.0} events/s",
            rps * APPLY_CHUNK as f64
        );
    }
    Ok(())
}

async fn query_latencies(
    base: &str,
    http: &reqwest::Client,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let (mut top, mut rank) = (Vec::with_capacity(QUERIES), Vec::with_capacity(QUERIES));
    for i in 0..QUERIES {
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
        figures[0].as_secs_f64() * 1e3,
        figures[1].as_secs_f64() * 1e3,
        figures[2].as_secs_f64() * 1e3,
        figures[3].as_secs_f64() * 1e3
    );
    figures
}

async fn bench_query(redis: &RedisServer, spread: Spread) -> Result<()> {
    let settings = Arc::new(settings(redis)?);
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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let base = format!(
        "http://{}",
        listener.local_addr().map_err(|e| e.to_string())?
    );
    let app = router(Arc::new(AppState {
        store: store.clone(),
        settings: settings.clone(),
        metrics: Arc::new(Metrics::new(&settings.boards)),
        group_ready: Arc::new(AtomicBool::new(true)),
    }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let http = reqwest::Client::new();
    query_latencies(&base, &http).await?; // warm-up
    let (mut top, mut rank) = query_latencies(&base, &http).await?;
    let idle = show("idle", &mut top, &mut rank);

    // Ingest at full speed: a producer appending and one consumer draining.
    let cancel = CancellationToken::new();
    let reader = Store::dedicated(&redis.url(), Reconnect::Never)
        .await
        .map_err(|e| e.to_string())?;
    start_consumer(store.clone(), reader, &settings, &cancel);
    let producer = {
        let (client, stream, cancel) = (
            store.client().clone(),
            settings.ingest.stream.clone(),
            cancel.clone(),
        );
        tokio::spawn(async move {
            let mut i = MEMBERS * 2;
            while !cancel.is_cancelled() {
                if fill_stream(&client, &stream, spread, i, i + 1000, now_ms())
                    .await
                    .is_err()
                {
                    break;
                }
                i += 1000;
            }
            i - MEMBERS * 2
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let (mut top, mut rank) = query_latencies(&base, &http).await?;
    let elapsed = started.elapsed();
    let busy = show("while ingesting", &mut top, &mut rank);
    cancel.cancel();
    let produced = producer.await.map_err(|e| e.to_string())?;
    let applied = store
        .top(&board, None, 0, 1, now_ms())
        .await
        .map(|p| p.count)
        .unwrap_or(0);
    println!(
        "ingest during the queries: {produced} events appended (~{:.0}/s), ranked rooms now {applied}",
        produced as f64 / (elapsed.as_secs_f64() + 0.5)
    );
    println!(
        "ratio under ingest / idle: top-10 p50 {:.2}x p99 {:.2}x, rank p50 {:.2}x p99 {:.2}x",
        busy[0].as_secs_f64() / idle[0].as_secs_f64(),
        busy[1].as_secs_f64() / idle[1].as_secs_f64(),
        busy[2].as_secs_f64() / idle[2].as_secs_f64(),
        busy[3].as_secs_f64() / idle[3].as_secs_f64()
    );
    Ok(())
}
