//! `verify` and `rebuild`: verify finds every drift (a slice a cancelled roll left behind
//! too) and rebuild repairs every difference verify lists, and both say what they found.

use std::time::Duration;

use fred::prelude::*;
use rollboard::domain::board::TieBreak;
use rollboard::roll::{self};
use serde_json::Value;

use crate::support::asserts::{assert_verified, verify_differences};
use crate::support::boards::{
    apply_events, board, ev, roll_board, roll_once, test_boards, variants, with_fresh_store, HOUR,
    T0,
};
use crate::support::cli::{rollboard, stderr, stdout};
use crate::support::events::stepped_events;
use crate::support::http::{json, with_one_tip};
use crate::support::keys::instance;
use crate::support::model::{assert_matches, assert_rolled_and_verified, Instance};
use crate::support::redis::RedisServer;
use crate::support::wait::wait_for;

const SLICE: i64 = 1_000;
const NOW: i64 = 1_000_000;

/// `verify` ends with a summary (instances, differing, the command that repairs them),
/// in text and as the last `--json` line; `rebuild` says what it changed; stderr stays
/// empty for a short run.
#[tokio::test]
async fn verify_summarises_and_rebuild_says_what_it_repaired() {
    let (_redis, store, _dir, config, daemon) = with_one_tip().await;
    let fans = test_boards()
        .into_iter()
        .find(|b| b.name == "fans_7d")
        .expect("fans");
    // The resummarize run has summed the tip.
    let summed = wait_for(Duration::from_secs(10), || async {
        rollboard::roll::verify(&store, &fans.widest(), Some("r1"), 100)
            .await
            .is_ok_and(|v| v.differences.is_empty())
    })
    .await;
    assert!(summed);
    daemon.terminate().await;
    let out = rollboard(Some(&config), &["verify"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let last = text.lines().last().expect("output");
    // rooms_7d, tips_24h (unscoped: always checked) and fans_7d's one scope.
    assert_eq!(
        last,
        "verified 3 instance(s): 0 differing (0 member(s)), 0 failing"
    );
    assert_eq!(stderr(&out), "", "no progress lines for a short run");

    // Drift by hand: r1's stored total is raised by 3.
    let rooms = test_boards()
        .into_iter()
        .find(|b| b.name == "rooms_7d")
        .expect("rooms");
    let result = store.instance(&rooms.widest(), None).result();
    let members: Vec<String> = store
        .client()
        .zrange(result.as_str(), 0, -1, None, false, None, false)
        .await
        .expect("ZRANGE");
    assert_eq!(members.len(), 1);
    let _: f64 = store
        .client()
        .zincrby(result.as_str(), 3.0, members[0].as_str())
        .await
        .expect("ZINCRBY");
    let out = rollboard(Some(&config), &["verify"], &[]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(text.contains("r1: slices 5 stored 8"), "{text}");
    assert_eq!(
        text.lines().last(),
        Some(
            "verified 3 instance(s): 1 differing (1 member(s)), 1 failing; \
             repair with: rollboard rebuild rooms_7d"
        ),
        "{text}"
    );
    let out = rollboard(Some(&config), &["verify", "--json"], &[]);
    assert_eq!(out.status.code(), Some(1));
    let lines: Vec<Value> = stdout(&out).lines().map(json).collect();
    assert_eq!(lines.len(), 4, "three instances and the summary");
    assert_eq!(lines[0]["board"], "rooms_7d");
    assert_eq!(lines[0]["differences"][0]["member"], "r1");
    assert_eq!(lines[0]["differences"][0]["expected"], 5);
    assert_eq!(lines[0]["differences"][0]["stored"], 8);
    assert_eq!(
        lines[3],
        serde_json::json!({"summary": {
            "instances": 3, "differing": 1, "failing": 1, "members_differing": 1,
            "repair": ["rollboard rebuild rooms_7d"],
        }})
    );
    assert_eq!(stderr(&out), "");

    let out = rollboard(Some(&config), &["rebuild", "rooms_7d"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "rooms_7d: rebuilt, 1 member(s), 1 changed\n\
         rebuilt 1 instance(s) of rooms_7d: 1 repaired, 1 member(s) changed\n"
    );
    let out = rollboard(Some(&config), &["rebuild", "fans_7d"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "fans_7d [r1]: rebuilt, 1 member(s), 0 changed\n\
         rebuilt 1 instance(s) of fans_7d: 0 repaired, 0 member(s) changed\n"
    );
    let out = rollboard(Some(&config), &["verify"], &[]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).ends_with("3 instance(s): 0 differing (0 member(s)), 0 failing\n"));
}

#[tokio::test]
async fn verify_finds_drift_and_rebuild_repairs_it() {
    let (redis, store, mut b) = with_fresh_store(board("rooms", HOUR, 24)).await;
    b.tie_break = TieBreak::Latest;
    let events = stepped_events(50, T0, 60_000, 9);
    apply_events(&store, &b, &events, T0).await;
    let mut model = Instance::default();
    for e in &events {
        model.apply(&b.widest(), e, T0);
    }
    let before = store.top(&b.widest(), None, 0, 100, T0).await.unwrap();
    // Corrupt: bump one member's score and add a stranger. (`members` holds the
    // tie-break time the ZSet member is made of.)
    let ts: String = store
        .client()
        .hget(instance("rooms", None).members(), "m3")
        .await
        .unwrap();
    let z = rollboard::domain::ranking::encode_member(b.tie_break, "m3", ts.parse().unwrap());
    let _: f64 = store
        .client()
        .zincrby(instance("rooms", None).result(), 5.0, &z)
        .await
        .unwrap();
    let _: i64 = store
        .client()
        .zadd(
            instance("rooms", None).result(),
            None,
            None,
            false,
            false,
            (9.0, "0000000000000001:ghost"),
        )
        .await
        .unwrap();
    let v = roll::verify(&store, &b.widest(), None, 10).await.unwrap();
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
    assert_verified(&store, &b.widest(), None).await;
    assert_eq!(
        store.top(&b.widest(), None, 0, 100, T0).await.unwrap(),
        before
    );
    assert_matches(&store, &b.widest(), None, &model, T0).await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rollboard"))
        .args(["--config", config.to_str().unwrap(), "verify"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
}

#[tokio::test]
async fn verify_and_rebuild_see_a_slice_that_a_cancelled_roll_left_behind() {
    let (_redis, store, b) = with_fresh_store(board("rooms", HOUR, 2)).await;
    let events = [
        ev("1", T0, "alice", 10),
        ev("2", T0 + HOUR, "alice", 5),
        ev("3", T0 + HOUR, "bob", 3),
    ];
    apply_events(&store, &b, &events, T0 + HOUR).await;
    let mut model = Instance::default();
    for e in &events {
        model.apply(&b.widest(), e, T0 + HOUR);
    }
    // A roll that raised the watermark and was stopped before its first chunk.
    let (w, dead) = store
        .raise_watermark(&b.widest(), None, b.slice_of(T0), T0 + 2 * HOUR)
        .await
        .unwrap();
    assert_eq!((w, dead.len()), (b.slice_of(T0), 1));
    assert_verified(&store, &b.widest(), None).await;
    roll::rebuild(&store, &b.widest(), None, 10).await.unwrap();
    assert_eq!(
        store
            .rank(&b.widest(), None, "alice", T0 + HOUR)
            .await
            .unwrap()
            .total,
        Some(15),
        "nothing subtracted yet"
    );
    // The next roll finishes the slice: exactly the model.
    roll_board(&store, &b, T0 + 2 * HOUR).await;
    assert_rolled_and_verified(&store, &b, &mut model, T0 + 2 * HOUR).await;
}

#[tokio::test]
async fn rebuild_repairs_every_difference_verify_lists() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    for board in variants(SLICE, 4) {
        let _: () = store.client().flushall(false).await.expect("flush");
        let events = vec![
            ev("1", NOW - 10, "a", 5),
            ev("2", NOW - 20, "b", 7),
            ev("3", NOW - SLICE, "c", 9),
            ev("4", NOW - SLICE, "b", 2),
        ];
        apply_events(&store, &board, &events, NOW).await;
        roll_once(&store, &board, NOW).await;
        let k = store.instance(&board.widest(), None);
        let c = store.client();
        // Damage: b's tie-break entry and ranking row lost, a's slice amount changed
        // behind the script's back, c's ranking score changed.
        // (`members` holds the tie-break time the ZSet member is made of.)
        let zmember = |ts: Option<String>, member: &str| {
            let ts = ts.expect("known").parse().unwrap_or_default();
            rollboard::domain::ranking::encode_member(board.tie_break, member, ts)
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
        let v = roll::verify(&store, &board.widest(), None, 100)
            .await
            .expect("verify");
        let listed: Vec<&str> = v.differences.iter().map(|d| d.member.as_str()).collect();
        assert_eq!(listed, ["a", "b", "c"], "{}", board.name);
        let rebuilt = roll::rebuild(&store, &board.widest(), None, 2)
            .await
            .expect("rebuild");
        assert_eq!(rebuilt.estimated, ["b"], "{}", board.name);
        let d = verify_differences(&store, &board, None).await;
        assert!(d.is_empty(), "{}: {:?}", board.name, d);
        let totals: Vec<(String, Option<i64>)> = {
            let mut out = Vec::new();
            for m in ["a", "b", "c"] {
                let r = store
                    .rank(&board.widest(), None, m, NOW)
                    .await
                    .expect("rank");
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
        apply_events(&store, &board, &[ev("5", NOW, "b", 1)], NOW).await;
        roll_once(&store, &board, NOW).await;
        let r = store
            .rank(&board.widest(), None, "b", NOW)
            .await
            .expect("rank");
        assert_eq!(r.total, Some(10), "{}", board.name);
    }
}
