//! The metrics an operator reads first, on a real daemon against a real `redis-server`:
//! the build and process metrics, the window gauges before any roll has run, and the HTTP
//! and intake counters following the answers clients really got (202, 400, 404, 415 and a
//! 503 once Redis is gone).

use std::time::Duration;

use serde_json::json;

use crate::support::asserts::assert_metrics;
use crate::support::config::{config_for, server_and_config, write_config};
use crate::support::daemon::Daemon;
use crate::support::keys::schema;
use crate::support::redis::RedisServer;
use crate::support::wait::wait_for;

/// A config of the test boards whose roll and resummarize jobs do not tick during a test
/// (once a year, at midnight on January 1st).
fn config_without_rolls(
    dir: &std::path::Path,
    redis: &RedisServer,
    port: u16,
) -> std::path::PathBuf {
    let path = write_config(dir, redis, port, "c1", "");
    let text = std::fs::read_to_string(&path).expect("read config");
    let yearly = "\"0 0 0 1 1 *\"";
    let text = text
        .replace("roll = \"*/2 * * * * *\"", &format!("roll = {yearly}"))
        .replace(
            "resummarize = \"* * * * * *\"",
            &format!("resummarize = {yearly}"),
        );
    assert_eq!(
        text.matches(yearly).count(),
        2,
        "the schedule lines: {text}"
    );
    std::fs::write(&path, text).expect("write config");
    path
}

/// The commit the binary under test reports: what `git rev-parse --short HEAD` says here,
/// or `unknown` without git.
fn expected_commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

fn epoch_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_gauges_build_info_and_process_metrics_show_from_the_first_scrape() {
    let (redis, _dir, port, config) = server_and_config(config_without_rolls);
    // Another replica holds both jobs' leases, as when this one joins a running
    // deployment: none of its ticks runs, not even the one at start-up.
    for job in ["roll", "resummarize"] {
        let key = schema().lease(job);
        let set = redis.cli(&["SET", &key, "another-replica@0", "PX", "600000"]);
        assert!(set.contains("OK"), "SET {key}: {set}");
    }
    let before = epoch_seconds();
    let daemon = Daemon::spawn_args(
        &config,
        port,
        &[],
        &[],
        "info,rollboard::edges::daemon=debug",
    );
    daemon.wait_up().await;
    let after = epoch_seconds();

    // No roll has run (nor will during the test), yet every board shows its window: the
    // live range ends at the end of the slice holding the start-up time.
    let skipped = wait_for(Duration::from_secs(20), || async {
        daemon
            .logs()
            .matches("the tick is run by another replica")
            .count()
            >= 2
    })
    .await;
    assert!(
        skipped,
        "the start-up ticks were not left to the lease holder; log:\n{}",
        daemon.logs()
    );
    for (board, slice, window) in [
        ("rooms_7d", 6.0 * 3600.0, 7.0 * 86400.0),
        ("fans_7d", 3600.0, 7.0 * 86400.0),
        ("tips_24h", 3600.0, 86400.0),
    ] {
        let labels = [("board", board)];
        assert_eq!(
            daemon
                .metric("rollboard_last_roll_timestamp_seconds", &labels)
                .await,
            0.0,
            "{board} was rolled"
        );
        let start = daemon
            .metric("rollboard_window_start_timestamp_seconds", &labels)
            .await;
        let end = daemon
            .metric("rollboard_window_end_timestamp_seconds", &labels)
            .await;
        assert_eq!(end - start, window, "{board}: window {start}..{end}");
        assert_eq!(end % slice, 0.0, "{board}: {end} is not a slice boundary");
        let first_end = ((before / slice).floor() + 1.0) * slice;
        let last_end = ((after / slice).floor() + 1.0) * slice;
        assert!(
            end == first_end || end == last_end,
            "{board}: window end {end}, expected the end of the slice of {before}..{after}"
        );
    }
    assert_metrics(&daemon, &["rollboard_job_runs_total{job=roll} 0"]).await;

    let commit = expected_commit();
    assert_eq!(
        daemon
            .metric(
                "rollboard_build_info",
                &[("version", env!("CARGO_PKG_VERSION")), ("commit", &commit)]
            )
            .await,
        1.0,
        "build_info for {commit}"
    );
    let rss = daemon.metric("process_resident_memory_bytes", &[]).await;
    assert!(rss > 1_000_000.0, "resident memory {rss}");
    assert!(daemon.metric("process_open_fds", &[]).await >= 3.0);
    let started = daemon.metric("process_start_time_seconds", &[]).await;
    assert!(
        started >= before.floor() - 1.0 && started <= after + 1.0,
        "process start {started}, spawned within {before}..{after}"
    );
    assert!(daemon.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_and_intake_counters_follow_the_answers_given() {
    let mut redis = RedisServer::start();
    let (_dir, port, config) = config_for(&redis, "c1", "");
    let daemon = Daemon::start(&config, port).await;
    let client = reqwest::Client::new();
    let events = format!("{}/v1/events", daemon.base);
    let tip = |i: usize, amount: &str| {
        json!({"room": format!("room{i}"), "user": format!("user{i}"), "amount": amount,
               "value": "1.50", "id": format!("op-{i}")})
    };
    let status =
        |r: reqwest::Result<reqwest::Response>| r.map(|r| r.status().as_u16()).unwrap_or(0);

    // Three valid events, then four refused because one of them is invalid.
    let ok = client
        .post(&events)
        .json(&json!([tip(1, "5"), tip(2, "6"), tip(3, "7")]))
        .send()
        .await;
    assert_eq!(status(ok), 202);
    let bad = json!([tip(4, "5"), tip(5, "abc"), tip(6, "5"), tip(7, "5")]);
    assert_eq!(status(client.post(&events).json(&bad).send().await), 400);
    // Two bodies refused as a whole: not JSON, and not sent as JSON.
    let typed = |content_type: &str, body: &'static str| {
        let request = client.post(&events).header("content-type", content_type);
        request.body(body).send()
    };
    assert_eq!(status(typed("application/json", "{not json").await), 400);
    assert_eq!(status(typed("text/plain", "{}").await), 415);
    // Queries: an answer, an unknown board (a route) and an unknown path (no route).
    let get = |path: &str| client.get(format!("{}{path}", daemon.base)).send();
    assert_eq!(status(get("/v1/boards/rooms_7d/top").await), 200);
    assert_eq!(status(get("/v1/boards/nope/top").await), 404);
    assert_eq!(status(get("/no/such/path").await), 404);
    assert_eq!(status(get("/no/such/path/either").await), 404);

    let intake = |result: &'static str| {
        let daemon = &daemon;
        async move {
            daemon
                .metric("rollboard_intake_events_total", &[("result", result)])
                .await
        }
    };
    assert_eq!(intake("accepted").await, 3.0);
    assert_eq!(intake("invalid").await, 4.0);
    assert_eq!(intake("malformed").await, 2.0);
    assert_eq!(intake("unavailable").await, 0.0);
    assert_eq!(intake("failed").await, 0.0);
    // Read from the exposition's lines: a route template's braces are beyond the parser
    // of `Daemon::metric`.
    let requests = |route: &'static str, code: &'static str| {
        let daemon = &daemon;
        async move {
            let (_, body) = daemon.get("/metrics").await;
            let series =
                format!("rollboard_http_requests_total{{route=\"{route}\",status=\"{code}\"}} ");
            body.lines()
                .find_map(|l| l.strip_prefix(series.as_str()))
                .map_or(0.0, |v| v.trim().parse::<f64>().expect("a sample value"))
        }
    };
    assert_eq!(requests("/v1/events", "202").await, 1.0);
    assert_eq!(requests("/v1/events", "400").await, 2.0);
    assert_eq!(requests("/v1/events", "415").await, 1.0);
    assert_eq!(requests("/v1/boards/{board}/top", "200").await, 1.0);
    assert_eq!(requests("/v1/boards/{board}/top", "404").await, 1.0);
    // Every unknown path under one label value: a scan cannot grow the label set.
    assert_eq!(requests("unmatched", "404").await, 2.0);
    let (_, body) = daemon.get("/metrics").await;
    assert!(
        !body.contains("/no/such"),
        "a raw path became a label value:\n{body}"
    );

    // Redis gone: valid events are not confirmed (503), and counted as unavailable.
    redis.kill();
    let refused = wait_for(Duration::from_secs(20), || async {
        let r = client
            .post(&events)
            .json(&json!([tip(8, "1"), tip(9, "2")]))
            .send()
            .await;
        status(r) == 503
    })
    .await;
    assert!(
        refused,
        "the intake did not answer 503 without Redis; log:\n{}",
        daemon.logs()
    );
    let unavailable = intake("unavailable").await;
    let answered_503 = requests("/v1/events", "503").await;
    assert!(answered_503 >= 1.0);
    assert_eq!(unavailable, 2.0 * answered_503, "two events per 503");
    assert_eq!(intake("accepted").await, 3.0);
}
