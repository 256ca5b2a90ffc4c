//! Partitioned ingest (`ingest.partitions`): events spread over several stream keys by
//! CRC-32 of their `id`, read by every daemon (one XREADGROUP per partition), shared
//! through the group; exactly-once whatever partition an event (or its copy) lands on.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use fred::prelude::*;
use rollboard::store::Store;

use crate::support::asserts::{assert_metrics, assert_state};
use crate::support::boards::{now_ms, test_boards};
use crate::support::cli::{assert_success, run_rollboard, send_file};
use crate::support::config::{edit_config, partitioned_config, write_file};
use crate::support::daemon::{partitioned_daemon, Daemon};
use crate::support::events::{
    existing, models, post_fields, read_unacked, tips_now, xadd_all, Fields,
};
use crate::support::keys::{dead_letter_stream, intake_stream, partition_stream};
use crate::support::redis::{free_port, RedisServer};
use crate::support::wait::{drained_streams, wait_for};

type Entries = Vec<(String, HashMap<String, String>)>;

/// The key of partition `p` of 3.
fn key(p: usize) -> String {
    partition_stream(p)
}

fn keys(n: usize) -> Vec<String> {
    (0..n).map(key).collect()
}

/// The partition the documented rule names: CRC-32 (IEEE) of the id, modulo `n`.
fn rule(id: &str, n: usize) -> usize {
    (crc32fast::hash(id.as_bytes()) % n as u32) as usize
}

fn id_of(fields: &Fields) -> &str {
    fields
        .iter()
        .find(|(k, _)| k == "id")
        .map(|(_, v)| v.as_str())
        .expect("test events have ids")
}

/// XADDs each event to the partition `place` names for it.
async fn append_to(store: &Store, events: &[Fields], place: impl Fn(usize, &Fields) -> String) {
    let mut by_key: HashMap<String, Vec<Fields>> = HashMap::new();
    for (k, e) in events.iter().enumerate() {
        by_key.entry(place(k, e)).or_default().push(e.clone());
    }
    for (key, events) in by_key {
        xadd_all(store.client(), &key, &events).await;
    }
}

/// Checks every instance against the model of `events` (each id once).
async fn assert_model(store: &Store, events: &[Fields]) {
    let boards = test_boards();
    let now = now_ms();
    let models = models(events, &boards, now);
    assert_state(store, &boards, &models, now).await;
}

fn verify(config: &std::path::Path) {
    assert_success(&run_rollboard(config, &["verify", "--strict"]), "verify");
}

/// Reads entries as consumer `b` without acking them, on every partition: what a daemon
/// killed mid-batch leaves pending. A copy of `copies[p]` is appended in the same
/// transaction, so `b` holds at least one entry of each partition whatever `a` read before.
async fn hold_as_b(store: &Store, copies: &[Fields]) {
    for (p, key) in keys(3).into_iter().enumerate() {
        let tx = store.client().multi();
        let _: () = tx
            .xadd(key.as_str(), false, None, "*", copies[p].clone())
            .await
            .expect("queue xadd");
        let _: () = tx
            .xreadgroup("rollboard", "b", Some(50), None, false, key.as_str(), ">")
            .await
            .expect("queue xreadgroup");
        let (_, read): (String, Value) = tx.exec(true).await.expect("b reads without acking");
        assert!(!read.is_null(), "b holds entries of {key}");
    }
}

#[tokio::test]
async fn two_daemons_share_three_partitions_and_a_killed_one_loses_nothing() {
    let (redis, store, dir) = RedisServer::start_with_store_and_dir("rb").await;
    let (port_a, port_b) = (free_port(), free_port());
    let config_a = partitioned_config(dir.path(), &redis, port_a, "a", 3);
    let config_b = partitioned_config(dir.path(), &redis, port_b, "b", 3);
    let events = tips_now(6000);
    // Most by the rule, every tenth on the "wrong" partition, as a producer might.
    let placed = |k: usize, e: &Fields| {
        let p = rule(id_of(e), 3);
        key(if k % 10 == 9 { (p + 1) % 3 } else { p })
    };
    // Copies of the first 500 on another partition than their first copy.
    let copied = |_: usize, e: &Fields| key((rule(id_of(e), 3) + 2) % 3);

    let a = Daemon::start(&config_a, port_a).await;
    let b = Daemon::start(&config_b, port_b).await;
    // Both consume before the events arrive (`/readyz` answers 200 once every consumer
    // group of the daemon is ready): a daemon still starting on a busy machine would
    // leave them all to the other.
    for (name, daemon) in [("a", &a), ("b", &b)] {
        let ready = daemon.readyz_becomes(200, Duration::from_secs(20)).await;
        assert!(ready, "{name} not ready; log:\n{}", daemon.logs());
    }
    append_to(&store, &events[..3000], placed).await;
    append_to(&store, &events[..500], copied).await;
    assert!(
        drained_streams(&store, &keys(3)).await,
        "not drained; a:\n{}\nb:\n{}",
        a.logs(),
        b.logs()
    );
    for (name, daemon) in [("a", &a), ("b", &b)] {
        assert!(
            daemon
                .metric("rollboard_events_applied_total", &[("board", "rooms_7d")])
                .await
                > 0.0,
            "{name} took part"
        );
    }
    for k in keys(3) {
        let (_, body) = a.get("/metrics").await;
        assert!(
            body.contains(&format!("rollboard_stream_pending{{stream=\"{k}\"}}")),
            "per-partition pending of {k} reported"
        );
    }

    // b dies with -9 in the middle of the second half, and holds entries of every
    // partition that it never acks; a claims them after claim_idle (1 s).
    append_to(&store, &events[3000..4500], placed).await;
    b.kill().await;
    hold_as_b(&store, &events[10..13]).await;
    append_to(&store, &events[4500..], placed).await;
    append_to(&store, &events[4000..4200], copied).await;
    hold_as_b(&store, &events[20..23]).await;
    assert!(
        drained_streams(&store, &keys(3)).await,
        "not drained after b died; a:\n{}",
        a.logs()
    );
    assert!(a
        .logs()
        .contains("claimed entries left pending by another consumer"));
    assert_model(&store, &events).await;
    verify(&config_a);
    // Nothing went to the bare stream key.
    let bare = existing(&store, intake_stream()).await;
    assert_eq!(bare, 0);
    assert!(a.terminate().await.success());
}

#[tokio::test]
async fn a_copy_on_another_partition_is_a_duplicate() {
    let (redis, store, dir) = RedisServer::start_with_store_and_dir("rb").await;
    let events = tips_now(900);
    let daemon = partitioned_daemon(dir.path(), &redis, "a", 3).await;
    append_to(&store, &events, |_, e| key(rule(id_of(e), 3))).await;
    append_to(&store, &events, |_, e| key((rule(id_of(e), 3) + 1) % 3)).await;
    assert!(drained_streams(&store, &keys(3)).await);
    assert_model(&store, &events).await;
    assert_metrics(
        &daemon,
        &[
            "rollboard_events_applied_total{board=rooms_7d} 900",
            "rollboard_events_skipped_total{board=rooms_7d,reason=duplicate} 900",
        ],
    )
    .await;
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn send_and_post_append_to_the_partition_the_rule_names() {
    let (redis, store, dir) = RedisServer::start_with_store_and_dir("rb").await;
    let port = free_port();
    let cfg = partitioned_config(dir.path(), &redis, port, "a", 3);
    let daemon = Daemon::start(&cfg, port).await;
    let now = now_ms();
    // Half with their own id, half given one at intake.
    let json = |i: usize| {
        let mut e = serde_json::json!({ "room": format!("r{}", i % 5), "amount": 1 + i % 4, "ts": now - i as i64 });
        if i % 2 == 0 {
            e["id"] = format!("own-{i}").into();
        }
        e
    };
    let lines: Vec<String> = (0..60).map(|i| json(i).to_string()).collect();
    let file = write_file(dir.path(), "events.jsonl", &lines.join("\n"));
    let out = send_file(&cfg, &file);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "appended 60 event(s) to rb:events:{0..2}"
    );
    let body: Vec<serde_json::Value> = (60..120).map(json).collect();
    let r = reqwest::Client::new()
        .post(format!("{}/v1/events", daemon.base))
        .json(&body)
        .send()
        .await
        .expect("post");
    assert_eq!(r.status().as_u16(), 202);

    let mut ids = HashSet::new();
    let mut used = HashSet::new();
    for (p, k) in keys(3).iter().enumerate() {
        let entries: Entries = store
            .client()
            .xrange(k.as_str(), "-", "+", None)
            .await
            .expect("xrange");
        for (entry, fields) in &entries {
            let id = &fields["id"];
            assert_eq!(rule(id, 3), p, "entry {entry} ({id}) on {k}");
            assert!(ids.insert(id.clone()), "{id} appended twice");
            used.insert(p);
        }
    }
    assert_eq!(ids.len(), 120);
    assert_eq!(used.len(), 3, "every partition got events");
    for i in (0..120).step_by(2) {
        assert!(ids.contains(&format!("own-{i}")));
    }
    let bare = existing(&store, intake_stream()).await;
    assert_eq!(bare, 0, "nothing on the bare stream key");
    assert!(drained_streams(&store, &keys(3)).await);
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn dead_letters_name_their_partition() {
    let (redis, store, dir) = RedisServer::start_with_store_and_dir("rb").await;
    let daemon = partitioned_daemon(dir.path(), &redis, "a", 3).await;
    let now = now_ms().to_string();
    for (p, id) in [(1, "bad-1"), (2, "bad-2")] {
        let _: String = store
            .client()
            .xadd(
                key(p).as_str(),
                false,
                None,
                "*",
                vec![
                    ("room", "r1"),
                    ("amount", "x"),
                    ("id", id),
                    ("ts", now.as_str()),
                ],
            )
            .await
            .expect("xadd");
    }
    let dead = || async {
        store
            .client()
            .xrange::<Entries, _, _, _>(dead_letter_stream(), "-", "+", None)
            .await
            .expect("xrange")
    };
    assert!(
        wait_for(Duration::from_secs(20), || async {
            dead().await.len() == 2
        })
        .await
    );
    let mut seen: Vec<(String, String, String)> = dead()
        .await
        .into_iter()
        .map(|(_, f)| {
            (
                f["id"].clone(),
                f["source_stream"].clone(),
                f["reason"].clone(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("bad-1".into(), key(1), "amount".into()),
            ("bad-2".into(), key(2), "amount".into())
        ]
    );
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn changing_the_partition_count_drains_the_old_layout() {
    let (redis, store, dir) = RedisServer::start_with_store_and_dir("rb").await;
    let port = free_port();
    let events = tips_now(1500);

    // One partition's stream holds unread entries and entries a dead consumer left pending.
    xadd_all(store.client(), intake_stream(), &events[..500]).await;
    let _: Value = store
        .client()
        .xgroup_create(intake_stream(), "rollboard", "0", false)
        .await
        .expect("group");
    read_unacked(&store, "rollboard", "old", 100).await;
    // A daemon with three partitions takes them, besides its own partitions.
    let three = partitioned_config(dir.path(), &redis, port, "a", 3);
    let daemon = Daemon::start(&three, port).await;
    append_to(&store, &events[500..1000], |_, e| key(rule(id_of(e), 3))).await;
    let mut all = keys(3);
    all.push(intake_stream().into());
    assert!(
        drained_streams(&store, &all).await,
        "not drained; log:\n{}",
        daemon.logs()
    );
    assert_model(&store, &events[..1000]).await;
    assert!(
        wait_for(Duration::from_secs(10), || async {
            daemon.logs().contains("retired partition drained")
        })
        .await
    );
    assert!(daemon.terminate().await.success());

    // Back to one partition: entries still on a partition key are read as well.
    append_to(&store, &events[1000..], |_, e| key(rule(id_of(e), 3))).await;
    let one = partitioned_config(dir.path(), &redis, port, "a", 1);
    let daemon = Daemon::start(&one, port).await;
    assert!(
        drained_streams(&store, &all).await,
        "not drained; log:\n{}",
        daemon.logs()
    );
    assert_model(&store, &events).await;
    verify(&one);
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn three_partitions_on_a_cluster_sit_in_distinct_slots_and_equal_the_model() {
    use crate::support::cluster::{cli, RedisCluster};
    use crate::support::config::write_config_url;

    let cluster = RedisCluster::start();
    let node = cluster.ports()[0];
    // Redis itself puts the keys of every partition count up to 64 in distinct slots.
    for n in [2, 3, 16, 64] {
        let slots: HashSet<String> = (0..n)
            .map(|p| cli(node, &["CLUSTER", "KEYSLOT", &partition_stream(p)]))
            .map(|s| s.trim().to_string())
            .collect();
        assert_eq!(slots.len(), n, "{n} partitions: {slots:?}");
    }
    let store = cluster.store().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let path = write_config_url(dir.path(), &cluster.url(), port, "a", "");
    edit_config(&path, "[ingest]\n", "[ingest]\npartitions = 3\n");
    let daemon = Daemon::start(&path, port).await;
    let events = tips_now(1500);
    append_to(&store, &events[..1000], |_, e| key(rule(id_of(e), 3))).await;
    let r = post_fields(&daemon.base, &events[1000..]).await;
    assert_eq!(r.status().as_u16(), 202);
    assert!(
        drained_streams(&store, &keys(3)).await,
        "not drained; log:\n{}",
        daemon.logs()
    );
    assert_model(&store, &events).await;
    assert!(daemon.terminate().await.success());
}
