//! A rolling upgrade to the release that judges events in the worker: the keys' layout is
//! the one the scripts write, so a daemon judging every instance by `fold.lua` (the
//! previous release's apply, `redis.transactions = false` here) and one judging in the
//! worker share a consumer group and the data in Redis; the old one is then stopped.

use crate::support::asserts::assert_drained_into_model_at;
use crate::support::boards::now_ms;
use crate::support::config::config_for_url;
use crate::support::daemon::Daemon;
use crate::support::events::{xadd_all, Fields};
use crate::support::keys::{dead_letter_stream, intake_stream};
use crate::support::redis::RedisServer;

/// A tip to one of 97 rooms from one of 211 fans, its time within the last 50 minutes:
/// the scoped board's instances small and many, the unscoped one's digest table large.
fn tip(i: usize, now: i64) -> Fields {
    vec![
        ("room".into(), format!("r{}", i % 97)),
        ("user".into(), format!("u{}", (i * 7) % 211)),
        ("amount".into(), (1 + i % 9).to_string()),
        ("id".into(), format!("t{i}")),
        (
            "ts".into(),
            (now - (i as i64 * 997) % 3_000_000).to_string(),
        ),
    ]
}

/// Data first written by the old daemon alone; then both daemons drain waves of events
/// in one group (a redelivered batch may go from one to the other); then the old daemon
/// is stopped (SIGTERM) holding a batch, and the new one drains the rest. Every event
/// counts once on every board, nothing is dead-lettered, and the new daemon did judge
/// in the worker.
#[tokio::test]
async fn an_old_and_a_judging_daemon_on_one_group_count_each_event_once() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let (_da, port_a, config_a) = config_for_url(&redis.url(), "old", "");
    let (_db, port_b, config_b) = config_for_url(&redis.url(), "new", "");
    let old = Daemon::spawn_with(
        &config_a,
        port_a,
        &[("ROLLBOARD__REDIS__TRANSACTIONS", "false".to_string())],
    );
    old.wait_up().await;
    let now = now_ms();
    let events: Vec<Fields> = (0..5000).map(|i| tip(i, now)).collect();
    xadd_all(store.client(), intake_stream(), &events[..1500]).await;
    assert_drained_into_model_at(&store, &events[..1500], &old, now).await;

    let new = Daemon::spawn_with(&config_b, port_b, &[]);
    new.wait_up().await;
    for part in events[1500..4000].chunks(500) {
        xadd_all(store.client(), intake_stream(), part).await;
    }
    xadd_all(store.client(), intake_stream(), &events[4000..]).await;
    assert!(old.terminate().await.success());
    assert_drained_into_model_at(&store, &events, &new, now).await;
    assert_eq!(redis.cli(&["XLEN", dead_letter_stream()]).trim(), "0");
    let judged = new
        .metric("rollboard_judged_instances_total", &[("by", "worker")])
        .await;
    assert!(judged > 0.0, "the new daemon judged nothing in the worker");
    assert!(new.terminate().await.success());
}
