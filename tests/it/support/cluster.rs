//! A real Redis Cluster on loopback ports: three masters and three replicas of the
//! `redis-server` on `PATH` (Debian's 7.0, or another server: see `scripts/test`), each in
//! its own temp dir, joined with `redis-cli --cluster create`, and killed by pid when
//! dropped. Methods kill a master (as a crash), force a failover, restart a dead node (it
//! rejoins as a replica) and move slots, each waiting for the topology to settle.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rollboard::store::{Reconnect, Store};

use crate::support::cli::assert_success;
use crate::support::env::{script_calls, server, skip, Server};
use crate::support::redis::{free_port, SpawnIn};

/// Milliseconds without an answer before the other nodes mark a node as failing.
pub const NODE_TIMEOUT_MS: u64 = 1000;

/// One `redis-server` of the cluster.
struct Node {
    port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

fn spawn_node(port: u16, dir: &std::path::Path) -> Child {
    Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--cluster-enabled", "yes"])
        .args(["--cluster-config-file", "nodes.conf"])
        .args(["--cluster-node-timeout", &NODE_TIMEOUT_MS.to_string()])
        // A replica may always take over, however long its link was down.
        .args(["--cluster-replica-validity-factor", "0"])
        // Replicas stay with their master; the test decides the topology.
        .args(["--cluster-allow-replica-migration", "no"])
        .args(["--appendonly", "no", "--save", ""])
        // The first sync starts at once (diskless, no 5 s gathering delay).
        .args([
            "--repl-diskless-sync",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
        ])
        .args(["--logfile", "redis.log"])
        .spawn_in(dir)
}

/// A free port whose cluster bus port (port + 10000) is free as well.
fn free_node_port() -> u16 {
    loop {
        let port = free_port();
        if TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// Runs redis-cli against `port`; standard output (a reply, errors included), then what
/// redis-cli itself says on standard error (it could not connect, say), so that an
/// assertion on the answer shows it.
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli is installed (scripts/ensure-redis)");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    text
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    /// Node ID.
    pub id: String,
    /// Client port.
    pub port: u16,
    /// Whether it is a master.
    pub master: bool,
    /// Whether it is marked failing (`fail`, not just `fail?`).
    pub failed: bool,
    /// The master's ID, for a replica.
    pub master_id: Option<String>,
    /// How many slots it serves.
    pub slots: usize,
    /// The ranges of slots it serves, first and last inclusive.
    pub ranges: Vec<(usize, usize)>,
}

fn parse_nodes(text: &str) -> Vec<NodeInfo> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            let addr = f[1].split('@').next()?;
            let port = addr.rsplit(':').next()?.parse().ok()?;
            let flags: Vec<&str> = f[2].split(',').collect();
            // Migrating and importing marks (`[slot->-id]`) are not served slots.
            let ranges: Vec<(usize, usize)> = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| {
                    let (a, b) = s.split_once('-').unwrap_or((s, s));
                    Some((a.parse().ok()?, b.parse().ok()?))
                })
                .collect();
            let slots = ranges.iter().map(|(a, b)| b + 1 - a).sum();
            Some(NodeInfo {
                id: f[0].to_string(),
                port,
                master: flags.contains(&"master"),
                failed: flags.contains(&"fail"),
                master_id: (f[3] != "-").then(|| f[3].to_string()),
                slots,
                ranges,
            })
        })
        .collect()
}

/// A 3 + 3 Redis Cluster.
pub struct RedisCluster {
    nodes: Vec<Node>,
}

impl RedisCluster {
    /// Starts six nodes, joins them (one replica per master), and waits until the
    /// cluster is healthy and every replica has finished its first sync.
    pub fn start() -> RedisCluster {
        let nodes: Vec<Node> = (0..6).map(|_| Self::start_node()).collect();
        let cluster = RedisCluster { nodes };
        let addrs: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert_success(&out, "cluster create failed");
        cluster.wait_healthy(Duration::from_secs(60));
        cluster
    }

    fn start_node() -> Node {
        for _ in 0..20 {
            let dir = tempfile::tempdir().expect("temp dir");
            let port = free_node_port();
            let child = spawn_node(port, dir.path());
            let mut node = Node {
                port,
                child: Some(child),
                dir,
            };
            if node.wait_ready(Duration::from_secs(5)) {
                return node;
            }
            node.kill();
        }
        panic!("could not start a cluster node");
    }

    /// Every node's client port, in start order.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// A `redis-cluster://` URL naming `seeds` (client ports), the first in the authority
    /// and the others as `node=` parameters.
    pub fn url_with_seeds(seeds: &[u16]) -> String {
        let mut url = format!("redis-cluster://127.0.0.1:{}", seeds[0]);
        for (k, port) in seeds[1..].iter().enumerate() {
            url.push(if k == 0 { '?' } else { '&' });
            url.push_str(&format!("node=127.0.0.1:{port}"));
        }
        url
    }

    /// A URL naming every node as a seed.
    pub fn url(&self) -> String {
        Self::url_with_seeds(&self.ports())
    }

    /// A store on the cluster under prefix `rb`.
    pub async fn store(&self) -> Store {
        Store::connect(&self.url(), "rb", 2, Reconnect::Never)
            .await
            .expect("connect to the cluster")
            .with_script_calls(script_calls())
    }

    /// Empties every master (`FLUSHALL`), as one server's `FLUSHALL` would.
    pub fn flushall(&self) {
        for port in self.masters() {
            assert_eq!(cli(port, &["FLUSHALL"]).trim(), "OK", "FLUSHALL on {port}");
        }
    }

    fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
            .collect()
    }

    /// `CLUSTER NODES` as a live node sees it.
    pub fn topology(&self) -> Vec<NodeInfo> {
        for port in self.live_ports() {
            let nodes = parse_nodes(&cli(port, &["CLUSTER", "NODES"]));
            if !nodes.is_empty() {
                return nodes;
            }
        }
        panic!("no live node answers CLUSTER NODES")
    }

    /// Every key on every master, as `redis-cli --scan` lists them.
    pub fn scan_all(&self) -> std::collections::BTreeSet<String> {
        self.masters()
            .into_iter()
            .flat_map(|port| {
                cli(port, &["--scan"])
                    .lines()
                    .filter(|l| !l.is_empty())
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The client ports of the masters serving slots.
    pub fn masters(&self) -> Vec<u16> {
        self.topology()
            .iter()
            .filter(|n| n.master && !n.failed && n.slots > 0)
            .map(|n| n.port)
            .collect()
    }

    /// The replica of the master on `port`.
    pub fn replica_of(&self, port: u16) -> u16 {
        let nodes = self.topology();
        let master = nodes.iter().find(|n| n.port == port).expect("known master");
        nodes
            .iter()
            .find(|n| n.master_id.as_deref() == Some(master.id.as_str()) && !n.failed)
            .map(|n| n.port)
            .expect("the master has a live replica")
    }

    /// The working directory (`dir`) of the node on `port`.
    pub fn dir_of(&self, port: u16) -> std::path::PathBuf {
        let node = self.nodes.iter().find(|n| n.port == port).expect("a node");
        node.dir.path().to_path_buf()
    }

    /// The port of the master that serves `key`'s slot.
    pub fn owner_of(&self, key: &str) -> u16 {
        self.masters()
            .into_iter()
            .find(|&port| !cli(port, &["TYPE", key]).starts_with("MOVED"))
            .expect("a master serves every slot")
    }

    /// The node ID of the node on `port`.
    pub fn id_of(&self, port: u16) -> String {
        cli(port, &["CLUSTER", "MYID"]).trim().to_string()
    }

    /// Whether every live node reports `cluster_state:ok`, agrees on the same masters,
    /// knows no live node as failed and a live replica for every master, and every
    /// replica's link to its master is up.
    pub fn healthy(&self) -> bool {
        let live = self.live_ports();
        let mut views = Vec::new();
        for &port in &live {
            if !cli(port, &["CLUSTER", "INFO"]).contains("cluster_state:ok") {
                return false;
            }
            let nodes = parse_nodes(&cli(port, &["CLUSTER", "NODES"]));
            if nodes
                .iter()
                .any(|n| live.contains(&n.port) && n.failed || !live.contains(&n.port) && !n.failed)
            {
                return false;
            }
            let serving: Vec<&NodeInfo> =
                nodes.iter().filter(|n| n.master && n.slots > 0).collect();
            if !serving.iter().all(|m| {
                nodes
                    .iter()
                    .any(|r| r.master_id.as_deref() == Some(m.id.as_str()) && !r.failed)
            }) {
                return false;
            }
            let mut masters: Vec<(u16, usize)> = nodes
                .iter()
                .filter(|n| n.master && n.slots > 0)
                .map(|n| (n.port, n.slots))
                .collect();
            masters.sort();
            views.push(masters);
            let info = cli(port, &["INFO", "replication"]);
            if info.contains("role:slave") && !info.contains("master_link_status:up") {
                return false;
            }
        }
        views.windows(2).all(|w| w[0] == w[1])
            && views
                .first()
                .is_some_and(|m| m.iter().map(|(_, s)| s).sum::<usize>() == 16384)
    }

    /// Waits until every live node's `CLUSTER NODES` shows `slot` served by the node on
    /// `port`: a slot handed over with `CLUSTER SETSLOT ... NODE` reaches the nodes it was
    /// not sent to (replicas, on Redis 7.0 even the target's) by gossip.
    pub fn wait_slot_owner(&self, slot: usize, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let served = |p: u16| {
            parse_nodes(&cli(p, &["CLUSTER", "NODES"]))
                .iter()
                .any(|n| n.port == port && n.ranges.iter().any(|&(a, b)| (a..=b).contains(&slot)))
        };
        while !self.live_ports().into_iter().all(served) {
            assert!(
                Instant::now() < deadline,
                "slot {slot} not on {port} everywhere: {:?}",
                self.topology()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until [`RedisCluster::healthy`]; panics after `limit`.
    pub fn wait_healthy(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !self.healthy() {
            assert!(
                Instant::now() < deadline,
                "cluster not healthy after {limit:?}: {:?}",
                self.topology()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the master on `port` with SIGKILL and waits until its replica has taken over
    /// its slots and every live node agrees. Returns how long the takeover took.
    pub fn kill_master(&mut self, port: u16) -> Duration {
        let started = Instant::now();
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node of this cluster");
        node.kill();
        self.wait_failover(port);
        started.elapsed()
    }

    /// Sends SIGSTOP (`freeze`) or SIGCONT to the node on `port`: a frozen replica stops
    /// taking its master's writes without the master noticing at once.
    pub fn signal(&self, port: u16, freeze: bool) {
        let node = self.nodes.iter().find(|n| n.port == port).expect("a node");
        let pid = node.child.as_ref().expect("running").id().to_string();
        let sig = if freeze { "-STOP" } else { "-CONT" };
        let status = Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Kills the node on `port` with SIGKILL, waiting for nothing.
    pub fn kill_node(&mut self, port: u16) {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node of this cluster")
            .kill();
    }

    /// Waits until the dead master on `port` is marked failed, another node serves its
    /// slots and every live node reports `cluster_state:ok`.
    pub fn wait_failover(&self, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let live = self.live_ports();
            let settled = live.iter().all(|&p| {
                let nodes = parse_nodes(&cli(p, &["CLUSTER", "NODES"]));
                cli(p, &["CLUSTER", "INFO"]).contains("cluster_state:ok")
                    && nodes.iter().any(|n| n.port == port && n.failed)
                    && !nodes
                        .iter()
                        .any(|n| n.master && n.slots > 0 && !live.contains(&n.port))
            });
            if settled {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no replica took over from {port}: {:?}",
                self.topology()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts a killed node again on its port and directory (it rejoins as a replica of
    /// whoever took its slots, and syncs from scratch), then waits until all is healthy.
    pub fn restart(&mut self, port: u16) {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node of this cluster");
        assert!(node.child.is_none(), "node {port} is running");
        node.child = Some(spawn_node(port, node.dir.path()));
        assert!(
            node.wait_ready(Duration::from_secs(10)),
            "node {port} is up"
        );
        self.wait_healthy(Duration::from_secs(60));
    }

    /// Runs `CLUSTER FAILOVER` on the replica of the master on `port` and waits until the
    /// replica is a master serving the slots and everything is healthy. Returns the new
    /// master's port.
    pub fn force_failover(&self, port: u16) -> u16 {
        let replica = self.replica_of(port);
        assert_eq!(cli(replica, &["CLUSTER", "FAILOVER"]).trim(), "OK");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !(self.masters().contains(&replica) && self.healthy()) {
            assert!(
                Instant::now() < deadline,
                "failover to {replica} did not finish"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        replica
    }

    /// Moves `slots` slots from the master on `from` to the master on `to` with
    /// `redis-cli --cluster reshard`, then waits until every node agrees.
    pub fn reshard(&self, from: u16, to: u16, slots: usize) {
        let out = Command::new("redis-cli")
            .args(["--cluster", "reshard", &format!("127.0.0.1:{from}")])
            .args(["--cluster-from", &self.id_of(from)])
            .args(["--cluster-to", &self.id_of(to)])
            .args(["--cluster-slots", &slots.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .output()
            .expect("redis-cli --cluster reshard");
        assert!(
            out.status.success(),
            "reshard failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.wait_healthy(Duration::from_secs(60));
    }
}

impl Node {
    fn wait_ready(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            match self.child.as_mut().map(|c| c.try_wait()) {
                Some(Ok(None)) => {}
                _ => return false,
            }
            if cli(self.port, &["PING"]).trim() == "PONG" {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// SIGKILL by pid, then reap.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A cluster node owning every slot, for a client that is not a cluster's (as a proxy in
/// front of several shards answers): it refuses a script whose keys sit in several slots
/// with `CROSSSLOT`, and runs one whose keys share a slot. Killed when dropped.
pub struct LoneNode {
    node: Node,
}

impl LoneNode {
    /// Starts a node (on a port whose bus port is free too) and gives it every slot.
    pub fn start() -> LoneNode {
        let node = LoneNode {
            node: RedisCluster::start_node(),
        };
        node.cli(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !node.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok") {
            assert!(Instant::now() < deadline, "the node owns every slot");
            std::thread::sleep(Duration::from_millis(20));
        }
        node
    }

    /// Its client port.
    pub fn port(&self) -> u16 {
        self.node.port
    }

    /// `redis-cli` against the node: its output.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.node.port, args)
    }
}

impl Drop for LoneNode {
    fn drop(&mut self) {
        self.node.kill();
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
    }
}

/// Whether the server on `PATH` survives a client blocked in `XREADGROUP` whose stream is
/// `MIGRATE`d away while its slot moves; when not, says that `test` is skipped. Redis 7.2
/// before 7.2.7 fails an assertion (`c->duration == 0`) and dies when the woken read is
/// answered with a redirection (redis/redis#13311; Valkey fixed it before 8.0).
pub fn survives_a_blocked_read_migrated(test: &str) -> bool {
    let Server { project, version } = server();
    let crashes = project == "Redis" && (version.0, version.1) == (7, 2) && version.2 < 7;
    if crashes {
        skip(
            test,
            "the master crashes when a blocked XREADGROUP's stream is migrated \
             (redis/redis#13311, fixed in 7.2.7)",
        );
    }
    !crashes
}

/// A store on `url` (a pool of one connection) whose writes wait for one replica's
/// acknowledgement, up to `timeout`.
pub async fn one_replica_store(url: &str, reconnect: Reconnect, timeout: Duration) -> Store {
    let store = Store::connect(url, "rb", 1, reconnect)
        .await
        .expect("connect")
        .with_script_calls(script_calls());
    store.with_durability(rollboard::config::Durability {
        replicas: Some(1),
        timeout,
    })
}

/// The port of the master `client` believes serves `key`.
pub fn owner(client: &fred::prelude::Client, key: &str) -> u16 {
    use fred::prelude::*;
    use fred::types::cluster::ClusterRouting;
    client
        .cached_cluster_state()
        .expect("cluster state")
        .get_server(ClusterRouting::hash_key(key.as_bytes()))
        .expect("owner")
        .port
}
