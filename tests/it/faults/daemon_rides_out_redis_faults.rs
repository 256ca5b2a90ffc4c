//! A running daemon through Redis faults: a restart turns `/readyz` 503 then 200, every
//! connection counts its reconnect, a board whose apply keeps failing holds no other board,
//! connections cut after scripts and acks reach Redis lose and double nothing, and a roll
//! without Redis is counted as failed.

use std::collections::HashMap;
use std::time::Duration;

use fred::prelude::*;
use rollboard::store::Store;

use crate::support::asserts::{
    assert_drained_into_model, assert_metrics, assert_state, verify_differences,
};
use crate::support::boards::{now_ms, test_boards};
use crate::support::config::{config_for, config_for_url};
use crate::support::daemon::{redis_and_config, Daemon};
use crate::support::events::{models, payment, tip, tip_or_payment, tips_now, xadd_all, Fields};
use crate::support::keys::{dead_letter_stream, instance, intake_stream};
use crate::support::redis::RedisServer;
use crate::support::wait::{drained, wait_for};

#[tokio::test]
async fn a_redis_restart_turns_readyz_503_then_200_and_loses_nothing() {
    let mut redis = RedisServer::start_persistent();
    let store_url = redis.url();
    let (_dir, port, config) = config_for(&redis, "a", "");
    let daemon = Daemon::start(&config, port).await;
    let ready = daemon.readyz_becomes(200, Duration::from_secs(30)).await;
    assert!(ready, "never ready; log:\n{}", daemon.logs());
    let events = tips_now(1000);
    {
        let store = Store::connect(&store_url, "rb", 1, rollboard::store::Reconnect::Never)
            .await
            .expect("connect");
        xadd_all(store.client(), intake_stream(), &events[..500]).await;
        assert!(drained(&store).await);
    }
    redis.kill();
    let unready = daemon.readyz_becomes(503, Duration::from_secs(30)).await;
    assert!(unready, "readyz stayed up without redis");
    assert_eq!(
        daemon.get("/healthz").await.0,
        200,
        "the process itself is alive"
    );
    redis.restart();
    let ready = daemon.readyz_becomes(200, Duration::from_secs(30)).await;
    assert!(ready, "never ready again; log:\n{}", daemon.logs());
    let store = Store::connect(&store_url, "rb", 1, rollboard::store::Reconnect::Never)
        .await
        .expect("connect");
    xadd_all(store.client(), intake_stream(), &events[500..]).await;
    assert_drained_into_model(&store, &events, &daemon).await;
    assert!(daemon.metric("rollboard_redis_reconnects_total", &[]).await >= 1.0);
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn a_board_whose_apply_keeps_failing_is_reported_and_holds_no_other_board() {
    let (_redis, store, _dir, config, port) = redis_and_config("a").await;
    let now = now_ms();
    let c = store.client();
    // rooms_7d's members hash is of the wrong type: every apply of that board fails.
    let _: () = c
        .set(
            instance("rooms_7d", None).members(),
            "broken",
            None,
            None,
            false,
        )
        .await
        .expect("set");
    let daemon = Daemon::start(&config, port).await;
    let tips: Vec<Fields> = (0..300).map(|i| tip(i, now)).collect();
    let payments: Vec<Fields> = (0..100).map(|i| payment(i, now)).collect();
    xadd_all(c, intake_stream(), &tips).await;
    xadd_all(c, intake_stream(), &payments).await;
    assert!(drained(&store).await, "the other boards were held back");

    // The other boards hold exactly their events.
    let boards = test_boards();
    let everything: Vec<Fields> = tips.iter().chain(&payments).cloned().collect();
    let mut expected = models(&everything, &boards, now);
    expected.retain(|(b, _), _| boards[*b].name != "rooms_7d");
    assert_state(&store, &boards, &expected, now).await;
    assert_eq!(
        c.exists::<i64, _>(instance("rooms_7d", None).result())
            .await
            .expect("exists"),
        0
    );

    // Every tip is in the dead-letter stream once, for rooms_7d only, as apply_failed.
    let dead: Vec<(String, HashMap<String, String>)> = c
        .xrange(dead_letter_stream(), "-", "+", None)
        .await
        .expect("xrange");
    // Once each: a batch read ahead while the previous one was retried is not claimed
    // and processed a second time.
    assert_eq!(dead.len(), tips.len());
    for (_, fields) in &dead {
        assert_eq!(fields["reason"], "apply_failed");
        assert!(fields["detail"].contains("board rooms_7d"), "{fields:?}");
    }
    assert_eq!(
        daemon
            .metric(
                "rollboard_events_dead_lettered_total",
                &[("reason", "apply_failed")]
            )
            .await,
        tips.len() as f64
    );
    assert_metrics(
        &daemon,
        &[
            "rollboard_board_apply_failing{board=rooms_7d} 1",
            "rollboard_board_apply_failing{board=fans_7d} 0",
        ],
    )
    .await;
    let (status, body) = daemon.get("/readyz").await;
    assert_eq!(status, 200, "{body}");
    let ready: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(ready["failing_boards"], serde_json::json!(["rooms_7d"]));
    assert!(daemon.logs().contains("rooms_7d"));

    // Repaired and replayed (original fields, same ids): rooms_7d gets every tip once,
    // the boards that already counted them skip them as duplicates.
    let _: i64 = c
        .del(instance("rooms_7d", None).members())
        .await
        .expect("del");
    let replay: Vec<Fields> = dead
        .iter()
        .map(|(_, fields)| {
            let mut f: Fields = fields
                .iter()
                .filter(|(k, _)| {
                    !["reason", "detail", "source_id", "source_stream"].contains(&k.as_str())
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            f.sort();
            f
        })
        .collect();
    xadd_all(c, intake_stream(), &replay).await;
    assert!(drained(&store).await);
    assert_state(&store, &boards, &models(&everything, &boards, now), now).await;
    let recovered = daemon
        .metric_becomes(
            "rollboard_board_apply_failing",
            &[("board", "rooms_7d")],
            0.0,
            Duration::from_secs(10),
        )
        .await;
    assert!(recovered, "rooms_7d still reported failing");
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn connections_cut_after_scripts_and_acks_reach_redis_lose_nothing_and_double_nothing() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let proxy = crate::support::proxy::Proxy::start(redis.port).await;
    let (_dir, port, config) = config_for_url(&proxy.url(), "a", "");
    let now = now_ms();
    let events: Vec<Fields> = (0..4000).map(|i| tip_or_payment(i, now, 3)).collect();
    xadd_all(store.client(), intake_stream(), &events).await;
    let daemon = Daemon::start(&config, port).await;
    // Cut a connection right after an apply script, an XACK or an expiry chunk reached
    // Redis (its reply lost), over and over while the backlog drains.
    let patterns: [&[u8]; 3] = [b"FCALL", b"XACK", b"XREADGROUP"];
    let mut armed = 0;
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    while armed < 24 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        proxy.cut_after(patterns[(seed % 3) as usize], 1);
        armed += 1;
        let fired = wait_for(Duration::from_secs(5), || async { proxy.cuts() >= armed }).await;
        if !fired {
            break;
        }
    }
    assert!(proxy.cuts() >= 5, "only {} cuts happened", proxy.cuts());
    assert_drained_into_model(&store, &events, &daemon).await;
    for board in test_boards() {
        for scope in rollboard::roll::instances(&store, &board)
            .await
            .expect("instances")
        {
            let d = verify_differences(&store, &board, scope.as_deref()).await;
            assert!(d.is_empty(), "{}: {:?}", board.name, d);
        }
    }
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn a_roll_without_redis_is_counted_as_failed_and_not_as_done() {
    let mut redis = RedisServer::start_persistent();
    let (_dir, port, config) = config_for(&redis, "a", "");
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(
        &config,
        text.replace("roll = \"*/2 * * * * *\"", "roll = \"* * * * * *\""),
    )
    .expect("per-second rolls");
    let daemon = Daemon::start(&config, port).await;
    let board = [("board", "rooms_7d")];
    let failures = [("board", "rooms_7d"), ("mode", "incremental")];
    let gauge = |name: &'static str| {
        let daemon = &daemon;
        async move { daemon.metric(name, &board).await }
    };
    let rolled = wait_for(Duration::from_secs(20), || async {
        gauge("rollboard_last_roll_timestamp_seconds").await > 0.0
    })
    .await;
    assert!(rolled, "never rolled; log:\n{}", daemon.logs());
    // The window gauges tell where the window is: the live range of a query right now.
    let now = now_ms() as f64 / 1000.0;
    let (start, end) = (
        gauge("rollboard_window_start_timestamp_seconds").await,
        gauge("rollboard_window_end_timestamp_seconds").await,
    );
    assert_eq!(end - start, 7.0 * 86_400.0);
    assert!(end > now && end <= now + 6.0 * 3_600.0, "{end} vs {now}");
    assert_eq!(
        daemon
            .metric("rollboard_roll_failures_total", &failures)
            .await,
        0.0
    );

    redis.kill();
    let failed = wait_for(Duration::from_secs(30), || async {
        daemon
            .metric("rollboard_roll_failures_total", &failures)
            .await
            >= 1.0
    })
    .await;
    assert!(failed, "no failed roll counted; log:\n{}", daemon.logs());
    let last = gauge("rollboard_last_roll_timestamp_seconds").await;
    let seen = daemon
        .metric("rollboard_roll_failures_total", &failures)
        .await;
    let more = wait_for(Duration::from_secs(30), || async {
        daemon
            .metric("rollboard_roll_failures_total", &failures)
            .await
            >= seen + 2.0
    })
    .await;
    assert!(more, "every failed run counts; log:\n{}", daemon.logs());
    assert!(daemon.metric("rollboard_redis_errors_total", &[]).await >= 3.0);
    assert!(
        daemon
            .metric("rollboard_redis_errors_total", &[("kind", "connection")])
            .await
            + daemon
                .metric("rollboard_redis_errors_total", &[("kind", "timeout")])
                .await
            >= 3.0,
        "an outage is a connection or timeout error"
    );
    assert_eq!(
        gauge("rollboard_last_roll_timestamp_seconds").await,
        last,
        "a failed roll is not a roll"
    );
    assert_eq!(
        gauge("rollboard_window_end_timestamp_seconds").await,
        end,
        "the window did not move"
    );

    redis.restart();
    let back = wait_for(Duration::from_secs(30), || async {
        gauge("rollboard_last_roll_timestamp_seconds").await > last
    })
    .await;
    assert!(back, "rolls resumed; log:\n{}", daemon.logs());
    assert!(daemon.terminate().await.success());
}

/// Counts the connections to `redis` other than the one asking.
fn connected_clients(redis: &RedisServer) -> usize {
    redis
        .cli(&["CLIENT", "LIST"])
        .lines()
        .filter(|l| l.contains("id="))
        .count()
        .saturating_sub(1)
}

#[tokio::test]
async fn readyz_recovers_and_every_connection_counts_its_reconnect_after_an_outage() {
    let mut redis = RedisServer::start_persistent();
    let (_dir, port, config) = config_for(&redis, "a", "");
    let daemon = Daemon::start(&config, port).await;
    let ready = daemon.readyz_becomes(200, Duration::from_secs(30)).await;
    assert!(ready, "never ready; log:\n{}", daemon.logs());
    // A query, so that the HTTP store's read connection is open too.
    let (status, _) = daemon.get("/v1/boards/rooms_7d/top").await;
    assert_eq!(status, 200);
    let before = connected_clients(&redis);
    assert!(before >= 4, "{before} connections");
    assert_metrics(&daemon, &["rollboard_redis_reconnects_total 0"]).await;
    redis.kill();
    let unready = daemon.readyz_becomes(503, Duration::from_secs(30)).await;
    assert!(unready, "readyz stayed up without redis");
    // The answer read before the outage is kept for http.max_staleness: a query may be
    // given it until then, and reads Redis after.
    let (status, _) = daemon
        .get_once("/v1/boards/rooms_7d/top", |status, _| status == 503)
        .await;
    assert_eq!(status, 503, "a query without redis is refused");
    redis.restart();
    let ready = daemon.readyz_becomes(200, Duration::from_secs(30)).await;
    assert!(ready, "never ready again; log:\n{}", daemon.logs());
    let (status, _) = daemon.get("/v1/boards/rooms_7d/top").await;
    assert_eq!(status, 200);
    let counted = wait_for(Duration::from_secs(30), || async {
        daemon.metric("rollboard_redis_reconnects_total", &[]).await == before as f64
    })
    .await;
    assert!(
        counted,
        "{} reconnects counted for {before} connections; log:\n{}",
        daemon.metric("rollboard_redis_reconnects_total", &[]).await,
        daemon.logs()
    );
    assert!(daemon.terminate().await.success());
}
