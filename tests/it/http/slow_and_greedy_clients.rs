//! What a slow, greedy or careless HTTP client gets: timeouts, connection and intake caps, a
//! prompt shutdown, and one JSON error shape.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::daemon::{addr, assert_exited_within, daemon_with, xlen};
use crate::support::keys::intake_stream;

/// Whether the server closed `conn` (EOF or reset) within `limit`.
async fn closed_within(conn: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, conn.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

#[tokio::test]
async fn a_slow_loris_is_cut_off_and_connections_are_capped() {
    let (_redis, _dir, daemon, _config) =
        daemon_with("header_timeout = \"1s\"\nmax_connections = 2\n").await;
    // One header byte per 500 ms: cut off after the 1 s header timeout.
    let mut slow = TcpStream::connect(addr(&daemon)).await.expect("connect");
    let started = Instant::now();
    let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut cut = false;
    for byte in request {
        if slow.write_all(&[*byte]).await.is_err() {
            cut = true;
            break;
        }
        if closed_within(&mut slow, Duration::from_millis(500)).await {
            cut = true;
            break;
        }
    }
    assert!(cut, "a client sending a byte per 500 ms was never cut off");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );

    // Two idle connections fill the cap: a third client waits until one goes away.
    let first = TcpStream::connect(addr(&daemon)).await.expect("connect");
    let _second = TcpStream::connect(addr(&daemon)).await.expect("connect");
    let client = reqwest::Client::new();
    let url = format!("{}/healthz", daemon.base);
    let waited = client
        .get(&url)
        .timeout(Duration::from_millis(400))
        .send()
        .await;
    assert!(waited.is_err(), "a third connection was served: {waited:?}");
    drop(first);
    let served = client
        .get(&url)
        .timeout(Duration::from_secs(3))
        .send()
        .await
        .expect("served once a slot is free");
    assert_eq!(served.status().as_u16(), 200);
}

#[tokio::test]
async fn slow_uploads_time_out_intake_is_capped_and_shutdown_is_prompt() {
    let (_redis, _dir, daemon, _config) =
        daemon_with("request_timeout = \"10s\"\nmax_concurrent_intake = 1\n").await;
    let half_sent = |extra: &'static str| {
        let addr = addr(&daemon);
        async move {
            let mut conn = TcpStream::connect(addr).await.expect("connect");
            let head = format!(
                "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                 Content-Length: 1000\r\n\r\n{extra}"
            );
            conn.write_all(head.as_bytes()).await.expect("write");
            conn
        }
    };
    // A body that never completes answers 408 (as JSON) after the request timeout.
    let mut slow = half_sent("[{\"room\":").await;
    // Meanwhile it holds the only intake slot: another post is shed at once. On a busy
    // machine a post can reach the server first and hold the slot for a moment, and then
    // the slow request is the one shed: it gets its answer at once, and is sent again.
    let deadline = Instant::now() + Duration::from_secs(8);
    let mut last = String::new();
    let shed = loop {
        let r = reqwest::Client::new()
            .post(format!("{}/v1/events", daemon.base))
            .json(&serde_json::json!({"room": "r1", "amount": 1}))
            .send()
            .await
            .expect("post");
        let status = r.status().as_u16();
        let body = r.text().await.unwrap_or_default();
        if status == 503 && body.contains("max_concurrent_intake") {
            break true;
        }
        last = format!("{status} {body}");
        let mut peek = [0u8; 1];
        if let Ok(Ok(_)) =
            tokio::time::timeout(Duration::from_millis(50), slow.peek(&mut peek)).await
        {
            slow = half_sent("[{\"room\":").await;
        }
        if Instant::now() > deadline {
            break false;
        }
    };
    assert!(
        shed,
        "a second intake was not shed while the first held the slot; last answer: {last}"
    );
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(15), slow.read_to_end(&mut answer)).await;
    assert!(
        read.is_ok(),
        "no answer within 15 s to a body that never came"
    );
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("{\"error\":"), "{answer}");

    // SIGTERM with a half-sent request and an idle connection: out well within the grace.
    let _half = half_sent("{").await;
    let _idle = TcpStream::connect(addr(&daemon)).await.expect("connect");
    let started = Instant::now();
    assert_exited_within(daemon.terminate().await, started, Duration::from_secs(8));
}

#[tokio::test]
async fn every_error_is_json_with_the_right_status() {
    let (redis, _dir, daemon, _config) = daemon_with("").await;
    let client = reqwest::Client::new();
    let json_error = |status: u16, body: &str, context: &str| {
        let value: serde_json::Value = serde_json::from_str(body)
            .unwrap_or_else(|_| panic!("{context}: {status} is not JSON: {body:?}"));
        let error = value["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{context}: {body}"));
        assert!(!error.contains("redis: redis:"), "{context}: {body}");
        assert!(body.len() < 400, "{context}: {} bytes", body.len());
        assert!(
            value.as_object().is_some_and(|o| o.len() == 1),
            "{context}: only an error: {body}"
        );
    };
    // "Not on the board" is the member's rank answer (rank null) with an error.
    for path in [
        "/v1/boards/rooms_7d/members/nobody",
        "/v1/boards/rooms_7d/members/nobody/around",
    ] {
        let body = daemon.get_answering(path, 404).await;
        let value: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(
            value["error"], "\"nobody\" is not on board rooms_7d",
            "{body}"
        );
        assert_eq!(value["rank"], serde_json::Value::Null, "{body}");
        assert_eq!(value["member"], "nobody", "{body}");
    }
    let long = "9".repeat(10_000);
    for (path, status) in [
        ("/v1/boards/fans_7d/top?scope=%FF", 400),
        ("/v1/boards/fans_7d/members/u/around?scope=%FF", 400),
        ("/v1/boards/rooms_7d/members/%FF", 400),
        (&format!("/v1/boards/rooms_7d/top?limit={long}"), 400),
    ] {
        let body = daemon.get_answering(path, status).await;
        json_error(status, &body, path);
    }
    let r = client
        .delete(format!("{}/v1/boards", daemon.base))
        .send()
        .await
        .expect("delete");
    assert_eq!(r.status().as_u16(), 405);
    json_error(405, &r.text().await.expect("body"), "DELETE");

    let post = |body: &'static str, content_type: Option<&'static str>| {
        let mut request = client.post(format!("{}/v1/events", daemon.base)).body(body);
        if let Some(t) = content_type {
            request = request.header("content-type", t);
        }
        request.send()
    };
    for (content_type, status) in [
        (Some("text/plain"), 415),
        (None, 415),
        (Some("application/x-www-form-urlencoded"), 415),
    ] {
        let r = post(r#"{"room":"r1","amount":1}"#, content_type)
            .await
            .expect("post");
        assert_eq!(r.status().as_u16(), status, "{content_type:?}");
        json_error(status, &r.text().await.expect("body"), "415");
    }
    let r = post(
        r#"[{"room":"r1","amount":1},{"room":"r1","amount":1,"amount":1000}]"#,
        Some("application/json; charset=utf-8"),
    )
    .await
    .expect("post");
    assert_eq!(r.status().as_u16(), 400);
    let body: serde_json::Value = r.json().await.expect("json");
    assert_eq!(body["invalid"][0]["index"], 1, "{body}");
    assert_eq!(
        xlen(&redis, intake_stream()).await,
        0,
        "a repeated key appends nothing"
    );

    // Data rollboard did not write where it expects its stream: a 500 naming the problem,
    // not a 503 (Redis is up).
    redis.cli(&["SET", intake_stream(), "not a stream"]);
    let r = post(r#"{"room":"r1","amount":1}"#, Some("application/json"))
        .await
        .expect("post");
    assert_eq!(r.status().as_u16(), 500);
    let body = r.text().await.expect("body");
    json_error(500, &body, "WRONGTYPE");
    assert!(
        body.contains("WRONGTYPE") && body.contains("not an outage"),
        "{body}"
    );
}
