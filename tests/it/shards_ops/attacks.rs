//! A key of the wrong type in one shard (a String at its `result`): every merged query of
//! the board needs that shard (a member's place is counted in every shard), so each fails
//! with a data error, never a panic: over HTTP a 500 saying it is not an outage (Redis is
//! up; the data is not what rollboard wrote), not a 503 and not a 400. The other shards go
//! on: ingest applies their events and dead-letters only the broken shard's
//! (`apply_failed`), a roll rolls them and counts one instance failed, each still reads
//! alone; once the key is removed the board answers again.

use fred::prelude::*;
use rollboard::store::Store;
use serde_json::json;

use super::{members_by_shard, now0, sharded};
use crate::support::asserts::assert_verified;
use crate::support::boards::{
    entry, ingest_settings, redis_now, registered, roll_board, run_jobs, set_string, total_at,
    Consumer, HOUR,
};
use crate::support::config::write_config;
use crate::support::daemon::Daemon;
use crate::support::events::letters;
use crate::support::http::{post, post_to};
use crate::support::keys::{instance, intake_stream, shard};
use crate::support::redis::{free_port, RedisServer};
use crate::support::wait::drained;

/// The stream entries of a batch: `member` gets `amount`, at `now`.
fn batch(members: &[String], tag: &str, now: i64) -> Vec<rollboard::ingest::stream::Entry> {
    members
        .iter()
        .enumerate()
        .map(|(i, m)| {
            entry(
                &format!("{now}-{i}"),
                &[
                    ("id", &format!("{tag}{i}")),
                    ("ts", &now.to_string()),
                    ("user", m),
                    ("amount", "5"),
                ],
            )
        })
        .collect()
}

/// The dead letters' (member, reason) pairs.
async fn dead_letters(store: &Store) -> Vec<(String, String)> {
    letters(store)
        .await
        .into_iter()
        .map(|(_, f)| (f["user"].clone(), f["reason"].clone()))
        .collect()
}

#[tokio::test]
async fn a_key_of_the_wrong_type_in_one_shard_fails_the_merged_queries_and_nothing_else() {
    let (_redis, store) = RedisServer::start_with_store("rb").await;
    let b = sharded("tips", 4);
    let boards = vec![b.clone()];
    let metrics = rollboard::metrics::Metrics::new(&boards);
    let settings = ingest_settings(intake_stream(), 1);
    let consumer = Consumer::new(&store, &boards, &settings, &metrics);
    let by_shard = members_by_shard(&b, "u", 2);
    let members = by_shard.concat();
    let now = now0();
    consumer
        .process(intake_stream(), &batch(&members, "a", now), now)
        .await
        .expect("batch");
    let broken = store.instance(&b.widest(), Some("#2")).result();
    let _: () = store.client().del(&broken).await.expect("DEL");
    set_string(&store, &broken, "oops").await;

    // Every merged query fails, with the server's error; none panics.
    let (in_broken, elsewhere) = (&by_shard[2][0], &by_shard[0][0]);
    let err = store
        .top(&b.widest(), None, 0, 10, now)
        .await
        .expect_err("top");
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
    for m in [in_broken, elsewhere, &"nobody".to_string()] {
        assert!(
            store.rank(&b.widest(), None, m, now).await.is_err(),
            "rank {m}"
        );
        assert!(
            store.around(&b.widest(), None, m, 2, now).await.is_err(),
            "around {m}"
        );
        assert!(
            store.rank_in_windows(&b, None, m, now).await.is_err(),
            "{m}"
        );
    }
    assert!(store
        .ranks(&b.widest(), None, &[elsewhere.as_str()], now)
        .await
        .is_err());
    // Each other shard reads alone.
    for shard in ["#0", "#1", "#3"] {
        let page = store
            .top(&b.widest(), Some(shard), 0, 10, now)
            .await
            .expect("a shard");
        assert_eq!(page.envelope.count, 2, "{shard}");
    }

    // Ingest goes on for the other shards; the broken shard's events are dead-lettered.
    let held = consumer
        .process(intake_stream(), &batch(&members, "b", now), now)
        .await
        .expect("batch");
    assert_eq!(held.entries, 0, "{:?}", held.error);
    let letters = dead_letters(&store).await;
    let mut dead: Vec<&str> = letters.iter().map(|(m, _)| m.as_str()).collect();
    dead.sort();
    let mut want: Vec<&str> = by_shard[2].iter().map(String::as_str).collect();
    want.sort();
    assert_eq!(dead, want, "{letters:?}");
    assert!(
        letters.iter().all(|(_, r)| r == "apply_failed"),
        "{letters:?}"
    );
    for shard in ["#0", "#1", "#3"] {
        let page = store
            .top(&b.widest(), Some(shard), 0, 10, now)
            .await
            .expect("a shard");
        assert!(
            page.entries.iter().all(|e| e.total == 10),
            "{shard}: {page:?}"
        );
    }

    // The key removed (the shard's ranking lost), the board answers again; a rebuild
    // restores the shard from its slices.
    let _: () = store.client().del(&broken).await.expect("DEL");
    let top = store.top(&b.widest(), None, 0, 10, now).await.expect("top");
    assert_eq!(top.envelope.count, 6);
    rollboard::roll::rebuild(&store, &b.widest(), Some("#2"), 10)
        .await
        .expect("rebuild");
    let top = store.top(&b.widest(), None, 0, 10, now).await.expect("top");
    assert_eq!(top.envelope.count, 8);
    assert_eq!(total_at(&store, &b.widest(), in_broken, now).await, Some(5));
    assert_eq!(
        total_at(&store, &b.widest(), elsewhere, now).await,
        Some(10)
    );

    // Broken again: past the window, a roll rolls the others (emptied, they leave the
    // registry) and counts the broken one failed; it stays registered, and the next
    // roll, the key removed, expires it too.
    set_string(&store, &broken, "oops").await;
    let later = now + 7 * HOUR;
    let report = run_jobs(&store, &boards, later, 10).await.remove(0);
    assert_eq!(report.instances_failed, 1, "{report:?}");
    assert_eq!(report.scopes_removed, 3, "{report:?}");
    assert!(registered(&store, "tips", "#2").await);
    let _: () = store.client().del(&broken).await.expect("DEL");
    let report = roll_board(&store, &b, later).await;
    assert_eq!(report.scopes_removed, 1, "{report:?}");
    let top = store
        .top(&b.widest(), None, 0, 10, later)
        .await
        .expect("top");
    assert_eq!(top.envelope.count, 0);
    for shard in b.shard_names() {
        assert_verified(&store, &b.widest(), Some(&shard)).await;
    }
}

/// Over HTTP the broken shard's error is a 500 that says it is not an outage, for every
/// query of the board; the other boards answer.
#[tokio::test]
async fn over_http_a_broken_shard_is_a_500_not_an_outage() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let extra = "\n[[boards]]\nname = \"sh\"\nmember = \"player\"\namount = \"points\"\n\
                 window = \"6h\"\nslice = \"1h\"\nshards = 3\n";
    let config = write_config(dir.path(), &redis, port, "sh", extra);
    let store = redis.store("rb").await;
    let daemon = Daemon::start(&config, port).await;
    let now = redis_now(&store).await;
    for (i, p) in ["ann", "bob", "cy", "dee", "eve"].iter().enumerate() {
        let body = json!({"id": format!("p{i}"), "ts": now, "player": p, "points": "2"});
        let (status, _, answer) = post(&daemon, &body.to_string()).await;
        assert_eq!(status, 202, "{answer}");
    }
    assert!(drained(&store).await);
    let (status, _) = daemon.get("/v1/boards/sh/top").await;
    assert_eq!(status, 200);
    redis.cli(&["DEL", &instance("sh", Some(&shard(1))).result()]);
    redis.cli(&["SET", &instance("sh", Some(&shard(1))).result(), "x"]);
    for path in [
        "/v1/boards/sh/top",
        "/v1/boards/sh/members/ann",
        "/v1/boards/sh/members/nobody",
        "/v1/boards/sh/members/bob/around",
        "/v1/boards/sh/members/cy?all_windows=true",
    ] {
        // The test's redis-cli is another process: its write shows within max_staleness.
        let (status, body) = daemon.get_once(path, |status, _| status == 500).await;
        assert_eq!(status, 500, "{path}: {body}");
        assert!(
            body.contains("WRONGTYPE") && body.contains("not an outage"),
            "{path}: {body}"
        );
    }
    let (status, _, body) = post_to(&daemon, "/v1/boards/sh/ranks", r#"{"members":["ann"]}"#).await;
    assert_eq!(status, 500, "{body}");
    let (status, _) = daemon.get("/v1/boards/rooms_7d/top").await;
    assert_eq!(status, 200);
    // Repaired by hand (the key removed), the board answers.
    redis.cli(&["DEL", &instance("sh", Some(&shard(1))).result()]);
    let (status, body) = daemon.get("/v1/boards/sh/top").await;
    assert_eq!(status, 200, "{body}");
}
