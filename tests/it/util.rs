//! Shared test fixtures: a real `redis-server` on a free loopback port in a temp dir,
//! killed on drop, and helpers to build boards and stores.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rollboard::board::{Board, Dedup, Mode, TieBreak};
use rollboard::store::{Reconnect, Store};

/// A redis-server child process listening on 127.0.0.1.
pub struct RedisServer {
    child: Child,
    /// The port it listens on.
    pub port: u16,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl RedisServer {
    /// Starts a fresh server without persistence; panics when none can be started.
    pub fn start() -> RedisServer {
        for _ in 0..20 {
            let dir = tempfile::tempdir().expect("temp dir");
            let port = free_port();
            let child = Command::new("redis-server")
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .arg("--dir")
                .arg(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server is installed (apt-get install redis-server)");
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
        dedup: Dedup::Window,
    }
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
