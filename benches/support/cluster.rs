//! The capacity runs on Redis Cluster of `benches/cluster.rs`, shared with the table of
//! `benches/rollboard.rs`: a 3 + 3 cluster per run, the release daemons, and the figures per
//! master (see benches/cluster.rs for what each run does and reports).

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fred::prelude::*;
use rollboard::config::Settings;

use super::Daemon;

type Result<T> = std::result::Result<T, String>;

/// The unscoped board of config/rollboard.toml that tips feed by room (its `shards` line is
/// added by [`boards`]).
const ROOMS_BOARD: &str = r#"
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
"#;

/// The scoped board of config/rollboard.toml that tips feed by fan, one instance per room.
const FANS_BOARD: &str = r#"
[[boards]]
name = "fans_7d"
member = "user"
scope = "room"
window = "7d"
slice = "1h"
mode = "resummarize"
"#;

/// The boards of a run.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Boards {
    /// `rooms_7d` and `fans_7d`, as config/rollboard.toml ships them.
    Shipped,
    /// `rooms_7d` alone: what the unscoped board costs each master.
    RoomsOnly,
}

impl Boards {
    fn name(self) -> &'static str {
        match self {
            Boards::Shipped => "shipped",
            Boards::RoomsOnly => "rooms_7d only",
        }
    }
}

/// One run: the boards, `rooms_7d`'s shards, the stream partitions and the daemons.
#[derive(Clone, Copy)]
pub struct Layout {
    pub boards: Boards,
    pub shards: u32,
    pub partitions: usize,
    pub daemons: usize,
}

const fn layout(boards: Boards, shards: u32, partitions: usize, daemons: usize) -> Layout {
    Layout {
        boards,
        shards,
        partitions,
        daemons,
    }
}

/// Every run, in order. With 3 masters holding slots 0-5460, 5461-10922 and 10923-16383,
/// `rooms_7d`'s shards `#0`, `#1`, `#2` land on one master each, and 6 shards two on each.
pub const LAYOUTS: [Layout; 10] = [
    layout(Boards::Shipped, 1, 1, 1),
    layout(Boards::Shipped, 1, 1, 2),
    layout(Boards::Shipped, 1, 3, 1),
    layout(Boards::Shipped, 1, 3, 2),
    layout(Boards::Shipped, 3, 3, 1),
    layout(Boards::Shipped, 3, 3, 2),
    layout(Boards::Shipped, 6, 3, 2),
    layout(Boards::RoomsOnly, 1, 3, 1),
    layout(Boards::RoomsOnly, 3, 3, 1),
    layout(Boards::RoomsOnly, 6, 3, 1),
];

/// The `[[boards]]` of a run.
fn boards(layout: &Layout) -> String {
    let mut out = ROOMS_BOARD.to_string();
    if layout.shards > 1 {
        out.push_str(&format!("shards = {}\n", layout.shards));
    }
    if layout.boards == Boards::Shipped {
        out.push_str(FANS_BOARD);
    }
    out
}

/// Events per run: 100 000, or 20 000 with `--quick`.
pub fn events(quick: bool) -> u64 {
    if quick {
        20_000
    } else {
        100_000
    }
}

/// Rooms of the workload (power-law skewed: room `r` is about `1/r` as likely as room 1).
const ROOMS: u64 = 2_000;
/// Fans per room.
const FANS: u64 = 500;

/// Commands rollboard sends at top level while ingesting, whose Redis time is counted.
const COMMANDS: [&str; 7] = [
    "fcall",
    "xreadgroup",
    "xack",
    "wait",
    "set",
    "zadd",
    "hmget",
];

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

fn config(url: &str, layout: &Layout, consumer: &str, listen: &str) -> String {
    let partitions = layout.partitions;
    let boards = boards(layout);
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
{boards}"#
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

/// The figures of one run.
pub struct Row {
    pub layout: Layout,
    pub events: u64,
    pub rate: f64,
    /// Per master: commandstats µs per event, CPU µs per event.
    pub masters: Vec<(f64, f64)>,
    /// Per master: how many of `rooms_7d`'s instances (its shards, or its one instance) it
    /// serves.
    pub rooms: Vec<usize>,
    /// Per shard of `rooms_7d`: the master serving it (index into `masters`).
    pub shard_masters: Vec<Option<usize>>,
    /// Every daemon's user + sys CPU per event, µs.
    pub daemon_cpu: f64,
}

impl Row {
    /// Redis CPU µs per event, all masters.
    pub fn cpu(&self) -> f64 {
        self.masters.iter().map(|m| m.1).sum()
    }

    /// The busiest master's Redis CPU µs per event.
    pub fn busiest(&self) -> f64 {
        self.masters.iter().map(|m| m.1).fold(0.0, f64::max)
    }

    /// The busiest master's share of all masters' Redis CPU (0..=1).
    pub fn busiest_share(&self) -> f64 {
        self.busiest() / self.cpu().max(f64::MIN_POSITIVE)
    }

    /// The busiest master's CPU over the mean of the others'.
    pub fn busiest_over_others(&self) -> f64 {
        let others = self.masters.len().saturating_sub(1).max(1) as f64;
        self.busiest() / ((self.cpu() - self.busiest()) / others).max(f64::MIN_POSITIVE)
    }

    /// Which masters serve `rooms_7d`'s shards: `#0 → 2, #1 → 3, ...` (masters from 1).
    pub fn shard_list(&self) -> String {
        self.shard_masters
            .iter()
            .enumerate()
            .map(|(k, m)| match m {
                Some(m) => format!("#{k} → {}", m + 1),
                None => format!("#{k} → ?"),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The keys of `rooms_7d`'s instances: its one, or one per shard.
fn rooms_keys(shards: u32) -> Vec<String> {
    if shards > 1 {
        (0..shards)
            .map(|k| format!("rb:{{rooms_7d:#{k}}}:result"))
            .collect()
    } else {
        vec!["rb:{rooms_7d}:result".into()]
    }
}

async fn one_run(layout: Layout, events: u64) -> Result<Row> {
    let Layout {
        partitions,
        daemons,
        ..
    } = layout;
    let cluster = Cluster::start()?;
    let url = cluster.url();
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let settings = Settings::from_toml(&config(&url, &layout, "fill", "127.0.0.1:1"))
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
        std::fs::write(&path, config(&url, &layout, &format!("d{d}"), &listen))
            .map_err(|e| e.to_string())?;
        running.push(Daemon::start(
            &path,
            &[],
            &dir.path().join(format!("d{d}.log")),
        )?);
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
            if let Some(status) = daemon.exited() {
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
        .map(|d| process_cpu_seconds(d.pid()))
        .sum::<f64>()
        * 1e6
        / events as f64;
    let shard_masters: Vec<Option<usize>> = rooms_keys(layout.shards)
        .iter()
        .map(|key| masters.iter().position(|&m| serves(m, key)))
        .collect();
    let rooms = (0..masters.len())
        .map(|i| shard_masters.iter().filter(|&&m| m == Some(i)).count())
        .collect();
    drop(running);
    let _ = client.quit().await;
    Ok(Row {
        layout,
        events,
        rate: events as f64 / elapsed,
        masters: per_master,
        rooms,
        shard_masters,
        daemon_cpu,
    })
}

/// The per-master figures, each master serving an instance of `rooms_7d` marked with `*`.
fn list(values: impl Iterator<Item = f64>, rooms: &[usize]) -> String {
    values
        .enumerate()
        .map(|(i, v)| {
            if rooms.get(i).is_some_and(|&n| n > 0) {
                format!("{v:.1}*")
            } else {
                format!("{v:.1}")
            }
        })
        .collect::<Vec<_>>()
        .join(" / ")
}

/// Runs every layout of [`LAYOUTS`] with `events` events, printing a line per run.
pub async fn capacity(events: u64) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for layout in LAYOUTS {
        let row = one_run(layout, events).await?;
        println!(
            "{} boards, rooms_7d shards {}, {} partition(s), {} daemon(s): {events} events, \
             {:.0} events/s; per master µs/event commandstats {}, cpu {} (* serves rooms_7d); \
             daemons' cpu {:.1} µs/event",
            layout.boards.name(),
            layout.shards,
            layout.partitions,
            layout.daemons,
            row.rate,
            list(row.masters.iter().map(|m| m.0), &row.rooms),
            list(row.masters.iter().map(|m| m.1), &row.rooms),
            row.daemon_cpu,
        );
        println!(
            "  busiest master: {:.0} % of the masters' Redis CPU ({:.1} µs/event, {:.2}x the \
             others' mean; an even spread is {:.0} %); rooms_7d on masters {}",
            row.busiest_share() * 100.0,
            row.busiest(),
            row.busiest_over_others(),
            100.0 / row.masters.len().max(1) as f64,
            row.shard_list(),
        );
        rows.push(row);
    }
    Ok(rows)
}

/// The markdown table of `rows`, measured by `command`.
pub fn print_table(rows: &[Row], command: &str) {
    println!(
        "\n`{command}` (3 masters + 3 replicas, `min_replicas_acked` 1; * marks the masters \
         serving rooms_7d's instances, its one or its shards):\n"
    );
    println!(
        "| boards | rooms_7d shards | partitions | daemons | events | events/s | \
         Redis µs/event per master (commandstats) | Redis CPU µs/event per master | \
         busiest master's share of Redis CPU | Redis CPU µs/event, all masters | \
         daemons' CPU µs/event |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|---|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} | {:.0} | {} | {} | {:.0} % | {:.1} | {:.1} |",
            r.layout.boards.name(),
            r.layout.shards,
            r.layout.partitions,
            r.layout.daemons,
            r.events,
            r.rate,
            list(r.masters.iter().map(|m| m.0), &r.rooms),
            list(r.masters.iter().map(|m| m.1), &r.rooms),
            r.busiest_share() * 100.0,
            r.cpu(),
            r.daemon_cpu,
        );
    }
}
