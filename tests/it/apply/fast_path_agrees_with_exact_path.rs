//! The pre-aggregated fast path (`fold.lua`, taken by `Store::apply`) against the event by
//! event path (`fold.lua` judging each event on its own): for any sequence of batches —
//! repeated ids within and across calls, late events, refunds, totals driven past 2^53 - 1,
//! every board shape — both give the same outcomes and leave the same data, down to the
//! idempotency entries.

use std::collections::BTreeMap;

use fred::prelude::*;
use proptest::prelude::*;
use rollboard::domain::board::{Board, Changes, Mode, TieBreak, Window, MAX_TOTAL};
use rollboard::domain::ranking::{decode_member, encode_member};
use rollboard::store::{apply_call, ApplyEvent, Outcome, Store, APPLY_CHUNK};

use crate::support::boards::{
    apply_events, ev, set_string, snapshot, total_at, variants, with_fresh_store,
};
use crate::support::events::cycled_events;
use crate::support::instances::{assert_same_contents, contents, shaped, shaped_and_twin, twin};
use crate::support::proptests::{run_cases_threaded, threaded_runtime_with_store};
use crate::support::redis::{fcall, RedisServer};

const SLICE: i64 = 1_000;
const N: i64 = 4;
const NOW: i64 = 1_000_000;

/// Applies `events` with `fold.lua` judging each event on its own, alone, in calls of
/// [`APPLY_CHUNK`] events.
async fn apply_exact(
    store: &Store,
    board: &Board,
    events: &[ApplyEvent],
    now: i64,
) -> Vec<Outcome> {
    let k = store.instance(&board.widest(), None);
    let mut out = Vec::new();
    for chunk in events.chunks(APPLY_CHUNK) {
        let (keys, args) = apply_call(board, &k, &board.widest().fingerprint(), chunk, now, false);
        let reply: Vec<i64> = fcall(store.client(), "fold", keys, args)
            .await
            .expect("fold.lua, each event on its own");
        out.extend(reply.into_iter().map(|s| match s {
            0 => Outcome::Applied,
            1 => Outcome::Duplicate,
            2 => Outcome::Late,
            3 => Outcome::Overflow,
            other => panic!("status {other}"),
        }));
    }
    out
}

type Batch = (Vec<ApplyEvent>, i64);

/// The `gen` field of the unscoped instance of `board`'s meta hash.
async fn gen_of(store: &rollboard::store::Store, board: &rollboard::domain::board::Board) -> i64 {
    let meta = store.instance(&board.widest(), None).meta();
    store.client().hget(meta, "gen").await.expect("gen")
}

fn batches() -> impl Strategy<Value = (usize, Vec<Batch>)> {
    let amount = prop_oneof![20 => 1i64..9, 4 => -6i64..0, 1 => Just(MAX_TOTAL / 2 + 1)];
    // Ids from a small range repeat within and across calls; slices from late to live.
    let event = (0u32..400, -6_000i64..900, 0usize..40, amount);
    let batch = (prop::collection::vec(event, 1..300), 0i64..2_500);
    (0usize..8, prop::collection::vec(batch, 1..5)).prop_map(|(shape, raw)| {
        let negative = shaped(shape).allow_negative;
        let mut now = NOW;
        let batches = raw
            .into_iter()
            .map(|(events, advance)| {
                now += advance;
                let events = events
                    .into_iter()
                    .map(|(id, offset, member, amount)| {
                        let amount = if negative { amount } else { amount.abs() };
                        ev(
                            &format!("id{id}"),
                            now + offset,
                            &format!("m{member}"),
                            amount,
                        )
                    })
                    .collect();
                (events, now)
            })
            .collect();
        (shape, batches)
    })
}

/// Applies each of `batches` to `board` (the fast path first) and with `fold.lua` judging
/// each event on its own alone to `exact`, its twin; panics at the first event whose outcomes differ.
async fn apply_both_ways(store: &Store, board: &Board, exact: &Board, batches: &[Batch]) {
    for (events, now) in batches {
        let fast = apply_events(store, board, events, *now).await;
        let slow = apply_exact(store, exact, events, *now).await;
        if let Some(i) = (0..events.len()).find(|&i| fast[i] != slow[i]) {
            panic!(
                "{}: event {i} {:?} at {now}: fast path {:?}, fold.lua judging each event {:?}",
                board.name, events[i], fast[i], slow[i]
            );
        }
    }
}

#[test]
fn the_fast_path_agrees_with_the_event_by_event_script() {
    run_cases_threaded(
        "grouped and event-by-event fold.lua agree",
        48,
        &batches(),
        async |store, (shape, batches)| {
            let board = shaped(shape);
            let exact = twin(&board);
            apply_both_ways(store, &board, &exact, &batches).await;
            let (a, b) = (
                contents(store, &board.widest()).await,
                contents(store, &exact.widest()).await,
            );
            for (part, values) in &a {
                assert_eq!(Some(values), b.get(part), "{}: {part}", board.name);
            }
            assert_eq!(a.len(), b.len());
        },
    );
}

/// `board` ranking `count` windows (2 or 3) of its slices: 2 and 4 slices, or 1, 2 and 4
/// (the widest its own window), listed narrowest first; with `extras` a dense_rank board
/// with a change feed of its top 3 where the board is incremental.
fn windowed(board: Board, count: usize, extras: bool) -> Board {
    let mut b = board;
    let widths: &[i64] = if count == 2 { &[2, 4] } else { &[1, 2, 4] };
    b.windows = widths
        .iter()
        .map(|&n| Window {
            name: format!("{}s", n * SLICE / 1000),
            ms: n * SLICE,
        })
        .collect();
    b.window_ms = N * SLICE;
    if extras && b.mode == Mode::Incremental {
        b.dense_rank = true;
        b.changes = Some(Changes {
            top: 3,
            max_len: 1_000,
        });
        b.name = format!("{}-dense-feed", b.name);
    }
    b.name = format!("{}-w{count}", b.name);
    b
}

/// What every window of `board` holds ([`contents`] of each view, by window), with each
/// window's distinct totals and `meta` less what depends on how the events were cut into
/// calls (`gen`, `changed_ms` and the chain token).
async fn every_window(store: &Store, board: &Board) -> BTreeMap<String, Vec<String>> {
    let c = store.client();
    let mut out = BTreeMap::new();
    for view in board.views() {
        let window = view.window_name();
        for (part, values) in contents(store, &view).await {
            out.insert(format!("{window} {part}"), values);
        }
        let k = store.instance(&view, None);
        let dense: Vec<(String, f64)> = c
            .zrange(k.dense(), 0, -1, None, false, None, true)
            .await
            .expect("dense");
        out.insert(
            format!("{window} dense"),
            dense.into_iter().map(|(m, s)| format!("{m}={s}")).collect(),
        );
        let meta: BTreeMap<String, String> = c.hgetall(k.meta()).await.expect("meta");
        out.insert(
            format!("{window} meta"),
            meta.into_iter()
                .filter(|(f, _)| !matches!(f.as_str(), "gen" | "changed_ms" | "chain"))
                .map(|(f, v)| format!("{f}={v}"))
                .collect(),
        );
    }
    out
}

/// As [`the_fast_path_agrees_with_the_event_by_event_script`], on boards ranking two and
/// three windows (with and without distinct totals and a change feed): the same outcomes,
/// and in every window the same data.
#[test]
fn the_fast_path_agrees_with_the_event_by_event_script_in_every_window() {
    let cases = (2usize..4, any::<bool>(), batches());
    run_cases_threaded(
        "grouped and event-by-event fold.lua agree in every window",
        32,
        &cases,
        async |store, (count, extras, (shape, batches))| {
            let board = windowed(shaped(shape), count, extras);
            let exact = twin(&board);
            apply_both_ways(store, &board, &exact, &batches).await;
            let (a, b) = (
                every_window(store, &board).await,
                every_window(store, &exact).await,
            );
            for (part, values) in &a {
                assert_eq!(Some(values), b.get(part), "{}: {part}", board.name);
            }
            assert_eq!(a.len(), b.len(), "{}", board.name);
        },
    );
}

/// On a board with three windows one `fold.lua` call writes each window its events count
/// in and no other (`gen` bumped there only), leaves its chain token on the widest
/// window's `meta` alone, answers `slow` when a total could pass 2^53 - 1 in a narrower
/// window only, and writes nothing in any window when one of them holds a key of the
/// wrong type.
#[tokio::test]
async fn one_fold_call_writes_every_window_its_events_count_in() {
    let (_redis, store, board) = with_fresh_store(windowed(shaped(1), 3, true)).await;
    let control = twin(&board);
    let k = store.instance(&board.widest(), None);
    let fingerprint = board.widest().fingerprint();
    let run = |call: rollboard::store::FoldCall| async {
        fcall::<Vec<i64>, _, _>(store.client(), "fold", call.keys, call.args)
            .await
            .expect("fold.lua")
    };
    let metas = || async {
        let mut out = Vec::new();
        for view in board.views() {
            let meta = store.instance(&view, None).meta();
            let v: Vec<Option<String>> = store
                .client()
                .hmget(meta, vec!["gen", "chain"])
                .await
                .expect("HMGET");
            out.push(v);
        }
        out
    };
    let some = |s: &str| Some(s.to_string());
    // Slice 1000 counts in every window, 999 in the 2s and 4s ones, 997 in the 4s one;
    // 995 is late (answered as the call's slice 4).
    let events = [
        ev("a", NOW + 10, "ann", 5),
        ev("b", NOW - 500, "bob", 7),
        ev("c", NOW - 2_500, "cy", -9),
        ev("d", NOW - 5_000, "dee", 1),
    ];
    let call = rollboard::store::fold_call(&board, &k, &fingerprint, &events, NOW);
    assert_eq!(run(call.chained(None, "t1")).await, [0, 4]);
    let applied = apply_exact(&store, &control, &events, NOW).await;
    assert_eq!(applied[3], Outcome::Late);
    assert_eq!(
        every_window(&store, &board).await,
        every_window(&store, &control).await
    );
    assert_eq!(
        total_at(&store, &board.view(Some("1s")).expect("1s"), "ann", NOW).await,
        Some(5)
    );
    assert_eq!(
        metas().await,
        [
            vec![some("1"), None],
            vec![some("1"), None],
            vec![some("1"), some("t1")]
        ]
    );
    // An event of the widest window only: the others are left as they are.
    let older = [ev("e", NOW - 3_000, "ann", 2)];
    let call = rollboard::store::fold_call(&board, &k, &fingerprint, &older, NOW);
    assert_eq!(run(call.chained(Some("t1"), "t2")).await, [0]);
    apply_exact(&store, &control, &older, NOW).await;
    assert_eq!(
        metas().await,
        [
            vec![some("1"), None],
            vec![some("1"), None],
            vec![some("2"), some("t2")]
        ]
    );
    assert_eq!(
        every_window(&store, &board).await,
        every_window(&store, &control).await
    );

    // cy holds -9 in the 4s window only and +9 in the 2s one: an amount that fits the
    // widest's total passes 2^53 - 1 in the 2s window's.
    let even = [ev("f", NOW - 500, "cy", 9)];
    assert_eq!(
        apply_events(&store, &board, &even, NOW).await,
        apply_exact(&store, &control, &even, NOW).await
    );
    let big = [ev("g", NOW + 20, "cy", MAX_TOTAL - 5)];
    let before = snapshot(&store, &board).await;
    let call = rollboard::store::fold_call(&board, &k, &fingerprint, &big, NOW);
    assert_eq!(run(call.chained(Some("t2"), "t3")).await, [2], "slow");
    assert_eq!(snapshot(&store, &board).await, before, "a slow call wrote");
    assert_eq!(
        apply_events(&store, &board, &big, NOW).await,
        [Outcome::Overflow]
    );
    assert_eq!(
        apply_exact(&store, &control, &big, NOW).await,
        [Outcome::Overflow]
    );
    assert_eq!(
        every_window(&store, &board).await,
        every_window(&store, &control).await
    );

    // A narrower window's `members` of the wrong type: the call fails in phase 1, and
    // no window (nor the digest table) is written.
    let narrow = store.instance(&board.view(Some("2s")).expect("2s"), None);
    set_string(&store, &narrow.members(), "not a hash").await;
    let before = snapshot(&store, &board).await;
    let failed = store
        .apply(&board, None, &[ev("h", NOW + 30, "zed", 1)], NOW)
        .await;
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(
        snapshot(&store, &board).await,
        before,
        "a failed call wrote"
    );
}

/// A redelivered batch (every event a duplicate) is answered without a write, and a batch
/// mixing new and seen ids is judged event by event: both exact.
#[test]
fn redelivery_and_mixed_batches_count_once() {
    let (rt, _redis, store) = threaded_runtime_with_store();
    rt.block_on(async {
        let board = variants(SLICE, N)[0].clone();
        let events = cycled_events("t", 500, NOW, SLICE, 3);
        let first = apply_events(&store, &board, &events, NOW).await;
        assert!(first.iter().all(|o| *o == Outcome::Applied));
        let gen_before = gen_of(&store, &board).await;
        let again = apply_events(&store, &board, &events, NOW).await;
        assert!(again.iter().all(|o| *o == Outcome::Duplicate));
        let gen_after = gen_of(&store, &board).await;
        assert_eq!(gen_before, gen_after, "a redelivery writes nothing");
        // Every other event new: applied exactly once.
        let mixed: Vec<ApplyEvent> = (0..500)
            .map(|i| {
                if i % 2 == 0 {
                    events[i as usize].clone()
                } else {
                    ev(&format!("n{i}"), NOW, "m0", 1)
                }
            })
            .collect();
        let got = apply_events(&store, &board, &mixed, NOW).await;
        for (i, o) in got.iter().enumerate() {
            let expected = if i % 2 == 0 {
                Outcome::Duplicate
            } else {
                Outcome::Applied
            };
            assert_eq!(*o, expected, "event {i}");
        }
        let total: f64 = store
            .client()
            .zrange::<Vec<(String, f64)>, _, _, _>(
                store.instance(&board.widest(), None).result(),
                0,
                -1,
                None,
                false,
                None,
                true,
            )
            .await
            .expect("result")
            .into_iter()
            .filter(|(m, _)| m.ends_with(":m0"))
            .map(|(_, s)| s)
            .sum();
        let expected: i64 = (0..500).filter(|i| i % 7 == 0).map(|i| 1 + i).sum::<i64>() + 250;
        assert_eq!(total as i64, expected);
    });
}

/// A consumer that dies after some of a batch's calls (any prefix of its events applied),
/// then the batch redelivered whole: the same outcomes for the rest and the same data as a
/// batch applied once. (Amounts stay small here: an event refused for overflow is not
/// remembered, so a redelivery judges it again against the totals of that moment.)
#[test]
fn a_batch_cut_short_at_any_point_and_redelivered_counts_once() {
    let cases = (batches(), any::<prop::sample::Index>());
    run_cases_threaded(
        "a redelivered batch counts once",
        32,
        &cases,
        async |store, ((shape, batches), cut)| {
            // Long dedup windows only: with a short one an id older than its window
            // counts again by design, so a redelivery may too.
            let board = shaped(shape % 4);
            let once = twin(&board);
            for (events, now) in &batches {
                let events: &Vec<ApplyEvent> = &events
                    .iter()
                    .map(|e| ApplyEvent {
                        amount: e.amount.clamp(-6, 9),
                        ..e.clone()
                    })
                    .collect();
                let expected = apply_events(store, &once, events, *now).await;
                let at = cut.index(events.len() + 1);
                let first = apply_events(store, &board, &events[..at], *now).await;
                assert_eq!(first, expected[..at], "{}: the prefix", board.name);
                let again = apply_events(store, &board, events, *now).await;
                for (i, (got, want)) in again.iter().zip(&expected).enumerate() {
                    let want = if i < at && *want == Outcome::Applied {
                        Outcome::Duplicate
                    } else {
                        *want
                    };
                    assert_eq!(
                        *got, want,
                        "{}: event {i} {:?} (cut at {at})",
                        board.name, events[i]
                    );
                }
            }
            let (a, b) = (
                contents(store, &board.widest()).await,
                contents(store, &once.widest()).await,
            );
            assert_eq!(a, b, "{}", board.name);
        },
    );
}

/// Two consumers applying overlapping batches to one instance at the same time (a batch
/// claimed by another replica while its first consumer still applies it): every id counts
/// once, and the instance holds what one pass over the events in order leaves.
#[test]
fn concurrent_overlapping_batches_count_each_id_once() {
    let (rt, _redis, store) = threaded_runtime_with_store();
    rt.block_on(async {
        for shape in 0..8 {
            let board = shaped(shape);
            let once = twin(&board);
            let negative = board.allow_negative;
            for round in 0..3i64 {
                let now = NOW + round * SLICE;
                let events: Vec<ApplyEvent> = (0..900i64)
                    .map(|i| {
                        let amount = 1 + (i * 7 + round) % 11;
                        ev(
                            &format!("r{round}e{i}"),
                            // Within every shape's dedup window (a short one ends
                            // half a slice after its slice).
                            now - (i % 2) * SLICE + i % 97,
                            &format!("m{}", (i * 31 + round) % 60),
                            if negative && i % 5 == 0 {
                                -amount
                            } else {
                                amount
                            },
                        )
                    })
                    .collect();
                let (a, b) = tokio::join!(
                    store.apply(&board, None, &events[..600], now),
                    store.apply(&board, None, &events[300..], now),
                );
                let (a, b) = (a.expect("first consumer"), b.expect("second consumer"));
                // Each event of the overlap is applied by exactly one of the two.
                for i in 300..600 {
                    let (x, y) = (a[i], b[i - 300]);
                    assert!(
                        matches!(
                            (x, y),
                            (Outcome::Applied, Outcome::Duplicate)
                                | (Outcome::Duplicate, Outcome::Applied)
                        ),
                        "{}: event {i}: {x:?} and {y:?}",
                        board.name
                    );
                }
                let single = apply_events(&store, &once, &events, now).await;
                assert!(single.iter().all(|o| *o == Outcome::Applied));
            }
            let (got, want) = (
                contents(&store, &board.widest()).await,
                contents(&store, &once.widest()).await,
            );
            assert_eq!(got, want, "{}", board.name);
        }
    });
}

/// Rewrites every value of `key` (`members` or `ranked` of `board`'s instance) as an older
/// version wrote it: the whole ZSet member (prefix:member), or the member itself on a
/// board without tie-break. Returns how many it rewrote.
async fn write_old_members(store: &Store, board: &Board, key: &str) -> usize {
    let c = store.client();
    let fields: BTreeMap<String, String> = c.hgetall(key).await.expect("members");
    for (member, ts) in &fields {
        let old = encode_member(board.tie_break, member, ts.parse().unwrap_or_default());
        let _: i64 = c.hset(key, (member.as_str(), old)).await.expect("hset");
    }
    fields.len()
}

/// [`contents`] with every `members` value as the current layout writes it.
async fn normalized(store: &Store, board: &Board) -> BTreeMap<String, Vec<String>> {
    let mut out = contents(store, &board.widest()).await;
    if let Some(members) = out.get_mut("members") {
        for entry in members.iter_mut() {
            let (member, value) = entry.split_once('=').expect("field=value");
            let ts = match decode_member(board.tie_break, value) {
                (_, Some(ts)) if value.contains(':') => ts.to_string(),
                _ if board.tie_break == TieBreak::None => String::new(),
                _ => value.to_string(),
            };
            *entry = format!("{member}={ts}");
        }
    }
    out
}

/// Every ranked row of an instance and each member's own rank answer.
async fn answers(store: &Store, board: &Board, now: i64) -> Vec<String> {
    let page = store
        .top(&board.widest(), None, 0, 1000, now)
        .await
        .expect("top");
    let mut out: Vec<String> = page
        .entries
        .iter()
        .map(|e| {
            format!(
                "{} {} {:?} #{} c{}",
                e.member, e.total, e.last_ts, e.rank, e.competition_rank
            )
        })
        .collect();
    for m in 0..13 {
        let r = store
            .rank(&board.widest(), None, &format!("m{m}"), now)
            .await
            .expect("rank");
        out.push(format!("m{m}: {:?} {:?} {:?}", r.rank, r.total, r.last_ts));
    }
    out
}

/// An instance whose `members` Hash an older version wrote (whole ZSet members as values)
/// reads and writes exactly as one written in the current layout, through both apply
/// scripts, queries, expiry of a dead slice and resummarize, on every board shape.
#[tokio::test]
async fn members_written_by_an_older_version_are_read_as_before() {
    use rollboard::roll::{self, Job};
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    for shape in 0..4 {
        let (board, control) = shaped_and_twin(shape);
        let first: Vec<ApplyEvent> = (0..60)
            .map(|i| {
                let member = format!("m{}", i % 13);
                ev(&format!("a{i}"), NOW - 2_900 + i * 37, &member, 1 + i % 5)
            })
            .collect();
        // Later and earlier times (tie-break moves and stays), and a repeated id in the
        // second batch (which then goes event by event).
        let second: Vec<ApplyEvent> = (0..40)
            .map(|i| {
                let member = format!("m{}", (i * 7) % 13);
                ev(&format!("b{i}"), NOW - 2_500 + i * 61, &member, 1 + i % 3)
            })
            .collect();
        let mut third = second[..10].to_vec();
        third.push(ev("c0", NOW - 100, "m1", 4));
        for batch in [&first, &second, &third] {
            let outcomes = apply_events(&store, &board, batch, NOW).await;
            let expected = apply_events(&store, &control, batch, NOW).await;
            assert_eq!(outcomes, expected, "{}", board.name);
            if std::ptr::eq(batch, &first) {
                let members = store.instance(&board.widest(), None).members();
                assert_eq!(write_old_members(&store, &board, &members).await, 13);
            }
            assert_eq!(
                answers(&store, &board, NOW).await,
                answers(&store, &control, NOW).await,
                "{}",
                board.name
            );
        }
        // The first live slice dies: its members are subtracted (or resummed).
        let later = NOW + 1_500;
        for b in [&board, &control] {
            let report = roll::run_once(
                &store,
                std::slice::from_ref(b),
                Job::All,
                None,
                later,
                3,
                &tokio_util::sync::CancellationToken::new(),
            )
            .await
            .expect("roll")
            .remove(0);
            assert!(report.complete(), "{report:?}");
            assert_eq!(report.slices_expired, 1, "{}", b.name);
        }
        assert_eq!(
            answers(&store, &board, later).await,
            answers(&store, &control, later).await,
            "{} after the roll",
            board.name
        );
        // The lookup a resummarize run wrote, as an older version wrote it.
        if board.mode == Mode::Resummarize {
            let ranked = store.instance(&board.widest(), None).ranked();
            assert!(write_old_members(&store, &board, &ranked).await > 0);
            assert_eq!(
                answers(&store, &board, later).await,
                answers(&store, &control, later).await,
                "{} with an old ranked lookup",
                board.name
            );
        }
        assert_eq!(
            normalized(&store, &board).await,
            normalized(&store, &control).await,
            "{}",
            board.name
        );
    }
}

/// An instance's calls for one batch are sent at once, chained: a call that must be judged
/// event by event (some of its ids were seen before) holds back the calls after it until
/// it has been, so an id repeated in a later call is the duplicate, as in stream order.
#[tokio::test]
async fn a_slow_call_holds_back_the_calls_chained_after_it() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    for shape in 0..4 {
        let (board, control) = shaped_and_twin(shape);
        // Three calls of distinct members; the second one opens with the id of an event of
        // the first, another member and amount.
        let mut events: Vec<ApplyEvent> = (0..25)
            .map(|i| ev(&format!("e{i}"), NOW - 900 + i, &format!("m{i}"), 2 + i))
            .collect();
        events.push(ev("e10", NOW - 500, "late-copy", 1_000));
        events
            .extend((26..60).map(|i| ev(&format!("e{i}"), NOW - 900 + i, &format!("m{i}"), 2 + i)));
        let chunks = rollboard::store::fold_chunks(&board, &events);
        assert_eq!(chunks.len(), 3, "three calls");
        assert_eq!(chunks[1][0].member, "late-copy");
        // One id of the first call is remembered already: that call goes event by event.
        for b in [&board, &control] {
            let seen = apply_events(&store, b, &events[3..4], NOW).await;
            assert_eq!(seen, [Outcome::Applied]);
        }
        let outcomes = apply_events(&store, &board, &events, NOW).await;
        let expected = apply_exact(&store, &control, &events, NOW).await;
        assert_eq!(outcomes, expected, "shape {shape}");
        assert_eq!(outcomes[3], Outcome::Duplicate);
        assert_eq!(outcomes[25], Outcome::Duplicate, "the later copy of e10");
        assert_same_contents(&store, &board, &control, &format!("shape {shape}")).await;
        let members: Option<String> = store
            .client()
            .hget(store.instance(&board.widest(), None).members(), "late-copy")
            .await
            .expect("HGET");
        assert_eq!(members, None, "the later copy of e10 counted");
    }
}

/// A `fold.lua` call chained after a token that is not in `meta` answers `not run` and
/// writes nothing; chained after the token the call before it left, it runs and leaves its
/// own.
#[tokio::test]
async fn a_chained_call_runs_only_after_the_token_before_it() {
    let (_redis, store, board) = with_fresh_store(shaped(0)).await;
    let k = store.instance(&board.widest(), None);
    let fingerprint = board.widest().fingerprint();
    let first = [ev("a", NOW - 10, "ann", 5)];
    let second = [ev("b", NOW - 5, "bob", 7)];
    let fold = |events: &[ApplyEvent], after: Option<&str>, token: &str| {
        rollboard::store::fold_call(&board, &k, &fingerprint, events, NOW).chained(after, token)
    };
    let run = |call: rollboard::store::FoldCall| async {
        fcall::<Vec<i64>, _, _>(store.client(), "fold", call.keys, call.args)
            .await
            .expect("fold.lua")
    };
    assert_eq!(run(fold(&first, None, "t1")).await, [0]);
    let meta = || async {
        let v: Vec<Option<String>> = store
            .client()
            .hmget(k.meta(), vec!["chain", "gen"])
            .await
            .expect("HMGET");
        v
    };
    assert_eq!(
        meta().await,
        [Some("t1".to_string()), Some("1".to_string())]
    );
    let before = contents(&store, &board.widest()).await;
    assert_eq!(run(fold(&second, Some("t0"), "t2")).await, [3], "not run");
    assert_eq!(
        contents(&store, &board.widest()).await,
        before,
        "a call that did not run wrote"
    );
    assert_eq!(
        meta().await,
        [Some("t1".to_string()), Some("1".to_string())]
    );
    assert_eq!(run(fold(&second, Some("t1"), "t2")).await, [0]);
    assert_eq!(
        meta().await,
        [Some("t2".to_string()), Some("2".to_string())]
    );
    // Judged as duplicates, the call leaves its token too.
    assert_eq!(run(fold(&second, Some("t2"), "t3")).await, [1]);
    assert_eq!(
        meta().await,
        [Some("t3".to_string()), Some("2".to_string())]
    );
}

/// The numbers of a fold call travel in one MessagePack argument, checked against the
/// call's slice and group counts before anything is read: a short or garbled one is
/// refused as rollboard's own error, and nothing is written.
#[tokio::test]
async fn a_fold_call_whose_numbers_do_not_match_its_counts_is_refused() {
    let (_redis, store, board) = with_fresh_store(shaped(0)).await;
    let k = store.instance(&board.widest(), None);
    let fingerprint = board.widest().fingerprint();
    let events = [ev("a", NOW - 10, "ann", 5), ev("b", NOW - 20, "bob", 7)];
    let before = snapshot(&store, &board).await;
    let good = rollboard::store::fold_call(&board, &k, &fingerprint, &events, NOW);
    // One group of five numbers fewer (a MessagePack array of 3 + 5 integers, not 3 + 10),
    // an array cut short, and a value that is no MessagePack array at all.
    let short: Vec<u8> = [0x98, 0x00].into_iter().chain([0x01; 7]).collect();
    let cut = vec![0x9d, 0x01];
    let wrong = [
        Value::Bytes(short.into()),
        Value::Bytes(cut.into()),
        Value::from("12,3"),
    ];
    for numbers in wrong {
        let mut args = good.args.clone();
        args[14] = numbers;
        let got = fcall::<Vec<i64>, _, _>(store.client(), "fold", good.keys.clone(), args).await;
        let error = got
            .expect_err("a call with the wrong numbers is refused")
            .to_string();
        assert!(error.contains("ROLLBOARD"), "{error}");
        assert_eq!(snapshot(&store, &board).await, before);
    }
    let run = fcall::<Vec<i64>, _, _>(store.client(), "fold", good.keys, good.args).await;
    assert_eq!(run.expect("the call as built"), [0]);
}
