//! The change feed as a client reads it: a Server-Sent Events stream parsed event by event,
//! a daemon whose boards keep feeds, and change entries written straight into a feed (as
//! the scripts that change a ranking write them).

use std::time::Duration;

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};
use rollboard::store::Store;

use crate::support::boards::redis_now;
use crate::support::config::write_config;
use crate::support::daemon::Daemon;
use crate::support::redis::{free_port, RedisServer};

/// The test boards, `rooms_7d` and `fans_7d` with a change feed of their top 10.
pub fn feed_boards(config: &std::path::Path) {
    let text = std::fs::read_to_string(config).expect("read config");
    let text = text
        .replacen("slice = \"6h\"\n", "slice = \"6h\"\nchanges_top = 10\n", 1)
        .replacen(
            "mode = \"resummarize\"\n",
            "mode = \"resummarize\"\nchanges_top = 10\n",
            1,
        );
    std::fs::write(config, text).expect("write config");
}

/// A fresh redis-server, a store on it and a started daemon whose boards keep feeds
/// ([`feed_boards`]), its `[http]` section with `extra` lines.
pub async fn feed_daemon(extra: &str) -> (RedisServer, Store, tempfile::TempDir, Daemon) {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let config = write_config(dir.path(), &redis, port, "feed", extra);
    feed_boards(&config);
    let store = redis.store("rb").await;
    let daemon = Daemon::start(&config, port).await;
    (redis, store, dir, daemon)
}

/// Appends one change entry to the feed `key` as the writer does; its ID.
pub async fn xadd_change(store: &Store, key: &str, fields: &[(&str, &str)]) -> String {
    let mut args = vec![key.to_string(), "*".to_string()];
    for (k, v) in fields {
        args.extend([k.to_string(), v.to_string()]);
    }
    let command = CustomCommand::new_static("XADD", ClusterHash::FirstKey, false);
    store.client().custom(command, args).await.expect("xadd")
}

/// An `entered` entry of `member` at `rank` with `total`, caused by a tip.
pub async fn entered(store: &Store, key: &str, member: &str, rank: u32, total: i64) -> String {
    let (rank, total) = (rank.to_string(), total.to_string());
    let ts = redis_now(store).await.to_string();
    xadd_change(
        store,
        key,
        &[
            ("kind", "entered"),
            ("member", member),
            ("rank", &rank),
            ("total", &total),
            ("cause", "tip"),
            ("ts", &ts),
        ],
    )
    .await
}

/// One block of a stream: an event, or a comment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// `id:`.
    pub id: Option<String>,
    /// `event:`.
    pub event: Option<String>,
    /// `data:` (lines joined by `\n`).
    pub data: String,
    /// A comment line's text (`:heartbeat`), for a comment-only block.
    pub comment: Option<String>,
}

/// An open stream.
pub struct Sse {
    answer: reqwest::Response,
    buffer: String,
}

/// Opens `path` on `daemon` as a stream (with `Last-Event-ID` and a bearer token when
/// given); the answer whatever its status.
pub async fn open_stream(
    daemon: &Daemon,
    path: &str,
    last_id: Option<&str>,
    token: Option<&str>,
) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .get(format!("{}{path}", daemon.base))
        .header("accept", "text/event-stream");
    if let Some(id) = last_id {
        request = request.header("last-event-id", id);
    }
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.expect("GET the stream")
}

impl Sse {
    /// Opens `path`, asserting a 200 `text/event-stream` answer.
    pub async fn open(daemon: &Daemon, path: &str, last_id: Option<&str>) -> Sse {
        Sse::open_with(daemon, path, last_id, None).await
    }

    /// As [`Sse::open`], with a bearer token.
    pub async fn open_with(
        daemon: &Daemon,
        path: &str,
        last_id: Option<&str>,
        token: Option<&str>,
    ) -> Sse {
        let answer = open_stream(daemon, path, last_id, token).await;
        let status = answer.status().as_u16();
        let kind = answer
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        if status != 200 {
            let body = answer.text().await.unwrap_or_default();
            panic!("{path}: {status} {body}");
        }
        assert_eq!(kind, "text/event-stream", "{path}");
        Sse {
            answer,
            buffer: String::new(),
        }
    }

    /// The next block (event or comment) within `limit`; `None` when the stream ended or
    /// nothing came.
    pub async fn next_block(&mut self, limit: Duration) -> Option<SseEvent> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                return Some(parse_block(&block));
            }
            let chunk = tokio::time::timeout_at(deadline, self.answer.chunk()).await;
            match chunk {
                Ok(Ok(Some(bytes))) => self.buffer.push_str(&String::from_utf8_lossy(&bytes)),
                _ => return None,
            }
        }
    }

    /// The next event (comments skipped) within `limit`.
    pub async fn next_event(&mut self, limit: Duration) -> Option<SseEvent> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let block = self.next_block(left).await?;
            if block.comment.is_none() {
                return Some(block);
            }
        }
    }

    /// Whether the stream ends (the server finished it or closed the connection) within
    /// `limit`, whatever it still sends meanwhile.
    pub async fn ends_within(&mut self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            match tokio::time::timeout_at(deadline, self.answer.chunk()).await {
                Err(_) => return false,
                Ok(Ok(Some(_))) => continue,
                Ok(Ok(None)) | Ok(Err(_)) => return true,
            }
        }
    }
}

fn parse_block(block: &str) -> SseEvent {
    let mut event = SseEvent::default();
    let mut data = Vec::new();
    for line in block.lines() {
        if let Some(comment) = line.strip_prefix(':') {
            event.comment = Some(comment.trim().to_string());
        } else if let Some((field, value)) = line.split_once(':') {
            let value = value.strip_prefix(' ').unwrap_or(value).to_string();
            match field {
                "id" => event.id = Some(value),
                "event" => event.event = Some(value),
                "data" => data.push(value),
                _ => {}
            }
        }
    }
    if event.id.is_some() || event.event.is_some() || !data.is_empty() {
        event.comment = None;
    }
    event.data = data.join("\n");
    event
}
