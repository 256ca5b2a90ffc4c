//! The number of shards is pinned by the board's data like every shaping setting (a
//! member's shard depends on it): 2 -> 4, 4 -> 1 and 1 -> 4 over existing data are refused
//! at start (exit 64, naming `shards` and what the data holds), by the daemon and by every
//! command; also when the board-level settings record is lost and only the instances'
//! own fingerprints are left.

use std::path::{Path, PathBuf};

use rollboard::domain::board::Board;
use rollboard::store::Store;

use super::apply_sharded;
use crate::support::boards::{apply_events, ev, redis_now};
use crate::support::cli::{assert_exit, run_rollboard, stderr};
use crate::support::config::{board_of, write_config};
use crate::support::daemon::Daemon;
use crate::support::keys::{instance, schema, scoped_prefix, under};
use crate::support::redis::{free_port, RedisServer};

/// The board `tips` of hourly slices over 6 hours with the line `shards` (or none).
fn tips(shards: &str) -> String {
    format!(
        "[[boards]]\nname = \"tips\"\nmember = \"user\"\nwindow = \"6h\"\nslice = \"1h\"\n{shards}\n"
    )
}

/// A config for a daemon on `port` talking to `redis`, with `tips` beside the test boards.
fn config(dir: &Path, redis: &RedisServer, port: u16, shards: &str) -> PathBuf {
    write_config(dir, redis, port, "a", &tips(shards))
}

/// Records the settings of the configuration at `path` (a command that starts clean) and
/// writes events of several members to `tips` with it, at Redis's clock.
async fn start_with_data(path: &Path, store: &Store) -> Board {
    let out = run_rollboard(path, &["verify"]);
    assert_exit(&out, 0, "the first run");
    let b = board_of(path, "tips");
    let now = redis_now(store).await;
    let events: Vec<_> = (0..12)
        .map(|i| ev(&format!("e{i}"), now, &format!("m{i}"), i + 1))
        .collect();
    if b.is_sharded() {
        apply_sharded(store, &b, &events, now).await;
    } else {
        apply_events(store, &b, &events, now).await;
    }
    b
}

/// Whether `out` is a refusal at start naming `shards`: `configured` in the
/// configuration, `stored` in the data (read from `key`, or a key starting so), and
/// nothing else.
fn assert_refused_naming_shards(
    out: &std::process::Output,
    configured: &str,
    stored: &str,
    key: &str,
) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains(&format!(
            "board tips: shards is {configured} in the configuration but the board's data in \
             Redis was built with shards = {stored} ({key}"
        )),
        "{err}"
    );
    assert_eq!(err.matches("board tips:").count(), 1, "{err}");
}

/// Each change of `from` to the others: the daemon stops before it listens, each command
/// refuses; the same count again starts.
async fn refused_for_each_change(from: &str, stored: &str, changes: &[(&str, &str)]) {
    let (redis, store, dir) = RedisServer::start_with_store_and_dir("rb").await;
    let port = free_port();
    let path = config(dir.path(), &redis, port, from);
    start_with_data(&path, &store).await;
    let recorded = redis.cli(&["HGET", &schema().settings("tips"), "shards"]);
    if stored == "1" {
        assert_eq!(recorded.trim(), "", "a board of one shard records none");
    } else {
        assert_eq!(recorded.trim(), stored);
    }
    for (edited, configured) in changes {
        config(dir.path(), &redis, port, edited);
        let daemon = Daemon::spawn(&path, port);
        let log = daemon.log.clone();
        let status = daemon.wait_exit().await;
        assert_eq!(status.code(), Some(64), "{edited}: {status:?}");
        let logged = std::fs::read_to_string(log).expect("log");
        assert!(
            logged.contains(&format!(
                "board tips: shards is {configured} in the configuration"
            )),
            "{logged}"
        );
        for args in [&["verify"][..], &["top", "tips"], &["rebuild", "tips"]] {
            assert_refused_naming_shards(
                &run_rollboard(&path, args),
                configured,
                stored,
                &format!("{})", schema().settings("tips")),
            );
        }
    }
    config(dir.path(), &redis, port, from);
    assert_exit(&run_rollboard(&path, &["verify"]), 0, "the count as built");
}

#[tokio::test]
async fn two_shards_changed_to_four_or_one_is_refused_at_start() {
    refused_for_each_change(
        "shards = 2",
        "2",
        &[
            ("shards = 4", "4"),
            ("shards = 1", "1"),
            ("", "1"),
            ("shards = 3", "3"),
        ],
    )
    .await;
}

#[tokio::test]
async fn four_shards_changed_to_one_is_refused_at_start() {
    refused_for_each_change(
        "shards = 4",
        "4",
        &[("shards = 1", "1"), ("shards = 2", "2")],
    )
    .await;
}

#[tokio::test]
async fn one_shard_changed_to_four_over_existing_data_is_refused_at_start() {
    refused_for_each_change("", "1", &[("shards = 4", "4"), ("shards = 64", "64")]).await;
}

/// Without the board-level record (lost, or data written before it existed), the
/// instances' own fingerprints tell the same: a sharded board's shards' `meta`, a plain
/// board's own.
#[tokio::test]
async fn without_the_settings_record_the_instances_fingerprints_refuse_the_change() {
    let shard_prefix = format!("{}#", scoped_prefix("tips"));
    for (built, stored, edited, configured, key) in [
        ("shards = 2", "2", "shards = 4", "4", &shard_prefix),
        ("shards = 4", "4", "", "1", &shard_prefix),
        (
            "",
            "1",
            "shards = 4",
            "4",
            &under(&instance("tips", None), "meta)"),
        ),
    ] {
        let (redis, store, dir) = RedisServer::start_with_store_and_dir("rb").await;
        let port = free_port();
        let path = config(dir.path(), &redis, port, built);
        start_with_data(&path, &store).await;
        redis.cli(&["DEL", &schema().settings("tips")]);
        config(dir.path(), &redis, port, edited);
        let out = run_rollboard(&path, &["verify"]);
        assert_refused_naming_shards(&out, configured, stored, key);
    }
}
