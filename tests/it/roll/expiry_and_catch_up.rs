//! Rolling the window: expiry, catch-up after days, rolls at earlier times, emptied scopes,
//! killed and concurrent rollers, exactly once against a real Redis and the in-memory model.

use std::collections::HashMap;
use std::time::Duration;

use fred::prelude::*;
use proptest::prelude::*;
use rollboard::domain::board::{Board, Mode, TieBreak};
use rollboard::store::{ApplyEvent, Outcome, Store};

use crate::support::asserts::assert_verified;
use crate::support::boards::{
    amount_for, apply_events, apply_events_in, apply_scoped_model, board, count_at, ev,
    resummarize, roll_all, roll_board, scoped, total_at, DAY, HOUR, T0,
};
use crate::support::keys::{base, instance};
use crate::support::model::{assert_matches, assert_rolled_and_verified, Instance};
use crate::support::proptests::run_cases;
use crate::support::redis::RedisServer;
use crate::support::wait::wait_for;

#[tokio::test]
async fn expiry_subtracts_each_dead_slice_and_forgets_its_members() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let b = board("rooms", HOUR, 3);
    let s0 = b.slice_of(T0) * HOUR;
    let events = [
        ev("1", s0, "a", 5),
        ev("2", s0 + HOUR, "a", 7),
        ev("3", s0 + HOUR, "b", 2),
        ev("4", s0 + 2 * HOUR, "c", 1),
    ];
    apply_events(&store, &b, &events, s0 + 2 * HOUR).await;
    let mut model = Instance::default();
    for e in &events {
        model.apply(&b.widest(), e, s0 + 2 * HOUR);
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
    model.roll(&b.widest(), s0 + 3 * HOUR);
    assert_matches(&store, &b.widest(), None, &model, s0 + 3 * HOUR).await;
    assert_eq!(
        total_at(&store, &b.widest(), "a", s0 + 3 * HOUR).await,
        Some(7)
    );
    // Then the second: a and b leave the ranking and the members map.
    let reports = roll_all(&store, std::slice::from_ref(&b), s0 + 4 * HOUR, 2).await;
    assert_eq!(
        (reports[0].slices_expired, reports[0].members_removed),
        (1, 2)
    );
    model.roll(&b.widest(), s0 + 4 * HOUR);
    assert_matches(&store, &b.widest(), None, &model, s0 + 4 * HOUR).await;
    assert_eq!(
        redis
            .cli(&["HLEN", &instance("rooms", None).members()])
            .trim(),
        "1"
    );
    assert_eq!(
        redis
            .cli(&["ZCARD", &instance("rooms", None).slices()])
            .trim(),
        "1"
    );
    assert_eq!(
        redis
            .cli(&["EXISTS", &instance("rooms", None).slice(s0 / HOUR)])
            .trim(),
        "0"
    );
    assert_eq!(
        expired_through(&redis, "rooms").trim(),
        (s0 / HOUR + 1).to_string()
    );
    assert_verified(&store, &b.widest(), None).await;
}

/// The watermark (`expired_through`) recorded in the `meta` of `board`'s unscoped
/// instance, as redis-cli prints it.
fn expired_through(redis: &RedisServer, board: &str) -> String {
    redis.cli(&["HGET", &instance(board, None).meta(), "expired_through"])
}

/// A fresh server and store, and a board `rooms` of `slices` hourly slices holding one
/// event (`a`, 5 at [`T0`]).
async fn rooms_with_one_event(slices: i64) -> (RedisServer, Store, Board) {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let b = board("rooms", HOUR, slices);
    apply_events(&store, &b, &[ev("1", T0, "a", 5)], T0).await;
    (redis, store, b)
}

#[tokio::test]
async fn a_roll_at_an_earlier_time_changes_nothing() {
    let (redis, store, b) = rooms_with_one_event(3).await;
    roll_board(&store, &b, T0 + 10 * HOUR).await;
    let w = expired_through(&redis, "rooms");
    roll_board(&store, &b, T0).await;
    assert_eq!(expired_through(&redis, "rooms"), w);
    // An empty board still records its watermark.
    let empty = board("empty", HOUR, 3);
    roll_board(&store, &empty, T0).await;
    assert_eq!(
        expired_through(&redis, "empty").trim(),
        (T0 / HOUR - 3).to_string()
    );
}

#[tokio::test]
async fn late_events_never_land_in_a_dead_slice() {
    let (redis, store, b) = rooms_with_one_event(4).await;
    // A roll ahead of the clock raises the watermark past slice_of(T0).
    roll_board(&store, &b, T0 + 5 * HOUR).await;
    let out = apply_events(
        &store,
        &b,
        &[ev("2", T0, "a", 5), ev("3", T0 + 2 * HOUR, "a", 1)],
        T0,
    )
    .await;
    assert_eq!(out, vec![Outcome::Late, Outcome::Applied]);
    assert_eq!(
        redis
            .cli(&["EXISTS", &instance("rooms", None).slice(T0 / HOUR)])
            .trim(),
        "0"
    );
    assert_eq!(total_at(&store, &b.widest(), "a", T0).await, Some(1));
}

#[tokio::test]
async fn catch_up_after_ten_days_equals_the_model() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let mut inc = board("inc", HOUR, 72);
    inc.allow_negative = true;
    let mut res = resummarize("res", 6 * HOUR, 4 * 7);
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
            apply_scoped_model(&store, b, scope.as_deref(), model, &events, now).await;
        }
    }
    let end = T0 + 10 * DAY;
    let reports = roll_all(&store, &boards, end, 7).await;
    assert!(reports[0].slices_expired >= 10 * 24 - 72 - 1, "{reports:?}");
    for ((bi, scope), model) in &mut models {
        model.roll(&boards[*bi].widest(), end);
        assert_matches(&store, &boards[*bi].widest(), scope.as_deref(), model, end).await;
        assert_verified(&store, &boards[*bi].widest(), scope.as_deref()).await;
    }
}

/// `dead` events `d<i>` in the slice of [`T0`], of members `m<i>` sending `1 + i % cycle`,
/// and `live` events `l<i>` an hour later, of the first `live` of those members sending
/// `amount` each.
fn dead_and_live(
    dead: i64,
    cycle: i64,
    live: i64,
    amount: i64,
) -> (Vec<ApplyEvent>, Vec<ApplyEvent>) {
    let dead = (0..dead)
        .map(|i| ev(&format!("d{i}"), T0, &format!("m{i}"), 1 + i % cycle))
        .collect();
    let live = (0..live)
        .map(|i| ev(&format!("l{i}"), T0 + HOUR, &format!("m{i}"), amount))
        .collect();
    (dead, live)
}

#[tokio::test]
async fn two_rollers_subtract_every_amount_exactly_once() {
    let redis = RedisServer::start();
    let b = board("rooms", HOUR, 2);
    let setup = redis.store("rb").await;
    let mut model = Instance::default();
    // 6000 members in the dead slice, 300 of them also live later.
    let (dead, live) = dead_and_live(6000, 3, 300, 10);
    for chunk in dead.chunks(500).chain(live.chunks(500)) {
        let out = apply_events(&setup, &b, chunk, T0 + HOUR).await;
        assert!(out.iter().all(|o| *o == Outcome::Applied));
        for e in chunk {
            model.apply(&b.widest(), e, T0 + HOUR);
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
    model.roll(&b.widest(), at);
    assert_matches(&setup, &b.widest(), None, &model, at).await;
    assert_verified(&setup, &b.widest(), None).await;
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
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let b = board("rooms", HOUR, 2);
    let mut model = Instance::default();
    let n = 60_000;
    let (dead, live) = dead_and_live(n, 5, 2000, 3);
    for chunk in dead.chunks(1000).chain(live.chunks(1000)) {
        apply_events(&store, &b, chunk, T0 + HOUR).await;
        for e in chunk {
            model.apply(&b.widest(), e, T0 + HOUR);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), &redis.url(), 20);
    let at = (T0 + 2 * HOUR).to_string();
    let slice_key = instance("rooms", None).slice(T0 / HOUR);
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
    assert_rolled_and_verified(&store, &b, &mut model, T0 + 2 * HOUR).await;
}

#[tokio::test]
async fn an_emptied_scope_leaves_the_registry_and_redis() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let mut b = scoped(board("fans", HOUR, 2));
    b.mode = Mode::Resummarize;
    apply_events_in(&store, &b, "old", &[ev("1", T0, "u", 1)], T0).await;
    apply_events_in(
        &store,
        &b,
        "new",
        &[ev("2", T0 + 3 * HOUR, "u", 1)],
        T0 + 3 * HOUR,
    )
    .await;
    let report = roll_board(&store, &b, T0 + 3 * HOUR).await;
    assert_eq!(report.scopes_removed, 1);
    assert_eq!(store.scopes(&b).await.unwrap(), ["new"]);
    assert_eq!(
        redis
            .cli(&[
                "KEYS",
                &format!("{}*", base(&instance("fans", Some("old"))))
            ])
            .trim(),
        instance("fans", Some("old")).meta(),
        "only the watermark stays"
    );
    assert_eq!(
        count_at(&store, &b.widest(), Some("new"), T0 + 3 * HOUR).await,
        1
    );
    // A copy of the old event, even judged at an old clock, is late: time never goes back.
    let out = apply_events_in(&store, &b, "old", &[ev("1", T0, "u", 1)], T0).await;
    assert_eq!(out, vec![Outcome::Late]);
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
    let mut c = resummarize("res-n", 500, 6);
    c.tie_break = TieBreak::None;
    c.allow_negative = true;
    let mut d = resummarize("res-e", 1_000, 2);
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
                            let amount = amount_for(board, amount);
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
                apply_scoped_model(store, board, scope.as_deref(), model, &events, now).await;
                if board.mode == Mode::Incremental {
                    assert_matches(store, &board.widest(), scope.as_deref(), model, now).await;
                }
            }
            Step::Roll => {
                roll_all(store, &boards, now, 2).await;
                for ((b, scope), model) in models.iter_mut() {
                    model.roll(&boards[*b].widest(), now);
                    assert_matches(store, &boards[*b].widest(), scope.as_deref(), model, now).await;
                    assert_verified(store, &boards[*b].widest(), scope.as_deref()).await;
                }
            }
        }
    }
}

#[test]
fn rolls_interleaved_with_events_behave_like_the_model() {
    run_cases(64, &steps(), async |store, steps| {
        run_steps(store, &steps).await;
    });
}
