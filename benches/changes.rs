//! The change feed's fan-out: 1000 subscribers of one feed, the daemon's memory per
//! subscriber and the delivery time of each event to each subscriber.
//!
//! ```sh
//! cargo bench --bench changes                          # 1000 subscribers, 200 events
//! cargo bench --bench changes -- --subscribers 2000 --events 500
//! ```
//!
//! It starts a redis-server and the release `rollboard run` (one board with
//! `changes_top`), reads the daemon's RSS, opens the subscribers (each a plain HTTP/1.1
//! connection reading `GET /v1/boards/rooms/changes`), reads the RSS again once every
//! stream is open, then appends the events to the feed one every 10 ms (as the scripts
//! that change a ranking do, `XADD`) and times each event from just before its `XADD` to
//! its `id:` line read by each subscriber. Prints the memory per subscriber, the delivery
//! time's p50, p99 and maximum over every (event, subscriber) pair, the events lost (must
//! be 0), the daemon's CPU time per (event, subscriber) pair while the events are sent,
//! and the daemon's Redis connections (one per feed read, whatever the subscribers). Not
//! run by CI; `cargo test` builds it and skips it.

mod support;

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::*;
use support::{cpu, invoked_by_cargo_bench, percentile, Daemon, RedisServer};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::Barrier;

type Result<T> = std::result::Result<T, String>;

const FEED: &str = "bench:changes:{rooms}";
const EVERY: Duration = Duration::from_millis(10);

struct Args {
    subscribers: usize,
    events: usize,
}

fn args() -> Result<Args> {
    let mut out = Args {
        subscribers: 1000,
        events: 200,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut number = |name: &str| -> Result<usize> {
            it.next()
                .and_then(|v| v.parse().ok())
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{name} takes a positive number"))
        };
        match arg.as_str() {
            "--subscribers" => out.subscribers = number("--subscribers")?,
            "--events" => out.events = number("--events")?,
            _ => {}
        }
    }
    Ok(out)
}

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn config(redis: &str, listen: &str, subscribers: usize) -> String {
    format!(
        "[redis]\nurl = \"{redis}\"\nkey_prefix = \"bench\"\n[ingest]\nstream = \"bench:events\"\n\
         [http]\nlisten = \"{listen}\"\nmax_connections = {c}\nmax_subscribers = {c}\n\n\
         [[boards]]\nname = \"rooms\"\nmember = \"room\"\nwindow = \"1h\"\nslice = \"1m\"\n\
         changes_top = 10\n",
        c = subscribers + 16
    )
}

/// One subscriber: opens the stream, waits at `open` once the answer's head is read, then
/// reads `id:` lines until it has `events` of them (or the stream ends); each id with the
/// instant it was read.
async fn subscribe(
    listen: String,
    events: usize,
    open: Arc<Barrier>,
) -> Result<Vec<(String, Instant)>> {
    let mut stream = tokio::net::TcpStream::connect(&listen)
        .await
        .map_err(|e| e.to_string())?;
    let request = format!(
        "GET /v1/boards/rooms/changes HTTP/1.1\r\nhost: {listen}\r\naccept: text/event-stream\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut lines = BufReader::new(stream).lines();
    let status = lines
        .next_line()
        .await
        .map_err(|e| e.to_string())?
        .unwrap_or_default();
    if !status.starts_with("HTTP/1.1 200") {
        return Err(format!("the stream answered {status}"));
    }
    open.wait().await;
    let mut seen = Vec::with_capacity(events);
    while seen.len() < events {
        match lines.next_line().await {
            Ok(Some(line)) => {
                if let Some(id) = line.strip_prefix("id: ") {
                    seen.push((id.to_string(), Instant::now()));
                }
            }
            _ => break,
        }
    }
    Ok(seen)
}

async fn run(args: Args) -> Result<()> {
    let redis = RedisServer::start()?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .to_string();
    let config_path = dir.path().join("rollboard.toml");
    std::fs::write(
        &config_path,
        config(&redis.url(), &listen, args.subscribers),
    )
    .map_err(|e| e.to_string())?;
    let mut daemon = Daemon::start(
        &config_path,
        &[("RUST_LOG", "warn")],
        &dir.path().join("daemon.log"),
    )?;
    let pid = daemon.pid();
    daemon
        .until_healthy(&listen, Duration::from_secs(20))
        .await?;
    // One subscriber first, so that the code paths and buffers of a stream are warm.
    let warm = tokio::spawn(subscribe(listen.clone(), 0, Arc::new(Barrier::new(1))));
    let _ = warm.await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let clients_before = redis.cli(&["CLIENT", "LIST"]).lines().count();
    let rss_before = rss_kb(pid);

    let open = Arc::new(Barrier::new(args.subscribers + 1));
    let mut tasks = Vec::with_capacity(args.subscribers);
    for _ in 0..args.subscribers {
        tasks.push(tokio::spawn(subscribe(
            listen.clone(),
            args.events,
            open.clone(),
        )));
    }
    open.wait().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_open = rss_kb(pid);
    let clients_open = redis.cli(&["CLIENT", "LIST"]).lines().count();

    let client = Builder::from_config(Config::from_url(&redis.url()).map_err(|e| e.to_string())?)
        .build()
        .map_err(|e| e.to_string())?;
    client.init().await.map_err(|e| e.to_string())?;
    let mut sent: HashMap<String, Instant> = HashMap::new();
    let cpu_before = cpu(pid);
    for i in 0..args.events {
        let member = format!("room{i}");
        let at = Instant::now();
        let id: String = client
            .xadd(
                FEED,
                false,
                None,
                "*",
                vec![
                    ("kind", "entered"),
                    ("member", member.as_str()),
                    ("rank", "1"),
                    ("total", "100"),
                    ("cause", "tip"),
                    ("ts", "0"),
                ],
            )
            .await
            .map_err(|e| e.to_string())?;
        sent.insert(id, at);
        tokio::time::sleep(EVERY).await;
    }
    let mut delays = Vec::with_capacity(args.subscribers * args.events);
    let mut lost = 0usize;
    for task in tasks {
        let seen = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .map_err(|_| "a subscriber did not get every event in 30 s".to_string())?
            .map_err(|e| e.to_string())??;
        lost += args.events.saturating_sub(seen.len());
        for (id, at) in seen {
            if let Some(sent) = sent.get(&id) {
                delays.push(at.duration_since(*sent));
            }
        }
    }
    let cpu_used = cpu(pid).saturating_sub(cpu_before);
    let rss_peak = rss_kb(pid);
    let per = |kb: u64| kb as f64 * 1024.0 / args.subscribers as f64;
    println!(
        "changes: {} subscribers of one feed, {} events, one every {:?}",
        args.subscribers, args.events, EVERY
    );
    println!(
        "  daemon RSS: {} kB idle, {} kB with the streams open ({:.1} KiB per subscriber), \
         {} kB after the events ({:.1} KiB per subscriber)",
        rss_before,
        rss_open,
        per(rss_open.saturating_sub(rss_before)) / 1024.0,
        rss_peak,
        per(rss_peak.saturating_sub(rss_before)) / 1024.0
    );
    println!(
        "  redis clients: {clients_before} before the streams, {clients_open} with them open \
         (the feed's reader is one connection)"
    );
    let n = delays.len();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "  delivery, XADD to the id line read, over {n} (event, subscriber) pairs: \
         p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; lost {lost}",
        ms(percentile(&mut delays, 50.0)),
        ms(percentile(&mut delays, 99.0)),
        ms(percentile(&mut delays, 100.0)),
    );
    println!(
        "  daemon CPU while the events were sent: {:.2} s, {:.2} µs per (event, subscriber)",
        cpu_used.as_secs_f64(),
        cpu_used.as_secs_f64() * 1e6 / (args.events * args.subscribers) as f64
    );
    if lost > 0 {
        return Err(format!("{lost} events lost"));
    }
    Ok(())
}

fn main() -> ExitCode {
    if !invoked_by_cargo_bench() {
        println!("changes bench: skipped (run it with `cargo bench --bench changes`)");
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
        .worker_threads(1)
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
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("changes bench: {e}");
            ExitCode::FAILURE
        }
    }
}
