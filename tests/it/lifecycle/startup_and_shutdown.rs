//! Start-up and shutdown: a taken HTTP address fails the start, no listener opens before the
//! checks pass, SIGTERM during an upload, with slow clients or while Redis never came exits
//! promptly, and a draining daemon refuses new connections.

use std::time::{Duration, Instant};

use fred::prelude::*;
use rollboard::store::Store;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::asserts::{assert_drained_into_model, assert_metrics};
use crate::support::boards::now_ms;
use crate::support::cli::text;
use crate::support::config::{config_for, config_for_url, write_config};
use crate::support::daemon::{addr, assert_exited_within, daemon_with, Daemon};
use crate::support::events::{post_events, spread_tip, Fields};
use crate::support::keys::intake_stream;
use crate::support::redis::{free_port, RedisServer};
use crate::support::wait::wait_for;

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

/// A tip to one of many rooms, so that one batch touches many instances of `fans_7d`.
/// A daemon of the test boards on a free port, started and ready; its config's folder
/// (kept for the test's length), the config file, the port and the daemon.
async fn ready_daemon(redis: &RedisServer) -> (tempfile::TempDir, std::path::PathBuf, u16, Daemon) {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let config = write_config(dir.path(), redis, port, "a", "");
    let daemon = Daemon::start(&config, port).await;
    let ready = daemon.readyz_becomes(200, Duration::from_secs(30)).await;
    assert!(ready, "never ready; log:\n{}", daemon.logs());
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
        .xrange(intake_stream(), "-", "+", None)
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

#[tokio::test]
async fn sigterm_during_an_intake_upload_confirms_or_refuses_and_loses_nothing() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
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
        assert_drained_into_model(&store, &entries, &daemon).await;
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
    let (_dir, port, config) = config_for(&redis, "a", "");
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
    let ready = daemon.readyz_becomes(200, Duration::from_secs(30)).await;
    assert!(ready, "never ready; log:\n{}", daemon.logs());
    let now = now_ms();
    let events: Vec<Fields> = (0..40).map(|i| spread_tip(i, now)).collect();
    assert_eq!(post_events(&daemon.base, &events).await, 202);
    let store = Store::connect(&store_url, "rb", 1, rollboard::store::Reconnect::Never)
        .await
        .expect("connect");
    assert_drained_into_model(&store, &events, &daemon).await;
    // A first connection is no reconnect, however late it comes.
    assert_metrics(&daemon, &["rollboard_redis_reconnects_total 0"]).await;
    assert!(daemon.terminate().await.success());
}

#[tokio::test]
async fn sigterm_while_redis_never_came_exits_0_without_waiting_for_it() {
    let mut redis = RedisServer::start();
    redis.kill();
    let (_dir, port, config) = config_for(&redis, "a", "");
    let daemon = Daemon::spawn(&config, port);
    daemon.wait_log("cannot connect to redis yet").await;
    let started = std::time::Instant::now();
    assert_exited_within(daemon.terminate().await, started, Duration::from_secs(10));
}

#[tokio::test]
async fn while_a_request_drains_at_shutdown_new_connections_are_refused() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
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
    let len: i64 = store.client().xlen(intake_stream()).await.expect("xlen");
    assert_eq!(len, 1);
}

#[tokio::test]
async fn sigterm_while_an_intake_waits_on_a_slow_redis_exits_0_and_appends_at_most_once() {
    let (redis, store) = RedisServer::start_with_store("rb").await;
    let proxy = crate::support::proxy::Proxy::start(redis.port).await;
    let (_dir, port, config) = config_for_url(&proxy.url(), "a", "");
    let daemon = Daemon::start(&config, port).await;
    assert!(daemon.readyz_becomes(200, Duration::from_secs(30)).await);
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
    assert_exited_within(daemon.wait_exit().await, started, Duration::from_secs(35));
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
    assert_exited_within(daemon.terminate().await, started, Duration::from_secs(5));
}
