//! One call in flight per instance: a scoped board spread over many rooms, fed through
//! HTTP, still counts every tip exactly.

use crate::support::asserts::{assert_drained_into_model, assert_metrics};
use crate::support::boards::now_ms;
use crate::support::config::{config_for, edit_config};
use crate::support::daemon::Daemon;
use crate::support::events::{post_events, spread_tip, xadd_all, Fields};
use crate::support::keys::intake_stream;
use crate::support::redis::RedisServer;

#[tokio::test]
async fn one_call_in_flight_with_a_scoped_board_over_many_rooms_counts_exactly() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let (_dir, port, config) = config_for(&redis, "a", "");
    edit_config(&config, "[redis]\n", "[redis]\nmax_calls_in_flight = 1\n");
    let daemon = Daemon::start(&config, port).await;
    let now = now_ms();
    let events: Vec<Fields> = (0..2000).map(|i| spread_tip(i, now)).collect();
    xadd_all(store.client(), intake_stream(), &events[..1500]).await;
    assert_eq!(post_events(&daemon.base, &events[1500..]).await, 202);
    // A query answers while the daemon works through the batches.
    let (status, _) = daemon.get("/v1/boards/fans_7d/top?scope=room3").await;
    assert_eq!(status, 200);
    assert_drained_into_model(&store, &events, &daemon).await;
    assert_metrics(
        &daemon,
        &["rollboard_events_applied_total{board=rooms_7d} 2000"],
    )
    .await;
    assert!(daemon.terminate().await.success());
}
