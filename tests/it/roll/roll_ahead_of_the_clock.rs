//! Rolls ahead of the clock: refused unless forced (in both spellings), and once forced the
//! daemon judges and reports by the watermark, every instance moves (cleaned-up ones too),
//! and a scope first seen during or after it follows it.

use std::time::Duration;

use fred::prelude::*;
use rollboard::domain::board::{Board, Mode};
use rollboard::roll;
use rollboard::store::{Outcome, Store};
use tokio_util::sync::CancellationToken;

use crate::support::boards::{apply_events_in, board, ev, roll_board, scoped, DAY, HOUR, T0};
use crate::support::cli::{
    assert_contains, assert_exit, rollboard, run_rollboard, stderr, stdout, text,
};
use crate::support::config::config_for;
use crate::support::daemon::daemon_with;
use crate::support::keys::{dead_letter_stream, instance, schema};
use crate::support::redis::RedisServer;
use crate::support::wait::{drained, wait_for};

/// A roll ahead of the clock on a board that has no scope yet: a scope first seen after
/// it is judged against that roll, in both modes, and an unscoped board likewise. Then a
/// roll that races an apply registering a brand-new scope: whichever wins, nothing of a
/// slice that the roll killed stays ranked.
#[tokio::test]
async fn a_scope_first_seen_after_or_during_a_roll_ahead_follows_it() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let cancel = CancellationToken::new();
    for mode in [Mode::Incremental, Mode::Resummarize] {
        let mut b = scoped(board(&format!("fresh_{}", mode.as_str()), HOUR, 3));
        b.mode = mode;
        let mut flat = board(&format!("flat_{}", mode.as_str()), HOUR, 3);
        flat.mode = mode;
        let s0 = b.slice_of(T0);
        let clock = s0 * HOUR + 1;
        let ahead = (s0 + 10) * HOUR + 5;
        for x in [&b, &flat] {
            let r = roll::roll_board(&store, x, ahead, 10, &cancel)
                .await
                .expect("roll");
            assert_eq!(r.expired_through, Some(s0 + 7), "{x}");
            assert_eq!(
                (r.window_from, r.window_to),
                (Some((s0 + 8) * HOUR), Some((s0 + 11) * HOUR)),
                "{x}"
            );
        }
        assert!(store.scopes(&b).await.unwrap().is_empty());
        for (x, scope) in [(&b, Some("never")), (&flat, None)] {
            // At the wall clock, slice s0 would be live; after the roll it is not.
            let out = store
                .apply(x, scope, &[ev("a", clock, "u", 1)], clock)
                .await
                .unwrap();
            assert_eq!(out, [Outcome::Late], "{x}: judged against the roll ahead");
            let out = store
                .apply(x, scope, &[ev("b", (s0 + 8) * HOUR, "u", 2)], clock)
                .await
                .unwrap();
            assert_eq!(out, [Outcome::Applied], "{x}: first live slice");
            let page = store.top(&x.widest(), scope, 0, 10, clock).await.unwrap();
            assert_eq!(
                (page.envelope.window_from, page.envelope.window_to),
                ((s0 + 8) * HOUR, (s0 + 11) * HOUR),
                "{x}: the window of the roll ahead, at the wall clock"
            );
        }
    }

    // The race: each round a fresh board, one apply of a new scope with an event the roll
    // makes dead, and the roll itself, started together.
    for round in 0..40 {
        let mut b = scoped(board(&format!("race{round}"), HOUR, 3));
        if (round / 2) % 2 == 1 {
            b.mode = Mode::Resummarize;
        }
        let s0 = b.slice_of(T0);
        let clock = s0 * HOUR + 1;
        let ahead = (s0 + 10) * HOUR;
        let events = [ev("x", clock, "u", 5), ev("y", clock + 1, "w", 7)];
        // Vary who goes first and by how much, so every interleaving of the apply's
        // registration and floor read with the roll's floor raise and scope listing occurs.
        let head_start = round % 8;
        let apply = async {
            if round % 2 == 0 {
                for _ in 0..head_start {
                    tokio::task::yield_now().await;
                }
            }
            store.apply(&b, Some("new"), &events, clock).await
        };
        let rolling = async {
            if round % 2 == 1 {
                for _ in 0..head_start {
                    tokio::task::yield_now().await;
                }
            }
            roll::roll_board(&store, &b, ahead, 10, &cancel).await
        };
        let (applied, rolled) = tokio::join!(apply, rolling);
        let applied = applied.expect("apply");
        let rolled = rolled.expect("roll");
        assert_eq!(rolled.instances_failed, 0, "{:?}", rolled.first_error);
        // Whoever won, the board is as of the roll: nothing of slice s0 is ranked, the
        // window is the roll's, and a later apply of the same slice is late.
        let page = store
            .top(&b.widest(), Some("new"), 0, 10, clock)
            .await
            .unwrap();
        assert_eq!(
            (page.envelope.count, page.entries.len()),
            (0, 0),
            "round {round} ({applied:?}): a dead slice stayed ranked: {page:?}"
        );
        assert_eq!(page.envelope.window_from, (s0 + 8) * HOUR, "round {round}");
        let again = apply_events_in(&store, &b, "new", &[ev("z", clock, "v", 1)], clock).await;
        assert_eq!(again, [Outcome::Late], "round {round}");
        // A second roll at the same time leaves no slice behind in the instance.
        roll::roll_board(&store, &b, ahead, 10, &cancel)
            .await
            .expect("roll");
        let live = store
            .live_slices(&b.widest(), Some("new"), i64::MIN)
            .await
            .expect("slices");
        assert!(live.is_empty(), "round {round}: slices left {live:?}");
    }
}

/// The daemon after a forced roll a week ahead: events of the wall clock are late for a
/// scope it never saw and for the unscoped board (dead-lettered `late`, counted per
/// board), queries show the window of the forced roll, the window gauges follow it, and
/// a later roll at the clock takes nothing back.
#[tokio::test]
async fn after_a_forced_roll_ahead_the_daemon_judges_and_reports_by_it() {
    // Nothing kept: the last query, after the command line's roll (another process), must
    // read Redis, or an answer kept from before it would pass whatever the roll did.
    let (redis, _dir, daemon, config) = daemon_with("max_staleness = \"0s\"").await;
    let store = redis.store("rb").await;
    let now = rollboard::domain::clock::local_ms();
    let ahead = now + 8 * DAY;
    let out = run_rollboard(&config, &["roll", "--at", &ahead.to_string(), "--force"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let six = 6 * HOUR;
    let rooms_from = (ahead / six + 1) * six - 7 * DAY;
    let fans_from = (ahead / HOUR + 1) * HOUR - 7 * DAY;

    let r = reqwest::Client::new()
        .post(format!("{}/v1/events", daemon.base))
        .json(&serde_json::json!({"room": "brand_new", "user": "u1", "amount": 3}))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status().as_u16(), 202);
    assert!(drained(&store).await, "not consumed");
    let dead: Vec<(String, std::collections::HashMap<String, String>)> = store
        .client()
        .xrange(dead_letter_stream(), "-", "+", None)
        .await
        .expect("xrange");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].1.get("reason").map(String::as_str), Some("late"));
    for b in ["rooms_7d", "fans_7d"] {
        assert_eq!(
            daemon
                .metric(
                    "rollboard_events_skipped_total",
                    &[("board", b), ("reason", "late")]
                )
                .await,
            1.0,
            "{b}"
        );
    }
    for (path, from) in [
        ("/v1/boards/rooms_7d/top", rooms_from),
        ("/v1/boards/fans_7d/top?scope=brand_new", fans_from),
        ("/v1/boards/fans_7d/top?scope=never_seen", fans_from),
    ] {
        let (status, body) = daemon.get(path).await;
        assert_eq!(status, 200, "{path}: {body}");
        let page: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert_eq!(page["window_from"].as_i64(), Some(from), "{path}: {body}");
        assert_eq!(page["window_to"].as_i64(), Some(from + 7 * DAY), "{path}");
        assert_eq!(page["count"], 0, "{path}: {body}");
    }
    // The daemon's own rolls (every 2 s, at the clock) report the forced window.
    for (b, from) in [("rooms_7d", rooms_from), ("fans_7d", fans_from)] {
        let want = from as f64 / 1000.0;
        let moved = wait_for(Duration::from_secs(8), || async {
            daemon
                .metric("rollboard_window_start_timestamp_seconds", &[("board", b)])
                .await
                == want
        })
        .await;
        assert!(
            moved,
            "{b}: window start gauge {} != {want}",
            daemon
                .metric("rollboard_window_start_timestamp_seconds", &[("board", b)])
                .await
        );
        assert_eq!(
            daemon
                .metric("rollboard_window_end_timestamp_seconds", &[("board", b)])
                .await,
            want + (7 * DAY) as f64 / 1000.0,
            "{b}"
        );
    }
    // A roll at the clock takes nothing back.
    let out = run_rollboard(&config, &["roll"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (_, body) = daemon.get("/v1/boards/rooms_7d/top").await;
    let page: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(page["window_from"].as_i64(), Some(rooms_from), "{body}");
}

/// `roll --at` ahead of Redis's clock is refused (exit 2) in both spellings, touching
/// nothing; a time before it is accepted in both; `--force` alone and a malformed time are
/// usage errors.
#[tokio::test]
async fn roll_ahead_of_the_clock_is_refused_in_both_spellings() {
    let redis = RedisServer::start();
    let (_dir, _, config) = config_for(&redis, "a", "");
    let with_max_future = std::fs::read_to_string(&config)
        .expect("config")
        .replace("[ingest]\n", "[ingest]\nmax_future = \"1m\"\n");
    std::fs::write(&config, with_max_future).expect("rewrite");
    let config_path = config;
    let rfc = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .expect("time")
            .with_timezone(&chrono::FixedOffset::east_opt(14 * 3600).expect("offset"))
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, false)
    };
    let now = rollboard::domain::clock::local_ms();
    for at in [
        (now + 60_000 + 3_000).to_string(),
        rfc(now + 60_000 + 3_000),
    ] {
        let out = run_rollboard(&config_path, &["roll", "--at", &at]);
        assert_eq!(out.status.code(), Some(2), "{at}: {}", text(&out.stderr));
        assert_contains(&text(&out.stderr), "--force");
    }
    assert_eq!(
        redis.cli(&["DBSIZE"]).trim(),
        "0",
        "a refused roll wrote something"
    );
    for args in [
        vec!["roll", "--force"],
        vec!["roll", "--at", "tomorrow"],
        vec!["roll", "--at", "-1"],
        vec!["roll", "--at", "9007199254740992"],
    ] {
        let out = run_rollboard(&config_path, &args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    let now = rollboard::domain::clock::local_ms();
    for at in [(now - 60_000).to_string(), rfc(now - 60_000)] {
        let out = run_rollboard(&config_path, &["roll", "--at", &at]);
        assert_eq!(out.status.code(), Some(0), "{at}: {}", text(&out.stderr));
    }
    // The board's window is the one of that time (6 h slices for rooms_7d).
    let six = 6 * HOUR;
    let w: i64 = redis
        .cli(&["HGET", &schema().window("rooms_7d"), "expired_through"])
        .trim()
        .parse()
        .expect("watermark");
    assert_eq!(w, (now - 60_000) / six - 28);
}

/// The window (from, to) a `top` of `board`'s instance `scope` at `now` answers for.
async fn window_of(store: &Store, board: &Board, scope: &str, now: i64) -> (i64, i64) {
    let page = store
        .top(&board.widest(), Some(scope), 0, 10, now)
        .await
        .unwrap();
    (page.envelope.window_from, page.envelope.window_to)
}

#[tokio::test]
async fn a_roll_ahead_of_the_clock_moves_every_instance_even_cleaned_up_ones() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    for mode in [Mode::Incremental, Mode::Resummarize] {
        let mut b = scoped(board(&format!("fans_{}", mode.as_str()), HOUR, 3));
        b.mode = mode;
        let s0 = b.slice_of(T0);
        let clock = (s0 + 3) * HOUR;
        // `gone` holds one old event and is cleaned up by the roll at the clock; `kept` keeps
        // a live one and stays registered.
        apply_events_in(&store, &b, "gone", &[ev("1", s0 * HOUR, "u", 1)], s0 * HOUR).await;
        apply_events_in(&store, &b, "kept", &[ev("2", clock, "u", 1)], clock).await;
        roll_board(&store, &b, clock).await;
        assert_eq!(store.scopes(&b).await.unwrap(), ["kept"], "{b}");

        // A roll ahead of the clock: every slice up to s0 + 7 is dead from now on.
        let ahead = (s0 + 10) * HOUR;
        let window = ((s0 + 8) * HOUR, (s0 + 11) * HOUR);
        roll_board(&store, &b, ahead).await;
        for scope in ["kept", "gone", "never_seen"] {
            assert_eq!(
                window_of(&store, &b, scope, clock).await,
                window,
                "{b} [{scope}]: the window of the roll at {ahead}"
            );
            let late = ev(&format!("late-{scope}"), (s0 + 7) * HOUR, "v", 1);
            assert_eq!(
                apply_events_in(&store, &b, scope, &[late], clock).await,
                [Outcome::Late],
                "{b} [{scope}]: a slice the roll at {ahead} expired"
            );
            let live = ev(&format!("live-{scope}"), (s0 + 8) * HOUR, "v", 1);
            assert_eq!(
                apply_events_in(&store, &b, scope, &[live], clock).await,
                [Outcome::Applied],
                "{b} [{scope}]: the first live slice"
            );
        }
        // Time never goes back: a roll at the clock again changes nothing.
        roll_board(&store, &b, clock).await;
        for scope in ["kept", "gone"] {
            assert_eq!(
                window_of(&store, &b, scope, clock).await,
                window,
                "{b} [{scope}]"
            );
        }
    }
}

#[tokio::test]
async fn a_roll_too_far_ahead_is_refused_unless_forced() {
    let redis = RedisServer::start();
    let (_dir, _, config) = config_for(&redis, "a", "");
    let now = rollboard::domain::clock::local_ms();
    // A century, or a day, ahead of Redis's clock is a typo.
    for at in [
        (now + 100 * 365 * 86_400_000).to_string(),
        (now + 86_400_000).to_string(),
    ] {
        let out = rollboard(Some(&config), &["roll", "--at", &at], &[]);
        assert_eq!(out.status.code(), Some(2), "{at}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("Redis's clock") && stderr(&out).contains("--force"),
            "{}",
            stderr(&out)
        );
    }
    assert_eq!(
        redis
            .cli(&["EXISTS", &instance("rooms_7d", None).meta()])
            .trim(),
        "0",
        "a refused roll touched nothing"
    );
    // Not even a minute ahead of Redis's clock (within ingest.max_future): it would expire
    // and forget for good what is still live by every other clock.
    let out = rollboard(
        Some(&config),
        &["roll", "--at", &(now + 60_000).to_string()],
        &[],
    );
    assert_exit(&out, 2, "a minute ahead");
    let out = rollboard(
        Some(&config),
        &["roll", "--at", &(now - 60_000).to_string()],
        &[],
    );
    assert!(out.status.success(), "a minute ago: {}", stderr(&out));
    let at = now + 86_400_000;
    let out = rollboard(
        Some(&config),
        &["roll", "--at", &at.to_string(), "--force"],
        &[],
    );
    assert!(out.status.success(), "forced: {}", stderr(&out));
    let out = rollboard(Some(&config), &["top", "rooms_7d", "--json"], &[]);
    let page: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
    let six_hours = 6 * 3_600_000;
    assert_eq!(
        page["window_from"].as_i64(),
        Some((at / six_hours + 1) * six_hours - 7 * 86_400_000),
        "the forced roll moved the window"
    );
}
