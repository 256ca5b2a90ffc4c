//! HTTP client mistakes answer 400 or 404 with a JSON error (oversized bodies too), and the
//! metrics parse and count what was applied.

use std::time::Duration;

use fred::prelude::*;

use crate::support::daemon::{redis_and_config, Daemon, METRIC_FAMILIES};
use crate::support::events::{tips_now, xadd_all};
use crate::support::keys::intake_stream;
use crate::support::wait::{drained, wait_for};

/// POSTs a body over the 4 MiB limit on a raw connection (the server answers before it has
/// read everything, which an ordinary client reports as a broken request); returns the status.
async fn oversized_post(base: &str) -> u16 {
    oversized_post_to(base, "/v1/events").await
}

/// The status of a POST to `path` whose body is over the 4 MiB limit.
async fn oversized_post_to(base: &str, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://").to_string();
    let stream = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let (mut read, mut write) = stream.into_split();
    let body = format!(
        "[{}]",
        vec![r#"{"room":"r1","amount":1}"#; 200_000].join(",")
    );
    let head = format!("POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", body.len());
    let writer = tokio::spawn(async move {
        let _ = write.write_all(head.as_bytes()).await;
        let _ = write.write_all(body.as_bytes()).await;
    });
    let mut reply = vec![0u8; 12];
    read.read_exact(&mut reply).await.expect("status line");
    writer.abort();
    String::from_utf8_lossy(&reply[9..12])
        .parse()
        .expect("status code")
}

#[tokio::test]
async fn http_client_mistakes_are_400_or_404_with_a_json_error() {
    let (_redis, store, _dir, config, port) = redis_and_config("a").await;
    let daemon = Daemon::start(&config, port).await;
    for (path, status) in [
        ("/v1/boards/nope/top", 404),
        ("/v1/boards/rooms_7d/top?limit=0", 400),
        ("/v1/boards/rooms_7d/top?limit=1001", 400),
        ("/v1/boards/rooms_7d/top?limit=ten", 400),
        ("/v1/boards/rooms_7d/top?offset=-1", 400),
        ("/v1/boards/rooms_7d/top?scope=r1", 400),
        ("/v1/boards/fans_7d/top", 400),
        ("/v1/boards/rooms_7d/members/nobody", 404),
        ("/v1/boards/rooms_7d/members/nobody/around", 404),
        ("/v1/boards/rooms_7d/members/a%0Ab", 400),
        (
            &format!("/v1/boards/rooms_7d/members/{}", "m".repeat(257)),
            400,
        ),
        ("/v1/boards/rooms_7d/members/x/around?radius=101", 400),
        ("/v1/nothing", 404),
        ("/v1/boards/rooms_7d/members/%FF", 400),
        ("/v1/boards/%FF/top", 400),
    ] {
        let body = daemon.get_answering(path, status).await;
        let json: serde_json::Value =
            serde_json::from_str(&body).unwrap_or_else(|_| panic!("{path}: not JSON: {body}"));
        assert!(
            json.get("error").is_some() || json.get("rank").is_some(),
            "{path}: {body}"
        );
    }
    let (ok, body) = daemon.get("/v1/boards/fans_7d/top?scope=unknown").await;
    assert_eq!(ok, 200, "an unknown scope is an empty board: {body}");
    let client = reqwest::Client::new();
    let post = |body: &'static str| {
        client
            .post(format!("{}/v1/events", daemon.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    for (body, status) in [
        ("not json", 400),
        ("42", 400),
        (
            r#"[{"room":"r1","amount":1},{"room":"r1","amount":0}]"#,
            400,
        ),
        (r#"{"room":"r1","amount":[1]}"#, 400),
        (r#"{"nothing":"here"}"#, 400),
        ("[]", 202),
        (r#"{"room":"r1","amount":12}"#, 202),
    ] {
        let r = post(body).await.expect("post");
        assert_eq!(r.status().as_u16(), status, "{body}");
    }
    assert_eq!(oversized_post(&daemon.base).await, 413);
    assert_eq!(
        oversized_post_to(&daemon.base, "/v1/boards/rooms_7d/ranks").await,
        413,
        "a ranks body over the limit"
    );
    let len: i64 = store.client().xlen(intake_stream()).await.expect("xlen");
    assert_eq!(len, 1, "only the one valid request appended");
    let r = post(r#"[{"room":"r1","amount":1},{"room":"r1","amount":1.5},{"x":1}]"#)
        .await
        .expect("post");
    let body: serde_json::Value = r.json().await.expect("json");
    let invalid = body["invalid"].as_array().expect("invalid list");
    assert_eq!(
        invalid
            .iter()
            .map(|i| i["index"].as_u64().unwrap_or(99))
            .collect::<Vec<_>>(),
        [1, 2]
    );
    assert_eq!(invalid[1]["reason"], "no_board");
}

#[tokio::test]
async fn metrics_parse_and_count_what_was_applied() {
    let (_redis, store, _dir, config, port) = redis_and_config("a").await;
    let daemon = Daemon::start(&config, port).await;
    let (status, body) = daemon.get("/metrics").await;
    assert_eq!(status, 200);
    let more = [
        "rollboard_script_duration_seconds",
        "rollboard_http_request_duration_seconds",
    ];
    for family in METRIC_FAMILIES.iter().chain(&more) {
        assert!(
            body.contains(&format!("# HELP {family} ")),
            "{family} registered with help text"
        );
    }
    let events = tips_now(300);
    xadd_all(store.client(), intake_stream(), &events).await;
    assert!(drained(&store).await);
    for (board, applied) in [("rooms_7d", 300.0), ("fans_7d", 300.0), ("tips_24h", 0.0)] {
        assert_eq!(
            daemon
                .metric("rollboard_events_applied_total", &[("board", board)])
                .await,
            applied,
            "{board}"
        );
    }
    let rolled = wait_for(Duration::from_secs(10), || async {
        daemon
            .metric(
                "rollboard_last_roll_timestamp_seconds",
                &[("board", "rooms_7d")],
            )
            .await
            > 0.0
    })
    .await;
    assert!(rolled, "the roll job ran");
}
