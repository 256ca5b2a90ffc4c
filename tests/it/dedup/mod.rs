//! Exactly once: idempotency keys (given ids, stream entry IDs), the digest table, and redelivered or late events.

mod digest_table;
mod entry_id_keys;
mod keys_of_events_without_id;
mod largest_window_slice_tags;
mod redelivered_and_late_events;
mod trim_seen_tag_search;

use rollboard::domain::board::Board;
use rollboard::store::Store;

/// Asserts that u1's replayed 5 counts once on `repaired` and stays a duplicate on `counted`.
async fn assert_replayed_once(store: &Store, repaired: &Board, counted: &Board, now: i64) {
    let (once, dup) = (&repaired.name, &counted.name);
    let (repaired, counted) = (repaired.widest(), counted.widest());
    let total = |b| crate::support::boards::total_at(store, b, "u1", now);
    assert_eq!(total(&repaired).await, Some(5), "{once}: counted once");
    assert_eq!(total(&counted).await, Some(5), "{dup}: a duplicate");
}
