//! A scoped board with two windows: a scope whose instances empty in both windows is
//! cleaned up in each (only `meta` stays, and the change stream for its readers, with a
//! time to live) and leaves the scope registry; a scope empty only in the narrower window
//! is cleaned up there, stays registered, and answers empty in that window and exactly in
//! the wider one.

use std::collections::BTreeSet;

use fred::prelude::*;
use rollboard::domain::board::{Board, Changes, View};
use rollboard::store::{Outcome, Store};

use crate::support::asserts::total_in;
use crate::support::boards::{apply_events_in, ev, keys_matching, roll_board, HOUR};
use crate::support::keys::{instance, instance_in, schema, under};
use crate::support::redis::RedisServer;
use crate::windows::one_ingest_every_window::two_windows;

const NOW: i64 = 1_763_700_000_000;

/// The two-window board `tips` (2h and 6h) scoped by `room`, with a change feed.
fn tips() -> Board {
    let mut b = two_windows("tips");
    b.scope = Some("room".into());
    b.changes = Some(Changes {
        top: 3,
        max_len: 100,
    });
    b
}

/// Every key of the instances of `scope` (both windows), change streams aside.
async fn instance_keys(store: &Store, scope: &str) -> BTreeSet<String> {
    keys_matching(store, &under(&instance("tips", Some(scope)), "*"))
        .await
        .into_iter()
        .collect()
}

/// The time to live of `key` in ms (-2: no such key, -1: none).
async fn pttl(store: &Store, key: &str) -> i64 {
    store.client().pttl(key).await.expect("PTTL")
}

/// Whether `scope` is in the board's scope registry.
async fn registered(store: &Store, scope: &str) -> bool {
    let score: Option<f64> = store
        .client()
        .zscore(store.keys().scopes("tips"), scope)
        .await
        .expect("ZSCORE");
    score.is_some()
}

/// The total of `member` in the instance `scope` of `view` at `now`.
async fn total(store: &Store, view: &View<'_>, scope: &str, member: &str, now: i64) -> Option<i64> {
    total_in(store, view, Some(scope), member, now).await
}

#[tokio::test]
async fn a_scope_empty_in_every_window_is_cleaned_up_in_each_and_leaves_the_registry() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let b = tips();
    let now = (NOW / HOUR) * HOUR + HOUR / 2;
    apply_events_in(
        &store,
        &b,
        "r1",
        &[ev("1", now, "ann", 7), ev("2", now - HOUR, "bob", 3)],
        now,
    )
    .await;
    // r2 takes an event later: still in the 6h window when r1 has left both.
    let later = now + 5 * HOUR;
    apply_events_in(&store, &b, "r2", &[ev("3", later, "cy", 4)], later).await;
    let held = instance_keys(&store, "r1").await;
    for key in [
        instance("tips", Some("r1")).result(),
        instance("tips", Some("r1")).seen_table(),
        instance_in("tips", Some("r1"), "2h").result(),
        instance_in("tips", Some("r1"), "2h").members(),
    ] {
        assert!(held.contains(&key), "{key}: {held:?}");
    }
    for feed in [
        schema().changes("tips", Some("r1"), None),
        schema().changes("tips", Some("r1"), Some("2h")),
    ] {
        assert_eq!(pttl(&store, &feed).await, -1, "{feed} is written, for good");
    }

    // Past the 6h window of r1's newest event: both windows of r1 empty.
    let end = now + 7 * HOUR;
    let report = roll_board(&store, &b, end).await;
    assert_eq!(report.scopes_removed, 1, "{report:?}");
    assert!(!registered(&store, "r1").await, "r1 left the registry");
    assert_eq!(
        instance_keys(&store, "r1").await,
        BTreeSet::from([
            instance("tips", Some("r1")).meta(),
            instance_in("tips", Some("r1"), "2h").meta()
        ]),
        "only each window's meta stays"
    );
    for feed in [
        schema().changes("tips", Some("r1"), None),
        schema().changes("tips", Some("r1"), Some("2h")),
    ] {
        let ttl = pttl(&store, &feed).await;
        assert!(
            ttl > 0 && ttl <= rollboard::store::CHANGES_RETAIN_MS,
            "{feed} stays for its readers a while: {ttl}"
        );
    }
    // The report and the window gauges follow the widest window.
    let wide = b.view(Some("6h")).expect("6h");
    let (from, to) = wide.live_range(end, report.expired_through);
    assert_eq!(
        (report.window_from, report.window_to),
        (Some(from), Some(to))
    );
    assert_eq!(from, end / HOUR * HOUR - 5 * HOUR);

    // r2 left only the 2h window: cleaned up there, still registered, exact in the 6h one.
    assert!(registered(&store, "r2").await);
    let r2 = instance_keys(&store, "r2").await;
    assert_eq!(
        r2.iter()
            .filter(|k| k.contains(":w:2h:"))
            .collect::<Vec<_>>(),
        [&instance_in("tips", Some("r2"), "2h").meta()],
        "{r2:?}"
    );
    assert_eq!(total(&store, &wide, "r2", "cy", end).await, Some(4));
    // A copy of r1's events is late in every window: nothing comes back.
    let out = apply_events_in(&store, &b, "r1", &[ev("1", now, "ann", 7)], end).await;
    assert_eq!(out, vec![Outcome::Late]);
    assert_eq!(instance_keys(&store, "r1").await.len(), 2);
}

#[tokio::test]
async fn a_scope_empty_only_in_the_narrower_window_stays_and_answers_in_each() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let b = tips();
    let (short, wide) = (
        b.view(Some("2h")).expect("2h"),
        b.view(Some("6h")).expect("6h"),
    );
    let now = (NOW / HOUR) * HOUR + HOUR / 2;
    apply_events_in(
        &store,
        &b,
        "r1",
        &[
            ev("1", now, "ann", 7),
            ev("2", now - HOUR, "bob", 3),
            ev("3", now - 4 * HOUR, "bob", 10),
        ],
        now,
    )
    .await;
    assert_eq!(total(&store, &short, "r1", "bob", now).await, Some(3));

    // Three hours on, nothing of r1 is in the last 2 hours; all of it but the oldest is in
    // the last 6.
    let later = now + 3 * HOUR;
    let report = roll_board(&store, &b, later).await;
    assert_eq!(report.scopes_removed, 0);
    assert!(registered(&store, "r1").await, "r1 stays registered");
    let keys = instance_keys(&store, "r1").await;
    let narrow: Vec<&String> = keys.iter().filter(|k| k.contains(":w:2h:")).collect();
    assert_eq!(
        narrow,
        [&instance_in("tips", Some("r1"), "2h").meta()],
        "{keys:?}"
    );
    for key in [
        instance("tips", Some("r1")).result(),
        instance("tips", Some("r1")).members(),
        instance("tips", Some("r1")).seen_table(),
    ] {
        assert!(keys.contains(&key), "{key}: {keys:?}");
    }
    let ttl = pttl(&store, &schema().changes("tips", Some("r1"), Some("2h"))).await;
    assert!(ttl > 0, "the 2h feed stays a while: {ttl}");
    assert_eq!(
        pttl(&store, &schema().changes("tips", Some("r1"), None)).await,
        -1
    );

    // The 2h window answers empty, the 6h window exactly.
    let page = store
        .top(&short, Some("r1"), 0, 10, later)
        .await
        .expect("top 2h");
    assert_eq!(
        (page.envelope.count, page.entries.len()),
        (0, 0),
        "{page:?}"
    );
    assert_eq!(total(&store, &short, "r1", "ann", later).await, None);
    let page = store
        .top(&wide, Some("r1"), 0, 10, later)
        .await
        .expect("top 6h");
    let ranked: Vec<(&str, i64)> = page
        .entries
        .iter()
        .map(|e| (e.member.as_str(), e.total))
        .collect();
    assert_eq!(ranked, [("ann", 7), ("bob", 3)]);
    for view in [&short, &wide] {
        let v = rollboard::roll::verify(&store, view, Some("r1"), 100)
            .await
            .expect("verify");
        assert!(v.differences.is_empty(), "{v:?}");
    }

    // The narrower window takes events again; ids stay remembered by the widest.
    let out = apply_events_in(
        &store,
        &b,
        "r1",
        &[ev("4", later, "bob", 5), ev("1", now, "ann", 7)],
        later,
    )
    .await;
    assert_eq!(out, vec![Outcome::Applied, Outcome::Duplicate]);
    assert_eq!(total(&store, &short, "r1", "bob", later).await, Some(5));
    assert_eq!(total(&store, &short, "r1", "ann", later).await, None);
    assert_eq!(total(&store, &wide, "r1", "bob", later).await, Some(8));
    assert_eq!(total(&store, &wide, "r1", "ann", later).await, Some(7));
}
