//! `rollboard run` as a child process: started, probed, signalled, frozen, killed, and its
//! logs and metrics read.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use fred::prelude::*;
use rollboard::store::Store;
use tempfile::TempDir;

use crate::support::config::{partitioned_config, server_and_config, write_config};
use crate::support::redis::{free_port, RedisServer};
use crate::support::wait::wait_for;

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
        // `kill` returns once the signal is sent; a thread running on another core stops
        // only at its next entry into the kernel. Frozen means every thread stopped.
        if frozen {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while !all_threads_stopped(pid) {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the daemon never stopped"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// The exit status of a daemon already told to stop.
    pub async fn wait_exit(mut self) -> std::process::ExitStatus {
        tokio::time::timeout(Duration::from_secs(40), self.child.wait())
            .await
            .expect("daemon exits within the grace period")
            .expect("wait")
    }

    /// Waits up to `limit` for metric `name` with `labels` to read `want`; whether it did.
    pub async fn metric_becomes(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        want: f64,
        limit: Duration,
    ) -> bool {
        wait_for(limit, || async { self.metric(name, labels).await == want }).await
    }

    /// Waits up to `limit` for `/readyz` to answer `want`; whether it did.
    pub async fn readyz_becomes(&self, want: u16, limit: Duration) -> bool {
        wait_for(limit, || async { self.get("/readyz").await.0 == want }).await
    }

    /// GET a path, returning status and body.
    pub async fn get(&self, path: &str) -> (u16, String) {
        match reqwest::get(format!("{}{path}", self.base)).await {
            Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
            Err(_) => (0, String::new()),
        }
    }

    /// GETs `path` until its answer satisfies `done`, for at most 5 s; the last answer. A
    /// write by another process than the daemon (the command line, a test's own store)
    /// shows in the daemon's answers within `http.max_staleness`, 1 s by default (see
    /// docs/api.md, "Answers kept, and HTTP caching").
    pub async fn get_once(&self, path: &str, done: impl Fn(u16, &str) -> bool) -> (u16, String) {
        let mut last = self.get(path).await;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !done(last.0, &last.1) && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
            last = self.get(path).await;
        }
        last
    }

    /// GETs `path` and asserts that it answers `want`; the body.
    pub async fn get_answering(&self, path: &str, want: u16) -> String {
        let (got, body) = self.get(path).await;
        assert_eq!(got, want, "{path}: {body}");
        body
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

/// Asserts that a daemon exited with `status` 0, less than `limit` after `started`.
pub fn assert_exited_within(
    status: std::process::ExitStatus,
    started: std::time::Instant,
    limit: Duration,
) {
    assert!(status.success(), "exit {status:?}");
    assert!(
        started.elapsed() < limit,
        "shutdown took {:?}",
        started.elapsed()
    );
}

/// The length of stream `key`.
pub async fn xlen(redis: &RedisServer, key: &str) -> i64 {
    let store = redis.store("rb").await;
    store.client().xlen(key).await.expect("xlen")
}

/// A fresh redis-server and a started daemon whose `[http]` section has `extra` lines.
pub async fn daemon_with(
    extra: &str,
) -> (RedisServer, tempfile::TempDir, Daemon, std::path::PathBuf) {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let config = write_config(dir.path(), &redis, port, "a", extra);
    let daemon = Daemon::start(&config, port).await;
    (redis, dir, daemon, config)
}

/// A daemon started on a free port with a [`partitioned_config`] written in `dir`.
pub async fn partitioned_daemon(
    dir: &std::path::Path,
    redis: &RedisServer,
    consumer: &str,
    partitions: usize,
) -> Daemon {
    let port = free_port();
    Daemon::start(
        &partitioned_config(dir, redis, port, consumer, partitions),
        port,
    )
    .await
}

/// The daemon's HTTP address without the scheme, for raw connections.
pub fn addr(daemon: &Daemon) -> String {
    daemon.base.trim_start_matches("http://").to_string()
}

/// A fresh redis-server, a store on it, and a daemon configuration for `consumer` on a free
/// port (the daemon not started).
pub async fn redis_and_config(consumer: &str) -> (RedisServer, Store, TempDir, PathBuf, u16) {
    let (redis, dir, port, config) =
        server_and_config(|dir, redis, port| write_config(dir, redis, port, consumer, ""));
    let store = redis.store("rb").await;
    (redis, store, dir, config, port)
}

/// The metric families a daemon registers (with help text) at start-up.
pub const METRIC_FAMILIES: &[&str] = &[
    "rollboard_events_applied_total",
    "rollboard_events_skipped_total",
    "rollboard_events_dead_lettered_total",
    "rollboard_batch_events",
    "rollboard_apply_duration_seconds",
    "rollboard_roll_duration_seconds",
    "rollboard_slices_expired_total",
    "rollboard_members_removed_total",
    "rollboard_last_roll_timestamp_seconds",
    "rollboard_consumer_pending",
    "rollboard_consumer_lag",
    "rollboard_redis_errors_total",
    "rollboard_redis_reconnects_total",
    "rollboard_roll_failures_total",
    "rollboard_window_start_timestamp_seconds",
    "rollboard_window_end_timestamp_seconds",
];

/// Whether every thread of process `pid` is stopped (state `T` in
/// `/proc/<pid>/task/<tid>/stat`).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
            // The state follows the command name, which is in parentheses.
            stat.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
        })
    })
}
