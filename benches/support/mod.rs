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
    /// Whether it runs under callgrind ([`RedisServer::start_counted`]).
    pub counted: bool,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a server, or explains why it could not.
    pub fn start() -> Result<RedisServer, String> {
        Self::start_with(None)
    }

    /// Starts a server under valgrind's callgrind, which counts the instructions it runs
    /// (the same count for the same work, however busy the machine), into dump files
    /// `callgrind.out.<n>` in its temp dir: see [`RedisServer::instructions`].
    pub fn start_counted() -> Result<RedisServer, String> {
        Self::start_with(Some("valgrind"))
    }

    fn start_with(wrapper: Option<&str>) -> Result<RedisServer, String> {
        for _ in 0..10 {
            let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .map_err(|e| format!("no free port: {e}"))?;
            let mut command = match wrapper {
                Some(program) => {
                    let mut c = Command::new(program);
                    c.arg("--tool=callgrind").arg(format!(
                        "--callgrind-out-file={}",
                        dir.path().join("callgrind.out").display()
                    ));
                    c.arg("redis-server");
                    c
                }
                None => Command::new("redis-server"),
            };
            let child = command
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
                    format!(
                        "cannot start {} (scripts/ensure-redis installs redis-server): {e}",
                        wrapper.unwrap_or("redis-server")
                    )
                })?;
            let mut server = RedisServer {
                child,
                port,
                counted: wrapper.is_some(),
                dir,
            };
            // Under valgrind the server takes a few seconds to start.
            let wait = if wrapper.is_some() { 60 } else { 5 };
            let deadline = Instant::now() + Duration::from_secs(wait);
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

    /// For a server started with [`RedisServer::start_counted`]: the instructions it ran
    /// since the previous call (whose counts this zeroes), in all, and inside each of
    /// `functions` (Redis's C functions, e.g. `fcallCommand`, with all they call).
    /// callgrind dumps them, and `callgrind_annotate` sums them up.
    pub fn instructions(&self, functions: &[&str]) -> Result<(u64, Vec<u64>), String> {
        let dir = self.dir.path();
        let dumps = || -> usize {
            std::fs::read_dir(dir)
                .map(|d| {
                    d.filter_map(|e| e.ok())
                        .filter(|e| {
                            e.file_name()
                                .to_string_lossy()
                                .starts_with("callgrind.out.")
                        })
                        .count()
                })
                .unwrap_or(0)
        };
        let before = dumps();
        let pid = self.child.id().to_string();
        let status = Command::new("callgrind_control")
            .args(["--dump", &pid])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| format!("callgrind_control: {e}"))?;
        if !status.success() {
            return Err(format!("callgrind_control --dump {pid}: {status}"));
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while dumps() == before {
            if Instant::now() > deadline {
                return Err("callgrind wrote no dump".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let file = dir.join(format!("callgrind.out.{}", before + 1));
        // The dump is complete once its totals line is written.
        while !std::fs::read_to_string(&file).is_ok_and(|t| t.contains("\ntotals:")) {
            if Instant::now() > deadline {
                return Err(format!("{} is incomplete", file.display()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let report = Command::new("callgrind_annotate")
            .args(["--inclusive=yes", "--threshold=100"])
            .arg(&file)
            .output()
            .map_err(|e| format!("callgrind_annotate: {e}"))?;
        let text = String::from_utf8_lossy(&report.stdout);
        let count = |found: Option<&str>| -> u64 {
            found
                .and_then(|l| l.split_whitespace().next())
                .and_then(|n| n.replace(',', "").parse().ok())
                .unwrap_or(0)
        };
        let total = count(text.lines().find(|l| l.ends_with("PROGRAM TOTALS")));
        if total == 0 {
            return Err(format!(
                "no totals in callgrind_annotate's report of {}",
                file.display()
            ));
        }
        let each = functions
            .iter()
            .map(|f| {
                let name = format!(":{f} ");
                count(
                    text.lines()
                        .find(|l| l.contains(&name) || l.ends_with(&format!(":{f}"))),
                )
            })
            .collect();
        Ok((total, each))
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
