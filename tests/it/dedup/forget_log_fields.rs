//! A slice's forget log kept in the digest table's own field `~<n>` (its first 64 entries,
//! as `fold.lua` writes them) and in its List `seen:<n>` past that: the boundary, the roll
//! draining both in bounded calls, a corrupt field, and a field no roll will visit (left by
//! a roll of a release that reads only the Lists).

use fred::prelude::*;
use rollboard::store::{ApplyEvent, Outcome, Store};

use crate::support::asserts::verify_differences;
use crate::support::boards::{
    apply_events, board, ev, roll_once, seen_log_entries, seen_logs, seen_table, snapshot,
};
use crate::support::redis::RedisServer;

const SLICE: i64 = 1_000;
const NOW: i64 = 1_000_000;

fn events(prefix: &str, n: usize) -> Vec<ApplyEvent> {
    (0..n)
        .map(|i| ev(&format!("{prefix}{i}"), NOW - 10, ["a", "b", "c"][i % 3], 1))
        .collect()
}

async fn field(store: &Store, table: &str, n: i64) -> Option<Vec<u8>> {
    store
        .client()
        .hget(table, format!("~{n}"))
        .await
        .expect("hget")
}

async fn list_len(store: &Store, key: &str) -> u64 {
    store.client().llen(key).await.expect("llen")
}

/// 64 entries fill the field, in calls of 8; the 65th and the 200 after it go to the List;
/// every id is remembered once; a redelivery is all duplicates; the roll forgets all 265
/// (the field and 64 List entries in its first call of 128, then the rest) and leaves no
/// field, no List and no entry.
#[tokio::test]
async fn a_slice_log_fills_the_table_field_then_its_list_and_the_roll_forgets_both() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let b = board("lf", SLICE, 4);
    let k = store.instance(&b.widest(), None);
    let n = b.slice_of(NOW - 10);
    let first = events("f", 64);
    for part in first.chunks(8) {
        assert_eq!(
            apply_events(&store, &b, part, NOW).await,
            vec![Outcome::Applied; part.len()]
        );
    }
    assert_eq!(
        field(&store, &k.seen_table(), n).await.map(|v| v.len()),
        Some(256)
    );
    assert_eq!(list_len(&store, &k.seen_log(n)).await, 0);

    let one = events("g", 1);
    assert_eq!(
        apply_events(&store, &b, &one, NOW).await,
        [Outcome::Applied]
    );
    assert_eq!(
        field(&store, &k.seen_table(), n).await.map(|v| v.len()),
        Some(256)
    );
    assert_eq!(list_len(&store, &k.seen_log(n)).await, 1);

    let more = events("h", 200);
    assert_eq!(
        apply_events(&store, &b, &more, NOW).await,
        vec![Outcome::Applied; 200]
    );
    assert_eq!(list_len(&store, &k.seen_log(n)).await, 201);
    let logs = seen_log_entries(&store, &b.widest(), None).await;
    assert_eq!(logs.keys().copied().collect::<Vec<_>>(), vec![n]);
    assert_eq!(logs[&n].len(), 265);
    assert_eq!(seen_table(&store, &b.widest(), None).await.len(), 265);

    let all: Vec<ApplyEvent> = [first, one, more].concat();
    assert_eq!(
        apply_events(&store, &b, &all, NOW).await,
        vec![Outcome::Duplicate; 265]
    );

    let report = roll_once(&store, &b, NOW + 10 * SLICE).await;
    assert_eq!(report.instances_failed, 0, "{:?}", report.first_error);
    assert_eq!(report.ids_forgotten, 265);
    assert_eq!(seen_table(&store, &b.widest(), None).await, vec![]);
    assert_eq!(
        seen_logs(&store, &b.widest(), None).await,
        Vec::<String>::new()
    );
    assert_eq!(field(&store, &k.seen_table(), n).await, None);
}

/// A field whose length is not a whole number of 4-byte entries fails the call that would
/// append to it, having written nothing, and the roll's trim of its slice; another slice's
/// events are applied meanwhile.
#[tokio::test]
async fn a_corrupt_log_field_fails_the_calls_that_read_it_and_writes_nothing() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let b = board("lc", SLICE, 4);
    let k = store.instance(&b.widest(), None);
    let n = b.slice_of(NOW - 10);
    assert_eq!(
        apply_events(&store, &b, &events("x", 2), NOW).await,
        [Outcome::Applied; 2]
    );
    let _: i64 = store
        .client()
        .hset(k.seen_table(), (format!("~{n}"), vec![1u8; 7]))
        .await
        .expect("hset");
    let before = snapshot(&store, &b).await;
    let got = store.apply(&b, None, &events("y", 3), NOW).await;
    assert!(
        got.as_ref()
            .is_err_and(|e| e.to_string().contains("ROLLBOARD corrupt") && !e.is_outage()),
        "{got:?}"
    );
    assert_eq!(snapshot(&store, &b).await, before, "the failed call wrote");
    let elsewhere = [ev("z", NOW - 10 - SLICE, "a", 4)];
    assert_eq!(
        apply_events(&store, &b, &elsewhere, NOW).await,
        [Outcome::Applied]
    );
    let report = roll_once(&store, &b, NOW + 10 * SLICE).await;
    assert_eq!(report.instances_failed, 1, "{report:?}");
    assert!(
        format!("{:?}", report.first_error).contains("corrupt"),
        "{report:?}"
    );
}

/// A field of a slice that the registry no longer lists (a roll of a release that drains
/// only the Lists dropped the slice and left it): its entries, long forgotten, count for
/// nothing; applies, redeliveries, rolls and verify go on as ever around it, and it stays
/// (a few bytes) until the instance is cleaned up.
#[tokio::test]
async fn a_log_field_no_roll_visits_any_more_changes_nothing() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let b = board("lo", SLICE, 4);
    let k = store.instance(&b.widest(), None);
    let old = b.slice_of(NOW - 20 * SLICE);
    let _: i64 = store
        .client()
        .hset(
            k.seen_table(),
            (format!("~{old}"), vec![0u8, 0, 0, 7, 1, 2, 3, 4]),
        )
        .await
        .expect("hset");
    let batch = events("o", 40);
    assert_eq!(
        apply_events(&store, &b, &batch, NOW).await,
        vec![Outcome::Applied; 40]
    );
    assert_eq!(
        apply_events(&store, &b, &batch, NOW).await,
        vec![Outcome::Duplicate; 40]
    );
    assert!(verify_differences(&store, &b, None).await.is_empty());
    let report = roll_once(&store, &b, NOW + 10 * SLICE).await;
    assert_eq!(report.instances_failed, 0, "{:?}", report.first_error);
    assert_eq!(report.ids_forgotten, 40);
    assert_eq!(seen_table(&store, &b.widest(), None).await, vec![]);
    assert_eq!(
        field(&store, &k.seen_table(), old).await.map(|v| v.len()),
        Some(8)
    );
}
