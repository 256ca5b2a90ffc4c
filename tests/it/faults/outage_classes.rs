//! Redis errors that say nothing about the data are outages. Each class is met on a real
//! server while the consumer holds a batch: its events are neither dead-lettered nor acked
//! while the condition lasts, and are applied exactly once after it clears; meanwhile
//! `POST /v1/events` answers 503 with `Retry-After`, and 202 to the same request after.
//! On a cluster, one master that cannot persist holds back only the events that touch it.
//! And `WRONGTYPE` met inside a script, as Redis 7 words it, is still bad data.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fred::prelude::*;
use rollboard::ingest::stream::group_info;
use rollboard::store::Store;

use crate::support::asserts::{assert_metrics, assert_state};
use crate::support::boards::{set_string, test_boards};
use crate::support::cluster::{cli, RedisCluster};
use crate::support::config::config_for_url;
use crate::support::daemon::Daemon;
use crate::support::events::{models, payment, tip, xadd_all, Fields};
use crate::support::http::answer_parts;
use crate::support::keys::{dead_letter_stream, intake_stream};
use crate::support::redis::RedisServer;
use crate::support::wait::{drained, wait_for};

/// A board instance: board index and scope.
type Instance = (usize, Option<String>);

/// Events sent while the consumer is frozen, to be in its pending list when it meets the
/// outage.
const HELD: usize = 60;

/// The daemon under test and a connection the outage leaves usable (except BUSY's, which
/// stops every connection).
struct Rig {
    daemon: Daemon,
    admin: Store,
    _dir: tempfile::TempDir,
}

/// A daemon on `url` (`[redis]` settings `redis` added), and `admin` on `admin_url`.
async fn rig(url: &str, admin_url: &str, redis: &str) -> Rig {
    let (dir, port, config) = config_for_url(url, "a", "");
    let text = std::fs::read_to_string(&config)
        .expect("read config")
        .replacen("[redis]\n", &format!("[redis]\n{redis}\n"), 1);
    std::fs::write(&config, text).expect("write config");
    let daemon = Daemon::start(&config, port).await;
    let admin = Store::connect(admin_url, "rb", 2, rollboard::store::Reconnect::Never)
        .await
        .expect("connect");
    Rig {
        daemon,
        admin,
        _dir: dir,
    }
}

/// A fresh server and a [`rig`] on it with the default settings.
async fn server_and_rig() -> (RedisServer, Rig) {
    let redis = RedisServer::start();
    let rig = rig(&redis.url(), &redis.url(), "").await;
    (redis, rig)
}

/// Polls `check` (blocking) until it holds; panics naming `what` after 30 s.
fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Events with their own ids, `n` of them from `from`: two tips for each payment.
fn events(from: usize, n: usize, now: i64) -> Vec<Fields> {
    (from..from + n)
        .map(|i| {
            if i % 3 == 0 {
                payment(i, now)
            } else {
                tip(i, now)
            }
        })
        .collect()
}

/// POSTs `events` to the intake: status and `Retry-After`.
async fn post(daemon: &Daemon, events: &[Fields]) -> (u16, Option<String>, String) {
    let body: Vec<HashMap<String, String>> =
        events.iter().map(|f| f.iter().cloned().collect()).collect();
    match reqwest::Client::new()
        .post(format!("{}/v1/events", daemon.base))
        .json(&body)
        .send()
        .await
    {
        Ok(r) => answer_parts(r).await,
        Err(e) => (0, None, e.to_string()),
    }
}

/// Appends `events` in one transaction, so that a blocked read takes all of them at once.
async fn xadd_at_once(client: &Client, events: &[Fields]) {
    let tx = client.multi();
    for f in events {
        let _: () = tx
            .xadd(intake_stream(), false, None, "*", f.clone())
            .await
            .expect("queue xadd");
    }
    let _: Value = tx.exec(true).await.expect("exec");
}

async fn pending(store: &Store) -> Option<i64> {
    match group_info(store.client(), intake_stream(), "rollboard").await {
        Ok(Some((pending, _))) => Some(pending),
        _ => None,
    }
}

async fn dead_letters(store: &Store) -> i64 {
    store
        .client()
        .xlen(dead_letter_stream())
        .await
        .expect("xlen of the dead letters")
}

/// Freezes the daemon with a read in flight and appends [`HELD`] events, which that read
/// delivers into its pending list; tries again with new events (applied at once) when no
/// read was in flight. Every event appended is added to `sent`.
async fn freeze_holding_a_batch(rig: &Rig, sent: &mut Vec<Fields>, now: i64) {
    for round in 0..10 {
        rig.daemon.freeze(true);
        let batch = events(1_000 + round * HELD, HELD, now);
        xadd_at_once(rig.admin.client(), &batch).await;
        sent.extend(batch);
        let delivered = wait_for(Duration::from_secs(2), || async {
            pending(&rig.admin).await == Some(HELD as i64)
        })
        .await;
        if delivered {
            return;
        }
        rig.daemon.freeze(false);
        assert!(drained(&rig.admin).await, "log:\n{}", rig.daemon.logs());
    }
    panic!("the consumer never had a read in flight when frozen");
}

/// One outage class on the server the daemon uses.
struct Class {
    /// The error code the consumer meets.
    code: &'static str,
    /// Its `kind` label in `rollboard_redis_errors_total`.
    kind: &'static str,
    /// Whether the server answers `admin` while the condition lasts.
    observable: bool,
}

impl Class {
    /// The class of `code`, counted as `kind`, `observable` or not while it lasts.
    fn new(code: &'static str, kind: &'static str, observable: bool) -> Class {
        Class {
            code,
            kind,
            observable,
        }
    }
}

/// Makes the server on `port` fail to persist (its `dir`, `dir`, removed under a save
/// point), so that it refuses writes with `MISCONF`; returns once `BGSAVE` has failed.
fn stop_persisting(port: u16, dir: &std::path::Path) {
    // Without a save point Redis never refuses writes for a failed snapshot.
    cli(port, &["CONFIG", "SET", "save", "3600 1"]);
    std::fs::remove_dir_all(dir).expect("remove the server's dir");
    cli(port, &["BGSAVE"]);
    until("BGSAVE never failed", || {
        cli(port, &["INFO", "persistence"]).contains("rdb_last_bgsave_status:err")
    });
}

/// Lets the server on `port` take writes again although it cannot persist.
fn allow_writes(port: u16) -> String {
    cli(
        port,
        &["CONFIG", "SET", "stop-writes-on-bgsave-error", "no"],
    )
}

/// Waits until `replica` is in sync with its master.
fn until_synced(replica: &RedisServer, what: &str) {
    until(what, || {
        replica
            .cli(&["INFO", "replication"])
            .contains("master_link_status:up")
    });
}

/// The whole check of one class: a batch pending for the frozen consumer, the condition
/// started (`start` returns once Redis answers with it), the consumer thawed; the consumer
/// retries without dead-lettering or acking, the intake answers 503 with `Retry-After`;
/// then `clear` (whatever it returns is dropped), the same POST answers 202, and every event
/// is applied exactly once.
async fn held_until_cleared<T>(
    rig: &Rig,
    class: Class,
    start: impl FnOnce(),
    clear: impl FnOnce() -> T,
) {
    let now = rollboard::domain::clock::local_ms();
    let boards = test_boards();
    let daemon = &rig.daemon;
    let mut sent = events(0, 30, now);
    xadd_all(rig.admin.client(), intake_stream(), &sent).await;
    assert!(drained(&rig.admin).await, "log:\n{}", daemon.logs());
    // Read before the freeze: a frozen daemon answers nothing.
    let errors_before = daemon.metric("rollboard_redis_errors_total", &[]).await;
    freeze_holding_a_batch(rig, &mut sent, now).await;
    start();
    daemon.freeze(false);

    let posted = events(5_000, 30, now);
    let (status, retry, body) = post(daemon, &posted).await;
    assert_eq!(status, 503, "{}: {body}", class.code);
    assert_eq!(retry.as_deref(), Some("1"), "{}: {body}", class.code);
    assert!(body.contains(class.code), "{body}");

    // Long enough for the consumer to have met the outage several times (and for the
    // retries of a failing board, 1.5 s, to have run out).
    let retried = wait_for(Duration::from_secs(30), || async {
        let (_, ready) = daemon.get("/readyz").await;
        ready.contains(class.code)
            && daemon.metric("rollboard_redis_errors_total", &[]).await >= errors_before + 6.0
    })
    .await;
    assert!(retried, "{}: log:\n{}", class.code, daemon.logs());
    assert!(
        daemon
            .metric("rollboard_redis_errors_total", &[("kind", class.kind)])
            .await
            > 0.0,
        "{} counted as {}",
        class.code,
        class.kind
    );
    let (_, ready) = daemon.get("/readyz").await;
    assert!(ready.contains(r#""failing_boards":[]"#), "{ready}");
    assert_eq!(
        daemon.metric("rollboard_apply_failures_total", &[]).await,
        0.0,
        "an outage is no board's failure"
    );
    assert_metrics(daemon, &["rollboard_events_dead_lettered_total 0"]).await;
    if class.observable {
        assert_eq!(dead_letters(&rig.admin).await, 0);
        assert_eq!(
            pending(&rig.admin).await,
            Some(HELD as i64),
            "nothing acked; log:\n{}",
            daemon.logs()
        );
    }

    clear();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, retry, body) = post(daemon, &posted).await;
        if status == 202 {
            break;
        }
        assert!(
            status == 503 && retry.is_some(),
            "{}: {status} {body}",
            class.code
        );
        assert!(Instant::now() < deadline, "{}: still {body}", class.code);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sent.extend(posted);
    assert!(drained(&rig.admin).await, "log:\n{}", daemon.logs());
    assert_state(&rig.admin, &boards, &models(&sent, &boards, now), now).await;
    assert_eq!(dead_letters(&rig.admin).await, 0);
    assert_metrics(daemon, &["rollboard_events_dead_lettered_total 0"]).await;
}

/// `MISCONF`: the server's `dir` is gone, so `BGSAVE` fails and writes are refused
/// (`stop-writes-on-bgsave-error yes`); allowing writes again clears it.
#[tokio::test]
async fn misconf_holds_the_events_until_writes_are_allowed_again() {
    let (redis, rig) = server_and_rig().await;
    let start = || {
        stop_persisting(redis.port, redis.dir());
        assert!(redis.cli(&["SET", "probe", "1"]).starts_with("MISCONF"));
    };
    let clear = || allow_writes(redis.port);
    let class = Class::new("MISCONF", "unavailable", true);
    held_until_cleared(&rig, class, start, clear).await;
}

/// `READONLY`: the daemon's server becomes a replica (of the replica it had, promoted);
/// promoting it back clears it.
#[tokio::test]
async fn readonly_holds_the_events_until_the_replica_is_promoted() {
    let primary = RedisServer::start();
    let other = RedisServer::start();
    other.cli(&["REPLICAOF", "127.0.0.1", &primary.port.to_string()]);
    until_synced(&other, "the replica never synced");
    // Once promoted back the server has no replica: confirmations wait for none.
    let rig = rig(&primary.url(), &primary.url(), "min_replicas_acked = 0").await;
    let start = || {
        assert_eq!(primary.cli(&["WAIT", "1", "5000"]).trim(), "1");
        other.cli(&["REPLICAOF", "NO", "ONE"]);
        primary.cli(&["REPLICAOF", "127.0.0.1", &other.port.to_string()]);
        until_synced(&primary, "never a replica");
        assert!(primary.cli(&["SET", "probe", "1"]).starts_with("READONLY"));
    };
    let clear = || primary.cli(&["REPLICAOF", "NO", "ONE"]);
    let class = Class::new("READONLY", "unavailable", true);
    held_until_cleared(&rig, class, start, clear).await;
}

/// `OOM`: `maxmemory 1` with `noeviction`; lifting the limit clears it.
#[tokio::test]
async fn oom_holds_the_events_until_memory_is_raised() {
    let (redis, rig) = server_and_rig().await;
    let start = || {
        redis.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
        redis.cli(&["CONFIG", "SET", "maxmemory", "1"]);
        assert!(redis.cli(&["SET", "probe", "1"]).starts_with("OOM"));
    };
    let clear = || redis.cli(&["CONFIG", "SET", "maxmemory", "0"]);
    let class = Class::new("OOM", "unavailable", true);
    held_until_cleared(&rig, class, start, clear).await;
}

/// `BUSY`: another client's script runs past `busy-reply-threshold`; `SCRIPT KILL` ends it.
#[tokio::test]
async fn busy_holds_the_events_until_the_script_is_killed() {
    let (redis, rig) = server_and_rig().await;
    let looping = std::cell::RefCell::new(None);
    let start = || {
        redis.cli(&["CONFIG", "SET", "busy-reply-threshold", "10"]);
        *looping.borrow_mut() = Some(
            Command::new("redis-cli")
                .args(["-p", &redis.port.to_string()])
                .args(["EVAL", "while true do end", "0"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-cli"),
        );
        until("never busy", || redis.cli(&["PING"]).starts_with("BUSY"));
    };
    let clear = || {
        until("SCRIPT KILL refused", || {
            redis.cli(&["SCRIPT", "KILL"]).starts_with("OK")
        });
        if let Some(mut child) = looping.borrow_mut().take() {
            let _ = child.wait();
        }
        until("still busy", || redis.cli(&["PING"]).trim() == "PONG");
    };
    let class = Class::new("BUSY", "unavailable", false);
    held_until_cleared(&rig, class, start, clear).await;
}

/// An error class rollboard does not know: `NOPERM`, the daemon's user having lost the
/// commands it runs (an ACL changed under it); giving them back clears it.
#[tokio::test]
async fn an_unrecognised_error_holds_the_events_until_it_clears() {
    let redis = RedisServer::start();
    redis.cli(&[
        "ACL",
        "SETUSER",
        "rollboard",
        "on",
        ">s3cret",
        "~*",
        "&*",
        "+@all",
    ]);
    let url = format!("redis://rollboard:s3cret@127.0.0.1:{}", redis.port);
    let rig = rig(&url, &redis.url(), "").await;
    let start = || {
        redis.cli(&[
            "ACL",
            "SETUSER",
            "rollboard",
            "-fcall",
            "-eval",
            "-xadd",
            "-watch",
        ]);
        let out = Command::new("redis-cli")
            .args(["-p", &redis.port.to_string(), "--user", "rollboard"])
            .args(["--pass", "s3cret", "--no-auth-warning"])
            .args(["XADD", "probe", "*", "a", "1"])
            .output()
            .expect("redis-cli");
        assert!(String::from_utf8_lossy(&out.stdout).starts_with("NOPERM"));
    };
    let clear = || redis.cli(&["ACL", "SETUSER", "rollboard", "+@all"]);
    let class = Class::new("NOPERM", "other", true);
    held_until_cleared(&rig, class, start, clear).await;
}

/// `WRONGTYPE` raised by a script's `redis.call` keeps its code first on Redis 7 (the
/// script named after it): the apply fails as bad data, not as an outage.
#[tokio::test]
async fn wrongtype_met_inside_a_script_is_bad_data() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let board = test_boards().remove(0);
    let meta = store.instance(&board.widest(), None).meta();
    set_string(&store, &meta, "x").await;
    let now = rollboard::domain::clock::local_ms();
    let error = store
        .apply(
            &board,
            None,
            &[crate::support::boards::ev("e1", now - 10, "m", 5)],
            now,
        )
        .await
        .expect_err("a meta key of the wrong type");
    let text = error.to_string();
    let rollboard::store::StoreError::Redis(redis_error) = &error else {
        panic!("a Redis error: {text}")
    };
    assert!(
        redis_error.details().starts_with("WRONGTYPE ") && text.contains(" script: "),
        "{text}"
    );
    assert!(!error.is_outage(), "{text}");
    assert_eq!(error.kind(), "data");
}

/// A 3 + 3 cluster where one master (holding some boards but neither stream) cannot
/// persist: the events that touch its boards stay pending, never dead-lettered; the other
/// masters' boards keep taking new events meanwhile, and the intake (its stream elsewhere)
/// keeps answering 202. Once the master writes again every event is applied exactly once.
#[tokio::test]
async fn misconf_on_one_cluster_master_holds_only_its_boards() {
    let cluster = RedisCluster::start();
    let rig = rig(&cluster.url(), &cluster.url(), "").await;
    let daemon = &rig.daemon;
    let boards = test_boards();
    let now = rollboard::domain::clock::local_ms();
    let streams = [
        cluster.owner_of(intake_stream()),
        cluster.owner_of(dead_letter_stream()),
    ];
    // Every instance the test events touch, with the masters its apply writes to: its own
    // and, for a scoped board, its board's scope registry's.
    let mut instances: Vec<(Instance, Vec<u16>)> = Vec::new();
    for (b, board) in boards.iter().enumerate() {
        let scopes: Vec<Option<String>> = if board.is_scoped() {
            (0..7).map(|r| Some(format!("r{r}"))).collect()
        } else {
            vec![None]
        };
        for scope in scopes {
            let meta = rig.admin.instance(&board.widest(), scope.as_deref()).meta();
            let mut masters = vec![cluster.owner_of(&meta)];
            if scope.is_some() {
                masters.push(cluster.owner_of(&rig.admin.keys().scopes(&board.name)));
            }
            instances.push(((b, scope), masters));
        }
    }
    let broken = cluster
        .masters()
        .into_iter()
        .filter(|m| !streams.contains(m))
        .max_by_key(|m| instances.iter().filter(|(_, o)| o.contains(m)).count())
        .expect("a master without either stream");
    let on_broken: Vec<Instance> = instances
        .iter()
        .filter(|(_, o)| o.contains(&broken))
        .map(|(i, _)| i.clone())
        .collect();
    assert!(!on_broken.is_empty(), "{instances:?}");
    assert!(
        on_broken.len() < instances.len(),
        "some boards elsewhere: {instances:?}"
    );

    let mut sent = events(0, 30, now);
    xadd_all(rig.admin.client(), intake_stream(), &sent).await;
    assert!(drained(&rig.admin).await, "log:\n{}", daemon.logs());

    stop_persisting(broken, &cluster.dir_of(broken));
    let probe = (0..)
        .map(|n| format!("probe{n}"))
        .find(|k| cluster.owner_of(k) == broken)
        .expect("a key on the broken master");
    let refused = cli(broken, &["SET", &probe, "1"]);
    assert!(refused.starts_with("MISCONF"), "{refused}");

    // Several batches' worth, in turns: new entries keep being read while the first held
    // ones wait.
    for round in 0..3 {
        let batch = events(1_000 + round * 300, 300, now);
        xadd_all(rig.admin.client(), intake_stream(), &batch).await;
        sent.extend(batch);
    }
    let posted = events(5_000, 40, now);
    let (status, retry, body) = post(daemon, &posted).await;
    assert_eq!(status, 202, "the stream is on a healthy master: {body}");
    assert_eq!(retry, None);
    sent.extend(posted);

    let touches_broken = |f: &Fields| {
        let fields: HashMap<&str, &str> = f.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        on_broken.iter().any(|(b, scope)| {
            let board = &boards[*b];
            let matches = board.name != "tips_24h" && fields.contains_key("amount")
                || board.name == "tips_24h" && fields.contains_key("value");
            matches
                && scope
                    .as_deref()
                    .is_none_or(|s| fields.get("room") == Some(&s))
        })
    };
    let held = sent[30..].iter().filter(|f| touches_broken(f)).count() as i64;
    assert!(held > 0);
    let mut elsewhere = models(&sent, &boards, now);
    elsewhere.retain(|i, _| !on_broken.contains(i));
    // The other masters' boards hold every event, while exactly the entries that touch
    // the broken master stay pending.
    let kept_going = wait_for(Duration::from_secs(60), || async {
        pending(&rig.admin).await == Some(held)
            && matches!(
                group_info(rig.admin.client(), intake_stream(), "rollboard").await,
                Ok(Some((_, Some(0))))
            )
    })
    .await;
    assert!(
        kept_going,
        "pending {:?}, {held} expected; log:\n{}",
        pending(&rig.admin).await,
        daemon.logs()
    );
    assert_state(&rig.admin, &boards, &elsewhere, now).await;
    assert_eq!(dead_letters(&rig.admin).await, 0);
    assert_metrics(daemon, &["rollboard_apply_failures_total 0"]).await;
    assert!(
        daemon
            .metric("rollboard_redis_errors_total", &[("kind", "unavailable")])
            .await
            > 0.0
    );

    allow_writes(broken);
    assert!(drained(&rig.admin).await, "log:\n{}", daemon.logs());
    assert_state(&rig.admin, &boards, &models(&sent, &boards, now), now).await;
    assert_eq!(dead_letters(&rig.admin).await, 0);
}
