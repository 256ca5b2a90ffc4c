//! The board watermark, the roll guard, `send` and the HTTP edges: what an
//! operator typo, a racing roller or a hostile client can do.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use fred::prelude::*;
use rollboard::board::Mode;
use rollboard::roll;
use rollboard::store::Outcome;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::support::{board, drained, ev, free_port, wait_for, write_config, Daemon, RedisServer};

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;
const T0: i64 = 1_763_700_000_000;

fn rollboard(config: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rollboard"))
        .env_remove("ROLLBOARD_CONFIG")
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .expect("run rollboard")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `rollboard send` (stdin when `file` is None) and returns (exit code, stdout, stderr).
fn send(config: &std::path::Path, file: Option<&std::path::Path>, input: &[u8]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rollboard"));
    cmd.env_remove("ROLLBOARD_CONFIG")
        .arg("--config")
        .arg(config)
        .arg("send");
    if let Some(file) = file {
        cmd.arg(file);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn send");
    let mut stdin = child.stdin.take().expect("stdin");
    let input = input.to_vec();
    // The child may stop reading at an over-long line; a broken pipe is fine then.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().expect("send");
    let _ = writer.join();
    out
}

async fn xlen(redis: &RedisServer, key: &str) -> i64 {
    let store = redis.store("rb").await;
    store.client().xlen(key).await.expect("xlen")
}

async fn daemon_with(extra: &str) -> (RedisServer, tempfile::TempDir, Daemon, std::path::PathBuf) {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let config = write_config(dir.path(), &redis, port, "a", extra);
    let daemon = Daemon::start(&config, port).await;
    (redis, dir, daemon, config)
}

fn addr(daemon: &Daemon) -> String {
    daemon.base.trim_start_matches("http://").to_string()
}

/// Writes `request` on a fresh connection and reads until the server closes it or
/// `limit` passes; returns what was read.
async fn raw(daemon: &Daemon, request: &[u8], limit: Duration) -> String {
    let mut conn = TcpStream::connect(addr(daemon)).await.expect("connect");
    conn.write_all(request).await.expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(limit, conn.read_to_end(&mut out)).await;
    text(&out)
}

/// A roll ahead of the clock on a board that has no scope yet: a scope first seen after
/// it is judged against that roll, in both modes, and an unscoped board likewise. Then a
/// roll that races an apply registering a brand-new scope: whichever wins, nothing of a
/// slice that the roll killed stays ranked.
#[tokio::test]
async fn a_scope_first_seen_after_or_during_a_roll_ahead_follows_it() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let cancel = CancellationToken::new();
    for mode in [Mode::Incremental, Mode::Resummarize] {
        let mut b = board(&format!("fresh_{}", mode.as_str()), HOUR, 3);
        b.scope = Some("room".into());
        b.mode = mode;
        let mut flat = board(&format!("flat_{}", mode.as_str()), HOUR, 3);
        flat.mode = mode;
        let s0 = b.slice_of(T0);
        let clock = s0 * HOUR + 1;
        let ahead = (s0 + 10) * HOUR + 5;
        for x in [&b, &flat] {
            let r = roll::roll_board(&store, x, ahead, 10, &cancel)
                .await
                .expect("roll");
            assert_eq!(r.expired_through, Some(s0 + 7), "{x}");
            assert_eq!(
                (r.window_from, r.window_to),
                (Some((s0 + 8) * HOUR), Some((s0 + 11) * HOUR)),
                "{x}"
            );
        }
        assert!(store.scopes(&b).await.unwrap().is_empty());
        for (x, scope) in [(&b, Some("never")), (&flat, None)] {
            // At the wall clock, slice s0 would be live; after the roll it is not.
            let out = store
                .apply(x, scope, &[ev("a", clock, "u", 1)], clock)
                .await
                .unwrap();
            assert_eq!(out, [Outcome::Late], "{x}: judged against the roll ahead");
            let out = store
                .apply(x, scope, &[ev("b", (s0 + 8) * HOUR, "u", 2)], clock)
                .await
                .unwrap();
            assert_eq!(out, [Outcome::Applied], "{x}: first live slice");
            let page = store.top(x, scope, 0, 10, clock).await.unwrap();
            assert_eq!(
                (page.window_from, page.window_to),
                ((s0 + 8) * HOUR, (s0 + 11) * HOUR),
                "{x}: the window of the roll ahead, at the wall clock"
            );
        }
    }

    // The race: each round a fresh board, one apply of a new scope with an event the roll
    // makes dead, and the roll itself, started together.
    for round in 0..40 {
        let mut b = board(&format!("race{round}"), HOUR, 3);
        b.scope = Some("room".into());
        if (round / 2) % 2 == 1 {
            b.mode = Mode::Resummarize;
        }
        let s0 = b.slice_of(T0);
        let clock = s0 * HOUR + 1;
        let ahead = (s0 + 10) * HOUR;
        let events = [ev("x", clock, "u", 5), ev("y", clock + 1, "w", 7)];
        // Vary who goes first and by how much, so every interleaving of the apply's
        // registration and floor read with the roll's floor raise and scope listing occurs.
        let head_start = round % 8;
        let apply = async {
            if round % 2 == 0 {
                for _ in 0..head_start {
                    tokio::task::yield_now().await;
                }
            }
            store.apply(&b, Some("new"), &events, clock).await
        };
        let rolling = async {
            if round % 2 == 1 {
                for _ in 0..head_start {
                    tokio::task::yield_now().await;
                }
            }
            roll::roll_board(&store, &b, ahead, 10, &cancel).await
        };
        let (applied, rolled) = tokio::join!(apply, rolling);
        let applied = applied.expect("apply");
        let rolled = rolled.expect("roll");
        assert_eq!(rolled.instances_failed, 0, "{:?}", rolled.first_error);
        // Whoever won, the board is as of the roll: nothing of slice s0 is ranked, the
        // window is the roll's, and a later apply of the same slice is late.
        let page = store.top(&b, Some("new"), 0, 10, clock).await.unwrap();
        assert_eq!(
            (page.count, page.entries.len()),
            (0, 0),
            "round {round} ({applied:?}): a dead slice stayed ranked: {page:?}"
        );
        assert_eq!(page.window_from, (s0 + 8) * HOUR, "round {round}");
        let again = store
            .apply(&b, Some("new"), &[ev("z", clock, "v", 1)], clock)
            .await
            .unwrap();
        assert_eq!(again, [Outcome::Late], "round {round}");
        // A second roll at the same time leaves no slice behind in the instance.
        roll::roll_board(&store, &b, ahead, 10, &cancel)
            .await
            .expect("roll");
        let live = store
            .live_slices(&b, Some("new"), i64::MIN)
            .await
            .expect("slices");
        assert!(live.is_empty(), "round {round}: slices left {live:?}");
    }
}

/// The daemon after a forced roll a week ahead: events of the wall clock are late for a
/// scope it never saw and for the unscoped board (dead-lettered `late`, counted per
/// board), queries show the window of the forced roll, the window gauges follow it, and
/// a later roll at the clock takes nothing back.
#[tokio::test]
async fn after_a_forced_roll_ahead_the_daemon_judges_and_reports_by_it() {
    let (redis, _dir, daemon, config) = daemon_with("").await;
    let store = redis.store("rb").await;
    let now = rollboard::cli::now_ms();
    let ahead = now + 8 * DAY;
    let out = rollboard(&config, &["roll", "--at", &ahead.to_string(), "--force"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let six = 6 * HOUR;
    let rooms_from = (ahead / six + 1) * six - 7 * DAY;
    let fans_from = (ahead / HOUR + 1) * HOUR - 7 * DAY;

    let r = reqwest::Client::new()
        .post(format!("{}/v1/events", daemon.base))
        .json(&serde_json::json!({"room": "brand_new", "user": "u1", "amount": 3}))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status().as_u16(), 202);
    assert!(drained(&store).await, "not consumed");
    let dead: Vec<(String, std::collections::HashMap<String, String>)> = store
        .client()
        .xrange("rb:events:dead", "-", "+", None)
        .await
        .expect("xrange");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].1.get("reason").map(String::as_str), Some("late"));
    for b in ["rooms_7d", "fans_7d"] {
        assert_eq!(
            daemon
                .metric(
                    "rollboard_events_skipped_total",
                    &[("board", b), ("reason", "late")]
                )
                .await,
            1.0,
            "{b}"
        );
    }
    for (path, from) in [
        ("/v1/boards/rooms_7d/top", rooms_from),
        ("/v1/boards/fans_7d/top?scope=brand_new", fans_from),
        ("/v1/boards/fans_7d/top?scope=never_seen", fans_from),
    ] {
        let (status, body) = daemon.get(path).await;
        assert_eq!(status, 200, "{path}: {body}");
        let page: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert_eq!(page["window_from"].as_i64(), Some(from), "{path}: {body}");
        assert_eq!(page["window_to"].as_i64(), Some(from + 7 * DAY), "{path}");
        assert_eq!(page["count"], 0, "{path}: {body}");
    }
    // The daemon's own rolls (every 2 s, at the clock) report the forced window.
    for (b, from) in [("rooms_7d", rooms_from), ("fans_7d", fans_from)] {
        let want = from as f64 / 1000.0;
        let moved = wait_for(Duration::from_secs(8), || async {
            daemon
                .metric("rollboard_window_start_timestamp_seconds", &[("board", b)])
                .await
                == want
        })
        .await;
        assert!(
            moved,
            "{b}: window start gauge {} != {want}",
            daemon
                .metric("rollboard_window_start_timestamp_seconds", &[("board", b)])
                .await
        );
        assert_eq!(
            daemon
                .metric("rollboard_window_end_timestamp_seconds", &[("board", b)])
                .await,
            want + (7 * DAY) as f64 / 1000.0,
            "{b}"
        );
    }
    // A roll at the clock takes nothing back.
    let out = rollboard(&config, &["roll"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (_, body) = daemon.get("/v1/boards/rooms_7d/top").await;
    let page: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(page["window_from"].as_i64(), Some(rooms_from), "{body}");
}

/// `roll --at` ahead of Redis's clock is refused (exit 2) in both spellings, touching
/// nothing; a time before it is accepted in both; `--force` alone and a malformed time are
/// usage errors.
#[tokio::test]
async fn roll_ahead_of_the_clock_is_refused_in_both_spellings() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("dir");
    let config = write_config(dir.path(), &redis, 1, "a", "");
    let with_max_future = std::fs::read_to_string(&config)
        .expect("config")
        .replace("[ingest]\n", "[ingest]\nmax_future = \"1m\"\n");
    std::fs::write(&config, with_max_future).expect("rewrite");
    let config_path = config;
    let rfc = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .expect("time")
            .with_timezone(&chrono::FixedOffset::east_opt(14 * 3600).expect("offset"))
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, false)
    };
    let now = rollboard::cli::now_ms();
    for at in [
        (now + 60_000 + 3_000).to_string(),
        rfc(now + 60_000 + 3_000),
    ] {
        let out = rollboard(&config_path, &["roll", "--at", &at]);
        assert_eq!(out.status.code(), Some(2), "{at}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("--force"),
            "{}",
            text(&out.stderr)
        );
    }
    assert_eq!(
        redis.cli(&["DBSIZE"]).trim(),
        "0",
        "a refused roll wrote something"
    );
    for args in [
        vec!["roll", "--force"],
        vec!["roll", "--at", "tomorrow"],
        vec!["roll", "--at", "-1"],
        vec!["roll", "--at", "9007199254740992"],
    ] {
        let out = rollboard(&config_path, &args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    let now = rollboard::cli::now_ms();
    for at in [(now - 60_000).to_string(), rfc(now - 60_000)] {
        let out = rollboard(&config_path, &["roll", "--at", &at]);
        assert_eq!(out.status.code(), Some(0), "{at}: {}", text(&out.stderr));
    }
    // The board's window is the one of that time (6 h slices for rooms_7d).
    let six = 6 * HOUR;
    let w: i64 = redis
        .cli(&["HGET", "rb:board:rooms_7d:window", "expired_through"])
        .trim()
        .parse()
        .expect("watermark");
    assert_eq!(w, (now - 60_000) / six - 28);
}

/// `send` edges: a BOM on line 1 only, CRLF, an invalid line after the first batch,
/// empty input, /dev/null, a line of exactly the limit (LF and CRLF) and one byte over.
#[tokio::test]
async fn send_edges_all_or_nothing() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("dir");
    let config = write_config(dir.path(), &redis, 1, "a", "");
    let good = |i: usize| format!("{{\"room\":\"r{}\",\"amount\":{}}}", i % 7, 1 + i % 3);

    // Empty input and /dev/null: nothing to do, exit 0.
    for (file, input) in [
        (None, &b""[..]),
        (Some(std::path::Path::new("/dev/null")), b""),
    ] {
        let out = send(&config, file, input);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{file:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stdout).contains("appended 0"),
            "{}",
            text(&out.stdout)
        );
    }
    // Whitespace-only lines (with CR) are blank lines, not errors.
    let out = send(&config, None, b"\r\n  \r\n\t\n");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    // An invalid line 1001, after what would be the first batch: nothing appended.
    let mut input = String::new();
    for i in 0..1000 {
        input.push_str(&good(i));
        input.push('\n');
    }
    input.push_str("{\"room\":\"r1\",\"amount\":\"1e3\"}\n");
    input.push_str(&good(1));
    input.push('\n');
    let path = dir.path().join("1001.jsonl");
    std::fs::write(&path, &input).expect("write");
    for file in [None, Some(path.as_path())] {
        let out = send(&config, file, input.as_bytes());
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        let err = text(&out.stderr);
        assert!(err.contains("line 1001:"), "{err}");
        assert!(
            !err.contains("line 1000:") && !err.contains("line 1002:"),
            "{err}"
        );
        assert_eq!(xlen(&redis, "rb:events").await, 0, "{file:?}");
    }

    // A BOM on line 1 is skipped; one on line 2 is not (it is not JSON).
    let bom_two = format!("\u{feff}{}\r\n\u{feff}{}\r\n", good(1), good(2));
    let out = send(&config, None, bom_two.as_bytes());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("line 2:"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        !text(&out.stderr).contains("line 1:"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(xlen(&redis, "rb:events").await, 0);

    // Over 1001 lines, CRLF, BOM first: 2001 appended, each with its own id.
    let mut input = String::from("\u{feff}");
    for i in 0..2001 {
        input.push_str(&good(i));
        input.push_str("\r\n");
    }
    let out = send(&config, None, input.as_bytes());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(xlen(&redis, "rb:events").await, 2001);
    redis.cli(&["DEL", "rb:events"]);

    // A line of exactly MAX_LINE_BYTES is accepted, whatever its line break; one byte
    // more is refused and named.
    let limit = rollboard::cli::MAX_LINE_BYTES;
    let line = |len: usize| {
        let head = "{\"room\":\"big\",\"amount\":1,\"pad\":\"";
        let tail = "\"}";
        format!("{head}{}{tail}", "x".repeat(len - head.len() - tail.len()))
    };
    let exact = line(limit);
    assert_eq!(exact.len(), limit);
    for ending in ["\n", ""] {
        let input = format!("{}\n{exact}{ending}", good(0));
        let out = send(&config, None, input.as_bytes());
        assert_eq!(out.status.code(), Some(0), "ending {ending:?}");
    }
    assert_eq!(xlen(&redis, "rb:events").await, 4);
    redis.cli(&["DEL", "rb:events"]);
    let over = format!("{}\n{}\n{}\n", good(0), line(limit + 1), good(1));
    let out = send(&config, None, over.as_bytes());
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("line 2: longer than"),
        "{}",
        &err[..err.len().min(300)]
    );
    assert!(err.len() < 1_000, "the line is not echoed");
    assert_eq!(xlen(&redis, "rb:events").await, 0);

    // BREAK (fixed with this test): a line of exactly 1 MiB ended by CRLF was refused as
    // "longer than" the limit while the same line ended by LF was accepted: next_line()
    // (src/cli.rs) read at most MAX_LINE_BYTES + 1 bytes, so the CR filled the budget, the
    // LF was never seen and the CR counted as part of the line. It now reads + 2.
    let input = format!("{}\r\n{exact}\r\n", good(0));
    let out = send(&config, None, input.as_bytes());
    assert_eq!(
        out.status.code(),
        Some(0),
        "a CRLF line of exactly the limit: {}",
        text(&out.stderr).chars().take(300).collect::<String>()
    );
    assert_eq!(xlen(&redis, "rb:events").await, 2);
}

/// HTTP on the wire: pipelining, HEAD and OPTIONS, NUL and long paths, parameter edges,
/// content types, the event count cap, numbers as written, and error bodies that never
/// echo what the client sent at length.
#[tokio::test]
async fn http_wire_and_parameter_edges() {
    let (redis, _dir, daemon, _config) = daemon_with("request_timeout = \"30s\"\n").await;
    let store = redis.store("rb").await;
    let client = reqwest::Client::new();

    // Three pipelined requests on one connection: three answers, in order.
    let answer = raw(
        &daemon,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n\
          GET /v1/boards/nope/top HTTP/1.1\r\nHost: x\r\n\r\n\
          GET /v1/boards HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    let statuses: Vec<&str> = answer
        .match_indices("HTTP/1.1 ")
        .map(|(i, _)| &answer[i + 9..i + 12])
        .collect();
    assert_eq!(statuses, ["200", "404", "200"], "{answer}");
    assert!(answer.contains("rooms_7d"), "{answer}");

    // HEAD answers like GET without a body; OPTIONS and HEAD of a POST route are 405 JSON.
    let head = raw(
        &daemon,
        b"HEAD /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.ends_with("\r\n\r\n"), "HEAD has no body: {head:?}");
    for method in [reqwest::Method::OPTIONS, reqwest::Method::PUT] {
        let r = client
            .request(method.clone(), format!("{}/v1/events", daemon.base))
            .send()
            .await
            .expect("request");
        assert_eq!(r.status().as_u16(), 405, "{method}");
        let body: serde_json::Value = r.json().await.expect("json body");
        assert!(body["error"].is_string(), "{method}: {body}");
    }

    // NUL in a path segment: 400 for a member, 404 for a board; never a 500.
    for (path, status) in [
        ("/v1/boards/rooms_7d/members/a%00b", 400),
        ("/v1/boards/rooms_7d/members/%00/around", 400),
        ("/v1/boards/rooms%00/top", 404),
        ("/v1/boards/fans_7d/top?scope=a%00", 400),
        ("/v1/boards/fans_7d/top?scope=", 400),
    ] {
        let (got, body) = daemon.get(path).await;
        assert_eq!(got, status, "{path}: {body}");
        assert!(body.starts_with("{\"error\":"), "{path}: {body}");
    }

    // Parameter edges.
    for (query, status) in [
        ("limit=0", 400),
        ("limit=1001", 400),
        ("limit=-1", 400),
        ("limit=abc", 400),
        ("limit=", 400),
        ("limit=1000", 200),
        ("limit=1", 200),
        ("offset=-1", 400),
        ("offset=18446744073709551615", 200),
        ("offset=18446744073709551616", 400),
        ("offset=9223372036854775808&limit=1000", 200),
    ] {
        let (got, body) = daemon
            .get(&format!("/v1/boards/rooms_7d/top?{query}"))
            .await;
        assert_eq!(got, status, "{query}: {body}");
        if status == 200 {
            let page: serde_json::Value = serde_json::from_str(&body).expect("json");
            assert_eq!(page["entries"], serde_json::json!([]), "{query}");
        }
    }
    for (query, status) in [("radius=101", 400), ("radius=0", 404), ("radius=100", 404)] {
        let (got, body) = daemon
            .get(&format!("/v1/boards/rooms_7d/members/m/around?{query}"))
            .await;
        assert_eq!(got, status, "{query}: {body}");
    }
    // A long query string (under hyper's URI limit) is parsed; an unknown parameter is a
    // 400 naming it, its value never echoed and its name cut short.
    let long = "q".repeat(30_000);
    let (got, body) = daemon
        .get(&format!("/v1/boards/rooms_7d/top?x={long}&limit=2"))
        .await;
    assert_eq!(got, 400, "{}", &body[..body.len().min(200)]);
    assert!(body.contains(r#"unknown query parameter \"x\""#), "{body}");
    let (got, body) = daemon
        .get(&format!("/v1/boards/rooms_7d/top?{long}=1&limit=2"))
        .await;
    assert_eq!(got, 400, "{}", &body[..body.len().min(200)]);
    assert!(body.len() < 400, "{} bytes", body.len());
    let (got, body) = daemon
        .get(&format!("/v1/boards/rooms_7d/top?offset={long}&limit=2"))
        .await;
    assert_eq!(got, 400, "{}", &body[..body.len().min(200)]);

    // Content types: a charset parameter and +json suffix are JSON; others are 415.
    let post = |body: String, content_type: &'static str| {
        client
            .post(format!("{}/v1/events", daemon.base))
            .header("content-type", content_type)
            .body(body)
            .send()
    };
    for (content_type, status) in [
        ("application/json; charset=utf-8", 202),
        ("application/json;charset=UTF-8", 202),
        ("Application/JSON", 202),
        ("application/vnd.tips+json", 202),
        ("text/json", 415),
        ("application/jsonx", 415),
    ] {
        let r = post(r#"{"room":"ct","amount":1}"#.to_string(), content_type)
            .await
            .expect("post");
        assert_eq!(r.status().as_u16(), status, "{content_type}");
    }
    assert_eq!(xlen(&redis, "rb:events").await, 4);

    // 10,001 events are refused as a whole; 10,000 are accepted.
    let many = |n: usize| {
        let items: Vec<String> = (0..n)
            .map(|i| format!("{{\"room\":\"m{}\",\"amount\":1}}", i % 50))
            .collect();
        format!("[{}]", items.join(","))
    };
    let r = post(many(10_001), "application/json").await.expect("post");
    assert_eq!(r.status().as_u16(), 400);
    let body = r.text().await.expect("body");
    assert!(body.contains("10000"), "{body}");
    assert_eq!(xlen(&redis, "rb:events").await, 4);
    let r = post(many(10_000), "application/json").await.expect("post");
    assert_eq!(r.status().as_u16(), 202);
    assert_eq!(xlen(&redis, "rb:events").await, 10_004);

    // Numbers exactly as written: 1.50 at scale 2 is 150 minor units; 1e3, 1.500 and 0.00
    // are refused; a member given as a number keeps its spelling.
    for (body, status) in [
        (r#"{"user":"num","value":1e3}"#, 400),
        (r#"{"user":"num","value":1E2}"#, 400),
        (r#"{"user":"num","value":1.500}"#, 400),
        (r#"{"user":"num","value":0.00}"#, 400),
        (r#"{"user":"num","value":-0}"#, 400),
        (r#"{"user":"num","value":1.50}"#, 202),
        (r#"{"user":"num","value":-0.25}"#, 202),
        (r#"{"user":1.10,"value":2}"#, 202),
        (r#"{"room":"dup","amount":1,"am\u006funt":2}"#, 400),
    ] {
        let r = post(body.to_string(), "application/json")
            .await
            .expect("post");
        assert_eq!(r.status().as_u16(), status, "{body}");
    }
    assert!(drained(&store).await, "not consumed");
    let (_, body) = daemon.get("/v1/boards/tips_24h/top?limit=10").await;
    let page: serde_json::Value = serde_json::from_str(&body).expect("json");
    let totals: Vec<(String, i64)> = page["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| {
            (
                e["member"].as_str().unwrap_or_default().to_string(),
                e["total"].as_i64().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        totals,
        [("1.10".to_string(), 200), ("num".to_string(), 125)],
        "{body}"
    );
}

/// Error bodies never echo client input at length: not a long board name in the path,
/// not a long field value or field name in an event.
#[tokio::test]
async fn error_answers_do_not_echo_long_input() {
    let (redis, _dir, daemon, _config) = daemon_with("").await;
    let client = reqwest::Client::new();
    let long_board = "b".repeat(50_000);
    let (status, body) = daemon.get(&format!("/v1/boards/{long_board}/top")).await;
    assert_eq!(status, 404);
    let board_echo = body.len();

    let post = |body: String| {
        client
            .post(format!("{}/v1/events", daemon.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let long_value = "x".repeat(100_000);
    let mut echoes = Vec::new();
    for (what, event) in [
        (
            "amount",
            format!(r#"{{"room":"r","amount":"{long_value}"}}"#),
        ),
        (
            "huge amount",
            format!(r#"{{"room":"r","amount":"{}"}}"#, "9".repeat(100_000)),
        ),
        (
            "ts",
            format!(r#"{{"room":"r","amount":1,"ts":"{long_value}"}}"#),
        ),
        (
            "field name",
            format!(r#"{{"{long_value}":null,"room":"r","amount":1}}"#),
        ),
    ] {
        let r = post(event).await.expect("post");
        assert_eq!(r.status().as_u16(), 400, "{what}");
        echoes.push((what, r.text().await.expect("body").len()));
    }
    assert_eq!(xlen(&redis, "rb:events").await, 0);
    // BREAK (fixed with this test: event::shown cuts quoted input at 64 characters):
    // `unknown board {name:?}` (src/http.rs board()) echoed the whole path segment, and
    // parse_amount/parse_ts (src/event.rs) and fields_from_json the whole value or field
    // name in `detail`: a 100 kB field came back as 100 kB of error text.
    echoes.push(("board name (404)", board_echo));
    let long: Vec<_> = echoes.iter().filter(|(_, len)| *len >= 2_000).collect();
    assert!(
        long.is_empty(),
        "100 kB (50 kB for the board) of input echoed: {long:?}"
    );
}

/// A chunked upload that never ends answers 408 as JSON, and a malformed chunk 400 as
/// JSON.
#[tokio::test]
async fn a_never_ending_chunked_upload_answers_408_as_json() {
    let (_redis, _dir, daemon, _config) =
        daemon_with("request_timeout = \"2s\"\nheader_timeout = \"2s\"\n").await;
    let started = Instant::now();
    let answer = raw(
        &daemon,
        b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Transfer-Encoding: chunked\r\n\r\n5\r\n[{\"ro\r\n",
        Duration::from_secs(8),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("{\"error\":"), "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );

    // Every answer rollboard writes itself is JSON, including one to a bad chunk size.
    let answer = raw(
        &daemon,
        b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Transfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("{\"error\":"), "{answer}");
}

/// SIGTERM while clients hold connections in every state (half a head, a head and half a
/// chunked body, idle keep-alive after an answer): exit 0 within a few seconds.
#[tokio::test]
async fn sigterm_with_slow_clients_is_prompt() {
    let (_redis, _dir, daemon, _config) = daemon_with("").await;
    let mut half_head = TcpStream::connect(addr(&daemon)).await.expect("connect");
    half_head
        .write_all(b"GET /v1/boards HTTP/1.1\r\nHo")
        .await
        .expect("write");
    let mut half_body = TcpStream::connect(addr(&daemon)).await.expect("connect");
    half_body
        .write_all(
            b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Transfer-Encoding: chunked\r\n\r\n3\r\n[{\"\r\n",
        )
        .await
        .expect("write");
    let mut idle = TcpStream::connect(addr(&daemon)).await.expect("connect");
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut buf = [0u8; 512];
    let n = idle.read(&mut buf).await.expect("read");
    assert!(text(&buf[..n]).starts_with("HTTP/1.1 200"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let status = daemon.terminate().await;
    assert!(status.success(), "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        started.elapsed()
    );
}

/// Every family of the contract, and the new ones, is in the first scrape with help text,
/// with a sample per configured board where it is labelled by board.
#[tokio::test]
async fn every_metric_family_is_there_at_start_up() {
    let (_redis, _dir, daemon, _config) = daemon_with("").await;
    let (status, body) = daemon.get("/metrics").await;
    assert_eq!(status, 200);
    for family in [
        "rollboard_events_applied_total",
        "rollboard_events_skipped_total",
        "rollboard_events_dead_lettered_total",
        "rollboard_batch_events",
        "rollboard_apply_duration_seconds",
        "rollboard_roll_duration_seconds",
        "rollboard_slices_expired_total",
        "rollboard_members_removed_total",
        "rollboard_last_roll_timestamp_seconds",
        "rollboard_consumer_pending",
        "rollboard_consumer_lag",
        "rollboard_redis_errors_total",
        "rollboard_redis_reconnects_total",
        "rollboard_roll_failures_total",
        "rollboard_window_start_timestamp_seconds",
        "rollboard_window_end_timestamp_seconds",
    ] {
        assert!(
            body.contains(&format!("# HELP {family} ")),
            "{family} has no help text at start-up"
        );
    }
    for b in ["rooms_7d", "fans_7d", "tips_24h"] {
        for family in [
            "rollboard_roll_failures_total",
            "rollboard_window_start_timestamp_seconds",
            "rollboard_window_end_timestamp_seconds",
            "rollboard_last_roll_timestamp_seconds",
        ] {
            assert!(
                body.lines()
                    .any(|l| l.starts_with(family) && l.contains(&format!("board=\"{b}\""))),
                "{family} has no sample for {b}"
            );
        }
    }
    for kind in rollboard::metrics::ERROR_KINDS {
        assert!(
            body.contains(&format!("rollboard_redis_errors_total{{kind=\"{kind}\"}}")),
            "{kind}"
        );
    }
}

/// A board watermark key that is not what rollboard wrote: queries of the scoped board
/// answer 500 ("not an outage"), not 503, and not a wrong window.
#[tokio::test]
async fn a_broken_board_watermark_is_a_500_not_an_outage() {
    let (redis, _dir, daemon, _config) = daemon_with("").await;
    // Let the start-up rolls write it first, then break it two ways.
    assert!(
        wait_for(Duration::from_secs(8), || async {
            redis.cli(&["EXISTS", "rb:board:fans_7d:window"]).trim() == "1"
        })
        .await
    );
    for (setup, what) in [
        (
            vec!["HSET", "rb:board:fans_7d:window", "expired_through", "abc"],
            "not a number",
        ),
        (vec!["SET", "rb:board:fans_7d:window", "x"], "WRONGTYPE"),
    ] {
        redis.cli(&["DEL", "rb:board:fans_7d:window"]);
        redis.cli(&setup);
        let (status, body) = daemon.get("/v1/boards/fans_7d/top?scope=a").await;
        assert_eq!(status, 500, "{what}: {body}");
        assert!(body.contains("not an outage"), "{what}: {body}");
        // The unscoped board is unaffected.
        let (status, _) = daemon.get("/v1/boards/rooms_7d/top").await;
        assert_eq!(status, 200, "{what}");
    }
}

/// hyper's own protocol errors (a URI over its limit, a request line that is not HTTP) are
/// client errors with an empty body: they happen before there is a request to route, the
/// one documented exception to JSON error bodies.
#[tokio::test]
async fn protocol_errors_are_client_errors_with_an_empty_body() {
    let (_redis, _dir, daemon, _config) = daemon_with("").await;
    // hyper answers these itself, before the router: a URI over its 64 kB limit and a
    // request line that is not HTTP.
    let long_uri = format!(
        "GET /v1/boards/rooms_7d/top?x={} HTTP/1.1\r\nHost: x\r\n\r\n",
        "q".repeat(70_000)
    );
    let mut protocol = Vec::new();
    for request in [long_uri.into_bytes(), b"GARBAGE\r\n\r\n".to_vec()] {
        let answer = raw(&daemon, &request, Duration::from_secs(5)).await;
        let status = answer.get(9..12).unwrap_or("").to_string();
        assert!(
            status.starts_with('4'),
            "a protocol error is a client error: {answer:?}"
        );
        protocol.push((status, answer));
    }
    for (status, answer) in &protocol {
        assert!(
            answer.contains("content-length: 0"),
            "{status}: an empty body, as documented: {answer:?}"
        );
    }
    assert_eq!(protocol[0].0, "414");
    assert_eq!(protocol[1].0, "400");
}
