//! What the benchmark programs share: a redis-server child on a free loopback port in a
//! temp dir and the release daemon (each killed on drop), percentile helpers, the slow log
//! read by kind of call, the tip workloads ([`workload`]) and the capacity runs on Redis
//! Cluster ([`cluster`]).

// Each bench program compiles this module on its own and uses a part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};

pub mod cluster;
pub mod workload;

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
        keep_dump(&file)?;
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

/// A `rollboard run` child: the binary cargo built for the benches (the release one, under
/// `cargo bench`), its standard output and error in a log file; killed on drop.
pub struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    /// Starts `rollboard --config <config> run` with `env` set, logging to `log`.
    pub fn start(config: &Path, env: &[(&str, &str)], log: &Path) -> Result<Daemon, String> {
        let out = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out
            .try_clone()
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let child = Command::new(env!("CARGO_BIN_EXE_rollboard"))
            .arg("--config")
            .arg(config)
            .arg("run")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start the daemon: {e}"))?;
        Ok(Daemon {
            child,
            log: log.to_path_buf(),
        })
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status, once it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Stops it with SIGTERM and waits; an error unless it exits successfully.
    pub fn stop(&mut self) -> Result<(), String> {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .map_err(|e| e.to_string())?;
        if !status.success() {
            return Err("kill -TERM failed".into());
        }
        let status = self.child.wait().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("the daemon exited with {status}"));
        }
        Ok(())
    }

    /// The last 20 lines of its log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Waits until `GET /healthz` on `listen` (host:port) answers 200, for at most `limit`.
    pub async fn until_healthy(&mut self, listen: &str, limit: Duration) -> Result<(), String> {
        let http = reqwest::Client::new();
        let started = Instant::now();
        loop {
            let up = http.get(format!("http://{listen}/healthz")).send().await;
            if up.is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
            if let Some(status) = self.exited() {
                return Err(format!(
                    "the daemon exited ({status}):\n{}",
                    self.log_tail()
                ));
            }
            if started.elapsed() > limit {
                return Err(format!(
                    "the daemon did not answer /healthz within {limit:?}:\n{}",
                    self.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
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

/// Most entries the slow log keeps while a bench reads it.
pub const SLOWLOG_MAX_LEN: usize = 1_000_000;

/// The bound on one Redis call (µs): no call rollboard makes may hold Redis longer.
pub const BOUND_US: u64 = 2_000;

/// One slow-log entry: the command (upper case), the script it runs (the SHA of an
/// EVALSHA, the function of an FCALL), the time, and the client address (`?:0` for
/// commands run inside a script).
pub struct SlowEntry {
    pub command: String,
    pub script: Option<String>,
    pub micros: u64,
    pub client: String,
}

impl SlowEntry {
    /// A command of the bench's own watching.
    pub fn is_admin(&self) -> bool {
        matches!(
            self.command.as_str(),
            "SLOWLOG" | "CONFIG" | "INFO" | "XINFO" | "PING"
        )
    }

    /// A call of a script (a baseline's) or of a function (rollboard's).
    pub fn is_script(&self) -> bool {
        matches!(self.command.as_str(), "EVALSHA" | "FCALL")
    }

    /// A command run inside a script.
    pub fn is_nested(&self) -> bool {
        !self.client.starts_with("127.0.0.1:")
    }

    /// The kind of call: the command, and for a script call the script (`FCALL fold`).
    pub fn kind(&self) -> String {
        match &self.script {
            Some(script) => format!("{} {script}", self.command),
            None => self.command.clone(),
        }
    }
}

async fn admin(client: &Client, name: &'static str, args: &[&str]) -> Result<Value, String> {
    client
        .custom(
            CustomCommand::new_static(name, ClusterHash::Random, false),
            args.iter().map(|a| Value::from(*a)).collect::<Vec<_>>(),
        )
        .await
        .map_err(|e| format!("redis {name}: {e}"))
}

/// Logs every command that takes at least `micros` from now on, into an emptied slow log.
pub async fn slowlog_start(client: &Client, micros: u64) -> Result<(), String> {
    let max_len = SLOWLOG_MAX_LEN.to_string();
    admin(client, "CONFIG", &["SET", "slowlog-max-len", &max_len]).await?;
    let threshold = micros.to_string();
    admin(
        client,
        "CONFIG",
        &["SET", "slowlog-log-slower-than", &threshold],
    )
    .await?;
    admin(client, "SLOWLOG", &["RESET"]).await?;
    Ok(())
}

/// Turns the slow log off and empties it.
pub async fn slowlog_stop(client: &Client) -> Result<(), String> {
    admin(client, "CONFIG", &["SET", "slowlog-log-slower-than", "-1"]).await?;
    admin(client, "SLOWLOG", &["RESET"]).await?;
    Ok(())
}

/// Reads the whole slow log (oldest first), then turns it off and empties it.
pub async fn slowlog_take(client: &Client) -> Result<Vec<SlowEntry>, String> {
    // Up to SLOWLOG_MAX_LEN entries: on a busy machine that reply takes longer than the
    // client's default command timeout.
    let patient = fred::prelude::Options {
        timeout: Some(Duration::from_secs(300)),
        ..Default::default()
    };
    let raw: Value = client
        .with_options(&patient)
        .custom(
            CustomCommand::new_static("SLOWLOG", ClusterHash::Random, false),
            vec![Value::from("GET"), Value::from("-1")],
        )
        .await
        .map_err(|e| format!("redis SLOWLOG GET: {e}"))?;
    slowlog_stop(client).await?;
    raw.into_array().into_iter().rev().map(slow_entry).collect()
}

/// Decodes `[id, timestamp, duration µs, [argv...], client address, client name]`.
fn slow_entry(entry: Value) -> Result<SlowEntry, String> {
    let mut fields = entry.into_array().into_iter();
    let micros = fields
        .nth(2)
        .and_then(|d| d.as_u64())
        .ok_or("slow-log entry without a duration")?;
    let argv = fields.next().map(Value::into_array).unwrap_or_default();
    let client = fields
        .next()
        .and_then(|c| c.as_string())
        .unwrap_or_default();
    let text = |i: usize| argv.get(i).and_then(Value::as_string);
    let command = text(0).unwrap_or_default().to_ascii_uppercase();
    let script = matches!(command.as_str(), "EVALSHA" | "FCALL")
        .then(|| text(1).map(|s| s.to_ascii_lowercase()))
        .flatten();
    Ok(SlowEntry {
        command,
        script,
        micros,
        client,
    })
}

/// Per kind of top-level call ([`SlowEntry::kind`]) in `log`: the calls logged, those above
/// [`BOUND_US`] and the longest (µs), by kind.
pub fn slow_by_kind(log: &[SlowEntry]) -> BTreeMap<String, (usize, usize, u64)> {
    let mut kinds: BTreeMap<String, (usize, usize, u64)> = BTreeMap::new();
    for e in log.iter().filter(|e| !e.is_nested() && !e.is_admin()) {
        let k = kinds.entry(e.kind()).or_default();
        k.0 += 1;
        k.1 += usize::from(e.micros > BOUND_US);
        k.2 = k.2.max(e.micros);
    }
    kinds
}

/// What `LATENCY HISTOGRAM <command>` says of `command`'s calls since the last `CONFIG
/// RESETSTAT` (Redis 7.0 and later; buckets bounded by powers of 2 µs), as a kind of
/// [`slow_by_kind`]: the calls above 128 µs, those above 2 048 µs (the bucket bound nearest
/// [`BOUND_US`]), and the bound of the longest one's bucket (µs). The slow log skips
/// `EXEC` (it logs the commands a transaction ran one by one), so a transaction's whole
/// time is read here. `None` when the server keeps no such histogram.
pub async fn latency_of(client: &Client, command: &str) -> Option<(usize, usize, u64)> {
    let raw = admin(client, "LATENCY", &["HISTOGRAM", command])
        .await
        .ok()?;
    // [name, ["calls", n, "histogram_usec", [bound, calls up to it, ...]]]
    let mut top = raw.into_array().into_iter();
    let _name = top.next()?;
    let fields = top.next()?.into_array();
    let calls = fields.get(1)?.as_u64()?;
    let buckets = fields.get(3)?.clone().into_array();
    let pairs: Vec<(u64, u64)> = buckets
        .chunks(2)
        .filter_map(|p| Some((p.first()?.as_u64()?, p.get(1)?.as_u64()?)))
        .collect();
    let up_to = |bound: u64| {
        pairs
            .iter()
            .filter(|(b, _)| *b <= bound)
            .map(|(_, c)| *c)
            .max()
            .unwrap_or(0)
    };
    let longest = pairs
        .iter()
        .find(|(_, c)| *c >= calls)
        .map_or(0, |(b, _)| *b);
    Some((
        (calls - up_to(128)) as usize,
        (calls - up_to(2_048)) as usize,
        longest,
    ))
}

/// CPU time the process has used (user + system), from `/proc/<pid>/stat` (100 ticks/s).
pub fn cpu(pid: u32) -> Duration {
    let ticks = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // The fields after the command's closing parenthesis; utime and stime are the
            // 12th and 13th of them.
            let rest = s.rsplit_once(')')?.1.to_string();
            let fields: Vec<u64> = rest
                .split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|f| f.parse().ok())
                .collect();
            Some(fields.iter().sum::<u64>())
        })
        .unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// Copies a callgrind dump into the folder `ROLLBOARD_BENCH_CALLGRIND_DIR` names, when it
/// is set (for `callgrind_annotate` afterwards: where the instructions went, by function),
/// as `callgrind.<pid>.<n>`, numbered on from the dumps already there.
fn keep_dump(file: &std::path::Path) -> Result<(), String> {
    let Some(dir) = std::env::var_os("ROLLBOARD_BENCH_CALLGRIND_DIR") else {
        return Ok(());
    };
    let dir = std::path::PathBuf::from(dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let n = std::fs::read_dir(&dir).map_or(0, |d| d.count());
    let to = dir.join(format!("callgrind.{}.{n}", std::process::id()));
    std::fs::copy(file, &to)
        .map(|_| ())
        .map_err(|e| format!("{} to {}: {e}", file.display(), to.display()))
}
