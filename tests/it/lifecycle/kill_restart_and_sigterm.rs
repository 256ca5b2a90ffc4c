//! The daemon as a platform team runs it: `rollboard run` as a child process against a
//! real redis-server, fed through the stream, `send` and HTTP, killed, restarted, drained.

use std::collections::HashMap;
use std::time::Duration;

use fred::prelude::*;
use rollboard::ingest::group_info;
use rollboard::store::Store;

use crate::support::{
    assert_state, drained, free_port, test_boards, wait_for, write_config, xadd_all, Daemon,
    Fields, RedisServer,
};
use crate::support::{models, payment, tip, SplitMix};

fn now_ms() -> i64 {
    rollboard::cli::now_ms()
}

async fn assert_drained_into_model(store: &Store, events: &[Fields], daemon: &Daemon) {
    assert!(
        drained(store).await,
        "stream never drained; log:\n{}",
        daemon.logs()
    );
    let boards = test_boards();
    let now = now_ms();
    assert_state(store, &boards, &models(events, &boards, now), now).await;
}

async fn setup(
    consumer: &str,
) -> (
    RedisServer,
    Store,
    tempfile::TempDir,
    std::path::PathBuf,
    u16,
) {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let config = write_config(dir.path(), &redis, port, consumer, "");
    (redis, store, dir, config, port)
}

#[tokio::test]
async fn events_from_the_stream_send_and_http_end_in_the_model_state() {
    let (_redis, store, dir, config, port) = setup("a").await;
    let daemon = Daemon::start(&config, port).await;
    let now = now_ms();
    let mut events: Vec<Fields> = (0..600)
        .map(|i| tip(i, now))
        .chain((0..200).map(|i| payment(i, now)))
        .collect();
    xadd_all(store.client(), "rb:events", &events[..400]).await;
    // Through `rollboard send`, from a JSON-lines file (numbers taken as written).
    let lines: Vec<String> = events[400..700]
        .iter()
        .map(|f| {
            serde_json::to_string(&f.iter().cloned().collect::<HashMap<String, String>>())
                .expect("json")
        })
        .collect();
    let file = dir.path().join("events.jsonl");
    std::fs::write(&file, lines.join("\n")).expect("write events");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rollboard"))
        .args([
            "--config",
            config.to_str().expect("path"),
            "send",
            file.to_str().expect("path"),
        ])
        .output()
        .expect("send");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Through HTTP, as one array.
    let body: Vec<HashMap<String, String>> = events[700..]
        .iter()
        .map(|f| f.iter().cloned().collect())
        .collect();
    let r = reqwest::Client::new()
        .post(format!("{}/v1/events", daemon.base))
        .json(&body)
        .send()
        .await
        .expect("post");
    assert_eq!(r.status().as_u16(), 202);
    // Redelivering the same events changes nothing.
    xadd_all(store.client(), "rb:events", &events[..50]).await;
    events.truncate(800);
    assert_drained_into_model(&store, &events, &daemon).await;
    assert_eq!(
        daemon
            .metric("rollboard_events_applied_total", &[("board", "rooms_7d")])
            .await,
        600.0
    );
    assert_eq!(
        daemon
            .metric("rollboard_events_applied_total", &[("board", "tips_24h")])
            .await,
        200.0
    );
    assert_eq!(
        daemon
            .metric(
                "rollboard_events_skipped_total",
                &[("board", "rooms_7d"), ("reason", "duplicate")]
            )
            .await,
        50.0
    );
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn a_killed_daemon_restarted_loses_nothing_and_counts_nothing_twice() {
    let (_redis, store, _dir, config, port) = setup("a").await;
    let now = now_ms();
    let events: Vec<Fields> = (0..8000)
        .map(|i| {
            if i % 4 == 0 {
                payment(i, now)
            } else {
                tip(i, now)
            }
        })
        .collect();
    xadd_all(store.client(), "rb:events", &events).await;
    let daemon = Daemon::start(&config, port).await;
    let started = wait_for(Duration::from_secs(30), || async {
        store
            .client()
            .zcard::<i64, _>("rb:{rooms_7d}:result")
            .await
            .unwrap_or(0)
            > 0
    })
    .await;
    assert!(started);
    daemon.kill().await;
    let pending = group_info(store.client(), "rb:events", "rollboard")
        .await
        .expect("xinfo")
        .expect("group");
    assert!(
        pending.1.unwrap_or(0) > 0 || pending.0 > 0,
        "killed too late: nothing left to redeliver"
    );
    let daemon = Daemon::start(&config, port).await;
    assert_drained_into_model(&store, &events, &daemon).await;
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn two_daemons_share_a_group_and_take_over_a_dead_ones_entries() {
    let (redis, store, dir, config_a, port_a) = setup("a").await;
    let port_b = free_port();
    let config_b = write_config(dir.path(), &redis, port_b, "b", "");
    let now = now_ms();
    let events: Vec<Fields> = (0..6000).map(|i| tip(i, now)).collect();
    let a = Daemon::start(&config_a, port_a).await;
    let b = Daemon::start(&config_b, port_b).await;
    xadd_all(store.client(), "rb:events", &events[..3000]).await;
    assert!(drained(&store).await);
    assert!(
        a.metric("rollboard_events_applied_total", &[("board", "rooms_7d")])
            .await
            > 0.0,
        "a took part"
    );
    assert!(
        b.metric("rollboard_events_applied_total", &[("board", "rooms_7d")])
            .await
            > 0.0,
        "b took part"
    );
    // Kill b while it holds entries; a claims them after claim_idle (1s).
    assert!(b.terminate().await.success());
    let _: Value = store
        .client()
        .xreadgroup("rollboard", "b", Some(100), None, false, "rb:events", ">")
        .await
        .expect("b reads without acking");
    xadd_all(store.client(), "rb:events", &events[3000..]).await;
    let _: Value = store
        .client()
        .xreadgroup("rollboard", "b", Some(100), None, false, "rb:events", ">")
        .await
        .expect("b reads without acking");
    assert_drained_into_model(&store, &events, &a).await;
    assert!(a.terminate().await.success());
}

#[tokio::test]
async fn sigterm_under_load_exits_0_and_loses_nothing() {
    let (_redis, store, _dir, config, port) = setup("a").await;
    let now = now_ms();
    let events: Vec<Fields> = (0..6000).map(|i| tip(i, now)).collect();
    let daemon = Daemon::start(&config, port).await;
    let producer = {
        let client = store.client().clone();
        let events = events.clone();
        tokio::spawn(async move { xadd_all(&client, "rb:events", &events).await })
    };
    let busy = wait_for(Duration::from_secs(30), || async {
        store
            .client()
            .zcard::<i64, _>("rb:{rooms_7d}:result")
            .await
            .unwrap_or(0)
            > 0
    })
    .await;
    assert!(busy);
    let status = daemon.terminate().await;
    assert!(status.success(), "exit status {status:?}");
    producer.await.expect("producer");
    // Whatever the stopped daemon did not take, a new one does; nothing is lost or doubled.
    let daemon = Daemon::start(&config, port).await;
    assert_drained_into_model(&store, &events, &daemon).await;
    assert!(daemon.terminate().await.success());
}

/// How many SIGTERM points the randomized shutdown test tries (`ROLLBOARD_SIGTERM_RUNS`).
fn sigterm_runs() -> usize {
    std::env::var("ROLLBOARD_SIGTERM_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10)
}

/// The seed of the randomized shutdown test: `ROLLBOARD_SIGTERM_SEED`, else the clock.
fn sigterm_seed() -> u64 {
    std::env::var("ROLLBOARD_SIGTERM_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| now_ms() as u64)
}

/// The last lines of a daemon log, for failure messages.
fn log_tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// SIGTERM at random points while a large backlog is ingested: every exit is 0 and leaves
/// nothing pending in the group (the batch in flight and the one read ahead are applied and
/// acked), and after all the restarts every board equals the model.
#[tokio::test]
async fn sigterm_at_random_points_leaves_nothing_pending() {
    const BACKLOG: usize = 100_000;
    let runs = sigterm_runs();
    let seed = sigterm_seed();
    eprintln!("sigterm test: seed {seed} (ROLLBOARD_SIGTERM_SEED), {runs} runs");
    let mut rng = SplitMix(seed);
    let (_redis, store, _dir, config, port) = setup("a").await;
    let text = std::fs::read_to_string(&config).expect("read config");
    std::fs::write(
        &config,
        text.replace("batch_size = 200", "batch_size = 256"),
    )
    .expect("write config");
    let now = now_ms();
    let event = |i: usize| {
        if i % 4 == 0 {
            payment(i, now)
        } else {
            tip(i, now)
        }
    };
    let mut events: Vec<Fields> = (0..BACKLOG).map(event).collect();
    xadd_all(store.client(), "rb:events", &events).await;
    let group = || async {
        group_info(store.client(), "rb:events", "rollboard")
            .await
            .expect("xinfo groups")
    };
    for run in 1..=runs {
        let context = format!("seed {seed}, run {run} of {runs}");
        // Keep a backlog for every SIGTERM point: top it up when an earlier run took it all.
        if let Some((0, Some(0))) = group().await {
            let more: Vec<Fields> = (events.len()..events.len() + BACKLOG / 4)
                .map(event)
                .collect();
            xadd_all(store.client(), "rb:events", &more).await;
            events.extend(more);
        }
        let daemon = Daemon::start(&config, port).await;
        let applying = wait_for(Duration::from_secs(30), || async {
            daemon
                .metric("rollboard_events_applied_total", &[("board", "rooms_7d")])
                .await
                > 0.0
        })
        .await;
        assert!(
            applying,
            "{context}: nothing applied; log:\n{}",
            log_tail(&daemon.logs())
        );
        let delay = Duration::from_millis(rng.next() % 1_500);
        tokio::time::sleep(delay).await;
        let log = daemon.log.clone();
        let status = daemon.terminate().await;
        let logs = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            status.success(),
            "{context}: exit status {status:?} after {delay:?}; log:\n{}",
            log_tail(&logs)
        );
        let (pending, lag) = group().await.expect("the group exists");
        assert_eq!(
            pending,
            0,
            "{context}: {pending} entries left pending after a clean exit {delay:?} into the run \
             (lag {lag:?}); log:\n{}",
            log_tail(&logs)
        );
    }
    eprintln!("sigterm test: {runs} SIGTERM points left nothing pending");
    let daemon = Daemon::start(&config, port).await;
    assert_drained_into_model(&store, &events, &daemon).await;
    assert!(
        daemon.terminate().await.success(),
        "seed {seed}: final exit"
    );
    assert_eq!(group().await, Some((0, Some(0))), "seed {seed}: all taken");
}

/// Entries pending for the daemon's consumer that its loop never read (here delivered under
/// its name by someone else, as a reply lost on the wire would leave them) are applied and
/// acked before a clean exit, not left for the next start or another replica's claim.
#[tokio::test]
async fn sigterm_drains_own_pending_entries_the_loop_never_saw() {
    let (_redis, store, _dir, config, port) = setup("a").await;
    let now = now_ms();
    let events: Vec<Fields> = (0..300).map(|i| tip(i, now)).collect();
    let daemon = Daemon::start(&config, port).await;
    xadd_all(store.client(), "rb:events", &events[..100]).await;
    assert!(drained(&store).await, "log:\n{}", daemon.logs());
    // Append and deliver to "a" in one transaction: the daemon's own read never sees them,
    // and they are idle for far less than claim_idle (1s) when the SIGTERM comes.
    let tx = store.client().multi();
    for fields in &events[100..] {
        let _: () = tx
            .xadd("rb:events", false, None, "*", fields.clone())
            .await
            .expect("queue xadd");
    }
    let _: () = tx
        .xreadgroup("rollboard", "a", Some(1000), None, false, "rb:events", ">")
        .await
        .expect("queue xreadgroup");
    let _: Value = tx.exec(true).await.expect("exec");
    let pending = group_info(store.client(), "rb:events", "rollboard")
        .await
        .expect("xinfo groups");
    assert_eq!(pending, Some((200, Some(0))));
    let status = daemon.terminate().await;
    assert!(status.success(), "exit status {status:?}");
    let pending = group_info(store.client(), "rb:events", "rollboard")
        .await
        .expect("xinfo groups");
    assert_eq!(pending, Some((0, Some(0))), "nothing left pending at exit");
    let daemon = Daemon::start(&config, port).await;
    assert_drained_into_model(&store, &events, &daemon).await;
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn a_redis_restart_turns_readyz_503_then_200_and_loses_nothing() {
    let mut redis = RedisServer::start_persistent();
    let store_url = redis.url();
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let config = write_config(dir.path(), &redis, port, "a", "");
    let daemon = Daemon::start(&config, port).await;
    let ready = |want: u16| {
        let daemon = &daemon;
        async move {
            wait_for(Duration::from_secs(30), || async {
                daemon.get("/readyz").await.0 == want
            })
            .await
        }
    };
    assert!(ready(200).await, "never ready; log:\n{}", daemon.logs());
    let now = now_ms();
    let events: Vec<Fields> = (0..1000).map(|i| tip(i, now)).collect();
    {
        let store = Store::connect(&store_url, "rb", 1, rollboard::store::Reconnect::Never)
            .await
            .expect("connect");
        xadd_all(store.client(), "rb:events", &events[..500]).await;
        assert!(drained(&store).await);
    }
    redis.kill();
    assert!(ready(503).await, "readyz stayed up without redis");
    assert_eq!(
        daemon.get("/healthz").await.0,
        200,
        "the process itself is alive"
    );
    redis.restart();
    assert!(
        ready(200).await,
        "never ready again; log:\n{}",
        daemon.logs()
    );
    let store = Store::connect(&store_url, "rb", 1, rollboard::store::Reconnect::Never)
        .await
        .expect("connect");
    xadd_all(store.client(), "rb:events", &events[500..]).await;
    assert_drained_into_model(&store, &events, &daemon).await;
    assert!(daemon.metric("rollboard_redis_reconnects_total", &[]).await >= 1.0);
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn every_malformed_kind_is_dead_lettered_with_its_reason() {
    let (redis, store, dir, _, port) = setup("a").await;
    // A board whose scope field is no other board's member, so that `scope` is reachable.
    let extra = "[[boards]]\nname = \"channel_fans\"\nmember = \"fan\"\nscope = \"channel\"\namount = \"coins\"\nwindow = \"1d\"\nslice = \"1h\"\n";
    let config = write_config(dir.path(), &redis, port, "a", extra);
    let daemon = Daemon::start(&config, port).await;
    let now = now_ms();
    let ts = now.to_string();
    let f = |pairs: &[(&str, &str)]| -> Fields {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    let long = "x".repeat(300);
    let old = (now - 40 * 86_400_000).to_string();
    let future = (now + 3_600_000).to_string();
    let cases: Vec<(&str, Fields)> = vec![
        ("no_board", f(&[("room", "r1"), ("user", "u")])),
        (
            "member",
            f(&[("room", "r1"), ("user", &long), ("amount", "1")]),
        ),
        (
            "scope",
            f(&[("fan", "f1"), ("channel", "bad\u{7}"), ("coins", "1")]),
        ),
        ("id", f(&[("room", "r1"), ("amount", "1"), ("id", "")])),
        (
            "amount",
            f(&[("room", "r1"), ("amount", "1e3"), ("reason", "tip")]),
        ),
        (
            "ts",
            f(&[("room", "r1"), ("amount", "1"), ("ts", "yesterday")]),
        ),
        (
            "future",
            f(&[("room", "r1"), ("amount", "1"), ("ts", &future)]),
        ),
        ("late", f(&[("room", "r1"), ("amount", "1"), ("ts", &old)])),
        (
            "overflow",
            f(&[
                ("room", "big"),
                ("amount", "9007199254740991"),
                ("ts", &ts),
                ("id", "o1"),
            ]),
        ),
        (
            "overflow",
            f(&[("room", "big"), ("amount", "1"), ("ts", &ts), ("id", "o2")]),
        ),
    ];
    let fields: Vec<Fields> = cases.iter().map(|(_, f)| f.clone()).collect();
    xadd_all(store.client(), "rb:events", &fields).await;
    assert!(drained(&store).await);
    let entries: Vec<(String, HashMap<String, String>)> = store
        .client()
        .xrange("rb:events:dead", "-", "+", None)
        .await
        .expect("xrange");
    let reasons: Vec<&str> = entries.iter().map(|(_, e)| e["reason"].as_str()).collect();
    // The first overflow event fits (it is exactly the limit); the second does not.
    let mut expected: Vec<&str> = cases.iter().map(|(r, _)| *r).collect();
    expected.remove(
        expected
            .iter()
            .position(|r| *r == "overflow")
            .expect("overflow case"),
    );
    assert_eq!(reasons, expected);
    for (_, e) in &entries {
        assert!(!e["detail"].is_empty());
        assert!(e["source_id"].contains('-'));
    }
    let amount = &entries[4].1;
    assert_eq!(
        (amount["orig.reason"].as_str(), amount["amount"].as_str()),
        ("tip", "1e3"),
        "original fields kept flat"
    );
    assert!(
        entries[8].1["detail"].contains("rooms_7d"),
        "overflow names the board"
    );
    assert_eq!(
        store
            .rank(&test_boards()[0], None, "big", now)
            .await
            .expect("rank")
            .total,
        Some(9_007_199_254_740_991)
    );
    assert_eq!(
        daemon
            .metric(
                "rollboard_events_dead_lettered_total",
                &[("reason", "late")]
            )
            .await,
        1.0
    );
    assert_eq!(
        daemon
            .metric("rollboard_events_dead_lettered_total", &[])
            .await,
        9.0
    );
    assert_eq!(
        daemon
            .metric(
                "rollboard_events_skipped_total",
                &[("board", "rooms_7d"), ("reason", "late")]
            )
            .await,
        1.0
    );
}

/// POSTs a body over the 4 MiB limit on a raw connection (the server answers before it has
/// read everything, which an ordinary client reports as a broken request); returns the status.
async fn oversized_post(base: &str) -> u16 {
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
    let head = format!("POST /v1/events HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", body.len());
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
    let (_redis, store, _dir, config, port) = setup("a").await;
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
        let (got, body) = daemon.get(path).await;
        assert_eq!(got, status, "{path}: {body}");
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
    let len: i64 = store.client().xlen("rb:events").await.expect("xlen");
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
    let (_redis, store, _dir, config, port) = setup("a").await;
    let daemon = Daemon::start(&config, port).await;
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
        "rollboard_script_duration_seconds",
        "rollboard_http_request_duration_seconds",
    ] {
        assert!(
            body.contains(&format!("# HELP {family} ")),
            "{family} registered with help text"
        );
    }
    let now = now_ms();
    let events: Vec<Fields> = (0..300).map(|i| tip(i, now)).collect();
    xadd_all(store.client(), "rb:events", &events).await;
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

#[tokio::test]
async fn a_board_whose_apply_keeps_failing_is_reported_and_holds_no_other_board() {
    let (_redis, store, _dir, config, port) = setup("a").await;
    let now = now_ms();
    let c = store.client();
    // rooms_7d's members hash is of the wrong type: every apply of that board fails.
    let _: () = c
        .set("rb:{rooms_7d}:members", "broken", None, None, false)
        .await
        .expect("set");
    let daemon = Daemon::start(&config, port).await;
    let tips: Vec<Fields> = (0..300).map(|i| tip(i, now)).collect();
    let payments: Vec<Fields> = (0..100).map(|i| payment(i, now)).collect();
    xadd_all(c, "rb:events", &tips).await;
    xadd_all(c, "rb:events", &payments).await;
    assert!(drained(&store).await, "the other boards were held back");

    // The other boards hold exactly their events.
    let boards = test_boards();
    let everything: Vec<Fields> = tips.iter().chain(&payments).cloned().collect();
    let mut expected = models(&everything, &boards, now);
    expected.retain(|(b, _), _| boards[*b].name != "rooms_7d");
    assert_state(&store, &boards, &expected, now).await;
    assert_eq!(
        c.exists::<i64, _>("rb:{rooms_7d}:result")
            .await
            .expect("exists"),
        0
    );

    // Every tip is in the dead-letter stream once, for rooms_7d only, as apply_failed.
    let dead: Vec<(String, HashMap<String, String>)> = c
        .xrange("rb:events:dead", "-", "+", None)
        .await
        .expect("xrange");
    // Once each: a batch read ahead while the previous one was retried is not claimed
    // and processed a second time.
    assert_eq!(dead.len(), tips.len());
    for (_, fields) in &dead {
        assert_eq!(fields["reason"], "apply_failed");
        assert!(fields["detail"].contains("board rooms_7d"), "{fields:?}");
    }
    assert_eq!(
        daemon
            .metric(
                "rollboard_events_dead_lettered_total",
                &[("reason", "apply_failed")]
            )
            .await,
        tips.len() as f64
    );
    assert_eq!(
        daemon
            .metric("rollboard_board_apply_failing", &[("board", "rooms_7d")])
            .await,
        1.0
    );
    assert_eq!(
        daemon
            .metric("rollboard_board_apply_failing", &[("board", "fans_7d")])
            .await,
        0.0
    );
    let (status, body) = daemon.get("/readyz").await;
    assert_eq!(status, 200, "{body}");
    let ready: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(ready["failing_boards"], serde_json::json!(["rooms_7d"]));
    assert!(daemon.logs().contains("rooms_7d"));

    // Repaired and replayed (original fields, same ids): rooms_7d gets every tip once,
    // the boards that already counted them skip them as duplicates.
    let _: i64 = c.del("rb:{rooms_7d}:members").await.expect("del");
    let replay: Vec<Fields> = dead
        .iter()
        .map(|(_, fields)| {
            let mut f: Fields = fields
                .iter()
                .filter(|(k, _)| {
                    !["reason", "detail", "source_id", "source_stream"].contains(&k.as_str())
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            f.sort();
            f
        })
        .collect();
    xadd_all(c, "rb:events", &replay).await;
    assert!(drained(&store).await);
    assert_state(&store, &boards, &models(&everything, &boards, now), now).await;
    let recovered = wait_for(Duration::from_secs(10), || async {
        daemon
            .metric("rollboard_board_apply_failing", &[("board", "rooms_7d")])
            .await
            == 0.0
    })
    .await;
    assert!(recovered, "rooms_7d still reported failing");
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn connections_cut_after_scripts_and_acks_reach_redis_lose_nothing_and_double_nothing() {
    let redis = RedisServer::start();
    let proxy = crate::support::proxy::Proxy::start(redis.port).await;
    let store = redis.store("rb").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let config = crate::support::write_config_url(dir.path(), &proxy.url(), port, "a", "");
    let now = now_ms();
    let events: Vec<Fields> = (0..4000)
        .map(|i| {
            if i % 4 == 3 {
                payment(i, now)
            } else {
                tip(i, now)
            }
        })
        .collect();
    xadd_all(store.client(), "rb:events", &events).await;
    let daemon = Daemon::start(&config, port).await;
    // Cut a connection right after an apply script, an XACK or an expiry chunk reached
    // Redis (its reply lost), over and over while the backlog drains.
    let patterns: [&[u8]; 3] = [b"EVALSHA", b"XACK", b"XREADGROUP"];
    let mut armed = 0;
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    while armed < 24 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        proxy.cut_after(patterns[(seed % 3) as usize], 1);
        armed += 1;
        let fired = wait_for(Duration::from_secs(5), || async { proxy.cuts() >= armed }).await;
        if !fired {
            break;
        }
    }
    assert!(proxy.cuts() >= 5, "only {} cuts happened", proxy.cuts());
    assert_drained_into_model(&store, &events, &daemon).await;
    for board in test_boards() {
        for scope in rollboard::roll::instances(&store, &board)
            .await
            .expect("instances")
        {
            let v = rollboard::roll::verify(&store, &board, scope.as_deref(), 100)
                .await
                .expect("verify");
            assert!(
                v.differences.is_empty(),
                "{}: {:?}",
                board.name,
                v.differences
            );
        }
    }
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn a_roll_without_redis_is_counted_as_failed_and_not_as_done() {
    let mut redis = RedisServer::start_persistent();
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let config = write_config(dir.path(), &redis, port, "a", "");
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(
        &config,
        text.replace("roll = \"*/2 * * * * *\"", "roll = \"* * * * * *\""),
    )
    .expect("per-second rolls");
    let daemon = Daemon::start(&config, port).await;
    let board = [("board", "rooms_7d")];
    let failures = [("board", "rooms_7d"), ("mode", "incremental")];
    let gauge = |name: &'static str| {
        let daemon = &daemon;
        async move { daemon.metric(name, &board).await }
    };
    let rolled = wait_for(Duration::from_secs(20), || async {
        gauge("rollboard_last_roll_timestamp_seconds").await > 0.0
    })
    .await;
    assert!(rolled, "never rolled; log:\n{}", daemon.logs());
    // The window gauges tell where the window is: the live range of a query right now.
    let now = now_ms() as f64 / 1000.0;
    let (start, end) = (
        gauge("rollboard_window_start_timestamp_seconds").await,
        gauge("rollboard_window_end_timestamp_seconds").await,
    );
    assert_eq!(end - start, 7.0 * 86_400.0);
    assert!(end > now && end <= now + 6.0 * 3_600.0, "{end} vs {now}");
    assert_eq!(
        daemon
            .metric("rollboard_roll_failures_total", &failures)
            .await,
        0.0
    );

    redis.kill();
    let failed = wait_for(Duration::from_secs(30), || async {
        daemon
            .metric("rollboard_roll_failures_total", &failures)
            .await
            >= 1.0
    })
    .await;
    assert!(failed, "no failed roll counted; log:\n{}", daemon.logs());
    let last = gauge("rollboard_last_roll_timestamp_seconds").await;
    let seen = daemon
        .metric("rollboard_roll_failures_total", &failures)
        .await;
    let more = wait_for(Duration::from_secs(30), || async {
        daemon
            .metric("rollboard_roll_failures_total", &failures)
            .await
            >= seen + 2.0
    })
    .await;
    assert!(more, "every failed run counts; log:\n{}", daemon.logs());
    assert!(daemon.metric("rollboard_redis_errors_total", &[]).await >= 3.0);
    assert!(
        daemon
            .metric("rollboard_redis_errors_total", &[("kind", "connection")])
            .await
            + daemon
                .metric("rollboard_redis_errors_total", &[("kind", "timeout")])
                .await
            >= 3.0,
        "an outage is a connection or timeout error"
    );
    assert_eq!(
        gauge("rollboard_last_roll_timestamp_seconds").await,
        last,
        "a failed roll is not a roll"
    );
    assert_eq!(
        gauge("rollboard_window_end_timestamp_seconds").await,
        end,
        "the window did not move"
    );

    redis.restart();
    let back = wait_for(Duration::from_secs(30), || async {
        gauge("rollboard_last_roll_timestamp_seconds").await > last
    })
    .await;
    assert!(back, "rolls resumed; log:\n{}", daemon.logs());
    assert!(daemon.terminate().await.success());
}
