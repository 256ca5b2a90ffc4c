//! The settings that shape a board's keys and scores are pinned by its data: a daemon or
//! CLI whose configuration disagrees refuses to start (exit 64, naming the setting), and a
//! refusing daemon never opens a listener a probe could pass on.

use std::process::Output;

use crate::support::*;

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
    let now = rollboard::cli::now_ms();
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
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let config = write_config(dir.path(), &redis, port, "a", "");
    let daemon = Daemon::start(&config, port).await;
    fill(&config);
    let store = redis.store("rb").await;
    assert!(drained(&store).await, "log:\n{}", daemon.logs());
    assert_eq!(daemon.terminate().await.code(), Some(0));
    for board in ["rooms_7d", "fans_7d"] {
        redis.cli(&["HDEL", &format!("rb:board:{board}:settings"), "scope"]);
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
            .cli(&["HGET", "rb:board:fans_7d:settings", "scope"])
            .trim(),
        "room",
        "the record learns the scope"
    );
    assert_eq!(
        redis
            .cli(&["HGET", "rb:board:rooms_7d:settings", "scope"])
            .trim(),
        ""
    );
}

/// Redis is down when the daemon starts, so the check waits: with a listener opened
/// first, every probe would pass until Redis came back and the daemon exited 64.
#[tokio::test]
async fn a_daemon_refusing_its_board_settings_never_opens_a_listener() {
    let mut redis = RedisServer::start_persistent();
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let config = write_config(dir.path(), &redis, port, "a", "");
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
