//! Idempotency keys taken from stream entry IDs across several stream keys: an event without
//! an `id` read from a partition is keyed by the partition's key and its entry ID, the
//! docs/operations.md's replay of dead letters restores `ts` too, and a dead-letter stream named like
//! another layout's partition is refused or left alone.

use std::collections::HashMap;
use std::time::Duration;

use fred::prelude::*;
use rollboard::store::Store;

use crate::support::boards::{
    boards_a_b_metered, entry, ingest_settings, now_ms, roll_all, set_string, test_boards,
    total_at, Consumer,
};
use crate::support::config::config_for;
use crate::support::daemon::{partitioned_daemon, Daemon};
use crate::support::events::{stream_len, xadd_one};
use crate::support::keys::{dead_letter_stream, intake_stream, partition_stream};
use crate::support::redis::RedisServer;
use crate::support::wait::drained_streams;

/// The exact total of `member` on the unscoped board `name` (None when not ranked).
async fn total(store: &Store, name: &str, scope: Option<&str>, member: &str) -> Option<i64> {
    let boards = test_boards();
    let board = boards.iter().find(|b| b.name == name).expect("board");
    store
        .rank(&board.widest(), scope, member, now_ms())
        .await
        .expect("rank")
        .total
}

/// XADDs one entry with `fields` to each stream key of `appends`, all under the entry ID
/// `<now>-0`, in one transaction (as two producers appending in one millisecond would get:
/// each stream numbers its own entries; written out so that the test does not depend on
/// both appends falling in one millisecond), then waits until the daemon drained `streams`
/// and checks that nothing was dead-lettered.
async fn append_under_one_entry_id(
    store: &Store,
    appends: [(&str, [(&str, &str); 3]); 2],
    streams: &[&str],
) {
    let same = format!("{}-0", now_ms());
    let tx = store.client().multi();
    for (key, fields) in appends {
        let _: () = tx
            .xadd(key, false, None, same.as_str(), fields.to_vec())
            .await
            .expect("queue xadd");
    }
    let ids: Vec<String> = tx.exec(true).await.expect("exec");
    assert_eq!(ids, [same.clone(), same]);
    let streams: Vec<String> = streams.iter().map(|k| k.to_string()).collect();
    assert!(
        drained_streams(store, &streams).await,
        "{streams:?} drained"
    );
    let dead = stream_len(store, dead_letter_stream()).await;
    assert_eq!(dead, 0, "nothing dead-lettered");
}

/// A fresh redis-server, a store on it, and a daemon (with its temp dir) reading the
/// intake stream in two partitions.
async fn two_partitions() -> (RedisServer, Store, tempfile::TempDir, Daemon) {
    let (redis, store, dir) = RedisServer::start_with_store_and_dir("rb").await;
    let daemon = partitioned_daemon(dir.path(), &redis, "a", 2).await;
    (redis, store, dir, daemon)
}

/// Two different tips appended without an `id` to two partitions in one millisecond (one
/// producer, or two) get the same stream entry ID, `<ms>-0`: each
/// stream numbers its own entries. docs/operations.md allows such events ("one `XADD`ed without
/// an `id` may go to any partition") and docs/design.md (*Events and boards*) makes the entry ID the
/// idempotency key, and the key is remembered per board instance, across partitions: keyed
/// by the bare entry ID, the second tip was taken for a copy of the first and dropped.
#[tokio::test]
async fn tips_without_id_on_two_partitions_with_equal_entry_ids_both_count() {
    let (_redis, store, _dir, daemon) = two_partitions().await;

    append_under_one_entry_id(
        &store,
        [
            (
                &partition_stream(0),
                [("room", "r1"), ("user", "u1"), ("amount", "5")],
            ),
            (
                &partition_stream(1),
                [("room", "r1"), ("user", "u2"), ("amount", "7")],
            ),
        ],
        &[&partition_stream(0), &partition_stream(1)],
    )
    .await;
    // Two tips to room r1: 5 + 7.
    let r1 = total(&store, "rooms_7d", None, "r1").await;
    assert_eq!(r1, Some(12), "rooms_7d r1");
    daemon.kill().await;
}

/// The same collision during a change of `ingest.partitions` from 1 to 2, which docs/operations.md
/// calls safe "even while producers still use the old N": a producer still on the old
/// layout appends to the bare stream while one on the new layout appends to a partition, in
/// the same millisecond, neither with an `id`. The daemon drains the bare stream as a
/// retired partition; keyed by the bare entry ID, the two tips shared the key `<ms>-0` and
/// one of them was lost.
#[tokio::test]
async fn a_tip_on_the_retired_stream_and_one_on_a_partition_with_equal_entry_ids_both_count() {
    let (_redis, store, _dir, daemon) = two_partitions().await;

    append_under_one_entry_id(
        &store,
        [
            (
                intake_stream(),
                [("room", "r9"), ("user", "u1"), ("amount", "3")],
            ),
            (
                &partition_stream(0),
                [("room", "r9"), ("user", "u2"), ("amount", "4")],
            ),
        ],
        &[intake_stream(), &partition_stream(0), &partition_stream(1)],
    )
    .await;
    assert_eq!(
        total(&store, "rooms_7d", None, "r9").await,
        Some(7),
        "rooms_7d r9: 3 + 4"
    );
    daemon.kill().await;
}

/// docs/operations.md's replay of an `apply_failed` dead letter ("`XADD` each entry back ... with
/// its original fields ... and, for an entry without an `id` field, `id` set to its
/// `source_id`") restores the idempotency key of an event that had no `id`, but not its
/// time: an event without `ts` takes its time from the stream entry ID (docs/design.md, *Events and boards*),
/// and the replayed copy is a new entry. The boards that counted the event at first keep it
/// in the slice of its original time; the repaired board counts it in the slice of the
/// replay, so it stays in that board's window longer (and its tie-break time differs). After
/// a roll at which the original slice has left the window, the two boards disagree about the
/// same event.
#[tokio::test]
async fn a_replayed_apply_failed_event_without_ts_keeps_its_original_time() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    const SLICE: i64 = 1_000;
    let (a, b, boards, metrics) = boards_a_b_metered(SLICE);
    let settings = ingest_settings(intake_stream(), 1);
    let t0: i64 = 1_000_000;

    // Board b is broken (a key of the wrong type): its share is dead-lettered.
    let result_b = store.instance(&b.widest(), None).result();
    set_string(&store, &result_b, "x").await;
    Consumer::new(&store, &boards, &settings, &metrics)
        .process_one(intake_stream(), &[("user", "u1"), ("amount", "5")], t0)
        .await;
    assert_eq!(total_at(&store, &a.widest(), "u1", t0).await, Some(5));
    let letters: Vec<(String, HashMap<String, String>)> = store
        .client()
        .xrange(dead_letter_stream(), "-", "+", None)
        .await
        .expect("xrange");
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0].1;
    assert_eq!(letter["reason"], "apply_failed");

    // Fixed, then replayed as docs/operations.md says, two and a half slices later.
    let _: () = store.client().del(result_b.as_str()).await.expect("del");
    let mut fields: Vec<(&str, &str)> = letter
        .iter()
        .filter(|(k, _)| !["reason", "detail", "source_id", "source_stream"].contains(&k.as_str()))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert!(!letter.contains_key("id"));
    assert!(!letter.contains_key("ts"));
    assert_eq!(
        letter["source_stream"],
        intake_stream(),
        "ingest.stream itself"
    );
    fields.push(("id", letter["source_id"].as_str()));
    let source_ts = letter["source_id"]
        .split('-')
        .next()
        .expect("entry ID time");
    fields.push(("ts", source_ts));
    let t1 = t0 + 2 * SLICE + SLICE / 2;
    let replay = entry(&format!("{t1}-0"), &fields);
    Consumer::new(&store, &boards, &settings, &metrics)
        .process(intake_stream(), &[replay], t1)
        .await
        .expect("replay");
    super::assert_replayed_once(&store, &b, &a, t1).await;

    // The event happened at t0: once its slice has left the window, no board holds it.
    let t = t0 + 4 * SLICE;
    roll_all(&store, &boards, t, 100).await;
    assert_eq!(
        total_at(&store, &a.widest(), "u1", t).await,
        None,
        "a: the event left the window"
    );
    assert_eq!(
        total_at(&store, &b.widest(), "u1", t).await,
        None,
        "b: the same event, the same window"
    );
}

/// `ingest.dead_letter_stream` is refused when it equals the stream or one of the configured
/// partitions, but not when it is a key of another partition layout (`<stream>:{k}` for
/// `k` from `partitions` to 63), which the daemon drains as a retired partition. Here
/// (`partitions = 1`, dead letters to `rb:events:{7}`) a tip whose fans_7d instance is
/// broken is applied to rooms_7d and dead-lettered `apply_failed`; the daemon then reads
/// that dead letter back as an event (it has the tip's fields and no `id`, so its key is
/// the dead letter's own entry ID): rooms_7d counts it again, fans_7d fails again, a new
/// dead letter is written, and so on without end.
#[tokio::test]
async fn a_dead_letter_stream_named_like_another_layouts_partition_is_refused_or_left_alone() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let (_dir, port, path) = config_for(&redis, "a", "");
    let text = std::fs::read_to_string(&path)
        .expect("read config")
        .replacen(
            "[ingest]\n",
            "[ingest]\ndead_letter_stream = \"rb:events:{7}\"\n",
            1,
        );
    std::fs::write(&path, text).expect("write config");
    // If the configuration is refused, the defect is gone.
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_rollboard"))
        .arg("--config")
        .arg(&path)
        .args(["verify"])
        .env_remove("ROLLBOARD_CONFIG")
        .output()
        .expect("run rollboard verify");
    if check.status.code() == Some(64) {
        return;
    }

    // fans_7d's instance for room r1 is broken: its `meta` key (which the roll's clean-up
    // of an empty instance keeps) is a string.
    let fans = test_boards()
        .into_iter()
        .find(|b| b.name == "fans_7d")
        .expect("fans_7d");
    let meta = store.instance(&fans.widest(), Some("r1")).meta();
    set_string(&store, &meta, "x").await;
    let daemon = Daemon::start(&path, port).await;
    xadd_one(
        &store,
        intake_stream(),
        vec![("room", "r1"), ("user", "u1"), ("amount", "5")],
    )
    .await;
    assert!(
        drained_streams(&store, &[intake_stream().to_string()]).await,
        "the tip is processed"
    );
    // Wait for a second count of the tip (none should come).
    let grew = crate::support::wait::wait_for(Duration::from_secs(8), || async {
        total(&store, "rooms_7d", None, "r1").await != Some(5)
    })
    .await;
    let dead: i64 = store
        .client()
        .xlen(partition_stream(7))
        .await
        .expect("xlen");
    let total = total(&store, "rooms_7d", None, "r1").await;
    daemon.kill().await;
    assert!(
        !grew,
        "one tip: rooms_7d r1 = {total:?}, {dead} dead letters"
    );
    assert_eq!(total, Some(5));
    assert_eq!(dead, 1);
}
