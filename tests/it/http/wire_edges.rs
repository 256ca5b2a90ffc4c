//! The HTTP edges a hostile client can reach: wire and parameter edges, error answers that
//! do not echo long input, a never-ending chunked upload, protocol errors, every metric family
//! at start-up, and a broken board watermark answering 500.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::cli::text;
use crate::support::daemon::{addr, daemon_with, xlen, Daemon, METRIC_FAMILIES};
use crate::support::keys::{intake_stream, schema};
use crate::support::wait::{drained, wait_for};

/// Writes `request` on a fresh connection and reads until the server closes it or
/// `limit` passes; returns what was read.
async fn raw(daemon: &Daemon, request: &[u8], limit: Duration) -> String {
    let mut conn = TcpStream::connect(addr(daemon)).await.expect("connect");
    conn.write_all(request).await.expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(limit, conn.read_to_end(&mut out)).await;
    text(&out)
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
        let body = daemon.get_answering(path, status).await;
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
        // Up to 2^53 - 1, a number every JSON client holds exactly.
        ("offset=9007199254740991", 200),
        ("offset=9007199254740992", 400),
        ("offset=18446744073709551615", 400),
        ("offset=18446744073709551616", 400),
        ("offset=9007199254740991&limit=1000", 200),
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
    assert_eq!(xlen(&redis, intake_stream()).await, 4);

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
    assert_eq!(xlen(&redis, intake_stream()).await, 4);
    let r = post(many(10_000), "application/json").await.expect("post");
    assert_eq!(r.status().as_u16(), 202);
    assert_eq!(xlen(&redis, intake_stream()).await, 10_004);

    // Numbers by their exact value: 1.50 at scale 2 is 150 minor units, 1e3 is 1000
    // (100000), 1E2 is 100, 1.500 is 1.5; 0.00 and -0 are zero, refused; a member given as
    // a number is its value written plainly (1.10 is "1.1").
    for (body, status) in [
        (r#"{"user":"num","value":1e3}"#, 202),
        (r#"{"user":"num","value":1E2}"#, 202),
        (r#"{"user":"num","value":1.500}"#, 202),
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
        [("num".to_string(), 110_275), ("1.1".to_string(), 200)],
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
    assert_eq!(xlen(&redis, intake_stream()).await, 0);
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

/// Every family of the contract, and the new ones, is in the first scrape with help text,
/// with a sample per configured board where it is labelled by board.
#[tokio::test]
async fn every_metric_family_is_there_at_start_up() {
    let (_redis, _dir, daemon, _config) = daemon_with("").await;
    let (status, body) = daemon.get("/metrics").await;
    assert_eq!(status, 200);
    for family in METRIC_FAMILIES {
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
            redis.cli(&["EXISTS", &schema().window("fans_7d")]).trim() == "1"
        })
        .await
    );
    for (setup, what) in [
        (
            vec![
                "HSET",
                &schema().window("fans_7d"),
                "expired_through",
                "abc",
            ],
            "not a number",
        ),
        (vec!["SET", &schema().window("fans_7d"), "x"], "WRONGTYPE"),
    ] {
        redis.cli(&["DEL", &schema().window("fans_7d")]);
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
