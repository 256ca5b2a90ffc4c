//! The HTTP API on its own thread and runtime, the bounded writing calls, and the
//! tag search of `trim_seen.lua`, pushed at their edges.

use std::time::Duration;

use fred::prelude::*;
use rollboard::store::Store;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::models;
use crate::support::{
    assert_state, drained, free_port, test_boards, wait_for, write_config, xadd_all, Daemon,
    Fields, RedisServer,
};

const TRIM_SEEN: &str = rollboard::store::lua::TRIM_SEEN;

fn now_ms() -> i64 {
    rollboard::cli::now_ms()
}

/// One 20-byte digest-table entry: the digest, then the slice tag, big-endian.
fn entry(digest: [u8; 16], tag: u32) -> Vec<u8> {
    let mut e = digest.to_vec();
    e.extend_from_slice(&tag.to_be_bytes());
    e
}

/// Runs `trim_seen.lua` on a table of one bucket (`#L` 0: every log entry addresses
/// bucket "0"), forgetting slice `n` with `log` entries taken.
async fn trim(
    client: &Client,
    table: &str,
    log: &str,
    n: u32,
    take: usize,
) -> Result<Vec<i64>, fred::error::Error> {
    client
        .eval(
            TRIM_SEEN,
            vec!["t:legacy".to_string(), table.to_string(), log.to_string()],
            vec![
                now_ms().to_string(),
                "128".to_string(),
                n.to_string(),
                take.to_string(),
            ],
        )
        .await
}

async fn seed_table(client: &Client, table: &str, log: &str, bucket: &[u8], held: usize) {
    let _: () = client.del(table).await.expect("del");
    let _: () = client.del(log).await.expect("del");
    let _: () = client
        .hset(
            table,
            vec![
                ("#L", b"0".to_vec()),
                ("#p", b"0".to_vec()),
                ("#n", held.to_string().into_bytes()),
            ],
        )
        .await
        .expect("hset state");
    if !bucket.is_empty() {
        let _: () = client
            .hset(table, ("0", bucket.to_vec()))
            .await
            .expect("hset");
    }
    let _: () = client
        .rpush(log, vec![vec![0u8, 0, 0, 7], vec![1u8, 2, 3, 4]])
        .await
        .expect("rpush log");
}

#[tokio::test]
async fn trim_seen_drops_only_aligned_tags_whatever_the_digests_hold() {
    let redis = RedisServer::start();
    let store = redis.store("t").await;
    let client = store.client();
    let tag: u32 = 0x0A0B_0C0D;
    let tb = tag.to_be_bytes();
    let other: u32 = 0x0A0B_0C0E;
    // Digests holding the tag at every unaligned offset, and tags of other slices that
    // together with the next digest spell it out.
    let mut entries: Vec<(Vec<u8>, bool)> = Vec::new();
    for off in 0..=12 {
        let mut d = [0x55u8; 16];
        d[off..off + 4].copy_from_slice(&tb);
        entries.push((entry(d, other), false));
        if off % 3 == 0 {
            entries.push((entry([off as u8; 16], tag), true));
        }
    }
    // The tag straddling a digest's end and its own tag: digest ends 0A 0B, tag 0C 0D ..
    let mut d = [0x11u8; 16];
    d[14] = tb[0];
    d[15] = tb[1];
    entries.push((entry(d, u32::from_be_bytes([tb[2], tb[3], 0, 0])), false));
    // An other slice's tag 0A 0B 0C followed by a digest starting 0D.
    let mut d = [0x22u8; 16];
    d[0] = tb[3];
    entries.push((
        entry([0x33; 16], u32::from_be_bytes([0x99, tb[0], tb[1], tb[2]])),
        false,
    ));
    entries.push((entry(d, other), false));
    // Two of the slice's in a row, and the slice's last.
    entries.push((entry([0x44; 16], tag), true));
    entries.push((entry(tb.repeat(4).try_into().expect("16 bytes"), tag), true));
    entries.push((entry([0x66; 16], other), false));
    entries.push((entry([0x77; 16], tag), true));
    let bucket: Vec<u8> = entries.iter().flat_map(|(e, _)| e.clone()).collect();
    let kept: Vec<u8> = entries
        .iter()
        .filter(|(_, dropped)| !dropped)
        .flat_map(|(e, _)| e.clone())
        .collect();
    let dropped = entries.iter().filter(|(_, d)| *d).count();
    let held = entries.len() + 5;
    seed_table(client, "t:seen:ids", "t:seen:9", &bucket, held).await;
    let got = trim(client, "t:seen:ids", "t:seen:9", tag, 128)
        .await
        .expect("trim");
    assert_eq!(got, vec![0, 2, dropped as i64]);
    let after: Vec<u8> = client.hget("t:seen:ids", "0").await.expect("hget");
    assert_eq!(after.len(), kept.len(), "bucket length");
    assert_eq!(after, kept, "the other slices' entries kept in order");
    let n: String = client.hget("t:seen:ids", "#n").await.expect("hget");
    assert_eq!(n, (held - dropped).to_string());
    let log_len: i64 = client.llen("t:seen:9").await.expect("llen");
    assert_eq!(log_len, 0);
    // A repeat finds nothing more.
    let _: () = client
        .rpush("t:seen:9", vec![vec![0u8, 0, 0, 1]])
        .await
        .expect("rpush");
    let got = trim(client, "t:seen:ids", "t:seen:9", tag, 128)
        .await
        .expect("trim");
    assert_eq!(got, vec![0, 1, 0]);
    let again: Vec<u8> = client.hget("t:seen:ids", "0").await.expect("hget");
    assert_eq!(again, kept);
}

#[tokio::test]
async fn trim_seen_deletes_a_bucket_of_only_the_slice_and_leaves_an_empty_one_alone() {
    let redis = RedisServer::start();
    let store = redis.store("t").await;
    let client = store.client();
    let tag: u32 = 0xFFFF_FFFF;
    // Slice numbers wrap at 2^32: n = 2^32 + tag forgets the same tag.
    let n_wrapped = (1u64 << 32) + tag as u64;
    let bucket: Vec<u8> = (0..17u8).flat_map(|i| entry([i; 16], tag)).collect();
    seed_table(client, "t:seen:ids", "t:seen:1", &bucket, 17).await;
    let got: Vec<i64> = client
        .eval(
            TRIM_SEEN,
            vec!["t:legacy", "t:seen:ids", "t:seen:1"],
            vec![
                now_ms().to_string(),
                "128".into(),
                n_wrapped.to_string(),
                "128".into(),
            ],
        )
        .await
        .expect("trim");
    assert_eq!(got, vec![0, 2, 17]);
    let exists: bool = client.hexists("t:seen:ids", "0").await.expect("hexists");
    assert!(
        !exists,
        "a bucket emptied is deleted, not left as an empty string"
    );
    let n: String = client.hget("t:seen:ids", "#n").await.expect("hget");
    assert_eq!(n, "0");

    // No bucket at the address: nothing is written but the log taken.
    seed_table(client, "t:seen:ids", "t:seen:1", &[], 3).await;
    let got = trim(client, "t:seen:ids", "t:seen:1", 5, 128)
        .await
        .expect("trim");
    assert_eq!(got, vec![0, 2, 0]);
    let n: String = client.hget("t:seen:ids", "#n").await.expect("hget");
    assert_eq!(n, "3");
    let fields: Vec<String> = client.hkeys("t:seen:ids").await.expect("hkeys");
    assert_eq!(fields.len(), 3, "{fields:?}");

    // A bucket whose only bytes equal to the tag are in digests.
    let tb = 5u32.to_be_bytes();
    let bucket: Vec<u8> = entry(
        [
            tb[0], tb[1], tb[2], tb[3], 0, 0, 0, 5, 0, 0, 0, 5, 0, 0, 0, 5,
        ],
        0,
    );
    seed_table(client, "t:seen:ids", "t:seen:1", &bucket, 1).await;
    let got = trim(client, "t:seen:ids", "t:seen:1", 5, 1)
        .await
        .expect("trim");
    assert_eq!(got, vec![0, 1, 0]);
    let after: Vec<u8> = client.hget("t:seen:ids", "0").await.expect("hget");
    assert_eq!(after, bucket);
    let n: String = client.hget("t:seen:ids", "#n").await.expect("hget");
    assert_eq!(n, "1");
}

#[tokio::test]
async fn a_taken_http_address_fails_the_start_with_a_clear_error() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let config = write_config(dir.path(), &redis, port, "a", "");
    let log = config.with_extension("log");
    let file = std::fs::File::create(&log).expect("log file");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_rollboard"))
        .args(["--config", config.to_str().expect("utf-8 path"), "run"])
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(file)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("the daemon exits instead of hanging")
        .expect("wait");
    let logs = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!status.success(), "exit {status:?}; log:\n{logs}");
    assert!(
        logs.contains(&format!("cannot listen on 127.0.0.1:{port}")),
        "log:\n{logs}"
    );
    drop(taken);
}

/// Counts the connections to `redis` other than the one asking.
fn connected_clients(redis: &RedisServer) -> usize {
    redis
        .cli(&["CLIENT", "LIST"])
        .lines()
        .filter(|l| l.contains("id="))
        .count()
        .saturating_sub(1)
}

#[tokio::test]
async fn readyz_recovers_and_every_connection_counts_its_reconnect_after_an_outage() {
    let mut redis = RedisServer::start_persistent();
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
    // A query, so that the HTTP store's read connection is open too.
    let (status, _) = daemon.get("/v1/boards/rooms_7d/top").await;
    assert_eq!(status, 200);
    let before = connected_clients(&redis);
    assert!(before >= 4, "{before} connections");
    assert_eq!(
        daemon.metric("rollboard_redis_reconnects_total", &[]).await,
        0.0
    );
    redis.kill();
    assert!(ready(503).await, "readyz stayed up without redis");
    let (status, _) = daemon.get("/v1/boards/rooms_7d/top").await;
    assert_eq!(status, 503, "a query without redis is refused");
    redis.restart();
    assert!(
        ready(200).await,
        "never ready again; log:\n{}",
        daemon.logs()
    );
    let (status, _) = daemon.get("/v1/boards/rooms_7d/top").await;
    assert_eq!(status, 200);
    let counted = wait_for(Duration::from_secs(30), || async {
        daemon.metric("rollboard_redis_reconnects_total", &[]).await == before as f64
    })
    .await;
    assert!(
        counted,
        "{} reconnects counted for {before} connections; log:\n{}",
        daemon.metric("rollboard_redis_reconnects_total", &[]).await,
        daemon.logs()
    );
    assert!(daemon.terminate().await.success());
}

/// A tip to one of many rooms, so that one batch touches many instances of `fans_7d`.
/// A daemon of the test boards on a free port, started and ready; its config's folder
/// (kept for the test's length), the config file, the port and the daemon.
async fn ready_daemon(redis: &RedisServer) -> (tempfile::TempDir, std::path::PathBuf, u16, Daemon) {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let config = write_config(dir.path(), redis, port, "a", "");
    let daemon = Daemon::start(&config, port).await;
    assert!(
        wait_for(Duration::from_secs(30), || async {
            daemon.get("/readyz").await.0 == 200
        })
        .await,
        "never ready; log:\n{}",
        daemon.logs()
    );
    (dir, config, port, daemon)
}

/// Opens a `POST /v1/events` of a `len`-byte body, sends its head and, once the server has
/// taken the request (it answers `100 Continue` when the handler starts reading the body),
/// the `first` bytes of the body.
async fn begin_upload(port: u16, len: usize, first: &str) -> tokio::net::TcpStream {
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let head = format!(
        "POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {len}\r\nExpect: 100-continue\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await.expect("head");
    let mut interim = Vec::new();
    while !interim.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(10), conn.read_exact(&mut byte))
            .await
            .expect("no 100 Continue within 10 s");
        read.expect("read the interim answer");
        interim.push(byte[0]);
    }
    assert!(
        interim.starts_with(b"HTTP/1.1 100"),
        "{:?}",
        String::from_utf8_lossy(&interim)
    );
    conn.write_all(first.as_bytes()).await.expect("first part");
    conn
}

/// Sends SIGTERM to the daemon and waits until it says it is shutting down.
async fn sigterm(daemon: &Daemon) {
    daemon.send_term();
    assert!(
        wait_for(Duration::from_secs(10), || async {
            daemon.logs().contains("shutting down")
        })
        .await,
        "log:\n{}",
        daemon.logs()
    );
}

/// What the server answered on `conn` until it closed it (at most 10 s), as text.
async fn read_reply(conn: &mut tokio::net::TcpStream) -> String {
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut reply)).await;
    String::from_utf8_lossy(&reply).to_string()
}

/// Every event on the stream, in order.
async fn appended(store: &Store) -> Vec<Fields> {
    let entries: Vec<(String, Fields)> = store
        .client()
        .xrange("rb:events", "-", "+", None)
        .await
        .expect("xrange");
    entries.into_iter().map(|(_, f)| f).collect()
}

/// The `id` field of each event.
fn ids_of(events: &[Fields]) -> Vec<&str> {
    events
        .iter()
        .flat_map(|f| f.iter().filter(|(k, _)| k == "id").map(|(_, v)| v.as_str()))
        .collect()
}

/// POSTs `events` to `/v1/events` as one JSON array; the status.
async fn post_events(base: &str, events: &[Fields]) -> u16 {
    let body: Vec<serde_json::Map<String, serde_json::Value>> = events
        .iter()
        .map(|f| {
            f.iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect()
        })
        .collect();
    reqwest::Client::new()
        .post(format!("{base}/v1/events"))
        .json(&body)
        .send()
        .await
        .expect("post")
        .status()
        .as_u16()
}

fn spread_tip(i: usize, now: i64) -> Fields {
    vec![
        ("room".into(), format!("room{}", i % 97)),
        ("user".into(), format!("u{}", i % 31)),
        ("amount".into(), (1 + i % 7).to_string()),
        ("id".into(), format!("s{i}")),
        ("ts".into(), (now - (i as i64 * 331) % 600_000).to_string()),
    ]
}

#[tokio::test]
async fn one_call_in_flight_with_a_scoped_board_over_many_rooms_counts_exactly() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let config = write_config(dir.path(), &redis, port, "a", "");
    let text = std::fs::read_to_string(&config).expect("read config");
    std::fs::write(
        &config,
        text.replacen("[redis]\n", "[redis]\nmax_calls_in_flight = 1\n", 1),
    )
    .expect("write config");
    let daemon = Daemon::start(&config, port).await;
    let now = now_ms();
    let events: Vec<Fields> = (0..2000).map(|i| spread_tip(i, now)).collect();
    xadd_all(store.client(), "rb:events", &events[..1500]).await;
    assert_eq!(post_events(&daemon.base, &events[1500..]).await, 202);
    // A query answers while the daemon works through the batches.
    let (status, _) = daemon.get("/v1/boards/fans_7d/top?scope=room3").await;
    assert_eq!(status, 200);
    assert!(
        drained(&store).await,
        "stream never drained; log:\n{}",
        daemon.logs()
    );
    let boards = test_boards();
    let now = now_ms();
    assert_state(&store, &boards, &models(&events, &boards, now), now).await;
    assert_eq!(
        daemon
            .metric("rollboard_events_applied_total", &[("board", "rooms_7d")])
            .await,
        2000.0
    );
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn sigterm_during_an_intake_upload_confirms_or_refuses_and_loses_nothing() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let (_dir, config, port, daemon) = ready_daemon(&redis).await;
    let now = now_ms();
    let body = format!(
        r#"[{{"room":"r1","user":"u1","amount":"3","id":"late-1","ts":"{now}"}},{{"room":"r2","user":"u2","amount":"4","id":"late-2","ts":"{now}"}}]"#
    );
    let (first, rest) = body.split_at(body.len() / 2);
    let mut conn = begin_upload(port, body.len(), first).await;
    sigterm(&daemon).await;
    let _ = conn.write_all(rest.as_bytes()).await;
    let reply = read_reply(&mut conn).await;
    let exit = daemon.wait_exit().await;
    assert!(exit.success(), "exit {exit:?}");
    let entries = appended(&store).await;
    let ids = ids_of(&entries);
    if reply.starts_with("HTTP/1.1 202") {
        assert_eq!(ids, vec!["late-1", "late-2"], "confirmed but not appended");
        // The next daemon applies what the stopping one confirmed.
        let daemon = Daemon::start(&config, port).await;
        assert!(
            drained(&store).await,
            "stream never drained; log:\n{}",
            daemon.logs()
        );
        let boards = test_boards();
        let now = now_ms();
        assert_state(&store, &boards, &models(&entries, &boards, now), now).await;
        assert!(daemon.terminate().await.success());
    } else {
        assert!(ids.is_empty(), "refused ({reply:?}) but appended {ids:?}");
        assert!(
            reply.is_empty() || reply.starts_with("HTTP/1.1 503"),
            "{reply:?}"
        );
    }
}

#[tokio::test]
async fn without_redis_at_start_no_listener_opens_until_the_checks_pass_then_it_serves_and_sigterm_exits_0(
) {
    let mut redis = RedisServer::start_persistent();
    redis.kill();
    let store_url = redis.url();
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let config = write_config(dir.path(), &redis, port, "a", "");
    let daemon = Daemon::spawn(&config, port);
    daemon.wait_log("cannot connect to redis yet").await;
    // The board settings are not checked yet: no probe may pass.
    assert_eq!(
        daemon.get("/healthz").await.0,
        0,
        "a listener opened before the checks"
    );
    assert_eq!(daemon.get("/readyz").await.0, 0);
    redis.restart();
    assert!(
        wait_for(Duration::from_secs(30), || async {
            daemon.get("/readyz").await.0 == 200
        })
        .await,
        "never ready; log:\n{}",
        daemon.logs()
    );
    let now = now_ms();
    let events: Vec<Fields> = (0..40).map(|i| spread_tip(i, now)).collect();
    assert_eq!(post_events(&daemon.base, &events).await, 202);
    let store = Store::connect(&store_url, "rb", 1, rollboard::store::Reconnect::Never)
        .await
        .expect("connect");
    assert!(
        drained(&store).await,
        "stream never drained; log:\n{}",
        daemon.logs()
    );
    let boards = test_boards();
    let now = now_ms();
    assert_state(&store, &boards, &models(&events, &boards, now), now).await;
    // A first connection is no reconnect, however late it comes.
    assert_eq!(
        daemon.metric("rollboard_redis_reconnects_total", &[]).await,
        0.0
    );
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn sigterm_while_redis_never_came_exits_0_without_waiting_for_it() {
    let mut redis = RedisServer::start();
    redis.kill();
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let config = write_config(dir.path(), &redis, port, "a", "");
    let daemon = Daemon::spawn(&config, port);
    daemon.wait_log("cannot connect to redis yet").await;
    let started = std::time::Instant::now();
    let status = daemon.terminate().await;
    assert!(status.success(), "exit {status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn while_a_request_drains_at_shutdown_new_connections_are_refused() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let (_dir, _, port, daemon) = ready_daemon(&redis).await;
    let now = now_ms();
    let body = format!(r#"{{"room":"r5","user":"u5","amount":"2","id":"drain-1","ts":"{now}"}}"#);
    let (first, rest) = body.split_at(10);
    let mut conn = begin_upload(port, body.len(), first).await;
    sigterm(&daemon).await;
    // The request in flight holds the drain open (up to 2 s); a new client is refused at
    // once rather than accepted by the kernel and left without an answer.
    let refused = wait_for(Duration::from_millis(1000), || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
    })
    .await;
    conn.write_all(rest.as_bytes()).await.expect("rest");
    let reply = read_reply(&mut conn).await;
    assert!(refused, "the listener stayed open during the drain");
    assert!(reply.starts_with("HTTP/1.1 202"), "{reply:?}");
    assert!(daemon.wait_exit().await.success());
    let len: i64 = store.client().xlen("rb:events").await.expect("xlen");
    assert_eq!(len, 1);
}

#[tokio::test]
async fn queries_answer_while_the_daemon_ingests_a_backlog_and_rolls() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let config = write_config(dir.path(), &redis, port, "a", "");
    let now = now_ms();
    let events: Vec<Fields> = (0..12_000).map(|i| spread_tip(i, now)).collect();
    xadd_all(store.client(), "rb:events", &events).await;
    let daemon = Daemon::start(&config, port).await;
    let client = reqwest::Client::new();
    let (mut answered, mut slowest) = (0usize, Duration::ZERO);
    let paths = [
        "/v1/boards/rooms_7d/top?limit=10",
        "/v1/boards/fans_7d/top?scope=room7",
        "/v1/boards/tips_24h/top",
    ];
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    let mut during_ingest = 0usize;
    loop {
        let done = matches!(
            rollboard::ingest::group_info(store.client(), "rb:events", "rollboard").await,
            Ok(Some((0, Some(0))))
        );
        if done && answered >= 30 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "stream never drained");
        if !done {
            during_ingest += 1;
        }
        let path = paths[answered % paths.len()];
        let started = std::time::Instant::now();
        let r = client
            .get(format!("{}{path}", daemon.base))
            .send()
            .await
            .expect("get");
        let status = r.status().as_u16();
        let body = r.text().await.expect("body");
        slowest = slowest.max(started.elapsed());
        assert_eq!(status, 200, "{path}: {body}");
        let page: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert!(page.is_object(), "{body}");
        answered += 1;
    }
    assert!(
        during_ingest >= 3,
        "{during_ingest} queries while ingesting"
    );
    assert!(
        slowest < Duration::from_secs(3),
        "slowest query took {slowest:?}"
    );
    let boards = test_boards();
    let now = now_ms();
    assert_state(&store, &boards, &models(&events, &boards, now), now).await;
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn sigterm_while_an_intake_waits_on_a_slow_redis_exits_0_and_appends_at_most_once() {
    let redis = RedisServer::start();
    let store = redis.store("rb").await;
    let proxy = crate::support::proxy::Proxy::start(redis.port).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let config = crate::support::write_config_url(dir.path(), &proxy.url(), port, "a", "");
    let daemon = Daemon::start(&config, port).await;
    assert!(
        wait_for(Duration::from_secs(30), || async {
            daemon.get("/readyz").await.0 == 200
        })
        .await
    );
    // Every round trip to Redis now outlasts the HTTP drain (2 s).
    proxy.latency(Duration::from_millis(1500));
    let now = now_ms();
    let body = format!(r#"{{"room":"r6","user":"u6","amount":"9","id":"slow-1","ts":"{now}"}}"#);
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let request = format!(
        "POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(request.as_bytes()).await.expect("request");
    // The metrics page, served by the same thread without Redis, answers while the intake
    // waits on Redis.
    let (status, _) = daemon.get("/metrics").await;
    assert_eq!(status, 200);
    let started = std::time::Instant::now();
    daemon.send_term();
    let reply = read_reply(&mut conn).await;
    let exit = daemon.wait_exit().await;
    assert!(exit.success(), "exit {exit:?}");
    assert!(
        started.elapsed() < Duration::from_secs(35),
        "took {:?}",
        started.elapsed()
    );
    proxy.latency(Duration::ZERO);
    let entries = appended(&store).await;
    let ids = ids_of(&entries);
    if reply.starts_with("HTTP/1.1 202") {
        assert_eq!(ids, vec!["slow-1"]);
    } else {
        // No answer (or a refusal): the event may have reached Redis, never twice.
        assert!(
            reply.is_empty() || reply.starts_with("HTTP/1.1 503"),
            "{reply:?}"
        );
        assert!(
            ids.len() <= 1 && ids.iter().all(|id| *id == "slow-1"),
            "{ids:?}"
        );
    }
}

#[tokio::test]
async fn trim_seen_agrees_with_an_entry_by_entry_decode_on_random_buckets() {
    let redis = RedisServer::start();
    let store = redis.store("t").await;
    let client = store.client();
    let tag: u32 = 0x0A0B_0A0B;
    let bytes = [0x0Au8, 0x0B, 0x0A, 0x0B, 0x00];
    let tags = [tag, 0x0B0A_0B0A, 0x0A0B_0A0A, 0x000A_0B0A, 0x0B0A_0B00];
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = |below: u64| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % below
    };
    for round in 0..300 {
        let len = next(24) as usize;
        let mut bucket = Vec::new();
        let mut kept = Vec::new();
        let mut dropped = 0usize;
        for _ in 0..len {
            let mut d = [0u8; 16];
            for b in d.iter_mut() {
                *b = bytes[next(bytes.len() as u64) as usize];
            }
            let t = tags[next(tags.len() as u64) as usize];
            let e = entry(d, t);
            bucket.extend_from_slice(&e);
            if t == tag {
                dropped += 1;
            } else {
                kept.extend_from_slice(&e);
            }
        }
        let held = len + 3;
        seed_table(client, "t:seen:ids", "t:seen:2", &bucket, held).await;
        let got = trim(client, "t:seen:ids", "t:seen:2", tag, 128)
            .await
            .expect("trim");
        assert_eq!(got, vec![0, 2, dropped as i64], "round {round}");
        let after: Option<Vec<u8>> = client.hget("t:seen:ids", "0").await.expect("hget");
        if kept.is_empty() {
            assert_eq!(after, None, "round {round}: an emptied bucket is deleted");
        } else {
            assert_eq!(after, Some(kept), "round {round}");
        }
        let n: String = client.hget("t:seen:ids", "#n").await.expect("hget");
        assert_eq!(n, (held - dropped).to_string(), "round {round}");
    }
}
