//! The two-phase apply and expiry scripts and the consumer's per-instance retries: each
//! test tries one way of losing or double-counting money and checks the exact state against
//! the in-memory model.

use std::collections::HashMap;
use std::time::Duration;

use fred::prelude::*;
use rollboard::domain::board::{Board, Mode, MAX_TOTAL};
use rollboard::roll::{self};
use rollboard::store::{ApplyEvent, Outcome, Store, APPLY_CHUNK};

use crate::support::asserts::{
    assert_metrics, assert_state, assert_verified, ranked, verify_differences,
};
use crate::support::boards::{apply_events, ev, roll_all, set_string, snapshot, test_boards};
use crate::support::daemon::daemon_with;
use crate::support::events::{models_of_entries, stream_entries, xadd_all, Fields};
use crate::support::keys::{dead_letter_stream, intake_stream};
use crate::support::model::{assert_matches, assert_rolled_and_verified, Instance};
use crate::support::redis::RedisServer;
use crate::support::wait::{drained, wait_for};

const SLICE: i64 = 1_000;
/// Slices per window of the boards below: wide enough for events in many slices.
const N: i64 = 40;
const NOW: i64 = 1_000_000;

fn variants() -> Vec<Board> {
    crate::support::boards::variants(SLICE, N)
}

async fn roll_at(store: &Store, board: &Board, now: i64, chunk: usize) {
    roll_all(store, std::slice::from_ref(board), now, chunk).await;
}

/// Compares with the model; resummarize boards are rolled (at `now`) first.
async fn assert_model(store: &Store, board: &Board, model: &mut Instance, now: i64, chunk: usize) {
    if board.mode == Mode::Resummarize {
        roll_at(store, board, now, chunk).await;
        model.roll(&board.widest(), now);
    }
    assert_matches(store, &board.widest(), None, model, now).await;
    assert_verified(store, &board.widest(), None).await;
}

/// Moves `key` aside to `<key>:saved` and puts the string `value` where it was.
async fn break_with_string(store: &Store, key: &str, value: &str) {
    let _: () = store
        .client()
        .rename(key, format!("{key}:saved"))
        .await
        .expect("rename");
    set_string(store, key, value).await;
}

/// Moves `<key>:saved` back to `key`.
async fn restore_saved(store: &Store, key: &str) {
    let _: () = store
        .client()
        .rename(format!("{key}:saved"), key)
        .await
        .expect("rename");
}

// Guards a break this test found: the event-by-event script used to type-check `result`
// only through `ZMSCORE result <zmembers>`, run only when some member of the chunk already had a
// `members` entry (and never read `meta.gen`). A chunk of members new to the instance
// then wrote `meta`, `seen`, the slice, the registry and `members` before `ZADD result`
// failed with WRONGTYPE, and the retry answered `Duplicate` for every event: money in the
// slices that the ranking never counted. Phase 1 now reads every key phase 2 writes.
#[tokio::test]
async fn a_failed_apply_of_new_members_writes_nothing() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let mut wrote = Vec::new();
    for b in variants() {
        let k = store.instance(&b.widest(), None);
        // Keys every call writes, broken one at a time, on an instance whose chunk holds
        // only members it has never seen.
        let mut breakers: Vec<(&str, String)> = vec![("meta.gen", k.meta())];
        if b.mode == Mode::Incremental {
            breakers.push(("result", k.result()));
        }
        for (what, key) in breakers {
            let _: () = store.client().flushall(false).await.expect("flush");
            let mut model = Instance::default();
            let first = [ev("old", NOW - 5, "zed", 3)];
            for e in &first {
                model.apply(&b.widest(), e, NOW);
            }
            apply_events(&store, &b, &first, NOW).await;
            if what == "meta.gen" {
                let _: () = store
                    .client()
                    .hset(&key, ("gen", "not-a-number"))
                    .await
                    .expect("hset");
            } else {
                break_with_string(&store, &key, "not-a-zset").await;
            }
            let before = snapshot(&store, &b).await;
            let events = [
                ev("n1", NOW - 10, "new-a", 5),
                ev("n2", NOW - SLICE, "new-b", 7),
            ];
            let failed = store.apply(&b, None, &events, NOW).await;
            assert!(failed.is_err(), "{} with {what} broken: {failed:?}", b.name);
            let after = snapshot(&store, &b).await;
            let changed: std::collections::BTreeSet<&String> = after
                .keys()
                .chain(before.keys())
                .filter(|key| after.get(*key) != before.get(*key))
                .collect();
            if !changed.is_empty() {
                wrote.push(format!("{} with {what} broken: {changed:?}", b.name));
            }
            // Put the key right; the same events then count, once.
            if what == "meta.gen" {
                let _: () = store.client().hset(&key, ("gen", "7")).await.expect("hset");
            } else {
                let _: i64 = store.client().del(&key).await.expect("del");
                restore_saved(&store, &key).await;
            }
            let expected = model.apply_all(&b.widest(), &events, NOW);
            let got = apply_events(&store, &b, &events, NOW).await;
            if got != expected {
                // Listed for the report; a resummarize ranking also lags until its next roll.
                let v = roll::verify(&store, &b.widest(), None, 100)
                    .await
                    .expect("verify");
                wrote.push(format!(
                    "{} after {what} was restored: the retry answered {got:?}, not {expected:?}; verify: {:?}",
                    b.name, v.differences
                ));
                continue;
            }
            assert_model(&store, &b, &mut model, NOW, 100).await;
        }
    }
    assert!(
        wrote.is_empty(),
        "failed calls wrote:\n{}",
        wrote.join("\n")
    );
}

/// Awkward member names: a separator, a fake tie-break prefix, unicode, 256 bytes.
fn names() -> Vec<String> {
    vec![
        "room:42:vip".into(),
        "0000000000000001:fake".into(),
        "ünïcødé 🎉".into(),
        "é".repeat(128),
        "z".repeat(256),
        "a".into(),
        "b".into(),
        "big".into(),
    ]
}

/// Seven hundred events for one instance (three apply calls) over every live slice, with:
/// ids reused across the 256-event boundary with other fields, an id of the first call
/// reused in the third, late copies of live ids, totals driven to exactly 2^53 - 1 and
/// past it across calls, and (on boards that take them) refunds to exactly 0 in one slice
/// and across slices.
fn long_instance(board: &Board) -> Vec<ApplyEvent> {
    let names = names();
    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |below: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % below
    };
    let live_ts = |slice_back: u64, jitter: u64| NOW - slice_back as i64 * SLICE - jitter as i64;
    let mut events: Vec<ApplyEvent> = (0..700)
        .map(|i| {
            let member = &names[next(7) as usize];
            let mut amount = 1 + next(50) as i64;
            if board.allow_negative && next(3) == 0 {
                amount = -amount;
            }
            ev(
                &format!("e{i}"),
                live_ts(next(N as u64 - 1), next(SLICE as u64)),
                member,
                amount,
            )
        })
        .collect();
    let chunk = APPLY_CHUNK;
    // Across the first boundary: event chunk+j repeats the id of event chunk-1-j with other
    // fields; the first applied wins.
    for j in 0..8 {
        let id = events[chunk - 1 - j].id.clone();
        events[chunk + j] = ev(&id, live_ts(j as u64, 3), "a", 1000 + j as i64);
    }
    // An id of the first call in the third, and a late copy of a live id (late wins).
    events[2 * chunk + 5] = ev("e3", NOW, "b", 999);
    events[2 * chunk + 6] = ev("e4", NOW - (N + 2) * SLICE, "b", 1);
    events[2 * chunk + 7] = ev("late-only", NOW - (N + 1) * SLICE, "b", 1);
    // "big": to the limit and past it across calls; an overflowing event is not
    // remembered, so its id counts when it comes back with an amount that fits.
    events[chunk / 2] = ev("big1", live_ts(3, 0), "big", MAX_TOTAL - 10);
    events[chunk + chunk / 2 + 4] = ev("big2", live_ts(2, 0), "big", 4);
    events[chunk + chunk / 2 + 5] = ev("big3", live_ts(1, 0), "big", 7);
    events[2 * chunk + 1] = ev("big3", live_ts(1, 1), "big", 6);
    events[2 * chunk + 2] = ev("big4", live_ts(1, 2), "big", 1);
    if board.allow_negative {
        // Down by the whole limit to 0, then a slice that would pass -(2^53 - 1).
        events[2 * chunk + 3] = ev("big5", live_ts(0, 5), "big", -MAX_TOTAL);
        events[2 * chunk + 4] = ev("big6", live_ts(0, 6), "big", -MAX_TOTAL);
        events[2 * chunk + 8] = ev("big7", live_ts(0, 7), "big", -1);
        // Refunds to exactly 0: in one slice, and across slices.
        events[10] = ev("zero1", live_ts(5, 1), "zero-one-slice", 17);
        events[chunk + 10] = ev("zero2", live_ts(5, 2), "zero-one-slice", -17);
        events[11] = ev("zero3", live_ts(9, 1), "zero-across", 23);
        events[chunk + 11] = ev("zero4", live_ts(4, 1), "zero-across", -20);
        events[2 * chunk + 11] = ev("zero5", live_ts(2, 1), "zero-across", -3);
    }
    events
}

#[tokio::test]
async fn long_instances_across_apply_calls_equal_the_model_through_every_roll() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    for b in variants() {
        for chunk in [1usize, 2, 1000] {
            let _: () = store.client().flushall(false).await.expect("flush");
            let events = long_instance(&b);
            assert!(events.len() > 2 * APPLY_CHUNK);
            let mut model = Instance::default();
            let expected = model.apply_all(&b.widest(), &events, NOW);
            let got = apply_events(&store, &b, &events, NOW).await;
            if let Some(i) = (0..events.len()).find(|&i| got[i] != expected[i]) {
                panic!(
                    "{}: event {i} {:?}: stored {:?}, model {:?}",
                    b.name, events[i], got[i], expected[i]
                );
            }
            let count = |o: Outcome| expected.iter().filter(|x| **x == o).count();
            assert!(count(Outcome::Overflow) >= 2, "{}: overflow tried", b.name);
            assert!(
                count(Outcome::Duplicate) >= 9,
                "{}: duplicates tried",
                b.name
            );
            assert_eq!(count(Outcome::Late), 2, "{}", b.name);
            assert_model(&store, &b, &mut model, NOW, chunk).await;
            // Redelivered as a whole: what was applied is a duplicate now, and an event
            // that overflowed is judged again against the new totals.
            let expected = model.apply_all(&b.widest(), &events, NOW);
            let again = apply_events(&store, &b, &events, NOW).await;
            assert_eq!(again, expected, "{}: redelivered", b.name);
            assert_model(&store, &b, &mut model, NOW, chunk).await;
            // Roll through the whole window, a few slices at a time.
            let mut now = NOW;
            while now <= NOW + (N + 1) * SLICE {
                now += 7 * SLICE;
                roll_at(&store, &b, now, chunk).await;
                assert_rolled_and_verified(&store, &b, &mut model, now).await;
            }
            let k = store.instance(&b.widest(), None);
            for key in [k.result(), k.members(), k.refs(), k.totals(), k.slices()] {
                let left: i64 = store.client().exists(&key).await.expect("exists");
                assert_eq!(left, 0, "{} (chunk {chunk}) left {key} behind", b.name);
            }
        }
    }
}

fn fields(pairs: &[(&str, String)]) -> Fields {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

type Entries = Vec<(String, HashMap<String, String>)>;

async fn dead_letters(store: &Store) -> Entries {
    store
        .client()
        .xrange(dead_letter_stream(), "-", "+", None)
        .await
        .expect("xrange")
}

/// A dead letter as the operator re-appends it: original fields, `id` = the original id
/// (or the source entry ID, the idempotency key of an event that had none).
fn reappended(entry: &HashMap<String, String>) -> Fields {
    let mut out: Fields = entry
        .iter()
        .filter(|(k, _)| !["reason", "detail", "source_id", "source_stream"].contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !entry.contains_key("id") {
        out.push(("id".into(), entry["source_id"].clone()));
    }
    out.sort();
    out
}

/// The stream's entries in order.
async fn stream(store: &Store) -> Vec<(String, Fields)> {
    stream_entries(store, intake_stream())
        .await
        .into_iter()
        .map(|(id, f)| (id, f.into_iter().collect()))
        .collect()
}

/// Checks every instance of the stream's model; resummarize instances once the job ran.
async fn assert_stream_model(store: &Store, boards: &[Board]) {
    let now = rollboard::domain::clock::local_ms();
    assert_state(
        store,
        boards,
        &models_of_entries(&stream(store).await, boards, now),
        now,
    )
    .await;
}

/// Tips to rooms r1 and r2 (rooms_7d, and fans_7d scoped by room); every third without
/// an `id`.
fn tips(from: usize, to: usize, now: i64) -> Vec<Fields> {
    (from..to)
        .map(|i| {
            let mut f = fields(&[
                ("room", format!("r{}", 1 + i % 2)),
                ("user", format!("u{}", i % 5)),
                ("amount", (1 + i % 9).to_string()),
                ("ts", (now - i as i64 * 1_000).to_string()),
            ]);
            if i % 3 != 0 {
                f.push(("id".into(), format!("t{i}")));
            }
            f
        })
        .collect()
}

#[tokio::test]
async fn a_broken_scoped_instance_is_dead_lettered_and_its_replay_counts_once() {
    let (redis, _dir, daemon, _config) = daemon_with("").await;
    let store = redis.store("rb").await;
    let boards = test_boards();
    let now = rollboard::domain::clock::local_ms();
    // r1's instance holds data first (an empty instance is cleaned up by the next roll,
    // which would delete the broken key and repair it by accident).
    xadd_all(store.client(), intake_stream(), &tips(0, 10, now)).await;
    assert!(drained(&store).await, "log:\n{}", daemon.logs());
    // Then fans_7d of room r1 gets a String where its `members` Hash belongs.
    let broken = store.instance(&boards[1].widest(), Some("r1")).members();
    break_with_string(&store, &broken, "oops").await;
    let first = tips(10, 50, now);
    xadd_all(store.client(), intake_stream(), &first).await;
    assert!(drained(&store).await, "log:\n{}", daemon.logs());
    let dead = dead_letters(&store).await;
    let r1: Vec<&Fields> = first.iter().filter(|f| f[0].1 == "r1").collect();
    let sources: std::collections::BTreeSet<&str> =
        dead.iter().map(|(_, d)| d["source_id"].as_str()).collect();
    assert_eq!(
        sources.len(),
        r1.len(),
        "every r1 tip dead-lettered: {dead:?}"
    );
    for (_, d) in &dead {
        assert_eq!(d["reason"], "apply_failed", "{d:?}");
        assert_eq!(d["room"], "r1");
        assert!(d["detail"].contains("fans_7d"), "{d:?}");
    }
    let (status, body) = daemon.get("/readyz").await;
    assert_eq!(status, 200, "the other boards still work: {body}");
    let ready: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(ready["failing_boards"], serde_json::json!(["fans_7d"]));
    assert_metrics(&daemon, &["rollboard_board_apply_failing{board=fans_7d} 1"]).await;
    // rooms_7d counted every tip, r1's included; fans_7d of r2 every r2 tip.
    let rooms = &boards[0];
    let models = models_of_entries(&stream(&store).await, &boards, now);
    let rooms_model = &models[&(0, None)];
    let fans_r2 = &models[&(1, Some("r2".to_string()))];
    assert_matches(&store, &rooms.widest(), None, rooms_model, now).await;
    let fans = &boards[1];
    let expected = fans_r2.ranking(fans);
    assert!(
        wait_for(Duration::from_secs(10), || async {
            ranked(&store, fans, Some("r2"), now).await == expected
        })
        .await,
        "fans_7d r2 never caught up"
    );
    // Repair and replay: r1's fans count once, rooms_7d does not count them again.
    let _: i64 = store.client().del(&broken).await.expect("del");
    restore_saved(&store, &broken).await;
    let replay: Vec<Fields> = dead.iter().map(|(_, d)| reappended(d)).collect();
    xadd_all(store.client(), intake_stream(), &replay).await;
    assert!(drained(&store).await, "log:\n{}", daemon.logs());
    assert_eq!(
        dead_letters(&store).await.len(),
        dead.len(),
        "no new dead letter"
    );
    assert_stream_model(&store, &boards).await;
    let d = verify_differences(&store, rooms, None).await;
    assert!(d.is_empty(), "{:?}", d);
    assert_eq!(daemon.terminate().await.code(), Some(0));
    // Guards a break this test found (intermittently): the consumer reads the next batch
    // while applying this one; when this one took longer than `claim_idle` (here the
    // retries of the broken instance, 0.1 + 0.2 + 0.4 + 0.8 s against 1 s), the next
    // step's XAUTOCLAIM took the read-ahead entries back from this very consumer and
    // processed them, then the step processed them again: dead letters written twice.
    // The claim now skips the entries held read ahead.
    assert_eq!(
        sources.len(),
        dead.len(),
        "one dead letter per event: {} dead letters for {} events",
        dead.len(),
        sources.len()
    );
}

// Guards the same break as `a_failed_apply_of_new_members_writes_nothing`, seen through
// the daemon: tips_24h's `result` is a String before its first event. The first apply
// attempt used to write `seen`, the slices and `members` before failing, so the replayed
// dead letters were all duplicates and their money never reached the ranking.
#[tokio::test]
async fn a_board_whose_result_key_is_broken_dead_letters_its_events() {
    let (redis, _dir, daemon, _config) = daemon_with("").await;
    let store = redis.store("rb").await;
    let boards = test_boards();
    let tips_24h = &boards[2];
    let now = rollboard::domain::clock::local_ms();
    let broken = store.instance(&tips_24h.widest(), None).result();
    set_string(&store, &broken, "oops").await;
    let payments: Vec<Fields> = (0..10)
        .map(|i| {
            fields(&[
                ("user", format!("p{i}")),
                ("value", format!("{}.25", 1 + i)),
                ("id", format!("pay{i}")),
                ("ts", (now - i as i64 * 1_000).to_string()),
            ])
        })
        .collect();
    xadd_all(store.client(), intake_stream(), &payments).await;
    assert!(drained(&store).await, "log:\n{}", daemon.logs());
    let dead = dead_letters(&store).await;
    let reasons: Vec<&str> = dead.iter().map(|(_, d)| d["reason"].as_str()).collect();
    let seen = crate::support::boards::seen_table(&store, &tips_24h.widest(), None)
        .await
        .len();
    assert_eq!(
        reasons,
        vec!["apply_failed"; payments.len()],
        "every payment is dead-lettered while tips_24h cannot apply ({seen} ids were \
         remembered as applied, {} counted as duplicates)",
        daemon
            .metric(
                "rollboard_events_skipped_total",
                &[("board", "tips_24h"), ("reason", "duplicate")]
            )
            .await
    );
    // Put the key right and replay the dead letters: each payment must count once.
    let _: i64 = store.client().del(&broken).await.expect("del");
    let replay: Vec<Fields> = dead.iter().map(|(_, d)| reappended(d)).collect();
    xadd_all(store.client(), intake_stream(), &replay).await;
    assert!(drained(&store).await, "log:\n{}", daemon.logs());
    let d = verify_differences(&store, tips_24h, None).await;
    assert!(
        d.is_empty(),
        "replayed payments are in the slices but not in the ranking: {:?}",
        d
    );
    assert_stream_model(&store, &boards).await;
    assert_eq!(daemon.terminate().await.code(), Some(0));
}
