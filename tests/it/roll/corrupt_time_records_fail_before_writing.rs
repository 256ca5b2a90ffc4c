//! Time records that are corrupt: a `last_roll` or `expired_through` that is not an integer
//! fails every script of the instance before it writes.

use fred::prelude::*;
use rollboard::store::Store;

use crate::support::boards::{
    apply_events, apply_events_in, board, ev, redis_now, run_jobs, scoped, snapshot,
};
use crate::support::redis::RedisServer;

/// `HSET key field value` through the store's client.
async fn hset(store: &Store, key: &str, field: &str, value: &str) {
    let _: i64 = store
        .client()
        .hset(key, (field, value))
        .await
        .expect("hset");
}

/// Values of `last_roll` that no roll writes: each must fail a script that reads it, before
/// it writes anything, rather than be taken for "never rolled" or for a far-away time.
const CORRUPT_TIMES: [&str; 7] = ["soon", "", "1e15", "0x10", "17.5", "inf", " 42"];

#[tokio::test]
async fn a_corrupt_last_roll_fails_every_script_of_the_instance_before_it_writes() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let b = board("corrupt", 60_000, 10);
    let now = redis_now(&store).await;
    for value in CORRUPT_TIMES {
        let _: () = store.client().flushall(false).await.expect("flushall");
        let applied = apply_events(&store, &b, &[ev("first", now, "u1", 5)], now).await;
        assert_eq!(applied, vec![rollboard::store::Outcome::Applied]);
        let meta = store.instance(&b.widest(), None).meta();
        hset(&store, &meta, "last_roll", value).await;
        let before = snapshot(&store, &b).await;
        // The fold path (one new event) and the event-by-event path (an id twice in one chunk).
        for events in [
            vec![ev("second", now, "u1", 7)],
            vec![ev("second", now, "u1", 7), ev("second", now, "u1", 7)],
        ] {
            let e = store
                .apply(&b, None, &events, now)
                .await
                .expect_err(&format!("last_roll {value:?} was ignored"));
            assert!(
                e.to_string().contains("ROLLBOARD") && e.to_string().contains("last_roll"),
                "{value:?}: {e}"
            );
            assert_eq!(snapshot(&store, &b).await, before, "{value:?}: a write");
        }
        // The roll's watermark script too: the roll fails and the instance is unchanged.
        let reports = run_jobs(&store, std::slice::from_ref(&b), now, 100).await;
        assert_eq!(reports[0].instances_failed, 1, "{value:?}: {reports:?}");
        let error = reports[0].first_error.clone().unwrap_or_default();
        assert!(
            error.contains("ROLLBOARD") && error.contains("last_roll"),
            "{value:?}: {error}"
        );
        assert_eq!(snapshot(&store, &b).await, before, "{value:?}: a write");
    }
}

#[tokio::test]
async fn a_corrupt_expired_through_fails_the_roll_before_it_writes() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let b = board("corrupt", 60_000, 10);
    let now = redis_now(&store).await;
    for value in ["soon", "", "1e3", "0x10", "17.5"] {
        let _: () = store.client().flushall(false).await.expect("flushall");
        apply_events(&store, &b, &[ev("first", now, "u1", 5)], now).await;
        let meta = store.instance(&b.widest(), None).meta();
        hset(&store, &meta, "expired_through", value).await;
        let before = snapshot(&store, &b).await;
        let e = store
            .raise_watermark(&b.widest(), None, b.slice_of(now) - 10, now)
            .await
            .expect_err(&format!("expired_through {value:?} was overwritten"));
        assert!(e.to_string().contains("ROLLBOARD"), "{value:?}: {e}");
        assert_eq!(snapshot(&store, &b).await, before, "{value:?}: a write");
    }
}

/// A scoped board's own record (`rb:board:<name>:window`) holds a floor for every instance,
/// also those no roll visits: a `last_roll` there that is not a time must fail the apply
/// and the roll, never be skipped.
#[tokio::test]
async fn a_corrupt_board_last_roll_fails_applies_and_rolls_of_a_scoped_board() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let b = scoped(board("scoped", 60_000, 10));
    let now = redis_now(&store).await;
    for value in CORRUPT_TIMES {
        let _: () = store.client().flushall(false).await.expect("flushall");
        apply_events_in(&store, &b, "r1", &[ev("first", now, "u1", 5)], now).await;
        let window = store.keys().window(&b.name);
        hset(&store, &window, "last_roll", value).await;
        let e = store
            .apply(&b, Some("r1"), &[ev("second", now, "u1", 7)], now)
            .await
            .expect_err(&format!("board last_roll {value:?} was ignored"));
        assert!(e.to_string().contains("last_roll"), "{value:?}: {e}");
        let e = store
            .raise_board_watermark(&b.widest(), b.slice_of(now) - 10, now)
            .await
            .expect_err(&format!("board last_roll {value:?} was overwritten"));
        assert!(e.to_string().contains("ROLLBOARD"), "{value:?}: {e}");
        let stored: Option<String> = store
            .client()
            .hget(&window, "last_roll")
            .await
            .expect("hget");
        assert_eq!(
            stored.as_deref(),
            Some(value),
            "the corrupt record was overwritten"
        );
        let total = store
            .rank(&b.widest(), Some("r1"), "u1", now)
            .await
            .expect("rank")
            .total;
        assert_eq!(total, Some(5), "{value:?}");
    }
}
