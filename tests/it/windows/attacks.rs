//! Attacks on a board with several windows: a narrower window whose roll fails while the
//! widest empties, two rollers at once, a roll that stopped after the narrower window at a
//! forced later time, answers for a member or a scope held nowhere, and a window named by
//! an equal duration.

use fred::prelude::*;

use rollboard::domain::board::{Board, Changes, Window};
use rollboard::store::{Outcome, Store};

use crate::support::*;
use crate::windows::one_ingest_every_window::two_windows;

/// Half past an hour: `now - k * HOUR` is in the k-th slice before now's.
fn now0() -> i64 {
    T0 / HOUR * HOUR + HOUR / 2
}

/// The two-window board (2h and 6h) `name` scoped by `room`, with a change feed.
fn scoped_feed(name: &str) -> Board {
    let mut b = two_windows(name);
    b.scope = Some("room".into());
    b.changes = Some(Changes {
        top: 3,
        max_len: 100,
    });
    b
}

/// The total of `member` in the instance `scope` of `view` at `now`.
async fn total_in(
    store: &Store,
    view: &Board,
    scope: Option<&str>,
    member: &str,
    now: i64,
) -> Option<i64> {
    store
        .rank(view, scope, member, now)
        .await
        .expect("rank")
        .total
}

/// Whether `scope` is in board `name`'s scope registry.
async fn registered(store: &Store, name: &str, scope: &str) -> bool {
    let score: Option<f64> = store
        .client()
        .zscore(store.keys().scopes(name), scope)
        .await
        .expect("ZSCORE");
    score.is_some()
}

/// A scope whose narrower window fails to roll (its change stream is of the wrong type)
/// while its widest window empties stays registered: the next roll, the fault gone,
/// expires the narrower window too, which must not keep its old totals for ever.
#[tokio::test]
async fn a_narrow_window_that_failed_to_roll_keeps_its_scope_registered() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let b = scoped_feed("tips");
    let narrow = b.view(Some("2h")).unwrap();
    let now = now0();
    let out = apply_events_in(&store, &b, "r1", &[ev("1", now, "ann", 7)], now).await;
    assert_eq!(out, [Outcome::Applied]);
    assert_eq!(
        total_in(&store, &narrow, Some("r1"), "ann", now).await,
        Some(7)
    );

    // Seven hours on, both windows have let go of the event; the narrower's roll fails.
    let feed = store.keys().changes("tips", Some("r1"), Some("2h"));
    let _: () = store.client().del(&feed).await.expect("DEL");
    set_string(&store, &feed, "not a stream").await;
    let later = now + 7 * HOUR;
    let report = rollboard::roll::run_once(
        &store,
        std::slice::from_ref(&b),
        rollboard::roll::Job::All,
        None,
        later,
        10,
        &tokio_util::sync::CancellationToken::new(),
    )
    .await
    .expect("roll")
    .remove(0);
    assert_eq!(report.instances_failed, 1, "{report:?}");
    assert!(
        registered(&store, "tips", "r1").await,
        "the scope left the registry while its 2h window still holds a dead slice"
    );

    // The fault repaired (the stream gone), the next roll expires the narrower window.
    let _: () = store.client().del(&feed).await.expect("DEL");
    let report = roll_board(&store, &b, later + HOUR).await;
    assert_eq!(report.scopes_removed, 1, "{report:?}");
    assert_eq!(
        total_in(&store, &narrow, Some("r1"), "ann", later + HOUR).await,
        None
    );
    assert!(!registered(&store, "tips", "r1").await);
    for view in b.views() {
        assert_verified(&store, &view, Some("r1")).await;
    }
}
