//! The settings that shape a board's keys and scores are pinned by its data: every shaping
//! edit is refused before anything is written, a daemon or CLI whose configuration
//! disagrees refuses to start (exit 64, naming the setting), and a refusing daemon never
//! opens a listener a probe could pass on.

use std::process::Output;

use fred::prelude::*;
use rollboard::domain::board::TieBreak;
use rollboard::roll::{self, Job};
use tokio_util::sync::CancellationToken;

use crate::support::boards::{apply_events, board, ev, snapshot};
use crate::support::cli::run_rollboard;
use crate::support::config::{config_for, write_config};
use crate::support::daemon::Daemon;
use crate::support::keys::{instance, schema};
use crate::support::redis::{free_port, RedisServer};
use crate::support::wait::drained;

const SLICE: i64 = 1_000;
const NOW: i64 = 1_000_000;

/// `config` with `from` replaced by `to` once, written beside it as `name.toml`.
fn edited(config: &std::path::Path, name: &str, from: &str, to: &str) -> std::path::PathBuf {
    let original = std::fs::read_to_string(config).expect("read config");
    assert!(original.contains(from), "{from}");
    let path = config.with_file_name(format!("{name}.toml"));
    std::fs::write(&path, original.replacen(from, to, 1)).expect("write config");
    path
}

/// Sends one tip to each test board, so that every board has data.
fn fill(config: &std::path::Path) {
    let now = rollboard::domain::clock::local_ms();
    let dir = tempfile::tempdir().expect("dir");
    let events = dir.path().join("events.jsonl");
    std::fs::write(
        &events,
        format!(
            "{{\"room\":\"r1\",\"user\":\"u1\",\"amount\":\"5\",\"value\":\"1.25\",\"ts\":\"{now}\"}}\n"
        ),
    )
    .expect("write events");
    let out = run_rollboard(config, &["send", events.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// Asserts that `out` is a refusal naming `setting`, with the message shown for it.
fn assert_refused(out: &Output, setting: &str, shown: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{setting}: {err}");
    assert!(
        err.contains(&format!(": {setting} is ")),
        "{setting}: {err}"
    );
    assert!(err.contains(shown), "{setting}: {err}");
}

#[tokio::test]
async fn adding_or_removing_a_scope_is_refused_like_every_shaping_setting() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("dir");
    let config = write_config(dir.path(), &redis, free_port(), "a", "");
    fill(&config);
    // Start the consumer once so that the events reach the boards.
    let daemon_port = free_port();
    let daemon_config = write_config(dir.path(), &redis, daemon_port, "d", "");
    let daemon = Daemon::start(&daemon_config, daemon_port).await;
    let store = redis.store("rb").await;
    assert!(drained(&store).await, "log:\n{}", daemon.logs());
    assert_eq!(daemon.terminate().await.code(), Some(0));

    let added = edited(
        &config,
        "added",
        "name = \"rooms_7d\"\nmember = \"room\"",
        "name = \"rooms_7d\"\nmember = \"room\"\nscope = \"user\"",
    );
    let removed = edited(&config, "removed", "scope = \"room\"\n", "");
    let renamed = edited(
        &config,
        "renamed",
        "scope = \"room\"",
        "scope = \"channel\"",
    );
    for args in [&["verify"][..], &["run"]] {
        assert_refused(
            &run_rollboard(&added, args),
            "scope",
            "scope is user in the configuration",
        );
        assert_refused(
            &run_rollboard(&removed, args),
            "scope",
            "(none) in the configuration",
        );
        assert_refused(&run_rollboard(&renamed, args), "scope", "scope = room");
    }
    let out = run_rollboard(&config, &["verify"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "the original config still runs: {out:?}"
    );
}

/// Data recorded before `scope` was pinned has no `scope` in its settings record: the keys
/// that exist tell whether it was built scoped, and the record learns it.
#[tokio::test]
async fn a_scope_change_is_refused_on_data_recorded_before_scope_was_pinned() {
    let redis = RedisServer::start();
    let (_dir, port, config) = config_for(&redis, "a", "");
    let daemon = Daemon::start(&config, port).await;
    fill(&config);
    let store = redis.store("rb").await;
    assert!(drained(&store).await, "log:\n{}", daemon.logs());
    assert_eq!(daemon.terminate().await.code(), Some(0));
    for board in ["rooms_7d", "fans_7d"] {
        redis.cli(&["HDEL", &schema().settings(board), "scope"]);
    }

    let added = edited(
        &config,
        "added",
        "name = \"rooms_7d\"\nmember = \"room\"",
        "name = \"rooms_7d\"\nmember = \"room\"\nscope = \"user\"",
    );
    assert_refused(&run_rollboard(&added, &["verify"]), "scope", "(none)");
    let removed = edited(&config, "removed", "scope = \"room\"\n", "");
    assert_refused(
        &run_rollboard(&removed, &["verify"]),
        "scope",
        "(none) in the configuration",
    );

    let out = run_rollboard(&config, &["verify"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        redis
            .cli(&["HGET", &schema().settings("fans_7d"), "scope"])
            .trim(),
        "room",
        "the record learns the scope"
    );
    assert_eq!(
        redis
            .cli(&["HGET", &schema().settings("rooms_7d"), "scope"])
            .trim(),
        ""
    );
}

/// Redis is down when the daemon starts, so the check waits: with a listener opened
/// first, every probe would pass until Redis came back and the daemon exited 64.
#[tokio::test]
async fn a_daemon_refusing_its_board_settings_never_opens_a_listener() {
    let mut redis = RedisServer::start_persistent();
    let (_dir, port, config) = config_for(&redis, "a", "");
    let out = run_rollboard(&config, &["verify"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let changed = edited(&config, "changed", "slice = \"6h\"", "slice = \"3h\"");
    redis.shutdown_and_restart();
    redis.kill();
    let daemon = Daemon::spawn(&changed, port);
    daemon.wait_log("cannot connect to redis yet").await;
    assert_eq!(
        daemon.get("/healthz").await.0,
        0,
        "a probe passed before the check"
    );
    redis.restart();
    let status = daemon.wait_exit().await;
    assert_eq!(status.code(), Some(64), "{status:?}");
}

#[tokio::test]
async fn a_board_whose_settings_changed_is_refused_before_anything_is_written() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let mut none = board("tips", SLICE, 4);
    none.tie_break = TieBreak::None;
    apply_events(&store, &none, &[ev("1", NOW, "a", 5)], NOW).await;
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
    assert_eq!(conflicts[0].key, instance("tips", None).meta());
    assert_eq!(
        store
            .client()
            .exists::<i64, _>(schema().settings("tips"))
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
    let port = crate::support::redis::free_port();
    let config = write_config(dir.path(), &redis, port, "a", "");
    let run = run_rollboard;
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

#[tokio::test]
async fn every_shaping_edit_is_refused_and_others_are_accepted() {
    let redis = RedisServer::start();
    let (dir, _port, config) = config_for(&redis, "a", "");
    let run = run_rollboard;
    let out = run(&config, &["verify"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let original = std::fs::read_to_string(&config).expect("read");
    let edit = |name: &str, from: &str, to: &str| {
        assert!(original.contains(from), "{from}");
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, original.replacen(from, to, 1)).expect("write");
        path
    };
    // (setting, edit): each shapes keys or scores of tips_24h or rooms_7d.
    let refused = [
        ("scale", edit("scale", "scale = 2", "scale = 3")),
        ("slice", edit("slice", "slice = \"6h\"", "slice = \"3h\"")),
        (
            "window",
            edit("window", "window = \"24h\"", "window = \"48h\""),
        ),
        (
            "mode",
            edit(
                "mode",
                "tie_break = \"latest\"",
                "tie_break = \"latest\"\nmode = \"resummarize\"",
            ),
        ),
        (
            "allow_negative",
            edit("neg", "allow_negative = true", "allow_negative = false"),
        ),
    ];
    for (setting, path) in &refused {
        for args in [&["verify"][..], &["run"]] {
            let out = run(path, args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(64), "{setting} {args:?}: {err}");
            assert!(
                err.contains(&format!(": {setting} is ")),
                "{setting}: {err}"
            );
        }
    }
    // The same window written another way, and a new board: nothing to refuse.
    let accepted = [
        edit("same", "window = \"7d\"", "window = \"168h\""),
        edit(
            "added",
            "[[boards]]",
            "[[boards]]\nname = \"new_board\"\nmember = \"player\"\nwindow = \"1h\"\nslice = \"1m\"\n\n[[boards]]",
        ),
    ];
    for path in &accepted {
        let out = run(path, &["verify"]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    }
    let out = run(&config, &["verify"]);
    assert_eq!(out.status.code(), Some(0), "the original config still runs");
}
