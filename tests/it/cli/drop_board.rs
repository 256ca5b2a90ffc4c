//! `rollboard drop-board`: it deletes every key of exactly one board (the unscoped
//! instance, every scoped one, registered or not, in each of the board's windows,
//! leftover scratch keys and the board's records) and nothing of a board whose name merely
//! starts the same way (`tips` against `tips_v2` and `tips_24h`), change feeds included,
//! on one server and on a cluster; `--dry-run` deletes nothing; a configured board is
//! refused without `--force`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};
use rollboard::domain::board::{Board, Mode, Window};
use rollboard::domain::ranking::Page;
use rollboard::metrics::Metrics;
use rollboard::roll::Verified;
use rollboard::store::Store;

use crate::support::boards::{board, dump, entry, ingest_settings, roll_all, set_string, Consumer};
use crate::support::cli::{assert_contains, assert_deleted_all, rollboard, stderr, stdout};
use crate::support::keys::{instance, instance_in, intake_stream, records_prefix, schema, under};
use crate::support::redis::RedisServer;

const SLICE: i64 = 60_000;
const N: i64 = 10;

/// Scope values that a glob or a hash tag could trip over.
const ROOMS: [&str; 6] = ["lobby", "a:b", "x*", "{c}", "d}e", "tips:x"];

/// A scoped resummarize board with refunds, ranking the last 4 and 10 minutes: every kind
/// of instance key gets written, in each window.
fn scoped(name: &str) -> Board {
    let mut b = board(name, SLICE, N);
    b.scope = Some("room".into());
    b.mode = Mode::Resummarize;
    b.allow_negative = true;
    b.windows = ["4m", "10m"]
        .into_iter()
        .map(|w| Window {
            name: w.into(),
            ms: rollboard::domain::board::parse_duration_ms(w).expect("a duration"),
        })
        .collect();
    b
}

/// Applies `count` events through the consumer's batch path at `now`, one room of `rooms`
/// each, to every board of `boards` they match.
async fn fill(store: &Store, boards: &[Board], now: i64, rooms: &[&str], tag: &str, count: usize) {
    let metrics = Metrics::new(boards);
    let settings = ingest_settings(intake_stream(), 1);
    let entries: Vec<_> = (0..count)
        .map(|i| {
            let ts = (now - (i as i64 % 3) * SLICE).to_string();
            let (user, amount) = (format!("u{}", i % 7), (i % 5 + 1).to_string());
            let id = format!("{tag}-{i}");
            let room = rooms[i % rooms.len()];
            entry(
                &format!("{now}-{i}"),
                &[
                    ("user", &user),
                    ("amount", &amount),
                    ("room", room),
                    ("ts", &ts),
                    ("id", &id),
                ],
            )
        })
        .collect();
    Consumer::new(store, boards, &settings, &metrics)
        .process(intake_stream(), &entries, now)
        .await
        .expect("apply");
}

/// The board `tips` in every shape a dropped board may leave: an unscoped instance (the
/// board was unscoped once, with one window), scoped instances in two windows (scope
/// values with `:`, `*`, `{`, `}`), one instance whose scope left the registry (only its
/// `meta` remains, in each window), leftover scratch keys of a recomputation that died,
/// and a key under its hash tag that rollboard never writes. Beside it `tips_v2` (scoped,
/// the same two windows, the same rooms and a room named `tips`) and `tips_24h`.
/// Returns the boards that must survive, and the time.
async fn fill_lookalikes(store: &Store) -> (Vec<Board>, i64) {
    let now = rollboard::domain::clock::local_ms();
    let (tips, tips_v2, tips_24h) = (
        scoped("tips"),
        scoped("tips_v2"),
        board("tips_24h", SLICE, N),
    );
    let all = vec![tips.clone(), tips_v2.clone(), tips_24h.clone()];
    let conflicts = store
        .check_settings(&all)
        .await
        .expect("record the settings");
    assert!(conflicts.is_empty(), "{conflicts:?}");
    // A room whose data leaves the window: the roll cleans its instances up and takes the
    // room out of the registries, leaving each instance's `meta`.
    let old = now - 3 * N * SLICE;
    fill(store, &all, old, &["gone"], "old", 10).await;
    roll_all(store, &all, now, 100).await;
    fill(
        store,
        &[board("tips", SLICE, N)],
        now,
        &["-"],
        "unscoped",
        20,
    )
    .await;
    let mut rooms = ROOMS.to_vec();
    fill(store, &all, now, &rooms, "now", 120).await;
    rooms.push("tips");
    fill(store, std::slice::from_ref(&tips_v2), now, &rooms, "v2", 40).await;
    roll_all(store, &all, now, 100).await;
    for key in [
        instance("tips", None).scratch("18f00d", "result"),
        format!(
            "{}:old",
            instance("tips", Some("a:b")).scratch("18f00d", "ranked")
        ),
        under(&instance("tips", None), "not-ours"),
    ] {
        set_string(store, &key, "x").await;
    }
    // Change feeds: of tips (unscoped, scoped, another window) and of the lookalikes.
    for key in [
        schema().changes("tips", None, None),
        schema().changes("tips", None, Some("24h")),
        schema().changes("tips", Some("a:b"), None),
        schema().changes("tips", Some("d}e"), Some("7d")),
        schema().changes("tips", Some("lobby"), Some("4m")),
        schema().changes("tips_v2", None, None),
        schema().changes("tips_v2", Some("tips"), None),
        schema().changes("tips_v2", Some("tips"), Some("4m")),
        schema().changes("tips_24h", None, None),
    ] {
        let command = CustomCommand::new_static("XADD", ClusterHash::FirstKey, false);
        let args = vec![
            key.as_str(),
            "*",
            "kind",
            "entered",
            "member",
            "u1",
            "rank",
            "1",
        ];
        let _: String = store.client().custom(command, args).await.expect("xadd");
    }
    for view in tips.views() {
        let gone = store.instance(&view, Some("gone"));
        let exists: i64 = store.client().exists(gone.meta()).await.expect("exists");
        assert_eq!(
            exists,
            1,
            "the emptied room keeps its meta: {}",
            gone.meta()
        );
    }
    for board in ["tips", "tips_v2"] {
        let narrow: Option<String> = store
            .client()
            .hget(store.keys().window(board), "expired_through:4m")
            .await
            .expect("hget");
        assert!(narrow.is_some(), "{board}: the 4m window's watermark");
    }
    let registered: Option<f64> = store
        .client()
        .zscore(store.keys().scopes("tips"), "gone")
        .await
        .expect("zscore");
    assert_eq!(registered, None, "the emptied room left the registry");
    (vec![tips_v2, tips_24h], now)
}

/// Whether `key` is one of the keys of `tips` that drop-board must delete.
fn of_tips(key: &str) -> bool {
    // The board's patterns, each a prefix and `*`, but its widest window's change feed.
    let [unscoped, scoped, feed, feeds, scoped_feeds] = schema().board_patterns("tips");
    let starts = |pattern: &str| key.starts_with(pattern.trim_end_matches('*'));
    (starts(&unscoped)
        || starts(&scoped)
        || key == feed
        || starts(&feeds)
        || starts(&scoped_feeds)
        || key.starts_with(&records_prefix("tips")))
        && key != under(&instance("tips", None), "not-ours")
}

/// Every key of the server, with its content (support's `dump`).
async fn dump_all(store: &Store) -> BTreeMap<String, Vec<u8>> {
    let mut keys = BTreeSet::new();
    let mut cursor = "0".to_string();
    loop {
        let (next, page): (String, Vec<String>) = store
            .client()
            .custom(
                CustomCommand::new_static("SCAN", ClusterHash::Random, false),
                vec![cursor.as_str(), "COUNT", "1000"],
            )
            .await
            .expect("scan");
        keys.extend(page);
        if next == "0" {
            break;
        }
        cursor = next;
    }
    let mut out = BTreeMap::new();
    for key in keys {
        let bytes = dump(store, &key).await;
        out.insert(key, bytes);
    }
    out
}

/// The top page and the verification of every instance of `boards`, in each window.
async fn answers(store: &Store, boards: &[Board], now: i64) -> Vec<(Page, Verified)> {
    let mut out = Vec::new();
    for board in boards {
        let scopes = rollboard::roll::instances(store, board)
            .await
            .expect("instances");
        for (b, scope) in board
            .views()
            .iter()
            .flat_map(|b| scopes.iter().map(move |s| (b, s)))
        {
            let top = store
                .top(b, scope.as_deref(), 0, 100, now)
                .await
                .expect("top");
            let verified = rollboard::roll::verify(store, b, scope.as_deref(), 100)
                .await
                .expect("verify");
            assert!(
                !top.entries.is_empty(),
                "{} {scope:?} holds data",
                b.board()
            );
            assert!(verified.differences.is_empty(), "{verified:?}");
            out.push((top, verified));
        }
    }
    out
}

/// A config file for `url` naming `boards` (TOML `[[boards]]` tables).
fn config(dir: &Path, url: &str, boards: &str) -> PathBuf {
    let path = dir.join("rollboard.toml");
    std::fs::write(&path, format!("[redis]\nurl = \"{url}\"\n{boards}")).expect("write config");
    path
}

const LOOKALIKES: &str = concat!(
    "\n[[boards]]\nname = \"tips_v2\"\nmember = \"user\"\nscope = \"room\"\nwindows = [\"4m\", \"10m\"]\nslice = \"1m\"\nmode = \"resummarize\"\nallow_negative = true\n\n",
    "[[boards]]\nname = \"tips_24h\"\nmember = \"user\"\nwindow = \"10m\"\nslice = \"1m\"\n",
);

const TIPS: &str = "\n[[boards]]\nname = \"tips\"\nmember = \"user\"\nscope = \"room\"\nwindows = [\"4m\", \"10m\"]\nslice = \"1m\"\nmode = \"resummarize\"\nallow_negative = true\n";

#[tokio::test]
async fn dropping_a_board_deletes_exactly_its_keys_and_leaves_boards_with_the_same_start() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let (survivors, now) = fill_lookalikes(&store).await;
    let dir = tempfile::tempdir().expect("dir");
    let config = config(dir.path(), &redis.url(), LOOKALIKES);
    let before = dump_all(&store).await;
    let answers_before = answers(&store, &survivors, now).await;
    let doomed: BTreeSet<&String> = before.keys().filter(|k| of_tips(k)).collect();
    for key in [
        instance("tips", None).result(),
        instance("tips", Some("a:b")).result(),
        instance("tips", Some("x*")).ranked(),
        instance("tips", Some("{c}")).totals(),
        instance("tips", Some("d}e")).refs(),
        instance("tips", Some("tips:x")).seen_table(),
        instance("tips", Some("gone")).meta(),
        instance_in("tips", Some("gone"), "4m").meta(),
        instance_in("tips", Some("a:b"), "4m").result(),
        instance_in("tips", Some("x*"), "4m").ranked(),
        instance_in("tips", Some("{c}"), "4m").totals(),
        instance_in("tips", Some("d}e"), "4m").refs(),
        instance("tips", None).scratch("18f00d", "result"),
        format!(
            "{}:old",
            instance("tips", Some("a:b")).scratch("18f00d", "ranked")
        ),
        schema().scopes("tips"),
        schema().window("tips"),
        schema().settings("tips"),
        schema().changes("tips", None, None),
        schema().changes("tips", None, Some("24h")),
        schema().changes("tips", Some("a:b"), None),
        schema().changes("tips", Some("d}e"), Some("7d")),
        schema().changes("tips", Some("lobby"), Some("4m")),
    ] {
        assert!(
            doomed.contains(&key.to_string()),
            "{key} was written: {doomed:?}"
        );
    }

    assert!(
        doomed
            .iter()
            .any(|k| k.starts_with(&under(&instance_in("tips", Some("lobby"), "4m"), "slice:"))),
        "the narrower window's slices: {doomed:?}"
    );
    for key in [
        instance_in("tips_v2", Some("a:b"), "4m").result(),
        instance_in("tips_v2", Some("tips"), "4m").members(),
        schema().changes("tips_v2", Some("tips"), Some("4m")),
    ] {
        assert!(before.contains_key(&key), "{key} of tips_v2 was written");
    }

    // --dry-run lists every key and deletes none.
    let out = rollboard(Some(&config), &["drop-board", "tips", "--dry-run"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let listed = stdout(&out);
    for key in &doomed {
        assert!(listed.contains(key.as_str()), "{key} not listed:\n{listed}");
    }
    assert!(
        listed.contains(&under(&instance("tips", None), "not-ours")),
        "{listed}"
    );
    assert!(listed.contains("nothing was deleted"), "{listed}");
    // The registries name every key of the registered scopes in both windows: the scan
    // alone finds the emptied room's `meta` in each window, the scratch keys and the
    // change streams of windows the board does not have.
    assert!(
        listed.contains("(6 found only by the key scan)"),
        "{listed}"
    );
    assert_eq!(dump_all(&store).await, before, "a dry run deletes nothing");

    let out = rollboard(Some(&config), &["drop-board", "tips"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report = stdout(&out);
    assert_deleted_all(&out, doomed.len());
    for instance in [
        "(unscoped)",
        "scope \"gone\"",
        "scope \"d}e\"",
        "scope \"x*\"",
    ] {
        assert!(report.contains(&format!("instance {instance}")), "{report}");
    }
    let expected: BTreeMap<String, Vec<u8>> =
        before.into_iter().filter(|(k, _)| !of_tips(k)).collect();
    assert_eq!(
        dump_all(&store).await,
        expected,
        "exactly the keys of tips are gone"
    );
    assert_eq!(answers(&store, &survivors, now).await, answers_before);

    // Nothing is left to find.
    let out = rollboard(Some(&config), &["drop-board", "tips"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_contains(&stdout(&out), "deleted 0 of 0 key(s)");
}

#[tokio::test]
async fn a_configured_board_is_refused_without_force_and_names_must_be_board_names() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let (survivors, now) = fill_lookalikes(&store).await;
    let dir = tempfile::tempdir().expect("dir");
    let config = config(dir.path(), &redis.url(), &format!("{TIPS}{LOOKALIKES}"));
    let before = dump_all(&store).await;

    for args in [
        &["drop-board", "tips"][..],
        &["drop-board", "tips", "--dry-run"],
    ] {
        let out = rollboard(Some(&config), args, &[]);
        assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
        assert!(stderr(&out).contains("--force"), "{}", stderr(&out));
    }
    for name in ["tips*", "tips:x", "{tips}", "Tips", ""] {
        let out = rollboard(Some(&config), &["drop-board", name], &[]);
        assert_eq!(out.status.code(), Some(2), "{name}: {}", stderr(&out));
    }
    assert_eq!(dump_all(&store).await, before, "nothing was deleted");

    let out = rollboard(Some(&config), &["drop-board", "tips", "--force"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let left: BTreeSet<String> = dump_all(&store).await.into_keys().collect();
    let expected: BTreeSet<String> = before.into_keys().filter(|k| !of_tips(k)).collect();
    assert_eq!(left, expected);
    answers(&store, &survivors, now).await;
}

#[tokio::test]
async fn dropping_a_board_on_a_cluster_scans_every_master() {
    let cluster = crate::support::cluster::RedisCluster::start();
    let store = cluster.store().await;
    let (survivors, now) = fill_lookalikes(&store).await;
    let keys = || cluster.scan_all();
    let before = keys();
    let doomed: Vec<&String> = before.iter().filter(|k| of_tips(k)).collect();
    let holders: BTreeSet<u16> = cluster
        .masters()
        .into_iter()
        .filter(|port| {
            crate::support::cluster::cli(
                *port,
                &["--scan", "--pattern", &schema().board_patterns("tips")[1]],
            )
            .lines()
            .next()
            .is_some()
        })
        .collect();
    assert!(
        holders.len() > 1,
        "the instances of tips span masters: {holders:?}"
    );
    let answers_before = answers(&store, &survivors, now).await;
    let dir = tempfile::tempdir().expect("dir");
    let config = config(dir.path(), &cluster.url(), LOOKALIKES);

    let out = rollboard(Some(&config), &["drop-board", "tips"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_deleted_all(&out, doomed.len());
    let expected: BTreeSet<String> = before.iter().filter(|k| !of_tips(k)).cloned().collect();
    assert_eq!(keys(), expected);
    assert_eq!(answers(&store, &survivors, now).await, answers_before);
}

#[tokio::test]
async fn the_shipped_redis_user_may_not_scan_so_drop_board_stops_before_deleting() {
    let dir = tempfile::tempdir().expect("dir");
    let redis = crate::support::acl::acl_server(dir.path(), &[]);
    let url = crate::support::acl::acl_url(&redis);
    let store = Store::connect(&url, "rb", 2, rollboard::store::Reconnect::Never)
        .await
        .expect("connect as the rollboard user");
    let now = rollboard::domain::clock::local_ms();
    fill(&store, &[scoped("tips")], now, &ROOMS, "acl", 30).await;
    let config = config(dir.path(), &url, LOOKALIKES);

    let out = rollboard(Some(&config), &["drop-board", "tips"], &[]);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(stderr(&out).contains("SCAN"), "{}", stderr(&out));
    let members = store
        .instance(&scoped("tips").widest(), Some("a:b"))
        .members();
    let exists: i64 = store.client().exists(members).await.expect("exists");
    assert_eq!(exists, 1, "nothing was deleted");
}
