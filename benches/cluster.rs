//! Capacity on Redis Cluster: a 3 + 3 cluster of `redis-server` processes started here (as
//! the test fixture of tests/it/support/cluster.rs does), the release daemon (`rollboard run`, built
//! by `cargo bench`) with the shipped boards (`rooms_7d`, unscoped; `fans_7d`, scoped by
//! room) and `redis.min_replicas_acked` at its default (1: every master has a replica).
//!
//! ```sh
//! cargo bench --bench cluster              # 100 000 events per run
//! cargo bench --bench cluster -- --quick   # 20 000 events per run, a couple of minutes
//! ```
//!
//! For `ingest.partitions` 1 and 3 and 1 and 2 daemons, a fresh cluster gets the events
//! pre-filled into the stream partitions by the partition rule (CRC-32 of the id modulo the
//! partition count), then the daemons start and the run is timed until every partition's
//! group has nothing pending and nothing undelivered. Reported per run: events/s end to end,
//! and on each master the Redis time per event: INFO commandstats of the commands rollboard
//! sends at top level (FCALL, XREADGROUP, XACK, WAIT, SET of the confirmation key; the
//! commands run inside scripts are already in FCALL) and the server's user + sys CPU.
//! Every process (six servers, the daemons, this program) shares the machine's cores, so
//! wall-clock rates are a floor; the per-event Redis figures are what a projection can use.
//! The run ends with a markdown table ready to paste into docs/benchmarks.md.

mod support;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use fred::prelude::*;
use rollboard::config::Settings;
use support::invoked_by_cargo_bench;

type Result<T> = std::result::Result<T, String>;

/// The two boards of config/rollboard.toml that tips feed by room and by fan.
const BOARDS: &str = r#"
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

/// Rooms of the workload (power-law skewed: room `r` is about `1/r` as likely as room 1).
const ROOMS: u64 = 2_000;
/// Fans per room.
const FANS: u64 = 500;

/// Commands rollboard sends at top level while ingesting, whose Redis time is counted.
const COMMANDS: [&str; 5] = ["fcall", "xreadgroup", "xack", "wait", "set"];

fn main() -> ExitCode {
    if !invoked_by_cargo_bench() {
        println!("cluster bench: skipped (run it with `cargo bench --bench cluster`)");
        return ExitCode::SUCCESS;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let events = if quick { 20_000 } else { 100_000 };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cluster bench: no runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(events, quick)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cluster bench failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One node of the cluster, killed on drop.
struct Node {
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Three masters and a replica each.
struct Cluster {
    nodes: Vec<Node>,
}

fn free_port() -> Result<u16> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// A free port whose cluster bus port (port + 10000) is free as well.
fn free_node_port() -> Result<u16> {
    loop {
        let port = free_port()?;
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return Ok(port);
        }
    }
}

fn cli(port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

fn spawn_node(port: u16, dir: &Path) -> Result<Child> {
    Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--cluster-enabled", "yes"])
        .args(["--cluster-config-file", "nodes.conf"])
        .args(["--cluster-node-timeout", "5000"])
        .args(["--appendonly", "no", "--save", ""])
        .args([
            "--repl-diskless-sync",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
        ])
        .args(["--logfile", "redis.log"])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start redis-server (scripts/ensure-redis installs it): {e}"))
}

impl Cluster {
    fn start() -> Result<Cluster> {
        let mut nodes = Vec::new();
        for _ in 0..6 {
            let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
            let port = free_node_port()?;
            let child = spawn_node(port, dir.path())?;
            nodes.push(Node {
                port,
                child,
                _dir: dir,
            });
        }
        let cluster = Cluster { nodes };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cluster
            .ports()
            .iter()
            .all(|&p| cli(p, &["PING"]).trim() == "PONG")
        {
            if Instant::now() > deadline {
                return Err("the cluster's servers did not start".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let addrs: Vec<String> = cluster
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .map_err(|e| format!("redis-cli --cluster create: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create: {}",
                String::from_utf8_lossy(&out.stdout)
            ));
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while !cluster.ready() {
            if Instant::now() > deadline {
                return Err("the cluster did not become ready in 60 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(cluster)
    }

    fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// Every node sees `cluster_state:ok`, and every replica's link to its master is up.
    fn ready(&self) -> bool {
        self.ports().iter().all(|&p| {
            let info = cli(p, &["INFO", "replication"]);
            cli(p, &["CLUSTER", "INFO"]).contains("cluster_state:ok")
                && (info.contains("role:master") && info.contains("connected_slaves:1")
                    || info.contains("role:slave") && info.contains("master_link_status:up"))
        })
    }

    /// The masters' ports, in port order.
    fn masters(&self) -> Vec<u16> {
        let mut out: Vec<u16> = self
            .ports()
            .into_iter()
            .filter(|&p| cli(p, &["INFO", "replication"]).contains("role:master"))
            .collect();
        out.sort_unstable();
        out
    }

    fn url(&self) -> String {
        let ports = self.ports();
        let seeds: Vec<String> = ports[1..]
            .iter()
            .map(|p| format!("node=127.0.0.1:{p}"))
            .collect();
        format!("redis-cluster://127.0.0.1:{}?{}", ports[0], seeds.join("&"))
    }
}

/// Microseconds of `COMMANDS` on one server since its last `CONFIG RESETSTAT`.
fn command_usec(port: u16) -> f64 {
    let info = cli(port, &["INFO", "commandstats"]);
    COMMANDS
        .iter()
        .map(|c| {
            let prefix = format!("cmdstat_{c}:");
            info.lines()
                .find(|l| l.starts_with(&prefix))
                .and_then(|l| l.split(',').find_map(|kv| kv.strip_prefix("usec=")))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        })
        .sum()
}

/// Whether the master on `port` holds keys in `key`'s slot (only the slot's owner does).
fn serves(port: u16, key: &str) -> bool {
    let slot = cli(port, &["CLUSTER", "KEYSLOT", key]);
    slot.trim().parse::<u16>().is_ok_and(|slot| {
        cli(port, &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()])
            .trim()
            .parse::<u64>()
            .is_ok_and(|n| n > 0)
    })
}

/// A process's user + sys CPU so far, in seconds (/proc/<pid>/stat, 100 ticks a second).
fn process_cpu_seconds(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let rest = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let utime: f64 = fields.get(11)?.parse().ok()?;
            let stime: f64 = fields.get(12)?.parse().ok()?;
            Some((utime + stime) / 100.0)
        })
        .unwrap_or(0.0)
}

/// The server's user + sys CPU so far, in seconds (INFO cpu).
fn cpu_seconds(port: u16) -> f64 {
    cli(port, &["INFO", "cpu"])
        .lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_sys:")
                .or_else(|| l.strip_prefix("used_cpu_user:"))
        })
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

fn config(url: &str, partitions: usize, consumer: &str, listen: &str) -> String {
    format!(
        r#"
[redis]
url = "{url}"
[ingest]
partitions = {partitions}
consumer = "{consumer}"
batch_size = 500
block = "100ms"
[http]
listen = "{listen}"
[log]
level = "warn"
{BOARDS}"#
    )
}

/// Event `i`: a tip to a power-law skewed room from one of its fans, in the last day.
fn fields(i: u64, now: i64) -> Vec<(String, String)> {
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5851_f42d_4c95_7f2d;
    x ^= x >> 29;
    let u = (x % 1_000_000) as f64 / 1_000_000.0;
    let room = ((ROOMS as f64).powf(u) as u64).clamp(1, ROOMS);
    let fan = (x >> 20) % FANS;
    vec![
        ("id".into(), format!("tip-{i}")),
        ("room".into(), format!("room{room}")),
        ("user".into(), format!("fan{room}-{fan}")),
        ("amount".into(), (1 + x % 500).to_string()),
        ("ts".into(), (now - (i % 86_400) as i64 * 1000).to_string()),
    ]
}

/// The daemon, killed on drop.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Row {
    partitions: usize,
    daemons: usize,
    events: u64,
    rate: f64,
    /// Per master: commandstats µs per event, CPU µs per event.
    masters: Vec<(f64, f64)>,
    /// Which master serves the unscoped `rooms_7d` instance (index into `masters`).
    rooms: Option<usize>,
    /// Every daemon's user + sys CPU per event, µs.
    daemon_cpu: f64,
}

async fn one_run(partitions: usize, daemons: usize, events: u64) -> Result<Row> {
    let cluster = Cluster::start()?;
    let url = cluster.url();
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let settings = Settings::from_toml(&config(&url, partitions, "fill", "127.0.0.1:1"))
        .map_err(|e| e.to_string())?;
    let keys = rollboard::ingest::stream::keys(&settings.ingest);
    let client = Builder::from_config(Config::from_url(&url).map_err(|e| e.to_string())?)
        .build()
        .map_err(|e| e.to_string())?;
    client.init().await.map_err(|e| e.to_string())?;
    let now = chrono::Utc::now().timestamp_millis();
    let indexes: Vec<u64> = (0..events).collect();
    for chunk in indexes.chunks(1000) {
        futures_util::future::try_join_all(chunk.iter().map(|&i| {
            let f = fields(i, now);
            let p = rollboard::domain::partition::partition_of(f[0].1.as_bytes(), partitions);
            client.xadd::<String, _, _, _, _>(keys[p].as_str(), false, None, "*", f)
        }))
        .await
        .map_err(|e| e.to_string())?;
    }
    let masters = cluster.masters();
    for &m in &masters {
        cli(m, &["CONFIG", "RESETSTAT"]);
    }
    let cpu_before: Vec<f64> = masters.iter().map(|&m| cpu_seconds(m)).collect();
    let started = Instant::now();
    let mut running = Vec::new();
    for d in 0..daemons {
        let path = dir.path().join(format!("d{d}.toml"));
        let listen = format!("127.0.0.1:{}", free_port()?);
        std::fs::write(&path, config(&url, partitions, &format!("d{d}"), &listen))
            .map_err(|e| e.to_string())?;
        let log = std::fs::File::create(dir.path().join(format!("d{d}.log")))
            .map_err(|e| e.to_string())?;
        let stderr = log.try_clone().map_err(|e| e.to_string())?;
        running.push(Daemon(
            Command::new(env!("CARGO_BIN_EXE_rollboard"))
                .arg("--config")
                .arg(&path)
                .arg("run")
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(stderr)
                .spawn()
                .map_err(|e| format!("cannot start the daemon: {e}"))?,
        ));
    }
    loop {
        let mut done = true;
        for key in &keys {
            let info =
                rollboard::ingest::stream::group_info(&client, key, &settings.ingest.group).await;
            done &= matches!(info, Ok(Some((0, Some(0)))));
        }
        if done {
            break;
        }
        for (d, daemon) in running.iter_mut().enumerate() {
            if let Ok(Some(status)) = daemon.0.try_wait() {
                let log = std::fs::read_to_string(dir.path().join(format!("d{d}.log")))
                    .unwrap_or_default();
                return Err(format!("daemon d{d} exited ({status}): {log}"));
            }
        }
        if started.elapsed() > Duration::from_secs(900) {
            return Err("the daemons did not drain the streams in 15 minutes".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let per_master: Vec<(f64, f64)> = masters
        .iter()
        .zip(&cpu_before)
        .map(|(&m, before)| {
            (
                command_usec(m) / events as f64,
                (cpu_seconds(m) - before) * 1e6 / events as f64,
            )
        })
        .collect();
    let daemon_cpu = running
        .iter()
        .map(|d| process_cpu_seconds(d.0.id()))
        .sum::<f64>()
        * 1e6
        / events as f64;
    let rooms = masters
        .iter()
        .position(|&m| serves(m, "rb:{rooms_7d}:result"));
    drop(running);
    let _ = client.quit().await;
    Ok(Row {
        partitions,
        daemons,
        events,
        rate: events as f64 / elapsed,
        masters: per_master,
        rooms,
        daemon_cpu,
    })
}

/// The per-master figures, the master serving `rooms_7d` marked with `*`.
fn list(values: impl Iterator<Item = f64>, rooms: Option<usize>) -> String {
    values
        .enumerate()
        .map(|(i, v)| {
            if Some(i) == rooms {
                format!("{v:.1}*")
            } else {
                format!("{v:.1}")
            }
        })
        .collect::<Vec<_>>()
        .join(" / ")
}

async fn run(events: u64, quick: bool) -> Result<()> {
    let mut rows = Vec::new();
    for (partitions, daemons) in [(1, 1), (1, 2), (3, 1), (3, 2)] {
        let row = one_run(partitions, daemons, events).await?;
        println!(
            "{partitions} partition(s), {daemons} daemon(s): {events} events, {:.0} events/s; \
             per master µs/event commandstats {}, cpu {} (* serves rooms_7d); daemons' cpu {:.1} µs/event",
            row.rate,
            list(row.masters.iter().map(|m| m.0), row.rooms),
            list(row.masters.iter().map(|m| m.1), row.rooms),
            row.daemon_cpu,
        );
        rows.push(row);
    }
    println!(
        "\n`cargo bench --bench cluster{}` (3 masters + 3 replicas, `min_replicas_acked` 1, \
         shipped boards; * marks the master serving the unscoped rooms_7d instance):\n",
        if quick { " -- --quick" } else { "" }
    );
    println!(
        "| partitions | daemons | events | events/s | Redis µs/event per master (commandstats) | \
         Redis CPU µs/event per master | Redis CPU µs/event, all masters | daemons' CPU µs/event |"
    );
    println!("|---:|---:|---:|---:|---|---|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.0} | {} | {} | {:.1} | {:.1} |",
            r.partitions,
            r.daemons,
            r.events,
            r.rate,
            list(r.masters.iter().map(|m| m.0), r.rooms),
            list(r.masters.iter().map(|m| m.1), r.rooms),
            r.masters.iter().map(|m| m.1).sum::<f64>(),
            r.daemon_cpu,
        );
    }
    Ok(())
}
