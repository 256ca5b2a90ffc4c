//! A sharded board as readers meet it, over HTTP and the command line, beside its
//! unsharded twin fed the same events: every answer alike but for the board's name
//! (members with unicode names in the path, `ranks` with repeated and unknown members);
//! `GET /v1/boards` lists `shards`; `?scope=` is a 400 as on any unscoped board; a page
//! deeper than rank 10 000 is a 400 saying why (exit 2 from the command line), one that
//! ends at rank 10 000 is answered.

use std::path::PathBuf;

use serde_json::{json, Value};
use tempfile::TempDir;

use crate::support::boards::redis_now;
use crate::support::cli::{assert_contains, assert_exit, run_rollboard, stderr, stdout};
use crate::support::config::{server_and_config, write_config};
use crate::support::daemon::Daemon;
use crate::support::http::{get, json, post, post_to};
use crate::support::redis::RedisServer;
use crate::support::wait::drained;

/// `sh`, spread over 4 shards, and `pl`, its twin on one instance: players' points over
/// the last 6 hours. Their events match no test board.
const TWINS: &str = concat!(
    "\n[[boards]]\nname = \"sh\"\nmember = \"player\"\namount = \"points\"\n",
    "window = \"6h\"\nslice = \"1h\"\nshards = 4\ntie_break = \"latest\"\n",
    "\n[[boards]]\nname = \"pl\"\nmember = \"player\"\namount = \"points\"\n",
    "window = \"6h\"\nslice = \"1h\"\ntie_break = \"latest\"\n",
);

/// Players with names that a path or a hash could trip over.
const PLAYERS: [&str; 10] = [
    "ann",
    "bob",
    "cy",
    "dee",
    "ünïcödé ☃",
    "a/b",
    "x?y=1&z",
    "100%",
    "#0",
    "🎉",
];

struct Twins {
    _redis: RedisServer,
    _dir: TempDir,
    config: PathBuf,
    daemon: Daemon,
}

/// A daemon with the twins, and each player's points posted (ties among them).
async fn twins() -> Twins {
    let (redis, dir, port, config) =
        server_and_config(|dir, redis, port| write_config(dir, redis, port, "sh", TWINS));
    let store = redis.store("rb").await;
    let daemon = Daemon::start(&config, port).await;
    let now = redis_now(&store).await;
    for (i, p) in PLAYERS.iter().enumerate() {
        let body = json!({"id": format!("p{i}"), "ts": now - i as i64 * 1000, "player": p,
            "points": (3 + i % 4).to_string()});
        let (status, _, answer) = post(&daemon, &body.to_string()).await;
        assert_eq!(status, 202, "{answer}");
    }
    assert!(drained(&store).await, "the events were not applied");
    Twins {
        _redis: redis,
        _dir: dir,
        config,
        daemon,
    }
}

/// GETs `path`: status and body as JSON.
async fn get_json(daemon: &Daemon, path: &str) -> (u16, Value) {
    let (status, _, body) = get(daemon, path).await;
    (status, json(&body))
}

/// `answer` with its board name and `as_of` taken out (and the board's name in an error
/// made `X`).
fn unnamed(mut answer: Value) -> Value {
    if let Some(o) = answer.as_object_mut() {
        o.remove("board");
        o.remove("as_of");
        if let Some(Value::String(e)) = o.get_mut("error") {
            *e = e
                .replace("board sh", "board X")
                .replace("board pl", "board X");
        }
    }
    answer
}

/// A path segment percent-encoded.
fn encoded(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test]
async fn every_answer_of_the_sharded_board_is_its_twins() {
    let t = twins().await;
    let mut paths = vec![];
    for (offset, limit) in [(0, 10), (0, 3), (3, 3), (8, 5), (20, 1)] {
        paths.push(format!("top?offset={offset}&limit={limit}"));
    }
    for p in PLAYERS.iter().chain(&["nobody", "ünïcödé"]) {
        let p = encoded(p);
        paths.push(format!("members/{p}"));
        paths.push(format!("members/{p}/around?radius=2"));
        paths.push(format!("members/{p}/around?radius=0"));
        paths.push(format!("members/{p}?all_windows=true"));
    }
    for path in paths {
        let (a, pl) = get_json(&t.daemon, &format!("/v1/boards/pl/{path}")).await;
        let (b, sh) = get_json(&t.daemon, &format!("/v1/boards/sh/{path}")).await;
        assert_eq!((b, unnamed(sh)), (a, unnamed(pl)), "{path}");
    }
    // A member found in its shard by its unicode name.
    let (status, rank) = get_json(
        &t.daemon,
        &format!("/v1/boards/sh/members/{}", encoded(PLAYERS[4])),
    )
    .await;
    assert_eq!(status, 200, "{rank}");
    assert_eq!(rank["member"], PLAYERS[4]);
    assert_eq!(rank["total"], 3, "3 + 4 % 4 points");
    // `ranks`: repeated members and unknown ones.
    for members in [
        json!(["ann", "ann", "nobody", "🎉", "ann", "nobody"]),
        json!(PLAYERS),
        json!(["nobody"]),
    ] {
        let body = json!({ "members": members }).to_string();
        let (a, _, pl) = post_to(&t.daemon, "/v1/boards/pl/ranks", &body).await;
        let (b, _, sh) = post_to(&t.daemon, "/v1/boards/sh/ranks", &body).await;
        assert_eq!(
            (b, unnamed(json(&sh))),
            (a, unnamed(json(&pl))),
            "{members}"
        );
    }
    // And from the command line.
    for args in [
        vec!["top", "{}", "--json", "--limit", "4", "--offset", "2"],
        vec!["rank", "{}", "ann", "🎉", "ann", "nobody", "--json"],
        vec!["around", "{}", "ünïcödé ☃", "--radius", "3", "--json"],
        vec!["rank", "{}", "#0", "--all-windows", "--json"],
    ] {
        let run = |board: &str| {
            let args: Vec<&str> = args
                .iter()
                .map(|a| if *a == "{}" { board } else { a })
                .collect();
            let out = run_rollboard(&t.config, &args);
            (out.status.code(), unnamed(json(&stdout(&out))))
        };
        assert_eq!(run("sh"), run("pl"), "{args:?}");
    }
}

#[tokio::test]
async fn boards_list_shards_and_a_scope_is_refused() {
    let t = twins().await;
    let (status, boards) = get_json(&t.daemon, "/v1/boards").await;
    assert_eq!(status, 200);
    let list = boards
        .as_array()
        .or_else(|| boards["boards"].as_array())
        .unwrap_or_else(|| panic!("a list: {boards}"));
    let shards = |name: &str| {
        list.iter()
            .find(|b| b["name"] == name)
            .unwrap_or_else(|| panic!("{name} listed: {boards}"))["shards"]
            .clone()
    };
    assert_eq!(shards("sh"), 4);
    assert_eq!(shards("pl"), 1);
    assert_eq!(shards("fans_7d"), 1);
    let (_, one) = get_json(&t.daemon, "/v1/boards/sh").await;
    assert_eq!(one["shards"], 4, "{one}");
    assert_eq!(one["scope"], Value::Null, "{one}");

    for path in [
        "/v1/boards/sh/top?scope=%230",
        "/v1/boards/sh/top?scope=r1",
        "/v1/boards/sh/members/ann?scope=%231",
        "/v1/boards/sh/members/ann/around?scope=%232",
        "/v1/boards/sh/members/ann?all_windows=true&scope=x",
    ] {
        let (status, body) = get_json(&t.daemon, path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert_eq!(
            body["error"], "board sh is not scoped: drop ?scope=",
            "{path}"
        );
    }
    let body = json!({"members": ["ann"], "scope": "#0"}).to_string();
    let (status, _, answer) = post_to(&t.daemon, "/v1/boards/sh/ranks", &body).await;
    assert_eq!(status, 400, "{answer}");
    assert_contains(&answer, "board sh is not scoped");
    let out = run_rollboard(&t.config, &["top", "sh", "--scope", "#0"]);
    assert_exit(&out, 2, "--scope");
    assert_contains(&stderr(&out), "board sh is not scoped: drop --scope");
}

#[tokio::test]
async fn a_page_past_rank_ten_thousand_is_a_client_mistake() {
    let t = twins().await;
    // Pages from offset 9 000 at the deepest are answered (empty past the board): the
    // largest page (1 000) from there ends at rank 10 000.
    for (offset, limit) in [(9000, 10), (9000, 1000), (8999, 1), (0, 1000)] {
        let (status, page) = get_json(
            &t.daemon,
            &format!("/v1/boards/sh/top?offset={offset}&limit={limit}"),
        )
        .await;
        assert_eq!(status, 200, "{offset} {limit}: {page}");
        assert_eq!(page["count"], PLAYERS.len(), "{page}");
    }
    for (offset, limit) in [("9001", "10"), ("9001", "1000"), ("10000", "1")] {
        let (status, body) = get_json(
            &t.daemon,
            &format!("/v1/boards/sh/top?offset={offset}&limit={limit}"),
        )
        .await;
        assert_eq!(status, 400, "{offset} {limit}: {body}");
        assert_eq!(
            body["error"],
            "offset must be an integer from 0 to 9000 on a sharded board: a page of it \
             reaches at most rank 10000",
            "{offset} {limit}"
        );
    }
    // The board of one instance has no such limit.
    let (status, page) = get_json(&t.daemon, "/v1/boards/pl/top?offset=50000&limit=1000").await;
    assert_eq!(status, 200, "{page}");

    // The command line: exit 2 (a usage error), before it connects.
    let out = run_rollboard(
        &t.config,
        &["top", "sh", "--offset", "9995", "--limit", "10"],
    );
    assert_exit(&out, 2, "too deep");
    assert_eq!(
        stderr(&out).trim_end(),
        "error: a page of a sharded board reaches at most rank 10000: --offset + --limit is 10005"
    );
    let out = run_rollboard(
        &t.config,
        &["top", "sh", "--offset", "18446744073709551615"],
    );
    assert_exit(&out, 2, "offset at u64::MAX");
    let out = run_rollboard(
        &t.config,
        &["top", "sh", "--offset", "9990", "--limit", "10", "--json"],
    );
    assert_exit(&out, 0, "the deepest page");
    assert_eq!(json(&stdout(&out))["entries"], json!([]));
    let out = run_rollboard(
        &t.config,
        &["top", "pl", "--offset", "9995", "--limit", "10"],
    );
    assert_exit(&out, 0, "the board of one instance");
}
