//! Events from the stream, `send` and HTTP, taken by a running daemon, end in the model
//! state.

use std::collections::HashMap;

use crate::support::asserts::{assert_drained_into_model, assert_metrics};
use crate::support::boards::now_ms;
use crate::support::cli::send_file;
use crate::support::config::write_file;
use crate::support::daemon::{redis_and_config, Daemon};
use crate::support::events::{payment, post_fields, tip, xadd_all, Fields};
use crate::support::keys::intake_stream;

#[tokio::test]
async fn events_from_the_stream_send_and_http_end_in_the_model_state() {
    let (_redis, store, dir, config, port) = redis_and_config("a").await;
    let daemon = Daemon::start(&config, port).await;
    let now = now_ms();
    let mut events: Vec<Fields> = (0..600)
        .map(|i| tip(i, now))
        .chain((0..200).map(|i| payment(i, now)))
        .collect();
    xadd_all(store.client(), intake_stream(), &events[..400]).await;
    // Through `rollboard send`, from a JSON-lines file (numbers taken as written).
    let lines: Vec<String> = events[400..700]
        .iter()
        .map(|f| {
            serde_json::to_string(&f.iter().cloned().collect::<HashMap<String, String>>())
                .expect("json")
        })
        .collect();
    let file = write_file(dir.path(), "events.jsonl", &lines.join("\n"));
    send_file(&config, &file);
    // Through HTTP, as one array.
    let r = post_fields(&daemon.base, &events[700..]).await;
    assert_eq!(r.status().as_u16(), 202);
    // Redelivering the same events changes nothing.
    xadd_all(store.client(), intake_stream(), &events[..50]).await;
    events.truncate(800);
    assert_drained_into_model(&store, &events, &daemon).await;
    assert_metrics(
        &daemon,
        &[
            "rollboard_events_applied_total{board=rooms_7d} 600",
            "rollboard_events_applied_total{board=tips_24h} 200",
            "rollboard_events_skipped_total{board=rooms_7d,reason=duplicate} 50",
        ],
    )
    .await;
    assert!(daemon.terminate().await.success());
}
