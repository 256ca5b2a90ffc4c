//! A real `redis-server` on a free loopback port in a temp dir, killed on drop, and the
//! counters of what it ran.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fred::error::Error;
use fred::prelude::*;
use fred::types::{MultipleKeys, MultipleValues};
use rollboard::store::{Reconnect, Store};

use rollboard::config::ScriptCalls;
use rollboard::store::lua::EvalScript;

use crate::support::env::script_calls;

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
        .spawn_in(dir)
}

/// Starting a `redis-server` command quietly in its own directory.
pub trait SpawnIn {
    /// Spawns with `--dir dir` and no output; panics when redis-server is missing.
    fn spawn_in(&mut self, dir: &std::path::Path) -> Child;
}

impl SpawnIn for Command {
    fn spawn_in(&mut self, dir: &std::path::Path) -> Child {
        self.arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (scripts/ensure-redis)")
    }
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

    /// Every key of the server, as `redis-cli --scan` lists them.
    pub fn scan_all(&self) -> std::collections::BTreeSet<String> {
        self.cli(&["--scan"])
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// The ZSet `key` as `redis-cli` prints `ZREVRANGE key 0 -1 WITHSCORES`: a ranking,
    /// best first, each member followed by its score.
    pub fn ranking(&self, key: &str) -> String {
        self.cli(&["ZREVRANGE", key, "0", "-1", "WITHSCORES"])
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
            .with_script_calls(script_calls())
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

/// The name `script` (e.g. `fold`) is called by (`FCALL <name> ...`, or `EVALSHA <sha>
/// ...` when the run calls by [`script_calls`] `eval`): a proxy pattern that matches the
/// calls of that script only.
pub fn function_name(script: &str) -> Vec<u8> {
    let file = format!("{script}.lua");
    if script_calls() == ScriptCalls::Eval {
        return eval_script(&file).sha.clone().into_bytes();
    }
    rollboard::store::lua::library()
        .function(&file)
        .into_bytes()
}

/// `file`'s text for `EVALSHA` (e.g. `fold.lua`), with the digest it is called by.
pub fn eval_script(file: &str) -> &'static EvalScript {
    rollboard::store::lua::eval_scripts()
        .iter()
        .find(|s| s.file == file)
        .expect("a script of the library")
}

/// Calls `script` (e.g. `fold`) of rollboard's Lua scripts as the daemon does (by `FCALL`,
/// or `EVALSHA` when the run calls by [`script_calls`] `eval`), loading the scripts first
/// when the server lacks them.
pub async fn fcall<R, K, V>(client: &Client, script: &str, keys: K, args: V) -> Result<R, Error>
where
    R: FromValue,
    K: Into<MultipleKeys> + Send,
    V: TryInto<MultipleValues> + Send,
    V::Error: Into<Error> + Send,
{
    let file = format!("{script}.lua");
    let (keys, args) = (keys.into(), args.try_into().map_err(Into::into)?);
    if script_calls() == ScriptCalls::Eval {
        let script = eval_script(&file);
        return match client
            .evalsha(script.sha.as_str(), keys.clone(), args.clone())
            .await
        {
            Err(e) if e.details().starts_with("NOSCRIPT") => {
                client.script_load::<Value, _>(script.text.as_str()).await?;
                client.evalsha(script.sha.as_str(), keys, args).await
            }
            reply => reply,
        };
    }
    let library = rollboard::store::lua::library();
    let function = library.function(&file);
    match client
        .fcall(function.as_str(), keys.clone(), args.clone())
        .await
    {
        Err(e) if e.details().contains("Function not found") => {
            client
                .function_load::<Value, _>(true, library.text.as_str())
                .await?;
            client.fcall(function, keys, args).await
        }
        reply => reply,
    }
}

/// How many script calls (`FCALL` and `EVALSHA`) the server has run (`INFO commandstats`).
pub fn fcall_calls(redis: &RedisServer) -> u64 {
    command_calls(redis, "fcall") + command_calls(redis, "evalsha")
}

/// How many loads of rollboard's scripts (`FUNCTION LOAD` or `SCRIPT LOAD`) the server has
/// run (`INFO commandstats`).
pub fn script_loads(redis: &RedisServer) -> u64 {
    command_calls(redis, "function|load") + command_calls(redis, "script|load")
}

/// How many times the server has run `command` (`INFO commandstats`, e.g. `function|load`).
pub fn command_calls(redis: &RedisServer, command: &str) -> u64 {
    command_calls_at(redis.port, command)
}

/// [`command_calls`] of the server on `port` (one started by another fixture).
pub fn command_calls_at(port: u16, command: &str) -> u64 {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "INFO", "commandstats"])
        .output()
        .expect("redis-cli");
    let info = String::from_utf8_lossy(&out.stdout);
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("calls"))
}

impl RedisServer {
    /// Starts a server and connects a store to it with key prefix `prefix`.
    pub async fn start_with_store(prefix: &str) -> (RedisServer, Store) {
        let redis = RedisServer::start();
        let store = redis.store(prefix).await;
        (redis, store)
    }

    /// As [`RedisServer::start_with_store`], with a temp dir for the test's files.
    pub async fn start_with_store_and_dir(prefix: &str) -> (RedisServer, Store, tempfile::TempDir) {
        let (redis, store) = RedisServer::start_with_store(prefix).await;
        (redis, store, tempfile::tempdir().expect("temp dir"))
    }
}

/// The reply to the command `name` with `args`, the key first, sent to the node that holds
/// that key: any command, whatever the key's type, unchecked by the client.
pub async fn keyed<R, T>(store: &Store, name: &'static str, args: Vec<T>) -> R
where
    R: FromValue,
    T: TryInto<Value> + Send,
    T::Error: Into<Error> + Send,
{
    use fred::types::{ClusterHash, CustomCommand};
    let command = CustomCommand::new_static(name, ClusterHash::FirstKey, false);
    store.client().custom(command, args).await.expect(name)
}
