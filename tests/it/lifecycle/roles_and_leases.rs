//! Roles: a process runs only the parts it is given (`--roles`, `daemon.roles`) and opens
//! only their Redis connections; each tick of a scheduled job is run by one replica under
//! a lease, taken over when its holder dies; a clean exit removes its consumer.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fred::prelude::*;
use futures_util::StreamExt;

use crate::support::boards::ev;
use crate::support::config::{partitioned_config, write_config, BOARDS};
use crate::support::daemon::Daemon;
use crate::support::http::post;
use crate::support::keys::{partition_stream, schema};
use crate::support::redis::{free_port, RedisServer};
use crate::support::wait::wait_for;

/// The clients connected to `redis`, not counting the `redis-cli` that asks.
fn connections(redis: &RedisServer) -> usize {
    redis
        .cli(&["CLIENT", "LIST"])
        .lines()
        .filter(|l| l.contains("addr=") && !l.contains("cmd=client|list"))
        .count()
}

/// Waits until the connection count of `redis` stays at one value for a second, and
/// returns it: connections are opened in the background at start.
async fn settled_connections(redis: &RedisServer) -> usize {
    let mut last = (connections(redis), Instant::now());
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = connections(redis);
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() >= Duration::from_secs(1) {
            break;
        }
    }
    last.0
}

/// Starts a daemon with `roles` in its config (or `--roles flag` when given), waits for it,
/// measures its Redis connections; returns the daemon and the count.
async fn measured(
    dir: &std::path::Path,
    redis: &RedisServer,
    name: &str,
    roles: &str,
    flag: Option<&str>,
) -> (Daemon, usize) {
    let port = free_port();
    let config = write_config(dir, redis, port, name, "");
    let text = std::fs::read_to_string(&config).expect("config");
    let quoted: Vec<String> = roles.split(',').map(|r| format!("{r:?}")).collect();
    std::fs::write(
        &config,
        format!("[daemon]\nroles = [{}]\n{text}", quoted.join(", ")),
    )
    .expect("config");
    let args: Vec<&str> = match flag {
        Some(flag) => vec!["--roles", flag],
        None => vec![],
    };
    let daemon = Daemon::spawn_args(&config, port, &[], &args, "info");
    daemon.wait_up().await;
    let count = settled_connections(redis).await;
    (daemon, count)
}

/// A sidecar (`intake,query`) holds two Redis connections, serves the intake and the
/// queries, is ready without a consumer group, and answers 404 naming the role for a
/// route it does not run; a worker (`consume,jobs`) serves no API route. The counts per
/// role are printed (`cargo test --test it roles::connections -- --nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_role_and_the_routes_of_each() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    assert_eq!(connections(&redis), 0);

    // The flag wins over the config's roles.
    let (sidecar, count) = measured(
        dir.path(),
        &redis,
        "sidecar",
        "intake,query,consume,jobs",
        Some("intake,query"),
    )
    .await;
    let mut counts = BTreeMap::new();
    counts.insert("intake,query", count);
    assert!(count <= 2, "a sidecar holds {count} connections");
    let (status, body) = sidecar.get("/readyz").await;
    assert_eq!(status, 200, "ready without a group: {body}");
    let client = reqwest::Client::new();
    let now = rollboard::domain::clock::local_ms();
    let posted = client
        .post(format!("{}/v1/events", sidecar.base))
        .header("content-type", "application/json")
        .body(format!(r#"{{"room": "r1", "amount": "3", "ts": "{now}"}}"#))
        .send()
        .await
        .expect("post");
    let status = posted.status().as_u16();
    assert_eq!(status, 202, "{}", posted.text().await.unwrap_or_default());
    let (status, body) = sidecar.get("/v1/boards").await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = sidecar.get("/v1/boards/rooms_7d/top").await;
    assert_eq!(status, 200);
    assert_eq!(sidecar.get("/metrics").await.0, 200);
    // No consumer, no scheduled job ran here.
    assert_eq!(
        redis.cli(&["EXISTS", &schema().lease_tick("roll")]).trim(),
        "0",
        "the sidecar ran a job"
    );
    assert_eq!(sidecar.terminate().await.code(), Some(0));
    assert!(
        wait_for(Duration::from_secs(10), || async {
            connections(&redis) == 0
        })
        .await
    );

    for roles in ["intake", "query", "consume", "jobs", "consume,jobs"] {
        let name = roles.replace(',', "-");
        let (daemon, count) = measured(dir.path(), &redis, &name, roles, None).await;
        counts.insert(roles, count);
        if roles == "consume,jobs" {
            let (status, body) = daemon.get("/v1/boards").await;
            assert_eq!(status, 404, "{body}");
            assert!(body.contains("query role"), "{body}");
            let (status, body) = daemon.get("/v1/boards/rooms_7d/top").await;
            assert_eq!(status, 404, "{body}");
            let (status, _, body) = post(&daemon, "{}").await;
            assert_eq!(status, 404);
            assert!(body.contains("intake role"), "{body}");
            assert_eq!(daemon.get("/readyz").await.0, 200);
            assert_eq!(daemon.get("/healthz").await.0, 200);
        }
        assert_eq!(daemon.terminate().await.code(), Some(0));
        assert!(
            wait_for(Duration::from_secs(10), || async {
                connections(&redis) == 0
            })
            .await
        );
    }
    let (daemon, count) =
        measured(dir.path(), &redis, "all", "intake,query,consume,jobs", None).await;
    counts.insert("intake,query,consume,jobs (default)", count);
    assert_eq!(daemon.terminate().await.code(), Some(0));

    println!("redis connections per role set (CLIENT LIST): {counts:?}");
    assert!(counts["intake"] <= 2 && counts["query"] <= 2, "{counts:?}");
    // A worker's API serves only probes and metrics, on the worker's own pool.
    assert!(
        counts["consume,jobs"] < counts["intake,query,consume,jobs (default)"],
        "{counts:?}"
    );
}

/// A config for a daemon running only the jobs, every second, with a lease of `lease`.
fn jobs_config(
    dir: &std::path::Path,
    redis: &RedisServer,
    port: u16,
    name: &str,
    lease: &str,
    boards: &str,
) -> std::path::PathBuf {
    let path = dir.join(format!("rollboard-{name}.toml"));
    let text = format!(
        "[daemon]\nroles = [\"jobs\"]\n[redis]\nurl = \"{}\"\n[ingest]\nconsumer = \"{name}\"\n\
         [schedule]\nroll = \"* * * * * *\"\nresummarize = \"* * * * * *\"\nlease = \"{lease}\"\n\
         [http]\nlisten = \"127.0.0.1:{port}\"\n{boards}",
        redis.url()
    );
    std::fs::write(&path, text).expect("write config");
    path
}

/// `text` without its ANSI colour sequences (`ESC [ ... m`).
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The ticks of `job` a daemon's log says it ran, in order.
fn ticks_run(daemon: &Daemon, job: &str) -> Vec<i64> {
    let job = format!("job=\"{job}\"");
    plain(&daemon.logs())
        .lines()
        .filter(|l| l.contains("running the tick under the lease") && l.contains(&job))
        .filter_map(|l| {
            let rest = &l[l.find("tick=")? + 5..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

const LEASE_LOG: &str = "info,rollboard::edges::daemon=debug";

/// A jobs-only daemon `name` on a free port, spawned with [`jobs_config`] and lease logging.
fn jobs_daemon(
    dir: &std::path::Path,
    redis: &RedisServer,
    name: &str,
    lease: &str,
    boards: &str,
) -> Daemon {
    let port = free_port();
    let config = jobs_config(dir, redis, port, name, lease, boards);
    Daemon::spawn_args(&config, port, &[], &[], LEASE_LOG)
}

/// Two replicas whose roll and resummarize fire every second: each tick is run by exactly
/// one of them, and the runs summed over both follow the seconds elapsed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tick_is_run_by_one_replica() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let a = jobs_daemon(dir.path(), &redis, "a", "5s", BOARDS);
    let b = jobs_daemon(dir.path(), &redis, "b", "5s", BOARDS);
    a.wait_up().await;
    b.wait_up().await;
    let runs = |job: &'static str| {
        let (a, b) = (&a, &b);
        async move {
            a.metric("rollboard_job_runs_total", &[("job", job)]).await
                + b.metric("rollboard_job_runs_total", &[("job", job)]).await
        }
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (roll0, res0, t0) = (
        runs("roll").await,
        runs("resummarize").await,
        Instant::now(),
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (roll1, res1) = (runs("roll").await, runs("resummarize").await);
    let elapsed = t0.elapsed().as_secs_f64();
    for (job, n) in [("roll", roll1 - roll0), ("resummarize", res1 - res0)] {
        assert!(
            (n - elapsed).abs() <= 1.5,
            "{job}: {n} runs in {elapsed:.1} s over both replicas"
        );
    }
    for job in ["roll", "resummarize"] {
        let (ta, tb) = (ticks_run(&a, job), ticks_run(&b, job));
        let mut all: Vec<i64> = ta.iter().chain(&tb).copied().collect();
        all.sort();
        let distinct = {
            let mut d = all.clone();
            d.dedup();
            d
        };
        assert_eq!(
            all, distinct,
            "{job}: a tick ran twice (a: {ta:?}, b: {tb:?})"
        );
        assert!(
            all.len() >= 6,
            "{job}: too few ticks run (a: {ta:?}, b: {tb:?}); log:\n{}",
            plain(&a.logs())
        );
        // Consecutive seconds, except where a run outlasted the next fire (none here:
        // the boards are empty).
        let gaps = all.windows(2).filter(|w| w[1] - w[0] != 1_000).count();
        assert!(gaps <= 1, "{job}: ticks skipped: {all:?}");
    }
    assert_eq!(a.terminate().await.code(), Some(0));
    assert_eq!(b.terminate().await.code(), Some(0));
}

/// A scoped incremental board: the roll visits every scope.
const CROWD: &str = "\n[[boards]]\nname = \"crowd\"\nmember = \"user\"\nscope = \"room\"\nwindow = \"1h\"\nslice = \"1m\"\n";

/// The holder of a roll's lease is killed mid-run: the lease is not released, expires
/// within its time to live, and the other replica runs the ticks from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_is_taken_over_within_the_lease() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let board = rollboard::config::Settings::from_toml(CROWD)
        .expect("board")
        .boards
        .remove(0);
    let store = redis.store("rb").await;
    let now = store.time_ms().await.expect("time");
    // Enough scopes that one roll takes a good part of a second or more.
    let scopes = 6_000;
    futures_util::stream::iter(0..scopes)
        .map(|i| {
            let (store, board) = (&store, &board);
            async move {
                let room = format!("room{i}");
                store
                    .apply(
                        board,
                        Some(&room),
                        &[ev(&format!("e{i}"), now, "u", 1)],
                        now,
                    )
                    .await
                    .expect("apply");
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;

    let ttl = Duration::from_secs(3);
    let a = jobs_daemon(dir.path(), &redis, "a", "3s", CROWD);
    a.wait_up().await;
    let b = jobs_daemon(dir.path(), &redis, "b", "3s", CROWD);
    b.wait_up().await;
    let holder_of = |pid: u32| format!(":{pid}:");
    let lease = || async {
        let v: Option<String> = store
            .client()
            .get(schema().lease("roll"))
            .await
            .expect("get");
        v
    };
    // Wait until A holds the roll's lease, then kill it.
    let a_pid = a.pid();
    let held = wait_for(Duration::from_secs(30), || async {
        lease().await.is_some_and(|v| v.contains(&holder_of(a_pid)))
    })
    .await;
    assert!(held, "A never held the lease; log:\n{}", a.logs());
    a.kill().await;
    let killed = Instant::now();
    let left = lease().await;
    let b_runs = b
        .metric("rollboard_job_runs_total", &[("job", "roll")])
        .await;
    // Not released: the dead holder's lease stays until its time to live runs out
    // (unless A's run had just ended as it was killed).
    if let Some(v) = &left {
        if v.contains(&holder_of(a_pid)) {
            let pttl: i64 = store
                .client()
                .pttl(schema().lease("roll"))
                .await
                .expect("pttl");
            assert!(pttl > 0 && pttl <= ttl.as_millis() as i64, "pttl {pttl}");
        }
    }
    // B takes the next tick once the lease has expired.
    let b_pid = b.pid();
    let taken = wait_for(ttl + Duration::from_secs(3), || async {
        b.metric("rollboard_job_runs_total", &[("job", "roll")])
            .await
            > b_runs
    })
    .await;
    assert!(
        taken,
        "B did not take over within the lease; lease: {:?}; log:\n{}",
        lease().await,
        b.logs()
    );
    let took = killed.elapsed();
    assert!(took <= ttl + Duration::from_secs(3), "{took:?}");
    // And keeps running the ticks: its next run ends (a roll of every scope, which takes
    // seconds on a slow or busy host).
    let later = b
        .metric("rollboard_job_runs_total", &[("job", "roll")])
        .await;
    let more = wait_for(Duration::from_secs(60), || async {
        b.metric("rollboard_job_runs_total", &[("job", "roll")])
            .await
            > later
    })
    .await;
    assert!(more, "B stopped after taking over; log:\n{}", b.logs());
    let v = lease().await.unwrap_or_default();
    assert!(
        v.is_empty() || v.contains(&holder_of(b_pid)),
        "the lease is held by neither: {v}"
    );
    println!(
        "roll of {scopes} scopes; lease at the kill: {left:?}; B took over {took:?} after the kill"
    );
    assert_eq!(b.terminate().await.code(), Some(0));
}

/// A daemon reading two partitions removes its consumer from the group of each at a
/// clean exit (SIGTERM).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_exit_removes_its_consumer_from_every_partition() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let config = partitioned_config(dir.path(), &redis, port, "leaver", 2);
    let daemon = Daemon::start(&config, port).await;
    let streams = [partition_stream(0), partition_stream(1)];
    let consumers = |stream: &str| redis.cli(&["XINFO", "CONSUMERS", stream, "rollboard"]);
    for stream in &streams {
        let listed = wait_for(Duration::from_secs(10), || async {
            consumers(stream).contains("leaver")
        })
        .await;
        assert!(listed, "{stream}: {}", consumers(stream));
    }
    assert_eq!(daemon.terminate().await.code(), Some(0));
    for stream in streams {
        let left = consumers(&stream);
        assert!(!left.contains("leaver"), "{stream}: {left}");
    }
}

/// A consumer holding a pending entry is left in the group (another claims the entry);
/// once it holds none it is removed.
#[tokio::test]
async fn a_consumer_with_pending_entries_is_kept() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let client = store.client();
    let _: String = client
        .xgroup_create("s", "g", "0", true)
        .await
        .expect("group");
    let id: String = client
        .xadd("s", false, None, "*", vec![("f", "v")])
        .await
        .expect("xadd");
    let _: Value = client
        .xreadgroup("g", "holder", None, None, false, "s", ">")
        .await
        .expect("read");
    assert!(!store
        .forget_consumer("s", "g", "holder")
        .await
        .expect("forget"));
    assert!(redis
        .cli(&["XINFO", "CONSUMERS", "s", "g"])
        .contains("holder"));
    let _: i64 = client.xack("s", "g", id).await.expect("ack");
    assert!(store
        .forget_consumer("s", "g", "holder")
        .await
        .expect("forget"));
    assert_eq!(redis.cli(&["XINFO", "CONSUMERS", "s", "g"]).trim(), "");
    // A stream without the group: nothing to remove.
    assert!(!store.forget_consumer("t", "g", "c").await.expect("forget"));
}

/// The lease at the store: one holder per tick; a tick is started once even after its
/// run released the lease; a holder renews and releases only its own lease; a lease left
/// under a holder's own token (a lost reply) is taken back by that holder alone.
#[tokio::test]
async fn the_lease_runs_each_tick_once() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let ttl = Duration::from_secs(5);
    let t = 1_700_000_000_000;
    let lease = async |job: &'static str, token: &str, tick: i64| {
        let taken = store.acquire_lease(job, token, tick, ttl).await;
        taken.expect("acquire")
    };
    let a = lease("roll", "a", t).await.expect("a takes the tick");
    assert_eq!(a.value, format!("a@{t}"));
    assert_eq!(
        redis.cli(&["GET", &schema().lease("roll")]).trim(),
        format!("a@{t}")
    );
    assert!(lease("roll", "b", t).await.is_none());
    // A run longer than a tick keeps the lease: the next tick is nobody else's.
    assert!(lease("roll", "b", t + 1_000).await.is_none());
    assert!(store.renew_lease(&a, ttl).await.expect("renew"));
    assert!(store.release_lease(&a).await.expect("release"));
    assert!(!store.release_lease(&a).await.expect("release"));
    // Released, the same tick is not started again by a replica whose cron fired later.
    assert!(lease("roll", "b", t).await.is_none());
    let b = lease("roll", "b", t + 1_000)
        .await
        .expect("b takes the next tick");
    assert!(!store.renew_lease(&a, ttl).await.expect("renew"));
    assert!(!store.release_lease(&a).await.expect("release"));
    // B's reply was lost (say): B takes its own lease back at its next tick; A may not.
    assert!(lease("roll", "a", t + 2_000).await.is_none());
    let again = lease("roll", "b", t + 2_000)
        .await
        .expect("b takes back its own lease");
    assert!(!store.renew_lease(&b, ttl).await.expect("renew"));
    assert!(store.release_lease(&again).await.expect("release"));
    // Jobs are leased apart.
    assert!(lease("resummarize", "a", t).await.is_some());
    let pttl: i64 = redis
        .cli(&["PTTL", &schema().lease("resummarize")])
        .trim()
        .parse()
        .expect("pttl");
    assert!(pttl > 0 && pttl <= 5_000, "{pttl}");
}
