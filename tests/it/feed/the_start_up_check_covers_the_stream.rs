//! The start-up permission check (`Store::check_permissions`, deploy/redis/README.md) probes
//! every key a board's scripts write. A change stream lives outside the instance's base
//! (`rb:changes:{board}`), so a Redis user whose key patterns cover the instances, the
//! records and the streams but not `rb:changes:*` must be refused at start, not find out at
//! its first apply (a NOPERM there is an outage, retried for ever).

use rollboard::domain::board::Changes;

use crate::support::acl::{denied, store_as};
use crate::support::boards::{apply_events, board, ev, T0};
use crate::support::redis::RedisServer;

const SLICE: i64 = 60_000;

#[tokio::test]
async fn a_user_that_may_not_write_the_change_stream_is_refused_at_start() {
    let redis = RedisServer::start();
    let store = store_as(
        &redis,
        "narrow",
        &[
            "~rb:{*",
            "~rb:board:*",
            "~rb:events*",
            "~rb:job:*",
            "~rb:sync:*",
        ],
    )
    .await;
    let plain = board("plain", SLICE, 4);
    let mut fed = board("fed", SLICE, 4);
    fed.changes = Some(Changes {
        top: 3,
        max_len: 100,
    });
    // The same user is enough for a board without a feed.
    assert_eq!(denied(&store, &plain).await, Vec::<String>::new());
    let now = T0 / SLICE * SLICE + SLICE / 2;
    apply_events(&store, &plain, &[ev("a", now, "alice", 1)], now).await;
    // With a feed, its stream is named at start.
    assert_eq!(
        denied(&store, &fed).await,
        vec!["key rb:changes:{fed}".to_string()]
    );
    // What the check spares the daemon: every apply fails.
    let failed = store
        .apply(&fed, None, &[ev("a", now, "alice", 1)], now)
        .await;
    assert!(
        format!("{failed:?}").contains("NOPERM"),
        "the apply answered {failed:?}"
    );
}
