//! The command line as a user drives it: exit statuses, configuration precedence,
//! `send` all-or-nothing, JSON shapes.

use fred::prelude::*;

use crate::support::boards::apply_events;
use crate::support::cli::{
    assert_configs_refused_naming, assert_contains, assert_exit, rollboard, stderr, stdout,
};
use crate::support::config::{config_for, write_file};
use crate::support::daemon::redis_and_config;
use crate::support::keys::intake_stream;
use crate::support::redis::RedisServer;

#[test]
fn invalid_configuration_exits_64_naming_the_key() {
    let dir = tempfile::tempdir().expect("dir");
    let missing = dir.path().join("missing.toml");
    assert_eq!(
        rollboard(Some(&missing), &["top", "r"], &[]).status.code(),
        Some(64)
    );
    let bad = dir.path().join("bad.toml");
    assert_configs_refused_naming(
        &bad,
        &[
            (
                "[[boards]]\nname = \"r\"\nmember = \"m\"\nwindow = \"7d\"\nslice = \"5h\"\n",
                "boards[0].window",
            ),
            (
                "[redis]\nurl = \"redis://127.0.0.1:1\"\nsurprise = 1\n",
                "surprise",
            ),
        ],
    );
}

#[tokio::test]
async fn config_flag_wins_over_the_environment_and_keys_can_be_overridden() {
    let redis = RedisServer::start();
    let (dir, _, good) = config_for(&redis, "a", "");
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "nonsense = true\n").expect("write");
    let path = good.to_str().expect("utf-8");
    // --config beats ROLLBOARD_CONFIG.
    let out = rollboard(
        Some(&good),
        &["top", "rooms_7d", "--json"],
        &[("ROLLBOARD_CONFIG", bad.to_str().expect("utf-8"))],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    // ROLLBOARD_CONFIG is used without --config.
    let out = rollboard(
        None,
        &["top", "rooms_7d", "--json"],
        &[("ROLLBOARD_CONFIG", path)],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    // ROLLBOARD__SECTION__KEY overrides the file.
    let out = rollboard(
        Some(&good),
        &["top", "rooms_7d"],
        &[("ROLLBOARD__REDIS__URL", "redis://127.0.0.1:1")],
    );
    // A Redis that cannot be reached is an outage: exit 75, run it again later.
    assert_exit(&out, 75, "the override points at a dead port");
    let out = rollboard(
        Some(&good),
        &["top", "rooms_7d"],
        &[("ROLLBOARD__INGEST__BATCH_SIZE", "0")],
    );
    assert_eq!(out.status.code(), Some(64));
    assert_contains(&stderr(&out), "ingest.batch_size");
}

#[tokio::test]
async fn queries_answer_with_the_documented_shapes_and_statuses() {
    let (_redis, store, _dir, config, _) = redis_and_config("a").await;
    let board = &rollboard::config::Settings::from_toml(crate::support::config::BOARDS)
        .expect("boards")
        .boards;
    let now = rollboard::domain::clock::local_ms();
    let events: Vec<rollboard::store::ApplyEvent> = [("r1", 5), ("r2", 9), ("r3", 5)]
        .iter()
        .enumerate()
        .map(|(i, (m, a))| rollboard::store::ApplyEvent {
            id: i.to_string(),
            ts: now - 1000 + i as i64,
            member: m.to_string(),
            amount: *a,
        })
        .collect();
    apply_events(&store, &board[0], &events, now).await;

    let out = rollboard(Some(&config), &["top", "rooms_7d", "--json"], &[]);
    assert!(out.status.success());
    let page: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(page["board"], "rooms_7d");
    assert_eq!(page["scope"], serde_json::Value::Null);
    assert_eq!(page["scale"], 0);
    assert_eq!(page["count"], 3);
    assert!(
        page["window_to"].as_i64().expect("window_to")
            - page["window_from"].as_i64().expect("window_from")
            == 7 * 86_400_000
    );
    let members: Vec<&str> = page["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| e["member"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(members, ["r2", "r1", "r3"], "r1 reached 5 before r3 did");
    assert_eq!(page["entries"][2]["competition_rank"], 2);

    let out = rollboard(Some(&config), &["rank", "rooms_7d", "r3", "--json"], &[]);
    let rank: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(
        (
            rank["rank"].as_u64(),
            rank["competition_rank"].as_u64(),
            rank["total"].as_i64()
        ),
        (Some(3), Some(2), Some(5))
    );
    let out = rollboard(
        Some(&config),
        &["rank", "rooms_7d", "nobody", "--json"],
        &[],
    );
    assert_eq!(out.status.code(), Some(3));
    let rank: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(rank["rank"], serde_json::Value::Null);
    assert_eq!(
        rollboard(Some(&config), &["around", "rooms_7d", "nobody"], &[])
            .status
            .code(),
        Some(3)
    );
    let out = rollboard(
        Some(&config),
        &["around", "rooms_7d", "r1", "--radius", "1", "--json"],
        &[],
    );
    let around: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(around["entries"].as_array().map(Vec::len), Some(3));
    let out = rollboard(
        Some(&config),
        &["top", "rooms_7d", "--offset", "3", "--json"],
        &[],
    );
    let past: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(
        past["entries"].as_array().map(Vec::len),
        Some(0),
        "a page past the end is empty"
    );

    for usage in [
        vec!["top", "fans_7d"],
        vec!["top", "rooms_7d", "--scope", "x"],
        vec!["rank", "fans_7d", "u1"],
        vec!["top", "rooms_7d", "--limit", "0"],
        vec!["top", "rooms_7d", "--limit", "1001"],
        vec!["around", "rooms_7d", "r1", "--radius", "101"],
        vec!["top", "nope"],
        vec!["roll", "--at", "yesterday"],
    ] {
        let out = rollboard(Some(&config), &usage, &[]);
        assert_eq!(out.status.code(), Some(2), "{usage:?}: {}", stderr(&out));
    }
    let out = rollboard(
        Some(&config),
        &["roll", "--at", "2030-01-01T00:00:00Z", "--force"],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = rollboard(Some(&config), &["top", "rooms_7d", "--json"], &[]);
    let page: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(page["count"], 0, "a roll in 2030 expired everything");
}

#[tokio::test]
async fn send_appends_all_or_nothing_and_lists_every_bad_line() {
    let (_redis, store, dir, config, _) = redis_and_config("a").await;
    let input = "{\"room\":\"r1\",\"amount\":5}\n{\"room\":\"r1\",\"amount\":0}\n\n{\"room\":\"r1\",\"amount\":true}\nnot json\n{\"user\":\"u\",\"value\":12.50}\n";
    let file = write_file(dir.path(), "events.jsonl", input);
    let out = rollboard(Some(&config), &["send", file.to_str().expect("utf-8")], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    for line in ["line 2:", "line 4:", "line 5:"] {
        assert!(err.contains(line), "{line} missing in: {err}");
    }
    assert!(
        !err.contains("line 1:") && !err.contains("line 6:"),
        "{err}"
    );
    let len: i64 = store.client().xlen(intake_stream()).await.expect("xlen");
    assert_eq!(len, 0, "nothing appended");
    std::fs::write(
        &file,
        "{\"room\":\"r1\",\"amount\":5}\n{\"user\":\"u\",\"value\":12.50}\n",
    )
    .expect("write");
    let out = rollboard(Some(&config), &["send", file.to_str().expect("utf-8")], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let entries: Vec<(String, std::collections::HashMap<String, String>)> = store
        .client()
        .xrange(intake_stream(), "-", "+", None)
        .await
        .expect("xrange");
    assert_eq!(entries.len(), 2);
    assert_eq!(
        entries[1].1["value"], "12.5",
        "numbers are taken by their exact value, written plainly"
    );
}
