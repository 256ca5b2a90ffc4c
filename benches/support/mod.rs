//! What the benchmark programs share: a redis-server child on a free loopback port in a
//! temp dir (killed on drop), and percentile helpers.

// Each bench program compiles this module on its own and uses a part of it.
#![allow(dead_code)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A redis-server child process listening on 127.0.0.1, without persistence.
pub struct RedisServer {
    child: Child,
    /// The port it listens on.
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a server, or explains why it could not.
    pub fn start() -> Result<RedisServer, String> {
        for _ in 0..10 {
            let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .map_err(|e| format!("no free port: {e}"))?;
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
                .map_err(|e| {
                    format!("cannot start redis-server (scripts/ensure-redis installs it): {e}")
                })?;
            let mut server = RedisServer {
                child,
                port,
                _dir: dir,
            };
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if matches!(server.child.try_wait(), Ok(Some(_))) {
                    break;
                }
                if server.cli(&["PING"]).trim() == "PONG" {
                    return Ok(server);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Err("redis-server did not start".into())
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs redis-cli against the server; its standard output.
    pub fn cli(&self, args: &[&str]) -> String {
        Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `p`-th percentile (0..=100) of `samples`, sorted in place.
pub fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort_unstable();
    let rank = ((p / 100.0) * (samples.len() - 1) as f64).round() as usize;
    samples[rank.min(samples.len() - 1)]
}

/// Whether the program was started by `cargo bench` (which passes `--bench`); `cargo test`
/// builds bench targets too and must not run them.
pub fn invoked_by_cargo_bench() -> bool {
    std::env::args().any(|a| a == "--bench")
}
