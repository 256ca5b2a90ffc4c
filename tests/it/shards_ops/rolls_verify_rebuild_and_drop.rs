//! The jobs and the operator's commands over every shard: a roll expires each shard's
//! slices, a shard left empty is cleaned up (only its `meta` stays) and leaves the
//! registry, and comes back with its next event; `verify` checks and names every shard and
//! its repair command runs; `rebuild` repairs every shard; `drop-board` deletes every
//! shard's keys and nothing of a board whose name starts the same, on one server and on
//! a cluster (whose masters the shards span).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use rollboard::domain::board::Board;
use rollboard::store::{Outcome, Store};
use serde_json::Value;

use super::{apply_sharded, comparable, members_by_shard, now0, shard_index, sharded};
use crate::support::asserts::assert_verified;
use crate::support::boards::{
    apply_events, board, ev, keys_matching, redis_now, registered, roll_board, total_at, HOUR,
};
use crate::support::cli::{
    assert_deleted_all, assert_exit, rollboard, run_rollboard, stderr, stdout,
};
use crate::support::cluster::RedisCluster;
use crate::support::config::{board_table, boards_in, write_file, SOLO_BOARD};
use crate::support::http::json;
use crate::support::instances::bump;
use crate::support::keys::{instance, records_prefix, scoped_prefix, shard, under};
use crate::support::redis::RedisServer;

/// Every key under the hash tag of `shard` of board `name`.
async fn shard_keys(store: &Store, name: &str, shard: &str) -> BTreeSet<String> {
    keys_matching(store, &under(&instance(name, Some(shard)), "*"))
        .await
        .into_iter()
        .collect()
}

#[tokio::test]
async fn every_shard_rolls_and_an_emptied_shard_leaves_the_registry_and_comes_back() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let b = sharded("tips", 4);
    let by_shard = members_by_shard(&b, "m", 2);
    let now = now0();
    // Shard #0's members only five hours ago; the others' now, and an hour before.
    let mut events = Vec::new();
    for (s, members) in by_shard.iter().enumerate() {
        for (j, m) in members.iter().enumerate() {
            let back = if s == 0 { 5 * HOUR } else { j as i64 * HOUR };
            events.push(ev(&format!("{s}.{j}"), now - back, m, 10 + j as i64));
        }
    }
    assert_eq!(
        apply_sharded(&store, &b, &events, now).await,
        vec![Outcome::Applied; events.len()]
    );
    assert_eq!(
        store
            .top(&b.widest(), None, 0, 10, now)
            .await
            .expect("top")
            .envelope
            .count,
        8
    );

    // Two hours on, shard #0's slice has left the window: #0 is emptied and cleaned up.
    let later = now + 2 * HOUR;
    let report = roll_board(&store, &b, later).await;
    assert_eq!(report.scopes_removed, 1, "{report:?}");
    assert_eq!(report.instances_failed, 0);
    assert!(!registered(&store, "tips", "#0").await);
    for shard in ["#1", "#2", "#3"] {
        assert!(registered(&store, "tips", shard).await, "{shard}");
        assert_verified(&store, &b.widest(), Some(shard)).await;
    }
    assert_eq!(
        shard_keys(&store, "tips", "#0").await,
        BTreeSet::from([instance("tips", Some(&shard(0))).meta().to_string()]),
        "only meta stays"
    );
    let top = store
        .top(&b.widest(), None, 0, 10, later)
        .await
        .expect("top");
    assert_eq!(top.envelope.count, 6);
    assert!(top.entries.iter().all(|e| shard_index(&b, &e.member) != 0));
    let r = store
        .rank(&b.widest(), None, &by_shard[0][0], later)
        .await
        .expect("rank");
    assert_eq!((r.rank, r.total, r.envelope.count), (None, None, 6));

    // An event of a member of #0: the shard is registered again and counts it.
    let out = apply_sharded(&store, &b, &[ev("back", later, &by_shard[0][1], 4)], later).await;
    assert_eq!(out, [Outcome::Applied]);
    assert!(registered(&store, "tips", "#0").await);
    let r = store
        .rank(&b.widest(), None, &by_shard[0][1], later)
        .await
        .expect("rank");
    assert_eq!((r.rank, r.total, r.envelope.count), (Some(7), Some(4), 7));
    // A copy of an event #0 let go of is late, never counted again.
    let out = apply_sharded(&store, &b, &events[..1], later).await;
    assert_eq!(out, [Outcome::Late]);

    // Past every window: every shard is emptied, cleaned up and unregistered.
    let end = later + 7 * HOUR;
    let report = roll_board(&store, &b, end).await;
    assert_eq!(report.scopes_removed, 4, "{report:?}");
    for shard in b.shard_names() {
        assert!(!registered(&store, "tips", &shard).await, "{shard}");
        assert_eq!(
            shard_keys(&store, "tips", &shard).await,
            BTreeSet::from([instance("tips", Some(&shard)).meta()]),
        );
    }
    let top = store.top(&b.widest(), None, 0, 10, end).await.expect("top");
    assert_eq!((top.envelope.count, top.entries.len()), (0, 0));
    assert!(top.envelope.window_from > later, "{top:?}");
}

/// A board `tips` of two shards, configured beside [`SOLO_BOARD`].
fn boards_toml() -> String {
    board_table("tips", "user", "6h", "shards = 2\n") + SOLO_BOARD
}

/// The boards of [`boards_toml`], as the command line reads them.
fn boards() -> Vec<Board> {
    boards_in(&boards_toml())
}

/// A config file for the Redis at `url` with [`boards_toml`].
fn config(dir: &Path, url: &str) -> PathBuf {
    let text = format!("[redis]\nurl = \"{url}\"\n{}", boards_toml());
    write_file(dir, "c.toml", &text)
}

/// Adds `by` to the stored total of `member` in its shard, behind the scripts' back.
async fn bump_in_shard(store: &Store, b: &Board, member: &str, by: f64) {
    bump(
        store,
        &b.widest(),
        b.shard_of(member).as_deref(),
        member,
        by,
    )
    .await;
}

/// `verify` names each shard; drift in one shard fails it, and the repair command it
/// prints runs and repairs it; `rebuild` of the board rebuilds every shard.
#[tokio::test]
async fn verify_names_every_shard_and_its_repair_command_runs() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let dir = tempfile::tempdir().expect("dir");
    let config = config(dir.path(), &redis.url());
    let [tips, solo] = <[Board; 2]>::try_from(boards()).expect("two boards");
    let by_shard = members_by_shard(&tips, "u", 2);
    let now = redis_now(&store).await;
    let events: Vec<_> = by_shard
        .concat()
        .iter()
        .enumerate()
        .map(|(i, m)| ev(&format!("e{i}"), now, m, i as i64 + 1))
        .collect();
    apply_sharded(&store, &tips, &events, now).await;
    apply_events(&store, &solo, &[ev("s", now, "cy", 3)], now).await;

    let out = run_rollboard(&config, &["verify"]);
    assert_exit(&out, 0, "verify");
    assert_eq!(
        stdout(&out),
        "tips [#0] (incremental): 2 member(s), ok\n\
         tips [#1] (incremental): 2 member(s), ok\n\
         solo (incremental): 1 member(s), ok\n\
         verified 3 instance(s): 0 differing (0 member(s)), 0 failing\n"
    );

    // Drift in both shards: one repair command for the board.
    bump_in_shard(&store, &tips, &by_shard[0][0], 4.0).await;
    bump_in_shard(&store, &tips, &by_shard[1][1], 1.0).await;
    let out = run_rollboard(&config, &["verify", "--json"]);
    assert_exit(&out, 1, "verify --json");
    let lines: Vec<Value> = stdout(&out).lines().map(json).collect();
    assert_eq!(lines[0]["scope"], "#0");
    assert_eq!(
        lines[0]["differences"][0]["member"],
        by_shard[0][0].as_str()
    );
    assert_eq!(lines[1]["scope"], "#1");
    let repair = lines[3]["summary"]["repair"].clone();
    assert_eq!(
        repair,
        serde_json::json!(["rollboard rebuild tips"]),
        "{lines:?}"
    );
    let out = run_rollboard(&config, &["verify"]);
    assert_exit(&out, 1, "verify");
    assert!(
        stdout(&out).ends_with(
            "verified 3 instance(s): 2 differing (2 member(s)), 2 failing; \
             repair with: rollboard rebuild tips\n"
        ),
        "{}",
        stdout(&out)
    );
    // The command printed repairs every shard.
    let out = run_rollboard(&config, &["rebuild", "tips"]);
    assert_exit(&out, 0, "rebuild");
    assert_eq!(
        stdout(&out),
        "tips [#0]: rebuilt, 2 member(s), 1 changed\n\
         tips [#1]: rebuilt, 2 member(s), 1 changed\n\
         rebuilt 2 instance(s) of tips: 2 repaired, 2 member(s) changed\n"
    );
    assert_exit(
        &run_rollboard(&config, &["verify"]),
        0,
        "verify after rebuild",
    );
    for (i, m) in by_shard.concat().iter().enumerate() {
        assert_eq!(
            total_at(&store, &tips.widest(), m, now).await,
            Some(i as i64 + 1),
            "{m}"
        );
    }
    // A shard is not a scope: `--scope` stays refused on the sharded board.
    let out = run_rollboard(&config, &["rebuild", "tips", "--scope", "#0"]);
    assert_exit(&out, 2, "rebuild --scope");
    assert!(
        stderr(&out).contains("board tips is not scoped"),
        "{}",
        stderr(&out)
    );
}

/// Two sharded boards whose names start the same, `tips` and `tips_v2`, beside a plain
/// `tips_24h`, filled through the store at `now`.
async fn fill(store: &Store, now: i64) -> (Board, Vec<Board>) {
    let tips = sharded("tips", 8);
    let v2 = sharded("tips_v2", 8);
    let plain = board("tips_24h", HOUR, 6);
    let events: Vec<_> = (0..40)
        .map(|i| {
            ev(
                &format!("e{i}"),
                now - (i % 3) * HOUR,
                &format!("u{i}"),
                i + 1,
            )
        })
        .collect();
    apply_sharded(store, &tips, &events, now).await;
    apply_sharded(store, &v2, &events, now).await;
    apply_events(store, &plain, &events, now).await;
    (tips, vec![v2, plain])
}

/// Whether `key` is one of the keys of `tips` drop-board must delete.
fn of_tips(key: &str) -> bool {
    key.starts_with(&format!("{}#", scoped_prefix("tips")))
        || key.starts_with(&records_prefix("tips"))
}

/// The top and the totals of `boards`, to compare before and after a drop.
async fn answers(store: &Store, boards: &[Board], now: i64) -> Vec<Value> {
    let mut out = Vec::new();
    for b in boards {
        let top = store
            .top(&b.widest(), None, 0, 100, now)
            .await
            .expect("top");
        assert!(top.envelope.count > 0, "{} holds data", b.name);
        out.push(comparable(&top));
    }
    out
}

async fn drop_board_deletes_every_shard(
    store: &Store,
    url: &str,
    keys: impl Fn() -> BTreeSet<String>,
) {
    let now = now0();
    let (tips, survivors) = fill(store, now).await;
    let before = keys();
    let doomed: Vec<&String> = before.iter().filter(|k| of_tips(k)).collect();
    for shard in tips.shard_names() {
        assert!(
            doomed
                .iter()
                .any(|k| k.starts_with(&under(&instance("tips", Some(&shard)), ""))),
            "{shard} holds keys: {doomed:?}"
        );
    }
    let answers_before = answers(store, &survivors, now).await;
    let dir = tempfile::tempdir().expect("dir");
    let text = "\n[[boards]]\nname = \"tips_v2\"\nmember = \"user\"\nwindow = \"6h\"\nslice = \"1h\"\nshards = 8\n";
    let config = write_file(
        dir.path(),
        "c.toml",
        &format!("[redis]\nurl = \"{url}\"\n{text}"),
    );
    let out = rollboard(Some(&config), &["drop-board", "tips"], &[]);
    assert_exit(&out, 0, "drop-board");
    assert_deleted_all(&out, doomed.len());
    let expected: BTreeSet<String> = before.iter().filter(|k| !of_tips(k)).cloned().collect();
    assert_eq!(keys(), expected);
    assert_eq!(answers(store, &survivors, now).await, answers_before);
    let top = store
        .top(&tips.widest(), None, 0, 10, now)
        .await
        .expect("top");
    assert_eq!(top.envelope.count, 0);
}

#[tokio::test]
async fn drop_board_deletes_every_shards_keys_on_one_server() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let keys = || redis.scan_all();
    drop_board_deletes_every_shard(&store, &redis.url(), keys).await;
}

#[tokio::test]
async fn drop_board_deletes_every_shards_keys_on_a_cluster() {
    let cluster = RedisCluster::start();
    let store = cluster.store().await;
    let keys = || cluster.scan_all();
    let holders: BTreeSet<u16> = (0..8)
        .map(|s| cluster.owner_of(&instance("tips", Some(&shard(s))).result()))
        .collect();
    assert!(holders.len() > 1, "the shards span masters: {holders:?}");
    drop_board_deletes_every_shard(&store, &cluster.url(), keys).await;
}
