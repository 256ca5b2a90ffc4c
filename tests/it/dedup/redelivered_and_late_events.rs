//! Redelivered and late events: a redelivered batch changes nothing, late events are
//! rejected before duplicates, and a board whose ids may be forgotten refuses as late.

use rollboard::store::Outcome;

use crate::support::boards::{apply_events, board, ev, with_fresh_store, HOUR};
use crate::support::keys::instance;

const NOW: i64 = 1_763_700_000_000;

#[tokio::test]
async fn a_redelivered_batch_changes_nothing() {
    let (redis, store, b) = with_fresh_store(board("rooms", HOUR, 24)).await;
    let batch = [
        ev("a", NOW, "x", 5),
        ev("b", NOW, "y", 7),
        ev("a", NOW, "x", 5),
    ];
    let first = apply_events(&store, &b, &batch, NOW).await;
    assert_eq!(
        first,
        vec![Outcome::Applied, Outcome::Applied, Outcome::Duplicate]
    );
    let before = redis.ranking(&instance("rooms", None).result());
    let again = apply_events(&store, &b, &batch, NOW).await;
    assert_eq!(again, vec![Outcome::Duplicate; 3]);
    assert_eq!(redis.ranking(&instance("rooms", None).result()), before);
    // Same key, other fields (even another slice): still a duplicate, the first one wins.
    let other = apply_events(&store, &b, &[ev("b", NOW - 2 * HOUR, "z", 100)], NOW).await;
    assert_eq!(other, vec![Outcome::Duplicate]);
    assert_eq!(
        store.rank(&b.widest(), None, "z", NOW).await.unwrap().rank,
        None
    );
}

#[tokio::test]
async fn late_events_are_rejected_before_duplicates() {
    let (_redis, store, b) = with_fresh_store(board("rooms", HOUR, 4)).await;
    // Live slices at NOW: slice_of(NOW) - 3 ..= slice_of(NOW).
    let edge = (b.slice_of(NOW) - 3) * HOUR;
    let out = apply_events(
        &store,
        &b,
        &[ev("1", edge, "x", 1), ev("2", edge - 1, "x", 1)],
        NOW,
    )
    .await;
    assert_eq!(out, vec![Outcome::Applied, Outcome::Late]);
    // A copy of an applied event that is now late is late, not a duplicate.
    let later = NOW + HOUR;
    let out = apply_events(&store, &b, &[ev("1", edge, "x", 1)], later).await;
    assert_eq!(out, vec![Outcome::Late]);
}

#[tokio::test]
async fn dedup_window_duration_refuses_as_late_once_it_may_forget() {
    let (_redis, store, mut b) = with_fresh_store(board("rooms", HOUR, 24)).await;
    b.dedup = rollboard::domain::board::Dedup::AfterSlice(60_000);
    let ts = b.slice_of(NOW) * HOUR; // start of the current slice
    apply_events(&store, &b, &[ev("k", ts, "x", 1)], NOW).await;
    let slice_end = ts + HOUR;
    let out = apply_events(&store, &b, &[ev("k", ts, "x", 1)], slice_end + 59_999).await;
    assert_eq!(out, vec![Outcome::Duplicate]);
    let out = apply_events(&store, &b, &[ev("k", ts, "x", 1)], slice_end + 60_000).await;
    assert_eq!(
        out,
        vec![Outcome::Late],
        "remembered for exactly 1 minute after its slice, then refused as late: never counted again"
    );
}
