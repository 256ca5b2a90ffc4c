//! A script that fails half-way on any key writes nothing and its retry counts every event,
//! an expiry that fails is finished by the next roll, and refunds that cancel their tips
//! exactly roll without a failure. Each test runs over many random batches.

use fred::prelude::*;
use proptest::prelude::*;
use rollboard::domain::board::{Board, Mode};
use rollboard::store::{ApplyEvent, Store};

use crate::support::asserts::verify_differences;
use crate::support::boards::{apply_events, ev, roll_once, snapshot};
use crate::support::model::{assert_matches, Instance};
use crate::support::proptests::{proptest_runner, runtime_with_store, Lcg};
use crate::support::redis::RedisServer;

const SLICE: i64 = 1_000;
const NOW: i64 = 1_000_000;

fn variants() -> Vec<Board> {
    crate::support::boards::variants(SLICE, 4)
}

/// A random batch: ids partly reused from earlier batches, members a..f, two live slices,
/// refunds on boards that take them.
fn batch(rng: &mut Lcg, board: &Board, tag: &str, len: usize) -> Vec<ApplyEvent> {
    (0..len)
        .map(|i| {
            let id = if rng.next(6) == 0 {
                format!("b0-{}", rng.next(8))
            } else {
                format!("{tag}-{i}")
            };
            let member = ["a", "b", "c", "d", "e", "f"][rng.next(6) as usize];
            let ts = NOW - rng.next(2) as i64 * SLICE - rng.next(SLICE as u64) as i64;
            let mut amount = 1 + rng.next(9) as i64;
            if board.allow_negative && rng.next(4) == 0 {
                amount = -amount;
            }
            ev(&id, ts, member, amount)
        })
        .collect()
}

/// Puts a String where `key` is (keeping what was there under `key:saved`).
async fn break_key(store: &Store, key: &str) {
    let c = store.client();
    if c.exists::<i64, _>(key).await.expect("exists") == 1 {
        let _: () = c.rename(key, format!("{key}:saved")).await.expect("rename");
    }
    let _: () = c
        .set(key, "not-a-hash", None, None, false)
        .await
        .expect("set");
}

async fn restore_key(store: &Store, key: &str) {
    let c = store.client();
    let _: i64 = c.del(key).await.expect("del");
    let saved = format!("{key}:saved");
    if c.exists::<i64, _>(&saved).await.expect("exists") == 1 {
        let _: () = c.rename(&saved, key).await.expect("rename");
    }
}

/// The keys an event-by-event `fold.lua` call for `events` reads or writes on this board, once an
/// earlier call has written its digest table: not the legacy `seen` ZSet, which the table's
/// `#c` then rules out.
fn apply_keys(store: &Store, board: &Board, events: &[ApplyEvent]) -> Vec<String> {
    let k = store.instance(&board.widest(), None);
    let mut keys = vec![k.meta(), k.members(), k.slices(), k.seen_table()];
    match board.mode {
        Mode::Incremental => keys.push(k.result()),
        Mode::Resummarize => keys.push(k.totals()),
    }
    if board.allow_negative {
        keys.push(k.refs());
    }
    let mut slices: Vec<i64> = events.iter().map(|e| board.slice_of(e.ts)).collect();
    slices.sort();
    slices.dedup();
    keys.extend(slices.iter().map(|&n| k.slice(n)));
    keys.extend(slices.iter().map(|&n| k.seen_log(n)));
    keys
}

/// Compares the stored ranking with the model (resummarize boards after a roll).
async fn assert_model(store: &Store, board: &Board, model: &mut Instance, now: i64) {
    if board.mode == Mode::Resummarize {
        let report = roll_once(store, board, now).await;
        assert_eq!(report.instances_failed, 0, "{:?}", report.first_error);
        model.roll(&board.widest(), now);
    }
    assert_matches(store, &board.widest(), None, model, now).await;
    let d = verify_differences(store, board, None).await;
    assert!(d.is_empty(), "{:?}", d);
}

#[tokio::test]
async fn an_apply_that_fails_on_any_key_writes_nothing_and_its_retry_counts_every_event() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let mut calls = 0;
    for seed in 0..6u64 {
        for board in variants() {
            let _: () = store.client().flushall(false).await.expect("flush");
            let mut rng = Lcg(seed * 31 + board.name.len() as u64);
            let mut model = Instance::default();
            let first = batch(&mut rng, &board, "b0", 12);
            for e in &first {
                model.apply(&board.widest(), e, NOW);
            }
            apply_events(&store, &board, &first, NOW).await;
            let second = batch(&mut rng, &board, "b1", 12);
            for key in apply_keys(&store, &board, &second) {
                let before = snapshot(&store, &board).await;
                break_key(&store, &key).await;
                let failed = store.apply(&board, None, &second, NOW).await;
                assert!(failed.is_err(), "seed {seed} {}: {key} broken", board.name);
                let mut after = snapshot(&store, &board).await;
                after.remove(&key);
                let saved = after.remove(&format!("{key}:saved"));
                let mut expected = before.clone();
                let original = expected.remove(&key);
                assert_eq!(saved, original, "{key} kept aside intact");
                assert_eq!(
                    after, expected,
                    "seed {seed} {}: a failed call wrote (key {key} broken)",
                    board.name
                );
                restore_key(&store, &key).await;
                assert_eq!(snapshot(&store, &board).await, before);
                calls += 1;
            }
            let expected = model.apply_all(&board.widest(), &second, NOW);
            let got = apply_events(&store, &board, &second, NOW).await;
            assert_eq!(got, expected, "seed {seed} {}", board.name);
            assert_model(&store, &board, &mut model, NOW).await;
        }
    }
    assert!(calls >= 100, "{calls} failing calls tried");
}

#[tokio::test]
async fn an_expiry_that_fails_on_any_key_writes_nothing_and_the_next_roll_finishes() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    for seed in 0..4u64 {
        for board in variants() {
            let _: () = store.client().flushall(false).await.expect("flush");
            let mut rng = Lcg(seed * 17 + 3);
            let mut model = Instance::default();
            let events = batch(&mut rng, &board, "b0", 30);
            for e in &events {
                model.apply(&board.widest(), e, NOW);
            }
            apply_events(&store, &board, &events, NOW).await;
            // Two slices later the older of the two batch slices is dead.
            let later = NOW + 4 * SLICE;
            let k = store.instance(&board.widest(), None);
            let mut keys = vec![k.members()];
            match board.mode {
                Mode::Incremental => keys.push(k.result()),
                Mode::Resummarize => keys.push(k.totals()),
            }
            if board.allow_negative {
                keys.push(k.refs());
            }
            for key in keys {
                let before = snapshot(&store, &board).await;
                break_key(&store, &key).await;
                let report = roll_once(&store, &board, later).await;
                assert_eq!(
                    report.instances_failed, 1,
                    "{} with {key} broken",
                    board.name
                );
                let mut after = snapshot(&store, &board).await;
                after.remove(&key);
                after.remove(&format!("{key}:saved"));
                let mut expected = before.clone();
                expected.remove(&key);
                // Only the watermark (raised first, by design) may have moved.
                after.remove(&k.meta());
                expected.remove(&k.meta());
                assert_eq!(
                    after, expected,
                    "seed {seed} {}: a failed expiry wrote ({key} broken)",
                    board.name
                );
                restore_key(&store, &key).await;
            }
            let report = roll_once(&store, &board, later).await;
            assert_eq!(report.instances_failed, 0, "{:?}", report.first_error);
            model.roll(&board.widest(), later);
            assert_matches(&store, &board.widest(), None, &model, later).await;
            let d = verify_differences(&store, &board, None).await;
            assert!(d.is_empty(), "{:?}", d);
        }
    }
}

/// Events whose amounts cancel exactly: per member, tips and refunds of the same size in
/// the same slice or in different slices, plus ordinary tips.
fn cancelling() -> impl Strategy<Value = Vec<(u8, i64, i64, i64)>> {
    prop::collection::vec((0u8..4, 0i64..4, 0i64..4, 1i64..50), 1..14)
}

async fn refunds_roll_cleanly(store: &Store, board: &Board, plan: &[(u8, i64, i64, i64)]) {
    let _: () = store.client().flushall(false).await.expect("flush");
    let mut model = Instance::default();
    let mut events = Vec::new();
    for (i, (m, tip_slice, refund_slice, amount)) in plan.iter().enumerate() {
        let member = ["a", "b", "c", "d"][*m as usize];
        let tip_ts = NOW - tip_slice * SLICE - (i as i64 % 7);
        let refund_ts = NOW - refund_slice * SLICE - (i as i64 % 5);
        events.push(ev(&format!("t{i}"), tip_ts, member, *amount));
        events.push(ev(&format!("r{i}"), refund_ts, member, -amount));
        if i % 3 == 0 {
            events.push(ev(&format!("x{i}"), tip_ts, member, 1));
        }
    }
    let expected = model.apply_all(&board.widest(), &events, NOW);
    let got = apply_events(store, board, &events, NOW).await;
    assert_eq!(got, expected);
    let mut now = NOW;
    for _ in 0..6 {
        let report = roll_once(store, board, now).await;
        assert_eq!(
            report.instances_failed, 0,
            "{}: {:?}",
            board.name, report.first_error
        );
        model.roll(&board.widest(), now);
        assert_matches(store, &board.widest(), None, &model, now).await;
        let d = verify_differences(store, board, None).await;
        assert!(d.is_empty(), "{:?}", d);
        now += SLICE;
    }
    // Everything has left the window: nothing may stay behind.
    let k = store.instance(&board.widest(), None);
    for key in [k.result(), k.members(), k.refs(), k.totals(), k.slices()] {
        let left: i64 = store.client().exists(&key).await.expect("exists");
        assert_eq!(left, 0, "{} left {key} behind", board.name);
    }
}

#[test]
fn refunds_that_cancel_their_tips_exactly_roll_without_a_failure() {
    let (rt, _redis, store) = runtime_with_store();
    let boards: Vec<Board> = variants()
        .into_iter()
        .filter(|b| b.allow_negative)
        .collect();
    let mut runner = proptest_runner(48);
    runner
        .run(&cancelling(), |plan| {
            rt.block_on(async {
                for board in &boards {
                    refunds_roll_cleanly(&store, board, &plan).await;
                }
            });
            Ok(())
        })
        .expect("refunds roll cleanly");
}
