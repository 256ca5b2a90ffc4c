//! Rolling the window: expiry, catch-up, resummarize, rebuild and verify, exactly once
//! under concurrency and crashes, against a real Redis and the in-memory model.

use std::collections::HashMap;
use std::time::Duration;

use fred::prelude::*;
use proptest::prelude::*;
use rollboard::board::{Board, Mode, TieBreak};
use rollboard::roll;
use rollboard::store::{ApplyEvent, Outcome, Store};

use crate::support::model::{assert_matches, Instance};
use crate::support::{board, ev, roll_all, wait_for, RedisServer};

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;
const T0: i64 = 1_763_700_000_000;

async fn assert_verified(store: &Store, board: &Board, scope: Option<&str>) {
    let v = roll::verify(store, board, scope, 100)
        .await
        .expect("verify");
    assert!(
        v.differences.is_empty(),
        "verify {}{scope:?}: {:?}",
        board.name,
        v.differences
    );
}

#[tokio::test]
async fn expiry_subtracts_each_dead_slice_and_forgets_its_members() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let b = board("rooms", HOUR, 3);
    let s0 = b.slice_of(T0) * HOUR;
    let events = [
        ev("1", s0, "a", 5),
        ev("2", s0 + HOUR, "a", 7),
        ev("3", s0 + HOUR, "b", 2),
        ev("4", s0 + 2 * HOUR, "c", 1),
    ];
    store.apply(&b, None, &events, s0 + 2 * HOUR).await.unwrap();
    let mut model = Instance::default();
    for e in &events {
        model.apply(&b, e, s0 + 2 * HOUR);
    }
    // At s0 + 3h the first slice leaves the window.
    let reports = roll_all(&store, std::slice::from_ref(&b), s0 + 3 * HOUR, 2).await;
    assert_eq!(
        (
            reports[0].slices_expired,
            reports[0].fields_expired,
            reports[0].members_removed
        ),
        (1, 1, 0)
    );
    model.roll(&b, s0 + 3 * HOUR);
    assert_matches(&store, &b, None, &model, s0 + 3 * HOUR).await;
    assert_eq!(
        store
            .rank(&b, None, "a", s0 + 3 * HOUR)
            .await
            .unwrap()
            .total,
        Some(7)
    );
    // Then the second: a and b leave the ranking and the members map.
    let reports = roll_all(&store, std::slice::from_ref(&b), s0 + 4 * HOUR, 2).await;
    assert_eq!(
        (reports[0].slices_expired, reports[0].members_removed),
        (1, 2)
    );
    model.roll(&b, s0 + 4 * HOUR);
    assert_matches(&store, &b, None, &model, s0 + 4 * HOUR).await;
    assert_eq!(redis.cli(&["HLEN", "rb:{rooms}:members"]).trim(), "1");
    assert_eq!(redis.cli(&["ZCARD", "rb:{rooms}:slices"]).trim(), "1");
    assert_eq!(
        redis
            .cli(&["EXISTS", &format!("rb:{{rooms}}:slice:{}", s0 / HOUR)])
            .trim(),
        "0"
    );
    assert_eq!(
        redis
            .cli(&["HGET", "rb:{rooms}:meta", "expired_through"])
            .trim(),
        (s0 / HOUR + 1).to_string()
    );
    assert_verified(&store, &b, None).await;
}

#[tokio::test]
async fn a_roll_at_an_earlier_time_changes_nothing() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let b = board("rooms", HOUR, 3);
    store
        .apply(&b, None, &[ev("1", T0, "a", 5)], T0)
        .await
        .unwrap();
    roll_all(&store, std::slice::from_ref(&b), T0 + 10 * HOUR, 10).await;
    let w = redis.cli(&["HGET", "rb:{rooms}:meta", "expired_through"]);
    roll_all(&store, std::slice::from_ref(&b), T0, 10).await;
    assert_eq!(
        redis.cli(&["HGET", "rb:{rooms}:meta", "expired_through"]),
        w
    );
    // An empty board still records its watermark.
    let empty = board("empty", HOUR, 3);
    roll_all(&store, std::slice::from_ref(&empty), T0, 10).await;
    assert_eq!(
        redis
            .cli(&["HGET", "rb:{empty}:meta", "expired_through"])
            .trim(),
        (T0 / HOUR - 3).to_string()
    );
}

#[tokio::test]
async fn late_events_never_land_in_a_dead_slice() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let b = board("rooms", HOUR, 4);
    store
        .apply(&b, None, &[ev("1", T0, "a", 5)], T0)
        .await
        .unwrap();
    // A roll ahead of the clock raises the watermark past slice_of(T0).
    roll_all(&store, std::slice::from_ref(&b), T0 + 5 * HOUR, 10).await;
    let out = store
        .apply(
            &b,
            None,
            &[ev("2", T0, "a", 5), ev("3", T0 + 2 * HOUR, "a", 1)],
            T0,
        )
        .await
        .unwrap();
    assert_eq!(out, vec![Outcome::Late, Outcome::Applied]);
    assert_eq!(
        redis
            .cli(&["EXISTS", &format!("rb:{{rooms}}:slice:{}", T0 / HOUR)])
            .trim(),
        "0"
    );
    assert_eq!(store.rank(&b, None, "a", T0).await.unwrap().total, Some(1));
}

#[tokio::test]
async fn catch_up_after_ten_days_equals_the_model() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let mut inc = board("inc", HOUR, 72);
    inc.allow_negative = true;
    let mut res = board("res", 6 * HOUR, 4 * 7);
    res.mode = Mode::Resummarize;
    res.scope = Some("room".into());
    let boards = vec![inc, res];
    let mut models: HashMap<(usize, Option<String>), Instance> = HashMap::new();
    let mut i = 0;
    for hour in 0..(10 * 24) {
        let now = T0 + hour * HOUR;
        for (bi, b) in boards.iter().enumerate() {
            let scope = b.scope.as_ref().map(|_| format!("r{}", hour % 3));
            let events: Vec<ApplyEvent> = (0..4)
                .map(|k| {
                    i += 1;
                    let amount = if b.allow_negative && i % 9 == 0 {
                        -2
                    } else {
                        1 + i % 4
                    };
                    ev(
                        &format!("e{i}"),
                        now - k * 600_000,
                        &format!("m{}", (i * 7) % 11),
                        amount,
                    )
                })
                .collect();
            let model = models.entry((bi, scope.clone())).or_default();
            let expected: Vec<Outcome> = events.iter().map(|e| model.apply(b, e, now)).collect();
            assert_eq!(
                store
                    .apply(b, scope.as_deref(), &events, now)
                    .await
                    .unwrap(),
                expected
            );
        }
    }
    let end = T0 + 10 * DAY;
    let reports = roll_all(&store, &boards, end, 7).await;
    assert!(reports[0].slices_expired >= 10 * 24 - 72 - 1, "{reports:?}");
    for ((bi, scope), model) in &mut models {
        model.roll(&boards[*bi], end);
        assert_matches(&store, &boards[*bi], scope.as_deref(), model, end).await;
        assert_verified(&store, &boards[*bi], scope.as_deref()).await;
    }
}

#[tokio::test]
async fn two_rollers_subtract_every_amount_exactly_once() {
    let redis = RedisServer::start();
    let b = board("rooms", HOUR, 2);
    let setup = redis.store("rb").await;
    let mut model = Instance::default();
    // 6000 members in the dead slice, 300 of them also live later.
    let dead: Vec<ApplyEvent> = (0..6000)
        .map(|i| ev(&format!("d{i}"), T0, &format!("m{i}"), 1 + i % 3))
        .collect();
    let live: Vec<ApplyEvent> = (0..300)
        .map(|i| ev(&format!("l{i}"), T0 + HOUR, &format!("m{i}"), 10))
        .collect();
    for chunk in dead.chunks(500).chain(live.chunks(500)) {
        let out = setup.apply(&b, None, chunk, T0 + HOUR).await.unwrap();
        assert!(out.iter().all(|o| *o == Outcome::Applied));
        for e in chunk {
            model.apply(&b, e, T0 + HOUR);
        }
    }
    let at = T0 + 2 * HOUR;
    let mut tasks = Vec::new();
    for chunk in [37usize, 50] {
        let store = redis.store("rb").await;
        let b = b.clone();
        tasks.push(tokio::spawn(async move {
            roll_all(&store, &[b], at, chunk).await
        }));
    }
    let mut fields = 0;
    for t in tasks {
        fields += t.await.unwrap()[0].fields_expired;
    }
    assert_eq!(fields, 6000, "each field expired by exactly one roller");
    model.roll(&b, at);
    assert_matches(&setup, &b, None, &model, at).await;
    assert_verified(&setup, &b, None).await;
}

fn config_file(dir: &std::path::Path, url: &str, chunk: usize) -> std::path::PathBuf {
    let path = dir.join("rollboard.toml");
    let text = format!(
        "[redis]\nurl = \"{url}\"\n[schedule]\nchunk = {chunk}\n\
         [[boards]]\nname = \"rooms\"\nmember = \"user\"\nwindow = \"2h\"\nslice = \"1h\"\n"
    );
    std::fs::write(&path, text).expect("config");
    path
}

#[tokio::test]
async fn a_roll_killed_mid_slice_then_rerun_ends_in_the_model_state() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let b = board("rooms", HOUR, 2);
    let mut model = Instance::default();
    let n = 60_000;
    let dead: Vec<ApplyEvent> = (0..n)
        .map(|i| ev(&format!("d{i}"), T0, &format!("m{i}"), 1 + i % 5))
        .collect();
    let live: Vec<ApplyEvent> = (0..2000)
        .map(|i| ev(&format!("l{i}"), T0 + HOUR, &format!("m{i}"), 3))
        .collect();
    for chunk in dead.chunks(1000).chain(live.chunks(1000)) {
        store.apply(&b, None, chunk, T0 + HOUR).await.unwrap();
        for e in chunk {
            model.apply(&b, e, T0 + HOUR);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), &redis.url(), 20);
    let at = (T0 + 2 * HOUR).to_string();
    let slice_key = format!("rb:{{rooms}}:slice:{}", T0 / HOUR);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_rollboard"))
        .args(["--config", config.to_str().unwrap(), "roll", "--at", &at])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn rollboard roll");
    let client = store.client().clone();
    let key = slice_key.clone();
    let started = wait_for(Duration::from_secs(60), || {
        let client = client.clone();
        let key = key.clone();
        async move { client.hlen::<i64, _>(&key).await.unwrap_or(0) < n - 500 }
    })
    .await;
    assert!(started, "the roll never started expiring");
    child.start_kill().expect("kill");
    let _ = child.wait().await;
    let left: i64 = store.client().hlen(&slice_key).await.unwrap();
    assert!(left > 0, "killed too late to test a crash mid-slice");
    // The result is now partly subtracted: rerun the roll.
    let status = tokio::process::Command::new(env!("CARGO_BIN_EXE_rollboard"))
        .args(["--config", config.to_str().unwrap(), "roll", "--at", &at])
        .stdout(std::process::Stdio::null())
        .status()
        .await
        .unwrap();
    assert!(status.success());
    model.roll(&b, T0 + 2 * HOUR);
    assert_matches(&store, &b, None, &model, T0 + 2 * HOUR).await;
    assert_verified(&store, &b, None).await;
}

#[tokio::test]
async fn verify_finds_drift_and_rebuild_repairs_it() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let mut b = board("rooms", HOUR, 24);
    b.tie_break = TieBreak::Latest;
    let events: Vec<ApplyEvent> = (0..50)
        .map(|i| {
            ev(
                &format!("e{i}"),
                T0 - i * 60_000,
                &format!("m{}", i % 9),
                1 + i,
            )
        })
        .collect();
    store.apply(&b, None, &events, T0).await.unwrap();
    let mut model = Instance::default();
    for e in &events {
        model.apply(&b, e, T0);
    }
    let before = store.top(&b, None, 0, 100, T0).await.unwrap();
    // Corrupt: bump one member's score and add a stranger. (`members` holds the
    // tie-break time the ZSet member is made of.)
    let ts: String = store
        .client()
        .hget("rb:{rooms}:members", "m3")
        .await
        .unwrap();
    let z = rollboard::query::encode_member(b.tie_break, "m3", ts.parse().unwrap());
    let _: f64 = store
        .client()
        .zincrby("rb:{rooms}:result", 5.0, &z)
        .await
        .unwrap();
    let _: i64 = store
        .client()
        .zadd(
            "rb:{rooms}:result",
            None,
            None,
            false,
            false,
            (9.0, "0000000000000001:ghost"),
        )
        .await
        .unwrap();
    let v = roll::verify(&store, &b, None, 10).await.unwrap();
    let drifted: Vec<&str> = v.differences.iter().map(|d| d.member.as_str()).collect();
    assert_eq!(drifted, ["ghost", "m3"]);
    assert!(v.fails(false));
    let m3 = &v.differences[1];
    assert_eq!(m3.stored.unwrap() - m3.expected.unwrap(), 5);
    // The CLI says the same with exit status 1.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        format!("[redis]\nurl = \"{}\"\n[[boards]]\nname = \"rooms\"\nmember = \"user\"\nwindow = \"24h\"\nslice = \"1h\"\ntie_break = \"latest\"\n", redis.url()),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rollboard"))
        .args(["--config", config.to_str().unwrap(), "verify"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ghost"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rollboard"))
        .args(["--config", config.to_str().unwrap(), "rebuild", "rooms"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_verified(&store, &b, None).await;
    assert_eq!(store.top(&b, None, 0, 100, T0).await.unwrap(), before);
    assert_matches(&store, &b, None, &model, T0).await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rollboard"))
        .args(["--config", config.to_str().unwrap(), "verify"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
}

#[tokio::test]
async fn an_emptied_scope_leaves_the_registry_and_redis() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let mut b = board("fans", HOUR, 2);
    b.scope = Some("room".into());
    b.mode = Mode::Resummarize;
    store
        .apply(&b, Some("old"), &[ev("1", T0, "u", 1)], T0)
        .await
        .unwrap();
    store
        .apply(
            &b,
            Some("new"),
            &[ev("2", T0 + 3 * HOUR, "u", 1)],
            T0 + 3 * HOUR,
        )
        .await
        .unwrap();
    let reports = roll_all(&store, std::slice::from_ref(&b), T0 + 3 * HOUR, 10).await;
    assert_eq!(reports[0].scopes_removed, 1);
    assert_eq!(store.scopes(&b).await.unwrap(), ["new"]);
    assert_eq!(
        redis.cli(&["KEYS", "rb:{fans:old}*"]).trim(),
        "rb:{fans:old}:meta",
        "only the watermark stays"
    );
    assert_eq!(
        store
            .top(&b, Some("new"), 0, 10, T0 + 3 * HOUR)
            .await
            .unwrap()
            .count,
        1
    );
    // A copy of the old event, even judged at an old clock, is late: time never goes back.
    let out = store
        .apply(&b, Some("old"), &[ev("1", T0, "u", 1)], T0)
        .await
        .unwrap();
    assert_eq!(out, vec![Outcome::Late]);
}

#[tokio::test]
async fn verify_and_rebuild_see_a_slice_that_a_cancelled_roll_left_behind() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let b = board("rooms", HOUR, 2);
    let events = [
        ev("1", T0, "alice", 10),
        ev("2", T0 + HOUR, "alice", 5),
        ev("3", T0 + HOUR, "bob", 3),
    ];
    store.apply(&b, None, &events, T0 + HOUR).await.unwrap();
    let mut model = Instance::default();
    for e in &events {
        model.apply(&b, e, T0 + HOUR);
    }
    // A roll that raised the watermark and was stopped before its first chunk.
    let (w, dead) = store
        .raise_watermark(&b, None, b.slice_of(T0), T0 + 2 * HOUR)
        .await
        .unwrap();
    assert_eq!((w, dead.len()), (b.slice_of(T0), 1));
    assert_verified(&store, &b, None).await;
    roll::rebuild(&store, &b, None, 10).await.unwrap();
    assert_eq!(
        store
            .rank(&b, None, "alice", T0 + HOUR)
            .await
            .unwrap()
            .total,
        Some(15),
        "nothing subtracted yet"
    );
    // The next roll finishes the slice: exactly the model.
    roll_all(&store, std::slice::from_ref(&b), T0 + 2 * HOUR, 10).await;
    model.roll(&b, T0 + 2 * HOUR);
    assert_matches(&store, &b, None, &model, T0 + 2 * HOUR).await;
    assert_verified(&store, &b, None).await;
}

#[tokio::test]
async fn a_swap_that_runs_twice_changes_nothing_the_second_time() {
    use rollboard::store::{StageTargets, Staged, SwapCheck};
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let mut b = board("res", HOUR, 3);
    b.mode = Mode::Resummarize;
    store
        .apply(&b, None, &[ev("1", T0, "a", 5)], T0)
        .await
        .unwrap();
    let targets = StageTargets {
        result: true,
        ranked: true,
        positive_only: true,
        ..StageTargets::default()
    };
    let rows = [Staged {
        member: "a".into(),
        total: 5,
        slices: 1,
        fallback_ts: None,
    }];
    let at = |watermark| SwapCheck {
        watermark: Some(watermark),
        ..SwapCheck::default()
    };
    store.stage(&b, None, "t1", targets, &rows).await.unwrap();
    assert!(store.swap(&b, None, "t1", targets, at(5)).await.unwrap());
    assert!(
        !store.swap(&b, None, "t1", targets, at(5)).await.unwrap(),
        "resent swap refused"
    );
    assert_eq!(
        store.rank(&b, None, "a", T0).await.unwrap().total,
        Some(5),
        "ranking intact"
    );
    // A sum above an older watermark never replaces a newer one.
    store.stage(&b, None, "t2", targets, &[]).await.unwrap();
    assert!(!store.swap(&b, None, "t2", targets, at(4)).await.unwrap());
    assert_eq!(store.rank(&b, None, "a", T0).await.unwrap().total, Some(5));
}

#[tokio::test]
async fn resummarize_tracks_new_events_only_at_its_runs() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let mut b = board("res", HOUR, 3);
    b.mode = Mode::Resummarize;
    store
        .apply(&b, None, &[ev("1", T0, "a", 5)], T0)
        .await
        .unwrap();
    assert_eq!(
        store.top(&b, None, 0, 10, T0).await.unwrap().count,
        0,
        "nothing until the job runs"
    );
    roll_all(&store, std::slice::from_ref(&b), T0, 10).await;
    assert_eq!(store.rank(&b, None, "a", T0).await.unwrap().total, Some(5));
    store
        .apply(&b, None, &[ev("2", T0 + 1, "a", 5)], T0)
        .await
        .unwrap();
    let lag = roll::verify(&store, &b, None, 10).await.unwrap();
    assert_eq!((lag.differences.len(), lag.amount_behind), (1, 5));
    assert!(!lag.fails(false) && lag.fails(true));
    roll_all(&store, std::slice::from_ref(&b), T0 + 2, 10).await;
    let r = store.rank(&b, None, "a", T0).await.unwrap();
    assert_eq!((r.total, r.last_ts), (Some(10), Some(T0 + 1)));
    // No scratch key is left behind.
    assert_eq!(redis.cli(&["KEYS", "rb:{res}:tmp:*"]).trim(), "");
}

/// Calls of one command since the server started (`INFO commandstats`).
fn calls(redis: &RedisServer, command: &str) -> u64 {
    let info = redis.cli(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("calls"))
}

#[tokio::test]
async fn a_resummarize_instance_that_did_not_change_keeps_its_ranking_without_a_sum() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let mut b = board("res", HOUR, 3);
    b.mode = Mode::Resummarize;
    let boards = std::slice::from_ref(&b);
    let s0 = T0 / HOUR * HOUR;
    let mut model = Instance::default();
    let apply = async |model: &mut Instance, events: &[ApplyEvent], now: i64| {
        let expected: Vec<Outcome> = events.iter().map(|e| model.apply(&b, e, now)).collect();
        assert_eq!(store.apply(&b, None, events, now).await.unwrap(), expected);
    };
    let run = async |now: i64| {
        let before = calls(&redis, "hscan");
        let report = roll_all(&store, boards, now, 10).await.remove(0);
        (report.resummed, calls(&redis, "hscan") - before)
    };

    apply(
        &mut model,
        &[ev("1", s0, "a", 5), ev("2", s0 + 1, "b", 7)],
        s0,
    )
    .await;
    assert_eq!(run(s0).await, (1, 1), "summed: one live slice listed");
    assert_matches(&store, &b, None, &model, s0).await;
    assert_eq!(run(s0 + 1).await, (0, 0), "nothing changed: not summed");
    assert_matches(&store, &b, None, &model, s0 + 1).await;

    // A duplicate changes nothing either.
    apply(&mut model, &[ev("1", s0, "a", 5)], s0 + 2).await;
    assert_eq!(run(s0 + 2).await, (0, 0), "a duplicate");

    // A new event, in a second slice: summed again, then left.
    apply(&mut model, &[ev("3", s0 + HOUR, "a", 4)], s0 + HOUR).await;
    assert_eq!(run(s0 + HOUR).await, (1, 2));
    assert_matches(&store, &b, None, &model, s0 + HOUR).await;
    assert_eq!(run(s0 + HOUR + 1).await, (0, 0));

    // The first slice dies: its expiry changes the instance, so the next sum runs.
    let later = s0 + 3 * HOUR;
    model.roll(&b, later);
    assert_eq!(
        run(later).await,
        (1, 2),
        "the dead slice listed to expire, the live one summed"
    );
    assert_matches(&store, &b, None, &model, later).await;
    assert_eq!(run(later + 1).await, (0, 0));
    assert_matches(&store, &b, None, &model, later + 1).await;

    // The watermark moves with no slice to expire: summed once more (a new window), then
    // left.
    let empty = s0 + 4 * HOUR;
    model.roll(&b, empty);
    assert_eq!(run(empty).await.0, 1);
    assert_eq!(run(empty + 1).await, (0, 0));
    assert_matches(&store, &b, None, &model, empty + 1).await;

    // The sums' record lost (an operator lowering a watermark drops it): summed again.
    redis.cli(&["HDEL", "rb:{res}:meta", "summed_gen"]);
    assert_eq!(run(empty + 2).await.0, 1);
    assert_matches(&store, &b, None, &model, empty + 2).await;
    assert_verified(&store, &b, None).await;
}

#[tokio::test]
async fn an_unchanged_resummarize_ranking_is_summed_again_after_an_hour() {
    use rollboard::store::RESUM_AT_LEAST_EVERY_MS as EVERY;
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let mut b = board("daily", DAY, 7);
    b.mode = Mode::Resummarize;
    let boards = std::slice::from_ref(&b);
    let d0 = T0 / DAY * DAY;
    store
        .apply(&b, None, &[ev("1", d0, "a", 5)], d0)
        .await
        .unwrap();
    let resummed = async |now| roll_all(&store, boards, now, 10).await[0].resummed;
    assert_eq!(resummed(d0).await, 1);
    assert_eq!(resummed(d0 + EVERY - 1).await, 0, "within the hour");
    // A write that no `gen` counts (by hand): shown once the hour is up.
    let slice = format!("rb:{{daily}}:slice:{}", b.slice_of(d0));
    redis.cli(&["HSET", &slice, "a", "8"]);
    assert_eq!(store.rank(&b, None, "a", d0).await.unwrap().total, Some(5));
    assert_eq!(resummed(d0 + EVERY).await, 1, "an hour after the last sum");
    assert_eq!(store.rank(&b, None, "a", d0).await.unwrap().total, Some(8));
    assert_eq!(resummed(d0 + EVERY + 1).await, 0);
}

#[tokio::test]
async fn a_sum_read_before_a_newer_one_of_the_same_window_is_not_swapped_over_it() {
    use rollboard::store::{StageTargets, Staged, SwapCheck};
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let mut b = board("race", HOUR, 3);
    b.mode = Mode::Resummarize;
    let s0 = T0 / HOUR * HOUR;
    store
        .apply(&b, None, &[ev("1", s0, "a", 5)], s0)
        .await
        .unwrap();
    roll_all(&store, std::slice::from_ref(&b), s0, 10).await;
    let targets = StageTargets {
        result: true,
        ranked: true,
        positive_only: true,
        ..StageTargets::default()
    };
    let row = |total| Staged {
        member: "a".into(),
        total,
        slices: 1,
        fallback_ts: None,
    };
    // A slow run sums a = 5; meanwhile an event arrives and a faster run sums a = 9.
    let slow = store.summed(&b, None).await.unwrap();
    store
        .stage(&b, None, "slow", targets, &[row(5)])
        .await
        .unwrap();
    store
        .apply(&b, None, &[ev("2", s0 + 1, "a", 4)], s0 + 1)
        .await
        .unwrap();
    roll_all(&store, std::slice::from_ref(&b), s0 + 1, 10).await;
    let fast = store.summed(&b, None).await.unwrap();
    assert_ne!(fast.gen, slow.gen);
    assert_eq!(fast.summed_gen.as_deref(), Some(fast.gen.as_str()));
    let watermark = fast.summed_through.expect("summed_through");
    assert_eq!(slow.summed_through, Some(watermark), "the same window");
    // The slow run's swap comes last: refused, the newer ranking stays.
    let check = |gen| SwapCheck {
        watermark: Some(watermark),
        summed_at: Some((gen, s0 + 2)),
        ..SwapCheck::default()
    };
    assert!(!store
        .swap(&b, None, "slow", targets, check(slow.gen.as_str()))
        .await
        .unwrap());
    assert_eq!(
        store.rank(&b, None, "a", s0 + 1).await.unwrap().total,
        Some(9)
    );
    assert_eq!(store.summed(&b, None).await.unwrap(), fast);
    // A run that read the same `gen` may swap (its sum is as new).
    store
        .stage(&b, None, "twin", targets, &[row(9)])
        .await
        .unwrap();
    assert!(store
        .swap(&b, None, "twin", targets, check(fast.gen.as_str()))
        .await
        .unwrap());
    assert_eq!(
        store.rank(&b, None, "a", s0 + 1).await.unwrap().total,
        Some(9)
    );
    let twin = store.summed(&b, None).await.unwrap();
    assert_eq!(
        (twin.summed_gen, twin.summed_through, twin.summed_ms),
        (fast.summed_gen, fast.summed_through, Some(s0 + 2))
    );
}

#[derive(Debug, Clone)]
enum Step {
    Apply(usize, Option<String>, Vec<ApplyEvent>),
    Roll,
}

fn model_boards() -> Vec<Board> {
    let mut a = board("inc-e", 1_000, 4);
    a.allow_negative = true;
    let mut b = board("inc-l", 1_000, 3);
    b.tie_break = TieBreak::Latest;
    b.scope = Some("room".into());
    let mut c = board("res-n", 500, 6);
    c.mode = Mode::Resummarize;
    c.tie_break = TieBreak::None;
    c.allow_negative = true;
    let mut d = board("res-e", 1_000, 2);
    d.mode = Mode::Resummarize;
    d.scope = Some("room".into());
    vec![a, b, c, d]
}

fn steps() -> impl Strategy<Value = Vec<(Step, i64)>> {
    let event = (
        0u32..30,
        -5_000i64..400,
        0usize..5,
        prop_oneof![4 => 1i64..6, 1 => -5i64..0],
    );
    let apply = (0usize..4, 0usize..2, prop::collection::vec(event, 1..8))
        .prop_map(|(b, scope, events)| (b, scope, events));
    let step = prop_oneof![3 => apply.prop_map(Some), 1 => Just(None)];
    prop::collection::vec((step, 0i64..2_500), 1..16).prop_map(|raw| {
        let boards = model_boards();
        raw.into_iter()
            .map(|(step, advance)| match step {
                None => (Step::Roll, advance),
                Some((b, scope, events)) => {
                    let board = &boards[b];
                    let scope = board.scope.as_ref().map(|_| format!("r{scope}"));
                    let events = events
                        .into_iter()
                        .map(|(id, offset, m, amount)| {
                            let amount = if amount < 0 && !board.allow_negative {
                                -amount
                            } else {
                                amount
                            };
                            (
                                format!("id{id}"),
                                offset,
                                ["a", "b", "c", "d", "e"][m].to_string(),
                                amount,
                            )
                        })
                        .map(|(id, offset, member, amount)| ApplyEvent {
                            id,
                            ts: offset,
                            member,
                            amount,
                        })
                        .collect();
                    (Step::Apply(b, scope, events), advance)
                }
            })
            .collect()
    })
}

async fn run_steps(store: &Store, steps: &[(Step, i64)]) {
    let boards = model_boards();
    let mut models: HashMap<(usize, Option<String>), Instance> = HashMap::new();
    let mut now: i64 = 100_000;
    for (step, advance) in steps {
        now += advance;
        match step {
            Step::Apply(b, scope, events) => {
                let board = &boards[*b];
                let events: Vec<ApplyEvent> = events
                    .iter()
                    .map(|e| ApplyEvent {
                        ts: (now + e.ts).max(0),
                        ..e.clone()
                    })
                    .collect();
                let model = models.entry((*b, scope.clone())).or_default();
                let expected: Vec<Outcome> =
                    events.iter().map(|e| model.apply(board, e, now)).collect();
                assert_eq!(
                    store
                        .apply(board, scope.as_deref(), &events, now)
                        .await
                        .unwrap(),
                    expected
                );
                if board.mode == Mode::Incremental {
                    assert_matches(store, board, scope.as_deref(), model, now).await;
                }
            }
            Step::Roll => {
                roll_all(store, &boards, now, 2).await;
                for ((b, scope), model) in models.iter_mut() {
                    model.roll(&boards[*b], now);
                    assert_matches(store, &boards[*b], scope.as_deref(), model, now).await;
                    assert_verified(store, &boards[*b], scope.as_deref()).await;
                }
            }
        }
    }
}

#[test]
fn rolls_interleaved_with_events_behave_like_the_model() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let redis = RedisServer::start();
    let store = rt.block_on(redis.store("rb"));
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 64,
        ..ProptestConfig::default()
    });
    runner
        .run(&steps(), |steps| {
            rt.block_on(async {
                let _: () = store.client().flushall(false).await.unwrap();
                run_steps(&store, &steps).await;
            });
            Ok(())
        })
        .expect("model equivalence");
}

#[tokio::test]
async fn a_roll_ahead_of_the_clock_moves_every_instance_even_cleaned_up_ones() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    for mode in [Mode::Incremental, Mode::Resummarize] {
        let mut b = board(&format!("fans_{}", mode.as_str()), HOUR, 3);
        b.scope = Some("room".into());
        b.mode = mode;
        let s0 = b.slice_of(T0);
        let clock = (s0 + 3) * HOUR;
        // `gone` holds one old event and is cleaned up by the roll at the clock; `kept` keeps
        // a live one and stays registered.
        store
            .apply(&b, Some("gone"), &[ev("1", s0 * HOUR, "u", 1)], s0 * HOUR)
            .await
            .unwrap();
        store
            .apply(&b, Some("kept"), &[ev("2", clock, "u", 1)], clock)
            .await
            .unwrap();
        roll_all(&store, std::slice::from_ref(&b), clock, 10).await;
        assert_eq!(store.scopes(&b).await.unwrap(), ["kept"], "{b}");

        // A roll ahead of the clock: every slice up to s0 + 7 is dead from now on.
        let ahead = (s0 + 10) * HOUR;
        let window = ((s0 + 8) * HOUR, (s0 + 11) * HOUR);
        roll_all(&store, std::slice::from_ref(&b), ahead, 10).await;
        for scope in ["kept", "gone", "never_seen"] {
            let page = store.top(&b, Some(scope), 0, 10, clock).await.unwrap();
            assert_eq!(
                (page.window_from, page.window_to),
                window,
                "{b} [{scope}]: the window of the roll at {ahead}"
            );
            let late = ev(&format!("late-{scope}"), (s0 + 7) * HOUR, "v", 1);
            assert_eq!(
                store.apply(&b, Some(scope), &[late], clock).await.unwrap(),
                [Outcome::Late],
                "{b} [{scope}]: a slice the roll at {ahead} expired"
            );
            let live = ev(&format!("live-{scope}"), (s0 + 8) * HOUR, "v", 1);
            assert_eq!(
                store.apply(&b, Some(scope), &[live], clock).await.unwrap(),
                [Outcome::Applied],
                "{b} [{scope}]: the first live slice"
            );
        }
        // Time never goes back: a roll at the clock again changes nothing.
        roll_all(&store, std::slice::from_ref(&b), clock, 10).await;
        for scope in ["kept", "gone"] {
            let page = store.top(&b, Some(scope), 0, 10, clock).await.unwrap();
            assert_eq!((page.window_from, page.window_to), window, "{b} [{scope}]");
        }
    }
}
