//! What an operator expects of the API: a known outage answers 503 at once, a misspelt query
//! parameter is named, "not on the board" has one shape over HTTP and the CLI, every answer
//! says how fresh it is (`as_of`), and logs name the Redis host without its password or
//! colour codes.

use std::time::{Duration, Instant};

use fred::prelude::*;
use serde_json::Value;

use crate::support::boards::{redis_now, test_boards};
use crate::support::cli::{rollboard, stderr, stdout};
use crate::support::config::{write_config, write_config_url};
use crate::support::daemon::Daemon;
use crate::support::http::{get, json, post, post_tip, post_to, with_one_tip};
use crate::support::redis::{free_port, RedisServer};
use crate::support::wait::{drained, wait_for};

/// With redis-server gone, the query routes and the intake answer 503 with `Retry-After`
/// at once, instead of holding the client for the 5 s Redis timeout.
#[tokio::test]
async fn queries_and_intake_answer_503_at_once_while_redis_is_down() {
    let (mut redis, _store, _dir, _config, daemon) = with_one_tip().await;
    let (status, _, _) = get(&daemon, "/v1/boards/rooms_7d/top").await;
    assert_eq!(status, 200);
    redis.kill();
    // The connections see the server go away (the kernel closes its sockets).
    let seen = wait_for(Duration::from_secs(10), || async {
        get(&daemon, "/v1/boards/rooms_7d/top").await.0 == 503
    })
    .await;
    assert!(seen, "no 503 after redis-server was killed");
    let event = r#"{"id":"t2","ts":1,"room":"r1","user":"u1","amount":"5"}"#;
    for round in 0..3 {
        for path in [
            "/v1/boards/rooms_7d/top?limit=5",
            "/v1/boards/rooms_7d/members/r1",
            "/v1/boards/rooms_7d/members/r1/around?radius=1",
            "/v1/boards/fans_7d/top?scope=r1",
        ] {
            let started = Instant::now();
            let (status, retry, body) = get(&daemon, path).await;
            let took = started.elapsed();
            assert!(
                took < Duration::from_millis(500),
                "round {round} {path}: answered {status} after {took:?}"
            );
            assert_eq!(status, 503, "{path}: {body}");
            assert_eq!(retry.as_deref(), Some("1"), "{path}");
            assert!(json(&body)["error"]
                .as_str()
                .is_some_and(|e| e.contains("not connected")));
        }
        let started = Instant::now();
        let (status, retry, body) = post(&daemon, event).await;
        let took = started.elapsed();
        assert_eq!(status, 503, "intake: {body}");
        assert_eq!(retry.as_deref(), Some("1"));
        assert!(
            took < Duration::from_millis(500),
            "intake answered after {took:?}"
        );
    }
    // The 503 names the host it cannot reach, never more of the URL.
    let (_, _, body) = get(&daemon, "/v1/boards/rooms_7d/top").await;
    let host = redis.url().trim_start_matches("redis://").to_string();
    assert!(body.contains(&host), "{body}");
    // Back: answers again.
    redis.restart();
    let back = wait_for(Duration::from_secs(30), || async {
        get(&daemon, "/v1/boards/rooms_7d/top").await.0 == 200
    })
    .await;
    assert!(back, "no answer once redis-server is back");
}

/// A query parameter that a route does not take is a 400 naming it, on every route.
#[tokio::test]
async fn a_misspelt_query_parameter_is_a_400_naming_it() {
    let (_redis, _store, _dir, _config, daemon) = with_one_tip().await;
    for (path, name) in [
        ("/v1/boards/rooms_7d/top?limt=5", "limt"),
        ("/v1/boards/rooms_7d/top?limit=5&ofset=1", "ofset"),
        ("/v1/boards/rooms_7d/members/r1?radius=2", "radius"),
        ("/v1/boards/rooms_7d/members/r1/around?limit=2", "limit"),
        ("/v1/boards/fans_7d/top?scop=r1", "scop"),
        ("/v1/boards?verbose=1", "verbose"),
        ("/healthz?x=1", "x"),
        ("/readyz?full", "full"),
        ("/metrics?debug=1", "debug"),
    ] {
        let (status, _, body) = get(&daemon, path).await;
        assert_eq!(status, 400, "{path}: {body}");
        let error = json(&body)["error"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            error.contains(&format!("unknown query parameter \"{name}\"")),
            "{path}: {error}"
        );
    }
    let (status, _, body) = post(&daemon, "[]").await;
    assert_eq!(status, 202, "{body}");
    let (status, _, body) = post_to(&daemon, "/v1/events?dry_run=1", "[]").await;
    assert_eq!(status, 400);
    assert!(body.contains("dry_run"));
    // The parameters a route takes still work.
    for path in [
        "/v1/boards/rooms_7d/top?limit=5&offset=0",
        "/v1/boards/rooms_7d/members/r1",
        "/v1/boards/rooms_7d/members/r1/around?radius=2",
        "/v1/boards/fans_7d/top?scope=r1&limit=1",
        "/v1/boards",
    ] {
        let (status, _, body) = get(&daemon, path).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
}

/// "Not on the board" is the same JSON over HTTP (404 body, `rank` and `around`) and from
/// `rollboard rank --json` / `around --json` (exit 3).
#[tokio::test]
async fn not_on_the_board_has_one_shape_over_http_and_the_cli() {
    let (_redis, _store, _dir, config, daemon) = with_one_tip().await;
    let (status, _, rank_body) = get(&daemon, "/v1/boards/rooms_7d/members/nobody").await;
    assert_eq!(status, 404);
    let (status, _, around_body) = get(&daemon, "/v1/boards/rooms_7d/members/nobody/around").await;
    assert_eq!(status, 404);
    let cli_json = |command: &str| {
        let out = rollboard(
            Some(&config),
            &[command, "rooms_7d", "nobody", "--json"],
            &[],
        );
        assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
        json(&stdout(&out))
    };
    let cli_rank = cli_json("rank");
    let cli_around = cli_json("around");
    let http_rank = json(&rank_body);
    assert_eq!(http_rank["board"], "rooms_7d");
    assert_eq!(http_rank["scope"], Value::Null);
    assert_eq!(http_rank["member"], "nobody");
    assert_eq!(http_rank["count"], 1);
    assert_eq!(http_rank["scale"], 0);
    for field in ["rank", "competition_rank", "total", "last_ts"] {
        assert_eq!(http_rank[field], Value::Null, "{field}: {http_rank}");
    }
    assert!(http_rank["window_from"].is_i64() && http_rank["window_to"].is_i64());
    assert!(http_rank["as_of"].is_i64(), "{http_rank}");
    assert_eq!(
        http_rank["error"], "\"nobody\" is not on board rooms_7d",
        "{http_rank}"
    );
    let fields = |v: &Value| -> Vec<String> {
        let mut names: Vec<String> = v.as_object().expect("object").keys().cloned().collect();
        names.sort();
        names
    };
    // The same fields and values everywhere (nothing changed the board in between).
    for other in [&json(&around_body), &cli_rank, &cli_around] {
        assert_eq!(fields(other), fields(&http_rank), "{other}");
        assert_eq!(other, &http_rank);
    }
    // A scoped board names the scope (once its resummarize run has summed the tip).
    let path = "/v1/boards/fans_7d/members/u9?scope=r1";
    let summed = wait_for(Duration::from_secs(10), || async {
        json(&get(&daemon, path).await.2)["count"] == 1
    })
    .await;
    assert!(summed, "fans_7d never ranked the tip");
    let (status, _, body) = get(&daemon, path).await;
    assert_eq!(status, 404);
    let body = json(&body);
    assert_eq!(body["scope"], "r1");
    assert_eq!(
        body["error"],
        "\"u9\" is not on board fans_7d (scope \"r1\")"
    );
}

/// `as_of` is the time the ranking last changed: on an incremental board the last apply
/// (or roll), on a resummarize board the last run that summed it; the same over HTTP and
/// in the CLI's `--json`.
#[tokio::test]
async fn every_query_answer_carries_as_of() {
    let (_redis, store, _dir, config, daemon) = with_one_tip().await;
    let boards = test_boards();
    let rooms = boards.iter().find(|b| b.name == "rooms_7d").expect("rooms");
    let fans = boards.iter().find(|b| b.name == "fans_7d").expect("fans");
    let meta = |key: String, field: &'static str| {
        let client = store.client().clone();
        async move {
            let v: Option<String> = client.hget(key, field).await.expect("HGET");
            v.and_then(|v| v.parse::<i64>().ok())
        }
    };
    let rooms_meta = store.instance(&rooms.widest(), None).meta();
    let fans_meta = store.instance(&fans.widest(), Some("r1")).meta();
    let changed = meta(rooms_meta.clone(), "changed_ms")
        .await
        .expect("an apply records changed_ms");
    // The roll runs every other second: the answer is the later of the apply and the roll.
    let rolled = meta(rooms_meta.clone(), "last_roll").await;
    let (_, _, body) = get(&daemon, "/v1/boards/rooms_7d/top").await;
    let top = json(&body);
    let as_of = top["as_of"].as_i64().expect("as_of on top");
    assert!(as_of >= changed && Some(as_of) >= rolled, "{top}");
    assert!(as_of <= redis_now(&store).await);
    for path in [
        "/v1/boards/rooms_7d/members/r1",
        "/v1/boards/rooms_7d/members/r1/around",
    ] {
        let (status, _, body) = get(&daemon, path).await;
        assert_eq!(status, 200, "{body}");
        assert!(
            json(&body)["as_of"].as_i64() >= Some(as_of),
            "{path}: {body}"
        );
    }
    // A new apply moves it: not back from the answer before it, and to about Redis's time
    // of the apply. The daemon reads Redis's clock as measured halfway through a round
    // trip, so on a loaded host it may run behind `TIME` by up to half a round trip: a
    // second of slack.
    let before = redis_now(&store).await;
    let (status, _, body) = post_tip(&daemon, "t2", before, "r2", "u2", "7").await;
    assert_eq!(status, 202, "{body}");
    assert!(drained(&store).await);
    let (_, _, body) = get(&daemon, "/v1/boards/rooms_7d/top").await;
    let moved = json(&body)["as_of"].as_i64().expect("as_of");
    let applied = meta(rooms_meta.clone(), "changed_ms")
        .await
        .expect("changed_ms");
    assert!(
        applied >= as_of && applied >= before - 1_000,
        "changed_ms {applied} not moved from {as_of} to the apply at {before}"
    );
    assert!(
        moved >= applied,
        "as_of {moved} before the apply at {applied}"
    );
    // Resummarize: the time of the run whose sum is in place.
    let summed = wait_for(Duration::from_secs(10), || {
        let fans_meta = fans_meta.clone();
        let meta = &meta;
        async move { meta(fans_meta, "summed_ms").await.is_some() }
    })
    .await;
    assert!(summed, "no resummarize run recorded summed_ms");
    let (_, _, body) = get(&daemon, "/v1/boards/fans_7d/top?scope=r1").await;
    let fans_top = json(&body);
    let fans_as_of = fans_top["as_of"].as_i64().expect("as_of on fans");
    let now_summed = meta(fans_meta.clone(), "summed_ms")
        .await
        .expect("summed_ms");
    assert!(
        fans_as_of <= now_summed && fans_as_of > now_summed - 5_000,
        "{fans_top} (summed_ms {now_summed})"
    );
    // The CLI answers the same field.
    let out = rollboard(Some(&config), &["top", "rooms_7d", "--json"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(json(&stdout(&out))["as_of"].as_i64() >= Some(moved));
    let out = rollboard(Some(&config), &["rank", "rooms_7d", "r2", "--json"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(json(&stdout(&out))["as_of"].as_i64() >= Some(moved));
    let out = rollboard(Some(&config), &["top", "rooms_7d"], &[]);
    assert!(stdout(&out).contains(", as of "), "{}", stdout(&out));
    // A scope nothing was ever written to has no time.
    let (_, _, body) = get(&daemon, "/v1/boards/fans_7d/top?scope=never").await;
    assert_eq!(json(&body)["as_of"], Value::Null, "{body}");
}

/// The first line of `logs` holding `text`; fails the test with `what` when none does.
fn log_line<'a>(logs: &'a str, text: &str, what: &str) -> &'a str {
    logs.lines().find(|l| l.contains(text)).expect(what)
}

/// The daemon's logs name the Redis host and port (never the password) at start and while
/// it cannot connect, and carry no colour codes when they go to a file.
#[tokio::test]
async fn logs_name_the_redis_host_without_the_password_or_colour() {
    let dir = tempfile::tempdir().expect("dir");
    let dead = free_port();
    let port = free_port();
    let url = format!("redis://rollboard:s3cret-pw@127.0.0.1:{dead}");
    let config = write_config_url(dir.path(), &url, port, "logs", "");
    let daemon = Daemon::spawn(&config, port);
    daemon.wait_log("cannot connect to redis yet").await;
    let logs = daemon.logs();
    let host = format!("redis=127.0.0.1:{dead}");
    let starting = log_line(&logs, "rollboard starting", "a start line");
    assert!(starting.contains(&host), "{starting}");
    let retry = log_line(&logs, "cannot connect to redis yet", "a connection error");
    assert!(retry.contains(&host), "{retry}");
    assert!(
        !logs.contains("s3cret-pw"),
        "the password is logged:\n{logs}"
    );
    assert!(
        !logs.contains('\u{1b}'),
        "colour codes in a log file:\n{logs}"
    );
    daemon.kill().await;

    // Once running, losing the connection is logged with the host too.
    let mut redis = RedisServer::start();
    let port = free_port();
    let config = write_config(dir.path(), &redis, port, "logs2", "");
    let daemon = Daemon::start(&config, port).await;
    redis.kill();
    daemon.wait_log("redis connection error").await;
    let host = format!("redis={}", redis.url().trim_start_matches("redis://"));
    let logs = daemon.logs();
    let line = log_line(&logs, "redis connection error", "logged");
    assert!(line.contains(&host), "{line}");
    assert!(
        !logs.contains('\u{1b}'),
        "colour codes in a log file:\n{logs}"
    );
}
