//! Where money used to leak: a script that fails half-way, a settings change between two
//! runs, refunds that cancel their tips exactly, and drift that rebuild must repair. Each
//! test runs over many random batches and every key a script touches.

use std::process::Command;

use fred::prelude::*;
use proptest::prelude::*;
use rollboard::board::{Board, Mode, TieBreak};
use rollboard::roll::{self, Job};
use rollboard::store::{ApplyEvent, Outcome, Store};
use tokio_util::sync::CancellationToken;

use crate::support::model::{assert_matches, Instance};
use crate::support::{board, ev, snapshot, write_config, RedisServer};

const SLICE: i64 = 1_000;
const NOW: i64 = 1_000_000;

/// A small deterministic generator, so a failing seed can be replayed.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % below
    }
}

fn variants() -> Vec<Board> {
    crate::support::variants(SLICE, 4)
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

/// The keys a call of `apply.lua` for `events` reads or writes on this board.
fn apply_keys(store: &Store, board: &Board, events: &[ApplyEvent]) -> Vec<String> {
    let k = store.instance(board, None);
    let mut keys = vec![k.meta(), k.members(), k.slices(), k.seen(), k.seen_table()];
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

async fn roll_once(store: &Store, board: &Board, now: i64) -> roll::Report {
    roll::run_once(
        store,
        std::slice::from_ref(board),
        Job::All,
        None,
        now,
        3,
        &CancellationToken::new(),
    )
    .await
    .expect("roll")
    .remove(0)
}

/// Compares the stored ranking with the model (resummarize boards after a roll).
async fn assert_model(store: &Store, board: &Board, model: &mut Instance, now: i64) {
    if board.mode == Mode::Resummarize {
        let report = roll_once(store, board, now).await;
        assert_eq!(report.instances_failed, 0, "{:?}", report.first_error);
        model.roll(board, now);
    }
    assert_matches(store, board, None, model, now).await;
    let v = roll::verify(store, board, None, 100).await.expect("verify");
    assert!(v.differences.is_empty(), "{:?}", v.differences);
}

#[tokio::test]
async fn an_apply_that_fails_on_any_key_writes_nothing_and_its_retry_counts_every_event() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let mut calls = 0;
    for seed in 0..6u64 {
        for board in variants() {
            let _: () = store.client().flushall(false).await.expect("flush");
            let mut rng = Lcg(seed * 31 + board.name.len() as u64);
            let mut model = Instance::default();
            let first = batch(&mut rng, &board, "b0", 12);
            for e in &first {
                model.apply(&board, e, NOW);
            }
            store.apply(&board, None, &first, NOW).await.expect("apply");
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
            let expected: Vec<Outcome> =
                second.iter().map(|e| model.apply(&board, e, NOW)).collect();
            let got = store
                .apply(&board, None, &second, NOW)
                .await
                .expect("apply");
            assert_eq!(got, expected, "seed {seed} {}", board.name);
            assert_model(&store, &board, &mut model, NOW).await;
        }
    }
    assert!(calls >= 100, "{calls} failing calls tried");
}

#[tokio::test]
async fn an_expiry_that_fails_on_any_key_writes_nothing_and_the_next_roll_finishes() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    for seed in 0..4u64 {
        for board in variants() {
            let _: () = store.client().flushall(false).await.expect("flush");
            let mut rng = Lcg(seed * 17 + 3);
            let mut model = Instance::default();
            let events = batch(&mut rng, &board, "b0", 30);
            for e in &events {
                model.apply(&board, e, NOW);
            }
            store
                .apply(&board, None, &events, NOW)
                .await
                .expect("apply");
            // Two slices later the older of the two batch slices is dead.
            let later = NOW + 4 * SLICE;
            let k = store.instance(&board, None);
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
            model.roll(&board, later);
            assert_matches(&store, &board, None, &model, later).await;
            let v = roll::verify(&store, &board, None, 100)
                .await
                .expect("verify");
            assert!(v.differences.is_empty(), "{:?}", v.differences);
        }
    }
}

#[tokio::test]
async fn a_board_whose_settings_changed_is_refused_before_anything_is_written() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let mut none = board("tips", SLICE, 4);
    none.tie_break = TieBreak::None;
    store
        .apply(&none, None, &[ev("1", NOW, "a", 5)], NOW)
        .await
        .expect("apply");
    let mut earliest = none.clone();
    earliest.tie_break = TieBreak::Earliest;
    let before = snapshot(&store, &none).await;
    let err = store
        .apply(
            &earliest,
            None,
            &[ev("2", NOW, "a", 3), ev("3", NOW, "b", 4)],
            NOW,
        )
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("tie_break=none"), "{err}");
    assert_eq!(snapshot(&store, &none).await, before);
    let err = roll::run_once(
        &store,
        std::slice::from_ref(&earliest),
        Job::All,
        None,
        NOW + 10 * SLICE,
        10,
        &CancellationToken::new(),
    )
    .await
    .expect("roll runs")
    .remove(0);
    assert_eq!(err.instances_failed, 1, "the roll refuses too");
    assert_eq!(snapshot(&store, &none).await, before);
    // No board-level record yet: the instance's own fingerprint is checked, and nothing
    // is recorded for a conflicting configuration.
    let conflicts = store
        .check_settings(std::slice::from_ref(&earliest))
        .await
        .expect("check");
    assert_eq!(conflicts.len(), 1);
    assert_eq!(conflicts[0].key, "rb:{tips}:meta");
    assert_eq!(
        store
            .client()
            .exists::<i64, _>("rb:board:tips:settings")
            .await
            .expect("exists"),
        0
    );
    assert_eq!(
        store.check_settings(&[none.clone()]).await.expect("check"),
        []
    );
    let conflicts = store.check_settings(&[earliest]).await.expect("check");
    assert_eq!(conflicts.len(), 1);
    assert_eq!(conflicts[0].setting, "tie_break");
    assert_eq!(conflicts[0].stored, "none");
    assert_eq!(conflicts[0].configured, "earliest");
}

#[tokio::test]
async fn the_cli_and_the_daemon_exit_64_naming_a_changed_setting() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("dir");
    let port = crate::support::free_port();
    let config = write_config(dir.path(), &redis, port, "a", "");
    let run = |config: &std::path::Path, args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_rollboard"))
            .arg("--config")
            .arg(config)
            .args(args)
            .env_remove("ROLLBOARD_CONFIG")
            .output()
            .expect("run rollboard")
    };
    let out = run(&config, &["top", "rooms_7d"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // Same boards, but tips_24h now breaks ties by the earliest time and slices by 2h.
    let text = std::fs::read_to_string(&config)
        .expect("read")
        .replace("tie_break = \"latest\"", "tie_break = \"earliest\"");
    let changed = dir.path().join("changed.toml");
    std::fs::write(&changed, text).expect("write");
    for args in [&["top", "rooms_7d"][..], &["verify"], &["run"]] {
        let out = run(&changed, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert!(
            err.contains("board tips_24h: tie_break is earliest") && err.contains("latest"),
            "{args:?}: {err}"
        );
        assert!(err.contains("new name"), "says the way out: {err}");
    }
    let out = run(&config, &["verify"]);
    assert_eq!(out.status.code(), Some(0), "the original config still runs");
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
    let expected: Vec<Outcome> = events.iter().map(|e| model.apply(board, e, NOW)).collect();
    let got = store.apply(board, None, &events, NOW).await.expect("apply");
    assert_eq!(got, expected);
    let mut now = NOW;
    for _ in 0..6 {
        let report = roll_once(store, board, now).await;
        assert_eq!(
            report.instances_failed, 0,
            "{}: {:?}",
            board.name, report.first_error
        );
        model.roll(board, now);
        assert_matches(store, board, None, &model, now).await;
        let v = roll::verify(store, board, None, 100).await.expect("verify");
        assert!(v.differences.is_empty(), "{:?}", v.differences);
        now += SLICE;
    }
    // Everything has left the window: nothing may stay behind.
    let k = store.instance(board, None);
    for key in [k.result(), k.members(), k.refs(), k.totals(), k.slices()] {
        let left: i64 = store.client().exists(&key).await.expect("exists");
        assert_eq!(left, 0, "{} left {key} behind", board.name);
    }
}

#[test]
fn refunds_that_cancel_their_tips_exactly_roll_without_a_failure() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let redis = RedisServer::start();
    let store = rt.block_on(redis.store("rb"));
    let boards: Vec<Board> = variants()
        .into_iter()
        .filter(|b| b.allow_negative)
        .collect();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 48,
        ..ProptestConfig::default()
    });
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

#[tokio::test]
async fn rebuild_repairs_every_difference_verify_lists() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    for board in variants() {
        let _: () = store.client().flushall(false).await.expect("flush");
        let events = vec![
            ev("1", NOW - 10, "a", 5),
            ev("2", NOW - 20, "b", 7),
            ev("3", NOW - SLICE, "c", 9),
            ev("4", NOW - SLICE, "b", 2),
        ];
        store
            .apply(&board, None, &events, NOW)
            .await
            .expect("apply");
        roll_once(&store, &board, NOW).await;
        let k = store.instance(&board, None);
        let c = store.client();
        // Damage: b's tie-break entry and ranking row lost, a's slice amount changed
        // behind the script's back, c's ranking score changed.
        // (`members` holds the tie-break time the ZSet member is made of.)
        let zmember = |ts: Option<String>, member: &str| {
            let ts = ts.expect("known").parse().unwrap_or_default();
            rollboard::query::encode_member(board.tie_break, member, ts)
        };
        let zb: Option<String> = c.hget(k.members(), "b").await.expect("hget");
        let zb = zmember(zb, "b");
        let _: i64 = c.hdel(k.members(), "b").await.expect("hdel");
        let ranking = k.result();
        let removed: i64 = c.zrem(&ranking, &zb).await.expect("zrem");
        assert_eq!(removed, 1, "b's ranking row");
        let _: i64 = c
            .hincrby(k.slice(board.slice_of(NOW - 10)), "a", 3)
            .await
            .expect("hincrby");
        let zc: Option<String> = c.hget(k.members(), "c").await.expect("hget");
        let _: f64 = c
            .zincrby(&ranking, 5.0, zmember(zc, "c"))
            .await
            .expect("zincrby");
        let v = roll::verify(&store, &board, None, 100)
            .await
            .expect("verify");
        let listed: Vec<&str> = v.differences.iter().map(|d| d.member.as_str()).collect();
        assert_eq!(listed, ["a", "b", "c"], "{}", board.name);
        let rebuilt = roll::rebuild(&store, &board, None, 2)
            .await
            .expect("rebuild");
        assert_eq!(rebuilt.estimated, ["b"], "{}", board.name);
        let v = roll::verify(&store, &board, None, 100)
            .await
            .expect("verify");
        assert!(
            v.differences.is_empty(),
            "{}: {:?}",
            board.name,
            v.differences
        );
        let totals: Vec<(String, Option<i64>)> = {
            let mut out = Vec::new();
            for m in ["a", "b", "c"] {
                let r = store.rank(&board, None, m, NOW).await.expect("rank");
                out.push((m.to_string(), r.total));
            }
            out
        };
        assert_eq!(
            totals,
            [
                ("a".to_string(), Some(8)),
                ("b".to_string(), Some(9)),
                ("c".to_string(), Some(9))
            ],
            "{}",
            board.name
        );
        // New events for the repaired member count on top of the repaired total.
        store
            .apply(&board, None, &[ev("5", NOW, "b", 1)], NOW)
            .await
            .expect("apply");
        roll_once(&store, &board, NOW).await;
        let r = store.rank(&board, None, "b", NOW).await.expect("rank");
        assert_eq!(r.total, Some(10), "{}", board.name);
    }
}
