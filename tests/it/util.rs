//! Shared test fixtures: a real `redis-server` on a free loopback port in a temp dir,
//! killed on drop, and helpers to build boards and stores.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rollboard::domain::board::{Board, Dedup, Mode, TieBreak};
use rollboard::store::{ApplyEvent, Reconnect, Store};

/// A redis-server child process listening on 127.0.0.1.
pub struct RedisServer {
    child: Child,
    /// The port it listens on.
    pub port: u16,
    _dir: tempfile::TempDir,
}

/// A loopback port that was free a moment ago, handed out once per test process.
///
/// Ports come from 20000–32767, below Linux's ephemeral range (32768–60999): a port picked
/// there cannot be taken by the outgoing connections the tests open meanwhile (which
/// `bind(0)` would risk, letting one test's daemon answer another test's requests), and a
/// process-wide counter never hands the same port to two tests. The bind check skips ports
/// that other processes hold.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_768;
    let start = std::process::id().wrapping_mul(7919) % SPAN;
    for _ in 0..SPAN {
        let port = (FIRST + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in 20000-32767")
}

fn spawn_redis(port: u16, dir: &std::path::Path, persistent: bool) -> Child {
    let aof = if persistent { "yes" } else { "no" };
    Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", aof, "--appendfsync", "always"])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server is installed (apt-get install redis-server)")
}

impl RedisServer {
    /// Starts a fresh server without persistence; panics when none can be started.
    pub fn start() -> RedisServer {
        Self::start_with(false)
    }

    /// Starts a fresh server that writes an fsync-always append-only file, so that
    /// [`RedisServer::restart`] keeps the data.
    pub fn start_persistent() -> RedisServer {
        Self::start_with(true)
    }

    /// Starts the killed server again on the same port and directory.
    pub fn restart(&mut self) {
        self.kill();
        self.child = spawn_redis(self.port, self._dir.path(), true);
        assert!(
            self.wait_ready(Duration::from_secs(10)),
            "redis-server did not come back"
        );
    }

    /// Stops the server gracefully (`SHUTDOWN`: the append-only file is written and synced
    /// whatever `appendfsync` says) and starts it again on the same port and directory.
    pub fn shutdown_and_restart(&mut self) {
        self.cli(&["SHUTDOWN"]);
        let _ = self.child.wait();
        self.child = spawn_redis(self.port, self._dir.path(), true);
        assert!(
            self.wait_ready(Duration::from_secs(10)),
            "redis-server did not come back"
        );
    }

    fn start_with(persistent: bool) -> RedisServer {
        for _ in 0..20 {
            let dir = tempfile::tempdir().expect("temp dir");
            let port = free_port();
            let child = spawn_redis(port, dir.path(), persistent);
            let mut server = RedisServer {
                child,
                port,
                _dir: dir,
            };
            if server.wait_ready(Duration::from_secs(5)) {
                return server;
            }
            // Port taken between probing and binding: try another one.
            let _ = server.child.kill();
            let _ = server.child.wait();
        }
        panic!("could not start redis-server");
    }

    fn wait_ready(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Ok(out) = Command::new("redis-cli")
                .args(["-p", &self.port.to_string(), "PING"])
                .output()
            {
                if String::from_utf8_lossy(&out.stdout).trim() == "PONG" {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs redis-cli against the server and returns its standard output.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A store connected to this server under `prefix`.
    pub async fn store(&self, prefix: &str) -> Store {
        Store::connect(&self.url(), prefix, 2, Reconnect::Never)
            .await
            .expect("connect")
    }

    /// The server's working directory (`dir`), where it would write its snapshots.
    pub fn dir(&self) -> &std::path::Path {
        self._dir.path()
    }

    /// The server's process id (e.g. to freeze it with SIGSTOP).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the server (as a crash would).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An event for `Store::apply`.
pub fn ev(id: &str, ts: i64, member: &str, amount: i64) -> ApplyEvent {
    ApplyEvent {
        id: id.into(),
        ts,
        member: member.into(),
        amount,
    }
}

/// A board with small slices for tests: `slice` ms wide, `n` slices per window.
pub fn board(name: &str, slice: i64, n: i64) -> Board {
    Board {
        name: name.into(),
        member: "user".into(),
        scope: None,
        amount: "amount".into(),
        scale: 0,
        window_ms: slice * n,
        slice_ms: slice,
        mode: Mode::Incremental,
        tie_break: TieBreak::Earliest,
        allow_negative: false,
        dense_rank: false,
        dedup: Dedup::Window,
        period: None,
    }
}

/// The four shapes of board a script can run for (incremental or resummarize, with or
/// without refunds, each tie-break), `slice` ms wide, `n` slices per window.
pub fn variants(slice: i64, n: i64) -> Vec<Board> {
    let inc = board("inc", slice, n);
    let mut inc_neg = board("incneg", slice, n);
    inc_neg.allow_negative = true;
    inc_neg.tie_break = TieBreak::Latest;
    let mut res = board("res", slice, n);
    res.mode = Mode::Resummarize;
    let mut res_neg = board("resneg", slice, n);
    res_neg.mode = Mode::Resummarize;
    res_neg.allow_negative = true;
    res_neg.tie_break = TieBreak::None;
    vec![inc, inc_neg, res, res_neg]
}

/// Every key under an unscoped board's hash tag with its DUMP, to prove a call wrote
/// nothing.
pub async fn snapshot(store: &Store, board: &Board) -> std::collections::BTreeMap<String, Vec<u8>> {
    use fred::prelude::*;
    use fred::types::{ClusterHash, CustomCommand};
    let pattern = format!("rb:{{{}}}:*", board.name);
    let keys: Vec<String> = store
        .client()
        .custom(
            CustomCommand::new_static("KEYS", ClusterHash::Random, false),
            vec![pattern],
        )
        .await
        .expect("keys");
    let mut out = std::collections::BTreeMap::new();
    for key in keys {
        let dump: Value = store
            .client()
            .custom(
                CustomCommand::new_static("DUMP", ClusterHash::FirstKey, false),
                vec![key.clone()],
            )
            .await
            .expect("dump");
        let bytes = match dump {
            Value::Bytes(b) => b.to_vec(),
            Value::String(s) => s.as_bytes().to_vec(),
            other => format!("{other:?}").into_bytes(),
        };
        out.insert(key, bytes);
    }
    out
}

/// Polls `check` until it returns true or `limit` passes.
pub async fn wait_for<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The board definitions the daemon tests run with (as in config/rollboard.toml, with
/// quick jobs and short timeouts).
pub const BOARDS: &str = r#"
[[boards]]
name = "rooms_7d"
member = "room"
window = "7d"
slice = "6h"

[[boards]]
name = "fans_7d"
member = "user"
scope = "room"
window = "7d"
slice = "1h"
mode = "resummarize"

[[boards]]
name = "tips_24h"
member = "user"
amount = "value"
scale = 2
window = "24h"
slice = "1h"
tie_break = "latest"
allow_negative = true
"#;

/// A config file for a daemon talking to `redis` and listening on `http_port`.
pub fn write_config(
    dir: &std::path::Path,
    redis: &RedisServer,
    http_port: u16,
    consumer: &str,
    extra: &str,
) -> std::path::PathBuf {
    write_config_url(dir, &redis.url(), http_port, consumer, extra)
}

/// As [`write_config`], for a daemon reaching Redis at `url` (e.g. through a [`crate::proxy::Proxy`]).
pub fn write_config_url(
    dir: &std::path::Path,
    url: &str,
    http_port: u16,
    consumer: &str,
    extra: &str,
) -> std::path::PathBuf {
    let path = dir.join(format!("rollboard-{consumer}.toml"));
    let text = format!(
        "[redis]\nurl = \"{url}\"\n[ingest]\nconsumer = \"{consumer}\"\nblock = \"100ms\"\nclaim_idle = \"1s\"\nbatch_size = 200\n\
         [schedule]\nroll = \"*/2 * * * * *\"\nresummarize = \"* * * * * *\"\nlease = \"5s\"\n[http]\nlisten = \"127.0.0.1:{http_port}\"\n{extra}\n{BOARDS}"
    );
    std::fs::write(&path, text).expect("write config");
    path
}

/// A `rollboard run` child process.
pub struct Daemon {
    child: tokio::process::Child,
    /// Base URL of its HTTP server.
    pub base: String,
    /// Where its logs go.
    pub log: std::path::PathBuf,
}

impl Daemon {
    /// Starts `rollboard run` with `config` and waits until `/healthz` answers.
    pub async fn start(config: &std::path::Path, http_port: u16) -> Daemon {
        let daemon = Daemon::spawn(config, http_port);
        daemon.wait_up().await;
        daemon
    }

    /// Waits until `/healthz` answers (the start-up checks passed and HTTP is open).
    pub async fn wait_up(&self) {
        let url = format!("{}/healthz", self.base);
        let up = wait_for(Duration::from_secs(20), || {
            let url = url.clone();
            async move {
                reqwest::get(&url)
                    .await
                    .is_ok_and(|r| r.status().is_success())
            }
        })
        .await;
        assert!(up, "daemon did not come up; log:\n{}", self.logs());
    }

    /// Starts `rollboard run` with `config` and returns at once.
    pub fn spawn(config: &std::path::Path, http_port: u16) -> Daemon {
        Daemon::spawn_with(config, http_port, &[])
    }

    /// As [`Daemon::spawn`], with `env` added to its environment (e.g. libfaketime's).
    pub fn spawn_with(config: &std::path::Path, http_port: u16, env: &[(&str, String)]) -> Daemon {
        Daemon::spawn_args(config, http_port, env, &[], "info")
    }

    /// As [`Daemon::spawn_with`], with `args` after `run` (e.g. `--roles`) and `RUST_LOG`
    /// set to `log`.
    pub fn spawn_args(
        config: &std::path::Path,
        http_port: u16,
        env: &[(&str, String)],
        args: &[&str],
        log_filter: &str,
    ) -> Daemon {
        let log = config.with_extension("log");
        let file = std::fs::File::create(&log).expect("log file");
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_rollboard"));
        command.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        let child = command
            .args(["--config", config.to_str().expect("utf-8 path"), "run"])
            .args(args)
            .env("RUST_LOG", log_filter)
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn rollboard run");
        Daemon {
            child,
            base: format!("http://127.0.0.1:{http_port}"),
            log,
        }
    }

    /// Waits until its log holds `text`.
    pub async fn wait_log(&self, text: &str) {
        let logged = wait_for(Duration::from_secs(20), || async {
            self.logs().contains(text)
        })
        .await;
        assert!(logged, "never logged {text:?}; log:\n{}", self.logs());
    }

    /// Its log output so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// SIGKILL, as a crash.
    pub async fn kill(mut self) {
        self.child.kill().await.expect("kill");
    }

    /// SIGTERM, then the exit status.
    pub async fn terminate(self) -> std::process::ExitStatus {
        self.send_term();
        self.wait_exit().await
    }

    /// Sends SIGTERM and returns at once.
    pub fn send_term(&self) {
        self.send_signal("TERM");
    }

    /// Sends the signal `name` (e.g. `HUP`) and returns at once.
    pub fn send_signal(&self, name: &str) {
        let pid = self.child.id().expect("running");
        let status = Command::new("kill")
            .args([&format!("-{name}"), &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{name}");
    }

    /// Freezes (SIGSTOP, `true`) or thaws (SIGCONT, `false`) the daemon: a read it had
    /// sent is still served by Redis meanwhile, so a batch can reach its pending list
    /// while it cannot act on it.
    pub fn freeze(&self, frozen: bool) {
        let pid = self.child.id().expect("running");
        let signal = if frozen { "-STOP" } else { "-CONT" };
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// The exit status of a daemon already told to stop.
    pub async fn wait_exit(mut self) -> std::process::ExitStatus {
        tokio::time::timeout(Duration::from_secs(40), self.child.wait())
            .await
            .expect("daemon exits within the grace period")
            .expect("wait")
    }

    /// GET a path, returning status and body.
    pub async fn get(&self, path: &str) -> (u16, String) {
        match reqwest::get(format!("{}{path}", self.base)).await {
            Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
            Err(_) => (0, String::new()),
        }
    }

    /// Reads one counter or gauge sample from `/metrics` (sum over samples matching labels).
    pub async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let (_, body) = self.get("/metrics").await;
        let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
            .expect("prometheus text");
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => 0.0,
            })
            .sum()
    }
}

/// The fields of one stream entry, in order.
pub type Fields = Vec<(String, String)>;

/// The boards of [`BOARDS`], validated.
pub fn test_boards() -> Vec<Board> {
    rollboard::config::Settings::from_toml(BOARDS)
        .expect("test boards")
        .boards
}

/// XADDs `events` to `stream`, pipelined 500 at a time.
pub async fn xadd_all(client: &fred::prelude::Client, stream: &str, events: &[Fields]) {
    use fred::prelude::*;
    for chunk in events.chunks(500) {
        futures_util::future::try_join_all(
            chunk
                .iter()
                .map(|f| client.xadd::<String, _, _, _, _>(stream, false, None, "*", f.clone())),
        )
        .await
        .expect("xadd");
    }
}

/// Waits until the group has delivered and acknowledged everything in `rb:events`.
pub async fn drained(store: &Store) -> bool {
    wait_for(Duration::from_secs(180), || async {
        matches!(
            rollboard::ingest::stream::group_info(store.client(), "rb:events", "rollboard").await,
            Ok(Some((0, Some(0))))
        )
    })
    .await
}

/// Every instance's model after `events` (stream entry ID, fields), applied in order at
/// `now`.
pub fn models(
    events: &[(String, Fields)],
    boards: &[Board],
    now: i64,
) -> std::collections::HashMap<(usize, Option<String>), crate::model::Instance> {
    let mut out: std::collections::HashMap<(usize, Option<String>), crate::model::Instance> =
        std::collections::HashMap::new();
    for (source, fields) in events {
        let raw: Vec<(Vec<u8>, Vec<u8>)> = fields
            .iter()
            .map(|(a, b)| (a.clone().into_bytes(), b.clone().into_bytes()))
            .collect();
        let event = rollboard::domain::event::parse(&raw, source, boards, now, 300_000)
            .expect("valid test event");
        for u in event.updates {
            let e = ApplyEvent {
                id: event.id.clone(),
                ts: event.ts,
                member: u.member,
                amount: u.amount,
            };
            out.entry((u.board, u.scope))
                .or_default()
                .apply(&boards[u.board], &e, now);
        }
    }
    out
}

/// Checks every instance against its model; resummarize instances once the job (every
/// second in the test config) has run since their last event.
pub async fn assert_state(
    store: &Store,
    boards: &[Board],
    models: &std::collections::HashMap<(usize, Option<String>), crate::model::Instance>,
    now: i64,
) {
    assert_state_or(store, boards, models, now, String::new).await;
}

/// [`assert_state`], with `context` (a daemon's log, say) in the message when a
/// resummarize instance never catches up.
pub async fn assert_state_or(
    store: &Store,
    boards: &[Board],
    models: &std::collections::HashMap<(usize, Option<String>), crate::model::Instance>,
    now: i64,
    context: impl Fn() -> String,
) {
    for ((b, scope), model) in models {
        let board = &boards[*b];
        if board.mode == Mode::Resummarize {
            let expected = model.ranking(board);
            let ranked = || async {
                let page = store
                    .top(board, scope.as_deref(), 0, 1000, now)
                    .await
                    .expect("top");
                page.entries
                    .iter()
                    .map(|e| (e.member.clone(), e.total, e.last_ts))
                    .collect::<Vec<_>>()
            };
            let caught_up = wait_for(Duration::from_secs(10), || async {
                ranked().await == expected
            })
            .await;
            if !caught_up {
                let got = ranked().await;
                let differ: Vec<_> = expected
                    .iter()
                    .filter(|e| !got.contains(e))
                    .take(5)
                    .collect();
                let (meta, _) = store.meta(board, scope.as_deref()).await.expect("meta");
                let sums =
                    live_sums(store, board, scope.as_deref(), meta.unwrap_or(i64::MIN)).await;
                let slices_differ: Vec<_> = expected
                    .iter()
                    .filter(|(m, total, _)| sums.get(m) != Some(total))
                    .take(5)
                    .map(|(m, total, _)| (m, total, sums.get(m)))
                    .collect();
                panic!(
                    "resummarize board {}{scope:?} never caught up: {} ranked, {} expected, \
                     expected but not ranked (first 5): {differ:?}; the live slices (above \
                     {meta:?}) differ from the model for (member, model, slices; first 5): \
                     {slices_differ:?}\n{}",
                    board.name,
                    got.len(),
                    expected.len(),
                    context()
                );
            }
        }
        crate::model::assert_matches(store, board, scope.as_deref(), model, now).await;
    }
}

/// Each member's total over the live slices (those registered above `watermark`).
async fn live_sums(
    store: &Store,
    board: &Board,
    scope: Option<&str>,
    watermark: i64,
) -> std::collections::HashMap<String, i64> {
    let k = store.instance(board, scope);
    let mut sums = std::collections::HashMap::new();
    for n in store
        .live_slices(board, scope, watermark)
        .await
        .expect("live slices")
    {
        use fred::interfaces::HashesInterface;
        let fields: std::collections::HashMap<String, i64> =
            store.client().hgetall(k.slice(n)).await.expect("slice");
        for (member, amount) in fields {
            *sums.entry(member).or_default() += amount;
        }
    }
    sums
}

/// Waits until the group has delivered and acknowledged everything in each of `streams`.
pub async fn drained_streams(store: &Store, streams: &[String]) -> bool {
    wait_for(Duration::from_secs(60), || async {
        for stream in streams {
            let info =
                rollboard::ingest::stream::group_info(store.client(), stream, "rollboard").await;
            if !matches!(info, Ok(Some((0, Some(0))))) {
                return false;
            }
        }
        true
    })
    .await
}

/// One entry of an instance's digest table: the id's digest and its slice (mod 2^32).
pub type SeenEntry = ([u8; 16], u32);

/// Reads the digest table of an instance (the linear hash described in `apply.lua`) and
/// checks its invariants: the state fields, every bucket named by an address below
/// 2^L + p holding whole 20-byte entries whose digests all address that bucket, and `#n`
/// equal to the entries held. Returns every entry.
pub async fn seen_table(store: &Store, board: &Board, scope: Option<&str>) -> Vec<SeenEntry> {
    use fred::prelude::*;
    let key = store.instance(board, scope).seen_table();
    let fields: std::collections::HashMap<String, Vec<u8>> =
        store.client().hgetall(&key).await.expect("hgetall");
    if fields.is_empty() {
        return Vec::new();
    }
    let number = |f: &str| -> u64 {
        let v = fields.get(f).unwrap_or_else(|| panic!("{key} has no {f}"));
        std::str::from_utf8(v).unwrap().parse().unwrap()
    };
    let (level, split, held) = (number("#L"), number("#p"), number("#n"));
    assert!(split < 1 << level, "{key}: #p {split} with #L {level}");
    let mut out = Vec::new();
    for (field, value) in &fields {
        if field.starts_with('#') {
            continue;
        }
        let a: u64 = field
            .parse()
            .unwrap_or_else(|_| panic!("{key}: field {field}"));
        assert!(a < (1 << level) + split, "{key}: bucket {a} past the table");
        assert!(!value.is_empty(), "{key}: empty bucket {a} kept");
        assert_eq!(
            value.len() % 20,
            0,
            "{key}: bucket {a} of {} bytes",
            value.len()
        );
        for entry in value.chunks(20) {
            let h = u64::from(u32::from_be_bytes(entry[..4].try_into().unwrap()));
            let mut addr = h % (1 << level);
            if addr < split {
                addr = h % (1 << (level + 1));
            }
            assert_eq!(addr, a, "{key}: an entry of bucket {a} addresses {addr}");
            out.push((
                entry[..16].try_into().unwrap(),
                u32::from_be_bytes(entry[16..].try_into().unwrap()),
            ));
        }
    }
    assert_eq!(out.len() as u64, held, "{key}: #n");
    out
}

/// Whether the instance remembers `id` as applied in slice `n`.
pub async fn remembers(
    store: &Store,
    board: &Board,
    scope: Option<&str>,
    id: &str,
    n: i64,
) -> bool {
    let digest = rollboard::store::id_digest(id);
    seen_table(store, board, scope)
        .await
        .contains(&(digest, n.rem_euclid(1 << 32) as u32))
}

/// The instance's forget-log keys (`seen:<n>`) that exist.
pub async fn seen_logs(store: &Store, board: &Board, scope: Option<&str>) -> Vec<String> {
    use fred::prelude::*;
    use fred::types::{ClusterHash, CustomCommand};
    let table = store.instance(board, scope).seen_table();
    let pattern = format!("{}:*", table.trim_end_matches(":ids"));
    let mut keys: Vec<String> = store
        .client()
        .custom(
            CustomCommand::new_static("KEYS", ClusterHash::Random, false),
            vec![pattern],
        )
        .await
        .expect("keys");
    keys.retain(|k| k != &table);
    keys.sort();
    keys
}

/// Runs both jobs once at `now` over `boards` (`schedule.chunk` = `chunk`) and checks
/// that every instance was rolled.
pub async fn roll_all(
    store: &Store,
    boards: &[Board],
    now: i64,
    chunk: usize,
) -> Vec<rollboard::roll::Report> {
    let reports = rollboard::roll::run_once(
        store,
        boards,
        rollboard::roll::Job::All,
        None,
        now,
        chunk,
        &tokio_util::sync::CancellationToken::new(),
    )
    .await
    .expect("roll");
    for r in &reports {
        assert_eq!(r.instances_failed, 0, "{}: {:?}", r.board, r.first_error);
    }
    reports
}

/// Ingest settings for `process_batch` called directly: `stream` in `partitions`
/// partitions, the default group and dead-letter stream.
pub fn ingest_settings(stream: &str, partitions: usize) -> rollboard::config::IngestSettings {
    rollboard::config::IngestSettings {
        stream: stream.into(),
        partitions,
        group: "rollboard".into(),
        consumer: "c1".into(),
        batch_size: 100,
        block: Duration::from_millis(100),
        claim_idle: Duration::from_secs(30),
        dead_letter_stream: "rb:events:dead".into(),
        dead_letter_max_len: 100_000,
        retain: Duration::from_secs(60),
        max_future_ms: 60_000,
    }
}

/// One stream entry `id` with `fields`.
pub fn entry(id: &str, fields: &[(&str, &str)]) -> rollboard::ingest::stream::Entry {
    rollboard::ingest::stream::Entry {
        id: id.into(),
        fields: Some(
            fields
                .iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
                .collect(),
        ),
    }
}

/// The total of `member` on the unscoped instance of `board` at `now`.
pub async fn total_at(store: &Store, board: &Board, member: &str, now: i64) -> Option<i64> {
    store
        .rank(board, None, member, now)
        .await
        .expect("rank")
        .total
}

/// As [`write_config`], with `partitions` stream partitions.
pub fn partitioned_config(
    dir: &std::path::Path,
    redis: &RedisServer,
    port: u16,
    consumer: &str,
    partitions: usize,
) -> std::path::PathBuf {
    let path = write_config(dir, redis, port, consumer, "");
    let text = std::fs::read_to_string(&path).expect("read config");
    let text = text.replacen(
        "[ingest]\n",
        &format!("[ingest]\npartitions = {partitions}\n"),
        1,
    );
    let path = dir.join(format!("rollboard-{consumer}-{partitions}.toml"));
    std::fs::write(&path, text).expect("write config");
    path
}

/// Runs the `rollboard` binary with `--config config` and `args`, ignoring any
/// `ROLLBOARD_CONFIG` of the test's environment.
pub fn run_rollboard(config: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rollboard"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env_remove("ROLLBOARD_CONFIG")
        .output()
        .expect("run rollboard")
}

/// Redis's clock (`TIME`), in epoch ms: the time rollboard judges by.
pub async fn redis_now(store: &Store) -> i64 {
    store.time_ms().await.expect("TIME")
}
