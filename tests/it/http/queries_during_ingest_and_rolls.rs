//! Queries answer while the daemon ingests a backlog and rolls (the HTTP API on its own
//! thread and runtime).

use std::time::Duration;

use crate::support::asserts::assert_state;
use crate::support::boards::{now_ms, test_boards};
use crate::support::config::config_for;
use crate::support::daemon::Daemon;
use crate::support::events::{models, spread_tip, xadd_all, Fields};
use crate::support::keys::intake_stream;
use crate::support::redis::RedisServer;

#[tokio::test]
async fn queries_answer_while_the_daemon_ingests_a_backlog_and_rolls() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let (_dir, port, config) = config_for(&redis, "a", "");
    let now = now_ms();
    let events: Vec<Fields> = (0..12_000).map(|i| spread_tip(i, now)).collect();
    xadd_all(store.client(), intake_stream(), &events).await;
    let daemon = Daemon::start(&config, port).await;
    let client = reqwest::Client::new();
    let (mut answered, mut slowest) = (0usize, Duration::ZERO);
    let paths = [
        "/v1/boards/rooms_7d/top?limit=10",
        "/v1/boards/fans_7d/top?scope=room7",
        "/v1/boards/tips_24h/top",
    ];
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    let mut during_ingest = 0usize;
    loop {
        let done = matches!(
            rollboard::ingest::stream::group_info(store.client(), intake_stream(), "rollboard")
                .await,
            Ok(Some((0, Some(0))))
        );
        if done && answered >= 30 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "stream never drained");
        if !done {
            during_ingest += 1;
        }
        let path = paths[answered % paths.len()];
        let started = std::time::Instant::now();
        let r = client
            .get(format!("{}{path}", daemon.base))
            .send()
            .await
            .expect("get");
        let status = r.status().as_u16();
        let body = r.text().await.expect("body");
        slowest = slowest.max(started.elapsed());
        assert_eq!(status, 200, "{path}: {body}");
        let page: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert!(page.is_object(), "{body}");
        answered += 1;
    }
    assert!(
        during_ingest >= 3,
        "{during_ingest} queries while ingesting"
    );
    assert!(
        slowest < Duration::from_secs(3),
        "slowest query took {slowest:?}"
    );
    let boards = test_boards();
    let now = now_ms();
    assert_state(&store, &boards, &models(&events, &boards, now), now).await;
    assert!(daemon.terminate().await.success());
}
