//! The edges of a board with several windows: a total at the limit in a narrower window
//! only, an event live in the widest window only, a duplicate whichever windows its first
//! copy counted in, a batch retried after a lost reply, a key of the wrong type in a
//! narrower window, and a refund to exactly 0 in one window.

use std::collections::BTreeMap;

use fred::prelude::*;
use rollboard::domain::board::{Board, Changes, MAX_TOTAL};
use rollboard::store::{ApplyEvent, Outcome, Store};

use super::every_window_matches_the_model::{assert_window, windowed, Windows};
use crate::support::asserts::assert_verified;
use crate::support::boards::{
    apply_events, board, count_at, dump, ev, keys_matching, remembers, roll_board, seen_table,
    set_string, total_at, with_fresh_store, HOUR, T0,
};
use crate::support::events::cycled_events;
use crate::support::feed::{changes_after, replay};
use crate::support::keys::{instance_in, schema, under};
use crate::support::proxy::Proxy;
use crate::support::redis::{function_name, RedisServer};

/// Half past the hour of [`T0`]: `now - k * HOUR` is in the k-th slice before now's.
fn now0() -> i64 {
    T0 / HOUR * HOUR + HOUR / 2
}

/// Every key of board `name`'s unscoped instance in every window, and its change streams,
/// with their DUMP: to prove a call wrote nothing.
async fn every_key(store: &Store, name: &str) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let [unscoped, ..] = schema().board_patterns(name);
    for pattern in [unscoped, format!("{}*", schema().changes(name, None, None))] {
        for key in keys_matching(store, &pattern).await {
            let bytes = dump(store, &key).await;
            out.insert(key, bytes);
        }
    }
    out
}

/// The keys whose DUMP differs between `before` and `after` (or that exist in one only).
fn changed(before: &BTreeMap<String, Vec<u8>>, after: &BTreeMap<String, Vec<u8>>) -> Vec<String> {
    before
        .keys()
        .chain(after.keys())
        .filter(|k| before.get(*k) != after.get(*k))
        .cloned()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// Applies `events` at `now` to the store and the model: the outcomes must be `expected`
/// and agree with the model's.
async fn apply_both(
    store: &Store,
    b: &Board,
    model: &mut Windows,
    events: &[ApplyEvent],
    now: i64,
    expected: &[Outcome],
) {
    assert_eq!(model.apply_all(events, now), expected, "the model");
    assert_eq!(apply_events(store, b, events, now).await, expected);
}

/// Every window of `b` equals the model.
async fn assert_windows(store: &Store, model: &Windows, now: i64) {
    for (view, window) in model.views().iter().zip(&model.windows) {
        assert_window(store, view, None, window, now).await;
    }
}

/// Every window of `b` equals the model, and `verify` finds nothing wrong in any of them.
async fn assert_windows_verified(store: &Store, model: &Windows, now: i64) {
    assert_windows(store, model, now).await;
    for view in &model.views() {
        assert_verified(store, view, None).await;
    }
}

/// A 2h window at exactly 2^53 - 1 while the 6h window, holding a refund older than 2h,
/// is below it: one more unit there is an overflow in every window, writes nothing and is
/// not remembered; once the 2h window has let go of its older slice the same event counts.
#[tokio::test]
async fn a_total_past_the_limit_in_the_narrow_window_only_is_an_overflow_everywhere() {
    use Outcome::*;
    let (_redis, store, mut b) = with_fresh_store(windowed("limit", &[2, 6])).await;
    b.allow_negative = true;
    let (narrow, wide) = (b.view(Some("2h")).unwrap(), b.view(Some("6h")).unwrap());
    let mut model = Windows::new(&b);
    let now = now0();
    let s = b.slice_of(now);
    let setup = [
        ev("refund", now - 4 * HOUR, "m", -10),
        ev("big", now - HOUR, "m", MAX_TOTAL - 5),
        ev("top", now, "m", 5),
    ];
    apply_both(&store, &b, &mut model, &setup, now, &[Applied; 3]).await;
    assert_eq!(total_at(&store, &narrow, "m", now).await, Some(MAX_TOTAL));
    assert_eq!(
        total_at(&store, &wide, "m", now).await,
        Some(MAX_TOTAL - 10)
    );

    let before = every_key(&store, "limit").await;
    let over = [ev("over", now, "m", 1)];
    apply_both(&store, &b, &mut model, &over, now, &[Overflow]).await;
    assert_eq!(changed(&before, &every_key(&store, "limit").await), [""; 0]);
    assert!(!remembers(&store, &b, None, "over", s).await);
    assert!(remembers(&store, &b, None, "top", s).await);

    // Live in the 6h window only, a unit more there is no overflow.
    let wide_only = [ev("wide", now - 4 * HOUR, "m", 1)];
    apply_both(&store, &b, &mut model, &wide_only, now, &[Applied]).await;
    assert_eq!(total_at(&store, &narrow, "m", now).await, Some(MAX_TOTAL));
    assert_eq!(total_at(&store, &wide, "m", now).await, Some(MAX_TOTAL - 9));
    assert_windows(&store, &model, now).await;

    // An hour on, `big`'s slice left the 2h window: `over`, never remembered, counts now.
    let later = now + HOUR;
    roll_board(&store, &b, later).await;
    model.roll_all(later);
    assert_eq!(total_at(&store, &narrow, "m", later).await, Some(5));
    apply_both(&store, &b, &mut model, &over, later, &[Applied]).await;
    assert_eq!(total_at(&store, &narrow, "m", later).await, Some(6));
    assert_eq!(
        total_at(&store, &wide, "m", later).await,
        Some(MAX_TOTAL - 8)
    );
    assert_windows_verified(&store, &model, later).await;
}

/// An event older than the 2h window but inside the 6h one counts in the 6h window and
/// writes no key of the 2h window; one older than 6h is late and writes nothing at all.
#[tokio::test]
async fn an_event_live_only_in_the_wide_window_leaves_the_narrow_untouched() {
    use Outcome::*;
    let (redis, store, b) = with_fresh_store(windowed("wideonly", &[6, 2])).await;
    let (narrow, wide) = (b.view(Some("2h")).unwrap(), b.view(Some("6h")).unwrap());
    assert_eq!(
        b.view(None),
        Some(wide.clone()),
        "the first listed is the default"
    );
    let mut model = Windows::new(&b);
    let now = now0();
    let first = [ev("1", now, "ann", 2)];
    apply_both(&store, &b, &mut model, &first, now, &[Applied]).await;
    let narrow_keys = || async {
        let mut all = every_key(&store, "wideonly").await;
        all.retain(|k, _| k.starts_with(&under(&instance_in("wideonly", None, "2h"), "")));
        all
    };
    let before = narrow_keys().await;
    assert!(
        before.contains_key(&instance_in("wideonly", None, "2h").result()),
        "{before:?}"
    );

    let old = now - 3 * HOUR;
    let second = [ev("2", old, "bob", 9)];
    apply_both(&store, &b, &mut model, &second, now, &[Applied]).await;
    assert_eq!(narrow_keys().await, before, "the 2h window was written");
    let slice = instance_in("wideonly", None, "2h").slice(b.slice_of(old));
    assert_eq!(redis.cli(&["EXISTS", &slice]).trim(), "0");
    assert_eq!(total_at(&store, &wide, "bob", now).await, Some(9));
    assert_eq!(total_at(&store, &narrow, "bob", now).await, None);
    assert_eq!(count_at(&store, &narrow, None, now).await, 1);
    assert_eq!(count_at(&store, &wide, None, now).await, 2);

    let everything = every_key(&store, "wideonly").await;
    let late = [ev("3", now - 7 * HOUR, "cat", 4)];
    apply_both(&store, &b, &mut model, &late, now, &[Late]).await;
    assert_eq!(
        changed(&everything, &every_key(&store, "wideonly").await),
        [""; 0]
    );
    assert!(!remembers(&store, &b, None, "3", b.slice_of(now - 7 * HOUR)).await);
    assert_windows(&store, &model, now).await;
}

/// The widest window remembers every id: a copy is a duplicate whether its first copy
/// counted in both windows or in the wide one only, in the same call as a new event, and
/// after the narrow window has let go of the first copy.
#[tokio::test]
async fn a_duplicate_is_one_whichever_windows_its_first_copy_counted_in() {
    use Outcome::*;
    let (_redis, store, b) = with_fresh_store(windowed("dups", &[2, 6])).await;
    let (narrow, wide) = (b.view(Some("2h")).unwrap(), b.view(Some("6h")).unwrap());
    let mut model = Windows::new(&b);
    let now = now0();
    let first = [ev("both", now, "m", 5), ev("wide", now - 3 * HOUR, "m", 7)];
    apply_both(&store, &b, &mut model, &first, now, &[Applied; 2]).await;
    let again = [
        ev("both", now, "m", 5),
        ev("new", now, "n", 1),
        ev("wide", now - 3 * HOUR, "m", 7),
        ev("new", now, "n", 1),
    ];
    let expected = [Duplicate, Applied, Duplicate, Duplicate];
    apply_both(&store, &b, &mut model, &again, now, &expected).await;
    assert_eq!(total_at(&store, &narrow, "m", now).await, Some(5));
    assert_eq!(total_at(&store, &wide, "m", now).await, Some(12));
    assert_eq!(total_at(&store, &narrow, "n", now).await, Some(1));
    assert_windows(&store, &model, now).await;

    // Two hours on, the 2h window holds nothing; the 6h window still remembers both ids.
    let later = now + 2 * HOUR;
    roll_board(&store, &b, later).await;
    model.roll_all(later);
    assert_eq!(count_at(&store, &narrow, None, later).await, 0);
    let copies = [ev("both", now, "m", 5), ev("wide", now - 3 * HOUR, "m", 7)];
    apply_both(&store, &b, &mut model, &copies, later, &[Duplicate; 2]).await;
    assert_eq!(count_at(&store, &narrow, None, later).await, 0);
    assert_eq!(total_at(&store, &wide, "m", later).await, Some(12));
    assert_windows(&store, &model, later).await;
}

/// A batch of several fold calls whose first call ran but whose reply was lost: the batch
/// sent again counts every event once in every window (the first call's events are
/// duplicates), and a third time changes nothing.
#[tokio::test]
async fn a_batch_retried_after_a_lost_reply_counts_once_in_every_window() {
    use Outcome::*;
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.port).await;
    // The warming apply a `fold` call too (the worker would judge it, loading nothing).
    let store = proxy.store().await.with_transactions(false);
    let mut b = windowed("retry", &[1, 3, 6]);
    b.changes = Some(Changes {
        top: 3,
        max_len: 1000,
    });
    let mut model = Windows::new(&b);
    let now = now0();
    // The library loaded, so that the first apply call of the batch is the one cut.
    let warm = board("warm", HOUR, 1);
    apply_events(&store, &warm, &[ev("w", now, "m", 1)], now).await;
    let events = cycled_events("e", 40, now, HOUR, 5);
    // The events as the calls take them (member by member), and the first call's share.
    let order = rollboard::store::apply_order(&events);
    let taken: Vec<ApplyEvent> = order.iter().map(|&i| events[i].clone()).collect();
    let first = rollboard::store::fold_chunk_len(&b, &taken);
    assert!(first < events.len(), "one batch of several fold calls");
    proxy.cut_at(&function_name("fold"), 1, 1);
    let failed = store.apply(&b, None, &events, now).await;
    assert!(!proxy.armed(), "the cut never happened: {failed:?}");
    assert!(failed.is_err(), "{failed:?}");
    // The calls chained after the cut one may or may not have run; the batch sent again
    // counts each event that had not, and every event ends up counted once.
    let retried = store.apply(&b, None, &events, now).await.expect("retry");
    assert!(
        order[..first].iter().all(|&i| retried[i] == Duplicate),
        "the cut call ran: {retried:?}"
    );
    assert!(
        retried.iter().all(|o| matches!(o, Applied | Duplicate)),
        "{retried:?}"
    );
    assert_eq!(model.apply_all(&events, now), vec![Applied; events.len()]);
    assert_windows(&store, &model, now).await;
    apply_both(&store, &b, &mut model, &events, now, &[Duplicate; 40]).await;
    assert_windows(&store, &model, now).await;
    for (view, window) in model.views().iter().zip(&model.windows) {
        let key = store.instance(view, None).changes();
        let (changes, _) = changes_after(&store, &key, None).await;
        let mut replayed = Vec::new();
        replay(&mut replayed, &changes, 3);
        let top: Vec<String> = window
            .ranking(view.board())
            .into_iter()
            .take(3)
            .map(|(m, _, _)| m)
            .collect();
        assert_eq!(replayed, top, "feed of window {}", view.window_name());
        assert_verified(&store, view, None).await;
    }
    let one_hour = model.window(HOUR).ranking(model.views()[0].board());
    assert_eq!(
        one_hour.iter().map(|r| r.1).sum::<i64>(),
        (0..40).filter(|i| i % 5 == 0).map(|i| i + 1).sum::<i64>(),
        "the 1h window holds the events of the current slice, once"
    );
}

/// Every key of the middle (2h) window of a 1h/2h/6h board, replaced in turn by a string:
/// the apply fails naming the key, and writes nothing in any window (not even the widest's
/// digest table); with the key put back, the same events count once. (The dense ZSet
/// fails today: a bug, see [`a_dense_key_of_the_wrong_type_fails_the_call_before_any_write`].)
#[tokio::test]
async fn a_key_of_the_wrong_type_in_a_narrower_window_fails_the_call_before_any_write() {
    use Outcome::*;
    let (_redis, store, mut b) = with_fresh_store(windowed("typed", &[1, 2, 6])).await;
    b.allow_negative = true;
    b.dense_rank = true;
    b.changes = Some(Changes {
        top: 3,
        max_len: 1000,
    });
    let middle = b.view(Some("2h")).unwrap();
    let now = now0();
    let s = b.slice_of(now);
    let k = store.instance(&middle, None);
    let keys = [
        ("meta", k.meta()),
        ("result", k.result()),
        ("members", k.members()),
        ("slices", k.slices()),
        ("refs", k.refs()),
        ("slice", k.slice(s - 1)),
        ("dense", k.dense()),
        ("changes", k.changes()),
    ];
    let mut problems = Vec::new();
    for (what, key) in keys {
        let _: () = store.client().flushall(false).await.expect("flushall");
        let mut model = Windows::new(&b);
        let setup = [ev("first", now, "m", 5), ev("second", now - HOUR, "n", 4)];
        apply_both(&store, &b, &mut model, &setup, now, &[Applied; 2]).await;
        // Moved aside (under the same hash tag) and replaced by a string.
        let aside = format!("{key}:aside");
        let existed: i64 = store.client().exists(&key).await.expect("exists");
        if existed == 1 {
            let _: () = store.client().rename(&key, &aside).await.expect("rename");
        }
        set_string(&store, &key, "not-the-right-type").await;
        let table = seen_table(&store, &b.widest(), None).await;
        let before = every_key(&store, "typed").await;
        let events = [
            ev("e1", now, "m", 3),
            ev("e2", now - HOUR, "n", -4),
            ev("e3", now - 4 * HOUR, "k", 2),
            ev("e4", now - 7 * HOUR, "k", 1),
        ];
        match store.apply(&b, None, &events, now).await {
            Ok(outcomes) => problems.push(format!("{what}: the apply answered {outcomes:?}")),
            Err(e) => {
                let text = e.to_string();
                if !text.contains("WRONGTYPE") && !text.contains(&key) {
                    problems.push(format!("{what}: an unclear error: {text}"));
                }
            }
        }
        let wrote = changed(&before, &every_key(&store, "typed").await);
        if !wrote.is_empty() {
            problems.push(format!("{what}: the failed call wrote {wrote:?}"));
        }
        if seen_table(&store, &b.widest(), None).await != table {
            problems.push(format!("{what}: the failed call remembered ids"));
        }
        // Put right, the same events count once.
        let _: i64 = store.client().del(&key).await.expect("del");
        if existed == 1 {
            let _: () = store.client().rename(&aside, &key).await.expect("rename");
        }
        let expected = [Applied, Applied, Applied, Late];
        assert_eq!(model.apply_all(&events, now), expected);
        let got = apply_events(&store, &b, &events, now).await;
        if got != expected {
            problems.push(format!("{what}: once put right the apply answered {got:?}"));
            continue;
        }
        apply_both(
            &store,
            &b,
            &mut model,
            &events,
            now,
            &[Duplicate, Duplicate, Duplicate, Late],
        )
        .await;
        assert_windows_verified(&store, &model, now).await;
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A refund that takes a member to exactly 0 in the 2h window takes it off that ranking
/// (and that window's feed) while the 6h window, holding an older tip, still ranks it.
#[tokio::test]
async fn a_refund_to_zero_in_one_window_leaves_the_member_ranked_in_the_other() {
    use Outcome::*;
    let (_redis, store, mut b) = with_fresh_store(windowed("zero", &[2, 6])).await;
    b.allow_negative = true;
    b.dense_rank = true;
    b.changes = Some(Changes {
        top: 3,
        max_len: 1000,
    });
    let (narrow, wide) = (b.view(Some("2h")).unwrap(), b.view(Some("6h")).unwrap());
    let mut model = Windows::new(&b);
    let now = now0();
    let events = [
        ev("old", now - 4 * HOUR, "m", 5),
        ev("tip", now - 10, "m", 3),
        ev("other", now - 5, "n", 1),
    ];
    apply_both(&store, &b, &mut model, &events, now, &[Applied; 3]).await;
    assert_eq!(total_at(&store, &narrow, "m", now).await, Some(3));
    let refund = [ev("refund", now, "m", -3)];
    apply_both(&store, &b, &mut model, &refund, now, &[Applied]).await;

    let r = store.rank(&narrow, None, "m", now).await.unwrap();
    assert_eq!((r.rank, r.total, r.envelope.count), (None, None, 1));
    let r = store.rank(&wide, None, "m", now).await.unwrap();
    assert_eq!((r.rank, r.total, r.envelope.count), (Some(1), Some(5), 2));
    assert_eq!(r.dense_rank, Some(Some(1)));
    let n = store.rank(&narrow, None, "n", now).await.unwrap();
    assert_eq!((n.rank, n.dense_rank), (Some(1), Some(Some(1))));
    for (view, top) in [(&narrow, vec!["n"]), (&wide, vec!["m", "n"])] {
        let key = store.instance(view, None).changes();
        let (changes, _) = changes_after(&store, &key, None).await;
        let mut replayed = Vec::new();
        replay(&mut replayed, &changes, 3);
        assert_eq!(replayed, top, "feed of window {}", view.window_name());
    }
    assert_windows_verified(&store, &model, now).await;
}

/// The distinct totals of a `dense_rank` board's widest window (and of a board with one
/// window, written by fold.lua) replaced by a string: the apply fails and writes nothing,
/// as with any other key of the instance.
#[tokio::test]
async fn a_dense_key_of_the_wrong_type_fails_the_call_before_any_write() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let now = now0();
    let mut problems = Vec::new();
    for (name, several) in [("one", false), ("several", true)] {
        let mut b = if several {
            windowed(name, &[1, 6])
        } else {
            board(name, HOUR, 6)
        };
        b.dense_rank = true;
        apply_events(&store, &b, &[ev("a", now, "m", 1)], now).await;
        let key = store.instance(&b.widest(), None).dense();
        let _: i64 = store.client().del(&key).await.expect("del");
        set_string(&store, &key, "not-a-zset").await;
        let before = every_key(&store, name).await;
        let events = [ev("b", now, "n", 2)];
        let failed = store.apply(&b, None, &events, now).await;
        let wrote = changed(&before, &every_key(&store, name).await);
        if failed.is_ok() || !wrote.is_empty() {
            problems.push(format!("{name}: {failed:?}, wrote {wrote:?}"));
        }
        // Put right (the ZSet rebuilt by hand), the event counts once.
        let _: i64 = store.client().del(&key).await.expect("del");
        let _: i64 = store
            .client()
            .zadd(&key, None, None, false, false, (1.0, "1"))
            .await
            .expect("zadd");
        let got = apply_events(&store, &b, &events, now).await;
        if got != [Outcome::Applied] {
            problems.push(format!("{name}: once put right the apply answered {got:?}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
