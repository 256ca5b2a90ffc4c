//! The idempotency key of an event without an `id` (`<stream>/<entry ID>` on
//! any stream but `ingest.stream`), docs/operations.md's replay of dead letters with it, and the
//! bound on the slices a window and `ingest.max_future` may span.

use std::collections::HashMap;
use std::time::Duration;

use fred::prelude::*;
use rollboard::domain::board::Board;
use rollboard::ingest::stream::Entry;
use rollboard::metrics::Metrics;
use rollboard::store::{Outcome, Store};

use crate::support::boards::{
    apply_events, board, boards_a_b, boards_a_b_metered, entry, ingest_settings, now_ms, roll_all,
    set_string, test_boards, total_at, Consumer,
};
use crate::support::daemon::partitioned_daemon;
use crate::support::events::{letters, stream_len, xadd_one};
use crate::support::keys::{dead_letter_stream, intake_stream, partition_stream};
use crate::support::redis::RedisServer;
use crate::support::wait::drained_streams;

/// docs/operations.md's replay ("A board that keeps failing") of one `apply_failed` dead letter:
/// the original fields (reserved names dropped, `orig.*` renamed back), `id` set to
/// `source_id` on `ingest.stream` or `<source_stream>/<source_id>` elsewhere when it had
/// none, `ts` set to the source_id's time when it had none.
fn replayed(letter: &HashMap<String, String>, primary: &str) -> Vec<(String, String)> {
    const RESERVED: [&str; 4] = ["reason", "detail", "source_id", "source_stream"];
    let mut fields: Vec<(String, String)> = letter
        .iter()
        .filter(|(k, _)| !RESERVED.contains(&k.as_str()))
        .map(|(k, v)| (k.strip_prefix("orig.").unwrap_or(k).to_string(), v.clone()))
        .collect();
    let source_id = &letter["source_id"];
    let source_stream = &letter["source_stream"];
    if !letter.contains_key("id") {
        let id = if source_stream == primary {
            source_id.clone()
        } else {
            format!("{source_stream}/{source_id}")
        };
        fields.push(("id".into(), id));
    }
    if !letter.contains_key("ts") {
        let ms = source_id.split('-').next().expect("entry ID time");
        fields.push(("ts".into(), ms.to_string()));
    }
    fields
}

/// [`replayed`] as the stream entry `id` its `XADD` makes.
fn replay_entry(letter: &HashMap<String, String>, primary: &str, id: &str) -> Entry {
    Entry {
        id: id.into(),
        fields: Some(
            replayed(letter, primary)
                .into_iter()
                .map(|(k, v)| (k.into_bytes(), v.into_bytes()))
                .collect(),
        ),
    }
}

/// Board `b` of `boards` made unusable (its result key of the wrong type), so every event
/// it gets is dead-lettered `apply_failed`; returns the key, to delete for the repair.
async fn break_board(store: &Store, b: &Board) -> String {
    let key = store.instance(&b.widest(), None).result();
    set_string(store, &key, "x").await;
    key
}

/// docs/operations.md replay on the bare `ingest.stream` (one partition) and on a partition (two),
/// for each of: no `id` and no `ts`, an `id` and no `ts`, no `id` and a `ts` (an earlier
/// live slice). Replayed one and a half slices later, each event is a duplicate on the
/// board that counted it and counted once on the repaired one (a second delivery of the
/// replay changes nothing), both boards hold the same tie-break time, and each event leaves
/// both windows at the roll that ends its original slice.
#[tokio::test]
async fn the_readme_replay_keeps_key_and_time_on_the_bare_stream_and_a_partition() {
    const SLICE: i64 = 1_000;
    for (partitions, stream) in [(1usize, intake_stream()), (2, &partition_stream(1))] {
        let (_redis, store) = RedisServer::start_with_store("rb").await;
        let (a, b, boards, metrics) = boards_a_b_metered(SLICE);
        let settings = ingest_settings(intake_stream(), partitions);
        let t0: i64 = 1_000_500;
        let early = t0 - 1_500; // slice 999, live at t0 (slices 997..=1000)
        let broken = break_board(&store, &b).await;
        let originals = [
            entry(&format!("{t0}-0"), &[("user", "u1"), ("amount", "5")]),
            entry(
                &format!("{t0}-1"),
                &[("user", "u2"), ("amount", "6"), ("id", "tip-2")],
            ),
            entry(
                &format!("{t0}-2"),
                &[("user", "u3"), ("amount", "7"), ("ts", &early.to_string())],
            ),
        ];
        Consumer::new(&store, &boards, &settings, &metrics)
            .process(stream, &originals, t0)
            .await
            .expect("first batch");
        let dead = letters(&store).await;
        assert_eq!(dead.len(), 3, "{stream}: {dead:?}");
        for (_, l) in &dead {
            assert_eq!(l["reason"], "apply_failed", "{stream}");
            assert_eq!(l["source_stream"], stream);
        }
        let _: () = store.client().del(broken.as_str()).await.expect("repair");

        let t1 = t0 + SLICE + SLICE / 2; // slice 1002: 999 is still live
        let replays: Vec<Entry> = dead
            .iter()
            .enumerate()
            .map(|(i, (_, l))| replay_entry(l, intake_stream(), &format!("{t1}-{i}")))
            .collect();
        for delivery in 0..2 {
            Consumer::new(&store, &boards, &settings, &metrics)
                .process(stream, &replays, t1)
                .await
                .expect("replay");
            let now_dead = letters(&store).await;
            assert_eq!(
                now_dead.len(),
                3,
                "{stream}: no new dead letter: {:?}",
                now_dead.iter().skip(3).map(|(_, l)| l).collect::<Vec<_>>()
            );
            for (member, amount) in [("u1", 5), ("u2", 6), ("u3", 7)] {
                assert_eq!(
                    total_at(&store, &a.widest(), member, t1).await,
                    Some(amount),
                    "{stream} delivery {delivery}: a {member} counted once"
                );
                assert_eq!(
                    total_at(&store, &b.widest(), member, t1).await,
                    Some(amount),
                    "{stream} delivery {delivery}: b {member} counted once"
                );
            }
        }
        let times = |bd: Board| {
            let store = &store;
            async move {
                let t: HashMap<String, String> = store
                    .client()
                    .hgetall(store.instance(&bd.widest(), None).members())
                    .await
                    .expect("hgetall");
                t
            }
        };
        assert_eq!(
            times(a.clone()).await,
            times(b.clone()).await,
            "{stream}: tie-break times"
        );

        // Slice 999 leaves the window at the roll of slice 1003: u3 goes from both.
        let t = (999 + 4) * SLICE;
        roll_all(&store, &boards, t, 100).await;
        for bd in [&a, &b] {
            assert_eq!(
                total_at(&store, &bd.widest(), "u3", t).await,
                None,
                "{stream} {}",
                bd.name
            );
            assert_eq!(
                total_at(&store, &bd.widest(), "u1", t).await,
                Some(5),
                "{stream} {}",
                bd.name
            );
        }
        // Slice 1000 leaves at 1004: u1 and u2 go from both.
        let t = (1_000 + 4) * SLICE;
        roll_all(&store, &boards, t, 100).await;
        for bd in [&a, &b] {
            for member in ["u1", "u2"] {
                assert_eq!(
                    total_at(&store, &bd.widest(), member, t).await,
                    None,
                    "{stream} {} {member}",
                    bd.name
                );
            }
        }
    }
}

/// The key of an event without `id` on a partition is `<partition's key>/<entry ID>`, and
/// docs/operations.md's replay of an `apply_failed` dead letter sets `id` to exactly that string,
/// which may be at most 128 bytes. The configuration bounds `ingest.stream` so that it
/// fits: the longest name allowed replays (the key of a 41-byte entry ID on partition 63
/// would be 128 bytes), one byte more is refused.
#[tokio::test]
async fn the_readme_replay_of_a_tip_from_a_long_named_partition_is_counted() {
    const SLICE: i64 = 1_000;
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let (a, b, boards, metrics) = boards_a_b_metered(SLICE);
    let config = |stream: &str| {
        rollboard::config::Settings::from_toml(&format!(
            "[ingest]\npartitions = 2\nstream = \"{stream}\"\n[[boards]]\nname = \"a\"\nmember = \"user\"\nwindow = \"4s\"\nslice = \"1s\"\n"
        ))
    };
    let longest = rollboard::config::MAX_STREAM_BYTES;
    let primary = format!("tenants-{}", "0123456789".repeat(8))[..longest].to_string();
    config(&primary).expect("the longest ingest.stream is accepted");
    let error = config(&format!("{primary}x"))
        .map(|_| ())
        .expect_err("one byte more")
        .to_string();
    assert!(error.contains("ingest.stream"), "{error}");
    let settings = ingest_settings(&primary, 2);
    let stream = format!("{primary}:{{1}}");
    let t0: i64 = 1_764_000_000_500;
    let broken = break_board(&store, &b).await;
    Consumer::new(&store, &boards, &settings, &metrics)
        .process_one(&stream, &[("user", "u1"), ("amount", "5")], t0)
        .await;
    assert_eq!(total_at(&store, &a.widest(), "u1", t0).await, Some(5));
    let dead = letters(&store).await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    let _: () = store.client().del(broken.as_str()).await.expect("repair");

    let t1 = t0 + SLICE;
    let replay = replay_entry(&dead[0].1, &primary, &format!("{t1}-0"));
    let fields = replay.fields.as_deref().expect("fields");
    let id = &fields.iter().find(|(k, _)| k == b"id").expect("id").1;
    assert_eq!(
        id.len(),
        longest + ":{1}/".len() + "1764000000500-0".len(),
        "{id:?}"
    );
    Consumer::new(&store, &boards, &settings, &metrics)
        .process(&stream, &[replay], t1)
        .await
        .expect("replay");
    let after = letters(&store).await;
    assert_eq!(
        after.len(),
        1,
        "the replay was dead-lettered: {:?}",
        after.last().map(|(_, l)| (&l["reason"], &l["detail"]))
    );
    super::assert_replayed_once(&store, &b, &a, t1).await;
}

/// An event without `id` appended to `stream`, delivered to a consumer `dead` that applied
/// it (as a daemon configured with `partitions`) and crashed before the ack: the entry is
/// left pending in the group. The tip is `amount` to room `room`.
async fn applied_then_crashed(
    store: &Store,
    stream: &str,
    partitions: usize,
    room: &str,
    amount: i64,
) {
    let _: Value = store
        .client()
        .xgroup_create(stream, "rollboard", "0", true)
        .await
        .expect("xgroup create");
    let amount = amount.to_string();
    xadd_one(
        store,
        stream,
        vec![("room", room), ("user", "u1"), ("amount", amount.as_str())],
    )
    .await;
    let read: Value = store
        .client()
        .xreadgroup("rollboard", "dead", Some(10), None, false, stream, ">")
        .await
        .expect("xreadgroup");
    let entries: Vec<Entry> = match read {
        Value::Array(streams) => streams
            .into_iter()
            .flat_map(|s| match s {
                Value::Array(mut parts) if parts.len() == 2 => {
                    rollboard::ingest::stream::parse_entries(parts.remove(1))
                }
                _ => Vec::new(),
            })
            .collect(),
        other => panic!("xreadgroup: {other:?}"),
    };
    assert_eq!(entries.len(), 1, "{stream}: {entries:?}");
    let boards = test_boards();
    let metrics = Metrics::new(&boards);
    // Applied as a daemon with `partitions` would, not acked: what a crash between apply
    // and XACK leaves. process_batch acks in its group, so it is given a throwaway one and
    // the entry stays pending in the real group.
    let mut shadow = ingest_settings(intake_stream(), partitions);
    shadow.group = "shadow".into();
    let _: Value = store
        .client()
        .xgroup_create(stream, "shadow", "0", false)
        .await
        .expect("shadow group");
    Consumer::new(store, &boards, &shadow, &metrics)
        .process(stream, &entries, now_ms())
        .await
        .expect("applied before the crash");
    let rooms = boards
        .iter()
        .find(|b| b.name == "rooms_7d")
        .expect("rooms_7d");
    assert_eq!(
        store
            .rank(&rooms.widest(), None, room, now_ms())
            .await
            .expect("rank")
            .total,
        Some(amount.parse().unwrap()),
        "{stream}: applied once"
    );
    let info = rollboard::ingest::stream::group_info(store.client(), stream, "rollboard")
        .await
        .expect("group info");
    assert_eq!(
        info.map(|(p, _)| p),
        Some(1),
        "{stream}: pending in the real group"
    );
}

async fn room_total(store: &Store, room: &str) -> Option<i64> {
    let boards = test_boards();
    let rooms = boards
        .iter()
        .find(|b| b.name == "rooms_7d")
        .expect("rooms_7d");
    store
        .rank(&rooms.widest(), None, room, now_ms())
        .await
        .expect("rank")
        .total
}

/// A tip without `id` that a crashed consumer applied but did not ack is claimed by a
/// daemon with another `ingest.partitions` (its stream now retired, in either direction)
/// or the same one, and re-applied: it must get the same key as the first time and be a
/// duplicate. Bare stream applied with 1 partition, re-read by a 2-partition daemon as
/// retired; partition `{1}` applied with 2, re-read by the 2-partition daemon as its own;
/// partition `{5}` applied with 8, re-read by the 2-partition daemon as retired. Then a
/// 1-partition daemon: `{1}` applied with 2 (retired now) and the bare stream applied with
/// 1 (its own).
#[tokio::test]
async fn a_pending_tip_without_id_claimed_after_a_change_of_partitions_counts_once() {
    let (redis, store, dir) = RedisServer::start_with_store_and_dir("rb").await;

    applied_then_crashed(&store, intake_stream(), 1, "bare-1to2", 3).await;
    applied_then_crashed(&store, &partition_stream(1), 2, "p1-2to2", 4).await;
    applied_then_crashed(&store, &partition_stream(5), 8, "p5-8to2", 5).await;
    let daemon = partitioned_daemon(dir.path(), &redis, "a", 2).await;
    let streams = [intake_stream(), &partition_stream(1), &partition_stream(5)].map(String::from);
    assert!(
        drained_streams(&store, &streams).await,
        "claimed and acked; log:\n{}",
        daemon.logs()
    );
    daemon.terminate().await;
    for (room, amount) in [("bare-1to2", 3), ("p1-2to2", 4), ("p5-8to2", 5)] {
        assert_eq!(room_total(&store, room).await, Some(amount), "{room}");
    }

    // The same, towards one partition.
    let (redis, store) = RedisServer::start_with_store("rb").await;
    applied_then_crashed(&store, &partition_stream(1), 2, "p1-2to1", 6).await;
    applied_then_crashed(&store, intake_stream(), 1, "bare-1to1", 7).await;
    let daemon = partitioned_daemon(dir.path(), &redis, "b", 1).await;
    let streams = [intake_stream(), &partition_stream(1)].map(String::from);
    assert!(
        drained_streams(&store, &streams).await,
        "claimed and acked; log:\n{}",
        daemon.logs()
    );
    daemon.terminate().await;
    for (room, amount) in [("p1-2to1", 6), ("bare-1to1", 7)] {
        assert_eq!(room_total(&store, room).await, Some(amount), "{room}");
    }
    let dead = stream_len(&store, dead_letter_stream()).await;
    assert_eq!(dead, 0);
}

/// Towards one partition, with a stream name holding `/` and braces (allowed with one
/// partition): tips without `id` sharing one entry ID on the configured stream and on two
/// partitions of another layout (drained as retired) are three events, and a redelivery of
/// each, in any order, is a duplicate.
#[tokio::test]
async fn tips_without_id_sharing_an_entry_id_on_a_slashed_stream_and_its_retired_partitions() {
    const SLICE: i64 = 1_000;
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let a = board("a", SLICE, 4);
    let boards = vec![a.clone()];
    let metrics = Metrics::new(&boards);
    let primary = "t/1{x}/events";
    rollboard::config::Settings::from_toml(&format!(
        "[ingest]\nstream = \"{primary}\"\n[[boards]]\nname = \"a\"\nmember = \"user\"\nwindow = \"4s\"\nslice = \"1s\"\n"
    ))
    .expect("a stream name with / and braces, one partition");
    let settings = ingest_settings(primary, 1);
    let t0: i64 = 1_764_000_000_500;
    let same = format!("{t0}-0");
    let streams = [
        (primary.to_string(), "u1", "2"),
        (format!("{primary}:{{0}}"), "u2", "3"),
        (format!("{primary}:{{1}}"), "u3", "4"),
    ];
    for round in 0..2 {
        let order: Vec<&(String, &str, &str)> = if round == 0 {
            streams.iter().collect()
        } else {
            streams.iter().rev().collect()
        };
        for (stream, user, amount) in order {
            let e = entry(&same, &[("user", user), ("amount", amount)]);
            Consumer::new(&store, &boards, &settings, &metrics)
                .process(stream, &[e], t0)
                .await
                .expect("batch");
        }
        for (_, user, amount) in &streams {
            assert_eq!(
                total_at(&store, &a.widest(), user, t0).await,
                Some(amount.parse().unwrap()),
                "round {round}: {user}"
            );
        }
    }
    assert!(letters(&store).await.is_empty());
}

/// An `apply_failed` dead letter from a partition written before the upgrade: the old
/// version keyed an event without `id` there by its bare entry ID (the boards that counted
/// it remember that key), so docs/operations.md's replay gives such a letter `id` = `source_id`,
/// not `<source_stream>/<source_id>`. Replayed so, it is counted once on the board that
/// failed and is a duplicate on the others. (The old version's effect is written out: its
/// apply with the bare entry ID as the key, and its dead letter.)
#[tokio::test]
async fn a_dead_letter_from_a_partition_written_before_the_upgrade_replays_once() {
    const SLICE: i64 = 1_000;
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let (a, b, boards, metrics) = boards_a_b_metered(SLICE);
    let settings = ingest_settings(intake_stream(), 2);
    let t0: i64 = 1_764_000_000_500;
    let source_id = format!("{t0}-0");
    // The old version: board a counted the tip under the bare entry ID, board b failed.
    let first = apply_events(
        &store,
        &a,
        &[crate::support::boards::ev(&source_id, t0, "u1", 5)],
        t0,
    )
    .await;
    assert_eq!(first, [Outcome::Applied]);
    xadd_one(
        &store,
        dead_letter_stream(),
        vec![
            ("user", "u1"),
            ("amount", "5"),
            ("reason", "apply_failed"),
            ("detail", "b: WRONGTYPE"),
            ("source_id", source_id.as_str()),
            ("source_stream", &partition_stream(1)),
        ],
    )
    .await;
    // After the upgrade, replayed as docs/operations.md says for a letter written before it: the
    // bare `source_id` as its `id`.
    let dead = letters(&store).await;
    let t1 = t0 + SLICE;
    let replay = replay_entry(&dead[0].1, &partition_stream(1), &format!("{t1}-0"));
    Consumer::new(&store, &boards, &settings, &metrics)
        .process(&partition_stream(1), &[replay], t1)
        .await
        .expect("replay");
    super::assert_replayed_once(&store, &b, &a, t1).await;
}

/// With `ingest.dedup_window` a duration, a board forgets an event's key that long after the
/// event's slice ends, while the slice may still be in the window. docs/operations.md's replay
/// says so: replayed within that time, the event is a duplicate on the boards that had
/// counted it and counted once on the board that failed (later it would count again on
/// the others).
#[tokio::test]
async fn the_readme_replay_within_a_dedup_window_duration_counts_once() {
    use rollboard::domain::board::Dedup;
    const SLICE: i64 = 1_000;
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let (mut a, mut b) = boards_a_b(SLICE);
    a.dedup = Dedup::AfterSlice(1_000);
    b.dedup = Dedup::AfterSlice(1_000);
    let boards = vec![a.clone(), b.clone()];
    let metrics = Metrics::new(&boards);
    let settings = ingest_settings(intake_stream(), 2);
    let t0: i64 = 1_764_000_000_500;
    let broken = break_board(&store, &b).await;
    Consumer::new(&store, &boards, &settings, &metrics)
        .process_one(&partition_stream(0), &[("user", "u1"), ("amount", "5")], t0)
        .await;
    let dead = letters(&store).await;
    assert_eq!(dead.len(), 1);
    let _: () = store.client().del(broken.as_str()).await.expect("repair");
    // One slice later: the slice ended 500 ms ago, its keys are kept for 1 s after that.
    let t1 = t0 + SLICE;
    roll_all(&store, &boards, t1, 100).await;
    let replay = replay_entry(&dead[0].1, intake_stream(), &format!("{t1}-0"));
    Consumer::new(&store, &boards, &settings, &metrics)
        .process(&partition_stream(0), &[replay], t1)
        .await
        .expect("replay");
    assert_eq!(letters(&store).await.len(), 1, "not late");
    super::assert_replayed_once(&store, &b, &a, t1).await;
}

/// docs/operations.md's replay end to end with a partitioned daemon: two tips without `id` on two
/// partitions under one entry ID, dead-lettered `apply_failed` by a broken `rooms_7d` (and
/// counted on `fans_7d`), are replayed as docs/operations.md says to their `source_stream`: each
/// is counted once on the repaired board, stays a duplicate on the other, and nothing is
/// dead-lettered again.
#[tokio::test]
async fn a_partitioned_daemon_replays_dead_letters_of_tips_without_id_once() {
    let (redis, store, dir) = RedisServer::start_with_store_and_dir("rb").await;
    let daemon = partitioned_daemon(dir.path(), &redis, "a", 2).await;
    let boards = test_boards();
    let rooms = boards
        .iter()
        .find(|b| b.name == "rooms_7d")
        .expect("rooms")
        .clone();
    let fans = boards
        .iter()
        .find(|b| b.name == "fans_7d")
        .expect("fans")
        .clone();
    let broken = break_board(&store, &rooms).await;

    let same = format!("{}-0", now_ms());
    for (stream, user, amount) in [
        (partition_stream(0), "u1", "5"),
        (partition_stream(1), "u2", "7"),
    ] {
        let _: String = store
            .client()
            .xadd(
                stream,
                false,
                None,
                same.as_str(),
                vec![("room", "r1"), ("user", user), ("amount", amount)],
            )
            .await
            .expect("xadd");
    }
    let fans_total = |member: &'static str| {
        let store = &store;
        let fans = &fans;
        async move {
            store
                .rank(&fans.widest(), Some("r1"), member, now_ms())
                .await
                .ok()
                .and_then(|r| r.total)
        }
    };
    let dead_two = crate::support::wait::wait_for(Duration::from_secs(60), || async {
        letters(&store).await.len() == 2
    })
    .await;
    assert!(dead_two, "two dead letters; log:\n{}", daemon.logs());
    let dead = letters(&store).await;
    for (_, l) in &dead {
        assert_eq!(l["reason"], "apply_failed", "{l:?}");
    }
    let counted = crate::support::wait::wait_for(Duration::from_secs(30), || async {
        fans_total("u1").await == Some(5) && fans_total("u2").await == Some(7)
    })
    .await;
    assert!(counted, "fans_7d counted both before the replay");

    let _: () = store.client().del(broken.as_str()).await.expect("repair");
    for (_, l) in &dead {
        let fields = replayed(l, intake_stream());
        let _: String = store
            .client()
            .xadd(l["source_stream"].as_str(), false, None, "*", fields)
            .await
            .expect("replay");
    }
    let streams = vec![
        partition_stream(0).to_string(),
        partition_stream(1).to_string(),
    ];
    assert!(drained_streams(&store, &streams).await, "replays read");
    let replayed_once = crate::support::wait::wait_for(Duration::from_secs(30), || async {
        store
            .rank(&rooms.widest(), None, "r1", now_ms())
            .await
            .ok()
            .and_then(|r| r.total)
            == Some(12)
    })
    .await;
    assert!(replayed_once, "rooms_7d r1: 5 + 7; log:\n{}", daemon.logs());
    // Once the ranking is current (`summed_gen` equal to `gen`, which every apply that
    // writes bumps): still one of each on fans_7d, in its live totals too.
    let keys = store.instance(&fans.widest(), Some("r1"));
    let meta = keys.meta();
    let resummed = crate::support::wait::wait_for(Duration::from_secs(30), || async {
        let state: Vec<Option<String>> = store
            .client()
            .hmget(meta.as_str(), vec!["gen", "summed_gen"])
            .await
            .expect("hmget");
        state[0].is_some() && state[0] == state[1]
    })
    .await;
    let live: HashMap<String, String> = store
        .client()
        .hgetall(keys.totals())
        .await
        .expect("hgetall");
    assert_eq!(
        (
            live.get("u1").map(String::as_str),
            live.get("u2").map(String::as_str)
        ),
        (Some("5"), Some("7")),
        "fans_7d live totals"
    );
    assert!(resummed, "fans_7d ranking current");
    assert_eq!(fans_total("u1").await, Some(5), "fans_7d u1: a duplicate");
    assert_eq!(fans_total("u2").await, Some(7), "fans_7d u2: a duplicate");
    assert_eq!(
        letters(&store).await.len(),
        2,
        "nothing dead-lettered again"
    );
    daemon.kill().await;
}

/// Every key a daemon reads as events, for every `ingest.partitions` (its own partitions and
/// the other layouts' keys it drains, `stream::keys` and `rollboard::domain::partition::retired_keys`), is
/// refused as `ingest.dead_letter_stream`, also for a stream name with braces (one
/// partition); keys it never reads are accepted.
#[test]
fn every_key_the_daemon_reads_is_refused_as_the_dead_letter_stream() {
    use rollboard::config::Settings;
    use rollboard::domain::partition::{partition_keys, retired_keys, MAX_PARTITIONS};
    let config = |stream: &str, partitions: usize, dead: &str| {
        Settings::from_toml(&format!(
            "[ingest]\nstream = \"{stream}\"\npartitions = {partitions}\ndead_letter_stream = \"{dead}\"\n[[boards]]\nname = \"a\"\nmember = \"user\"\nwindow = \"4s\"\nslice = \"1s\"\n"
        ))
    };
    for (stream, layouts) in [(intake_stream(), 1..=MAX_PARTITIONS), ("{rb}/ev", 1..=1)] {
        for partitions in layouts {
            let mut read = partition_keys(stream, partitions);
            read.extend(retired_keys(stream, partitions));
            assert_eq!(read.len(), 1 + MAX_PARTITIONS, "{partitions}");
            for key in &read {
                let error = config(stream, partitions, key)
                    .map(|_| ())
                    .expect_err(key)
                    .to_string();
                assert!(
                    error.contains("ingest.dead_letter_stream"),
                    "{key}: {error}"
                );
            }
            for other in [
                format!("{stream}:{{{MAX_PARTITIONS}}}"),
                format!("{stream}:{{01}}"),
                format!("{stream}:dead"),
            ] {
                assert!(!read.contains(&other));
                config(stream, partitions, &other).expect(&other);
            }
        }
    }
}
