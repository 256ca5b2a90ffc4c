//! Bounded streams: the consumer trims the intake stream to what every consumer group on
//! it still needs plus `ingest.retain`, never an entry pending in a group or unread by
//! another group, with several replicas at once; the dead-letter stream stays near its
//! cap; `rollboard_stream_length` reports the real lengths. Totals stay exact throughout.

use std::path::{Path, PathBuf};
use std::time::Duration;

use fred::prelude::*;
use rollboard::ingest::stream::StreamId;
use rollboard::store::Store;

use crate::support::asserts::{assert_drained_into_model, assert_metrics, assert_state};
use crate::support::boards::{now_ms, test_boards};
use crate::support::config::write_config;
use crate::support::daemon::Daemon;
use crate::support::events::{models, tip, tips_now, xadd_all, Fields};
use crate::support::keys::{dead_letter_stream, intake_stream};
use crate::support::redis::{free_port, RedisServer};
use crate::support::wait::{drained, drained_streams, wait_for};

/// Most entries one stream node holds (`stream-node-max-entries`): `~` trims whole nodes,
/// so a trimmed stream keeps up to one node more than the bound asks.
const NODE: i64 = 100;

/// A daemon config with `ingest` lines added to its `[ingest]` section.
fn config(dir: &Path, redis: &RedisServer, port: u16, consumer: &str, ingest: &str) -> PathBuf {
    let path = write_config(dir, redis, port, consumer, "");
    let text = std::fs::read_to_string(&path).expect("read config");
    // A key given here replaces the base config's line of that key.
    let given: Vec<&str> = ingest
        .lines()
        .filter_map(|l| l.split(" = ").next())
        .collect();
    let text: String = text
        .lines()
        .filter(|l| !given.iter().any(|k| l.starts_with(&format!("{k} = "))))
        .map(|l| format!("{l}\n"))
        .collect();
    let text = text.replacen("[ingest]\n", &format!("[ingest]\n{ingest}\n"), 1);
    std::fs::write(&path, text).expect("write config");
    path
}

/// `XREADGROUP` of up to `count` new entries of [`intake_stream`] for `consumer` of `group`.
fn read_group(redis: &RedisServer, group: &str, consumer: &str, count: &str) -> String {
    let args = format!(
        "XREADGROUP GROUP {group} {consumer} COUNT {count} STREAMS {} >",
        intake_stream()
    );
    redis.cli(&args.split(' ').collect::<Vec<_>>())
}

/// A daemon started on a free port with [`config`].
async fn trimming_daemon(
    dir: &tempfile::TempDir,
    redis: &RedisServer,
    consumer: &str,
    ingest: &str,
) -> Daemon {
    let port = free_port();
    Daemon::start(&config(dir.path(), redis, port, consumer, ingest), port).await
}

async fn xlen(store: &Store, key: &str) -> i64 {
    store.client().xlen(key).await.expect("xlen")
}

/// The IDs of the entries of `key` from `start` on.
async fn ids_from(store: &Store, key: &str, start: &str) -> Vec<String> {
    let entries: Vec<(String, Vec<(String, String)>)> = store
        .client()
        .xrange(key, start, "+", None)
        .await
        .expect("xrange");
    entries.into_iter().map(|(id, _)| id).collect()
}

/// Waits until `key` holds at most `most` entries.
async fn shrinks_to(store: &Store, key: &str, most: i64) -> bool {
    wait_for(Duration::from_secs(30), || async {
        xlen(store, key).await <= most
    })
    .await
}

/// Waits until every entry of the intake stream is trimmed away, which `daemon` does once
/// every group has acked them.
async fn assert_trimmed_away(store: &Store, daemon: &Daemon) {
    assert_trimmed_to(store, daemon, 0).await;
}

/// Waits until `daemon` has trimmed the intake stream to at most `most` entries.
async fn assert_trimmed_to(store: &Store, daemon: &Daemon, most: i64) {
    let trimmed = shrinks_to(store, intake_stream(), most).await;
    assert!(trimmed, "never trimmed to {most}; log:\n{}", daemon.logs());
}

/// Appends `events` one by one (in order) and returns their entry IDs.
async fn append(store: &Store, events: &[Fields]) -> Vec<String> {
    let mut ids = Vec::with_capacity(events.len());
    for chunk in events.chunks(500) {
        let chunk_ids: Vec<String> = futures_util::future::try_join_all(chunk.iter().map(|f| {
            store
                .client()
                .xadd::<String, _, _, _, _>(intake_stream(), false, None, "*", f.clone())
        }))
        .await
        .expect("xadd");
        ids.extend(chunk_ids);
    }
    // Concurrent appends land in any order: the IDs in stream order.
    ids.sort_by_key(|id| StreamId::parse(id));
    ids
}

/// Asserts that the entries of the stream from `ids[0]` on begin with every one of `ids`.
async fn assert_kept(store: &Store, ids: &[String]) {
    let kept = ids_from(store, intake_stream(), &ids[0]).await;
    assert!(
        kept.starts_with(ids),
        "{} entries expected from {}, {} there (first {:?})",
        ids.len(),
        ids[0],
        kept.len(),
        kept.first()
    );
}

#[tokio::test]
async fn with_no_retention_acked_entries_are_trimmed_away() {
    let (redis, store, dir) = RedisServer::start_with_store_and_dir("rb").await;
    let daemon = trimming_daemon(&dir, &redis, "a", "retain = \"0s\"").await;
    let events = tips_now(3000);
    xadd_all(store.client(), intake_stream(), &events).await;
    assert_drained_into_model(&store, &events, &daemon).await;
    assert!(
        shrinks_to(&store, intake_stream(), 0).await,
        "acked entries never trimmed: {} left; log:\n{}",
        xlen(&store, intake_stream()).await,
        daemon.logs()
    );
    let trimmed = daemon
        .metric_becomes(
            "rollboard_stream_trimmed_total",
            &[("stream", intake_stream())],
            3000.0,
            Duration::from_secs(10),
        )
        .await;
    assert!(trimmed, "every entry is counted as trimmed once");
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn entries_pending_in_the_group_are_kept_until_another_consumer_applies_them() {
    let (redis, store, dir) = RedisServer::start_with_store_and_dir("rb").await;
    let events = tips_now(2000);
    let ids = append(&store, &events).await;
    redis.cli(&["XGROUP", "CREATE", intake_stream(), "rollboard", "0"]);
    let read = |consumer: &str, count: &str| read_group(&redis, "rollboard", consumer, count);
    // The oldest 500 stand for history acked long ago (not applied here), then a consumer
    // reads the next 150 and dies before acking them.
    read("early", "500");
    let mut ack = vec!["XACK", intake_stream(), "rollboard"];
    ack.extend(ids[..500].iter().map(String::as_str));
    redis.cli(&ack);
    read("ghost", "150");
    // `a` never claims within the test (claim_idle 1h): the ghost's entries stay pending.
    let a = trimming_daemon(&dir, &redis, "a", "retain = \"0s\"\nclaim_idle = \"1h\"").await;
    let rest_taken = wait_for(Duration::from_secs(60), || async {
        matches!(
            rollboard::ingest::stream::group_info(store.client(), intake_stream(), "rollboard")
                .await,
            Ok(Some((150, Some(0))))
        )
    })
    .await;
    assert!(rest_taken, "a never took the rest; log:\n{}", a.logs());
    // The acked history goes; the pending 150 and everything after them stay.
    assert_trimmed_to(&store, &a, 1500 + NODE).await;
    assert_kept(&store, &ids[500..]).await;
    assert!(a.terminate().await.success());

    // Another replica takes the ghost's entries over and applies them: nothing lost,
    // nothing counted twice, and then the stream is trimmed empty.
    let b = trimming_daemon(&dir, &redis, "b", "retain = \"0s\"").await;
    assert_drained_into_model(&store, &events[500..], &b).await;
    assert_trimmed_away(&store, &b).await;
    assert!(b.terminate().await.success());
}

#[tokio::test]
async fn a_killed_consumers_pending_entries_survive_and_are_applied_by_another() {
    let (redis, store, dir) = RedisServer::start_with_store_and_dir("rb").await;
    let events = tips_now(40_000);
    let a = trimming_daemon(&dir, &redis, "a", "retain = \"0s\"\nclaim_idle = \"2s\"").await;
    // Traffic until `a` has trimmed and holds a batch: then it is killed mid-batch. It is
    // frozen before its pending count is read, so it cannot ack between the read and
    // the kill; while it holds nothing, it is thawed and the traffic goes on.
    let mut sent = 0;
    for chunk in events.chunks(500) {
        xadd_all(store.client(), intake_stream(), chunk).await;
        sent += chunk.len();
        if a.metric(
            "rollboard_stream_trimmed_total",
            &[("stream", intake_stream())],
        )
        .await
            == 0.0
        {
            continue;
        }
        a.freeze(true);
        let busy = matches!(
            rollboard::ingest::stream::group_info(store.client(), intake_stream(), "rollboard").await,
            Ok(Some((p, _))) if p > 0
        );
        if busy {
            break;
        }
        a.freeze(false);
    }
    a.kill().await;
    let events = &events[..sent];
    // Every entry still pending for the dead consumer is in the stream.
    let pending: Vec<(String, String, u64, u64)> = store
        .client()
        .xpending(intake_stream(), "rollboard", ("-", "+", 100_000))
        .await
        .expect("xpending");
    assert!(!pending.is_empty(), "killed with nothing pending");
    assert!(
        xlen(&store, intake_stream()).await < sent as i64,
        "nothing trimmed before the kill"
    );
    for (id, _, _, _) in &pending {
        assert_eq!(
            ids_from(&store, intake_stream(), id).await.first(),
            Some(id),
            "pending {id} trimmed"
        );
    }
    let b = trimming_daemon(&dir, &redis, "b", "retain = \"0s\"\nclaim_idle = \"2s\"").await;
    assert_drained_into_model(&store, events, &b).await;
    assert_trimmed_away(&store, &b).await;
    assert!(b.terminate().await.success());
}

#[tokio::test]
async fn entries_another_group_has_not_read_or_acked_are_kept() {
    let (redis, store, dir) = RedisServer::start_with_store_and_dir("rb").await;
    redis.cli(&[
        "XGROUP",
        "CREATE",
        intake_stream(),
        "other",
        "0",
        "MKSTREAM",
    ]);
    let daemon = trimming_daemon(&dir, &redis, "a", "retain = \"0s\"").await;
    let events = tips_now(2000);
    let ids = append(&store, &events).await;
    assert_drained_into_model(&store, &events, &daemon).await;
    // `other` has read nothing: rollboard has acked all, yet every entry stays.
    let other = |count: &str| read_group(&redis, "other", "o1", count);
    // It reads 1000 and acks the first 500; the trim follows its first pending entry.
    other("1000");
    let mut ack = vec!["XACK", intake_stream(), "other"];
    ack.extend(ids[..500].iter().map(String::as_str));
    redis.cli(&ack);
    assert_trimmed_to(&store, &daemon, 1500 + NODE).await;
    assert_kept(&store, &ids[500..]).await;
    // It acks everything it read: its 1000 unread entries are still kept.
    let mut ack = vec!["XACK", intake_stream(), "other"];
    ack.extend(ids[500..1000].iter().map(String::as_str));
    redis.cli(&ack);
    assert_trimmed_to(&store, &daemon, 1000 + NODE).await;
    assert_kept(&store, &ids[1000..]).await;
    // Once it has read and acked the rest, nothing is left.
    other("1000");
    let mut ack = vec!["XACK", intake_stream(), "other"];
    ack.extend(ids[1000..].iter().map(String::as_str));
    redis.cli(&ack);
    assert_trimmed_away(&store, &daemon).await;
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn two_replicas_trimming_at_once_lose_and_double_nothing() {
    let (redis, store, dir) = RedisServer::start_with_store_and_dir("rb").await;
    let (port_a, port_b) = (free_port(), free_port());
    let a = Daemon::start(
        &config(dir.path(), &redis, port_a, "a", "retain = \"0s\""),
        port_a,
    )
    .await;
    let b = Daemon::start(
        &config(dir.path(), &redis, port_b, "b", "retain = \"0s\""),
        port_b,
    )
    .await;
    let events = tips_now(6000);
    for chunk in events.chunks(1000) {
        xadd_all(store.client(), intake_stream(), chunk).await;
    }
    assert_drained_into_model(&store, &events, &a).await;
    assert_trimmed_away(&store, &a).await;
    let trimmed = a
        .metric(
            "rollboard_stream_trimmed_total",
            &[("stream", intake_stream())],
        )
        .await
        + b.metric(
            "rollboard_stream_trimmed_total",
            &[("stream", intake_stream())],
        )
        .await;
    assert!(trimmed >= 6000.0, "trimmed {trimmed}");
    assert!(a.terminate().await.success());
    assert!(b.terminate().await.success());
}

#[tokio::test]
async fn retain_keeps_that_much_acked_history() {
    let (redis, store, dir) = RedisServer::start_with_store_and_dir("rb").await;
    let now = now_ms();
    // 1000 entries stamped two hours ago (explicit IDs), then 1000 stamped now.
    let old_ms = now - 2 * 3_600_000;
    let events: Vec<Fields> = (0..2000).map(|i| tip(i, now)).collect();
    for (i, f) in events[..1000].iter().enumerate() {
        let _: String = store
            .client()
            .xadd(
                intake_stream(),
                false,
                None::<()>,
                format!("{old_ms}-{}", i + 1),
                f.clone(),
            )
            .await
            .expect("xadd");
    }
    let recent = append(&store, &events[1000..]).await;
    let daemon = trimming_daemon(&dir, &redis, "a", "retain = \"1h\"").await;
    assert_drained_into_model(&store, &events, &daemon).await;
    assert!(
        shrinks_to(&store, intake_stream(), 1000 + NODE).await,
        "history older than retain never trimmed; log:\n{}",
        daemon.logs()
    );
    // Acked, but younger than an hour: kept, through several more trims.
    let trims = daemon
        .metric(
            "rollboard_stream_trimmed_total",
            &[("stream", intake_stream())],
        )
        .await;
    assert!(trims >= 1000.0 - NODE as f64, "trimmed {trims}");
    assert_kept(&store, &recent).await;
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn the_dead_letter_stream_stays_near_its_cap_and_lengths_are_reported() {
    let (redis, store, dir) = RedisServer::start_with_store_and_dir("rb").await;
    let daemon = trimming_daemon(
        &dir,
        &redis,
        "a",
        "retain = \"0s\"\ndead_letter_max_len = 300",
    )
    .await;
    let mut events = tips_now(1000);
    for e in events.iter_mut().step_by(2) {
        e[2].1 = "lots".into();
    }
    xadd_all(store.client(), intake_stream(), &events).await;
    assert!(drained(&store).await, "log:\n{}", daemon.logs());
    assert_metrics(
        &daemon,
        &["rollboard_events_dead_lettered_total{reason=amount} 500"],
    )
    .await;
    let letters = xlen(&store, dead_letter_stream()).await;
    assert!((300..300 + NODE).contains(&letters), "{letters} letters");
    // The newest letters are the ones kept.
    let last: Vec<(String, std::collections::HashMap<String, String>)> = store
        .client()
        .xrevrange(dead_letter_stream(), "+", "-", Some(1))
        .await
        .expect("xrevrange");
    assert_eq!(last[0].1.get("id").map(String::as_str), Some("t998"));
    assert_metrics(&daemon, &["rollboard_stream_max_length 300"]).await;
    // The poller (every 5 s) reports what XLEN says, for the intake and the letters.
    let reported = wait_for(Duration::from_secs(20), || async {
        daemon
            .metric(
                "rollboard_stream_length",
                &[("stream", dead_letter_stream())],
            )
            .await
            == letters as f64
            && daemon
                .metric("rollboard_stream_length", &[("stream", intake_stream())])
                .await
                == xlen(&store, intake_stream()).await as f64
            && xlen(&store, intake_stream()).await == 0
    })
    .await;
    assert!(reported, "lengths not reported; log:\n{}", daemon.logs());
    assert!(daemon.terminate().await.success());
}

/// Events on the partitions of a 3-partition layout, each by the partition rule.
async fn append_partitioned(store: &Store, events: &[Fields]) -> Vec<String> {
    let keys = rollboard::domain::partition::partition_keys(intake_stream(), 3);
    for f in events {
        let id = &f.iter().find(|(k, _)| k == "id").expect("an id").1;
        let key = &keys[rollboard::domain::partition::partition_of(id.as_bytes(), 3)];
        let _: String = store
            .client()
            .xadd(key.as_str(), false, None::<()>, "*", f.clone())
            .await
            .expect("xadd");
    }
    keys
}

#[tokio::test]
async fn every_partition_is_trimmed_and_so_is_a_retired_layout_while_it_drains() {
    let (redis, store, dir) = RedisServer::start_with_store_and_dir("rb").await;
    let events = tips_now(3000);
    let keys = append_partitioned(&store, &events[..1500]).await;
    // Three partitions: each is read and trimmed.
    let three = trimming_daemon(&dir, &redis, "a", "retain = \"0s\"\npartitions = 3").await;
    assert!(
        drained_streams(&store, &keys).await,
        "log:\n{}",
        three.logs()
    );
    for key in &keys {
        let empty = wait_for(Duration::from_secs(30), || async {
            xlen(&store, key).await == 0
        })
        .await;
        assert!(empty, "{key} not trimmed; log:\n{}", three.logs());
    }
    assert!(three.terminate().await.success());
    // Back to one stream: the old partitions are retired, drained and trimmed empty.
    append_partitioned(&store, &events[1500..]).await;
    let one = trimming_daemon(&dir, &redis, "b", "retain = \"0s\"").await;
    assert!(drained_streams(&store, &keys).await, "log:\n{}", one.logs());
    for key in &keys {
        let empty = wait_for(Duration::from_secs(30), || async {
            xlen(&store, key).await == 0
        })
        .await;
        assert!(empty, "retired {key} not trimmed; log:\n{}", one.logs());
    }
    let boards = test_boards();
    let now = now_ms();
    assert_state(&store, &boards, &models(&events, &boards, now), now).await;
    assert!(one.terminate().await.success());
}
