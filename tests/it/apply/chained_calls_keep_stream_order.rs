//! Chained `fold.lua` calls (`Store::apply` sends an instance's calls for one batch at once,
//! each running only after the one before it left its token in `meta`): whatever happens
//! between or to the calls, they take effect as the same calls sent one at a time, in
//! stream order. The reference is [`in_turn`]: the batch's chunks applied one by one, each
//! as a batch of its own (a single, unchained call), to a twin instance.

use std::time::Duration;

use fred::prelude::*;
use rollboard::domain::board::{Board, MAX_TOTAL};
use rollboard::roll::{self, Report};
use rollboard::store::{fold_call, fold_chunks, ApplyEvent, Outcome, Reconnect, Store, StoreError};
use tokio_util::sync::CancellationToken;

use crate::support::boards::{apply_events, ev, snapshot, with_fresh_store};
use crate::support::instances::{assert_same_contents, contents, shaped, shaped_and_twin, twin};
use crate::support::proxy::Proxy;
use crate::support::redis::{fcall, fcall_calls, function_name, RedisServer};

const SLICE: i64 = 1_000;
const NOW: i64 = 1_000_000;
/// Events in one segment: 25 distinct members fill one call's budget exactly, so segment
/// `j` of a batch is its call `j`.
const SEG: usize = 25;

/// The chunks of `events` applied one by one, each as a batch of its own (one unchained
/// call each, as before chaining); stops at the first error.
async fn in_turn(
    store: &Store,
    board: &Board,
    events: &[ApplyEvent],
    now: i64,
) -> (Vec<Outcome>, Option<StoreError>) {
    let mut out = Vec::new();
    for chunk in fold_chunks(board, events) {
        match store.apply(board, None, chunk, now).await {
            Ok(o) => out.extend(o),
            Err(e) => return (out, Some(e)),
        }
    }
    (out, None)
}

/// `events` applied to `board` at [`NOW`] through `a` and `b` at once, both calls' results;
/// fails the test unless both finish within 20 s (a livelock).
async fn at_once(
    a: &Store,
    b: &Store,
    board: &Board,
    events: &[ApplyEvent],
) -> (
    Result<Vec<Outcome>, StoreError>,
    Result<Vec<Outcome>, StoreError>,
) {
    let both = async {
        tokio::join!(
            a.apply(board, None, events, NOW),
            b.apply(board, None, events, NOW)
        )
    };
    tokio::time::timeout(Duration::from_secs(20), both)
        .await
        .expect("a livelock: the two chains never finished")
}

/// One segment: `SEG` events of distinct members `{tag}m{i}`, ids `{tag}{i}`, at `ts + i`.
fn segment(tag: &str, ts: i64, amount: i64) -> Vec<ApplyEvent> {
    (0..SEG as i64)
        .map(|i| {
            ev(
                &format!("{tag}{i}"),
                ts + i,
                &format!("{tag}m{i}"),
                amount + i,
            )
        })
        .collect()
}

fn segments(tags: &[&str], ts: i64) -> Vec<ApplyEvent> {
    tags.iter().flat_map(|t| segment(t, ts, 1)).collect()
}

/// `calls` segments tagged `{prefix}0-`, `{prefix}1-`, ...
fn numbered(prefix: &str, calls: usize, ts: i64) -> Vec<ApplyEvent> {
    (0..calls)
        .flat_map(|s| segment(&format!("{prefix}{s}-"), ts, 1))
        .collect()
}

fn assert_calls(board: &Board, events: &[ApplyEvent], calls: usize) {
    let chunks = fold_chunks(board, events);
    assert_eq!(
        chunks.iter().map(|c| c.len()).collect::<Vec<_>>(),
        vec![SEG; calls],
        "one call per segment"
    );
}

/// The connection is cut once the first (then the second) chained call reached Redis, the
/// calls after it pipelined behind it, then part-way into the third: the instance holds
/// exactly the first `k` calls' events (a prefix, `k` at least the calls before the cut),
/// and the batch applied again answers
/// `Duplicate` for those and `Applied` for the rest, ending as the calls made in turn.
#[tokio::test]
async fn a_chain_cut_after_its_first_calls_leaves_a_prefix_and_redelivery_completes_it() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.port).await;
    // Chains of `fold.lua` calls (the worker would judge the events itself).
    let store = proxy.store().await.with_transactions(false);
    let direct = redis.store("rb").await;
    let tags = ["a", "b", "c", "d", "e", "f"];
    // Loads the library (a call answered "function not found" would count as an occurrence).
    store
        .apply(&shaped(0), None, &[ev("w", NOW, "w", 1)], NOW)
        .await
        .expect("warm-up");
    // The cut right after the first call, after the second, and inside the third (the
    // chunk let through ends at one of its member names, part-way into the call).
    let cuts = [
        (1, function_name("fold"), 1),
        (2, function_name("fold"), 2),
        (3, b"cm7".to_vec(), 1),
    ];
    for (nth, pattern, occurrence) in cuts {
        let mut board = shaped(nth);
        board.name = format!("cut{nth}");
        let control = twin(&board);
        let events = segments(&tags, NOW - 500);
        assert_calls(&board, &events, tags.len());
        proxy.cut_at(&pattern, occurrence, 1);
        let failed = store.apply(&board, None, &events, NOW).await;
        assert!(!proxy.armed(), "no cut: {failed:?}");
        assert!(failed.is_err(), "a cut chain answered {failed:?}");
        // Which calls ran: the first member of each segment is known or not.
        let k = direct.instance(&board.widest(), None);
        let mut ran = Vec::new();
        for t in tags {
            let known: bool = direct
                .client()
                .hexists(k.members(), format!("{t}m0"))
                .await
                .expect("HEXISTS");
            ran.push(known);
        }
        let landed = ran.iter().take_while(|r| **r).count();
        assert!(
            ran[landed..].iter().all(|r| !r),
            "not a prefix of the calls: {ran:?}"
        );
        assert!(
            landed >= nth.min(2),
            "the calls before the cut did not run: {ran:?}"
        );
        eprintln!("cut at call {nth}: {landed} calls ran");
        let (first, err) = in_turn(&direct, &control, &events[..landed * SEG], NOW).await;
        assert!(err.is_none() && first.iter().all(|o| *o == Outcome::Applied));
        assert_same_contents(
            &direct,
            &board,
            &control,
            &format!("after the cut at {nth}"),
        )
        .await;
        let again = apply_events(&store, &board, &events, NOW).await;
        let expected: Vec<Outcome> = (0..events.len())
            .map(|i| {
                if i < landed * SEG {
                    Outcome::Duplicate
                } else {
                    Outcome::Applied
                }
            })
            .collect();
        assert_eq!(again, expected, "redelivery after the cut at {nth}");
        let (rest, err) = in_turn(&direct, &control, &events, NOW).await;
        assert!(err.is_none());
        assert_eq!(rest, expected);
        assert_same_contents(
            &direct,
            &board,
            &control,
            &format!("after the redelivery ({nth})"),
        )
        .await;
    }
}

/// Outcomes of a `fold.lua` reply for the call's events (`None`: not run or slow).
fn outcomes_of(reply: &[i64], slice_of: &[usize]) -> Option<Vec<Outcome>> {
    let counted = match reply[0] {
        0 => Outcome::Applied,
        1 => Outcome::Duplicate,
        _ => return None,
    };
    Some(
        slice_of
            .iter()
            .map(|&s| {
                if reply[1..].contains(&(s as i64 + 1)) {
                    Outcome::Late
                } else {
                    counted
                }
            })
            .collect(),
    )
}

async fn roll_at(store: &Store, board: &Board, now: i64) {
    let mut report = Report::default();
    roll::InstanceRoll {
        store,
        view: &board.widest(),
        scope: None,
        now,
        chunk: 100,
        cancel: &CancellationToken::new(),
    }
    .roll(
        board.slice_of(now) - board.widest().slices_in_window(),
        &mut report,
    )
    .await
    .expect("roll");
}

/// A roll runs between two chained calls (the watermark raised past some slices of the
/// second call's events): the second call still runs, judges those events late, and
/// everything equals the calls and the roll in that order, one at a time.
#[tokio::test]
async fn a_roll_between_two_chained_calls_is_seen_as_between_them() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    for shape in 0..4 {
        let (board, control) = shaped_and_twin(shape);
        let k = store.instance(&board.widest(), None);
        let fingerprint = board.widest().fingerprint();
        // Events across slices 997..1000; the roll at NOW + 2 slices expires 997 and 998.
        let spread = |tag: &str| -> Vec<ApplyEvent> {
            (0..SEG as i64)
                .map(|i| {
                    ev(
                        &format!("{tag}{i}"),
                        NOW - 3_000 + (i % 4) * SLICE + i,
                        &format!("m{}", i % 7),
                        1 + i,
                    )
                })
                .collect()
        };
        let (first, second) = (spread("x"), spread("y"));
        let run = |call: rollboard::store::FoldCall| {
            let store = &store;
            async move {
                let reply: Vec<i64> = fcall(store.client(), "fold", call.keys, call.args)
                    .await
                    .expect("fold.lua");
                (reply.clone(), outcomes_of(&reply, &call.slice_of))
            }
        };
        let c1 = fold_call(&board, &k, &fingerprint, &first, NOW).chained(None, "t1");
        let c2 = fold_call(&board, &k, &fingerprint, &second, NOW).chained(Some("t1"), "t2");
        let (_, o1) = run(c1).await;
        roll_at(&store, &board, NOW + 2 * SLICE).await;
        let (r2, o2) = run(c2).await;
        assert_eq!(r2[0], 0, "{}: the second call ran: {r2:?}", board.name);

        let e1 = apply_events(&store, &control, &first, NOW).await;
        roll_at(&store, &control, NOW + 2 * SLICE).await;
        let e2 = apply_events(&store, &control, &second, NOW).await;
        assert_eq!(o1.as_deref(), Some(&e1[..]), "{}", board.name);
        assert_eq!(o2.as_deref(), Some(&e2[..]), "{}", board.name);
        let late = e2.iter().filter(|o| **o == Outcome::Late).count();
        assert!(late > 0 && late < SEG, "{}: {e2:?}", board.name);
        assert_same_contents(&store, &board, &control, &board.name).await;
    }
}

/// A roll racing a long chain from another connection, many times: whenever it lands,
/// each event is applied or late, a late one's slice is at or below the final watermark,
/// and the instance holds exactly the applied events (checked against the calls made in
/// turn with the outcomes observed).
#[tokio::test]
async fn a_roll_racing_a_chain_splits_it_in_stream_order() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let roller = redis.store("rb").await;
    for round in 0..6i64 {
        let mut board = shaped(round as usize % 4);
        board.name = format!("race{round}");
        // 12 calls, events in slices 997..1000, so that a roll at NOW + 2 slices makes the
        // later events of 997 and 998 late.
        let events: Vec<ApplyEvent> = (0..12 * SEG as i64)
            .map(|i| {
                let seg = i / SEG as i64;
                ev(
                    &format!("r{i}"),
                    NOW - 3_000 + (i % 4) * SLICE + i % SEG as i64,
                    &format!("m{seg}-{}", i % SEG as i64),
                    1,
                )
            })
            .collect();
        let (outcomes, ()) = tokio::join!(store.apply(&board, None, &events, NOW), async {
            tokio::time::sleep(Duration::from_micros(200 * round as u64)).await;
            roll_at(&roller, &board, NOW + 2 * SLICE).await;
        });
        let outcomes = outcomes.expect("apply");
        // Once an event of a slice at or below 998 is late, every later one of such a
        // slice is too: the roll fell between two calls.
        let expiring = |e: &ApplyEvent| board.slice_of(e.ts) <= 998;
        // The call the roll fell before.
        let first_late = outcomes
            .iter()
            .position(|o| *o == Outcome::Late)
            .map(|f| f / SEG * SEG);
        for (i, (e, o)) in events.iter().zip(&outcomes).enumerate() {
            let late_expected = expiring(e) && first_late.is_some_and(|f| i >= f);
            assert_eq!(
                *o == Outcome::Late,
                late_expected,
                "round {round}: event {i} {e:?}: {o:?}"
            );
            assert!(matches!(o, Outcome::Applied | Outcome::Late));
        }
        // The same, in turn: applied events, the roll where it fell, the rest.
        let control = twin(&board);
        let cut = first_late.unwrap_or(events.len());
        let (a, err) = in_turn(&store, &control, &events[..cut], NOW).await;
        assert!(err.is_none());
        roll_at(&store, &control, NOW + 2 * SLICE).await;
        let (b, err) = in_turn(&store, &control, &events[cut..], NOW).await;
        assert!(err.is_none());
        if first_late.is_some() {
            assert_eq!([a, b].concat(), outcomes, "round {round}");
        }
        eprintln!("race round {round}: the roll fell before event {first_late:?}");
        // A resummarize board's ranking is the roll's summary as of when it ran (after
        // the calls that raced it): summarized again, both hold the same.
        roll_at(&store, &board, NOW + 2 * SLICE).await;
        roll_at(&store, &control, NOW + 2 * SLICE).await;
        let (got, want) = (
            contents(&store, &board.widest()).await,
            contents(&store, &control.widest()).await,
        );
        let differing: Vec<_> = got
            .keys()
            .chain(want.keys())
            .filter(|k| got.get(*k) != want.get(*k))
            .map(|k| (k, got.get(k).map(|v| v.len()), want.get(k).map(|v| v.len())))
            .collect();
        assert!(
            differing.is_empty(),
            "round {round} (first late {first_late:?}): {differing:?} {:?} {:?}",
            got.get("result")
                .map(|v| v.iter().take(3).collect::<Vec<_>>()),
            want.get("result")
                .map(|v| v.iter().take(3).collect::<Vec<_>>())
        );
    }
}

/// Two stores apply the same batches to one instance at the same time, so their tokens
/// interleave and cut each other's chains: both finish, every id counts once (one of the
/// two answers `Applied`, the other `Duplicate`), the instance equals the calls made in
/// turn, and the calls sent stay within the bound of resending (no livelock).
#[tokio::test]
async fn two_stores_chaining_on_one_instance_count_each_id_once_and_finish() {
    let redis = RedisServer::start();
    let a = redis.store("rb").await;
    let b = redis.store("rb").await;
    for shape in [0, 1, 2, 3, 5] {
        let (board, control) = shaped_and_twin(shape);
        for round in 0..4 {
            let calls: u64 = 10;
            let events = numbered(
                &format!("r{round}s"),
                calls as usize,
                NOW - 300 + round * 10,
            );
            let before = fcall_calls(&redis);
            let (x, y) = at_once(&a, &b, &board, &events).await;
            let sent = fcall_calls(&redis) - before;
            let (x, y) = (x.expect("a"), y.expect("b"));
            for (i, (p, q)) in x.iter().zip(&y).enumerate() {
                assert!(
                    matches!(
                        (p, q),
                        (Outcome::Applied, Outcome::Duplicate)
                            | (Outcome::Duplicate, Outcome::Applied)
                    ),
                    "{}: event {i}: {p:?} {q:?}",
                    board.name
                );
            }
            // Each pass of one store judges at least its first call.
            assert!(
                sent <= calls * (calls + 1),
                "{}: {sent} calls for two chains of {calls}",
                board.name
            );
            let (o, err) = in_turn(&a, &control, &events, NOW).await;
            assert!(err.is_none() && o.iter().all(|o| *o == Outcome::Applied));
        }
        assert_same_contents(&a, &board, &control, &board.name).await;
    }
}

/// The library flushed before a batch of 40 calls (more than `join_all` polls in order
/// itself): every call answers that the function is not found, loads the library and is
/// sent again, possibly out of order; the calls still take effect in order, and only once.
#[tokio::test]
async fn a_chain_after_function_flush_reloads_and_applies_in_order() {
    let (redis, store, (board, control)) = with_fresh_store(shaped_and_twin(0)).await;
    let mut events = numbered("s", 40, NOW - 900);
    // Call 30 opens with a second copy of an id of call 2, for another member: the first
    // copy must win.
    events[30 * SEG] = ev(&events[2 * SEG + 3].id.clone(), NOW - 10, "copy", 1_000);
    let chunks = fold_chunks(&board, &events);
    assert_eq!(chunks.len(), 40);
    for pass in 0..2 {
        redis.cli(&["FUNCTION", "FLUSH"]);
        let got = apply_events(&store, &board, &events, NOW).await;
        redis.cli(&["FUNCTION", "FLUSH"]);
        let (want, err) = in_turn(&store, &control, &events, NOW).await;
        assert!(err.is_none());
        assert_eq!(got, want, "pass {pass}");
        let expected = if pass == 0 {
            Outcome::Applied
        } else {
            Outcome::Duplicate
        };
        assert_eq!(got[30 * SEG], Outcome::Duplicate, "pass {pass}: the copy");
        assert!(got
            .iter()
            .enumerate()
            .all(|(i, o)| i == 30 * SEG || *o == expected));
    }
    let copy: Option<String> = store
        .client()
        .hget(store.instance(&board.widest(), None).members(), "copy")
        .await
        .expect("HGET");
    assert_eq!(copy, None, "the second copy of an id counted");
    assert_same_contents(&store, &board, &control, "").await;
}

/// A long chain with room for a single call in flight (every call waits for the one
/// before it to answer): no deadlock, the same result.
#[tokio::test]
async fn a_long_chain_with_one_call_in_flight_finishes_and_agrees() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await.with_calls_in_flight(1);
    let (board, control) = shaped_and_twin(2);
    let events = numbered("q", 35, NOW - 700);
    let got = tokio::time::timeout(
        Duration::from_secs(20),
        store.apply(&board, None, &events, NOW),
    )
    .await
    .expect("stuck")
    .expect("apply");
    let (want, err) = in_turn(&store, &control, &events, NOW).await;
    assert!(err.is_none());
    assert_eq!(got, want);
    assert!(got.iter().all(|o| *o == Outcome::Applied));
    assert_same_contents(&store, &board, &control, "").await;
}

/// Mid-chain calls whose events are all late, all duplicates, or would pass 2^53 - 1 (sent
/// to be judged event by event), and one half late, on every board shape (refunds, each tie-break,
/// short dedup windows): the same outcomes and data as the calls in turn.
#[tokio::test]
async fn late_duplicate_and_overflowing_calls_mid_chain_agree_with_calls_in_turn() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    for shape in 0..8 {
        let (board, control) = shaped_and_twin(shape);
        let live = NOW - 300;
        let near = MAX_TOTAL - 40;
        let mut events = Vec::new();
        // 0: live, members am* near the limit.
        events.extend(segment("a", live, near));
        // 1: all late.
        events.extend(segment("b", NOW - 10 * SLICE, 5));
        // 2: all duplicates (applied before the batch).
        let dups = segment("c", live, 3);
        events.extend(dups.clone());
        // 3: the members of call 0 again: past the limit.
        events.extend(
            segment("d", live, 100)
                .into_iter()
                .enumerate()
                .map(|(i, e)| ApplyEvent {
                    member: format!("am{i}"),
                    ..e
                }),
        );
        // 4: half late, half live.
        events.extend(
            segment("e", live, 2)
                .into_iter()
                .enumerate()
                .map(|(i, e)| ApplyEvent {
                    ts: if i % 2 == 0 {
                        NOW - 9 * SLICE + i as i64
                    } else {
                        e.ts
                    },
                    ..e
                }),
        );
        // 5: live.
        events.extend(segment("f", live, 1));
        assert_calls(&board, &events, 6);
        for b in [&board, &control] {
            let o = apply_events(&store, b, &dups, NOW).await;
            assert!(o.iter().all(|o| *o == Outcome::Applied));
        }
        let got = apply_events(&store, &board, &events, NOW).await;
        let (want, err) = in_turn(&store, &control, &events, NOW).await;
        assert!(err.is_none(), "{err:?}");
        assert_eq!(got, want, "{}", board.name);
        let call = |j: usize| &got[j * SEG..(j + 1) * SEG];
        assert!(call(0).iter().all(|o| *o == Outcome::Applied));
        assert!(call(1).iter().all(|o| *o == Outcome::Late));
        assert!(call(2).iter().all(|o| *o == Outcome::Duplicate));
        assert!(
            call(3).iter().all(|o| *o == Outcome::Overflow),
            "{}: {:?}",
            board.name,
            call(3)
        );
        for (i, o) in call(4).iter().enumerate() {
            let want = if i % 2 == 0 {
                Outcome::Late
            } else {
                Outcome::Applied
            };
            assert_eq!(*o, want, "{}: call 4 event {i}", board.name);
        }
        assert!(call(5).iter().all(|o| *o == Outcome::Applied));
        assert_same_contents(&store, &board, &control, &board.name).await;
    }
}

/// A batch whose events are all late, in several calls, to an instance that does not
/// exist: every event is late, nothing is counted; `meta` is left holding only the chain
/// token.
#[tokio::test]
async fn an_all_late_chain_counts_nothing() {
    let (_redis, store, board) = with_fresh_store(shaped(0)).await;
    // A chain of `fold.lua` calls (the worker judges late events by reads alone, leaving
    // no trace at all).
    let store = store.with_transactions(false);
    let events = segments(&["a", "b", "c"], NOW - 10 * SLICE);
    assert_calls(&board, &events, 3);
    let got = apply_events(&store, &board, &events, NOW).await;
    assert!(got.iter().all(|o| *o == Outcome::Late));
    let k = store.instance(&board.widest(), None);
    for key in [k.result(), k.members(), k.slices(), k.totals()] {
        let exists: i64 = store.client().exists(key.clone()).await.expect("EXISTS");
        assert_eq!(exists, 0, "{key} written by an all-late batch");
    }
    // The one trace of it: the token the chain's calls left in `meta` (calls made in turn
    // leave none), no settings, no change counted.
    let meta: std::collections::HashMap<String, String> =
        store.client().hgetall(k.meta()).await.expect("HGETALL");
    assert_eq!(meta.keys().collect::<Vec<_>>(), ["chain"], "{meta:?}");
}

/// A `chain` field set by hand (garbage, empty) does not hold a batch back: the first call
/// of a chain runs whatever it holds.
#[tokio::test]
async fn a_chain_field_set_by_hand_does_not_hold_a_batch_back() {
    let (_redis, store, (board, control)) = with_fresh_store(shaped_and_twin(1)).await;
    let k = store.instance(&board.widest(), None);
    for (round, value) in ["garbage", "", "0000000000000000"].iter().enumerate() {
        let _: () = store
            .client()
            .hset(k.meta(), ("chain", *value))
            .await
            .expect("HSET");
        let events = numbered(&format!("h{round}-"), 4, NOW - 100);
        let got = apply_events(&store, &board, &events, NOW).await;
        assert!(got.iter().all(|o| *o == Outcome::Applied), "{value:?}");
        let (want, _) = in_turn(&store, &control, &events, NOW).await;
        assert_eq!(got, want);
        let chain: Option<String> = store.client().hget(k.meta(), "chain").await.expect("HGET");
        let chain = chain.expect("a token left");
        assert!(
            chain.len() == 32 && chain != *value,
            "token {chain:?} after {value:?}"
        );
    }
    assert_same_contents(&store, &board, &control, "").await;
}

/// A `meta` key of the wrong type: the batch fails, as the calls in turn do, and nothing
/// is written.
#[tokio::test]
async fn a_meta_key_of_the_wrong_type_fails_the_chain_writing_nothing() {
    let (_redis, store, (board, control)) = with_fresh_store(shaped_and_twin(0)).await;
    for b in [&board, &control] {
        let _: () = store
            .client()
            .set(
                store.instance(&b.widest(), None).meta(),
                "x",
                None,
                None,
                false,
            )
            .await
            .expect("SET");
    }
    let before = snapshot(&store, &board).await;
    let events = segments(&["a", "b", "c"], NOW - 100);
    let got = store.apply(&board, None, &events, NOW).await;
    let (want, err) = in_turn(&store, &control, &events, NOW).await;
    assert!(want.is_empty());
    let (got, err) = (got.expect_err("wrong type"), err.expect("wrong type"));
    assert!(got.to_string().contains("WRONGTYPE"), "{got}");
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
    assert_eq!(snapshot(&store, &board).await, before);
}

/// An instance still holding the legacy `seen` ZSet, discovered mid-chain (the first call
/// is all late, judged without looking): the second call is sent again judging each event
/// on its own, which asks for raw ids; from there the batch goes event by event with them, and the ids the
/// legacy ZSet holds are duplicates, in every call after.
#[tokio::test]
async fn a_legacy_seen_zset_found_mid_chain_is_honoured_from_there() {
    let (redis, store, (board, control)) = with_fresh_store(shaped_and_twin(0)).await;
    let live = NOW - 200;
    let mut events = segment("a", NOW - 10 * SLICE, 1);
    events.extend(segment("b", live, 1));
    events.extend(segment("c", live, 1));
    events.extend(segment("d", live, 1));
    assert_calls(&board, &events, 4);
    let forget = board.forget_at(board.slice_of(live)).to_string();
    for b in [&board, &control] {
        let seen = store.instance(&b.widest(), None).seen();
        for id in ["b3", "c7", "d24"] {
            redis.cli(&["ZADD", &seen, &forget, id]);
        }
    }
    let got = apply_events(&store, &board, &events, NOW).await;
    let (want, err) = in_turn(&store, &control, &events, NOW).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(got, want);
    for (i, (e, o)) in events.iter().zip(&got).enumerate() {
        let expected = if i < SEG {
            Outcome::Late
        } else if ["b3", "c7", "d24"].contains(&e.id.as_str()) {
            Outcome::Duplicate
        } else {
            Outcome::Applied
        };
        assert_eq!(*o, expected, "event {i} {e:?}");
    }
    assert_same_contents(&store, &board, &control, "").await;
}

/// Sets a slice field of `member` to a non-number in `board`'s instance (its slice
/// registered), so that a call touching it fails before writing.
async fn corrupt_field(store: &Store, board: &Board, ts: i64, member: &str) {
    let k = store.instance(&board.widest(), None);
    let n = board.slice_of(ts);
    let _: () = store
        .client()
        .hset(k.slice(n), (member, "abc"))
        .await
        .expect("HSET");
    let _: () = store
        .client()
        .zadd(k.slices(), None, None, false, false, (n as f64, n))
        .await
        .expect("ZADD");
}

/// A call that must go event by event (some of its ids were seen), then a call that fails
/// (a corrupt field): the first two calls' events are counted, the third fails and writes
/// nothing, the ones after it do not run; as the calls in turn. And a failing second call:
/// only the first is counted.
#[tokio::test]
async fn a_slow_call_then_a_failing_call_stop_where_the_calls_in_turn_stop() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    for (case, failing) in [(0, 2usize), (1, 1)] {
        let mut board = shaped(case);
        board.name = format!("stop{case}");
        let control = twin(&board);
        let live = NOW - 100;
        let events = segments(&["a", "b", "c", "d"], live);
        assert_calls(&board, &events, 4);
        let tag = ["a", "b", "c", "d"][failing];
        for b in [&board, &control] {
            // One id of call 1 seen before: call 1 goes event by event.
            let o = apply_events(&store, b, &events[SEG + 4..SEG + 5], NOW).await;
            assert_eq!(o, [Outcome::Applied]);
            corrupt_field(&store, b, live, &format!("{tag}m5")).await;
        }
        let got = store.apply(&board, None, &events, NOW).await;
        let (done, err) = in_turn(&store, &control, &events, NOW).await;
        let got = got.expect_err("the corrupt call fails");
        let err = err.expect("the corrupt call fails in turn");
        assert!(got.to_string().contains("corrupt"), "{got}");
        assert!(err.to_string().contains("corrupt"), "{err}");
        assert_eq!(done.len(), failing * SEG);
        assert_same_contents(&store, &board, &control, &format!("case {case}")).await;
        // The tie-break time `members` records for `member`, when it counted.
        let time_of = async |member: &str| -> Option<String> {
            let members = store.instance(&board.widest(), None).members();
            store.client().hget(members, member).await.expect("HGET")
        };
        assert!(time_of("am0").await.is_some(), "call 0 not counted");
        assert!(
            time_of("dm0").await.is_none(),
            "a call after the failing one ran"
        );
    }
}

/// A corrupt `gen` that Lua reads as a number but Redis does not take as an integer
/// ("1e3", "007"): a chained call and an unchained one judge it alike, failing before
/// anything is written.
#[tokio::test]
async fn a_gen_redis_cannot_increment_fails_chained_and_unchained_calls_alike() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    for (case, gen) in ["1e3", "007", "+5", "0x10"].iter().enumerate() {
        let mut board = shaped(case % 4);
        board.name = format!("gen{case}");
        let control = twin(&board);
        for b in [&board, &control] {
            let _: () = store
                .client()
                .hset(store.instance(&b.widest(), None).meta(), ("gen", *gen))
                .await
                .expect("HSET");
        }
        let before = snapshot(&store, &board).await;
        let events = segments(&["a", "b"], NOW - 100);
        let got = store.apply(&board, None, &events, NOW).await;
        let (_, err) = in_turn(&store, &control, &events, NOW).await;
        let err = err.map(|e| e.to_string());
        assert_eq!(
            got.as_ref().err().map(|e| e.to_string().contains("gen")),
            Some(true),
            "{gen:?}: chained {got:?}, in turn {err:?}"
        );
        assert!(err.as_deref().is_some_and(|e| e.contains("gen")), "{err:?}");
        assert_eq!(snapshot(&store, &board).await, before, "{gen:?}");
        let twin_seen: i64 = store
            .client()
            .exists(store.instance(&control.widest(), None).seen_table())
            .await
            .expect("EXISTS");
        assert_eq!(
            twin_seen, 0,
            "{gen:?}: an unchained call wrote before failing"
        );
    }
}

/// The port of the master `client` believes serves `key`.
fn owner(client: &Client, key: &str) -> u16 {
    client
        .cached_cluster_state()
        .expect("cluster state")
        .get_server(fred::types::cluster::ClusterRouting::hash_key(
            key.as_bytes(),
        ))
        .expect("owner")
        .port
}

/// On a 3 + 3 cluster, a long chain while its master hands over to its replica (a manual
/// failover: the calls after the switch meet redirections and fail the apply as an
/// outage): the consumer's retries of the whole batch end with every event counted once,
/// as the calls made in turn on another instance.
#[tokio::test]
async fn a_chain_across_a_cluster_failover_counts_each_event_once() {
    use crate::support::cluster::{cli, RedisCluster};
    let cluster = RedisCluster::start();
    let store = cluster.store().await;
    let (board, control) = shaped_and_twin(0);
    for b in [&board, &control] {
        apply_events(&store, b, &[ev("w", NOW - 10, "w", 1)], NOW).await;
    }
    let events = numbered("f", 30, NOW - 400);
    let master = owner(
        store.client(),
        &store.instance(&board.widest(), None).meta(),
    );
    let replica = cluster.replica_of(master);
    let (first, answer) = tokio::join!(store.apply(&board, None, &events, NOW), async {
        tokio::time::sleep(Duration::from_millis(2)).await;
        cli(replica, &["CLUSTER", "FAILOVER"])
    });
    assert_eq!(answer.trim(), "OK");
    let healed = crate::support::wait::wait_for(Duration::from_secs(30), || async {
        cluster.masters().contains(&replica) && cluster.healthy()
    })
    .await;
    assert!(healed, "the failover did not finish");
    let mut outcomes = vec![first];
    while outcomes.last().is_some_and(|o| o.is_err()) {
        assert!(outcomes.len() < 5, "retries: {outcomes:?}");
        if let Some(Err(e)) = outcomes.last() {
            assert!(e.is_outage(), "{e}");
        }
        outcomes.push(store.apply(&board, None, &events, NOW).await);
    }
    eprintln!(
        "failover mid-chain: {} tries, the first {:?}",
        outcomes.len(),
        outcomes[0].as_ref().map(|o| o.len())
    );
    let last = outcomes.pop().expect("one").expect("ok");
    assert!(last
        .iter()
        .all(|o| matches!(o, Outcome::Applied | Outcome::Duplicate)));
    if outcomes.is_empty() {
        assert!(last.iter().all(|o| *o == Outcome::Applied));
    }
    let (want, err) = in_turn(&store, &control, &events, NOW).await;
    assert!(err.is_none() && want.iter().all(|o| *o == Outcome::Applied));
    assert_same_contents(&store, &board, &control, "").await;
}

/// Two applies of the same batch to one instance at once through one store with a single
/// write connection: the two chains interleave on that connection; both finish, and every
/// id counts once.
#[tokio::test]
async fn two_chains_on_one_connection_count_each_id_once_and_finish() {
    let redis = RedisServer::start();
    let store = Store::connect(&redis.url(), "rb", 1, Reconnect::Never)
        .await
        .expect("connect");
    let (board, control) = shaped_and_twin(1);
    for round in 0..4 {
        let events = numbered(&format!("o{round}s"), 12, NOW - 200 + round * 10);
        let (x, y) = at_once(&store, &store, &board, &events).await;
        let (x, y) = (x.expect("x"), y.expect("y"));
        for (i, (p, q)) in x.iter().zip(&y).enumerate() {
            assert!(
                matches!(
                    (p, q),
                    (Outcome::Applied, Outcome::Duplicate) | (Outcome::Duplicate, Outcome::Applied)
                ),
                "event {i}: {p:?} {q:?}"
            );
        }
        let (o, err) = in_turn(&store, &control, &events, NOW).await;
        assert!(err.is_none() && o.iter().all(|o| *o == Outcome::Applied));
    }
    assert_same_contents(&store, &board, &control, "").await;
}

/// At `maxmemory` (noeviction) a redelivered batch fails as the calls in turn do (every
/// writing script is refused up front, the chain's token write adding no new refusal), and
/// goes through once memory is back. A batch of late events, which writes nothing, is
/// answered `Late`: the worker judges it by reads only, nothing for Redis to refuse.
#[tokio::test]
async fn at_maxmemory_a_redelivered_chain_fails_as_calls_in_turn_do() {
    let (redis, store, (board, control)) = with_fresh_store(shaped_and_twin(0)).await;
    let events = segments(&["a", "b", "c"], NOW - 100);
    let mut late = segments(&["x", "y"], NOW - 10 * SLICE);
    late.extend(segment("z", NOW - 10 * SLICE, 1));
    for b in [&board, &control] {
        apply_events(&store, b, &events, NOW).await;
    }
    redis.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    redis.cli(&["CONFIG", "SET", "maxmemory", "1"]);
    for batch in [&events, &late] {
        let got = store.apply(&board, None, batch, NOW).await;
        let (late_in_turn, err) = in_turn(&store, &control, batch, NOW).await;
        if batch == &late {
            assert!(err.is_none(), "{err:?}");
            assert_eq!(late_in_turn, vec![Outcome::Late; late.len()]);
            assert_eq!(got.expect("judged in the worker"), late_in_turn);
            continue;
        }
        assert!(err.is_some_and(|e| e.to_string().contains("OOM")));
        let got = got.expect_err("refused at maxmemory");
        assert!(got.to_string().contains("OOM"), "{got}");
    }
    redis.cli(&["CONFIG", "SET", "maxmemory", "0"]);
    let again = apply_events(&store, &board, &events, NOW).await;
    assert!(again.iter().all(|o| *o == Outcome::Duplicate));
    let late = apply_events(&store, &board, &late, NOW).await;
    assert!(late.iter().all(|o| *o == Outcome::Late));
}
