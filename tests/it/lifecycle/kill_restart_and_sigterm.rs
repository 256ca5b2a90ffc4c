//! The daemon as a platform team runs it: killed and restarted, two daemons sharing a group,
//! SIGTERM under load and at random points, each time losing nothing and counting nothing
//! twice.

use std::time::Duration;

use fred::prelude::*;
use rollboard::ingest::stream::group_info;

use crate::support::asserts::assert_drained_into_model;
use crate::support::boards::now_ms;
use crate::support::config::{edit_config, write_config};
use crate::support::daemon::{redis_and_config, Daemon};
use crate::support::env::{env_count, env_seed};
use crate::support::events::{read_unacked, tip_or_payment, tips_now, xadd_all, Fields};
use crate::support::keys::{instance, intake_stream};
use crate::support::proptests::SplitMix;
use crate::support::redis::free_port;
use crate::support::wait::{drained, wait_for};

/// Waits up to 30 s for rooms_7d's ranking to hold anyone; whether it did.
async fn rooms_ranked_soon(store: &rollboard::store::Store) -> bool {
    wait_for(Duration::from_secs(30), || async {
        store
            .client()
            .zcard::<i64, _>(instance("rooms_7d", None).result())
            .await
            .unwrap_or(0)
            > 0
    })
    .await
}

#[tokio::test]
async fn a_killed_daemon_restarted_loses_nothing_and_counts_nothing_twice() {
    let (_redis, store, _dir, config, port) = redis_and_config("a").await;
    let now = now_ms();
    let events: Vec<Fields> = (0..8000).map(|i| tip_or_payment(i, now, 0)).collect();
    xadd_all(store.client(), intake_stream(), &events).await;
    let daemon = Daemon::start(&config, port).await;
    let started = rooms_ranked_soon(&store).await;
    assert!(started);
    daemon.kill().await;
    let pending = group_info(store.client(), intake_stream(), "rollboard")
        .await
        .expect("xinfo")
        .expect("group");
    assert!(
        pending.1.unwrap_or(0) > 0 || pending.0 > 0,
        "killed too late: nothing left to redeliver"
    );
    let daemon = Daemon::start(&config, port).await;
    assert_drained_into_model(&store, &events, &daemon).await;
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn two_daemons_share_a_group_and_take_over_a_dead_ones_entries() {
    let (redis, store, dir, config_a, port_a) = redis_and_config("a").await;
    let port_b = free_port();
    let config_b = write_config(dir.path(), &redis, port_b, "b", "");
    let events = tips_now(6000);
    let a = Daemon::start(&config_a, port_a).await;
    let b = Daemon::start(&config_b, port_b).await;
    xadd_all(store.client(), intake_stream(), &events[..3000]).await;
    assert!(drained(&store).await);
    assert!(
        a.metric("rollboard_events_applied_total", &[("board", "rooms_7d")])
            .await
            > 0.0,
        "a took part"
    );
    assert!(
        b.metric("rollboard_events_applied_total", &[("board", "rooms_7d")])
            .await
            > 0.0,
        "b took part"
    );
    // Kill b while it holds entries; a claims them after claim_idle (1s).
    assert!(b.terminate().await.success());
    read_unacked(&store, "rollboard", "b", 100).await;
    xadd_all(store.client(), intake_stream(), &events[3000..]).await;
    read_unacked(&store, "rollboard", "b", 100).await;
    assert_drained_into_model(&store, &events, &a).await;
    assert!(a.terminate().await.success());
}

#[tokio::test]
async fn sigterm_under_load_exits_0_and_loses_nothing() {
    let (_redis, store, _dir, config, port) = redis_and_config("a").await;
    let events = tips_now(6000);
    let daemon = Daemon::start(&config, port).await;
    let producer = {
        let client = store.client().clone();
        let events = events.clone();
        tokio::spawn(async move { xadd_all(&client, intake_stream(), &events).await })
    };
    let busy = rooms_ranked_soon(&store).await;
    assert!(busy);
    let status = daemon.terminate().await;
    assert!(status.success(), "exit status {status:?}");
    producer.await.expect("producer");
    // Whatever the stopped daemon did not take, a new one does; nothing is lost or doubled.
    let daemon = Daemon::start(&config, port).await;
    assert_drained_into_model(&store, &events, &daemon).await;
    assert!(daemon.terminate().await.success());
}

/// How many SIGTERM points the randomized shutdown test tries (`ROLLBOARD_SIGTERM_RUNS`).
fn sigterm_runs() -> usize {
    env_count("ROLLBOARD_SIGTERM_RUNS", 10)
}

/// The seed of the randomized shutdown test: `ROLLBOARD_SIGTERM_SEED`, else the clock.
fn sigterm_seed() -> u64 {
    env_seed("ROLLBOARD_SIGTERM_SEED")
}

/// The last lines of a daemon log, for failure messages.
fn log_tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// SIGTERM at random points while a large backlog is ingested: every exit is 0 and leaves
/// nothing pending in the group (the batch in flight and the one read ahead are applied and
/// acked), and after all the restarts every board equals the model.
#[tokio::test]
async fn sigterm_at_random_points_leaves_nothing_pending() {
    const BACKLOG: usize = 100_000;
    let runs = sigterm_runs();
    let seed = sigterm_seed();
    eprintln!("sigterm test: seed {seed} (ROLLBOARD_SIGTERM_SEED), {runs} runs");
    let mut rng = SplitMix(seed);
    let (_redis, store, _dir, config, port) = redis_and_config("a").await;
    edit_config(&config, "batch_size = 200", "batch_size = 256");
    let now = now_ms();
    let event = |i: usize| tip_or_payment(i, now, 0);
    let mut events: Vec<Fields> = (0..BACKLOG).map(event).collect();
    xadd_all(store.client(), intake_stream(), &events).await;
    let group = || async {
        group_info(store.client(), intake_stream(), "rollboard")
            .await
            .expect("xinfo groups")
    };
    for run in 1..=runs {
        let context = format!("seed {seed}, run {run} of {runs}");
        // Keep a backlog for every SIGTERM point: top it up when an earlier run took it all.
        if let Some((0, Some(0))) = group().await {
            let more: Vec<Fields> = (events.len()..events.len() + BACKLOG / 4)
                .map(event)
                .collect();
            xadd_all(store.client(), intake_stream(), &more).await;
            events.extend(more);
        }
        let daemon = Daemon::start(&config, port).await;
        let applying = wait_for(Duration::from_secs(30), || async {
            daemon
                .metric("rollboard_events_applied_total", &[("board", "rooms_7d")])
                .await
                > 0.0
        })
        .await;
        assert!(
            applying,
            "{context}: nothing applied; log:\n{}",
            log_tail(&daemon.logs())
        );
        let delay = Duration::from_millis(rng.next() % 1_500);
        tokio::time::sleep(delay).await;
        let log = daemon.log.clone();
        let status = daemon.terminate().await;
        let logs = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            status.success(),
            "{context}: exit status {status:?} after {delay:?}; log:\n{}",
            log_tail(&logs)
        );
        let (pending, lag) = group().await.expect("the group exists");
        assert_eq!(
            pending,
            0,
            "{context}: {pending} entries left pending after a clean exit {delay:?} into the run \
             (lag {lag:?}); log:\n{}",
            log_tail(&logs)
        );
    }
    eprintln!("sigterm test: {runs} SIGTERM points left nothing pending");
    let daemon = Daemon::start(&config, port).await;
    assert_drained_into_model(&store, &events, &daemon).await;
    assert!(
        daemon.terminate().await.success(),
        "seed {seed}: final exit"
    );
    assert_eq!(group().await, Some((0, Some(0))), "seed {seed}: all taken");
}

/// Entries pending for the daemon's consumer that its loop never read (here delivered under
/// its name by someone else, as a reply lost on the wire would leave them) are applied and
/// acked before a clean exit, not left for the next start or another replica's claim.
#[tokio::test]
async fn sigterm_drains_own_pending_entries_the_loop_never_saw() {
    let (_redis, store, _dir, config, port) = redis_and_config("a").await;
    let events = tips_now(300);
    let daemon = Daemon::start(&config, port).await;
    xadd_all(store.client(), intake_stream(), &events[..100]).await;
    assert!(drained(&store).await, "log:\n{}", daemon.logs());
    // Append and deliver to "a" in one transaction: the daemon's own read never sees them,
    // and they are idle for far less than claim_idle (1s) when the SIGTERM comes.
    let tx = store.client().multi();
    for fields in &events[100..] {
        let _: () = tx
            .xadd(intake_stream(), false, None, "*", fields.clone())
            .await
            .expect("queue xadd");
    }
    let _: () = tx
        .xreadgroup(
            "rollboard",
            "a",
            Some(1000),
            None,
            false,
            intake_stream(),
            ">",
        )
        .await
        .expect("queue xreadgroup");
    let _: Value = tx.exec(true).await.expect("exec");
    let pending = group_info(store.client(), intake_stream(), "rollboard")
        .await
        .expect("xinfo groups");
    assert_eq!(pending, Some((200, Some(0))));
    let status = daemon.terminate().await;
    assert!(status.success(), "exit status {status:?}");
    let pending = group_info(store.client(), intake_stream(), "rollboard")
        .await
        .expect("xinfo groups");
    assert_eq!(pending, Some((0, Some(0))), "nothing left pending at exit");
    let daemon = Daemon::start(&config, port).await;
    assert_drained_into_model(&store, &events, &daemon).await;
    assert!(daemon.terminate().await.success());
}
