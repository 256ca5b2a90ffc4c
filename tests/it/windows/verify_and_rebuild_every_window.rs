//! `verify` and `rebuild` on a board with several windows: each window's instance is
//! checked against its own slices and named by its window; a rebuild repairs every window
//! and leaves the idempotency keys, which only the widest window's instance keeps, as they
//! were. A board with one window reads as before.

use std::collections::BTreeMap;

use rollboard::domain::board::Board;
use rollboard::roll;
use rollboard::store::{Outcome, Store};
use serde_json::Value;

use crate::support::boards::{apply_events, apply_events_in, dump, ev, keys_matching, HOUR};
use crate::support::cli::{assert_exit, run_rollboard, stdout};
use crate::support::config::{board_table, boards_in, write_file, SOLO_BOARD};
use crate::support::http::json;
use crate::support::instances::bump;
use crate::support::keys::{instance, under};
use crate::support::redis::RedisServer;

const NOW: i64 = 1_763_700_000_000;

/// A scoped board `tips` ranking the last 2 and 6 hours, configured beside [`SOLO_BOARD`]
/// (an unscoped board with one window).
fn boards_toml() -> String {
    board_table("tips", "user", r#"["2h", "6h"]"#, "scope = \"room\"\n") + SOLO_BOARD
}

/// The boards of [`boards_toml`], as the command line reads them.
fn boards() -> Vec<Board> {
    boards_in(&boards_toml())
}

/// Every key of the widest window's instance of `scope` (no `:w:` in its name) with its
/// DUMP.
async fn widest_keys(store: &Store, scope: &str) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for key in keys_matching(store, &under(&instance("tips", Some(scope)), "*")).await {
        if !key.contains(":w:") {
            let bytes = dump(store, &key).await;
            out.insert(key, bytes);
        }
    }
    out
}

#[tokio::test]
async fn verify_names_each_window_and_rebuild_repairs_every_window() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write_file(
        dir.path(),
        "c.toml",
        &format!("[redis]\nurl = \"{}\"\n{}", redis.url(), boards_toml()),
    );
    let [tips, solo] = <[Board; 2]>::try_from(boards()).expect("two boards");
    let (short, wide) = (
        tips.view(Some("2h")).expect("2h"),
        tips.view(Some("6h")).expect("6h"),
    );
    let now = (NOW / HOUR) * HOUR + HOUR / 2;
    let events = [
        ev("old", now - 3 * HOUR, "ann", 100),
        ev("new", now, "ann", 7),
        ev("bob", now - HOUR, "bob", 50),
    ];
    apply_events_in(&store, &tips, "r1", &events, now).await;
    apply_events(&store, &solo, &[ev("s", now, "cy", 3)], now).await;

    let out = run_rollboard(&config, &["verify"]);
    assert_exit(&out, 0, "verify");
    assert_eq!(
        stdout(&out),
        "tips [r1] window 2h (incremental): 2 member(s), ok\n\
         tips [r1] window 6h (incremental): 2 member(s), ok\n\
         solo (incremental): 1 member(s), ok\n\
         verified 3 instance(s): 0 differing (0 member(s)), 0 failing\n"
    );

    // Drift in each window of r1, by hand.
    bump(&store, &short, Some("r1"), "bob", 4.0).await;
    bump(&store, &wide, Some("r1"), "ann", 1.0).await;
    let out = run_rollboard(&config, &["verify"]);
    assert_exit(&out, 1, "verify");
    assert_eq!(
        stdout(&out),
        "tips [r1] window 2h (incremental): 2 member(s), DRIFT in 1 member(s)\n  \
           bob: slices 50 stored 54\n\
         tips [r1] window 6h (incremental): 2 member(s), DRIFT in 1 member(s)\n  \
           ann: slices 107 stored 108\n\
         solo (incremental): 1 member(s), ok\n\
         verified 3 instance(s): 2 differing (2 member(s)), 2 failing; \
         repair with: rollboard rebuild tips --scope r1\n"
    );
    let out = run_rollboard(&config, &["verify", "--json"]);
    assert_exit(&out, 1, "verify --json");
    let lines: Vec<Value> = stdout(&out).lines().map(json).collect();
    assert_eq!(lines.len(), 4, "three instances and the summary");
    assert_eq!(
        lines[0],
        serde_json::json!({"board": "tips", "scope": "r1", "window": "2h",
            "mode": "incremental", "members": 2,
            "differences": [{"member": "bob", "expected": 50, "stored": 54}],
            "amount_behind": 4})
    );
    assert_eq!(lines[1]["window"], "6h");
    assert_eq!(lines[1]["differences"][0]["member"], "ann");
    // A board with one window: no `window` field, as before.
    assert_eq!(
        lines[2],
        serde_json::json!({"board": "solo", "scope": null, "mode": "incremental",
            "members": 1, "differences": [], "amount_behind": 0})
    );
    assert_eq!(
        lines[3]["summary"]["repair"],
        serde_json::json!(["rollboard rebuild tips --scope r1"])
    );

    // The narrower window rebuilt alone: not one key of the widest's instance changes (its
    // digest table and forget logs, and its drift, stay).
    let before = widest_keys(&store, "r1").await;
    assert!(
        before.contains_key(&instance("tips", Some("r1")).seen_table()),
        "{before:?}"
    );
    assert!(
        before.keys().any(
            |k| k.starts_with(&under(&instance("tips", Some("r1")), "seen:"))
                && *k != instance("tips", Some("r1")).seen_table()
        ),
        "forget logs: {before:?}"
    );
    let rebuilt = roll::rebuild(&store, &short, Some("r1"), 10)
        .await
        .expect("rebuild");
    assert_eq!((rebuilt.members, rebuilt.changed), (2, 1));
    assert_eq!(widest_keys(&store, "r1").await, before);
    let v = roll::verify(&store, &short, Some("r1"), 10)
        .await
        .expect("verify");
    assert!(v.differences.is_empty(), "{v:?}");

    // The command rebuilds every window; the idempotency keys stay as they were.
    let seen = |keys: &BTreeMap<String, Vec<u8>>| -> BTreeMap<String, Vec<u8>> {
        keys.iter()
            .filter(|(k, _)| k.contains(":seen"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let out = run_rollboard(&config, &["rebuild", "tips"]);
    assert_exit(&out, 0, "rebuild");
    assert_eq!(
        stdout(&out),
        "tips [r1] window 2h: rebuilt, 2 member(s), 0 changed\n\
         tips [r1] window 6h: rebuilt, 2 member(s), 1 changed\n\
         rebuilt 2 instance(s) of tips: 1 repaired, 1 member(s) changed\n"
    );
    assert_eq!(seen(&widest_keys(&store, "r1").await), seen(&before));
    let out = run_rollboard(&config, &["verify"]);
    assert_exit(&out, 0, "verify after rebuild");
    assert!(
        stdout(&out).ends_with("verified 3 instance(s): 0 differing (0 member(s)), 0 failing\n"),
        "{}",
        stdout(&out)
    );
    // Still deduplicated once, and counted in each window as the model says.
    let out = apply_events_in(&store, &tips, "r1", &events, now).await;
    assert_eq!(out, vec![Outcome::Duplicate; 3]);
    for (view, member, want) in [
        (&short, "ann", 7),
        (&short, "bob", 50),
        (&wide, "ann", 107),
        (&wide, "bob", 50),
    ] {
        let rank = store.rank(view, Some("r1"), member, now).await;
        assert_eq!(rank.expect("rank").total, Some(want), "{member}");
    }
}
