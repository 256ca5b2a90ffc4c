//! Talking to the daemon's HTTP API: a raw POST with its `Retry-After`, JSON bodies, and a
//! daemon that has applied one tip.

use std::path::PathBuf;

use rollboard::store::Store;
use serde_json::Value;
use tempfile::TempDir;

use crate::support::boards::redis_now;
use crate::support::config::{server_and_config, write_config};
use crate::support::daemon::Daemon;
use crate::support::redis::RedisServer;
use crate::support::wait::drained;

/// POSTs `body` to the intake; status, `Retry-After` and body.
pub async fn post(daemon: &Daemon, body: &str) -> (u16, Option<String>, String) {
    post_to(daemon, "/v1/events", body).await
}

/// POSTs the JSON `body` to `path` (with its query); status, `Retry-After` and body.
pub async fn post_to(daemon: &Daemon, path: &str, body: &str) -> (u16, Option<String>, String) {
    let answer = reqwest::Client::new()
        .post(format!("{}{path}", daemon.base))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("POST");
    answer_parts(answer).await
}

/// POSTs one tip (`amount` as a string); status, `Retry-After` and body.
pub async fn post_tip(
    daemon: &Daemon,
    id: &str,
    ts: i64,
    room: &str,
    user: &str,
    amount: &str,
) -> (u16, Option<String>, String) {
    let body =
        format!(r#"{{"id":"{id}","ts":{ts},"room":"{room}","user":"{user}","amount":"{amount}"}}"#);
    post(daemon, &body).await
}

/// GET `path`; status, `Retry-After` and body.
pub async fn get(daemon: &Daemon, path: &str) -> (u16, Option<String>, String) {
    let answer = reqwest::get(format!("{}{path}", daemon.base))
        .await
        .expect("GET");
    answer_parts(answer).await
}

/// An answer's status, `Retry-After` and body.
pub async fn answer_parts(answer: reqwest::Response) -> (u16, Option<String>, String) {
    let status = answer.status().as_u16();
    let retry = answer
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    (status, retry, answer.text().await.unwrap_or_default())
}

/// `text` parsed as JSON; panics naming the text when it is not.
pub fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// A daemon on a fresh redis-server with one tip to room r1 applied (rooms_7d, fans_7d).
pub async fn with_one_tip() -> (RedisServer, Store, TempDir, PathBuf, Daemon) {
    let (redis, dir, port, config) =
        server_and_config(|dir, redis, port| write_config(dir, redis, port, "ops", ""));
    let store = redis.store("rb").await;
    let daemon = Daemon::start(&config, port).await;
    let now = redis_now(&store).await;
    let (status, _, body) = post_tip(&daemon, "t1", now, "r1", "u1", "5").await;
    assert_eq!(status, 202, "{body}");
    assert!(drained(&store).await, "the tip was not applied");
    (redis, store, dir, config, daemon)
}
