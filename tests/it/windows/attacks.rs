//! Attacks on a board with several windows: a narrower window whose roll fails while the
//! widest empties, a roll that stopped after the narrower window at a forced later time,
//! two rollers at once, answers for a member or a scope held nowhere, a window named by an
//! equal duration, a short `dedup_window`, and a key of the wrong type in the narrower
//! window for a query and a roll.

use fred::prelude::*;
use rollboard::domain::board::{Board, Changes, View, Window};
use rollboard::store::Outcome;

use crate::support::asserts::{assert_verified, total_in};
use crate::support::boards::{
    apply_events, apply_events_in, board, ev, keys_matching, registered, roll_board, run_jobs,
    set_string, with_fresh_store, HOUR, T0,
};
use crate::support::keys::{instance, instance_in, under};
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

/// The 2h and 6h windows of a board of [`two_windows`].
fn windows_of(b: &Board) -> (View<'_>, View<'_>) {
    let view = |width| b.view(Some(width)).expect("a window of the board");
    (view("2h"), view("6h"))
}

/// A scope whose narrower window fails to roll (its change stream is of the wrong type)
/// while its widest window empties stays registered: the next roll, the fault gone,
/// expires the narrower window too, which must not keep its old totals for ever.
#[tokio::test]
async fn a_narrow_window_that_failed_to_roll_keeps_its_scope_registered() {
    let (_redis, store, b) = with_fresh_store(scoped_feed("tips")).await;
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
    let report = run_jobs(&store, std::slice::from_ref(&b), later, 10)
        .await
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

/// A roll forced ahead (`roll --at` three hours past the clock) that stopped after the
/// narrower window: applies are then judged at that time, so the widest window refuses an
/// event as late; the next roll, at the clock's time, catches the widest window up to the
/// forced one, so that it no longer counts an older event than one it refused.
#[tokio::test]
async fn a_forced_roll_stopped_after_the_narrow_window_is_finished_by_the_next() {
    use Outcome::*;
    let (_redis, store, b) = with_fresh_store(two_windows("tips")).await;
    let (narrow, wide) = windows_of(&b);
    let now = now0();
    let out = apply_events(
        &store,
        &b,
        &[
            ev("old", now - 5 * HOUR, "ann", 100),
            ev("new", now, "ann", 7),
        ],
        now,
    )
    .await;
    assert_eq!(out, [Applied, Applied]);

    // `roll --at now+3h` rolls the 2h window, and stops.
    let at = now + 3 * HOUR;
    let target = b.slice_of(at) - narrow.slices_in_window();
    store
        .raise_board_watermark(&narrow, target, at)
        .await
        .expect("floor");
    let mut part = rollboard::roll::Report::default();
    rollboard::roll::InstanceRoll {
        store: &store,
        view: &narrow,
        scope: None,
        now: at,
        chunk: 10,
        cancel: &tokio_util::sync::CancellationToken::new(),
    }
    .roll(target, &mut part)
    .await
    .expect("roll the 2h window");
    assert_eq!(total_in(&store, &narrow, None, "ann", now).await, None);

    // Judged at the forced time, an event four hours old is late in the 6h window.
    let out = apply_events(&store, &b, &[ev("mid", now - 4 * HOUR, "bob", 5)], now).await;
    assert_eq!(out, [Late]);

    // The next roll, at the clock's time, finishes the forced one: the 6h window lets go
    // of `old`, five hours old, as it did of `mid`.
    roll_board(&store, &b, now).await;
    assert_eq!(total_in(&store, &wide, None, "ann", now).await, Some(7));
    for view in b.views() {
        assert_verified(&store, &view, None).await;
    }
}

/// Two rollers at once over a board with two windows (scoped and not), in small chunks:
/// each window's slices are expired once, every total exact.
#[tokio::test]
async fn two_rollers_at_once_expire_every_window_once() {
    let (_redis, store, plain) = with_fresh_store(two_windows("plain")).await;
    let rooms = scoped_feed("rooms");
    let now = now0();
    let mut events = Vec::new();
    for i in 0..60i64 {
        let back = (i % 7) * HOUR;
        events.push(ev(
            &format!("e{i}"),
            now - back,
            &format!("m{}", i % 13),
            i + 1,
        ));
    }
    apply_events(&store, &plain, &events, now).await;
    for room in ["r1", "r2", "r3"] {
        apply_events_in(&store, &rooms, room, &events, now).await;
    }
    // What each window holds an hour and a half later: the events of its live slices.
    let later = now + 3 * HOUR / 2;
    let expected = |view: &View<'_>, member: &str| -> Option<i64> {
        let w = view.watermark_at(later, None);
        let sum: i64 = events
            .iter()
            .filter(|e| e.member == member && view.board().slice_of(e.ts) > w)
            .filter(|e| view.board().slice_of(e.ts) > plain.widest().watermark_at(now, None))
            .map(|e| e.amount)
            .sum();
        (sum > 0).then_some(sum)
    };
    let boards = [plain.clone(), rooms.clone()];
    let cancel = tokio_util::sync::CancellationToken::new();
    let roll = || {
        rollboard::roll::run_once(
            &store,
            &boards,
            rollboard::roll::Job::All,
            None,
            later,
            2,
            &cancel,
        )
    };
    let (a, b) = tokio::join!(roll(), roll());
    for report in a.expect("roll").into_iter().chain(b.expect("roll")) {
        assert_eq!(report.instances_failed, 0, "{report:?}");
    }
    for view in plain.views() {
        for m in 0..13 {
            let member = format!("m{m}");
            assert_eq!(
                total_in(&store, &view, None, &member, later).await,
                expected(&view, &member),
                "{member} in {}",
                view.window_name()
            );
        }
        assert_verified(&store, &view, None).await;
    }
    for view in rooms.views() {
        for room in ["r1", "r2", "r3"] {
            for m in 0..13 {
                let member = format!("m{m}");
                assert_eq!(
                    total_in(&store, &view, Some(room), &member, later).await,
                    expected(&view, &member),
                    "{member} in {room} {}",
                    view.window_name()
                );
            }
            assert_verified(&store, &view, Some(room)).await;
        }
    }
}

/// `all_windows` for a member ranked in no window, and for a scope never written: every
/// window named as configured (the widest listed first here), each unranked.
#[tokio::test]
async fn all_windows_of_a_member_or_scope_held_nowhere_is_unranked_in_each() {
    let (_redis, store, mut b) = with_fresh_store(scoped_feed("tips")).await;
    b.windows.reverse();
    let now = now0();
    apply_events_in(&store, &b, "r1", &[ev("1", now, "ann", 7)], now).await;
    for (scope, member) in [("r1", "bob"), ("nowhere", "ann")] {
        let got = store
            .rank_in_windows(&b, Some(scope), member, now)
            .await
            .expect("rank in windows");
        let names: Vec<&str> = got.windows.iter().map(|w| w.window.as_str()).collect();
        assert_eq!(names, ["6h", "2h"], "{scope}");
        for w in &got.windows {
            assert_eq!(
                (w.rank, w.total, w.percentile),
                (None, None, None),
                "{scope} {member} {}",
                w.window
            );
            assert_eq!(w.count, u64::from(scope == "r1"), "{scope} {}", w.window);
        }
    }
    let got = store
        .rank_in_windows(&b, Some("r1"), "ann", now)
        .await
        .expect("rank in windows");
    let totals: Vec<Option<i64>> = got.windows.iter().map(|w| w.total).collect();
    assert_eq!(totals, [Some(7), Some(7)]);
}

/// A window named by an equal duration (`1440m` for `24h`, `1d`) reads that window and
/// answers with its name as configured; its keys carry its width in its largest unit.
#[tokio::test]
async fn a_window_named_by_an_equal_duration_reads_that_window() {
    let (_redis, store, mut b) = with_fresh_store(board("days", HOUR, 7 * 24)).await;
    b.windows = vec![
        Window {
            name: "7d".into(),
            ms: 7 * 24 * HOUR,
        },
        Window {
            name: "24h".into(),
            ms: 24 * HOUR,
        },
    ];
    let now = now0();
    apply_events(
        &store,
        &b,
        &[ev("a", now, "ann", 3), ev("b", now - 30 * HOUR, "ann", 4)],
        now,
    )
    .await;
    for name in ["24h", "1d", "1440m", "86400s"] {
        let view = rollboard::edges::windows::view(&b, Some(name), "window").expect(name);
        let page = store.top(&view, None, 0, 10, now).await.expect("top");
        assert_eq!(page.envelope.window, "24h", "{name}");
        assert_eq!(page.entries[0].total, 3, "{name}");
    }
    let first = rollboard::edges::windows::view(&b, None, "window").expect("first");
    assert_eq!(first.window_name(), "7d");
    assert_eq!(total_in(&store, &first, None, "ann", now).await, Some(7));
    let keys = keys_matching(&store, &under(&instance("days", None), "w:*")).await;
    assert!(
        !keys.is_empty()
            && keys
                .iter()
                .all(|k| k.starts_with(&under(&instance_in("days", None, "1d"), ""))),
        "{keys:?}"
    );
    for bad in ["25h", "1w", "7 d", ""] {
        assert!(
            rollboard::edges::windows::view(&b, Some(bad), "window").is_err(),
            "{bad}"
        );
    }
}

/// `dedup_window = "1h"` on a board with two windows: an event whose ids may be forgotten
/// is late in every window (never counted again), also while its slice is live in both;
/// one whose ids are kept is a duplicate after a roll.
#[tokio::test]
async fn a_short_dedup_window_never_counts_a_copy_twice_in_any_window() {
    use Outcome::*;
    let (_redis, store, mut b) = with_fresh_store(two_windows("short")).await;
    b.dedup = rollboard::domain::board::Dedup::AfterSlice(HOUR);
    let (narrow, wide) = windows_of(&b);
    let now = now0();
    let events = [
        ev("kept", now - HOUR, "ann", 5),
        ev("gone", now - 2 * HOUR, "ann", 100),
        ev("new", now, "bob", 3),
    ];
    assert_eq!(
        apply_events(&store, &b, &events, now).await,
        [Applied, Late, Applied]
    );
    for view in [&narrow, &wide] {
        assert_eq!(total_in(&store, view, None, "ann", now).await, Some(5));
    }
    // Half an hour on, `kept`'s ids may be forgotten: a copy is late, in both windows.
    let later = now + HOUR / 2;
    roll_board(&store, &b, later).await;
    assert_eq!(
        apply_events(&store, &b, &events, later).await,
        [Late, Late, Duplicate]
    );
    // (`kept`'s slice has left the 2h window meanwhile.)
    assert_eq!(total_in(&store, &narrow, None, "ann", later).await, None);
    assert_eq!(total_in(&store, &wide, None, "ann", later).await, Some(5));
    for view in [&narrow, &wide] {
        assert_eq!(total_in(&store, view, None, "bob", later).await, Some(3));
        assert_verified(&store, view, None).await;
    }
}

/// A key of the wrong type in the narrower window: a query of that window fails (the
/// other answers), and a roll counts the instance failed there while it rolls the widest.
#[tokio::test]
async fn a_narrow_key_of_the_wrong_type_fails_its_query_and_roll_only() {
    let (_redis, store, b) = with_fresh_store(two_windows("bad")).await;
    let (narrow, wide) = windows_of(&b);
    let now = now0();
    apply_events(
        &store,
        &b,
        &[ev("a", now - 4 * HOUR, "ann", 5), ev("b", now, "ann", 1)],
        now,
    )
    .await;
    let k = store.instance(&narrow, None);
    let _: () = store.client().del(k.result()).await.expect("DEL");
    set_string(&store, &k.result(), "oops").await;
    assert!(store.rank(&narrow, None, "ann", now).await.is_err());
    assert_eq!(total_in(&store, &wide, None, "ann", now).await, Some(6));

    let later = now + 3 * HOUR;
    let report = run_jobs(&store, std::slice::from_ref(&b), later, 10)
        .await
        .remove(0);
    assert_eq!(report.instances_failed, 1, "{report:?}");
    assert_eq!(total_in(&store, &wide, None, "ann", later).await, Some(1));
    assert_verified(&store, &wide, None).await;
}
