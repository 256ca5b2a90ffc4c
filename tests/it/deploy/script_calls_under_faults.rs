//! `redis.scripts = "eval"` under the faults the functions version is tested against: the
//! script cache flushed while a backlog drains, a connection cut right after an
//! `EVALSHA` reached Redis, and a rolling change of the setting (one daemon calling by
//! `FCALL`, one by `EVALSHA`, on one group, with redeliveries between them). Every daemon
//! here is told its way explicitly, whatever `ROLLBOARD__REDIS__SCRIPTS` says.

use std::time::Duration;

use crate::support::asserts::assert_drained_into_model_at;
use crate::support::boards::now_ms;
use crate::support::config::config_for_url;
use crate::support::daemon::Daemon;
use crate::support::events::{tip, xadd_all, Fields};
use crate::support::keys::{dead_letter_stream, intake_stream};
use crate::support::proxy::Proxy;
use crate::support::redis::{eval_script, RedisServer};
use crate::support::wait::wait_for;

/// The environment that makes a daemon call its scripts the way `scripts` says.
fn calling(scripts: &str) -> Vec<(&'static str, String)> {
    vec![("ROLLBOARD__REDIS__SCRIPTS", scripts.to_string())]
}

/// Whether the server holds every script of this build (`SCRIPT EXISTS`).
fn holds_every_script(redis: &RedisServer) -> bool {
    let mut args = vec!["SCRIPT", "EXISTS"];
    let shas: Vec<String> = rollboard::store::lua::eval_scripts()
        .iter()
        .map(|s| s.sha.clone())
        .collect();
    args.extend(shas.iter().map(String::as_str));
    redis.cli(&args).lines().all(|l| l.trim() == "1")
}

/// Waves of events, the script cache flushed before and while each is applied, and again
/// and again while the backlog drains: every board ends exactly in the model state,
/// nothing is dead-lettered, and `/readyz` loads the scripts back when they are missing.
#[tokio::test]
async fn scripts_flushed_mid_ingest_by_evalsha_lose_and_double_nothing() {
    let redis = RedisServer::start();
    // The test's own reads call by EVALSHA too: no process loads the library here.
    let store = redis
        .store("rb")
        .await
        .with_script_calls(rollboard::config::ScriptCalls::Eval);
    let (_dir, port, config) = config_for_url(&redis.url(), "a", "");
    let daemon = Daemon::spawn_with(&config, port, &calling("eval"));
    daemon.wait_up().await;
    assert!(daemon.readyz_becomes(200, Duration::from_secs(20)).await);
    let now = now_ms();
    let events: Vec<Fields> = (0..3000).map(|i| tip(i, now)).collect();
    let flush = || {
        assert_eq!(redis.cli(&["SCRIPT", "FLUSH"]).trim(), "OK");
    };
    for part in events.chunks(600) {
        flush();
        xadd_all(store.client(), intake_stream(), part).await;
        flush();
    }
    // Keep flushing while the daemon drains what is left.
    let port_of_redis = redis.port;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flusher = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = std::process::Command::new("redis-cli")
                    .args(["-p", &port_of_redis.to_string(), "SCRIPT", "FLUSH"])
                    .output();
                std::thread::sleep(Duration::from_millis(7));
            }
        })
    };
    let drained = crate::support::wait::drained(&store).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flusher.join().expect("flusher");
    assert!(drained, "never drained; log:\n{}", daemon.logs());
    // (A read sent while the cache is flushed every few ms may meet a second flush
    // between its reload and its resend: the reads come after the flushing.)
    assert_drained_into_model_at(&store, &events, &daemon, now).await;
    assert_eq!(redis.cli(&["XLEN", dead_letter_stream()]).trim(), "0");
    assert_eq!(
        daemon.metric("rollboard_apply_failures_total", &[]).await,
        0.0,
        "{}",
        daemon.logs()
    );

    // Readiness loads the scripts when they are missing.
    flush();
    assert!(!holds_every_script(&redis));
    assert_eq!(daemon.get("/readyz").await.0, 200, "{}", daemon.logs());
    assert!(holds_every_script(&redis));
    assert_eq!(
        redis.cli(&["FUNCTION", "LIST"]).trim(),
        "",
        "no library was loaded"
    );
    assert!(daemon.terminate().await.success());
}

/// Connections cut right after a fold or apply `EVALSHA` reached Redis (the script ran,
/// its reply lost), over and over while a backlog drains: the redelivered events count
/// once, nothing is dead-lettered.
#[tokio::test]
async fn evalsha_cut_after_it_reached_redis_and_redelivered_counts_once() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let proxy = Proxy::start(redis.port).await;
    let (_dir, port, config) = config_for_url(&proxy.url(), "a", "");
    let now = now_ms();
    let events: Vec<Fields> = (0..6000).map(|i| tip(i, now)).collect();
    // Every apply a `fold` call (the worker would judge the tips itself, see
    // `apply::judged_in_the_worker` for a transaction cut after its `EXEC`).
    let mut env = calling("eval");
    env.push(("ROLLBOARD__REDIS__TRANSACTIONS", "false".to_string()));
    let daemon = Daemon::spawn_with(&config, port, &env);
    daemon.wait_up().await;
    // Each wave of events is met by a cut after the first fold call that carries it.
    let fold = &eval_script("fold.lua").sha;
    for (wave, part) in events.chunks(500).enumerate() {
        proxy.cut_after(fold.as_bytes(), 1);
        xadd_all(store.client(), intake_stream(), part).await;
        let fired = wait_for(Duration::from_secs(10), || async { proxy.cuts() > wave }).await;
        assert!(fired, "wave {wave}: no cut; log:\n{}", daemon.logs());
    }
    assert_drained_into_model_at(&store, &events, &daemon, now).await;
    assert_eq!(redis.cli(&["XLEN", dead_letter_stream()]).trim(), "0");
    assert!(daemon.terminate().await.success());
}

/// A rolling change of `redis.scripts`: daemon `a` calls by `FCALL`, daemon `b` by
/// `EVALSHA`, one group. `a` is killed holding a batch, `b` claims it; the library and
/// the script cache are flushed in between. Every event counts once.
#[tokio::test]
async fn a_functions_daemon_and_an_eval_daemon_on_one_group_count_each_event_once() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let (_da, port_a, config_a) = config_for_url(&redis.url(), "a", "");
    let (_db, port_b, config_b) = config_for_url(&redis.url(), "b", "");
    let a = Daemon::spawn_with(&config_a, port_a, &calling("functions"));
    a.wait_up().await;
    let b = Daemon::spawn_with(&config_b, port_b, &calling("eval"));
    b.wait_up().await;
    let now = now_ms();
    let events: Vec<Fields> = (0..4000).map(|i| tip(i, now)).collect();
    for (wave, part) in events[..2400].chunks(400).enumerate() {
        xadd_all(store.client(), intake_stream(), part).await;
        if wave % 2 == 0 {
            redis.cli(&["SCRIPT", "FLUSH"]);
        } else {
            redis.cli(&["FUNCTION", "FLUSH"]);
        }
    }
    // `a` dies holding whatever it read: `b` claims it after `claim_idle`.
    xadd_all(store.client(), intake_stream(), &events[2400..]).await;
    a.kill().await;
    redis.cli(&["SCRIPT", "FLUSH"]);
    assert_drained_into_model_at(&store, &events, &b, now).await;
    assert_eq!(redis.cli(&["XLEN", dead_letter_stream()]).trim(), "0");
    assert!(b.terminate().await.success());
}

/// By `EVALSHA`, a server at `maxmemory` that lost its scripts still answers a query: the
/// reload (`SCRIPT LOAD`) is not refused there, and the query script is `no-writes`.
#[tokio::test]
async fn a_query_by_evalsha_answers_at_maxmemory_after_the_scripts_were_flushed() {
    use crate::support::boards::{apply_events, ev, variants};
    let redis = RedisServer::start();
    let store = redis
        .store("rb")
        .await
        .with_script_calls(rollboard::config::ScriptCalls::Eval);
    let now = 1_700_000_000_000;
    let board = &variants(60_000, 5)[0];
    apply_events(&store, board, &[ev("a", now - 1_000, "m1", 5)], now).await;
    assert_eq!(redis.cli(&["SCRIPT", "FLUSH"]).trim(), "OK");
    assert_eq!(redis.cli(&["CONFIG", "SET", "maxmemory", "1"]).trim(), "OK");
    assert!(redis.cli(&["SET", "x", "1"]).starts_with("OOM"));
    let top = store
        .top(&board.widest(), None, 0, 10, now)
        .await
        .expect("a read answers at maxmemory");
    assert_eq!(top.entries[0].member, "m1");
    assert_eq!(top.entries[0].total, 5);
}
