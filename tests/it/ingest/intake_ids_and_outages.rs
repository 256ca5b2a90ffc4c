//! Event intake under faults: `POST /v1/events` and `rollboard send` give every event
//! without an `id` one before appending, so a client library's retry of an append whose
//! reply was lost is a duplicate, not new money; a POST that cannot reach Redis answers 503
//! instead of hanging.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fred::prelude::*;
use rollboard::config::Settings;
use rollboard::store::Store;
use serde_json::json;

use crate::support::cli::send_file;
use crate::support::config::{config_for_url, write_file, BOARDS};
use crate::support::daemon::{redis_and_config, Daemon};
use crate::support::keys::intake_stream;
use crate::support::proxy::Proxy;
use crate::support::redis::RedisServer;
use crate::support::wait::drained;

type Entries = Vec<(String, HashMap<String, String>)>;

/// A daemon whose Redis URL points at a proxy in front of a fresh redis-server.
async fn daemon_behind_proxy() -> (RedisServer, Proxy, Store, tempfile::TempDir, Daemon) {
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.port).await;
    let store = redis.store("rb").await;
    let (dir, port, config) = config_for_url(&proxy.url(), "a", "");
    let daemon = Daemon::start(&config, port).await;
    let ready = daemon.readyz_becomes(200, Duration::from_secs(20)).await;
    assert!(ready, "daemon never got ready; log:\n{}", daemon.logs());
    (redis, proxy, store, dir, daemon)
}

async fn post(daemon: &Daemon, body: &serde_json::Value) -> (u16, String) {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/events", daemon.base))
        .json(body)
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .expect("the daemon answers");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

/// A small xorshift generator, seeded from the clock; the seed is printed on failure.
struct Dice(u64);

impl Dice {
    fn roll(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[tokio::test]
async fn a_post_whose_exec_reply_is_lost_is_counted_once() {
    let (_redis, proxy, store, _dir, daemon) = daemon_behind_proxy().await;
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    let mut dice = Dice(seed);
    let mut armed = 0;
    // Posts answered 202.
    let mut accepted = Vec::new();
    for i in 0..20 {
        // Cut right after EXEC reached the server (the reply is lost), or right after the
        // transaction's first bytes (it may not have run); some posts are not cut at all.
        // Or drop every connection just before, so the append meets a dead one.
        if dice.roll() % 5 == 0 {
            proxy.close_all();
        }
        if i == 0 || dice.roll() % 3 != 0 {
            let pattern: &[u8] = if dice.roll() % 4 == 0 {
                b"XADD"
            } else {
                b"EXEC"
            };
            proxy.cut_after(pattern, 1);
            armed += 1;
        }
        let (status, body) = post(&daemon, &json!({"room": format!("r{i}"), "amount": "10"})).await;
        assert!(
            status == 202 || status == 503,
            "post {i}: {status} {body} (seed {seed})"
        );
        if status == 202 {
            accepted.push(i);
        }
        proxy.cut_after(b"EXEC", 0);
    }
    // A post answered 503 before its transaction went out leaves its cut unused.
    assert!(
        proxy.cuts() > 0 && proxy.cuts() <= armed,
        "{} of {armed} armed cuts happened (seed {seed})",
        proxy.cuts()
    );
    assert!(
        drained(&store).await,
        "stream never drained; log:\n{}",
        daemon.logs()
    );
    let entries: Entries = store
        .client()
        .xrange(intake_stream(), "-", "+", None)
        .await
        .expect("xrange");
    let board = Settings::from_toml(BOARDS)
        .expect("test boards")
        .boards
        .into_iter()
        .find(|b| b.name == "rooms_7d")
        .expect("rooms_7d");
    let mut repeats = 0;
    for i in 0..20 {
        let member = format!("r{i}");
        let appended = entries.iter().filter(|(_, f)| f["room"] == member).count();
        let rank = store
            .rank(
                &board.widest(),
                None,
                &member,
                rollboard::domain::clock::local_ms(),
            )
            .await
            .expect("rank");
        if accepted.contains(&i) {
            // Every attempt of a 202'd append was in the stream before the answer.
            repeats += appended.saturating_sub(1);
            assert_eq!(
                rank.total,
                Some(10),
                "{member}: total from {appended} stream entries (seed {seed})"
            );
        } else {
            // A 503 may or may not have appended, possibly only after the drain; whatever
            // reached the stream counts once.
            assert!(
                rank.total.is_none_or(|t| t == 10),
                "{member}: total {:?} from {appended} stream entries (seed {seed})",
                rank.total
            );
        }
    }
    // At least: a connection dropped under the consumer also makes it apply a batch again.
    let duplicates = daemon
        .metric(
            "rollboard_events_skipped_total",
            &[("board", "rooms_7d"), ("reason", "duplicate")],
        )
        .await;
    assert!(
        duplicates >= repeats as f64,
        "{repeats} repeated appends, {duplicates} skipped as duplicates (seed {seed})"
    );
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn send_gives_each_event_without_an_id_its_own_and_keeps_given_ids() {
    let (_redis, store, dir, config, _) = redis_and_config("a").await;
    let input = "{\"room\":\"r1\",\"amount\":10}\n{\"room\":\"r1\",\"amount\":10}\n{\"room\":\"r2\",\"amount\":5,\"id\":\"mine-1\"}\n{\"room\":\"r3\",\"amount\":5,\"id\":42}\n{\"user\":\"u\",\"value\":\"1.50\"}\n";
    let file = write_file(dir.path(), "events.jsonl", input);
    for _ in 0..2 {
        send_file(&config, &file);
    }
    let entries: Entries = store
        .client()
        .xrange(intake_stream(), "-", "+", None)
        .await
        .expect("xrange");
    assert_eq!(entries.len(), 10);
    let mut given = HashSet::new();
    for (n, (entry, fields)) in entries.iter().enumerate() {
        let id = fields
            .get("id")
            .unwrap_or_else(|| panic!("entry {entry} has no id: {fields:?}"));
        match n % 5 {
            2 => assert_eq!(id, "mine-1"),
            3 => assert_eq!(id, "42", "a JSON number id is kept as written"),
            _ => {
                let uuid = uuid::Uuid::parse_str(id).expect("a given id is a UUID");
                assert_eq!(uuid.get_version_num(), 7, "{id} is a UUIDv7");
                assert!(given.insert(id.clone()), "{id} given twice");
            }
        }
        assert_eq!(fields.len(), 3, "one field added at most: {fields:?}");
    }
    assert_eq!(given.len(), 6, "each event without an id got its own");
}

#[tokio::test]
async fn a_post_while_redis_is_unreachable_answers_503_with_a_json_error() {
    let (_redis, proxy, _store, _dir, daemon) = daemon_behind_proxy().await;
    proxy.blackhole(true);
    let answer = tokio::time::timeout(
        Duration::from_secs(15),
        post(&daemon, &json!({"room": "r1", "amount": "10"})),
    )
    .await;
    let Ok((status, body)) = answer else {
        panic!("POST still unanswered after 15 s with Redis unreachable");
    };
    assert_eq!(status, 503, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).expect("a JSON body");
    assert!(body["error"].is_string(), "{body}");
    proxy.blackhole(false);
    let ready = daemon.readyz_becomes(200, Duration::from_secs(30)).await;
    assert!(
        ready,
        "daemon never got ready again; log:\n{}",
        daemon.logs()
    );
    let (status, body) = post(
        &daemon,
        &json!({"room": "r1", "amount": "10", "id": "again"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    assert!(daemon.terminate().await.success());
}
